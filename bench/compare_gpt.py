"""The GPT benchmark (#13) side by side: our runs of examples/gpt (one JSON each, written by
`--json`) against bench/pytorch_gpt_bench.py's, from one call on one GPU.

Prints a markdown table (tokens/s, step time, setup/capture time, graph pool) and the three
targets of issue 13 with PASS / MISS:
  - our per-layer graphed tokens/s >= 1.5x PyTorch's per-layer graphed (make_graphed_callables);
  - our per-layer graphed step <= 1.10x our own single-graph floor (same work: no checkpointing);
  - our pool <= 0.5x PyTorch's per-layer pool.
Writes a chart (tokens/s and pool MB, ours and PyTorch's) when --chart is given.

    python3 bench/compare_gpt.py --ours a.json b.json ... --torch gpt_torch.json [--chart gpt.png] [--markdown gpt.md]
"""

import argparse
import json

LABELS = {
    ("Eager", False): "ours eager",
    ("Graphed", False): "ours per-layer graphs",
    ("Graphed", True): "ours per-layer graphs, odd layers checkpointed",
    ("Fused", False): "ours per-layer graphs fused (one launch)",
    ("Fused", True): "ours fused, odd layers checkpointed",
    ("Floor", False): "ours whole step as one graph (floor)",
    ("Pipeline", False): "ours pipeline: 2 chunks x 4 microbatches, one launch",
}
TORCH = {"eager": "PyTorch eager", "per_layer": "PyTorch per-layer make_graphed_callables",
         "floor": "PyTorch whole step as one graph"}


def load_ours(paths):
    rows = []
    for p in paths:
        with open(p) as f:
            r = json.load(f)
        r["label"] = LABELS.get((r["mode"], r["checkpoint"]), f"ours {r['mode']}")
        rows.append(r)
    return rows


def find(rows, mode, checkpoint):
    return next((r for r in rows if r["mode"] == mode and r["checkpoint"] == checkpoint), None)


def verdict(ok):
    return "PASS" if ok else "MISS"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ours", nargs="+", required=True)
    ap.add_argument("--torch", required=True)
    ap.add_argument("--chart")
    ap.add_argument("--markdown")
    a = ap.parse_args()
    ours = load_ours(a.ours)
    with open(a.torch) as f:
        torch = json.load(f)
    trows = {r["variant"]: r for r in torch["results"]}
    lines = [f"GPT, {ours[0]['dtype'] if ours else '?'}, on {torch['device']} (PyTorch {torch['torch']})", "",
             "| run | tokens/s | ms/step | setup s | pool MB | last loss |", "|---|---|---|---|---|---|"]
    for r in ours:
        lines.append(f"| {r['label']} | {r['tokens_per_s']:.0f} | {r['step_ms']:.2f} | {r['setup_s']:.2f} | "
                     f"{r['pool_mb']:.0f} | {r['loss_last']:.3f} |")
    for v, r in trows.items():
        lines.append(f"| {TORCH.get(v, v)} | {r['tokens_per_s']:.0f} | {r['step_ms']:.2f} | {r['setup_s']:.2f} | "
                     f"{r['reserved_mb']:.0f} | {r['loss']:.3f} |")
    lines.append("")
    tp = trows.get("per_layer")
    for ck in (False, True):
        g = find(ours, "Graphed", ck)
        if g and tp:
            x = g["tokens_per_s"] / tp["tokens_per_s"]
            lines.append(f"- per-layer tokens/s vs PyTorch per-layer ({'checkpointed' if ck else 'no checkpointing'}): "
                         f"{x:.2f}x (target >= 1.5x): {verdict(x >= 1.5)}")
            m = g["pool_mb"] / tp["reserved_mb"]
            lines.append(f"- pool vs PyTorch per-layer ({'checkpointed' if ck else 'no checkpointing'}): "
                         f"{m:.2f}x (target <= 0.5x): {verdict(m <= 0.5)}")
    g, fl = find(ours, "Graphed", False), find(ours, "Floor", False)
    if g and fl:
        x = g["step_ms"] / fl["step_ms"]
        lines.append(f"- per-layer step vs our floor: {x:.3f}x (target <= 1.10x): {verdict(x <= 1.10)}")
    fu = find(ours, "Fused", False)
    if fu and fl:
        lines.append(f"- fused step vs our floor: {fu['step_ms'] / fl['step_ms']:.3f}x")
    text = "\n".join(lines)
    print(text)
    if a.markdown:
        with open(a.markdown, "w") as f:
            f.write(text + "\n")
    if a.chart:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        names = [r["label"].replace("ours ", "") for r in ours] + [TORCH.get(v, v) for v in trows]
        rates = [r["tokens_per_s"] / 1e3 for r in ours] + [r["tokens_per_s"] / 1e3 for r in trows.values()]
        pools = [r["pool_mb"] for r in ours] + [r["reserved_mb"] for r in trows.values()]
        colors = ["tab:blue"] * len(ours) + ["tab:orange"] * len(trows)
        fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(14, 0.5 * len(names) + 2))
        ax1.barh(names, rates, color=colors)
        ax1.set_xlabel("thousand tokens/s (higher is better)")
        ax1.invert_yaxis()
        ax2.barh(names, pools, color=colors)
        ax2.set_xlabel("graph pool / reserved MB (lower is better)")
        ax2.invert_yaxis()
        ax2.set_yticklabels([])
        fig.suptitle(lines[0] + " - blue: graphed (Rust), orange: PyTorch")
        fig.tight_layout()
        fig.savefig(a.chart, dpi=110)


if __name__ == "__main__":
    main()
