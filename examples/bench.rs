//! The benchmark: L blocks of Linear(H, H) + GELU, batch B, f32 (no TF32); a step is forward
//! through all blocks, `sum()`, backward. For each shape it measures, as medians over many steps
//! after warm-up, each step timed with CUDA events: our eager step, one graph per block, one graph
//! for the whole stack, the full step as a single graph (the floor), plus capture time, pool
//! bytes (and the bytes that must be live), and the CPU time to issue one graphed call.
//!
//! `cargo run --release --example bench -- [--shapes 8x256x32,...] [--steps N] [--warmup N] [--dtype f32|bf16|f16] [--out ours.json]`
//! (`--help` for each flag)
//! runs the model in f32 (default) or with bf16/f16 weights and activations (f32 grads of the
//! weights, f32 accumulation in the GEMMs). `--gemm` instead prints GEMM TFLOP/s at 4096^3 and
//! 8192^3 for `--dtype` (bf16 by default there).
//! scripts/bench.sh runs it next to PyTorch on the GPU machine and draws the chart.

#[path = "common/cli.rs"]
mod cli;
#[path = "common/model.rs"]
mod model;

use std::time::Instant;

use clap::builder::TypedValueParser;
use clap::Parser;
use graphed::{make_graphed, ops, CaptureMode, Cx, DType, Device, Graph, GraphOptions, Module, Result, Tensor};
use model::{random, Stack};

/// The benchmark: eager, per-block graphs, fused, whole-stack graph and the single-graph floor
/// of L blocks of Linear(H, H) + GELU, per shape (or GEMM TFLOP/s with `--gemm`).
#[derive(Parser)]
#[command(name = "bench")]
struct Args {
    /// Shapes to measure, LxHxB (L blocks of width H, batch B), comma-separated.
    #[arg(long, value_name = "LxHxB,...", value_delimiter = ',', value_parser = cli::shape,
          default_value = "8x256x32,32x256x32,16x1024x128,8x4096x512")]
    shapes: Vec<(usize, usize, usize)>,
    /// Timed steps per variant (each timed with CUDA events; the median is reported).
    #[arg(long, value_name = "N", default_value_t = 200, value_parser = clap::value_parser!(u64).range(1..).map(|n| n as usize))]
    steps: usize,
    /// Untimed warm-up steps before each variant.
    #[arg(long, value_name = "N", default_value_t = 20)]
    warmup: usize,
    /// Also write the results as JSON to this file.
    #[arg(long, value_name = "FILE")]
    out: Option<String>,
    /// Weights and activations [default: f32; bf16 with --gemm].
    #[arg(long, value_parser = cli::dtype())]
    dtype: Option<DType>,
    /// Measure GEMM TFLOP/s at 4096^3 and 8192^3 instead of the model.
    #[arg(long)]
    gemm: bool,
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// Median device time of `step` in microseconds, after `warmup` untimed steps.
fn time_steps(dev: &Device, warmup: usize, steps: usize, mut step: impl FnMut() -> Result<()>) -> Result<f64> {
    for _ in 0..warmup {
        step()?;
    }
    dev.synchronize()?;
    let mut v = Vec::with_capacity(steps);
    for _ in 0..steps {
        v.push(dev.time_ms(&mut step)? as f64 * 1e3);
    }
    Ok(median(v))
}

/// One eager training step of the benchmark: forward, `sum()`, backward (dy = ones).
fn eager_step(dev: &Device, stack: &mut Stack, x: &Tensor, dy: &Tensor) -> Result<()> {
    let mut cx = Cx::new(dev);
    cx.set_needs_input_grad(vec![false]);
    let y = stack.forward(&mut cx, x)?;
    let _loss = ops::sum(&y)?;
    ops::fill_(dy, 1.0)?;
    stack.backward(&mut cx, dy)?;
    Ok(())
}

struct Row {
    l: usize,
    h: usize,
    b: usize,
    eager: f64,
    per_block: f64,
    whole: f64,
    floor: f64,
    capture_ms: f64,
    whole_capture_ms: f64,
    pool_mb: f64,
    live_mb: f64,
    whole_pool_mb: f64,
    issue_us: f64,
    per_block_cpu_us: f64,
    fused: f64,
    fused_cpu_us: f64,
    /// Nodes of the fused step's graph (the per-block graphs' nodes together).
    fused_nodes: usize,
}

