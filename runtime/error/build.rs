//! Constructors and helpers of [`Error`].

use std::fmt;

use super::{CudaFailure, Error, ShapeProblem};

impl Error {
    /// A failed CUDA library call.
    pub(crate) fn cuda(call: &'static str, source: impl Into<CudaFailure>) -> Error {
        Error::Cuda { call, source: source.into() }
    }

    /// Wraps this error with a line of context.
    pub fn context(self, context: impl fmt::Display) -> Error {
        Error::Context { context: context.to_string(), source: Box::new(self) }
    }

    /// An error of your own code with a message ([`Error::Msg`]); graphed itself never
    /// returns one.
    pub fn msg(message: impl fmt::Display) -> Error {
        Error::Msg(message.to_string())
    }

    /// [`Error::Shape`]: `op` refused shapes that do not fit as `problem` says.
    pub(crate) fn shape(op: &'static str, problem: ShapeProblem) -> Error {
        Error::Shape { op, problem }
    }

    /// The cache error for `length` of `sequence`: [`Error::CacheFull`] when `kv_cache_append`
    /// found a full cache, [`Error::CacheLengthOutOfRange`] otherwise.
    pub(crate) fn cache_length(op: &'static str, sequence: usize, length: i32, max_len: usize) -> Error {
        if op == "kv_cache_append" && length >= 0 && length as usize == max_len {
            Error::CacheFull { op, sequence, max_len }
        } else {
            Error::CacheLengthOutOfRange { op, sequence, length: length as i64, max_len }
        }
    }

    /// The innermost error, under any layers of context.
    pub fn root(&self) -> &Error {
        match self {
            Error::Context { source, .. } => source.root(),
            other => other,
        }
    }
}
