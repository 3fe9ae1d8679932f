//! Whole-chain calls: one microbatch through every chunk of a chained capture
//! (`GraphOptions::chained`), the calls a `#[graphed(chained)]` struct's typed `forward`,
//! `backward` and `step` make.
//!
//! Each chunk's graph is replayed by the ordinary per-chunk call, so the checks, the copies
//! (none between chunks: chunk `c + 1`'s static input *is* chunk `c`'s static output) and the
//! stale-handle rules are those of [`GraphedModules::forward`] and
//! [`GraphedModules::backward`]. What the whole call adds is checked before the first chunk
//! runs: the capture is chained, the schedule runs each microbatch through the chain back to
//! back, and the last chunk's extra inputs fit its surface.

use super::buckets::{CopyIn, Lens, Route, SlotsAt};
use super::staging::Bound;
use super::surface::Surface;

fn inp(s: &Surface) -> &Vec<Option<Tensor>> {
    &s.inputs
}
fn inp_b(b: &Bound) -> &Vec<Option<Tensor>> {
    &b.inputs
}
fn gr(s: &Surface) -> &Vec<Option<Tensor>> {
    &s.grad_outputs
}
fn gr_b(b: &Bound) -> &Vec<Option<Tensor>> {
    &b.grad_outputs
}
use super::GraphedModules;
use crate::{Error, Result, ScheduleError, SlotKind, Tensor};

/// Where a whole-chain backward that failed partway resumes: the chunk whose backward failed,
/// the grad output it was given, and where the iteration stood then (any call since changes it).
pub(super) struct Resume {
    chunk: usize,
    grad: Tensor,
    position: (usize, usize),
    bucket: Option<usize>,
}

impl GraphedModules {
    /// The first slot of chunk `c`'s result: what a chained chunk hands the next one.
    #[inline]
    /// `grad`: the slots are input grads (a backward's), not outputs.
    fn first_slot(&self, slots: Vec<Option<Tensor>>, c: usize, grad: bool) -> Result<Tensor> {
        match slots.into_iter().next() {
            Some(Some(t)) => Ok(t),
            _ => Err(self.nothing_to_hand_on(c, grad)),
        }
    }

    #[cold]
    fn nothing_to_hand_on(&self, c: usize, grad: bool) -> Error {
        ScheduleError::NothingToHandOn { module: self.modules[c].name().into(), grad }.into()
    }

    /// The chunks were captured chained and the schedule runs whole chains.
    fn check_chain(&self, call: &'static str) -> Result<()> {
        if !self.config.options.chained {
            return Err(ScheduleError::NotChained { call }.into());
        }
        if !self.config.whole_chains {
            return Err(ScheduleError::NotWholeChains { call }.into());
        }
        Ok(())
    }

    /// The forward of every chunk for the next microbatch, as one call: `inputs` are the first
    /// chunk's, `extras` the last chunk's inputs after its first (the previous chunk's output),
    /// such as a loss head's labels. Returns the last chunk's outputs (fresh handles to its
    /// static outputs, as [`GraphedModules::forward`] does).
    ///
    /// Checked before anything runs: a chained capture whose schedule runs whole chains, the
    /// first chunk's inputs and the last chunk's extras (arity, shape, dtype, device,
    /// staleness). A refused call changes nothing.
    pub fn forward_chain(
        &mut self,
        inputs: &[Option<Tensor>],
        extras: &[Option<Tensor>],
    ) -> Result<Vec<Option<Tensor>>> {
        self.check_chain("forward_chain")?;
        let last = self.modules.len() - 1;
        if last == 0 {
            if !extras.is_empty() {
                let module = self.modules[0].name().into();
                return Err(Error::Arity {
                    module,
                    kind: SlotKind::Input,
                    expected: inputs.len(),
                    got: inputs.len() + extras.len(),
                });
            }
            return self.forward(0, inputs);
        }
        let route = if self.training == self.captured_training { self.route(0, inputs)? } else { Route::Plain };
        let (bucket, len) = match route {
            Route::Plain => (None, None),
            Route::Bucket { index, len } => (Some(index), Some(len)),
            Route::Eager { len } => return self.eager_chain(inputs, extras, len),
        };
        // In a bucket, the first chunk's inputs are checked with the extras, inside the bucket
        // switch: a refused call leaves the bucket that was active (and its pending backwards).
        let first = match bucket {
            Some(index) => Some(self.in_bucket(index, |g| {
                g.check_extras(last, extras, len)?;
                g.check_forward(0, inputs, len)
            })?),
            None => {
                self.check_extras(last, extras, None)?;
                None
            }
        };
        let step = |g: &mut Self, c: usize, slots: &[Option<Tensor>], trim: bool| match (bucket, len) {
            (Some(index), Some(len)) => g.forward_in_bucket(c, slots, index, len, trim),
            _ => g.forward(c, slots),
        };
        let outputs = match first {
            Some(plan) => self.forward_planned(0, plan, len, false)?,
            None => step(self, 0, inputs, false)?,
        };
        let mut h = self.first_slot(outputs, 0, false)?;
        for c in 1..last {
            let outputs = step(self, c, &[Some(h)], false)?;
            h = self.first_slot(outputs, c, false)?;
        }
        // The last chunk's slots, in a buffer kept between calls (no allocation per step).
        let mut slots = std::mem::take(&mut self.chain_slots);
        slots.clear();
        slots.push(Some(h));
        slots.extend_from_slice(extras);
        let outputs = step(self, last, &slots, true);
        slots.clear();
        self.chain_slots = slots;
        outputs
    }

