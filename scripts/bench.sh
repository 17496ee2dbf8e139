#!/usr/bin/env bash
# `make bench`: every benchmark, each printing its figures next to a baseline
# measured in the same run (cp, memcpy, raw pread). Nothing here asserts on time.
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
export K3PACK_BIN="$PWD/$BUILD/k3pack"
status=0
for b in "$BUILD"/bench_*; do
  [ -x "$b" ] || continue
  echo
  echo "=== $(basename "$b")"
  "$b" "$@" || { echo "($(basename "$b") failed)"; status=1; }
done
if ls python/k3pack/_k3pack*.so >/dev/null 2>&1; then
  for py in bench/bench_*.py; do
    echo
    echo "=== $(basename "$py")"
    PYTHONPATH="$PWD/python" /usr/bin/python3 "$py" || status=1
  done
fi
if [ -f bench/bench_python_quant.py ] && [ -x "$BUILD/bench_quant" ] && ls python/k3pack/_k3pack*.so >/dev/null 2>&1; then
  echo
  echo "=== bench_python_quant.py"
  PYTHONPATH="$PWD/python" /usr/bin/python3 bench/bench_python_quant.py --bench-quant "$BUILD/bench_quant" || status=1
fi
exit $status
