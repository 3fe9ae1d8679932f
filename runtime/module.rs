//! The type-erased module interface that `#[graphed]` implements and `make_graphed` drives.

use std::any::Any;
use std::fmt;
use std::sync::Arc;

use crate::order_entry::OrderEntry;
use crate::{Cx, Param, Result, Tensor};

/// The four points of an iteration at which capture-time hooks run.
///
/// Per module and iteration the order is: `PreForward`, [forward captured], `Forward`,
/// `PreBackward`, [backward captured], `Backward`. Hooks always run outside any capture.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum HookKind {
    /// Before the forward is run or captured.
    PreForward,
    /// After the forward is run or captured.
    Forward,
    /// Before the backward is run or captured.
    PreBackward,
    /// After the backward is run or captured.
    Backward,
}

impl HookKind {
    /// All kinds, in the order they run within one iteration.
    pub const ALL: [HookKind; 4] = [HookKind::PreForward, HookKind::Forward, HookKind::PreBackward, HookKind::Backward];

    /// The name used in `#[capture_time_hook(...)]`.
    pub fn name(self) -> &'static str {
        match self {
            HookKind::PreForward => "pre_forward",
            HookKind::Forward => "forward",
            HookKind::PreBackward => "pre_backward",
            HookKind::Backward => "backward",
        }
    }
}

/// A module whose forward and backward can be run eagerly or captured into graphs.
///
/// `#[graphed]` implements this for you from a typed `forward`/`backward` pair; implement it by
/// hand only for modules the macro cannot see. Inputs, outputs and grads are positional, with
/// `None` for an absent optional tensor.
pub trait Module: std::any::Any {
    /// A short name for messages and graph labels.
    fn name(&self) -> &'static str;

    /// Number of tensor inputs `forward` takes.
    fn num_inputs(&self) -> usize;

    /// Runs the forward pass; saves what backward needs in `cx`.
    fn forward(&self, cx: &mut Cx, inputs: &[Option<Tensor>]) -> Result<Vec<Option<Tensor>>>;

    /// Runs the backward pass for one forward (the one `cx` saved for): accumulates parameter
    /// grads and returns one grad per forward input (`None` where none is needed).
    fn backward(&mut self, cx: &mut Cx, grad_outputs: &[Option<Tensor>]) -> Result<Vec<Option<Tensor>>>;

    /// Whether the module has a backward at all. `#[graphed]` makes this false for an impl
    /// with a `forward` and no `backward` (an inference module, such as a decoding step over a
    /// KV cache), and [`Module::backward`] is then [`crate::Error::ForwardOnly`]. When no module
    /// of a capture has a backward, `make_graphed` captures forward graphs only, whatever the
    /// mode and whichever tensors need grads; among modules that have one, such a module is
    /// [`crate::SetupError::NoBackward`] when grads are wanted (forward graphs alone would leave
    /// them uncomputed) and a forward-only capture otherwise. Default: true.
    fn has_backward(&self) -> bool {
        true
    }

    /// Whether the module splits its backward: `backward` computes the input grads only and
    /// [`Module::backward_weights`] the weight grads (Transformer Engine's wgrad split). Then a
    /// schedule can run the weight grads as separate steps (`w(c)` in `order`); without such
    /// entries both halves run at the backward, as one. `#[graphed]` sets this when the impl
    /// has a `backward_weights` method. Default: false (`backward` does everything).
    fn splits_backward(&self) -> bool {
        false
    }

    /// The weight-grad half of a split backward, on the context `backward` left for the same
    /// microbatch (save what it needs there, such as the grad outputs): accumulates the
    /// parameter grads. Only called when [`Module::splits_backward`] is true; by default an
    /// error.
    fn backward_weights(&mut self, cx: &mut Cx) -> Result<()> {
        let _ = cx;
        Err(crate::Error::NotDeferred { module: self.name().into() })
    }

    /// Calls `f` with each of the module's parameters and its name. `#[graphed]` forwards this
    /// to the type's [`crate::Parameters`] impl when it has one (`#[derive(Parameters)]`);
    /// otherwise, and by default, a module reports no parameters. (With `Parameters` in scope
    /// too, call it as `Module::visit_params(&m, f)`: both traits have a `visit_params`.)
    fn visit_params(&self, f: &mut dyn FnMut(&str, &Param)) {
        let _ = f;
    }

    /// Whether [`Module::visit_params`] sees the module's parameters (the type derives
    /// [`crate::Parameters`]). When it does not, `make_graphed` cannot tell whether a parameter
    /// needs a grad, so a training-mode capture always captures backward.
    fn exposes_params(&self) -> bool {
        false
    }

