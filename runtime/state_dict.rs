//! Saving and loading a module's parameters as safetensors, by parameter name.
//!
//! Values are stored as little-endian float32 exactly as they are on the device, so a save
//! followed by a load reproduces every bit. Grads and optimizer state are not stored.

use std::collections::HashSet;
use std::path::Path;

use safetensors::tensor::{Dtype, SafeTensors, TensorView};

use crate::{DType, Error, Param, Parameters, Result};

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

fn io_error(path: &Path, detail: impl std::fmt::Display) -> Error {
    Error::CheckpointIo { path: path.display().to_string(), detail: detail.to_string() }
}

/// Writes every parameter's value to a safetensors file at `path`, named by its parameter path
/// (`layers.0.w`), in its own dtype (F32, BF16 or F16, bit for bit). Reads the values back from
/// the device, so it is illegal during a capture.
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
        let bytes: Vec<u8> = match p.value.dtype() {
            DType::F32 => p.value.to_vec()?.iter().flat_map(|v| v.to_le_bytes()).collect(),
            _ => p.value.to_bits16()?.iter().flat_map(|v| v.to_le_bytes()).collect(),
        };
        data.push((name.clone(), file_dtype(p.value.dtype()), p.value.dims().to_vec(), bytes));
    }
    let views = data
        .iter()
        .map(|(name, dtype, dims, bytes)| {
            TensorView::new(*dtype, dims.clone(), bytes).map(|v| (name.clone(), v)).map_err(|e| io_error(path, e))
        })
        .collect::<Result<Vec<_>>>()?;
    safetensors::serialize_to_file(views, None, path).map_err(|e| io_error(path, e))
}

/// Loads every parameter's value from a safetensors file written by [`save_safetensors`] (or
/// any file with the same names, the parameters' dtypes — F32, BF16 or F16 — and shapes).
///
/// Everything is checked before anything is written: a parameter missing from the file
/// ([`Error::CheckpointMissingTensor`]), a tensor the module has no parameter for
/// ([`Error::CheckpointUnexpectedTensor`]) or a tensor of another dtype or shape
/// ([`Error::CheckpointTensorMismatch`]) refuses the load and leaves the module unchanged.
/// Parameters are handles, so `&module` suffices. Illegal during a capture.
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
    let bytes = std::fs::read(path).map_err(|e| io_error(path, e))?;
    let file = SafeTensors::deserialize(&bytes).map_err(|e| io_error(path, e))?;
    let file_name = || path.display().to_string();
    let mut values = Vec::with_capacity(params.len());
    for (name, p) in &params {
        let view = file
            .tensor(name)
            .map_err(|_| Error::CheckpointMissingTensor { path: file_name(), tensor: name.clone() })?;
        let dtype = p.value.dtype();
        if view.dtype() != file_dtype(dtype) || view.shape() != p.value.dims() {
            return Err(Error::CheckpointTensorMismatch {
                path: file_name(),
                tensor: name.clone(),
                expected: format!("{:?} {:?}", file_dtype(dtype), p.value.dims()),
                got: format!("{:?} {:?}", view.dtype(), view.shape()),
            });
        }
        // 16-bit values are widened here and rounded back (exactly) by copy_from_slice.
        let data: Vec<f32> = match dtype {
            DType::F32 => view.data().chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect(),
            _ => view.data().chunks_exact(2).map(|b| dtype.widen_bits16(u16::from_le_bytes([b[0], b[1]]))).collect(),
        };
        values.push((p, data));
    }
    let known: HashSet<&str> = params.iter().map(|(n, _)| n.as_str()).collect();
    let mut names = file.names();
    names.sort_unstable();
    if let Some(extra) = names.into_iter().find(|n| !known.contains(n)) {
        return Err(Error::CheckpointUnexpectedTensor { path: file_name(), tensor: extra.to_string() });
    }
    for (p, data) in values {
        p.value.copy_from_slice(&data)?;
    }
    Ok(())
}

/// The safetensors dtype a parameter of `dtype` is stored as (its own: no conversion).
fn file_dtype(dtype: DType) -> Dtype {
    match dtype {
        DType::F32 => Dtype::F32,
        DType::BF16 => Dtype::BF16,
        DType::F16 => Dtype::F16,
    }
}
