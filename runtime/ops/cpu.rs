//! The CPU references of the ops, on plain slices.
//!
//! The host backend runs exactly these functions, and the tests compare the CUDA kernels with
//! them. Sums accumulate in `f64` (so the references are more accurate than any f32 kernel);
//! elementwise formulas that the kernels compute in f32 are computed the same way here.
//! Matrices are row-major; `rows x cols` sizes are passed explicitly.

use crate::error::OpError;
use crate::ops::Gelu;
use crate::rng::philox_uniform;
use crate::Result;

/// A row-major f64 matrix view for [`dgemm`]: the data and its (row, column) strides.
#[derive(Clone, Copy)]
struct View<'a> {
    data: &'a [f64],
    rs: usize,
    cs: usize,
}

impl View<'_> {
    /// Whether every index `(i, j)` with `i < rows`, `j < cols` is inside the data.
    fn fits(&self, rows: usize, cols: usize) -> bool {
        rows == 0 || cols == 0 || (rows - 1) * self.rs + (cols - 1) * self.cs < self.data.len()
    }
}

/// `c[m, n] = a[m, k] · b[k, n] + beta · c` in f64 through `matrixmultiply` (a blocked,
/// vectorized GEMM; single-threaded, so the summation order and the result's bits are the same
/// on every run). `c` is row-major with `n` columns.
fn dgemm(m: usize, k: usize, n: usize, a: View<'_>, b: View<'_>, beta: f64, c: &mut [f64]) {
    assert!(a.fits(m, k) && b.fits(k, n) && c.len() >= m * n, "dgemm operands smaller than {m}x{k}x{n}");
    let s = |v: usize| v as isize;
    // SAFETY: the asserts above check that every element the GEMM reads (a: m x k, b: k x n
    // with their strides) and writes (c: m x n, row-major) is inside its slice; the slices
    // borrow disjoint memory (`c` is a unique borrow).
    unsafe {
        matrixmultiply::dgemm(
            m,
            k,
            n,
            1.0,
            a.data.as_ptr(),
            s(a.rs),
            s(a.cs),
            b.data.as_ptr(),
            s(b.rs),
            s(b.cs),
            beta,
            c.as_mut_ptr(),
            s(n),
            1,
        );
    }
}

fn widen(x: &[f32]) -> Vec<f64> {
    x.iter().map(|v| *v as f64).collect()
}

/// `y[n, out] = x[n, in] · w[out, in]ᵀ + b[out]`, accumulated in f64 (a blocked GEMM) and
/// rounded once.
pub fn linear(x: &[f32], w: &[f32], b: Option<&[f32]>, n: usize, input: usize, out: usize) -> Vec<f32> {
    let (xd, wd) = (widen(&x[..n * input]), widen(&w[..out * input]));
    let mut acc = vec![0.0f64; n * out];
    let a = View { data: &xd, rs: input, cs: 1 };
    let bt = View { data: &wd, rs: 1, cs: input };
    dgemm(n, input, out, a, bt, 0.0, &mut acc);
    let y: Vec<f32> = acc.into_iter().map(|v| v as f32).collect();
    match b {
        Some(b) => bias_add(&y, b, out),
        None => y,
    }
}

/// `y[r, j] = x[r, j] + b[j]` for rows of `d` elements.
pub fn bias_add(x: &[f32], b: &[f32], d: usize) -> Vec<f32> {
    x.iter().enumerate().map(|(i, v)| v + b[i % d]).collect()
}

/// The column blocks of `x` (rows of `widths.iter().sum()` values), each as its own row-major
/// tensor of rows of its width ([`crate::ops::split_columns`]).
pub fn split_columns(x: &[f32], widths: &[usize]) -> Vec<Vec<f32>> {
    let width: usize = widths.iter().sum();
    let rows = x.len().checked_div(width).unwrap_or(0);
    let mut parts: Vec<Vec<f32>> = widths.iter().map(|w| Vec::with_capacity(rows * w)).collect();
    for row in x.chunks_exact(width.max(1)).take(rows) {
        let mut at = 0;
        for (part, &w) in parts.iter_mut().zip(widths) {
            part.extend_from_slice(&row[at..at + w]);
            at += w;
        }
    }
    parts
}

