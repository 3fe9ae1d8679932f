//! Linear layers through cuBLAS, and the bias add and bias grad around them.

use crate::backend::{BuiltinKernel, KArg, LaunchDims};
use crate::ops::{as_rows, check_rank1, check_same, check_shape, check_vector, col_dims, cpu, exec, n32, Exec};
use crate::{Error, Result, Tensor};

/// cuBLAS takes `int` sizes.
fn gemm_dim(op: &'static str, v: usize) -> Result<()> {
    if v > i32::MAX as usize {
        return Err(Error::invalid(op, format!("dimension {v} exceeds the i32 range cuBLAS supports")));
    }
    Ok(())
}

/// The output dims: `x`'s with the last dimension replaced by `out`.
fn out_dims(x: &Tensor, out: usize) -> Vec<usize> {
    let mut d = x.dims().to_vec();
    if let Some(last) = d.last_mut() {
        *last = out;
    }
    d
}

/// Checks `w` is `[out, in]` and fits `x`'s last dimension; returns `(rows, in, out)`.
fn check_linear(op: &'static str, x: &Tensor, w: &Tensor) -> Result<(usize, usize, usize)> {
    check_rank1(op, "x", x)?;
    if w.dims().len() != 2 {
        return Err(Error::shape(op, format!("w must be [out, in], got {:?}", w.dims())));
    }
    let (rows, input) = as_rows(x);
    let (out, w_in) = (w.dims()[0], w.dims()[1]);
    if w_in != input {
        return Err(Error::shape(
            op,
            format!("x {:?} has {input} features but w {:?} expects {w_in}", x.dims(), w.dims()),
        ));
    }
    if input == 0 || out == 0 {
        return Err(Error::shape(op, format!("w {:?} must have nonzero in and out features", w.dims())));
    }
    for v in [rows, input, out] {
        gemm_dim(op, v)?;
    }
    Ok((rows, input, out))
}

/// `y = x · wᵀ + b`: a fully connected layer.
///
/// `x` is `[N, in]` (or any `[..., in]`: leading dimensions are flattened into rows), `w` is
/// `[out, in]` — PyTorch's `nn.Linear` weight layout, one row per output feature — and `b` is
/// `[out]`. Returns `[N, out]` (`[..., out]`). On CUDA this is one cuBLAS SGEMM (plain f32, no
/// TF32) followed, with a bias, by a fused bias kernel over the output.
///
/// ```
/// # use graphed::{ops, Device, Tensor};
/// let dev = Device::host();
/// let x = Tensor::from_slice(&dev, &[1.0, 2.0], &[1, 2])?;
/// let w = Tensor::from_slice(&dev, &[1.0, 0.0, 1.0, 1.0, 0.0, -1.0], &[3, 2])?;
/// let b = Tensor::from_slice(&dev, &[0.5, 0.5, 0.5], &[3])?;
/// let y = ops::linear(&x, &w, Some(&b))?;
/// assert_eq!(y.dims(), &[1, 3]);
/// assert_eq!(y.to_vec()?, vec![1.5, 3.5, -1.5]);
/// # Ok::<(), graphed::Error>(())
/// ```
pub fn linear(x: &Tensor, w: &Tensor, b: Option<&Tensor>) -> Result<Tensor> {
    const OP: &str = "linear";
    check_same(OP, &[x, w])?;
    let (rows, input, out) = check_linear(OP, x, w)?;
    if let Some(b) = b {
        check_same(OP, &[x, b])?;
        check_vector(OP, "b", b, out)?;
    }
    let n = n32(OP, rows * out)?;
    let y = Tensor::empty(x.device(), &out_dims(x, out))?;
    match exec(x.device()) {
        Exec::Host(h) => {
            let (xp, wp, yp) = (x.host_ptr()?, w.host_ptr()?, y.host_ptr()?);
            let bp = b.map(|b| b.host_ptr()).transpose()?;
            h.run("linear_f32", move || {
                let bv = bp.as_ref().map(|b| b.read());
                yp.write(&cpu::linear(&xp.read(), &wp.read(), bv.as_deref(), rows, input, out));
                Ok(())
            })?;
        }
        Exec::Cuda(c) => {
            // Row-major y = x wᵀ is column-major yᵀ[out, N] = w[out, in] · xᵀ[in, N], where w and
            // x as column-major are wᵀ (ld in) and xᵀ (ld in).
            let yp = y.cuda_ptr()?;
            c.sgemm(true, false, out, rows, input, 1.0, w.cuda_ptr()?, input, x.cuda_ptr()?, input, 0.0, yp, out)?;
            if let Some(b) = b {
                c.launch(
                    BuiltinKernel::BiasAddF32,
                    LaunchDims::elementwise(n as usize),
                    &[KArg::Ptr(yp), KArg::Ptr(yp), KArg::Ptr(b.cuda_ptr()?), KArg::U32(n), KArg::U32(out as u32)],
                )?;
            }
        }
    }
    Ok(y)
}

