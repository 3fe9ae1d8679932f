//! The MLP job (the main job before the GPT of examples/gpt): trains a 4-block MLP (Linear +
//! GELU blocks, `#[graphed]` modules) to regress a fixed random function (a frozen 2-block
//! "teacher" network, itself graphed for inference), once eagerly and once with graphs, on the
//! same data. Prints the loss going down, the step
//! time of each, and whether the two runs agree bit for bit.
//!
//! `cargo run --release --example train -- [--steps N] [--dtype f32|bf16|f16]` (`--help`): on the GPU when
//! one is usable, on the host backend otherwise (`GRAPHED_DEVICE=host` forces it).
//!
//! With `--dtype bf16` (or `f16`) the student's weights and activations are 16-bit, its weight
//! grads and AdamW's master weights f32 (`MixedAdamW`, the bf16 weights rewritten inside the
//! step); the loss is computed in f32. f16 adds device-side dynamic loss scaling
//! (`LossScaler`). An f32 eager run is made first as the reference, and the summary prints the
//! final loss against it.

#[path = "common/cli.rs"]
mod cli;
#[path = "common/model.rs"]
mod model;

use std::time::Instant;

use clap::builder::TypedValueParser;
use clap::Parser;
use graphed::optim::{AdamW, AdamWConfig, LossScaler, LossScalerConfig, MixedAdamW};
use graphed::{ops, Cx, DType, Device, Generator, GraphedModules, Param, Result, Tensor};
use model::{GraphedStack, Stack, StackInputs};

const WIDTH: usize = 256;
const BATCH: usize = 64;
const LAYERS: usize = 4;

/// Draws a fresh batch in [-1, 1) on the device (graph-safe RNG, no host copies).
fn next_batch(rng: &Generator, x: &Tensor, ones: &Tensor) -> Result<()> {
    rng.uniform_(x)?;
    ops::scale_(x, 2.0)?;
    ops::axpy_(x, -1.0, ones)
}

enum Student {
    Eager(Stack),
    Graphed(GraphedStack),
}

/// f32 AdamW for f32 weights; AdamW over f32 masters for 16-bit ones (with loss scaling for
/// f16).
enum Optimizer {
    F32(AdamW),
    Mixed(MixedAdamW),
}

impl Optimizer {
    fn new(dev: &Device, params: &[Param], dtype: DType) -> Result<Optimizer> {
        let cfg = AdamWConfig { lr: 1e-3, weight_decay: 0.0, ..Default::default() };
        Ok(match dtype {
            DType::F32 => Optimizer::F32(AdamW::new(params, cfg)?),
            DType::F16 => {
                let scaler = LossScaler::new(dev, LossScalerConfig::default())?;
                Optimizer::Mixed(MixedAdamW::new(params, cfg, Some(scaler))?)
            }
            _ => Optimizer::Mixed(MixedAdamW::new(params, cfg, None)?),
        })
    }

    fn step(&self) -> Result<()> {
        match self {
            Optimizer::F32(o) => o.step().and_then(|()| o.zero_grad()),
            Optimizer::Mixed(o) => o.step().and_then(|()| o.zero_grad()),
        }
    }

    /// Multiplies the f32 loss grad by the loss scale (f16 only).
    fn scale_loss_grad(&self, d: &Tensor) -> Result<()> {
        match self {
            Optimizer::Mixed(o) => o.scaler().map_or(Ok(()), |s| s.scale_grad_(d)),
            Optimizer::F32(_) => Ok(()),
        }
    }
}

struct Run {
    losses: Vec<(usize, f32)>,
    ms_per_step: f64,
    capture_ms: f64,
    pool_bytes: usize,
}

