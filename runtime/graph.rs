//! `Graph`, the counterpart of `torch.cuda.CUDAGraph`: capture a stream's work once, replay it.

use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::backend::Recorded;
pub use crate::backend::{CaptureMode, GraphNode, NodeKind};
use crate::error::{GraphError, Invalidation};
use crate::pool::{MemRange, ReplayTicket};
use crate::{Device, Error, GraphPool, Result};

/// Ids of graphs and of capture sets, from one counter so they never meet.
static NEXT_GRAPH_ID: AtomicU64 = AtomicU64::new(1);

/// Graphs that track among themselves which handed-out buffers their replays overwrite: the
/// graphs of one `make_graphed` call, through their clobber lists. Between sets, the pool
/// does it (`GraphPool::register_capture`). A graph that joins none is a set of its own.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct CaptureSet(u64);

impl CaptureSet {
    pub(crate) fn new() -> CaptureSet {
        CaptureSet(NEXT_GRAPH_ID.fetch_add(1, Ordering::Relaxed))
    }
}

/// A captured graph of device work.
///
/// Capture with [`Graph::capture`] (scoped: the capture always ends, on error and on panic,
/// and leaves the stream usable) or with [`Graph::capture_begin`]/[`Graph::capture_end`];
/// replay with [`Graph::replay`]. Memory allocated during capture comes from the graph's pool,
/// which several graphs may share ([`Graph::with_pool`]); graphs sharing a pool must replay in
/// capture order, and a divergence is an [`Error::ReplayOrder`]. A tensor a capture allocates
/// and hands back (an output) is written by each replay; where it lies in memory an earlier
/// graph of the pool writes, its handles are stale from that graph's replay until this one's
/// (see [`GraphPool`]).
///
/// ```
/// use graphed::{ops, CaptureMode, Device, Graph, Tensor};
/// let dev = Device::host();
/// let x = Tensor::from_slice(&dev, &[1.0, 2.0], &[2])?;
/// let y = Tensor::zeros(&dev, &[2])?;
/// let mut g = Graph::new(&dev);
/// g.capture(CaptureMode::Global, || ops::axpy_(&y, 2.0, &x))?;
/// assert_eq!(y.to_vec()?, vec![0.0, 0.0]); // capturing records, it does not run
/// g.replay()?;
/// g.replay()?;
/// assert_eq!(y.to_vec()?, vec![4.0, 8.0]);
/// # Ok::<(), graphed::Error>(())
/// ```
pub struct Graph {
    id: u64,
    label: String,
    device: Device,
    pool: GraphPool,
    keep_graph: bool,
    captured: Option<Recorded>,
    capturing: bool,
    /// Its capture set: its own id unless it joined one ([`Graph::join`]).
    set: u64,
    /// The pool memory its capture allocated, which each replay writes.
    writes: Vec<MemRange>,
}

impl std::fmt::Debug for Graph {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Graph({} on {}, pool {})", self.label, self.device.name(), self.pool.id())
    }
}

impl Graph {
    /// An empty graph with a private pool.
    pub fn new(device: &Device) -> Graph {
        Graph::with_pool(device, &device.new_pool())
    }

    /// An empty graph that allocates from `pool` (shared with other graphs).
    pub fn with_pool(device: &Device, pool: &GraphPool) -> Graph {
        let id = NEXT_GRAPH_ID.fetch_add(1, Ordering::Relaxed);
        Graph {
            id,
            label: format!("graph#{id}"),
            device: device.clone(),
            pool: pool.clone(),
            keep_graph: false,
            captured: None,
            capturing: false,
            set: id,
            writes: Vec::new(),
        }
    }

    /// Makes this graph one of `set`, before it captures: the pool leaves the handles among
    /// the set's graphs to the set (see [`CaptureSet`]).
    pub(crate) fn join(&mut self, set: CaptureSet) {
        self.set = set.0;
    }

    /// The pool memory the capture allocated (temporaries included), which each replay
    /// writes; empty until captured.
    pub(crate) fn writes(&self) -> &[MemRange] {
        &self.writes
    }

    /// Names the graph in messages and dumps.
    pub fn set_label(&mut self, label: impl Into<String>) {
        self.label = label.into();
    }

    /// The graph's label.
    pub fn label(&self) -> &str {
        &self.label
    }

