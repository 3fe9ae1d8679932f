#!/usr/bin/env python3
"""Two op_bench outputs from two GPUs side by side: which ops got faster with the faster memory.

Each op's time on the first card over its time on the second, beside the same ratio for the
copy that sets both floors. An op whose time falls by the copy's ratio is bound by DRAM
bandwidth on both cards; one whose time stays (a ratio near 1) is bound by something the two
cards share (the multiprocessors' work, or latency at the bytes it keeps in flight), so its
x-of-floor grows on the card with the faster memory by the copy's ratio. Reads the table
op_bench prints (`op  dtype  size  us/op  MB moved  floor us  ratio`) and its `copy:` line;
needs no GPU.

    python3 bench/op_bench_cards.py SLOWER.txt FASTER.txt [--only REGEX]
"""
import argparse
import re
import sys

ROW = re.compile(r"^(\S.*?)\s{2,}(bf16|f32|f16)\s+(\S+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)")
COPY = re.compile(r"^copy: ([\d.]+) us per")
# op_bench's own header, else the first GPU a combined log names (a device script's).
DEVICE = re.compile(r"^op_bench on \S+ \((.*)\)|(NVIDIA [A-Z]\d+[^,(:)]*)")


def load(path):
    """(device, copy us, {(op, dtype, size): (us, x of floor)}) from one op_bench output."""
    device, copy_us, rows = "?", None, {}
    for line in open(path):
        if device == "?" and (m := DEVICE.search(line)):
            device = (m.group(1) or m.group(2)).strip()
        elif (m := COPY.match(line)) and copy_us is None:
            copy_us = float(m.group(1))
        elif m := ROW.match(line):
            rows[(m.group(1).strip(), m.group(2), m.group(3))] = (float(m.group(4)), float(m.group(7)))
    return device, copy_us, rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("slower")
    ap.add_argument("faster")
    ap.add_argument("--only", default="", help="a regex the op's name must match")
    a = ap.parse_args()
    (da, ca, ra), (db, cb, rb) = load(a.slower), load(a.faster)
    if not ca or not cb or not ra or not rb:
        print("op_bench_cards: no copy line or no op rows in one of the files", file=sys.stderr)
        return 2
    scale = ca / cb
    print(f"A: {da} ({a.slower}), copy {ca:.1f} us")
    print(f"B: {db} ({a.faster}), copy {cb:.1f} us: B's memory {scale:.2f}x A's")
    print(f"{'op':<28} {'dtype':<5} {'size':<15} {'A us':>8} {'A x':>6} {'B us':>8} {'B x':>6} {'A/B':>6}  bound on B")
    only = re.compile(a.only)
    for key, (ua, xa) in ra.items():
        if key not in rb or not only.search(key[0]):
            continue
        ub, xb = rb[key]
        r = ua / ub
        # Within a tenth of the copy's ratio: bandwidth; below half-way to 1: something else.
        what = "bandwidth" if r >= scale - 0.1 else "not bandwidth" if r < (1 + scale) / 2 else "partly"
        print(f"{key[0]:<28} {key[1]:<5} {key[2]:<15} {ua:8.1f} {xa:6.2f} {ub:8.1f} {xb:6.2f} {r:6.2f}  {what}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
