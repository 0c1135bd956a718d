#!/usr/bin/env bash
# Builds gfd's Python package with plain CMake (no scikit-build-core needed) and runs its pytest
# suite (tests/python). Works from any directory, on a CI machine without a GPU (the emulated
# device covers the binding; the GPU suite skips with the reason) and on a GPU machine with
# torch (the whole suite runs against the GPU).
#   tools/python_test.sh [pytest args...]     build into $BUILD_DIR, run pytest
#   tools/python_test.sh --pip [pytest args]  instead: `pip install .` (scikit-build-core) into a
#                                             fresh virtual environment, run pytest against that
# Environment:
#   PYTHON      interpreter to build for and test with (default: python3)
#   BUILD_DIR   CMake build directory (default: build-py); an existing build (e.g. build/) is
#               reused with -DGFD_BUILD_PYTHON=ON added, a new one is configured without the C++
#               tests, benchmarks and examples
#   CUDA_ARCHS  passed as -DCMAKE_CUDA_ARCHITECTURES (e.g. 90)
#   JOBS        parallel build jobs (default: nproc)
# Missing pybind11, pytest or numpy are installed with pip where pip can reach PyPI; where it
# cannot (the GPU machine, which has them), the script says what is missing and stops.
# Exit status: pytest's, except that "no tests ran" (pytest's 5) is a failure.
set -euo pipefail

say() { echo "python_test: $*"; }
die() { echo "python_test: ERROR: $*" >&2; exit 1; }

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
PY=${PYTHON:-python3}
BUILD_DIR=${BUILD_DIR:-build-py}
JOBS=${JOBS:-$(nproc)}
MODE=cmake
if [ "${1:-}" = "--pip" ]; then MODE=pip; shift; fi
export PYTHONDONTWRITEBYTECODE=1

# The CUDA Toolkit's usual home; harmless when nvcc is already on PATH.
if [ -d /usr/local/cuda/bin ]; then
  case ":$PATH:" in *:/usr/local/cuda/bin:*) ;; *) export PATH="$PATH:/usr/local/cuda/bin" ;; esac
fi

command -v "$PY" > /dev/null || die "no '$PY' on PATH (set PYTHON=/path/to/python3)"
say "Python: $("$PY" -c 'import sys; print(sys.executable, sys.version.split()[0])')"

# have MODULE: the module imports.
have() { "$PY" -c "import $1" > /dev/null 2>&1; }
# need MODULE [PIP_NAME]: import it, or install it with pip, or stop with a clear message.
need() {
  local mod=$1 pkg=${2:-$1}
  have "$mod" && return 0
  say "$mod is missing: installing '$pkg' with pip"
  if "$PY" -m pip --version > /dev/null 2>&1 && "$PY" -m pip install --quiet "$pkg"; then
    have "$mod" && return 0
  fi
  die "$mod is missing for $PY and could not be installed with pip (no pip, or no access to PyPI);" \
      "install '$pkg' for this interpreter and run again"
}

need pytest
need numpy

if [ "$MODE" = pip ]; then
  venv=${VENV_DIR:-$ROOT/build-py-venv}
  say "pip install . into a fresh virtual environment ($venv)"
  rm -rf "$venv"
  "$PY" -m venv "$venv" || die "cannot create a virtual environment with $PY -m venv"
  args=()
  [ -n "${CUDA_ARCHS:-}" ] && export CMAKE_ARGS="${CMAKE_ARGS:-} -DCMAKE_CUDA_ARCHITECTURES=$CUDA_ARCHS"
  export CMAKE_BUILD_PARALLEL_LEVEL=$JOBS
  "$venv/bin/python" -m pip install --quiet "$ROOT" pytest || die "pip install . failed"
  PY="$venv/bin/python"
  TEST_ENV=()
else
  need pybind11
  have_headers=$("$PY" -c 'import sysconfig, os; print(int(os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h"))))')
  [ "$have_headers" = 1 ] || die "Python.h is missing for $PY: install its development headers (e.g. python3-dev)"
  pybind11_dir=$("$PY" -m pybind11 --cmakedir)
  cfg=(cmake -S "$ROOT" -B "$BUILD_DIR" -DGFD_BUILD_PYTHON=ON -DGFD_CUDART_STATIC=OFF
       "-DPython_EXECUTABLE=$(command -v "$PY")" "-Dpybind11_DIR=$pybind11_dir")
  if [ ! -f "$BUILD_DIR/CMakeCache.txt" ]; then
    cfg+=(-DCMAKE_BUILD_TYPE=Release -DGFD_BUILD_TESTS=OFF -DGFD_BUILD_BENCH=OFF -DGFD_BUILD_EXAMPLES=OFF)
  fi
  [ -n "${CUDA_ARCHS:-}" ] && cfg+=("-DCMAKE_CUDA_ARCHITECTURES=$CUDA_ARCHS")
  say "configuring: ${cfg[*]}"
  mkdir -p "$BUILD_DIR"
  log="$BUILD_DIR/python_configure.log"
  "${cfg[@]}" > "$log" 2>&1 || { cat "$log" >&2; die "CMake configure failed (log: $log)"; }
  say "building the extension (gfd_python) with $JOBS jobs"
  cmake --build "$BUILD_DIR" --target gfd_python -j"$JOBS"
  pkg=$(cd "$BUILD_DIR/python" && pwd)
  TEST_ENV=("PYTHONPATH=$pkg${PYTHONPATH:+:$PYTHONPATH}")
  say "package: $pkg/gfd"
fi

say "running pytest on tests/python"
rc=0
env ${TEST_ENV[@]+"${TEST_ENV[@]}"} "$PY" -m pytest -p no:cacheprovider -ra "$ROOT/tests/python" "$@" || rc=$?
if [ "$rc" -eq 5 ]; then
  echo "python_test: ERROR: pytest collected no tests" >&2
  exit 1
fi
if [ "$rc" -eq 0 ]; then say "all Python tests passed"; else say "pytest failed (exit status $rc)" >&2; fi
exit "$rc"
