//! The two backends behind one small internal interface.
//!
//! Ops match on [`BackendKind`] once: the host arm runs (or records) the CPU reference, the cuda
//! arm launches the kernel. User code never becomes generic over a backend. Both backends share
//! one capture-state type, [`StreamGate`], which every stream primitive passes.

mod capture;
mod cublaslt;
mod cublaslt_gemm;
pub(crate) mod cuda;
pub(crate) mod cuda_decoder;
mod cuda_gemm;
mod cuda_graph;
pub(crate) mod cuda_hopper;
mod cuda_user;
pub(crate) mod cudnn;
mod cudnn_tune;
pub(crate) mod fault;
pub(crate) mod host;
pub(crate) mod kernel_source;
mod kernels;
mod nodes;
#[cfg(test)]
mod programs;
mod ptx_cache;
mod tuning;

use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use crate::error::{DeviceError, OpError};
use crate::{DType, Error, Result};
pub use nodes::{CaptureMode, GraphNode, NodeKind};

pub use capture::is_capturing;
pub(crate) use capture::{LoopFold, StreamGate};
pub(crate) use cublaslt::{LtEpilogue, LtLinear};
pub(crate) use cuda::{CudaBackend, LaunchDims, StreamWatch};
pub(crate) use cuda_gemm::{GemmEx, Operand, RowGemmBatched, RowMat};
pub(crate) use cuda_graph::RawGraph;
pub(crate) use fault::Faults;
pub use fault::{FaultCounts, FaultPlan, FaultPoint};
pub(crate) use host::{HostBackend, HostPtr, HostSlab};
pub(crate) use kernels::{BuiltinKernel, FlashTiles, KArg, MultiTensor, RowTiles, Typed};

/// Which machine runs the ops.
#[derive(Debug)]
pub(crate) enum BackendKind {
    Host(HostBackend),
    Cuda(Box<CudaBackend>),
}

/// The layout [`Backend::resize_axes`] works on: `[outer, len1, mid, len2, inner]`, the two
/// lengths differing between source and destination (one axis: `mid` and both `len2` 1).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct AxesResize {
    pub(crate) outer: usize,
    /// (destination, source) lengths of the first axis.
    pub(crate) len1: (usize, usize),
    pub(crate) mid: usize,
    /// (destination, source) lengths of the second axis.
    pub(crate) len2: (usize, usize),
    pub(crate) inner: usize,
}

impl AxesResize {
    /// One axis: `[outer, len, inner]`.
    pub(crate) fn one(outer: usize, len: (usize, usize), inner: usize) -> AxesResize {
        AxesResize { outer, len1: len, mid: 1, len2: (1, 1), inner }
    }

    /// The elements of the destination and of the source.
    fn numels(&self) -> (usize, usize) {
        let common = self.outer * self.mid * self.inner;
        (common * self.len1.0 * self.len2.0, common * self.len1.1 * self.len2.1)
    }
}

/// Errors from drop paths (freeing a slab, destroying a graph), which cannot be returned where
/// they happen; each is also printed once to stderr. [`crate::Device::take_drop_errors`] reads
/// them.
#[derive(Debug, Default)]
pub(crate) struct DropErrors(Mutex<Vec<Error>>);

impl DropErrors {
    pub(crate) fn report(&self, error: Error) {
        eprintln!("graphed: error in a drop path: {error}");
        self.0.lock().unwrap_or_else(|e| e.into_inner()).push(error);
    }

