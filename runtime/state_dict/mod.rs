//! Saving and loading a module's parameters as safetensors, by parameter name.
//!
//! Values are stored little-endian in each parameter's own dtype exactly as they are on the
//! device, so a save followed by a load reproduces every bit. Grads and optimizer state are
//! not stored. A load checks everything before it writes, and a save replaces the file only
//! once the new one is complete, so neither leaves a half-done state behind.

mod header;

use std::collections::HashSet;
use std::path::Path;

use safetensors::tensor::{Dtype, TensorView};

use crate::backend::FaultPoint;
use crate::{DType, Device, Error, Param, Parameters, Result, TensorLayout};

/// The module's parameters by name; two with one name is [`Error::DuplicateParamName`].
fn named_params<M: Parameters + ?Sized>(module: &M) -> Result<Vec<(String, Param)>> {
    let params = module.parameters();
    let mut seen = HashSet::new();
    for (name, _) in &params {
        if !seen.insert(name.as_str()) {
            return Err(Error::DuplicateParamName { name: name.clone() });
        }
    }
    Ok(params)
}

fn io_error(path: &Path, e: std::io::Error) -> Error {
    Error::CheckpointIo { path: path.display().to_string(), kind: e.kind(), detail: e.to_string() }
}

/// The bytes of the file at `path`: a regular file only (a device such as /dev/zero or a pipe
/// never ends, and would be read until memory runs out), its length as the file system gives
/// it, the buffer reserved fallibly ([`Error::OutOfMemory`] on the host where it cannot be).
fn read_file(path: &Path) -> Result<Vec<u8>> {
    use std::io::Read;
    let file = std::fs::File::open(path).map_err(|e| io_error(path, e))?;
    let meta = file.metadata().map_err(|e| io_error(path, e))?;
    if !meta.is_file() {
        let what = if meta.is_dir() { "a directory" } else { "not a regular file (a device, a pipe or a socket)" };
        let detail = format!("{what}: a safetensors file is a regular file");
        return Err(io_error(path, std::io::Error::new(std::io::ErrorKind::InvalidInput, detail)));
    }
    let len = usize::try_from(meta.len()).unwrap_or(usize::MAX);
    let mut bytes = Vec::new();
    bytes.try_reserve_exact(len).map_err(|_| Error::OutOfMemory {
        device: "host memory".into(),
        requested: len,
        available: None,
    })?;
    // A file that grows while it is read stops at the length it had; one that shrinks is short,
    // which the header's check reports.
    file.take(meta.len()).read_to_end(&mut bytes).map_err(|e| io_error(path, e))?;
    Ok(bytes)
}

/// The device whose fault plan file accesses follow (the first parameter's), if any.
fn device_of(params: &[(String, Param)]) -> Option<&Device> {
    params.first().map(|(_, p)| p.value.device())
}

/// The OS error an injected fault at `point` stands for (see `backend::fault`), if one fires.
fn injected(device: Option<&Device>, point: FaultPoint, path: &Path) -> Result<()> {
    if device.is_some_and(|d| d.backend().faults.fires(point)) {
        let errno = if point == FaultPoint::FileWrite { 28 } else { 5 }; // ENOSPC, EIO
        return Err(io_error(path, std::io::Error::from_raw_os_error(errno)));
    }
    Ok(())
}

