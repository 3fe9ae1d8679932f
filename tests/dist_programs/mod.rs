//! The rank programs the multi-rank tests run, on emulated ranks (host) and on GPUs (NCCL,
//! one process per GPU), with their single-device references.
#![allow(dead_code)]

use std::collections::VecDeque;

use graphed::dist::{stage_order, Communicator, DataParallel, PipelineStage, ReduceOp, StageRole};
use graphed::optim::{AdamW, AdamWConfig};
use graphed::{make_graphed, ops, Cx, Device, GraphOptions, Module, Param, Result, Tensor};

use crate::common::model;
use crate::common::model::{Block, Stack};
use crate::common::random;

#[path = "../../examples/common/fsdp_model.rs"]
pub mod fsdp_model;
use fsdp_model::FsdpBlock;

pub const WIDTH: usize = 16;
pub const BATCH: usize = 4;
pub const STEPS: usize = 10;
/// GPipe with two microbatches: every forward, then every backward, chunks 1-indexed.
pub const ORDER: [i32; 8] = [1, 1, 2, 2, -2, -2, -1, -1];

pub fn named(params: &[Param]) -> Vec<(String, Param)> {
    params.iter().enumerate().map(|(i, p)| (format!("p{i}"), p.clone())).collect()
}

/// Input and target of microbatch `m` of `step`.
pub fn microbatch(dev: &Device, step: usize, m: usize) -> Result<(Tensor, Tensor)> {
    let seed = (step * 2 + m) as u64 * 7919 + 11;
    Ok((random(dev, &[BATCH, WIDTH], seed)?, random(dev, &[BATCH, WIDTH], seed + 1)?))
}

pub fn adamw(params: &[Param]) -> Result<AdamW> {
    AdamW::new(params, AdamWConfig { lr: 1e-2, weight_decay: 0.01, ..Default::default() })
}

fn values(params: &[Param]) -> Result<Vec<Vec<f32>>> {
    params.iter().map(|p| p.value.to_vec()).collect()
}

/// One device, eager, accumulating both microbatches of every step.
pub fn dp_reference(dev: &Device) -> Result<Vec<Vec<f32>>> {
    let mut stack = Stack::new(dev, 2, WIDTH, 42)?;
    let opt = adamw(&stack.params())?;
    for step in 0..STEPS {
        for m in 0..2 {
            let (x, target) = microbatch(dev, step, m)?;
            let mut cx = Cx::new(dev);
            let y = stack.forward(&mut cx, &x)?;
            stack.backward(&mut cx, &ops::mse_backward(&y, &target, 1.0)?)?;
        }
        opt.step()?;
        opt.zero_grad()?;
    }
    values(&stack.params())
}

/// Rank `r` runs microbatch `r` of every step through a graphed DataParallel stack.
pub fn dp_rank(comm: Communicator) -> Result<Vec<Vec<f32>>> {
    let dev = comm.device().clone();
    let rank = comm.rank();
    let stack = Stack::new(&dev, 2, WIDTH, 42)?;
    let params = stack.params();
    let opt = adamw(&params)?;
    // Small buckets: several collectives per backward.
    // make_graphed compares the ranks' schedules itself (DataParallel reports its group).
    let opts = GraphOptions::new().warmup(2);
    let dp = DataParallel::with_params(stack, named(&params), comm, ReduceOp::Sum, WIDTH * WIDTH * 4)?;
    assert!(dp.num_buckets() >= 2);
    let sample = Tensor::zeros(&dev, &[BATCH, WIDTH])?;
    let mut g = make_graphed(vec![Box::new(dp) as Box<dyn Module>], vec![vec![vec![Some(sample)]]], opts)?;
    for step in 0..STEPS {
        let (x, target) = microbatch(&dev, step, rank)?;
        let y = g.forward(0, &[Some(x)])?.remove(0).expect("an output");
        g.backward(0, &[Some(ops::mse_backward(&y, &target, 1.0)?)])?;
        opt.step()?;
        opt.zero_grad()?;
    }
    values(&params)
}

