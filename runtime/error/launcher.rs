//! `Launcher`: which launcher started a rank process, named in its rank environment and in the
//! errors about its variables.

use std::fmt;

/// The launcher whose variables gave a process its rank (see `graphed::dist::RankEnv::detect`).
///
/// It prints as the launcher's name and the variable that identified it:
///
/// ```
/// use graphed::dist::Launcher;
/// assert_eq!(Launcher::Torchrun.to_string(), "torchrun (RANK)");
/// assert_eq!(Launcher::Slurm.name(), "Slurm srun");
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Launcher {
    /// `graphed::dist::launch`, or anything that sets `GRAPHED_RANK` and its companions.
    Graphed,
    /// torchrun (`torch.distributed.run`), or anything that sets its `RANK`, `WORLD_SIZE`,
    /// `LOCAL_RANK`, `MASTER_ADDR` and `MASTER_PORT`.
    Torchrun,
    /// Slurm's `srun`: `SLURM_PROCID`, `SLURM_NTASKS`, `SLURM_LOCALID` and the node list.
    Slurm,
    /// Open MPI's `mpirun`: `OMPI_COMM_WORLD_RANK`, `OMPI_COMM_WORLD_SIZE`,
    /// `OMPI_COMM_WORLD_LOCAL_RANK`.
    OpenMpi,
}

impl Launcher {
    /// Every launcher, in the order detection tries them (graphed's own variables first).
    pub const ALL: [Launcher; 4] = [Launcher::Graphed, Launcher::Torchrun, Launcher::OpenMpi, Launcher::Slurm];

    /// The launcher's name: `graphed`, `torchrun`, `Slurm srun`, `Open MPI mpirun`.
    pub fn name(self) -> &'static str {
        match self {
            Launcher::Graphed => "graphed",
            Launcher::Torchrun => "torchrun",
            Launcher::Slurm => "Slurm srun",
            Launcher::OpenMpi => "Open MPI mpirun",
        }
    }

    /// The variable whose presence says this launcher started the process.
    pub fn rank_var(self) -> &'static str {
        match self {
            Launcher::Graphed => "GRAPHED_RANK",
            Launcher::Torchrun => "RANK",
            Launcher::Slurm => "SLURM_PROCID",
            Launcher::OpenMpi => "OMPI_COMM_WORLD_RANK",
        }
    }
}

impl fmt::Display for Launcher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.name(), self.rank_var())
    }
}
