//! Generation with the trained GPT: KV caches preallocated for the largest batch (the model's
//! dtype, `[max_batch, heads, max_len, head_dim]` per layer) and the bookkeeping on the device
//! as state, the model's own weights shared (no copy), and a request run one of four ways
//! ([`Path`]): eagerly (the graphs' shapes, or the request's exact ones), replaying one
//! captured decode graph per token, or as one graph for the whole request: the prefill, then
//! the decode step under a WHILE node (`Condition::run_while`), so that a request is one
//! launch. The decode step is captured once per batch bucket (1, 2, 4, ..., the largest; a
//! batch of 3 runs in bucket 4 with its extra row stopped from the start), the prefill and the
//! request once per (batch bucket, prompt-length bucket), all in one pool. The decode step is the fused one (`graphed::ops::DecoderStep` through
//! [`Fused`]: one kernel a step on the GPU, over the model's own stacked q/k/v and gate/up
//! weights, no copy) unless
//! [`DecodeOptions::fused_step`] is off. The passes themselves are in
//! `passes.rs`. Shared by `main.rs` and `tests/gpt_generate.rs`.
#![allow(dead_code)]

use std::time::{Duration, Instant};

use graphed::ops::{Generation, Sampling, Stop};
use graphed::{CaptureMode, Condition, Device, Error, Generator, Graph, GraphPool, Result, Tensor};

use crate::passes::{decode_step, prefill};
pub use crate::passes::{Cache, Fused, PrefillInputs, Sampler, State, Weights};

/// A host-driven loop (eager or one replay per token) reads the device's "any sequence
/// active" flag every this many steps: each read waits for the device.
pub const POLL: usize = 16;

/// How a request runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Path {
    /// Op by op, at the shapes the graphs use (the batch bucket, the prompt bucket).
    Eager,
    /// Op by op at the request's own shapes: its batch, its longest prompt.
    EagerExact,
    /// The prefill graph, then the decode graph replayed once per token.
    Replay,
    /// The request's graph: the prefill, then the decode step under a WHILE node: one launch.
    WhileLoop,
}

impl Path {
    pub fn name(self) -> &'static str {
        match self {
            Path::Eager => "eager",
            Path::EagerExact => "eager (exact shapes)",
            Path::Replay => "one graph replay per token",
            Path::WhileLoop => "WHILE loop (one launch)",
        }
    }
}

/// The decoder's sizes and sampling.
#[derive(Clone, Debug)]
pub struct DecodeOptions {
    /// The largest batch: the batch buckets are 1, 2, 4, ... below it, and it.
    pub max_batch: usize,
    /// Cache positions per sequence (prompt plus new tokens), at most the model's context.
    pub max_len: usize,
    /// The prompt lengths the prefill is captured at, ascending, each at most `max_len`.
    pub prompt_buckets: Vec<usize>,
    /// Greedy, or temperature and top-k (baked into the graphs).
    pub sampling: Sampling,
    /// The seed of the decoder's own Philox generator.
    pub seed: u64,
    /// Capture the graphs (without them only the eager paths run).
    pub graphs: bool,
    /// Decode with the fused step (`ops::DecoderStep`: on the GPU one kernel a step; elsewhere
    /// q/k/v and gate/up one GEMM each over the stacked weights, the cache append
    /// inside the attention kernel) rather than the training forward's ops. On the host the
    /// same logits; on CUDA the kernel's sums run in another order, so they can round
    /// differently in their last bits.
    pub fused_step: bool,
    /// The largest batch the fused step gives its one kernel (`DecoderStep::set_fused_batch_limit`;
    /// `None`: the step's default). Larger batches run the unfused ops.
    pub fused_batch_limit: Option<usize>,
}

/// A batch of prompts to continue: sequence `b` produces at most `max_new_tokens[b]` tokens
/// and stops early on `end`.
#[derive(Clone, Debug)]
pub struct Request {
    pub prompts: Vec<Vec<u8>>,
    pub max_new_tokens: Vec<usize>,
    pub end: Option<u8>,
}

impl Request {
    /// `prompts`, each continued by up to `n` tokens, no end token.
    pub fn new(prompts: Vec<Vec<u8>>, n: usize) -> Request {
        let max_new_tokens = vec![n; prompts.len()];
        Request { prompts, max_new_tokens, end: None }
    }

    /// The same, stopping each sequence at `end`.
    pub fn with_end(self, end: u8) -> Request {
        Request { end: Some(end), ..self }
    }
}

