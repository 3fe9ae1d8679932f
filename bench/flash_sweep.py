#!/usr/bin/env python3
"""Fused attention on the GPU machine: correctness, tile sweep and TFLOP/s next to PyTorch.

Compiles runtime/backend/kernels/flash.cu with NVRTC (through CuPy, the same compiler the
runtime uses) once per tile configuration, checks every kernel against a float32 reference
(PyTorch's math attention on the same bf16/f16 inputs), checks that the backward is bitwise
reproducible, sweeps the tile shapes at seq 1024 and 4096, then times the best configuration
at seq 512..8192 (head dim 64 and 128, causal and not) next to torch's SDPA (flash and cuDNN
backends) in the same run.

FLOP counts (FlashAttention's convention): forward 4 * batch * heads * seq^2 * head_dim (two
products), halved when causal; backward 2.5 times the forward (five products; our kernels run
seven, recomputing Q.K^T and dO.V^T once more to stay free of atomics).

    python3 bench/flash_sweep.py [--quick] [--out DIR]
"""
import argparse
import json
import math
import os
import sys
import time

import cupy as cp
import numpy as np
import torch
import torch.nn.functional as F

from attention_timing import flops, median_ms, time_sdpa

# The kernel sources: under the working directory (run from the repository root), else beside
# this script's folder.
_SOURCES = (os.path.join(os.getcwd(), "runtime", "backend", "kernels"),
            os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "runtime", "backend", "kernels"))
KDIR = next((p for p in _SOURCES if os.path.isdir(p)), _SOURCES[0])

# (tile, warps, mt) per kernel kind: keys a tile (forward, dQ) or queries a tile (dK/dV), warps,
# row blocks of 16 a warp. The first entry is the runtime's (FlashTiles in
# runtime/backend/kernels.rs), chosen by this sweep on an H200 (2026-12-01).
SWEEP = {
    "FWD64": [(64, 4, 2), (64, 8, 1), (32, 4, 2), (64, 4, 1), (64, 8, 2), (32, 4, 1)],
    "FWD128": [(128, 8, 1), (64, 4, 2), (64, 8, 1), (32, 4, 2), (32, 8, 1)],
    "DQ64": [(32, 4, 2), (64, 4, 2), (64, 8, 1), (32, 4, 1), (64, 4, 1), (32, 2, 2)],
    "DQ128": [(64, 4, 1), (64, 8, 1), (32, 4, 1)],
    "DKV64": [(128, 4, 1), (128, 4, 2), (64, 4, 2), (64, 8, 2), (32, 4, 2), (64, 4, 1)],
    "DKV128": [(64, 4, 1), (32, 4, 1), (64, 8, 1), (128, 4, 1), (32, 8, 1)],
    # The runtime's small-grid set at head dim 64 (the `_s_` kernels; not swept here).
    "FWDS64": [(64, 4, 1)],
    "DQS64": [(64, 4, 1)],
    "DKVS64": [(128, 4, 1)],
}


def rows(cfg):
    return 16 * cfg[1] * cfg[2]


def smem_bytes(kind, d, cfg):
    t, r = cfg[0], rows(cfg)
    if kind == "FWD":
        return (r + 4 * t) * d * 2
    if kind == "DQ":
        return (2 * r + 4 * t) * d * 2
    return (2 * r + 4 * t) * d * 2 + 4 * t * 4  # DKV: t = queries a tile, r = keys a block


def source():
    parts = [open(os.path.join(KDIR, f)).read() for f in ("core.cu", "ops.cu", "half.cu", "flash.cu")]
    return "\n".join(parts)


class Kernels:
    def __init__(self, cfgs):
        self.cfgs = cfgs
        defs = tuple(f"-DFA_{k}={v[0]},{v[1]},{v[2]}" for k, v in cfgs.items())
        t0 = time.time()
        self.mod = cp.RawModule(code=source(), options=("-std=c++17", "--gpu-architecture=sm_90") + defs)
        self.funcs = {}
        self.compile_s = time.time() - t0

    def f(self, name, kind, d):
        key = (name, kind, d)
        if key not in self.funcs:
            fn = self.mod.get_function(name)
            cfg = self.cfgs[f"{kind}{d}"]
            sm = smem_bytes(kind, d, cfg)
            fn.max_dynamic_shared_size_bytes = sm
            self.funcs[key] = (fn, cfg, sm)
        return self.funcs[key]

    def regs(self, name, kind, d):
        fn, _, _ = self.f(name, kind, d)
        return fn.num_regs, fn.local_size_bytes


