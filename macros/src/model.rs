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
    /// `buckets(...)`: shape buckets over one axis of the inputs.
    pub buckets: Option<Buckets>,
    /// The path generated code reaches the runtime through (`::graphed` unless overridden).
    pub krate: syn::Path,
}

/// Validated `buckets(...)`, as `graphed::Buckets` is built from it.
pub struct Buckets {
    pub axis: usize,
    pub sizes: BucketSizes,
    /// `(input, value)`: the value each listed input is padded with, in the order written.
    pub pads: Vec<(usize, f32)>,
    /// `above_largest = eager`: a call above the largest bucket runs eagerly (else an error).
    pub eager_above: bool,
}

/// The bucket sizes as written: a list, or a rule the runtime lays out.
pub enum BucketSizes {
    /// `sizes = [..]`, positive, as written (the runtime sorts them).
    List(Vec<usize>),
    /// `sizes = powers_of_two(min = .., max = ..)`: min, 2·min, ... below max, and max.
    PowersOfTwo { min: usize, max: usize },
    /// `sizes = step(by = .., max = ..)`: by, 2·by, ... below max, and max.
    Step { by: usize, max: usize },
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
    /// The impl has no `backward`: an inference module (no grad surfaces, no `backward` on the
    /// wrapper, `Module::has_backward` false). `grad_outputs` and `grad_inputs` are then empty.
    pub forward_only: bool,
    pub hooks: Vec<Hook>,
    /// Whether the impl has a `backward_weights` method (its backward is split).
    pub splits_backward: bool,
}

/// How a field of `#[graphed] struct S { ... }` counts chunks.
#[derive(Clone)]
pub enum Stack {
    /// `field: M`: one chunk.
    Single,
    /// `field: [M; N]`: N consecutive chunks; `len` when N is an integer literal.
    Array { len_expr: syn::Expr, len: Option<usize> },
    /// `field: Vec<M>`: as many consecutive chunks as it holds at construction.
    Vec,
}

/// Which chunks of a field recompute their forward inside their backward.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Checkpointing {
    None,
    /// Every `k`-th layer (1-indexed layers k, 2k, ...); `1`: all (a single field's only one).
    Every(usize),
}

/// One field of `#[graphed] struct S { ... }`: one chunk, or a stack of them.
pub struct Field {
    pub name: Ident,
    /// The field's type as written.
    pub ty: Type,
    /// The module type of its chunks (the element type of a stack).
    pub module: Type,
    pub stack: Stack,
    pub checkpoint: Checkpointing,
}

impl Field {
    /// The number of chunks, when known at compile time.
    pub fn fixed_len(&self) -> Option<usize> {
        match &self.stack {
            Stack::Single => Some(1),
            Stack::Array { len, .. } => *len,
            Stack::Vec => None,
        }
    }

    /// Whether layer `layer` (0-indexed) of the field is checkpointed.
    pub fn checkpoints(&self, layer: usize) -> bool {
        match self.checkpoint {
            Checkpointing::None => false,
            Checkpointing::Every(k) => (layer + 1).is_multiple_of(k),
        }
    }
}

/// The schedule of a struct.
pub enum Order {
    /// A list, checked against the chunks at compile time: `+c` forward of chunk c, `-c` its
    /// backward, `w(c)` its weight grads (a `windowed` schedule of a fixed layout is laid out
    /// into one too).
    List(Vec<Entry>),
    /// `windowed(microbatches = M, in_flight = K)` over chunks counted at construction.
    Windowed { in_flight: usize },
}

/// Everything `expand` needs for `#[graphed(...)] struct S { ... }`.
pub struct StructModel {
    pub options: Options,
    pub vis: Visibility,
    pub ident: Ident,
    pub fields: Vec<Field>,
    /// `chained`: chunk i's output is chunk i + 1's first input.
    pub chained: bool,
    pub order: Option<Order>,
    pub microbatches: usize,
    /// Whether every microbatch's forwards and backwards run through all chunks back to back
    /// (a chained struct then gets whole-model `forward` and `backward`).
    pub whole_chains: bool,
}

impl StructModel {
    /// The number of chunks, when every field's is known at compile time.
    pub fn fixed_chunks(&self) -> Option<usize> {
        self.fields.iter().map(Field::fixed_len).sum()
    }

    /// Each chunk's name (`blocks[2]` for a stack's layer) and field, for a fixed layout.
    pub fn chunk_names(&self) -> Option<Vec<(String, usize, usize)>> {
        let mut names = Vec::new();
        for (index, field) in self.fields.iter().enumerate() {
            match field.stack {
                Stack::Single => names.push((field.name.to_string(), index, 0)),
                _ => {
                    for layer in 0..field.fixed_len()? {
                        names.push((format!("{}[{layer}]", field.name), index, layer));
                    }
                }
            }
        }
        Some(names)
    }
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
