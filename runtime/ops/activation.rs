//! ReLU and GELU with their backwards.

use crate::backend::{KArg, LaunchDims, Typed};
use crate::ops::{check_like, check_shape, cpu, exec, k, n32, Exec};
use crate::{Result, Tensor};

/// Which GELU: the exact one, `x·Φ(x)` with the normal CDF through `erf`, or the `tanh`
/// approximation. The default is [`Gelu::Erf`], like PyTorch's `approximate='none'`.
///
/// ```
/// assert_eq!(graphed::ops::Gelu::default(), graphed::ops::Gelu::Erf);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Gelu {
    /// `0.5·x·(1 + erf(x/√2))` (PyTorch `approximate='none'`), the default.
    #[default]
    Erf,
    /// `0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))` (PyTorch `approximate='tanh'`).
    Tanh,
}

impl Gelu {
    fn flag(self) -> u32 {
        match self {
            Gelu::Erf => 0,
            Gelu::Tanh => 1,
        }
    }
}

/// Runs an elementwise unary kernel `kernel(y, x, n, extra..)` or its CPU reference, in the
/// dtype of `x` (16-bit results rounded to nearest even on both backends).
fn unary(
    op: &'static str,
    kernel: Typed,
    x: &Tensor,
    extra: &[KArg],
    f: impl Fn(&[f32]) -> Vec<f32> + Send + Sync + 'static,
) -> Result<Tensor> {
    let dtype = check_like(op, &[x])?;
    let kernel = kernel.get(dtype);
    let n = n32(op, x.numel())?;
    let y = Tensor::empty_like(x)?;
    match exec(x.device()) {
        Exec::Host(h) => {
            let (xp, yp) = (x.host_ptr()?, y.host_ptr()?);
            h.run(kernel, move || {
                yp.write(&f(&xp.read()));
                Ok(())
            })?;
        }
        Exec::Cuda(c) => {
            let mut args = vec![KArg::Ptr(y.cuda_ptr()?), KArg::Ptr(x.cuda_ptr()?), KArg::U32(n)];
            args.extend_from_slice(extra);
            c.launch(kernel, LaunchDims::vectorized(n as usize, dtype), &args)?;
        }
    }
    Ok(y)
}

/// Runs an elementwise binary kernel `kernel(y, a, b, n, extra..)` or its CPU reference, in
/// the dtype of `a` and `b`.
pub(crate) fn binary(
    op: &'static str,
    kernel: Typed,
    a: &Tensor,
    b: &Tensor,
    extra: &[KArg],
    f: impl Fn(&[f32], &[f32]) -> Vec<f32> + Send + Sync + 'static,
) -> Result<Tensor> {
    let dtype = check_like(op, &[a, b])?;
    let kernel = kernel.get(dtype);
    check_shape(op, a, b)?;
    let n = n32(op, a.numel())?;
    let y = Tensor::empty_like(a)?;
    match exec(a.device()) {
        Exec::Host(h) => {
            let (ap, bp, yp) = (a.host_ptr()?, b.host_ptr()?, y.host_ptr()?);
            h.run(kernel, move || {
                yp.write(&f(&ap.read(), &bp.read()));
                Ok(())
            })?;
        }
        Exec::Cuda(c) => {
            let mut args =
                vec![KArg::Ptr(y.cuda_ptr()?), KArg::Ptr(a.cuda_ptr()?), KArg::Ptr(b.cuda_ptr()?), KArg::U32(n)];
            args.extend_from_slice(extra);
            c.launch(kernel, LaunchDims::vectorized(n as usize, dtype), &args)?;
        }
    }
    Ok(y)
}

/// `max(x, 0)`, elementwise.
///
/// ```
/// # use graphed::{ops, Device, Tensor};
/// let dev = Device::host();
/// let x = Tensor::from_slice(&dev, &[-1.0, 0.0, 2.0], &[3])?;
/// assert_eq!(ops::relu(&x)?.to_vec()?, vec![0.0, 0.0, 2.0]);
/// # Ok::<(), graphed::Error>(())
/// ```
pub fn relu(x: &Tensor) -> Result<Tensor> {
    unary("relu", k::RELU, x, &[], cpu::relu)
}

/// The backward of [`relu`]: `dy` where `x > 0`, else 0 (the grad at 0 is 0, as PyTorch).
///
/// ```
/// # use graphed::{ops, Device, Tensor};
/// let dev = Device::host();
/// let x = Tensor::from_slice(&dev, &[-1.0, 0.0, 2.0], &[3])?;
/// let dy = Tensor::from_slice(&dev, &[5.0, 5.0, 5.0], &[3])?;
/// assert_eq!(ops::relu_backward(&dy, &x)?.to_vec()?, vec![0.0, 0.0, 5.0]);
/// # Ok::<(), graphed::Error>(())
/// ```
pub fn relu_backward(dy: &Tensor, x: &Tensor) -> Result<Tensor> {
    binary("relu_backward", k::RELU_BWD, dy, x, &[], cpu::relu_backward)
}

/// GELU, elementwise: exact ([`Gelu::Erf`], the default) or the tanh approximation.
///
/// ```
/// # use graphed::{ops, ops::Gelu, Device, Tensor};
/// let dev = Device::host();
/// let x = Tensor::from_slice(&dev, &[-1.0, 0.0, 1.0], &[3])?;
/// let y = ops::gelu(&x, Gelu::default())?.to_vec()?;
/// assert!((y[2] - 0.841_344_7).abs() < 1e-6 && y[1] == 0.0);
/// let t = ops::gelu(&x, Gelu::Tanh)?.to_vec()?;
/// assert!((t[2] - 0.841_192).abs() < 1e-5);
/// # Ok::<(), graphed::Error>(())
/// ```
pub fn gelu(x: &Tensor, approx: Gelu) -> Result<Tensor> {
    unary("gelu", k::GELU, x, &[KArg::U32(approx.flag())], move |v| cpu::gelu(v, approx))
}

/// The backward of [`gelu`]: `dy · gelu'(x)` for the same `approx`.
///
/// ```
/// # use graphed::{ops, ops::Gelu, Device, Tensor};
/// let dev = Device::host();
/// let x = Tensor::from_slice(&dev, &[0.0], &[1])?;
/// let dy = Tensor::from_slice(&dev, &[2.0], &[1])?;
/// assert_eq!(ops::gelu_backward(&dy, &x, Gelu::Erf)?.to_vec()?, vec![1.0]); // gelu'(0) = 1/2
/// # Ok::<(), graphed::Error>(())
/// ```
pub fn gelu_backward(dy: &Tensor, x: &Tensor, approx: Gelu) -> Result<Tensor> {
    binary("gelu_backward", k::GELU_BWD, dy, x, &[KArg::U32(approx.flag())], move |d, v| {
        cpu::gelu_backward(d, v, approx)
    })
}
