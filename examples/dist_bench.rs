//! Data-parallel scaling: the benchmark model (L blocks of Linear(H, H) + GELU, f32) trained
//! with one graph per block, on 1 GPU and on N GPUs (one process each) at the same per-GPU
//! batch. On N GPUs it measures two ways of reducing the grads, both captured in the blocks'
//! backward graphs: `DataParallel::chunks` (shared 25 MB buckets, each all-reduced by the block
//! that fills it) and `DataParallel::chunks_overlapped` (one bucket per block, all-reduced on a
//! side stream during the next block's backward); the N-GPU figure is the faster of the two. A step is forward through all blocks, `sum()`,
//! backward, as in `examples/bench.rs`; times are medians of CUDA-event step times on rank 0.
//!
//! `cargo run --release --example dist_bench -- [--shapes 32x256x32,16x1024x128] [--gpus 2]
//!  [--steps N] [--warmup N] [--out dist.json]` (`--help` for each flag)
//!
//! Without GPUs, `--emulated` runs the same code on emulated host ranks (a smoke test, not a
//! measurement). scripts/gpu-multi.sh runs it next to bench/pytorch_ddp_bench.py.

#[path = "common/cli.rs"]
mod cli;
#[path = "common/model.rs"]
mod model;

use std::time::Duration;

use clap::builder::TypedValueParser;
use clap::Parser;
use graphed::dist::{self, Communicator, Config, DataParallel, LaunchOptions, RankEnv, ReduceOp};
use graphed::{make_graphed, ops, Device, Error, GraphOptions, Module, Result, Tensor};
use model::{random, Stack};

/// Data-parallel scaling: the benchmark model with one graph per block on 1 GPU and on N GPUs
/// (one process each), the grads all-reduced inside the backward graphs.
#[derive(Clone, Parser)]
#[command(name = "dist_bench", args_override_self = true)]
struct Args {
    /// Shapes to measure, LxHxB (L blocks of width H, batch B per GPU), comma-separated.
    #[arg(long, value_name = "LxHxB,...", value_delimiter = ',', value_parser = cli::shape,
          default_value = "32x256x32,16x1024x128")]
    shapes: Vec<(usize, usize, usize)>,
    /// GPUs of the N-GPU run (one process each).
    #[arg(long, value_name = "N", default_value_t = 2, value_parser = clap::value_parser!(u64).range(1..).map(|n| n as usize))]
    gpus: usize,
    /// Timed steps per variant (median of CUDA-event step times on rank 0).
    #[arg(long, value_name = "N", default_value_t = 200, value_parser = clap::value_parser!(u64).range(1..).map(|n| n as usize))]
    steps: usize,
    /// Untimed warm-up steps before each variant.
    #[arg(long, value_name = "N", default_value_t = 20)]
    warmup: usize,
    /// Write the results as JSON to this file (default: print them).
    #[arg(long, value_name = "FILE")]
    out: Option<String>,
    /// Run the ranks as threads on the host backend (a smoke test without GPUs, not a measurement).
    #[arg(long)]
    emulated: bool,
    /// Internal: this process is a rank writing its rows here.
    #[arg(long, hide = true)]
    rank_out: Option<String>,
    /// Internal: the world size of this rank's run.
    #[arg(long, hide = true, default_value_t = 1)]
    world: usize,
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// Median per-step device time (us) of one graph per block, data parallel over `comm`.
/// How the blocks' grads are reduced on several ranks.
#[derive(Clone, Copy)]
enum Mode {
    /// Shared 25 MB buckets, each all-reduced in the backward graph of the block that fills it.
    Inline,
    /// One bucket per block, all-reduced on a side stream during the next block's backward.
    Overlapped,
}

