//! The two ends of the GPT, each a `#[graphed]` module like the blocks, so that a whole step can
//! be graphed: `Embed` (token and position embeddings) and `Head` (final RMSNorm, untied head and
//! the mean cross-entropy over the byte vocabulary).
#![allow(dead_code)]

use graphed::ops;
use graphed::{graphed, Cx, Device, Error, Param, Parameters, Result, ShapeProblem, Tensor};

use crate::model::{dx_of, init, ones, random, Config, EPS, VOCAB};

/// Position ids `[batch, seq]`: `0..seq` in every row.
pub fn position_ids(dev: &Device, batch: usize, seq: usize) -> Result<Tensor> {
    let v: Vec<f32> = (0..batch).flat_map(|_| (0..seq).map(|t| t as f32)).collect();
    Tensor::from_slice(dev, &v, &[batch, seq])
}

/// Token and position embeddings: ids `[batch, seq]` (integers held as f32) to the first
/// block's input `[batch, seq, d_model]`.
#[derive(Parameters)]
pub struct Embed {
    pub tok: Param,
    pub pos: Param,
    /// Position ids of the shapes a capture will see (`[batch, context]`, and a pipeline's
    /// microbatch), made beforehand: a capture cannot copy from the host.
    #[param(skip)]
    positions: Vec<Tensor>,
}

impl Embed {
    pub fn new(dev: &Device, c: &Config, seed: u64) -> Result<Embed> {
        Ok(Embed {
            tok: Param::new(random(dev, &[VOCAB, c.d_model], seed, 0.5, c.dtype)?)?,
            pos: Param::new(random(dev, &[c.context, c.d_model], seed + 1, 0.1, c.dtype)?)?,
            positions: vec![position_ids(dev, c.batch, c.context)?],
        })
    }

    /// Makes the position ids of `[batch, seq]` ahead of a capture of that shape.
    pub fn cache_positions(&mut self, batch: usize, seq: usize) -> Result<()> {
        if !self.positions.iter().any(|p| p.dims() == [batch, seq]) {
            self.positions.push(position_ids(self.pos.value.device(), batch, seq)?);
        }
        Ok(())
    }

    /// `(x, position ids)` for `ids` `[batch, seq]`. A sequence longer than the context is
    /// [`Error::SequenceTooLong`]; a token outside the vocabulary is [`Error::TokenOutOfRange`].
    pub fn embed(&self, ids: &Tensor) -> Result<(Tensor, Tensor)> {
        let (&[batch, seq], context) = (ids.dims(), self.pos.value.dims()[0]) else {
            let problem = ShapeProblem::Layout { arg: "ids", expected: "[batch, seq]", got: ids.dims().to_vec() };
            return Err(Error::Shape { op: "gpt", problem });
        };
        if seq > context {
            return Err(Error::SequenceTooLong { op: "gpt", len: seq, context });
        }
        let pos_ids = match self.positions.iter().find(|p| p.dims() == [batch, seq]) {
            Some(p) => p.clone(),
            None => position_ids(ids.device(), batch, seq)?,
        };
        let x = ops::add(&ops::embedding(ids, &self.tok.value)?, &ops::embedding(&pos_ids, &self.pos.value)?)?;
        Ok((x, pos_ids))
    }
}

#[graphed(warmup = 2)]
impl Embed {
    pub fn forward(&self, cx: &mut Cx, ids: &Tensor) -> Result<Tensor> {
        let (x, pos_ids) = self.embed(ids)?;
        cx.save(ids);
        cx.save(&pos_ids);
        Ok(x)
    }

    /// Accumulates both tables' grads; the ids get none.
    pub fn backward(&mut self, cx: &mut Cx, dx: &Tensor) -> Result<Option<Tensor>> {
        let (ids, pos_ids) = (cx.saved(0)?, cx.saved(1)?);
        ops::embedding_backward(dx, &ids, &self.tok.grad)?;
        ops::embedding_backward(dx, &pos_ids, &self.pos.grad)?;
        Ok(None)
    }
}

/// The final RMSNorm, the head and the loss: the last block's output and the next-byte labels
/// `[batch, seq]` to the mean cross-entropy (`[1]`, f32) over the labels that are not
/// `ops::IGNORE_LABEL` (the padding of a shorter sequence).
#[derive(Parameters)]
pub struct Head {
    pub norm: Param,
    pub head: Param,
}

impl Head {
    pub fn new(dev: &Device, c: &Config, seed: u64) -> Result<Head> {
        Ok(Head { norm: ones(dev, c)?, head: init(dev, c, &[VOCAB, c.d_model], c.d_model, seed)? })
    }

    /// `(logits [batch · seq, 256], normed rows, rstd)` of the last block's output.
    pub fn logits(&self, x: &Tensor) -> Result<(Tensor, Tensor, Tensor)> {
        let (hf, rstd) = ops::rms_norm(x, &self.norm.value, EPS)?;
        let d = *x.dims().last().ok_or_else(|| Error::msg("the head needs [batch, seq, d]"))?;
        let hf = hf.reshape(&[x.numel() / d, d])?;
        Ok((ops::linear(&hf, &self.head.value, None)?, hf, rstd))
    }
}

#[graphed(warmup = 2)]
impl Head {
    pub fn forward(&self, cx: &mut Cx, x: &Tensor, labels: &Tensor) -> Result<Tensor> {
        let (logits, hf, rstd) = self.logits(x)?;
        let labels = &labels.reshape(&[labels.numel()])?;
        let (loss, probs) = ops::softmax_cross_entropy(&logits, labels)?;
        for t in [x, &hf, &rstd, &probs, labels] {
            cx.save(t);
        }
        Ok(loss)
    }

    /// The grad of the last block's output for the loss grad `dloss` (`[1]`, read on the
    /// device: 1 for a whole batch, 1/M for one of M microbatches); accumulates the head's and
    /// the norm's grads. The labels get none.
    pub fn backward(&mut self, cx: &mut Cx, dloss: &Tensor) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let saved = (0..5).map(|i| cx.saved(i)).collect::<Result<Vec<_>>>()?;
        let [x, hf, rstd, probs, labels] = &saved[..] else {
            return Err(Error::msg("the head saves 5 tensors"));
        };
        let dlogits = ops::softmax_cross_entropy_backward(probs, labels, 1.0)?;
        ops::scale_by_(&dlogits, dloss)?;
        let dhf = dx_of(ops::linear_backward(&dlogits, hf, &self.head.value, &self.head.grad, None, true)?)?;
        let dx = ops::rms_norm_backward(&dhf.reshape(x.dims())?, x, &self.norm.value, rstd, &self.norm.grad)?;
        Ok((Some(dx), None))
    }
}
