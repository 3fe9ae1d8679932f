//! Fill, copy, axpy and scale: the ops the runtime itself needs. All take f32, bf16 or f16
//! tensors (one dtype per call); 16-bit results are rounded to nearest even.

use crate::backend::{KArg, LaunchDims};
use crate::ops::{check_f32_on, check_like, check_shape, exec, k, n32, Exec};
use crate::{Error, Result, ShapeProblem, Tensor};

/// Sets every element of `y` to `value`, in place.
///
/// ```
/// # use graphed::{ops, Device, Tensor};
/// let dev = Device::host();
/// let y = Tensor::empty(&dev, &[3])?;
/// ops::fill_(&y, 1.5)?;
/// assert_eq!(y.to_vec()?, vec![1.5; 3]);
/// # Ok::<(), graphed::Error>(())
/// ```
pub fn fill_(y: &Tensor, value: f32) -> Result<()> {
    let dtype = check_like("fill_", &[y])?;
    let n = n32("fill_", y.numel())?;
    y.device().backend().fill(&y.ptr()?, n, value, dtype)
}

/// Copies `src` into `dst` (same shape), in place. Captured as a copy node on a GPU.
pub fn copy_(dst: &Tensor, src: &Tensor) -> Result<()> {
    dst.copy_(src)
}

/// `y += a * x`, in place.
pub fn axpy_(y: &Tensor, a: f32, x: &Tensor) -> Result<()> {
    let dtype = check_like("axpy_", &[y, x])?;
    let kernel = k::AXPY.get(dtype);
    check_shape("axpy_", y, x)?;
    let n = n32("axpy_", y.numel())?;
    match exec(y.device()) {
        Exec::Host(h) => {
            let (yp, xp) = (y.host_ptr()?, x.host_ptr()?);
            h.run(kernel, move || {
                let (xs, mut ys) = (xp.read(), yp.read());
                for (yv, xv) in ys.iter_mut().zip(&xs) {
                    *yv = a.mul_add(*xv, *yv);
                }
                yp.write(&ys);
                Ok(())
            })
        }
        Exec::Cuda(c) => c.launch(
            kernel,
            LaunchDims::vectorized(n as usize, dtype),
            &[KArg::Ptr(y.cuda_ptr()?), KArg::Ptr(x.cuda_ptr()?), KArg::F32(a), KArg::U32(n)],
        ),
    }
}

/// `y *= a`, in place.
pub fn scale_(y: &Tensor, a: f32) -> Result<()> {
    let dtype = check_like("scale_", &[y])?;
    let kernel = k::SCALE.get(dtype);
    let n = n32("scale_", y.numel())?;
    match exec(y.device()) {
        Exec::Host(h) => {
            let yp = y.host_ptr()?;
            h.run(kernel, move || {
                let v: Vec<f32> = yp.read().into_iter().map(|v| v * a).collect();
                yp.write(&v);
                Ok(())
            })
        }
        Exec::Cuda(c) => c.launch(
            kernel,
            LaunchDims::vectorized(n as usize, dtype),
            &[KArg::Ptr(y.cuda_ptr()?), KArg::F32(a), KArg::U32(n)],
        ),
    }
}

/// `y *= s[0]`, in place, where `s` is a one-element f32 tensor on `y`'s device: a scale read
/// on the device, so a captured call follows whatever `s` holds at replay (a loss grad handed
/// to a graphed loss module's backward, a loss scale).
///
/// ```
/// # use graphed::{ops, Device, Tensor};
/// let dev = Device::host();
/// let y = Tensor::from_slice(&dev, &[1.0, -2.0], &[2])?;
/// ops::scale_by_(&y, &Tensor::from_slice(&dev, &[0.25], &[1])?)?;
/// assert_eq!(y.to_vec()?, vec![0.25, -0.5]);
/// # Ok::<(), graphed::Error>(())
/// ```
pub fn scale_by_(y: &Tensor, s: &Tensor) -> Result<()> {
    if s.numel() != 1 {
        return Err(Error::shape("scale_by_", ShapeProblem::layout("the scale", "one element", s.dims())));
    }
    scale_by_first_("scale_by_", y, s)
}

/// `y *= s[0]` for any non-empty f32 `s` on `y`'s device (a loss scaler's state holds its scale
/// first).
pub(crate) fn scale_by_first_(op: &'static str, y: &Tensor, s: &Tensor) -> Result<()> {
    let dtype = check_like(op, &[y])?;
    check_f32_on(op, s, y)?;
    if s.numel() == 0 {
        return Err(Error::shape(op, ShapeProblem::layout("the scale", "at least one element", s.dims())));
    }
    let n = n32(op, y.numel())?;
    let kernel = k::SCALE_BY.get(dtype);
    match exec(y.device()) {
        Exec::Host(h) => {
            let (yp, sp) = (y.host_ptr()?, s.host_ptr()?);
            h.run(kernel, move || {
                let a = sp.read()[0];
                yp.write(&yp.read().into_iter().map(|v| v * a).collect::<Vec<_>>());
                Ok(())
            })
        }
        Exec::Cuda(c) => c.launch(
            kernel,
            LaunchDims::elementwise(n as usize),
            &[KArg::Ptr(y.cuda_ptr()?), KArg::Ptr(s.cuda_ptr()?), KArg::U32(n)],
        ),
    }
}
