"""Compare the `graphed` Rust benchmark with the PyTorch reference numbers.

Both inputs use the schema written by bench/pytorch_bench.py:
  {"device": ..., "date": ..., "results": [{"L":..,"H":..,"B":..,
    "eager_us":..,"per_block_us":..,"whole_us":..,"floor_us":..,
    "capture_ms":..,"pool_mb":..,"issue_us":.., "live_mb": (optional)}, ...]}
Missing keys are shown as "-".

Prints, per shape, ours / torch / ratio for every metric (times: torch/ours,
i.e. our speed-up; capture_ms and pool_mb: ours/torch), then a targets section
with PASS / MISS lines. Optionally writes the table as GitHub markdown and a
grouped log-scale bar chart of microseconds per step.

Run:
  python3 bench/compare.py --ours ours.json --torch torch.json --chart out.png [--markdown out.md]
"""

import argparse
import json
import math
import sys

TIME_METRICS = ["eager_us", "per_block_us", "fused_us", "whole_us", "floor_us", "issue_us"]
# (key, ratio kind): "speedup" = torch/ours, "relative" = ours/torch
METRICS = [
    ("eager_us", "speedup"),
    ("per_block_us", "speedup"),
    ("whole_us", "speedup"),
    ("floor_us", "speedup"),
    ("capture_ms", "relative"),
    ("pool_mb", "relative"),
    ("issue_us", "speedup"),
    ("live_mb", None),
]
RATIO_NOTE = {"speedup": "torch/ours", "relative": "ours/torch", None: ""}


def load(path):
    with open(path) as f:
        return json.load(f)


def shape_key(row):
    if all(k in row for k in ("L", "H", "B")):
        return (int(row["L"]), int(row["H"]), int(row["B"]))
    if "shape" in row:  # tolerate "8x256x32"
        return tuple(int(p) for p in str(row["shape"]).lower().split("x"))
    raise SystemExit(f"result row without L/H/B: {row}")


def by_shape(doc):
    return {shape_key(r): r for r in doc.get("results", [])}


def shape_name(key):
    return "x".join(str(v) for v in key)


def num(row, key):
    """The metric as a float, or None when absent / not a number."""
    if row is None:
        return None
    v = row.get(key)
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    if math.isnan(v):
        return None
    return float(v)


def div(a, b):
    if a is None or b is None or b == 0:
        return None
    return a / b


def fmt(v, digits=2):
    if v is None:
        return "-"
    if abs(v) >= 1000:
        return f"{v:,.0f}"
    if abs(v) >= 100:
        return f"{v:.1f}"
    return f"{v:.{digits}f}"


def fmt_ratio(v):
    if v is None:
        return "-"
    return f"{v:.3f}x" if abs(v) < 0.1 else f"{v:.2f}x"


def table_rows(ours, torch, shapes):
    rows = []
    for key in shapes:
        o, t = ours.get(key), torch.get(key)
        for metric, kind in METRICS:
            ov, tv = num(o, metric), num(t, metric)
            if metric == "live_mb" and ov is None and tv is None:
                continue
            if kind == "speedup":
                ratio = div(tv, ov)
            elif kind == "relative":
                ratio = div(ov, tv)
            else:
                ratio = None
            rows.append([shape_name(key), metric, fmt(ov), fmt(tv), fmt_ratio(ratio), RATIO_NOTE[kind]])
    return rows


HEADER = ["shape LxHxB", "metric", "ours", "torch", "ratio", "ratio is"]


def render_text(rows):
    widths = [max(len(str(r[i])) for r in rows + [HEADER]) for i in range(len(HEADER))]
    right = {2, 3, 4}

    def line(r):
        cells = [str(c).rjust(w) if i in right else str(c).ljust(w) for i, (c, w) in enumerate(zip(r, widths))]
        return "  ".join(cells).rstrip()

    out = [line(HEADER), line(["-" * w for w in widths])]
    last = None
    for r in rows:
        if last is not None and r[0] != last:
            out.append("")
        out.append(line(r))
        last = r[0]
    return "\n".join(out)


