//! Pipeline parallelism across ranks: chunk `c` of an `order` schedule runs on rank
//! `(c - 1) % world`, and activations and grads travel by send/recv straight into the next
//! stage's buffers, inside the captured graphs.
//!
//! - `plan`: where each rank's transfers go (which sends wait to go out in one group with the
//!   next receive), decided and checked for the whole order before anything runs.
//! - `schedule`: [`PipelineSchedule`], 1F1B and interleaved 1F1B orders, with split backwards.

mod plan;
mod schedule;

use std::collections::hash_map::DefaultHasher;
use std::collections::VecDeque;
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex, MutexGuard};

use super::{Collectives, Communicator, P2pOp};
use crate::{Cx, DistError, Module, OrderEntry, Result, ScheduleError, Tensor};
use plan::RankPlan;
pub use schedule::PipelineSchedule;

/// Where a stage sits in the pipeline.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StageRole {
    /// The only stage (one rank): no transfers.
    Only,
    /// Chunk 1: takes the real inputs, sends activations on.
    First,
    /// Receives activations, sends activations on; receives grads, sends grads back.
    Middle,
    /// The last chunk: receives activations, returns outputs to the caller (who computes the
    /// loss).
    Last,
}

/// One chunk of a pipeline whose chunk `c` (1-indexed) runs on rank `(c - 1) % world`: chunk
/// `r + 1` on rank `r` with one chunk per rank ([`PipelineStage::new`]), chunks `r + 1`,
/// `r + 1 + world`, ... with several ([`PipelineStage::interleaved`]).
///
/// It is a [`Module`]: capture a rank's stages with `make_graphed` and the rank's part of the
/// global order ([`stage_order`]); `make_graphed` checks that every rank captures its own
/// part. A stage other than chunk 1 receives the activation from the previous chunk's rank
/// straight into its input, which once captured is the graph's static input buffer: give it
/// a sample with `requires_grad` (its grad is sent back) and pass
/// [`crate::GraphedModules::static_input`] on replay, so nothing is copied in. A stage other
/// than the last sends its output on and returns `None`; its backward receives the grad from
/// the next chunk's rank. Every transfer is a stream op, so it is captured into the forward or
/// backward graph. Weight-grad entries (`w(c)`) transfer nothing: a chunk whose module splits
/// its backward ([`Module::splits_backward`]) runs them where the order says.
///
/// A send completes only once the peer posts the receive (as NCCL's), so two neighbours that
/// each send first would wait on each other, as 1F1B's steady state does: there the stage
/// holds the send back to the rank's next receive and posts both as one group
/// ([`Communicator::send_recv_group`]). Where to do so is decided for the whole order when the
/// stages are made, the same on every rank; an order that would still deadlock is refused
/// ([`DistError::PipelineDeadlock`]).
///
/// ```
/// use graphed::dist::{self, stage_order, PipelineSchedule, PipelineStage};
/// use graphed::{make_graphed, ops, Cx, GraphOptions, Module, Param, Result, Tensor};
///
/// /// y = x · w, elementwise.
/// struct Scale(Param);
/// impl Module for Scale {
///     fn name(&self) -> &'static str { "scale" }
///     fn num_inputs(&self) -> usize { 1 }
///     fn forward(&self, cx: &mut Cx, x: &[Option<Tensor>]) -> Result<Vec<Option<Tensor>>> {
///         let x = x[0].clone().expect("an input");
///         cx.save(&x);
///         Ok(vec![Some(ops::mul(&x, &self.0.value)?)])
///     }
///     fn backward(&mut self, cx: &mut Cx, dy: &[Option<Tensor>]) -> Result<Vec<Option<Tensor>>> {
///         let (x, dy) = (cx.saved(0)?, dy[0].clone().expect("a grad"));
///         ops::axpy_(&self.0.grad, 1.0, &ops::mul(&dy, &x)?)?;
///         Ok(vec![Some(ops::mul(&dy, &self.0.value)?)])
///     }
/// }
///
/// // 1F1B over two ranks and four microbatches: rank 1's grads and rank 0's activations
/// // cross, so sends go out grouped with receives.
/// let order = PipelineSchedule::one_f_one_b(2, 4).order()?;
/// let grads = dist::run_emulated(2, |comm| {
///     let dev = comm.device().clone();
///     let w = Param::new(Tensor::full(&dev, &[3], 2.0)?)?;
///     let (rank, grad) = (comm.rank(), w.grad.clone());
///     let stage = PipelineStage::new(Scale(w), comm, &order, &[3])?;
///     let mine = stage_order(&order, 2, rank)?;
///     let sample = Tensor::zeros(&dev, &[3])?.with_requires_grad(rank == 1);
///     let options = GraphOptions::new().order(mine.clone());
///     let mut g = make_graphed(vec![Box::new(stage) as Box<dyn Module>], vec![vec![vec![Some(sample)]]], options)?;
///     let (mut next, x) = (0, Tensor::full(&dev, &[3], 1.0)?);
///     for e in &mine {
///         match (e, rank) {
///             (graphed::OrderEntry::Forward(_), 0) => drop(g.forward(0, &[Some(x.clone())])?),
///             (graphed::OrderEntry::Forward(_), _) => {
///                 drop(g.forward(0, &[g.static_input(0, next, 0)])?);
///                 next += 1;
///             }
///             (_, 0) => drop(g.backward(0, &[None])?),
///             _ => drop(g.backward(0, &[Some(Tensor::full(&dev, &[3], 1.0)?)])?),
///         }
///     }
///     grad.to_vec()
/// })?;
/// // d(x·w0·w1)/dw0 = x·w1 = 2 per microbatch, likewise for w1.
/// assert_eq!(grads, vec![vec![8.0; 3], vec![8.0; 3]]);
/// # Ok::<(), graphed::Error>(())
/// ```
pub struct PipelineStage<M: Module> {
    inner: M,
    /// What the rank's stages share: its communicator and plan.
    stages: Arc<RankStages>,
    /// The chunk in the order (1-indexed).
    chunk: usize,
    /// The chunk among the rank's (1-indexed): in the rank's order and `make_graphed`.
    local: usize,
    role: StageRole,
    /// The ranks of the previous and the next chunk.
    prev: usize,
    next: usize,
    /// Dims of the output sent to the next stage (and of the grad received back).
    output_dims: Vec<usize>,
}

