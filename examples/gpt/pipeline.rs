//! The pipeline variant of the GPT (#13): two chunks, the embedding with the first half of the
//! blocks and the second half with the head, over `MICROBATCHES` microbatches of the batch in an
//! interleaved order (at most two microbatches in flight), as Megatron and Transformer Engine
//! schedule pipeline chunks. Graphed, each (chunk, microbatch) gets its own graphs and the
//! whole schedule replays as one launch; eager, the same calls run op by op in the same order,
//! so both train bit for bit alike (tests/gpt.rs).
#![allow(dead_code)]

use graphed::{graphed, Parameters};
use graphed::{make_graphed, ops, Cx, Device, Error, GraphOptions, GraphedModules, Module, Param, Result, Tensor};

use crate::model::{Block, Config, Embed, Gpt, Head};

/// Microbatches per step.
pub const MICROBATCHES: usize = 4;
/// `+c` the forward of chunk `c` for its next microbatch, `-c` the backward of its oldest.
pub const ORDER: [i32; 16] = [1, 2, 1, 2, -2, -1, 1, 2, -2, -1, 1, 2, -2, -1, -2, -1];

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

/// The two stages of a model.
pub fn split(gpt: Gpt) -> (FirstStage, LastStage) {
    let Gpt { embed, mut blocks, head } = gpt;
    let second = blocks.split_off(blocks.len() / 2);
    (FirstStage { embed, blocks }, LastStage { blocks: second, head })
}

/// The stages, eager or graphed.
pub enum Stages {
    Eager(Box<(FirstStage, LastStage)>),
    Graphed(GraphedModules),
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
        if cfg.batch % MICROBATCHES != 0 || cfg.layers < 2 {
            return Err(Error::msg(format!(
                "the pipeline needs a batch divisible by {MICROBATCHES} and at least 2 layers"
            )));
        }
        let (mut first, last) = split(gpt);
        first.embed.cache_positions(cfg.batch / MICROBATCHES, cfg.context)?;
        let share = Tensor::full(dev, &[1], 1.0 / MICROBATCHES as f32)?;
        let stages = if graphed {
            let mb = cfg.batch / MICROBATCHES;
            let ids = Tensor::zeros(dev, &[mb, cfg.context])?;
            let x = Tensor::zeros_as(dev, &[mb, cfg.context, cfg.d_model], cfg.dtype)?.with_requires_grad(true);
            let labels = Tensor::zeros(dev, &[mb * cfg.context])?;
            let modules: Vec<Box<dyn Module>> = vec![Box::new(first), Box::new(last)];
            let samples = vec![vec![vec![Some(ids)]], vec![vec![Some(x), Some(labels)]]];
            let opts = GraphOptions::new().warmup(2).order(ORDER.to_vec()).chained(true);
            let mut g = make_graphed(modules, samples, opts)?;
            g.fuse()?;
            Stages::Graphed(g)
        } else {
            Stages::Eager(Box::new((first, last)))
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
            Stages::Eager(stages) => eager_step(&mut stages.0, &mut stages.1, batches, &self.share)?,
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
            Stages::Eager(stages) => Ok((&stages.0, &stages.1)),
            Stages::Graphed(g) => g
                .module::<FirstStage>(0)
                .zip(g.module::<LastStage>(1))
                .ok_or_else(|| Error::msg("the pipeline's modules are not its stages")),
        }
    }
}

/// The schedule as one launch: microbatch inputs copied into the static inputs first.
fn fused_step(g: &mut GraphedModules, batches: &[(Tensor, Tensor)], share: &Tensor) -> Result<Vec<Tensor>> {
    let missing = || Error::msg("a stage has fewer static surfaces than expected");
    for (m, (ids, labels)) in batches.iter().enumerate() {
        g.static_inputs(0, m)?[0].as_ref().ok_or_else(missing)?.copy_(ids)?;
        g.static_inputs(1, m)?[1].as_ref().ok_or_else(missing)?.copy_(labels)?;
        g.static_grad_outputs(1, m)?[0].as_ref().ok_or_else(missing)?.copy_(share)?;
    }
    g.step()?;
    (0..MICROBATCHES).map(|m| g.outputs(1, m)?[0].clone().ok_or_else(missing)).collect()
}

/// `ORDER`, op by op.
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
    for e in ORDER {
        let c = e.unsigned_abs() as usize - 1;
        match (e > 0, c) {
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
        if e > 0 {
            fwd[c] += 1;
        } else {
            bwd[c] += 1;
        }
    }
    Ok(losses)
}
