//! Separate weight-grad graphs (Transformer Engine's `delay_wgrad_compute`): each layer splits
//! its backward into the input grads (`backward`) and the weight grads (`backward_weights`),
//! and `w(c)` entries in `order` run the weight grads later, where a pipeline would otherwise
//! idle. Every (chunk, microbatch) gets a forward, an input-grad and a weight-grad graph.
//!
//! `cargo run --release --example pipeline_wgrad`

#[path = "common/split_linear.rs"]
mod split_linear;

use clap::Parser;
use graphed::{graphed, Device, OrderEntry, Param, Result, Tensor};
use split_linear::{Split, SplitGradOutputs, SplitInputs};

/// Two microbatches; each chunk's weight grads wait until the other chunk's input grads ran.
#[graphed(warmup = 2, order = [1, 2, 1, -2, 2, -1, w(2), -2, w(1), -1, w(2), w(1)])]
pub struct TwoStage {
    first: Split,
    second: Split,
}

fn linear(dev: &Device, width: usize, seed: f32) -> Result<Split> {
    let w: Vec<f32> = (0..width * width).map(|i| ((i as f32 * 0.37 + seed).sin()) / width as f32).collect();
    Ok(Split {
        w: Param::new(Tensor::from_slice(dev, &w, &[width, width])?)?,
        b: Param::new(Tensor::zeros(dev, &[width])?)?,
    })
}

/// Split backwards: input-grad and weight-grad graphs per (chunk, microbatch), weight grads
/// replayed with `backward_weights_<field>`.
#[derive(Parser)]
#[command(
    name = "pipeline_wgrad",
    after_help = "It takes no flags. Set GRAPHED_DEVICE=host to run on the CPU when a GPU is present."
)]
struct Args {}

fn main() -> Result<()> {
    Args::parse();
    let dev = Device::default_device();
    let (batch, width) = (16, 64);
    let x = Tensor::full(&dev, &[batch, width], 0.5)?.with_requires_grad(true);
    let samples = vec![vec![vec![Some(x.clone())]], vec![vec![Some(x.clone())]]];
    let model = TwoStage { first: linear(&dev, width, 1.0)?, second: linear(&dev, width, 2.0)? };
    let mut g = GraphedTwoStage::new(model, samples, GraphedTwoStage::options().chained(true))?;
    println!("wgrad pipeline on {}: {} graphs", dev.name(), g.inner().graphs().len());
    let dy = Tensor::full(&dev, &[batch, width], 1.0)?;
    // The microbatch chunk 2's next forward and chunk 1's next backward are for (FIFO).
    let (mut forward_2, mut backward_1) = (0, 0);
    for entry in GraphedTwoStage::ORDER {
        match *entry {
            OrderEntry::Forward(1) => drop(g.forward_first(SplitInputs { x: x.clone() })?),
            OrderEntry::Forward(_) => {
                // Chained: passing chunk 1's output buffer back in copies nothing.
                let h = g.inner().outputs(0, forward_2)?.remove(0).expect("h");
                drop(g.forward_second(SplitInputs { x: h })?);
                forward_2 += 1;
            }
            OrderEntry::Backward(2) => drop(g.backward_second(SplitGradOutputs { dy: dy.clone() })?),
            OrderEntry::Backward(_) => {
                let dh = g.inner().grad_inputs(1, backward_1)?.remove(0).expect("dh");
                drop(g.backward_first(SplitGradOutputs { dy: dh })?);
                backward_1 += 1;
            }
            OrderEntry::Wgrad(1) => g.backward_weights_first()?,
            OrderEntry::Wgrad(_) => g.backward_weights_second()?,
        }
        println!("  ran {entry}");
    }
    let norm: f32 = g.module_first().w.grad.to_vec()?.iter().map(|v| v.abs()).sum();
    println!("|grad of chunk 1's weight|_1 = {norm:.6}");
    Ok(())
}
