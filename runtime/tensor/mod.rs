//! `Tensor`: a shaped handle to a block of device (or host-backend) memory.

mod half;
pub mod interop;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, Weak};

use crate::backend::{HostPtr, Ptr};
use crate::error::DeviceError;
use crate::pool::{Block, Resident};
use crate::{DType, Device, Error, Result, Shape, ShapeProblem};

/// The low bit of a buffer's generation word: set while the memory holds what a graph of
/// another capture sharing its pool wrote there (see [`Resident`]). Generations count in the
/// bits above it, so handles (which hold a generation with this bit clear) go stale while it
/// is set and are valid again once it is cleared.
const OVERWRITTEN: u64 = 1;
/// One generation in the generation word.
const GENERATION: u64 = 2;

pub(crate) struct Buffer {
    device: Device,
    block: Storage,
    /// The generation (bumped each time a graph replay overwrites this buffer as a static
    /// output) times [`GENERATION`], plus [`OVERWRITTEN`] while another capture's graph
    /// has overwritten it.
    generation: AtomicU64,
    /// The graph surface this buffer belongs to, for stale-handle messages.
    owner: OnceLock<String>,
}

impl Resident for Buffer {
    fn overwritten(&self) {
        self.generation.fetch_or(OVERWRITTEN, Ordering::AcqRel);
    }

    fn rewritten(&self) {
        self.generation.fetch_and(!OVERWRITTEN, Ordering::AcqRel);
    }
}

/// What owns a buffer's memory: a pool block, or a CUDA slice handed over by the user
/// ([`Tensor::from_cuda_slice`]).
pub(crate) enum Storage {
    Pool(Block),
    Cuda(interop::ForeignSlice),
}

impl Storage {
    fn ptr(&self) -> Ptr {
        match self {
            Storage::Pool(b) => b.ptr.clone(),
            Storage::Cuda(s) => Ptr::Cuda(s.ptr()),
        }
    }

    /// (pool id, range); a foreign slice is in no pool (id 0, which no pool has).
    fn mem_range(&self) -> (usize, crate::pool::MemRange) {
        match self {
            Storage::Pool(b) => (b.pool_id(), b.range()),
            Storage::Cuda(s) => {
                (0, crate::pool::MemRange { slab: usize::MAX, offset: s.ptr() as usize, bytes: s.bytes() })
            }
        }
    }
}

impl std::fmt::Debug for Storage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Storage::Pool(b) => b.fmt(f),
            Storage::Cuda(s) => write!(f, "CudaSlice({:#x}, {} B)", s.ptr(), s.bytes()),
        }
    }
}

/// A tensor: shape, dtype and a reference-counted buffer on one device.
///
/// Cloning a `Tensor` gives another handle to the same memory (like PyTorch). Ops take
/// `&Tensor` and return new tensors; the few in-place ops (`*_` suffix) write through a shared
/// handle, which is how optimizers update parameters that captured graphs read.
///
/// A tensor handed out by a graphed module is a handle to a static buffer: the next replay
/// overwrites it, and from then on every use of the old handle is an
/// [`Error::StaleTensor`], never a silent read of new data. Keep a copy with
/// [`Tensor::deep_clone`].
///
/// ```
/// use graphed::{Device, Tensor};
/// let dev = Device::host();
/// let t = Tensor::from_slice(&dev, &[1.0, 2.0, 3.0, 4.0], &[2, 2])?;
/// assert_eq!(t.dims(), &[2, 2]);
/// assert_eq!(t.to_vec()?, vec![1.0, 2.0, 3.0, 4.0]);
/// # Ok::<(), graphed::Error>(())
/// ```
#[derive(Clone)]
pub struct Tensor {
    buf: Arc<Buffer>,
    shape: Shape,
    dtype: DType,
    generation: u64,
    requires_grad: bool,
}

impl std::fmt::Debug for Tensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Tensor({:?}, {:?}, {}, {:?})", self.shape, self.dtype, self.buf.device.name(), self.buf.block)
    }
}

/// Checks, before anything is allocated, that `got` values fill `dims` exactly (dims whose
/// product overflows never do) and that `device` is not capturing on this thread: a constructor
/// from host values refuses a mismatch as a shape error and a capture as
/// [`Error::IllegalDuringCapture`], not after an allocation it made first.
pub(crate) fn values_fit(device: &Device, op: &'static str, got: usize, dims: &[usize]) -> Result<()> {
    if crate::shape::checked_product(dims) != Some(got) {
        return Err(Error::shape(op, ShapeProblem::values(got, dims)));
    }
    // The copy from host memory would be refused inside a capture: refused before allocating.
    device.backend().forbid_during_capture("copy from host memory")
}

