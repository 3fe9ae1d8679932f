//! make_graphed edge semantics on each backend: None outputs, forward-only capture, the
//! train/eval fallback, unused inputs, inputs without grad, grad accumulation, stale handles,
//! replay order, warm-up leaving RNG results unchanged, and bad run-time input.

mod common;

use common::model::{Block, BlockInputs, GraphedBlock};
use common::{on_each_backend, random};
use graphed::{graphed, make_graphed, ops, Cx, Error, GraphOptions, Module, Param, Result, Tensor};

/// Two outputs, the second always `None`; two inputs, the second optional.
pub struct TwoHeads {
    lin: Block,
}

#[graphed(warmup = 2)]
impl TwoHeads {
    pub fn forward(&self, cx: &mut Cx, x: &Tensor, extra: Option<&Tensor>) -> Result<(Tensor, Option<Tensor>)> {
        let y = self.lin.forward(cx, x)?;
        let y = match extra {
            Some(e) => ops::add(&y, e)?,
            None => y,
        };
        Ok((y, None))
    }
    pub fn backward(
        &mut self,
        cx: &mut Cx,
        dy: &Tensor,
        dnone: Option<&Tensor>,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        assert!(dnone.is_none(), "a None output gets no grad");
        let dx = self.lin.backward(cx, dy)?;
        Ok((dx, Some(dy.deep_clone()?)))
    }
}

#[test]
fn none_outputs_stay_none_and_get_no_grad() {
    on_each_backend(|dev| {
        let x = random(dev, &[3, 8], 1)?.with_requires_grad(true);
        let e = random(dev, &[3, 8], 2)?.with_requires_grad(true);
        let mut g = TwoHeads { lin: Block::new(dev, 8, 8, 3)? }.make_graphed(&x, Some(&e))?;
        let mut eager = TwoHeads { lin: Block::new(dev, 8, 8, 3)? };
        let mut cx = Cx::new(dev);
        for _ in 0..2 {
            let (y, none) = g.forward(&x, Some(&e))?;
            assert!(none.is_none());
            let (y_e, _) = eager.forward(&mut cx, &x, Some(&e))?;
            assert_eq!(y.to_vec()?, y_e.to_vec()?);
            let dy = random(dev, &[3, 8], 4)?;
            let (dx, de) = g.backward(&dy, None)?;
            let (dx_e, _) = eager.backward(&mut cx, &dy, None)?;
            assert_eq!(dx.expect("dx").to_vec()?, dx_e.expect("dx").to_vec()?);
            assert_eq!(de.expect("de").to_vec()?, dy.to_vec()?);
        }
        // An optional input captured as Some must be given as Some.
        let err = g.forward(&x, None).unwrap_err();
        assert!(err.to_string().contains("captured with a tensor"), "{err}");
        Ok(())
    });
}

#[test]
fn forward_only_capture_for_inference() {
    on_each_backend(|dev| {
        let x = random(dev, &[4, 8], 5)?;
        let mut g = GraphedBlock::new(
            Block::new(dev, 8, 8, 9)?,
            BlockInputs { x: x.clone() },
            GraphedBlock::options().inference(),
        )?;
        assert_eq!(g.inner().graphs().len(), 1, "only the forward graph");
        let eager = Block::new(dev, 8, 8, 9)?;
        for seed in 0..3 {
            let xi = random(dev, &[4, 8], 50 + seed)?;
            let y = g.forward(&xi)?;
            assert_eq!(y.to_vec()?, eager.forward(&mut Cx::new(dev), &xi)?.to_vec()?);
        }
        let err = g.backward(&x).unwrap_err();
        assert!(matches!(err, Error::ForwardOnly { .. }), "{err}");
        Ok(())
    });
}

#[test]
fn a_call_in_the_other_mode_runs_the_eager_forward() {
    on_each_backend(|dev| {
        let x = random(dev, &[4, 8], 6)?;
        let mut g = Block::new(dev, 8, 8, 11)?.make_graphed(&x)?;
        let graphed_y = g.forward(&x)?;
        g.backward(&x)?;
        g.eval();
        let eager_y = g.forward(&x)?;
        assert!(!eager_y.same_buffer(&graphed_y), "eval mode must not replay the training graph");
        assert_eq!(eager_y.to_vec()?, g.module().forward(&mut Cx::new(dev), &x)?.to_vec()?);
        assert!(graphed_y.is_fresh(), "the eager call does not touch the graph's buffers");
        g.train();
        g.forward(&x)?;
        g.backward(&x)?;
        Ok(())
    });
}

