//! Static surfaces reused across the microbatches of a pipeline schedule (Transformer
//! Engine's `_reuse_graph_input_output_buffers`, our own rules).
//!
//! Without reuse every (chunk, microbatch) has its own static input, output, grad-output and
//! grad-input buffers, so a schedule's static memory grows with its number of microbatches.
//! With reuse (`GraphOptions::reuse_buffers`, on by default) a microbatch's buffers go back to
//! its chunk's free list once nothing in the schedule reads them any more, and the next
//! forward of that chunk takes them: static memory grows with the microbatches in flight.
//!
//! The plan is made from the schedule alone, before warm-up ([`SlotPlan::new`]). A
//! microbatch's buffers are released after the last step that may read them: its own forward
//! and backward, and those of the same microbatch in the neighbouring chunks (chunk `c - 1`
//! reads its grad input as a grad output, chunk `c + 1` reads its output as an input, chained
//! or copied by the caller). A later forward of the chunk then reuses them, and that forward
//! (and its backward) are captured, and so replayed, after every step that read them: replay
//! order is enforced, so the reuse can never overwrite a value still to be read.
//!
//! Inputs and grad outputs are shared buffers (the caller copies into them). Outputs and grad
//! inputs are written by the module's own ops into memory they allocate; a microbatch that
//! reuses a slot copies them into the slot's buffers at the end of its graph (one small
//! device copy per buffer), and the freshly allocated ones become the graph's temporaries,
//! which the pool lends to later captures. Each replay that writes a shared buffer lists it as
//! clobbered, so every handle an earlier microbatch returned for it goes stale.

use super::capture::Capture;
use super::schedule::{Pass, Schedule};
use super::surface::Draft;
use super::GraphedModules;
use crate::{Result, Tensor};

/// For every (chunk, microbatch), the microbatch whose buffers it uses (itself, or an earlier
/// one of the same chunk whose buffers were released before its forward).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct SlotPlan {
    owner: Vec<Vec<usize>>,
}

impl SlotPlan {
    /// Every microbatch with buffers of its own (reuse off, or nothing to reuse).
    pub(super) fn unshared(chunks: usize, microbatches: usize) -> SlotPlan {
        SlotPlan { owner: vec![(0..microbatches).collect(); chunks] }
    }

    /// The plan for `schedule` (see the module docs); everything unshared without `reuse`.
    /// A schedule without backward steps (forward-only capture) shares nothing: its outputs
    /// are the caller's results.
    pub(super) fn new(schedule: &Schedule, chunks: usize, reuse: bool) -> SlotPlan {
        let mut plan = SlotPlan::unshared(chunks, schedule.microbatches());
        let steps = schedule.steps();
        if !reuse || !steps.iter().any(|s| s.pass == Pass::Backward) {
            return plan;
        }
        let neighbours = |c: usize| c.saturating_sub(1)..=(c + 1).min(chunks - 1);
        // The index of the last step that may read the buffers of (chunk, microbatch).
        let mut last = vec![vec![0usize; schedule.microbatches()]; chunks];
        for (i, s) in steps.iter().enumerate() {
            for c in neighbours(s.chunk) {
                last[c][s.microbatch] = i;
            }
        }
        let mut free: Vec<Vec<usize>> = vec![Vec::new(); chunks];
        for (i, s) in steps.iter().enumerate() {
            let m = s.microbatch;
            if s.pass == Pass::Forward {
                if let Some(owner) = free[s.chunk].pop() {
                    plan.owner[s.chunk][m] = owner;
                }
            }
            for c in neighbours(s.chunk) {
                if last[c][m] == i {
                    free[c].push(plan.owner[c][m]);
                }
            }
        }
        plan
    }

    /// The microbatch whose buffers (`chunk`, `microbatch`) uses.
    pub(super) fn owner(&self, chunk: usize, microbatch: usize) -> usize {
        self.owner[chunk][microbatch]
    }

    /// Whether (`chunk`, `microbatch`) shares its buffers with another microbatch.
    pub(super) fn is_shared(&self, chunk: usize, microbatch: usize) -> bool {
        let o = self.owner(chunk, microbatch);
        self.owner[chunk].iter().enumerate().any(|(m, &x)| x == o && m != microbatch)
    }

    /// Whether any microbatch shares its buffers.
    pub(super) fn shares_any(&self) -> bool {
        self.owner.iter().any(|row| row.iter().enumerate().any(|(m, &o)| o != m))
    }

    /// The number of distinct buffer sets of `chunk`.
    pub(super) fn slots(&self, chunk: usize) -> usize {
        self.owner[chunk].iter().enumerate().filter(|&(m, &o)| o == m).count()
    }
}

impl GraphedModules {
    /// How many sets of static surfaces `chunk` has: its number of microbatches without reuse
    /// (`GraphOptions::reuse_buffers`), at most the most it has in flight at once with it.
    pub fn surface_sets(&self, chunk: usize) -> usize {
        if chunk < self.surfaces.len() {
            self.config.plan.slots(chunk)
        } else {
            0
        }
    }
}

