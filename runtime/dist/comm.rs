//! `Communicator`: collectives and point-to-point transfers on tensors, issued on the device's
//! stream so that they are captured into graphs like any other op.

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::sync::Arc;
use std::time::Duration;

use cudarc::nccl::sys;

use super::host::HostGroup;
use super::nccl::NcclComm;
use super::ReduceOp;
use crate::backend::BackendKind;
use crate::{AbortReason, Collective, DType, Device, DistError, Error, GraphOptions, Result, ShapeProblem, Tensor};

/// One transfer of [`Communicator::send_recv_group`]: a tensor and the peer rank.
#[derive(Clone, Debug)]
pub enum P2pOp {
    /// Sends the tensor to the peer, which posts a matching receive.
    Send(Tensor, usize),
    /// Receives into the tensor what the peer sends (the same number of elements).
    Recv(Tensor, usize),
}

impl P2pOp {
    fn parts(&self) -> (&Tensor, usize) {
        match self {
            P2pOp::Send(t, peer) | P2pOp::Recv(t, peer) => (t, *peer),
        }
    }
}

pub(crate) enum Imp {
    Host(Arc<HostGroup>),
    Nccl(NcclComm),
}

pub(crate) struct Inner {
    pub(crate) rank: usize,
    pub(crate) world: usize,
    pub(crate) device: Device,
    pub(crate) timeout: Duration,
    pub(crate) imp: Imp,
}

/// One rank's handle to a group of ranks: NCCL on GPUs (one process per GPU), or emulated
/// ranks (threads sharing memory) on the host backend, with the same semantics.
///
/// Every call is issued on the rank's device stream: outside a capture it runs (host) or is
/// queued (GPU) now; inside one it is captured and runs on every replay. Every wait has a
/// deadline; a rank that times out or fails aborts the group, so every rank gets a typed error
/// ([`DistError::CommTimeout`](crate::DistError::CommTimeout), [`DistError::CommAborted`](crate::DistError::CommAborted) with its
/// [`AbortReason`](crate::AbortReason), [`DistError::CollectiveMismatch`](crate::DistError::CollectiveMismatch), [`DistError::TransferSizeMismatch`](crate::DistError::TransferSizeMismatch)), never a hang.
///
/// ```
/// use graphed::dist::{self, ReduceOp};
/// use graphed::Tensor;
/// let sums = dist::run_emulated(2, |comm| {
///     let t = Tensor::full(comm.device(), &[3], comm.rank() as f32 + 1.0)?;
///     comm.all_reduce(&t, ReduceOp::Sum)?;
///     t.to_vec()
/// })?;
/// assert_eq!(sums, vec![vec![3.0; 3], vec![3.0; 3]]);
/// # Ok::<(), graphed::Error>(())
/// ```
#[derive(Clone)]
pub struct Communicator(pub(crate) Arc<Inner>);

impl std::fmt::Debug for Communicator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match self.0.imp {
            Imp::Host(_) => "emulated",
            Imp::Nccl(_) => "nccl",
        };
        write!(f, "Communicator({kind}, rank {} of {}, {})", self.0.rank, self.0.world, self.0.device.name())
    }
}

impl Communicator {
    /// This rank, from 0.
    pub fn rank(&self) -> usize {
        self.0.rank
    }

    /// The number of ranks.
    pub fn world_size(&self) -> usize {
        self.0.world
    }

    /// The rank's device (its stream orders the collectives).
    pub fn device(&self) -> &Device {
        &self.0.device
    }

    /// How long a wait may take before the group is aborted.
    pub fn timeout(&self) -> Duration {
        self.0.timeout
    }

    /// Whether the ranks are emulated (threads on the host backend).
    pub fn is_emulated(&self) -> bool {
        matches!(self.0.imp, Imp::Host(_))
    }

    /// Aborts the group: every rank's pending and later calls fail with a typed error,
    /// [`DistError::CommAborted`] with [`AbortReason::Requested`] naming this rank and `reason`
    /// where the group's first abort is this one (on NCCL, the other processes see NCCL's
    /// error instead).
    pub fn abort(&self, reason: &str) {
        self.abort_for(AbortReason::Requested { rank: self.0.rank, reason: reason.to_string() });
    }

