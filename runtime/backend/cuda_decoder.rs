//! The one-kernel decoding step of `ops::DecoderStep` on CUDA (`kernels/decoder.cu`): compiled
//! by NVRTC per model shape (its sizes are compile-time constants there) the first time a step
//! of that shape is made (`DecoderStep::new`, outside any capture), cached on the backend, and launched cooperatively with one block a
//! multiprocessor.

use cudarc::driver::{sys, CudaFunction};
use cudarc::nvrtc::{compile_ptx_with_opts, CompileOptions, Ptx};

use super::cuda::{active_clusters, check, driver_err, CudaBackend, LaunchDims};
use super::kernel_source;
use super::kernels::KArg;
use super::ptx_cache;
use crate::{Error, Result};

/// The sizes `kernels/decoder.cu` is compiled for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct DecoderShape {
    pub(crate) d_model: usize,
    pub(crate) heads: usize,
    pub(crate) hidden: usize,
}

/// Threads of a block (`FD_THREADS`).
const THREADS: u32 = 256;

/// The kernel's build knobs: the dynamic shared memory that holds a stage's weight rows
/// (`FD_WBUF_BYTES`, 112 KiB: more of a stage's weights copied while the grid waits at the
/// barrier before it) and its activation rows (`FD_ABUF_BYTES`, 64 KiB: 64 rows of 512 values;
/// longer rows go in chunks of K; 112 + 64 KiB measured 2% faster than 64 + 96 at batch 64 on
/// the H200 and the same at the other batches, 2026-12-04 call H, and pass the step's tests,
/// 2026-12-05; where a block cannot have them with the kernel's static shared memory, the step
/// runs unfused, as it did where the 64 + 96 KiB did not fit), the n8 tiles a block computes in
/// one pass (`FD_NT`, 2) and attention's passes of keys loaded at once (`FD_APIPE`, 8 at head dim 64, 4 at 128). `GRAPHED_DECODER_WBUF`,
/// `GRAPHED_DECODER_ABUF` (bytes, 0 reads from global memory), `GRAPHED_DECODER_NT` (1 or 2:
/// the sums of a pass's tiles share 48 KB of static shared memory) and
/// `GRAPHED_DECODER_APIPE` (1 to 16) override them, `GRAPHED_DECODER_FUSE_O` the largest
/// batch whose attention stage computes the output projection too (`FD_FUSE_O`, 4; 0 never),
/// and `GRAPHED_DECODER_MT` the 16-row tiles the kernel is built for (`FD_MT`, 4; fewer take
/// at most 16 a tile and compile less code; one tile writes each GEMM stage's share into the
/// code instead of reading it from shared memory), `GRAPHED_DECODER_SMALL=0` leaves out the
/// second build, of one row tile, that batches of at most 16 take beside the main one (see
/// [`CudaBackend::decoder_small_kernel`]), `GRAPHED_DECODER_WPASS` the fewest tasks for which
/// a GEMM stage gives each (tile, row tile) to one warp (`FD_WPASS_MIN`, 3; 0: never; the
/// same sums either way), `GRAPHED_DECODER_CLUSTER` (2 to 16) a grid of one thread-block
/// cluster of that many blocks separated by the cluster's barrier instead of one block a
/// multiprocessor and the grid barrier (`FD_CLUSTER`; the same sums: the GEMMs' order does not
/// depend on the grid; its buffers default to 96 + 20 KiB), and with it
/// `GRAPHED_DECODER_DSMEM=1` the stage outputs pushed into every block's shared memory
/// (`FD_DSMEM`, a mirror of `GRAPHED_DECODER_MIRROR_B` rows, 2 by default), for measurements.
/// `GRAPHED_DECODER_TRACE` (a folder) compiles the stage marks in (`FD_TRACE`), see
/// [`decoder_trace_dir`]; `GRAPHED_DECODER_PTX` (a folder) receives each build's PTX
/// (`decoder-{d_model}x{heads}x{hidden}.ptx`), to read its machine code with `ptxas -v` and
/// `cuobjdump`; `GRAPHED_DECODER_SOURCE` (a file) is compiled in place of `kernels/decoder.cu`, so
/// that one run measures several versions of the kernel with the same binaries (see
/// [`kernel_source::decoder_source`]; `GRAPHED_KERNELS_DIR` does the same for every file).
#[derive(Clone, Copy, Debug)]
struct Knobs {
    wbuf: u32,
    abuf: u32,
    nt: u32,
    apipe: Option<u32>,
    fuse_o: Option<u32>,
    mt: u32,
    wpass: Option<u32>,
    cluster: Option<u32>,
    /// Rows of the distributed-shared-memory mirror (`FD_DSMEM`, `FD_MIRROR_B`), with a cluster.
    mirror_rows: Option<u32>,
    trace: bool,
    /// Batches of at most 16 take a second build of one row tile (the default;
    /// `GRAPHED_DECODER_SMALL=0` leaves it out; see [`CudaBackend::decoder_small_kernel`]).
    small: bool,
}