/// What a request produced and what running it took.
#[derive(Clone, Debug)]
pub struct Generated {
    /// Each prompt's new tokens (its end token included when it stopped on it).
    pub tokens: Vec<Vec<u8>>,
    /// The batch it ran at (its bucket, or its own size eagerly) and the prompt length.
    pub batch: usize,
    pub prompt_len: usize,
    /// Bookkeeping steps the device ran (the prefill's included).
    pub steps: usize,
    /// Host launches: graph launches, or the kernels and copies an eager run issued (counted
    /// from the graphs of the same shapes; `None` without them).
    pub launches: Option<usize>,
    /// Reads of the device's flag (each one waits for the device).
    pub syncs: usize,
}

/// The prefill of one (batch bucket, prompt bucket), alone, and a whole request: the prefill,
/// then the decode step under a WHILE node on the generation's flag, in one graph.
struct PrefillGraph {
    batch: usize,
    len: usize,
    inputs: PrefillInputs,
    graph: Graph,
    request: Graph,
    nodes: usize,
}

/// The decode step of one batch bucket: a graph to replay per token.
struct StepGraphs {
    batch: usize,
    replay: Graph,
    nodes: usize,
}

/// A trained GPT set up to generate; see the module doc.
pub struct Decoder {
    dev: Device,
    w: Weights,
    /// The fused step (with [`DecodeOptions::fused_step`]).
    fused: Option<Fused>,
    opts: DecodeOptions,
    /// Every layer's cache and the bookkeeping at `max_batch`.
    full: State,
    sampler: Sampler,
    pool: GraphPool,
    steps: Vec<StepGraphs>,
    prefills: Vec<PrefillGraph>,
    capture_time: Duration,
}

/// A refused argument of `op`.
fn invalid(op: &'static str, detail: impl std::fmt::Display) -> Error {
    Error::InvalidArgument { op, detail: detail.to_string() }
}

/// The batch buckets up to `max`: powers of two below it, then `max`.
pub fn batch_buckets(max: usize) -> Vec<usize> {
    let mut v: Vec<usize> = (0..usize::BITS).map(|i| 1usize << i).take_while(|&b| b < max).collect();
    v.push(max);
    v
}

impl State {
    /// Views of the first `batch` sequences of every cache and of the bookkeeping.
    pub fn prefix(&self, batch: usize) -> Result<State> {
        let view = |t: &Tensor| {
            let mut dims = t.dims().to_vec();
            dims[0] = batch;
            t.prefix_view(&dims)
        };
        let caches = self
            .caches
            .iter()
            .map(|c| Ok(Cache { k: view(&c.k)?, v: view(&c.v)?, lengths: view(&c.lengths)? }))
            .collect::<Result<_>>()?;
        Ok(State { caches, books: self.books.prefix(batch)? })
    }
}

impl PrefillInputs {
    /// Inputs of `[batch, len]` in the device's default pool: positions `0..len` in every row
    /// (fixed), one-token prompts of byte 0 until [`PrefillInputs::write`].
    pub fn new(dev: &Device, batch: usize, len: usize) -> Result<PrefillInputs> {
        dev.with_pool(&dev.default_pool(), || {
            let positions: Vec<f32> = (0..batch).flat_map(|_| (0..len).map(|t| t as f32)).collect();
            let last: Vec<f32> = (0..batch).map(|b| (b * len) as f32).collect();
            Ok(PrefillInputs {
                ids: Tensor::zeros(dev, &[batch, len])?,
                positions: Tensor::from_slice(dev, &positions, &[batch, len])?,
                last: Tensor::from_slice(dev, &last, &[batch])?,
                lengths: Tensor::from_i32(dev, &vec![1; batch], &[batch])?,
            })
        })
    }

    /// Writes `prompts` (at most `batch`, each nonempty and at most `len` long) right-padded
    /// with byte 0; the rows past them get a one-token prompt of byte 0.
    pub fn write(&self, prompts: &[Vec<u8>]) -> Result<()> {
        let [batch, len] = [self.ids.dims()[0], self.ids.dims()[1]];
        let mut ids = vec![0.0f32; batch * len];
        let (mut last, mut lengths) = (Vec::with_capacity(batch), Vec::with_capacity(batch));
        for b in 0..batch {
            let p = prompts.get(b).map_or(&[0u8][..], Vec::as_slice);
            for (slot, &byte) in ids[b * len..][..p.len()].iter_mut().zip(p) {
                *slot = f32::from(byte);
            }
            last.push((b * len + p.len() - 1) as f32);
            lengths.push(p.len() as i32);
        }
        self.ids.copy_from_slice(&ids)?;
        self.last.copy_from_slice(&last)?;
        self.lengths.copy_from_i32(&lengths)
    }
}