    /// Aborts the group for `reason` (kept unless the group was aborted already).
    pub(crate) fn abort_for(&self, reason: AbortReason) {
        match &self.0.imp {
            Imp::Host(g) => g.abort(reason),
            Imp::Nccl(n) => n.abort(reason),
        }
    }

    fn check(&self, op: &'static str, tensors: &[&Tensor]) -> Result<()> {
        for t in tensors {
            if t.device() != &self.0.device {
                let (device, communicator) = (t.device().name(), self.0.device.name());
                return Err(DistError::Device { op, param: None, device, communicator }.into());
            }
            if t.dtype() != DType::F32 {
                return Err(Error::DType { op, got: t.dtype(), expected: DType::F32 });
            }
            t.check_fresh()?;
        }
        Ok(())
    }

    /// One point-to-point transfer's tensor and peer, checked as a group of them is: for a
    /// caller that must refuse before it changes anything of its own.
    pub(crate) fn check_transfer(&self, op: &'static str, t: &Tensor, peer: usize) -> Result<()> {
        self.check(op, &[t])?;
        self.check_peer(op, peer)
    }

    fn check_peer(&self, op: &'static str, peer: usize) -> Result<()> {
        if peer >= self.0.world || peer == self.0.rank {
            return Err(DistError::Peer { op, rank: self.0.rank, peer, world: self.0.world }.into());
        }
        Ok(())
    }

    /// Runs a host collective now or records it into the capture in progress.
    fn host_op(
        &self,
        name: &'static str,
        f: impl Fn(&HostGroup, usize, Duration) -> Result<()> + Send + Sync + 'static,
    ) -> Result<()> {
        let backend = |communicator| DistError::Backend { op: name, communicator, device: self.0.device.name() };
        let Imp::Host(group) = &self.0.imp else {
            return Err(backend("NCCL").into());
        };
        let BackendKind::Host(h) = &self.0.device.backend().kind else {
            return Err(backend("emulated").into());
        };
        let (group, rank, timeout) = (group.clone(), self.0.rank, self.0.timeout);
        if self.0.device.backend().faults.fires(crate::backend::FaultPoint::Collective) {
            // What NCCL's error path does: this rank's call fails and the group is aborted.
            let message = "ncclSystemError: unhandled system error".to_string();
            group.abort(AbortReason::Nccl { rank, call: name, message: message.clone() });
            return Err(Error::Dist(DistError::Nccl { rank, call: name, message }));
        }
        h.run(name, move || f(&group, rank, timeout))
    }

    /// Issues the collectives of `f` on a second stream forked from the device stream, so they
    /// overlap what the device stream does next; [`Communicator::join_side_stream`] must follow
    /// (before the capture ends, or before the results are read). On emulated ranks the calls
    /// simply run in order.
    pub(crate) fn on_side_stream(&self, f: impl FnOnce() -> Result<()>) -> Result<()> {
        match &self.0.imp {
            Imp::Host(_) => f(),
            Imp::Nccl(c) => c.on_side_stream(f),
        }
    }

    /// Makes the device stream wait for the side stream's collectives.
    pub(crate) fn join_side_stream(&self) -> Result<()> {
        match &self.0.imp {
            Imp::Host(_) => Ok(()),
            Imp::Nccl(c) => c.join_side_stream(),
        }
    }

    /// Replaces `t` on every rank by the sum (or mean) of all ranks' `t`. Every rank gets
    /// bitwise the same result.
    pub fn all_reduce(&self, t: &Tensor, op: ReduceOp) -> Result<()> {
        self.check("all_reduce", &[t])?;
        let n = t.numel();
        let world = self.0.world;
        match &self.0.imp {
            Imp::Host(_) => {
                let p = t.host_ptr()?;
                self.host_op("all_reduce", move |g, rank, timeout| {
                    let all = g.exchange(rank, Collective::AllReduce { elements: n, op }, p.read(), timeout)?;
                    p.write(&reduce(&all, op, world));
                    Ok(())
                })
            }
            Imp::Nccl(c) => {
                let p = NcclComm::ptr(t.cuda_ptr()?);
                // SAFETY: `p` is a live device buffer of `n` floats on this communicator's GPU
                // (checked above); in-place all-reduce is allowed.
                c.issue("ncclAllReduce", |comm, s| unsafe {
                    sys::ncclAllReduce(p, p, n, sys::ncclDataType_t::ncclFloat32, red(op), comm, s)
                })
            }
        }
    }

