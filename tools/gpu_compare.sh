#!/usr/bin/env bash
# One lease on the GPU machine for a change to the engine: builds this tree and, when OLD_SRC
# names a source tree of an earlier commit, that one too; runs the test suite (and the Python
# suite when the package builds); then interleaves the benchmarks of both builds so that before
# and after are measured in the same lease, three runs each, plus the staging-write modes, the
# direct-copy threshold and small-transfer latency. Full logs go to $OUT/logs.tgz, the summary
# to $OUT/summary.txt and the terminal, last.
#   OLD_SRC=.gpu_old tools/gpu_compare.sh [sections...]   sections: test before-after writes
#                                                         direct latency python quick
#                                                         sweep multi knobs features trace
#                                                         ref uva d2h pageable dmacost repeat
#                                                         (default: test before-after writes direct latency python)
#   TARGETS="gfd_benchmark micro_gather" limits the build to those targets (a faster lease).
#   NEW_BA_ARGS="--pool=mmap" is passed to the new build's before-after runs (an older
#   gfd_benchmark took its sources from an mmap pool; the new one's default is cudaHostAlloc).
set -uo pipefail
cd "$(dirname "$0")/.."
FINAL=${OUT:-$PWD/gpu_out}
W=$(mktemp -d /tmp/gfd_cmp.XXXXXX)
mkdir -p "$FINAL"
SECTIONS=${*:-test before-after writes direct latency python}
has() { case " $SECTIONS " in *" $1 "*) return 0 ;; esac; return 1; }
J=$(nproc)
say() { echo "$*" | tee -a "$W/summary.txt"; }
{ nvidia-smi --query-gpu=name,driver_version,pcie.link.gen.current,pcie.link.width.current --format=csv
  nproc; lscpu | grep -E "Model name|L3|NUMA|Flags" | sed 's/Flags:.*\(cldemote\).*/Flags: ... \1 .../'; } > "$W/machine.txt" 2>&1
PY=$(command -v python3)
SECONDS=0
(cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 -DGFD_BUILD_PYTHON=ON \
   -DPython_EXECUTABLE="$PY" && cmake --build build-gpu -j"$J" ${TARGETS:+--target $TARGETS} -- -k) > "$W/build.log" 2>&1 &
NEW=$!
if [ -n "${OLD_SRC:-}" ]; then
  (cmake -S "$OLD_SRC" -B build-old -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 -DGFD_BUILD_TESTS=OFF \
     -DGFD_BUILD_EXAMPLES=OFF && cmake --build build-old -j"$J" --target gfd_benchmark) > "$W/build_old.log" 2>&1 &
  OLD=$!
  wait $OLD; say "build old: rc=$?"
fi
wait $NEW; say "build new: rc=$? (${SECONDS}s)"
grep -E "error" "$W/build.log" | head -5 | tee -a "$W/summary.txt"

# A benchmark run; its result rows (backend, blocks, size, ratio, GB/s) go to the summary.
bench() {  # label binary args...
  local label=$1 bin=$2; shift 2
  # A build that knows --layout defaults to the paged layout; these runs measure the pool one.
  local layout=()
  "$bin" --help 2>/dev/null | grep -q -- "--layout" && layout=(--layout pool)
  timeout 120 "$bin" "${layout[@]}" "$@" > "$W/$label.log" 2> "$W/$label.err"
  local rc=$?
  awk -v l="$label" -v rc="$rc" '/^blocks /{t=1;next} t&&NF==0{t=0} t{printf "%-28s %-16s %6s x %-7s p50 %8s us %7s GB/s ratio %s\n", l, $4, $1, $2, $6, $8, $11}' \
    "$W/$label.log" | tee -a "$W/summary.txt"
  [ $rc -ne 0 ] && say "$label: rc=$rc $(tail -2 "$W/$label.err" | tr '\n' ' ')"
  grep -h "^engine gather" "$W/$label.log" | head -1 >> "$W/engines.txt"
}
B=build-gpu/bench/gfd_benchmark
O=build-old/bench/gfd_benchmark

if has test; then
  SECONDS=0
  (cd build-gpu && timeout 240 ctest -j4 --timeout 120) > "$W/ctest.log" 2>&1
  say "ctest: rc=$? $(grep -E 'tests passed|tests failed' "$W/ctest.log") (${SECONDS}s)"
  grep -E "\*\*\*Failed|Timeout|Exception" "$W/ctest.log" | head -20 | tee -a "$W/summary.txt"
fi
if has before-after && [ -x "$O" ]; then
  # BA_SETS="args;args;..." (default: --quick), each run by both builds, interleaved, three rounds.
  IFS=';' read -ra ba_sets <<< "${BA_SETS:---quick}"
  for i in 1 2 3; do
    for j in "${!ba_sets[@]}"; do
      # Which build runs first alternates with (round + set): with a set given twice, each build
      # runs first three times (see the knobs' rotation below for why the place matters).
      if (( (i + j) % 2 )); then bench "old_${j}_$i" "$O" ${ba_sets[$j]}; fi
      bench "new_${j}_$i" "$B" ${ba_sets[$j]} ${NEW_BA_ARGS:-}
      if (( (i + j) % 2 == 0 )); then bench "old_${j}_$i" "$O" ${ba_sets[$j]}; fi
    done
  done
