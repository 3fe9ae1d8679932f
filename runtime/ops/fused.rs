//! Linear layers with their bias and GELU fused into the GEMM (cublasLt epilogues).

use crate::backend::{LtEpilogue, LtLinear};
use crate::error::OpError;
use crate::ops::{
    self, check_like, check_linear, check_linear_backward, check_shape, cpu, exec, lt_linear_of, out_dims, Exec, Gelu,
};
use crate::{Result, Tensor};

/// What [`linear_fused`] applies to `x · wᵀ` inside the GEMM.
///
/// ```
/// assert_ne!(graphed::ops::Epilogue::Bias, graphed::ops::Epilogue::BiasGelu);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Epilogue {
    /// `x · wᵀ + b` (needs `b`).
    Bias,
    /// `gelu(x · wᵀ)` with the tanh GELU (no `b`); the pre-activation is returned.
    Gelu,
    /// `gelu(x · wᵀ + b)` with the tanh GELU (needs `b`); the pre-activation is returned.
    BiasGelu,
}

impl Epilogue {
    /// The variant's name, for [`OpError::EpilogueBias`].
    fn name(self) -> &'static str {
        match self {
            Epilogue::Bias => "Bias",
            Epilogue::Gelu => "Gelu",
            Epilogue::BiasGelu => "BiasGelu",
        }
    }
}

/// `epilogue(x · wᵀ [+ b])` as one cublasLt GEMM on CUDA: returns `(y, pre)`, where `pre` is
/// the pre-activation `x · wᵀ [+ b]` for the GELU epilogues (what [`linear_fused_backward`]
/// needs) and `None` for [`Epilogue::Bias`].
///
/// GELU here is the tanh approximation ([`Gelu::Tanh`]), the one cublasLt implements. The
/// epilogue works on the f32 accumulator: the bias is added and GELU applied before the one
/// rounding to the output dtype (the host reference does the same). Without cublasLt, or for
/// a shape it has no algorithm for, the CUDA path runs the unfused ops (GEMM, bias kernel,
/// GELU kernel), which round in between. Shapes, dtypes and devices are checked as in
/// [`ops::linear`]; a `b` the epilogue needs but is missing (or one it does not take) is
/// [`OpError::EpilogueBias`].
///
/// ```
/// # use graphed::{ops, ops::{Epilogue, Gelu}, Device, Tensor};
/// let dev = Device::host();
/// let x = Tensor::from_slice(&dev, &[1.0, 2.0], &[1, 2])?;
/// let w = Tensor::from_slice(&dev, &[1.0, 0.0, 0.0, -1.0], &[2, 2])?;
/// let b = Tensor::from_slice(&dev, &[0.5, 0.5], &[2])?;
/// let (y, pre) = ops::linear_fused(&x, &w, Some(&b), Epilogue::BiasGelu)?;
/// assert_eq!(pre.unwrap().to_vec()?, vec![1.5, -1.5]);
/// let want = ops::gelu(&Tensor::from_slice(&dev, &[1.5, -1.5], &[2])?, Gelu::Tanh)?.to_vec()?;
/// assert_eq!(y.to_vec()?, want);
/// # Ok::<(), graphed::Error>(())
/// ```
pub fn linear_fused(
    x: &Tensor,
    w: &Tensor,
    b: Option<&Tensor>,
    epilogue: Epilogue,
) -> Result<(Tensor, Option<Tensor>)> {
    const OP: &str = "linear_fused";
    let dtype = check_like(OP, &[x, w])?;
    let (rows, input, out) = check_linear(OP, x, w)?;
    let wants_bias = epilogue != Epilogue::Gelu;
    match (wants_bias, b) {
        (true, None) | (false, Some(_)) => {
            return Err(OpError::EpilogueBias { epilogue: epilogue.name(), needs_bias: wants_bias }.into())
        }
        (_, Some(b)) => {
            check_like(OP, &[x, b])?;
            ops::check_vector(OP, "b", b, out)?;
        }
        (false, None) => {}
    }
    ops::n32(OP, rows * out)?;
    let dims = out_dims(x, out);
    let y = Tensor::empty_as(x.device(), &dims, dtype)?;
    let pre = if epilogue == Epilogue::Bias { None } else { Some(Tensor::empty_as(x.device(), &dims, dtype)?) };
    match exec(x.device()) {
        Exec::Host(h) => {
            let (xp, wp, yp) = (x.host_ptr()?, w.host_ptr()?, y.host_ptr()?);
            let bp = b.map(|b| b.host_ptr()).transpose()?;
            let pp = pre.as_ref().map(|p| p.host_ptr()).transpose()?;
            h.run("linear_fused", move || {
                let bv = bp.as_ref().map(|b| b.read());
                let z = cpu::linear(&xp.read(), &wp.read(), bv.as_deref(), rows, input, out);
                match &pp {
                    Some(pp) => {
                        yp.write(&cpu::gelu(&z, Gelu::Tanh));
                        pp.write(&z);
                    }
                    None => yp.write(&z),
                }
                Ok(())
            })?;
        }
        Exec::Cuda(c) => {
            let raw = match epilogue {
                Epilogue::Bias => LtEpilogue::Bias,
                Epilogue::Gelu => LtEpilogue::GeluAux,
                Epilogue::BiasGelu => LtEpilogue::GeluAuxBias,
            };
            let g = LtLinear {
                bias: b.map(|b| b.cuda_ptr()).transpose()?.unwrap_or(0),
                aux: pre.as_ref().map(|p| p.cuda_ptr()).transpose()?.unwrap_or(0),
                ..lt_linear_of(OP, raw, (x, w, &y), (rows, input, out))?
            };
            if !c.lt_linear(&g)? {
                unfused(x, w, b, &y, pre.as_ref())?;
            }
        }
    }
    Ok((y, pre))
}

