//! Automatic forward-only capture (PyTorch #124582): a training-mode capture where neither an
//! input nor a parameter needs a grad captures no backward graph, and backward is a typed
//! error. And `make_graphed` leaves parameter grads bitwise untouched, whatever backward does.

mod common;

use common::{on_each_backend, random};
use graphed::{
    graphed, make_graphed, ops, Cx, Error, GraphOptions, Module, Param, Parameters, Result, SetupError, Tensor,
};

/// A linear layer that exposes its parameters.
#[derive(Parameters)]
pub struct Lin {
    w: Param,
}

#[graphed(warmup = 2)]
impl Lin {
    pub fn forward(&self, cx: &mut Cx, x: &Tensor) -> Result<Tensor> {
        cx.save(x);
        ops::linear(x, &self.w.value, None)
    }
    pub fn backward(&mut self, cx: &mut Cx, dy: &Tensor) -> Result<Option<Tensor>> {
        let x = cx.saved(0)?;
        ops::linear_backward(dy, &x, &self.w.value, &self.w.grad, None, cx.needs_input_grad(0))
    }
}

/// The same layer without `Parameters`: the runtime cannot see its weight.
pub struct Opaque {
    w: Param,
}

#[graphed(warmup = 2)]
impl Opaque {
    pub fn forward(&self, cx: &mut Cx, x: &Tensor) -> Result<Tensor> {
        cx.save(x);
        ops::linear(x, &self.w.value, None)
    }
    pub fn backward(&mut self, cx: &mut Cx, dy: &Tensor) -> Result<Option<Tensor>> {
        let x = cx.saved(0)?;
        ops::linear_backward(dy, &x, &self.w.value, &self.w.grad, None, cx.needs_input_grad(0))
    }
}

/// An inference module: a `#[graphed]` impl with no `backward`.
pub struct Double;

#[graphed(warmup = 2)]
impl Double {
    pub fn forward(&self, _cx: &mut Cx, x: &Tensor) -> Result<Tensor> {
        ops::scale(x, 2.0)
    }
}

/// A backward that changes grads even for zero grad outputs (adds 1 to every weight grad).
#[derive(Parameters)]
pub struct Bumps {
    w: Param,
}

#[graphed(warmup = 3)]
impl Bumps {
    pub fn forward(&self, _cx: &mut Cx, x: &Tensor) -> Result<Tensor> {
        ops::scale(x, 2.0)
    }
    pub fn backward(&mut self, _cx: &mut Cx, dy: &Tensor) -> Result<Option<Tensor>> {
        let ones = Tensor::full(dy.device(), self.w.grad.dims(), 1.0)?;
        ops::axpy_(&self.w.grad, 1.0, &ones)?;
        Ok(Some(ops::scale(dy, 2.0)?))
    }
}

#[test]
fn nothing_needs_a_grad_so_only_the_forward_is_captured() {
    on_each_backend(|dev| {
        let x = random(dev, &[4, 8], 1)?; // needs no grad
        let frozen = Lin { w: Param::frozen(random(dev, &[8, 8], 2)?)? };
        let mut g = frozen.make_graphed(&x)?;
        assert!(!g.inner().has_backward());
        assert_eq!(g.inner().graphs().len(), 1, "the forward graph only");
        let y = g.forward(&x)?;
        assert_eq!(y.to_vec()?, ops::linear(&x, &g.module().w.value, None)?.to_vec()?);
        assert!(matches!(g.backward(&y), Err(Error::ForwardOnly { .. })));
        // An input that requires a grad cannot go through graphs that compute none.
        let xg = x.clone().with_requires_grad(true);
        assert!(matches!(g.forward(&xg), Err(Error::SlotRequiresGrad { .. })));
        Ok(())
    });
}

#[test]
fn a_trainable_parameter_or_an_opaque_module_captures_backward() {
    on_each_backend(|dev| {
        let x = random(dev, &[4, 8], 1)?;
        let g = Lin { w: Param::new(random(dev, &[8, 8], 2)?)? }.make_graphed(&x)?;
        assert!(g.inner().has_backward(), "the weight needs a grad");
        let g = Opaque { w: Param::frozen(random(dev, &[8, 8], 2)?)? }.make_graphed(&x)?;
        assert!(g.inner().has_backward(), "the runtime cannot see Opaque's parameters");
        let x = x.with_requires_grad(true);
        let g = Lin { w: Param::frozen(random(dev, &[8, 8], 2)?)? }.make_graphed(&x)?;
        assert!(g.inner().has_backward(), "the input needs a grad");
        Ok(())
    });
}

