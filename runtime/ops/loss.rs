//! Losses: softmax cross-entropy and mean squared error.

use crate::backend::{BuiltinKernel, CudaBackend, KArg, LaunchDims};
use crate::error::OpError;
use crate::ops::{
    check_f32_on, check_like, check_same, check_shape, cpu, cuda_reduce, exec, k, n32, reduce_blocks, row_kernel, Exec,
};
use crate::{Device, Error, Result, ShapeProblem, Tensor};

/// Rows up to which the cross-entropy's mean (and the backward's count of rows not ignored)
/// runs as one launch of one block (`xent_mean_f32`); larger batches take the partial sums'
/// three launches, spread over the GPU. On the H100 (bench/xent_sweep.py, 2026-12-06): one
/// block 2.3 µs against 5.9 µs at 4,096 rows, 4.4 against 5.9 at 16,384, 12.5 against 6.2 at
/// 65,536.
const XENT_ONE_BLOCK_ROWS: usize = 1 << 14;

/// The launch of the cross-entropy's backward where every block counts the rows itself
/// (batches up to [`XENT_ONE_BLOCK_ROWS`] rows): [`XENT_BWD_THREADS`] threads a block and
/// [`XENT_BWD_BLOCKS_PER_SM`] blocks a multiprocessor (one wave that fills every
/// multiprocessor: each block reads the labels once, so a bigger grid reads them more often),
/// striding over the grad's words. On the H100 (bench/row_tma.py kind xbwd, 2026-12-07) against
/// the count's launch and the grad's: bf16 4096 x 4096 26.5 us against 30.4, 16384 x 1024 28.2
/// against 29.9, 4096 x 32768 199.2 against 204.5; 256-thread blocks at 4 a multiprocessor ran
/// 28.8, 32.0 and 197.4.
const XENT_BWD_BLOCKS_PER_SM: usize = 4;

/// Threads a block of the counting backward (see [`XENT_BWD_BLOCKS_PER_SM`]).
const XENT_BWD_THREADS: u32 = 512;

/// `out[0]` = the mean of `row_loss` over the rows whose label is not ignored (0 when all are),
/// or with `row_loss` `None`, the count of those rows: in an order fixed by `rows` either way.
fn xent_mean(
    c: &CudaBackend,
    device: &Device,
    out: &Tensor,
    row_loss: Option<&Tensor>,
    labels: &Tensor,
    rows: usize,
) -> Result<()> {
    let n = KArg::U32(rows as u32);
    if rows <= XENT_ONE_BLOCK_ROWS {
        let loss_ptr = row_loss.map_or(Ok(0), |t| t.cuda_ptr())?;
        return c.launch(
            BuiltinKernel::XentMeanF32,
            LaunchDims { grid: (1, 1, 1), block: (1024, 1, 1), shared: 0 },
            &[KArg::Ptr(out.cuda_ptr()?), KArg::Ptr(loss_ptr), KArg::Ptr(labels.cuda_ptr()?), n],
        );
    }
    let Some(row_loss) = row_loss else {
        return cuda_reduce(
            c,
            device,
            BuiltinKernel::CountLabelsPartialF32,
            &[KArg::Ptr(labels.cuda_ptr()?)],
            rows as u32,
            out.cuda_ptr()?,
            1.0,
        );
    };
    // Partial sums of the row losses and partial counts of the labels, then one block divides.
    let blocks = reduce_blocks(rows);
    let partial = Tensor::empty(device, &[blocks as usize])?;
    let counts = Tensor::empty(device, &[blocks as usize])?;
    let grid = LaunchDims { grid: (blocks, 1, 1), block: (256, 1, 1), shared: 0 };
    c.launch(
        BuiltinKernel::SumPartialF32,
        grid,
        &[KArg::Ptr(partial.cuda_ptr()?), KArg::Ptr(row_loss.cuda_ptr()?), n],
    )?;
    c.launch(
        BuiltinKernel::CountLabelsPartialF32,
        grid,
        &[KArg::Ptr(counts.cuda_ptr()?), KArg::Ptr(labels.cuda_ptr()?), n],
    )?;
    c.launch(
        BuiltinKernel::MeanFinalF32,
        LaunchDims { grid: (1, 1, 1), block: (256, 1, 1), shared: 0 },
        &[KArg::Ptr(out.cuda_ptr()?), KArg::Ptr(partial.cuda_ptr()?), KArg::Ptr(counts.cuda_ptr()?), KArg::U32(blocks)],
    )
}

