//! The schedule of one iteration, validated once: which (chunk, microbatch) runs forward,
//! backward or deferred weight grads at each step. Warm-up, capture, replay (through the
//! cursor) and the docs all walk this one list.
//!
//! The run-time rules of an `order` live here: chunks in range, every backward after a
//! forward and every `w(c)` after a backward of its chunk (first in, first out), 2 x chunks x
//! M forward and backward entries with every chunk balanced, `w(c)` only for chunks that split
//! their backward and are not recomputed, and, for chained chunks, the data flow between
//! neighbours. The macro crate checks the same rules at compile time, on the tokens, so that
//! each error points at the entry at fault.

use super::OrderEntry;
use crate::{Module, Result, ScheduleError};

/// Forward, backward (the whole backward, or only its input-grad half when the chunk's
/// weight grads are deferred), or a deferred weight-grad half.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Pass {
    Forward,
    Backward,
    Wgrad,
}

impl OrderEntry {
    /// The pass and the 1-indexed chunk.
    pub(crate) fn parts(self) -> (Pass, usize) {
        match self {
            OrderEntry::Forward(c) => (Pass::Forward, c),
            OrderEntry::Backward(c) => (Pass::Backward, c),
            OrderEntry::Wgrad(c) => (Pass::Wgrad, c),
        }
    }
}

/// One step of an iteration: a pass of `chunk` (0-indexed) for `microbatch`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Step {
    pub(crate) pass: Pass,
    pub(crate) chunk: usize,
    pub(crate) microbatch: usize,
}

/// A validated schedule.
#[derive(Clone, Debug)]
pub(crate) struct Schedule {
    steps: Vec<Step>,
    microbatches: usize,
    /// Per chunk: whether the order has `w(c)` entries (its weight grads run as separate steps).
    deferred: Vec<bool>,
    /// Whether backwards are steps (training) or left out (a forward-only capture).
    backward: bool,
}

impl Schedule {
    /// Module order (forwards in order, backwards in reverse) without `order`; otherwise
    /// `order` checked entry by entry: `+c` the forward of chunk `c` for its next microbatch,
    /// `-c` the backward of its oldest outstanding one, `w(c)` the weight grads of its oldest
    /// microbatch whose backward ran but whose weight grads have not. Without training,
    /// backwards and weight grads are left out (forward-only capture) but still validated.
    pub(crate) fn new(order: Option<&[OrderEntry]>, chunks: usize, training: bool) -> Result<Schedule> {
        let Some(order) = order else {
            let forwards = (0..chunks).map(|c| Step { pass: Pass::Forward, chunk: c, microbatch: 0 });
            let backwards = (0..chunks).rev().map(|c| Step { pass: Pass::Backward, chunk: c, microbatch: 0 });
            let steps = if training { forwards.chain(backwards).collect() } else { forwards.collect() };
            return Ok(Schedule { steps, microbatches: 1, deferred: vec![false; chunks], backward: training });
        };
        let passes = order.iter().filter(|e| !matches!(e, OrderEntry::Wgrad(_))).count();
        if passes == 0 || passes % (2 * chunks) != 0 {
            return Err(ScheduleError::PassCount { passes, chunks }.into());
        }
        let microbatches = passes / (2 * chunks);
        // Per chunk: forwards, backwards and weight grads so far.
        let mut counts = vec![[0usize; 3]; chunks];
        let mut steps = Vec::with_capacity(order.len());
        for &e in order {
            let (pass, c) = e.parts();
            if c == 0 || c > chunks {
                return Err(ScheduleError::ChunkOutOfRange { chunk: c, chunks }.into());
            }
            let chunk = c - 1;
            let [fwd, bwd, wgrad] = counts[chunk];
            match pass {
                Pass::Backward if bwd >= fwd => return Err(ScheduleError::BackwardBeforeForward { chunk: c }.into()),
                Pass::Wgrad if wgrad >= bwd => return Err(ScheduleError::WgradBeforeBackward { chunk: c }.into()),
                _ => {}
            }
            let index = pass as usize;
            if training || pass == Pass::Forward {
                steps.push(Step { pass, chunk, microbatch: counts[chunk][index] });
            }
            counts[chunk][index] += 1;
        }
        for (c, [fwd, bwd, wgrad]) in counts.iter().enumerate() {
            if *fwd != microbatches || *bwd != microbatches || (*wgrad != 0 && *wgrad != microbatches) {
                let (chunk, forwards, backwards, wgrads) = (c + 1, *fwd, *bwd, *wgrad);
                return Err(ScheduleError::Unbalanced { chunk, forwards, backwards, wgrads, microbatches }.into());
            }
        }
        let deferred = counts.iter().map(|[_, _, wgrad]| *wgrad > 0).collect();
        Ok(Schedule { steps, microbatches, deferred, backward: training })
    }

