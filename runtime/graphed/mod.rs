//! `make_graphed`: warm up, capture and replay modules, the counterpart of PyTorch's
//! `make_graphed_callables` and Transformer Engine's extension of it.
//!
//! - `options`: `GraphOptions` (its `order` of `OrderEntry`s is defined below the modules,
//!   in `order_entry.rs`).
//! - `schedule`: the iteration's steps and the rules a schedule follows, validated once.
//! - `capture`: `make_graphed` itself: validation, static surfaces, warm-up, capture; a failed
//!   capture restores the RNG, frees its pool and hands the modules back.
//! - `agree`: before any of that, ranks that capture together compare their schedules.
//! - `surface`, `clobbers`: what a capture makes of each (chunk, microbatch): its static
//!   buffers and its passes (forward, backward, weight grads), each a graph with the memory
//!   it writes and the handed-out buffers that writing makes stale.
//! - `cursor`: where an iteration stands, the one owner of replay order and of the
//!   microbatches waiting for their backward or weight grads.
//! - `replay`, `wgrad`: graphed forward, backward and weight-grad calls, each checked
//!   completely before it copies, queues or launches anything.
//! - `chain`: one microbatch through every chunk of a chained capture in one call (forward,
//!   backward, the fused step on per-microbatch inputs).
//! - `fused`: the whole schedule as one launch (`fuse`, `step`) on bound static buffers;
//!   `staging`: its own per-microbatch buffers where microbatches share surfaces;
//!   `sequence`: separately graphed modules fused into one launch (`Sequence`).
//! - `reuse`: which microbatches share static surfaces (`GraphOptions::reuse_buffers`).
//! - `buckets`: shape buckets, one capture per size of a declared axis in one pool;
//!   `estimate`: the pool a bucket list will need, from its smallest buckets.

mod agree;
mod buckets;
mod capture;
mod capture_error;
mod chain;
mod clobbers;
mod cursor;
mod estimate;
mod fused;
mod options;
mod replay;
mod reuse;
mod schedule;
mod sequence;
mod staging;
mod surface;
mod wgrad;

use std::time::Duration;

use crate::{Cx, Device, Error, Graph, GraphPool, HookKind, Module, Result, Tensor};

pub use crate::order_entry::OrderEntry;
pub use buckets::{AboveLargest, BucketReport, Buckets};
pub use capture::{make_graphed, CaptureError};
pub use estimate::{estimate_pool, PoolEstimate, PoolProbe};
pub use options::GraphOptions;
pub(crate) use schedule::Schedule;
pub use sequence::Sequence;

use cursor::Cursor;
use schedule::Pass;
use surface::Surface;

/// Modules captured into graphs that share one pool; see [`make_graphed`].
pub struct GraphedModules {
    device: Device,
    modules: Vec<Box<dyn Module>>,
    pool: GraphPool,
    /// `[chunk][microbatch]`: static buffers and captured passes.
    surfaces: Vec<Vec<Surface>>,
    /// Where the iteration stands: replay order and the microbatches waiting.
    cursor: Cursor,
    /// The mode the graphs were captured in (dropout on or off).
    captured_training: bool,
    /// Whether backward graphs were captured: false for inference, and for training-mode
    /// captures where neither an input nor a parameter needs a grad.
    has_backward: bool,
    training: bool,
    /// What the capture was made with and of, boxed so `GraphedModules` stays small.
    config: Box<Config>,
    /// The last chunk's inputs of a whole-chain forward, kept to be reused (see `chain`).
    chain_slots: Vec<Option<Tensor>>,
    /// Where a whole-chain backward that failed partway resumes (see `chain`).
    chain_resume: Option<Box<chain::Resume>>,
    /// With shape buckets: the parked buckets and the lookup table (see `buckets`).
    buckets: Option<Box<buckets::BucketSet>>,
}

