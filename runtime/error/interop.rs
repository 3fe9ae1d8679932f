//! `InteropProblem`: why a cudarc interop call cannot work on this device or with this object,
//! inside [`super::Error::Interop`] (which names the call).

/// Why a cudarc interop call was refused, as values a caller can match on.
///
/// ```
/// use graphed::{Device, Error, InteropProblem, Tensor};
/// let t = Tensor::zeros(&Device::host(), &[4])?;
/// let e = t.cuda_device_ptr().unwrap_err();
/// assert!(matches!(e, Error::Interop { problem: InteropProblem::HostBackend, .. }));
/// # Ok::<(), graphed::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum InteropProblem {
    /// The call needs a CUDA device, and this is the host backend (no device addresses, no
    /// `CudaSlice`).
    #[error("the host backend has no CUDA objects (device addresses, CudaSlice); use a CUDA device")]
    HostBackend,
    /// A `CudaSlice` allocated in another device's context.
    #[error("the slice belongs to the context of device {slice_ordinal}, not {device}'s; allocate it on device.cuda_stream()")]
    OtherContext {
        /// The ordinal of the device whose context holds the slice.
        slice_ordinal: usize,
        /// The device it was given with.
        device: String,
    },
}
