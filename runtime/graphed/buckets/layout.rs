//! Moving tensors between a call's shape and its bucket's: padding inputs up, trimming outputs
//! down (a view where the trimmed part is the buffer's first elements), and which samples,
//! inputs and outputs follow the buckets along which axes.

use super::spec::{Buckets, Lens, MAX_AXES};
use crate::backend::AxesResize;
use crate::{BucketError, Result, Tensor};

/// Along which declared axes a slot follows the buckets (index `d`: declared axis `d`).
pub(crate) type Along = [bool; MAX_AXES];

/// Whether a slot follows the buckets along any axis.
pub(crate) fn any(along: &Along) -> bool {
    along.iter().any(|b| *b)
}

/// `dims` with each bucketed axis set to its entry of `lens`.
pub(crate) fn resized_dims(dims: &[usize], spec: &Buckets, along: &Along, lens: &Lens) -> Vec<usize> {
    let mut out = dims.to_vec();
    for d in 0..spec.ndims() {
        let (axis, _) = spec.dim(d);
        if along[d] && axis < out.len() {
            out[axis] = lens[d];
        }
    }
    out
}

/// The layout that moves a tensor of `src` dims into one of `dst` dims, which differ along at
/// most two axes ([`BucketError::TooManyAxes`] when they differ along more).
pub(crate) fn layout(dst: &[usize], src: &[usize]) -> Result<AxesResize> {
    let differ: Vec<usize> = (0..dst.len()).filter(|&a| dst[a] != src[a]).collect();
    let prod = |r: std::ops::Range<usize>| dst[r].iter().product::<usize>();
    match differ[..] {
        [] => Ok(AxesResize::one(1, (1, 1), dst.iter().product())),
        [a] => Ok(AxesResize::one(prod(0..a), (dst[a], src[a]), prod(a + 1..dst.len()))),
        [a, b] => Ok(AxesResize {
            outer: prod(0..a),
            len1: (dst[a], src[a]),
            mid: prod(a + 1..b),
            len2: (dst[b], src[b]),
            inner: prod(b + 1..dst.len()),
        }),
        _ => Err(BucketError::TooManyAxes { axes: differ.len(), max: MAX_AXES }.into()),
    }
}

/// `t` cut down to `dims` (no larger along any axis): a view when the kept part is the
/// buffer's first elements (only the outermost non-unit axis shrinks), a copy otherwise (in
/// the device's current pool).
pub(crate) fn trimmed(t: &Tensor, dims: &[usize]) -> Result<Tensor> {
    if t.dims() == dims {
        return Ok(t.clone());
    }
    let first = t.dims().iter().position(|&n| n != 1).unwrap_or(0);
    let only_first = (0..dims.len()).all(|a| a == first || dims[a] == t.dims()[a]);
    if only_first {
        return t.prefix_view(dims);
    }
    let layout = layout(dims, t.dims())?;
    let out = Tensor::empty_as(t.device(), dims, t.dtype())?.with_requires_grad(t.requires_grad());
    t.device().backend().resize_axes(&out.ptr()?, &t.ptr()?, layout, 0.0, t.dtype())?;
    Ok(out)
}

/// Which sample inputs follow the buckets, and along which axes: those with the largest
/// bucket's size along a declared axis. At least one must.
pub(crate) fn bucketed_inputs(samples: &super::super::capture::Samples, spec: &Buckets) -> Result<Vec<Vec<Along>>> {
    let largest = spec.largest();
    let flags: Vec<Vec<Along>> = samples
        .iter()
        .map(|chunk| {
            chunk.first().map_or_else(Vec::new, |set| {
                set.iter()
                    .map(|t| {
                        let mut along = [false; MAX_AXES];
                        for (d, flag) in along.iter_mut().enumerate().take(spec.ndims()) {
                            let (axis, _) = spec.dim(d);
                            *flag = t.as_ref().is_some_and(|t| t.dims().get(axis) == Some(&largest[d]));
                        }
                        along
                    })
                    .collect()
            })
        })
        .collect();
    if !flags.iter().flatten().any(any) {
        return Err(BucketError::NoBucketedInput { axis: spec.axis(), largest: largest[0] }.into());
    }
    Ok(flags)
}

/// The samples of the bucket of `shape`: the bucketed inputs' first positions along the
/// bucketed axes (copies, made outside any graph pool), the rest as given.
pub(crate) fn bucket_samples(
    samples: &super::super::capture::Samples,
    flags: &[Vec<Along>],
    spec: &Buckets,
    shape: &Lens,
) -> Result<super::super::capture::Samples> {
    let mut out = Vec::with_capacity(samples.len());
    for (c, chunk) in samples.iter().enumerate() {
        let mut rows = Vec::with_capacity(chunk.len());
        for set in chunk {
            let mut row = Vec::with_capacity(set.len());
            for (i, t) in set.iter().enumerate() {
                row.push(match (t, flags[c].get(i)) {
                    (Some(t), Some(along)) if any(along) => {
                        Some(trimmed(t, &resized_dims(t.dims(), spec, along, shape))?)
                    }
                    (t, _) => t.clone(),
                });
            }
            rows.push(row);
        }
        out.push(rows);
    }
    Ok(out)
}

/// A copy a checked call makes before it launches.
pub(crate) enum CopyIn {
    /// The whole tensor, same shape.
    Whole { dst: Tensor, src: Tensor },
    /// Padded up along the bucketed axes.
    Pad { dst: Tensor, src: Tensor, layout: AxesResize, value: f32 },
}

impl CopyIn {
    pub(crate) fn run(&self) -> Result<()> {
        match self {
            CopyIn::Whole { dst, src } => dst.copy_(src),
            CopyIn::Pad { dst, src, layout, value } => {
                dst.device().backend().resize_axes(&dst.ptr()?, &src.ptr()?, *layout, *value, dst.dtype())
            }
        }
    }
}
