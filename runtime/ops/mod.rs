//! Ops: each has a CPU reference (the host backend runs it) and a CUDA kernel.
//!
//! Every op checks its arguments first (shapes, dtypes, devices, stale handles) and returns a
//! typed error naming the op; only then does it queue work. Results are new tensors from the
//! device's current pool, except for the in-place ops, whose names end in `_`.

mod activation;
mod attention;
pub(crate) mod basic;
mod cast;
mod columns;
pub mod cpu;
mod decode;
mod decoder_step;
mod dropout;
mod elementwise;
mod flash;
mod flash_engine;
mod flash_hopper;
mod fused;
mod generate;
mod linear;
mod loss;
mod norm;
mod sample;
mod transformer;

pub use activation::{gelu, gelu_backward, relu, relu_backward, Gelu};
pub use attention::{causal_attention, causal_attention_backward};
pub use basic::{axpy_, copy_, fill_, scale_, scale_by_};
pub use cast::cast;
pub use columns::{concat_columns, split_columns};
pub use decode::{decode_attention, decode_attention_append, kv_cache_append, kv_cache_fill};
pub use decoder_step::{
    DecoderLayer, DecoderStep, DecoderWeights, DECODER_STEP_DEFAULT_FUSED_BATCH, DECODER_STEP_MAX_FUSED_BATCH,
};
pub use dropout::{dropout, dropout_backward};
pub use elementwise::{add, mean, mul, scale, sum};
pub use flash::{
    flash_attention, flash_attention_backward, flash_attention_packed, flash_attention_packed_backward, Attention,
};
pub use flash_engine::{
    attention_engines, attention_workspace_limit, set_attention_workspace_limit, AttentionEngine, AttentionEngines,
    HOPPER_AUTO_MIN_SEQ,
};
pub use fused::{linear_fused, linear_fused_backward, Epilogue};
pub use generate::{generation_step, sample_and_record, Generation, Stop};
pub use linear::{
    bias_add, linear, linear_backward, linear_backward_acc, linear_input_grad, linear_residual, linear_to,
};
pub(crate) use linear::{check_linear, check_linear_backward, lt_linear_of, out_dims};
pub use loss::{
    mse_backward, mse_loss, softmax_cross_entropy, softmax_cross_entropy_backward, validate_labels, IGNORE_LABEL,
};
pub use norm::{layer_norm, layer_norm_backward};
pub use sample::{argmax, sample, Sampling};
pub use transformer::{
    add_rms_norm, add_rms_norm_backward, embedding, embedding_backward, rms_norm, rms_norm_backward,
    rms_norm_recompute, swiglu, swiglu_backward, swiglu_backward_recompute, swiglu_packed, swiglu_packed_backward,
    swiglu_packed_backward_recompute,
};

use crate::backend::{BuiltinKernel, CudaBackend, KArg, LaunchDims, RowTiles, Typed};
use crate::error::OpError;
use crate::{DType, Device, Error, Result, ShapeProblem, Tensor};

pub(crate) use crate::backend::Exec;

/// The backend an op runs on, borrowed from the device.
pub(crate) fn exec(device: &Device) -> Exec<'_> {
    device.backend().exec()
}

/// Checks that all tensors are f32, on the device of the first, and not stale
/// ([`Error::StaleTensor`]): before the op allocates anything.
pub(crate) fn check_same(op: &'static str, tensors: &[&Tensor]) -> Result<()> {
    let Some(first) = tensors.first() else { return Ok(()) };
    for t in tensors {
        if t.dtype() != DType::F32 {
            return Err(Error::DType { op, got: t.dtype(), expected: DType::F32 });
        }
        if t.device() != first.device() {
            return Err(Error::DeviceMismatch { op, a: first.device().name(), b: t.device().name() });
        }
        t.check_fresh()?;
    }
    Ok(())
}