/// The inverse of [`split_columns`]: each row of the result is the parts' rows side by side
/// ([`crate::ops::concat_columns`]); `parts[i]` holds rows of `widths[i]` values.
pub fn concat_columns(parts: &[&[f32]], widths: &[usize]) -> Vec<f32> {
    let rows = parts.first().zip(widths.first()).map_or(0, |(p, &w)| p.len().checked_div(w).unwrap_or(0));
    let mut out = Vec::with_capacity(rows * widths.iter().sum::<usize>());
    for r in 0..rows {
        for (part, &w) in parts.iter().zip(widths) {
            out.extend_from_slice(&part[r * w..(r + 1) * w]);
        }
    }
    out
}

/// Adds the column sums of `a` (`rows x cols`) to `out`.
pub fn col_sum_acc(out: &mut [f32], a: &[f32], rows: usize, cols: usize) {
    let mut acc = vec![0.0f64; cols];
    for r in 0..rows {
        for (s, v) in acc.iter_mut().zip(&a[r * cols..(r + 1) * cols]) {
            *s += *v as f64;
        }
    }
    for (o, s) in out.iter_mut().zip(acc) {
        *o += s as f32;
    }
}

/// The backward of [`linear`]: `dw += dyᵀ · x`, `db += Σ_rows dy`, and `dx = dy · w` when
/// `need_dx`.
#[allow(clippy::too_many_arguments)]
pub fn linear_backward(
    dy: &[f32],
    x: &[f32],
    w: &[f32],
    n: usize,
    input: usize,
    out: usize,
    dw: &mut [f32],
    db: Option<&mut [f32]>,
    need_dx: bool,
) -> Option<Vec<f32>> {
    let (dyd, xd) = (widen(&dy[..n * out]), widen(&x[..n * input]));
    // dw[out, in] += dyᵀ[out, n] · x[n, in], summed in f64 and added once.
    let mut acc = vec![0.0f64; out * input];
    let dyt = View { data: &dyd, rs: 1, cs: out };
    dgemm(out, n, input, dyt, View { data: &xd, rs: input, cs: 1 }, 0.0, &mut acc);
    for (g, a) in dw.iter_mut().zip(acc) {
        *g += a as f32;
    }
    if let Some(db) = db {
        col_sum_acc(db, dy, n, out);
    }
    need_dx.then(|| input_grad(&dyd, w, n, input, out))
}

/// The input grad of [`linear`] alone: `dx[n, in] = dy[n, out] · w[out, in]`, summed in f64
/// and rounded once (what [`linear_backward`] returns as `dx`).
pub fn linear_input_grad(dy: &[f32], w: &[f32], n: usize, input: usize, out: usize) -> Vec<f32> {
    input_grad(&widen(&dy[..n * out]), w, n, input, out)
}

/// `dy · w` from the widened `dy`.
fn input_grad(dyd: &[f64], w: &[f32], n: usize, input: usize, out: usize) -> Vec<f32> {
    let wd = widen(&w[..out * input]);
    let mut dx = vec![0.0f64; n * input];
    dgemm(n, out, input, View { data: dyd, rs: out, cs: 1 }, View { data: &wd, rs: input, cs: 1 }, 0.0, &mut dx);
    dx.into_iter().map(|v| v as f32).collect()
}

/// `max(x, 0)`.
pub fn relu(x: &[f32]) -> Vec<f32> {
    x.iter().map(|v| if *v > 0.0 { *v } else { 0.0 }).collect()
}