/// Writes every parameter's value to a safetensors file at `path`, named by its parameter path
/// (`layers.0.w`), in its own dtype (F32, BF16, F16 or I32, bit for bit). Reads the values back from
/// the device, so it is illegal during a capture. The file is written next to `path` and
/// renamed over it once complete: a failed save ([`Error::CheckpointIo`]) leaves an earlier
/// file at `path` as it was.
///
/// ```
/// use graphed::{load_safetensors, save_safetensors, Device, Param, Parameters, Tensor};
/// #[derive(Parameters)]
/// struct Lin { w: Param, b: Param }
/// let dev = Device::host();
/// let lin = Lin { w: Param::new(Tensor::full(&dev, &[2, 2], 0.5)?)?, b: Param::new(Tensor::zeros(&dev, &[2])?)? };
/// let path = std::env::temp_dir().join(format!("graphed-doc-{}.safetensors", std::process::id()));
/// save_safetensors(&lin, &path)?;
/// graphed::ops::fill_(&lin.w.value, 0.0)?;
/// load_safetensors(&lin, &path)?;
/// assert_eq!(lin.w.value.to_vec()?, vec![0.5; 4]);
/// # std::fs::remove_file(&path).ok();
/// # Ok::<(), graphed::Error>(())
/// ```
pub fn save_safetensors<M: Parameters + ?Sized>(module: &M, path: impl AsRef<Path>) -> Result<()> {
    let path = path.as_ref();
    let params = named_params(module)?;
    let mut data = Vec::with_capacity(params.len());
    for (name, p) in &params {
        let bytes = HostValues::read(&p.value)?.to_le_bytes();
        data.push((name.clone(), file_dtype(p.value.dtype()), p.value.dims().to_vec(), bytes));
    }
    let views = data
        .iter()
        .map(|(name, dtype, dims, bytes)| {
            // The bytes are the dims' elements in the dtype's size: a view always fits.
            TensorView::new(*dtype, dims.clone(), bytes).map(|v| (name.clone(), v)).map_err(|e| {
                Error::CheckpointFormat {
                    path: path.display().to_string(),
                    tensor: Some(name.clone()),
                    problem: crate::CheckpointProblem::Header { detail: e.to_string() },
                }
            })
        })
        .collect::<Result<Vec<_>>>()?;
    let bytes = safetensors::serialize(views, None).map_err(|e| Error::CheckpointFormat {
        path: path.display().to_string(),
        tensor: None,
        problem: crate::CheckpointProblem::Header { detail: e.to_string() },
    })?;
    let mut partial = path.as_os_str().to_owned();
    partial.push(format!(".partial-{}", std::process::id()));
    let partial = std::path::PathBuf::from(partial);
    let written = injected(device_of(&params), FaultPoint::FileWrite, path)
        .and_then(|()| std::fs::write(&partial, &bytes).map_err(|e| io_error(path, e)))
        .and_then(|()| std::fs::rename(&partial, path).map_err(|e| io_error(path, e)));
    if written.is_err() {
        let _ = std::fs::remove_file(&partial);
    }
    written
}

/// Loads every parameter's value from a safetensors file written by [`save_safetensors`] (or
/// any file with the same names, the parameters' dtypes — F32, BF16, F16 or I32 — and shapes).
///
/// Everything is checked before anything is written: a parameter missing from the file
/// ([`Error::CheckpointMissingTensor`]), a tensor the module has no parameter for
/// ([`Error::CheckpointUnexpectedTensor`]), a tensor of another dtype or shape
/// ([`Error::CheckpointTensorMismatch`]) or a file that breaks the format
/// ([`Error::CheckpointFormat`], naming the tensor whose entry is wrong), a path that is not a
/// regular file ([`Error::CheckpointIo`] with `InvalidInput`: a directory, a device, a pipe), a
/// file larger than host memory can hold ([`Error::OutOfMemory`]) refuses the load and
/// leaves the module unchanged; so does a read or a device copy that fails (the values
/// written before it are put back). Parameters are handles, so `&module` suffices. Illegal
/// during a capture.
///
/// ```
/// use graphed::{load_safetensors, save_safetensors, Device, Error, Param, Parameters, Tensor};
/// #[derive(Parameters)]
/// struct One { w: Param }
/// let dev = Device::host();
/// let path = std::env::temp_dir().join(format!("graphed-doc-load-{}.safetensors", std::process::id()));
/// save_safetensors(&One { w: Param::new(Tensor::zeros(&dev, &[3])?)? }, &path)?;
/// let other = One { w: Param::new(Tensor::full(&dev, &[4], 1.0)?)? };
/// let refused = load_safetensors(&other, &path);
/// assert!(matches!(refused, Err(Error::CheckpointTensorMismatch { ref tensor, .. }) if tensor == "w"));
/// assert_eq!(other.w.value.to_vec()?, vec![1.0; 4]); // unchanged
/// # std::fs::remove_file(&path).ok();
/// # Ok::<(), graphed::Error>(())
/// ```
pub fn load_safetensors<M: Parameters + ?Sized>(module: &M, path: impl AsRef<Path>) -> Result<()> {
    let path = path.as_ref();
    let params = named_params(module)?;
    for (_, p) in &params {
        p.value.device().backend().forbid_during_capture("load_safetensors")?;
    }
    let device = device_of(&params);
    injected(device, FaultPoint::FileRead, path)?;
    let bytes = read_file(path)?;
    let file_name = || path.display().to_string();
    let entries = header::parse(&bytes).map_err(|(tensor, problem)| Error::CheckpointFormat {
        path: file_name(),
        tensor,
        problem,
    })?;
    let mut values = Vec::with_capacity(params.len());
    for (name, p) in &params {
        let entry = entries
            .iter()
            .find(|e| &e.name == name)
            .ok_or_else(|| Error::CheckpointMissingTensor { path: file_name(), tensor: name.clone() })?;
        let dtype = p.value.dtype();
        let dims_match = entry.shape.len() == p.value.dims().len()
            && entry.shape.iter().zip(p.value.dims()).all(|(a, b)| *a == *b as u64);
        if entry.dtype != file_dtype(dtype) || !dims_match {
            return Err(Error::CheckpointTensorMismatch {
                path: file_name(),
                tensor: name.clone(),
                expected: TensorLayout {
                    dtype: format!("{:?}", file_dtype(dtype)).into(),
                    shape: p.value.dims().iter().map(|&d| d as u64).collect(),
                },
                got: TensorLayout { dtype: format!("{:?}", entry.dtype).into(), shape: entry.shape.clone().into() },
            });
        }
        values.push((p, HostValues::from_le_bytes(dtype, &bytes[entry.bytes.clone()])));
    }
    let known: HashSet<&str> = params.iter().map(|(n, _)| n.as_str()).collect();
    let mut names: Vec<&str> = entries.iter().map(|e| e.name.as_str()).collect();
    names.sort_unstable();
    if let Some(extra) = names.into_iter().find(|n| !known.contains(n)) {
        return Err(Error::CheckpointUnexpectedTensor { path: file_name(), tensor: extra.to_string() });
    }
    // Keep what the parameters hold, to put it back should a copy fail half-way.
    let before = values.iter().map(|(p, _)| HostValues::read(&p.value)).collect::<Result<Vec<_>>>()?;
    for (i, (p, data)) in values.iter().enumerate() {
        if let Err(e) = data.write(&p.value) {
            for ((p, _), old) in values[..i].iter().zip(&before) {
                if let Err(again) = old.write(&p.value) {
                    p.value
                        .device()
                        .backend()
                        .drop_errors
                        .report(again.context("restoring a parameter after a failed load"));
                }
            }
            return Err(e);
        }
    }
    Ok(())
}

