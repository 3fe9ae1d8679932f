//! Token embedding, RMSNorm and SwiGLU (#13), f32, with their backwards.

use crate::backend::{BuiltinKernel as B, KArg, LaunchDims};
use crate::ops::{
    as_rows, check_rank1, check_same, check_shape, check_vector, col_dims, cpu, exec, n32, row_dims, Exec,
};
use crate::{Error, Result, Tensor};

/// Checks `table` is `[vocab, d]` with both nonzero; returns `(vocab, d)`.
fn check_table(op: &'static str, table: &Tensor) -> Result<(usize, usize)> {
    match *table.dims() {
        [vocab, d] if vocab > 0 && d > 0 => Ok((vocab, d)),
        _ => Err(Error::shape(op, format!("table must be [vocab, d] with both nonzero, got {:?}", table.dims()))),
    }
}

/// `ids`' dims with `d` appended: the shape of an embedding's output.
fn embedded_dims(ids: &Tensor, d: usize) -> Vec<usize> {
    let mut dims = ids.dims().to_vec();
    dims.push(d);
    dims
}

/// Token embedding: `y[..., :] = table[ids[...], :]`.
///
/// `ids` holds token ids as f32 integers (exact up to 2²⁴) of any shape `[...]`; `table` is
/// `[vocab, d]`; the result is `[..., d]`. An id that is not an integer in `0..vocab` is
/// [`Error::TokenOutOfRange`] on the host backend (raised when the op runs: at the call, or
/// at the replay of a graph that captured it); on CUDA the kernel writes a NaN row instead of
/// reading out of bounds, so check ids that come from outside with [`crate::ops::cpu::token_indices`]
/// before they enter a graph.
///
/// ```
/// # use graphed::{ops, Device, Tensor};
/// let dev = Device::host();
/// let table = Tensor::from_slice(&dev, &[0.0, 1.0, 10.0, 11.0, 20.0, 21.0], &[3, 2])?;
/// let ids = Tensor::from_slice(&dev, &[2.0, 0.0], &[2])?;
/// assert_eq!(ops::embedding(&ids, &table)?.to_vec()?, vec![20.0, 21.0, 0.0, 1.0]);
/// let bad = Tensor::from_slice(&dev, &[3.0], &[1])?;
/// assert!(matches!(ops::embedding(&bad, &table), Err(graphed::Error::TokenOutOfRange { .. })));
/// # Ok::<(), graphed::Error>(())
/// ```
pub fn embedding(ids: &Tensor, table: &Tensor) -> Result<Tensor> {
    const OP: &str = "embedding";
    check_same(OP, &[table, ids])?;
    let (vocab, d) = check_table(OP, table)?;
    let tokens = ids.numel();
    n32(OP, tokens * d)?;
    n32(OP, vocab * d)?;
    let y = Tensor::empty(ids.device(), &embedded_dims(ids, d))?;
    match exec(ids.device()) {
        Exec::Host(h) => {
            let (ip, tp, yp) = (ids.host_ptr()?, table.host_ptr()?, y.host_ptr()?);
            h.run(B::EmbeddingF32, move || {
                yp.write(&cpu::embedding(&ip.read(), &tp.read(), vocab, d)?);
                Ok(())
            })?;
        }
        Exec::Cuda(c) => c.launch(
            B::EmbeddingF32,
            row_dims(tokens, d),
            &[
                KArg::Ptr(y.cuda_ptr()?),
                KArg::Ptr(ids.cuda_ptr()?),
                KArg::Ptr(table.cuda_ptr()?),
                KArg::U32(tokens as u32),
                KArg::U32(vocab as u32),
                KArg::U32(d as u32),
            ],
        )?,
    }
    Ok(y)
}

