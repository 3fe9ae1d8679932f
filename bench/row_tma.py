#!/usr/bin/env python3
"""Row kernels whose rows are streamed by bulk copies (bench/row_tma.cu) against the runtime's,
on the GPU machine: correctness, a launch sweep, x-of-floor.

Session 35's op benchmark on an H200 found the runtime's bf16 row kernels at about the H100's
times (RMSNorm 27.8 µs at 4096 x 4096, 1.67x of the H200's floor; its backward 1.73x; the loss
head 1.84x) while the elementwise ops followed the H200's bandwidth: the row kernels are bound by
the bytes a multiprocessor keeps in flight and the instructions that issue them. This times the
bulk-copy form (a persistent grid, a ring of RT_STAGES rows a block, one copy instruction a row)
over ring depths, threads a block and blocks a multiprocessor, beside the runtime's kernels as
the runtime launches them (RowTiles: the RMSNorm forward's ring at 4 words a thread, 256 threads,
4 blocks a multiprocessor; its backward's at 2 words, 256 threads, 2 blocks a multiprocessor and
the partials' sum; the cross-entropy's row in shared memory for rows of 8 KB and more, its
register kernel below), in one call. (For RMSNorm rows of 8 KB and more the runtime runs
rms_smem_bf16, not the ring this compares with: op_bench times that one.) LayerNorm's one-pass
backward and the cross-entropy's counting grad are the runtime's own kernels since session 36:
their variants here are launch shapes of those, against the runtime's former kernels.

- checks every variant against the numpy references of bench/row_sweep.py and
  bench/xent_sweep.py on small shapes, and two runs' bits against each other;
- times each over a CUDA graph of launches rotating buffers past the L2 (row_sweep.time_graph)
  at op_bench's 4096 x 4096, the GPT's 4096 x 512 and 16384 x 1024, and prints x-of-floor (the
  op's bytes over the measured copy bandwidth, as op_bench counts them).

    python3 bench/row_tma.py [--quick] [--out DIR]
"""
import argparse
import itertools
import os
import sys
import time

import cupy as cp
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import row_sweep as rs  # noqa: E402
import xent_sweep as xs  # noqa: E402

SOURCE = os.path.join(HERE, "row_tma.cu")
SMEM_SM = 227 << 10  # shared memory a multiprocessor gives its blocks (sm_90)
WPTS = (2, 4)  # builds by the most 16-byte words of a row a thread holds (RT_WPT): fewer registers at 2
WPT = max(WPTS)
U, F = np.uint32, np.float32


def build(stages, wpt):
    opts = ("-std=c++17", f"--gpu-architecture=sm_{rs.arch()}", f"-DRT_STAGES={stages}", f"-DRT_WPT={wpt}")
    return cp.RawModule(code=open(SOURCE).read(), options=opts)


ELEM = {"fwd": 2, "bwd": 2, "xent": 2, "xbwd": 2, "lnbwd": 4}  # bytes a value (bf16; LayerNorm's f32)


def words_of(op, d):
    """16-byte words a row of d values."""
    return d * ELEM[op] // 16


def fits(op, stages, threads, per_sm, d):
    """Whether a variant can take rows of d: the row within the threads' words, the ring within
    a multiprocessor's shared memory (the grad's elementwise kernel: rows of whole words)."""
    if (d * ELEM[op]) % 16:
        return False
    if op == "xbwd":
        return True
    if words_of(op, d) > WPT * threads:
        return False
    return smem_bytes(op, stages, d) * per_sm <= SMEM_SM


RUNTIME_LN_STAGES = 2  # LN_RING_STAGES as the runtime builds ln_ring_bwd_f32


def smem_bytes(op, stages, d):
    return 0 if op == "xbwd" else stages * d * ELEM[op] * (2 if op in ("bwd", "lnbwd") else 1)


SCALE = 0.75  # the grad's dloss_scale