/// The settled facts of a capture.
struct Config {
    options: GraphOptions,
    chunks: usize,
    capture_time: Duration,
    /// The iteration the graphs were captured for.
    schedule: Schedule,
    /// The one-launch step, once built (see `fused`).
    fused: Option<fused::Fused>,
    /// Which microbatches share static surfaces (see `reuse`).
    plan: reuse::SlotPlan,
    /// The fused step's per-microbatch buffers, built with it when surfaces are shared.
    staging: Option<staging::Staging>,
    /// Per chunk: whether its forward is recomputed inside its backward
    /// (`GraphOptions::checkpoint`).
    checkpointed: Vec<bool>,
    /// Whether the schedule runs each microbatch through all chunks back to back, forwards
    /// and backwards (the whole-chain calls of `chain` need it).
    whole_chains: bool,
}

impl Config {
    fn new(options: GraphOptions, schedule: Schedule, plan: reuse::SlotPlan, checkpointed: Vec<bool>) -> Config {
        let whole_chains = schedule.runs_whole_chains();
        Config {
            options,
            chunks: checkpointed.len(),
            capture_time: Duration::ZERO,
            schedule,
            fused: None,
            plan,
            staging: None,
            checkpointed,
            whole_chains,
        }
    }

    /// Runs the hooks of `kind` for `chunk`: the registry's around the module's own.
    fn run_hooks(&self, modules: &mut [Box<dyn Module>], chunk: usize, kind: HookKind) -> Result<()> {
        let module = &mut modules[chunk];
        let name = module.name();
        self.options.hooks.run(chunk, kind, || module.run_hooks(kind)).map_err(|e| Error::Hook {
            module: name.into(),
            kind: kind.name(),
            source: Box::new(e),
        })
    }

    /// Whether input `i` of `chunk` is chained: the previous chunk's first output, no buffer
    /// of its own.
    fn is_chained_input(&self, chunk: usize, i: usize) -> bool {
        self.options.chained && chunk > 0 && i == 0
    }

    /// Whether grad output `i` of `chunk` is chained: the next chunk's first grad input.
    fn is_chained_grad_output(&self, chunk: usize, i: usize) -> bool {
        self.options.chained && i == 0 && chunk + 1 < self.chunks
    }
}

/// A fresh context for one forward on `inputs`.
fn new_cx(device: &Device, training: bool, inputs: &[Option<Tensor>]) -> Cx {
    let mut cx = Cx::new(device);
    cx.set_training(training);
    cx.set_needs_input_grad(inputs.iter().map(|t| t.as_ref().is_some_and(|t| t.requires_grad())).collect());
    cx
}

impl std::fmt::Debug for GraphedModules {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<_> = self.modules.iter().map(|m| m.name()).collect();
        write!(f, "GraphedModules({names:?}, {} microbatches, {:?})", self.microbatches(), self.pool)
    }
}

impl GraphedModules {
    /// Switches to training mode (graphs captured for training replay; otherwise eager).
    pub fn train(&mut self) {
        self.training = true;
    }

    /// Switches to eval mode (graphs captured for inference replay; otherwise eager).
    pub fn eval(&mut self) {
        self.training = false;
    }

    /// Whether in training mode.
    pub fn is_training(&self) -> bool {
        self.training
    }

    /// Whether backward graphs were captured (false for a forward-only capture: inference, or
    /// nothing needed a grad).
    pub fn has_backward(&self) -> bool {
        self.has_backward
    }

    /// The module of `chunk`, if it is a `T`.
    pub fn module<T: Module>(&self, chunk: usize) -> Option<&T> {
        let m: &dyn std::any::Any = self.modules.get(chunk)?.as_ref();
        m.downcast_ref::<T>()
    }

    /// The module of `chunk`, mutably, if it is a `T`.
    pub fn module_mut<T: Module>(&mut self, chunk: usize) -> Option<&mut T> {
        let m: &mut dyn std::any::Any = self.modules.get_mut(chunk)?.as_mut();
        m.downcast_mut::<T>()
    }

