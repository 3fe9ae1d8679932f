#!/usr/bin/env python3
"""Fused attention, ours beside PyTorch's SDPA, in one device call.

Reads `examples/attention_bench --json` files (ours through the runtime, each call replayed from
a graph: `--ours` with the default engine, `--ours-nondet` with `--engine
cudnn-nondeterministic`), then times PyTorch's `scaled_dot_product_attention` at the same shapes
(16384 tokens a call, 2048 features, bf16) with its FlashAttention-2 backend and with its cuDNN
backend (the one PyTorch 2.11 picks on an H200), forward and backward through autograd, and
prints TFLOP/s side by side with the ratios. FLOPs as attention_bench counts them: forward
4 * batch * heads * seq^2 * head_dim (halved when causal), backward 2.5 times that.

    python3 bench/compare_attention.py --ours ours.json [--ours-nondet nondet.json] [--out FILE]
"""
import argparse
import json

import torch

from attention_timing import time_sdpa


def time_torch(s, d, causal, backend):
    """TFLOP/s forward and backward of SDPA with `backend`, or (None, None) if it refuses."""
    tf, tb, why = time_sdpa(s, d, causal, backend)
    if why:
        print(f"[torch {backend}] seq {s} d {d} causal {causal}: {why}")
    return tf, tb


def ratio(a, b):
    return f"{a / b:.2f}x" if a and b else "-"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ours", required=True)
    ap.add_argument("--ours-nondet")
    ap.add_argument("--out")
    args = ap.parse_args()
    ours = json.load(open(args.ours))["rows"]
    nondet = {}
    if args.ours_nondet:
        for r in json.load(open(args.ours_nondet))["rows"]:
            nondet[(r["seq"], r["head_dim"], r["causal"])] = r
    print(f"GPU: {torch.cuda.get_device_name()}, torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}")
    head = ("| seq | head dim | causal | ours fwd | SDPA flash fwd | SDPA cuDNN fwd | vs flash | vs cuDNN "
            "| ours bwd | SDPA flash bwd | SDPA cuDNN bwd | vs flash | vs cuDNN | ours nondet bwd | nondet vs cuDNN |")
    lines = [head, "|" + "---:|" * 3 + "---:|" * 12]
    rows = []
    for r in ours:
        s, d, c = r["seq"], r["head_dim"], r["causal"]
        ff, fb = time_torch(s, d, c, "flash")
        cf, cb = time_torch(s, d, c, "cudnn")
        n = nondet.get((s, d, c), {})
        of, ob, nb = r["fwd_tflops"], r["bwd_tflops"], n.get("bwd_tflops")
        row = dict(seq=s, head_dim=d, causal=c, ours_engines=r.get("engines"), ours_fwd=of, ours_bwd=ob,
                   ours_nondet_bwd=nb, flash_fwd=ff, flash_bwd=fb, cudnn_fwd=cf, cudnn_bwd=cb)
        rows.append(row)
        f = lambda x: f"{x:.0f}" if x else "-"
        lines.append(f"| {s} | {d} | {'yes' if c else 'no'} | {f(of)} | {f(ff)} | {f(cf)} | {ratio(of, ff)} | {ratio(of, cf)} "
                     f"| {f(ob)} | {f(fb)} | {f(cb)} | {ratio(ob, fb)} | {ratio(ob, cb)} | {f(nb)} | {ratio(nb, cb)} |")
        print(lines[-1], flush=True)
    print("\n".join(lines))
    if args.out:
        meta = dict(device=torch.cuda.get_device_name(), torch=torch.__version__, cudnn=torch.backends.cudnn.version(),
                    units="TFLOP/s", tokens=16384, width=2048, dtype="bf16")
        json.dump(dict(meta, rows=rows), open(args.out, "w"), indent=1)


if __name__ == "__main__":
    main()
