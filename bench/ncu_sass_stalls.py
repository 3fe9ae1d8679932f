#!/usr/bin/env python3
"""Where a kernel's warps wait, instruction by instruction, from Nsight Compute's source page.

    ncu --section WarpStateStats --section SourceCounters -o prof <program>
    ncu -i prof.ncu-rep --page source --csv --print-source sass > sass.csv
    python3 bench/ncu_sass_stalls.py sass.csv [--window 64] [--top 25]

Prints the stall samples by reason, the windows of consecutive SASS instructions with the most
samples (with their top three reasons and first instruction), and the machine code the launch
executed (instructions run at least once, 16 bytes each): against the kernel's whole size it
says how much code the warps had to fetch. Used on the decoder step (docs/BENCHMARKS.md,
call L): a barrier stall right after a grid-barrier poll loop is the block's other warps waiting
for its thread 0, and "no_inst" is instruction fetch.
"""
import argparse
import csv


def num(x):
    try:
        return float(x)
    except ValueError:
        return 0.0


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv")
    ap.add_argument("--window", type=int, default=64)
    ap.add_argument("--top", type=int, default=25)
    args = ap.parse_args()
    rows = list(csv.reader(open(args.csv)))
    # Line 0 names the kernel, line 1 the columns.
    hdr, data = rows[1], rows[2:]
    ix = {h: i for i, h in enumerate(hdr)}
    reasons = [h for h in hdr if h.startswith("stall_") and "Not Issued" not in h]
    total = {c: sum(num(r[ix[c]]) for r in data) for c in reasons}
    n = sum(total.values()) or 1.0
    print(f"{rows[0][1] if len(rows[0]) > 1 else 'kernel'}: {len(data)} instructions, {n:.0f} stall samples")
    for c, v in sorted(total.items(), key=lambda x: -x[1])[:10]:
        print(f"  {c:25s} {v:8.0f} {100 * v / n:5.1f}%")
    samples = [num(r[ix["Warp Stall Sampling (All Samples)"]]) for r in data]
    windows = sorted(((sum(samples[i:i + args.window]), i) for i in range(0, len(data), args.window)), reverse=True)
    print(f"hottest windows of {args.window} instructions (index, samples, top reasons | first instruction)")
    for s, i in windows[:args.top]:
        sub = data[i:i + args.window]
        per = sorted(((sum(num(r[ix[c]]) for r in sub), c) for c in reasons), reverse=True)[:3]
        print(f"  {i:6d} {s:6.0f} " + " ".join(f"{c[6:]}={v:.0f}" for v, c in per) + " | " + sub[0][1].strip()[:60])
    executed = sum(1 for r in data if num(r[ix["Instructions Executed"]]) > 0)
    print(f"machine code executed: {executed * 16 / 1024:.1f} KB of {len(data) * 16 / 1024:.1f} KB")


if __name__ == "__main__":
    main()