/// `GRAPHED_XENT_CLUSTER`, for measurements (read once a process): `0` sends rows past one
/// block's shared memory to the two-read kernel instead of a cluster of blocks; `n` (2 to 8)
/// splits them over `n` blocks (at least as many as hold the row, at most the device's cluster
/// limit). Unset: the cluster limit.
fn xent_cluster_setting() -> Option<usize> {
    static SET: std::sync::OnceLock<Option<usize>> = std::sync::OnceLock::new();
    *SET.get_or_init(|| std::env::var("GRAPHED_XENT_CLUSTER").ok().and_then(|v| v.parse().ok()))
}

/// Rows of at least this many bytes take the row in shared memory (`sx_smem_*`): on the H100
/// (bench/xent_sweep.py, 2026-12-06) it ran 4096 x 4096 at 1.01x of the bandwidth floor in f32
/// and 1.13x in bf16, where the register kernel took 1.11x and 1.39x.
const XENT_SMEM_MIN_BYTES: usize = 8 << 10;

/// The cross-entropy forward's row kernel, its launch for `[rows, classes]` logits, and the
/// blocks a row takes (a cluster of them past 1):
/// - rows of [`XENT_SMEM_MIN_BYTES`] and more: the row in shared memory (`sx_smem_*`, read
///   once from memory), a block a row of at least 128 threads, about 8 16-byte words a
///   thread; a row past one block's shared memory is split over a cluster of blocks
///   (`sx_cluster_*`, sm_90, up to [`CudaBackend::cluster_limit`] of them: about 465,000 f32
///   or 930,000 bf16 classes on an H100). The row keeps its alignment there, so `probs` must
///   lie at the same address mod 16 as `logits` (tensors of the pool do);
/// - narrower rows: held in registers (`sx_rows_*`, read once) where they fit, a block a row
///   group;
/// - the rest (rows past every cluster's shared memory, or misaligned `probs`): one block a
///   row, two reads (`softmax_xent_*`).
fn xent_launch(
    c: &CudaBackend,
    rows: usize,
    classes: usize,
    logits: &Tensor,
    probs: &Tensor,
) -> Result<(BuiltinKernel, LaunchDims, u32)> {
    let dtype = logits.dtype();
    let (elem, smem, cluster) = (dtype.size(), k::SX_SMEM.get(dtype), k::SX_CLUSTER.get(dtype));
    let (x, p) = (logits.cuda_ptr()?, probs.cuda_ptr()?);
    let w = 16 / elem;
    // Shared words a row takes: one more where a row may start inside a word.
    let words =
        if x.is_multiple_of(16) && classes.is_multiple_of(w) { classes / w } else { (classes + w - 1).div_ceil(w) };
    // The blocks a row takes: one where it fits, else a cluster (see below).
    let fits = words <= c.dynamic_shared_limit(smem) / 16;
    let most = if xent_cluster_setting() == Some(0) { 1 } else { c.cluster_limit(cluster) as usize };
    let parts = if fits {
        1
    } else {
        let least = words.div_ceil((c.dynamic_shared_limit(cluster) / 16).max(1));
        // The cluster's most blocks, not its fewest: smaller shares let more blocks share a
        // multiprocessor. bf16 1024 x 131072 (H100, op_bench, 2026-12-06): 1.50x of the floor on
        // 2 blocks a row, 1.43x on 4, 1.26x on 8; 1.56x read twice (GRAPHED_XENT_CLUSTER=0).
        least.max(xent_cluster_setting().unwrap_or(most).min(most))
    };
    if classes * elem >= XENT_SMEM_MIN_BYTES && parts <= most && x.abs_diff(p).is_multiple_of(16) {
        let per = words.div_ceil(parts);
        let threads = per.div_ceil(8).next_power_of_two().clamp(128, 1024) as u32;
        let grid = (rows.clamp(1, 1 << 20) * parts) as u32;
        let dims = LaunchDims { grid: (grid, 1, 1), block: (threads, 1, 1), shared: (per * 16) as u32 };
        return Ok((if parts == 1 { smem } else { cluster }, dims, parts as u32));
    }
    let (kernel, dims) = row_kernel(rows, classes, dtype, k::SX_ROWS, k::SOFTMAX_XENT);
    if kernel != k::SX_ROWS.get(dtype) {
        return Ok((kernel, dims, 1));
    }
    // The register kernel takes a block for every row group, not RowTiles' cap: held to 64
    // registers (four blocks an SM), it ran bf16 4096 x 4096 at 1.18x of the floor that way
    // against 1.31x capped, and 16384 x 1024 at 1.15x (H100, bench/xent_sweep.py, 2026-12-06).
    let groups = rows.div_ceil(dims.block.1 as usize).clamp(1, 1 << 20) as u32;
    Ok((kernel, LaunchDims { grid: (groups, 1, 1), ..dims }, 1))
}

