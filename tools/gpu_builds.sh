#!/usr/bin/env bash
# One benchmark command across builds of several commits in one lease, rotated: to find which
# commit moved a figure by a few points (a bisection), where one build against another in two
# leases says nothing (the spread between leases is larger than the change).
#   here:       tools/gpu_builds.sh prepare COMMIT...   each commit's tree in .gpu_builds/<commit>
#   on the GPU: tools/gpu_builds.sh run [ROUNDS]         (device tool: carry [".gpu_builds"])
# `run` builds gfd_benchmark of this tree ("head") and of every tree in .gpu_builds, in parallel,
# then runs `gfd_benchmark $ARGS` (default --quick: the seed's 2048 x 4 KB from one pool) once per
# build per round, ROUNDS rounds (default 6), each round starting at another build (the fourth
# session found the first run of a round lower, whatever it ran). A build that knows --layout gets
# --layout pool, as tools/gpu_compare.sh does. BACKEND (default gather) is the row kept. The host
# is probed before and after (tools/host_check.py: a lease's host can turn slow within a call).
# Writes $OUT/builds.txt (a line per run, then the summary) and $OUT/builds_logs.tgz.
set -uo pipefail
cd "$(dirname "$0")/.."
mode=${1:-}
shift || true
if [ "$mode" = prepare ]; then
  [ $# -gt 0 ] || { echo "usage: tools/gpu_builds.sh prepare COMMIT..." >&2; exit 2; }
  for c in "$@"; do
    name=$(git rev-parse --short "$c^{commit}") || exit 1
    rm -rf ".gpu_builds/$name" && mkdir -p ".gpu_builds/$name" && git archive "$name" | tar -x -C ".gpu_builds/$name" || exit 1
    echo ".gpu_builds/$name: $(git log -1 --format=%s "$name" | cut -c1-80)"
  done
  exit 0
fi
[ "$mode" = run ] || { echo "usage: tools/gpu_builds.sh prepare COMMIT... | run [ROUNDS]" >&2; exit 2; }
rounds=${1:-6}
OUT=${OUT:-$PWD/gpu_out}
mkdir -p "$OUT"
W=$(mktemp -d /tmp/gfd_builds.XXXXXX)
ARGS=${ARGS:---quick}
BACKEND=${BACKEND:-gather}
names=(head); srcs=(.)
for d in .gpu_builds/*/; do
  [ -f "$d/CMakeLists.txt" ] && { names+=("$(basename "$d")"); srcs+=("${d%/}"); }
done
J=$(nproc)
for i in "${!names[@]}"; do
  (cmake -S "${srcs[$i]}" -B "build-ab-${names[$i]}" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=${CUDA_ARCHS:-90} \
     -DGFD_BUILD_TESTS=OFF -DGFD_BUILD_EXAMPLES=OFF -DGFD_BUILD_PYTHON=OFF &&
   cmake --build "build-ab-${names[$i]}" -j"$J" --target gfd_benchmark) > "$W/build_${names[$i]}.log" 2>&1 &
done
wait
declare -A layout  # per build: --layout pool where its gfd_benchmark knows --layout
for n in "${names[@]}"; do
  bin=build-ab-$n/bench/gfd_benchmark
  [ -x "$bin" ] || echo "build $n failed: $(grep -m1 -i error "$W/build_$n.log")" | tee -a "$OUT/builds.txt"
  layout[$n]=""
  "$bin" --help 2>/dev/null | grep -q -- "--layout" && layout[$n]="--layout pool"
done
probe() {
  timeout 60 build-ab-head/bench/gfd_benchmark --layout paged --direction both --block-sizes 4K,32K --blocks 64 \
    --methods uva12 --csv "$W/probe_$1.csv" > "$W/probe_$1.log" 2>&1
  echo "host $1: $(python3 tools/host_check.py "$W/probe_$1.csv" 2>&1)" | tee -a "$OUT/builds.txt"
}
probe before
for r in $(seq "$rounds"); do
  for ((k = 0; k < ${#names[@]}; k++)); do
    n=${names[$(( (k + r - 1) % ${#names[@]} ))]}
    bin=build-ab-$n/bench/gfd_benchmark
    [ -x "$bin" ] || continue
    # shellcheck disable=SC2086
    timeout 120 "$bin" ${layout[$n]} $ARGS > "$W/run_${n}_$r.log" 2>&1
    # Result rows: blocks size dst backend load p50_us p90_us p50_GB/s p90_GB/s ref_GB/s ratio ...
    awk -v r="$r" -v n="$n" -v b="$BACKEND" '/^blocks /{t=1;next} t&&NF==0{t=0}
      t&&$4==b{printf "r%s %s %s x %s %s GB/s %s\n", r, n, $1, $2, $8, $11}' "$W/run_${n}_$r.log" | tee -a "$OUT/builds.txt"
  done
done
probe after
# Per build and configuration: the median GB/s and ratio, and in how many rounds it moved more
# than head's run of the same round.
python3 - "$OUT/builds.txt" <<'EOF' | tee -a "$OUT/builds.txt"
import re, statistics, sys
runs = {}
for line in open(sys.argv[1]):
    m = re.match(r"r(\d+) (\S+) (\S+ x \S+) (\S+) GB/s (\S+)%", line)
    if m:
        runs.setdefault((m[3], m[2]), {})[int(m[1])] = (float(m[4]), float(m[5]))
for (case, name), rs in sorted(runs.items()):
    gbps = [g for g, _ in rs.values()]
    ratio = [q for _, q in rs.values()]
    head = runs.get((case, "head"), {})
    both = [r for r in rs if r in head]
    more = sum(rs[r][0] > head[r][0] for r in both)
    print(f"{case} {name:10} n={len(rs)} GB/s median {statistics.median(gbps):.2f} ({min(gbps):.2f}-{max(gbps):.2f})"
          f" ratio median {statistics.median(ratio):.1f}% ({min(ratio):.1f}-{max(ratio):.1f})"
          + ("" if name == "head" else f", more than head in {more} of {len(both)} rounds"))
EOF
tar -czf "$OUT/builds_logs.tgz" -C "$W" . 2>/dev/null
