#!/usr/bin/env python3
"""Softmax cross-entropy's forward on the GPU machine: correctness, a launch-shape sweep, x-of-floor.

The op (ops::softmax_cross_entropy on CUDA) is two parts: the row kernel (`sx_rows_*`, the row
held in registers: probabilities and each row's loss) and the mean over the rows not ignored.
This compiles the runtime's kernels (the main program's files up to transformer.cu, as
bench/row_sweep.py does) with NVRTC through CuPy once per "16-byte words a thread holds" value
(RN_FWD_VPT), with kernels of its own beside them (bench/xent_variants.cu):

- `old_sx_rows_*`: the row kernel before session 22 (thread 0 read the label's logit again
  from memory after the row's reductions; expf);
- `online_sx_rows_*`: one reduction a row instead of two (each thread's (max, sum of exps)
  merged across the row, the online softmax), other bits;
- `lb_online_sx_rows_*` (kind online64): the one-reduction kernel held to 64 registers by
  launch bounds, as the runtime's are (four 256-thread blocks an SM; at most 256 threads);
- `early_sx_rows_*`: the runtime's kernel with expf for its exponentials (the runtime's take
  one FFMA and ex2), the label's logit read by thread 0 when the row group starts as the
  runtime's does; old reads it after the reductions, with the same bits as early.

It checks every variant against a numpy reference (and old == early bit for bit), times the
row kernels over launch shapes (words a thread, threads a block, grid cap) in f32 and bf16 at
several shapes, the wide-row kernels (the runtime's row in shared memory, `sx_smem_*`, over
threads a block; the same with the row's sum of exps taken as its stages land,
`online_sx_smem_*`, and with each exp computed once, `reg_sx_smem_*` (checked bit for bit
against sx_smem); its two-read one-block-a-row kernel for rows past the shared memory; the
three-read form before session 22, old_softmax_xent_*) with rows that are whole 16-byte words
and rows that are not (32771, 131071 classes), beside the register kernel where it holds the
row (--quick: bf16 at the four shapes op_bench finds furthest from the floor, first), and the
mean's two forms (the partial sums' three launches against one block's one), each over a CUDA graph of many launches rotating buffers past the L2, and prints
x-of-floor (the op's bytes: logits read, probabilities written, over the copy bandwidth).

    python3 bench/xent_sweep.py [--quick] [--out DIR]
"""
import argparse
import itertools
import os
import sys
import time

import cupy as cp
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import row_sweep as rs  # noqa: E402

IGNORE = -100.0
# reg_sx_smem_*'s 16-byte words a thread (its MAXW, xent_variants.cu).
RSMEM_WORDS = 4

# The previous row kernel and the one-reduction variant (bench/xent_variants.cu).
EXTRA = open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "xent_variants.cu")).read()

KERNEL = {"old": "old_sx_rows", "rows": "sx_rows", "online": "online_sx_rows", "online64": "lb_online_sx_rows",
          "early": "early_sx_rows"}