impl Decoder {
    /// Allocates the caches and the bookkeeping and, with `opts.graphs`, captures every graph.
    /// `max_len` must be at most the model's context; the buckets nonzero and ascending.
    pub fn new(dev: &Device, w: Weights, opts: DecodeOptions) -> Result<Decoder> {
        let (context, heads, d) = (w.context(), w.heads(), w.d_model());
        let bad = |what: String| Err(invalid("Decoder::new", what));
        if opts.max_batch == 0 || opts.max_len == 0 || opts.max_len > context {
            return bad(format!(
                "max_batch {} and max_len {} (at most the context, {context})",
                opts.max_batch, opts.max_len
            ));
        }
        let p = &opts.prompt_buckets;
        if p.first() == Some(&0) || p.windows(2).any(|w| w[0] >= w[1]) || p.last().is_some_and(|&l| l > opts.max_len) {
            return bad(format!("prompt buckets {p:?}: ascending, nonzero, at most max_len = {}", opts.max_len));
        }
        if opts.graphs && p.is_empty() {
            return bad("the graphs need a prompt bucket".into());
        }
        let full = dev.with_pool(&dev.default_pool(), || {
            let cache = || Tensor::zeros_as(dev, &[opts.max_batch, heads, opts.max_len, d / heads], w.dtype());
            let caches = w
                .blocks
                .iter()
                .map(|_| {
                    Ok(Cache {
                        k: cache()?,
                        v: cache()?,
                        lengths: Tensor::from_i32(dev, &vec![0; opts.max_batch], &[opts.max_batch])?,
                    })
                })
                .collect::<Result<Vec<_>>>()?;
            Ok::<_, Error>(State { caches, books: Generation::new(dev, opts.max_batch, opts.max_len)? })
        })?;
        let rng = dev.with_pool(&dev.default_pool(), || Generator::new(dev, opts.seed))?;
        let sampler = Sampler { sampling: opts.sampling, rng };
        let fused = if opts.fused_step {
            let mut f = Fused::of(&w, &full)?;
            if let Some(limit) = opts.fused_batch_limit {
                f.step.set_fused_batch_limit(limit)?;
            }
            Some(f)
        } else {
            None
        };
        let pool = dev.new_pool();
        let t0 = Instant::now();
        let (mut steps, mut prefills) = (Vec::new(), Vec::new());
        if opts.graphs {
            let cx = Capture { dev, pool: &pool, w: &w, fused: fused.as_ref(), full: &full, sampler: &sampler };
            // Largest first: the smaller captures reuse the memory the larger ones released.
            for &batch in batch_buckets(opts.max_batch).iter().rev() {
                steps.push(cx.step(batch)?);
                for &len in p.iter().rev() {
                    prefills.push(cx.prefill(batch, len)?);
                }
            }
        }
        let capture_time = t0.elapsed();
        Ok(Decoder { dev: dev.clone(), w, fused, opts, full, sampler, pool, steps, prefills, capture_time })
    }

    /// The weights (shared with the model). A load into them (`graphed::load_safetensors`)
    /// changes the model and what every graph and the fused step read (none keeps a copy).
    pub fn weights(&self) -> &Weights {
        &self.w
    }

    /// The fused step, if it is on.
    pub fn fused(&self) -> Option<&Fused> {
        self.fused.as_ref()
    }

    pub fn options(&self) -> &DecodeOptions {
        &self.opts
    }

    /// The state at the largest batch: the caches and the bookkeeping.
    pub fn state(&self) -> &State {
        &self.full
    }

    /// The sampler the passes use.
    pub fn sampler(&self) -> &Sampler {
        &self.sampler
    }

    /// How long capturing every graph took, and the pool they share (bytes reserved).
    pub fn capture_report(&self) -> (Duration, usize, usize) {
        (self.capture_time, self.steps.len() + self.prefills.len() * 2, self.pool.stats().reserved)
    }

    /// The batch a request of `n` prompts runs at on `path`.
    pub fn batch_for(&self, n: usize, path: Path) -> usize {
        match path {
            Path::EagerExact => n,
            _ => batch_buckets(self.opts.max_batch).into_iter().find(|&b| b >= n).unwrap_or(n),
        }
    }

