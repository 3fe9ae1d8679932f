//! Causal scaled-dot-product attention (#13): strided-batched GEMMs around a causal softmax that
//! keeps only the row statistics (`lse`); the backward recomputes the scores from them.

use crate::backend::{BuiltinKernel, CudaBackend, HostBackend, KArg, LaunchDims, RowGemmBatched, RowMat};
use crate::ops::cpu::{self, AttnDims, AttnSaved};
use crate::ops::{check_f32_on, check_like, check_shape, exec, gemm_dim, k, n32, warp_rows, Exec};
use crate::{DType, Error, Result, ShapeProblem, Tensor};

/// Checks `q`, `k`, `v` are one `[batch, seq, heads · head_dim]` shape of one dtype; returns
/// the sizes and the dtype.
fn check_qkv(op: &'static str, q: &Tensor, k: &Tensor, v: &Tensor, heads: usize) -> Result<(AttnDims, DType)> {
    let dtype = check_like(op, &[q, k, v])?;
    check_shape(op, q, k)?;
    check_shape(op, q, v)?;
    let &[batch, seq, width] = q.dims() else {
        return Err(Error::shape(op, ShapeProblem::layout("q, k and v", "[batch, seq, width]", q.dims())));
    };
    if heads == 0 || width == 0 || width % heads != 0 || seq == 0 {
        return Err(Error::shape(op, ShapeProblem::Width { arg: "q", got: q.dims().to_vec(), heads }));
    }
    n32(op, batch * heads * seq * seq)?;
    for s in [seq, width] {
        gemm_dim(op, s)?;
    }
    Ok((AttnDims { batch, seq, heads, head_dim: width / heads }, dtype))
}

fn square_dims(a: AttnDims) -> [usize; 4] {
    [a.batch, a.heads, a.seq, a.seq]
}

fn lse_dims(a: AttnDims) -> [usize; 3] {
    [a.batch, a.heads, a.seq]
}

/// Checks that `lse` is an f32 `[batch, heads, seq]` (`dims`) on `q`'s device.
pub(crate) fn check_lse(op: &'static str, lse: &Tensor, q: &Tensor, dims: [usize; 3]) -> Result<()> {
    check_f32_on(op, lse, q)?;
    if lse.dims() != dims {
        return Err(Error::shape(op, ShapeProblem::expected("lse", &dims, "[batch, heads, seq]", lse.dims())));
    }
    Ok(())
}

