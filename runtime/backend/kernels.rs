//! The kernels of `kernels/*.cu`, typed: each has a name and the kinds of its arguments, so a
//! launch with a wrong argument list is an error naming the kernel on any machine, and a unit
//! test (run in CI, without a GPU) checks the table against the CUDA sources.

use crate::error::KernelError;
use crate::Result;

/// The kind of one kernel argument.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ArgKind {
    /// A device pointer (`float*`, `const u32*`, ...).
    Ptr,
    /// `float`.
    F32,
    /// `u32` (unsigned int).
    U32,
    /// `u64` (unsigned long long).
    U64,
}

/// A kernel argument, passed by value.
#[derive(Clone, Copy, Debug)]
pub(crate) enum KArg {
    /// A device pointer.
    Ptr(u64),
    F32(f32),
    U32(u32),
    U64(u64),
}

impl ArgKind {
    /// The kind's name in messages: `ptr`, `f32`, `u32`, `u64`.
    pub(crate) fn name(self) -> &'static str {
        match self {
            ArgKind::Ptr => "ptr",
            ArgKind::F32 => "f32",
            ArgKind::U32 => "u32",
            ArgKind::U64 => "u64",
        }
    }
}

impl KArg {
    pub(crate) fn kind(self) -> ArgKind {
        match self {
            KArg::Ptr(_) => ArgKind::Ptr,
            KArg::F32(_) => ArgKind::F32,
            KArg::U32(_) => ArgKind::U32,
            KArg::U64(_) => ArgKind::U64,
        }
    }
}

macro_rules! kernels {
    ($($variant:ident = $name:literal ($($kind:ident),*);)*) => {
        /// A kernel of `kernels/*.cu`.
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        pub(crate) enum BuiltinKernel {
            $($variant,)*
        }

        impl BuiltinKernel {
            /// Every kernel, in table order (the order the CUDA backend loads them in).
            pub(crate) const ALL: &'static [BuiltinKernel] = &[$(BuiltinKernel::$variant,)*];

            /// The `extern "C"` name in the CUDA source.
            pub(crate) fn name(self) -> &'static str {
                match self {
                    $(BuiltinKernel::$variant => $name,)*
                }
            }

            /// The kinds of the kernel's parameters, in order.
            pub(crate) fn params(self) -> &'static [ArgKind] {
                match self {
                    $(BuiltinKernel::$variant => &[$(ArgKind::$kind),*],)*
                }
            }
        }
    };
}

