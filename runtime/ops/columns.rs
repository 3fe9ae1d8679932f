//! Column blocks: a tensor's last axis split into blocks, and blocks joined side by side (as
//! `torch.split` and `torch.cat` along the last dimension, copying). One projection with stacked
//! weights makes several outputs at once (q, k and v; gate and up); these give them back as
//! tensors of their own where an op needs them apart.

use crate::backend::{BuiltinKernel as B, CudaBackend, KArg, LaunchDims};
use crate::ops::{cpu, exec, n32, Exec};
use crate::{DType, Error, Result, ShapeProblem, Tensor};

/// The rows (everything before the last axis) and the last axis of `t`.
fn rows_and_width(op: &'static str, arg: &'static str, t: &Tensor) -> Result<(usize, usize)> {
    match t.dims() {
        [lead @ .., width] => Ok((lead.iter().product(), *width)),
        [] => Err(Error::shape(op, ShapeProblem::layout(arg, "[.., width]", t.dims()))),
    }
}

/// One column block of `dtype` copied on CUDA: `rows x cols` values from `src` (rows `sld`
/// apart) into `dst` (rows `dld` apart), both addresses at the block's first column.
pub(super) fn copy_block(
    c: &CudaBackend,
    dtype: DType,
    [dst, src]: [u64; 2],
    rows: usize,
    cols: usize,
    [dld, sld]: [usize; 2],
) -> Result<()> {
    let kernel = column_kernel(dtype);
    let n = n32("copy_cols", rows * cols)?;
    let dims = [rows, cols, dld, sld].map(|v| n32("copy_cols", v).map(KArg::U32));
    let [r, c2, d, s] = dims;
    let args = [KArg::Ptr(dst), KArg::Ptr(src), r?, c2?, d?, s?];
    c.launch(kernel, LaunchDims::elementwise(n as usize), &args)
}

/// Splits the last axis of `x` into blocks of `widths` (which sum to it): returns one tensor a
/// block, `x`'s leading dimensions and the block's width, in order. Any dtype; copies.
///
/// Errors: `widths` empty or holding a zero ([`ShapeProblem::Layout`]); widths that do not
/// sum to `x`'s last dimension ([`ShapeProblem::Axis`]); `x` of 2³² elements or more
/// ([`crate::error::OpError::TooLarge`]); a stale `x` ([`Error::StaleTensor`]). Each before
/// anything is allocated.
///
/// ```
/// # use graphed::{ops, Device, Tensor};
/// let dev = Device::host();
/// let x = Tensor::from_slice(&dev, &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3])?;
/// let parts = ops::split_columns(&x, &[1, 2])?;
/// assert_eq!(parts[0].to_vec()?, vec![1.0, 4.0]);
/// assert_eq!((parts[1].dims(), parts[1].to_vec()?), (&[2, 2][..], vec![2.0, 3.0, 5.0, 6.0]));
/// # Ok::<(), graphed::Error>(())
/// ```
pub fn split_columns(x: &Tensor, widths: &[usize]) -> Result<Vec<Tensor>> {
    const OP: &str = "split_columns";
    let (rows, width) = rows_and_width(OP, "x", x)?;
    if widths.is_empty() || widths.contains(&0) {
        return Err(Error::shape(OP, ShapeProblem::layout("widths", "at least one width, none zero", widths)));
    }
    let total = widths.iter().try_fold(0usize, |a, &w| a.checked_add(w)).unwrap_or(usize::MAX);
    if total != width {
        let axis = x.dims().len() - 1;
        return Err(Error::shape(
            OP,
            ShapeProblem::Axis { arg: "x", got: x.dims().to_vec(), axis, expected: total, from: "the sum of widths" },
        ));
    }
    // The copy kernels index in u32: refused here, before any part is made.
    n32(OP, x.numel())?;
    x.check_fresh()?;
    let lead = &x.dims()[..x.dims().len() - 1];
    let parts = widths
        .iter()
        .map(|&w| Tensor::empty_as(x.device(), &[lead, &[w]].concat(), x.dtype()))
        .collect::<Result<Vec<_>>>()?;
    match exec(x.device()) {
        Exec::Host(h) => {
            let xp = x.host_ptr()?;
            let outs = parts.iter().map(Tensor::host_ptr).collect::<Result<Vec<_>>>()?;
            let (kernel, widths) = (column_kernel(x.dtype()), widths.to_vec());
            h.run(kernel, move || {
                for (o, v) in outs.iter().zip(cpu::split_columns(&xp.read(), &widths)) {
                    o.write(&v);
                }
                Ok(())
            })?;
        }
        Exec::Cuda(c) => {
            let (base, size) = (x.cuda_ptr()?, x.dtype().size());
            let mut at = 0;
            for (part, &w) in parts.iter().zip(widths) {
                copy_block(c, x.dtype(), [part.cuda_ptr()?, base + (at * size) as u64], rows, w, [w, width])?;
                at += w;
            }
        }
    }
    Ok(parts)
}

