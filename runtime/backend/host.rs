//! The host backend: a real CPU execution of every op with the same capture semantics as CUDA.
//!
//! Memory comes in slabs, like device memory, and ops address it by (slab, offset), like device
//! pointers. While a stream captures, ops are recorded instead of run; replay runs the record.
//! Because recorded ops hold raw addresses and not tensor handles, a block freed during capture
//! really is reused by a later capture, so pool and replay-order bugs show here as on a GPU.

use std::sync::{Arc, Mutex};

use super::fault::{self, FaultPoint, Faults};
use super::StreamGate;
use crate::{DType, Error, Result};

/// One host allocation that pool blocks are carved from: 32-bit words, addressed by byte
/// offset like device memory, so f32 tensors and 16-bit (bf16, f16) tensors share one pool.
#[derive(Debug)]
pub(crate) struct HostSlab {
    data: Mutex<Vec<u32>>,
}

/// The poison of fresh memory: a NaN as f32, and each 16-bit half a NaN as bf16 and as f16,
/// so a read of memory nothing wrote shows up in results whatever the dtype.
const POISON: u32 = 0x7fc0_7fc0;

/// Slabs from this size on are checked against the memory the host has available before
/// they are allocated (filling one the kernel cannot back would bring the OOM killer).
const CHECKED_SLAB: usize = 256 << 20;

impl HostSlab {
    /// A slab of `bytes` of poison, or `None` when the host cannot provide it (the allocator
    /// refuses, or it is larger than the memory available): never a panic or an abort.
    pub(crate) fn new(bytes: usize) -> Option<Arc<HostSlab>> {
        if bytes >= CHECKED_SLAB && available_memory().is_some_and(|free| bytes > free) {
            return None;
        }
        let words = bytes.div_ceil(4);
        let mut data = Vec::new();
        data.try_reserve_exact(words).ok()?;
        data.resize(words, POISON);
        Some(Arc::new(HostSlab { data: Mutex::new(data) }))
    }
}

/// The memory the host can still give (`MemAvailable` of /proc/meminfo), where known.
pub(crate) fn available_memory() -> Option<usize> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: usize = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

/// The host counterpart of a device pointer: a slab, a byte offset into it, an element count
/// and the element type the elements are read and written as.
#[derive(Clone, Debug)]
pub(crate) struct HostPtr {
    pub(crate) slab: Arc<HostSlab>,
    /// Bytes from the start of the slab (a multiple of 4: blocks are 256-byte aligned).
    pub(crate) offset: usize,
    pub(crate) len: usize,
    pub(crate) dtype: DType,
}

impl HostPtr {
    /// Copies the elements out, widened to f32 (exact for every dtype).
    pub(crate) fn read(&self) -> Vec<f32> {
        let data = self.slab.data.lock().unwrap_or_else(|e| e.into_inner());
        match self.dtype {
            DType::F32 => {
                let w = self.offset / 4;
                data[w..w + self.len].iter().map(|b| f32::from_bits(*b)).collect()
            }
            DType::I32 => {
                let w = self.offset / 4;
                data[w..w + self.len].iter().map(|b| *b as i32 as f32).collect()
            }
            dt => (0..self.len).map(|i| dt.widen_bits16(half_at(&data, self.offset / 2 + i))).collect(),
        }
    }

    /// Overwrites the elements, each rounded to the dtype (to nearest even, as the kernels
    /// store); at most `len` values are written.
    pub(crate) fn write(&self, values: &[f32]) {
        let mut data = self.slab.data.lock().unwrap_or_else(|e| e.into_inner());
        let n = values.len().min(self.len);
        match self.dtype {
            DType::F32 => {
                let w = self.offset / 4;
                for (d, v) in data[w..w + n].iter_mut().zip(values) {
                    *d = v.to_bits();
                }
            }
            DType::I32 => {
                let w = self.offset / 4;
                for (d, v) in data[w..w + n].iter_mut().zip(values) {
                    *d = crate::dtype::to_i32(*v) as u32;
                }
            }
            dt => {
                for (i, v) in values[..n].iter().enumerate() {
                    set_half(&mut data, self.offset / 2 + i, dt.round_bits16(*v));
                }
            }
        }
    }

    /// The raw 16-bit patterns of a bf16 or f16 range.
    pub(crate) fn read_bits16(&self) -> Vec<u16> {
        let data = self.slab.data.lock().unwrap_or_else(|e| e.into_inner());
        (0..self.len).map(|i| half_at(&data, self.offset / 2 + i)).collect()
    }

    /// Overwrites a bf16 or f16 range with raw 16-bit patterns.
    pub(crate) fn write_bits16(&self, bits: &[u16]) {
        let mut data = self.slab.data.lock().unwrap_or_else(|e| e.into_inner());
        for (i, b) in bits.iter().take(self.len).enumerate() {
            set_half(&mut data, self.offset / 2 + i, *b);
        }
    }

