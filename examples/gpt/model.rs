//! A decoder-only GPT: byte tokens, learned positions, pre-norm blocks of RMSNorm + causal
//! multi-head attention and RMSNorm + SwiGLU MLP with residuals, a final RMSNorm and an untied
//! head. Each block is its own `#[graphed]` module, and so are the two ends (`ends.rs`: the
//! embeddings, and the head with the loss); the model is one `#[graphed(chained)]` struct of
//! them, [`Gpt`]. Shared by `examples/gpt/main.rs` and `tests/gpt.rs`.
#![allow(dead_code)]

use graphed::ops;
use graphed::{graphed, Cx, DType, Device, Error, Param, Parameters, Result, Tensor};

pub use crate::ends::{Embed, Head};

/// Uniform values in [-scale, scale) from `seed` (deterministic, so runs can be compared), in
/// `dtype` (rounded from the same f32 values).
pub fn random(dev: &Device, dims: &[usize], seed: u64, scale: f32, dtype: DType) -> Result<Tensor> {
    Tensor::from_slice_as(dev, &uniform(dims.iter().product(), seed, scale), dims, dtype)
}

/// `n` uniform values in [-scale, scale) from `seed`: [`random`]'s values.
fn uniform(n: usize, seed: u64, scale: f32) -> Vec<f32> {
    let mut rng = crate::runner::Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    (0..n).map(|_| ((rng.uniform() * 2.0 - 1.0) as f32) * scale).collect()
}

pub const EPS: f32 = 1e-5;
/// Byte-level vocabulary.
pub const VOCAB: usize = 256;

/// The sizes of a GPT and of its training batches.
#[derive(Clone, Copy, Debug)]
pub struct Config {
    pub layers: usize,
    pub d_model: usize,
    pub heads: usize,
    /// The context: the longest sequence the model reads (its learned positions).
    pub context: usize,
    pub batch: usize,
    /// The MLP's hidden width.
    pub hidden: usize,
    /// Dropout on each block's two residual branches (0 disables it).
    pub dropout: f32,
    /// The weights' and activations' dtype: f32, or bf16/f16 with f32 grads and master weights.
    pub dtype: DType,
    /// Attention through the fused kernels (`flash_attention`) where they run; false keeps
    /// `causal_attention` everywhere (to compare the two).
    pub fused_attention: bool,
    /// What each block recomputes in its backward instead of keeping it from the forward.
    pub recompute: Recompute,
}

/// What a block recomputes in its backward instead of keeping it from its forward; bit for bit
/// the same values either way, so training is the same to the bit (`tests/gpt.rs`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Recompute {
    /// Keep everything the backward reads.
    #[default]
    Nothing,
    /// SwiGLU's output, written again by its backward's pass (one more write of it): `h`
    /// fewer elements a token a block.
    Swiglu,
    /// SwiGLU's output and the two norms' outputs (from the saved `rstd`, one elementwise pass
    /// each): `2·d + h` fewer elements a token a block.
    All,
}

impl Recompute {
    /// Whether SwiGLU's output is recomputed.
    pub fn swiglu(self) -> bool {
        self != Recompute::Nothing
    }

    /// Whether the norms' outputs are recomputed.
    pub fn norms(self) -> bool {
        self == Recompute::All
    }
}

/// A weight of `dims` with fan-in scaling, in the config's dtype (its grad is f32).
pub fn init(dev: &Device, c: &Config, dims: &[usize], fan_in: usize, seed: u64) -> Result<Param> {
    Param::new(random(dev, dims, seed, 1.0 / (fan_in as f32).sqrt(), c.dtype)?)
}

/// Projections of `d_model` inputs stacked into one weight: `rows[i]` rows drawn as [`init`]
/// would draw projection `i` alone (seed `seed + i`), one after the other.
fn stacked(dev: &Device, c: &Config, rows: &[usize], seed: u64) -> Result<Param> {
    let d = c.d_model;
    let scale = 1.0 / (d as f32).sqrt();
    let v: Vec<f32> = rows.iter().zip(seed..).flat_map(|(&r, s)| uniform(r * d, s, scale)).collect();
    Param::new(Tensor::from_slice_as(dev, &v, &[rows.iter().sum(), d], c.dtype)?)
}

/// A norm's gain: ones of `[d]` in the config's dtype.
pub fn ones(dev: &Device, c: &Config) -> Result<Param> {
    Param::new(Tensor::full_as(dev, &[c.d_model], 1.0, c.dtype)?)
}