    pub(crate) fn take(&self) -> Vec<Error> {
        std::mem::take(&mut *self.0.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

/// A backend plus the capture state of its stream.
#[derive(Debug)]
pub(crate) struct Backend {
    pub(crate) kind: BackendKind,
    pub(crate) gate: Arc<StreamGate>,
    pub(crate) drop_errors: Arc<DropErrors>,
    /// The device's fault plan (a test facility; disarmed unless a test arms it).
    pub(crate) faults: Arc<Faults>,
    /// Bytes of all slabs of all pools on this device.
    reserved: AtomicUsize,
    /// Whether f32 GEMMs may run on TF32 tensor cores (off unless the user opts in).
    pub(crate) tf32: AtomicBool,
}

/// The backend an op runs on: ops match on this once, running (or recording) the CPU
/// reference on the host and launching the kernel on CUDA.
pub(crate) enum Exec<'a> {
    Host(&'a HostBackend),
    Cuda(&'a CudaBackend),
}

/// An address in device (or host-backend) memory.
#[derive(Clone, Debug)]
pub(crate) enum Ptr {
    Host(HostPtr),
    Cuda(u64),
}

impl Backend {
    /// The host backend.
    pub(crate) fn host() -> Backend {
        let gate = Arc::new(StreamGate::default());
        let faults = Arc::new(Faults::default());
        Backend {
            kind: BackendKind::Host(HostBackend::new(gate.clone(), faults.clone())),
            gate,
            drop_errors: Arc::new(DropErrors::default()),
            faults,
            reserved: AtomicUsize::new(0),
            tf32: AtomicBool::new(false),
        }
    }

    /// The CUDA backend of GPU `ordinal`.
    pub(crate) fn open_cuda(ordinal: usize) -> Result<Backend> {
        let gate = Arc::new(StreamGate::default());
        let drop_errors = Arc::new(DropErrors::default());
        let faults = Arc::new(Faults::default());
        let cuda = CudaBackend::new(ordinal, gate.clone(), drop_errors.clone(), faults.clone())?;
        Ok(Backend {
            kind: BackendKind::Cuda(Box::new(cuda)),
            gate,
            drop_errors,
            faults,
            reserved: AtomicUsize::new(0),
            tf32: AtomicBool::new(false),
        })
    }

    /// A human-readable name: `cuda:0 (NVIDIA H200)` or `host`.
    pub(crate) fn name(&self) -> String {
        match &self.kind {
            BackendKind::Host(_) => "host".into(),
            BackendKind::Cuda(c) => format!("cuda:{} ({})", c.ordinal(), c.name()),
        }
    }

    pub(crate) fn is_host(&self) -> bool {
        matches!(self.kind, BackendKind::Host(_))
    }

    /// The CUDA state, on a GPU.
    pub(crate) fn cuda(&self) -> Option<&CudaBackend> {
        match &self.kind {
            BackendKind::Cuda(c) => Some(c),
            BackendKind::Host(_) => None,
        }
    }

    /// The backend ops dispatch on.
    pub(crate) fn exec(&self) -> Exec<'_> {
        match &self.kind {
            BackendKind::Host(h) => Exec::Host(h),
            BackendKind::Cuda(c) => Exec::Cuda(c),
        }
    }

    /// Device time of `f`'s stream work in ms (CUDA events), or wall time on the host.
    pub(crate) fn time_ms(&self, f: &mut dyn FnMut() -> Result<()>) -> Result<f32> {
        match &self.kind {
            BackendKind::Cuda(c) => c.time_ms(f),
            BackendKind::Host(_) => {
                let t = std::time::Instant::now();
                f()?;
                Ok(t.elapsed().as_secs_f32() * 1e3)
            }
        }
    }

    /// Sets `n` values of `dtype` at `ptr` to `value` (rounded to nearest even for 16-bit
    /// dtypes), on the stream (recorded while capturing). Under `Tensor::full` and `ops::fill_`.
    pub(crate) fn fill(&self, ptr: &Ptr, n: u32, value: f32, dtype: DType) -> Result<()> {
        match (ptr, &self.kind) {
            (Ptr::Host(h), BackendKind::Host(host)) => {
                let h = HostPtr { len: n as usize, dtype, ..h.clone() };
                host.run(BuiltinKernel::FillF32, move || {
                    h.write(&vec![value; h.len]);
                    Ok(())
                })
            }
            (Ptr::Cuda(p), BackendKind::Cuda(c)) if dtype == DType::F32 => c.launch(
                BuiltinKernel::FillF32,
                LaunchDims::vectorized(n as usize, dtype),
                &[KArg::Ptr(*p), KArg::F32(value), KArg::U32(n)],
            ),
            (Ptr::Cuda(p), BackendKind::Cuda(c)) if dtype == DType::I32 => c.launch(
                BuiltinKernel::FillU32,
                LaunchDims::vectorized(n as usize, dtype),
                &[KArg::Ptr(*p), KArg::U32(crate::dtype::to_i32(value) as u32), KArg::U32(n)],
            ),
            (Ptr::Cuda(p), BackendKind::Cuda(c)) => c.launch(
                BuiltinKernel::FillU16,
                LaunchDims::vectorized(n as usize, dtype),
                &[KArg::Ptr(*p), KArg::U32(dtype.round_bits16(value) as u32), KArg::U32(n)],
            ),
            _ => Err(DeviceError::OtherBackend { op: "fill_", what: "a pointer" }.into()),
        }
    }

    /// Copies `n` values of `dtype` from `src` to `dst` on the stream (a memcpy node while
    /// capturing). Under `Tensor::copy_` and `ops::copy_`.
    pub(crate) fn copy(&self, dst: &Ptr, src: &Ptr, n: usize, dtype: DType) -> Result<()> {
        match (dst, src, &self.kind) {
            (Ptr::Host(d), Ptr::Host(s), BackendKind::Host(host)) => {
                let d = HostPtr { len: n, dtype, ..d.clone() };
                let s = HostPtr { len: n, dtype, ..s.clone() };
                host.run_as(FaultPoint::Copy, "copy_f32", move || {
                    d.write(&s.read());
                    Ok(())
                })
            }
            (Ptr::Cuda(d), Ptr::Cuda(s), BackendKind::Cuda(c)) => c.copy_device(*d, *s, n * dtype.size()),
            _ => Err(DeviceError::OtherBackend { op: "copy_", what: "a pointer" }.into()),
        }
    }

    /// Copies `src` into `dst`, both seen as `[outer, len1, mid, len2, inner]` values of `dtype`
    /// with their own lengths (`layout`): the positions below both of the source's lengths,
    /// the rest of `dst` set to `pad` (rounded for 16-bit dtypes). On the stream (one kernel on
    /// CUDA, so it captures like any other). Pads inputs into shape buckets, trims outputs.
    pub(crate) fn resize_axes(&self, dst: &Ptr, src: &Ptr, layout: AxesResize, pad: f32, dtype: DType) -> Result<()> {
        let AxesResize { outer, len1, mid, len2, inner } = layout;
        let (dst_n, src_n) = layout.numels();
        match (dst, src, &self.kind) {
            (Ptr::Host(d), Ptr::Host(s), BackendKind::Host(host)) => {
                let d = HostPtr { len: dst_n, dtype, ..d.clone() };
                let s = HostPtr { len: src_n, dtype, ..s.clone() };
                host.run_as(FaultPoint::Copy, "resize_axes", move || {
                    let x = s.read();
                    let mut y = vec![pad; d.len];
                    let (keep1, keep2) = (len1.0.min(len1.1), len2.0.min(len2.1) * inner);
                    for o in 0..outer {
                        for j1 in 0..keep1 {
                            for m in 0..mid {
                                let to = (((o * len1.0 + j1) * mid + m) * len2.0) * inner;
                                let from = (((o * len1.1 + j1) * mid + m) * len2.1) * inner;
                                y[to..to + keep2].copy_from_slice(&x[from..from + keep2]);
                            }
                        }
                    }
                    d.write(&y);
                    Ok(())
                })
            }
            (Ptr::Cuda(d), Ptr::Cuda(s), BackendKind::Cuda(c)) => {
                let (kernel, bits) = match dtype {
                    DType::F32 => (BuiltinKernel::ResizeAxesU32, pad.to_bits()),
                    DType::I32 => (BuiltinKernel::ResizeAxesU32, crate::dtype::to_i32(pad) as u32),
                    DType::BF16 | DType::F16 => (BuiltinKernel::ResizeAxesU16, dtype.round_bits16(pad) as u32),
                };
                let lens = [outer, len1.0, len1.1, mid, len2.0, len2.1, inner];
                let [Some(o), Some(d1), Some(s1), Some(m), Some(d2), Some(s2), Some(i)] =
                    lens.map(|v| u32::try_from(v).ok())
                else {
                    let got = lens.into_iter().max().unwrap_or(0);
                    let max = u32::MAX as usize;
                    return Err(OpError::TooLarge { op: "resize_axes", what: "length along one axis", got, max }.into());
                };
                let args = [o, d1, s1, m, d2, s2, i, bits].map(KArg::U32);
                let mut all = vec![KArg::Ptr(*d), KArg::Ptr(*s)];
                all.extend(args);
                c.launch(kernel, LaunchDims::elementwise(dst_n), &all)
            }
            _ => Err(DeviceError::OtherBackend { op: "resize_axes", what: "a pointer" }.into()),
        }
    }

    /// Writes `data` as `dtype` values (rounded for 16-bit dtypes and `I32`) to `ptr` and waits.
    pub(crate) fn write_values(&self, ptr: &Ptr, data: &[f32], dtype: DType) -> Result<()> {
        self.forbid_during_capture("copy from host memory")?;
        match (ptr, &self.kind) {
            (Ptr::Cuda(p), BackendKind::Cuda(c)) if dtype == DType::F32 => c.copy_to_device(*p, data),
            (Ptr::Cuda(p), BackendKind::Cuda(c)) if dtype == DType::I32 => {
                let ints: Vec<i32> = data.iter().map(|v| crate::dtype::to_i32(*v)).collect();
                c.copy_to_device(*p, &ints)
            }
            (Ptr::Cuda(p), BackendKind::Cuda(c)) => {
                let bits: Vec<u16> = data.iter().map(|v| dtype.round_bits16(*v)).collect();
                c.copy_to_device(*p, &bits)
            }
            (Ptr::Host(h), BackendKind::Host(_)) => {
                if self.faults.fires(FaultPoint::Copy) {
                    return Err(fault::driver_error("cuMemcpyHtoDAsync", FaultPoint::Copy));
                }
                HostPtr { len: data.len(), dtype, ..h.clone() }.write(data);
                Ok(())
            }
            _ => Err(DeviceError::OtherBackend { op: "copy from host memory", what: "a pointer" }.into()),
        }
    }

    /// Reads `len` values of `dtype` at `ptr`, widened to f32 (exact), and waits.
    pub(crate) fn read_values(&self, ptr: &Ptr, len: usize, dtype: DType) -> Result<Vec<f32>> {
        self.forbid_during_capture("copy to host memory")?;
        match (ptr, &self.kind) {
            (Ptr::Cuda(p), BackendKind::Cuda(c)) if dtype == DType::F32 => {
                let mut out = vec![0.0; len];
                c.copy_to_host(&mut out, *p)?;
                Ok(out)
            }
            (Ptr::Cuda(p), BackendKind::Cuda(c)) if dtype == DType::I32 => {
                let mut out = vec![0i32; len];
                c.copy_to_host(&mut out, *p)?;
                Ok(out.into_iter().map(|v| v as f32).collect())
            }
            (Ptr::Cuda(p), BackendKind::Cuda(c)) => {
                let mut bits = vec![0u16; len];
                c.copy_to_host(&mut bits, *p)?;
                Ok(bits.into_iter().map(|b| dtype.widen_bits16(b)).collect())
            }
            (Ptr::Host(h), BackendKind::Host(_)) => {
                if self.faults.fires(FaultPoint::Copy) {
                    return Err(fault::driver_error("cuMemcpyDtoHAsync", FaultPoint::Copy));
                }
                Ok(HostPtr { len, dtype, ..h.clone() }.read())
            }
            _ => Err(DeviceError::OtherBackend { op: "copy to host memory", what: "a pointer" }.into()),
        }
    }

    /// The capture mode in progress on this backend's stream, if the calling thread is the one
    /// capturing (other threads' work waits at the gate until the capture ends).
    pub(crate) fn capture_mode(&self) -> Option<CaptureMode> {
        self.gate.my_capture()
    }

    /// Whether the calling thread is capturing this backend's stream.
    pub(crate) fn is_capturing(&self) -> bool {
        self.capture_mode().is_some()
    }

    /// Fails with a typed error when `op` would be illegal during this thread's capture.
    pub(crate) fn forbid_during_capture(&self, op: &'static str) -> Result<()> {
        if self.is_capturing() {
            Err(Error::IllegalDuringCapture { op })
        } else {
            Ok(())
        }
    }

    pub(crate) fn begin_capture(&self, mode: CaptureMode) -> Result<()> {
        self.gate.begin(mode, || match &self.kind {
            BackendKind::Host(h) => h.begin_capture(),
            BackendKind::Cuda(c) => c.begin_capture(mode),
        })
    }

    /// Ends the capture in progress; always leaves the stream out of capture mode.
    pub(crate) fn end_capture(&self) -> Result<Recorded> {
        self.gate.end(|| match &self.kind {
            BackendKind::Host(h) => Ok(Recorded::Host(h.end_capture().into_iter().map(Arc::new).collect())),
            BackendKind::Cuda(c) => c.end_capture().map(Recorded::Cuda),
        })
    }

    /// Whether the calling thread is capturing the body of a conditional node on this stream.
    pub(crate) fn in_conditional_body(&self) -> bool {
        self.gate.in_body()
    }

    /// Captures the branches into conditional nodes of this thread's capture in progress:
    /// `then` runs when `test` holds, `otherwise` (if given) when it does not. The test is
    /// evaluated once, on the device, before either: on CUDA one kernel sets the handle of an
    /// IF node per branch and the branches are captured into the nodes' bodies; on the host
    /// one recorded op tests the value and runs the branch's recorded ops. A branch that fails
    /// (or panics) leaves the stream capturing the outer graph, and its error (or panic) is
    /// passed on; a body holding what a conditional body may not hold is
    /// [`Error::ConditionalBody`]. The caller checked the driver and that this thread captures.
    /// With `update` (CUDA only: the caller runs the update as an op first elsewhere), the
    /// kernel that sets the conditions updates the loss scaler before it tests.
    pub(crate) fn capture_conditional<'a>(
        &self,
        test: &CondTest,
        update: Option<ScaleUpdate>,
        then: &'a mut dyn FnMut() -> Result<()>,
        otherwise: Option<&'a mut dyn FnMut() -> Result<()>>,
    ) -> Result<()> {
        let Some(mode) = self.capture_mode() else {
            return Err(Error::NotCapturing { graph: "this device's stream".into() });
        };
        match &self.kind {
            BackendKind::Host(h) => {
                debug_assert!(update.is_none(), "the host backend runs the scaler's update as an op first");
                let mut bodies = Vec::with_capacity(2);
                for branch in std::iter::once(then).chain(otherwise) {
                    bodies.push(self.capture_host_conditional_body(h, branch)?);
                }
                let test = test.clone();
                let name = if bodies.len() == 1 { HOST_IF } else { HOST_IF_ELSE };
                h.run(name, move || {
                    let body = if test.holds_on_host() { bodies.first() } else { bodies.get(1) };
                    body.map_or(Ok(()), |ops| ops.iter().try_for_each(|op| (op.run)()))
                })
            }
            BackendKind::Cuda(c) => c.capture_conditional(mode, test, update, then, otherwise, &self.gate),
        }
    }

    /// Records what `branch` queues as a body of its own (host backend), the outer recording
    /// restored whatever the branch does.
    /// Captures `body` into a WHILE node of the capture in progress: the body runs as long as
    /// `test` holds, tested on the device before each pass (see `Condition::run_while`). On
    /// the host backend one recorded op tests the value and runs the body's ops.
    pub(crate) fn capture_while(&self, test: &CondTest, body: &mut dyn FnMut() -> Result<()>) -> Result<()> {
        let Some(mode) = self.capture_mode() else {
            return Err(Error::NotCapturing { graph: "this device's stream".into() });
        };
        match &self.kind {
            BackendKind::Host(h) => {
                let ops = self.capture_host_conditional_body(h, body)?;
                let test = test.clone();
                h.run(HOST_WHILE, move || {
                    while test.holds_on_host() {
                        ops.iter().try_for_each(|op| (op.run)())?;
                    }
                    Ok(())
                })
            }
            BackendKind::Cuda(c) => c.capture_while(mode, test, body, &self.gate),
        }
    }

    /// A conditional body's ops on the host backend, refused when they hold what a body may not.
    fn capture_host_conditional_body(
        &self,
        h: &HostBackend,
        branch: &mut dyn FnMut() -> Result<()>,
    ) -> Result<Vec<host::HostOp>> {
        let ops = self.capture_host_body(h, branch)?;
        let violation = ops.iter().enumerate().find_map(|(index, op)| {
            let node =
                GraphNode { index, kind: NodeKind::Kernel, kernel: Some(op.name.to_string()), dependencies: vec![] };
            node.conditional_body_violation()
        });
        if let Some(node) = violation {
            return Err(Error::ConditionalBody { graph: CONDITIONAL_BODY.into(), node });
        }
        Ok(ops)
    }

    fn capture_host_body(&self, h: &HostBackend, branch: &mut dyn FnMut() -> Result<()>) -> Result<Vec<host::HostOp>> {
        let outer = h.begin_body()?;
        let ran = match self.gate.enter_body(None) {
            Ok(inside) => {
                let ran = catch_unwind(AssertUnwindSafe(&mut *branch));
                drop(inside);
                ran
            }
            Err(e) => Ok(Err(e)),
        };
        let ops = h.end_body(outer);
        match ran {
            Err(panic) => resume_unwind(panic),
            Ok(result) => result.map(|()| ops),
        }
    }

    /// Allocates a slab of at least `bytes`; when the device (or the host) has no room,
    /// [`Error::OutOfMemory`], never a panic or an abort.
    pub(crate) fn alloc_slab(&self, bytes: usize) -> Result<Ptr> {
        let ptr = match &self.kind {
            BackendKind::Host(h) => {
                let _entered = h.gate.enter()?;
                let slab = match self.faults.fires(FaultPoint::SlabGrowth) {
                    true => None,
                    false => HostSlab::new(bytes),
                };
                let slab = slab.ok_or_else(|| self.out_of_memory(bytes))?;
                Ptr::Host(HostPtr { slab, offset: 0, len: bytes / 4, dtype: crate::DType::F32 })
            }
            BackendKind::Cuda(c) => match c.malloc(bytes)? {
                Some(p) => Ptr::Cuda(p),
                None => return Err(self.out_of_memory(bytes)),
            },
        };
        self.reserved.fetch_add(bytes, Ordering::Relaxed);
        Ok(ptr)
    }

    /// The error for a request of `requested` bytes that the device cannot serve, with what it
    /// says it has left (the driver's free bytes; the host's available memory, where known).
    pub(crate) fn out_of_memory(&self, requested: usize) -> Error {
        let available = match &self.kind {
            BackendKind::Host(_) => host::available_memory(),
            // Asking the driver is not a stream operation, but stays out of captures anyway.
            BackendKind::Cuda(_) if self.is_capturing() => None,
            BackendKind::Cuda(c) => c.free_memory(),
        };
        Error::OutOfMemory { device: self.name(), requested, available }
    }

    /// Bytes of all slabs of all pools on this device.
    pub(crate) fn reserved_bytes(&self) -> usize {
        self.reserved.load(Ordering::Relaxed)
    }

    /// Frees a slab of `bytes` (the stream is drained first); a driver error is reported, not
    /// lost.
    pub(crate) fn free_slab(&self, ptr: &Ptr, bytes: usize) {
        self.reserved.fetch_sub(bytes, Ordering::Relaxed);
        if let (BackendKind::Cuda(c), Ptr::Cuda(p)) = (&self.kind, ptr) {
            if let Err(e) = c.drain().and_then(|()| c.free(*p)) {
                self.drop_errors.report(e.context("freeing a pool slab"));
            }
        }
    }

    pub(crate) fn synchronize(&self) -> Result<()> {
        self.forbid_during_capture("synchronize")?;
        match &self.kind {
            BackendKind::Host(_) => Ok(()),
            BackendKind::Cuda(c) => c.synchronize(),
        }
    }

    /// Waits for the device without consuming an error a kernel reported (see
    /// `CudaBackend::drain`): for freeing memory the device may still use.
    pub(crate) fn drain(&self) -> Result<()> {
        self.forbid_during_capture("synchronize")?;
        match &self.kind {
            BackendKind::Host(_) => Ok(()),
            BackendKind::Cuda(c) => c.drain(),
        }
    }
}

/// The names of the host backend's recorded conditional ops: a loop, a branch, a branch with
/// an else.
const HOST_WHILE: &str = "while_loop";
const HOST_IF: &str = "if_then";
const HOST_IF_ELSE: &str = "if_else";
const HOST_CONDITIONALS: [&str; 3] = [HOST_WHILE, HOST_IF, HOST_IF_ELSE];

/// The name conditional bodies captured from a running capture go by in
/// [`Error::ConditionalBody`].
pub(crate) const CONDITIONAL_BODY: &str = "a conditional body (Condition::run_if)";

/// The kind of a conditional node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum CondKind {
    /// Runs the body while the condition holds (tested before each pass).
    While,
    /// Runs the body once if the condition holds.
    If,
}

/// What a conditional node tests: the first element of a one-element f32 or i32 tensor,
/// `value < limit` when `below` is set, else `value != 0`.
#[derive(Clone, Debug)]
pub(crate) struct CondTest {
    /// The device address of the value (CUDA).
    pub(crate) ptr: u64,
    /// The value on the host backend.
    pub(crate) host: Option<HostPtr>,
    pub(crate) is_i32: bool,
    pub(crate) below: Option<f32>,
}

/// The loss scaler's update (`amp_update`: back off after an overflow, else grow every
/// `interval` good steps) of the state at `state` (four f32 on the device), done on CUDA by the
/// kernel that sets a conditional node's condition, before its test: one launch for both.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ScaleUpdate {
    pub(crate) state: u64,
    pub(crate) growth: f32,
    pub(crate) backoff: f32,
    pub(crate) interval: u32,
}

