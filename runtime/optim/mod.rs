//! Capturable optimizers: SGD (momentum, weight decay) and AdamW.
//!
//! The learning rate (and AdamW's step count and bias corrections) live in device memory and
//! the update kernels read them through pointers, so one captured `step()` replays every
//! iteration under a changing schedule: call [`Sgd::set_lr`] / [`AdamW::set_lr`] between
//! replays (outside the capture), and AdamW's step counter advances on the device with each
//! replay. [`AdamW::with_schedule`] computes the rate itself, on the device, from that counter
//! ([`WarmupCosine`]). Optimizer state is allocated from the device's default pool, never a
//! graph pool.
//!
//! ```
//! use graphed::optim::{Sgd, SgdConfig};
//! use graphed::{ops, CaptureMode, Device, Graph, Param, Tensor};
//! let dev = Device::host();
//! let p = Param::new(Tensor::full(&dev, &[2], 1.0)?)?;
//! ops::fill_(&p.grad, 1.0)?;
//! let opt = Sgd::new(&[p.clone()], SgdConfig { lr: 0.5, ..Default::default() })?;
//! let mut g = Graph::new(&dev);
//! g.capture(CaptureMode::Global, || opt.step())?;
//! g.replay()?; // 1 - 0.5
//! opt.set_lr(0.25)?;
//! g.replay()?; // 0.5 - 0.25: the captured step reads the new rate
//! assert_eq!(p.value.to_vec()?, vec![0.25, 0.25]);
//! # Ok::<(), graphed::Error>(())
//! ```

mod mixed;
mod mixed_adamw;
mod mixed_sgd;
mod multi_tensor;
mod schedule;

pub use mixed::{LossScaler, LossScalerConfig, Mixed};
pub use mixed_adamw::MixedAdamW;
pub use mixed_sgd::MixedSgd;
pub use schedule::WarmupCosine;

use crate::backend::{BuiltinKernel, KArg, LaunchDims};
use crate::error::OptimError;
use crate::ops::{check_same, check_shape, cpu, exec, n32, Exec};
use crate::tensor::restoring;
use crate::{Device, Param, Parameters, Result, Tensor};
use multi_tensor::{Tables, G, M, MODEL, P, V};

/// How [`AdamW`], [`Sgd`] and their mixed-precision forms launch their update kernels.
///
/// ```
/// use graphed::optim::{AdamW, AdamWConfig, Launches};
/// use graphed::{Device, Param, Tensor};
/// let dev = Device::host();
/// let p = Param::new(Tensor::zeros(&dev, &[3])?)?;
/// let opt = AdamW::new(&[p], AdamWConfig::default())?;
/// assert_eq!(opt.launches(), Launches::MultiTensor);
/// let opt = opt.with_launches(Launches::PerTensor);
/// assert_eq!(opt.launches(), Launches::PerTensor);
/// # Ok::<(), graphed::Error>(())
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Launches {
    /// One kernel updates every element of every parameter (PyTorch's `fused=True`), from a
    /// table of the tensors built in device memory when the optimizer is made; the grads'
    /// unscale and overflow check of a [`LossScaler`] is one launch too. The default.
    #[default]
    MultiTensor,
    /// One kernel a parameter, and one unscale a grad: the form the multi-tensor launches
    /// replace, kept as their reference (the two give bitwise equal results) and to measure
    /// them against.
    PerTensor,
}

/// `zero_g` bits of the multi-tensor AdamW kernel: zero each grad once an update read it...
const ZERO_UPDATED: u32 = 1;
/// ...and on a skipped step too.
const ZERO_SKIPPED: u32 = 2;

/// The `zero_g` bits of a step that zeroes its grads (or not) whether it updates or skips.
fn zero_bits(zero: bool) -> u32 {
    if zero {
        ZERO_UPDATED | ZERO_SKIPPED
    } else {
        0
    }
}

/// Hyper-parameters of [`Sgd`]; the defaults are PyTorch's (with `lr = 0.01`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SgdConfig {
    /// The initial learning rate (change it later with [`Sgd::set_lr`]).
    pub lr: f32,
    /// Momentum factor (0 = plain SGD; dampening is 0, as PyTorch's default).
    pub momentum: f32,
    /// L2 penalty added to the grad (`g + weight_decay·p`), as PyTorch's SGD.
    pub weight_decay: f32,
}