    /// The prompt length a request whose longest prompt is `longest` is padded to on `path`:
    /// the smallest prompt bucket that holds it (eagerly, `longest` when none does).
    pub fn prompt_len_for(&self, longest: usize, path: Path) -> Option<usize> {
        let bucket = self.opts.prompt_buckets.iter().copied().find(|&l| l >= longest);
        match path {
            Path::EagerExact => Some(longest),
            Path::Eager => Some(bucket.unwrap_or(longest)),
            Path::Replay | Path::WhileLoop => bucket,
        }
    }

    /// Everything a request must satisfy, checked before anything runs: 1 to `max_batch`
    /// nonempty prompts, a limit each, and room in the cache for each prompt and its limit
    /// (else [`Error::SequenceTooLong`]); on the graph paths, graphs and a prompt bucket that
    /// holds the longest prompt. Returns (batch, prompt length).
    fn check(&self, req: &Request, path: Path) -> Result<(usize, usize)> {
        const OP: &str = "generate";
        let n = req.prompts.len();
        if n == 0 || n > self.opts.max_batch {
            return Err(invalid(OP, format!("{n} prompts: 1 to {} (the largest batch)", self.opts.max_batch)));
        }
        if req.max_new_tokens.len() != n {
            return Err(invalid(OP, format!("{} limits for {n} prompts", req.max_new_tokens.len())));
        }
        for (p, &limit) in req.prompts.iter().zip(&req.max_new_tokens) {
            if p.is_empty() {
                return Err(invalid(OP, "an empty prompt: give at least one token"));
            }
            if p.len() + limit > self.opts.max_len {
                return Err(Error::SequenceTooLong { op: OP, len: p.len() + limit, context: self.opts.max_len });
            }
        }
        let graphed = matches!(path, Path::Replay | Path::WhileLoop);
        if graphed && self.steps.is_empty() {
            return Err(invalid(OP, "this decoder captured no graphs (DecodeOptions::graphs)"));
        }
        let longest = req.prompts.iter().map(Vec::len).max().unwrap_or(1);
        let len = self.prompt_len_for(longest, path).ok_or_else(|| {
            invalid(
                OP,
                format!(
                    "a prompt of {longest} tokens: the largest prompt bucket is {:?}",
                    self.opts.prompt_buckets.last()
                ),
            )
        })?;
        Ok((self.batch_for(n, path), len))
    }

    /// Continues every prompt of `req` on `path`. Everything is checked first (a refused
    /// request changes nothing); then the bookkeeping starts (the rows past the prompts
    /// stopped), the prefill records each prompt's first new token, and the decode steps run
    /// until every sequence stopped.
    pub fn generate(&mut self, req: &Request, path: Path) -> Result<Generated> {
        let (batch, len) = self.check(req, path)?;
        let stop = Stop { end: req.end.map(u32::from), pad: u32::from(req.end.unwrap_or(0)) };
        self.full.books.start(&req.max_new_tokens, stop)?;
        let most = req.max_new_tokens.iter().copied().max().unwrap_or(0);
        let st = self.full.prefix(batch)?;
        let mut syncs = 0;
        let launches = match path {
            Path::Eager | Path::EagerExact => {
                let inputs = PrefillInputs::new(&self.dev, batch, len)?;
                inputs.write(&req.prompts)?;
                prefill(&self.w, &st, &inputs, &self.sampler)?;
                let mut steps = 0;
                // Every sequence stops within `most` tokens: the prefill's and `most - 1` steps.
                for i in 1..most {
                    if i % POLL == 0 {
                        syncs += 1;
                        if !st.books.is_active()? {
                            break;
                        }
                    }
                    decode_step(&self.w, self.fused.as_ref(), &st, &self.sampler)?;
                    steps += 1;
                }
                self.eager_launches(batch, len, steps)
            }
            Path::Replay | Path::WhileLoop => {
                let (pf, sg) = self.graphs(batch, len)?;
                pf.inputs.write(&req.prompts)?;
                if path == Path::WhileLoop {
                    pf.request.replay()?;
                    Some(1)
                } else {
                    pf.graph.replay()?;
                    let mut replays = 0;
                    for i in 1..most {
                        if i % POLL == 0 {
                            syncs += 1;
                            if !st.books.is_active()? {
                                break;
                            }
                        }
                        sg.replay.replay()?;
                        replays += 1;
                    }
                    Some(1 + replays)
                }
            }
        };
        let tokens = st.books.tokens()?;
        let tokens = tokens[..req.prompts.len()].iter().map(|t| t.iter().map(|&x| x as u8).collect()).collect();
        Ok(Generated { tokens, batch, prompt_len: len, steps: st.books.steps()?, launches, syncs })
    }

