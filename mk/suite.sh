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
    grep -E '^\[[A-Z-]{4}\]|ERROR: AddressSanitizer|runtime error' "$log" \
        | grep -vE '^\[(====|SKIP)\]|^\[----\] Criterion' | tail -n 40
fi
exit "$rc"
