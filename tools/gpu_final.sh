#!/usr/bin/env bash
# The last lease of a session, when device time is short: builds this tree (and OLD_SRC's
# gfd_benchmark), runs the test suite, device to host before and after (three runs each,
# interleaved), then the reliability runs of docs/RELIABILITY.md that need the GPU: the long
# stress run (100000 requests, both directions) and compute-sanitizer memcheck and racecheck on
# the CUDA cases of the engine suite. Summary in $OUT/summary.txt, logs in $OUT/logs.tgz.
set -uo pipefail
cd "$(dirname "$0")/.."
FINAL=${OUT:-$PWD/gpu_out}
W=$(mktemp -d /tmp/gfd_final.XXXXXX)
mkdir -p "$FINAL"
J=$(nproc)
say() { echo "$*" | tee -a "$W/summary.txt"; }
SECONDS=0
(cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 && cmake --build build-gpu -j"$J" -- -k) > "$W/build.log" 2>&1 &
NEW=$!
if [ -n "${OLD_SRC:-}" ]; then
  (cmake -S "$OLD_SRC" -B build-old -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 -DGFD_BUILD_TESTS=OFF \
     -DGFD_BUILD_EXAMPLES=OFF && cmake --build build-old -j"$J" --target gfd_benchmark) > "$W/build_old.log" 2>&1
  say "build old: rc=$?"
fi
wait $NEW; say "build new: rc=$? (${SECONDS}s) at $(git log --oneline -1 2>/dev/null | cut -c1-60)"
SECONDS=0
(cd build-gpu && timeout 150 ctest -j4 --timeout 100) > "$W/ctest.log" 2>&1
say "ctest: rc=$? $(grep -E 'tests passed|tests failed' "$W/ctest.log") (${SECONDS}s)"
grep -E "\*\*\*Failed|Timeout|Exception" "$W/ctest.log" | head -10 | tee -a "$W/summary.txt"
B=build-gpu/bench/gfd_benchmark; O=build-old/bench/gfd_benchmark
row() { awk -v l="$1" '/^blocks /{t=1;next} t&&NF==0{t=0} t{printf "%-12s %-16s %6s x %-5s p50 %8s us %7s GB/s ratio %s\n", l, $4, $1, $2, $6, $8, $11}' "$2" | tee -a "$W/summary.txt"; }
if [ -x "$O" ]; then
  old_run() { timeout 60 "$O" --quick --direction d2h --backends gather,zero_copy_kernel > "$W/old_d2h_$1.log" 2>&1; row "old_d2h_$1" "$W/old_d2h_$1.log"; }
  new_run() { timeout 60 "$B" --layout pool --quick --direction d2h --backends gather,zero_copy_kernel --pool=mmap > "$W/new_d2h_$1.log" 2>&1; row "new_d2h_$1" "$W/new_d2h_$1.log"; }
  # Which build runs first alternates: in one lease the first run of each round was slower
  # whatever it ran (bench/RESULTS.md, 2026-12-01 fourth session).
  for i in 1 2 3 4; do
    if (( i % 2 )); then old_run $i; new_run $i; else new_run $i; old_run $i; fi
  done
fi
tools/gpu_reliability.sh "$W" | tee -a "$W/summary.txt"
tar -czf "$FINAL/logs.tgz" -C "$W" . 2>/dev/null
cp "$W/summary.txt" "$FINAL/summary.txt"
