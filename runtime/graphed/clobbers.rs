//! Clobber lists: which handed-out buffers (outputs, grad inputs) each graph's replay
//! overwrites, from the pool memory its capture wrote. Handles to them go stale on replay.

use super::GraphedModules;
use crate::pool::MemRange;
use crate::Tensor;

impl GraphedModules {
    /// For each graph, the handed-out buffers its replay overwrites: its own outputs (or grad
    /// inputs) and any other surface's buffers that lie in memory it uses as temporaries.
    pub(super) fn compute_clobbers(&mut self) {
        let clobbers: Vec<(Vec<Tensor>, Vec<Tensor>)> = self
            .surfaces
            .iter()
            .flatten()
            .map(|s| {
                (
                    self.clobbered_by(&s.forward_writes, &s.outputs),
                    self.clobbered_by(&s.backward_writes, &s.grad_inputs),
                )
            })
            .collect();
        for (s, (forward, backward)) in self.surfaces.iter_mut().flatten().zip(clobbers) {
            s.forward_clobbers = forward;
            s.backward_clobbers = backward;
        }
    }

    /// The handed-out buffers a graph overwrites: `own` (its outputs or grad inputs) and every
    /// surface's outputs and grad inputs that lie in `temps`, the pool memory it writes.
    pub(super) fn clobbered_by(&self, temps: &[MemRange], own: &[Option<Tensor>]) -> Vec<Tensor> {
        let pool_id = self.pool.id();
        let mut v: Vec<Tensor> = own.iter().flatten().cloned().collect();
        let parked = self.parked_handed_out();
        let handed = self.surfaces.iter().flatten().flat_map(|s| s.outputs.iter().chain(&s.grad_inputs)).flatten();
        for t in handed.chain(&parked) {
            let (pid, r) = t.mem_range();
            if pid == pool_id && temps.iter().any(|x| x.overlaps(&r)) && !v.iter().any(|o| o.same_buffer(t)) {
                v.push(t.clone());
            }
        }
        v
    }
}