impl Default for SgdConfig {
    fn default() -> SgdConfig {
        SgdConfig { lr: 0.01, momentum: 0.0, weight_decay: 0.0 }
    }
}

impl SgdConfig {
    /// Each hyper-parameter finite and at least 0 ([`OptimError::HyperParameter`]), checked
    /// before an optimizer allocates anything.
    pub(super) fn check(&self, op: &'static str) -> Result<()> {
        check_hyper(op, "lr", self.lr, false)?;
        check_hyper(op, "momentum", self.momentum, false)?;
        check_hyper(op, "weight_decay", self.weight_decay, false)
    }
}

/// Hyper-parameters of [`AdamW`]; the defaults are PyTorch's.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdamWConfig {
    /// The initial learning rate (change it later with [`AdamW::set_lr`]). Default `1e-3`.
    pub lr: f32,
    /// Decay of the first moment. Default `0.9`.
    pub beta1: f32,
    /// Decay of the second moment. Default `0.999`.
    pub beta2: f32,
    /// Added to the denominator. Default `1e-8`.
    pub eps: f32,
    /// Decoupled weight decay (`p *= 1 - lr·weight_decay`). Default `1e-2`.
    pub weight_decay: f32,
}

impl AdamWConfig {
    /// Each hyper-parameter finite and at least 0, the betas below 1
    /// ([`OptimError::HyperParameter`]), checked before an optimizer allocates anything.
    pub(super) fn check(&self, op: &'static str) -> Result<()> {
        check_hyper(op, "lr", self.lr, false)?;
        check_hyper(op, "beta1", self.beta1, true)?;
        check_hyper(op, "beta2", self.beta2, true)?;
        check_hyper(op, "eps", self.eps, false)?;
        check_hyper(op, "weight_decay", self.weight_decay, false)
    }

    /// The update of one parameter (on the host), with the step's `lr` and bias corrections
    /// `state[1]`, `state[2]` (AdamW's state, see [`AdamW`]).
    fn update(&self, p: &mut [f32], g: &[f32], m: &mut [f32], v: &mut [f32], lr: f32, state: &[f32]) {
        let AdamWConfig { beta1, beta2, eps, weight_decay, .. } = *self;
        cpu::adamw_update(p, g, m, v, lr, state[1], state[2], beta1, beta2, eps, weight_decay);
    }

    /// The AdamW kernels' hyper-parameter arguments, then the `zero` flags.
    fn kernel_args(&self, zero: u32) -> [KArg; 5] {
        [
            KArg::F32(self.beta1),
            KArg::F32(self.beta2),
            KArg::F32(self.eps),
            KArg::F32(self.weight_decay),
            KArg::U32(zero),
        ]
    }
}

/// Device pointer arguments of `tensors`, in order.
fn ptr_args(tensors: &[&Tensor]) -> Result<Vec<KArg>> {
    tensors.iter().map(|t| t.cuda_ptr().map(KArg::Ptr)).collect()
}

impl Default for AdamWConfig {
    fn default() -> AdamWConfig {
        AdamWConfig { lr: 1e-3, beta1: 0.9, beta2: 0.999, eps: 1e-8, weight_decay: 1e-2 }
    }
}

/// `v` finite and at least 0, and below 1 for a beta ([`OptimError::HyperParameter`]).
fn check_hyper(op: &'static str, name: &'static str, v: f32, beta: bool) -> Result<()> {
    let ok = v.is_finite() && v >= 0.0 && (!beta || v < 1.0);
    if !ok {
        let expected = if beta { "in [0, 1)" } else { "finite and >= 0" };
        return Err(OptimError::HyperParameter { op, name, value: v, expected }.into());
    }
    Ok(())
}

/// Checks the params (non-empty, f32, one device, fresh, grads shaped like values) and that no
/// capture is in progress (an optimizer's state is copied from host memory); their device.
fn check_params(op: &'static str, params: &[Param]) -> Result<Device> {
    let Some(first) = params.first() else {
        return Err(OptimError::NoParams { op }.into());
    };
    for p in params {
        check_same(op, &[&first.value, &p.value, &p.grad])?;
        check_shape(op, &p.value, &p.grad)?;
        n32(op, p.value.numel())?;
    }
    let device = first.value.device();
    device.backend().forbid_during_capture(op)?;
    Ok(device.clone())
}

