//! Runtime tests of whole models declared with `#[graphed]` structs: stacks (`[M; N]`,
//! `Vec<M>`), `chained` with its typed `forward`/`backward`/`step`, checkpointed fields, and
//! what a struct's constructor refuses; on the host backend, each against the same model run
//! eagerly.

use graphed::{
    graphed, ops, Cx, Device, Error, GraphOptions, OrderEntry, Param, Parameters, Result, ScheduleError, Tensor,
};

/// `y = x * w` (elementwise), `w` learned.
#[derive(Parameters)]
struct Scale {
    w: Param,
}

#[graphed(warmup = 2)]
impl Scale {
    fn forward(&self, cx: &mut Cx, x: &Tensor) -> Result<Tensor> {
        cx.save(x);
        ops::mul(x, &self.w.value)
    }

    fn backward(&mut self, cx: &mut Cx, dy: &Tensor) -> Result<Option<Tensor>> {
        let x = cx.saved(0)?;
        ops::axpy_(&self.w.grad, 1.0, &ops::mul(dy, &x)?)?;
        Ok(Some(ops::mul(dy, &self.w.value)?))
    }
}

/// The mean squared error of `x * w` against `target`: a loss head with an extra input.
#[derive(Parameters)]
struct Loss {
    w: Param,
}

#[graphed(warmup = 2)]
impl Loss {
    fn forward(&self, cx: &mut Cx, x: &Tensor, target: &Tensor) -> Result<Tensor> {
        let y = ops::mul(x, &self.w.value)?;
        cx.save(x);
        cx.save(&y);
        cx.save(target);
        ops::mse_loss(&y, target)
    }

    /// `dloss` is read on the device, so a grad scale other than 1 works too.
    fn backward(&mut self, cx: &mut Cx, dloss: &Tensor) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let (x, y, target) = (cx.saved(0)?, cx.saved(1)?, cx.saved(2)?);
        let dy = ops::mse_backward(&y, &target, 1.0)?;
        ops::scale_by_(&dy, dloss)?;
        ops::axpy_(&self.w.grad, 1.0, &ops::mul(&dy, &x)?)?;
        Ok((Some(ops::mul(&dy, &self.w.value)?), None))
    }
}

/// A model of one first chunk, a stack counted at construction, and a loss head.
#[graphed(warmup = 2, chained)]
#[derive(Parameters)]
struct Model {
    first: Scale,
    #[graphed(checkpoint_every = 2)]
    blocks: Vec<Scale>,
    head: Loss,
}

/// The same layers in a fixed-size stack, two microbatches in a window of one.
#[graphed(warmup = 1, chained, order = windowed(microbatches = 2, in_flight = 1))]
struct Fixed {
    #[graphed(checkpoint)]
    first: Scale,
    blocks: [Scale; 3],
    head: Loss,
}

/// An unchained struct with a stack: per-layer calls.
#[graphed(warmup = 1)]
struct Unchained {
    blocks: [Scale; 2],
}

const N: usize = 4;

fn scale(dev: &Device, seed: f32) -> Result<Scale> {
    let w: Vec<f32> = (0..N).map(|i| 0.5 + 0.1 * seed + 0.05 * i as f32).collect();
    Ok(Scale { w: Param::new(Tensor::from_slice(dev, &w, &[N])?)? })
}

fn loss(dev: &Device) -> Result<Loss> {
    Ok(Loss { w: Param::new(Tensor::from_slice(dev, &[1.5, 0.5, -1.0, 2.0], &[N])?)? })
}

fn model(dev: &Device, layers: usize) -> Result<Model> {
    let blocks = (0..layers).map(|i| scale(dev, i as f32 + 1.0)).collect::<Result<_>>()?;
    Ok(Model { first: scale(dev, 0.0)?, blocks, head: loss(dev)? })
}

fn data(dev: &Device, step: usize) -> Result<(Tensor, Tensor)> {
    let x: Vec<f32> = (0..N).map(|i| (i + step) as f32 * 0.25 - 0.5).collect();
    let t: Vec<f32> = (0..N).map(|i| 1.0 - (i * step) as f32 * 0.125).collect();
    Ok((Tensor::from_slice(dev, &x, &[N])?, Tensor::from_slice(dev, &t, &[N])?))
}

