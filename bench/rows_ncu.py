#!/usr/bin/env python3
"""The runtime's bf16 row kernels at op_bench's 4096 x 4096, launched as the runtime launches
them, for Nsight Compute (scripts/rows-ncu.sh runs this under ncu).

On the H200 (session 35) these kernels took about the H100's time (RMSNorm 27.8 us, 1.67x the
H200's floor; its backward 1.73x; the loss head's forward 1.84x) while the elementwise ops
followed the H200's bandwidth: something on the multiprocessors' side bounds them, the same on
both cards. A profile on either card says what: DRAM throughput against its peak, achieved
occupancy, and what the warps stall on. Launched twice each, both profiled (ncu flushes the
caches before each profiled pass, so the rows come from DRAM as in a training step):

- rms_smem_bf16 (ops::rms_norm for rows of 8 KB and more: a block of 256 threads a row, the row
  in 8 KB of dynamic shared memory);
- rms_ring_bwd_bf16 then col_partials_acc_f32 (ops::rms_norm_backward: RowTiles' backward, 2 words a
  thread, 264 blocks, a ring of 2 slots; the gamma grad's partials added by a second kernel);
- sx_smem_bf16 then xent_mean_f32 (ops::softmax_cross_entropy for rows of 8 KB and more: a block
  of 128 threads a row, the row in shared memory; the mean over the rows by one block);
- a 64 MiB device-to-device copy (cupy's), the floor's own kernel.

    python3 bench/rows_ncu.py [--rows 4096] [--d 4096]
"""
import argparse
import os
import sys

import cupy as cp
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import row_sweep as rs  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=4096)
    ap.add_argument("--d", type=int, default=4096)
    a = ap.parse_args()
    rows, d = a.rows, a.d
    sms = cp.cuda.Device().attributes["MultiProcessorCount"]
    p4, p2 = rs.Prog(4), rs.Prog(2)
    print(f"built the runtime's kernels in {p4.compile_s + p2.compile_s:.1f} s", flush=True)
    fwd = rs.device_bufs(rs.host_inputs("fwd", rows, d, 1), rows, d, outs=("y",))
    bwd = rs.device_bufs(rs.host_inputs("bwd", rows, d, 2), rows, d, outs=("dx",), parts=sms * 2)
    rng = np.random.default_rng(3)
    x = cp.asarray(rs.to_bf16((rng.standard_normal((rows, d)) * 3).astype(np.float32)))
    lab = cp.asarray(rng.integers(0, d, rows).astype(np.float32))
    probs, row_loss, loss = cp.zeros((rows, d), cp.uint16), cp.zeros(rows, cp.float32), cp.zeros(1, cp.float32)
    src = cp.zeros(16 << 20, cp.float32)
    dst = cp.empty_like(src)
    sx = p4.f("sx_smem_bf16")
    words = -(-d // rs.W)
    # The runtime's threads a row: rms_smem_launch (ops/transformer.rs), xent_launch (ops/loss.rs).
    rms_threads = min(max(rs.next_pow2(-(-words // 2)), 32), 1024)
    threads = min(max(rs.next_pow2(-(-words // 8)), 128), 1024)
    for it in range(2):
        rs.rms_fwd(p4, ("smem", (rms_threads,)), fwd, rows, d)
        rs.rms_bwd(p2, ("ring", (256, 2 * sms)), bwd, rows, d)
        sx((min(rows, 1 << 20),), (threads,), (probs, row_loss, x, lab, np.uint32(rows), np.uint32(d)), shared_mem=words * 16)
        p4.f("xent_mean_f32")((1,), (1024,), (loss, row_loss, lab, np.uint32(rows)))
        dst[...] = src
        cp.cuda.Device().synchronize()
        print(f"pass {it + 1}: launched rms_smem_bf16, rms_ring_bwd_bf16 and its column sum, sx_smem_bf16 "
              f"({threads} threads), xent_mean_f32, a 64 MiB copy; loss {float(loss[0]):.4f}", flush=True)


if __name__ == "__main__":
    main()