fn bench_shape(dev: &Device, (l, h, b): (usize, usize, usize), args: &Args) -> Result<Row> {
    let dtype = args.dtype.unwrap_or(DType::F32);
    let x = random(dev, &[b, h], 7, 1.0)?.to_dtype(dtype)?;
    let dy = Tensor::zeros_as(dev, &[b, h], dtype)?;
    let progress = |what: &str| eprintln!("[bench {l}x{h}, batch {b}] {what}");

    // Eager.
    progress("eager");
    let mut stack = Stack::new_as(dev, l, h, 1, dtype)?;
    let eager = time_steps(dev, args.warmup, args.steps, || eager_step(dev, &mut stack, &x, &dy))?;

    // One graph per block, chained: block i+1 reads block i's static output in place.
    progress("one graph per block");
    let blocks: Vec<Box<dyn Module>> =
        Stack::new_as(dev, l, h, 1, dtype)?.blocks.into_iter().map(|blk| Box::new(blk) as Box<dyn Module>).collect();
    let hidden = Tensor::zeros_as(dev, &[b, h], dtype)?.with_requires_grad(true);
    let mut samples = vec![vec![vec![Some(x.clone())]]];
    samples.extend((1..l).map(|_| vec![vec![Some(hidden.clone())]]));
    let t0 = Instant::now();
    let mut per = make_graphed(blocks, samples, GraphOptions::new().warmup(3).chained(true))?;
    let capture_ms = t0.elapsed().as_secs_f64() * 1e3;
    let (pool_mb, live_mb) = (per.pool().stats().reserved as f64 / 1e6, per.live_bytes() as f64 / 1e6);
    let mut per_block_step = || -> Result<()> {
        let mut hcur = x.clone();
        for i in 0..l {
            hcur = per.forward(i, &[Some(hcur)])?.remove(0).expect("block output");
        }
        let _loss = ops::sum(&hcur)?;
        ops::fill_(&dy, 1.0)?;
        let mut g = dy.clone();
        for i in (0..l).rev() {
            match per.backward(i, &[Some(g.clone())])?.remove(0) {
                Some(d) => g = d,
                None => break,
            }
        }
        Ok(())
    };
    let per_block = time_steps(dev, args.warmup, args.steps, &mut per_block_step)?;
    // CPU time to issue one per-block step (no synchronisation inside): if it is below the
    // step's GPU time, the GPU never waits for the CPU.
    let mut cpu = Vec::with_capacity(args.steps);
    for _ in 0..args.steps {
        dev.synchronize()?;
        let t = Instant::now();
        per_block_step()?;
        cpu.push(t.elapsed().as_secs_f64() * 1e6);
    }
    let per_block_cpu_us = median(cpu);

    // The same graphs fused: one launch per step. The input and the loss grad (ones) are bound
    // to the static buffers once; the loss sum runs after the step, as in the per-block step.
    progress("one graph per block, fused (one launch per step)");
    per.fuse()?;
    let fused_nodes = per.graphs().iter().map(|(_, g)| g.nodes().map(|n| n.len())).sum::<Result<usize>>()?;
    per.static_inputs(0, 0)?[0].as_ref().expect("static input").copy_(&x)?;
    ops::fill_(per.static_grad_outputs(l - 1, 0)?[0].as_ref().expect("static grad output"), 1.0)?;
    let mut fused_step = || -> Result<()> {
        per.step()?;
        let _loss = ops::sum(per.outputs(l - 1, 0)?[0].as_ref().expect("last output"))?;
        Ok(())
    };
    let fused = time_steps(dev, args.warmup, args.steps, &mut fused_step)?;
    let mut cpu = Vec::with_capacity(args.steps);
    for _ in 0..args.steps {
        dev.synchronize()?;
        let t = Instant::now();
        per.step()?;
        cpu.push(t.elapsed().as_secs_f64() * 1e6);
    }
    let fused_cpu_us = median(cpu);
    drop(per);

    // One graph for the whole stack.
    progress("one graph for the stack");
    let t0 = Instant::now();
    let mut whole = Stack::new_as(dev, l, h, 1, dtype)?.make_graphed(&x)?;
    let whole_capture_ms = t0.elapsed().as_secs_f64() * 1e3;
    let whole_pool_mb = whole.inner().pool().stats().reserved as f64 / 1e6;
    let whole_us = time_steps(dev, args.warmup, args.steps, || {
        let y = whole.forward(&x)?;
        let _loss = ops::sum(&y)?;
        ops::fill_(&dy, 1.0)?;
        whole.backward(&dy)?;
        Ok(())
    })?;
    // CPU time to issue one graphed call (forward of the whole stack), backward untimed.
    let mut issue = Vec::with_capacity(200);
    for _ in 0..200 {
        let t = Instant::now();
        let y = whole.forward(&x)?;
        issue.push(t.elapsed().as_secs_f64() * 1e6);
        drop(y);
        whole.backward(&dy)?;
        dev.synchronize()?;
    }
    let issue_us = median(issue);
    drop(whole);

    // The floor: the full step captured as one graph.
    progress("full step as one graph (floor)");
    let mut stack = Stack::new_as(dev, l, h, 1, dtype)?;
    let pool = dev.new_pool();
    for _ in 0..3 {
        dev.with_pool(&pool, || eager_step(dev, &mut stack, &x, &dy))?;
    }
    let mut g = Graph::with_pool(dev, &pool);
    g.capture(CaptureMode::Global, || eager_step(dev, &mut stack, &x, &dy))?;
    let floor = time_steps(dev, args.warmup, args.steps, || g.replay())?;

    Ok(Row {
        l,
        h,
        b,
        eager,
        per_block,
        whole: whole_us,
        floor,
        capture_ms,
        whole_capture_ms,
        pool_mb,
        live_mb,
        whole_pool_mb,
        issue_us,
        per_block_cpu_us,
        fused,
        fused_cpu_us,
        fused_nodes,
    })
}

