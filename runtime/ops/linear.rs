//! Linear layers through cuBLAS, and the bias add and bias grad around them.

use crate::backend::{CudaBackend, GemmEx, KArg, LaunchDims, LtEpilogue, LtLinear, Operand};
use crate::ops::{
    as_rows, check_f32_on, check_like, check_rank1, check_shape, check_vector, col_dims, cpu, exec, gemm_dim, k, n32,
    Exec,
};
use crate::{DType, Error, Result, ShapeProblem, Tensor};

/// A GEMM operand of tensor `t` with leading dimension `ld`.
fn operand(t: &Tensor, ld: usize) -> Result<Operand> {
    Ok(Operand { ptr: t.cuda_ptr()?, dtype: t.dtype(), ld })
}

/// The output dims: `x`'s with the last dimension replaced by `out`.
pub(crate) fn out_dims(x: &Tensor, out: usize) -> Vec<usize> {
    let mut d = x.dims().to_vec();
    if let Some(last) = d.last_mut() {
        *last = out;
    }
    d
}

/// Checks `w` is `[out, in]` and fits `x`'s last dimension; returns `(rows, in, out)`.
pub(crate) fn check_linear(op: &'static str, x: &Tensor, w: &Tensor) -> Result<(usize, usize, usize)> {
    check_against_w(op, "x", x, w, 1)
}

/// Checks `w` is `[out, in]`, both nonzero, and that the last dimension of `t` (named `arg`) is
/// `w`'s dimension `axis` (1: `t` is an input; 0: an output grad); returns `(rows of t, that
/// dimension, w's other one)`, each a GEMM dimension.
fn check_against_w(
    op: &'static str,
    arg: &'static str,
    t: &Tensor,
    w: &Tensor,
    axis: usize,
) -> Result<(usize, usize, usize)> {
    check_rank1(op, arg, t)?;
    if w.dims().len() != 2 {
        return Err(Error::shape(op, ShapeProblem::layout("w", "[out, in]", w.dims())));
    }
    let (rows, width) = as_rows(t);
    let (along, other) = (w.dims()[axis], w.dims()[1 - axis]);
    if along != width {
        let got = t.dims().to_vec();
        let axis = got.len() - 1;
        return Err(Error::shape(op, ShapeProblem::Axis { arg, got, axis, expected: along, from: "w [out, in]" }));
    }
    if along == 0 || other == 0 {
        return Err(Error::shape(op, ShapeProblem::layout("w", "[out, in] with both nonzero", w.dims())));
    }
    for v in [rows, along, other] {
        gemm_dim(op, v)?;
    }
    Ok((rows, along, other))
}

/// `y = x · wᵀ + b`: a fully connected layer.
///
/// `x` is `[N, in]` (or any `[..., in]`: leading dimensions are flattened into rows), `w` is
/// `[out, in]` — PyTorch's `nn.Linear` weight layout, one row per output feature — and `b` is
/// `[out]`, all of one dtype. Returns `[N, out]` (`[..., out]`) in that dtype. On CUDA this is
/// one cuBLAS GEMM followed, with a bias, by a bias kernel over the output: f32 is a plain f32
/// SGEMM (TF32 only after [`crate::Device::set_tf32`]); bf16 and f16 run on tensor cores with
/// f32 accumulation (`cublasGemmEx`, `CUBLAS_COMPUTE_32F`), rounded once to the dtype, and the
/// bias add rounds again (the host reference rounds at the same two places).
///
/// ```
/// # use graphed::{ops, Device, Tensor};
/// let dev = Device::host();
/// let x = Tensor::from_slice(&dev, &[1.0, 2.0], &[1, 2])?;
/// let w = Tensor::from_slice(&dev, &[1.0, 0.0, 1.0, 1.0, 0.0, -1.0], &[3, 2])?;
/// let b = Tensor::from_slice(&dev, &[0.5, 0.5, 0.5], &[3])?;
/// let y = ops::linear(&x, &w, Some(&b))?;
/// assert_eq!(y.dims(), &[1, 3]);
/// assert_eq!(y.to_vec()?, vec![1.5, 3.5, -1.5]);
/// # Ok::<(), graphed::Error>(())
/// ```
pub fn linear(x: &Tensor, w: &Tensor, b: Option<&Tensor>) -> Result<Tensor> {
    linear_impl("linear", x, w, b, x.dtype())
}

