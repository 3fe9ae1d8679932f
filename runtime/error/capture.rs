//! Why a capture ended invalidated ([`Invalidation`], inside
//! [`super::Error::CaptureInvalidated`]) and which node a conditional body may not hold
//! ([`BodyNode`], inside [`super::Error::ConditionalBody`]).

use std::fmt;

/// Why a capture was invalidated, as values a caller can match on. Nothing of the capture
/// is kept: capture again.
///
/// ```
/// use graphed::{Error, Invalidation};
/// let e = Error::CaptureInvalidated { cause: Invalidation::IllegalOperation };
/// assert!(e.to_string().contains("illegal during capture"));
/// ```
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Invalidation {
    /// The driver invalidated the capture: something illegal during a capture ran on the
    /// stream (a synchronous allocation or free, a pageable copy, a synchronize, an event
    /// query; see `graphed::interop`).
    #[error("an operation illegal during capture ran on the stream (a synchronous allocation, a pageable copy, a synchronize or an event query); move it before or after the capture")]
    IllegalOperation,
    /// As [`Invalidation::IllegalOperation`], inside the body of a conditional node.
    #[error("an operation illegal during capture ran on the stream inside a conditional body (Condition::run_if); move it out of the closure")]
    IllegalInConditionalBody,
    /// A conditional body began on a capture the driver had already invalidated.
    #[error("the capture was already invalidated when a conditional body began (an illegal operation ran on the stream before it)")]
    BeforeConditionalBody,
    /// A conditional branch failed inside the capture; on CUDA its node cannot be taken back
    /// out, so the whole capture is discarded.
    #[error("a conditional branch failed inside this capture, and CUDA cannot take its node back out; the graph is discarded: capture again")]
    FailedConditionalBranch,
    /// [`crate::Graph::capture`] grew the pool and captured again, and the pool still did not
    /// hold what the capture allocates.
    #[error("graph `{graph}`: the pool kept growing over {attempts} capture attempts; warm up in the pool first, or capture with CaptureMode::Relaxed")]
    PoolKeptGrowing {
        /// The graph's label.
        graph: String,
        /// The attempts made.
        attempts: usize,
    },
}

/// A node that a conditional body may not hold, in [`super::Error::ConditionalBody`]: bodies
/// hold kernels, copies and memsets only.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum BodyNode {
    /// A memory allocation node.
    MemAlloc {
        /// The node's index in the body.
        index: usize,
    },
    /// A memory free node.
    MemFree {
        /// The node's index in the body.
        index: usize,
    },
    /// A host node.
    Host {
        /// The node's index in the body.
        index: usize,
    },
    /// A node of another kind bodies cannot hold.
    Other {
        /// The node's index in the body.
        index: usize,
    },
    /// A collective (an NCCL kernel, or an emulated rank's collective on the host backend).
    Collective {
        /// The collective's kernel.
        kernel: String,
        /// The node's index in the body.
        index: usize,
    },
    /// Such a node inside a child graph of the body (on CUDA, child graphs are searched too).
    InChildGraph(Box<BodyNode>),
}

impl fmt::Display for BodyNode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BodyNode::MemAlloc { index } => write!(f, "a memory allocation node (node {index})"),
            BodyNode::MemFree { index } => write!(f, "a memory free node (node {index})"),
            BodyNode::Host { index } => write!(f, "a host node (node {index})"),
            BodyNode::Other { index } => write!(f, "a node of a kind bodies cannot hold (node {index})"),
            BodyNode::Collective { kernel, index } => write!(f, "the collective `{kernel}` (node {index})"),
            BodyNode::InChildGraph(node) => write!(f, "{node} of a child graph"),
        }
    }
}