/// `dy` where `x > 0`, else 0.
pub fn relu_backward(dy: &[f32], x: &[f32]) -> Vec<f32> {
    dy.iter().zip(x).map(|(d, v)| if *v > 0.0 { *d } else { 0.0 }).collect()
}

/// The error function in f64 (the `libm` crate's, within an ulp).
pub fn erf(x: f64) -> f64 {
    libm::erf(x)
}

/// The standard normal CDF Φ(x) in f64, through erfc, so that it keeps its relative accuracy in
/// the negative tail (where `1 + erf(x/√2)` cancels to nothing below x ≈ -8).
pub fn normal_cdf(x: f64) -> f64 {
    0.5 * libm::erfc(-x / std::f64::consts::SQRT_2)
}

const SQRT_2_OVER_PI: f64 = 0.797_884_560_802_865_4;
const GELU_C: f64 = 0.044715;

/// `1 / (1 + e^{-v})`, exact in both tails (no `1 + tanh` to cancel).
fn sigmoid(v: f64) -> f64 {
    1.0 / (1.0 + (-v).exp())
}

// The tanh form's 0.5·(1 + tanh(u)) is σ(2u), and 1 − σ(2u) is σ(−2u): written so, neither the
// value nor the gradient cancels for large |x|.
fn gelu_value(x: f64, approx: Gelu) -> f64 {
    match approx {
        Gelu::Tanh => x * sigmoid(2.0 * SQRT_2_OVER_PI * (x + GELU_C * x * x * x)),
        Gelu::Erf => x * normal_cdf(x),
    }
}

fn gelu_grad(x: f64, approx: Gelu) -> f64 {
    match approx {
        Gelu::Tanh => {
            let u2 = 2.0 * SQRT_2_OVER_PI * (x + GELU_C * x * x * x);
            let (s, s_neg) = (sigmoid(u2), sigmoid(-u2));
            s + x * s * s_neg * 2.0 * SQRT_2_OVER_PI * (1.0 + 3.0 * GELU_C * x * x)
        }
        Gelu::Erf => {
            let pdf = (-0.5 * x * x).exp() / (2.0 * std::f64::consts::PI).sqrt();
            normal_cdf(x) + x * pdf
        }
    }
}

/// GELU, computed in f64 and rounded.
pub fn gelu(x: &[f32], approx: Gelu) -> Vec<f32> {
    x.iter().map(|v| gelu_value(*v as f64, approx) as f32).collect()
}

/// `dy · gelu'(x)`, computed in f64 and rounded.
pub fn gelu_backward(dy: &[f32], x: &[f32], approx: Gelu) -> Vec<f32> {
    dy.iter().zip(x).map(|(d, v)| (*d as f64 * gelu_grad(*v as f64, approx)) as f32).collect()
}

/// The dropout mask of `n` elements for a generator at (`seed`, `offset`): `1 / (1 - p)` where
/// `uniform(seed, offset + i) >= p`, else 0 (the CUDA kernel draws the same numbers).
pub fn dropout_mask(seed: u64, offset: u64, n: usize, p: f32) -> Vec<f32> {
    let scale = dropout_scale(p);
    (0..n).map(|i| if philox_uniform(seed, offset + i as u64) >= p { scale } else { 0.0 }).collect()
}

/// `1 / (1 - p)` in f32, the value kept elements are multiplied by.
pub fn dropout_scale(p: f32) -> f32 {
    1.0 / (1.0 - p)
}

/// `a * b` elementwise.
pub fn mul(a: &[f32], b: &[f32]) -> Vec<f32> {
    a.iter().zip(b).map(|(x, y)| x * y).collect()
}

/// `a + b` elementwise.
pub fn add(a: &[f32], b: &[f32]) -> Vec<f32> {
    a.iter().zip(b).map(|(x, y)| x + y).collect()
}

/// `x * a` elementwise.
pub fn scale(x: &[f32], a: f32) -> Vec<f32> {
    x.iter().map(|v| v * a).collect()
}

