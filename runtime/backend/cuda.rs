//! The CUDA backend: one context, one capture-capable stream, the NVRTC-compiled kernels and a
//! cuBLAS handle per device. Every `unsafe` block of the crate that talks to CUDA lives here.

use std::collections::HashMap;
use std::ffi::{c_void, CStr};
use std::sync::Arc;

use cudarc::cublas::{result as cublas_result, sys as cublas_sys};
use cudarc::driver::{result, sys, CudaContext, CudaFunction, CudaStream};
use cudarc::nvrtc::{compile_ptx_with_opts, CompileOptions};

use crate::graph::{CaptureMode, GraphNode, NodeKind};
use crate::{Error, Result};

/// The CUDA C sources compiled once per context. Kernel names are `extern "C"`.
const KERNEL_SOURCES: &[&str] = &[include_str!("kernels/core.cu"), include_str!("kernels/ops.cu")];

/// Bytes of the explicit cuBLAS workspace; with it set, GEMMs never allocate, so they capture.
const CUBLAS_WORKSPACE_BYTES: usize = 32 << 20;

/// A kernel argument, passed by value.
#[derive(Clone, Copy, Debug)]
pub(crate) enum KArg {
    /// A device pointer.
    Ptr(u64),
    F32(f32),
    U32(u32),
    U64(u64),
}

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

    /// One block per row, `threads` threads cooperating on it.
    pub(crate) fn rows(rows: usize, threads: u32) -> LaunchDims {
        LaunchDims { grid: (rows.max(1) as u32, 1, 1), block: (threads, 1, 1), shared: 0 }
    }
}

pub(crate) fn driver_err(call: &'static str) -> impl Fn(result::DriverError) -> Error {
    move |e| Error::Cuda { call, message: format!("{e:?}") }
}

fn check(call: &'static str, r: sys::CUresult) -> Result<()> {
    if r == sys::CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(Error::Cuda { call, message: format!("{r:?}") })
    }
}

/// Checks that the driver, NVRTC and cuBLAS libraries can be loaded, so that cudarc never
/// panics on a missing one.
fn probe_libraries() -> Result<()> {
    // SAFETY: these only try to dlopen the libraries by name.
    let (driver, nvrtc, cublas) =
        unsafe { (sys::is_culib_present(), cudarc::nvrtc::sys::is_culib_present(), cublas_sys::is_culib_present()) };
    let missing: Vec<&str> = [(driver, "libcuda"), (nvrtc, "libnvrtc"), (cublas, "libcublas")]
        .iter()
        .filter(|(ok, _)| !ok)
        .map(|(_, name)| *name)
        .collect();
    if missing.is_empty() {
        Ok(())
    } else {
        Err(Error::CudaUnavailable {
            reason: format!(
                "cannot load {} (set LD_LIBRARY_PATH to the CUDA libraries, e.g. /usr/local/cuda/lib64)",
                missing.join(", ")
            ),
        })
    }
}

/// One device's CUDA state.
pub(crate) struct CudaBackend {
    pub(crate) ctx: Arc<CudaContext>,
    pub(crate) stream: Arc<CudaStream>,
    functions: HashMap<String, CudaFunction>,
    cublas: cublas_sys::cublasHandle_t,
    cublas_workspace: sys::CUdeviceptr,
    name: String,
}

// SAFETY: the cuBLAS handle is only used from calls that bind the context first, and cuBLAS
// handles may be used from any thread as long as calls on one handle are not concurrent; the
// device serialises work on its one stream through `&self` methods that take no locks but the
// public API is used from one thread at a time (documented on `Device`).
unsafe impl Send for CudaBackend {}
// SAFETY: as above.
unsafe impl Sync for CudaBackend {}

impl std::fmt::Debug for CudaBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CudaBackend({})", self.name)
    }
}

