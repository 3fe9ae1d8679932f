//! GEMMs with mixed dtypes through `cublasGemmEx`: bf16/f16 inputs with f32 accumulation
//! (`CUBLAS_COMPUTE_32F`), outputs in the input dtype or f32, and f32 GEMMs on TF32 tensor
//! cores when the device opted in ([`crate::Device::set_tf32`]).

use cudarc::cublas::sys as cublas_sys;
use std::ffi::c_void;

use super::cublaslt_gemm::GemmRoute;
use super::cuda::{CublasHandle, CudaBackend};
use crate::{DType, Error, Result};

/// One operand of a GEMM: device address, dtype, leading dimension.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Operand {
    pub(crate) ptr: u64,
    pub(crate) dtype: DType,
    pub(crate) ld: usize,
}

/// `C = alpha * op(A) * op(B) + beta * C` in cuBLAS's column-major terms, for any dtypes
/// cuBLAS accepts with f32 accumulation.
#[derive(Clone, Copy, Debug)]
pub(crate) struct GemmEx {
    pub(crate) op: &'static str,
    pub(crate) trans_a: bool,
    pub(crate) trans_b: bool,
    pub(crate) m: usize,
    pub(crate) n: usize,
    pub(crate) k: usize,
    pub(crate) alpha: f32,
    pub(crate) a: Operand,
    pub(crate) b: Operand,
    pub(crate) beta: f32,
    pub(crate) c: Operand,
    /// f32 inputs on TF32 tensor cores (the device's opt-in).
    pub(crate) tf32: bool,
}

fn data_type(d: DType) -> cublas_sys::cudaDataType {
    match d {
        DType::F32 => cublas_sys::cudaDataType::CUDA_R_32F,
        DType::BF16 => cublas_sys::cudaDataType::CUDA_R_16BF,
        DType::F16 => cublas_sys::cudaDataType::CUDA_R_16F,
        // Never reached: the GEMM ops take float dtypes only (check_like); cuBLAS refuses it.
        DType::I32 => cublas_sys::cudaDataType::CUDA_R_32I,
    }
}

fn trans(t: bool) -> cublas_sys::cublasOperation_t {
    if t {
        cublas_sys::cublasOperation_t::CUBLAS_OP_T
    } else {
        cublas_sys::cublasOperation_t::CUBLAS_OP_N
    }
}

impl CudaBackend {
    /// Runs `g` on the device stream. f32 inputs use TF32 only when the device opted in; a
    /// status other than success is [`Error::GemmRejected`] naming the op and the dtypes.
    /// `GRAPHED_GEMM=lt` or `tuned` runs the GEMMs with tensor cores through cublasLt instead
    /// (see `cublaslt_gemm.rs`), where it has an algorithm for them.
    pub(crate) fn gemm_ex(&self, g: &GemmEx) -> Result<()> {
        let all_f32 = [g.a.dtype, g.b.dtype, g.c.dtype].iter().all(|d| *d == DType::F32);
        if all_f32 && !g.tf32 {
            // The pedantic f32 path the f32 ops have always taken.
            let (a, b, c) = (g.a, g.b, g.c);
            return self
                .sgemm(g.trans_a, g.trans_b, g.m, g.n, g.k, g.alpha, a.ptr, a.ld, b.ptr, b.ld, g.beta, c.ptr, c.ld);
        }
        let _entered = self.gate.enter()?;
        self.injected_gemm("cublasGemmEx")?;
        let route = GemmRoute::requested();
        if route != GemmRoute::Cublas {
            self.bind()?;
            if self.lt_gemm(g, route)? {
                return Ok(());
            }
        }
        let handle = self.cublas_handle();
        self.bind()?;
        let compute = if g.a.dtype == DType::F32 && g.tf32 {
            cublas_sys::cublasComputeType_t::CUBLAS_COMPUTE_32F_FAST_TF32
        } else if g.a.dtype == DType::F32 {
            cublas_sys::cublasComputeType_t::CUBLAS_COMPUTE_32F_PEDANTIC
        } else {
            cublas_sys::cublasComputeType_t::CUBLAS_COMPUTE_32F
        };
        // The handle stays in pedantic math for the f32 path; tensor-core GEMMs switch to the
        // default (or TF32) math mode for this call only. A host-side setting: legal in capture.
        let math = if g.tf32 {
            cublas_sys::cublasMath_t::CUBLAS_TF32_TENSOR_OP_MATH
        } else {
            cublas_sys::cublasMath_t::CUBLAS_DEFAULT_MATH
        };
        let (alpha, beta) = (g.alpha, g.beta);
        let status = with_math(&handle, Some(math), || {
            // SAFETY: the handle is locked for this call; the op checked that every operand is
            // a live block holding the matrix its dimensions and leading dimension describe;
            // alpha and beta are f32 as the compute type requires, and live until the call
            // returns (cuBLAS reads them on the host).
            unsafe {
                cublas_sys::cublasGemmEx(
                    handle.0,
                    trans(g.trans_a),
                    trans(g.trans_b),
                    g.m as i32,
                    g.n as i32,
                    g.k as i32,
                    (&alpha) as *const f32 as *const c_void,
                    g.a.ptr as *const c_void,
                    data_type(g.a.dtype),
                    g.a.ld as i32,
                    g.b.ptr as *const c_void,
                    data_type(g.b.dtype),
                    g.b.ld as i32,
                    (&beta) as *const f32 as *const c_void,
                    g.c.ptr as *mut c_void,
                    data_type(g.c.dtype),
                    g.c.ld as i32,
                    compute,
                    cublas_sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT_TENSOR_OP,
                )
            }
        })?;
        gemm_result(g.op, g.a.dtype, [g.m, g.n, g.k], status)
    }
}

