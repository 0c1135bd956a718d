#!/usr/bin/env bash
# Rotated A/B of engine settings on the paged case (the runtime's call), one line per run:
#   tools/gpu_variants.sh ROUNDS "NAME=ENV ENV" ... (ENV as GFD_X=v, comma-free; NAME only: defaults)
# The paged benchmark reads the GFD_* variables since the ninth session (before, every variant ran
# the defaults). Builds build-gpu first if needed; each run is gfd_benchmark --layout paged, gfd only,
# $SIZES (default 4K,16K,32K), $DIRS (default both), $BLOCKS ids (default 64; C++ only), plus $EXTRA (e.g. --under-load=decode:
# each line then also gives the rate kept and the load's slowdown). PY=1: the same through Python
# (python -m gfd.bench --layout paged, swap_blocks on torch tensors) instead. BIN=path among a
# variant's settings runs that gfd_benchmark (another build, e.g. build-old/bench/gfd_benchmark from
# tools/gpu_compare.sh's OLD_SRC) instead of build-gpu's. Writes $OUT/variants.txt.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu_out}; mkdir -p "$OUT"
rounds=$1; shift
[ -x build-gpu/bench/gfd_benchmark ] || { cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 \
  -DGFD_BUILD_PYTHON=ON > "$OUT/build.log" 2>&1 && cmake --build build-gpu -j"$(nproc)" >> "$OUT/build.log" 2>&1; } || exit 1
export PYTHONPATH=$PWD/build-gpu/python
variants=("$@")
for r in $(seq "$rounds"); do
  # Round r starts at variant r-1 (mod their number): no variant always runs first (the fourth
  # session found the first run of a round 3-7 points lower at 2048 x 4 KB whatever it ran).
  for ((i = 0; i < ${#variants[@]}; i++)); do
    v=${variants[$(( (i + r - 1) % ${#variants[@]} ))]}
    name=${v%%=*}; envs=${v#*=}; [ "$envs" = "$v" ] && envs=""
    bin=build-gpu/bench/gfd_benchmark
    for e in $envs; do case $e in BIN=*) bin=${e#BIN=} ;; esac; done
    if [ "${PY:-0}" = 1 ]; then
      # Python rows: block blocks dir method P50 ratio P90 call verified [load GB/s kept ratio mm-x]
      line=$(env $envs python3 -m gfd.bench --layout paged --direction ${DIRS:-both} --block-sizes ${SIZES:-4K,16K,32K} \
        --methods gfd ${EXTRA:-} 2>&1 | awk '$4=="gfd"{printf "%s %s %s %sus %s %s | ", $1, $3, $6, $8, $11, $13}')
    else
      # C++ rows: dir size blocks method load p50 p90 ratio r_p90 submit kept slowdown verified
      line=$(env $envs "$bin" --layout paged --direction ${DIRS:-both} \
        --block-sizes ${SIZES:-4K,16K,32K} --blocks ${BLOCKS:-64} --methods gfd ${EXTRA:-} 2>&1 |
        awk '$4=="gfd"{printf "%s %s %s %s %sus %s %s | ", $1, $2, $5, $8, $10, $11, $12}')
    fi
    echo "r$r $name: $line" | tee -a "$OUT/variants.txt"
  done
done
