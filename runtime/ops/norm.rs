//! Layer normalization over the last dimension.

use crate::backend::{BuiltinKernel as B, CudaBackend, KArg, LaunchDims, RowTiles};
use crate::error::OpError;
use crate::ops::{
    as_rows, check_f32_on, check_like, check_rank1, check_shape, check_vector, col_dims, cpu, exec, k, n32, row_kernel,
    Exec,
};
use crate::{DType, Error, Result, ShapeProblem, Tensor};

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
            let (dxp, gp) = (dx.cuda_ptr()?, gamma.cuda_ptr()?);
            if let Some(dims) = ln_ring_bwd_launch(c, dtype, rows, d, [dxp, dyp, xp, gp]) {
                // One pass: dx and each block's sums of the parameters' grads, then their sums
                // in block order onto dgamma and dbeta.
                let blocks = dims.grid.0 as usize;
                let partial = Tensor::empty(x.device(), &[2 * blocks, d])?;
                let pg = partial.cuda_ptr()?;
                let pb = pg + (blocks * d * 4) as u64;
                let ptrs = [dxp, pg, pb, dyp, xp, gp, mp, rp];
                let mut args: Vec<KArg> = ptrs.into_iter().map(KArg::Ptr).collect();
                args.extend([KArg::U32(rows as u32), KArg::U32(d as u32)]);
                c.launch(B::LnRingBwdF32, dims, &args)?;
                for (out, part) in [(dgamma, pg), (dbeta, pb)] {
                    let args =
                        [KArg::Ptr(out.cuda_ptr()?), KArg::Ptr(part), KArg::U32(blocks as u32), KArg::U32(d as u32)];
                    c.launch(k::COL_PARTIALS_ACC.get(DType::F32), col_dims(d), &args)?;
                }
                return Ok(dx);
            }
            let (kernel, dims) = row_kernel(rows, d, dtype, k::LN_ROWS_BWD, k::LAYER_NORM_BWD);
            c.launch(
                kernel,
                dims,
                &[
                    KArg::Ptr(dxp),
                    KArg::Ptr(dyp),
                    KArg::Ptr(xp),
                    KArg::Ptr(gp),
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

/// Blocks of LayerNorm's one-pass f32 backward (`ln_ring_bwd_f32`): a fixed number, not the
/// GPU's, so the parameters' grads (a block's rows, then the blocks in order) get the same bits
/// on every GPU; one a multiprocessor on the H100 and H200, the bench's best
/// (bench/row_tma.py, H100, 2026-12-07: 4096 x 4096 95.9 us, 16384 x 1024 107.8 us, 4096 x 1024
/// 42.9 us, each at 2 ring slots).
const LN_RING_BLOCKS: usize = 132;

/// The launch of `ln_ring_bwd_f32` for `[rows, d]`, where it applies: f32 on sm_90 or later
/// (bulk copies), rows of whole 16-byte words with every tensor (`[dx, dy, x, gamma]`)
/// 16-byte aligned, at most `LN_RING_WPT` (4) words a thread of 256, and the ring's two slots of
/// (dy, x) rows ([`RowTiles::LN_RING_STAGES`]) within a block's shared memory. Threads: the
/// row's words over 2, 128 to 256.
fn ln_ring_bwd_launch(c: &CudaBackend, dtype: DType, rows: usize, d: usize, ptrs: [u64; 4]) -> Option<LaunchDims> {
    const WPT: usize = 4;
    let words = d / 4;
    let shared = RowTiles::LN_RING_STAGES * 2 * d * 4;
    let fits = dtype == DType::F32
        && c.capability.0 >= 9
        && rows > 0
        && d.is_multiple_of(4)
        && ptrs.iter().all(|p| p.is_multiple_of(16))
        && words <= WPT * 256
        && shared <= c.dynamic_shared_limit(B::LnRingBwdF32);
    let threads = (words / 2).clamp(128, 256) as u32;
    let blocks = rows.min(LN_RING_BLOCKS) as u32;
    fits.then_some(LaunchDims { grid: (blocks, 1, 1), block: (threads, 1, 1), shared: shared as u32 })
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
