#!/usr/bin/env bash
# Builds gfd on a GPU machine and runs every test against the GPU: the C++ suites (ctest) and the
# Python suite (pytest). Needs nvcc, CMake, a C++ compiler, libnuma, Boost headers, GoogleTest,
# and a python3 with torch, pytest, numpy and pybind11; no network, no vLLM.
#   tools/gpu_check.sh            run at the repository root (or from anywhere)
#   tools/gpu_check.sh --long     also the long stress run (100000 requests from 8 threads, both
#                                 ways, through each ring) and compute-sanitizer memcheck and
#                                 racecheck on the CUDA cases of the cache-set, strided and
#                                 engine suites (about 5 minutes more)
# Environment:
#   CUDA_ARCHS   CUDA architectures to build for (default 90: H100, H200)
#   BUILD_DIR    the build directory (default build-gpu; bench/measure.sh uses the same)
#   OUT          where the logs go (default ./bench-out): gpu_check.txt (the summary),
#                gpu_check_build.log, gpu_check_ctest.log (its full log: gpu_check_ctest_full.log),
#                gpu_check_pytest.log, with --long gpu_check_long.log
#   CTEST_JOBS   tests run at once (default 6)
#   GFD_COMMIT   the commit named in the summary (default: git rev-parse HEAD; set it where the
#                tree is a copy without its own history)
# Takes about 4 minutes on the 16-core H100 machine of docs/performance.md (build 41 s, ctest
# 40 s, pytest 2.5 minutes).
# Prints one line per step and a summary last; exit status 0 only when everything passed.
set -uo pipefail
LONG=0
case "${1:-}" in
  "") ;;
  --long) LONG=1 ;;
  *) echo "usage: tools/gpu_check.sh [--long]" >&2; exit 2 ;;
esac
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
BUILD_DIR=${BUILD_DIR:-build-gpu}
OUT=${OUT:-$ROOT/bench-out}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
SUM=$OUT/gpu_check.txt
: > "$SUM"
say() { echo "$*" | tee -a "$SUM"; }
PY=$(command -v python3) || { echo "gpu_check: no python3 on PATH" >&2; exit 1; }
[ -d /usr/local/cuda/bin ] && case ":$PATH:" in *:/usr/local/cuda/bin:*) ;; *) PATH="$PATH:/usr/local/cuda/bin" ;; esac

{ nvidia-smi --query-gpu=name,driver_version,pcie.link.gen.current,pcie.link.width.current --format=csv,noheader 2> /dev/null || echo "no GPU found (nvidia-smi)"
  echo "$(nproc) CPUs, $(lscpu | sed -n 's/^Model name: *//p')"
  echo "gfd $(sed -n 's/^project(gfd VERSION \([0-9.]*\).*/\1/p' CMakeLists.txt) at commit ${GFD_COMMIT:-$(git rev-parse --short HEAD 2> /dev/null || echo unknown)}"
} 2>&1 | tee -a "$SUM"

rc_all=0
SECONDS=0
pybind11_dir=$("$PY" -m pybind11 --cmakedir 2> /dev/null || true)
cfg=(cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release "-DCMAKE_CUDA_ARCHITECTURES=${CUDA_ARCHS:-90}"
     -DGFD_BUILD_PYTHON=ON -DGFD_CUDART_STATIC=OFF "-DPython_EXECUTABLE=$PY")
[ -n "$pybind11_dir" ] && cfg+=("-Dpybind11_DIR=$pybind11_dir")
{ "${cfg[@]}" && cmake --build "$BUILD_DIR" -j"$(nproc)"; } > "$OUT/gpu_check_build.log" 2>&1
rc=$?
say "build: rc=$rc (${SECONDS}s) in $BUILD_DIR, CUDA architectures ${CUDA_ARCHS:-90}"
if [ $rc -ne 0 ]; then
  grep -E "error|Error" "$OUT/gpu_check_build.log" | head -20 | tee -a "$SUM"
  exit 1
fi

SECONDS=0
tools/quickstart.sh ctest "$BUILD_DIR" -j"${CTEST_JOBS:-6}" --timeout 300 > "$OUT/gpu_check_ctest.log" 2>&1
rc=$?
cp "$BUILD_DIR/ctest.log" "$OUT/gpu_check_ctest_full.log" 2> /dev/null
say "ctest: rc=$rc (${SECONDS}s) $(grep -E '^ctest: [0-9]+ passed' "$OUT/gpu_check_ctest.log" | tail -1 | cut -d' ' -f2-)"
[ $rc -eq 0 ] || { rc_all=1; awk '/The following tests FAILED:/ {f = 1} f' "$OUT/gpu_check_ctest.log" | head -30 | tee -a "$SUM"; }
sed -n '/test(s) skipped:/,$p' "$OUT/gpu_check_ctest.log" | tee -a "$SUM"

SECONDS=0
GFD_PYTHON=system PYTHON="$PY" BUILD_DIR="$BUILD_DIR" tools/python_test.sh > "$OUT/gpu_check_pytest.log" 2>&1
rc=$?
say "pytest: rc=$rc (${SECONDS}s) $(grep -E '[0-9]+ (passed|failed)' "$OUT/gpu_check_pytest.log" | tail -1)"
if [ $rc -ne 0 ]; then
  rc_all=1
  if grep -qE "^(FAILED|ERROR)" "$OUT/gpu_check_pytest.log"; then
    grep -E "^(FAILED|ERROR)" "$OUT/gpu_check_pytest.log" | head -30 | tee -a "$SUM"
  else
    tail -15 "$OUT/gpu_check_pytest.log" | tee -a "$SUM"
  fi
fi
grep -E "^SKIPPED" "$OUT/gpu_check_pytest.log" | tee -a "$SUM"

if [ $LONG = 1 ]; then
  T=$BUILD_DIR/tests
  CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
  SECONDS=0
  GFD_STRESS_REQUESTS=100000 timeout 400 "$T/gfd_stress_test" --gtest_filter='*Cuda*' > "$OUT/gpu_check_long.log" 2>&1
  rc=$?
  say "long stress: rc=$rc (${SECONDS}s)"
  [ $rc -eq 0 ] || rc_all=1
  grep -E "^stress" "$OUT/gpu_check_long.log" | tee -a "$SUM"
  for tool in memcheck racecheck; do
    for t in "$T/gfd_cache_set_test --gtest_filter=*Cuda*" "$T/gfd_strided_test --gtest_filter=*Cuda*" \
             "$T/gfd_engine_test --gtest_filter=*Scattered*/Cuda_gather:*LargerThan*/Cuda_gather"; do
      SECONDS=0
      # shellcheck disable=SC2086
      timeout 300 "$CS" --tool $tool --error-exitcode 3 $t >> "$OUT/gpu_check_long.log" 2>&1
      rc=$?
      [ $rc -eq 0 ] || rc_all=1
      say "compute-sanitizer $tool $(basename "${t%% *}"): rc=$rc (${SECONDS}s) $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/gpu_check_long.log" | tail -1)"
    done
  done
fi

echo
if [ $rc_all -eq 0 ]; then say "gpu_check: everything passed (logs in $OUT)"; else say "gpu_check: FAILED (logs in $OUT)"; fi
exit $rc_all
