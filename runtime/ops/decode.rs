//! Decoding with a KV cache (`kernels/decode.cu`): attention of one new query token per
//! sequence against the cache, and appending a step's keys and values to it. The lengths live
//! in an `I32` tensor on the device and are read there only, so one captured graph serves
//! every length.

use crate::backend::{BuiltinKernel as B, CudaBackend, KArg, LaunchDims};
use crate::ops::cpu::{self, CacheShape};
use crate::ops::{at_most, check_like, exec, n32, Exec};
use crate::{DType, Error, Result, ShapeProblem, Tensor};

/// Keys per block of the decode kernels' first pass, and how many blocks split one sequence's
/// cache: at least 256 keys a block and at most 64 blocks. A function of `max_len` only, so
/// the launch shape (and the summation order) is the same for every length.
pub(crate) fn decode_splits(max_len: usize) -> (usize, usize) {
    let split_len = max_len.div_ceil(64).div_ceil(64).max(4) * 64;
    (split_len, max_len.div_ceil(split_len).max(1))
}

/// The error a CPU reference's first bad sequence (and its length) makes for `op`, if any.
fn reported(op: &'static str, bad: Option<(usize, i32)>, max_len: usize) -> Result<()> {
    bad.map_or(Ok(()), |(b, len)| Err(Error::cache_length(op, b, len, max_len)))
}

/// Checks that `lengths` is the `I32` vector `[batch]` on `like`'s device.
fn check_lengths(op: &'static str, lengths: &Tensor, like: &Tensor, batch: usize) -> Result<()> {
    if lengths.dtype() != DType::I32 {
        return Err(Error::DType { op, got: lengths.dtype(), expected: DType::I32 });
    }
    if lengths.device() != like.device() {
        return Err(Error::DeviceMismatch { op, a: like.device().name(), b: lengths.device().name() });
    }
    if lengths.dims() != [batch] {
        return Err(Error::shape(op, ShapeProblem::expected("lengths", &[batch], "one per sequence", lengths.dims())));
    }
    Ok(())
}

/// The caches' dimensions `[batch, kv_heads, max_len, head_dim]`, the same for both.
fn cache_dims(op: &'static str, k_cache: &Tensor, v_cache: &Tensor) -> Result<[usize; 4]> {
    let &[batch, kv_heads, max_len, head_dim] = k_cache.dims() else {
        let layout = "[batch, kv_heads, max_len, head_dim]";
        return Err(Error::shape(op, ShapeProblem::layout("the caches", layout, k_cache.dims())));
    };
    if v_cache.dims() != k_cache.dims() {
        return Err(Error::shape(op, ShapeProblem::same("v_cache", v_cache.dims(), "k_cache", k_cache.dims())));
    }
    Ok([batch, kv_heads, max_len, head_dim])
}

/// Checks the caches (`[batch, kv_heads, max_len, head_dim]`, both the same) and `lengths`;
/// returns the cache's sizes with `heads` query heads, and the dtype.
fn check_cache(op: &'static str, k_cache: &Tensor, v_cache: &Tensor, lengths: &Tensor) -> Result<(CacheShape, DType)> {
    let dtype = check_like(op, &[k_cache, v_cache])?;
    let [batch, kv_heads, max_len, head_dim] = cache_dims(op, k_cache, v_cache)?;
    if batch == 0 || kv_heads == 0 || max_len == 0 || head_dim == 0 {
        let layout = "[batch, kv_heads, max_len, head_dim], every one nonzero";
        return Err(Error::shape(op, ShapeProblem::layout("the caches", layout, k_cache.dims())));
    }
    let s = CacheShape { batch, heads: kv_heads, kv_heads, max_len, head_dim };
    cache_limits(op, &s)?;
    check_lengths(op, lengths, k_cache, batch)?;
    Ok((s, dtype))
}

/// The kernels' limits on a cache: the grid's y and z dimensions hold at most 65535 blocks
/// (sequences, key/value heads); lengths are i32 ([`OpError::TooLarge`]).
pub(super) fn cache_limits(op: &'static str, s: &CacheShape) -> Result<()> {
    at_most(op, "batch", s.batch, 65535)?;
    at_most(op, "kv head count", s.kv_heads, 65535)?;
    at_most(op, "cache length", s.max_len, i32::MAX as usize)
}