kernels! {
    FillF32 = "fill_f32" (Ptr, F32, U32);
    AxpyF32 = "axpy_f32" (Ptr, Ptr, F32, U32);
    RngUniformF32 = "rng_uniform_f32" (Ptr, Ptr, U32);
    RngAdvance = "rng_advance" (Ptr, U64);
    ScaleF32 = "scale_f32" (Ptr, F32, U32);
    AddF32 = "add_f32" (Ptr, Ptr, Ptr, U32);
    MulF32 = "mul_f32" (Ptr, Ptr, Ptr, U32);
    ScaleOutF32 = "scale_out_f32" (Ptr, Ptr, F32, U32);
    BiasAddF32 = "bias_add_f32" (Ptr, Ptr, Ptr, U32, U32);
    ReluF32 = "relu_f32" (Ptr, Ptr, U32);
    ReluBwdF32 = "relu_bwd_f32" (Ptr, Ptr, Ptr, U32);
    GeluF32 = "gelu_f32" (Ptr, Ptr, U32, U32);
    GeluBwdF32 = "gelu_bwd_f32" (Ptr, Ptr, Ptr, U32, U32);
    DropoutF32 = "dropout_f32" (Ptr, Ptr, Ptr, Ptr, F32, F32, U32);
    SumPartialF32 = "sum_partial_f32" (Ptr, Ptr, U32);
    CountLabelsPartialF32 = "count_labels_partial_f32" (Ptr, Ptr, U32);
    MeanFinalF32 = "mean_final_f32" (Ptr, Ptr, Ptr, U32);
    XentMeanF32 = "xent_mean_f32" (Ptr, Ptr, Ptr, U32);
    SqdiffPartialF32 = "sqdiff_partial_f32" (Ptr, Ptr, Ptr, U32);
    SumFinalF32 = "sum_final_f32" (Ptr, Ptr, U32, F32);
    ColSumAccF32 = "col_sum_acc_f32" (Ptr, Ptr, U32, U32);
    LayerNormF32 = "layer_norm_f32" (Ptr, Ptr, Ptr, Ptr, Ptr, Ptr, U32, U32, F32);
    LayerNormBwdF32 = "layer_norm_bwd_f32" (Ptr, Ptr, Ptr, Ptr, Ptr, Ptr, U32, U32);
    LayerNormBwdParamsF32 = "layer_norm_bwd_params_f32" (Ptr, Ptr, Ptr, Ptr, Ptr, Ptr, U32, U32);
    SoftmaxXentF32 = "softmax_xent_f32" (Ptr, Ptr, Ptr, Ptr, U32, U32);
    SoftmaxXentBwdF32 = "softmax_xent_bwd_f32" (Ptr, Ptr, Ptr, F32, Ptr, U32, U32);
    SoftmaxXentBwdCountedF32 = "softmax_xent_bwd_counted_f32" (Ptr, Ptr, Ptr, F32, U32, U32);
    MseBwdF32 = "mse_bwd_f32" (Ptr, Ptr, Ptr, F32, U32);
    SgdStepF32 = "sgd_step_f32" (Ptr, Ptr, Ptr, Ptr, F32, F32, U32, U32);
    AdamwPrepareF32 = "adamw_prepare_f32" (Ptr, F32, F32);
    AdamwStepF32 = "adamw_step_f32" (Ptr, Ptr, Ptr, Ptr, Ptr, Ptr, F32, F32, F32, F32, U32, U32);
    // Precision (#12): kernels/half.cu and kernels/mixed.cu.
    AmpBegin = "amp_begin" (Ptr);
    AmpScaleF32 = "amp_scale_f32" (Ptr, Ptr, U32);
    AmpScaleBf16 = "amp_scale_bf16" (Ptr, Ptr, U32);
    AmpScaleF16 = "amp_scale_f16" (Ptr, Ptr, U32);
    AmpUnscaleCheck = "amp_unscale_check" (Ptr, Ptr, U32);
    AmpUpdate = "amp_update" (Ptr, F32, F32, U32);
    AdamwPrepareMixed = "adamw_prepare_mixed" (Ptr, Ptr, F32, F32);
    AdamwMixedBf16 = "adamw_mixed_bf16" (Ptr, Ptr, Ptr, Ptr, Ptr, Ptr, Ptr, Ptr, F32, F32, F32, F32, U32, U32);
    AdamwMixedF16 = "adamw_mixed_f16" (Ptr, Ptr, Ptr, Ptr, Ptr, Ptr, Ptr, Ptr, F32, F32, F32, F32, U32, U32);
    SgdMixedBf16 = "sgd_mixed_bf16" (Ptr, Ptr, Ptr, Ptr, Ptr, Ptr, F32, F32, U32, U32);
    SgdMixedF16 = "sgd_mixed_f16" (Ptr, Ptr, Ptr, Ptr, Ptr, Ptr, F32, F32, U32, U32);
    // Multi-tensor launches over a table of tensors: kernels/multi_tensor.cu (MultiTensor below).
    AdamwMtF32 = "adamw_mt_f32" (Ptr, Ptr, U32, Ptr, Ptr, Ptr, F32, F32, F32, F32, U32);
    AdamwMtBf16 = "adamw_mt_bf16" (Ptr, Ptr, U32, Ptr, Ptr, Ptr, F32, F32, F32, F32, U32);
    AdamwMtF16 = "adamw_mt_f16" (Ptr, Ptr, U32, Ptr, Ptr, Ptr, F32, F32, F32, F32, U32);
    AmpUnscaleCheckMt = "amp_unscale_check_mt" (Ptr, Ptr, U32, Ptr);
    ZeroGradsMt = "zero_grads_mt" (Ptr, Ptr, U32, Ptr);
    SgdMtF32 = "sgd_mt_f32" (Ptr, Ptr, U32, Ptr, Ptr, F32, F32, U32, U32);
    SgdMtBf16 = "sgd_mt_bf16" (Ptr, Ptr, U32, Ptr, Ptr, F32, F32, U32, U32);
    SgdMtF16 = "sgd_mt_f16" (Ptr, Ptr, U32, Ptr, Ptr, F32, F32, U32, U32);
    FillU16 = "fill_u16" (Ptr, U32, U32);
    ResizeAxesU32 = "resize_axes_u32" (Ptr, Ptr, U32, U32, U32, U32, U32, U32, U32, U32);
    ResizeAxesU16 = "resize_axes_u16" (Ptr, Ptr, U32, U32, U32, U32, U32, U32, U32, U32);
    CopyColsU32 = "copy_cols_u32" (Ptr, Ptr, U32, U32, U32, U32);
    CopyColsU16 = "copy_cols_u16" (Ptr, Ptr, U32, U32, U32, U32);
    FillU32 = "fill_u32" (Ptr, U32, U32);
    CastF32Bf16 = "cast_f32_bf16" (Ptr, Ptr, U32);
    CastF32F16 = "cast_f32_f16" (Ptr, Ptr, U32);
    CastBf16F32 = "cast_bf16_f32" (Ptr, Ptr, U32);
    CastF16F32 = "cast_f16_f32" (Ptr, Ptr, U32);
    CastBf16F16 = "cast_bf16_f16" (Ptr, Ptr, U32);
    CastF16Bf16 = "cast_f16_bf16" (Ptr, Ptr, U32);
    AxpyBf16 = "axpy_bf16" (Ptr, Ptr, F32, U32);
    AxpyF16 = "axpy_f16" (Ptr, Ptr, F32, U32);
    ScaleBf16 = "scale_bf16" (Ptr, F32, U32);
    ScaleF16 = "scale_f16" (Ptr, F32, U32);
    AddBf16 = "add_bf16" (Ptr, Ptr, Ptr, U32);
    AddF16 = "add_f16" (Ptr, Ptr, Ptr, U32);
    MulBf16 = "mul_bf16" (Ptr, Ptr, Ptr, U32);
    MulF16 = "mul_f16" (Ptr, Ptr, Ptr, U32);
    ScaleOutBf16 = "scale_out_bf16" (Ptr, Ptr, F32, U32);
    ScaleOutF16 = "scale_out_f16" (Ptr, Ptr, F32, U32);
    BiasAddBf16 = "bias_add_bf16" (Ptr, Ptr, Ptr, U32, U32);
    BiasAddF16 = "bias_add_f16" (Ptr, Ptr, Ptr, U32, U32);
    ReluBf16 = "relu_bf16" (Ptr, Ptr, U32);
    ReluF16 = "relu_f16" (Ptr, Ptr, U32);
    ReluBwdBf16 = "relu_bwd_bf16" (Ptr, Ptr, Ptr, U32);
    ReluBwdF16 = "relu_bwd_f16" (Ptr, Ptr, Ptr, U32);
    GeluBf16 = "gelu_bf16" (Ptr, Ptr, U32, U32);
    GeluF16 = "gelu_f16" (Ptr, Ptr, U32, U32);
    GeluBwdBf16 = "gelu_bwd_bf16" (Ptr, Ptr, Ptr, U32, U32);
    GeluBwdF16 = "gelu_bwd_f16" (Ptr, Ptr, Ptr, U32, U32);
    DropoutBf16 = "dropout_bf16" (Ptr, Ptr, Ptr, Ptr, F32, F32, U32);
    DropoutF16 = "dropout_f16" (Ptr, Ptr, Ptr, Ptr, F32, F32, U32);
    MseBwdBf16 = "mse_bwd_bf16" (Ptr, Ptr, Ptr, F32, U32);
    MseBwdF16 = "mse_bwd_f16" (Ptr, Ptr, Ptr, F32, U32);
    SumPartialBf16 = "sum_partial_bf16" (Ptr, Ptr, U32);
    SumPartialF16 = "sum_partial_f16" (Ptr, Ptr, U32);
    SqdiffPartialBf16 = "sqdiff_partial_bf16" (Ptr, Ptr, Ptr, U32);
    SqdiffPartialF16 = "sqdiff_partial_f16" (Ptr, Ptr, Ptr, U32);
    ColSumAccBf16 = "col_sum_acc_bf16" (Ptr, Ptr, U32, U32);
    ColSumAccF16 = "col_sum_acc_f16" (Ptr, Ptr, U32, U32);
    LayerNormBf16 = "layer_norm_bf16" (Ptr, Ptr, Ptr, Ptr, Ptr, Ptr, U32, U32, F32);
    LayerNormF16 = "layer_norm_f16" (Ptr, Ptr, Ptr, Ptr, Ptr, Ptr, U32, U32, F32);
    LayerNormBwdBf16 = "layer_norm_bwd_bf16" (Ptr, Ptr, Ptr, Ptr, Ptr, Ptr, U32, U32);
    LayerNormBwdF16 = "layer_norm_bwd_f16" (Ptr, Ptr, Ptr, Ptr, Ptr, Ptr, U32, U32);
    LayerNormBwdParamsBf16 = "layer_norm_bwd_params_bf16" (Ptr, Ptr, Ptr, Ptr, Ptr, Ptr, U32, U32);
    LayerNormBwdParamsF16 = "layer_norm_bwd_params_f16" (Ptr, Ptr, Ptr, Ptr, Ptr, Ptr, U32, U32);
    SoftmaxXentBf16 = "softmax_xent_bf16" (Ptr, Ptr, Ptr, Ptr, U32, U32);
    SoftmaxXentF16 = "softmax_xent_f16" (Ptr, Ptr, Ptr, Ptr, U32, U32);
    SoftmaxXentBwdBf16 = "softmax_xent_bwd_bf16" (Ptr, Ptr, Ptr, F32, Ptr, U32, U32);
    SoftmaxXentBwdF16 = "softmax_xent_bwd_f16" (Ptr, Ptr, Ptr, F32, Ptr, U32, U32);
    SoftmaxXentBwdCountedBf16 = "softmax_xent_bwd_counted_bf16" (Ptr, Ptr, Ptr, F32, U32, U32);
    SoftmaxXentBwdCountedF16 = "softmax_xent_bwd_counted_f16" (Ptr, Ptr, Ptr, F32, U32, U32);
    // Transformer (#13): kernels/transformer.cu.
    EmbeddingF32 = "embedding_f32" (Ptr, Ptr, Ptr, U32, U32, U32, Ptr);
    EmbeddingBf16 = "embedding_bf16" (Ptr, Ptr, Ptr, U32, U32, U32, Ptr);
    EmbeddingF16 = "embedding_f16" (Ptr, Ptr, Ptr, U32, U32, U32, Ptr);
    EmbeddingBwdF32 = "embedding_bwd_f32" (Ptr, Ptr, Ptr, U32, U32, U32, Ptr);
    EmbeddingBwdBf16 = "embedding_bwd_bf16" (Ptr, Ptr, Ptr, U32, U32, U32, Ptr);
    EmbeddingBwdF16 = "embedding_bwd_f16" (Ptr, Ptr, Ptr, U32, U32, U32, Ptr);
    RmsNormF32 = "rms_norm_f32" (Ptr, Ptr, Ptr, Ptr, U32, U32, F32);
    RmsNormBf16 = "rms_norm_bf16" (Ptr, Ptr, Ptr, Ptr, U32, U32, F32);
    RmsNormF16 = "rms_norm_f16" (Ptr, Ptr, Ptr, Ptr, U32, U32, F32);
    RmsNormBwdF32 = "rms_norm_bwd_f32" (Ptr, Ptr, Ptr, Ptr, Ptr, U32, U32);
    RmsNormBwdBf16 = "rms_norm_bwd_bf16" (Ptr, Ptr, Ptr, Ptr, Ptr, U32, U32);
    RmsNormBwdF16 = "rms_norm_bwd_f16" (Ptr, Ptr, Ptr, Ptr, Ptr, U32, U32);
    RmsNormBwdParamsPartialF32 = "rms_norm_bwd_params_partial_f32" (Ptr, Ptr, Ptr, Ptr, U32, U32, U32);
    RmsNormBwdParamsPartialBf16 = "rms_norm_bwd_params_partial_bf16" (Ptr, Ptr, Ptr, Ptr, U32, U32, U32);
    RmsNormBwdParamsPartialF16 = "rms_norm_bwd_params_partial_f16" (Ptr, Ptr, Ptr, Ptr, U32, U32, U32);
    RmsNormApplyF32 = "rms_norm_apply_f32" (Ptr, Ptr, Ptr, Ptr, U32, U32);
    RmsNormApplyBf16 = "rms_norm_apply_bf16" (Ptr, Ptr, Ptr, Ptr, U32, U32);
    RmsNormApplyF16 = "rms_norm_apply_f16" (Ptr, Ptr, Ptr, Ptr, U32, U32);
    ColPartialsAccF32 = "col_partials_acc_f32" (Ptr, Ptr, U32, U32);
    ColPartialsAccBf16 = "col_partials_acc_bf16" (Ptr, Ptr, U32, U32);
    ColPartialsAccF16 = "col_partials_acc_f16" (Ptr, Ptr, U32, U32);
    Swap12F32 = "swap12_f32" (Ptr, Ptr, U32, U32, U32, U32);
    Swap12Bf16 = "swap12_bf16" (Ptr, Ptr, U32, U32, U32, U32);
    Swap12F16 = "swap12_f16" (Ptr, Ptr, U32, U32, U32, U32);
    SwigluF32 = "swiglu_f32" (Ptr, Ptr, Ptr, U32);
    SwigluBf16 = "swiglu_bf16" (Ptr, Ptr, Ptr, U32);
    SwigluF16 = "swiglu_f16" (Ptr, Ptr, Ptr, U32);
    SwigluPackedF32 = "swiglu_packed_f32" (Ptr, Ptr, U32, U32);
    SwigluPackedBf16 = "swiglu_packed_bf16" (Ptr, Ptr, U32, U32);
    SwigluPackedF16 = "swiglu_packed_f16" (Ptr, Ptr, U32, U32);
    SwigluPackedBwdF32 = "swiglu_packed_bwd_f32" (Ptr, Ptr, Ptr, Ptr, U32, U32);
    SwigluPackedBwdBf16 = "swiglu_packed_bwd_bf16" (Ptr, Ptr, Ptr, Ptr, U32, U32);
    SwigluPackedBwdF16 = "swiglu_packed_bwd_f16" (Ptr, Ptr, Ptr, Ptr, U32, U32);
    SwigluBwdF32 = "swiglu_bwd_f32" (Ptr, Ptr, Ptr, Ptr, Ptr, Ptr, U32);
    SwigluBwdBf16 = "swiglu_bwd_bf16" (Ptr, Ptr, Ptr, Ptr, Ptr, Ptr, U32);
    SwigluBwdF16 = "swiglu_bwd_f16" (Ptr, Ptr, Ptr, Ptr, Ptr, Ptr, U32);
    AttnSoftmaxLseF32 = "attn_softmax_lse_f32" (Ptr, Ptr, Ptr, U32, U32, F32);
    AttnSoftmaxLseBf16 = "attn_softmax_lse_bf16" (Ptr, Ptr, Ptr, U32, U32, F32);
    AttnSoftmaxLseF16 = "attn_softmax_lse_f16" (Ptr, Ptr, Ptr, U32, U32, F32);
    AttnBwdScoresF32 = "attn_bwd_scores_f32" (Ptr, Ptr, Ptr, Ptr, Ptr, Ptr, Ptr, U32, U32, U32, U32, F32);
    AttnBwdScoresBf16 = "attn_bwd_scores_bf16" (Ptr, Ptr, Ptr, Ptr, Ptr, Ptr, Ptr, U32, U32, U32, U32, F32);
    AttnBwdScoresF16 = "attn_bwd_scores_f16" (Ptr, Ptr, Ptr, Ptr, Ptr, Ptr, Ptr, U32, U32, U32, U32, F32);
    RmsRowsF32 = "rms_rows_f32" (Ptr, Ptr, Ptr, Ptr, Ptr, Ptr, U32, U32, F32);
    RmsRowsBf16 = "rms_rows_bf16" (Ptr, Ptr, Ptr, Ptr, Ptr, Ptr, U32, U32, F32);
    RmsRowsF16 = "rms_rows_f16" (Ptr, Ptr, Ptr, Ptr, Ptr, Ptr, U32, U32, F32);
    RmsRowsBwdF32 = "rms_rows_bwd_f32" (Ptr, Ptr, Ptr, Ptr, Ptr, Ptr, Ptr, U32, U32);
    RmsRowsBwdBf16 = "rms_rows_bwd_bf16" (Ptr, Ptr, Ptr, Ptr, Ptr, Ptr, Ptr, U32, U32);
    RmsRowsBwdF16 = "rms_rows_bwd_f16" (Ptr, Ptr, Ptr, Ptr, Ptr, Ptr, Ptr, U32, U32);
    // The ring forms (row groups in flight in shared memory; bench/row_sweep.py measures them,
    // the runtime launches them unless GRAPHED_ROW_RING=0: RowTiles::ring).
    RmsRingBf16 = "rms_ring_bf16" (Ptr, Ptr, Ptr, Ptr, Ptr, Ptr, U32, U32, F32);
    RmsRingBwdBf16 = "rms_ring_bwd_bf16" (Ptr, Ptr, Ptr, Ptr, Ptr, Ptr, Ptr, U32, U32);
    // The ring backward in thread block clusters (sm_90): one row of partials a cluster.
    RmsRingBwdClBf16 = "rms_ring_bwd_cl_bf16" (Ptr, Ptr, Ptr, Ptr, Ptr, Ptr, Ptr, U32, U32);
    LnRowsF32 = "ln_rows_f32" (Ptr, Ptr, Ptr, Ptr, Ptr, Ptr, U32, U32, F32);
    LnRowsBf16 = "ln_rows_bf16" (Ptr, Ptr, Ptr, Ptr, Ptr, Ptr, U32, U32, F32);
    LnRowsF16 = "ln_rows_f16" (Ptr, Ptr, Ptr, Ptr, Ptr, Ptr, U32, U32, F32);
    LnRowsBwdF32 = "ln_rows_bwd_f32" (Ptr, Ptr, Ptr, Ptr, Ptr, Ptr, U32, U32);
    LnRowsBwdBf16 = "ln_rows_bwd_bf16" (Ptr, Ptr, Ptr, Ptr, Ptr, Ptr, U32, U32);
    LnRowsBwdF16 = "ln_rows_bwd_f16" (Ptr, Ptr, Ptr, Ptr, Ptr, Ptr, U32, U32);
    LnRingBwdF32 = "ln_ring_bwd_f32" (Ptr, Ptr, Ptr, Ptr, Ptr, Ptr, Ptr, Ptr, U32, U32);
    SxRowsF32 = "sx_rows_f32" (Ptr, Ptr, Ptr, Ptr, U32, U32);
    SxRowsBf16 = "sx_rows_bf16" (Ptr, Ptr, Ptr, Ptr, U32, U32);
    SxRowsF16 = "sx_rows_f16" (Ptr, Ptr, Ptr, Ptr, U32, U32);
    RmsSmemBf16 = "rms_smem_bf16" (Ptr, Ptr, Ptr, Ptr, Ptr, Ptr, U32, U32, F32);
    RmsSmem2Bf16 = "rms_smem2_bf16" (Ptr, Ptr, Ptr, Ptr, Ptr, Ptr, U32, U32, F32);
    SxSmemF32 = "sx_smem_f32" (Ptr, Ptr, Ptr, Ptr, U32, U32);
    SxClusterF32 = "sx_cluster_f32" (Ptr, Ptr, Ptr, Ptr, U32, U32);
    SxSmemBf16 = "sx_smem_bf16" (Ptr, Ptr, Ptr, Ptr, U32, U32);
    SxClusterBf16 = "sx_cluster_bf16" (Ptr, Ptr, Ptr, Ptr, U32, U32);
    SxSmemF16 = "sx_smem_f16" (Ptr, Ptr, Ptr, Ptr, U32, U32);
    SxClusterF16 = "sx_cluster_f16" (Ptr, Ptr, Ptr, Ptr, U32, U32);
    EmbeddingBwdBf16F32 = "embedding_bwd_bf16_f32" (Ptr, Ptr, Ptr, U32, U32, U32, Ptr);
    EmbeddingBwdF16F32 = "embedding_bwd_f16_f32" (Ptr, Ptr, Ptr, U32, U32, U32, Ptr);
    LrWarmupCosineF32 = "lr_warmup_cosine_f32" (Ptr, Ptr, F32, F32, U32, U32);
    // Fused attention: kernels/flash.cu (tile shapes: FlashTiles below).
    FlashFwdBf16D64 = "flash_fwd_bf16_d64" (Ptr, Ptr, Ptr, Ptr, Ptr, U32, U32, U32, U32, U32, U32, F32);
    FlashFwdBf16D128 = "flash_fwd_bf16_d128" (Ptr, Ptr, Ptr, Ptr, Ptr, U32, U32, U32, U32, U32, U32, F32);
    FlashFwdF16D64 = "flash_fwd_f16_d64" (Ptr, Ptr, Ptr, Ptr, Ptr, U32, U32, U32, U32, U32, U32, F32);
    FlashFwdF16D128 = "flash_fwd_f16_d128" (Ptr, Ptr, Ptr, Ptr, Ptr, U32, U32, U32, U32, U32, U32, F32);
    FlashBwdPrepBf16 = "flash_bwd_prep_bf16" (Ptr, Ptr, Ptr, U32, U32, U32, U32);
    FlashBwdPrepF16 = "flash_bwd_prep_f16" (Ptr, Ptr, Ptr, U32, U32, U32, U32);
    FlashBwdDqBf16D64 = "flash_bwd_dq_bf16_d64" (Ptr, Ptr, Ptr, Ptr, Ptr, Ptr, Ptr, U32, U32, U32, U32, U32, U32, F32);
    FlashBwdDqBf16D128 = "flash_bwd_dq_bf16_d128" (Ptr, Ptr, Ptr, Ptr, Ptr, Ptr, Ptr, U32, U32, U32, U32, U32, U32, F32);
    FlashBwdDqF16D64 = "flash_bwd_dq_f16_d64" (Ptr, Ptr, Ptr, Ptr, Ptr, Ptr, Ptr, U32, U32, U32, U32, U32, U32, F32);
    FlashBwdDqF16D128 = "flash_bwd_dq_f16_d128" (Ptr, Ptr, Ptr, Ptr, Ptr, Ptr, Ptr, U32, U32, U32, U32, U32, U32, F32);
    FlashBwdDkdvBf16D64 = "flash_bwd_dkdv_bf16_d64" (Ptr, Ptr, Ptr, Ptr, Ptr, Ptr, Ptr, Ptr, U32, U32, U32, U32, U32, U32, F32);
    FlashBwdDkdvBf16D128 = "flash_bwd_dkdv_bf16_d128" (Ptr, Ptr, Ptr, Ptr, Ptr, Ptr, Ptr, Ptr, U32, U32, U32, U32, U32, U32, F32);
    FlashBwdDkdvF16D64 = "flash_bwd_dkdv_f16_d64" (Ptr, Ptr, Ptr, Ptr, Ptr, Ptr, Ptr, Ptr, U32, U32, U32, U32, U32, U32, F32);
    FlashBwdDkdvF16D128 = "flash_bwd_dkdv_f16_d128" (Ptr, Ptr, Ptr, Ptr, Ptr, Ptr, Ptr, Ptr, U32, U32, U32, U32, U32, U32, F32);
    FlashFwdSBf16D64 = "flash_fwd_s_bf16_d64" (Ptr, Ptr, Ptr, Ptr, Ptr, U32, U32, U32, U32, U32, U32, F32);
    FlashFwdSF16D64 = "flash_fwd_s_f16_d64" (Ptr, Ptr, Ptr, Ptr, Ptr, U32, U32, U32, U32, U32, U32, F32);
    FlashBwdDqSBf16D64 = "flash_bwd_dq_s_bf16_d64" (Ptr, Ptr, Ptr, Ptr, Ptr, Ptr, Ptr, U32, U32, U32, U32, U32, U32, F32);
    FlashBwdDqSF16D64 = "flash_bwd_dq_s_f16_d64" (Ptr, Ptr, Ptr, Ptr, Ptr, Ptr, Ptr, U32, U32, U32, U32, U32, U32, F32);
    FlashBwdDkdvSBf16D64 = "flash_bwd_dkdv_s_bf16_d64" (Ptr, Ptr, Ptr, Ptr, Ptr, Ptr, Ptr, Ptr, U32, U32, U32, U32, U32, U32, F32);
    FlashBwdDkdvSF16D64 = "flash_bwd_dkdv_s_f16_d64" (Ptr, Ptr, Ptr, Ptr, Ptr, Ptr, Ptr, Ptr, U32, U32, U32, U32, U32, U32, F32);
    // Decoding with a KV cache: kernels/decode.cu.
    DecodePartialBf16D64 = "decode_partial_bf16_d64" (Ptr, Ptr, Ptr, Ptr, Ptr, Ptr, U32, U32, U32, U32, F32, Ptr);
    DecodePartialBf16D128 = "decode_partial_bf16_d128" (Ptr, Ptr, Ptr, Ptr, Ptr, Ptr, U32, U32, U32, U32, F32, Ptr);
    DecodePartialF16D64 = "decode_partial_f16_d64" (Ptr, Ptr, Ptr, Ptr, Ptr, Ptr, U32, U32, U32, U32, F32, Ptr);
    DecodePartialF16D128 = "decode_partial_f16_d128" (Ptr, Ptr, Ptr, Ptr, Ptr, Ptr, U32, U32, U32, U32, F32, Ptr);
    DecodeCombineBf16 = "decode_combine_bf16" (Ptr, Ptr, Ptr, U32, U32, U32);
    DecodeCombineF16 = "decode_combine_f16" (Ptr, Ptr, Ptr, U32, U32, U32);
    DecodePartialF32Any = "decode_partial_f32_any" (Ptr, Ptr, Ptr, Ptr, Ptr, Ptr, U32, U32, U32, U32, F32, U32, Ptr);
    DecodePartialBf16Any = "decode_partial_bf16_any" (Ptr, Ptr, Ptr, Ptr, Ptr, Ptr, U32, U32, U32, U32, F32, U32, Ptr);
    DecodePartialF16Any = "decode_partial_f16_any" (Ptr, Ptr, Ptr, Ptr, Ptr, Ptr, U32, U32, U32, U32, F32, U32, Ptr);
    DecodeCombineF32 = "decode_combine_f32" (Ptr, Ptr, Ptr, U32, U32, U32);
    DecodeAppendPartialBf16D64 = "decode_append_partial_bf16_d64" (Ptr, Ptr, Ptr, Ptr, Ptr, Ptr, U32, U32, U32, U32, F32, Ptr);
    DecodeAppendPartialBf16D128 = "decode_append_partial_bf16_d128" (Ptr, Ptr, Ptr, Ptr, Ptr, Ptr, U32, U32, U32, U32, F32, Ptr);
    DecodeAppendPartialF16D64 = "decode_append_partial_f16_d64" (Ptr, Ptr, Ptr, Ptr, Ptr, Ptr, U32, U32, U32, U32, F32, Ptr);
    DecodeAppendPartialF16D128 = "decode_append_partial_f16_d128" (Ptr, Ptr, Ptr, Ptr, Ptr, Ptr, U32, U32, U32, U32, F32, Ptr);
    DecodeAppendPartialF32Any = "decode_append_partial_f32_any" (Ptr, Ptr, Ptr, Ptr, Ptr, Ptr, U32, U32, U32, U32, F32, U32, Ptr);
    DecodeAppendPartialBf16Any = "decode_append_partial_bf16_any" (Ptr, Ptr, Ptr, Ptr, Ptr, Ptr, U32, U32, U32, U32, F32, U32, Ptr);
    DecodeAppendPartialF16Any = "decode_append_partial_f16_any" (Ptr, Ptr, Ptr, Ptr, Ptr, Ptr, U32, U32, U32, U32, F32, U32, Ptr);
    DecodeAppendCombineF32 = "decode_append_combine_f32" (Ptr, Ptr, Ptr, Ptr, U32, U32, U32, U32);
    DecodeAppendCombineBf16 = "decode_append_combine_bf16" (Ptr, Ptr, Ptr, Ptr, U32, U32, U32, U32);
    DecodeAppendCombineF16 = "decode_append_combine_f16" (Ptr, Ptr, Ptr, Ptr, U32, U32, U32, U32);
    DecodeAppendOneBf16D64 = "decode_append_one_bf16_d64" (Ptr, Ptr, Ptr, Ptr, Ptr, U32, U32, U32, F32, Ptr);
    DecodeAppendOneBf16D128 = "decode_append_one_bf16_d128" (Ptr, Ptr, Ptr, Ptr, Ptr, U32, U32, U32, F32, Ptr);
    DecodeAppendOneF16D64 = "decode_append_one_f16_d64" (Ptr, Ptr, Ptr, Ptr, Ptr, U32, U32, U32, F32, Ptr);
    DecodeAppendOneF16D128 = "decode_append_one_f16_d128" (Ptr, Ptr, Ptr, Ptr, Ptr, U32, U32, U32, F32, Ptr);
    KvCacheFillU16 = "kv_cache_fill_u16" (Ptr, Ptr, Ptr, Ptr, U32, U32, U32, U32, U32);
    KvCacheFillU32 = "kv_cache_fill_u32" (Ptr, Ptr, Ptr, Ptr, U32, U32, U32, U32, U32);
    GenerationStep = "generation_step" (Ptr, Ptr, Ptr, Ptr, Ptr, Ptr, Ptr, Ptr, Ptr, Ptr, Ptr, U32, U32);
    KvCacheAppendU16 = "kv_cache_append_u16" (Ptr, Ptr, Ptr, Ptr, Ptr, U32, U32, U32, Ptr);
    KvCacheAppendU32 = "kv_cache_append_u32" (Ptr, Ptr, Ptr, Ptr, Ptr, U32, U32, U32, Ptr);
    ArgmaxRowsF32 = "argmax_rows_f32" (Ptr, Ptr, U32, U32);
    ArgmaxRowsBf16 = "argmax_rows_bf16" (Ptr, Ptr, U32, U32);
    ArgmaxRowsF16 = "argmax_rows_f16" (Ptr, Ptr, U32, U32);
    SampleRowsF32 = "sample_rows_f32" (Ptr, Ptr, Ptr, U32, U32, F32, U32);
    SampleRowsBf16 = "sample_rows_bf16" (Ptr, Ptr, Ptr, U32, U32, F32, U32);
    SampleRowsF16 = "sample_rows_f16" (Ptr, Ptr, Ptr, U32, U32, F32, U32);
}

