#!/usr/bin/env bash
# gfd's quick start: set up, build, then benchmark or test. Works from any directory.
#   tools/quickstart.sh bench [gfd_benchmark args...]   set up, build gfd_benchmark, run it
#   tools/quickstart.sh test                            set up, build, run every test suite
#   tools/quickstart.sh skips [BUILD_DIR] [--all]       list the tests the last ctest run skipped
# Environment: CUDA_ARCHS, when set, is passed as -DCMAKE_CUDA_ARCHITECTURES (e.g. CUDA_ARCHS=90);
# otherwise the project's default applies.
set -euo pipefail

usage() {
  cat <<'EOF'
usage: tools/quickstart.sh bench [gfd_benchmark args...]
       tools/quickstart.sh test
       tools/quickstart.sh skips [BUILD_DIR] [--all]

  bench  checks/installs the build requirements (tools/setup.sh), configures a Release build
         in build/ and builds the benchmark alone (target gfd_benchmark), then runs
         build/bench/gfd_benchmark with the given arguments (none: its defaults; --help
         lists them)
  test   the same setup, builds everything (library, tests, benchmarks, examples), then:
           1. every C++ test with ctest (full log: build/ctest.log): how many passed, failed
              and were skipped, the skipped ones listed once, grouped by the reason each gave
           2. the Python package, built for the project's virtual environment build/venv, and
              its pytest suite (tools/python_test.sh)
           3. gfd.vllm's tests against the real vLLM package, installed into the same
              environment when missing (tools/vllm_test.sh; the first time about 7 GB and
              3 minutes on 2 cores with a fast link, with pip's progress shown)
           4. gfd.sglang's tests against the real SGLang package, installed into an environment
              of its own on top of that one (tools/sglang_test.sh; the first time about 300 MB)
         On a 2-core machine without a GPU: bench about 2 minutes, test about 15 the first time.
  skips  lists the tests that the last ctest run in BUILD_DIR (default: build) skipped, grouped
         by reason (6 names per reason; --all names every one)

  CUDA_ARCHS=90 tools/quickstart.sh ...   builds for those CUDA architectures only
EOF
}

step() { echo; echo "==> $*"; }
run() { echo "+ $*"; "$@"; }

# list_skips BUILD_DIR SHOW: the skipped tests of the last ctest run in BUILD_DIR, grouped by the
# reason each gave (GoogleTest's GTEST_SKIP() message, or a script test's "SKIPPED: ..." line),
# read from CTest's own log, which keeps each test's output.
list_skips() {
  local dir=$1 show=$2 log=$1/Testing/Temporary/LastTest.log
  [ -f "$log" ] || { echo "quickstart: no $log (run ctest first)" >&2; return 2; }
  awk -v show="$show" -v dir="$dir" '
    /^[0-9]+\/[0-9]+ Test: / {
      name = $0
      sub(/^[0-9]+\/[0-9]+ Test: /, "", name)
      sub(/  # GetParam\(\).*$/, "", name)
      reason = ""; grab = 0; next
    }
    /: Skipped$/ { grab = 1; reason = ""; next }
    grab && /^\[  SKIPPED \]/ { grab = 0; next }
    grab { reason = reason (reason == "" ? "" : " ") $0; next }
    /^SKIPPED: / { reason = substr($0, 10); next }
    /^Skip regular expression found in output/ {
      if (reason == "") reason = "(no reason given)"
      if (count[reason] < show) names[reason] = names[reason] "\n    " name
      count[reason]++
      total++
    }
    END {
      if (total == 0) { print "no test was skipped"; exit }
      printf "%d test(s) skipped:\n", total
      more = 0
      for (r in count) {
        printf "  %d skipped: %s%s\n", count[r], r, names[r]
        if (count[r] > show) { printf "    ... and %d more\n", count[r] - show; more = 1 }
      }
      if (more) printf "  (tools/quickstart.sh skips %s --all names them all)\n", dir
    }
  ' "$log"
}

# count_tests LOG: how many tests of a ctest log passed, failed and were skipped. CTest's own
# summary ("100% tests passed ... out of N") counts a skipped test as passed.
count_tests() {
  # CTest 3.x: "100% tests passed, 0 tests failed out of N"; 4.x leaves out ", 0 tests failed".
  awk '/tests passed.* out of [0-9]+/ {
         failed = 0
         for (i = 1; i <= NF; i++) if ($i == "failed") failed = $(i - 2)
         total = $NF
       }
       /\*\*\*Skipped/ { skipped++ }
       END {
         if (total == "") { print "ctest: no summary in the log"; exit }
         printf "ctest: %d passed, %d failed, %d skipped\n", total - failed - skipped, failed, skipped
       }' "$1"
}

# run_ctest BUILD_DIR [ctest args...]: runs ctest with its output in BUILD_DIR/ctest.log, showing
# progress every 50 tests, then CTest's summary, the failed tests' output and the skipped tests
# (each once, with its reason).
run_ctest() {
  local dir=$1 rc=0
  shift
  local log=$dir/ctest.log
  echo "+ ctest --test-dir $dir --output-on-failure $* > $log"
  set +e
  ctest --test-dir "$dir" --output-on-failure "$@" 2>&1 | tee "$log" |
    awk 'match($0, /^ *[0-9]+\/[0-9]+ Test +#/) {
           split(substr($0, RSTART, RLENGTH), a, "/"); n++
           if (n % 50 == 0) { sub(/ .*/, "", a[2]); printf "ctest: %d of %s tests run\n", n, a[2]; fflush() }
         }'
  rc=${PIPESTATUS[0]}
  set -e
  grep -E "Total Test time" "$log" || true
  count_tests "$log"
  if [ "$rc" -ne 0 ]; then
    echo "ctest: failed (exit status $rc); the failed tests' output (full log: $log):"
    awk '/The following tests FAILED:/ {f = 1} f' "$log"
    grep -E -B2 -A25 "^\[  FAILED  \]|\*\*\*Failed|\*\*\*Timeout|\*\*\*Exception" "$log" | head -200
  fi
  echo
  list_skips "$dir" 6 || true
  return "$rc"
}

