//! One decoding step of a pre-norm decoder as one persistent kernel ([`DecoderStep`]), with
//! the unfused ops as its reference and fallback.

use crate::backend::cuda_decoder::{
    decoder_max_batch, decoder_trace_dir, DecoderKernels, DecoderShape, TRACE_SLOTS, TRACE_STAGES,
};
use crate::backend::{CudaBackend, KArg};
use crate::error::OpError;
use crate::ops::cpu::CacheShape;
use crate::ops::{self, at_most, check_like, exec, Exec};
use crate::tensor::restoring;
use crate::{DType, Device, Error, Result, ShapeProblem, Tensor};

const OP: &str = "DecoderStep";

/// The most sequences the one-kernel step takes (four 16-row tiles): the most
/// [`DecoderStep::set_fused_batch_limit`] accepts.
pub const DECODER_STEP_MAX_FUSED_BATCH: usize = 64;

/// The batches [`DecoderStep::run`] gives the one kernel by default: every batch it takes (64
/// sequences). On an H200 (the GPT of examples/gpt, 2026-12-04, call A) the kernel with its
/// GEMM stages in row groups took 0.426 ms a token at batch 64 against the unfused ops' 0.508
/// and the kernel before the row groups' 0.559 (the default was then 32); the form landed
/// measured 0.404 against 0.557 before the groups in another call (B).
pub const DECODER_STEP_DEFAULT_FUSED_BATCH: usize = 64;

/// One layer of a [`DecoderWeights`]: a pre-norm block `x + attn(rms_norm(x))`, then
/// `x + mlp(rms_norm(x))`, with its KV cache.
#[derive(Clone, Copy, Debug)]
pub struct DecoderLayer<'a> {
    /// The first norm's gain, `[d_model]`.
    pub norm1: &'a Tensor,
    /// The query, key and value projections stacked, `[3 · d_model, d_model]` (q rows, then k,
    /// then v, as [`ops::decode_attention_append`] reads a row).
    pub qkv: &'a Tensor,
    /// The output projection, `[d_model, d_model]`.
    pub wo: &'a Tensor,
    /// The second norm's gain, `[d_model]`.
    pub norm2: &'a Tensor,
    /// The gate and up projections stacked, `[2 · hidden, d_model]` (gate rows, then up, as
    /// [`ops::swiglu_packed`] reads a row).
    pub gate_up: &'a Tensor,
    /// The down projection, `[d_model, hidden]`.
    pub down: &'a Tensor,
    /// The layer's key cache, `[batch, heads, max_len, head_dim]`.
    pub k_cache: &'a Tensor,
    /// The layer's value cache, the same shape.
    pub v_cache: &'a Tensor,
    /// The layer's cache lengths, [`DType::I32`] `[batch]`.
    pub lengths: &'a Tensor,
}

/// A decoder's weights as [`DecoderStep::new`] takes them: token and position embeddings
/// (summed), the layers, a final RMSNorm and an untied head.
#[derive(Clone, Debug)]
pub struct DecoderWeights<'a> {
    /// Token embeddings, `[vocab, d_model]`.
    pub tok: &'a Tensor,
    /// Position embeddings, `[context, d_model]`.
    pub pos: &'a Tensor,
    /// The layers, first to last (at least one).
    pub layers: Vec<DecoderLayer<'a>>,
    /// The final norm's gain, `[d_model]`.
    pub head_norm: &'a Tensor,
    /// The head, `[out_vocab, d_model]`: logits are `[batch, out_vocab]`.
    pub head: &'a Tensor,
    /// Attention heads (they divide `d_model`).
    pub heads: usize,
    /// The norms' epsilon.
    pub eps: f32,
}

/// Handles to one layer's tensors.
#[derive(Clone, Debug)]
struct Layer {
    norm1: Tensor,
    qkv: Tensor,
    wo: Tensor,
    norm2: Tensor,
    gate_up: Tensor,
    down: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    lengths: Tensor,
}

