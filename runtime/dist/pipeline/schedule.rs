//! Pipeline schedules as Megatron-LM runs them (1F1B, interleaved 1F1B), optionally with the
//! weight grads split off and postponed as zero-bubble pipelines do, written as one global
//! `order` for [`super::PipelineStage`] and a single-process `make_graphed`.

use crate::{DistError, OrderEntry, Result};

/// A 1F1B pipeline schedule over `ranks` ranks: each rank runs a few forwards (fewer the later
/// its stage), then alternates one forward and one backward, then runs the backwards left, so
/// at most `ranks` microbatches are in flight. With several chunks per rank it is Megatron-LM's
/// interleaved schedule (rank `r` runs chunks `r + 1`, `r + 1 + ranks`, ..., in groups of
/// `ranks` microbatches), which shrinks the pipeline's bubble by that factor. With
/// [`PipelineSchedule::split_backward`] every backward is followed, later, by its weight
/// grads (`w(c)`): rank `r` postpones them by `ranks - r - 1` backwards, so they fill the
/// waits of the last backwards, as ZB-H1 does.
///
/// [`PipelineSchedule::order`] writes the schedule as one `order` whose entries each rank
/// runs in turn; every rank passes it to [`super::PipelineStage::new`], and the same order runs
/// the chunks in one process as the reference.
///
/// ```
/// use graphed::dist::{stage_order, PipelineSchedule};
/// use graphed::OrderEntry;
/// let order = PipelineSchedule::one_f_one_b(2, 3).order()?;
/// // Rank 0 runs one forward ahead, then alternates; rank 1 alternates from the start.
/// assert_eq!(stage_order(&order, 2, 0)?, OrderEntry::from_ints(&[1, 1, -1, 1, -1, -1]));
/// assert_eq!(stage_order(&order, 2, 1)?, OrderEntry::from_ints(&[1, -1, 1, -1, 1, -1]));
/// # Ok::<(), graphed::Error>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PipelineSchedule {
    ranks: usize,
    chunks_per_rank: usize,
    microbatches: usize,
    split_backward: bool,
}

/// One entry of a rank's sequence: the pass, the chunk (1-indexed, global), the microbatch.
type Entry = (Pass, usize, usize);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Pass {
    Forward,
    Backward,
    Wgrad,
}

impl PipelineSchedule {
    /// 1F1B over `ranks` ranks, one chunk each, and `microbatches` microbatches.
    pub fn one_f_one_b(ranks: usize, microbatches: usize) -> PipelineSchedule {
        PipelineSchedule { ranks, chunks_per_rank: 1, microbatches, split_backward: false }
    }

    /// Interleaved 1F1B: `chunks` chunks per rank (the microbatches must then be a multiple of
    /// the ranks).
    pub fn interleaved(mut self, chunks: usize) -> PipelineSchedule {
        self.chunks_per_rank = chunks;
        self
    }

    /// Splits every backward: its input grads at the backward (`-c`), its weight grads
    /// (`w(c)`) postponed by `ranks - rank - 1` backwards. Every chunk must then split its
    /// backward ([`crate::Module::splits_backward`]).
    pub fn split_backward(mut self) -> PipelineSchedule {
        self.split_backward = true;
        self
    }

    /// The schedule as one order over `ranks × chunks` chunks; chunk `c` runs on rank
    /// `(c - 1) % ranks`. Refused when a count is 0, or the microbatches of an interleaved
    /// schedule are not a multiple of the ranks ([`DistError::PipelineSchedule`]).
    pub fn order(&self) -> Result<Vec<OrderEntry>> {
        let PipelineSchedule { ranks, chunks_per_rank, microbatches, .. } = *self;
        let refused = DistError::PipelineSchedule { ranks, chunks_per_rank, microbatches };
        if ranks == 0 || chunks_per_rank == 0 || microbatches == 0 {
            return Err(refused.into());
        }
        if chunks_per_rank > 1 && microbatches % ranks != 0 {
            return Err(refused.into());
        }
        let ranks_entries: Vec<Vec<Entry>> = (0..ranks).map(|r| self.rank_entries(r)).collect();
        merge(&ranks_entries, ranks * chunks_per_rank, microbatches).ok_or_else(|| refused.into())
    }

