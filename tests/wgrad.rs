//! Separate weight-grad graphs: modules that split their backward (`backward` the input grads,
//! `backward_weights` the weight grads) with `w(c)` entries in `order`. Per-call replays, the
//! fused step and eager unsplit backwards agree bit for bit; misuse is a typed error that
//! changes nothing.

mod common;
#[path = "../examples/common/split_linear.rs"]
mod split_linear;

use common::{on_each_backend, random};
use graphed::{
    backward_unsplit, graphed, make_graphed, ops, Checkpoint, Cx, Device, Error, GraphOptions, GraphedModules, Module,
    OrderEntry, Param, Parameters, Result, ScheduleError, Tensor,
};
use split_linear::{Split, SplitGradOutputs, SplitInputs};

const B: usize = 3;
const H: usize = 4;

/// The same layer, unsplit (its weight grads inside `backward`).
#[derive(Parameters)]
pub struct Whole {
    w: Param,
    b: Param,
}

#[graphed(warmup = 1)]
impl Whole {
    pub fn forward(&self, cx: &mut Cx, x: &Tensor) -> Result<Tensor> {
        cx.save(x);
        ops::linear(x, &self.w.value, Some(&self.b.value))
    }

    pub fn backward(&mut self, cx: &mut Cx, dy: &Tensor) -> Result<Option<Tensor>> {
        let x = cx.saved(0)?;
        ops::linear_backward(dy, &x, &self.w.value, &self.w.grad, Some(&self.b.grad), cx.needs_input_grad(0))
    }
}

#[graphed(warmup = 2, order = [1, 2, 1, -2, 2, -1, w(2), -2, w(1), -1, w(2), w(1)])]
struct Pipe {
    first: Split,
    second: Split,
}

fn split(dev: &Device, seed: u64) -> Result<Split> {
    Ok(Split { w: Param::new(random(dev, &[H, H], seed)?)?, b: Param::new(random(dev, &[H], seed + 1)?)? })
}

fn whole(dev: &Device, seed: u64) -> Result<Whole> {
    Ok(Whole { w: Param::new(random(dev, &[H, H], seed)?)?, b: Param::new(random(dev, &[H], seed + 1)?)? })
}

fn grads(m: &dyn Module) -> Result<Vec<Vec<f32>>> {
    let mut v = Vec::new();
    m.visit_params(&mut |_, p| v.push(p.grad.clone()));
    v.iter().map(Tensor::to_vec).collect()
}

/// Inputs and grad outputs of `microbatches` microbatches.
fn data(dev: &Device, microbatches: usize) -> Result<(Vec<Tensor>, Vec<Tensor>)> {
    let xs = (0..microbatches).map(|m| Ok(random(dev, &[B, H], 30 + m as u64)?.with_requires_grad(true)));
    let dys = (0..microbatches).map(|m| random(dev, &[B, H], 40 + m as u64));
    Ok((xs.collect::<Result<_>>()?, dys.collect::<Result<_>>()?))
}

/// Two iterations of the two chunks as ordinary layers (weight grads inside backward), each
/// microbatch forward then backward: every microbatch's output and input grad, then the
/// parameter grads. The order of microbatches is all that a sum of grads depends on, so this is
/// what every schedule must equal.
fn eager_unsplit(dev: &Device, xs: &[Tensor], dys: &[Tensor]) -> Result<Vec<Vec<f32>>> {
    let mut out = Vec::new();
    let mut chunks: [Box<dyn Module>; 2] = [Box::new(whole(dev, 1)?), Box::new(whole(dev, 3)?)];
    for _ in 0..2 {
        for (x, dy) in xs.iter().zip(dys) {
            let (mut c1, mut c2) = (Cx::new(dev), Cx::new(dev));
            c1.set_needs_input_grad(vec![true]);
            c2.set_needs_input_grad(vec![true]);
            let h = chunks[0].forward(&mut c1, &[Some(x.clone())])?.remove(0);
            let y = chunks[1].forward(&mut c2, &[h])?.remove(0).expect("y");
            let dh = backward_unsplit(chunks[1].as_mut(), &mut c2, &[Some(dy.clone())])?.remove(0);
            let dx = backward_unsplit(chunks[0].as_mut(), &mut c1, &[dh])?.remove(0).expect("dx");
            out.extend([y.to_vec()?, dx.to_vec()?]);
        }
    }
    for c in &chunks {
        out.extend(grads(c.as_ref())?);
    }
    Ok(out)
}