#[test]
fn make_graphed_leaves_parameter_grads_bitwise_untouched() {
    on_each_backend(|dev| {
        let x = random(dev, &[4, 8], 1)?.with_requires_grad(true);
        let w = Param::new(random(dev, &[8], 2)?)?;
        ops::fill_(&w.grad, 0.25)?;
        let mut g = Bumps { w }.make_graphed(&x)?;
        assert_eq!(g.module().w.grad.to_vec()?, vec![0.25; 8], "warm-up and capture left no trace");
        g.forward(&x)?;
        g.backward(&x)?;
        assert_eq!(g.module().w.grad.to_vec()?, vec![1.25; 8], "one replayed backward adds one");
        Ok(())
    });
}

/// `make_graphed` copies every exposed grad before warm-up (to put it back after) into the
/// default pool; the slabs that copy grew are given back with it, so the default pool reserves
/// afterwards what it did before (on CUDA too: the pool's bookkeeping is the same; a fresh
/// host device here, so that no other test shares its pool).
#[test]
fn make_graphed_keeps_no_copy_of_the_grads_in_the_default_pool() -> Result<()> {
    let dev = graphed::Device::host();
    let lin = Lin { w: Param::new(random(&dev, &[512, 512], 2)?)? };
    lin.w.grad.copy_from_slice(&vec![0.25; 512 * 512])?;
    let x = random(&dev, &[4, 512], 1)?.with_requires_grad(true);
    let before = dev.default_pool().stats().reserved;
    let mut g = lin.make_graphed(&x)?;
    assert!(g.inner().has_backward());
    assert_eq!(dev.default_pool().stats().reserved, before, "the grads' copy was given back");
    assert!(g.module().w.grad.to_vec()?.iter().all(|&v| v == 0.25), "the grads were put back");
    let y = g.forward(&x)?;
    g.backward(&y)?;
    Ok(())
}

/// Modules without a backward among modules with one: when grads are wanted (a trainable
/// weight), forward graphs alone would leave them uncomputed, so the capture is refused and the
/// modules come back; for inference, or when nothing needs a grad, it captures the forwards.
#[test]
fn an_inference_module_among_trainable_ones_is_refused_when_grads_are_wanted() {
    on_each_backend(|dev| {
        let x = random(dev, &[4, 8], 1)?;
        let samples = || vec![vec![vec![Some(x.clone())]], vec![vec![Some(x.clone())]]];
        let modules = |w: Param| -> Vec<Box<dyn Module>> { vec![Box::new(Double), Box::new(Lin { w })] };
        let trainable = || -> Result<Param> { Param::new(random(dev, &[8, 8], 2)?) };
        let Err(refused) = make_graphed(modules(trainable()?), samples(), GraphOptions::new().warmup(1)) else {
            panic!("a trainable weight behind a module without a backward must be refused");
        };
        assert!(
            matches!(refused.error(), Error::Setup(SetupError::NoBackward { chunk: 1, .. })),
            "{}",
            refused.error()
        );
        assert_eq!(refused.into_inner().len(), 2, "the modules come back");
        let g = make_graphed(modules(trainable()?), samples(), GraphOptions::new().warmup(1).inference())?;
        assert!(!g.has_backward(), "for inference");
        let frozen = Param::frozen(random(dev, &[8, 8], 2)?)?;
        let g = make_graphed(modules(frozen), samples(), GraphOptions::new().warmup(1))?;
        assert!(!g.has_backward(), "nothing needs a grad");
        // Every module without a backward: a plain inference capture, even of inputs that need
        // grads.
        let xg = x.clone().with_requires_grad(true);
        let both: Vec<Box<dyn Module>> = vec![Box::new(Double), Box::new(Double)];
        let g = make_graphed(
            both,
            vec![vec![vec![Some(xg.clone())]], vec![vec![Some(xg)]]],
            GraphOptions::new().warmup(1),
        )?;
        assert!(!g.has_backward());
        Ok(())
    });
}
