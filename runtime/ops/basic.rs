//! Fill, copy, axpy and scale: the ops the runtime itself needs. All take f32, bf16 or f16
//! tensors (one dtype per call); 16-bit results are rounded to nearest even.

use crate::backend::{KArg, LaunchDims};
use crate::ops::{check_like, check_shape, exec, k, n32, Exec};
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