/// The backward of [`linear`]: accumulates `dw += dyᵀ · x` and `db += Σ_rows dy` (so grads of
/// several passes add up, as in autograd), and returns `dx = dy · w` when `need_dx`.
///
/// `dy` is `[N, out]` (`[..., out]` matching `x`), `dw` has `w`'s shape `[out, in]`, `db` is
/// `[out]`. On CUDA: two SGEMMs (`beta = 1` for `dw`) and a deterministic column-sum kernel for
/// `db` (no atomics, so replays are bitwise equal to eager runs).
///
/// ```
/// # use graphed::{ops, Device, Tensor};
/// let dev = Device::host();
/// let x = Tensor::from_slice(&dev, &[1.0, 2.0], &[1, 2])?;
/// let w = Tensor::from_slice(&dev, &[1.0, 0.0, 0.0, 1.0], &[2, 2])?;
/// let dy = Tensor::from_slice(&dev, &[1.0, 3.0], &[1, 2])?;
/// let (dw, db) = (Tensor::zeros(&dev, &[2, 2])?, Tensor::zeros(&dev, &[2])?);
/// let dx = ops::linear_backward(&dy, &x, &w, &dw, Some(&db), true)?.unwrap();
/// assert_eq!(dx.to_vec()?, vec![1.0, 3.0]);
/// assert_eq!(dw.to_vec()?, vec![1.0, 2.0, 3.0, 6.0]);
/// assert_eq!(db.to_vec()?, vec![1.0, 3.0]);
/// # Ok::<(), graphed::Error>(())
/// ```
pub fn linear_backward(
    dy: &Tensor,
    x: &Tensor,
    w: &Tensor,
    dw: &Tensor,
    db: Option<&Tensor>,
    need_dx: bool,
) -> Result<Option<Tensor>> {
    const OP: &str = "linear_backward";
    check_same(OP, &[dy, x, w, dw])?;
    let (rows, input, out) = check_linear(OP, x, w)?;
    if dy.dims() != out_dims(x, out).as_slice() {
        return Err(Error::shape(
            OP,
            format!("dy {:?} must be {:?} for x {:?} and w {:?}", dy.dims(), out_dims(x, out), x.dims(), w.dims()),
        ));
    }
    check_shape(OP, dw, w)?;
    if let Some(db) = db {
        check_same(OP, &[dy, db])?;
        check_vector(OP, "db", db, out)?;
    }
    n32(OP, rows * out.max(input))?;
    let dx = if need_dx { Some(Tensor::empty(x.device(), x.dims())?) } else { None };
    match exec(x.device()) {
        Exec::Host(h) => {
            let (dyp, xp, wp, dwp) = (dy.host_ptr()?, x.host_ptr()?, w.host_ptr()?, dw.host_ptr()?);
            let dbp = db.map(|b| b.host_ptr()).transpose()?;
            let dxp = dx.as_ref().map(|t| t.host_ptr()).transpose()?;
            h.run("linear_backward_f32", move || {
                let mut dwv = dwp.read();
                let mut dbv = dbp.as_ref().map(|b| b.read());
                let dxv = cpu::linear_backward(
                    &dyp.read(),
                    &xp.read(),
                    &wp.read(),
                    rows,
                    input,
                    out,
                    &mut dwv,
                    dbv.as_deref_mut(),
                    dxp.is_some(),
                );
                dwp.write(&dwv);
                if let (Some(p), Some(v)) = (&dbp, &dbv) {
                    p.write(v);
                }
                if let (Some(p), Some(v)) = (&dxp, &dxv) {
                    p.write(v);
                }
                Ok(())
            })?;
        }
        Exec::Cuda(c) => {
            let (dyp, xp, wp) = (dy.cuda_ptr()?, x.cuda_ptr()?, w.cuda_ptr()?);
            // dwᵀ[in, out] += xᵀ[in, N] · dy[N, out] (column-major: x is xᵀ with ld in, dy is
            // dyᵀ with ld out, so it is transposed).
            c.sgemm(false, true, input, out, rows, 1.0, xp, input, dyp, out, 1.0, dw.cuda_ptr()?, input)?;
            if let Some(db) = db {
                c.launch(
                    BuiltinKernel::ColSumAccF32,
                    col_dims(out),
                    &[KArg::Ptr(db.cuda_ptr()?), KArg::Ptr(dyp), KArg::U32(rows as u32), KArg::U32(out as u32)],
                )?;
            }
            if let Some(dx) = &dx {
                // dxᵀ[in, N] = wᵀ[in, out] · dyᵀ[out, N].
                c.sgemm(false, false, input, rows, out, 1.0, wp, input, dyp, out, 0.0, dx.cuda_ptr()?, input)?;
            }
        }
    }
    Ok(dx)
}

