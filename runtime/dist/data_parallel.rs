//! `DataParallel`: a module whose backward all-reduces its parameter grads, in buckets, right
//! after computing them, so the all-reduce is captured inside the backward graph.

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex};

use super::{AllReduceCost, Communicator, ReduceOp, COST_SIZES};
use crate::{Cx, DistError, Module, Param, Result, Tensor};

/// Default bucket size: DDP's 25 MB.
pub const DEFAULT_BUCKET_BYTES: usize = 25 << 20;

/// The fraction of the bandwidth [`measured_bucket_bytes`] asks of a bucket's
/// all-reduce: the fixed cost is at most a fifth of its time.
pub const BUCKET_EFFICIENCY: f64 = 0.8;

/// A bucket size for `comm`'s group from its measured all-reduce cost: all-reduces of
/// [`COST_SIZES`] timed on `comm` and fitted as latency plus bandwidth
/// ([`AllReduceCost::measure`]), then the smallest bucket that reaches [`BUCKET_EFFICIENCY`]
/// of the bandwidth ([`AllReduceCost::bucket_bytes`]). Every rank gets the same size (the
/// times are averaged over the ranks first): pass it to [`DataParallel::with_params`],
/// [`DataParallel::chunks`] or [`DataParallel::chunks_overlapped`]. Every rank must call it at
/// the same point, before capturing.
///
/// ```
/// use graphed::dist;
/// let sizes = dist::run_emulated(2, |comm| dist::measured_bucket_bytes(&comm))?;
/// assert_eq!(sizes[0], sizes[1]);
/// # Ok::<(), graphed::Error>(())
/// ```
pub fn measured_bucket_bytes(comm: &Communicator) -> Result<usize> {
    AllReduceCost::measure(comm, &COST_SIZES, 5)?.bucket_bytes(BUCKET_EFFICIENCY)
}

/// Wraps a module for data parallelism: every rank holds the same parameters and runs its own
/// batch; after the module's backward, the grads are all-reduced over the ranks (summed, or
/// averaged) in buckets of about `bucket_bytes`, later parameters first (the order backward
/// produces them), each bucket one fused collective.
///
/// The wrapper is itself a [`Module`], so `make_graphed` captures the all-reduce inside the
/// backward graph, and its eager warm-up iterations run the collectives first (NCCL connects
/// lazily; the first call must not happen inside a capture). With one chunk per layer, each
/// layer's all-reduce is issued right after its backward, before the earlier layers' backward.
///
/// The reduction replaces each grad by the reduced *accumulated* grad, so zero the grads
/// every step (as every optimizer loop here does). Construction checks that every rank wraps
/// the same parameter layout (names and shapes), with a typed error on every rank otherwise.
///
/// ```
/// use graphed::dist::{self, DataParallel, ReduceOp};
/// use graphed::{Cx, Module, Param, Parameters, Result, Tensor, ops};
///
/// #[derive(Parameters)]
/// struct Scale { w: Param }
/// impl Module for Scale {
///     fn name(&self) -> &'static str { "scale" }
///     fn num_inputs(&self) -> usize { 1 }
///     fn forward(&self, cx: &mut Cx, x: &[Option<Tensor>]) -> Result<Vec<Option<Tensor>>> {
///         let x = x[0].clone().expect("input");
///         cx.save(&x);
///         Ok(vec![Some(ops::mul(&x, &self.w.value)?)])
///     }
///     fn backward(&mut self, cx: &mut Cx, dy: &[Option<Tensor>]) -> Result<Vec<Option<Tensor>>> {
///         let (x, dy) = (cx.saved(0)?, dy[0].clone().expect("grad"));
///         ops::axpy_(&self.w.grad, 1.0, &ops::mul(&x, &dy)?)?;
///         Ok(vec![None])
///     }
///     fn visit_params(&self, f: &mut dyn FnMut(&str, &Param)) { Parameters::visit_params(self, "", f) }
///     fn exposes_params(&self) -> bool { true }
/// }
///
/// let grads = dist::run_emulated(2, |comm| {
///     let dev = comm.device().clone();
///     let w = Param::new(Tensor::full(&dev, &[2], 1.0)?)?;
///     let mut dp = DataParallel::new(Scale { w: w.clone() }, comm.clone(), ReduceOp::Sum)?;
///     let x = Tensor::full(&dev, &[2], comm.rank() as f32 + 1.0)?;
///     let mut cx = Cx::new(&dev);
///     dp.forward(&mut cx, &[Some(x)])?;
///     dp.backward(&mut cx, &[Some(Tensor::full(&dev, &[2], 1.0)?)])?;
///     w.grad.to_vec()
/// })?;
/// assert_eq!(grads[0], vec![3.0, 3.0]); // 1 + 2, on every rank
/// assert_eq!(grads[1], grads[0]);
/// # Ok::<(), graphed::Error>(())
/// ```
pub struct DataParallel<M: Module> {
    inner: M,
    comm: Communicator,
    op: ReduceOp,
    /// Grads to reduce, bucket by bucket, in the order they are reduced.
    buckets: Vec<Vec<Tensor>>,
    /// Set when the module is one chunk of a group sharing its buckets ([`DataParallel::chunks`]).
    group: Option<Group>,
}

