//! Before capturing modules that talk to other ranks ([`crate::Module::collectives`]): every
//! rank of each group is about to capture the same schedule, or every rank gets
//! [`crate::DistError::ScheduleMismatch`].

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};

use super::{GraphOptions, OrderEntry};
use crate::module::{Collectives, Module};
use crate::Result;

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
        if !groups.iter().any(|g| g.group.same_group(c.group.as_ref())) {
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
        g.group.check_same("graph options (warm-up, order, mode, chunks)", h.finish())?;
    }
    Ok(())
}