    /// Whether `chunk` (0-indexed) recomputes its forward inside its backward
    /// (`GraphOptions::checkpoint`, or a `#[graphed]` struct's checkpointed fields).
    pub fn is_checkpointed(&self, chunk: usize) -> bool {
        self.config.checkpointed.get(chunk).copied().unwrap_or(false)
    }

    /// The pool all graphs share.
    pub fn pool(&self) -> &GraphPool {
        &self.pool
    }

    /// Registers a capture-time hook for `chunk` (it runs on eager calls from now on; it ran
    /// during capture only if registered through [`GraphOptions::hooks`] before).
    pub fn register_hook(
        &self,
        chunk: usize,
        kind: HookKind,
        prepend: bool,
        f: impl FnMut() -> Result<()> + Send + 'static,
    ) -> crate::HookHandle {
        self.config.options.hooks.register(chunk, kind, prepend, f)
    }

    /// A handle to the static input `index` of (`chunk`, `microbatch`): passing it to
    /// [`GraphedModules::forward`] copies nothing in, so a graph that fills it itself (a
    /// pipeline stage receiving from another GPU) reads what it received.
    pub fn static_input(&self, chunk: usize, microbatch: usize, index: usize) -> Option<Tensor> {
        let s = self.surfaces.get(chunk)?.get(microbatch)?;
        s.inputs.get(index)?.as_ref().map(Tensor::refreshed)
    }

    /// Wall time of warm-up plus capture.
    pub fn capture_time(&self) -> Duration {
        self.config.capture_time
    }

    /// Microbatches per chunk.
    pub fn microbatches(&self) -> usize {
        self.surfaces.first().map_or(0, Vec::len)
    }

    /// Number of chunks (modules).
    pub fn chunks(&self) -> usize {
        self.modules.len()
    }

    /// The device.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// The graphs: (label, graph), forward and backward per (chunk, microbatch) in capture
    /// order, then the weight-grad graphs.
    pub fn graphs(&self) -> Vec<(&str, &Graph)> {
        let surfaces = || self.surfaces.iter().flatten();
        let forward_and_backward =
            surfaces().flat_map(|s| std::iter::once(&s.passes.forward).chain(&s.passes.backward));
        let wgrad = surfaces().filter_map(|s| s.passes.wgrad.as_ref());
        forward_and_backward.chain(wgrad).map(|p| (p.graph.label(), &p.graph)).collect()
    }

    /// Gives the modules back, dropping the graphs and their pool.
    pub fn into_modules(self) -> Vec<Box<dyn Module>> {
        self.modules
    }

    /// Bytes that must stay live, for comparing with the pool's reserved bytes: the static
    /// surfaces, plus the saved activations of the microbatches in flight at the schedule's
    /// busiest point (a microbatch's saved activations live from its forward to its backward).
    pub fn live_bytes(&self) -> usize {
        let mut seen: Vec<Tensor> = Vec::new();
        for s in self.surfaces.iter().flatten() {
            for t in s.inputs.iter().chain(&s.outputs).chain(&s.grad_outputs).chain(&s.grad_inputs).flatten() {
                let (pid, _) = t.mem_range();
                if pid == self.pool.id() && !seen.iter().any(|x| x.same_buffer(t)) {
                    seen.push(t.clone());
                }
            }
        }
        let statics: usize = seen.iter().map(|t| t.mem_range().1.bytes).sum();
        let (mut in_flight, mut peak) = (0usize, 0usize);
        for step in self.config.schedule.steps() {
            let saved = self.surfaces[step.chunk][step.microbatch].saved_bytes;
            // Saved activations of a chunk with deferred weight grads live until those run.
            let last = if self.config.schedule.defers(step.chunk) { Pass::Wgrad } else { Pass::Backward };
            match step.pass {
                Pass::Forward => in_flight += saved,
                pass if pass == last => in_flight = in_flight.saturating_sub(saved),
                _ => {}
            }
            peak = peak.max(in_flight);
        }
        statics + peak
    }
}