/// Checks `logits` `[N, C]` against `labels` `[N]`; returns `(N, C)`.
/// `logits` (or `probs`) may be f32, bf16 or f16; `labels` are f32 class ids.
fn check_xent(op: &'static str, logits: &Tensor, labels: &Tensor) -> Result<(usize, usize)> {
    logits.check_fresh()?;
    check_f32_on(op, labels, logits)?;
    let &[rows, classes] = logits.dims() else {
        return Err(Error::shape(op, ShapeProblem::layout("logits", "[N, C]", logits.dims())));
    };
    if classes == 0 {
        return Err(Error::shape(op, ShapeProblem::layout("logits", "[N, C] with at least one class", logits.dims())));
    }
    if labels.dims() != [rows] {
        return Err(Error::shape(
            op,
            ShapeProblem::expected("labels", &[rows], "one per row of logits", labels.dims()),
        ));
    }
    n32(op, logits.numel())?;
    Ok((rows, classes))
}

/// Checks that every label is an integer class id in `0..classes`, reading the labels back to
/// the host: [`OpError::Label`] naming the first bad one.
///
/// This synchronizes with the device, so it is illegal during a capture
/// ([`Error::IllegalDuringCapture`]): call it on the data before copying it into a graph's
/// static input. The CUDA kernels never read out of bounds for a bad label — they produce NaN
/// for its row — while the host backend returns the typed error from the op itself.
///
/// ```
/// # use graphed::{ops, Device, Tensor};
/// let dev = Device::host();
/// let labels = Tensor::from_slice(&dev, &[0.0, 2.0], &[2])?;
/// assert!(ops::validate_labels(&labels, 3).is_ok());
/// assert!(ops::validate_labels(&labels, 2).is_err());
/// # Ok::<(), graphed::Error>(())
/// ```
pub fn validate_labels(labels: &Tensor, classes: usize) -> Result<()> {
    check_same("validate_labels", &[labels])?;
    for (r, l) in labels.to_vec()?.into_iter().enumerate() {
        if cpu::label_index(l, classes).is_none() && l != IGNORE_LABEL {
            return Err(OpError::Label { op: "validate_labels", label: l, row: r, classes }.into());
        }
    }
    Ok(())
}

/// The label of a row that [`softmax_cross_entropy`] ignores (PyTorch's default
/// `ignore_index`): the row adds nothing to the loss, is not counted in its mean, and gets a
/// zero grad. Padding up to a shape bucket uses it for the labels.
pub const IGNORE_LABEL: f32 = -100.0;

