#!/usr/bin/env bash
# Lists the tests the last ctest run in BUILD_DIR skipped, grouped by the reason each gave:
# GoogleTest's GTEST_SKIP() message, or the "SKIPPED: ..." line of a script test. CTest itself
# reports a skipped test only as "Skipped"; its output is in Testing/Temporary/LastTest.log.
#   tools/ctest_skips.sh [BUILD_DIR] [--all]   (default: build; --all names every skipped test,
#                                              not only the first 6 of each reason)
set -euo pipefail
DIR=build
SHOW=6
for a in "$@"; do
  case "$a" in
    --all) SHOW=1000000 ;;
    *) DIR=$a ;;
  esac
done
LOG=$DIR/Testing/Temporary/LastTest.log
[ -f "$LOG" ] || { echo "ctest_skips: no $LOG (run ctest first)" >&2; exit 2; }

awk -v show="$SHOW" -v dir="$DIR" '
  # A test begins: "12/335 Test: name  # GetParam() = ..." (the parameter dump is dropped).
  /^[0-9]+\/[0-9]+ Test: / {
    name = $0
    sub(/^[0-9]+\/[0-9]+ Test: /, "", name)
    sub(/  # GetParam\(\).*$/, "", name)
    reason = ""; grab = 0; next
  }
  # GoogleTest: "path/file.cpp:38: Skipped", the message lines, then "[  SKIPPED ] name".
  /: Skipped$/ { grab = 1; reason = ""; next }
  grab && /^\[  SKIPPED \]/ { grab = 0; next }
  grab { reason = reason (reason == "" ? "" : " ") $0; next }
  /^SKIPPED: / { reason = substr($0, 10); next }
  /^Skip regular expression found in output/ {
    if (reason == "") reason = "(no reason given)"
    if (count[reason] < show) names[reason] = names[reason] "\n    " name
    count[reason]++
    total++
  }
  END {
    if (total == 0) { print "no test was skipped"; exit }
    printf "%d test(s) skipped:\n", total
    more = 0
    for (r in count) {
      printf "  %d skipped: %s%s\n", count[r], r, names[r]
      if (count[r] > show) { printf "    ... and %d more\n", count[r] - show; more = 1 }
    }
    if (more) printf "  (tools/ctest_skips.sh %s --all names them all)\n", dir
  }
' "$LOG"