/// One pre-norm transformer block.
#[derive(Parameters)]
pub struct Block {
    pub heads: usize,
    pub dropout: f32,
    pub fused_attention: bool,
    /// What the backward recomputes ([`Config::recompute`]).
    pub recompute: Recompute,
    pub norm1: Param,
    /// The q, k and v projections as one `[3·d_model, d_model]` weight: q's rows, then k's,
    /// then v's (one GEMM, whose output `ops::flash_attention_packed` reads in place).
    pub w_qkv: Param,
    pub wo: Param,
    pub norm2: Param,
    /// The gate and up projections as one `[2·hidden, d_model]` weight: the gate's rows, then
    /// up's (one GEMM, whose output `ops::swiglu_packed` reads).
    pub w_gate_up: Param,
    pub w_down: Param,
}

impl Block {
    pub fn new(dev: &Device, c: &Config, seed: u64) -> Result<Block> {
        let (d, h) = (c.d_model, c.hidden);
        let out_scale = 1.0 / (2.0 * c.layers as f32).sqrt(); // GPT-2's residual scaling
        let scaled = |dims: &[usize], fan_in: usize, s: u64| {
            Param::new(random(dev, dims, seed * 16 + s, out_scale / (fan_in as f32).sqrt(), c.dtype)?)
        };
        Ok(Block {
            heads: c.heads,
            dropout: c.dropout,
            fused_attention: c.fused_attention,
            recompute: c.recompute,
            norm1: ones(dev, c)?,
            w_qkv: stacked(dev, c, &[d, d, d], seed * 16 + 1)?,
            wo: scaled(&[d, d], d, 4)?,
            norm2: ones(dev, c)?,
            w_gate_up: stacked(dev, c, &[h, h], seed * 16 + 5)?,
            w_down: scaled(&[d, h], h, 7)?,
        })
    }
}

impl Block {
    /// Whether the residual branches are dropped out (a dropout probability, while training).
    fn drops(&self, cx: &Cx) -> bool {
        self.dropout != 0.0 && cx.training()
    }

    /// Dropout of a residual branch while training (with its mask), else the branch itself.
    fn drop(&self, cx: &Cx, t: &Tensor) -> Result<(Tensor, Option<Tensor>)> {
        if !self.drops(cx) {
            return Ok((t.clone(), None));
        }
        ops::dropout(t, self.dropout, &cx.device().rng()?, true)
    }
}

/// Whether a block's attention runs the fused kernels: asked for, and they run these inputs
/// (bf16/f16, head dim 64 or 128); else `causal_attention` (f32, the tiny host configuration).
fn fused(fused_attention: bool, dtype: DType, head_dim: usize) -> bool {
    fused_attention && ops::Attention::supports(dtype, head_dim)
}

/// Causal attention over the packed output of the q/k/v projection (`[batch, seq, 3·d]`),
/// fused where [`fused`] says (read in place); else q, k and v copied apart for
/// `causal_attention`. Generation's prefill runs it too.
pub fn attend(fused_attention: bool, qkv: &Tensor, heads: usize) -> Result<(Tensor, Tensor)> {
    let d = qkv.dims().last().copied().unwrap_or(0) / 3;
    if fused(fused_attention, qkv.dtype(), d / heads) {
        ops::flash_attention_packed(qkv, &ops::Attention::causal(heads))
    } else {
        let [q, k, v] = split_qkv(qkv)?;
        ops::causal_attention(&q, &k, &v, heads)
    }
}

/// q, k and v copied out of the packed projection output.
pub fn split_qkv(qkv: &Tensor) -> Result<[Tensor; 3]> {
    let d = qkv.dims().last().copied().unwrap_or(0) / 3;
    let mut parts = ops::split_columns(qkv, &[d, d, d])?.into_iter();
    match (parts.next(), parts.next(), parts.next()) {
        (Some(q), Some(k), Some(v)) => Ok([q, k, v]),
        _ => Err(Error::msg("split_columns returned fewer than three blocks")),
    }
}

/// The backward of [`attend`] from `[qkv, out, lse]`: the grad of `qkv`, packed as it is.
fn attend_backward(
    fused_attention: bool,
    dout: &Tensor,
    [qkv, out, lse]: [&Tensor; 3],
    heads: usize,
) -> Result<Tensor> {
    let d = qkv.dims().last().copied().unwrap_or(0) / 3;
    if fused(fused_attention, qkv.dtype(), d / heads) {
        ops::flash_attention_packed_backward(dout, qkv, out, lse, &ops::Attention::causal(heads))
    } else {
        let [q, k, v] = split_qkv(qkv)?;
        let (dq, dk, dv) = ops::causal_attention_backward(dout, &q, &k, &v, out, lse, heads)?;
        ops::concat_columns(&[&dq, &dk, &dv])
    }
}

/// `linear_backward`'s `dx`, which it returns when asked for.
pub fn dx_of(t: Option<Tensor>) -> Result<Tensor> {
    t.ok_or_else(|| Error::msg("linear_backward returned no dx"))
}

