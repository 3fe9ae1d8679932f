//! A captured (chunk, microbatch): its static surfaces and its passes.
//!
//! A pass (forward, backward, deferred weight grads) is one captured graph with the
//! handed-out buffers its replay overwrites (its own outputs or input grads, and other
//! surfaces' buffers placed in the pool memory its capture allocated), whose handles go stale
//! on each replay. A [`Surface`] holds its static
//! buffers and its passes indexed by [`Pass`].
//!
//! Capture builds a [`Draft`] per (chunk, microbatch) step by step (inputs before warm-up,
//! grad outputs in the first warm-up, outputs, grads and graphs as the schedule captures
//! them). Which buffers a replay overwrites is only known once every graph exists, so the
//! drafts become surfaces all at once, whole (see `clobbers`).

use super::schedule::Pass;
use crate::{Cx, Graph, Tensor};

/// One captured pass of a (chunk, microbatch).
pub(super) struct CapturedPass {
    pub(super) graph: Graph,
    /// The handed-out buffers each replay overwrites (those in the pool memory its capture
    /// allocated, and its own outputs or input grads): stale after each replay.
    pub(super) clobbers: Vec<Tensor>,
}

impl CapturedPass {
    /// After a replay: every handle to a buffer it overwrote goes stale.
    pub(super) fn invalidate_clobbered(&self) {
        for t in &self.clobbers {
            t.bump_generation();
        }
    }
}

/// The passes of one (chunk, microbatch): a forward always, a backward unless the capture
/// was forward-only, weight grads when the schedule defers them.
pub(super) struct Passes {
    pub(super) forward: CapturedPass,
    pub(super) backward: Option<CapturedPass>,
    pub(super) wgrad: Option<CapturedPass>,
}

impl Passes {
    pub(super) fn get(&self, pass: Pass) -> Option<&CapturedPass> {
        match pass {
            Pass::Forward => Some(&self.forward),
            Pass::Backward => self.backward.as_ref(),
            Pass::Wgrad => self.wgrad.as_ref(),
        }
    }

    pub(super) fn get_mut(&mut self, pass: Pass) -> Option<&mut CapturedPass> {
        match pass {
            Pass::Forward => Some(&mut self.forward),
            Pass::Backward => self.backward.as_mut(),
            Pass::Wgrad => self.wgrad.as_mut(),
        }
    }

    /// Every pass, in schedule order within the (chunk, microbatch).
    pub(super) fn iter(&self) -> impl Iterator<Item = &CapturedPass> {
        std::iter::once(&self.forward).chain(&self.backward).chain(&self.wgrad)
    }
}

/// The static surfaces and passes of one (chunk, microbatch).
pub(super) struct Surface {
    pub(super) label: String,
    pub(super) inputs: Vec<Option<Tensor>>,
    pub(super) outputs: Vec<Option<Tensor>>,
    pub(super) grad_outputs: Vec<Option<Tensor>>,
    pub(super) grad_inputs: Vec<Option<Tensor>>,
    pub(super) passes: Passes,
    /// Bytes of the saved activations that are not static surfaces (pool memory only).
    pub(super) saved_bytes: usize,
    /// What a forward saved when its backward was never captured (a forward-only capture):
    /// kept allocated as long as its graphs, as it was at capture.
    pub(super) _kept: Option<Cx>,
}

/// A (chunk, microbatch) while it is captured: its buffers and graphs as far as capture got.
pub(super) struct Draft {
    pub(super) label: String,
    pub(super) inputs: Vec<Option<Tensor>>,
    /// Empty until the forward is captured.
    pub(super) outputs: Vec<Option<Tensor>>,
    /// Empty until the first warm-up backward allocates them.
    pub(super) grad_outputs: Vec<Option<Tensor>>,
    /// Empty until the backward is captured.
    pub(super) grad_inputs: Vec<Option<Tensor>>,
    /// Each pass's graph, which knows the pool memory its capture allocated (which its
    /// replays write). The forward's graph is made with the draft and captured in its turn.
    pub(super) forward: Graph,
    pub(super) backward: Option<Graph>,
    pub(super) wgrad: Option<Graph>,
    /// What the captured forward saved, until its backward is captured (then released: the
    /// backward graph reads the memory on replay, the pool lends it to later captures).
    pub(super) saved: Option<Cx>,
    pub(super) saved_bytes: usize,
}

impl Draft {
    /// Every buffer this (chunk, microbatch) hands out: its outputs and input grads.
    pub(super) fn handed_out(&self) -> impl Iterator<Item = &Tensor> {
        self.outputs.iter().chain(&self.grad_inputs).flatten()
    }
}
