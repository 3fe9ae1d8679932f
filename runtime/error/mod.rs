//! The one error type of the crate.

mod arg;
mod bucket;
mod build;
mod capture;
mod checkpoint;
mod cuda;
mod device;
mod dist;
mod graph;
mod interop;
mod kernel;
mod launcher;
mod op;
mod optim;
mod schedule;
mod setup;
mod shape;
mod signature;
mod slot;

pub use arg::Arg;
pub use bucket::{BucketError, BucketRule};
pub use capture::{BodyNode, Invalidation};
pub use checkpoint::{CheckpointProblem, TensorLayout};
pub use cuda::{CudaFailure, NoCuda};
pub use device::DeviceError;
pub use dist::{
    AbortReason, Collective, DistError, NcclProblem, PipelineTransfer, RankExit, ReduceOp, RendezvousFailure,
    RendezvousStep,
};
pub use graph::GraphError;
pub use interop::InteropProblem;
pub use kernel::KernelError;
pub use launcher::Launcher;
pub use op::{AttentionLimit, OpError};
pub use optim::OptimError;
pub use schedule::ScheduleError;
pub use setup::SetupError;
pub use shape::ShapeProblem;
pub use signature::SignatureError;
pub use slot::{Slot, SlotKind};

/// Everything that can go wrong in `graphed`, as values a caller can match on.
///
/// Every message says what went wrong and, where there is one, what to do about it. What
/// graphed refuses or detects itself is a typed variant, most of them grouped by domain in an
/// enum of their own joined in with `#[from]` ([`OpError`], [`OptimError`], [`KernelError`],
/// [`GraphError`], [`DeviceError`], [`ScheduleError`], [`SignatureError`], [`SetupError`],
/// [`BucketError`], [`DistError`]); [`Error::InvalidArgument`] and [`Error::Msg`] are left to
/// your own code. An error passed up through a host implementation or a capture carries
/// lines of [`Error::Context`]; match on [`Error::root`] to see through them:
///
/// ```
/// use graphed::optim::{Sgd, SgdConfig};
/// use graphed::{Arg, Device, Error, Kernel, KernelArg, KernelError, LaunchConfig, OptimError, Tensor};
/// let e = Sgd::new(&[], SgdConfig::default()).unwrap_err();
/// assert!(matches!(e.root(), Error::Optim(OptimError::NoParams { .. })));
/// // A host implementation's error comes back with the kernel's name as context.
/// let src = r#"extern "C" __global__ void k(float* y) {}"#;
/// let k = Kernel::new("k", src, &[Arg::TensorOut], |args| args.f32(1).map(drop))?; // no argument 1
/// let y = Tensor::zeros(&Device::host(), &[4])?;
/// let e = k.launch(LaunchConfig::for_elements(4), &[KernelArg::Out(&y)]).unwrap_err();
/// assert!(matches!(e.root(), Error::Kernel(KernelError::ArgPosition { position: 1, count: 1, .. })));
/// // Your misuse, or the device failing: the variant tells.
/// assert!(!matches!(e.root(), Error::Cuda { .. } | Error::OutOfMemory { .. } | Error::Device(_)));
/// # Ok::<(), graphed::Error>(())
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// CUDA was asked for explicitly but is not usable here.
    #[error(
        "CUDA is not available: {reason}. Use Device::host(), or Device::default_device() to fall back automatically"
    )]
    CudaUnavailable {
        /// Why CUDA could not be used.
        reason: NoCuda,
    },
    /// A CUDA driver, NVRTC or cuBLAS call failed; the library's own error is the source.
    #[error("CUDA call `{call}` failed: {source}")]
    Cuda {
        /// The call that failed.
        call: &'static str,
        /// The library's error.
        #[source]
        source: CudaFailure,
    },
    /// An operation that is illegal while a stream is being captured.
    #[error("`{op}` is illegal while the stream is capturing a graph; do it before capture begins or after it ends")]
    IllegalDuringCapture {
        /// The offending operation.
        op: &'static str,
    },
    /// An operation that is illegal while the body of a conditional node is being captured
    /// ([`crate::Condition::run_if`]), such as ending the capture the body belongs to.
    #[error("`{op}` is illegal inside a conditional body being captured (Condition::run_if); do it after the closure returns")]
    IllegalInConditionalBody {
        /// The offending operation.
        op: &'static str,
    },
    /// Shapes that do not fit together (see [`ShapeProblem`]).
    #[error("{op}: shape mismatch: {problem}")]
    Shape {
        /// The operation that rejected the shapes.
        op: &'static str,
        /// How they do not fit.
        problem: ShapeProblem,
    },
    /// A dtype the operation does not support.
    #[error("{op}: dtype {got:?} is not supported here (expected {expected:?})")]
    DType {
        /// The operation.
        op: &'static str,
        /// The dtype it got.
        got: crate::DType,
        /// The dtype it needs.
        expected: crate::DType,
    },
    /// Tensors from different devices were mixed in one operation.
    #[error("{op}: tensors live on different devices ({}); copy them to one device first", device_pair(a, b))]
    DeviceMismatch {
        /// The operation.
        op: &'static str,
        /// One device.
        a: String,
        /// The other device.
        b: String,
    },
    /// An argument your own code refused: for the host implementation of a custom
    /// [`crate::Kernel`], a module or a hook to return. graphed itself never returns it; what
    /// it refuses has a typed variant ([`Error::Op`], [`Error::Optim`], [`Error::Kernel`], ...).
    ///
    /// ```
    /// use graphed::{Error, Result};
    /// fn check_vocab(vocab: usize) -> Result<()> {
    ///     if vocab == 0 {
    ///         return Err(Error::InvalidArgument { op: "my_tokenizer", detail: "an empty vocabulary".into() });
    ///     }
    ///     Ok(())
    /// }
    /// assert!(matches!(check_vocab(0), Err(Error::InvalidArgument { op: "my_tokenizer", .. })));
    /// ```
    #[error("{op}: invalid argument: {detail}")]
    InvalidArgument {
        /// The operation.
        op: &'static str,
        /// What is wrong with it.
        detail: String,
    },
    /// A handle to a static buffer that a later graph replay has overwritten.
    #[error("stale tensor: this handle to the static buffer of `{owner}` {}; clone the tensor (Tensor::deep_clone) before the next call if you need to keep it", stale_cause(*held, *current, *overwritten_by_another_capture))]
    StaleTensor {
        /// The graph surface the buffer belongs to.
        owner: String,
        /// The generation the handle was issued at.
        held: u64,
        /// The buffer's generation now.
        current: u64,
        /// Whether a graph of another capture sharing the buffer's pool has overwritten it
        /// since the graph that made it last wrote it (see [`crate::GraphPool`]).
        overwritten_by_another_capture: bool,
    },
    /// Graphs sharing a pool were replayed out of their capture order.
    #[error("replay order: `{got}` was replayed but `{expected}` is next; graphs that share a pool must replay in capture order ({}), or memory reused between them would be corrupted", order.join(" -> "))]
    ReplayOrder {
        /// The graph that was replayed.
        got: String,
        /// The graph that should have come next.
        expected: String,
        /// The graphs' labels in their capture order.
        order: Vec<String>,
    },
    /// A replay, node listing or instantiation of a graph that holds no capture (never
    /// captured, or reset since).
    #[error("graph `{graph}` holds no capture (never captured, or reset since); capture it first")]
    NotCaptured {
        /// The graph's label.
        graph: String,
    },
    /// A capture into a graph that already holds one.
    #[error("graph `{graph}` is already captured; reset() it before capturing again")]
    AlreadyCaptured {
        /// The graph's label.
        graph: String,
    },
    /// A capture begun while this thread is already capturing the stream.
    #[error("`{graph}` is already capturing; end that capture first")]
    AlreadyCapturing {
        /// The graph (or stream) that is capturing.
        graph: String,
    },
    /// `capture_end` without a capture in progress on this thread.
    #[error("`{graph}` is not capturing; call capture_begin first")]
    NotCapturing {
        /// The graph (or stream).
        graph: String,
    },
    /// A capture that ended invalidated: nothing of it is kept (see [`Invalidation`]).
    #[error("the capture was invalidated: {cause}")]
    CaptureInvalidated {
        /// What invalidated it.
        cause: Invalidation,
    },
    /// Another thread's capture on this device did not end in time.
    #[error("waited {waited:?} for {waiting} on this device; a capture on another thread never ended")]
    DeviceBusy {
        /// What the call was waiting for.
        waiting: &'static str,
        /// How long it waited.
        waited: std::time::Duration,
    },
    /// A capture-time hook or user code returned an error; the capture was ended cleanly.
    #[error("{context}: {source}")]
    Context {
        /// Where it happened.
        context: String,
        /// The underlying error.
        #[source]
        source: Box<Error>,
    },
    /// A graphed call with the wrong number of inputs or grad outputs.
    #[error("graphed module `{module}`: {got} {kind}s given, the capture takes {expected}")]
    Arity {
        /// The (chunk, microbatch) surface called.
        module: String,
        /// Inputs or grad outputs.
        kind: SlotKind,
        /// How many the capture takes.
        expected: usize,
        /// How many were given.
        got: usize,
    },
    /// A tensor of another shape than the one captured.
    #[error("graphed module `{module}`: {slot} has shape {got:?} but was captured with {expected:?}; capture again for a new shape")]
    SlotShape {
        /// The (chunk, microbatch) surface called.
        module: String,
        /// Which argument.
        slot: Slot,
        /// The captured shape.
        expected: Vec<usize>,
        /// The given shape.
        got: Vec<usize>,
    },
    /// A tensor of another dtype than the one captured.
    #[error("graphed module `{module}`: {slot} is {got:?} but was captured as {expected:?}")]
    SlotDType {
        /// The (chunk, microbatch) surface called.
        module: String,
        /// Which argument.
        slot: Slot,
        /// The captured dtype.
        expected: crate::DType,
        /// The given dtype.
        got: crate::DType,
    },
    /// A tensor on another device than the captured graphs.
    #[error("graphed module `{module}`: {slot} lives on {got} but the graphs run on {expected}; copy it there first")]
    SlotDevice {
        /// The (chunk, microbatch) surface called.
        module: String,
        /// Which argument.
        slot: Slot,
        /// The graphs' device.
        expected: String,
        /// The tensor's device.
        got: String,
    },
    /// `None` where a tensor was captured, or a tensor where `None` was.
    #[error("graphed module `{module}`: {slot} is {} but was captured {}", if *.captured_some { "None" } else { "a tensor" }, if *.captured_some { "with a tensor" } else { "as None" })]
    SlotPresence {
        /// The (chunk, microbatch) surface called.
        module: String,
        /// Which argument.
        slot: Slot,
        /// Whether the capture had a tensor there.
        captured_some: bool,
    },
    /// An input that requires a grad, where the capture computed none.
    #[error("graphed module `{module}`: {slot} requires a grad, but the graphs were captured with a sample that does not; capture with `requires_grad` samples")]
    SlotRequiresGrad {
        /// The (chunk, microbatch) surface called.
        module: String,
        /// Which input.
        slot: Slot,
    },
    /// A sample of a `#[graphed]` struct's chunk whose input grad the previous chunk's
    /// backward needs, but which does not require a grad (its backward would return `None`).
    #[error("graphed struct: the sample of chunk {chunk} (`{module}`) input {input} does not require a grad, but chunk {prev}'s backward needs that grad; give it `.with_requires_grad(true)` (a chained struct infers it)", prev = chunk - 1)]
    SampleNeedsGrad {
        /// The chunk's module.
        module: String,
        /// The chunk, 1-indexed as in `order`.
        chunk: usize,
        /// Which input of its forward (0-indexed).
        input: usize,
    },
    /// A `#[graphed]` struct built with an empty stack (`Vec<M>` field) where a chunk is needed.
    #[error("graphed struct `{module}`: the stack `{field}` is empty; a stack holds at least one layer")]
    EmptyStack {
        /// The struct.
        module: String,
        /// The `Vec` field.
        field: String,
    },
    /// A backward with no forward outstanding for the chunk.
    #[error("graphed module `{module}`: backward without an outstanding forward")]
    NoPendingForward {
        /// The module.
        module: String,
    },
    /// `backward_weights` for a chunk whose weight grads are not separate steps.
    #[error("graphed module `{module}`: its weight grads run inside its backward (the schedule has no w(c) entries for this chunk, or its module does not split its backward), so there is no separate weight-grad step")]
    NotDeferred {
        /// The module.
        module: String,
    },
    /// `backward_weights` with no microbatch whose backward ran and whose weight grads have not.
    #[error("graphed module `{module}`: weight grads without an outstanding backward (each w(c) follows a -c)")]
    NoPendingBackward {
        /// The module.
        module: String,
    },
    /// A backward on graphs captured for inference (forward only), or of a module that has no
    /// backward.
    #[error("graphed module `{module}`: the graphs were captured forward-only (inference, a module without a backward, or nothing needed a grad), so there is no backward to replay")]
    ForwardOnly {
        /// The module.
        module: String,
    },
    /// An input that needs a grad got none from backward.
    #[error("graphed module `{module}`: input {input} needs a grad but backward returned none; pass allow_unused_input to allow it")]
    UnusedInput {
        /// The module.
        module: String,
        /// The input's position.
        input: usize,
    },
    /// A chunk index past the graphed modules.
    #[error("chunk {chunk} does not exist: there are {chunks} chunks (0-indexed here)")]
    ChunkOutOfRange {
        /// The index given.
        chunk: usize,
        /// The number of chunks.
        chunks: usize,
    },
    /// A capture-time hook failed (during warm-up, capture or an eager call).
    #[error("{kind} hook of `{module}` failed: {source}")]
    Hook {
        /// The module.
        module: String,
        /// The hook kind's name.
        kind: &'static str,
        /// The hook's error.
        #[source]
        source: Box<Error>,
    },
    /// `step()` before `fuse()`.
    #[error("graphed modules `{module}`: no fused step yet; call fuse() once after capture")]
    NotFused {
        /// The modules.
        module: String,
    },
    /// `step()` in the mode the graphs were not captured for.
    #[error("graphed modules `{module}`: step() replays the graphs captured in {} mode; switch back with {}", if *.captured_training { "training" } else { "eval" }, if *.captured_training { "train()" } else { "eval()" })]
    StepMode {
        /// The modules.
        module: String,
        /// The mode captured.
        captured_training: bool,
    },
    /// `step()` while per-call replays are half-way through an iteration.
    #[error("graphed modules `{module}`: step() replays a whole iteration, but per-call replays are half-way through one ({pending} microbatches await their backward or weight grads); finish it first")]
    StepMidIteration {
        /// The modules.
        module: String,
        /// Microbatches whose backward, or whose deferred weight grads, have not run.
        pending: usize,
    },
    /// The pool had to grow while a global or thread-local capture was in progress.
    #[error("the graph pool needs {bytes} more bytes during a capture, and allocating would invalidate a global or thread-local capture; make_graphed retries after growing the pool, raw captures should warm up in the pool first or use CaptureMode::Relaxed")]
    PoolGrowthDuringCapture {
        /// The size of the block that did not fit.
        bytes: usize,
    },
    /// The device (or, on the host backend, the machine) has no memory for a request: the
    /// driver refused the slab, or the size does not even fit in the address space
    /// (`requested` is then `usize::MAX`). Nothing was allocated.
    #[error("out of memory on {device}: {} requested, {}; free memory (drop tensors, capture with fewer microbatches in flight) or cap other pools with GraphPool::with_limit", bytes_text(*.requested), match .available { Some(a) => format!("{} available", bytes_text(*a)), None => "the device does not say how much is available".to_string() })]
    OutOfMemory {
        /// The device.
        device: String,
        /// Bytes asked for (`usize::MAX` when the size overflows).
        requested: usize,
        /// Bytes the device says are free, where it can tell.
        available: Option<usize>,
    },
    /// A pool would grow past its byte limit ([`crate::GraphPool::with_limit`],
    /// [`crate::GraphOptions::pool_limit`]). Nothing was allocated.
    #[error("pool #{pool}: {} requested, but growing by it would pass the pool's limit of {} ({} reserved, {} in use); raise the limit or free tensors of this pool", bytes_text(*.requested), bytes_text(*.limit), bytes_text(*.reserved), bytes_text(*.in_use))]
    PoolLimit {
        /// The pool's id.
        pool: usize,
        /// Bytes asked for (the block, rounded up to the pool's alignment).
        requested: usize,
        /// The pool's limit.
        limit: usize,
        /// Bytes the pool holds from the driver now.
        reserved: usize,
        /// Bytes of the pool in blocks handed out now.
        in_use: usize,
    },
    /// A failure your own code reports with [`Error::msg`] (from a hook, a module body, a
    /// rank's closure); graphed itself never returns it.
    #[error("{0}")]
    Msg(String),
    // Interop, parameters.
    /// A cudarc interop call on a device or tensor that is not on a CUDA GPU, or with a
    /// foreign object from another context (see [`InteropProblem`]).
    #[error("{op}: {problem}")]
    Interop {
        /// The interop call.
        op: &'static str,
        /// What is wrong, and what to do.
        problem: InteropProblem,
    },
    /// Two parameters of a module got the same name.
    #[error(
        "two parameters are both named `{name}`; rename a field (#[param(rename = \"...\")]) so every name is unique"
    )]
    DuplicateParamName {
        /// The repeated name.
        name: String,
    },
    /// A safetensors file could not be read or written (the OS refused, or for a load the path
    /// is not a regular file: `kind` `InvalidInput`); a failed load changed nothing, a failed
    /// save left any earlier file at `path` as it was.
    #[error("safetensors file {path}: {detail}")]
    CheckpointIo {
        /// The file.
        path: String,
        /// The OS error's kind.
        kind: std::io::ErrorKind,
        /// The OS's message.
        detail: String,
    },
    /// A safetensors file that breaks the format; nothing was loaded.
    #[error("safetensors file {path}{}: {problem}; nothing was loaded", .tensor.as_ref().map_or_else(String::new, |t| format!(", tensor `{t}`")))]
    CheckpointFormat {
        /// The file.
        path: String,
        /// The tensor whose entry is wrong, when the problem is one tensor's.
        tensor: Option<String>,
        /// What is wrong.
        problem: CheckpointProblem,
    },
    /// A module parameter has no tensor in the file; nothing was loaded.
    #[error("safetensors file {path} has no tensor `{tensor}`, which the module needs; nothing was loaded (was the file saved from this module?)")]
    CheckpointMissingTensor {
        /// The file.
        path: String,
        /// The parameter name.
        tensor: String,
    },
    /// The file has a tensor the module has no parameter for; nothing was loaded.
    #[error("safetensors file {path} has a tensor `{tensor}` that the module has no parameter for; nothing was loaded (was the file saved from this module?)")]
    CheckpointUnexpectedTensor {
        /// The file.
        path: String,
        /// The tensor name.
        tensor: String,
    },
    /// A tensor in the file has another shape or dtype than the parameter; nothing was loaded.
    #[error("safetensors file {path}: tensor `{tensor}` is {got} but the module's parameter is {expected}; nothing was loaded")]
    CheckpointTensorMismatch {
        /// The file.
        path: String,
        /// The tensor name.
        tensor: String,
        /// The parameter's dtype and shape, as the file would store them.
        expected: TensorLayout,
        /// The file's dtype and shape.
        got: TensorLayout,
    },
    // Errors by domain.
    /// A communicator, launcher or rendezvous failed (see [`DistError`]).
    #[error(transparent)]
    Dist(#[from] DistError),
    /// Shape buckets refused their options or a call (see [`BucketError`]).
    #[error(transparent)]
    Bucket(#[from] BucketError),
    /// `make_graphed` refused its own arguments (see [`SetupError`]).
    #[error(transparent)]
    Setup(#[from] SetupError),
    /// A schedule that cannot run, or a call that does not fit the schedule captured (see
    /// [`ScheduleError`]).
    #[error(transparent)]
    Schedule(#[from] ScheduleError),
    /// Tensors that do not fit a module's declared interface (see [`SignatureError`]).
    #[error(transparent)]
    Signature(#[from] SignatureError),
    /// An op refused the value of an argument (see [`OpError`]).
    #[error(transparent)]
    Op(#[from] OpError),
    /// An optimizer refused its parameters or configuration (see [`OptimError`]).
    #[error(transparent)]
    Optim(#[from] OptimError),
    /// A custom kernel cannot be declared, compiled or launched as asked (see
    /// [`KernelError`]).
    #[error(transparent)]
    Kernel(#[from] KernelError),
    /// A graph cannot be built or dumped (see [`GraphError`]).
    #[error(transparent)]
    Graph(#[from] GraphError),
    /// A device failure that is neither misuse nor a failed CUDA call (see [`DeviceError`]).
    #[error(transparent)]
    Device(#[from] DeviceError),
    // Precision.
    /// Tensors of different dtypes were mixed in one op without a cast.
    #[error(
        "{op}: a {a} tensor and a {b} tensor mixed in one op; convert one with ops::cast (Tensor::to_dtype) first"
    )]
    DTypeMismatch {
        /// The operation.
        op: &'static str,
        /// The dtype of the op's first tensor.
        a: crate::DType,
        /// The dtype that differs.
        b: crate::DType,
    },
    /// cuBLAS refused a GEMM (a dtype combination or shape it does not support).
    #[error(
        "{op}: cuBLAS rejects the {dtype} GEMM m={m} n={n} k={k} ({status}); check the shapes, or compute it in f32"
    )]
    GemmRejected {
        /// The operation.
        op: &'static str,
        /// The input dtype.
        dtype: crate::DType,
        /// Rows of the column-major result.
        m: usize,
        /// Columns of the column-major result.
        n: usize,
        /// The reduced dimension.
        k: usize,
        /// cuBLAS's status.
        status: String,
    },
    /// f16 training without loss scaling: gradients would underflow or overflow f16.
    #[error("{op}: f16 parameters need dynamic loss scaling (f16 overflows above 65504 and flushes small gradients); pass a LossScaler")]
    F16NeedsLossScaling {
        /// The operation.
        op: &'static str,
    },
    // Transformer ops.
    /// A token id is not an integer in `0..vocab`.
    #[error("{op}: token id {id} at position {pos} is not in the vocabulary 0..{vocab}")]
    TokenOutOfRange {
        /// The operation.
        op: &'static str,
        /// The value.
        id: f32,
        /// Its index.
        pos: usize,
        /// The vocabulary size.
        vocab: usize,
    },
    /// Fused attention was asked for a dtype, head dimension or device its kernels are not
    /// built for.
    #[error("{op}: fused attention runs bf16 or f16 with head_dim 64 or 128 on GPUs of compute capability 8.0 or newer (got {dtype:?}, head_dim {head_dim}{}); use ops::causal_attention for other cases", .limit.map_or_else(String::new, |g| format!("; {g}")))]
    AttentionUnsupported {
        /// The operation.
        op: &'static str,
        /// The inputs' dtype.
        dtype: crate::DType,
        /// Their head dimension.
        head_dim: usize,
        /// Why it does not run here, when the dtype and head dimension are supported.
        limit: Option<AttentionLimit>,
    },
    /// A KV cache had no room for one more step: sequence `sequence` already holds `max_len`
    /// positions. Sequences with room were appended; this one is unchanged.
    #[error("{op}: the KV cache of sequence {sequence} is full ({max_len} positions); start a new sequence or use a longer cache")]
    CacheFull {
        /// The operation.
        op: &'static str,
        /// The sequence (batch index).
        sequence: usize,
        /// The cache's positions per sequence.
        max_len: usize,
    },
    /// A KV cache length is not in `0..=max_len` (on the device, it was read there). The
    /// sequence was treated as empty (zero output) or left unchanged.
    #[error("{op}: the cache length {length} of sequence {sequence} is not in 0..={max_len}")]
    CacheLengthOutOfRange {
        /// The operation.
        op: &'static str,
        /// The sequence (batch index).
        sequence: usize,
        /// The length it holds.
        length: i64,
        /// The cache's positions per sequence.
        max_len: usize,
    },
    /// A graph cannot be the body of a conditional node ([`crate::ConditionalGraph`]).
    #[error("graph `{graph}` cannot be the body of a conditional node: it holds {node}; bodies hold kernels, copies and memsets only (no memory allocation or free, host or collective nodes)")]
    ConditionalBody {
        /// The body graph's label.
        graph: String,
        /// The node that is not allowed there.
        node: BodyNode,
    },
    /// A graph holding a conditional node cannot be fused with others: CUDA refuses a graph
    /// with conditional nodes as a child graph.
    #[error("graph `{graph}` holds a conditional node (Condition::run_if, while_loop, if_then), which CUDA cannot embed in a fused graph; replay it on its own")]
    FuseConditional {
        /// The graph's label.
        graph: String,
    },
    /// Conditional graph nodes need a newer CUDA driver.
    #[error("conditional graph nodes need a driver for CUDA {needed} or newer; this one supports CUDA {driver}")]
    ConditionalUnsupported {
        /// The CUDA version the driver supports.
        driver: crate::CudaVersion,
        /// The version conditional nodes need ([`crate::CudaVersion::CONDITIONAL_NODES`]).
        needed: crate::CudaVersion,
    },
    /// An op's output buffer shares memory with one of its inputs.
    #[error("{op}: `{output}` shares memory with `{input}`; give it a buffer of its own")]
    Overlap {
        /// The operation.
        op: &'static str,
        /// The output argument.
        output: &'static str,
        /// The input it overlaps.
        input: &'static str,
    },
    /// A sampling temperature that is negative, NaN or infinite ([`crate::ops::Sampling`]).
    #[error("sampling temperature {temperature} must be finite and at least 0 (0 samples greedily)")]
    InvalidTemperature {
        /// The temperature given.
        temperature: f32,
    },
    /// A sequence is longer than the model's context.
    #[error("{op}: a sequence of {len} tokens is longer than the context of {context}; shorten it")]
    SequenceTooLong {
        /// The operation.
        op: &'static str,
        /// Its length.
        len: usize,
        /// The context length.
        context: usize,
    },
}

/// A byte count for messages: `usize::MAX` reads as "more than the address space".
fn bytes_text(bytes: usize) -> String {
    if bytes == usize::MAX {
        "more bytes than the address space holds".into()
    } else {
        format!("{bytes} bytes")
    }
}

/// The two devices of [`Error::DeviceMismatch`]'s message: two of one name are two separate
/// devices (each `Device::host()` call makes a new one).
fn device_pair(a: &str, b: &str) -> String {
    if a == b && a == "host" {
        "two separate host devices: each Device::host() call makes a new one, so make one and share it".into()
    } else if a == b {
        format!("two separate devices named {a}")
    } else {
        format!("{a} and {b}")
    }
}

/// What made a handle stale, for [`Error::StaleTensor`]'s message.
fn stale_cause(held: u64, current: u64, overwritten_by_another_capture: bool) -> String {
    if overwritten_by_another_capture && held == current {
        "lies in pool memory that a graph of another capture sharing the pool overwrote after the \
         buffer's own graph wrote it"
            .into()
    } else {
        format!("was overwritten by a later replay (generation {held}, buffer now at {current})")
    }
}

/// `Result` with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
