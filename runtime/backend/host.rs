//! The host backend: a real CPU execution of every op with the same capture semantics as CUDA.
//!
//! Memory comes in slabs, like device memory, and ops address it by (slab, offset), like device
//! pointers. While a stream captures, ops are recorded instead of run; replay runs the record.
//! Because recorded ops hold raw addresses and not tensor handles, a block freed during capture
//! really is reused by a later capture, so pool and replay-order bugs show here as on a GPU.

use std::sync::{Arc, Mutex};

use super::StreamGate;
use crate::{Error, Result};

/// One host allocation that pool blocks are carved from.
#[derive(Debug)]
pub(crate) struct HostSlab {
    data: Mutex<Vec<f32>>,
}

impl HostSlab {
    pub(crate) fn new(bytes: usize) -> Arc<HostSlab> {
        // NaN-poisoned so that a read of memory nothing wrote shows up in results.
        Arc::new(HostSlab { data: Mutex::new(vec![f32::NAN; bytes.div_ceil(4)]) })
    }
}

/// The host counterpart of a device pointer: a slab and an element offset into it.
#[derive(Clone, Debug)]
pub(crate) struct HostPtr {
    pub(crate) slab: Arc<HostSlab>,
    pub(crate) offset: usize,
    pub(crate) len: usize,
}

impl HostPtr {
    /// Copies the elements out.
    pub(crate) fn read(&self) -> Vec<f32> {
        let data = self.slab.data.lock().unwrap_or_else(|e| e.into_inner());
        data[self.offset..self.offset + self.len].to_vec()
    }

    /// Overwrites the elements; `values` must have `len` elements.
    pub(crate) fn write(&self, values: &[f32]) {
        let mut data = self.slab.data.lock().unwrap_or_else(|e| e.into_inner());
        let n = values.len().min(self.len);
        data[self.offset..self.offset + n].copy_from_slice(&values[..n]);
    }

    /// Element `i` as raw bits (the RNG state is stored as u32 words).
    pub(crate) fn read_u32(&self) -> Vec<u32> {
        self.read().into_iter().map(f32::to_bits).collect()
    }

    pub(crate) fn write_u32(&self, words: &[u32]) {
        let v: Vec<f32> = words.iter().map(|w| f32::from_bits(*w)).collect();
        self.write(&v);
    }
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
}

impl HostBackend {
    pub(crate) fn new(gate: Arc<StreamGate>) -> HostBackend {
        HostBackend { recording: Mutex::new(None), gate }
    }

    /// Runs `op` now, or appends it to the capture in progress (only the capturing thread gets
    /// here while a capture is in progress; others wait at the gate).
    pub(crate) fn run(
        &self,
        name: impl Into<&'static str>,
        op: impl Fn() -> Result<()> + Send + Sync + 'static,
    ) -> Result<()> {
        let name = name.into();
        let _entered = self.gate.enter()?;
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
}