/// Checks that all tensors have the dtype and device of the first (any float dtype: ops with
/// bf16 and f16 kernels) and none is stale; returns that dtype. Mixing dtypes is
/// [`Error::DTypeMismatch`], an `I32` tensor [`Error::DType`], a stale handle
/// [`Error::StaleTensor`].
pub(crate) fn check_like(op: &'static str, tensors: &[&Tensor]) -> Result<DType> {
    let Some(first) = tensors.first() else { return Ok(DType::F32) };
    if !first.dtype().is_float() {
        return Err(Error::DType { op, got: first.dtype(), expected: DType::F32 });
    }
    for t in tensors {
        if t.dtype() != first.dtype() {
            return Err(Error::DTypeMismatch { op, a: first.dtype(), b: t.dtype() });
        }
        if t.device() != first.device() {
            return Err(Error::DeviceMismatch { op, a: first.device().name(), b: t.device().name() });
        }
        t.check_fresh()?;
    }
    Ok(first.dtype())
}

/// Checks that `t` is f32 (a parameter grad or an accumulator), on `like`'s device and not stale.
pub(crate) fn check_f32_on(op: &'static str, t: &Tensor, like: &Tensor) -> Result<()> {
    if t.dtype() != DType::F32 {
        return Err(Error::DType { op, got: t.dtype(), expected: DType::F32 });
    }
    if t.device() != like.device() {
        return Err(Error::DeviceMismatch { op, a: like.device().name(), b: t.device().name() });
    }
    t.check_fresh()
}

/// Checks that `grad` (a parameter grad being accumulated) is f32 or `param`'s dtype and on its
/// device; returns the grad's dtype (mixed precision keeps the grads of 16-bit params in f32).
pub(crate) fn check_grad_of(op: &'static str, grad: &Tensor, param: &Tensor) -> Result<DType> {
    if grad.dtype() != DType::F32 && grad.dtype() != param.dtype() {
        return Err(Error::DTypeMismatch { op, a: param.dtype(), b: grad.dtype() });
    }
    if grad.device() != param.device() {
        return Err(Error::DeviceMismatch { op, a: param.device().name(), b: grad.device().name() });
    }
    grad.check_fresh()?;
    Ok(grad.dtype())
}

/// Checks that two tensors have the same shape.
pub(crate) fn check_shape(op: &'static str, a: &Tensor, b: &Tensor) -> Result<()> {
    if a.dims() != b.dims() {
        return Err(Error::shape(op, ShapeProblem::Differ { a: a.dims().to_vec(), b: b.dims().to_vec() }));
    }
    Ok(())
}

/// The element count as a kernel argument; [`OpError::TooLarge`] past u32 range.
pub(crate) fn n32(op: &'static str, n: usize) -> Result<u32> {
    Ok(u32::try_from(n).map_err(|_| OpError::TooLarge { op, what: "element count", got: n, max: u32::MAX as usize })?)
}

/// [`OpError::TooLarge`] when `got` is above `max`.
pub(crate) fn at_most(op: &'static str, what: &'static str, got: usize, max: usize) -> Result<()> {
    if got > max {
        return Err(OpError::TooLarge { op, what, got, max }.into());
    }
    Ok(())
}

/// [`OpError::TooLarge`] when `v` is past the `int` range cuBLAS takes its sizes in.
pub(crate) fn gemm_dim(op: &'static str, v: usize) -> Result<()> {
    at_most(op, "GEMM dimension", v, i32::MAX as usize)
}

/// Threads of a one-block-per-row kernel for rows of `d` elements: a multiple of 32, at most 512.
pub(crate) fn row_threads(d: usize) -> u32 {
    (d.div_ceil(32) * 32).clamp(32, 512) as u32
}

/// One block per row, capped at the grid limit the row kernels stride over.
pub(crate) fn row_dims(rows: usize, d: usize) -> LaunchDims {
    LaunchDims::rows(rows.min(1 << 20), row_threads(d))
}