impl CondTest {
    /// The test on the host backend's value (the same comparison as the kernel's: in f64).
    fn holds_on_host(&self) -> bool {
        let Some(h) = &self.host else { return false };
        let v = if self.is_i32 { h.read_i32()[0] as f64 } else { h.read()[0] as f64 };
        match self.below {
            Some(limit) => v < limit as f64,
            None => v != 0.0,
        }
    }
}

/// What a capture recorded: the host backend's op list or a CUDA graph.
#[derive(Debug)]
pub(crate) enum Recorded {
    /// Shared ops, so a fused recording can hold the same ops as the graphs it was made of.
    Host(Vec<Arc<host::HostOp>>),
    Cuda(RawGraph),
}

impl Recorded {
    /// One recording that runs `parts` in order, each after the one before: on CUDA a new graph
    /// of child-graph nodes (one launch replays them all), on the host the ops concatenated.
    pub(crate) fn fuse(backend: &Backend, parts: &[&Recorded]) -> Result<Recorded> {
        match &backend.kind {
            BackendKind::Host(_) => {
                let mut ops = Vec::new();
                for part in parts {
                    match part {
                        Recorded::Host(part_ops) => ops.extend(part_ops.iter().cloned()),
                        Recorded::Cuda(_) => {
                            return Err(DeviceError::OtherBackend { op: "fuse", what: "a CUDA graph" }.into())
                        }
                    }
                }
                Ok(Recorded::Host(ops))
            }
            BackendKind::Cuda(c) => {
                let mut raws = Vec::with_capacity(parts.len());
                for part in parts {
                    match part {
                        Recorded::Cuda(raw) => raws.push(raw),
                        Recorded::Host(_) => {
                            return Err(DeviceError::OtherBackend { op: "fuse", what: "a host recording" }.into())
                        }
                    }
                }
                c.fuse_graphs(&raws).map(Recorded::Cuda)
            }
        }
    }

