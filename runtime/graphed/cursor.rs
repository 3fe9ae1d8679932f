//! Where an iteration stands: the one owner of replay order.
//!
//! A captured schedule replays as a cycle of its steps. The [`Cursor`] knows which step comes
//! next, which microbatch each chunk's next forward runs, and per chunk the microbatches
//! waiting for their backward and for their deferred weight grads (first in, first out).
//! Every graphed call goes through it the same way, whether a forward, a backward or weight
//! grads: [`Cursor::admit`] checks and changes nothing; the call acts (copies in, launches);
//! [`Cursor::commit`] then moves the cursor on. A fused step, a whole iteration at once, does
//! the same with [`Cursor::admit_step`] and [`Cursor::commit_step`]. A refused call leaves the
//! cursor where it was.
//!
//! The schedule's order is the cursor's: a step is admitted when it is the one expected next,
//! or when it is the schedule's first step (which abandons an iteration left half-way). The
//! pool keeps a capture order of its own, which raw graphs sharing it follow; `admit` also
//! takes the pool's ticket for the step's graph, so that when other captures share the pool
//! (`GraphOptions::pool`) their graphs and these keep to the order memory was lent in.
//!
//! Calls in the mode the graphs were not captured for run eagerly: they queue their context
//! for the backward and weight grads, but do not move through the schedule.

use std::collections::VecDeque;

use super::schedule::{Pass, Schedule, Step};
use super::surface::Surface;
use crate::pool::ReplayTicket;
use crate::{Cx, Error, Result};

/// A microbatch waiting for its backward or weight grads: graphed (its microbatch's graphs
/// hold what the forward saved), or run eagerly (its context holds it).
pub(super) enum Pending {
    Graphed(usize),
    Eager(Cx),
}

/// The replay state of one captured schedule (of one shape bucket, with buckets).
pub(super) struct Cursor {
    /// Index into the schedule's steps of the step expected next.
    at: usize,
    /// Per chunk: the microbatch its next forward runs.
    next_forward: Vec<usize>,
    /// Per chunk: microbatches whose forward ran and whose backward has not.
    backward: Vec<VecDeque<Pending>>,
    /// Per chunk: microbatches whose backward ran and whose deferred weight grads have not.
    wgrad: Vec<VecDeque<Pending>>,
}

/// A step the cursor admitted: it may launch now.
#[must_use]
pub(super) struct Admitted {
    step: Step,
    /// The step expected after this one.
    next: usize,
    /// Whether the step starts the schedule over with an iteration half-way.
    restarts: bool,
    ticket: ReplayTicket,
}

/// An admitted step whose graph has launched, for [`Cursor::commit`].
#[must_use]
pub(super) struct Launched {
    step: Step,
    next: usize,
    restarts: bool,
}

impl Admitted {
    /// The step admitted.
    pub(super) fn step(&self) -> Step {
        self.step
    }

    /// Launches the admitted step's graph; the pool's order moves past it.
    pub(super) fn launch(self, surfaces: &mut [Vec<Surface>]) -> Result<Launched> {
        let Step { pass, chunk, microbatch } = self.step;
        let s = &mut surfaces[chunk][microbatch];
        let label = &s.label;
        let graph = s.passes.get_mut(pass).ok_or_else(|| Error::NotCaptured { graph: format!("{label} {pass:?}") })?;
        let pool_restarted = graph.graph.launch(self.ticket)?;
        Ok(Launched { step: self.step, next: self.next, restarts: self.restarts || pool_restarted })
    }
}

impl Cursor {
    /// At the start of an iteration, nothing waiting.
    pub(super) fn new(chunks: usize) -> Cursor {
        Cursor {
            at: 0,
            next_forward: vec![0; chunks],
            backward: (0..chunks).map(|_| VecDeque::new()).collect(),
            wgrad: (0..chunks).map(|_| VecDeque::new()).collect(),
        }
    }

    /// The microbatch `chunk`'s next forward runs.
    pub(super) fn next_forward(&self, chunk: usize) -> usize {
        self.next_forward[chunk]
    }

    /// The oldest microbatch of `chunk` waiting for `pass` (backward or weight grads).
    pub(super) fn front(&self, chunk: usize, pass: Pass) -> Option<&Pending> {
        self.queue(chunk, pass)?.front()
    }

    fn queue(&self, chunk: usize, pass: Pass) -> Option<&VecDeque<Pending>> {
        match pass {
            Pass::Forward => None,
            Pass::Backward => self.backward.get(chunk),
            Pass::Wgrad => self.wgrad.get(chunk),
        }
    }

    /// Where the iteration stands, as a value that any replay or eager call changes: the step
    /// expected next and the microbatches waiting.
    pub(super) fn position(&self) -> (usize, usize) {
        (self.at, self.waiting())
    }