impl<M: Module> std::fmt::Debug for PipelineStage<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (name, chunk, role, comm) = (self.inner.name(), self.chunk, self.role, &self.stages.comm);
        write!(f, "PipelineStage({name}, chunk {chunk}, {role:?}, {comm:?})")
    }
}

impl<M: Module> PipelineStage<M> {
    /// Chunk `comm.rank() + 1` of a pipeline of one chunk per rank: `inner` maps one input to
    /// one output of `output_dims` (the shape of the grad the next stage sends back). `order`
    /// is the whole pipeline's, in integers or [`OrderEntry`]s (`w(c)` included), and every
    /// rank must pass the same (compared across ranks by hash: a typed error on every rank
    /// otherwise). Refused before anything is sent: an invalid order, one whose chunks are not
    /// the ranks, one whose transfers would deadlock, a `w(c)` for a chunk whose module does
    /// not split its backward ([`ScheduleError::WgradNotSplit`]).
    pub fn new<E: Into<OrderEntry>>(
        inner: M,
        comm: Communicator,
        order: impl IntoIterator<Item = E>,
        output_dims: &[usize],
    ) -> Result<PipelineStage<M>> {
        let mut stages = PipelineStage::interleaved(vec![inner], comm, order, output_dims)?;
        Ok(stages.remove(0))
    }

