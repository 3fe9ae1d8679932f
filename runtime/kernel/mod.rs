//! Custom kernels: your own CUDA C, with a host implementation so both backends run it.

pub(crate) mod check;
pub(crate) mod host;

use std::cell::RefCell;
use std::collections::HashSet;

use std::sync::{Arc, Mutex, Weak};

use cudarc::driver::CudaFunction;

use crate::backend::{Backend, HostBackend, HostPtr, KArg, LaunchDims};
pub use crate::error::Arg;
use crate::error::KernelError;
use crate::ops::{exec, Exec};
use crate::{DType, Device, Error, Result, Tensor};
use host::{run_host, HostArgs, HostFn, HostSlot};

/// One argument of a [`Kernel::launch`], in the order of the kernel's parameters.
///
/// ```
/// use graphed::{Arg, KernelArg};
/// assert_eq!(KernelArg::from(2u32).kind(), Arg::U32);
/// assert_eq!(KernelArg::from(0.5f32).kind(), Arg::F32);
/// ```
#[derive(Clone, Copy, Debug)]
pub enum KernelArg<'a> {
    /// A tensor the kernel reads ([`Arg::TensorIn`]).
    In(&'a Tensor),
    /// A tensor the kernel writes ([`Arg::TensorOut`]).
    Out(&'a Tensor),
    /// A tensor the kernel reads and writes ([`Arg::TensorInOut`]).
    InOut(&'a Tensor),
    /// A `float` ([`Arg::F32`]).
    F32(f32),
    /// An `unsigned int` ([`Arg::U32`]).
    U32(u32),
    /// An `int` ([`Arg::I32`]).
    I32(i32),
}

impl KernelArg<'_> {
    /// The kind this argument is, to compare with the declared [`Arg`].
    pub fn kind(&self) -> Arg {
        match self {
            KernelArg::In(_) => Arg::TensorIn,
            KernelArg::Out(_) => Arg::TensorOut,
            KernelArg::InOut(_) => Arg::TensorInOut,
            KernelArg::F32(_) => Arg::F32,
            KernelArg::U32(_) => Arg::U32,
            KernelArg::I32(_) => Arg::I32,
        }
    }

    fn tensor(&self) -> Option<&Tensor> {
        match *self {
            KernelArg::In(t) | KernelArg::Out(t) | KernelArg::InOut(t) => Some(t),
            _ => None,
        }
    }
}

impl From<f32> for KernelArg<'_> {
    fn from(v: f32) -> Self {
        KernelArg::F32(v)
    }
}

impl From<u32> for KernelArg<'_> {
    fn from(v: u32) -> Self {
        KernelArg::U32(v)
    }
}

impl From<i32> for KernelArg<'_> {
    fn from(v: i32) -> Self {
        KernelArg::I32(v)
    }
}

/// Grid, block and dynamic shared memory of one launch (CUDA's `<<<grid, block, shared>>>`).
///
/// ```
/// use graphed::LaunchConfig;
/// let cfg = LaunchConfig::for_elements(1000);
/// assert_eq!((cfg.grid, cfg.block), ((4, 1, 1), (256, 1, 1)));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LaunchConfig {
    /// Blocks in x, y, z.
    pub grid: (u32, u32, u32),
    /// Threads per block in x, y, z.
    pub block: (u32, u32, u32),
    /// Bytes of dynamic shared memory per block.
    pub shared_mem_bytes: u32,
}

impl LaunchConfig {
    /// One thread per element in blocks of 256 (at least one block).
    pub fn for_elements(n: usize) -> LaunchConfig {
        let blocks = n.div_ceil(256).clamp(1, u32::MAX as usize) as u32;
        LaunchConfig { grid: (blocks, 1, 1), block: (256, 1, 1), shared_mem_bytes: 0 }
    }

