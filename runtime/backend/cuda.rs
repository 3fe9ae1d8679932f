//! The CUDA backend: one context, one capture-capable stream, the NVRTC-compiled kernels and a
//! cuBLAS handle per device. Every `unsafe` block of the crate that talks to CUDA lives here.

use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use cudarc::cublas::{result as cublas_result, sys as cublas_sys};
use cudarc::driver::{result, sys, CudaContext, CudaFunction, CudaStream};
use cudarc::nvrtc::{compile_ptx_with_opts, CompileOptions};

use super::fault::{self, FaultPoint, Faults};
use super::kernels::{BuiltinKernel, FlashTiles, KArg, RowTiles};
use super::ptx_cache;
use super::{DropErrors, StreamGate};
use crate::capabilities::CudaVersion;
use crate::error::{NcclProblem, NoCuda, OpError};
use crate::{DeviceError, DistError, Error, Result};

/// The clear state of the device's error word (see `kernels/transformer.cu`,
/// `kernels/decode.cu` and `kernels/flash_hopper.cu`): no bad token, no bad cache length, no
/// stalled wait (word 8; words 9-11 pad the word to 48 bytes).
const ERR_CLEAR: [u32; 12] = [u32::MAX, u32::MAX, 0, 0, u32::MAX, u32::MAX, 0, 0, 0, 0, 0, 0];

/// Byte offset in the error word of the count of waits that a kernel gave up (word 8; see
/// [`CudaBackend::stall_word`]).
const STALL_WORD_OFFSET: u64 = 8 * 4;

/// Bytes of the explicit cuBLAS workspace; with it set, GEMMs never allocate, so they capture.
pub(crate) const CUBLAS_WORKSPACE_BYTES: usize = 32 << 20;

/// Grid and block of one launch.
#[derive(Clone, Copy, Debug)]
pub(crate) struct LaunchDims {
    pub(crate) grid: (u32, u32, u32),
    pub(crate) block: (u32, u32, u32),
    pub(crate) shared: u32,
}

impl LaunchDims {
    /// One thread per element, 256 threads a block.
    pub(crate) fn elementwise(n: usize) -> LaunchDims {
        let blocks = n.div_ceil(256).clamp(1, 65535 * 8) as u32;
        LaunchDims { grid: (blocks, 1, 1), block: (256, 1, 1), shared: 0 }
    }

    /// One thread per 16 bytes of `n` elements of `dtype` (the vectorised elementwise kernels,
    /// whose grid-stride loops also cover the tail).
    pub(crate) fn vectorized(n: usize, dtype: crate::DType) -> LaunchDims {
        LaunchDims::elementwise(n.div_ceil(16 / dtype.size()))
    }

    /// One block per row, `threads` threads cooperating on it.
    pub(crate) fn rows(rows: usize, threads: u32) -> LaunchDims {
        LaunchDims { grid: (rows.max(1) as u32, 1, 1), block: (threads, 1, 1), shared: 0 }
    }
}

pub(crate) fn driver_err(call: &'static str) -> impl Fn(result::DriverError) -> Error {
    move |e| Error::cuda(call, e)
}

pub(crate) fn check(call: &'static str, r: sys::CUresult) -> Result<()> {
    if r == sys::CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(Error::cuda(call, result::DriverError(r)))
    }
}

/// Checks that the driver, NVRTC and cuBLAS libraries can be loaded, so that cudarc never
/// panics on a missing one.
fn probe_libraries() -> Result<()> {
    // SAFETY: these only try to dlopen the libraries by name.
    let (driver, nvrtc, cublas) =
        unsafe { (sys::is_culib_present(), cudarc::nvrtc::sys::is_culib_present(), cublas_sys::is_culib_present()) };
    let libraries: Vec<&'static str> = [(driver, "libcuda"), (nvrtc, "libnvrtc"), (cublas, "libcublas")]
        .iter()
        .filter(|(ok, _)| !ok)
        .map(|(_, name)| *name)
        .collect();
    if libraries.is_empty() {
        Ok(())
    } else {
        Err(Error::CudaUnavailable { reason: NoCuda::Libraries { libraries } })
    }
}

/// The version of the NCCL library that loads here (e.g. 22805 for 2.28.5), after checking
/// that libnccl loads, so that cudarc never panics on a missing library.
pub(crate) fn probe_nccl() -> Result<i32> {
    // SAFETY: only tries to dlopen the library by name.
    if !unsafe { cudarc::nccl::sys::is_culib_present() } {
        return Err(DistError::NcclUnavailable { reason: NcclProblem::NotLoadable }.into());
    }
    let mut version = 0;
    // SAFETY: the library is present; ncclGetVersion writes one int.
    let r = unsafe { cudarc::nccl::sys::ncclGetVersion(&mut version) };
    if r != cudarc::nccl::sys::ncclResult_t::ncclSuccess {
        return Err(DistError::NcclUnavailable { reason: NcclProblem::call("ncclGetVersion", r) }.into());
    }
    Ok(version)
}

/// Something that can tell a stuck stream from a slow one: an NCCL communicator whose
/// collectives the stream runs. Every wait on a watched stream polls, and asks each watcher
/// whether it must end.
pub(crate) trait StreamWatch: Send + Sync {
    /// Called while a wait has lasted `waited` (`None`: the stream is idle, the wait is
    /// over): an error once the wait must end. That is: the group failed, or the watcher's
    /// deadline passed (the watcher has then aborted the group, so collectives stuck on the
    /// stream return); once, the failure of a group aborted since the last wait (the work the
    /// stream finished may hold what aborted collectives left); and, for a group aborted a
    /// while ago, a stream that still does not drain (its aborted work will not return; the
    /// memory it may use is then not freed).
    fn check(&self, waited: Option<Duration>) -> Result<()>;
}