def launch_dims(rows, c, elem, vpt, rows_a_block, max_blocks):
    """RowTiles::fwd_launch with `rows_a_block` rows a block: (grid, block) or None past 1024 threads."""
    tpr = rs.next_pow2(max(1, -(-c // (vpt * (16 // elem)))))
    threads = tpr * rows_a_block
    if threads > 1024:
        return None
    blocks = max(1, min(-(-rows // rows_a_block), max_blocks))
    return (blocks, 1, 1), (tpr, rows_a_block, 1)


def run_rows(P, kind, dt, b, rows, c, rpb, grid):
    elem = 4 if dt == "f32" else 2
    lc = launch_dims(rows, c, elem, P.vpt, rpb, grid)
    if lc is None:
        return False
    P.f(f"{KERNEL[kind]}_{dt}")(lc[0], lc[1], (b["p"], b["rl"], b["x"], b["l"], np.uint32(rows), np.uint32(c)))
    return True


SMEM_MAX = 227 * 1024  # the opt-in dynamic shared memory of a block on sm_90


def run_wide(P, kind, dt, b, rows, c, threads=None, grid=None):
    """The wide-row kernels: `new` the runtime's one block a row (two reads of the row), `old`
    the previous (three), launched as the runtime launches them (ops::row_dims: a block a row,
    row_threads(c) threads); `smem` the runtime's row in shared memory (one read), at `threads`
    and `grid` (default: the runtime's threads, a block a row), `osmem` the same with the row's
    sum of exps taken as its stages land (online_sx_smem_*, xent_variants.cu), `rsmem` the same
    with each exp computed once, kept in registers (reg_sx_smem_*: at most RSMEM_WORDS 16-byte
    words a thread). Returns False where the kind cannot take the shape (the row within a
    block's shared memory; rsmem: within the block's registers)."""
    elem = 4 if dt == "f32" else 2
    name = {"old": "old_softmax_xent", "new": "softmax_xent", "smem": "sx_smem", "osmem": "online_sx_smem",
            "rsmem": "reg_sx_smem"}[kind] + "_" + dt
    threads = threads or min(512, max(32, -(-c // 32) * 32))
    grid = min(rows, grid or (1 << 20))
    args = (b["p"], b["rl"], b["x"], b["l"], np.uint32(rows), np.uint32(c))
    if kind in ("smem", "osmem", "rsmem"):
        sm = 16 * -(-(c + (0 if c % (16 // elem) == 0 else 16 // elem - 1)) // (16 // elem))
        if sm > SMEM_MAX or (kind == "rsmem" and sm // 16 > RSMEM_WORDS * threads):
            return False
        f = P.f(name)
        if f.max_dynamic_shared_size_bytes < sm:
            f.max_dynamic_shared_size_bytes = sm
        # No cluster: the row kernel alone.
        f((grid,), (threads,), args, shared_mem=sm)
        return True
    P.f(name)((grid,), (threads,), args)
    return True


def run_mean(P, kind, b, rows):
    if kind == "one":
        P.f("xent_mean_f32")((1,), (1024,), (b["loss"], b["rl"], b["l"], np.uint32(rows)))
        return
    if kind == "at-once":
        P.f("xent_mean_at_once_f32")((1,), (1024,), (b["loss"], b["rl"], b["l"], np.uint32(rows)))
        return
    blocks = max(1, min(-(-rows // 2048), 1024))
    n = np.uint32(rows)
    P.f("sum_partial_f32")((blocks,), (256,), (b["part"], b["rl"], n))
    P.f("count_labels_partial_f32")((blocks,), (256,), (b["cnt"], b["l"], n))
    P.f("mean_final_f32")((1,), (256,), (b["loss"], b["part"], b["cnt"], np.uint32(blocks)))


def host_case(rows, c, seed, dt):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((rows, c)) * 3).astype(np.float32)
    if dt == "bf16":
        xb = rs.to_bf16(x).reshape(rows, c)
        x = rs.from_bf16(xb).reshape(rows, c)
    else:
        xb = x
    lab = rng.integers(0, c, rows).astype(np.float32)
    lab[1::7] = IGNORE
    if rows > 3:
        lab[3] = c + 0.5  # not a class id: NaN
    return x, xb, lab


def device_case(xb, lab, rows, c, dt):
    return {"x": cp.asarray(xb), "l": cp.asarray(lab),
            "p": cp.zeros((rows, c), cp.float32 if dt == "f32" else cp.uint16),
            "rl": cp.zeros(rows, cp.float32), "loss": cp.zeros(1, cp.float32),
            "part": cp.zeros(1024, cp.float32), "cnt": cp.zeros(1024, cp.float32)}


def reference(x, lab):
    x64 = x.astype(np.float64)
    m = x64.max(1, keepdims=True)
    e = np.exp(x64 - m)
    p = e / e.sum(1, keepdims=True)
    lse = (m[:, 0] + np.log(e.sum(1)))
    rl = np.zeros(len(lab))
    for r, l in enumerate(lab):
        if l == IGNORE:
            rl[r] = 0.0
        elif l < 0 or l >= x.shape[1] or l != int(l):
            rl[r] = np.nan
        else:
            rl[r] = lse[r] - x64[r, int(l)]
    return p, rl


def main():
    ap = argparse.ArgumentParser()
    a, lines, log, sms = rs.start(ap)
    t0 = time.time()
    progs = []
    for vpt in ((4, 8) if a.quick else (2, 4, 8)):
        P = rs.Prog(vpt, extra=EXTRA)
        progs.append(P)
        log(f"vpt {vpt}: compiled in {P.compile_s:.1f} s")
    reps = 5 if a.quick else 20
    bw, copy_us = rs.copy_bandwidth(reps)
    log(f"copy: {copy_us:.1f} us per 64 MiB copy = {bw / 1e9:.0f} GB/s (read + write): the floor's bandwidth")

    kinds = ("old", "rows", "online", "online64", "early")
    P0w = progs[0]
    rpbs = (1, 2, 4, 8)
    grids = (2 * sms, 4 * sms, 8 * sms, 1 << 20)

    # Correctness: every kind at every vpt (the runtime's launch: rows a block from 256 threads).
    ok = True
    for dt in ("f32", "bf16"):
        for rows, c in ((7, 64), (33, 1000), (9, 4096), (5, 8192)):
            x, xb, lab = host_case(rows, c, rows * 7 + c, dt)
            p_ref, rl_ref = reference(x, lab)
            for P in progs:
                got = {}
                for kind in kinds:
                    b = device_case(xb, lab, rows, c, dt)
                    try:
                        if not run_rows(P, kind, dt, b, rows, c, 1, 4 * sms):
                            continue
                        cp.cuda.Device().synchronize()
                    except cp.cuda.driver.CUDADriverError:
                        continue  # more threads a block than the launch bounds allow
                    cp.cuda.Device().synchronize()
                    p = cp.asnumpy(b["p"])
                    p = p if dt == "f32" else rs.from_bf16(p).reshape(rows, c)
                    rl = cp.asnumpy(b["rl"])
                    got[kind] = (p, rl)
                    tol = 1e-5 if dt == "f32" else 1e-2
                    nan_ok = np.array_equal(np.isnan(rl), np.isnan(rl_ref))
                    fin = ~np.isnan(rl_ref)
                    e_p, e_l = rs.rel(p, p_ref), rs.rel(rl[fin], rl_ref[fin])
                    good = e_p < tol and e_l < 1e-5 and nan_ok
                    ok &= good
                    if not good:
                        log(f"FAIL {kind} {dt} vpt {P.vpt} {rows}x{c}: probs {e_p:.1e} row loss {e_l:.1e} NaNs {'ok' if nan_ok else 'differ'}")
                for twin in ("early",):
                    if "old" in got and twin in got:
                        same = all(np.array_equal(u.view(np.uint32), v.view(np.uint32)) for u, v in zip(got["old"], got[twin]))
                        ok &= same
                        if not same:
                            log(f"FAIL {twin} != old bit for bit: {dt} vpt {P.vpt} {rows}x{c}")
    # The one-block-a-row kernels on wide rows, with masked (-inf) logits at the start of rows.
    for dt in ("f32", "bf16"):
        for rows, c in ((5, 20000), (3, 70001), (4, 40000), (6, 4096), (5, 4099)):
            x, xb, lab = host_case(rows, c, rows + c, dt)
            x[0, :700] = -np.inf
            x[2, 5:9] = -np.inf
            xb = x if dt == "f32" else rs.to_bf16(x).reshape(rows, c)
            if lab[0] < 700:
                lab[0] = 700
            p_ref, rl_ref = reference(x, lab)
            for kind, threads, grid in (("old", None, None), ("new", None, None), ("smem", 256, None), ("smem", 1024, 2),
                                         ("osmem", 256, None), ("osmem", 1024, 2), ("rsmem", 256, None), ("rsmem", 1024, 2)):
                b = device_case(xb, lab, rows, c, dt)
                if not run_wide(progs[0], kind, dt, b, rows, c, threads, grid):
                    continue
                cp.cuda.Device().synchronize()
                if kind == "rsmem":
                    # The same exps, sums and products as sx_smem at the same launch: its bits.
                    b2 = device_case(xb, lab, rows, c, dt)
                    run_wide(progs[0], "smem", dt, b2, rows, c, threads, grid)
                    cp.cuda.Device().synchronize()
                    same = all(np.array_equal(cp.asnumpy(b[k]).view(np.uint8), cp.asnumpy(b2[k]).view(np.uint8)) for k in ("p", "rl"))
                    ok &= same
                    if not same:
                        log(f"FAIL rsmem != smem bit for bit: threads {threads} grid {grid} {dt} {rows}x{c}")
                p = cp.asnumpy(b["p"])
                p = p if dt == "f32" else rs.from_bf16(p).reshape(rows, c)
                rl = cp.asnumpy(b["rl"])
                fin = ~np.isnan(rl_ref)
                e_p, e_l = rs.rel(p, p_ref), rs.rel(rl[fin], rl_ref[fin])
                good = e_p < (1e-5 if dt == "f32" else 1e-2) and e_l < 1e-5 and np.array_equal(np.isnan(rl), np.isnan(rl_ref))
                good = good and not np.isnan(p).any()
                ok &= good
                if not good:
                    log(f"FAIL wide {kind} threads {threads} grid {grid} {dt} {rows}x{c}: probs {e_p:.1e} row loss {e_l:.1e}")
    log(f"correctness (numpy reference; early == old and rsmem == smem bit for bit): {'ALL OK' if ok else 'FAILURES'}")

    # Wide rows: the one-block-a-row kernels (two reads, three, 16-byte words), the row in shared
    # memory (one read) and three reads with L2 hints, over threads a block and grids; and the same
    # kernels at the register kernels' widths beside sx_rows at the runtime's launch.
    # --quick: the bf16 shapes op_bench finds furthest from the floor on the H200 (session 35:
    # 1.84x at 4096 x 4096, 1.68x at 1024 x 131072, 1.52x at 16384 x 1024, 1.37x at 4096 x 32768).
    wide = []
    wide_shapes = ((4096, 32768), (4096, 32771), (1024, 131072), (1024, 131071), (4096, 4096), (2048, 8192), (8192, 2048),
                   (16384, 1024))
    if a.quick:
        wide_shapes = ((4096, 4096), (1024, 131072), (16384, 1024), (4096, 32768))
    for dt in (("bf16",) if a.quick else ("f32", "bf16")):
        elem = 4 if dt == "f32" else 2
        for rows, c in wide_shapes:
            per_call = 2 * rows * c * elem
            nsets = max(1, min(16, -(-rs.L2_BYTES // per_call)))
            _, xb, lab = host_case(rows, c, rows + c, dt)
            sets = [device_case(xb, lab, rows, c, dt) for _ in range(nsets)]
            floor_us = per_call / bw * 1e6
            out = []
            cands = [("old", None, None), ("new", None, None)]
            cands += [(k, t, None) for k in ("smem", "osmem", "rsmem") for t in (128, 256, 512, 1024)]
            for kind, threads, grid in cands:
                if kind in ("old", "new") and c <= 8192:
                    continue
                try:
                    if not run_wide(P0w, kind, dt, sets[0], rows, c, threads, grid):
                        continue
                    cp.cuda.Device().synchronize()
                except cp.cuda.driver.CUDADriverError as e:
                    log(f"  {kind} threads {threads}: cannot launch ({str(e)[:60]})")
                    continue
                us = rs.time_graph(lambda b: run_wide(P0w, kind, dt, b, rows, c, threads, grid), sets, 10, reps)
                name = f"{kind:<5} threads={threads or 'runtime'} grid={'rows' if grid is None else grid}"
                out.append((us / floor_us, us, name))
                wide.append(dict(dtype=dt, rows=rows, c=c, kind=kind, threads=threads, grid=grid, us=us, ratio=us / floor_us))
            if rs.next_pow2(-(-c // (4 * (16 // elem)))) <= 256:  # the register kernel holds the row
                for P in progs:
                    if P.vpt != 4:
                        continue
                    rpb = max(1, 256 // rs.next_pow2(max(1, -(-c // (4 * (16 // elem))))))
                    us = rs.time_graph(lambda b: run_rows(P, "rows", dt, b, rows, c, rpb, 1 << 20), sets, 20, reps)
                    out.append((us / floor_us, us, f"sx_rows at the runtime's launch (vpt 4, {rpb} rows a block)"))
            out.sort()
            log(f"\nwide rows {dt} {rows}x{c}: floor {floor_us:.1f} us, {nsets} buffer sets")
            for ratio, us, name in out:
                log(f"  {ratio:5.2f}x  {us:8.1f} us  {name}")
            del sets
            cp.get_default_memory_pool().free_all_blocks()

    # The mean: three launches against one, alone; and the one block with its loads issued at
    # once (xent_variants.cu; the same bits as "one", checked), where a thread has at most 8 rows.
    P0 = progs[0]
    for rows in (4096, 8192, 16384, 65536):
        _, xb, lab = host_case(rows, 2, rows, "f32")
        sets = [device_case(xb, lab, rows, 2, "f32") for _ in range(4)]
        for s in sets:
            s["rl"] = cp.asarray(np.random.default_rng(1).random(rows).astype(np.float32))
        kinds = ("three", "one", "at-once") if rows <= 8 * 1024 else ("three", "one")
        res = {}
        for kind in kinds:
            res[kind] = rs.time_graph(lambda b: run_mean(P0, kind, b, rows), sets, 20, reps)
        r0 = []
        for kind in kinds:
            run_mean(P0, kind, sets[0], rows)
            cp.cuda.Device().synchronize()
            r0.append(float(cp.asnumpy(sets[0]["loss"])[0]))
        log(f"mean over {rows} rows: three launches {res['three']:.2f} us, one block {res['one']:.2f} us "
            f"(saves {res['three'] - res['one']:.2f} us; values {r0[0]:.7g} and {r0[1]:.7g})")
        if "at-once" in res:
            same = np.float32(r0[1]).tobytes() == np.float32(r0[2]).tobytes()
            log(f"  one block, loads at once: {res['at-once']:.2f} us ({'the same bits' if same else 'OTHER BITS'})")

    shapes = ((4096, 4096), (16384, 1024), (2048, 8192)) if a.quick else ((4096, 4096), (16384, 1024), (2048, 8192), (8192, 256))
    results = []
    for dt in ("f32", "bf16"):
        elem = 4 if dt == "f32" else 2
        for rows, c in shapes:
            per_call = 2 * rows * c * elem
            nsets = max(1, min(16, -(-rs.L2_BYTES // per_call)))
            _, xb, lab = host_case(rows, c, rows + c, dt)
            sets = [device_case(xb, lab, rows, c, dt) for _ in range(nsets)]
            floor_us = per_call / bw * 1e6
            out = []
            for P in progs:
                for kind, rpb, grid in itertools.product(kinds, rpbs, grids):
                    try:
                        if not run_rows(P, kind, dt, sets[0], rows, c, rpb, grid):
                            continue
                    except cp.cuda.driver.CUDADriverError:
                        continue
                    us = rs.time_graph(lambda b: run_rows(P, kind, dt, b, rows, c, rpb, grid), sets, 20, reps)
                    name = f"{kind:<6} vpt={P.vpt} rows/block={rpb} grid<={'rows' if grid >= 1 << 20 else grid}"
                    out.append((us / floor_us, us, name))
                    results.append(dict(dtype=dt, rows=rows, c=c, kind=kind, vpt=P.vpt, rpb=rpb, grid=grid, us=us, ratio=us / floor_us))
            out.sort()
            log(f"\nsx rows {dt} {rows}x{c}: floor {floor_us:.1f} us ({per_call / 1e6:.1f} MB), {nsets} buffer sets")
            for ratio, us, name in out[:10]:
                log(f"  {ratio:5.2f}x  {us:8.1f} us  {name}")
            # The runtime's launch: RowTiles::CHOSEN.fwd, vpt 4 and 256 threads a block, a block a
            # row group (session 23; RowTiles' cap of 4 x SMs before).
            rt_rpb = max(1, 256 // rs.next_pow2(max(1, -(-c // (4 * (16 // elem))))))
            for g, what in ((1 << 20, "a block a row group"), (4 * sms, f"grid <= {4 * sms}, before session 23")):
                cur = [r for r in results if r["dtype"] == dt and r["rows"] == rows and r["c"] == c and r["kind"] == "rows"
                       and r["vpt"] == 4 and r["rpb"] == rt_rpb and r["grid"] == g]
                if cur:
                    log(f"  the runtime's launch (rows, vpt 4, {rt_rpb} rows a block, {what}): {cur[0]['ratio']:.2f}x, {cur[0]['us']:.1f} us")
            del sets
            cp.get_default_memory_pool().free_all_blocks()
    log(f"done in {time.time() - t0:.0f} s; correctness {'ALL OK' if ok else 'FAILURES'}")
    rs.save(a.out, "xent_sweep", lines, results + wide, bw)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