/// [`linear`] with the output in `out_dtype`: f32 logits from bf16 or f16 inputs (the GEMM
/// writes its f32 accumulator without rounding it), or the input dtype. `b`, when given, has
/// the output's dtype. Other combinations are [`Error::DTypeMismatch`].
///
/// ```
/// # use graphed::{ops, DType, Device, Tensor};
/// let dev = Device::host();
/// let x = Tensor::from_slice_as(&dev, &[1.0, 1.0 / 256.0], &[1, 2], DType::BF16)?;
/// let w = Tensor::from_slice_as(&dev, &[1.0, 1.0], &[1, 2], DType::BF16)?;
/// assert_eq!(ops::linear(&x, &w, None)?.to_vec()?, vec![1.0]); // rounded to bf16
/// assert_eq!(ops::linear_to(&x, &w, None, DType::F32)?.to_vec()?, vec![1.0 + 1.0 / 256.0]);
/// # Ok::<(), graphed::Error>(())
/// ```
pub fn linear_to(x: &Tensor, w: &Tensor, b: Option<&Tensor>, out_dtype: DType) -> Result<Tensor> {
    linear_impl("linear_to", x, w, b, out_dtype)
}

fn linear_impl(op: &'static str, x: &Tensor, w: &Tensor, b: Option<&Tensor>, out_dtype: DType) -> Result<Tensor> {
    let in_dtype = check_like(op, &[x, w])?;
    if out_dtype != in_dtype && out_dtype != DType::F32 {
        return Err(Error::DTypeMismatch { op, a: in_dtype, b: out_dtype });
    }
    let (rows, input, out) = check_linear(op, x, w)?;
    if let Some(b) = b {
        if b.dtype() != out_dtype {
            return Err(Error::DTypeMismatch { op, a: out_dtype, b: b.dtype() });
        }
        b.check_fresh()?;
        if b.device() != x.device() {
            return Err(Error::DeviceMismatch { op, a: x.device().name(), b: b.device().name() });
        }
        check_vector(op, "b", b, out)?;
    }
    let dtype = out_dtype;
    let n = n32(op, rows * out)?;
    let y = Tensor::empty_as(x.device(), &out_dims(x, out), dtype)?;
    match exec(x.device()) {
        Exec::Host(h) => {
            let (xp, wp, yp) = (x.host_ptr()?, w.host_ptr()?, y.host_ptr()?);
            let bp = b.map(|b| b.host_ptr()).transpose()?;
            h.run("linear", move || {
                let mut v = cpu::linear(&xp.read(), &wp.read(), None, rows, input, out);
                if let Some(bv) = bp.as_ref().map(|b| b.read()) {
                    // The GEMM's output is stored (rounded) before the bias kernel reads it.
                    v = cpu::bias_add(&v.into_iter().map(|e| dtype.round(e)).collect::<Vec<_>>(), &bv, out);
                }
                yp.write(&v);
                Ok(())
            })?;
        }
        Exec::Cuda(c) => {
            let bias = b.map(|b| b.cuda_ptr()).transpose()?;
            cuda_forward(c, op, (x, w, &y), (rows, input, out), 0.0)?;
            if let Some(bias) = bias {
                let yp = y.cuda_ptr()?;
                launch_bias_add(c, dtype, [yp, yp, bias], n, out)?;
            }
        }
    }
    Ok(y)
}