/// The host half of an attention backward: reads `ins` (dout, q, k, v, out, lse), runs the
/// CPU reference `backward` on them and writes the grads it returns into `outs` (dq, dk, dv).
pub(crate) fn host_backward(
    h: &HostBackend,
    kernel: BuiltinKernel,
    ins: [&Tensor; 6],
    outs: [&Tensor; 3],
    backward: impl Fn(AttnSaved<'_>) -> (Vec<f32>, Vec<f32>, Vec<f32>) + Send + Sync + 'static,
) -> Result<()> {
    let [dop, qp, kp, vp, op, lp] = ins.map(|t| t.host_ptr());
    let ins = [dop?, qp?, kp?, vp?, op?, lp?];
    let [gq, gk, gv] = outs.map(|t| t.host_ptr());
    let outs = [gq?, gk?, gv?];
    h.run(kernel, move || {
        let [dout, q, k, v, out, lse] = ins.each_ref().map(|t| t.read());
        let (gq, gk, gv) = backward(AttnSaved { dout: &dout, q: &q, k: &k, v: &v, out: &out, lse: &lse });
        outs[0].write(&gq);
        outs[1].write(&gk);
        outs[2].write(&gv);
        Ok(())
    })
}

/// Causal scaled-dot-product attention: per head, `P = softmax(Q·Kᵀ / sqrt(head_dim))` with
/// position `i` attending to positions `j <= i` only, and `out = P·V`.
///
/// `q`, `k` and `v` are `[batch, seq, heads · head_dim]` of one dtype (f32, bf16 or f16; the
/// outputs of linear layers, heads side by side); returns `(out, lse)`: `out` of that shape
/// and dtype, and `lse`, f32 `[batch, heads, seq]`, each row's logsumexp of its scaled, causally
/// masked scores (its largest scaled score plus the log of the sum of the exponentials). The
/// backward rebuilds the probabilities from `lse`, so nothing of size `seq²` outlives the call.
/// On CUDA `q`, `k` and `v` are copied head-major (`[batch, heads, seq, head_dim]`, one
/// 16-byte word per thread) so that each product is one strided-batched GEMM over all
/// `batch · heads` heads (16-bit inputs accumulate in f32, scores are f32, the probabilities
/// are stored in the dtype for `P·V`), and the softmax is one warp per row in f32; nothing
/// uses atomics, so replays are bitwise equal to eager runs.
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
            let g = Heads { c, op: OP, a, dtype };
            let [qh, kh, vh] = [q, k, v].map(|t| g.to_heads(t));
            let (qh, kh, vh) = (qh?, kh?, vh?);
            let scores = Tensor::empty(q.device(), &square_dims(a))?;
            let probs = stored_as(&scores, dtype)?;
            let oh = Tensor::empty_like(q)?;
            let (sp, pp) = (scores.cuda_ptr()?, probs.cuda_ptr()?);
            let (t, dh, f32_) = (a.seq, a.head_dim, DType::F32);
            g.gemm((t, t, dh), g.head(&qh, false)?, g.head(&kh, true)?, square(a, sp, f32_, false))?;
            score_rows(c, kernel, a, &[KArg::Ptr(pp), KArg::Ptr(lse.cuda_ptr()?), KArg::Ptr(sp)], &[])?;
            g.gemm((t, dh, t), square(a, pp, dtype, false), g.head(&vh, false)?, g.head(&oh, false)?)?;
            g.write_back(&oh, &out)?;
            // The temporaries go back to the pool here; later work on the stream is ordered
            // after the kernels above, so reusing their memory is safe.
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
    check_lse(OP, lse, q, lse_dims(a))?;
    let (dq, dk, dv) = (Tensor::empty_like(q)?, Tensor::empty_like(q)?, Tensor::empty_like(q)?);
    let kernel = k::ATTN_BWD_SCORES.get(dtype);
    match exec(q.device()) {
        Exec::Host(h) => {
            host_backward(h, kernel, [dout, q, k, v, out, lse], [&dq, &dk, &dv], move |saved| {
                cpu::causal_attention_backward(saved, a, dtype)
            })?;
        }
        Exec::Cuda(c) => backward_cuda(c, OP, a, dtype, [dout, q, k, v, out, lse], [&dq, &dk, &dv])?,
    }
    Ok((dq, dk, dv))
}

/// The CUDA backward: recompute the scores, the fused score kernel, three GEMMs, on head-major
/// copies of the operands.
fn backward_cuda(
    c: &CudaBackend,
    op: &'static str,
    a: AttnDims,
    dtype: DType,
    ins: [&Tensor; 6],
    grads: [&Tensor; 3],
) -> Result<()> {
    let [dout, q, k, v, out, lse] = ins;
    let g = Heads { c, op, a, dtype };
    let [doh, qh, kh, vh] = [dout, q, k, v].map(|t| g.to_heads(t));
    let (doh, qh, kh, vh) = (doh?, qh?, kh?, vh?);
    let [gqh, gkh, gvh] = grads.map(Tensor::empty_like);
    let (gqh, gkh, gvh) = (gqh?, gkh?, gvh?);
    let device = q.device();
    let (scores, dprobs) = (Tensor::empty(device, &square_dims(a))?, Tensor::empty(device, &square_dims(a))?);
    let (probs, dscores) = (stored_as(&scores, dtype)?, stored_as(&dprobs, dtype)?);
    let [sp, dpp, pp, dsp] = [&scores, &dprobs, &probs, &dscores].map(|t| t.cuda_ptr());
    let (sp, dpp, pp, dsp) = (sp?, dpp?, pp?, dsp?);
    let (t, dh, f32_) = (a.seq, a.head_dim, DType::F32);
    g.gemm((t, t, dh), g.head(&qh, false)?, g.head(&kh, true)?, square(a, sp, f32_, false))?;
    g.gemm((t, t, dh), g.head(&doh, false)?, g.head(&vh, true)?, square(a, dpp, f32_, false))?;
    let ptrs = [pp, dsp, sp, dpp, lse.cuda_ptr()?, dout.cuda_ptr()?, out.cuda_ptr()?].map(KArg::Ptr);
    let sizes = [KArg::U32(a.heads as u32), KArg::U32(dh as u32)];
    score_rows(c, k::ATTN_BWD_SCORES.get(dtype), a, &ptrs, &sizes)?;
    g.gemm((t, dh, t), square(a, pp, dtype, true), g.head(&doh, false)?, g.head(&gvh, false)?)?;
    g.gemm((t, dh, t), square(a, dsp, dtype, false), g.head(&kh, false)?, g.head(&gqh, false)?)?;
    g.gemm((t, dh, t), square(a, dsp, dtype, true), g.head(&qh, false)?, g.head(&gkh, false)?)?;
    for (h, grad) in [&gqh, &gkh, &gvh].into_iter().zip(grads) {
        g.write_back(h, grad)?;
    }
    Ok(())
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

/// Every head's `[seq, seq]` matrix of a `[batch, heads, seq, seq]` tensor.
fn square(a: AttnDims, ptr: u64, dtype: DType, trans: bool) -> RowMat {
    RowMat { ptr, dtype, ld: a.seq, stride: a.seq * a.seq, trans }
}

/// The GEMMs of one attention call, over head-major operands: `[batch, heads, seq, head_dim]`
/// copies of the `[batch, seq, heads · head_dim]` tensors, so that every product is one
/// strided-batched GEMM over all `batch · heads` heads.
struct Heads<'a> {
    c: &'a CudaBackend,
    op: &'static str,
    a: AttnDims,
    dtype: DType,
}