/// Runs `f`, which changes small device tensors (`state`: a step count, cache lengths) before
/// work that can still fail, so that such a failure leaves them as they were: outside a capture
/// they are copied first and, when `f` fails with an error `undo` accepts, copied back (where a
/// copy back fails too, `f`'s error is still the one returned). `f` is handed the copies, in
/// `state`'s order, to undo more with (the values before it ran). Inside a capture nothing runs
/// and a failure ends the capture, so nothing is copied and `f` gets no copies.
pub(crate) fn restoring<R>(
    state: &[&Tensor],
    undo: impl Fn(&Error) -> bool,
    f: impl FnOnce(&[Tensor]) -> Result<R>,
) -> Result<R> {
    if state.first().is_none_or(|t| t.device().is_capturing()) {
        return f(&[]);
    }
    let saved = state.iter().map(|t| t.deep_clone()).collect::<Result<Vec<_>>>()?;
    f(&saved).inspect_err(|e| {
        if undo(e) {
            for (t, s) in state.iter().zip(&saved) {
                let _ = t.copy_(s);
            }
        }
    })
}

impl Tensor {
    /// An uninitialised f32 tensor (its contents are whatever the pool block held; on the host
    /// backend fresh memory is NaN). Allocated from the device's current pool.
    pub fn empty(device: &Device, dims: &[usize]) -> Result<Tensor> {
        Tensor::empty_as(device, dims, DType::F32)
    }

    /// An uninitialised tensor of `dtype` (see [`Tensor::empty`]).
    ///
    /// ```
    /// use graphed::{DType, Device, Tensor};
    /// let t = Tensor::empty_as(&Device::host(), &[2, 3], DType::BF16)?;
    /// assert_eq!((t.dtype(), t.numel()), (DType::BF16, 6));
    /// # Ok::<(), graphed::Error>(())
    /// ```
    ///
    /// A shape whose bytes do not fit in memory is [`Error::OutOfMemory`] (with `requested`
    /// `usize::MAX` when the size does not even fit in `usize`), a pool at its limit
    /// [`Error::PoolLimit`]: never a panic, and nothing is allocated.
    pub fn empty_as(device: &Device, dims: &[usize], dtype: DType) -> Result<Tensor> {
        let (shape, bytes) = Tensor::layout(device, dims, dtype)?;
        let block = device.current_pool().alloc(bytes)?;
        Ok(Tensor::from_storage(device, Storage::Pool(block), shape, dtype))
    }

    /// A tensor in memory of the current pool that no capture has written (see
    /// `GraphPool::alloc_untouched`): for static surfaces a caller fills before a fused step.
    pub(crate) fn empty_untouched(device: &Device, dims: &[usize], dtype: DType) -> Result<Tensor> {
        let (shape, bytes) = Tensor::layout(device, dims, dtype)?;
        let block = device.current_pool().alloc_untouched(bytes)?;
        Ok(Tensor::from_storage(device, Storage::Pool(block), shape, dtype))
    }

    /// The shape of `dims` and its bytes in `dtype`, every product checked.
    fn layout(device: &Device, dims: &[usize], dtype: DType) -> Result<(Shape, usize)> {
        let shape = Shape::new(dims).ok_or_else(|| Error::shape("Tensor::empty", ShapeProblem::rank(dims)))?;
        let bytes = shape.checked_numel().and_then(|n| n.checked_mul(dtype.size()));
        let bytes = bytes.ok_or_else(|| device.backend().out_of_memory(usize::MAX))?;
        Ok((shape, bytes))
    }

    pub(crate) fn from_storage(device: &Device, block: Storage, shape: Shape, dtype: DType) -> Tensor {
        let buf =
            Arc::new(Buffer { device: device.clone(), block, generation: AtomicU64::new(0), owner: OnceLock::new() });
        if let Storage::Pool(block) = &buf.block {
            // Made during a capture: the pool decides at its end whether other captures'
            // graphs overwrite it (see `GraphPool::register_capture`).
            block.made(|| {
                let weak: Weak<dyn Resident> = Arc::downgrade(&buf) as Weak<Buffer>;
                weak
            });
        }
        Tensor { buf, shape, dtype, generation: 0, requires_grad: false }
    }

