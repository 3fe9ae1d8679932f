//! AdamW over f32 master weights behind bf16/f16 model weights.

use super::mixed::{make_masters, sealed::Master, LossScaler, Mixed};
use super::{ptr_args, AdamW, AdamWConfig, Launches, WarmupCosine};
use crate::backend::{BuiltinKernel, KArg, LaunchDims};
use crate::ops::{cpu, exec, n32, Exec};
use crate::{DType, Param, Result, Tensor};

/// AdamW for bf16 or f16 model weights (see [`Mixed`]).
///
/// f16 weights without a loss scaler are [`crate::Error::F16NeedsLossScaling`].
///
/// ```
/// use graphed::optim::{AdamWConfig, MixedAdamW};
/// use graphed::{ops, DType, Device, Param, Tensor};
/// let dev = Device::host();
/// let p = Param::new(Tensor::full_as(&dev, &[2], 1.0, DType::BF16)?)?;
/// ops::fill_(&p.grad, 1.0)?;
/// let opt = MixedAdamW::new(&[p.clone()], AdamWConfig { lr: 1e-3, weight_decay: 0.0, ..Default::default() }, None)?;
/// opt.step()?;
/// assert_eq!(opt.masters()[0].value.to_vec()?, vec![0.999; 2]);
/// assert_eq!(p.value.to_vec()?, vec![1.0; 2]); // 0.999 rounds to 1 in bf16; the master keeps it
/// # Ok::<(), graphed::Error>(())
/// ```
pub type MixedAdamW = Mixed<AdamW>;

impl Mixed<AdamW> {
    /// An optimizer over `model` (bf16 or f16 values with f32 grads); the masters start as the
    /// model values widened to f32.
    pub fn new(model: &[Param], config: AdamWConfig, scaler: Option<LossScaler>) -> Result<MixedAdamW> {
        const OP: &str = "MixedAdamW::new";
        config.check(OP)?;
        let (device, masters) = make_masters(OP, model, scaler.as_ref())?;
        Mixed::wrap(model, AdamW::build(OP, &masters, config, Some(model))?, scaler, &device)
    }

    /// The moments of the masters (see [`AdamW::moments`]).
    pub fn moments(&self) -> (&[Tensor], &[Tensor]) {
        self.inner().moments()
    }

    /// Steps taken (skipped ones not counted), read back from the device.
    pub fn step_count(&self) -> Result<u64> {
        self.inner().step_count()
    }

    /// Computes the learning rate on the device at every step from the step count, as
    /// [`AdamW::with_schedule`] does (a skipped step keeps its rate).
    ///
    /// ```
    /// use graphed::optim::{AdamWConfig, MixedAdamW, WarmupCosine};
    /// use graphed::{DType, Device, Param, Tensor};
    /// let dev = Device::host();
    /// let p = Param::new(Tensor::zeros_as(&dev, &[2], DType::BF16)?)?;
    /// let s = WarmupCosine { peak: 1e-2, floor: 1e-3, warmup: 4, total: 20 };
    /// let opt = MixedAdamW::new(&[p], AdamWConfig::default(), None)?.with_schedule(s)?;
    /// opt.step()?;
    /// assert_eq!(opt.masters().len(), 1);
    /// # Ok::<(), graphed::Error>(())
    /// ```
    pub fn with_schedule(self, schedule: WarmupCosine) -> Result<MixedAdamW> {
        self.try_map_inner(|o| o.with_schedule(schedule))
    }
}

impl Master for AdamW {
    fn masters(&self) -> &[Param] {
        self.params()
    }

    fn set_master_lr(&self, lr: f32) -> Result<()> {
        self.set_lr(lr)
    }

    fn prepare(&self, flag: &Tensor) -> Result<()> {
        let AdamWConfig { beta1, beta2, .. } = self.config;
        let state = &self.state;
        match exec(state.device()) {
            Exec::Host(h) => {
                let (st, fl) = (state.host_ptr()?, flag.host_ptr()?);
                h.run(BuiltinKernel::AdamwPrepareMixed, move || {
                    if fl.read()[1] == 0.0 {
                        let t = st.read()[0].to_bits().wrapping_add(1);
                        let (bc1, bc2) = cpu::adamw_bias_corrections(t, beta1, beta2);
                        st.write(&[f32::from_bits(t), bc1, bc2]);
                    }
                    Ok(())
                })?
            }
            Exec::Cuda(c) => c.launch(
                BuiltinKernel::AdamwPrepareMixed,
                LaunchDims::rows(1, 32),
                &[KArg::Ptr(state.cuda_ptr()?), KArg::Ptr(flag.cuda_ptr()?), KArg::F32(beta1), KArg::F32(beta2)],
            )?,
        }
        self.schedule.as_ref().map_or(Ok(()), |s| s.apply(&self.lr, state))
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

    fn step_state(&self) -> Vec<&Tensor> {
        vec![&self.state, &self.lr]
    }

    fn launching(self, launches: Launches) -> AdamW {
        self.with_launches(launches)
    }

    fn update_param(&self, i: usize, p: &Param, flag: &Tensor, zero: bool) -> Result<()> {
        let config = self.config;
        let (master, m, v) = (&self.params[i].value, &self.m[i], &self.v[i]);
        let (lr, state) = (&self.lr, &self.state);
        let n = n32("MixedAdamW::step", p.value.numel())?;
        let kernel =
            if p.value.dtype() == DType::F16 { BuiltinKernel::AdamwMixedF16 } else { BuiltinKernel::AdamwMixedBf16 };
        match exec(p.value.device()) {
            Exec::Host(h) => {
                let (pp, mod_p, gp) = (master.host_ptr()?, p.value.host_ptr()?, p.grad.host_ptr()?);
                let (mp, vp, lp, st, fl) =
                    (m.host_ptr()?, v.host_ptr()?, lr.host_ptr()?, state.host_ptr()?, flag.host_ptr()?);
                h.run(kernel, move || {
                    let g = gp.read();
                    if zero {
                        gp.write(&vec![0.0; g.len()]);
                    }
                    if fl.read()[1] != 0.0 {
                        return Ok(());
                    }
                    let (lr, s) = (lp.read()[0], st.read());
                    let (mut pv, mut mv, mut vv) = (pp.read(), mp.read(), vp.read());
                    config.update(&mut pv, &g, &mut mv, &mut vv, lr, &s);
                    pp.write(&pv);
                    mod_p.write(&pv);
                    mp.write(&mv);
                    vp.write(&vv);
                    Ok(())
                })
            }
            Exec::Cuda(c) => {
                let mut args = ptr_args(&[master, &p.value, &p.grad, m, v, lr, state, flag])?;
                args.extend(config.kernel_args(zero as u32));
                args.push(KArg::U32(n));
                c.launch(kernel, LaunchDims::elementwise((n as usize).div_ceil(4)), &args)
            }
        }
    }
}
