//! Mixed precision: f32 master weights behind 16-bit model weights, and dynamic loss scaling
//! decided on the device.

use super::{check_hyper, state_from, AdamW, AdamWConfig};
use crate::backend::{BuiltinKernel, KArg, LaunchDims};
use crate::ops::{cpu, exec, fill_, n32, Exec};
use crate::{DType, Device, Error, Param, Result, Tensor};

/// Hyper-parameters of [`LossScaler`]; the defaults are PyTorch's `GradScaler`'s.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LossScalerConfig {
    /// The first scale. Default `65536`.
    pub init_scale: f32,
    /// Factor applied after `growth_interval` steps without overflow. Default `2`.
    pub growth_factor: f32,
    /// Factor applied after an overflow. Default `0.5`.
    pub backoff_factor: f32,
    /// Good steps between two growths. Default `2000`.
    pub growth_interval: u32,
}

impl Default for LossScalerConfig {
    fn default() -> LossScalerConfig {
        LossScalerConfig { init_scale: 65536.0, growth_factor: 2.0, backoff_factor: 0.5, growth_interval: 2000 }
    }
}

/// Dynamic loss scaling with its state in device memory (`[scale, found_inf, good_steps,
/// skipped_steps]`), the counterpart of PyTorch's `GradScaler` without its host syncs.
///
/// Multiply the loss grad by the scale with [`LossScaler::scale_grad_`] before backward; the
/// optimizer ([`MixedAdamW`]) unscales the f32 grads, raises an overflow flag on the device
/// when one is not finite, skips the update then, and backs off or grows the scale — all in
/// kernels that read the state through pointers, so the whole step captures.
///
/// ```
/// use graphed::optim::{LossScaler, LossScalerConfig};
/// use graphed::{DType, Device, Tensor};
/// let dev = Device::host();
/// let scaler = LossScaler::new(&dev, LossScalerConfig { init_scale: 1024.0, ..Default::default() })?;
/// let dy = Tensor::full_as(&dev, &[2], 0.5, DType::F16)?;
/// scaler.scale_grad_(&dy)?;
/// assert_eq!(dy.to_vec()?, vec![512.0, 512.0]);
/// assert_eq!(scaler.scale()?, 1024.0);
/// # Ok::<(), graphed::Error>(())
/// ```
#[derive(Debug)]
pub struct LossScaler {
    config: LossScalerConfig,
    pub(super) state: Tensor,
}

impl LossScaler {
    /// A scaler at `config.init_scale`. [`Error::InvalidArgument`] for a scale that is not
    /// positive and finite, a growth factor under 1, a backoff outside `(0, 1)` or a zero interval.
    pub fn new(device: &Device, config: LossScalerConfig) -> Result<LossScaler> {
        const OP: &str = "LossScaler::new";
        let LossScalerConfig { init_scale, growth_factor, backoff_factor, growth_interval } = config;
        if !(init_scale.is_finite() && init_scale > 0.0) {
            return Err(Error::invalid(OP, format!("init_scale = {init_scale} must be positive and finite")));
        }
        let ok = growth_factor.is_finite() && growth_factor >= 1.0 && backoff_factor > 0.0 && backoff_factor < 1.0;
        if !ok {
            return Err(Error::invalid(
                OP,
                format!("growth_factor = {growth_factor} must be >= 1 and backoff_factor = {backoff_factor} in (0, 1)"),
            ));
        }
        if growth_interval == 0 {
            return Err(Error::invalid(OP, "growth_interval must be at least 1"));
        }
        Ok(LossScaler { config, state: state_from(device, &[init_scale, 0.0, 0.0, 0.0])? })
    }

