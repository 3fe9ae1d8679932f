//! Generation's bookkeeping on the device: a batch's recorded tokens, who has stopped (on an
//! end token or a length, per sequence), and the flag a WHILE loop tests, all kept in device
//! memory and updated by one kernel per step, so a decoding loop never reads the host.

use crate::backend::{BuiltinKernel as B, KArg, LaunchDims};
use crate::error::OpError;
use crate::ops::cpu::{self, GenerationState};
use crate::ops::{at_most, exec, n32, Exec, Sampling};
use crate::{DType, Device, Error, Generator, Result, ShapeProblem, Tensor};

/// When the sequences of a batch stop: on `end` (a token id; `None`, only on their length),
/// after which each records `pad` at every later step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stop {
    /// The token that ends a sequence (recorded, and counted), if any.
    pub end: Option<u32>,
    /// What a stopped sequence records from then on.
    pub pad: u32,
}

/// The device-side state of a batch of sequences being generated: for each sequence the tokens
/// recorded so far (`[batch, max_new]`, [`DType::I32`]), how many it produced, whether it has
/// stopped and its limit; the step counter; the loop flag ([`Generation::active`], one `I32`:
/// some sequence is active and fewer than `max_new` steps ran, what a
/// [`crate::Condition::nonzero`] WHILE loop tests); and the inputs of the next decoding step,
/// the token ids to embed and their positions (f32 `[batch]`, as [`crate::ops::embedding`]
/// takes ids). [`generation_step`] updates it on the device after each sampling.
///
/// Every tensor is allocated from the device's default pool (it outlives the graphs that read
/// and write it). [`Generation::prefix`] gives views of the first sequences, for a graph
/// captured at a smaller batch.
///
/// ```
/// use graphed::ops::{self, Generation, Stop};
/// use graphed::{Device, Tensor};
/// let dev = Device::host();
/// let g = Generation::new(&dev, 2, 4)?; // 2 sequences, at most 4 tokens each
/// g.start(&[4, 2], Stop { end: Some(7), pad: 0 })?; // the second stops after 2 tokens
/// let lengths = Tensor::from_i32(&dev, &[5, 3], &[2])?; // the caches' lengths (positions)
/// for sampled in [[1, 2], [7, 3], [9, 9]] {
///     ops::generation_step(&g, &Tensor::from_i32(&dev, &sampled, &[2])?, &lengths)?;
/// }
/// // The first stopped on its end token 7, the second on its limit.
/// assert_eq!(g.tokens()?, vec![vec![1, 7], vec![2, 3]]);
/// assert_eq!((g.steps()?, g.is_active()?), (3, false));
/// assert_eq!(g.next_ids().to_vec()?, vec![0.0, 0.0]); // both pad now
/// assert_eq!(g.positions().to_vec()?, vec![5.0, 3.0]);
/// # Ok::<(), graphed::Error>(())
/// ```
#[derive(Clone, Debug)]
pub struct Generation {
    batch: usize,
    max_new: usize,
    tokens: Tensor,
    counts: Tensor,
    done: Tensor,
    limits: Tensor,
    stop: Tensor,
    step: Tensor,
    active: Tensor,
    next_ids: Tensor,
    positions: Tensor,
    /// `I32` `[1]`, zero between launches: the blocks of a greedy step that keeps the books in
    /// the same launch ([`sample_and_record`]) count themselves here.
    arrivals: Tensor,
}

impl Generation {
    /// The state of `batch` sequences of at most `max_new` tokens each, every sequence stopped
    /// until [`Generation::start`]. Both sizes must be nonzero and `batch · max_new` below
    /// 2³¹.
    pub fn new(device: &Device, batch: usize, max_new: usize) -> Result<Generation> {
        if batch == 0 || max_new == 0 || batch.checked_mul(max_new).is_none_or(|n| n > i32::MAX as usize) {
            return Err(OpError::GenerationSize { batch, max_new }.into());
        }
        device.with_pool(&device.default_pool(), || {
            let i32s = |dims: &[usize]| Tensor::from_i32(device, &vec![0; dims.iter().product()], dims);
            Ok(Generation {
                batch,
                max_new,
                tokens: i32s(&[batch, max_new])?,
                counts: i32s(&[batch])?,
                done: Tensor::from_i32(device, &vec![1; batch], &[batch])?,
                limits: i32s(&[batch])?,
                stop: Tensor::from_i32(device, &[-1, 0], &[2])?,
                step: i32s(&[1])?,
                active: i32s(&[1])?,
                next_ids: Tensor::zeros(device, &[batch])?,
                positions: Tensor::zeros(device, &[batch])?,
                arrivals: i32s(&[1])?,
            })
        })
    }