impl CudaBackend {
    /// Opens device `ordinal`: context, stream, kernels and cuBLAS, or a clean error.
    pub(crate) fn new(ordinal: usize) -> Result<CudaBackend> {
        probe_libraries()?;
        let count = CudaContext::device_count().map_err(|e| Error::CudaUnavailable { reason: format!("{e:?}") })?;
        if ordinal as i32 >= count {
            return Err(Error::CudaUnavailable { reason: format!("no CUDA device {ordinal} ({count} found)") });
        }
        let ctx = CudaContext::new(ordinal).map_err(|e| Error::CudaUnavailable { reason: format!("{e:?}") })?;
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
        let src = KERNEL_SOURCES.join("\n");
        let opts = CompileOptions {
            options: vec![format!("--gpu-architecture=sm_{major}{minor}"), "-std=c++17".into()],
            ..Default::default()
        };
        let ptx = compile_ptx_with_opts(&src, opts)
            .map_err(|e| Error::Cuda { call: "nvrtcCompileProgram", message: format!("{e:?}") })?;
        let module = ctx.load_module(ptx).map_err(driver_err("cuModuleLoadData"))?;
        let mut functions = HashMap::new();
        for name in kernel_names(&src) {
            let f = module.load_function(&name).map_err(driver_err("cuModuleGetFunction"))?;
            functions.insert(name, f);
        }

        let cublas = cublas_result::create_handle()
            .map_err(|e| Error::Cuda { call: "cublasCreate", message: format!("{e:?}") })?;
        // SAFETY: plain allocation outside any capture; freed in Drop.
        let cublas_workspace =
            unsafe { result::malloc_sync(CUBLAS_WORKSPACE_BYTES) }.map_err(driver_err("cuMemAlloc"))?;
        // SAFETY: handle and stream are valid; the workspace outlives the handle (Drop order).
        unsafe {
            cublas_result::set_stream(cublas, stream.cu_stream() as _)
                .map_err(|e| Error::Cuda { call: "cublasSetStream", message: format!("{e:?}") })?;
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
        Ok(CudaBackend { ctx, stream, functions, cublas, cublas_workspace, name })
    }

    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    pub(crate) fn ordinal(&self) -> usize {
        self.ctx.ordinal()
    }

    fn bind(&self) -> Result<()> {
        self.ctx.bind_to_thread().map_err(driver_err("cuCtxSetCurrent"))
    }

    /// Launches kernel `name` on the device stream.
    pub(crate) fn launch(&self, name: &str, dims: LaunchDims, args: &[KArg]) -> Result<()> {
        let f = self
            .functions
            .get(name)
            .ok_or_else(|| Error::Cuda { call: "cuModuleGetFunction", message: format!("no kernel named {name}") })?;
        self.bind()?;
        let mut values = [0u64; 16];
        let mut ptrs = [std::ptr::null_mut::<c_void>(); 16];
        if args.len() > values.len() {
            return Err(Error::invalid("launch", format!("{} kernel arguments, at most 16", args.len())));
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
        // SAFETY: the function comes from our module, the argument slots live until the call
        // returns (cuLaunchKernel copies them), and every pointer argument was produced by our
        // allocator for a live block of the right size (checked by the op before launching).
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
                    self.cublas,
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

    /// Allocates `bytes` of device memory outside the stream order (a pool slab).
    pub(crate) fn malloc(&self, bytes: usize) -> Result<u64> {
        self.bind()?;
        // SAFETY: plain allocation; freed by `free`.
        unsafe { result::malloc_sync(bytes) }.map_err(driver_err("cuMemAlloc"))
    }

    /// Frees a slab from `malloc`.
    pub(crate) fn free(&self, ptr: u64) {
        if self.bind().is_ok() {
            // SAFETY: `ptr` came from `malloc` and the pool frees each slab once, after the
            // stream finished all work (`Drop` synchronizes first).
            let _ = unsafe { result::free_sync(ptr) };
        }
    }

    /// Stream-ordered host-to-device copy.
    pub(crate) fn copy_to_device(&self, dst: u64, src: &[f32]) -> Result<()> {
        self.bind()?;
        // SAFETY: `dst` holds `src.len()` floats (checked by the caller); the synchronous copy
        // does not outlive `src`.
        unsafe {
            result::memcpy_htod_async(dst, src, self.stream.cu_stream()).map_err(driver_err("cuMemcpyHtoDAsync"))?;
        }
        self.synchronize()
    }

    /// Device-to-host copy; waits for the stream.
    pub(crate) fn copy_to_host(&self, dst: &mut [f32], src: u64) -> Result<()> {
        self.bind()?;
        // SAFETY: `src` holds `dst.len()` floats (checked by the caller); we synchronize before
        // `dst` can be read.
        unsafe {
            result::memcpy_dtoh_async(dst, src, self.stream.cu_stream()).map_err(driver_err("cuMemcpyDtoHAsync"))?;
        }
        self.synchronize()
    }

    /// Stream-ordered device-to-device copy (captures as a memcpy node).
    pub(crate) fn copy_device(&self, dst: u64, src: u64, bytes: usize) -> Result<()> {
        self.bind()?;
        // SAFETY: both ranges are live blocks of at least `bytes` (checked by the caller).
        unsafe { result::memcpy_dtod_async(dst, src, bytes, self.stream.cu_stream()) }
            .map_err(driver_err("cuMemcpyDtoDAsync"))
    }

    pub(crate) fn synchronize(&self) -> Result<()> {
        self.stream.synchronize().map_err(driver_err("cuStreamSynchronize"))
    }

    pub(crate) fn begin_capture(&self, mode: CaptureMode) -> Result<()> {
        let mode = match mode {
            CaptureMode::Global => sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_GLOBAL,
            CaptureMode::ThreadLocal => sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
            CaptureMode::Relaxed => sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED,
        };
        self.stream.begin_capture(mode).map_err(driver_err("cuStreamBeginCapture"))
    }

    /// Ends the capture; the graph, or the error that invalidated the capture.
    pub(crate) fn end_capture(&self) -> Result<RawGraph> {
        self.bind()?;
        // SAFETY: the stream is ours; a null graph means the capture was invalidated.
        let g = unsafe { result::stream::end_capture(self.stream.cu_stream()) }
            .map_err(driver_err("cuStreamEndCapture"))?;
        if g.is_null() {
            return Err(Error::GraphState("the capture was invalidated by an illegal operation".into()));
        }
        Ok(RawGraph { graph: g, exec: std::ptr::null_mut() })
    }

    pub(crate) fn instantiate(&self, g: &mut RawGraph) -> Result<()> {
        if !g.exec.is_null() {
            return Ok(());
        }
        self.bind()?;
        // SAFETY: `g.graph` is a valid graph we own.
        g.exec = unsafe { result::graph::instantiate(g.graph, sys::CUgraphInstantiate_flags(0)) }
            .map_err(driver_err("cuGraphInstantiate"))?;
        // SAFETY: the exec was just created on this context.
        unsafe { result::graph::upload(g.exec, self.stream.cu_stream()) }.map_err(driver_err("cuGraphUpload"))?;
        Ok(())
    }

    pub(crate) fn launch_graph(&self, g: &RawGraph) -> Result<()> {
        self.bind()?;
        // SAFETY: the exec is valid (instantiated before any replay).
        unsafe { result::graph::launch(g.exec, self.stream.cu_stream()) }.map_err(driver_err("cuGraphLaunch"))
    }

    pub(crate) fn destroy_graph(&self, g: &mut RawGraph) {
        let _ = self.bind();
        // SAFETY: each handle is destroyed once and nulled.
        unsafe {
            if !g.exec.is_null() {
                let _ = result::graph::exec_destroy(g.exec);
                g.exec = std::ptr::null_mut();
            }
            if !g.graph.is_null() {
                let _ = result::graph::destroy(g.graph);
                g.graph = std::ptr::null_mut();
            }
        }
    }

    /// The graph's nodes with their kinds, kernel names and dependencies.
    pub(crate) fn nodes(&self, g: &RawGraph) -> Result<Vec<GraphNode>> {
        self.bind()?;
        let mut count = 0usize;
        // SAFETY: first call sizes, second fills a buffer of that size.
        unsafe { check("cuGraphGetNodes", sys::cuGraphGetNodes(g.graph, std::ptr::null_mut(), &mut count))? };
        let mut nodes = vec![std::ptr::null_mut(); count];
        unsafe { check("cuGraphGetNodes", sys::cuGraphGetNodes(g.graph, nodes.as_mut_ptr(), &mut count))? };
        let index: HashMap<usize, usize> = nodes.iter().enumerate().map(|(i, n)| (*n as usize, i)).collect();
        let mut out = Vec::with_capacity(count);
        for (i, &node) in nodes.iter().enumerate() {
            let mut ty = sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_EMPTY;
            // SAFETY: `node` belongs to `g.graph`.
            unsafe { check("cuGraphNodeGetType", sys::cuGraphNodeGetType(node, &mut ty))? };
            let (kind, kernel) = match ty {
                sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_KERNEL => {
                    // SAFETY: a kernel node's params; we only read the function handle.
                    let mut p: sys::CUDA_KERNEL_NODE_PARAMS = unsafe { std::mem::zeroed() };
                    let name = unsafe {
                        check("cuGraphKernelNodeGetParams", sys::cuGraphKernelNodeGetParams_v2(node, &mut p))?;
                        let mut cname: *const std::ffi::c_char = std::ptr::null();
                        if sys::cuFuncGetName(&mut cname, p.func) == sys::CUresult::CUDA_SUCCESS && !cname.is_null() {
                            CStr::from_ptr(cname).to_string_lossy().into_owned()
                        } else {
                            "?".into()
                        }
                    };
                    (NodeKind::Kernel, Some(name))
                }
                sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_MEMCPY => (NodeKind::Memcpy, None),
                sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_MEMSET => (NodeKind::Memset, None),
                sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_EMPTY => (NodeKind::Empty, None),
                sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_MEM_ALLOC => (NodeKind::MemAlloc, None),
                sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_MEM_FREE => (NodeKind::MemFree, None),
                _ => (NodeKind::Other, None),
            };
            let mut ndeps = 0usize;
            // SAFETY: sizing call, then a fill into buffers of that size (skipped when empty:
            // the driver rejects a non-null buffer with a zero count).
            unsafe {
                check(
                    "cuGraphNodeGetDependencies",
                    sys::cuGraphNodeGetDependencies_v2(node, std::ptr::null_mut(), std::ptr::null_mut(), &mut ndeps),
                )?
            };
            let mut deps = vec![std::ptr::null_mut(); ndeps];
            if ndeps > 0 {
                let mut edges: Vec<sys::CUgraphEdgeData> = vec![unsafe { std::mem::zeroed() }; ndeps];
                unsafe {
                    check(
                        "cuGraphNodeGetDependencies",
                        sys::cuGraphNodeGetDependencies_v2(node, deps.as_mut_ptr(), edges.as_mut_ptr(), &mut ndeps),
                    )?
                };
            }
            let dependencies = deps.iter().filter_map(|d| index.get(&(*d as usize)).copied()).collect();
            out.push(GraphNode { index: i, kind, kernel, dependencies });
        }
        Ok(out)
    }

    /// Writes CUDA's own DOT dump of the graph to `path`.
    pub(crate) fn debug_dot(&self, g: &RawGraph, path: &std::path::Path) -> Result<()> {
        let c = std::ffi::CString::new(path.to_string_lossy().as_bytes())
            .map_err(|_| Error::invalid("debug_dump", "path contains a NUL byte"))?;
        // SAFETY: valid graph and NUL-terminated path.
        unsafe { check("cuGraphDebugDotPrint", sys::cuGraphDebugDotPrint(g.graph, c.as_ptr(), 1)) }
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
        let _ = self.synchronize();
        // SAFETY: created in `new`, destroyed once.
        unsafe {
            let _ = cublas_result::destroy_handle(self.cublas);
        }
        self.free(self.cublas_workspace);
    }
}

fn cublas_check(call: &'static str, s: cublas_sys::cublasStatus_t) -> Result<()> {
    if s == cublas_sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
        Ok(())
    } else {
        Err(Error::Cuda { call, message: format!("{s:?}") })
    }
}

/// A captured CUDA graph and, once instantiated, its executable.
#[derive(Debug)]
pub(crate) struct RawGraph {
    graph: sys::CUgraph,
    exec: sys::CUgraphExec,
}

// SAFETY: graph handles are plain driver handles; `Graph` serialises access through `&mut`.
unsafe impl Send for RawGraph {}
// SAFETY: as above.
unsafe impl Sync for RawGraph {}

impl RawGraph {
    pub(crate) fn is_instantiated(&self) -> bool {
        !self.exec.is_null()
    }
}

/// The `extern "C" __global__` kernel names in a CUDA source.
fn kernel_names(src: &str) -> Vec<String> {
    src.split("extern \"C\" __global__ void ")
        .skip(1)
        .filter_map(|rest| rest.split('(').next().map(|n| n.trim().to_string()))
        .collect()
}
