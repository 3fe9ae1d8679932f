//! The NCCL communicator: one rank per process and GPU, collectives on the device's stream.
//!
//! Every `unsafe` NCCL call of the crate lives here. The communicator is non-blocking
//! (`config.blocking = 0`): a call may return `ncclInProgress`, and we poll
//! `ncclCommGetAsyncError` until it settles or a deadline passes, then `ncclCommAbort`, so a
//! dead or diverging peer is an error on this rank rather than a hang.
//!
//! Collectives captured into graphs are not calls we can poll: they run on the stream. So
//! the communicator also watches the stream. A watchdog thread aborts the group once NCCL
//! reports an error or the stream makes no progress for the deadline (a peer that died in
//! the middle of a captured all-reduce: NCCL sees no error over NVLink or shared memory), and
//! every wait on the stream polls and ends with the group's error by the deadline, so neither
//! a replay, a synchronize nor a destructor waits forever.

use std::collections::VecDeque;
use std::ffi::{c_void, CStr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use cudarc::driver::{sys as cu, CudaEvent, CudaStream};
use cudarc::nccl::sys;

use crate::backend::cuda::driver_err;
pub(crate) use crate::backend::cuda::probe_nccl as probe;
use crate::backend::{Backend, BackendKind, CudaBackend, StreamWatch};
use crate::error::NcclProblem;
use crate::{AbortReason, DistError, Error, Result};

/// Bytes of an NCCL unique id, exchanged through the rendezvous.
pub(crate) const UNIQUE_ID_BYTES: usize = 128;

/// The number of CUDA GPUs here; 0 when the driver cannot be loaded or has none.
pub(crate) fn gpu_count() -> usize {
    // SAFETY: only tries to dlopen the driver by name.
    if !unsafe { cu::is_culib_present() } {
        return 0;
    }
    cudarc::driver::CudaContext::device_count().map_or(0, |n| n.max(0) as usize)
}

/// A fresh unique id (rank 0 makes it and shares it through the rendezvous).
pub(crate) fn unique_id() -> Result<Vec<u8>> {
    probe()?;
    let id = cudarc::nccl::result::get_uniqueid().map_err(|e| {
        Error::Dist(crate::DistError::NcclUnavailable { reason: NcclProblem::call("ncclGetUniqueId", e.0) })
    })?;
    Ok(id.internal.iter().map(|c| *c as u8).collect())
}

/// Why a communicator was aborted: what later calls on it report.
#[derive(Clone, Debug)]
enum Cause {
    /// A wait passed its deadline (a peer is dead, stuck, or issued something else).
    Timeout { op: &'static str, waited: Duration },
    /// NCCL reported an error (a peer's death seen by the network, a failed call:
    /// [`AbortReason::Nccl`]), or `Communicator::abort` asked for it.
    Aborted(AbortReason),
}

impl Cause {
    /// NCCL's `message` for `call` on `rank`.
    fn failed(rank: usize, call: &'static str, message: String) -> Cause {
        Cause::Aborted(AbortReason::Nccl { rank, call, message })
    }
}

/// The raw communicator, shared with the watchdog. Every use of the handle happens before
/// `ncclCommAbort` frees it: users take the lock for reading (short, non-blocking calls),
/// the abort for writing. An abort runs on a thread of its own, and marks the handle aborted
/// first, so no call waits for it: a waiting rank gets its error within its deadline even if
/// NCCL's abort takes long.
struct Handle {
    comm: sys::ncclComm_t,
    lock: RwLock<()>,
    /// Set once an abort (or the destroy) begins: no call starts on the handle after it.
    aborted: AtomicBool,
    /// The first reason the group was aborted, and when.
    cause: Mutex<Option<(Cause, Instant)>>,
    stop: AtomicBool,
}

// SAFETY: NCCL allows its non-blocking calls (enqueue, ncclCommGetAsyncError, ncclCommAbort)
// from any thread; the lock keeps every call before the abort that frees the handle, and
// enqueues are serialised by the device's stream gate.
unsafe impl Send for Handle {}
// SAFETY: as above.
unsafe impl Sync for Handle {}

impl Handle {
    /// Runs `f` on the live handle, or returns `None` once aborted. Never waits for an abort
    /// in progress (it polls the lock instead of queueing behind the abort's write).
    fn with<R>(&self, f: impl FnOnce(sys::ncclComm_t) -> R) -> Option<R> {
        loop {
            if self.aborted.load(Ordering::Acquire) {
                return None;
            }
            if let Ok(_guard) = self.lock.try_read() {
                if self.aborted.load(Ordering::Acquire) {
                    return None;
                }
                return Some(f(self.comm));
            }
            std::thread::sleep(Duration::from_micros(20));
        }
    }

    /// The communicator's asynchronous state, `None` once aborted.
    fn async_error(&self) -> Option<sys::ncclResult_t> {
        self.with(|comm| {
            let mut state = sys::ncclResult_t::ncclSuccess;
            // SAFETY: the handle is live (not aborted) while the read lock is held.
            let q = unsafe { sys::ncclCommGetAsyncError(comm, &mut state) };
            if q == sys::ncclResult_t::ncclSuccess {
                state
            } else {
                q
            }
        })
    }

    /// Aborts once, for `cause` (the first cause is kept): NCCL fails the pending work, so
    /// collectives stuck on the stream return, and every peer sees an error. Returns at once;
    /// `ncclCommAbort` runs on a thread of its own.
    fn abort(self: &Arc<Self>, cause: Cause) {
        self.cause.lock().unwrap_or_else(|e| e.into_inner()).get_or_insert((cause, Instant::now()));
        if self.aborted.swap(true, Ordering::AcqRel) || self.comm.is_null() {
            return;
        }
        let handle = self.clone();
        let free = move || {
            let _no_users = handle.lock.write().unwrap_or_else(|e| e.into_inner());
            // SAFETY: the handle is live (marked aborted just now, by this caller only) and no
            // other call is using it (write lock); it is freed here, once.
            let _ = unsafe { sys::ncclCommAbort(handle.comm) };
        };
        let spawned = std::thread::Builder::new().name("graphed-nccl-abort".into()).spawn(free.clone());
        if spawned.is_err() {
            free();
        }
    }

    /// How long ago the group was aborted, if it was.
    fn aborted_for(&self) -> Option<Duration> {
        self.cause.lock().unwrap_or_else(|e| e.into_inner()).as_ref().map(|(_, at)| at.elapsed())
    }

    /// The error later calls get once the group was aborted.
    fn failure(&self, rank: usize) -> Error {
        let cause = self.cause.lock().unwrap_or_else(|e| e.into_inner()).clone().map(|(c, _)| c);
        Error::Dist(match cause {
            Some(Cause::Timeout { op, waited }) => DistError::CommTimeout { rank, op, waited },
            Some(Cause::Aborted(reason)) => DistError::CommAborted { rank, reason },
            None => DistError::CommAborted { rank, reason: AbortReason::NoCommunicator },
        })
    }
}

/// How long after an abort the collectives it released have to return; a stream still busy
/// after that is stuck for good, and waits on it give up at once.
const ABORT_GRACE: Duration = Duration::from_secs(5);

/// How often the watchdog looks for an asynchronous error (a dead peer, a network failure)
/// and at the stream's progress.
const WATCHDOG_PERIOD: Duration = Duration::from_millis(100);

/// The progress of the device's stream as the watchdog sees it: events it records there,
/// oldest first, each with when. When the oldest has not completed within the deadline, the
/// stream is stuck (a collective waits for a peer that will never come: NCCL itself notices no
/// dead peer on NVLink or shared memory), and the watchdog aborts the group, which releases
/// the stuck kernels and everything waiting for them, a graph launch included.
#[derive(Default)]
struct Progress {
    marks: VecDeque<(CudaEvent, Instant)>,
    spare: Vec<CudaEvent>,
}

impl Progress {
    /// The most marks kept; a stuck stream gets no new ones past it.
    const MOST: usize = 4096;

    /// How long the stream has been stuck at its oldest pending mark; records a new mark.
    /// `None` while a capture is in progress (the watchdog neither waits for it nor adds to it).
    fn poll(&mut self, c: &CudaBackend) -> Option<Duration> {
        let _entered = c.gate.try_enter()?;
        c.bind().ok()?;
        while let Some((event, _)) = self.marks.front() {
            if !event.try_is_complete().unwrap_or(false) {
                break;
            }
            let (event, _) = self.marks.pop_front().expect("looked at it");
            self.spare.push(event);
        }
        if self.marks.len() < Self::MOST {
            let event = match self.spare.pop() {
                Some(e) => Some(e),
                None => c.ctx.new_event(None).ok(),
            };
            if let Some(event) = event {
                if event.record(&c.stream).is_ok() {
                    self.marks.push_back((event, Instant::now()));
                }
            }
        }
        self.marks.front().map(|(_, at)| at.elapsed())
    }
}

/// Aborts the communicator as soon as NCCL reports an asynchronous error, or once the device
/// stream makes no progress for `timeout`, so that a stream stuck behind a dead peer is
/// released (and any wait or launch behind it ends) instead of hanging.
fn watchdog(handle: Arc<Handle>, backend: Arc<Backend>, rank: usize, timeout: Duration) {
    let mut progress = Progress::default();
    while !handle.stop.load(Ordering::Acquire) {
        std::thread::sleep(WATCHDOG_PERIOD);
        match handle.async_error() {
            None => return,
            Some(sys::ncclResult_t::ncclSuccess | sys::ncclResult_t::ncclInProgress) => {}
            Some(r) => return handle.abort(Cause::failed(rank, "ncclCommGetAsyncError", describe(r))),
        }
        let stuck = match &backend.kind {
            BackendKind::Cuda(c) => progress.poll(c),
            BackendKind::Host(_) => None,
        };
        if stuck.is_some_and(|s| s >= timeout) {
            let op = "collectives queued on the device stream (the watchdog saw no progress)";
            return handle.abort(Cause::Timeout { op, waited: timeout });
        }
    }
}

/// The communicator as a watcher of the device stream's waits: a wait ends once the group
/// failed or the deadline passed (the group is then aborted).
struct CommWatch {
    handle: Arc<Handle>,
    rank: usize,
    timeout: Duration,
    /// Whether a wait has reported the group's abort already.
    reported: AtomicBool,
}

impl StreamWatch for CommWatch {
    fn check(&self, waited: Option<Duration>) -> Result<()> {
        if self.handle.aborted.load(Ordering::Acquire) {
            let first = !self.reported.swap(true, Ordering::AcqRel);
            // Reported once; after that a wait gives up only when the aborted work has not
            // returned within the grace (it never will), so teardown does not wait forever.
            let stuck = waited.is_some() && self.handle.aborted_for().is_some_and(|d| d >= ABORT_GRACE);
            return if first || stuck { Err(self.handle.failure(self.rank)) } else { Ok(()) };
        }
        let Some(waited) = waited else { return Ok(()) };
        match self.handle.async_error() {
            None | Some(sys::ncclResult_t::ncclSuccess | sys::ncclResult_t::ncclInProgress) => {}
            Some(r) => {
                let (message, call) = (describe(r), "ncclCommGetAsyncError");
                self.handle.abort(Cause::failed(self.rank, call, message.clone()));
                self.reported.store(true, Ordering::Release);
                return Err(Error::Dist(DistError::Nccl { rank: self.rank, call, message }));
            }
        }
        if waited >= self.timeout {
            let op = "wait for the device stream";
            self.handle.abort(Cause::Timeout { op, waited });
            self.reported.store(true, Ordering::Release);
            return Err(Error::Dist(crate::DistError::CommTimeout { rank: self.rank, op, waited }));
        }
        Ok(())
    }
}

/// A second stream for collectives that overlap the device stream's work: forked from it and
/// joined back by events, so a capture records both branches.
struct Side {
    stream: Arc<CudaStream>,
    fork: CudaEvent,
    join: CudaEvent,
    /// Whether calls go to the side stream now.
    active: AtomicBool,
}

/// A live NCCL communicator bound to one device's stream, with a watchdog thread.
pub(crate) struct NcclComm {
    handle: Arc<Handle>,
    side: Side,
    watchdog: Option<std::thread::JoinHandle<()>>,
    /// Registered with the device stream's waits (the backend holds it weakly).
    watch: Arc<CommWatch>,
    backend: Arc<Backend>,
    rank: usize,
    timeout: Duration,
}

impl std::fmt::Debug for NcclComm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "NcclComm(rank {})", self.rank)
    }
}