/// Backward returns no grad for its second input.
pub struct IgnoresSecond {
    lin: Block,
}

#[graphed(warmup = 1)]
impl IgnoresSecond {
    pub fn forward(&self, cx: &mut Cx, x: &Tensor, _unused: &Tensor) -> Result<Tensor> {
        self.lin.forward(cx, x)
    }
    pub fn backward(&mut self, cx: &mut Cx, dy: &Tensor) -> Result<(Option<Tensor>, Option<Tensor>)> {
        Ok((self.lin.backward(cx, dy)?, None))
    }
}

#[graphed(warmup = 1, allow_unused_input)]
impl AllowsUnused {
    pub fn forward(&self, cx: &mut Cx, x: &Tensor, _unused: &Tensor) -> Result<Tensor> {
        self.0.forward(cx, x, _unused)
    }
    pub fn backward(&mut self, cx: &mut Cx, dy: &Tensor) -> Result<(Option<Tensor>, Option<Tensor>)> {
        self.0.backward(cx, dy)
    }
}

/// `IgnoresSecond` declared with `allow_unused_input`.
pub struct AllowsUnused(IgnoresSecond);

#[test]
fn allow_unused_input_both_ways() {
    on_each_backend(|dev| {
        let x = random(dev, &[2, 8], 7)?.with_requires_grad(true);
        let u = random(dev, &[2, 8], 8)?.with_requires_grad(true);
        let Err(err) = IgnoresSecond { lin: Block::new(dev, 8, 8, 1)? }.make_graphed(&x, &u) else {
            panic!("an input that needs a grad and gets none must be an error")
        };
        assert!(err.to_string().contains("allow_unused_input"), "{err}");
        assert!(!dev.is_capturing());
        let mut g = AllowsUnused(IgnoresSecond { lin: Block::new(dev, 8, 8, 1)? }).make_graphed(&x, &u)?;
        g.forward(&x, &u)?;
        let (dx, du) = g.backward(&x)?;
        assert!(dx.is_some() && du.is_none());
        Ok(())
    });
}

#[test]
fn an_input_that_needs_no_grad_gets_none() {
    on_each_backend(|dev| {
        let x = random(dev, &[2, 8], 9)?; // requires_grad false
        let mut g = Block::new(dev, 8, 8, 2)?.make_graphed(&x)?;
        g.forward(&x)?;
        assert!(g.backward(&x)?.is_none());
        Ok(())
    });
}

#[test]
fn grads_accumulate_across_two_backwards() {
    on_each_backend(|dev| {
        let x = random(dev, &[2, 8], 10)?;
        let dy = random(dev, &[2, 8], 11)?;
        let mut g = Block::new(dev, 8, 8, 3)?.make_graphed(&x)?;
        let w: Param = g.module().w.clone();
        assert!(w.grad.to_vec()?.iter().all(|v| *v == 0.0), "warm-up must leave grads unchanged");
        g.forward(&x)?;
        g.backward(&dy)?;
        let once = w.grad.to_vec()?;
        g.forward(&x)?;
        g.backward(&dy)?;
        let twice = w.grad.to_vec()?;
        for (a, b) in once.iter().zip(&twice) {
            assert_eq!(*b, a + a);
        }
        Ok(())
    });
}

#[test]
fn a_handle_overwritten_by_a_later_replay_is_an_error_not_stale_data() {
    on_each_backend(|dev| {
        let x = random(dev, &[2, 8], 12)?.with_requires_grad(true);
        let mut g = Block::new(dev, 8, 8, 4)?.make_graphed(&x)?;
        let y1 = g.forward(&x)?;
        let kept = y1.deep_clone()?;
        let dx1 = g.backward(&y1)?.expect("dx");
        let y2 = g.forward(&random(dev, &[2, 8], 13)?)?;
        assert!(!y1.is_fresh());
        let err = y1.to_vec().unwrap_err();
        assert!(matches!(err, Error::StaleTensor { .. }), "{err}");
        assert!(matches!(ops::add(&y1, &y2), Err(Error::StaleTensor { .. })));
        assert_eq!(kept.to_vec()?.len(), 16, "a deep clone stays valid");
        g.backward(&y2)?;
        assert!(matches!(dx1.to_vec(), Err(Error::StaleTensor { .. })), "grad inputs go stale too");
        Ok(())
    });
}