/// Every microbatch's output and input grad, then the parameter grads, over two iterations
/// of `[1, 2, 1, -2, 2, -1, w(2), -2, w(1), -1, w(2), w(1)]`, in `mode`: "eager" (the unsplit
/// layer, no graphs), "per_call" (the wrapper's typed methods) or "fused" (one launch).
fn run(dev: &Device, mode: &str) -> Result<Vec<Vec<f32>>> {
    let dev = dev.clone();
    let (xs, dys) = data(&dev, 2)?;
    let mut out = Vec::new();
    if mode == "eager" {
        return eager_unsplit(&dev, &xs, &dys);
    }
    let hidden = Tensor::zeros(&dev, &[B, H])?.with_requires_grad(true);
    let samples = vec![vec![vec![Some(xs[0].clone())]], vec![vec![Some(hidden)]]];
    let pipe = Pipe { first: split(&dev, 1)?, second: split(&dev, 3)? };
    let mut g = GraphedPipe::new(pipe, samples, GraphedPipe::options().chained(true))?;
    g.fuse()?;
    for _ in 0..2 {
        if mode == "fused" {
            for m in 0..2 {
                g.inner().static_inputs(0, m)?[0].as_ref().expect("x").copy_(&xs[m])?;
                g.inner().static_grad_outputs(1, m)?[0].as_ref().expect("dy").copy_(&dys[m])?;
            }
            g.step()?;
            for m in 0..2 {
                out.push(g.inner().outputs(1, m)?[0].as_ref().expect("y").to_vec()?);
                out.push(g.inner().grad_inputs(0, m)?[0].as_ref().expect("dx").to_vec()?);
            }
        } else {
            out.extend(per_call(&mut g, &xs, &dys)?);
        }
    }
    out.extend(grads(g.module_first())?);
    out.extend(grads(g.module_second())?);
    Ok(out)
}

/// One iteration of `GraphedPipe::ORDER` through the typed per-chunk methods.
fn per_call(g: &mut GraphedPipe, xs: &[Tensor], dys: &[Tensor]) -> Result<Vec<Vec<f32>>> {
    let (mut ys, mut dxs) = (Vec::new(), Vec::new());
    let (mut fwd, mut bwd) = ([0usize; 2], [0usize; 2]);
    for entry in GraphedPipe::ORDER {
        match *entry {
            OrderEntry::Forward(1) => {
                g.forward_first(SplitInputs { x: xs[fwd[0]].clone() })?;
                fwd[0] += 1;
            }
            OrderEntry::Forward(_) => {
                let h = g.inner().outputs(0, fwd[1])?.remove(0).expect("h");
                ys.push(g.forward_second(SplitInputs { x: h })?.output_0.to_vec()?);
                fwd[1] += 1;
            }
            OrderEntry::Backward(2) => {
                g.backward_second(SplitGradOutputs { dy: dys[bwd[1]].clone() })?;
                bwd[1] += 1;
            }
            OrderEntry::Backward(_) => {
                let dh = g.inner().grad_inputs(1, bwd[0])?.remove(0).expect("dh");
                dxs.push(g.backward_first(SplitGradOutputs { dy: dh })?.x.expect("dx").to_vec()?);
                bwd[0] += 1;
            }
            OrderEntry::Wgrad(1) => g.backward_weights_first()?,
            OrderEntry::Wgrad(_) => g.backward_weights_second()?,
        }
    }
    Ok(ys.into_iter().zip(dxs).flat_map(|(y, dx)| [y, dx]).collect())
}

#[test]
fn per_call_fused_and_eager_agree_bit_for_bit() {
    on_each_backend(|dev| {
        let eager = run(dev, "eager")?;
        assert_eq!(run(dev, "per_call")?, eager);
        assert_eq!(run(dev, "fused")?, eager);
        Ok(())
    });
}

/// Four microbatches, two in flight, each chunk's weight grads deferred past the next
/// microbatch's work: `[1, 2, -2, 1, 2, -1, w(2), -2, w(1), ...]`.
const LONG: [i32; 24] = [1, 2, -2, 1, 2, -1, 92, -2, 91, 1, 2, -1, 92, -2, 91, 1, 2, -1, 92, -2, 91, -1, 92, 91];

