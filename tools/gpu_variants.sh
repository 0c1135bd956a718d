#!/usr/bin/env bash
# Rotated A/B of engine settings on the paged case (the runtime's call), one line per run:
#   tools/gpu_variants.sh ROUNDS "NAME=ENV ENV" ... (ENV as GFD_X=v, comma-free; NAME only: defaults)
# The paged benchmark reads the GFD_* variables since the ninth session (before, every variant ran
# the defaults). Builds build-gpu first if needed; each run is gfd_benchmark --layout paged, gfd only,
# $SIZES (default 4K,16K,32K) both directions, 64 ids. Writes $OUT/variants.txt.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu_out}; mkdir -p "$OUT"
rounds=$1; shift
[ -x build-gpu/bench/gfd_benchmark ] || { cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 \
  -DGFD_BUILD_PYTHON=ON > "$OUT/build.log" 2>&1 && cmake --build build-gpu -j"$(nproc)" >> "$OUT/build.log" 2>&1; } || exit 1
for r in $(seq "$rounds"); do
  for v in "$@"; do
    name=${v%%=*}; envs=${v#*=}; [ "$envs" = "$v" ] && envs=""
    line=$(env $envs build-gpu/bench/gfd_benchmark --layout paged --direction ${DIRS:-both} --block-sizes ${SIZES:-4K,16K,32K} \
      --blocks 64 --methods gfd 2>&1 | awk '$4=="gfd"{printf "%s %s %s %sus | ", $1, $2, $8, $10}')
    echo "r$r $name: $line" | tee -a "$OUT/variants.txt"
  done
done
