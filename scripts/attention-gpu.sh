#!/usr/bin/env bash
# Runs on the GPU machine after scripts/gpu-build.sh (carry gpu-bin): the fused attention's
# tests (CUDA required), compute-sanitizer memcheck and racecheck on them, the runtime's
# attention benchmark, PyTorch's SDPA beside the same kernels (bench/flash_sweep.py, which also
# checks them against a float32 reference), and the GPT main job against PyTorch at three
# contexts of 4096 tokens a step (256 x 16, 1024 x 4, 4096 x 1).
#   bash scripts/attention-gpu.sh [gpt-steps]      (logs and JSON under $OUT)
set -uo pipefail
cd "$(dirname "$0")/.."
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export GRAPHED_REQUIRE_CUDA=1 PYTHONUNBUFFERED=1
out=${OUT:-/tmp/graphed-out}; mkdir -p "$out"
steps=${1:-300}
fail=0
for t in ops_flash ops_attention gpt; do
  echo "=== test $t"
  gpu-bin/tests/$t --test-threads=1 > "$out/test-$t.log" 2>&1 || { fail=1; echo "FAILED: $t"; grep -E "panicked|FAILED" "$out/test-$t.log" | head; }
  grep -E "^test result" "$out/test-$t.log"
done
for tool in memcheck racecheck; do
  echo "=== compute-sanitizer $tool: ops_flash"
  compute-sanitizer --tool $tool --error-exitcode 3 gpu-bin/tests/ops_flash --test-threads=1 > "$out/sanitize-$tool.log" 2>&1 \
    || { fail=1; echo "FAILED: $tool"; }
  grep -E "ERROR SUMMARY|RACECHECK SUMMARY|^test result" "$out/sanitize-$tool.log" | tail -3
done
echo "=== attention benchmark (runtime)"
gpu-bin/examples/attention_bench --json "$out/attention_bench.json" 2>&1 | tee "$out/attention_bench.log"
echo "=== PyTorch SDPA beside the same kernels (NVRTC through CuPy)"
python3 gpu-bin/bench/flash_sweep.py --no-sweep --out "$out" > "$out/flash_sweep.log" 2>&1 || fail=1
grep -vE "^check .* OK$" "$out/flash_sweep.log" | tail -30
for shape in 256x16 1024x4 4096x1; do
  ctx=${shape%x*}; batch=${shape#*x}
  echo "=== GPT ${ctx} x ${batch}"
  for mode in graphed floor; do
    gpu-bin/examples/gpt --steps "$steps" --eval-every 100000 --mode $mode --no-checkpoint --context "$ctx" --batch "$batch" \
      --plot "$out/gpt_${mode}_${shape}.png" --json "$out/gpt_${mode}_${shape}.json" > "$out/gpt_${mode}_${shape}.log" 2>&1 \
      || { fail=1; echo "FAILED: gpt $mode $shape"; tail -3 "$out/gpt_${mode}_${shape}.log"; }
    grep -E "^(captured|trained)" "$out/gpt_${mode}_${shape}.log"
  done
  python3 gpu-bin/bench/pytorch_gpt_bench.py --steps "$steps" --dtype bf16 --context "$ctx" --batch "$batch" \
    --variants per_layer,compile --out "$out/gpt_torch_${shape}.json" 2>&1 | grep -E "^\[torch" || fail=1
done
exit $fail
