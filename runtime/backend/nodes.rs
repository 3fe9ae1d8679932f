//! What a capture is made of: the capture mode and the nodes of a captured graph.

use crate::error::BodyNode;

/// How strictly CUDA guards a capture against unsafe calls from other threads
/// (`cudaStreamCaptureMode`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum CaptureMode {
    /// Unsafe calls (`cuMemAlloc`, synchronizing calls) from any thread are refused while any
    /// thread captures. PyTorch's default.
    #[default]
    Global,
    /// Only this thread's unsafe calls are refused.
    ThreadLocal,
    /// Nothing is refused; the pool may grow with `cuMemAlloc` during capture.
    Relaxed,
}

/// The kind of a graph node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NodeKind {
    /// A kernel launch (on the host backend: a recorded op).
    Kernel,
    /// A memory copy.
    Memcpy,
    /// A memset.
    Memset,
    /// An empty node.
    Empty,
    /// A graph memory allocation.
    MemAlloc,
    /// A graph memory free.
    MemFree,
    /// A host function.
    Host,
    /// A child graph (a fused step's parts).
    ChildGraph,
    /// A conditional node (`ConditionalGraph`): WHILE or IF over a body graph.
    Conditional,
    /// Anything else.
    Other,
}

/// One node of a captured graph.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GraphNode {
    /// Position in the node list.
    pub index: usize,
    /// What the node does.
    pub kind: NodeKind,
    /// The kernel's name, for kernel nodes.
    pub kernel: Option<String>,
    /// Indices of the nodes this one waits for.
    pub dependencies: Vec<usize>,
}

/// The names of the host backend's recorded collectives (`dist`'s emulated ranks): a
/// conditional body may not hold them, as it may not hold NCCL kernels.
const HOST_COLLECTIVES: [&str; 7] =
    ["all_reduce", "all_reduce_bucket", "all_gather", "reduce_scatter", "broadcast", "send", "recv"];

impl GraphNode {
    /// Why this node cannot be in the body of a conditional node, if it cannot: memory
    /// allocation and free nodes, host nodes, collectives (NCCL kernels, the host backend's
    /// emulated ones) and the kinds CUDA does not allow there (events and the like).
    pub(crate) fn conditional_body_violation(&self) -> Option<BodyNode> {
        let (kernel, index) = (self.kernel.as_deref().unwrap_or("?"), self.index);
        match self.kind {
            NodeKind::MemAlloc => Some(BodyNode::MemAlloc { index }),
            NodeKind::MemFree => Some(BodyNode::MemFree { index }),
            NodeKind::Host => Some(BodyNode::Host { index }),
            NodeKind::Other => Some(BodyNode::Other { index }),
            NodeKind::Kernel if kernel.starts_with("nccl") || HOST_COLLECTIVES.contains(&kernel) => {
                Some(BodyNode::Collective { kernel: kernel.to_string(), index })
            }
            _ => None,
        }
    }
}
