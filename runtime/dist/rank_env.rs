//! The rank environment: which launcher started this process (graphed's `launch`, torchrun,
//! Slurm's srun, Open MPI's mpirun) and, read from that launcher's variables, this rank, the
//! world size, the GPU ordinal and where the ranks meet.
//!
//! Detection reads an environment given as a lookup function, so it can be tested without
//! touching the process's own variables. A launcher is recognised by its rank variable alone;
//! once it is, every other variable it needs must be there and well formed, or detection gives
//! a typed error that names the variable and what to set.

use super::launch::Rendezvous;
use crate::error::Launcher;
use crate::{DistError, Error, Result};

/// The rank of this process (from 0).
pub const ENV_RANK: &str = "GRAPHED_RANK";
/// The number of ranks.
pub const ENV_WORLD_SIZE: &str = "GRAPHED_WORLD_SIZE";
/// The rank's index on its host: the GPU ordinal it uses.
pub const ENV_LOCAL_RANK: &str = "GRAPHED_LOCAL_RANK";
/// Where ranks meet: a file path (shared by every rank) or `host:port` (rank 0 listens there).
/// Under any launcher, it replaces the address that launcher's variables would give.
pub const ENV_RENDEZVOUS: &str = "GRAPHED_RENDEZVOUS";
/// Which launchers' variables to look for besides graphed's own: `auto` (the default: all),
/// `none`, or one of `torchrun`, `slurm`, `mpirun`. `GRAPHED_RANK` is always honoured.
///
/// ```
/// use graphed::dist::{RankEnv, ENV_LAUNCHER};
/// // Inside a Slurm batch script, a test run that must not take itself for task 0:
/// let vars = [("SLURM_PROCID", "0"), ("SLURM_NTASKS", "4"), (ENV_LAUNCHER, "none")];
/// let env = RankEnv::detect(|k| vars.iter().find(|(n, _)| *n == k).map(|(_, v)| v.to_string()))?;
/// assert_eq!(env, None);
/// # Ok::<(), graphed::Error>(())
/// ```
pub const ENV_LAUNCHER: &str = "GRAPHED_LAUNCHER";

/// Under torchrun, the rendezvous listens at `MASTER_ADDR:MASTER_PORT + TORCHRUN_PORT_OFFSET`:
/// torchrun's own store (its agent's TCPStore) already listens on `MASTER_PORT`.
pub const TORCHRUN_PORT_OFFSET: u16 = 1;
/// Under Slurm without `MASTER_PORT`, the rendezvous port is
/// `SLURM_PORT_BASE + SLURM_JOB_ID % SLURM_PORT_SPAN`: fixed for every task of a job, different
/// for most jobs sharing a node, below Linux's ephemeral ports and clear of torchrun's 29400
/// and 29500.
pub const SLURM_PORT_BASE: u16 = 30000;
/// See [`SLURM_PORT_BASE`].
///
/// ```
/// use graphed::dist::{RankEnv, Rendezvous, SLURM_PORT_BASE, SLURM_PORT_SPAN};
/// let vars = [("SLURM_PROCID", "0"), ("SLURM_NTASKS", "2"), ("SLURM_LOCALID", "0"),
///             ("SLURM_NODELIST", "gpu[07-08]"), ("SLURM_JOB_ID", "4242")];
/// let env = RankEnv::detect(|k| vars.iter().find(|(n, _)| *n == k).map(|(_, v)| v.to_string()))?;
/// let port = SLURM_PORT_BASE + 4242 % SLURM_PORT_SPAN;
/// assert_eq!(env.map(|e| e.rendezvous), Some(Rendezvous::Tcp(format!("gpu07:{port}"))));
/// # Ok::<(), graphed::Error>(())
/// ```
pub const SLURM_PORT_SPAN: u16 = 2000;

/// This process's place in a group, from the environment `launch` or another launcher set.
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
    /// The launcher whose variables these are.
    pub launcher: Launcher,
}

impl RankEnv {
    /// Reads this process's rank variables (see [`RankEnv::detect`]); `Ok(None)` when no
    /// launcher's rank variable is set (this process is not a rank).
    ///
    /// ```
    /// if let Some(env) = graphed::dist::RankEnv::from_env()? {
    ///     println!("rank {} of {}, started by {}", env.rank, env.world_size, env.launcher);
    /// }
    /// # Ok::<(), graphed::Error>(())
    /// ```
    pub fn from_env() -> Result<Option<RankEnv>> {
        // A value that is not UTF-8 stays visible (lossily), so it fails to parse with an
        // error naming its variable rather than reading as unset.
        Self::detect(|k| std::env::var_os(k).map(|v| v.to_string_lossy().into_owned()))
    }

