#!/usr/bin/env bash
# Build, test and benchmark gfd on a GPU machine in one go (the lent H200: nothing can be
# installed there, everything gfd needs is present). Full logs, CSVs and charts go to
# $OUT/logs.tgz (the device tool brings back few files), the summary to $OUT/summary.txt and
# to the terminal, last.
#   tools/gpu_check.sh quick   build, ctest, the 2048 x 4 KB comparison of every backend
#   tools/gpu_check.sh tune    quick + gather-engine variants (GFD_* settings) with pipeline traces,
#                              small-request latency, under-load
#   tools/gpu_check.sh probe   quick + the DMA rate under host memory load, and the gather
#                              thread count for 2048 and 16384 blocks
#   tools/gpu_check.sh swap    quick + device-to-host and pageable-memory runs of every backend,
#                              with traces, and the pointer-query microbenchmark
#   tools/gpu_check.sh multi   quick + gfd_multi_gpu_benchmark (cold, warm) and its charts, for a
#                              machine with several GPUs
#   tools/gpu_check.sh reliability  ctest, the long stress run (100000 requests), the CUDA
#                              suites under compute-sanitizer memcheck and racecheck, and the
#                              suites under ASan+UBSan (LeakSanitizer) with the GPU present
#   tools/gpu_check.sh final   build, ctest, the default sweeps (cold, warm), scattered
#                              destinations, back to back, latency, under load, microbenchmarks
#                              and the charts
set -uo pipefail
cd "$(dirname "$0")/.."
FINAL=${OUT:-$PWD/gpu_out}
OUT=$(mktemp -d /tmp/gfd_gpu.XXXXXX)  # everything is written here, then packed into $FINAL
mkdir -p "$FINAL"
MODE=${1:-quick}
JOBS=$(nproc)
summary() { echo "$*" | tee -a "$OUT/summary.txt"; }

{ nvidia-smi --query-gpu=name,driver_version,pcie.link.gen.current,pcie.link.width.current --format=csv
  nproc; lscpu | grep -E "Model name|L3|NUMA"; git log --oneline -1; } > "$OUT/machine.txt" 2>&1

SECONDS=0
cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 > "$OUT/build.log" 2>&1 &&
  cmake --build build-gpu -j"$JOBS" -- -k >> "$OUT/build.log" 2>&1
summary "build: rc=$? (${SECONDS}s)"

B=build-gpu/bench/gfd_benchmark
run_bench() {  # name, args... (GFD_* settings come from the environment)
  local name=$1; shift
  SECONDS=0
  timeout 240 "$B" --layout pool "$@" --csv "$OUT/$name.csv" --json "$OUT/$name.json" > "$OUT/$name.log" 2>"$OUT/$name.err"
  local rc=$?
  summary "== $name ($*) $(env | grep -E '^GFD_' | tr '\n' ' '): rc=$rc (${SECONDS}s)"
  # The result table, the latency table, the trace and the engine line.
  sed -n '/^blocks /,/^$/p;/^small-request/,/^$/p;/^trace:/,/^$/p;/^engine gather: [0-9]/p;/^under load:/p' \
    "$OUT/$name.log" >> "$OUT/summary.txt"
  grep -E "VERIFY|gfd_benchmark:" "$OUT/$name.err" >> "$OUT/summary.txt"
}

if [ "$MODE" = reliability ]; then
  SECONDS=0
  (cd build-gpu && timeout 90 ctest -j4 --timeout 60) > "$OUT/ctest.log" 2>&1
  summary "ctest: rc=$? $(grep -E 'tests passed|tests failed' "$OUT/ctest.log") (${SECONDS}s)"
  grep -E "\*\*\*Failed|Timeout|Exception" "$OUT/ctest.log" | head -20 >> "$OUT/summary.txt"
  tools/gpu_reliability.sh "$OUT" | tee -a "$OUT/summary.txt"
  SECONDS=0
  timeout 240 tools/sanitize.sh address,undefined > "$OUT/asan.log" 2>&1
  summary "== ASan+UBSan+LSan with the GPU: rc=$? (${SECONDS}s) $(grep -E 'tests passed|tests failed|ERROR: (Address|Leak)Sanitizer|runtime error' "$OUT/asan.log" | head -3 | tr '\n' ' ')"
else
  run_bench quick_cold --quick
fi
if [ "$MODE" = tune ]; then
  # Gather-engine variants (GFD_* settings, space-separated), each run twice (untraced) for
  # the spread between runs, then once traced.
  for v in "GFD_PREISSUE=1" "GFD_COPY_STREAMS=1" "GFD_SLOT_BYTES=4M" "GFD_SLOT_BYTES=4M GFD_COPY_STREAMS=1" \
           "GFD_FIRST_CHUNK_BYTES=512K" "GFD_GATHER_THREADS=12" "GFD_PIECE_BYTES=16K"; do
    # shellcheck disable=SC2086
    export $v
    name=$(echo "$v" | tr ' =' '_-')
    run_bench "tune_${name}_a" --quick --backends gather
    run_bench "tune_${name}_b" --quick --backends gather
    run_bench "tune_${name}_trace" --quick --backends gather --trace
    for x in $v; do unset "${x%%=*}"; done
  done
  run_bench latency --blocks 16,64,256
  GFD_KERNEL_MAX_BYTES=1M run_bench latency_kernel1M --blocks 16,64,256,512 --backends gather
  GFD_KERNEL_MAX_BYTES=0 run_bench latency_staged --blocks 512 --backends gather,zero_copy_kernel
  run_bench under_load --quick --under-load
  run_bench quick_scattered --quick --dst scattered --trace --backends gather,zero_copy_kernel
  run_bench quick_warm --quick --warm --backends gather