fn cuda(backend: &Backend) -> Result<&CudaBackend> {
    match &backend.kind {
        BackendKind::Cuda(c) => Ok(c),
        BackendKind::Host(_) => {
            Err(DistError::Backend { op: "NCCL communicator", communicator: "NCCL", device: "the host backend".into() }
                .into())
        }
    }
}

fn describe(r: sys::ncclResult_t) -> String {
    // SAFETY: ncclGetErrorString returns a static C string for every result code.
    let s = unsafe { sys::ncclGetErrorString(r) };
    if s.is_null() {
        format!("{r:?}")
    } else {
        // SAFETY: non-null, NUL-terminated and static (NCCL's string table).
        format!("{r:?}: {}", unsafe { CStr::from_ptr(s) }.to_string_lossy())
    }
}

impl NcclComm {
    /// Joins the group `id` as `rank` of `world` on `backend`'s GPU, within the deadline.
    pub(crate) fn new(
        backend: Arc<Backend>,
        rank: usize,
        world: usize,
        id: &[u8],
        timeout: Duration,
    ) -> Result<NcclComm> {
        let version = probe()?;
        if id.len() != UNIQUE_ID_BYTES {
            return Err(DistError::UniqueIdLength { got: id.len(), expected: UNIQUE_ID_BYTES }.into());
        }
        let c = cuda(&backend)?;
        let mut unique = sys::ncclUniqueId { internal: [0; UNIQUE_ID_BYTES] };
        for (d, s) in unique.internal.iter_mut().zip(id) {
            *d = *s as _;
        }
        let mut config = config(version);
        let mut comm: sys::ncclComm_t = std::ptr::null_mut();
        c.bind()?;
        // SAFETY: `comm` and `config` are valid for the call; the id came from ncclGetUniqueId.
        let r = unsafe { sys::ncclCommInitRankConfig(&mut comm, world as i32, unique, rank as i32, &mut config) };
        let handle = Arc::new(Handle {
            comm,
            lock: RwLock::new(()),
            aborted: AtomicBool::new(comm.is_null()),
            cause: Mutex::new(None),
            stop: AtomicBool::new(false),
        });
        let watch = Arc::new(CommWatch { handle: handle.clone(), rank, timeout, reported: AtomicBool::new(false) });
        let side = Side {
            stream: c.ctx.new_stream().map_err(driver_err("cuStreamCreate"))?,
            fork: c.ctx.new_event(None).map_err(driver_err("cuEventCreate"))?,
            join: c.ctx.new_event(None).map_err(driver_err("cuEventCreate"))?,
            active: AtomicBool::new(false),
        };
        let mut me = NcclComm { handle, side, watchdog: None, watch, backend, rank, timeout };
        me.settle("ncclCommInitRankConfig", r)?;
        // Every wait on the device stream now polls and ends by this communicator's deadline.
        let as_watch: Arc<dyn StreamWatch> = me.watch.clone();
        cuda(&me.backend)?.watch(Arc::downgrade(&as_watch));
        let (h, b) = (me.handle.clone(), me.backend.clone());
        let spawned = std::thread::Builder::new()
            .name(format!("graphed-nccl-watchdog-{rank}"))
            .spawn(move || watchdog(h, b, rank, timeout));
        me.watchdog = Some(spawned.map_err(|source| DistError::Io { what: "cannot start the NCCL watchdog", source })?);
        Ok(me)
    }

