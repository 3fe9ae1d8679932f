//! Activation recomputation under graphs: dropout inside checkpointed blocks reproduces its
//! masks in the recompute, every replay draws fresh masks, and the pool shrinks.

mod common;

use common::model::Block;
use common::{on_each_backend, random};
use graphed::optim::{Sgd, SgdConfig};
use graphed::{
    graphed, make_graphed, ops, Checkpoint, Cx, Device, GraphOptions, GraphedModules, Module, Param, Result, Tensor,
};

/// Linear + GELU + dropout(p).
pub struct DropBlock {
    lin: Block,
    p: f32,
}

impl DropBlock {
    fn new(dev: &Device, width: usize, seed: u64) -> Result<DropBlock> {
        Ok(DropBlock { lin: Block::new(dev, width, width, seed)?, p: 0.1 })
    }
}

#[graphed(warmup = 2)]
impl DropBlock {
    pub fn forward(&self, cx: &mut Cx, x: &Tensor) -> Result<Tensor> {
        let h = self.lin.forward(cx, x)?;
        let (y, mask) = ops::dropout(&h, self.p, &cx.device().rng()?, cx.training())?;
        if let Some(m) = mask {
            cx.save(&m);
        }
        Ok(y)
    }
    pub fn backward(&mut self, cx: &mut Cx, dy: &Tensor) -> Result<Option<Tensor>> {
        let d = ops::dropout_backward(dy, &cx.saved(2)?)?;
        self.lin.backward(cx, &d)
    }
}

/// Boxed modules and their parameters.
type Modules = (Vec<Box<dyn Module>>, Vec<Param>);

fn blocks(dev: &Device, n: usize, width: usize, checkpointed: bool) -> Result<Modules> {
    let mut mods: Vec<Box<dyn Module>> = Vec::new();
    let mut params = Vec::new();
    for i in 0..n {
        let b = DropBlock::new(dev, width, 20 + i as u64)?;
        params.extend(b.lin.params());
        mods.push(if checkpointed { Box::new(Checkpoint::new(b)) } else { Box::new(b) });
    }
    Ok((mods, params))
}

fn samples(x: &Tensor, n: usize) -> Result<Vec<Vec<Vec<Option<Tensor>>>>> {
    let h = Tensor::zeros(x.device(), x.dims())?.with_requires_grad(true);
    Ok((0..n).map(|i| vec![vec![Some(if i == 0 { x.clone() } else { h.clone() })]]).collect())
}

/// Three SGD steps through `n` blocks, graphed or eager; returns outputs, grads and weights.
fn train(dev: &Device, graphed: bool, x: &Tensor, dy: &Tensor) -> Result<Vec<Vec<f32>>> {
    const N: usize = 3;
    dev.rng()?.manual_seed(1234)?;
    let (mut mods, params) = blocks(dev, N, 16, true)?;
    let sgd = Sgd::new(&params, SgdConfig { lr: 0.1, ..Default::default() })?;
    let mut g: Option<GraphedModules> = None;
    if graphed {
        g = Some(make_graphed(std::mem::take(&mut mods), samples(x, N)?, GraphOptions::new().warmup(2))?);
    }
    let mut out = Vec::new();
    for _ in 0..3 {
        sgd.zero_grad()?;
        let mut cxs: Vec<Cx> = (0..N).map(|_| Cx::new(dev)).collect();
        let mut h = vec![Some(x.clone())];
        for i in 0..N {
            h = match &mut g {
                Some(g) => g.forward(i, &h)?,
                None => mods[i].forward(&mut cxs[i], &h)?,
            };
        }
        out.push(h[0].as_ref().expect("output").to_vec()?);
        let mut d = vec![Some(dy.clone())];
        for i in (0..N).rev() {
            d = match &mut g {
                Some(g) => g.backward(i, &d)?,
                None => mods[i].backward(&mut cxs[i], &d)?,
            };
        }
        out.extend(params.iter().map(|p| p.grad.to_vec()).collect::<Result<Vec<_>>>()?);
        sgd.step()?;
    }
    out.extend(params.iter().map(|p| p.value.to_vec()).collect::<Result<Vec<_>>>()?);
    Ok(out)
}

