"""The main job's validation loss, PyTorch's side (#21): examples/gpt's model, trained as the
main job trains it, in PyTorch, to tell what the model and the text allow from what our kernels
do.

The same as `cargo run --release --example gpt` on a GPU, except for the arithmetic's order and
the random draws: the model of bench/pytorch_gpt_bench.py (8 pre-norm blocks of RMSNorm, causal
attention and SwiGLU; d_model 512, context 256, batch 16, byte vocabulary), initialised as
examples/gpt draws it (uniform: token embeddings within 0.5, positions within 0.1, every
projection within 1/sqrt(fan-in), the attention output and down projections a further
1/sqrt(2 x layers) smaller; norm gains 1); bf16 autocast over f32 weights (our bf16 weights with
f32 masters); AdamW (betas 0.9 and 0.999, eps 1e-8, no weight decay); a linear warm-up over the
first twentieth of the steps to the peak rate, then a cosine to a tenth of it at the last step
(`optim::WarmupCosine`); random windows of the first 90% of the repository's README, docs and
Rust sources for training, of the last 10% for validation (4 batches every tenth of the run, 32
after the last step).

    python3 bench/pytorch_gpt_quality.py [--steps 2000] [--lr 6e-4] [--seed 0] [--json out.json]
        [--beta2 0.999] [--weight-decay 0] [--clip 0]

`--beta2`, `--weight-decay` and `--clip` (the largest global L2 norm of the grads, 0 for none:
`torch.nn.utils.clip_grad_norm_` before each step, as nanoGPT clips at 1.0) try what the main
job does not do yet. Prints the validation losses and the last one over 32 batches; with
`--json`, writes them too.
"""

import argparse
import json
import math
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

import pytorch_gpt_bench as g


def init_(blocks, ends):
    """examples/gpt's initialisation (model.rs, ends.rs), drawn by torch's generator."""
    with torch.no_grad():
        ends.tok.weight.uniform_(-0.5, 0.5)
        ends.pos.weight.uniform_(-0.1, 0.1)
        for lin in [ends.head] + [m for b in blocks for m in b.modules() if isinstance(m, nn.Linear)]:
            bound = 1.0 / math.sqrt(lin.in_features)
            lin.weight.uniform_(-bound, bound)
        out_scale = 1.0 / math.sqrt(2 * g.L)
        for b in blocks:
            b.o.weight.mul_(out_scale)
            b.down.weight.mul_(out_scale)


def lr_at(t, peak, warmup, total):
    """`WarmupCosine::lr_at`: the rate of step t (1-based)."""
    if t <= warmup:
        return peak * t / max(warmup, 1)
    p = min((t - warmup) / max(total - warmup, 1), 1.0)
    floor = peak / 10
    return floor + (peak - floor) * 0.5 * (1 + math.cos(math.pi * p))


def windows(part, gen):
    starts = torch.randint(0, len(part) - g.CTX - 1, (g.BATCH,), generator=gen)
    rows = torch.stack([part[s:s + g.CTX + 1] for s in starts.tolist()]).long().cuda()
    return rows[:, :-1], rows[:, 1:]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--lr", type=float, default=6e-4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--beta2", type=float, default=0.999)
    ap.add_argument("--weight-decay", type=float, default=0.0)
    ap.add_argument("--clip", type=float, default=0.0)
    ap.add_argument("--json")
    a = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.manual_seed(a.seed)
    train, val = g.corpus_parts()
    blocks = nn.ModuleList(g.Block() for _ in range(g.L)).cuda()
    ends = g.Ends().cuda()
    init_(blocks, ends)
    params = list(blocks.parameters()) + list(ends.parameters())
    opt = torch.optim.AdamW(params, lr=a.lr, betas=(0.9, a.beta2), eps=1e-8, weight_decay=a.weight_decay,
                            fused=True)
    warmup = max(a.steps // 20, 1)
    pos = torch.arange(g.CTX, device="cuda")

    def loss_of(ids, labels):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            x = ends.tok(ids) + ends.pos(pos)
            for b in blocks:
                x = b(x)
            logits = ends.head(ends.norm(x))
        return F.cross_entropy(logits.float().view(-1, g.VOCAB), labels.reshape(-1))

    gen, val_gen = torch.Generator().manual_seed(1000 + a.seed), torch.Generator().manual_seed(42)
    curve, t0 = [], time.perf_counter()
    tag = f"[torch quality seed {a.seed} lr {a.lr:g} beta2 {a.beta2:g} wd {a.weight_decay:g} clip {a.clip:g}]"
    print(f"{tag} {len(train)} training / {len(val)} validation bytes, {a.steps} steps", flush=True)
    for step in range(1, a.steps + 1):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, a.lr, warmup, a.steps)
        loss = loss_of(*windows(train, gen))
        loss.backward()
        if a.clip > 0:
            torch.nn.utils.clip_grad_norm_(params, a.clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if step % max(a.steps // 10, 1) == 0 or step == a.steps:
            n = 32 if step == a.steps else 4
            with torch.no_grad():
                v = sum(loss_of(*windows(val, val_gen)).item() for _ in range(n)) / n
            curve.append((step, v))
            print(f"{tag} step {step:>5}/{a.steps}  loss {loss.item():.4f}  validation loss {v:.4f}"
                  f"{f' ({n} batches)' if n == 32 else ''}  {time.perf_counter() - t0:.0f} s", flush=True)
    if a.json:
        json.dump({"seed": a.seed, "lr": a.lr, "beta2": a.beta2, "weight_decay": a.weight_decay, "clip": a.clip, "steps": a.steps, "val_curve": curve, "train_loss": loss.item(),
                   "device": torch.cuda.get_device_name(), "torch": torch.__version__}, open(a.json, "w"))


if __name__ == "__main__":
    main()