/// The newest CUDA version the loaded driver supports. The caller checked that libcuda loads.
pub(crate) fn driver_version() -> Result<CudaVersion> {
    let mut v = 0i32;
    // SAFETY: libcuda is present (probed first); `cuDriverGetVersion` exists in every driver
    // since CUDA 2.2, needs no `cuInit`, and writes one int.
    check("cuDriverGetVersion", unsafe { sys::cuDriverGetVersion(&mut v) })?;
    Ok(CudaVersion(v.max(0) as u32))
}

/// The kernels of `kernels/conditional.cu`: `one` sets one IF or WHILE node's condition from
/// a test, `two` sets a pair (the test's outcome and its opposite: an if/else), `update`
/// updates the loss scaler first and then sets one or two, `generation` is a generation step
/// that sets its WHILE node's condition from the flag it writes, `greedy` the same step with
/// its greedy sampling.
#[derive(Clone, Debug)]
pub(crate) struct CondKernels {
    pub(crate) one: CudaFunction,
    pub(crate) two: CudaFunction,
    pub(crate) update: CudaFunction,
    pub(crate) generation: CudaFunction,
    pub(crate) greedy: CudaFunction,
}

/// A cuBLAS handle. Calls on one handle must not run concurrently, so it lives in a `Mutex`.
pub(crate) struct CublasHandle(pub(crate) cublas_sys::cublasHandle_t);

// SAFETY: a cuBLAS handle may be used from any thread (each call binds the context first);
// only concurrent calls on one handle are forbidden, and the `Mutex` around it prevents them.
unsafe impl Send for CublasHandle {}

/// One device's CUDA state. Shared between threads: the driver's stream and launch calls are
/// thread-safe, the cuBLAS handle is behind a lock, and the gate keeps other threads' work out
/// of a capture.
pub(crate) struct CudaBackend {
    pub(crate) ctx: Arc<CudaContext>,
    pub(crate) stream: Arc<CudaStream>,
    /// The loaded kernels, in `BuiltinKernel::ALL` order.
    functions: Vec<CudaFunction>,
    /// The kernels that set conditional nodes' conditions (`kernels/conditional.cu`),
    /// compiled the first time a conditional graph is built on this device.
    conditional_fn: Mutex<Option<CondKernels>>,
    /// The one-kernel decoding steps (`kernels/decoder.cu`), compiled per model shape the first
    /// time an `ops::DecoderStep` of that shape is made here (see `cuda_decoder.rs`).
    pub(crate) decoder_fn: Mutex<Vec<(super::cuda_decoder::DecoderShape, u32, CudaFunction)>>,
    /// The Hopper attention backward (`kernels/flash_hopper.cu`), compiled the first time a
    /// backward asks for it (see `cuda_hopper.rs`).
    pub(crate) hopper_fn: super::cuda_hopper::HopperSlot,
    cublas: std::sync::Mutex<CublasHandle>,
    pub(crate) cublas_workspace: sys::CUdeviceptr,
    /// The device's error word: eight u32 that kernels report bad input in (bad token ids,
    /// bad cache lengths);
    /// its address is fixed for the device's life, so graphs capture it.
    err_word: sys::CUdeviceptr,
    /// cublasLt (fused epilogues), when the library loads.
    pub(crate) lt: Option<std::sync::Mutex<super::cublaslt::Lt>>,
    /// cuDNN (fused attention), opened the first time attention asks for it: `None` inside
    /// when libcudnn is not there.
    pub(crate) cudnn: std::sync::OnceLock<Option<std::sync::Mutex<super::cudnn::Cudnn>>>,
    /// The CUDA version the driver supports; driver functions newer than
    /// [`CudaVersion::MIN_DRIVER`] are only called when it has them.
    pub(crate) driver_version: CudaVersion,
    name: String,
    /// Compute capability (major, minor).
    pub(crate) capability: (i32, i32),
    /// Whether the built-in kernels launch with programmatic dependent launch (`GRAPHED_PDL=1`
    /// on sm_90 and newer; the program is then compiled with `GR_PDL`, see kernels/core.cu).
    pdl: bool,
    /// The most dynamic shared memory a block may opt into, in bytes.
    pub(crate) max_shared_optin: usize,
    /// The most dynamic shared memory each built-in kernel may launch with, in bytes
    /// (`BuiltinKernel::ALL` order; see [`opt_in_dynamic_shared`]).
    dynamic_limits: Vec<usize>,
    /// The most blocks a cluster of each built-in kernel may take with its most dynamic shared
    /// memory and its most threads a block (`BuiltinKernel::ALL` order; 1 for the kernels that
    /// do not launch in clusters, and below sm_90; see [`cluster_limit`]).
    cluster_limits: Vec<u32>,
    /// [`CudaBackend::resident_clusters`]'s answers: (kernel, threads a block, dynamic shared
    /// bytes, blocks a cluster) and the clusters resident at once.
    resident: Mutex<Vec<(ClusterShape, u32)>>,
    /// Multiprocessors: kernels whose tiles depend on how full the GPU is ask for it.
    pub(crate) sm_count: usize,
    pub(crate) gate: Arc<StreamGate>,
    pub(crate) drop_errors: Arc<DropErrors>,
    pub(crate) faults: Arc<Faults>,
    /// The communicators that watch this stream's waits (see [`StreamWatch`]).
    watchers: Mutex<Vec<Weak<dyn StreamWatch>>>,
    /// Whether any watcher was registered: waits poll instead of blocking in the driver.
    watched: AtomicBool,
}

impl std::fmt::Debug for CudaBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CudaBackend({})", self.name)
    }
}

/// A launch shape in clusters: the kernel, threads a block, dynamic shared bytes a block and
/// blocks a cluster.
type ClusterShape = (BuiltinKernel, u32, u32, u32);

/// How `CudaBackend::launch_with` launches a kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Launch {
    Plain,
    /// Every block resident at once (`cuLaunchKernelEx`, cooperative).
    Cooperative,
    /// Programmatic dependent launch (`cuLaunchKernelEx`, programmatic stream serialization):
    /// only for kernels that start with `GR_PDL_ENTRY()`, the built-in ones.
    Programmatic,
    /// Thread block clusters of this many blocks along x (`cuLaunchKernelEx`, sm_90).
    Cluster(u32),
}