impl Layer {
    fn of(l: &DecoderLayer<'_>) -> Layer {
        Layer {
            norm1: l.norm1.clone(),
            qkv: l.qkv.clone(),
            wo: l.wo.clone(),
            norm2: l.norm2.clone(),
            gate_up: l.gate_up.clone(),
            down: l.down.clone(),
            k_cache: l.k_cache.clone(),
            v_cache: l.v_cache.clone(),
            lengths: l.lengths.clone(),
        }
    }

    /// The tensors in the order of `FdLayer` (kernels/decoder.cu).
    fn table_order(&self) -> [&Tensor; 9] {
        [
            &self.norm1,
            &self.qkv,
            &self.wo,
            &self.norm2,
            &self.gate_up,
            &self.down,
            &self.k_cache,
            &self.v_cache,
            &self.lengths,
        ]
    }
}

/// What the one-kernel step needs on CUDA: the table of pointers the kernel reads (written
/// once), the grid barrier's 64-bit count (two zeroed i32 words), the kernel's builds and their
/// grid, and the most sequences it was built for; with `GRAPHED_DECODER_TRACE`, the buffer of
/// its stage marks and the folder they go to.
#[derive(Debug)]
struct Fused {
    table: Tensor,
    barrier: Tensor,
    max_batch: usize,
    trace: Option<(Tensor, &'static std::path::Path)>,
    shape: DecoderShape,
    kernels: DecoderKernels,
}

/// One decoding step of a pre-norm decoder (learned token and position embeddings; per layer
/// RMSNorm, multi-head attention over a KV cache, RMSNorm, SwiGLU MLP, with residuals; a final
/// RMSNorm and a head) for one new token per sequence: [`DecoderStep::run`] embeds the tokens
/// at their positions, appends each layer's keys and values to its cache at the sequence's
/// length (advancing the lengths by one), attends to the cache and returns the logits.
///
/// On CUDA (bf16, head dim 64 or 128, sm_80 and newer, at most
/// [`DecoderStep::fused_batch_limit`] sequences) the whole step is **one kernel**
/// (`kernels/decoder.cu`): a persistent grid of one block a multiprocessor, launched
/// cooperatively, its stages (per layer embedding sum (first layer) + norm + q/k/v + append,
/// attention, output projection + residual, norm + gate/up + SwiGLU, down projection +
/// residual; norm + head) separated by a grid-wide barrier; at up to 4 sequences the attention
/// stage computes the output projection too, per head, and the next stage sums the heads. Its
/// GEMMs run one warp a column on the CUDA cores up to 4 sequences and on tensor cores above,
/// past 16 sequences with the grid split into groups of blocks that each take 16 of the rows
/// (every tile of the stage for them; the grouping changes no sum's order);
/// its attention gives a (sequence, head) a block, or a team of 4, 2 or 1 warps where the
/// tasks outnumber the blocks. Both depend on the batch only through its next power of two, so
/// a batch and the bucket it is padded to take the same path and sum alike (across those
/// bounds a sequence's logits may differ in their last bits). Decoding at small batches is
/// latency: the step's unfused form is 8 kernels a layer (4 to 6 µs each on an H200 whatever
/// their size), this one a few µs a stage. Intermediates round to the weights' dtype where the
/// unfused ops store them; the sums run in another order than cuBLAS's, so logits can differ
/// from [`DecoderStep::run_unfused`] in their last bits (the tests bound it). The kernel has no
/// atomics on data: its result is bitwise reproducible, eager or graphed.
///
/// Everywhere else (the host backend, other dtypes or head dims, larger batches, weights that
/// do not start on a 16-byte boundary) `run` is
/// [`DecoderStep::run_unfused`]: the same step through the unfused ops
/// ([`ops::add_rms_norm`], [`ops::rms_norm`], [`ops::linear`], [`ops::linear_residual`],
/// [`ops::decode_attention_append`], [`ops::swiglu_packed`]), bit for bit what they give; that
/// is also the kernel's reference.
///
/// The step reads the weights and caches it was made from through their addresses (the
/// table is written once): they and the step must outlive every graph that captured `run`.
/// Bad token ids or positions and full caches are reported as the unfused ops report them
/// ([`Error::TokenOutOfRange`], [`Error::CacheFull`]).
///
/// ```
/// use graphed::ops::{DecoderLayer, DecoderStep, DecoderWeights};
/// use graphed::{DType, Device, Tensor};
/// let dev = Device::host();
/// let (vocab, ctx, d, heads, hidden, max_len) = (16, 8, 8, 2, 16, 8);
/// let w = |dims: &[usize]| Tensor::full(&dev, dims, 0.1);
/// let (tok, pos, gain, head) = (w(&[vocab, d])?, w(&[ctx, d])?, w(&[d])?, w(&[vocab, d])?);
/// let (qkv, wo, gate_up, down) = (w(&[3 * d, d])?, w(&[d, d])?, w(&[2 * hidden, d])?, w(&[d, hidden])?);
/// let k_cache = Tensor::zeros(&dev, &[1, heads, max_len, d / heads])?;
/// let v_cache = Tensor::zeros(&dev, &[1, heads, max_len, d / heads])?;
/// let lengths = Tensor::from_i32(&dev, &[0], &[1])?;
/// let layer = DecoderLayer {
///     norm1: &gain, qkv: &qkv, wo: &wo, norm2: &gain, gate_up: &gate_up, down: &down,
///     k_cache: &k_cache, v_cache: &v_cache, lengths: &lengths,
/// };
/// let weights = DecoderWeights {
///     tok: &tok, pos: &pos, layers: vec![layer], head_norm: &gain, head: &head, heads, eps: 1e-5,
/// };
/// let step = DecoderStep::new(&weights)?;
/// let (ids, positions) = (Tensor::from_slice(&dev, &[3.0], &[1])?, Tensor::from_slice(&dev, &[0.0], &[1])?);
/// let logits = step.run(&ids, &positions)?;
/// assert_eq!(logits.dims(), &[1, vocab][..]);
/// assert_eq!(lengths.to_i32_vec()?, vec![1]); // the token's key and value were appended
/// # Ok::<(), graphed::Error>(())
/// ```
#[derive(Debug)]
pub struct DecoderStep {
    tok: Tensor,
    pos: Tensor,
    layers: Vec<Layer>,
    head_norm: Tensor,
    head: Tensor,
    heads: usize,
    eps: f32,
    /// The sequences the caches hold.
    cache_batch: usize,
    /// The largest batch `run` gives the one kernel.
    fused_limit: usize,
    fused: Option<Fused>,
}

/// `t`'s dims must be `dims`, else a shape error naming `what`.
fn expect(t: &Tensor, what: &'static str, dims: &[usize], from: &'static str) -> Result<()> {
    if t.dims() != dims {
        return Err(Error::shape(OP, ShapeProblem::expected(what, dims, from, t.dims())));
    }
    Ok(())
}

impl DecoderStep {
    /// Checks the weights and caches (every shape against `tok`'s `d_model`, the first layer's
    /// hidden width and cache, one float dtype, one device) and, on CUDA where the one-kernel
    /// step runs them, writes its table of pointers (in the device's default pool).
    pub fn new(w: &DecoderWeights<'_>) -> Result<DecoderStep> {
        let &[_, d] = w.tok.dims() else {
            return Err(Error::shape(OP, ShapeProblem::layout("tok", "[vocab, d_model]", w.tok.dims())));
        };
        let Some(first) = w.layers.first() else {
            return Err(Error::InvalidArgument { op: OP, detail: "a decoder needs at least one layer".into() });
        };
        if w.heads == 0 || d == 0 || !d.is_multiple_of(w.heads) {
            let detail = format!("{} heads must divide d_model {d}", w.heads);
            return Err(Error::InvalidArgument { op: OP, detail });
        }
        if !(w.eps.is_finite() && w.eps >= 0.0) {
            return Err(OpError::Eps { op: OP, eps: w.eps }.into());
        }
        let &[gate_up_rows, _] = first.gate_up.dims() else {
            return Err(Error::shape(
                OP,
                ShapeProblem::layout("gate_up", "[2 · hidden, d_model]", first.gate_up.dims()),
            ));
        };
        // An odd row count fails the gate_up check below.
        let hidden = gate_up_rows / 2;
        let cache = first.k_cache.dims().to_vec();
        let &[cache_batch, heads, max_len, head_dim] = &cache[..] else {
            let layout = "[batch, heads, max_len, head_dim]";
            return Err(Error::shape(OP, ShapeProblem::layout("k_cache", layout, &cache)));
        };
        if heads != w.heads || head_dim * heads != d || cache_batch == 0 || max_len == 0 {
            let want = [cache_batch.max(1), w.heads, max_len.max(1), d / w.heads];
            return Err(Error::shape(OP, ShapeProblem::expected("k_cache", &want, "heads, d_model / heads", &cache)));
        }
        // What the step's attention would refuse at every run (a head dim past the kernels', a
        // grid too large), refused here, before a run allocates anything.
        let s = CacheShape { batch: cache_batch, heads, kv_heads: heads, max_len, head_dim };
        super::decode::cache_limits(OP, &s)?;
        super::decode::with_heads(OP, s, heads)?;
        for (t, name, layout) in [(w.pos, "pos", "[context, d_model]"), (w.head, "head", "[out_vocab, d_model]")] {
            if !matches!(t.dims(), &[rows, cols] if rows > 0 && cols == d) {
                return Err(Error::shape(OP, ShapeProblem::layout(name, layout, t.dims())));
            }
        }
        expect(w.head_norm, "head_norm", &[d], "[d_model]")?;
        let mut all = vec![w.tok, w.pos, w.head_norm, w.head];
        for l in &w.layers {
            expect(l.norm1, "norm1", &[d], "[d_model]")?;
            expect(l.qkv, "qkv", &[3 * d, d], "[3 · d_model, d_model]")?;
            expect(l.wo, "wo", &[d, d], "[d_model, d_model]")?;
            expect(l.norm2, "norm2", &[d], "[d_model]")?;
            expect(l.gate_up, "gate_up", &[2 * hidden, d], "[2 · hidden, d_model] (the first layer's hidden)")?;
            expect(l.down, "down", &[d, hidden], "[d_model, hidden]")?;
            expect(l.k_cache, "k_cache", &cache, "the first layer's cache")?;
            expect(l.v_cache, "v_cache", &cache, "the first layer's cache")?;
            if l.lengths.dtype() != DType::I32 {
                return Err(Error::DType { op: OP, got: l.lengths.dtype(), expected: DType::I32 });
            }
            if l.lengths.device() != w.tok.device() {
                return Err(Error::DeviceMismatch { op: OP, a: w.tok.device().name(), b: l.lengths.device().name() });
            }
            expect(l.lengths, "lengths", &[cache_batch], "one per cached sequence")?;
            all.extend([l.norm1, l.qkv, l.wo, l.norm2, l.gate_up, l.down, l.k_cache, l.v_cache]);
        }
        let dtype = check_like(OP, &all)?;
        if hidden == 0 || w.tok.dims()[0] == 0 {
            return Err(Error::InvalidArgument { op: OP, detail: "an empty vocabulary or hidden width".into() });
        }
        let mut step = DecoderStep {
            tok: w.tok.clone(),
            pos: w.pos.clone(),
            layers: w.layers.iter().map(Layer::of).collect(),
            head_norm: w.head_norm.clone(),
            head: w.head.clone(),
            heads: w.heads,
            eps: w.eps,
            cache_batch,
            fused_limit: DECODER_STEP_DEFAULT_FUSED_BATCH,
            fused: None,
        };
        let out_vocab = w.head.dims()[0];
        let kernel_runs = dtype == DType::BF16
            && matches!(head_dim, 64 | 128)
            && d.is_multiple_of(8)
            && hidden.is_multiple_of(8)
            && out_vocab.is_multiple_of(8)
            && u32::try_from(max_len).is_ok()
            && u32::try_from(w.tok.dims()[0].max(w.pos.dims()[0]).max(out_vocab)).is_ok();
        if let (Exec::Cuda(c), true) = (exec(w.tok.device()), kernel_runs) {
            // The kernel reads the weights 16 bytes at a time (cp.async, vector loads): views
            // that start elsewhere run the unfused ops.
            let mut aligned = true;
            for t in [w.tok, w.pos, w.head, w.head_norm] {
                aligned &= t.cuda_ptr()?.is_multiple_of(16);
            }
            for l in &w.layers {
                for t in [l.norm1, l.qkv, l.wo, l.norm2, l.gate_up, l.down] {
                    aligned &= t.cuda_ptr()?.is_multiple_of(16);
                }
            }
            if !aligned {
                return Ok(step);
            }
            if let Some(dir) = decoder_trace_dir().filter(|dir| !dir.is_dir()) {
                let detail = format!("GRAPHED_DECODER_TRACE names {}, which is not a folder", dir.display());
                return Err(Error::InvalidArgument { op: OP, detail });
            }
            let shape = DecoderShape { d_model: d, heads: w.heads, hidden };
            if let Some(kernels) = c.decoder_kernel(shape)? {
                step.fused = Some(step.table(w.tok.device(), shape, max_len, kernels)?);
            }
        }
        Ok(step)
    }