    /// Keep the captured graph un-instantiated until [`Graph::instantiate`] (or the first
    /// replay), like PyTorch's `keep_graph=True`: nodes can be inspected first.
    pub fn set_keep_graph(&mut self, keep: bool) {
        self.keep_graph = keep;
    }

    /// The pool the graph allocates from.
    pub fn pool(&self) -> &GraphPool {
        &self.pool
    }

    /// The device.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// Whether a capture has completed (and not been reset).
    pub fn is_captured(&self) -> bool {
        self.captured.is_some()
    }

    /// Starts capturing the device's stream. Allocations go to the graph's pool until
    /// [`Graph::capture_end`]. Refused, with nothing changed, when this graph is capturing or
    /// holds a capture already.
    pub fn capture_begin(&mut self, mode: CaptureMode) -> Result<()> {
        self.begin(mode, false)
    }

    /// [`Graph::capture_begin`]; `retried` when [`Graph::capture`] runs the capture again after
    /// the pool grows.
    fn begin(&mut self, mode: CaptureMode, retried: bool) -> Result<()> {
        if self.capturing {
            return Err(Error::AlreadyCapturing { graph: self.label.clone() });
        }
        if self.is_captured() {
            return Err(Error::AlreadyCaptured { graph: self.label.clone() });
        }
        // Work queued before the capture must not be captured and must be done before the
        // capture can reuse memory.
        self.device.synchronize()?;
        self.device.backend().begin_capture(mode)?;
        self.device.push_pool(&self.pool);
        self.pool.begin_tracking(retried);
        self.capturing = true;
        Ok(())
    }

    /// Ends the capture. On error (the capture was invalidated) the graph stays empty and the
    /// stream is usable again.
    pub fn capture_end(&mut self) -> Result<()> {
        if !self.capturing {
            return Err(Error::NotCapturing { graph: self.label.clone() });
        }
        if self.device.backend().in_conditional_body() {
            return Err(Error::IllegalInConditionalBody { op: "Graph::capture_end" });
        }
        self.capturing = false;
        self.device.pop_pool();
        let tracked = self.pool.end_tracking();
        let mut recorded = self.device.backend().end_capture()?;
        if !self.keep_graph {
            recorded.instantiate(self.device.backend())?;
        }
        self.captured = Some(recorded);
        self.writes = self.pool.register_capture(self.id, &self.label, self.set, tracked);
        Ok(())
    }

    /// Captures what `f` queues on the device. The capture always ends: when `f` fails or
    /// panics, the partial graph is discarded, the stream is usable, and the error (or panic)
    /// is passed on. When the pool must grow during a global or thread-local capture, the
    /// capture is discarded, the pool grows outside it, and `f` runs again (so `f` must be
    /// safe to run more than once; it only queues work). The first retries grow the pool by
    /// the allocation that failed; from the ninth on, by at least a quarter of what it holds,
    /// so a capture with many allocations into a cold pool needs few retries.
    pub fn capture<R>(&mut self, mode: CaptureMode, mut f: impl FnMut() -> Result<R>) -> Result<R> {
        const ATTEMPTS: usize = 64;
        for attempt in 0..ATTEMPTS {
            self.begin(mode, true)?;
            let outcome = catch_unwind(AssertUnwindSafe(&mut f));
            let ended = self.capture_end();
            match outcome {
                Err(panic) => {
                    let _ = self.reset();
                    resume_unwind(panic);
                }
                Ok(Err(e)) => {
                    // The capture failed; the error that says why matters more than a second
                    // one from draining the stream.
                    let _ = self.reset();
                    if let Error::PoolGrowthDuringCapture { bytes } = e.root() {
                        let floor = if attempt >= 8 { self.pool.stats().reserved / 4 } else { 0 };
                        self.pool.grow_for_retry(*bytes, floor)?;
                        continue;
                    }
                    return Err(e);
                }
                Ok(Ok(v)) => {
                    ended?;
                    return Ok(v);
                }
            }
        }
        Err(Error::CaptureInvalidated {
            cause: Invalidation::PoolKeptGrowing { graph: self.label.clone(), attempts: ATTEMPTS },
        })
    }

    /// Instantiates a graph captured with `keep_graph` (a no-op otherwise).
    pub fn instantiate(&mut self) -> Result<()> {
        match &mut self.captured {
            Some(recorded) => recorded.instantiate(self.device.backend()),
            None => Err(Error::NotCaptured { graph: self.label.clone() }),
        }
    }

