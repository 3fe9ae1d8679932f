//! Causal scaled-dot-product attention (#13): strided-batched GEMMs around a causal softmax that
//! keeps only the row statistics (`lse`); the backward recomputes the scores from them.

use crate::backend::{BuiltinKernel, CudaBackend, KArg, RowGemmBatched, RowMat};
use crate::ops::cpu::{self, AttnDims, AttnSaved};
use crate::ops::{check_f32_on, check_like, check_shape, exec, k, n32, row_dims, Exec};
use crate::{DType, Error, Result, Tensor};

/// Checks `q`, `k`, `v` are one `[batch, seq, heads · head_dim]` shape of one dtype; returns
/// the sizes and the dtype.
fn check_qkv(op: &'static str, q: &Tensor, k: &Tensor, v: &Tensor, heads: usize) -> Result<(AttnDims, DType)> {
    let dtype = check_like(op, &[q, k, v])?;
    check_shape(op, q, k)?;
    check_shape(op, q, v)?;
    let &[batch, seq, width] = q.dims() else {
        return Err(Error::shape(op, format!("q, k and v must be [batch, seq, width], got {:?}", q.dims())));
    };
    if heads == 0 || width == 0 || width % heads != 0 || seq == 0 {
        return Err(Error::shape(op, format!("width {width} must be a nonzero multiple of heads = {heads}, seq > 0")));
    }
    n32(op, batch * heads * seq * seq)?;
    for s in [seq, width] {
        if s > i32::MAX as usize {
            return Err(Error::invalid(op, format!("dimension {s} exceeds the i32 range cuBLAS supports")));
        }
    }
    Ok((AttnDims { batch, seq, heads, head_dim: width / heads }, dtype))
}

fn square_dims(a: AttnDims) -> [usize; 4] {
    [a.batch, a.heads, a.seq, a.seq]
}

fn lse_dims(a: AttnDims) -> [usize; 3] {
    [a.batch, a.heads, a.seq]
}

/// Causal scaled-dot-product attention: per head, `P = softmax(Q·Kᵀ / sqrt(head_dim))` with
/// position `i` attending to positions `j <= i` only, and `out = P·V`.
///
/// `q`, `k` and `v` are `[batch, seq, heads · head_dim]` of one dtype (f32, bf16 or f16; the
/// outputs of linear layers, heads side by side); returns `(out, lse)`: `out` of that shape
/// and dtype, and `lse`, f32 `[batch, heads, seq]`, each row's logsumexp of its scaled, causally
/// masked scores (its largest scaled score plus the log of the sum of the exponentials). The
/// backward rebuilds the probabilities from `lse`, so nothing of size `seq²` outlives the call.
/// On CUDA each product is one strided-batched GEMM per sequence (the heads are the batch;
/// 16-bit inputs accumulate in f32, scores are f32, the probabilities are stored in the dtype
/// for `P·V`) and the softmax is one block per row in f32; nothing uses atomics, so replays
/// are bitwise equal to eager runs.
///
/// ```
/// # use graphed::{ops, Device, Tensor};
/// let dev = Device::host();
/// let q = Tensor::from_slice(&dev, &[1.0, 0.0, 1.0, 0.0], &[1, 2, 2])?;
/// let v = Tensor::from_slice(&dev, &[1.0, 2.0, 3.0, 4.0], &[1, 2, 2])?;
/// let (out, lse) = ops::causal_attention(&q, &q, &v, 1)?;
/// assert_eq!(out.to_vec()?, vec![1.0, 2.0, 2.0, 3.0]); // equal scores on row 2
/// let s = 1.0 / 2f32.sqrt(); // the one score q·k, scaled
/// let l = lse.to_vec()?;
/// assert!((l[0] - s).abs() < 1e-6 && (l[1] - (s + 2f32.ln())).abs() < 1e-6);
/// # Ok::<(), graphed::Error>(())
/// ```
pub fn causal_attention(q: &Tensor, k: &Tensor, v: &Tensor, heads: usize) -> Result<(Tensor, Tensor)> {
    const OP: &str = "causal_attention";
    let (a, dtype) = check_qkv(OP, q, k, v, heads)?;
    let (out, lse) = (Tensor::empty_like(q)?, Tensor::empty(q.device(), &lse_dims(a))?);
    let kernel = k::ATTN_SOFTMAX_LSE.get(dtype);
    match exec(q.device()) {
        Exec::Host(h) => {
            let (qp, kp, vp, op, lp) = (q.host_ptr()?, k.host_ptr()?, v.host_ptr()?, out.host_ptr()?, lse.host_ptr()?);
            h.run(kernel, move || {
                let (o, l) = cpu::causal_attention(&qp.read(), &kp.read(), &vp.read(), a, dtype);
                op.write(&o);
                lp.write(&l);
                Ok(())
            })?;
        }
        Exec::Cuda(c) => {
            let (qp, kp, vp) = (q.cuda_ptr()?, k.cuda_ptr()?, v.cuda_ptr()?);
            let scores = Tensor::empty(q.device(), &square_dims(a))?;
            let probs = stored_as(&scores, dtype)?;
            let (sp, pp) = (scores.cuda_ptr()?, probs.cuda_ptr()?);
            let (t, dh, f32_) = (a.seq, a.head_dim, DType::F32);
            let g = Heads { c, op: OP, a };
            g.gemm((t, t, dh), head(a, qp, dtype, false), head(a, kp, dtype, true), square(a, sp, f32_, false))?;
            score_rows(c, kernel, a, &[KArg::Ptr(pp), KArg::Ptr(lse.cuda_ptr()?), KArg::Ptr(sp)], &[])?;
            let op = out.cuda_ptr()?;
            g.gemm((t, dh, t), square(a, pp, dtype, false), head(a, vp, dtype, false), head(a, op, dtype, false))?;
            // `scores` and `probs` go back to the pool here; later work on the stream is
            // ordered after the kernels above, so reusing their memory is safe.
        }
    }
    Ok((out, lse))
}

