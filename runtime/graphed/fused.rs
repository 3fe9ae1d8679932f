//! One launch per step: the captured schedule replayed as one graph of child graphs.
//!
//! Capture stays per (chunk, microbatch), with hooks, recomputation and errors per module;
//! since nothing host-side happens between the graphs of a declared schedule on replay, they
//! can run as one graph. The caller's inputs are bound: write them into the static inputs
//! ([`GraphedModules::static_inputs`], [`GraphedModules::static_grad_outputs`]) and read the
//! results from [`GraphedModules::outputs`] and [`GraphedModules::grad_inputs`] after
//! [`GraphedModules::step`]. Replay order and stale handles hold as for per-call replays.

use std::collections::VecDeque;

use super::schedule::Pass;
use super::GraphedModules;
use crate::{Error, Graph, Result, Tensor};

/// The fused graph and what a step needs to check and commit without allocating.
pub(super) struct Fused {
    graph: Graph,
    /// The modules' names, for errors.
    label: String,
    /// The first step of the schedule: (chunk, microbatch) of a forward.
    first: (usize, usize),
    /// The pool id of the schedule's last graph.
    last: u64,
    /// Every buffer some graph of the step overwrites, once each: their handles go stale.
    clobbers: Vec<Tensor>,
}

impl GraphedModules {
    /// Builds the fused step (once; later calls do nothing): every graph of the schedule, in
    /// capture order, as one executable graph.
    pub fn fuse(&mut self) -> Result<()> {
        if self.config.fused.is_some() {
            return Ok(());
        }
        let parts = self.graphs_in_order();
        let label = self.modules.iter().map(|m| m.name()).collect::<Vec<_>>().join(", ");
        let (Some(first), Some(last)) = (self.config.schedule.steps().first(), parts.last()) else {
            return Err(Error::NotFused { module: label });
        };
        let (first, last) = ((first.chunk, first.microbatch), last.id());
        let graph = Graph::fuse(&self.device, &self.pool, format!("fused step of {label}"), &parts)?;
        let mut clobbers: Vec<Tensor> = Vec::new();
        for t in self.surfaces.iter().flatten().flat_map(|s| s.forward_clobbers.iter().chain(&s.backward_clobbers)) {
            if !clobbers.iter().any(|c| c.same_buffer(t)) {
                clobbers.push(t.clone());
            }
        }
        self.config.fused = Some(Fused { graph, label, first, last, clobbers });
        Ok(())
    }

    /// Whether [`GraphedModules::fuse`] has built the one-launch step.
    pub fn is_fused(&self) -> bool {
        self.config.fused.is_some()
    }

    /// Replays one whole iteration of the schedule with one launch, on the inputs and grad
    /// outputs already in the static buffers. Checked first, changing nothing when refused:
    /// the step must be fused, the mode the captured one, no microbatch may be half-way (a
    /// forward without its backward), and the pool's order must allow the schedule's first
    /// graph now. Afterwards every handle an earlier call returned is stale, as after the
    /// per-call replays the step stands for.
    pub fn step(&mut self) -> Result<()> {
        let Some(fused) = &self.config.fused else {
            let module = self.modules.iter().map(|m| m.name()).collect::<Vec<_>>().join(", ");
            return Err(Error::NotFused { module });
        };
        if self.training != self.captured_training {
            return Err(Error::StepMode { module: fused.label.clone(), captured_training: self.captured_training });
        }
        let pending: usize = self.pending.iter().map(VecDeque::len).sum();
        if pending > 0 || self.next_forward.iter().any(|&n| n != 0) {
            return Err(Error::StepMidIteration { module: fused.label.clone(), pending });
        }
        let (chunk, microbatch) = fused.first;
        let ticket = self.surfaces[chunk][microbatch].forward.check_replay()?;
        let last = fused.last;
        // Act.
        if let Some(fused) = self.config.fused.as_mut() {
            fused.graph.launch_fused()?;
        }
        if self.pool.advance_replay_past(ticket, last) {
            self.invalidate_all();
        }
        if let Some(fused) = &self.config.fused {
            fused.clobbers.iter().for_each(|t| {
                t.bump_generation();
            });
        }
        Ok(())
    }

    /// The graphs of the schedule in capture (and replay) order.
    fn graphs_in_order(&self) -> Vec<&Graph> {
        let mut v = Vec::new();
        for step in self.config.schedule.steps() {
            let s = &self.surfaces[step.chunk][step.microbatch];
            match step.pass {
                Pass::Forward => v.push(&s.forward),
                Pass::Backward => v.extend(s.backward.as_ref()),
            }
        }
        v
    }

    fn surface_checked(&self, chunk: usize, microbatch: usize) -> Result<&super::Surface> {
        let row = self.surfaces.get(chunk).ok_or(Error::ChunkOutOfRange { chunk, chunks: self.surfaces.len() })?;
        row.get(microbatch).ok_or_else(|| Error::invalid("microbatch", format!("{microbatch} of {}", row.len())))
    }

    /// The static inputs of (chunk, microbatch): write a step's inputs into them (`copy_`,
    /// `copy_from_slice`) before [`GraphedModules::step`].
    pub fn static_inputs(&self, chunk: usize, microbatch: usize) -> Result<Vec<Option<Tensor>>> {
        Ok(self.surface_checked(chunk, microbatch)?.inputs.iter().map(|t| t.as_ref().map(Tensor::refreshed)).collect())
    }

    /// The static grad outputs of (chunk, microbatch) (`None` for outputs that get no grad).
    pub fn static_grad_outputs(&self, chunk: usize, microbatch: usize) -> Result<Vec<Option<Tensor>>> {
        let s = self.surface_checked(chunk, microbatch)?;
        Ok(s.grad_outputs.iter().map(|t| t.as_ref().map(Tensor::refreshed)).collect())
    }

    /// Handles to the static outputs of (chunk, microbatch) as the last replay left them.
    pub fn outputs(&self, chunk: usize, microbatch: usize) -> Result<Vec<Option<Tensor>>> {
        Ok(self.surface_checked(chunk, microbatch)?.outputs.iter().map(|t| t.as_ref().map(Tensor::refreshed)).collect())
    }

    /// Handles to the grads of the inputs of (chunk, microbatch) as the last replay left them.
    pub fn grad_inputs(&self, chunk: usize, microbatch: usize) -> Result<Vec<Option<Tensor>>> {
        let s = self.surface_checked(chunk, microbatch)?;
        Ok(s.grad_inputs.iter().map(|t| t.as_ref().map(Tensor::refreshed)).collect())
    }
}
