#!/usr/bin/env bash
# Measures every figure of docs/performance.md on a GPU machine and prints its tables.
#   bench/measure.sh [CASE ...]     run at the repository root (or from anywhere)
# Cases (default: all of them; the times are those of their steps on the H100 of
# docs/performance.md):
#   paged    the runtime's call both ways, C++ and Python, three runs each; the ids-per-transfer
#            sweep both ways, one run (about 2.5 minutes)
#   load     the runtime's call at every block size with every peer, idle and beside
#            back-to-back bf16 matmuls, both ways, one run; Python under the same load (1.5 minutes)
#   stages   gfd's stages alone beside the same matmuls, against gfd whole and the contiguous DMA:
#            its gather threads' copies (no GPU work) and its placing / packing kernel (no host
#            side, no DMA), 4K, 32K, 64K and 2M blocks, both ways, $RUNS runs; gfd beside them
#            as calls and blocks grow (4 and 32 KB blocks, 8, 64 and 512 ids a call), $RUNS runs;
#            and the staged path's host-side ceiling: 4, 16 and 32 KB gather-only rates and the
#            host memory's copy rate as threads are added beside the contiguous DMA
#            (--host-load-probe), once
#   pool     one pool of 2048 random 4 KB blocks, every backend; the strided layout against
#            random blocks; three runs each (under a minute)
#   vllm     gfd.vllm's offloading worker against vLLM's own copy path, two runs, and one with
#            another Python thread busy (about 4.5 minutes; vLLM itself is not needed)
#   sglang   HiCache's loads and write-backs as gfd.sglang makes them against SGLang's direct
#            and kernel paths, three runs, and one beside back-to-back bf16 matmuls (SGLang itself
#            is not needed; about 2 minutes)
#   latency  16, 64 and 256 blocks of 4 KB, every backend, three runs (under a minute)
#   onegpu   1, 2, 4 and 8 engines on one GPU, each with its own caller thread, CPUs and stream,
#            submitting 2048 x 4 KB at once (gfd_multi_gpu_benchmark --one-gpu): the call's time
#            and the caller's CPU time as engines are added, gather, batch_async and per_block,
#            three runs
#   serving  a decode loop (CUDA graph replayed by a Python loop) beside prefix-hit loads through
#            each path, batch sizes 1, 16 and 64: TPOT P50/P99 (python -m gfd_bench.serving;
#            about 40,000 decode steps a run, $SERVING_RUNS runs)
# Cases may run in separate calls (e.g. `bench/measure.sh paged load`, then
# `bench/measure.sh pool latency sglang`, then `bench/measure.sh vllm`): each call packs its own
# archive, and bench/summarize.py reads every archive of $OUT together.
# It builds $BUILD_DIR first when needed (as tools/gpu_check.sh does: Release, Python on). Each
# command's log and CSV go to a work folder, packed after every step into
# $OUT/measure-<cases>.tgz; the tables go to $OUT/measure-<cases>.md and are printed last
# (python3 bench/summarize.py prints them again from the .tgz).
# Environment:
#   OUT          default ./bench-out
#   BUILD_DIR    default build-gpu
#   CUDA_ARCHS   default 90
#   RUNS         runs of the cheap commands (default 3)
#   LOAD_RUNS    runs of the load sweeps (default 1)
#   VLLM_RUNS    runs of the vLLM worker's sweep (default 2; the busy-thread case runs once)
#   SERVING_RUNS runs of the serving loop (default 1)
#   GFD_COMMIT   the commit named with the figures (default: git rev-parse HEAD)
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
ALL="paged load stages pool vllm sglang latency onegpu serving"
CASES=${*:-$ALL}
for c in $CASES; do
  case " $ALL " in *" $c "*) ;; *) echo "measure: unknown case '$c' (cases: $ALL)" >&2; exit 2 ;; esac
