//! One launch per step: the fused schedule equals per-call replays and eager bit for bit, on
//! each backend; refused steps change nothing; handles from before a step go stale.

mod common;

use common::model::{Block, BlockInputs, GraphedBlock, Stack};
use common::{on_each_backend, random};
use graphed::optim::{Sgd, SgdConfig};
use graphed::{
    make_graphed, Cx, Device, Error, GraphOptions, GraphedModules, Module, Param, Result, SetupError, Tensor,
};

const L: usize = 4;
const B: usize = 4;
const H: usize = 8;

/// A chained stack of `L` blocks, one graph per block, as the per-block benchmark builds it.
fn chained(dev: &Device, x: &Tensor) -> Result<(GraphedModules, Vec<Param>)> {
    let stack = Stack::new(dev, L, H, 1)?;
    let params = stack.params();
    let blocks: Vec<Box<dyn Module>> = stack.blocks.into_iter().map(|b| Box::new(b) as Box<dyn Module>).collect();
    let hidden = Tensor::zeros(dev, &[B, H])?.with_requires_grad(true);
    let mut samples = vec![vec![vec![Some(x.clone())]]];
    samples.extend((1..L).map(|_| vec![vec![Some(hidden.clone())]]));
    Ok((make_graphed(blocks, samples, GraphOptions::new().warmup(2).chained(true))?, params))
}

/// Three SGD steps; returns every output, input grad, and the final parameters.
fn train(dev: &Device, mode: &str) -> Result<Vec<Vec<f32>>> {
    let xs: Vec<Tensor> =
        (0..3).map(|i| Ok(random(dev, &[B, H], 10 + i)?.with_requires_grad(true))).collect::<Result<_>>()?;
    let dys: Vec<Tensor> = (0..3).map(|i| random(dev, &[B, H], 20 + i)).collect::<Result<_>>()?;
    let mut out = Vec::new();
    if mode == "eager" {
        let mut stack = Stack::new(dev, L, H, 1)?;
        let sgd = Sgd::new(&stack.params(), SgdConfig { lr: 0.1, ..Default::default() })?;
        for (x, dy) in xs.iter().zip(&dys) {
            let mut cx = Cx::new(dev);
            out.push(stack.forward(&mut cx, x)?.to_vec()?);
            out.push(stack.backward(&mut cx, dy)?.expect("dx").to_vec()?);
            sgd.step()?;
        }
        out.extend(stack.params().iter().map(|p| p.value.to_vec()).collect::<Result<Vec<_>>>()?);
        return Ok(out);
    }
    let (mut g, params) = chained(dev, &xs[0])?;
    let sgd = Sgd::new(&params, SgdConfig { lr: 0.1, ..Default::default() })?;
    g.fuse()?;
    for (x, dy) in xs.iter().zip(&dys) {
        if mode == "fused" {
            g.static_inputs(0, 0)?[0].as_ref().expect("input").copy_(x)?;
            g.static_grad_outputs(L - 1, 0)?[0].as_ref().expect("grad output").copy_(dy)?;
            g.step()?;
            out.push(g.outputs(L - 1, 0)?[0].as_ref().expect("y").to_vec()?);
            out.push(g.grad_inputs(0, 0)?[0].as_ref().expect("dx").to_vec()?);
        } else {
            let mut h = x.clone();
            for i in 0..L {
                h = g.forward(i, &[Some(h)])?.remove(0).expect("output");
            }
            out.push(h.to_vec()?);
            let mut d = dy.clone();
            for i in (0..L).rev() {
                d = g.backward(i, &[Some(d)])?.remove(0).expect("grad");
            }
            out.push(d.to_vec()?);
        }
        sgd.step()?;
    }
    out.extend(params.iter().map(|p| p.value.to_vec()).collect::<Result<Vec<_>>>()?);
    Ok(out)
}

#[test]
fn fused_equals_per_call_equals_eager() {
    on_each_backend(|dev| {
        let eager = train(dev, "eager")?;
        assert_eq!(train(dev, "per-call")?, eager, "per-call replays differ from eager");
        assert_eq!(train(dev, "fused")?, eager, "the fused step differs from eager");
        Ok(())
    });
}

#[test]
fn refused_steps_change_nothing_and_old_handles_go_stale() {
    on_each_backend(|dev| {
        let x = random(dev, &[B, H], 1)?.with_requires_grad(true);
        let (mut g, _) = chained(dev, &x)?;
        let stats = g.pool().stats();
        assert!(matches!(g.step(), Err(Error::NotFused { .. })));
        g.fuse()?;
        // Half-way through per-call replays, a step is refused.
        let y = g.forward(0, &[Some(x.clone())])?.remove(0).expect("y");
        assert!(matches!(g.step(), Err(Error::StepMidIteration { pending: 1, .. })));
        for i in 1..L {
            let prev = g.outputs(i - 1, 0)?.remove(0);
            g.forward(i, &[prev])?;
        }
        let mut d = g.static_grad_outputs(L - 1, 0)?.remove(0).expect("grad output");
        for i in (0..L).rev() {
            d = g.backward(i, &[Some(d)])?.remove(0).expect("grad");
        }
        g.eval();
        assert!(matches!(g.step(), Err(Error::StepMode { captured_training: true, .. })));
        g.train();
        assert_eq!(g.pool().stats(), stats, "refused steps left the pool alone");
        assert!(y.is_fresh() && d.is_fresh());
        g.step()?;
        assert!(matches!(y.to_vec(), Err(Error::StaleTensor { .. })), "the step overwrote the output");
        assert!(matches!(d.to_vec(), Err(Error::StaleTensor { .. })), "and the input grad");
        // After a step, per-call replays continue from the start of the schedule.
        g.forward(0, &[Some(x.clone())])?;
        Ok(())
    });
}

