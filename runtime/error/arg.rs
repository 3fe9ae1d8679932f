//! `Arg`: the kind of one parameter of a custom kernel ([`crate::Kernel`]), named in its
//! signature and in the errors about its arguments ([`super::KernelError`]). It lives with the
//! errors so that they name no module above them; `graphed::Arg` is the same type.

/// The kind of one kernel parameter, as declared in a kernel's signature.
///
/// ```
/// use graphed::Arg;
/// // __global__ void k(float* y, const float* x, float a, unsigned n)
/// let signature = [Arg::TensorOut, Arg::TensorIn, Arg::F32, Arg::U32];
/// assert!(signature[0].is_output() && signature[1].is_tensor() && !signature[2].is_tensor());
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Arg {
    /// A tensor the kernel only reads (`const float*`).
    TensorIn,
    /// A tensor the kernel writes (`float*`); what it does not write keeps its contents.
    TensorOut,
    /// A tensor the kernel reads and writes (`float*`).
    TensorInOut,
    /// A `float` passed by value.
    F32,
    /// An `unsigned int` passed by value.
    U32,
    /// An `int` passed by value.
    I32,
}

impl Arg {
    /// Whether this is one of the tensor kinds.
    pub fn is_tensor(self) -> bool {
        matches!(self, Arg::TensorIn | Arg::TensorOut | Arg::TensorInOut)
    }

    /// Whether the kernel may write the tensor.
    pub fn is_output(self) -> bool {
        matches!(self, Arg::TensorOut | Arg::TensorInOut)
    }
}
