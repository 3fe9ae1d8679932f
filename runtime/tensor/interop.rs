//! cudarc interop: the device's context and stream, tensors' device pointers, and tensors
//! that wrap a `CudaSlice` you allocated.
//!
//! Work you queue yourself on [`Device::cuda_stream`] is ordered with graphed's own (it is the
//! one stream of the device), and while the device captures a graph it is captured too: a
//! kernel you launch there from a `#[graphed]` forward or backward becomes a node of the
//! graph and runs on every replay, reading and writing the same addresses.
//!
//! # What is legal while the device captures
//!
//! A capture records stream work instead of running it, and CUDA invalidates it (or errors)
//! on anything that would need the work to have happened. While [`Device::is_capturing`]:
//!
//! - Legal: launching kernels on `cuda_stream()` (through `launch_builder` or the driver
//!   API; a [`crate::Kernel`] once compiled for the device), `cuMemcpyAsync`/`cuMemsetAsync` between device buffers on that stream, reading
//!   [`Tensor::cuda_device_ptr`] and wrapping an existing slice with
//!   [`Tensor::from_cuda_slice`] (neither touches the stream).
//! - Illegal: synchronous allocation or free (`cuMemAlloc`, `cuMemFree`), copies from or to
//!   pageable host memory (`clone_htod`/`memcpy_htod` from a `Vec` or slice, `memcpy_dtov`),
//!   `synchronize()` on the stream, the context or an event, event queries, and work on another
//!   stream that does not join the capture through events. Dropping a `CudaSlice` frees it:
//!   graphed parks slices whose tensor is dropped during a capture and frees them afterwards,
//!   but a bare `CudaSlice` of yours must not be dropped inside one.
//! - Avoid even where CUDA allows it: stream-ordered allocations (`cuMemAllocAsync`, which
//!   cudarc's `alloc_zeros` uses when the device supports it) become memory nodes owned by the
//!   graph, outside graphed's pool and its replay-order checks. Allocate, upload and compile
//!   before capturing (the warm-up is the place).
//! - A capture records addresses: a buffer a graph reads must outlive the graph and stay at
//!   its address. Pass inputs through the module's arguments (they are copied into static
//!   buffers) rather than capturing pointers of short-lived slices.
//!
//! ```
//! use graphed::{Device, Tensor};
//! let dev = Device::default_device();
//! if let (Some(stream), Some(_ctx)) = (dev.cuda_stream(), dev.cuda_context()) {
//!     let slice = stream.clone_htod(&[1.0f32, 2.0, 3.0]).expect("upload");
//!     let t = Tensor::from_cuda_slice(&dev, slice, &[3])?;
//!     assert_eq!(t.to_vec()?, vec![1.0, 2.0, 3.0]);
//!     assert!(t.cuda_device_ptr()? != 0);
//! }
//! # Ok::<(), graphed::Error>(())
//! ```

use std::sync::{Arc, Mutex};

use cudarc::driver::{CudaContext, CudaSlice, CudaStream, DevicePtr};

/// The cudarc crate graphed is built with (0.19), so your types match the device's.
pub use cudarc;

use crate::backend::{Backend, Ptr};
use crate::tensor::Storage;
use crate::{Device, Error, InteropProblem, Result, Shape, ShapeProblem, Tensor};

/// Slices whose tensors were dropped while their device captured; freed at the next chance.
static PARKED: Mutex<Vec<CudaSlice<f32>>> = Mutex::new(Vec::new());

/// Frees parked slices once no device they might belong to is capturing.
fn free_parked(backend: &Backend) {
    if backend.is_capturing() || crate::is_capturing() {
        return;
    }
    let parked = std::mem::take(&mut *PARKED.lock().unwrap_or_else(|e| e.into_inner()));
    if !parked.is_empty() {
        let _ = backend.drain();
        drop(parked);
    }
}

/// A user's `CudaSlice` owned by a tensor's buffer.
pub(crate) struct ForeignSlice {
    slice: Option<CudaSlice<f32>>,
    backend: Arc<Backend>,
    ptr: u64,
}

impl ForeignSlice {
    pub(crate) fn ptr(&self) -> u64 {
        self.ptr
    }

    pub(crate) fn bytes(&self) -> usize {
        self.slice.as_ref().map_or(0, |s| s.len() * 4)
    }
}