/// The backward of [`embedding`]: `dtable[v, :] += Σ dy[t, :]` over the tokens `t` with
/// `ids[t] = v` (grads of several passes add up). Deterministic without atomics: on CUDA one
/// block per vocabulary row scans the tokens in order; the host sums in f64 in token order.
///
/// ```
/// # use graphed::{ops, Device, Tensor};
/// let dev = Device::host();
/// let ids = Tensor::from_slice(&dev, &[1.0, 1.0, 0.0], &[3])?;
/// let dy = Tensor::from_slice(&dev, &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[3, 2])?;
/// let dtable = Tensor::zeros(&dev, &[2, 2])?;
/// ops::embedding_backward(&dy, &ids, &dtable)?;
/// assert_eq!(dtable.to_vec()?, vec![5.0, 6.0, 4.0, 6.0]);
/// # Ok::<(), graphed::Error>(())
/// ```
pub fn embedding_backward(dy: &Tensor, ids: &Tensor, dtable: &Tensor) -> Result<()> {
    const OP: &str = "embedding_backward";
    check_same(OP, &[dtable, dy, ids])?;
    let (vocab, d) = check_table(OP, dtable)?;
    if dy.dims() != embedded_dims(ids, d).as_slice() {
        return Err(Error::shape(OP, format!("dy {:?} must be ids {:?} + [{d}]", dy.dims(), ids.dims())));
    }
    let tokens = ids.numel();
    n32(OP, tokens * d)?;
    n32(OP, vocab * d)?;
    match exec(ids.device()) {
        Exec::Host(h) => {
            let (dyp, ip, gp) = (dy.host_ptr()?, ids.host_ptr()?, dtable.host_ptr()?);
            h.run(B::EmbeddingBwdF32, move || {
                let mut g = gp.read();
                cpu::embedding_backward(&dyp.read(), &ip.read(), vocab, d, &mut g)?;
                gp.write(&g);
                Ok(())
            })
        }
        Exec::Cuda(c) => c.launch(
            B::EmbeddingBwdF32,
            row_dims(vocab, d),
            &[
                KArg::Ptr(dtable.cuda_ptr()?),
                KArg::Ptr(dy.cuda_ptr()?),
                KArg::Ptr(ids.cuda_ptr()?),
                KArg::U32(tokens as u32),
                KArg::U32(vocab as u32),
                KArg::U32(d as u32),
            ],
        ),
    }
}

/// RMSNorm over the last dimension: `y = x · rstd · gamma` per row with
/// `rstd = 1 / sqrt(mean(x²) + eps)`. `x` is `[..., D]`, `gamma` `[D]`; returns `(y, rstd)`,
/// `rstd` of shape `[rows]`, which [`rms_norm_backward`] takes. f32; on CUDA one block per row
/// with a fixed-order reduction.
///
/// ```
/// # use graphed::{ops, Device, Tensor};
/// let dev = Device::host();
/// let x = Tensor::from_slice(&dev, &[3.0, 4.0], &[1, 2])?;
/// let gamma = Tensor::full(&dev, &[2], 1.0)?;
/// let (y, rstd) = ops::rms_norm(&x, &gamma, 0.0)?;
/// let s = (12.5f32).sqrt();
/// assert_eq!(rstd.to_vec()?, vec![1.0 / s]);
/// assert!((y.to_vec()?[0] - 3.0 / s).abs() < 1e-6);
/// # Ok::<(), graphed::Error>(())
/// ```
pub fn rms_norm(x: &Tensor, gamma: &Tensor, eps: f32) -> Result<(Tensor, Tensor)> {
    const OP: &str = "rms_norm";
    check_same(OP, &[x, gamma])?;
    check_rank1(OP, "x", x)?;
    let (rows, d) = as_rows(x);
    if d == 0 {
        return Err(Error::shape(OP, format!("x {:?} has an empty last dimension", x.dims())));
    }
    check_vector(OP, "gamma", gamma, d)?;
    if !(eps >= 0.0 && eps.is_finite()) {
        return Err(Error::invalid(OP, format!("eps = {eps} must be finite and >= 0")));
    }
    n32(OP, x.numel())?;
    let (y, rstd) = (Tensor::empty_like(x)?, Tensor::empty(x.device(), &[rows])?);
    match exec(x.device()) {
        Exec::Host(h) => {
            let (xp, gp, yp, rp) = (x.host_ptr()?, gamma.host_ptr()?, y.host_ptr()?, rstd.host_ptr()?);
            h.run(B::RmsNormF32, move || {
                let (yv, rv) = cpu::rms_norm(&xp.read(), &gp.read(), d, eps);
                yp.write(&yv);
                rp.write(&rv);
                Ok(())
            })?;
        }
        Exec::Cuda(c) => c.launch(
            B::RmsNormF32,
            row_dims(rows, d),
            &[
                KArg::Ptr(y.cuda_ptr()?),
                KArg::Ptr(rstd.cuda_ptr()?),
                KArg::Ptr(x.cuda_ptr()?),
                KArg::Ptr(gamma.cuda_ptr()?),
                KArg::U32(rows as u32),
                KArg::U32(d as u32),
                KArg::F32(eps),
            ],
        )?,
    }
    Ok((y, rstd))
}