/// Runs `call` on the locked `handle` in math mode `math` (the handle's pedantic math when
/// `None`), and restores pedantic math after: the f32 paths rely on the handle staying in it.
/// A host-side setting, legal in capture.
fn with_math(
    handle: &CublasHandle,
    math: Option<cublas_sys::cublasMath_t>,
    call: impl FnOnce() -> cublas_sys::cublasStatus_t,
) -> Result<cublas_sys::cublasStatus_t> {
    let set = |math| {
        // SAFETY: the handle is locked by the caller.
        let s = unsafe { cublas_sys::cublasSetMathMode(handle.0, math) };
        if s == cublas_sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
            Ok(())
        } else {
            Err(Error::cuda("cublasSetMathMode", cudarc::cublas::result::CublasError(s)))
        }
    };
    let Some(math) = math else { return Ok(call()) };
    set(math)?;
    let status = call();
    set(cublas_sys::cublasMath_t::CUBLAS_PEDANTIC_MATH)?;
    Ok(status)
}

/// A GEMM's cuBLAS status as a result: [`Error::GemmRejected`] unless it succeeded (`mnk`: the
/// column-major dimensions cuBLAS was given).
fn gemm_result(op: &'static str, dtype: DType, mnk: [usize; 3], status: cublas_sys::cublasStatus_t) -> Result<()> {
    if status == cublas_sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
        return Ok(());
    }
    let [m, n, k] = mnk;
    Err(Error::GemmRejected { op, dtype, m, n, k, status: format!("{status:?}") })
}

/// One operand of a row-major strided-batched GEMM: the address of batch 0's matrix, its
/// dtype, its row stride (leading dimension, elements), the elements between batches, and
/// whether it enters transposed.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RowMat {
    pub(crate) ptr: u64,
    pub(crate) dtype: DType,
    pub(crate) ld: usize,
    pub(crate) stride: usize,
    pub(crate) trans: bool,
}

/// `C_i = op(A_i) · op(B_i) + beta · C_i` for `i < batch`, all row-major: `C_i` is `m x n`,
/// the reduced dimension `k`. A and B share a dtype; C is that dtype or f32.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RowGemmBatched {
    pub(crate) op: &'static str,
    pub(crate) m: usize,
    pub(crate) n: usize,
    pub(crate) k: usize,
    pub(crate) a: RowMat,
    pub(crate) b: RowMat,
    pub(crate) beta: f32,
    pub(crate) c: RowMat,
    pub(crate) batch: usize,
}

impl CudaBackend {
    /// Runs `g` with `cublasGemmStridedBatchedEx` and f32 accumulation: all-f32 in pedantic f32
    /// (`CUBLAS_COMPUTE_32F_PEDANTIC`, no tensor cores, as `cublasSgemmStridedBatched` in the
    /// handle's pedantic math), 16-bit inputs on tensor cores (`CUBLAS_COMPUTE_32F`, default
    /// math for this call). Row-major `C = op(A)·op(B)` is column-major `Cᵀ = op(B)ᵀ·op(A)ᵀ`,
    /// and a row-major matrix read column-major is its transpose, so B goes first and each
    /// keeps its own transpose flag.
    pub(crate) fn gemm_strided_batched(&self, g: &RowGemmBatched) -> Result<()> {
        let _entered = self.gate.enter()?;
        self.injected_gemm("cublasGemmStridedBatchedEx")?;
        let handle = self.cublas_handle();
        self.bind()?;
        let all_f32 = [g.a.dtype, g.b.dtype, g.c.dtype].iter().all(|d| *d == DType::F32);
        let (compute, math) = if all_f32 {
            (cublas_sys::cublasComputeType_t::CUBLAS_COMPUTE_32F_PEDANTIC, None)
        } else {
            (cublas_sys::cublasComputeType_t::CUBLAS_COMPUTE_32F, Some(cublas_sys::cublasMath_t::CUBLAS_DEFAULT_MATH))
        };
        let (alpha, beta) = (1.0f32, g.beta);
        let status = with_math(&handle, math, || {
            // SAFETY: the handle is locked for this call; the op checked that every operand's
            // batch of matrices (dimensions, dtype, leading dimension and stride) lies inside
            // its live block; alpha and beta are f32 as both compute types require and live
            // until the call returns (cuBLAS reads them on the host).
            unsafe {
                cublas_sys::cublasGemmStridedBatchedEx(
                    handle.0,
                    trans(g.b.trans),
                    trans(g.a.trans),
                    g.n as i32,
                    g.m as i32,
                    g.k as i32,
                    (&alpha) as *const f32 as *const c_void,
                    g.b.ptr as *const c_void,
                    data_type(g.b.dtype),
                    g.b.ld as i32,
                    g.b.stride as i64,
                    g.a.ptr as *const c_void,
                    data_type(g.a.dtype),
                    g.a.ld as i32,
                    g.a.stride as i64,
                    (&beta) as *const f32 as *const c_void,
                    g.c.ptr as *mut c_void,
                    data_type(g.c.dtype),
                    g.c.ld as i32,
                    g.c.stride as i64,
                    g.batch as i32,
                    compute,
                    cublas_sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT_TENSOR_OP,
                )
            }
        })?;
        gemm_result(g.op, g.a.dtype, [g.n, g.m, g.k], status)
    }
}