/// Attention of one new query token per sequence against a KV cache (flash-decoding).
///
/// `q` is `[batch, heads, head_dim]`, `k_cache` and `v_cache` `[batch, kv_heads, max_len,
/// head_dim]` (grouped-query attention when `kv_heads < heads`: query head `h` reads key/value
/// head `h / (heads / kv_heads)`), all of one float dtype with head_dim 1 to 128 (bf16 and f16
/// at head_dim 64 and 128 run kernels built for those sizes; f32 and other head dims a kernel
/// that reads head_dim at run time), and `lengths` an [`DType::I32`] tensor `[batch]`: sequence
/// `b` attends to cache positions `0..lengths[b]` (append the step's keys and values first, with
/// [`kv_cache_append`], so the token sees itself). Returns `[batch, heads, head_dim]` in the
/// input dtype: `softmax(q·Kᵀ / sqrt(head_dim))·V`, scores and softmax in f32.
///
/// The lengths are read on the device only, and the launch shape depends on `max_len` alone,
/// so one captured graph serves every length. On CUDA the cache is split across blocks (each
/// keeps its softmax max and sum) and a second kernel combines the splits in a fixed order: no
/// atomics, bitwise reproducible. A length of 0 gives zeros; a length outside `0..=max_len`
/// reads nothing, gives zeros, and is [`Error::CacheLengthOutOfRange`]: on CUDA at the next
/// synchronize (any read to the host), on the host backend from this call (or from the replay
/// of a graph that captured it). On the host backend the CPU reference
/// ([`cpu::decode_attention`]) runs.
///
/// ```
/// # use graphed::{ops, DType, Device, Tensor};
/// let dev = Device::host();
/// let (batch, kv_heads, max_len, d) = (2, 1, 8, 64);
/// let k_cache = Tensor::zeros_as(&dev, &[batch, kv_heads, max_len, d], DType::BF16)?;
/// let v_cache = Tensor::zeros_as(&dev, &[batch, kv_heads, max_len, d], DType::BF16)?;
/// let lengths = Tensor::from_i32(&dev, &[0, 0], &[batch])?;
/// // One step: append the token's key and value, then attend (2 query heads share the kv head).
/// let k = Tensor::full_as(&dev, &[batch, kv_heads, d], 0.5, DType::BF16)?;
/// let v = Tensor::full_as(&dev, &[batch, kv_heads, d], 2.0, DType::BF16)?;
/// ops::kv_cache_append(&k_cache, &v_cache, &lengths, &k, &v)?;
/// assert_eq!(lengths.to_i32_vec()?, vec![1, 1]);
/// let q = Tensor::full_as(&dev, &[batch, 2, d], 1.0, DType::BF16)?;
/// let out = ops::decode_attention(&q, &k_cache, &v_cache, &lengths)?;
/// assert_eq!(out.dims(), &[batch, 2, d][..]);
/// assert!(out.to_vec()?.iter().all(|&x| x == 2.0)); // one key: its value
/// # Ok::<(), graphed::Error>(())
/// ```
pub fn decode_attention(q: &Tensor, k_cache: &Tensor, v_cache: &Tensor, lengths: &Tensor) -> Result<Tensor> {
    const OP: &str = "decode_attention";
    let (s, dtype) = check_cache(OP, k_cache, v_cache, lengths)?;
    check_like(OP, &[k_cache, q])?;
    let &[qb, heads, qd] = q.dims() else {
        return Err(Error::shape(OP, ShapeProblem::layout("q", "[batch, heads, head_dim]", q.dims())));
    };
    if qb != s.batch || qd != s.head_dim {
        let (batch, head_dim, kv_heads) = (s.batch, s.head_dim, s.kv_heads);
        return Err(Error::shape(OP, ShapeProblem::Query { got: q.dims().to_vec(), batch, head_dim, kv_heads }));
    }
    let s = with_heads(OP, s, heads)?;
    let (partial, _) = partial_kernel(dtype, s.head_dim, false);
    match exec(q.device()) {
        Exec::Host(h) => {
            let (qp, kp, vp, lp) = (q.host_ptr()?, k_cache.host_ptr()?, v_cache.host_ptr()?, lengths.host_ptr()?);
            let out = Tensor::empty_like(q)?;
            let op = out.host_ptr()?;
            h.run(partial, move || {
                let (o, bad) = cpu::decode_attention(&qp.read(), &kp.read(), &vp.read(), &lp.read_i32(), s);
                op.write(&o);
                reported(OP, bad, s.max_len)
            })?;
            Ok(out)
        }
        Exec::Cuda(c) => two_pass(c, s, dtype, q, [k_cache, v_cache, lengths], false),
    }
}

