#!/usr/bin/env bash
# Runs on the GPU machine after scripts/gpu-build.sh (carry gpu-bin): the GPT benchmark (#13),
# ours in every mode and PyTorch's three variants, bf16, on the same GPU in one call; then the
# side-by-side table and chart (bench/compare_gpt.py).
#   bash scripts/gpt-bench.sh [steps] [dtype]
set -euo pipefail
cd "$(dirname "$0")/.."
. "$(dirname "${BASH_SOURCE[0]}")/cuda-env.sh"
out=${OUT:-/tmp/graphed-out}; mkdir -p "$out"
steps=${1:-300}; dtype=${2:-bf16}
runs=()
run() { # name, args...
  local name=$1; shift
  echo "== ours $name"
  if gpu-bin/examples/gpt --steps "$steps" --dtype "$dtype" --eval-every 100000 --plot "$out/gpt_$name.png" \
    --json "$out/gpt_$name.json" "$@" > "$out/gpt_$name.log" 2>&1; then
    grep -E "^(GPT on|captured|trained)" "$out/gpt_$name.log"
    runs+=("$out/gpt_$name.json")
  else
    echo "FAILED: ours $name"; tail -3 "$out/gpt_$name.log"
  fi
}
run eager --mode eager
run graphed --mode graphed --no-checkpoint
run graphed_ck --mode graphed
run fused --mode fused --no-checkpoint
run floor --mode floor
run pipeline --mode pipeline
PYTHONUNBUFFERED=1 python3 gpu-bin/bench/pytorch_gpt_bench.py --steps "$steps" --dtype "$dtype" --out "$out/gpt_torch.json"
python3 gpu-bin/bench/compare_gpt.py --ours "${runs[@]}" --torch "$out/gpt_torch.json" \
  --chart "$out/gpt_bench.png" --markdown "$out/gpt_bench.md"
