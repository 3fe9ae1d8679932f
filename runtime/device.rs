//! `Device`: where tensors live and ops run (a CUDA GPU or the host backend).

use std::any::Any;
use std::sync::{Arc, Mutex};

use std::thread::ThreadId;

use crate::backend::Backend;
use crate::capabilities::Capabilities;
use crate::{Error, GraphPool, Result};

struct DeviceInner {
    backend: Arc<Backend>,
    default_pool: GraphPool,
    /// Per thread, the pools that its allocations go to instead of the default one, innermost
    /// last (a capture on one thread must not capture another thread's allocations).
    pool_stack: Mutex<Vec<(ThreadId, GraphPool)>>,
    /// The default random generator, made on first use by `Device::rng` (rng.rs); kept
    /// type-erased so that this layer, below the tensors a generator holds, names none of them.
    rng: Mutex<Option<Box<dyn Any + Send>>>,
}

/// A device: the CUDA GPU of an ordinal, or the host backend.
///
/// A `Device` is a cheap handle (clone it freely, send it to other threads). Each device has
/// one stream: everything on a device is ordered, and graphs capture that stream. Several
/// threads may drive one device at once; while one of them captures, the others' work waits
/// until the capture ends, so it never lands in the graph.
///
/// ```
/// use graphed::Device;
/// let dev = Device::default_device(); // the GPU when one is usable, else the host
/// println!("running on {}", dev.name());
/// assert!(Device::host().is_host());
/// ```
#[derive(Clone)]
pub struct Device(Arc<DeviceInner>);

impl std::fmt::Debug for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.name())
    }
}

impl PartialEq for Device {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

static CUDA_DEVICES: Mutex<Vec<(usize, Device)>> = Mutex::new(Vec::new());

impl crate::fault::FaultPlan {
    /// The fault plan of `device` (each device has its own, so tests on separate devices
    /// never see each other's faults).
    pub fn of(device: &Device) -> crate::fault::FaultPlan {
        crate::fault::FaultPlan::new(device.backend().faults.clone())
    }
}

impl Device {
    fn from_backend(backend: Backend) -> Device {
        let backend = Arc::new(backend);
        Device(Arc::new(DeviceInner {
            default_pool: GraphPool::new(backend.clone()),
            backend,
            pool_stack: Mutex::new(Vec::new()),
            rng: Mutex::new(None),
        }))
    }

    /// A new host-backend device. Each call makes an independent device with its own stream,
    /// so tests on separate host devices never see each other's captures.
    pub fn host() -> Device {
        Device::from_backend(Backend::host())
    }