    pub(crate) fn rank(&self) -> usize {
        self.rank
    }

    fn aborted_error(&self) -> Error {
        self.handle.failure(self.rank)
    }

    /// Waits until the last call settles (`ncclInProgress` turns into a result), aborting the
    /// communicator after the deadline or on an error, so every peer errors too.
    fn settle(&self, call: &'static str, first: sys::ncclResult_t) -> Result<()> {
        let deadline = Instant::now() + self.timeout;
        let mut r = first;
        while r == sys::ncclResult_t::ncclInProgress || r == sys::ncclResult_t::ncclSuccess {
            match self.handle.async_error() {
                None => return Err(self.aborted_error()),
                Some(sys::ncclResult_t::ncclSuccess) => return Ok(()),
                Some(sys::ncclResult_t::ncclInProgress) => {}
                Some(err) => {
                    r = err;
                    break;
                }
            }
            if Instant::now() >= deadline {
                self.handle.abort(Cause::Timeout { op: call, waited: self.timeout });
                return Err(Error::Dist(crate::DistError::CommTimeout {
                    rank: self.rank,
                    op: call,
                    waited: self.timeout,
                }));
            }
            std::thread::sleep(Duration::from_micros(50));
        }
        let message = describe(r);
        self.handle.abort(Cause::failed(self.rank, call, message.clone()));
        Err(Error::Dist(DistError::Nccl { rank: self.rank, call, message }))
    }

