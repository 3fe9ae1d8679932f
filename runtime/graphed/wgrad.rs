//! Separate weight-grad graphs (Transformer Engine's `delay_wgrad_compute` / `backward_dw`).
//!
//! A module that splits its backward ([`Module::splits_backward`]) computes input grads in
//! `backward` and weight grads in [`Module::backward_weights`]. When the schedule has `w(c)`
//! entries for its chunk, each (chunk, microbatch) gets a third graph: `-c` captures the
//! input-grad half, `w(c)` the weight-grad half of the oldest microbatch whose input-grad half
//! ran. Otherwise both halves run at `-c`, in one graph, as an unsplit backward.

use std::collections::VecDeque;

use super::{GraphedModules, Pending, Schedule};
use crate::pool::MemRange;
use crate::{Cx, Error, Graph, Module, Result, Tensor};

/// The weight-grad graph of one (chunk, microbatch).
struct WgradGraph {
    graph: Graph,
    writes: Vec<MemRange>,
    /// Handed-out buffers in memory the graph writes: stale after each replay.
    clobbers: Vec<Tensor>,
}

/// The weight-grad graphs and the microbatches waiting for theirs.
#[derive(Default)]
pub(super) struct Wgrad {
    /// `[chunk][microbatch]`, sized as captures fill it.
    graphs: Vec<Vec<Option<WgradGraph>>>,
    /// Per chunk: microbatches whose input-grad half ran and whose weight grads have not.
    pending: Vec<VecDeque<Pending>>,
}

impl Wgrad {
    fn slot(&mut self, chunk: usize, microbatch: usize) -> &mut Option<WgradGraph> {
        if self.graphs.len() <= chunk {
            self.graphs.resize_with(chunk + 1, Vec::new);
        }
        let row = &mut self.graphs[chunk];
        if row.len() <= microbatch {
            row.resize_with(microbatch + 1, || None);
        }
        &mut row[microbatch]
    }

    fn queue(&mut self, chunk: usize) -> &mut VecDeque<Pending> {
        if self.pending.len() <= chunk {
            self.pending.resize_with(chunk + 1, VecDeque::new);
        }
        &mut self.pending[chunk]
    }

    /// The weight-grad graph of (chunk, microbatch), if one was captured.
    pub(super) fn graph(&self, chunk: usize, microbatch: usize) -> Option<&Graph> {
        self.graphs.get(chunk)?.get(microbatch)?.as_ref().map(|w| &w.graph)
    }

    /// Every weight-grad graph, (chunk, microbatch) major.
    pub(super) fn graphs(&self) -> impl Iterator<Item = &Graph> {
        self.graphs.iter().flatten().flatten().map(|w| &w.graph)
    }

    /// Every buffer some weight-grad graph overwrites.
    pub(super) fn clobbers(&self) -> impl Iterator<Item = &Tensor> {
        self.graphs.iter().flatten().flatten().flat_map(|w| &w.clobbers)
    }

    /// Microbatches waiting for their weight grads, over all chunks.
    pub(super) fn pending_count(&self) -> usize {
        self.pending.iter().map(VecDeque::len).sum()
    }

    /// Drops the waiting microbatches (an abandoned iteration).
    pub(super) fn clear_pending(&mut self) {
        self.pending.iter_mut().for_each(VecDeque::clear);
    }
}

/// A module's backward as one call: its input grads, then, for a module that splits its
/// backward, its weight grads (on the context `backward` left). This is the ordinary, unsplit
/// backward of any module; eager training loops call it instead of `backward`.
pub fn backward_unsplit(
    module: &mut dyn Module,
    cx: &mut Cx,
    grad_outputs: &[Option<Tensor>],
) -> Result<Vec<Option<Tensor>>> {
    let grads = module.backward(cx, grad_outputs)?;
    if module.splits_backward() {
        module.backward_weights(cx)?;
    }
    Ok(grads)
}

/// The backward step of a chunk: the input-grad half only when its weight grads are deferred,
/// the recompute and the whole backward when it is checkpointed, the whole backward otherwise.
pub(super) fn run_backward(
    module: &mut dyn Module,
    cx: &mut Cx,
    grad_outputs: &[Option<Tensor>],
    deferred: bool,
    checkpointed: bool,
) -> Result<Vec<Option<Tensor>>> {
    if checkpointed {
        crate::checkpoint::checkpointed_backward(module, cx, grad_outputs)
    } else if deferred {
        module.backward(cx, grad_outputs)
    } else {
        backward_unsplit(module, cx, grad_outputs)
    }
}

