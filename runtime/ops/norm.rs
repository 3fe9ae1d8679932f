//! Layer normalization over the last dimension.

use crate::backend::KArg;
use crate::error::OpError;
use crate::ops::{
    as_rows, check_f32_on, check_like, check_rank1, check_shape, check_vector, col_dims, cpu, exec, k, n32, row_kernel,
    Exec,
};
use crate::{Error, Result, ShapeProblem, Tensor};

/// Layer norm over the last dimension: `y = (x - mean) · rstd · gamma + beta` per row, with
/// `rstd = 1 / sqrt(var + eps)` and the biased variance (PyTorch's `F.layer_norm`).
///
/// `x` is `[N, D]` (or `[..., D]`, rows flattened), `gamma` and `beta` are `[D]`. Returns
/// `(y, mean, rstd)` with `mean` and `rstd` of shape `[N]` (the rows), which
/// [`layer_norm_backward`] needs. On CUDA each row is read once into registers by the threads
/// that share it (one block per row for rows too wide for that), with a warp-shuffle/shared-memory
/// reduction in a fixed order (deterministic).
///
/// ```
/// # use graphed::{ops, Device, Tensor};
/// let dev = Device::host();
/// let x = Tensor::from_slice(&dev, &[1.0, 3.0], &[1, 2])?;
/// let (g, b) = (Tensor::full(&dev, &[2], 1.0)?, Tensor::zeros(&dev, &[2])?);
/// let (y, mean, rstd) = ops::layer_norm(&x, &g, &b, 0.0)?;
/// assert_eq!(y.to_vec()?, vec![-1.0, 1.0]);
/// assert_eq!((mean.to_vec()?, rstd.to_vec()?), (vec![2.0], vec![1.0]));
/// # Ok::<(), graphed::Error>(())
/// ```
///
/// `x`, `gamma` and `beta` share one dtype (f32, bf16 or f16); statistics are computed in f32
/// and `mean` and `rstd` are f32.
pub fn layer_norm(x: &Tensor, gamma: &Tensor, beta: &Tensor, eps: f32) -> Result<(Tensor, Tensor, Tensor)> {
    const OP: &str = "layer_norm";
    let dtype = check_like(OP, &[x, gamma, beta])?;
    check_rank1(OP, "x", x)?;
    let (rows, d) = as_rows(x);
    if d == 0 {
        return Err(Error::shape(OP, ShapeProblem::layout("x", "a nonempty last dimension", x.dims())));
    }
    check_vector(OP, "gamma", gamma, d)?;
    check_vector(OP, "beta", beta, d)?;
    if !(eps >= 0.0 && eps.is_finite()) {
        return Err(OpError::Eps { op: OP, eps }.into());
    }
    n32(OP, x.numel())?;
    let y = Tensor::empty_like(x)?;
    let (mean, rstd) = (Tensor::empty(x.device(), &[rows])?, Tensor::empty(x.device(), &[rows])?);
    match exec(x.device()) {
        Exec::Host(h) => {
            let (xp, gp, bp) = (x.host_ptr()?, gamma.host_ptr()?, beta.host_ptr()?);
            let (yp, mp, rp) = (y.host_ptr()?, mean.host_ptr()?, rstd.host_ptr()?);
            h.run(k::LAYER_NORM.get(dtype), move || {
                let (yv, mv, rv) = cpu::layer_norm(&xp.read(), &gp.read(), &bp.read(), d, eps);
                yp.write(&yv);
                mp.write(&mv);
                rp.write(&rv);
                Ok(())
            })?;
        }
        Exec::Cuda(c) => {
            // Rows held in registers (read once) when they fit, else one block a row.
            let (kernel, dims) = row_kernel(rows, d, dtype, k::LN_ROWS, k::LAYER_NORM);
            c.launch(
                kernel,
                dims,
                &[
                    KArg::Ptr(y.cuda_ptr()?),
                    KArg::Ptr(mean.cuda_ptr()?),
                    KArg::Ptr(rstd.cuda_ptr()?),
                    KArg::Ptr(x.cuda_ptr()?),
                    KArg::Ptr(gamma.cuda_ptr()?),
                    KArg::Ptr(beta.cuda_ptr()?),
                    KArg::U32(rows as u32),
                    KArg::U32(d as u32),
                    KArg::F32(eps),
                ],
            )?
        }
    }
    Ok((y, mean, rstd))
}

