//! Training, evaluation and sampling of the GPT of `model.rs`, run in one of four ways (`Mode`):
//! eager; one graph per module (embedding, each block, head) called one by one; the same graphs
//! fused into one launch per step; or the whole step captured as one graph (our floor).
#![allow(dead_code)]

use graphed::optim::{AdamW, AdamWConfig, MixedAdamW, WarmupCosine};
use graphed::{
    ops, BucketReport, Buckets, CaptureMode, Cx, DType, Device, Error, Graph, Module, Parameters, PoolEstimate, Result,
    Tensor,
};

use crate::model::{Block, Config, Embed, Gpt, GptExtraInputs, GptGradOutputs, GptInputs, GraphedGpt, Head, VOCAB};
use crate::pipeline::{Pipeline, Stages, MICROBATCHES};

/// How a step runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Every op launched from the host.
    Eager,
    /// One forward and one backward graph per module, called module by module (odd blocks
    /// optionally checkpointed); the optimizer step is one more graph.
    Graphed,
    /// The same graphs fused into one executable graph: one launch per step, plus the
    /// optimizer's graph.
    Fused,
    /// The whole step (forward, loss, backward, optimizer) captured as one graph after two
    /// eager steps: what the per-module graphs are measured against.
    Floor,
    /// Two pipeline chunks over `pipeline::MICROBATCHES` microbatches in an interleaved order,
    /// graphed per (chunk, microbatch) and replayed as one launch (`pipeline.rs`).
    Pipeline,
    /// The same pipeline schedule, eager.
    PipelineEager,
}

impl Mode {
    pub fn name(self) -> &'static str {
        match self {
            Mode::Eager => "eager",
            Mode::Graphed => "one graph per module",
            Mode::Fused => "per-module graphs fused into one launch",
            Mode::Floor => "whole step as one graph",
            Mode::Pipeline => "2 pipeline chunks x 4 microbatches, graphed, one launch",
            Mode::PipelineEager => "2 pipeline chunks x 4 microbatches, eager",
        }
    }

    /// Microbatches per step.
    pub fn microbatches(self) -> usize {
        match self {
            Mode::Pipeline | Mode::PipelineEager => MICROBATCHES,
            _ => 1,
        }
    }
}

/// AdamW over f32 weights, or over f32 masters behind 16-bit weights.
pub enum Optimizer {
    F32(AdamW),
    Mixed(MixedAdamW),
}

impl Optimizer {
    fn new(gpt: &Gpt, lr: f32, weight_decay: f32, dtype: DType) -> Result<Optimizer> {
        let cfg = AdamWConfig { lr, weight_decay, ..Default::default() };
        Ok(match dtype {
            DType::F32 => Optimizer::F32(AdamW::from_module(gpt, cfg)?),
            _ => Optimizer::Mixed(MixedAdamW::new(&gpt.trainable_params(), cfg, None)?),
        })
    }

    fn with_schedule(self, s: WarmupCosine) -> Result<Optimizer> {
        Ok(match self {
            Optimizer::F32(o) => Optimizer::F32(o.with_schedule(s)?),
            Optimizer::Mixed(o) => Optimizer::Mixed(o.with_schedule(s)?),
        })
    }

    /// One update, the grads zeroed by the update kernels (capturable).
    fn step(&self) -> Result<()> {
        match self {
            Optimizer::F32(o) => o.step_and_zero_grad(),
            Optimizer::Mixed(o) => o.step_and_zero_grad(),
        }
    }
}

/// The modules, as the mode runs them.
pub enum Modules {
    Eager(Box<Gpt>),
    Graphed(GraphedGpt),
    Pipeline(Pipeline),
}

/// The floor's graph (captured after the eager steps left) and its static buffers.
struct Floor {
    graph: Graph,
    loss: Option<Tensor>,
    ids: Tensor,
    labels: Tensor,
    eager_left: usize,
}

/// A model with its optimizer.
pub struct Trainer {
    pub cfg: Config,
    pub mode: Mode,
    pub modules: Modules,
    opt: Optimizer,
    /// The optimizer step captured as one graph (graphed and fused modes).
    opt_graph: Option<Graph>,
    floor: Option<Floor>,
    /// `[1]` f32 ones: the loss grad.
    one: Tensor,
    dev: Device,
    /// The sequence buckets the graphed modes captured, ascending (`None`: the context only).
    buckets: Option<Vec<usize>>,
}

/// A small deterministic generator (xorshift64*) for batch offsets and sampling.
pub struct Rng(pub u64);

