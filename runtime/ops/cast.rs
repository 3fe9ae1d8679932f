//! Casts between f32, bf16 and f16.

use crate::backend::{BuiltinKernel, KArg, LaunchDims};
use crate::ops::{exec, n32, Exec};
use crate::{DType, Error, Result, Tensor};

/// The kernel that converts `from` to `to` (`None` when they are equal: a copy).
fn cast_kernel(from: DType, to: DType) -> Option<BuiltinKernel> {
    use BuiltinKernel as B;
    Some(match (from, to) {
        (DType::F32, DType::BF16) => B::CastF32Bf16,
        (DType::F32, DType::F16) => B::CastF32F16,
        (DType::BF16, DType::F32) => B::CastBf16F32,
        (DType::F16, DType::F32) => B::CastF16F32,
        (DType::BF16, DType::F16) => B::CastBf16F16,
        (DType::F16, DType::BF16) => B::CastF16Bf16,
        _ => return None,
    })
}

/// `x` converted to `dtype` in a new tensor: widening is exact, narrowing rounds to nearest
/// even (f32 values beyond f16's range become infinities). Captured like any op; to the same
/// dtype it is a copy.
///
/// ```
/// # use graphed::{ops, DType, Device, Tensor};
/// let dev = Device::host();
/// let x = Tensor::from_slice(&dev, &[1.0 / 3.0, 70000.0], &[2])?;
/// let h = ops::cast(&x, DType::F16)?;
/// assert_eq!(h.dtype(), DType::F16);
/// assert_eq!(h.to_vec()?, vec![0.333_251_95, f32::INFINITY]);
/// let b = ops::cast(&x, DType::BF16)?;
/// assert_eq!(b.to_vec()?, vec![0.333_984_38, 70144.0]);
/// # Ok::<(), graphed::Error>(())
/// ```
pub fn cast(x: &Tensor, dtype: DType) -> Result<Tensor> {
    const OP: &str = "cast";
    x.check_fresh()?;
    if x.dtype() != dtype && !(x.dtype().is_float() && dtype.is_float()) {
        let got = if x.dtype().is_float() { dtype } else { x.dtype() };
        return Err(Error::DType { op: OP, got, expected: DType::F32 });
    }
    let n = n32(OP, x.numel())?;
    let Some(kernel) = cast_kernel(x.dtype(), dtype) else { return x.deep_clone() };
    let y = Tensor::empty_as(x.device(), x.dims(), dtype)?;
    match exec(x.device()) {
        Exec::Host(h) => {
            let (xp, yp) = (x.host_ptr()?, y.host_ptr()?);
            h.run(kernel, move || {
                yp.write(&xp.read());
                Ok(())
            })?;
        }
        Exec::Cuda(c) => c.launch(
            kernel,
            // The cast kernels convert 8 elements per thread.
            LaunchDims::elementwise((n as usize).div_ceil(8)),
            &[KArg::Ptr(y.cuda_ptr()?), KArg::Ptr(x.cuda_ptr()?), KArg::U32(n)],
        )?,
    }
    Ok(y)
}

impl Tensor {
    /// This tensor converted to `dtype` in new memory (see [`cast`]). Defined with the op, so
    /// that tensors stay storage and the ops build on them, not the reverse.
    pub fn to_dtype(&self, dtype: DType) -> Result<Tensor> {
        cast(self, dtype)
    }
}
