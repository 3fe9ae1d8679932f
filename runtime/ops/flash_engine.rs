//! Which implementation runs fused attention on CUDA: the portable kernels (`kernels/flash.cu`)
//! or cuDNN's fused attention (`backend/cudnn.rs`), chosen per call and pass.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;

use crate::backend::cuda_hopper::{HopperBwd, HOPPER_HEAD_DIM, HOPPER_TILE};
use crate::backend::cudnn::{SdpaGrads, SdpaKey, SdpaPass, SdpaPointers};
use crate::backend::CudaBackend;
use crate::ops::cpu::AttnShape;
use crate::ops::{exec, Exec};
use crate::{AttentionLimit, DType, Device, Error, Result, Tensor};

use super::columns::copy_block;
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
/// - `Hopper`: the backward on graphed's own Hopper kernel (`kernels/flash_hopper.cu`: `wgmma`,
///   one pass over the query tiles per key tile, five products instead of the portable
///   kernels' seven, each query tile's `dQ` added into an f32 accumulator in a fixed order of
///   key tiles, so grads are the same bits run to run); nothing of size `seq²`, an f32 `dQ`
///   sum of `batch · heads · ⌈seq / 128⌉ · chains · 128 · 64 · 4` bytes instead (two chains
///   where the call's work fits in two waves of the GPU, else one). sm_90 GPUs (H100, H200),
///   head dim 64, bf16 or f16; elsewhere asking for it is [`Error::AttentionUnsupported`]. The
///   forward runs as under `Auto`. `Auto` picks it for the backward where it is as fast as
///   cuDNN's and far lighter (see `Auto`).
/// - `CudnnNondeterministic`: cuDNN with the backward PyTorch's cuDNN SDPA runs, which adds
///   `dQ` into a zeroed f32 accumulator with atomics (faster at long sequences, and no `dP`
///   workspace): its `dQ` differs in the last bits from run to run, so a replay no longer equals
///   its eager run bit for bit. Only where asked for; `Auto` never picks it. The forward is
///   `Cudnn`'s.
/// - `Auto` (the default): cuDNN where it runs the call, else the portable kernels, decided
///   for each pass on its own; but the backward of a causal call at head dim 64 on sm_90 with a
///   sequence of at least [`HOPPER_AUTO_MIN_SEQ`] and at most two waves of the Hopper kernel's
///   work items (key tiles of 128 · kv heads · batch ≤ 2 · multiprocessors) runs on `Hopper`:
///   measured on an H100 in the GPT (8 heads), the step 1.048x as fast as on cuDNN's backward
///   at 1024 x 4 and 1.153x at 4096 x 1, its pool 0.90x and 0.69x (cuDNN's `dP` is 268 MB at
///   4096); at 256 x 16 the step ran 0.98x, and beyond two waves it was not measured against
///   cuDNN's deterministic backward in the runtime. `GRAPHED_ATTENTION=portable` (or `cudnn`, `hopper`,
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
    /// The forward as `Auto` runs it, the backward on graphed's own Hopper kernel.
    Hopper,
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
            Ok("hopper") => AttentionEngine::Hopper,
            _ => AttentionEngine::Auto,
        })
    }
}

/// The engines that run a call's forward and backward (see [`attention_engines`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttentionEngines {
    /// The forward's: `Portable` or `Cudnn`.
    pub forward: AttentionEngine,
    /// The backward's: `Portable`, `Cudnn`, `CudnnNondeterministic` or `Hopper`.
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
            Exec::Cuda(c) => {
                let call = PassCall { op: "attention_engines", at, a, dtype, pass, packed: false };
                if hopper_kernels(c, call)?.is_some() {
                    return Ok(AttentionEngine::Hopper);
                }
                match cudnn_plan(c, call)? {
                    Some((key, _)) if !key.deterministic => AttentionEngine::CudnnNondeterministic,
                    Some(_) => AttentionEngine::Cudnn,
                    None => AttentionEngine::Portable,
                }
            }
        })
    };
    Ok(AttentionEngines { forward: pick(SdpaPass::Forward)?, backward: pick(SdpaPass::Backward)? })
}

