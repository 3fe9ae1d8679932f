//! Element types.

/// The element type of a tensor.
///
/// Only `F32` exists today; storage is sized in bytes through [`DType::size`] so that `BF16`
/// and `F16` can be added without touching the allocator or the graph code.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum DType {
    /// 32-bit IEEE float.
    F32,
}

impl DType {
    /// Bytes per element.
    pub const fn size(self) -> usize {
        match self {
            DType::F32 => 4,
        }
    }
}