#[test]
fn checkpointed_dropout_graphed_equals_eager_bitwise() {
    on_each_backend(|dev| {
        let x = random(dev, &[8, 16], 1)?;
        let dy = random(dev, &[8, 16], 2)?;
        let eager = train(dev, false, &x, &dy)?;
        let graphed = train(dev, true, &x, &dy)?;
        assert_eq!(eager, graphed, "checkpointed graphs differ from eager");
        // The step outputs differ from step to step because the masks do (and weights move).
        assert_ne!(eager[0], eager[1 + 6]);
        Ok(())
    });
}

#[test]
fn each_replay_draws_a_fresh_mask_and_recompute_reuses_it() {
    on_each_backend(|dev| {
        let x = random(dev, &[8, 16], 3)?;
        let m = Checkpoint::new(DropBlock::new(dev, 16, 4)?);
        let mut g = make_graphed(vec![Box::new(m)], vec![vec![vec![Some(x.clone())]]], GraphOptions::new().warmup(2))?;
        let a = g.forward(0, &[Some(x.clone())])?[0].as_ref().expect("y").to_vec()?;
        g.backward(0, &[Some(x.clone())])?;
        let b = g.forward(0, &[Some(x.clone())])?[0].as_ref().expect("y").to_vec()?;
        g.backward(0, &[Some(x.clone())])?;
        let zeros = |v: &[f32]| v.iter().map(|e| *e == 0.0).collect::<Vec<_>>();
        assert_ne!(zeros(&a), zeros(&b), "masks must differ between replays");
        Ok(())
    });
}

#[test]
fn checkpointing_lowers_the_pool() {
    on_each_backend(|dev| {
        let x = random(dev, &[64, 256], 5)?;
        let mut bytes = Vec::new();
        for checkpointed in [false, true] {
            let (mods, _) = blocks(dev, 6, 256, checkpointed)?;
            let g = make_graphed(mods, samples(&x, 6)?, GraphOptions::new().warmup(1))?;
            bytes.push((g.pool().stats().reserved, g.live_bytes()));
        }
        eprintln!(
            "pool on {}: without checkpointing {} B reserved ({} live), with {} B reserved ({} live)",
            dev.name(),
            bytes[0].0,
            bytes[0].1,
            bytes[1].0,
            bytes[1].1
        );
        assert!(bytes[1].1 < bytes[0].1, "live bytes must drop with checkpointing: {bytes:?}");
        assert!(bytes[1].0 < bytes[0].0, "reserved bytes must drop with checkpointing: {bytes:?}");
        Ok(())
    });
}

#[graphed(warmup = 2, order = [1, 1, 2, -2, 2, -2, -1, -1])]
struct CheckpointedPipe {
    first: Checkpoint<DropBlock>,
    second: DropBlock,
}