/// NVRTC's options for the built-in kernels' program on a GPU of compute capability `arch`,
/// with programmatic dependent launch compiled in or not (`GR_PDL`).
pub(crate) fn main_options((major, minor): (i32, i32), pdl: bool) -> Vec<String> {
    let mut options = vec![format!("--gpu-architecture=sm_{major}{minor}"), "-std=c++17".into()];
    options.extend(FlashTiles::nvrtc_defines());
    options.extend(RowTiles::nvrtc_defines());
    if pdl {
        options.push("-DGR_PDL".into());
    }
    options
}

/// The conditional-node kernels' program (`kernels/conditional.cu` and what it builds on) and
/// NVRTC's options for it on a GPU of compute capability `arch`.
pub(crate) fn conditional_program((major, minor): (i32, i32)) -> (String, Vec<String>) {
    let options = vec![format!("--gpu-architecture=sm_{major}{minor}"), "-std=c++17".into()];
    let src = [
        include_str!("kernels/scale_update.cu"),
        include_str!("kernels/generation.cu"),
        include_str!("kernels/conditional.cu"),
    ]
    .join("\n");
    (src, options)
}

/// The default dynamic shared memory a block may have without opting in, in bytes.
const DEFAULT_DYNAMIC_SHARED: usize = 48 << 10;

/// Opts `f` into the most dynamic shared memory a block may have (`big`) and returns what it
/// may launch with: the device's opt-in limit less the kernel's static shared memory (the
/// driver refuses a maximum whose sum with the static arrays exceeds the limit). A kernel that
/// is not `big`, or that the driver does not let opt in, keeps the default 48 KB less its static
/// arrays: a refusal here never stops the device from opening, the launches that need more
/// check this limit and take another path or refuse.
pub(crate) fn opt_in_dynamic_shared(f: &CudaFunction, big: bool, max_shared_optin: usize) -> usize {
    let fixed = f.shared_size_bytes().map_or(0, |b| b.max(0) as usize);
    let default = DEFAULT_DYNAMIC_SHARED.saturating_sub(fixed);
    if !big {
        return default;
    }
    let room = max_shared_optin.saturating_sub(fixed);
    let attr = sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES;
    match f.set_attribute(attr, room as i32) {
        Ok(()) => room.max(default),
        Err(_) => default,
    }
}

/// The launch attribute for clusters of `blocks` blocks along x.
fn cluster_attribute(blocks: u32) -> sys::CUlaunchAttribute {
    sys::CUlaunchAttribute {
        id: sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION,
        pad: [0; 4],
        value: sys::CUlaunchAttributeValue {
            clusterDim: sys::CUlaunchAttributeValue_union__bindgen_ty_1 { x: blocks, y: 1, z: 1 },
        },
    }
}

/// The most blocks (up to the portable 8) a cluster of `f` may take with `shared` bytes of
/// dynamic shared memory and `threads` threads a block (the most it launches with), as the
/// driver's occupancy calculator (`cuOccupancyMaxActiveClusters`) finds at least one such
/// cluster resident; 1 when it finds none or refuses. Asked once, when the device opens: a launch never asks for more.
/// `GRAPHED_CLUSTER_DEBUG=1` prints each answer.
fn cluster_limit(f: &CudaFunction, threads: u32, shared: usize, stream: sys::CUstream) -> u32 {
    (2..=8u32)
        .rev()
        .find(|&blocks| {
            let (r, clusters) =
                active_clusters(f, blocks, threads, shared as u32, stream, Some(cluster_attribute(blocks)));
            if std::env::var_os("GRAPHED_CLUSTER_DEBUG").is_some() {
                eprintln!("graphed: {blocks} blocks a cluster, {shared} B shared a block: {r:?}, {clusters} resident");
            }
            r == sys::CUresult::CUDA_SUCCESS && clusters >= 1
        })
        .unwrap_or(1)
}

/// The driver's occupancy calculator for clusters (`cuOccupancyMaxActiveClusters`): how many
/// clusters of `blocks` blocks of `f` (`threads` a block, `shared` bytes of dynamic shared
/// memory) are resident at once, with the call's status. `cluster` is the launch's cluster
/// attribute, `None` for a kernel whose cluster shape is compiled in. `f` is loaded on the
/// current context.
pub(crate) fn active_clusters(
    f: &CudaFunction,
    blocks: u32,
    threads: u32,
    shared: u32,
    stream: sys::CUstream,
    cluster: Option<sys::CUlaunchAttribute>,
) -> (sys::CUresult, i32) {
    let mut attr = cluster;
    let config = sys::CUlaunchConfig {
        gridDimX: blocks,
        gridDimY: 1,
        gridDimZ: 1,
        blockDimX: threads,
        blockDimY: 1,
        blockDimZ: 1,
        sharedMemBytes: shared,
        hStream: stream,
        attrs: attr.as_mut().map_or(std::ptr::null_mut(), |a| a as *mut _),
        numAttrs: u32::from(attr.is_some()),
    };
    let mut clusters = 0i32;
    // SAFETY: the function is loaded on the current context (the caller's word), the config and
    // its attribute (if any) live until the call returns, and the count is a plain out-parameter.
    let r = unsafe { sys::cuOccupancyMaxActiveClusters(&mut clusters, f.cu_function(), &config) };
    (r, clusters)
}

/// `GRAPHED_PDL=1`: programmatic dependent launch between the built-in kernels (read once a
/// process). Off by default: on the H200 it moved the GPT's step by 0.4% at most (2026-12-04).
fn pdl_requested() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("GRAPHED_PDL").is_ok_and(|v| v == "1"))
}

