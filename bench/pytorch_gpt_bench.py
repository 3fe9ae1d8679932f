"""PyTorch's side of the GPT benchmark (#13): the model of examples/gpt (8 pre-norm blocks of
RMSNorm, causal attention, SwiGLU; d_model 512, 8 heads, context 256, batch 16, byte vocabulary,
learned positions, untied head), trained with AdamW on the repository's own text, float32 with
TF32 off, or (`--dtype bf16`) under `torch.autocast(bfloat16)` with float32 weights (PyTorch's
mixed precision; autocast's weight cache off, as CUDA graphs need), in three ways:

- eager: the model called directly;
- per-layer graphs: `torch.cuda.make_graphed_callables` on the tuple of blocks (the embeddings,
  the head and the loss run eagerly around them, as in examples/gpt);
- one graph per step: the whole training step (forward, loss, backward, AdamW with
  capturable=True) captured once and replayed (the floor);
- compile: `torch.compile(forward_and_loss, mode="reduce-overhead")` (Inductor's Triton kernels,
  SDPA's flash attention, CUDA graph trees), `torch.compiler.cudagraph_mark_step_begin()` before
  each step, AdamW with `fused=True`, `zero_grad(set_to_none=True)` (with `set_to_none=False`
  cudagraph trees raise "accessing tensor output of CUDAGraphs that has been overwritten");
- compile_max: the same with `mode="max-autotune"` (only when asked for: its compile is long);
- compile_stacked: compile with q, k and v as one Linear and gate and up as one (each output
  chunked), as graphed's GPT stores them (and as nanoGPT's c_attn and gpt-fast's wqkv do): the
  same math in fewer, wider GEMMs.

Each variant runs the same loop as examples/gpt: a random batch of the training bytes made on the
host and copied to the GPU, one step, the loss read back every 20 steps; tokens/s over `--steps`
steps after `--warmup` steps. Run from the repository root:
    python3 bench/pytorch_gpt_bench.py [--steps 200] [--dtype f32|bf16] [--context 256 --batch 16]
        [--variants eager,per_layer,floor,compile] [--out gpt_torch.json]
"""

import argparse
import glob
import json
import math
import os
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

L, D, HEADS, CTX, BATCH, HIDDEN, VOCAB, EPS = 8, 512, 8, 256, 16, 1368, 256, 1e-5


def corpus_parts():
    """The training (first 90%) and validation (the rest) bytes of examples/gpt's text."""
    paths = ["README.md"] + sorted(glob.glob("docs/**/*.md", recursive=True))
    for d in ["runtime", "macros", "examples"]:
        paths += sorted(glob.glob(f"{d}/**/*.rs", recursive=True))
    data = b"".join(open(p, "rb").read() for p in paths if os.path.isfile(p))
    cut = len(data) * 9 // 10
    return tuple(torch.frombuffer(bytearray(part), dtype=torch.uint8) for part in (data[:cut], data[cut:]))


def corpus():
    return corpus_parts()[0]


