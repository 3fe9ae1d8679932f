//! Which implementation runs fused attention on CUDA: the portable kernels (`kernels/flash.cu`)
//! or cuDNN's fused attention (`backend/cudnn.rs`), chosen per call and pass.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;

use crate::backend::cudnn::{SdpaGrads, SdpaKey, SdpaPass, SdpaPointers};
use crate::backend::CudaBackend;
use crate::ops::cpu::AttnShape;
use crate::ops::{exec, Exec};
use crate::{AttentionLimit, DType, Device, Error, Result, Tensor};

use super::flash::Attention;

/// Which implementation runs [`flash_attention`](crate::ops::flash_attention) and its
/// backward on a CUDA device (the host backend always runs the CPU reference).
///
/// - `Portable`: graphed's own kernels (FlashAttention-2 on `mma.sync`, compiled by NVRTC):
///   every shape the op takes, on every GPU from sm_80 on.
/// - `Cudnn`: cuDNN's fused attention (libcudnn 9.10 or newer, loaded at run time), the kernels
///   PyTorch's cuDNN backend and Transformer Engine run on Hopper: 1.5x to 2.9x faster there.
///   Its backward is cuDNN's variant without atomics, so grads are the same bits run to run and
///   between eager runs and replays, as the portable kernels'; it keeps the bf16 `dP` of the
///   whole call in its workspace (`batch · heads · seq² · 2` bytes from the pool: 268 MB at 8
///   heads and seq 4096), where the portable kernels keep nothing of size `seq²`;
///   [`set_attention_workspace_limit`] bounds it. Equal numbers of query and key/value heads
///   only. Asking for it where it cannot run is [`Error::AttentionUnsupported`].
/// - `CudnnNondeterministic`: cuDNN with the backward PyTorch's cuDNN SDPA runs, which adds
///   `dQ` into a zeroed f32 accumulator with atomics (faster at long sequences, and no `dP`
///   workspace): its `dQ` differs in the last bits from run to run, so a replay no longer equals
///   its eager run bit for bit. Only where asked for; `Auto` never picks it. The forward is
///   `Cudnn`'s.
/// - `Auto` (the default): cuDNN where it runs the call, else the portable kernels, decided
///   for each pass on its own. `GRAPHED_ATTENTION=portable` (or `cudnn`,
///   `cudnn-nondeterministic`) in the environment makes `Auto` mean that engine, for every call
///   of the process.
///
/// Engines agree within the dtype's rounding, not bit for bit; a given shape always runs on
/// the same engine, so (but for `CudnnNondeterministic`) a replay equals its eager run.
///
/// ```
/// use graphed::ops::{Attention, AttentionEngine};
/// let at = Attention::causal(8).engine(AttentionEngine::Portable);
/// assert_eq!(at.engine, AttentionEngine::Portable);
/// assert_eq!(Attention::causal(8).engine, AttentionEngine::Auto);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum AttentionEngine {
    /// cuDNN where it runs the call, else the portable kernels.
    #[default]
    Auto,
    /// graphed's own kernels.
    Portable,
    /// cuDNN's fused attention.
    Cudnn,
    /// cuDNN's fused attention with its backward that adds `dQ` with atomics.
    CudnnNondeterministic,
}

impl AttentionEngine {
    /// `Auto` as `GRAPHED_ATTENTION` sets it (read once per process); other engines as they are.
    fn resolved(self) -> AttentionEngine {
        static FROM_ENV: OnceLock<AttentionEngine> = OnceLock::new();
        if self != AttentionEngine::Auto {
            return self;
        }
        *FROM_ENV.get_or_init(|| match std::env::var("GRAPHED_ATTENTION").as_deref() {
            Ok("portable") => AttentionEngine::Portable,
            Ok("cudnn") => AttentionEngine::Cudnn,
            Ok("cudnn-nondeterministic") => AttentionEngine::CudnnNondeterministic,
            _ => AttentionEngine::Auto,
        })
    }
}