fn bench_shape(
    dev: &Device,
    comm: Option<(&Communicator, Mode)>,
    (l, h, b): (usize, usize, usize),
    args: &Args,
) -> Result<f64> {
    let x = random(dev, &[b, h], 7 + comm.map_or(0, |(c, _)| c.rank() as u64), 1.0)?;
    let dy = Tensor::zeros(dev, &[b, h])?;
    let stack = Stack::new(dev, l, h, 1)?;
    let blocks: Vec<Box<dyn Module>> = match comm {
        Some((c, mode)) => {
            let chunks = stack.blocks.into_iter().map(|blk| {
                let named = blk.params().into_iter().enumerate().map(|(i, p)| (format!("p{i}"), p)).collect();
                (blk, named)
            });
            let layers = match mode {
                Mode::Inline => {
                    DataParallel::chunks(chunks.collect(), c.clone(), ReduceOp::Sum, dist::DEFAULT_BUCKET_BYTES)?
                }
                Mode::Overlapped => DataParallel::chunks_overlapped(chunks.collect(), c.clone(), ReduceOp::Sum, 1)?,
            };
            layers.into_iter().map(|d| Box::new(d) as Box<dyn Module>).collect()
        }
        None => stack.blocks.into_iter().map(|blk| Box::new(blk) as Box<dyn Module>).collect(),
    };
    let hidden = Tensor::zeros(dev, &[b, h])?.with_requires_grad(true);
    let mut samples = vec![vec![vec![Some(x.clone())]]];
    samples.extend((1..l).map(|_| vec![vec![Some(hidden.clone())]]));
    let mut g = make_graphed(blocks, samples, GraphOptions::new().warmup(3).chained(true))?;
    let mut step = || -> Result<()> {
        let mut hcur = x.clone();
        for i in 0..l {
            hcur = g.forward(i, &[Some(hcur)])?.remove(0).expect("block output");
        }
        let _loss = ops::sum(&hcur)?;
        ops::fill_(&dy, 1.0)?;
        let mut grad = dy.clone();
        for i in (0..l).rev() {
            match g.backward(i, &[Some(grad.clone())])?.remove(0) {
                Some(d) => grad = d,
                None => break,
            }
        }
        Ok(())
    };
    for _ in 0..args.warmup {
        step()?;
    }
    match comm {
        Some((c, _)) => c.barrier()?,
        None => dev.synchronize()?,
    }
    let mut times = Vec::with_capacity(args.steps);
    for _ in 0..args.steps {
        times.push(dev.time_ms(&mut step)? as f64 * 1e3);
    }
    Ok(median(times))
}

/// Runs every shape on this rank (on several ranks in both modes, inline then overlapped);
/// rank 0 writes `l h b us...` lines to `--rank-out`.
fn rank_main(dev: &Device, comm: Option<&Communicator>, args: &Args) -> Result<Vec<Vec<f64>>> {
    let mut out = Vec::new();
    for &shape in &args.shapes {
        let world = comm.map_or(1, Communicator::world_size);
        eprintln!("[dist_bench {}x{}x{} on {world} rank(s)] {}", shape.0, shape.1, shape.2, dev.name());
        out.push(match comm {
            None => vec![bench_shape(dev, None, shape, args)?],
            Some(c) => vec![
                bench_shape(dev, Some((c, Mode::Inline)), shape, args)?,
                bench_shape(dev, Some((c, Mode::Overlapped)), shape, args)?,
            ],
        });
    }
    if let (Some(path), 0) = (&args.rank_out, comm.map_or(0, Communicator::rank)) {
        let lines: Vec<String> = args
            .shapes
            .iter()
            .zip(&out)
            .map(|((l, h, b), us)| {
                let us: Vec<String> = us.iter().map(f64::to_string).collect();
                format!("{l} {h} {b} {}", us.join(" "))
            })
            .collect();
        std::fs::write(path, lines.join("\n")).map_err(|e| Error::msg(format!("{path}: {e}")))?;
    }
    if let Some(c) = comm {
        c.barrier()?;
    }
    Ok(out)
}

