//! Graphed calls: forward and backward of one chunk.
//!
//! Every call is checked completely first (chunk, arity, each tensor's presence, device,
//! dtype, shape, staleness and requires-grad, then the cursor: the waiting microbatches and
//! the schedule's order) and only then acts (copies inputs in, launches), after which the
//! cursor commits (the order advances, the queues change) and overwritten handles go stale.
//! A refused call changes nothing, so the step can continue with correct calls.

use super::buckets::{CopyIn, Lens, Route, SlotsAt};
use super::cursor::{Admitted, Pending};
use super::schedule::{Pass, Step};
use super::{new_cx, GraphedModules};
use crate::{Cx, Error, HookKind, Result, Slot, SlotKind, Tensor};

/// A checked call, ready to act: the copies into static buffers, the real sizes a forward
/// records with shape buckets, and the cursor's admission.
pub(super) struct Plan {
    copies: Vec<CopyIn>,
    len: Option<Lens>,
    admitted: Admitted,
}

impl Plan {
    /// A call with nothing to copy in (weight grads): the admitted launch alone.
    pub(super) fn launch_only(admitted: Admitted) -> Plan {
        Plan { copies: Vec::new(), len: None, admitted }
    }
}

/// Checks one given tensor against its static buffer; both when a replay must copy it in.
pub(super) fn check_slot<'a>(
    module: &str,
    slot: Slot,
    x: &'a Option<Tensor>,
    st: &'a Option<Tensor>,
    check_requires_grad: bool,
) -> Result<Option<(&'a Tensor, &'a Tensor)>> {
    let kind = slot.kind;
    let (x, st) = match (x, st) {
        (Some(x), Some(st)) => (x, st),
        (None, None) => return Ok(None),
        // A grad for an output captured as None is ignored (semantics 6).
        (Some(_), None) if kind == SlotKind::GradOutput => return Ok(None),
        (x, st) => {
            let _ = x;
            return Err(Error::SlotPresence { module: module.into(), slot, captured_some: st.is_some() });
        }
    };
    if x.device() != st.device() {
        return Err(Error::SlotDevice {
            module: module.into(),
            slot,
            expected: st.device().name(),
            got: x.device().name(),
        });
    }
    if x.dtype() != st.dtype() {
        return Err(Error::SlotDType { module: module.into(), slot, expected: st.dtype(), got: x.dtype() });
    }
    if x.dims() != st.dims() {
        return Err(Error::SlotShape {
            module: module.into(),
            slot,
            expected: st.dims().to_vec(),
            got: x.dims().to_vec(),
        });
    }
    x.check_fresh()?;
    // An input may require a grad only where the capture's sample did (the graphs compute
    // no grad for it otherwise).
    if check_requires_grad && x.requires_grad() && !st.requires_grad() {
        return Err(Error::SlotRequiresGrad { module: module.into(), slot });
    }
    Ok((!x.same_buffer(st)).then_some((x, st)))
}

impl GraphedModules {
    pub(super) fn check_chunk(&self, chunk: usize) -> Result<()> {
        if chunk >= self.modules.len() {
            return Err(Error::ChunkOutOfRange { chunk, chunks: self.modules.len() });
        }
        Ok(())
    }

    /// Runs the forward of `chunk` for its next microbatch: copies each input into its static
    /// input (unless it already is that buffer), replays, and returns the static outputs.
    /// In the mode other than the one captured, runs the module eagerly.
    ///
    /// Refused calls (wrong arity, shape, dtype, device, a stale handle, an input that needs a
    /// grad the capture does not compute, out of replay order) change nothing.
    ///
    /// There is no context argument: the graphs keep what each microbatch's forward saved (in
    /// their static memory, or in the context of an eager fallback) until its backward, so a
    /// caller has nothing to hold.
    pub fn forward(&mut self, chunk: usize, inputs: &[Option<Tensor>]) -> Result<Vec<Option<Tensor>>> {
        self.check_chunk(chunk)?;
        if self.training != self.captured_training {
            return self.eager_forward(chunk, inputs, None);
        }
        match self.route(chunk, inputs)? {
            Route::Plain => {
                let plan = self.check_forward(chunk, inputs, None)?;
                self.forward_planned(chunk, plan, None, true)
            }
            Route::Eager { len } => self.eager_forward(chunk, inputs, Some(len)),
            Route::Bucket { index, len } => self.forward_in_bucket(chunk, inputs, index, len, true),
        }
    }