fn long_order() -> Vec<OrderEntry> {
    LONG.iter().map(|&e| if e > 90 { OrderEntry::Wgrad((e - 90) as usize) } else { e.into() }).collect()
}

/// Outputs and input grads of every microbatch, then the parameter grads, over two steps of
/// `LONG`: per call, fused or (`None`) eager with the unsplit layer, in the same order.
fn run_long(dev: &Device, fused: Option<bool>) -> Result<Vec<Vec<f32>>> {
    let (xs, dys) = data(dev, 4)?;
    let mut out = Vec::new();
    let Some(fused) = fused else {
        return eager_unsplit(dev, &xs, &dys);
    };
    let hidden = Tensor::zeros(dev, &[B, H])?.with_requires_grad(true);
    let modules: Vec<Box<dyn Module>> = vec![Box::new(split(dev, 1)?), Box::new(split(dev, 3)?)];
    let samples = vec![vec![vec![Some(xs[0].clone())]], vec![vec![Some(hidden)]]];
    let opts = GraphOptions::new().warmup(2).order(long_order()).chained(true);
    let mut g = make_graphed(modules, samples, opts)?;
    assert!(g.surface_sets(0) < 4, "with reuse, fewer surface sets than microbatches: {}", g.surface_sets(0));
    if fused {
        g.fuse()?;
    }
    for _ in 0..2 {
        let mut results = vec![Vec::new(); 8];
        if fused {
            for m in 0..4 {
                g.static_inputs(0, m)?[0].as_ref().expect("x").copy_(&xs[m])?;
                g.static_grad_outputs(1, m)?[0].as_ref().expect("dy").copy_(&dys[m])?;
            }
            g.step()?;
            for m in 0..4 {
                results[2 * m] = g.outputs(1, m)?[0].as_ref().expect("y").to_vec()?;
                results[2 * m + 1] = g.grad_inputs(0, m)?[0].as_ref().expect("dx").to_vec()?;
            }
        } else {
            let (mut f, mut b) = ([0usize; 2], [0usize; 2]);
            for e in long_order() {
                match e {
                    OrderEntry::Forward(c) => {
                        let m = f[c - 1];
                        let x = if c == 1 { xs[m].clone() } else { g.outputs(0, m)?.remove(0).expect("h") };
                        let y = g.forward(c - 1, &[Some(x)])?.remove(0).expect("y");
                        if c == 2 {
                            results[2 * m] = y.to_vec()?;
                        }
                        f[c - 1] += 1;
                    }
                    OrderEntry::Backward(c) => {
                        let m = b[c - 1];
                        let d = if c == 2 { dys[m].clone() } else { g.grad_inputs(1, m)?.remove(0).expect("dh") };
                        let dx = g.backward(c - 1, &[Some(d)])?.remove(0).expect("dx");
                        if c == 1 {
                            results[2 * m + 1] = dx.to_vec()?;
                        }
                        b[c - 1] += 1;
                    }
                    OrderEntry::Wgrad(c) => g.backward_weights(c - 1)?,
                }
            }
        }
        out.extend(results);
    }
    for c in 0..2 {
        out.extend(grads(g.module::<Split>(c).expect("split"))?);
    }
    Ok(out)
}

#[test]
fn deferred_weight_grads_keep_reused_surfaces_until_they_ran() {
    on_each_backend(|dev| {
        let eager = run_long(dev, None)?;
        assert_eq!(run_long(dev, Some(false))?, eager, "per call");
        assert_eq!(run_long(dev, Some(true))?, eager, "fused");
        Ok(())
    });
}

#[test]
fn schedule_has_wgrad_graphs() {
    on_each_backend(|dev| {
        assert_eq!(GraphedPipe::ORDER.len(), 12);
        assert_eq!(GraphedPipe::ORDER[6], OrderEntry::Wgrad(2));
        assert_eq!(GraphedPipe::MICROBATCHES, 2);
        let dev = dev.clone();
        let samples = vec![vec![vec![Some(Tensor::zeros(&dev, &[B, H])?.with_requires_grad(true))]]; 2];
        let g = GraphedPipe::new(
            Pipe { first: split(&dev, 1)?, second: split(&dev, 3)? },
            samples,
            GraphedPipe::options(),
        )?;
        // Forward and backward per (chunk, microbatch), and a weight-grad graph each.
        let labels: Vec<&str> = g.inner().graphs().into_iter().map(|(l, _)| l).collect();
        assert_eq!(labels.len(), 12, "{labels:?}");
        assert_eq!(labels.iter().filter(|l| l.ends_with("weight grads")).count(), 4, "{labels:?}");
        Ok(())
    });
}