impl CudaBackend {
    /// Opens device `ordinal`: context, stream, kernels and cuBLAS, or a clean error.
    pub(crate) fn new(
        ordinal: usize,
        gate: Arc<StreamGate>,
        drop_errors: Arc<DropErrors>,
        faults: Arc<Faults>,
    ) -> Result<CudaBackend> {
        probe_libraries()?;
        let driver_version = driver_version()?;
        if driver_version < CudaVersion::MIN_DRIVER {
            return Err(Error::CudaUnavailable {
                reason: NoCuda::DriverTooOld { driver: driver_version, needed: CudaVersion::MIN_DRIVER },
            });
        }
        let refused = |call: &'static str| {
            move |e: result::DriverError| Error::CudaUnavailable {
                reason: NoCuda::Driver { call, message: format!("{e:?}") },
            }
        };
        let count = CudaContext::device_count().map_err(refused("cuDeviceGetCount"))?;
        if ordinal as i32 >= count {
            let count = count.max(0) as usize;
            return Err(Error::CudaUnavailable { reason: NoCuda::NoDevice { ordinal, count } });
        }
        let ctx = CudaContext::new(ordinal).map_err(refused("cuCtxCreate"))?;
        // We order all work on one stream ourselves; cudarc's per-slice events would be
        // recorded inside captures.
        // SAFETY: we never share cudarc slices between streams.
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx.new_stream().map_err(driver_err("cuStreamCreate"))?;
        let name = ctx.name().unwrap_or_else(|_| "CUDA device".into());