/// cuDNN's plan key and workspace bytes for one pass of a call (see [`cudnn_plan`]).
pub(super) type CudnnPlan = (SdpaKey, usize);

/// One pass of a fused-attention call, as an engine is chosen for it: the op's name (for
/// errors), the call's options, shape and dtype, the pass, and whether q, k and v are packed.
#[derive(Clone, Copy)]
pub(super) struct PassCall<'a> {
    pub(super) op: &'static str,
    pub(super) at: &'a Attention,
    pub(super) a: AttnShape,
    pub(super) dtype: DType,
    pub(super) pass: SdpaPass,
    pub(super) packed: bool,
}

/// cuDNN's plan key and workspace bytes when cuDNN runs this pass, `None` when the portable
/// kernels do; `Cudnn` asked for where it cannot run is [`Error::AttentionUnsupported`]. The op
/// asks before it allocates anything, so that a refusal leaves the pool as it was.
pub(super) fn cudnn_plan(c: &CudaBackend, call: PassCall<'_>) -> Result<Option<CudnnPlan>> {
    let PassCall { op, at, a, dtype, pass, packed } = call;
    let engine = match at.engine.resolved() {
        // Its forward is Auto's; its backward never cuDNN's (`hopper_kernels` runs it).
        AttentionEngine::Hopper if pass == SdpaPass::Forward => AttentionEngine::Auto,
        AttentionEngine::Hopper => return Ok(None),
        engine => engine,
    };
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

/// The shortest sequence whose causal backward `Auto` runs on `Hopper` (where the shape's work
/// items also fit in two waves of the GPU's multiprocessors; see [`AttentionEngine`]).
///
/// ```
/// assert_eq!(graphed::ops::HOPPER_AUTO_MIN_SEQ, 1024);
/// ```
pub const HOPPER_AUTO_MIN_SEQ: usize = 1024;

/// Whether `Auto` runs this backward on the Hopper kernel: causal, head dim 64, a sequence of
/// at least [`HOPPER_AUTO_MIN_SEQ`], and key tiles · kv heads · batch at most two waves of
/// `sms` multiprocessors (the shapes where it measured as fast as cuDNN's backward).
fn hopper_auto(a: AttnShape, sms: usize) -> bool {
    let d = a.dims;
    let items = d.seq.div_ceil(HOPPER_TILE) * a.kv_heads * d.batch;
    a.causal && d.head_dim == HOPPER_HEAD_DIM && d.seq >= HOPPER_AUTO_MIN_SEQ && items <= 2 * sms
}

/// The Hopper backward's kernels when they run this pass (`Hopper` asked for, or `Auto` at a
/// shape [`hopper_auto`] takes; the backward, head dim 64, a GPU they run on), `None`
/// otherwise; `Hopper` asked for where its backward cannot run is
/// [`Error::AttentionUnsupported`]. Asked before the op allocates anything.
pub(super) fn hopper_kernels(c: &CudaBackend, call: PassCall<'_>) -> Result<Option<HopperBwd>> {
    let PassCall { op, at, a, dtype, pass, .. } = call;
    if pass != SdpaPass::Backward {
        return Ok(None);
    }
    match at.engine.resolved() {
        AttentionEngine::Hopper => {}
        AttentionEngine::Auto if hopper_auto(a, c.sm_count) => return c.hopper_bwd(),
        _ => return Ok(None),
    }
    let kernels = if a.dims.head_dim == HOPPER_HEAD_DIM { c.hopper_bwd()? } else { None };
    match kernels {
        Some(k) => Ok(Some(k)),
        None => {
            let limit = Some(AttentionLimit::Hopper { capability: (c.capability.0 as u32, c.capability.1 as u32) });
            Err(Error::AttentionUnsupported { op, dtype, head_dim: a.dims.head_dim, limit })
        }
    }
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
///
/// Where one sequence's share is still too much, each sequence runs in chunks of its heads (the
/// most that fit, at least one): the chunk's q, k, v, out and dO columns are copied into packed
/// tensors, cuDNN runs on those, and the chunk's grads are copied back (eight copies of
/// `seq · chunk width` elements a chunk: a few µs a layer at seq 4096). Heads are copied, never
/// read in place: cuDNN 9 plans that read a head chunk with the row stride of all the heads gave
/// wrong grads on the H200 (2026-12-05).
///
/// Chunking changes no bits: each sequence and head is computed the same way in any chunk
/// (`tests/ops_flash.rs` checks it on CUDA, the H100 included). A small chunk leaves
/// multiprocessors idle, so a low limit trades speed for memory, and chunks of heads trade a
/// lot: cuDNN's deterministic backward takes about as long for two heads of a sequence as for
/// eight, so at seq 4096 a 64 MiB limit (four chunks of two heads) made the GPT's step 2.5x
/// slower (H100, 2026-12-05: 331k against 816k tokens/s, the pool 627 against 862 MB). A
/// last resort for memory, not a default.
/// `GRAPHED_ATTENTION_WORKSPACE_MB` (a whole number of MiB, read at the first call; any other
/// value is ignored) sets it for the process, as [`set_attention_workspace_limit`] does. The
/// limit is read when a call is made (or captured): a graph keeps the chunks it was captured
/// with.
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

/// How the deterministic backward runs under the workspace limit.
enum Chunks {
    /// cuDNN's plan `key` over chunks of `key.batch` whole sequences (the whole call when it
    /// is the call's batch), in place.
    Sequences(SdpaKey, usize),
    /// One sequence at a time in chunks of `key.heads` heads, each copied into packed
    /// tensors (`key` is such a chunk's plan: one sequence, unpacked).
    Heads(SdpaKey, usize),
}

/// The deterministic backward's plan for `key` under the workspace limit: `key` itself when its
/// `bytes` fit, else chunks of the most sequences whose share of the workspace fits
/// ([`chunk_of`]), and where one sequence's share is still too much, chunks of the most of its
/// heads that fit. When cuDNN has no plan for a chunk the call runs in the larger chunks.
fn chunked(c: &CudaBackend, key: SdpaKey, bytes: usize) -> Result<Chunks> {
    let limit = attention_workspace_limit();
    let batch = chunk_of(key.batch, bytes, limit);
    let (key, bytes) = if batch == key.batch {
        (key, bytes)
    } else {
        let chunk = SdpaKey { batch, ..key };
        c.cudnn_sdpa_workspace(chunk)?.map_or((key, bytes), |w| (chunk, w))
    };
    if key.batch > 1 || bytes <= limit {
        return Ok(Chunks::Sequences(key, bytes));
    }
    let heads = chunk_of(key.heads, bytes, limit);
    if heads == key.heads {
        return Ok(Chunks::Sequences(key, bytes));
    }
    let chunk = SdpaKey { heads, packed: false, ..key };
    Ok(c.cudnn_sdpa_workspace(chunk)?.map_or(Chunks::Sequences(key, bytes), |w| Chunks::Heads(chunk, w)))
}

/// How many of `count` equal parts (sequences, or one sequence's heads) of a call whose
/// workspace is `bytes` one chunk takes under `limit`: all of them when they fit, else the most
/// whose share fits (a divisor of `count`, at least one).
fn chunk_of(count: usize, bytes: usize, limit: usize) -> usize {
    if bytes <= limit || count <= 1 {
        return count;
    }
    let per_part = bytes.div_ceil(count);
    (1..=count).rev().find(|&b| count.is_multiple_of(b) && b * per_part <= limit).unwrap_or(1)
}

/// cuDNN's scratch for one call: `bytes` from the pool, as f32 words.
fn workspace(dev: &Device, bytes: usize) -> Result<Tensor> {
    Tensor::empty(dev, &[bytes.div_ceil(4).max(1)])
}

/// The forward through cuDNN's `plan` from the device addresses of q, k, v (column blocks of
/// one tensor where the plan is packed) into out and lse (`io`).
pub(super) fn forward(
    c: &CudaBackend,
    (key, bytes): CudnnPlan,
    [q, k, v]: [u64; 3],
    [o, stats]: [u64; 2],
    dev: &Device,
) -> Result<()> {
    let work = workspace(dev, bytes)?;
    let ptrs = SdpaPointers { q, k, v, o, stats, grads: None };
    // SAFETY: q, k and v address `[batch, seq, heads · head_dim]` blocks of `dtype` with the
    // key's row stride (checked by the op), out `[batch, seq, heads · head_dim]` and lse f32
    // `[batch, heads, seq]` (made by the op), the workspace holds `bytes`.
    unsafe { c.cudnn_sdpa(key, &ptrs, work.cuda_ptr()?)? };
    Ok(())
}

/// The backward through cuDNN's `plan` from the addresses of q, k, v (`ins`, packed where the
/// plan is), dO, out and lse (`saved`) into dq, dk, dv (`grads`, laid out as the inputs).
pub(super) fn backward(
    c: &CudaBackend,
    (key, bytes): CudnnPlan,
    a: AttnShape,
    [q, k, v]: [u64; 3],
    [dout, o, stats]: [u64; 3],
    [dq, dk, dv]: [u64; 3],
    dev: &Device,
) -> Result<()> {
    let (dtype, packed) = (key.dtype, key.packed);
    let (key, bytes) = match key.deterministic {
        false => (key, bytes),
        true => match chunked(c, key, bytes)? {
            Chunks::Sequences(key, bytes) => (key, bytes),
            Chunks::Heads(chunk, bytes) => {
                let call = HeadChunks { a, dtype, packed, chunk, bytes };
                return call.run(c, [q, k, v], [dout, o, stats], [dq, dk, dv], dev);
            }
        },
    };
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
    Ok(())
}

/// The deterministic backward of a call one sequence and one chunk of heads at a time
/// ([`Chunks::Heads`]): `chunk` is cuDNN's plan for one such chunk (packed tensors, one
/// sequence), `bytes` its workspace.
struct HeadChunks {
    a: AttnShape,
    dtype: DType,
    packed: bool,
    chunk: SdpaKey,
    bytes: usize,
}

impl HeadChunks {
    /// Copies each chunk's q, k, v, out and dO columns into packed tensors, runs cuDNN on them
    /// and copies the chunk's dq, dk and dv back into the call's grads. The statistics of a
    /// (sequence, chunk) are contiguous in the call's (`[batch, heads, seq]`) and read in place.
    fn run(
        &self,
        c: &CudaBackend,
        [q, k, v]: [u64; 3],
        [dout, o, stats]: [u64; 3],
        [dq, dk, dv]: [u64; 3],
        dev: &Device,
    ) -> Result<()> {
        let d = self.a.dims;
        let size = self.dtype.size();
        // Elements a row: the call's q/k/v (three column blocks when packed), its out and dO,
        // and a chunk's packed tensors.
        let width = d.heads * d.head_dim;
        let qkv_ld = if self.packed { 3 * width } else { width };
        let cw = self.chunk.heads * d.head_dim;
        // The chunk's packed q, k, v, out, dO, dq, dk, dv, and its `rowsum` scratch.
        let packed = || Tensor::empty_as(dev, &[d.seq, cw], self.dtype);
        let tensors = (0..8).map(|_| packed()).collect::<Result<Vec<_>>>()?;
        let dsum = Tensor::empty(dev, &[self.chunk.heads, d.seq])?;
        let work = workspace(dev, self.bytes)?;
        let mut ptrs = [0u64; 8];
        for (p, t) in ptrs.iter_mut().zip(&tensors) {
            *p = t.cuda_ptr()?;
        }
        let [cq, ck, cv, co, cdo, cdq, cdk, cdv] = ptrs;
        let (dsum, work) = (dsum.cuda_ptr()?, work.cuda_ptr()?);
        let copy = |dst, src, [dld, sld]: [usize; 2]| copy_block(c, self.dtype, [dst, src], d.seq, cw, [dld, sld]);
        for b in 0..d.batch {
            for h0 in (0..d.heads).step_by(self.chunk.heads) {
                // Byte offsets of the chunk's first column in its sequence's first row (in
                // q/k/v and their grads, and in out and dO), and of its statistics.
                let col = (h0 * d.head_dim * size) as u64;
                let qkv_at = (b * d.seq * qkv_ld * size) as u64 + col;
                let at = (b * d.seq * width * size) as u64 + col;
                let row = ((b * d.heads + h0) * d.seq * 4) as u64;
                for (dst, src) in [(cq, q), (ck, k), (cv, v)] {
                    copy(dst, src + qkv_at, [cw, qkv_ld])?;
                }
                copy(co, o + at, [cw, width])?;
                copy(cdo, dout + at, [cw, width])?;
                let grads = SdpaGrads { dout: cdo, dq: cdq, dk: cdk, dv: cdv, dsum, dq_accum: None };
                let chunk = SdpaPointers { q: cq, k: ck, v: cv, o: co, stats: stats + row, grads: Some(grads) };
                // SAFETY: the packed tensors hold one sequence of the chunk's heads in the
                // chunk key's layout (`[1, seq, heads · head_dim]`, unpacked), the scratch its
                // `[heads, seq]` f32; the statistics at `row` are the chunk's `[heads, seq]` f32
                // rows inside the call's (checked by the op); the workspace holds `bytes`; the
                // copies and chunks run in order on the stream.
                unsafe { c.cudnn_sdpa(self.chunk, &chunk, work)? };
                for (dst, src) in [(dq, cdq), (dk, cdk), (dv, cdv)] {
                    copy(dst + qkv_at, src, [qkv_ld, cw])?;
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::{chunk_of, hopper_auto};
    use crate::ops::cpu::{AttnDims, AttnShape};

    #[test]
    fn auto_takes_the_hopper_backward_only_where_it_was_measured_to_win() {
        let shape = |batch, seq, heads, head_dim, causal| AttnShape {
            dims: AttnDims { batch, seq, heads, head_dim },
            kv_heads: heads,
            causal,
        };
        // The GPT at 4096 x 1 on 132 multiprocessors: 32 key tiles x 8 heads = 256 items; at
        // 1024 x 4, 8 key tiles x 8 heads x 4 = 256.
        assert!(hopper_auto(shape(1, 4096, 8, 64, true), 132));
        assert!(hopper_auto(shape(4, 1024, 8, 64, true), 132));
        // Shorter sequences (the GPT's 256 x 16 ran 0.98x cuDNN's step on it), non-causal
        // calls, head dim 128 and more than two waves stay cuDNN's.
        assert!(!hopper_auto(shape(16, 256, 8, 64, true), 132));
        assert!(!hopper_auto(shape(16, 512, 8, 64, true), 132));
        assert!(!hopper_auto(shape(1, 4096, 8, 64, false), 132));
        assert!(!hopper_auto(shape(1, 4096, 8, 128, true), 132));
        assert!(!hopper_auto(shape(4, 4096, 16, 64, true), 132));
    }

    #[test]
    fn chunks_take_the_most_whole_parts_that_fit() {
        // 4 sequences of 200 bytes each.
        assert_eq!(chunk_of(4, 800, 800), 4);
        assert_eq!(chunk_of(4, 800, 500), 2);
        assert_eq!(chunk_of(4, 800, 300), 1);
        assert_eq!(chunk_of(4, 800, 1), 1);
        // Divisors only: 3 sequences under room for 2 run one at a time.
        assert_eq!(chunk_of(3, 300, 250), 1);
        assert_eq!(chunk_of(6, 600, 350), 3);
        // One part is never split.
        assert_eq!(chunk_of(1, 10_000, 1), 1);
    }
}
