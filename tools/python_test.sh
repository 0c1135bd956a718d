#!/usr/bin/env bash
# Builds gfd's Python package with plain CMake (no scikit-build-core needed) and runs its pytest
# suite (tests/python). Works from any directory: on a machine without a GPU (the emulated device
# covers the binding; the GPU tests skip with the reason) and on a GPU machine with torch (the
# whole suite runs against the GPU).
#   tools/python_test.sh [pytest args...]     build into $BUILD_DIR, run pytest
#   tools/python_test.sh --pip [pytest args]  instead: `pip install .` (scikit-build-core) into a
#                                             fresh virtual environment, run pytest against that
#   tools/python_test.sh --venv               only create the project's virtual environment when
#                                             missing and print its directory
# The interpreter is the project's own virtual environment, build/venv: created with the python3
# on PATH (never with the system's site-packages), with pytest, numpy, pybind11, hypothesis and
# matplotlib installed there by pip when missing; tools/vllm_test.sh adds vLLM to the same
# environment.
# Where pip cannot reach PyPI (a GPU machine without network), the script says so and uses the
# interpreter itself when it has those packages (as a GPU machine's python3 with torch may).
# Environment:
#   GFD_VENV    the virtual environment (default: $ROOT/build/venv)
#   GFD_PYTHON  "venv" (default) or "system": use PYTHON itself, no virtual environment
#   PYTHON      interpreter to create the environment with, or to use (default: python3)
#   BUILD_DIR   CMake build directory (default: build-py); an existing build (e.g. build/) is
#               reused with -DGFD_BUILD_PYTHON=ON added, a new one is configured without the C++
#               tests, benchmarks and examples
#   CUDA_ARCHS  passed as -DCMAKE_CUDA_ARCHITECTURES (e.g. 90)
#   JOBS        parallel build jobs (default: nproc)
# Exit status: pytest's, except that "no tests ran" (pytest's 5) is a failure.
set -euo pipefail

say() { echo "python_test: $*"; }
die() { echo "python_test: ERROR: $*" >&2; exit 1; }

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
BASE_PY=${PYTHON:-python3}
BUILD_DIR=${BUILD_DIR:-build-py}
JOBS=${JOBS:-$(nproc)}
MODE=cmake
if [ "${1:-}" = "--pip" ]; then MODE=pip; shift; fi
export PYTHONDONTWRITEBYTECODE=1 PIP_DISABLE_PIP_VERSION_CHECK=1

# The CUDA Toolkit's usual home; harmless when nvcc is already on PATH.
if [ -d /usr/local/cuda/bin ]; then
  case ":$PATH:" in *:/usr/local/cuda/bin:*) ;; *) export PATH="$PATH:/usr/local/cuda/bin" ;; esac
fi
command -v "$BASE_PY" > /dev/null || die "no '$BASE_PY' on PATH (set PYTHON=/path/to/python3)"

# have PY MODULE...: every module imports with PY.
have() {
  local py=$1 m
  shift
  for m in "$@"; do "$py" -c "import $m" > /dev/null 2>&1 || return 1; done
}

# project_venv: the project's virtual environment (GFD_VENV, default build/venv), created with
# BASE_PY when missing and never with the system's site-packages; prints its directory.
project_venv() {
  local venv=${GFD_VENV:-$ROOT/build/venv}
  if [ ! -x "$venv/bin/python" ]; then
    say "creating the project's virtual environment $venv with $BASE_PY" >&2
    mkdir -p "$(dirname "$venv")"
    "$BASE_PY" -m venv "$venv" >&2 ||
      die "cannot create a virtual environment with $BASE_PY -m venv (Debian: apt-get install python3-venv)"
  fi
  if grep -qiE '^include-system-site-packages *= *true' "$venv/pyvenv.cfg" 2> /dev/null; then
    die "$venv includes the system's site-packages; remove it and run again"
  fi
  echo "$venv"
}
# --venv: only that (tools/vllm_test.sh shares the environment).
if [ "${1:-}" = "--venv" ]; then project_venv; exit 0; fi