/// `y = residual + x · wᵀ`: a linear layer whose product is added to a residual stream in the
/// GEMM itself, rounded once, instead of a [`linear`] followed by an [`crate::ops::add`] (which
/// rounds the product, then the sum, and reads and writes the whole output once more).
///
/// `x` is `[..., in]`, `w` `[out, in]`, `residual` `[..., out]` (the output's shape), one
/// dtype; returns a new tensor of the output's shape. On CUDA: one cublasLt GEMM with the
/// residual as its C (`beta = 1`, f32 accumulation, C read apart from the output); without
/// cublasLt, or where it has no algorithm for the shape, the residual is copied into the output
/// and one `cublasGemmEx` adds the product into it (`beta = 1`): the same one rounding. The host
/// reference adds in f32 and rounds once. Its backward is [`linear_backward`] for `x` and `w`
/// (the residual's grad is the output's grad).
///
/// Errors: the shapes of [`linear`], a residual of another shape ([`ShapeProblem::Expected`]),
/// dtype or device mismatches; checked before anything runs.
///
/// ```
/// # use graphed::{ops, DType, Device, Tensor};
/// let dev = Device::host();
/// let x = Tensor::from_slice(&dev, &[1.0, 2.0], &[1, 2])?;
/// let w = Tensor::from_slice(&dev, &[1.0, 1.0, 0.0, -1.0], &[2, 2])?;
/// let r = Tensor::from_slice(&dev, &[10.0, 20.0], &[1, 2])?;
/// assert_eq!(ops::linear_residual(&x, &w, &r)?.to_vec()?, vec![13.0, 18.0]);
/// // bf16: the exact 1 + 2⁻⁸ + 2⁻¹⁶ rounds up once; a linear then an add rounds the product
/// // to 2⁻⁸ first, and 1 + 2⁻⁸ (a tie) to 1.
/// let x = Tensor::from_slice_as(&dev, &[1.0 / 256.0, 1.0 / 65536.0], &[1, 2], DType::BF16)?;
/// let w = Tensor::from_slice_as(&dev, &[1.0, 1.0], &[1, 2], DType::BF16)?;
/// let r = Tensor::from_slice_as(&dev, &[1.0], &[1, 1], DType::BF16)?;
/// assert_eq!(ops::linear_residual(&x, &w, &r)?.to_vec()?, vec![1.0078125]);
/// assert_eq!(ops::add(&ops::linear(&x, &w, None)?, &r)?.to_vec()?, vec![1.0]);
/// # Ok::<(), graphed::Error>(())
/// ```
pub fn linear_residual(x: &Tensor, w: &Tensor, residual: &Tensor) -> Result<Tensor> {
    const OP: &str = "linear_residual";
    let dtype = check_like(OP, &[x, w, residual])?;
    let (rows, input, out) = check_linear(OP, x, w)?;
    let dims = out_dims(x, out);
    if residual.dims() != dims.as_slice() {
        return Err(Error::shape(
            OP,
            ShapeProblem::expected("residual", &dims, "the output of x and w", residual.dims()),
        ));
    }
    for t in [x, w, residual] {
        t.check_fresh()?;
    }
    n32(OP, rows * out)?;
    let y = Tensor::empty_as(x.device(), &dims, dtype)?;
    match exec(x.device()) {
        Exec::Host(h) => {
            let (xp, wp, rp, yp) = (x.host_ptr()?, w.host_ptr()?, residual.host_ptr()?, y.host_ptr()?);
            h.run(OP, move || {
                let product = cpu::linear(&xp.read(), &wp.read(), None, rows, input, out);
                // The f32 sum, rounded once to the dtype as it is stored.
                let sum: Vec<f32> = product.iter().zip(rp.read().iter()).map(|(p, r)| p + r).collect();
                yp.write(&sum);
                Ok(())
            })?;
        }
        Exec::Cuda(c) => {
            let (yp, rp) = (y.cuda_ptr()?, residual.cuda_ptr()?);
            let lt = LtLinear { residual: rp, ..lt_linear_of(OP, LtEpilogue::Plain, (x, w, &y), (rows, input, out))? };
            if !c.lt_linear(&lt)? {
                c.copy_device(yp, rp, rows * out * dtype.size())?;
                cuda_forward(c, OP, (x, w, &y), (rows, input, out), 1.0)?;
            }
        }
    }
    Ok(y)
}