def run_tma(mods, op, v, b, rows, d, sms):
    """One launch of variant v = (stages, threads, blocks a multiprocessor); False where it does
    not fit. LayerNorm's backward is the runtime's ln_ring_bwd_f32 (mods["runtime"], built as the
    runtime builds it: a ring of 2 slots, 4 words a thread at most), the cross-entropy's grad its
    softmax_xent_bwd_counted_bf16 (the runtime launches 512 threads, 4 blocks a multiprocessor)."""
    stages, threads, per_sm = v
    if not fits(op, stages, threads, per_sm, d) or (op == "lnbwd" and stages != RUNTIME_LN_STAGES):
        return False
    words = words_of(op, d)
    mod = mods[(max(stages, 2), min([w for w in WPTS if w * threads >= words] or [WPT]))]
    grid = max(1, min(rows, per_sm * sms))
    sm = smem_bytes(op, stages, d)
    if op in ("lnbwd", "xbwd"):
        fn = mods["runtime"].f("ln_ring_bwd_f32" if op == "lnbwd" else "softmax_xent_bwd_counted_bf16")
    else:
        fn = mod.get_function({"fwd": "rt_rms_fwd", "bwd": "rt_rms_bwd", "xent": "rt_xent_fwd"}[op])
    if sm > 48 << 10 and fn.max_dynamic_shared_size_bytes < sm:
        fn.max_dynamic_shared_size_bytes = sm
    if op in ("bwd", "lnbwd") and b["part"].shape[0] < grid:
        return False
    col = (((d + 255) // 256,), (256,))
    try:
        if op == "fwd":
            fn((grid,), (threads,), (b["y"], b["rstd"], b["x"], b["g"], U(rows), U(d), F(rs.EPS)), shared_mem=sm)
        elif op == "bwd":
            fn((grid,), (threads,), (b["dx"], b["part"], b["dy"], b["x"], b["g"], b["rstd"], U(rows), U(d)), shared_mem=sm)
            mod.get_function("rt_col_sum")(*col, (b["dg"], b["part"], U(grid), U(d), U(0)))
        elif op == "lnbwd":
            fn((grid,), (threads,), (b["dx"], b["part"], b["pb"], b["dy"], b["x"], b["g"], b["mean"], b["rstd"], U(rows), U(d)), shared_mem=sm)
            mod.get_function("rt_col_sum")(*col, (b["dg"], b["part"], U(grid), U(d), U(1)))
            mod.get_function("rt_col_sum")(*col, (b["db"], b["pb"], U(grid), U(d), U(1)))
        elif op == "xent":
            fn((grid,), (threads,), (b["p"], b["rl"], b["x"], b["l"], U(rows), U(d)), shared_mem=sm)
        else:
            fn((grid,), (threads,), (b["dl"], b["p"], b["l"], F(SCALE), U(rows), U(d)))
    except cp.cuda.driver.CUDADriverError:
        return False  # a launch the kernel cannot take (registers a block): not a candidate
    return True


def run_runtime(progs, op, b, rows, d, sms):
    """The runtime's kernel for the op, launched as the runtime launches it."""
    if op == "fwd":
        return rs.rms_fwd(progs[4], ("ring", (256, 4 * sms)), b, rows, d)
    if op == "bwd":
        return rs.rms_bwd(progs[2], ("ring", (256, 2 * sms)), b, rows, d)
    if op == "lnbwd":
        # ops::layer_norm_backward on CUDA: the row kernel on the forward's row shape (4 words a
        # thread, 256 threads a block, at most 4 blocks a multiprocessor) where a row fits it,
        # then the parameters' column kernel (col_dims), which adds onto dgamma and dbeta.
        P = progs[4]
        tpr = rs.next_pow2(max(1, -(-d // 16)))
        if tpr > 256:
            return False
        rpb = 256 // tpr
        args = (b["dx"], b["dy"], b["x"], b["g"], b["mean"], b["rstd"], U(rows), U(d))
        P.f("ln_rows_bwd_f32")((max(1, min(-(-rows // rpb), 4 * sms)),), (tpr, rpb, 1), args)
        P.f("layer_norm_bwd_params_f32")((-(-d // 32),), (32, 16, 1), (b["dg"], b["db"], b["dy"], b["x"], b["mean"], b["rstd"], U(rows), U(d)))
        return True
    if op == "xbwd":
        # ops::softmax_cross_entropy_backward: the count (xent_mean_f32 without losses, one
        # block, up to 16384 rows), then the grad (LaunchDims::vectorized).
        P = progs[4]
        P.f("xent_mean_f32")((1,), (1024,), (b["cnt"], rs.NULL, b["l"], U(rows)))
        grid = max(1, min(-(-(rows * d // 8) // 256), 65535 * 8))
        P.f("softmax_xent_bwd_bf16")((grid,), (256,), (b["dl"], b["p"], b["l"], F(SCALE), b["cnt"], U(rows), U(d)))
        return True
    if d * 2 >= 8192:
        threads = min(1024, max(128, rs.next_pow2(-(-d // 64))))  # ops/loss.rs: the row's words / 8
        return xs.run_wide(progs[4], "smem", "bf16", b, rows, d, threads=threads)
    rpb = max(1, 256 // rs.next_pow2(max(1, -(-d // 32))))
    return xs.run_rows(progs[4], "rows", "bf16", b, rows, d, rpb, 1 << 20)


def bufs(op, rows, d, seed, sms):
    if op == "xent":
        x, xb, lab = xs.host_case(rows, d, seed, "bf16")
        return (x, lab), xs.device_case(xb, lab, rows, d, "bf16")
    if op == "xbwd":
        rng = np.random.default_rng(seed)
        lab = rng.integers(0, d, rows).astype(np.float32)
        lab[1::7] = xs.IGNORE
        if rows > 3:
            lab[3] = d + 0.5  # not a class id: NaN grads
        probs = rs.to_bf16(rng.random((rows, d), dtype=np.float32)).reshape(rows, d)
        return None, {"p": cp.asarray(probs), "l": cp.asarray(lab), "dl": cp.zeros((rows, d), cp.uint16), "cnt": cp.zeros(1, cp.float32)}
    if op == "lnbwd":
        rng = np.random.default_rng(seed)
        x = (rng.standard_normal((rows, d)) * 2 + 0.5).astype(np.float32)
        h = {"x": x, "dy": rng.standard_normal((rows, d)).astype(np.float32), "g": rng.standard_normal(d).astype(np.float32),
             "mean": x.mean(1).astype(np.float32)}
        h["rstd"] = (1 / np.sqrt(((x - h["mean"][:, None]) ** 2).mean(1) + rs.EPS)).astype(np.float32)
        dev = {k: cp.asarray(v) for k, v in h.items()}
        dev.update(dx=cp.zeros((rows, d), cp.float32), part=cp.zeros((8 * sms, d), cp.float32), pb=cp.zeros((8 * sms, d), cp.float32),
                   dg=cp.zeros(d, cp.float32), db=cp.zeros(d, cp.float32))
        return h, dev
    host = rs.host_inputs("fwd" if op == "fwd" else "bwd", rows, d, seed)
    return host, rs.device_bufs(host, rows, d, parts=8 * sms)


def outputs(op, b):
    keys = {"fwd": ("y", "rstd"), "bwd": ("dx", "dg"), "xent": ("p", "rl"), "xbwd": ("dl",), "lnbwd": ("dx", "dg", "db")}[op]
    return {k: cp.asnumpy(b[k]) for k in keys}


def check(run, op, rows, d, sms, progs):
    """(ok, errors): the reference, and the same bits from two runs."""
    host, b = bufs(op, rows, d, rows * 31 + d, sms)
    outs = []
    for _ in range(2):
        if op == "lnbwd":
            b["dg"].fill(0)  # the parameters' grads accumulate
            b["db"].fill(0)
        if not run(b):
            return None
        cp.cuda.Device().synchronize()
        outs.append(outputs(op, b))
    det = all(np.array_equal(outs[0][k], outs[1][k], equal_nan=True) for k in outs[0])
    o = outs[0]
    if op == "xbwd":
        # The runtime's grad on the same inputs: the same bits (an exact count, the same math).
        b2 = bufs(op, rows, d, rows * 31 + d, sms)[1]
        run_runtime(progs, op, b2, rows, d, sms)
        cp.cuda.Device().synchronize()
        same = np.array_equal(o["dl"], cp.asnumpy(b2["dl"]))
        return same and det, dict(same_bits_as_runtime=float(same))
    if op == "lnbwd":
        x, dy, g = (host[k].astype(np.float64) for k in ("x", "dy", "g"))
        xh = (x - host["mean"][:, None]) * host["rstd"][:, None]
        gg = dy * g[None, :]
        dx = host["rstd"][:, None] * (gg - gg.mean(1, keepdims=True) - xh * (gg * xh).mean(1, keepdims=True))
        errs = dict(dx=rs.rel(o["dx"], dx), dgamma=rs.rel(o["dg"], (dy * xh).sum(0)), dbeta=rs.rel(o["db"], dy.sum(0)))
        return all(e < 1e-4 for e in errs.values()) and det, errs
    if op == "fwd":
        y, rstd, _ = rs.ref_fwd(host, False)
        errs = dict(y=rs.rel(rs.from_bf16(o["y"]), y), rstd=rs.rel(o["rstd"], rstd))
        ok = errs["y"] < 1e-2 and errs["rstd"] < 1e-5
    elif op == "bwd":
        dx, dg = rs.ref_bwd(host, False)
        errs = dict(dx=rs.rel(rs.from_bf16(o["dx"]), dx), dgamma=rs.rel(o["dg"], dg))
        ok = errs["dx"] < 1e-2 and errs["dgamma"] < 1e-4
    else:
        x, lab = host
        p, rl = xs.reference(x, lab)
        nan_same = np.array_equal(np.isnan(o["rl"]), np.isnan(rl))
        fin = ~np.isnan(rl)
        errs = dict(p=rs.rel(rs.from_bf16(o["p"]).reshape(rows, d), p), loss=rs.rel(o["rl"][fin], rl[fin]))
        ok = errs["p"] < 1e-2 and errs["loss"] < 1e-4 and nan_same
    return ok and det, errs


# Bytes an element as op_bench counts them: reads + writes (bf16); LayerNorm's f32 backward as
# dy and x read and dx written (session 36's results counted five tensors: dy and x twice).
FLOOR_BYTES = {"fwd": 2 * 2, "bwd": 3 * 2, "xent": 2 * 2, "xbwd": 2 * 2, "lnbwd": 3 * 4}


OPS = ("fwd", "bwd", "xent", "xbwd", "lnbwd")


def main():
    ap = argparse.ArgumentParser()
    args, lines, log, sms = rs.start(ap)
    q = args.quick
    t0 = time.time()
    stage_list = (2, 4, 8)
    mods = {(s, w): build(s, w) for s in stage_list for w in WPTS}
    progs = {4: rs.Prog(4), 2: rs.Prog(2)}
    mods["runtime"] = progs[4]
    log(f"built {len(mods) - 1} forms (ring depth, words a thread) and the runtime's kernels in {time.time() - t0:.1f} s")
    reps = 5 if q else 20
    bw, copy_us = rs.copy_bandwidth(reps)
    log(f"copy: {copy_us:.1f} us per 64 MiB copy = {bw / 1e9:.0f} GB/s (read + write): the floor's bandwidth")
    threads_list = (128, 256, 512)
    per_sm_list = (1, 2, 4, 8)
    variants = list(itertools.product(stage_list, threads_list, per_sm_list))

    ok_all = True
    small = ((19, 64), (257, 512), (33, 1032), (300, 2048), (5, 4096), (1000, 4096))
    grad_variants = [(0, t, k) for t in (256, 512) for k in (1, 2, 4, 8, 16)]
    for op in OPS:
        bad = 0
        ran = 0
        for rows, d in small:
            for v in (grad_variants if op == "xbwd" else variants):
                r = check(lambda b, v=v: run_tma(mods, op, v, b, rows, d, sms), op, rows, d, sms, progs)
                if r is None:
                    continue
                ran += 1
                good, errs = r
                if not good:
                    bad += 1
                    log(f"  FAIL {op} stages={v[0]} threads={v[1]} blocks/SM={v[2]} {rows}x{d}: "
                        + " ".join(f"{k}={e:.1e}" for k, e in errs.items()))
            r = None if op == "xbwd" else check(lambda b: run_runtime(progs, op, b, rows, d, sms), op, rows, d, sms, progs)
            if r is not None and not r[0]:
                log(f"  runtime's {op} {rows}x{d}: " + " ".join(f"{k}={e:.1e}" for k, e in r[1].items()))
        ok_all &= bad == 0
        log(f"correctness {op}: {ran - bad} of {ran} variant-shapes OK")

    shapes = {"fwd": ((4096, 4096), (4096, 512), (16384, 1024)), "bwd": ((4096, 4096), (4096, 512), (16384, 1024)),
              "xent": ((4096, 4096), (16384, 1024), (2048, 8192)), "xbwd": ((4096, 4096), (16384, 1024), (4096, 32768)),
              "lnbwd": ((4096, 4096), (16384, 1024), (4096, 1024))}
    results = []
    for op in OPS:
        for rows, d in shapes[op]:
            per_call = FLOOR_BYTES[op] * rows * d
            nsets = max(1, min(16, -(-rs.L2_BYTES // per_call)))
            sets = [bufs(op, rows, d, rows + d + i, sms)[1] for i in range(nsets)]
            floor_us = per_call / bw * 1e6
            out = []
            base = rs.time_graph(lambda b: run_runtime(progs, op, b, rows, d, sms), sets, 20, reps)
            for v in (grad_variants if op == "xbwd" else variants):
                if not run_tma(mods, op, v, sets[0], rows, d, sms):
                    continue  # does not fit, or cannot launch
                us = rs.time_graph(lambda b, v=v: run_tma(mods, op, v, b, rows, d, sms), sets, 20, reps)
                out.append((us / floor_us, us, v))
                results.append(dict(op=op, rows=rows, d=d, stages=v[0], threads=v[1], per_sm=v[2], us=us, ratio=us / floor_us))
            results.append(dict(op=op, rows=rows, d=d, runtime=True, us=base, ratio=base / floor_us))
            out.sort()
            log(f"\n{op} {'f32' if ELEM[op] == 4 else 'bf16'} {rows}x{d}: floor {floor_us:.1f} us ({per_call / 1e6:.1f} MB), {nsets} buffer sets; "
                f"the runtime's kernel {base:.1f} us, {base / floor_us:.2f}x")
            for ratio, us, v in out[: (6 if q else 10)]:
                log(f"  {ratio:5.2f}x  {us:8.1f} us  {base / us:5.2f}x faster  stages={v[0]} threads={v[1]} blocks/SM={v[2]}")
            del sets
            cp.get_default_memory_pool().free_all_blocks()
    log(f"done in {time.time() - t0:.0f} s; correctness {'ALL OK' if ok_all else 'FAILURES'}")
    rs.save(args.out, "row_tma", lines, results, bw)
    return 0 if ok_all else 1


if __name__ == "__main__":
    sys.exit(main())