#[test]
fn a_pipeline_schedule_fuses_too() {
    on_each_backend(|dev| {
        let order = vec![1, 2, 1, 2, -2, -1, -2, -1];
        let xs: Vec<Tensor> =
            (0..2).map(|i| Ok(random(dev, &[B, H], 30 + i)?.with_requires_grad(true))).collect::<Result<_>>()?;
        let dys: Vec<Tensor> = (0..2).map(|i| random(dev, &[B, H], 40 + i)).collect::<Result<_>>()?;
        let run = |fused: bool| -> Result<Vec<Vec<f32>>> {
            let mods: Vec<Box<dyn Module>> =
                vec![Box::new(Block::new(dev, H, H, 1)?), Box::new(Block::new(dev, H, H, 2)?)];
            let h = Tensor::zeros(dev, &[B, H])?.with_requires_grad(true);
            let samples = vec![vec![vec![Some(xs[0].clone())]], vec![vec![Some(h)]]];
            let mut g = make_graphed(mods, samples, GraphOptions::new().warmup(2).order(order.clone()).chained(true))?;
            for m in 0..2 {
                g.static_inputs(0, m)?[0].as_ref().expect("x").copy_(&xs[m])?;
                g.static_grad_outputs(1, m)?[0].as_ref().expect("dy").copy_(&dys[m])?;
            }
            if fused {
                g.fuse()?;
                g.step()?;
            } else {
                let (mut f, mut b) = ([0usize; 2], [0usize; 2]);
                for &e in &order {
                    let c = e.unsigned_abs() as usize - 1;
                    if e > 0 {
                        let inputs = g.static_inputs(c, f[c])?;
                        let inputs = if c == 0 { inputs } else { g.outputs(0, f[c])? };
                        g.forward(c, &inputs)?;
                        f[c] += 1;
                    } else {
                        let grads = if c == 1 { g.static_grad_outputs(1, b[c])? } else { g.grad_inputs(1, b[c])? };
                        g.backward(c, &grads)?;
                        b[c] += 1;
                    }
                }
            }
            let mut out = Vec::new();
            for m in 0..2 {
                out.push(g.outputs(1, m)?[0].as_ref().expect("y").to_vec()?);
                out.push(g.grad_inputs(0, m)?[0].as_ref().expect("dx").to_vec()?);
            }
            let first = g.module::<Block>(0).expect("first");
            out.push(first.w.grad.to_vec()?);
            Ok(out)
        };
        assert_eq!(run(true)?, run(false)?);
        Ok(())
    });
}

#[test]
fn separately_built_modules_share_one_pool_and_its_replay_order() {
    on_each_backend(|dev| {
        let x = random(dev, &[B, H], 5)?.with_requires_grad(true);
        let dy = random(dev, &[B, H], 6)?;
        let pool = dev.new_pool();
        let opts = || GraphedBlock::options().pool(&pool);
        let mut a = GraphedBlock::new(Block::new(dev, H, H, 1)?, BlockInputs { x: x.clone() }, opts())?;
        let mut b = GraphedBlock::new(Block::new(dev, H, H, 2)?, BlockInputs { x: x.clone() }, opts())?;
        assert!(a.inner().pool() == &pool && b.inner().pool() == &pool);
        // Capture order was a's forward and backward, then b's: b first is refused.
        assert!(matches!(b.forward(&x), Err(Error::ReplayOrder { .. })));
        let ya = a.forward(&x)?.to_vec()?;
        let dxa = a.backward(&dy)?.expect("dx").to_vec()?;
        let yb = b.forward(&x)?.to_vec()?;
        b.backward(&dy)?;
        let (mut ea, eb) = (Block::new(dev, H, H, 1)?, Block::new(dev, H, H, 2)?);
        let mut ca = Cx::new(dev);
        assert_eq!(ya, ea.forward(&mut ca, &x)?.to_vec()?);
        assert_eq!(dxa, ea.backward(&mut ca, &dy)?.expect("dx").to_vec()?);
        assert_eq!(yb, eb.forward(&mut Cx::new(dev), &x)?.to_vec()?);
        // A pool from another device is refused before anything runs.
        let other = Device::host().new_pool();
        let err = GraphedBlock::new(
            Block::new(dev, H, H, 3)?,
            BlockInputs { x: x.clone() },
            GraphedBlock::options().pool(&other),
        )
        .expect_err("another device's pool");
        assert!(matches!(err.error(), Error::Setup(SetupError::PoolOnOtherDevice { .. })), "{:?}", err.error());
        Ok(())
    });
}

