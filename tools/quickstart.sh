#!/usr/bin/env bash
# gfd's quick start: set up, build, then benchmark or test. Works from any directory.
#   tools/quickstart.sh bench [gfd_benchmark args...]   set up, build, run build/bench/gfd_benchmark
#   tools/quickstart.sh test                            set up, build, run the whole test suite
# Environment: CUDA_ARCHS, when set, is passed as -DCMAKE_CUDA_ARCHITECTURES (e.g. CUDA_ARCHS=90);
# otherwise the project's default applies.
set -euo pipefail

usage() {
  cat <<'EOF'
usage: tools/quickstart.sh bench [gfd_benchmark args...]
       tools/quickstart.sh test

  bench  checks/installs the build requirements (tools/setup.sh), configures and builds a
         Release build in build/, then runs build/bench/gfd_benchmark with the given
         arguments (none: its defaults; --help lists them)
  test   the same setup and build, then runs every test with ctest, lists the skipped tests
         with their reasons (tools/ctest_skips.sh), then builds the Python package and runs
         its pytest suite (tools/python_test.sh), then runs gfd.vllm's tests against the real
         vLLM package in a virtual environment of their own, build/vllm-venv, installing vLLM
         there when it is missing (tools/vllm_test.sh)

  CUDA_ARCHS=90 tools/quickstart.sh ...   builds for those CUDA architectures only
EOF
}

step() { echo; echo "==> $*"; }
run() { echo "+ $*"; "$@"; }

[ $# -ge 1 ] || { usage >&2; exit 2; }
cmd=$1
shift
case "$cmd" in
  bench) ;;
  test)
    [ $# -eq 0 ] || { echo "quickstart: 'test' takes no arguments" >&2; usage >&2; exit 2; } ;;
  -h|--help|help) usage; exit 0 ;;
  *) echo "quickstart: unknown command '$cmd'" >&2; usage >&2; exit 2 ;;
esac

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
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

step "building with $(nproc) jobs"
run cmake --build build -j"$(nproc)"

case "$cmd" in
  bench)
    step "running gfd_benchmark${*:+ $*}"
    run build/bench/gfd_benchmark "$@"
    ;;
  test)
    step "running the test suite"
    rc=0
    run ctest --test-dir build --output-on-failure --timeout 600 || rc=$?
    # CTest shows a skipped test only as "Skipped": list them with the reasons they gave.
    echo
    "$ROOT/tools/ctest_skips.sh" build || true
    # The Python package, built from the same build/ (-DGFD_BUILD_PYTHON=ON), and its suite.
    step "building the Python package and running its tests (tools/python_test.sh)"
    prc=0
    BUILD_DIR=build run "$ROOT/tools/python_test.sh" -q || prc=$?
    # gfd.vllm against the real vLLM package (CPU only), from the same package.
    step "running gfd.vllm's tests against vLLM (tools/vllm_test.sh)"
    vrc=0
    BUILD_DIR=build run "$ROOT/tools/vllm_test.sh" -q || vrc=$?
    echo
    if [ "$rc" -eq 0 ] && [ "$prc" -eq 0 ] && [ "$vrc" -eq 0 ]; then
      echo "quickstart: all tests passed"
    else
      [ "$rc" -eq 0 ] || echo "quickstart: ctest failed (exit status $rc)" >&2
      [ "$prc" -eq 0 ] || echo "quickstart: the Python suite failed (exit status $prc)" >&2
      [ "$vrc" -eq 0 ] || echo "quickstart: the vLLM suite failed (exit status $vrc)" >&2
      [ "$rc" -ne 0 ] || rc=$prc
      [ "$rc" -ne 0 ] || rc=$vrc
    fi
    exit "$rc"
    ;;
esac