    /// The CUDA GPU `ordinal`, or [`crate::Error::CudaUnavailable`] when there is none or the
    /// CUDA libraries cannot be loaded. The first call per ordinal creates the context, the
    /// stream, compiles the kernels (NVRTC) and creates the cuBLAS handle; later calls return
    /// the same device.
    pub fn cuda(ordinal: usize) -> Result<Device> {
        let mut devices = CUDA_DEVICES.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, d)) = devices.iter().find(|(o, _)| *o == ordinal) {
            return Ok(d.clone());
        }
        let dev = Device::from_backend(Backend::open_cuda(ordinal)?);
        devices.push((ordinal, dev.clone()));
        Ok(dev)
    }

    /// GPU 0 when it is usable, the host backend otherwise; never panics.
    /// Set `GRAPHED_DEVICE=host` to force the host backend.
    ///
    /// When it falls back, the first call in the process prints the reason to stderr (the
    /// [`Error::CudaUnavailable`] or CUDA error that [`Device::cuda`] returned: a library that
    /// does not load, no GPU, a driver too old), so a program that runs on the CPU says why.
    /// Setting `GRAPHED_DEVICE=host` chooses the host backend without that message.
    pub fn default_device() -> Device {
        if std::env::var("GRAPHED_DEVICE").is_ok_and(|v| v == "host") {
            return Device::host();
        }
        Device::cuda(0).unwrap_or_else(|e| {
            static SAID: std::sync::Once = std::sync::Once::new();
            let why = match &e {
                Error::CudaUnavailable { reason } => reason.to_string(),
                other => other.to_string(),
            };
            SAID.call_once(|| {
                eprintln!(
                    "graphed: running on the host backend (CPU), no usable GPU: {why} \
                     (GRAPHED_DEVICE=host chooses the host without this message)"
                )
            });
            Device::host()
        })
    }

    /// What this device's CUDA stack offers: the driver's CUDA version, conditional graph
    /// nodes, cublasLt, NCCL (see [`Capabilities`]). On the host backend, nothing.
    ///
    /// ```
    /// let caps = graphed::Device::host().capabilities();
    /// assert_eq!(caps.driver, None);
    /// assert_eq!(caps.to_string(), "host backend (no CUDA)");
    /// ```
    pub fn capabilities(&self) -> Capabilities {
        match self.0.backend.cuda() {
            None => Capabilities::host(),
            Some(c) => {
                let nccl = crate::backend::cuda::probe_nccl().ok().and_then(|v| u32::try_from(v).ok());
                Capabilities::cuda(c.driver_version, c.lt.is_some(), nccl)
            }
        }
    }

    /// Whether this is the host backend.
    pub fn is_host(&self) -> bool {
        self.0.backend.is_host()
    }

    /// Whether this is a CUDA GPU.
    pub fn is_cuda(&self) -> bool {
        !self.is_host()
    }

    /// A human-readable name: `cuda:0 (NVIDIA H200)` or `host`.
    pub fn name(&self) -> String {
        self.0.backend.name()
    }

    /// Waits until all work queued on the device is done. Illegal while capturing.
    ///
    /// On CUDA, bad input a kernel found since the last check (a token id outside the
    /// vocabulary in [`crate::ops::embedding`] or its backward, eagerly or in a replayed graph)
    /// is returned here as [`Error::TokenOutOfRange`]; a KV cache length out of range or a full
    /// cache ([`crate::ops::decode_attention`], [`crate::ops::kv_cache_append`]) as
    /// [`Error::CacheLengthOutOfRange`] or [`Error::CacheFull`]. The report is cleared; every
    /// read to the host ([`crate::Tensor::to_vec`] and friends) checks the same.
    pub fn synchronize(&self) -> Result<()> {
        self.0.backend.synchronize()
    }

    /// Whether the calling thread is capturing a graph on this device's stream.
    pub fn is_capturing(&self) -> bool {
        self.0.backend.is_capturing()
    }

    /// Bytes the device holds for all its pools (the default pool and every graph pool), as
    /// obtained from the driver. A failed `make_graphed` gives back what it took.
    pub fn reserved_bytes(&self) -> usize {
        self.0.backend.reserved_bytes()
    }

    /// Errors that happened where they could not be returned (freeing a slab or destroying a
    /// graph while dropping it), oldest first; each was also printed to stderr once. Reading
    /// them clears the list.
    pub fn take_drop_errors(&self) -> Vec<Error> {
        self.0.backend.drop_errors.take()
    }

    /// A new, empty pool on this device.
    pub fn new_pool(&self) -> GraphPool {
        GraphPool::new(self.0.backend.clone())
    }

    /// The pool eager allocations come from (a caching allocator, like PyTorch's).
    pub fn default_pool(&self) -> GraphPool {
        self.0.default_pool.clone()
    }

    /// The pool new tensors are allocated from now.
    pub fn current_pool(&self) -> GraphPool {
        let me = std::thread::current().id();
        let stack = self.0.pool_stack.lock().unwrap_or_else(|e| e.into_inner());
        let mine = stack.iter().rev().find(|(t, _)| *t == me);
        mine.map(|(_, p)| p.clone()).unwrap_or_else(|| self.0.default_pool.clone())
    }

    /// Runs `f` with new allocations on this device coming from `pool`.
    pub fn with_pool<R>(&self, pool: &GraphPool, f: impl FnOnce() -> R) -> R {
        self.push_pool(pool);
        struct Pop<'a>(&'a Device);
        impl Drop for Pop<'_> {
            fn drop(&mut self) {
                self.0.pop_pool();
            }
        }
        let _pop = Pop(self);
        f()
    }

    /// Runs `f` and returns the device time its work took, in milliseconds (CUDA events on a
    /// GPU; wall time on the host backend).
    pub fn time_ms(&self, mut f: impl FnMut() -> Result<()>) -> Result<f32> {
        self.0.backend.time_ms(&mut f)
    }

    /// Lets f32 GEMMs on this device run on TF32 tensor cores (10-bit significands, f32
    /// accumulation), or forbids it again. Off by default: f32 GEMMs are plain f32. The host
    /// backend always computes in plain f32 (there it only records the choice).
    ///
    /// ```
    /// let dev = graphed::Device::host();
    /// assert!(!dev.tf32());
    /// dev.set_tf32(true);
    /// assert!(dev.tf32());
    /// ```
    pub fn set_tf32(&self, allow: bool) {
        self.backend().tf32.store(allow, std::sync::atomic::Ordering::Relaxed);
    }

    /// Whether f32 GEMMs may use TF32 ([`Device::set_tf32`]).
    pub fn tf32(&self) -> bool {
        self.backend().tf32.load(std::sync::atomic::Ordering::Relaxed)
    }

    pub(crate) fn push_pool(&self, pool: &GraphPool) {
        let me = std::thread::current().id();
        self.0.pool_stack.lock().unwrap_or_else(|e| e.into_inner()).push((me, pool.clone()));
    }

    /// Pops the calling thread's innermost pool.
    pub(crate) fn pop_pool(&self) {
        let me = std::thread::current().id();
        let mut stack = self.0.pool_stack.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(i) = stack.iter().rposition(|(t, _)| *t == me) {
            stack.remove(i);
        }
    }

    pub(crate) fn backend(&self) -> &Arc<Backend> {
        &self.0.backend
    }

    /// The slot of the device's default random generator (see `Device::rng`, in rng.rs).
    pub(crate) fn rng_slot(&self) -> &Mutex<Option<Box<dyn Any + Send>>> {
        &self.0.rng
    }
}
