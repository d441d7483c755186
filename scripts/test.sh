#!/usr/bin/env bash
# scripts/test.sh: installs opreg and runs every test: format and lint checks, the C++ suite
# (GoogleTest through ctest, built as a separate project that find_package()s opreg) and the
# Python suite (pytest); then the sanitizer run (scripts/sanitize.sh). A run that collects no test
# fails.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/setup.sh
bash scripts/lint.sh

cmake -S tests -B build/tests -G Ninja -DCMAKE_PREFIX_PATH="$(cd /tmp && python3 -m opreg cmake-dir)"
cmake --build build/tests
ctest --test-dir build/tests --output-on-failure --no-tests=error

OPREG_TEST_OPS="$PWD/build/tests/libopreg_test_ops.so" python3 -m pytest tests/python

bash scripts/sanitize.sh