/// The backward of [`linear`]: accumulates `dw += dyᵀ · x` and `db += Σ_rows dy` (so grads of
/// several passes add up, as in autograd), and returns `dx = dy · w` when `need_dx`.
///
/// `dy` is `[N, out]` (`[..., out]` matching `x`), `dw` has `w`'s shape `[out, in]`, `db` is
/// `[out]`. `dy`, `x` and `w` share one dtype; `dw` and `db` are always f32 (weight grads
/// accumulate in f32, as [`crate::Param`] grads are); `dx` is in the input dtype. On CUDA: two
/// GEMMs (`beta = 1` for `dw`, f32 accumulation) and a deterministic column-sum kernel for `db`
/// (no atomics, so replays are bitwise equal to eager runs).
///
/// ```
/// # use graphed::{ops, Device, Tensor};
/// let dev = Device::host();
/// let x = Tensor::from_slice(&dev, &[1.0, 2.0], &[1, 2])?;
/// let w = Tensor::from_slice(&dev, &[1.0, 0.0, 0.0, 1.0], &[2, 2])?;
/// let dy = Tensor::from_slice(&dev, &[1.0, 3.0], &[1, 2])?;
/// let (dw, db) = (Tensor::zeros(&dev, &[2, 2])?, Tensor::zeros(&dev, &[2])?);
/// let dx = ops::linear_backward(&dy, &x, &w, &dw, Some(&db), true)?.unwrap();
/// assert_eq!(dx.to_vec()?, vec![1.0, 3.0]);
/// assert_eq!(dw.to_vec()?, vec![1.0, 2.0, 3.0, 6.0]);
/// assert_eq!(db.to_vec()?, vec![1.0, 3.0]);
/// # Ok::<(), graphed::Error>(())
/// ```
pub fn linear_backward(
    dy: &Tensor,
    x: &Tensor,
    w: &Tensor,
    dw: &Tensor,
    db: Option<&Tensor>,
    need_dx: bool,
) -> Result<Option<Tensor>> {
    backward("linear_backward", (dy, x, w, dw, db), if need_dx { Dx::New } else { Dx::Skip })
}

/// [`linear_backward`] that adds the input grad into `dx` (`dx += dy · w`) instead of returning
/// a new tensor: the sum of several layers' input grads (a residual branch, or projections that
/// read the same input) in the GEMM itself (`beta = 1`, f32 accumulation, one rounding), with no
/// separate add. `dx` has `x`'s shape and dtype and shares no memory with `dy`, `x` or `w`
/// ([`Error::Overlap`]); everything is checked before anything runs.
///
/// ```
/// # use graphed::{ops, Device, Tensor};
/// let dev = Device::host();
/// let x = Tensor::from_slice(&dev, &[1.0, 2.0], &[1, 2])?;
/// let w = Tensor::from_slice(&dev, &[1.0, 0.0, 0.0, 1.0], &[2, 2])?;
/// let dy = Tensor::from_slice(&dev, &[1.0, 3.0], &[1, 2])?;
/// let dw = Tensor::zeros(&dev, &[2, 2])?;
/// let dx = Tensor::from_slice(&dev, &[10.0, 20.0], &[1, 2])?; // another branch's grad
/// ops::linear_backward_acc(&dy, &x, &w, &dw, None, &dx)?;
/// assert_eq!(dx.to_vec()?, vec![11.0, 23.0]);
/// # Ok::<(), graphed::Error>(())
/// ```
pub fn linear_backward_acc(
    dy: &Tensor,
    x: &Tensor,
    w: &Tensor,
    dw: &Tensor,
    db: Option<&Tensor>,
    dx: &Tensor,
) -> Result<()> {
    backward("linear_backward_acc", (dy, x, w, dw, db), Dx::Add(dx)).map(|_| ())
}

/// What a linear backward does with the input grad.
#[derive(Clone, Copy)]
enum Dx<'a> {
    Skip,
    New,
    Add(&'a Tensor),
}

/// The tensors of a linear backward: `(dy, x, w, dw, db)`.
type BackwardArgs<'a> = (&'a Tensor, &'a Tensor, &'a Tensor, &'a Tensor, Option<&'a Tensor>);

/// Checks a linear backward's tensors (with `dx` new when `need_dx`) as [`linear_backward`]
/// does, before anything runs: for a fused op that computes `dy` first.
pub(crate) fn check_linear_backward(op: &'static str, args: BackwardArgs<'_>, need_dx: bool) -> Result<()> {
    check_backward(op, args, if need_dx { Dx::New } else { Dx::Skip }).map(|_| ())
}