    /// The elements of an `I32` range.
    pub(crate) fn read_i32(&self) -> Vec<i32> {
        self.read_u32().into_iter().map(|w| w as i32).collect()
    }

    /// Overwrites an `I32` range.
    pub(crate) fn write_i32(&self, values: &[i32]) {
        self.write_u32(&values.iter().map(|v| *v as u32).collect::<Vec<_>>());
    }

    /// The elements as raw 32-bit words (the RNG state is stored as u32 words).
    pub(crate) fn read_u32(&self) -> Vec<u32> {
        let data = self.slab.data.lock().unwrap_or_else(|e| e.into_inner());
        let w = self.offset / 4;
        data[w..w + self.len].to_vec()
    }

    pub(crate) fn write_u32(&self, words: &[u32]) {
        let mut data = self.slab.data.lock().unwrap_or_else(|e| e.into_inner());
        let (w, n) = (self.offset / 4, words.len().min(self.len));
        data[w..w + n].copy_from_slice(&words[..n]);
    }
}

/// The 16-bit half `h` of the slab (little-endian: the low half of a word comes first).
fn half_at(data: &[u32], h: usize) -> u16 {
    (data[h / 2] >> (16 * (h % 2))) as u16
}

fn set_half(data: &mut [u32], h: usize, bits: u16) {
    let shift = 16 * (h % 2);
    let w = &mut data[h / 2];
    *w = (*w & !(0xffff << shift)) | ((bits as u32) << shift);
}

/// A recorded host op: its kernel name and the work.
pub(crate) struct HostOp {
    pub(crate) name: &'static str,
    pub(crate) run: Box<dyn Fn() -> Result<()> + Send + Sync>,
}

impl std::fmt::Debug for HostOp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name)
    }
}

/// The host backend's stream: runs ops now, or records them while capturing.
#[derive(Debug)]
pub(crate) struct HostBackend {
    recording: Mutex<Option<Vec<HostOp>>>,
    pub(crate) gate: Arc<StreamGate>,
    faults: Arc<Faults>,
}

impl HostBackend {
    pub(crate) fn new(gate: Arc<StreamGate>, faults: Arc<Faults>) -> HostBackend {
        HostBackend { recording: Mutex::new(None), gate, faults }
    }

    /// Runs `op` now, or appends it to the capture in progress (only the capturing thread gets
    /// here while a capture is in progress; others wait at the gate). A kernel launch.
    pub(crate) fn run(
        &self,
        name: impl Into<&'static str>,
        op: impl Fn() -> Result<()> + Send + Sync + 'static,
    ) -> Result<()> {
        self.run_as(FaultPoint::KernelLaunch, name, op)
    }

    /// [`HostBackend::run`] for a stream primitive of another kind (a copy): it fails as that
    /// primitive does when a fault is injected.
    pub(crate) fn run_as(
        &self,
        point: FaultPoint,
        name: impl Into<&'static str>,
        op: impl Fn() -> Result<()> + Send + Sync + 'static,
    ) -> Result<()> {
        let name = name.into();
        let _entered = self.gate.enter()?;
        if self.faults.fires(point) {
            let call = if point == FaultPoint::Copy { "cuMemcpyDtoDAsync" } else { "cuLaunchKernel" };
            return Err(fault::driver_error(call, point));
        }
        let mut rec = self.recording.lock().unwrap_or_else(|e| e.into_inner());
        match rec.as_mut() {
            Some(ops) => {
                ops.push(HostOp { name, run: Box::new(op) });
                Ok(())
            }
            None => {
                drop(rec);
                op()
            }
        }
    }

    pub(crate) fn begin_capture(&self) -> Result<()> {
        let mut rec = self.recording.lock().unwrap_or_else(|e| e.into_inner());
        if rec.is_some() {
            return Err(Error::AlreadyCapturing { graph: "the host stream".into() });
        }
        *rec = Some(Vec::new());
        Ok(())
    }

    pub(crate) fn end_capture(&self) -> Vec<HostOp> {
        self.recording.lock().unwrap_or_else(|e| e.into_inner()).take().unwrap_or_default()
    }

    /// Starts recording the body of a conditional op: the ops recorded so far are set aside
    /// (returned, for [`HostBackend::end_body`]) and the recording goes on into an empty list.
    pub(crate) fn begin_body(&self) -> Result<Vec<HostOp>> {
        match self.recording.lock().unwrap_or_else(|e| e.into_inner()).as_mut() {
            Some(ops) => Ok(std::mem::take(ops)),
            None => Err(Error::NotCapturing { graph: "the host stream".into() }),
        }
    }

    /// Ends a body begun by [`HostBackend::begin_body`]: the recording goes back to `outer`,
    /// and the body's ops are returned.
    pub(crate) fn end_body(&self, outer: Vec<HostOp>) -> Vec<HostOp> {
        self.recording.lock().unwrap_or_else(|e| e.into_inner()).replace(outer).unwrap_or_default()
    }
}