/// Grads of a group's chunks that backward produced and no collective reduced yet.
#[derive(Default)]
struct Pending {
    grads: Vec<Tensor>,
    bytes: usize,
    /// Full buckets waiting for the next chunk's backward to reduce them (overlap mode).
    ready: Vec<Vec<Tensor>>,
}

impl Pending {
    fn holds(&self, t: &Tensor) -> bool {
        self.grads.iter().chain(self.ready.iter().flatten()).any(|q| q.same_buffer(t))
    }
}

struct Group {
    pending: Arc<Mutex<Pending>>,
    bucket_bytes: usize,
    /// The first chunk: the last backward of an iteration, which flushes what is left.
    last: bool,
    /// Reduce full buckets on a side stream during the next chunk's backward.
    overlap: bool,
}

impl<M: Module> std::fmt::Debug for DataParallel<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let sizes: Vec<usize> = self.buckets.iter().map(Vec::len).collect();
        write!(f, "DataParallel({}, {:?}, buckets of {sizes:?} grads, {:?})", self.inner.name(), self.op, self.comm)
    }
}

impl<M: Module> DataParallel<M> {
    /// Wraps `inner`, whose parameters come from [`Module::visit_params`] (derive
    /// [`crate::Parameters`] and let `#[graphed]` forward it), with buckets of the default
    /// size.
    pub fn new(inner: M, comm: Communicator, op: ReduceOp) -> Result<DataParallel<M>> {
        if !inner.exposes_params() {
            return Err(DistError::ParamsNotExposed { module: inner.name().into() }.into());
        }
        let mut params = Vec::new();
        inner.visit_params(&mut |name, p| params.push((name.to_string(), p.clone())));
        DataParallel::with_params(inner, params, comm, op, DEFAULT_BUCKET_BYTES)
    }

    /// Wraps `inner` with its parameters given by name, and buckets of `bucket_bytes`.
    pub fn with_params(
        inner: M,
        params: Vec<(String, Param)>,
        comm: Communicator,
        op: ReduceOp,
        bucket_bytes: usize,
    ) -> Result<DataParallel<M>> {
        for (name, p) in &params {
            if p.grad.device() != comm.device() {
                let (device, communicator) = (p.grad.device().name(), comm.device().name());
                return Err(
                    DistError::Device { op: "DataParallel", param: Some(name.clone()), device, communicator }.into()
                );
            }
        }
        let mut hasher = DefaultHasher::new();
        for (name, p) in &params {
            (name, p.value.dims(), p.requires_grad()).hash(&mut hasher);
        }
        bucket_bytes.hash(&mut hasher);
        comm.check_same("data-parallel parameter layouts", hasher.finish())?;
        let buckets =
            buckets(params.iter().filter(|(_, p)| p.requires_grad()).rev().map(|(_, p)| &p.grad), bucket_bytes);
        Ok(DataParallel { inner, comm, op, buckets, group: None })
    }