impl Knobs {
    /// The dynamic shared memory a launch of `shape`'s kernel takes: the two buffers, and the
    /// mirror (`FD_MIRROR_BYTES`: the heads' f32 parts, x, s and q, a row each).
    fn dynamic_shared(self, shape: DecoderShape) -> u32 {
        let DecoderShape { d_model, heads, hidden } = shape;
        let row = heads
            .saturating_mul(d_model)
            .saturating_add(d_model)
            .saturating_mul(4)
            .saturating_add(hidden.saturating_mul(2));
        let mirror = self.mirror_rows.map_or(0, |b| (b as usize).saturating_mul(row));
        let total = (self.wbuf as usize).saturating_add(self.abuf as usize).saturating_add(mirror);
        u32::try_from(total).unwrap_or(u32::MAX)
    }

    /// NVRTC's options for `shape`'s kernel with these knobs on a GPU of compute capability
    /// `arch`.
    fn nvrtc_options(self, shape: DecoderShape, (major, minor): (i32, i32)) -> Vec<String> {
        let mut options = vec![
            format!("--gpu-architecture=sm_{major}{minor}"),
            "-std=c++17".into(),
            format!("-DFD_D={}", shape.d_model),
            format!("-DFD_HEADS={}", shape.heads),
            format!("-DFD_HID={}", shape.hidden),
            format!("-DFD_WBUF_BYTES={}", self.wbuf),
            format!("-DFD_ABUF_BYTES={}", self.abuf),
            format!("-DFD_NT={}", self.nt),
            format!("-DFD_MT={}", self.mt),
        ];
        let optional = [
            ("FD_APIPE", self.apipe),
            ("FD_FUSE_O", self.fuse_o),
            ("FD_WPASS_MIN", self.wpass),
            ("FD_CLUSTER", self.cluster),
        ];
        options.extend(optional.iter().filter_map(|(name, v)| v.map(|v| format!("-D{name}={v}"))));
        if let Some(b) = self.mirror_rows {
            options.push("-DFD_DSMEM=1".into());
            options.push(format!("-DFD_MIRROR_B={b}"));
        }
        if self.trace {
            options.push("-DFD_TRACE".into());
        }
        options
    }

    fn get() -> Knobs {
        static K: std::sync::OnceLock<Knobs> = std::sync::OnceLock::new();
        *K.get_or_init(|| {
            Knobs::from_settings(
                |name| std::env::var(name).ok().and_then(|v| v.parse::<u32>().ok()),
                decoder_trace_dir().is_some(),
            )
        })
    }

    /// The knobs the settings `env` gives (see [`Knobs`]), the stage marks compiled in or not.
    fn from_settings(env: impl Fn(&str) -> Option<u32>, trace: bool) -> Knobs {
        let cluster = env("GRAPHED_DECODER_CLUSTER").filter(|n| (2..=16).contains(n));
        // A cluster's blocks hold more of each stage and leave room for the mirror; 20 KiB of
        // activations still take the first stage's 16 rows of 512 whole (the embeddings are
        // summed as they are staged: no stage of their own).
        let (wbuf, abuf) = if cluster.is_some() { (96 * 1024, 20 * 1024) } else { (112 * 1024, 64 * 1024) };
        let mirror_rows = cluster
            .and(env("GRAPHED_DECODER_DSMEM").filter(|&v| v == 1))
            .map(|_| env("GRAPHED_DECODER_MIRROR_B").map_or(2, |b| b.clamp(1, 64)));
        Knobs {
            wbuf: env("GRAPHED_DECODER_WBUF").map_or(wbuf, |b| b / 16 * 16),
            abuf: env("GRAPHED_DECODER_ABUF").map_or(abuf, |b| b / 16 * 16),
            nt: env("GRAPHED_DECODER_NT").map_or(2, |n| n.clamp(1, 2)),
            apipe: env("GRAPHED_DECODER_APIPE").map(|n| n.clamp(1, 16)),
            fuse_o: env("GRAPHED_DECODER_FUSE_O").map(|n| n.min(64)),
            mt: env("GRAPHED_DECODER_MT").map_or(4, |n| n.clamp(1, 4)),
            wpass: env("GRAPHED_DECODER_WPASS"),
            cluster,
            mirror_rows,
            trace,
            small: env("GRAPHED_DECODER_SMALL") != Some(0),
        }
    }
}