/// A parameter's values on the host, exactly, in its own dtype: f32, i32 (through f32 an i32
/// past 2^24 would not come back) or the raw 16-bit patterns of bf16 and f16 (through f32 a
/// NaN's payload may change).
enum HostValues {
    F32(Vec<f32>),
    I32(Vec<i32>),
    Bits16(Vec<u16>),
}

impl HostValues {
    fn read(t: &crate::Tensor) -> Result<HostValues> {
        Ok(match t.dtype() {
            DType::F32 => HostValues::F32(t.to_vec()?),
            DType::I32 => HostValues::I32(t.to_i32_vec()?),
            DType::BF16 | DType::F16 => HostValues::Bits16(t.to_bits16()?),
        })
    }

    fn write(&self, t: &crate::Tensor) -> Result<()> {
        match self {
            HostValues::F32(v) => t.copy_from_slice(v),
            HostValues::I32(v) => t.copy_from_i32(v),
            HostValues::Bits16(v) => t.copy_from_bits16(v),
        }
    }

    /// The values of a tensor of `dtype` from the file's little-endian bytes (whose length the
    /// header check has matched to the shape).
    fn from_le_bytes(dtype: DType, data: &[u8]) -> HostValues {
        match dtype {
            DType::F32 => {
                HostValues::F32(data.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect())
            }
            DType::I32 => {
                HostValues::I32(data.chunks_exact(4).map(|b| i32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect())
            }
            DType::BF16 | DType::F16 => {
                HostValues::Bits16(data.chunks_exact(2).map(|b| u16::from_le_bytes([b[0], b[1]])).collect())
            }
        }
    }

    /// The values as the file stores them: little-endian, in the tensor's own dtype.
    fn to_le_bytes(&self) -> Vec<u8> {
        match self {
            HostValues::F32(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            HostValues::I32(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            HostValues::Bits16(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        }
    }
}

/// The safetensors dtype a parameter of `dtype` is stored as (its own: no conversion).
fn file_dtype(dtype: DType) -> Dtype {
    match dtype {
        DType::F32 => Dtype::F32,
        DType::BF16 => Dtype::BF16,
        DType::F16 => Dtype::F16,
        DType::I32 => Dtype::I32,
    }
}
