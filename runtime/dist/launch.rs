//! One process per GPU: the rendezvous that shares the communicator id, and `launch`, which
//! re-executes the current binary once per rank of this host.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use super::rank_env::{RankEnv, ENV_LOCAL_RANK, ENV_RANK, ENV_RENDEZVOUS, ENV_WORLD_SIZE};
use crate::{DistError, Error, RankExit, RendezvousFailure, RendezvousStep, Result};

/// Where the ranks of one group meet to agree on the communicator id.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Rendezvous {
    /// A file every rank can read: rank 0 writes the id, the others poll for it.
    File(PathBuf),
    /// `host:port`: rank 0 listens on that port and hands the id to every other rank, which
    /// connects to `host`. Rank 0 listens on every interface (on loopback only when `host` is a
    /// loopback address): a host name may resolve to another address on rank 0's own host
    /// (`127.0.1.1` in many `/etc/hosts`) than on its peers'.
    Tcp(String),
}

impl Rendezvous {
    /// Parses `GRAPHED_RENDEZVOUS`: `tcp://host:port` or `host:port` (a port after the last
    /// colon) is TCP, anything else a file path.
    pub fn parse(s: &str) -> Rendezvous {
        let addr = s.strip_prefix("tcp://").unwrap_or(s);
        let is_tcp = s.starts_with("tcp://")
            || (!addr.contains('/') && addr.rsplit_once(':').is_some_and(|(_, p)| p.parse::<u16>().is_ok()));
        if is_tcp {
            Rendezvous::Tcp(addr.to_string())
        } else {
            Rendezvous::File(PathBuf::from(s))
        }
    }

    /// The value to put in `GRAPHED_RENDEZVOUS`.
    pub fn to_env(&self) -> String {
        match self {
            Rendezvous::File(p) => p.display().to_string(),
            Rendezvous::Tcp(a) => format!("tcp://{a}"),
        }
    }

    fn err(&self, failure: RendezvousFailure) -> Error {
        let address = match self {
            Rendezvous::File(p) => p.display().to_string(),
            Rendezvous::Tcp(a) => a.clone(),
        };
        Error::Dist(crate::DistError::Rendezvous { address, failure })
    }

