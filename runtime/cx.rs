//! `Cx`, the per-call context: the device, the mode and the tensors a forward saves for its
//! backward.

use crate::error::SignatureError;
use crate::{Device, Result, Tensor};

/// The context of one forward/backward pair (one microbatch of one module).
///
/// A forward saves what its backward needs with [`Cx::save`]; the backward reads it back with
/// [`Cx::saved`]. Keeping saved tensors here rather than in the module lets several microbatches
/// of one module be in flight at once: each has its own `Cx`.
///
/// ```
/// use graphed::{Cx, Device, Tensor};
/// let dev = Device::host();
/// let mut cx = Cx::new(&dev);
/// let x = Tensor::from_slice(&dev, &[1.0, 2.0], &[2])?;
/// cx.save(&x);
/// assert_eq!(cx.saved(0)?.to_vec()?, vec![1.0, 2.0]);
/// # Ok::<(), graphed::Error>(())
/// ```
#[derive(Clone, Debug)]
pub struct Cx {
    device: Device,
    training: bool,
    saved: Vec<Tensor>,
    needs_input_grad: Vec<bool>,
    children: Vec<Cx>,
    /// With shape buckets: the call's real size along the bucketed axis (f32 `[1]`).
    bucket_length: Option<Tensor>,
}

impl Cx {
    /// A context on `device`, in training mode, with nothing saved.
    pub fn new(device: &Device) -> Cx {
        Cx {
            device: device.clone(),
            training: true,
            saved: Vec::new(),
            needs_input_grad: Vec::new(),
            children: Vec::new(),
            bucket_length: None,
        }
    }

    /// The device the module runs on.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// Whether the module runs in training mode (dropout active, backward expected).
    pub fn training(&self) -> bool {
        self.training
    }

    /// Sets training mode.
    pub fn set_training(&mut self, training: bool) {
        self.training = training;
    }

    /// Saves a tensor for the backward pass.
    pub fn save(&mut self, tensor: &Tensor) {
        self.saved.push(tensor.clone());
    }

    /// The `index`-th saved tensor.
    pub fn saved(&self, index: usize) -> Result<Tensor> {
        Ok(self.saved.get(index).cloned().ok_or(SignatureError::Saved { index, saved: self.saved.len() })?)
    }

    /// Everything saved, in order.
    pub fn saved_tensors(&self) -> Vec<Tensor> {
        self.saved.clone()
    }

    /// Everything saved here and in child contexts.
    pub(crate) fn all_saved(&self) -> Vec<Tensor> {
        let mut v = self.saved.clone();
        for c in &self.children {
            v.extend(c.all_saved());
        }
        v
    }

    /// Removes and returns everything saved (children's saved tensors are dropped too).
    pub fn take_saved(&mut self) -> Vec<Tensor> {
        self.children.clear();
        std::mem::take(&mut self.saved)
    }

    /// The context of sub-module `index` (created on first use, in the same mode), so a
    /// composite module can give each of its parts its own saved tensors.
    pub fn child(&mut self, index: usize) -> &mut Cx {
        while self.children.len() <= index {
            let mut c = Cx::new(&self.device);
            c.training = self.training;
            c.bucket_length = self.bucket_length.clone();
            self.children.push(c);
        }
        &mut self.children[index]
    }

    /// Whether the backward must produce a grad for forward input `index`. A backward may
    /// skip computing grads that are not needed and return `None` for them.
    pub fn needs_input_grad(&self, index: usize) -> bool {
        self.needs_input_grad.get(index).copied().unwrap_or(true)
    }

    /// Declares which forward inputs need grads.
    pub fn set_needs_input_grad(&mut self, needs: Vec<bool>) {
        self.needs_input_grad = needs;
    }

    /// With shape buckets ([`crate::Buckets`]): the real size of this call along each bucketed
    /// axis (in declaration order), as an f32 `[axes]` tensor on the device. The inputs a module sees are padded up to
    /// their bucket's size; one captured graph serves every real size in the bucket because
    /// the size is read on the device, from this tensor, which each graphed call updates
    /// before it replays. `None` without buckets.
    ///
    /// A module that must ignore the padding (a mean over real positions, a non-causal
    /// attention) reads it here; one whose padding is harmless (causal attention over padding
    /// at the end, a loss whose padded labels are ignored) need not.
    pub fn bucket_length(&self) -> Option<&Tensor> {
        self.bucket_length.as_ref()
    }

    /// Sets [`Cx::bucket_length`] (graphed calls with shape buckets do).
    pub(crate) fn set_bucket_length(&mut self, length: Option<Tensor>) {
        self.bucket_length = length;
    }
}
