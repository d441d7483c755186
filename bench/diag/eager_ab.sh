#!/usr/bin/env bash
# bench/diag/eager_ab.sh: eager-overhead A/B of this tree against an older one in one lease:
# bench/eager_overhead.py run RUNS times for each build, alternating (new1, base1, new2, ...),
# each run a fresh process with its own interleaved batches. The base tree travels in
# .carry/b0 (`git archive <commit> | tar -x -C .carry/b0`) and is installed to /tmp/opreg-base;
# this tree must be installed already (bench/gpu_session.sh). Each run's results are written to
# $WORK/ab/<new|base><i>/ (WORK defaults to a new temporary folder). Needs a CUDA GPU.
# With AB_NAME set, the runs that completed are tabled (bench/diag/ab_table.py) into
# bench/results/AB_NAME.{json,md}, copied to $OUT when set. AB_SECONDS (default 420) bounds the
# whole script: a pair of runs that would end past it is not started, so a device call's limit
# never cuts a run and loses the table (seen: RUNS=3 with the base build took over 470 s).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
WORK=${WORK:-$(mktemp -d)}
RUNS=${RUNS:-3}
BASE=/tmp/opreg-base
mkdir -p "$WORK/ab" "$WORK/logs"
# The system compiler, as bench/gpu_session.sh says why (the machine's default g++ emits code for
# a newer libstdc++ than the one Python loads: a base built with it crashes on import).
for candidate in /usr/bin/g++ /usr/bin/g++-12 /usr/bin/g++-11; do
  [ -x "$candidate" ] && export CXX="$candidate" CC="${candidate/g++/gcc}" CUDAHOSTCXX="$candidate" && break
done
if ! PYTHONPATH="$BASE" python3 -c "import opreg" 2> /dev/null; then
  rm -rf "$BASE"
  python3 -m pip install -q --no-build-isolation --no-deps --target "$BASE" \
    --config-settings=cmake.define.OPREG_NLOHMANN_JSON_INCLUDE_DIR="$PWD/.carry/include" \
    .carry/b0 > "$WORK/logs/base-build.log" 2>&1 || { tail -30 "$WORK/logs/base-build.log"; exit 1; }
fi
# Every run on the same cores: runs placed by the scheduler differed by up to 30% in host time
# (eager_overhead_ab8, ab9), more than the A/B looks for.
PIN=()
command -v taskset > /dev/null && PIN=(taskset -c "${AB_CPUS:-2-5}")
START=$SECONDS
PAIR_SECONDS=0
COMPLETED=0
for i in $(seq 1 "$RUNS"); do
  if ((SECONDS - START + PAIR_SECONDS > ${AB_SECONDS:-420})); then
    echo "run $i not started: the last pair took ${PAIR_SECONDS}s, AB_SECONDS=${AB_SECONDS:-420}"
    break
  fi
  pair_start=$SECONDS
  for build in new base; do
    out="$WORK/ab/$build$i"
    mkdir -p "$out"
    if [ "$build" = new ]; then
      OPREG_BENCH_OUT="$out" timeout 200 "${PIN[@]}" python3 bench/eager_overhead.py > "$out/log" 2>&1
    else
      (cd .carry/b0 && PYTHONPATH="$BASE" OPREG_BENCH_OUT="$out" \
        timeout 200 "${PIN[@]}" python3 bench/eager_overhead.py > "$out/log" 2>&1)
    fi
    echo "$build$i: rc=$? $(grep -c '' "$out/log") lines"
  done
  PAIR_SECONDS=$((SECONDS - pair_start))
  [ -f "$WORK/ab/new$i/eager_overhead.json" ] && [ -f "$WORK/ab/base$i/eager_overhead.json" ] &&
    COMPLETED=$i
done
if [ -n "${AB_NAME:-}" ] && ((COMPLETED > 0)); then
  new_runs=() base_runs=()
  for i in $(seq 1 "$COMPLETED"); do
    new_runs+=("$WORK/ab/new$i/eager_overhead.json") base_runs+=("$WORK/ab/base$i/eager_overhead.json")
  done
  python3 bench/diag/ab_table.py "$AB_NAME" "Eager overhead A/B: ${AB_NEW:-this tree} vs base ${AB_BASE:-.carry/b0}" \
    "bench/eager_overhead.py run $COMPLETED times per build, alternating new/base, each a fresh process pinned to cores ${AB_CPUS:-2-5} (bench/diag/eager_ab.sh)" \
    --new "${new_runs[@]}" --base "${base_runs[@]}"
  [ -n "${OUT:-}" ] && cp bench/results/"$AB_NAME".json bench/results/"$AB_NAME".md "$OUT"/
fi