def P(t):
    return np.uint64(t.data_ptr())


def U(x):
    return np.uint32(x)


def dt_name(dtype):
    return "bf16" if dtype == torch.bfloat16 else "f16"


def fwd(K, q, k, v, heads, kv_heads, causal):
    b, s, w = q.shape
    d = w // heads
    out = torch.empty_like(q)
    lse = torch.empty((b, heads, s), device=q.device, dtype=torch.float32)
    fn, cfg, sm = K.f(f"flash_fwd_{dt_name(q.dtype)}_d{d}", "FWD", d)
    grid = ((s + rows(cfg) - 1) // rows(cfg), heads, b)
    fn(grid, (32 * cfg[1],), (P(out), P(lse), P(q), P(k), P(v), U(s), U(heads), U(kv_heads), U(heads * d), U(kv_heads * d), U(int(causal)), np.float32(1 / math.sqrt(d))), shared_mem=sm)
    return out, lse


def bwd(K, dout, q, k, v, out, lse, heads, kv_heads, causal, parts=("dkdv", "dq")):
    b, s, w = q.shape
    d = w // heads
    name = dt_name(q.dtype)
    dsum = torch.empty((b, heads, s), device=q.device, dtype=torch.float32)
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    prep = K.mod.get_function(f"flash_bwd_prep_{name}")
    n = b * s * heads * d // 8
    prep((min((n + 255) // 256, 65535 * 8),), (256,), (P(dsum), P(dout), P(out), U(b * s), U(s), U(heads), U(d)))
    scale = np.float32(1 / math.sqrt(d))
    if "dkdv" in parts:
        fn, cfg, sm = K.f(f"flash_bwd_dkdv_{name}_d{d}", "DKV", d)
        grid = ((s + rows(cfg) - 1) // rows(cfg), kv_heads, b)
        fn(grid, (32 * cfg[1],), (P(dk), P(dv), P(q), P(k), P(v), P(dout), P(lse), P(dsum), U(s), U(heads), U(kv_heads), U(heads * d), U(kv_heads * d), U(int(causal)), scale), shared_mem=sm)
    if "dq" in parts:
        fn, cfg, sm = K.f(f"flash_bwd_dq_{name}_d{d}", "DQ", d)
        grid = ((s + rows(cfg) - 1) // rows(cfg), heads, b)
        fn(grid, (32 * cfg[1],), (P(dq), P(q), P(k), P(v), P(dout), P(lse), P(dsum), U(s), U(heads), U(kv_heads), U(heads * d), U(kv_heads * d), U(int(causal)), scale), shared_mem=sm)
    return dq, dk, dv


def to_heads(t, h):
    b, s, w = t.shape
    return t.view(b, s, h, w // h).transpose(1, 2)


def reference(q, k, v, dout, heads, kv_heads, causal):
    """float32 attention on the (rounded) inputs: out, lse, dq, dk, dv."""
    qf, kf, vf = (to_heads(t.float(), h).detach().requires_grad_(True) for t, h in ((q, heads), (k, kv_heads), (v, kv_heads)))
    g = heads // kv_heads
    ke, ve = kf.repeat_interleave(g, dim=1), vf.repeat_interleave(g, dim=1)
    d = qf.shape[-1]
    s = qf.shape[2]
    sc = (qf @ ke.transpose(-1, -2)) / math.sqrt(d)
    if causal:
        sc = sc.masked_fill(torch.triu(torch.ones(s, s, dtype=torch.bool, device=q.device), 1), float("-inf"))
    lse = torch.logsumexp(sc, -1)
    o = torch.softmax(sc, -1) @ ve
    o.backward(to_heads(dout.float(), heads))
    back = lambda t: t.transpose(1, 2).reshape(t.shape[0], s, -1)
    return back(o.detach()), lse.detach(), back(qf.grad), back(kf.grad), back(vf.grad)


def rel(a, b):
    """Relative error, against a floor where the reference is about zero (one-token rows have
    dQ = dK = 0 up to rounding)."""
    a, b = a.float(), b.float()
    return ((a - b).norm() / b.norm().clamp_min(1e-2 * b.numel() ** 0.5)).item()


def check(K, dtype, b, s, heads, kv_heads, d, causal, log):
    torch.manual_seed(s * 7 + heads + d + int(causal))
    q = torch.randn(b, s, heads * d, device="cuda").to(dtype)
    k = torch.randn(b, s, kv_heads * d, device="cuda").to(dtype)
    v = torch.randn(b, s, kv_heads * d, device="cuda").to(dtype)
    dout = torch.randn(b, s, heads * d, device="cuda").to(dtype)
    out, lse = fwd(K, q, k, v, heads, kv_heads, causal)
    dq, dk, dv = bwd(K, dout, q, k, v, out, lse, heads, kv_heads, causal)
    dq2, dk2, dv2 = bwd(K, dout, q, k, v, out, lse, heads, kv_heads, causal)
    torch.cuda.synchronize()
    ro, rl, rq, rk, rv = reference(q, k, v, dout, heads, kv_heads, causal)
    errs = dict(out=rel(out, ro), lse=rel(lse, rl), dq=rel(dq, rq), dk=rel(dk, rk), dv=rel(dv, rv))
    det = all(torch.equal(a, b) for a, b in ((dq, dq2), (dk, dk2), (dv, dv2)))
    finite = all(torch.isfinite(t).all().item() for t in (out, lse, dq, dk, dv))
    ok = finite and det and all(e < 2e-2 for e in errs.values())
    line = f"check {dt_name(dtype)} b{b} s{s} h{heads}/{kv_heads} d{d} causal={int(causal)}: " + " ".join(f"{k}={v:.2e}" for k, v in errs.items()) + f" det={det} {'OK' if ok else 'FAIL'}"
    log(line)
    return ok


def inputs(s, d, dtype=torch.bfloat16, tokens=16384, width=2048):
    b, heads = max(1, tokens // s), width // d
    torch.manual_seed(0)
    mk = lambda: torch.randn(b, s, heads * d, device="cuda").to(dtype)
    return b, heads, mk(), mk(), mk(), mk()


def time_ours(K, s, d, causal):
    """TFLOP/s of the forward, the backward, and milliseconds of the backward's dK/dV and dQ
    kernels (each with the small dsum kernel)."""
    b, heads, q, k, v, dout = inputs(s, d)
    out, lse = fwd(K, q, k, v, heads, heads, causal)
    tf = median_ms(lambda: fwd(K, q, k, v, heads, heads, causal))
    tb = median_ms(lambda: bwd(K, dout, q, k, v, out, lse, heads, heads, causal))
    tkv = median_ms(lambda: bwd(K, dout, q, k, v, out, lse, heads, heads, causal, ("dkdv",)))
    tq = median_ms(lambda: bwd(K, dout, q, k, v, out, lse, heads, heads, causal, ("dq",)))
    fl = flops(b, s, heads, d, causal)
    return fl / tf / 1e9, 2.5 * fl / tb / 1e9, tkv, tq


def time_torch(s, d, causal, backend):
    return time_sdpa(s, d, causal, backend)


def gpt_shapes(lines):
    """Milliseconds of the forward, dK/dV and dQ kernels of every swept variant at the GPT's
    shapes (batch x seq: 16 x 256, 4 x 1024, 1 x 4096; 8 heads of 64; causal; bf16): small grids,
    where the causal rows' unequal work decides more than a kernel's peak rate."""
    n = max(len(v) for v in SWEEP.values())
    shapes = ((16, 256), (4, 1024), (1, 4096))
    for i in range(n):
        cfgs = {k: v[min(i, len(v) - 1)] for k, v in SWEEP.items()}
        K = Kernels(cfgs)
        row = []
        for b, s in shapes:
            torch.manual_seed(0)
            mk = lambda: torch.randn(b, s, 8 * 64, device="cuda").to(torch.bfloat16)
            q, k, v, dout = mk(), mk(), mk(), mk()
            out, lse = fwd(K, q, k, v, 8, 8, True)
            tf = median_ms(lambda: fwd(K, q, k, v, 8, 8, True), reps=50)
            tkv = median_ms(lambda: bwd(K, dout, q, k, v, out, lse, 8, 8, True, ("dkdv",)), reps=50)
            tq = median_ms(lambda: bwd(K, dout, q, k, v, out, lse, 8, 8, True, ("dq",)), reps=50)
            row.append(f"{b}x{s} fwd {tf * 1e3:.0f} dkv {tkv * 1e3:.0f} dq {tq * 1e3:.0f} us")
        cf = {kk: cfgs[kk + "64"] for kk in ("FWD", "DKV", "DQ")}
        line = f"gpt shapes v{i} {cf}: " + "  ".join(row)
        print(line, flush=True)
        lines.append(line)
    from torch.nn.attention import SDPBackend, sdpa_kernel
    for name, be in (("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION)):
        row = []
        for b, s in shapes:
            torch.manual_seed(0)
            mk = lambda: torch.randn(b, 8, s, 64, device="cuda").to(torch.bfloat16).requires_grad_(True)
            q, k, v, dout = mk(), mk(), mk(), mk()
            with sdpa_kernel([be]):
                o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
                tf = median_ms(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True), reps=50)
                tb = median_ms(lambda: torch.autograd.grad(o, (q, k, v), dout, retain_graph=True), reps=50)
            row.append(f"{b}x{s} fwd {tf * 1e3:.0f} bwd {tb * 1e3:.0f} us")
        line = f"gpt shapes torch {name}: " + "  ".join(row)
        print(line, flush=True)
        lines.append(line)
    return 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp"))
    ap.add_argument("--no-sweep", action="store_true")
    ap.add_argument("--gpt-shapes", action="store_true",
                    help="time every variant's kernels at the GPT's attention shapes (8 heads of 64, causal) and stop")
    ap.add_argument("--profile", action="store_true",
                    help="run the runtime's tiles once at seq 4096, head dim 64, causal (for ncu) and stop")
    args = ap.parse_args()
    if args.profile:
        K = Kernels({k: v[0] for k, v in SWEEP.items()})
        b, heads, q, k, v, dout = inputs(4096, 64)
        out, lse = fwd(K, q, k, v, heads, heads, True)
        bwd(K, dout, q, k, v, out, lse, heads, heads, True)
        torch.cuda.synchronize()
        return 0
    lines = []
    if args.gpt_shapes:
        return gpt_shapes(lines)

    def log(s):
        print(s, flush=True)
        lines.append(s)

    log(f"GPU: {torch.cuda.get_device_name()} torch {torch.__version__} cupy {cp.__version__}")
    n = 1 if args.no_sweep else max(len(v) for v in SWEEP.values())
    variants = []
    for i in range(n):
        cfgs = {k: v[min(i, len(v) - 1)] for k, v in SWEEP.items()}
        K = Kernels(cfgs)
        log(f"variant {i}: {cfgs} compiled in {K.compile_s:.1f} s")
        variants.append(K)
    K0 = variants[0]
    # Registers and local memory of every kernel of every variant.
    for i, K in enumerate(variants):
        regs = []
        for d in (64, 128):
            for name, kind in ((f"flash_fwd_bf16_d{d}", "FWD"), (f"flash_bwd_dq_bf16_d{d}", "DQ"), (f"flash_bwd_dkdv_bf16_d{d}", "DKV")):
                r, l = K.regs(name, kind, d)
                regs.append(f"{kind}{d}:{r}r/{l}B")
        log(f"variant {i} registers/local: " + " ".join(regs))

    # Correctness of the default variant (every dtype, head dim, odd lengths, GQA), then of each
    # swept variant on two shapes.
    ok = True
    for dtype in (torch.bfloat16, torch.float16):
        for d in (64, 128):
            for causal in (True, False):
                for (b, s, h, kvh) in ((2, 1, 4, 4), (2, 63, 4, 2), (1, 257, 4, 1), (2, 300, 8, 8), (1, 1024, 2, 2)):
                    ok &= check(K0, dtype, b, s, h, kvh, d, causal, log)
    for i, K in enumerate(variants[1:], 1):
        for d in (64, 128):
            for causal in (True, False):
                ok &= check(K, torch.bfloat16, 2, 257, 4, 2, d, causal, lambda s: log(f"v{i} " + s))
    log(f"correctness: {'ALL OK' if ok else 'FAILURES'}")

    results = {"lines": lines}
    # Sweep: each variant's time per kernel kind at seq 1024 and 4096 (geometric mean of the
    # four shapes); the best of each kind is compiled into one module for the table.
    best = {}
    if len(variants) > 1:
        for d in (64, 128):
            for i, K in enumerate(variants):
                row, score = [], {"FWD": 0.0, "DKV": 0.0, "DQ": 0.0}
                for s in (1024, 4096):
                    for causal in (True, False):
                        f, bw, tkv, tq = time_ours(K, s, d, causal)
                        score["FWD"] += math.log(f)
                        score["DKV"] -= math.log(tkv)
                        score["DQ"] -= math.log(tq)
                        row.append(f"s{s}{'c' if causal else 'n'} {f:.0f}/{bw:.0f} ({tkv:.2f}+{tq:.2f} ms)")
                cf = {k: K.cfgs[f"{k}{d}"] for k in ("FWD", "DQ", "DKV")}
                log(f"sweep d{d} v{i} {cf}: " + "  ".join(row))
                for kind, sc in score.items():
                    if (kind, d) not in best or sc > best[(kind, d)][0]:
                        best[(kind, d)] = (sc, i)
        log("best: " + ", ".join(f"{k[0]}{k[1]}=v{v[1]} {variants[v[1]].cfgs[k[0] + str(k[1])]}" for k, v in sorted(best.items())))
        cfgs = {f"{k[0]}{k[1]}": variants[v[1]].cfgs[f"{k[0]}{k[1]}"] for k, v in best.items()}
        cfgs.update({k: v[0] for k, v in SWEEP.items() if k.endswith("S64")})
        KB = Kernels(cfgs)
        for d in (64, 128):
            for causal in (True, False):
                ok &= check(KB, torch.bfloat16, 2, 257, 4, 2, d, causal, lambda s: log("best " + s))
        log(f"correctness of the best: {'ALL OK' if ok else 'FAILURES'}")
    else:
        KB = K0
    # The table with the best variant per (kind, head dim) next to torch.
    seqs = (1024, 4096) if args.quick else (512, 1024, 2048, 4096, 8192)
    table = []
    log("| seq | d | causal | ours fwd | torch flash fwd | torch cudnn fwd | ours bwd | torch flash bwd | torch cudnn bwd |")
    log("|---|---|---|---|---|---|---|---|---|")
    for d in (64, 128):
        for causal in (True, False):
            for s in seqs:
                f, bw, _, _ = time_ours(KB, s, d, causal)
                tfl, tbl, _ = time_torch(s, d, causal, "flash")
                tfc, tbc, err = time_torch(s, d, causal, "cudnn")
                fmt = lambda x: "-" if x is None else f"{x:.0f}"
                log(f"| {s} | {d} | {int(causal)} | {f:.0f} | {fmt(tfl)} | {fmt(tfc)} | {bw:.0f} | {fmt(tbl)} | {fmt(tbc)} |")
                table.append(dict(seq=s, d=d, causal=causal, fwd=f, bwd=bw, torch_flash_fwd=tfl, torch_flash_bwd=tbl, torch_cudnn_fwd=tfc, torch_cudnn_bwd=tbc))
    results["table"] = table
    results["best"] = KB.cfgs
    with open(os.path.join(args.out, "flash_sweep.json"), "w") as fh:
        json.dump(results, fh, indent=1)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
