//! The two backends behind one small internal interface.
//!
//! Ops match on [`BackendKind`] once: the host arm runs (or records) the CPU reference, the cuda
//! arm launches the kernel. User code never becomes generic over a backend.

pub(crate) mod cuda;
mod cuda_user;
pub(crate) mod host;

use std::cell::Cell;
use std::sync::Mutex;

use crate::graph::CaptureMode;
use crate::{Error, Result};

pub(crate) use cuda::{CudaBackend, KArg, LaunchDims, RawGraph};
pub(crate) use host::{HostBackend, HostPtr, HostSlab};

thread_local! {
    /// Number of captures this thread has in progress, on any device.
    static CAPTURES: Cell<usize> = const { Cell::new(0) };
}

/// Whether this thread is capturing a graph right now (on any device), like PyTorch's
/// `torch.cuda.is_current_stream_capturing()`.
///
/// Capture-time hooks always see `false`: they run outside captures.
///
/// ```
/// assert!(!graphed::is_capturing());
/// ```
pub fn is_capturing() -> bool {
    CAPTURES.with(|c| c.get() > 0)
}

/// Which machine runs the ops.
#[derive(Debug)]
pub(crate) enum BackendKind {
    Host(HostBackend),
    Cuda(Box<CudaBackend>),
}

/// A backend plus the capture state of its stream.
#[derive(Debug)]
pub(crate) struct Backend {
    pub(crate) kind: BackendKind,
    capture: Mutex<Option<CaptureMode>>,
}

/// An address in device (or host-backend) memory.
#[derive(Clone, Debug)]
pub(crate) enum Ptr {
    Host(HostPtr),
    Cuda(u64),
}

impl Backend {
    pub(crate) fn new(kind: BackendKind) -> Backend {
        Backend { kind, capture: Mutex::new(None) }
    }

    /// The capture mode in progress on this backend's stream, if any.
    pub(crate) fn capture_mode(&self) -> Option<CaptureMode> {
        *self.capture.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn is_capturing(&self) -> bool {
        self.capture_mode().is_some()
    }

    /// Fails with a typed error when `op` would be illegal during a capture.
    pub(crate) fn forbid_during_capture(&self, op: &'static str) -> Result<()> {
        if self.is_capturing() {
            Err(Error::IllegalDuringCapture { op })
        } else {
            Ok(())
        }
    }

    pub(crate) fn begin_capture(&self, mode: CaptureMode) -> Result<()> {
        let mut cap = self.capture.lock().unwrap_or_else(|e| e.into_inner());
        if cap.is_some() {
            return Err(Error::GraphState("this device's stream is already capturing; end that capture first".into()));
        }
        match &self.kind {
            BackendKind::Host(h) => h.begin_capture()?,
            BackendKind::Cuda(c) => c.begin_capture(mode)?,
        }
        *cap = Some(mode);
        CAPTURES.with(|c| c.set(c.get() + 1));
        Ok(())
    }

    /// Ends the capture in progress; always leaves the stream out of capture mode.
    pub(crate) fn end_capture(&self) -> Result<Recorded> {
        let mut cap = self.capture.lock().unwrap_or_else(|e| e.into_inner());
        if cap.take().is_none() {
            return Err(Error::GraphState("end_capture without a capture in progress".into()));
        }
        CAPTURES.with(|c| c.set(c.get().saturating_sub(1)));
        match &self.kind {
            BackendKind::Host(h) => Ok(Recorded::Host(h.end_capture())),
            BackendKind::Cuda(c) => c.end_capture().map(Recorded::Cuda),
        }
    }

    /// Allocates a slab of at least `bytes`.
    pub(crate) fn alloc_slab(&self, bytes: usize) -> Result<Ptr> {
        match &self.kind {
            BackendKind::Host(_) => Ok(Ptr::Host(HostPtr { slab: HostSlab::new(bytes), offset: 0, len: bytes / 4 })),
            BackendKind::Cuda(c) => c.malloc(bytes).map(Ptr::Cuda),
        }
    }

    pub(crate) fn free_slab(&self, ptr: &Ptr) {
        if let (BackendKind::Cuda(c), Ptr::Cuda(p)) = (&self.kind, ptr) {
            let _ = c.synchronize();
            c.free(*p);
        }
    }

    pub(crate) fn synchronize(&self) -> Result<()> {
        self.forbid_during_capture("synchronize")?;
        match &self.kind {
            BackendKind::Host(_) => Ok(()),
            BackendKind::Cuda(c) => c.synchronize(),
        }
    }
}

/// What a capture recorded.
#[derive(Debug)]
pub(crate) enum Recorded {
    Host(Vec<host::HostOp>),
    Cuda(RawGraph),
}
