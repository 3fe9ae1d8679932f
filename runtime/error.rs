//! The one error type of the crate.

use std::fmt;

/// Everything that can go wrong in `graphed`, as values a caller can match on.
///
/// Every message says what went wrong and, where there is one, what to do about it.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// CUDA was asked for explicitly but is not usable here.
    #[error(
        "CUDA is not available: {reason}. Use Device::host(), or Device::default_device() to fall back automatically"
    )]
    CudaUnavailable {
        /// Why CUDA could not be used.
        reason: String,
    },
    /// A CUDA driver, NVRTC or cuBLAS call failed.
    #[error("CUDA call `{call}` failed: {message}")]
    Cuda {
        /// The call that failed.
        call: &'static str,
        /// The driver's description of the error.
        message: String,
    },
    /// An operation that is illegal while a stream is being captured.
    #[error("`{op}` is illegal while the stream is capturing a graph; do it before capture begins or after it ends")]
    IllegalDuringCapture {
        /// The offending operation.
        op: &'static str,
    },
    /// Shapes that do not fit together.
    #[error("{op}: shape mismatch: {detail}")]
    Shape {
        /// The operation that rejected the shapes.
        op: &'static str,
        /// The shapes involved.
        detail: String,
    },
    /// A dtype the operation does not support.
    #[error("{op}: dtype {got:?} is not supported here (expected {expected:?})")]
    DType {
        /// The operation.
        op: &'static str,
        /// The dtype it got.
        got: crate::DType,
        /// The dtype it needs.
        expected: crate::DType,
    },
    /// Tensors from different devices were mixed in one operation.
    #[error("{op}: tensors live on different devices ({a} and {b}); copy them to one device first")]
    DeviceMismatch {
        /// The operation.
        op: &'static str,
        /// One device.
        a: String,
        /// The other device.
        b: String,
    },
    /// An argument out of its valid range (a label, a probability, a length).
    #[error("{op}: invalid argument: {detail}")]
    InvalidArgument {
        /// The operation.
        op: &'static str,
        /// What is wrong with it.
        detail: String,
    },
    /// A handle to a static buffer that a later graph replay has overwritten.
    #[error("stale tensor: this handle to the static buffer of `{owner}` was overwritten by a later replay (generation {held}, buffer now at {current}); clone the tensor (Tensor::deep_clone) before the next call if you need to keep it")]
    StaleTensor {
        /// The graph surface the buffer belongs to.
        owner: String,
        /// The generation the handle was issued at.
        held: u64,
        /// The buffer's generation now.
        current: u64,
    },
    /// Graphs sharing a pool were replayed out of their capture order.
    #[error("replay order: `{got}` was replayed but `{expected}` is next; graphs that share a pool must replay in capture order ({order}), or memory reused between them would be corrupted")]
    ReplayOrder {
        /// The graph that was replayed.
        got: String,
        /// The graph that should have come next.
        expected: String,
        /// The full capture order.
        order: String,
    },
    /// A graph operation in the wrong state (replay before capture, a second begin, ...).
    #[error("graph: {0}")]
    GraphState(String),
    /// A capture-time hook or user code returned an error; the capture was ended cleanly.
    #[error("{context}: {source}")]
    Context {
        /// Where it happened.
        context: String,
        /// The underlying error.
        #[source]
        source: Box<Error>,
    },
    /// A graphed module was called in a way its capture does not allow.
    #[error("graphed module `{module}`: {detail}")]
    Graphed {
        /// The module.
        module: String,
        /// What was wrong.
        detail: String,
    },
    /// The pool had to grow while a global or thread-local capture was in progress.
    #[error("the graph pool needs {bytes} more bytes during a capture, and allocating would invalidate a global or thread-local capture; make_graphed retries after growing the pool, raw captures should warm up in the pool first or use CaptureMode::Relaxed")]
    PoolGrowthDuringCapture {
        /// The size of the block that did not fit.
        bytes: usize,
    },
    /// A user-defined failure (from a hook or a module body).
    #[error("{0}")]
    Msg(String),
    // Custom kernels, interop, parameters (#11).
    /// A custom kernel's declaration is unusable (bad entry name, source or signature).
    #[error("kernel `{kernel}`: {detail}; fix the Kernel::new arguments")]
    KernelDefinition {
        /// The kernel's entry name.
        kernel: String,
        /// What is wrong with the declaration.
        detail: String,
    },
    /// NVRTC rejected a custom kernel's source.
    #[error("kernel `{kernel}` failed to compile for {device}; fix the CUDA source. NVRTC log:\n{log}")]
    KernelCompile {
        /// The kernel's entry name.
        kernel: String,
        /// The device it was compiled for.
        device: String,
        /// NVRTC's log (or the loader's message when the module did not load).
        log: String,
    },
    /// A custom kernel's first use on a device came while the device was capturing.
    #[error("kernel `{kernel}` is used for the first time on {device} inside a graph capture, where it cannot be compiled; warm up first: call kernel.compile(&device) or run it eagerly once before capturing")]
    KernelNotCompiled {
        /// The kernel's entry name.
        kernel: String,
        /// The capturing device.
        device: String,
    },
    /// A launch passed a different number of arguments than the kernel declares.
    #[error("kernel `{kernel}`: launched with {got} arguments but its signature declares {expected}; pass one argument per declared Arg")]
    KernelArgCount {
        /// The kernel's entry name.
        kernel: String,
        /// Arguments declared.
        expected: usize,
        /// Arguments passed.
        got: usize,
    },
    /// A launch argument of the wrong kind for its position.
    #[error("kernel `{kernel}`: argument {position} is {got:?} but the signature declares {expected:?}; pass the declared kind")]
    KernelArgKind {
        /// The kernel's entry name.
        kernel: String,
        /// The argument's position (0-based).
        position: usize,
        /// The declared kind.
        expected: crate::Arg,
        /// The kind passed.
        got: crate::Arg,
    },
    /// A tensor argument on another device than the launch's (the first tensor's).
    #[error("kernel `{kernel}`: argument {position} lives on {got} but the launch runs on {expected}; copy it to {expected} first")]
    KernelDeviceMismatch {
        /// The kernel's entry name.
        kernel: String,
        /// The argument's position (0-based).
        position: usize,
        /// The launch's device.
        expected: String,
        /// The argument's device.
        got: String,
    },
    /// A custom kernel's host implementation panicked; its outputs were left unchanged.
    #[error("kernel `{kernel}`: the host implementation panicked: {message}; its output tensors were left unchanged")]
    KernelHostPanic {
        /// The kernel's entry name.
        kernel: String,
        /// The panic's message.
        message: String,
    },
    /// A cudarc interop call on a device or tensor that is not on a CUDA GPU, or with a
    /// foreign object from another context.
    #[error("{op}: {detail}")]
    Interop {
        /// The interop call.
        op: &'static str,
        /// What is wrong, and what to do.
        detail: String,
    },
    /// Two parameters of a module got the same name.
    #[error(
        "two parameters are both named `{name}`; rename a field (#[param(rename = \"...\")]) so every name is unique"
    )]
    DuplicateParamName {
        /// The repeated name.
        name: String,
    },
    /// A safetensors file could not be read or written.
    #[error("safetensors file {path}: {detail}")]
    CheckpointIo {
        /// The file.
        path: String,
        /// The I/O or format error.
        detail: String,
    },
    /// A module parameter has no tensor in the file; nothing was loaded.
    #[error("safetensors file {path} has no tensor `{tensor}`, which the module needs; nothing was loaded (was the file saved from this module?)")]
    CheckpointMissingTensor {
        /// The file.
        path: String,
        /// The parameter name.
        tensor: String,
    },
    /// The file has a tensor the module has no parameter for; nothing was loaded.
    #[error("safetensors file {path} has a tensor `{tensor}` that the module has no parameter for; nothing was loaded (was the file saved from this module?)")]
    CheckpointUnexpectedTensor {
        /// The file.
        path: String,
        /// The tensor name.
        tensor: String,
    },
    /// A tensor in the file has another shape or dtype than the parameter; nothing was loaded.
    #[error("safetensors file {path}: tensor `{tensor}` is {got} but the module's parameter is {expected}; nothing was loaded")]
    CheckpointTensorMismatch {
        /// The file.
        path: String,
        /// The tensor name.
        tensor: String,
        /// The parameter's dtype and shape.
        expected: String,
        /// The file's dtype and shape.
        got: String,
    },
}

impl Error {
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

/// `Result` with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