/// Zeros of `dims` in the default pool (optimizer state outlives every graph).
fn state_zeros(device: &Device, dims: &[usize]) -> Result<Tensor> {
    device.with_pool(&device.default_pool(), || Tensor::zeros(device, dims))
}

fn state_from(device: &Device, data: &[f32]) -> Result<Tensor> {
    device.with_pool(&device.default_pool(), || Tensor::from_slice(device, data, &[data.len()]))
}

fn read_scalar(t: &Tensor) -> Result<f32> {
    Ok(t.to_vec()?[0])
}

/// A learning rate in device memory: steps read it there, so a rate set between replays takes
/// effect in the next replayed step. It derefs to its one-element tensor.
#[derive(Debug)]
struct DeviceLr(Tensor);

impl DeviceLr {
    fn new(device: &Device, lr: f32) -> Result<DeviceLr> {
        Ok(DeviceLr(state_from(device, &[lr])?))
    }

    /// Writes a new rate (a host-to-device write: illegal during a capture).
    fn set(&self, op: &'static str, lr: f32) -> Result<()> {
        check_hyper(op, "lr", lr, false)?;
        self.0.copy_from_slice(&[lr])
    }

    /// The rate, read back from the device (illegal during a capture).
    fn get(&self) -> Result<f32> {
        read_scalar(&self.0)
    }
}

impl std::ops::Deref for DeviceLr {
    type Target = Tensor;

    fn deref(&self) -> &Tensor {
        &self.0
    }
}

/// Stochastic gradient descent with momentum and weight decay (PyTorch's `torch.optim.SGD`
/// with dampening 0, not Nesterov), capturable.
///
/// Per element: `g = grad + weight_decay·p`; with momentum `buf = momentum·buf + g` (the
/// buffer starts at zero, which equals PyTorch's first-step `buf = g`) and `g = buf`; then
/// `p -= lr·g`, where `lr` is read from device memory.
#[derive(Debug)]
pub struct Sgd {
    params: Vec<Param>,
    config: SgdConfig,
    lr: DeviceLr,
    bufs: Vec<Option<Tensor>>,
    launches: Launches,
    /// The multi-tensor kernels' tables.
    tables: Tables,
}

impl Sgd {
    /// An optimizer over `params` (handles: it updates their values in place).
    /// [`OptimError::NoParams`] for no params, [`OptimError::HyperParameter`] for a negative or
    /// non-finite hyper-parameter.
    pub fn new(params: &[Param], config: SgdConfig) -> Result<Sgd> {
        Sgd::build("Sgd::new", params, config, None)
    }

    /// [`Sgd::new`], the tables of the multi-tensor kernels built over `params` and, with
    /// `model` (mixed precision: `params` are the masters), the 16-bit model weights the
    /// update rewrites (one table per model dtype; the caller checked the model).
    fn build(op: &'static str, params: &[Param], config: SgdConfig, model: Option<&[Param]>) -> Result<Sgd> {
        let device = check_params(op, params)?;
        config.check(op)?;
        let bufs: Vec<Option<Tensor>> = params
            .iter()
            .map(|p| if config.momentum != 0.0 { state_zeros(&device, p.value.dims()).map(Some) } else { Ok(None) })
            .collect::<Result<_>>()?;
        let kernels = [BuiltinKernel::SgdMtF32, BuiltinKernel::SgdMtBf16, BuiltinKernel::SgdMtF16];
        let tables = Tables::build(op, &device, params, model, kernels, |i, row| row[M] = bufs[i].clone())?;
        Ok(Sgd {
            params: params.to_vec(),
            config,
            lr: DeviceLr::new(&device, config.lr)?,
            bufs,
            launches: Launches::default(),
            tables,
        })
    }

    /// The same optimizer launching its kernels as `launches` says (multi-tensor by default).
    pub fn with_launches(mut self, launches: Launches) -> Sgd {
        self.launches = launches;
        self
    }

    /// How the update kernels are launched.
    pub fn launches(&self) -> Launches {
        self.launches
    }

