//! The GPT's two generation passes over a KV cache, as plain functions of the weights and the
//! state they write: prefill (prompts through the blocks with the model's own causal
//! attention, their keys and values into the caches, the first new token sampled from each
//! prompt's last real position) and one decoding step (a token per sequence at its cache
//! length: embed, per block norm, q/k/v, append, attend to the cache, wo, residual + norm, MLP;
//! head; sample). The decoding step comes in two forms: the training forward's ops
//! ([`step_logits`]), and the fused one the decoder runs ([`Fused`]): `graphed::ops::DecoderStep`
//! over the model's own stacked q/k/v and gate/up weights, on the GPU one persistent kernel for
//! the whole step (embedding, every block, the head), elsewhere the
//! unfused ops with q/k/v and gate/up one GEMM each, the append inside the attention kernel
//! and SwiGLU read from the gate/up GEMM's output. Both end with the sampling and the
//! bookkeeping kernel (`ops::generation_step`), so they run alike eagerly, as captured graphs
//! and as the body of a WHILE loop. Used by `decode.rs`.
#![allow(dead_code)]

use graphed::ops::{self, DecoderLayer, DecoderStep, DecoderWeights, Generation, Sampling};
use graphed::{DType, Error, Generator, Param, Parameters, Result, Tensor};

use crate::ends::{Embed, Head};
use crate::model::{attend, split_qkv, Block, EPS};

/// The token and position tables, named as `Embed` names them.
#[derive(Parameters)]
pub struct EmbedWeights {
    pub tok: Param,
    pub pos: Param,
}

/// The model's weights as generation reads them: handles to the trained model's own parameters
/// (no copy), named as `model::Gpt` names them (`embed.tok`, `blocks.0.w_qkv`, `head.head`), so
/// that `graphed::save_safetensors` and `load_safetensors` on it write and read the model's
/// checkpoint (a load changes the model, which shares the tensors).
#[derive(Parameters)]
pub struct Weights {
    pub embed: EmbedWeights,
    pub blocks: Vec<Block>,
    pub head: Head,
}

/// Another handle to `b`'s parameters, without dropout (generation does not train).
fn share_block(b: &Block) -> Block {
    Block {
        heads: b.heads,
        dropout: 0.0,
        fused_attention: b.fused_attention,
        recompute: b.recompute,
        norm1: b.norm1.clone(),
        w_qkv: b.w_qkv.clone(),
        wo: b.wo.clone(),
        norm2: b.norm2.clone(),
        w_gate_up: b.w_gate_up.clone(),
        w_down: b.w_down.clone(),
    }
}

impl Weights {
    /// Shares the parameters of a model's embedding, blocks and head.
    pub fn of(embed: &Embed, blocks: &[&Block], head: &Head) -> Weights {
        Weights {
            embed: EmbedWeights { tok: embed.tok.clone(), pos: embed.pos.clone() },
            blocks: blocks.iter().map(|b| share_block(b)).collect(),
            head: Head { norm: head.norm.clone(), head: head.head.clone() },
        }
    }

    /// Another handle to the same parameters.
    pub fn share(&self) -> Weights {
        let embed = EmbedWeights { tok: self.embed.tok.clone(), pos: self.embed.pos.clone() };
        let head = Head { norm: self.head.norm.clone(), head: self.head.head.clone() };
        Weights { embed, blocks: self.blocks.iter().map(share_block).collect(), head }
    }

    /// The model's width.
    pub fn d_model(&self) -> usize {
        self.embed.tok.value.dims()[1]
    }

    /// The vocabulary (the head's rows).
    pub fn vocab(&self) -> usize {
        self.head.head.value.dims()[0]
    }

    /// The positions the model has learned: the longest sequence it reads.
    pub fn context(&self) -> usize {
        self.embed.pos.value.dims()[0]
    }

    /// Attention heads (those of the first block; `[]` blocks: 1).
    pub fn heads(&self) -> usize {
        self.blocks.first().map_or(1, |b| b.heads)
    }

    /// The dtype of the weights, the activations and the caches.
    pub fn dtype(&self) -> DType {
        self.embed.tok.value.dtype()
    }
}

/// One layer's KV cache, or the first sequences of one: keys and values
/// `[batch, heads, max_len, head_dim]` and the lengths (`I32` `[batch]`).
#[derive(Clone, Debug)]
pub struct Cache {
    pub k: Tensor,
    pub v: Tensor,
    pub lengths: Tensor,
}

/// What a pass writes: every layer's cache and the generation's bookkeeping, at one batch.
#[derive(Clone, Debug)]
pub struct State {
    pub caches: Vec<Cache>,
    pub books: Generation,
}

