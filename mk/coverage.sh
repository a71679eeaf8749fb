#!/usr/bin/env bash
# coverage.sh BUILD — line and branch coverage per module of what the tests
# ran in BUILD (a COV=1 build): lcov gathers gcov's counters into
# BUILD/coverage.info, then one line per folder of the library and the CLI,
# "coordinator/  lines 91.2%  branches 78.4%  (3456 of 3789 lines)".
set -euo pipefail
build=${1:?usage: coverage.sh BUILD}
info=$build/coverage.info
# every compiled line, run or not (a file no test reaches counts as 0%),
# then what the tests ran
lcov --quiet --capture --initial --directory "$build/obj" --base-directory . \
  --rc lcov_branch_coverage=1 --output-file "$info.base" 2>"$build/lcov.log"
lcov --quiet --capture --directory "$build/obj" --base-directory . \
  --rc lcov_branch_coverage=1 --output-file "$info.run" 2>>"$build/lcov.log"
lcov --quiet --rc lcov_branch_coverage=1 --add-tracefile "$info.base" --add-tracefile "$info.run" \
  --output-file "$info.all" 2>>"$build/lcov.log"
# the repository's own sources only: not generated code, not the tests
lcov --quiet --rc lcov_branch_coverage=1 --extract "$info.all" "$PWD/*" \
  --output-file "$info.repo" 2>>"$build/lcov.log"
lcov --quiet --rc lcov_branch_coverage=1 --remove "$info.repo" "$PWD/tests/*" "$PWD/bench/*" \
  "$PWD/build/*" --output-file "$info" 2>>"$build/lcov.log"
rm -f "$info.base" "$info.run" "$info.all" "$info.repo"
awk -v root="$PWD/" '
  /^SF:/ { f = substr($0, 4); sub(root, "", f); m = f; sub("/.*", "/", m); mods[m] = 1 }
  /^LF:/ { lf[m] += substr($0, 4) } /^LH:/ { lh[m] += substr($0, 4) }
  /^BRF:/ { bf[m] += substr($0, 5) } /^BRH:/ { bh[m] += substr($0, 5) }
  END {
    for (m in mods) {
      printf "%-13s lines %5.1f%%  branches %5.1f%%  (%d of %d lines)\n", m,
        lf[m] ? 100 * lh[m] / lf[m] : 0, bf[m] ? 100 * bh[m] / bf[m] : 0, lh[m], lf[m]
      tl += lf[m]; th += lh[m]; tbf += bf[m]; tbh += bh[m]
    }
    printf "%-13s lines %5.1f%%  branches %5.1f%%  (%d of %d lines)\n", "all",
      tl ? 100 * th / tl : 0, tbf ? 100 * tbh / tbf : 0, th, tl
  }' "$info" | sort
echo "coverage: per file with 'lcov --list $info'; as HTML with 'genhtml $info'"
