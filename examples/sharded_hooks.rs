//! Capture-time hooks that simulate a sharded parameter, registered at run time on a module the
//! caller does not own (what a sharding wrapper does).
//!
//! The weight lives as two row shards. Before forward (`pre_forward`, outside capture) a hook
//! gathers the shards into a full buffer the graphs read; after backward (`backward`) a hook
//! scatters the full grad back into the shard grads and releases the full weight (poisons it
//! with NaN, so a use of a released weight would show). Hooks run in warm-up and once at
//! capture, never on replay: on replay steps the wrapper runs the same gather/release itself,
//! outside the graphs, exactly as it would between eager steps.
//!
//! `cargo run --release --example sharded_hooks`

#[path = "common/model.rs"]
mod model;

use std::sync::{Arc, Mutex};

use clap::Parser;
use graphed::{ops, Device, GraphOptions, HookKind, HookRegistry, Param, Result, Tensor};
use model::{random, Block, BlockInputs, GraphedBlock};

/// Two row shards of a [rows, cols] weight and the full buffers the module computes with.
#[derive(Clone)]
struct Shards {
    parts: [Param; 2],
    full: Param,
    rows: usize,
    cols: usize,
}

impl Shards {
    fn gather(&self) -> Result<()> {
        let half = self.rows / 2 * self.cols;
        let full = self.full.value.reshape(&[self.rows * self.cols])?;
        // Row shards are contiguous halves of the full row-major buffer.
        let mut v = self.parts[0].value.to_vec()?;
        v.extend(self.parts[1].value.to_vec()?);
        debug_assert_eq!(v.len(), 2 * half);
        full.copy_from_slice(&v)
    }

    fn scatter_and_release(&self) -> Result<()> {
        let g = self.full.grad.to_vec()?;
        let half = g.len() / 2;
        for (i, p) in self.parts.iter().enumerate() {
            let acc = p.grad.to_vec()?;
            let sum: Vec<f32> = acc.iter().zip(&g[i * half..(i + 1) * half]).map(|(a, b)| a + b).collect();
            p.grad.copy_from_slice(&sum)?;
        }
        ops::fill_(&self.full.grad, 0.0)?;
        ops::fill_(&self.full.value, f32::NAN)
    }
}

/// Capture-time hooks registered at run time that gather a sharded weight before forward and
/// release it after backward.
#[derive(Parser)]
#[command(
    name = "sharded_hooks",
    after_help = "It takes no flags. Set GRAPHED_DEVICE=host to run on the CPU when a GPU is present."
)]
struct Args {}

fn main() -> Result<()> {
    Args::parse();
    let dev = Device::default_device();
    let (rows, cols, batch) = (64, 64, 16);
    println!("sharded hooks on {}", dev.name());
    let block = Block::new(&dev, cols, rows, 1)?;
    let full = block.w.clone();
    let parts = [
        Param::new(Tensor::from_slice(&dev, &full.value.to_vec()?[..rows / 2 * cols], &[rows / 2, cols])?)?,
        Param::new(Tensor::from_slice(&dev, &full.value.to_vec()?[rows / 2 * cols..], &[rows / 2, cols])?)?,
    ];
    let shards = Shards { parts, full, rows, cols };
    ops::fill_(&shards.full.value, f32::NAN)?; // released until the first gather

    let log = Arc::new(Mutex::new(Vec::<String>::new()));
    let hooks = HookRegistry::new();
    let (s1, l1) = (shards.clone(), log.clone());
    let _gather = hooks.register(0, HookKind::PreForward, false, move || {
        l1.lock().unwrap().push(format!("gather (capturing: {})", graphed::is_capturing()));
        s1.gather()
    });
    let (s2, l2) = (shards.clone(), log.clone());
    let _release = hooks.register(0, HookKind::Backward, false, move || {
        l2.lock().unwrap().push(format!("scatter + release (capturing: {})", graphed::is_capturing()));
        s2.scatter_and_release()
    });

    let x = random(&dev, &[batch, cols], 2, 1.0)?;
    let opts: GraphOptions = GraphedBlock::options().warmup(2).hooks(&hooks);
    let mut g = GraphedBlock::new(block, BlockInputs { x: x.clone() }, opts)?;
    println!("hooks during warm-up (2) and capture (1):");
    for line in log.lock().unwrap().iter() {
        println!("  {line}");
    }
    let shard_grad_after_capture = shards.parts[0].grad.to_vec()?;

    for step in 0..3 {
        shards.gather()?; // the wrapper's own gather on replay steps
        let y = g.forward(&x)?;
        let finite = y.to_vec()?.iter().all(|v| v.is_finite());
        g.backward(&Tensor::full(&dev, &[batch, rows], 1.0)?)?;
        shards.scatter_and_release()?;
        println!("replay step {step}: output finite: {finite}");
        if !finite {
            return Err(graphed::Error::msg("the replay read a released weight"));
        }
    }
    println!("hook log unchanged by replays: {} entries", log.lock().unwrap().len());
    let moved = shards.parts[0].grad.to_vec()? != shard_grad_after_capture;
    println!("shard grads accumulated on replay steps: {moved}");
    Ok(())
}