    /// Aborts the communicator for `reason` (idempotent, returns at once): pending and later
    /// NCCL work fails on every rank.
    pub(crate) fn abort(&self, reason: AbortReason) {
        self.handle.abort(Cause::Aborted(reason));
    }

    /// Issues one NCCL call on the device stream (through the stream gate, so it captures like
    /// any other stream work) and waits for it to be enqueued.
    pub(crate) fn issue(
        &self,
        call: &'static str,
        f: impl FnOnce(sys::ncclComm_t, sys::cudaStream_t) -> sys::ncclResult_t,
    ) -> Result<()> {
        let c = cuda(&self.backend)?;
        let _entered = c.gate.enter()?;
        c.bind()?;
        let on_side = self.side.active.load(Ordering::Acquire);
        let stream = if on_side { self.side.stream.cu_stream() } else { c.stream.cu_stream() } as sys::cudaStream_t;
        let r = if self.backend.faults.fires(crate::backend::FaultPoint::Collective) {
            sys::ncclResult_t::ncclSystemError
        } else {
            self.handle.with(|comm| f(comm, stream)).ok_or_else(|| self.aborted_error())?
        };
        self.settle(call, r)
    }

    /// Issues the NCCL calls `f` makes (through [`NcclComm::issue`]) as one group: NCCL posts
    /// them together at `ncclGroupEnd` and launches them as one, so no call of the group waits
    /// for another (a send and a receive between two ranks, several all-reduces fused). The
    /// group is ended even when a call of `f` fails, so this thread never stays inside it.
    pub(crate) fn grouped(&self, f: impl FnOnce() -> Result<()>) -> Result<()> {
        // SAFETY: starts a group on this thread; ended below whatever `f` returns.
        self.issue("ncclGroupStart", |_, _| unsafe { sys::ncclGroupStart() })?;
        let issued = f();
        // SAFETY: ends the group started above; NCCL launches its calls on the stream.
        let ended = self.issue("ncclGroupEnd", |_, _| unsafe { sys::ncclGroupEnd() });
        issued.and(ended)
    }

