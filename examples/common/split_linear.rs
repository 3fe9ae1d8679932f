//! `y = x wᵀ + b` with its backward split in two (Transformer Engine's `delay_wgrad_compute`):
//! `backward` returns the input grad and saves `dy`, `backward_weights` accumulates dW and db
//! from what `forward` and `backward` saved. Shared by examples/pipeline_wgrad.rs and
//! tests/wgrad.rs.
#![allow(dead_code)]

use graphed::{graphed, ops, Cx, Param, Parameters, Result, Tensor};

#[derive(Parameters)]
pub struct Split {
    pub w: Param,
    pub b: Param,
}

#[graphed(warmup = 2)]
impl Split {
    pub fn forward(&self, cx: &mut Cx, x: &Tensor) -> Result<Tensor> {
        cx.save(x);
        ops::linear(x, &self.w.value, Some(&self.b.value))
    }

    /// The input grad only (`ops::linear_input_grad`: no weight grad is touched), and `dy`
    /// saved for the weight grads.
    pub fn backward(&mut self, cx: &mut Cx, dy: &Tensor) -> Result<Option<Tensor>> {
        cx.save(dy);
        cx.needs_input_grad(0).then(|| ops::linear_input_grad(dy, &self.w.value)).transpose()
    }

    /// The weight grads, from what `forward` and `backward` saved.
    pub fn backward_weights(&mut self, cx: &mut Cx) -> Result<()> {
        let (x, dy) = (cx.saved(0)?, cx.saved(1)?);
        ops::linear_backward(&dy, &x, &self.w.value, &self.w.grad, Some(&self.b.grad), false)?;
        Ok(())
    }
}
