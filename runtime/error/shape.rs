//! `ShapeProblem`: how the shapes given to an op, a tensor constructor or a collective do not
//! fit, inside [`super::Error::Shape`] (which names the op).

/// How shapes do not fit, as values a caller can match on. Dimensions are listed outermost
/// first, as [`crate::Tensor::dims`] gives them.
///
/// ```
/// use graphed::{ops, Device, Error, ShapeProblem, Tensor};
/// let dev = Device::host();
/// let (x, w) = (Tensor::zeros(&dev, &[2, 3])?, Tensor::zeros(&dev, &[4, 5])?);
/// let e = ops::linear(&x, &w, None).unwrap_err();
/// assert!(matches!(e, Error::Shape { op: "linear", problem: ShapeProblem::Axis { arg: "x", expected: 5, .. } }));
/// # Ok::<(), graphed::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ShapeProblem {
    /// A tensor whose dimensions do not follow the layout the op takes (their number, or a
    /// dimension that must not be zero).
    #[error("{arg} must be {expected}, got {got:?}")]
    Layout {
        /// The argument.
        arg: &'static str,
        /// The layout it takes, such as `[batch, seq, width]`.
        expected: &'static str,
        /// Its dimensions.
        got: Vec<usize>,
    },
    /// A tensor whose shape follows from the op's other arguments, but is another.
    #[error("{arg} must be {expected:?}{}, got {got:?}", if from.is_empty() { String::new() } else { format!(" ({from})") })]
    Expected {
        /// The argument.
        arg: &'static str,
        /// The shape it must have.
        expected: Vec<usize>,
        /// What that shape follows from, such as `one per sequence` (empty when the op's
        /// signature says it all).
        from: &'static str,
        /// Its dimensions.
        got: Vec<usize>,
    },
    /// Two tensors that must have one shape.
    #[error("{arg} {got:?} must have {like}'s shape {expected:?}")]
    Same {
        /// The argument.
        arg: &'static str,
        /// Its dimensions.
        got: Vec<usize>,
        /// The argument whose shape it must have.
        like: &'static str,
        /// That argument's dimensions.
        expected: Vec<usize>,
    },
    /// Two tensors that must have one shape, neither of them named.
    #[error("{a:?} and {b:?} must match")]
    Differ {
        /// One tensor's dimensions.
        a: Vec<usize>,
        /// The other's.
        b: Vec<usize>,
    },
    /// A view larger than the buffer it would look into.
    #[error("{got:?} does not fit in {within:?}")]
    Prefix {
        /// The view's dimensions.
        got: Vec<usize>,
        /// The tensor's dimensions.
        within: Vec<usize>,
    },
    /// A size along one axis that another argument fixes (the features of a linear layer's
    /// input, say).
    #[error("{arg} {got:?} has {} along axis {axis}, but {from} needs {expected}", got.get(*axis).copied().unwrap_or(0))]
    Axis {
        /// The argument.
        arg: &'static str,
        /// Its dimensions.
        got: Vec<usize>,
        /// The axis.
        axis: usize,
        /// The size needed there.
        expected: usize,
        /// The argument that fixes it.
        from: &'static str,
    },
    /// Attention heads that cannot share key and value heads evenly.
    #[error("kv_heads = {kv_heads} must divide heads = {heads} (both nonzero)")]
    Heads {
        /// The query heads.
        heads: usize,
        /// The key and value heads.
        kv_heads: usize,
    },
    /// An attention input whose width is not a multiple of the heads, or with no rows.
    #[error("{arg} {got:?}: seq must be nonzero and the width a nonzero multiple of heads = {heads} (and batch nonzero, for fused attention)")]
    Width {
        /// The argument.
        arg: &'static str,
        /// Its dimensions (`[batch, seq, width]`).
        got: Vec<usize>,
        /// The heads.
        heads: usize,
    },
    /// A decode query that does not fit the KV cache: `[batch, heads, head_dim]` with the
    /// cache's batch and head dimension, and heads a multiple of its key and value heads.
    #[error("q must be [{batch}, heads, {head_dim}] with heads a nonzero multiple of kv_heads = {kv_heads} (at most 65535), got {got:?}")]
    Query {
        /// The query's dimensions.
        got: Vec<usize>,
        /// The cache's sequences.
        batch: usize,
        /// The cache's head dimension.
        head_dim: usize,
        /// The cache's key and value heads.
        kv_heads: usize,
    },
    /// A head dimension past what the decode kernels hold in registers.
    #[error("head_dim {head_dim} is above the {max} the decode kernels hold in registers")]
    HeadDim {
        /// The cache's head dimension.
        head_dim: usize,
        /// The largest the kernels take.
        max: usize,
    },
    /// Keys or values to append that do not fit the KV cache: `[batch, seq, kv_heads,
    /// head_dim]` with the cache's sizes and `seq` at most its positions.
    #[error("k must be [{batch}, seq, {kv_heads}, {head_dim}] with seq at most max_len = {max_len}, got {got:?}")]
    Append {
        /// Their dimensions.
        got: Vec<usize>,
        /// The cache's sequences.
        batch: usize,
        /// The cache's key and value heads.
        kv_heads: usize,
        /// The cache's head dimension.
        head_dim: usize,
        /// The cache's positions per sequence.
        max_len: usize,
    },
    /// More dimensions than a tensor holds ([`crate::MAX_RANK`]).
    #[error("{got:?} has more than {max} dimensions")]
    Rank {
        /// The dimensions given.
        got: Vec<usize>,
        /// The most a tensor has.
        max: usize,
    },
    /// A number of values (or elements) that is not what the shape holds.
    #[error("{got} {what} for a shape of {expected} elements {dims:?}")]
    Elements {
        /// What was counted: `values`, `elements of the slice`, ...
        what: &'static str,
        /// How many there are.
        got: usize,
        /// The shape.
        dims: Vec<usize>,
        /// How many the shape holds.
        expected: usize,
    },
    /// A collective's output or input whose elements are not the ranks' parts together.
    #[error("{arg} has {got} elements, but {ranks} ranks of {part} each make {}", ranks.saturating_mul(*part))]
    Ranks {
        /// The argument.
        arg: &'static str,
        /// Its elements.
        got: usize,
        /// The ranks.
        ranks: usize,
        /// Each rank's part.
        part: usize,
    },
    /// A parameter to shard whose elements the ranks cannot split evenly.
    #[error("parameter `{param}` has {elements} elements, not a multiple of {ranks} ranks; pad it")]
    Shard {
        /// The parameter's name.
        param: String,
        /// Its elements.
        elements: usize,
        /// The ranks.
        ranks: usize,
    },
    /// An element index past a tensor's elements.
    #[error("element {index} of a tensor of shape {got:?}, which has {}", elements(got))]
    Index {
        /// The index.
        index: usize,
        /// The tensor's dimensions.
        got: Vec<usize>,
    },
}

