//! Checking a custom kernel's CUDA code against its host implementation on random inputs.

use std::cell::RefCell;

use super::host::{HostArgs, HostSlot};
use crate::error::KernelError;
use crate::{Arg, Device, Kernel, KernelArg, LaunchConfig, Result, Tensor};

/// One argument of [`check_kernel_against_host`]: a tensor's dimensions (its contents are
/// random) or a scalar's value.
#[derive(Clone, Copy, Debug)]
pub enum CheckArg<'a> {
    /// A tensor of these dimensions, filled with random values in [-1, 1).
    Tensor(&'a [usize]),
    /// A `float`.
    F32(f32),
    /// An `unsigned int`.
    U32(u32),
    /// An `int`.
    I32(i32),
}

/// How one output of a kernel compares with its host implementation.
#[derive(Clone, Debug, PartialEq)]
pub struct OutputCheck {
    /// The argument's position.
    pub position: usize,
    /// The largest absolute difference of one element.
    pub max_abs_diff: f32,
    /// ‖device − host‖ / ‖host‖ (0 when both are bitwise equal; infinite when only one side
    /// has a NaN somewhere).
    pub rel_err: f64,
}

/// What [`check_kernel_against_host`] found; `Display` prints one line per kernel.
///
/// ```
/// use graphed::{KernelCheckReport, OutputCheck};
/// let report = KernelCheckReport {
///     kernel: "k".into(),
///     device: "host".into(),
///     tolerance: 1e-6,
///     outputs: vec![OutputCheck { position: 0, max_abs_diff: 0.0, rel_err: 0.0 }],
/// };
/// assert!(report.passed());
/// assert!(report.to_string().starts_with("kernel `k` on host vs host: ok"));
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct KernelCheckReport {
    /// The kernel's entry name.
    pub kernel: String,
    /// The device the kernel ran on.
    pub device: String,
    /// The tolerance the relative errors were held to.
    pub tolerance: f64,
    /// One entry per output argument.
    pub outputs: Vec<OutputCheck>,
}

impl KernelCheckReport {
    /// Whether every output's relative error is within the tolerance.
    pub fn passed(&self) -> bool {
        self.outputs.iter().all(|o| o.rel_err <= self.tolerance)
    }
}

impl std::fmt::Display for KernelCheckReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let verdict = if self.passed() { "ok" } else { "MISMATCH" };
        write!(f, "kernel `{}` on {} vs host: {verdict}", self.kernel, self.device)?;
        for o in &self.outputs {
            write!(f, "; arg {} rel err {:.2e} (max abs {:.2e})", o.position, o.rel_err, o.max_abs_diff)?;
        }
        Ok(())
    }
}

