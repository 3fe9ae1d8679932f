//! Clobber lists: which handed-out buffers (outputs, grad inputs) each pass's replay
//! overwrites, from the pool memory its capture wrote. Handles to them go stale on replay.
//!
//! A replay overwrites its own outputs (or input grads), and every other handed-out buffer
//! that lies in memory it writes: its temporaries, and saved activations released once their
//! backward was captured, which the pool lends to later captures. That is only known once
//! every graph of the capture exists, of every shape bucket (a smaller bucket's buffers lie
//! where a larger one keeps its temporaries), so it is computed once, when the drafts of a
//! capture become surfaces.

use super::surface::{CapturedPass, Draft, Passes, Surface};
use crate::pool::MemRange;
use crate::{Graph, Tensor};

/// The surfaces of `drafts` (one list per shape bucket, or one without buckets), each pass
/// with its clobber list over the handed-out buffers of all of them in pool `pool`.
pub(super) fn finish(drafts: Vec<Vec<Vec<Draft>>>, pool: usize) -> Vec<Vec<Vec<Surface>>> {
    let mut handed: Vec<(Tensor, MemRange)> = Vec::new();
    for t in drafts.iter().flatten().flatten().flat_map(Draft::handed_out) {
        let (pid, range) = t.mem_range();
        if pid == pool && !handed.iter().any(|(h, _)| h.same_buffer(t)) {
            handed.push((t.clone(), range));
        }
    }
    let surface = |d: Draft| {
        let pass = |graph: Graph, own: &[Option<Tensor>]| {
            let clobbers = clobbered(graph.writes(), own, &handed);
            CapturedPass { graph, clobbers }
        };
        let passes = Passes {
            forward: pass(d.forward, &d.outputs),
            backward: d.backward.map(|b| pass(b, &d.grad_inputs)),
            wgrad: d.wgrad.map(|w| pass(w, &[])),
        };
        Surface {
            label: d.label,
            inputs: d.inputs,
            outputs: d.outputs,
            grad_outputs: d.grad_outputs,
            grad_inputs: d.grad_inputs,
            passes,
            saved_bytes: d.saved_bytes,
            _kept: d.saved,
        }
    };
    drafts
        .into_iter()
        .map(|bucket| bucket.into_iter().map(|row| row.into_iter().map(surface).collect()).collect())
        .collect()
}

/// The handed-out buffers a pass overwrites: `own` (its outputs or input grads) and every
/// buffer of `handed` that lies in `writes`, the pool memory it writes.
fn clobbered(writes: &[MemRange], own: &[Option<Tensor>], handed: &[(Tensor, MemRange)]) -> Vec<Tensor> {
    let mut v: Vec<Tensor> = own.iter().flatten().cloned().collect();
    for (t, range) in handed {
        if writes.iter().any(|w| w.overlaps(range)) && !v.iter().any(|o| o.same_buffer(t)) {
            v.push(t.clone());
        }
    }
    v
}
