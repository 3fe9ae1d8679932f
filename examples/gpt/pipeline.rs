//! The pipeline variant of the GPT: two chunks, the embedding with the first half of the blocks
//! and the second half with the head, over `MICROBATCHES` microbatches of the batch in an
//! interleaved order (at most two microbatches in flight), as Megatron and Transformer Engine
//! schedule pipeline chunks. Graphed, each (chunk, microbatch) gets its own graphs and the
//! whole schedule replays as one launch; eager, the same calls run op by op in the same order
//! (`GraphedPipelinedGpt::ORDER`), so both train bit for bit alike (tests/gpt.rs).
#![allow(dead_code)]

use graphed::{graphed, ops, Cx, Device, Error, OrderEntry, Param, Parameters, Result, Tensor};

use crate::model::{Block, Config, Embed, Gpt, Head};

/// Microbatches per step.
pub const MICROBATCHES: usize = GraphedPipelinedGpt::MICROBATCHES;

/// Chunk 1: token ids `[mb, context]` to the hidden state after the first half of the blocks.
#[derive(Parameters)]
pub struct FirstStage {
    pub embed: Embed,
    pub blocks: Vec<Block>,
}

#[graphed(warmup = 2)]
impl FirstStage {
    pub fn forward(&self, cx: &mut Cx, ids: &Tensor) -> Result<Tensor> {
        let mut h = self.embed.forward(cx.child(0), ids)?;
        for (i, b) in self.blocks.iter().enumerate() {
            h = b.forward(cx.child(i + 1), &h)?;
        }
        Ok(h)
    }

    pub fn backward(&mut self, cx: &mut Cx, dh: &Tensor) -> Result<Option<Tensor>> {
        let mut d = dh.clone();
        for (i, b) in self.blocks.iter_mut().enumerate().rev() {
            d = b.backward(cx.child(i + 1), &d)?.ok_or_else(|| Error::msg("a block returned no input grad"))?;
        }
        self.embed.backward(cx.child(0), &d)
    }
}

/// Chunk 2: the hidden state and the labels to the microbatch's mean loss.
#[derive(Parameters)]
pub struct LastStage {
    pub blocks: Vec<Block>,
    pub head: Head,
}

#[graphed(warmup = 2)]
impl LastStage {
    pub fn forward(&self, cx: &mut Cx, x: &Tensor, labels: &Tensor) -> Result<Tensor> {
        let mut h = x.clone();
        for (i, b) in self.blocks.iter().enumerate() {
            h = b.forward(cx.child(i), &h)?;
        }
        self.head.forward(cx.child(self.blocks.len()), &h, labels)
    }

    /// `dloss` is the microbatch's share of the step's loss grad (1 / microbatches).
    pub fn backward(&mut self, cx: &mut Cx, dloss: &Tensor) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let n = self.blocks.len();
        let (mut d, _) = self.head.backward(cx.child(n), dloss)?;
        for (i, b) in self.blocks.iter_mut().enumerate().rev() {
            d = b.backward(cx.child(i), &d.ok_or_else(|| Error::msg("no grad reached a block"))?)?;
        }
        Ok((d, None))
    }
}

/// The model as two pipeline stages, chained: the first stage's output is the last one's input.
/// The schedule keeps at most two of the four microbatches in flight:
/// `[1, 2, 1, 2, -2, -1, 1, 2, -2, -1, 1, 2, -2, -1, -2, -1]` (`GraphedPipelinedGpt::ORDER`).
#[graphed(warmup = 2, chained, order = windowed(microbatches = 4, in_flight = 2))]
pub struct PipelinedGpt {
    pub first: FirstStage,
    pub last: LastStage,
}

/// The two stages of a model.
pub fn split(gpt: Gpt) -> PipelinedGpt {
    let Gpt { embed, mut blocks, head } = gpt;
    let second = blocks.split_off(blocks.len() / 2);
    PipelinedGpt { first: FirstStage { embed, blocks }, last: LastStage { blocks: second, head } }
}

/// The stages, eager or graphed.
pub enum Stages {
    Eager(Box<PipelinedGpt>),
    Graphed(GraphedPipelinedGpt),
}

/// The pipelined model: its stages and the per-microbatch inputs of one step.
pub struct Pipeline {
    pub stages: Stages,
    /// `1 / MICROBATCHES`, `[1]`: each microbatch's loss grad.
    share: Tensor,
}