/// The engines that run a call's forward and backward (see [`attention_engines`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttentionEngines {
    /// The forward's: `Portable` or `Cudnn`.
    pub forward: AttentionEngine,
    /// The backward's: `Portable`, `Cudnn` or `CudnnNondeterministic`.
    pub backward: AttentionEngine,
}

/// Which engine would run [`flash_attention`](crate::ops::flash_attention) and its backward
/// for queries shaped and typed as `q` (`[batch, seq, heads · head_dim]`) on `q`'s device:
/// never `Auto`. On the host backend both are `Portable` (the CPU reference runs). Builds
/// cuDNN's plans for the shape if they were not built yet, as the first call would.
///
/// ```
/// use graphed::ops::{self, Attention, AttentionEngine};
/// use graphed::{DType, Device, Tensor};
/// let q = Tensor::zeros_as(&Device::host(), &[1, 16, 128], DType::BF16)?;
/// let e = ops::attention_engines(&q, &Attention::causal(2))?;
/// assert_eq!((e.forward, e.backward), (AttentionEngine::Portable, AttentionEngine::Portable));
/// # Ok::<(), graphed::Error>(())
/// ```
pub fn attention_engines(q: &Tensor, at: &Attention) -> Result<AttentionEngines> {
    let (a, dtype) = super::flash::check_qkv("attention_engines", q, q, q, &Attention { kv_heads: at.heads, ..*at })?;
    let a = AttnShape { kv_heads: at.kv_heads, ..a };
    let pick = |pass| -> Result<AttentionEngine> {
        Ok(match exec(q.device()) {
            Exec::Host(_) => AttentionEngine::Portable,
            Exec::Cuda(c) => match cudnn_plan("attention_engines", c, at, a, dtype, pass, false)? {
                Some((key, _)) if !key.deterministic => AttentionEngine::CudnnNondeterministic,
                Some(_) => AttentionEngine::Cudnn,
                None => AttentionEngine::Portable,
            },
        })
    };
    Ok(AttentionEngines { forward: pick(SdpaPass::Forward)?, backward: pick(SdpaPass::Backward)? })
}

/// cuDNN's plan key and workspace bytes when cuDNN runs this pass, `None` when the portable
/// kernels do; `Cudnn` asked for where it cannot run is [`Error::AttentionUnsupported`].
fn cudnn_plan(
    op: &'static str,
    c: &CudaBackend,
    at: &Attention,
    a: AttnShape,
    dtype: DType,
    pass: SdpaPass,
    packed: bool,
) -> Result<Option<(SdpaKey, usize)>> {
    let engine = at.engine.resolved();
    if engine == AttentionEngine::Portable {
        return Ok(None);
    }
    let d = a.dims;
    let deterministic = !(engine == AttentionEngine::CudnnNondeterministic && pass == SdpaPass::Backward);
    let key = SdpaKey {
        pass,
        dtype,
        batch: d.batch,
        seq: d.seq,
        heads: d.heads,
        head_dim: d.head_dim,
        causal: a.causal,
        deterministic,
        packed,
    };
    let plan = if a.kv_heads == d.heads { c.cudnn_sdpa_workspace(key)?.map(|w| (key, w)) } else { None };
    if plan.is_none() && engine != AttentionEngine::Auto {
        let limit = Some(AttentionLimit::Cudnn);
        return Err(Error::AttentionUnsupported { op, dtype, head_dim: d.head_dim, limit });
    }
    Ok(plan)
}

/// The default of [`attention_workspace_limit`]: none (cuDNN's own default since 9.0).
const DEFAULT_WORKSPACE_LIMIT: usize = usize::MAX;

fn limit_cell() -> &'static AtomicUsize {
    static LIMIT: OnceLock<AtomicUsize> = OnceLock::new();
    LIMIT.get_or_init(|| {
        let from_env = std::env::var("GRAPHED_ATTENTION_WORKSPACE_MB").ok().and_then(|v| v.parse::<usize>().ok());
        AtomicUsize::new(from_env.map_or(DEFAULT_WORKSPACE_LIMIT, |mb| mb.saturating_mul(1 << 20)))
    })
}