/// A row kernel and its launch: `in_regs` (rows held in registers on the row kernels' forward
/// shape, [`RowTiles::fwd_launch`]) where a row of `d` values fits, else `per_block` (one block a
/// row, [`row_dims`]).
pub(crate) fn row_kernel(
    rows: usize,
    d: usize,
    dtype: DType,
    in_regs: Typed,
    per_block: Typed,
) -> (BuiltinKernel, LaunchDims) {
    match RowTiles::CHOSEN.fwd_launch(rows, d, dtype.size()) {
        Some(l) => (in_regs.get(dtype), l.dims),
        None => (per_block.get(dtype), row_dims(rows, d)),
    }
}

/// One warp per row, 8 rows a block (the one-warp-per-row kernels), capped at the grid limit
/// their loops stride over.
pub(crate) fn warp_rows(rows: usize) -> LaunchDims {
    LaunchDims::rows(rows.div_ceil(8).min(1 << 20), 256)
}

/// Row chunks of a two-pass column reduction over `rows` rows: `(chunks, rows per chunk)`, about
/// 256 rows a chunk and at most 16 chunks (a function of the sizes only, so the summation order
/// is the same on every run).
pub(crate) fn col_chunks(rows: usize) -> (usize, usize) {
    let chunks = rows.div_ceil(256).clamp(1, 16);
    (chunks, rows.div_ceil(chunks).max(1))
}

/// Blocks of (32, 16) threads, one per 32 columns (the column-reduction kernels).
pub(crate) fn col_dims(cols: usize) -> LaunchDims {
    let blocks = cols.div_ceil(32).clamp(1, 1 << 20) as u32;
    LaunchDims { grid: (blocks, 1, 1), block: (32, 16, 1), shared: 0 }
}

/// Blocks of the first pass of a full reduction over `n` elements: depends on `n` only, so the
/// summation order (and the result's bits) is the same on every run.
pub(crate) fn reduce_blocks(n: usize) -> u32 {
    n.div_ceil(2048).clamp(1, 1024) as u32
}

/// A deterministic two-pass reduction on CUDA: `partial_kernel(partial, inputs.., n)` writes one
/// partial sum per block, then `sum_final_f32` writes `scale * sum(partials)` to `out[0]`.
pub(crate) fn cuda_reduce(
    c: &CudaBackend,
    device: &Device,
    partial_kernel: BuiltinKernel,
    inputs: &[KArg],
    n: u32,
    out: u64,
    scale: f32,
) -> Result<()> {
    let blocks = reduce_blocks(n as usize);
    let partial = Tensor::empty(device, &[blocks as usize])?;
    let pp = partial.cuda_ptr()?;
    let mut args = Vec::with_capacity(inputs.len() + 2);
    args.push(KArg::Ptr(pp));
    args.extend_from_slice(inputs);
    args.push(KArg::U32(n));
    c.launch(partial_kernel, LaunchDims { grid: (blocks, 1, 1), block: (256, 1, 1), shared: 0 }, &args)?;
    c.launch(
        BuiltinKernel::SumFinalF32,
        LaunchDims { grid: (1, 1, 1), block: (256, 1, 1), shared: 0 },
        &[KArg::Ptr(out), KArg::Ptr(pp), KArg::U32(blocks), KArg::F32(scale)],
    )
    // `partial` goes back to the pool here; later work on the stream is ordered after the
    // kernels above, so reusing its memory is safe.
}