/// Flash-decoding's two kernels on CUDA: the first pass over (split, query head, sequence)
/// blocks, then the combine of the splits in a fixed order. `q` is the queries, or with
/// `append` the step's q/k/v rows ([`decode_attention_append`]: the first pass appends the new
/// keys and values, the combine advances the lengths).
fn two_pass(
    c: &CudaBackend,
    s: CacheShape,
    dtype: DType,
    q: &Tensor,
    [k_cache, v_cache, lengths]: [&Tensor; 3],
    append: bool,
) -> Result<Tensor> {
    let (partial, any_dim) = partial_kernel(dtype, s.head_dim, append);
    let (qp, kp, vp, lp) = (q.cuda_ptr()?, k_cache.cuda_ptr()?, v_cache.cuda_ptr()?, lengths.cuda_ptr()?);
    let (split_len, splits) = decode_splits(s.max_len);
    let part_o = Tensor::empty(q.device(), &[s.batch, s.heads, splits, s.head_dim])?;
    let part_lse = Tensor::empty(q.device(), &[s.batch, s.heads, splits])?;
    let out = Tensor::empty_as(q.device(), &s.query_dims(), dtype)?;
    let (pop, plp) = (part_o.cuda_ptr()?, part_lse.cuda_ptr()?);
    let heads = KArg::U32(s.heads as u32);
    let mut args = vec![
        KArg::Ptr(pop),
        KArg::Ptr(plp),
        KArg::Ptr(qp),
        KArg::Ptr(kp),
        KArg::Ptr(vp),
        KArg::Ptr(lp),
        heads,
        KArg::U32(s.kv_heads as u32),
        KArg::U32(s.max_len as u32),
        KArg::U32(split_len as u32),
        KArg::F32(s.scale()),
    ];
    if any_dim {
        args.push(KArg::U32(s.head_dim as u32));
    }
    args.push(KArg::Ptr(c.err_word()));
    // 4 warps a block (DEC_WARPS in decode.cu).
    let dims = LaunchDims { grid: (splits as u32, s.heads as u32, s.batch as u32), block: (128, 1, 1), shared: 0 };
    c.launch(partial, dims, &args)?;
    let combine = match (dtype, append) {
        (DType::BF16, false) => B::DecodeCombineBf16,
        (DType::F16, false) => B::DecodeCombineF16,
        (_, false) => B::DecodeCombineF32,
        (DType::BF16, true) => B::DecodeAppendCombineBf16,
        (DType::F16, true) => B::DecodeAppendCombineF16,
        (_, true) => B::DecodeAppendCombineF32,
    };
    let mut args = vec![KArg::Ptr(out.cuda_ptr()?), KArg::Ptr(pop), KArg::Ptr(plp)];
    if append {
        args.push(KArg::Ptr(lp));
    }
    args.extend([heads, KArg::U32(splits as u32), KArg::U32(s.head_dim as u32)]);
    if append {
        args.push(KArg::U32(s.max_len as u32));
    }
    let dims = LaunchDims { grid: (s.heads as u32, s.batch as u32, 1), block: (s.head_dim as u32, 1, 1), shared: 0 };
    c.launch(combine, dims, &args)?;
    // The partials go back to the pool here; later work on the stream is ordered after the
    // combine, so reusing their memory is safe.
    Ok(out)
}