/// Softmax cross-entropy: `loss = mean_rows(logsumexp(logits) - logits[label])` as a `[1]`
/// tensor, and `probs = softmax(logits)` (`[N, C]`), which the backward takes.
///
/// `labels` is `[N]` holding integer class ids as f32. `logits` may be f32, bf16 or f16: the
/// math is f32, `probs` has the logits' dtype and the loss is f32. A label that is not an integer in
/// `0..C` is [`OpError::Label`] on the host backend (raised when the op runs: at
/// the call, or at the replay of a graph that captured it). On CUDA the kernel makes that
/// row's loss NaN instead of reading out of bounds; check labels with [`validate_labels`]
/// before they enter a graph. The mean is a deterministic reduction (no atomics).
///
/// ```
/// # use graphed::{ops, Device, Tensor};
/// let dev = Device::host();
/// let logits = Tensor::from_slice(&dev, &[0.0, 0.0, 5.0, 5.0], &[2, 2])?;
/// let labels = Tensor::from_slice(&dev, &[0.0, 1.0], &[2])?;
/// let (loss, probs) = ops::softmax_cross_entropy(&logits, &labels)?;
/// assert!((loss.to_vec()?[0] - std::f32::consts::LN_2).abs() < 1e-6);
/// assert_eq!(probs.to_vec()?, vec![0.5; 4]);
/// let bad = Tensor::from_slice(&dev, &[0.0, 2.0], &[2])?;
/// let e = ops::softmax_cross_entropy(&logits, &bad).unwrap_err();
/// assert!(matches!(e, graphed::Error::Op(graphed::OpError::Label { row: 1, classes: 2, .. })));
/// # Ok::<(), graphed::Error>(())
/// ```
pub fn softmax_cross_entropy(logits: &Tensor, labels: &Tensor) -> Result<(Tensor, Tensor)> {
    const OP: &str = "softmax_cross_entropy";
    let (rows, classes) = check_xent(OP, logits, labels)?;
    let loss = Tensor::empty(logits.device(), &[1])?;
    let probs = Tensor::empty_like(logits)?;
    match exec(logits.device()) {
        Exec::Host(h) => {
            let (xp, lp, lossp, pp) = (logits.host_ptr()?, labels.host_ptr()?, loss.host_ptr()?, probs.host_ptr()?);
            h.run(k::SOFTMAX_XENT.get(logits.dtype()), move || {
                let (l, p) = cpu::softmax_cross_entropy(&xp.read(), &lp.read(), classes)?;
                lossp.write(&[l]);
                pp.write(&p);
                Ok(())
            })?;
        }
        Exec::Cuda(c) => {
            let row_loss = Tensor::empty(logits.device(), &[rows])?;
            let (kernel, dims, cluster) = xent_launch(c, rows, classes, logits, &probs)?;
            c.launch_in_clusters(
                kernel,
                dims,
                &[
                    KArg::Ptr(probs.cuda_ptr()?),
                    KArg::Ptr(row_loss.cuda_ptr()?),
                    KArg::Ptr(logits.cuda_ptr()?),
                    KArg::Ptr(labels.cuda_ptr()?),
                    KArg::U32(rows as u32),
                    KArg::U32(classes as u32),
                ],
                cluster,
            )?;
            xent_mean(c, logits.device(), &loss, Some(&row_loss), labels, rows)?;
        }
    }
    Ok((loss, probs))
}

/// The backward of [`softmax_cross_entropy`]: `dlogits = (probs - onehot(labels)) ·
/// dloss_scale / N`, where `dloss_scale` is the grad of the (mean) loss, usually `1.0`.
/// Bad labels: the typed error on the host backend, NaN rows on CUDA, as in the forward.
///
/// ```
/// # use graphed::{ops, Device, Tensor};
/// let dev = Device::host();
/// let probs = Tensor::from_slice(&dev, &[0.5, 0.5], &[1, 2])?;
/// let labels = Tensor::from_slice(&dev, &[1.0], &[1])?;
/// let d = ops::softmax_cross_entropy_backward(&probs, &labels, 1.0)?;
/// assert_eq!(d.to_vec()?, vec![0.5, -0.5]);
/// # Ok::<(), graphed::Error>(())
/// ```
pub fn softmax_cross_entropy_backward(probs: &Tensor, labels: &Tensor, dloss_scale: f32) -> Result<Tensor> {
    const OP: &str = "softmax_cross_entropy_backward";
    let (rows, classes) = check_xent(OP, probs, labels)?;
    let d = Tensor::empty_like(probs)?;
    match exec(probs.device()) {
        Exec::Host(h) => {
            let (pp, lp, dp) = (probs.host_ptr()?, labels.host_ptr()?, d.host_ptr()?);
            h.run(k::SOFTMAX_XENT_BWD.get(probs.dtype()), move || {
                dp.write(&cpu::softmax_cross_entropy_backward(&pp.read(), &lp.read(), classes, dloss_scale)?);
                Ok(())
            })?;
        }
        Exec::Cuda(c) => {
            let (dp, pp, lp) = (KArg::Ptr(d.cuda_ptr()?), KArg::Ptr(probs.cuda_ptr()?), KArg::Ptr(labels.cuda_ptr()?));
            let (scale, r32, c32) = (KArg::F32(dloss_scale), KArg::U32(rows as u32), KArg::U32(classes as u32));
            if rows <= XENT_ONE_BLOCK_ROWS {
                // Every block counts the rows the mean divides by (one launch, the same bits).
                let words = (rows * classes).div_ceil(16 / probs.dtype().size());
                let blocks = words.div_ceil(XENT_BWD_THREADS as usize).clamp(1, XENT_BWD_BLOCKS_PER_SM * c.sm_count);
                let dims = LaunchDims { grid: (blocks as u32, 1, 1), block: (XENT_BWD_THREADS, 1, 1), shared: 0 };
                c.launch(k::SOFTMAX_XENT_BWD_COUNTED.get(probs.dtype()), dims, &[dp, pp, lp, scale, r32, c32])?;
            } else {
                // The rows the mean counts, on the device: the grad divides by them.
                let count = Tensor::empty(probs.device(), &[1])?;
                xent_mean(c, probs.device(), &count, None, labels, rows)?;
                let args = [dp, pp, lp, scale, KArg::Ptr(count.cuda_ptr()?), r32, c32];
                let dims = LaunchDims::vectorized(rows * classes, probs.dtype());
                c.launch(k::SOFTMAX_XENT_BWD.get(probs.dtype()), dims, &args)?;
            }
        }
    }
    Ok(d)
}

