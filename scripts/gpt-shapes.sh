#!/usr/bin/env bash
# One device call (after scripts/gpu-build.sh; carry gpu-pack): the GPT at its three shapes of
# 4096 tokens a step (256 x 16, 1024 x 4, 4096 x 1) against torch.compile (reduce-overhead) in the
# same call. Ours: one graph per layer, the whole step as one graph (the floor), and the blocks
# that recompute SwiGLU's output (`--recompute swiglu`) or it and the norms' outputs (`all`).
# Each run's JSON and log go into $OUT/gpt-shapes.tgz, the table with same-run ratios to
# $OUT/gpt-shapes.md (and stdout).
#   bash scripts/gpt-shapes.sh [steps, default 200]
# (GPT_SHAPES="1024x4" picks the shapes; GPT_SHAPES_RUNS="graphed swiglu all" picks ours' runs, default
# graphed, floor, swiglu and all, and `ring` (`rows`) adds one with the RMSNorm kernels' ring (register) forms, `lt` and `tuned`
# ones with the plain GEMMs through cublasLt (GRAPHED_GEMM), `attn_tuned` one with cuDNN's attention plans
# timed (GRAPHED_ATTENTION_TUNE=1, its log listing each shape's plans), `both_tuned` both, `ws64` and
# `ws64_all` cuDNN's deterministic backward under a 64 MiB workspace limit (at batch 1 in chunks of
# heads; GRAPHED_ATTENTION_WORKSPACE_MB), the second with `--recompute all`; `nondet` and `nondet_all` cuDNN's
# backward with atomics (GRAPHED_ATTENTION=cudnn-nondeterministic); `hopper` the backward on graphed's
# Hopper kernel (GRAPHED_ATTENTION=hopper), `cudnn` on cuDNN's deterministic one (GRAPHED_ATTENTION=cudnn), `chains2` and `chains4`
# its dQ summed in 2 or 4 chains (GRAPHED_HOPPER_CHAINS); GPT_SHAPES_TORCH the
# torch variants, default compile,compile_stacked: the model as written, and with q/k/v and
# gate/up each one Linear, as ours stores them.)
set -uo pipefail
cd "$(dirname "$0")/.."
[ -d gpu-bin ] || python3 -c "import tarfile; tarfile.open('gpu-pack/gpu-bin.tar.xz').extractall()"
. "$(dirname "${BASH_SOURCE[0]}")/cuda-env.sh"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
out=${OUT:-/tmp/graphed-out}; work=$(mktemp -d)/gpt-shapes; mkdir -p "$out" "$work"
steps=${1:-200}
t0=$(date +%s)
note() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
# ours NAME SHAPE ARGS...: one run of the GPT example.
ours() {
  local name=$1 shape=$2; shift 2
  local ctx=${shape%x*} batch=${shape#*x}
  timeout 150 gpu-bin/examples/gpt --steps "$steps" --eval-every 100000 --no-checkpoint --context "$ctx" --batch "$batch" \
    --plot "$work/gpt_${name}_${shape}.png" --json "$work/gpt_${name}_${shape}.json" "$@" > "$work/gpt_${name}_${shape}.log" 2>&1 \
    || { echo "FAILED: ours $name $shape"; tail -3 "$work/gpt_${name}_${shape}.log"; }
  note "$name $shape: $(grep -E '^trained' "$work/gpt_${name}_${shape}.log")"
}
note "GPU: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader)"
# The table of every run so far (same-run ratios), and the logs, into $OUT.
pack() {
python3 - "$work" > "$work/gpt-shapes.md" <<'PY'
import glob, json, os, sys
work = sys.argv[1]
def load(p):
    try:
        return json.load(open(p))
    except (OSError, ValueError):
        return None
names = ["graphed", "floor", "swiglu", "all", "ring", "rows", "lt", "tuned", "attn_tuned", "both_tuned", "ws64", "ws64_all", "nondet", "nondet_all", "hopper", "cudnn", "chains2", "chains4"]
print("| shape | run | tokens/s | / torch.compile | / torch.compile, stacked | / ours graphed | pool MB | every pool MB | pool / its reserved | every pool / its reserved | val loss |")
print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
def ratio(a, b):
    return f"{a / b:.3f}x" if b else "-"
for shape in ["256x16", "1024x4", "4096x1"]:
    t = load(os.path.join(work, f"gpt_torch_{shape}.json"))
    by = {r["variant"]: r for r in (t or {}).get("results", [])}
    tr, ts = by.get("compile"), by.get("compile_stacked")
    base = load(os.path.join(work, f"gpt_graphed_{shape}.json"))
    for n in names:
        r = load(os.path.join(work, f"gpt_{n}_{shape}.json"))
        if not r:
            continue
        vs = ratio(r["tokens_per_s"], base["tokens_per_s"]) if base else "-"
        pr = ratio(r["pool_mb"], tr["reserved_mb"]) if tr else "-"
        dr = ratio(r["device_mb"], tr["reserved_mb"]) if tr else "-"
        rt = ratio(r["tokens_per_s"], tr["tokens_per_s"]) if tr else "-"
        rs = ratio(r["tokens_per_s"], ts["tokens_per_s"]) if ts else "-"
        print(f"| {shape} | {n} | {r['tokens_per_s']:,.0f} | {rt} | {rs} | {vs} | {r['pool_mb']:.1f} | {r['device_mb']:.1f} | {pr} | {dr} | {r['val_last']:.4f} |")
    for name, tx in [("torch.compile", tr), ("torch.compile, stacked", ts)]:
        if tx:
            rt = ratio(tx["tokens_per_s"], tr["tokens_per_s"]) if tr else "-"
            rs = ratio(tx["tokens_per_s"], ts["tokens_per_s"]) if ts else "-"
            print(f"| {shape} | {name} | {tx['tokens_per_s']:,.0f} | {rt} | {rs} | - | {tx['reserved_mb']:.1f} reserved | - | - | - | loss {tx['loss']:.4f} |")
PY
  cp "$work/gpt-shapes.md" "$out/"
  tar -czf "$out/gpt-shapes.tgz" -C "$(dirname "$work")" gpt-shapes
}
for shape in ${GPT_SHAPES:-256x16 1024x4 4096x1}; do
  for run in ${GPT_SHAPES_RUNS:-graphed floor swiglu all}; do
    case $run in
      graphed) ours graphed "$shape" --mode graphed ;;
      floor) ours floor "$shape" --mode floor ;;
      swiglu | all) ours "$run" "$shape" --mode graphed --recompute "$run" ;;
      # The RMSNorm kernels' ring forms (the default since 2026-12-05; GRAPHED_ROW_RING=1 names
      # them) and the register kernels they replaced (GRAPHED_ROW_RING=0).
      ring) GRAPHED_ROW_RING=1 ours ring "$shape" --mode graphed ;;
      rows) GRAPHED_ROW_RING=0 ours rows "$shape" --mode graphed ;;
      # The plain GEMMs through cublasLt, its heuristic's first algorithm or the fastest of its
      # candidates timed at the first call of each shape (GRAPHED_GEMM; not in the default runs).
      lt | tuned) GRAPHED_GEMM=$run ours "$run" "$shape" --mode graphed ;;
      # cuDNN's attention plans timed (GRAPHED_ATTENTION_TUNE=1), alone and with the GEMMs'.
      attn_tuned) GRAPHED_ATTENTION_TUNE=1 GRAPHED_CUDNN_DEBUG=1 ours "$run" "$shape" --mode graphed ;;
      both_tuned) GRAPHED_GEMM=tuned GRAPHED_ATTENTION_TUNE=1 ours "$run" "$shape" --mode graphed ;;
      # cuDNN's deterministic backward under a 64 MiB workspace (chunks of sequences, then of
      # one sequence's heads), alone and with the blocks recomputing everything they can.
      ws64) GRAPHED_ATTENTION_WORKSPACE_MB=64 ours "$run" "$shape" --mode graphed ;;
      ws64_all) GRAPHED_ATTENTION_WORKSPACE_MB=64 ours "$run" "$shape" --mode graphed --recompute all ;;
      # cuDNN's backward with atomics (PyTorch's own; grads differ run to run), alone and with
      # the blocks recomputing everything they can.
      nondet) GRAPHED_ATTENTION=cudnn-nondeterministic ours "$run" "$shape" --mode graphed ;;
      nondet_all) GRAPHED_ATTENTION=cudnn-nondeterministic ours "$run" "$shape" --mode graphed --recompute all ;;
      # The backward on graphed's Hopper kernel (flash_hopper.cu; deterministic, no dP workspace).
      hopper) GRAPHED_ATTENTION=hopper ours "$run" "$shape" --mode graphed ;;
      # The backward on cuDNN's deterministic kernel (GRAPHED_ATTENTION=cudnn), where `Auto` picks the Hopper one.
      cudnn) GRAPHED_ATTENTION=cudnn ours "$run" "$shape" --mode graphed ;;
      # The Hopper backward's dQ summed in 2 or 4 chains (GRAPHED_HOPPER_CHAINS).
      chains2) GRAPHED_HOPPER_CHAINS=2 ours "$run" "$shape" --mode graphed ;;
      chains4) GRAPHED_HOPPER_CHAINS=4 ours "$run" "$shape" --mode graphed ;;
    esac
  done
  timeout 300 python3 gpu-bin/bench/pytorch_gpt_bench.py --steps "$steps" --dtype bf16 --context "${shape%x*}" \
    --batch "${shape#*x}" --variants "${GPT_SHAPES_TORCH:-compile,compile_stacked}" --out "$work/gpt_torch_${shape}.json" > "$work/gpt_torch_${shape}.log" 2>&1 \
    || { echo "FAILED: torch $shape"; tail -3 "$work/gpt_torch_${shape}.log"; }
  note "torch.compile $shape: $(grep -E '^\[torch' "$work/gpt_torch_${shape}.log" | tail -1)"
  pack
done
cat "$work/gpt-shapes.md"
note "done"
