//! Fused attention: the FlashAttention-2 algorithm on tensor cores (`kernels/flash.cu`), causal
//! or not, with grouped key/value heads. Nothing of size `seq²` is ever stored: the forward
//! keeps the row logsumexp, the backward recomputes the probabilities tile by tile.

use crate::backend::cudnn::SdpaPass;
use crate::backend::{BuiltinKernel as B, CudaBackend, FlashTiles, HostPtr, KArg, LaunchDims};
use crate::ops::attention::check_lse;
use crate::ops::cpu::{self, AttnDims, AttnShape};
use crate::ops::{at_most, check_like, exec, Exec};
use crate::{AttentionLimit, DType, Device, Error, Result, ShapeProblem, Tensor};

use super::flash_engine::{self, AttentionEngine, PassCall};
use super::flash_hopper;
use crate::backend::cuda_hopper::HopperBwd;

/// What [`flash_attention`] computes: how many query heads, how many key/value heads (grouped-
/// query attention when fewer; each serves `heads / kv_heads` consecutive query heads), and
/// whether position `i` attends to positions `j <= i` only.
///
/// ```
/// # use graphed::ops::Attention;
/// let mha = Attention::causal(8);                 // 8 query heads, 8 key/value heads
/// let gqa = Attention::causal(8).kv_heads(2);     // 8 query heads share 2 key/value heads
/// let full = Attention::full(8);                  // no mask (an encoder)
/// assert!(mha.causal && !full.causal && gqa.kv_heads == 2);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Attention {
    /// Query heads.
    pub heads: usize,
    /// Key/value heads: divides `heads`.
    pub kv_heads: usize,
    /// Causal mask.
    pub causal: bool,
    /// Which implementation runs it on CUDA ([`AttentionEngine::Auto`] unless set).
    pub engine: AttentionEngine,
}

impl Attention {
    /// Causal attention with `heads` query and key/value heads.
    pub fn causal(heads: usize) -> Attention {
        Attention { heads, kv_heads: heads, causal: true, engine: AttentionEngine::Auto }
    }

    /// Attention without a mask, `heads` query and key/value heads.
    pub fn full(heads: usize) -> Attention {
        Attention { heads, kv_heads: heads, causal: false, engine: AttentionEngine::Auto }
    }

    /// The same with `kv_heads` key/value heads (grouped-query attention).
    pub fn kv_heads(self, kv_heads: usize) -> Attention {
        Attention { kv_heads, ..self }
    }

    /// The same, run by `engine` on CUDA.
    pub fn engine(self, engine: AttentionEngine) -> Attention {
        Attention { engine, ..self }
    }

    /// The head dimensions the fused kernels are built for.
    pub const HEAD_DIMS: [usize; 2] = FlashTiles::HEAD_DIMS;

    /// Whether [`flash_attention`] runs inputs of `dtype` with `head_dim` features a head
    /// (bf16 or f16, head dim 64 or 128; on CUDA the GPU must also be sm_80 or newer).
    pub fn supports(dtype: DType, head_dim: usize) -> bool {
        dtype != DType::F32 && Self::HEAD_DIMS.contains(&head_dim)
    }
}

