//! The model the examples and the benchmark share: blocks of `Linear(H, H)` + GELU, and a
//! stack of them, each a `#[graphed]` module.
#![allow(dead_code)]

use graphed::ops::{self, Gelu};
use graphed::{graphed, Cx, DType, Device, Param, Result, Tensor};

#[path = "data.rs"]
pub mod data;
pub use data::random;

/// `y = GELU(x W^T + b)`, W of shape [out, in] as in PyTorch.
pub struct Block {
    /// Weight [out, in].
    pub w: Param,
    /// Bias [out].
    pub b: Param,
}

impl Block {
    /// PyTorch's default init range, U(-1/sqrt(in), 1/sqrt(in)), from a seed.
    pub fn new(dev: &Device, din: usize, dout: usize, seed: u64) -> Result<Block> {
        Block::new_as(dev, din, dout, seed, DType::F32)
    }

    /// The same initial values rounded to `dtype` (grads stay f32).
    pub fn new_as(dev: &Device, din: usize, dout: usize, seed: u64, dtype: DType) -> Result<Block> {
        let k = 1.0 / (din as f32).sqrt();
        Ok(Block {
            w: Param::new(random(dev, &[dout, din], seed, k)?.to_dtype(dtype)?)?,
            b: Param::new(random(dev, &[dout], seed ^ 0xB1A5, k)?.to_dtype(dtype)?)?,
        })
    }

    /// The parameters.
    pub fn params(&self) -> Vec<Param> {
        vec![self.w.clone(), self.b.clone()]
    }
}

#[graphed(warmup = 3)]
impl Block {
    pub fn forward(&self, cx: &mut Cx, x: &Tensor) -> Result<Tensor> {
        let h = ops::linear(x, &self.w.value, Some(&self.b.value))?;
        let y = ops::gelu(&h, Gelu::Erf)?;
        cx.save(x);
        cx.save(&h);
        Ok(y)
    }

    pub fn backward(&mut self, cx: &mut Cx, dy: &Tensor) -> Result<Option<Tensor>> {
        let (x, h) = (cx.saved(0)?, cx.saved(1)?);
        let dh = ops::gelu_backward(dy, &h, Gelu::Erf)?;
        ops::linear_backward(&dh, &x, &self.w.value, &self.w.grad, Some(&self.b.grad), cx.needs_input_grad(0))
    }
}

/// The mean squared error against a target: a loss head whose target is an extra input (the
/// last chunk of a chained model).
pub struct Mse;

#[graphed(warmup = 2)]
impl Mse {
    pub fn forward(&self, cx: &mut Cx, x: &Tensor, target: &Tensor) -> Result<Tensor> {
        cx.save(x);
        cx.save(target);
        ops::mse_loss(x, target)
    }

    pub fn backward(&mut self, cx: &mut Cx, dloss: &Tensor) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let d = ops::mse_backward(&cx.saved(0)?, &cx.saved(1)?, 1.0)?;
        ops::scale_by_(&d, dloss)?;
        Ok((Some(d), None))
    }
}

/// L blocks applied in sequence, graphed as one module.
pub struct Stack {
    /// The blocks, first to last.
    pub blocks: Vec<Block>,
}

impl Stack {
    /// `layers` blocks of width `width`, seeded from `seed`.
    pub fn new(dev: &Device, layers: usize, width: usize, seed: u64) -> Result<Stack> {
        Stack::new_as(dev, layers, width, seed, DType::F32)
    }

    /// The same stack with its weights in `dtype`.
    pub fn new_as(dev: &Device, layers: usize, width: usize, seed: u64, dtype: DType) -> Result<Stack> {
        let blocks =
            (0..layers).map(|i| Block::new_as(dev, width, width, seed + i as u64, dtype)).collect::<Result<_>>()?;
        Ok(Stack { blocks })
    }

    /// All parameters.
    pub fn params(&self) -> Vec<Param> {
        self.blocks.iter().flat_map(Block::params).collect()
    }
}

#[graphed(warmup = 3)]
impl Stack {
    pub fn forward(&self, cx: &mut Cx, x: &Tensor) -> Result<Tensor> {
        let needs_dx = cx.needs_input_grad(0);
        cx.child(0).set_needs_input_grad(vec![needs_dx]);
        let mut h = x.clone();
        for (i, b) in self.blocks.iter().enumerate() {
            h = b.forward(cx.child(i), &h)?;
        }
        Ok(h)
    }

    pub fn backward(&mut self, cx: &mut Cx, dy: &Tensor) -> Result<Option<Tensor>> {
        let mut g = dy.clone();
        for (i, b) in self.blocks.iter_mut().enumerate().rev() {
            match b.backward(cx.child(i), &g)? {
                Some(d) => g = d,
                None => return Ok(None),
            }
        }
        Ok(Some(g))
    }
}