impl Pipeline {
    /// The stages of `gpt`, graphed (the whole schedule fused into one launch) or eager.
    pub fn new(dev: &Device, cfg: &Config, gpt: Gpt, graphed: bool) -> Result<Pipeline> {
        if !cfg.batch.is_multiple_of(MICROBATCHES) || cfg.layers < 2 {
            return Err(Error::msg(format!(
                "the pipeline needs a batch divisible by {MICROBATCHES} and at least 2 layers"
            )));
        }
        let mut stages = split(gpt);
        stages.first.embed.cache_positions(cfg.batch / MICROBATCHES, cfg.context)?;
        let share = Tensor::full(dev, &[1], 1.0 / MICROBATCHES as f32)?;
        let stages = if graphed {
            let mb = cfg.batch / MICROBATCHES;
            let ids = Tensor::zeros(dev, &[mb, cfg.context])?;
            let labels = Tensor::zeros(dev, &[mb, cfg.context])?;
            let mut g = stages.make_graphed(PipelinedGptInputs { ids }, PipelinedGptExtraInputs { labels })?;
            g.fuse()?;
            Stages::Graphed(g)
        } else {
            Stages::Eager(Box::new(stages))
        };
        Ok(Pipeline { stages, share })
    }

    /// One step's forwards and backwards over `MICROBATCHES` microbatches of (ids `[mb,
    /// context]`, labels `[mb · context]`); grads accumulate. Returns the mean of their losses.
    pub fn step(&mut self, batches: &[(Tensor, Tensor)]) -> Result<Tensor> {
        if batches.len() != MICROBATCHES {
            return Err(Error::msg(format!("the pipeline takes {MICROBATCHES} microbatches, got {}", batches.len())));
        }
        let losses = match &mut self.stages {
            Stages::Graphed(g) => fused_step(g, batches, &self.share)?,
            Stages::Eager(stages) => eager_step(&mut stages.first, &mut stages.last, batches, &self.share)?,
        };
        let mut total = losses[0].clone();
        for l in &losses[1..] {
            total = ops::add(&total, l)?;
        }
        ops::scale(&total, 1.0 / MICROBATCHES as f32)
    }

    /// The model's parameters (for the optimizer).
    pub fn params(&self) -> Result<Vec<Param>> {
        let (first, last) = self.stages()?;
        Ok(first.trainable_params().into_iter().chain(last.trainable_params()).collect())
    }

    pub fn stages(&self) -> Result<(&FirstStage, &LastStage)> {
        match &self.stages {
            Stages::Eager(stages) => Ok((&stages.first, &stages.last)),
            Stages::Graphed(g) => Ok((g.module_first(), g.module_last())),
        }
    }
}

/// The schedule as one launch, each microbatch's ids, labels and loss grad in, its loss out.
fn fused_step(g: &mut GraphedPipelinedGpt, batches: &[(Tensor, Tensor)], share: &Tensor) -> Result<Vec<Tensor>> {
    let microbatch = |m: usize| {
        let (ids, labels) = batches[m].clone();
        (
            PipelinedGptInputs { ids },
            PipelinedGptExtraInputs { labels },
            PipelinedGptGradOutputs { dloss: share.clone() },
        )
    };
    Ok(g.step(std::array::from_fn(microbatch))?.into_iter().map(|out| out.output_0).collect())
}

/// `GraphedPipelinedGpt::ORDER`, op by op.
fn eager_step(
    first: &mut FirstStage,
    last: &mut LastStage,
    batches: &[(Tensor, Tensor)],
    share: &Tensor,
) -> Result<Vec<Tensor>> {
    let dev = share.device().clone();
    let mut cxs: Vec<[Cx; 2]> = (0..MICROBATCHES).map(|_| [Cx::new(&dev), Cx::new(&dev)]).collect();
    let (mut hidden, mut losses, mut grads) = (Vec::new(), Vec::new(), Vec::new());
    let (mut fwd, mut bwd) = ([0usize; 2], [0usize; 2]);
    for &e in GraphedPipelinedGpt::ORDER {
        let (forward, c) = match e {
            OrderEntry::Forward(c) => (true, c - 1),
            OrderEntry::Backward(c) => (false, c - 1),
            OrderEntry::Wgrad(_) => return Err(Error::msg("the pipeline's schedule has no w(c) entries")),
        };
        match (forward, c) {
            (true, 0) => hidden.push(first.forward(&mut cxs[fwd[0]][0], &batches[fwd[0]].0)?),
            (true, _) => losses.push(last.forward(&mut cxs[fwd[1]][1], &hidden[fwd[1]], &batches[fwd[1]].1)?),
            (false, 0) => {
                first.backward(&mut cxs[bwd[0]][0], &grads[bwd[0]])?;
            }
            (false, _) => {
                let (d, _) = last.backward(&mut cxs[bwd[1]][1], share)?;
                grads.push(d.ok_or_else(|| Error::msg("no grad reached the first stage"))?);
            }
        }
        if forward {
            fwd[c] += 1;
        } else {
            bwd[c] += 1;
        }
    }
    Ok(losses)
}