/// The tile shapes of the fused attention kernels (`kernels/flash.cu`), one place for both
/// sides: NVRTC gets them as `-DFA_<KIND><D>=tile,warps,mt` and the launches size their grids
/// and shared memory from them. Chosen by sweeping `bench/flash_sweep.py` on an H200
/// (docs/results/flash-sweep-2026-12-01b.txt, -c.txt and -d.txt): two row blocks a warp at head
/// dim 64 (each fragment loaded serves both) where that does not spill, one at head dim 128 (the
/// forward there: 8 warps of 16 queries, Q's fragments in registers; 267 against 256 TFLOP/s for
/// 4 warps of 32 at seq 4096, causal).
///
/// A second set at head dim 64 serves small grids ([`FlashTiles::for_call`]): with few (batch,
/// head) pairs, a causal call's blocks have very unequal work (a row tile's keys grow with its
/// position) and too few blocks to balance it; narrower tiles give more, shorter blocks. At the
/// GPT's shapes (8 heads of 64, 4,096 tokens) they cut the three kernels from 213 to 145 us at
/// 16 x 256, 241 to 188 at 4 x 1024 and 633 to 533 at 1 x 4096
/// (docs/results/flash-gpt-shapes-2026-12-01.txt).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct FlashTiles {
    /// Forward: keys per tile, warps, row blocks of 16 queries per warp.
    pub(crate) fwd: (usize, usize, usize),
    /// dQ: keys per tile, warps, row blocks of 16 queries per warp.
    pub(crate) dq: (usize, usize, usize),
    /// dK/dV: queries per tile, warps, row blocks of 16 keys per warp.
    pub(crate) dkv: (usize, usize, usize),
    /// The small-grid builds (`_s_` kernels).
    pub(crate) small: bool,
}

