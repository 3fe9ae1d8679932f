//! Pipeline memory: how the graph pool grows with the microbatches of a schedule.
//!
//! Two chunks of 4 blocks (width 512, batch 64), 16 microbatches, captured with a 1F1B-style
//! `order` that keeps `window` microbatches in flight per chunk (2, 4, 16). Prints, with the
//! static surfaces reused across microbatches (`GraphOptions::reuse_buffers`, the default) and
//! without, the pool's reserved bytes, the bytes that must be live, and how many sets of
//! static surfaces each chunk has.
//!
//! `cargo run --release --example pipeline_memory [-- --microbatches 16 --width 512]`

#[path = "common/model.rs"]
mod model;

use graphed::{make_graphed, Device, GraphOptions, Module, OrderEntry, Result, Tensor};
use model::{random, Stack};

fn arg(name: &str, default: usize) -> usize {
    let args: Vec<String> = std::env::args().collect();
    args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn main() -> Result<()> {
    let dev = Device::default_device();
    let (microbatches, width, batch) = (arg("--microbatches", 16), arg("--width", 512), 64);
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
