//! The rank programs the multi-rank tests run, on emulated ranks (host) and on GPUs (NCCL,
//! one process per GPU), with their single-device references.
#![allow(dead_code)]

use std::collections::VecDeque;

use graphed::dist::{stage_order, Communicator, DataParallel, PipelineStage, ReduceOp, StageRole};
use graphed::optim::{AdamW, AdamWConfig};
use graphed::{make_graphed, ops, Cx, Device, GraphOptions, Module, OrderEntry, Param, Result, Tensor};

use crate::common::model;
use crate::common::model::{Block, Stack};
use crate::common::random;

#[path = "../../examples/common/fsdp_model.rs"]
pub mod fsdp_model;
use fsdp_model::FsdpBlock;

#[path = "../../examples/common/split_linear.rs"]
pub mod split_linear;
use split_linear::Split;

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
    let stage = PipelineStage::new(block, comm, ORDER, &[BATCH, WIDTH])?;
    let role = stage.role();
    let mine = stage_order(ORDER, 2, rank)?;
    // A later stage's input is received, and its grad sent back: it needs a grad.
    let sample = Tensor::zeros(&dev, &[BATCH, WIDTH])?.with_requires_grad(role != StageRole::First);
    let options = GraphOptions::new().warmup(2).order(mine.clone());
    let mut g = make_graphed(vec![Box::new(stage) as Box<dyn Module>], vec![vec![vec![Some(sample)]]], options)?;
    for step in 0..STEPS {
        let mut grads = VecDeque::new();
        let mut next = 0;
        for e in &mine {
            if let OrderEntry::Forward(_) = e {
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

/// Steps of the split-backward pipeline programs.
pub const SPLIT_STEPS: usize = 3;

/// Input and target of microbatch `m` of `step` (any number of microbatches).
fn split_microbatch(dev: &Device, step: usize, m: usize) -> Result<(Tensor, Tensor)> {
    let seed = (step * 64 + m) as u64 * 7919 + 13;
    Ok((random(dev, &[BATCH, WIDTH], seed)?, random(dev, &[BATCH, WIDTH], seed + 1)?))
}

/// Chunk `c` (1-indexed) of the split-backward pipelines: a linear layer whose weight grads
/// are a separate half of its backward.
pub fn split_chunk(dev: &Device, c: usize) -> Result<Split> {
    let seed = 300 + 10 * c as u64;
    Ok(Split { w: Param::new(random(dev, &[WIDTH, WIDTH], seed)?)?, b: Param::new(random(dev, &[WIDTH], seed + 1)?)? })
}

/// What a split-backward pipeline run gives to compare bitwise: per step, the loss of every
/// microbatch (in the order the last chunk ran them) and every grad of the chunks (each
/// chunk's weight, then bias, chunks in order) before the optimizer step; then the parameters
/// after the last step.
#[derive(Debug, Default, PartialEq)]
pub struct PipeTrace {
    pub losses: Vec<Vec<f32>>,
    pub grads: Vec<Vec<Vec<f32>>>,
    pub params: Vec<Vec<f32>>,
}

impl PipeTrace {
    /// The part of a whole pipeline's trace that rank `rank` of `world` sees: the grads and
    /// parameters of its chunks, and the losses when it runs the last chunk.
    pub fn of_rank(&self, rank: usize, world: usize, chunks: usize) -> PipeTrace {
        let mine: Vec<usize> = (rank..chunks).step_by(world).collect();
        let pick = |all: &[Vec<f32>]| mine.iter().flat_map(|c| all[2 * c..2 * c + 2].to_vec()).collect::<Vec<_>>();
        PipeTrace {
            losses: if (chunks - 1) % world == rank {
                self.losses.clone()
            } else {
                vec![Vec::new(); self.losses.len()]
            },
            grads: self.grads.iter().map(|g| pick(g)).collect(),
            params: pick(&self.params),
        }
    }
}

fn trace_step(trace: &mut PipeTrace, losses: Vec<f32>, params: &[Param], opt: &AdamW) -> Result<()> {
    trace.losses.push(losses);
    trace.grads.push(params.iter().map(|p| p.grad.to_vec()).collect::<Result<_>>()?);
    opt.step()?;
    opt.zero_grad()
}

/// The last chunk's output for a microbatch: its loss, and the grad its backward takes.
fn last_chunk_out(y: Option<Tensor>, target: &Tensor, losses: &mut Vec<f32>, dys: &mut VecDeque<Tensor>) -> Result<()> {
    let y = y.expect("the last chunk's output");
    losses.push(ops::mse_loss(&y, target)?.to_vec()?[0]);
    dys.push_back(ops::mse_backward(&y, target, 1.0)?);
    Ok(())
}

fn split_params(chunks: &[&Split]) -> Vec<Param> {
    chunks.iter().flat_map(|s| [s.w.clone(), s.b.clone()]).collect()
}

/// Every chunk of `order` in one process, graphed with the whole order (chained, as
/// examples/pipeline_wgrad.rs runs it): the reference of [`pipeline_split_rank`].
pub fn pipeline_split_reference(dev: &Device, order: &[OrderEntry]) -> Result<PipeTrace> {
    let chunks = order.iter().map(|e| e.chunk()).max().unwrap_or(0);
    let modules = (1..=chunks).map(|c| split_chunk(dev, c)).collect::<Result<Vec<_>>>()?;
    let params = split_params(&modules.iter().collect::<Vec<_>>());
    let opt = adamw(&params)?;
    let samples = (0..chunks)
        .map(|c| Ok(vec![vec![Some(Tensor::zeros(dev, &[BATCH, WIDTH])?.with_requires_grad(c > 0))]]))
        .collect::<Result<Vec<_>>>()?;
    let modules: Vec<Box<dyn Module>> = modules.into_iter().map(|m| Box::new(m) as Box<dyn Module>).collect();
    let options = GraphOptions::new().warmup(2).order(order.to_vec()).chained(true);
    let mut g = make_graphed(modules, samples, options)?;
    let mut trace = PipeTrace::default();
    for step in 0..SPLIT_STEPS {
        let (mut fwd, mut bwd) = (vec![0; chunks], vec![0; chunks]);
        let (mut losses, mut dys) = (Vec::new(), VecDeque::new());
        for e in order {
            match *e {
                OrderEntry::Forward(c) => {
                    let m = fwd[c - 1];
                    fwd[c - 1] += 1;
                    let (x, target) = split_microbatch(dev, step, m)?;
                    // Chained: the previous chunk's output buffer is this chunk's input.
                    let input = if c == 1 { Some(x) } else { g.outputs(c - 2, m)?.remove(0) };
                    let y = g.forward(c - 1, &[input])?.remove(0);
                    if c == chunks {
                        last_chunk_out(y, &target, &mut losses, &mut dys)?;
                    }
                }
                OrderEntry::Backward(c) => {
                    let m = bwd[c - 1];
                    bwd[c - 1] += 1;
                    let dy = if c == chunks { dys.pop_front() } else { g.grad_inputs(c, m)?.remove(0) };
                    g.backward(c - 1, &[dy])?;
                }
                OrderEntry::Wgrad(c) => g.backward_weights(c - 1)?,
            }
        }
        trace_step(&mut trace, losses, &params, &opt)?;
    }
    trace.params = params.iter().map(|p| p.value.to_vec()).collect::<Result<_>>()?;
    Ok(trace)
}

/// Rank `comm.rank()`'s chunks of `order` (chunk c on rank (c - 1) % world) as pipeline
/// stages, graphed with the rank's part of the order: its part of
/// [`pipeline_split_reference`]'s trace.
pub fn pipeline_split_rank(comm: Communicator, order: &[OrderEntry]) -> Result<PipeTrace> {
    let dev = comm.device().clone();
    let (rank, world) = (comm.rank(), comm.world_size());
    let chunks = order.iter().map(|e| e.chunk()).max().unwrap_or(0);
    let mine: Vec<usize> = (rank + 1..=chunks).step_by(world).collect();
    let modules = mine.iter().map(|&c| split_chunk(&dev, c)).collect::<Result<Vec<_>>>()?;
    let params = split_params(&modules.iter().collect::<Vec<_>>());
    let opt = adamw(&params)?;
    let stages = PipelineStage::interleaved(modules, comm, order, &[BATCH, WIDTH])?;
    let local = stage_order(order, world, rank)?;
    // A later chunk's input is received, and its grad sent back: it needs a grad.
    let samples = mine
        .iter()
        .map(|&c| Ok(vec![vec![Some(Tensor::zeros(&dev, &[BATCH, WIDTH])?.with_requires_grad(c > 1))]]))
        .collect::<Result<Vec<_>>>()?;
    let modules: Vec<Box<dyn Module>> = stages.into_iter().map(|s| Box::new(s) as Box<dyn Module>).collect();
    let mut g = make_graphed(modules, samples, GraphOptions::new().warmup(2).order(local.clone()))?;
    let mut trace = PipeTrace::default();
    for step in 0..SPLIT_STEPS {
        let mut fwd = vec![0; mine.len()];
        let (mut losses, mut dys) = (Vec::new(), VecDeque::new());
        for e in &local {
            match *e {
                OrderEntry::Forward(l) => {
                    let (c, m) = (mine[l - 1], fwd[l - 1]);
                    fwd[l - 1] += 1;
                    let (x, target) = split_microbatch(&dev, step, m)?;
                    // A receiving stage's input is its static input: the graph receives into it.
                    let input = if c == 1 { Some(x) } else { g.static_input(l - 1, m, 0) };
                    let y = g.forward(l - 1, &[input])?.remove(0);
                    if c == chunks {
                        last_chunk_out(y, &target, &mut losses, &mut dys)?;
                    }
                }
                OrderEntry::Backward(l) => {
                    let dy = if mine[l - 1] == chunks { dys.pop_front() } else { None };
                    g.backward(l - 1, &[dy])?;
                }
                OrderEntry::Wgrad(l) => g.backward_weights(l - 1)?,
            }
        }
        trace_step(&mut trace, losses, &params, &opt)?;
    }
    trace.params = params.iter().map(|p| p.value.to_vec()).collect::<Result<_>>()?;
    Ok(trace)
}

/// Whether a rank's trace is bitwise its part of the reference; the first difference
/// otherwise.
pub fn same_trace(got: &PipeTrace, want: &PipeTrace) -> std::result::Result<(), String> {
    for (step, (a, b)) in got.losses.iter().zip(&want.losses).enumerate() {
        bitwise(std::slice::from_ref(a), std::slice::from_ref(b)).map_err(|e| format!("losses of step {step}: {e}"))?;
    }
    if got.losses.len() != want.losses.len() || got.grads.len() != want.grads.len() {
        return Err(format!("{} steps, expected {}", got.grads.len(), want.grads.len()));
    }
    for (step, (a, b)) in got.grads.iter().zip(&want.grads).enumerate() {
        bitwise(a, b).map_err(|e| format!("grads of step {step}: {e}"))?;
    }
    bitwise(&got.params, &want.params).map_err(|e| format!("final parameters: {e}"))
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