    /// Runs the hooks of one kind that the module declares with `#[capture_time_hook]`.
    fn run_hooks(&mut self, kind: HookKind) -> Result<()> {
        let _ = kind;
        Ok(())
    }

    /// The group of ranks this module's collectives go through, if it talks to other ranks
    /// ([`crate::dist::DataParallel`] and [`crate::dist::PipelineStage`] do; a wrapper such as
    /// [`crate::Checkpoint`] forwards its module's). `make_graphed` then checks, before
    /// anything runs, that every rank captures the same schedule, and refuses on every rank
    /// otherwise ([`crate::DistError::ScheduleMismatch`]). Default: none.
    fn collectives(&self) -> Option<Collectives> {
        None
    }
}

/// The [`Module`] methods of a wrapper that only forward to the module it wraps (the field
/// named by the argument): its name and inputs, the parameters it exposes and the capture-time hooks it runs.
/// Used inside an `impl Module` block (`Checkpoint`, `dist::DataParallel`,
/// `dist::PipelineStage`).
macro_rules! forward_to_inner {
    ($inner:ident) => {
        fn name(&self) -> &'static str {
            self.$inner.name()
        }

        fn num_inputs(&self) -> usize {
            self.$inner.num_inputs()
        }

        fn visit_params(&self, f: &mut dyn FnMut(&str, &$crate::Param)) {
            self.$inner.visit_params(f);
        }

        fn exposes_params(&self) -> bool {
            self.$inner.exposes_params()
        }

        fn has_backward(&self) -> bool {
            self.$inner.has_backward()
        }

        fn run_hooks(&mut self, kind: $crate::HookKind) -> $crate::Result<()> {
            self.$inner.run_hooks(kind)
        }
    };
}
pub(crate) use forward_to_inner;

/// A module's backward as one call: its input grads, then, for a module that splits its
/// backward, its weight grads (on the context `backward` left). This is the ordinary, unsplit
/// backward of any module; eager training loops call it instead of `backward`.
pub fn backward_unsplit(
    module: &mut dyn Module,
    cx: &mut Cx,
    grad_outputs: &[Option<Tensor>],
) -> Result<Vec<Option<Tensor>>> {
    let grads = module.backward(cx, grad_outputs)?;
    if module.splits_backward() {
        module.backward_weights(cx)?;
    }
    Ok(grads)
}

/// A module's group of ranks, as [`Module::collectives`] reports it, and how its ranks'
/// captures must agree: all alike (data parallel), or each with its part of a pipeline's
/// order (a [`crate::dist::PipelineStage`]). Made from a communicator by
/// `graphed::dist::Collectives::new` and `::stage`.
///
/// ```
/// use graphed::dist::{self, Collectives};
/// dist::run_emulated(2, |comm| {
///     let c = Collectives::new(comm.clone());
///     assert_eq!(c.communicator().rank(), comm.rank());
///     Ok(())
/// })?;
/// # Ok::<(), graphed::Error>(())
/// ```
#[derive(Clone, Debug)]
pub struct Collectives {
    pub(crate) group: Arc<dyn RankGroup>,
    /// A pipeline stage: what its rank captures.
    pub(crate) stage: Option<Stage>,
}

/// A pipeline stage's part of a capture.
#[derive(Clone, Debug)]
pub(crate) struct Stage {
    /// The order its rank captures (its part of the pipeline's order).
    pub(crate) order: Vec<OrderEntry>,
    /// Which of the rank's chunks it is (0-indexed), when known: its module's place in the
    /// capture.
    pub(crate) chunk: Option<usize>,
    /// The rank's stages, told when their capture begins.
    pub(crate) stages: Option<Arc<dyn StagePlan>>,
}

/// The stages of one rank, as `make_graphed` sees them: told when a capture begins (once the
/// ranks agreed), so their calls follow the rank's plan from its start. `dist`'s pipeline
/// implements it.
pub(crate) trait StagePlan: Send + Sync + fmt::Debug {
    /// A capture begins: calls follow the plan from its start, or, without backwards
    /// (`backward` false), ignore it.
    fn restart(&self, backward: bool);
}

/// What `make_graphed` asks of a group of ranks before it captures, so that this layer names
/// no communicator: `graphed::dist`'s communicator implements it.
pub(crate) trait RankGroup: Any + Send + Sync + fmt::Debug {
    /// Every rank of the group passes its `hash` of `what`; an error on every rank when they
    /// differ (a [`crate::DistError::ScheduleMismatch`]).
    fn check_same(&self, what: &str, hash: u64) -> Result<()>;