        let (major, minor) = (
            ctx.attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)
                .map_err(driver_err("cuDeviceGetAttribute"))?,
            ctx.attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)
                .map_err(driver_err("cuDeviceGetAttribute"))?,
        );
        // kernels/*.cu, or the files GRAPHED_KERNELS_DIR holds in their place (kernel_source).
        let src = super::kernel_source::main_sources()?.join("\n");
        let pdl = pdl_requested() && major >= 9;
        let options = main_options((major, minor), pdl);
        let compile = || compile_ptx_with_opts(&src, CompileOptions { options: options.clone(), ..Default::default() });
        let ptx =
            ptx_cache::compile_cached(&src, &options, compile).map_err(|e| Error::cuda("nvrtcCompileProgram", e))?;
        let module = ctx.load_module(ptx).map_err(driver_err("cuModuleLoadData"))?;
        let functions = BuiltinKernel::ALL
            .iter()
            .map(|k| module.load_function(k.name()).map_err(driver_err("cuModuleGetFunction")))
            .collect::<Result<Vec<_>>>()?;
        let max_shared_optin = ctx
            .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)
            .map_err(driver_err("cuDeviceGetAttribute"))?
            .max(0) as usize;
        let sm_count = ctx
            .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .map_err(driver_err("cuDeviceGetAttribute"))?
            .max(1) as usize;
        // The fused attention kernels, the row kernels' ring forms and the rows in shared
        // memory (RMSNorm's, the cross-entropy's) take more than the default 48 KB of dynamic shared memory; their
        // launches check their need against `dynamic_shared_limit` first.
        let dynamic_limits = BuiltinKernel::ALL
            .iter()
            .zip(&functions)
            .map(|(k, f)| {
                let big = (k.name().starts_with("flash_")
                    && *k != BuiltinKernel::FlashBwdPrepBf16
                    && *k != BuiltinKernel::FlashBwdPrepF16)
                    || k.name().starts_with("rms_ring")
                    || k.name().starts_with("ln_ring")
                    || k.name().starts_with("rms_smem")
                    || k.name().starts_with("sx_smem")
                    || k.name().starts_with("sx_cluster");
                opt_in_dynamic_shared(f, big, max_shared_optin)
            })
            .collect::<Vec<_>>();
        // The cross-entropy splits a row past one block's shared memory over a cluster; the
        // RMSNorm backward adds its gamma-grad partials a cluster at a time where it is asked
        // to (RowTiles::bwd_cluster: otherwise nothing is asked of the driver for it).
        let cluster_limits = BuiltinKernel::ALL
            .iter()
            .zip(&functions)
            .zip(&dynamic_limits)
            .map(|((k, f), &shared)| {
                if major >= 9 && k.name().starts_with("sx_cluster") {
                    cluster_limit(f, 1024, shared, stream.cu_stream())
                } else if major >= 9 && *k == BuiltinKernel::RmsRingBwdClBf16 && RowTiles::bwd_cluster() > 1 {
                    cluster_limit(f, RowTiles::CHOSEN.bwd.1 as u32, shared, stream.cu_stream())
                } else {
                    1
                }
            })
            .collect();

        // SAFETY: plain allocation and a synchronous copy of `ERR_CLEAR` into it, outside any
        // capture; freed in Drop.
        let err_word = unsafe {
            let p = result::malloc_sync(std::mem::size_of_val(&ERR_CLEAR)).map_err(driver_err("cuMemAlloc"))?;
            result::memcpy_htod_sync(p, &ERR_CLEAR).map_err(driver_err("cuMemcpyHtoD"))?;
            p
        };
        let cublas = cublas_result::create_handle().map_err(|e| Error::cuda("cublasCreate", e))?;
        // SAFETY: plain allocation outside any capture; freed in Drop.
        let cublas_workspace =
            unsafe { result::malloc_sync(CUBLAS_WORKSPACE_BYTES) }.map_err(driver_err("cuMemAlloc"))?;
        // SAFETY: handle and stream are valid; the workspace outlives the handle (Drop order).
        unsafe {
            cublas_result::set_stream(cublas, stream.cu_stream() as _)
                .map_err(|e| Error::cuda("cublasSetStream", e))?;
            cublas_check(
                "cublasSetWorkspace",
                cublas_sys::cublasSetWorkspace_v2(cublas, cublas_workspace as *mut c_void, CUBLAS_WORKSPACE_BYTES),
            )?;
            // Plain float32 arithmetic: no TF32 (our results are compared with a CPU reference).
            cublas_check(
                "cublasSetMathMode",
                cublas_sys::cublasSetMathMode(cublas, cublas_sys::cublasMath_t::CUBLAS_PEDANTIC_MATH),
            )?;
        }
        Ok(CudaBackend {
            ctx,
            stream,
            functions,
            conditional_fn: Mutex::new(None),
            hopper_fn: Mutex::new(None),
            decoder_fn: Mutex::new(Vec::new()),
            cublas: std::sync::Mutex::new(CublasHandle(cublas)),
            cublas_workspace,
            err_word,
            lt: super::cublaslt::Lt::open().map(std::sync::Mutex::new),
            cudnn: std::sync::OnceLock::new(),
            driver_version,
            name,
            capability: (major, minor),
            pdl,
            max_shared_optin,
            dynamic_limits,
            cluster_limits,
            resident: Mutex::new(Vec::new()),
            sm_count,
            gate,
            drop_errors,
            faults,
            watchers: Mutex::new(Vec::new()),
            watched: AtomicBool::new(false),
        })
    }

    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// The most dynamic shared memory `kernel` may launch with, in bytes (its opt-in, less its
    /// static arrays).
    pub(crate) fn dynamic_shared_limit(&self, kernel: BuiltinKernel) -> usize {
        self.dynamic_limits[kernel as usize]
    }

    /// The most blocks a cluster of `kernel` may take (1: it does not launch in clusters).
    pub(crate) fn cluster_limit(&self, kernel: BuiltinKernel) -> u32 {
        self.cluster_limits[kernel as usize]
    }

    /// How many clusters of `blocks` blocks of `kernel`, each of `dims`'s threads and dynamic
    /// shared memory, are resident at once (`cuOccupancyMaxActiveClusters`, asked once a shape;
    /// 0 where the driver refuses the shape). A grid-stride kernel launched in clusters sizes its
    /// grid by it, so that no cluster waits for a second wave.
    pub(crate) fn resident_clusters(&self, kernel: BuiltinKernel, dims: LaunchDims, blocks: u32) -> Result<u32> {
        let threads = dims.block.0 * dims.block.1 * dims.block.2;
        let key = (kernel, threads, dims.shared, blocks);
        let mut seen = self.resident.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(&(_, n)) = seen.iter().find(|(k, _)| *k == key) {
            return Ok(n);
        }
        self.bind()?;
        let f = &self.functions[kernel as usize];
        let (r, n) =
            active_clusters(f, blocks, threads, dims.shared, self.stream.cu_stream(), Some(cluster_attribute(blocks)));
        let n = if r == sys::CUresult::CUDA_SUCCESS { n.max(0) as u32 } else { 0 };
        seen.push((key, n));
        Ok(n)
    }

    /// The cuBLAS handle, locked for one call.
    pub(crate) fn cublas_handle(&self) -> std::sync::MutexGuard<'_, CublasHandle> {
        self.cublas.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn ordinal(&self) -> usize {
        self.ctx.ordinal()
    }

    pub(crate) fn bind(&self) -> Result<()> {
        self.ctx.bind_to_thread().map_err(driver_err("cuCtxSetCurrent"))
    }

    /// Launches `kernel` on the device stream, after checking the arguments against its
    /// parameters.
    pub(crate) fn launch(&self, kernel: BuiltinKernel, dims: LaunchDims, args: &[KArg]) -> Result<()> {
        kernel.check_args(args)?;
        let how = if self.pdl { Launch::Programmatic } else { Launch::Plain };
        self.launch_with(&self.functions[kernel as usize], dims, args, how)
    }

    /// Launches `kernel` in thread block clusters of `blocks` blocks along x (at most
    /// [`Self::cluster_limit`]; the grid's x a multiple of it), after checking the arguments.
    pub(crate) fn launch_in_clusters(
        &self,
        kernel: BuiltinKernel,
        dims: LaunchDims,
        args: &[KArg],
        blocks: u32,
    ) -> Result<()> {
        if blocks == 1 {
            return self.launch(kernel, dims, args);
        }
        kernel.check_args(args)?;
        if blocks > self.cluster_limit(kernel) || !dims.grid.0.is_multiple_of(blocks) {
            return Err(OpError::TooLarge {
                op: "launch",
                what: "cluster size",
                got: blocks as usize,
                max: self.cluster_limit(kernel) as usize,
            }
            .into());
        }
        self.launch_with(&self.functions[kernel as usize], dims, args, Launch::Cluster(blocks))
    }

    /// Launches a loaded function (a built-in or a user kernel) on the device stream; the
    /// caller checked `args` against its parameters.
    pub(crate) fn launch_function(&self, f: &CudaFunction, dims: LaunchDims, args: &[KArg]) -> Result<()> {
        self.launch_with(f, dims, args, Launch::Plain)
    }

    /// Launches a loaded function cooperatively (`cuLaunchKernelEx` with the cooperative
    /// attribute, which captures into a graph as a cooperative kernel node): the driver runs
    /// every block of the grid at once or refuses the launch, so the blocks may wait for each
    /// other (the grid barrier of `kernels/decoder.cu`).
    pub(crate) fn launch_cooperative(&self, f: &CudaFunction, dims: LaunchDims, args: &[KArg]) -> Result<()> {
        self.launch_with(f, dims, args, Launch::Cooperative)
    }

    fn launch_with(&self, f: &CudaFunction, dims: LaunchDims, args: &[KArg], how: Launch) -> Result<()> {
        let _entered = self.gate.enter()?;
        self.bind()?;
        self.injected(FaultPoint::KernelLaunch, "cuLaunchKernel")?;
        let mut values = [0u64; 24];
        let mut ptrs = [std::ptr::null_mut::<c_void>(); 24];
        if args.len() > values.len() {
            return Err(OpError::TooLarge {
                op: "launch",
                what: "kernel argument count",
                got: args.len(),
                max: values.len(),
            }
            .into());
        }
        for (i, a) in args.iter().enumerate() {
            values[i] = match *a {
                KArg::Ptr(p) | KArg::U64(p) => p,
                KArg::F32(v) => v.to_bits() as u64,
                KArg::U32(v) => v as u64,
            };
        }
        for i in 0..args.len() {
            // Little-endian: a 4-byte argument reads the low half of its 8-byte slot.
            ptrs[i] = (&mut values[i]) as *mut u64 as *mut c_void;
        }
        let attr = match how {
            Launch::Plain => None,
            Launch::Cooperative => Some(sys::CUlaunchAttribute {
                id: sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_COOPERATIVE,
                pad: [0; 4],
                value: sys::CUlaunchAttributeValue { cooperative: 1 },
            }),
            // The kernel may launch before the one ahead of it in the stream completes; it
            // waits for it first thing (GR_PDL_ENTRY), so only its launch overlaps.
            Launch::Programmatic => Some(sys::CUlaunchAttribute {
                id: sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION,
                pad: [0; 4],
                value: sys::CUlaunchAttributeValue { programmaticStreamSerializationAllowed: 1 },
            }),
            Launch::Cluster(blocks) => Some(cluster_attribute(blocks)),
        };
        if let Some(mut attr) = attr {
            let config = sys::CUlaunchConfig {
                gridDimX: dims.grid.0,
                gridDimY: dims.grid.1,
                gridDimZ: dims.grid.2,
                blockDimX: dims.block.0,
                blockDimY: dims.block.1,
                blockDimZ: dims.block.2,
                sharedMemBytes: dims.shared,
                hStream: self.stream.cu_stream(),
                attrs: &mut attr,
                numAttrs: 1,
            };
            // SAFETY: as for cuLaunchKernel below; the attribute and the config live until the
            // call returns.
            let r = unsafe { sys::cuLaunchKernelEx(&config, f.cu_function(), ptrs.as_mut_ptr(), std::ptr::null_mut()) };
            return check("cuLaunchKernelEx", r);
        }
        // SAFETY: the function was loaded on this context, the argument slots live until the
        // call returns (cuLaunchKernel copies them), and every pointer argument belongs to a live
        // block of the right size (checked by the op before launching).
        unsafe {
            result::launch_kernel(
                f.cu_function(),
                dims.grid,
                dims.block,
                dims.shared,
                self.stream.cu_stream(),
                &mut ptrs[..args.len()],
            )
        }
        .map_err(driver_err("cuLaunchKernel"))
    }

    /// The kernels that set conditional nodes' conditions, compiled (NVRTC) and loaded the
    /// first time they are asked for. Building a conditional graph asks outside any capture;
    /// `Condition::run_if` asks at every eager call, so that a warm-up loads them before the
    /// capture that needs them (loading a module inside a capture is best avoided).
    pub(crate) fn conditional_kernels(&self) -> Result<CondKernels> {
        let mut slot = self.conditional_fn.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(f) = slot.as_ref() {
            return Ok(f.clone());
        }
        self.bind()?;
        let (src, options) = conditional_program(self.capability);
        let compile = || compile_ptx_with_opts(&src, CompileOptions { options: options.clone(), ..Default::default() });
        let ptx =
            ptx_cache::compile_cached(&src, &options, compile).map_err(|e| Error::cuda("nvrtcCompileProgram", e))?;
        let module = self.ctx.load_module(ptx).map_err(driver_err("cuModuleLoadData"))?;
        let load = |name: &str| module.load_function(name).map_err(driver_err("cuModuleGetFunction"));
        let kernels = CondKernels {
            one: load("graphed_set_conditional")?,
            two: load("graphed_set_conditional2")?,
            update: load("graphed_amp_update_set")?,
            generation: load("graphed_generation_step_set")?,
            greedy: load("graphed_greedy_record_set")?,
        };
        *slot = Some(kernels.clone());
        Ok(kernels)
    }

    /// `C = alpha * op(A) * op(B) + beta * C` in cuBLAS's column-major terms.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn sgemm(
        &self,
        trans_a: bool,
        trans_b: bool,
        m: usize,
        n: usize,
        k: usize,
        alpha: f32,
        a: u64,
        lda: usize,
        b: u64,
        ldb: usize,
        beta: f32,
        c: u64,
        ldc: usize,
    ) -> Result<()> {
        let _entered = self.gate.enter()?;
        self.injected_gemm("cublasSgemm")?;
        let handle = self.cublas.lock().unwrap_or_else(|e| e.into_inner());
        self.bind()?;
        let op = |t: bool| {
            if t {
                cublas_sys::cublasOperation_t::CUBLAS_OP_T
            } else {
                cublas_sys::cublasOperation_t::CUBLAS_OP_N
            }
        };
        // SAFETY: pointers come from live blocks whose sizes the linear op checked against
        // m, n, k and the leading dimensions.
        unsafe {
            cublas_check(
                "cublasSgemm",
                cublas_sys::cublasSgemm_v2(
                    handle.0,
                    op(trans_a),
                    op(trans_b),
                    m as i32,
                    n as i32,
                    k as i32,
                    &alpha,
                    a as *const f32,
                    lda as i32,
                    b as *const f32,
                    ldb as i32,
                    &beta,
                    c as *mut f32,
                    ldc as i32,
                ),
            )
        }
    }

    /// Allocates `bytes` of device memory outside the stream order (a pool slab); `None` when
    /// the device has no room (`CUDA_ERROR_OUT_OF_MEMORY`).
    pub(crate) fn malloc(&self, bytes: usize) -> Result<Option<u64>> {
        let _entered = self.gate.enter()?;
        self.bind()?;
        let allocated = if self.faults.fires(FaultPoint::SlabGrowth) {
            Err(result::DriverError(sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY))
        } else {
            // SAFETY: plain allocation; freed by `free`.
            unsafe { result::malloc_sync(bytes) }
        };
        match allocated {
            Ok(p) => Ok(Some(p)),
            Err(result::DriverError(sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY)) => Ok(None),
            Err(e) => Err(Error::cuda("cuMemAlloc", e)),
        }
    }

    /// The device memory the driver says is free, if it can tell.
    pub(crate) fn free_memory(&self) -> Option<usize> {
        self.bind().ok()?;
        result::mem_get_info().ok().map(|(free, _total)| free)
    }

    /// The error an injected fault at `point` gives (see `fault`), if one fires now.
    pub(crate) fn injected(&self, point: FaultPoint, call: &'static str) -> Result<()> {
        if self.faults.fires(point) {
            return Err(fault::driver_error(call, point));
        }
        Ok(())
    }

    /// A cuBLAS launch's injected fault: `CUBLAS_STATUS_EXECUTION_FAILED`.
    pub(crate) fn injected_gemm(&self, call: &'static str) -> Result<()> {
        if self.faults.fires(FaultPoint::KernelLaunch) {
            let status = cublas_sys::cublasStatus_t::CUBLAS_STATUS_EXECUTION_FAILED;
            return Err(Error::cuda(call, cublas_result::CublasError(status)));
        }
        Ok(())
    }

    /// Frees a slab from `malloc`.
    pub(crate) fn free(&self, ptr: u64) -> Result<()> {
        let _entered = self.gate.enter()?;
        self.bind()?;
        // SAFETY: `ptr` came from `malloc` and the pool frees each slab once, after the stream
        // finished all work (the caller synchronizes first).
        unsafe { result::free_sync(ptr) }.map_err(driver_err("cuMemFree"))
    }

    /// Host-to-device copy of plain values (`f32`, `u16` bit patterns); waits for the stream.
    pub(crate) fn copy_to_device<T: Copy>(&self, dst: u64, src: &[T]) -> Result<()> {
        let _entered = self.gate.enter()?;
        self.bind()?;
        self.injected(FaultPoint::Copy, "cuMemcpyHtoDAsync")?;
        // SAFETY: `dst` holds `src.len()` values (checked by the caller); the synchronous copy
        // does not outlive `src`.
        unsafe {
            result::memcpy_htod_async(dst, src, self.stream.cu_stream()).map_err(driver_err("cuMemcpyHtoDAsync"))?;
        }
        self.synchronize()
    }

    /// Device-to-host copy of plain values; waits for the stream.
    pub(crate) fn copy_to_host<T: Copy>(&self, dst: &mut [T], src: u64) -> Result<()> {
        let _entered = self.gate.enter()?;
        self.bind()?;
        self.injected(FaultPoint::Copy, "cuMemcpyDtoHAsync")?;
        // SAFETY: `src` holds `dst.len()` values (checked by the caller); we synchronize before
        // `dst` can be read.
        unsafe {
            result::memcpy_dtoh_async(dst, src, self.stream.cu_stream()).map_err(driver_err("cuMemcpyDtoHAsync"))?;
        }
        self.synchronize()
    }

    /// Stream-ordered device-to-device copy (captures as a memcpy node).
    pub(crate) fn copy_device(&self, dst: u64, src: u64, bytes: usize) -> Result<()> {
        let _entered = self.gate.enter()?;
        self.bind()?;
        self.injected(FaultPoint::Copy, "cuMemcpyDtoDAsync")?;
        // SAFETY: both ranges are live blocks of at least `bytes` (checked by the caller).
        unsafe { result::memcpy_dtod_async(dst, src, bytes, self.stream.cu_stream()) }
            .map_err(driver_err("cuMemcpyDtoDAsync"))
    }

    /// Waits for the stream (after another thread's capture, if one is in progress), then
    /// returns the error a kernel reported in the error word, if any, and clears it. Every
    /// device-to-host read ends here.
    pub(crate) fn synchronize(&self) -> Result<()> {
        let _entered = self.gate.enter()?;
        self.drain()?;
        self.take_reported_error()
    }

    /// Waits for the stream and leaves the error word for the next [`CudaBackend::synchronize`]
    /// (freeing memory must not consume a report meant for the user). On a stream that NCCL
    /// communicators watch, the wait polls and ends with their error when a peer failed or
    /// their deadline passed, instead of blocking in the driver behind a collective that waits
    /// for a dead peer.
    pub(crate) fn drain(&self) -> Result<()> {
        let _entered = self.gate.enter()?;
        if !self.watched.load(Ordering::Acquire) {
            return self.stream.synchronize().map_err(driver_err("cuStreamSynchronize"));
        }
        self.drain_watched()
    }

    /// Registers a watcher of this stream's waits (an NCCL communicator on this device).
    pub(crate) fn watch(&self, watcher: Weak<dyn StreamWatch>) {
        self.watchers.lock().unwrap_or_else(|e| e.into_inner()).push(watcher);
        self.watched.store(true, Ordering::Release);
    }

    /// [`CudaBackend::drain`] on a watched stream: polls the stream, and its watchers every
    /// millisecond; the first error a watcher gives ends the wait.
    fn drain_watched(&self) -> Result<()> {
        self.bind()?;
        let started = Instant::now();
        let mut next_check = Duration::ZERO;
        // Short waits (most of them) yield instead of sleeping, so polling adds little latency.
        let mut pause = Duration::ZERO;
        loop {
            // SAFETY: the stream is live for the backend's lifetime.
            match unsafe { sys::cuStreamQuery(self.stream.cu_stream()) } {
                sys::CUresult::CUDA_SUCCESS => return self.check_watchers(None).map_or(Ok(()), Err),
                sys::CUresult::CUDA_ERROR_NOT_READY => {}
                other => return Err(Error::cuda("cuStreamQuery", result::DriverError(other))),
            }
            let waited = started.elapsed();
            if waited >= next_check {
                if let Some(e) = self.check_watchers(Some(waited)) {
                    return Err(e);
                }
                next_check = waited + Duration::from_millis(1);
            }
            if waited < Duration::from_micros(200) {
                std::thread::yield_now();
            } else {
                std::thread::sleep(pause);
                pause = (pause * 2).clamp(Duration::from_micros(10), Duration::from_micros(200));
            }
        }
    }

    /// The first watcher's error for a wait that has lasted `waited`, if one says it must end.
    fn check_watchers(&self, waited: Option<Duration>) -> Option<Error> {
        let live: Vec<Arc<dyn StreamWatch>> = {
            let mut watchers = self.watchers.lock().unwrap_or_else(|e| e.into_inner());
            watchers.retain(|w| w.strong_count() > 0);
            watchers.iter().filter_map(Weak::upgrade).collect()
        };
        live.iter().find_map(|w| w.check(waited).err())
    }

    /// The address of the device's error word (the last argument of the embedding kernels).
    pub(crate) fn err_word(&self) -> u64 {
        self.err_word
    }

    /// The address of the error word's stall count: a kernel whose blocks wait for one another
    /// (the Hopper attention backward) adds one there for each wait it gave up, which the next
    /// [`CudaBackend::synchronize`] reports as [`DeviceError::KernelStalled`].
    pub(crate) fn stall_word(&self) -> u64 {
        self.err_word + STALL_WORD_OFFSET
    }

    /// Reads the error word (the stream is idle); a report becomes [`Error::TokenOutOfRange`]
    /// (a bad token id), a cache error ([`Error::CacheFull`], [`Error::CacheLengthOutOfRange`])
    /// or [`DeviceError::KernelStalled`], and the word is cleared.
    fn take_reported_error(&self) -> Result<()> {
        let mut w = [0u32; 12];
        // SAFETY: `err_word` is a live allocation of `ERR_CLEAR`'s size in this context; the
        // stream is idle (the caller synchronized) and both copies complete before the calls
        // return.
        unsafe {
            result::memcpy_dtoh_async(&mut w, self.err_word, self.stream.cu_stream())
                .map_err(driver_err("cuMemcpyDtoHAsync"))?;
            self.stream.synchronize().map_err(driver_err("cuStreamSynchronize"))?;
            if w[3] == 0 && w[7] == 0 && w[8] == 0 {
                return Ok(());
            }
            result::memcpy_htod_async(self.err_word, &ERR_CLEAR, self.stream.cu_stream())
                .map_err(driver_err("cuMemcpyHtoDAsync"))?;
            self.stream.synchronize().map_err(driver_err("cuStreamSynchronize"))?;
        }
        if w[3] != 0 {
            let op = if w[3] & 1 != 0 { "embedding" } else { "embedding_backward" };
            return Err(Error::TokenOutOfRange {
                op,
                id: f32::from_bits(w[0]),
                pos: w[1] as usize,
                vocab: w[2] as usize,
            });
        }
        if w[7] != 0 {
            let op = if w[7] & 2 != 0 { "kv_cache_append" } else { "decode_attention" };
            return Err(Error::cache_length(op, w[5] as usize, w[4] as i32, w[6] as usize));
        }
        Err(DeviceError::KernelStalled { op: "attention_backward", waits: w[8] }.into())
    }

    /// Creates a timing event pair and returns elapsed ms of `f`'s stream work.
    pub(crate) fn time_ms(&self, f: &mut dyn FnMut() -> Result<()>) -> Result<f32> {
        // cudarc's default flags disable timing; elapsed time needs CU_EVENT_DEFAULT.
        let timed = Some(sys::CUevent_flags::CU_EVENT_DEFAULT);
        let start = self.ctx.new_event(timed).map_err(driver_err("cuEventCreate"))?;
        let end = self.ctx.new_event(timed).map_err(driver_err("cuEventCreate"))?;
        start.record(&self.stream).map_err(driver_err("cuEventRecord"))?;
        f()?;
        end.record(&self.stream).map_err(driver_err("cuEventRecord"))?;
        end.synchronize().map_err(driver_err("cuEventSynchronize"))?;
        start.elapsed_ms(&end).map_err(driver_err("cuEventElapsedTime"))
    }
}

