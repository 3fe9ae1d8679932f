//! Ops: each has a CPU reference (the host backend runs it) and a CUDA kernel.
//!
//! Every op checks its arguments first (shapes, dtypes, devices, stale handles) and returns a
//! typed error naming the op; only then does it queue work. Results are new tensors from the
//! device's current pool, except for the in-place ops, whose names end in `_`.

mod basic;

pub use basic::{axpy_, copy_, fill_, scale_};

use crate::backend::{BackendKind, CudaBackend, HostBackend};
use crate::{DType, Device, Error, Result, Tensor};

/// The backend an op runs on, borrowed from the device.
pub(crate) enum Exec<'a> {
    Host(&'a HostBackend),
    Cuda(&'a CudaBackend),
}

pub(crate) fn exec(device: &Device) -> Exec<'_> {
    match &device.backend().kind {
        BackendKind::Host(h) => Exec::Host(h),
        BackendKind::Cuda(c) => Exec::Cuda(c),
    }
}

/// Checks that all tensors are f32 and on the device of the first.
pub(crate) fn check_same(op: &'static str, tensors: &[&Tensor]) -> Result<()> {
    let Some(first) = tensors.first() else { return Ok(()) };
    for t in tensors {
        if t.dtype() != DType::F32 {
            return Err(Error::DType { op, got: t.dtype(), expected: DType::F32 });
        }
        if t.device() != first.device() {
            return Err(Error::DeviceMismatch { op, a: first.device().name(), b: t.device().name() });
        }
    }
    Ok(())
}

/// Checks that two tensors have the same shape.
pub(crate) fn check_shape(op: &'static str, a: &Tensor, b: &Tensor) -> Result<()> {
    if a.dims() != b.dims() {
        return Err(Error::shape(op, format!("{:?} and {:?} must match", a.dims(), b.dims())));
    }
    Ok(())
}

/// The element count as a kernel argument; errors past u32 range.
pub(crate) fn n32(op: &'static str, n: usize) -> Result<u32> {
    u32::try_from(n).map_err(|_| Error::invalid(op, format!("{n} elements exceed the 2^32 kernels support")))
}