/// Runs `kernel` on `device` and its host implementation on the same random inputs, and
/// compares every output (relative L2 error against `tolerance`). On the host backend both
/// sides are the host implementation, so it checks only that the launch path works.
///
/// `args` has one entry per declared argument; outputs start from random contents too, so
/// elements a kernel does not write compare equal.
///
/// ```
/// use graphed::{check_kernel_against_host, Arg, CheckArg, Device, Kernel, LaunchConfig};
/// let src = r#"extern "C" __global__ void sq(float* y, const float* x, unsigned n) {
///     unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
///     if (i < n) y[i] = x[i] * x[i];
/// }"#;
/// let sq = Kernel::new("sq", src, &[Arg::TensorOut, Arg::TensorIn, Arg::U32], |a| {
///     let x = a.input(1)?;
///     a.output(0)?.iter_mut().zip(x.iter()).for_each(|(y, x)| *y = x * x);
///     Ok(())
/// })?;
/// let dims = [1000];
/// let args = [CheckArg::Tensor(&dims), CheckArg::Tensor(&dims), CheckArg::U32(1000)];
/// let report = check_kernel_against_host(&sq, &Device::default_device(), LaunchConfig::for_elements(1000), &args, 7, 1e-6)?;
/// assert!(report.passed(), "{report}");
/// # Ok::<(), graphed::Error>(())
/// ```
pub fn check_kernel_against_host(
    kernel: &Kernel,
    device: &Device,
    config: LaunchConfig,
    args: &[CheckArg<'_>],
    seed: u64,
    tolerance: f64,
) -> Result<KernelCheckReport> {
    let sig = kernel.signature();
    if args.len() != sig.len() {
        return Err(
            KernelError::ArgCount { kernel: kernel.name().to_string(), expected: sig.len(), got: args.len() }.into()
        );
    }
    let data: Vec<Option<Vec<f32>>> = args
        .iter()
        .enumerate()
        .map(|(i, a)| match a {
            CheckArg::Tensor(dims) => Some(random_values(dims.iter().product(), seed.wrapping_add(i as u64))),
            _ => None,
        })
        .collect();
    // The device side, through the ordinary launch path.
    let tensors: Vec<Option<Tensor>> = args
        .iter()
        .zip(&data)
        .map(|(a, d)| match (a, d) {
            (CheckArg::Tensor(dims), Some(d)) => Tensor::from_slice(device, d, dims).map(Some),
            _ => Ok(None),
        })
        .collect::<Result<_>>()?;
    let launch_args: Vec<KernelArg<'_>> = args
        .iter()
        .zip(sig)
        .zip(&tensors)
        .map(|((a, kind), t)| match (a, t) {
            (CheckArg::F32(v), _) => KernelArg::F32(*v),
            (CheckArg::U32(v), _) => KernelArg::U32(*v),
            (CheckArg::I32(v), _) => KernelArg::I32(*v),
            (CheckArg::Tensor(_), Some(t)) => match kind {
                Arg::TensorOut => KernelArg::Out(t),
                Arg::TensorInOut => KernelArg::InOut(t),
                _ => KernelArg::In(t),
            },
            // Every tensor entry has its tensor; were one missing, the launch's kind check
            // would refuse this stand-in.
            (CheckArg::Tensor(_), None) => KernelArg::F32(f32::NAN),
        })
        .collect();
    kernel.launch(config, &launch_args)?;
    // The host side, on the same values.
    let slots = args
        .iter()
        .zip(sig)
        .zip(data)
        .map(|((a, kind), d)| match a {
            CheckArg::Tensor(dims) => {
                HostSlot::Tensor { kind: *kind, dims: dims.to_vec(), data: RefCell::new(d.unwrap_or_default()) }
            }
            CheckArg::F32(v) => HostSlot::F32(*v),
            CheckArg::U32(v) => HostSlot::U32(*v),
            CheckArg::I32(v) => HostSlot::I32(*v),
        })
        .collect();
    let host_outputs = kernel.run_host_on(HostArgs::new(kernel.interned_name(), slots, config))?;
    let mut outputs = Vec::with_capacity(host_outputs.len());
    for (position, want) in host_outputs {
        let got = tensors[position].as_ref().map(Tensor::to_vec).transpose()?.unwrap_or_default();
        outputs.push(compare(position, &got, &want));
    }
    Ok(KernelCheckReport { kernel: kernel.name().to_string(), device: device.name(), tolerance, outputs })
}

fn compare(position: usize, got: &[f32], want: &[f32]) -> OutputCheck {
    let bitwise = got.len() == want.len() && got.iter().zip(want).all(|(a, b)| a.to_bits() == b.to_bits());
    if bitwise {
        return OutputCheck { position, max_abs_diff: 0.0, rel_err: 0.0 };
    }
    let nan = got.iter().chain(want).any(|v| v.is_nan()) || got.len() != want.len();
    let max_abs_diff = got.iter().zip(want).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
    let num: f64 = got.iter().zip(want).map(|(a, b)| (f64::from(*a) - f64::from(*b)).powi(2)).sum();
    let den: f64 = want.iter().map(|b| f64::from(*b).powi(2)).sum();
    let rel_err = if nan { f64::INFINITY } else { (num / den.max(1e-30)).sqrt() };
    OutputCheck { position, max_abs_diff, rel_err }
}

/// Deterministic values in [-1, 1) (xorshift).
fn random_values(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}