def render_markdown(rows):
    out = ["| " + " | ".join(HEADER) + " |", "|" + "|".join(["---", "---", "---:", "---:", "---:", "---"]) + "|"]
    for r in rows:
        out.append("| " + " | ".join(str(c) for c in r) + " |")
    return "\n".join(out)


def check_targets(ours, torch, shapes):
    """Returns a list of (status, text); status is PASS, MISS, n/a or info."""
    lines = []

    def verdict(ok):
        return "n/a" if ok is None else ("PASS" if ok else "MISS")

    def at_least(v, limit):
        return None if v is None else v >= limit

    def at_most(v, limit):
        return None if v is None or limit is None else v <= limit

    # 1. per_block speed-up vs torch per_block: >= 4x on 32x256x32, reported everywhere.
    for key in shapes:
        o, t = ours.get(key), torch.get(key)
        r = div(num(t, "per_block_us"), num(o, "per_block_us"))
        if key == (32, 256, 32):
            lines.append((verdict(at_least(r, 4.0)),
                          f"{shape_name(key)}: per_block >= 4x faster than torch per_block ({fmt_ratio(r)})"))
        else:
            lines.append(("info", f"{shape_name(key)}: per_block speed-up vs torch per_block {fmt_ratio(r)}"))
    if (32, 256, 32) not in shapes:
        lines.append(("n/a", "32x256x32: per_block >= 4x faster than torch per_block (shape missing)"))

    # 2. ours per_block within 1.10x of ours floor, every shape.
    for key in shapes:
        o = ours.get(key)
        r = div(num(o, "per_block_us"), num(o, "floor_us"))
        lines.append((verdict(at_most(r, 1.10)),
                      f"{shape_name(key)}: ours per_block <= 1.10x ours floor ({fmt_ratio(r)})"))

    # 3. ours eager >= 2x faster than torch eager on the 256-wide shapes.
    for key in shapes:
        if key[1] != 256:
            continue
        o, t = ours.get(key), torch.get(key)
        r = div(num(t, "eager_us"), num(o, "eager_us"))
        lines.append((verdict(at_least(r, 2.0)),
                      f"{shape_name(key)}: ours eager >= 2x faster than torch eager ({fmt_ratio(r)})"))

    # 4. ours capture_ms <= torch capture_ms.
    for key in shapes:
        o, t = ours.get(key), torch.get(key)
        ov, tv = num(o, "capture_ms"), num(t, "capture_ms")
        lines.append((verdict(at_most(ov, tv)),
                      f"{shape_name(key)}: ours capture_ms <= torch capture_ms ({fmt(ov)} vs {fmt(tv)} ms)"))

    # 5. ours pool_mb <= 0.25 x torch pool_mb, and <= 1.25 x live_mb when live_mb is given.
    for key in shapes:
        o, t = ours.get(key), torch.get(key)
        ov, tv, live = num(o, "pool_mb"), num(t, "pool_mb"), num(o, "live_mb")
        lim = None if tv is None else 0.25 * tv
        lines.append((verdict(at_most(ov, lim)),
                      f"{shape_name(key)}: ours pool_mb <= 0.25x torch pool_mb ({fmt(ov)} vs limit {fmt(lim)} MB)"))
        if live is not None:
            lim = 1.25 * live
            lines.append((verdict(at_most(ov, lim)),
                          f"{shape_name(key)}: ours pool_mb <= 1.25x live_mb ({fmt(ov)} vs limit {fmt(lim)} MB)"))

    # 6. 8x4096x512: ours per_block within 1.02x of ours floor.
    key = (8, 4096, 512)
    o = ours.get(key)
    r = div(num(o, "per_block_us"), num(o, "floor_us"))
    lines.append((verdict(at_most(r, 1.02)),
                  f"{shape_name(key)}: ours per_block <= 1.02x ours floor ({fmt_ratio(r)})"))

    # 7. The fused per-block step (one launch) within 1.03x of ours floor, every shape, and its
    #    CPU issue time <= 5 us.
    for key in shapes:
        o = ours.get(key)
        r = div(num(o, "fused_us"), num(o, "floor_us"))
        lines.append((verdict(at_most(r, 1.03)),
                      f"{shape_name(key)}: ours fused per-block <= 1.03x ours floor ({fmt_ratio(r)})"))
        c = num(o, "fused_cpu_us")
        lines.append((verdict(at_most(c, 5.0)),
                      f"{shape_name(key)}: CPU time to issue a fused step <= 5 us ({fmt(c)} us)"))
    return lines


