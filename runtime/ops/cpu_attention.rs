//! The CPU reference of attention (causal or not, grouped key/value heads) that keeps only the
//! softmax statistics: the forward saves the row logsumexp, the backward recomputes the scores
//! and rebuilds the probabilities from it (as FlashAttention does). Included in [`crate::ops::cpu`]; the
//! conventions there apply (products in f64, row-major). Values the CUDA path stores in the
//! tensors' dtype (the probabilities before `P·V` and `Pᵀ·dO`, `dS`) are rounded to it here.

use super::{dgemm, widen, View};
use crate::DType;

/// The sizes of a causal attention: batch, sequence, heads, head dimension. Tensors `q`, `k`,
/// `v` and the output are `[batch, seq, heads · head_dim]`; the row statistics (`lse`)
/// `[batch, heads, seq]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttnDims {
    /// Sequences in the batch.
    pub batch: usize,
    /// Tokens per sequence.
    pub seq: usize,
    /// Attention heads.
    pub heads: usize,
    /// Features per head.
    pub head_dim: usize,
}

impl AttnDims {
    /// `1 / sqrt(head_dim)`, the score scale, in f32 (as the kernels use it).
    pub fn scale(self) -> f32 {
        1.0 / (self.head_dim as f32).sqrt()
    }

    /// The same sizes as a causal [`AttnShape`] with one key/value head per query head.
    pub fn causal(self) -> AttnShape {
        AttnShape { dims: self, kv_heads: self.heads, causal: true }
    }
}

/// An attention's sizes and kind: causal or not, and grouped-query attention (`kv_heads`
/// key/value heads, each shared by `heads / kv_heads` consecutive query heads). `q` and the
/// output are `[batch, seq, heads · head_dim]`, `k` and `v` `[batch, seq, kv_heads · head_dim]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttnShape {
    /// Batch, sequence, query heads, head dimension.
    pub dims: AttnDims,
    /// Key/value heads: divides `dims.heads`.
    pub kv_heads: usize,
    /// Position `i` attends to `j <= i` only.
    pub causal: bool,
}

impl AttnShape {
    fn width(self, heads: usize) -> usize {
        heads * self.dims.head_dim
    }

    /// The key/value head query head `h` reads.
    fn kv_head(self, h: usize) -> usize {
        h / (self.dims.heads / self.kv_heads)
    }

    /// The `[seq, head_dim]` block of head `h` of sequence `b` in a `[batch, seq, heads ·
    /// head_dim]` tensor, as a view with row stride `width` (`trans` reads it transposed).
    fn head<'a>(self, data: &'a [f64], heads: usize, b: usize, h: usize, trans: bool) -> View<'a> {
        let w = self.width(heads);
        let (rs, cs) = if trans { (1, w) } else { (w, 1) };
        View { data: &data[b * self.dims.seq * w + h * self.dims.head_dim..], rs, cs }
    }

    /// Adds the row-major `[seq, head_dim]` block `src` into head `h` of sequence `b` of `dst`
    /// (a `[batch, seq, heads · head_dim]` accumulator).
    fn scatter_add(self, dst: &mut [f64], heads: usize, src: &[f64], b: usize, h: usize) {
        let (w, dh) = (self.width(heads), self.dims.head_dim);
        for i in 0..self.dims.seq {
            let row = (b * self.dims.seq + i) * w + h * dh;
            for (d, s) in dst[row..row + dh].iter_mut().zip(&src[i * dh..(i + 1) * dh]) {
                *d += *s;
            }
        }
    }

    /// Whether query `i` sees key `j`.
    fn sees(self, i: usize, j: usize) -> bool {
        !self.causal || j <= i
    }
}

/// q, k and v from a packed `[batch, seq, (heads + 2 · kv_heads) · head_dim]` tensor, whose
/// rows hold q's, then k's, then v's columns ([`crate::ops::flash_attention_packed`]).
pub fn unpack_qkv(qkv: &[f32], a: AttnShape) -> [Vec<f32>; 3] {
    let widths = [a.width(a.dims.heads), a.width(a.kv_heads), a.width(a.kv_heads)];
    let mut parts = super::split_columns(qkv, &widths).into_iter();
    [(); 3].map(|()| parts.next().unwrap_or_default())
}