#[test]
fn out_of_order_replay_is_an_error() {
    on_each_backend(|dev| {
        let x = random(dev, &[2, 8], 14)?;
        let h = Tensor::zeros(dev, &[2, 8])?.with_requires_grad(true);
        let mods: Vec<Box<dyn Module>> = vec![Box::new(Block::new(dev, 8, 8, 1)?), Box::new(Block::new(dev, 8, 8, 2)?)];
        let mut g = make_graphed(mods, vec![vec![vec![Some(x.clone())]], vec![vec![Some(h)]]], GraphOptions::new())?;
        let y = g.forward(0, &[Some(x.clone())])?;
        let z = g.forward(1, &y)?;
        let err = g.backward(0, &z).unwrap_err();
        assert!(matches!(err, Error::ReplayOrder { .. }), "{err}");
        Ok(())
    });
}

/// Dropout after a linear layer, to see RNG effects.
pub struct Noisy {
    lin: Block,
}

#[graphed(warmup = 3)]
impl Noisy {
    pub fn forward(&self, cx: &mut Cx, x: &Tensor) -> Result<Tensor> {
        let y = self.lin.forward(cx, x)?;
        let (y, mask) = ops::dropout(&y, 0.5, &cx.device().rng()?, cx.training())?;
        if let Some(m) = mask {
            cx.save(&m);
        }
        Ok(y)
    }
    pub fn backward(&mut self, cx: &mut Cx, dy: &Tensor) -> Result<Option<Tensor>> {
        let mask = cx.saved(2)?;
        let d = ops::dropout_backward(dy, &mask)?;
        self.lin.backward(cx, &d)
    }
}

#[test]
fn warm_up_and_capture_do_not_change_rng_dependent_results() {
    on_each_backend(|dev| {
        let x = random(dev, &[4, 8], 15)?;
        let rng = dev.rng()?;
        rng.manual_seed(7)?;
        let eager = Noisy { lin: Block::new(dev, 8, 8, 5)? };
        let want: Vec<Vec<f32>> =
            (0..2).map(|_| eager.forward(&mut Cx::new(dev), &x)?.to_vec()).collect::<Result<_>>()?;
        assert_ne!(want[0], want[1], "each call draws a fresh mask");
        rng.manual_seed(7)?;
        let mut g = Noisy { lin: Block::new(dev, 8, 8, 5)? }.make_graphed(&x)?;
        for w in &want {
            assert_eq!(&g.forward(&x)?.to_vec()?, w);
            g.backward(&x)?;
        }
        Ok(())
    });
}

#[test]
fn a_run_time_input_of_another_shape_is_a_typed_error() {
    on_each_backend(|dev| {
        let x = random(dev, &[4, 8], 16)?;
        let mut g = Block::new(dev, 8, 8, 6)?.make_graphed(&x)?;
        let err = g.forward(&random(dev, &[5, 8], 17)?).unwrap_err();
        assert!(
            matches!(err, Error::SlotShape { ref expected, ref got, .. } if expected == &[4, 8] && got == &[5, 8]),
            "{err}"
        );
        Ok(())
    });
}

#[test]
fn a_hook_may_register_and_remove_hooks() {
    on_each_backend(|dev| {
        let hooks = graphed::HookRegistry::new();
        let calls = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let (inner_hooks, c) = (hooks.clone(), calls.clone());
        let mut handle = None;
        let first = hooks.register(0, graphed::HookKind::PreForward, false, move || {
            c.lock().unwrap().push("outer");
            if handle.is_none() {
                let c2 = c.clone();
                handle = Some(inner_hooks.register(0, graphed::HookKind::Forward, false, move || {
                    c2.lock().unwrap().push("added by a hook");
                    Ok(())
                }));
            }
            Ok(())
        });
        let x = random(dev, &[2, 8], 18)?;
        let _g = GraphedBlock::new(
            Block::new(dev, 8, 8, 7)?,
            BlockInputs { x },
            GraphedBlock::options().warmup(2).hooks(&hooks),
        )?;
        assert_eq!(
            *calls.lock().unwrap(),
            ["outer", "added by a hook", "outer", "added by a hook", "outer", "added by a hook"]
        );
        first.remove();
        assert_eq!(hooks.len(), 1);
        Ok(())
    });
}

#[test]
fn an_abandoned_iteration_can_start_over() {
    on_each_backend(|dev| {
        let x = random(dev, &[2, 8], 19)?;
        let mut g = Block::new(dev, 8, 8, 8)?.make_graphed(&x)?;
        let abandoned = g.forward(&x)?; // no backward: e.g. the step hit an error
        let y = g.forward(&x)?; // starting the cycle over is allowed
        assert!(matches!(abandoned.to_vec(), Err(Error::StaleTensor { .. })));
        assert!(g.backward(&y)?.is_none());
        let err = g.backward(&y).unwrap_err();
        assert!(err.to_string().contains("backward without an outstanding forward"), "{err}");
        Ok(())
    });
}

