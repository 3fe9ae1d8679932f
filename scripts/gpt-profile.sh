#!/usr/bin/env bash
# Runs on the GPU machine after scripts/gpu-build.sh (carry gpu-bin): one eager step of the GPT
# (bf16, the GPU configuration) under Nsight Compute, kernel by kernel (GPU time only, clocks
# left alone), grouped by kernel name: where a step's GPU time goes.
#   bash scripts/gpt-profile.sh [extra gpt args...]
set -euo pipefail
cd "$(dirname "$0")/.."
. "$(dirname "${BASH_SOURCE[0]}")/cuda-env.sh"
out=${OUT:-/tmp/graphed-out}; mkdir -p "$out"
ncu --clock-control none --metrics gpu__time_duration.sum --csv --launch-count 3000 \
  gpu-bin/examples/gpt --mode eager --steps 3 --eval-every 1000 "$@" > "$out/gpt_ncu.csv" 2> "$out/gpt_ncu.err" || true
python3 - "$out/gpt_ncu.csv" <<'PY'
import csv, sys, collections
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
head, rows = rows[0], rows[1:]
name_i, val_i, unit_i = head.index("Kernel Name"), head.index("Metric Value"), head.index("Metric Unit")
ks = []
for r in rows:
    v = float(r[val_i].replace(",", ""))
    scale = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3}.get(r[unit_i], 1.0)
    ks.append((r[name_i], v * scale))
marks = [i for i, (n, _) in enumerate(ks) if "adamw_prepare" in n]
if len(marks) < 2:
    print("fewer than two optimizer steps profiled:", len(ks), "kernels"); sys.exit(0)
step = ks[marks[0]:marks[1]]  # one whole step: optimizer, zero grads, forward, backward
total = sum(t for _, t in step)
print(f"one eager step: {len(step)} kernels, {total:.0f} us of GPU time (sum of kernel durations)")
by = collections.defaultdict(lambda: [0, 0.0])
for n, t in step:
    key = n.split("(")[0][:70]
    by[key][0] += 1
    by[key][1] += t
for key, (c, t) in sorted(by.items(), key=lambda kv: -kv[1][1])[:30]:
    print(f"{t:9.1f} us {100 * t / total:5.1f}%  x{c:<4d} {key}")
PY