/// A prefill's inputs at one `[batch, len]` (prompts right-padded to `len`): token ids and
/// their positions (f32 `[batch, len]`), each prompt's last real row in the flattened
/// `[batch · len]` hidden states (f32 `[batch]`, the first new token is read there), and each
/// prompt's real length (`I32` `[batch]`, the caches' lengths after the prefill).
#[derive(Debug)]
pub struct PrefillInputs {
    pub ids: Tensor,
    pub positions: Tensor,
    pub last: Tensor,
    pub lengths: Tensor,
}

/// How a pass picks tokens.
#[derive(Clone, Debug)]
pub struct Sampler {
    pub sampling: Sampling,
    pub rng: Generator,
}

/// The token and the position embeddings of `ids` at `positions` (the same shape, f32 ids),
/// which [`run_blocks`] adds.
fn embed(w: &Weights, ids: &Tensor, positions: &Tensor) -> Result<[Tensor; 2]> {
    Ok([ops::embedding(ids, &w.embed.tok.value)?, ops::embedding(positions, &w.embed.pos.value)?])
}

/// Every block over the sum of the token and position embeddings (rows of `[..., d_model]`):
/// block `i`'s attention output is `attention(i, block, h)` of its normed input `h`, its MLP's
/// SwiGLU output (the down projection's input) `gated(i, block, h2)` of the second norm's
/// output; returns the last block's output normed by the head's norm, the head's input. The training forward's ops in
/// its order (each projection back to the residual stream added to it in its GEMM,
/// `linear_residual`), except that the embeddings' sum and the first block's norm are one
/// `add_rms_norm`, bit for bit the add and the norm.
fn run_blocks(
    w: &Weights,
    [tok, pos]: [Tensor; 2],
    mut attention: impl FnMut(usize, &Block, &Tensor) -> Result<Tensor>,
    mut gated: impl FnMut(usize, &Block, &Tensor) -> Result<Tensor>,
) -> Result<Tensor> {
    let head_norm = &w.head.norm.value;
    let first = w.blocks.first().map_or(head_norm, |b| &b.norm1.value);
    let (mut x, mut h, _) = ops::add_rms_norm(&tok, &pos, first, EPS)?;
    for (i, b) in w.blocks.iter().enumerate() {
        let att = attention(i, b, &h)?;
        let x2 = ops::linear_residual(&att, &b.wo.value, &x)?;
        let (h2, _) = ops::rms_norm(&x2, &b.norm2.value, EPS)?;
        x = ops::linear_residual(&gated(i, b, &h2)?, &b.w_down.value, &x2)?;
        let next = w.blocks.get(i + 1).map_or(head_norm, |n| &n.norm1.value);
        (h, _) = ops::rms_norm(&x, next, EPS)?;
    }
    Ok(h)
}

/// The training forward's q/k/v projection of `h`: one GEMM, q, k and v side by side.
fn qkv(b: &Block, h: &Tensor) -> Result<Tensor> {
    ops::linear(h, &b.w_qkv.value, None)
}

/// The training forward's MLP up to the down projection: `swiglu` of the gate and up
/// projections of `h2`, one GEMM.
fn gated(_: usize, b: &Block, h2: &Tensor) -> Result<Tensor> {
    ops::swiglu_packed(&ops::linear(h2, &b.w_gate_up.value, None)?)
}

/// Block `i`'s cache.
fn cache(st: &State, i: usize) -> Result<&Cache> {
    st.caches.get(i).ok_or_else(|| Error::msg(format!("no cache for block {i}")))
}

/// Prefill: the prompts through every block with the causal attention the model trains with
/// (so the prompts' logits are the training forward's), each block's keys and values written
/// to positions `0..len` of its cache and its lengths set to the prompts' lengths; then the
/// head on each prompt's last real row, a token sampled there, and the bookkeeping's first
/// step. Returns those logits (`[batch, vocab]`).
pub fn prefill(w: &Weights, st: &State, inputs: &PrefillInputs, sampler: &Sampler) -> Result<Tensor> {
    let &[batch, len] = inputs.ids.dims() else {
        return Err(Error::msg(format!("prefill ids must be [batch, len], got {:?}", inputs.ids.dims())));
    };
    let d = w.d_model();
    let x = embed(w, &inputs.ids, &inputs.positions)?;
    let attention = |i, b: &Block, h: &Tensor| {
        let qkv = qkv(b, h)?;
        let (att, _) = attend(b.fused_attention, &qkv, b.heads)?;
        let [_, k, v] = split_qkv(&qkv)?;
        let cache = cache(st, i)?;
        let split = |t: &Tensor| t.reshape(&[batch, len, b.heads, d / b.heads]);
        ops::kv_cache_fill(&cache.k, &cache.v, &split(&k)?, &split(&v)?)?;
        cache.lengths.copy_(&inputs.lengths)?;
        Ok(att)
    };
    let h = run_blocks(w, x, attention, gated)?;
    // Each prompt's last real row (a gather: the rows are an embedding table).
    let last = ops::embedding(&inputs.last, &h.reshape(&[batch * len, d])?)?;
    let logits = ops::linear(&last, &w.head.head.value, None)?;
    sample_and_record(st, &logits, sampler)?;
    Ok(logits)
}

