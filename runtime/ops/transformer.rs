//! Token embedding, RMSNorm and SwiGLU (#13) in f32, bf16 and f16, with their backwards.

use crate::backend::{BuiltinKernel as B, CudaBackend, KArg, LaunchDims, RowTiles};
use crate::error::OpError;
use crate::ops::{
    as_rows, check_f32_on, check_grad_of, check_like, check_rank1, check_shape, check_vector, col_chunks, col_dims,
    cpu, exec, k, n32, row_dims, warp_rows, Exec,
};
use crate::{DType, Error, Result, ShapeProblem, Tensor};

/// Checks `table` is `[vocab, d]` with both nonzero, and fresh; returns `(vocab, d)`.
fn check_table(op: &'static str, table: &Tensor) -> Result<(usize, usize)> {
    table.check_fresh()?;
    match *table.dims() {
        [vocab, d] if vocab > 0 && d > 0 => Ok((vocab, d)),
        _ => Err(Error::shape(op, ShapeProblem::layout("table", "[vocab, d] with both nonzero", table.dims()))),
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
        return Err(Error::shape(
            OP,
            ShapeProblem::expected("dy", &embedded_dims(ids, d), "ids' shape + [d]", dy.dims()),
        ));
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
/// (f32, bf16 or f16), as `y` does; `rstd` is f32 and computed in f32. On CUDA each row is read
/// once into registers by the threads that share it, and summed in a fixed order.
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
    let (_, y, rstd) = rms_norm_rows("rms_norm", x, None, gamma, eps)?;
    Ok((y, rstd))
}

/// Residual add and RMSNorm in one pass: `sum = x + residual` (rounded to the dtype: the next
/// residual stream) and `(normed, rstd)` = [`rms_norm`] of `sum`, bit for bit what
/// [`crate::ops::add`] then [`rms_norm`] give, with one read of each input. Returns
/// `(sum, normed, rstd)`; [`add_rms_norm_backward`] takes `sum` and `rstd`. `x`, `residual`
/// and `gamma` share one dtype; `x` and `residual` one shape `[..., D]`.
///
/// ```
/// # use graphed::{ops, Device, Tensor};
/// let dev = Device::host();
/// let x = Tensor::from_slice(&dev, &[1.0, 3.0], &[1, 2])?;
/// let residual = Tensor::from_slice(&dev, &[2.0, 1.0], &[1, 2])?;
/// let gamma = Tensor::full(&dev, &[2], 1.0)?;
/// let (sum, normed, rstd) = ops::add_rms_norm(&x, &residual, &gamma, 0.0)?;
/// assert_eq!(sum.to_vec()?, vec![3.0, 4.0]);
/// let (y, r) = ops::rms_norm(&sum, &gamma, 0.0)?;
/// assert_eq!((normed.to_vec()?, rstd.to_vec()?), (y.to_vec()?, r.to_vec()?));
/// # Ok::<(), graphed::Error>(())
/// ```
pub fn add_rms_norm(x: &Tensor, residual: &Tensor, gamma: &Tensor, eps: f32) -> Result<(Tensor, Tensor, Tensor)> {
    const OP: &str = "add_rms_norm";
    check_like(OP, &[x, residual])?;
    check_shape(OP, x, residual)?;
    let (sum, y, rstd) = rms_norm_rows(OP, x, Some(residual), gamma, eps)?;
    Ok((sum.unwrap_or_else(|| x.clone()), y, rstd))
}

/// RMSNorm's output again from the `rstd` its forward saved: `y = x · rstd · gamma`, bit for bit
/// the `y` that [`rms_norm`] (or [`add_rms_norm`], with its `sum` as `x`) returned with that
/// `rstd`, on both backends. So a forward need not keep its normed output for the backward (the
/// input of the projections' weight grads, as large as `x`): it keeps `x` and `rstd`, which the
/// norm's own backward reads anyway, and the backward calls this before the weight grads. One
/// elementwise pass (read `x`, write `y`); `x` and `gamma` share one dtype, `rstd` is f32 `[rows]`.
///
/// ```
/// # use graphed::{ops, Device, Tensor};
/// let dev = Device::host();
/// let x = Tensor::from_slice(&dev, &[3.0, 4.0, -1.0, 0.5], &[2, 2])?;
/// let gamma = Tensor::from_slice(&dev, &[1.0, 0.5], &[2])?;
/// let (y, rstd) = ops::rms_norm(&x, &gamma, 1e-5)?;
/// assert_eq!(ops::rms_norm_recompute(&x, &gamma, &rstd)?.to_vec()?, y.to_vec()?);
/// # Ok::<(), graphed::Error>(())
/// ```
pub fn rms_norm_recompute(x: &Tensor, gamma: &Tensor, rstd: &Tensor) -> Result<Tensor> {
    const OP: &str = "rms_norm_recompute";
    // The forward's checks of x and gamma (eps plays no part here), then rstd's.
    let (dtype, rows, d) = check_rms_norm(OP, x, gamma, 0.0)?;
    check_f32_on(OP, rstd, x)?;
    check_vector(OP, "rstd", rstd, rows)?;
    let n = n32(OP, x.numel())?;
    let y = Tensor::empty_like(x)?;
    match exec(x.device()) {
        Exec::Host(h) => {
            let (xp, gp, rp, yp) = (x.host_ptr()?, gamma.host_ptr()?, rstd.host_ptr()?, y.host_ptr()?);
            h.run(k::RMS_NORM_APPLY.get(dtype), move || {
                yp.write(&cpu::rms_norm_apply(&xp.read(), &gp.read(), &rp.read(), d));
                Ok(())
            })?;
        }
        Exec::Cuda(c) => c.launch(
            k::RMS_NORM_APPLY.get(dtype),
            LaunchDims::vectorized(n as usize, dtype),
            &[
                KArg::Ptr(y.cuda_ptr()?),
                KArg::Ptr(x.cuda_ptr()?),
                KArg::Ptr(gamma.cuda_ptr()?),
                KArg::Ptr(rstd.cuda_ptr()?),
                KArg::U32(rows as u32),
                KArg::U32(d as u32),
            ],
        )?,
    }
    Ok(y)
}

/// The checks of the RMSNorm forwards: (dtype, rows, row length).
fn check_rms_norm(op: &'static str, x: &Tensor, gamma: &Tensor, eps: f32) -> Result<(DType, usize, usize)> {
    let dtype = check_like(op, &[x, gamma])?;
    check_rank1(op, "x", x)?;
    let (rows, d) = as_rows(x);
    if d == 0 {
        return Err(Error::shape(op, ShapeProblem::layout("x", "a nonempty last dimension", x.dims())));
    }
    check_vector(op, "gamma", gamma, d)?;
    if !(eps >= 0.0 && eps.is_finite()) {
        return Err(OpError::Eps { op, eps }.into());
    }
    n32(op, x.numel())?;
    Ok((dtype, rows, d))
}

/// RMSNorm of `x` (+ `residual`, whose sum is returned first when given).
/// The bf16 RMSNorm kernels' ring forms (`RowTiles::ring`, unless `GRAPHED_ROW_RING=0`) where
/// their shared memory fits a block and `words` holds (see [`ring_words`]), else the register
/// kernels: the kernel and its launch. The same math; the row sums may add in another order, so
/// the bits may differ between the two forms (each is deterministic, eager and replayed).
fn row_kernel(
    c: &CudaBackend,
    dtype: DType,
    plain: (B, LaunchDims),
    ring: (B, LaunchDims),
    words: bool,
) -> (B, LaunchDims) {
    if dtype == DType::BF16 && RowTiles::ring() && words && ring.1.shared as usize <= c.dynamic_shared_limit(ring.0) {
        ring
    } else {
        plain
    }
}

/// The ring backward in clusters of [`RowTiles::bwd_cluster`] blocks where `kernel` is the ring
/// form and the device launches such clusters (sm_90): the grid becomes as many whole clusters
/// as `dims`'s blocks hold and as are resident at once (a grid-stride kernel: no cluster waits
/// for a second wave). Returns the kernel, its launch and the blocks a cluster (1: as given).
fn ring_bwd_clusters(c: &CudaBackend, kernel: B, dims: LaunchDims) -> Result<(B, LaunchDims, u32)> {
    let (cl, n) = (B::RmsRingBwdClBf16, RowTiles::bwd_cluster() as u32);
    if kernel != B::RmsRingBwdBf16
        || n <= 1
        || c.cluster_limit(cl) < n
        || dims.shared as usize > c.dynamic_shared_limit(cl)
    {
        return Ok((kernel, dims, 1));
    }
    let clusters = (dims.grid.0 / n).min(c.resident_clusters(cl, dims, n)?);
    if clusters == 0 {
        return Ok((kernel, dims, 1));
    }
    Ok((cl, LaunchDims { grid: (clusters * n, 1, 1), ..dims }, n))
}

/// Rows of at least this many bytes take RMSNorm's row in shared memory (`rms_smem_bf16`): on
/// the H100 (bench/row_sweep.py, 2026-12-06) it ran 4096 x 4096 at 1.15x of the bandwidth floor
/// against the ring's 1.26x, and 1.04x with the residual add; at 1,024 values a row (2 KB) it
/// was within 2% of the ring, so narrower rows (the GPT's) keep the ring.
const RMS_SMEM_MIN_BYTES: usize = 8 << 10;

/// Whether the plain RMSNorm forward's row in shared memory runs a thread for two of its lanes
/// (`rms_smem2_bf16`: half the threads a row, so twice the rows in flight a multiprocessor, and
/// the same bits) instead of one (`rms_smem_bf16`). Off by default until it is measured on an
/// H200, where the plain form ran at 1.67x of its floor and the residual-add form, the same
/// kernel with twice the bytes in flight a block, at 1.11x (session 35; docs/BENCHMARKS.md,
/// session 38). `GRAPHED_RMS_SMEM_SPLIT=2` turns it on, for measurements.
fn rms_smem_split() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("GRAPHED_RMS_SMEM_SPLIT").is_ok_and(|v| v == "2"))
}