/// The most workspace, in bytes, that one call of cuDNN's deterministic attention backward
/// ([`AttentionEngine::Cudnn`], `Auto`'s pick on CUDA) takes from the pool, or `usize::MAX`
/// (the default: no limit). Its workspace holds the bf16 `dP` of every (batch, head) of the
/// call, `batch · heads · seq² · 2` bytes (268 MB at 8 heads and seq 4096; 8.6 GB at batch 8,
/// 32 heads and seq 4096); a call that would need more runs in chunks of whole sequences (the
/// most that fit, at least one), one after another on the stream, with one workspace.
/// Chunking changes no bits (each sequence is computed the same way in any chunk), but a chunk
/// of few sequences leaves multiprocessors idle: a low limit trades speed for memory. A
/// sequence is not split: chunks of its heads, read in place with the row stride of all the
/// heads, gave wrong grads on cuDNN 9 on the H200 (2026-12-05), so one sequence's workspace is
/// the least a call takes.
/// `GRAPHED_ATTENTION_WORKSPACE_MB` (a whole number of MiB, read at the first call; any other
/// value is ignored) sets it for the process, as [`set_attention_workspace_limit`] does. The limit is read when a call is made (or
/// captured): a graph keeps the chunks it was captured with.
///
/// ```
/// use graphed::ops;
/// let before = ops::attention_workspace_limit();
/// ops::set_attention_workspace_limit(256 << 20);
/// assert_eq!(ops::attention_workspace_limit(), 256 << 20);
/// ops::set_attention_workspace_limit(before);
/// ```
pub fn attention_workspace_limit() -> usize {
    limit_cell().load(Ordering::Relaxed)
}

/// Sets [`attention_workspace_limit`] for the process, in bytes.
pub fn set_attention_workspace_limit(bytes: usize) {
    limit_cell().store(bytes, Ordering::Relaxed);
}

/// The deterministic backward's plan for `key` as it runs under the workspace limit: `key`
/// itself when its `bytes` fit (or it is one sequence), else the key of a chunk of the most
/// sequences whose share of the workspace fits ([`chunk_sequences`]), and that chunk's
/// workspace. When cuDNN has no plan for the chunk the call runs whole.
fn chunked(c: &CudaBackend, key: SdpaKey, bytes: usize) -> Result<(SdpaKey, usize)> {
    let batch = chunk_sequences(key.batch, bytes, attention_workspace_limit());
    if batch == key.batch {
        return Ok((key, bytes));
    }
    let chunk = SdpaKey { batch, ..key };
    Ok(c.cudnn_sdpa_workspace(chunk)?.map_or((key, bytes), |w| (chunk, w)))
}

/// The sequences of a chunk of a call of `batch` sequences whose workspace is `bytes`, under
/// `limit`: all of them when they fit, else the most whose share fits (a divisor of `batch`, at
/// least one).
fn chunk_sequences(batch: usize, bytes: usize, limit: usize) -> usize {
    if bytes <= limit || batch <= 1 {
        return batch;
    }
    let per_sequence = bytes.div_ceil(batch);
    (1..=batch).rev().find(|&b| batch.is_multiple_of(b) && b * per_sequence <= limit).unwrap_or(1)
}

/// cuDNN's scratch for one call: `bytes` from the pool, as f32 words.
fn workspace(dev: &Device, bytes: usize) -> Result<Tensor> {
    Tensor::empty(dev, &[bytes.div_ceil(4).max(1)])
}

/// The forward through cuDNN from the device addresses of q, k, v (`packed`: column blocks of
/// one tensor) into out and lse (`io`); `false` when the portable kernels run it.
#[allow(clippy::too_many_arguments)]
pub(super) fn forward(
    c: &CudaBackend,
    at: &Attention,
    a: AttnShape,
    dtype: DType,
    packed: bool,
    [q, k, v]: [u64; 3],
    [o, stats]: [u64; 2],
    dev: &Device,
) -> Result<bool> {
    let Some((key, bytes)) = cudnn_plan("flash_attention", c, at, a, dtype, SdpaPass::Forward, packed)? else {
        return Ok(false);
    };
    let work = workspace(dev, bytes)?;
    let ptrs = SdpaPointers { q, k, v, o, stats, grads: None };
    // SAFETY: q, k and v address `[batch, seq, heads · head_dim]` blocks of `dtype` with the
    // key's row stride (checked by the op), out `[batch, seq, heads · head_dim]` and lse f32
    // `[batch, heads, seq]` (made by the op), the workspace holds `bytes`.
    unsafe { c.cudnn_sdpa(key, &ptrs, work.cuda_ptr()?)? };
    Ok(true)
}