/// Like [`dp_rank`] with one graphed chunk per block sharing buckets of `bucket_bytes`
/// ([`DataParallel::chunks`], or [`DataParallel::chunks_overlapped`]), chained.
pub fn dp_chunks_rank(comm: Communicator, bucket_bytes: usize, overlap: bool) -> Result<Vec<Vec<f32>>> {
    let dev = comm.device().clone();
    let rank = comm.rank();
    let stack = Stack::new(&dev, 2, WIDTH, 42)?;
    let params = stack.params();
    let opt = adamw(&params)?;
    let chunks = stack.blocks.into_iter().map(|b| {
        let named = named(&b.params());
        (b, named)
    });
    let layers = if overlap {
        DataParallel::chunks_overlapped(chunks.collect(), comm, ReduceOp::Sum, bucket_bytes)?
    } else {
        DataParallel::chunks(chunks.collect(), comm, ReduceOp::Sum, bucket_bytes)?
    };
    let modules: Vec<Box<dyn Module>> = layers.into_iter().map(|l| Box::new(l) as Box<dyn Module>).collect();
    let hidden = Tensor::zeros(&dev, &[BATCH, WIDTH])?.with_requires_grad(true);
    let samples = vec![vec![vec![Some(Tensor::zeros(&dev, &[BATCH, WIDTH])?)]], vec![vec![Some(hidden)]]];
    let mut g = make_graphed(modules, samples, GraphOptions::new().warmup(2).chained(true))?;
    for step in 0..STEPS {
        let (x, target) = microbatch(&dev, step, rank)?;
        let h = g.forward(0, &[Some(x)])?.remove(0).expect("an output");
        let y = g.forward(1, &[Some(h)])?.remove(0).expect("an output");
        let dh = g.backward(1, &[Some(ops::mse_backward(&y, &target, 1.0)?)])?.remove(0);
        g.backward(0, &[dh])?;
        opt.step()?;
        opt.zero_grad()?;
    }
    values(&params)
}

/// Both chunks on one device, eagerly, accumulating in the order's order.
pub fn pipeline_reference(dev: &Device) -> Result<Vec<Vec<f32>>> {
    let mut blocks = [Block::new(dev, WIDTH, WIDTH, 5)?, Block::new(dev, WIDTH, WIDTH, 6)?];
    let params: Vec<Param> = blocks.iter().flat_map(Block::params).collect();
    let opt = adamw(&params)?;
    for step in 0..STEPS {
        let (mut cxs, mut dys) = (Vec::new(), Vec::new());
        for m in 0..2 {
            let (x, target) = microbatch(dev, step, m)?;
            let mut cx = [Cx::new(dev), Cx::new(dev)];
            cx[0].set_needs_input_grad(vec![false]);
            cx[1].set_needs_input_grad(vec![true]);
            let h = blocks[0].forward(&mut cx[0], &x)?;
            let y = blocks[1].forward(&mut cx[1], &h)?;
            dys.push(ops::mse_backward(&y, &target, 1.0)?);
            cxs.push(cx);
        }
        let mut dhs = Vec::new();
        for (cx, dy) in cxs.iter_mut().zip(&dys) {
            dhs.push(blocks[1].backward(&mut cx[1], dy)?.expect("a grad for the activation"));
        }
        for (cx, dh) in cxs.iter_mut().zip(&dhs) {
            blocks[0].backward(&mut cx[0], dh)?;
        }
        opt.step()?;
        opt.zero_grad()?;
    }
    values(&params)
}

/// Rank `r` runs chunk `r + 1` of [`ORDER`], graphed; returns its chunk's parameters.
pub fn pipeline_rank(comm: Communicator) -> Result<Vec<Vec<f32>>> {
    let dev = comm.device().clone();
    let rank = comm.rank();
    let block = Block::new(&dev, WIDTH, WIDTH, 5 + rank as u64)?;
    let params = block.params();
    let opt = adamw(&params)?;
    let stage = PipelineStage::new(block, comm, &ORDER, &[BATCH, WIDTH])?;
    let role = stage.role();
    let mine = stage_order(&ORDER, 2, rank)?;
    // A later stage's input is received, and its grad sent back: it needs a grad.
    let sample = Tensor::zeros(&dev, &[BATCH, WIDTH])?.with_requires_grad(role != StageRole::First);
    let options = GraphOptions::new().warmup(2).order(mine.clone());
    let mut g = make_graphed(vec![Box::new(stage) as Box<dyn Module>], vec![vec![vec![Some(sample)]]], options)?;
    for step in 0..STEPS {
        let mut grads = VecDeque::new();
        let mut next = 0;
        for &e in &mine {
            if e > 0 {
                let (x, target) = microbatch(&dev, step, next)?;
                if role == StageRole::First {
                    g.forward(0, &[Some(x)])?;
                } else {
                    // The static input itself: nothing is copied in, the graph receives into it.
                    let buffer = g.static_input(0, next, 0);
                    let y = g.forward(0, &[buffer])?.remove(0).expect("the last stage's output");
                    grads.push_back(ops::mse_backward(&y, &target, 1.0)?);
                }
                next += 1;
            } else if role == StageRole::First {
                g.backward(0, &[None])?;
            } else {
                g.backward(0, &[grads.pop_front()])?;
            }
        }
        opt.step()?;
        opt.zero_grad()?;
    }
    values(&params)
}