/// The logits `[batch, vocab]` of one new token per sequence, `ids` at `positions` (f32
/// `[batch]`), attending to each sequence's cache after appending the token's keys and values
/// there (the lengths advance by one): the training forward's ops.
pub fn step_logits(w: &Weights, st: &State, ids: &Tensor, positions: &Tensor) -> Result<Tensor> {
    let batch = ids.numel();
    let d = w.d_model();
    let attention = |i, b: &Block, h: &Tensor| {
        let [q, k, v] = split_qkv(&qkv(b, h)?)?;
        let cache = cache(st, i)?;
        let split = |t: &Tensor| t.reshape(&[batch, b.heads, d / b.heads]);
        ops::kv_cache_append(&cache.k, &cache.v, &cache.lengths, &split(&k)?, &split(&v)?)?;
        ops::decode_attention(&split(&q)?, &cache.k, &cache.v, &cache.lengths)?.reshape(&[batch, d])
    };
    let h = run_blocks(w, embed(w, ids, positions)?, attention, gated)?;
    ops::linear(&h, &w.head.head.value, None)
}

/// The fused decoding step: `ops::DecoderStep` over the model's own weights (its q/k/v and
/// gate/up projections are already stacked, as the step reads them) and every cache of the
/// decoder's full state (any batch prefix of that state runs through it: the step reads and
/// writes the caches' first rows).
#[derive(Debug)]
pub struct Fused {
    pub step: DecoderStep,
}

impl Fused {
    /// Builds the step over `w`'s weights and `full`'s caches.
    pub fn of(w: &Weights, full: &State) -> Result<Fused> {
        if full.caches.len() != w.blocks.len() {
            return Err(Error::msg(format!("{} caches for {} blocks", full.caches.len(), w.blocks.len())));
        }
        let layers = w
            .blocks
            .iter()
            .zip(&full.caches)
            .map(|(b, c)| DecoderLayer {
                norm1: &b.norm1.value,
                qkv: &b.w_qkv.value,
                wo: &b.wo.value,
                norm2: &b.norm2.value,
                gate_up: &b.w_gate_up.value,
                down: &b.w_down.value,
                k_cache: &c.k,
                v_cache: &c.v,
                lengths: &c.lengths,
            })
            .collect();
        let step = DecoderStep::new(&DecoderWeights {
            tok: &w.embed.tok.value,
            pos: &w.embed.pos.value,
            layers,
            head_norm: &w.head.norm.value,
            head: &w.head.head.value,
            heads: w.heads(),
            eps: EPS,
        })?;
        Ok(Fused { step })
    }
}

/// One decoding step: the tokens the bookkeeping left (its next ids at their positions)
/// through the fused step (`fused`, whose caches `st`'s are a prefix of) or [`step_logits`], a
/// token sampled per sequence and recorded. Returns the logits.
pub fn decode_step(w: &Weights, fused: Option<&Fused>, st: &State, sampler: &Sampler) -> Result<Tensor> {
    let (ids, positions) = (st.books.next_ids(), st.books.positions());
    let logits = match fused {
        Some(f) => f.step.run(ids, positions)?,
        None => step_logits(w, st, ids, positions)?,
    };
    sample_and_record(st, &logits, sampler)?;
    Ok(logits)
}

/// Samples a token per row of `logits` and records it: the stop check and the next step's
/// inputs, their positions being the first cache's lengths (`ops::sample_and_record`: in a
/// WHILE body (unless `GRAPHED_FOLD_CONDITION=0`), greedy, one kernel that also sets the loop's
/// condition).
fn sample_and_record(st: &State, logits: &Tensor, sampler: &Sampler) -> Result<()> {
    let lengths = &st.caches.first().ok_or_else(|| Error::msg("a model without blocks"))?.lengths;
    ops::sample_and_record(&st.books, logits, sampler.sampling, &sampler.rng, lengths).map(drop)
}