done
BUILD_DIR=${BUILD_DIR:-build-gpu}
OUT=${OUT:-$ROOT/bench-out}
RUNS=${RUNS:-3}
LOAD_RUNS=${LOAD_RUNS:-1}
VLLM_RUNS=${VLLM_RUNS:-2}
SERVING_RUNS=${SERVING_RUNS:-1}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
NAME=measure-$(echo $CASES | tr ' ' '-')
W=$(mktemp -d "/tmp/gfd-$NAME.XXXXXX")
PY=$(command -v python3) || { echo "measure: no python3 on PATH" >&2; exit 1; }
[ -d /usr/local/cuda/bin ] && case ":$PATH:" in *:/usr/local/cuda/bin:*) ;; *) PATH="$PATH:/usr/local/cuda/bin" ;; esac

pack() { tar czf "$OUT/$NAME.tgz" -C "$W" . 2> /dev/null; }
{ nvidia-smi --query-gpu=name,driver_version,pcie.link.gen.current,pcie.link.width.current --format=csv,noheader 2> /dev/null || echo "no GPU found (nvidia-smi)"
  echo "$(nproc) CPUs, $(lscpu | sed -n 's/^Model name: *//p'), L3 $(lscpu | sed -n 's/^L3 cache: *//p')"
  echo "gfd $(sed -n 's/^project(gfd VERSION \([0-9.]*\).*/\1/p' CMakeLists.txt) at commit ${GFD_COMMIT:-$(git rev-parse --short HEAD 2> /dev/null || echo unknown)}"
  echo "cases: $CASES; $(date -u '+%Y-%m-%d %H:%M UTC')"
} > "$W/machine.txt" 2>&1
cat "$W/machine.txt"

# The build (a no-op when tools/gpu_check.sh built it already).
SECONDS=0
pybind11_dir=$("$PY" -m pybind11 --cmakedir 2> /dev/null || true)
cfg=(cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release "-DCMAKE_CUDA_ARCHITECTURES=${CUDA_ARCHS:-90}"
     -DGFD_BUILD_PYTHON=ON -DGFD_CUDART_STATIC=OFF "-DPython_EXECUTABLE=$PY")
[ -n "$pybind11_dir" ] && cfg+=("-Dpybind11_DIR=$pybind11_dir")
if ! { "${cfg[@]}" && cmake --build "$BUILD_DIR" -j"$(nproc)" --target gfd_benchmark gfd_multi_gpu_benchmark gfd_python; } > "$W/build.log" 2>&1; then
  tail -30 "$W/build.log"; pack
  echo "measure: the build failed (log in $OUT/$NAME.tgz)" >&2
  exit 1
fi
echo "build: ${SECONDS}s"
# The gfd package as built, and the Python benchmarks (bench/python/gfd_bench, not installed).
export PYTHONPATH=$ROOT/$BUILD_DIR/python:$ROOT/bench/python PYTHONUNBUFFERED=1
B=$BUILD_DIR/bench/gfd_benchmark
failed=0

# step NAME TIMEOUT COMMAND...: one command, its output in NAME.log, its CSV (--csv) NAME.csv.
step() {
  local name=$1 t=$2 rc
  shift 2
  SECONDS=0
  echo "+ $*" > "$W/$name.log"
  timeout "$t" "$@" --csv "$W/$name.csv" >> "$W/$name.log" 2>&1
  rc=$?
  printf '%-22s rc=%d %4ds  %s\n' "$name" "$rc" "$SECONDS" "$*" | tee -a "$W/steps.txt"
  [ $rc -eq 0 ] || { failed=1; tail -5 "$W/$name.log"; }
  pack
}

has() { case " $CASES " in *" $1 "*) return 0 ;; esac; return 1; }
if has paged; then
  for r in $(seq "$RUNS"); do
    step "paged_cpp_$r" 120 "$B" --layout paged --direction both --block-sizes 4K,16K,32K,64K --blocks 64 \
      --methods gfd,batch,uva12
    step "paged_py_$r" 120 "$PY" -m gfd_bench --layout paged --direction both
  done
  step ids_h2d 180 "$B" --layout paged --direction h2d
  step ids_d2h 180 "$B" --layout paged --direction d2h
