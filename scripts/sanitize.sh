#!/usr/bin/env bash
# scripts/sanitize.sh: builds libopreg, opreg._C and the C++ test suite with AddressSanitizer and
# UndefinedBehaviorSanitizer (-DOPREG_SANITIZE=ON, in build/asan, apart from the normal build),
# then runs ctest and a subset of the Python tests against that build. Any sanitizer report fails
# the script. Run at the end of scripts/test.sh; needs what scripts/setup.sh installs.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

# The Python tests run under the sanitizers (those present; the whole suite would be too slow).
shopt -s nullglob
PYTHON_TESTS=(tests/python/test_reliability*.py tests/python/test_foundation.py
  tests/python/test_definition_path.py)

BUILD="$PWD/build/asan"
PREFIX="$BUILD/prefix"   # a staged copy of the Python package: its sources plus this build
REPORTS="$BUILD/reports" # sanitizer reports, one file per process that wrote one
CONFIG=(-G Ninja -DCMAKE_BUILD_TYPE=Debug "-DCMAKE_CXX_FLAGS_DEBUG=-O1 -g1" -DOPREG_SANITIZE=ON)

# Reports go to files as well as failing the process, so that one from a subprocess (a test that
# expects its probe to fail) or from a test binary run at build time is not lost.
rm -rf "$REPORTS"
mkdir -p "$REPORTS"
export ASAN_OPTIONS="detect_leaks=0:log_path=$REPORTS/asan"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1:log_path=$REPORTS/ubsan"

# 1. libopreg and opreg._C, staged with the Python sources. No AOT Triton kernels: they take long
#    to compile, hold no host code to sanitize, and only serve CUDA tensors.
cmake -S . -B "$BUILD/core" "${CONFIG[@]}" -DOPREG_BUILD_TRITON_KERNELS=OFF >/dev/null
cmake --build "$BUILD/core"
rm -rf "$PREFIX"
mkdir -p "$PREFIX"
cp -r python/opreg "$PREFIX/"
cmake --install "$BUILD/core" --prefix "$PREFIX" >/dev/null

# 2. The C++ suite and the test-op library, built against the staged package.
#    The test kernels' compiled variants come from the normal test build's cache when it exists.
cmake -S tests -B "$BUILD/tests" "${CONFIG[@]}" \
  -DCMAKE_PREFIX_PATH="$PREFIX/opreg/share/cmake/opreg" \
  -DOPREG_AOT_CACHE_DIR="$PWD/build/tests/opreg_aot_cache" >/dev/null
cmake --build "$BUILD/tests"

# 3. Run them. PyTorch is not sanitized, so Python gets the sanitizer runtimes preloaded; leak
#    checking is off (CPython's and PyTorch's allocations at exit would be reported).
echo "=== sanitize.sh: tests ($(date +%T))"
status=0
ctest --test-dir "$BUILD/tests" --output-on-failure --no-tests=error || status=1
export PYTHONPATH="$PREFIX${PYTHONPATH:+:$PYTHONPATH}"
export OPREG_TEST_OPS="$BUILD/tests/libopreg_test_ops.so"
preload="$(g++ -print-file-name=libasan.so) $(g++ -print-file-name=libubsan.so)"
LD_PRELOAD="$preload" python3 -c "import opreg; assert opreg.__file__.startswith('$PREFIX/')" ||
  { echo "sanitize.sh: opreg is not imported from $PREFIX" >&2; exit 1; }
LD_PRELOAD="$preload" python3 -m pytest -q -p no:cacheprovider -n 2 --dist loadfile \
  "${PYTHON_TESTS[@]}" || status=1

reports=("$REPORTS"/*)
if [ ${#reports[@]} -gt 0 ]; then
  echo "sanitize.sh: ${#reports[@]} sanitizer report(s):" >&2
  cat "${reports[@]}" >&2
  status=1
fi
exit "$status"