#[test]
fn separately_graphed_blocks_replay_as_one_launch() {
    on_each_backend(|dev| {
        let xs: Vec<Tensor> =
            (0..3).map(|i| Ok(random(dev, &[B, H], 60 + i)?.with_requires_grad(true))).collect::<Result<_>>()?;
        let dy = random(dev, &[B, H], 70)?;
        // Three blocks graphed one by one into one pool, chained by hand through the static
        // buffers: block i+1's static input is filled from block i's output by per-call runs,
        // and by the sequence below through copies the caller makes between steps.
        let pool = dev.new_pool();
        let build = |seed| -> Result<GraphedModules> {
            let g = GraphedBlock::new(
                Block::new(dev, H, H, seed)?,
                BlockInputs { x: xs[0].clone() },
                GraphedBlock::options().pool(&pool),
            )?;
            Ok(g.into_inner())
        };
        let members = vec![build(1)?, build(2)?, build(3)?];
        let mut seq = graphed::Sequence::new(members).map_err(Error::from)?;
        assert_eq!(seq.len(), 3);
        for x in &xs {
            for i in 0..3 {
                seq.member(i).static_inputs(0, 0)?[0].as_ref().expect("x").copy_(x)?;
                seq.member(i).static_grad_outputs(0, 0)?[0].as_ref().expect("dy").copy_(&dy)?;
            }
            seq.step()?;
        }
        // Each block saw the same inputs three times: grads equal three eager steps.
        for (i, seed) in [1, 2, 3].into_iter().enumerate() {
            let mut eager = Block::new(dev, H, H, seed)?;
            let mut y = Vec::new();
            for x in &xs {
                let mut cx = Cx::new(dev);
                y = eager.forward(&mut cx, x)?.to_vec()?;
                eager.backward(&mut cx, &dy)?;
            }
            let member = seq.member(i);
            assert_eq!(member.outputs(0, 0)?[0].as_ref().expect("y").to_vec()?, y, "block {i} output");
            assert_eq!(member.module::<Block>(0).expect("block").w.grad.to_vec()?, eager.w.grad.to_vec()?);
        }
        // Half-way per-call replays on one member refuse the step; finishing them allows it.
        let x = xs[0].clone();
        seq.member_mut(0).forward(0, &[Some(x.clone())])?;
        assert!(matches!(seq.step(), Err(Error::StepMidIteration { .. })));
        seq.member_mut(0).backward(0, &[Some(dy.clone())])?;
        seq.step()?;
        // Members given out of their capture order are refused, and handed back.
        let mut members = seq.into_members();
        members.swap(0, 1);
        let err = graphed::Sequence::new(members).expect_err("out of capture order");
        assert!(matches!(err.error(), Error::Schedule(graphed::ScheduleError::FuseOrder { .. })), "{}", err.error());
        assert_eq!(err.into_inner().len(), 3);
        Ok(())
    });
}

/// The struct form's generated `fuse` and `step`.
#[graphed::graphed(warmup = 1, order = [1, 2, -2, -1])]
struct TwoBlocks {
    first: Block,
    second: Block,
}

#[test]
fn the_struct_form_steps_in_one_launch() {
    on_each_backend(|dev| {
        let x = random(dev, &[B, H], 80)?.with_requires_grad(true);
        let dy = random(dev, &[B, H], 81)?;
        let two = TwoBlocks { first: Block::new(dev, H, H, 1)?, second: Block::new(dev, H, H, 2)? };
        let mut g = two.make_graphed(vec![vec![vec![Some(x.clone())]], vec![vec![Some(x.clone())]]])?;
        g.fuse()?;
        let inner = g.inner();
        inner.static_inputs(0, 0)?[0].as_ref().expect("x").copy_(&x)?;
        // Without chaining chunk 2 reads its own static input, which the step cannot fill from
        // chunk 1's output: bind x there too, and dy as both chunks' grad output.
        inner.static_inputs(1, 0)?[0].as_ref().expect("x2").copy_(&x)?;
        inner.static_grad_outputs(1, 0)?[0].as_ref().expect("dy").copy_(&dy)?;
        inner.static_grad_outputs(0, 0)?[0].as_ref().expect("dh").copy_(&dy)?;
        g.step()?;
        let (mut a, mut b) = (Block::new(dev, H, H, 1)?, Block::new(dev, H, H, 2)?);
        let (mut ca, mut cb) = (Cx::new(dev), Cx::new(dev));
        a.forward(&mut ca, &x)?;
        let y = b.forward(&mut cb, &x)?.to_vec()?;
        b.backward(&mut cb, &dy)?;
        a.backward(&mut ca, &dy)?;
        assert_eq!(g.inner().outputs(1, 0)?[0].as_ref().expect("y").to_vec()?, y);
        assert_eq!(g.module_first().w.grad.to_vec()?, a.w.grad.to_vec()?);
        assert_eq!(g.module_second().w.grad.to_vec()?, b.w.grad.to_vec()?);
        Ok(())
    });
}