/// Loss and every parameter grad of one eager forward and backward.
fn eager(m: &mut Model, x: &Tensor, t: &Tensor, dloss: &Tensor) -> Result<(Vec<f32>, Vec<Vec<f32>>)> {
    let dev = x.device().clone();
    let mut cxs: Vec<Cx> = (0..m.blocks.len() + 2).map(|_| Cx::new(&dev)).collect();
    let mut h = m.first.forward(&mut cxs[0], x)?;
    for (i, b) in m.blocks.iter().enumerate() {
        h = b.forward(&mut cxs[i + 1], &h)?;
    }
    let last = cxs.len() - 1;
    let l = m.head.forward(&mut cxs[last], &h, t)?;
    let (mut d, _) = m.head.backward(&mut cxs[last], dloss)?;
    for (i, b) in m.blocks.iter_mut().enumerate().rev() {
        d = b.backward(&mut cxs[i + 1], &d.expect("a grad"))?;
    }
    m.first.backward(&mut cxs[0], &d.expect("a grad"))?;
    Ok((l.to_vec()?, grads(m)?))
}

fn grads(m: &Model) -> Result<Vec<Vec<f32>>> {
    m.parameters().into_iter().map(|(_, p)| p.grad.to_vec()).collect()
}

#[test]
fn chained_forward_backward_and_step_match_eager() -> Result<()> {
    let dev = Device::host();
    let one = Tensor::full(&dev, &[1], 1.0)?;
    let (x0, t0) = data(&dev, 0)?;
    let mut g = model(&dev, 3)?.make_graphed(ModelInputs { x: x0 }, ModelExtraInputs { target: t0 })?;
    assert_eq!(g.len_blocks(), 3);
    let mut reference = model(&dev, 3)?;
    for step in 1..4 {
        let (x, t) = data(&dev, step)?;
        let loss =
            g.forward(ModelInputs { x: x.clone() }, ModelExtraInputs { target: t.clone() })?.output_0.to_vec()?;
        let dx: ModelGradInputs = g.backward(ModelGradOutputs { dloss: one.clone() })?;
        assert!(dx.x.is_none(), "the sample input needs no grad");
        let (want_loss, want_grads) = eager(&mut reference, &x, &t, &one)?;
        assert_eq!(loss, want_loss, "step {step}: loss");
        assert_eq!(graphed_grads(&g)?, want_grads, "step {step}: grads");
    }
    // In eval mode (not the captured one) the whole-model forward runs each chunk eagerly.
    g.eval();
    let (x, t) = data(&dev, 5)?;
    let eval_loss = g.forward(ModelInputs { x: x.clone() }, ModelExtraInputs { target: t.clone() })?.output_0;
    let mut h = ops::mul(&x, &reference.first.w.value)?;
    for b in &reference.blocks {
        h = ops::mul(&h, &b.w.value)?;
    }
    let want = ops::mse_loss(&ops::mul(&h, &reference.head.w.value)?, &t)?;
    assert_eq!(eval_loss.to_vec()?, want.to_vec()?);
    g.train();
    // The fused step: one launch on the same typed values.
    g.fuse()?;
    let (x, t) = data(&dev, 7)?;
    let out = g.step(
        ModelInputs { x: x.clone() },
        ModelExtraInputs { target: t.clone() },
        ModelGradOutputs { dloss: one.clone() },
    )?;
    let (want_loss, want_grads) = eager(&mut reference, &x, &t, &one)?;
    assert_eq!(out.output_0.to_vec()?, want_loss);
    let back = g.into_module();
    assert_eq!(grads(&back)?, want_grads, "grads after the fused step");
    assert_eq!(back.blocks.len(), 3);
    Ok(())
}

/// Every parameter grad of the graphed model, in the order `Parameters` visits the eager one.
fn graphed_grads(g: &GraphedModel) -> Result<Vec<Vec<f32>>> {
    let mut v = vec![g.module_first().w.grad.to_vec()?];
    for i in 0..g.len_blocks() {
        v.push(g.module_blocks(i).ok_or_else(|| Error::msg("a layer"))?.w.grad.to_vec()?);
    }
    v.push(g.module_head().w.grad.to_vec()?);
    Ok(v)
}

#[test]
fn checkpointed_fields_follow_the_attribute_unless_the_options_say_otherwise() -> Result<()> {
    let dev = Device::host();
    let (x, t) = data(&dev, 0)?;
    let sample = || (ModelInputs { x: x.clone() }, ModelExtraInputs { target: t.clone() });
    // `checkpoint_every = 2` on a stack of 5: layers 2 and 4, chunks 3 and 5 (1-indexed).
    let (inputs, extras) = sample();
    let g = model(&dev, 5)?.make_graphed(inputs, extras)?;
    let ck: Vec<usize> = (0..7).filter(|&c| g.inner().is_checkpointed(c)).collect();
    assert_eq!(ck, [2, 4]);
    let (inputs, extras) = sample();
    let g = GraphedModel::new(model(&dev, 5)?, inputs, extras, GraphedModel::options().no_checkpoint())?;
    assert!((0..7).all(|c| !g.inner().is_checkpointed(c)));
    let (inputs, extras) = sample();
    let g = GraphedModel::new(model(&dev, 2)?, inputs, extras, GraphOptions::new().checkpoint([1, 4]))?;
    let ck: Vec<usize> = (0..4).filter(|&c| g.inner().is_checkpointed(c)).collect();
    assert_eq!(ck, [0, 3]);
    // A fixed layout's options carry the list.
    assert_eq!(GraphedFixed::options().checkpointed_chunks(), Some(&[1][..]));
    Ok(())
}

