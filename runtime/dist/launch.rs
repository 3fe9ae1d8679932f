//! One process per GPU: the rank environment, the rendezvous that shares the communicator id,
//! and `launch`, which re-executes the current binary once per rank.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use crate::{Error, Result};

/// The rank of this process (from 0).
pub const ENV_RANK: &str = "GRAPHED_RANK";
/// The number of ranks.
pub const ENV_WORLD_SIZE: &str = "GRAPHED_WORLD_SIZE";
/// The rank's index on its host: the GPU ordinal it uses.
pub const ENV_LOCAL_RANK: &str = "GRAPHED_LOCAL_RANK";
/// Where ranks meet: a file path (shared by every rank) or `host:port` (rank 0 listens there).
pub const ENV_RENDEZVOUS: &str = "GRAPHED_RENDEZVOUS";

/// Where the ranks of one group meet to agree on the communicator id.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Rendezvous {
    /// A file every rank can read: rank 0 writes the id, the others poll for it.
    File(PathBuf),
    /// `host:port`: rank 0 listens there and hands the id to every other rank.
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

    fn err(&self, detail: impl std::fmt::Display) -> Error {
        let address = match self {
            Rendezvous::File(p) => p.display().to_string(),
            Rendezvous::Tcp(a) => a.clone(),
        };
        Error::Dist(crate::DistError::Rendezvous { address, detail: detail.to_string() })
    }

    /// Shares `payload` from rank 0 with every rank of `world`: rank 0 passes `Some`, the
    /// others `None` and get rank 0's bytes back. Every wait ends by `timeout`.
    pub fn share(&self, rank: usize, world: usize, payload: Option<&[u8]>, timeout: Duration) -> Result<Vec<u8>> {
        match (rank, payload) {
            (0, Some(p)) => {
                self.serve(world, p, timeout)?;
                Ok(p.to_vec())
            }
            (0, None) => Err(Error::invalid("Rendezvous::share", "rank 0 must pass the payload")),
            (_, _) => self.fetch(timeout),
        }
    }

    fn serve(&self, world: usize, payload: &[u8], timeout: Duration) -> Result<()> {
        match self {
            Rendezvous::File(path) => {
                // Write then rename, so a reader never sees half a file.
                let tmp = path.with_extension(format!("tmp{}", std::process::id()));
                std::fs::write(&tmp, payload).map_err(|e| self.err(format!("cannot write: {e}")))?;
                std::fs::rename(&tmp, path).map_err(|e| self.err(format!("cannot rename into place: {e}")))
            }
            Rendezvous::Tcp(addr) => {
                let listener = TcpListener::bind(addr).map_err(|e| self.err(format!("rank 0 cannot listen: {e}")))?;
                listener.set_nonblocking(true).map_err(|e| self.err(e))?;
                let deadline = Instant::now() + timeout;
                let mut served = 1;
                while served < world {
                    match listener.accept() {
                        Ok((mut stream, _)) => {
                            stream.set_nonblocking(false).map_err(|e| self.err(e))?;
                            stream.write_all(payload).map_err(|e| self.err(format!("cannot send the id: {e}")))?;
                            served += 1;
                        }
                        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                            if Instant::now() >= deadline {
                                return Err(
                                    self.err(format!("only {served} of {world} ranks arrived within {timeout:?}"))
                                );
                            }
                            std::thread::sleep(Duration::from_millis(5));
                        }
                        Err(e) => return Err(self.err(format!("accept failed: {e}"))),
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
                return Err(self.err(format!("rank 0 did not publish the id within {timeout:?}")));
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

/// This process's place in a group, from the environment `launch` (or another launcher) set.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RankEnv {
    /// This rank.
    pub rank: usize,
    /// The number of ranks.
    pub world_size: usize,
    /// The rank's index on its host (the GPU ordinal).
    pub local_rank: usize,
    /// Where the ranks meet.
    pub rendezvous: Rendezvous,
}

/// A malformed or missing rank variable.
fn env_err(var: &'static str, detail: impl std::fmt::Display) -> Error {
    Error::Dist(crate::DistError::Rendezvous {
        address: format!("environment variable {var}"),
        detail: format!("{detail}; start the program through dist::launch or set {ENV_RANK}, {ENV_WORLD_SIZE}, {ENV_LOCAL_RANK} and {ENV_RENDEZVOUS}"),
    })
}

fn var(name: &'static str) -> Result<Option<String>> {
    match std::env::var(name) {
        Ok(v) => Ok(Some(v)),
        Err(std::env::VarError::NotPresent) => Ok(None),
        Err(e) => Err(env_err(name, e)),
    }
}

fn number(name: &'static str, v: &str) -> Result<usize> {
    v.trim().parse().map_err(|_| env_err(name, format!("`{v}` is not a non-negative integer")))
}

impl RankEnv {
    /// Reads the rank variables; `Ok(None)` when `GRAPHED_RANK` is not set (not a rank).
    pub fn from_env() -> Result<Option<RankEnv>> {
        let Some(rank) = var(ENV_RANK)? else { return Ok(None) };
        let rank = number(ENV_RANK, &rank)?;
        let world = var(ENV_WORLD_SIZE)?.ok_or_else(|| env_err(ENV_WORLD_SIZE, "not set"))?;
        let world_size = number(ENV_WORLD_SIZE, &world)?;
        let local_rank = match var(ENV_LOCAL_RANK)? {
            Some(v) => number(ENV_LOCAL_RANK, &v)?,
            None => rank,
        };
        let rdv = var(ENV_RENDEZVOUS)?.ok_or_else(|| env_err(ENV_RENDEZVOUS, "not set"))?;
        if world_size == 0 || rank >= world_size {
            return Err(env_err(ENV_RANK, format!("rank {rank} of a world of {world_size}")));
        }
        Ok(Some(RankEnv { rank, world_size, local_rank, rendezvous: Rendezvous::parse(&rdv) }))
    }
}

/// How [`launch`] starts the ranks.
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
}

impl Default for LaunchOptions {
    fn default() -> Self {
        LaunchOptions { args: None, rendezvous: None, deadline: Duration::from_secs(600), grace: Duration::ZERO }
    }
}

/// Runs `rank_main` as one rank of `world_size`, one process per rank.
///
/// In a rank process (the rank variables are set, by an earlier `launch` or by another
/// launcher) it calls `rank_main` with this rank's [`RankEnv`] and returns its result. In the
/// parent it starts `world_size` copies of the current binary with `GRAPHED_RANK`,
/// `GRAPHED_WORLD_SIZE`, `GRAPHED_LOCAL_RANK`, `GRAPHED_RENDEZVOUS` and `NCCL_NVLS_ENABLE=0`
/// set, and waits for all of them: the first rank to fail (after [`LaunchOptions::grace`]), or
/// the deadline, kills the others and gives [`DistError::RankFailed`](crate::DistError::RankFailed)
/// naming the first rank that failed.
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
        return Err(Error::InvalidArgument { op: "launch", detail: "a world of 0 ranks".into() });
    }
    let exe =
        std::env::current_exe().map_err(|e| Error::msg(format!("launch: cannot find the current binary: {e}")))?;
    let args = options.args.clone().unwrap_or_else(|| std::env::args().skip(1).collect());
    let rdv = options.rendezvous.clone().unwrap_or_else(|| {
        let nonce = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
        Rendezvous::File(std::env::temp_dir().join(format!("graphed-rdv-{}-{nonce}", std::process::id())))
    });
    if let Rendezvous::File(p) = &rdv {
        let _ = std::fs::remove_file(p);
    }
    let mut children: Vec<Child> = Vec::with_capacity(world_size);
    for rank in 0..world_size {
        let child = Command::new(&exe)
            .args(&args)
            .env(ENV_RANK, rank.to_string())
            .env(ENV_WORLD_SIZE, world_size.to_string())
            .env(ENV_LOCAL_RANK, rank.to_string())
            .env(ENV_RENDEZVOUS, rdv.to_env())
            // NVLink SHARP (multicast) objects fail under CUDA graphs on some drivers, and
            // reserve memory per communicator; see docs/DESIGN-DECISIONS.md.
            .env("NCCL_NVLS_ENABLE", "0")
            .spawn();
        match child {
            Ok(c) => children.push(c),
            Err(e) => {
                kill_all(&mut children);
                return Err(Error::Dist(crate::DistError::RankFailed {
                    rank,
                    status: format!("could not start: {e}"),
                }));
            }
        }
    }
    let result = wait_all(&mut children, options.deadline, options.grace);
    if let Rendezvous::File(p) = &rdv {
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

/// Polls every child until all exit; the first failure (after `grace` for the others to end
/// on their own) or the deadline kills the rest.
fn wait_all(children: &mut [Child], deadline: Duration, grace: Duration) -> Result<()> {
    let mut end = Instant::now() + deadline;
    let mut done = vec![false; children.len()];
    let mut first: Option<(usize, String)> = None;
    while done.iter().any(|d| !d) {
        for (rank, c) in children.iter_mut().enumerate() {
            if done[rank] {
                continue;
            }
            let failed = match c.try_wait() {
                Ok(Some(status)) if status.success() => None,
                Ok(Some(status)) => Some(format!("exited with {status}")),
                Ok(None) => continue,
                Err(e) => Some(format!("could not be waited for: {e}")),
            };
            done[rank] = true;
            if let (Some(status), None) = (failed, &first) {
                first = Some((rank, status));
                end = end.min(Instant::now() + grace);
            }
        }
        if done.iter().all(|d| *d) {
            break;
        }
        if Instant::now() >= end {
            let rank = done.iter().position(|d| !d).unwrap_or(0);
            kill_all(children);
            let (rank, status) =
                first.unwrap_or((rank, format!("was still running after the deadline of {deadline:?}")));
            return Err(Error::Dist(crate::DistError::RankFailed { rank, status }));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    match first {
        Some((rank, status)) => Err(Error::Dist(crate::DistError::RankFailed { rank, status })),
        None => Ok(()),
    }
}
