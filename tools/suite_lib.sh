# What tools/vllm_test.sh and tools/sglang_test.sh share (sourced; they define say and die):
#   built_package BUILD_DIR       sets pkg (the folder holding gfd/) and ext (its extension),
#                                 the pure-Python files copied again where BUILD_DIR is a CMake build
#   run_suite NAME PYTHON DIR REQUIRE_VARIABLE [pytest args...]
#                                 pytest on DIR with the package first on the path and
#                                 REQUIRE_VARIABLE=1; exits with pytest's status ("no tests ran"
#                                 is a failure)

built_package() {
  local build=$1
  if [ -f "$build/CMakeCache.txt" ] && grep -q '^GFD_BUILD_PYTHON:BOOL=ON' "$build/CMakeCache.txt"; then
    cmake --build "$build" --target gfd_python_files > /dev/null ||
      die "copying python/gfd into $build failed (cmake --build $build --target gfd_python_files)"
  fi
  pkg=$(cd "$build/python" 2> /dev/null && pwd) || pkg=
  ext=$(ls "$pkg"/gfd/_gfd*.so 2> /dev/null | head -1 || true)
  [ -n "$pkg" ] && [ -f "$pkg/gfd/__init__.py" ] && [ -n "$ext" ] ||
    die "no built gfd package in $build/python: build it first (BUILD_DIR=$build tools/python_test.sh)"
}

run_suite() {
  local name=$1 py=$2 dir=$3 require=$4 rc=0
  shift 4
  say "running pytest on ${dir#"$ROOT/"}"
  env "$require=1" PYTHONPATH="$pkg${PYTHONPATH:+:$PYTHONPATH}" \
    "$py" -m pytest -p no:cacheprovider -q -ra "$dir" "$@" || rc=$?
  if [ "$rc" -eq 5 ]; then
    die "pytest collected no tests"
  fi
  if [ "$rc" -eq 0 ]; then say "all $name tests passed"; else say "pytest failed (exit status $rc)" >&2; fi
  exit "$rc"
}