/// The backward through cuDNN from the addresses of q, k, v (`ins`, packed or not), dO, out
/// and lse (`saved`) into dq, dk, dv (`grads`, laid out as the inputs); `false` when the
/// portable kernels run it.
#[allow(clippy::too_many_arguments)]
pub(super) fn backward(
    c: &CudaBackend,
    at: &Attention,
    a: AttnShape,
    dtype: DType,
    packed: bool,
    [q, k, v]: [u64; 3],
    [dout, o, stats]: [u64; 3],
    [dq, dk, dv]: [u64; 3],
    dev: &Device,
) -> Result<bool> {
    let Some((key, bytes)) = cudnn_plan("flash_attention_backward", c, at, a, dtype, SdpaPass::Backward, packed)?
    else {
        return Ok(false);
    };
    let (key, bytes) = if key.deterministic { chunked(c, key, bytes)? } else { (key, bytes) };
    let d = a.dims;
    let dsum = Tensor::empty(dev, &[d.batch, d.heads, d.seq])?;
    let work = workspace(dev, bytes)?;
    // The atomics' f32 accumulator, zeroed (`[batch, heads, seq, head_dim]`).
    let accum =
        if key.deterministic { None } else { Some(Tensor::zeros(dev, &[d.batch, d.heads, d.seq, d.head_dim])?) };
    let grads = SdpaGrads {
        dout,
        dq,
        dk,
        dv,
        dsum: dsum.cuda_ptr()?,
        dq_accum: accum.as_ref().map(Tensor::cuda_ptr).transpose()?,
    };
    let whole = SdpaPointers { q, k, v, o, stats, grads: Some(grads) };
    // One chunk of `key.batch` sequences at a time (the whole call when unchunked): byte
    // offsets into q, k, v and their grads (rows `qkv_row` bytes apart), into out and dO
    // (`[batch, seq, heads · d]`) and into the f32 `[batch, heads, seq]` statistics.
    let row = (d.heads * d.head_dim * dtype.size()) as u64;
    let qkv_row = if packed { 3 * row } else { row };
    let seq = d.seq as u64;
    let stats_row = (d.heads * d.seq * 4) as u64;
    for b0 in (0..d.batch as u64).step_by(key.batch) {
        let ptrs = whole.offset(b0 * seq * qkv_row, b0 * seq * row, b0 * stats_row);
        // SAFETY: every address was checked by the op (or made here) against the call's shape,
        // layout and dtype; the chunk's sequences lie inside them (its batch divides the
        // call's); dsum is f32 `[batch, heads, seq]`, the accumulator (unchunked) f32
        // `[batch, heads, seq, d]`; the workspace holds `bytes`, and the chunks run one after
        // another on the stream.
        unsafe { c.cudnn_sdpa(key, &ptrs, work.cuda_ptr()?)? };
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::chunk_sequences;

    #[test]
    fn chunks_take_the_most_whole_sequences_that_fit() {
        // 4 sequences of 200 bytes each.
        assert_eq!(chunk_sequences(4, 800, 800), 4);
        assert_eq!(chunk_sequences(4, 800, 500), 2);
        assert_eq!(chunk_sequences(4, 800, 300), 1);
        assert_eq!(chunk_sequences(4, 800, 1), 1);
        // Divisors only: 3 sequences under room for 2 run one at a time.
        assert_eq!(chunk_sequences(3, 300, 250), 1);
        assert_eq!(chunk_sequences(6, 600, 350), 3);
        // One sequence is never split.
        assert_eq!(chunk_sequences(1, 10_000, 1), 1);
    }
}