/// The backward of [`layer_norm`] from its saved `mean` and `rstd`: returns `dx` and
/// accumulates `dgamma += Σ_rows dy·x̂` and `dbeta += Σ_rows dy` (`x̂ = (x - mean)·rstd`).
///
/// On CUDA: a row kernel for `dx` (rows in registers, as the forward) and a column-reduction kernel for `dgamma` and
/// `dbeta` that adds each column in a fixed order (no atomics; deterministic). `dy`, `x`,
/// `gamma` and `dx` share one dtype; `mean`, `rstd`, `dgamma` and `dbeta` are f32.
///
/// ```
/// # use graphed::{ops, Device, Tensor};
/// let dev = Device::host();
/// let x = Tensor::from_slice(&dev, &[1.0, 3.0], &[1, 2])?;
/// let (g, b) = (Tensor::full(&dev, &[2], 1.0)?, Tensor::zeros(&dev, &[2])?);
/// let (_, mean, rstd) = ops::layer_norm(&x, &g, &b, 0.0)?;
/// let dy = Tensor::from_slice(&dev, &[1.0, 1.0], &[1, 2])?;
/// let (dg, db) = (Tensor::zeros(&dev, &[2])?, Tensor::zeros(&dev, &[2])?);
/// let dx = ops::layer_norm_backward(&dy, &x, &g, &mean, &rstd, &dg, &db)?;
/// assert_eq!(dx.to_vec()?, vec![0.0, 0.0]); // a constant shift does not change y
/// assert_eq!((dg.to_vec()?, db.to_vec()?), (vec![-1.0, 1.0], vec![1.0, 1.0]));
/// # Ok::<(), graphed::Error>(())
/// ```
pub fn layer_norm_backward(
    dy: &Tensor,
    x: &Tensor,
    gamma: &Tensor,
    mean: &Tensor,
    rstd: &Tensor,
    dgamma: &Tensor,
    dbeta: &Tensor,
) -> Result<Tensor> {
    let (dtype, rows, d) = check_layer_norm_backward([dy, x, gamma, mean, rstd, dgamma, dbeta])?;
    let dx = Tensor::empty_like(x)?;
    match exec(x.device()) {
        Exec::Host(h) => {
            let (dyp, xp, gp, mp, rp) =
                (dy.host_ptr()?, x.host_ptr()?, gamma.host_ptr()?, mean.host_ptr()?, rstd.host_ptr()?);
            let (dgp, dbp, dxp) = (dgamma.host_ptr()?, dbeta.host_ptr()?, dx.host_ptr()?);
            h.run(k::LAYER_NORM_BWD.get(dtype), move || {
                let (mut dg, mut db) = (dgp.read(), dbp.read());
                let v = cpu::layer_norm_backward(
                    &dyp.read(),
                    &xp.read(),
                    &gp.read(),
                    &mp.read(),
                    &rp.read(),
                    d,
                    &mut dg,
                    &mut db,
                );
                dxp.write(&v);
                dgp.write(&dg);
                dbp.write(&db);
                Ok(())
            })?;
        }
        Exec::Cuda(c) => {
            let (dyp, xp, mp, rp) = (dy.cuda_ptr()?, x.cuda_ptr()?, mean.cuda_ptr()?, rstd.cuda_ptr()?);
            let (kernel, dims) = row_kernel(rows, d, dtype, k::LN_ROWS_BWD, k::LAYER_NORM_BWD);
            c.launch(
                kernel,
                dims,
                &[
                    KArg::Ptr(dx.cuda_ptr()?),
                    KArg::Ptr(dyp),
                    KArg::Ptr(xp),
                    KArg::Ptr(gamma.cuda_ptr()?),
                    KArg::Ptr(mp),
                    KArg::Ptr(rp),
                    KArg::U32(rows as u32),
                    KArg::U32(d as u32),
                ],
            )?;
            c.launch(
                k::LAYER_NORM_BWD_PARAMS.get(dtype),
                col_dims(d),
                &[
                    KArg::Ptr(dgamma.cuda_ptr()?),
                    KArg::Ptr(dbeta.cuda_ptr()?),
                    KArg::Ptr(dyp),
                    KArg::Ptr(xp),
                    KArg::Ptr(mp),
                    KArg::Ptr(rp),
                    KArg::U32(rows as u32),
                    KArg::U32(d as u32),
                ],
            )?;
        }
    }
    Ok(dx)
}

/// The checks of [`layer_norm_backward`] on its arguments, in order: (dtype, rows, row length).
fn check_layer_norm_backward(args: [&Tensor; 7]) -> Result<(crate::DType, usize, usize)> {
    const OP: &str = "layer_norm_backward";
    let [dy, x, gamma, mean, rstd, dgamma, dbeta] = args;
    let dtype = check_like(OP, &[dy, x, gamma])?;
    for t in [mean, rstd, dgamma, dbeta] {
        check_f32_on(OP, t, x)?;
    }
    check_rank1(OP, "x", x)?;
    check_shape(OP, dy, x)?;
    let (rows, d) = as_rows(x);
    check_vector(OP, "gamma", gamma, d)?;
    check_vector(OP, "dgamma", dgamma, d)?;
    check_vector(OP, "dbeta", dbeta, d)?;
    check_vector(OP, "mean", mean, rows)?;
    check_vector(OP, "rstd", rstd, rows)?;
    n32(OP, x.numel())?;
    Ok((dtype, rows, d))
}