    /// Forks the side stream from the device stream and sends the calls of `f` there.
    pub(crate) fn on_side_stream(&self, f: impl FnOnce() -> Result<()>) -> Result<()> {
        let c = cuda(&self.backend)?;
        {
            let _entered = c.gate.enter()?;
            c.bind()?;
            self.side.fork.record(&c.stream).map_err(driver_err("cuEventRecord"))?;
            self.side.stream.wait(&self.side.fork).map_err(driver_err("cuStreamWaitEvent"))?;
        }
        self.side.active.store(true, Ordering::Release);
        let r = f();
        self.side.active.store(false, Ordering::Release);
        r
    }

    /// Makes the device stream wait for everything issued on the side stream so far.
    pub(crate) fn join_side_stream(&self) -> Result<()> {
        let c = cuda(&self.backend)?;
        let _entered = c.gate.enter()?;
        c.bind()?;
        self.side.join.record(&self.side.stream).map_err(driver_err("cuEventRecord"))?;
        c.stream.wait(&self.side.join).map_err(driver_err("cuStreamWaitEvent"))
    }

    /// Waits until the stream's work is done, polling so that a dead peer ends in an abort and
    /// an error after the deadline instead of a hang in cuStreamSynchronize.
    pub(crate) fn wait_stream(&self) -> Result<()> {
        let c = cuda(&self.backend)?;
        let deadline = Instant::now() + self.timeout;
        loop {
            let state = {
                let _entered = c.gate.enter()?;
                c.bind()?;
                // SAFETY: the stream is live for the backend's lifetime.
                unsafe { cu::cuStreamQuery(c.stream.cu_stream()) }
            };
            match state {
                // Idle: unless the group was aborted meanwhile (the work may hold what the
                // aborted collectives left).
                cu::CUresult::CUDA_SUCCESS if self.handle.aborted.load(Ordering::Acquire) => {
                    self.watch.reported.store(true, Ordering::Release);
                    return Err(self.aborted_error());
                }
                cu::CUresult::CUDA_SUCCESS => return Ok(()),
                cu::CUresult::CUDA_ERROR_NOT_READY => {}
                other => return Err(Error::cuda("cuStreamQuery", cudarc::driver::DriverError(other))),
            }
            self.settle("ncclCommGetAsyncError", sys::ncclResult_t::ncclSuccess)?;
            if Instant::now() >= deadline {
                self.handle.abort(Cause::Timeout { op: "wait for the stream", waited: self.timeout });
                self.watch.reported.store(true, Ordering::Release);
                return Err(Error::Dist(crate::DistError::CommTimeout {
                    rank: self.rank,
                    op: "wait for the stream",
                    waited: self.timeout,
                }));
            }
            std::thread::sleep(Duration::from_micros(50));
        }
    }