/// The checks of [`backward`]: the dtype, and the rows, input and output widths.
fn check_backward(
    op: &'static str,
    (dy, x, w, dw, db): BackwardArgs<'_>,
    mode: Dx<'_>,
) -> Result<(DType, usize, usize, usize)> {
    let dtype = check_like(op, &[dy, x, w])?;
    check_f32_on(op, dw, x)?;
    let (rows, input, out) = check_linear(op, x, w)?;
    if dy.dims() != out_dims(x, out).as_slice() {
        return Err(Error::shape(
            op,
            ShapeProblem::expected("dy", &out_dims(x, out), "the output of x and w", dy.dims()),
        ));
    }
    check_shape(op, dw, w)?;
    if let Some(db) = db {
        check_f32_on(op, db, x)?;
        check_vector(op, "db", db, out)?;
    }
    n32(op, rows * out.max(input))?;
    if let Dx::Add(acc) = mode {
        check_like(op, &[x, acc])?;
        if acc.dims() != x.dims() {
            return Err(Error::shape(op, ShapeProblem::same("dx", acc.dims(), "x", x.dims())));
        }
        for (name, t) in [("dy", dy), ("x", x), ("w", w)] {
            let ((pa, ra), (pb, rb)) = (acc.mem_range(), t.mem_range());
            if pa == pb && ra.overlaps(&rb) {
                return Err(Error::Overlap { op, output: "dx", input: name });
            }
        }
    }
    Ok((dtype, rows, input, out))
}

fn backward(op: &'static str, args: BackwardArgs<'_>, mode: Dx<'_>) -> Result<Option<Tensor>> {
    let (dtype, rows, input, out) = check_backward(op, args, mode)?;
    let (dy, x, w, dw, db) = args;
    let (dx, beta) = match mode {
        Dx::Skip => (None, 0.0),
        Dx::New => (Some(Tensor::empty_as(x.device(), x.dims(), dtype)?), 0.0),
        Dx::Add(acc) => (Some(acc.clone()), 1.0),
    };
    match exec(x.device()) {
        Exec::Host(h) => host_linear_backward(h, (dy, x, w, dw, db, dx.as_ref()), (rows, input, out), beta)?,
        Exec::Cuda(c) => {
            let tf32 = x.device().tf32();
            // dwᵀ[in, out] += xᵀ[in, N] · dy[N, out] (column-major: x is xᵀ with ld in, dy is
            // dyᵀ with ld out, so it is transposed).
            let (xo, dyo, dwo) = (operand(x, input)?, operand(dy, out)?, operand(dw, input)?);
            let g = GemmEx {
                op,
                trans_a: false,
                trans_b: true,
                m: input,
                n: out,
                k: rows,
                alpha: 1.0,
                a: xo,
                b: dyo,
                beta: 1.0,
                c: dwo,
                tf32,
            };
            c.gemm_ex(&g)?;
            if let Some(db) = db {
                c.launch(
                    k::COL_SUM_ACC.get(dtype),
                    col_dims(out),
                    &[KArg::Ptr(db.cuda_ptr()?), KArg::Ptr(dyo.ptr), KArg::U32(rows as u32), KArg::U32(out as u32)],
                )?;
            }
            if let Some(dx) = &dx {
                cuda_input_grad(c, op, (dy, w, dx), (rows, input, out), beta, tf32)?;
            }
        }
    }
    Ok(if matches!(mode, Dx::New) { dx } else { None })
}

/// The cublasLt GEMM `y = epilogue(x · wᵀ)` over these tensors (no bias, aux or residual: the
/// caller sets those it has).
pub(crate) fn lt_linear_of(
    op: &'static str,
    epilogue: LtEpilogue,
    (x, w, y): (&Tensor, &Tensor, &Tensor),
    (rows, input, out): (usize, usize, usize),
) -> Result<LtLinear> {
    Ok(LtLinear {
        op,
        epilogue,
        dtype: y.dtype(),
        tf32: x.device().tf32(),
        rows,
        input,
        out,
        x: x.cuda_ptr()?,
        w: w.cuda_ptr()?,
        y: y.cuda_ptr()?,
        bias: 0,
        aux: 0,
        residual: 0,
    })
}

