//! `GraphError`: what can go wrong building or inspecting a graph beyond capture order and
//! state (which have variants of their own in [`super::Error`]), inside
//! [`super::Error::Graph`].

/// A graph that cannot be built or dumped, as values a caller can match on.
///
/// ```
/// use graphed::{CaptureMode, Device, Error, Graph, GraphError};
/// let dev = Device::host();
/// let mut g = Graph::new(&dev);
/// g.capture(CaptureMode::Global, || Ok(()))?;
/// let e = g.debug_dump("/nonexistent-dir/graph.dot").unwrap_err();
/// assert!(matches!(e, Error::Graph(GraphError::DebugDump { kind: std::io::ErrorKind::NotFound, .. })));
/// # Ok::<(), graphed::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum GraphError {
    /// [`crate::Graph::debug_dump`] could not write its file (the OS refused, or the path
    /// holds a NUL byte).
    #[error("debug_dump: writing {path}: {detail}")]
    DebugDump {
        /// The file.
        path: String,
        /// The OS error's kind.
        kind: std::io::ErrorKind,
        /// The OS's message.
        detail: String,
    },
    /// The driver added a conditional node but gave it no body graph.
    #[error("cuGraphAddNode returned a conditional node without a body graph; the driver misbehaved: update it, or do without conditional nodes (Condition::run_if, Graph::while_loop, Graph::if_then)")]
    ConditionalWithoutBody,
    /// A [`crate::Condition`] branch that the backend did not run although it reported
    /// success (a bug in graphed: please report it).
    #[error(
        "{op}: a branch was not run, yet the capture reported success; this is a bug in graphed, please report it"
    )]
    BranchNotRun {
        /// The call.
        op: &'static str,
    },
}

impl GraphError {
    /// [`GraphError::DebugDump`] for `path`.
    pub(crate) fn debug_dump(path: &std::path::Path, e: &std::io::Error) -> GraphError {
        GraphError::DebugDump { path: path.display().to_string(), kind: e.kind(), detail: e.to_string() }
    }
}