    /// A whole-chain forward above the largest shape bucket, run eagerly chunk by chunk.
    fn eager_chain(
        &mut self,
        inputs: &[Option<Tensor>],
        extras: &[Option<Tensor>],
        len: Lens,
    ) -> Result<Vec<Option<Tensor>>> {
        let last = self.modules.len() - 1;
        let outputs = self.eager_forward(0, inputs, Some(len))?;
        let mut h = self.first_slot(outputs, 0, false)?;
        for c in 1..last {
            let outputs = self.eager_forward(c, &[Some(h)], Some(len))?;
            h = self.first_slot(outputs, c, false)?;
        }
        let mut slots = vec![Some(h)];
        slots.extend_from_slice(extras);
        self.eager_forward(last, &slots, Some(len))
    }

    /// The last chunk's extras against the surface its next forward replays on.
    fn check_extras(&self, last: usize, extras: &[Option<Tensor>], len: Option<Lens>) -> Result<()> {
        let s = &self.surfaces[last][self.cursor.next_forward(last)];
        if extras.len() + 1 != s.inputs.len() {
            let (expected, got) = (s.inputs.len(), extras.len() + 1);
            return Err(Error::Arity { module: s.label.clone(), kind: SlotKind::Input, expected, got });
        }
        if self.training != self.captured_training {
            return Ok(());
        }
        let at = SlotsAt {
            chunk: last,
            module: &s.label,
            kind: SlotKind::Input,
            from: 1,
            len,
            requires_grad: self.captured_training,
        };
        self.copies_in(at, extras, &s.inputs).map(drop)
    }

    /// The backward of every chunk for the oldest outstanding microbatch, last chunk first, as
    /// one call: `grad_outputs` are the last chunk's; each earlier chunk's grad output is the
    /// next chunk's input grad (the same buffer: no copy). Returns the first chunk's input
    /// grads. The last chunk's own call checks `grad_outputs` before anything runs.
    ///
    /// One call is a replay a chunk, so one can fail (a failed launch) after the later chunks'
    /// backwards ran and their parameter grads accumulated. The next call, with nothing run in
    /// between, resumes at the chunk that failed (its grad output is still the next chunk's
    /// input grad; `grad_outputs` is then not read), so every chunk's grads accumulate once, as
    /// in a call that never failed. Any other call in between gives the resumption up.
    pub fn backward_chain(&mut self, grad_outputs: &[Option<Tensor>]) -> Result<Vec<Option<Tensor>>> {
        self.check_chain("backward_chain")?;
        let last = self.modules.len() - 1;
        // Where the iteration stands is computed only when a failed call left a resumption.
        let resume = self.chain_resume.take().filter(|r| (r.position, r.bucket) == self.resume_point());
        let (top, mut d) = match resume {
            Some(r) => (r.chunk, r.grad),
            None => {
                let grads = self.backward_trimmed(last, grad_outputs, last == 0)?;
                if last == 0 {
                    return Ok(grads);
                }
                (last - 1, self.first_slot(grads, last, true)?)
            }
        };
        for c in (0..=top).rev() {
            // The grad output goes in a slot of its own, taken back (not copied) for a resumption.
            let slot = [Some(d)];
            let grads = match self.backward_trimmed(c, &slot, c == 0) {
                Ok(grads) => grads,
                Err(e) => {
                    let (position, bucket) = self.resume_point();
                    let [Some(grad)] = slot else { return Err(e) };
                    self.chain_resume = Some(Box::new(Resume { chunk: c, grad, position, bucket }));
                    return Err(e);
                }
            };
            if c == 0 {
                return Ok(grads);
            }
            d = self.first_slot(grads, c, true)?;
        }
        unreachable!("the loop returns at chunk 0")
    }

