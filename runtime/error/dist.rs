//! `DistError`: what can go wrong with several ranks (communicators, launcher, rendezvous),
//! inside [`super::Error::Dist`]. Every rank sees an error when the group fails, never a hang.

/// The errors of `graphed::dist`, as values a caller can match on.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DistError {
    /// The NCCL library cannot be loaded or used here.
    #[error("NCCL is not available: {reason}. Install libnccl (libnccl.so.2) and put it on LD_LIBRARY_PATH, or use dist::run_emulated on the host backend")]
    NcclUnavailable {
        /// Why NCCL could not be used.
        reason: NcclProblem,
    },
    /// An NCCL call failed (the communicator was aborted; every rank sees an error).
    #[error("rank {rank}: NCCL call `{call}` failed: {message}")]
    Nccl {
        /// The rank that saw the failure.
        rank: usize,
        /// The call that failed.
        call: &'static str,
        /// NCCL's description of the error.
        message: String,
    },
    /// A wait passed its deadline; the group was aborted, so every rank gets an error.
    #[error("rank {rank}: `{op}` did not complete within {waited:?} (a peer is slow, dead or issued a different call); the group was aborted. Raise the timeout with dist::Config::timeout if the peers are only slow")]
    CommTimeout {
        /// The rank that timed out.
        rank: usize,
        /// The operation that waited.
        op: &'static str,
        /// How long it waited.
        waited: std::time::Duration,
    },
    /// The group was aborted (a rank's error, panic, timeout or request, or NCCL's failure).
    ///
    /// ```
    /// use graphed::dist::{self, Config};
    /// use graphed::{AbortReason, DistError, Error};
    /// let results = dist::run_emulated_each(2, &Config::default(), |comm| {
    ///     if comm.rank() == 1 {
    ///         comm.abort("out of data");
    ///     }
    ///     comm.barrier()
    /// })?;
    /// for r in &results {
    ///     let e = r.as_ref().unwrap_err();
    ///     assert!(matches!(
    ///         e.root(),
    ///         Error::Dist(DistError::CommAborted { reason: AbortReason::Requested { rank: 1, .. }, .. })
    ///     ));
    /// }
    /// # Ok::<(), graphed::Error>(())
    /// ```
    #[error("rank {rank}: the communicator was aborted: {reason}")]
    CommAborted {
        /// The rank that observed the abort.
        rank: usize,
        /// Why the group was aborted.
        reason: AbortReason,
    },
    /// Ranks issued different collectives at the same point (another op, size or root).
    #[error("rank {rank}: ranks issued different collectives at the same point: {}; every rank must issue the same sequence of collectives", by_rank(.issued))]
    CollectiveMismatch {
        /// The rank reporting it.
        rank: usize,
        /// What each rank issued, by rank.
        issued: Vec<Collective>,
    },
    /// A receive whose buffer holds another number of elements than the matching send sent.
    #[error("rank {rank}: rank {peer} sent {sent} elements, rank {rank} receives {expected}; a receive takes as many elements as the matching send")]
    TransferSizeMismatch {
        /// The receiving rank, reporting it.
        rank: usize,
        /// The sending rank.
        peer: usize,
        /// The elements sent.
        sent: usize,
        /// The elements of the receive's buffer.
        expected: usize,
    },
    /// Ranks set up different schedules (their hashes differ); found before any capture.
    #[error("rank {rank}: the ranks' {what} differ (hashes by rank: {hashes:x?}); every rank must capture the same schedule")]
    ScheduleMismatch {
        /// The rank reporting it.
        rank: usize,
        /// What was compared.
        what: String,
        /// Each rank's hash, by rank.
        hashes: Vec<u64>,
    },
    /// The rendezvous (a shared file or a TCP address) failed.
    #[error("rendezvous at {address}: {failure}")]
    Rendezvous {
        /// The file path, or host:port.
        address: String,
        /// What went wrong.
        #[source]
        failure: RendezvousFailure,
    },
    /// A launcher's rank variable is set but another one this rank needs is not.
    #[error("{launcher} environment: {var} is not set; {}", match hint { Some(h) => h.to_string(), None => format!("{} is set, so {} started this process and should have set {var} too; set it, or unset {} (or set GRAPHED_LAUNCHER=none) if this process is not a rank", launcher.rank_var(), launcher.name(), launcher.rank_var()) })]
    RankVarMissing {
        /// The launcher whose variables were found.
        launcher: super::Launcher,
        /// The variable that is missing.
        var: &'static str,
        /// What sets it, or what to set instead; `None` when the launcher sets it with its
        /// rank variable (the message then says to set it, or to unset the rank variable).
        hint: Option<&'static str>,
    },
    /// A rank variable (or `GRAPHED_LAUNCHER`) does not parse.
    #[error("{launcher} environment: {var}=`{value}` is not {expected}{}", why.map_or_else(String::new, |w| format!(" ({w})")))]
    RankVarMalformed {
        /// The launcher whose variables were found.
        launcher: super::Launcher,
        /// The variable.
        var: &'static str,
        /// Its value.
        value: String,
        /// What it should be.
        expected: &'static str,
        /// Where the value breaks that form, when the parser can tell (a Slurm host list's
        /// unclosed bracket, say).
        why: Option<&'static str>,
    },
    /// A rank (or local rank) is not below the world size.
    #[error("{launcher} environment: {var}={rank} is not below the world size {world_size}; each rank must be in 0..{world_size}")]
    RankOutOfRange {
        /// The launcher whose variables were found.
        launcher: super::Launcher,
        /// The variable holding the rank.
        var: &'static str,
        /// Its value.
        rank: usize,
        /// The world size the launcher gave.
        world_size: usize,
    },
    /// A rank process of a launch failed; the others were stopped.
    #[error("launch: rank {rank} {status}; the other ranks were stopped")]
    RankFailed {
        /// The first rank that failed.
        rank: usize,
        /// How it failed.
        status: RankExit,
    },
    /// A tensor or parameter on another device than the communicator's.
    #[error("{op}: {} is on {device}, the communicator on {communicator}; copy it there first", .param.as_ref().map_or_else(|| "a tensor".to_string(), |p| format!("parameter `{p}`")))]
    Device {
        /// The call.
        op: &'static str,
        /// The parameter, when it is one.
        param: Option<String>,
        /// Its device.
        device: String,
        /// The communicator's device.
        communicator: String,
    },
    /// A point-to-point peer that is this rank or not a rank at all.
    #[error("{op}: peer {peer} from rank {rank} (the peer must be another rank below {world})")]
    Peer {
        /// The call.
        op: &'static str,
        /// This rank.
        rank: usize,
        /// The peer given.
        peer: usize,
        /// The world size.
        world: usize,
    },
    /// A broadcast root that is not a rank.
    #[error("{op}: root {root} of {world} ranks")]
    Root {
        /// The call.
        op: &'static str,
        /// The root given.
        root: usize,
        /// The world size.
        world: usize,
    },
    /// A world of no ranks, or a rank not below the world size.
    #[error("{op}: rank {rank} of {world} (a world has at least one rank, each rank below its size)")]
    World {
        /// The call.
        op: &'static str,
        /// The rank given (0 for a call that takes none).
        rank: usize,
        /// The world size (for a pipeline, its chunks).
        world: usize,
    },
    /// A launch over nodes that do not divide the world, or a node rank not below them.
    #[error("launch: node {node_rank} of {nnodes} nodes for {world} ranks: nnodes must be at least 1 and divide the world size, node_rank below nnodes")]
    Nodes {
        /// The nodes.
        nnodes: usize,
        /// This node.
        node_rank: usize,
        /// The world size.
        world: usize,
    },
    /// A launch over several nodes without a rendezvous they all reach.
    #[error("launch: {nnodes} nodes need a rendezvous every node reaches: set LaunchOptions::rendezvous to Rendezvous::Tcp(\"node0:port\") or a file on a shared file system")]
    NodesNeedRendezvous {
        /// The nodes.
        nnodes: usize,
    },
    /// Rank 0 of a rendezvous must serve the payload the others fetch.
    #[error("Rendezvous::share: rank 0 must pass the payload")]
    NoPayload,
    /// A communicator used on a device its kind cannot run on.
    #[error("{op}: an {communicator} communicator cannot run on {device}; NCCL needs a CUDA GPU, emulated ranks (dist::run_emulated) the host backend")]
    Backend {
        /// The call.
        op: &'static str,
        /// `NCCL` or `emulated`.
        communicator: &'static str,
        /// The device.
        device: String,
    },
    /// An NCCL unique id of the wrong length (from a rendezvous).
    #[error("NCCL init: a unique id of {got} bytes, not {expected}")]
    UniqueIdLength {
        /// Its length.
        got: usize,
        /// The length NCCL uses.
        expected: usize,
    },
    /// The operating system refused something a rank needs (a thread, the current binary).
    #[error("{what}: {source}")]
    Io {
        /// What was needed.
        what: &'static str,
        /// The OS's error.
        #[source]
        source: std::io::Error,
    },
    /// An emulated rank panicked; its peers were aborted.
    #[error("rank {rank} panicked: {message}")]
    RankPanicked {
        /// The rank.
        rank: usize,
        /// The panic's message.
        message: String,
    },
    /// An emulated rank's thread ended without a result.
    #[error("the thread of emulated rank {rank} died")]
    RankThreadDied {
        /// The rank.
        rank: usize,
    },
    /// `DataParallel::new` on a module that does not expose its parameters.
    #[error("DataParallel::new: module `{module}` does not expose its parameters (derive Parameters, or use DataParallel::with_params)")]
    ParamsNotExposed {
        /// The module.
        module: String,
    },
    /// A chunk of `DataParallel::chunks` ran backward twice before its group reduced.
    #[error("DataParallel::chunks: chunk `{module}` ran backward twice before its group reduced (one backward per chunk per step, in module order)")]
    BackwardTwice {
        /// The chunk's module.
        module: String,
    },
    /// A parameter index past the sharded parameters.
    #[error("ShardedParams::full: parameter {index} of {params}")]
    ParamOutOfRange {
        /// The index given.
        index: usize,
        /// The number of parameters.
        params: usize,
    },
    /// A sharded parameter used in full while it is not materialised.
    #[error("{op}: `{param}` is not materialised (call materialise() first, in a pre_forward capture-time hook when graphed)")]
    NotMaterialised {
        /// The call.
        op: &'static str,
        /// The parameter.
        param: String,
    },
    /// A pipeline stage around a chunk of another number of inputs than one.
    #[error("PipelineStage::new: chunk `{module}` takes {inputs} inputs (one is supported)")]
    StageInputs {
        /// The chunk's module.
        module: String,
        /// Its inputs.
        inputs: usize,
    },
    /// A receiving pipeline stage's forward without an input buffer to receive into.
    #[error("PipelineStage forward of `{module}`: no input buffer to receive into")]
    StageNoInput {
        /// The chunk's module.
        module: String,
    },
    /// A pipeline stage whose chunk returned nothing to send on (its first output, or its
    /// first input grad, is `None`).
    #[error("PipelineStage: chunk `{module}` returned no {} to send", if *.grad { "input grad" } else { "output" })]
    StageNothingToSend {
        /// The chunk's module.
        module: String,
        /// Whether the input grad (backward) rather than the output (forward).
        grad: bool,
    },
    /// A pipeline order whose chunks cannot be spread over the ranks: chunk `c` runs on rank
    /// `(c - 1) % world`, so every rank must get as many chunks as the others.
    #[error("a pipeline order over {chunks} chunks on {world} ranks: the chunks must be a multiple of the ranks (chunk c runs on rank (c - 1) mod {world}), and a single rank runs a single chunk")]
    PipelineChunks {
        /// The chunks of the order (its largest chunk number).
        chunks: usize,
        /// The ranks.
        world: usize,
    },
    /// A rank that passes another number of modules than it runs chunks of the order.
    #[error("PipelineStage: rank {rank} runs {expected} chunk(s) of the order (chunks {rank} + 1, {rank} + 1 + world, ...), {given} module(s) were given")]
    StageChunks {
        /// The rank.
        rank: usize,
        /// The chunks it runs.
        expected: usize,
        /// The modules given.
        given: usize,
    },
    /// A pipeline order whose stages' transfers cannot all meet, even with each send grouped
    /// with the receive that follows it: following it, every rank would wait for a peer that
    /// waits too.
    #[error("pipeline order deadlocks across ranks: {}; order each stage's transfers so that neighbours meet (e.g. all forwards of a chunk before its backwards)", .stuck.iter().map(ToString::to_string).collect::<Vec<_>>().join(", "))]
    PipelineDeadlock {
        /// The transfer each rank is stuck at.
        stuck: Vec<PipelineTransfer>,
    },
    /// A pipeline order in which a rank sends a neighbour its messages in another order than
    /// the neighbour receives them (possible when a rank runs several chunks): messages
    /// between two ranks arrive in the order they were sent, so one would land in the wrong
    /// buffer.
    #[error("pipeline order: {sent}, where the receiver expects: {received}; messages between two ranks arrive in the order they are sent, so each pair of ranks must run its transfers to each other in the same order")]
    PipelineTransferOrder {
        /// The send.
        sent: PipelineTransfer,
        /// The receive it would meet.
        received: PipelineTransfer,
    },
    /// Arguments no pipeline schedule exists for (`dist::one_f_one_b`).
    #[error("no 1F1B schedule of {microbatches} microbatch(es) over {ranks} rank(s) with {chunks_per_rank} chunk(s) each: every count must be at least 1, and with several chunks per rank the microbatches a multiple of the ranks")]
    PipelineSchedule {
        /// The ranks.
        ranks: usize,
        /// The chunks per rank.
        chunks_per_rank: usize,
        /// The microbatches.
        microbatches: usize,
    },
    /// A receive of a grouped send/recv whose buffer another transfer of the group uses too
    /// (the transfers of a group run at once).
    #[error("Communicator::send_recv_group: transfer {receive} receives into the buffer of transfer {other}; the transfers of a group run at once, so a receive needs a buffer of its own")]
    GroupAliased {
        /// The receive's index in the group.
        receive: usize,
        /// The other transfer's index.
        other: usize,
    },
    /// An all-reduce cost model that cannot be measured, fitted or used as asked.
    #[error("all-reduce cost model: {why}")]
    CostModel {
        /// What is wrong.
        why: &'static str,
    },
}

