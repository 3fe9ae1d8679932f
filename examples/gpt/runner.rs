//! Training, evaluation and sampling of the GPT of `model.rs`, with its blocks either eager or
//! graphed (each `#[graphed]` block its own forward and backward graphs).
#![allow(dead_code)]

use graphed::optim::{AdamW, AdamWConfig, WarmupCosine};
use graphed::{make_graphed, Checkpoint, Cx, Device, Error, GraphOptions, GraphedModules, Module, Parameters};
use graphed::{Result, Tensor};

use crate::model::{Block, Config, Ends, Gpt, VOCAB};

/// The blocks: eager modules, or graphed ones (one forward and one backward graph per block,
/// all in one pool), where the odd-numbered blocks may be checkpointed (their activations
/// recomputed inside the backward graph instead of kept).
pub enum Blocks {
    Eager(Vec<Block>),
    Graphed(GraphedModules),
}

/// The one output (or input grad) of a block call.
fn only(mut v: Vec<Option<Tensor>>) -> Result<Tensor> {
    v.pop().flatten().ok_or_else(|| Error::msg("a block returned no tensor"))
}

/// A model with its optimizer.
pub struct Trainer {
    pub cfg: Config,
    pub ends: Ends,
    pub blocks: Blocks,
    opt: AdamW,
    dev: Device,
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

impl Trainer {
    /// A fresh model from `seed`; `graphed` captures each block (warm-up and capture happen
    /// here), `checkpoint` (graphed only) checkpoints blocks 1, 3, 5, ...
    pub fn new(dev: &Device, cfg: Config, seed: u64, lr: f32, graphed: bool, checkpoint: bool) -> Result<Trainer> {
        let gpt = Gpt::new(dev, &cfg, seed)?;
        let opt = AdamW::from_module(&gpt, AdamWConfig { lr, weight_decay: 0.0, ..Default::default() })?;
        let Gpt { ends, blocks } = gpt;
        let blocks = if graphed {
            let sample = Tensor::zeros(dev, &[cfg.batch, cfg.context, cfg.d_model])?.with_requires_grad(true);
            let samples = (0..cfg.layers).map(|_| vec![vec![Some(sample.clone())]]).collect();
            let boxed = |(i, b): (usize, Block)| -> Box<dyn Module> {
                if checkpoint && i % 2 == 1 {
                    Box::new(Checkpoint::new(b))
                } else {
                    Box::new(b)
                }
            };
            let modules = blocks.into_iter().enumerate().map(boxed).collect();
            Blocks::Graphed(make_graphed(modules, samples, GraphOptions::new().warmup(2))?)
        } else {
            Blocks::Eager(blocks)
        };
        Ok(Trainer { cfg, ends, blocks, opt, dev: dev.clone() })
    }

    /// The graph pool's reserved bytes (0 when eager).
    pub fn pool_bytes(&self) -> usize {
        match &self.blocks {
            Blocks::Graphed(g) => g.pool().stats().reserved,
            Blocks::Eager(_) => 0,
        }
    }

    /// Has AdamW compute its learning rate on the device at every step from its step count.
    pub fn with_schedule(mut self, schedule: WarmupCosine) -> Result<Trainer> {
        self.opt = self.opt.with_schedule(schedule)?;
        Ok(self)
    }

    fn block(&self, i: usize) -> Result<&Block> {
        match &self.blocks {
            Blocks::Eager(b) => Ok(&b[i]),
            Blocks::Graphed(g) => g
                .module::<Block>(i)
                .or_else(|| g.module::<Checkpoint<Block>>(i).map(Checkpoint::inner))
                .ok_or_else(|| Error::msg(format!("block {i} is not a Block"))),
        }
    }

    /// One training step on `ids` `[batch, context]` with next-byte `labels` `[batch · context]`;
    /// returns the loss (a `[1]` tensor, still on the device).
    pub fn step(&mut self, ids: &Tensor, labels: &Tensor) -> Result<Tensor> {
        let layers = self.cfg.layers;
        let (x, pos_ids) = self.ends.embed(ids)?;
        let mut cxs: Vec<Cx> = (0..layers).map(|_| Cx::new(&self.dev)).collect();
        let mut h = x;
        for (i, cx) in cxs.iter_mut().enumerate() {
            h = match &mut self.blocks {
                Blocks::Eager(b) => b[i].forward(cx, &h)?,
                Blocks::Graphed(g) => only(g.forward(i, cx, &[Some(h)])?)?,
            };
        }
        let (loss, saved) = self.ends.loss(ids, &h, labels, pos_ids)?;
        let mut g = self.ends.loss_backward(&saved)?;
        for (i, cx) in cxs.iter_mut().enumerate().rev() {
            g = match &mut self.blocks {
                Blocks::Eager(b) => {
                    b[i].backward(cx, &g)?.ok_or_else(|| Error::msg("a block returned no input grad"))?
                }
                Blocks::Graphed(gb) => only(gb.backward(i, cx, &[Some(g)])?)?,
            };
        }
        self.ends.embed_backward(&saved, &g)?;
        self.opt.step()?;
        self.opt.zero_grad()?;
        Ok(loss)
    }

    /// The last block's output for `ids` `[batch, seq]` (any `seq` up to the context), eagerly.
    fn hidden(&self, ids: &Tensor) -> Result<Tensor> {
        let (mut h, _) = self.ends.embed(ids)?;
        for i in 0..self.cfg.layers {
            let mut cx = Cx::new(&self.dev);
            cx.set_training(false); // no dropout
            h = self.block(i)?.forward(&mut cx, &h)?;
        }
        Ok(h)
    }

    /// The mean loss on a batch, without training (eager, so any batch size works).
    pub fn eval_loss(&self, ids: &Tensor, labels: &Tensor) -> Result<f32> {
        let (logits, _, _) = self.ends.logits(&self.hidden(ids)?)?;
        Ok(graphed::ops::softmax_cross_entropy(&logits, labels)?.0.to_vec()?[0])
    }

    /// `n` bytes sampled after `prompt` (at temperature 0.8), reading at most the context.
    pub fn generate(&self, prompt: &[u8], n: usize, rng: &mut Rng) -> Result<Vec<u8>> {
        let mut text = if prompt.is_empty() { vec![b'\n'] } else { prompt.to_vec() };
        let start = text.len();
        for _ in 0..n {
            let window = &text[text.len().saturating_sub(self.cfg.context)..];
            let ids: Vec<f32> = window.iter().map(|b| *b as f32).collect();
            let h = self.hidden(&Tensor::from_slice(&self.dev, &ids, &[1, ids.len()])?)?;
            let logits = self.ends.logits(&h)?.0.to_vec()?;
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

    /// Every parameter's bits, by name (the eager and graphed runs are compared with these).
    pub fn param_bits(&self) -> Result<Vec<(String, Vec<u32>)>> {
        let mut out = Vec::new();
        let blocks = (0..self.cfg.layers).map(|i| self.block(i)).collect::<Result<Vec<_>>>()?;
        let named = self.ends.parameters().into_iter().chain(blocks.iter().flat_map(|b| b.parameters()));
        for (name, p) in named {
            out.push((name, p.value.to_vec()?.iter().map(|v| v.to_bits()).collect()));
        }
        Ok(out)
    }
}