/// `y[..., j] = x[..., j] + b[j]`: adds the bias `b` (`[D]`) to every row of `x` (`[..., D]`).
/// Its backward for `b` is the column sum of `dy`, which [`linear_backward`] computes as `db`.
///
/// ```
/// # use graphed::{ops, Device, Tensor};
/// let dev = Device::host();
/// let x = Tensor::from_slice(&dev, &[1.0, 2.0, 3.0, 4.0], &[2, 2])?;
/// let b = Tensor::from_slice(&dev, &[10.0, 20.0], &[2])?;
/// assert_eq!(ops::bias_add(&x, &b)?.to_vec()?, vec![11.0, 22.0, 13.0, 24.0]);
/// # Ok::<(), graphed::Error>(())
/// ```
pub fn bias_add(x: &Tensor, b: &Tensor) -> Result<Tensor> {
    const OP: &str = "bias_add";
    check_same(OP, &[x, b])?;
    check_rank1(OP, "x", x)?;
    let (_, d) = as_rows(x);
    check_vector(OP, "b", b, d)?;
    let n = n32(OP, x.numel())?;
    let y = Tensor::empty_like(x)?;
    match exec(x.device()) {
        Exec::Host(h) => {
            let (xp, bp, yp) = (x.host_ptr()?, b.host_ptr()?, y.host_ptr()?);
            h.run(BuiltinKernel::BiasAddF32, move || {
                yp.write(&cpu::bias_add(&xp.read(), &bp.read(), d));
                Ok(())
            })?;
        }
        Exec::Cuda(c) => c.launch(
            BuiltinKernel::BiasAddF32,
            LaunchDims::elementwise(n as usize),
            &[
                KArg::Ptr(y.cuda_ptr()?),
                KArg::Ptr(x.cuda_ptr()?),
                KArg::Ptr(b.cuda_ptr()?),
                KArg::U32(n),
                KArg::U32(d as u32),
            ],
        )?,
    }
    Ok(y)
}
