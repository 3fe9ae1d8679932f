//! One launch per step: the captured schedule replayed as one graph of child graphs.
//!
//! Capture stays per (chunk, microbatch), with hooks, recomputation and errors per module;
//! since nothing host-side happens between the graphs of a declared schedule on replay, they
//! can run as one graph. The caller's inputs are bound: write them into the static inputs
//! ([`GraphedModules::static_inputs`], [`GraphedModules::static_grad_outputs`]) and read the
//! results from [`GraphedModules::outputs`] and [`GraphedModules::grad_inputs`] after
//! [`GraphedModules::step`]. Replay order and stale handles hold as for per-call replays.

use super::buckets::{CopyIn, SlotsAt};
use super::schedule::Step;
use super::staging::Bound;
use super::surface::Surface;
use super::GraphedModules;
use crate::pool::ReplayTicket;
use crate::{Error, Graph, GraphPool, Result, ScheduleError, Tensor};

/// A fused graph over one or more graphed modules (each one whole iteration of its schedule)
/// and what a step needs to check and commit without allocating.
pub(super) struct Fused {
    graph: Graph,
    /// The modules' names, for errors.
    label: String,
    /// Per pool the graphs use: the pool, its first and last graph in the run.
    runs: Vec<(GraphPool, u64, u64)>,
    /// Every buffer some graph of the step overwrites, once each: their handles go stale.
    clobbers: Vec<Tensor>,
}

impl Fused {
    /// Fuses the graphs of `members` in order. Per pool, the members' graphs must be a run of
    /// the pool's capture order, in that order (the order replays must follow).
    pub(super) fn build(members: &[GraphedModules]) -> Result<Fused> {
        let label = members.iter().flat_map(|m| m.modules.iter().map(|x| x.name())).collect::<Vec<_>>().join(", ");
        let parts: Vec<&Graph> = members.iter().flat_map(|m| m.fused_parts()).collect();
        let first = members.first().ok_or_else(|| Error::NotFused { module: label.clone() })?;
        if parts.is_empty() {
            return Err(Error::NotFused { module: label });
        }
        let mut runs: Vec<(GraphPool, Vec<u64>)> = Vec::new();
        for m in members {
            if m.device != first.device {
                return Err(Error::DeviceMismatch { op: "fuse", a: first.device.name(), b: m.device.name() });
            }
            let ids = m.graphs_in_order().iter().map(|g| g.id()).collect::<Vec<_>>();
            match runs.iter_mut().find(|(p, _)| p == &m.pool) {
                Some((_, v)) => v.extend(ids),
                None => runs.push((m.pool.clone(), ids)),
            }
        }
        for (pool, ids) in &runs {
            if !pool.is_capture_run(ids) {
                return Err(ScheduleError::FuseOrder { modules: label }.into());
            }
        }
        let graph = Graph::fuse(&first.device, &first.pool, format!("fused step of {label}"), &parts)?;
        let mut clobbers: Vec<Tensor> = Vec::new();
        for t in members.iter().flat_map(|m| m.step_clobbers()) {
            if !clobbers.iter().any(|c| c.same_buffer(t)) {
                clobbers.push(t.clone());
            }
        }
        let runs = runs.into_iter().map(|(p, ids)| (p, ids[0], ids[ids.len() - 1])).collect();
        Ok(Fused { graph, label, runs, clobbers })
    }

    /// Everything a step checks, with no side effect: each member's mode, and that its
    /// cursor is between iterations, then each pool's order; the tickets to commit with.
    fn check(&self, members: &[GraphedModules]) -> Result<Vec<ReplayTicket>> {
        for m in members {
            if m.training != m.captured_training {
                return Err(Error::StepMode { module: self.label.clone(), captured_training: m.captured_training });
            }
            if let Err(pending) = m.cursor.admit_step() {
                return Err(Error::StepMidIteration { module: self.label.clone(), pending });
            }
        }
        self.runs.iter().map(|(pool, first, _)| pool.check_replay(*first)).collect()
    }

    /// Launches, then commits: each member's cursor and each pool's order move past the
    /// iteration, members whose pool restarted mid-cycle drop their abandoned iteration,
    /// and overwritten handles go stale.
    fn launch(&mut self, tickets: Vec<ReplayTicket>, members: &mut [GraphedModules]) -> Result<()> {
        self.graph.launch_fused()?;
        members.iter_mut().for_each(|m| m.cursor.commit_step());
        for ((pool, _, last), ticket) in self.runs.iter().zip(tickets) {
            if pool.advance_replay_past(ticket, *last) {
                members.iter().filter(|m| &m.pool == pool).for_each(|m| m.invalidate_all());
            }
        }
        self.clobbers.iter().for_each(|t| {
            t.bump_generation();
        });
        Ok(())
    }

