//! `ScheduleError`: a pipeline schedule (`GraphOptions::order`) that cannot run, or a call
//! that does not fit the schedule captured, inside [`super::Error::Schedule`].

/// What is wrong with a schedule, or with a call against the schedule captured, as values a
/// caller can match on. Chunks and microbatches are numbered from 1, as in `order`, except
/// in [`ScheduleError::MicrobatchOutOfRange`], which gives the index a call took (from 0).
///
/// ```
/// use graphed::{make_graphed, Error, GraphOptions, ScheduleError};
/// # use graphed::{Cx, Module, Result, Tensor, Device};
/// # struct Id;
/// # impl Module for Id {
/// #     fn name(&self) -> &'static str { "Id" }
/// #     fn num_inputs(&self) -> usize { 1 }
/// #     fn forward(&self, _: &mut Cx, x: &[Option<Tensor>]) -> Result<Vec<Option<Tensor>>> { Ok(x.to_vec()) }
/// #     fn backward(&mut self, _: &mut Cx, g: &[Option<Tensor>]) -> Result<Vec<Option<Tensor>>> { Ok(g.to_vec()) }
/// # }
/// let x = Tensor::zeros(&Device::host(), &[2])?.with_requires_grad(true);
/// // The backward of chunk 1 before its forward.
/// let opts = GraphOptions::new().order([-1, 1]);
/// let e = make_graphed(vec![Box::new(Id)], vec![vec![vec![Some(x)]]], opts).expect_err("refused");
/// assert!(matches!(e.error(), Error::Schedule(ScheduleError::BackwardBeforeForward { chunk: 1 })));
/// # Ok::<(), graphed::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ScheduleError {
    /// An entry names chunk 0, or a chunk past the last.
    #[error("order: chunk {chunk} does not exist (chunks are numbered 1..={chunks})")]
    ChunkOutOfRange {
        /// The chunk named.
        chunk: usize,
        /// The number of chunks.
        chunks: usize,
    },
    /// The forward and backward entries are not 2 x chunks x M for some number M of
    /// microbatches.
    #[error("order: {passes} forward and backward entries are not a multiple of 2 x {chunks} chunks (each chunk's forward and backward once per microbatch)")]
    PassCount {
        /// The forward and backward entries.
        passes: usize,
        /// The number of chunks.
        chunks: usize,
    },
    /// A backward entry (`-c`) with no forward of its chunk outstanding.
    #[error("order: the backward of chunk {chunk} comes before its forward (`-c` runs the backward of the chunk's oldest microbatch whose forward ran)")]
    BackwardBeforeForward {
        /// The chunk.
        chunk: usize,
    },
    /// A weight-grad entry (`w(c)`) with no backward of its chunk outstanding.
    #[error("order: w({chunk}): the weight grads of chunk {chunk} come before its backward")]
    WgradBeforeBackward {
        /// The chunk.
        chunk: usize,
    },
    /// A chunk with another number of forwards, backwards or weight-grad entries than the
    /// schedule's microbatches.
    #[error("order: chunk {chunk} has {forwards} forwards, {backwards} backwards and {wgrads} weight-grad entries; with {microbatches} microbatches each chunk needs {microbatches} forwards and backwards, and either no w({chunk}) or {microbatches}")]
    Unbalanced {
        /// The chunk.
        chunk: usize,
        /// Its forward entries.
        forwards: usize,
        /// Its backward entries.
        backwards: usize,
        /// Its weight-grad entries.
        wgrads: usize,
        /// The schedule's microbatches.
        microbatches: usize,
    },
    /// Chained chunks: a forward before the forward of the previous chunk whose output it
    /// reads.
    #[error("order: chained: the forward of chunk {chunk} for microbatch {microbatch} comes before chunk {}'s, whose output it reads", chunk - 1)]
    ChainedForward {
        /// The chunk.
        chunk: usize,
        /// The microbatch.
        microbatch: usize,
    },
    /// Chained chunks: a backward before the backward of the next chunk whose input grad it
    /// reads.
    #[error("order: chained: the backward of chunk {chunk} for microbatch {microbatch} comes before chunk {}'s, whose input grad it reads", chunk + 1)]
    ChainedBackward {
        /// The chunk.
        chunk: usize,
        /// The microbatch.
        microbatch: usize,
    },
    /// `w(c)` entries for a checkpointed chunk, whose weight grads run inside its backward,
    /// after the recompute.
    #[error("order: w({chunk}): chunk {chunk} (`{module}`) is checkpointed, so its weight grads run inside its backward, after the recompute; drop the w({chunk}) entries or the checkpoint")]
    WgradCheckpointed {
        /// The chunk.
        chunk: usize,
        /// Its module.
        module: String,
    },
    /// `w(c)` entries for a chunk whose module does not split its backward.
    #[error("order: w({chunk}): chunk {chunk} (`{module}`) does not split its backward (Module::splits_backward is false), so it has no separate weight grads")]
    WgradNotSplit {
        /// The chunk.
        chunk: usize,
        /// Its module.
        module: String,
    },
    /// A `#[graphed]` struct's typed calls given a schedule of another number of microbatches
    /// than its `order` attribute.
    #[error("`{module}`'s typed calls take {microbatches} microbatch(es) per step (its `order` attribute), but the schedule given has {passes} forward and backward entries for {chunks} chunks")]
    StructMicrobatches {
        /// The struct.
        module: String,
        /// The microbatches of its `order` attribute.
        microbatches: usize,
        /// The forward and backward entries of the schedule given.
        passes: usize,
        /// The number of chunks.
        chunks: usize,
    },
    /// A whole-chain call (`forward_chain`, `backward_chain`, `step_chain`) on chunks that were
    /// not captured chained.
    #[error("{call}: the chunks were not captured chained (GraphOptions::chained); call them one by one")]
    NotChained {
        /// The call.
        call: &'static str,
    },
    /// A whole-chain call on a schedule that interleaves the chunks' steps.
    #[error("{call} runs one microbatch through every chunk, but the schedule interleaves the chunks' steps (or has w(c) entries); call the chunks one by one in its order, or replay the whole schedule with step()")]
    NotWholeChains {
        /// The call.
        call: &'static str,
    },
    /// A chained chunk whose first output (or first input grad) is `None`, so there is
    /// nothing to hand the next (or previous) chunk.
    #[error("chained: `{module}` has no {} to hand on (a chained chunk's first {} must be a tensor)", if *.grad { "input grad" } else { "output" }, if *.grad { "input grad" } else { "output" })]
    NothingToHandOn {
        /// The chunk's module.
        module: String,
        /// Whether it is the input grad (backward) rather than the output (forward).
        grad: bool,
    },
    /// A call with per-microbatch arguments given another number of sets than the schedule
    /// has microbatches.
    #[error("{call}: {given} sets of {what} for a schedule of {microbatches} microbatches")]
    MicrobatchSets {
        /// The call.
        call: &'static str,
        /// Which argument.
        what: &'static str,
        /// The sets given.
        given: usize,
        /// The schedule's microbatches.
        microbatches: usize,
    },
    /// A microbatch index past the schedule's microbatches.
    #[error("microbatch {microbatch} does not exist: the schedule has {microbatches} (0-indexed here)")]
    MicrobatchOutOfRange {
        /// The index given.
        microbatch: usize,
        /// The schedule's microbatches.
        microbatches: usize,
    },
    /// Graphed modules fused in another order than their graphs were captured into a shared
    /// pool.
    #[error("fuse: the graphs of {modules} do not follow their pool's capture order; list the modules in the order they were captured")]
    FuseOrder {
        /// The modules, as listed.
        modules: String,
    },
}
