#!/usr/bin/env bash
# Runs gfd.sglang's tests (tests/sglang) against the real SGLang package, on the CPU (gfd's
# emulated device behind the plugin), on a machine without a GPU. Works from any directory.
#   tools/sglang_test.sh [pytest args...]
# SGLang goes into its own virtual environment (build/sglang-venv) layered on the project's
# (build/venv, see tools/python_test.sh): SGLang's pins differ from vLLM's, while torch, numpy
# and pytest come from the project environment through a .pth file, so that torch is not
# downloaded twice. SGLang is installed without its dependencies (its GPU kernels, servers and
# model code are not what the plugin touches); the few modules its HiCache, plugin and
# cache-controller imports need besides are installed with it.
# Environment:
#   GFD_VENV        the project environment (default: $ROOT/build/venv); torch is installed
#                   there when missing (tools/vllm_test.sh has it already)
#   GFD_SGLANG_VENV SGLang's environment (default: $ROOT/build/sglang-venv)
#   SGLANG_VERSION  the SGLang release (default: 0.5.23, the one gfd.sglang is written against)
#   BUILD_DIR       the build holding gfd's Python package, <BUILD_DIR>/python/gfd (default: build)
#   PYTHON          interpreter to create the environments with (default: python3)
# The tests run with GFD_REQUIRE_SGLANG=1: an SGLang that does not import fails the suite.
# Exit status: pytest's, except that "no tests ran" (pytest's 5) is a failure.
set -euo pipefail

say() { echo "sglang_test: $*"; }
die() { echo "sglang_test: ERROR: $*" >&2; exit 1; }

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
. "$ROOT/tools/suite_lib.sh"
BASE_PY=${PYTHON:-python3}
VERSION=${SGLANG_VERSION:-0.5.23}
BUILD_DIR=${BUILD_DIR:-build}
SVENV=${GFD_SGLANG_VENV:-$ROOT/build/sglang-venv}
# What SGLang's HiCache, plugin and cache-controller modules import beyond torch and numpy.
EXTRA=(ipython gguf)
export PYTHONDONTWRITEBYTECODE=1 PIP_DISABLE_PIP_VERSION_CHECK=1

built_package "$BUILD_DIR"

VENV=$(PYTHON=$BASE_PY "$ROOT/tools/python_test.sh" --venv) || exit 1
VPY="$VENV/bin/python"
if ! "$VPY" -c 'import torch' > /dev/null 2>&1; then
  say "installing torch into $VENV (about 3 GB with its CUDA libraries; tools/vllm_test.sh installs it too)"
  "$VPY" -m pip install --no-cache-dir --progress-bar on torch pytest || die "pip install torch failed"
fi
# SGLang is installed without its dependencies: the ones the tested code needs come from this
# environment, where tools/vllm_test.sh has installed vLLM and its dependencies.
"$VPY" -c 'import importlib.util, sys; sys.exit(importlib.util.find_spec("vllm") is None)' ||
  die "$VENV has no vLLM, whose dependencies SGLang's modules import here: run tools/vllm_test.sh first (tools/quickstart.sh test runs both, in that order)"
base_site=$("$VPY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')

if [ ! -x "$SVENV/bin/python" ]; then
  say "creating $SVENV"
  "$BASE_PY" -m venv "$SVENV" || die "python -m venv $SVENV failed"
fi
SPY="$SVENV/bin/python"
site=$("$SPY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
echo "$base_site" > "$site/zz_gfd_project_venv.pth"  # after SGLang's own packages
suffix=$("$SPY" -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')
case "$ext" in
  *"$suffix") ;;
  *) die "the package was built for another Python ($(basename "$ext")); this one needs *$suffix" ;;
esac

have=$("$SPY" -c 'import sglang; print(sglang.__version__)' 2> /dev/null | tail -1 || true)
if [ "$have" != "$VERSION" ]; then
  say "installing ${EXTRA[*]}, then sglang==$VERSION without its dependencies, into $SVENV"
  # SGLang goes in without its dependencies, so pip's check after an install would list each of
  # them as missing (a long ERROR that changes nothing here): the check is left out
  # (--no-warn-conflicts), and the few modules the tested code imports come first.
  pip_quiet() {
    "$SPY" -m pip install --no-warn-conflicts "$@" 2>&1 | grep --line-buffered -v "^Requirement already satisfied"
    return "${PIPESTATUS[0]}"
  }
  pip_quiet "${EXTRA[@]}" || die "pip install ${EXTRA[*]} failed"
  pip_quiet --no-deps "sglang==$VERSION" || die "pip install sglang==$VERSION failed"
  have=$("$SPY" -c 'import sglang; print(sglang.__version__)' 2>&1 | tail -1) ||
    die "sglang does not import after the install: $have"
fi
say "sglang $have, package: $pkg/gfd"

run_suite SGLang "$SPY" "$ROOT/tests/sglang" GFD_REQUIRE_SGLANG "$@"
