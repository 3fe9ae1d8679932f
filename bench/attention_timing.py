"""Timing shared by the attention benchmarks (bench/flash_sweep.py, bench/compare_attention.py):
CUDA-event medians, FlashAttention's FLOP count, and PyTorch's SDPA with one backend."""
import numpy as np
import torch
import torch.nn.functional as F


def median_ms(fn, reps=20, warm=3):
    """Median milliseconds of `fn` on the current stream, after `warm` untimed calls."""
    for _ in range(warm):
        fn()
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
    for a, e in ev:
        a.record()
        fn()
        e.record()
    torch.cuda.synchronize()
    return float(np.median([a.elapsed_time(e) for a, e in ev]))


def flops(b, s, heads, d, causal):
    """Forward FLOPs (two products), halved when causal; the backward counts 2.5 times this."""
    f = 4.0 * b * heads * s * s * d
    return f / 2 if causal else f


def time_sdpa(s, d, causal, backend, tokens=16384, width=2048):
    """TFLOP/s forward and backward (through autograd) of `scaled_dot_product_attention` with
    `backend` ("flash" or "cudnn") at seq `s`, head dim `d`, `tokens` tokens of `width` features
    a call, bf16; (None, None, why) when the backend refuses the shape."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    b, heads = max(1, tokens // s), width // d
    torch.manual_seed(0)
    mk = lambda: torch.randn(b, heads, s, d, device="cuda").to(torch.bfloat16).requires_grad_(True)  # noqa: E731
    q, k, v, dout = mk(), mk(), mk(), mk()
    be = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}[backend]
    try:
        with sdpa_kernel([be]):
            o = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
            tf = median_ms(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal))
            tb = median_ms(lambda: torch.autograd.grad(o, (q, k, v), dout, retain_graph=True))
    except Exception as e:  # a backend that refuses the shape
        return None, None, str(e).splitlines()[0][:80]
    fl = flops(b, s, heads, d, causal)
    return fl / tf / 1e9, 2.5 * fl / tb / 1e9, None
