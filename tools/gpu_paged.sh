#!/usr/bin/env bash
# The paged-cache round on a GPU machine (the lent H200) in one call: build with Python, the C++
# and Python suites, then the runtime's call (every layer's K and V, scattered both sides) in C++
# (gfd_benchmark --layout paged) and through Python swap_blocks, idle and under the decode load,
# plus the one-pool headline. Logs and CSVs go to $OUT (packed as logs.tgz), a summary last.
#   tools/gpu_paged.sh [test] [pytest] [paged] [python] [load] [pool] [repeat] [trace]
#   [strided] [stridedtrace] [copy2d] [micro] [reliability] [vllm] [vllmsep] [sweepcheck]
#   [ctest] [loadsweep] (default: test paged python load pool; test runs ctest and pytest, ctest and pytest each alone)
# A final set in two calls (about 450 s each on the H200, sixteenth session's step times):
#   VLLM_PYTEST=0 VLLM_HOST_LAYOUT=block tools/gpu_paged.sh test paged repeat pool vllm
#   PY_RUNS=3 LOAD_DIRS=both tools/gpu_paged.sh python load loadsweep reliability
# (tools/py_call_cost.py beside the first, with PYTHONPATH=build-gpu/python.) With HOST_STRICT=1
# a call stops after the build, with status 3, on a slow host (below).
# $OUT receives four files: summary.partial.txt and partial_csv.tgz as the steps end, logs.tgz and
# summary.txt at the end (the device tool brings back at most 8 files per call: leave room).
set -uo pipefail
cd "$(dirname "$0")/.."
FINAL=${OUT:-$PWD/gpu_out}
OUT=$(mktemp -d /tmp/gfd_gpu.XXXXXX)
mkdir -p "$FINAL"
FINAL=$(cd "$FINAL" && pwd)  # absolute: run() packs the CSVs from inside $OUT
STEPS=${*:-test paged python load pool}
has() { case " $STEPS " in *" $1 "*) return 0 ;; esac; return 1; }
# The summary goes to $FINAL as it grows, so that a call cut by its time limit still returns it.
summary() { echo "$*" | tee -a "$OUT/summary.txt"; cp "$OUT/summary.txt" "$FINAL/summary.partial.txt"; }
{ nvidia-smi --query-gpu=name,driver_version,pcie.link.gen.current,pcie.link.width.current --format=csv
  nproc; lscpu | grep -E "Model name|L3|NUMA"; echo "sources: $(tools/source_id.sh) (tools/source_id.sh)"; } > "$OUT/machine.txt" 2>&1
cat "$OUT/machine.txt"

SECONDS=0
cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 -DGFD_BUILD_PYTHON=ON \
  > "$OUT/build.log" 2>&1 && cmake --build build-gpu -j"$(nproc)" -- -k >> "$OUT/build.log" 2>&1
summary "build: rc=$? (${SECONDS}s)"
grep -E "error" "$OUT/build.log" | head -10 >> "$OUT/summary.txt"
export PYTHONPATH=$PWD/build-gpu/python PYTHONUNBUFFERED=1
B=build-gpu/bench/gfd_benchmark
# HOST_STRICT=1: first time the lease's host (the contiguous reference copy of two sizes, a few
# seconds) and stop with status 3 if it is slow (tools/host_check.py), before the device time
# goes into rates that will read low: give the machine back and run again on a fresh one.
if [ "${HOST_STRICT:-0}" = 1 ]; then
  timeout 60 "$B" --layout paged --direction both --block-sizes 4K,32K --blocks 64 --methods uva12 \
    --csv "$OUT/host_probe.csv" > "$OUT/host_probe.log" 2>&1
  probe=$(python3 tools/host_check.py --strict "$OUT/host_probe.csv" 2>&1); prc=$?
  summary "host probe: $probe"
  if [ $prc -eq 3 ]; then
    tar czf "$FINAL/logs.tgz" -C "$OUT" . 2>/dev/null; cp "$OUT/summary.txt" "$FINAL/summary.txt"
    exit 3
  fi
fi