/// Checks `heads` query heads over a cache of `s.kv_heads` (a nonzero multiple, at most 65535)
/// and the head dim the kernels hold; returns `s` with its query heads.
pub(super) fn with_heads(op: &'static str, mut s: CacheShape, heads: usize) -> Result<CacheShape> {
    if heads == 0 || !heads.is_multiple_of(s.kv_heads) {
        return Err(Error::shape(op, ShapeProblem::Heads { heads, kv_heads: s.kv_heads }));
    }
    // The grid's y dimension holds at most 65535 blocks.
    at_most(op, "heads", heads, 65535)?;
    if s.head_dim > MAX_HEAD_DIM {
        return Err(Error::shape(op, ShapeProblem::HeadDim { head_dim: s.head_dim, max: MAX_HEAD_DIM }));
    }
    s.heads = heads;
    Ok(s)
}

/// One decoding step's append and attention in one op: [`kv_cache_append`] of the step's keys
/// and values, then [`decode_attention`] of its queries, all three read from `qkv`, the rows
/// one GEMM against the stacked projections writes: `[batch, (heads + 2·kv_heads)·head_dim]`,
/// the query of every head, then the key and the value of every key/value head. The caches
/// (`[batch, kv_heads, max_len, head_dim]`), `lengths` ([`DType::I32`] `[batch]`) and dtypes
/// are those of the two ops; returns `[batch, heads, head_dim]`.
///
/// The result, the caches and the lengths are bitwise those of the two ops on both backends.
/// On CUDA the attention kernel reads the new key and value from `qkv` (the bits the cache
/// gets) and writes them into the cache, and the combine that follows advances the lengths
/// (every block of the first pass has read them by then): the append's kernel is gone. Where
/// the cache is one split (`max_len` at most 256, see the decode kernels' splits) and there
/// are at most 8 query heads, one kernel does it all (a block a sequence, every head in it).
///
/// Errors as the two ops give them: a full cache is [`Error::CacheFull`], a length outside
/// `0..=max_len` [`Error::CacheLengthOutOfRange`], both from `kv_cache_append` (on CUDA at
/// the next synchronize, on the host from this call or the replay that ran it); a full
/// sequence attends to its cache unchanged, the others are appended.
///
/// ```
/// # use graphed::{ops, DType, Device, Tensor};
/// let dev = Device::host();
/// let (batch, heads, max_len, d) = (1, 2, 8, 4);
/// let k_cache = Tensor::zeros(&dev, &[batch, heads, max_len, d])?;
/// let v_cache = Tensor::zeros(&dev, &[batch, heads, max_len, d])?;
/// let lengths = Tensor::from_i32(&dev, &[0], &[batch])?;
/// // q of both heads (1s), then their keys (0s) and values (3s): [1, (2 + 2·2)·4].
/// let rows: Vec<f32> = [vec![1.0; 8], vec![0.0; 8], vec![3.0; 8]].concat();
/// let qkv = Tensor::from_slice(&dev, &rows, &[batch, 3 * heads * d])?;
/// let out = ops::decode_attention_append(&qkv, &k_cache, &v_cache, &lengths, heads)?;
/// assert_eq!(out.to_vec()?, vec![3.0; 8]); // one key: its value
/// assert_eq!(lengths.to_i32_vec()?, vec![1]);
/// assert_eq!(v_cache.to_vec()?[..4], [3.0; 4]); // appended at position 0
/// # Ok::<(), graphed::Error>(())
/// ```
pub fn decode_attention_append(
    qkv: &Tensor,
    k_cache: &Tensor,
    v_cache: &Tensor,
    lengths: &Tensor,
    heads: usize,
) -> Result<Tensor> {
    const OP: &str = "decode_attention_append";
    // Errors from the device or the reference name the append, as the unfused ops do.
    const APPEND: &str = "kv_cache_append";
    let (s, dtype) = check_cache(OP, k_cache, v_cache, lengths)?;
    check_like(OP, &[k_cache, qkv])?;
    let s = with_heads(OP, s, heads)?;
    let width = (s.heads + 2 * s.kv_heads) * s.head_dim;
    if qkv.dims() != [s.batch, width] {
        let from = "[batch, (heads + 2 · kv_heads) · head_dim]";
        return Err(Error::shape(OP, ShapeProblem::expected("qkv", &[s.batch, width], from, qkv.dims())));
    }
    let (partial, _) = partial_kernel(dtype, s.head_dim, true);
    match exec(qkv.device()) {
        Exec::Host(h) => {
            let ptrs = [qkv, k_cache, v_cache, lengths].map(|t| t.host_ptr());
            let [qp, kcp, vcp, lp] = ptrs;
            let (qp, kcp, vcp, lp) = (qp?, kcp?, vcp?, lp?);
            let out = Tensor::empty_as(qkv.device(), &s.query_dims(), dtype)?;
            let op = out.host_ptr()?;
            h.run(partial, move || {
                let [q, k, v] = split_qkv(&qp.read(), s);
                let (mut kc, mut vc, mut lens) = (kcp.read(), vcp.read(), lp.read_i32());
                let bad = cpu::kv_cache_append(&mut kc, &mut vc, &mut lens, &k, &v, s);
                let (o, _) = cpu::decode_attention(&q, &kc, &vc, &lens, s);
                kcp.write(&kc);
                vcp.write(&vc);
                lp.write_i32(&lens);
                op.write(&o);
                reported(APPEND, bad, s.max_len)
            })?;
            Ok(out)
        }
        Exec::Cuda(c) => match one_pass_kernel(dtype, s) {
            Some(kernel) => {
                let out = Tensor::empty_as(qkv.device(), &s.query_dims(), dtype)?;
                let args = [
                    KArg::Ptr(out.cuda_ptr()?),
                    KArg::Ptr(qkv.cuda_ptr()?),
                    KArg::Ptr(k_cache.cuda_ptr()?),
                    KArg::Ptr(v_cache.cuda_ptr()?),
                    KArg::Ptr(lengths.cuda_ptr()?),
                    KArg::U32(s.heads as u32),
                    KArg::U32(s.kv_heads as u32),
                    KArg::U32(s.max_len as u32),
                    KArg::F32(s.scale()),
                    KArg::Ptr(c.err_word()),
                ];
                // DEC_WARPS (4) warps a head.
                c.launch(kernel, LaunchDims::rows(s.batch, 128 * s.heads as u32), &args)?;
                Ok(out)
            }
            None => two_pass(c, s, dtype, qkv, [k_cache, v_cache, lengths], true),
        },
    }
}