/// `y = x · wᵀ` (`+ y` with `beta` 1) as one `cublasGemmEx`: every linear's forward GEMM.
fn cuda_forward(
    c: &CudaBackend,
    op: &'static str,
    (x, w, y): (&Tensor, &Tensor, &Tensor),
    (rows, input, out): (usize, usize, usize),
    beta: f32,
) -> Result<()> {
    // Row-major y = x wᵀ is column-major yᵀ[out, N] = w[out, in] · xᵀ[in, N], where w and x as
    // column-major are wᵀ (ld in) and xᵀ (ld in).
    let (a, b, cm) = (operand(w, input)?, operand(x, input)?, operand(y, out)?);
    c.gemm_ex(&GemmEx {
        op,
        trans_a: true,
        trans_b: false,
        m: out,
        n: rows,
        k: input,
        alpha: 1.0,
        a,
        b,
        beta,
        c: cm,
        tf32: x.device().tf32(),
    })
}

/// `dx = dy · w` (`+ dx` with `beta` 1) as one GEMM: the input-grad half of every linear backward.
fn cuda_input_grad(
    c: &CudaBackend,
    op: &'static str,
    (dy, w, dx): (&Tensor, &Tensor, &Tensor),
    (rows, input, out): (usize, usize, usize),
    beta: f32,
    tf32: bool,
) -> Result<()> {
    // dxᵀ[in, N] = wᵀ[in, out] · dyᵀ[out, N].
    let (wo, dyo, dxo) = (operand(w, input)?, operand(dy, out)?, operand(dx, input)?);
    c.gemm_ex(&GemmEx {
        op,
        trans_a: false,
        trans_b: false,
        m: input,
        n: rows,
        k: out,
        alpha: 1.0,
        a: wo,
        b: dyo,
        beta,
        c: dxo,
        tf32,
    })
}

/// The input grad of [`linear`] alone: `dx = dy · w`, what [`linear_backward`] returns as
/// `dx`, bit for bit, without touching a weight grad. With it a backward can take `dx` first and
/// the weight grad later, from an input it recomputes in between (as a block that recomputes its
/// SwiGLU output does: [`crate::ops::swiglu_backward_recompute`]) or in a split backward's
/// weight pass. `dy` is `[..., out]`, `w` `[out, in]`, one dtype; `dx` is `[..., in]` in it.
///
/// ```
/// # use graphed::{ops, Device, Tensor};
/// let dev = Device::host();
/// let x = Tensor::from_slice(&dev, &[1.0, 2.0], &[1, 2])?;
/// let w = Tensor::from_slice(&dev, &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[3, 2])?;
/// let dy = Tensor::from_slice(&dev, &[1.0, 0.0, -1.0], &[1, 3])?;
/// let dx = ops::linear_input_grad(&dy, &w)?;
/// assert_eq!(dx.dims(), &[1, 2]);
/// assert_eq!(dx.to_vec()?, vec![-4.0, -4.0]);
/// let dw = Tensor::zeros(&dev, &[3, 2])?;
/// let full = ops::linear_backward(&dy, &x, &w, &dw, None, true)?.unwrap();
/// assert_eq!(dx.to_vec()?, full.to_vec()?);
/// # Ok::<(), graphed::Error>(())
/// ```
pub fn linear_input_grad(dy: &Tensor, w: &Tensor) -> Result<Tensor> {
    const OP: &str = "linear_input_grad";
    let dtype = check_like(OP, &[dy, w])?;
    let (rows, out, input) = check_against_w(OP, "dy", dy, w, 0)?;
    n32(OP, rows * out.max(input))?;
    let dx = Tensor::empty_as(dy.device(), &out_dims(dy, input), dtype)?;
    match exec(dy.device()) {
        Exec::Host(h) => {
            let (dyp, wp, dxp) = (dy.host_ptr()?, w.host_ptr()?, dx.host_ptr()?);
            h.run(OP, move || {
                dxp.write(&cpu::linear_input_grad(&dyp.read(), &wp.read(), rows, input, out));
                Ok(())
            })?;
        }
        Exec::Cuda(c) => {
            cuda_input_grad(c, OP, (dy, w, &dx), (rows, input, out), 0.0, dy.device().tf32())?;
        }
    }
    Ok(dx)
}