impl FlashTiles {
    /// The head dimensions the kernels are built for.
    pub(crate) const HEAD_DIMS: [usize; 2] = [64, 128];

    /// The large-grid set of `head_dim`.
    pub(crate) const fn of(head_dim: usize) -> FlashTiles {
        if head_dim == 64 {
            FlashTiles { fwd: (64, 4, 2), dq: (32, 4, 2), dkv: (128, 4, 1), small: false }
        } else {
            FlashTiles { fwd: (128, 8, 1), dq: (64, 4, 1), dkv: (64, 4, 1), small: false }
        }
    }

    /// The small-grid set of `head_dim`, where there is one (head dim 64).
    pub(crate) const fn small(head_dim: usize) -> Option<FlashTiles> {
        if head_dim == 64 {
            Some(FlashTiles { fwd: (64, 4, 1), dq: (64, 4, 1), dkv: (128, 4, 1), small: true })
        } else {
            None
        }
    }

    /// The set for a call of `batch · heads` (query head) rows of `seq` tokens on a GPU of
    /// `sms` multiprocessors: the small-grid one when the large set's forward would launch
    /// fewer than four blocks a multiprocessor.
    pub(crate) fn for_call(head_dim: usize, batch_heads: usize, seq: usize, sms: usize) -> FlashTiles {
        let large = Self::of(head_dim);
        let blocks = batch_heads.saturating_mul(seq.div_ceil(Self::rows(large.fwd)));
        match Self::small(head_dim) {
            Some(small) if blocks < 4 * sms => small,
            _ => large,
        }
    }

