#!/usr/bin/env bash
# Runs on a machine with 2+ GPUs after scripts/gpu-build.sh (device tool: carry ["gpu-bin"],
# kind nvidia-h200-x2): the multi-GPU tests (each rank is a process; a test fails when any rank
# fails), the FSDP example on 2 GPUs, our data-parallel benchmark and PyTorch DDP with
# make_graphed_callables, then the side-by-side table with PASS/MISS.
#   bash scripts/gpu-multi.sh [steps]
# Logs and JSON go to $OUT (default /tmp/graphed-out). Exit status 1 if anything failed.
set -uo pipefail
cd "$(dirname "$0")/.."
. "$(dirname "${BASH_SOURCE[0]}")/cuda-env.sh"
# libnccl: cudarc loads it as `libnccl.so` (not the soname libnccl.so.2, which is all a runtime
# install or PyTorch's wheel ships), so point a libnccl.so symlink at the system's library, else
# at the wheel's.
nccl_so=$(ldconfig -p 2>/dev/null | awk '/libnccl\.so\.2 /{print $NF; exit}')
if [ -z "$nccl_so" ]; then
  nccl_so=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib", "libnccl.so.2"))' 2>/dev/null || true)
fi
if [ -n "$nccl_so" ] && [ -e "$nccl_so" ]; then
  mkdir -p gpu-bin/nccl && ln -sf "$nccl_so" gpu-bin/nccl/libnccl.so
  export LD_LIBRARY_PATH=$PWD/gpu-bin/nccl:$LD_LIBRARY_PATH
  echo "libnccl: $nccl_so"
else
  echo "libnccl.so.2 not found: the NCCL tests will fail with NcclUnavailable"
fi
export GRAPHED_REQUIRE_CUDA=1 GRAPHED_REQUIRE_MULTI_GPU=1 NCCL_NVLS_ENABLE=0
out=${OUT:-/tmp/graphed-out}; mkdir -p "$out"
steps=${1:-200}
nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader | tee "$out/gpus.txt"
fail=0
run() { # name, command...: runs with a deadline, records the status
  local name=$1; shift
  echo "=== $name"
  if timeout 900 "$@" >"$out/$name.log" 2>&1; then echo "ok: $name"; else echo "FAILED ($?): $name"; fail=1; tail -30 "$out/$name.log"; fi
}
for t in dist_gpu dist_dead_peer dist_emulated dist_pipeline dist_fsdp dist_launch; do
  run "test-$t" "gpu-bin/tests/$t" --test-threads=1
  grep -E "^test |^test result|bitwise|rank [0-9]|skipped|reports|ended after" "$out/test-$t.log" | head -20
done
run example-fsdp_hooks gpu-bin/examples/fsdp_hooks
tail -15 "$out/example-fsdp_hooks.log"
run dist_bench gpu-bin/examples/dist_bench --gpus 2 --steps "$steps" --out "$out/dist.json"
run torch_ddp env PYTHONUNBUFFERED=1 python3 gpu-bin/bench/pytorch_ddp_bench.py --gpus 2 --steps "$steps" --out "$out/torch_ddp.json"
if [ -f "$out/dist.json" ] && [ -f "$out/torch_ddp.json" ]; then
  python3 gpu-bin/bench/compare_dist.py --ours "$out/dist.json" --torch "$out/torch_ddp.json" --markdown "$out/dist_bench.md" || fail=1
else
  echo "no benchmark table: a benchmark failed"; fail=1
fi
exit $fail