    /// This rank's chunks of a pipeline with several chunks per rank (Megatron-LM's
    /// interleaved schedule, [`PipelineSchedule::interleaved`]): `modules` are chunks
    /// `rank + 1`, `rank + 1 + world`, ..., in that order, each mapping one input to one
    /// output of `output_dims`. Capture the stages together, in that order, with the rank's
    /// part of the order ([`stage_order`]): they share the rank's transfers. Checked as
    /// [`PipelineStage::new`] is, and the number of modules against the chunks the rank runs
    /// ([`DistError::StageChunks`]).
    pub fn interleaved<E: Into<OrderEntry>>(
        modules: Vec<M>,
        comm: Communicator,
        order: impl IntoIterator<Item = E>,
        output_dims: &[usize],
    ) -> Result<Vec<PipelineStage<M>>> {
        let order: Vec<OrderEntry> = order.into_iter().map(Into::into).collect();
        let (rank, world) = (comm.rank(), comm.world_size());
        // A rank that refuses its own arguments still compares, so its peers refuse at once
        // instead of waiting for it in their first transfer.
        let checked = check(&modules, &order, world, rank);
        let mut h = DefaultHasher::new();
        (&order, output_dims, checked.is_ok()).hash(&mut h);
        let agreed = comm.check_same("pipeline orders", h.finish());
        let plan = checked?;
        agreed?;
        let chunks = plan.chunks;
        let stages = Arc::new(RankStages { comm, plan, progress: Mutex::new(Progress::default()) });
        let stages = modules.into_iter().enumerate().map(|(i, inner)| {
            let chunk = rank + 1 + i * world;
            let role = match chunk {
                _ if chunks == 1 => StageRole::Only,
                1 => StageRole::First,
                c if c == chunks => StageRole::Last,
                _ => StageRole::Middle,
            };
            PipelineStage {
                inner,
                stages: stages.clone(),
                chunk,
                local: i + 1,
                role,
                prev: (chunk + world - 2) % world,
                next: chunk % world,
                output_dims: output_dims.to_vec(),
            }
        });
        Ok(stages.collect())
    }

    /// The stage's role.
    pub fn role(&self) -> StageRole {
        self.role
    }

    /// The stage's chunk in the pipeline's order (1-indexed).
    pub fn chunk(&self) -> usize {
        self.chunk
    }

    /// The wrapped chunk.
    pub fn inner(&self) -> &M {
        &self.inner
    }

    /// Whether the stage receives its input (every chunk but the first).
    fn receives_input(&self) -> bool {
        matches!(self.role, StageRole::Middle | StageRole::Last)
    }

    /// Whether the stage sends its output on (every chunk but the last).
    fn sends_output(&self) -> bool {
        matches!(self.role, StageRole::First | StageRole::Middle)
    }

    /// Posts the sends held back for this call's receive and the receive, as one group.
    fn receive(&self, held: Vec<(Tensor, usize)>, receive: Option<(Tensor, usize)>) -> Result<()> {
        let sends = held.into_iter().map(|(t, peer)| P2pOp::Send(t, peer));
        let ops: Vec<P2pOp> = sends.into_iter().chain(receive.map(|(t, peer)| P2pOp::Recv(t, peer))).collect();
        self.stages.comm.send_recv_group(&ops)
    }

    /// Sends `t` to `peer` now, or holds it back for the rank's next receive.
    fn send(&self, t: Tensor, peer: usize, hold: bool) -> Result<()> {
        if hold {
            self.stages.progress().held.push_back((t, peer));
            Ok(())
        } else {
            self.stages.comm.send(&t, peer)
        }
    }
}

