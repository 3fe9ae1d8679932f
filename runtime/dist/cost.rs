//! The all-reduce cost model of a group: `t(bytes) = alpha + beta · bytes` (Hockney's latency
//! and bandwidth), measured on its communicator and fitted, and the gradient bucket size it
//! implies for [`super::DataParallel`].

use super::{Communicator, ReduceOp};
use crate::{DistError, Result, Tensor};

/// The bytes [`AllReduceCost::measure`] times by default: 4 KiB to 16 MiB, by factors of 4.
pub const COST_SIZES: [usize; 7] = [1 << 12, 1 << 14, 1 << 16, 1 << 18, 1 << 20, 1 << 22, 1 << 24];

/// The time of an all-reduce of `bytes` over a group: a fixed cost (launch, synchronisation,
/// latency) plus a cost per byte (the inverse of the bandwidth the ranks reach).
///
/// Small buckets start reducing earlier but pay the fixed cost often; large ones amortise it
/// but wait for more grads. [`AllReduceCost::bucket_bytes`] picks the smallest bucket that
/// still runs at a given fraction of the bandwidth.
///
/// ```
/// use graphed::dist::AllReduceCost;
/// // 20 µs of latency, 100 GB/s.
/// let cost = AllReduceCost { alpha_ms: 0.02, beta_ms_per_byte: 1e-8 };
/// let bucket = cost.bucket_bytes(0.8)?;
/// assert!(cost.efficiency(bucket) >= 0.8 && cost.efficiency(bucket - 4) < 0.8);
/// # Ok::<(), graphed::Error>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AllReduceCost {
    /// The fixed cost of one all-reduce, in ms.
    pub alpha_ms: f64,
    /// The cost of each byte, in ms.
    pub beta_ms_per_byte: f64,
}

impl AllReduceCost {
    /// Times all-reduces of each of `sizes` bytes (whole f32 elements, at least one) on `comm`,
    /// `repeats` times each after an untimed one (NCCL connects lazily), averages each size's
    /// time over the ranks (so that every rank fits the same numbers and picks the same
    /// buckets) and fits the model ([`AllReduceCost::fit`]). Every rank must call it at the
    /// same point; illegal while capturing. Times are the device's (CUDA events) on GPUs, wall
    /// time on emulated ranks.
    ///
    /// ```
    /// use graphed::dist::{self, AllReduceCost};
    /// // Sizes far apart: on emulated ranks the times are wall time, which a loaded machine
    /// // can make noisy (4 KB against 1 MB was refused as "not growing" now and then).
    /// let costs = dist::run_emulated(2, |comm| AllReduceCost::measure(&comm, &[1 << 10, 1 << 24], 3))?;
    /// assert_eq!(costs[0], costs[1]);
    /// # Ok::<(), graphed::Error>(())
    /// ```
    pub fn measure(comm: &Communicator, sizes: &[usize], repeats: usize) -> Result<AllReduceCost> {
        comm.device().backend().forbid_during_capture("AllReduceCost::measure")?;
        let bytes: Vec<usize> = sizes.iter().map(|b| (b / 4).max(1) * 4).collect();
        // What `fit` would refuse, refused before anything is sent.
        distinct_sizes(&bytes)?;
        if repeats == 0 {
            return Err(DistError::CostModel { why: "no repeats to time" }.into());
        }
        let mut times = Vec::with_capacity(bytes.len());
        for &b in &bytes {
            let t = Tensor::zeros(comm.device(), &[b / 4])?;
            comm.all_reduce(&t, ReduceOp::Sum)?;
            comm.synchronize()?;
            let ms = comm.device().time_ms(|| (0..repeats).try_for_each(|_| comm.all_reduce(&t, ReduceOp::Sum)))?;
            times.push(ms / repeats as f32);
        }
        let all = Tensor::from_slice(comm.device(), &times, &[times.len()])?;
        comm.all_reduce(&all, ReduceOp::Avg)?;
        comm.synchronize()?;
        let times = all.to_vec()?;
        let samples: Vec<(usize, f64)> = bytes.into_iter().zip(times.into_iter().map(f64::from)).collect();
        AllReduceCost::fit(&samples)
    }

