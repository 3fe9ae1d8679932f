#!/usr/bin/env bash
# Runs on the GPU machine: every test binary with CUDA required (both halves of the suite),
# then the examples given as arguments (default: none). Logs go to $OUT when set.
set -uo pipefail
cd "$(dirname "$0")/.."
. "$(dirname "${BASH_SOURCE[0]}")/cuda-env.sh"
export GRAPHED_REQUIRE_CUDA=1
out=${OUT:-/tmp/graphed-out}; mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/gpu.txt"
fail=0
for t in gpu-bin/tests/*; do
  echo "=== $(basename "$t")"
  if ! "$t" --test-threads=1 >"$out/test-$(basename "$t").log" 2>&1; then
    echo "FAILED: $(basename "$t")"; fail=1
    grep -E "panicked|FAILED|failed|error" "$out/test-$(basename "$t").log" | head -20
  fi
  grep -E "^test result" "$out/test-$(basename "$t").log"
done
for ex in "$@"; do
  echo "=== example $ex"
  "gpu-bin/examples/$ex" 2>&1 | tee "$out/example-$ex.log" | tail -40
done
exit $fail