    /// Rank `r`'s entries in the order it runs them.
    fn rank_entries(&self, r: usize) -> Vec<Entry> {
        let (p, v, m) = (self.ranks, self.chunks_per_rank, self.microbatches);
        let total = v * m;
        // The k-th forward (backward) of the rank: its local chunk cycles every `p`
        // microbatches (backwards from the last chunk), its microbatch advances by groups of p.
        let microbatch = |k: usize| (k / (p * v)) * p + k % p;
        let chunk = |local: usize| r + 1 + local * p;
        let forward = |k: usize| (Pass::Forward, chunk((k / p) % v), microbatch(k));
        let backward = |k: usize| (Pass::Backward, chunk(v - 1 - (k / p) % v), microbatch(k));
        let warmup = (if v == 1 { p - r - 1 } else { (p - r - 1) * 2 + (v - 1) * p }).min(total);
        let mut out: Vec<Entry> = (0..warmup).map(forward).collect();
        for i in 0..total - warmup {
            out.push(forward(warmup + i));
            out.push(backward(i));
        }
        out.extend((total - warmup..total).map(backward));
        if !self.split_backward {
            return out;
        }
        // Each backward's weight grads, `p - r - 1` backwards later (the rest at the end).
        let lag = p - r - 1;
        let mut with_wgrad = Vec::with_capacity(out.len() + total);
        let mut backwards: Vec<Entry> = Vec::with_capacity(total);
        for e in out {
            with_wgrad.push(e);
            if e.0 == Pass::Backward {
                backwards.push(e);
                if backwards.len() > lag {
                    let (_, c, mb) = backwards[backwards.len() - 1 - lag];
                    with_wgrad.push((Pass::Wgrad, c, mb));
                }
            }
        }
        let first_left = backwards.len().saturating_sub(lag);
        with_wgrad.extend(backwards[first_left..].iter().map(|&(_, c, mb)| (Pass::Wgrad, c, mb)));
        with_wgrad
    }
}

/// One order from every rank's entries: in rounds, each rank runs its next entry once what it
/// needs from other ranks ran (a forward the previous chunk's forward of its microbatch, a
/// backward the next chunk's backward). `None` if the ranks wait on each other.
fn merge(ranks: &[Vec<Entry>], chunks: usize, microbatches: usize) -> Option<Vec<OrderEntry>> {
    let mut ran = vec![vec![[false; 2]; microbatches]; chunks + 2];
    let mut at = vec![0usize; ranks.len()];
    let mut order = Vec::with_capacity(ranks.iter().map(Vec::len).sum());
    while at.iter().zip(ranks).any(|(a, r)| *a < r.len()) {
        let mut moved = false;
        for (r, entries) in ranks.iter().enumerate() {
            let Some(&(pass, c, m)) = entries.get(at[r]) else { continue };
            let ready = match pass {
                Pass::Forward => c == 1 || ran[c - 1][m][0],
                Pass::Backward => c == chunks || ran[c + 1][m][1],
                Pass::Wgrad => true,
            };
            if !ready {
                continue;
            }
            order.push(match pass {
                Pass::Forward => OrderEntry::Forward(c),
                Pass::Backward => OrderEntry::Backward(c),
                Pass::Wgrad => OrderEntry::Wgrad(c),
            });
            match pass {
                Pass::Forward => ran[c][m][0] = true,
                Pass::Backward => ran[c][m][1] = true,
                Pass::Wgrad => {}
            }
            at[r] += 1;
            moved = true;
        }
        if !moved {
            return None;
        }
    }
    Some(order)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dist::pipeline::plan::plan;
    use crate::graphed::Schedule;

    #[test]
    fn every_schedule_is_valid_and_runs_across_ranks() {
        for ranks in 1..=4 {
            for v in 1..=3 {
                if ranks == 1 && v > 1 {
                    continue; // a single rank runs a single chunk
                }
                for m in (1..=12).filter(|m| v == 1 || m % ranks == 0) {
                    for split in [false, true] {
                        let mut s = PipelineSchedule::one_f_one_b(ranks, m).interleaved(v);
                        if split {
                            s = s.split_backward();
                        }
                        let order = s.order().unwrap_or_else(|e| panic!("{s:?}: {e}"));
                        let chunks = ranks * v;
                        Schedule::new(Some(&order), chunks, true).unwrap_or_else(|e| panic!("{s:?}: {e}"));
                        let wgrads = order.iter().filter(|e| matches!(e, OrderEntry::Wgrad(_))).count();
                        assert_eq!(wgrads, if split { chunks * m } else { 0 }, "{s:?}");
                        for r in 0..ranks {
                            plan(&order, ranks, r).unwrap_or_else(|e| panic!("{s:?}, rank {r}: {e}"));
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn in_flight_microbatches_are_bounded_by_the_ranks() {
        let order = PipelineSchedule::one_f_one_b(4, 8).order().unwrap();
        let (mut in_flight, mut most) = (0i32, 0);
        for e in order.iter().filter(|e| e.chunk() == 1) {
            in_flight += if matches!(e, OrderEntry::Forward(_)) { 1 } else { -1 };
            most = most.max(in_flight);
        }
        assert_eq!(most, 4);
    }

    #[test]
    fn refuses_what_has_no_schedule() {
        for (p, v, m) in [(0, 1, 4), (2, 0, 4), (2, 1, 0), (2, 2, 3)] {
            let e = PipelineSchedule::one_f_one_b(p, m).interleaved(v).order().unwrap_err();
            assert!(matches!(e, crate::Error::Dist(DistError::PipelineSchedule { .. })), "{e}");
        }
    }
}