    /// The momentum buffers, one per parameter in [`Sgd::params`] order (`None` without
    /// momentum). Read them; writing them changes the next steps.
    pub fn momentum_buffers(&self) -> &[Option<Tensor>] {
        &self.bufs
    }

    /// An optimizer over the module's trainable parameters ([`Parameters::trainable_params`]:
    /// frozen ones are left out).
    ///
    /// ```
    /// use graphed::optim::{Sgd, SgdConfig};
    /// use graphed::{Device, Param, Parameters, Tensor};
    /// #[derive(Parameters)]
    /// struct Net { layers: Vec<Param> }
    /// let dev = Device::host();
    /// let net = Net { layers: vec![Param::new(Tensor::zeros(&dev, &[2])?)?, Param::new(Tensor::zeros(&dev, &[2])?)?] };
    /// assert_eq!(Sgd::from_module(&net, SgdConfig::default())?.params().len(), 2);
    /// # Ok::<(), graphed::Error>(())
    /// ```
    pub fn from_module<M: Parameters + ?Sized>(module: &M, config: SgdConfig) -> Result<Sgd> {
        Sgd::new(&module.trainable_params(), config)
    }

    /// Sets the learning rate that the next `step()` — eager or a replay of a captured one —
    /// uses. A host-to-device write: illegal during a capture.
    pub fn set_lr(&self, lr: f32) -> Result<()> {
        self.lr.set("Sgd::set_lr", lr)
    }

    /// The current learning rate, read back from the device (illegal during a capture).
    pub fn lr(&self) -> Result<f32> {
        self.lr.get()
    }

    /// The hyper-parameters it was built with (`lr` is the initial rate).
    pub fn config(&self) -> SgdConfig {
        self.config
    }

    /// The parameters.
    pub fn params(&self) -> &[Param] {
        &self.params
    }

    /// One update of every parameter from its grad: one launch (one a parameter with
    /// [`Launches::PerTensor`]). Capturable. Eager, a failed launch leaves every parameter as
    /// it was with the default launches (there is only the one); with one launch a parameter,
    /// those before the failed launch keep their update.
    pub fn step(&self) -> Result<()> {
        // Every tensor fresh before the first update (the tables hold them all, whichever way
        // the step launches).
        self.check_tables()?;
        if self.launches == Launches::MultiTensor {
            return self.update_tables(None, 0);
        }
        let SgdConfig { momentum, weight_decay, .. } = self.config;
        for (p, buf) in self.params.iter().zip(&self.bufs) {
            let n = n32("Sgd::step", p.value.numel())?;
            match exec(p.value.device()) {
                Exec::Host(h) => {
                    let (pp, gp, lp) = (p.value.host_ptr()?, p.grad.host_ptr()?, self.lr.host_ptr()?);
                    let bp = buf.as_ref().map(|b| b.host_ptr()).transpose()?;
                    h.run(BuiltinKernel::SgdStepF32, move || {
                        let lr = lp.read()[0];
                        let mut pv = pp.read();
                        let mut bv = bp.as_ref().map(|b| b.read());
                        cpu::sgd_step(&mut pv, &gp.read(), bv.as_deref_mut(), lr, momentum, weight_decay);
                        pp.write(&pv);
                        if let (Some(b), Some(v)) = (&bp, &bv) {
                            b.write(v);
                        }
                        Ok(())
                    })?;
                }
                Exec::Cuda(c) => {
                    let bp = match buf {
                        Some(b) => b.cuda_ptr()?,
                        None => 0,
                    };
                    c.launch(
                        BuiltinKernel::SgdStepF32,
                        LaunchDims::elementwise(n as usize),
                        &[
                            KArg::Ptr(p.value.cuda_ptr()?),
                            KArg::Ptr(p.grad.cuda_ptr()?),
                            KArg::Ptr(bp),
                            KArg::Ptr(self.lr.cuda_ptr()?),
                            KArg::F32(momentum),
                            KArg::F32(weight_decay),
                            KArg::U32(buf.is_some() as u32),
                            KArg::U32(n),
                        ],
                    )?;
                }
            }
        }
        Ok(())
    }

    /// Sets every parameter's grad to zero (capturable): one launch (one per parameter with
    /// [`Launches::PerTensor`]).
    pub fn zero_grad(&self) -> Result<()> {
        self.tables.zero_grads(self.launches, &self.params)
    }