    /// A one-dimensional grid of `blocks` blocks of `threads` threads.
    pub fn new(blocks: u32, threads: u32) -> LaunchConfig {
        LaunchConfig { grid: (blocks, 1, 1), block: (threads, 1, 1), shared_mem_bytes: 0 }
    }

    fn check(&self, kernel: &str) -> Result<()> {
        let (g, b) = (self.grid, self.block);
        if [g.0, g.1, g.2, b.0, b.1, b.2].contains(&0) {
            return Err(KernelError::ZeroLaunchDim { kernel: kernel.to_string(), grid: g, block: b }.into());
        }
        Ok(())
    }
}

struct Prepared {
    backend: Weak<Backend>,
    function: Option<CudaFunction>,
}

struct KernelInner {
    entry: &'static str,
    source: String,
    signature: Vec<Arg>,
    host: Arc<HostFn>,
    prepared: Mutex<Vec<Prepared>>,
}

/// A user kernel: CUDA C source, its entry point, its signature and a host implementation.
///
/// Cloning is cheap and shares the per-device compilation cache. A kernel is usually built once
/// (a field of the module, or a `LazyLock` static) and launched from `forward`/`backward`.
///
/// It is declared from CUDA C source, the name of its `extern "C" __global__`
/// entry, a signature (one [`Arg`] per kernel parameter) and a host implementation over
/// slices. [`Kernel::launch`] runs it like a built-in op, eagerly or inside a capture, inside
/// `#[graphed]` forward and backward:
///
/// - On a GPU the source is compiled by NVRTC for the device's architecture the first time the
///   kernel is used on that device (or at [`Kernel::compile`]) and cached per device. Compiling
///   is never done inside a capture: a first use while the device captures is
///   [`KernelError::NotCompiled`] (warm up first; `make_graphed`'s warm-up does).
/// - On the host backend the host implementation is run, or recorded during a capture and run
///   on every replay, exactly like the built-in ops; it sees copies of the tensors and its
///   outputs are written back only when it returns `Ok`, so a failing or panicking host
///   implementation leaves them unchanged. The same warm-up rule applies, so a program that
///   forgets to warm up fails on the host as it would on a GPU.
///
/// Every launch checks its arguments against the signature first (count, kinds, dtype, one
/// device, no stale handle) and fails with a typed error naming the kernel and the position.
///
/// ```
/// use graphed::{Arg, Device, Kernel, KernelArg, LaunchConfig, Tensor};
/// const SRC: &str = r#"
/// extern "C" __global__ void axpb(float* y, const float* x, float a, float b, unsigned n) {
///     unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
///     if (i < n) y[i] = a * x[i] + b;
/// }"#;
/// let axpb = Kernel::new("axpb", SRC, &[Arg::TensorOut, Arg::TensorIn, Arg::F32, Arg::F32, Arg::U32], |args| {
///     let (x, (a, b)) = (args.input(1)?, (args.f32(2)?, args.f32(3)?));
///     for (y, x) in args.output(0)?.iter_mut().zip(x.iter()) {
///         *y = a * x + b;
///     }
///     Ok(())
/// })?;
/// let dev = Device::default_device();
/// let x = Tensor::from_slice(&dev, &[1.0, 2.0, 3.0], &[3])?;
/// let y = Tensor::zeros(&dev, &[3])?;
/// use KernelArg::*;
/// axpb.launch(LaunchConfig::for_elements(3), &[Out(&y), In(&x), F32(2.0), F32(0.5), U32(3)])?;
/// assert_eq!(y.to_vec()?, vec![2.5, 4.5, 6.5]);
/// # Ok::<(), graphed::Error>(())
/// ```
#[derive(Clone)]
pub struct Kernel(Arc<KernelInner>);

impl std::fmt::Debug for Kernel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Kernel({}, {:?})", self.0.entry, self.0.signature)
    }
}