    /// Checks and launches one step over `members`.
    pub(super) fn step(&mut self, members: &mut [GraphedModules]) -> Result<()> {
        let tickets = self.check(members)?;
        self.launch(tickets, members)
    }
}

impl GraphedModules {
    /// Builds the fused step (once; later calls do nothing): every graph of the schedule, in
    /// capture order, as one executable graph.
    ///
    /// Where microbatches share surfaces (`GraphOptions::reuse_buffers`), the step gets bound
    /// buffers per microbatch and copies around the shared surfaces (see `staging`); the
    /// accessors below then hand out those buffers.
    ///
    /// With shape buckets, every bucket gets its own fused step (all or none: a failure
    /// leaves every bucket as it was); [`GraphedModules::step_chain`] picks the bucket from
    /// its inputs, [`GraphedModules::step`] runs the active one.
    pub fn fuse(&mut self) -> Result<()> {
        let Some(n) = self.bucket_count() else { return self.fuse_active() };
        let mut built = Vec::new();
        let result = (0..n).try_for_each(|index| {
            self.in_bucket(index, |g| {
                let fresh = !g.is_fused();
                g.fuse_active()?;
                if fresh {
                    built.push(index);
                }
                Ok(())
            })
        });
        if result.is_err() {
            for index in built {
                self.in_bucket(index, |g| {
                    g.config.fused = None;
                    g.config.staging = None;
                    Ok(())
                })?;
            }
        }
        result
    }

    /// [`GraphedModules::fuse`] for the active bucket (all the graphs without buckets).
    fn fuse_active(&mut self) -> Result<()> {
        if self.config.fused.is_none() {
            let fresh = self.config.staging.is_none();
            let mark = self.pool.mark();
            match self.prepare_staging().and_then(|()| Fused::build(std::slice::from_ref(self))) {
                Ok(fused) => self.config.fused = Some(fused),
                Err(e) => {
                    // Refused or failed: nothing changes, and the pool gives back what it grew.
                    if fresh {
                        self.config.staging = None;
                    }
                    self.pool.release_since(mark);
                    return Err(e);
                }
            }
        }
        Ok(())
    }

    /// Whether [`GraphedModules::fuse`] has built the one-launch step.
    pub fn is_fused(&self) -> bool {
        self.config.fused.is_some()
    }

    /// Replays one whole iteration of the schedule with one launch, on the inputs and grad
    /// outputs already in the static buffers. Checked first, changing nothing when refused:
    /// the step must be fused, the mode the captured one, no microbatch may be half-way (a
    /// forward without its backward, or a backward without its `w(c)` weight grads), and the pool's order must allow the schedule's first
    /// graph now. Afterwards every handle an earlier call returned is stale, as after the
    /// per-call replays the step stands for.
    pub fn step(&mut self) -> Result<()> {
        self.step_copying(&[])
    }

    /// [`GraphedModules::step`], with `copies` (destination, source) made into the bound
    /// buffers once the step is known to be allowed, just before the launch.
    pub(super) fn step_copying(&mut self, copies: &[CopyIn]) -> Result<()> {
        let Some(mut fused) = self.config.fused.take() else {
            let module = self.modules.iter().map(|m| m.name()).collect::<Vec<_>>().join(", ");
            return Err(Error::NotFused { module });
        };
        let result = fused.check(std::slice::from_ref(self)).and_then(|tickets| {
            copies.iter().try_for_each(CopyIn::run)?;
            fused.launch(tickets, std::slice::from_mut(self))
        });
        self.config.fused = Some(fused);
        result
    }

    /// Whether a step may run now, with no side effect (see [`GraphedModules::step`]).
    pub(super) fn check_step(&self) -> Result<()> {
        match &self.config.fused {
            None => {
                let module = self.modules.iter().map(|m| m.name()).collect::<Vec<_>>().join(", ");
                Err(Error::NotFused { module })
            }
            Some(fused) => fused.check(std::slice::from_ref(self)).map(drop),
        }
    }

    /// The graph of one step of the schedule (`None`: a pass that was not captured).
    fn step_graph(&self, step: &Step) -> Option<&Graph> {
        self.surfaces[step.chunk][step.microbatch].passes.get(step.pass).map(|p| &p.graph)
    }

    /// The graphs of the schedule in capture (and replay) order.
    pub(super) fn graphs_in_order(&self) -> Vec<&Graph> {
        self.config.schedule.steps().iter().filter_map(|step| self.step_graph(step)).collect()
    }

    /// The graphs a fused step runs: the schedule's, with the staging copies around them.
    fn fused_parts(&self) -> Vec<&Graph> {
        let mut v = Vec::new();
        for (i, step) in self.config.schedule.steps().iter().enumerate() {
            let (before, after) = self.config.staging.as_ref().map_or((None, None), |s| s.around(i));
            v.extend(before);
            v.extend(self.step_graph(step));
            v.extend(after);
        }
        v
    }