/// The backward of [`causal_attention`] from its saved `out` and `lse`: returns
/// `(dq, dk, dv)`, each of `q`'s shape and dtype. The scores are recomputed with the same
/// GEMM, `P = exp(scale · s - lse)` (causally masked) and `dS = scale · P ∘ (dP - D)` with
/// `D = rowsum(dO ∘ out)` come from one fused kernel (FlashAttention's backward), then
/// `dV = Pᵀ·dO`, `dQ = dS·K`, `dK = dSᵀ·Q`. `dout` and `out` have `q`'s shape and dtype,
/// `lse` is f32 `[batch, heads, seq]`.
///
/// ```
/// # use graphed::{ops, Device, Tensor};
/// let dev = Device::host();
/// let q = Tensor::from_slice(&dev, &[1.0, 0.0, 1.0, 0.0], &[1, 2, 2])?;
/// let v = Tensor::from_slice(&dev, &[1.0, 2.0, 3.0, 4.0], &[1, 2, 2])?;
/// let (out, lse) = ops::causal_attention(&q, &q, &v, 1)?;
/// let dout = Tensor::from_slice(&dev, &[0.0, 0.0, 1.0, 1.0], &[1, 2, 2])?;
/// let (_, _, dv) = ops::causal_attention_backward(&dout, &q, &q, &v, &out, &lse, 1)?;
/// let dv = dv.to_vec()?;
/// assert!(dv.iter().all(|g| (g - 0.5).abs() < 1e-6)); // row 2 averaged both values
/// # Ok::<(), graphed::Error>(())
/// ```
pub fn causal_attention_backward(
    dout: &Tensor,
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    out: &Tensor,
    lse: &Tensor,
    heads: usize,
) -> Result<(Tensor, Tensor, Tensor)> {
    const OP: &str = "causal_attention_backward";
    let (a, dtype) = check_qkv(OP, q, k, v, heads)?;
    check_like(OP, &[q, dout, out])?;
    check_shape(OP, dout, q)?;
    check_shape(OP, out, q)?;
    check_f32_on(OP, lse, q)?;
    if lse.dims() != lse_dims(a) {
        return Err(Error::shape(OP, format!("lse {:?} must be {:?}", lse.dims(), lse_dims(a))));
    }
    let (dq, dk, dv) = (Tensor::empty_like(q)?, Tensor::empty_like(q)?, Tensor::empty_like(q)?);
    let kernel = k::ATTN_BWD_SCORES.get(dtype);
    match exec(q.device()) {
        Exec::Host(h) => {
            let ins = [dout, q, k, v, out, lse].map(|t| t.host_ptr());
            let [dop, qp, kp, vp, op, lp] = ins;
            let ins = [dop?, qp?, kp?, vp?, op?, lp?];
            let outs = [dq.host_ptr()?, dk.host_ptr()?, dv.host_ptr()?];
            h.run(kernel, move || {
                let [dout, q, k, v, out, lse] = ins.each_ref().map(|t| t.read());
                let saved = AttnSaved { dout: &dout, q: &q, k: &k, v: &v, out: &out, lse: &lse };
                let (gq, gk, gv) = cpu::causal_attention_backward(saved, a, dtype);
                outs[0].write(&gq);
                outs[1].write(&gk);
                outs[2].write(&gv);
                Ok(())
            })?;
        }
        Exec::Cuda(c) => backward_cuda(c, OP, a, dtype, [dout, q, k, v, out, lse], [&dq, &dk, &dv])?,
    }
    Ok((dq, dk, dv))
}