impl Rng {
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in [0, 1).
    pub fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Graphs the model (`GraphedGpt`: the embedding, each block and the head, chained, in one
/// pool); blocks 2, 4, ... recompute their activations in their backward unless `checkpoint` is
/// off.
fn graph_model(
    dev: &Device,
    cfg: &Config,
    mut gpt: Gpt,
    checkpoint: bool,
    buckets: Option<&[usize]>,
) -> Result<GraphedGpt> {
    let ids = Tensor::zeros(dev, &[cfg.batch, cfg.context])?;
    let labels = Tensor::zeros(dev, &[cfg.batch, cfg.context])?;
    let options = if checkpoint { GraphedGpt::options() } else { GraphedGpt::options().no_checkpoint() };
    let options = match buckets {
        Some(sizes) => {
            // The embedding's position ids of every bucket's shape, made before the capture.
            for &s in sizes {
                gpt.embed.cache_positions(cfg.batch, s)?;
            }
            // Ids (the first chunk's input 0) pad with byte 0, labels (the head's input 1) with
            // the label the loss ignores.
            options.buckets(Buckets::new(1, sizes.iter().copied()).pad(1, ops::IGNORE_LABEL))
        }
        None => options,
    };
    Ok(GraphedGpt::new(gpt, GptInputs { ids }, GptExtraInputs { labels }, options)?)
}

/// The pool the graphed modes will reserve for `buckets` (ascending, the last the context),
/// estimated before capturing them (`graphed::estimate_pool`: the three smallest buckets
/// captured alone, their use fitted and extrapolated): the same modules, samples and options
/// `GraphedGpt` captures with, on a model of the same sizes.
pub fn estimate_bucket_pool(dev: &Device, cfg: &Config, checkpoint: bool, buckets: &[usize]) -> Result<PoolEstimate> {
    let mut gpt = Gpt::new(dev, cfg, 7)?;
    for &s in buckets {
        gpt.embed.cache_positions(cfg.batch, s)?;
    }
    let Gpt { embed, blocks, head } = gpt;
    let layers = blocks.len();
    let mut modules: Vec<Box<dyn Module>> = vec![Box::new(embed)];
    modules.extend(blocks.into_iter().map(|b| Box::new(b) as Box<dyn Module>));
    modules.push(Box::new(head));
    // A chained struct's samples: the first chunk's ids, nothing for the chained inputs, the
    // head's labels.
    let (ids, labels) =
        (Tensor::zeros(dev, &[cfg.batch, cfg.context])?, Tensor::zeros(dev, &[cfg.batch, cfg.context])?);
    let mut samples = vec![vec![vec![Some(ids)]]];
    samples.extend((0..layers).map(|_| vec![vec![None]]));
    samples.push(vec![vec![None, Some(labels)]]);
    // Blocks 2, 4, ... checkpointed, as `#[graphed(checkpoint_every = 2)]` says (chunk 1 is
    // the embedding).
    let checkpointed: Vec<usize> =
        if checkpoint { (1..layers).step_by(2).map(|layer| layer + 2).collect() } else { Vec::new() };
    let options = GraphedGpt::options()
        .chained(true)
        .checkpoint(checkpointed)
        .buckets(Buckets::new(1, buckets.iter().copied()).pad(1, ops::IGNORE_LABEL));
    let (estimate, _modules) = graphed::estimate_pool(modules, samples, options)?;
    Ok(estimate)
}

impl Trainer {
    /// A fresh model from `seed`, run as `mode` (graphs are captured here; `checkpoint`
    /// checkpoints blocks 1, 3, 5, ... in the graphed modes).
    pub fn new(dev: &Device, cfg: Config, seed: u64, lr: f32, mode: Mode, checkpoint: bool) -> Result<Trainer> {
        Trainer::with_buckets(dev, cfg, seed, (lr, 0.0), mode, checkpoint, None)
    }

    /// [`Trainer::new`] for sequences of any length up to the context: the graphed modes
    /// capture one bucket per length in `buckets` (ascending, the last the context) into one
    /// pool, and a step of a shorter batch replays the smallest bucket that holds it. `(lr,
    /// weight_decay)` configure AdamW (its decoupled decay applies to every parameter).
    pub fn with_buckets(
        dev: &Device,
        cfg: Config,
        seed: u64,
        (lr, weight_decay): (f32, f32),
        mode: Mode,
        checkpoint: bool,
        buckets: Option<Vec<usize>>,
    ) -> Result<Trainer> {
        if buckets.as_ref().is_some_and(|b| b.last() != Some(&cfg.context)) {
            return Err(Error::msg(format!("the largest sequence bucket must be the context, {}", cfg.context)));
        }
        let gpt = Gpt::new(dev, &cfg, seed)?;
        let opt = Optimizer::new(&gpt, lr, weight_decay, cfg.dtype)?;
        let modules = match mode {
            Mode::Eager | Mode::Floor => Modules::Eager(Box::new(gpt)),
            Mode::Graphed | Mode::Fused => {
                Modules::Graphed(graph_model(dev, &cfg, gpt, checkpoint, buckets.as_deref())?)
            }
            Mode::Pipeline | Mode::PipelineEager => {
                Modules::Pipeline(Pipeline::new(dev, &cfg, gpt, mode == Mode::Pipeline)?)
            }
        };
        let floor = (mode == Mode::Floor)
            .then(|| -> Result<Floor> {
                let ids = Tensor::zeros(dev, &[cfg.batch, cfg.context])?;
                let labels = Tensor::zeros(dev, &[cfg.batch, cfg.context])?;
                let mut graph = Graph::new(dev);
                graph.set_label("GPT step");
                Ok(Floor { graph, loss: None, ids, labels, eager_left: 2 })
            })
            .transpose()?;
        let one = Tensor::full(dev, &[1], 1.0)?;
        let mut t = Trainer { cfg, mode, modules, opt, opt_graph: None, floor, one, dev: dev.clone(), buckets };
        if let (Mode::Fused, Modules::Graphed(g)) = (mode, &mut t.modules) {
            g.fuse()?;
        }
        Ok(t)
    }

    pub fn device(&self) -> &Device {
        &self.dev
    }

    /// Has the optimizer compute its learning rate on the device at every step.
    pub fn with_schedule(mut self, schedule: WarmupCosine) -> Result<Trainer> {
        self.opt = self.opt.with_schedule(schedule)?;
        Ok(self)
    }

    /// The graph pool's reserved bytes (the modules' graphs, or the floor's graph; 0 eager).
    pub fn pool_bytes(&self) -> usize {
        match (&self.modules, &self.floor) {
            (Modules::Graphed(g), _) => g.inner().pool().stats().reserved,
            (Modules::Pipeline(Pipeline { stages: Stages::Graphed(g), .. }), _) => g.inner().pool().stats().reserved,
            (_, Some(Floor { graph, loss: Some(_), .. })) => graph.pool().stats().reserved,
            _ => 0,
        }
    }

    /// The sequence buckets, ascending, if any.
    pub fn buckets(&self) -> Option<&[usize]> {
        self.buckets.as_deref()
    }

    /// What capturing each bucket took (graphed modes with buckets).
    pub fn bucket_reports(&self) -> Vec<BucketReport> {
        match &self.modules {
            Modules::Graphed(g) => g.inner().bucket_reports().to_vec(),
            _ => Vec::new(),
        }
    }

    /// The bucket a batch of `seq` positions runs in: the smallest that holds it (the
    /// context without buckets).
    pub fn bucket_of(&self, seq: usize) -> usize {
        self.buckets.as_ref().and_then(|b| b.iter().copied().find(|s| *s >= seq)).unwrap_or(self.cfg.context)
    }

    /// Ids and labels `[batch, seq]` padded to `[batch, len]` as a graphed bucket pads them
    /// (ids with byte 0, labels with the ignored label): what eager runs to compare bit for bit.
    pub fn padded(&self, ids: &Tensor, labels: &Tensor, len: usize) -> Result<(Tensor, Tensor)> {
        let pad = |t: &Tensor, value: f32| -> Result<Tensor> {
            let (&[batch, seq], v) = (t.dims(), t.to_vec()?) else {
                return Err(Error::msg(format!("[batch, seq] expected, got {:?}", t.dims())));
            };
            let mut out = vec![value; batch * len];
            for b in 0..batch {
                out[b * len..][..seq].copy_from_slice(&v[b * seq..][..seq]);
            }
            Tensor::from_slice(t.device(), &out, &[batch, len])
        };
        Ok((pad(ids, 0.0)?, pad(labels, graphed::ops::IGNORE_LABEL)?))
    }

    /// Block `i`, wherever it lives.
    pub fn block(&self, i: usize) -> Result<&Block> {
        match &self.modules {
            Modules::Eager(m) => Ok(&m.blocks[i]),
            Modules::Pipeline(p) => {
                let (first, last) = p.stages()?;
                let n = first.blocks.len();
                Ok(if i < n { &first.blocks[i] } else { &last.blocks[i - n] })
            }
            Modules::Graphed(g) => g.module_blocks(i).ok_or_else(|| Error::msg(format!("no block {i}"))),
        }
    }

    pub fn embed(&self) -> Result<&Embed> {
        match &self.modules {
            Modules::Eager(m) => Ok(&m.embed),
            Modules::Pipeline(p) => Ok(&p.stages()?.0.embed),
            Modules::Graphed(g) => Ok(g.module_embed()),
        }
    }

    pub fn head(&self) -> Result<&Head> {
        match &self.modules {
            Modules::Eager(m) => Ok(&m.head),
            Modules::Pipeline(p) => Ok(&p.stages()?.1.head),
            Modules::Graphed(g) => Ok(g.module_head()),
        }
    }

    /// One training step on `mode.microbatches()` pairs of ids `[batch / microbatches,
    /// context]` and next-byte labels (flat); returns the loss (a `[1]` tensor, still on the
    /// device).
    pub fn step(&mut self, batches: &[(Tensor, Tensor)]) -> Result<Tensor> {
        if let Modules::Pipeline(p) = &mut self.modules {
            let loss = p.step(batches)?;
            if self.mode == Mode::PipelineEager {
                self.opt.step()?;
            } else {
                self.opt_graph_step()?;
            }
            return Ok(loss);
        }
        let [(ids, labels)] = batches else {
            return Err(Error::msg(format!("one batch per step, got {}", batches.len())));
        };
        let loss = match self.mode {
            Mode::Eager => {
                let one = self.one.clone();
                eager_step(self.eager_model()?, &one, ids, labels)?
            }
            Mode::Floor => return self.floor_step(ids, labels),
            Mode::Graphed => self.graphed_step(ids, labels)?,
            Mode::Fused => self.fused_step(ids, labels)?,
            Mode::Pipeline | Mode::PipelineEager => return Err(Error::msg("a pipeline without its stages")),
        };
        if self.mode == Mode::Eager {
            self.opt.step()?;
        } else {
            self.opt_graph_step()?;
        }
        Ok(loss)
    }

    fn eager_model(&mut self) -> Result<&mut Gpt> {
        match &mut self.modules {
            Modules::Eager(m) => Ok(m),
            _ => Err(Error::msg("the model is not eager")),
        }
    }

    fn graphed(&mut self) -> Result<&mut GraphedGpt> {
        match &mut self.modules {
            Modules::Graphed(g) => Ok(g),
            _ => Err(Error::msg("the model is not graphed")),
        }
    }

    /// The optimizer's step as a graph of its own, captured at the first call.
    fn opt_graph_step(&mut self) -> Result<()> {
        if self.opt_graph.is_none() {
            let mut g = Graph::new(&self.dev);
            g.set_label("AdamW step");
            let opt = &self.opt;
            g.capture(CaptureMode::Global, || opt.step())?;
            self.opt_graph = Some(g);
        }
        self.opt_graph.as_mut().map_or(Ok(()), Graph::replay)
    }

    /// Every chunk's forward graph, then every backward graph, replayed one by one.
    fn graphed_step(&mut self, ids: &Tensor, labels: &Tensor) -> Result<Tensor> {
        let dloss = self.one.clone();
        let g = self.graphed()?;
        let loss = g.forward(GptInputs { ids: ids.clone() }, GptExtraInputs { labels: labels.clone() })?.output_0;
        g.backward(GptGradOutputs { dloss })?;
        Ok(loss)
    }

    /// The same graphs as one launch.
    fn fused_step(&mut self, ids: &Tensor, labels: &Tensor) -> Result<Tensor> {
        let dloss = self.one.clone();
        let g = self.graphed()?;
        let (inputs, extras) = (GptInputs { ids: ids.clone() }, GptExtraInputs { labels: labels.clone() });
        Ok(g.step(inputs, extras, GptGradOutputs { dloss })?.output_0)
    }

    /// Eager steps in the floor graph's pool (so its blocks are there when the capture asks
    /// for them, as PyTorch's warm-up fills its caching allocator), then one capture of the
    /// whole step, replayed from then on.
    fn floor_step(&mut self, ids: &Tensor, labels: &Tensor) -> Result<Tensor> {
        let Trainer { modules: Modules::Eager(gpt), floor: Some(f), opt, one, dev, .. } = self else {
            return Err(Error::msg("not a floor trainer"));
        };
        let pool = f.graph.pool().clone();
        if f.eager_left > 0 {
            f.eager_left -= 1;
            return dev.with_pool(&pool, || {
                let loss = eager_step(gpt, one, ids, labels)?;
                opt.step()?;
                // The loss leaves the pool: the caller keeps it past the next step.
                dev.with_pool(&dev.default_pool(), || loss.deep_clone())
            });
        }
        f.ids.copy_(ids)?;
        f.labels.copy_(labels)?;
        if f.loss.is_none() {
            let (fids, flabels) = (&f.ids, &f.labels);
            let loss = f.graph.capture(CaptureMode::Global, || {
                let loss = eager_step(gpt, one, fids, flabels)?;
                opt.step()?;
                Ok(loss)
            })?;
            f.loss = Some(loss);
        }
        f.graph.replay()?;
        f.loss.clone().ok_or_else(|| Error::msg("no floor graph"))
    }

    /// The last block's output for `ids` `[batch, seq]` (any `seq` up to the context), eagerly.
    fn hidden(&self, ids: &Tensor) -> Result<Tensor> {
        let (mut h, _) = self.embed()?.embed(ids)?;
        for i in 0..self.cfg.layers {
            let mut cx = Cx::new(&self.dev);
            cx.set_training(false); // no dropout
            h = self.block(i)?.forward(&mut cx, &h)?;
        }
        Ok(h)
    }

    /// The mean loss on a batch, without training (eager, so any batch size works).
    pub fn eval_loss(&self, ids: &Tensor, labels: &Tensor) -> Result<f32> {
        let (logits, _, _) = self.head()?.logits(&self.hidden(ids)?)?;
        let labels = labels.reshape(&[labels.numel()])?;
        Ok(graphed::ops::softmax_cross_entropy(&logits, &labels)?.0.to_vec()?[0])
    }

    /// `n` bytes sampled after `prompt` (at temperature 0.8), reading at most the context.
    pub fn generate(&self, prompt: &[u8], n: usize, rng: &mut Rng) -> Result<Vec<u8>> {
        let mut text = if prompt.is_empty() { vec![b'\n'] } else { prompt.to_vec() };
        let start = text.len();
        for _ in 0..n {
            let window = &text[text.len().saturating_sub(self.cfg.context)..];
            let ids: Vec<f32> = window.iter().map(|b| *b as f32).collect();
            let h = self.hidden(&Tensor::from_slice(&self.dev, &ids, &[1, ids.len()])?)?;
            let logits = self.head()?.logits(&h)?.0.to_vec()?;
            let last = &logits[(ids.len() - 1) * VOCAB..];
            let m = last.iter().fold(f32::NEG_INFINITY, |m, v| m.max(*v)) as f64;
            let w: Vec<f64> = last.iter().map(|v| ((*v as f64 - m) / 0.8).exp()).collect();
            let mut r = rng.uniform() * w.iter().sum::<f64>();
            let pick = w.iter().position(|p| {
                r -= p;
                r <= 0.0
            });
            text.push(pick.unwrap_or(VOCAB - 1) as u8);
        }
        Ok(text[start..].to_vec())
    }

    /// Every parameter's bits, by name (the runs of different modes are compared with these).
    pub fn param_bits(&self) -> Result<Vec<(String, Vec<u32>)>> {
        let mut named = self.embed()?.parameters();
        for i in 0..self.cfg.layers {
            named.extend(self.block(i)?.parameters().into_iter().map(|(n, p)| (format!("blocks.{i}.{n}"), p)));
        }
        named.extend(self.head()?.parameters());
        named.into_iter().map(|(name, p)| Ok((name, p.value.to_vec()?.iter().map(|v| v.to_bits()).collect()))).collect()
    }
}

/// Forward and backward of the whole model, eagerly (also what the floor captures); the grads
/// accumulate, the optimizer is left to the caller.
fn eager_step(gpt: &mut Gpt, one: &Tensor, ids: &Tensor, labels: &Tensor) -> Result<Tensor> {
    let dev = ids.device().clone();
    let mut cxs: Vec<Cx> = (0..gpt.blocks.len() + 2).map(|_| Cx::new(&dev)).collect();
    let (ce, rest) = cxs.split_first_mut().ok_or_else(|| Error::msg("no contexts"))?;
    let (ch, cb) = rest.split_last_mut().ok_or_else(|| Error::msg("no contexts"))?;
    let mut h = gpt.embed.forward(ce, ids)?;
    for (b, cx) in gpt.blocks.iter().zip(cb.iter_mut()) {
        h = b.forward(cx, &h)?;
    }
    let loss = gpt.head.forward(ch, &h, labels)?;
    let (mut d, _) = gpt.head.backward(ch, one)?;
    for (b, cx) in gpt.blocks.iter_mut().zip(cb.iter_mut()).rev() {
        d = b.backward(cx, &d.ok_or_else(|| Error::msg("no grad reached a block"))?)?;
    }
    gpt.embed.backward(ce, &d.ok_or_else(|| Error::msg("no grad reached the embedding"))?)?;
    Ok(loss)
}