    /// Checks every table before a launch reads one (no device work).
    fn check_tables(&self) -> Result<()> {
        self.tables.check()
    }

    /// The update of every parameter, one launch a table: skipped on the device when `flag`
    /// (the loss scaler's state; `None`: never) has its overflow flag set; `zero`: the
    /// [`ZERO_UPDATED`] and [`ZERO_SKIPPED`] bits. The caller checked the tables.
    fn update_tables(&self, flag: Option<&Tensor>, zero: u32) -> Result<()> {
        let SgdConfig { momentum, weight_decay, .. } = self.config;
        let use_momentum = momentum != 0.0;
        for (kernel, table) in self.tables.iter() {
            match exec(self.lr.device()) {
                Exec::Host(h) => {
                    let rows = table.host_rows()?;
                    let lp = self.lr.host_ptr()?;
                    let fl = flag.map(Tensor::host_ptr).transpose()?;
                    h.run(*kernel, move || {
                        let skip = fl.as_ref().is_some_and(|f| f.read()[1] != 0.0);
                        let lr = lp.read()[0];
                        for row in &rows {
                            let (Some(p), Some(g)) = (&row[P], &row[G]) else {
                                continue;
                            };
                            let zeros = || g.write(&vec![0.0; g.len]);
                            if skip {
                                if zero & ZERO_SKIPPED != 0 {
                                    zeros();
                                }
                                continue;
                            }
                            let mut pv = p.read();
                            let mut bv = row[M].as_ref().map(|b| b.read());
                            cpu::sgd_step(&mut pv, &g.read(), bv.as_deref_mut(), lr, momentum, weight_decay);
                            p.write(&pv);
                            if let Some(model) = &row[MODEL] {
                                model.write(&pv);
                            }
                            if let (Some(b), Some(v)) = (&row[M], &bv) {
                                b.write(v);
                            }
                            if zero & ZERO_UPDATED != 0 {
                                zeros();
                            }
                        }
                        Ok(())
                    })?;
                }
                Exec::Cuda(c) => {
                    let flag = flag.map(Tensor::cuda_ptr).transpose()?.unwrap_or(0);
                    let args = [
                        KArg::Ptr(self.lr.cuda_ptr()?),
                        KArg::Ptr(flag),
                        KArg::F32(momentum),
                        KArg::F32(weight_decay),
                        KArg::U32(use_momentum as u32),
                        KArg::U32(zero),
                    ];
                    table.launch(c, *kernel, &args)?;
                }
            }
        }
        Ok(())
    }
}

/// AdamW (PyTorch's `torch.optim.AdamW`, not amsgrad), capturable.
///
/// Each `step()` first runs a one-thread kernel that increments the step count `t` held in
/// device memory and computes the bias corrections `1 - beta1^t` and `1 - beta2^t` from it,
/// then one update kernel over every parameter (a table of their tensors built by `new`; see
/// [`Launches`]): `p *= 1 - lr·weight_decay`,
/// `m = beta1·m + (1 - beta1)·g`, `v = beta2·v + (1 - beta2)·g²`,
/// `p -= lr / (1 - beta1^t) · m / (sqrt(v) / sqrt(1 - beta2^t) + eps)`. So a captured step,
/// replayed, counts its own steps, and follows [`AdamW::set_lr`].
///
/// ```
/// use graphed::optim::{AdamW, AdamWConfig};
/// use graphed::{ops, Device, Param, Tensor};
/// let dev = Device::host();
/// let p = Param::new(Tensor::full(&dev, &[3], 1.0)?)?;
/// ops::fill_(&p.grad, 0.5)?;
/// let opt = AdamW::new(&[p.clone()], AdamWConfig { weight_decay: 0.0, ..Default::default() })?;
/// opt.step()?;
/// assert_eq!(opt.step_count()?, 1);
/// // The first Adam step moves each weight by about lr against the grad's sign.
/// assert!(p.value.to_vec()?.iter().all(|v| (v - (1.0 - 1e-3)).abs() < 1e-6));
/// # Ok::<(), graphed::Error>(())
/// ```
#[derive(Debug)]
pub struct AdamW {
    params: Vec<Param>,
    config: AdamWConfig,
    lr: DeviceLr,
    /// `[t as u32 bits, 1 - beta1^t, 1 - beta2^t]`.
    state: Tensor,
    m: Vec<Tensor>,
    v: Vec<Tensor>,
    schedule: Option<WarmupCosine>,
    launches: Launches,
    /// The multi-tensor kernels' tables.
    tables: Tables,
}