    /// The kernel's table (`FdHeader`, then an `FdLayer` a layer: see kernels/decoder.cu) and
    /// barrier, in the default pool.
    fn table(&self, dev: &Device, shape: DecoderShape, max_len: usize, kernels: DecoderKernels) -> Result<Fused> {
        let mut words: Vec<u64> = Vec::new();
        for t in [&self.tok, &self.pos, &self.head_norm, &self.head] {
            words.push(t.cuda_ptr()?);
        }
        let dims32 = |a: usize, b: usize| (a as u64) | ((b as u64) << 32);
        words.push(dims32(self.layers.len(), self.tok.dims()[0]));
        words.push(dims32(self.pos.dims()[0], max_len));
        for l in &self.layers {
            for t in l.table_order() {
                words.push(t.cuda_ptr()?);
            }
        }
        let halves: Vec<i32> = words.iter().flat_map(|&w| [w as u32 as i32, (w >> 32) as u32 as i32]).collect();
        dev.with_pool(&dev.default_pool(), || {
            Ok(Fused {
                table: Tensor::from_i32(dev, &halves, &[halves.len()])?,
                barrier: Tensor::from_i32(dev, &[0, 0], &[2])?,
                max_batch: decoder_max_batch(),
                trace: match decoder_trace_dir() {
                    Some(dir) => {
                        let words = 2 * kernels.grid as usize * TRACE_STAGES * TRACE_SLOTS;
                        Some((Tensor::from_i32(dev, &vec![0; words], &[words])?, dir))
                    }
                    None => None,
                },
                shape,
                kernels,
            })
        })
    }