impl Capture {
    /// The buffers `part` picks from the surfaces that (chunk, microbatch) reuses: an earlier
    /// microbatch's, or while a smaller shape bucket is captured the largest bucket's (see
    /// [`Slot::prefix`]); empty when it owns its surfaces.
    pub(super) fn slot_of(&self, c: usize, m: usize, part: impl Fn(&Draft) -> &Vec<Option<Tensor>>) -> Slot {
        let owner = self.config.plan.owner(c, m);
        if owner != m {
            return Slot { bufs: part(&self.drafts[c][owner]).clone(), prefix: false };
        }
        // The buckets are captured largest first.
        match self.done.first().and_then(|(largest, _)| largest.get(c)?.get(m)) {
            Some(largest) => Slot { bufs: part(largest).clone(), prefix: true },
            None => Slot::default(),
        }
    }
}

/// Buffers a (chunk, microbatch) takes over instead of keeping its own.
#[derive(Default)]
pub(super) struct Slot {
    pub(super) bufs: Vec<Option<Tensor>>,
    /// The largest shape bucket's buffers, which a smaller bucket's buffer of the same dtype
    /// occupies the first elements of (the buckets never run at the same time, and each
    /// replay lists the buffers it writes as clobbered, so handles to the other's go stale).
    pub(super) prefix: bool,
}

impl Slot {
    /// An earlier microbatch's buffers.
    pub(super) fn of(bufs: &[Option<Tensor>]) -> Slot {
        Slot { bufs: bufs.to_vec(), prefix: false }
    }
}

/// `slot`'s buffer for position `i` if it can stand in for `like`: same shape and dtype (or,
/// in a larger bucket's slot, room for `like`'s elements: a view of its first ones).
pub(super) fn reusable(slot: &Slot, i: usize, like: &Tensor) -> Option<Tensor> {
    let t = slot.bufs.get(i).cloned().flatten().filter(|t| t.dtype() == like.dtype())?;
    if t.dims() == like.dims() {
        Some(t)
    } else if slot.prefix && t.numel() >= like.numel() {
        t.prefix_view(like.dims()).ok()
    } else {
        None
    }
}

/// Inside a capture: the buffers a microbatch hands out. Where `slot` (the buffers of the
/// microbatch it reuses; empty for an owner) has a matching buffer, the fresh value is copied
/// into it and the slot's buffer is handed out instead; otherwise the fresh one is kept.
pub(super) fn adopt(fresh: Vec<Option<Tensor>>, slot: &Slot) -> Result<Vec<Option<Tensor>>> {
    let mut out = Vec::with_capacity(fresh.len());
    for (i, t) in fresh.into_iter().enumerate() {
        out.push(match t {
            Some(t) => match reusable(slot, i, &t) {
                Some(s) if !s.same_buffer(&t) => {
                    s.refreshed().copy_(&t)?;
                    Some(s.with_requires_grad(t.requires_grad()))
                }
                _ => Some(t),
            },
            None => None,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graphed::OrderEntry;

    #[test]
    fn slots_follow_the_microbatches_in_flight() {
        for (window, slots) in [(1, 1), (2, 2), (4, 4), (16, 16)] {
            let s = Schedule::new(Some(&OrderEntry::windowed(2, 16, window)), 2, true).unwrap();
            let plan = SlotPlan::new(&s, 2, true);
            assert_eq!((plan.slots(0), plan.slots(1)), (slots, slots), "window {window}");
            assert_eq!(plan.shares_any(), window < 16);
        }
    }

    #[test]
    fn a_buffer_still_read_is_not_reused() {
        // Chunk 1's backward of microbatch 0 comes after chunk 1's forward of microbatch 1:
        // chunk 1 reads chunk 2's grad input of microbatch 0 then, so chunk 2's second forward
        // may not take microbatch 0's buffers, though chunk 2's backward of it is done.
        let s = Schedule::new(Some(&OrderEntry::from_ints(&[1, 2, -2, 1, 2, -1, -2, -1])), 2, true).unwrap();
        let plan = SlotPlan::new(&s, 2, true);
        assert_eq!(plan.owner(1, 1), 1);
        assert!(!plan.shares_any());
        let s = Schedule::new(Some(&OrderEntry::from_ints(&[1, 2, -2, -1, 1, 2, -2, -1])), 2, true).unwrap();
        let plan = SlotPlan::new(&s, 2, true);
        assert_eq!((plan.owner(0, 1), plan.owner(1, 1)), (0, 0));
        assert!(plan.is_shared(1, 0) && plan.is_shared(1, 1));
    }

    #[test]
    fn forward_only_and_single_microbatch_share_nothing() {
        let s = Schedule::new(Some(&OrderEntry::from_ints(&[1, 2, -2, -1, 1, 2, -2, -1])), 2, false).unwrap();
        assert!(!SlotPlan::new(&s, 2, true).shares_any());
        assert!(!SlotPlan::new(
            &Schedule::new(Some(&OrderEntry::from_ints(&[1, -1, 1, -1])), 1, true).unwrap(),
            1,
            false
        )
        .shares_any());
        let s = Schedule::new(None, 3, true).unwrap();
        assert!(!SlotPlan::new(&s, 3, true).shares_any());
    }
}
