//! FSDP-style sharding through capture-time hooks, the use they were made for (Megatron-FSDP
//! with Transformer Engine's graphs): each rank holds half of every weight; a `pre_forward`
//! hook materialises the full buffers and a `backward` hook releases them, outside the capture;
//! the all-gather into the full buffers and the reduce-scatter of the grads are captured into
//! each layer's graphs, so every replay runs them.
//!
//! Trains the same L-layer MLP for 10 AdamW steps with data parallelism and with FSDP, checks
//! that the parameters are bitwise equal, and prints the memory each rank holds.
//!
//! `cargo run --release --example fsdp_hooks`: on 2 GPUs (one process each, NCCL) when there
//! are, else on 2 emulated ranks on the host backend.

#[path = "common/fsdp_model.rs"]
mod fsdp_model;
#[path = "common/model.rs"]
mod model;

use std::time::Duration;

use clap::Parser;
use fsdp_model::FsdpBlock;
use graphed::dist::{self, Communicator, Config, DataParallel, LaunchOptions, ReduceOp};
use graphed::optim::{AdamW, AdamWConfig};
use graphed::{make_graphed, ops, Error, GraphOptions, GraphedModules, Module, Param, Result, Tensor};
use model::{random, Block};

const LAYERS: usize = 4;
const STEPS: usize = 10;

struct Sizes {
    width: usize,
    batch: usize,
}

fn opt(params: &[Param]) -> Result<AdamW> {
    AdamW::new(params, AdamWConfig { lr: 1e-3, weight_decay: 0.01, ..Default::default() })
}

/// Captures `blocks` as one graph per layer (chained) and trains them for `STEPS` steps on
/// this rank's data.
fn train(comm: &Communicator, blocks: Vec<Box<dyn Module>>, opt: &AdamW, s: &Sizes) -> Result<GraphedModules> {
    let dev = comm.device().clone();
    let x0 = Tensor::zeros(&dev, &[s.batch, s.width])?;
    let hidden = Tensor::zeros(&dev, &[s.batch, s.width])?.with_requires_grad(true);
    let mut samples = vec![vec![vec![Some(x0)]]];
    samples.extend((1..LAYERS).map(|_| vec![vec![Some(hidden.clone())]]));
    let mut g = make_graphed(blocks, samples, GraphOptions::new().warmup(2).chained(true))?;
    for step in 0..STEPS {
        let seed = 1000 + (step * comm.world_size() + comm.rank()) as u64;
        let (x, target) =
            (random(&dev, &[s.batch, s.width], seed, 1.0)?, random(&dev, &[s.batch, s.width], seed + 7, 1.0)?);
        let mut h = x;
        for i in 0..LAYERS {
            h = g.forward(i, &[Some(h)])?.remove(0).expect("layer output");
        }
        let mut grad = Some(ops::mse_backward(&h, &target, 1.0)?);
        for i in (0..LAYERS).rev() {
            grad = g.backward(i, &[grad])?.remove(0);
        }
        opt.step()?;
        opt.zero_grad()?;
    }
    Ok(g)
}