/// The RMSNorm forward's row in shared memory, where it applies: bf16 rows of whole aligned
/// words of at least [`RMS_SMEM_MIN_BYTES`], whose residual-add form fits a block's shared
/// memory too (so that `add_rms_norm` and `add` then `rms_norm` take the same kernel and give
/// the same bits). A block a row; the row's lanes (the kernel's sum of squares is taken over
/// them, kernels/transformer.cu) about two 16-byte words each (the sweep's best), a thread a
/// lane, or two in the plain form with [`rms_smem_split`]; the shared memory the row and, with
/// `add`, the residual's.
fn rms_smem_launch(
    c: &CudaBackend,
    dtype: DType,
    rows: usize,
    d: usize,
    words: bool,
    add: bool,
) -> Option<(B, LaunchDims)> {
    let row_words = d.div_ceil(8);
    let lanes = row_words.div_ceil(2).next_power_of_two().clamp(32, 1024) as u32;
    let split = !add && lanes >= 64 && rms_smem_split();
    let kernel = if split { B::RmsSmem2Bf16 } else { B::RmsSmemBf16 };
    // Both forms' room against the kernel that would run each (the same bits need both).
    let limit = c.dynamic_shared_limit(B::RmsSmemBf16).min(c.dynamic_shared_limit(kernel));
    if dtype != DType::BF16 || !words || d * 2 < RMS_SMEM_MIN_BYTES || 2 * row_words * 16 > limit {
        return None;
    }
    let shared = (row_words * 16 * if add { 2 } else { 1 }) as u32;
    let threads = if split { lanes / 2 } else { lanes };
    Some((kernel, LaunchDims { shared, ..LaunchDims::rows(rows.min(1 << 20), threads) }))
}

