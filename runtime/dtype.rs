//! Element types.

/// The element type of a tensor.
///
/// `BF16` and `F16` are stored as 16-bit words (the `half` crate's [`half::bf16`] and
/// [`half::f16`] on the host); ops on them compute in f32 and round to nearest even on store,
/// on both backends, so the host backend's results are the GPU's.
///
/// ```
/// use graphed::DType;
/// assert_eq!(DType::BF16.size(), 2);
/// assert_eq!(DType::F32.round(1.0 + 1.0 / 512.0), 1.0 + 1.0 / 512.0);
/// assert_eq!(DType::BF16.round(1.0 + 1.0 / 512.0), 1.0); // a tie: to the even neighbour
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum DType {
    /// 32-bit IEEE float.
    F32,
    /// bfloat16: f32's exponent range with an 8-bit significand.
    BF16,
    /// IEEE half precision: 5 exponent bits (largest finite value 65504), 11-bit significand.
    F16,
    /// 32-bit signed integer: positions and lengths read on the device (a KV cache's lengths).
    /// Only the ops that say so take it; the others refuse it with [`crate::Error::DType`].
    I32,
}

impl DType {
    /// Bytes per element.
    pub const fn size(self) -> usize {
        match self {
            DType::F32 | DType::I32 => 4,
            DType::BF16 | DType::F16 => 2,
        }
    }

    /// `v` rounded to this dtype (round to nearest, ties to even) and widened back to f32:
    /// exactly what a kernel that computes in f32 stores.
    /// An `I32` rounds to the nearest integer (ties to even), saturating at its range.
    pub fn round(self, v: f32) -> f32 {
        match self {
            DType::F32 => v,
            DType::I32 => to_i32(v) as f32,
            DType::BF16 => half::bf16::from_f32(v).to_f32(),
            DType::F16 => half::f16::from_f32(v).to_f32(),
        }
    }

    /// The 16-bit pattern of `v` rounded to this dtype (`F32`: the low half of its bits, unused).
    pub(crate) fn round_bits16(self, v: f32) -> u16 {
        match self {
            DType::F32 | DType::I32 => v.to_bits() as u16,
            DType::BF16 => half::bf16::from_f32(v).to_bits(),
            DType::F16 => half::f16::from_f32(v).to_bits(),
        }
    }

    /// The f32 value of a 16-bit pattern of this dtype (exact).
    pub(crate) fn widen_bits16(self, bits: u16) -> f32 {
        match self {
            DType::F32 | DType::I32 => f32::from_bits(bits as u32),
            DType::BF16 => half::bf16::from_bits(bits).to_f32(),
            DType::F16 => half::f16::from_bits(bits).to_f32(),
        }
    }

    /// The name used in kernel names and messages: `f32`, `bf16`, `f16`.
    pub const fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::BF16 => "bf16",
            DType::F16 => "f16",
            DType::I32 => "i32",
        }
    }

    /// Whether values of this dtype are floating point (every dtype but `I32`).
    pub const fn is_float(self) -> bool {
        !matches!(self, DType::I32)
    }
}

/// `v` as an `i32` the way an `I32` tensor stores it: rounded to nearest (ties to even),
/// saturating, NaN as 0.
pub(crate) fn to_i32(v: f32) -> i32 {
    v.round_ties_even() as i32
}

impl std::fmt::Display for DType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}