    /// Starts a new batch: sequence `b` may produce `limits[b]` tokens (at most `max_new`);
    /// the sequences past `limits.len()` (a batch padded to a graph's size) start stopped, as
    /// does a limit of 0. Every recorded token reads `stop.pad` until written, the counts and
    /// the step are zero. Writes from the host: refused during a capture, and everything is
    /// checked first (a refused call changes nothing).
    pub fn start(&self, limits: &[usize], stop: Stop) -> Result<()> {
        const OP: &str = "Generation::start";
        if limits.len() > self.batch {
            return Err(OpError::GenerationLimits { limits: limits.len(), batch: self.batch }.into());
        }
        if let Some(&l) = limits.iter().find(|&&l| l > self.max_new) {
            return Err(OpError::GenerationLimit { limit: l, max_new: self.max_new }.into());
        }
        let token = |t: u32| -> Result<i32> {
            at_most(OP, "token id", t as usize, i32::MAX as usize)?;
            Ok(t as i32)
        };
        let end = stop.end.map_or(Ok(-1), token)?;
        let pad = token(stop.pad)?;
        self.tokens.device().backend().forbid_during_capture(OP)?;
        let mut lim = vec![0i32; self.batch];
        for (l, &n) in lim.iter_mut().zip(limits) {
            *l = n as i32;
        }
        let done: Vec<i32> = lim.iter().map(|&l| i32::from(l == 0)).collect();
        self.tokens.copy_from_i32(&vec![pad; self.batch * self.max_new])?;
        self.counts.copy_from_i32(&vec![0; self.batch])?;
        self.done.copy_from_i32(&done)?;
        self.limits.copy_from_i32(&lim)?;
        self.stop.copy_from_i32(&[end, pad])?;
        self.step.copy_from_i32(&[0])?;
        self.active.copy_from_i32(&[i32::from(done.contains(&0))])?;
        self.next_ids.copy_from_slice(&vec![pad as f32; self.batch])?;
        self.positions.copy_from_slice(&vec![0.0; self.batch])
    }

    /// Views of the first `batch` sequences (the step counter, the flag and the stop tokens
    /// are shared): what a graph captured for a smaller batch reads and writes.
    pub fn prefix(&self, batch: usize) -> Result<Generation> {
        if batch == 0 || batch > self.batch {
            return Err(OpError::GenerationPrefix { batch, sequences: self.batch }.into());
        }
        let rows = |t: &Tensor| t.prefix_view(&[batch]);
        Ok(Generation {
            batch,
            tokens: self.tokens.prefix_view(&[batch, self.max_new])?,
            counts: rows(&self.counts)?,
            done: rows(&self.done)?,
            limits: rows(&self.limits)?,
            next_ids: rows(&self.next_ids)?,
            positions: rows(&self.positions)?,
            ..self.clone()
        })
    }

    /// The books' device pointers in the order the bookkeeping kernels take them (tokens,
    /// counts, done, limits, stop, step, active, next ids, positions).
    fn books_args(&self) -> Result<Vec<KArg>> {
        [&self.tokens, &self.counts, &self.done, &self.limits, &self.stop, &self.step, &self.active]
            .into_iter()
            .chain([&self.next_ids, &self.positions])
            .map(|t| Ok(KArg::Ptr(t.cuda_ptr()?)))
            .collect()
    }

    /// Sequences.
    pub fn batch(&self) -> usize {
        self.batch
    }

    /// The most tokens a sequence produces.
    pub fn max_new(&self) -> usize {
        self.max_new
    }

    /// The token ids the next decoding step embeds (f32 `[batch]`).
    pub fn next_ids(&self) -> &Tensor {
        &self.next_ids
    }

    /// The positions of those tokens (f32 `[batch]`: each sequence's cache length).
    pub fn positions(&self) -> &Tensor {
        &self.positions
    }

    /// The loop flag (`I32` `[1]`): nonzero while some sequence is active and fewer than
    /// `max_new` steps ran.
    pub fn active(&self) -> &Tensor {
        &self.active
    }

    /// The step counter (`I32` `[1]`).
    pub fn step(&self) -> &Tensor {
        &self.step
    }

    /// The recorded tokens on the device (`I32` `[batch, max_new]`, a stopped sequence's pad
    /// tokens included): what [`Generation::record`] reads, for a graph to copy out.
    pub fn recorded(&self) -> &Tensor {
        &self.tokens
    }

    /// Each sequence's tokens so far (as many as it produced; its end token included), read
    /// from the device.
    pub fn tokens(&self) -> Result<Vec<Vec<i32>>> {
        let (all, counts) = (self.tokens.to_i32_vec()?, self.counts.to_i32_vec()?);
        Ok(all
            .chunks(self.max_new)
            .zip(counts)
            .map(|(row, n)| row[..(n.max(0) as usize).min(self.max_new)].to_vec())
            .collect())
    }