/// The kernels of the elementwise ops by dtype.
pub(crate) mod k {
    use super::{BuiltinKernel as B, Typed};
    pub(crate) const AXPY: Typed = Typed(B::AxpyF32, B::AxpyBf16, B::AxpyF16);
    pub(crate) const SCALE: Typed = Typed(B::ScaleF32, B::ScaleBf16, B::ScaleF16);
    pub(crate) const SCALE_BY: Typed = Typed(B::AmpScaleF32, B::AmpScaleBf16, B::AmpScaleF16);
    pub(crate) const ADD: Typed = Typed(B::AddF32, B::AddBf16, B::AddF16);
    pub(crate) const MUL: Typed = Typed(B::MulF32, B::MulBf16, B::MulF16);
    pub(crate) const SCALE_OUT: Typed = Typed(B::ScaleOutF32, B::ScaleOutBf16, B::ScaleOutF16);
    pub(crate) const BIAS_ADD: Typed = Typed(B::BiasAddF32, B::BiasAddBf16, B::BiasAddF16);
    pub(crate) const RELU: Typed = Typed(B::ReluF32, B::ReluBf16, B::ReluF16);
    pub(crate) const RELU_BWD: Typed = Typed(B::ReluBwdF32, B::ReluBwdBf16, B::ReluBwdF16);
    pub(crate) const GELU: Typed = Typed(B::GeluF32, B::GeluBf16, B::GeluF16);
    pub(crate) const GELU_BWD: Typed = Typed(B::GeluBwdF32, B::GeluBwdBf16, B::GeluBwdF16);
    pub(crate) const DROPOUT: Typed = Typed(B::DropoutF32, B::DropoutBf16, B::DropoutF16);
    pub(crate) const MSE_BWD: Typed = Typed(B::MseBwdF32, B::MseBwdBf16, B::MseBwdF16);
    pub(crate) const SUM_PARTIAL: Typed = Typed(B::SumPartialF32, B::SumPartialBf16, B::SumPartialF16);
    pub(crate) const SQDIFF_PARTIAL: Typed = Typed(B::SqdiffPartialF32, B::SqdiffPartialBf16, B::SqdiffPartialF16);
    pub(crate) const COL_SUM_ACC: Typed = Typed(B::ColSumAccF32, B::ColSumAccBf16, B::ColSumAccF16);
    pub(crate) const LAYER_NORM: Typed = Typed(B::LayerNormF32, B::LayerNormBf16, B::LayerNormF16);
    pub(crate) const LAYER_NORM_BWD: Typed = Typed(B::LayerNormBwdF32, B::LayerNormBwdBf16, B::LayerNormBwdF16);
    pub(crate) const LAYER_NORM_BWD_PARAMS: Typed =
        Typed(B::LayerNormBwdParamsF32, B::LayerNormBwdParamsBf16, B::LayerNormBwdParamsF16);
    pub(crate) const SOFTMAX_XENT: Typed = Typed(B::SoftmaxXentF32, B::SoftmaxXentBf16, B::SoftmaxXentF16);
    pub(crate) const SOFTMAX_XENT_BWD: Typed = Typed(B::SoftmaxXentBwdF32, B::SoftmaxXentBwdBf16, B::SoftmaxXentBwdF16);
    pub(crate) const SOFTMAX_XENT_BWD_COUNTED: Typed =
        Typed(B::SoftmaxXentBwdCountedF32, B::SoftmaxXentBwdCountedBf16, B::SoftmaxXentBwdCountedF16);
    pub(crate) const EMBEDDING: Typed = Typed(B::EmbeddingF32, B::EmbeddingBf16, B::EmbeddingF16);
    pub(crate) const EMBEDDING_BWD: Typed = Typed(B::EmbeddingBwdF32, B::EmbeddingBwdBf16, B::EmbeddingBwdF16);
    /// Into an f32 grad, by the dtype of `dy`.
    pub(crate) const EMBEDDING_BWD_F32: Typed =
        Typed(B::EmbeddingBwdF32, B::EmbeddingBwdBf16F32, B::EmbeddingBwdF16F32);
    pub(crate) const RMS_NORM: Typed = Typed(B::RmsNormF32, B::RmsNormBf16, B::RmsNormF16);
    pub(crate) const RMS_NORM_APPLY: Typed = Typed(B::RmsNormApplyF32, B::RmsNormApplyBf16, B::RmsNormApplyF16);
    pub(crate) const RMS_NORM_BWD: Typed = Typed(B::RmsNormBwdF32, B::RmsNormBwdBf16, B::RmsNormBwdF16);
    /// The first pass of RMSNorm's gamma grad (partial column sums in f32), by the dtype of `dy`.
    pub(crate) const RMS_NORM_BWD_PARAMS_PARTIAL: Typed =
        Typed(B::RmsNormBwdParamsPartialF32, B::RmsNormBwdParamsPartialBf16, B::RmsNormBwdParamsPartialF16);
    /// Layer norm (forward, and the backward's dx) with rows in registers.
    pub(crate) const LN_ROWS: Typed = Typed(B::LnRowsF32, B::LnRowsBf16, B::LnRowsF16);
    pub(crate) const LN_ROWS_BWD: Typed = Typed(B::LnRowsBwdF32, B::LnRowsBwdBf16, B::LnRowsBwdF16);
    /// Softmax cross-entropy's forward with rows in registers.
    pub(crate) const SX_ROWS: Typed = Typed(B::SxRowsF32, B::SxRowsBf16, B::SxRowsF16);
    /// Softmax cross-entropy's forward with the row in shared memory.
    pub(crate) const SX_SMEM: Typed = Typed(B::SxSmemF32, B::SxSmemBf16, B::SxSmemF16);
    pub(crate) const SX_CLUSTER: Typed = Typed(B::SxClusterF32, B::SxClusterBf16, B::SxClusterF16);
    /// RMSNorm (and residual add + RMSNorm) with rows in registers, forward and backward.
    pub(crate) const RMS_ROWS: Typed = Typed(B::RmsRowsF32, B::RmsRowsBf16, B::RmsRowsF16);
    pub(crate) const RMS_ROWS_BWD: Typed = Typed(B::RmsRowsBwdF32, B::RmsRowsBwdBf16, B::RmsRowsBwdF16);
    /// The second pass: the partial sums added in order into a grad, by the grad's dtype.
    pub(crate) const COL_PARTIALS_ACC: Typed = Typed(B::ColPartialsAccF32, B::ColPartialsAccBf16, B::ColPartialsAccF16);
    pub(crate) const ARGMAX_ROWS: Typed = Typed(B::ArgmaxRowsF32, B::ArgmaxRowsBf16, B::ArgmaxRowsF16);
    pub(crate) const SAMPLE_ROWS: Typed = Typed(B::SampleRowsF32, B::SampleRowsBf16, B::SampleRowsF16);
    pub(crate) const SWAP12: Typed = Typed(B::Swap12F32, B::Swap12Bf16, B::Swap12F16);
    pub(crate) const SWIGLU: Typed = Typed(B::SwigluF32, B::SwigluBf16, B::SwigluF16);
    pub(crate) const SWIGLU_PACKED: Typed = Typed(B::SwigluPackedF32, B::SwigluPackedBf16, B::SwigluPackedF16);
    pub(crate) const SWIGLU_BWD: Typed = Typed(B::SwigluBwdF32, B::SwigluBwdBf16, B::SwigluBwdF16);
    pub(crate) const SWIGLU_PACKED_BWD: Typed =
        Typed(B::SwigluPackedBwdF32, B::SwigluPackedBwdBf16, B::SwigluPackedBwdF16);
    pub(crate) const ATTN_SOFTMAX_LSE: Typed = Typed(B::AttnSoftmaxLseF32, B::AttnSoftmaxLseBf16, B::AttnSoftmaxLseF16);
    pub(crate) const ATTN_BWD_SCORES: Typed = Typed(B::AttnBwdScoresF32, B::AttnBwdScoresBf16, B::AttnBwdScoresF16);
}

/// `(rows, last)` of a tensor of rank >= 1 seen as a matrix of rows of its last dimension.
pub(crate) fn as_rows(t: &Tensor) -> (usize, usize) {
    let s = t.shape();
    (s.rows(), s.last())
}

/// Requires `t` to have rank at least 1.
pub(crate) fn check_rank1(op: &'static str, name: &'static str, t: &Tensor) -> Result<()> {
    if t.dims().is_empty() {
        return Err(Error::shape(op, ShapeProblem::layout(name, "at least one dimension", t.dims())));
    }
    Ok(())
}

/// Requires `t` to be the vector `[len]`.
pub(crate) fn check_vector(op: &'static str, name: &'static str, t: &Tensor, len: usize) -> Result<()> {
    if t.dims() != [len] {
        return Err(Error::shape(op, ShapeProblem::expected(name, &[len], "", t.dims())));
    }
    Ok(())
}