/// The CUDA fallback: the GEMM and bias of [`ops::linear`], then GELU, into `y` (and `pre`).
fn unfused(x: &Tensor, w: &Tensor, b: Option<&Tensor>, y: &Tensor, pre: Option<&Tensor>) -> Result<()> {
    let z = ops::linear(x, w, b)?;
    match pre {
        Some(p) => {
            p.copy_(&z)?;
            y.copy_(&ops::gelu(&z, Gelu::Tanh)?)
        }
        None => y.copy_(&z),
    }
}

/// The backward of [`linear_fused`]: `dh = dy · gelu'(pre)` (tanh GELU) for the GELU
/// epilogues (`pre` from the forward; `None` for [`Epilogue::Bias`]), then
/// [`ops::linear_backward`]: `dw += dhᵀ · x`, `db += Σ_rows dh` (f32 grads), and `dx` when
/// `need_dx`.
///
/// cublasLt's backward epilogues are not used: `DGELU` fuses `gelu'` into the GEMM that
/// computes the *previous* layer's `dx`, which crosses the module boundary of a per-block
/// graph, and `BGRAD` overwrites the bias grad where autograd semantics accumulate.
///
/// ```
/// # use graphed::{ops, ops::Epilogue, Device, Tensor};
/// let dev = Device::host();
/// let x = Tensor::from_slice(&dev, &[1.0, 2.0], &[1, 2])?;
/// let w = Tensor::from_slice(&dev, &[1.0, 0.0, 0.0, 1.0], &[2, 2])?;
/// let dy = Tensor::from_slice(&dev, &[1.0, 1.0], &[1, 2])?;
/// let (dw, db) = (Tensor::zeros(&dev, &[2, 2])?, Tensor::zeros(&dev, &[2])?);
/// let dx = ops::linear_fused_backward(&dy, &x, &w, None, &dw, Some(&db), true)?.unwrap();
/// assert_eq!((dx.to_vec()?, db.to_vec()?), (vec![1.0, 1.0], vec![1.0, 1.0]));
/// # Ok::<(), graphed::Error>(())
/// ```
pub fn linear_fused_backward(
    dy: &Tensor,
    x: &Tensor,
    w: &Tensor,
    pre: Option<&Tensor>,
    dw: &Tensor,
    db: Option<&Tensor>,
    need_dx: bool,
) -> Result<Option<Tensor>> {
    match pre {
        Some(pre) => {
            const OP: &str = "linear_fused_backward";
            check_like(OP, &[dy, pre])?;
            check_shape(OP, dy, pre)?;
            // dh is dy's shape and dtype: the linear backward's checks, before dh is made.
            check_linear_backward(OP, (dy, x, w, dw, db), need_dx)?;
            let dh = ops::gelu_backward(dy, pre, Gelu::Tanh)?;
            ops::linear_backward(&dh, x, w, dw, db, need_dx)
        }
        None => ops::linear_backward(dy, x, w, dw, db, need_dx),
    }
}
