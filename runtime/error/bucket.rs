//! `BucketError`: what can go wrong with shape buckets ([`crate::Buckets`]), inside
//! [`super::Error::Bucket`].

/// The errors of shape buckets, as values a caller can match on.
///
/// ```
/// use graphed::{BucketError, Error};
/// let e = Error::from(BucketError::AboveLargest { size: 5000, largest: 4096 });
/// assert!(matches!(e, Error::Bucket(BucketError::AboveLargest { size: 5000, .. })));
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
    /// A rule whose bounds do not make a list (`min > max`, a step of zero).
    #[error("shape buckets: {detail}")]
    BadRule {
        /// What is wrong with the rule.
        detail: String,
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