fn rank_main(comm: Communicator, s: &Sizes) -> Result<()> {
    let dev = comm.device().clone();
    let (rank, mb) = (comm.rank(), |b: usize| b as f64 / 1e6);

    // FSDP first, on a device that holds nothing else yet.
    let before = dev.reserved_bytes();
    let blocks: Vec<FsdpBlock> =
        (0..LAYERS).map(|i| FsdpBlock::new(&comm, s.width, s.width, i as u64)).collect::<Result<_>>()?;
    let shards: Vec<_> = blocks.iter().map(|b| b.shards.clone()).collect();
    let fsdp_opt = opt(&shards.iter().flat_map(|sp| sp.shards()).collect::<Vec<_>>())?;
    let modules = blocks.into_iter().map(|b| Box::new(b) as Box<dyn Module>).collect();
    let g = train(&comm, modules, &fsdp_opt, s)?;
    let fsdp_reserved = dev.reserved_bytes() - before;
    let fsdp_pool = g.pool().stats().reserved;
    let shard_bytes: usize = shards.iter().map(|sp| sp.shard_bytes()).sum();
    let full_bytes: usize = shards.iter().map(|sp| sp.full_bytes()).sum();
    let mut fsdp_params = Vec::new();
    for sp in &shards {
        for p in sp.shards() {
            let full = Tensor::zeros(&dev, &[p.value.numel() * comm.world_size()])?;
            comm.all_gather(&p.value, &full)?;
            fsdp_params.push(full.to_vec()?);
        }
    }
    drop(g);

    // Data parallel: full weights, grads and optimizer state on every rank.
    let before = dev.reserved_bytes();
    let blocks: Vec<Block> =
        (0..LAYERS).map(|i| Block::new(&dev, s.width, s.width, i as u64)).collect::<Result<_>>()?;
    let params: Vec<Param> = blocks.iter().flat_map(Block::params).collect();
    let dp_opt = opt(&params)?;
    let mut modules: Vec<Box<dyn Module>> = Vec::new();
    for b in blocks {
        let named = b.params().into_iter().enumerate().map(|(i, p)| (format!("p{i}"), p)).collect();
        modules.push(Box::new(DataParallel::with_params(b, named, comm.clone(), ReduceOp::Sum, 1 << 20)?));
    }
    let g = train(&comm, modules, &dp_opt, s)?;
    let dp_reserved = dev.reserved_bytes().saturating_sub(before);
    let dp_pool = g.pool().stats().reserved;
    let dp_params: Vec<Vec<f32>> = params.iter().map(|p| p.value.to_vec()).collect::<Result<_>>()?;

    let equal = fsdp_params.len() == dp_params.len()
        && fsdp_params.iter().flatten().zip(dp_params.iter().flatten()).all(|(a, b)| a.to_bits() == b.to_bits());
    // Values + grads + AdamW's two moments: four copies of what the rank holds.
    let (name, w, b) = (dev.name(), s.width, s.batch);
    println!("rank {rank} on {name}: {LAYERS} layers of Linear({w}, {w}) + GELU, batch {b}");
    println!("  fsdp == data parallel after {STEPS} AdamW steps: {}", if equal { "yes, bitwise" } else { "NO" });
    println!(
        "  persistent (weights, grads, AdamW state): fsdp {:.3} MB, data parallel {:.3} MB",
        mb(2 * shard_bytes),
        mb(2 * full_bytes)
    );
    println!("  graph pool: fsdp {:.3} MB, data parallel {:.3} MB", mb(fsdp_pool), mb(dp_pool));
    println!("  device reserved by the run: fsdp {:.3} MB, data parallel {:.3} MB", mb(fsdp_reserved), mb(dp_reserved));
    if !equal {
        return Err(Error::msg(format!("rank {rank}: FSDP and data parallel parameters differ")));
    }
    comm.barrier()
}

/// FSDP-style sharding on 2 ranks (GPUs, or emulated host ranks): all-gather and reduce-scatter
/// captured in each layer's graphs, bitwise equal to data parallel.
#[derive(Parser)]
#[command(
    name = "fsdp_hooks",
    after_help = "It takes no flags. With fewer than 2 GPUs it runs 2 emulated ranks on the host backend."
)]
struct Args {}

fn main() -> Result<()> {
    Args::parse();
    if dist::gpu_count() >= 2 || dist::RankEnv::from_env()?.is_some() {
        let options =
            LaunchOptions { args: Some(Vec::new()), deadline: Duration::from_secs(600), ..Default::default() };
        return dist::launch(2, &options, |env| {
            let comm = env.communicator(&Config::default().timeout(Duration::from_secs(120)))?;
            rank_main(comm, &Sizes { width: 1024, batch: 64 })
        });
    }
    println!("fewer than 2 GPUs: 2 emulated ranks on the host backend");
    dist::run_emulated(2, |comm| rank_main(comm, &Sizes { width: 256, batch: 8 }))?;
    Ok(())
}