/// The rank side of a launch: one GPU without a communicator, or NCCL over `world` GPUs.
fn run_rank(env: RankEnv, args: &Args) -> Result<()> {
    if env.world_size == 1 {
        return rank_main(&Device::cuda(env.local_rank)?, None, args).map(drop);
    }
    let comm = env.communicator(&Config::default().timeout(Duration::from_secs(300)))?;
    rank_main(&comm.device().clone(), Some(&comm), args).map(drop)
}

/// Runs `world` ranks (processes, or emulated threads) and returns rank 0's times per shape.
fn measure(args: &Args, world: usize) -> Result<Vec<Vec<f64>>> {
    if args.emulated {
        let times = match world {
            1 => vec![rank_main(&Device::host(), None, args)?],
            _ => dist::run_emulated(world, |comm| rank_main(&comm.device().clone(), Some(&comm), args))?,
        };
        return Ok(times.into_iter().next().unwrap_or_default());
    }
    let path = std::env::temp_dir().join(format!("graphed-dist-bench-{}-{world}.txt", std::process::id()));
    let mut child_args: Vec<String> = std::env::args().skip(1).collect();
    child_args.extend(["--world".into(), world.to_string(), "--rank-out".into(), path.display().to_string()]);
    let options = LaunchOptions { args: Some(child_args), deadline: Duration::from_secs(900), ..Default::default() };
    dist::launch(world, &options, |_| Err(Error::msg("the parent is not a rank")))?;
    let text = std::fs::read_to_string(&path).map_err(|e| Error::msg(format!("rank 0 wrote no results: {e}")))?;
    let _ = std::fs::remove_file(&path);
    text.lines()
        .map(|l| {
            let us: Vec<f64> = l.split(' ').skip(3).filter_map(|v| v.parse().ok()).collect();
            if us.is_empty() {
                Err(Error::msg(format!("bad rank output line `{l}`")))
            } else {
                Ok(us)
            }
        })
        .collect()
}

fn main() -> Result<()> {
    let args = Args::parse();
    if let Some(env) = RankEnv::from_env()? {
        return run_rank(env, &args);
    }
    if !args.emulated && dist::gpu_count() < args.gpus {
        return Err(Error::msg(format!(
            "{} GPU(s) here, --gpus {} (use --emulated without GPUs)",
            dist::gpu_count(),
            args.gpus
        )));
    }
    let one = measure(&args, 1)?;
    let many = measure(&args, args.gpus)?;
    let n = args.gpus;
    println!(
        "{:>12} {:>14} {:>14} {:>10} {:>12}",
        "shape",
        "1 GPU (us)",
        format!("{n} GPUs (us)"),
        "ratio",
        "efficiency"
    );
    let mut rows = Vec::new();
    for (((l, h, b), one), many) in args.shapes.iter().zip(&one).zip(&many) {
        let t1 = one.first().copied().unwrap_or(f64::NAN);
        let (inline, overlapped) =
            (many.first().copied().unwrap_or(f64::NAN), many.get(1).copied().unwrap_or(f64::NAN));
        let tn = inline.min(overlapped);
        let (ratio, eff) = (tn / t1, t1 / tn);
        println!(
            "{:>12} {t1:>14.1} {tn:>14.1} {ratio:>10.3} {:>11.1}%   (inline buckets {inline:.1} us, overlapped {overlapped:.1} us)",
            format!("{l}x{h}x{b}"),
            eff * 100.0
        );
        rows.push(format!(
            "{{\"l\": {l}, \"h\": {h}, \"b\": {b}, \"gpus\": {n}, \"one_us\": {t1:.3}, \"many_us\": {tn:.3}, \"inline_us\": {inline:.3}, \"overlap_us\": {overlapped:.3}, \"ratio\": {ratio:.4}, \"efficiency\": {eff:.4}}}"
        ));
    }
    let json = format!("{{\"emulated\": {}, \"rows\": [{}]}}\n", args.emulated, rows.join(", "));
    match &args.out {
        Some(path) => std::fs::write(path, json).map_err(|e| Error::msg(format!("{path}: {e}")))?,
        None => print!("{json}"),
    }
    Ok(())
}
