#!/usr/bin/env bash
# bench/gpu_session.sh: everything one lease of the GPU machine runs, in one call: build and
# install opreg against the machine's PyTorch, the C++ and Python test suites, then the
# benchmarks. Logs and results are written to a work folder and packed into
# $OUT/session.tar.gz after every step (the device tool brings back only a few files, and none
# written after a time limit cuts the call). Build inputs the machine lacks (nlohmann-json
# headers, GoogleTest source) travel in .carry/ (ignored by git).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
WORK=$(mktemp -d)
export PYTHONUNBUFFERED=1 OPREG_BENCH_OUT="$WORK/results"
mkdir -p "$WORK/results" "$WORK/logs"
pack() { tar -czf "$OUT/session.tar.gz.part" -C "$WORK" . && mv "$OUT/session.tar.gz.part" "$OUT/session.tar.gz"; }
step() { pack; echo "=== $* ($(date +%T))"; }

step build
rm -rf build  # earlier leases' CMake caches may hold another compiler
# The machine's default g++ (/opt/gcc, GCC 13) emits code for a newer libstdc++ than the system
# one that Python and PyTorch load (seen: a crash formatting an int in a schema). Build with the
# system compiler, which matches the loaded libstdc++.
for candidate in /usr/bin/g++ /usr/bin/g++-12 /usr/bin/g++-11; do
  [ -x "$candidate" ] && export CXX="$candidate" CC="${candidate/g++/gcc}" && break
done
echo "CXX=${CXX:-default}: $(${CXX:-g++} --version | head -1)"
export CUDAHOSTCXX="${CXX:-}"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$WORK/gpu.txt"
python3 -m pip install -q --no-build-isolation --no-deps \
  --config-settings=cmake.define.OPREG_NLOHMANN_JSON_INCLUDE_DIR="$PWD/.carry/include" . \
  > "$WORK/logs/build.log" 2>&1 || { tail -50 "$WORK/logs/build.log"; pack; exit 1; }
SITE=$(python3 -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
echo "libopreg needs: $(ldd "$SITE/opreg/lib/libopreg.so" | grep -E "stdc\+\+|not found" | tr -s " ")"
CMAKE_PREFIX="$(cd /tmp && python3 -m opreg cmake-dir)"

step benchmarks
(cmake -S bench/cpp -B build/bench -G Ninja -DCMAKE_PREFIX_PATH="$CMAKE_PREFIX" &&
  cmake --build build/bench) > "$WORK/logs/bench-build.log" 2>&1 || tail -20 "$WORK/logs/bench-build.log"
ALL_BENCHES='launch_cpp.py:build/bench/launch_bench eager_overhead.py bandwidth.py philox.py vmap.py
  first_call.py jit_cache.py'
for bench in ${BENCHES:-$ALL_BENCHES}; do
  bench="${bench/:/ }"
  log="$WORK/logs/bench-$(echo "${bench%%.py*}" | tr / -).log"
  timeout 240 python3 bench/$bench > "$log" 2>&1 || { echo "bench $bench failed"; tail -15 "$log"; }
  pack
done
if [ -z "${SKIP_CPP_TESTS:-}" ]; then
step cpp tests
cmake -S tests -B build/gpu-tests -G Ninja -DCMAKE_PREFIX_PATH="$CMAKE_PREFIX" \
  -DOPREG_GTEST_SOURCE_DIR="$PWD/.carry/googletest" > "$WORK/logs/cpp-tests.log" 2>&1 &&
  cmake --build build/gpu-tests >> "$WORK/logs/cpp-tests.log" 2>&1 &&
  ctest --test-dir build/gpu-tests --output-on-failure >> "$WORK/logs/cpp-tests.log" 2>&1
tail -4 "$WORK/logs/cpp-tests.log"
else  # only the op libraries the Python tests load
  cmake -S tests -B build/gpu-tests -G Ninja -DCMAKE_PREFIX_PATH="$CMAKE_PREFIX" \
    -DOPREG_GTEST_SOURCE_DIR="$PWD/.carry/googletest" > "$WORK/logs/cpp-tests.log" 2>&1 &&
    cmake --build build/gpu-tests --target opreg_python_test_libraries >> "$WORK/logs/cpp-tests.log" 2>&1
fi

step python tests
export OPREG_TEST_OPS="$PWD/build/gpu-tests/libopreg_test_ops.so"
if [ -n "${PYTEST_WORKERS:-}" ]; then  # one pytest over all files, spread by file (pytest-xdist)
  log="$WORK/logs/pytest-all.log"
  # -v names each test as it ends, and SIGINT at the limit still prints the summary: a run cut
  # short says which tests failed (seen: a cut -q run printed only dots and Fs).
  timeout -s INT -k 20 "${PYTEST_TIMEOUT:-420}" python3 -m pytest -v -rfE -p no:cacheprovider \
    -n "$PYTEST_WORKERS" --dist loadfile ${GPU_TESTS:-tests/python} > "$log" 2>&1
  echo "pytest: rc=$? $(tail -1 "$log")"
  grep -E "(FAILED|ERROR) |Fatal Python error" "$log" | head -40
  GPU_TESTS=none
fi
for file in ${GPU_TESTS:-tests/python/test_*.py}; do
  [ "$file" = none ] && break
  log="$WORK/logs/pytest-$(basename "${file%%::*}" .py).log"
  timeout 300 python3 -m pytest -q -p no:cacheprovider "$file" > "$log" 2>&1
  echo "$(basename "$file"): rc=$? $(tail -1 "$log")"
  grep -E "^(FAILED|ERROR)|Fatal Python error|^  File .*opreg|^Current thread" "$log" | head -12
  pack
done

grep -h -A40 "^| subject" "$WORK"/results/*.md
step done
