//! # graphed
//!
//! Capture GPU modules into CUDA graphs, declared through procedural macros: the Rust
//! counterpart of PyTorch's `torch.cuda.make_graphed_callables` and Transformer Engine's version
//! of it (pipeline `order`, capture-time hooks, recomputation with graph-safe RNG, `None`
//! outputs). You write a module's `forward` and `backward` as ordinary Rust over [`Tensor`]s and
//! [`ops`]; `#[graphed]` generates the static input and output surfaces and the code that warms
//! the module up, captures each pass into a CUDA graph and replays it, checking every call.
//!
//! Two backends run the same ops with the same graph semantics: `cuda` (cudarc, NVRTC kernels,
//! cuBLAS) and `host` (a real CPU execution that records ops during capture and runs the
//! record on replay). [`Device::default_device`] picks the GPU when one is usable, so every
//! example and test runs on a machine without a GPU too.
//!
//! ## Depending on it
//!
//! ```toml
//! [dependencies]
//! graphed = { path = "path/to/graphed" }   # or a git dependency on where you host it
//! ```
//!
//! The macros come with it (`graphed-macros`, an implementation detail pinned to the same
//! version); no CUDA toolkit is needed to build, since the CUDA libraries are loaded at run time.
//! The crate is not on crates.io: the name `graphed` there belongs to another project. Rust 1.88
//! or newer.
//!
//! ## The DSL
//!
//! `#[graphed]` on an inherent impl with `forward(&self, cx: &mut Cx, inputs...)` and
//! `backward(&mut self, cx: &mut Cx, grads...)` makes the type a [`Module`] and generates
//! `make_graphed` (warm-up, then capture) and a wrapper whose `forward`/`backward` take the
//! same tensors (and no `Cx`: the graphs keep what forward saved) and replay the graphs. `backward` accumulates into each [`Param`]'s grad and returns the
//! input grads (`None` where an input needs none).
//!
//! ```
//! use graphed::{capture_time_hook, graphed, ops, Cx, Device, Param, Result, Tensor};
//!
//! pub struct Block { w: Param, b: Param }
//!
//! #[graphed(warmup = 3)]
//! impl Block {
//!     pub fn forward(&self, cx: &mut Cx, x: &Tensor) -> Result<Tensor> {
//!         let h = ops::linear(x, &self.w.value, Some(&self.b.value))?;
//!         cx.save(x);
//!         cx.save(&h);
//!         ops::gelu(&h, ops::Gelu::Erf)
//!     }
//!     pub fn backward(&mut self, cx: &mut Cx, dy: &Tensor) -> Result<Option<Tensor>> {
//!         let (x, h) = (cx.saved(0)?, cx.saved(1)?);
//!         let dh = ops::gelu_backward(dy, &h, ops::Gelu::Erf)?;
//!         let dx = cx.needs_input_grad(0);
//!         ops::linear_backward(&dh, &x, &self.w.value, &self.w.grad, Some(&self.b.grad), dx)
//!     }
//!     #[capture_time_hook(pre_forward)]
//!     fn unshard(&mut self) {} // runs in warm-up and once at capture, never on replay
//! }
//!
//! fn main() -> Result<()> {
//!     let dev = Device::host(); // or Device::default_device()
//!     let w = Param::new(Tensor::full(&dev, &[4, 4], 0.1)?)?;
//!     let b = Param::new(Tensor::zeros(&dev, &[4])?)?;
//!     let x = Tensor::full(&dev, &[2, 4], 1.0)?.with_requires_grad(true);
//!     let mut g = Block { w, b }.make_graphed(&x)?; // warm-up + capture
//!     let y = g.forward(&x)?; // copies x into the static input, replays
//!     let dx = g.backward(&Tensor::full(&dev, &[2, 4], 1.0)?)?; // grads accumulate
//!     assert_eq!(y.dims(), &[2, 4]);
//!     assert!(dx.is_some());
//!     Ok(())
//! }
//! ```
//!
//! `#[graphed(order = [1, 2, -2, -1])]` on a struct whose fields are the chunks declares a
//! pipeline schedule (`+c` the forward of chunk `c`, `-c` its backward, `w(c)` a separate
//! weight-grad pass); `#[capture_time_hook(kind)]` marks hooks (`pre_forward`, `forward`,
//! `pre_backward`, `backward`); `#[derive(Parameters)]` visits a struct's parameters for
//! optimizers, `zero_grad` and safetensors. Misuse of any of them is a compile error on the
//! offending token, all errors of an item reported at once. Each macro's page lists its keys:
//! [`macro@graphed`], [`macro@capture_time_hook`], [`derive@Parameters`].
//!
//! ## Semantics
//!
//! Those of PyTorch and Transformer Engine, with their silent failures turned into errors:
//! warm-up runs eagerly in the graphs' pool and restores the RNG state; capture follows module
//! order (or `order` exactly); a call copies its inputs into the static inputs unless they
//! already are them, replays, and returns the static outputs; graphs sharing a pool must replay
//! in capture order ([`Error::ReplayOrder`] otherwise); an output handed back is never
//! overwritten silently ([`Error::StaleTensor`] after the next replay that overwrites it, its
//! own or that of another capture sharing the pool, `deep_clone` to keep it);
//! every call validates everything before its first side effect, so a refused call changes
//! nothing; a failed capture hands the module back inside [`CaptureError`].
//!
//! ## Core types
//!
//! | type | what it is |
//! |---|---|
//! | [`Device`] | a GPU or the host backend; one stream; [`Device::capabilities`] |
//! | [`Tensor`] | shape, [`DType`] (f32, bf16, f16) and storage on a device |
//! | [`Param`] | a value and its grad |
//! | [`Cx`] | a call's context: saved tensors, which inputs need grads |
//! | [`Graph`], [`GraphPool`] | one captured CUDA graph (`torch.cuda.CUDAGraph`), its memory pool |
//! | [`make_graphed`], [`GraphOptions`], [`GraphedModules`] | the runtime API the macros call |
//! | [`Checkpoint`], [`HookRegistry`], [`Kernel`], [`Generator`] | recomputation, run-time hooks, your own CUDA C, graph-safe RNG |
//! | [`ops`], [`optim`], [`dist`], [`interop`] | ops with CPU references, SGD/AdamW, several GPUs, cudarc interop |
//! | [`Error`], [`Result`] | one error type, matched by variant |
//!
//! ## Supported drivers and GPUs
//!
//! graphed is built against the CUDA 12.4 driver API (cudarc's `cuda-12040` bindings,
//! [`CudaVersion::API_LEVEL`]) and opens a device on any driver for CUDA 12.0 or newer (R525
//! and later, [`CudaVersion::MIN_DRIVER`]); an older driver is [`Error::CudaUnavailable`].
//! Newer driver functions are only called when the driver has them: kernel names in
//! [`Graph::nodes`] need 12.3 (older drivers show `?`), and conditional graph nodes need 12.4
//! ([`Capabilities::conditional_nodes`]). At run time it loads `libcuda`, `libnvrtc` and
//! `libcublas` (any CUDA 12 or 13 release), and, when present, `libcublasLt` (fused GEMM
//! epilogues) and `libnccl.so` (several GPUs). NVRTC must not be newer than the driver: the
//! PTX it emits only loads on a driver of its CUDA version or later. Kernels are compiled for
//! the GPU's own architecture; f32 runs on any GPU CUDA 12 supports, bf16 GEMMs and the fused
//! attention kernels need compute capability 8.0 (Ampere) or newer. Tested on Linux x86-64
//! with an H200 (driver 580, CUDA 13.0).
//!
//! ```
//! let dev = graphed::Device::default_device();
//! println!("{}: {}", dev.name(), dev.capabilities()); // driver version, what is available
//! ```
//!
//! ## Troubleshooting
//!
//! - **It runs on the CPU.** [`Device::default_device`] falls back to the host backend when
//!   [`Device::cuda`] fails, and says why on stderr once (`graphed: running on the host backend
//!   (CPU), no usable GPU: ...`): a library that does not load (put the CUDA libraries on `LD_LIBRARY_PATH`,
//!   e.g. `/usr/local/cuda/lib64`), no GPU, a driver older than CUDA 12.0, or NVRTC newer than
//!   the driver (`cuModuleLoadData` fails with `CUDA_ERROR_UNSUPPORTED_PTX_VERSION`). Call
//!   `Device::cuda(0)` to get the error as a value; set `GRAPHED_DEVICE=host` to choose the
//!   host quietly, and `GRAPHED_REQUIRE_CUDA=1` to make the tests fail rather than skip.
//! - **`CaptureInvalidated`**: its [`Invalidation`] says why; most often something illegal
//!   during capture ran on the stream (a synchronize, a pageable host copy): do it before
//!   capture or after.
//! - **`SlotShape`, `SlotDType`**: a call's tensor differs from the one captured; shapes are
//!   fixed per capture.
//! - **`ReplayOrder`, `StaleTensor`**: replay follows capture order; a handle from before a
//!   replay is stale, and so is one held across the replay of another module sharing the pool
//!   whose temporaries lie where the buffer does ([`GraphPool`]).
//! - **`Kernel(NotCompiled)`**: a user [`Kernel`] first used inside a capture; warm it up first.
//! - **`Dist(NcclUnavailable)`**: cudarc opens `libnccl.so`; where only `libnccl.so.2` is
//!   installed, put a `libnccl.so` symlink to it on `LD_LIBRARY_PATH`.
//!
//! ## Debugging a capture
//!
//! Every graph can be inspected: [`Graph::nodes`] lists each node's kind, kernel name and
//! dependencies, [`Graph::to_dot`] renders them as Graphviz DOT, and [`Graph::debug_dump`]
//! writes CUDA's own verbose dump on a GPU. The graphs of a `make_graphed` call are
//! [`GraphedModules::graphs`] (reach them through the generated wrapper's `inner()`):
//!
//! ```
//! use graphed::{ops, CaptureMode, Device, Graph, NodeKind, Tensor};
//! let dev = Device::host();
//! let (x, y) = (Tensor::full(&dev, &[8], 1.0)?, Tensor::zeros(&dev, &[8])?);
//! let mut g = Graph::new(&dev);
//! g.capture(CaptureMode::Global, || ops::axpy_(&y, 2.0, &x))?;
//! assert!(g.nodes()?.iter().any(|n| n.kind == NodeKind::Kernel));
//! println!("{}", g.to_dot()?); // dot -Tsvg to draw it
//! # Ok::<(), graphed::Error>(())
//! ```
//!
//! ## Limitations
//!
//! - Shapes are fixed per capture: a call with other shapes or dtypes is an error, not a
//!   recapture (capture another module for another shape).
//! - No autograd: each module's `backward` is written by hand (each op has a `*_backward`).
//! - The ops are the ones in [`ops`] (and your own [`Kernel`]s); no general tensor library.
//! - One stream per device; several GPUs means one process per GPU ([`dist`]).
//! - Conditional graph nodes (device-side loops and skips) are not used yet.
//! - Tested on Linux x86-64 with NVIDIA H200 GPUs only.
//!
//! A smaller example, the low-level [`Graph`] on its own:
//!
//! ```
//! use graphed::{ops, CaptureMode, Device, Graph, Tensor};
//! let dev = Device::default_device();
//! let y = Tensor::zeros(&dev, &[4])?;
//! let x = Tensor::full(&dev, &[4], 1.0)?;
//! let mut g = Graph::new(&dev);
//! g.capture(CaptureMode::Global, || ops::axpy_(&y, 0.5, &x))?;
//! for _ in 0..4 { g.replay()?; }
//! assert_eq!(y.to_vec()?, vec![2.0; 4]);
//! # Ok::<(), graphed::Error>(())
//! ```

