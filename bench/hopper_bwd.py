#!/usr/bin/env python3
"""The Hopper attention backward (runtime/backend/kernels/flash_hopper.cu) on the GPU machine:
wgmma layout tests, correctness against a float32 reference and the portable kernels, bitwise
reproducibility, and time at the GPT's attention shapes next to the portable backward and
PyTorch's SDPA backward (cuDNN, FlashAttention-2) in the same run.

Compiles the runtime's core.cu, ops.cu, half.cu, flash.cu and flash_hopper.cu with
bench/hopper_bwd.cu (the wgmma layout tests) appended, for sm_90a (wgmma needs the
architecture-specific target), once per variant of the dQ sum (flash_hopper.cu's HB_TURN: 1 the
runtime's ordered sum, 0 none at all, timed only, to show what the sum costs).

Checks, each a line with OK or FAIL:
- the wgmma operand forms the kernel uses (K-major x K-major at n64 and n128, registers x
  N-major, M-major x N-major) against torch matmul, exact to float32 rounding;
- dq, dk, dv against flash_sweep's float32 reference (relative error < 2e-2, and beside the
  portable kernels' own error on the same inputs), at short, odd, grouped-query and causal
  shapes in bf16 and f16;
- two runs give the same bits, no block gave up waiting for its turn, and the turn counters are
  back at zero.

Timing (CUDA-event medians): our backward (the dsum kernel and the one-pass kernel), the portable
backward (dsum, dK/dV, dQ), PyTorch's SDPA backward through autograd with the cuDNN and the
FlashAttention backends, at batch x seq 16 x 256, 4 x 1024, 1 x 4096 (8 heads of 64, causal:
the GPT's) and 4 x 4096 x 16 heads; TFLOP/s counts five products (FlashAttention's convention).

    python3 bench/hopper_bwd.py [--quick] [--out DIR]
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

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import flash_sweep as fs  # noqa: E402
from attention_timing import flops, median_ms  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


# HB_SMEM, HB_THREADS and HB_TILE_F32 in flash_hopper.cu.
SMEM, THREADS, TILE_F32 = 196608 + 2048 + 1024, 384, 8192


class Hopper:
    def __init__(self, turn=1, kernel=None, chains=1):
        """HB_TURN `turn` of flash_hopper.cu with its dQ in `chains` chains, or `kernel` (the
        file before chains, the baseline of a same-call comparison) when given."""
        self.turn = turn
        self.chains = chains
        self.name = (f"turn {turn}" + (f" chains {chains}" if chains > 1 else "")) if kernel is None else f"base {os.path.basename(kernel)}"
        self.base = kernel is not None
        self.smem = SMEM
        kernel = kernel or os.path.join(fs.KDIR, "flash_hopper.cu")
        src = "\n".join((fs.source(), open(kernel).read(), open(os.path.join(HERE, "hopper_bwd.cu")).read()))
        defs = tuple(f"-DFA_{k}={v[0][0]},{v[0][1]},{v[0][2]}" for k, v in fs.SWEEP.items())
        t0 = time.time()
        self.mod = cp.RawModule(code=src, options=("-std=c++17", "--gpu-architecture=sm_90a", f"-DHB_TURN={turn}") + defs)
        self.fn = {}
        for name in ("hb_bwd_bf16_d64", "hb_bwd_f16_d64", "hb_layout_test", "hb_dq_convert_bf16", "hb_dq_convert_f16"):
            f = self.mod.get_function(name)
            f.max_dynamic_shared_size_bytes = self.smem
            self.fn[name] = f
        self.compile_s = time.time() - t0
        self.err = torch.zeros(1, dtype=torch.int32, device="cuda")
        self.sem = torch.zeros(1 << 16, dtype=torch.int32, device="cuda")
        self.acc = torch.empty(0, dtype=torch.float32, device="cuda")

    def regs(self, name):
        f = self.fn[name]
        return f.num_regs, f.local_size_bytes

    def bwd(self, dout, q, k, v, out, lse, heads, kv_heads, causal, dsum=None):
        b, s, w = q.shape
        d = w // heads
        assert d == 64
        name = fs.dt_name(q.dtype)
        if dsum is None:
            dsum = torch.empty((b, heads, s), device=q.device, dtype=torch.float32)
            prep = fs_prep(name)
            n = b * s * heads * d // 8
            prep((min((n + 255) // 256, 65535 * 8),), (256,), (fs.P(dsum), fs.P(dout), fs.P(out), fs.U(b * s), fs.U(s), fs.U(heads), fs.U(d)))
        nt = (s + 127) // 128
        need = b * heads * nt * self.chains * TILE_F32
        if self.acc.numel() < need:
            self.acc = torch.empty(need, dtype=torch.float32, device="cuda")
        assert b * heads * nt * self.chains + 1 <= self.sem.numel()
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        fn = self.fn[f"hb_bwd_{name}_d64"]
        grid = (min(nt * kv_heads * b, SMS),)
        scale = np.float32(1 / math.sqrt(d))
        fn(grid, (THREADS,), (fs.P(self.acc), fs.P(dk), fs.P(dv), fs.P(self.sem), fs.P(self.err), fs.P(q), fs.P(k), fs.P(v), fs.P(dout), fs.P(lse), fs.P(dsum),
                              fs.U(b), fs.U(s), fs.U(heads), fs.U(kv_heads), fs.U(heads * d), fs.U(kv_heads * d), fs.U(int(causal)), scale)
           + (() if self.base else (fs.U(self.chains),)), shared_mem=self.smem)
        conv = (fs.P(dq), fs.P(self.acc), fs.U(s), fs.U(heads), fs.U(heads * d))
        # The baseline's conversion (before chains) takes no causal flag.
        conv += (scale,) if self.base else (fs.U(int(causal)), scale, fs.U(self.chains))
        self.fn[f"hb_dq_convert_{name}"]((nt, heads, b), (256,), conv)
        return dq, dk, dv


_PREP = {}


def fs_prep(name):
    if name not in _PREP:
        _PREP[name] = PORTABLE.mod.get_function(f"flash_bwd_prep_{name}")
    return _PREP[name]


PORTABLE = None
SMS = 1


def layout_tests(H, log):
    ok = True
    torch.manual_seed(1)
    a = torch.randn(64, 64, device="cuda").to(torch.bfloat16)
    b = torch.randn(128, 64, device="cuda").to(torch.bfloat16)
    af, bf = a.float(), b.float()
    want = {0: af @ bf[:64].T, 1: af @ bf[:64], 2: af.T @ bf[:64], 3: af @ bf.T}
    names = {0: "A K-major x B K-major (S = K.Q^T)", 1: "A registers x B N-major (dV += P^T.dO)", 2: "A M-major x B N-major (dQ = dS.K)",
             3: "A K-major x B K-major, n128 (S = K.Q^T, 128 queries)"}
    for mode in (0, 1, 2, 3):
        c = torch.full((64, 128 if mode == 3 else 64), float("nan"), device="cuda")
        H.fn["hb_layout_test"]((1,), (128,), (fs.P(c), fs.P(a), fs.P(b), fs.U(mode)), shared_mem=H.smem)
        torch.cuda.synchronize()
        err = (c - want[mode]).abs().max().item()
        good = err < 1e-3
        # Which known layout it did compute, when it is wrong: a hint for the descriptor.
        hint = ""
        if not good:
            b64 = bf[:64]
            alts = {"a.b^T": af @ b64.T, "a.b": af @ b64, "a^T.b": af.T @ b64, "a^T.b^T": af.T @ b64.T} if mode != 3 else {"a.b^T": af @ bf.T}
            hint = " closest: " + ", ".join(f"{k} {(c - v).abs().max().item():.2e}" for k, v in alts.items())
        log(f"{H.name} layout mode {mode} {names[mode]}: max err {err:.2e} {'OK' if good else 'FAIL'}{hint}")
        ok &= good
    return ok


def check(H, dtype, b, s, heads, kv_heads, causal, log):
    torch.manual_seed(s * 7 + heads + int(causal))
    d = 64
    q = torch.randn(b, s, heads * d, device="cuda").to(dtype)
    k = torch.randn(b, s, kv_heads * d, device="cuda").to(dtype)
    v = torch.randn(b, s, kv_heads * d, device="cuda").to(dtype)
    dout = torch.randn(b, s, heads * d, device="cuda").to(dtype)
    out, lse = fs.fwd(PORTABLE, q, k, v, heads, kv_heads, causal)
    H.err.zero_()
    dq, dk, dv = H.bwd(dout, q, k, v, out, lse, heads, kv_heads, causal)
    dq2, dk2, dv2 = H.bwd(dout, q, k, v, out, lse, heads, kv_heads, causal)
    pq, pk, pv = fs.bwd(PORTABLE, dout, q, k, v, out, lse, heads, kv_heads, causal)
    torch.cuda.synchronize()
    _, _, rq, rk, rv = fs.reference(q, k, v, dout, heads, kv_heads, causal)
    errs = dict(dq=fs.rel(dq, rq), dk=fs.rel(dk, rk), dv=fs.rel(dv, rv))
    perr = dict(dq=fs.rel(pq, rq), dk=fs.rel(pk, rk), dv=fs.rel(pv, rv))
    det = all(torch.equal(x, y) for x, y in ((dq, dq2), (dk, dk2), (dv, dv2)))
    finite = all(torch.isfinite(t).all().item() for t in (dq, dk, dv))
    gave_up = H.err.item()
    sem_clean = int(H.sem.abs().sum().item()) == 0
    ok = finite and det and gave_up == 0 and sem_clean and all(e < 2e-2 for e in errs.values())
    log(f"{H.name} check {fs.dt_name(dtype)} b{b} s{s} h{heads}/{kv_heads} causal={int(causal)}: "
        + " ".join(f"{k}={v:.2e}(portable {perr[k]:.2e})" for k, v in errs.items())
        + f" det={det} gave_up={gave_up} sem_clean={sem_clean} {'OK' if ok else 'FAIL'}")
    if not sem_clean:
        H.sem.zero_()
    return ok


def time_shape(Hs, b, s, heads, causal, reps, log):
    torch.manual_seed(0)
    d = 64
    mk = lambda: torch.randn(b, s, heads * d, device="cuda").to(torch.bfloat16)  # noqa: E731
    q, k, v, dout = mk(), mk(), mk(), mk()
    out, lse = fs.fwd(PORTABLE, q, k, v, heads, heads, causal)
    fl = 2.5 * flops(b, s, heads, d, causal)
    row = {}
    for H in Hs:
        H.err.zero_()
        row[f"ours {H.name}"] = median_ms(lambda: H.bwd(dout, q, k, v, out, lse, heads, heads, causal), reps=reps)
        if H.err.item():
            log(f"  {H.name}: {H.err.item()} blocks gave up waiting at this shape")
    row["portable"] = median_ms(lambda: fs.bwd(PORTABLE, dout, q, k, v, out, lse, heads, heads, causal), reps=reps)
    from torch.nn.attention import SDPBackend, sdpa_kernel
    for name, be in (("torch cudnn", SDPBackend.CUDNN_ATTENTION), ("torch flash", SDPBackend.FLASH_ATTENTION)):
        mk4 = lambda: torch.randn(b, heads, s, d, device="cuda").to(torch.bfloat16).requires_grad_(True)  # noqa: E731
        q4, k4, v4, do4 = mk4(), mk4(), mk4(), mk4()
        try:
            with sdpa_kernel([be]):
                o4 = F.scaled_dot_product_attention(q4, k4, v4, is_causal=causal)
                row[name] = median_ms(lambda: torch.autograd.grad(o4, (q4, k4, v4), do4, retain_graph=True), reps=reps)
        except Exception as e:  # a backend that refuses the shape
            log(f"  {name}: refused ({str(e).splitlines()[0][:80]})")
    base = row["portable"]
    log(f"{b}x{s} h{heads} causal={int(causal)}: " + "  ".join(f"{k} {v * 1e3:.0f} us ({fl / v / 1e9:.0f} TF/s, {base / v:.2f}x portable)" for k, v in row.items()))
    return {k: v * 1e3 for k, v in row.items()}


def main():
    global PORTABLE, SMS
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--variants", default="1",
                    help="which variants, each HB_TURN[cCHAINS]: turn 1 (the runtime's sum, 1c2 in two chains) is checked and timed, "
                         "0 (no dQ sum) and 2 (adds without turns) timed only")
    ap.add_argument("--base", default=None,
                    help="another version of flash_hopper.cu (say, git show HEAD~1:... > FILE), timed beside the others in the same run")
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp"))
    args = ap.parse_args()
    variants = [(int(v.split("c")[0]), int(v.split("c")[1]) if "c" in v else 1) for v in args.variants.split(",") if v]
    lines = []

    def log(s):
        print(s, flush=True)
        lines.append(s)

    log(f"GPU: {torch.cuda.get_device_name()} torch {torch.__version__} cupy {cp.__version__} cudnn {torch.backends.cudnn.version()}")
    PORTABLE = fs.Kernels({k: v[0] for k, v in fs.SWEEP.items()})
    SMS = torch.cuda.get_device_properties(0).multi_processor_count
    Hs = []
    for turn, chains in variants:
        try:
            H = Hopper(turn, chains=chains)
        except Exception as e:
            log(f"turn {turn}: compile FAILED: {str(e)[:3000]}")
            continue
        r, l = H.regs("hb_bwd_bf16_d64")
        log(f"{H.name}: compiled in {H.compile_s:.1f} s, hb_bwd_bf16_d64 {r} registers, {l} B local")
        Hs.append(H)
    base = None
    if args.base:
        try:
            base = Hopper(1, args.base)
            log(f"{base.name}: compiled in {base.compile_s:.1f} s (the baseline: timed only)")
        except Exception as e:
            log(f"{args.base}: compile FAILED: {str(e)[:3000]}")
    ok = bool(Hs)
    if Hs:
        ok &= layout_tests(Hs[0], log)
    good = [H for H in Hs if H.turn != 1] + ([base] if base else [])  # timed only
    for H in [H for H in Hs if H.turn == 1]:
        hok = True
        shapes = [(1, 128, 1, 1), (2, 300, 4, 2), (1, 1024, 8, 8), (2, 257, 4, 1), (1, 64, 2, 2), (3, 70, 2, 2)]
        for dtype in (torch.bfloat16, torch.float16):
            for causal in (True, False):
                for (b, s, h, kvh) in (shapes if dtype == torch.bfloat16 else shapes[:2]):
                    hok &= check(H, dtype, b, s, h, kvh, causal, log)
        hok &= check(H, torch.bfloat16, 1, 4096, 8, 8, True, log)
        log(f"{H.name} correctness: {'ALL OK' if hok else 'FAILURES'}")
        ok &= hok
        if hok:
            good.append(H)
    results = {"lines": lines, "times_us": {}}
    if good:
        reps = 10 if args.quick else 30
        for (b, s, h) in ((16, 256, 8), (4, 1024, 8), (1, 4096, 8), (4, 4096, 16)):
            results["times_us"][f"{b}x{s}x{h}"] = time_shape(good, b, s, h, True, reps, log)
        if not args.quick:
            results["times_us"]["1x4096x8 noncausal"] = time_shape(good, 1, 4096, 8, False, reps, log)
    log(f"hopper_bwd: {'ALL OK' if ok else 'FAILURES'}")
    with open(os.path.join(args.out, "hopper_bwd.json"), "w") as fh:
        json.dump(results, fh, indent=1)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
