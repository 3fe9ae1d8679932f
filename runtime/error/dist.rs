//! `DistError`: what can go wrong with several ranks (communicators, launcher, rendezvous),
//! inside [`super::Error::Dist`]. Every rank sees an error when the group fails, never a hang.

/// The errors of `graphed::dist`, as values a caller can match on.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DistError {
    /// The NCCL library cannot be loaded or used here.
    #[error("NCCL is not available: {reason}. Install libnccl (libnccl.so.2) and put it on LD_LIBRARY_PATH, or use dist::run_emulated on the host backend")]
    NcclUnavailable {
        /// Why NCCL could not be used.
        reason: String,
    },
    /// An NCCL call failed (the communicator was aborted; every rank sees an error).
    #[error("rank {rank}: NCCL call `{call}` failed: {message}")]
    Nccl {
        /// The rank that saw the failure.
        rank: usize,
        /// The call that failed.
        call: &'static str,
        /// NCCL's description of the error.
        message: String,
    },
    /// A wait passed its deadline; the group was aborted, so every rank gets an error.
    #[error("rank {rank}: `{op}` did not complete within {waited:?} (a peer is slow, dead or issued a different call); the group was aborted. Raise the timeout with dist::Config::timeout if the peers are only slow")]
    CommTimeout {
        /// The rank that timed out.
        rank: usize,
        /// The operation that waited.
        op: &'static str,
        /// How long it waited.
        waited: std::time::Duration,
    },
    /// The group was aborted by another rank (its error, a timeout, or its death).
    #[error("rank {rank}: the communicator was aborted: {reason}")]
    CommAborted {
        /// The rank that observed the abort.
        rank: usize,
        /// Why the group was aborted.
        reason: String,
    },
    /// Ranks issued different collectives at the same point (another op, size or root).
    #[error("rank {rank}: ranks issued different collectives at the same point: {detail}; every rank must issue the same sequence of collectives")]
    CollectiveMismatch {
        /// The rank reporting it.
        rank: usize,
        /// What each rank issued.
        detail: String,
    },
    /// Ranks set up different schedules (their hashes differ); found before any capture.
    #[error("rank {rank}: the ranks' {what} differ (hashes by rank: {hashes:x?}); every rank must capture the same schedule")]
    ScheduleMismatch {
        /// The rank reporting it.
        rank: usize,
        /// What was compared.
        what: String,
        /// Each rank's hash, by rank.
        hashes: Vec<u64>,
    },
    /// The rendezvous (a shared file, a TCP address, the rank variables) failed.
    #[error("rendezvous at {address}: {detail}")]
    Rendezvous {
        /// The file path, host:port, or environment variable.
        address: String,
        /// What went wrong.
        detail: String,
    },
    /// A launcher's rank variable is set but another one this rank needs is not.
    #[error("{launcher} environment: {var} is not set; {hint}")]
    RankVarMissing {
        /// The launcher whose variables were found.
        launcher: super::Launcher,
        /// The variable that is missing.
        var: &'static str,
        /// What sets it, or what to set instead.
        hint: String,
    },
    /// A rank variable (or `GRAPHED_LAUNCHER`) does not parse.
    #[error("{launcher} environment: {var}=`{value}` is not {expected}")]
    RankVarMalformed {
        /// The launcher whose variables were found.
        launcher: super::Launcher,
        /// The variable.
        var: &'static str,
        /// Its value.
        value: String,
        /// What it should be.
        expected: String,
    },
    /// A rank (or local rank) is not below the world size.
    #[error("{launcher} environment: {var}={rank} is not below the world size {world_size}; each rank must be in 0..{world_size}")]
    RankOutOfRange {
        /// The launcher whose variables were found.
        launcher: super::Launcher,
        /// The variable holding the rank.
        var: &'static str,
        /// Its value.
        rank: usize,
        /// The world size the launcher gave.
        world_size: usize,
    },
    /// A rank process of a launch failed; the others were stopped.
    #[error("launch: rank {rank} {status}; the other ranks were stopped")]
    RankFailed {
        /// The first rank that failed.
        rank: usize,
        /// Its exit status, or why it was killed.
        status: String,
    },
}
