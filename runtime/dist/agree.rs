//! What the ranks must agree on before they capture: a module's group ([`Collectives`], from
//! [`crate::Module::collectives`]) made from a [`Communicator`], which `make_graphed` asks
//! whether every rank is about to capture the same schedule, so that ranks about to capture
//! different schedules fail at once, every one of them, instead of issuing collectives that
//! never match. (`Collectives` is defined beside `Module`; the comparison is `make_graphed`'s,
//! in `graphed/agree.rs`.)

use std::any::Any;
use std::sync::Arc;

use super::pipeline::RankStages;
use super::Communicator;
use crate::module::{Collectives, RankGroup, Stage, StagePlan};
use crate::{OrderEntry, Result};

impl Collectives {
    /// A module whose ranks all capture the same schedule: every option of the capture is
    /// compared (warm-up, order, mode, chaining, buffer reuse, the number of chunks).
    pub fn new(comm: Communicator) -> Collectives {
        Collectives { group: Arc::new(comm), stage: None }
    }

    /// A pipeline stage, captured with `order`, its rank's part of the pipeline's order
    /// ([`super::stage_order`], integers or [`OrderEntry`]s): the ranks compare the warm-up,
    /// the mode and the number of chunks, and each rank whether it captures with its own part.
    pub fn stage<E: Into<OrderEntry>>(comm: Communicator, order: impl IntoIterator<Item = E>) -> Collectives {
        let order = order.into_iter().map(Into::into).collect();
        Collectives { group: Arc::new(comm), stage: Some(Stage { order, chunk: None, stages: None }) }
    }

    /// A [`super::PipelineStage`]: chunk `chunk` (0-indexed) of its rank's `stages`.
    pub(crate) fn pipeline_stage(
        comm: Communicator,
        order: Vec<OrderEntry>,
        chunk: usize,
        stages: Arc<RankStages>,
    ) -> Collectives {
        let stages: Arc<dyn StagePlan> = stages;
        Collectives { group: Arc::new(comm), stage: Some(Stage { order, chunk: Some(chunk), stages: Some(stages) }) }
    }

    /// The group's communicator (this rank's handle).
    pub fn communicator(&self) -> &Communicator {
        // The constructors above put a communicator there; nothing else makes a group.
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

impl StagePlan for RankStages {
    fn restart(&self, backward: bool) {
        RankStages::restart(self, backward);
    }
}