    /// A tensor of zeros.
    pub fn zeros(device: &Device, dims: &[usize]) -> Result<Tensor> {
        Tensor::full(device, dims, 0.0)
    }

    /// A tensor filled with `value`.
    pub fn full(device: &Device, dims: &[usize], value: f32) -> Result<Tensor> {
        Tensor::full_as(device, dims, value, DType::F32)
    }

    /// A tensor with the shape and dtype of `like`, uninitialised.
    pub fn empty_like(like: &Tensor) -> Result<Tensor> {
        Tensor::empty_as(like.device(), like.dims(), like.dtype())
    }

    /// A tensor holding `data` (row-major). Illegal during capture (a pageable copy).
    pub fn from_slice(device: &Device, data: &[f32], dims: &[usize]) -> Result<Tensor> {
        values_fit(device, "Tensor::from_slice", data.len(), dims)?;
        let t = Tensor::empty(device, dims)?;
        t.copy_from_slice(data)?;
        Ok(t)
    }

    /// Overwrites the contents from host memory; for a bf16 or f16 tensor each value is
    /// rounded to nearest even, as a kernel would store it. Illegal during capture.
    pub fn copy_from_slice(&self, data: &[f32]) -> Result<()> {
        self.device().backend().forbid_during_capture("copy from host memory")?;
        if data.len() != self.numel() {
            return Err(Error::shape("copy_from_slice", ShapeProblem::values(data.len(), self.dims())));
        }
        self.device().backend().write_values(&self.ptr()?, data, self.dtype)
    }

    /// Copies the contents to a `Vec` (waits for the device); bf16 and f16 values are widened
    /// to f32, which is exact. Illegal during capture.
    pub fn to_vec(&self) -> Result<Vec<f32>> {
        self.device().backend().read_values(&self.ptr()?, self.numel(), self.dtype)
    }

    /// A copy in new memory (not a static buffer, so no later replay touches it).
    pub fn deep_clone(&self) -> Result<Tensor> {
        let t = Tensor::empty_like(self)?;
        t.copy_(self)?;
        Ok(t.with_requires_grad(self.requires_grad))
    }

    /// Copies `src` into this tensor on the device stream (captured as a copy node).
    pub fn copy_(&self, src: &Tensor) -> Result<()> {
        const OP: &str = "copy_";
        if self.device() != src.device() {
            return Err(Error::DeviceMismatch { op: OP, a: self.device().name(), b: src.device().name() });
        }
        if self.dtype() != src.dtype() {
            return Err(Error::DTypeMismatch { op: OP, a: self.dtype(), b: src.dtype() });
        }
        if self.dims() != src.dims() {
            return Err(Error::shape(OP, ShapeProblem::same("src", src.dims(), "self", self.dims())));
        }
        self.device().backend().copy(&self.ptr()?, &src.ptr()?, self.numel(), self.dtype)
    }

    /// The same memory seen with another shape of the same number of elements.
    pub fn reshape(&self, dims: &[usize]) -> Result<Tensor> {
        let shape = Shape::new(dims).ok_or_else(|| Error::shape("reshape", ShapeProblem::rank(dims)))?;
        if shape.checked_numel() != Some(self.numel()) {
            return Err(Error::shape("reshape", ShapeProblem::elements("elements of the tensor", self.numel(), dims)));
        }
        Ok(Tensor { shape, ..self.clone() })
    }

    /// The first elements of the same memory seen with `dims` (no more elements than this
    /// tensor has): a trimmed view that shares the buffer, its staleness included. For a tensor
    /// whose first dimension is a batch, the first rows: a graph captured for a smaller batch
    /// reads and writes the first rows of buffers sized for the largest one (a KV cache).
    ///
    /// ```
    /// use graphed::{ops, Device, Tensor};
    /// let dev = Device::host();
    /// let cache = Tensor::zeros(&dev, &[4, 3])?; // 4 rows
    /// let first_two = cache.prefix_view(&[2, 3])?;
    /// ops::fill_(&first_two, 1.0)?;
    /// assert_eq!(cache.to_vec()?, [[1.0; 6].as_slice(), &[0.0; 6]].concat());
    /// assert!(cache.prefix_view(&[5, 3]).is_err()); // more elements than the tensor has
    /// # Ok::<(), graphed::Error>(())
    /// ```
    pub fn prefix_view(&self, dims: &[usize]) -> Result<Tensor> {
        let shape = Shape::new(dims).ok_or_else(|| Error::shape("prefix_view", ShapeProblem::rank(dims)))?;
        match shape.checked_numel() {
            Some(n) if n <= self.numel() => Ok(Tensor { shape, ..self.clone() }),
            _ => Err(Error::shape(
                "prefix_view",
                ShapeProblem::Prefix { got: dims.to_vec(), within: self.dims().to_vec() },
            )),
        }
    }