    /// Rows (queries, or keys for dK/dV) one block of `(tile, warps, mt)` covers.
    pub(crate) const fn rows((_, warps, mt): (usize, usize, usize)) -> usize {
        16 * warps * mt
    }

    /// Dynamic shared memory, in bytes, of the forward, dQ and dK/dV kernels at `head_dim`.
    pub(crate) const fn smem(self, head_dim: usize) -> [usize; 3] {
        let (f, q, kv) = (Self::rows(self.fwd), Self::rows(self.dq), Self::rows(self.dkv));
        [
            (f + 4 * self.fwd.0) * head_dim * 2,
            (2 * q + 4 * self.dq.0) * head_dim * 2,
            (2 * kv + 4 * self.dkv.0) * head_dim * 2 + 4 * self.dkv.0 * 4,
        ]
    }

    /// The NVRTC options that build the kernels with these shapes (both sets).
    pub(crate) fn nvrtc_defines() -> Vec<String> {
        let define = |kind: &str, (a, b, c): (usize, usize, usize)| format!("-DFA_{kind}={a},{b},{c}");
        let mut defines = Vec::new();
        for d in Self::HEAD_DIMS {
            let t = Self::of(d);
            defines.extend([("FWD", t.fwd), ("DQ", t.dq), ("DKV", t.dkv)].map(|(k, s)| define(&format!("{k}{d}"), s)));
            if let Some(t) = Self::small(d) {
                defines.extend(
                    [("FWDS", t.fwd), ("DQS", t.dq), ("DKVS", t.dkv)].map(|(k, s)| define(&format!("{k}{d}"), s)),
                );
            }
        }
        defines
    }
}