    /// All-reduces several tensors as one bucket: one exchange on emulated ranks, one NCCL
    /// group (a single fused launch) on GPUs. Each tensor ends as [`Communicator::all_reduce`]
    /// would leave it.
    pub fn all_reduce_bucket(&self, tensors: &[Tensor], op: ReduceOp) -> Result<()> {
        let refs: Vec<&Tensor> = tensors.iter().collect();
        self.check("all_reduce_bucket", &refs)?;
        let sizes: Vec<usize> = tensors.iter().map(Tensor::numel).collect();
        let world = self.0.world;
        match &self.0.imp {
            Imp::Host(_) => {
                let ptrs = tensors.iter().map(Tensor::host_ptr).collect::<Result<Vec<_>>>()?;
                self.host_op("all_reduce_bucket", move |g, rank, timeout| {
                    let data: Vec<f32> = ptrs.iter().flat_map(|p| p.read()).collect();
                    let what = Collective::AllReduceBucket { elements: sizes.clone(), op };
                    let all = g.exchange(rank, what, data, timeout)?;
                    let reduced = reduce(&all, op, world);
                    let mut at = 0;
                    for (p, n) in ptrs.iter().zip(&sizes) {
                        p.write(&reduced[at..at + n]);
                        at += n;
                    }
                    Ok(())
                })
            }
            Imp::Nccl(c) => {
                let ptrs = tensors.iter().map(|t| t.cuda_ptr().map(NcclComm::ptr)).collect::<Result<Vec<_>>>()?;
                c.grouped(|| {
                    for (p, n) in ptrs.iter().zip(&sizes) {
                        let p = *p;
                        // SAFETY: each `p` is a live device buffer of `n` floats on this GPU.
                        c.issue("ncclAllReduce", |comm, s| unsafe {
                            sys::ncclAllReduce(p, p, *n, sys::ncclDataType_t::ncclFloat32, red(op), comm, s)
                        })?;
                    }
                    Ok(())
                })
            }
        }
    }

    /// Writes every rank's `input`, in rank order, into `output` (`world_size` times the
    /// elements of `input`).
    pub fn all_gather(&self, input: &Tensor, output: &Tensor) -> Result<()> {
        self.check("all_gather", &[input, output])?;
        let n = input.numel();
        if output.numel() != n * self.0.world {
            let problem = ShapeProblem::Ranks { arg: "output", got: output.numel(), ranks: self.0.world, part: n };
            return Err(Error::shape("all_gather", problem));
        }
        match &self.0.imp {
            Imp::Host(_) => {
                let (i, o) = (input.host_ptr()?, output.host_ptr()?);
                self.host_op("all_gather", move |g, rank, timeout| {
                    let all = g.exchange(rank, Collective::AllGather { elements: n }, i.read(), timeout)?;
                    o.write(&all.concat());
                    Ok(())
                })
            }
            Imp::Nccl(c) => {
                let (i, o) = (NcclComm::ptr(input.cuda_ptr()?), NcclComm::ptr(output.cuda_ptr()?));
                // SAFETY: `i` holds `n` floats and `o` holds `world * n` (checked above).
                c.issue("ncclAllGather", |comm, s| unsafe {
                    sys::ncclAllGather(i, o, n, sys::ncclDataType_t::ncclFloat32, comm, s)
                })
            }
        }
    }

