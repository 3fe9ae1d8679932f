//! A fused step's own buffers for microbatches that share static surfaces.
//!
//! A fused step reads every microbatch's inputs and grad outputs as the caller bound them
//! before the launch, and leaves every microbatch's outputs and input grads for the caller
//! to read after it. Where reuse (`GraphOptions::reuse_buffers`) made microbatches share
//! surfaces, one buffer cannot hold several microbatches' values at once, so [`Staging`]
//! gives each such microbatch bound buffers of its own (allocated when the step is fused,
//! never for per-call replays) and small copy graphs that the fused graph runs around each
//! of its graphs: bound inputs into the shared surfaces just before a graph, the shared
//! outputs out to bound buffers just after it. The accessors
//! ([`GraphedModules::static_inputs`] and the others) hand out the bound buffers then.

use super::schedule::Pass;
use super::surface::Surface;
use super::GraphedModules;
use crate::{Graph, Result, Tensor};

/// Bound buffers of one (chunk, microbatch): `None` where the surface has no buffer of its
/// own to bind (an absent tensor, a chained one).
pub(super) struct Bound {
    pub(super) inputs: Vec<Option<Tensor>>,
    pub(super) grad_outputs: Vec<Option<Tensor>>,
    pub(super) outputs: Vec<Option<Tensor>>,
    pub(super) grad_inputs: Vec<Option<Tensor>>,
}

/// The bound buffers of every microbatch that shares surfaces, and per schedule step the
/// copy graphs to run before and after its graph.
pub(super) struct Staging {
    bound: Vec<Vec<Option<Bound>>>,
    around: Vec<(Option<Graph>, Option<Graph>)>,
    /// The copy graphs' own pool: they allocate nothing, and must not enter the replay order
    /// of the surfaces' pool.
    _pool: crate::GraphPool,
}

/// Pairs (to, from) for the slots present on both sides.
fn pairs(to: &[Option<Tensor>], from: &[Option<Tensor>]) -> Vec<(Tensor, Tensor)> {
    to.iter().zip(from).filter_map(|(t, f)| Some((t.clone()?, f.clone()?))).collect()
}

impl Staging {
    /// The bound buffers of (chunk, microbatch), if it shares surfaces.
    pub(super) fn bound(&self, chunk: usize, microbatch: usize) -> Option<&Bound> {
        self.bound.get(chunk)?.get(microbatch)?.as_ref()
    }

    /// The copy graphs around step `i` of the schedule.
    pub(super) fn around(&self, i: usize) -> (Option<&Graph>, Option<&Graph>) {
        self.around.get(i).map_or((None, None), |(a, b)| (a.as_ref(), b.as_ref()))
    }

    /// Every bound buffer a step overwrites (outputs and input grads).
    pub(super) fn written(&self) -> impl Iterator<Item = &Tensor> {
        self.bound.iter().flatten().flatten().flat_map(|b| b.outputs.iter().chain(&b.grad_inputs)).flatten()
    }
}

impl GraphedModules {
    /// Builds the staging when microbatches share surfaces (once; otherwise nothing).
    pub(super) fn prepare_staging(&mut self) -> Result<()> {
        if self.config.staging.is_some() || !self.config.plan.shares_any() {
            return Ok(());
        }
        let mut bound = Vec::with_capacity(self.surfaces.len());
        for (c, row) in self.surfaces.iter().enumerate() {
            let shared = |m: usize| self.config.plan.is_shared(c, m);
            let row = row.iter().enumerate().map(|(m, s)| shared(m).then(|| self.bind(c, s)).transpose());
            bound.push(row.collect::<Result<Vec<_>>>()?);
        }
        let pool = self.device.new_pool();
        let mut around = Vec::new();
        for step in self.config.schedule.steps() {
            let s = &self.surfaces[step.chunk][step.microbatch];
            let Some(b) = &bound[step.chunk][step.microbatch] else {
                around.push((None, None));
                continue;
            };
            let (before, after) = match step.pass {
                Pass::Forward => (pairs(&s.inputs, &b.inputs), pairs(&b.outputs, &s.outputs)),
                Pass::Backward => (pairs(&s.grad_outputs, &b.grad_outputs), pairs(&b.grad_inputs, &s.grad_inputs)),
                // Weight grads read what their backward saved; the plan keeps the surfaces
                // unshared until then, so there is nothing to stage.
                Pass::Wgrad => (Vec::new(), Vec::new()),
            };
            let label = format!("{} {:?}", s.label, step.pass);
            around.push((self.copy_graph(&pool, &label, &before)?, self.copy_graph(&pool, &label, &after)?));
        }
        self.config.staging = Some(Staging { bound, around, _pool: pool });
        Ok(())
    }

    /// Bound buffers like the surface's, in memory no graph writes; inputs and grad outputs
    /// start as the surface holds them now.
    fn bind(&self, c: usize, s: &Surface) -> Result<Bound> {
        let like = |ts: &[Option<Tensor>], keep: &dyn Fn(usize) -> bool, fill: bool| -> Result<Vec<Option<Tensor>>> {
            let mut v = Vec::with_capacity(ts.len());
            for (i, t) in ts.iter().enumerate() {
                v.push(match t {
                    Some(t) if keep(i) => {
                        let b = self
                            .device
                            .with_pool(&self.pool, || Tensor::empty_untouched(&self.device, t.dims(), t.dtype()))?;
                        if fill {
                            b.copy_(&t.refreshed())?;
                        }
                        b.set_owner(format!("{} (bound for the fused step)", s.label));
                        Some(b.with_requires_grad(t.requires_grad()))
                    }
                    _ => None,
                });
            }
            Ok(v)
        };
        Ok(Bound {
            inputs: like(&s.inputs, &|i| !self.config.is_chained_input(c, i), true)?,
            grad_outputs: like(&s.grad_outputs, &|i| !self.config.is_chained_grad_output(c, i), true)?,
            outputs: like(&s.outputs, &|_| true, false)?,
            grad_inputs: like(&s.grad_inputs, &|_| true, false)?,
        })
    }

    /// A graph of the copies `pairs` (to, from), or `None` when there are none.
    fn copy_graph(&self, pool: &crate::GraphPool, label: &str, pairs: &[(Tensor, Tensor)]) -> Result<Option<Graph>> {
        if pairs.is_empty() {
            return Ok(None);
        }
        let mut g = Graph::with_pool(&self.device, pool);
        g.set_label(format!("{label} staging copies"));
        g.capture(self.config.options.capture_mode, || {
            pairs.iter().try_for_each(|(to, from)| to.refreshed().copy_(&from.refreshed()))
        })?;
        Ok(Some(g))
    }
}
