//! Token embedding, RMSNorm and SwiGLU (#13) in f32, bf16 and f16, with their backwards.

use crate::backend::{KArg, LaunchDims};
use crate::ops::{
    as_rows, check_f32_on, check_grad_of, check_like, check_rank1, check_shape, check_vector, col_chunks, col_dims,
    cpu, exec, k, n32, row_dims, warp_rows, Exec,
};
use crate::{DType, Error, Result, Tensor};

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
/// `[vocab, d]` in f32, bf16 or f16; the result is `[..., d]` in the table's dtype. An id that
/// is not an integer in `0..vocab` is [`Error::TokenOutOfRange`]: on the host backend when the
/// op runs (at the call, or at the replay of a graph that captured it); on CUDA the kernel
/// writes a zero row instead of reading out of bounds and sets the device's error word, which
/// the next [`crate::Device::synchronize`] or read to the host ([`Tensor::to_vec`]) returns as
/// that error (and clears), also after a graph replay.
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
    check_f32_on(OP, ids, table)?;
    let (vocab, d) = check_table(OP, table)?;
    let tokens = ids.numel();
    n32(OP, tokens * d)?;
    n32(OP, vocab * d)?;
    let y = Tensor::empty_as(ids.device(), &embedded_dims(ids, d), table.dtype())?;
    let kernel = k::EMBEDDING.get(table.dtype());
    match exec(ids.device()) {
        Exec::Host(h) => {
            let (ip, tp, yp) = (ids.host_ptr()?, table.host_ptr()?, y.host_ptr()?);
            h.run(kernel, move || {
                yp.write(&cpu::embedding(&ip.read(), &tp.read(), vocab, d)?);
                Ok(())
            })?;
        }
        Exec::Cuda(c) => c.launch(
            kernel,
            row_dims(tokens, d),
            &[
                KArg::Ptr(y.cuda_ptr()?),
                KArg::Ptr(ids.cuda_ptr()?),
                KArg::Ptr(table.cuda_ptr()?),
                KArg::U32(tokens as u32),
                KArg::U32(vocab as u32),
                KArg::U32(d as u32),
                KArg::Ptr(c.err_word()),
            ],
        )?,
    }
    Ok(y)
}

/// The backward of [`embedding`]: `dtable[v, :] += Σ dy[t, :]` over the tokens `t` with
/// `ids[t] = v` (grads of several passes add up). Deterministic without atomics: on CUDA one
/// block per vocabulary row lists the row's tokens tile by tile (a warp ballot, in token order)
/// and sums their rows in f32 in that order; the host sums in f64 in token order. `dy` is in the table's dtype; `dtable` is that dtype or f32 (mixed precision
/// keeps the grad of a 16-bit table in f32). Bad ids are reported as in [`embedding`].
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
    check_f32_on(OP, ids, dy)?;
    let gdtype = check_grad_of(OP, dtable, dy)?;
    let (vocab, d) = check_table(OP, dtable)?;
    if dy.dims() != embedded_dims(ids, d).as_slice() {
        return Err(Error::shape(OP, format!("dy {:?} must be ids {:?} + [{d}]", dy.dims(), ids.dims())));
    }
    let tokens = ids.numel();
    n32(OP, tokens * d)?;
    n32(OP, vocab * d)?;
    let kernel = if gdtype == DType::F32 { k::EMBEDDING_BWD_F32 } else { k::EMBEDDING_BWD }.get(dy.dtype());
    match exec(ids.device()) {
        Exec::Host(h) => {
            let (dyp, ip, gp) = (dy.host_ptr()?, ids.host_ptr()?, dtable.host_ptr()?);
            h.run(kernel, move || {
                let mut g = gp.read();
                cpu::embedding_backward(&dyp.read(), &ip.read(), vocab, d, &mut g)?;
                gp.write(&g);
                Ok(())
            })
        }
        Exec::Cuda(c) => c.launch(
            kernel,
            row_dims(vocab, d),
            &[
                KArg::Ptr(dtable.cuda_ptr()?),
                KArg::Ptr(dy.cuda_ptr()?),
                KArg::Ptr(ids.cuda_ptr()?),
                KArg::U32(tokens as u32),
                KArg::U32(vocab as u32),
                KArg::U32(d as u32),
                KArg::Ptr(c.err_word()),
            ],
        ),
    }
}