    /// Replays the captured work on the device stream. Everything is checked first (this
    /// thread is not capturing, a capture exists, the pool's replay order allows this graph
    /// now); a refused replay changes nothing.
    pub fn replay(&mut self) -> Result<()> {
        let ticket = self.check_replay()?;
        self.launch(ticket).map(|_| ())
    }

    /// The checks of [`Graph::replay`], without side effects: the ticket to launch with.
    pub(crate) fn check_replay(&self) -> Result<ReplayTicket> {
        if self.device.is_capturing() {
            return Err(Error::IllegalDuringCapture { op: "graph replay" });
        }
        if self.captured.is_none() {
            return Err(Error::NotCaptured { graph: self.label.clone() });
        }
        self.pool.check_replay(self.id)
    }

    /// Launches after [`Graph::check_replay`] and advances the pool's replay order; returns
    /// whether this replay restarted the order in the middle of a cycle.
    pub(crate) fn launch(&mut self, ticket: ReplayTicket) -> Result<bool> {
        let recorded = self.captured.as_mut().ok_or_else(|| Error::NotCaptured { graph: self.label.clone() })?;
        recorded.launch(self.device.backend())?;
        Ok(self.pool.advance_replay(ticket))
    }

    /// A graph that runs `parts` in order with one launch (CUDA child-graph nodes; on the host,
    /// their ops in sequence). It is not part of the pool's capture order: the caller checks
    /// and advances that order for the parts it stands for.
    pub(crate) fn fuse(device: &Device, pool: &GraphPool, label: String, parts: &[&Graph]) -> Result<Graph> {
        let mut recorded = Vec::with_capacity(parts.len());
        for part in parts {
            let r = part.captured.as_ref().ok_or_else(|| Error::NotCaptured { graph: part.label.clone() })?;
            if r.holds_conditional(device.backend())? {
                return Err(Error::FuseConditional { graph: part.label.clone() });
            }
            recorded.push(r);
        }
        let fused = Recorded::fuse(device.backend(), &recorded)?;
        let mut graph = Graph::with_pool(device, pool);
        graph.label = label;
        graph.captured = Some(fused);
        Ok(graph)
    }

    /// Launches a fused graph (no pool-order bookkeeping: see [`Graph::fuse`]).
    pub(crate) fn launch_fused(&mut self) -> Result<()> {
        let recorded = self.captured.as_mut().ok_or_else(|| Error::NotCaptured { graph: self.label.clone() })?;
        recorded.launch(self.device.backend())
    }

    /// The captured recording, if any.
    pub(crate) fn recorded(&self) -> Option<&Recorded> {
        self.captured.as_ref()
    }

    /// The graph's id in its pool's capture order.
    pub(crate) fn id(&self) -> u64 {
        self.id
    }

    /// Drops the captured graph (its pool stays); the graph can capture again. The stream is
    /// drained first, so no replay in flight uses memory a new capture may reuse; a device
    /// error on the way is returned, and the graph is reset all the same.
    pub fn reset(&mut self) -> Result<()> {
        let drained = if self.captured.is_some() && !self.capturing { self.device.synchronize() } else { Ok(()) };
        if self.captured.take().is_some() {
            self.pool.unregister_capture(self.id);
        }
        self.writes = Vec::new();
        drained
    }

    /// The nodes: kind, kernel name and dependencies (on the host backend, recorded ops in
    /// order, each depending on the one before).
    pub fn nodes(&self) -> Result<Vec<GraphNode>> {
        match &self.captured {
            Some(recorded) => recorded.nodes(self.device.backend()),
            None => Err(Error::NotCaptured { graph: self.label.clone() }),
        }
    }

    /// The graph in Graphviz DOT: one node per graph node, labelled with kind and kernel.
    pub fn to_dot(&self) -> Result<String> {
        let mut s = format!("digraph \"{}\" {{\n", self.label);
        for n in self.nodes()? {
            let label = match &n.kernel {
                Some(k) => format!("{:?}: {k}", n.kind),
                None => format!("{:?}", n.kind),
            };
            s.push_str(&format!("  n{} [label=\"{}\"];\n", n.index, label.replace('"', "'")));
            for d in &n.dependencies {
                s.push_str(&format!("  n{d} -> n{};\n", n.index));
            }
        }
        s.push_str("}\n");
        Ok(s)
    }