def draw_chart(ours_doc, torch_doc, ours, torch, shapes, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    variants = [("eager_us", "eager"), ("per_block_us", "per-block graphs"),
                ("fused_us", "per-block fused"), ("whole_us", "whole"), ("floor_us", "floor")]
    series = []
    for i, (key, label) in enumerate(variants):
        series.append((ours, key, f"ours {label}", plt.cm.Blues(0.9 - 0.17 * i)))
    for i, (key, label) in enumerate(variants):
        series.append((torch, key, f"torch {label}", plt.cm.Oranges(0.9 - 0.17 * i)))

    n = len(series)
    width = 0.8 / n
    x = np.arange(len(shapes))
    fig, ax = plt.subplots(figsize=(max(8, 2.6 * len(shapes)), 5.5))
    for j, (src, key, label, color) in enumerate(series):
        vals = [num(src.get(s), key) for s in shapes]
        vals = [v if v is not None and v > 0 else np.nan for v in vals]
        ax.bar(x - 0.4 + width * (j + 0.5), vals, width, label=label, color=color,
               edgecolor="black", linewidth=0.3)
    ax.set_yscale("log")
    ax.set_xticks(x)
    ax.set_xticklabels([f"L={s[0]} H={s[1]} B={s[2]}" for s in shapes])
    ax.set_ylabel("microseconds per step (log scale)")
    ax.grid(axis="y", which="both", alpha=0.3)
    ax.set_axisbelow(True)
    device = ours_doc.get("device") or torch_doc.get("device") or "unknown device"
    date = ours_doc.get("date") or torch_doc.get("date") or ""
    ax.set_title(f"graphed vs PyTorch: training step time, {device}" + (f", {date}" if date else ""))
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=150, bbox_inches="tight")
    plt.close(fig)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ours", required=True, help="JSON from the Rust benchmark")
    parser.add_argument("--torch", required=True, help="JSON from bench/pytorch_bench.py")
    parser.add_argument("--chart", help="PNG path for the bar chart")
    parser.add_argument("--markdown", help="path for a GitHub markdown version of the table")
    args = parser.parse_args()

    ours_doc, torch_doc = load(args.ours), load(args.torch)
    ours, torch = by_shape(ours_doc), by_shape(torch_doc)
    shapes = list(ours) + [k for k in torch if k not in ours]
    if not shapes:
        raise SystemExit("no results in either file")

    print(f"ours : {ours_doc.get('device', '-')}  {ours_doc.get('date', '-')}"
          + (f"  {ours_doc['versions']}" if "versions" in ours_doc else ""))
    print(f"torch: {torch_doc.get('device', '-')}  {torch_doc.get('date', '-')}"
          f"  torch {torch_doc.get('torch', '-')}  cuda {torch_doc.get('cuda', '-')}")
    print()
    rows = table_rows(ours, torch, shapes)
    print(render_text(rows))

    print("\ntargets")
    targets = check_targets(ours, torch, shapes)
    for status, text in targets:
        print(f"  {status:4}  {text}")
    passed = sum(1 for s, _ in targets if s == "PASS")
    missed = sum(1 for s, _ in targets if s == "MISS")
    unknown = sum(1 for s, _ in targets if s == "n/a")
    print(f"\n{passed} PASS, {missed} MISS, {unknown} n/a")

    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(render_markdown(rows) + "\n\n")
            f.write("Targets:\n\n")
            for status, text in targets:
                f.write(f"- **{status}** {text}\n")
        print(f"wrote {args.markdown}", file=sys.stderr)
    if args.chart:
        draw_chart(ours_doc, torch_doc, ours, torch, shapes, args.chart)
        print(f"wrote {args.chart}", file=sys.stderr)


if __name__ == "__main__":
    main()