    /// Whether `other` is a handle to the same group.
    fn same_group(&self, other: &dyn RankGroup) -> bool;

    /// The group as `Any`, for the communicator's own module to read back.
    fn as_any(&self) -> &dyn Any;
}

/// A typed surface: a struct of tensors that converts to and from the positional slots of
/// [`Module`] (`None` for an absent optional tensor). `#[graphed]` implements it for the
/// surfaces it generates (`XInputs`, `XOutputs`, `XGradOutputs`, `XGradInputs`).
pub trait Slots: Sized {
    /// The slots, in field order.
    fn into_slots(self) -> Vec<Option<Tensor>>;
    /// Reads slots; errors when their number differs or a required tensor is missing.
    fn from_slots(slots: Vec<Option<Tensor>>) -> Result<Self>;
    /// Calls `f` with the slots, in field order. `#[graphed]`'s surfaces lay them out on the
    /// stack, so a graphed call allocates nothing for its arguments.
    fn with_slots<R>(self, f: impl FnOnce(&[Option<Tensor>]) -> R) -> R {
        f(&self.into_slots())
    }
}

/// A module with typed surfaces: what its forward takes and returns and what its backward
/// takes and returns, as structs. `#[graphed]` on an impl implements it; a struct of chunks
/// uses it to type its per-chunk methods (`forward_first(cx, BlockInputs { x })` returns
/// `BlockOutputs`).
pub trait TypedModule: Module {
    /// The forward's tensor arguments.
    type Inputs: Slots;
    /// What the forward returns.
    type Outputs: Slots;
    /// The backward's arguments: one grad per output.
    type GradOutputs: Slots;
    /// What the backward returns: one grad per input.
    type GradInputs: Slots;
    /// Whether [`Module::splits_backward`] is true for every value of the type (a `#[graphed]`
    /// impl with a `backward_weights` method): lets a `#[graphed]` struct check its `w(c)`
    /// entries at compile time.
    const SPLITS_BACKWARD: bool = false;
}

/// No tensors: the extra inputs of a chain link ([`ChainIn::Extra`] of a module whose forward
/// takes one tensor).
impl Slots for () {
    fn into_slots(self) -> Vec<Option<Tensor>> {
        Vec::new()
    }

    fn from_slots(slots: Vec<Option<Tensor>>) -> Result<Self> {
        if slots.is_empty() {
            Ok(())
        } else {
            let got = slots.len();
            Err(crate::SignatureError::Count { module: "()".into(), what: "tensors", expected: 0, got }.into())
        }
    }

    fn with_slots<R>(self, f: impl FnOnce(&[Option<Tensor>]) -> R) -> R {
        f(&[])
    }
}

/// A module whose forward returns exactly one tensor (`Tensor`, not an `Option` or a tuple of
/// several): in a `#[graphed(chained)]` struct that output is the next chunk's input.
/// `#[graphed]` implements it for such modules.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot feed the next chunk of a chained #[graphed] struct",
    label = "its forward must return exactly one `Tensor` (not an `Option` or a tuple): the next chunk's input",
    note = "in a `#[graphed(chained)]` struct, chunk i's output is chunk i + 1's first input, in the same buffer"
)]
pub trait ChainOut: TypedModule {}

/// A module whose forward's first tensor argument is a `&Tensor`: in a `#[graphed(chained)]`
/// struct it takes the previous chunk's output there. Its other arguments are its
/// [`ChainIn::Extra`] inputs, which a chained struct's whole-model `forward` takes for its last
/// chunk (a loss head's labels). `#[graphed]` implements it for such modules, with
/// `Extra = <T>ExtraInputs` (those arguments) or `()` when there are none.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot take the previous chunk's output in a chained #[graphed] struct",
    label = "its forward's first tensor argument must be a `&Tensor`: the previous chunk's output",
    note = "in a `#[graphed(chained)]` struct, chunk i's output is chunk i + 1's first input, in the same buffer"
)]
pub trait ChainIn: TypedModule {
    /// The forward's tensor arguments after the first.
    type Extra: Slots;
}

/// A module that takes exactly one `&Tensor` and returns exactly one `Tensor`: a chunk in the
/// middle of a `#[graphed(chained)]` struct, or a layer of one of its stacks.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be a middle chunk or a stack layer of a chained #[graphed] struct",
    label = "its forward must take exactly one `&Tensor` (the previous chunk's output) and return one `Tensor` (the next chunk's input)",
    note = "only the first chunk's inputs and the last chunk's extra inputs are given to a chained struct's forward"
)]
pub trait ChainLink: ChainIn<Extra = ()> + ChainOut {}