    /// For chained chunks, the data flow: chunk `c + 1`'s forward of a microbatch needs chunk
    /// `c`'s output for it (its forward ran before), and chunk `c`'s backward needs chunk
    /// `c + 1`'s input grad (its backward ran before).
    pub(crate) fn check_chained_flow(&self) -> Result<()> {
        let chunks = self.deferred.len();
        let (mut fwd, mut bwd) = (vec![0usize; chunks], vec![0usize; chunks]);
        for step in &self.steps {
            let (c, m) = (step.chunk, step.microbatch);
            match step.pass {
                Pass::Forward if c > 0 && fwd[c - 1] <= m => {
                    return Err(ScheduleError::ChainedForward { chunk: c + 1, microbatch: m + 1 }.into())
                }
                Pass::Backward if c + 1 < chunks && bwd[c + 1] <= m => {
                    return Err(ScheduleError::ChainedBackward { chunk: c + 1, microbatch: m + 1 }.into())
                }
                Pass::Forward => fwd[c] += 1,
                Pass::Backward => bwd[c] += 1,
                Pass::Wgrad => {}
            }
        }
        Ok(())
    }

    /// `w(c)` entries only for chunks whose module splits its backward
    /// ([`Module::splits_backward`]) and that are not checkpointed (a recomputed chunk's
    /// activations live only inside its whole backward).
    pub(crate) fn check_modules(&self, modules: &[Box<dyn Module>], checkpointed: &[bool]) -> Result<()> {
        for (c, m) in modules.iter().enumerate() {
            let (chunk, module) = (c + 1, || m.name().to_string());
            if self.defers(c) && checkpointed.get(c).copied().unwrap_or(false) {
                return Err(ScheduleError::WgradCheckpointed { chunk, module: module() }.into());
            }
            if self.defers(c) && !m.splits_backward() {
                return Err(ScheduleError::WgradNotSplit { chunk, module: module() }.into());
            }
        }
        Ok(())
    }

    /// Whether every microbatch runs its forwards through all chunks back to back (chunk 1
    /// first) and its backwards back to back (the last chunk first), with no weight-grad steps:
    /// then one call can run a microbatch through the whole chain.
    pub(crate) fn runs_whole_chains(&self) -> bool {
        let chunks = self.deferred.len();
        let mut steps = self.steps.iter();
        while let Some(first) = steps.next() {
            let (pass, m) = (first.pass, first.microbatch);
            let order: Vec<usize> = match pass {
                Pass::Forward => (0..chunks).collect(),
                Pass::Backward => (0..chunks).rev().collect(),
                Pass::Wgrad => return false,
            };
            if first.chunk != order[0] {
                return false;
            }
            for &c in &order[1..] {
                match steps.next() {
                    Some(s) if s.pass == pass && s.chunk == c && s.microbatch == m => {}
                    _ => return false,
                }
            }
        }
        true
    }

    /// The steps of one iteration, in order.
    pub(crate) fn steps(&self) -> &[Step] {
        &self.steps
    }

    /// Microbatches per chunk.
    pub(crate) fn microbatches(&self) -> usize {
        self.microbatches
    }

    /// Whether the iteration has backward steps (false for a forward-only capture).
    pub(crate) fn has_backward(&self) -> bool {
        self.backward
    }

