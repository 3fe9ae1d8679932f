//! The CPU references of the transformer ops (#13): token embedding, RMSNorm and SwiGLU.
//! Included in [`crate::ops::cpu`]; the conventions there apply (sums in f64, row-major).

use crate::{Error, Result};

/// The row of `table` token value `id` selects, when it is an integer in `0..vocab`.
pub fn token_index(id: f32, vocab: usize) -> Option<usize> {
    (id >= 0.0 && id < vocab as f32 && id == id.floor()).then_some(id as usize)
}

/// Checks every token id against the vocabulary: [`Error::TokenOutOfRange`] names the first bad
/// one.
pub fn token_indices(op: &'static str, ids: &[f32], vocab: usize) -> Result<Vec<usize>> {
    ids.iter()
        .enumerate()
        .map(|(pos, id)| token_index(*id, vocab).ok_or(Error::TokenOutOfRange { op, id: *id, pos, vocab }))
        .collect()
}

/// `y[t, :] = table[ids[t], :]` for a `[vocab, d]` table.
pub fn embedding(ids: &[f32], table: &[f32], vocab: usize, d: usize) -> Result<Vec<f32>> {
    let rows = token_indices("embedding", ids, vocab)?;
    Ok(rows.iter().flat_map(|r| table[r * d..(r + 1) * d].iter().copied()).collect())
}

/// The backward of [`embedding`]: `dtable[v, :] += Σ_{t: ids[t] = v} dy[t, :]`, summed in f64
/// in token order and added once.
pub fn embedding_backward(dy: &[f32], ids: &[f32], vocab: usize, d: usize, dtable: &mut [f32]) -> Result<()> {
    let rows = token_indices("embedding_backward", ids, vocab)?;
    let mut acc = vec![0.0f64; vocab * d];
    for (t, r) in rows.iter().enumerate() {
        for (a, g) in acc[r * d..(r + 1) * d].iter_mut().zip(&dy[t * d..(t + 1) * d]) {
            *a += *g as f64;
        }
    }
    for (row, arow) in dtable.chunks_mut(d).zip(acc.chunks(d)) {
        for (g, a) in row.iter_mut().zip(arow) {
            *g += *a as f32;
        }
    }
    Ok(())
}

/// RMSNorm over rows of `d`: `(y, rstd)` with `rstd = 1 / sqrt(mean(x²) + eps)` (summed in
/// f64, rounded to f32) and `y` = [`rms_norm_apply`] of that `rstd`, so that `y` can be
/// recomputed from the saved `rstd` bit for bit, as on CUDA.
pub fn rms_norm(x: &[f32], gamma: &[f32], d: usize, eps: f32) -> (Vec<f32>, Vec<f32>) {
    let rstds: Vec<f32> = x
        .chunks_exact(d.max(1))
        .map(|xr| {
            let ms = xr.iter().map(|v| (*v as f64).powi(2)).sum::<f64>() / d as f64;
            (1.0 / (ms + eps as f64).sqrt()) as f32
        })
        .collect();
    (rms_norm_apply(x, gamma, &rstds, d), rstds)
}

/// RMSNorm's `y = x · rstd · gamma` from a row's `rstd`, computed in f64 and rounded once.
pub fn rms_norm_apply(x: &[f32], gamma: &[f32], rstd: &[f32], d: usize) -> Vec<f32> {
    x.chunks_exact(d.max(1))
        .zip(rstd)
        .flat_map(|(xr, r)| xr.iter().zip(gamma).map(move |(v, g)| (*v as f64 * *r as f64 * *g as f64) as f32))
        .collect()
}

/// The backward of [`rms_norm`] from the saved `rstd`: returns
/// `dx = rstd · (g - x̂ · mean(g · x̂))` with `g = dy · gamma`, `x̂ = x · rstd`, and adds
/// `Σ_rows dy · x̂` to `dgamma`.
pub fn rms_norm_backward(dy: &[f32], x: &[f32], gamma: &[f32], rstd: &[f32], d: usize, dgamma: &mut [f32]) -> Vec<f32> {
    let rows = x.len().checked_div(d).unwrap_or(0);
    let mut dx = vec![0.0f32; x.len()];
    let mut accg = vec![0.0f64; d];
    for r in 0..rows {
        let rs = rstd[r] as f64;
        let xhat: Vec<f64> = x[r * d..(r + 1) * d].iter().map(|v| *v as f64 * rs).collect();
        let dyr = &dy[r * d..(r + 1) * d];
        let g: Vec<f64> = dyr.iter().zip(gamma).map(|(a, b)| *a as f64 * *b as f64).collect();
        let m = g.iter().zip(&xhat).map(|(a, b)| a * b).sum::<f64>() / d as f64;
        for j in 0..d {
            dx[r * d + j] = (rs * (g[j] - xhat[j] * m)) as f32;
            accg[j] += dyr[j] as f64 * xhat[j];
        }
    }
    for (g, a) in dgamma.iter_mut().zip(accg) {
        *g += a as f32;
    }
    dx
}

fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

/// SwiGLU: `silu(gate) · up` with `silu(g) = g · sigmoid(g)`, computed in f64 and rounded.
pub fn swiglu(gate: &[f32], up: &[f32]) -> Vec<f32> {
    gate.iter().zip(up).map(|(g, u)| (*g as f64 * sigmoid(*g as f64) * *u as f64) as f32).collect()
}

/// The backward of [`swiglu`]: `(dgate, dup)` with `dgate = dy · up · σ(g)(1 + g(1 - σ(g)))`
/// and `dup = dy · silu(g)`, computed in f64 and rounded.
pub fn swiglu_backward(dy: &[f32], gate: &[f32], up: &[f32]) -> (Vec<f32>, Vec<f32>) {
    let mut dgate = Vec::with_capacity(dy.len());
    let mut dup = Vec::with_capacity(dy.len());
    for ((d, g), u) in dy.iter().zip(gate).zip(up) {
        let (d, g, u) = (*d as f64, *g as f64, *u as f64);
        let s = sigmoid(g);
        dgate.push((d * u * s * (1.0 + g * (1.0 - s))) as f32);
        dup.push((d * g * s) as f32);
    }
    (dgate, dup)
}
