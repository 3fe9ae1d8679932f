//! A pipeline schedule with `order`: two chunks, three microbatches, interleaved the way a
//! pipeline-parallel stage would run them. Each (chunk, microbatch) has its own graphs and
//! static surfaces; the schedule below is checked at compile time and replayed in order.
//!
//! `cargo run --release --example pipeline`

#[path = "common/model.rs"]
mod model;

use std::collections::VecDeque;

use clap::Parser;
use graphed::{graphed, ops, Device, Result, Tensor};
use model::{random, Block, BlockGradOutputs, BlockInputs};

/// Chunk 1 then chunk 2; forward `+c`, backward `-c`, first in first out per chunk.
#[graphed(warmup = 2, order = [1, 2, 1, 2, -2, -1, 1, 2, -2, -1, -2, -1])]
pub struct TwoStage {
    first: Block,
    second: Block,
}

const ORDER: [i32; 12] = [1, 2, 1, 2, -2, -1, 1, 2, -2, -1, -2, -1];

/// A 2-chunk x 3-microbatch pipeline declared with `#[graphed(order = [...])]`: per-(chunk,
/// microbatch) graphs, FIFO backwards.
#[derive(Parser)]
#[command(
    name = "pipeline",
    after_help = "It takes no flags. Set GRAPHED_DEVICE=host to run on the CPU when a GPU is present."
)]
struct Args {}

fn main() -> Result<()> {
    Args::parse();
    let dev = Device::default_device();
    let (batch, width) = (32, 128);
    println!("pipeline on {}: 2 chunks x 3 microbatches, order {ORDER:?}", dev.name());
    let xs: Vec<Tensor> = (0..3).map(|m| random(&dev, &[batch, width], 10 + m, 1.0)).collect::<Result<_>>()?;
    let hidden = Tensor::zeros(&dev, &[batch, width])?.with_requires_grad(true);
    let samples = vec![xs.iter().map(|x| vec![Some(x.clone())]).collect(), vec![vec![Some(hidden)]]];
    let model = TwoStage { first: Block::new(&dev, width, width, 1)?, second: Block::new(&dev, width, width, 2)? };
    let mut g = model.make_graphed(samples)?;
    println!(
        "captured {} graphs in {:.1} ms, pool {:.2} MB",
        g.inner().graphs().len(),
        g.inner().capture_time().as_secs_f64() * 1e3,
        g.inner().pool().stats().reserved as f64 / 1e6
    );
    for (label, graph) in g.inner().graphs() {
        println!("  {label}: {} nodes", graph.nodes()?.len());
    }
    for iteration in 0..3 {
        let (mut acts, mut grads, mut losses) = (VecDeque::new(), VecDeque::new(), Vec::new());
        let (mut next_x, mut next_loss) = (0, VecDeque::new());
        for &step in &ORDER {
            match step {
                1 => {
                    let y = g.forward_first(BlockInputs { x: xs[next_x].clone() })?.output_0;
                    acts.push_back(y);
                    next_x += 1;
                }
                2 => {
                    let z = g.forward_second(BlockInputs { x: acts.pop_front().expect("act") })?.output_0;
                    losses.push(ops::mean(&z)?.to_vec()?[0]);
                    // d(mean)/dz, a constant grad for this demo.
                    next_loss.push_back(Tensor::full(&dev, z.dims(), 1.0 / z.numel() as f32)?);
                }
                -2 => {
                    let dz = next_loss.pop_front().expect("forward ran");
                    grads.push_back(g.backward_second(BlockGradOutputs { dy: dz })?.x.expect("grad"));
                }
                _ => {
                    g.backward_first(BlockGradOutputs { dy: grads.pop_front().expect("grad") })?;
                }
            }
        }
        println!("iteration {iteration}: microbatch means {losses:?}");
    }
    let w = &g.module_first().w.grad;
    println!(
        "grad of chunk 1's weight accumulated over 3 iterations x 3 microbatches: |g|_1 = {:.6}",
        w.to_vec()?.iter().map(|v| v.abs()).sum::<f32>()
    );
    Ok(())
}
