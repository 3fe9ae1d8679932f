#!/usr/bin/env bash
# Runs on the GPU machine after scripts/gpu-build.sh (carry gpu-bin): GPT decoding, ours
# (`gpt --decode-bench`: the WHILE loop, one graph replay per token, eager) then PyTorch's anchor
# (bench/pytorch_gpt_decode.py: a static KV cache, torch.compile reduce-overhead), the same model
# (bf16; random weights, or the checkpoint given, which `gpt --save` wrote), prompt length, new
# tokens and batch sizes 1..64 in one call; then the ratios (bench/compare_decode.py) and the
# chart of tokens/s by batch size beside the anchor.
#   bash scripts/gpt-decode-bench.sh [prompt_len] [new_tokens] [weights.safetensors]
set -euo pipefail
cd "$(dirname "$0")/.."
. "$(dirname "${BASH_SOURCE[0]}")/cuda-env.sh"
out=${OUT:-/tmp/graphed-out}; mkdir -p "$out"
plen=${1:-64}; new=${2:-128}; weights=${3:-}
load=(); [ -n "$weights" ] && load=(--load "$weights")
echo "== ours"
gpu-bin/examples/gpt --decode-bench --size gpu --dtype bf16 --prompt-len "$plen" --max-new-tokens "$new" --max-batch 64 \
  "${load[@]}" --json "$out/decode_ours.json" --plot "$out/decode_ours.png" | tee "$out/decode_ours.log"
echo "== PyTorch"
PYTHONUNBUFFERED=1 python3 gpu-bin/bench/pytorch_gpt_decode.py --prompt-len "$plen" --new-tokens "$new" \
  --batches 1,2,4,8,16,32,64 "${load[@]}" --out "$out/decode_torch.json" | tee "$out/decode_torch.log"
python3 gpu-bin/bench/compare_decode.py --ours "$out/decode_ours.json" --torch "$out/decode_torch.json" \
  --markdown "$out/decode_bench.md" --chart "$out/decode_bench.png"
