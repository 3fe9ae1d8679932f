//! SGD over f32 master weights behind bf16/f16 model weights.

use super::mixed::{make_masters, sealed::Master, LossScaler, Mixed};
use super::{Launches, Sgd, SgdConfig};
use crate::backend::{BuiltinKernel, KArg, LaunchDims};
use crate::ops::{cpu, exec, n32, Exec};
use crate::{DType, Param, Result, Tensor};

/// SGD (momentum, weight decay; [`Sgd`]'s semantics) for bf16 or f16 model weights: f32
/// master weights and momentum buffers, f32 grads, and the 16-bit model weights rewritten from
/// the masters in the same kernel, so one captured `step()` is the whole update. With a
/// [`LossScaler`] the grads are unscaled first and an overflow skips the update on the device.
/// f16 weights without a loss scaler are [`crate::Error::F16NeedsLossScaling`].
///
/// ```
/// use graphed::optim::{MixedSgd, SgdConfig};
/// use graphed::{ops, DType, Device, Param, Tensor};
/// let dev = Device::host();
/// let p = Param::new(Tensor::full_as(&dev, &[2], 1.0, DType::BF16)?)?;
/// ops::fill_(&p.grad, 1.0)?;
/// let opt = MixedSgd::new(&[p.clone()], SgdConfig { lr: 0.25, ..Default::default() }, None)?;
/// opt.step()?;
/// assert_eq!(p.value.to_vec()?, vec![0.75; 2]);
/// # Ok::<(), graphed::Error>(())
/// ```
pub type MixedSgd = Mixed<Sgd>;

impl Mixed<Sgd> {
    /// An optimizer over `model` (bf16 or f16 values with f32 grads); the masters start as the
    /// model values widened to f32.
    pub fn new(model: &[Param], config: SgdConfig, scaler: Option<LossScaler>) -> Result<MixedSgd> {
        const OP: &str = "MixedSgd::new";
        config.check(OP)?;
        let (device, masters) = make_masters(OP, model, scaler.as_ref())?;
        Mixed::wrap(model, Sgd::build(OP, &masters, config, Some(model))?, scaler, &device)
    }

    /// The f32 momentum buffers, one per parameter (`None` without momentum); see
    /// [`Sgd::momentum_buffers`].
    pub fn momentum_buffers(&self) -> &[Option<Tensor>] {
        self.inner().momentum_buffers()
    }
}

impl Master for Sgd {
    fn masters(&self) -> &[Param] {
        self.params()
    }

    fn set_master_lr(&self, lr: f32) -> Result<()> {
        self.set_lr(lr)
    }

    fn update_param(&self, i: usize, p: &Param, flag: &Tensor, zero: bool) -> Result<()> {
        self.update_sgd(i, p, flag)?;
        if zero {
            crate::ops::fill_(&p.grad, 0.0)?;
        }
        Ok(())
    }

    fn update_all(&self, model: &[Param], flag: &Tensor, zero: u32) -> Result<()> {
        match self.launches {
            Launches::MultiTensor => self.update_tables(Some(flag), zero),
            Launches::PerTensor => {
                model.iter().enumerate().try_for_each(|(i, p)| self.update_param(i, p, flag, zero != 0))
            }
        }
    }

    fn check(&self) -> Result<()> {
        self.check_tables()
    }

    fn launching(self, launches: Launches) -> Sgd {
        self.with_launches(launches)
    }
}

impl Sgd {
    fn update_sgd(&self, i: usize, p: &Param, flag: &Tensor) -> Result<()> {
        let SgdConfig { momentum, weight_decay, .. } = self.config;
        let (master, buf, lr) = (&self.params[i].value, &self.bufs[i], &self.lr);
        let n = n32("MixedSgd::step", p.value.numel())?;
        let kernel =
            if p.value.dtype() == DType::F16 { BuiltinKernel::SgdMixedF16 } else { BuiltinKernel::SgdMixedBf16 };
        match exec(p.value.device()) {
            Exec::Host(h) => {
                let (pp, mod_p, gp, lp, fl) =
                    (master.host_ptr()?, p.value.host_ptr()?, p.grad.host_ptr()?, lr.host_ptr()?, flag.host_ptr()?);
                let bp = buf.as_ref().map(|b| b.host_ptr()).transpose()?;
                h.run(kernel, move || {
                    if fl.read()[1] != 0.0 {
                        return Ok(());
                    }
                    let mut pv = pp.read();
                    let mut bv = bp.as_ref().map(|b| b.read());
                    cpu::sgd_step(&mut pv, &gp.read(), bv.as_deref_mut(), lp.read()[0], momentum, weight_decay);
                    pp.write(&pv);
                    mod_p.write(&pv);
                    if let (Some(b), Some(v)) = (&bp, &bv) {
                        b.write(v);
                    }
                    Ok(())
                })
            }
            Exec::Cuda(c) => {
                let bp = buf.as_ref().map(|b| b.cuda_ptr()).transpose()?.unwrap_or(0);
                let args = [
                    KArg::Ptr(master.cuda_ptr()?),
                    KArg::Ptr(p.value.cuda_ptr()?),
                    KArg::Ptr(p.grad.cuda_ptr()?),
                    KArg::Ptr(bp),
                    KArg::Ptr(lr.cuda_ptr()?),
                    KArg::Ptr(flag.cuda_ptr()?),
                    KArg::F32(momentum),
                    KArg::F32(weight_decay),
                    KArg::U32(buf.is_some() as u32),
                    KArg::U32(n),
                ];
                c.launch(kernel, LaunchDims::elementwise(n as usize), &args)
            }
        }
    }
}
