#!/usr/bin/env bash
# Checks for everything gfd's build needs and installs only what is missing, with apt-get
# (Debian/Ubuntu). Safe to run again: when everything is present it says so and does nothing.
# Detection looks at commands, headers and libraries directly and never needs apt, so it also
# works on machines where nothing can be installed.
#   tools/setup.sh
# The CUDA Toolkit (nvcc) is not installed by this script: install it from NVIDIA.
set -euo pipefail

say() { echo "setup: $*"; }
die() { echo "setup: ERROR: $*" >&2; exit 1; }

# ---------------------------------------------------------------------------------------------
# Detection helpers.

# Include directories to search besides the compiler's own: the usual ones and *_INCLUDE_PATH.
include_dirs() {
  local d
  echo /usr/include
  echo /usr/local/include
  for d in ${CPATH//:/ } ${C_INCLUDE_PATH//:/ } ${CPLUS_INCLUDE_PATH//:/ }; do echo "$d"; done
}
CPATH=${CPATH:-} C_INCLUDE_PATH=${C_INCLUDE_PATH:-} CPLUS_INCLUDE_PATH=${CPLUS_INCLUDE_PATH:-}

# Library directories: the usual ones, the multiarch one and LIBRARY_PATH.
LIBRARY_PATH=${LIBRARY_PATH:-}
lib_dirs() {
  local d arch
  arch=$(uname -m)
  echo "/usr/lib/${arch}-linux-gnu"
  echo /usr/lib64
  echo /usr/lib
  echo /usr/local/lib64
  echo /usr/local/lib
  for d in ${LIBRARY_PATH//:/ }; do echo "$d"; done
}

CXX_CMD=${CXX:-c++}

# has_header <relative path>: true when the header is found in an include directory or by the
# C++ compiler (when there is one).
has_header() {
  local h=$1 d
  while read -r d; do
    [ -n "$d" ] && [ -f "$d/$h" ] && return 0
  done < <(include_dirs)
  if command -v "$CXX_CMD" >/dev/null 2>&1; then
    echo "#include <$h>" | "$CXX_CMD" -x c++ -E - >/dev/null 2>&1 && return 0
  fi
  return 1
}

# has_lib <name>: true when lib<name>.so or lib<name>.a is in a library directory or is found
# by the C++ compiler.
has_lib() {
  local n=$1 d f p
  while read -r d; do
    [ -n "$d" ] || continue
    for f in "lib$n.so" "lib$n.a"; do [ -e "$d/$f" ] && return 0; done
  done < <(lib_dirs)
  if command -v "$CXX_CMD" >/dev/null 2>&1; then
    for f in "lib$n.so" "lib$n.a"; do
      p=$("$CXX_CMD" -print-file-name="$f" 2>/dev/null || true)
      [ "$p" != "$f" ] && [ -e "$p" ] && return 0
    done
  fi
  return 1
}

has_cmd() { command -v "$1" >/dev/null 2>&1; }

# version_ge A B: true when dotted version A >= B.
version_ge() { [ "$(printf '%s\n%s\n' "$2" "$1" | sort -V | head -n1)" = "$2" ]; }

# ---------------------------------------------------------------------------------------------
# What is missing (apt package names).

missing=()
need() {  # need <apt package> <what> <check command...>
  local pkg=$1 what=$2
  shift 2
  if "$@"; then
    say "found   $what"
  else
    say "missing $what (package $pkg)"
    missing+=("$pkg")
  fi
}

need cmake "cmake" has_cmd cmake
need g++ "C++ compiler ($CXX_CMD)" has_cmd "$CXX_CMD"
need make "make" has_cmd make
need libnuma-dev "libnuma (numa.h, libnuma)" eval 'has_header numa.h && has_lib numa'
need libboost-dev "Boost headers (boost/lockfree/queue.hpp)" has_header boost/lockfree/queue.hpp
need libgtest-dev "GoogleTest (gtest/gtest.h, libgtest)" eval 'has_header gtest/gtest.h && has_lib gtest'
need libbenchmark-dev "Google Benchmark (benchmark/benchmark.h, libbenchmark)" \
  eval 'has_header benchmark/benchmark.h && has_lib benchmark'

# The CUDA Toolkit is checked before anything is installed: apt cannot provide it, so there is no
# point installing the rest when it is absent.
cuda_hint=""
if has_cmd nvcc; then
  NVCC=$(command -v nvcc)
  say "found   CUDA Toolkit ($NVCC)"
elif [ -x /usr/local/cuda/bin/nvcc ]; then
  NVCC=/usr/local/cuda/bin/nvcc
  say "found   CUDA Toolkit ($NVCC), but nvcc is not on PATH"
  cuda_hint="add it to PATH before building by hand:  export PATH=/usr/local/cuda/bin:\$PATH
       (tools/quickstart.sh does this itself)"
else
  die "no CUDA Toolkit found: nvcc is not on PATH and /usr/local/cuda/bin/nvcc does not exist.
       Install the CUDA Toolkit 12.8 or newer from NVIDIA (https://developer.nvidia.com/cuda-downloads);
       it cannot be installed by this script. If it is installed elsewhere, put its bin/ on PATH."
fi

# ---------------------------------------------------------------------------------------------
# Install what is missing.

if [ ${#missing[@]} -gt 0 ]; then
  say "to install: ${missing[*]}"
  has_cmd apt-get || die "apt-get is not available: install these yourself: ${missing[*]}"
  SUDO=()
  if [ "$(id -u)" -ne 0 ]; then
    has_cmd sudo || die "not root and sudo is not available: as root, run
       apt-get update && apt-get install -y ${missing[*]}"
    SUDO=(sudo)
  fi
  say "running: ${SUDO[*]:+${SUDO[*]} }apt-get update"
  "${SUDO[@]}" apt-get update || die "apt-get update failed"
  say "running: ${SUDO[*]:+${SUDO[*]} }apt-get install -y --no-install-recommends ${missing[*]}"
  "${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
    "${missing[@]}" || die "apt-get install failed for: ${missing[*]}"
  # Check again: a package may have installed but still not provide what is needed.
  still=()
  has_cmd cmake || still+=(cmake)
  has_cmd "$CXX_CMD" || still+=("$CXX_CMD")
  has_cmd make || still+=(make)
  { has_header numa.h && has_lib numa; } || still+=(libnuma)
  has_header boost/lockfree/queue.hpp || still+=("Boost headers")
  { has_header gtest/gtest.h && has_lib gtest; } || still+=(GoogleTest)
  { has_header benchmark/benchmark.h && has_lib benchmark; } || still+=("Google Benchmark")
  [ ${#still[@]} -eq 0 ] || die "still missing after installing: ${still[*]}"
  say "installed: ${missing[*]}"
fi

# ---------------------------------------------------------------------------------------------
# Versions that apt may not be able to fix.

cmake_ver=$(cmake --version | sed -n 's/^cmake version \([0-9][0-9.]*\).*/\1/p')
version_ge "${cmake_ver:-0}" 3.25 ||
  die "CMake ${cmake_ver:-?} is too old: gfd needs CMake 3.25 or newer (e.g. pip install cmake,
       or Kitware's apt repository https://apt.kitware.com)"

# The compiler's own macros tell GCC from Clang (Debian's c++ --version does not say "g++").
cxx_macros=$(echo | "$CXX_CMD" -dM -E -x c++ - 2>/dev/null || true)
if grep -q '__GNUC__' <<<"$cxx_macros" && ! grep -q '__clang__' <<<"$cxx_macros"; then
  gxx_ver=$("$CXX_CMD" -dumpfullversion -dumpversion 2>/dev/null || echo 0)
  version_ge "$gxx_ver" 12 ||
    die "$CXX_CMD is g++ $gxx_ver: gfd needs g++ 12 or newer (e.g. apt-get install g++-12 and
       export CXX=g++-12 CUDAHOSTCXX=g++-12, then start from a fresh build directory)"
fi

nvcc_ver=$("$NVCC" --version | sed -n 's/.*release \([0-9][0-9.]*\).*/\1/p' | head -n1)
if version_ge "${nvcc_ver:-0}" 12.8; then
  say "CUDA Toolkit version ${nvcc_ver}"
else
  say "WARNING: CUDA Toolkit ${nvcc_ver:-?} is older than 12.8, the version gfd is built and tested with"
fi

if [ ${#missing[@]} -eq 0 ]; then
  say "everything gfd needs is present; nothing installed"
fi
if [ -n "$cuda_hint" ]; then
  say "NOTE: nvcc is at /usr/local/cuda/bin/nvcc but not on PATH: $cuda_hint"
fi