#[test]
fn a_fixed_stack_with_a_windowed_schedule_steps_two_microbatches() -> Result<()> {
    assert_eq!(GraphedFixed::CHUNKS, 5);
    assert_eq!(GraphedFixed::MICROBATCHES, 2);
    assert_eq!(GraphedFixed::ORDER, OrderEntry::windowed(5, 2, 1));
    let dev = Device::host();
    let fixed = |dev: &Device| -> Result<Fixed> {
        Ok(Fixed {
            first: scale(dev, 0.0)?,
            blocks: [scale(dev, 1.0)?, scale(dev, 2.0)?, scale(dev, 3.0)?],
            head: loss(dev)?,
        })
    };
    let (x, t) = data(&dev, 0)?;
    let mut g = fixed(&dev)?.make_graphed(FixedInputs { x }, FixedExtraInputs { target: t })?;
    let half = Tensor::full(&dev, &[1], 0.5)?;
    // Per microbatch through the whole chain, as the window of one runs it.
    let (a, ta) = data(&dev, 1)?;
    let (b, tb) = data(&dev, 2)?;
    let la = g.forward(FixedInputs { x: a.clone() }, FixedExtraInputs { target: ta.clone() })?.output_0.to_vec()?;
    g.backward(FixedGradOutputs { dloss: half.clone() })?;
    let lb = g.forward(FixedInputs { x: b.clone() }, FixedExtraInputs { target: tb.clone() })?.output_0.to_vec()?;
    g.backward(FixedGradOutputs { dloss: half.clone() })?;
    let per_call = g.module_head().w.grad.to_vec()?;
    // The same two microbatches as one fused step, on a second model.
    let mut f = fixed(&dev)?.make_graphed(FixedInputs { x: a.clone() }, FixedExtraInputs { target: ta.clone() })?;
    f.fuse()?;
    let [oa, ob] = f.step([
        (FixedInputs { x: a }, FixedExtraInputs { target: ta }, FixedGradOutputs { dloss: half.clone() }),
        (FixedInputs { x: b }, FixedExtraInputs { target: tb }, FixedGradOutputs { dloss: half }),
    ])?;
    assert_eq!((oa.output_0.to_vec()?, ob.output_0.to_vec()?), (la, lb));
    assert_eq!(f.module_head().w.grad.to_vec()?, per_call);
    assert!(f.inner().is_checkpointed(0) && !f.inner().is_checkpointed(1));
    let back: Fixed = f.into_module();
    assert_eq!(back.head.w.grad.to_vec()?, per_call);
    Ok(())
}

#[test]
fn an_unchained_stack_is_called_layer_by_layer() -> Result<()> {
    let dev = Device::host();
    let sample = || -> Result<Vec<Vec<Option<Tensor>>>> {
        Ok(vec![vec![Some(Tensor::zeros(&dev, &[N])?.with_requires_grad(true))]])
    };
    let stack = || -> Result<Unchained> { Ok(Unchained { blocks: [scale(&dev, 1.0)?, scale(&dev, 2.0)?] }) };
    let mut g = stack()?.make_graphed(vec![sample()?, sample()?])?;
    assert_eq!(g.len_blocks(), 2);
    let (x, _) = data(&dev, 1)?;
    let h = g.forward_blocks(0, ScaleInputs { x: x.clone() })?.output_0;
    let y = g.forward_blocks(1, ScaleInputs { x: h.deep_clone()?.with_requires_grad(true) })?.output_0;
    let dh = g.backward_blocks(1, ScaleGradOutputs { dy: Tensor::full(&dev, &[N], 1.0)? })?.x.expect("dh");
    g.backward_blocks(0, ScaleGradOutputs { dy: dh })?;
    let eager = stack()?;
    let want = ops::mul(&ops::mul(&x, &eager.blocks[0].w.value)?, &eager.blocks[1].w.value)?;
    assert_eq!(y.to_vec()?, want.to_vec()?);
    assert!(matches!(g.forward_blocks(2, ScaleInputs { x }), Err(Error::ChunkOutOfRange { chunk: 2, chunks: 2 })));
    assert!(g.module_blocks(2).is_none() && g.module_blocks_mut(1).is_some());
    // A later chunk's sample must ask for the grad its predecessor's backward reads.
    let flat = vec![vec![Some(Tensor::zeros(&dev, &[N])?)]];
    let err = stack()?.make_graphed(vec![sample()?, flat]).expect_err("refused");
    assert!(matches!(err.error(), Error::SampleNeedsGrad { chunk: 2, input: 0, .. }), "{err}");
    assert_eq!(err.into_inner().blocks.len(), 2, "the struct comes back");
    Ok(())
}

