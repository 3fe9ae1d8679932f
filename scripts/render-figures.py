#!/usr/bin/env python3
"""Renders the figures that README.md and docs/BENCHMARKS.md quote from the raw result files in
docs/results, so that a number in the docs cannot drift from its record.

Each quoted figure sits between markers in the docs:

    <!-- rendered:NAME -->...<!-- /rendered -->

(inline or around whole paragraphs and tables). NAME is one of the functions in BLOCKS below;
each reads the raw files it names and returns the text. Ratios are always taken between figures
of one run (one file, or the two files of one device call), and the text names the file.

    python3 scripts/render-figures.py            # check: exit 1 and show what differs
    python3 scripts/render-figures.py --write    # rewrite the marked text in place

Standard library only (CI runs the check on a fresh machine).
"""

import argparse
import difflib
import json
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "docs", "results")
DOCS = ["README.md", os.path.join("docs", "BENCHMARKS.md")]

sys.dont_write_bytecode = True  # no __pycache__ in bench/
sys.path.insert(0, os.path.join(ROOT, "bench"))
import compare  # noqa: E402  (bench/compare.py: the benchmark table, as the GPU run prints it)

# The benchmark runs the docs quote: the last device call of 2026-11-30 (f32), and the bf16,
# GEMM and 2-GPU runs of that day.
F32 = ("ours-2026-11-30b.json", "torch-2026-11-30b.json")
BF16 = ("ours-2026-11-30.json", "ours-bf16-2026-11-30.json", "torch-bf16-2026-11-30.json")
GEMM = ("ours-gemm-2026-11-30.json", "torch-gemm-2026-11-30.json")
DIST = ("dist-2026-11-30.json", "torch-ddp-2026-11-30.json")
MLP = "train-2026-11-29.txt"
GPT_MAIN = "gpt-main-2026-12-07-h100-s36b.txt"
# The same model trained in PyTorch (bench/pytorch_gpt_quality.py), beside the main job's seeds.
VAL_LOSS = "val-loss-2026-12-07-h100-s38.txt"
GPT_OURS, GPT_TORCH = "gpt-ours-bf16-2026-11-30.jsonl", "gpt-torch-bf16-2026-11-30.json"
GPT_SHAPES = "gpt-shapes-2026-12-01.json"
# The fused attention's call of 2026-12-01: the GPT at three shapes next to torch.compile, and
# the attention kernels next to PyTorch's SDPA (the same kernels through CuPy) and through the
# runtime.
GPT_NOW = "gpt-shapes-2026-12-01f.json"
# The latest call against torch.compile (our per-layer graphs, our floor and torch.compile).
GPT_LATEST = "gpt-shapes-2026-12-03c.json"
GPT_PDL = "gpt-pdl-2026-12-04g.json"
FLASH = "flash-vs-torch-2026-12-01.json"
FLASH_RT = "attention-bench-2026-12-01.json"
FLASH_CUDNN = "attention-cudnn-2026-12-01b.json"
FLASH_VS = "attention-vs-torch-2026-12-01.json"
OPS_NOW = "op_bench-2026-12-03c.txt"
BUCKETS = "gpt-buckets-2026-12-01.json"


def load(name):
    with open(os.path.join(RESULTS, name)) as f:
        return json.load(f)


def text(name):
    with open(os.path.join(RESULTS, name)) as f:
        return f.read()


def rel(name):
    return f"`docs/results/{name}`"


def shapes_of(doc):
    return [compare.shape_key(r) for r in doc["results"]]


def x(v, digits=2):
    return f"{v:.{digits}f}x"


def span(values, digits=2, unit="x"):
    """`lo to hi` with the unit after each; a ratio of 10 or more is rounded to an integer."""

    def one(v):
        return f"{v:.0f}" if unit == "x" and v >= 10 else f"{v:.{digits}f}"

    lo, hi = min(values), max(values)
    return f"{one(lo)}{unit} to {one(hi)}{unit}" if unit == "x" else f"{one(lo)} to {one(hi)}{unit}"


def name(key):
    return compare.shape_name(key)


# ---- README -------------------------------------------------------------------------------