    /// Pointer of a device buffer as NCCL wants it.
    pub(crate) fn ptr(p: u64) -> *mut c_void {
        p as *mut c_void
    }
}

/// A non-blocking communicator config, as NCCL_CONFIG_INITIALIZER fills it, declared as the
/// loaded library's version so that it reads exactly the fields it knows.
///
/// `GRAPHED_NCCL_BLOCKING=1` makes the communicator blocking (init and calls wait inside
/// NCCL; deadlines then rest on the watchdog and the polled stream waits).
fn config(version: i32) -> sys::ncclConfig_t {
    const UNDEF: i32 = i32::MIN;
    let blocking = i32::from(std::env::var("GRAPHED_NCCL_BLOCKING").is_ok_and(|v| v == "1"));
    sys::ncclConfig_t {
        size: std::mem::size_of::<sys::ncclConfig_t>(),
        magic: 0xcafe_beef,
        version: version as u32,
        blocking,
        cgaClusterSize: UNDEF,
        minCTAs: UNDEF,
        maxCTAs: UNDEF,
        netName: std::ptr::null(),
        splitShare: UNDEF,
        trafficClass: UNDEF,
        commName: std::ptr::null(),
        collnetEnable: UNDEF,
        CTAPolicy: UNDEF,
        shrinkShare: UNDEF,
        nvlsCTAs: UNDEF,
        nChannelsPerNetPeer: UNDEF,
        nvlinkCentricSched: UNDEF,
        graphUsageMode: UNDEF,
        numRmaCtx: UNDEF,
        maxP2pPeers: UNDEF,
    }
}

impl NcclComm {
    /// Finalizes (flushes this rank's pending work with the peers) within the deadline, then
    /// destroys; aborts instead when that fails or takes too long.
    fn close(&self) {
        let finalized = self.handle.with(|comm| {
            // SAFETY: the handle is live (read lock held); finalize is non-blocking here.
            unsafe { sys::ncclCommFinalize(comm) }
        });
        let Some(r) = finalized else { return };
        if self.settle("ncclCommFinalize", r).is_err() {
            return; // settle aborted it
        }
        let _no_users = self.handle.lock.write().unwrap_or_else(|e| e.into_inner());
        if !self.handle.aborted.swap(true, Ordering::AcqRel) {
            // SAFETY: finalized, no other user (write lock); destroyed once, then marked.
            let _ = unsafe { sys::ncclCommDestroy(self.handle.comm) };
        }
    }
}

impl Drop for NcclComm {
    fn drop(&mut self) {
        self.handle.stop.store(true, Ordering::Release);
        if let Some(w) = self.watchdog.take() {
            let _ = w.join();
        }
        self.close();
    }
}