/// Whether rows of `d` values of `elem` bytes at these addresses (0: an absent tensor) are whole
/// aligned 16-byte words, which the ring kernels need (`rn_fwd_vec` and `rn_bwd_vec` in
/// kernels/transformer.cu test the same; the kernels leave out the register kernels' fallback).
fn ring_words(d: usize, elem: usize, ptrs: &[u64]) -> bool {
    d.is_multiple_of(16 / elem) && ptrs.iter().all(|p| p.is_multiple_of(16))
}

fn rms_norm_rows(
    op: &'static str,
    x: &Tensor,
    residual: Option<&Tensor>,
    gamma: &Tensor,
    eps: f32,
) -> Result<(Option<Tensor>, Tensor, Tensor)> {
    let (dtype, rows, d) = check_rms_norm(op, x, gamma, eps)?;
    let sum = residual.map(|_| Tensor::empty_like(x)).transpose()?;
    let (y, rstd) = (Tensor::empty_like(x)?, Tensor::empty(x.device(), &[rows])?);
    match exec(x.device()) {
        Exec::Host(h) => {
            let (xp, gp, yp, rp) = (x.host_ptr()?, gamma.host_ptr()?, y.host_ptr()?, rstd.host_ptr()?);
            let rs = residual.map(|r| r.host_ptr()).transpose()?;
            let sp = sum.as_ref().map(|s| s.host_ptr()).transpose()?;
            let kernel = if residual.is_some() { k::RMS_ROWS } else { k::RMS_NORM };
            h.run(kernel.get(dtype), move || {
                let mut xv = xp.read();
                if let (Some(rs), Some(sp)) = (&rs, &sp) {
                    // The sum as the dtype stores it: what an add followed by rms_norm reads.
                    xv = cpu::add(&xv, &rs.read()).into_iter().map(|v| dtype.round(v)).collect();
                    sp.write(&xv);
                }
                let (yv, rv) = cpu::rms_norm(&xv, &gp.read(), d, eps);
                yp.write(&yv);
                rp.write(&rv);
                Ok(())
            })?;
        }
        Exec::Cuda(c) => {
            let ptr = |t: Option<&Tensor>| t.map_or(Ok(0), |t| t.cuda_ptr());
            let at = [y.cuda_ptr()?, ptr(sum.as_ref())?, x.cuda_ptr()?, ptr(residual)?, gamma.cuda_ptr()?];
            let words = ring_words(d, dtype.size(), &at);
            let launch = rms_smem_launch(c, dtype, rows, d, words, residual.is_some()).or_else(|| {
                RowTiles::CHOSEN.fwd_launch(rows, d, dtype.size()).map(|l| {
                    let ring = (B::RmsRingBf16, RowTiles::ring_fwd(l, d, dtype.size(), residual.is_some()));
                    row_kernel(c, dtype, (k::RMS_ROWS.get(dtype), l.dims), ring, words)
                })
            });
            match launch {
                Some((kernel, dims)) => c.launch(
                    kernel,
                    dims,
                    &[
                        KArg::Ptr(y.cuda_ptr()?),
                        KArg::Ptr(rstd.cuda_ptr()?),
                        KArg::Ptr(ptr(sum.as_ref())?),
                        KArg::Ptr(x.cuda_ptr()?),
                        KArg::Ptr(ptr(residual)?),
                        KArg::Ptr(gamma.cuda_ptr()?),
                        KArg::U32(rows as u32),
                        KArg::U32(d as u32),
                        KArg::F32(eps),
                    ],
                )?,
                // Rows too wide to hold in registers: the sum, then the one-warp-a-row kernel.
                None => {
                    let src = match (residual, &sum) {
                        (Some(r), Some(s)) => {
                            let n = n32(op, x.numel())?;
                            let args = [
                                KArg::Ptr(s.cuda_ptr()?),
                                KArg::Ptr(x.cuda_ptr()?),
                                KArg::Ptr(r.cuda_ptr()?),
                                KArg::U32(n),
                            ];
                            c.launch(k::ADD.get(dtype), LaunchDims::vectorized(n as usize, dtype), &args)?;
                            s
                        }
                        _ => x,
                    };
                    c.launch(
                        k::RMS_NORM.get(dtype),
                        warp_rows(rows),
                        &[
                            KArg::Ptr(y.cuda_ptr()?),
                            KArg::Ptr(rstd.cuda_ptr()?),
                            KArg::Ptr(src.cuda_ptr()?),
                            KArg::Ptr(gamma.cuda_ptr()?),
                            KArg::U32(rows as u32),
                            KArg::U32(d as u32),
                            KArg::F32(eps),
                        ],
                    )?
                }
            }
        }
    }
    Ok((sum, y, rstd))
}