    /// Reads the rank variables of the environment `lookup` gives (name to value), trying the
    /// launchers in this order, the first whose rank variable is set winning:
    ///
    /// | launcher | rank, world size, local rank | rendezvous |
    /// |---|---|---|
    /// | [`Launcher::Graphed`] | `GRAPHED_RANK`, `GRAPHED_WORLD_SIZE`, `GRAPHED_LOCAL_RANK` (default: the rank) | `GRAPHED_RENDEZVOUS` |
    /// | [`Launcher::Torchrun`] | `RANK`, `WORLD_SIZE`, `LOCAL_RANK` | `MASTER_ADDR`:`MASTER_PORT`+1 |
    /// | [`Launcher::OpenMpi`] | `OMPI_COMM_WORLD_RANK`, `OMPI_COMM_WORLD_SIZE`, `OMPI_COMM_WORLD_LOCAL_RANK` | `MASTER_ADDR`:`MASTER_PORT` |
    /// | [`Launcher::Slurm`] | `SLURM_PROCID`, `SLURM_STEP_NUM_TASKS` or `SLURM_NTASKS`, `SLURM_LOCALID` | `MASTER_ADDR` or the first host of `SLURM_STEP_NODELIST`/`SLURM_JOB_NODELIST`/`SLURM_NODELIST`, port `MASTER_PORT` or [`SLURM_PORT_BASE`] + `SLURM_JOB_ID` % [`SLURM_PORT_SPAN`] |
    ///
    /// The inner launcher comes first (torchrun or mpirun started inside a Slurm job see
    /// Slurm's variables too), and `GRAPHED_RENDEZVOUS`, when set, replaces the rendezvous of
    /// any launcher. `GRAPHED_LAUNCHER` ([`ENV_LAUNCHER`]) narrows which launchers are looked
    /// for. An empty value counts as unset. `Ok(None)`: no rank variable is set.
    ///
    /// Errors ([`DistError`] inside [`Error::Dist`]): `RankVarMissing` (e.g. `RANK` without
    /// `WORLD_SIZE`), `RankVarMalformed` (not a number, a bad port, an unparsable Slurm node
    /// list, an unknown `GRAPHED_LAUNCHER`), `RankOutOfRange` (rank or local rank not below
    /// the world size).
    ///
    /// ```
    /// use std::collections::HashMap;
    /// use graphed::dist::{Launcher, RankEnv, Rendezvous};
    /// let vars: HashMap<&str, &str> = HashMap::from([
    ///     ("RANK", "3"), ("WORLD_SIZE", "8"), ("LOCAL_RANK", "3"),
    ///     ("MASTER_ADDR", "node0"), ("MASTER_PORT", "29500"),
    /// ]);
    /// let env = RankEnv::detect(|k| vars.get(k).map(|v| v.to_string()))?.expect("a torchrun rank");
    /// assert_eq!((env.rank, env.world_size, env.local_rank), (3, 8, 3));
    /// assert_eq!(env.launcher, Launcher::Torchrun);
    /// assert_eq!(env.rendezvous, Rendezvous::Tcp("node0:29501".into()));
    ///
    /// // RANK without WORLD_SIZE is an error that says what to set.
    /// let r = RankEnv::detect(|k| (k == "RANK").then(|| "0".to_string()));
    /// assert!(matches!(
    ///     r,
    ///     Err(graphed::Error::Dist(graphed::DistError::RankVarMissing { var: "WORLD_SIZE", .. }))
    /// ));
    /// # Ok::<(), graphed::Error>(())
    /// ```
    pub fn detect(lookup: impl Fn(&str) -> Option<String>) -> Result<Option<RankEnv>> {
        let vars = Vars { lookup: &lookup };
        let wanted = vars.wanted()?;
        for launcher in Launcher::ALL {
            let asked = launcher == Launcher::Graphed || wanted.is_none_or(|w| w == Some(launcher));
            if asked && vars.get(launcher.rank_var()).is_some() {
                return vars.read(launcher).map(Some);
            }
        }
        Ok(None)
    }
}

/// An environment, read on behalf of one launcher at a time.
struct Vars<'a> {
    lookup: &'a dyn Fn(&str) -> Option<String>,
}