def issue_us():
    """CPU time to issue one graphed call of the whole stack (copy-in plus launch)."""
    ours, torch = (compare.by_shape(load(f)) for f in F32)
    o = [ours[k]["issue_us"] for k in ours]
    t = [torch[k]["issue_us"] for k in ours if k in torch]
    return (
        f"{min(o):.1f} to {max(o):.1f} µs of CPU per graphed call in the benchmark (`issue_us`: the "
        f"copy-in and the launch), against {min(t):.0f} to {max(t):.0f} µs for PyTorch's graphed "
        f"callables in the same run ({rel(F32[0])})"
    )


def mlp_job():
    """The MLP job's eager and graphed step from its only raw record."""
    log = text(MLP)
    eager = re.search(r"eager step\s+([\d.]+) ms", log).group(1)
    graphed, ratio = re.search(r"graphed step\s+([\d.]+) ms \(([\d.]+x) faster\)", log).groups()
    steps = re.findall(r"^ +(\d+) +[\d.]+ +[\d.]+$", log, re.M)[-1]
    return (
        f"on the H200 the graphed step is {ratio} faster than eager ({graphed} against {eager} ms, "
        f"{steps} steps, {rel(MLP)})"
    )


def train_bytes(lines):
    """The training bytes the main job's first line reports."""
    return int(re.search(r"(\d+) training", lines[0]).group(1))


def gpt_main_log():
    """The README's excerpt of the main job's GPU log, and what it shows."""
    lines = text(GPT_MAIN).splitlines()
    keep = lines[:3] + [lines[5], "..."]
    keep += [l for l in lines if l.startswith("step  2000/2000") or l.startswith("trained ")]
    train = [(int(m.group(1)), float(m.group(2))) for m in map(re.compile(r"step +(\d+)/\d+ +loss ([\d.]+)").match, lines) if m]
    val = [(int(m.group(1)), float(m.group(2))) for m in map(re.compile(r"step +(\d+)/\d+ +validation loss ([\d.]+)").match, lines) if m]
    last = val[-1][0]
    tail = [v for s, v in val if s > last - 800]
    final = r"step  2000/2000 .*validation loss ([\d.]+) \(32 batches\)"
    vl = text(VAL_LOSS)
    # Each seed's default run (its last line appears in the summary and in its own log).
    torch = list({m.group(1): float(m.group(2)) for m in re.finditer(
        r"\[torch quality seed (\d+) lr 0.0006 beta2 0.999 wd 0 clip 0\] " + final, vl)}.values())
    ours = [val[-1][1]] + [float(m.group(1)) for m in re.finditer(r"## gpt_seed\d+\.txt\n(?:.*\n)*?" + final, vl)]
    return (
        "```\n" + "\n".join(keep) + "\n```\n\n"
        f"The training loss falls from {train[0][1]:.2f} to {train[-1][1]:.2f} and the validation loss "
        f"from {val[0][1]:.2f} (step {val[0][0]}) to {val[-1][1]:.2f} at step {last} (it wanders between "
        f"{min(tail):.2f} and {max(tail):.2f} over the last 800 steps, four batches an evaluation; "
        f"it trains on {train_bytes(lines) / 1e6:.1f} MB of text, and the validation text, the last tenth of the corpus, is "
        f"the examples' Rust sources, which the training part does not hold; {rel(GPT_MAIN)}). "
        f"PyTorch training the same model on the same text (`bench/pytorch_gpt_quality.py`: the same "
        f"initialisation, optimizer and schedule) ends at {min(torch):.2f} to {max(torch):.2f} over 32 batches "
        f"(seeds 0 to {len(torch) - 1}), the main job at {min(ours):.2f} to {max(ours):.2f} ({rel(VAL_LOSS)})."
    )


