#!/usr/bin/env bash
# Builds gfd's test suites with sanitizers in their own build directory and runs them:
#   tools/sanitize.sh address,undefined   AddressSanitizer (with LeakSanitizer) + UBSan
#   tools/sanitize.sh thread              ThreadSanitizer
# Host code only (nvcc code is not instrumented); the CUDA cases skip where there is no GPU.
# Suppressions, each with its reason, are in tools/sanitizers/*.supp.
set -euo pipefail
cd "$(dirname "$0")/.."
SAN=${1:?usage: tools/sanitize.sh address,undefined | thread}
case "$SAN" in
  address,undefined|thread) ;;
  *) echo "tools/sanitize.sh: '$SAN' is not address,undefined or thread" >&2; exit 2 ;;
esac
DIR=build-san-${SAN//,/-}
JOBS=$(nproc)
cmake -S . -B "$DIR" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DGFD_SANITIZE="$SAN" \
  -DGFD_BUILD_BENCH=OFF -DGFD_BUILD_EXAMPLES=OFF >/dev/null
echo "sanitize: building $DIR"
cmake --build "$DIR" -j"$JOBS" > "$DIR/build.log" 2>&1 || { tail -50 "$DIR/build.log"; exit 1; }
SUPP=$PWD/tools/sanitizers
# protect_shadow_gap=0: the CUDA driver reserves address space where ASan puts its shadow gap.
export ASAN_OPTIONS="detect_leaks=1:abort_on_error=1:detect_stack_use_after_return=1:protect_shadow_gap=0"
export LSAN_OPTIONS="suppressions=$SUPP/lsan.supp"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
export TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:suppressions=$SUPP/tsan.supp"
# Compact output: progress, CTest's summary, failed tests' output, skipped tests with reasons.
tools/quickstart.sh ctest "$DIR" -j"$JOBS" --timeout 600
echo "sanitize: $SAN: all tests passed"