/// The launch shapes of the row kernels (`rms_rows_*`, `rms_rows_bwd_*`, and through the
/// forward's shape `ln_rows_*`, `ln_rows_bwd_*` and `sx_rows_*`, in `kernels/transformer.cu`),
/// one place for both sides: NVRTC gets the words a thread holds as
/// `-DRN_FWD_VPT` / `-DRN_BWD_VPT`, and the launches size their blocks and grids from the rest.
/// A row of `d` values is spread over `tpr` threads (a power of two, the fewest that hold it
/// with `vpt` 16-byte words each), `threads / tpr` rows a block, grid-stride over the row
/// groups. The forward launches a block per row group up to a cap (`sx_rows_*` without the
/// cap: ops/loss.rs says why); the backward a fixed number
/// of blocks (at most `bwd.2`), each writing one row of weight-grad partials, which a second
/// kernel adds in order. Chosen by `bench/row_sweep.py --quick` on an H200 (2026-12-01: the
/// best geometric mean of x-of-floor over 4096x512, 16384x1024 and 4096x4096 in bf16, the
/// forward with residual add + RMSNorm, the backward with its fused form; 512-thread backward
/// blocks cannot launch there, they ask for more registers than a block has).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct RowTiles {
    /// Forward: 16-byte words a thread holds, threads a block, blocks at most.
    pub(crate) fwd: (usize, usize, usize),
    /// Backward: 16-byte words a thread holds, threads a block, blocks at most.
    pub(crate) bwd: (usize, usize, usize),
}

/// The launch of one row kernel: the block is `(tpr, rows a block)`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RowLaunch {
    pub(crate) dims: super::LaunchDims,
}

impl RowTiles {
    /// The shapes the runtime builds and launches with.
    pub(crate) const CHOSEN: RowTiles = RowTiles { fwd: (4, 256, 528), bwd: (2, 256, 264) };

    /// The most threads a row: a block of the row kernels holds at most this many threads,
    /// since they keep the row in registers (on the H200, 512-thread blocks of the backward ask
    /// for more registers than a block has).
    pub(crate) const MAX_ROW_THREADS: usize = 256;

    /// Threads a row for rows of `d` values of `elem` bytes at `vpt` words a thread, or `None`
    /// when a row needs more than [`RowTiles::MAX_ROW_THREADS`] (the ops then run the plain
    /// kernels).
    pub(crate) fn row_threads(d: usize, elem: usize, vpt: usize) -> Option<usize> {
        let tpr = d.div_ceil(vpt * (16 / elem)).max(1).next_power_of_two();
        (tpr <= Self::MAX_ROW_THREADS).then_some(tpr)
    }

    fn launch(rows: usize, tpr: usize, threads: usize, max_blocks: usize, shared: usize) -> RowLaunch {
        let rpb = (threads / tpr).max(1);
        let blocks = rows.div_ceil(rpb).clamp(1, max_blocks);
        let dims = super::LaunchDims { grid: (blocks as u32, 1, 1), block: (tpr as u32, rpb as u32, 1), shared: 0 };
        RowLaunch { dims: super::LaunchDims { shared: (shared * tpr * rpb) as u32, ..dims } }
    }