/// `y[m, n] = x[m, k] · w[n, k]ᵀ` at `size`^3 in `dtype`: median TFLOP/s over `steps` runs.
fn gemm_tflops(dev: &Device, size: usize, dtype: DType, args: &Args) -> Result<f64> {
    let x = random(dev, &[size, size], 3, 1.0)?.to_dtype(dtype)?;
    let w = random(dev, &[size, size], 4, 1.0)?.to_dtype(dtype)?;
    let us = time_steps(dev, args.warmup, args.steps, || ops::linear(&x, &w, None).map(drop))?;
    Ok(2.0 * (size as f64).powi(3) / (us * 1e-6) / 1e12)
}

fn gemm_main(dev: &Device, args: &Args) -> Result<()> {
    let dtype = args.dtype.unwrap_or(DType::BF16);
    let sizes: &[usize] = if dev.is_cuda() { &[4096, 8192] } else { &[256, 512] };
    let mut rows = Vec::new();
    println!("{:>8} {:>6} {:>9}", "size", "dtype", "TFLOP/s");
    for &n in sizes {
        let t = gemm_tflops(dev, n, dtype, args)?;
        println!("{n:>8} {dtype:>6} {t:>9.1}");
        rows.push(format!("{{\"size\":{n},\"dtype\":\"{dtype}\",\"tflops\":{t:.2}}}"));
    }
    if let Some(path) = &args.out {
        let json = format!("{{\"device\":\"{}\",\"gemm\":[{}]}}\n", dev.name(), rows.join(","));
        std::fs::write(path, json).map_err(|e| graphed::Error::msg(format!("writing {path}: {e}")))?;
        eprintln!("[bench] wrote {path}");
    }
    Ok(())
}

fn main() -> Result<()> {
    let args = Args::parse();
    let dev = Device::default_device();
    if args.gemm {
        return gemm_main(&dev, &args);
    }
    eprintln!("[bench] device {}; {} steps after {} warm-up steps per variant", dev.name(), args.steps, args.warmup);
    let mut rows = Vec::new();
    for &shape in &args.shapes {
        rows.push(bench_shape(&dev, shape, &args)?);
    }
    println!(
        "{:>14} {:>10} {:>10} {:>10} {:>10} {:>10} {:>11} {:>9} {:>9} {:>9} {:>13} {:>9} {:>7}",
        "L x H, B",
        "eager us",
        "per-block",
        "fused",
        "whole",
        "floor",
        "capture ms",
        "pool MB",
        "live MB",
        "issue us",
        "per-block CPU",
        "fused CPU",
        "nodes"
    );
    for r in &rows {
        println!(
            "{:>14} {:>10.1} {:>10.1} {:>10.1} {:>10.1} {:>10.1} {:>11.2} {:>9.2} {:>9.2} {:>9.2} {:>13.1} {:>9.2} {:>7}",
            format!("{}x{}, {}", r.l, r.h, r.b),
            r.eager,
            r.per_block,
            r.fused,
            r.whole,
            r.floor,
            r.capture_ms,
            r.pool_mb,
            r.live_mb,
            r.issue_us,
            r.per_block_cpu_us,
            r.fused_cpu_us,
            r.fused_nodes
        );
    }
    if let Some(path) = &args.out {
        let results: Vec<String> = rows
            .iter()
            .map(|r| {
                format!(
                    "{{\"L\":{},\"H\":{},\"B\":{},\"eager_us\":{:.2},\"per_block_us\":{:.2},\"whole_us\":{:.2},\"floor_us\":{:.2},\"capture_ms\":{:.3},\"whole_capture_ms\":{:.3},\"pool_mb\":{:.4},\"live_mb\":{:.4},\"whole_pool_mb\":{:.4},\"issue_us\":{:.3},\"per_block_cpu_us\":{:.2},\"fused_us\":{:.2},\"fused_cpu_us\":{:.3},\"fused_nodes\":{}}}",
                    r.l, r.h, r.b, r.eager, r.per_block, r.whole, r.floor, r.capture_ms, r.whole_capture_ms, r.pool_mb, r.live_mb, r.whole_pool_mb, r.issue_us, r.per_block_cpu_us, r.fused, r.fused_cpu_us, r.fused_nodes
                )
            })
            .collect();
        let json = format!(
            "{{\"device\":\"{}\",\"dtype\":\"{}\",\"versions\":\"graphed {} (cudarc 0.19.10)\",\"results\":[{}]}}\n",
            dev.name(),
            args.dtype.unwrap_or(DType::F32),
            env!("CARGO_PKG_VERSION"),
            results.join(",")
        );
        std::fs::write(path, json).map_err(|e| graphed::Error::msg(format!("writing {path}: {e}")))?;
        eprintln!("[bench] wrote {path}");
    }
    Ok(())
}