    /// A recording that runs `body` as a conditional node (see [`CondKind`]): on CUDA a new
    /// graph with a WHILE or IF node (one launch runs every pass); on the host one op that
    /// tests the value and runs the body's ops as long (or if) it holds.
    pub(crate) fn conditional(backend: &Backend, kind: CondKind, test: CondTest, body: &Recorded) -> Result<Recorded> {
        match (body, &backend.kind) {
            (Recorded::Host(ops), BackendKind::Host(_)) => {
                let (ops, name) = (ops.clone(), if kind == CondKind::While { HOST_WHILE } else { HOST_IF });
                let run = move || -> Result<()> {
                    let mut passes = 0;
                    while (kind == CondKind::While || passes == 0) && test.holds_on_host() {
                        ops.iter().try_for_each(|op| (op.run)())?;
                        passes += 1;
                    }
                    Ok(())
                };
                Ok(Recorded::Host(vec![Arc::new(host::HostOp { name, run: Box::new(run) })]))
            }
            (Recorded::Cuda(raw), BackendKind::Cuda(c)) => c.conditional_graph(kind, &test, raw).map(Recorded::Cuda),
            _ => Err(DeviceError::OtherBackend { op: "conditional graph", what: "a recording" }.into()),
        }
    }

    /// Whether this recording holds a conditional node at its top level (on the host, a
    /// recorded conditional op), which CUDA cannot embed as a child graph.
    pub(crate) fn holds_conditional(&self, backend: &Backend) -> Result<bool> {
        Ok(self.nodes(backend)?.iter().any(|n| {
            n.kind == NodeKind::Conditional || n.kernel.as_deref().is_some_and(|k| HOST_CONDITIONALS.contains(&k))
        }))
    }