    /// The prefill graph of (batch, len) and the decode graphs of `batch`.
    fn graphs(&mut self, batch: usize, len: usize) -> Result<(&mut PrefillGraph, &mut StepGraphs)> {
        let missing = || Error::msg(format!("no graphs captured for batch {batch}, prompt length {len}"));
        let pf = self.prefills.iter_mut().find(|p| p.batch == batch && p.len == len).ok_or_else(missing)?;
        let sg = self.steps.iter_mut().find(|s| s.batch == batch).ok_or_else(missing)?;
        Ok((pf, sg))
    }

    /// The device operations an eager run at (batch, len) with `steps` decode steps issued:
    /// those of the graphs captured at the same shapes.
    fn eager_launches(&self, batch: usize, len: usize, steps: usize) -> Option<usize> {
        let pf = self.prefills.iter().find(|p| p.batch == batch && p.len == len)?;
        let sg = self.steps.iter().find(|s| s.batch == batch)?;
        Some(pf.nodes + steps * sg.nodes)
    }

    /// The device operations of one decode step at `batch` (its graph's nodes), if captured.
    pub fn step_nodes(&self, batch: usize) -> Option<usize> {
        self.steps.iter().find(|s| s.batch == batch).map(|s| s.nodes)
    }
}

/// What capturing needs, borrowed from the decoder being built.
struct Capture<'a> {
    dev: &'a Device,
    pool: &'a GraphPool,
    w: &'a Weights,
    fused: Option<&'a Fused>,
    full: &'a State,
    sampler: &'a Sampler,
}

impl Capture<'_> {
    /// A graph of `f` in the shared pool, a replay group of its own: every graph reads and
    /// writes only the caches and the bookkeeping, which live outside the pool, so any graph
    /// may replay after any other.
    fn graph(&self, label: String, f: impl Fn() -> Result<()>) -> Result<Graph> {
        self.pool.begin_replay_group();
        let mut g = Graph::with_pool(self.dev, self.pool);
        g.set_label(label);
        g.capture(CaptureMode::Global, f)?;
        Ok(g)
    }

    /// On CUDA, one eager run of `f` in the pool before its capture (the pool grows outside
    /// the capture), the generator's state and the caches' lengths put back after.
    fn warm_up(&self, f: impl Fn() -> Result<()>) -> Result<()> {
        if self.dev.is_host() {
            return Ok(());
        }
        let saved = self.sampler.rng.save()?;
        self.dev.with_pool(self.pool, f)?;
        self.sampler.rng.restore(&saved)?;
        for c in &self.full.caches {
            c.lengths.copy_from_i32(&vec![0; c.lengths.numel()])?;
        }
        Ok(())
    }

    fn step(&self, batch: usize) -> Result<StepGraphs> {
        let st = self.full.prefix(batch)?;
        let run = || decode_step(self.w, self.fused, &st, self.sampler).map(drop);
        self.warm_up(run)?;
        let replay = self.graph(format!("decode step, batch {batch}"), run)?;
        let nodes = replay.nodes()?.len();
        Ok(StepGraphs { batch, replay, nodes })
    }

    fn prefill(&self, batch: usize, len: usize) -> Result<PrefillGraph> {
        let st = self.full.prefix(batch)?;
        let inputs = PrefillInputs::new(self.dev, batch, len)?;
        let run = || prefill(self.w, &st, &inputs, self.sampler).map(drop);
        self.warm_up(run)?;
        let graph = self.graph(format!("prefill, batch {batch}, prompt length {len}"), run)?;
        let nodes = graph.nodes()?.len();
        // The whole request: the prefill, then a decode step per pass of a WHILE node while
        // some sequence is active (Condition::run_while), in one graph: one launch.
        let active = Condition::nonzero(st.books.active())?;
        let step = || decode_step(self.w, self.fused, &st, self.sampler).map(drop);
        self.warm_up(|| {
            run()?;
            step()
        })?;
        let request = self.graph(format!("request, batch {batch}, prompt length {len}"), || {
            run()?;
            active.run_while(step)
        })?;
        Ok(PrefillGraph { batch, len, inputs, graph, request, nodes })
    }
}