    /// The error of `step`, which the operating system refused.
    fn io(&self, step: RendezvousStep) -> impl Fn(std::io::Error) -> Error + '_ {
        move |source| self.err(RendezvousFailure::Io { step, source })
    }

    /// Shares `payload` from rank 0 with every rank of `world`: rank 0 passes `Some`, the
    /// others `None` and get rank 0's bytes back. Every wait ends by `timeout`.
    pub fn share(&self, rank: usize, world: usize, payload: Option<&[u8]>, timeout: Duration) -> Result<Vec<u8>> {
        match (rank, payload) {
            (0, Some(p)) => {
                self.serve(world, p, timeout)?;
                Ok(p.to_vec())
            }
            (0, None) => Err(DistError::NoPayload.into()),
            (_, _) => self.fetch(timeout),
        }
    }

    fn serve(&self, world: usize, payload: &[u8], timeout: Duration) -> Result<()> {
        match self {
            Rendezvous::File(path) => {
                // Write then rename, so a reader never sees half a file.
                let tmp = path.with_extension(format!("tmp{}", std::process::id()));
                std::fs::write(&tmp, payload).map_err(self.io(RendezvousStep::WriteFile))?;
                std::fs::rename(&tmp, path).map_err(self.io(RendezvousStep::RenameFile))
            }
            Rendezvous::Tcp(addr) => {
                let listener = TcpListener::bind(listen_addr(addr)).map_err(self.io(RendezvousStep::Listen))?;
                listener.set_nonblocking(true).map_err(self.io(RendezvousStep::Configure))?;
                let deadline = Instant::now() + timeout;
                let mut served = 1;
                while served < world {
                    match listener.accept() {
                        Ok((mut stream, _)) => {
                            stream.set_nonblocking(false).map_err(self.io(RendezvousStep::Configure))?;
                            stream.write_all(payload).map_err(self.io(RendezvousStep::Send))?;
                            served += 1;
                        }
                        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                            if Instant::now() >= deadline {
                                let failure =
                                    RendezvousFailure::RanksMissing { arrived: served, world, waited: timeout };
                                return Err(self.err(failure));
                            }
                            std::thread::sleep(Duration::from_millis(5));
                        }
                        Err(e) => return Err(self.io(RendezvousStep::Accept)(e)),
                    }
                }
                Ok(())
            }
        }
    }

    fn fetch(&self, timeout: Duration) -> Result<Vec<u8>> {
        let deadline = Instant::now() + timeout;
        loop {
            let got = match self {
                Rendezvous::File(path) => std::fs::read(path).ok().filter(|b| !b.is_empty()),
                Rendezvous::Tcp(addr) => TcpStream::connect(addr).ok().and_then(|mut s| {
                    s.set_read_timeout(Some(timeout)).ok()?;
                    let mut buf = Vec::new();
                    s.read_to_end(&mut buf).ok().map(|_| buf)
                }),
            };
            if let Some(bytes) = got {
                return Ok(bytes);
            }
            if Instant::now() >= deadline {
                return Err(self.err(RendezvousFailure::NotPublished { waited: timeout }));
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

/// Where rank 0 listens for a `host:port` rendezvous: the port on every interface, or on the
/// given loopback address.
fn listen_addr(addr: &str) -> String {
    let Some((host, port)) = addr.rsplit_once(':') else { return addr.to_string() };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let loopback =
        host.eq_ignore_ascii_case("localhost") || host.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback());
    match () {
        _ if loopback => addr.to_string(),
        _ if host.parse::<std::net::Ipv6Addr>().is_ok() => format!("[::]:{port}"),
        _ => format!("0.0.0.0:{port}"),
    }
}

/// How [`launch`] starts the ranks.
///
/// Two hosts, eight GPUs each, as `torchrun --nnodes=2 --node_rank=1 --nproc_per_node=8`:
///
/// ```
/// use graphed::dist::{LaunchOptions, Rendezvous};
/// // This host is node 1; global rank 0 runs on node0 and listens at port 29500 there.
/// let options = LaunchOptions {
///     nnodes: 2,
///     node_rank: 1,
///     rendezvous: Some(Rendezvous::Tcp("node0:29500".into())),
///     ..Default::default()
/// };
/// // dist::launch(16, &options, |env| ..) here starts ranks 8..16 on local GPUs 0..8.
/// # let _ = options;
/// ```
#[derive(Clone, Debug)]
pub struct LaunchOptions {
    /// Arguments for each rank process (default: this process's own arguments).
    pub args: Option<Vec<String>>,
    /// Where ranks meet (default: a fresh file in the temporary directory).
    pub rendezvous: Option<Rendezvous>,
    /// How long the whole launch may take before the remaining ranks are killed.
    pub deadline: Duration,
    /// Once a rank failed, how long the others get to end on their own (each sees a typed
    /// error from its communicator within its deadline, and may report it or save its state)
    /// before they are killed. Default: none, they are killed at once.
    pub grace: Duration,
    /// How many hosts (nodes) run ranks, each with its own `launch` (torchrun's `--nnodes`).
    /// Default 1. With several, every node starts `world_size / nnodes` ranks and the
    /// rendezvous must be one every node reaches: set [`LaunchOptions::rendezvous`].
    pub nnodes: usize,
    /// Which node this launch is, from 0 (torchrun's `--node_rank`): its ranks are
    /// `node_rank * per_node ..` with local ranks (GPU ordinals) `0..per_node`. Default 0.
    pub node_rank: usize,
}

impl Default for LaunchOptions {
    fn default() -> Self {
        LaunchOptions {
            args: None,
            rendezvous: None,
            deadline: Duration::from_secs(600),
            grace: Duration::ZERO,
            nnodes: 1,
            node_rank: 0,
        }
    }
}

/// Runs `rank_main` as one rank of `world_size`, one process per rank.
///
/// In a rank process (a launcher's rank variables are set: an earlier `launch`'s, or
/// torchrun's, Slurm's or Open MPI's, see [`RankEnv::detect`]) it calls `rank_main` with this
/// rank's [`RankEnv`] and returns its result; `world_size` and `options` are then unused, the
/// launcher's say. In the parent it starts this node's ranks (all `world_size` of them, or
/// `world_size / nnodes` with [`LaunchOptions::nnodes`]) as copies of the current binary with
/// `GRAPHED_RANK`, `GRAPHED_WORLD_SIZE`, `GRAPHED_LOCAL_RANK`, `GRAPHED_RENDEZVOUS` and
/// `NCCL_NVLS_ENABLE=0` set, and waits for all of them: the first rank to fail (after
/// [`LaunchOptions::grace`]), or the deadline, kills the others and gives
/// [`DistError::RankFailed`](crate::DistError::RankFailed) naming the first rank that failed.
///
/// ```no_run
/// use graphed::dist::{self, LaunchOptions, ReduceOp};
/// use graphed::Tensor;
/// fn main() -> graphed::Result<()> {
///     dist::launch(2, &LaunchOptions::default(), |env| {
///         let comm = env.communicator(&dist::Config::default())?; // NCCL on GPU `local_rank`
///         let t = Tensor::full(comm.device(), &[4], 1.0)?;
///         comm.all_reduce(&t, ReduceOp::Sum)?;
///         comm.synchronize()
///     })
/// }
/// ```
pub fn launch(world_size: usize, options: &LaunchOptions, rank_main: impl FnOnce(RankEnv) -> Result<()>) -> Result<()> {
    match RankEnv::from_env()? {
        Some(env) => rank_main(env),
        None => spawn_ranks(world_size, options),
    }
}

fn spawn_ranks(world_size: usize, options: &LaunchOptions) -> Result<()> {
    if world_size == 0 {
        return Err(DistError::World { op: "launch", rank: 0, world: 0 }.into());
    }
    let (nnodes, node_rank) = (options.nnodes, options.node_rank);
    if nnodes == 0 || node_rank >= nnodes || !world_size.is_multiple_of(nnodes) {
        return Err(DistError::Nodes { nnodes, node_rank, world: world_size }.into());
    }
    if nnodes > 1 && options.rendezvous.is_none() {
        return Err(DistError::NodesNeedRendezvous { nnodes }.into());
    }
    let per_node = world_size / nnodes;
    let first = node_rank * per_node;
    let exe = std::env::current_exe()
        .map_err(|source| DistError::Io { what: "launch: cannot find the current binary", source })?;
    let args = options.args.clone().unwrap_or_else(|| std::env::args().skip(1).collect());
    let rdv = options.rendezvous.clone().unwrap_or_else(|| {
        let nonce = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
        Rendezvous::File(std::env::temp_dir().join(format!("graphed-rdv-{}-{nonce}", std::process::id())))
    });
    // Node 0 owns a file rendezvous: a stale id from an earlier run must not be read.
    let owns_file = node_rank == 0;
    if let (Rendezvous::File(p), true) = (&rdv, owns_file) {
        let _ = std::fs::remove_file(p);
    }
    let mut children: Vec<Child> = Vec::with_capacity(per_node);
    for local in 0..per_node {
        let rank = first + local;
        let child = Command::new(&exe)
            .args(&args)
            .env(ENV_RANK, rank.to_string())
            .env(ENV_WORLD_SIZE, world_size.to_string())
            .env(ENV_LOCAL_RANK, local.to_string())
            .env(ENV_RENDEZVOUS, rdv.to_env())
            // NVLink SHARP (multicast) objects fail under CUDA graphs on some drivers, and
            // reserve memory per communicator; see docs/DESIGN-DECISIONS.md.
            .env("NCCL_NVLS_ENABLE", "0")
            .spawn();
        match child {
            Ok(c) => children.push(c),
            Err(e) => {
                kill_all(&mut children);
                return Err(Error::Dist(crate::DistError::RankFailed { rank, status: RankExit::NotStarted(e) }));
            }
        }
    }
    let result = wait_all(&mut children, first, options.deadline, options.grace);
    if let (Rendezvous::File(p), true) = (&rdv, owns_file) {
        let _ = std::fs::remove_file(p);
    }
    result
}

fn kill_all(children: &mut [Child]) {
    for c in children.iter_mut() {
        let _ = c.kill();
        let _ = c.wait();
    }
}

/// Polls every child (rank `first + index`) until all exit; the first failure (after `grace`
/// for the others to end on their own) or the deadline kills the rest.
fn wait_all(children: &mut [Child], first_rank: usize, deadline: Duration, grace: Duration) -> Result<()> {
    let mut end = Instant::now() + deadline;
    let mut done = vec![false; children.len()];
    let mut first: Option<(usize, RankExit)> = None;
    while done.iter().any(|d| !d) {
        for (rank, c) in children.iter_mut().enumerate() {
            if done[rank] {
                continue;
            }
            let failed = match c.try_wait() {
                Ok(Some(status)) if status.success() => None,
                Ok(Some(status)) => Some(RankExit::Exited(status)),
                Ok(None) => continue,
                Err(e) => Some(RankExit::NotWaited(e)),
            };
            done[rank] = true;
            if let (Some(status), None) = (failed, &first) {
                first = Some((first_rank + rank, status));
                end = end.min(Instant::now() + grace);
            }
        }
        if done.iter().all(|d| *d) {
            break;
        }
        if Instant::now() >= end {
            let rank = first_rank + done.iter().position(|d| !d).unwrap_or(0);
            kill_all(children);
            let (rank, status) = first.unwrap_or((rank, RankExit::Deadline { deadline }));
            return Err(Error::Dist(crate::DistError::RankFailed { rank, status }));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    match first {
        Some((rank, status)) => Err(Error::Dist(crate::DistError::RankFailed { rank, status })),
        None => Ok(()),
    }
}
