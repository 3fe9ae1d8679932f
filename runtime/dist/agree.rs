//! What the ranks must agree on before they capture: a module's group ([`Collectives`], from
//! [`crate::Module::collectives`]) made from a [`Communicator`], which `make_graphed` asks
//! whether every rank is about to capture the same schedule, so that ranks about to capture
//! different schedules fail at once, every one of them, instead of issuing collectives that
//! never match.

use std::any::Any;
use std::sync::Arc;

use super::Communicator;
use crate::module::{Collectives, RankGroup};
use crate::Result;

impl Collectives {
    /// A module whose ranks all capture the same schedule: every option of the capture is
    /// compared (warm-up, order, mode, chaining, buffer reuse, the number of chunks).
    pub fn new(comm: Communicator) -> Collectives {
        Collectives { group: Arc::new(comm), stage: None }
    }

    /// A pipeline stage, captured with `order`, its rank's part of the pipeline's order
    /// ([`super::stage_order`]): the ranks compare the warm-up, the mode and the number of
    /// chunks, and each rank whether it captures with its own part.
    pub fn stage(comm: Communicator, order: Vec<i32>) -> Collectives {
        Collectives { group: Arc::new(comm), stage: Some(order) }
    }

    /// The group's communicator (this rank's handle).
    pub fn communicator(&self) -> &Communicator {
        // Both constructors above put a communicator there; nothing else makes a group.
        self.group.as_any().downcast_ref().expect("a Collectives group is a Communicator")
    }
}

impl RankGroup for Communicator {
    fn check_same(&self, what: &str, hash: u64) -> Result<()> {
        Communicator::check_same(self, what, hash)
    }

    fn same_group(&self, other: &dyn RankGroup) -> bool {
        other.as_any().downcast_ref::<Communicator>().is_some_and(|o| Arc::ptr_eq(&self.0, &o.0))
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}