/// The sum, accumulated in f64.
pub fn sum(x: &[f32]) -> f32 {
    x.iter().map(|v| *v as f64).sum::<f64>() as f32
}

/// The mean, accumulated in f64 (NaN for no elements).
pub fn mean(x: &[f32]) -> f32 {
    (x.iter().map(|v| *v as f64).sum::<f64>() / x.len() as f64) as f32
}

/// Layer norm over rows of `d`: `(y, mean, rstd)` with `rstd = 1 / sqrt(var + eps)` and the
/// biased variance, as PyTorch.
pub fn layer_norm(x: &[f32], gamma: &[f32], beta: &[f32], d: usize, eps: f32) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let rows = x.len().checked_div(d).unwrap_or(0);
    let (mut y, mut means, mut rstds) = (vec![0.0f32; x.len()], vec![0.0f32; rows], vec![0.0f32; rows]);
    for r in 0..rows {
        let xr = &x[r * d..(r + 1) * d];
        let mean = xr.iter().map(|v| *v as f64).sum::<f64>() / d as f64;
        let var = xr.iter().map(|v| (*v as f64 - mean).powi(2)).sum::<f64>() / d as f64;
        let rstd = 1.0 / (var + eps as f64).sqrt();
        for j in 0..d {
            y[r * d + j] = ((xr[j] as f64 - mean) * rstd * gamma[j] as f64 + beta[j] as f64) as f32;
        }
        means[r] = mean as f32;
        rstds[r] = rstd as f32;
    }
    (y, means, rstds)
}

/// The backward of [`layer_norm`] from the saved `mean` and `rstd`: returns `dx` and adds
/// `Σ_rows dy·x̂` to `dgamma` and `Σ_rows dy` to `dbeta`.
#[allow(clippy::too_many_arguments)]
pub fn layer_norm_backward(
    dy: &[f32],
    x: &[f32],
    gamma: &[f32],
    mean: &[f32],
    rstd: &[f32],
    d: usize,
    dgamma: &mut [f32],
    dbeta: &mut [f32],
) -> Vec<f32> {
    let rows = x.len().checked_div(d).unwrap_or(0);
    let mut dx = vec![0.0f32; x.len()];
    let (mut accg, mut accb) = (vec![0.0f64; d], vec![0.0f64; d]);
    for r in 0..rows {
        let (mu, rs) = (mean[r] as f64, rstd[r] as f64);
        let xhat: Vec<f64> = x[r * d..(r + 1) * d].iter().map(|v| (*v as f64 - mu) * rs).collect();
        let dyr = &dy[r * d..(r + 1) * d];
        let g: Vec<f64> = dyr.iter().zip(gamma).map(|(a, b)| *a as f64 * *b as f64).collect();
        let ma = g.iter().sum::<f64>() / d as f64;
        let mb = g.iter().zip(&xhat).map(|(a, b)| a * b).sum::<f64>() / d as f64;
        for j in 0..d {
            dx[r * d + j] = (rs * (g[j] - ma - xhat[j] * mb)) as f32;
            accg[j] += dyr[j] as f64 * xhat[j];
            accb[j] += dyr[j] as f64;
        }
    }
    for j in 0..d {
        dgamma[j] += accg[j] as f32;
        dbeta[j] += accb[j] as f32;
    }
    dx
}

/// The class id a label value stands for, when it is an integer in `0..classes`.
pub fn label_index(label: f32, classes: usize) -> Option<usize> {
    (label >= 0.0 && label < classes as f32 && label == label.floor()).then_some(label as usize)
}

/// Each row's class id, or `None` for a row the loss ignores ([`crate::ops::IGNORE_LABEL`]).
fn labels_checked(op: &'static str, labels: &[f32], classes: usize) -> Result<Vec<Option<usize>>> {
    labels
        .iter()
        .enumerate()
        .map(|(r, l)| match label_index(*l, classes) {
            Some(id) => Ok(Some(id)),
            None if *l == crate::ops::IGNORE_LABEL => Ok(None),
            None => Err(OpError::Label { op, label: *l, row: r, classes }.into()),
        })
        .collect()
}

