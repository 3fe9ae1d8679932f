//! `KernelError`: a custom kernel ([`crate::Kernel`]) that cannot be declared, compiled or
//! launched as asked, or whose host implementation misuses its [`crate::HostArgs`], inside
//! [`super::Error::Kernel`].

use super::Arg;

/// What went wrong with a custom kernel, as values a caller can match on. A refused launch
/// runs nothing and writes no output.
///
/// ```
/// use graphed::{Arg, Error, Kernel, KernelError};
/// let e = Kernel::new("2fast", "", &[Arg::TensorOut], |_| Ok(())).unwrap_err();
/// assert!(matches!(e, Error::Kernel(KernelError::EntryNotIdentifier { .. })));
/// ```
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum KernelError {
    /// An entry name that is not a C identifier.
    #[error("kernel `{kernel}`: the entry name must be a C identifier; fix the Kernel::new arguments")]
    EntryNotIdentifier {
        /// The entry name given.
        kernel: String,
    },
    /// CUDA source with a NUL byte, which NVRTC cannot take.
    #[error("kernel `{kernel}`: the source contains a NUL byte; fix the Kernel::new arguments")]
    SourceHasNul {
        /// The kernel's entry name.
        kernel: String,
    },
    /// CUDA source that never mentions the entry name.
    #[error("kernel `{kernel}`: the source does not mention the entry name; fix the Kernel::new arguments")]
    EntryNotInSource {
        /// The kernel's entry name.
        kernel: String,
    },
    /// A signature without a tensor argument (the first tensor picks the launch's device).
    #[error("kernel `{kernel}`: the signature must have at least one tensor argument (it picks the device); fix the Kernel::new arguments")]
    NoTensorArg {
        /// The kernel's entry name.
        kernel: String,
    },
    /// NVRTC rejected the source, or the compiled module did not load or lacks the entry.
    #[error("kernel `{kernel}` failed to compile for {device}; fix the CUDA source. NVRTC log:\n{log}")]
    Compile {
        /// The kernel's entry name.
        kernel: String,
        /// The device it was compiled for.
        device: String,
        /// NVRTC's log (or the loader's message when the module did not load).
        log: String,
    },
    /// A kernel's first use on a device came while the device was capturing.
    #[error("kernel `{kernel}` is used for the first time on {device} inside a graph capture, where it cannot be compiled; warm up first: call kernel.compile(&device) or run it eagerly once before capturing")]
    NotCompiled {
        /// The kernel's entry name.
        kernel: String,
        /// The capturing device.
        device: String,
    },
    /// A launch passed a different number of arguments than the kernel declares.
    #[error("kernel `{kernel}`: launched with {got} arguments but its signature declares {expected}; pass one argument per declared Arg")]
    ArgCount {
        /// The kernel's entry name.
        kernel: String,
        /// Arguments declared.
        expected: usize,
        /// Arguments passed.
        got: usize,
    },
    /// A launch argument of the wrong kind for its position, or a host implementation that
    /// asked [`crate::HostArgs`] for a position as another kind than it is.
    #[error("kernel `{kernel}`: argument {position} is {got:?} where {expected:?} is expected; pass each argument, and read it in the host implementation, as its declared kind")]
    ArgKind {
        /// The kernel's entry name.
        kernel: String,
        /// The argument's position (0-based).
        position: usize,
        /// The kind the signature declares (at a launch) or the host implementation asked for.
        expected: Arg,
        /// The kind passed (at a launch) or declared (in the host implementation).
        got: Arg,
    },
    /// A tensor argument on another device than the launch's (the first tensor's).
    #[error("kernel `{kernel}`: argument {position} lives on {got} but the launch runs on {expected}; copy it to {expected} first")]
    DeviceMismatch {
        /// The kernel's entry name.
        kernel: String,
        /// The argument's position (0-based).
        position: usize,
        /// The launch's device.
        expected: String,
        /// The argument's device.
        got: String,
    },
    /// A launch with a zero grid or block dimension.
    #[error("kernel `{kernel}`: grid {grid:?} and block {block:?} must have no zero dimension")]
    ZeroLaunchDim {
        /// The kernel's entry name.
        kernel: String,
        /// The grid given.
        grid: (u32, u32, u32),
        /// The block given.
        block: (u32, u32, u32),
    },
    /// A host implementation that asked [`crate::HostArgs`] for a position past the kernel's
    /// arguments.
    #[error("kernel `{kernel}`: the host implementation asked for argument {position}, but the kernel has {count}")]
    ArgPosition {
        /// The kernel's entry name.
        kernel: String,
        /// The position asked for (0-based).
        position: usize,
        /// The kernel's arguments.
        count: usize,
    },
    /// A host implementation that borrowed a tensor argument a second time while one of the
    /// two borrows is for writing ([`crate::HostArgs::output`]).
    #[error("kernel `{kernel}`: the host implementation borrowed argument {position} again while it is borrowed, once for writing; drop the first guard before taking the second")]
    ArgBorrowed {
        /// The kernel's entry name.
        kernel: String,
        /// The argument's position (0-based).
        position: usize,
    },
    /// A host implementation panicked; its outputs were left unchanged.
    #[error("kernel `{kernel}`: the host implementation panicked: {message}; its output tensors were left unchanged")]
    HostPanic {
        /// The kernel's entry name.
        kernel: String,
        /// The panic's message.
        message: String,
    },
    /// One of graphed's own kernels launched with arguments that do not match its parameters
    /// (a bug in graphed: please report it).
    #[error("built-in kernel `{kernel}`: arguments {got:?} do not match its parameters {expected:?}; this is a bug in graphed, please report it")]
    Builtin {
        /// The kernel.
        kernel: &'static str,
        /// The parameter kinds it takes (`ptr`, `f32`, `u32`, `u64`).
        expected: Vec<&'static str>,
        /// The argument kinds it was given.
        got: Vec<&'static str>,
    },
}