    /// Wraps the chunks of one model (a layer each, say) so that they share buckets: each
    /// chunk's backward adds its grads to the group's pending bucket and reduces it once it
    /// holds `bucket_bytes`, and the first chunk (the last backward) reduces what is left. A
    /// few large collectives instead of one per layer, each captured in the backward graph of
    /// the chunk that fills it. For `make_graphed` in module order (one backward per chunk per
    /// step, last chunk first); a chunk whose backward runs twice before the group's flush is
    /// an error.
    ///
    /// ```
    /// use graphed::dist::{self, DataParallel, ReduceOp};
    /// use graphed::{Device, Param, Tensor};
    /// # struct Id;
    /// # impl graphed::Module for Id {
    /// #     fn name(&self) -> &'static str { "id" }
    /// #     fn num_inputs(&self) -> usize { 1 }
    /// #     fn forward(&self, _: &mut graphed::Cx, x: &[Option<Tensor>]) -> graphed::Result<Vec<Option<Tensor>>> { Ok(x.to_vec()) }
    /// #     fn backward(&mut self, _: &mut graphed::Cx, g: &[Option<Tensor>]) -> graphed::Result<Vec<Option<Tensor>>> { Ok(g.to_vec()) }
    /// # }
    /// dist::run_emulated(2, |comm| {
    ///     let p = |v| Param::new(Tensor::full(comm.device(), &[4], v)?);
    ///     let chunks = vec![(Id, vec![("w".to_string(), p(1.0)?)]), (Id, vec![("w".to_string(), p(2.0)?)])];
    ///     let layers = DataParallel::chunks(chunks, comm.clone(), ReduceOp::Sum, 1 << 20)?;
    ///     assert_eq!(layers.len(), 2);
    ///     Ok(())
    /// })?;
    /// # Ok::<(), graphed::Error>(())
    /// ```
    pub fn chunks(
        chunks: Vec<(M, Vec<(String, Param)>)>,
        comm: Communicator,
        op: ReduceOp,
        bucket_bytes: usize,
    ) -> Result<Vec<DataParallel<M>>> {
        DataParallel::group(chunks, comm, op, bucket_bytes, false)
    }

    /// Like [`DataParallel::chunks`], but a bucket that a chunk's backward fills is reduced
    /// during the *next* chunk's backward, on a second stream forked from the device stream
    /// and joined back at the end of that chunk (both inside its captured backward graph), so
    /// the all-reduce of later layers overlaps the backward of earlier ones. Buckets close at
    /// chunk boundaries (a bucket of 1 byte is one bucket per chunk); the first chunk reduces
    /// what is left after its own backward. On emulated ranks the reduction simply runs before
    /// the next chunk's backward, with the same results.
    pub fn chunks_overlapped(
        chunks: Vec<(M, Vec<(String, Param)>)>,
        comm: Communicator,
        op: ReduceOp,
        bucket_bytes: usize,
    ) -> Result<Vec<DataParallel<M>>> {
        DataParallel::group(chunks, comm, op, bucket_bytes, true)
    }

    fn group(
        chunks: Vec<(M, Vec<(String, Param)>)>,
        comm: Communicator,
        op: ReduceOp,
        bucket_bytes: usize,
        overlap: bool,
    ) -> Result<Vec<DataParallel<M>>> {
        let pending = Arc::new(Mutex::new(Pending::default()));
        let mut out = Vec::with_capacity(chunks.len());
        for (i, (inner, params)) in chunks.into_iter().enumerate() {
            let mut dp = DataParallel::with_params(inner, params, comm.clone(), op, bucket_bytes)?;
            dp.group = Some(Group { pending: pending.clone(), bucket_bytes, last: i == 0, overlap });
            out.push(dp);
        }
        Ok(out)
    }

    /// Refuses a backward of a chunk whose grads still wait in the group.
    fn check_not_pending(&self, p: &Pending) -> Result<()> {
        if self.buckets.iter().flatten().any(|t| p.holds(t)) {
            return Err(DistError::BackwardTwice { module: self.inner.name().into() }.into());
        }
        Ok(())
    }

    /// Overlap mode: reduces the buckets earlier chunks filled on the side stream while this
    /// chunk's backward runs, then queues this chunk's grads (the first chunk reduces the rest).
    fn overlapped_backward(
        &mut self,
        g: &Group,
        cx: &mut Cx,
        grad_outputs: &[Option<Tensor>],
    ) -> Result<Vec<Option<Tensor>>> {
        let ready = {
            let p = g.pending.lock().unwrap_or_else(|e| e.into_inner());
            self.check_not_pending(&p)?;
            drop(p);
            std::mem::take(&mut g.pending.lock().unwrap_or_else(|e| e.into_inner()).ready)
        };
        let forked = !ready.is_empty();
        let side = if forked {
            self.comm.on_side_stream(|| ready.iter().try_for_each(|b| self.comm.all_reduce_bucket(b, self.op)))
        } else {
            Ok(())
        };
        let grads = side.and_then(|()| self.inner.backward(cx, grad_outputs));
        // Joined whatever happened, so a capture never ends with the side stream forked.
        let joined = if forked { self.comm.join_side_stream() } else { Ok(()) };
        let grads = grads?;
        joined?;
        let mut p = g.pending.lock().unwrap_or_else(|e| e.into_inner());
        for t in self.buckets.iter().flatten() {
            p.bytes += t.numel() * t.dtype().size();
            p.grads.push(t.clone());
        }
        if p.bytes >= g.bucket_bytes {
            let full = std::mem::take(&mut p.grads);
            p.bytes = 0;
            p.ready.push(full);
        }
        if g.last {
            let mut rest = std::mem::take(&mut p.ready);
            rest.push(std::mem::take(&mut p.grads));
            p.bytes = 0;
            rest.iter().filter(|b| !b.is_empty()).try_for_each(|b| self.comm.all_reduce_bucket(b, self.op))?;
        }
        Ok(grads)
    }

