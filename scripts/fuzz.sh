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
TARGETS=(gguf_reader_fuzz shard_set_fuzz pack_index_fuzz manifest_fuzz pyjson_fuzz trace_fuzz)
# FUZZ_TARGETS="a_fuzz b_fuzz" runs a subset (e.g. per-target durations in an extended run).
if [ -n "${FUZZ_TARGETS:-}" ]; then read -r -a TARGETS <<<"$FUZZ_TARGETS"; fi

CC=clang CXX=clang++ cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DK3_FUZZ=ON -DK3_PYTHON=OFF \
  >/dev/null || exit 1
cmake --build "$BUILD" -j "$JOBS" --target "${TARGETS[@]}" >/dev/null || { echo "fuzz build failed"; exit 1; }

status=0
printf '%-20s %12s %10s %8s\n' target executions exec/s crashes
for t in "${TARGETS[@]}"; do
  corpus="fuzz/corpus/${t%_fuzz}"
  work=$(mktemp -d)
  [ -d "$corpus" ] && cp -r "$corpus/." "$work/" 2>/dev/null
  log="$BUILD/$t.log"
  ASAN_OPTIONS=detect_leaks=1 "$BUILD/$t" -max_total_time="$SECONDS_PER_TARGET" -timeout=10 -rss_limit_mb=2048 \
    -max_len=65536 -print_final_stats=1 -artifact_prefix="$BUILD/$t-" "$work" >"$log" 2>&1
  rc=$?
  execs=$(grep -oE 'stat::number_of_executed_units: *[0-9]+' "$log" | grep -oE '[0-9]+$' | tail -1)
  [ -n "$execs" ] || execs=$(grep -oE '#[0-9]+' "$log" | tail -1 | tr -d '#')
  crashes=0
  [ $rc -ne 0 ] && crashes=1 && status=1
  rate=$(( ${execs:-0} / (SECONDS_PER_TARGET > 0 ? SECONDS_PER_TARGET : 1) ))
  printf '%-20s %12s %10s %8s\n' "$t" "${execs:-0}" "$rate" "$crashes"
  [ $rc -ne 0 ] && tail -30 "$log"
  rm -rf "$work"
done
exit $status