/// Everything about a rank's stages it can check alone: the modules, the order and its plan.
fn check<M: Module>(modules: &[M], order: &[OrderEntry], world: usize, rank: usize) -> Result<RankPlan> {
    for m in modules {
        if m.num_inputs() != 1 {
            return Err(DistError::StageInputs { module: m.name().into(), inputs: m.num_inputs() }.into());
        }
    }
    let plan = plan::plan(order, world, rank)?;
    let expected = plan.chunks / world;
    if modules.len() != expected {
        return Err(DistError::StageChunks { rank, expected, given: modules.len() }.into());
    }
    for (i, m) in modules.iter().enumerate() {
        if plan.local.contains(&OrderEntry::Wgrad(i + 1)) && !m.splits_backward() {
            return Err(ScheduleError::WgradNotSplit { chunk: rank + 1 + i * world, module: m.name().into() }.into());
        }
    }
    Ok(plan)
}

/// `order` (its chunks spread over `world` ranks, chunk `c` on rank `(c - 1) % world`)
/// restricted to rank `rank`'s chunks and renumbered 1, 2, ... (chunk `rank + 1` is its chunk
/// 1): the order to capture the rank's [`PipelineStage`]s with. Refuses an order that is not a
/// valid schedule, whose chunks do not spread evenly over the ranks, or whose transfers would
/// make ranks wait on each other even when sends are grouped with the receives after them.
///
/// ```
/// use graphed::dist::stage_order;
/// use graphed::OrderEntry;
/// // Two microbatches, all forwards before the backwards (GPipe): rank 1 runs chunk 2.
/// let order = [1, 1, 2, 2, -2, -2, -1, -1];
/// assert_eq!(stage_order(&order, 2, 1)?, vec![1, 1, -1, -1]);
/// // Weight-grad entries stay with their chunk.
/// let split = [OrderEntry::Forward(1), OrderEntry::Forward(2), OrderEntry::Backward(2), OrderEntry::Wgrad(2), OrderEntry::Backward(1), OrderEntry::Wgrad(1)];
/// assert_eq!(stage_order(split, 2, 1)?, [OrderEntry::Forward(1), OrderEntry::Backward(1), OrderEntry::Wgrad(1)]);
/// // Chunk 1 waits for its first grad before it sends its second activation, which chunk 2
/// // needs before it sends that grad: refused.
/// assert!(stage_order(&[1, -1, 1, -1, 2, 2, -2, -2], 2, 0).is_err());
/// # Ok::<(), graphed::Error>(())
/// ```
pub fn stage_order<E: Into<OrderEntry>>(
    order: impl IntoIterator<Item = E>,
    world: usize,
    rank: usize,
) -> Result<Vec<OrderEntry>> {
    let order: Vec<OrderEntry> = order.into_iter().map(Into::into).collect();
    Ok(plan::plan(&order, world, rank)?.local)
}

/// What the stages of one rank share: the communicator, the rank's plan and where its calls
/// stand in it.
pub(crate) struct RankStages {
    comm: Communicator,
    plan: RankPlan,
    progress: Mutex<Progress>,
}

impl std::fmt::Debug for RankStages {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "RankStages({:?}, order {:?})", self.comm, self.plan.local)
    }
}

/// Where a rank's calls stand in its plan.
#[derive(Default)]
struct Progress {
    /// The entry of the plan's order the next call is expected to be.
    at: usize,
    /// Sends held back for later receives, oldest first: the tensor and the peer.
    held: VecDeque<(Tensor, usize)>,
    /// Whether calls ignore the plan (a capture without backwards: nothing to group).
    off: bool,
}

