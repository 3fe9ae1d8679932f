//! `Param`: a trainable tensor and its grad.

pub(crate) mod visit;

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
    /// It needs a grad: `value.requires_grad()` is set. The grad is f32 whatever the value's
    /// dtype: bf16 and f16 weights accumulate their grads in f32. An integer (I32) value has no
    /// grad, as in PyTorch: it is refused as [`Error::DType`](crate::Error::DType); hold it
    /// with [`Param::frozen`].
    ///
    /// ```
    /// # use graphed::{Device, DType, Error, Param, Tensor};
    /// let dev = Device::host();
    /// let index = Tensor::from_i32(&dev, &[3, 1], &[2])?;
    /// assert!(matches!(Param::new(index.clone()), Err(Error::DType { got: DType::I32, .. })));
    /// assert!(!Param::frozen(index)?.requires_grad());
    /// # Ok::<(), graphed::Error>(())
    /// ```
    pub fn new(value: Tensor) -> Result<Param> {
        if !value.dtype().is_float() {
            return Err(crate::Error::DType { op: "Param::new", got: value.dtype(), expected: crate::DType::F32 });
        }
        Param::with_grad(value, true)
    }

    /// The parameter of `value` with a zero f32 grad, allocated from the device's default pool,
    /// its value's flag set to `requires_grad`.
    fn with_grad(value: Tensor, requires_grad: bool) -> Result<Param> {
        let dev = value.device().clone();
        let grad = dev.with_pool(&dev.default_pool(), || Tensor::zeros(&dev, value.dims()))?;
        Ok(Param { value: value.with_requires_grad(requires_grad), grad })
    }

    /// A frozen parameter: it needs no grad (`requires_grad()` is false), so optimizers built
    /// with `from_module` leave it alone, and a module whose inputs and parameters need no grad
    /// can be captured forward-only. It still has a zero grad tensor, so backward code that
    /// accumulates into it stays valid.
    ///
    /// ```
    /// # use graphed::{Device, Param, Tensor};
    /// let dev = Device::host();
    /// assert!(!Param::frozen(Tensor::zeros(&dev, &[2])?)?.requires_grad());
    /// assert!(Param::new(Tensor::zeros(&dev, &[2])?)?.requires_grad());
    /// # Ok::<(), graphed::Error>(())
    /// ```
    pub fn frozen(value: Tensor) -> Result<Param> {
        Param::with_grad(value, false)
    }

    /// Whether the parameter needs a grad: the flag of its value tensor, as in PyTorch
    /// (set by [`Param::new`], cleared by [`Param::frozen`] or [`Param::set_requires_grad`]).
    pub fn requires_grad(&self) -> bool {
        self.value.requires_grad()
    }

    /// Freezes (`false`) or unfreezes (`true`) this handle of the parameter. An integer
    /// parameter unfrozen this way is still refused by the optimizers ([`Error::DType`](crate::Error::DType)).
    ///
    /// ```
    /// # use graphed::{Device, Param, Tensor};
    /// let mut p = Param::new(Tensor::zeros(&Device::host(), &[2])?)?;
    /// p.set_requires_grad(false);
    /// assert!(!p.requires_grad());
    /// # Ok::<(), graphed::Error>(())
    /// ```
    pub fn set_requires_grad(&mut self, requires_grad: bool) {
        self.value = self.value.clone().with_requires_grad(requires_grad);
    }

    /// Sets the grad to zero (in place, capturable).
    pub fn zero_grad(&self) -> Result<()> {
        ops::fill_(&self.grad, 0.0)
    }
}