fi
if has load; then
  for r in $(seq "$LOAD_RUNS"); do
    for dir in h2d d2h; do
      step "load_sweep_${dir}_$r" 180 "$B" --layout paged --direction $dir \
        --block-sizes 2K,4K,8K,16K,32K,64K,256K,2M --blocks 64 --under-load=decode
    done
  done
  step load_py_1 120 "$PY" -m gfd_bench --layout paged --direction both --block-sizes 4K,32K --under-load=decode
fi
if has stages; then
  for r in $(seq "$RUNS"); do
    step "stages_$r" 180 "$B" --layout paged --direction both --block-sizes 4K,32K,64K,2M \
      --blocks 64 --under-load=decode --methods gfd,gather_only,place_only
  done
  for r in $(seq "$RUNS"); do
    step "calls_$r" 180 "$B" --layout paged --direction both --block-sizes 4K,32K --blocks 8,64,512 \
      --under-load=decode --methods gfd
  done
  step ceiling_1 120 "$B" --layout pool --backends gather --block-sizes 4K,16K,32K --blocks 2048 \
    --dst scattered --host-load-probe
fi
if has pool; then
  for r in $(seq "$RUNS"); do
    step "pool_$r" 60 "$B" --layout pool --quick
  done
  for r in $(seq "$RUNS"); do
    for dir in h2d d2h; do
      step "strided_${dir}_$r" 90 "$B" --layout strided --pitch 2 --direction $dir --blocks 64,128,256,2048,16384 \
        --block-sizes 4K --backends gather,batch_async,zero_copy_kernel
    done
    step "random_h2d_$r" 90 "$B" --layout pool --blocks 64,128,256,2048,16384 --block-sizes 4K --backends gather
  done
fi
if has vllm; then
  for r in $(seq "$VLLM_RUNS"); do
    step "vllm_$r" 240 "$PY" -m gfd_bench.vllm --pages 8K,32K --blocks 64 --gpu-alloc one --host-layout block,region
  done
  step vllm_busy_1 120 "$PY" -m gfd_bench.vllm --pages 32K --blocks 64 --gpu-alloc one --host-layout region --busy-thread
fi
if has sglang; then
  for r in $(seq "$RUNS"); do
    step "sglang_$r" 240 "$PY" -m gfd_bench.sglang --reps 10
  done
  step sglang_load_1 240 "$PY" -m gfd_bench.sglang --reps 5 --layouts layer_first --load matmul
fi
if has latency; then
  for r in $(seq "$RUNS"); do
    step "latency_$r" 60 "$B" --layout pool --blocks 16,64,256 --block-sizes 4K
  done
fi
if has onegpu; then
  for r in $(seq "$RUNS"); do
    step "onegpu_$r" 120 "$BUILD_DIR/bench/gfd_multi_gpu_benchmark" --one-gpu
  done
fi
if has serving; then
  for r in $(seq "$SERVING_RUNS"); do
    step "serving_$r" 360 "$PY" -m gfd_bench.serving
  done
fi

# bench/summarize.py prints every case's table but the serving loop's, which its own module
# prints from the runs' CSVs.
others=$(for c in $CASES; do [ "$c" = serving ] || echo "$c"; done)
: > "$W/summary.md"
: > "$W/summary.err"
[ -z "$others" ] || "$PY" "$ROOT/bench/summarize.py" "$W" $others > "$W/summary.md" 2> "$W/summary.err"
if has serving && ls "$W"/serving_*.csv > /dev/null 2>&1; then
  { echo "### serving"; echo; "$PY" -m gfd_bench.serving --table "$W"/serving_*.csv; echo; } \
    >> "$W/summary.md" 2>> "$W/summary.err"
fi
{ echo "# $(head -1 "$W/machine.txt")"; sed -n '2,$p' "$W/machine.txt" | sed 's/^/# /'; echo; cat "$W/summary.md"; } \
  > "$OUT/$NAME.md"
pack
echo
echo "==== $NAME: tables for docs/performance.md (also in $OUT/$NAME.md; logs and CSVs in $OUT/$NAME.tgz)"
cat "$OUT/$NAME.md"
cat "$W/summary.err" >&2
echo
cat "$W/steps.txt"
[ $failed -eq 0 ] || { echo "measure: some steps failed (rc above; their logs are in $OUT/$NAME.tgz)" >&2; exit 1; }