/// The queries (`[batch, heads, head_dim]`), keys and values (`[batch, kv_heads, head_dim]`)
/// of `qkv`'s rows (see [`decode_attention_append`]).
fn split_qkv(qkv: &[f32], s: CacheShape) -> [Vec<f32>; 3] {
    let (qw, kw) = (s.heads * s.head_dim, s.kv_heads * s.head_dim);
    let mut parts = [Vec::new(), Vec::new(), Vec::new()];
    for row in qkv.chunks(qw + 2 * kw).take(s.batch) {
        parts[0].extend_from_slice(&row[..qw]);
        parts[1].extend_from_slice(&row[qw..qw + kw]);
        parts[2].extend_from_slice(&row[qw + kw..]);
    }
    parts
}

/// Appends one decoding step to a KV cache, on the device: writes `k` and `v`
/// (`[batch, kv_heads, head_dim]`) at position `lengths[b]` of sequence `b`'s cache
/// (`[batch, kv_heads, max_len, head_dim]`, any float dtype, the same as `k` and `v`) and
/// increments `lengths[b]` (an [`DType::I32`] tensor `[batch]`). Nothing is read on the host,
/// so the call captures into a graph that then serves every step.
///
/// A sequence whose cache is full (`lengths[b] == max_len`) is left unchanged and is
/// [`Error::CacheFull`] (a length outside `0..=max_len`: [`Error::CacheLengthOutOfRange`]);
/// the other sequences are appended. On CUDA the error comes with the next synchronize (it is
/// reported through the device's error word), on the host backend from this call or from the
/// replay that ran it. See [`decode_attention`] for an example.
///
/// ```
/// # use graphed::{ops, DType, Device, Error, Tensor};
/// let dev = Device::host();
/// let cache = || Tensor::zeros(&dev, &[1, 1, 2, 4]);
/// let (kc, vc) = (cache()?, cache()?);
/// let lengths = Tensor::from_i32(&dev, &[2], &[1])?; // already full
/// let step = Tensor::full(&dev, &[1, 1, 4], 1.0)?;
/// let full = ops::kv_cache_append(&kc, &vc, &lengths, &step, &step);
/// assert!(matches!(full, Err(Error::CacheFull { sequence: 0, max_len: 2, .. })));
/// assert_eq!(lengths.to_i32_vec()?, vec![2]); // unchanged
/// # Ok::<(), graphed::Error>(())
/// ```
pub fn kv_cache_append(k_cache: &Tensor, v_cache: &Tensor, lengths: &Tensor, k: &Tensor, v: &Tensor) -> Result<()> {
    const OP: &str = "kv_cache_append";
    let (s, dtype) = check_cache(OP, k_cache, v_cache, lengths)?;
    check_like(OP, &[k_cache, k, v])?;
    let want = s.step_dims();
    for (name, t) in [("k", k), ("v", v)] {
        if t.dims() != want {
            return Err(Error::shape(OP, ShapeProblem::expected(name, &want, "[batch, kv_heads, head_dim]", t.dims())));
        }
    }
    let kernel = if dtype.size() == 2 { B::KvCacheAppendU16 } else { B::KvCacheAppendU32 };
    match exec(k.device()) {
        Exec::Host(h) => {
            let ptrs = [k_cache, v_cache, lengths, k, v].map(|t| t.host_ptr());
            let [kcp, vcp, lp, kp, vp] = ptrs;
            let (kcp, vcp, lp, kp, vp) = (kcp?, vcp?, lp?, kp?, vp?);
            h.run(kernel, move || {
                let (mut kc, mut vc, mut lens) = (kcp.read(), vcp.read(), lp.read_i32());
                let bad = cpu::kv_cache_append(&mut kc, &mut vc, &mut lens, &kp.read(), &vp.read(), s);
                kcp.write(&kc);
                vcp.write(&vc);
                lp.write_i32(&lens);
                reported(OP, bad, s.max_len)
            })
        }
        Exec::Cuda(c) => {
            let ptrs = [k_cache, v_cache, lengths, k, v].map(|t| t.cuda_ptr());
            let [kcp, vcp, lp, kp, vp] = ptrs;
            let args = [
                KArg::Ptr(kcp?),
                KArg::Ptr(vcp?),
                KArg::Ptr(lp?),
                KArg::Ptr(kp?),
                KArg::Ptr(vp?),
                KArg::U32(s.kv_heads as u32),
                KArg::U32(s.max_len as u32),
                KArg::U32(s.head_dim as u32),
                KArg::Ptr(c.err_word()),
            ];
            let threads = (s.kv_heads * s.head_dim).div_ceil(32).clamp(1, 8) as u32 * 32;
            c.launch(kernel, LaunchDims::rows(s.batch, threads), &args)
        }
    }
}