impl AdamW {
    /// An optimizer over `params`, with zero moments and step count 0.
    /// [`OptimError::NoParams`] for no params, [`OptimError::HyperParameter`] for one out of
    /// range (betas in `[0, 1)`, the rest finite and >= 0).
    pub fn new(params: &[Param], config: AdamWConfig) -> Result<AdamW> {
        AdamW::build("AdamW::new", params, config, None)
    }

    /// [`AdamW::new`], the tables of the multi-tensor kernels built over `params` and, with
    /// `model` (mixed precision: `params` are the masters), the 16-bit model weights the
    /// update rewrites (one table per model dtype; the caller checked the model).
    fn build(op: &'static str, params: &[Param], config: AdamWConfig, model: Option<&[Param]>) -> Result<AdamW> {
        let device = check_params(op, params)?;
        config.check(op)?;
        let m: Vec<Tensor> = params.iter().map(|p| state_zeros(&device, p.value.dims())).collect::<Result<_>>()?;
        let v: Vec<Tensor> = params.iter().map(|p| state_zeros(&device, p.value.dims())).collect::<Result<_>>()?;
        let kernels = [BuiltinKernel::AdamwMtF32, BuiltinKernel::AdamwMtBf16, BuiltinKernel::AdamwMtF16];
        let tables = Tables::build(op, &device, params, model, kernels, |i, row| {
            row[M] = Some(m[i].clone());
            row[V] = Some(v[i].clone());
        })?;
        Ok(AdamW {
            params: params.to_vec(),
            config,
            lr: DeviceLr::new(&device, config.lr)?,
            state: state_from(&device, &[f32::from_bits(0), 0.0, 0.0])?,
            m,
            v,
            schedule: None,
            launches: Launches::default(),
            tables,
        })
    }

    /// The same optimizer launching its kernels as `launches` says (multi-tensor by default).
    pub fn with_launches(mut self, launches: Launches) -> AdamW {
        self.launches = launches;
        self
    }

    /// How the update kernels are launched.
    pub fn launches(&self) -> Launches {
        self.launches
    }

    /// The moments, one tensor per parameter in [`AdamW::params`] order: the first
    /// (PyTorch's `exp_avg`) and the second (`exp_avg_sq`). Read them; writing them changes
    /// the next steps.
    pub fn moments(&self) -> (&[Tensor], &[Tensor]) {
        (&self.m, &self.v)
    }

    /// Computes the learning rate on the device at every `step()` from the step count (see
    /// [`WarmupCosine`]), replacing the rate set by the config or [`AdamW::set_lr`].
    ///
    /// ```
    /// use graphed::optim::{AdamW, AdamWConfig, WarmupCosine};
    /// use graphed::{Device, Param, Tensor};
    /// let dev = Device::host();
    /// let p = Param::new(Tensor::zeros(&dev, &[2])?)?;
    /// let s = WarmupCosine { peak: 1e-2, floor: 1e-3, warmup: 4, total: 20 };
    /// let opt = AdamW::new(&[p], AdamWConfig::default())?.with_schedule(s)?;
    /// opt.step()?;
    /// assert_eq!(opt.lr()?, s.lr_at(1)); // 2.5e-3, computed by the step
    /// # Ok::<(), graphed::Error>(())
    /// ```
    pub fn with_schedule(mut self, schedule: WarmupCosine) -> Result<AdamW> {
        schedule.check("AdamW::with_schedule")?;
        self.schedule = Some(schedule);
        Ok(self)
    }