    /// Whether [`DecoderStep::run`] launches the one kernel (CUDA, bf16, head dim 64 or 128,
    /// sm_80 or newer) for batches up to [`DecoderStep::fused_batch_limit`]; otherwise it
    /// runs the unfused ops.
    pub fn is_fused(&self) -> bool {
        self.fused.is_some()
    }

    /// Lets the one kernel take batches of up to `limit` sequences (default
    /// [`DECODER_STEP_DEFAULT_FUSED_BATCH`]; 0 never runs it); larger batches run the unfused
    /// ops. A limit above [`DECODER_STEP_MAX_FUSED_BATCH`] is [`OpError::TooLarge`] and leaves
    /// the limit as it was. Graphs already captured keep the path they captured.
    pub fn set_fused_batch_limit(&mut self, limit: usize) -> Result<()> {
        at_most(OP, "fused batch limit", limit, DECODER_STEP_MAX_FUSED_BATCH)?;
        self.fused_limit = limit;
        Ok(())
    }

    /// The largest batch [`DecoderStep::run`] gives the one kernel.
    pub fn fused_batch_limit(&self) -> usize {
        self.fused_limit
    }

    /// The logits (`[batch, out_vocab]`, the weights' dtype) of one new token per sequence:
    /// `ids` (token ids) at `positions`, both f32 `[batch]`, `batch` at most the caches'
    /// sequences (the first `batch` of them are read and written). Appends every layer's keys
    /// and values at each sequence's length and advances the lengths. A step that fails (out of
    /// memory, a failed launch) leaves every cache's lengths, and what they cover, as they
    /// were, so the same step can be run again. See [`DecoderStep`].
    pub fn run(&self, ids: &Tensor, positions: &Tensor) -> Result<Tensor> {
        let batch = self.check_inputs(ids, positions)?;
        match (&self.fused, exec(ids.device())) {
            (Some(f), Exec::Cuda(c)) if batch <= self.fused_limit.min(f.max_batch) => {
                self.run_fused(c, f, ids, positions, batch)
            }
            _ => self.unfused(ids, positions, batch),
        }
    }