    /// Every buffer a fused step overwrites: the graphs' clobbers and the bound outputs.
    fn step_clobbers(&self) -> impl Iterator<Item = &Tensor> {
        let passes = self.surfaces.iter().flatten().flat_map(|s| s.passes.iter());
        let graphs = passes.flat_map(|p| &p.clobbers);
        graphs.chain(self.config.staging.iter().flat_map(|s| s.written()))
    }

    fn surface_checked(&self, chunk: usize, microbatch: usize) -> Result<&Surface> {
        let row = self.surfaces.get(chunk).ok_or(Error::ChunkOutOfRange { chunk, chunks: self.surfaces.len() })?;
        row.get(microbatch)
            .ok_or_else(|| ScheduleError::MicrobatchOutOfRange { microbatch, microbatches: row.len() }.into())
    }

    /// Fresh handles to one part of the surfaces of (chunk, microbatch): the fused step's
    /// bound buffers where it has them (see `staging`), the static buffers otherwise.
    fn handles(
        &self,
        chunk: usize,
        microbatch: usize,
        part: impl Fn(&Surface) -> &Vec<Option<Tensor>>,
        bound: impl Fn(&Bound) -> &Vec<Option<Tensor>>,
    ) -> Result<Vec<Option<Tensor>>> {
        let s = part(self.surface_checked(chunk, microbatch)?);
        let b = self.config.staging.as_ref().and_then(|st| st.bound(chunk, microbatch)).map(bound);
        let pick = |i: usize, t: &Option<Tensor>| b.and_then(|b| b.get(i).cloned().flatten()).or_else(|| t.clone());
        Ok(s.iter().enumerate().map(|(i, t)| pick(i, t).as_ref().map(Tensor::refreshed)).collect())
    }

    /// Checks `given` against slots `from..` of one part of the step's buffers of (chunk,
    /// microbatch) (bound where the step has its own, as [`GraphedModules::static_inputs`]
    /// hands out), for a microbatch of real size `len` with shape buckets, adding the copies
    /// a step needs to `copies`; allocates nothing else.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn check_step_slots(
        &self,
        (chunk, microbatch): (usize, usize),
        kind: crate::SlotKind,
        part: impl Fn(&Surface) -> &Vec<Option<Tensor>>,
        bound: impl Fn(&Bound) -> &Vec<Option<Tensor>>,
        (from, len): (usize, Option<super::buckets::Lens>),
        given: &[Option<Tensor>],
        copies: &mut Vec<CopyIn>,
    ) -> Result<()> {
        let surface = self.surface_checked(chunk, microbatch)?;
        let (s, label) = (part(surface), &surface.label);
        let b = self.config.staging.as_ref().and_then(|st| st.bound(chunk, microbatch)).map(bound);
        let slots: Vec<Option<Tensor>> = (0..s.len())
            .map(|index| b.and_then(|b| b.get(index)).filter(|t| t.is_some()).unwrap_or(&s[index]).clone())
            .collect();
        let at = SlotsAt { chunk, module: label, kind, from, len, requires_grad: false };
        copies.extend(self.copies_in(at, given, &slots)?);
        Ok(())
    }

    /// The static inputs of (chunk, microbatch): write a step's inputs into them (`copy_`,
    /// `copy_from_slice`) before [`GraphedModules::step`]. Microbatches that share surfaces
    /// (`GraphOptions::reuse_buffers`) share these until the step is fused, then each has its own.
    pub fn static_inputs(&self, chunk: usize, microbatch: usize) -> Result<Vec<Option<Tensor>>> {
        self.handles(chunk, microbatch, |s| &s.inputs, |b| &b.inputs)
    }

    /// The static grad outputs of (chunk, microbatch) (`None` for outputs that get no grad);
    /// shared like [`GraphedModules::static_inputs`].
    pub fn static_grad_outputs(&self, chunk: usize, microbatch: usize) -> Result<Vec<Option<Tensor>>> {
        self.handles(chunk, microbatch, |s| &s.grad_outputs, |b| &b.grad_outputs)
    }

    /// Handles to the static outputs of (chunk, microbatch) as the last replay left them (once
    /// fused, for microbatches sharing surfaces: as the last step left them).
    pub fn outputs(&self, chunk: usize, microbatch: usize) -> Result<Vec<Option<Tensor>>> {
        self.handles(chunk, microbatch, |s| &s.outputs, |b| &b.outputs)
    }

    /// Handles to the grads of the inputs of (chunk, microbatch) as the last replay left them
    /// (as [`GraphedModules::outputs`]).
    pub fn grad_inputs(&self, chunk: usize, microbatch: usize) -> Result<Vec<Option<Tensor>>> {
        self.handles(chunk, microbatch, |s| &s.grad_inputs, |b| &b.grad_inputs)
    }
}
