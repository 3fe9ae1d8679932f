//! Causal scaled-dot-product attention (#13): strided-batched GEMMs around a causal softmax.

use crate::backend::{BuiltinKernel as B, CudaBackend, KArg, RowGemmBatched, RowMat};
use crate::ops::cpu::{self, AttnDims};
use crate::ops::{check_same, check_shape, exec, n32, row_dims, Exec};
use crate::{Error, Result, Tensor};

/// Checks `q`, `k`, `v` are one `[batch, seq, heads · head_dim]` f32 shape; returns the sizes.
fn check_qkv(op: &'static str, q: &Tensor, k: &Tensor, v: &Tensor, heads: usize) -> Result<AttnDims> {
    check_same(op, &[q, k, v])?;
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
    Ok(AttnDims { batch, seq, heads, head_dim: width / heads })
}

fn probs_dims(a: AttnDims) -> [usize; 4] {
    [a.batch, a.heads, a.seq, a.seq]
}

/// Causal scaled-dot-product attention: per head, `P = softmax(Q·Kᵀ / sqrt(head_dim))` with
/// position `i` attending to positions `j <= i` only, and `out = P·V`.
///
/// `q`, `k` and `v` are `[batch, seq, heads · head_dim]` f32 (the outputs of linear layers,
/// heads side by side); returns `(out, probs)`: `out` of that shape and `probs`
/// `[batch, heads, seq, seq]` (zero above the diagonal), which the backward takes. On CUDA
/// each product is one `cublasSgemmStridedBatched` per sequence (the heads are the batch) and
/// the softmax is one block per row; nothing uses atomics, so replays are bitwise equal to
/// eager runs.
///
/// ```
/// # use graphed::{ops, Device, Tensor};
/// let dev = Device::host();
/// let q = Tensor::from_slice(&dev, &[1.0, 0.0, 1.0, 0.0], &[1, 2, 2])?;
/// let v = Tensor::from_slice(&dev, &[1.0, 2.0, 3.0, 4.0], &[1, 2, 2])?;
/// let (out, probs) = ops::causal_attention(&q, &q, &v, 1)?;
/// assert_eq!(probs.to_vec()?, vec![1.0, 0.0, 0.5, 0.5]); // equal scores on row 2
/// assert_eq!(out.to_vec()?, vec![1.0, 2.0, 2.0, 3.0]);
/// # Ok::<(), graphed::Error>(())
/// ```
pub fn causal_attention(q: &Tensor, k: &Tensor, v: &Tensor, heads: usize) -> Result<(Tensor, Tensor)> {
    const OP: &str = "causal_attention";
    let a = check_qkv(OP, q, k, v, heads)?;
    let (out, probs) = (Tensor::empty_like(q)?, Tensor::empty(q.device(), &probs_dims(a))?);
    match exec(q.device()) {
        Exec::Host(h) => {
            let (qp, kp, vp, op, pp) =
                (q.host_ptr()?, k.host_ptr()?, v.host_ptr()?, out.host_ptr()?, probs.host_ptr()?);
            h.run(B::CausalSoftmaxF32, move || {
                let (o, p) = cpu::causal_attention(&qp.read(), &kp.read(), &vp.read(), a);
                op.write(&o);
                pp.write(&p);
                Ok(())
            })?;
        }
        Exec::Cuda(c) => {
            let (qp, kp, vp) = (q.cuda_ptr()?, k.cuda_ptr()?, v.cuda_ptr()?);
            let (op, pp) = (out.cuda_ptr()?, probs.cuda_ptr()?);
            let scores = Tensor::empty(q.device(), &probs_dims(a))?;
            let sp = scores.cuda_ptr()?;
            heads_gemm(
                c,
                OP,
                a,
                (a.seq, a.seq, a.head_dim),
                head(a, qp, false),
                head(a, kp, true),
                square(a, sp, false),
            )?;
            softmax(c, B::CausalSoftmaxF32, a, &[KArg::Ptr(pp), KArg::Ptr(sp)])?;
            heads_gemm(
                c,
                OP,
                a,
                (a.seq, a.head_dim, a.seq),
                square(a, pp, false),
                head(a, vp, false),
                head(a, op, false),
            )?;
        }
    }
    Ok((out, probs))
}