/// The one-kernel step's program: core.cu, ops.cu and half.cu (the helpers decoder.cu builds
/// on), then `source` (decoder.cu or what replaces it).
fn decoder_program(source: &str) -> Result<String> {
    let mut src = kernel_source::main_sources()?[..kernel_source::DECODER_BASE].to_vec();
    src.push(source);
    Ok(src.join("\n"))
}

/// NVRTC's PTX of the step's kernel for `shape` with `knobs` on a GPU of compute capability
/// `arch`, through the PTX cache (`GRAPHED_CACHE_DIR`); `GRAPHED_DECODER_PTX` (a folder) gets a
/// copy. Needs no CUDA context, so a second build compiles on another thread.
fn decoder_ptx(shape: DecoderShape, knobs: Knobs, arch: (i32, i32)) -> Result<Ptx> {
    let src = decoder_program(kernel_source::decoder_source()?)?;
    let options = knobs.nvrtc_options(shape, arch);
    let compile = || compile_ptx_with_opts(&src, CompileOptions { options: options.clone(), ..Default::default() });
    let ptx = ptx_cache::compile_cached(&src, &options, compile).map_err(|e| Error::cuda("nvrtcCompileProgram", e))?;
    if let Some(dir) = std::env::var_os("GRAPHED_DECODER_PTX").filter(|v| !v.is_empty()) {
        // For measurements (`ptxas -v`, `cuobjdump --dump-sass`): where the folder cannot be
        // written the kernel still runs, so the failure is only reported.
        let DecoderShape { d_model, heads, hidden } = shape;
        let tiles = if knobs.mt == 4 { String::new() } else { format!("-mt{}", knobs.mt) };
        let file = std::path::Path::new(&dir).join(format!("decoder-{d_model}x{heads}x{hidden}{tiles}.ptx"));
        if let Err(e) = std::fs::write(&file, ptx.to_src()) {
            eprintln!("GRAPHED_DECODER_PTX: could not write {}: {e}", file.display());
        }
    }
    Ok(ptx)
}

/// Settings by name, as `Knobs::from_settings` reads them.
#[cfg(test)]
type Settings = &'static [(&'static str, u32)];

/// A decoder program: its name, source, NVRTC options and launch's dynamic shared memory.
#[cfg(test)]
pub(crate) type DecoderProgram = (String, String, Vec<String>, u32);

/// The decoder's programs for checks without a GPU (see `programs.rs`): the GPT's shape with
/// the default knobs, with one row tile (the second build, for batches of at most 16), the stage
/// marks, one cluster of 16 and the cluster with its mirror; each
/// with its options on a GPU of compute capability `arch` and the dynamic shared memory it
/// launches with.
#[cfg(test)]
pub(crate) fn decoder_programs(arch: (i32, i32)) -> Result<Vec<DecoderProgram>> {
    let shape = DecoderShape { d_model: 512, heads: 8, hidden: 1368 };
    let src = decoder_program(kernel_source::decoder_source()?)?;
    let variants: [(&str, Settings, bool); 5] = [
        ("decoder", &[], false),
        ("decoder-mt1", &[("GRAPHED_DECODER_MT", 1)], false),
        ("decoder-trace", &[], true),
        ("decoder-cluster16", &[("GRAPHED_DECODER_CLUSTER", 16)], false),
        ("decoder-dsmem16", &[("GRAPHED_DECODER_CLUSTER", 16), ("GRAPHED_DECODER_DSMEM", 1)], false),
    ];
    Ok(variants
        .iter()
        .map(|(name, settings, trace)| {
            let knobs = Knobs::from_settings(|n| settings.iter().find(|(k, _)| *k == n).map(|(_, v)| *v), *trace);
            (name.to_string(), src.clone(), knobs.nvrtc_options(shape, arch), knobs.dynamic_shared(shape))
        })
        .collect())
}

