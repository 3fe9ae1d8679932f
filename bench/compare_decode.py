"""Side by side: GPT decoding, ours (`gpt --decode-bench --json`) against PyTorch's anchor
(bench/pytorch_gpt_decode.py --out), per batch size: tokens/s of each of our paths and of
torch.compile, the ratio of our WHILE loop to it, per-token latency, CPU time per token and host
launches per request. With --chart, both in one figure of tokens/s by batch size (matplotlib).
    python3 bench/compare_decode.py --ours decode_ours.json --torch decode_torch.json
        [--markdown decode_bench.md] [--chart decode_bench.png]
"""

import argparse
import json


def rows_by(result, path):
    return {r["batch"]: r for r in result["rows"] if r["path"] == path}


def fmt(v, spec, unit=""):
    return "n/a" if v is None else format(v, spec) + unit


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ours", required=True)
    ap.add_argument("--torch", required=True)
    ap.add_argument("--markdown")
    ap.add_argument("--chart")
    a = ap.parse_args()
    ours, torch = json.load(open(a.ours)), json.load(open(a.torch))
    paths = {p: rows_by(ours, p) for p in ("while", "replay", "eager")}
    compiled = rows_by(torch, "compiled")
    lines = [
        f"GPT decoding on {ours['device']}: {ours['model']}, prompt {ours['prompt_len']} + {ours['new_tokens']} new tokens "
        f"(PyTorch {torch.get('torch', '?')}: {torch['model']}, prompt {torch['prompt_len']} + {torch['new_tokens']}, weights {torch.get('weights', '?')})",
        "",
        "| batch | ours WHILE tok/s | ours replay tok/s | ours eager tok/s | torch.compile tok/s | WHILE / torch | ms/token WHILE | ms/token torch | CPU us/token WHILE | CPU us/token torch | launches WHILE | launches torch |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    ratios = {}
    for batch in sorted(paths["while"]):
        w, t = paths["while"][batch], compiled.get(batch)
        ratio = w["tokens_per_s"] / t["tokens_per_s"] if t else None
        ratios[batch] = ratio
        rate = lambda p: fmt(paths[p].get(batch, {}).get("tokens_per_s"), ".0f")
        lines.append(
            f"| {batch} | {rate('while')} | {rate('replay')} | {rate('eager')} | {fmt(t and t['tokens_per_s'], '.0f')} | "
            f"{fmt(ratio, '.2f', 'x')} | {w['ms_per_token']:.3f} | {fmt(t and t['ms_per_token'], '.3f')} | "
            f"{fmt(w['cpu_us_per_token'], '.2f')} | {fmt(t and t['cpu_us_per_token'], '.2f')} | {w['host_launches']} | {fmt(t and t['host_launches'], 'd')} |")
    lines.append("")
    for batch, want in ((1, 2.0), (64, 1.2)):
        r = ratios.get(batch)
        verdict = "n/a" if r is None else ("met" if r >= want else "not met")
        lines.append(f"- batch {batch}: WHILE loop {fmt(r, '.2f', 'x')} torch.compile's tokens/s (issue target >= {want}x: {verdict})")
    text = "\n".join(lines)
    print(text)
    if a.markdown:
        with open(a.markdown, "w") as f:
            f.write(text + "\n")
    if a.chart:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(figsize=(10, 6))
        series = [("graphed: WHILE loop", paths["while"]), ("graphed: replay per token", paths["replay"]),
                  ("graphed: eager", paths["eager"]), ("PyTorch: torch.compile reduce-overhead", compiled)]
        for label, rows in series:
            b = sorted(rows)
            ax.plot(b, [rows[x]["tokens_per_s"] for x in b], marker="o", label=label)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("batch size")
        ax.set_ylabel("tokens/s (all sequences)")
        import textwrap
        ax.set_title("\n".join(textwrap.wrap(lines[0], 130)), fontsize=8)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
        fig.tight_layout()
        fig.savefig(a.chart, dpi=110)


if __name__ == "__main__":
    main()