/// The backward of [`rms_norm`] from its saved `rstd`: returns `dx` and accumulates
/// `dgamma += Σ_rows dy · x · rstd`. On CUDA one row kernel writes `dx` and each block's partial
/// sums of the gamma grad, then a second kernel adds the partials in a fixed order
/// (deterministic, no atomics). `dy`, `x` and `gamma` share one dtype, as `dx` does; `rstd` is
/// f32; `dgamma` is gamma's dtype or f32 (summed in f32 either way).
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
    rms_norm_rows_backward("rms_norm_backward", dy, None, x, gamma, rstd, dgamma)
}

/// The backward of [`add_rms_norm`]: the grad of `sum` (so of `x` and of `residual` alike),
/// `rms_norm_backward(dy, sum, ..) + dsum`, where `dy` is the grad of `normed` and `dsum` the
/// grad `sum` gets from its other reader (the residual stream); accumulates the gamma grad as
/// [`rms_norm_backward`] does. One pass on CUDA, bit for bit what [`rms_norm_backward`] then
/// [`crate::ops::add`] give (the norm's grad is rounded to the dtype before the add, as there).
///
/// ```
/// # use graphed::{ops, Device, Tensor};
/// let dev = Device::host();
/// let (x, r) = (Tensor::from_slice(&dev, &[1.0, 3.0], &[1, 2])?, Tensor::from_slice(&dev, &[2.0, 1.0], &[1, 2])?);
/// let gamma = Tensor::full(&dev, &[2], 1.0)?;
/// let (sum, _, rstd) = ops::add_rms_norm(&x, &r, &gamma, 1e-5)?;
/// let (dy, dsum) = (Tensor::from_slice(&dev, &[0.5, -1.0], &[1, 2])?, Tensor::full(&dev, &[1, 2], 1.0)?);
/// let (dg1, dg2) = (Tensor::zeros(&dev, &[2])?, Tensor::zeros(&dev, &[2])?);
/// let dx = ops::add_rms_norm_backward(&dy, &dsum, &sum, &gamma, &rstd, &dg1)?;
/// let unfused = ops::add(&dsum, &ops::rms_norm_backward(&dy, &sum, &gamma, &rstd, &dg2)?)?;
/// assert_eq!(dx.to_vec()?, unfused.to_vec()?);
/// assert_eq!(dg1.to_vec()?, dg2.to_vec()?);
/// # Ok::<(), graphed::Error>(())
/// ```
pub fn add_rms_norm_backward(
    dy: &Tensor,
    dsum: &Tensor,
    sum: &Tensor,
    gamma: &Tensor,
    rstd: &Tensor,
    dgamma: &Tensor,
) -> Result<Tensor> {
    const OP: &str = "add_rms_norm_backward";
    check_like(OP, &[sum, dsum])?;
    check_shape(OP, dsum, sum)?;
    rms_norm_rows_backward(OP, dy, Some(dsum), sum, gamma, rstd, dgamma)
}

