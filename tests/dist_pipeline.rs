//! Pipeline parallelism on emulated ranks: rank c runs chunk c of the order, activations and
//! grads travel by send/recv inside the captured graphs, and the parameters after 10 AdamW
//! steps are bitwise those of the same pipeline on one device.

mod common;

use std::collections::VecDeque;

use common::model::Block;
use graphed::dist::{self, stage_order, Communicator, PipelineStage, StageRole};
use graphed::optim::{AdamW, AdamWConfig};
use graphed::{make_graphed, ops, Cx, Device, Error, GraphOptions, Module, Param, Result, Tensor};

const WIDTH: usize = 8;
const BATCH: usize = 3;
const STEPS: usize = 10;
const MICRO: usize = 2;
/// GPipe: every forward, then every backward, chunks 1-indexed.
const ORDER: [i32; 8] = [1, 1, 2, 2, -2, -2, -1, -1];

fn data(dev: &Device, step: usize, m: usize) -> Result<(Tensor, Tensor)> {
    let seed = 1000 + (step * MICRO + m) as u64 * 31;
    Ok((common::random(dev, &[BATCH, WIDTH], seed)?, common::random(dev, &[BATCH, WIDTH], seed + 1)?))
}

fn opt(params: &[Param]) -> Result<AdamW> {
    AdamW::new(params, AdamWConfig { lr: 5e-3, ..Default::default() })
}

/// Both chunks on one device, eagerly, with the order's accumulation order.
fn one_device() -> Result<Vec<Vec<f32>>> {
    let dev = Device::host();
    let mut blocks = [Block::new(&dev, WIDTH, WIDTH, 5)?, Block::new(&dev, WIDTH, WIDTH, 6)?];
    let params: Vec<Param> = blocks.iter().flat_map(Block::params).collect();
    let opt = opt(&params)?;
    for step in 0..STEPS {
        let mut cxs: Vec<[Cx; 2]> = Vec::new();
        let mut dys = Vec::new();
        for m in 0..MICRO {
            let (x, target) = data(&dev, step, m)?;
            let mut cx = [Cx::new(&dev), Cx::new(&dev)];
            cx[0].set_needs_input_grad(vec![false]);
            cx[1].set_needs_input_grad(vec![true]);
            let h = blocks[0].forward(&mut cx[0], &x)?;
            let y = blocks[1].forward(&mut cx[1], &h)?;
            dys.push(ops::mse_backward(&y, &target, 1.0)?);
            cxs.push(cx);
        }
        let mut dhs = Vec::new();
        for m in 0..MICRO {
            dhs.push(blocks[1].backward(&mut cxs[m][1], &dys[m])?.expect("a grad for the activation"));
        }
        for m in 0..MICRO {
            blocks[0].backward(&mut cxs[m][0], &dhs[m])?;
        }
        opt.step()?;
        opt.zero_grad()?;
    }
    params.iter().map(|p| p.value.to_vec()).collect()
}

/// Rank `r` runs chunk `r + 1`, graphed.
fn rank_main(comm: Communicator) -> Result<Vec<Vec<f32>>> {
    let dev = comm.device().clone();
    let rank = comm.rank();
    let block = Block::new(&dev, WIDTH, WIDTH, 5 + rank as u64)?;
    let params = block.params();
    let opt = opt(&params)?;
    let stage = PipelineStage::new(block, comm, &ORDER, &[BATCH, WIDTH])?;
    let role = stage.role();
    let mine = stage_order(&ORDER, 2, rank)?;
    // A later stage's input is received, and its grad sent back: it needs a grad.
    let sample = vec![Some(Tensor::zeros(&dev, &[BATCH, WIDTH])?.with_requires_grad(role != StageRole::First))];
    let options = GraphOptions::new().warmup(2).order(mine.clone());
    let mut g = make_graphed(vec![Box::new(stage) as Box<dyn Module>], vec![vec![sample]], options)?;
    for step in 0..STEPS {
        let mut grads = VecDeque::new();
        let mut next = 0;
        for &e in &mine {
            let mut cx = Cx::new(&dev);
            if e > 0 {
                let (x, target) = data(&dev, step, next)?;
                next += 1;
                if role == StageRole::First {
                    g.forward(0, &mut cx, &[Some(x)])?;
                } else {
                    let buffer = g.static_input(0, next - 1, 0);
                    let y = g.forward(0, &mut cx, &[buffer])?.remove(0).expect("the last stage's output");
                    grads.push_back(ops::mse_backward(&y, &target, 1.0)?);
                }
            } else if role == StageRole::First {
                g.backward(0, &mut cx, &[None])?;
            } else {
                g.backward(0, &mut cx, &[grads.pop_front()])?;
            }
        }
        opt.step()?;
        opt.zero_grad()?;
    }
    params.iter().map(|p| p.value.to_vec()).collect()
}

#[test]
fn pipeline_across_ranks_equals_one_device_bitwise() -> Result<()> {
    let reference = one_device()?;
    let ranks = dist::run_emulated(2, rank_main)?;
    let got: Vec<Vec<f32>> = ranks.into_iter().flatten().collect();
    assert_eq!(got.len(), reference.len());
    for (i, (a, b)) in got.iter().zip(&reference).enumerate() {
        assert!(a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits()), "parameter {i} differs");
    }
    let initial = Block::new(&Device::host(), WIDTH, WIDTH, 5)?.params()[0].value.to_vec()?;
    assert_ne!(initial, reference[0], "the parameters must move");
    Ok(())
}

#[test]
fn an_order_that_deadlocks_across_ranks_is_refused_on_every_rank() -> Result<()> {
    let bad = [1, 1, 2, -2, 2, -2, -1, -1];
    let results = dist::run_emulated_each(2, &dist::Config::default(), |comm| {
        let block = Block::new(comm.device(), WIDTH, WIDTH, 5)?;
        PipelineStage::new(block, comm, &bad, &[BATCH, WIDTH]).map(|_| ())
    })?;
    for r in &results {
        assert!(matches!(r, Err(Error::InvalidOrder { detail }) if detail.contains("deadlocks")), "{r:?}");
    }
    Ok(())
}

#[test]
fn ranks_with_different_orders_are_refused_on_every_rank() -> Result<()> {
    let results = dist::run_emulated_each(2, &dist::Config::default(), |comm| {
        let order: &[i32] = if comm.rank() == 0 { &ORDER } else { &[1, 2, -2, -1, 1, 2, -2, -1] };
        let block = Block::new(comm.device(), WIDTH, WIDTH, 5)?;
        PipelineStage::new(block, comm, order, &[BATCH, WIDTH]).map(|_| ())
    })?;
    for r in &results {
        assert!(matches!(r, Err(Error::ScheduleMismatch { .. })), "{r:?}");
    }
    Ok(())
}
