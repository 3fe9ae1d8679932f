//! Pipeline parallelism on emulated ranks: rank c runs chunk c of the order, activations and
//! grads travel by send/recv inside the captured graphs, and the parameters after 10 AdamW
//! steps are bitwise those of the same pipeline on one device.

mod common;
mod dist_programs;

use common::model::Block;
use dist_programs::{BATCH, ORDER, WIDTH};
use graphed::dist::{self, PipelineStage};
use graphed::{Device, Error, Result};

#[test]
fn pipeline_across_ranks_equals_one_device_bitwise() -> Result<()> {
    let reference = dist_programs::pipeline_reference(&Device::host())?;
    let ranks = dist::run_emulated(2, dist_programs::pipeline_rank)?;
    let got: Vec<Vec<f32>> = ranks.into_iter().flatten().collect();
    dist_programs::bitwise(&got, &reference).map_err(Error::msg)?;
    let initial = Block::new(&Device::host(), WIDTH, WIDTH, 5)?.params()[0].value.to_vec()?;
    assert_ne!(initial, reference[0], "the parameters must move");
    Ok(())
}

#[test]
fn an_order_that_deadlocks_across_ranks_is_refused_on_every_rank() -> Result<()> {
    let bad = [1, 1, 2, -2, 2, -2, -1, -1];
    let results = dist::run_emulated_each(2, &dist::Config::default(), |comm| {
        let block = Block::new(comm.device(), WIDTH, WIDTH, 5)?;
        PipelineStage::new(block, comm, &bad, &[BATCH, WIDTH]).map(|_| ())
    })?;
    for r in &results {
        assert!(
            matches!(r, Err(Error::Dist(graphed::DistError::PipelineDeadlock { stuck, .. })) if !stuck.is_empty()),
            "{r:?}"
        );
    }
    Ok(())
}

#[test]
fn ranks_with_different_orders_are_refused_on_every_rank() -> Result<()> {
    let results = dist::run_emulated_each(2, &dist::Config::default(), |comm| {
        let order: &[i32] = if comm.rank() == 0 { &ORDER } else { &[1, 2, -2, -1, 1, 2, -2, -1] };
        let block = Block::new(comm.device(), WIDTH, WIDTH, 5)?;
        PipelineStage::new(block, comm, order, &[BATCH, WIDTH]).map(|_| ())
    })?;
    for r in &results {
        assert!(matches!(r, Err(Error::Dist(graphed::DistError::ScheduleMismatch { .. }))), "{r:?}");
    }
    Ok(())
}