    /// The step through the unfused ops (the embeddings' sum and the first norm in one
    /// `add_rms_norm`; per layer the q/k/v `linear`, `decode_attention_append`, the output
    /// projection added to the residual stream in its GEMM (`linear_residual`), `rms_norm`, the
    /// gate/up `linear`, `swiglu_packed`, the down projection through `linear_residual`, and
    /// the next norm; the head's `linear`). The one kernel's reference, and what
    /// [`DecoderStep::run`] does where that kernel does not run.
    pub fn run_unfused(&self, ids: &Tensor, positions: &Tensor) -> Result<Tensor> {
        let batch = self.check_inputs(ids, positions)?;
        self.unfused(ids, positions, batch)
    }

    /// [`DecoderStep::run_unfused`] on checked inputs of `batch` sequences. Its layers append
    /// to their caches one after the other, so a step that fails partway (out of memory, a
    /// failed launch) would leave the first layers' lengths advanced: outside a capture the
    /// lengths are copied first and put back on such a failure, so that it leaves every cache
    /// as it was (what the lengths cover; past them a failed step may have written). A full
    /// cache or a bad token is a report, not a failure: the step ran for the other sequences
    /// (on CUDA every layer; the host stops at the first layer's report), as the kernel's does.
    /// Inside a capture nothing runs, and a failure ends the capture.
    fn unfused(&self, ids: &Tensor, positions: &Tensor, batch: usize) -> Result<Tensor> {
        let lengths: Vec<&Tensor> = self.layers.iter().map(|l| &l.lengths).collect();
        let failed = |e: &Error| !matches!(e.root(), Error::CacheFull { .. } | Error::TokenOutOfRange { .. });
        restoring(&lengths, failed, |_| self.unfused_steps(ids, positions, batch))
    }

