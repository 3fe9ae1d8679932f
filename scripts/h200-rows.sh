#!/usr/bin/env bash
# Runs on the GPU machine after scripts/gpu-build.sh (carry gpu-pack; GPU_EXAMPLES="gpt op_bench"
# is enough): the measurements session 37 wrote down and could not get a device for, most
# important first, inside one call.
#   1. the main job (2,000 steps, its last validation over 32 batches) at peak learning rates
#      1e-3 and 1.5e-3 (the default 6e-4 ends at 1.19; dropout and weight decay did not move it,
#      docs/results/callB-2026-12-07-h100-s37.txt);
#   2. op_bench, every op (on an H200: session 36's two kernels, LayerNorm's one-pass f32
#      backward and the counting cross-entropy grad, have not run there);
#   3. bench/row_tma.py --quick: the row kernels' bulk-copy forms against the runtime's on this
#      GPU (on an H200 the runtime's row kernels sit at 1.67x to 1.84x of the floor, latency-bound;
#      the forms keep rows in flight a block, which the H100 did not need).
# The first main-job run compiles the runtime's kernels (about 50 s on a fresh machine), so it
# gets a longer limit. Logs and a summary go to $OUT/h200-rows.tgz.
#   bash scripts/h200-rows.sh [seconds, default 540]
NAME=h200-rows BUDGET=${1:-540}
. "$(dirname "$0")/device-call.sh"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$work/device.txt"
main_job() {
  local name=$1 limit=$2; shift 2
  say "main job $name: $*"
  timeout "$limit" gpu-bin/examples/gpt "$@" --plot "$work/gpt_$name.png" --json "$work/gpt_$name.json" \
    > "$work/gpt_$name.txt" 2>&1 || say "  FAILED or out of time"
  grep -E "validation loss .*batches|^trained" "$work/gpt_$name.txt" | tee -a "$work/summary.txt"
}
main_job lr1e-3 150 --lr 1e-3
main_job lr1.5e-3 40 --lr 1.5e-3
say "op_bench"
timeout 60 gpu-bin/examples/op_bench > "$work/op_bench.txt" 2>&1 || say "  op_bench failed or out of time"
grep -E "^copy:|worst|IF node:" "$work/op_bench.txt" | tee -a "$work/summary.txt"
if [ "$(left)" -gt 60 ]; then
  say "row_tma"
  timeout "$(( $(left) - 10 ))" python3 -u bench/row_tma.py --quick --out "$work" > "$work/row_tma.txt" 2>&1 \
    || say "  row_tma failed or out of time"
  grep -A2 "floor" "$work/row_tma.txt" | tee -a "$work/summary.txt" > /dev/null
fi
say "done"
pack