/// The backward of [`rms_norm`] from its saved `rstd`: returns `dx` and accumulates
/// `dgamma += Σ_rows dy · x · rstd`. On CUDA a row kernel and a column-reduction kernel, both
/// in a fixed order (deterministic).
///
/// ```
/// # use graphed::{ops, Device, Tensor};
/// let dev = Device::host();
/// let x = Tensor::from_slice(&dev, &[3.0, 4.0], &[1, 2])?;
/// let gamma = Tensor::full(&dev, &[2], 1.0)?;
/// let (_, rstd) = ops::rms_norm(&x, &gamma, 0.0)?;
/// let dgamma = Tensor::zeros(&dev, &[2])?;
/// // A change along x itself does not change y = x / rms(x).
/// let dx = ops::rms_norm_backward(&x, &x, &gamma, &rstd, &dgamma)?;
/// assert!(dx.to_vec()?.iter().all(|v| v.abs() < 1e-6));
/// # Ok::<(), graphed::Error>(())
/// ```
pub fn rms_norm_backward(dy: &Tensor, x: &Tensor, gamma: &Tensor, rstd: &Tensor, dgamma: &Tensor) -> Result<Tensor> {
    const OP: &str = "rms_norm_backward";
    check_same(OP, &[x, dy, gamma, rstd, dgamma])?;
    check_rank1(OP, "x", x)?;
    check_shape(OP, dy, x)?;
    let (rows, d) = as_rows(x);
    check_vector(OP, "gamma", gamma, d)?;
    check_vector(OP, "dgamma", dgamma, d)?;
    check_vector(OP, "rstd", rstd, rows)?;
    n32(OP, x.numel())?;
    let dx = Tensor::empty_like(x)?;
    match exec(x.device()) {
        Exec::Host(h) => {
            let (dyp, xp, gp, rp) = (dy.host_ptr()?, x.host_ptr()?, gamma.host_ptr()?, rstd.host_ptr()?);
            let (dgp, dxp) = (dgamma.host_ptr()?, dx.host_ptr()?);
            h.run(B::RmsNormBwdF32, move || {
                let mut dg = dgp.read();
                dxp.write(&cpu::rms_norm_backward(&dyp.read(), &xp.read(), &gp.read(), &rp.read(), d, &mut dg));
                dgp.write(&dg);
                Ok(())
            })?;
        }
        Exec::Cuda(c) => {
            let (dyp, xp, rp) = (KArg::Ptr(dy.cuda_ptr()?), KArg::Ptr(x.cuda_ptr()?), KArg::Ptr(rstd.cuda_ptr()?));
            let (r32, d32) = (KArg::U32(rows as u32), KArg::U32(d as u32));
            let args = [KArg::Ptr(dx.cuda_ptr()?), dyp, xp, KArg::Ptr(gamma.cuda_ptr()?), rp, r32, d32];
            c.launch(B::RmsNormBwdF32, row_dims(rows, d), &args)?;
            let args = [KArg::Ptr(dgamma.cuda_ptr()?), dyp, xp, rp, r32, d32];
            c.launch(B::RmsNormBwdParamsF32, col_dims(d), &args)?;
        }
    }
    Ok(dx)
}