/// Writes a prompt's keys and values into a KV cache (prefill): `k` and `v`
/// (`[batch, seq, kv_heads, head_dim]`, which is how a projection `[batch, seq, kv_heads ·
/// head_dim]` lies in memory) go to positions `0..seq` of each sequence's cache
/// (`[batch, kv_heads, max_len, head_dim]`, the same float dtype), `seq` at most `max_len`.
/// The lengths are left to the caller (set them to each prompt's real length; the positions
/// past it hold the padding's keys, which [`decode_attention`] never reads and
/// [`kv_cache_append`] overwrites). Every argument is checked on the host, so nothing is
/// reported from the device; on the host backend the CPU reference ([`cpu::kv_cache_fill`])
/// runs.
///
/// ```
/// # use graphed::{ops, Device, Tensor};
/// let dev = Device::host();
/// let (kc, vc) = (Tensor::zeros(&dev, &[1, 2, 3, 1])?, Tensor::zeros(&dev, &[1, 2, 3, 1])?);
/// // Two positions of two heads, laid out [batch, seq, kv_heads, head_dim].
/// let k = Tensor::from_slice(&dev, &[1.0, 2.0, 3.0, 4.0], &[1, 2, 2, 1])?;
/// ops::kv_cache_fill(&kc, &vc, &k, &k)?;
/// assert_eq!(kc.to_vec()?, vec![1.0, 3.0, 0.0, 2.0, 4.0, 0.0]); // head 0: 1, 3; head 1: 2, 4
/// # Ok::<(), graphed::Error>(())
/// ```
pub fn kv_cache_fill(k_cache: &Tensor, v_cache: &Tensor, k: &Tensor, v: &Tensor) -> Result<()> {
    const OP: &str = "kv_cache_fill";
    let dtype = check_like(OP, &[k_cache, v_cache, k, v])?;
    let [batch, kv_heads, max_len, head_dim] = cache_dims(OP, k_cache, v_cache)?;
    let seq = match *k.dims() {
        [b, seq, h, d] if b == batch && h == kv_heads && d == head_dim && seq <= max_len => seq,
        _ => {
            let got = k.dims().to_vec();
            return Err(Error::shape(OP, ShapeProblem::Append { got, batch, kv_heads, head_dim, max_len }));
        }
    };
    if v.dims() != k.dims() {
        return Err(Error::shape(OP, ShapeProblem::same("v", v.dims(), "k", k.dims())));
    }
    n32(OP, k_cache.numel())?;
    let s = CacheShape { batch, heads: kv_heads, kv_heads, max_len, head_dim };
    let kernel = if dtype.size() == 2 { B::KvCacheFillU16 } else { B::KvCacheFillU32 };
    match exec(k.device()) {
        Exec::Host(h) => {
            let (kcp, vcp, kp, vp) = (k_cache.host_ptr()?, v_cache.host_ptr()?, k.host_ptr()?, v.host_ptr()?);
            h.run(kernel, move || {
                let (mut kc, mut vc) = (kcp.read(), vcp.read());
                cpu::kv_cache_fill(&mut kc, &mut vc, &kp.read(), &vp.read(), s, seq);
                kcp.write(&kc);
                vcp.write(&vc);
                Ok(())
            })
        }
        Exec::Cuda(c) => {
            let args = [
                KArg::Ptr(k_cache.cuda_ptr()?),
                KArg::Ptr(v_cache.cuda_ptr()?),
                KArg::Ptr(k.cuda_ptr()?),
                KArg::Ptr(v.cuda_ptr()?),
                KArg::U32(batch as u32),
                KArg::U32(seq as u32),
                KArg::U32(kv_heads as u32),
                KArg::U32(max_len as u32),
                KArg::U32(head_dim as u32),
            ];
            c.launch(kernel, LaunchDims::elementwise(k.numel()), &args)
        }
    }
}