/// A one-microbatch runtime schedule `[1, 2, -2, -1, w(2)]`: chunk 1 is split but runs its
/// whole backward at `-1` (no `w(1)`), chunk 2 defers its weight grads.
fn runtime_form(dev: &Device) -> Result<GraphedModules> {
    let x = random(dev, &[B, H], 30)?.with_requires_grad(true);
    let modules: Vec<Box<dyn Module>> = vec![Box::new(split(dev, 1)?), Box::new(split(dev, 3)?)];
    let order = [1.into(), 2.into(), (-2).into(), (-1).into(), OrderEntry::Wgrad(2)];
    let samples = vec![vec![vec![Some(x.clone())]], vec![vec![Some(x)]]];
    Ok(make_graphed(modules, samples, GraphOptions::new().warmup(1).order(order))?)
}

fn all_grads(g: &GraphedModules) -> Result<Vec<Vec<f32>>> {
    let mut v = Vec::new();
    for c in 0..2 {
        v.extend(grads(g.module::<Split>(c).expect("split"))?);
    }
    Ok(v)
}

#[test]
fn misuse_is_a_typed_error_that_changes_nothing() {
    on_each_backend(|dev| {
        let dev = dev.clone();
        let mut g = runtime_form(&dev)?;
        let x = random(&dev, &[B, H], 30)?.with_requires_grad(true);
        let dy = random(&dev, &[B, H], 40)?;
        let before = all_grads(&g)?;
        let pool = g.pool().stats();
        assert!(matches!(g.backward_weights(1), Err(Error::NoPendingBackward { .. })));
        assert!(matches!(g.backward_weights(0), Err(Error::NotDeferred { .. })));
        assert!(matches!(g.backward_weights(2), Err(Error::ChunkOutOfRange { .. })));
        assert_eq!((all_grads(&g)?, g.pool().stats()), (before.clone(), pool), "a refused call changed something");
        g.forward(0, &[Some(x.clone())])?;
        g.forward(1, &[Some(x.clone())])?;
        g.backward(1, &[Some(dy.clone())])?;
        // `w(2)` comes after `-1`: too early now.
        assert!(matches!(g.backward_weights(1), Err(Error::ReplayOrder { .. })));
        assert_eq!(all_grads(&g)?[2..], before[2..], "chunk 2's weight grads must not have run");
        assert_eq!(g.pool().stats(), pool, "a refused call changed the pool");
        // A fused step is refused while a weight grad is outstanding.
        g.fuse()?;
        g.backward(0, &[Some(dy.clone())])?;
        let (grads_mid, pool_mid) = (all_grads(&g)?, g.pool().stats());
        assert!(matches!(g.step(), Err(Error::StepMidIteration { pending: 1, .. })));
        assert_eq!((all_grads(&g)?, g.pool().stats()), (grads_mid, pool_mid), "a refused step changed something");
        g.backward_weights(1)?;
        let after = all_grads(&g)?;
        assert!(matches!(g.backward_weights(1), Err(Error::NoPendingBackward { .. })));
        assert_eq!(all_grads(&g)?, after, "a refused call ran weight grads");
        assert_ne!(after[2..], before[2..]);
        g.step()?;
        Ok(())
    });
}

