//! The main job: trains a 4-block MLP (Linear + GELU blocks, `#[graphed]` modules) to regress a
//! fixed random function (a frozen 2-block "teacher" network, itself graphed for inference),
//! once eagerly and once with graphs, on the same data. Prints the loss going down, the step
//! time of each, and whether the two runs agree bit for bit.
//!
//! `cargo run --release --example train -- [--steps N]`: on the GPU when one is usable, on the
//! host backend otherwise (`GRAPHED_DEVICE=host` forces it).

#[path = "common/model.rs"]
mod model;

use std::time::Instant;

use graphed::optim::{AdamW, AdamWConfig};
use graphed::{ops, Cx, Device, Generator, GraphedModules, Result, Tensor};
use model::{GraphedStack, Stack, StackInputs};

const WIDTH: usize = 256;
const BATCH: usize = 64;
const LAYERS: usize = 4;

/// Draws a fresh batch in [-1, 1) on the device (graph-safe RNG, no host copies).
fn next_batch(gen: &Generator, x: &Tensor, ones: &Tensor) -> Result<()> {
    gen.uniform_(x)?;
    ops::scale_(x, 2.0)?;
    ops::axpy_(x, -1.0, ones)
}

enum Student {
    Eager(Stack),
    Graphed(GraphedStack),
}

struct Run {
    losses: Vec<(usize, f32)>,
    ms_per_step: f64,
    capture_ms: f64,
    pool_bytes: usize,
}

fn train(dev: &Device, graphed: bool, steps: usize, teacher: &mut GraphedModules) -> Result<Run> {
    let stack = Stack::new(dev, LAYERS, WIDTH, 100)?;
    let params = stack.params();
    let opt = AdamW::new(&params, AdamWConfig { lr: 1e-3, weight_decay: 0.0, ..Default::default() })?;
    let (x, ones) = (Tensor::zeros(dev, &[BATCH, WIDTH])?, Tensor::full(dev, &[BATCH, WIDTH], 1.0)?);
    let data = Generator::new(dev, 2024)?;
    let t0 = Instant::now();
    let mut student = if graphed { Student::Graphed(stack.make_graphed(&x)?) } else { Student::Eager(stack) };
    let capture_ms = if graphed { t0.elapsed().as_secs_f64() * 1e3 } else { 0.0 };
    let pool_bytes = match &student {
        Student::Graphed(g) => g.inner().pool().stats().reserved,
        Student::Eager(_) => 0,
    };
    let label = if graphed { "graphed" } else { "eager" };
    let log_every = (steps / 10).max(1);
    let mut losses = Vec::new();
    dev.synchronize()?;
    let t0 = Instant::now();
    for step in 1..=steps {
        let mut cx = Cx::new(dev);
        next_batch(&data, &x, &ones)?;
        let target = teacher.forward(0, &mut cx, &[Some(x.clone())])?.remove(0).expect("teacher output");
        let y = match &mut student {
            Student::Eager(s) => s.forward(&mut cx, &x)?,
            Student::Graphed(g) => g.forward(&mut cx, &x)?,
        };
        let loss = ops::mse_loss(&y, &target)?;
        let dy = ops::mse_backward(&y, &target, 1.0)?;
        match &mut student {
            Student::Eager(s) => s.backward(&mut cx, &dy)?,
            Student::Graphed(g) => g.backward(&mut cx, &dy)?,
        };
        opt.step()?;
        opt.zero_grad()?;
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

fn main() -> Result<()> {
    let dev = Device::default_device();
    let default_steps = if dev.is_cuda() { 1000 } else { 100 };
    let steps = std::env::args()
        .skip_while(|a| a != "--steps")
        .nth(1)
        .map(|s| s.parse().map_err(|e| graphed::Error::msg(format!("--steps: {e}"))))
        .transpose()?
        .unwrap_or(default_steps);
    println!(
        "graphed main job on {}: {LAYERS} x Linear({WIDTH}, {WIDTH}) + GELU, batch {BATCH}, AdamW, {steps} steps",
        dev.name()
    );

    // The fixed random function to regress: a frozen 2-block network, graphed forward-only.
    let teacher = Stack::new(&dev, 2, WIDTH, 7)?;
    let sample = Tensor::zeros(&dev, &[BATCH, WIDTH])?;
    let mut teacher =
        GraphedStack::new(teacher, StackInputs { x: sample }, GraphedStack::options().inference())?.into_inner();

    let eager = train(&dev, false, steps, &mut teacher)?;
    let graphed = train(&dev, true, steps, &mut teacher)?;

    println!("\n{:>7} {:>14} {:>14}", "step", "eager loss", "graphed loss");
    for ((s, a), (_, b)) in eager.losses.iter().zip(&graphed.losses) {
        println!("{s:>7} {a:>14.6} {b:>14.6}");
    }
    let identical = eager.losses == graphed.losses;
    let (first, last) = (graphed.losses.first().map_or(0.0, |l| l.1), graphed.losses.last().map_or(0.0, |l| l.1));
    println!("\nsummary");
    println!("  device                  {}", dev.name());
    println!("  loss                    {first:.6} -> {last:.6} ({:.1}x lower)", first / last.max(1e-30));
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
