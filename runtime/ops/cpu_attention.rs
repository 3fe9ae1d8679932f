//! The CPU reference of causal attention (#13) that keeps only the softmax statistics: the
//! forward saves the row logsumexp, the backward recomputes the scores and rebuilds the
//! probabilities from it (as FlashAttention does). Included in [`crate::ops::cpu`]; the
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
    fn width(self) -> usize {
        self.heads * self.head_dim
    }

    /// `1 / sqrt(head_dim)`, the score scale, in f32 (as the kernels use it).
    pub fn scale(self) -> f32 {
        1.0 / (self.head_dim as f32).sqrt()
    }

    /// The `[seq, head_dim]` block of head `h` of sequence `b` in a `[batch, seq, width]`
    /// tensor, as a view with row stride `width` (`trans` reads it transposed).
    fn head<'a>(self, data: &'a [f64], b: usize, h: usize, trans: bool) -> View<'a> {
        let (rs, cs) = if trans { (1, self.width()) } else { (self.width(), 1) };
        View { data: &data[b * self.seq * self.width() + h * self.head_dim..], rs, cs }
    }

    /// Writes the row-major `[seq, head_dim]` block `src` into head `h` of sequence `b` of `dst`.
    fn scatter(self, dst: &mut [f32], src: &[f64], b: usize, h: usize) {
        let (w, dh) = (self.width(), self.head_dim);
        for i in 0..self.seq {
            let row = (b * self.seq + i) * w + h * dh;
            for (d, s) in dst[row..row + dh].iter_mut().zip(&src[i * dh..(i + 1) * dh]) {
                *d = *s as f32;
            }
        }
    }

    /// `s = Q·Kᵀ` (unscaled, `[seq, seq]`) for head `h` of sequence `b`.
    fn scores(self, q: &[f64], k: &[f64], b: usize, h: usize, s: &mut [f64]) {
        let (t, dh) = (self.seq, self.head_dim);
        dgemm(t, dh, t, self.head(q, b, h, false), self.head(k, b, h, true), 0.0, s);
    }
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
    let (t, dh, scale) = (a.seq, a.head_dim, a.scale() as f64);
    let (qd, kd, vd) = (widen(q), widen(k), widen(v));
    let mut out = vec![0.0f32; q.len()];
    let mut lse = vec![0.0f32; a.batch * a.heads * t];
    let (mut s, mut p, mut o) = (vec![0.0f64; t * t], vec![0.0f64; t * t], vec![0.0f64; t * dh]);
    for b in 0..a.batch {
        for h in 0..a.heads {
            a.scores(&qd, &kd, b, h, &mut s);
            for i in 0..t {
                let row = &s[i * t..i * t + i + 1];
                let m = row.iter().fold(f64::NEG_INFINITY, |m, x| m.max(x * scale));
                let z: f64 = row.iter().map(|x| (x * scale - m).exp()).sum();
                for j in 0..t {
                    p[i * t + j] = if j <= i { rounded(dtype, (row[j] * scale - m).exp() / z) } else { 0.0 };
                }
                lse[(b * a.heads + h) * t + i] = (m + z.ln()) as f32;
            }
            dgemm(t, t, dh, View { data: &p, rs: t, cs: 1 }, a.head(&vd, b, h, false), 0.0, &mut o);
            a.scatter(&mut out, &o, b, h);
        }
    }
    (out, lse)
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
    let (t, dh, scale) = (a.seq, a.head_dim, a.scale() as f64);
    let (dod, qd, kd, vd, od) = (widen(x.dout), widen(x.q), widen(x.k), widen(x.v), widen(x.out));
    let n = x.q.len();
    let (mut dq, mut dk, mut dv) = (vec![0.0f32; n], vec![0.0f32; n], vec![0.0f32; n]);
    let (mut s, mut p, mut dp, mut o) =
        (vec![0.0f64; t * t], vec![0.0f64; t * t], vec![0.0f64; t * t], vec![0.0; t * dh]);
    for b in 0..a.batch {
        for h in 0..a.heads {
            a.scores(&qd, &kd, b, h, &mut s);
            dgemm(t, dh, t, a.head(&dod, b, h, false), a.head(&vd, b, h, true), 0.0, &mut dp);
            for i in 0..t {
                let lse = x.lse[(b * a.heads + h) * t + i] as f64;
                let row = (b * t + i) * a.width() + h * dh;
                let d: f64 = (row..row + dh).map(|e| dod[e] * od[e]).sum();
                for j in 0..t {
                    let pij = if j <= i { (s[i * t + j] * scale - lse).exp() } else { 0.0 };
                    p[i * t + j] = rounded(dtype, pij);
                    dp[i * t + j] = rounded(dtype, scale * pij * (dp[i * t + j] - d));
                }
            }
            dgemm(t, t, dh, View { data: &p, rs: 1, cs: t }, a.head(&dod, b, h, false), 0.0, &mut o);
            a.scatter(&mut dv, &o, b, h);
            dgemm(t, t, dh, View { data: &dp, rs: t, cs: 1 }, a.head(&kd, b, h, false), 0.0, &mut o);
            a.scatter(&mut dq, &o, b, h);
            dgemm(t, t, dh, View { data: &dp, rs: 1, cs: t }, a.head(&qd, b, h, false), 0.0, &mut o);
            a.scatter(&mut dk, &o, b, h);
        }
    }
    (dq, dk, dv)
}