pub const FSDP_WIDTH: usize = 8;
pub const FSDP_BATCH: usize = 3;

fn fsdp_data(dev: &Device, step: usize, rank: usize) -> Result<(Tensor, Tensor)> {
    let seed = 500 + (step * 2 + rank) as u64 * 13;
    Ok((random(dev, &[FSDP_BATCH, FSDP_WIDTH], seed)?, random(dev, &[FSDP_BATCH, FSDP_WIDTH], seed + 1)?))
}

fn fsdp_opt(params: &[Param]) -> Result<AdamW> {
    AdamW::new(params, AdamWConfig { lr: 1e-2, weight_decay: 0.05, ..Default::default() })
}

/// Data parallel: full parameters on every rank, grads all-reduced.
pub fn fsdp_dp_rank(comm: Communicator) -> Result<Vec<Vec<f32>>> {
    let dev = comm.device().clone();
    let stack = Stack::new(&dev, 2, FSDP_WIDTH, 3)?;
    let params = stack.params();
    let opt = fsdp_opt(&params)?;
    let named = params.iter().enumerate().map(|(i, p)| (format!("p{i}"), p.clone())).collect();
    let dp = DataParallel::with_params(stack, named, comm.clone(), ReduceOp::Sum, 1 << 20)?;
    let sample = vec![vec![vec![Some(Tensor::zeros(&dev, &[FSDP_BATCH, FSDP_WIDTH])?)]]];
    let mut g = make_graphed(vec![Box::new(dp) as Box<dyn Module>], sample, GraphOptions::new().warmup(2))?;
    for step in 0..STEPS {
        let (x, target) = fsdp_data(&dev, step, comm.rank())?;
        let y = g.forward(0, &[Some(x)])?.remove(0).expect("output");
        g.backward(0, &[Some(ops::mse_backward(&y, &target, 1.0)?)])?;
        opt.step()?;
        opt.zero_grad()?;
    }
    params.iter().map(|p| p.value.to_vec()).collect()
}

/// FSDP: two graphed chunks, each holding its shards; returns the full parameters (gathered
/// from the shards after training) and (shard bytes, full bytes).
pub fn fsdp_rank(comm: Communicator) -> Result<(Vec<Vec<f32>>, usize, usize)> {
    let dev = comm.device().clone();
    let blocks = [FsdpBlock::new(&comm, FSDP_WIDTH, FSDP_WIDTH, 3)?, FsdpBlock::new(&comm, FSDP_WIDTH, FSDP_WIDTH, 4)?];
    let shards: Vec<_> = blocks.iter().map(|b| b.shards.clone()).collect();
    let opt = fsdp_opt(&shards.iter().flat_map(|s| s.shards()).collect::<Vec<_>>())?;
    let x0 = Tensor::zeros(&dev, &[FSDP_BATCH, FSDP_WIDTH])?;
    let h0 = Tensor::zeros(&dev, &[FSDP_BATCH, FSDP_WIDTH])?.with_requires_grad(true);
    let samples = vec![vec![vec![Some(x0)]], vec![vec![Some(h0)]]];
    let modules: Vec<Box<dyn Module>> = blocks.into_iter().map(|b| Box::new(b) as Box<dyn Module>).collect();
    let mut g = make_graphed(modules, samples, GraphOptions::new().warmup(2))?;
    for s in &shards {
        assert!(s.full(0).is_err(), "the full weights are released after capture");
    }
    for step in 0..STEPS {
        let (x, target) = fsdp_data(&dev, step, comm.rank())?;
        let h = g.forward(0, &[Some(x)])?.remove(0).expect("output");
        let y = g.forward(1, &[Some(h)])?.remove(0).expect("output");
        let dh = g.backward(1, &[Some(ops::mse_backward(&y, &target, 1.0)?)])?.remove(0);
        g.backward(0, &[dh])?;
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

/// Whether two parameter lists are bitwise equal; the first difference otherwise.
pub fn bitwise(got: &[Vec<f32>], want: &[Vec<f32>]) -> std::result::Result<(), String> {
    if got.len() != want.len() {
        return Err(format!("{} parameters, expected {}", got.len(), want.len()));
    }
    for (i, (a, b)) in got.iter().zip(want).enumerate() {
        if a.len() != b.len() || a.iter().zip(b).any(|(x, y)| x.to_bits() != y.to_bits()) {
            let first = a.iter().zip(b).position(|(x, y)| x.to_bits() != y.to_bits()).unwrap_or(0);
            return Err(format!("parameter {i} differs at element {first}"));
        }
    }
    Ok(())
}
