#!/usr/bin/env bash
# Runs gfd.vllm's tests (tests/vllm) against the real vLLM package, on the CPU (gfd's emulated
# device behind the worker), in a virtual environment of their own that has vLLM. Works from any
# directory, on a CI machine without a GPU.
#   tools/vllm_test.sh [pytest args...]
# Environment:
#   VLLM_VENV     the virtual environment (default: $ROOT/build/vllm-venv); created when missing,
#                 never with the system's site-packages
#   VLLM_VERSION  the vLLM release installed there with pip when `import vllm` fails there or
#                 finds another release (default: 0.33.0); pytest is installed when missing
#   BUILD_DIR     the build holding gfd's Python package, <BUILD_DIR>/python/gfd (default: build;
#                 BUILD_DIR=build tools/python_test.sh builds it)
#   PYTHON        interpreter to create the environment with (default: python3); it must be the
#                 Python version the package was built for
# A first install downloads vLLM and its dependencies (torch with CUDA libraries): about 6 minutes
# and 9.4 GB on the CI-like machine; a reused environment only runs the tests. The tests run
# with GFD_REQUIRE_VLLM=1: a vLLM that does not import fails the suite instead of skipping it.
# Exit status: pytest's, except that "no tests ran" (pytest's 5) is a failure.
set -euo pipefail

say() { echo "vllm_test: $*"; }
die() { echo "vllm_test: ERROR: $*" >&2; exit 1; }

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
PY=${PYTHON:-python3}
VENV=${VLLM_VENV:-$ROOT/build/vllm-venv}
VERSION=${VLLM_VERSION:-0.33.0}
BUILD_DIR=${BUILD_DIR:-build}
export PYTHONDONTWRITEBYTECODE=1

# The package under test, as built (tools/python_test.sh builds it); its pure-Python files are
# copied again from python/gfd when it is a CMake build (target gfd_python_files: no compiling).
if [ -f "$BUILD_DIR/CMakeCache.txt" ] && grep -q '^GFD_BUILD_PYTHON:BOOL=ON' "$BUILD_DIR/CMakeCache.txt"; then
  cmake --build "$BUILD_DIR" --target gfd_python_files > /dev/null ||
    die "copying python/gfd into $BUILD_DIR failed (cmake --build $BUILD_DIR --target gfd_python_files)"
fi
pkg=$(cd "$BUILD_DIR/python" 2> /dev/null && pwd) || pkg=
ext=$(ls "$pkg"/gfd/_gfd*.so 2> /dev/null | head -1 || true)
[ -n "$pkg" ] && [ -f "$pkg/gfd/__init__.py" ] && [ -n "$ext" ] ||
  die "no built gfd package in $BUILD_DIR/python: build it first (BUILD_DIR=$BUILD_DIR tools/python_test.sh)"

# The environment: created without the system's site-packages, so that only what is installed
# in it (vLLM's pinned dependencies) is seen.
if [ ! -x "$VENV/bin/python" ]; then
  command -v "$PY" > /dev/null || die "no '$PY' on PATH (set PYTHON=/path/to/python3)"
  say "creating a virtual environment in $VENV with $PY"
  mkdir -p "$(dirname "$VENV")"
  "$PY" -m venv "$VENV" ||
    die "cannot create a virtual environment with $PY -m venv (Debian: apt-get install python3-venv)"
fi
if grep -qiE '^include-system-site-packages *= *true' "$VENV/pyvenv.cfg" 2> /dev/null; then
  die "$VENV includes the system's site-packages; use an environment without them (or remove it)"
fi
VPY="$VENV/bin/python"
say "Python: $("$VPY" -c 'import sys; print(sys.executable, sys.version.split()[0])')"
suffix=$("$VPY" -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')
case "$ext" in
  *"$suffix") ;;
  *) die "the package was built for another Python ($(basename "$ext")); this environment needs *$suffix" \
         "(create it with the interpreter the package was built for: PYTHON=...)" ;;
esac

# pip_install WHAT...: installs with pip into the environment, its log kept beside it.
pip_install() {
  local log="$VENV/pip-install.log"
  say "installing $* with pip (log: $log)"
  "$VPY" -m pip --version > /dev/null 2>&1 || die "no pip in $VENV"
  if ! "$VPY" -m pip install --progress-bar off "$@" >> "$log" 2>&1; then
    tail -30 "$log" >&2
    die "pip install $* failed (no access to PyPI, or no such release); log: $log"
  fi
}

have=$("$VPY" -c 'import vllm; print(vllm.__version__)' 2> /dev/null | tail -1 || true)
if [ "$have" != "$VERSION" ]; then
  if [ -n "$have" ]; then say "vllm $have is installed, $VERSION wanted"; else say "vllm does not import in $VENV"; fi
  pip_install "vllm==$VERSION"
  have=$("$VPY" -c 'import vllm; print(vllm.__version__)' 2>&1 | tail -1) ||
    die "vllm still does not import after the install: $have"
  [ "$have" = "$VERSION" ] || die "vllm $have imports after installing $VERSION"
fi
"$VPY" -c 'import pytest' > /dev/null 2>&1 || pip_install pytest
say "vllm $have, package: $pkg/gfd"

say "running pytest on tests/vllm"
rc=0
GFD_REQUIRE_VLLM=1 PYTHONPATH="$pkg${PYTHONPATH:+:$PYTHONPATH}" \
  "$VPY" -m pytest -p no:cacheprovider -ra "$ROOT/tests/vllm" "$@" || rc=$?
if [ "$rc" -eq 5 ]; then
  echo "vllm_test: ERROR: pytest collected no tests" >&2
  exit 1
fi
if [ "$rc" -eq 0 ]; then say "all vLLM tests passed"; else say "pytest failed (exit status $rc)" >&2; fi
exit "$rc"
