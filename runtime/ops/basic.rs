//! Fill, copy, axpy and scale: the ops the runtime itself needs.

use crate::backend::{BuiltinKernel, KArg, LaunchDims};
use crate::ops::{check_same, check_shape, exec, n32, Exec};
use crate::{Result, Tensor};

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
    check_same("fill_", &[y])?;
    let n = n32("fill_", y.numel())?;
    y.device().backend().fill_f32(&y.ptr()?, n, value)
}

/// Copies `src` into `dst` (same shape), in place. Captured as a copy node on a GPU.
pub fn copy_(dst: &Tensor, src: &Tensor) -> Result<()> {
    dst.copy_(src)
}

/// `y += a * x`, in place.
pub fn axpy_(y: &Tensor, a: f32, x: &Tensor) -> Result<()> {
    check_same("axpy_", &[y, x])?;
    check_shape("axpy_", y, x)?;
    let n = n32("axpy_", y.numel())?;
    match exec(y.device()) {
        Exec::Host(h) => {
            let (yp, xp) = (y.host_ptr()?, x.host_ptr()?);
            h.run(BuiltinKernel::AxpyF32, move || {
                let (xs, mut ys) = (xp.read(), yp.read());
                for (yv, xv) in ys.iter_mut().zip(&xs) {
                    *yv = a.mul_add(*xv, *yv);
                }
                yp.write(&ys);
                Ok(())
            })
        }
        Exec::Cuda(c) => c.launch(
            BuiltinKernel::AxpyF32,
            LaunchDims::elementwise(n as usize),
            &[KArg::Ptr(y.cuda_ptr()?), KArg::Ptr(x.cuda_ptr()?), KArg::F32(a), KArg::U32(n)],
        ),
    }
}

/// `y *= a`, in place.
pub fn scale_(y: &Tensor, a: f32) -> Result<()> {
    check_same("scale_", &[y])?;
    let n = n32("scale_", y.numel())?;
    match exec(y.device()) {
        Exec::Host(h) => {
            let yp = y.host_ptr()?;
            h.run(BuiltinKernel::ScaleF32, move || {
                let v: Vec<f32> = yp.read().into_iter().map(|v| v * a).collect();
                yp.write(&v);
                Ok(())
            })
        }
        Exec::Cuda(c) => c.launch(
            BuiltinKernel::ScaleF32,
            LaunchDims::elementwise(n as usize),
            &[KArg::Ptr(y.cuda_ptr()?), KArg::F32(a), KArg::U32(n)],
        ),
    }
}
