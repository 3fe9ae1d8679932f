//! `SetupError`: what `make_graphed` refuses in its own arguments before anything runs, inside
//! [`super::Error::Setup`].

/// The arguments of [`crate::make_graphed`] that cannot be captured, as values a caller can
/// match on. (Shapes, schedules, buckets and devices have their own variants: see
/// [`super::Error`].)
///
/// ```
/// use graphed::{make_graphed, Error, GraphOptions, SetupError};
/// let e = make_graphed(Vec::new(), Vec::new(), GraphOptions::new()).expect_err("no modules");
/// assert!(matches!(e.error(), Error::Setup(SetupError::NoModules)));
/// ```
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SetupError {
    /// No modules to capture.
    #[error("make_graphed: no modules to capture")]
    NoModules,
    /// `GraphOptions::warmup(0)`.
    #[error("make_graphed: warmup must be at least 1 (kernels must load before capture)")]
    ZeroWarmup,
    /// A different number of sample lists than modules.
    #[error("make_graphed: {samples} sample lists for {modules} modules (give one list per module)")]
    SampleLists {
        /// The modules.
        modules: usize,
        /// The sample lists.
        samples: usize,
    },
    /// No sample tensor at all, so no device to capture on.
    #[error("make_graphed: no sample tensor to take the device from")]
    NoSampleTensor,
    /// A module's sample sets do not match the schedule's microbatches.
    #[error("make_graphed: chunk {chunk}: {sets} sample sets for {microbatches} microbatches (give one, or one per microbatch)")]
    SampleSets {
        /// The chunk (1-indexed, as in `order`).
        chunk: usize,
        /// The sample sets given.
        sets: usize,
        /// The schedule's microbatches.
        microbatches: usize,
    },
    /// A sample set with another number of inputs than the module's forward takes.
    #[error("make_graphed: {module}: {got} sample inputs for a forward of {expected} tensor arguments")]
    SampleInputs {
        /// The module.
        module: String,
        /// The inputs its forward takes.
        expected: usize,
        /// The sample inputs given.
        got: usize,
    },
    /// `GraphOptions::pool` on another device than the samples'.
    #[error("make_graphed: the pool given is on another device than the samples ({device})")]
    PoolOnOtherDevice {
        /// The samples' device.
        device: String,
    },
    /// `GraphOptions::pool_limit` together with `GraphOptions::pool`.
    #[error("make_graphed: pool_limit with a pool given; limit that pool instead (GraphPool::with_limit)")]
    PoolLimitWithPool,
    /// `GraphOptions::checkpoint` naming a chunk that does not exist.
    #[error("make_graphed: checkpoint: chunk {chunk} does not exist (chunks are 1..={chunks})")]
    CheckpointChunk {
        /// The chunk named.
        chunk: usize,
        /// The number of chunks.
        chunks: usize,
    },
    /// A training-mode capture that needs backward graphs (an input or a parameter needs a
    /// grad) of modules among which one has no backward (a `#[graphed]` impl without one): its
    /// chunk could pass no grad on. Captures where no module has a backward are forward-only.
    #[error("make_graphed: chunk {chunk} ({module}) has no backward (an inference module), but the other chunks need backward graphs (an input or a parameter needs a grad); give it a backward, or capture for inference (GraphOptions::inference())")]
    NoBackward {
        /// The module without a backward.
        module: String,
        /// Its chunk (1-indexed, as in `order`).
        chunk: usize,
    },
}
