//! `Param`: a trainable tensor and its grad.

use crate::{ops, Result, Tensor};

/// A parameter: its value and the grad that backward passes accumulate into.
///
/// Both are handles (clone freely); an optimizer updates `value` in place, so a captured graph
/// that reads it sees the new values on its next replay.
///
/// ```
/// use graphed::{Device, Param, Tensor};
/// let dev = Device::host();
/// let p = Param::new(Tensor::full(&dev, &[2], 1.0)?)?;
/// assert_eq!(p.grad.to_vec()?, vec![0.0, 0.0]);
/// # Ok::<(), graphed::Error>(())
/// ```
#[derive(Clone, Debug)]
pub struct Param {
    /// The value.
    pub value: Tensor,
    /// The accumulated grad, same shape as `value`.
    pub grad: Tensor,
}

impl Param {
    /// A parameter with a zero grad, allocated from the device's default pool (parameters
    /// outlive every graph, so they never live in a graph pool).
    pub fn new(value: Tensor) -> Result<Param> {
        let dev = value.device().clone();
        let grad = dev.with_pool(&dev.default_pool(), || Tensor::zeros(&dev, value.dims()))?;
        Ok(Param { value, grad })
    }

    /// Sets the grad to zero (in place, capturable).
    pub fn zero_grad(&self) -> Result<()> {
        ops::fill_(&self.grad, 0.0)
    }
}