#[test]
fn constructors_refuse_empty_stacks_and_schedules_of_another_size() -> Result<()> {
    let dev = Device::host();
    let (x, t) = data(&dev, 0)?;
    let err = model(&dev, 0)?.make_graphed(ModelInputs { x: x.clone() }, ModelExtraInputs { target: t.clone() });
    let err = err.expect_err("an empty stack is refused");
    assert!(matches!(err.error(), Error::EmptyStack { field, .. } if field == "blocks"), "{err}");
    assert!(err.into_inner().blocks.is_empty());
    // `Model` takes one microbatch per typed step; a schedule of two is refused up front.
    let opts = GraphedModel::options().order(OrderEntry::windowed(4, 2, 1));
    let err =
        GraphedModel::new(model(&dev, 2)?, ModelInputs { x: x.clone() }, ModelExtraInputs { target: t.clone() }, opts);
    let refused = err.err().map(|e| e.into_parts().0);
    assert!(
        matches!(refused, Some(Error::Schedule(ScheduleError::StructMicrobatches { microbatches: 1, passes: 16, .. }))),
        "{refused:?}"
    );
    // A chained capture whose schedule interleaves chunks has no whole-chain calls.
    let modules: Vec<Box<dyn graphed::Module>> = vec![Box::new(scale(&dev, 1.0)?), Box::new(scale(&dev, 2.0)?)];
    let samples = vec![vec![vec![Some(x.clone())]], vec![vec![None]]];
    let opts = GraphOptions::new().warmup(1).chained(true).order(vec![1, 2, 1, -2, 2, -1, -2, -1]);
    let mut g = graphed::make_graphed(modules, samples, opts)?;
    let refused = g.forward_chain(&[Some(x.clone())], &[]);
    assert!(
        matches!(refused, Err(Error::Schedule(ScheduleError::NotWholeChains { call: "forward_chain" }))),
        "{refused:?}"
    );
    g.forward(0, &[Some(x)])?; // nothing ran: the schedule starts as it would have
    Ok(())
}

#[test]
fn refused_whole_model_calls_change_nothing() -> Result<()> {
    let dev = Device::host();
    let one = Tensor::full(&dev, &[1], 1.0)?;
    let (x, t) = data(&dev, 0)?;
    let mut g = model(&dev, 2)?.make_graphed(ModelInputs { x: x.clone() }, ModelExtraInputs { target: t.clone() })?;
    let mut reference = model(&dev, 2)?;
    let wrong = Tensor::zeros(&dev, &[N + 1])?;
    // Bad extras are refused before the first chunk runs; a bad input by the first chunk itself.
    let r = g.forward(ModelInputs { x: x.clone() }, ModelExtraInputs { target: wrong.clone() });
    assert!(matches!(r, Err(Error::SlotShape { .. })), "{r:?}");
    let r = g.forward(ModelInputs { x: wrong.clone() }, ModelExtraInputs { target: t.clone() });
    assert!(matches!(r, Err(Error::SlotShape { .. })), "{r:?}");
    assert!(matches!(g.backward(ModelGradOutputs { dloss: one.clone() }), Err(Error::NoPendingForward { .. })));
    // A step before fuse() is refused before anything is copied.
    let r = g.step(
        ModelInputs { x: x.clone() },
        ModelExtraInputs { target: t.clone() },
        ModelGradOutputs { dloss: one.clone() },
    );
    assert!(matches!(r, Err(Error::NotFused { .. })), "{r:?}");
    g.fuse()?;
    let r = g.step(
        ModelInputs { x: x.clone() },
        ModelExtraInputs { target: wrong },
        ModelGradOutputs { dloss: one.clone() },
    );
    assert!(matches!(r, Err(Error::SlotShape { .. })), "{r:?}");
    // The step goes on as if nothing happened.
    let loss = g.forward(ModelInputs { x: x.clone() }, ModelExtraInputs { target: t.clone() })?.output_0.to_vec()?;
    g.backward(ModelGradOutputs { dloss: one.clone() })?;
    let (want_loss, want_grads) = eager(&mut reference, &x, &t, &one)?;
    assert_eq!(loss, want_loss);
    assert_eq!(graphed_grads(&g)?, want_grads);
    Ok(())
}
