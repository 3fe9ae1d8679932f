//! A learning-rate schedule computed on the device from AdamW's step counter (#13).

use crate::backend::{BuiltinKernel, KArg, LaunchDims};
use crate::error::OptimError;
use crate::ops::{exec, Exec};
use crate::{Result, Tensor};

/// Linear warm-up from 0 to `peak` over the first `warmup` steps, then a cosine from `peak`
/// down to `floor` at step `total` (and `floor` after it). Given to
/// [`super::AdamW::with_schedule`], it is evaluated by a kernel inside every `step()` from the
/// step count in device memory, so a captured step follows the schedule replay after replay
/// with no host write.
///
/// ```
/// use graphed::optim::WarmupCosine;
/// let s = WarmupCosine { peak: 1e-3, floor: 1e-4, warmup: 10, total: 110 };
/// assert_eq!(s.lr_at(5), 5e-4);
/// assert_eq!(s.lr_at(10), 1e-3);
/// assert!((s.lr_at(60) - 5.5e-4).abs() < 1e-9); // half way down the cosine
/// assert_eq!(s.lr_at(500), 1e-4);
/// ```
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct WarmupCosine {
    /// The rate at the end of the warm-up.
    pub peak: f32,
    /// The rate at `total` and after.
    pub floor: f32,
    /// Steps of linear warm-up (0 for none).
    pub warmup: u32,
    /// The step the cosine reaches `floor` at; at least `warmup`.
    pub total: u32,
}

impl WarmupCosine {
    /// The rate at step `t` (1-based, the count after the increment), in f32 as the kernel
    /// computes it.
    pub fn lr_at(&self, t: u32) -> f32 {
        if t <= self.warmup {
            return self.peak * t as f32 / self.warmup.max(1) as f32;
        }
        let p = ((t - self.warmup) as f32 / (self.total - self.warmup).max(1) as f32).min(1.0);
        self.floor + (self.peak - self.floor) * 0.5 * (1.0 + (std::f32::consts::PI * p).cos())
    }

    /// Rates finite and >= 0, `floor <= peak`, `warmup <= total`.
    pub(super) fn check(&self, op: &'static str) -> Result<()> {
        let ok = self.peak.is_finite() && self.floor.is_finite() && self.floor >= 0.0 && self.floor <= self.peak;
        if !ok || self.warmup > self.total {
            let WarmupCosine { peak, floor, warmup, total } = *self;
            return Err(OptimError::Schedule { op, peak, floor, warmup, total }.into());
        }
        Ok(())
    }

    /// Writes the rate for the step count in `state[0]` (u32 bits) to `lr[0]`.
    pub(super) fn apply(&self, lr: &Tensor, state: &Tensor) -> Result<()> {
        let s = *self;
        match exec(lr.device()) {
            Exec::Host(h) => {
                let (lp, st) = (lr.host_ptr()?, state.host_ptr()?);
                h.run(BuiltinKernel::LrWarmupCosineF32, move || {
                    lp.write(&[s.lr_at(st.read()[0].to_bits())]);
                    Ok(())
                })
            }
            Exec::Cuda(c) => c.launch(
                BuiltinKernel::LrWarmupCosineF32,
                LaunchDims::rows(1, 32),
                &[
                    KArg::Ptr(lr.cuda_ptr()?),
                    KArg::Ptr(state.cuda_ptr()?),
                    KArg::F32(s.peak),
                    KArg::F32(s.floor),
                    KArg::U32(s.warmup),
                    KArg::U32(s.total),
                ],
            ),
        }
    }
}
