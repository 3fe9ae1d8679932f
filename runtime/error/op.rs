//! `OpError`: an op, a tensor constructor or a generation call that refuses the value of one of
//! its arguments (shapes and dtypes have their own variants), inside [`super::Error::Op`].

/// What an op refused in its arguments' values, as values a caller can match on. Every op
/// checks before it launches anything: a refused call changes nothing.
///
/// ```
/// use graphed::{ops, Device, Error, OpError, Tensor};
/// let dev = Device::host();
/// let (x, g) = (Tensor::zeros(&dev, &[2, 4])?, Tensor::full(&dev, &[4], 1.0)?);
/// let e = ops::rms_norm(&x, &g, -1.0).unwrap_err();
/// assert!(matches!(e, Error::Op(OpError::Eps { op: "rms_norm", .. })));
/// # Ok::<(), graphed::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum OpError {
    /// A normalisation's `eps` that is negative, NaN or infinite.
    #[error("{op}: eps = {eps} must be finite and at least 0")]
    Eps {
        /// The op.
        op: &'static str,
        /// The value given.
        eps: f32,
    },
    /// A dropout probability outside `[0, 1)`.
    #[error("dropout: p = {p} must be in [0, 1) (the probability of zeroing an element)")]
    DropoutP {
        /// The value given.
        p: f32,
    },
    /// A label that is neither a class id in `0..classes` nor [`crate::ops::IGNORE_LABEL`].
    #[error(
        "{op}: label {label} of row {row} is not a class id in 0..{classes} (nor ops::IGNORE_LABEL); fix the labels"
    )]
    Label {
        /// The op.
        op: &'static str,
        /// The label.
        label: f32,
        /// Its row.
        row: usize,
        /// The number of classes.
        classes: usize,
    },
    /// `ops::linear_fused` with a bias the epilogue does not take, or without one it needs.
    #[error("linear_fused: Epilogue::{epilogue} {}", if *.needs_bias { "needs a bias; pass Some(b)" } else { "takes no bias; pass None, or use Epilogue::BiasGelu" })]
    EpilogueBias {
        /// The epilogue's name.
        epilogue: &'static str,
        /// Whether it needs a bias (none was given) or takes none (one was given).
        needs_bias: bool,
    },
    /// A size past what the kernels, cuBLAS or a launch can index: an element count above
    /// 2³², a GEMM dimension above `i32::MAX`, a batch above the grid's 65535, ...
    #[error("{op}: {what} {got} is above {max}, the most its kernels can index; split the work into smaller pieces")]
    TooLarge {
        /// The op.
        op: &'static str,
        /// What is too large.
        what: &'static str,
        /// The size given.
        got: usize,
        /// The largest size supported.
        max: usize,
    },
    /// `Generation::new` with no sequences, no tokens, or more tokens in all than an `i32`
    /// counts.
    #[error(
        "Generation::new: {batch} sequences of {max_new} tokens; both must be nonzero and their product below 2^31"
    )]
    GenerationSize {
        /// The sequences asked for.
        batch: usize,
        /// The tokens per sequence asked for.
        max_new: usize,
    },
    /// `Generation::start` with more limits than sequences.
    #[error("Generation::start: {limits} limits for {batch} sequences; give at most one per sequence")]
    GenerationLimits {
        /// The limits given.
        limits: usize,
        /// The sequences.
        batch: usize,
    },
    /// `Generation::start` with a limit above the tokens a sequence can hold.
    #[error("Generation::start: a limit of {limit} tokens is above max_new = {max_new}")]
    GenerationLimit {
        /// The limit.
        limit: usize,
        /// The tokens a sequence holds.
        max_new: usize,
    },
    /// `Generation::prefix` of no sequences, or of more than there are.
    #[error("Generation::prefix: {batch} of {sequences} sequences; take 1..={sequences}")]
    GenerationPrefix {
        /// The sequences asked for.
        batch: usize,
        /// The sequences there are.
        sequences: usize,
    },
}

/// Why fused attention does not run on this device although its dtype and head dimension are
/// supported, in [`super::Error::AttentionUnsupported`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum AttentionLimit {
    /// The GPU lacks what the portable kernels need: compute capability 8.0 and the shared
    /// memory of their tiles.
    Gpu {
        /// The GPU's compute capability (major, minor).
        capability: (u32, u32),
        /// Bytes of shared memory a block may use on it.
        shared_bytes: usize,
        /// Bytes of shared memory a block of the kernels needs.
        needed_bytes: usize,
    },
    /// `AttentionEngine::Cudnn` was asked for, and cuDNN's fused attention does not run the
    /// call here.
    Cudnn,
    /// `AttentionEngine::Hopper` was asked for, and its backward does not run the call here:
    /// it needs an sm_90 GPU (H100, H200) and head dim 64.
    Hopper {
        /// The GPU's compute capability (major, minor).
        capability: (u32, u32),
    },
}

impl std::fmt::Display for AttentionLimit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {
            AttentionLimit::Gpu { capability: (major, minor), shared_bytes, needed_bytes } => write!(
                f,
                "this GPU is sm_{major}{minor} with {} KB of shared memory a block, the kernels need sm_80 and {} KB",
                shared_bytes / 1024,
                needed_bytes.div_ceil(1024)
            ),
            AttentionLimit::Cudnn => f.write_str(
                "cuDNN's fused attention does not run it here (it needs libcudnn 9.10 or newer on the library path, \
                 equal query and key/value head counts, and an engine for the shape)",
            ),
            AttentionLimit::Hopper { capability: (major, minor) } => write!(
                f,
                "graphed's Hopper attention backward does not run it here (it needs sm_90 and head dim 64; this GPU is sm_{major}{minor})"
            ),
        }
    }
}