    fn unfused_steps(&self, ids: &Tensor, positions: &Tensor, batch: usize) -> Result<Tensor> {
        let d = self.tok.dims()[1];
        let tok = ops::embedding(ids, &self.tok)?;
        let pos = ops::embedding(positions, &self.pos)?;
        let first = self.layers.first().map_or(&self.head_norm, |l| &l.norm1);
        let (mut x, mut h, _) = ops::add_rms_norm(&tok, &pos, first, self.eps)?;
        for (i, l) in self.layers.iter().enumerate() {
            let view = |t: &Tensor| {
                let mut dims = t.dims().to_vec();
                dims[0] = batch;
                t.prefix_view(&dims)
            };
            let (kc, vc, lens) = (view(&l.k_cache)?, view(&l.v_cache)?, view(&l.lengths)?);
            let qkv = ops::linear(&h, &l.qkv, None)?;
            let att = ops::decode_attention_append(&qkv, &kc, &vc, &lens, self.heads)?.reshape(&[batch, d])?;
            let x2 = ops::linear_residual(&att, &l.wo, &x)?;
            let (h2, _) = ops::rms_norm(&x2, &l.norm2, self.eps)?;
            let s = ops::swiglu_packed(&ops::linear(&h2, &l.gate_up, None)?)?;
            x = ops::linear_residual(&s, &l.down, &x2)?;
            let next = self.layers.get(i + 1).map_or(&self.head_norm, |n| &n.norm1);
            (h, _) = ops::rms_norm(&x, next, self.eps)?;
        }
        ops::linear(&h, &self.head, None)
    }