class RMSNorm(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.g = nn.Parameter(torch.ones(d))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * self.g


class Block(nn.Module):
    def __init__(self, stacked=False):
        super().__init__()
        self.stacked = stacked
        self.n1, self.n2 = RMSNorm(D), RMSNorm(D)
        if stacked:
            self.qkv, self.gate_up = nn.Linear(D, 3 * D, bias=False), nn.Linear(D, 2 * HIDDEN, bias=False)
        else:
            self.q, self.k, self.v = (nn.Linear(D, D, bias=False) for _ in range(3))
            self.gate, self.up = nn.Linear(D, HIDDEN, bias=False), nn.Linear(D, HIDDEN, bias=False)
        self.o = nn.Linear(D, D, bias=False)
        self.down = nn.Linear(HIDDEN, D, bias=False)

    def forward(self, x):
        b, s, _ = x.shape
        h = self.n1(x)
        split = lambda t: t.view(b, s, HEADS, D // HEADS).transpose(1, 2)
        if self.stacked:
            q, k, v = self.qkv(h).chunk(3, dim=-1)
        else:
            q, k, v = self.q(h), self.k(h), self.v(h)
        a = F.scaled_dot_product_attention(split(q), split(k), split(v), is_causal=True)
        x = x + self.o(a.transpose(1, 2).reshape(b, s, D))
        h = self.n2(x)
        if self.stacked:
            gate, up = self.gate_up(h).chunk(2, dim=-1)
        else:
            gate, up = self.gate(h), self.up(h)
        return x + self.down(F.silu(gate) * up)


class Ends(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok, self.pos = nn.Embedding(VOCAB, D), nn.Embedding(CTX, D)
        self.norm, self.head = RMSNorm(D), nn.Linear(D, VOCAB, bias=False)


def batch(train, gen):
    starts = torch.randint(0, len(train) - CTX - 1, (BATCH,), generator=gen)
    rows = torch.stack([train[s:s + CTX + 1] for s in starts.tolist()]).long()
    return rows[:, :-1].cuda(non_blocking=False), rows[:, 1:].cuda(non_blocking=False)


def autocast(dtype):
    return torch.autocast("cuda", dtype=torch.bfloat16, enabled=(dtype == "bf16"), cache_enabled=False)


def make(variant, dtype):
    torch.manual_seed(0)
    blocks = nn.ModuleList(Block(stacked=variant == "compile_stacked") for _ in range(L)).cuda()
    ends = Ends().cuda()
    params = list(blocks.parameters()) + list(ends.parameters())
    compiled = variant.startswith("compile")
    opt = torch.optim.AdamW(params, lr=6e-4, weight_decay=0.0, capturable=(variant == "floor"), fused=compiled or None)
    pos = torch.arange(CTX, device="cuda")
    layers = list(blocks)
    if variant == "per_layer":
        x = torch.randn(BATCH, CTX, D, device="cuda", requires_grad=True)
        with autocast(dtype):
            layers = list(torch.cuda.make_graphed_callables(tuple(layers), tuple((x,) for _ in layers)))

    def forward_and_loss(ids, labels):
        with autocast(dtype):
            x = ends.tok(ids) + ends.pos(pos)
            for layer in layers:
                x = layer(x)
            logits = ends.head(ends.norm(x))
            return F.cross_entropy(logits.view(-1, VOCAB).float(), labels.reshape(-1))

    if compiled:
        mode = "max-autotune" if variant == "compile_max" else "reduce-overhead"
        fwd = torch.compile(forward_and_loss, mode=mode)

        def step(ids, labels):
            torch.compiler.cudagraph_mark_step_begin()
            loss = fwd(ids, labels)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            return loss
    else:
        def step(ids, labels):
            loss = forward_and_loss(ids, labels)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=False)
            return loss

    return step, params


def run(variant, dtype, steps, warmup, train):
    gen = torch.Generator().manual_seed(1)
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_reserved()
    t0 = time.perf_counter()
    step, params = make(variant, dtype)
    if variant == "floor":
        ids, labels = batch(train, gen)
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(3):
                step(ids, labels)
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            static_loss = step(ids, labels)

        def graphed(new_ids, new_labels):
            ids.copy_(new_ids)
            labels.copy_(new_labels)
            g.replay()
            return static_loss

        run_step = graphed
    else:
        run_step = step
    torch.cuda.synchronize()
    capture_s = time.perf_counter() - t0
    for _ in range(warmup):
        run_step(*batch(train, gen))
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for i in range(1, steps + 1):
        loss = run_step(*batch(train, gen))
        if i % 20 == 0:
            loss.item()
    torch.cuda.synchronize()
    secs = time.perf_counter() - t0
    # The most the variant held at once (model, optimizer, activations, graph pools), above what
    # was reserved before it started.
    pool_mb = (torch.cuda.max_memory_reserved() - before) / 1e6
    return {"variant": variant, "dtype": dtype, "context": CTX, "batch": BATCH, "tokens_per_s": BATCH * CTX * steps / secs, "step_ms": secs / steps * 1e3,
            "setup_s": capture_s, "reserved_mb": pool_mb, "loss": float(loss.item())}


def profile(dtype, train):
    """GPU time of one eager step by kernel (torch.profiler), for comparison with ours."""
    gen = torch.Generator().manual_seed(1)
    step, _ = make("eager", dtype)
    for _ in range(3):
        step(*batch(train, gen))
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        step(*batch(train, gen))
        torch.cuda.synchronize()
    events = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    total = sum(e.device_time for e in events)
    print(f"[torch profile {dtype}] one eager step: {len(events)} kernels, {total:.0f} us of GPU time")
    by = {}
    for e in events:
        c, t = by.get(e.name[:70], (0, 0.0))
        by[e.name[:70]] = (c + 1, t + e.device_time)
    for name, (c, t) in sorted(by.items(), key=lambda kv: -kv[1][1])[:25]:
        print(f"{t:9.1f} us {100 * t / total:5.1f}%  x{c:<4d} {name}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--dtype", default="f32", choices=["f32", "bf16"])
    ap.add_argument("--context", type=int, default=256)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--variants", default="eager,per_layer,floor,compile",
                    help="comma-separated: eager, per_layer, floor, compile, compile_max, compile_stacked")
    ap.add_argument("--out", default="gpt_torch.json")
    ap.add_argument("--profile", action="store_true", help="print where one eager step's GPU time goes")
    a = ap.parse_args()
    global CTX, BATCH
    CTX, BATCH = a.context, a.batch
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    train = corpus()
    if a.profile:
        profile(a.dtype, train)
        return
    rows = []
    for variant in a.variants.split(","):
        try:
            r = run(variant, a.dtype, a.steps, a.warmup, train)
        except Exception as e:  # a variant that fails on this machine is reported, not fatal
            print(f"[torch gpt {a.dtype}] {variant:>10}: FAILED: {str(e).splitlines()[0][:200]}", flush=True)
            continue
        print(f"[torch gpt {a.dtype} {CTX}x{BATCH}] {variant:>10}: {r['tokens_per_s']:>9.0f} tokens/s, {r['step_ms']:.2f} ms/step, "
              f"setup {r['setup_s']:.2f} s, reserved {r['reserved_mb']:.0f} MB, loss {r['loss']:.3f}", flush=True)
        rows.append(r)
        torch.cuda.empty_cache()
    json.dump({"torch": torch.__version__, "device": torch.cuda.get_device_name(), "results": rows},
              open(a.out, "w"), indent=1)


if __name__ == "__main__":
    main()
