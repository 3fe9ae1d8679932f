#!/usr/bin/env python3
"""The table of scripts/decoder-variants.sh: ms a token (the WHILE loop) by batch, one column a
version of the one-kernel decoding step (dec_<n>-<name>.json, `gpt --decode-bench --json`), and
PyTorch's compiled decode where torch.json is there (bench/pytorch_gpt_decode.py --out). Each
column's ratio to the first version follows the table.

    python3 bench/decode_variants.py DIR
"""
import glob
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from compare_decode import rows_by  # noqa: E402


def load(path):
    """A --json file's result, or None where the run left none."""
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def rows(path, path_name):
    """ms a token by batch for one path of a --json file ({} where the run left none)."""
    result = load(path)
    if result is None:
        return {}
    return {b: r["ms_per_token"] for b, r in rows_by(result, path_name).items()}


def kernel_note(path):
    """A line where a version's one kernel did not run (a knob the GPU refused: its figures are
    the unfused ops'), else None."""
    result = load(path)
    if result is not None and result.get("one_kernel_batch", 1) == 0:
        return f"note: {os.path.basename(path)[4:-5]}: the one kernel did not run here; its column is the unfused ops'"
    return None


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    folder = sys.argv[1]
    versions = sorted(glob.glob(os.path.join(folder, "dec_*.json")), key=lambda p: int(os.path.basename(p)[4:].split("-")[0]))
    cols = [(os.path.basename(p)[4:-5], rows(p, "while")) for p in versions]
    torch = rows(os.path.join(folder, "torch.json"), "compiled")
    if torch:
        cols.append(("torch.compile", torch))
    if not cols:
        sys.exit(f"no dec_*.json in {folder}")
    batches = sorted({b for _, c in cols for b in c})
    print("ms a token (WHILE loop; PyTorch: its compiled decode)")
    print("batch " + " ".join(f"{n:>14}" for n, _ in cols))
    for b in batches:
        print(f"{b:5d} " + " ".join(f"{c[b]:14.4f}" if b in c else f"{'-':>14}" for _, c in cols))
    for p in versions:
        note = kernel_note(p)
        if note:
            print(note)
    first_name, first = cols[0]
    for name, c in cols[1:]:
        ratios = [f"{b}: {c[b] / first[b]:.3f}" for b in batches if b in c and b in first]
        print(f"{name} / {first_name}: " + ", ".join(ratios))


if __name__ == "__main__":
    main()