#![warn(missing_docs)]

#[doc(hidden)]
#[path = "private.rs"]
pub mod __private;
mod backend;
mod capabilities;
mod checkpoint;
mod conditional;
mod cx;
mod device;
pub mod dist;
mod dtype;
mod error;
/// Fault injection, a test facility (no semver guarantee): a device's [`fault::FaultPlan`]
/// makes the Nth allocation, launch, copy, collective or file access fail with the error the
/// driver or the OS would give, once, so tests can check that every failure leaves nothing
/// behind. Disarmed, it costs one relaxed load per point.
#[doc(hidden)]
pub mod fault {
    pub use crate::backend::{FaultCounts, FaultPlan, FaultPoint};
}
mod graph;
mod graphed;
mod hooks;
mod kernel;
mod module;
pub mod ops;
pub mod optim;
mod order_entry;

mod param;
mod pool;
mod rng;
mod shape;
mod state_dict;
mod tensor;

pub use backend::is_capturing;
pub use capabilities::{Capabilities, CudaVersion};
pub use checkpoint::Checkpoint;
pub use conditional::{Condition, ConditionalGraph};
pub use cx::Cx;
pub use device::Device;
pub use dtype::DType;
pub use error::{
    AbortReason, AttentionLimit, BodyNode, BucketError, BucketRule, CheckpointProblem, Collective, CudaFailure,
    DeviceError, DistError, Error, GraphError, InteropProblem, Invalidation, KernelError, NcclProblem, NoCuda, OpError,
    OptimError, PipelineTransfer, RankExit, RendezvousFailure, RendezvousStep, Result, ScheduleError, SetupError,
    ShapeProblem, SignatureError, Slot, SlotKind, TensorLayout,
};
pub use graph::{CaptureMode, Graph, GraphNode, NodeKind};
pub use graphed::{
    estimate_pool, make_graphed, AboveLargest, BucketReport, Buckets, CaptureError, GraphOptions, GraphedModules,
    PoolEstimate, PoolProbe, Sequence,
};
pub use graphed_macros::{capture_time_hook, graphed, Parameters};
/// The `half` crate, whose [`half::bf16`] and [`half::f16`] are the host types of
/// [`DType::BF16`] and [`DType::F16`].
pub use half;
pub use hooks::{HookHandle, HookRegistry};
pub use kernel::check::{check_kernel_against_host, CheckArg, KernelCheckReport, OutputCheck};
pub use kernel::host::{HostArgs, HostFn};
pub use kernel::{Arg, Kernel, KernelArg, LaunchConfig};
pub use module::{backward_unsplit, ChainIn, ChainLink, ChainOut, HookKind, Module, Slots, TypedModule};
pub use order_entry::OrderEntry;
pub use param::visit::Parameters;
pub use param::Param;
pub use pool::{GraphPool, PoolStats};
pub use rng::{Generator, RngState};
pub use shape::{Shape, MAX_RANK};
pub use state_dict::{load_safetensors, save_safetensors};
pub use tensor::interop;
pub use tensor::Tensor;