/// `w(c)` entries only for chunks whose module splits its backward and that are not
/// checkpointed (a recomputed chunk's activations live only inside its whole backward).
pub(super) fn check_splits(modules: &[Box<dyn Module>], schedule: &Schedule, checkpointed: &[bool]) -> Result<()> {
    for (c, m) in modules.iter().enumerate() {
        if schedule.defers(c) && checkpointed.get(c).copied().unwrap_or(false) {
            return Err(Error::InvalidOrder {
                detail: format!(
                    "w({}): chunk {} (`{}`) is checkpointed, so its weight grads run inside its backward, after the recompute; drop the w({}) entries or the checkpoint",
                    c + 1,
                    c + 1,
                    m.name(),
                    c + 1
                ),
            });
        }
        if schedule.defers(c) && !m.splits_backward() {
            return Err(Error::InvalidOrder {
                detail: format!(
                    "w({}): chunk {} (`{}`) does not split its backward (Module::splits_backward is false), so it has no separate weight grads",
                    c + 1,
                    c + 1,
                    m.name()
                ),
            });
        }
    }
    Ok(())
}

impl GraphedModules {
    /// The `w(c)` step of warm-up (`capture` false, eager) or capture, on the context the
    /// chunk's backward left for (chunk, microbatch).
    pub(super) fn wgrad_step(&mut self, c: usize, m: usize, cx: Cx, capture: bool) -> Result<()> {
        if !capture {
            return self.modules[c].backward_weights(&mut cx.clone());
        }
        let mode = self.config.options.capture_mode;
        let label = format!("{} weight grads", self.surfaces[c][m].label);
        let mut graph = Graph::with_pool(&self.device, &self.pool);
        graph.set_label(label.clone());
        self.pool.begin_tracking();
        let module = &mut self.modules[c];
        let captured = graph.capture(mode, || module.backward_weights(&mut cx.clone()));
        let writes = self.pool.end_tracking();
        captured.map_err(|e| e.context(format!("capturing {label}")))?;
        *self.wgrad.slot(c, m) = Some(WgradGraph { graph, writes, clobbers: Vec::new() });
        Ok(())
    }

    /// After the backward of (chunk, `pending`) ran: queue its weight grads when deferred.
    pub(super) fn dgrad_done(&mut self, chunk: usize, pending: Pending) {
        if self.config.schedule.defers(chunk) {
            self.wgrad.queue(chunk).push_back(pending);
        }
    }

    /// Which handed-out buffers each weight-grad graph overwrites.
    pub(super) fn compute_wgrad_clobbers(&mut self) {
        let mut wgrad = std::mem::take(&mut self.wgrad);
        for w in wgrad.graphs.iter_mut().flatten().flatten() {
            w.clobbers = self.clobbered_by(&w.writes, &[]);
        }
        self.wgrad = wgrad;
    }

    /// Runs the weight grads of `chunk` for its oldest microbatch whose backward ran but
    /// whose weight grads have not: replays its weight-grad graph, or runs `backward_weights`
    /// eagerly after an eager backward (on the context that backward left).
    /// Parameter grads accumulate.
    ///
    /// Refused, changing nothing: a chunk out of range, a chunk without `w(c)` entries in the
    /// schedule ([`Error::NotDeferred`]), no microbatch waiting ([`Error::NoPendingBackward`]),
    /// or out of the pool's replay order ([`Error::ReplayOrder`]).
    pub fn backward_weights(&mut self, chunk: usize) -> Result<()> {
        self.check_chunk(chunk)?;
        if !self.config.schedule.defers(chunk) {
            return Err(Error::NotDeferred { module: self.modules[chunk].name().into() });
        }
        let m = match self.wgrad.queue(chunk).front() {
            None => return Err(Error::NoPendingBackward { module: self.modules[chunk].name().into() }),
            Some(Pending::Eager(cx)) => {
                let mut cx = cx.clone();
                self.modules[chunk].backward_weights(&mut cx)?;
                self.wgrad.queue(chunk).pop_front();
                return Ok(());
            }
            Some(Pending::Graphed(m)) => *m,
        };
        let Some(w) = self.wgrad.graphs.get_mut(chunk).and_then(|row| row.get_mut(m)).and_then(Option::as_mut) else {
            // A forward-only capture queues nothing graphed, so this does not happen.
            return Err(Error::NotDeferred { module: self.surfaces[chunk][m].label.clone() });
        };
        let ticket = w.graph.check_replay()?;
        // Act.
        let restarted = w.graph.launch(ticket)?;
        w.clobbers.iter().for_each(|t| {
            t.bump_generation();
        });
        self.wgrad.queue(chunk).pop_front();
        if restarted {
            // Only a forward graph can start a cycle, so this does not happen; stay safe anyway.
            self.invalidate_all();
        }
        Ok(())
    }
}
