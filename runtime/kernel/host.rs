//! What a custom kernel's host implementation sees, and how it is called: on copies of the
//! tensors, with the outputs handed back only on success, and a panic turned into an error.

use std::cell::{Ref, RefCell, RefMut};
use std::panic::{catch_unwind, AssertUnwindSafe};

use super::{Arg, LaunchConfig};
use crate::error::KernelError;
use crate::{Error, Result};

/// What a host implementation sees: the launch's arguments by position, tensors as slices.
///
/// Tensor arguments are copies: read inputs with [`HostArgs::input`], write outputs through
/// [`HostArgs::output`] (initialised with the tensor's contents); the outputs are written back
/// to the tensors only when the implementation returns `Ok`. Asking for a position of another
/// kind is [`KernelError::ArgKind`], a position past the arguments [`KernelError::ArgPosition`].
///
/// ```
/// use graphed::{HostArgs, Result};
/// // The host side of `__global__ void axpy(float* y, const float* x, float a, unsigned n)`.
/// fn axpy_host(args: &HostArgs) -> Result<()> {
///     let (x, a) = (args.input(1)?, args.f32(2)?);
///     let mut y = args.output(0)?;
///     for i in 0..args.u32(3)? as usize {
///         y[i] += a * x[i];
///     }
///     Ok(())
/// }
/// # let _ = axpy_host;
/// ```
pub struct HostArgs {
    kernel: &'static str,
    slots: Vec<HostSlot>,
    launch: LaunchConfig,
}

/// One argument as the host implementation sees it.
pub(crate) enum HostSlot {
    Tensor { kind: Arg, dims: Vec<usize>, data: RefCell<Vec<f32>> },
    F32(f32),
    U32(u32),
    I32(i32),
}

impl HostSlot {
    fn kind(&self) -> Arg {
        match self {
            HostSlot::Tensor { kind, .. } => *kind,
            HostSlot::F32(_) => Arg::F32,
            HostSlot::U32(_) => Arg::U32,
            HostSlot::I32(_) => Arg::I32,
        }
    }
}

impl HostArgs {
    pub(crate) fn new(kernel: &'static str, slots: Vec<HostSlot>, launch: LaunchConfig) -> HostArgs {
        HostArgs { kernel, slots, launch }
    }

    /// Argument `i`, when `ok` accepts its kind; [`KernelError::ArgKind`] naming `want` otherwise.
    fn slot(&self, i: usize, want: Arg, ok: impl Fn(Arg) -> bool) -> Result<&HostSlot> {
        let slot = self.slots.get(i).ok_or_else(|| KernelError::ArgPosition {
            kernel: self.kernel.to_string(),
            position: i,
            count: self.len(),
        })?;
        if !ok(slot.kind()) {
            return Err(self.wrong_kind(i, want));
        }
        Ok(slot)
    }

    /// [`KernelError::ArgKind`]: argument `i` asked for as `want`, which it is not.
    fn wrong_kind(&self, i: usize, want: Arg) -> Error {
        let got = self.slots.get(i).map_or(want, HostSlot::kind);
        KernelError::ArgKind { kernel: self.kernel.to_string(), position: i, expected: want, got }.into()
    }

    fn data(&self, i: usize, want: Arg, ok: impl Fn(Arg) -> bool) -> Result<&RefCell<Vec<f32>>> {
        match self.slot(i, want, ok)? {
            HostSlot::Tensor { data, .. } => Ok(data),
            _ => Err(self.wrong_kind(i, want)),
        }
    }

    /// The number of arguments.
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// Whether the kernel takes no arguments.
    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// The elements of tensor argument `i` (any tensor kind), for reading.
    pub fn input(&self, i: usize) -> Result<Ref<'_, [f32]>> {
        let cell = self.data(i, Arg::TensorIn, Arg::is_tensor)?;
        let data = cell.try_borrow().map_err(|_| self.busy(i))?;
        Ok(Ref::map(data, Vec::as_slice))
    }

    /// The elements of output argument `i` ([`Arg::TensorOut`] or [`Arg::TensorInOut`]),
    /// for writing; they start as the tensor's current contents.
    pub fn output(&self, i: usize) -> Result<RefMut<'_, [f32]>> {
        let cell = self.data(i, Arg::TensorOut, Arg::is_output)?;
        let data = cell.try_borrow_mut().map_err(|_| self.busy(i))?;
        Ok(RefMut::map(data, Vec::as_mut_slice))
    }

    /// The dimensions of tensor argument `i`.
    pub fn dims(&self, i: usize) -> Result<&[usize]> {
        match self.slot(i, Arg::TensorIn, Arg::is_tensor)? {
            HostSlot::Tensor { dims, .. } => Ok(dims),
            _ => Err(self.wrong_kind(i, Arg::TensorIn)),
        }
    }

    /// The `f32` argument `i`.
    pub fn f32(&self, i: usize) -> Result<f32> {
        match self.slot(i, Arg::F32, |k| k == Arg::F32)? {
            HostSlot::F32(v) => Ok(*v),
            _ => Err(self.wrong_kind(i, Arg::F32)),
        }
    }

    /// The `u32` argument `i`.
    pub fn u32(&self, i: usize) -> Result<u32> {
        match self.slot(i, Arg::U32, |k| k == Arg::U32)? {
            HostSlot::U32(v) => Ok(*v),
            _ => Err(self.wrong_kind(i, Arg::U32)),
        }
    }

    /// The `i32` argument `i`.
    pub fn i32(&self, i: usize) -> Result<i32> {
        match self.slot(i, Arg::I32, |k| k == Arg::I32)? {
            HostSlot::I32(v) => Ok(*v),
            _ => Err(self.wrong_kind(i, Arg::I32)),
        }
    }

    /// [`KernelError::ArgBorrowed`]: argument `i` is borrowed for writing.
    fn busy(&self, i: usize) -> Error {
        KernelError::ArgBorrowed { kernel: self.kernel.to_string(), position: i }.into()
    }

    /// The launch configuration the kernel was launched with.
    pub fn launch_config(&self) -> LaunchConfig {
        self.launch
    }

    /// The output buffers by position, once the implementation succeeded.
    pub(crate) fn into_outputs(self) -> Vec<(usize, Vec<f32>)> {
        let slots = self.slots.into_iter().enumerate();
        slots
            .filter_map(|(i, s)| match s {
                HostSlot::Tensor { kind, data, .. } if kind.is_output() => Some((i, data.into_inner())),
                _ => None,
            })
            .collect()
    }
}

/// A host implementation: computes the outputs from the inputs of one launch.
///
/// ```
/// use std::sync::Arc;
/// let noop: Arc<graphed::HostFn> = Arc::new(|_args| Ok(()));
/// # let _ = noop;
/// ```
pub type HostFn = dyn Fn(&HostArgs) -> Result<()> + Send + Sync;

/// Calls a host implementation, turning a panic into [`KernelError::HostPanic`]; the output
/// buffers only when it succeeded.
pub(crate) fn run_host(host: &HostFn, entry: &str, args: HostArgs) -> Result<Vec<(usize, Vec<f32>)>> {
    match catch_unwind(AssertUnwindSafe(|| host(&args))) {
        Ok(Ok(())) => Ok(args.into_outputs()),
        Ok(Err(e)) => Err(e.context(format!("kernel `{entry}` (host implementation)"))),
        Err(panic) => {
            let message = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic with a non-string payload".into());
            Err(KernelError::HostPanic { kernel: entry.to_string(), message }.into())
        }
    }
}
