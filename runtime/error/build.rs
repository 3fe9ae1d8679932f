//! Constructors and helpers of [`Error`].

use std::fmt;

use super::{CudaFailure, Error};

impl Error {
    /// A failed CUDA library call.
    pub(crate) fn cuda(call: &'static str, source: impl Into<CudaFailure>) -> Error {
        Error::Cuda { call, source: source.into() }
    }

    /// Wraps this error with a line of context.
    pub fn context(self, context: impl fmt::Display) -> Error {
        Error::Context { context: context.to_string(), source: Box::new(self) }
    }

    /// A user-level error with a message.
    pub fn msg(message: impl fmt::Display) -> Error {
        Error::Msg(message.to_string())
    }

    pub(crate) fn shape(op: &'static str, detail: impl fmt::Display) -> Error {
        Error::Shape { op, detail: detail.to_string() }
    }

    pub(crate) fn invalid(op: &'static str, detail: impl fmt::Display) -> Error {
        Error::InvalidArgument { op, detail: detail.to_string() }
    }

    /// The innermost error, under any layers of context.
    pub fn root(&self) -> &Error {
        match self {
            Error::Context { source, .. } => source.root(),
            other => other,
        }
    }
}
