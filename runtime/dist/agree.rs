//! What the ranks must agree on before they capture: a module's group ([`Collectives`], from
//! [`Module::collectives`]) and the check `make_graphed` runs with it, so that ranks about to
//! capture different schedules fail at once, every one of them, instead of issuing
//! collectives that never match.

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use super::pipeline::RankStages;
use super::Communicator;
use crate::{GraphOptions, Module, OrderEntry, Result};

/// A module's group of ranks, as [`Module::collectives`] reports it, and how its ranks'
/// captures must agree: all alike (data parallel), or each with its part of a pipeline's
/// order (a [`super::PipelineStage`]).
///
/// ```
/// use graphed::dist::{self, Collectives};
/// dist::run_emulated(2, |comm| {
///     let c = Collectives::new(comm.clone());
///     assert_eq!(c.communicator().rank(), comm.rank());
///     Ok(())
/// })?;
/// # Ok::<(), graphed::Error>(())
/// ```
#[derive(Clone, Debug)]
pub struct Collectives {
    comm: Communicator,
    /// A pipeline stage: what its rank captures.
    stage: Option<Stage>,
}

/// A pipeline stage's part of a capture.
#[derive(Clone, Debug)]
struct Stage {
    /// The order its rank captures (its part of the pipeline's order).
    order: Vec<OrderEntry>,
    /// Which of the rank's chunks it is (0-indexed), when known: its module's place in the
    /// capture.
    chunk: Option<usize>,
    /// The rank's stages, told when their capture begins.
    stages: Option<Arc<RankStages>>,
}

impl Collectives {
    /// A module whose ranks all capture the same schedule: every option of the capture is
    /// compared (warm-up, order, mode, chaining, buffer reuse, the number of chunks).
    pub fn new(comm: Communicator) -> Collectives {
        Collectives { comm, stage: None }
    }

    /// A pipeline stage, captured with `order`, its rank's part of the pipeline's order
    /// ([`super::stage_order`], integers or [`OrderEntry`]s): the ranks compare the warm-up,
    /// the mode and the number of chunks, and each rank whether it captures with its own part.
    pub fn stage<E: Into<OrderEntry>>(comm: Communicator, order: impl IntoIterator<Item = E>) -> Collectives {
        let order = order.into_iter().map(Into::into).collect();
        Collectives { comm, stage: Some(Stage { order, chunk: None, stages: None }) }
    }

    /// A [`super::PipelineStage`]: chunk `chunk` (0-indexed) of its rank's `stages`.
    pub(crate) fn pipeline_stage(
        comm: Communicator,
        order: Vec<OrderEntry>,
        chunk: usize,
        stages: Arc<RankStages>,
    ) -> Collectives {
        Collectives { comm, stage: Some(Stage { order, chunk: Some(chunk), stages: Some(stages) }) }
    }

    /// The group's communicator (this rank's handle).
    pub fn communicator(&self) -> &Communicator {
        &self.comm
    }
}

/// For each group the modules talk through: every rank is about to capture the same
/// schedule, or every rank gets [`crate::DistError::ScheduleMismatch`]. Called by
/// `make_graphed` before it runs anything; `valid` is whether this rank's own arguments
/// passed (a rank that refuses them differs from its peers).
pub(crate) fn check_schedules(
    modules: &[Box<dyn Module>],
    options: &GraphOptions,
    has_backward: bool,
    valid: bool,
) -> Result<()> {
    // The modules of each group, with their places in the capture.
    let mut groups: Vec<Vec<(usize, Collectives)>> = Vec::new();
    for (i, c) in modules.iter().enumerate().filter_map(|(i, m)| Some((i, m.collectives()?))) {
        match groups.iter_mut().find(|g| Arc::ptr_eq(&g[0].1.comm.0, &c.comm.0)) {
            Some(g) => g.push((i, c)),
            None => groups.push(vec![(i, c)]),
        }
    }
    for members in &groups {
        let g = &members[0].1;
        let o = options;
        let mut h = DefaultHasher::new();
        (valid, o.warmup, o.allow_unused_input, o.training, has_backward, modules.len()).hash(&mut h);
        format!("{:?}", o.capture_mode).hash(&mut h);
        match &g.stage {
            None => (&o.order, o.chained, o.reuse_buffers).hash(&mut h),
            Some(stage) => {
                // Stages capture different parts of one order: each checks its own, and a
                // rank with the wrong one hashes differently, so every rank hears of it.
                let keep = |e: &OrderEntry| has_backward || matches!(e, OrderEntry::Forward(_));
                let expected: Vec<OrderEntry> = stage.order.iter().copied().filter(keep).collect();
                let given: Vec<OrderEntry> = match &o.order {
                    Some(order) => order.iter().copied().filter(keep).collect(),
                    None => OrderEntry::from_ints(&[1, -1]).into_iter().filter(keep).collect(),
                };
                // A rank's stages are captured together, each as the module of its chunk.
                let placed = members.iter().all(|(i, m)| {
                    m.stage.as_ref().is_some_and(|s| s.order == stage.order && s.chunk.is_none_or(|c| c == *i))
                });
                (given == expected && placed).hash(&mut h);
            }
        }
        g.comm.check_same("graph options (warm-up, order, mode, chunks)", h.finish())?;
    }
    if valid {
        for stage in groups.iter().flatten().filter_map(|(_, c)| c.stage.as_ref()) {
            if let Some(stages) = &stage.stages {
                stages.restart(has_backward);
            }
        }
    }
    Ok(())
}