/// The CUDA backward: recompute the scores, the fused score kernel, three GEMMs.
fn backward_cuda(
    c: &CudaBackend,
    op: &'static str,
    a: AttnDims,
    dtype: DType,
    ins: [&Tensor; 6],
    grads: [&Tensor; 3],
) -> Result<()> {
    let [dop, qp, kp, vp, outp, lp] = ins.map(|t| t.cuda_ptr());
    let (dop, qp, kp, vp, outp, lp) = (dop?, qp?, kp?, vp?, outp?, lp?);
    let [gq, gk, gv] = grads.map(|t| t.cuda_ptr());
    let (gq, gk, gv) = (gq?, gk?, gv?);
    let device = ins[1].device();
    let (scores, dprobs) = (Tensor::empty(device, &square_dims(a))?, Tensor::empty(device, &square_dims(a))?);
    let (probs, dscores) = (stored_as(&scores, dtype)?, stored_as(&dprobs, dtype)?);
    let [sp, dpp, pp, dsp] = [&scores, &dprobs, &probs, &dscores].map(|t| t.cuda_ptr());
    let (sp, dpp, pp, dsp) = (sp?, dpp?, pp?, dsp?);
    let (t, dh, f32_) = (a.seq, a.head_dim, DType::F32);
    let g = Heads { c, op, a };
    g.gemm((t, t, dh), head(a, qp, dtype, false), head(a, kp, dtype, true), square(a, sp, f32_, false))?;
    g.gemm((t, t, dh), head(a, dop, dtype, false), head(a, vp, dtype, true), square(a, dpp, f32_, false))?;
    let ptrs = [pp, dsp, sp, dpp, lp, dop, outp].map(KArg::Ptr);
    let sizes = [KArg::U32(a.heads as u32), KArg::U32(dh as u32)];
    score_rows(c, k::ATTN_BWD_SCORES.get(dtype), a, &ptrs, &sizes)?;
    g.gemm((t, dh, t), square(a, pp, dtype, true), head(a, dop, dtype, false), head(a, gv, dtype, false))?;
    g.gemm((t, dh, t), square(a, dsp, dtype, false), head(a, kp, dtype, false), head(a, gq, dtype, false))?;
    g.gemm((t, dh, t), square(a, dsp, dtype, true), head(a, qp, dtype, false), head(a, gk, dtype, false))
}

/// Where the `dtype` copy of the f32 `[batch, heads, seq, seq]` buffer `f32_buf` goes: the
/// buffer itself for f32 (the kernels write each element after reading it), a new one else.
fn stored_as(f32_buf: &Tensor, dtype: DType) -> Result<Tensor> {
    if dtype == DType::F32 {
        Ok(f32_buf.clone())
    } else {
        Tensor::empty_as(f32_buf.device(), f32_buf.dims(), dtype)
    }
}

/// Sequence 0's heads of a `[batch, seq, width]` tensor (`[seq, head_dim]` blocks with row
/// stride `width`, `head_dim` apart) and the elements from one sequence to the next.
fn head(a: AttnDims, ptr: u64, dtype: DType, trans: bool) -> (RowMat, usize) {
    let ld = a.heads * a.head_dim;
    (RowMat { ptr, dtype, ld, stride: a.head_dim, trans }, a.seq * ld)
}

/// Sequence 0's heads of a `[batch, heads, seq, seq]` tensor and the elements between sequences.
fn square(a: AttnDims, ptr: u64, dtype: DType, trans: bool) -> (RowMat, usize) {
    let stride = a.seq * a.seq;
    (RowMat { ptr, dtype, ld: a.seq, stride, trans }, a.heads * stride)
}

/// The GEMMs of one attention call.
struct Heads<'a> {
    c: &'a CudaBackend,
    op: &'static str,
    a: AttnDims,
}

impl Heads<'_> {
    /// One strided-batched GEMM over the heads per sequence `b`, each operand moved to sequence
    /// `b` by its elements per sequence.
    fn gemm(
        &self,
        (m, n, k): (usize, usize, usize),
        ma: (RowMat, usize),
        mb: (RowMat, usize),
        mc: (RowMat, usize),
    ) -> Result<()> {
        let at = |(r, per_seq): (RowMat, usize), b: usize| RowMat {
            ptr: r.ptr + (b * per_seq * r.dtype.size()) as u64,
            ..r
        };
        for b in 0..self.a.batch {
            let (a, bm, c) = (at(ma, b), at(mb, b), at(mc, b));
            let g = RowGemmBatched { op: self.op, m, n, k, a, b: bm, beta: 0.0, c, batch: self.a.heads };
            self.c.gemm_strided_batched(&g)?;
        }
        Ok(())
    }
}

/// A kernel with one block per score row: `kernel(ptrs.., rows, seq, sizes.., scale)`.
fn score_rows(c: &CudaBackend, kernel: BuiltinKernel, a: AttnDims, ptrs: &[KArg], sizes: &[KArg]) -> Result<()> {
    let rows = a.batch * a.heads * a.seq;
    let mut args = ptrs.to_vec();
    args.extend([KArg::U32(rows as u32), KArg::U32(a.seq as u32)]);
    args.extend_from_slice(sizes);
    args.push(KArg::F32(a.scale()));
    c.launch(kernel, row_dims(rows, a.seq.max(a.head_dim)), &args)
}
