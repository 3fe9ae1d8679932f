//! Forward-only capture for inference: nothing needs a grad, so only the forward graph is
//! captured. Compares graphed and eager latency per call and checks they agree bit for bit.
//!
//! `cargo run --release --example inference`

#[path = "common/model.rs"]
mod model;

use std::time::Instant;

use clap::Parser;
use graphed::{Cx, Device, Result};
use model::{random, GraphedStack, Stack, StackInputs};

/// Forward-only capture of a 4-block MLP: latency of the graphed forward against eager, bit for
/// bit.
#[derive(Parser)]
#[command(
    name = "inference",
    after_help = "It takes no flags. Set GRAPHED_DEVICE=host to run on the CPU when a GPU is present."
)]
struct Args {}

fn main() -> Result<()> {
    Args::parse();
    let dev = Device::default_device();
    let (layers, width, batch, calls) = (16, 512, 16, if dev.is_cuda() { 2000 } else { 20 });
    println!("inference on {}: {layers} x Linear({width}, {width}) + GELU, batch {batch}", dev.name());
    let x = random(&dev, &[batch, width], 1, 1.0)?;
    let eager = Stack::new(&dev, layers, width, 3)?;
    let mut g = GraphedStack::new(
        Stack::new(&dev, layers, width, 3)?,
        StackInputs { x: x.clone() },
        GraphedStack::options().inference(),
    )?;
    println!("graphs captured: {} (forward only)", g.inner().graphs().len());

    let same = g.forward(&x)?.to_vec()? == eager.forward(&mut Cx::new(&dev), &x)?.to_vec()?;
    let time = |f: &mut dyn FnMut() -> Result<()>| -> Result<f64> {
        dev.synchronize()?;
        let t = Instant::now();
        for i in 0..calls {
            f()?;
            if i % (calls / 4).max(1) == 0 {
                eprintln!("  ... {i}/{calls}");
            }
        }
        dev.synchronize()?;
        Ok(t.elapsed().as_secs_f64() * 1e6 / calls as f64)
    };
    let eager_us = time(&mut || eager.forward(&mut Cx::new(&dev), &x).map(|_| ()))?;
    let graphed_us = time(&mut || g.forward(&x).map(|_| ()))?;
    println!("eager   {eager_us:9.1} us/call");
    println!("graphed {graphed_us:9.1} us/call ({:.2}x)", eager_us / graphed_us);
    println!("graphed == eager: {}", if same { "yes, bit for bit" } else { "NO" });
    if !same {
        return Err(graphed::Error::msg("graphed inference differs from eager"));
    }
    Ok(())
}
