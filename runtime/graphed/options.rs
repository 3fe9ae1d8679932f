//! `GraphOptions`: how `make_graphed` warms up and captures.

use super::{Buckets, OrderEntry};
use crate::{CaptureMode, GraphPool, HookRegistry};

/// How `make_graphed` warms up and captures.
///
/// ```
/// use graphed::GraphOptions;
/// let opts = GraphOptions::new().warmup(2).order(vec![1, 2, -2, -1]);
/// assert_eq!(opts.warmup_iters(), 2);
/// ```
#[derive(Clone, Debug)]
pub struct GraphOptions {
    pub(crate) warmup: usize,
    pub(crate) order: Option<Vec<OrderEntry>>,
    pub(crate) allow_unused_input: bool,
    pub(crate) capture_mode: CaptureMode,
    pub(crate) training: bool,
    pub(crate) chained: bool,
    pub(crate) hooks: HookRegistry,
    pub(crate) pool: Option<GraphPool>,
    pub(crate) pool_limit: Option<usize>,
    pub(crate) reuse_buffers: bool,
    /// 1-indexed chunks whose forward is recomputed inside their backward; `None`: not set.
    pub(crate) checkpoint: Option<Vec<usize>>,
    pub(crate) buckets: Option<Buckets>,
}

impl Default for GraphOptions {
    fn default() -> Self {
        GraphOptions {
            warmup: 3,
            order: None,
            allow_unused_input: false,
            capture_mode: CaptureMode::Global,
            training: true,
            chained: false,
            hooks: HookRegistry::new(),
            pool: None,
            pool_limit: None,
            reuse_buffers: true,
            checkpoint: None,
            buckets: None,
        }
    }
}

impl GraphOptions {
    /// Defaults: 3 warm-up iterations, module order, training, global capture mode.
    pub fn new() -> GraphOptions {
        GraphOptions::default()
    }
    /// Eager warm-up iterations before capture (at least 1).
    pub fn warmup(mut self, n: usize) -> Self {
        self.warmup = n;
        self
    }
    /// The number of warm-up iterations.
    pub fn warmup_iters(&self) -> usize {
        self.warmup
    }
    /// A pipeline schedule: `+c` the forward of chunk `c` (1-indexed) for its next
    /// microbatch, `-c` the backward of its oldest outstanding one, [`OrderEntry::Wgrad`]`(c)`
    /// the weight grads of a chunk that splits its backward (see [`OrderEntry`]). Checked by
    /// `make_graphed` ([`crate::ScheduleError`]).
    pub fn order<E: Into<OrderEntry>>(mut self, order: impl IntoIterator<Item = E>) -> Self {
        self.order = Some(order.into_iter().map(Into::into).collect());
        self
    }
    /// The schedule given with [`GraphOptions::order`], if any.
    pub fn order_entries(&self) -> Option<&[OrderEntry]> {
        self.order.as_deref()
    }
    /// Allow inputs that need a grad to get none from backward.
    pub fn allow_unused_input(mut self, allow: bool) -> Self {
        self.allow_unused_input = allow;
        self
    }
    /// The CUDA capture mode.
    pub fn capture_mode(mut self, mode: CaptureMode) -> Self {
        self.capture_mode = mode;
        self
    }
    /// Capture for inference: forward graphs only, modules in eval mode.
    pub fn inference(mut self) -> Self {
        self.training = false;
        self
    }
    /// Chain the chunks: chunk `c + 1`'s first input *is* chunk `c`'s first output buffer (and
    /// chunk `c`'s grad output is chunk `c + 1`'s grad input), so passing outputs along costs
    /// no copies. Samples for chained inputs are only used for their shape.
    pub fn chained(mut self, chained: bool) -> Self {
        self.chained = chained;
        self
    }
    /// Whether the chunks are chained (see [`GraphOptions::chained`]).
    pub fn is_chained(&self) -> bool {
        self.chained
    }
    /// Activation checkpointing for these chunks (1-indexed, as in `order`): each one's forward
    /// saves only its inputs and the device RNG state, and its backward recomputes the forward
    /// first (captured into the backward graph, with the forward's random numbers reproduced),
    /// exactly as wrapping the module in [`crate::Checkpoint`] does, but the module stays itself
    /// ([`crate::GraphedModules::module`] finds it by its own type). A checkpointed chunk runs
    /// its whole backward at once, so `w(c)` entries for it are refused. Replaces any earlier
    /// list; a `#[graphed]` struct's `checkpoint` field attributes give the default.
    ///
    /// ```
    /// use graphed::GraphOptions;
    /// let opts = GraphOptions::new().checkpoint([2, 4]);
    /// assert_eq!(opts.checkpointed_chunks(), Some(&[2, 4][..]));
    /// assert_eq!(GraphOptions::new().no_checkpoint().checkpointed_chunks(), Some(&[][..]));
    /// ```
    pub fn checkpoint(mut self, chunks: impl IntoIterator<Item = usize>) -> Self {
        self.checkpoint = Some(chunks.into_iter().collect());
        self
    }
    /// No chunk is checkpointed, whatever a `#[graphed]` struct's field attributes say.
    pub fn no_checkpoint(self) -> Self {
        self.checkpoint(std::iter::empty())
    }
    /// The chunks given with [`GraphOptions::checkpoint`] (`None` when never set: no chunk,
    /// or a `#[graphed]` struct's field attributes).
    pub fn checkpointed_chunks(&self) -> Option<&[usize]> {
        self.checkpoint.as_deref()
    }
    /// Shape buckets: capture the modules once per size of one input axis (or per combination
    /// of the sizes of two, [`Buckets::and`]), largest first, into one pool, so that calls of
    /// any size up to the largest replay graphs (see [`Buckets`]). Samples are given at the
    /// largest size. A call is padded up to its
    /// bucket (with [`Buckets::pad`]'s value) and its outputs come back trimmed to its size;
    /// the modules see the real size through [`crate::Cx::bucket_length`].
    ///
    /// ```
    /// use graphed::{Buckets, GraphOptions};
    /// let opts = GraphOptions::new().buckets(Buckets::powers_of_two(1, 128, 4096));
    /// assert_eq!(opts.bucket_spec().map(|b| b.sizes().len()), Some(6));
    /// ```
    pub fn buckets(mut self, buckets: Buckets) -> Self {
        self.buckets = Some(buckets);
        self
    }

