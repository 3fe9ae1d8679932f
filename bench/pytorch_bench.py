"""PyTorch reference numbers for the `graphed` benchmark model.

Model: L blocks of `Linear(H, H)` followed by `GELU()` (exact erf GELU; set
GRAPHED_GELU=tanh for the tanh approximation), batch B, float32, TF32 off.
The input x has shape (B, H) and requires_grad=False. One step is: forward
through all blocks, `.sum()`, backward (grads accumulate; they are never zeroed
inside a step).

For each shape (L, H, B) this measures, as the median over --steps steps after
--warmup warm-up steps, in microseconds per step (each step timed between a
pair of torch.cuda.Event records):

  eager      plain module step
  per_block  torch.cuda.make_graphed_callables with one callable per block
  whole      one graphed callable for the whole nn.Sequential stack
  floor      the full step (forward, sum, backward) captured as a single
             torch.cuda.CUDAGraph and replayed

and also:

  capture_ms     wall time of the per-block make_graphed_callables call
  pool_mb        growth of torch.cuda.memory_reserved() across that call
                 (1 MB = 1e6 bytes; empty_cache() is called before both
                 readings so only memory kept by the graphs is counted)
  pool_alloc_mb  growth of torch.cuda.memory_allocated() across that call
  peak_alloc_mb  torch.cuda.max_memory_allocated() during that call, minus
                 memory_allocated() before it
  issue_us       median CPU wall time to call the `whole` graphed forward
                 once (no sync), over 200 calls

With --dtype bf16 (or f16) the module and the input are converted to that dtype
(`model.to(dtype)`, the module in bf16 rather than autocast, so make_graphed_callables
needs no autocast cache setting); the step is otherwise the same. --gemm instead
times torch.matmul of two (N, N) matrices at N = 4096 and 8192 in --dtype (bf16 by
default there) and reports TFLOP/s (median over --steps).

Run:
  python3 bench/pytorch_bench.py --out torch.json
  python3 bench/pytorch_bench.py --dtype bf16 --out torch_bf16.json
  python3 bench/pytorch_bench.py --gemm --out torch_gemm.json
  python3 bench/pytorch_bench.py --shapes 8x256x32,32x256x32 --steps 500 --warmup 50

Progress goes to stderr; the JSON result goes to --out (default stdout).
"""

import argparse
import datetime
import gc
import json
import os
import statistics
import sys
import time
import warnings

import torch
import torch.nn as nn

DEFAULT_SHAPES = "8x256x32,32x256x32,16x1024x128,8x4096x512"
ISSUE_CALLS = 200


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def parse_shapes(text):
    shapes = []
    for item in text.split(","):
        item = item.strip()
        if not item:
            continue
        parts = item.lower().split("x")
        if len(parts) != 3:
            raise SystemExit(f"bad shape {item!r}, expected LxHxB such as 8x256x32")
        shapes.append(tuple(int(p) for p in parts))
    return shapes