if has test || has ctest; then
  SECONDS=0
  (cd build-gpu && timeout 300 ctest -j6 --timeout 120 --output-on-failure) > "$OUT/ctest.log" 2>&1
  summary "ctest: rc=$? $(grep -E 'tests passed|tests failed' "$OUT/ctest.log") (${SECONDS}s)"
  grep -E "\*\*\*Failed|Timeout|Exception" "$OUT/ctest.log" | head -20 >> "$OUT/summary.txt"
fi
if has test || has pytest; then
  SECONDS=0
  timeout 300 python3 -m pytest -q -rf tests/python > "$OUT/pytest.log" 2>&1
  summary "pytest: rc=$? $(tail -1 "$OUT/pytest.log") (${SECONDS}s)"
  grep -E "^FAILED|^E  " "$OUT/pytest.log" | head -30 >> "$OUT/summary.txt"
fi
run() {  # name, timeout, command...
  local name=$1 t=$2; shift 2
  SECONDS=0
  timeout "$t" "$@" > "$OUT/$name.log" 2>&1
  summary "== $name: rc=$? (${SECONDS}s) $(env | grep -E '^GFD_' | tr '\n' ' ')"
  tail -n "${TAIL:-40}" "$OUT/$name.log" >> "$OUT/summary.txt"
  cp "$OUT/summary.txt" "$FINAL/summary.partial.txt"
  # The CSVs so far as well, so that a call cut by its time limit keeps the steps it finished
  # (logs.tgz is packed only at the end; the fifteenth session's call 4 lost its vLLM CSVs so).
  # One archive, not a file per step: the device tool brings back at most 8 files from $OUT (the
  # sixteenth session's call 2 lost every file of this script to that limit).
  [ -f "$OUT/$name.csv" ] && (cd "$OUT" && tar -czf "$FINAL/partial_csv.tgz" ./*.csv)
  return 0
}
if has paged; then
  run paged_h2d 240 "$B" --layout paged --direction h2d --csv "$OUT/paged_h2d.csv"
  run paged_d2h 240 "$B" --layout paged --direction d2h --csv "$OUT/paged_d2h.csv"
fi
if has sweepcheck; then  # the default host-to-device sweep, every peer or gfd alone, placement batched or not
  # (the twelfth session's call 5 ran gfd's staged sizes far slower in this sweep, after pytest)
  for v in "all:" "gfd:--methods gfd" "all_nobatch:GFD_BATCH_PLACEMENT=0" "all_again:" ; do
    name=${v%%:*}; rest=${v#*:}; envs=""; flags=""
    case "$rest" in GFD_*) envs=$rest ;; *) flags=$rest ;; esac
    TAIL=0 run "sweep_$name" 240 env $envs "$B" --layout paged --direction h2d $flags --csv "$OUT/sweep_$name.csv"
    awk -F, '$11=="gfd"{printf "%s x%s %.1f%% (p90 %.1f%%, call %.0f us) | ", $9, $8, 100*$18, 100*$19, $20}' \
      "$OUT/sweep_$name.csv" >> "$OUT/summary.txt"; echo >> "$OUT/summary.txt"
  done
fi
if has repeat; then  # three runs of the runtime's sizes, for the spread between runs
  for r in 1 2 3; do
    TAIL=40 run "repeat_$r" 120 "$B" --layout paged --direction both --block-sizes 4K,16K,32K,64K --blocks 64 \
      --methods gfd,batch,uva12 --csv "$OUT/repeat_$r.csv"
  done
fi
if has trace; then  # where gfd's call and transfer go, 4096 blocks of 4 KB each way
  SECONDS=0
  "$B" --layout paged --direction both --block-sizes ${TRACE_SIZES:-4K} --blocks 64 --methods gfd --trace > "$OUT/trace.log" 2>&1
  summary "== trace: rc=$? (${SECONDS}s)"
  grep -E "^trace:|^  (planned|submission|threads|pieces)|^[hd]2[dh] " "$OUT/trace.log" >> "$OUT/summary.txt"
fi
if has strided; then  # constant-stride runs as 2D copies: the seed's layout against random blocks
  for r in 1 2 3; do
    for dir in h2d d2h; do
      TAIL=20 run "strided_${dir}_$r" 120 "$B" --layout strided --pitch 2 --direction $dir --blocks 64,128,256,2048,16384 \
        --block-sizes 4K --backends gather,batch_async,zero_copy_kernel --csv "$OUT/strided_${dir}_$r.csv"
    done
    TAIL=10 run "random_h2d_$r" 120 "$B" --layout pool --blocks 64,128,256,2048,16384 --block-sizes 4K --backends gather \
      --csv "$OUT/random_h2d_$r.csv"
  done
fi
if has stridedtrace; then  # where an all-strided transfer's time goes, beside the same run's DMA
  for dir in h2d d2h; do
    TAIL=60 run "strided_trace_$dir" 120 "$B" --layout strided --pitch 2 --direction $dir --blocks 2048,16384 \
      --block-sizes 4K --backends gather --trace
  done
fi
if has copy2d; then  # 2D copies alone: a strided run whole or split over streams; vLLM 0.33's per-block shape
  for dir in h2d d2h; do
    TAIL=30 run "copy2d_$dir" 120 build-gpu/tests/micro/copy2d_cost --direction $dir
  done
  # A layer pitch over 2^31 - 1 (cudaMemcpy2DAsync's limit): 8 layers of 98304 x 32 KB (3 GiB each)
  TAIL=12 run copy2d_big_pitch 120 build-gpu/tests/micro/copy2d_cost --rows 2048 --splits 1 --layers 8 \
    --dev-blocks 98304 --widths 32K
fi
if has micro; then  # what following constant-stride runs costs a random list (ns per block)
  SECONDS=0
  for r in 1 2 3 4 5; do build-gpu/tests/micro/micro_planner --benchmark_filter='runs_'; done > "$OUT/micro_runs.log" 2>&1
  summary "== micro_planner runs: rc=$? (${SECONDS}s)"
  grep -oE "BM_MakePlan/[a-z_]+/[0-9]+|ns_per_block=[0-9.]+" "$OUT/micro_runs.log" | paste -sd' ' >> "$OUT/summary.txt"
fi
if has reliability; then  # the long stress run, and compute-sanitizer on the cache-set and scatter paths
  SECONDS=0
  GFD_STRESS_REQUESTS=100000 timeout 320 build-gpu/tests/gfd_stress_test --gtest_filter='*Cuda' > "$OUT/stress.log" 2>&1
  summary "== stress long: rc=$? (${SECONDS}s) $(grep -E '^stress' "$OUT/stress.log" | tr '\n' ' ')"
  CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
  for tool in ${CS_TOOLS:-memcheck racecheck}; do
    SECONDS=0
    timeout 90 "$CS" --tool $tool --error-exitcode 3 build-gpu/tests/gfd_kv_cache_test --gtest_filter='*Cuda*' \
      > "$OUT/cs_$tool.log" 2>&1
    summary "== compute-sanitizer $tool (kv_cache + cache set, CUDA): rc=$? (${SECONDS}s) $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|PASSED|FAILED' "$OUT/cs_$tool.log" | tr '\n' ' ')"
    # The placing kernel (batched placement, slot waits left to the gather threads) and the per-chunk scatter, through rings many times
    # smaller than the transfers.
    SECONDS=0
    timeout 120 "$CS" --tool $tool --error-exitcode 3 build-gpu/tests/gfd_engine_test \
      --gtest_filter='*BatchedPlacement*/Cuda_gather:*ScatteredDestinations*/Cuda_gather:*TotalFarLarger*/Cuda_gather:*SwapInLargerThanTheRing*/Cuda_gather:*BatchedPacking*/Cuda_gather' \
      > "$OUT/cs_engine_$tool.log" 2>&1
    summary "== compute-sanitizer $tool (engine: placing, CUDA): rc=$? (${SECONDS}s) $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|PASSED|FAILED' "$OUT/cs_engine_$tool.log" | tr '\n' ' ')"
  done
fi
if has vllm; then  # the vLLM offloading worker: byte-identical to vLLM's copy path, and its rates
  if [ "${VLLM_PYTEST:-1}" = 1 ]; then  # VLLM_PYTEST=0: the full pytest (test) has run it already
    SECONDS=0
    timeout 200 python3 -m pytest -q tests/python/test_kv_worker_gpu.py > "$OUT/vllm_pytest.log" 2>&1
    summary "vllm worker pytest: rc=$? $(tail -1 "$OUT/vllm_pytest.log") (${SECONDS}s)"
    grep -E "^FAILED|Error" "$OUT/vllm_pytest.log" | head -10 >> "$OUT/summary.txt"
  fi
  for r in ${VLLM_RUNS:-1 2 3}; do
    TAIL=14 run "vllm_bench_$r" 200 python3 -m gfd.bench_vllm --pages ${VLLM_PAGES:-8K,32K} --blocks 64 \
      --directions ${VLLM_DIRECTIONS:-h2d,d2h} --gpu-alloc ${VLLM_GPU_ALLOC:-one} --host-memory "${VLLM_HOST_MEMORY:-pool}" --host-layout "${VLLM_HOST_LAYOUT:-tensor,block}" --csv "$OUT/vllm_bench_$r.csv"
  done
fi
if has vllmsep; then  # the same with one GPU allocation per layer (vLLM before 0.33), one run
  TAIL=14 run vllm_bench_separate 200 python3 -m gfd.bench_vllm --pages ${VLLM_PAGES:-8K,32K} --blocks 64 \
    --gpu-alloc separate --host-memory "${VLLM_HOST_MEMORY:-pool}" --host-layout "${VLLM_HOST_LAYOUT:-tensor,block}" \
    --csv "$OUT/vllm_bench_separate.csv"
fi
if has python; then  # PY_RUNS runs (default 1): py_paged, py_paged_2, ...
  for r in $(seq "${PY_RUNS:-1}"); do
    name=py_paged; [ "$r" -gt 1 ] && name=py_paged_$r
    run "$name" 240 python3 -m gfd.bench --layout paged --direction both --csv "$OUT/$name.csv"
  done
fi
if has load; then
  run paged_load 300 "$B" --layout paged --direction h2d --block-sizes 4K,32K --blocks 64 --under-load=decode \
    --csv "$OUT/paged_load.csv"
  run py_load 240 python3 -m gfd.bench --layout paged --direction ${LOAD_DIRS:-h2d} --block-sizes 4K,32K --under-load=decode \
    --csv "$OUT/py_load.csv"
fi
if has loadsweep; then  # every block size at 64 ids, every peer, idle and under the decode load, both ways
  # (given no grid, --under-load measures only the default grid's 32K x 64 and 4K x 1024 under load)
  for dir in h2d d2h; do
    TAIL=60 run "loadsweep_$dir" 290 "$B" --layout paged --direction $dir --block-sizes ${LOAD_SIZES:-2K,4K,8K,16K,32K,64K,256K,2M} \
      --blocks 64 --under-load=decode --csv "$OUT/loadsweep_$dir.csv"
  done
fi
if has pool; then
  TAIL=25 run pool_quick 120 "$B" --layout pool --quick --csv "$OUT/pool_quick.csv"
fi
# How fast this lease's host makes driver calls: the median submit of the benchmark's one
# contiguous cudaMemcpyAsync (idle rows; tools/host_check.py). The seventeenth session's call 2
# got a host where it took about 10 us against the usual 2-6 us, and gfd (driver calls, gather
# threads) moved 4 KB swap-ins at 32-58% instead of 61-67%: read such a lease's rates as low.
summary "host: $(python3 tools/host_check.py $(ls "$OUT"/*.csv | grep -v host_probe) 2>&1)"
tar czf "$FINAL/logs.tgz" -C "$OUT" . 2>/dev/null
cp "$OUT/summary.txt" "$FINAL/summary.txt"
echo; echo "==== summary"; cat "$OUT/summary.txt"
