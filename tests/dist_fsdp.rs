//! FSDP-style sharding on emulated ranks: shards gathered and grads reduce-scattered inside the
//! captured graphs, full buffers materialised and released by capture-time hooks; after 10
//! AdamW steps the parameters are bitwise those of data parallelism.

mod common;

use common::model;
use common::model::Stack;
use graphed::dist::{self, Communicator, DataParallel, ReduceOp};
use graphed::optim::{AdamW, AdamWConfig};
use graphed::{make_graphed, ops, Cx, Device, GraphOptions, Module, Param, Result, Tensor};

#[path = "../examples/common/fsdp_model.rs"]
mod fsdp_model;
use fsdp_model::FsdpBlock;

const WIDTH: usize = 8;
const BATCH: usize = 3;
const STEPS: usize = 10;

fn data(dev: &Device, step: usize, rank: usize) -> Result<(Tensor, Tensor)> {
    let seed = 500 + (step * 2 + rank) as u64 * 13;
    Ok((common::random(dev, &[BATCH, WIDTH], seed)?, common::random(dev, &[BATCH, WIDTH], seed + 1)?))
}

fn opt(params: &[Param]) -> Result<AdamW> {
    AdamW::new(params, AdamWConfig { lr: 1e-2, weight_decay: 0.05, ..Default::default() })
}

/// Data parallel: full parameters on every rank, grads all-reduced.
fn dp_rank(comm: Communicator) -> Result<Vec<Vec<f32>>> {
    let dev = comm.device().clone();
    let stack = Stack::new(&dev, 2, WIDTH, 3)?;
    let params = stack.params();
    let opt = opt(&params)?;
    let named = params.iter().enumerate().map(|(i, p)| (format!("p{i}"), p.clone())).collect();
    let dp = DataParallel::with_params(stack, named, comm.clone(), ReduceOp::Sum, 1 << 20)?;
    let sample = vec![vec![vec![Some(Tensor::zeros(&dev, &[BATCH, WIDTH])?)]]];
    let mut g = make_graphed(vec![Box::new(dp) as Box<dyn Module>], sample, GraphOptions::new().warmup(2))?;
    for step in 0..STEPS {
        let (x, target) = data(&dev, step, comm.rank())?;
        let mut cx = Cx::new(&dev);
        let y = g.forward(0, &mut cx, &[Some(x)])?.remove(0).expect("output");
        g.backward(0, &mut cx, &[Some(ops::mse_backward(&y, &target, 1.0)?)])?;
        opt.step()?;
        opt.zero_grad()?;
    }
    params.iter().map(|p| p.value.to_vec()).collect()
}

/// FSDP: two graphed chunks, each holding its shards; returns the full parameters (gathered
/// from the shards after training) and (shard bytes, full bytes).
fn fsdp_rank(comm: Communicator) -> Result<(Vec<Vec<f32>>, usize, usize)> {
    let dev = comm.device().clone();
    let blocks = [FsdpBlock::new(&comm, WIDTH, WIDTH, 3)?, FsdpBlock::new(&comm, WIDTH, WIDTH, 4)?];
    let shards: Vec<_> = blocks.iter().map(|b| b.shards.clone()).collect();
    let opt = opt(&shards.iter().flat_map(|s| s.shards()).collect::<Vec<_>>())?;
    let x0 = Tensor::zeros(&dev, &[BATCH, WIDTH])?;
    let h0 = Tensor::zeros(&dev, &[BATCH, WIDTH])?.with_requires_grad(true);
    let samples = vec![vec![vec![Some(x0)]], vec![vec![Some(h0)]]];
    let modules: Vec<Box<dyn Module>> = blocks.into_iter().map(|b| Box::new(b) as Box<dyn Module>).collect();
    let mut g = make_graphed(modules, samples, GraphOptions::new().warmup(2))?;
    for s in &shards {
        assert!(s.full(0).is_err(), "the full weights are released after capture");
    }
    for step in 0..STEPS {
        let (x, target) = data(&dev, step, comm.rank())?;
        let mut cx = Cx::new(&dev);
        let h = g.forward(0, &mut cx, &[Some(x)])?.remove(0).expect("output");
        let y = g.forward(1, &mut cx, &[Some(h)])?.remove(0).expect("output");
        let dh = g.backward(1, &mut cx, &[Some(ops::mse_backward(&y, &target, 1.0)?)])?.remove(0);
        g.backward(0, &mut cx, &[dh])?;
        opt.step()?;
        opt.zero_grad()?;
    }
    // Gather the trained shards to compare with data parallel.
    let mut full = Vec::new();
    for s in &shards {
        for p in s.shards() {
            let out = Tensor::zeros(&dev, &[p.value.numel() * comm.world_size()])?;
            comm.all_gather(&p.value, &out)?;
            full.push(out.to_vec()?);
        }
    }
    let (shard_bytes, full_bytes) = shards.iter().fold((0, 0), |(a, b), s| (a + s.shard_bytes(), b + s.full_bytes()));
    Ok((full, shard_bytes, full_bytes))
}

#[test]
fn fsdp_equals_data_parallel_bitwise() -> Result<()> {
    let dp = dist::run_emulated(2, dp_rank)?;
    let fsdp = dist::run_emulated(2, fsdp_rank)?;
    for (rank, (params, shard_bytes, full_bytes)) in fsdp.iter().enumerate() {
        assert_eq!(params.len(), dp[rank].len());
        for (i, (a, b)) in params.iter().zip(&dp[rank]).enumerate() {
            assert!(a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits()), "rank {rank}, parameter {i} differs");
        }
        assert_eq!(shard_bytes * 2, *full_bytes, "each of 2 ranks holds half");
    }
    let initial = model::Block::new(&Device::host(), WIDTH, WIDTH, 3)?.params()[0].value.to_vec()?;
    assert_ne!(initial, dp[0][0], "the parameters must move");
    Ok(())
}

#[test]
fn an_unmaterialised_weight_is_a_typed_error() -> Result<()> {
    dist::run_emulated(2, |comm| {
        let b = FsdpBlock::new(&comm, WIDTH, WIDTH, 1)?;
        assert!(matches!(b.shards.full(0), Err(graphed::Error::InvalidArgument { .. })));
        assert!(matches!(b.shards.gather(), Err(graphed::Error::InvalidArgument { .. })));
        // Nothing reached the peers: a collective still lines up.
        comm.barrier()
    })?;
    Ok(())
}
