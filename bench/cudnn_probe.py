"""What cuDNN's fused attention is on this machine: its version and library, the backend graph
PyTorch's cuDNN SDPA builds (cuDNN's API log and cudnn-frontend's log, one file per shape), the
speed of forward and backward, and whether its backward is bitwise reproducible run to run.
   python3 bench/cudnn_probe.py            (writes logs under $OUT)"""
import os, subprocess, sys, json

OUT = os.environ.get("OUT", "/tmp/probe")
SHAPES = [(4, 8, 1024, 64), (1, 8, 4096, 64), (1, 16, 4096, 128)]


def child(b, h, s, d, log):
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import sdpa_kernel, SDPBackend
    torch.manual_seed(0)
    dev = "cuda"
    # [batch, seq, heads * d] as the GPT's projections write it, viewed as [b, h, s, d]
    mk = lambda: torch.randn(b, s, h, d, device=dev, dtype=torch.bfloat16).transpose(1, 2).requires_grad_()
    q, k, v = mk(), mk(), mk()
    do = torch.randn(b, s, h, d, device=dev, dtype=torch.bfloat16).transpose(1, 2)
    with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
        outs = []
        for it in range(3 if log else 8):
            q.grad = k.grad = v.grad = None
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            o.backward(do)
            outs.append((o.detach().clone(), q.grad.clone(), k.grad.clone(), v.grad.clone()))
        torch.cuda.synchronize()
        same = [all(torch.equal(a, b2) for a, b2 in zip(outs[0], x)) for x in outs[1:]]
        res = {"shape": [b, h, s, d], "bitwise_same_runs": same}
        if not log:
            import time
            def t(fn, n=20):
                for _ in range(3): fn()
                torch.cuda.synchronize(); e0 = torch.cuda.Event(True); e1 = torch.cuda.Event(True)
                e0.record()
                for _ in range(n): fn()
                e1.record(); torch.cuda.synchronize(); return e0.elapsed_time(e1) / n * 1e3
            fwd = t(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True))
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            both = t(lambda: torch.autograd.grad(F.scaled_dot_product_attention(q, k, v, is_causal=True), (q, k, v), do))
            flops = 4 * b * h * s * s * d / 2
            res.update(fwd_us=fwd, fwd_bwd_us=both, fwd_tflops=flops / fwd / 1e6, bwd_tflops=2.5 * flops / (both - fwd) / 1e6)
        print(json.dumps(res), flush=True)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "child":
        b, h, s, d, log = map(int, sys.argv[2:7])
        child(b, h, s, d, log)
        sys.exit(0)
    os.makedirs(OUT, exist_ok=True)
    import torch
    print("torch", torch.__version__, "cudnn", torch.backends.cudnn.version(), flush=True)
    torch.zeros(1, device="cuda")
    import glob
    libs = sorted(set(glob.glob(os.path.join(os.path.dirname(torch.__file__), "..", "nvidia", "cudnn", "lib", "*"))))
    print("cudnn libs:", [os.path.realpath(l) for l in libs], flush=True)
    for (b, h, s, d) in SHAPES:
        tag = f"b{b}_h{h}_s{s}_d{d}"
        env = dict(os.environ, CUDNN_LOGLEVEL_DBG="3", CUDNN_LOGDEST_DBG=f"{OUT}/cudnn_api_{tag}.log",
                   CUDNN_FRONTEND_LOG_INFO="1", CUDNN_FRONTEND_LOG_FILE=f"{OUT}/cudnn_fe_{tag}.log")
        r = subprocess.run([sys.executable, __file__, "child", str(b), str(h), str(s), str(d), "1"], env=env,
                           capture_output=True, text=True, timeout=300)
        print("logged", tag, r.stdout.strip(), r.stderr[-2000:], flush=True)
        r = subprocess.run([sys.executable, __file__, "child", str(b), str(h), str(s), str(d), "0"],
                           capture_output=True, text=True, timeout=300)
        print("timed", tag, r.stdout.strip(), r.stderr[-2000:], flush=True)
    for f in sorted(glob.glob(f"{OUT}/cudnn_*.log")):
        print(f, os.path.getsize(f))