/// What a block's forward keeps for its backward, in `cx.save` order: everything, or (when the
/// block recomputes) all but SwiGLU's output `s` and, at [`Recompute::All`], the norms' outputs
/// `h1` and `h2`.
struct Saved {
    x: Tensor,
    h1: Option<Tensor>,
    rstd1: Tensor,
    /// The q/k/v projection's output, `[.., 3·d_model]`.
    qkv: Tensor,
    att: Tensor,
    lse: Tensor,
    x2: Tensor,
    h2: Option<Tensor>,
    rstd2: Tensor,
    /// The gate and up projections' output, `[.., 2·hidden]`.
    gu: Tensor,
    s: Option<Tensor>,
}

impl Saved {
    /// The tensors in save order, the recomputed ones left out.
    fn tensors(&self) -> Vec<&Tensor> {
        let Saved { x, h1, rstd1, qkv, att, lse, x2, h2, rstd2, gu, s } = self;
        let kept = [Some(x), h1.as_ref(), Some(rstd1), Some(qkv), Some(att), Some(lse), Some(x2)];
        kept.into_iter().chain([h2.as_ref(), Some(rstd2), Some(gu), s.as_ref()]).flatten().collect()
    }

    /// Reads them back from `cx`; returns them and their count (the dropout masks follow).
    fn load(cx: &Cx, recompute: Recompute) -> Result<(Saved, usize)> {
        let count = 11 - usize::from(recompute.swiglu()) - 2 * usize::from(recompute.norms());
        let mut it = (0..count).map(|i| cx.saved(i)).collect::<Result<Vec<_>>>()?.into_iter();
        let mut next = || it.next().ok_or_else(|| Error::msg("a block saved fewer tensors than it reads"));
        // Fields in save order: a struct expression evaluates its fields as written.
        let saved = Saved {
            x: next()?,
            h1: if recompute.norms() { None } else { Some(next()?) },
            rstd1: next()?,
            qkv: next()?,
            att: next()?,
            lse: next()?,
            x2: next()?,
            h2: if recompute.norms() { None } else { Some(next()?) },
            rstd2: next()?,
            gu: next()?,
            s: if recompute.swiglu() { None } else { Some(next()?) },
        };
        Ok((saved, count))
    }
}

#[graphed(warmup = 2)]
impl Block {
    pub fn forward(&self, cx: &mut Cx, x: &Tensor) -> Result<Tensor> {
        let (h1, rstd1) = ops::rms_norm(x, &self.norm1.value, EPS)?;
        let qkv = ops::linear(&h1, &self.w_qkv.value, None)?;
        let (att, lse) = attend(self.fused_attention, &qkv, self.heads)?;
        // Without dropout each projection back to the residual stream adds into it in its GEMM
        // (`linear_residual`: one rounding, no separate pass); with dropout the branch is
        // dropped first, then added (for the first, in one pass with the second norm).
        let in_gemm = !self.drops(cx);
        let (x2, h2, rstd2, mask1) = if in_gemm {
            let x2 = ops::linear_residual(&att, &self.wo.value, x)?;
            let (h2, rstd2) = ops::rms_norm(&x2, &self.norm2.value, EPS)?;
            (x2, h2, rstd2, None)
        } else {
            let (a, mask1) = self.drop(cx, &ops::linear(&att, &self.wo.value, None)?)?;
            let (x2, h2, rstd2) = ops::add_rms_norm(x, &a, &self.norm2.value, EPS)?;
            (x2, h2, rstd2, mask1)
        };
        let gu = ops::linear(&h2, &self.w_gate_up.value, None)?;
        let s = ops::swiglu_packed(&gu)?;
        let (y, mask2) = if in_gemm {
            (ops::linear_residual(&s, &self.w_down.value, &x2)?, None)
        } else {
            let (m, mask2) = self.drop(cx, &ops::linear(&s, &self.w_down.value, None)?)?;
            (ops::add(&x2, &m)?, mask2)
        };
        let (norms, swiglu) = (self.recompute.norms(), self.recompute.swiglu());
        let keep = |t: Tensor, recomputed: bool| (!recomputed).then_some(t);
        let (h1, h2, s) = (keep(h1, norms), keep(h2, norms), keep(s, swiglu));
        let saved = Saved { x: x.clone(), h1, rstd1, qkv, att, lse, x2, h2, rstd2, gu, s };
        for t in saved.tensors() {
            cx.save(t);
        }
        for mask in [mask1, mask2].iter().flatten() {
            cx.save(mask);
        }
        Ok(y)
    }

