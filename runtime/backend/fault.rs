//! Fault injection, a test facility: the Nth allocation, slab growth, kernel launch, graph
//! instantiation, graph launch, copy, collective or file access of one device fails with the
//! error the driver or the OS would give there, once. A sweep over every such point checks
//! that each failure is a typed error that leaves nothing behind (tests/faults.rs).
//!
//! Each device has its own plan, so tests on separate devices never see each other's faults.
//! Disarmed (always, unless a test arms it), a point costs one relaxed load of a flag that is
//! never written, and the code that injects sits in a cold function.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

/// Where a fault can be injected. Each point fails with what the real call would return.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum FaultPoint {
    /// A block from a pool (`Tensor::empty` and everything that allocates): fails as if the
    /// pool had to grow and the device had no memory left ([`crate::Error::OutOfMemory`]).
    Alloc,
    /// A new slab from the driver (`cuMemAlloc`) or the host allocator: out of memory.
    SlabGrowth,
    /// A kernel or GEMM launch, eager or recorded into a capture (`cuLaunchKernel`, cuBLAS):
    /// `CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES`.
    KernelLaunch,
    /// Instantiating a captured graph (`cuGraphInstantiate`): `CUDA_ERROR_OUT_OF_MEMORY`.
    GraphInstantiate,
    /// Launching a graph, a replay (`cuGraphLaunch`): `CUDA_ERROR_OUT_OF_MEMORY`; nothing of
    /// the graph runs.
    GraphLaunch,
    /// A copy between host and device or within the device (`cuMemcpy*`):
    /// `CUDA_ERROR_OUT_OF_MEMORY` (no staging memory).
    Copy,
    /// Issuing a collective or a send/receive (NCCL, or an emulated rank): `ncclSystemError`,
    /// and the group is aborted, as NCCL's error path does.
    Collective,
    /// Reading a file (`load_safetensors`): the OS's I/O error (`EIO`).
    FileRead,
    /// Writing a file (`save_safetensors`): the OS's "no space left on device" (`ENOSPC`).
    FileWrite,
}

impl FaultPoint {
    /// Every point, in a fixed order.
    pub const ALL: [FaultPoint; 9] = [
        FaultPoint::Alloc,
        FaultPoint::SlabGrowth,
        FaultPoint::KernelLaunch,
        FaultPoint::GraphInstantiate,
        FaultPoint::GraphLaunch,
        FaultPoint::Copy,
        FaultPoint::Collective,
        FaultPoint::FileRead,
        FaultPoint::FileWrite,
    ];

    fn index(self) -> usize {
        self as usize
    }
}

/// How many times each point was passed since the plan was last armed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FaultCounts([u64; 9]);

impl FaultCounts {
    /// Passes of `point`.
    pub fn get(&self, point: FaultPoint) -> u64 {
        self.0[point.index()]
    }

    /// Passes of every point.
    pub fn total(&self) -> u64 {
        self.0.iter().sum()
    }
}

#[derive(Default)]
struct State {
    counts: FaultCounts,
    /// The point and the 0-based pass that fails next; cleared once it fired.
    target: Option<(FaultPoint, u64)>,
    fired: Option<(FaultPoint, u64)>,
}

/// One device's fault plan, shared by its backend's primitives.
#[derive(Default)]
pub(crate) struct Faults {
    armed: AtomicBool,
    state: Mutex<State>,
}

impl std::fmt::Debug for Faults {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.armed.load(Ordering::Relaxed) { "Faults(armed)" } else { "Faults(off)" })
    }
}

impl Faults {
    /// Whether the call at `point` must fail now (it counts the pass while armed).
    #[inline(always)]
    pub(crate) fn fires(&self, point: FaultPoint) -> bool {
        self.armed.load(Ordering::Relaxed) && self.pass(point)
    }

    #[cold]
    #[inline(never)]
    fn pass(&self, point: FaultPoint) -> bool {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let n = st.counts.0[point.index()];
        st.counts.0[point.index()] += 1;
        if st.target == Some((point, n)) {
            st.target = None;
            st.fired = Some((point, n));
            return true;
        }
        false
    }

    fn arm(&self, target: Option<(FaultPoint, u64)>) {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        *st = State { target, ..State::default() };
        self.armed.store(true, Ordering::Relaxed);
    }
}

/// A device's fault plan: count the points a workload passes, or make one of them fail.
///
/// ```
/// use graphed::fault::{FaultPlan, FaultPoint};
/// use graphed::{Device, Error, Tensor};
/// let dev = Device::host();
/// let plan = FaultPlan::of(&dev);
/// plan.fail(FaultPoint::Alloc, 1); // the second allocation from now fails, once
/// let a = Tensor::zeros(&dev, &[4])?;
/// assert!(matches!(Tensor::zeros(&dev, &[4]), Err(Error::OutOfMemory { .. })));
/// assert_eq!(plan.fired(), Some((FaultPoint::Alloc, 1)));
/// let b = Tensor::zeros(&dev, &[4])?; // a retry succeeds
/// plan.off();
/// # drop((a, b));
/// # Ok::<(), graphed::Error>(())
/// ```
#[derive(Clone, Debug)]
pub struct FaultPlan(Arc<Faults>);

impl FaultPlan {
    /// The plan of a backend's faults (see `Device`'s `FaultPlan::of`).
    pub(crate) fn new(faults: Arc<Faults>) -> FaultPlan {
        FaultPlan(faults)
    }

    /// Counts the points passed from now on, failing none.
    pub fn count(&self) {
        self.0.arm(None);
    }

    /// Makes pass `nth` (0-based, counted from now) of `point` fail, once; later passes
    /// succeed again. Counting restarts.
    pub fn fail(&self, point: FaultPoint, nth: u64) {
        self.0.arm(Some((point, nth)));
    }

    /// Disarms: no more counting, no more faults.
    pub fn off(&self) {
        self.0.armed.store(false, Ordering::Relaxed);
        let mut st = self.0.state.lock().unwrap_or_else(|e| e.into_inner());
        st.target = None;
    }

    /// The passes counted since the plan was last armed.
    pub fn counts(&self) -> FaultCounts {
        self.0.state.lock().unwrap_or_else(|e| e.into_inner()).counts
    }

    /// The fault that fired since the plan was last armed, if one did.
    pub fn fired(&self) -> Option<(FaultPoint, u64)> {
        self.0.state.lock().unwrap_or_else(|e| e.into_inner()).fired
    }
}

/// The driver error a failing call at `point` returns (see [`FaultPoint`]), as the real call's
/// error would be reported.
pub(crate) fn driver_error(call: &'static str, point: FaultPoint) -> crate::Error {
    use cudarc::driver::{sys::CUresult, DriverError};
    let code = match point {
        FaultPoint::KernelLaunch => CUresult::CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES,
        _ => CUresult::CUDA_ERROR_OUT_OF_MEMORY,
    };
    crate::Error::cuda(call, DriverError(code))
}