/// What went wrong at a rendezvous, in [`DistError::Rendezvous`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RendezvousFailure {
    /// The operating system refused a step of the rendezvous.
    #[error("{step}: {source}")]
    Io {
        /// The step.
        step: RendezvousStep,
        /// The OS's error.
        #[source]
        source: std::io::Error,
    },
    /// Rank 0 waited for the other ranks to fetch the id, and not all came.
    #[error("only {arrived} of {world} ranks arrived within {waited:?}; start every rank with the same rendezvous, or raise dist::Config::timeout")]
    RanksMissing {
        /// The ranks that fetched the id (rank 0 included).
        arrived: usize,
        /// The ranks of the group.
        world: usize,
        /// How long rank 0 waited.
        waited: std::time::Duration,
    },
    /// A rank waited for rank 0 to publish the id, and it did not.
    #[error("rank 0 did not publish the id within {waited:?}; check that rank 0 runs and uses the same rendezvous, or raise dist::Config::timeout")]
    NotPublished {
        /// How long the rank waited.
        waited: std::time::Duration,
    },
}

/// A step of a rendezvous that the operating system can refuse (in
/// [`RendezvousFailure::Io`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum RendezvousStep {
    /// Rank 0 writing the id to a temporary file beside the rendezvous file.
    WriteFile,
    /// Rank 0 renaming that file into place.
    RenameFile,
    /// Rank 0 listening on the TCP port.
    Listen,
    /// Rank 0 accepting a connection.
    Accept,
    /// Rank 0 setting a socket's blocking mode.
    Configure,
    /// Rank 0 sending the id to a rank.
    Send,
}