    /// Reduces `input` (`world_size` equal parts) over the ranks and writes part `rank` of the
    /// result into `output`.
    pub fn reduce_scatter(&self, input: &Tensor, output: &Tensor, op: ReduceOp) -> Result<()> {
        self.check("reduce_scatter", &[input, output])?;
        let (n, world) = (output.numel(), self.0.world);
        if input.numel() != n * world {
            let problem = ShapeProblem::Ranks { arg: "input", got: input.numel(), ranks: world, part: n };
            return Err(Error::shape("reduce_scatter", problem));
        }
        match &self.0.imp {
            Imp::Host(_) => {
                let (i, o) = (input.host_ptr()?, output.host_ptr()?);
                self.host_op("reduce_scatter", move |g, rank, timeout| {
                    let all = g.exchange(rank, Collective::ReduceScatter { elements: n, op }, i.read(), timeout)?;
                    let parts: Vec<Vec<f32>> = all.iter().map(|v| v[rank * n..(rank + 1) * n].to_vec()).collect();
                    o.write(&reduce(&parts, op, world));
                    Ok(())
                })
            }
            Imp::Nccl(c) => {
                let (i, o) = (NcclComm::ptr(input.cuda_ptr()?), NcclComm::ptr(output.cuda_ptr()?));
                // SAFETY: `i` holds `world * n` floats and `o` holds `n` (checked above).
                c.issue("ncclReduceScatter", |comm, s| unsafe {
                    sys::ncclReduceScatter(i, o, n, sys::ncclDataType_t::ncclFloat32, red(op), comm, s)
                })
            }
        }
    }

    /// Copies `root`'s `t` into every other rank's `t`.
    pub fn broadcast(&self, t: &Tensor, root: usize) -> Result<()> {
        self.check("broadcast", &[t])?;
        if root >= self.0.world {
            return Err(DistError::Root { op: "broadcast", root, world: self.0.world }.into());
        }
        let n = t.numel();
        match &self.0.imp {
            Imp::Host(_) => {
                let p = t.host_ptr()?;
                self.host_op("broadcast", move |g, rank, timeout| {
                    let all = g.exchange(rank, Collective::Broadcast { elements: n, root }, p.read(), timeout)?;
                    p.write(&all[root]);
                    Ok(())
                })
            }
            Imp::Nccl(c) => {
                let p = NcclComm::ptr(t.cuda_ptr()?);
                // SAFETY: `p` holds `n` floats on this GPU; in-place broadcast is allowed.
                c.issue("ncclBroadcast", |comm, s| unsafe {
                    sys::ncclBroadcast(p, p, n, sys::ncclDataType_t::ncclFloat32, root as i32, comm, s)
                })
            }
        }
    }

    /// Sends `t` to `peer`, which must post a matching [`Communicator::recv`]. The send may not
    /// complete before that receive is posted (NCCL's may not): two ranks that each send to the
    /// other before receiving wait forever; [`Communicator::send_recv_group`] posts both at once.
    pub fn send(&self, t: &Tensor, peer: usize) -> Result<()> {
        self.p2p("send", &[P2pOp::Send(t.clone(), peer)])
    }

    /// Receives into `t` what `peer` sends (the same number of elements).
    pub fn recv(&self, t: &Tensor, peer: usize) -> Result<()> {
        self.p2p("recv", &[P2pOp::Recv(t.clone(), peer)])
    }

    /// Posts several sends and receives as one group and waits for all of them
    /// (`ncclGroupStart`/`ncclGroupEnd` on NCCL, PyTorch's `batch_isend_irecv`): no transfer of
    /// the group waits for another, so two ranks that each send to and receive from the other
    /// in one group both complete, where a [`Communicator::send`] followed by a
    /// [`Communicator::recv`] on both would wait forever. Messages between two ranks still
    /// arrive in the order they were posted. Every tensor is checked first (device, dtype,
    /// staleness, peer), and a receive needs a buffer no other transfer of the group uses
    /// ([`DistError::GroupAliased`](crate::DistError::GroupAliased)); a refused group posts nothing.
    ///
    /// ```
    /// use graphed::dist::{self, P2pOp};
    /// use graphed::Tensor;
    /// // Each rank sends its rank to the other and receives the other's: one group each.
    /// let got = dist::run_emulated(2, |comm| {
    ///     let peer = 1 - comm.rank();
    ///     let mine = Tensor::full(comm.device(), &[2], comm.rank() as f32)?;
    ///     let theirs = Tensor::zeros(comm.device(), &[2])?;
    ///     comm.send_recv_group(&[P2pOp::Send(mine, peer), P2pOp::Recv(theirs.clone(), peer)])?;
    ///     theirs.to_vec()
    /// })?;
    /// assert_eq!(got, vec![vec![1.0; 2], vec![0.0; 2]]);
    /// # Ok::<(), graphed::Error>(())
    /// ```
    pub fn send_recv_group(&self, ops: &[P2pOp]) -> Result<()> {
        self.p2p("send_recv_group", ops)
    }

