//! What a capture is made of: the capture mode and the nodes of a captured graph.

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