impl Vars<'_> {
    fn get(&self, var: &str) -> Option<String> {
        (self.lookup)(var).map(|v| v.trim().to_string()).filter(|v| !v.is_empty())
    }

    /// `None`: every launcher; `Some(None)`: none but graphed's own; `Some(Some(l))`: `l`.
    fn wanted(&self) -> Result<Option<Option<Launcher>>> {
        let Some(value) = self.get(ENV_LAUNCHER) else { return Ok(None) };
        Ok(match value.to_ascii_lowercase().as_str() {
            "auto" => None,
            "none" | "graphed" => Some(None),
            "torchrun" => Some(Some(Launcher::Torchrun)),
            "slurm" | "srun" => Some(Some(Launcher::Slurm)),
            "mpirun" | "openmpi" | "ompi" => Some(Some(Launcher::OpenMpi)),
            _ => {
                return Err(malformed(
                    Launcher::Graphed,
                    ENV_LAUNCHER,
                    &value,
                    "one of auto, none, torchrun, slurm, mpirun",
                ))
            }
        })
    }

    fn required(&self, launcher: Launcher, var: &'static str) -> Result<String> {
        self.get(var).ok_or(Error::Dist(DistError::RankVarMissing { launcher, var, hint: None }))
    }

    fn number(&self, launcher: Launcher, var: &'static str) -> Result<usize> {
        let v = self.required(launcher, var)?;
        v.parse().map_err(|_| malformed(launcher, var, &v, "a non-negative integer"))
    }

    fn port(&self, launcher: Launcher, var: &'static str) -> Result<Option<u16>> {
        match self.get(var) {
            None => Ok(None),
            Some(v) => match v.parse::<u16>() {
                Ok(p) if p > 0 => Ok(Some(p)),
                _ => Err(malformed(launcher, var, &v, "a TCP port (1 to 65535)")),
            },
        }
    }

    fn read(&self, launcher: Launcher) -> Result<RankEnv> {
        let (rank_var, world_var, local_var) = match launcher {
            Launcher::Graphed => (ENV_RANK, ENV_WORLD_SIZE, ENV_LOCAL_RANK),
            Launcher::Torchrun => ("RANK", "WORLD_SIZE", "LOCAL_RANK"),
            Launcher::OpenMpi => ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"),
            // srun sets SLURM_NTASKS for the step unless --preserve-env keeps the job's value;
            // SLURM_STEP_NUM_TASKS is always the step's.
            Launcher::Slurm => {
                let world =
                    if self.get("SLURM_STEP_NUM_TASKS").is_some() { "SLURM_STEP_NUM_TASKS" } else { "SLURM_NTASKS" };
                ("SLURM_PROCID", world, "SLURM_LOCALID")
            }
        };
        let rank = self.number(launcher, rank_var)?;
        let world_size = self.number(launcher, world_var)?;
        if world_size == 0 {
            return Err(malformed(launcher, world_var, "0", "a positive integer"));
        }
        // graphed's own local rank may be left out on one host, as before other launchers.
        let local_rank = match (launcher, self.get(local_var)) {
            (Launcher::Graphed, None) => rank,
            _ => self.number(launcher, local_var)?,
        };
        for (var, r) in [(rank_var, rank), (local_var, local_rank)] {
            if r >= world_size {
                return Err(Error::Dist(DistError::RankOutOfRange { launcher, var, rank: r, world_size }));
            }
        }
        let rendezvous = match self.get(ENV_RENDEZVOUS) {
            Some(r) => Rendezvous::parse(&r),
            None => self.rendezvous(launcher)?,
        };
        Ok(RankEnv { rank, world_size, local_rank, rendezvous, launcher })
    }

    /// The rendezvous a launcher's own variables give (`GRAPHED_RENDEZVOUS` unset).
    fn rendezvous(&self, launcher: Launcher) -> Result<Rendezvous> {
        let missing = |var: &'static str, hint: &'static str| {
            Error::Dist(DistError::RankVarMissing { launcher, var, hint: Some(hint) })
        };
        match launcher {
            Launcher::Graphed => Err(missing(
                ENV_RENDEZVOUS,
                "dist::launch sets it; by hand, set it to tcp://host:port (rank 0 listens there) or a path every rank can read",
            )),
            Launcher::Torchrun => {
                let host = self.required(launcher, "MASTER_ADDR")?;
                let port = self.port(launcher, "MASTER_PORT")?.ok_or_else(|| {
                    missing("MASTER_PORT", "torchrun sets it with MASTER_ADDR; set it, or set GRAPHED_RENDEZVOUS=tcp://host:port")
                })?;
                let ours = port.checked_add(TORCHRUN_PORT_OFFSET).ok_or_else(|| {
                    malformed(
                        launcher,
                        "MASTER_PORT",
                        &port.to_string(),
                        "a port below 65535 (the rendezvous listens on the next one; or set GRAPHED_RENDEZVOUS)",
                    )
                })?;
                Ok(Rendezvous::Tcp(host_port(&host, ours)))
            }
            Launcher::OpenMpi => {
                let hint = "mpirun does not say where rank 0 runs: set GRAPHED_RENDEZVOUS=tcp://host:port (or a path every rank can read), or MASTER_ADDR and MASTER_PORT (mpirun -x MASTER_ADDR=node0 -x MASTER_PORT=29500 ...)";
                let host = self.get("MASTER_ADDR").ok_or_else(|| missing("MASTER_ADDR", hint))?;
                let port = self.port(launcher, "MASTER_PORT")?.ok_or_else(|| missing("MASTER_PORT", hint))?;
                Ok(Rendezvous::Tcp(host_port(&host, port)))
            }
            Launcher::Slurm => {
                let host = match self.get("MASTER_ADDR") {
                    Some(h) => h,
                    None => {
                        let var = ["SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"]
                            .into_iter()
                            .find(|v| self.get(v).is_some())
                            .ok_or_else(|| {
                                missing(
                                    "SLURM_NODELIST",
                                    "srun sets it (rank 0 runs on its first host); set it, MASTER_ADDR, or GRAPHED_RENDEZVOUS",
                                )
                            })?;
                        let list = self.get(var).unwrap_or_default();
                        first_host(&list).map_err(|why| {
                            let expected = "a Slurm host list such as `gpu[01-04,07],cpu3`";
                            let value = list.clone();
                            Error::Dist(DistError::RankVarMalformed { launcher, var, value, expected, why: Some(why) })
                        })?
                    }
                };
                let port = match self.port(launcher, "MASTER_PORT")? {
                    Some(p) => p,
                    None => {
                        let job = match self.get("SLURM_JOB_ID") {
                            Some(j) => j
                                .parse::<u64>()
                                .map_err(|_| malformed(launcher, "SLURM_JOB_ID", &j, "a job number"))?,
                            None => 0,
                        };
                        // Both terms fit in u16: the base plus a remainder below the span.
                        SLURM_PORT_BASE + (job % u64::from(SLURM_PORT_SPAN)) as u16
                    }
                };
                Ok(Rendezvous::Tcp(host_port(&host, port)))
            }
        }
    }
}

