#!/usr/bin/env bash
# `make bench`: every benchmark, each printing its figures next to a baseline
# measured in the same run (cp, memcpy, raw pread). Nothing here asserts on time.
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
export K3PACK_BIN="$PWD/$BUILD/k3pack"
status=0
# Each benchmark takes its own options (`bench/<name> --help`): none are
# passed through from here, since no option is common to all of them.
for b in "$BUILD"/bench_*; do
  [ -x "$b" ] || continue
  echo
  echo "=== $(basename "$b")"
  "$b" || { echo "($(basename "$b") failed)"; status=1; }
done
if ls python/k3pack/_k3pack*.so >/dev/null 2>&1; then
  for py in bench/bench_*.py; do
    args=()
    # The Python quant benchmark compares against the C++ one when it is built.
    if [ "$(basename "$py")" = bench_python_quant.py ] && [ -x "$BUILD/bench_quant" ]; then
      args=(--bench-quant "$BUILD/bench_quant")
    fi
    echo
    echo "=== $(basename "$py")"
    PYTHONPATH="$PWD/python" /usr/bin/python3 "$py" "${args[@]}" || status=1
  done
fi
exit $status
