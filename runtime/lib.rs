//! # graphed
//!
//! Capture GPU modules into CUDA graphs, declared through procedural macros: the Rust
//! counterpart of PyTorch's `make_graphed_callables` and Transformer Engine's version of it.
//!
//! Two backends run the same ops with the same graph semantics: `cuda` (cudarc, NVRTC
//! kernels, cuBLAS) and `host` (a real CPU execution that records ops during capture and runs
//! the record on replay). [`Device::default_device`] picks the GPU when one is usable.
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
mod cx;
mod device;
pub mod dist;
mod dtype;
mod error;
mod graph;
mod graphed;
mod hooks;
pub mod interop;
mod kernel;
mod kernel_check;
mod kernel_host;
mod module;
pub mod ops;
pub mod optim;

mod param;
mod params;
mod pool;
mod rng;
mod shape;
mod state_dict;
mod tensor;
mod tensor_half;

pub use backend::is_capturing;
pub use capabilities::{Capabilities, CudaVersion};
pub use checkpoint::Checkpoint;
pub use cx::Cx;
pub use device::Device;
pub use dtype::DType;
pub use error::{CudaFailure, DistError, Error, Result, Slot, SlotKind};
pub use graph::{CaptureMode, Graph, GraphNode, NodeKind};
pub use graphed::{backward_unsplit, make_graphed, CaptureError, GraphOptions, GraphedModules, OrderEntry, Sequence};
pub use graphed_macros::{capture_time_hook, graphed, Parameters};
/// The `half` crate, whose [`half::bf16`] and [`half::f16`] are the host types of
/// [`DType::BF16`] and [`DType::F16`].
pub use half;
pub use hooks::{HookHandle, HookRegistry};
pub use kernel::{Arg, Kernel, KernelArg, LaunchConfig};
pub use kernel_check::{check_kernel_against_host, CheckArg, KernelCheckReport, OutputCheck};
pub use kernel_host::{HostArgs, HostFn};
pub use module::{HookKind, Module, Slots, TypedModule};
pub use param::Param;
pub use params::Parameters;
pub use pool::{GraphPool, PoolStats};
pub use rng::{Generator, RngState};
pub use shape::{Shape, MAX_RANK};
pub use state_dict::{load_safetensors, save_safetensors};
pub use tensor::Tensor;
