//! Before capturing modules that talk to other ranks ([`crate::Module::collectives`]): every
//! rank of each group is about to capture the same schedule, or every rank gets
//! [`crate::DistError::ScheduleMismatch`]; then the pipeline stages among them start their plan
//! over.

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
    // The modules of each group, with their places in the capture.
    let mut groups: Vec<Vec<(usize, Collectives)>> = Vec::new();
    for (i, c) in modules.iter().enumerate().filter_map(|(i, m)| Some((i, m.collectives()?))) {
        match groups.iter_mut().find(|g| g[0].1.group.same_group(c.group.as_ref())) {
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
        g.group.check_same("graph options (warm-up, order, mode, chunks)", h.finish())?;
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
