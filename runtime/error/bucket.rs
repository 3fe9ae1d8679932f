//! `BucketError`: what can go wrong with shape buckets ([`crate::Buckets`]), inside
//! [`super::Error::Bucket`].

/// The errors of shape buckets, as values a caller can match on.
///
/// ```
/// use graphed::{BucketError, Error};
/// let e = Error::from(BucketError::AboveLargest { size: 5000, largest: 4096 });
/// assert!(matches!(e, Error::Bucket(BucketError::AboveLargest { size: 5000, .. })));
/// // A rule that makes no list names its bounds.
/// use graphed::BucketRule;
/// let e = Error::from(BucketError::NoList { rule: BucketRule::PowersOfTwo { min: 32, max: 16 } });
/// assert!(e.to_string().contains("powers of two from 32 to 16 makes no list of sizes"));
/// ```
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BucketError {
    /// A bucket list with no sizes, or a size of zero.
    #[error("shape buckets {sizes:?}: give at least one size, none of them zero")]
    NoSizes {
        /// The sizes given.
        sizes: Vec<usize>,
    },
    /// A rule whose bounds make no list of sizes (`min > max`, a step of zero).
    #[error("shape buckets: {rule} makes no list of sizes; give 0 < {} <= max", rule.first_name())]
    NoList {
        /// The rule, with the bounds given.
        rule: BucketRule,
    },
    /// More axes than buckets span, or a tensor that differs from its bucket along more.
    #[error("shape buckets: {axes} axes, but buckets span at most {max} (a batch and a sequence)")]
    TooManyAxes {
        /// The axes declared (or along which a tensor differs from its bucket).
        axes: usize,
        /// The most buckets span.
        max: usize,
    },
    /// One axis declared twice ([`crate::Buckets::and`]).
    #[error("shape buckets: axis {axis} declared twice; declare each axis once")]
    AxisTwice {
        /// The axis.
        axis: usize,
    },
    /// No sample input has the bucketed axis at the largest bucket's size, so nothing would
    /// change size between buckets.
    #[error("shape buckets along axis {axis}: no sample input has size {largest} there (give samples at the largest bucket's size)")]
    NoBucketedInput {
        /// The bucketed axis.
        axis: usize,
        /// The largest bucket.
        largest: usize,
    },
    /// A call whose bucketed inputs disagree on their size along the axis.
    #[error("{module}: the bucketed inputs have sizes {sizes:?} along axis {axis}; they must agree")]
    Lengths {
        /// The module called.
        module: String,
        /// The bucketed axis.
        axis: usize,
        /// Each bucketed input's size along it.
        sizes: Vec<usize>,
    },
    /// A call larger than the largest bucket, with `AboveLargest::Error` (the default).
    #[error("size {size} is above the largest shape bucket ({largest}); add a bucket, or choose AboveLargest::Eager to run such calls eagerly")]
    AboveLargest {
        /// The call's size along the bucketed axis.
        size: usize,
        /// The largest bucket.
        largest: usize,
    },
    /// Options that do not go together with buckets.
    #[error("shape buckets cannot be combined with {option}: {why}")]
    Unsupported {
        /// The other option.
        option: &'static str,
        /// Why not.
        why: &'static str,
    },
}

/// A rule that makes a list of bucket sizes, with the bounds it was given (in
/// [`BucketError::NoList`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum BucketRule {
    /// [`crate::Buckets::powers_of_two`]: `min`, `2·min`, ... up to `max`.
    PowersOfTwo {
        /// The smallest size.
        min: usize,
        /// The largest size.
        max: usize,
    },
    /// [`crate::Buckets::step`]: `step`, `2·step`, ... up to `max`.
    Step {
        /// The step.
        step: usize,
        /// The largest size.
        max: usize,
    },
}

impl BucketRule {
    /// The name of the rule's first bound, for messages.
    fn first_name(&self) -> &'static str {
        match self {
            BucketRule::PowersOfTwo { .. } => "min",
            BucketRule::Step { .. } => "step",
        }
    }
}

impl std::fmt::Display for BucketRule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BucketRule::PowersOfTwo { min, max } => write!(f, "powers of two from {min} to {max}"),
            BucketRule::Step { step, max } => write!(f, "a step of {step} up to {max}"),
        }
    }
}
