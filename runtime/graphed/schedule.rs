//! The schedule of one iteration, validated once: which (chunk, microbatch) runs forward or
//! backward at each step. Warm-up, capture and the docs all walk this one list.

use crate::{Error, Result};

/// Forward or backward.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Pass {
    Forward,
    Backward,
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
}

impl Schedule {
    /// Module order (forwards in order, backwards in reverse) without `order`; otherwise
    /// `order` checked entry by entry: `+c` the forward of chunk `c` for its next microbatch,
    /// `-c` the backward of its oldest outstanding one. Without training, backwards are left
    /// out (forward-only capture) but still validated.
    pub(crate) fn new(order: Option<&[i32]>, chunks: usize, training: bool) -> Result<Schedule> {
        let bad = |detail: String| Error::InvalidOrder { detail };
        let Some(order) = order else {
            let forwards = (0..chunks).map(|c| Step { pass: Pass::Forward, chunk: c, microbatch: 0 });
            let backwards = (0..chunks).rev().map(|c| Step { pass: Pass::Backward, chunk: c, microbatch: 0 });
            let steps = if training { forwards.chain(backwards).collect() } else { forwards.collect() };
            return Ok(Schedule { steps, microbatches: 1 });
        };
        if order.is_empty() || order.len() % (2 * chunks) != 0 {
            return Err(bad(format!("length {} is not a multiple of 2 x {chunks} chunks", order.len())));
        }
        let microbatches = order.len() / (2 * chunks);
        let (mut fwd, mut bwd) = (vec![0usize; chunks], vec![0usize; chunks]);
        let mut steps = Vec::with_capacity(order.len());
        for &e in order {
            let c = e.unsigned_abs() as usize;
            if e == 0 || c > chunks {
                return Err(bad(format!("entry {e}: chunks are numbered 1..={chunks}")));
            }
            let chunk = c - 1;
            if e > 0 {
                steps.push(Step { pass: Pass::Forward, chunk, microbatch: fwd[chunk] });
                fwd[chunk] += 1;
            } else {
                if bwd[chunk] >= fwd[chunk] {
                    return Err(bad(format!("backward of chunk {c} before its forward")));
                }
                if training {
                    steps.push(Step { pass: Pass::Backward, chunk, microbatch: bwd[chunk] });
                }
                bwd[chunk] += 1;
            }
        }
        if fwd.iter().chain(&bwd).any(|&n| n != microbatches) {
            return Err(bad(format!(
                "each chunk needs {microbatches} forwards and {microbatches} backwards (forwards {fwd:?}, backwards {bwd:?})"
            )));
        }
        Ok(Schedule { steps, microbatches })
    }

    /// The steps of one iteration, in order.
    pub(crate) fn steps(&self) -> &[Step] {
        &self.steps
    }

    /// Microbatches per chunk.
    pub(crate) fn microbatches(&self) -> usize {
        self.microbatches
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn module_order_then_reverse() {
        let s = Schedule::new(None, 2, true).unwrap();
        let got: Vec<_> = s.steps().iter().map(|s| (s.pass, s.chunk)).collect();
        assert_eq!(got, [(Pass::Forward, 0), (Pass::Forward, 1), (Pass::Backward, 1), (Pass::Backward, 0)]);
    }

    #[test]
    fn order_assigns_fifo_microbatches() {
        let s = Schedule::new(Some(&[1, 1, -1, -1]), 1, true).unwrap();
        let mbs: Vec<_> = s.steps().iter().map(|s| s.microbatch).collect();
        assert_eq!(mbs, [0, 1, 0, 1]);
        assert_eq!(s.microbatches(), 2);
    }

    #[test]
    fn bad_orders_are_typed_errors() {
        for order in [&[1, -1, 2][..], &[-1, 1], &[0, 0], &[1, 3, -3, -1], &[1, 1, -1, 2, -2, -2]] {
            assert!(matches!(Schedule::new(Some(order), 2, true), Err(Error::InvalidOrder { .. })), "{order:?}");
        }
    }
}