type BackwardTensors<'a> = (&'a Tensor, &'a Tensor, &'a Tensor, &'a Tensor, Option<&'a Tensor>, Option<&'a Tensor>);

/// The host half of [`linear_backward`]: f32 math on the widened inputs; `dx` is rounded to
/// the input dtype on store (with `beta` 1, after adding what `dx` held), `dw` and `db`
/// accumulate in f32.
fn host_linear_backward(
    h: &crate::backend::HostBackend,
    (dy, x, w, dw, db, dx): BackwardTensors<'_>,
    (rows, input, out): (usize, usize, usize),
    beta: f32,
) -> Result<()> {
    let (dyp, xp, wp, dwp) = (dy.host_ptr()?, x.host_ptr()?, w.host_ptr()?, dw.host_ptr()?);
    let dbp = db.map(|b| b.host_ptr()).transpose()?;
    let dxp = dx.map(|t| t.host_ptr()).transpose()?;
    h.run("linear_backward", move || {
        let mut dwv = dwp.read();
        let mut dbv = dbp.as_ref().map(|b| b.read());
        let dxv = cpu::linear_backward(
            &dyp.read(),
            &xp.read(),
            &wp.read(),
            rows,
            input,
            out,
            &mut dwv,
            dbv.as_deref_mut(),
            dxp.is_some(),
        );
        dwp.write(&dwv);
        if let (Some(p), Some(v)) = (&dbp, &dbv) {
            p.write(v);
        }
        if let (Some(p), Some(v)) = (&dxp, &dxv) {
            if beta == 0.0 {
                p.write(v);
            } else {
                p.write(&p.read().iter().zip(v).map(|(a, b)| a + b).collect::<Vec<f32>>());
            }
        }
        Ok(())
    })
}

/// `y[..., j] = x[..., j] + b[j]`: adds the bias `b` (`[D]`) to every row of `x` (`[..., D]`).
/// Its backward for `b` is the column sum of `dy`, which [`linear_backward`] computes as `db`.
///
/// ```
/// # use graphed::{ops, Device, Tensor};
/// let dev = Device::host();
/// let x = Tensor::from_slice(&dev, &[1.0, 2.0, 3.0, 4.0], &[2, 2])?;
/// let b = Tensor::from_slice(&dev, &[10.0, 20.0], &[2])?;
/// assert_eq!(ops::bias_add(&x, &b)?.to_vec()?, vec![11.0, 22.0, 13.0, 24.0]);
/// # Ok::<(), graphed::Error>(())
/// ```
pub fn bias_add(x: &Tensor, b: &Tensor) -> Result<Tensor> {
    const OP: &str = "bias_add";
    let dtype = check_like(OP, &[x, b])?;
    let kernel = k::BIAS_ADD.get(dtype);
    check_rank1(OP, "x", x)?;
    let (_, d) = as_rows(x);
    check_vector(OP, "b", b, d)?;
    let n = n32(OP, x.numel())?;
    let y = Tensor::empty_like(x)?;
    match exec(x.device()) {
        Exec::Host(h) => {
            let (xp, bp, yp) = (x.host_ptr()?, b.host_ptr()?, y.host_ptr()?);
            h.run(kernel, move || {
                yp.write(&cpu::bias_add(&xp.read(), &bp.read(), d));
                Ok(())
            })?;
        }
        Exec::Cuda(c) => launch_bias_add(c, dtype, [y.cuda_ptr()?, x.cuda_ptr()?, b.cuda_ptr()?], n, d)?,
    }
    Ok(y)
}

/// `y = x + b` on CUDA, `b` broadcast over rows of `d`: `ptrs` are y, x and b (y may be x).
fn launch_bias_add(c: &CudaBackend, dtype: DType, ptrs: [u64; 3], n: u32, d: usize) -> Result<()> {
    let [y, x, b] = ptrs.map(KArg::Ptr);
    let args = [y, x, b, KArg::U32(n), KArg::U32(d as u32)];
    c.launch(k::BIAS_ADD.get(dtype), LaunchDims::vectorized(n as usize, dtype), &args)
}
