#!/usr/bin/env python3
"""The cross-entropy forward with its mean folded into the row kernel, against the runtime's two
launches, on the GPU machine (bench/xent_fold.cu says how each fold works).

The runtime's op at rows of 8 KB and more is `sx_smem_*` (the row in shared memory, a block a
row) and then `xent_mean_f32` (one block of 1024 threads). This times, over a CUDA graph of 20
ops as examples/op_bench does, at the runtime's launch (its threads a block, a block a row):

- `two`: the runtime's two launches;
- `spin`: `xf_spin_*` (the last block reads the losses as they arrive; no fence, no count);
- `ticket`: `xf_ticket_*` (a fence and a ticket a block; the last arrival adds);

each with the buffers rotated past the L2 (as bench/xent_sweep.py) and with one set (as
op_bench), and prints x-of-floor (logits read and probabilities written over the copy
bandwidth). It checks the probabilities bit for bit against the runtime's kernel, the means
against the runtime's (relative 1e-6: the order of the sums differs) and a float64 reference,
that a fold gives the same bits launch after launch, and that `spin` leaves its slots empty.

    python3 bench/xent_fold.py [--quick] [--out DIR]
"""
import argparse
import json
import os
import sys
import time

import cupy as cp
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import row_sweep as rs  # noqa: E402
import xent_sweep as xs  # noqa: E402

EXTRA = open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "xent_fold.cu")).read()
EMPTY = np.uint32(0x7FBADBAD).view(np.float32)


def threads_for(c, elem):
    """ops::loss::xent_launch's threads for a row of c values held in one block."""
    words = -(-c * elem // 16)
    return min(1024, max(128, rs.next_pow2(-(-words // 8))))


def smem_for(c, elem):
    w = 16 // elem
    return 16 * -(-(c + (0 if c % w == 0 else w - 1)) // w)


def launcher(P, kind, dt, rows, c):
    elem = 4 if dt == "f32" else 2
    th, sm = threads_for(c, elem), smem_for(c, elem)
    names = {"two": f"sx_smem_{dt}", "spin": f"xf_spin_{dt}", "ticket": f"xf_ticket_{dt}"}
    f = P.f(names[kind])
    if f.max_dynamic_shared_size_bytes < sm:
        f.max_dynamic_shared_size_bytes = sm
    mean = P.f("xent_mean_f32")
    n, cc = np.uint32(rows), np.uint32(c)

    def run(b):
        if kind == "two":
            f((rows,), (th,), (b["p"], b["rl"], b["x"], b["l"], n, cc), shared_mem=sm)
            mean((1,), (1024,), (b["loss"], b["rl"], b["l"], n))
        elif kind == "spin":
            f((rows,), (th,), (b["p"], b["slots"], b["x"], b["l"], n, cc, b["loss"]), shared_mem=sm)
        else:
            f((rows,), (th,), (b["p"], b["rl"], b["x"], b["l"], n, cc, b["loss"], b["ticket"]), shared_mem=sm)
    return run, th


def case(xb, lab, rows, c, dt):
    b = xs.device_case(xb, lab, rows, c, dt)
    b["slots"] = cp.full(rows, EMPTY, cp.float32)
    b["ticket"] = cp.zeros(1, cp.uint32)
    return b


def main():
    ap = argparse.ArgumentParser()
    a, lines, log, sms = rs.start(ap)
    t0 = time.time()
    P = rs.Prog(4, extra=EXTRA)
    log(f"built in {P.compile_s:.1f} s")
    reps = 20 if a.quick else 50
    bw, _ = rs.copy_bandwidth(reps)
    log(f"copy bandwidth {bw / 1e9:.0f} GB/s")
    shapes = [("bf16", 4096, 4096), ("bf16", 2048, 8192), ("f32", 4096, 4096), ("bf16", 8192, 4096), ("bf16", 16384, 4096),
              ("bf16", 4096, 32768), ("f32", 4096, 32768)]
    if a.quick:
        shapes = shapes[:4]
    ok, out = True, []
    for dt, rows, c in shapes:
        elem = 4 if dt == "f32" else 2
        per_call = 2 * rows * c * elem
        x, xb, lab = xs.host_case(rows, c, rows + c, dt)
        lab[lab >= c] = 1.0  # no bad label: the means must be numbers to compare
        _, rl_ref = xs.reference(x, lab)
        keep = lab != xs.IGNORE
        want = float(np.sum(rl_ref[keep]) / max(1, keep.sum()))
        nsets = max(1, min(16, -(-rs.L2_BYTES // per_call)))
        sets = [case(xb, lab, rows, c, dt) for _ in range(nsets)]
        floor_us = per_call / bw * 1e6
        res, means = {}, {}
        for kind in ("two", "spin", "ticket"):
            run, th = launcher(P, kind, dt, rows, c)
            b = sets[0]
            got = []
            for _ in range(3):
                run(b)
                cp.cuda.Device().synchronize()
                got.append(np.float32(cp.asnumpy(b["loss"])[0]))
            probs = cp.asnumpy(b["p"]).copy()
            if kind == "two":
                probs_two = probs
            elif probs.tobytes() != probs_two.tobytes():
                ok = False
                log(f"FAIL {kind} {dt} {rows}x{c}: probabilities differ from the runtime kernel's")
            if len({g.tobytes() for g in got}) != 1:
                ok = False
                log(f"FAIL {kind} {dt} {rows}x{c}: the mean moved between launches {got}")
            if kind == "spin" and not np.all(cp.asnumpy(b["slots"]).view(np.uint32) == 0x7FBADBAD):
                ok = False
                log(f"FAIL spin {dt} {rows}x{c}: slots not left empty")
            means[kind] = float(got[0])
            us1 = rs.time_graph(run, sets[:1], 20, reps)
            usn = rs.time_graph(run, sets, 20, reps)
            res[kind] = (usn, us1, th)
        # The means of the folds against the runtime's (both NaN only if a row were NaN).
        for kind in ("spin", "ticket"):
            m, m0 = means[kind], means["two"]
            same_nan = np.isnan(m) and np.isnan(m0) and np.isnan(want)
            if not same_nan and not (abs(m - m0) <= 1e-6 * abs(m0)):
                ok = False
                log(f"FAIL {kind} {dt} {rows}x{c}: mean {m!r} against the runtime's {m0!r}")
        log(f"\n{dt} {rows}x{c}: floor {floor_us:.1f} us, {nsets} buffer sets, {res['two'][2]} threads a block; "
            f"means {means['two']!r} / {means['spin']!r} / {means['ticket']!r} (reference {want!r})")
        for kind in ("two", "spin", "ticket"):
            usn, us1, _ = res[kind]
            log(f"  {kind:<7} rotated {usn:7.1f} us {usn / floor_us:5.2f}x   one set {us1:7.1f} us {us1 / floor_us:5.2f}x")
            out.append(dict(dtype=dt, rows=rows, c=c, kind=kind, us_rotated=usn, us_one_set=us1, floor_us=floor_us))
        del sets
        cp.get_default_memory_pool().free_all_blocks()
    log(f"\ncorrectness: {'ALL OK' if ok else 'FAILURES'}; done in {time.time() - t0:.0f} s")
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "xent_fold.json"), "w") as f:
        json.dump(dict(rows=out, ok=ok), f, indent=1)
    with open(os.path.join(a.out, "xent_fold.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
