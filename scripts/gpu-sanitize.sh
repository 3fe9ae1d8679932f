#!/usr/bin/env bash
# Runs on the GPU machine after scripts/gpu-build.sh: the CUDA half of the given test binaries
# (default: the misuse catalogue and the two-thread test) under compute-sanitizer's memcheck and
# racecheck. Logs go to $OUT when set; exits non-zero when a tool reports an error.
#   bash scripts/gpu-sanitize.sh [test-binary-name...]
set -uo pipefail
cd "$(dirname "$0")/.."
. "$(dirname "${BASH_SOURCE[0]}")/cuda-env.sh"
export GRAPHED_REQUIRE_CUDA=1
out=${OUT:-/tmp/graphed-out}; mkdir -p "$out"
tests=("$@"); [ ${#tests[@]} -gt 0 ] || tests=(misuse threads)
fail=0
for t in "${tests[@]}"; do
  for tool in memcheck racecheck; do
    log="$out/sanitize-$tool-$t.log"
    compute-sanitizer --tool "$tool" --error-exitcode 7 "gpu-bin/tests/$t" --test-threads=1 >"$log" 2>&1
    rc=$?
    echo "$tool $t: exit $rc, $(grep -E '^=+ (ERROR SUMMARY|RACECHECK SUMMARY)' "$log" | tail -1)"
    [ $rc -eq 0 ] || { fail=1; grep -E "^test result|=========" "$log" | head -20; }
  done
done
exit $fail
