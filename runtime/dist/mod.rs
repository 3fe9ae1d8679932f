//! Several GPUs: one process per GPU, NCCL collectives on the device stream (captured into
//! graphs like any other op), and emulated ranks on the host backend with the same semantics.
//!
//! - `comm`: [`Communicator`] and its collectives.
//! - `agree`: [`Collectives`] made from a communicator, which `make_graphed` asks whether
//!   every rank captures the same schedule.
//! - `cost`: [`AllReduceCost`], the all-reduce time of a group as latency plus bandwidth,
//!   measured, and the bucket size it implies.
//! - `host`: emulated ranks (threads sharing memory).
//! - `nccl`: the NCCL communicator (non-blocking, with deadlines and abort).
//! - `rank_env`: [`RankEnv`], this process's rank as graphed's `launch`, torchrun, Slurm or
//!   Open MPI set it.
//! - `launch`: the rendezvous and [`launch`].
//! - `data_parallel`: [`DataParallel`], grads all-reduced in buckets inside the backward graph;
//!   [`measured_bucket_bytes`], a bucket size from the group's measured cost.
//! - `pipeline`: [`PipelineStage`], a chunk of a pipeline with send/recv into static buffers,
//!   grouped where neighbours would wait on each other; [`PipelineSchedule`], 1F1B orders.
//! - `shard`: [`ShardedParams`], FSDP-style shards gathered and reduced by capture-time hooks.

mod agree;
mod comm;
mod cost;
mod data_parallel;
mod host;
mod launch;
mod nccl;
mod pipeline;
mod rank_env;
mod shard;

use std::sync::Arc;
use std::time::Duration;

pub use crate::error::{Launcher, ReduceOp};
pub use crate::module::Collectives;
pub use comm::{Communicator, P2pOp};
pub use cost::{AllReduceCost, COST_SIZES};
pub use data_parallel::{measured_bucket_bytes, DataParallel, BUCKET_EFFICIENCY, DEFAULT_BUCKET_BYTES};
pub use launch::{launch, LaunchOptions, Rendezvous};
pub use pipeline::{stage_order, PipelineSchedule, PipelineStage, StageRole};
pub use rank_env::{
    RankEnv, ENV_LAUNCHER, ENV_LOCAL_RANK, ENV_RANK, ENV_RENDEZVOUS, ENV_WORLD_SIZE, SLURM_PORT_BASE, SLURM_PORT_SPAN,
    TORCHRUN_PORT_OFFSET,
};
pub use shard::ShardedParams;

use crate::{AbortReason, Device, DistError, Error, Result};

/// Settings of a group: how long any wait may take before the group is aborted.
///
/// ```
/// use std::time::Duration;
/// let cfg = graphed::dist::Config::default().timeout(Duration::from_secs(5));
/// assert_eq!(cfg.timeout_value(), Duration::from_secs(5));
/// ```
#[derive(Clone, Debug)]
pub struct Config {
    timeout: Duration,
}

impl Default for Config {
    fn default() -> Self {
        Config { timeout: Duration::from_secs(300) }
    }
}

impl Config {
    /// The deadline of every wait (collective, receive, rendezvous, stream synchronize).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// The deadline of every wait.
    pub fn timeout_value(&self) -> Duration {
        self.timeout
    }
}

/// The number of CUDA GPUs on this host (0 without a usable driver); never panics.
///
/// ```
/// let n = graphed::dist::gpu_count();
/// println!("{n} GPUs");
/// ```
pub fn gpu_count() -> usize {
    nccl::gpu_count()
}

/// The version of the NCCL library that loads here (e.g. 22805 for 2.28.5), or
/// [`DistError::NcclUnavailable`]; never panics.
///
/// ```
/// match graphed::dist::nccl_version() {
///     Ok(v) => println!("NCCL {v}"),
///     Err(e) => println!("{e}"),
/// }
/// ```
pub fn nccl_version() -> Result<i32> {
    nccl::probe()
}

impl RankEnv {
    /// Joins the group through NCCL on GPU `local_rank`: rank 0 makes the unique id and shares
    /// it through the rendezvous; every wait ends by the config's deadline.
    pub fn communicator(&self, config: &Config) -> Result<Communicator> {
        nccl::probe()?;
        let device = Device::cuda(self.local_rank)?;
        Communicator::nccl(&device, self, config)
    }
}

impl Communicator {
    /// Joins the group of `env` through NCCL on `device` (a GPU).
    pub fn nccl(device: &Device, env: &RankEnv, config: &Config) -> Result<Communicator> {
        if !device.is_cuda() {
            let device = device.name();
            return Err(DistError::Backend { op: "Communicator::nccl", communicator: "NCCL", device }.into());
        }
        if env.world_size == 0 || env.rank >= env.world_size {
            return Err(DistError::World { op: "Communicator::nccl", rank: env.rank, world: env.world_size }.into());
        }
        let payload = if env.rank == 0 { Some(nccl::unique_id()?) } else { None };
        let id = env.rendezvous.share(env.rank, env.world_size, payload.as_deref(), config.timeout)?;
        let comm = nccl::NcclComm::new(device.backend().clone(), env.rank, env.world_size, &id, config.timeout)?;
        Ok(Communicator(Arc::new(comm::Inner {
            rank: comm.rank(),
            world: env.world_size,
            device: device.clone(),
            timeout: config.timeout,
            imp: comm::Imp::Nccl(comm),
        })))
    }