def bench_summary():
    """The README's summary of docs/BENCHMARKS.md, every figure from the run it names."""
    ours_doc, torch_doc = (load(f) for f in F32)
    ours, torch = compare.by_shape(ours_doc), compare.by_shape(torch_doc)
    keys = shapes_of(ours_doc)
    per = [torch[k]["per_block_us"] / ours[k]["per_block_us"] for k in keys]
    eager = [torch[k]["eager_us"] / ours[k]["eager_us"] for k in keys]
    capture = [torch[k]["capture_ms"] / ours[k]["capture_ms"] for k in keys]
    pool = [torch[k]["pool_mb"] / ours[k]["pool_mb"] for k in keys]
    per_floor = [ours[k]["per_block_us"] / ours[k]["floor_us"] for k in keys]
    fused_floor = [ours[k]["fused_us"] / ours[k]["floor_us"] for k in keys]
    fused_cpu = [ours[k]["fused_cpu_us"] for k in keys]
    per_list = ", ".join(f"{x(v)} at {name(k)}" for v, k in zip(per, keys))

    f32_doc, bf16_doc, tbf16_doc = (load(f) for f in BF16)
    f32, bf16, tbf16 = (compare.by_shape(d) for d in (f32_doc, bf16_doc, tbf16_doc))
    big = (8, 4096, 512)
    og, tg = (load(f)["gemm"] for f in GEMM)
    tflops = {g["size"]: g["tflops"] for g in tg}
    gemm = " and ".join(f"{g['tflops']:.0f}" for g in og)
    gemm_ratio = " and ".join(x(g["tflops"] / tflops[g["size"]]) for g in og)
    gemm_sizes = " and ".join(f"{g['size']}^3" for g in og)

    dist, ddp = (load(f)["rows"] for f in DIST)
    d = next(r for r in dist if (r["l"], r["h"], r["b"]) == (32, 256, 32))
    t = next(r for r in ddp if (r["l"], r["h"], r["b"]) == (32, 256, 32))
    return (
        f"In float32 ({rel(F32[0])} and {rel(F32[1])}, one device call on 2026-11-30), one graph per "
        f"block is faster than PyTorch's per-block `make_graphed_callables` by {per_list}; eager is "
        f"{span(eager)} faster than PyTorch eager, capture {span(capture, 1)} faster, and the pool "
        f"{span(pool, 1)} smaller. One graph per block runs at {span(per_floor)} our single-graph "
        f"floor; the fused step (`fuse()`, `step()`: the same graphs as one launch) is within "
        f"{span(fused_floor, 3)} of that floor, issued in {span(fused_cpu, 1, ' µs')} of CPU. In bf16 "
        f"({rel(BF16[1])}), GEMMs run at {gemm} TFLOP/s at {gemm_sizes} ({gemm_ratio} `torch.matmul`, "
        f"{rel(GEMM[0])}), and the {name(big)} per-block step is "
        f"{x(f32[big]['per_block_us'] / bf16[big]['per_block_us'])} faster than our f32 one "
        f"({rel(BF16[0])}) and {x(tbf16[big]['per_block_us'] / bf16[big]['per_block_us'])} faster than "
        f"PyTorch's bf16 per-block graphs. On two H200s ({rel(DIST[0])}), data parallel with the "
        f"all-reduce inside the backward graphs is {x(t['many_us'] / d['many_us'])} faster than PyTorch "
        f"DDP with graphs at 32x256x32, and the 2-GPU step is {d['ratio']:.3f}x our 1-GPU step (the "
        f"1.15x target is missed; the page says why)."
    )


# ---- docs/BENCHMARKS.md -------------------------------------------------------------------


def bench_table():
    """The float32 table, as bench/compare.py prints it for the run the page quotes."""
    ours_doc, torch_doc = (load(f) for f in F32)
    rows = compare.table_rows(compare.by_shape(ours_doc), compare.by_shape(torch_doc), shapes_of(ours_doc))
    return compare.render_markdown(rows)