[ $# -ge 1 ] || { usage >&2; exit 2; }
cmd=$1
shift
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
case "$cmd" in
  bench) ;;
  test)
    [ $# -eq 0 ] || { echo "quickstart: 'test' takes no arguments" >&2; usage >&2; exit 2; } ;;
  skips)
    dir=$ROOT/build show=6
    for a in "$@"; do
      case "$a" in --all) show=1000000 ;; *) dir=$a ;; esac
    done
    list_skips "$dir" "$show"
    exit $? ;;
  ctest)  # tools/quickstart.sh ctest BUILD_DIR [ctest args...]: the compact ctest run of 'test'
    [ $# -ge 1 ] || { usage >&2; exit 2; }
    run_ctest "$@"
    exit $? ;;
  -h|--help|help) usage; exit 0 ;;
  *) echo "quickstart: unknown command '$cmd'" >&2; usage >&2; exit 2 ;;
esac

cd "$ROOT"
echo "quickstart: in $ROOT"

# The CUDA Toolkit's usual home; harmless when nvcc is already on PATH.
if [ -d /usr/local/cuda/bin ]; then
  case ":$PATH:" in
    *:/usr/local/cuda/bin:*) ;;
    *) export PATH="$PATH:/usr/local/cuda/bin"; echo "quickstart: added /usr/local/cuda/bin to PATH" ;;
  esac
fi

step "checking the build requirements (tools/setup.sh)"
run "$ROOT/tools/setup.sh"

step "configuring a Release build in build/"
cfg=(cmake -S . -B build -DCMAKE_BUILD_TYPE=Release)
if [ -n "${CUDA_ARCHS:-}" ]; then
  cfg+=("-DCMAKE_CUDA_ARCHITECTURES=$CUDA_ARCHS")
fi
run "${cfg[@]}"

# The benchmark needs its own target only; the tests need everything.
if [ "$cmd" = bench ]; then
  step "building gfd_benchmark with $(nproc) jobs"
  run cmake --build build -j"$(nproc)" --target gfd_benchmark
else
  step "building the library, tests, benchmarks and examples with $(nproc) jobs"
  run cmake --build build -j"$(nproc)"
fi

case "$cmd" in
  bench)
    step "running gfd_benchmark${*:+ $*}"
    run build/bench/gfd_benchmark "$@"
    ;;
  test)
    step "running the C++ tests (ctest)"
    rc=0
    run_ctest build --timeout 600 || rc=$?
    step "building the Python package and running its tests (tools/python_test.sh)"
    prc=0
    BUILD_DIR=build run "$ROOT/tools/python_test.sh" || prc=$?
    step "running gfd.vllm's tests against vLLM (tools/vllm_test.sh)"
    vrc=0
    BUILD_DIR=build run "$ROOT/tools/vllm_test.sh" || vrc=$?
    step "running gfd.sglang's tests against SGLang (tools/sglang_test.sh)"
    src=0
    BUILD_DIR=build run "$ROOT/tools/sglang_test.sh" || src=$?
    echo
    if [ "$rc" -eq 0 ] && [ "$prc" -eq 0 ] && [ "$vrc" -eq 0 ] && [ "$src" -eq 0 ]; then
      echo "quickstart: all tests passed"
    else
      [ "$rc" -eq 0 ] || echo "quickstart: ctest failed (exit status $rc)" >&2
      [ "$prc" -eq 0 ] || echo "quickstart: the Python suite failed (exit status $prc)" >&2
      [ "$vrc" -eq 0 ] || echo "quickstart: the vLLM suite failed (exit status $vrc)" >&2
      [ "$src" -eq 0 ] || echo "quickstart: the SGLang suite failed (exit status $src)" >&2
      [ "$rc" -ne 0 ] || rc=$prc
      [ "$rc" -ne 0 ] || rc=$vrc
      [ "$rc" -ne 0 ] || rc=$src
    fi
    exit "$rc"
    ;;
esac