    /// `world_size` emulated ranks, each on its own new host device, sharing one group. Run
    /// each on its own thread (see [`run_emulated`]); a rank's calls wait for its peers.
    pub fn emulated(world_size: usize, config: &Config) -> Result<Vec<Communicator>> {
        if world_size == 0 {
            return Err(DistError::World { op: "Communicator::emulated", rank: 0, world: 0 }.into());
        }
        let group = host::HostGroup::new(world_size);
        Ok((0..world_size)
            .map(|rank| {
                Communicator(Arc::new(comm::Inner {
                    rank,
                    world: world_size,
                    device: Device::host(),
                    timeout: config.timeout,
                    imp: comm::Imp::Host(group.clone()),
                }))
            })
            .collect())
    }
}

/// Runs `rank_main` on `world_size` emulated ranks (threads, each with its own host device)
/// with a 60-second deadline on every wait, and returns their results in rank order. See
/// [`run_emulated_with`].
pub fn run_emulated<T: Send>(
    world_size: usize,
    rank_main: impl Fn(Communicator) -> Result<T> + Sync,
) -> Result<Vec<T>> {
    run_emulated_with(world_size, &Config::default().timeout(Duration::from_secs(60)), rank_main)
}

/// Runs `rank_main` on `world_size` emulated ranks and returns their results in rank order.
///
/// A rank that returns an error or panics aborts the group, so its peers get
/// [`DistError::CommAborted`] ([`AbortReason::PeerFailed`] or [`AbortReason::PeerPanicked`]
/// naming it) instead of waiting; the error returned is the first failing rank's own (the
/// cause). [`run_emulated_each`] gives every rank's result.
///
/// ```
/// use graphed::dist::{self, Config};
/// use graphed::{Error, Tensor};
/// use std::time::Duration;
/// // Rank 1 never joins the all-reduce: rank 0 times out, nobody hangs.
/// let cfg = Config::default().timeout(Duration::from_millis(200));
/// let r = dist::run_emulated_with(2, &cfg, |comm| {
///     if comm.rank() == 1 {
///         return Ok(());
///     }
///     let t = Tensor::zeros(comm.device(), &[2])?;
///     comm.all_reduce(&t, dist::ReduceOp::Sum)
/// });
/// assert!(matches!(r, Err(Error::Dist(graphed::DistError::CommTimeout { rank: 0, .. }))));
/// ```
pub fn run_emulated_with<T: Send>(
    world_size: usize,
    config: &Config,
    rank_main: impl Fn(Communicator) -> Result<T> + Sync,
) -> Result<Vec<T>> {
    first_cause(run_emulated_each(world_size, config, rank_main)?)
}

/// Runs `rank_main` on `world_size` emulated ranks and returns each rank's own result, in rank
/// order (a panic becomes [`DistError::RankPanicked`] naming the rank). A failing rank aborts
/// the group, so the others end with an error too instead of waiting.
///
/// ```
/// use graphed::dist::{self, Config};
/// use graphed::{Error, Tensor};
/// let results = dist::run_emulated_each(2, &Config::default(), |comm| {
///     if comm.rank() == 1 {
///         return Err(Error::msg("rank 1 gives up"));
///     }
///     comm.barrier()
/// })?;
/// assert!(matches!(results[0], Err(Error::Dist(graphed::DistError::CommAborted { rank: 0, .. }))));
/// assert!(matches!(results[1], Err(Error::Msg(_))));
/// # Ok::<(), graphed::Error>(())
/// ```
pub fn run_emulated_each<T: Send>(
    world_size: usize,
    config: &Config,
    rank_main: impl Fn(Communicator) -> Result<T> + Sync,
) -> Result<Vec<Result<T>>> {
    let comms = Communicator::emulated(world_size, config)?;
    let rank_main = &rank_main;
    Ok(std::thread::scope(|s| {
        let handles: Vec<_> = comms
            .into_iter()
            .map(|comm| {
                s.spawn(move || {
                    let rank = comm.rank();
                    let peer = comm.clone();
                    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| rank_main(comm))) {
                        Ok(Ok(v)) => Ok(v),
                        Ok(Err(e)) => {
                            peer.abort_for(AbortReason::PeerFailed { rank, error: e.to_string() });
                            Err(e)
                        }
                        Err(payload) => {
                            let message = panic_message(&payload);
                            peer.abort_for(AbortReason::PeerPanicked { rank, message: message.clone() });
                            Err(DistError::RankPanicked { rank, message }.into())
                        }
                    }
                })
            })
            .collect();
        handles
            .into_iter()
            .enumerate()
            .map(|(rank, h)| h.join().unwrap_or_else(|_| Err(DistError::RankThreadDied { rank }.into())))
            .collect()
    }))
}

/// All results, or the error that caused the others: a rank's own failure before the aborts
/// it set off in its peers.
fn first_cause<T>(results: Vec<Result<T>>) -> Result<Vec<T>> {
    let (mut oks, mut errors) = (Vec::new(), Vec::new());
    for r in results {
        match r {
            Ok(v) => oks.push(v),
            Err(e) => errors.push(e),
        }
    }
    if errors.is_empty() {
        return Ok(oks);
    }
    let is_echo = |e: &Error| matches!(e.root(), Error::Dist(crate::DistError::CommAborted { .. }));
    let pos = errors.iter().position(|e| !is_echo(e)).unwrap_or(0);
    Err(errors.swap_remove(pos))
}

fn panic_message(payload: &Box<dyn std::any::Any + Send>) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a non-string panic".into())
}
