//! Pipeline memory: how the graph pool grows with the microbatches of a schedule.
//!
//! Two chunks of 4 blocks (width 512, batch 64), 16 microbatches, captured with a 1F1B-style
//! `order` that keeps `window` microbatches in flight per chunk (2, 4, 16). Prints, with the
//! static surfaces reused across microbatches (`GraphOptions::reuse_buffers`, the default) and
//! without, the pool's reserved bytes, the bytes that must be live, and how many sets of
//! static surfaces each chunk has.
//!
//! `cargo run --release --example pipeline_memory [-- --microbatches 16 --width 512]` (`--help`)

#[path = "common/model.rs"]
mod model;

use clap::builder::TypedValueParser;
use clap::Parser;
use graphed::{make_graphed, Device, GraphOptions, Module, OrderEntry, Result, Tensor};
use model::{random, Stack};

/// How the graph pool grows with the microbatches in flight of a 2-chunk pipeline schedule,
/// with and without reuse of static surfaces.
#[derive(Parser)]
#[command(name = "pipeline_memory")]
struct Args {
    /// Microbatches of the schedule (windows of 2, 4 and all of them in flight are measured).
    #[arg(long, value_name = "N", default_value_t = 16, value_parser = clap::value_parser!(u64).range(4..).map(|n| n as usize))]
    microbatches: usize,
    /// Width of each block's Linear(width, width).
    #[arg(long, value_name = "N", default_value_t = 512, value_parser = clap::value_parser!(u64).range(1..).map(|n| n as usize))]
    width: usize,
}

fn main() -> Result<()> {
    let args = Args::parse();
    let dev = Device::default_device();
    let (microbatches, width, batch) = (args.microbatches, args.width, 64);
    println!("device {}; 2 chunks x 4 blocks, width {width}, batch {batch}, {microbatches} microbatches", dev.name());
    println!(
        "{:>8} {:>6} {:>12} {:>10} {:>10} {:>13}",
        "window", "reuse", "reserved MB", "live MB", "in flight", "surface sets"
    );
    for window in [2, 4, microbatches] {
        for reuse in [false, true] {
            let chunks: Vec<Box<dyn Module>> =
                vec![Box::new(Stack::new(&dev, 4, width, 1)?), Box::new(Stack::new(&dev, 4, width, 2)?)];
            let x = random(&dev, &[batch, width], 3, 1.0)?.with_requires_grad(true);
            let h = Tensor::zeros(&dev, &[batch, width])?.with_requires_grad(true);
            let samples = vec![vec![vec![Some(x)]], vec![vec![Some(h)]]];
            let opts =
                GraphOptions::new().warmup(1).order(OrderEntry::windowed(2, microbatches, window)).reuse_buffers(reuse);
            let g = make_graphed(chunks, samples, opts)?;
            let stats = g.pool().stats();
            println!(
                "{window:>8} {:>6} {:>12.2} {:>10.2} {:>10} {:>13}",
                if reuse { "on" } else { "off" },
                stats.reserved as f64 / 1e6,
                g.live_bytes() as f64 / 1e6,
                window.min(microbatches),
                g.surface_sets(0),
            );
        }
    }
    Ok(())
}