    /// Checks `ids` and `positions` (f32 `[batch]` on the weights' device, `1 <= batch <=` the
    /// caches' sequences); returns `batch`.
    fn check_inputs(&self, ids: &Tensor, positions: &Tensor) -> Result<usize> {
        for (name, t) in [("ids", ids), ("positions", positions)] {
            if t.dtype() != DType::F32 {
                return Err(Error::DType { op: OP, got: t.dtype(), expected: DType::F32 });
            }
            if t.device() != self.tok.device() {
                return Err(Error::DeviceMismatch { op: OP, a: self.tok.device().name(), b: t.device().name() });
            }
            if t.dims().len() != 1 {
                return Err(Error::shape(OP, ShapeProblem::layout(name, "[batch]", t.dims())));
            }
        }
        let batch = ids.numel();
        expect(positions, "positions", &[batch], "one per id")?;
        if batch == 0 {
            return Err(Error::shape(OP, ShapeProblem::expected("ids", &[1], "at least one sequence", ids.dims())));
        }
        at_most(OP, "batch (the caches' sequences)", batch, self.cache_batch)?;
        Ok(batch)
    }

    fn run_fused(&self, c: &CudaBackend, f: &Fused, ids: &Tensor, positions: &Tensor, batch: usize) -> Result<Tensor> {
        let (d, hidden) = (f.shape.d_model, f.shape.hidden);
        let dev = ids.device();
        // x, q, att, s, x2 (bf16), then the heads' output-projection parts (f32): see the kernel.
        let work = Tensor::empty_as(dev, &[batch * (4 * d + hidden) + 2 * self.heads * batch * d], DType::BF16)?;
        let logits = Tensor::empty_as(dev, &[batch, self.head.dims()[0]], DType::BF16)?;
        let args = [
            KArg::Ptr(f.table.cuda_ptr()?),
            KArg::Ptr(ids.cuda_ptr()?),
            KArg::Ptr(positions.cuda_ptr()?),
            KArg::Ptr(logits.cuda_ptr()?),
            KArg::Ptr(work.cuda_ptr()?),
            KArg::Ptr(f.barrier.cuda_ptr()?),
            KArg::Ptr(c.err_word()),
            KArg::U32(batch as u32),
            KArg::F32(self.eps),
            KArg::Ptr(f.trace.as_ref().map_or(Ok(0), |(t, _)| t.cuda_ptr())?),
        ];
        c.launch_decoder(f.kernels.for_batch(batch), f.shape, f.kernels.grid, &args)?;
        if let Some((trace, dir)) = &f.trace {
            if !dev.is_capturing() {
                write_trace(trace, dir, f.kernels.grid, batch)?;
            }
        }
        Ok(logits)
    }
}

/// Writes the kernel's stage marks (`GRAPHED_DECODER_TRACE`, for measurements) to
/// `dir/decoder-trace-b{batch}.bin`: four little-endian u32 (grid, stages, slots, batch), then
/// the marks as u64 (`FD_TRACE` in kernels/decoder.cu says what each holds). The step has run
/// by then: a failed write says so.
fn write_trace(trace: &Tensor, dir: &std::path::Path, grid: u32, batch: usize) -> Result<()> {
    let words = trace.to_i32_vec()?;
    let mut bytes = Vec::with_capacity(16 + 4 * words.len());
    for v in [grid, TRACE_STAGES as u32, TRACE_SLOTS as u32, batch as u32] {
        bytes.extend_from_slice(&v.to_le_bytes());
    }
    for w in words {
        bytes.extend_from_slice(&w.to_le_bytes());
    }
    let path = dir.join(format!("decoder-trace-b{batch}.bin"));
    std::fs::write(&path, bytes).map_err(|e| Error::InvalidArgument {
        op: OP,
        detail: format!(
            "GRAPHED_DECODER_TRACE: the step ran, but its marks could not be written to {}: {e}",
            path.display()
        ),
    })
}