fi
if has writes; then
  for i in 1 2 3; do
    for m in cldemote streaming plain; do
      GFD_STAGING_WRITES=$m bench "writes_${m}_$i" "$B" --blocks 2048,16384 --backends gather
    done
  done
  GFD_STAGING_WRITES=cldemote bench writes_cldemote_warm "$B" --blocks 2048 --warm --backends gather
  GFD_STAGING_WRITES=cldemote bench writes_cldemote_1K "$B" --blocks 2048 --block-sizes 1024 --backends gather
  for m in cldemote streaming; do
    GFD_STAGING_WRITES=$m bench "writes_${m}_d2h" "$B" --quick --direction d2h --backends gather
  done
fi
if has direct; then
  for d in 1M 128K 32K; do
    GFD_DIRECT_MIN_BYTES=$d bench "direct_$d" "$B" --blocks 2048 --block-sizes 16384,65536,262144 \
      --backends gather
  done
  bench direct_batch "$B" --blocks 2048 --block-sizes 16384,65536,262144 --backends batch_async
fi
if has latency; then
  bench latency_staged "$B" --blocks 16,64 --backends gather,zero_copy_kernel
  GFD_KERNEL_MAX_BYTES=1M bench latency_kernel1M "$B" --blocks 16,64 --backends gather
fi
if has python && [ -d build-gpu/python ]; then
  SECONDS=0
  export PYTHONPATH=$PWD/build-gpu/python${PYTHONPATH:+:$PYTHONPATH}
  timeout 240 "$PY" -m pytest -q tests/python > "$W/pytest.log" 2>&1
  say "pytest: rc=$? $(tail -1 "$W/pytest.log") (${SECONDS}s)"
  grep -E "FAILED|Error" "$W/pytest.log" | head -10 | tee -a "$W/summary.txt"
  timeout 120 "$PY" examples/python/swap_kv.py > "$W/swap_kv.log" 2>&1
  say "swap_kv example: rc=$?"; tail -8 "$W/swap_kv.log" | tee -a "$W/summary.txt"
  for i in 1 2 3; do
    timeout 120 "$PY" -m gfd.bench > "$W/pybench_$i.log" 2>&1
    say "python -m gfd.bench #$i: rc=$?"; tail -4 "$W/pybench_$i.log" | tee -a "$W/summary.txt"
    bench "cxx_quick_gather_$i" "$B" --quick --backends gather
  done
fi
if has features; then
  # gfd_benchmark's source pools and load modes.
  bench feat_pools "$B" --quick --pool=cuda,gfd,mmap --backends gather,zero_copy_kernel
  grep -iE "^pool|pool " "$W/feat_pools.log" | head -12 >> "$W/summary.txt"
  bench feat_load "$B" --quick --under-load --backends gather,zero_copy_kernel
  grep -E "load|kept|slowdown" "$W/feat_load.log" | head -30 >> "$W/summary.txt"
