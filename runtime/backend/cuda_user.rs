//! The CUDA side of user-supplied kernels: compiling CUDA C with NVRTC for this device and
//! launching the resulting function on the device stream. Kept apart from `cuda.rs` so the
//! built-in kernel table stays the backend's own business.

use cudarc::driver::{sys, CudaFunction};
use cudarc::nvrtc::{compile_ptx_with_opts, CompileError, CompileOptions};

use super::cuda::{driver_err, CudaBackend, LaunchDims};
use super::kernels::KArg;
use super::ptx_cache;
use crate::error::KernelError;
use crate::{Error, Result};

impl CudaBackend {
    /// The device's compute capability, `(major, minor)`.
    pub(crate) fn compute_capability(&self) -> Result<(i32, i32)> {
        let attr = |a| self.ctx.attribute(a).map_err(driver_err("cuDeviceGetAttribute"));
        Ok((
            attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?,
            attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?,
        ))
    }

    /// Compiles `source` for this device's architecture and loads its function `entry`.
    /// Synchronous module loading: never call it while the stream captures.
    pub(crate) fn compile_user_kernel(&self, entry: &str, source: &str, device: &str) -> Result<CudaFunction> {
        let failed = |log: String| -> Error {
            KernelError::Compile { kernel: entry.to_string(), device: device.to_string(), log }.into()
        };
        // Loading a module is synchronous: wait for another thread's capture to end.
        let _entered = self.gate.enter()?;
        self.ctx.bind_to_thread().map_err(driver_err("cuCtxSetCurrent"))?;
        let (major, minor) = self.compute_capability()?;
        let options = vec![format!("--gpu-architecture=sm_{major}{minor}"), "-std=c++17".into()];
        let name = format!("{entry}.cu");
        let compile = || {
            let opts = CompileOptions { options: options.clone(), name: Some(name.clone()), ..Default::default() };
            compile_ptx_with_opts(source, opts)
        };
        // The program's name is part of the key too (NVRTC may write it into the PTX).
        let key_options = [options.clone(), vec![format!("name={name}")]].concat();
        let ptx = ptx_cache::compile_cached(source, &key_options, compile).map_err(|e| match e {
            CompileError::CompileError { log, .. } => failed(log.to_string_lossy().into_owned()),
            other => failed(format!("{other:?}")),
        })?;
        let module = self.ctx.load_module(ptx).map_err(|e| failed(format!("cuModuleLoadData: {e:?}")))?;
        module.load_function(entry).map_err(|e| {
            failed(format!(
                "the source compiled, but has no `extern \"C\" __global__` function named `{entry}` ({e:?})"
            ))
        })
    }

    /// Launches a user kernel on the device stream (captured as a kernel node while capturing).
    pub(crate) fn launch_user_kernel(&self, f: &CudaFunction, dims: LaunchDims, args: &[KArg]) -> Result<()> {
        self.launch_function(f, dims, args)
    }
}
