#!/usr/bin/env bash
# Runs on the GPU machine after scripts/gpu-build.sh (carry gpu-pack; GPU_EXAMPLES=op_bench
# GPU_TESTS="ops_transformer ops_norm" is enough): what the row kernels need measured on an
# H200, most important first, inside one call.
# On the H200 (session 35) the bf16 row kernels took the H100's time (RMSNorm 27.8 us at
# 4096 x 4096, 1.67x the floor) while the residual-add form, the same kernel with two rows of
# 8 KB in flight a block, ran at 1.11x: the plain form is short of bytes in flight (docs/
# BENCHMARKS.md, session 38).
#   1. op_bench, every op (session 36's two kernels have not run on an H200 either);
#   1b. the plain RMSNorm forward at two lanes a thread (GRAPHED_RMS_SMEM_SPLIT=2, rms_smem2_bf16,
#      session 38, not yet run on any GPU): ops_transformer and ops_norm with it (the plain and
#      residual-add forms' bits must stay equal), then op_bench's RMSNorm lines with it;
#   2. bench/row_sweep.py --quick: the RMSNorm kernels' launch shapes, among them the row in
#      shared memory at 32 to 256 threads a block (at 128, twice the rows in flight a
#      multiprocessor of the runtime's 256);
#   3. bench/xent_sweep.py --quick: the cross-entropy's row kernels over launch shapes (the
#      row in shared memory at 4096 x 4096 among them);
#   4. scripts/rows-ncu.sh: the row kernels under Nsight Compute;
#   5. bench/row_tma.py --quick: the bulk-copy forms against the runtime's, while time is left.
# Logs and a summary go to $OUT/h200-rows.tgz.
#   bash scripts/h200-rows.sh [seconds, default 540]
NAME=h200-rows BUDGET=${1:-540}
. "$(dirname "$0")/device-call.sh"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$work/device.txt"
say "op_bench"
timeout 90 gpu-bin/examples/op_bench > "$work/op_bench.txt" 2>&1 || say "  op_bench failed or out of time"
grep -E "^copy:|worst|IF node:|^rms_norm|^add_rms|^softmax_cross_entropy +bf16" "$work/op_bench.txt" | tee -a "$work/summary.txt"
say "the plain RMSNorm forward at two lanes a thread (GRAPHED_RMS_SMEM_SPLIT=2)"
for t in ops_transformer ops_norm; do
  if GRAPHED_RMS_SMEM_SPLIT=2 timeout 120 "gpu-bin/tests/$t" --test-threads=1 > "$work/split-$t.txt" 2>&1; then
    say "ok   $t ($(grep -E '^test result' "$work/split-$t.txt" | tail -1))"
  else
    say "FAIL $t"
    grep -E "panicked|FAILED|error" "$work/split-$t.txt" | head -8 | tee -a "$work/summary.txt"
  fi
done
GRAPHED_RMS_SMEM_SPLIT=2 timeout 90 gpu-bin/examples/op_bench > "$work/op_bench_split.txt" 2>&1 || say "  op_bench failed or out of time"
grep -E "^copy:|^rms_norm |^add_rms_norm " "$work/op_bench_split.txt" | tee -a "$work/summary.txt"
# One bench/*.py sweep at --quick, up to 150 s, while a minute is left.
sweep() {
  [ "$(left)" -gt 60 ] || return 0
  say "$1"
  local cap=$(( $(left) - 40 )); [ "$cap" -le 150 ] || cap=150
  timeout "$cap" python3 -u "bench/$1.py" --quick --out "$work" > "$work/$1.txt" 2>&1 || say "  $1 failed or out of time"
  grep -A3 "floor" "$work/$1.txt" | tee -a "$work/summary.txt" > /dev/null
}
sweep row_sweep
sweep xent_sweep
if [ "$(left)" -gt 90 ]; then
  say "rows-ncu"
  OUT="$work" bash scripts/rows-ncu.sh "$(( $(left) - 30 ))" > "$work/rows-ncu.txt" 2>&1 || say "  rows-ncu failed or out of time"
fi
sweep row_tma
say "done"
pack
