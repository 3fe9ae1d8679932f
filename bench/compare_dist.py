"""Side-by-side table of the data-parallel benchmarks, with the targets of issue #14.

Inputs: --ours (examples/dist_bench --out) and --torch (bench/pytorch_ddp_bench.py --out), both
{"rows": [{"l", "h", "b", "gpus", "one_us", "many_us", "ratio", "efficiency"}, ...]}; ours also
has "inline_us" and "overlap_us" (many_us is the faster of the two), shown in a second table.

Targets, per shape:
  ours N-GPU step / ours 1-GPU step <= 1.15     (32x256x32 and 16x1024x128)
  torch DDP N-GPU step / ours N-GPU step >= 3   (32x256x32)
Exit status 1 when a target is missed or a shape is missing, so scripts can tell.

Run:
  python3 bench/compare_dist.py --ours dist.json --torch torch_ddp.json [--markdown out.md]
"""

import argparse
import json
import sys

SCALING = [(32, 256, 32), (16, 1024, 128)]
SPEEDUP = [(32, 256, 32)]


def load(path):
    with open(path) as f:
        return {(r["l"], r["h"], r["b"]): r for r in json.load(f)["rows"]}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--ours", required=True)
    p.add_argument("--torch", required=True)
    p.add_argument("--markdown")
    a = p.parse_args()
    ours, torch = load(a.ours), load(a.torch)
    lines = [
        "| shape (LxHxB) | ours 1 GPU (us) | ours N GPUs (us) | ours N/1 | ours efficiency "
        "| torch 1 GPU (us) | torch DDP N GPUs (us) | torch N/1 | torch efficiency | torch DDP / ours (N GPUs) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for key in sorted(set(ours) | set(torch)):
        o, t = ours.get(key), torch.get(key)
        f = lambda r, k, fmt: format(r[k], fmt) if r else "-"  # noqa: E731
        speed = f"{t['many_us'] / o['many_us']:.2f}x" if o and t else "-"
        lines.append(
            f"| {'x'.join(map(str, key))} | {f(o, 'one_us', '.1f')} | {f(o, 'many_us', '.1f')} | {f(o, 'ratio', '.3f')} "
            f"| {f(o, 'efficiency', '.1%')} | {f(t, 'one_us', '.1f')} | {f(t, 'many_us', '.1f')} | {f(t, 'ratio', '.3f')} "
            f"| {f(t, 'efficiency', '.1%')} | {speed} |"
        )
    lines += ["", "| shape (LxHxB) | ours N GPUs, shared buckets in place (us) | ours N GPUs, overlapped on a side stream (us) |",
              "|---|---:|---:|"]
    for key in sorted(ours):
        o = ours[key]
        lines.append(f"| {'x'.join(map(str, key))} | {o.get('inline_us', float('nan')):.1f} | {o.get('overlap_us', float('nan')):.1f} |")
    targets, ok = [], True
    for key in SCALING:
        o = ours.get(key)
        good = bool(o) and o["ratio"] <= 1.15
        ok &= good
        got = f"{o['ratio']:.3f}" if o else "missing"
        targets.append(f"{'PASS' if good else 'MISS'}  {'x'.join(map(str, key))}: ours N-GPU / 1-GPU step = {got} (target <= 1.15)")
    for key in SPEEDUP:
        o, t = ours.get(key), torch.get(key)
        good = bool(o and t) and t["many_us"] / o["many_us"] >= 3.0
        ok &= good
        got = f"{t['many_us'] / o['many_us']:.2f}x" if o and t else "missing"
        targets.append(f"{'PASS' if good else 'MISS'}  {'x'.join(map(str, key))}: torch DDP+graphs / ours at N GPUs = {got} (target >= 3x)")
    text = "\n".join(lines) + "\n\n" + "\n".join(targets) + "\n"
    print(text)
    if a.markdown:
        with open(a.markdown, "w") as f:
            f.write(text)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
