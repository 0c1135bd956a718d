#!/usr/bin/env bash
# Runs gfd.vllm's tests (tests/vllm) against the real vLLM package, on the CPU (gfd's emulated
# device behind the worker), in the project's virtual environment build/venv (the one
# tools/python_test.sh uses), installing vLLM there when it is missing. Works from any directory,
# on a machine without a GPU.
#   tools/vllm_test.sh [pytest args...]
# Environment:
#   GFD_VENV      the virtual environment (default: $ROOT/build/venv); created when missing,
#                 never with the system's site-packages
#   GFD_PYTHON    "venv" (default) or "system": use PYTHON itself, which must have vLLM
#   VLLM_VERSION  the vLLM release installed with pip when `import vllm` fails there or finds
#                 another release (default: 0.33.0)
#   BUILD_DIR     the build holding gfd's Python package, <BUILD_DIR>/python/gfd (default: build;
#                 BUILD_DIR=build tools/python_test.sh builds it)
#   PYTHON        interpreter to create the environment with (default: python3); it must be the
#                 Python version the package was built for
# The first install downloads vLLM and its dependencies (torch with its CUDA libraries): about
# 9 GB and 7 minutes on a 2-core machine with a fast link (1.5 minutes of downloads, then pip
# unpacks for 5); pip's progress is shown and kept in <venv>/pip-install.log. A reused
# environment only runs the tests (about 2 minutes). The tests run with
# GFD_REQUIRE_VLLM=1: a vLLM that does not import fails the suite instead of skipping it.
# Exit status: pytest's, except that "no tests ran" (pytest's 5) is a failure.
set -euo pipefail

say() { echo "vllm_test: $*"; }
die() { echo "vllm_test: ERROR: $*" >&2; exit 1; }

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
. "$ROOT/tools/suite_lib.sh"
BASE_PY=${PYTHON:-python3}
VENV=${GFD_VENV:-$ROOT/build/venv}
VERSION=${VLLM_VERSION:-0.33.0}
BUILD_DIR=${BUILD_DIR:-build}
export PYTHONDONTWRITEBYTECODE=1 PIP_DISABLE_PIP_VERSION_CHECK=1

# The package under test, as built (tools/python_test.sh builds it); its pure-Python files are
# copied again from python/gfd when it is a CMake build (target gfd_python_files: no compiling).
built_package "$BUILD_DIR"

if [ "${GFD_PYTHON:-venv}" = system ]; then
  VPY=$(command -v "$BASE_PY") || die "no '$BASE_PY' on PATH"
  say "GFD_PYTHON=system: using $VPY itself"
else
  VENV=$(GFD_VENV=$VENV PYTHON=$BASE_PY "$ROOT/tools/python_test.sh" --venv) || exit 1
  VPY="$VENV/bin/python"
fi
say "Python: $("$VPY" -c 'import sys; print(sys.executable, sys.version.split()[0])')"
suffix=$("$VPY" -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')
case "$ext" in
  *"$suffix") ;;
  *) die "the package was built for another Python ($(basename "$ext")); this one needs *$suffix" \
         "(build the package with this interpreter: tools/python_test.sh)" ;;
esac

have=$("$VPY" -c 'import vllm; print(vllm.__version__)' 2> /dev/null | tail -1 || true)
if [ "$have" != "$VERSION" ]; then
  [ "${GFD_PYTHON:-venv}" != system ] ||
    die "vllm ${have:-is not installed} for $VPY, $VERSION wanted: install it there, or use the venv"
  if [ -n "$have" ]; then say "vllm $have is installed in $VENV, $VERSION wanted"; fi
  log="$VENV/pip-install.log"
  say "installing vllm==$VERSION and its dependencies into $VENV with pip:"
  say "  about 150 packages, torch with its CUDA libraries the largest: about 9 GB of downloads"
  say "  and 7 minutes on a 2-core machine with a fast link (once; later runs reuse them)."
  say "  pip's progress follows (also kept in $log)"
  "$VPY" -m pip --version > /dev/null 2>&1 || die "no pip in $VENV"
  # pip prints nothing while it unpacks what it downloaded (minutes for torch and its CUDA
  # libraries): after 30 s without a word from pip, a line every 30 s says how much is in place.
  site=$("$VPY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  (last=-1
   while sleep 30; do
     now=$(wc -c < "$log" 2> /dev/null || echo 0)
     [ "$now" = "$last" ] && say "  pip is installing: $(du -sh "$site" 2> /dev/null | cut -f1) in $site so far"
     last=$now
   done) &
  ticker=$!
  set +e
  "$VPY" -m pip install --progress-bar on "vllm==$VERSION" pytest 2>&1 | tee "$log" |
    grep --line-buffered -v "^Requirement already satisfied"
  prc=${PIPESTATUS[0]}
  set -e
  kill "$ticker" 2> /dev/null || true
  wait "$ticker" 2> /dev/null || true
  if [ "$prc" -ne 0 ]; then
    tail -30 "$log" >&2
    die "pip install vllm==$VERSION failed (no access to PyPI, or no such release); log: $log"
  fi
  say "checking that vllm imports (the first import of vLLM and torch takes about a minute)"
  have=$("$VPY" -c 'import vllm; print(vllm.__version__)' 2>&1 | tail -1) ||
    die "vllm still does not import after the install: $have"
  [ "$have" = "$VERSION" ] || die "vllm $have imports after installing $VERSION"
fi
"$VPY" -c 'import pytest' > /dev/null 2>&1 || "$VPY" -m pip install pytest || die "no pytest for $VPY"
say "vllm $have, package: $pkg/gfd"

run_suite vLLM "$VPY" "$ROOT/tests/vllm" GFD_REQUIRE_VLLM "$@"