/// The largest head dimension the decode kernels take (a warp's lanes hold 4 columns each).
const MAX_HEAD_DIM: usize = 128;

/// The first-pass kernel for `dtype` and `head_dim` (with `append`, the one that appends the
/// step's keys and values: [`decode_attention_append`]), and whether it takes the head
/// dimension as an argument (the run-time build) rather than being built for it.
fn partial_kernel(dtype: DType, head_dim: usize, append: bool) -> (B, bool) {
    let (plain, appending, any) = match (dtype, head_dim) {
        (DType::BF16, 64) => (B::DecodePartialBf16D64, B::DecodeAppendPartialBf16D64, false),
        (DType::BF16, 128) => (B::DecodePartialBf16D128, B::DecodeAppendPartialBf16D128, false),
        (DType::F16, 64) => (B::DecodePartialF16D64, B::DecodeAppendPartialF16D64, false),
        (DType::F16, 128) => (B::DecodePartialF16D128, B::DecodeAppendPartialF16D128, false),
        (DType::BF16, _) => (B::DecodePartialBf16Any, B::DecodeAppendPartialBf16Any, true),
        (DType::F16, _) => (B::DecodePartialF16Any, B::DecodeAppendPartialF16Any, true),
        _ => (B::DecodePartialF32Any, B::DecodeAppendPartialF32Any, true),
    };
    (if append { appending } else { plain }, any)
}