/// Where `GRAPHED_DECODER_TRACE` asks the one-kernel step to write its stage marks, for
/// measurements: every eager step (not one a graph captures) then waits for its kernel and
/// writes `decoder-trace-b{batch}.bin` there (see `DecoderStep`'s trace; `bench/decoder_trace.py`
/// reads it). `None` (the default) compiles no marks in. `DecoderStep::new` refuses a path that
/// is not a folder before it builds anything.
pub(crate) fn decoder_trace_dir() -> Option<&'static std::path::Path> {
    static DIR: std::sync::OnceLock<Option<std::path::PathBuf>> = std::sync::OnceLock::new();
    DIR.get_or_init(|| std::env::var_os("GRAPHED_DECODER_TRACE").filter(|v| !v.is_empty()).map(Into::into)).as_deref()
}

/// The stage marks' layout (`FD_TRACE_STAGES` x `FD_TRACE_SLOTS` 64-bit words a block, as
/// `kernels/decoder.cu` defines them).
pub(crate) const TRACE_STAGES: usize = 64;
pub(crate) const TRACE_SLOTS: usize = 6;

/// The most sequences the kernel as built takes (16 a row tile; 64 unless
/// `GRAPHED_DECODER_MT` says fewer tiles).
pub(crate) fn decoder_max_batch() -> usize {
    ROW_TILE * Knobs::get().mt as usize
}

/// Sequences a row tile of the kernel holds (`FD_MT` tiles of 16 rows); the batches the
/// one-row-tile build takes (see [`DecoderKernels::for_batch`]).
const ROW_TILE: usize = 16;

/// The step's kernel builds and the grid they run on (see [`CudaBackend::decoder_kernel`]).
#[derive(Clone, Debug)]
pub(crate) struct DecoderKernels {
    /// The main build, for every batch up to [`decoder_max_batch`].
    pub(crate) main: CudaFunction,
    /// The build of one row tile for batches of at most 16 (`None` with
    /// `GRAPHED_DECODER_SMALL=0`).
    small: Option<CudaFunction>,
    /// Blocks of a launch.
    pub(crate) grid: u32,
}

impl DecoderKernels {
    /// The build that runs a step of `batch` sequences.
    pub(crate) fn for_batch(&self, batch: usize) -> &CudaFunction {
        self.small.as_ref().filter(|_| batch <= ROW_TILE).unwrap_or(&self.main)
    }
}

