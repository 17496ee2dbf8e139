#!/usr/bin/env bash
# Runs every k3pack test: the normal build's CTest suite (unit, integration,
# CLI), the Python package tests, the same C++ suite under ASan+UBSan, the
# concurrency tests under TSan, and a short fuzz smoke run.
#
# Every stage runs every time. A stage is left out only when asked for by
# name, K3_SKIP="tsan fuzz" (stages: ctest python asan tsan fuzz); a stage
# that cannot run (its build failed, its tools are missing) is a failure.
set -uo pipefail
cd "$(dirname "$0")/.."
JOBS=${JOBS:-$(nproc)}
PY=/usr/bin/python3
SKIP=" ${K3_SKIP:-} "
# Older spellings of the skip switches.
[ "${K3_SKIP_TSAN:-0}" = 1 ] && SKIP+="tsan "
[ "${K3_SKIP_FUZZ:-0}" = 1 ] && SKIP+="fuzz "
failed=()
skipped=()
failed_tests=()
START=$(date +%s)
PY_LOG=$(mktemp)
trap 'rm -f "$PY_LOG"' EXIT

# CI keeps only the tail of a run: the names of the tests that failed, and
# the end of each one's output, are printed again at the end. CTest keeps both
# in Testing/Temporary/ of the build it ran.
note_ctest_failures() {
  local dir=$1 list=$1/Testing/Temporary/LastTestsFailed.log name
  [ -f "$list" ] || return 0
  while IFS=: read -r _ name; do
    [ -n "$name" ] && failed_tests+=("$dir: $name")
  done <"$list"
}
print_ctest_output() {
  local dir=$1 name=$2
  awk -v n="$name" '
    $0 ~ ("^[0-9]+/[0-9]+ Test: " n "$") { on = 1; buf = ""; next }
    on && index($0, "\"" n "\" end time:") == 1 { on = 0; printf "%s", buf; exit }
    on { buf = buf $0 "\n" }' "$dir/Testing/Temporary/LastTest.log" 2>/dev/null | tail -n 40
}

step() { echo; echo "=== $* ($(( $(date +%s) - START )) s into the run)"; }
wanted() {
  if [[ "$SKIP" == *" $1 "* ]]; then
    echo; echo "=== $1 stage skipped: asked for with K3_SKIP"; skipped+=("$1"); return 1
  fi
}

if wanted ctest; then
  step "unit and integration tests (build/)"
  rm -f build/Testing/Temporary/LastTestsFailed.log
  (cd build && ctest --output-on-failure --no-tests=error -j "$JOBS" --timeout 600) || { failed+=("ctest"); note_ctest_failures build; }
fi

if wanted python; then
  step "Python package tests (numpy/torch, $PY)"
  if ls python/k3pack/_k3pack*.so >/dev/null 2>&1; then
    if ! K3PACK_BIN="$PWD/build/k3pack" PYTHONPATH="$PWD/python" "$PY" -m unittest discover -s tests/python -v \
      2>&1 | tee "$PY_LOG"; then
      failed+=("python")
      while read -r line; do failed_tests+=("python: $line"); done < <(grep -E '^(FAIL|ERROR): ' "$PY_LOG")
    fi
  else
    echo "the Python extension was not built (python/k3pack/_k3pack*.so missing)"; failed+=("python")
  fi
fi

# The kill -9 test is left out here: it checks recovery from killed processes
# (the normal build runs it), takes ~100 s under ASan, and the builder code it
# drives runs under ASan in PackBuild.* and PackCli.EnospcMidBuildThenResume.
if wanted asan; then
  step "unit and integration tests under AddressSanitizer + UBSan (build-asan/)"
  rm -f build-asan/Testing/Temporary/LastTestsFailed.log
  (cd build-asan && ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    ctest --output-on-failure --no-tests=error -j "$JOBS" --timeout 900 -E 'PackCli.KillNineAtTwentySeededPointsThenResume') \
    || { failed+=("asan"); note_ctest_failures build-asan; }
fi

if wanted tsan; then
  step "concurrency tests under ThreadSanitizer (build-tsan/)"
  if make --no-print-directory build-tsan >/dev/null; then
    (cd build-tsan && TSAN_OPTIONS=halt_on_error=1 ./test_store --gtest_filter='StoreConcurrency.*') \
      || failed+=("tsan")
  else
    echo "the TSan build failed"; failed+=("tsan")
  fi
fi

if wanted fuzz; then
  step "fuzz smoke run"
  ./scripts/fuzz.sh "${FUZZ_SMOKE_SECONDS:-10}" || failed+=("fuzz")
fi

echo
echo "=== done in $(( $(date +%s) - START )) s"
[ ${#skipped[@]} -ne 0 ] && echo "skipped on request: ${skipped[*]}"
if [ ${#failed[@]} -ne 0 ]; then
  if [ ${#failed_tests[@]} -ne 0 ]; then
    shown=0
    for t in "${failed_tests[@]}"; do
      dir=${t%%: *} name=${t#*: }
      if [ "$dir" != python ] && [ $shown -lt 3 ]; then
        echo; echo "--- the end of $name's output ($dir/)"
        print_ctest_output "$dir" "$name"
        shown=$((shown + 1))
      fi
    done
    echo; echo "failed tests:"
    printf '  %s\n' "${failed_tests[@]}"
  fi
  echo "FAILED: ${failed[*]}"
  exit 1
fi
echo "all test groups passed"