    /// Multiplies `grad` (the loss grad, any dtype) by the current scale, in place, reading the
    /// scale on the device (capturable).
    pub fn scale_grad_(&self, grad: &Tensor) -> Result<()> {
        const OP: &str = "LossScaler::scale_grad_";
        if grad.device() != self.state.device() {
            return Err(Error::DeviceMismatch { op: OP, a: self.state.device().name(), b: grad.device().name() });
        }
        let n = n32(OP, grad.numel())?;
        let kernel = match grad.dtype() {
            DType::F32 => BuiltinKernel::AmpScaleF32,
            DType::BF16 => BuiltinKernel::AmpScaleBf16,
            DType::F16 => BuiltinKernel::AmpScaleF16,
        };
        match exec(grad.device()) {
            Exec::Host(h) => {
                let (gp, sp) = (grad.host_ptr()?, self.state.host_ptr()?);
                h.run(kernel, move || {
                    let s = sp.read()[0];
                    gp.write(&gp.read().into_iter().map(|v| v * s).collect::<Vec<_>>());
                    Ok(())
                })
            }
            Exec::Cuda(c) => c.launch(
                kernel,
                LaunchDims::elementwise(n as usize),
                &[KArg::Ptr(grad.cuda_ptr()?), KArg::Ptr(self.state.cuda_ptr()?), KArg::U32(n)],
            ),
        }
    }

    /// The current scale, read back from the device (illegal during a capture).
    pub fn scale(&self) -> Result<f32> {
        Ok(self.state.to_vec()?[0])
    }

    /// How many steps were skipped for an overflow so far (read back from the device).
    pub fn skipped_steps(&self) -> Result<u64> {
        Ok(self.state.to_vec()?[3] as u64)
    }

    /// The hyper-parameters.
    pub fn config(&self) -> LossScalerConfig {
        self.config
    }

    /// Clears the overflow flag, then unscales each grad in place and raises the flag on a
    /// non-finite value.
    pub(super) fn unscale_and_check(&self, grads: &[Tensor]) -> Result<()> {
        match exec(self.state.device()) {
            Exec::Host(h) => {
                let sp = self.state.host_ptr()?;
                h.run(BuiltinKernel::AmpBegin, move || {
                    let mut s = sp.read();
                    s[1] = 0.0;
                    sp.write(&s);
                    Ok(())
                })?;
            }
            Exec::Cuda(c) => {
                c.launch(BuiltinKernel::AmpBegin, LaunchDims::rows(1, 32), &[KArg::Ptr(self.state.cuda_ptr()?)])?
            }
        }
        for g in grads {
            let n = n32("LossScaler::unscale", g.numel())?;
            match exec(g.device()) {
                Exec::Host(h) => {
                    let (gp, sp) = (g.host_ptr()?, self.state.host_ptr()?);
                    h.run(BuiltinKernel::AmpUnscaleCheck, move || {
                        let mut s = sp.read();
                        let inv = 1.0 / s[0];
                        let v: Vec<f32> = gp.read().into_iter().map(|x| x * inv).collect();
                        if v.iter().any(|x| !x.is_finite()) {
                            s[1] = 1.0;
                            sp.write(&s);
                        }
                        gp.write(&v);
                        Ok(())
                    })?;
                }
                Exec::Cuda(c) => c.launch(
                    BuiltinKernel::AmpUnscaleCheck,
                    LaunchDims::elementwise(n as usize),
                    &[KArg::Ptr(g.cuda_ptr()?), KArg::Ptr(self.state.cuda_ptr()?), KArg::U32(n)],
                )?,
            }
        }
        Ok(())
    }

    /// Backs off (and counts a skipped step) after an overflow, else grows every interval.
    pub(super) fn update(&self) -> Result<()> {
        let LossScalerConfig { growth_factor, backoff_factor, growth_interval, .. } = self.config;
        match exec(self.state.device()) {
            Exec::Host(h) => {
                let sp = self.state.host_ptr()?;
                h.run(BuiltinKernel::AmpUpdate, move || {
                    sp.write(&cpu::loss_scale_update(&sp.read(), growth_factor, backoff_factor, growth_interval));
                    Ok(())
                })
            }
            Exec::Cuda(c) => c.launch(
                BuiltinKernel::AmpUpdate,
                LaunchDims::rows(1, 32),
                &[
                    KArg::Ptr(self.state.cuda_ptr()?),
                    KArg::F32(growth_factor),
                    KArg::F32(backoff_factor),
                    KArg::U32(growth_interval),
                ],
            ),
        }
    }
}

