"""PyTorch's side of the GPT decoding benchmark: the model of examples/gpt (as in
bench/pytorch_gpt_bench.py: 8 pre-norm blocks of RMSNorm, causal attention, SwiGLU; d_model
512, 8 heads, context 256, byte vocabulary, learned positions, untied head) in bf16, decoding
with a static KV cache the way gpt-fast does: caches [batch, heads, context, head_dim] as module
buffers, each step writing its keys and values with index_copy_ and attending over the whole
cache with a mask (SDPA); the decode step under torch.compile(mode="reduce-overhead") (CUDA
graph trees), the prefill compiled the same way. Greedy, no end token: every request is prompts
of --prompt-len continued by exactly --new-tokens, as `gpt --decode-bench` runs them.

Weights: with --load, the safetensors file `gpt --save` writes (names as graphed's state_dict
writes them: embed.tok, blocks.0.w_qkv, head.head, ...); without it, random weights of the same
shapes (decoding speed does not depend on them). Prompts are random bytes.

Prints one line per batch size and writes the same JSON fields as `gpt --decode-bench --json`:
tokens/s and per-token latency from the median of --reps requests (prefill included), CPU time
per token (process CPU time over the requests / tokens), host launches per request (kernel and
graph launches counted by torch.profiler over one request). Runs on a GPU only. From the
repository root:
    python3 bench/pytorch_gpt_decode.py [--load gpt.safetensors] [--prompt-len 64]
        [--new-tokens 128] [--batches 1,2,4,8,16,32,64] [--reps 5] [--out decode_torch.json]
"""

import argparse
import json
import struct
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

L, D, HEADS, CTX, HIDDEN, VOCAB, EPS = 8, 512, 8, 256, 1368, 256, 1e-5
DTYPE = torch.bfloat16


def rms_norm(x, g):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + EPS)).to(x.dtype) * g


def param(*shape):
    return nn.Parameter(torch.empty(*shape), requires_grad=False)


