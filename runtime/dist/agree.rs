//! What the ranks must agree on before they capture: a module's group ([`Collectives`], from
//! [`Module::collectives`]) and the check `make_graphed` runs with it, so that ranks about to
//! capture different schedules fail at once, every one of them, instead of issuing
//! collectives that never match.

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

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
    /// A pipeline stage: the order its rank captures (its part of the pipeline's order).
    stage: Option<Vec<i32>>,
}

impl Collectives {
    /// A module whose ranks all capture the same schedule: every option of the capture is
    /// compared (warm-up, order, mode, chaining, buffer reuse, the number of chunks).
    pub fn new(comm: Communicator) -> Collectives {
        Collectives { comm, stage: None }
    }

    /// A pipeline stage, captured with `order`, its rank's part of the pipeline's order
    /// ([`super::stage_order`]): the ranks compare the warm-up, the mode and the number of
    /// chunks, and each rank whether it captures with its own part.
    pub fn stage(comm: Communicator, order: Vec<i32>) -> Collectives {
        Collectives { comm, stage: Some(order) }
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
    let mut groups: Vec<Collectives> = Vec::new();
    for c in modules.iter().filter_map(|m| m.collectives()) {
        if !groups.iter().any(|g| Arc::ptr_eq(&g.comm.0, &c.comm.0)) {
            groups.push(c);
        }
    }
    for g in &groups {
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
                let expected: Vec<OrderEntry> = OrderEntry::from_ints(stage).into_iter().filter(keep).collect();
                let given: Vec<OrderEntry> = match &o.order {
                    Some(order) => order.iter().copied().filter(keep).collect(),
                    None => OrderEntry::from_ints(&[1, -1]).into_iter().filter(keep).collect(),
                };
                (given == expected).hash(&mut h);
            }
        }
        g.comm.check_same("graph options (warm-up, order, mode, chunks)", h.finish())?;
    }
    Ok(())
}
