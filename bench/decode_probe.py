#!/usr/bin/env python3
"""What a one-token decoding step's stages cost on this GPU, primitive by primitive (#26).

ops::DecoderStep runs a decoding step as one persistent kernel: a block per multiprocessor,
33 stages a token at batch 1 (41 above batch 4), separated by a grid-wide barrier of ours, each
stage staging its input rows from L2. At batch 1 it spends about 0.169 ms a token where its
51 MB of weights take about 0.011 ms to read (docs/BENCHMARKS.md): the chain of stages is
latency. This probe measures that chain's parts apart, and the parts of an alternative, one
thread-block cluster (up to 16 blocks) that exchanges each stage's output through distributed
shared memory and synchronises with the cluster barrier, streaming the weights on fewer
multiprocessors:

1. the grid barrier (decoder.cu's, one block a multiprocessor and fewer), alone and with each
   stage's output (1 KiB: one bf16 row of 512; 16 KiB: 8 heads' f32 parts; 64 KiB: 64 rows)
   exchanged through L2;
2. the cluster barrier of 2 to 16 blocks, alone and with the same exchange through distributed
   shared memory or through L2;
3. the weights streamed by 8 to all multiprocessors: 16-byte loads (8 in flight a thread) or bulk
   copies into a ring of shared memory (the tensor memory accelerator), over a 51 MiB buffer
   (the model's weights: what a token reads, about the L2's size) and an 8 MiB one (L2).

Every exchange checks the words it read (a wrong word is a broken barrier: the run fails). The
end prints a model of a batch-1 token each way: stages x (barrier + exchange) and the weights
over the streaming rate of the multiprocessors that read them.

    python3 bench/decode_probe.py [--quick] [--out DIR]
"""
import argparse
import json
import os
import sys
import time

import cupy as cp
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.join(HERE, "decode_probe.cu")
CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED = 14
# The GPT of examples/gpt: 8 layers, d_model 512, hidden 1368, vocabulary 256, bf16.
WEIGHT_BYTES = 51 << 20
STAGES_BATCH1 = 33
MEASURED_BATCH1_MS = 0.169  # ops::DecoderStep at batch 1, H200, 2026-12-05 call C


def log(msg):
    print(msg, flush=True)


def build(defines):
    cc = cp.cuda.Device().compute_capability
    opts = ("-std=c++17", f"--gpu-architecture=sm_{cc}") + tuple(f"-D{d}" for d in defines)
    return cp.RawModule(code=open(SOURCE).read(), options=opts)


def allow_smem(fn, nbytes):
    if nbytes > 48 << 10:
        fn.max_dynamic_shared_size_bytes = nbytes


def grid_run(mod, kernel, what, blocks, threads, per_block, vbytes, n):
    """One run of a grid-barrier kernel (grid_stages, flag_stages): `per_block` 16-byte words a
    block a stage; returns µs a stage. Raises where a word was read wrong."""
    fn = mod.get_function(kernel)
    total = blocks * per_block
    allow_smem(fn, total * 16)
    bar = cp.zeros(1, cp.uint64)
    buf = cp.zeros(max(1, 2 * total) * 4, cp.uint32)
    bad, ns = cp.zeros(1, cp.uint32), cp.zeros(1, cp.uint64)
    fn((blocks,), (threads,), (bar, buf, np.uint32(n), np.uint32(per_block), bad, ns), shared_mem=total * 16)
    cp.cuda.Device().synchronize()
    if int(bad[0]):
        raise RuntimeError(f"{what}: {int(bad[0])} words read wrong ({blocks} blocks, {vbytes} B)")
    return float(ns[0]) / n / 1e3