    pub fn backward(&mut self, cx: &mut Cx, dy: &Tensor) -> Result<Option<Tensor>> {
        let (saved, count) = Saved::load(cx, self.recompute)?;
        let masks = if self.drops(cx) {
            (count..count + 2).map(|i| cx.saved(i)).collect::<Result<Vec<_>>>()?
        } else {
            Vec::new()
        };
        let undrop = |d: &Tensor, i: usize| masks.get(i).map_or_else(|| Ok(d.clone()), |m| ops::dropout_backward(d, m));
        let Saved { x, x2, rstd1, rstd2, .. } = &saved;
        let dh2 = self.mlp_backward(undrop(dy, 1)?, &saved)?;
        let dx2 = ops::add_rms_norm_backward(&dh2, dy, x2, &self.norm2.value, rstd2, &self.norm2.grad)?;
        drop(dh2);
        let dh1 = self.attention_backward(undrop(&dx2, 0)?, &saved)?;
        // The first norm's backward and the residual grad in one pass.
        let dx = ops::add_rms_norm_backward(&dh1, &dx2, x, &self.norm1.value, rstd1, &self.norm1.grad)?;
        Ok(Some(dx))
    }
}

/// The two halves of a block's backward. Each frees what it made before it returns, so that
/// the graph pool's peak (the first block's backward, with every block's saved tensors live)
/// holds one half's temporaries, not both.
impl Block {
    /// The MLP half, from the grad of its output `dm`: the grad of `h2`, with the weight grads
    /// of the three projections accumulated.
    fn mlp_backward(&self, dm: Tensor, saved: &Saved) -> Result<Tensor> {
        let Saved { x2, h2, rstd2, gu, s, .. } = saved;
        let dgu = match s {
            Some(s) => {
                let ds = dx_of(ops::linear_backward(&dm, s, &self.w_down.value, &self.w_down.grad, None, true)?)?;
                ops::swiglu_packed_backward(&ds, gu)?
            }
            None => {
                // The input grad first, then SwiGLU's output again (in its backward's pass) for
                // the weight grad: the same GEMMs on the same bits as the saved `s`.
                let ds = ops::linear_input_grad(&dm, &self.w_down.value)?;
                let (dgu, s) = ops::swiglu_packed_backward_recompute(&ds, gu)?;
                drop(ds);
                ops::linear_backward(&dm, &s, &self.w_down.value, &self.w_down.grad, None, false)?;
                dgu
            }
        };
        drop(dm);
        let h2 = match h2 {
            Some(h2) => h2.clone(),
            None => ops::rms_norm_recompute(x2, &self.norm2.value, rstd2)?,
        };
        // Both projections' input and weight grads: one GEMM each against the stacked weight.
        let dh2 = dx_of(ops::linear_backward(&dgu, &h2, &self.w_gate_up.value, &self.w_gate_up.grad, None, true)?)?;
        Ok(dh2)
    }

    /// The attention half, from the grad of its output projection's output `da`: the grad of
    /// `h1`, with the weight grads of the two projections accumulated.
    fn attention_backward(&self, da: Tensor, saved: &Saved) -> Result<Tensor> {
        let Saved { x, h1, rstd1, qkv, att, lse, .. } = saved;
        let datt = dx_of(ops::linear_backward(&da, att, &self.wo.value, &self.wo.grad, None, true)?)?;
        drop(da);
        let dqkv = attend_backward(self.fused_attention, &datt, [qkv, att, lse], self.heads)?;
        drop(datt);
        let h1 = match h1 {
            Some(h1) => h1.clone(),
            None => ops::rms_norm_recompute(x, &self.norm1.value, rstd1)?,
        };
        // q's, k's and v's input and weight grads: one GEMM each against the stacked weight.
        dx_of(ops::linear_backward(&dqkv, &h1, &self.w_qkv.value, &self.w_qkv.grad, None, true)?)
    }
}

/// The whole model: the embedding, a stack of blocks and the head, chained (each chunk's
/// output is the next one's input, in the same buffer). `#[graphed]` makes `Gpt::make_graphed`
/// and `GraphedGpt`, whose `forward(GptInputs { ids }, GptExtraInputs { labels })` replays
/// every chunk's forward graph and returns the loss, `backward(GptGradOutputs { dloss })`
/// every backward graph, and `step(..)` both as one launch. Blocks 2, 4, ... (1-indexed)
/// recompute their activations inside their backward graph unless the options say otherwise.
/// `#[derive(Parameters)]` gives the optimizer every parameter by path.
#[graphed(warmup = 2, chained)]
#[derive(Parameters)]
pub struct Gpt {
    pub embed: Embed,
    #[graphed(checkpoint_every = 2)]
    pub blocks: Vec<Block>,
    pub head: Head,
}

impl Gpt {
    pub fn new(dev: &Device, c: &Config, seed: u64) -> Result<Gpt> {
        let blocks = (0..c.layers).map(|i| Block::new(dev, c, seed + 10 + i as u64)).collect::<Result<_>>()?;
        Ok(Gpt { embed: Embed::new(dev, c, seed)?, blocks, head: Head::new(dev, c, seed + 2)? })
    }
}