/// The rows a mean over labels counts: those not ignored.
fn counted(ids: &[Option<usize>]) -> usize {
    ids.iter().flatten().count()
}

/// Softmax cross-entropy over rows of `classes` logits: `(mean loss, probs)`, the mean over
/// the rows whose label is not [`crate::ops::IGNORE_LABEL`] (0 when every row is ignored); a
/// label that is neither an integer in `0..classes` nor the ignore label is
/// [`OpError::Label`].
pub fn softmax_cross_entropy(logits: &[f32], labels: &[f32], classes: usize) -> Result<(f32, Vec<f32>)> {
    let ids = labels_checked("softmax_cross_entropy", labels, classes)?;
    let rows = counted(&ids);
    let mut probs = vec![0.0f32; logits.len()];
    let mut total = 0.0f64;
    for (r, id) in ids.iter().enumerate() {
        let xr = &logits[r * classes..(r + 1) * classes];
        let m = xr.iter().fold(f64::NEG_INFINITY, |m, v| m.max(*v as f64));
        let s: f64 = xr.iter().map(|v| (*v as f64 - m).exp()).sum();
        for j in 0..classes {
            probs[r * classes + j] = ((xr[j] as f64 - m).exp() / s) as f32;
        }
        if let Some(id) = id {
            total += m + s.ln() - xr[*id] as f64;
        }
    }
    let loss = if rows == 0 { 0.0 } else { (total / rows as f64) as f32 };
    Ok((loss, probs))
}

/// `(probs - onehot(labels)) * (dloss_scale / rows)`, in f32 exactly as the kernel computes it,
/// `rows` counting the rows not ignored; ignored rows get 0.
pub fn softmax_cross_entropy_backward(
    probs: &[f32],
    labels: &[f32],
    classes: usize,
    dloss_scale: f32,
) -> Result<Vec<f32>> {
    let ids = labels_checked("softmax_cross_entropy_backward", labels, classes)?;
    let scale = dloss_scale / counted(&ids) as f32;
    let mut d = vec![0.0f32; probs.len()];
    for (r, id) in ids.iter().enumerate() {
        let Some(id) = id else { continue };
        for j in 0..classes {
            let hot = if j == *id { 1.0 } else { 0.0 };
            d[r * classes + j] = (probs[r * classes + j] - hot) * scale;
        }
    }
    Ok(d)
}

/// The mean of `(pred - target)²`, accumulated in f64.
pub fn mse_loss(pred: &[f32], target: &[f32]) -> f32 {
    let s: f64 = pred.iter().zip(target).map(|(p, t)| (*p as f64 - *t as f64).powi(2)).sum();
    (s / pred.len() as f64) as f32
}

/// `(pred - target) * (2 * dloss_scale / n)`, in f32 exactly as the kernel computes it.
pub fn mse_backward(pred: &[f32], target: &[f32], dloss_scale: f32) -> Vec<f32> {
    let scale = mse_grad_scale(dloss_scale, pred.len());
    pred.iter().zip(target).map(|(p, t)| (p - t) * scale).collect()
}

/// `2 * dloss_scale / n` in f32.
pub fn mse_grad_scale(dloss_scale: f32, n: usize) -> f32 {
    2.0 * dloss_scale / n as f32
}

/// One SGD step in place (PyTorch semantics, dampening 0): `g += wd·p`, `buf = momentum·buf + g`
/// (when `buf` is given), `p -= lr·buf`.
pub fn sgd_step(p: &mut [f32], g: &[f32], buf: Option<&mut [f32]>, lr: f32, momentum: f32, weight_decay: f32) {
    match buf {
        Some(buf) => {
            for ((pv, gv), bv) in p.iter_mut().zip(g).zip(buf.iter_mut()) {
                let gi = momentum * *bv + (gv + weight_decay * *pv);
                *bv = gi;
                *pv -= lr * gi;
            }
        }
        None => {
            for (pv, gv) in p.iter_mut().zip(g) {
                *pv -= lr * (gv + weight_decay * *pv);
            }
        }
    }
}