/// Joins `parts` side by side along the last axis: each row of the result is the parts' rows
/// in order. The parts share their dtype and leading dimensions; copies. The inverse of
/// [`split_columns`].
///
/// Errors: no parts ([`ShapeProblem::Layout`]), parts of different dtypes
/// ([`Error::DTypeMismatch`]), devices ([`Error::DeviceMismatch`]) or leading dimensions
/// ([`ShapeProblem::Differ`]), an output of 2³² elements or more
/// ([`crate::error::OpError::TooLarge`]), a stale part ([`Error::StaleTensor`]). Each before
/// anything is allocated.
///
/// ```
/// # use graphed::{ops, Device, Tensor};
/// let dev = Device::host();
/// let a = Tensor::from_slice(&dev, &[1.0, 4.0], &[2, 1])?;
/// let b = Tensor::from_slice(&dev, &[2.0, 3.0, 5.0, 6.0], &[2, 2])?;
/// let x = ops::concat_columns(&[&a, &b])?;
/// assert_eq!((x.dims(), x.to_vec()?), (&[2, 3][..], vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]));
/// # Ok::<(), graphed::Error>(())
/// ```
pub fn concat_columns(parts: &[&Tensor]) -> Result<Tensor> {
    const OP: &str = "concat_columns";
    let Some(first) = parts.first() else {
        return Err(Error::shape(OP, ShapeProblem::layout("parts", "at least one tensor", &[])));
    };
    let dtype = first.dtype();
    for p in parts {
        if p.dtype() != dtype {
            return Err(Error::DTypeMismatch { op: OP, a: dtype, b: p.dtype() });
        }
        if p.device() != first.device() {
            return Err(Error::DeviceMismatch { op: OP, a: first.device().name(), b: p.device().name() });
        }
        p.check_fresh()?;
    }
    let (rows, _) = rows_and_width(OP, "parts", first)?;
    let lead = &first.dims()[..first.dims().len() - 1];
    let mut widths = Vec::with_capacity(parts.len());
    for p in parts {
        let (_, w) = rows_and_width(OP, "parts", p)?;
        if &p.dims()[..p.dims().len() - 1] != lead {
            return Err(Error::shape(OP, ShapeProblem::Differ { a: first.dims().to_vec(), b: p.dims().to_vec() }));
        }
        widths.push(w);
    }
    let width: usize = widths.iter().sum();
    // The copy kernels index in u32: refused here, before the output is made.
    n32(OP, rows.saturating_mul(width))?;
    let out = Tensor::empty_as(first.device(), &[lead, &[width]].concat(), dtype)?;
    match exec(first.device()) {
        Exec::Host(h) => {
            let ins = parts.iter().map(|p| p.host_ptr()).collect::<Result<Vec<_>>>()?;
            let op = out.host_ptr()?;
            h.run(column_kernel(dtype), move || {
                let values: Vec<Vec<f32>> = ins.iter().map(|p| p.read()).collect();
                let slices: Vec<&[f32]> = values.iter().map(Vec::as_slice).collect();
                op.write(&cpu::concat_columns(&slices, &widths));
                Ok(())
            })?;
        }
        Exec::Cuda(c) => {
            let (base, size) = (out.cuda_ptr()?, dtype.size());
            let mut at = 0;
            for (p, &w) in parts.iter().zip(&widths) {
                copy_block(c, dtype, [base + (at * size) as u64, p.cuda_ptr()?], rows, w, [width, w])?;
                at += w;
            }
        }
    }
    Ok(out)
}

/// The kernel a dtype's column copy runs (named on the host backend too).
fn column_kernel(dtype: DType) -> B {
    if dtype.size() == 2 {
        B::CopyColsU16
    } else {
        B::CopyColsU32
    }
}