/// RMSNorm over the last dimension: `y = x · rstd · gamma` per row with
/// `rstd = 1 / sqrt(mean(x²) + eps)`. `x` is `[..., D]`, `gamma` `[D]`; returns `(y, rstd)`,
/// `rstd` of shape `[rows]`, which [`rms_norm_backward`] takes. `x` and `gamma` share one dtype
/// (f32, bf16 or f16), as `y` does; `rstd` is f32 and computed in f32. On CUDA one block per
/// row with a fixed-order reduction.
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
    let dtype = check_like(OP, &[x, gamma])?;
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
            h.run(k::RMS_NORM.get(dtype), move || {
                let (yv, rv) = cpu::rms_norm(&xp.read(), &gp.read(), d, eps);
                yp.write(&yv);
                rp.write(&rv);
                Ok(())
            })?;
        }
        Exec::Cuda(c) => c.launch(
            k::RMS_NORM.get(dtype),
            warp_rows(rows),
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
/// in a fixed order (deterministic). `dy`, `x` and `gamma` share one dtype, as `dx` does;
/// `rstd` is f32; `dgamma` is gamma's dtype or f32 (summed in f32 either way).
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
    let dtype = check_like(OP, &[x, dy, gamma])?;
    check_f32_on(OP, rstd, x)?;
    let gdtype = check_grad_of(OP, dgamma, gamma)?;
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
            h.run(k::RMS_NORM_BWD.get(dtype), move || {
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
            c.launch(k::RMS_NORM_BWD.get(dtype), warp_rows(rows), &args)?;
            // dgamma in two passes (partial sums of row chunks, then the chunks in order), so
            // the reduction over rows spreads over the GPU.
            let (chunks, chunk) = col_chunks(rows);
            let partial = Tensor::empty(x.device(), &[chunks, d])?;
            let pp = KArg::Ptr(partial.cuda_ptr()?);
            let args = [pp, dyp, xp, rp, r32, d32, KArg::U32(chunk as u32)];
            let grid = LaunchDims { grid: (d.div_ceil(32) as u32, chunks as u32, 1), ..col_dims(d) };
            c.launch(k::RMS_NORM_BWD_PARAMS_PARTIAL.get(dtype), grid, &args)?;
            let args = [KArg::Ptr(dgamma.cuda_ptr()?), pp, KArg::U32(chunks as u32), d32];
            c.launch(k::COL_PARTIALS_ACC.get(gdtype), LaunchDims::elementwise(d), &args)?;
        }
    }
    Ok(dx)
}

/// SwiGLU's gate: `y = silu(gate) · up` with `silu(g) = g · sigmoid(g)`, elementwise over two
/// tensors of one shape and dtype (f32, bf16 or f16; computed in f32, rounded once).
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
    let dtype = check_like(OP, &[gate, up])?;
    check_shape(OP, gate, up)?;
    let n = n32(OP, gate.numel())?;
    let y = Tensor::empty_like(gate)?;
    match exec(gate.device()) {
        Exec::Host(h) => {
            let (gp, up_, yp) = (gate.host_ptr()?, up.host_ptr()?, y.host_ptr()?);
            h.run(k::SWIGLU.get(dtype), move || {
                yp.write(&cpu::swiglu(&gp.read(), &up_.read()));
                Ok(())
            })?;
        }
        Exec::Cuda(c) => c.launch(
            k::SWIGLU.get(dtype),
            LaunchDims::vectorized(n as usize, dtype),
            &[KArg::Ptr(y.cuda_ptr()?), KArg::Ptr(gate.cuda_ptr()?), KArg::Ptr(up.cuda_ptr()?), KArg::U32(n)],
        )?,
    }
    Ok(y)
}

/// The backward of [`swiglu`]: `(dgate, dup)`, in the inputs' dtype.
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
    let dtype = check_like(OP, &[gate, up, dy])?;
    check_shape(OP, gate, up)?;
    check_shape(OP, gate, dy)?;
    let n = n32(OP, gate.numel())?;
    let (dgate, dup) = (Tensor::empty_like(gate)?, Tensor::empty_like(gate)?);
    match exec(gate.device()) {
        Exec::Host(h) => {
            let (dyp, gp, up_) = (dy.host_ptr()?, gate.host_ptr()?, up.host_ptr()?);
            let (dgp, dup_) = (dgate.host_ptr()?, dup.host_ptr()?);
            h.run(k::SWIGLU_BWD.get(dtype), move || {
                let (a, b) = cpu::swiglu_backward(&dyp.read(), &gp.read(), &up_.read());
                dgp.write(&a);
                dup_.write(&b);
                Ok(())
            })?;
        }
        Exec::Cuda(c) => c.launch(
            k::SWIGLU_BWD.get(dtype),
            LaunchDims::vectorized(n as usize, dtype),
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