def disable_tf32():
    """Turn TF32 off with the legacy flags (only those, so the two APIs are never mixed)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            torch.backends.cuda.matmul.allow_tf32 = False
            torch.backends.cudnn.allow_tf32 = False
        except (AttributeError, RuntimeError):
            # Fallback in case a future release drops the legacy flags.
            torch.backends.cuda.matmul.fp32_precision = "ieee"
            torch.backends.cudnn.conv.fp32_precision = "ieee"


def gelu_mode():
    return "tanh" if os.environ.get("GRAPHED_GELU", "").strip().lower() == "tanh" else "none"


DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}
DTYPE = torch.float32


def make_model(L, H):
    """Same seed every time, so every variant starts from identical weights."""
    torch.manual_seed(0)
    blocks = [nn.Sequential(nn.Linear(H, H), nn.GELU(approximate=gelu_mode())) for _ in range(L)]
    return nn.Sequential(*blocks).cuda().to(DTYPE)


def make_input(H, B):
    torch.manual_seed(1)
    return torch.randn(B, H, device="cuda", dtype=DTYPE, requires_grad=False)


def free():
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()


def time_steps(step, steps, warmup):
    """Median microseconds per step, each step between its own pair of CUDA events."""
    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    events = [
        (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
        for _ in range(steps)
    ]
    for start, end in events:
        start.record()
        step()
        end.record()
    torch.cuda.synchronize()
    return statistics.median(start.elapsed_time(end) * 1000.0 for start, end in events)


def bench_eager(L, H, B, x, args):
    model = make_model(L, H)

    def step():
        model(x).sum().backward()

    us = time_steps(step, args.steps, args.warmup)
    del model, step
    free()
    return us


def bench_per_block(L, H, B, x, args):
    model = make_model(L, H)
    blocks = tuple(model)
    sample_args = [(x,)]
    for _ in range(1, L):
        sample_args.append((torch.randn(B, H, device="cuda", dtype=DTYPE, requires_grad=True),))
    sample_args = tuple(sample_args)

    free()
    reserved0 = torch.cuda.memory_reserved()
    allocated0 = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    graphed = torch.cuda.make_graphed_callables(blocks, sample_args)
    torch.cuda.synchronize()
    capture_ms = (time.perf_counter() - t0) * 1000.0
    peak = torch.cuda.max_memory_allocated()
    allocated1 = torch.cuda.memory_allocated()
    gc.collect()
    torch.cuda.empty_cache()
    reserved1 = torch.cuda.memory_reserved()

    mem = {
        "capture_ms": capture_ms,
        "pool_mb": (reserved1 - reserved0) / 1e6,
        "pool_alloc_mb": (allocated1 - allocated0) / 1e6,
        "peak_alloc_mb": (peak - allocated0) / 1e6,
    }

    def step():
        h = x
        for block in graphed:
            h = block(h)
        h.sum().backward()

    us = time_steps(step, args.steps, args.warmup)
    del model, blocks, graphed, sample_args, step
    free()
    return us, mem


def bench_whole(L, H, B, x, args):
    model = make_model(L, H)
    graphed = torch.cuda.make_graphed_callables(model, (x,))

    def step():
        graphed(x).sum().backward()

    us = time_steps(step, args.steps, args.warmup)

    # CPU cost of issuing one graphed forward; the backward and a sync happen
    # outside the timed region so every forward has a matching backward.
    torch.cuda.synchronize()
    issue = []
    for _ in range(ISSUE_CALLS):
        t0 = time.perf_counter_ns()
        out = graphed(x)
        t1 = time.perf_counter_ns()
        issue.append((t1 - t0) / 1000.0)
        out.sum().backward()
        torch.cuda.synchronize()
    issue_us = statistics.median(issue)

    del model, graphed, step, out
    free()
    return us, issue_us


def bench_floor(L, H, B, x, args):
    model = make_model(L, H)

    # Warm up on a side stream, as the torch.cuda.graphs docs show.
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            model(x).sum().backward()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()

    # Keep the .grad buffers so the captured backward accumulates into them.
    model.zero_grad(set_to_none=False)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_loss = model(x).sum()
        static_loss.backward()
    torch.cuda.synchronize()

    us = time_steps(graph.replay, args.steps, args.warmup)
    del model, graph, static_loss
    free()
    return us


def bench_shape(L, H, B, args):
    tag = f"{L}x{H}x{B}"
    x = make_input(H, B)
    row = {"L": L, "H": H, "B": B}

    row["eager_us"] = bench_eager(L, H, B, x, args)
    log(f"[{tag}] eager      {row['eager_us']:10.1f} us/step")

    row["per_block_us"], mem = bench_per_block(L, H, B, x, args)
    row.update(mem)
    log(f"[{tag}] per_block  {row['per_block_us']:10.1f} us/step"
        f"  capture {mem['capture_ms']:.1f} ms  pool {mem['pool_mb']:.2f} MB"
        f"  (alloc {mem['pool_alloc_mb']:.2f} MB, peak {mem['peak_alloc_mb']:.2f} MB)")

    row["whole_us"], row["issue_us"] = bench_whole(L, H, B, x, args)
    log(f"[{tag}] whole      {row['whole_us']:10.1f} us/step  issue {row['issue_us']:.1f} us")

    row["floor_us"] = bench_floor(L, H, B, x, args)
    log(f"[{tag}] floor      {row['floor_us']:10.1f} us/step")

    del x
    free()
    return row


def bench_gemm(args, dtype):
    """torch.matmul TFLOP/s at 4096^3 and 8192^3 (median over --steps)."""
    rows = []
    for n in (4096, 8192):
        torch.manual_seed(2)
        a = torch.randn(n, n, device="cuda", dtype=dtype)
        b = torch.randn(n, n, device="cuda", dtype=dtype)
        us = time_steps(lambda: torch.matmul(a, b), args.steps, args.warmup)
        tflops = 2.0 * n ** 3 / (us * 1e-6) / 1e12
        log(f"[gemm {n}^3 {args.dtype}] {tflops:.1f} TFLOP/s")
        rows.append({"size": n, "dtype": args.dtype, "tflops": tflops})
        del a, b
        free()
    return rows


def main():
    global DTYPE
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", default=DEFAULT_SHAPES, help="comma-separated LxHxB list")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--out", default="-", help="JSON output path (default stdout)")
    parser.add_argument("--dtype", default=None, choices=sorted(DTYPES), help="f32 (default), bf16 or f16")
    parser.add_argument("--gemm", action="store_true", help="time torch.matmul at 4096^3 and 8192^3 instead")
    args = parser.parse_args()
    if args.dtype is None:
        args.dtype = "bf16" if args.gemm else "f32"
    DTYPE = DTYPES[args.dtype]

    if not torch.cuda.is_available():
        raise SystemExit("CUDA is not available")
    if args.steps < 1 or args.warmup < 0:
        raise SystemExit("--steps must be >= 1 and --warmup >= 0")

    disable_tf32()
    torch.manual_seed(0)
    shapes = parse_shapes(args.shapes)
    device = torch.cuda.get_device_name(0)
    log(f"device {device}, torch {torch.__version__}, cuda {torch.version.cuda}, "
        f"gelu={gelu_mode()}, steps={args.steps}, warmup={args.warmup}")

    if args.gemm:
        doc = {"device": device, "torch": torch.__version__, "gemm": bench_gemm(args, DTYPE)}
        write(doc, args.out)
        return
    results = [bench_shape(L, H, B, args) for (L, H, B) in shapes]

    doc = {
        "device": device,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "date": datetime.date.today().isoformat(),
        "gelu": gelu_mode(),
        "dtype": args.dtype,
        "steps": args.steps,
        "warmup": args.warmup,
        "results": results,
    }
    write(doc, args.out)


def write(doc, out):
    text = json.dumps(doc, indent=2)
    if out == "-":
        print(text)
    else:
        with open(out, "w") as f:
            f.write(text + "\n")
        log(f"wrote {out}")


if __name__ == "__main__":
    main()