    /// After this chunk's backward: reduce its own buckets, or feed the group's (the caller
    /// checked, before the backward, that none of them is queued already).
    fn reduce_after_backward(&self) -> Result<()> {
        let Some(g) = &self.group else { return self.reduce_grads() };
        let mut p = g.pending.lock().unwrap_or_else(|e| e.into_inner());
        for t in self.buckets.iter().flatten() {
            p.bytes += t.numel() * t.dtype().size();
            p.grads.push(t.clone());
            if p.bytes >= g.bucket_bytes {
                let grads = std::mem::take(&mut p.grads);
                p.bytes = 0;
                self.comm.all_reduce_bucket(&grads, self.op)?;
            }
        }
        if g.last && !p.grads.is_empty() {
            let grads = std::mem::take(&mut p.grads);
            p.bytes = 0;
            self.comm.all_reduce_bucket(&grads, self.op)?;
        }
        Ok(())
    }

    /// The wrapped module.
    pub fn inner(&self) -> &M {
        &self.inner
    }

    /// The wrapped module, mutably.
    pub fn inner_mut(&mut self) -> &mut M {
        &mut self.inner
    }

    /// The communicator.
    pub fn communicator(&self) -> &Communicator {
        &self.comm
    }

    /// Number of buckets (collectives per backward).
    pub fn num_buckets(&self) -> usize {
        self.buckets.len()
    }

    /// Unwraps the module.
    pub fn into_inner(self) -> M {
        self.inner
    }

    /// All-reduces the grads now (issued on the stream, so captured when capturing).
    pub fn reduce_grads(&self) -> Result<()> {
        self.buckets.iter().try_for_each(|b| self.comm.all_reduce_bucket(b, self.op))
    }
}

/// Groups `grads` in order into buckets of at least `bucket_bytes` (the last one smaller).
fn buckets<'a>(grads: impl Iterator<Item = &'a Tensor>, bucket_bytes: usize) -> Vec<Vec<Tensor>> {
    let mut out: Vec<Vec<Tensor>> = Vec::new();
    let mut bytes = 0;
    for g in grads {
        if out.is_empty() || bytes >= bucket_bytes {
            out.push(Vec::new());
            bytes = 0;
        }
        bytes += g.numel() * g.dtype().size();
        out.last_mut().expect("pushed above").push(g.clone());
    }
    out
}

impl<M: Module> Module for DataParallel<M> {
    fn forward(&self, cx: &mut Cx, inputs: &[Option<Tensor>]) -> Result<Vec<Option<Tensor>>> {
        self.inner.forward(cx, inputs)
    }

    fn backward(&mut self, cx: &mut Cx, grad_outputs: &[Option<Tensor>]) -> Result<Vec<Option<Tensor>>> {
        if let Some(g) = self.group.take_if(|g| g.overlap) {
            let r = self.overlapped_backward(&g, cx, grad_outputs);
            self.group = Some(g);
            return r;
        }
        // A chunk whose grads wait in the group's queue is refused before its backward adds
        // to them again.
        if let Some(g) = &self.group {
            self.check_not_pending(&g.pending.lock().unwrap_or_else(|e| e.into_inner()))?;
        }
        let grads = self.inner.backward(cx, grad_outputs)?;
        self.reduce_after_backward()?;
        Ok(grads)
    }

    crate::module::forward_to_inner!(inner);

    fn collectives(&self) -> Option<super::Collectives> {
        Some(super::Collectives::new(self.comm.clone()))
    }
}