fn malformed(launcher: Launcher, var: &'static str, value: &str, expected: &'static str) -> Error {
    Error::Dist(DistError::RankVarMalformed { launcher, var, value: value.to_string(), expected, why: None })
}

/// `host:port`, with an IPv6 literal in brackets.
fn host_port(host: &str, port: u16) -> String {
    if host.contains(':') && !host.starts_with('[') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// The first host of a Slurm host list: `gpu[01-04,07],cpu3` gives `gpu01`, `a[2-3]-b[5,9]`
/// gives `a2-b5`. Every entry of the list is checked: brackets hold numbers and ranges
/// (`lo-hi`, `lo <= hi`), zero padding kept, and do not nest; no entry is empty.
fn first_host(list: &str) -> std::result::Result<String, &'static str> {
    // Entries end at commas outside brackets.
    let mut entries = Vec::new();
    let (mut open, mut start) = (false, 0);
    for (i, c) in list.char_indices() {
        match c {
            '[' if open => return Err("a `[` inside brackets"),
            '[' => open = true,
            ']' if !open => return Err("a `]` without its `[`"),
            ']' => open = false,
            ',' if !open => {
                entries.push(&list[start..i]);
                start = i + 1;
            }
            c if c.is_whitespace() => return Err("a space in a host name"),
            _ => {}
        }
    }
    if open {
        return Err("a `[` without its `]`");
    }
    entries.push(&list[start..]);
    let firsts = entries.into_iter().map(first_of_entry).collect::<std::result::Result<Vec<_>, _>>()?;
    Ok(firsts.into_iter().next().unwrap_or_default())
}

/// The first host of one entry of a host list (brackets already known to be balanced).
fn first_of_entry(entry: &str) -> std::result::Result<String, &'static str> {
    let mut host = String::new();
    let mut rest = entry;
    while let Some(at) = rest.find('[') {
        host.push_str(&rest[..at]);
        let close = at + rest[at..].find(']').ok_or("a `[` without its `]`")?;
        let inner = &rest[at + 1..close];
        let mut first = None;
        for item in inner.split(',') {
            let (lo, hi) = item.split_once('-').unwrap_or((item, item));
            let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
            let ordered = matches!((lo.parse::<u64>(), hi.parse::<u64>()), (Ok(a), Ok(b)) if a <= b);
            if !(digits(lo) && digits(hi) && ordered) {
                return Err("brackets that do not hold numbers and ascending ranges");
            }
            first.get_or_insert(lo);
        }
        host.push_str(first.unwrap_or_default());
        rest = &rest[close + 1..];
    }
    host.push_str(rest);
    if host.is_empty() {
        return Err("an empty entry");
    }
    Ok(host)
}