/// Interns a kernel name: the host backend labels recorded ops with `&'static str`. Each
/// distinct name is stored once, however many kernels use it.
fn intern(name: &str) -> &'static str {
    static NAMES: Mutex<Option<HashSet<&'static str>>> = Mutex::new(None);
    let mut names = NAMES.lock().unwrap_or_else(|e| e.into_inner());
    let set = names.get_or_insert_with(HashSet::new);
    if let Some(n) = set.get(name) {
        return n;
    }
    let leaked: &'static str = Box::leak(name.to_string().into_boxed_str());
    set.insert(leaked);
    leaked
}

impl Kernel {
    /// Declares a kernel. `entry` is the `extern "C" __global__` function in `source`;
    /// `signature` lists its parameters in order (at least one tensor); `host` computes the
    /// same thing on the host backend. Nothing is compiled yet.
    ///
    /// [`KernelError::EntryNotIdentifier`] when `entry` is not a C identifier,
    /// [`KernelError::SourceHasNul`], [`KernelError::EntryNotInSource`] when the source does
    /// not mention it, [`KernelError::NoTensorArg`] when the signature has no tensor.
    pub fn new(
        entry: &str,
        source: &str,
        signature: &[Arg],
        host: impl Fn(&HostArgs) -> Result<()> + Send + Sync + 'static,
    ) -> Result<Kernel> {
        let kernel = entry.to_string();
        let ident = entry.chars().next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && entry.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !ident {
            return Err(KernelError::EntryNotIdentifier { kernel }.into());
        }
        if source.contains('\0') {
            return Err(KernelError::SourceHasNul { kernel }.into());
        }
        if !mentions_identifier(source, entry) {
            return Err(KernelError::EntryNotInSource { kernel }.into());
        }
        if !signature.iter().any(|a| a.is_tensor()) {
            return Err(KernelError::NoTensorArg { kernel }.into());
        }
        Ok(Kernel(Arc::new(KernelInner {
            entry: intern(entry),
            source: source.to_string(),
            signature: signature.to_vec(),
            host: Arc::new(host),
            prepared: Mutex::new(Vec::new()),
        })))
    }

    /// The entry name.
    pub fn name(&self) -> &str {
        self.0.entry
    }