    /// The shape.
    pub fn shape(&self) -> Shape {
        self.shape
    }

    /// The dimensions.
    pub fn dims(&self) -> &[usize] {
        self.shape.dims()
    }

    /// The number of elements.
    pub fn numel(&self) -> usize {
        self.shape.numel()
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// The device the memory is on.
    pub fn device(&self) -> &Device {
        &self.buf.device
    }

    /// Whether a grad is wanted for this tensor when it is a module input.
    pub fn requires_grad(&self) -> bool {
        self.requires_grad
    }

    /// This handle with `requires_grad` set.
    pub fn with_requires_grad(mut self, requires_grad: bool) -> Tensor {
        self.requires_grad = requires_grad;
        self
    }

    /// Whether two handles share one buffer.
    pub fn same_buffer(&self, other: &Tensor) -> bool {
        Arc::ptr_eq(&self.buf, &other.buf)
    }

    /// Whether this handle is still valid: no replay overwrote its static buffer since, and
    /// the buffer does not lie in memory that a graph of another capture sharing its pool has
    /// overwritten since its own graph last wrote it (see [`crate::GraphPool`]).
    pub fn is_fresh(&self) -> bool {
        self.buf.generation.load(Ordering::Acquire) == self.generation
    }

    /// `Err(Error::StaleTensor)` when a replay overwrote the buffer since this handle was issued.
    pub(crate) fn check_fresh(&self) -> Result<()> {
        self.ptr().map(|_| ())
    }

    /// The memory address, after checking that the handle is not stale.
    pub(crate) fn ptr(&self) -> Result<Ptr> {
        let current = self.buf.generation.load(Ordering::Acquire);
        if current != self.generation {
            return Err(Error::StaleTensor {
                owner: self.buf.owner.get().cloned().unwrap_or_else(|| "a captured graph".into()),
                held: self.generation / GENERATION,
                current: current / GENERATION,
                overwritten_by_another_capture: current & OVERWRITTEN != 0,
            });
        }
        Ok(self.buf.block.ptr())
    }

    /// The device pointer (CUDA backend).
    pub(crate) fn cuda_ptr(&self) -> Result<u64> {
        match self.ptr()? {
            Ptr::Cuda(p) => Ok(p),
            Ptr::Host(_) => Err(DeviceError::OtherBackend { op: "cuda_ptr", what: "a host tensor" }.into()),
        }
    }

    /// The host address (host backend).
    pub(crate) fn host_ptr(&self) -> Result<HostPtr> {
        match self.ptr()? {
            Ptr::Host(mut h) => {
                h.len = self.numel();
                h.dtype = self.dtype;
                Ok(h)
            }
            Ptr::Cuda(_) => Err(DeviceError::OtherBackend { op: "host_ptr", what: "a CUDA tensor" }.into()),
        }
    }

    /// The pool memory the buffer occupies: (pool id, range).
    pub(crate) fn mem_range(&self) -> (usize, crate::pool::MemRange) {
        self.buf.block.mem_range()
    }

    /// Marks the buffer as a static surface of `owner` (for messages).
    pub(crate) fn set_owner(&self, owner: impl Into<String>) {
        let _ = self.buf.owner.set(owner.into());
    }

    /// Invalidates every handle to this buffer issued so far; returns a fresh one (stale at
    /// once if another capture's graph has overwritten the buffer).
    pub(crate) fn bump_generation(&self) -> Tensor {
        let g = self.buf.generation.fetch_add(GENERATION, Ordering::AcqRel) + GENERATION;
        Tensor { generation: g & !OVERWRITTEN, ..self.clone() }
    }

    /// A handle to the buffer as it is now (for the runtime's own static handles): valid,
    /// unless another capture's graph has overwritten the buffer since its own wrote it.
    pub(crate) fn refreshed(&self) -> Tensor {
        Tensor { generation: self.buf.generation.load(Ordering::Acquire) & !OVERWRITTEN, ..self.clone() }
    }
}
