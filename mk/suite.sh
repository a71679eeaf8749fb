#!/usr/bin/env bash
# mk/suite.sh LOG BINARY [ARGS...]: runs a Criterion suite with its output
# on the terminal and in LOG, and when it fails says again at the very end
# which tests failed and why (Criterion prints a failure where it happens,
# and a long suite's last lines, all a CI summary may keep, are other tests').
set -uo pipefail
log=$1
shift
mkdir -p "$(dirname "$log")"
"$@" 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
if [ "$rc" -ne 0 ]; then
    echo "---- $(basename "$1") failed (exit $rc); what failed, again (whole output: $log):"
    # each failure's assertion and message lines, then every FAIL, error
    # and sanitizer line (cr_log_info's lines of passing tests left out)
    awk '/^\[----\] [^ ]+:[0-9]+: (Assertion Failed|Unexpected signal)/ { cap = 1 }
         cap && /^\[----\]/ { print; next }
         { cap = 0 }
         /^\[(FAIL|ERR )\]|Sanitizer|runtime error|Timed out/ { print }' "$log" | head -n 200
fi
exit "$rc"
