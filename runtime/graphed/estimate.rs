//! How much pool a list of shape buckets will need, before capturing it: the smallest buckets
//! are captured alone (cheap, and their memory given back), the most bytes each had in use
//! fitted against the bucket size, and the fit extrapolated to the largest bucket. The smaller
//! buckets add almost nothing to the largest one's pool (their buffers are the first elements
//! of its buffers, their temporaries lie in memory it released), so that is the estimate.

use super::buckets::{bucket_samples, bucketed_inputs};
use super::capture::{Modules, Samples};
use super::{make_graphed, CaptureError, GraphOptions};
use crate::{BucketError, Error};

/// One bucket captured alone to estimate the pool of a list ([`estimate_pool`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PoolProbe {
    /// Its size along each declared axis.
    pub shape: Vec<usize>,
    /// The product of those sizes: what the fit is made against.
    pub elements: usize,
    /// The bytes its pool reserved.
    pub reserved: usize,
    /// The most bytes its pool had in use.
    pub peak_in_use: usize,
}

/// An estimate of the pool that [`make_graphed`] with [`GraphOptions::buckets`] will reserve
/// ([`estimate_pool`]).
#[derive(Clone, Debug, PartialEq)]
pub struct PoolEstimate {
    /// The buckets probed, each captured alone.
    pub probes: Vec<PoolProbe>,
    /// The whole list's shared pool: the largest bucket's bytes in use at most, extrapolated
    /// from the probes.
    pub bytes: usize,
}

/// Estimates the pool [`make_graphed`]`(modules, samples, options)` will reserve for the
/// shape buckets of `options`, before committing that memory: the (up to) three smallest
/// buckets are captured one at a time, each alone in a pool that is freed at once, and the
/// most bytes each had in use are fitted with a polynomial in the bucket size (of degree one
/// less than the probes, so quadratic when attention memory grows with the square of the
/// length) and extrapolated to the largest. The modules come back unchanged (grads and RNG state as
/// `make_graphed` restores them), with the estimate.
///
/// ```
/// # use graphed::{estimate_pool, make_graphed, ops, Buckets, Cx, Device, GraphOptions, Module, Result, Tensor};
/// # struct Double;
/// # impl Module for Double {
/// #     fn name(&self) -> &'static str { "Double" }
/// #     fn num_inputs(&self) -> usize { 1 }
/// #     fn forward(&self, _cx: &mut Cx, x: &[Option<Tensor>]) -> Result<Vec<Option<Tensor>>> {
/// #         let x = x[0].as_ref().ok_or_else(|| graphed::Error::msg("x"))?;
/// #         Ok(vec![Some(ops::scale(x, 2.0)?)])
/// #     }
/// #     fn backward(&mut self, _cx: &mut Cx, g: &[Option<Tensor>]) -> Result<Vec<Option<Tensor>>> { Ok(vec![None]) }
/// # }
/// let dev = Device::host();
/// let samples = || Ok::<_, graphed::Error>(vec![vec![vec![Some(Tensor::zeros(&dev, &[1024, 64])?)]]]);
/// let opts = GraphOptions::new().inference().buckets(Buckets::powers_of_two(0, 64, 1024));
/// let (estimate, modules) = estimate_pool(vec![Box::new(Double)], samples()?, opts.clone())?;
/// assert_eq!(estimate.probes.iter().map(|p| p.shape[0]).collect::<Vec<_>>(), [64, 128, 256]);
/// // Enough for the input and the output of the largest bucket, 1024 x 64 f32 each.
/// assert!(estimate.bytes >= 2 * 1024 * 64 * 4);
/// let g = make_graphed(modules, samples()?, opts)?;
/// println!("estimated {} B, reserved {} B", estimate.bytes, g.pool().stats().reserved);
/// # Ok::<(), graphed::Error>(())
/// ```
pub fn estimate_pool(
    modules: Modules,
    samples: Samples,
    options: GraphOptions,
) -> std::result::Result<(PoolEstimate, Modules), CaptureError<Modules>> {
    let spec = match options.bucket_spec() {
        Some(spec) => spec.clone(),
        None => {
            let why = "estimate_pool needs the buckets to estimate (GraphOptions::buckets)";
            return Err(CaptureError::new(
                Error::Bucket(BucketError::Unsupported { option: "no buckets", why }),
                modules,
            ));
        }
    };
    let plan = spec.validate().and_then(|()| bucketed_inputs(&samples, &spec));
    let flags = match plan {
        Ok(flags) => flags,
        Err(e) => return Err(CaptureError::new(e, modules)),
    };
    // The three smallest buckets by their number of positions (the product of their sizes).
    let elements = |index: usize| spec.shape(index)[..spec.ndims()].iter().product::<usize>();
    let mut order: Vec<usize> = (0..spec.count()).collect();
    order.sort_by_key(|&i| elements(i));
    let mut modules = modules;
    let mut probes = Vec::new();
    for &index in order.iter().take(3) {
        let shape = spec.shape(index);
        let probe = bucket_samples(&samples, &flags, &spec, &shape);
        let probe = match probe {
            Ok(p) => p,
            Err(e) => return Err(CaptureError::new(e, modules)),
        };
        let alone = options.clone().buckets(spec.with_shape(shape));
        let g = make_graphed(modules, probe, alone)?;
        let st = g.pool().stats();
        let shape = shape[..spec.ndims()].to_vec();
        probes.push(PoolProbe { elements: elements(index), shape, reserved: st.reserved, peak_in_use: st.peak_in_use });
        modules = g.into_modules();
    }
    let bytes = fit(&probes, elements(spec.count().saturating_sub(1)));
    Ok((PoolEstimate { probes, bytes }, modules))
}

/// The polynomial through the probes' (positions, most bytes in use) points (degree: points
/// - 1), evaluated at `x` positions (Lagrange form, in f64), never below 0.
fn fit(probes: &[PoolProbe], x: usize) -> usize {
    let pts: Vec<(f64, f64)> = probes.iter().map(|p| (p.elements as f64, p.peak_in_use as f64)).collect();
    let x = x as f64;
    let y: f64 = (0..pts.len())
        .map(|i| {
            let basis: f64 =
                (0..pts.len()).filter(|j| *j != i).map(|j| (x - pts[j].0) / (pts[i].0 - pts[j].0)).product();
            pts[i].1 * basis
        })
        .sum();
    y.max(0.0).round() as usize
}
