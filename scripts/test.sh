#!/usr/bin/env bash
# scripts/test.sh: installs opreg and runs every test: format and lint checks, the C++ suite
# (GoogleTest through ctest, built as a separate project that find_package()s opreg) and the
# Python suite (pytest), whose Python-front files run again with the JIT launch cache off; then the
# sanitizer run (scripts/sanitize.sh). A run that collects no test fails.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
step() { echo "=== test.sh: $* ($(date +%T))"; }  # when each step starts: where CI's time goes
step setup
bash scripts/setup.sh
step lint
bash scripts/lint.sh

step C++ tests
cmake -S tests -B build/tests -G Ninja -DCMAKE_PREFIX_PATH="$(cd /tmp && python3 -m opreg cmake-dir)"
cmake --build build/tests
ctest --test-dir build/tests --output-on-failure --no-tests=error

step Python tests
# Two processes, a file each at a time (pytest-xdist): CI's machine has two cores.
OPREG_TEST_OPS="$PWD/build/tests/libopreg_test_ops.so" python3 -m pytest -n 2 --dist loadfile \
  tests/python
step Python front without the JIT launch cache
# Once more with the JIT launch cache off: ops defined from Python must work through Triton's own
# launcher (as under a Triton version the cache was not tested on).
OPREG_JIT_LAUNCH_CACHE=0 OPREG_TEST_OPS="$PWD/build/tests/libopreg_test_ops.so" \
  python3 -m pytest tests/python/test_front.py tests/python/test_jit_cache.py tests/python/test_vmap.py

step sanitizers
bash scripts/sanitize.sh
step done
