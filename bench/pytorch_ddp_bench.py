"""PyTorch DistributedDataParallel + make_graphed_callables on the `graphed` benchmark model.

The counterpart of `examples/dist_bench.rs`: L blocks of `Linear(H, H)` + `GELU()`, float32,
TF32 off, per-GPU batch B. Each block is a graphed callable
(`torch.cuda.make_graphed_callables`, one per block), the stack is wrapped in
`DistributedDataParallel` (its bucketed all-reduce runs from autograd hooks while the
graphed backwards replay). One step: forward through all blocks, `.sum()`, backward.

For each shape it reports the median CUDA-event step time on rank 0, in microseconds,
on 1 GPU (graphed, no DDP) and on --gpus GPUs (DDP + graphed), with the ratio and the
scaling efficiency (1-GPU time / N-GPU time at the same per-GPU batch).

Run (one process per GPU, started by mp.spawn; NCCL_NVLS_ENABLE=0 as in graphed's launcher):
  python3 bench/pytorch_ddp_bench.py --gpus 2 --out torch_ddp.json
  python3 bench/pytorch_ddp_bench.py --shapes 32x256x32 --steps 500 --warmup 50
"""

import argparse
import json
import os
import statistics
import sys
import tempfile
import warnings

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
import torch.nn as nn  # noqa: E402

DEFAULT_SHAPES = "32x256x32,16x1024x128"


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def parse_shapes(text):
    shapes = []
    for item in filter(None, (s.strip() for s in text.split(","))):
        parts = item.lower().split("x")
        if len(parts) != 3:
            raise SystemExit(f"bad shape {item!r}, expected LxHxB such as 32x256x32")
        shapes.append(tuple(int(p) for p in parts))
    return shapes


def disable_tf32():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False


def time_steps(step, steps, warmup):
    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(steps)]
    for start, end in events:
        start.record()
        step()
        end.record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) * 1000.0 for s, e in events)


def bench_shape(L, H, B, world, rank, args):
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Sequential(nn.Linear(H, H), nn.GELU()) for _ in range(L)]).cuda()
    torch.manual_seed(1 + rank)
    x = torch.randn(B, H, device="cuda")
    samples = [(x,)] + [(torch.randn(B, H, device="cuda", requires_grad=True),) for _ in range(1, L)]
    graphed = nn.Sequential(*torch.cuda.make_graphed_callables(tuple(model), tuple(samples)))
    if world > 1:
        net = nn.parallel.DistributedDataParallel(graphed, device_ids=[torch.cuda.current_device()])
    else:
        net = graphed

    def step():
        net(x).sum().backward()

    if world > 1:
        dist.barrier()
    return time_steps(step, args.steps, args.warmup)


def worker(rank, world, args, port, out_path):
    os.environ.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "NCCL_NVLS_ENABLE": "0"})
    torch.cuda.set_device(rank)
    disable_tf32()
    if world > 1:
        dist.init_process_group("nccl", rank=rank, world_size=world, device_id=torch.device("cuda", rank))
    rows = []
    for L, H, B in parse_shapes(args.shapes):
        if rank == 0:
            log(f"[torch ddp {L}x{H}x{B} on {world} GPU(s)]")
        rows.append(bench_shape(L, H, B, world, rank, args))
    if rank == 0:
        with open(out_path, "w") as f:
            json.dump(rows, f)
    if world > 1:
        dist.barrier()
        dist.destroy_process_group()


def run(world, args, port):
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as tmp:
        path = tmp.name
    mp.spawn(worker, args=(world, args, port, path), nprocs=world, join=True)
    with open(path) as f:
        times = json.load(f)
    os.unlink(path)
    return times


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", default=DEFAULT_SHAPES)
    p.add_argument("--gpus", type=int, default=2)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--port", type=int, default=29511)
    p.add_argument("--out")
    args = p.parse_args()
    if torch.cuda.device_count() < args.gpus:
        raise SystemExit(f"{torch.cuda.device_count()} GPU(s), --gpus {args.gpus}")
    one = run(1, args, args.port)
    many = run(args.gpus, args, args.port + 1)
    rows = []
    for (L, H, B), t1, tn in zip(parse_shapes(args.shapes), one, many):
        rows.append({"l": L, "h": H, "b": B, "gpus": args.gpus, "one_us": t1, "many_us": tn,
                     "ratio": tn / t1, "efficiency": t1 / tn})
        log(f"{L}x{H}x{B}: 1 GPU {t1:.1f} us, {args.gpus} GPUs {tn:.1f} us, ratio {tn / t1:.3f}")
    text = json.dumps({"torch": torch.__version__, "nccl": ".".join(map(str, torch.cuda.nccl.version())),
                       "rows": rows}, indent=1)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    else:
        print(text)


if __name__ == "__main__":
    main()