    /// Whether `chunk`'s weight grads are separate steps (`w(c)` entries).
    pub(crate) fn defers(&self, chunk: usize) -> bool {
        self.deferred.get(chunk).copied().unwrap_or(false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn new(order: &[i32], chunks: usize) -> Result<Schedule> {
        Schedule::new(Some(&OrderEntry::from_ints(order)), chunks, true)
    }

    #[test]
    fn module_order_then_reverse() {
        let s = Schedule::new(None, 2, true).unwrap();
        let got: Vec<_> = s.steps().iter().map(|s| (s.pass, s.chunk)).collect();
        assert_eq!(got, [(Pass::Forward, 0), (Pass::Forward, 1), (Pass::Backward, 1), (Pass::Backward, 0)]);
    }

    #[test]
    fn order_assigns_fifo_microbatches() {
        let s = new(&[1, 1, -1, -1], 1).unwrap();
        let mbs: Vec<_> = s.steps().iter().map(|s| s.microbatch).collect();
        assert_eq!(mbs, [0, 1, 0, 1]);
        assert_eq!(s.microbatches(), 2);
    }

    /// The schedule error of `r`, if it is one.
    fn refusal<T>(r: Result<T>) -> Option<ScheduleError> {
        match r {
            Err(crate::Error::Schedule(e)) => Some(e),
            _ => None,
        }
    }

    #[test]
    fn bad_orders_are_typed_errors() {
        use ScheduleError::*;
        let cases: [(&[i32], ScheduleError); 6] = [
            (&[1, -1, 2], PassCount { passes: 3, chunks: 2 }),
            (&[1, 1, -1, 2, -2, -2], PassCount { passes: 6, chunks: 2 }),
            (&[-1, 1, 2, -2], BackwardBeforeForward { chunk: 1 }),
            (&[0, 0, 1, -1], ChunkOutOfRange { chunk: 0, chunks: 2 }),
            (&[1, 3, -3, -1], ChunkOutOfRange { chunk: 3, chunks: 2 }),
            (&[1, 1, -1, -1], Unbalanced { chunk: 1, forwards: 2, backwards: 2, wgrads: 0, microbatches: 1 }),
        ];
        for (order, want) in cases {
            assert_eq!(refusal(new(order, 2)), Some(want), "{order:?}");
        }
    }

    #[test]
    fn chained_flow_and_whole_chain_runs() {
        let ok = new(&[1, 2, 1, 2, -2, -1, -2, -1], 2).unwrap();
        assert!(ok.check_chained_flow().is_ok() && ok.runs_whole_chains());
        let interleaved = new(&[1, 2, 1, -2, 2, -1, -2, -1], 2).unwrap();
        assert!(interleaved.check_chained_flow().is_ok() && !interleaved.runs_whole_chains());
        let cases: [(&[i32], ScheduleError); 2] = [
            (&[1, -1, 2, -2], ScheduleError::ChainedBackward { chunk: 1, microbatch: 1 }),
            (&[2, 1, -2, -1], ScheduleError::ChainedForward { chunk: 2, microbatch: 1 }),
        ];
        for (order, want) in cases {
            assert_eq!(refusal(new(order, 2).unwrap().check_chained_flow()), Some(want), "{order:?}");
        }
        assert!(Schedule::new(None, 3, true).unwrap().runs_whole_chains());
        assert!(Schedule::new(None, 3, false).unwrap().runs_whole_chains());
    }

    #[test]
    fn wgrad_entries_are_fifo_and_checked() {
        let (f, b, w) = (OrderEntry::Forward, OrderEntry::Backward, OrderEntry::Wgrad);
        let s = Schedule::new(Some(&[f(1), f(1), b(1), b(1), w(1), w(1)]), 1, true).unwrap();
        let got: Vec<_> = s.steps().iter().map(|s| (s.pass, s.microbatch)).collect();
        assert_eq!(got[4..], [(Pass::Wgrad, 0), (Pass::Wgrad, 1)]);
        assert!(s.defers(0) && s.microbatches() == 2);
        let unbalanced = ScheduleError::Unbalanced { chunk: 1, forwards: 2, backwards: 2, wgrads: 1, microbatches: 2 };
        let bad: [(&[OrderEntry], ScheduleError); 3] = [
            (&[f(1), w(1), b(1)], ScheduleError::WgradBeforeBackward { chunk: 1 }),
            (&[f(1), b(1), w(1), w(1)], ScheduleError::WgradBeforeBackward { chunk: 1 }),
            (&[f(1), f(1), b(1), b(1), w(1)], unbalanced),
        ];
        for (order, want) in bad {
            assert_eq!(refusal(Schedule::new(Some(order), 1, true)), Some(want), "{order:?}");
        }
        let inference = Schedule::new(Some(&[f(1), b(1), w(1)]), 1, false).unwrap();
        assert_eq!(inference.steps().len(), 1);
    }
}