impl Drop for ForeignSlice {
    fn drop(&mut self) {
        let Some(slice) = self.slice.take() else { return };
        if self.backend.is_capturing() {
            // Freeing would invalidate the capture: park it.
            PARKED.lock().unwrap_or_else(|e| e.into_inner()).push(slice);
            return;
        }
        // Work queued on the device stream may still use the memory.
        let _ = self.backend.drain();
        drop(slice);
        free_parked(&self.backend);
    }
}

impl Device {
    /// The CUDA context of this device, for cudarc calls of your own (`load_module`, ...);
    /// `None` on the host backend.
    ///
    /// ```
    /// # use graphed::Device;
    /// let dev = Device::default_device();
    /// assert_eq!(dev.cuda_context().is_some(), dev.is_cuda());
    /// ```
    pub fn cuda_context(&self) -> Option<Arc<CudaContext>> {
        self.backend().cuda().map(|c| c.ctx.clone())
    }

    /// The device's one stream: graphed queues all its work there and graphs capture it, so
    /// work you launch on it is ordered with graphed's and captured with it. [`crate::interop`]
    /// says what is legal while it captures: launches and device-to-device async copies are;
    /// allocation, pageable copies, synchronize and event queries are not. `None` on the host
    /// backend.
    ///
    /// ```
    /// # use graphed::Device;
    /// let dev = Device::default_device();
    /// assert_eq!(dev.cuda_stream().is_some(), dev.is_cuda());
    /// ```
    pub fn cuda_stream(&self) -> Option<Arc<CudaStream>> {
        self.backend().cuda().map(|c| c.stream.clone())
    }
}

impl Tensor {
    /// The tensor's device address, for kernels you launch yourself. Checks first that the
    /// handle is not stale ([`Error::StaleTensor`]); [`Error::Interop`] on the host backend.
    /// The address stays valid while any handle to the buffer lives.
    ///
    /// ```
    /// # use graphed::{Device, Error, Tensor};
    /// let t = Tensor::zeros(&Device::host(), &[4])?;
    /// assert!(matches!(t.cuda_device_ptr(), Err(Error::Interop { .. })));
    /// # Ok::<(), graphed::Error>(())
    /// ```
    pub fn cuda_device_ptr(&self) -> Result<u64> {
        match self.ptr()? {
            Ptr::Cuda(p) => Ok(p),
            Ptr::Host(_) => Err(Error::Interop { op: "Tensor::cuda_device_ptr", problem: InteropProblem::HostBackend }),
        }
    }

    /// A tensor over `slice`'s memory, without a copy: the tensor owns the slice and frees it
    /// when its last handle drops (after the device stream's work; if the device is
    /// capturing then, after the capture). Wrapping is legal during a capture.
    ///
    /// [`Error::Interop`] when `device` is not a CUDA device or the slice belongs to another
    /// context, [`Error::Shape`] when `dims` does not hold `slice.len()` elements.
    ///
    /// ```
    /// # use graphed::{Device, Tensor};
    /// let dev = Device::default_device();
    /// if let Some(stream) = dev.cuda_stream() {
    ///     let slice = stream.alloc_zeros::<f32>(6).expect("alloc");
    ///     let t = Tensor::from_cuda_slice(&dev, slice, &[2, 3])?;
    ///     assert_eq!(t.to_vec()?, vec![0.0; 6]);
    /// }
    /// # Ok::<(), graphed::Error>(())
    /// ```
    pub fn from_cuda_slice(device: &Device, slice: CudaSlice<f32>, dims: &[usize]) -> Result<Tensor> {
        const OP: &str = "Tensor::from_cuda_slice";
        let Some(c) = device.backend().cuda() else {
            return Err(Error::Interop { op: OP, problem: InteropProblem::HostBackend });
        };
        if slice.context().cu_ctx() != c.ctx.cu_ctx() {
            let problem =
                InteropProblem::OtherContext { slice_ordinal: slice.context().ordinal(), device: device.name() };
            return Err(Error::Interop { op: OP, problem });
        }
        let shape = Shape::new(dims).ok_or_else(|| Error::shape(OP, ShapeProblem::rank(dims)))?;
        if shape.checked_numel() != Some(slice.len()) {
            return Err(Error::shape(OP, ShapeProblem::elements("elements of the slice", slice.len(), dims)));
        }
        let (ptr, record) = slice.device_ptr(&c.stream);
        drop(record);
        free_parked(device.backend());
        let owner = ForeignSlice { slice: Some(slice), backend: device.backend().clone(), ptr };
        Ok(Tensor::from_storage(device, Storage::Cuda(owner), shape, crate::DType::F32))
    }
}