    /// The forward's launch over `rows` rows of `d` values of `elem` bytes, if the row fits.
    pub(crate) fn fwd_launch(self, rows: usize, d: usize, elem: usize) -> Option<RowLaunch> {
        let tpr = Self::row_threads(d, elem, self.fwd.0)?;
        Some(Self::launch(rows, tpr, self.fwd.1, self.fwd.2, 0))
    }

    /// The backward's launch, with its dynamic shared memory (a 16-byte word's values, as f32,
    /// per thread), if the row fits.
    pub(crate) fn bwd_launch(self, rows: usize, d: usize, elem: usize) -> Option<RowLaunch> {
        let tpr = Self::row_threads(d, elem, self.bwd.0)?;
        Some(Self::launch(rows, tpr, self.bwd.1, self.bwd.2, 4 * (16 / elem)))
    }

    /// Whether the RMSNorm forward and the other row kernels load the next row group ahead
    /// (`RN_PREFETCH_FWD`, `RN_PREFETCH` in kernels/transformer.cu, where the measurement that
    /// chose them is): the RMSNorm forward no, the others yes. `GRAPHED_ROW_PREFETCH` (a bit
    /// mask: 1 the RMSNorm forward, 2 the others) overrides both, for measurements.
    pub(crate) const PREFETCH: (bool, bool) = (false, true);

    /// Slots of the ring forms' shared memory (`RN_RING` in kernels/transformer.cu: the group
    /// in hand and the ones in flight).
    pub(crate) const RING_SLOTS: usize = 2;

    /// Slots of LayerNorm's one-pass f32 backward's ring (`LN_RING_STAGES` in
    /// kernels/transformer.cu: each a row of dy and one of x, filled by bulk copies).
    pub(crate) const LN_RING_STAGES: usize = 2;

    /// Whether the bf16 RMSNorm kernels (and their residual-add forms) run as their ring forms,
    /// `rms_ring_bf16` and `rms_ring_bwd_bf16` (the row groups in flight in shared memory; the
    /// same math, with the row sums in another order): the default since they measured faster
    /// (H100, 2026-12-05: the backward 1.26x its bandwidth floor against 1.57x, the GPT 1.1% to
    /// 1.5% faster a step). `GRAPHED_ROW_RING=0` runs the register kernels, for measurements.
    pub(crate) fn ring() -> bool {
        static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        *ON.get_or_init(|| std::env::var("GRAPHED_ROW_RING").map_or(true, |v| v != "0"))
    }

    /// Blocks a cluster of the ring backward on sm_90 (`rms_ring_bwd_cl_bf16`: the blocks of a
    /// cluster add their gamma-grad partials through distributed shared memory, so the second
    /// kernel adds a row a cluster instead of a row a block); 1 launches `rms_ring_bwd_bf16`
    /// without clusters. `GRAPHED_RMS_BWD_CLUSTER=n` overrides it, for measurements; where the
    /// device cannot launch `n` blocks a cluster (below sm_90, past its cluster limit) or the
    /// rows fill fewer than `n` blocks, the plain kernel runs (`ring_bwd_clusters` in
    /// ops/transformer.rs), and a value that is not a number is the default.
    pub(crate) fn bwd_cluster() -> usize {
        static N: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
        *N.get_or_init(|| {
            std::env::var("GRAPHED_RMS_BWD_CLUSTER").ok().and_then(|v| v.parse().ok()).unwrap_or(Self::BWD_CLUSTER)
        })
    }

    /// [`RowTiles::bwd_cluster`]'s default.
    pub(crate) const BWD_CLUSTER: usize = 1;

    /// The ring forward's launch: `l`'s grid and block, with `RING_SLOTS` slots of the block's
    /// rows of `d` values of `elem` bytes (and the residual's with `add`) as dynamic shared memory.
    pub(crate) fn ring_fwd(l: RowLaunch, d: usize, elem: usize, add: bool) -> super::LaunchDims {
        let rows_bytes = l.dims.block.1 as usize * d.div_ceil(16 / elem) * 16;
        let shared = Self::RING_SLOTS * rows_bytes * if add { 2 } else { 1 };
        super::LaunchDims { shared: u32::try_from(shared).unwrap_or(u32::MAX), ..l.dims }
    }

    /// The ring backward's launch: `l`'s (whose shared memory holds the gamma grad's
    /// reduction), plus `RING_SLOTS` slots of dy's, x's (and dsum's with `add`) rows and one
    /// rstd a thread.
    pub(crate) fn ring_bwd(l: RowLaunch, d: usize, elem: usize, add: bool) -> super::LaunchDims {
        let (tpr, rpb) = (l.dims.block.0 as usize, l.dims.block.1 as usize);
        let rows_bytes = rpb * d.div_ceil(16 / elem) * 16;
        let slot = rows_bytes * if add { 3 } else { 2 } + (tpr * rpb).div_ceil(4) * 16;
        let shared = l.dims.shared as usize + Self::RING_SLOTS * slot;
        super::LaunchDims { shared: u32::try_from(shared).unwrap_or(u32::MAX), ..l.dims }
    }

    /// The NVRTC options that build the row kernels with these shapes.
    pub(crate) fn nvrtc_defines() -> Vec<String> {
        let t = Self::CHOSEN;
        let (fwd, bwd) = match std::env::var("GRAPHED_ROW_PREFETCH").ok().and_then(|v| v.parse::<u8>().ok()) {
            Some(m) => (m & 1 != 0, m & 2 != 0),
            None => Self::PREFETCH,
        };
        vec![
            format!("-DRN_FWD_VPT={}", t.fwd.0),
            format!("-DRN_BWD_VPT={}", t.bwd.0),
            format!("-DRN_PREFETCH_FWD={}", u8::from(fwd)),
            format!("-DRN_PREFETCH={}", u8::from(bwd)),
            format!("-DRN_RING={}", Self::RING_SLOTS),
            format!("-DLN_RING_STAGES={}", Self::LN_RING_STAGES),
        ]
    }
}

/// The launch shape of the multi-tensor kernels (`kernels/multi_tensor.cu`), one place for both
/// sides: the optimizers cut their tensors into chunks of [`MultiTensor::CHUNK`] elements when
/// they build their tables, and each launch runs one block of [`MultiTensor::THREADS`] threads
/// per chunk (each thread 8 groups of 4 elements). A chunk is small next to a large weight, so
/// the blocks fill every SM in a few even waves, and large next to a norm's gain, so few blocks
/// idle.
#[derive(Clone, Copy, Debug)]
pub(crate) struct MultiTensor;

impl MultiTensor {
    /// Elements a chunk (a multiple of 4, so every chunk starts as aligned as its tensor).
    pub(crate) const CHUNK: usize = 8192;
    /// Threads a block.
    pub(crate) const THREADS: u32 = 256;
    /// The words of one tensor's entry in a table: five 8-byte pointers and an 8-byte count
    /// (`struct MtTensor`).
    pub(crate) const ENTRY_WORDS: usize = 12;
    /// The pointer slots of an entry.
    pub(crate) const SLOTS: usize = 5;

