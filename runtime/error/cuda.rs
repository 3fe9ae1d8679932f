//! `CudaFailure`: the error a CUDA library returned, kept as the source of `Error::Cuda`.

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
