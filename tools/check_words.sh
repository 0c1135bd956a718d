#!/usr/bin/env bash
# Fails, listing file:line, where the tree speaks of how the software was made instead of what it
# is: the development rounds and machine loans it went through (the one machine a round worked
# on, the time limits of a loan), numbered tracker items, "the last library/code" claims, and
# paths of measurement notes that the tree does not hold. Code, comments, tests, scripts, help
# texts and docs say what the software is; a measurement is cited by what was measured, and
# history lives in git. CI runs this first (.ci/run).
#   tools/check_words.sh            check every file git knows of, untracked ones included
# Third-party files, if the tree ever holds any, are listed in THIRD_PARTY (pathspecs) and skipped.
set -euo pipefail
cd "$(dirname "$0")/.."

THIRD_PARTY=()

# The patterns are assembled from parts so that this file does not match them itself.
s="ses""sions?"
ordinals="first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh|twelfth"
ordinals+="|thirteenth|fourteenth|fifteenth|sixteenth|seventeenth|eighteenth|nineteenth|twentieth"
patterns=(
  "\\b$s\\b"                          # a development round
  "\\blea""ses?\\b"                   # a loaned machine
  "($ordinals)[- ]ses""sion"          # a numbered round
  "\\biss""ue [0-9]+"                 # a numbered tracker item
  "fin""al (library|code)"            # a claim about the last version
  "bench/hist""ory|bench/res""ults|RES""ULTS\\.md"  # notes the tree does not hold
  "\\bthe (GPU|H100|H200|two-GPU) mach""ine\\b"     # the machine one round worked on
  "\\blent (GPU|H100|H200|mach""ine)"                 # a loaned machine
  "each (call|command|run) und""er [0-9]+ min"       # the limits of a machine loan
  "[0-9]+ min(ute)?s? (a|per|each) ca""ll\\b"
  "\\bdevice (ti""me|bud""get)\\b"
  "\\bwarm mach""ine\\b"
)
pattern=$(IFS='|'; echo "${patterns[*]}")

excludes=()
for p in ${THIRD_PARTY[@]+"${THIRD_PARTY[@]}"}; do excludes+=(":(exclude)$p"); done

if git rev-parse --is-inside-work-tree > /dev/null 2>&1; then
  hits=$(git grep -n -I -i -E --untracked -e "$pattern" -- . ${excludes[@]+"${excludes[@]}"} || true)
else
  hits=$(grep -r -n -I -i -E --exclude-dir='build*' --exclude-dir=.git -e "$pattern" . || true)
fi

if [ -n "$hits" ]; then
  echo "$hits"
  echo
  echo "check_words: $(printf '%s\n' "$hits" | wc -l) line(s) above speak of how the software was made;"
  echo "  say what it is instead (cite a measurement by what was measured, not by when or where)"
  exit 1
fi
echo "check_words: no words about how the software was made"