/// The inverse of [`unpack_qkv`]: `q`, `k` and `v` (or their grads) side by side in each row.
pub fn pack_qkv(q: &[f32], k: &[f32], v: &[f32], a: AttnShape) -> Vec<f32> {
    super::concat_columns(&[q, k, v], &[a.width(a.dims.heads), a.width(a.kv_heads), a.width(a.kv_heads)])
}

/// `v` rounded to `dtype` (through f32, as a kernel stores it) and widened back.
fn rounded(dtype: DType, v: f64) -> f64 {
    dtype.round(v as f32) as f64
}

/// Causal scaled-dot-product attention per head: `P = causal_softmax(Q·Kᵀ · scale)`,
/// `out = P·V`; returns `(out, lse)` with `lse[b, h, i] = m + ln Σ_j exp(scale·s_ij - m)`
/// (`m` the row's largest scaled score, `j <= i`), the statistic the backward rebuilds `P`
/// from. `P` is rounded to `dtype` before `P·V`, as the CUDA path stores it.
pub fn causal_attention(q: &[f32], k: &[f32], v: &[f32], a: AttnDims, dtype: DType) -> (Vec<f32>, Vec<f32>) {
    attention(q, k, v, a.causal(), dtype)
}

/// Scaled-dot-product attention per head, causal or not, with grouped key/value heads (see
/// [`AttnShape`]): `P = softmax(Q·Kᵀ · scale)` over the keys each query sees, `out = P·V`;
/// returns `(out, lse)` as [`causal_attention`] does. `P` is rounded to `dtype` before `P·V`,
/// as the CUDA kernels do.
pub fn attention(q: &[f32], k: &[f32], v: &[f32], a: AttnShape, dtype: DType) -> (Vec<f32>, Vec<f32>) {
    let d = a.dims;
    let (t, dh, scale) = (d.seq, d.head_dim, d.scale() as f64);
    let (qd, kd, vd) = (widen(q), widen(k), widen(v));
    let mut out = vec![0.0f64; q.len()];
    let mut lse = vec![0.0f32; d.batch * d.heads * t];
    let (mut s, mut p, mut o) = (vec![0.0f64; t * t], vec![0.0f64; t * t], vec![0.0f64; t * dh]);
    for b in 0..d.batch {
        for h in 0..d.heads {
            let kv = a.kv_head(h);
            dgemm(t, dh, t, a.head(&qd, d.heads, b, h, false), a.head(&kd, a.kv_heads, b, kv, true), 0.0, &mut s);
            for i in 0..t {
                let row = &s[i * t..(i + 1) * t];
                let seen = |j: usize| a.sees(i, j);
                let m = (0..t).filter(|&j| seen(j)).fold(f64::NEG_INFINITY, |m, j| m.max(row[j] * scale));
                let z: f64 = (0..t).filter(|&j| seen(j)).map(|j| (row[j] * scale - m).exp()).sum();
                for j in 0..t {
                    p[i * t + j] = if seen(j) { rounded(dtype, (row[j] * scale - m).exp() / z) } else { 0.0 };
                }
                lse[(b * d.heads + h) * t + i] = (m + z.ln()) as f32;
            }
            dgemm(t, t, dh, View { data: &p, rs: t, cs: 1 }, a.head(&vd, a.kv_heads, b, kv, false), 0.0, &mut o);
            a.scatter_add(&mut out, d.heads, &o, b, h);
        }
    }
    (out.iter().map(|&x| x as f32).collect(), lse)
}