impl ShapeProblem {
    /// [`ShapeProblem::Rank`] for `got`, past [`crate::MAX_RANK`].
    pub(crate) fn rank(got: &[usize]) -> ShapeProblem {
        ShapeProblem::Rank { got: got.to_vec(), max: crate::MAX_RANK }
    }

    /// [`ShapeProblem::Elements`]: `got` values for `dims`.
    pub(crate) fn values(got: usize, dims: &[usize]) -> ShapeProblem {
        ShapeProblem::elements("values", got, dims)
    }

    /// [`ShapeProblem::Elements`]: `got` of `what` for `dims`.
    pub(crate) fn elements(what: &'static str, got: usize, dims: &[usize]) -> ShapeProblem {
        ShapeProblem::Elements { what, got, dims: dims.to_vec(), expected: elements(dims) }
    }

    /// [`ShapeProblem::Layout`] for `arg` of dimensions `got`.
    pub(crate) fn layout(arg: &'static str, expected: &'static str, got: &[usize]) -> ShapeProblem {
        ShapeProblem::Layout { arg, expected, got: got.to_vec() }
    }

    /// [`ShapeProblem::Same`]: `arg` of dimensions `got` must have `like`'s, `expected`.
    pub(crate) fn same(arg: &'static str, got: &[usize], like: &'static str, expected: &[usize]) -> ShapeProblem {
        ShapeProblem::Same { arg, got: got.to_vec(), like, expected: expected.to_vec() }
    }

    /// [`ShapeProblem::Expected`]: `arg` of dimensions `got` must be `expected`.
    pub(crate) fn expected(arg: &'static str, expected: &[usize], from: &'static str, got: &[usize]) -> ShapeProblem {
        ShapeProblem::Expected { arg, expected: expected.to_vec(), from, got: got.to_vec() }
    }
}

/// The elements of `dims`, `usize::MAX` past what a `usize` counts.
fn elements(dims: &[usize]) -> usize {
    crate::shape::checked_product(dims).unwrap_or(usize::MAX)
}