    /// Every recorded column of every sequence (`[batch][max_new]`; a stopped sequence's pad
    /// tokens included), read from the device.
    pub fn record(&self) -> Result<Vec<Vec<i32>>> {
        Ok(self.tokens.to_i32_vec()?.chunks(self.max_new).map(<[i32]>::to_vec).collect())
    }

    /// Steps taken since [`Generation::start`], read from the device.
    pub fn steps(&self) -> Result<usize> {
        Ok(self.step.to_i32_vec()?[0].max(0) as usize)
    }

    /// The loop flag, read from the device.
    pub fn is_active(&self) -> Result<bool> {
        Ok(self.active.to_i32_vec()?[0] != 0)
    }
}

/// Checks that `t` is an `I32` vector `[batch]` on `like`'s device.
fn check_i32_rows(op: &'static str, name: &'static str, t: &Tensor, like: &Tensor, batch: usize) -> Result<()> {
    if t.dtype() != DType::I32 {
        return Err(Error::DType { op, got: t.dtype(), expected: DType::I32 });
    }
    if t.device() != like.device() {
        return Err(Error::DeviceMismatch { op, a: like.device().name(), b: t.device().name() });
    }
    if t.dims() != [batch] {
        return Err(Error::shape(op, ShapeProblem::expected(name, &[batch], "one per sequence", t.dims())));
    }
    t.check_fresh()
}

/// One step of generation's bookkeeping, on the device: records each sequence's `sampled`
/// token (`I32` `[batch]`, from [`crate::ops::argmax`] or a sampler) at column `step` while the
/// sequence is active, or the pad token once it stopped; an active sequence stops on the end
/// token or when it has produced its limit; then the step advances and the loop flag is set
/// (some sequence active and `step < max_new`). Also writes the next step's inputs: the
/// recorded tokens as f32 ids, and `lengths` (`I32` `[batch]`, a KV cache's lengths after this
/// step's append: the position the next token goes to) as f32 positions.
///
/// One kernel, nothing read on the host, so a decoding step captured with it runs as the body
/// of a WHILE loop that stops by itself. On the host backend the CPU reference
/// ([`cpu::generation_step`]) runs. See [`Generation`] for an example.
pub fn generation_step(generation: &Generation, sampled: &Tensor, lengths: &Tensor) -> Result<()> {
    const OP: &str = "generation_step";
    let g = generation;
    let like = &g.tokens;
    check_i32_rows(OP, "sampled", sampled, like, g.batch)?;
    check_i32_rows(OP, "lengths", lengths, like, g.batch)?;
    n32(OP, g.batch * g.max_new)?;
    let (batch, max_new) = (g.batch, g.max_new);
    match exec(like.device()) {
        Exec::Host(h) => {
            let ptrs = [&g.tokens, &g.counts, &g.done, &g.limits, &g.stop, &g.step, &g.active, sampled, lengths]
                .map(|t| t.host_ptr());
            let [tp, cp, dp, lp, sp, stp, ap, smp, lnp] = ptrs;
            let (tp, cp, dp, lp, sp, stp, ap, smp, lnp) = (tp?, cp?, dp?, lp?, sp?, stp?, ap?, smp?, lnp?);
            let (np, pp) = (g.next_ids.host_ptr()?, g.positions.host_ptr()?);
            h.run(B::GenerationStep, move || {
                let stop = sp.read_i32();
                let mut st = GenerationState {
                    tokens: tp.read_i32(),
                    counts: cp.read_i32(),
                    done: dp.read_i32(),
                    limits: lp.read_i32(),
                    stop: [stop[0], stop[1]],
                    step: stp.read_i32()[0],
                    max_new,
                };
                let (next, positions, active) = cpu::generation_step(&mut st, &smp.read_i32(), &lnp.read_i32());
                tp.write_i32(&st.tokens);
                cp.write_i32(&st.counts);
                dp.write_i32(&st.done);
                stp.write_i32(&[st.step]);
                ap.write_i32(&[i32::from(active)]);
                np.write(&next);
                pp.write(&positions);
                Ok(())
            })
        }
        Exec::Cuda(c) => {
            let mut args = g.books_args()?;
            args.extend([
                KArg::Ptr(sampled.cuda_ptr()?),
                KArg::Ptr(lengths.cuda_ptr()?),
                KArg::U32(batch as u32),
                KArg::U32(max_new as u32),
            ]);
            // One block: the flag is a block-wide OR (__syncthreads_or); its threads stride
            // over the sequences.
            let dims = LaunchDims::rows(1, (batch.div_ceil(32) * 32).clamp(32, 1024) as u32);
            // In a WHILE body that tests the flag, the same step sets the node's condition
            // (unless `GRAPHED_FOLD_CONDITION=0`): one kernel less a pass.
            match c.gate.loop_fold(g.active.cuda_ptr()?) {
                Some(handle) => c.launch_setting_loop(handle, |k| k.generation.clone(), dims, &args),
                None => c.launch(B::GenerationStep, dims, &args),
            }
        }
    }
}