fn train(dev: &Device, graphed: bool, steps: usize, dtype: DType, teacher: &mut GraphedModules) -> Result<Run> {
    let stack = Stack::new_as(dev, LAYERS, WIDTH, 100, dtype)?;
    let opt = Optimizer::new(dev, &stack.params(), dtype)?;
    let (x, ones) = (Tensor::zeros(dev, &[BATCH, WIDTH])?, Tensor::full(dev, &[BATCH, WIDTH], 1.0)?);
    let data = Generator::new(dev, 2024)?;
    let t0 = Instant::now();
    let sample = Tensor::zeros_as(dev, &[BATCH, WIDTH], dtype)?;
    let mut student = if graphed { Student::Graphed(stack.make_graphed(&sample)?) } else { Student::Eager(stack) };
    let capture_ms = if graphed { t0.elapsed().as_secs_f64() * 1e3 } else { 0.0 };
    let pool_bytes = match &student {
        Student::Graphed(g) => g.inner().pool().stats().reserved,
        Student::Eager(_) => 0,
    };
    let label = format!("{dtype} {}", if graphed { "graphed" } else { "eager" });
    let log_every = (steps / 10).max(1);
    let mut losses = Vec::new();
    dev.synchronize()?;
    let t0 = Instant::now();
    for step in 1..=steps {
        let mut cx = Cx::new(dev);
        next_batch(&data, &x, &ones)?;
        let target = teacher.forward(0, &[Some(x.clone())])?.remove(0).expect("teacher output");
        let xs = ops::cast(&x, dtype)?;
        let y = match &mut student {
            Student::Eager(s) => s.forward(&mut cx, &xs)?,
            Student::Graphed(g) => g.forward(&xs)?,
        };
        // The loss and its grad in f32; the grad goes back in the student's dtype (scaled first
        // for f16, so small grads survive the cast).
        let yf = ops::cast(&y, DType::F32)?;
        let loss = ops::mse_loss(&yf, &target)?;
        let dyf = ops::mse_backward(&yf, &target, 1.0)?;
        opt.scale_loss_grad(&dyf)?;
        let dy = ops::cast(&dyf, dtype)?;
        match &mut student {
            Student::Eager(s) => s.backward(&mut cx, &dy)?,
            Student::Graphed(g) => g.backward(&dy)?,
        };
        opt.step()?;
        if step % log_every == 0 || step == 1 {
            let l = loss.to_vec()?[0];
            losses.push((step, l));
            eprintln!("[{label:>7}] step {step:>5}/{steps}  loss {l:.6}");
        }
    }
    dev.synchronize()?;
    let ms_per_step = t0.elapsed().as_secs_f64() * 1e3 / steps as f64;
    Ok(Run { losses, ms_per_step, capture_ms, pool_bytes })
}

/// The MLP job: a 4-block MLP trained eagerly and with graphs on the same data, bit for bit.
#[derive(Parser)]
#[command(name = "train", after_help = "Set GRAPHED_DEVICE=host to run on the CPU when a GPU is present.")]
struct Args {
    /// AdamW steps of each run [default: 1000 on a GPU, 100 on the host].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..).map(|n| n as usize))]
    steps: Option<usize>,
    /// The student's weights and activations (bf16 and f16 keep f32 master weights; f16 adds
    /// loss scaling; both are compared with an f32 reference run).
    #[arg(long, value_parser = cli::dtype(), default_value = "f32")]
    dtype: DType,
}

fn main() -> Result<()> {
    let args = Args::parse();
    let dev = Device::default_device();
    let steps = args.steps.unwrap_or(if dev.is_cuda() { 1000 } else { 100 });
    let dtype = args.dtype;
    println!(
        "graphed MLP job on {}: {LAYERS} x Linear({WIDTH}, {WIDTH}) + GELU in {dtype}, batch {BATCH}, AdamW, {steps} steps",
        dev.name()
    );

    // The fixed random function to regress: a frozen 2-block f32 network, graphed forward-only.
    let teacher = Stack::new(&dev, 2, WIDTH, 7)?;
    let sample = Tensor::zeros(&dev, &[BATCH, WIDTH])?;
    let mut teacher =
        GraphedStack::new(teacher, StackInputs { x: sample }, GraphedStack::options().inference())?.into_inner();

    let reference = if dtype == DType::F32 { None } else { Some(train(&dev, false, steps, DType::F32, &mut teacher)?) };
    let eager = train(&dev, false, steps, dtype, &mut teacher)?;
    let graphed = train(&dev, true, steps, dtype, &mut teacher)?;

    println!("\n{:>7} {:>14} {:>14}", "step", "eager loss", "graphed loss");
    for ((s, a), (_, b)) in eager.losses.iter().zip(&graphed.losses) {
        println!("{s:>7} {a:>14.6} {b:>14.6}");
    }
    let identical = eager.losses == graphed.losses;
    let (first, last) = (graphed.losses.first().map_or(0.0, |l| l.1), graphed.losses.last().map_or(0.0, |l| l.1));
    println!("\nsummary");
    println!("  device                  {}", dev.name());
    println!("  dtype                   {dtype}");
    println!("  loss                    {first:.6} -> {last:.6} ({:.1}x lower)", first / last.max(1e-30));
    if let Some(r) = &reference {
        let f32_last = r.losses.last().map_or(0.0, |l| l.1);
        let ratio = last / f32_last.max(1e-30);
        let verdict = if (ratio - 1.0).abs() <= 0.02 { "PASS" } else { "MISS" };
        println!("  final loss vs f32       {last:.6} vs {f32_last:.6} ({ratio:.4}x; target within 2%: {verdict})");
    }
    println!("  eager step              {:.3} ms", eager.ms_per_step);
    println!(
        "  graphed step            {:.3} ms ({:.2}x faster)",
        graphed.ms_per_step,
        eager.ms_per_step / graphed.ms_per_step
    );
    println!("  capture (warm-up 3)     {:.1} ms", graphed.capture_ms);
    println!("  graph pool              {:.2} MB", graphed.pool_bytes as f64 / 1e6);
    println!("  eager == graphed losses {}", if identical { "yes, bit for bit" } else { "NO" });
    if !identical || last >= first {
        return Err(graphed::Error::msg("the graphed run must match the eager run and the loss must fall"));
    }
    Ok(())
}