impl RankStages {
    fn progress(&self) -> MutexGuard<'_, Progress> {
        self.progress.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A call for `entry` (of the rank's order) begins: the held sends that go out with its
    /// receive, and whether its own send is to be held. Calls in training mode follow the
    /// plan (warm-up and capture run the order exactly); a call off it (eval mode, or eager
    /// calls in another order) sends everything at once, and the plan starts over. Weight-grad
    /// calls move along the plan only where it has them (a whole backward calls its module's
    /// weight-grad half too).
    fn begin(&self, entry: OrderEntry, training: bool) -> (Vec<(Tensor, usize)>, bool) {
        let mut p = self.progress();
        let wgrad = matches!(entry, OrderEntry::Wgrad(_));
        let order = &self.plan.local;
        let at = match order.get(p.at) {
            _ if !training || p.off => None,
            Some(e) if *e == entry => Some(p.at),
            _ if wgrad => return (Vec::new(), false),
            _ => order.first().filter(|e| **e == entry).map(|_| 0),
        };
        let Some(at) = at else {
            p.at = 0;
            let all = if wgrad { Vec::new() } else { p.held.drain(..).collect() };
            return (all, false);
        };
        p.at = (at + 1) % order.len();
        let n = self.plan.release[at].min(p.held.len());
        (p.held.drain(..n).collect(), self.plan.hold[at])
    }

    /// A capture begins (`make_graphed`, after the ranks agreed): calls follow the plan from
    /// its start, or, without backwards, ignore it.
    pub(crate) fn restart(&self, backward: bool) {
        *self.progress() = Progress { at: 0, held: VecDeque::new(), off: !backward };
    }
}

impl<M: Module> Module for PipelineStage<M> {
    fn forward(&self, cx: &mut Cx, inputs: &[Option<Tensor>]) -> Result<Vec<Option<Tensor>>> {
        let x = inputs.first().cloned().flatten();
        let receive = match (&x, self.receives_input()) {
            (Some(x), true) => Some((x.clone(), self.prev)),
            (None, true) => return Err(DistError::StageNoInput { module: self.inner.name().into() }.into()),
            (_, false) => None,
        };
        // The input the receive fills is checked before the rank's progress moves (and its held
        // sends leave the queue): a refused forward changes nothing.
        if let Some((x, peer)) = &receive {
            self.stages.comm.check_transfer("send_recv_group", x, *peer)?;
        }
        let (held, hold) = self.stages.begin(OrderEntry::Forward(self.local), cx.training());
        // Straight into the static input: once captured, the graph's receive fills it.
        self.receive(held, receive)?;
        let outputs = self.inner.forward(cx, &[x])?;
        if !self.sends_output() {
            return Ok(outputs);
        }
        let y = outputs.first().cloned().flatten();
        let y = y.ok_or_else(|| DistError::StageNothingToSend { module: self.inner.name().into(), grad: false })?;
        // Nothing is saved in `cx` (the chunk's saved tensors are its own, by index): a send
        // held back keeps `y` alive until a later step's graph sends it.
        self.send(y, self.next, hold)?;
        Ok(vec![None; outputs.len()])
    }

    fn backward(&mut self, cx: &mut Cx, grad_outputs: &[Option<Tensor>]) -> Result<Vec<Option<Tensor>>> {
        let (dy, receive) = if self.sends_output() {
            let dy = Tensor::empty(self.stages.comm.device(), &self.output_dims)?;
            (vec![Some(dy.clone())], Some((dy, self.next)))
        } else {
            (grad_outputs.to_vec(), None)
        };
        let (held, hold) = self.stages.begin(OrderEntry::Backward(self.local), cx.training());
        self.receive(held, receive)?;
        let grads = self.inner.backward(cx, &dy)?;
        if self.receives_input() {
            let dx = grads.first().cloned().flatten();
            let dx =
                dx.ok_or_else(|| DistError::StageNothingToSend { module: self.inner.name().into(), grad: true })?;
            self.send(dx, self.prev, hold)?;
        }
        Ok(grads)
    }

    fn splits_backward(&self) -> bool {
        self.inner.splits_backward()
    }

    fn backward_weights(&mut self, cx: &mut Cx) -> Result<()> {
        self.stages.begin(OrderEntry::Wgrad(self.local), cx.training());
        self.inner.backward_weights(cx)
    }

    crate::module::forward_to_inner!(inner);

    fn collectives(&self) -> Option<Collectives> {
        let order = self.stages.plan.local.clone();
        Some(Collectives::pipeline_stage(self.stages.comm.clone(), order, self.local - 1, self.stages.clone()))
    }
}
