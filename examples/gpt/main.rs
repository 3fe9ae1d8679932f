//! A byte-level GPT trained with one graphed module per transformer block (#13).
//!
//! `cargo run --release --example gpt -- [--steps N] [--data FILE] [--size tiny|gpu]
//! [--eval-every N] [--warmup N] [--plot FILE.png] [--checkpoint] [--dropout P] [--eager]`
//!
//! The text is, by default, the repository's own README.md, docs/*.md and Rust sources, read
//! from the directory the binary runs in (run it from the repository root); `--data FILE`
//! trains on a file instead. A missing or empty corpus is an error, not a panic. On the host
//! backend the tiny configuration (3 layers, d_model 96, context 96) trains 500 steps in about
//! 45 s; on a GPU the default is 8 layers, d_model 512, 8 heads, context 256, batch 16. Prints
//! step, loss, tokens/s and ETA, the validation loss every `--eval-every` steps, 200 sampled
//! bytes at the end, and writes the loss curve as a PNG (`--plot`, default in the temp
//! directory). The learning rate warms up linearly over `--warmup` steps (default 5%) to its
//! peak (3e-3 for the tiny model, 6e-4 for the GPU one), then follows a cosine to a tenth of it
//! (computed on the device inside AdamW's step from its step count: `optim::WarmupCosine`). `--checkpoint` checkpoints every other block
//! (its activations are recomputed inside its backward graph: a smaller graph pool).
//! `--dropout P` drops each block's two residual branches while training (graph-safe RNG, so
//! every replay draws a fresh mask; a checkpointed block recomputes the same one). `--eager`
//! trains the same model without graphs (tests/gpt.rs checks they all agree bit for bit).

mod corpus;
mod model;
mod plot;
mod runner;

use std::path::{Path, PathBuf};
use std::time::Instant;

use graphed::optim::WarmupCosine;
use graphed::{Device, Error, Result};
use model::Config;
use runner::{Rng, Trainer};

/// The learning rate after warm-up; a cosine decays it to a tenth by the last step.
fn peak_lr(cfg: &Config) -> f32 {
    if cfg.d_model >= 512 {
        6e-4
    } else {
        3e-3
    }
}

fn arg(name: &str) -> Option<String> {
    std::env::args().skip_while(|a| a != name).nth(1)
}

fn num(name: &str, default: usize) -> Result<usize> {
    arg(name).map_or(Ok(default), |s| s.parse().map_err(|e| Error::msg(format!("{name} {s}: {e}"))))
}

fn config(dev: &Device) -> Result<Config> {
    let dropout =
        arg("--dropout").map_or(Ok(0.0), |s| s.parse().map_err(|e| Error::msg(format!("--dropout {s}: {e}"))))?;
    let tiny = Config { layers: 3, d_model: 96, heads: 4, context: 96, batch: 8, hidden: 256, dropout };
    let gpu = Config { layers: 8, d_model: 512, heads: 8, context: 256, batch: 16, hidden: 1368, dropout };
    match arg("--size").as_deref() {
        Some("tiny") => Ok(tiny),
        Some("gpu") => Ok(gpu),
        None => Ok(if dev.is_cuda() { gpu } else { tiny }),
        Some(other) => Err(Error::msg(format!("--size {other}: expected tiny or gpu"))),
    }
}

fn main() -> Result<()> {
    let dev = Device::default_device();
    let cfg = config(&dev)?;
    let steps = num("--steps", if dev.is_cuda() { 2000 } else { 500 })?;
    let eval_every = num("--eval-every", (steps / 10).max(1))?.max(1);
    let data = arg("--data").map(PathBuf::from);
    let text = corpus::load(Path::new("."), data.as_deref())?;
    let splits = corpus::Splits::new(text, cfg.context)?;
    let graphed = !std::env::args().any(|a| a == "--eager");
    println!(
        "GPT on {}: {} layers, d_model {}, {} heads, context {}, batch {}, vocab 256 (bytes); {} training / {} validation bytes; {}",
        dev.name(),
        cfg.layers,
        cfg.d_model,
        cfg.heads,
        cfg.context,
        cfg.batch,
        splits.train.len(),
        splits.val.len(),
        if graphed { "one graphed module per block" } else { "eager" }
    );
    let t0 = Instant::now();
    let checkpoint = graphed && std::env::args().any(|a| a == "--checkpoint");
    let warmup = num("--warmup", (steps / 20).max(1))?.min(steps);
    let (peak, total) = (peak_lr(&cfg), u32::try_from(steps).map_err(|e| Error::msg(format!("--steps: {e}")))?);
    let schedule = WarmupCosine { peak, floor: peak / 10.0, warmup: warmup as u32, total };
    let mut trainer = Trainer::new(&dev, cfg, 7, peak, graphed, checkpoint)?.with_schedule(schedule)?;
    if graphed {
        let ck = if checkpoint { ", odd blocks checkpointed" } else { "" };
        let (secs, mb) = (t0.elapsed().as_secs_f64(), trainer.pool_bytes() as f64 / 1e6);
        println!("captured {} blocks in {secs:.1} s{ck}; graph pool {mb:.1} MB", cfg.layers);
    }
    let (mut rng, mut val_rng) = (Rng(0x9E37_79B9_7F4A_7C15), Rng(42));
    let tokens = (cfg.batch * cfg.context) as f64;
    let (mut train_curve, mut val_curve) = (Vec::new(), Vec::new());
    let t0 = Instant::now();
    for step in 1..=steps {
        let (ids, labels) = corpus::batch(&dev, &splits.train, cfg.batch, cfg.context, &mut rng)?;
        let loss = trainer.step(&ids, &labels)?;
        if step == 1 || step % (steps / 100).max(1) == 0 || step == steps {
            train_curve.push((step, loss.to_vec()?[0]));
        }
        if step == 1 || step % (steps / 20).max(1) == 0 || step == steps {
            let l = loss.to_vec()?[0];
            let secs = t0.elapsed().as_secs_f64();
            let eta = secs / step as f64 * (steps - step) as f64;
            println!(
                "step {step:>5}/{steps}  loss {l:.4}  {:>9.0} tokens/s  ETA {eta:>6.1} s",
                tokens * step as f64 / secs
            );
        }
        if step % eval_every == 0 || step == steps {
            let mut total = 0.0;
            for _ in 0..4 {
                let (ids, labels) = corpus::batch(&dev, &splits.val, cfg.batch, cfg.context, &mut val_rng)?;
                total += trainer.eval_loss(&ids, &labels)?;
            }
            println!("step {step:>5}/{steps}  validation loss {:.4}", total / 4.0);
            val_curve.push((step, total / 4.0));
        }
    }
    dev.synchronize()?;
    println!("trained {steps} steps in {:.1} s", t0.elapsed().as_secs_f64());
    let png = arg("--plot").map_or_else(|| std::env::temp_dir().join("graphed-gpt-loss.png"), PathBuf::from);
    plot::write_loss_png(&png, &train_curve, &val_curve)?;
    println!("loss curve (training blue, validation red): {}", png.display());
    let prompt = &splits.val[..cfg.context.min(32)];
    let sample = trainer.generate(prompt, 200, &mut Rng(3))?;
    println!(
        "\nprompt:\n{}\n\n200 generated bytes:\n{}",
        String::from_utf8_lossy(prompt),
        String::from_utf8_lossy(&sample)
    );
    Ok(())
}