    /// An optimizer over the module's trainable parameters ([`Parameters::trainable_params`]:
    /// frozen ones are left out).
    ///
    /// ```
    /// use graphed::optim::{AdamW, AdamWConfig};
    /// use graphed::{Device, Param, Parameters, Tensor};
    /// #[derive(Parameters)]
    /// struct Net { w: Param, embedding: Param }
    /// let dev = Device::host();
    /// let net = Net { w: Param::new(Tensor::zeros(&dev, &[4])?)?, embedding: Param::frozen(Tensor::zeros(&dev, &[8])?)? };
    /// let opt = AdamW::from_module(&net, AdamWConfig::default())?;
    /// assert_eq!(opt.params().len(), 1);
    /// # Ok::<(), graphed::Error>(())
    /// ```
    pub fn from_module<M: Parameters + ?Sized>(module: &M, config: AdamWConfig) -> Result<AdamW> {
        AdamW::new(&module.trainable_params(), config)
    }

    /// Sets the learning rate that the next `step()` — eager or replayed — uses. Illegal
    /// during a capture.
    pub fn set_lr(&self, lr: f32) -> Result<()> {
        self.lr.set("AdamW::set_lr", lr)
    }

    /// The current learning rate, read back from the device (illegal during a capture).
    pub fn lr(&self) -> Result<f32> {
        self.lr.get()
    }

    /// How many steps have run (eager and replayed), read back from the device.
    pub fn step_count(&self) -> Result<u64> {
        Ok(read_scalar(&self.state)?.to_bits() as u64)
    }

    /// The hyper-parameters it was built with (`lr` is the initial rate).
    pub fn config(&self) -> AdamWConfig {
        self.config
    }

    /// The parameters.
    pub fn params(&self) -> &[Param] {
        &self.params
    }

    /// One update of every parameter: the step-count kernel, the schedule kernel (with
    /// [`AdamW::with_schedule`]), then one kernel over every parameter (one per parameter with
    /// [`Launches::PerTensor`]). Capturable. Eager, a step that fails (a failed launch) leaves
    /// the step count and the rate as they were, and with the default launches everything
    /// else too: the update is its last launch. With [`Launches::PerTensor`] the parameters
    /// updated before the failed launch keep their update.
    pub fn step(&self) -> Result<()> {
        self.update(false)
    }

    /// [`AdamW::step`] then [`AdamW::zero_grad`] in the same kernels: each grad is zeroed
    /// once its update has read it, so no fill is launched. Capturable.
    ///
    /// ```
    /// use graphed::optim::{AdamW, AdamWConfig};
    /// use graphed::{ops, Device, Param, Tensor};
    /// let dev = Device::host();
    /// let p = Param::new(Tensor::full(&dev, &[2], 1.0)?)?;
    /// ops::fill_(&p.grad, 0.5)?;
    /// AdamW::new(&[p.clone()], AdamWConfig::default())?.step_and_zero_grad()?;
    /// assert_eq!(p.grad.to_vec()?, vec![0.0; 2]);
    /// assert!(p.value.to_vec()?[0] < 1.0);
    /// # Ok::<(), graphed::Error>(())
    /// ```
    pub fn step_and_zero_grad(&self) -> Result<()> {
        self.update(true)
    }

    fn update(&self, zero: bool) -> Result<()> {
        // Every tensor fresh before the state is copied (the tables hold them all, whichever
        // way the step launches).
        self.check_tables()?;
        // The step count and the scheduled rate change in the first launches: a failed update
        // after them puts them back (see `restoring`).
        restoring(&[&self.state, &self.lr], |_| true, |_| self.launch_update(zero))
    }

