//! `CheckpointProblem`: what is wrong with a safetensors file's layout, inside
//! [`super::Error::CheckpointFormat`] (which names the file, and the tensor when the problem is
//! one tensor's).

/// How a safetensors file breaks its format, as a value a caller can match on.
///
/// ```
/// use graphed::{load_safetensors, CheckpointProblem, Device, Error, Param, Parameters, Tensor};
/// #[derive(Parameters)]
/// struct One { w: Param }
/// let one = One { w: Param::new(Tensor::zeros(&Device::host(), &[2])?)? };
/// let path = std::env::temp_dir().join(format!("graphed-doc-problem-{}.safetensors", std::process::id()));
/// std::fs::write(&path, [200, 0, 0, 0, 0, 0, 0, 0, b'{'])?; // a header length past the end
/// let e = load_safetensors(&one, &path).unwrap_err();
/// assert!(matches!(e, Error::CheckpointFormat { problem: CheckpointProblem::Truncated { file: 9, needed: 208 }, .. }));
/// # std::fs::remove_file(&path).ok();
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CheckpointProblem {
    /// The file ends before its 8-byte header length or before the header it declares.
    #[error("the file has {file} bytes, but its header needs {needed}")]
    Truncated {
        /// The file's length.
        file: u64,
        /// The bytes its header length says are there (8 plus the header).
        needed: u64,
    },
    /// The header is not UTF-8 JSON mapping names to tensors (or the safetensors crate
    /// refused what a save would write).
    #[error("the header is not a JSON object of tensors ({detail})")]
    Header {
        /// What the UTF-8 decoder, the JSON parser or the safetensors crate said.
        detail: String,
    },
    /// The header's `__metadata__` entry is not a JSON object.
    #[error("its `__metadata__` entry is not a JSON object")]
    Metadata,
    /// A tensor's entry lacks a field, or has one of the wrong type.
    #[error("its entry has no valid `{field}`")]
    Field {
        /// `dtype`, `shape` or `data_offsets`.
        field: &'static str,
    },
    /// A dtype safetensors does not define.
    #[error("unknown dtype `{dtype}`")]
    UnknownDType {
        /// The dtype string of the header.
        dtype: String,
    },
    /// The shape's elements times the dtype's size is not the byte range the offsets give
    /// (or does not fit in 64 bits).
    #[error("its shape {shape:?} in its dtype does not make the {bytes} bytes its offsets give")]
    SizeMismatch {
        /// The shape.
        shape: Vec<u64>,
        /// The bytes between its offsets.
        bytes: u64,
    },
    /// Offsets that are reversed or lie past the data section.
    #[error("data offsets [{begin}, {end}] do not lie within the {data} bytes of data")]
    Offsets {
        /// The first offset.
        begin: u64,
        /// The second offset.
        end: u64,
        /// Bytes in the file's data section.
        data: u64,
    },
    /// Tensors do not tile the data section: a gap, an overlap, or bytes left at the end
    /// (the tensor named is the first one that does not start where the previous one ended).
    #[error(
        "the tensors' data does not tile the data section (expected the next tensor at byte {expected}, found {found})"
    )]
    Layout {
        /// Where the next tensor should start.
        expected: u64,
        /// Where it starts (or the data section's end, for bytes left over).
        found: u64,
    },
}

/// A tensor's dtype and shape as a safetensors file stores them (in
/// [`super::Error::CheckpointTensorMismatch`]): the dtype by its safetensors name. (Boxed
/// slices keep [`super::Error`] small.)
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorLayout {
    /// The safetensors dtype: `F32`, `BF16`, `F16`, `I32`, ...
    pub dtype: Box<str>,
    /// The dimensions.
    pub shape: Box<[u64]>,
}

impl std::fmt::Display for TensorLayout {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {:?}", self.dtype, self.shape)
    }
}