impl std::fmt::Display for RendezvousStep {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            RendezvousStep::WriteFile => "rank 0 cannot write the id",
            RendezvousStep::RenameFile => "rank 0 cannot rename the id file into place",
            RendezvousStep::Listen => "rank 0 cannot listen",
            RendezvousStep::Accept => "rank 0 cannot accept a connection",
            RendezvousStep::Configure => "rank 0 cannot set a socket's mode",
            RendezvousStep::Send => "rank 0 cannot send the id",
        })
    }
}

/// How a rank process of a launch failed, in [`DistError::RankFailed`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RankExit {
    /// It exited with a failure status (or was killed by a signal).
    #[error("exited with {0}")]
    Exited(std::process::ExitStatus),
    /// It could not be started.
    #[error("could not start: {0}")]
    NotStarted(#[source] std::io::Error),
    /// Waiting for it failed.
    #[error("could not be waited for: {0}")]
    NotWaited(#[source] std::io::Error),
    /// It was still running at the launch's deadline, and was killed.
    #[error("was still running after the deadline of {deadline:?}")]
    Deadline {
        /// The launch's deadline (`LaunchOptions::deadline`).
        deadline: std::time::Duration,
    },
}

/// How [`Communicator::all_reduce`](crate::dist::Communicator::all_reduce) and
/// [`Communicator::reduce_scatter`](crate::dist::Communicator::reduce_scatter) combine the
/// ranks' values. It prints as `sum` or `avg`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    /// The sum over ranks.
    Sum,
    /// The mean over ranks (the sum, then divided by the world size).
    Avg,
}

