//! `CudaFailure`: the error a CUDA library returned, kept as the source of `Error::Cuda`; and
//! `NoCuda`: why CUDA cannot be used at all, inside `Error::CudaUnavailable`.

/// The error a CUDA library returned, kept as it came (its code can be matched).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CudaFailure {
    /// The driver API.
    #[error(transparent)]
    Driver(#[from] cudarc::driver::DriverError),
    /// cuBLAS.
    #[error(transparent)]
    Cublas(#[from] cudarc::cublas::result::CublasError),
    /// cublasLt.
    #[error(transparent)]
    CublasLt(#[from] cudarc::cublaslt::result::CublasError),
    /// cuDNN (its fused attention).
    #[error(transparent)]
    Cudnn(#[from] cudarc::cudnn::result::CudnnError),
    /// NVRTC compiling a program.
    #[error(transparent)]
    Nvrtc(#[from] cudarc::nvrtc::CompileError),
}

/// Why CUDA cannot be used here, inside [`super::Error::CudaUnavailable`].
///
/// ```
/// use graphed::{CudaVersion, Error, NoCuda};
/// let e = Error::CudaUnavailable { reason: NoCuda::NoDevice { ordinal: 3, count: 1 } };
/// assert!(e.to_string().contains("no CUDA device 3 (1 found)"));
/// let old = NoCuda::DriverTooOld { driver: CudaVersion(11080), needed: CudaVersion::MIN_DRIVER };
/// assert!(old.to_string().contains("11.8"));
/// ```
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum NoCuda {
    /// CUDA libraries that do not load.
    #[error("cannot load {} (set LD_LIBRARY_PATH to the CUDA libraries, e.g. /usr/local/cuda/lib64)", libraries.join(", "))]
    Libraries {
        /// The libraries: `libcuda`, `libnvrtc`, `libcublas`.
        libraries: Vec<&'static str>,
    },
    /// A driver older than graphed needs.
    #[error("the driver supports CUDA {driver}; graphed needs a driver for CUDA {needed} or newer")]
    DriverTooOld {
        /// The newest CUDA version the driver supports.
        driver: crate::CudaVersion,
        /// The oldest graphed needs ([`crate::CudaVersion::MIN_DRIVER`]).
        needed: crate::CudaVersion,
    },
    /// No GPU of that ordinal.
    #[error("no CUDA device {ordinal} ({count} found)")]
    NoDevice {
        /// The ordinal asked for.
        ordinal: usize,
        /// The GPUs the driver sees.
        count: usize,
    },
    /// The driver refused to count the GPUs or to make a context.
    #[error("{call} failed: {message}")]
    Driver {
        /// The call.
        call: &'static str,
        /// The driver's error.
        message: String,
    },
}
