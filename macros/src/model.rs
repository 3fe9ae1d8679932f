//! The models `validate` builds and `expand` reads: plain data, no checks (thiserror's ast.rs
//! next to its valid.rs).

use proc_macro2::Span;
use syn::{Ident, Type, Visibility};

use crate::parse::HookKind;

/// The default number of eager warm-up iterations, as in PyTorch's `make_graphed_callables`.
pub const DEFAULT_WARMUP: usize = 3;

/// Options shared by both forms of `#[graphed]`.
pub struct Options {
    pub warmup: usize,
    pub allow_unused_input: bool,
    /// The path generated code reaches the runtime through (`::graphed` unless overridden).
    pub krate: syn::Path,
}

/// Whether a tensor slot may be absent.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Slot {
    /// `&Tensor` / `Tensor`.
    Required,
    /// `Option<&Tensor>` / `Option<Tensor>`.
    Optional,
}

/// A tensor argument of the user's `forward` or `backward`.
pub struct TensorArg {
    /// The argument's name, or `input_<i>` / `grad_<i>` for a pattern that is not a name.
    pub name: Ident,
    pub slot: Slot,
    /// The type as the user wrote it (reused in the wrapper's signature).
    pub ty: Type,
}

/// A returned list of tensors: a single one or a tuple.
pub struct Returned {
    pub slots: Vec<Slot>,
    /// Whether it is written as a tuple (`(Tensor,)` is a tuple of one).
    pub tuple: bool,
    /// The `T` of `Result<T>` as the user wrote it.
    pub ty: Type,
}

/// A method marked `#[capture_time_hook]`.
pub struct Hook {
    pub method: Ident,
    pub kind: HookKind,
    pub prepend: bool,
}

/// Everything `expand` needs for `#[graphed] impl T { ... }`.
pub struct ModuleModel {
    pub options: Options,
    /// The visibility of the user's `forward`, given to every generated item.
    pub vis: Visibility,
    pub self_ty: Type,
    pub ident: Ident,
    pub inputs: Vec<TensorArg>,
    pub outputs: Returned,
    pub grad_outputs: Vec<TensorArg>,
    pub grad_inputs: Returned,
    pub hooks: Vec<Hook>,
    /// Whether the impl has a `backward_weights` method (its backward is split).
    pub splits_backward: bool,
}

/// One chunk of `#[graphed] struct S { ... }`: a field.
pub struct Chunk {
    pub name: Ident,
    pub ty: Type,
}

/// Everything `expand` needs for `#[graphed(order = [...])] struct S { ... }`.
pub struct StructModel {
    pub options: Options,
    pub vis: Visibility,
    pub ident: Ident,
    pub chunks: Vec<Chunk>,
    /// The schedule, when given: `+c` forward of chunk c, `-c` its backward, `w(c)` its
    /// weight grads.
    pub order: Option<Vec<Entry>>,
    pub microbatches: usize,
}

/// What an `order` entry runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pass {
    /// `c`: the forward.
    Forward,
    /// `-c`: the backward (input grads only when the chunk has `w(c)` entries).
    Backward,
    /// `w(c)`: the weight grads.
    Wgrad,
}

/// One validated `order` entry.
#[derive(Clone, Copy)]
pub struct Entry {
    pub pass: Pass,
    /// 1-indexed.
    pub chunk: usize,
    /// Where it was written (compile-time checks in the expansion point here).
    pub span: Span,
}