    fn launch_update(&self, zero: bool) -> Result<()> {
        let config = self.config;
        let (beta1, beta2) = (config.beta1, config.beta2);
        match exec(self.state.device()) {
            Exec::Host(h) => {
                let st = self.state.host_ptr()?;
                h.run(BuiltinKernel::AdamwPrepareF32, move || {
                    let t = st.read()[0].to_bits().wrapping_add(1);
                    let (bc1, bc2) = cpu::adamw_bias_corrections(t, beta1, beta2);
                    st.write(&[f32::from_bits(t), bc1, bc2]);
                    Ok(())
                })?;
            }
            Exec::Cuda(c) => c.launch(
                BuiltinKernel::AdamwPrepareF32,
                LaunchDims::rows(1, 32),
                &[KArg::Ptr(self.state.cuda_ptr()?), KArg::F32(beta1), KArg::F32(beta2)],
            )?,
        }
        if let Some(s) = &self.schedule {
            s.apply(&self.lr, &self.state)?;
        }
        if self.launches == Launches::MultiTensor {
            return self.update_tables(None, zero_bits(zero));
        }
        for ((p, m), v) in self.params.iter().zip(&self.m).zip(&self.v) {
            let n = n32("AdamW::step", p.value.numel())?;
            match exec(p.value.device()) {
                Exec::Host(h) => {
                    let (pp, gp, mp, vp) = (p.value.host_ptr()?, p.grad.host_ptr()?, m.host_ptr()?, v.host_ptr()?);
                    let (lp, st) = (self.lr.host_ptr()?, self.state.host_ptr()?);
                    h.run(BuiltinKernel::AdamwStepF32, move || {
                        let (lr, s) = (lp.read()[0], st.read());
                        let (mut pv, mut mv, mut vv) = (pp.read(), mp.read(), vp.read());
                        let g = gp.read();
                        if zero {
                            gp.write(&vec![0.0; g.len()]);
                        }
                        config.update(&mut pv, &g, &mut mv, &mut vv, lr, &s);
                        pp.write(&pv);
                        mp.write(&mv);
                        vp.write(&vv);
                        Ok(())
                    })?;
                }
                Exec::Cuda(c) => {
                    let mut args = ptr_args(&[&p.value, &p.grad, m, v, &self.lr, &self.state])?;
                    args.extend(config.kernel_args(zero as u32));
                    args.push(KArg::U32(n));
                    c.launch(BuiltinKernel::AdamwStepF32, LaunchDims::elementwise(n as usize), &args)?;
                }
            }
        }
        Ok(())
    }

    /// Sets every parameter's grad to zero (capturable): one launch (one per parameter with
    /// [`Launches::PerTensor`]).
    pub fn zero_grad(&self) -> Result<()> {
        self.tables.zero_grads(self.launches, &self.params)
    }

    /// Checks every table before a launch reads one (no device work).
    fn check_tables(&self) -> Result<()> {
        self.tables.check()
    }

    /// The update of every parameter, one launch a table: skipped on the device when `flag`
    /// (the loss scaler's state; `None`: never) has its overflow flag set; `zero`: the
    /// [`ZERO_UPDATED`] and [`ZERO_SKIPPED`] bits. The caller checked the tables.
    fn update_tables(&self, flag: Option<&Tensor>, zero: u32) -> Result<()> {
        let config = self.config;
        for (kernel, table) in self.tables.iter() {
            match exec(self.state.device()) {
                Exec::Host(h) => {
                    let rows = table.host_rows()?;
                    let (lp, st) = (self.lr.host_ptr()?, self.state.host_ptr()?);
                    let fl = flag.map(Tensor::host_ptr).transpose()?;
                    h.run(*kernel, move || {
                        let skip = fl.as_ref().is_some_and(|f| f.read()[1] != 0.0);
                        let (lr, s) = (lp.read()[0], st.read());
                        for row in &rows {
                            let (Some(p), Some(g), Some(m), Some(v)) = (&row[P], &row[G], &row[M], &row[V]) else {
                                continue;
                            };
                            let zeros = || g.write(&vec![0.0; g.len]);
                            if skip {
                                if zero & ZERO_SKIPPED != 0 {
                                    zeros();
                                }
                                continue;
                            }
                            let (mut pv, mut mv, mut vv) = (p.read(), m.read(), v.read());
                            let gv = g.read();
                            config.update(&mut pv, &gv, &mut mv, &mut vv, lr, &s);
                            p.write(&pv);
                            if let Some(model) = &row[MODEL] {
                                model.write(&pv);
                            }
                            m.write(&mv);
                            v.write(&vv);
                            if zero & ZERO_UPDATED != 0 {
                                zeros();
                            }
                        }
                        Ok(())
                    })?;
                }
                Exec::Cuda(c) => {
                    let flag = flag.map(Tensor::cuda_ptr).transpose()?.unwrap_or(0);
                    let mut args = ptr_args(&[&self.lr, &self.state])?;
                    args.push(KArg::Ptr(flag));
                    args.extend(config.kernel_args(zero));
                    table.launch(c, *kernel, &args)?;
                }
            }
        }
        Ok(())
    }
}