class Embed(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok, self.pos = param(VOCAB, D), param(CTX, D)


class Head(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm, self.head = param(D), param(VOCAB, D)


class Block(nn.Module):
    """Parameters named as ours (weights [out, in], as F.linear takes them); the caches are
    buffers, so their addresses stay fixed for the CUDA graphs."""

    def __init__(self):
        super().__init__()
        self.norm1, self.norm2 = param(D), param(D)
        # q, k and v as one weight (q rows, then k, then v), and the gate and up projections as
        # one (gate rows, then up), as ours stores them (gpt-fast's wqkv).
        self.w_qkv, self.wo = param(3 * D, D), param(D, D)
        self.w_gate_up, self.w_down = param(2 * HIDDEN, D), param(D, HIDDEN)

    def forward(self, x, pos, mask):
        b, t, _ = x.shape
        h = rms_norm(x, self.norm1)
        split = lambda y: y.view(b, t, HEADS, D // HEADS).transpose(1, 2)
        q, k, v = (split(t) for t in F.linear(h, self.w_qkv).chunk(3, dim=-1))
        self.k_cache.index_copy_(2, pos, k)
        self.v_cache.index_copy_(2, pos, v)
        a = F.scaled_dot_product_attention(q, self.k_cache, self.v_cache, attn_mask=mask)
        x = x + F.linear(a.transpose(1, 2).reshape(b, t, D), self.wo)
        h = rms_norm(x, self.norm2)
        gate, up = F.linear(h, self.w_gate_up).chunk(2, dim=-1)
        return x + F.linear(F.silu(gate) * up, self.w_down)


class Gpt(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed, self.blocks, self.head = Embed(), nn.ModuleList(Block() for _ in range(L)), Head()
        self.register_buffer("causal", torch.tril(torch.ones(CTX, CTX, dtype=torch.bool)), persistent=False)

    def set_batch(self, batch):
        for b in self.blocks:
            shape = (batch, HEADS, CTX, D // HEADS)
            b.register_buffer("k_cache", torch.zeros(shape, dtype=DTYPE, device="cuda"), persistent=False)
            b.register_buffer("v_cache", torch.zeros(shape, dtype=DTYPE, device="cuda"), persistent=False)

    def forward(self, ids, pos):
        """ids [batch, t] at positions pos [t]: writes the caches there; the greedy next token
        after the last position of each row."""
        x = F.embedding(ids, self.embed.tok) + F.embedding(pos, self.embed.pos)
        mask = self.causal[pos]
        for b in self.blocks:
            x = b(x, pos, mask)
        logits = F.linear(rms_norm(x[:, -1], self.head.norm), self.head.head)
        return logits.argmax(-1)


def load_safetensors(path):
    """The tensors of a safetensors file (8-byte header length, JSON header, raw data)."""
    kinds = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32}
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header, data = json.loads(f.read(n)), f.read()
    return {name: torch.frombuffer(bytearray(data[e["data_offsets"][0]:e["data_offsets"][1]]), dtype=kinds[e["dtype"]]).view(e["shape"])
            for name, e in header.items() if name != "__metadata__"}


def model(load):
    torch.manual_seed(0)
    m = Gpt()
    if load:
        tensors = load_safetensors(load)
        params = dict(m.named_parameters())
        missing = sorted(set(params) ^ set(tensors))
        if missing:
            raise SystemExit(f"{load}: names that do not match the model: {missing[:6]}")
        for name, p in params.items():
            if tuple(tensors[name].shape) != tuple(p.shape):
                raise SystemExit(f"{load}: {name} is {list(tensors[name].shape)}, the model's {list(p.shape)}")
            p.data = tensors[name].to(torch.float32).clone()
    else:
        for name, p in m.named_parameters():
            nn.init.ones_(p) if p.dim() == 1 else nn.init.normal_(p, std=0.02)
    return m.to(device="cuda", dtype=DTYPE)


def request(prefill, step, prompts, new_tokens, out):
    """One request: the prefill, then new_tokens - 1 decode steps, each feeding its token to
    the next (as gpt-fast's loop does); waits for the device at the end."""
    batch, plen = prompts.shape
    torch.compiler.cudagraph_mark_step_begin()
    tok = prefill(prompts, torch.arange(plen, device="cuda")).clone()
    out[:, 0] = tok
    pos = torch.full((1,), plen, dtype=torch.long, device="cuda")
    for i in range(1, new_tokens):
        torch.compiler.cudagraph_mark_step_begin()
        nxt = step(tok[:, None], pos)
        out[:, i] = nxt
        tok = nxt.clone()
        pos += 1
    torch.cuda.synchronize()


def launches(run):
    """Kernel and graph launches the host issued during run() (torch.profiler), or None."""
    try:
        from torch.profiler import ProfilerActivity, profile
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            run()
        return sum(1 for e in prof.events() if "LaunchKernel" in e.name or e.name in ("cudaGraphLaunch", "cuGraphLaunch"))
    except Exception as e:  # a profiler that cannot start leaves the figure out
        print(f"launch count unavailable: {e}")
        return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--load", help="weights from `gpt --save` (default: random)")
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--batches", default="1,2,4,8,16,32,64")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--out", default="decode_torch.json")
    a = ap.parse_args()
    if a.prompt_len + a.new_tokens > CTX:
        raise SystemExit(f"prompt {a.prompt_len} + {a.new_tokens} new tokens exceed the context {CTX}")
    torch._dynamo.config.cache_size_limit = 64
    torch.backends.cuda.matmul.allow_tf32 = False
    m = model(a.load)
    prefill = torch.compile(m, mode="reduce-overhead", fullgraph=True, dynamic=False)
    step = prefill  # the same function at one position: its own graph per shape
    rows = []
    for batch in [int(b) for b in a.batches.split(",")]:
        with torch.no_grad():
            m.set_batch(batch)
            torch._dynamo.reset()
            prompts = torch.randint(0, VOCAB, (batch, a.prompt_len), device="cuda")
            out = torch.empty(batch, a.new_tokens, dtype=torch.long, device="cuda")
            run = lambda: request(prefill, step, prompts, a.new_tokens, out)
            t0 = time.perf_counter()
            for _ in range(3):  # compiles, records the graphs, warms up
                run()
            compile_s = time.perf_counter() - t0
            cpu0, secs = time.process_time(), []
            for _ in range(a.reps):
                t0 = time.perf_counter()
                run()
                secs.append(time.perf_counter() - t0)
            cpu = time.process_time() - cpu0
            n_launch = launches(run)
        median = sorted(secs)[len(secs) // 2]
        tokens = batch * a.new_tokens
        row = {"path": "compiled", "batch": batch, "tokens_per_s": tokens / median, "ms_per_token": median * 1e3 / a.new_tokens,
               "cpu_us_per_token": cpu * 1e6 / (tokens * a.reps), "host_launches": n_launch,
               "launches_per_sequence": None if n_launch is None else n_launch / batch, "compile_s": compile_s}
        rows.append(row)
        print(f"[torch decode] batch {batch:>3}: {row['tokens_per_s']:>10.0f} tokens/s  {row['ms_per_token']:.3f} ms/token  "
              f"CPU {row['cpu_us_per_token']:.2f} us/token  {n_launch} host launches  (compile {compile_s:.1f} s)", flush=True)
    result = {"impl": "torch.compile", "device": torch.cuda.get_device_name(), "torch": torch.__version__,
              "model": f"{L} layers, d_model {D}, {HEADS} heads, context {CTX}, bf16", "weights": a.load or "random",
              "prompt_len": a.prompt_len, "new_tokens": a.new_tokens, "rows": rows}
    with open(a.out, "w") as f:
        json.dump(result, f)
        f.write("\n")


if __name__ == "__main__":
    main()
