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

/// 1F1B with split backwards (`w(c)`) across two GPUs, and Megatron-LM's interleaved 1F1B
/// (two chunks per GPU): NCCL groups where a send and a receive would wait on each other;
/// the losses, every grad and the parameters after the steps bitwise those of the same
/// chunks graphed on one GPU with the whole order.
#[test]
fn gpu_one_f_one_b_with_wgrad_equals_one_gpu() -> Result<()> {
    on_gpus("gpu_one_f_one_b_with_wgrad_equals_one_gpu", |env| {
        use graphed::dist::PipelineSchedule;
        let comm = env.communicator(&config())?;
        let one_f_one_b = PipelineSchedule::one_f_one_b(RANKS, 4);
        let cases = [
            ("1F1B with w(c)", one_f_one_b.split_backward()),
            ("1F1B", one_f_one_b),
            ("interleaved 1F1B with w(c)", one_f_one_b.interleaved(2).split_backward()),
        ];
        for (what, schedule) in cases {
            let order = schedule.order()?;
            let got = dist_programs::pipeline_split_rank(comm.clone(), &order)?;
            comm.synchronize()?;
            let chunks = order.iter().map(|e| e.chunk()).max().unwrap_or(0);
            let reference = dist_programs::pipeline_split_reference(comm.device(), &order)?;
            let want = reference.of_rank(comm.rank(), RANKS, chunks);
            dist_programs::same_trace(&got, &want)
                .map_err(|e| Error::msg(format!("{what}, rank {}: {e}", comm.rank())))?;
            println!("{what}, rank {}: losses, grads and parameters bitwise equal to one GPU", comm.rank());
        }
        comm.barrier()
    })
}

/// The all-reduce cost of two GPUs, measured and fitted: every rank picks the same bucket
/// size, and data parallelism with it (one chunk per block, overlapped) is bitwise the
/// single-GPU reference.
#[test]
fn gpu_measured_bucket_size_trains_like_one_gpu() -> Result<()> {
    on_gpus("gpu_measured_bucket_size_trains_like_one_gpu", |env| {
        use graphed::dist::{AllReduceCost, BUCKET_EFFICIENCY, COST_SIZES};
        let comm = env.communicator(&config())?;
        let cost = AllReduceCost::measure(&comm, &COST_SIZES, 5)?;
        let bucket = cost.bucket_bytes(BUCKET_EFFICIENCY)?;
        let gbps = 1e-6 / cost.beta_ms_per_byte;
        println!(
            "rank {}: all-reduce {:.4} ms + bytes / {gbps:.1} GB/s: buckets of {bucket} B",
            comm.rank(),
            cost.alpha_ms
        );
        let got = dist_programs::dp_chunks_rank(comm.clone(), bucket, true)?;
        comm.synchronize()?;
        let want = dist_programs::dp_reference(comm.device())?;
        check(&format!("data parallel, measured buckets of {bucket} B"), comm.rank(), &got, &want)?;
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

/// Data parallel on GPUs whose ranks were started as torchrun, srun and mpirun start them
/// (their variables, not graphed's): each rank finds its GPU and the rendezvous from them.
#[test]
fn gpu_data_parallel_under_each_launchers_variables() -> Result<()> {
    const TEST: &str = "gpu_data_parallel_under_each_launchers_variables";
    if let Some(env) = RankEnv::from_env()? {
        let comm = env.communicator(&config())?;
        let got = dist_programs::dp_rank(comm.clone())?;
        comm.synchronize()?;
        let want = dist_programs::dp_reference(comm.device())?;
        check(&format!("data parallel under {}", env.launcher), comm.rank(), &got, &want)?;
        return comm.barrier();
    }
    if !common::gpus_here(TEST, RANKS) {
        return Ok(());
    }
    let deadline = Duration::from_secs(300);
    let world = RANKS.to_string();
    let port = common::free_port_pair();
    common::play_launcher(TEST, RANKS, deadline, |r| {
        let (r, addr, port) = (r.to_string(), "127.0.0.1".to_string(), port.to_string());
        vec![
            ("RANK", r.clone()),
            ("WORLD_SIZE", world.clone()),
            ("LOCAL_RANK", r),
            ("MASTER_ADDR", addr),
            ("MASTER_PORT", port),
        ]
    })?;
    let port = common::free_port();
    common::play_launcher(TEST, RANKS, deadline, |r| {
        vec![
            ("SLURM_PROCID", r.to_string()),
            ("SLURM_NTASKS", world.clone()),
            ("SLURM_LOCALID", r.to_string()),
            ("SLURM_NODELIST", "127.0.0.[1-2]".into()),
            ("MASTER_PORT", port.to_string()),
        ]
    })?;
    let port = common::free_port();
    common::play_launcher(TEST, RANKS, deadline, |r| {
        vec![
            ("OMPI_COMM_WORLD_RANK", r.to_string()),
            ("OMPI_COMM_WORLD_SIZE", world.clone()),
            ("OMPI_COMM_WORLD_LOCAL_RANK", r.to_string()),
            ("MASTER_ADDR", "127.0.0.1".into()),
            ("MASTER_PORT", port.to_string()),
        ]
    })
}
