#!/usr/bin/env bash
# Builds the libFuzzer targets with clang (ASan + UBSan) and runs each for N
# seconds over its seed corpus (fuzz/corpus/<target>, seeded from `k3pack synth`
# outputs and crafted bad files by fuzz/make_seeds.py; regression-* inputs are
# crash reproducers), copied to a temp dir so runs never write into the repo.
# Prints executions and crashes per target; exits non-zero if any target crashed.
set -uo pipefail
cd "$(dirname "$0")/.."
SECONDS_PER_TARGET=${1:-30}
BUILD=${FUZZ_BUILD:-build-fuzz}
JOBS=${JOBS:-$(nproc)}
# Every fuzz/<name>_fuzz.cpp is a target.
TARGETS=()
for f in fuzz/*_fuzz.cpp; do TARGETS+=("$(basename "$f" .cpp)"); done
# FUZZ_TARGETS="a_fuzz b_fuzz" runs a subset (e.g. per-target durations in an extended run).
if [ -n "${FUZZ_TARGETS:-}" ]; then read -r -a TARGETS <<<"$FUZZ_TARGETS"; fi
# Extended runs: FUZZ_WORKERS=N runs N processes per target over one shared
# corpus (libFuzzer -jobs/-workers) and sums their executions; FUZZ_RUNS=M
# stops each process after M executions (N seconds stays the cap).
WORKERS=${FUZZ_WORKERS:-1}
RUNS=${FUZZ_RUNS:-}

# CI keeps only the tail of a run: a failed configure or build prints its own
# errors (clang is stricter than g++ in places), not just that it failed.
build_log=$(mktemp)
trap 'rm -f "$build_log"' EXIT
if ! CC=clang CXX=clang++ cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DK3_FUZZ=ON \
     -DK3_PYTHON=OFF >"$build_log" 2>&1; then
  echo "fuzz configure failed:"; tail -40 "$build_log"; exit 1
fi
if ! cmake --build "$BUILD" -j "$JOBS" --target "${TARGETS[@]}" >"$build_log" 2>&1; then
  echo "fuzz build failed:"; grep -E -A3 'error:|FAILED:' "$build_log" | head -60; exit 1
fi
BUILD=$(cd "$BUILD" && pwd)

status=0
printf '%-20s %12s %9s %10s %8s\n' target executions seconds exec/s crashes
for t in "${TARGETS[@]}"; do
  corpus="fuzz/corpus/${t%_fuzz}"
  work=$(mktemp -d)
  [ -d "$corpus" ] && cp -r "$corpus/." "$work/" 2>/dev/null
  log="$BUILD/$t.log"
  started=$SECONDS
  args=(-max_total_time="$SECONDS_PER_TARGET" -timeout=10 -rss_limit_mb=2048 -max_len=65536 -print_final_stats=1
        -artifact_prefix="$BUILD/$t-")
  [ -n "$RUNS" ] && args+=(-runs="$RUNS")
  if [ "$WORKERS" -gt 1 ]; then
    # Each job writes fuzz-<n>.log into the working directory: keep them beside the target's log.
    logs="$BUILD/$t.jobs"
    rm -rf "$logs" && mkdir -p "$logs"
    (cd "$logs" && ASAN_OPTIONS=detect_leaks=1 "$BUILD/$t" "${args[@]}" -jobs="$WORKERS" -workers="$WORKERS" \
      "$work") >"$log" 2>&1
    rc=$?
    # A job that crashed shows in its own log, not always in the parent's exit code.
    grep -qE '^==[0-9]+==ERROR|deadly signal|Test unit written' "$logs"/fuzz-*.log "$log" 2>/dev/null && rc=1
    execs=0
    for l in "$logs"/fuzz-*.log; do
      n=$(grep -oE 'stat::number_of_executed_units: *[0-9]+' "$l" | grep -oE '[0-9]+$' | tail -1)
      execs=$((execs + ${n:-0}))
    done
  else
    ASAN_OPTIONS=detect_leaks=1 "$BUILD/$t" "${args[@]}" "$work" >"$log" 2>&1
    rc=$?
    execs=$(grep -oE 'stat::number_of_executed_units: *[0-9]+' "$log" | grep -oE '[0-9]+$' | tail -1)
    [ -n "$execs" ] || execs=$(grep -oE '#[0-9]+' "$log" | tail -1 | tr -d '#')
  fi
  crashes=0
  [ $rc -ne 0 ] && crashes=1 && status=1
  elapsed=$((SECONDS - started))
  rate=$(( ${execs:-0} / (elapsed > 0 ? elapsed : 1) ))
  printf '%-20s %12s %9s %10s %8s\n' "$t" "${execs:-0}" "$elapsed" "$rate" "$crashes"
  [ $rc -ne 0 ] && tail -30 "$log" && [ "$WORKERS" -gt 1 ] && tail -n 30 "$logs"/fuzz-*.log
  rm -rf "$work"
done
exit $status
