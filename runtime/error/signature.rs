//! `SignatureError`: tensors given to or returned by a module that do not fit its declared
//! interface (a `#[graphed]` signature, `Module`'s one grad per input, the tensors its
//! forward saved for its backward), inside [`super::Error::Signature`].

/// A module call whose tensors do not fit the module's declared interface, as values a
/// caller can match on.
///
/// ```
/// use graphed::{Error, SignatureError};
/// let e = Error::from(SignatureError::Count { module: "Block".into(), what: "inputs", expected: 1, got: 2 });
/// assert!(matches!(e, Error::Signature(SignatureError::Count { expected: 1, got: 2, .. })));
/// ```
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SignatureError {
    /// Another number of tensors than the signature declares.
    #[error("graphed module `{module}`: expected {expected} {what}, got {got}")]
    Count {
        /// The module.
        module: String,
        /// Which tensors: inputs, grad outputs, outputs, grad inputs, microbatches.
        what: &'static str,
        /// How many the signature declares.
        expected: usize,
        /// How many there were.
        got: usize,
    },
    /// `None` for an argument declared `&Tensor`.
    #[error("graphed module `{module}`: `{what}` is a required tensor but got None")]
    Required {
        /// The module.
        module: String,
        /// The argument.
        what: &'static str,
    },
    /// `None` for a result declared `Tensor`.
    #[error("graphed module `{module}`: {what} is declared `Tensor` but is None")]
    DeclaredTensor {
        /// The module.
        module: String,
        /// The result.
        what: &'static str,
    },
    /// A backward (captured by `make_graphed`) that returned another number of grads than
    /// its forward takes inputs.
    #[error("graphed module `{module}`: backward returned {got} grads for {inputs} inputs; return one per input (None where there is none)")]
    GradCount {
        /// The module.
        module: String,
        /// The inputs its forward takes.
        inputs: usize,
        /// The grads its backward returned.
        got: usize,
    },
    /// [`crate::Cx::saved`] asked for a tensor past those the forward of the context saved.
    #[error("Cx::saved({index}): only {saved} tensors were saved by the forward of this context; save it there (Cx::save) or ask for one of those")]
    Saved {
        /// The position asked for.
        index: usize,
        /// The tensors saved.
        saved: usize,
    },
    /// A checkpointed backward on a context whose forward did not run under
    /// [`crate::Checkpoint`] (so it holds no RNG state to recompute with).
    #[error("Checkpoint::backward: the forward of this context did not run under Checkpoint; run the forward through the same Checkpoint")]
    NotCheckpointed,
}
