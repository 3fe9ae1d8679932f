//! `CaptureError`: a failed capture hands the modules back with the error.

use crate::Error;

/// A failed capture: the error, and the modules, handed back unchanged so the caller can fix
/// the cause and capture again (like [`std::sync::PoisonError::into_inner`]).
///
/// Converts into [`Error`] with `?` (dropping the modules).
///
/// ```
/// use graphed::{make_graphed, CaptureError, Device, GraphOptions, Module};
/// let dev = Device::host();
/// let modules: Vec<Box<dyn Module>> = Vec::new();
/// let err: CaptureError<_> = make_graphed(modules, vec![], GraphOptions::new()).unwrap_err();
/// assert!(matches!(err.error(), graphed::Error::Setup(graphed::SetupError::NoModules)));
/// let modules = err.into_inner(); // nothing is lost
/// assert!(modules.is_empty());
/// ```
pub struct CaptureError<M> {
    /// Boxed, so that a `Result` carrying the modules stays small.
    error: Box<Error>,
    modules: M,
}

impl<M> CaptureError<M> {
    /// An error with the modules it hands back.
    pub fn new(error: Error, modules: M) -> CaptureError<M> {
        CaptureError { error: Box::new(error), modules }
    }

    /// What went wrong.
    pub fn error(&self) -> &Error {
        &self.error
    }

    /// The modules, unchanged.
    pub fn into_inner(self) -> M {
        self.modules
    }

    /// The error and the modules.
    pub fn into_parts(self) -> (Error, M) {
        (*self.error, self.modules)
    }

    /// The same error with the modules turned into another form (a typed wrapper's module).
    pub fn map<N>(self, f: impl FnOnce(M) -> N) -> CaptureError<N> {
        CaptureError { error: self.error, modules: f(self.modules) }
    }
}

impl<M> std::fmt::Debug for CaptureError<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CaptureError").field("error", &self.error).finish_non_exhaustive()
    }
}

impl<M> std::fmt::Display for CaptureError<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "capture failed (the modules are handed back): {}", self.error)
    }
}

impl<M> std::error::Error for CaptureError<M> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(self.error.as_ref())
    }
}

impl<M> From<CaptureError<M>> for Error {
    fn from(e: CaptureError<M>) -> Error {
        *e.error
    }
}