    /// The forward of `chunk` in shape bucket `index` for a call of real size `len`; the
    /// outputs trimmed to it when `trim` (a whole-chain call hands the next chunk the
    /// bucket-sized static output instead).
    pub(super) fn forward_in_bucket(
        &mut self,
        chunk: usize,
        inputs: &[Option<Tensor>],
        index: usize,
        len: Lens,
        trim: bool,
    ) -> Result<Vec<Option<Tensor>>> {
        let plan = self.in_bucket(index, |g| g.check_forward(chunk, inputs, Some(len)))?;
        self.forward_planned(chunk, plan, Some(len), trim)
    }

    /// Acts on a checked forward; the static outputs.
    pub(super) fn forward_planned(
        &mut self,
        chunk: usize,
        plan: Plan,
        len: Option<Lens>,
        trim: bool,
    ) -> Result<Vec<Option<Tensor>>> {
        let m = self.replay(plan)?;
        let outputs = self.surfaces[chunk][m].outputs.iter().map(|o| o.as_ref().map(Tensor::refreshed)).collect();
        if trim {
            self.trim(chunk, SlotKind::GradOutput, outputs, len)
        } else {
            Ok(outputs)
        }
    }

    /// Acts on a checked call: copies its tensors in, records a forward's real sizes, launches
    /// the admitted step's graph and commits the cursor; every handle the replay overwrote
    /// goes stale. Returns the microbatch replayed.
    pub(super) fn replay(&mut self, plan: Plan) -> Result<usize> {
        let Plan { copies, len, admitted } = plan;
        let Step { pass, chunk, microbatch } = admitted.step();
        copies.iter().try_for_each(CopyIn::run)?;
        self.set_length(chunk, microbatch, len)?;
        let launched = admitted.launch(&mut self.surfaces)?;
        if self.cursor.commit(&self.config.schedule, launched) {
            // An iteration was abandoned half-way: its handles go stale (the cursor dropped
            // its microbatches, which can no longer run backward).
            self.invalidate_all();
        }
        if let Some(p) = self.surfaces[chunk][microbatch].passes.get(pass) {
            p.invalidate_clobbered();
        }
        Ok(microbatch)
    }

    /// Checks the forward of `chunk` for its next microbatch, with no side effect.
    pub(super) fn check_forward(&self, chunk: usize, inputs: &[Option<Tensor>], len: Option<Lens>) -> Result<Plan> {
        let microbatch = self.cursor.next_forward(chunk);
        let s = &self.surfaces[chunk][microbatch];
        let at = SlotsAt {
            chunk,
            module: &s.label,
            kind: SlotKind::Input,
            from: 0,
            len,
            requires_grad: self.captured_training,
        };
        let copies = self.copies_in(at, inputs, &s.inputs)?;
        let step = Step { pass: Pass::Forward, chunk, microbatch };
        let admitted = self.cursor.admit(&self.config.schedule, &self.surfaces, step)?;
        Ok(Plan { copies, len, admitted })
    }

    /// Runs the backward of `chunk` for its oldest outstanding microbatch: copies the grad
    /// outputs in (skipping `None` outputs),
    /// replays, and returns the grads of the inputs (`None` for inputs that need none).
    /// Parameter grads accumulate. A refused call changes nothing: the microbatch stays
    /// outstanding.
    pub fn backward(&mut self, chunk: usize, grad_outputs: &[Option<Tensor>]) -> Result<Vec<Option<Tensor>>> {
        self.backward_trimmed(chunk, grad_outputs, true)
    }