    pub(crate) fn interned_name(&self) -> &'static str {
        self.0.entry
    }

    /// The declared signature.
    pub fn signature(&self) -> &[Arg] {
        &self.0.signature
    }

    /// The CUDA C source.
    pub fn source(&self) -> &str {
        &self.0.source
    }

    /// Whether the kernel is ready on `device` (compiled there, or warmed up on the host).
    pub fn is_compiled(&self, device: &Device) -> bool {
        self.lookup(device, |_| ()).is_some()
    }

    /// Compiles the kernel for `device` now (NVRTC for its architecture, then a module load)
    /// and caches it; a no-op when already done. On the host backend it only marks the kernel
    /// warmed up. [`KernelError::NotCompiled`] while `device` captures, [`KernelError::Compile`]
    /// with NVRTC's log when the source does not compile.
    ///
    /// ```
    /// # use graphed::{Arg, Device, Kernel};
    /// let k = Kernel::new("noop", "extern \"C\" __global__ void noop(float* y) {}", &[Arg::TensorOut], |_| Ok(()))?;
    /// let dev = Device::default_device();
    /// k.compile(&dev)?;
    /// assert!(k.is_compiled(&dev));
    /// # Ok::<(), graphed::Error>(())
    /// ```
    pub fn compile(&self, device: &Device) -> Result<()> {
        if self.is_compiled(device) {
            return Ok(());
        }
        if device.is_capturing() {
            return Err(KernelError::NotCompiled { kernel: self.0.entry.to_string(), device: device.name() }.into());
        }
        let function = match device.backend().cuda() {
            None => None,
            Some(c) => Some(c.compile_user_kernel(self.0.entry, &self.0.source, &device.name())?),
        };
        let mut prepared = self.0.prepared.lock().unwrap_or_else(|e| e.into_inner());
        prepared.retain(|p| p.backend.strong_count() > 0);
        prepared.push(Prepared { backend: Arc::downgrade(device.backend()), function });
        Ok(())
    }

    /// Runs `f` on the cached state for `device`, if any.
    fn lookup<R>(&self, device: &Device, f: impl FnOnce(Option<&CudaFunction>) -> R) -> Option<R> {
        let prepared = self.0.prepared.lock().unwrap_or_else(|e| e.into_inner());
        let target = Arc::as_ptr(device.backend());
        // A dead entry may share the address of a newer backend: only live ones count.
        prepared
            .iter()
            .find(|p| std::ptr::eq(p.backend.as_ptr(), target) && p.backend.strong_count() > 0)
            .map(|p| f(p.function.as_ref()))
    }

    /// Launches the kernel on the device of its tensor arguments: checks every argument
    /// against the signature, compiles on first use (outside captures only), then queues the
    /// kernel (or runs/records the host implementation). Capturable once compiled.
    ///
    /// Errors, all before anything runs: [`KernelError::ArgCount`], [`KernelError::ArgKind`],
    /// [`KernelError::DeviceMismatch`], [`Error::DType`], [`Error::StaleTensor`],
    /// [`KernelError::ZeroLaunchDim`], [`KernelError::NotCompiled`] for a first use inside a
    /// capture, [`KernelError::Compile`]; on the host backend also the host implementation's
    /// own error (with the kernel's name as [`Error::Context`]) or [`KernelError::HostPanic`].
    ///
    /// ```
    /// use graphed::KernelArg::{In, Out, U32};
    /// use graphed::{Arg, Device, Error, Kernel, KernelError, LaunchConfig, Tensor};
    /// let src = "extern \"C\" __global__ void copy(float* y, const float* x, unsigned n) {
    ///     unsigned i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) y[i] = x[i]; }";
    /// let copy = Kernel::new("copy", src, &[Arg::TensorOut, Arg::TensorIn, Arg::U32], |a| {
    ///     a.output(0)?.copy_from_slice(&a.input(1)?);
    ///     Ok(())
    /// })?;
    /// let dev = Device::default_device();
    /// let (x, y) = (Tensor::full(&dev, &[4], 2.0)?, Tensor::zeros(&dev, &[4])?);
    /// copy.launch(LaunchConfig::for_elements(4), &[Out(&y), In(&x), U32(4)])?;
    /// assert_eq!(y.to_vec()?, vec![2.0; 4]);
    /// let wrong = copy.launch(LaunchConfig::for_elements(4), &[In(&y), In(&x), U32(4)]);
    /// assert!(matches!(wrong, Err(Error::Kernel(KernelError::ArgKind { position: 0, .. }))));
    /// # Ok::<(), graphed::Error>(())
    /// ```
    pub fn launch(&self, config: LaunchConfig, args: &[KernelArg<'_>]) -> Result<()> {
        let device = self.check_args(args)?;
        config.check(self.0.entry)?;
        self.compile(&device)?;
        match exec(&device) {
            Exec::Host(h) => self.record_host(h, config, args),
            Exec::Cuda(c) => {
                let kargs = args
                    .iter()
                    .map(|a| {
                        Ok(match *a {
                            KernelArg::In(t) | KernelArg::Out(t) | KernelArg::InOut(t) => KArg::Ptr(t.cuda_ptr()?),
                            KernelArg::F32(v) => KArg::F32(v),
                            KernelArg::U32(v) => KArg::U32(v),
                            KernelArg::I32(v) => KArg::U32(v as u32),
                        })
                    })
                    .collect::<Result<Vec<_>>>()?;
                let dims = LaunchDims { grid: config.grid, block: config.block, shared: config.shared_mem_bytes };
                let launched = self.lookup(&device, |f| f.map(|f| c.launch_user_kernel(f, dims, &kargs)));
                launched.flatten().unwrap_or_else(|| {
                    Err(KernelError::NotCompiled { kernel: self.0.entry.to_string(), device: device.name() }.into())
                })
            }
        }
    }

    /// Checks count, kinds, dtypes, devices and staleness; the launch's device.
    fn check_args(&self, args: &[KernelArg<'_>]) -> Result<Device> {
        let kernel = || self.0.entry.to_string();
        let sig = &self.0.signature;
        if args.len() != sig.len() {
            return Err(KernelError::ArgCount { kernel: kernel(), expected: sig.len(), got: args.len() }.into());
        }
        for (position, (a, want)) in args.iter().zip(sig).enumerate() {
            if a.kind() != *want {
                return Err(KernelError::ArgKind { kernel: kernel(), position, expected: *want, got: a.kind() }.into());
            }
        }
        let mut device: Option<&Device> = None;
        for (position, t) in args.iter().enumerate().filter_map(|(i, a)| a.tensor().map(|t| (i, t))) {
            if t.dtype() != DType::F32 {
                return Err(Error::DType { op: "Kernel::launch", got: t.dtype(), expected: DType::F32 });
            }
            t.ptr()?; // a stale handle is an error, never a read of newer data
            match device {
                None => device = Some(t.device()),
                Some(d) if d != t.device() => {
                    return Err(KernelError::DeviceMismatch {
                        kernel: kernel(),
                        position,
                        expected: d.name(),
                        got: t.device().name(),
                    }
                    .into())
                }
                Some(_) => {}
            }
        }
        Ok(device.cloned().ok_or_else(|| KernelError::NoTensorArg { kernel: kernel() })?)
    }

    /// Runs the host implementation now, or records it into the capture in progress.
    fn record_host(&self, h: &HostBackend, config: LaunchConfig, args: &[KernelArg<'_>]) -> Result<()> {
        enum Spec {
            Tensor(Arg, Vec<usize>, HostPtr),
            F32(f32),
            U32(u32),
            I32(i32),
        }
        let specs = args
            .iter()
            .map(|a| {
                Ok(match *a {
                    KernelArg::In(t) | KernelArg::Out(t) | KernelArg::InOut(t) => {
                        Spec::Tensor(a.kind(), t.dims().to_vec(), t.host_ptr()?)
                    }
                    KernelArg::F32(v) => Spec::F32(v),
                    KernelArg::U32(v) => Spec::U32(v),
                    KernelArg::I32(v) => Spec::I32(v),
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let (host, entry) = (self.0.host.clone(), self.0.entry);
        h.run(entry, move || {
            let slots = specs
                .iter()
                .map(|s| match s {
                    Spec::Tensor(kind, dims, p) => {
                        HostSlot::Tensor { kind: *kind, dims: dims.clone(), data: RefCell::new(p.read()) }
                    }
                    Spec::F32(v) => HostSlot::F32(*v),
                    Spec::U32(v) => HostSlot::U32(*v),
                    Spec::I32(v) => HostSlot::I32(*v),
                })
                .collect();
            let outputs = run_host(&*host, entry, HostArgs::new(entry, slots, config))?;
            for (i, data) in outputs {
                if let Spec::Tensor(_, _, p) = &specs[i] {
                    p.write(&data);
                }
            }
            Ok(())
        })
    }

    /// Runs the host implementation on `args` directly (no device), for checks.
    pub(crate) fn run_host_on(&self, args: HostArgs) -> Result<Vec<(usize, Vec<f32>)>> {
        run_host(&*self.0.host, self.0.entry, args)
    }
}

/// Whether `name` occurs in `source` as a whole identifier.
fn mentions_identifier(source: &str, name: &str) -> bool {
    let ident = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_');
    source
        .match_indices(name)
        .any(|(at, _)| !ident(source[..at].chars().next_back()) && !ident(source[at + name.len()..].chars().next()))
}