/// Mean squared error `mean((pred - target)²)` as a `[1]` tensor (same shapes; a
/// deterministic reduction on CUDA).
///
/// ```
/// # use graphed::{ops, Device, Tensor};
/// let dev = Device::host();
/// let p = Tensor::from_slice(&dev, &[1.0, 2.0], &[2])?;
/// let t = Tensor::from_slice(&dev, &[0.0, 0.0], &[2])?;
/// assert_eq!(ops::mse_loss(&p, &t)?.to_vec()?, vec![2.5]);
/// # Ok::<(), graphed::Error>(())
/// ```
pub fn mse_loss(pred: &Tensor, target: &Tensor) -> Result<Tensor> {
    const OP: &str = "mse_loss";
    let partial = k::SQDIFF_PARTIAL.get(check_like(OP, &[pred, target])?);
    check_shape(OP, pred, target)?;
    let n = n32(OP, pred.numel())?;
    let loss = Tensor::empty(pred.device(), &[1])?;
    match exec(pred.device()) {
        Exec::Host(h) => {
            let (pp, tp, lp) = (pred.host_ptr()?, target.host_ptr()?, loss.host_ptr()?);
            h.run("mse_f32", move || {
                lp.write(&[cpu::mse_loss(&pp.read(), &tp.read())]);
                Ok(())
            })?;
        }
        Exec::Cuda(c) => cuda_reduce(
            c,
            pred.device(),
            partial,
            &[KArg::Ptr(pred.cuda_ptr()?), KArg::Ptr(target.cuda_ptr()?)],
            n,
            loss.cuda_ptr()?,
            1.0 / n as f32,
        )?,
    }
    Ok(loss)
}

/// The backward of [`mse_loss`]: `dpred = 2·(pred - target)·dloss_scale / n`.
///
/// ```
/// # use graphed::{ops, Device, Tensor};
/// let dev = Device::host();
/// let p = Tensor::from_slice(&dev, &[1.0, 2.0], &[2])?;
/// let t = Tensor::from_slice(&dev, &[0.0, 0.0], &[2])?;
/// assert_eq!(ops::mse_backward(&p, &t, 1.0)?.to_vec()?, vec![1.0, 2.0]);
/// # Ok::<(), graphed::Error>(())
/// ```
pub fn mse_backward(pred: &Tensor, target: &Tensor, dloss_scale: f32) -> Result<Tensor> {
    const OP: &str = "mse_backward";
    let dtype = check_like(OP, &[pred, target])?;
    let kernel = k::MSE_BWD.get(dtype);
    check_shape(OP, pred, target)?;
    let n = n32(OP, pred.numel())?;
    let scale = cpu::mse_grad_scale(dloss_scale, n as usize);
    let d = Tensor::empty_like(pred)?;
    match exec(pred.device()) {
        Exec::Host(h) => {
            let (pp, tp, dp) = (pred.host_ptr()?, target.host_ptr()?, d.host_ptr()?);
            h.run(kernel, move || {
                dp.write(&cpu::mse_backward(&pp.read(), &tp.read(), dloss_scale));
                Ok(())
            })?;
        }
        Exec::Cuda(c) => c.launch(
            kernel,
            LaunchDims::vectorized(n as usize, dtype),
            &[
                KArg::Ptr(d.cuda_ptr()?),
                KArg::Ptr(pred.cuda_ptr()?),
                KArg::Ptr(target.cuda_ptr()?),
                KArg::F32(scale),
                KArg::U32(n),
            ],
        )?,
    }
    Ok(d)
}