/// A decoding step's sampling and bookkeeping: a token per row of `logits` (`[batch, vocab]`,
/// `batch` the generation's) as [`crate::ops::sample`] picks it, then
/// [`generation_step`] with it and `lengths`; returns the tokens (`I32` `[batch]`). The same
/// results as the two calls, which it makes, except on CUDA inside a WHILE body that tests the
/// generation's flag (unless `GRAPHED_FOLD_CONDITION=0`): there a greedy step over f32 or bf16
/// logits is one kernel that picks the tokens, keeps the books and sets the node's condition
/// (argmax, bookkeeping and condition kernel in one launch, the same tokens and books).
///
/// ```
/// use graphed::ops::{self, Generation, Sampling, Stop};
/// use graphed::{Device, Generator, Tensor};
/// let dev = Device::host();
/// let g = Generation::new(&dev, 2, 4)?;
/// g.start(&[4, 4], Stop { end: None, pad: 0 })?;
/// let logits = Tensor::from_slice(&dev, &[0.0, 3.0, 1.0, 5.0, 4.0, 2.0], &[2, 3])?;
/// let lengths = Tensor::from_i32(&dev, &[1, 1], &[2])?;
/// let rng = Generator::new(&dev, 1)?;
/// let tokens = ops::sample_and_record(&g, &logits, Sampling::greedy(), &rng, &lengths)?;
/// assert_eq!(tokens.to_i32_vec()?, vec![1, 0]);
/// assert_eq!(g.record()?, vec![vec![1, 0, 0, 0], vec![0, 0, 0, 0]]);
/// # Ok::<(), graphed::Error>(())
/// ```
pub fn sample_and_record(
    generation: &Generation,
    logits: &Tensor,
    sampling: Sampling,
    rng: &Generator,
    lengths: &Tensor,
) -> Result<Tensor> {
    const OP: &str = "sample_and_record";
    let g = generation;
    // Checked before the sampling, which may draw random numbers: a refused call changes nothing
    // (the one-kernel greedy step included).
    sampling.check()?;
    if logits.device() != g.tokens.device() {
        return Err(Error::DeviceMismatch { op: OP, a: g.tokens.device().name(), b: logits.device().name() });
    }
    if logits.dims().first() != Some(&g.batch) {
        return Err(Error::shape(
            OP,
            ShapeProblem::layout("logits", "[batch, vocab], a row per sequence", logits.dims()),
        ));
    }
    check_i32_rows(OP, "lengths", lengths, &g.tokens, g.batch)?;
    if let (Exec::Cuda(c), true, &[batch, vocab]) = (exec(logits.device()), sampling.is_greedy(), logits.dims()) {
        let is_bf16 = match logits.dtype() {
            DType::F32 => Some(false),
            DType::BF16 => Some(true),
            _ => None,
        };
        // Only where the launch can set the loop's condition: elsewhere the two calls.
        let usable = is_bf16.filter(|_| vocab > 0 && rng.device() == logits.device());
        if let (Some(is_bf16), Some(handle)) = (usable, c.gate.loop_fold(g.active.cuda_ptr()?)) {
            logits.check_fresh()?;
            n32(OP, batch * vocab)?;
            let sampled = Tensor::empty_as(logits.device(), &[batch], DType::I32)?;
            let mut args = vec![
                KArg::Ptr(logits.cuda_ptr()?),
                KArg::U32(is_bf16 as u32),
                KArg::U32(vocab as u32),
                KArg::Ptr(sampled.cuda_ptr()?),
                KArg::Ptr(g.arrivals.cuda_ptr()?),
            ];
            args.extend(g.books_args()?);
            args.extend([KArg::Ptr(lengths.cuda_ptr()?), KArg::U32(batch as u32), KArg::U32(g.max_new as u32)]);
            // A block a row, 256 threads (the argmax merge's width).
            let dims = LaunchDims::rows(batch, 256);
            c.launch_setting_loop(handle, |k| k.greedy.clone(), dims, &args)?;
            return Ok(sampled);
        }
    }
    let tokens = crate::ops::sample(logits, sampling, rng)?;
    generation_step(g, &tokens, lengths)?;
    Ok(tokens)
}