/// The backward of [`causal_attention`] from its saved `probs`: returns `(dq, dk, dv)`, each
/// of `q`'s shape (`dS = P ∘ (dP - rowsum(P ∘ dP)) / sqrt(head_dim)`, then `dQ = dS·K`,
/// `dK = dSᵀ·Q`, `dV = Pᵀ·dO`).
///
/// ```
/// # use graphed::{ops, Device, Tensor};
/// let dev = Device::host();
/// let q = Tensor::from_slice(&dev, &[1.0, 0.0, 1.0, 0.0], &[1, 2, 2])?;
/// let v = Tensor::from_slice(&dev, &[1.0, 2.0, 3.0, 4.0], &[1, 2, 2])?;
/// let (out, probs) = ops::causal_attention(&q, &q, &v, 1)?;
/// let dout = Tensor::from_slice(&dev, &[0.0, 0.0, 1.0, 1.0], &[1, 2, 2])?;
/// let (_, _, dv) = ops::causal_attention_backward(&dout, &q, &q, &v, &probs, 1)?;
/// assert_eq!(dv.to_vec()?, vec![0.5, 0.5, 0.5, 0.5]); // row 2 averaged both values
/// # Ok::<(), graphed::Error>(())
/// ```
pub fn causal_attention_backward(
    dout: &Tensor,
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    probs: &Tensor,
    heads: usize,
) -> Result<(Tensor, Tensor, Tensor)> {
    const OP: &str = "causal_attention_backward";
    let a = check_qkv(OP, q, k, v, heads)?;
    check_same(OP, &[q, dout, probs])?;
    check_shape(OP, dout, q)?;
    if probs.dims() != probs_dims(a) {
        return Err(Error::shape(OP, format!("probs {:?} must be {:?}", probs.dims(), probs_dims(a))));
    }
    let (dq, dk, dv) = (Tensor::empty_like(q)?, Tensor::empty_like(q)?, Tensor::empty_like(q)?);
    match exec(q.device()) {
        Exec::Host(h) => {
            let ins = [dout.host_ptr()?, q.host_ptr()?, k.host_ptr()?, v.host_ptr()?, probs.host_ptr()?];
            let outs = [dq.host_ptr()?, dk.host_ptr()?, dv.host_ptr()?];
            h.run(B::CausalSoftmaxBwdF32, move || {
                let [d, q, k, v, p] = ins.each_ref().map(|t| t.read());
                let (gq, gk, gv) = cpu::causal_attention_backward(&d, &q, &k, &v, &p, a);
                outs[0].write(&gq);
                outs[1].write(&gk);
                outs[2].write(&gv);
                Ok(())
            })?;
        }
        Exec::Cuda(c) => {
            let [dop, qp, kp, vp, pp] = [dout, q, k, v, probs].map(|t| t.cuda_ptr());
            let (dop, qp, kp, vp, pp) = (dop?, qp?, kp?, vp?, pp?);
            let [gq, gk, gv] = [&dq, &dk, &dv].map(|t| t.cuda_ptr());
            let (gq, gk, gv) = (gq?, gk?, gv?);
            let dp = Tensor::empty(q.device(), &probs_dims(a))?;
            let dpp = dp.cuda_ptr()?;
            let (t, dh) = (a.seq, a.head_dim);
            heads_gemm(c, OP, a, (t, dh, t), square(a, pp, true), head(a, dop, false), head(a, gv, false))?;
            heads_gemm(c, OP, a, (t, t, dh), head(a, dop, false), head(a, vp, true), square(a, dpp, false))?;
            // dS overwrites dP in place: each element is read before it is written.
            softmax(c, B::CausalSoftmaxBwdF32, a, &[KArg::Ptr(dpp), KArg::Ptr(dpp), KArg::Ptr(pp)])?;
            heads_gemm(c, OP, a, (t, dh, t), square(a, dpp, false), head(a, kp, false), head(a, gq, false))?;
            heads_gemm(c, OP, a, (t, dh, t), square(a, dpp, true), head(a, qp, false), head(a, gk, false))?;
        }
    }
    Ok((dq, dk, dv))
}

/// Sequence 0's heads of a `[batch, seq, width]` tensor (`[seq, head_dim]` blocks with row
/// stride `width`, `head_dim` apart) and the elements from one sequence to the next.
fn head(a: AttnDims, ptr: u64, trans: bool) -> (RowMat, usize) {
    let ld = a.heads * a.head_dim;
    (RowMat { ptr, ld, stride: a.head_dim, trans }, a.seq * ld)
}

/// Sequence 0's heads of a `[batch, heads, seq, seq]` tensor and the elements between sequences.
fn square(a: AttnDims, ptr: u64, trans: bool) -> (RowMat, usize) {
    let stride = a.seq * a.seq;
    (RowMat { ptr, ld: a.seq, stride, trans }, a.heads * stride)
}

/// One strided-batched GEMM over the heads per sequence `b`, each operand moved to sequence
/// `b` by its elements per sequence.
fn heads_gemm(
    c: &CudaBackend,
    op: &'static str,
    a: AttnDims,
    (m, n, k): (usize, usize, usize),
    ma: (RowMat, usize),
    mb: (RowMat, usize),
    mc: (RowMat, usize),
) -> Result<()> {
    let at = |(r, per_seq): (RowMat, usize), b: usize| RowMat { ptr: r.ptr + (b * per_seq * 4) as u64, ..r };
    for b in 0..a.batch {
        let g = RowGemmBatched { op, m, n, k, a: at(ma, b), b: at(mb, b), beta: 0.0, c: at(mc, b), batch: a.heads };
        c.sgemm_strided_batched(&g)?;
    }
    Ok(())
}

/// The causal softmax kernel (`kernel(outs/ins.., rows, seq, scale)`) over every score row.
fn softmax(c: &CudaBackend, kernel: B, a: AttnDims, ptrs: &[KArg]) -> Result<()> {
    let rows = a.batch * a.heads * a.seq;
    let mut args = ptrs.to_vec();
    args.extend([KArg::U32(rows as u32), KArg::U32(a.seq as u32), KArg::F32(a.scale())]);
    c.launch(kernel, row_dims(rows, a.seq), &args)
}
