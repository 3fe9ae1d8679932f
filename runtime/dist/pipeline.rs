//! Pipeline parallelism across ranks: rank `c` runs chunk `c` of an `order` schedule, and
//! activations and grads travel by send/recv straight into the next stage's buffers, inside
//! the captured graphs.

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};

use super::Communicator;
use crate::{Cx, DistError, Module, PipelineTransfer, Result, Tensor};

/// Where a stage sits in the pipeline.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StageRole {
    /// The only stage (one rank): no transfers.
    Only,
    /// Rank 0: takes the real inputs, sends activations on.
    First,
    /// Receives activations, sends activations on; receives grads, sends grads back.
    Middle,
    /// Receives activations, returns outputs to the caller (who computes the loss).
    Last,
}

/// One rank's chunk of a pipeline whose chunk `c` (0-indexed) runs on rank `c`.
///
/// It is a [`Module`]: capture it with `make_graphed` and the rank's projection of the global
/// order ([`stage_order`]). A stage other than the first receives the activation from the
/// previous rank straight into its input, which once captured is the graph's static input
/// buffer: give it a sample with `requires_grad` (its grad is sent back) and pass
/// [`crate::GraphedModules::static_input`] on replay, so nothing is copied in. A stage other than the last sends
/// its output on and returns `None`; its backward receives the grad from the next rank. Every
/// transfer is a stream op, so it is captured into the forward or backward graph.
///
/// Transfers block until the peer takes part (as NCCL's do), so the schedule must not make two
/// neighbours wait on each other: [`stage_order`] checks that for the whole
/// pipeline and refuses an order that would deadlock.
///
pub struct PipelineStage<M: Module> {
    inner: M,
    comm: Communicator,
    role: StageRole,
    /// Dims of the output sent to the next stage (and of the grad received back).
    output_dims: Vec<usize>,
    /// This rank's part of the order ([`stage_order`]): what it must be captured with.
    order: Vec<i32>,
}

impl<M: Module> std::fmt::Debug for PipelineStage<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PipelineStage({}, {:?}, {:?})", self.inner.name(), self.role, self.comm)
    }
}

/// One transfer in a rank's sequence: (send?, peer, what) where `what` tags the tensor.
type Transfer = (bool, usize, (bool, usize));

impl<M: Module> PipelineStage<M> {
    /// Stage `comm.rank()` of `comm.world_size()`: `inner` maps one input to one output of
    /// `output_dims` (the shape of the grad the next stage sends back). Every rank must pass the same `order` (checked across
    /// ranks by hash, a typed error on every rank otherwise).
    pub fn new(inner: M, comm: Communicator, order: &[i32], output_dims: &[usize]) -> Result<PipelineStage<M>> {
        let (rank, world) = (comm.rank(), comm.world_size());
        if inner.num_inputs() != 1 {
            return Err(DistError::StageInputs { module: inner.name().into(), inputs: inner.num_inputs() }.into());
        }
        let mine = stage_order(order, world, rank)?;
        let mut h = DefaultHasher::new();
        (order, output_dims).hash(&mut h);
        comm.check_same("pipeline orders", h.finish())?;
        let role = match (rank, world) {
            (_, 1) => StageRole::Only,
            (0, _) => StageRole::First,
            (r, w) if r + 1 == w => StageRole::Last,
            _ => StageRole::Middle,
        };
        Ok(PipelineStage { inner, comm, role, output_dims: output_dims.to_vec(), order: mine })
    }

    /// The rank's role.
    pub fn role(&self) -> StageRole {
        self.role
    }

    /// The wrapped chunk.
    pub fn inner(&self) -> &M {
        &self.inner
    }
}

/// `order` (over `chunks` chunks, 1-indexed) restricted to chunk `rank + 1` and renumbered as
/// chunk 1: the order to capture rank `rank`'s [`PipelineStage`] with. Refuses an order that is
/// not a valid schedule, or whose transfers would make neighbouring ranks wait on each other
/// (transfers block until the peer takes part, as NCCL's do).
///
/// ```
/// use graphed::dist::stage_order;
/// // Two microbatches, all forwards before the backwards (GPipe): rank 1 runs chunk 2.
/// let order = [1, 1, 2, 2, -2, -2, -1, -1];
/// assert_eq!(stage_order(&order, 2, 1)?, vec![1, 1, -1, -1]);
/// // Chunk 2's first backward before chunk 1's second forward: the neighbours wait on each
/// // other (rank 0 sends the second activation, rank 1 sends the first grad).
/// assert!(stage_order(&[1, 1, 2, -2, 2, -2, -1, -1], 2, 0).is_err());
/// # Ok::<(), graphed::Error>(())
/// ```
pub fn stage_order(order: &[i32], chunks: usize, rank: usize) -> Result<Vec<i32>> {
    crate::graphed::Schedule::new(Some(&crate::OrderEntry::from_ints(order)), chunks, true)?;
    if rank >= chunks {
        return Err(DistError::World { op: "stage_order", rank, world: chunks }.into());
    }
    let seqs: Vec<Vec<Transfer>> = (0..chunks).map(|c| transfers(order, chunks, c)).collect();
    check_progress(&seqs, order)?;
    let mine = (rank + 1) as i32;
    Ok(order.iter().filter(|e| e.abs() == mine).map(|e| e.signum()).collect())
}