#[test]
fn a_checkpointed_block_inside_an_ordered_pipeline() {
    const ORDER: [i32; 8] = [1, 1, 2, -2, 2, -2, -1, -1];
    on_each_backend(|dev| {
        let xs = [random(dev, &[4, 16], 6)?, random(dev, &[4, 16], 7)?];
        let dy = random(dev, &[4, 16], 8)?;
        let mut results = Vec::new();
        for graphed in [false, true] {
            dev.rng()?.manual_seed(99)?;
            let first = Checkpoint::new(DropBlock::new(dev, 16, 30)?);
            let second = DropBlock::new(dev, 16, 31)?;
            let params: Vec<Param> = first.inner().lin.params().into_iter().chain(second.lin.params()).collect();
            let (mut mods, mut g): (Vec<Box<dyn Module>>, _) = (Vec::new(), None);
            if graphed {
                let h = Tensor::zeros(dev, &[4, 16])?.with_requires_grad(true);
                let samples = vec![xs.iter().map(|x| vec![Some(x.clone())]).collect(), vec![vec![Some(h)]]];
                g = Some(CheckpointedPipe { first, second }.make_graphed(samples)?);
            } else {
                mods = vec![Box::new(first), Box::new(second)];
            }
            let (mut out, mut acts, mut grads) =
                (Vec::new(), std::collections::VecDeque::new(), std::collections::VecDeque::new());
            let (mut cx1, mut cx2) = (std::collections::VecDeque::new(), std::collections::VecDeque::new());
            let mut f1 = 0;
            for &e in &ORDER {
                let mut cx = Cx::new(dev);
                match (e, &mut g) {
                    (1, Some(g)) => {
                        acts.push_back(Some(g.forward_first(DropBlockInputs { x: xs[f1].clone() })?.output_0))
                    }
                    (1, None) => {
                        acts.push_back(mods[0].forward(&mut cx, &[Some(xs[f1].clone())])?.remove(0));
                        cx1.push_back(cx);
                    }
                    (2, Some(g)) => out.push(
                        g.forward_second(DropBlockInputs { x: acts.pop_front().flatten().expect("act") })?
                            .output_0
                            .to_vec()?,
                    ),
                    (2, None) => {
                        let h = acts.pop_front().flatten().map(|t| t.with_requires_grad(true));
                        out.push(mods[1].forward(&mut cx, &[h])?.remove(0).expect("y").to_vec()?);
                        cx2.push_back(cx);
                    }
                    (-2, Some(g)) => grads.push_back(g.backward_second(DropBlockGradOutputs { dy: dy.clone() })?.x),
                    (-2, None) => grads.push_back(
                        mods[1].backward(&mut cx2.pop_front().expect("fifo"), &[Some(dy.clone())])?.remove(0),
                    ),
                    (_, Some(g)) => {
                        g.backward_first(DropBlockGradOutputs { dy: grads.pop_front().flatten().expect("grad") })?;
                    }
                    (_, None) => {
                        mods[0].backward(&mut cx1.pop_front().expect("fifo"), &[grads.pop_front().flatten()])?;
                    }
                }
                if e == 1 {
                    f1 += 1;
                }
            }
            out.extend(params.iter().map(|p| p.grad.to_vec()).collect::<Result<Vec<_>>>()?);
            results.push(out);
        }
        assert_eq!(results[0], results[1], "checkpointed pipeline differs from the eager schedule");
        Ok(())
    });
}

/// A checkpointed backward whose recompute is refused (here its dropout probability was made
/// invalid after the forward) returns the refusal and leaves the device's generator where it
/// was: the recompute rewinds it to the forward's state only while it runs.
#[test]
fn a_refused_recompute_leaves_the_generator_where_it_was() {
    on_each_backend(|dev| {
        let mut m = Checkpoint::new(DropBlock::new(dev, 8, 3)?);
        let x = random(dev, &[4, 8], 1)?.with_requires_grad(true);
        let mut cx = Cx::new(dev);
        cx.set_training(true);
        let y = Module::forward(&m, &mut cx, &[Some(x)])?;
        let rng = dev.rng()?;
        let before = rng.save()?;
        m.inner_mut().p = 1.5;
        let e = Module::backward(&mut m, &mut cx, &y).expect_err("the recompute is refused");
        assert!(matches!(e.root(), graphed::Error::Op(_)), "{e:?}");
        // The next draws are those of the state before the call.
        let draw = || -> Result<Vec<f32>> {
            let t = Tensor::zeros(dev, &[16])?;
            rng.uniform_(&t)?;
            t.to_vec()
        };
        let after = draw()?;
        rng.restore(&before)?;
        assert_eq!(after, draw()?, "the generator is where it was");
        Ok(())
    });
}