impl CudaBackend {
    /// The step's kernel for `shape` (and, unless `GRAPHED_DECODER_SMALL=0`, its build for small
    /// batches, see [`CudaBackend::decoder_small_kernel`]), and the grid it runs on: one block
    /// a multiprocessor (the most that are resident at once with one a multiprocessor, which
    /// the cooperative launch requires). `None` where the kernel cannot run: a GPU older than
    /// sm_80 (`mma.sync` on bf16) or a block that does not fit on a multiprocessor.
    pub(crate) fn decoder_kernel(&self, shape: DecoderShape) -> Result<Option<DecoderKernels>> {
        let knobs = Knobs::get();
        // mma.sync on bf16 needs sm_80; a cluster (barrier.cluster) sm_90, and at most one
        // block a multiprocessor.
        let cluster_fits = knobs.cluster.is_none_or(|n| self.capability.0 >= 9 && n as usize <= self.sm_count);
        if self.capability.0 < 8 || !cluster_fits {
            return Ok(None);
        }
        // The second build's PTX compiles on another thread while this one compiles and loads
        // the main build (NVRTC needs no context; each takes seconds).
        let small_knobs = Knobs { mt: 1, ..knobs };
        let want_small = knobs.small && knobs.mt != 1 && knobs.cluster.is_none();
        let arch = self.capability;
        let (main, small_ptx) = std::thread::scope(|scope| {
            let pre = (want_small && !self.decoder_cached(shape, small_knobs))
                .then(|| scope.spawn(move || decoder_ptx(shape, small_knobs, arch)));
            let main = self.decoder_build(shape, knobs, None);
            let small_ptx = pre.map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)));
            (main, small_ptx)
        });
        let Some(f) = main? else {
            return Ok(None);
        };
        if let Some(n) = knobs.cluster {
            // A cluster's blocks must be resident together on one GPU processing cluster: the
            // cluster query says whether one such cluster fits (its shape is compiled in).
            self.bind()?;
            let shared = knobs.dynamic_shared(shape);
            let (r, clusters) = active_clusters(&f, n, THREADS, shared, std::ptr::null_mut(), None);
            if r != sys::CUresult::CUDA_SUCCESS || clusters < 1 {
                return Ok(None);
            }
            return Ok(Some(DecoderKernels { main: f, small: None, grid: n }));
        }
        if !self.fits_a_multiprocessor(&f, shape, knobs)? {
            return Ok(None);
        }
        let small =
            if want_small { self.decoder_small_kernel(shape, small_knobs, small_ptx.transpose()?)? } else { None };
        Ok(Some(DecoderKernels { main: f, small, grid: self.sm_count as u32 }))
    }

    /// The second build of the step's kernel, for batches of at most 16 (one row tile, `FD_MT`
    /// 1: every GEMM stage is one group of the grid, its share folded into the code, and less
    /// code), built with `small` (the main build's knobs with one row tile), launched on the same
    /// grid as the main build with the same arguments and the same sums; `ptx` is its NVRTC
    /// output where it was compiled beside the main build. `None` where
    /// the build does not run here. The caller checked the GPU, that the grid is not a
    /// cluster's and that the main build has more than one row tile. Measured (H100, session
    /// 26): 4% to 7% less a token at batches 1 to 16, the same at 32 and 64, where the main
    /// build runs (`docs/BENCHMARKS.md`); `GRAPHED_DECODER_SMALL=0` leaves it out.
    fn decoder_small_kernel(
        &self,
        shape: DecoderShape,
        small: Knobs,
        ptx: Option<Ptx>,
    ) -> Result<Option<CudaFunction>> {
        match self.decoder_build(shape, small, ptx)? {
            Some(f) if self.fits_a_multiprocessor(&f, shape, small)? => Ok(Some(f)),
            _ => Ok(None),
        }
    }

    /// Whether one block of `f` (built with `knobs`) is resident on a multiprocessor.
    fn fits_a_multiprocessor(&self, f: &CudaFunction, shape: DecoderShape, knobs: Knobs) -> Result<bool> {
        self.bind()?;
        let mut per_sm = 0i32;
        // SAFETY: `f` is a function loaded on this context, which is bound; the out-pointer is
        // a live local.
        let r = unsafe {
            sys::cuOccupancyMaxActiveBlocksPerMultiprocessor(
                &mut per_sm,
                f.cu_function(),
                THREADS as i32,
                knobs.dynamic_shared(shape) as usize,
            )
        };
        check("cuOccupancyMaxActiveBlocksPerMultiprocessor", r)?;
        Ok(per_sm >= 1)
    }

    /// Whether the build of `shape` with `knobs` is compiled and loaded already.
    fn decoder_cached(&self, shape: DecoderShape, knobs: Knobs) -> bool {
        let cache = self.decoder_fn.lock().unwrap_or_else(|e| e.into_inner());
        cache.iter().any(|(s, mt, _)| *s == shape && *mt == knobs.mt)
    }

    /// The step's kernel for `shape` built with `knobs` (compiled once per shape and row tiles,
    /// then cached; `ptx`, where given, is that build's NVRTC output, compiled on another
    /// thread); `None` where the build cannot run here (its shared memory).
    fn decoder_build(&self, shape: DecoderShape, knobs: Knobs, ptx: Option<Ptx>) -> Result<Option<CudaFunction>> {
        if knobs.dynamic_shared(shape) as usize > self.max_shared_optin {
            return Ok(None);
        }
        let mut cache = self.decoder_fn.lock().unwrap_or_else(|e| e.into_inner());
        let f = match cache.iter().find(|(s, mt, _)| *s == shape && *mt == knobs.mt) {
            Some((_, _, f)) => f.clone(),
            None => {
                self.bind()?;
                let ptx = match ptx {
                    Some(ptx) => ptx,
                    None => decoder_ptx(shape, knobs, self.capability)?,
                };
                let module = self.ctx.load_module(ptx).map_err(driver_err("cuModuleLoadData"))?;
                let f = module.load_function("decoder_step_bf16").map_err(driver_err("cuModuleGetFunction"))?;
                // Refused where the buffers and the static shared memory together exceed what
                // a block may have: the kernel does not run on this GPU.
                let attr = sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES;
                if f.set_attribute(attr, knobs.dynamic_shared(shape) as i32).is_err() {
                    return Ok(None);
                }
                // Clusters above 8 blocks need the driver's leave (sm_90 on); refused, the
                // kernel does not run here.
                let non_portable = sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED;
                if knobs.cluster.is_some_and(|n| n > 8) && f.set_attribute(non_portable, 1).is_err() {
                    return Ok(None);
                }
                cache.push((shape, knobs.mt, f.clone()));
                f
            }
        };
        Ok(Some(f))
    }

    /// Launches the step's kernel `f` on `grid` blocks (see [`CudaBackend::decoder_kernel`]):
    /// cooperatively, unless `GRAPHED_DECODER_COOPERATIVE=0` asks for a plain launch (the grid
    /// is one block a multiprocessor and one fits, so the blocks are resident together unless
    /// other work holds multiprocessors for good).
    pub(crate) fn launch_decoder(&self, f: &CudaFunction, shape: DecoderShape, grid: u32, args: &[KArg]) -> Result<()> {
        static PLAIN: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        // A cluster's blocks are resident together by construction (a plain launch; its
        // shape is compiled in).
        let plain = Knobs::get().cluster.is_some()
            || *PLAIN.get_or_init(|| std::env::var("GRAPHED_DECODER_COOPERATIVE").is_ok_and(|v| v == "0"));
        let dims =
            LaunchDims { grid: (grid, 1, 1), block: (THREADS, 1, 1), shared: Knobs::get().dynamic_shared(shape) };
        if plain {
            self.launch_function(f, dims, args)
        } else {
            self.launch_cooperative(f, dims, args)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn knobs(mirror_rows: Option<u32>) -> Knobs {
        Knobs {
            wbuf: 96 * 1024,
            abuf: 16 * 1024,
            nt: 2,
            apipe: None,
            fuse_o: None,
            mt: 4,
            wpass: None,
            cluster: mirror_rows.map(|_| 16),
            mirror_rows,
            trace: false,
            small: false,
        }
    }

    /// The second build is the default and `GRAPHED_DECODER_SMALL=0` leaves it out; the main
    /// build's row tiles and buffers are the settings' either way, and the second build's
    /// options differ from the main one's in its row tiles only.
    #[test]
    fn the_small_build_is_the_main_one_with_one_row_tile() {
        let env =
            |pairs: &'static [(&'static str, u32)]| move |n: &str| pairs.iter().find(|(k, _)| *k == n).map(|(_, v)| *v);
        let main = Knobs::from_settings(env(&[]), false);
        assert!(main.small && main.mt == 4);
        assert!(Knobs::from_settings(env(&[("GRAPHED_DECODER_SMALL", 1)]), false).small);
        assert!(!Knobs::from_settings(env(&[("GRAPHED_DECODER_SMALL", 0)]), false).small);
        let shape = DecoderShape { d_model: 512, heads: 8, hidden: 1368 };
        let (a, b) = (main.nvrtc_options(shape, (9, 0)), Knobs { mt: 1, ..main }.nvrtc_options(shape, (9, 0)));
        let differ: Vec<(&String, &String)> = a.iter().zip(&b).filter(|(x, y)| x != y).collect();
        assert_eq!(differ, [(&"-DFD_MT=4".to_string(), &"-DFD_MT=1".to_string())]);
        assert_eq!(main.dynamic_shared(shape), Knobs { mt: 1, ..main }.dynamic_shared(shape));
    }

    /// The launch's dynamic shared memory is the two buffers plus, with the mirror, what
    /// kernels/decoder.cu's FD_MIRROR_BYTES reserves: FD_MIRROR_B rows of the heads' f32 parts,
    /// x and q (bf16, d_model each) and s (bf16, the hidden width).
    #[test]
    fn the_mirror_adds_its_rows_to_the_buffers() {
        let gpt = DecoderShape { d_model: 512, heads: 8, hidden: 1368 };
        assert_eq!(knobs(None).dynamic_shared(gpt), 112 * 1024);
        let row = 8 * 512 * 4 + 512 * 2 * 2 + 1368 * 2;
        assert_eq!(knobs(Some(2)).dynamic_shared(gpt) as usize, 112 * 1024 + 2 * row);
        // Absurd sizes saturate instead of wrapping (the driver then refuses the launch).
        let huge = DecoderShape { d_model: usize::MAX / 8, heads: 8, hidden: 8 };
        assert_eq!(knobs(Some(64)).dynamic_shared(huge), u32::MAX);
    }
}