    /// The model through `(bytes, ms)` samples, by least squares on the relative error (each
    /// sample weighted by 1 / ms², so small sizes fix the fixed cost and large ones the
    /// bandwidth). Refused ([`DistError::CostModel`]): fewer than two distinct sizes, a time
    /// that is not positive and finite, or times that do not grow with the size. A negative
    /// fixed cost (noise) becomes 0.
    pub fn fit(samples: &[(usize, f64)]) -> Result<AllReduceCost> {
        let sizes: Vec<usize> = samples.iter().map(|s| s.0).collect();
        distinct_sizes(&sizes)?;
        if samples.iter().any(|(_, t)| !t.is_finite() || *t <= 0.0) {
            return Err(DistError::CostModel { why: "a time that is not positive and finite" }.into());
        }
        let (mut s, mut sx, mut sxx, mut st, mut sxt) = (0.0, 0.0, 0.0, 0.0, 0.0);
        for &(b, t) in samples {
            let (x, w) = (b as f64, 1.0 / (t * t));
            s += w;
            sx += w * x;
            sxx += w * x * x;
            st += w * t;
            sxt += w * x * t;
        }
        let beta = (s * sxt - sx * st) / (s * sxx - sx * sx);
        if !beta.is_finite() || beta <= 0.0 {
            return Err(DistError::CostModel { why: "the times do not grow with the size" }.into());
        }
        let alpha = ((st - beta * sx) / s).max(0.0);
        Ok(AllReduceCost { alpha_ms: alpha, beta_ms_per_byte: beta })
    }

    /// The predicted time of an all-reduce of `bytes`, in ms.
    pub fn time_ms(&self, bytes: usize) -> f64 {
        self.alpha_ms + self.beta_ms_per_byte * bytes as f64
    }

    /// The fraction of an all-reduce of `bytes` spent moving bytes rather than on the fixed
    /// cost: how close it comes to the bandwidth.
    pub fn efficiency(&self, bytes: usize) -> f64 {
        let moving = self.beta_ms_per_byte * bytes as f64;
        moving / (self.alpha_ms + moving)
    }

    /// The smallest bucket (whole f32 elements, at least one) whose all-reduce runs at
    /// `efficiency` of the bandwidth or better: `efficiency / (1 - efficiency) · alpha / beta`
    /// bytes, rounded up. Refused unless `efficiency` lies strictly between 0 and 1, or for a
    /// model without a positive cost per byte ([`DistError::CostModel`]).
    pub fn bucket_bytes(&self, efficiency: f64) -> Result<usize> {
        if !(efficiency > 0.0 && efficiency < 1.0) {
            return Err(DistError::CostModel { why: "an efficiency not strictly between 0 and 1" }.into());
        }
        if !(self.beta_ms_per_byte.is_finite() && self.beta_ms_per_byte > 0.0 && self.alpha_ms >= 0.0) {
            return Err(DistError::CostModel { why: "a model without a positive cost per byte" }.into());
        }
        let bytes = efficiency / (1.0 - efficiency) * self.alpha_ms / self.beta_ms_per_byte;
        if bytes >= (usize::MAX / 8) as f64 {
            return Err(DistError::CostModel { why: "a bucket larger than any memory" }.into());
        }
        // Whole elements; float rounding may leave the formula's bytes just short.
        let mut b = ((bytes / 4.0).ceil().max(1.0) as usize) * 4;
        while self.efficiency(b) < efficiency {
            b += 4;
        }
        Ok(b)
    }
}

/// At least two distinct sizes: a line needs two points.
fn distinct_sizes(bytes: &[usize]) -> Result<()> {
    let first = bytes.first().copied();
    if bytes.iter().all(|b| Some(*b) == first) {
        return Err(DistError::CostModel { why: "fewer than two distinct sizes" }.into());
    }
    Ok(())
}