    /// Writes a DOT dump to `path`: CUDA's own verbose dump on a GPU, [`Graph::to_dot`] on the
    /// host backend.
    pub fn debug_dump(&self, path: impl AsRef<std::path::Path>) -> Result<()> {
        let path = path.as_ref();
        let recorded = self.captured.as_ref().ok_or_else(|| Error::NotCaptured { graph: self.label.clone() })?;
        if recorded.debug_dot(self.device.backend(), path)? {
            return Ok(());
        }
        Ok(std::fs::write(path, self.to_dot()?).map_err(|e| GraphError::debug_dump(path, &e))?)
    }
}

impl Drop for Graph {
    fn drop(&mut self) {
        let ended = if self.capturing { self.capture_end() } else { Ok(()) };
        if let Err(e) = ended.and(self.reset()) {
            self.device.backend().drop_errors.report(e.context(format!("dropping graph {}", self.label)));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{ops, CaptureMode, Condition, Tensor};

    /// CUDA refuses a graph with conditional nodes as a child graph, so fusing one is a typed
    /// error on every backend, before anything is built.
    #[test]
    fn a_graph_holding_a_conditional_node_is_not_fused() -> Result<()> {
        let dev = Device::host();
        let (flag, x, one) = (Tensor::zeros(&dev, &[1])?, Tensor::zeros(&dev, &[1])?, Tensor::full(&dev, &[1], 1.0)?);
        let when = Condition::nonzero(&flag)?;
        let mut skips = Graph::new(&dev);
        skips.set_label("skips");
        skips.capture(CaptureMode::Global, || when.run_if(|| ops::axpy_(&x, 1.0, &one)))?;
        let mut plain = Graph::new(&dev);
        plain.capture(CaptureMode::Global, || ops::axpy_(&x, 1.0, &one))?;
        let refused = Graph::fuse(&dev, plain.pool(), "fused".into(), &[&plain, &skips]);
        assert!(matches!(&refused, Err(Error::FuseConditional { graph }) if graph == "skips"), "{refused:?}");
        assert!(Graph::fuse(&dev, plain.pool(), "fused".into(), &[&plain]).is_ok());
        Ok(())
    }

    /// Captures into a new pool a graph that allocates one buffer, freed at the end of the
    /// capture (a temporary) unless `keep`, then a graph that returns a buffer of the same
    /// size, which the pool places in the first one's memory when it was freed. Both graphs
    /// join `set` if given; each is a set of its own otherwise.
    fn lend(set: Option<CaptureSet>, keep: bool) -> Result<(GraphPool, Graph, Graph, Vec<Tensor>)> {
        let dev = Device::host();
        let pool = dev.new_pool();
        let x = Tensor::full(&dev, &[1024], 1.0)?;
        let mut first = Graph::with_pool(&dev, &pool);
        let mut second = Graph::with_pool(&dev, &pool);
        if let Some(set) = set {
            first.join(set);
            second.join(set);
        }
        let kept = first.capture(CaptureMode::Global, || ops::scale(&x, 2.0))?;
        let mut outs = Vec::from_iter(keep.then_some(kept));
        outs.insert(0, second.capture(CaptureMode::Global, || ops::scale(&x, 3.0))?);
        Ok((pool, first, second, outs))
    }

    #[test]
    fn only_a_buffer_in_memory_another_sets_graph_writes_is_tracked_for_replays() -> Result<()> {
        let (pool, mut first, _second, outs) = lend(None, false)?;
        assert!(pool.lends_between_captures(), "two raw graphs: sets of their own");
        first.replay()?;
        assert!(!outs[0].is_fresh());
        // One set: its own clobber lists cover it (graphed modules), the pool adds nothing.
        let (pool, mut first, _second, outs) = lend(Some(CaptureSet::new()), false)?;
        assert!(!pool.lends_between_captures());
        first.replay()?;
        assert!(outs[0].is_fresh());
        // The first graph's buffer is still alive: the second output lies elsewhere.
        let (pool, mut first, _second, outs) = lend(None, true)?;
        assert!(!pool.lends_between_captures());
        first.replay()?;
        assert!(outs.iter().all(Tensor::is_fresh));
        Ok(())
    }
}