/// Checks 16-bit model parameters with f32 grads on one device (f16 only with a scaler) and
/// makes their f32 masters (the values widened, in the default pool; grads shared).
pub(super) fn make_masters(
    op: &'static str,
    model: &[Param],
    scaler: Option<&LossScaler>,
) -> Result<(Device, Vec<Param>)> {
    let Some(first) = model.first() else { return Err(Error::invalid(op, "no parameters to optimize")) };
    let device = first.value.device().clone();
    for p in model {
        if p.value.dtype() == DType::F32 {
            return Err(Error::DType { op, got: DType::F32, expected: DType::BF16 });
        }
        if p.grad.dtype() != DType::F32 {
            return Err(Error::DType { op, got: p.grad.dtype(), expected: DType::F32 });
        }
        if p.value.device() != &device || p.grad.device() != &device {
            return Err(Error::DeviceMismatch { op, a: device.name(), b: p.value.device().name() });
        }
        if p.value.dtype() == DType::F16 && scaler.is_none() {
            return Err(Error::F16NeedsLossScaling { op });
        }
    }
    if let Some(s) = scaler {
        if s.state.device() != &device {
            return Err(Error::DeviceMismatch { op, a: device.name(), b: s.state.device().name() });
        }
    }
    let masters = model
        .iter()
        .map(|p| {
            let value = device.with_pool(&device.default_pool(), || p.value.to_dtype(DType::F32))?;
            Ok(Param { value: value.with_requires_grad(true), grad: p.grad.clone() })
        })
        .collect::<Result<Vec<_>>>()?;
    Ok((device, masters))
}

/// AdamW for bf16 or f16 model weights: f32 master weights, f32 grads (what [`Param`] grads
/// and [`crate::ops::linear_backward`] give), and the 16-bit model weights rewritten from the
/// masters inside the same kernel, so one captured `step()` does the whole update. With a
/// [`LossScaler`] the grads are unscaled first and an overflow skips the update on the device.
///
/// f16 weights without a loss scaler are [`Error::F16NeedsLossScaling`].
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
#[derive(Debug)]
pub struct MixedAdamW {
    model: Vec<Param>,
    inner: AdamW,
    scaler: Option<LossScaler>,
    /// `[1, 0, 0, 0]`: the flag the kernels read when there is no scaler (never raised).
    no_scaler: Tensor,
}

impl MixedAdamW {
    /// An optimizer over `model` (bf16 or f16 values with f32 grads); the masters start as the
    /// model values widened to f32.
    pub fn new(model: &[Param], config: AdamWConfig, scaler: Option<LossScaler>) -> Result<MixedAdamW> {
        const OP: &str = "MixedAdamW::new";
        check_hyper(OP, "lr", config.lr, None)?;
        let (device, masters) = make_masters(OP, model, scaler.as_ref())?;
        Ok(MixedAdamW {
            model: model.to_vec(),
            inner: AdamW::new(&masters, config)?,
            scaler,
            no_scaler: state_from(&device, &[1.0, 0.0, 0.0, 0.0])?,
        })
    }

    /// The f32 master weights (their grads are the model's grads).
    pub fn masters(&self) -> &[Param] {
        self.inner.params()
    }

    /// The loss scaler, if any.
    pub fn scaler(&self) -> Option<&LossScaler> {
        self.scaler.as_ref()
    }

    /// Sets the learning rate the next step uses (illegal during a capture).
    pub fn set_lr(&self, lr: f32) -> Result<()> {
        self.inner.set_lr(lr)
    }