/// The inputs of [`causal_attention_backward`]: the output grad, the forward's inputs, its
/// output and its `lse`, all as the tensors hold them (widened to f32).
#[derive(Clone, Copy, Debug)]
pub struct AttnSaved<'a> {
    /// The grad of the output, `[batch, seq, width]`.
    pub dout: &'a [f32],
    /// Queries.
    pub q: &'a [f32],
    /// Keys.
    pub k: &'a [f32],
    /// Values.
    pub v: &'a [f32],
    /// The forward's output.
    pub out: &'a [f32],
    /// The forward's row statistics, `[batch, heads, seq]`.
    pub lse: &'a [f32],
}

/// The backward of [`causal_attention`] from its saved `out` and `lse`: `(dq, dk, dv)` with
/// the scores recomputed, `P = exp(scale·s - lse)` (zero above the diagonal), `dV = Pᵀ·dO`,
/// `dP = dO·Vᵀ`, `D = rowsum(dO ∘ out)`, `dS = scale · P ∘ (dP - D)`, `dQ = dS·K`,
/// `dK = dSᵀ·Q`. `P` (for `dV`) and `dS` are rounded to `dtype`, as the CUDA path stores them.
pub fn causal_attention_backward(x: AttnSaved<'_>, a: AttnDims, dtype: DType) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    attention_backward(x, a.causal(), dtype)
}

/// The backward of [`attention`]: as [`causal_attention_backward`], over the keys each query
/// sees; a key/value head's grads sum over the query heads of its group.
pub fn attention_backward(x: AttnSaved<'_>, a: AttnShape, dtype: DType) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let d = a.dims;
    let (t, dh, scale) = (d.seq, d.head_dim, d.scale() as f64);
    let (dod, qd, kd, vd, od) = (widen(x.dout), widen(x.q), widen(x.k), widen(x.v), widen(x.out));
    let (mut dq, mut dk, mut dv) = (vec![0.0f64; x.q.len()], vec![0.0f64; x.k.len()], vec![0.0f64; x.v.len()]);
    let (mut s, mut p, mut dp, mut o) =
        (vec![0.0f64; t * t], vec![0.0f64; t * t], vec![0.0f64; t * t], vec![0.0; t * dh]);
    for b in 0..d.batch {
        for h in 0..d.heads {
            let kv = a.kv_head(h);
            let (qh, kh) = (a.head(&qd, d.heads, b, h, false), a.head(&kd, a.kv_heads, b, kv, false));
            dgemm(t, dh, t, qh, a.head(&kd, a.kv_heads, b, kv, true), 0.0, &mut s);
            dgemm(t, dh, t, a.head(&dod, d.heads, b, h, false), a.head(&vd, a.kv_heads, b, kv, true), 0.0, &mut dp);
            for i in 0..t {
                let lse = x.lse[(b * d.heads + h) * t + i] as f64;
                let row = (b * t + i) * a.width(d.heads) + h * dh;
                let dsum: f64 = (row..row + dh).map(|e| dod[e] * od[e]).sum();
                for j in 0..t {
                    let pij = if a.sees(i, j) { (s[i * t + j] * scale - lse).exp() } else { 0.0 };
                    p[i * t + j] = rounded(dtype, pij);
                    dp[i * t + j] = rounded(dtype, scale * pij * (dp[i * t + j] - dsum));
                }
            }
            dgemm(t, t, dh, View { data: &p, rs: 1, cs: t }, a.head(&dod, d.heads, b, h, false), 0.0, &mut o);
            a.scatter_add(&mut dv, a.kv_heads, &o, b, kv);
            dgemm(t, t, dh, View { data: &dp, rs: t, cs: 1 }, kh, 0.0, &mut o);
            a.scatter_add(&mut dq, d.heads, &o, b, h);
            dgemm(t, t, dh, View { data: &dp, rs: 1, cs: t }, qh, 0.0, &mut o);
            a.scatter_add(&mut dk, a.kv_heads, &o, b, kv);
        }
    }
    let narrow = |v: Vec<f64>| v.into_iter().map(|x| x as f32).collect::<Vec<f32>>();
    (narrow(dq), narrow(dk), narrow(dv))
}
