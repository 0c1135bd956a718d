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
#   GFD_VLLM_MIN_FREE_GB  free disk space (GB) the install asks for before it starts (default: 10)
#   BUILD_DIR     the build holding gfd's Python package, <BUILD_DIR>/python/gfd (default: build;
#                 BUILD_DIR=build tools/python_test.sh builds it)
#   PYTHON        interpreter to create the environment with (default: python3); it must be the
#                 Python version the package was built for
# The first install downloads vLLM and the dependencies its tested modules import (torch with its
# CUDA libraries the largest, not vLLM's attention kernels or media decoders): 3.6 GB of downloads,
# about 7 GB in place (9.5 GB at the peak) and 3 minutes on a 2-core machine with a fast link;
# pip's progress is shown and kept in <venv>/pip-install.log. A reused environment only runs the
# tests (about 2 minutes). The tests run with GFD_REQUIRE_VLLM=1: a vLLM that does not import fails
# the suite instead of skipping it.
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
  : > "$log"
  say "installing vllm==$VERSION and the dependencies its offloading modules import into $VENV"
  say "  with pip: vLLM itself, then torch with its CUDA libraries (the largest), then the rest;"
  say "  about 3.6 GB of downloads, 7 GB in place, 3 minutes on a 2-core machine with a fast link"
  say "  (once; later runs reuse them). pip's progress follows (also kept in $log)"
  "$VPY" -m pip --version > /dev/null 2>&1 || die "no pip in $VENV"
  site=$("$VPY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  # The install needs about 9.5 GB free at its peak (downloads waiting to be unpacked beside what
  # is in place): a disk with less fails here at once, not after minutes of pip.
  mkdir -p "$site"
  need_gb=${GFD_VLLM_MIN_FREE_GB:-10}
  free_gb=$(df -Pk "$site" | awk 'NR == 2 { print int($4 / 1048576) }')
  [ "${free_gb:-0}" -ge "$need_gb" ] ||
    die "installing vLLM needs $need_gb GB free; $(df -Pk "$site" | awk 'NR == 2 { print $6 }')" \
        "has ${free_gb} GB free (set GFD_VENV to an environment on a larger disk)"
  # pip prints nothing while it unpacks what it downloaded (minutes for torch and its CUDA
  # libraries): after 30 s without a word from pip, a line every 30 s says how much is in place.
  (last=-1
   while sleep 30; do
     now=$(wc -c < "$log" 2> /dev/null || echo 0)
     [ "$now" = "$last" ] && say "  pip is installing: $(du -sh "$site" 2> /dev/null | cut -f1) in $site so far"
     last=$now
   done) &
  ticker=$!
  trap 'kill "$ticker" 2> /dev/null || true' EXIT
  # --no-cache-dir: a second copy of every download in pip's cache would need 3.5 GB more.
  # --no-warn-conflicts: vLLM's skipped dependencies would be listed as missing after each step.
  pip_step() {
    "$VPY" -m pip install --no-cache-dir --no-warn-conflicts --progress-bar on "$@" 2>&1 | tee -a "$log" |
      grep --line-buffered -v "^Requirement already satisfied"
    local prc=${PIPESTATUS[0]}
    [ "$prc" -eq 0 ] && return 0
    tail -30 "$log" >&2
    die "pip install $* failed (exit status $prc; no access to PyPI, no such release, or no disk" \
        "space: $(df -Ph "$site" | awk 'NR == 2 { print $4 }') free); log: $log"
  }
  pip_step --no-deps "vllm==$VERSION"
  # vLLM's declared dependencies, but for those no module of vLLM's offloading, configuration and
  # distributed code imports (nor SGLang's tested modules, which use this environment): attention
  # and GEMM kernel packages, media decoders, fast weight loaders and numba, 2.4 GB of the 9.5 GB
  # a full install takes. Markers are evaluated here, so pip gets plain requirements.
  SKIP=(flashinfer-python tilelang apache-tvm-ffi nvidia-cutlass-dsl quack-kernels tokenspeed-mla
        humming-kernels nvidia-cudnn-frontend instanttensor fastsafetensors pynvvideocodec
        torchaudio torchcodec opencv-python-headless numba)
  deps=$("$VPY" - "${SKIP[@]}" << 'EOF'
import importlib.metadata as md
import sys

from pip._vendor.packaging.requirements import Requirement
from pip._vendor.packaging.utils import canonicalize_name

skip = {canonicalize_name(name) for name in sys.argv[1:]}
for line in md.requires("vllm") or []:
    req = Requirement(line)
    if req.marker is not None and not req.marker.evaluate({"extra": ""}):
        continue
    if canonicalize_name(req.name) not in skip:
        req.marker = None
        print(req)
EOF
  ) || die "reading vllm==$VERSION's dependencies failed"
  torch=() rest=()
  while read -r d; do
    case "$d" in torch==* | torchvision==*) torch+=("$d") ;; *) rest+=("$d") ;; esac
  done <<< "$deps"
  # torch first, on its own: its downloads are unpacked and gone before the rest's arrive.
  [ ${#torch[@]} -eq 0 ] || pip_step "${torch[@]}"
  pip_step "${rest[@]}" pytest
  kill "$ticker" 2> /dev/null || true
  wait "$ticker" 2> /dev/null || true
  trap - EXIT
  say "checking that vllm imports (the first import of vLLM and torch takes about a minute)"
  have=$("$VPY" -c 'import vllm; print(vllm.__version__)' 2>&1 | tail -1) ||
    die "vllm still does not import after the install: $have"
  [ "$have" = "$VERSION" ] || die "vllm $have imports after installing $VERSION"
fi
"$VPY" -c 'import pytest' > /dev/null 2>&1 || "$VPY" -m pip install pytest || die "no pytest for $VPY"
say "vllm $have, package: $pkg/gfd"

run_suite vLLM "$VPY" "$ROOT/tests/vllm" GFD_REQUIRE_VLLM "$@"