    /// Point-to-point transfers, as one group when there are several: checked, then issued.
    fn p2p(&self, op: &'static str, ops: &[P2pOp]) -> Result<()> {
        for (i, o) in ops.iter().enumerate() {
            let (t, peer) = o.parts();
            self.check_transfer(op, t, peer)?;
            if let P2pOp::Recv(..) = o {
                if let Some(other) = ops.iter().enumerate().position(|(j, x)| j != i && x.parts().0.same_buffer(t)) {
                    return Err(DistError::GroupAliased { receive: i, other }.into());
                }
            }
        }
        if ops.is_empty() {
            return Ok(());
        }
        match &self.0.imp {
            Imp::Host(_) => {
                let (mut sends, mut recvs) = (Vec::new(), Vec::new());
                for o in ops {
                    match o {
                        P2pOp::Send(t, peer) => sends.push((*peer, t.host_ptr()?)),
                        P2pOp::Recv(t, peer) => recvs.push((*peer, t.host_ptr()?, t.numel())),
                    }
                }
                let sources: Vec<usize> = recvs.iter().map(|r| r.0).collect();
                self.host_op(op, move |g, rank, timeout| {
                    let data = sends.iter().map(|(peer, p)| (*peer, p.read())).collect();
                    let received = g.send_recv(rank, data, &sources, timeout)?;
                    for ((peer, p, n), data) in recvs.iter().zip(received) {
                        if data.len() != *n {
                            let (peer, sent, expected) = (*peer, data.len(), *n);
                            g.abort(AbortReason::TransferSizeMismatch { sender: peer, receiver: rank, sent, expected });
                            return Err(Error::Dist(DistError::TransferSizeMismatch { rank, peer, sent, expected }));
                        }
                        p.write(&data);
                    }
                    Ok(())
                })
            }
            Imp::Nccl(c) => {
                let calls =
                    ops.iter().map(|o| Ok((o, NcclComm::ptr(o.parts().0.cuda_ptr()?)))).collect::<Result<Vec<_>>>()?;
                let issue = || {
                    for (o, p) in &calls {
                        let (t, peer) = o.parts();
                        let (p, n, peer) = (*p, t.numel(), peer as i32);
                        match o {
                            // SAFETY: `p` holds `n` floats on this GPU (checked above).
                            P2pOp::Send(..) => c.issue("ncclSend", |comm, s| unsafe {
                                sys::ncclSend(p, n, sys::ncclDataType_t::ncclFloat32, peer, comm, s)
                            })?,
                            // SAFETY: `p` holds `n` floats on this GPU, used by no other
                            // transfer of the group (checked above).
                            P2pOp::Recv(..) => c.issue("ncclRecv", |comm, s| unsafe {
                                sys::ncclRecv(p, n, sys::ncclDataType_t::ncclFloat32, peer, comm, s)
                            })?,
                        }
                    }
                    Ok(())
                };
                if calls.len() == 1 {
                    issue()
                } else {
                    c.grouped(issue)
                }
            }
        }
    }

    /// Waits until every rank reaches this point and its queued work is done. Illegal while
    /// capturing.
    pub fn barrier(&self) -> Result<()> {
        self.0.device.backend().forbid_during_capture("barrier")?;
        let t = Tensor::zeros(&self.0.device, &[1])?;
        self.all_reduce(&t, ReduceOp::Sum)?;
        self.synchronize()
    }