NEEDED=(pytest numpy pybind11 hypothesis matplotlib)  # matplotlib: bench/plot_results.py's test
if [ "$MODE" = pip ]; then
  venv=$ROOT/build/venv-pip
  say "pip install . into a fresh virtual environment ($venv)"
  rm -rf "$venv"
  "$BASE_PY" -m venv "$venv" || die "cannot create a virtual environment with $BASE_PY -m venv"
  [ -n "${CUDA_ARCHS:-}" ] && export CMAKE_ARGS="${CMAKE_ARGS:-} -DCMAKE_CUDA_ARCHITECTURES=$CUDA_ARCHS"
  export CMAKE_BUILD_PARALLEL_LEVEL=$JOBS
  "$venv/bin/python" -m pip install "$ROOT" pytest hypothesis || die "pip install . failed"
  PY="$venv/bin/python"
  TEST_ENV=()
else
  PY=$BASE_PY
  if [ "${GFD_PYTHON:-venv}" = system ]; then
    say "GFD_PYTHON=system: using $BASE_PY itself"
  else
    VENV=$(project_venv) || exit 1
    missing=()
    for m in "${NEEDED[@]}"; do have "$VENV/bin/python" "$m" || missing+=("$m"); done
    if [ ${#missing[@]} -gt 0 ]; then
      say "installing ${missing[*]} into $VENV with pip (about 45 MB of downloads for all five)"
      if "$VENV/bin/python" -m pip install --retries 1 --timeout 15 "${missing[@]}"; then
        PY="$VENV/bin/python"
      elif have "$BASE_PY" pytest numpy pybind11; then
        say "pip could not install them (no access to PyPI?): using $BASE_PY itself, which has them"
      else
        die "pip could not install ${missing[*]} into $VENV (no access to PyPI?), and $BASE_PY lacks" \
            "pytest, numpy or pybind11: install them for $BASE_PY and run with GFD_PYTHON=system"
      fi
    else
      PY="$VENV/bin/python"
    fi
  fi
  PY=$(command -v "$PY")
  have "$PY" pytest numpy pybind11 || die "$PY lacks pytest, numpy or pybind11"
  say "Python: $("$PY" -c 'import sys; print(sys.executable, sys.version.split()[0])')"
  have_headers=$("$PY" -c 'import sysconfig, os; print(int(os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h"))))')
  [ "$have_headers" = 1 ] || die "Python.h is missing for $PY: install its development headers (e.g. python3-dev)"
  pybind11_dir=$("$PY" -m pybind11 --cmakedir)
  cfg=(cmake -S "$ROOT" -B "$BUILD_DIR" -DGFD_BUILD_PYTHON=ON -DGFD_CUDART_STATIC=OFF
       "-DPython_EXECUTABLE=$PY" "-Dpybind11_DIR=$pybind11_dir")
  if [ ! -f "$BUILD_DIR/CMakeCache.txt" ]; then
    cfg+=(-DCMAKE_BUILD_TYPE=Release -DGFD_BUILD_TESTS=OFF -DGFD_BUILD_BENCH=OFF -DGFD_BUILD_EXAMPLES=OFF)
  fi
  [ -n "${CUDA_ARCHS:-}" ] && cfg+=("-DCMAKE_CUDA_ARCHITECTURES=$CUDA_ARCHS")
  mkdir -p "$BUILD_DIR"
  log="$BUILD_DIR/python_build.log"
  say "configuring and building the extension (gfd_python) in $BUILD_DIR with $JOBS jobs (log: $log);"
  say "  CMake's progress lines follow"
  # The full output goes to the log; the progress lines ("[ 40%] Building CXX object ...") show
  # that the minutes of compiling move on.
  set +e
  { "${cfg[@]}" && cmake --build "$BUILD_DIR" --target gfd_python -j"$JOBS"; } 2>&1 | tee "$log" |
    grep --line-buffered -E '^\[ *[0-9]+%\] (Building|Linking)' | sed -u 's/^/python_test:   /'
  brc=${PIPESTATUS[0]}
  set -e
  [ "$brc" -eq 0 ] || { tail -40 "$log" >&2; die "building the extension failed (log: $log)"; }
  pkg=$(cd "$BUILD_DIR/python" && pwd)
  TEST_ENV=("PYTHONPATH=$pkg${PYTHONPATH:+:$PYTHONPATH}")
  say "package: $pkg/gfd"
fi

say "running pytest on tests/python"
rc=0
env ${TEST_ENV[@]+"${TEST_ENV[@]}"} "$PY" -m pytest -p no:cacheprovider -q -ra "$ROOT/tests/python" "$@" || rc=$?
if [ "$rc" -eq 5 ]; then
  echo "python_test: ERROR: pytest collected no tests" >&2
  exit 1
fi
if [ "$rc" -eq 0 ]; then say "all Python tests passed"; else say "pytest failed (exit status $rc)" >&2; fi
exit "$rc"