fi
if [ "$MODE" = probe ]; then
  timeout 120 "$B" --layout pool --quick --host-load-probe > "$OUT/host_load_probe.log" 2>&1
  summary "== host_load_probe: rc=$?"
  sed -n '/^host-load probe/,$p' "$OUT/host_load_probe.log" >> "$OUT/summary.txt"
  for t in 8 10 12 15; do
    GFD_GATHER_THREADS=$t run_bench "threads_$t" --blocks 2048,16384 --backends gather
  done
  timeout 150 build-gpu/tests/micro/micro_ring --benchmark_min_time=0.1 > "$OUT/micro_ring.log" 2>&1
  summary "== micro_ring: rc=$?"
  grep -E "^BM_" "$OUT/micro_ring.log" >> "$OUT/summary.txt"
fi
if [ "$MODE" = swap ]; then
  # Device to host and pageable host memory (issue 6): every backend, 2048 x 4 KB.
  run_bench d2h_cold --quick --direction d2h
  run_bench d2h_trace --quick --direction d2h --trace --backends gather
  run_bench d2h_scattered --quick --direction d2h --dst scattered --trace --backends gather
  run_bench h2d_pageable --quick --pageable
  run_bench h2d_pageable_trace --quick --pageable --trace --backends gather
  run_bench d2h_pageable --quick --direction d2h --pageable
  run_bench d2h_sweep --direction d2h
  run_bench h2d_pageable_sweep --pageable
  timeout 120 build-gpu/tests/micro/micro_pointer --benchmark_min_time=0.05s > "$OUT/micro_pointer.log" 2>&1
  summary "== micro_pointer: rc=$?"
  grep -E "^BM_" "$OUT/micro_pointer.log" | awk '{print $1, $2, $3, $NF}' >> "$OUT/summary.txt"
  timeout 60 build-gpu/examples/kv_swap > "$OUT/kv_swap.log" 2>&1
  summary "== kv_swap example: rc=$? $(tail -1 "$OUT/kv_swap.log")"
fi
if [ "$MODE" = multi ]; then
  { nvidia-smi topo -m; numactl -H 2>/dev/null || lscpu | grep -i numa; } > "$OUT/topology.txt" 2>&1
  M=build-gpu/bench/gfd_multi_gpu_benchmark
  for src in cold warm; do
    SECONDS=0
    flag=""; [ $src = warm ] && flag=--warm
    timeout 300 $M $flag --csv "$OUT/multi_$src.csv" --json "$OUT/multi_$src.json" > "$OUT/multi_$src.log" 2>&1
    summary "== multi_$src: rc=$? (${SECONDS}s)"
    sed -n '/^topology:/,/^each GPU/p;/^G    backend/,$p' "$OUT/multi_$src.log" >> "$OUT/summary.txt"
  done
  python3 tools/plot_results.py "$OUT/multi_cold.csv" "$OUT/multi_warm.csv" --out "$OUT/charts" > "$OUT/plot.log" 2>&1
  summary "== charts: rc=$? $(ls "$OUT/charts" 2>/dev/null | tr '\n' ' ')"
  mkdir -p "$FINAL/charts" && cp "$OUT"/charts/*.png "$FINAL/charts/" 2>/dev/null
fi
if [ "$MODE" = final ]; then
  run_bench sweep_cold
  run_bench sweep_warm --warm
  run_bench scattered_cold --quick --dst scattered
  run_bench batch8_cold --quick --batch 8
  run_bench under_load --quick --under-load
  run_bench trace_2048 --quick --backends gather --trace
  run_bench trace_16384 --blocks 16384 --backends gather --trace
  GFD_KERNEL_MAX_BYTES=0 run_bench nokernel_latency --blocks 16,64,256 --backends gather --iters 50
  for m in micro_planner micro_ring micro_gather; do
    timeout 150 build-gpu/tests/micro/$m --benchmark_min_time=0.1 > "$OUT/$m.log" 2>&1
    summary "== $m: rc=$?"
  done
  grep -E "^BM_" "$OUT/micro_planner.log" "$OUT/micro_gather.log" | sed 's/^.*\/\(micro_[a-z]*\).log:/\1 /' |
    awk '{print $1, $2, $3, $4, $NF}' >> "$OUT/summary.txt"
  python3 tools/plot_results.py "$OUT/sweep_cold.csv" "$OUT/sweep_warm.csv" "$OUT/under_load.csv" \
    --out "$OUT/charts" > "$OUT/plot.log" 2>&1
  summary "== charts: rc=$? $(ls "$OUT/charts" 2>/dev/null | tr '\n' ' ')"
  mkdir -p "$FINAL/charts" && cp "$OUT"/charts/*.png "$FINAL/charts/" 2>/dev/null
fi
if [ "$MODE" != reliability ]; then
  SECONDS=0
  (cd build-gpu && timeout ${CTEST_TIMEOUT:-420} ctest --output-on-failure -j4 --timeout 90) > "$OUT/ctest.log" 2>&1
  summary "ctest: rc=$? $(grep -E 'tests passed|tests failed' "$OUT/ctest.log") (${SECONDS}s)"
  grep -E "\*\*\*Failed|Timeout|Exception" "$OUT/ctest.log" | head -20 >> "$OUT/summary.txt"
fi
tar czf "$FINAL/logs.tgz" -C "$OUT" .
cp "$OUT/summary.txt" "$FINAL/summary.txt"
echo; cat "$OUT/summary.txt"