#[test]
fn bad_runtime_orders_are_refused_and_hand_the_modules_back() {
    on_each_backend(|dev| {
        let dev = dev.clone();
        let x = random(&dev, &[B, H], 30)?.with_requires_grad(true);
        let samples = || vec![vec![vec![Some(x.clone())]], vec![vec![Some(x.clone())]]];
        let (f, b, w) = (OrderEntry::Forward, OrderEntry::Backward, OrderEntry::Wgrad);
        let bad: [Vec<OrderEntry>; 3] = [
            vec![f(1), f(2), w(2), b(2), b(1)],                         // w(2) before its backward
            vec![f(1), f(2), b(2), b(1), w(2), w(2)],                   // more w(2) than microbatches
            vec![f(1), f(1), f(2), f(2), b(2), b(2), b(1), b(1), w(2)], // fewer
        ];
        for order in bad {
            let modules: Vec<Box<dyn Module>> = vec![Box::new(split(&dev, 1)?), Box::new(split(&dev, 3)?)];
            let err = make_graphed(modules, samples(), GraphOptions::new().order(order.clone())).unwrap_err();
            let refused = matches!(
                err.error(),
                Error::Schedule(
                    ScheduleError::WgradBeforeBackward { chunk: 2 }
                        | ScheduleError::Unbalanced { chunk: 2, wgrads: 1, .. }
                )
            );
            assert!(refused, "{order:?}: {err}");
            assert_eq!(err.into_inner().len(), 2);
        }
        // A module that does not split, and a checkpointed one (which never does).
        let unsplit: [Box<dyn Module>; 2] = [Box::new(whole(&dev, 1)?), Box::new(Checkpoint::new(split(&dev, 1)?))];
        for second in unsplit {
            let modules: Vec<Box<dyn Module>> = vec![Box::new(split(&dev, 1)?), second];
            let order = vec![f(1), f(2), b(2), b(1), w(2)];
            let err = make_graphed(modules, samples(), GraphOptions::new().order(order)).unwrap_err();
            assert!(err.to_string().contains("does not split its backward"), "{err}");
        }
        Ok(())
    });
}

/// Without `w(c)` entries a split module runs its whole backward in one graph: the same grads
/// as the unsplit layer, plain or checkpointed.
#[test]
fn without_wgrad_entries_a_split_module_is_unsplit() {
    on_each_backend(|dev| {
        let dev = dev.clone();
        let (xs, dys) = data(&dev, 1)?;
        let run = |module: Box<dyn Module>| -> Result<Vec<Vec<f32>>> {
            let mut g =
                make_graphed(vec![module], vec![vec![vec![Some(xs[0].clone())]]], GraphOptions::new().warmup(1))?;
            let y = g.forward(0, &[Some(xs[0].clone())])?.remove(0).expect("y").to_vec()?;
            let dx = g.backward(0, &[Some(dys[0].clone())])?.remove(0).expect("dx").to_vec()?;
            let m = g.into_modules().remove(0);
            Ok([vec![y, dx], grads(m.as_ref())?].concat())
        };
        let reference = run(Box::new(whole(&dev, 1)?))?;
        assert_eq!(run(Box::new(split(&dev, 1)?))?, reference);
        assert_eq!(run(Box::new(Checkpoint::new(split(&dev, 1)?)))?, reference);
        Ok(())
    });
}

/// Graphs captured for inference, run in training mode: every call is eager, and the weight
/// grads still wait for `backward_weights`.
#[test]
fn eager_calls_queue_their_weight_grads_too() {
    on_each_backend(|dev| {
        let dev = dev.clone();
        let (xs, dys) = data(&dev, 1)?;
        let modules: Vec<Box<dyn Module>> = vec![Box::new(split(&dev, 1)?)];
        let order = [OrderEntry::Forward(1), OrderEntry::Backward(1), OrderEntry::Wgrad(1)];
        let samples = vec![vec![vec![Some(xs[0].clone())]]];
        let mut g = make_graphed(modules, samples, GraphOptions::new().warmup(1).order(order).inference())?;
        g.train();
        let before = grads(g.module::<Split>(0).expect("split"))?;
        g.forward(0, &[Some(xs[0].clone())])?;
        let dx = g.backward(0, &[Some(dys[0].clone())])?.remove(0).expect("dx").to_vec()?;
        assert_eq!(grads(g.module::<Split>(0).expect("split"))?, before, "weight grads wait for w(1)");
        g.backward_weights(0)?;
        assert!(matches!(g.backward_weights(0), Err(Error::NoPendingBackward { .. })));

        let mut reference = whole(&dev, 1)?;
        let mut rcx = Cx::new(&dev);
        rcx.set_needs_input_grad(vec![true]);
        Module::forward(&reference, &mut rcx, &[Some(xs[0].clone())])?;
        let rdx = Module::backward(&mut reference, &mut rcx, &[Some(dys[0].clone())])?.remove(0).expect("dx");
        assert_eq!(dx, rdx.to_vec()?);
        assert_eq!(grads(g.module::<Split>(0).expect("split"))?, grads(&reference)?);
        Ok(())
    });
}
