#!/usr/bin/env bash
# Build, test and benchmark gfd on a GPU machine in one go (the lent H200: nothing can be
# installed there, everything gfd needs is present). Full logs go to $OUT (or ./gpu_out);
# a short summary is printed last.
#   tools/gpu_check.sh [quick|full]
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu_out}
mkdir -p "$OUT"
MODE=${1:-quick}
JOBS=$(nproc)
summary() { echo "$*" | tee -a "$OUT/summary.txt"; }

{ nvidia-smi --query-gpu=name,driver_version,pcie.link.gen.current,pcie.link.width.current --format=csv
  nproc; lscpu | grep -E "Model name|L3|NUMA"; git log --oneline -1; } > "$OUT/machine.txt" 2>&1

cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 > "$OUT/build.log" 2>&1 &&
  cmake --build build-gpu -j"$JOBS" -- -k >> "$OUT/build.log" 2>&1
summary "build: rc=$?"

(cd build-gpu && timeout 240 ctest --output-on-failure -j1 --timeout 60) > "$OUT/ctest.log" 2>&1
summary "ctest: rc=$? $(grep -E 'tests passed|tests failed' "$OUT/ctest.log")"
grep -hE "Skipped|SKIPPED" -A1 "$OUT/ctest.log" | head -5 >> "$OUT/summary.txt"

B=build-gpu/bench/gfd_benchmark
run_bench() {  # name, args...
  local name=$1; shift
  timeout 150 "$B" "$@" --csv "$OUT/$name.csv" --json "$OUT/$name.json" > "$OUT/$name.log" 2>&1
  summary "== $name ($*): rc=$?"
  grep -E "^(blocks|[0-9])" "$OUT/$name.log" | tee -a "$OUT/summary.txt" >/dev/null
  grep -E "^engine:|^device:" "$OUT/$name.log" >> "$OUT/summary.txt"
}
build-gpu/bench/gfd_gather_bench > "$OUT/gather_bench.log" 2>&1; summary "== gather_bench: rc=$?"
cat "$OUT/gather_bench.log" >> "$OUT/summary.txt"
run_bench quick_cold --quick
run_bench quick_warm --quick --warm
if [ "$MODE" = tune ] || [ "$MODE" = full ]; then
  for cfg in "2M 512K 32K 0" "2M 256K 32K 0" "4M 512K 32K 0" "4M 512K 32K 1" "2M 512K 64K 0"; do
    set -- $cfg
    GFD_SLOT_BYTES=$1 GFD_FIRST_CHUNK_BYTES=$2 GFD_PIECE_BYTES=$3 GFD_SUBMITTER_GATHERS=$4 \
      run_bench "tune_${1}_${2}_${3}_${4}" --quick --dst both
  done
fi
if [ "$MODE" = full ] || [ "$MODE" = final ]; then
  run_bench batch8_cold --quick --batch 8
  run_bench batch8_warm --quick --warm --batch 8
  run_bench sweep_cold
  run_bench sweep_warm --warm
fi
echo; cat "$OUT/summary.txt"
