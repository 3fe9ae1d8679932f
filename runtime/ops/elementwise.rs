//! Out-of-place arithmetic and deterministic full reductions.

use crate::backend::{KArg, LaunchDims};
use crate::ops::activation::binary;
use crate::ops::{check_like, cpu, cuda_reduce, exec, k, n32, Exec};
use crate::{Result, Tensor};

/// `a + b`, elementwise (same shapes; no broadcasting).
///
/// ```
/// # use graphed::{ops, Device, Tensor};
/// let dev = Device::host();
/// let a = Tensor::from_slice(&dev, &[1.0, 2.0], &[2])?;
/// let b = Tensor::from_slice(&dev, &[10.0, 20.0], &[2])?;
/// assert_eq!(ops::add(&a, &b)?.to_vec()?, vec![11.0, 22.0]);
/// # Ok::<(), graphed::Error>(())
/// ```
pub fn add(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    binary("add", k::ADD, a, b, &[], cpu::add)
}

/// `a * b`, elementwise (same shapes; no broadcasting).
///
/// ```
/// # use graphed::{ops, Device, Tensor};
/// let dev = Device::host();
/// let a = Tensor::from_slice(&dev, &[1.0, 2.0], &[2])?;
/// let b = Tensor::from_slice(&dev, &[10.0, 20.0], &[2])?;
/// assert_eq!(ops::mul(&a, &b)?.to_vec()?, vec![10.0, 40.0]);
/// # Ok::<(), graphed::Error>(())
/// ```
pub fn mul(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    binary("mul", k::MUL, a, b, &[], cpu::mul)
}

/// `x * a` into a new tensor (see [`crate::ops::scale_`] for the in-place version).
///
/// ```
/// # use graphed::{ops, Device, Tensor};
/// let dev = Device::host();
/// let x = Tensor::from_slice(&dev, &[1.0, -2.0], &[2])?;
/// assert_eq!(ops::scale(&x, 3.0)?.to_vec()?, vec![3.0, -6.0]);
/// # Ok::<(), graphed::Error>(())
/// ```
pub fn scale(x: &Tensor, a: f32) -> Result<Tensor> {
    let dtype = check_like("scale", &[x])?;
    let kernel = k::SCALE_OUT.get(dtype);
    let n = n32("scale", x.numel())?;
    let y = Tensor::empty_like(x)?;
    match exec(x.device()) {
        Exec::Host(h) => {
            let (xp, yp) = (x.host_ptr()?, y.host_ptr()?);
            h.run(kernel, move || {
                yp.write(&cpu::scale(&xp.read(), a));
                Ok(())
            })?;
        }
        Exec::Cuda(c) => c.launch(
            kernel,
            LaunchDims::vectorized(n as usize, dtype),
            &[KArg::Ptr(y.cuda_ptr()?), KArg::Ptr(x.cuda_ptr()?), KArg::F32(a), KArg::U32(n)],
        )?,
    }
    Ok(y)
}

fn reduce(op: &'static str, x: &Tensor, mean: bool) -> Result<Tensor> {
    let partial = k::SUM_PARTIAL.get(check_like(op, &[x])?);
    let n = n32(op, x.numel())?;
    let y = Tensor::empty(x.device(), &[1])?;
    match exec(x.device()) {
        Exec::Host(h) => {
            let (xp, yp) = (x.host_ptr()?, y.host_ptr()?);
            h.run(if mean { "mean_f32" } else { "sum_f32" }, move || {
                let v = xp.read();
                yp.write(&[if mean { cpu::mean(&v) } else { cpu::sum(&v) }]);
                Ok(())
            })?;
        }
        Exec::Cuda(c) => {
            let scale = if mean { 1.0 / n as f32 } else { 1.0 };
            cuda_reduce(c, x.device(), partial, &[KArg::Ptr(x.cuda_ptr()?)], n, y.cuda_ptr()?, scale)?;
        }
    }
    Ok(y)
}

/// The sum of all elements, as a `[1]` f32 tensor (bf16 and f16 inputs are summed in f32). Deterministic: on CUDA a two-pass tree whose
/// order depends only on the size (no atomics), so replays are bitwise equal to eager runs.
///
/// ```
/// # use graphed::{ops, Device, Tensor};
/// let dev = Device::host();
/// let x = Tensor::from_slice(&dev, &[1.0, 2.0, 3.0], &[3])?;
/// assert_eq!(ops::sum(&x)?.to_vec()?, vec![6.0]);
/// # Ok::<(), graphed::Error>(())
/// ```
pub fn sum(x: &Tensor) -> Result<Tensor> {
    reduce("sum", x, false)
}

/// The mean of all elements, as a `[1]` f32 tensor (deterministic like [`sum`]; NaN when empty).
///
/// ```
/// # use graphed::{ops, Device, Tensor};
/// let dev = Device::host();
/// let x = Tensor::from_slice(&dev, &[1.0, 2.0, 3.0, 6.0], &[2, 2])?;
/// assert_eq!(ops::mean(&x)?.to_vec()?, vec![3.0]);
/// # Ok::<(), graphed::Error>(())
/// ```
pub fn mean(x: &Tensor) -> Result<Tensor> {
    reduce("mean", x, true)
}
