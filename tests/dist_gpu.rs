//! The multi-rank programs on real GPUs through NCCL, one process per GPU: each test re-runs
//! this binary once per rank through `dist::launch` and fails when any rank fails. Each rank
//! compares its parameters bitwise with the single-GPU reference it computes itself.
//!
//! They run when at least 2 GPUs are usable and `GRAPHED_REQUIRE_CUDA=1`; with
//! `GRAPHED_REQUIRE_MULTI_GPU=1` fewer than 2 GPUs is a failure instead of a skip
//! (scripts/gpu-multi.sh sets both).

mod common;
mod dist_programs;

use std::time::Duration;

use graphed::dist::{self, Config, LaunchOptions, RankEnv};
use graphed::{Error, Result};

const RANKS: usize = 2;

/// Runs `program` on `RANKS` processes, one GPU each.
fn on_gpus(test: &str, program: fn(RankEnv) -> Result<()>) -> Result<()> {
    if !common::gpus_here(test, RANKS) {
        return Ok(());
    }
    let args = [test, "--exact", "--nocapture", "--test-threads=1"].map(String::from).to_vec();
    let options = LaunchOptions { args: Some(args), deadline: Duration::from_secs(300), ..Default::default() };
    dist::launch(RANKS, &options, program)
}

fn config() -> Config {
    Config::default().timeout(Duration::from_secs(120))
}

fn check(what: &str, rank: usize, got: &[Vec<f32>], want: &[Vec<f32>]) -> Result<()> {
    dist_programs::bitwise(got, want).map_err(|e| Error::msg(format!("{what}, rank {rank}: {e}")))?;
    println!("{what}, rank {rank}: bitwise equal to the single-GPU reference");
    Ok(())
}

#[test]
fn gpu_data_parallel_equals_one_gpu_accumulating() -> Result<()> {
    on_gpus("gpu_data_parallel_equals_one_gpu_accumulating", |env| {
        let comm = env.communicator(&config())?;
        let got = dist_programs::dp_rank(comm.clone())?;
        comm.synchronize()?;
        let want = dist_programs::dp_reference(comm.device())?;
        check("data parallel", comm.rank(), &got, &want)?;
        comm.barrier()
    })
}

#[test]
fn gpu_data_parallel_chunks_equal_one_gpu_accumulating() -> Result<()> {
    on_gpus("gpu_data_parallel_chunks_equal_one_gpu_accumulating", |env| {
        let comm = env.communicator(&config())?;
        let want = dist_programs::dp_reference(comm.device())?;
        for bucket_bytes in [1 << 20, 4] {
            let got = dist_programs::dp_chunks_rank(comm.clone(), bucket_bytes, false)?;
            comm.synchronize()?;
            check(&format!("data parallel chunks, buckets of {bucket_bytes} B"), comm.rank(), &got, &want)?;
        }
        comm.barrier()
    })
}

#[test]
fn gpu_data_parallel_overlapped_equals_one_gpu_accumulating() -> Result<()> {
    on_gpus("gpu_data_parallel_overlapped_equals_one_gpu_accumulating", |env| {
        let comm = env.communicator(&config())?;
        let want = dist_programs::dp_reference(comm.device())?;
        for bucket_bytes in [1 << 20, 1] {
            let got = dist_programs::dp_chunks_rank(comm.clone(), bucket_bytes, true)?;
            comm.synchronize()?;
            let what = format!("data parallel overlapped on a side stream, buckets of {bucket_bytes} B");
            check(&what, comm.rank(), &got, &want)?;
        }
        comm.barrier()
    })
}

#[test]
fn gpu_pipeline_equals_one_gpu_pipeline() -> Result<()> {
    on_gpus("gpu_pipeline_equals_one_gpu_pipeline", |env| {
        let comm = env.communicator(&config())?;
        let got = dist_programs::pipeline_rank(comm.clone())?;
        comm.synchronize()?;
        let all = dist_programs::pipeline_reference(comm.device())?;
        let r = comm.rank();
        check("pipeline", r, &got, &all[2 * r..2 * r + 2])?;
        comm.barrier()
    })
}

#[test]
fn gpu_fsdp_equals_data_parallel() -> Result<()> {
    on_gpus("gpu_fsdp_equals_data_parallel", |env| {
        let comm = env.communicator(&config())?;
        let dp = dist_programs::fsdp_dp_rank(comm.clone())?;
        let (fsdp, shard_bytes, full_bytes) = dist_programs::fsdp_rank(comm.clone())?;
        check("fsdp vs data parallel", comm.rank(), &fsdp, &dp)?;
        println!("fsdp rank {}: parameter+grad bytes {shard_bytes} sharded, {full_bytes} full", comm.rank());
        comm.barrier()
    })
}