    /// Microbatches waiting for their backward or weight grads, over all chunks.
    pub(super) fn waiting(&self) -> usize {
        self.backward.iter().chain(&self.wgrad).map(VecDeque::len).sum()
    }

    /// Back to the start of an iteration with nothing waiting (an abandoned iteration).
    pub(super) fn reset(&mut self) {
        self.at = 0;
        self.next_forward.fill(0);
        self.backward.iter_mut().chain(&mut self.wgrad).for_each(VecDeque::clear);
    }

    /// Whether `step` may replay now, with no side effect: it is the step the schedule
    /// expects next, or the schedule's first step (abandoning an iteration half-way); and
    /// the pool, which other captures may share, lets its graph replay now.
    pub(super) fn admit(&self, schedule: &Schedule, surfaces: &[Vec<Surface>], step: Step) -> Result<Admitted> {
        let Some((next, restarts)) = self.turn(schedule, step) else {
            return Err(out_of_turn(schedule, surfaces, step, self.at));
        };
        let s = &surfaces[step.chunk][step.microbatch];
        let pass = s.passes.get(step.pass);
        let graph = pass.ok_or_else(|| Error::NotCaptured { graph: format!("{} {:?}", s.label, step.pass) })?;
        let ticket = graph.graph.check_replay()?;
        Ok(Admitted { step, next, restarts, ticket })
    }

    /// The schedule's rule for `step` now: `Some((next, restarts))` when it may run (`next`
    /// the step expected after it; `restarts` when it starts the schedule over with an
    /// iteration half-way), `None` when it is out of turn.
    fn turn(&self, schedule: &Schedule, step: Step) -> Option<(usize, bool)> {
        let steps = schedule.steps();
        let after = |i: usize| (i + 1) % steps.len();
        if steps.get(self.at) == Some(&step) {
            Some((after(self.at), false))
        } else if steps.first() == Some(&step) {
            Some((after(0), true))
        } else {
            None
        }
    }

    /// Moves past a launched step: the order, the chunk's next forward, the queues. An
    /// iteration abandoned half-way is dropped first (its microbatches can no longer run
    /// backward). Returns whether that happened: the caller's handed-out buffers go stale.
    pub(super) fn commit(&mut self, schedule: &Schedule, launched: Launched) -> bool {
        let Launched { step: Step { pass, chunk, microbatch }, next, restarts } = launched;
        if restarts {
            self.reset();
        }
        self.at = next;
        match pass {
            Pass::Forward => {
                self.next_forward[chunk] = (microbatch + 1) % schedule.microbatches();
                if schedule.has_backward() {
                    self.backward[chunk].push_back(Pending::Graphed(microbatch));
                }
            }
            Pass::Backward => self.backward_done(schedule, chunk, Pending::Graphed(microbatch)),
            Pass::Wgrad => {
                self.wgrad[chunk].pop_front();
            }
        }
        restarts
    }

    /// After an eager forward in training mode: its context waits for the backward.
    pub(super) fn eager_forward(&mut self, chunk: usize, cx: Cx) {
        self.backward[chunk].push_back(Pending::Eager(cx));
    }

    /// After an eager backward on the front context of `chunk`: it leaves the queue, and
    /// waits for its weight grads where those are deferred.
    pub(super) fn eager_backward(&mut self, schedule: &Schedule, chunk: usize, cx: Cx) {
        self.backward_done(schedule, chunk, Pending::Eager(cx));
    }

    /// After eager weight grads on the front context of `chunk`.
    pub(super) fn eager_wgrad(&mut self, chunk: usize) {
        self.wgrad[chunk].pop_front();
    }

    fn backward_done(&mut self, schedule: &Schedule, chunk: usize, done: Pending) {
        self.backward[chunk].pop_front();
        if schedule.defers(chunk) {
            self.wgrad[chunk].push_back(done);
        }
    }

    /// Whether a fused step (a whole iteration) may run now: refused, with the number of
    /// microbatches waiting, while per-call replays are half-way through an iteration (a
    /// microbatch waits for its backward or weight grads, or a chunk's forwards have run for
    /// some of its microbatches only).
    pub(super) fn admit_step(&self) -> std::result::Result<(), usize> {
        let waiting = self.waiting();
        if waiting > 0 || self.next_forward.iter().any(|&n| n != 0) {
            return Err(waiting);
        }
        Ok(())
    }

    /// After a fused step: the next iteration starts at the schedule's first step.
    pub(super) fn commit_step(&mut self) {
        self.at = 0;
    }
}