/// Checks q (`[batch, seq, heads · D]`), k and v (`[batch, seq, kv_heads · D]`); returns the
/// shape and dtype.
pub(super) fn check_qkv(
    op: &'static str,
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    at: &Attention,
) -> Result<(AttnShape, DType)> {
    let dtype = check_like(op, &[q, k, v])?;
    let (&[batch, seq, width], &[kb, ks, kw]) = (q.dims(), k.dims()) else {
        let (arg, t) = if q.dims().len() != 3 { ("q", q) } else { ("k", k) };
        return Err(Error::shape(op, ShapeProblem::layout(arg, "[batch, seq, width]", t.dims())));
    };
    if v.dims() != k.dims() {
        return Err(Error::shape(op, ShapeProblem::same("v", v.dims(), "k", k.dims())));
    }
    if at.heads == 0 || at.kv_heads == 0 || !at.heads.is_multiple_of(at.kv_heads) {
        return Err(Error::shape(op, ShapeProblem::Heads { heads: at.heads, kv_heads: at.kv_heads }));
    }
    if batch == 0 || seq == 0 || width == 0 || width % at.heads != 0 {
        return Err(Error::shape(op, ShapeProblem::Width { arg: "q", got: q.dims().to_vec(), heads: at.heads }));
    }
    let head_dim = width / at.heads;
    if (kb, ks, kw) != (batch, seq, at.kv_heads * head_dim) {
        let want = [batch, seq, at.kv_heads * head_dim];
        return Err(Error::shape(
            op,
            ShapeProblem::expected("k", &want, "[batch, seq, kv_heads · head_dim]", k.dims()),
        ));
    }
    if !Attention::supports(dtype, head_dim) {
        return Err(Error::AttentionUnsupported { op, dtype, head_dim, limit: None });
    }
    // The grid's y and z dimensions hold at most 65535 blocks; positions are 31-bit.
    at_most(op, "batch", batch, 65535)?;
    at_most(op, "head count", at.heads, 65535)?;
    at_most(op, "sequence length", seq, u32::MAX as usize / 2)?;
    let dims = AttnDims { batch, seq, heads: at.heads, head_dim };
    Ok((AttnShape { dims, kv_heads: at.kv_heads, causal: at.causal }, dtype))
}

fn lse_dims(a: AttnShape) -> [usize; 3] {
    [a.dims.batch, a.dims.heads, a.dims.seq]
}

/// Checks a packed `qkv` (`[batch, seq, (heads + 2 · kv_heads) · D]`: q's columns, then k's,
/// then v's); returns the shape and dtype.
fn check_packed(op: &'static str, qkv: &Tensor, at: &Attention) -> Result<(AttnShape, DType)> {
    let dtype = check_like(op, &[qkv])?;
    let &[batch, seq, width] = qkv.dims() else {
        return Err(Error::shape(
            op,
            ShapeProblem::layout("qkv", "[batch, seq, (heads + 2·kv_heads) · head_dim]", qkv.dims()),
        ));
    };
    if at.heads == 0 || at.kv_heads == 0 || !at.heads.is_multiple_of(at.kv_heads) {
        return Err(Error::shape(op, ShapeProblem::Heads { heads: at.heads, kv_heads: at.kv_heads }));
    }
    let blocks = at.heads + 2 * at.kv_heads;
    // The width in `heads + 2 · kv_heads` blocks of one head dimension, and rows to attend.
    if batch == 0 || seq == 0 || width == 0 || width % blocks != 0 {
        return Err(Error::shape(op, ShapeProblem::Width { arg: "qkv", got: qkv.dims().to_vec(), heads: blocks }));
    }
    let head_dim = width / blocks;
    let a = AttnShape {
        dims: AttnDims { batch, seq, heads: at.heads, head_dim },
        kv_heads: at.kv_heads,
        causal: at.causal,
    };
    if !Attention::supports(dtype, head_dim) {
        return Err(Error::AttentionUnsupported { op, dtype, head_dim, limit: None });
    }
    at_most(op, "batch", batch, 65535)?;
    at_most(op, "head count", at.heads, 65535)?;
    at_most(op, "sequence length", seq, u32::MAX as usize / 2)?;
    Ok((a, dtype))
}