/// The backward of RMSNorm (+ `dsum`, added to `dx` when given).
fn rms_norm_rows_backward(
    op: &'static str,
    dy: &Tensor,
    dsum: Option<&Tensor>,
    x: &Tensor,
    gamma: &Tensor,
    rstd: &Tensor,
    dgamma: &Tensor,
) -> Result<Tensor> {
    let dtype = check_like(op, &[x, dy, gamma])?;
    check_f32_on(op, rstd, x)?;
    let gdtype = check_grad_of(op, dgamma, gamma)?;
    check_rank1(op, "x", x)?;
    check_shape(op, dy, x)?;
    let (rows, d) = as_rows(x);
    check_vector(op, "gamma", gamma, d)?;
    check_vector(op, "dgamma", dgamma, d)?;
    check_vector(op, "rstd", rstd, rows)?;
    n32(op, x.numel())?;
    let dx = Tensor::empty_like(x)?;
    match exec(x.device()) {
        Exec::Host(h) => {
            let (dyp, xp, gp, rp) = (dy.host_ptr()?, x.host_ptr()?, gamma.host_ptr()?, rstd.host_ptr()?);
            let (dgp, dxp) = (dgamma.host_ptr()?, dx.host_ptr()?);
            let dsp = dsum.map(|t| t.host_ptr()).transpose()?;
            let kernel = if dsum.is_some() { k::RMS_ROWS_BWD } else { k::RMS_NORM_BWD };
            h.run(kernel.get(dtype), move || {
                let mut dg = dgp.read();
                let mut v = cpu::rms_norm_backward(&dyp.read(), &xp.read(), &gp.read(), &rp.read(), d, &mut dg);
                if let Some(dsp) = &dsp {
                    // The norm's grad as the dtype stores it, then the add: the unfused ops' bits.
                    let rounded: Vec<f32> = v.iter().map(|g| dtype.round(*g)).collect();
                    v = cpu::add(&rounded, &dsp.read());
                }
                dxp.write(&v);
                dgp.write(&dg);
                Ok(())
            })?;
        }
        Exec::Cuda(c) => {
            let (dyp, xp, rp) = (KArg::Ptr(dy.cuda_ptr()?), KArg::Ptr(x.cuda_ptr()?), KArg::Ptr(rstd.cuda_ptr()?));
            let (r32, d32) = (KArg::U32(rows as u32), KArg::U32(d as u32));
            let dsp = KArg::Ptr(dsum.map_or(Ok(0), |t| t.cuda_ptr())?);
            let (partial, chunks) = match RowTiles::CHOSEN.bwd_launch(rows, d, dtype.size()) {
                // dx and each block's partial gamma grad in one pass over dy and x.
                Some(l) => {
                    let ring = (B::RmsRingBwdBf16, RowTiles::ring_bwd(l, d, dtype.size(), dsum.is_some()));
                    let dsum_at = dsum.map_or(Ok(0), |t| t.cuda_ptr())?;
                    let at = [dx.cuda_ptr()?, dy.cuda_ptr()?, dsum_at, x.cuda_ptr()?, gamma.cuda_ptr()?];
                    let words = ring_words(d, dtype.size(), &at);
                    let (kernel, dims) = row_kernel(c, dtype, (k::RMS_ROWS_BWD.get(dtype), l.dims), ring, words);
                    let (kernel, dims, cluster) = ring_bwd_clusters(c, kernel, dims)?;
                    let chunks = (dims.grid.0 / cluster) as usize;
                    let partial = Tensor::empty(x.device(), &[chunks, d])?;
                    let gp = KArg::Ptr(gamma.cuda_ptr()?);
                    let args =
                        [KArg::Ptr(dx.cuda_ptr()?), KArg::Ptr(partial.cuda_ptr()?), dyp, dsp, xp, gp, rp, r32, d32];
                    c.launch_in_clusters(kernel, dims, &args, cluster)?;
                    (partial, chunks)
                }
                // Rows too wide to hold in registers: one warp a row for dx, then partial sums of
                // row chunks for the gamma grad.
                None => {
                    let args = [KArg::Ptr(dx.cuda_ptr()?), dyp, xp, KArg::Ptr(gamma.cuda_ptr()?), rp, r32, d32];
                    c.launch(k::RMS_NORM_BWD.get(dtype), warp_rows(rows), &args)?;
                    if let Some(ds) = dsum {
                        let n = n32(op, x.numel())?;
                        let (p, s) = (KArg::Ptr(dx.cuda_ptr()?), KArg::Ptr(ds.cuda_ptr()?));
                        c.launch(
                            k::ADD.get(dtype),
                            LaunchDims::vectorized(n as usize, dtype),
                            &[p, p, s, KArg::U32(n)],
                        )?;
                    }
                    let (chunks, chunk) = col_chunks(rows);
                    let partial = Tensor::empty(x.device(), &[chunks, d])?;
                    let args = [KArg::Ptr(partial.cuda_ptr()?), dyp, xp, rp, r32, d32, KArg::U32(chunk as u32)];
                    let grid = LaunchDims { grid: (d.div_ceil(32) as u32, chunks as u32, 1), ..col_dims(d) };
                    c.launch(k::RMS_NORM_BWD_PARAMS_PARTIAL.get(dtype), grid, &args)?;
                    (partial, chunks)
                }
            };
            let args = [KArg::Ptr(dgamma.cuda_ptr()?), KArg::Ptr(partial.cuda_ptr()?), KArg::U32(chunks as u32), d32];
            c.launch(k::COL_PARTIALS_ACC.get(gdtype), col_dims(d), &args)?;
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

/// [`swiglu`] of one tensor holding the gate and the up projection side by side: `gu` is
/// `[..., 2·h]` (the gate in the first `h` columns of each row, up in the last `h`, as one
/// GEMM against the two weights stacked writes them), the result `[..., h]`. Bitwise
/// [`swiglu`] of the two halves, on both backends; one GEMM and this op replace two GEMMs
/// and `swiglu` (the decoder's MLP).
///
/// ```
/// # use graphed::{ops, Device, Tensor};
/// let dev = Device::host();
/// // One row: gate [0, 20], up [5, 2].
/// let gu = Tensor::from_slice(&dev, &[0.0, 20.0, 5.0, 2.0], &[1, 4])?;
/// let y = ops::swiglu_packed(&gu)?;
/// assert_eq!(y.dims(), &[1, 2][..]);
/// let (gate, up) = (Tensor::from_slice(&dev, &[0.0, 20.0], &[1, 2])?, Tensor::from_slice(&dev, &[5.0, 2.0], &[1, 2])?);
/// assert_eq!(y.to_vec()?, ops::swiglu(&gate, &up)?.to_vec()?);
/// # Ok::<(), graphed::Error>(())
/// ```
pub fn swiglu_packed(gu: &Tensor) -> Result<Tensor> {
    const OP: &str = "swiglu_packed";
    let (dtype, rows, h, dims) = check_packed(OP, gu)?;
    let width = 2 * h;
    let y = Tensor::empty_as(gu.device(), &dims, dtype)?;
    match exec(gu.device()) {
        Exec::Host(hb) => {
            let (gp, yp) = (gu.host_ptr()?, y.host_ptr()?);
            hb.run(k::SWIGLU_PACKED.get(dtype), move || {
                let v = gp.read();
                let (gate, up): (Vec<f32>, Vec<f32>) = v.chunks(width).flat_map(|r| r[..h].iter().zip(&r[h..])).unzip();
                yp.write(&cpu::swiglu(&gate, &up));
                Ok(())
            })?;
        }
        Exec::Cuda(c) => c.launch(
            k::SWIGLU_PACKED.get(dtype),
            LaunchDims::vectorized(rows * h, dtype),
            &[KArg::Ptr(y.cuda_ptr()?), KArg::Ptr(gu.cuda_ptr()?), KArg::U32(rows as u32), KArg::U32(h as u32)],
        )?,
    }
    Ok(y)
}

/// The checks of a packed `gu` (`[..., 2·h]`): `(dtype, rows, h, the dims of y = [..., h])`.
fn check_packed(op: &'static str, gu: &Tensor) -> Result<(DType, usize, usize, Vec<usize>)> {
    let dtype = check_like(op, &[gu])?;
    let layout = "[..., 2 · h]: a last dimension of gate then up, an even nonzero width";
    let bad = || Error::shape(op, ShapeProblem::layout("gu", layout, gu.dims()));
    let (&width, outer) = gu.dims().split_last().ok_or_else(bad)?;
    if width == 0 || width % 2 != 0 {
        return Err(bad());
    }
    n32(op, gu.numel())?;
    let h = width / 2;
    Ok((dtype, gu.numel() / width, h, outer.iter().copied().chain([h]).collect()))
}

/// The backward of [`swiglu_packed`]: `dgu`, the grad of `gu` in its layout (the gate's grad in
/// the first `h` columns of each row, up's in the last `h`), from `dy` (`[..., h]`), in one
/// pass. Bitwise [`swiglu_backward`] of the two halves, on both backends; with
/// [`crate::ops::linear_backward`] against the stacked weights it is the backward of one GEMM
/// and `swiglu_packed` (a block's MLP with its gate and up projections as one weight).
///
/// ```
/// # use graphed::{ops, Device, Tensor};
/// let dev = Device::host();
/// // One row: gate [0, 1.5], up [3, -2].
/// let gu = Tensor::from_slice(&dev, &[0.0, 1.5, 3.0, -2.0], &[1, 4])?;
/// let dy = Tensor::from_slice(&dev, &[1.0, 0.5], &[1, 2])?;
/// let dgu = ops::swiglu_packed_backward(&dy, &gu)?.to_vec()?;
/// let (gate, up) = (Tensor::from_slice(&dev, &[0.0, 1.5], &[1, 2])?, Tensor::from_slice(&dev, &[3.0, -2.0], &[1, 2])?);
/// let (dgate, dup) = ops::swiglu_backward(&dy, &gate, &up)?;
/// assert_eq!(dgu[..2], dgate.to_vec()?[..]);
/// assert_eq!(dgu[2..], dup.to_vec()?[..]);
/// # Ok::<(), graphed::Error>(())
/// ```
pub fn swiglu_packed_backward(dy: &Tensor, gu: &Tensor) -> Result<Tensor> {
    let (dtype, rows, h) = check_packed_bwd("swiglu_packed_backward", dy, gu)?;
    let dgu = Tensor::empty_like(gu)?;
    swiglu_packed_bwd((dtype, rows, h), dy, gu, &dgu, None)?;
    Ok(dgu)
}

/// [`swiglu_packed_backward`] that also gives the forward's output again: `(dgu, y)` with `y`
/// bit for bit what [`swiglu_packed`] returned for this `gu`, written by the same pass (as
/// [`swiglu_backward_recompute`] does for two tensors), so a forward need not keep `y`.
///
/// ```
/// # use graphed::{ops, Device, Tensor};
/// let dev = Device::host();
/// let gu = Tensor::from_slice(&dev, &[0.0, 1.5, 3.0, -2.0], &[1, 4])?;
/// let dy = Tensor::from_slice(&dev, &[1.0, 0.5], &[1, 2])?;
/// let (dgu, y) = ops::swiglu_packed_backward_recompute(&dy, &gu)?;
/// assert_eq!(y.to_vec()?, ops::swiglu_packed(&gu)?.to_vec()?);
/// assert_eq!(dgu.to_vec()?, ops::swiglu_packed_backward(&dy, &gu)?.to_vec()?);
/// # Ok::<(), graphed::Error>(())
/// ```
pub fn swiglu_packed_backward_recompute(dy: &Tensor, gu: &Tensor) -> Result<(Tensor, Tensor)> {
    let (dtype, rows, h) = check_packed_bwd("swiglu_packed_backward_recompute", dy, gu)?;
    let (dgu, y) = (Tensor::empty_like(gu)?, Tensor::empty_like(dy)?);
    swiglu_packed_bwd((dtype, rows, h), dy, gu, &dgu, Some(&y))?;
    Ok((dgu, y))
}

/// The checks of the packed backwards: `gu` as [`swiglu_packed`] takes it, `dy` its output's
/// shape and dtype. Returns `(dtype, rows, h)`.
fn check_packed_bwd(op: &'static str, dy: &Tensor, gu: &Tensor) -> Result<(DType, usize, usize)> {
    let (dtype, rows, h, dims) = check_packed(op, gu)?;
    check_like(op, &[gu, dy])?;
    if dy.dims() != dims.as_slice() {
        return Err(Error::shape(op, ShapeProblem::expected("dy", &dims, "the output of gu", dy.dims())));
    }
    Ok((dtype, rows, h))
}

/// The packed SwiGLU backward into `dgu`, and the forward's output again into `y` when given.
fn swiglu_packed_bwd(
    (dtype, rows, h): (DType, usize, usize),
    dy: &Tensor,
    gu: &Tensor,
    dgu: &Tensor,
    y: Option<&Tensor>,
) -> Result<()> {
    match exec(gu.device()) {
        Exec::Host(hb) => {
            let (dyp, gp, dgp) = (dy.host_ptr()?, gu.host_ptr()?, dgu.host_ptr()?);
            let yp = y.map(|t| t.host_ptr()).transpose()?;
            hb.run(k::SWIGLU_PACKED_BWD.get(dtype), move || {
                let v = gp.read();
                let (gate, up): (Vec<f32>, Vec<f32>) = v.chunks(2 * h).flat_map(|r| r[..h].iter().zip(&r[h..])).unzip();
                let (dg, du) = cpu::swiglu_backward(&dyp.read(), &gate, &up);
                let packed: Vec<f32> =
                    dg.chunks(h).zip(du.chunks(h)).flat_map(|(a, b)| a.iter().chain(b).copied()).collect();
                dgp.write(&packed);
                if let Some(yp) = &yp {
                    yp.write(&cpu::swiglu(&gate, &up));
                }
                Ok(())
            })
        }
        Exec::Cuda(c) => c.launch(
            k::SWIGLU_PACKED_BWD.get(dtype),
            LaunchDims::vectorized(rows * h, dtype),
            &[
                KArg::Ptr(dgu.cuda_ptr()?),
                KArg::Ptr(y.map_or(Ok(0), |t| t.cuda_ptr())?),
                KArg::Ptr(dy.cuda_ptr()?),
                KArg::Ptr(gu.cuda_ptr()?),
                KArg::U32(rows as u32),
                KArg::U32(h as u32),
            ],
        ),
    }
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
    let (dtype, n) = check_swiglu_bwd("swiglu_backward", dy, gate, up)?;
    let (dgate, dup) = (Tensor::empty_like(gate)?, Tensor::empty_like(gate)?);
    swiglu_bwd((dtype, n), [dy, gate, up], [&dgate, &dup], None)?;
    Ok((dgate, dup))
}

/// [`swiglu_backward`] that also gives the forward's output again: `(dgate, dup, y)` with `y`
/// bit for bit what [`swiglu`] returned for these `gate` and `up`, written by the same pass that
/// reads them for the grads. So a forward need not keep `y` for its backward (the input of the
/// down projection's weight grad, as large as `gate`): it keeps `gate` and `up`, takes the down
/// projection's input grad first ([`crate::ops::linear_input_grad`]), calls this, and takes the
/// weight grad from the returned `y` ([`crate::ops::linear_backward`] without `dx`). One extra
/// write of `y`, where saving it held `y` from the forward to the backward.
///
/// ```
/// # use graphed::{ops, Device, Tensor};
/// let dev = Device::host();
/// let gate = Tensor::from_slice(&dev, &[0.0, 1.5], &[2])?;
/// let up = Tensor::from_slice(&dev, &[3.0, -2.0], &[2])?;
/// let dy = Tensor::from_slice(&dev, &[1.0, 0.5], &[2])?;
/// let (dgate, dup, y) = ops::swiglu_backward_recompute(&dy, &gate, &up)?;
/// assert_eq!(y.to_vec()?, ops::swiglu(&gate, &up)?.to_vec()?);
/// let (dg, du) = ops::swiglu_backward(&dy, &gate, &up)?;
/// assert_eq!((dgate.to_vec()?, dup.to_vec()?), (dg.to_vec()?, du.to_vec()?));
/// # Ok::<(), graphed::Error>(())
/// ```
pub fn swiglu_backward_recompute(dy: &Tensor, gate: &Tensor, up: &Tensor) -> Result<(Tensor, Tensor, Tensor)> {
    let (dtype, n) = check_swiglu_bwd("swiglu_backward_recompute", dy, gate, up)?;
    let (dgate, dup, y) = (Tensor::empty_like(gate)?, Tensor::empty_like(gate)?, Tensor::empty_like(gate)?);
    swiglu_bwd((dtype, n), [dy, gate, up], [&dgate, &dup], Some(&y))?;
    Ok((dgate, dup, y))
}

/// The checks of SwiGLU's backwards: `(dtype, numel)`.
fn check_swiglu_bwd(op: &'static str, dy: &Tensor, gate: &Tensor, up: &Tensor) -> Result<(DType, u32)> {
    let dtype = check_like(op, &[gate, up, dy])?;
    check_shape(op, gate, up)?;
    check_shape(op, gate, dy)?;
    Ok((dtype, n32(op, gate.numel())?))
}

/// SwiGLU's backward into `dgate` and `dup`, and the forward's output again into `y` when given.
fn swiglu_bwd(
    (dtype, n): (DType, u32),
    [dy, gate, up]: [&Tensor; 3],
    [dgate, dup]: [&Tensor; 2],
    y: Option<&Tensor>,
) -> Result<()> {
    match exec(gate.device()) {
        Exec::Host(h) => {
            let (dyp, gp, up_) = (dy.host_ptr()?, gate.host_ptr()?, up.host_ptr()?);
            let (dgp, dup_) = (dgate.host_ptr()?, dup.host_ptr()?);
            let yp = y.map(|t| t.host_ptr()).transpose()?;
            h.run(k::SWIGLU_BWD.get(dtype), move || {
                let (g, u) = (gp.read(), up_.read());
                let (a, b) = cpu::swiglu_backward(&dyp.read(), &g, &u);
                dgp.write(&a);
                dup_.write(&b);
                if let Some(yp) = &yp {
                    yp.write(&cpu::swiglu(&g, &u));
                }
                Ok(())
            })
        }
        Exec::Cuda(c) => c.launch(
            k::SWIGLU_BWD.get(dtype),
            LaunchDims::vectorized(n as usize, dtype),
            &[
                KArg::Ptr(dgate.cuda_ptr()?),
                KArg::Ptr(dup.cuda_ptr()?),
                KArg::Ptr(y.map_or(Ok(0), |t| t.cuda_ptr())?),
                KArg::Ptr(dy.cuda_ptr()?),
                KArg::Ptr(gate.cuda_ptr()?),
                KArg::Ptr(up.cuda_ptr()?),
                KArg::U32(n),
            ],
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::ring_words;

    #[test]
    fn the_ring_kernels_take_only_rows_of_whole_aligned_words() {
        // bf16 rows of 512: 64 words each, every tensor 16-byte aligned (absent ones are 0).
        assert!(ring_words(512, 2, &[0x1000, 0, 0x2010, 0, 0x3000]));
        // A row that ends inside a word, and a tensor 8 bytes off a word.
        assert!(!ring_words(500, 2, &[0x1000, 0x2000]));
        assert!(!ring_words(512, 2, &[0x1000, 0x2008]));
    }
}