def grid_stages(mod, blocks, threads, vbytes, n):
    wpb = 0 if vbytes == 0 else max(1, -(-vbytes // (16 * blocks)))
    return grid_run(mod, "grid_stages", "grid barrier", blocks, threads, wpb, vbytes, n), blocks * wpb * 16


def flag_stages(mod, blocks, threads, vbytes, n):
    """µs a stage of the flagged-line exchange: vbytes of data (twice that in lines) a stage."""
    lpb = max(1, -(-vbytes // (8 * blocks)))
    return grid_run(mod, "flag_stages", "flagged lines", blocks, threads, lpb, vbytes, n), blocks * lpb * 8


def cluster_stages(mod, cs, threads, vbytes, dsmem, n):
    fn = mod.get_function("cluster_stages")
    if cs > 8:
        cp.cuda.driver.funcSetAttribute(fn.kernel.ptr, CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 1)
    wpb = 0 if vbytes == 0 else max(1, -(-vbytes // (16 * cs)))
    total = cs * wpb
    smem = total * 16 * (2 if dsmem else 1)
    allow_smem(fn, smem)
    buf = cp.zeros(max(1, 2 * total) * 4, cp.uint32)
    bad, ns = cp.zeros(1, cp.uint32), cp.zeros(1, cp.uint64)
    fn((cs,), (threads,), (buf, np.uint32(n), np.uint32(wpb), np.uint32(1 if dsmem else 0), bad, ns), shared_mem=smem)
    cp.cuda.Device().synchronize()
    if int(bad[0]):
        raise RuntimeError(f"cluster barrier: {int(bad[0])} words read wrong (cluster {cs}, {vbytes} B, dsmem {dsmem})")
    return float(ns[0]) / n / 1e3, total * 16


def timed(launch, reps):
    """Median µs of one launch over `reps` launches (events around each)."""
    out = []
    for _ in range(reps):
        a, e = cp.cuda.Event(), cp.cuda.Event()
        a.record()
        launch()
        e.record()
        e.synchronize()
        out.append(cp.cuda.get_elapsed_time(a, e) * 1e3)
    return float(np.median(out))


def stream(mods, kind, blocks, threads, nbytes, chunk, stages, reps):
    """(µs for one pass, GB/s from the slope of 1 and 3 passes): blocks read nbytes between them."""
    if kind == "ld":
        fn = mods["ld"].get_function("stream_ld")
        unit = threads * 8 * 16
    else:
        fn = mods[("bulk", stages)].get_function("stream_bulk")
        unit = chunk
        allow_smem(fn, stages * chunk)
    per = max(unit, (nbytes // blocks) // unit * unit)
    w = cp.zeros(per * blocks // 4, cp.uint32)
    sink = cp.zeros(1, cp.uint32)

    def launch(passes):
        if kind == "ld":
            return lambda: fn((blocks,), (threads,), (w, np.uint64(per // 16), np.uint32(passes), sink))
        return lambda: fn((blocks,), (threads,), (w, np.uint64(per), np.uint32(passes), np.uint32(chunk), sink), shared_mem=stages * chunk)

    launch(1)()
    one = timed(launch(1), reps)
    three = timed(launch(3), reps)
    moved = per * blocks
    slope = 2 * moved / max(three - one, 1e-3) / 1e3
    return one, slope, moved


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", default=None)
    ap.add_argument("--flags-only", action="store_true", help="sections 1 and 1b only")
    args = ap.parse_args()
    dev = cp.cuda.Device()
    props = cp.cuda.runtime.getDeviceProperties(dev.id)
    sms = dev.attributes["MultiProcessorCount"]
    name = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
    log(f"decode_probe on {name}: {sms} multiprocessors, L2 {props.get('l2CacheSize', 0) >> 20} MiB")
    n = 500 if args.quick else 2000
    reps = 5 if args.quick else 11
    results = {"device": name, "sms": sms, "grid": [], "cluster": [], "stream": []}

    t0 = time.time()
    base = build([])
    log(f"built the probe in {time.time() - t0:.1f} s")

    log("\n1. the grid barrier (decoder.cu's), µs a stage; exchange = every block reads all blocks' outputs from L2")
    log(f"{'blocks':>7} {'threads':>7} {'exchange B':>11} {'µs a stage':>11}")
    for blocks in [b for b in (16, 32, 66, sms) if b <= sms]:
        for vbytes in (0, 1 << 10, 16 << 10, 64 << 10):
            us, moved = grid_stages(base, blocks, 256, vbytes, n)
            results["grid"].append({"blocks": blocks, "threads": 256, "exchange_bytes": moved, "us_per_stage": us})
            log(f"{blocks:>7} {256:>7} {moved:>11} {us:>11.3f}")

    log("\n1b. no barrier: flagged lines (8 data bytes and two flags a 16-byte line, polled by the readers), µs a stage")
    log(f"{'blocks':>7} {'threads':>7} {'data B':>11} {'µs a stage':>11}")
    for blocks in [b for b in (16, 32, 66, sms) if b <= sms]:
        for vbytes in (1 << 10, 2 << 10, 16 << 10, 64 << 10):
            us, moved = flag_stages(base, blocks, 256, vbytes, n)
            results.setdefault("flag", []).append({"blocks": blocks, "threads": 256, "exchange_bytes": moved, "us_per_stage": us})
            log(f"{blocks:>7} {256:>7} {moved:>11} {us:>11.3f}")
    if args.flags_only:
        return 0

    log("\n2. one cluster's barrier, µs a stage; exchange through distributed shared memory (dsmem) or L2")
    log(f"{'cluster':>7} {'threads':>7} {'exchange B':>11} {'via':>6} {'µs a stage':>11}")
    for cs in (2, 4, 8, 16):
        try:
            mod = build([f"CS={cs}"])
        except Exception as e:  # noqa: BLE001 - report and go on
            log(f"cluster {cs}: no build ({str(e).splitlines()[0][:100]})")
            continue
        for vbytes in (0, 1 << 10, 16 << 10, 64 << 10):
            for dsmem in ((False,) if vbytes == 0 else (True, False)):
                try:
                    us, moved = cluster_stages(mod, cs, 256, vbytes, dsmem, n)
                except Exception as e:  # noqa: BLE001
                    if "read wrong" in str(e):
                        raise
                    log(f"cluster {cs}, {vbytes} B: no launch ({str(e).splitlines()[0][:100]})")
                    continue
                via = "dsmem" if dsmem else "L2"
                results["cluster"].append({"cluster": cs, "threads": 256, "exchange_bytes": moved, "via": via, "us_per_stage": us})
                log(f"{cs:>7} {256:>7} {moved:>11} {via:>6} {us:>11.3f}")

    log("\n3. streaming: µs for one pass over the buffer, and GB/s in steady state (1 and 3 passes)")
    mods = {"ld": base}
    for st in (2, 4, 8):
        mods[("bulk", st)] = build([f"STAGES={st}"])
    log(f"{'source':>7} {'blocks':>7} {'how':>22} {'MB':>6} {'µs one pass':>12} {'GB/s':>8} {'GB/s an SM':>11}")
    counts = [b for b in (8, 16, 32, 66, sms) if b <= sms]
    ways = [("ld", 256, 0, 0), ("ld", 512, 0, 0), ("ld", 1024, 0, 0), ("bulk", 128, 16 << 10, 4), ("bulk", 128, 32 << 10, 4),
            ("bulk", 128, 16 << 10, 8), ("bulk", 128, 32 << 10, 2)]
    if args.quick:
        ways = [ways[1], ways[4]]
    for source, nbytes in (("51MiB", WEIGHT_BYTES), ("8MiB", 8 << 20)):
        for blocks in counts:
            for kind, threads, chunk, stages in ways:
                one, gbs, moved = stream(mods, kind, blocks, threads, nbytes, chunk, stages, reps)
                how = f"ld x{threads}" if kind == "ld" else f"bulk {stages} x {chunk >> 10} KiB"
                results["stream"].append({"source": source, "blocks": blocks, "kind": kind, "threads": threads, "chunk": chunk, "stages": stages,
                                          "bytes": moved, "us_one_pass": one, "gb_per_s": gbs})
                log(f"{source:>7} {blocks:>7} {how:>22} {moved / 1e6:>6.1f} {one:>12.1f} {gbs:>8.0f} {gbs / blocks:>11.1f}")

    # A batch-1 token each way: the stage chain plus the weights.
    def smallest_exchange(rows):
        """The row with the smallest nonzero exchange (one bf16 row of 512: 1 KiB, or the
        grid's one 16-byte word a block where that is more)."""
        sel = [r for r in rows if r["exchange_bytes"] > 0]
        return min(sel, key=lambda r: (r["exchange_bytes"], r["us_per_stage"])) if sel else None

    def stream_best(blocks):
        sel = [r for r in results["stream"] if r["source"] == "51MiB" and r["blocks"] == blocks]
        return min(sel, key=lambda r: r["us_one_pass"]) if sel else None

    log("\n4. a batch-1 token, modelled from the figures above (33 stages; each stage's input is one 1 KiB row")
    log("   exchanged; the weights read once a token)")
    model = {}
    grid = smallest_exchange([r for r in results["grid"] if r["blocks"] == sms])
    s_all = stream_best(sms)
    if grid and s_all:
        chain = STAGES_BATCH1 * grid["us_per_stage"]
        model["grid"] = {"chain_us": chain, "weights_us": s_all["us_one_pass"], "exchange_bytes": grid["exchange_bytes"]}
        log(f"   persistent grid ({sms} blocks): stages {chain:.1f} µs (barrier + {grid['exchange_bytes']} B through L2), weights "
            f"{s_all['us_one_pass']:.1f} µs over {sms} SMs; measured step {MEASURED_BATCH1_MS * 1e3:.0f} µs: the rest "
            f"({MEASURED_BATCH1_MS * 1e3 - chain:.0f} µs) is the stages' own work")
    for cs in (8, 16):
        cl = smallest_exchange([r for r in results["cluster"] if r["cluster"] == cs and r["via"] == "dsmem"])
        s = stream_best(cs)
        if cl and s:
            chain = STAGES_BATCH1 * cl["us_per_stage"]
            model[f"cluster{cs}"] = {"chain_us": chain, "weights_us": s["us_one_pass"], "exchange_bytes": cl["exchange_bytes"]}
            log(f"   one cluster of {cs}: stages {chain:.1f} µs (cluster barrier + {cl['exchange_bytes']} B through dsmem), weights "
                f"{s['us_one_pass']:.1f} µs over {cs} SMs ({s['kind']}); overlapped, a token costs at least "
                f"{max(chain, s['us_one_pass']):.1f} µs plus the stages' own work")
    results["model"] = model
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        path = os.path.join(args.out, "decode_probe.json")
        with open(path, "w") as f:
            json.dump(results, f, indent=1)
        log(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
