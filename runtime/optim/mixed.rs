//! Mixed precision: f32 master weights behind 16-bit model weights, and dynamic loss scaling
//! decided on the device.

use super::multi_tensor::{Row, TensorTable, G};
use super::{state_from, zero_bits, Launches, ZERO_UPDATED};
use crate::backend::{BuiltinKernel, KArg, LaunchDims, Ptr, ScaleUpdate};
use crate::conditional::{self, Before, Condition};
use crate::error::OptimError;
use crate::ops::{check_shape, cpu, exec, fill_, n32, Exec};
use crate::tensor::restoring;
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
/// optimizer ([`MixedAdamW`](super::MixedAdamW)) unscales the f32 grads, raises an overflow flag on the device
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
    /// A scaler at `config.init_scale`. [`OptimError::HyperParameter`] for a scale that is not
    /// positive and finite, a growth factor under 1, a backoff outside `(0, 1)` or a zero interval.
    pub fn new(device: &Device, config: LossScalerConfig) -> Result<LossScaler> {
        const OP: &str = "LossScaler::new";
        let LossScalerConfig { init_scale, growth_factor, backoff_factor, growth_interval } = config;
        let refuse = |name, value, expected| Err(OptimError::HyperParameter { op: OP, name, value, expected }.into());
        if !(init_scale.is_finite() && init_scale > 0.0) {
            return refuse("init_scale", init_scale, "positive and finite");
        }
        if !(growth_factor.is_finite() && growth_factor >= 1.0) {
            return refuse("growth_factor", growth_factor, "finite and >= 1");
        }
        if !(backoff_factor > 0.0 && backoff_factor < 1.0) {
            return refuse("backoff_factor", backoff_factor, "in (0, 1)");
        }
        if growth_interval == 0 {
            return refuse("growth_interval", 0.0, "at least 1");
        }
        Ok(LossScaler { config, state: state_from(device, &[init_scale, 0.0, 0.0, 0.0])? })
    }

    /// Multiplies `grad` (the loss grad, any dtype) by the current scale, in place, reading the
    /// scale on the device (capturable).
    pub fn scale_grad_(&self, grad: &Tensor) -> Result<()> {
        crate::ops::basic::scale_by_first_("LossScaler::scale_grad_", grad, &self.state)
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

    /// Clears the overflow flag, then unscales every grad of `grads` (slot `G`) in place and
    /// raises the flag on a non-finite value: two launches. The caller checked the table.
    pub(super) fn unscale_and_check_table(&self, grads: &TensorTable) -> Result<()> {
        self.begin()?;
        match exec(self.state.device()) {
            Exec::Host(h) => {
                let (rows, sp) = (grads.host_rows()?, self.state.host_ptr()?);
                h.run(BuiltinKernel::AmpUnscaleCheckMt, move || {
                    let mut s = sp.read();
                    let inv = 1.0 / s[0];
                    let mut bad = false;
                    for g in rows.iter().filter_map(|row| row[G].as_ref()) {
                        let v: Vec<f32> = g.read().into_iter().map(|x| x * inv).collect();
                        bad = bad || v.iter().any(|x| !x.is_finite());
                        g.write(&v);
                    }
                    if bad {
                        s[1] = 1.0;
                        sp.write(&s);
                    }
                    Ok(())
                })
            }
            Exec::Cuda(c) => grads.launch(c, BuiltinKernel::AmpUnscaleCheckMt, &[KArg::Ptr(self.state.cuda_ptr()?)]),
        }
    }

    /// Clears the overflow flag, then unscales each grad in place and raises the flag on a
    /// non-finite value: one launch a grad ([`Launches::PerTensor`]).
    pub(super) fn unscale_and_check(&self, grads: &[Tensor]) -> Result<()> {
        self.begin()?;
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

    /// Clears the overflow flag (one launch).
    fn begin(&self) -> Result<()> {
        match exec(self.state.device()) {
            Exec::Host(h) => {
                let sp = self.state.host_ptr()?;
                h.run(BuiltinKernel::AmpBegin, move || {
                    let mut s = sp.read();
                    s[1] = 0.0;
                    sp.write(&s);
                    Ok(())
                })
            }
            Exec::Cuda(c) => {
                c.launch(BuiltinKernel::AmpBegin, LaunchDims::rows(1, 32), &[KArg::Ptr(self.state.cuda_ptr()?)])
            }
        }
    }

    /// [`LossScaler::update`] as the kernel that sets a conditional node's condition does it on
    /// CUDA (the state's device address; unused on the host backend).
    fn fused_update(&self) -> Result<ScaleUpdate> {
        let LossScalerConfig { growth_factor, backoff_factor, growth_interval, .. } = self.config;
        let state = match self.state.ptr()? {
            Ptr::Cuda(p) => p,
            Ptr::Host(_) => 0,
        };
        Ok(ScaleUpdate { state, growth: growth_factor, backoff: backoff_factor, interval: growth_interval })
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
    let Some(first) = model.first() else { return Err(OptimError::NoParams { op }.into()) };
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
        // What the f32 optimizer checks of its masters, checked before they are made.
        check_shape(op, &p.value, &p.grad)?;
        p.value.check_fresh()?;
        p.grad.check_fresh()?;
        n32(op, p.value.numel())?;
    }
    device.backend().forbid_during_capture(op)?;
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

/// An optimizer over f32 master weights behind bf16 or f16 model weights: f32 grads (what
/// [`Param`] grads and [`crate::ops::linear_backward`] give), and the 16-bit model weights
/// rewritten from the masters inside the update kernel, so one captured `step()` does the whole
/// update. With a [`LossScaler`] the grads are unscaled first and an overflow skips the update on
/// the device. `O` is the f32 optimizer over the masters: [`MixedAdamW`](super::MixedAdamW) and [`MixedSgd`](super::MixedSgd) name
/// the two there are.
///
/// A captured step with a scaler puts the update under an IF node whose condition is "no
/// overflow" ([`Condition::run_if`]): a replay after an overflow launches none of the update's
/// kernels (it unscales, checks, zeroes the grads for `step_and_zero_grad`, and backs the
/// scale off). The scale's update then runs before the node (it reads only the flag, and the
/// optimizer's kernels never read the scale: the same results), on CUDA inside the kernel that
/// sets the node's condition, so the node costs no launch of its own; `step_and_zero_grad`
/// zeroes a skipped step's grads in the node's else body (one node with two bodies on CUDA
/// 12.8 drivers, two nodes before). The kernels still read the flag, so eager steps, graphs
/// that do not use the node ([`Mixed::with_conditional_skip`]) and drivers older than CUDA
/// 12.4 skip the same way, launching them.
#[derive(Debug)]
pub struct Mixed<O> {
    model: Vec<Param>,
    inner: O,
    scaler: Option<LossScaler>,
    /// Boxed, so that an enum of optimizers (f32 or mixed) stays small.
    inputs: Box<StepInputs>,
    launches: Launches,
    /// Whether a captured step with a scaler puts the update under an IF node.
    conditional_skip: bool,
}

/// What a mixed step reads besides the optimizer and the scaler.
#[derive(Debug)]
struct StepInputs {
    /// `[1, 0, 0, 0]`: the flag the kernels read when there is no scaler (never raised).
    no_scaler: Tensor,
    /// The model's grads as one table (slot `G`): the scaler's unscale and check, the zeroing
    /// of a skipped step's grads and `zero_grad` are one launch each.
    grads: TensorTable,
}

pub(super) mod sealed {
    use super::super::Launches;
    use crate::{Param, Result, Tensor};

    /// What a mixed-precision optimizer needs of its f32 optimizer over the masters.
    pub trait Master: Sized {
        /// The masters.
        fn masters(&self) -> &[Param];
        /// Sets the learning rate.
        fn set_master_lr(&self, lr: f32) -> Result<()>;
        /// Work once per step before the per-parameter updates (`flag[1]` set: skip).
        fn prepare(&self, flag: &Tensor) -> Result<()> {
            let _ = flag;
            Ok(())
        }
        /// Updates master `i` and model parameter `p` (skipped on the device when `flag[1]` is
        /// set); with `zero`, also zeroes `p`'s grad (skipped or not).
        fn update_param(&self, i: usize, p: &Param, flag: &Tensor, zero: bool) -> Result<()>;
        /// Updates every master and model parameter (skipped on the device when `flag[1]` is
        /// set); `zero` holds the `ZERO_UPDATED` and `ZERO_SKIPPED` bits. One launch per
        /// parameter unless the optimizer has a multi-tensor kernel.
        fn update_all(&self, model: &[Param], flag: &Tensor, zero: u32) -> Result<()> {
            model.iter().enumerate().try_for_each(|(i, p)| self.update_param(i, p, flag, zero != 0))
        }
        /// Checks what the update's launches will read (no device work).
        fn check(&self) -> Result<()> {
            Ok(())
        }
        /// The small tensors `prepare` changes (a step count, a scheduled rate), which a step
        /// that fails after it puts back.
        fn step_state(&self) -> Vec<&Tensor> {
            Vec::new()
        }
        /// The same optimizer launching as `launches` says (where it has a choice).
        fn launching(self, launches: Launches) -> Self {
            let _ = launches;
            self
        }
    }
}

impl<O: sealed::Master> Mixed<O> {
    /// Wraps `inner`, built over `masters` (from [`make_masters`]).
    pub(super) fn wrap(model: &[Param], inner: O, scaler: Option<LossScaler>, device: &Device) -> Result<Mixed<O>> {
        let rows = model
            .iter()
            .map(|p| {
                let mut row = Row::default();
                row[G] = Some(p.grad.clone());
                row
            })
            .collect();
        let grads = TensorTable::new("Mixed::new", device, rows)?;
        if scaler.is_some() {
            // A captured step puts its update under an IF node: load the kernel that sets
            // its condition now, not inside the capture.
            conditional::warm(device)?;
        }
        Ok(Mixed {
            model: model.to_vec(),
            inner,
            scaler,
            inputs: Box::new(StepInputs { no_scaler: state_from(device, &[1.0, 0.0, 0.0, 0.0])?, grads }),
            launches: Launches::default(),
            conditional_skip: true,
        })
    }

    /// The f32 master weights (their grads are the model's grads).
    pub fn masters(&self) -> &[Param] {
        self.inner.masters()
    }

    /// The loss scaler, if any.
    pub fn scaler(&self) -> Option<&LossScaler> {
        self.scaler.as_ref()
    }

    /// Sets the learning rate the next step uses (illegal during a capture).
    pub fn set_lr(&self, lr: f32) -> Result<()> {
        self.inner.set_master_lr(lr)
    }

    /// The same optimizer launching as `launches` says: the grads' unscale and check, and
    /// AdamW's update (SGD updates one parameter a launch either way).
    ///
    /// ```
    /// use graphed::optim::{AdamWConfig, Launches, MixedAdamW};
    /// use graphed::{DType, Device, Param, Tensor};
    /// let dev = Device::host();
    /// let p = Param::new(Tensor::zeros_as(&dev, &[4], DType::BF16)?)?;
    /// let opt = MixedAdamW::new(&[p], AdamWConfig::default(), None)?.with_launches(Launches::PerTensor);
    /// assert_eq!(opt.launches(), Launches::PerTensor);
    /// # Ok::<(), graphed::Error>(())
    /// ```
    pub fn with_launches(self, launches: Launches) -> Mixed<O> {
        Mixed { inner: self.inner.launching(launches), launches, ..self }
    }

    /// How the unscale and the update are launched.
    pub fn launches(&self) -> Launches {
        self.launches
    }

    /// Whether a captured step with a loss scaler puts the update under an IF node (`true`,
    /// the default) or launches the update's kernels at every replay, where they read the
    /// overflow flag and leave everything as it was after an overflow (`false`: what the IF
    /// node saves, to measure it). The results are bitwise the same. The IF node needs the
    /// multi-tensor launches and a driver for CUDA 12.4 (the host backend always has it);
    /// without them a step launches the kernels.
    pub fn with_conditional_skip(self, on: bool) -> Mixed<O> {
        Mixed { conditional_skip: on, ..self }
    }

    /// Zeros every grad (capturable): one launch (one a grad with [`Launches::PerTensor`]).
    pub fn zero_grad(&self) -> Result<()> {
        // Every grad fresh before the first is zeroed.
        self.inputs.grads.check()?;
        match self.launches {
            Launches::MultiTensor => self.inputs.grads.zero_grads(None),
            Launches::PerTensor => self.model.iter().try_for_each(|p| fill_(&p.grad, 0.0)),
        }
    }

    /// One update: unscale and check (with a scaler), the optimizer's per-step work, the
    /// update of every parameter (master and model weights; one kernel a model dtype, one a
    /// parameter with [`Launches::PerTensor`]), and the scale update. Capturable; no host
    /// sync. Eager, a step that fails (a failed launch) leaves the step count, the rate and the
    /// scale as they were, and with the default launches everything else too:
    /// the parameters' update is its last launch, and the grads a scaler divided are multiplied
    /// back (exactly, for a scale that is a power of two, which the default scale, growth and
    /// backoff keep). With one launch a parameter, those before the failed launch keep their
    /// update.
    pub fn step(&self) -> Result<()> {
        self.update(false)
    }

    /// [`Mixed::step`] then [`Mixed::zero_grad`], the grads zeroed by the update kernels once
    /// read (one fill a grad after each update with [`Launches::PerTensor`]). Capturable.
    pub fn step_and_zero_grad(&self) -> Result<()> {
        self.update(true)
    }

    fn update(&self, zero: bool) -> Result<()> {
        // Every tensor fresh before the state is copied, whichever way the step launches.
        self.inputs.grads.check()?;
        self.inner.check()?;
        // The step count, the scheduled rate and the scale change in the first launches: a
        // failed update after them puts them back (see `restoring`).
        let mut state = self.inner.step_state();
        state.extend(self.scaler.as_ref().map(|s| &s.state));
        restoring(
            &state,
            |_| true,
            // The scaler's state is the last copy: the scale the grads are divided by.
            |saved| match self.launches {
                Launches::PerTensor => self.update_per_tensor(zero),
                Launches::MultiTensor => self.update_tables(zero, self.scaler.as_ref().and(saved.last())),
            },
        )
    }

    /// The step over the multi-tensor tables (checked). `saved_scaler`, eager with a scaler: a
    /// copy of its state from before the step, whose scale multiplies unscaled grads back if a
    /// later launch fails (exact for a power of two, which the default scale, growth and
    /// backoff keep).
    fn update_tables(&self, zero: bool, saved_scaler: Option<&Tensor>) -> Result<()> {
        let Some(scaler) = &self.scaler else {
            self.inner.prepare(&self.inputs.no_scaler)?;
            return self.inner.update_all(&self.model, &self.inputs.no_scaler, zero_bits(zero));
        };
        let divided_by = saved_scaler.map(|s| s.prefix_view(&[1])).transpose()?;
        scaler.unscale_and_check_table(&self.inputs.grads)?;
        let flag = &scaler.state;
        let update = |zero: u32| {
            self.inner.prepare(flag)?;
            self.inner.update_all(&self.model, flag, zero)
        };
        if self.skips_with_a_node() {
            let finite = Condition::element("Mixed::step", flag, 1, Some(0.5))?;
            // The scale's update reads the flag only and writes nothing the branches read, so it
            // goes before the node: on CUDA inside the kernel that sets its condition.
            let scale = || scaler.update();
            let before = Before { ops: &scale, update: scaler.fused_update()? };
            if zero {
                // The grads of a skipped step are zeroed by the other branch.
                let skipped = || self.inputs.grads.zero_grads(Some(flag));
                finite.run_if_else_after(Some(&before), || update(ZERO_UPDATED), skipped)?;
            } else {
                finite.run_if_after(Some(&before), || update(0))?;
            }
            return Ok(());
        }
        // The scale's update first (it reads the flag only, as above), so that the parameters'
        // update is the last launch: a step that fails before it changed only the grads (their
        // unscale, undone here) and the small state `update` puts back.
        let rest = || {
            scaler.update()?;
            update(zero_bits(zero))
        };
        rest().inspect_err(|_| {
            if let Some(scale) = &divided_by {
                for p in &self.model {
                    let _ = crate::ops::scale_by_(&p.grad, scale);
                }
            }
        })
    }

    /// Whether this step puts the update under an IF node: asked to, inside a capture (an
    /// eager step launches the kernels anyway), on a device that has conditional nodes.
    fn skips_with_a_node(&self) -> bool {
        let device = self.inputs.no_scaler.device();
        self.conditional_skip && device.is_capturing() && conditional::supported(device)
    }

    /// The step one launch a tensor ([`Launches::PerTensor`]).
    fn update_per_tensor(&self, zero: bool) -> Result<()> {
        let flag = match &self.scaler {
            Some(s) => {
                let grads: Vec<Tensor> = self.model.iter().map(|p| p.grad.clone()).collect();
                s.unscale_and_check(&grads)?;
                &s.state
            }
            None => &self.inputs.no_scaler,
        };
        self.inner.prepare(flag)?;
        for (i, p) in self.model.iter().enumerate() {
            self.inner.update_param(i, p, flag, zero)?;
        }
        self.scaler.as_ref().map_or(Ok(()), LossScaler::update)
    }
}

/// The inner optimizer (AdamW's step count, SGD's buffers).
impl<O> Mixed<O> {
    pub(super) fn inner(&self) -> &O {
        &self.inner
    }

    /// The same optimizer with its inner one rebuilt by `f`.
    pub(super) fn try_map_inner(self, f: impl FnOnce(O) -> Result<O>) -> Result<Mixed<O>> {
        Ok(Mixed { inner: f(self.inner)?, ..self })
    }
}
