//! What the user declares: [`Buckets`] (the axes, their sizes, the padding, what happens above
//! the largest) and what a capture reports per bucket ([`BucketReport`]).

use std::time::Duration;

use crate::{BucketError, BucketRule, Result};

/// The most axes shape buckets may span (a batch and a sequence).
pub(crate) const MAX_AXES: usize = 2;

/// A bucket's size (or a call's) along each declared axis, in declaration order; unused
/// entries are 0.
pub(crate) type Lens = [usize; MAX_AXES];

/// What a call larger than the largest bucket does.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum AboveLargest {
    /// Refuse it: [`BucketError::AboveLargest`] (the default).
    #[default]
    Error,
    /// Run the modules eagerly at the call's real size (as vLLM does above its largest
    /// captured batch).
    Eager,
}

/// Shape buckets over one or two axes of the inputs ([`crate::GraphOptions::buckets`]): the
/// sizes to capture along each, what pads an input up to its bucket, and what happens above
/// the largest. With two axes the buckets are every combination of their sizes.
///
/// An input is bucketed along an axis when its sample has that axis's largest size there;
/// samples are given at the largest bucket's shape, and each smaller bucket's samples are
/// their first positions along the bucketed axes. Outputs (and grads) whose size along an axis
/// follows the buckets' are trimmed to the call's size.
///
/// ```
/// use graphed::{AboveLargest, Buckets};
/// let b = Buckets::powers_of_two(1, 128, 1024).pad(1, -100.0).above_largest(AboveLargest::Eager);
/// assert_eq!(b.sizes(), &[128, 256, 512, 1024]);
/// assert_eq!((b.bucket_of(129), b.bucket_of(1024), b.bucket_of(1025)), (Some(256), Some(1024), None));
/// assert_eq!(Buckets::step(0, 8, 20).sizes(), &[8, 16, 20]);
/// assert_eq!(Buckets::new(0, [4, 1, 2, 2]).sizes(), &[1, 2, 4]);
/// // A batch axis and a sequence axis: 3 x 4 buckets.
/// let grid = Buckets::new(0, [1, 2, 4]).and(Buckets::powers_of_two(1, 128, 1024));
/// assert_eq!((grid.axes(), grid.count()), (vec![0, 1], 12));
/// assert_eq!(grid.bucket_for(&[3, 300]), Some(vec![4, 512]));
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct Buckets {
    /// (axis, its sizes ascending without repeats), in declaration order.
    axes: Vec<(usize, Vec<usize>)>,
    pads: Vec<(usize, f32)>,
    above: AboveLargest,
    /// A rule that made no list (kept to be reported by `make_graphed`).
    rule_error: Option<BucketRule>,
}

impl Buckets {
    /// Buckets of these sizes along `axis` (in any order; repeats are dropped).
    pub fn new(axis: usize, sizes: impl IntoIterator<Item = usize>) -> Buckets {
        let mut sizes: Vec<usize> = sizes.into_iter().collect();
        sizes.sort_unstable();
        sizes.dedup();
        Buckets { axes: vec![(axis, sizes)], pads: Vec::new(), above: AboveLargest::Error, rule_error: None }
    }

    /// `min`, `2·min`, `4·min`, ... up to `max`, and `max` itself.
    pub fn powers_of_two(axis: usize, min: usize, max: usize) -> Buckets {
        if min == 0 || min > max {
            return Buckets::refused(axis, BucketRule::PowersOfTwo { min, max });
        }
        let sizes = std::iter::successors(Some(min), |s| s.checked_mul(2)).take_while(|s| *s < max);
        Buckets::new(axis, sizes.chain([max]))
    }

    /// `step`, `2·step`, ... up to `max`, and `max` itself.
    pub fn step(axis: usize, step: usize, max: usize) -> Buckets {
        if step == 0 || step > max {
            return Buckets::refused(axis, BucketRule::Step { step, max });
        }
        Buckets::new(axis, (1..).map(|k| k * step).take_while(|s| *s < max).chain([max]))
    }

    fn refused(axis: usize, rule: BucketRule) -> Buckets {
        Buckets { rule_error: Some(rule), ..Buckets::new(axis, []) }
    }

    /// These buckets and `other`'s axes together: every combination of their sizes (at most
    /// two axes, each declared once). Pads and the choice above the largest stay this list's.
    pub fn and(mut self, other: Buckets) -> Buckets {
        self.axes.extend(other.axes);
        self.rule_error = self.rule_error.or(other.rule_error);
        self
    }

    /// The value input `input` (of every chunk) is padded with up to its bucket's size
    /// (rounded to the input's dtype); 0 where not given. A loss's labels are usually padded
    /// with an index the loss ignores.
    pub fn pad(mut self, input: usize, value: f32) -> Buckets {
        self.pads.retain(|(i, _)| *i != input);
        self.pads.push((input, value));
        self
    }