    /// The buckets given with [`GraphOptions::buckets`], if any.
    pub fn bucket_spec(&self) -> Option<&Buckets> {
        self.buckets.as_ref()
    }

    /// Capture into an existing pool (PyTorch's `pool=` argument), shared with graphs captured
    /// before: separately built modules then share memory, and all of their graphs must
    /// replay in the order they were captured (a divergence is `Error::ReplayOrder`). By
    /// default each `make_graphed` call gets a new pool.
    ///
    /// This capture's outputs and input grads may then lie in memory an earlier module's
    /// graphs use for temporaries (the pool lends it). Each replay of such a graph overwrites
    /// them, so a handle held across it is stale (`Error::StaleTensor` with
    /// `overwritten_by_another_capture`, never a silent read of the other module's data);
    /// this module's next replay hands out fresh ones. Keep a copy
    /// ([`Tensor::deep_clone`](crate::Tensor::deep_clone)) to read a result after the other
    /// modules' next calls. See [`GraphPool`].
    ///
    /// ```
    /// use graphed::{Device, GraphOptions};
    /// let dev = Device::host();
    /// let pool = dev.new_pool();
    /// let opts = GraphOptions::new().pool(&pool);
    /// # let _ = opts;
    /// ```
    pub fn pool(mut self, pool: &GraphPool) -> Self {
        self.pool = Some(pool.clone());
        self
    }

    /// Caps the bytes the pool `make_graphed` creates may reserve (see
    /// [`GraphPool::with_limit`]): a warm-up or capture that needs more fails with
    /// [`Error::PoolLimit`](crate::Error::PoolLimit), and the modules come back unchanged in
    /// the [`CaptureError`](crate::CaptureError). With [`GraphOptions::pool`], limit that pool
    /// instead (both together are refused).
    ///
    /// ```
    /// use graphed::{make_graphed, ops, Cx, Device, Error, GraphOptions, Module, Result, Tensor};
    /// struct Double;
    /// impl Module for Double {
    ///     fn name(&self) -> &'static str { "Double" }
    ///     fn num_inputs(&self) -> usize { 1 }
    ///     fn forward(&self, _: &mut Cx, x: &[Option<Tensor>]) -> Result<Vec<Option<Tensor>>> {
    ///         let x = x[0].as_ref().expect("one input");
    ///         Ok(vec![Some(ops::add(x, x)?)])
    ///     }
    ///     fn backward(&mut self, _: &mut Cx, g: &[Option<Tensor>]) -> Result<Vec<Option<Tensor>>> {
    ///         Ok(g.to_vec())
    ///     }
    /// }
    /// let dev = Device::host();
    /// let x = Tensor::zeros(&dev, &[1 << 20])?.with_requires_grad(true); // 4 MiB
    /// let opts = GraphOptions::new().pool_limit(1 << 20);
    /// let err = make_graphed(vec![Box::new(Double)], vec![vec![vec![Some(x)]]], opts).unwrap_err();
    /// assert!(matches!(err.error().root(), Error::PoolLimit { limit: 1048576, .. }));
    /// assert_eq!(err.into_inner().len(), 1); // the module comes back
    /// # Ok::<(), graphed::Error>(())
    /// ```
    pub fn pool_limit(mut self, bytes: usize) -> Self {
        self.pool_limit = Some(bytes);
        self
    }

    /// Reuse static surfaces across the microbatches of an `order` (on by default): once
    /// nothing in the schedule reads a microbatch's static inputs, outputs, grad outputs and
    /// grad inputs any more (its backward and its neighbouring chunks' steps for it are
    /// captured), the chunk's next forward takes them, so static memory grows with the
    /// microbatches in flight instead of their total. Microbatches sharing buffers share their
    /// [`GraphedModules::static_inputs`](crate::GraphedModules::static_inputs) too; a replay
    /// that overwrites a shared output or grad input makes the earlier microbatch's handles
    /// stale. Results are bitwise the same either way; off, every microbatch keeps its own.
    ///
    /// Only the neighbouring chunks are assumed to read a microbatch's outputs and input grads
    /// (chunk `c + 1` its output, chunk `c - 1` its input grad). Code that hands an output to a
    /// chunk further on gets `Error::StaleTensor` if it was reused in between, never a wrong
    /// value; turn reuse off for such schedules. A fused step gets per-microbatch buffers of its
    /// own where surfaces are shared (see [`GraphedModules::fuse`](crate::GraphedModules::fuse)).
    ///
    /// ```
    /// use graphed::GraphOptions;
    /// let opts = GraphOptions::new().order(vec![1, -1, 1, -1]).reuse_buffers(false);
    /// # let _ = opts;
    /// ```
    pub fn reuse_buffers(mut self, reuse: bool) -> Self {
        self.reuse_buffers = reuse;
        self
    }

    /// Hooks registered at run time (see [`HookRegistry`]).
    pub fn hooks(mut self, hooks: &HookRegistry) -> Self {
        self.hooks = hooks.clone();
        self
    }
}
