#!/usr/bin/env bash
# The tree's format and lint gates, as CI runs them (.ci/run):
#   - C++ and CUDA sources: clang-format with the tree's .clang-format, no difference allowed;
#   - Python: ruff (lint and format) with pyproject.toml's [tool.ruff] settings.
#   tools/lint.sh          check; exit 1 listing what differs
#   tools/lint.sh --fix    rewrite the files instead
# clang-format comes from the system (tools/setup.sh installs it where missing); ruff is
# installed once into build/lint-venv at the version pinned below, so every machine checks
# with the same one.
set -euo pipefail
cd "$(dirname "$0")/.."

RUFF_VERSION=0.17.5
FIX=0
case "${1:-}" in
  "") ;;
  --fix) FIX=1 ;;
  *) echo "usage: tools/lint.sh [--fix]" >&2; exit 2 ;;
esac

command -v clang-format > /dev/null ||
  { echo "lint: clang-format not found (tools/setup.sh installs it)" >&2; exit 1; }
VENV=build/lint-venv
if ! "$VENV/bin/ruff" --version 2> /dev/null | grep -q "$RUFF_VERSION"; then
  echo "lint: installing ruff $RUFF_VERSION into $VENV (once, a few seconds)"
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install --quiet --disable-pip-version-check "ruff==$RUFF_VERSION"
fi
RUFF=$VENV/bin/ruff

mapfile -t cxx < <(git ls-files --cached --others --exclude-standard -- '*.cpp' '*.hpp' '*.cu' '*.cuh')
rc=0
if [ $FIX = 1 ]; then
  clang-format -i "${cxx[@]}"
  "$RUFF" check --fix --quiet . || rc=1
  "$RUFF" format --quiet .
  echo "lint: rewritten ($(clang-format --version | head -1), ruff $RUFF_VERSION)"
  exit $rc
fi

bad=$(for f in "${cxx[@]}"; do clang-format --dry-run --Werror "$f" > /dev/null 2>&1 || echo "$f"; done)
if [ -n "$bad" ]; then
  echo "lint: these C++/CUDA files differ from .clang-format (tools/lint.sh --fix rewrites them):"
  echo "$bad" | sed 's/^/  /'
  rc=1
fi
"$RUFF" check --quiet . || rc=1
if ! "$RUFF" format --check --quiet .; then
  echo "lint: the Python files above differ from ruff's format (tools/lint.sh --fix rewrites them)"
  rc=1
fi
[ $rc -eq 0 ] && echo "lint: C++ ($(clang-format --version | sed 's/.*version //;s/ .*//')) and Python (ruff $RUFF_VERSION) as the tree asks"
exit $rc