    /// What a call larger than the largest bucket does.
    pub fn above_largest(mut self, above: AboveLargest) -> Buckets {
        self.above = above;
        self
    }

    /// What a call larger than the largest bucket does (see [`Buckets::above_largest`]).
    pub fn above(&self) -> AboveLargest {
        self.above
    }

    /// The first declared axis.
    pub fn axis(&self) -> usize {
        self.axes[0].0
    }

    /// The declared axes, in declaration order.
    pub fn axes(&self) -> Vec<usize> {
        self.axes.iter().map(|(a, _)| *a).collect()
    }

    /// The sizes along the first declared axis, ascending.
    pub fn sizes(&self) -> &[usize] {
        &self.axes[0].1
    }

    /// The sizes along declared axis `axis`, ascending, if it is one.
    pub fn sizes_along(&self, axis: usize) -> Option<&[usize]> {
        self.axes.iter().find(|(a, _)| *a == axis).map(|(_, s)| s.as_slice())
    }

    /// The number of buckets: the product of each axis's number of sizes.
    pub fn count(&self) -> usize {
        self.axes.iter().map(|(_, s)| s.len()).product()
    }

    /// The smallest size along the first axis that holds `size`, if any.
    pub fn bucket_of(&self, size: usize) -> Option<usize> {
        self.sizes().iter().copied().find(|s| *s >= size)
    }

    /// The smallest bucket that holds a call of `lens` (one per declared axis), if any.
    pub fn bucket_for(&self, lens: &[usize]) -> Option<Vec<usize>> {
        if lens.len() != self.axes.len() {
            return None;
        }
        self.axes.iter().zip(lens).map(|((_, sizes), &n)| sizes.iter().copied().find(|s| *s >= n)).collect()
    }

    /// What input `input` is padded with.
    pub fn pad_value(&self, input: usize) -> f32 {
        self.pads.iter().find(|(i, _)| *i == input).map_or(0.0, |(_, v)| *v)
    }

    /// The number of declared axes.
    pub(crate) fn ndims(&self) -> usize {
        self.axes.len()
    }

    /// Declared axis `d`: (axis, sizes).
    pub(crate) fn dim(&self, d: usize) -> (usize, &[usize]) {
        (self.axes[d].0, &self.axes[d].1)
    }

    /// The shape of bucket `index` (buckets in ascending order, the first axis varying
    /// slowest): the largest is the last.
    pub(crate) fn shape(&self, index: usize) -> Lens {
        let mut lens = [0; MAX_AXES];
        let mut rest = index;
        for d in (0..self.axes.len()).rev() {
            let sizes = &self.axes[d].1;
            lens[d] = sizes[rest % sizes.len()];
            rest /= sizes.len();
        }
        lens
    }

    /// The index of the bucket whose index along each axis is `at`.
    pub(crate) fn index(&self, at: &[usize]) -> usize {
        self.axes.iter().zip(at).fold(0, |acc, ((_, sizes), &i)| acc * sizes.len() + i)
    }

    /// The largest bucket's shape.
    pub(crate) fn largest(&self) -> Lens {
        self.shape(self.count().saturating_sub(1))
    }

    /// The same pads and choice above the largest, with one size along each axis: `shape`.
    pub(crate) fn with_shape(&self, shape: Lens) -> Buckets {
        let axes = self.axes.iter().enumerate().map(|(d, (a, _))| (*a, vec![shape[d]])).collect();
        Buckets { axes, pads: self.pads.clone(), above: self.above, rule_error: None }
    }

    /// The list makes sense (checked by `make_graphed` before anything runs).
    pub(crate) fn validate(&self) -> Result<()> {
        if let Some(rule) = self.rule_error {
            return Err(BucketError::NoList { rule }.into());
        }
        if self.axes.len() > MAX_AXES {
            return Err(BucketError::TooManyAxes { axes: self.axes.len(), max: MAX_AXES }.into());
        }
        for (i, (axis, sizes)) in self.axes.iter().enumerate() {
            if self.axes[..i].iter().any(|(a, _)| a == axis) {
                return Err(BucketError::AxisTwice { axis: *axis }.into());
            }
            if sizes.is_empty() || sizes[0] == 0 {
                return Err(BucketError::NoSizes { sizes: sizes.clone() }.into());
            }
        }
        Ok(())
    }
}

/// What capturing one bucket took ([`crate::GraphedModules::bucket_reports`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BucketReport {
    /// The bucket's size along the first declared axis.
    pub size: usize,
    /// Its size along every declared axis, in declaration order.
    pub shape: Vec<usize>,
    /// Wall time of its warm-up and capture.
    pub capture_time: Duration,
    /// Bytes its warm-up and capture added to the pool's reservation (0 when it fit in
    /// memory the larger buckets had released).
    pub added_bytes: usize,
    /// The pool's reserved bytes once it was captured.
    pub reserved_bytes: usize,
}