def gpt_table():
    """Our GPT runs and PyTorch's, one device call."""
    ours = [json.loads(l) for l in text(GPT_OURS).splitlines() if l.strip()]
    torch = load(GPT_TORCH)["results"]
    label = {
        ("Eager", False): "ours eager",
        ("Graphed", False): "ours, one graph per layer (and per end, and the optimizer)",
        ("Graphed", True): "ours, the same with odd layers checkpointed",
        ("Fused", False): "ours, per-layer graphs fused into one launch",
        ("Floor", False): "ours, whole step as one graph (our floor)",
        ("Pipeline", False): "ours, pipeline: 2 chunks x 4 microbatches, one launch",
    }
    tlabel = {
        "eager": "PyTorch eager",
        "per_layer": "PyTorch per-layer `make_graphed_callables`",
        "floor": "PyTorch whole step as one graph",
    }
    out = ["| run | tokens/s | ms/step | setup s | pool MB |", "|---|---:|---:|---:|---:|"]
    for r in ours:
        pool = "-" if r["pool_mb"] == 0 else f"{r['pool_mb']:,.0f}"
        out.append(f"| {label[(r['mode'], r['checkpoint'])]} | {r['tokens_per_s']:,.0f} | {r['step_ms']:.2f} | {r['setup_s']:.2f} | {pool} |")
    for r in torch:
        out.append(
            f"| {tlabel[r['variant']]} | {r['tokens_per_s']:,.0f} | {r['step_ms']:.2f} | {r['setup_s']:.2f} | {r['reserved_mb']:,.0f} reserved |"
        )
    return "\n".join(out)


def gpt_ratio():
    """Per-layer tokens/s against PyTorch's per-layer graphs in the 2026-11-30 call."""
    ours = {(r["mode"], r["checkpoint"]): r for r in map(json.loads, filter(str.strip, text(GPT_OURS).splitlines()))}
    torch = {r["variant"]: r for r in load(GPT_TORCH)["results"]}
    per = ours[("Graphed", False)]["tokens_per_s"] / torch["per_layer"]["tokens_per_s"]
    ck = ours[("Graphed", True)]["tokens_per_s"] / torch["per_layer"]["tokens_per_s"]
    return f"{x(per)} ({x(ck)} with odd layers checkpointed)"