/// SwiGLU's gate: `y = silu(gate) · up` with `silu(g) = g · sigmoid(g)`, elementwise over two
/// tensors of one shape (f32).
///
/// ```
/// # use graphed::{ops, Device, Tensor};
/// let dev = Device::host();
/// let gate = Tensor::from_slice(&dev, &[0.0, 20.0], &[2])?;
/// let up = Tensor::from_slice(&dev, &[5.0, 2.0], &[2])?;
/// let y = ops::swiglu(&gate, &up)?.to_vec()?;
/// assert_eq!(y[0], 0.0);
/// assert!((y[1] - 40.0).abs() < 1e-4);
/// # Ok::<(), graphed::Error>(())
/// ```
pub fn swiglu(gate: &Tensor, up: &Tensor) -> Result<Tensor> {
    const OP: &str = "swiglu";
    check_same(OP, &[gate, up])?;
    check_shape(OP, gate, up)?;
    let n = n32(OP, gate.numel())?;
    let y = Tensor::empty_like(gate)?;
    match exec(gate.device()) {
        Exec::Host(h) => {
            let (gp, up_, yp) = (gate.host_ptr()?, up.host_ptr()?, y.host_ptr()?);
            h.run(B::SwigluF32, move || {
                yp.write(&cpu::swiglu(&gp.read(), &up_.read()));
                Ok(())
            })?;
        }
        Exec::Cuda(c) => c.launch(
            B::SwigluF32,
            LaunchDims::elementwise(n as usize),
            &[KArg::Ptr(y.cuda_ptr()?), KArg::Ptr(gate.cuda_ptr()?), KArg::Ptr(up.cuda_ptr()?), KArg::U32(n)],
        )?,
    }
    Ok(y)
}

/// The backward of [`swiglu`]: `(dgate, dup)`.
///
/// ```
/// # use graphed::{ops, Device, Tensor};
/// let dev = Device::host();
/// let gate = Tensor::from_slice(&dev, &[0.0], &[1])?;
/// let up = Tensor::from_slice(&dev, &[3.0], &[1])?;
/// let dy = Tensor::from_slice(&dev, &[1.0], &[1])?;
/// let (dgate, dup) = ops::swiglu_backward(&dy, &gate, &up)?;
/// assert_eq!((dgate.to_vec()?, dup.to_vec()?), (vec![1.5], vec![0.0])); // silu'(0) = 1/2
/// # Ok::<(), graphed::Error>(())
/// ```
pub fn swiglu_backward(dy: &Tensor, gate: &Tensor, up: &Tensor) -> Result<(Tensor, Tensor)> {
    const OP: &str = "swiglu_backward";
    check_same(OP, &[gate, up, dy])?;
    check_shape(OP, gate, up)?;
    check_shape(OP, gate, dy)?;
    let n = n32(OP, gate.numel())?;
    let (dgate, dup) = (Tensor::empty_like(gate)?, Tensor::empty_like(gate)?);
    match exec(gate.device()) {
        Exec::Host(h) => {
            let (dyp, gp, up_) = (dy.host_ptr()?, gate.host_ptr()?, up.host_ptr()?);
            let (dgp, dup_) = (dgate.host_ptr()?, dup.host_ptr()?);
            h.run(B::SwigluBwdF32, move || {
                let (a, b) = cpu::swiglu_backward(&dyp.read(), &gp.read(), &up_.read());
                dgp.write(&a);
                dup_.write(&b);
                Ok(())
            })?;
        }
        Exec::Cuda(c) => c.launch(
            B::SwigluBwdF32,
            LaunchDims::elementwise(n as usize),
            &[
                KArg::Ptr(dgate.cuda_ptr()?),
                KArg::Ptr(dup.cuda_ptr()?),
                KArg::Ptr(dy.cuda_ptr()?),
                KArg::Ptr(gate.cuda_ptr()?),
                KArg::Ptr(up.cuda_ptr()?),
                KArg::U32(n),
            ],
        )?,
    }
    Ok((dgate, dup))
}