impl std::fmt::Display for ReduceOp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Avg => "avg",
        })
    }
}

/// One collective as a rank issued it, in [`DistError::CollectiveMismatch`] and
/// [`AbortReason::CollectiveMismatch`]: the call, its elements (collectives take f32 tensors
/// only, so no dtype is named) and its reduction or root. Ranks must issue equal ones, in the
/// same order.
///
/// ```
/// use graphed::dist::{self, Config, ReduceOp};
/// use graphed::{Collective, DistError, Error, Tensor};
/// let results = dist::run_emulated_each(2, &Config::default(), |comm| {
///     let t = Tensor::zeros(comm.device(), &[2 + comm.rank()])?;
///     comm.all_reduce(&t, ReduceOp::Sum)
/// })?;
/// let Err(Error::Dist(DistError::CollectiveMismatch { issued, .. })) = &results[0] else { panic!() };
/// assert_eq!(issued[1], Collective::AllReduce { elements: 3, op: ReduceOp::Sum });
/// assert_eq!(issued[1].to_string(), "all_reduce(3 elements, sum)");
/// # Ok::<(), graphed::Error>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Collective {
    /// `Communicator::all_reduce` of a tensor of `elements`.
    AllReduce {
        /// The tensor's elements.
        elements: usize,
        /// How the ranks' values combine.
        op: ReduceOp,
    },
    /// `Communicator::all_reduce_bucket` of tensors of `elements` each.
    AllReduceBucket {
        /// Each tensor's elements, in order.
        elements: Vec<usize>,
        /// How the ranks' values combine.
        op: ReduceOp,
    },
    /// `Communicator::all_gather` of an input of `elements` from each rank.
    AllGather {
        /// The elements each rank contributes.
        elements: usize,
    },
    /// `Communicator::reduce_scatter` into an output of `elements` on each rank.
    ReduceScatter {
        /// The elements each rank receives.
        elements: usize,
        /// How the ranks' values combine.
        op: ReduceOp,
    },
    /// `Communicator::broadcast` of a tensor of `elements` from `root`.
    Broadcast {
        /// The tensor's elements.
        elements: usize,
        /// The rank whose tensor is copied.
        root: usize,
    },
}

