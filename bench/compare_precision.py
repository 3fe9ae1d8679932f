"""bf16 side of the benchmark (#12): ours against PyTorch in the same run, with targets.

Inputs (all written in one GPU call by scripts/bench.sh):
  --ours-f32   examples/bench --out         (f32 model, ours)
  --ours-bf16  examples/bench --dtype bf16  (bf16 model, ours)
  --torch-bf16 bench/pytorch_bench.py --dtype bf16
  --ours-gemm  examples/bench --gemm        (bf16 GEMM TFLOP/s, ours)
  --torch-gemm bench/pytorch_bench.py --gemm

Prints, per shape, the bf16 columns (eager, per-block, whole, floor, capture, pool) for us
and PyTorch with torch/ours ratios, our bf16-over-f32 speed-up per variant, the GEMM TFLOP/s
next to torch.matmul, then PASS / MISS against the targets of issue #12:
  - bf16 GEMM at 8192^3 >= 0.9x torch.matmul;
  - 8x4096x512 bf16 per-block step >= 4x faster than our f32 per-block step;
  - 8x4096x512 bf16 per-block step no slower than PyTorch's bf16 per-block step.
Missing inputs or keys print "-" and the target that needs them prints "n/a".

Run:
  python3 bench/compare_precision.py --ours-f32 ours.json --ours-bf16 ours_bf16.json \\
      --torch-bf16 torch_bf16.json --ours-gemm ours_gemm.json --torch-gemm torch_gemm.json
"""

import argparse
import json
import os

VARIANTS = ["eager_us", "per_block_us", "whole_us", "floor_us"]


def load(path):
    if not path or not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


def rows(doc):
    if not doc:
        return {}
    return {(int(r["L"]), int(r["H"]), int(r["B"])): r for r in doc.get("results", [])}


def gemm(doc):
    if not doc:
        return {}
    return {int(r["size"]): float(r["tflops"]) for r in doc.get("gemm", [])}


def get(row, key):
    v = None if row is None else row.get(key)
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def ratio(a, b):
    return None if a is None or b is None or b == 0 else a / b


def fmt(v, digits=1):
    return "-" if v is None else f"{v:.{digits}f}"


def verdict(ok):
    return "n/a" if ok is None else ("PASS" if ok else "MISS")


def shape_table(o32, o16, t16):
    print("bf16 step, microseconds (median) - ours | torch bf16 | torch/ours | ours f32/ours bf16")
    head = f"{'L x H, B':>14} {'variant':>10} {'ours':>10} {'torch':>10} {'speed-up':>9} {'vs f32':>8}"
    print(head)
    for key in sorted(set(o16) | set(t16)):
        name = f"{key[0]}x{key[1]}, {key[2]}"
        for v in VARIANTS:
            ours, torch_ = get(o16.get(key), v), get(t16.get(key), v)
            print(f"{name:>14} {v[:-3]:>10} {fmt(ours):>10} {fmt(torch_):>10} "
                  f"{fmt(ratio(torch_, ours), 2):>9} {fmt(ratio(get(o32.get(key), v), ours), 2):>8}")
        for v, digits in (("capture_ms", 2), ("pool_mb", 2)):
            ours, torch_ = get(o16.get(key), v), get(t16.get(key), v)
            print(f"{name:>14} {v:>10} {fmt(ours, digits):>10} {fmt(torch_, digits):>10} "
                  f"{fmt(ratio(ours, torch_), 2):>9} {'':>8}")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    for flag in ("--ours-f32", "--ours-bf16", "--torch-bf16", "--ours-gemm", "--torch-gemm"):
        p.add_argument(flag)
    a = p.parse_args()
    o32, o16, t16 = rows(load(a.ours_f32)), rows(load(a.ours_bf16)), rows(load(a.torch_bf16))
    og, tg = gemm(load(a.ours_gemm)), gemm(load(a.torch_gemm))

    shape_table(o32, o16, t16)
    print("\nbf16 GEMM, TFLOP/s - ours | torch.matmul | ours/torch")
    for n in sorted(set(og) | set(tg)):
        print(f"{n:>6}^3 {fmt(og.get(n)):>8} {fmt(tg.get(n)):>8} {fmt(ratio(og.get(n), tg.get(n)), 3):>7}")

    print("\ntargets (#12)")
    g = ratio(og.get(8192), tg.get(8192))
    print(f"  bf16 GEMM 8192^3 >= 0.9x torch.matmul: {fmt(g, 3)}x  {verdict(None if g is None else g >= 0.9)}")
    big = (8, 4096, 512)
    ours16, ours32, torch16 = (get(o16.get(big), "per_block_us"), get(o32.get(big), "per_block_us"),
                               get(t16.get(big), "per_block_us"))
    s = ratio(ours32, ours16)
    print(f"  8x4096x512 bf16 per-block >= 4x faster than our f32: {fmt(s, 2)}x  "
          f"{verdict(None if s is None else s >= 4.0)}")
    t = ratio(torch16, ours16)
    print(f"  8x4096x512 bf16 per-block no slower than torch bf16: {fmt(t, 3)}x  "
          f"{verdict(None if t is None else t >= 1.0)}")


if __name__ == "__main__":
    main()