    /// Where the iteration stands, as a resumption records it (see [`Resume`]).
    fn resume_point(&self) -> ((usize, usize), Option<usize>) {
        (self.cursor.position(), self.active_bucket_index())
    }

    /// One fused step ([`GraphedModules::step`]) of a chained capture, on per-microbatch
    /// inputs: for each microbatch `m`, `inputs[m]` for the first chunk, `extras[m]` for the
    /// last chunk's inputs after its first, `grad_outputs[m]` for the last chunk's grad outputs.
    /// They are copied into the step's bound buffers (unless one already is that buffer); the
    /// last chunk's outputs of every microbatch come back.
    ///
    /// Everything is checked before the first copy: the step is fused and may run now (as
    /// [`GraphedModules::step`] checks), one entry per microbatch, and each tensor against its
    /// buffer (arity, shape, dtype, device, staleness). A refused step changes nothing.
    pub fn step_chain(
        &mut self,
        inputs: &[&[Option<Tensor>]],
        extras: &[&[Option<Tensor>]],
        grad_outputs: &[&[Option<Tensor>]],
    ) -> Result<Vec<Vec<Option<Tensor>>>> {
        if !self.config.options.chained {
            return Err(ScheduleError::NotChained { call: "step_chain" }.into());
        }
        let (last, microbatches) = (self.modules.len() - 1, self.microbatches());
        for (what, given) in [("inputs", inputs.len()), ("extras", extras.len()), ("grad outputs", grad_outputs.len())]
        {
            if given != microbatches {
                return Err(ScheduleError::MicrobatchSets { call: "step_chain", what, given, microbatches }.into());
            }
        }
        // With shape buckets: each microbatch's real size, and the bucket of the largest.
        let mut lens = Vec::with_capacity(microbatches);
        let mut bucket = None;
        for set in inputs {
            match self.route(0, set)? {
                Route::Plain => lens.push(None),
                Route::Bucket { index, len } => {
                    lens.push(Some(len));
                    bucket = bucket.max(Some(index));
                }
                Route::Eager { .. } => return self.eager_steps(inputs, extras, grad_outputs),
            }
        }
        let check = |g: &mut Self| -> Result<Vec<CopyIn>> {
            let mut copies = Vec::new();
            let (input, grad) = (SlotKind::Input, SlotKind::GradOutput);
            for (m, &len) in lens.iter().enumerate() {
                g.check_step_slots((0, m), input, inp, inp_b, (0, len), inputs[m], &mut copies)?;
                // The last chunk's first input is the previous chunk's output: only its extras.
                let from = if last > 0 { 1 } else { inputs[m].len() };
                g.check_step_slots((last, m), input, inp, inp_b, (from, len), extras[m], &mut copies)?;
                g.check_step_slots((last, m), grad, gr, gr_b, (0, len), grad_outputs[m], &mut copies)?;
            }
            g.check_step()?;
            Ok(copies)
        };
        let copies = match bucket {
            None => check(self)?,
            Some(index) => {
                if self.active_bucket_index() != Some(index) {
                    self.check_step()?; // the bucket left must not be half-way through either
                }
                self.in_bucket(index, check)?
            }
        };
        for (m, len) in lens.iter().enumerate() {
            for c in 0..=last {
                self.set_length(c, m, *len)?;
            }
        }
        self.step_copying(&copies)?;
        let outputs = (0..microbatches).map(|m| self.outputs(last, m));
        outputs.zip(&lens).map(|(o, len)| self.trim(last, SlotKind::GradOutput, o?, *len)).collect()
    }

    /// A fused step above the largest shape bucket ([`crate::AboveLargest::Eager`]): each
    /// microbatch's forward and backward through the chain, eagerly.
    fn eager_steps(
        &mut self,
        inputs: &[&[Option<Tensor>]],
        extras: &[&[Option<Tensor>]],
        grad_outputs: &[&[Option<Tensor>]],
    ) -> Result<Vec<Vec<Option<Tensor>>>> {
        self.check_step()?;
        let mut outputs = Vec::with_capacity(inputs.len());
        for m in 0..inputs.len() {
            outputs.push(self.forward_chain(inputs[m], extras[m])?);
            self.backward_chain(grad_outputs[m])?;
        }
        Ok(outputs)
    }
}
