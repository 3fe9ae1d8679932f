//! Emulated ranks: threads of one process that share memory, with NCCL's semantics.
//!
//! A collective is a host op like any other: run now, or recorded while the rank's stream
//! captures and run on every replay. Running one deposits the rank's contribution in a shared
//! round and waits (with a deadline) until every rank has deposited; the result is computed in
//! rank order, so every rank gets bitwise the same numbers. A rank that times out, fails or dies
//! aborts the group, and every rank waiting or arriving later gets a typed error.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::{AbortReason, Collective, DistError, Error, Result};

/// What one rank contributes to a round: the collective it issued (compared across ranks) and
/// its data.
struct Deposit {
    what: Collective,
    data: Vec<f32>,
}

#[derive(Default)]
struct State {
    /// Rounds completed so far.
    round: u64,
    slots: Vec<Option<Deposit>>,
    /// Every rank's data of the last completed round, by rank.
    result: Arc<Vec<Vec<f32>>>,
    /// Set once; every wait checks it.
    aborted: Option<AbortReason>,
    /// Point-to-point messages in flight, by (source, destination).
    mail: HashMap<(usize, usize), VecDeque<Vec<f32>>>,
    /// Messages sent and taken so far, by (source, destination).
    sent: HashMap<(usize, usize), u64>,
    taken: HashMap<(usize, usize), u64>,
}

/// The shared state of one emulated group.
pub(crate) struct HostGroup {
    world: usize,
    state: Mutex<State>,
    changed: Condvar,
}

impl std::fmt::Debug for HostGroup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "HostGroup({} ranks)", self.world)
    }
}

impl HostGroup {
    pub(crate) fn new(world: usize) -> Arc<HostGroup> {
        let state = State { slots: (0..world).map(|_| None).collect(), ..State::default() };
        Arc::new(HostGroup { world, state: Mutex::new(state), changed: Condvar::new() })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Aborts the group: every rank's current and later waits fail with `reason`.
    pub(crate) fn abort(&self, reason: AbortReason) {
        let mut st = self.lock();
        if st.aborted.is_none() {
            st.aborted = Some(reason);
        }
        drop(st);
        self.changed.notify_all();
    }

    /// Waits on the condvar until `done` holds, the group is aborted or the deadline passes.
    fn wait<'a>(
        &'a self,
        mut st: MutexGuard<'a, State>,
        rank: usize,
        op: &'static str,
        timeout: Duration,
        done: impl Fn(&State) -> bool,
    ) -> Result<MutexGuard<'a, State>> {
        let deadline = Instant::now() + timeout;
        loop {
            // A completed round is delivered even if a peer aborted right after it.
            if done(&st) {
                return Ok(st);
            }
            if let Some(reason) = &st.aborted {
                return Err(Error::Dist(DistError::CommAborted { rank, reason: reason.clone() }));
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                st.aborted = Some(AbortReason::TimedOut { rank, op, waited: timeout });
                drop(st);
                self.changed.notify_all();
                return Err(Error::Dist(DistError::CommTimeout { rank, op, waited: timeout }));
            }
            st = self.changed.wait_timeout(st, left).unwrap_or_else(|e| e.into_inner()).0;
        }
    }

    /// Deposits `data` for this rank's next round and returns every rank's data once all have
    /// deposited. Ranks that issued different collectives (`what`) abort the group.
    pub(crate) fn exchange(
        &self,
        rank: usize,
        what: Collective,
        data: Vec<f32>,
        timeout: Duration,
    ) -> Result<Arc<Vec<Vec<f32>>>> {
        let op = what.name();
        let mut st = self.lock();
        if let Some(reason) = &st.aborted {
            return Err(Error::Dist(DistError::CommAborted { rank, reason: reason.clone() }));
        }
        let my_round = st.round;
        st.slots[rank] = Some(Deposit { what, data });
        if st.slots.iter().all(Option::is_some) {
            let deposits: Vec<Deposit> = st.slots.iter_mut().map(|s| s.take().expect("all slots filled")).collect();
            if deposits.iter().any(|d| d.what != deposits[0].what) {
                let issued: Vec<Collective> = deposits.into_iter().map(|d| d.what).collect();
                st.aborted = Some(AbortReason::CollectiveMismatch { issued: issued.clone() });
                drop(st);
                self.changed.notify_all();
                return Err(Error::Dist(DistError::CollectiveMismatch { rank, issued }));
            }
            st.result = Arc::new(deposits.into_iter().map(|d| d.data).collect());
            st.round += 1;
            let result = st.result.clone();
            drop(st);
            self.changed.notify_all();
            return Ok(result);
        }
        // The round this rank waits in was the one that mismatched: its own error, not an echo.
        let st = self.wait(st, rank, op, timeout, |s| s.round > my_round).map_err(|e| match e {
            Error::Dist(DistError::CommAborted { rank, reason: AbortReason::CollectiveMismatch { issued } }) => {
                Error::Dist(DistError::CollectiveMismatch { rank, issued })
            }
            other => other,
        })?;
        Ok(st.result.clone())
    }

    /// Posts every send of a group (each hands its data to its destination), takes every
    /// receive (the oldest message from each source, waiting for it), then waits until every
    /// send was taken: NCCL's group semantics, so two ranks that each send to and receive from
    /// the other in one group both complete. A send completes only when its receive does, as
    /// NCCL's may, so a schedule that deadlocks on GPUs deadlocks (and times out) here too.
    /// Returns the received data in the order of `recvs`.
    pub(crate) fn send_recv(
        &self,
        rank: usize,
        sends: Vec<(usize, Vec<f32>)>,
        recvs: &[usize],
        timeout: Duration,
    ) -> Result<Vec<Vec<f32>>> {
        let mut st = self.lock();
        if let Some(reason) = &st.aborted {
            return Err(Error::Dist(DistError::CommAborted { rank, reason: reason.clone() }));
        }
        let mut posted = Vec::with_capacity(sends.len());
        for (dst, data) in sends {
            st.mail.entry((rank, dst)).or_default().push_back(data);
            let sent = st.sent.entry((rank, dst)).or_default();
            *sent += 1;
            posted.push((dst, *sent));
        }
        drop(st);
        self.changed.notify_all();
        let received = recvs.iter().map(|&src| self.take(rank, src, timeout)).collect::<Result<Vec<_>>>()?;
        let taken = |s: &State| posted.iter().all(|(dst, seq)| s.taken.get(&(rank, *dst)).is_some_and(|t| t >= seq));
        self.wait(self.lock(), rank, "send", timeout, taken).map(drop)?;
        Ok(received)
    }

    /// Takes the oldest message from `src`, waiting for it with a deadline.
    fn take(&self, rank: usize, src: usize, timeout: Duration) -> Result<Vec<f32>> {
        let st = self.lock();
        let has_mail = |s: &State| s.mail.get(&(src, rank)).is_some_and(|q| !q.is_empty());
        let mut st = self.wait(st, rank, "recv", timeout, has_mail)?;
        let queue = st.mail.get_mut(&(src, rank)).expect("waited for a message");
        let data = queue.pop_front().expect("waited for a message");
        *st.taken.entry((src, rank)).or_default() += 1;
        drop(st);
        self.changed.notify_all();
        Ok(data)
    }
}