    /// The launch over `chunks` chunks.
    pub(crate) fn dims(chunks: u32) -> super::LaunchDims {
        super::LaunchDims { grid: (chunks, 1, 1), block: (Self::THREADS, 1, 1), shared: 0 }
    }
}

/// The f32 kernel of an op and its bf16 and f16 variants: picks one by dtype.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Typed(pub(crate) BuiltinKernel, pub(crate) BuiltinKernel, pub(crate) BuiltinKernel);

impl Typed {
    pub(crate) fn get(self, dtype: crate::DType) -> BuiltinKernel {
        match dtype {
            crate::DType::F32 => self.0,
            crate::DType::BF16 => self.1,
            crate::DType::F16 => self.2,
            // The float ops refuse I32 before they pick a kernel (`ops::check_like`); were one
            // to get here, the f32 kernel reads the 4-byte elements in bounds.
            crate::DType::I32 => self.0,
        }
    }
}

impl From<BuiltinKernel> for &'static str {
    fn from(k: BuiltinKernel) -> &'static str {
        k.name()
    }
}

impl BuiltinKernel {
    /// Checks an argument list against the kernel's parameters.
    pub(crate) fn check_args(self, args: &[KArg]) -> Result<()> {
        let params = self.params();
        let kinds = args.iter().map(|a| a.kind());
        if args.len() != params.len() || !kinds.clone().eq(params.iter().copied()) {
            return Err(KernelError::Builtin {
                kernel: self.name(),
                expected: params.iter().map(|k| k.name()).collect(),
                got: kinds.map(ArgKind::name).collect(),
            }
            .into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Error;

    /// The ring forms' shared memory is what kernels/transformer.cu lays out: RN_RING slots of
    /// the block's rows (x, and the residual's), and for the backward the gamma grad's reduction
    /// (the register kernel's) then slots of dy's, x's (and dsum's) rows and one rstd a thread.
    #[test]
    fn the_ring_launches_hold_their_slots() {
        // The GPT's rows: 4,096 of 512 bf16; the forward is 16 rows of 16 threads a block, the
        // backward 8 rows of 32.
        let fwd = RowTiles::CHOSEN.fwd_launch(4096, 512, 2).expect("a row fits");
        assert_eq!((fwd.dims.block.0, fwd.dims.block.1), (16, 16));
        assert_eq!(RowTiles::ring_fwd(fwd, 512, 2, false).shared, 2 * 16 * 64 * 16);
        assert_eq!(RowTiles::ring_fwd(fwd, 512, 2, true).shared, 2 * 2 * 16 * 64 * 16);
        let bwd = RowTiles::CHOSEN.bwd_launch(4096, 512, 2).expect("a row fits");
        assert_eq!((bwd.dims.block.0, bwd.dims.block.1, bwd.dims.shared), (32, 8, 256 * 8 * 4));
        let slot = |arrays: u32| arrays * 8 * 64 * 16 + 256 / 4 * 16;
        assert_eq!(RowTiles::ring_bwd(bwd, 512, 2, false).shared, bwd.dims.shared + 2 * slot(2));
        assert_eq!(RowTiles::ring_bwd(bwd, 512, 2, true).shared, bwd.dims.shared + 2 * slot(3));
        // The launch shape is the register kernel's.
        assert_eq!(RowTiles::ring_fwd(fwd, 512, 2, false).grid, fwd.dims.grid);
        assert_eq!(RowTiles::ring_bwd(bwd, 512, 2, true).block, bwd.dims.block);
        assert!(RowTiles::nvrtc_defines().contains(&format!("-DRN_RING={}", RowTiles::RING_SLOTS)));
        assert!(RowTiles::nvrtc_defines().contains(&format!("-DLN_RING_STAGES={}", RowTiles::LN_RING_STAGES)));
    }

    /// (name, parameter kinds) of every `extern "C" __global__` function in a CUDA source.
    fn parse(src: &str) -> Vec<(String, Vec<ArgKind>)> {
        src.split("extern \"C\" __global__ void ")
            .skip(1)
            .map(|rest| {
                // `__launch_bounds__(..)` may stand before the name.
                let rest = match rest.strip_prefix("__launch_bounds__(") {
                    Some(r) => r.split_once(") ").expect("a closed __launch_bounds__").1,
                    None => rest,
                };
                let (name, rest) = rest.split_once('(').expect("a parameter list");
                let params = rest.split_once(')').expect("a closing parenthesis").0;
                let kinds = params
                    .split(',')
                    .map(|p| {
                        let p = p.trim();
                        if p.contains('*') {
                            ArgKind::Ptr
                        } else {
                            match p.split_whitespace().next() {
                                Some("float") => ArgKind::F32,
                                Some("u32") => ArgKind::U32,
                                Some("u64") => ArgKind::U64,
                                other => panic!("{name}: unknown parameter type {other:?}"),
                            }
                        }
                    })
                    .collect();
                (name.trim().to_string(), kinds)
            })
            .collect()
    }

    #[test]
    fn the_table_matches_the_cuda_sources() {
        let found: Vec<_> = super::super::kernel_source::MAIN.iter().flat_map(|(_, s)| parse(s)).collect();
        for (name, kinds) in &found {
            let k = BuiltinKernel::ALL
                .iter()
                .find(|k| k.name() == name)
                .unwrap_or_else(|| panic!("{name} is not in the table"));
            assert_eq!(k.params(), kinds.as_slice(), "{name}: parameter kinds");
        }
        for k in BuiltinKernel::ALL {
            assert!(found.iter().any(|(n, _)| n == k.name()), "{} is not in the CUDA sources", k.name());
        }
        assert_eq!(found.len(), BuiltinKernel::ALL.len());
    }

    /// Programmatic dependent launch (`GRAPHED_PDL=1`) lets a built-in kernel launch before the
    /// one ahead of it completes: each must wait for it before it touches memory, so each body
    /// starts with `GR_PDL_ENTRY();` (kernels/core.cu).
    #[test]
    fn every_built_in_kernel_starts_by_waiting_for_the_one_before() {
        for (file, src) in super::super::kernel_source::MAIN {
            for body in src.split("extern \"C\" __global__ ").skip(1) {
                let name = body.split('(').next().unwrap_or_default();
                let open = body.find('{').expect("a kernel body");
                assert!(
                    body[open + 1..].trim_start().starts_with("GR_PDL_ENTRY();"),
                    "{file}: kernel {name} does not start with GR_PDL_ENTRY();"
                );
            }
        }
    }

    #[test]
    fn a_wrong_argument_list_is_a_typed_error() {
        assert!(BuiltinKernel::FillF32.check_args(&[KArg::Ptr(0), KArg::F32(1.0), KArg::U32(3)]).is_ok());
        assert!(matches!(
            BuiltinKernel::FillF32.check_args(&[KArg::Ptr(0), KArg::U32(3)]),
            Err(Error::Kernel(KernelError::Builtin { kernel: "fill_f32", .. }))
        ));
        assert!(matches!(
            BuiltinKernel::FillF32.check_args(&[KArg::Ptr(0), KArg::U32(1), KArg::U32(3)]),
            Err(Error::Kernel(KernelError::Builtin { .. }))
        ));
    }
}