/// The sends and receives chunk `c` issues, in its order, each tagged (forward?, microbatch).
fn transfers(order: &[i32], chunks: usize, c: usize) -> Vec<Transfer> {
    let (mut fwd, mut bwd) = (0, 0);
    let mut out = Vec::new();
    for &e in order.iter().filter(|e| e.unsigned_abs() as usize == c + 1) {
        if e > 0 {
            if c > 0 {
                out.push((false, c - 1, (true, fwd)));
            }
            if c + 1 < chunks {
                out.push((true, c + 1, (true, fwd)));
            }
            fwd += 1;
        } else {
            if c + 1 < chunks {
                out.push((false, c + 1, (false, bwd)));
            }
            if c > 0 {
                out.push((true, c - 1, (false, bwd)));
            }
            bwd += 1;
        }
    }
    out
}

/// Simulates every rank issuing its transfers in order, each one waiting for the matching
/// transfer of its peer (rendezvous); an order where no rank can move is refused.
fn check_progress(seqs: &[Vec<Transfer>], order: &[i32]) -> Result<()> {
    let mut at = vec![0usize; seqs.len()];
    loop {
        let mut moved = false;
        for r in 0..seqs.len() {
            let Some(&(send, peer, what)) = seqs[r].get(at[r]) else { continue };
            if seqs[peer].get(at[peer]) == Some(&(!send, r, what)) {
                at[r] += 1;
                at[peer] += 1;
                moved = true;
            }
        }
        if at.iter().zip(seqs).all(|(a, s)| *a == s.len()) {
            return Ok(());
        }
        if !moved {
            let stuck = at.iter().enumerate().filter_map(|(rank, a)| {
                let &(sends, peer, (activation, microbatch)) = seqs[rank].get(*a)?;
                Some(PipelineTransfer { rank, sends, peer, activation, microbatch })
            });
            return Err(DistError::PipelineDeadlock { order: order.to_vec(), stuck: stuck.collect() }.into());
        }
    }
}

impl<M: Module> Module for PipelineStage<M> {
    fn forward(&self, cx: &mut Cx, inputs: &[Option<Tensor>]) -> Result<Vec<Option<Tensor>>> {
        let rank = self.comm.rank();
        let x = inputs.first().cloned().flatten();
        if matches!(self.role, StageRole::Middle | StageRole::Last) {
            let x = x.as_ref().ok_or_else(|| DistError::StageNoInput { module: self.inner.name().into() })?;
            // Straight into the static input: once captured, the graph's receive fills it.
            self.comm.recv(x, rank - 1)?;
        }
        let outputs = self.inner.forward(cx, &[x])?;
        match self.role {
            StageRole::Only | StageRole::Last => Ok(outputs),
            StageRole::First | StageRole::Middle => {
                let y = outputs.first().cloned().flatten();
                let y =
                    y.ok_or_else(|| DistError::StageNothingToSend { module: self.inner.name().into(), grad: false })?;
                self.comm.send(&y, rank + 1)?;
                cx.save(&y);
                Ok(vec![None; outputs.len()])
            }
        }
    }

    fn backward(&mut self, cx: &mut Cx, grad_outputs: &[Option<Tensor>]) -> Result<Vec<Option<Tensor>>> {
        let rank = self.comm.rank();
        let dy = match self.role {
            StageRole::Only | StageRole::Last => grad_outputs.to_vec(),
            StageRole::First | StageRole::Middle => {
                let dy = Tensor::empty(self.comm.device(), &self.output_dims)?;
                self.comm.recv(&dy, rank + 1)?;
                vec![Some(dy)]
            }
        };
        let grads = self.inner.backward(cx, &dy)?;
        match self.role {
            StageRole::Only | StageRole::First => Ok(grads),
            StageRole::Middle | StageRole::Last => {
                let dx = grads.first().cloned().flatten();
                let dx =
                    dx.ok_or_else(|| DistError::StageNothingToSend { module: self.inner.name().into(), grad: true })?;
                self.comm.send(&dx, rank - 1)?;
                Ok(grads)
            }
        }
    }

    crate::module::forward_to_inner!();

    fn collectives(&self) -> Option<super::Collectives> {
        Some(super::Collectives::stage(self.comm.clone(), self.order.clone()))
    }
}