    /// Why this recording cannot be the body of a conditional node, if it cannot (see
    /// `GraphNode::conditional_body_violation`; on CUDA child graphs are searched too).
    pub(crate) fn conditional_body_violation(&self, backend: &Backend) -> Result<Option<crate::error::BodyNode>> {
        match (self, &backend.kind) {
            (Recorded::Cuda(raw), BackendKind::Cuda(c)) => c.conditional_body_violation(raw),
            _ => Ok(self.nodes(backend)?.iter().find_map(GraphNode::conditional_body_violation)),
        }
    }

    /// Instantiates a CUDA graph (a no-op on the host, or when already instantiated).
    pub(crate) fn instantiate(&mut self, backend: &Backend) -> Result<()> {
        match (self, &backend.kind) {
            (Recorded::Cuda(raw), BackendKind::Cuda(c)) => c.instantiate(raw),
            _ if backend.faults.fires(FaultPoint::GraphInstantiate) => {
                Err(fault::driver_error("cuGraphInstantiate", FaultPoint::GraphInstantiate))
            }
            _ => Ok(()),
        }
    }

    /// Runs the recording on the stream: the host ops in order, or one graph launch.
    pub(crate) fn launch(&mut self, backend: &Backend) -> Result<()> {
        match (self, &backend.kind) {
            (Recorded::Host(ops), _) => {
                let _entered = backend.gate.enter()?;
                if backend.faults.fires(FaultPoint::GraphLaunch) {
                    return Err(fault::driver_error("cuGraphLaunch", FaultPoint::GraphLaunch));
                }
                ops.iter().try_for_each(|op| (op.run)())
            }
            (Recorded::Cuda(raw), BackendKind::Cuda(c)) => {
                c.instantiate(raw)?;
                c.launch_graph(raw)
            }
            (Recorded::Cuda(_), BackendKind::Host(_)) => {
                Err(DeviceError::OtherBackend { op: "graph replay", what: "a CUDA graph" }.into())
            }
        }
    }

    /// The nodes (on the host: the recorded ops in order, each depending on the one before).
    pub(crate) fn nodes(&self, backend: &Backend) -> Result<Vec<GraphNode>> {
        match (self, &backend.kind) {
            (Recorded::Host(ops), _) => Ok(ops
                .iter()
                .enumerate()
                .map(|(i, op)| GraphNode {
                    index: i,
                    kind: NodeKind::Kernel,
                    kernel: Some(op.name.to_string()),
                    dependencies: if i == 0 { vec![] } else { vec![i - 1] },
                })
                .collect()),
            (Recorded::Cuda(raw), BackendKind::Cuda(c)) => c.nodes(raw),
            (Recorded::Cuda(_), BackendKind::Host(_)) => {
                Err(DeviceError::OtherBackend { op: "graph nodes", what: "a CUDA graph" }.into())
            }
        }
    }

    /// Writes the backend's own DOT dump; `false` when the backend has none (the host).
    pub(crate) fn debug_dot(&self, backend: &Backend, path: &std::path::Path) -> Result<bool> {
        match (self, &backend.kind) {
            (Recorded::Cuda(raw), BackendKind::Cuda(c)) => c.debug_dot(raw, path).map(|()| true),
            _ => Ok(false),
        }
    }
}
