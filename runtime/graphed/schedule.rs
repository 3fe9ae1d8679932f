//! The schedule of one iteration, validated once: which (chunk, microbatch) runs forward,
//! backward or deferred weight grads at each step. Warm-up, capture and the docs all walk this
//! one list.

use super::OrderEntry;
use crate::{Error, Result};

/// Forward, backward (the whole backward, or only its input-grad half when the chunk's
/// weight grads are deferred), or a deferred weight-grad half.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Pass {
    Forward,
    Backward,
    Wgrad,
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
        let bad = |detail: String| Error::InvalidOrder { detail };
        let Some(order) = order else {
            let forwards = (0..chunks).map(|c| Step { pass: Pass::Forward, chunk: c, microbatch: 0 });
            let backwards = (0..chunks).rev().map(|c| Step { pass: Pass::Backward, chunk: c, microbatch: 0 });
            let steps = if training { forwards.chain(backwards).collect() } else { forwards.collect() };
            return Ok(Schedule { steps, microbatches: 1, deferred: vec![false; chunks], backward: training });
        };
        let passes = order.iter().filter(|e| !matches!(e, OrderEntry::Wgrad(_))).count();
        if passes == 0 || passes % (2 * chunks) != 0 {
            return Err(bad(format!(
                "{passes} forward and backward entries are not a multiple of 2 x {chunks} chunks"
            )));
        }
        let microbatches = passes / (2 * chunks);
        // Per chunk: forwards, backwards and weight grads so far.
        let mut counts = vec![[0usize; 3]; chunks];
        let mut steps = Vec::with_capacity(order.len());
        for &e in order {
            let (pass, c) = e.parts();
            if c == 0 || c > chunks {
                return Err(bad(format!("entry {e}: chunks are numbered 1..={chunks}")));
            }
            let chunk = c - 1;
            let [fwd, bwd, wgrad] = counts[chunk];
            match pass {
                Pass::Backward if bwd >= fwd => return Err(bad(format!("backward of chunk {c} before its forward"))),
                Pass::Wgrad if wgrad >= bwd => {
                    return Err(bad(format!("{e}: weight grads of chunk {c} before its backward")))
                }
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
                return Err(bad(format!(
                    "chunk {} has {fwd} forwards, {bwd} backwards and {wgrad} weight-grad entries; with {microbatches} microbatches each chunk needs {microbatches} forwards and backwards, and either no w({}) or {microbatches}",
                    c + 1,
                    c + 1
                )));
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
                    return Err(Error::InvalidOrder {
                        detail: format!(
                            "chained: the forward of chunk {} for microbatch {} comes before chunk {c}'s, whose output it reads",
                            c + 1,
                            m + 1
                        ),
                    })
                }
                Pass::Backward if c + 1 < chunks && bwd[c + 1] <= m => {
                    return Err(Error::InvalidOrder {
                        detail: format!(
                            "chained: the backward of chunk {} for microbatch {} comes before chunk {}'s, whose input grad it reads",
                            c + 1,
                            m + 1,
                            c + 2
                        ),
                    })
                }
                Pass::Forward => fwd[c] += 1,
                Pass::Backward => bwd[c] += 1,
                Pass::Wgrad => {}
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

    #[test]
    fn bad_orders_are_typed_errors() {
        for order in [&[1, -1, 2][..], &[-1, 1], &[0, 0], &[1, 3, -3, -1], &[1, 1, -1, 2, -2, -2]] {
            assert!(matches!(new(order, 2), Err(Error::InvalidOrder { .. })), "{order:?}");
        }
    }

    #[test]
    fn chained_flow_and_whole_chain_runs() {
        let ok = new(&[1, 2, 1, 2, -2, -1, -2, -1], 2).unwrap();
        assert!(ok.check_chained_flow().is_ok() && ok.runs_whole_chains());
        let interleaved = new(&[1, 2, 1, -2, 2, -1, -2, -1], 2).unwrap();
        assert!(interleaved.check_chained_flow().is_ok() && !interleaved.runs_whole_chains());
        for order in [&[1, -1, 2, -2][..], &[2, 1, -2, -1]] {
            let s = new(order, 2).unwrap();
            assert!(matches!(s.check_chained_flow(), Err(Error::InvalidOrder { .. })), "{order:?}");
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
        let bad: [&[OrderEntry]; 3] = [&[f(1), w(1), b(1)], &[f(1), b(1), w(1), w(1)], &[f(1), f(1), b(1), b(1), w(1)]];
        for order in bad {
            assert!(matches!(Schedule::new(Some(order), 1, true), Err(Error::InvalidOrder { .. })), "{order:?}");
        }
        let inference = Schedule::new(Some(&[f(1), b(1), w(1)]), 1, false).unwrap();
        assert_eq!(inference.steps().len(), 1);
    }
}
