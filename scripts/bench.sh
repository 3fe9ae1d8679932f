#!/usr/bin/env bash
# Runs on the GPU machine after scripts/gpu-build.sh (carry gpu-bin): our benchmark and
# PyTorch's on the same GPU in the same call, then the side-by-side table and the chart.
#   bash scripts/bench.sh [steps]
set -euo pipefail
cd "$(dirname "$0")/.."
. "$(dirname "${BASH_SOURCE[0]}")/cuda-env.sh"
out=${OUT:-/tmp/graphed-out}; mkdir -p "$out"
steps=${1:-200}
gpu-bin/examples/bench --steps "$steps" --out "$out/ours.json"
PYTHONUNBUFFERED=1 python3 gpu-bin/bench/pytorch_bench.py --steps "$steps" --out "$out/torch.json"
python3 gpu-bin/bench/compare.py --ours "$out/ours.json" --torch "$out/torch.json" --chart "$out/bench.png" --markdown "$out/bench.md"

# bf16 (#12): the same model in bf16, ours and PyTorch's, and GEMM TFLOP/s next to torch.matmul.
gpu-bin/examples/bench --steps "$steps" --dtype bf16 --out "$out/ours_bf16.json"
PYTHONUNBUFFERED=1 python3 gpu-bin/bench/pytorch_bench.py --steps "$steps" --dtype bf16 --out "$out/torch_bf16.json"
gpu-bin/examples/bench --gemm --steps 50 --warmup 10 --out "$out/ours_gemm.json"
PYTHONUNBUFFERED=1 python3 gpu-bin/bench/pytorch_bench.py --gemm --steps 50 --warmup 10 --out "$out/torch_gemm.json"
python3 gpu-bin/bench/compare_precision.py --ours-f32 "$out/ours.json" --ours-bf16 "$out/ours_bf16.json" \
  --torch-bf16 "$out/torch_bf16.json" --ours-gemm "$out/ours_gemm.json" --torch-gemm "$out/torch_gemm.json" \
  | tee "$out/bench_bf16.txt"