/// AdamW's bias corrections for step `t` (1-based): `(1 - beta1^t, 1 - beta2^t)`.
pub fn adamw_bias_corrections(t: u32, beta1: f32, beta2: f32) -> (f32, f32) {
    (1.0 - beta1.powf(t as f32), 1.0 - beta2.powf(t as f32))
}

/// One AdamW step in place at step `t` (1-based), PyTorch semantics: `p *= 1 - lr·wd`, the
/// moments `m`, `v`, then `p -= lr / bc1 · m / (sqrt(v) / sqrt(bc2) + eps)`.
#[allow(clippy::too_many_arguments)]
pub fn adamw_step(
    p: &mut [f32],
    g: &[f32],
    m: &mut [f32],
    v: &mut [f32],
    lr: f32,
    t: u32,
    beta1: f32,
    beta2: f32,
    eps: f32,
    weight_decay: f32,
) {
    let (bc1, bc2) = adamw_bias_corrections(t, beta1, beta2);
    adamw_update(p, g, m, v, lr, bc1, bc2, beta1, beta2, eps, weight_decay);
}

/// The update of [`adamw_step`] with given bias corrections (what the kernel computes).
#[allow(clippy::too_many_arguments)]
pub(crate) fn adamw_update(
    p: &mut [f32],
    g: &[f32],
    m: &mut [f32],
    v: &mut [f32],
    lr: f32,
    bc1: f32,
    bc2: f32,
    beta1: f32,
    beta2: f32,
    eps: f32,
    weight_decay: f32,
) {
    let step_size = lr / bc1;
    let bc2_sqrt = bc2.sqrt();
    let decay = 1.0 - lr * weight_decay;
    for i in 0..p.len() {
        let gi = g[i];
        let mi = beta1 * m[i] + (1.0 - beta1) * gi;
        let vi = beta2 * v[i] + (1.0 - beta2) * gi * gi;
        m[i] = mi;
        v[i] = vi;
        let denom = vi.sqrt() / bc2_sqrt + eps;
        p[i] = p[i] * decay - step_size * (mi / denom);
    }
}

/// The loss scaler's update on its state `[scale, found_inf, good_steps, skipped_steps]`:
/// after an overflow the scale backs off and the step counts as skipped, otherwise the scale
/// grows once every `interval` good steps (what the `amp_update` kernel does).
pub fn loss_scale_update(state: &[f32], growth: f32, backoff: f32, interval: u32) -> Vec<f32> {
    let mut s = state.to_vec();
    if s[1] != 0.0 {
        s[0] *= backoff;
        s[2] = 0.0;
        s[3] += 1.0;
    } else if s[2] + 1.0 >= interval as f32 {
        s[0] *= growth;
        s[2] = 0.0;
    } else {
        s[2] += 1.0;
    }
    s
}

#[path = "cpu_transformer.rs"]
mod transformer;
pub use transformer::{
    embedding, embedding_backward, rms_norm, rms_norm_apply, rms_norm_backward, swiglu, swiglu_backward, token_index,
    token_indices,
};

#[path = "cpu_attention.rs"]
mod attention;
pub use attention::{
    attention, attention_backward, causal_attention, causal_attention_backward, pack_qkv, unpack_qkv, AttnDims,
    AttnSaved, AttnShape,
};

#[path = "cpu_decode.rs"]
mod decode;
pub use decode::{argmax, decode_attention, kv_cache_append, kv_cache_fill, sample, CacheShape};

#[path = "cpu_generate.rs"]
mod generate;
pub use generate::{generation_step, GenerationState};