/// The heads one block of the one-pass kernels holds (DEC_ONE_HEADS in decode.cu).
const ONE_PASS_HEADS: usize = 8;

/// The kernel that appends and attends in one pass, where `s` allows one: a cache of one split,
/// at most [`ONE_PASS_HEADS`] query heads, a 16-bit dtype at head dim 64 or 128.
fn one_pass_kernel(dtype: DType, s: CacheShape) -> Option<B> {
    if decode_splits(s.max_len).1 != 1 || s.heads > ONE_PASS_HEADS {
        return None;
    }
    match (dtype, s.head_dim) {
        (DType::BF16, 64) => Some(B::DecodeAppendOneBf16D64),
        (DType::BF16, 128) => Some(B::DecodeAppendOneBf16D128),
        (DType::F16, 64) => Some(B::DecodeAppendOneF16D64),
        (DType::F16, 128) => Some(B::DecodeAppendOneF16D128),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::Attention;

    /// The split is a function of max_len alone: at least 256 keys, at most 64 splits, and the
    /// splits cover the cache.
    #[test]
    fn splits_cover_the_cache_within_their_bounds() {
        for max_len in [1, 63, 256, 257, 4096, 16384, 16385, 100_000, 1 << 20] {
            let (split_len, splits) = decode_splits(max_len);
            assert!(split_len >= 256 && split_len % 64 == 0 && splits <= 64, "{max_len}: {split_len} x {splits}");
            assert!(split_len * splits >= max_len && split_len * (splits - 1) < max_len, "{max_len}");
        }
    }

    #[test]
    fn every_build_is_picked_by_its_dtype_and_head_dim() {
        for append in [false, true] {
            let prefix = if append { "decode_append_partial_" } else { "decode_partial_" };
            for (dtype, tag) in [(DType::BF16, "bf16_"), (DType::F16, "f16_")] {
                for d in Attention::HEAD_DIMS {
                    let (k, any) = partial_kernel(dtype, d, append);
                    assert!(!any && k.name().starts_with(&format!("{prefix}{tag}d{d}")), "{}", k.name());
                }
                for d in [1, 24, 96, 127] {
                    let (k, any) = partial_kernel(dtype, d, append);
                    assert!(any && k.name() == format!("{prefix}{tag}any"), "{}", k.name());
                }
            }
            for d in [8, 64, 128] {
                let (k, any) = partial_kernel(DType::F32, d, append);
                assert!(any && k.name() == format!("{prefix}f32_any"), "{}", k.name());
            }
        }
    }

    /// One pass where the cache is one split and a block holds every head, built for the dtype
    /// and head dim; two passes otherwise.
    #[test]
    fn one_pass_where_one_block_holds_a_sequence() {
        let s = |heads, max_len, head_dim| CacheShape { batch: 2, heads, kv_heads: 1, max_len, head_dim };
        for (dtype, tag) in [(DType::BF16, "bf16"), (DType::F16, "f16")] {
            for d in Attention::HEAD_DIMS {
                let k = one_pass_kernel(dtype, s(ONE_PASS_HEADS, 256, d)).map(B::name);
                assert_eq!(k, Some(format!("decode_append_one_{tag}_d{d}")).as_deref());
            }
            assert_eq!(one_pass_kernel(dtype, s(ONE_PASS_HEADS + 1, 256, 64)), None, "too many heads");
            assert_eq!(one_pass_kernel(dtype, s(1, 257, 64)), None, "two splits");
            assert_eq!(one_pass_kernel(dtype, s(1, 256, 96)), None, "a run-time head dim");
        }
        assert_eq!(one_pass_kernel(DType::F32, s(1, 16, 64)), None);
    }
}