impl Collective {
    /// The `Communicator` method that issues it (`"all_reduce"`, ...).
    pub fn name(&self) -> &'static str {
        match self {
            Collective::AllReduce { .. } => "all_reduce",
            Collective::AllReduceBucket { .. } => "all_reduce_bucket",
            Collective::AllGather { .. } => "all_gather",
            Collective::ReduceScatter { .. } => "reduce_scatter",
            Collective::Broadcast { .. } => "broadcast",
        }
    }
}

impl std::fmt::Display for Collective {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let name = self.name();
        match self {
            Collective::AllReduce { elements, op } => write!(f, "{name}({elements} elements, {op})"),
            Collective::AllReduceBucket { elements, op } => write!(f, "{name}({elements:?} elements, {op})"),
            Collective::AllGather { elements } => write!(f, "{name}({elements} elements each)"),
            Collective::ReduceScatter { elements, op } => write!(f, "{name}({elements} elements each, {op})"),
            Collective::Broadcast { elements, root } => write!(f, "{name}({elements} elements, root {root})"),
        }
    }
}

/// What each rank issued, as `rank 0: ...; rank 1: ...`.
fn by_rank(issued: &[Collective]) -> String {
    issued.iter().enumerate().map(|(r, c)| format!("rank {r}: {c}")).collect::<Vec<_>>().join("; ")
}