/// The refusal of `step` when the schedule expects step `at`.
#[cold]
fn out_of_turn(schedule: &Schedule, surfaces: &[Vec<Surface>], step: Step, at: usize) -> Error {
    let label = |s: &Step| {
        let surface = &surfaces[s.chunk][s.microbatch];
        surface.passes.get(s.pass).map_or_else(|| format!("{} {:?}", surface.label, s.pass), |p| p.graph.label().into())
    };
    let expected = schedule.steps().get(at).map(label).unwrap_or_default();
    let order = schedule.steps().iter().map(label).collect();
    Error::ReplayOrder { got: label(&step), expected, order }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graphed::OrderEntry;

    fn schedule(order: &[OrderEntry], chunks: usize) -> Schedule {
        Schedule::new(Some(order), chunks, true).unwrap()
    }

    /// Admits and commits `step` as a launch would.
    fn run(cursor: &mut Cursor, schedule: &Schedule, step: Step) -> Option<bool> {
        let (next, restarts) = cursor.turn(schedule, step)?;
        Some(cursor.commit(schedule, Launched { step, next, restarts }))
    }

    fn step(pass: Pass, chunk: usize, microbatch: usize) -> Step {
        Step { pass, chunk, microbatch }
    }

    fn waiting(cursor: &Cursor, chunk: usize, pass: Pass) -> Vec<usize> {
        let queue = cursor.queue(chunk, pass).into_iter().flatten();
        queue.map(|p| if let Pending::Graphed(m) = p { *m } else { usize::MAX }).collect()
    }

    #[test]
    fn a_whole_iteration_in_order_comes_back_to_the_start() {
        let s = schedule(&OrderEntry::from_ints(&[1, 2, 1, 2, -2, -1, -2, -1]), 2);
        let mut cursor = Cursor::new(2);
        for (i, &st) in s.steps().iter().enumerate() {
            assert_eq!(run(&mut cursor, &s, st), Some(false), "step {i}");
            assert_eq!(cursor.admit_step().is_ok(), i + 1 == s.steps().len(), "step {i}");
        }
        assert_eq!((cursor.at, cursor.waiting()), (0, 0));
    }

    #[test]
    fn out_of_turn_is_refused_and_the_first_step_starts_over() {
        let s = schedule(&OrderEntry::from_ints(&[1, 2, -2, -1]), 2);
        let mut cursor = Cursor::new(2);
        assert_eq!(run(&mut cursor, &s, step(Pass::Forward, 1, 0)), None, "chunk 2 before chunk 1");
        assert_eq!(run(&mut cursor, &s, step(Pass::Forward, 0, 0)), Some(false));
        assert_eq!(waiting(&cursor, 0, Pass::Backward), [0]);
        assert_eq!(run(&mut cursor, &s, step(Pass::Backward, 0, 0)), None, "backward of chunk 1 first");
        assert_eq!(cursor.at, 1, "a refusal moves nothing");
        // The first step again abandons the iteration: chunk 1's first microbatch is
        // queued once, not twice.
        assert_eq!(run(&mut cursor, &s, step(Pass::Forward, 0, 0)), Some(true));
        assert_eq!((cursor.at, waiting(&cursor, 0, Pass::Backward)), (1, vec![0]));
    }

    #[test]
    fn deferred_weight_grads_wait_in_their_own_queue() {
        let (f, b, w) = (OrderEntry::Forward, OrderEntry::Backward, OrderEntry::Wgrad);
        let s = schedule(&[f(1), f(1), b(1), b(1), w(1), w(1)], 1);
        let mut cursor = Cursor::new(1);
        for &st in &s.steps()[..4] {
            assert_eq!(run(&mut cursor, &s, st), Some(false));
        }
        assert_eq!(waiting(&cursor, 0, Pass::Wgrad), [0, 1]);
        assert_eq!(cursor.admit_step(), Err(2), "a fused step waits for the weight grads");
        assert_eq!(run(&mut cursor, &s, step(Pass::Wgrad, 0, 1)), None, "first in, first out");
        assert_eq!(run(&mut cursor, &s, step(Pass::Wgrad, 0, 0)), Some(false));
        assert_eq!(run(&mut cursor, &s, step(Pass::Wgrad, 0, 1)), Some(false));
        assert_eq!((cursor.at, cursor.admit_step()), (0, Ok(())));
    }

    #[test]
    fn a_forward_only_schedule_queues_no_backward() {
        let s = Schedule::new(Some(&OrderEntry::from_ints(&[1, -1, 1, -1])), 1, false).unwrap();
        let mut cursor = Cursor::new(1);
        assert_eq!(run(&mut cursor, &s, step(Pass::Forward, 0, 0)), Some(false));
        assert_eq!((cursor.waiting(), cursor.next_forward(0)), (0, 1));
        assert_eq!(cursor.admit_step(), Err(0), "half-way through the microbatches");
        assert_eq!(run(&mut cursor, &s, step(Pass::Forward, 0, 1)), Some(false));
        assert_eq!((cursor.at, cursor.next_forward(0), cursor.admit_step()), (0, 0, Ok(())));
    }
}
