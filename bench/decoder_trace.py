#!/usr/bin/env python3
"""Where the one-kernel decoding step's time goes, stage by stage, from the marks it records with
GRAPHED_DECODER_TRACE=<dir> (runtime/backend/kernels/decoder.cu, FD_TRACE): each block's thread 0
stamps clock64 when its inputs are on chip, when its first tile pass's K loop is done, at the
grid barrier and past it, and %globaltimer at the barrier and past it.

    python3 bench/decoder_trace.py DIR/decoder-trace-b1.bin [more.bin ...]

For each kind of stage (the median over the layers) it prints the critical block's time from
the stage's start to its arrival at the barrier, split into: inputs (staging the activation rows
and the rstd, waiting for the weights' copy), the K loop, the rest (the reduction over warps, the
epilogue, the next stage's weight copy issued), then the barrier: from the last block's arrival
to the blocks leaving (globaltimer). Clocks are turned into ns per block from its own clock and
globaltimer over the whole kernel.
"""
import statistics
import struct
import sys

READY, KDONE, ARRIVE, LEAVE, GT_ARRIVE, GT_LEAVE = range(6)


def load(path):
    """(grid, batch, marks[block][stage][slot])"""
    with open(path, "rb") as f:
        grid, stages, slots, batch = struct.unpack("<4I", f.read(16))
        flat = struct.unpack(f"<{grid * stages * slots}Q", f.read(8 * grid * stages * slots))
    marks = [[list(flat[(b * stages + s) * slots:(b * stages + s + 1) * slots]) for s in range(stages)] for b in range(grid)]
    return grid, batch, marks


def kinds(code, layers):
    """The stages' names: code bit 0, the embedding summed in the first stage (no stage of its
    own); bit 1, the output projection computed in the attention stage."""
    names = [] if code & 1 else ["embedding"]
    per_layer = ["norm+qkv", "attention+out proj", "norm+gate/up", "down proj"] if code & 2 else \
        ["norm+qkv", "attention", "out proj", "norm+gate/up", "down proj"]
    return names + per_layer * layers + ["norm+head"], layers


def report(path):
    grid, batch, m = load(path)
    blocks = range(grid)
    start_clk = [m[b][-1][READY] for b in blocks]
    start_gt = [m[b][-1][GT_LEAVE] for b in blocks]
    # The buffer outlives launches: a launch with fewer stages leaves later slots stale, so only
    # the stages this launch's layout has count.
    names, layers = kinds(m[0][-1][KDONE], m[0][-1][ARRIVE])
    if len(names) > len(m[0]) - 1:
        # The kernel marks FD_TRACE_STAGES - 1 stages at most (the last slot holds the layout).
        print(f"{path}: {len(names)} stages, only the first {len(m[0]) - 1} were marked", file=sys.stderr)
        names = names[:len(m[0]) - 1]
    used = list(range(len(names)))
    n = len(used)
    end = used[-1]
    ns_per_clk = [(m[b][end][GT_LEAVE] - start_gt[b]) / max(m[b][end][LEAVE] - start_clk[b], 1) for b in blocks]
    rows = {}
    prev_clk, prev_gt = start_clk, start_gt
    for s, name in zip(used, names):
        ready = [m[b][s][READY] or prev_clk[b] for b in blocks]
        kdone = [m[b][s][KDONE] for b in blocks]
        arrive = [m[b][s][ARRIVE] for b in blocks]
        span = [(arrive[b] - prev_clk[b]) * ns_per_clk[b] for b in blocks]
        c = max(blocks, key=lambda b: span[b])
        k = ns_per_clk[c]
        inputs = (ready[c] - prev_clk[c]) * k
        kloop = (kdone[c] - ready[c]) * k if kdone[c] else 0.0
        rest = (arrive[c] - (kdone[c] or ready[c])) * k
        leave_gt = [m[b][s][GT_LEAVE] for b in blocks]
        release = statistics.median(leave_gt) - max(m[b][s][GT_ARRIVE] for b in blocks)
        stage_total = statistics.median(leave_gt) - statistics.median(prev_gt)
        if s == used[-1]:
            # The last stage ends at no barrier: each block marks its own end; the kernel ends
            # with the last of them.
            release = 0.0
            stage_total = max(leave_gt) - statistics.median(prev_gt)
        busy = sum(1 for v in kdone if v) or grid
        rows.setdefault(name, []).append((span[c], inputs, kloop, rest, release, stage_total, busy))
        prev_clk = [m[b][s][LEAVE] for b in blocks]
        prev_gt = leave_gt
    total = max(m[b][end][GT_LEAVE] for b in blocks) - statistics.median(start_gt)
    print(f"## {path}: batch {batch}, grid {grid}, {layers} layers, {n} stages, kernel {total / 1000:.1f} us "
          f"({total / n / 1000:.2f} us a stage)")
    print("| stage | count | stage us | critical block: to barrier | inputs | K loop | rest | barrier release | blocks with tiles |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, r in rows.items():
        a = [statistics.median(x[i] for x in r) for i in range(7)]
        print(f"| {name} | {len(r)} | {a[5] / 1000:.2f} | {a[0] / 1000:.2f} | {a[1] / 1000:.2f} | {a[2] / 1000:.2f} | "
              f"{a[3] / 1000:.2f} | {a[4] / 1000:.2f} | {int(a[6])} |")
    sums = {name: sum(x[5] for x in r) for name, r in rows.items()}
    print("time by stage kind (us): " + ", ".join(f"{k} {v / 1000:.1f}" for k, v in sums.items()))
    print()


if __name__ == "__main__":
    for p in sys.argv[1:]:
        report(p)