impl Drop for CudaBackend {
    fn drop(&mut self) {
        let handle = self.cublas.get_mut().unwrap_or_else(|e| e.into_inner()).0;
        // SAFETY: created in `new`, destroyed once, after the stream drained.
        let destroyed = self.drain().and_then(|()| {
            unsafe { cublas_result::destroy_handle(handle) }.map_err(|e| Error::cuda("cublasDestroy", e))
        });
        let freed = destroyed.and_then(|()| self.free(self.cublas_workspace)).and_then(|()| self.free(self.err_word));
        if let Err(e) = freed {
            // The device is going away: nobody is left to read a deferred error.
            eprintln!("graphed: error while closing {}: {e}", self.name);
        }
    }
}

fn cublas_check(call: &'static str, s: cublas_sys::cublasStatus_t) -> Result<()> {
    if s == cublas_sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
        Ok(())
    } else {
        Err(Error::cuda(call, cublas_result::CublasError(s)))
    }
}

#[cfg(test)]
mod tests {
    use crate::{DeviceError, Error};

    /// A wait a kernel gave up (the Hopper attention backward's ordered dQ sum) is counted in
    /// the error word's stall count; the next synchronize reports it once, as a typed error,
    /// and clears it.
    #[test]
    fn a_stall_count_in_the_error_word_is_reported_once_and_cleared() {
        let dev = match crate::Device::cuda(0) {
            Ok(d) => d,
            Err(e) => {
                assert!(
                    !std::env::var("GRAPHED_REQUIRE_CUDA").is_ok_and(|v| v == "1"),
                    "GRAPHED_REQUIRE_CUDA=1 but CUDA is unusable: {e}"
                );
                eprintln!(
                    "a_stall_count_in_the_error_word_is_reported_once_and_cleared: skipped: no CUDA device ({e})"
                );
                return;
            }
        };
        let c = dev.backend().cuda().expect("a CUDA device has a CUDA backend");
        // The copy ends in a synchronize, which reads the word it just wrote.
        let got = c.copy_to_device(c.stall_word(), &[3u32]);
        assert!(
            matches!(got, Err(Error::Device(DeviceError::KernelStalled { op: "attention_backward", waits: 3 }))),
            "{got:?}"
        );
        c.synchronize().unwrap();
    }
}