def gpt_shapes():
    """Ours against PyTorch's per-layer graphs and torch.compile at three shapes, one measurement."""
    doc = load(GPT_SHAPES)
    out = [
        "| context x batch | ours, one graph per layer | PyTorch `make_graphed_callables` | ours / it | "
        "`torch.compile` (reduce-overhead) | ours / it |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for r in doc["rows"]:
        o, g, c = r["ours_per_layer"], r["torch_make_graphed_callables"], r["torch_compile_reduce_overhead"]
        out.append(f"| {r['context']}x{r['batch']} | {o / 1e3:,.0f}k | {g / 1e3:,.0f}k | {x(o / g)} | {c / 1e3:,.0f}k | {x(o / c)} |")
    return "\n".join(out)


def gpt_summary():
    """The README's one-sentence GPT comparison, from the latest measurement at three shapes."""
    doc = load(GPT_SHAPES)
    rows = doc["rows"]
    first, last = rows[0], rows[-1]
    vs_graphs = lambda r: r["ours_per_layer"] / r["torch_make_graphed_callables"]  # noqa: E731
    compile_faster = [r["torch_compile_reduce_overhead"] / r["ours_per_layer"] for r in rows]
    return (
        f"one graph per layer is {x(vs_graphs(first))} as fast as PyTorch's per-layer "
        f"`make_graphed_callables` at context {first['context']} x batch {first['batch']} and "
        f"{x(vs_graphs(last))} at {last['context']} x {last['batch']}, and `torch.compile` "
        f"(reduce-overhead) is {span(compile_faster)} faster than ours at the {len(rows)} shapes "
        f"measured ({doc['date']}, {rel(GPT_SHAPES)})"
    )


def gpt_now():
    """The GPT with fused attention at three shapes, ours and torch.compile in one call."""
    return shapes_table(GPT_NOW)


def gpt_latest():
    """The same table from the latest call against torch.compile."""
    return shapes_table(GPT_LATEST)


def gpt_pdl():
    """Ours per layer with and without programmatic dependent launch, and torch.compile, in one call."""

    def cells(r):
        g, p, c = r["ours_graphed"], r["ours_pdl"], r["torch"]["compile"]
        rate = lambda o: o["tokens_per_s"]
        return [kilo(rate(g)), kilo(rate(p)), x(rate(p) / rate(g), 3), kilo(rate(c)), x(rate(g) / rate(c)), x(rate(p) / rate(c))]

    head = ["ours, one graph per layer", "the same with `GRAPHED_PDL=1`", "PDL / plain",
            "`torch.compile` (reduce-overhead)", "ours / it", "ours with PDL / it"]
    return per_shape(GPT_PDL, head, cells)


def shapes_table(name):
    """Ours per layer, our floor and torch.compile at each shape of one call's file; with
    `device_mb` in our runs (every pool of the device, session 16 on), also the memory counted
    alike: every pool of ours against its reserved growth, which holds its model and optimizer."""
    alike = all("device_mb" in r["ours_graphed"] for r in load(name)["rows"])

    def cells(r):
        g, f, c = r["ours_graphed"], r["ours_floor"], r["torch"]["compile"]
        rate = lambda o: o["tokens_per_s"]
        out = [kilo(rate(g)), kilo(rate(f)), x(rate(f) / rate(g), 3), kilo(rate(c)), x(rate(g) / rate(c)),
               f"{g['pool_mb']:,.0f}", f"{c['reserved_mb']:,.0f}", x(g["pool_mb"] / c["reserved_mb"])]
        if alike:
            out += [f"{g['device_mb']:,.0f}", x(g["device_mb"] / c["reserved_mb"])]
        return out

    head = ["ours, one graph per layer", "ours, whole step (floor)", "per layer / floor",
            "`torch.compile` (reduce-overhead)", "ours / it", "our pool MB", "its peak reserved MB", "pool / it"]
    if alike:
        head += ["our every pool MB", "every pool / it"]
    return per_shape(name, head, cells)


def kilo(rate):
    """Tokens/s in thousands."""
    return f"{rate / 1e3:,.0f}k"


def per_shape(name, head, cells):
    """A table of one call's file, a row per context x batch: `head` names the columns after the
    shape, `cells(row)` fills them."""
    doc = load(name)
    out = ["| context x batch | " + " | ".join(head) + " |", "|---|" + "---:|" * len(head)]
    for r in doc["rows"]:
        out.append(f"| {r['context']}x{r['batch']} | " + " | ".join(cells(r)) + " |")
    return "\n".join(out) + f"\n\n({doc['steps']} steps a run, bf16, {rel(name)}.)"


def gpt_unfused():
    """The same GPT with the unfused attention, same call: speed and loss."""
    r = load(GPT_NOW)["rows"][0]
    # The run that evaluated as often as the unfused one did, where the call has it (the
    # validation batches drawn depend on how often a run evaluates).
    g, u = r.get("ours_graphed_eval_every_100", r["ours_graphed"]), r["ours_unfused"]
    return (
        f"at {r['context']} x {r['batch']} the fused kernels make the per-layer step "
        f"{x(g['tokens_per_s'] / u['tokens_per_s'])} as fast as the unfused attention "
        f"({g['tokens_per_s'] / 1e3:,.0f}k against {u['tokens_per_s'] / 1e3:,.0f}k tokens/s, pool "
        f"{g['pool_mb']:,.0f} against {u['pool_mb']:,.0f} MB), and after 300 steps the training loss is "
        f"{g['loss_last']:.4f} against {u['loss_last']:.4f} and the validation loss {g['val_last']:.4f} "
        f"against {u['val_last']:.4f} ({rel(GPT_NOW)})"
    )


def attention_table():
    """Fused attention TFLOP/s next to PyTorch's SDPA backends, one call."""
    doc = load(FLASH)
    fmt = lambda v: "-" if v is None else f"{v:.0f}"  # noqa: E731
    out = [
        "| seq | head dim | causal | ours fwd | SDPA flash fwd | SDPA cuDNN fwd | ours bwd | SDPA flash bwd | SDPA cuDNN bwd |",
        "|---:|---:|:---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in doc["table"]:
        out.append(
            f"| {r['seq']} | {r['d']} | {'yes' if r['causal'] else 'no'} | {r['fwd']:.0f} | {fmt(r['torch_flash_fwd'])} | "
            f"{fmt(r['torch_cudnn_fwd'])} | {r['bwd']:.0f} | {fmt(r['torch_flash_bwd'])} | {fmt(r['torch_cudnn_bwd'])} |"
        )
    return "\n".join(out) + f"\n\n(TFLOP/s, bf16, 16384 tokens x 2048 features a call; {rel(FLASH)}.)"


def attention_runtime():
    """The runtime's attention benchmark (graph replays), the same call."""
    rows = load(FLASH_RT)["rows"]
    dnn = {(r["seq"], r["head_dim"], r["causal"]): r for r in load(FLASH_CUDNN)["rows"]}
    out = [
        "| seq | head dim | causal | portable fwd TFLOP/s | portable bwd TFLOP/s | cuDNN fwd TFLOP/s | cuDNN bwd TFLOP/s | cuDNN fwd ms | cuDNN bwd ms |",
        "|---:|---:|:---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        c = dnn[(r["seq"], r["head_dim"], r["causal"])]
        out.append(
            f"| {r['seq']} | {r['head_dim']} | {'yes' if r['causal'] else 'no'} | {r['fwd_tflops']:.0f} | {r['bwd_tflops']:.0f} | "
            f"{c['fwd_tflops']:.0f} | {c['bwd_tflops']:.0f} | {c['fwd_ms']:.3f} | {c['bwd_ms']:.3f} |"
        )
    return "\n".join(out) + f"\n\n(portable: {rel(FLASH_RT)}; cuDNN: {rel(FLASH_CUDNN)}, a later call, the one of the comparison with SDPA below.)"


def attention_vs_torch():
    """Ours (default engine, then cuDNN's nondeterministic backward) beside SDPA's flash and
    cuDNN backends, one device call."""
    doc = load(FLASH_VS)
    f = lambda v: "-" if v is None else f"{v:.0f}"  # noqa: E731
    r2 = lambda a, b: "-" if not a or not b else f"{a / b:.2f}x"  # noqa: E731
    out = [
        "| seq | head dim | causal | ours fwd | SDPA flash fwd | SDPA cuDNN fwd | fwd vs flash | fwd vs cuDNN "
        "| ours bwd | SDPA flash bwd | SDPA cuDNN bwd | bwd vs flash | bwd vs cuDNN | ours nondet. bwd | nondet. vs cuDNN |",
        "|---:|---:|:---:|" + "---:|" * 12,
    ]
    for r in doc["rows"]:
        out.append(
            f"| {r['seq']} | {r['head_dim']} | {'yes' if r['causal'] else 'no'} | {f(r['ours_fwd'])} | {f(r['flash_fwd'])} | "
            f"{f(r['cudnn_fwd'])} | {r2(r['ours_fwd'], r['flash_fwd'])} | {r2(r['ours_fwd'], r['cudnn_fwd'])} | {f(r['ours_bwd'])} | "
            f"{f(r['flash_bwd'])} | {f(r['cudnn_bwd'])} | {r2(r['ours_bwd'], r['flash_bwd'])} | {r2(r['ours_bwd'], r['cudnn_bwd'])} | "
            f"{f(r['ours_nondet_bwd'])} | {r2(r['ours_nondet_bwd'], r['cudnn_bwd'])} |"
        )
    return "\n".join(out) + (
        f"\n\n(TFLOP/s, bf16, 16384 tokens x 2048 features a call, {doc['device']}, PyTorch {doc['torch']}, "
        f"cuDNN {doc['cudnn']}; ours replayed from graphs, SDPA eager through autograd; {rel(FLASH_VS)}.)"
    )


def gpt_now_summary():
    """The README's sentence on the GPT against torch.compile, from the latest call."""
    doc = load(GPT_LATEST)
    parts = [
        f"{x(r['ours_graphed']['tokens_per_s'] / r['torch']['compile']['tokens_per_s'])} at {r['context']} x {r['batch']}"
        for r in doc["rows"]
    ]
    return (
        f"with the fused attention kernels, one graph per layer runs at {', '.join(parts)} the tokens/s of "
        f"`torch.compile` (reduce-overhead) in the same call ({doc['date']}, {rel(GPT_LATEST)})"
    )


def ops_now():
    """The latest op benchmark's table, as examples/op_bench printed it."""
    lines = text(OPS_NOW).splitlines()
    start = next(i for i, l in enumerate(lines) if l.startswith("op "))
    body = [l.rstrip() for l in lines[start:] if l.strip() and not l.startswith("[")]
    head = next(l for l in lines if "launches per graph" in l)
    return f"```\n{head}\n" + "\n".join(body) + f"\n```\n\n({rel(OPS_NOW)}.)"


def gpt_buckets():
    """The GPT's sequence buckets against padding every step to the context, one call."""
    doc = load(BUCKETS)
    b, pad, alone = doc["ragged_buckets"], doc["ragged_padded"], doc["fixed_largest"]
    reports = b["bucket_reports"]
    sizes = ", ".join(str(r[0]) for r in reports)
    total_ms = sum(r[1] for r in reports)
    est = b["estimate_mb"]
    return (
        f"{len(reports)} sequence buckets ({sizes}) of the GPT at batch {b['batch']} are captured in "
        f"{total_ms:.0f} ms together (the largest {reports[-1][1]:.0f} ms) into one pool of {b['pool_mb']:.1f} MB, "
        f"{b['pool_mb'] / alone['pool_mb']:.2f}x the {alone['pool_mb']:.1f} MB of the largest bucket captured alone; "
        f"the estimate made before capturing was {est:.1f} MB ({100 * (est - b['pool_mb']) / b['pool_mb']:+.1f}%). "
        f"On ragged rows cut at line boundaries, the bucketed run trains at {b['tokens_per_s'] / 1e3:,.0f}k real "
        f"tokens/s ({100 * b['padding']:.1f}% of the computed positions are padding) against "
        f"{pad['tokens_per_s'] / 1e3:,.0f}k with every step padded to {pad['context']} ({100 * pad['padding']:.1f}% padding): "
        f"{b['tokens_per_s'] / pad['tokens_per_s']:.2f}x, with no capture after setup ({doc['date']}, {rel(BUCKETS)})"
    )


BLOCKS = {
    "gpt-buckets": gpt_buckets,
    "ops-now": ops_now,
    "gpt-now": gpt_now,
    "gpt-unfused": gpt_unfused,
    "attention-table": attention_table,
    "attention-runtime": attention_runtime,
    "attention-vs-torch": attention_vs_torch,
    "gpt-now-summary": gpt_now_summary,
    "gpt-summary": gpt_summary,
    "issue-us": issue_us,
    "mlp-job": mlp_job,
    "gpt-main-log": gpt_main_log,
    "bench-summary": bench_summary,
    "bench-table": bench_table,
    "gpt-table": gpt_table,
    "gpt-ratio": gpt_ratio,
    "gpt-shapes": gpt_shapes,
    "gpt-latest": gpt_latest,
    "gpt-pdl": gpt_pdl,
}

MARK = re.compile(r"(<!-- rendered:([a-z0-9-]+) -->)(.*?)(<!-- /rendered -->)", re.S)


def render(doc):
    def one(m):
        fn = BLOCKS.get(m.group(2))
        if fn is None:
            raise SystemExit(f"unknown rendered block `{m.group(2)}` (known: {', '.join(BLOCKS)})")
        body = fn()
        inner = f"\n{body}\n" if m.group(3).startswith("\n") else body
        return m.group(1) + inner + m.group(4)

    return MARK.sub(one, doc)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true", help="rewrite the marked text instead of checking it")
    args = ap.parse_args()
    stale, used = [], set()
    for path in DOCS:
        full = os.path.join(ROOT, path)
        with open(full) as f:
            doc = f.read()
        used.update(m.group(2) for m in MARK.finditer(doc))
        new = render(doc)
        if new == doc:
            continue
        if args.write:
            with open(full, "w") as f:
                f.write(new)
            print(f"rewrote {path}")
        else:
            stale.append(path)
            sys.stdout.writelines(difflib.unified_diff(doc.splitlines(True), new.splitlines(True), path, path + " (rendered)"))
    unused = sorted(set(BLOCKS) - used)
    if unused:
        print(f"blocks no document quotes: {', '.join(unused)}")
        return 1
    if stale:
        print(f"\n{', '.join(stale)}: figures differ from docs/results; run python3 scripts/render-figures.py --write")
        return 1
    print(f"{len(used)} rendered blocks in {', '.join(DOCS)} match docs/results")
    return 0


if __name__ == "__main__":
    sys.exit(main())