    /// Waits for this rank's queued work, with the deadline (a dead peer is an error, not a
    /// hang in the driver). Illegal while capturing.
    pub fn synchronize(&self) -> Result<()> {
        self.0.device.backend().forbid_during_capture("synchronize")?;
        match &self.0.imp {
            Imp::Host(_) => Ok(()),
            Imp::Nccl(c) => c.wait_stream(),
        }
    }

    /// Checks that every rank passes the same `hash` for `what` (a schedule, a parameter
    /// layout); when they differ, every rank gets [`DistError::ScheduleMismatch`](crate::DistError::ScheduleMismatch). Illegal while
    /// capturing (it reads the result back).
    pub fn check_same(&self, what: &str, hash: u64) -> Result<()> {
        self.0.device.backend().forbid_during_capture("check_same")?;
        let words = [
            (hash >> 48) as f32,
            ((hash >> 32) & 0xffff) as f32,
            ((hash >> 16) & 0xffff) as f32,
            (hash & 0xffff) as f32,
        ];
        let mine = Tensor::from_slice(&self.0.device, &words, &[4])?;
        let all = Tensor::zeros(&self.0.device, &[4 * self.0.world])?;
        self.all_gather(&mine, &all)?;
        // Wait with the deadline first: a plain copy back would wait forever on a dead peer.
        self.synchronize()?;
        let v = all.to_vec()?;
        let hashes: Vec<u64> =
            v.chunks(4).map(|w| w.iter().fold(0u64, |acc, x| (acc << 16) | (*x as u64 & 0xffff))).collect();
        if hashes.iter().any(|h| *h != hashes[0]) {
            return Err(Error::Dist(crate::DistError::ScheduleMismatch {
                rank: self.0.rank,
                what: what.to_string(),
                hashes,
            }));
        }
        Ok(())
    }
}

impl Communicator {
    /// Checks that every rank is about to capture with the same [`GraphOptions`] (warm-up
    /// count, `order`, mode, chaining) over `chunks` chunks, so that their collectives line up;
    /// when they differ, every rank gets [`DistError::ScheduleMismatch`](crate::DistError::ScheduleMismatch) before anything is
    /// captured. `make_graphed` runs this check itself for modules that report their group
    /// ([`crate::Module::collectives`]: [`super::DataParallel`], [`super::PipelineStage`]);
    /// call it before a capture whose collectives it cannot see (capture-time hooks that
    /// gather and scatter shards, say).
    ///
    /// ```
    /// use graphed::dist;
    /// use graphed::{Error, GraphOptions};
    /// let r = dist::run_emulated(2, |comm| {
    ///     let opts = GraphOptions::new().warmup(2 + comm.rank());
    ///     comm.check_graph_options(&opts, 1)
    /// });
    /// assert!(matches!(r, Err(Error::Dist(graphed::DistError::ScheduleMismatch { .. }))));
    /// ```
    pub fn check_graph_options(&self, options: &GraphOptions, chunks: usize) -> Result<()> {
        let mut h = DefaultHasher::new();
        let o = options;
        (o.warmup, &o.order, o.allow_unused_input, o.training, o.chained, chunks).hash(&mut h);
        format!("{:?}", o.capture_mode).hash(&mut h);
        self.check_same("graph options (warm-up, order, mode, chunks)", h.finish())
    }
}

/// The ranks' values combined in rank order (so every rank computes bitwise the same).
fn reduce(all: &[Vec<f32>], op: ReduceOp, world: usize) -> Vec<f32> {
    let mut out = all[0].clone();
    for v in &all[1..] {
        for (o, x) in out.iter_mut().zip(v) {
            *o += *x;
        }
    }
    if op == ReduceOp::Avg {
        out.iter_mut().for_each(|o| *o /= world as f32);
    }
    out
}

fn red(op: ReduceOp) -> sys::ncclRedOp_t {
    match op {
        ReduceOp::Sum => sys::ncclRedOp_t::ncclSum,
        ReduceOp::Avg => sys::ncclRedOp_t::ncclAvg,
    }
}