/// Where a call's q, k and v lie: three tensors, or the column blocks of one packed tensor.
#[derive(Clone, Copy)]
enum Qkv<'a> {
    Separate([&'a Tensor; 3]),
    Packed(&'a Tensor),
}

impl<'a> Qkv<'a> {
    /// q, or the packed tensor: the call's device and dtype.
    fn first(self) -> &'a Tensor {
        match self {
            Qkv::Separate([q, _, _]) | Qkv::Packed(q) => q,
        }
    }

    /// The row strides, in elements, of q and of k and v (and of their grads).
    fn lds(self, a: AttnShape) -> [usize; 2] {
        let d = a.dims.head_dim;
        match self {
            Qkv::Separate(_) => [a.dims.heads * d, a.kv_heads * d],
            Qkv::Packed(_) => [(a.dims.heads + 2 * a.kv_heads) * d; 2],
        }
    }

    /// The byte offsets of k's and v's first columns from q's (packed), or `None`.
    fn block_offsets(self, a: AttnShape, dtype: DType) -> Option<[u64; 2]> {
        let d = a.dims.head_dim * dtype.size();
        matches!(self, Qkv::Packed(_)).then(|| [a.dims.heads * d, (a.dims.heads + a.kv_heads) * d].map(|x| x as u64))
    }

    /// The device addresses of q, k and v.
    fn cuda_ptrs(self, a: AttnShape, dtype: DType) -> Result<[u64; 3]> {
        match self {
            Qkv::Separate(ts) => {
                let [q, k, v] = ts.map(Tensor::cuda_ptr);
                Ok([q?, k?, v?])
            }
            Qkv::Packed(t) => {
                let base = t.cuda_ptr()?;
                let [k, v] = self.block_offsets(a, dtype).unwrap_or_default();
                Ok([base, base + k, base + v])
            }
        }
    }

    /// Fresh grads of q, k and v: three tensors, or one of the packed tensor's shape.
    fn grads(self) -> Result<Vec<Tensor>> {
        match self {
            Qkv::Separate(ts) => ts.iter().map(|t| Tensor::empty_like(t)).collect(),
            Qkv::Packed(t) => Ok(vec![Tensor::empty_like(t)?]),
        }
    }

    /// q, k and v on the host backend, to be read when the host runs the work.
    fn host(self) -> Result<HostQkv> {
        Ok(match self {
            Qkv::Separate(ts) => {
                let [q, k, v] = ts.map(Tensor::host_ptr);
                HostQkv::Separate([q?, k?, v?])
            }
            Qkv::Packed(t) => HostQkv::Packed(t.host_ptr()?),
        })
    }
}

/// [`Qkv`] on the host backend.
enum HostQkv {
    Separate([HostPtr; 3]),
    Packed(HostPtr),
}

impl HostQkv {
    fn read(&self, a: AttnShape) -> [Vec<f32>; 3] {
        match self {
            HostQkv::Separate(ps) => ps.each_ref().map(HostPtr::read),
            HostQkv::Packed(p) => cpu::unpack_qkv(&p.read(), a),
        }
    }
}

/// Writes the CPU reference's grads into `outs`: three tensors, or one packed.
fn write_host_grads(outs: &[HostPtr], [gq, gk, gv]: [Vec<f32>; 3], a: AttnShape) {
    match outs {
        [packed] => packed.write(&cpu::pack_qkv(&gq, &gk, &gv, a)),
        outs => {
            for (o, g) in outs.iter().zip([gq, gk, gv]) {
                o.write(&g);
            }
        }
    }
}

/// The device addresses of the grads [`Qkv::grads`] made.
fn grad_ptrs(grads: &[Tensor], a: AttnShape, dtype: DType) -> Result<[u64; 3]> {
    match grads {
        [packed] => Qkv::Packed(packed).cuda_ptrs(a, dtype),
        [dq, dk, dv] => Qkv::Separate([dq, dk, dv]).cuda_ptrs(a, dtype),
        _ => Err(Error::msg("flash attention: grads are one tensor or three")),
    }
}

/// Fused scaled-dot-product attention: per head, `P = softmax(Q·Kᵀ / sqrt(head_dim))` (causally
/// masked when `at.causal`), `out = P·V`, in one kernel that streams K and V through shared
/// memory and never stores `P` (FlashAttention-2 on `mma.sync` tensor cores).
///
/// `q` is `[batch, seq, heads · head_dim]`, `k` and `v` `[batch, seq, kv_heads · head_dim]`
/// (the outputs of linear layers, heads side by side), all bf16 or f16 with head_dim 64 or 128
/// (else [`Error::AttentionUnsupported`]; [`causal_attention`](crate::ops::causal_attention)
/// runs any shape and f32). Returns `(out, lse)`: `out` of `q`'s shape and dtype and `lse`, f32
/// `[batch, heads, seq]`, each row's logsumexp of its scaled, masked scores, which the backward
/// rebuilds the probabilities from. Products accumulate in f32; `P` is rounded to the dtype
/// before `P·V`. No atomics: replays are bitwise equal to eager runs. On the host backend the
/// CPU reference ([`cpu::attention`]) runs. When q, k and v come from one projection,
/// [`flash_attention_packed`] reads them in place.
///
/// ```
/// # use graphed::{ops, ops::Attention, DType, Device, Tensor};
/// let dev = Device::host();
/// let x: Vec<f32> = (0..2 * 3 * 64).map(|i| (i as f32 * 0.37).sin()).collect();
/// let q = Tensor::from_slice_as(&dev, &x, &[1, 3, 128], DType::BF16)?; // 2 heads of 64
/// let (out, lse) = ops::flash_attention(&q, &q, &q, &Attention::causal(2))?;
/// assert_eq!((out.dims(), lse.dims()), (&[1, 3, 128][..], &[1, 2, 3][..]));
/// // The first position sees only itself: its output is its own value row.
/// assert_eq!(out.to_vec()?[..64], q.to_vec()?[..64]);
/// # Ok::<(), graphed::Error>(())
/// ```
pub fn flash_attention(q: &Tensor, k: &Tensor, v: &Tensor, at: &Attention) -> Result<(Tensor, Tensor)> {
    const OP: &str = "flash_attention";
    let (a, dtype) = check_qkv(OP, q, k, v, at)?;
    forward(OP, at, a, dtype, Qkv::Separate([q, k, v]))
}

/// [`flash_attention`] on q, k and v packed in one tensor, as one projection with the three
/// weights stacked (`[q; k; v]`, `(heads + 2 · kv_heads) · head_dim` rows) makes them: `qkv`
/// is `[batch, seq, (heads + 2 · kv_heads) · head_dim]`, each row q's columns, then k's, then
/// v's. The kernels read the blocks in place (no split): the same results, bit for bit, as
/// [`flash_attention`] on the three blocks copied out. Returns `(out, lse)`, `out`
/// `[batch, seq, heads · head_dim]`. The head dimension is `width / (heads + 2 · kv_heads)`;
/// the errors are [`flash_attention`]'s.
///
/// ```
/// # use graphed::{ops, ops::Attention, DType, Device, Tensor};
/// let dev = Device::host();
/// let x: Vec<f32> = (0..2 * 192).map(|i| (i as f32 * 0.37).sin()).collect();
/// let qkv = Tensor::from_slice_as(&dev, &x, &[1, 2, 3 * 64], DType::BF16)?; // 1 head of 64
/// let (out, lse) = ops::flash_attention_packed(&qkv, &Attention::causal(1))?;
/// assert_eq!((out.dims(), lse.dims()), (&[1, 2, 64][..], &[1, 1, 2][..]));
/// # Ok::<(), graphed::Error>(())
/// ```
pub fn flash_attention_packed(qkv: &Tensor, at: &Attention) -> Result<(Tensor, Tensor)> {
    const OP: &str = "flash_attention_packed";
    let (a, dtype) = check_packed(OP, qkv, at)?;
    forward(OP, at, a, dtype, Qkv::Packed(qkv))
}

/// Which implementation runs a pass on CUDA: cuDNN's plan, or the portable kernels with their
/// tiles. Settled before the op allocates anything, so that a refusal (cuDNN asked for where it
/// cannot run, a GPU without the kernels' shared memory) leaves the pool as it was.
enum Route {
    Cudnn(flash_engine::CudnnPlan),
    Portable(FlashTiles),
    Hopper(HopperBwd),
}

impl Route {
    fn of(c: &CudaBackend, call: PassCall<'_>) -> Result<Route> {
        if let Some(k) = flash_engine::hopper_kernels(c, call)? {
            return Ok(Route::Hopper(k));
        }
        match flash_engine::cudnn_plan(c, call)? {
            Some(plan) => Ok(Route::Cudnn(plan)),
            None => Ok(Route::Portable(check_device(call.op, c, call.dtype, call.a)?)),
        }
    }
}

fn forward(op: &'static str, at: &Attention, a: AttnShape, dtype: DType, qkv: Qkv<'_>) -> Result<(Tensor, Tensor)> {
    let dev = qkv.first().device();
    let d = a.dims;
    let outputs = || -> Result<(Tensor, Tensor)> {
        Ok((Tensor::empty_as(dev, &[d.batch, d.seq, d.heads * d.head_dim], dtype)?, Tensor::empty(dev, &lse_dims(a))?))
    };
    match exec(dev) {
        Exec::Host(h) => {
            let (out, lse) = outputs()?;
            let ins = qkv.host()?;
            let (op, lp) = (out.host_ptr()?, lse.host_ptr()?);
            h.run(fwd_kernel(dtype, a.dims.head_dim, FlashTiles::of(a.dims.head_dim)), move || {
                let [q, k, v] = ins.read(a);
                let (o, l) = cpu::attention(&q, &k, &v, a, dtype);
                op.write(&o);
                lp.write(&l);
                Ok(())
            })?;
            Ok((out, lse))
        }
        Exec::Cuda(c) => {
            let packed = qkv.block_offsets(a, dtype).is_some();
            let route = Route::of(c, PassCall { op, at, a, dtype, pass: SdpaPass::Forward, packed })?;
            let (out, lse) = outputs()?;
            let ptrs = qkv.cuda_ptrs(a, dtype)?;
            let io = [out.cuda_ptr()?, lse.cuda_ptr()?];
            match route {
                Route::Cudnn(plan) => flash_engine::forward(c, plan, ptrs, io, dev)?,
                Route::Portable(tiles) => {
                    let mut args: Vec<KArg> = io.into_iter().chain(ptrs).map(KArg::Ptr).collect();
                    args.extend(sizes(a, qkv.lds(a)));
                    let smem = tiles.smem(a.dims.head_dim)[0];
                    let grid = tile_grid(a, a.dims.heads, tiles.fwd, smem);
                    c.launch(fwd_kernel(dtype, a.dims.head_dim, tiles), grid, &args)?;
                }
                // `hopper_kernels` answers for the backward only.
                Route::Hopper(_) => return Err(Error::msg("flash_attention: the Hopper engine has no forward kernel")),
            }
            Ok((out, lse))
        }
    }
}

/// The backward of [`flash_attention`] from its saved `out` and `lse`: returns `(dq, dk, dv)`
/// of `q`'s, `k`'s and `v`'s shapes and dtype. Three kernels: `D = rowsum(dO ∘ out)`, then one
/// pass per key tile that accumulates `dK` and `dV` over the query tiles (and over the query
/// heads that share its key/value head), and one per query tile that accumulates `dQ` over the
/// key tiles, each recomputing `P = exp(scale · Q·Kᵀ - lse)` and `dS = P ∘ (dP - D)`. No atomics,
/// so the grads are bitwise reproducible, run to run and between eager and replay.
///
/// ```
/// # use graphed::{ops, ops::Attention, DType, Device, Tensor};
/// let dev = Device::host();
/// let x: Vec<f32> = (0..4 * 64).map(|i| (i as f32 * 0.21).cos()).collect();
/// let q = Tensor::from_slice_as(&dev, &x, &[1, 4, 64], DType::BF16)?;
/// let at = Attention::causal(1);
/// let (out, lse) = ops::flash_attention(&q, &q, &q, &at)?;
/// let (dq, dk, dv) = ops::flash_attention_backward(&out, &q, &q, &q, &out, &lse, &at)?;
/// assert!(dq.dims() == q.dims() && dk.dims() == q.dims() && dv.dims() == q.dims());
/// # Ok::<(), graphed::Error>(())
/// ```
pub fn flash_attention_backward(
    dout: &Tensor,
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    out: &Tensor,
    lse: &Tensor,
    at: &Attention,
) -> Result<(Tensor, Tensor, Tensor)> {
    const OP: &str = "flash_attention_backward";
    let (a, dtype) = check_qkv(OP, q, k, v, at)?;
    let mut grads = backward(OP, at, a, dtype, Qkv::Separate([q, k, v]), [dout, out, lse])?.into_iter();
    match (grads.next(), grads.next(), grads.next()) {
        (Some(dq), Some(dk), Some(dv)) => Ok((dq, dk, dv)),
        _ => Err(Error::msg("flash_attention_backward: three grads expected")),
    }
}

/// The backward of [`flash_attention_packed`] from its saved `out` and `lse`: returns `dqkv`,
/// the grads of q, k and v packed as `qkv` is (`dq`'s columns, then `dk`'s, then `dv`'s), the
/// input of one weight-grad GEMM and one input-grad GEMM against the stacked weight. The kernels
/// write the blocks in place; the bits are [`flash_attention_backward`]'s.
///
/// ```
/// # use graphed::{ops, ops::Attention, DType, Device, Tensor};
/// let dev = Device::host();
/// let x: Vec<f32> = (0..4 * 192).map(|i| (i as f32 * 0.21).cos()).collect();
/// let qkv = Tensor::from_slice_as(&dev, &x, &[1, 4, 192], DType::BF16)?;
/// let at = Attention::causal(1);
/// let (out, lse) = ops::flash_attention_packed(&qkv, &at)?;
/// let dqkv = ops::flash_attention_packed_backward(&out, &qkv, &out, &lse, &at)?;
/// assert_eq!(dqkv.dims(), qkv.dims());
/// # Ok::<(), graphed::Error>(())
/// ```
pub fn flash_attention_packed_backward(
    dout: &Tensor,
    qkv: &Tensor,
    out: &Tensor,
    lse: &Tensor,
    at: &Attention,
) -> Result<Tensor> {
    const OP: &str = "flash_attention_packed_backward";
    let (a, dtype) = check_packed(OP, qkv, at)?;
    let mut grads = backward(OP, at, a, dtype, Qkv::Packed(qkv), [dout, out, lse])?;
    grads.pop().ok_or_else(|| Error::msg("flash_attention_packed_backward: no grad"))
}

/// The checks of the saved tensors, then the backward on either backend: three grads for
/// separate inputs, one packed.
fn backward(
    op: &'static str,
    at: &Attention,
    a: AttnShape,
    dtype: DType,
    qkv: Qkv<'_>,
    [dout, out, lse]: [&Tensor; 3],
) -> Result<Vec<Tensor>> {
    let d = a.dims;
    let first = qkv.first();
    check_like(op, &[first, dout, out])?;
    let want = [d.batch, d.seq, d.heads * d.head_dim];
    for (name, t) in [("dout", dout), ("out", out)] {
        if t.dims() != want {
            return Err(Error::shape(
                op,
                ShapeProblem::expected(name, &want, "[batch, seq, heads · head_dim]", t.dims()),
            ));
        }
    }
    check_lse(op, lse, first, lse_dims(a))?;
    match exec(first.device()) {
        Exec::Host(h) => {
            let grads = qkv.grads()?;
            let ins = qkv.host()?;
            let (dop, op_, lp) = (dout.host_ptr()?, out.host_ptr()?, lse.host_ptr()?);
            let outs = grads.iter().map(Tensor::host_ptr).collect::<Result<Vec<_>>>()?;
            let kernel = dq_kernel(dtype, d.head_dim, FlashTiles::of(d.head_dim));
            h.run(kernel, move || {
                let [q, k, v] = ins.read(a);
                let (dout, out, lse) = (dop.read(), op_.read(), lp.read());
                let saved = cpu::AttnSaved { dout: &dout, q: &q, k: &k, v: &v, out: &out, lse: &lse };
                let (gq, gk, gv) = cpu::attention_backward(saved, a, dtype);
                write_host_grads(&outs, [gq, gk, gv], a);
                Ok(())
            })?;
            Ok(grads)
        }
        Exec::Cuda(c) => {
            let packed = qkv.block_offsets(a, dtype).is_some();
            let route = Route::of(c, PassCall { op, at, a, dtype, pass: SdpaPass::Backward, packed })?;
            let grads = qkv.grads()?;
            let ins = qkv.cuda_ptrs(a, dtype)?;
            let gp = grad_ptrs(&grads, a, dtype)?;
            let saved = [dout.cuda_ptr()?, out.cuda_ptr()?, lse.cuda_ptr()?];
            let dev = first.device();
            match route {
                Route::Cudnn(plan) => flash_engine::backward(c, plan, a, ins, saved, gp, dev)?,
                Route::Portable(tiles) => backward_cuda(c, a, dtype, tiles, qkv.lds(a), ins, saved, gp, dev)?,
                Route::Hopper(k) => {
                    let dsum = dsum(c, a, dtype, saved, dev)?;
                    let saved = [saved[0], saved[2], dsum.cuda_ptr()?];
                    flash_hopper::backward(c, &k, a, dtype, qkv.lds(a), ins, saved, gp, dev)?;
                }
            }
            Ok(grads)
        }
    }
}

/// `D = rowsum(dO ∘ out)`, f32 `[batch, heads, seq]`: the first kernel of every backward of
/// ours, from the addresses of dO and out (`saved`: dO, out, lse).
fn dsum(c: &CudaBackend, a: AttnShape, dtype: DType, [dop, op, _]: [u64; 3], dev: &Device) -> Result<Tensor> {
    let d = a.dims;
    let dsum = Tensor::empty(dev, &lse_dims(a))?;
    let tokens = d.batch * d.seq;
    let prep = if dtype == DType::BF16 { B::FlashBwdPrepBf16 } else { B::FlashBwdPrepF16 };
    let prep_args = [KArg::Ptr(dsum.cuda_ptr()?), KArg::Ptr(dop), KArg::Ptr(op)]
        .into_iter()
        .chain([tokens, d.seq, d.heads, d.head_dim].map(|n| KArg::U32(n as u32)));
    // One thread per 16 bytes of dout (flash.cu: the threads of a row sum with shuffles).
    c.launch(prep, LaunchDims::elementwise(tokens * d.heads * d.head_dim / 8), &prep_args.collect::<Vec<_>>())?;
    Ok(dsum)
}

/// The portable backward kernels: `D = rowsum(dO ∘ out)`, then dK/dV, then dQ.
#[allow(clippy::too_many_arguments)]
fn backward_cuda(
    c: &CudaBackend,
    a: AttnShape,
    dtype: DType,
    tiles: FlashTiles,
    lds: [usize; 2],
    [qp, kp, vp]: [u64; 3],
    [dop, op, lp]: [u64; 3],
    [dqp, dkp, dvp]: [u64; 3],
    dev: &Device,
) -> Result<()> {
    let d = a.dims;
    let dsum = dsum(c, a, dtype, [dop, op, lp], dev)?;
    let sp = dsum.cuda_ptr()?;
    let [_, dq_smem, dkv_smem] = tiles.smem(d.head_dim);
    let common = [qp, kp, vp, dop, lp, sp].map(KArg::Ptr);
    let mut args = vec![KArg::Ptr(dkp), KArg::Ptr(dvp)];
    args.extend(common);
    args.extend(sizes(a, lds));
    c.launch(dkdv_kernel(dtype, d.head_dim, tiles), tile_grid(a, a.kv_heads, tiles.dkv, dkv_smem), &args)?;
    let mut args = vec![KArg::Ptr(dqp)];
    args.extend(common);
    args.extend(sizes(a, lds));
    c.launch(dq_kernel(dtype, d.head_dim, tiles), tile_grid(a, d.heads, tiles.dq, dq_smem), &args)?;
    Ok(())
}

/// The tiles for this call ([`FlashTiles::for_call`]); refuses a GPU the kernels cannot run on
/// (before sm_80, or too little shared memory for them).
fn check_device(op: &'static str, c: &CudaBackend, dtype: DType, a: AttnShape) -> Result<FlashTiles> {
    let head_dim = a.dims.head_dim;
    let tiles = FlashTiles::for_call(head_dim, a.dims.batch * a.dims.heads, a.dims.seq, c.sm_count);
    let need = tiles.smem(head_dim).into_iter().max().unwrap_or(0);
    let (major, minor) = c.capability;
    if major < 8 || need > c.max_shared_optin {
        let limit = AttentionLimit::Gpu {
            capability: (major as u32, minor as u32),
            shared_bytes: c.max_shared_optin,
            needed_bytes: need,
        };
        return Err(Error::AttentionUnsupported { op, dtype, head_dim, limit: Some(limit) });
    }
    Ok(tiles)
}

/// `seq, heads, kv_heads, qld, kvld, causal, scale`: the kernels' trailing arguments (`lds`:
/// the row strides of q and of k and v, [`Qkv::lds`]).
pub(super) fn sizes(a: AttnShape, [qld, kvld]: [usize; 2]) -> [KArg; 7] {
    let d = a.dims;
    [
        KArg::U32(d.seq as u32),
        KArg::U32(d.heads as u32),
        KArg::U32(a.kv_heads as u32),
        KArg::U32(qld as u32),
        KArg::U32(kvld as u32),
        KArg::U32(a.causal as u32),
        KArg::F32(d.scale()),
    ]
}

/// One block per tile of the sequence (`FlashTiles::rows` rows), per head, per sequence.
fn tile_grid(a: AttnShape, heads: usize, shape: (usize, usize, usize), smem: usize) -> LaunchDims {
    let tiles = a.dims.seq.div_ceil(FlashTiles::rows(shape)) as u32;
    LaunchDims {
        grid: (tiles, heads as u32, a.dims.batch as u32),
        block: (32 * shape.1 as u32, 1, 1),
        shared: smem as u32,
    }
}

/// One of a kernel's builds: `[bf16 d64, bf16 d128, f16 d64, f16 d128]` of the large-grid
/// set, `[bf16, f16]` of the small-grid one (head dim 64 only).
fn build(dtype: DType, head_dim: usize, tiles: FlashTiles, [b64, b128, h64, h128]: [B; 4], [sb, sh]: [B; 2]) -> B {
    match (dtype == DType::BF16, tiles.small, head_dim == 64) {
        (true, true, _) => sb,
        (false, true, _) => sh,
        (true, false, true) => b64,
        (true, false, false) => b128,
        (false, false, true) => h64,
        (false, false, false) => h128,
    }
}

fn fwd_kernel(dtype: DType, head_dim: usize, tiles: FlashTiles) -> B {
    let large = [B::FlashFwdBf16D64, B::FlashFwdBf16D128, B::FlashFwdF16D64, B::FlashFwdF16D128];
    build(dtype, head_dim, tiles, large, [B::FlashFwdSBf16D64, B::FlashFwdSF16D64])
}

fn dq_kernel(dtype: DType, head_dim: usize, tiles: FlashTiles) -> B {
    let large = [B::FlashBwdDqBf16D64, B::FlashBwdDqBf16D128, B::FlashBwdDqF16D64, B::FlashBwdDqF16D128];
    build(dtype, head_dim, tiles, large, [B::FlashBwdDqSBf16D64, B::FlashBwdDqSF16D64])
}

fn dkdv_kernel(dtype: DType, head_dim: usize, tiles: FlashTiles) -> B {
    let large = [B::FlashBwdDkdvBf16D64, B::FlashBwdDkdvBf16D128, B::FlashBwdDkdvF16D64, B::FlashBwdDkdvF16D128];
    build(dtype, head_dim, tiles, large, [B::FlashBwdDkdvSBf16D64, B::FlashBwdDkdvSF16D64])
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each (dtype, head dim, tile set) picks the build of its own name, for all three kernels.
    #[test]
    fn every_build_is_picked_by_its_dtype_head_dim_and_set() {
        for (dtype, tag) in [(DType::BF16, "_bf16_"), (DType::F16, "_f16_")] {
            for d in Attention::HEAD_DIMS {
                let sets = [Some(FlashTiles::of(d)), FlashTiles::small(d)];
                for tiles in sets.into_iter().flatten() {
                    for k in [fwd_kernel(dtype, d, tiles), dq_kernel(dtype, d, tiles), dkdv_kernel(dtype, d, tiles)] {
                        let name = k.name();
                        assert!(name.contains(tag) && name.ends_with(&format!("_d{d}")), "{name}");
                        assert_eq!(name.contains("_s_"), tiles.small, "{name}");
                    }
                }
            }
        }
    }

    /// Few (batch, head) pairs take the small-grid set at head dim 64; many, and head dim 128,
    /// the large one.
    #[test]
    fn small_grids_take_the_small_tiles() {
        assert!(FlashTiles::for_call(64, 8, 4096, 132).small); // the GPT at 4096: 256 blocks
        assert!(!FlashTiles::for_call(64, 128, 4096, 132).small); // 4096 blocks
        assert!(!FlashTiles::for_call(128, 8, 4096, 132).small); // no small set at 128
    }
}
