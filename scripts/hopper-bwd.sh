#!/usr/bin/env bash
# One device call (after scripts/gpu-build.sh; carry gpu-pack) for the Hopper attention backward
# (runtime/backend/kernels/flash_hopper.cu, AttentionEngine::Hopper): bench/hopper_bwd.py (the
# wgmma layout tests, the kernel with its dQ in two chains and in one (and its no-dQ-sum diagnostic, timed only) against a float32 reference and the portable kernels,
# their times beside PyTorch's SDPA backward), the ops_flash tests with CUDA required (every test
# runs the Hopper engine where it runs), then the GPT at 4096 x 1 with cuDNN's deterministic
# backward (the default) and with the Hopper one, against torch.compile, in the same call.
# Logs and tables go to $OUT.
#   bash scripts/hopper-bwd.sh [GPT steps, default 60]
# HOPPER_LEAN=1: the runtime's variant only in the bench, and the GPT without torch.compile (for a
# call with little device time left). HOPPER_BASE=FILE: another version of flash_hopper.cu timed
# beside this one in the bench (bench/hopper_bwd.py --base). HOPPER_PART=kernel runs the bench and the tests only,
# HOPPER_PART=gpt the GPT only (two calls of under 600 s each; the default runs both).
set -uo pipefail
cd "$(dirname "$0")/.."
[ -d gpu-bin ] || python3 -c "import tarfile; tarfile.open('gpu-pack/gpu-bin.tar.xz').extractall()"
. "$(dirname "${BASH_SOURCE[0]}")/cuda-env.sh"
export PYTHONUNBUFFERED=1 GRAPHED_CACHE_DIR=${GRAPHED_CACHE_DIR:-/tmp/graphed-cache}
out=${OUT:-/tmp/graphed-out}; mkdir -p "$out"
t0=$(date +%s)
note() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
note "GPU: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader)"
lean=${HOPPER_LEAN:-0} part=${HOPPER_PART:-all}
variants=1c2,1,0; [ "$lean" = 1 ] && variants=1c2
if [ "$part" != gpt ]; then
timeout 260 python3 bench/hopper_bwd.py --quick --variants "$variants" ${HOPPER_BASE:+--base "$HOPPER_BASE"} --out "$out" > "$out/hopper_bwd.log" 2>&1
note "hopper_bwd.py: exit $?"
grep -v " OK$" "$out/hopper_bwd.log" | head -40
echo "checks OK: $(grep -c ' OK$' "$out/hopper_bwd.log")"
GRAPHED_REQUIRE_CUDA=1 timeout 150 gpu-bin/tests/ops_flash --test-threads=1 > "$out/ops_flash.log" 2>&1
note "ops_flash: exit $?"
grep -E "^test result|FAILED|panicked|skipped" "$out/ops_flash.log" | head -12
GRAPHED_REQUIRE_CUDA=1 timeout 60 gpu-bin/tests/lib-graphed stall > "$out/lib_stall.log" 2>&1
note "lib-graphed (the stall count in the error word): exit $?"
grep -E "^test result|FAILED|panicked" "$out/lib_stall.log" | head -4
fi
[ "$part" = kernel ] && { note "done"; exit 0; }
torch=compile; [ "$lean" = 1 ] && torch=none
GPT_SHAPES=4096x1 GPT_SHAPES_RUNS="graphed hopper" GPT_SHAPES_TORCH=$torch timeout 420 bash scripts/gpt-shapes.sh "${1:-60}" 2>&1 | tail -12
note "done"