    /// [`GraphedModules::backward`]; with shape buckets, the grads of bucketed inputs trimmed
    /// to the forward's real size when `trim` (a whole-chain call hands the previous chunk
    /// the bucket-sized static grad instead).
    pub(super) fn backward_trimmed(
        &mut self,
        chunk: usize,
        grad_outputs: &[Option<Tensor>],
        trim: bool,
    ) -> Result<Vec<Option<Tensor>>> {
        self.check_chunk(chunk)?;
        let m = match self.cursor.front(chunk, Pass::Backward) {
            None if !self.has_backward && self.training == self.captured_training => {
                return Err(Error::ForwardOnly { module: self.modules[chunk].name().into() })
            }
            None => return Err(Error::NoPendingForward { module: self.modules[chunk].name().into() }),
            Some(Pending::Eager(cx)) => {
                let mut cx = cx.clone();
                let grads = self.eager_backward(chunk, &mut cx, grad_outputs)?;
                self.cursor.eager_backward(&self.config.schedule, chunk, cx);
                return Ok(grads);
            }
            Some(Pending::Graphed(m)) => *m,
        };
        let s = &self.surfaces[chunk][m];
        if s.passes.backward.is_none() {
            return Err(Error::ForwardOnly { module: s.label.clone() });
        }
        let len = self.real_length(chunk, m);
        let at = SlotsAt { chunk, module: &s.label, kind: SlotKind::GradOutput, from: 0, len, requires_grad: false };
        let copies = self.copies_in(at, grad_outputs, &s.grad_outputs)?;
        let step = Step { pass: Pass::Backward, chunk, microbatch: m };
        let admitted = self.cursor.admit(&self.config.schedule, &self.surfaces, step)?;
        // Act.
        self.replay(Plan { copies, len: None, admitted })?;
        let s = &self.surfaces[chunk][m];
        let grads = s.grad_inputs.iter().map(|g| g.as_ref().map(Tensor::refreshed)).collect();
        if trim {
            self.trim(chunk, SlotKind::Input, grads, len)
        } else {
            Ok(grads)
        }
    }

    /// An abandoned cycle: every handed-out buffer may be overwritten out of turn.
    pub(super) fn invalidate_all(&self) {
        for s in self.surfaces.iter().flatten() {
            for t in s.outputs.iter().chain(&s.grad_inputs).flatten() {
                t.bump_generation();
            }
        }
    }

    /// The module's own forward, with its hooks, for a call in the mode not captured.
    /// With shape buckets, `len` is the call's size (above the largest bucket), which the
    /// module reads from [`Cx::bucket_length`].
    pub(super) fn eager_forward(
        &mut self,
        chunk: usize,
        inputs: &[Option<Tensor>],
        len: Option<Lens>,
    ) -> Result<Vec<Option<Tensor>>> {
        let module = &self.modules[chunk];
        if inputs.len() != module.num_inputs() {
            let (expected, got) = (module.num_inputs(), inputs.len());
            return Err(Error::Arity { module: module.name().into(), kind: SlotKind::Input, expected, got });
        }
        self.config.run_hooks(&mut self.modules, chunk, HookKind::PreForward)?;
        let mut cx = new_cx(&self.device, self.training, inputs);
        if let Some(len) = len {
            cx.set_bucket_length(Some(self.eager_length(len)?));
        }
        let checkpointed = self.config.checkpointed[chunk];
        let outs = crate::checkpoint::forward_of(self.modules[chunk].as_ref(), checkpointed, &mut cx, inputs)?;
        self.config.run_hooks(&mut self.modules, chunk, HookKind::Forward)?;
        if self.training {
            self.cursor.eager_forward(chunk, cx);
        }
        Ok(outs)
    }

    fn eager_backward(
        &mut self,
        chunk: usize,
        cx: &mut Cx,
        grad_outputs: &[Option<Tensor>],
    ) -> Result<Vec<Option<Tensor>>> {
        self.config.run_hooks(&mut self.modules, chunk, HookKind::PreBackward)?;
        let deferred = self.config.schedule.defers(chunk);
        let checkpointed = self.config.checkpointed[chunk];
        let grads = super::wgrad::run_backward(self.modules[chunk].as_mut(), cx, grad_outputs, deferred, checkpointed)?;
        self.config.run_hooks(&mut self.modules, chunk, HookKind::Backward)?;
        Ok(grads)
    }
}