/// Why a group was aborted, in [`DistError::CommAborted`]: every rank of the group sees the
/// same reason, the first one (later aborts keep it). Text appears only where graphed did not
/// write it (a panic's message, the reason given to
/// [`Communicator::abort`](crate::dist::Communicator::abort), NCCL's description of its error)
/// and in [`AbortReason::PeerFailed`], which prints the failed rank's error: that error, typed,
/// is the failed rank's own result.
///
/// ```
/// use graphed::dist::{self, Config};
/// use graphed::{AbortReason, DistError, Error};
/// let results = dist::run_emulated_each(3, &Config::default(), |comm| {
///     if comm.rank() == 2 {
///         panic!("rank 2 dies");
///     }
///     comm.barrier()
/// })?;
/// let e = results[0].as_ref().unwrap_err();
/// assert!(matches!(
///     e.root(),
///     Error::Dist(DistError::CommAborted { reason: AbortReason::PeerPanicked { rank: 2, .. }, .. })
/// ));
/// assert_eq!(e.to_string(), "rank 0: the communicator was aborted: rank 2 panicked: rank 2 dies");
/// # Ok::<(), graphed::Error>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AbortReason {
    /// An emulated rank panicked.
    #[error("rank {rank} panicked: {message}")]
    PeerPanicked {
        /// The rank.
        rank: usize,
        /// The panic's message.
        message: String,
    },
    /// An emulated rank's program returned an error (that rank's own result holds it, typed).
    #[error("rank {rank} failed: {error}")]
    PeerFailed {
        /// The rank.
        rank: usize,
        /// Its error as it prints.
        error: String,
    },
    /// A rank called [`Communicator::abort`](crate::dist::Communicator::abort).
    #[error("rank {rank} aborted: {reason}")]
    Requested {
        /// The rank.
        rank: usize,
        /// The reason it gave.
        reason: String,
    },
    /// An emulated rank's wait passed its deadline (it got [`DistError::CommTimeout`]).
    #[error("rank {rank} timed out in `{op}` after {waited:?}")]
    TimedOut {
        /// The rank.
        rank: usize,
        /// The operation that waited.
        op: &'static str,
        /// How long it waited.
        waited: std::time::Duration,
    },
    /// Emulated ranks issued different collectives at the same point (they got
    /// [`DistError::CollectiveMismatch`]).
    #[error("collective mismatch: {}", by_rank(.issued))]
    CollectiveMismatch {
        /// What each rank issued, by rank.
        issued: Vec<Collective>,
    },
    /// An emulated receive got another number of elements than its buffer holds (the receiver
    /// got [`DistError::TransferSizeMismatch`]).
    #[error("send/recv size mismatch: rank {sender} sent {sent} elements, rank {receiver} receives {expected}")]
    TransferSizeMismatch {
        /// The sending rank.
        sender: usize,
        /// The receiving rank.
        receiver: usize,
        /// The elements sent.
        sent: usize,
        /// The elements of the receive's buffer.
        expected: usize,
    },
    /// An NCCL call failed, or NCCL reported an asynchronous error (a peer's death seen by the
    /// network, say); emulated ranks report an injected collective failure this way too.
    #[error("rank {rank}: NCCL call `{call}` failed: {message}")]
    Nccl {
        /// The rank that saw it.
        rank: usize,
        /// The call.
        call: &'static str,
        /// NCCL's description of the error.
        message: String,
    },
    /// No live NCCL communicator: it never came up, or was already destroyed.
    #[error("the NCCL communicator is not live (it never came up, or was already destroyed)")]
    NoCommunicator,
}

/// Why NCCL cannot be used here, in [`DistError::NcclUnavailable`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum NcclProblem {
    /// `libnccl.so` does not load.
    #[error("cannot load libnccl.so (cudarc loads NCCL by that name; where only libnccl.so.2 is installed, put a libnccl.so symlink to it in a directory on LD_LIBRARY_PATH, as scripts/gpu-multi.sh does)")]
    NotLoadable,
    /// The library loads, but a call that asks it for its version or a unique id failed.
    #[error("{call} failed: {result}")]
    Call {
        /// The call.
        call: &'static str,
        /// NCCL's result code.
        result: String,
    },
}

impl NcclProblem {
    /// [`NcclProblem::Call`] for NCCL's result code `result`.
    pub(crate) fn call(call: &'static str, result: impl std::fmt::Debug) -> NcclProblem {
        NcclProblem::Call { call, result: format!("{result:?}") }
    }
}

/// One transfer of a pipeline stage: a send or receive of one microbatch's activation or
/// grad between the ranks of neighbouring chunks (in [`DistError::PipelineDeadlock`] and
/// [`DistError::PipelineTransferOrder`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PipelineTransfer {
    /// The rank.
    pub rank: usize,
    /// Whether it sends (rather than receives).
    pub sends: bool,
    /// The neighbour.
    pub peer: usize,
    /// Whether an activation (forward) rather than a grad (backward).
    pub activation: bool,
    /// The chunk (1-indexed) whose output (an activation) or input grad (a grad) it carries.
    pub chunk: usize,
    /// The microbatch.
    pub microbatch: usize,
}

impl std::fmt::Display for PipelineTransfer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let dir = if self.sends { "sends to" } else { "receives from" };
        let what = if self.activation { "output" } else { "input grad" };
        let (rank, peer, chunk, microbatch) = (self.rank, self.peer, self.chunk, self.microbatch);
        write!(f, "rank {rank} {dir} rank {peer} (chunk {chunk}'s {what} for microbatch {microbatch})")
    }
}
