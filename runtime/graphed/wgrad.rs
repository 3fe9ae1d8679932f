//! Separate weight-grad graphs (Transformer Engine's `delay_wgrad_compute` / `backward_dw`).
//!
//! A module that splits its backward ([`Module::splits_backward`]) computes input grads in
//! `backward` and weight grads in [`Module::backward_weights`]. When the schedule has `w(c)`
//! entries for its chunk, each (chunk, microbatch) gets a third graph: `-c` captures the
//! input-grad half, `w(c)` the weight-grad half of the oldest microbatch whose input-grad half
//! ran. Otherwise both halves run at `-c`, in one graph, as an unsplit backward.

use super::capture::Capture;
use super::cursor::Pending;
use super::replay::Plan;
use super::schedule::{Pass, Step};
use super::GraphedModules;
use crate::module::backward_unsplit;
use crate::{Cx, Error, Module, Result, Tensor};

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

impl Capture {
    /// The `w(c)` step of warm-up (`capture` false, eager) or capture, on the context the
    /// chunk's backward left for (chunk, microbatch).
    pub(super) fn wgrad_step(&mut self, c: usize, m: usize, cx: Cx, capture: bool) -> Result<()> {
        if !capture {
            return self.modules[c].backward_weights(&mut cx.clone());
        }
        let mode = self.config.options.capture_mode;
        let label = format!("{} weight grads", self.drafts[c][m].label);
        let mut graph = self.new_graph(label.clone());
        let module = &mut self.modules[c];
        let captured = graph.capture(mode, || module.backward_weights(&mut cx.clone()));
        captured.map_err(|e| e.context(format!("capturing {label}")))?;
        self.drafts[c][m].wgrad = Some(graph);
        Ok(())
    }
}

impl GraphedModules {
    /// Runs the weight grads of `chunk` for its oldest microbatch whose backward ran but
    /// whose weight grads have not: replays its weight-grad graph, or runs `backward_weights`
    /// eagerly after an eager backward (on the context that backward left).
    /// Parameter grads accumulate.
    ///
    /// Refused, changing nothing: a chunk out of range, a chunk without `w(c)` entries in the
    /// schedule ([`Error::NotDeferred`]), no microbatch waiting ([`Error::NoPendingBackward`]),
    /// or out of the schedule's replay order ([`Error::ReplayOrder`]).
    pub fn backward_weights(&mut self, chunk: usize) -> Result<()> {
        self.check_chunk(chunk)?;
        if !self.config.schedule.defers(chunk) {
            return Err(Error::NotDeferred { module: self.modules[chunk].name().into() });
        }
        let microbatch = match self.cursor.front(chunk, Pass::Wgrad) {
            None => return Err(Error::NoPendingBackward { module: self.modules[chunk].name().into() }),
            Some(Pending::Eager(cx)) => {
                let mut cx = cx.clone();
                self.modules[chunk].backward_weights(&mut cx)?;
                self.cursor.eager_wgrad(chunk);
                return Ok(());
            }
            Some(Pending::Graphed(m)) => *m,
        };
        let step = Step { pass: Pass::Wgrad, chunk, microbatch };
        if self.surfaces[chunk][microbatch].passes.wgrad.is_none() {
            // A forward-only capture queues nothing graphed, so this does not happen.
            return Err(Error::NotDeferred { module: self.surfaces[chunk][microbatch].label.clone() });
        }
        let admitted = self.cursor.admit(&self.config.schedule, &self.surfaces, step)?;
        self.replay(Plan::launch_only(admitted)).map(drop)
    }
}