impl Heads<'_> {
    /// `t` (`[batch, seq, heads · head_dim]`) as a new head-major tensor.
    fn to_heads(&self, t: &Tensor) -> Result<Tensor> {
        let h = Tensor::empty_like(t)?;
        self.swap(t, &h, (self.a.seq, self.a.heads))?;
        Ok(h)
    }

    /// Writes the head-major `h` into `t` (`[batch, seq, heads · head_dim]`).
    fn write_back(&self, h: &Tensor, t: &Tensor) -> Result<()> {
        self.swap(h, t, (self.a.heads, self.a.seq))
    }

    /// `y[b, q, p, e] = x[b, p, q, e]` for `(p, q)` = `pq`.
    fn swap(&self, x: &Tensor, y: &Tensor, (p, q): (usize, usize)) -> Result<()> {
        let a = self.a;
        let dims = [a.batch, p, q, a.head_dim].map(|n| KArg::U32(n as u32));
        let mut args = vec![KArg::Ptr(y.cuda_ptr()?), KArg::Ptr(x.cuda_ptr()?)];
        args.extend(dims);
        self.c.launch(k::SWAP12.get(self.dtype), LaunchDims::vectorized(x.numel(), self.dtype), &args)
    }

    /// Every head's `[seq, head_dim]` matrix of a head-major tensor.
    fn head(&self, t: &Tensor, trans: bool) -> Result<RowMat> {
        let (dh, seq) = (self.a.head_dim, self.a.seq);
        Ok(RowMat { ptr: t.cuda_ptr()?, dtype: t.dtype(), ld: dh, stride: seq * dh, trans })
    }

    /// One strided-batched GEMM over all heads.
    fn gemm(&self, (m, n, k): (usize, usize, usize), a: RowMat, b: RowMat, c: RowMat) -> Result<()> {
        let batch = self.a.batch * self.a.heads;
        self.c.gemm_strided_batched(&RowGemmBatched { op: self.op, m, n, k, a, b, beta: 0.0, c, batch })
    }
}

/// A kernel with one warp per score row (8 rows a block): `kernel(ptrs.., rows, seq, sizes..,
/// scale)`.
fn score_rows(c: &CudaBackend, kernel: BuiltinKernel, a: AttnDims, ptrs: &[KArg], sizes: &[KArg]) -> Result<()> {
    let rows = a.batch * a.heads * a.seq;
    let mut args = ptrs.to_vec();
    args.extend([KArg::U32(rows as u32), KArg::U32(a.seq as u32)]);
    args.extend_from_slice(sizes);
    args.push(KArg::F32(a.scale()));
    c.launch(kernel, warp_rows(rows), &args)
}
