//! FSDP-style sharding on emulated ranks: shards gathered and grads reduce-scattered inside the
//! captured graphs, full buffers materialised and released by capture-time hooks; after 10
//! AdamW steps the parameters are bitwise those of data parallelism.

mod common;
mod dist_programs;

use common::model;
use dist_programs::fsdp_model::FsdpBlock;
use dist_programs::FSDP_WIDTH as WIDTH;
use graphed::dist;
use graphed::{Device, Error, Result};

#[test]
fn fsdp_equals_data_parallel_bitwise() -> Result<()> {
    let dp = dist::run_emulated(2, dist_programs::fsdp_dp_rank)?;
    let fsdp = dist::run_emulated(2, dist_programs::fsdp_rank)?;
    for (rank, (params, shard_bytes, full_bytes)) in fsdp.iter().enumerate() {
        dist_programs::bitwise(params, &dp[rank]).map_err(|e| Error::msg(format!("rank {rank}: {e}")))?;
        assert_eq!(shard_bytes * 2, *full_bytes, "each of 2 ranks holds half");
    }
    let initial = model::Block::new(&Device::host(), WIDTH, WIDTH, 3)?.params()[0].value.to_vec()?;
    assert_ne!(initial, dp[0][0], "the parameters must move");
    Ok(())
}

#[test]
fn an_unmaterialised_weight_is_a_typed_error() -> Result<()> {
    dist::run_emulated(2, |comm| {
        let b = FsdpBlock::new(&comm, WIDTH, WIDTH, 1)?;
        assert!(matches!(b.shards.full(0), Err(Error::Dist(graphed::DistError::NotMaterialised { .. }))));
        assert!(matches!(b.shards.gather(), Err(Error::Dist(graphed::DistError::NotMaterialised { .. }))));
        // Nothing reached the peers: a collective still lines up.
        comm.barrier()
    })?;
    Ok(())
}