/// `y = 2x + x` through a temporary, so its graph writes memory it freed during capture.
pub struct WithTemp;

#[graphed(warmup = 1)]
impl WithTemp {
    pub fn forward(&self, _cx: &mut Cx, x: &Tensor) -> Result<Tensor> {
        let t = ops::scale(x, 2.0)?;
        ops::add(&t, x)
    }
    pub fn backward(&mut self, _cx: &mut Cx, dy: &Tensor) -> Result<Option<Tensor>> {
        Ok(Some(ops::scale(dy, 3.0)?))
    }
}

/// `y = 2x`, no temporaries: its output takes the first free block that fits.
pub struct NoTemp;

#[graphed(warmup = 1)]
impl NoTemp {
    pub fn forward(&self, _cx: &mut Cx, x: &Tensor) -> Result<Tensor> {
        ops::scale(x, 2.0)
    }
    pub fn backward(&mut self, _cx: &mut Cx, dy: &Tensor) -> Result<Option<Tensor>> {
        Ok(Some(ops::scale(dy, 2.0)?))
    }
}

#[test]
fn an_output_placed_in_an_earlier_graphs_temporary_goes_stale_when_that_graph_replays() {
    on_each_backend(|dev| {
        let x = random(dev, &[64, 64], 20)?;
        let mods: Vec<Box<dyn Module>> = vec![Box::new(WithTemp), Box::new(NoTemp)];
        let samples = vec![vec![vec![Some(x.clone())]], vec![vec![Some(x.clone())]]];
        let mut g = make_graphed(mods, samples, GraphOptions::new().inference())?;
        g.forward(0, &[Some(x.clone())])?;
        let y_b = g.forward(1, &[Some(x.clone())])?.remove(0).expect("output");
        let want: Vec<f32> = x.to_vec()?.iter().map(|v| 2.0 * v).collect();
        assert_eq!(y_b.to_vec()?, want);
        // The next cycle's first graph writes its temporary, which is where B's output lives
        // (the pool reused the block): the handle must report itself stale, not change.
        g.forward(0, &[Some(x.clone())])?;
        assert!(matches!(y_b.to_vec(), Err(Error::StaleTensor { .. })), "B's output must be stale after A replays");
        Ok(())
    });
}

#[test]
fn chained_modules_match_eager() {
    on_each_backend(|dev| {
        let x = random(dev, &[4, 8], 21)?;
        let dy = random(dev, &[4, 8], 22)?;
        let h = Tensor::zeros(dev, &[4, 8])?.with_requires_grad(true);
        let mods: Vec<Box<dyn Module>> =
            (0..3).map(|i| Ok(Box::new(Block::new(dev, 8, 8, 30 + i)?) as Box<dyn Module>)).collect::<Result<_>>()?;
        let samples = vec![vec![vec![Some(x.clone())]], vec![vec![Some(h.clone())]], vec![vec![Some(h)]]];
        let mut g = make_graphed(mods, samples, GraphOptions::new().chained(true))?;
        let mut eager: Vec<Block> = (0..3).map(|i| Block::new(dev, 8, 8, 30 + i)).collect::<Result<_>>()?;
        for _ in 0..2 {
            let mut y = vec![Some(x.clone())];
            let mut ye = x.clone();
            let mut cxs: Vec<Cx> = (0..3).map(|_| Cx::new(dev)).collect();
            for i in 0..3 {
                y = g.forward(i, &y)?;
                ye = eager[i].forward(&mut cxs[i], &ye.with_requires_grad(true))?;
            }
            let yg = y[0].clone().expect("output");
            assert_eq!(yg.to_vec()?, ye.to_vec()?);
            let mut d = vec![Some(dy.clone())];
            let mut de = dy.clone();
            for i in (0..3).rev() {
                d = g.backward(i, &d)?;
                de = eager[i].backward(&mut cxs[i], &de)?.unwrap_or_else(|| dy.clone());
            }
            assert!(d[0].is_none(), "x needs no grad");
        }
        for (i, b) in eager.iter().enumerate() {
            let gb = g.module::<Block>(i).expect("block");
            assert_eq!(gb.w.grad.to_vec()?, b.w.grad.to_vec()?, "block {i} weight grad");
        }
        Ok(())
    });
}