fi
if has trace; then
  # The pipeline's timeline of the median transfer, for each of TRACE_KNOBS ("name:VAR=v,VAR=v
  # ...", default settings when unset).
  for k in ${TRACE_KNOBS:-default:}; do
    name=${k%%:*}; vars=${k#*:}
    (for a in $(echo "$vars" | tr ',' ' '); do export "$a"; done
     say "trace knob $name: $vars"
     timeout 120 "$B" --quick --backends gather --trace > "$W/trace_${name}_2048.log" 2>&1
     sed -n '/^trace:/,/^$/p' "$W/trace_${name}_2048.log" | head -18 | tee -a "$W/summary.txt"
     timeout 120 "$B" --blocks 16384 --backends gather --trace > "$W/trace_${name}_16384.log" 2>&1
     sed -n '/^trace:/,/^$/p' "$W/trace_${name}_16384.log" | head -26 | tee -a "$W/summary.txt")
  done
fi
if has d2h; then
  for i in 1 2 3; do bench "d2h_$i" "$B" --quick --direction d2h; done
fi
if has pageable; then
  for i in 1 2 3; do bench "pageable_$i" "$B" --quick --pageable; done
fi
if has quick; then
  for i in 1 2 3; do bench "quick_$i" "$B" --quick; done
  bench quick_d2h "$B" --quick --direction d2h
fi
if has sweep; then
  bench sweep_cold "$B"
  bench sweep_warm_2048 "$B" --warm --blocks 2048 --backends gather,zero_copy_kernel
fi
if has knobs; then
  # The pipeline's settings, one change at a time from the defaults, interleaved, three rounds:
  # staging write mode against ring and slot size (does a ring that stays in the L3 let the copy
  # engine read CLDEMOTE'd lines from there?), piece size, first chunk, streams, threads.
  # KNOBS="name:VAR=v,VAR=v ..." replaces the list.
  KNOBS=${KNOBS:-"default: cld8M1M:GFD_STAGING_WRITES=cldemote,GFD_STAGING_BYTES=8M,GFD_SLOT_BYTES=1M cld16M1M:GFD_STAGING_WRITES=cldemote,GFD_STAGING_BYTES=16M,GFD_SLOT_BYTES=1M str64M1M:GFD_SLOT_BYTES=1M plain8M1M:GFD_STAGING_WRITES=plain,GFD_STAGING_BYTES=8M,GFD_SLOT_BYTES=1M"}
  # Round i starts at the i-th variant (a rotation): in one lease the run placed first in each
  # round was 3-7 points slower whatever it ran (bench/RESULTS.md, 2026-12-01 fourth session),
  # so no variant may always run in the same place.
  read -ra knob_list <<< "$KNOBS"
  for i in 1 2 3; do
    n=${#knob_list[@]}
    for ((r = 0; r < n; r++)); do
      k=${knob_list[$(( (r + i - 1) % n ))]}
      name=${k%%:*}; vars=${k#*:}
      (for a in $(echo "$vars" | tr ',' ' '); do export "$a"; done
       bench "knob_${name}_$i" "$B" --blocks 2048,16384 --backends gather ${KNOB_ARGS:-})
    done
  done
fi
M=build-gpu/tests/micro
if has knobs || has ref; then
  # The yardstick: the same pipeline with nothing around it (tests/micro/ref_pipeline.cpp).
  if [ -x $M/ref_pipeline ]; then
    for i in 1 2 3; do
      # REF_VARIANTS="writes:slots[:prefetch] ..."
      for v in ${REF_VARIANTS:-streaming:8 cldemote:8}; do
        set -- ${v//:/ }
        pf=${3:-l2}
        for n in 2048 16384; do
          timeout 60 $M/ref_pipeline --blocks $n --writes $1 --slots $2 --prefetch $pf > "$W/ref_${1}_$2_${pf}_${n}_$i.log" 2>&1
          echo "ref $1 slots=$2 pf=$pf n=$n #$i: $(tail -1 "$W/ref_${1}_$2_${pf}_${n}_$i.log")" | tee -a "$W/summary.txt"
        done
      done
    done
  fi
fi
if has uva && [ -x $M/uva_kernel ]; then
  # The zero-copy yardstick (tests/micro/uva_kernel.cu) beside the backend, interleaved.
  for i in 1 2 3; do
    for n in 2048 16384; do
      timeout 60 $M/uva_kernel --blocks $n > "$W/uva_${n}_$i.log" 2>&1
      sed "s/^/uva n=$n #$i: /" "$W/uva_${n}_$i.log" | tail -5 | tee -a "$W/summary.txt"
    done
    bench "uva_engine_$i" "$B" --blocks 2048,16384 --backends zero_copy_kernel
  done
fi
if has knobs; then
  [ -x $M/micro_gather ] && timeout 120 $M/micro_gather --benchmark_filter='BM_Gather/' > "$W/micro_gather.log" 2>&1 \
    && grep -E "^BM_" "$W/micro_gather.log" | tee -a "$W/summary.txt"
  [ -x $M/micro_planner ] && timeout 60 $M/micro_planner --benchmark_filter='ascending_dst/blocks:2048|shuffled_dst/blocks:2048' > "$W/micro_planner.log" 2>&1 \
    && grep -E "^BM_" "$W/micro_planner.log" | tee -a "$W/summary.txt"
fi
if has dmacost && [ -x $M/dma_cost ]; then
  # What a chunk's DMA costs beyond its bytes (tests/micro/dma_cost.cu), twice.
  for i in 1 2; do
    timeout 120 $M/dma_cost > "$W/dma_cost_$i.log" 2>&1
    say "dma_cost #$i: rc=$?"; cat "$W/dma_cost_$i.log" | tee -a "$W/summary.txt"
  done
fi
if has repeat; then
  # REPEAT_N identical runs back to back (default 12), each with its start time: is a run's
  # place in a sequence, or a disturbance of the host at some period, what biased the rounds?
  for ((i = 1; i <= ${REPEAT_N:-12}; i++)); do
    say "repeat #$i starts at $(date +%s.%N | cut -c1-14)"
    bench "repeat_$i" "$B" --blocks 2048,16384 --backends gather
  done
fi
if has multi; then
  # Every GPU at once, one thread each (gfd_multi_gpu_benchmark), cold sources, every backend.
  SECONDS=0
  timeout 300 build-gpu/bench/gfd_multi_gpu_benchmark > "$W/multi_cold.log" 2>&1
  say "multi_cold: rc=$? (${SECONDS}s)"
  sed -n '/^topology:/,/^each GPU/p;/^G    backend/,$p' "$W/multi_cold.log" | tee -a "$W/summary.txt"
fi
cat "$W/engines.txt" 2>/dev/null | sort -u | tee -a "$W/summary.txt"
tar -czf "$FINAL/logs.tgz" -C "$W" . 2>/dev/null
cp "$W/summary.txt" "$FINAL/summary.txt"
