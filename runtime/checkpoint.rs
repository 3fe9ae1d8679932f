//! Activation checkpointing: keep a module's inputs in forward and recompute the rest inside
//! backward, with the forward's random numbers reproduced exactly.

use crate::error::SignatureError;
use crate::{Cx, Module, Result, RngState, Tensor};

/// Wraps a module so that its forward saves only its inputs (and the device RNG state) and its
/// backward recomputes the forward before back-propagating.
///
/// Under graphs, the recompute is captured into the backward graph. The RNG state is saved by a
/// device-side copy inside the forward graph and restored inside the backward graph, so a
/// recomputed dropout mask equals the forward's bit for bit while every replay still draws
/// fresh masks. Backward accumulates into parameter grads as usual, which is what makes the
/// recompute work under graphs (Transformer Engine moved from `autograd.grad` to
/// `autograd.backward` for this reason).
///
/// A checkpointed module does not split its backward, whatever the inner one does: its
/// recomputed activations live only inside the backward, so an inner `backward_weights` runs
/// there too ([`crate::backward_unsplit`]), and a `w(c)` schedule entry for it is refused.
///
/// ```
/// use graphed::{Checkpoint, Cx, Device, Module, Result, Tensor, ops};
/// struct Double;
/// impl Module for Double {
///     fn name(&self) -> &'static str { "Double" }
///     fn num_inputs(&self) -> usize { 1 }
///     fn forward(&self, _cx: &mut Cx, x: &[Option<Tensor>]) -> Result<Vec<Option<Tensor>>> {
///         let y = x[0].as_ref().unwrap().deep_clone()?;
///         ops::scale_(&y, 2.0)?;
///         Ok(vec![Some(y)])
///     }
///     fn backward(&mut self, _cx: &mut Cx, dy: &[Option<Tensor>]) -> Result<Vec<Option<Tensor>>> {
///         let dx = dy[0].as_ref().unwrap().deep_clone()?;
///         ops::scale_(&dx, 2.0)?;
///         Ok(vec![Some(dx)])
///     }
/// }
/// let dev = Device::host();
/// let mut m = Checkpoint::new(Double);
/// let mut cx = Cx::new(&dev);
/// let x = Tensor::full(&dev, &[3], 1.0)?;
/// let y = m.forward(&mut cx, &[Some(x)])?;
/// let dx = m.backward(&mut cx, &[Some(Tensor::full(&dev, &[3], 1.0)?)])?;
/// assert_eq!(dx[0].as_ref().unwrap().to_vec()?, vec![2.0; 3]);
/// # Ok::<(), graphed::Error>(())
/// ```
pub struct Checkpoint<M> {
    inner: M,
}

impl<M: Module> Checkpoint<M> {
    /// Checkpoints `inner`.
    pub fn new(inner: M) -> Checkpoint<M> {
        Checkpoint { inner }
    }

    /// The wrapped module.
    pub fn inner(&self) -> &M {
        &self.inner
    }

    /// The wrapped module, mutably.
    pub fn inner_mut(&mut self) -> &mut M {
        &mut self.inner
    }
}

impl<M: Module> Module for Checkpoint<M> {
    fn forward(&self, cx: &mut Cx, inputs: &[Option<Tensor>]) -> Result<Vec<Option<Tensor>>> {
        checkpointed_forward(&self.inner, cx, inputs)
    }

    fn backward(&mut self, cx: &mut Cx, grad_outputs: &[Option<Tensor>]) -> Result<Vec<Option<Tensor>>> {
        checkpointed_backward(&mut self.inner, cx, grad_outputs)
    }

    crate::module::forward_to_inner!(inner);

    fn collectives(&self) -> Option<crate::module::Collectives> {
        self.inner.collectives()
    }
}

/// The forward of a chunk: checkpointed ([`checkpointed_forward`]) or the module's own.
pub(crate) fn forward_of(
    module: &dyn Module,
    checkpointed: bool,
    cx: &mut Cx,
    inputs: &[Option<Tensor>],
) -> Result<Vec<Option<Tensor>>> {
    if checkpointed {
        checkpointed_forward(module, cx, inputs)
    } else {
        module.forward(cx, inputs)
    }
}

/// The forward of `inner` under checkpointing: it runs on a context of its own, and only the
/// inputs and the device RNG state are saved in `cx`. Shared by [`Checkpoint`] and the
/// chunks `GraphOptions::checkpoint` names.
pub(crate) fn checkpointed_forward(
    inner: &dyn Module,
    cx: &mut Cx,
    inputs: &[Option<Tensor>],
) -> Result<Vec<Option<Tensor>>> {
    let rng = cx.device().rng()?;
    let state = rng.save()?;
    let mut inner_cx = cx.clone();
    inner_cx.take_saved();
    let outputs = inner.forward(&mut inner_cx, inputs)?;
    // Only the inputs and the RNG state survive the forward; the inner activations are
    // dropped here, so their memory returns to the pool.
    let mut saved = cx.clone();
    saved.take_saved();
    for t in inputs.iter() {
        match t {
            Some(t) => saved.save(t),
            None => saved.save(&state.tensor().clone()), // placeholder keeps positions
        }
    }
    saved.save(state.tensor());
    *cx = saved;
    Ok(outputs)
}

/// The backward of `inner` under checkpointing: the forward again, with the RNG state it saw,
/// then the whole (unsplit) backward on the recomputed context.
pub(crate) fn checkpointed_backward(
    inner: &mut dyn Module,
    cx: &mut Cx,
    grad_outputs: &[Option<Tensor>],
) -> Result<Vec<Option<Tensor>>> {
    let n = inner.num_inputs();
    let saved = cx.saved_tensors();
    let state = RngState::from_tensor(saved.get(n).cloned().ok_or(SignatureError::NotCheckpointed)?);
    let inputs: Vec<Option<Tensor>> = (0..n).map(|i| saved.get(i).cloned()).collect();
    // Absent optional inputs were saved as placeholders of the state's shape.
    let inputs: Vec<Option<Tensor>> =
        inputs.into_iter().map(|t| t.filter(|t| !t.same_buffer(state.tensor()))).collect();
    let rng = cx.device().rng()?;
    let current = rng.save()?;
    rng.restore(&state)?;
    let mut inner_cx = cx.clone();
    inner_cx.take_saved();
    let recomputed = inner.forward(&mut inner_cx, &inputs);
    // The recompute must not consume random numbers the next forward would draw, and a
    // refused or failed recompute must not leave the generator rewound.
    rng.restore(&current)?;
    recomputed?;
    // The recomputed activations live only inside this backward, so an inner module that
    // splits its backward runs its weight grads here too: a checkpointed module does not
    // split (a `w(c)` entry for it is refused by `make_graphed`).
    crate::module::backward_unsplit(inner, &mut inner_cx, grad_outputs)
}

/// A checkpointed module takes and returns what the module does.
impl<M: crate::TypedModule> crate::TypedModule for Checkpoint<M> {
    type Inputs = M::Inputs;
    type Outputs = M::Outputs;
    type GradOutputs = M::GradOutputs;
    type GradInputs = M::GradInputs;
}

#[diagnostic::do_not_recommend]
impl<M: crate::ChainOut> crate::ChainOut for Checkpoint<M> {}

#[diagnostic::do_not_recommend]
impl<M: crate::ChainIn> crate::ChainIn for Checkpoint<M> {
    type Extra = M::Extra;
}

#[diagnostic::do_not_recommend]
impl<M: crate::ChainLink> crate::ChainLink for Checkpoint<M> {}