    /// Steps taken (skipped ones not counted), read back from the device.
    pub fn step_count(&self) -> Result<u64> {
        self.inner.step_count()
    }

    /// Zeros every grad (capturable).
    pub fn zero_grad(&self) -> Result<()> {
        self.model.iter().try_for_each(|p| fill_(&p.grad, 0.0))
    }

    /// One update: unscale and check (with a scaler), the step count, one kernel per
    /// parameter (master and model weights), and the scale update. Capturable; no host sync.
    pub fn step(&self) -> Result<()> {
        let flag = match &self.scaler {
            Some(s) => {
                let grads: Vec<Tensor> = self.model.iter().map(|p| p.grad.clone()).collect();
                s.unscale_and_check(&grads)?;
                &s.state
            }
            None => &self.no_scaler,
        };
        self.prepare(flag)?;
        for (i, p) in self.model.iter().enumerate() {
            self.update_param(i, p, flag)?;
        }
        self.scaler.as_ref().map_or(Ok(()), LossScaler::update)
    }

    fn prepare(&self, flag: &Tensor) -> Result<()> {
        let AdamWConfig { beta1, beta2, .. } = self.inner.config;
        let state = &self.inner.state;
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
                })
            }
            Exec::Cuda(c) => c.launch(
                BuiltinKernel::AdamwPrepareMixed,
                LaunchDims::rows(1, 32),
                &[KArg::Ptr(state.cuda_ptr()?), KArg::Ptr(flag.cuda_ptr()?), KArg::F32(beta1), KArg::F32(beta2)],
            ),
        }
    }

    fn update_param(&self, i: usize, p: &Param, flag: &Tensor) -> Result<()> {
        let AdamWConfig { beta1, beta2, eps, weight_decay, .. } = self.inner.config;
        let (master, m, v) = (&self.inner.params[i].value, &self.inner.m[i], &self.inner.v[i]);
        let (lr, state) = (&self.inner.lr, &self.inner.state);
        let n = n32("MixedAdamW::step", p.value.numel())?;
        let kernel =
            if p.value.dtype() == DType::F16 { BuiltinKernel::AdamwMixedF16 } else { BuiltinKernel::AdamwMixedBf16 };
        match exec(p.value.device()) {
            Exec::Host(h) => {
                let (pp, mod_p, gp) = (master.host_ptr()?, p.value.host_ptr()?, p.grad.host_ptr()?);
                let (mp, vp, lp, st, fl) =
                    (m.host_ptr()?, v.host_ptr()?, lr.host_ptr()?, state.host_ptr()?, flag.host_ptr()?);
                h.run(kernel, move || {
                    if fl.read()[1] != 0.0 {
                        return Ok(());
                    }
                    let (lr, s) = (lp.read()[0], st.read());
                    let (mut pv, mut mv, mut vv) = (pp.read(), mp.read(), vp.read());
                    let g = gp.read();
                    cpu::adamw_update(&mut pv, &g, &mut mv, &mut vv, lr, s[1], s[2], beta1, beta2, eps, weight_decay);
                    pp.write(&pv);
                    mod_p.write(&pv);
                    mp.write(&mv);
                    vp.write(&vv);
                    Ok(())
                })
            }
            Exec::Cuda(c) => {
                let ptrs = [master, &p.value, &p.grad, m, v, lr, state, flag];
                let mut args = ptrs.iter().map(|t| t.cuda_ptr().map(KArg::Ptr)).collect::<Result<Vec<_>>>()?;
                args.extend([
                    KArg::F32(beta1),
                    KArg::F32(beta2),
                    KArg::F32(eps),
                    KArg::F32(weight_decay),
                    KArg::U32(n),
                ]);
                c.launch(kernel, LaunchDims::elementwise(n as usize), &args)
            }
        }
    }
}
