#!/usr/bin/env bash
# scripts/lint.sh: the same format and lint checks for the whole tree: clang-format for C++,
# ruff for Python. Pass --fix to rewrite files instead of checking them.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# Tracked and new (not ignored) files alike: a file not yet added is checked too.
mapfile -t cxx < <(git ls-files --cached --others --exclude-standard '*.h' '*.cpp' '*.cu')
if [ "${1:-}" = "--fix" ]; then
  clang-format -i "${cxx[@]}"
  ruff format . && ruff check --fix .
else
  clang-format --dry-run -Werror "${cxx[@]}"
  ruff format --check . && ruff check .
fi
