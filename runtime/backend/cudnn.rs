//! cuDNN's fused attention: the scaled-dot-product graphs that cuDNN's runtime-fusion engines
//! run (the kernels behind PyTorch's cuDNN SDPA backend and Transformer Engine on Hopper),
//! built through cuDNN's backend graph API. libcudnn is loaded at run time when present; when
//! it is not, or cuDNN has no engine for a call, `ops::flash` runs the portable kernels.
//!
//! The graphs are the ones cudnn-frontend lowers its SDPA nodes to (matmul, pointwise and
//! reduction operations over virtual tensors, which cuDNN fuses into one kernel). The backward
//! is the variant with a dP workspace unless a key asks otherwise: `dQ = dS·K` is written by
//! cuDNN without floating-point atomics, so its grads are the same bits run to run; the other
//! variant (PyTorch's, `AttentionEngine::CudnnNondeterministic`) adds `dQ` into a zeroed f32
//! accumulator with atomics.

use std::collections::HashMap;
use std::ffi::c_void;
use std::ptr;
use std::sync::Mutex;

use cudarc::cudnn::{result::CudnnError, sys};
use cudarc::driver::sys as cu;

use super::cuda::CudaBackend;
use super::fault::FaultPoint;
use crate::{DType, Error, Result};

type Attr = sys::cudnnBackendAttributeName_t;
type AType = sys::cudnnBackendAttributeType_t;
type Kind = sys::cudnnBackendDescriptorType_t;
type Dt = sys::cudnnDataType_t;
type Pw = sys::cudnnPointwiseMode_t;

/// The oldest libcudnn whose fused attention graphs these are (cuDNN 9: the backend API as
/// cudnn-frontend 1.x uses it, `-inf` as the mask value).
const MIN_VERSION: usize = 91000;

/// How many of the heuristics' plans a timed choice (`GRAPHED_ATTENTION_TUNE=1`) tries, and
/// `GRAPHED_CUDNN_DEBUG=1` reports.
pub(super) const TUNE_PLANS: usize = 8;

fn check(call: &'static str, status: sys::cudnnStatus_t) -> Result<()> {
    if status == sys::cudnnStatus_t::CUDNN_STATUS_SUCCESS {
        Ok(())
    } else {
        Err(Error::cuda(call, CudnnError(status)))
    }
}

/// One backend descriptor, destroyed when dropped.
struct Desc(sys::cudnnBackendDescriptor_t);

// SAFETY: a backend descriptor is host memory that cuDNN reads only in the calls it is passed
// to; the `Mutex` around [`Cudnn`] keeps those calls from running concurrently.
unsafe impl Send for Desc {}

impl Drop for Desc {
    fn drop(&mut self) {
        // SAFETY: created by `Desc::new`, destroyed once; only host memory is released.
        let _ = unsafe { sys::cudnnBackendDestroyDescriptor(self.0) };
    }
}

impl Desc {
    fn new(kind: Kind) -> Result<Desc> {
        let mut d = ptr::null_mut();
        // SAFETY: writes one descriptor handle into `d`.
        check("cudnnBackendCreateDescriptor", unsafe { sys::cudnnBackendCreateDescriptor(kind, &mut d) })?;
        Ok(Desc(d))
    }

    /// Sets attribute `name` to `vals`, of cuDNN type `ty`.
    ///
    /// # Safety
    /// `T` is the C type cuDNN documents for `ty` (`i64` for INT64, `bool` for BOOLEAN, a
    /// descriptor handle for BACKEND_DESCRIPTOR, ...).
    unsafe fn set<T>(&self, name: Attr, ty: AType, vals: &[T]) -> Result<()> {
        // SAFETY: forwarded from the caller; cuDNN copies the `vals.len()` elements.
        check("cudnnBackendSetAttribute", unsafe {
            sys::cudnnBackendSetAttribute(self.0, name, ty, vals.len() as i64, vals.as_ptr() as *const c_void)
        })
    }

    fn ints(&self, name: Attr, v: &[i64]) -> Result<()> {
        // SAFETY: INT64 attributes take `int64_t`.
        unsafe { self.set(name, AType::CUDNN_TYPE_INT64, v) }
    }

    fn dtype(&self, name: Attr, v: Dt) -> Result<()> {
        // SAFETY: DATA_TYPE attributes take `cudnnDataType_t`, a C enum (`#[repr(u32)]` here).
        unsafe { self.set(name, AType::CUDNN_TYPE_DATA_TYPE, &[v]) }
    }

    fn flag(&self, name: Attr, v: bool) -> Result<()> {
        // SAFETY: BOOLEAN attributes take a C `bool`, one byte as Rust's.
        unsafe { self.set(name, AType::CUDNN_TYPE_BOOLEAN, &[v]) }
    }

    fn descs(&self, name: Attr, v: &[&Desc]) -> Result<()> {
        let raw: Vec<sys::cudnnBackendDescriptor_t> = v.iter().map(|d| d.0).collect();
        // SAFETY: BACKEND_DESCRIPTOR attributes take descriptor handles; each is live.
        unsafe { self.set(name, AType::CUDNN_TYPE_BACKEND_DESCRIPTOR, &raw) }
    }

    fn handle(&self, name: Attr, h: sys::cudnnHandle_t) -> Result<()> {
        // SAFETY: HANDLE attributes take a `cudnnHandle_t`, live for the descriptor's life.
        unsafe { self.set(name, AType::CUDNN_TYPE_HANDLE, &[h]) }
    }

    fn finalize(self, what: &'static str) -> Result<Desc> {
        // SAFETY: a live descriptor whose attributes were set above.
        check(what, unsafe { sys::cudnnBackendFinalize(self.0) })?;
        Ok(self)
    }

    fn get_i64(&self, name: Attr) -> Result<i64> {
        let (mut v, mut n) = (0i64, 0i64);
        // SAFETY: asks for one `int64_t`, written into `v`.
        check("cudnnBackendGetAttribute", unsafe {
            sys::cudnnBackendGetAttribute(
                self.0,
                name,
                AType::CUDNN_TYPE_INT64,
                1,
                &mut n,
                (&mut v) as *mut i64 as *mut c_void,
            )
        })?;
        Ok(v)
    }
}

/// Fixed unique ids of the real (non-virtual) tensors; virtual ones count from 100.
mod uid {
    pub const Q: i64 = 0;
    pub const K: i64 = 1;
    pub const V: i64 = 2;
    pub const O: i64 = 3;
    pub const STATS: i64 = 4;
    pub const SCALE: i64 = 5;
    pub const NEG_INF: i64 = 6;
    pub const DO: i64 = 7;
    pub const DQ: i64 = 8;
    pub const DK: i64 = 9;
    pub const DV: i64 = 10;
    pub const DSUM: i64 = 11;
    pub const ONE: i64 = 12;
    pub const DQ_ACCUM: i64 = 13;
}

/// Which pass a plan computes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum SdpaPass {
    Forward,
    Backward,
}

/// The shape a plan is built for: q, k, v, out (and their grads) are `[batch, seq, heads · d]`,
/// the statistics f32 `[batch, heads, seq]`. A call in chunks of batches (the deterministic
/// backward, to bound its workspace) runs the chunk's plan once a chunk, its pointers moved to
/// the chunk's first sequence.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct SdpaKey {
    pub(crate) pass: SdpaPass,
    pub(crate) dtype: DType,
    pub(crate) batch: usize,
    pub(crate) seq: usize,
    pub(crate) heads: usize,
    pub(crate) head_dim: usize,
    pub(crate) causal: bool,
    /// The backward writes `dQ` without atomics (the dP-workspace variant); false: it adds
    /// `dQ` into an f32 accumulator with atomics. Always true for the forward.
    pub(crate) deterministic: bool,
    /// q, k and v (and their grads) are column blocks of one `[batch, seq, 3 · heads · d]`
    /// tensor: their rows are `3 · heads · d` elements apart (out and dO stay
    /// `[batch, seq, heads · d]`).
    pub(crate) packed: bool,
}

impl SdpaKey {
    /// The row stride, in elements, of the tensor with unique id `id`: q, k, v and their grads
    /// are packed or not, out and dO never are.
    fn row_stride(&self, id: i64) -> usize {
        let width = self.heads * self.head_dim;
        let qkv = [uid::Q, uid::K, uid::V, uid::DQ, uid::DK, uid::DV].contains(&id);
        if self.packed && qkv {
            3 * width
        } else {
            width
        }
    }
}

/// Picks the plan to keep of those a shape's heuristics offer (its index).
pub(super) type ChoosePlan<'a> = &'a dyn Fn(&[Plan]) -> usize;

/// A finalized execution plan and everything it was built from (kept alive with it; shared by
/// the plans of one graph).
pub(super) struct Plan {
    plan: Desc,
    /// cuDNN's own workspace, in bytes.
    pub(super) workspace: usize,
    _keep: std::rc::Rc<Vec<Desc>>,
}

/// The graph being built: its tensors and operations.
struct Builder {
    key: SdpaKey,
    io: Dt,
    tensors: HashMap<i64, Desc>,
    /// The operations, in order.
    ops: Vec<Desc>,
    /// The pointwise, reduction and matmul descriptors the operations point to.
    subs: Vec<Desc>,
    next_virtual: i64,
}

#[derive(Clone, Copy, PartialEq)]
enum Storage {
    Real,
    Virtual,
    ByValue,
}

impl Builder {
    fn new(key: SdpaKey) -> Builder {
        let io = if key.dtype == DType::BF16 { Dt::CUDNN_DATA_BFLOAT16 } else { Dt::CUDNN_DATA_HALF };
        Builder { key, io, tensors: HashMap::new(), ops: Vec::new(), subs: Vec::new(), next_virtual: 100 }
    }

    fn tensor(&mut self, id: i64, dt: Dt, dims: [usize; 4], strides: [usize; 4], storage: Storage) -> Result<i64> {
        let id = if storage == Storage::Virtual {
            self.next_virtual += 1;
            self.next_virtual
        } else {
            id
        };
        let d = Desc::new(Kind::CUDNN_BACKEND_TENSOR_DESCRIPTOR)?;
        d.dtype(Attr::CUDNN_ATTR_TENSOR_DATA_TYPE, dt)?;
        d.ints(Attr::CUDNN_ATTR_TENSOR_DIMENSIONS, &dims.map(|x| x as i64))?;
        d.ints(Attr::CUDNN_ATTR_TENSOR_STRIDES, &strides.map(|x| x as i64))?;
        d.ints(Attr::CUDNN_ATTR_TENSOR_UNIQUE_ID, &[id])?;
        d.ints(Attr::CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, &[16])?;
        match storage {
            Storage::Virtual => d.flag(Attr::CUDNN_ATTR_TENSOR_IS_VIRTUAL, true)?,
            Storage::ByValue => d.flag(Attr::CUDNN_ATTR_TENSOR_IS_BY_VALUE, true)?,
            Storage::Real => {}
        }
        self.tensors.insert(id, d.finalize("cudnnBackendFinalize(tensor)")?);
        Ok(id)
    }

    /// `[b, h, s, d]` in the `[batch, seq, heads · d]` layout, rows [`SdpaKey::row_stride`]
    /// apart (`transposed`: `[b, h, d, s]`).
    fn bshd(&mut self, id: i64, transposed: bool) -> Result<i64> {
        let SdpaKey { batch: b, seq: s, heads: h, head_dim: d, .. } = self.key;
        let (io, ld) = (self.io, self.key.row_stride(id));
        if transposed {
            self.tensor(id, io, [b, h, d, s], [s * ld, d, 1, ld], Storage::Real)
        } else {
            self.tensor(id, io, [b, h, s, d], [s * ld, d, ld, 1], Storage::Real)
        }
    }

    /// `[b, h, s, 1]` f32 (row statistics).
    fn rows(&mut self, id: i64, storage: Storage) -> Result<i64> {
        let SdpaKey { batch: b, seq: s, heads: h, .. } = self.key;
        self.tensor(id, Dt::CUDNN_DATA_FLOAT, [b, h, s, 1], [h * s, s, 1, 1], storage)
    }

    /// `[b, h, s, s]` virtual scores of type `dt` (`transposed`: column-major rows).
    fn scores(&mut self, dt: Dt, transposed: bool) -> Result<i64> {
        let SdpaKey { batch: b, seq: s, heads: h, .. } = self.key;
        let strides = if transposed { [h * s * s, s * s, 1, s] } else { [h * s * s, s * s, s, 1] };
        self.tensor(0, dt, [b, h, s, s], strides, Storage::Virtual)
    }

    fn scalar(&mut self, id: i64) -> Result<i64> {
        self.tensor(id, Dt::CUDNN_DATA_FLOAT, [1; 4], [1; 4], Storage::ByValue)
    }

    fn t(&self, id: i64) -> &Desc {
        &self.tensors[&id]
    }

    /// `y = mode(x, b)` (`t`: the BINARY_SELECT mask; `axis`: GEN_INDEX's).
    fn pointwise(&mut self, mode: Pw, x: i64, b: Option<i64>, t: Option<i64>, y: i64, axis: Option<i64>) -> Result<()> {
        let pw = Desc::new(Kind::CUDNN_BACKEND_POINTWISE_DESCRIPTOR)?;
        // SAFETY: POINTWISE_MODE takes `cudnnPointwiseMode_t`, a C enum.
        unsafe { pw.set(Attr::CUDNN_ATTR_POINTWISE_MODE, AType::CUDNN_TYPE_POINTWISE_MODE, &[mode])? };
        let prec = if mode == Pw::CUDNN_POINTWISE_CMP_GE { Dt::CUDNN_DATA_BOOLEAN } else { Dt::CUDNN_DATA_FLOAT };
        pw.dtype(Attr::CUDNN_ATTR_POINTWISE_MATH_PREC, prec)?;
        if let Some(axis) = axis {
            pw.ints(Attr::CUDNN_ATTR_POINTWISE_AXIS, &[axis])?;
        }
        let pw = pw.finalize("cudnnBackendFinalize(pointwise)")?;
        let op = Desc::new(Kind::CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR)?;
        op.descs(Attr::CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, &[&pw])?;
        op.descs(Attr::CUDNN_ATTR_OPERATION_POINTWISE_XDESC, &[self.t(x)])?;
        if let Some(b) = b {
            op.descs(Attr::CUDNN_ATTR_OPERATION_POINTWISE_BDESC, &[self.t(b)])?;
        }
        if let Some(t) = t {
            op.descs(Attr::CUDNN_ATTR_OPERATION_POINTWISE_TDESC, &[self.t(t)])?;
        }
        op.descs(Attr::CUDNN_ATTR_OPERATION_POINTWISE_YDESC, &[self.t(y)])?;
        self.ops.push(op.finalize("cudnnBackendFinalize(pointwise op)")?);
        self.subs.push(pw);
        Ok(())
    }

    /// `y = op(x)` over the last dimension.
    fn reduction(&mut self, reduce: sys::cudnnReduceTensorOp_t, x: i64, y: i64) -> Result<()> {
        let r = Desc::new(Kind::CUDNN_BACKEND_REDUCTION_DESCRIPTOR)?;
        r.dtype(Attr::CUDNN_ATTR_REDUCTION_COMP_TYPE, Dt::CUDNN_DATA_FLOAT)?;
        // SAFETY: REDUCTION_OPERATOR takes `cudnnReduceTensorOp_t`, a C enum.
        unsafe { r.set(Attr::CUDNN_ATTR_REDUCTION_OPERATOR, AType::CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, &[reduce])? };
        let r = r.finalize("cudnnBackendFinalize(reduction)")?;
        let op = Desc::new(Kind::CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR)?;
        op.descs(Attr::CUDNN_ATTR_OPERATION_REDUCTION_XDESC, &[self.t(x)])?;
        op.descs(Attr::CUDNN_ATTR_OPERATION_REDUCTION_YDESC, &[self.t(y)])?;
        op.descs(Attr::CUDNN_ATTR_OPERATION_REDUCTION_DESC, &[&r])?;
        self.ops.push(op.finalize("cudnnBackendFinalize(reduction op)")?);
        self.subs.push(r);
        Ok(())
    }

    /// `c = a · b` per (batch, head), f32 accumulation.
    fn matmul(&mut self, a: i64, b: i64, c: i64) -> Result<()> {
        let m = Desc::new(Kind::CUDNN_BACKEND_MATMUL_DESCRIPTOR)?;
        m.dtype(Attr::CUDNN_ATTR_MATMUL_COMP_TYPE, Dt::CUDNN_DATA_FLOAT)?;
        let m = m.finalize("cudnnBackendFinalize(matmul)")?;
        let op = Desc::new(Kind::CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR)?;
        op.descs(Attr::CUDNN_ATTR_OPERATION_MATMUL_ADESC, &[self.t(a)])?;
        op.descs(Attr::CUDNN_ATTR_OPERATION_MATMUL_BDESC, &[self.t(b)])?;
        op.descs(Attr::CUDNN_ATTR_OPERATION_MATMUL_CDESC, &[self.t(c)])?;
        op.descs(Attr::CUDNN_ATTR_OPERATION_MATMUL_DESC, &[&m])?;
        self.ops.push(op.finalize("cudnnBackendFinalize(matmul op)")?);
        self.subs.push(m);
        Ok(())
    }

    fn reshape(&mut self, x: i64, y: i64) -> Result<()> {
        let op = Desc::new(Kind::CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR)?;
        op.descs(Attr::CUDNN_ATTR_OPERATION_RESHAPE_XDESC, &[self.t(x)])?;
        op.descs(Attr::CUDNN_ATTR_OPERATION_RESHAPE_YDESC, &[self.t(y)])?;
        self.ops.push(op.finalize("cudnnBackendFinalize(reshape op)")?);
        Ok(())
    }

    /// `s = (x · scale)`, causally masked with `-inf` when the key asks: the scores both passes
    /// start from. Returns the masked scores' id.
    fn scaled_scores(&mut self, x: i64) -> Result<i64> {
        let f = Dt::CUDNN_DATA_FLOAT;
        let scaled = self.scores(f, false)?;
        self.pointwise(Pw::CUDNN_POINTWISE_MUL, x, Some(uid::SCALE), None, scaled, None)?;
        Ok(scaled)
    }

    fn causal_mask(&mut self, s: i64) -> Result<i64> {
        if !self.key.causal {
            return Ok(s);
        }
        let i32t = Dt::CUDNN_DATA_INT32;
        let (row, col) = (self.scores(i32t, false)?, self.scores(i32t, false)?);
        self.pointwise(Pw::CUDNN_POINTWISE_GEN_INDEX, s, None, None, row, Some(2))?;
        self.pointwise(Pw::CUDNN_POINTWISE_GEN_INDEX, s, None, None, col, Some(3))?;
        let keep = self.scores(Dt::CUDNN_DATA_BOOLEAN, false)?;
        self.pointwise(Pw::CUDNN_POINTWISE_CMP_GE, row, Some(col), None, keep, None)?;
        self.scalar(uid::NEG_INF)?;
        let masked = self.scores(Dt::CUDNN_DATA_FLOAT, false)?;
        self.pointwise(Pw::CUDNN_POINTWISE_BINARY_SELECT, s, Some(uid::NEG_INF), Some(keep), masked, None)?;
        Ok(masked)
    }

    /// `O = softmax(Q·Kᵀ·scale) · V`, and `Stats = max + log(sum exp)` per row.
    fn forward(&mut self) -> Result<()> {
        let (f, io) = (Dt::CUDNN_DATA_FLOAT, self.io);
        let (q, k, v, o) =
            (self.bshd(uid::Q, false)?, self.bshd(uid::K, true)?, self.bshd(uid::V, false)?, self.bshd(uid::O, false)?);
        let stats = self.rows(uid::STATS, Storage::Real)?;
        self.scalar(uid::SCALE)?;
        let s = self.scores(f, false)?;
        self.matmul(q, k, s)?;
        let scaled = self.scaled_scores(s)?;
        let masked = self.causal_mask(scaled)?;
        let max = self.rows(0, Storage::Virtual)?;
        self.reduction(sys::cudnnReduceTensorOp_t::CUDNN_REDUCE_TENSOR_MAX, masked, max)?;
        let centred = self.scores(f, false)?;
        self.pointwise(Pw::CUDNN_POINTWISE_SUB, masked, Some(max), None, centred, None)?;
        let e = self.scores(f, false)?;
        self.pointwise(Pw::CUDNN_POINTWISE_EXP, centred, None, None, e, None)?;
        let sum = self.rows(0, Storage::Virtual)?;
        self.reduction(sys::cudnnReduceTensorOp_t::CUDNN_REDUCE_TENSOR_ADD, e, sum)?;
        let log = self.rows(0, Storage::Virtual)?;
        self.pointwise(Pw::CUDNN_POINTWISE_LOG, sum, None, None, log, None)?;
        self.pointwise(Pw::CUDNN_POINTWISE_ADD, max, Some(log), None, stats, None)?;
        let p = self.scores(io, false)?;
        self.pointwise(Pw::CUDNN_POINTWISE_DIV, e, Some(sum), None, p, None)?;
        self.matmul(p, v, o)
    }

    /// dQ, dK, dV from dO, O and the forward's Stats: `P = exp(S·scale − Stats)`,
    /// `dV = Pᵀ·dO`, `dS = P ∘ (dO·Vᵀ − rowsum(dO ∘ O)) · scale`, `dK = dSᵀ·Q`, `dQ = dS·K`.
    fn backward(&mut self) -> Result<()> {
        let (f, io) = (Dt::CUDNN_DATA_FLOAT, self.io);
        let SdpaKey { batch: b, seq: sq, heads: h, head_dim: d, .. } = self.key;
        let (q, kt, vt) = (self.bshd(uid::Q, false)?, self.bshd(uid::K, true)?, self.bshd(uid::V, true)?);
        let (o, dout) = (self.bshd(uid::O, false)?, self.bshd(uid::DO, false)?);
        let (dq, dk, dv) = (self.bshd(uid::DQ, false)?, self.bshd(uid::DK, false)?, self.bshd(uid::DV, false)?);
        let stats = self.rows(uid::STATS, Storage::Real)?;
        self.scalar(uid::SCALE)?;
        self.scalar(uid::ONE)?;
        // softmax_sum = rowsum(dO ∘ O): cuDNN's graphs keep it in a real tensor.
        let prod = self.tensor(0, f, [b, h, sq, d], [sq * h * d, sq * d, h * d, 1], Storage::Virtual)?;
        self.pointwise(Pw::CUDNN_POINTWISE_MUL, dout, Some(o), None, prod, None)?;
        let rowsum = self.rows(0, Storage::Virtual)?;
        self.reduction(sys::cudnnReduceTensorOp_t::CUDNN_REDUCE_TENSOR_ADD, prod, rowsum)?;
        let dsum = self.rows(uid::DSUM, Storage::Real)?;
        self.pointwise(Pw::CUDNN_POINTWISE_MUL, rowsum, Some(uid::ONE), None, dsum, None)?;
        // P, recomputed.
        let s = self.scores(f, false)?;
        self.matmul(q, kt, s)?;
        let scaled = self.scaled_scores(s)?;
        let centred = self.scores(f, false)?;
        self.pointwise(Pw::CUDNN_POINTWISE_SUB, scaled, Some(stats), None, centred, None)?;
        let masked = self.causal_mask(centred)?;
        let p = self.scores(f, false)?;
        self.pointwise(Pw::CUDNN_POINTWISE_EXP, masked, None, None, p, None)?;
        // dV = Pᵀ · dO
        let pt = self.scores(io, true)?;
        self.reshape(p, pt)?;
        self.matmul(pt, dout, dv)?;
        // dS = P ∘ (dO · Vᵀ − softmax_sum) · scale
        let dp = self.scores(f, false)?;
        self.matmul(dout, vt, dp)?;
        let centred_dp = self.scores(f, false)?;
        self.pointwise(Pw::CUDNN_POINTWISE_SUB, dp, Some(dsum), None, centred_dp, None)?;
        let ds_unscaled = self.scores(f, false)?;
        self.pointwise(Pw::CUDNN_POINTWISE_MUL, centred_dp, Some(p), None, ds_unscaled, None)?;
        let ds = self.scores(f, false)?;
        self.pointwise(Pw::CUDNN_POINTWISE_MUL, ds_unscaled, Some(uid::SCALE), None, ds, None)?;
        // dK = dSᵀ · Q
        let dst = self.scores(io, true)?;
        self.reshape(ds, dst)?;
        self.matmul(dst, q, dk)?;
        // dQ = dS · K: written directly (the dP-workspace variant: no atomics), or added into
        // an f32 accumulator with atomics and then converted.
        // K as it lies in memory (the reshape names Kᵀ's storage; its strides must be K's).
        let ld = self.key.row_stride(uid::K);
        let k = self.tensor(0, f, [b, h, sq, d], [sq * ld, d, ld, 1], Storage::Virtual)?;
        self.reshape(kt, k)?;
        if self.key.deterministic {
            return self.matmul(ds, k, dq);
        }
        let accum = self.tensor(uid::DQ_ACCUM, f, [b, h, sq, d], [h * sq * d, sq * d, d, 1], Storage::Real)?;
        self.matmul(ds, k, accum)?;
        self.pointwise(Pw::CUDNN_POINTWISE_IDENTITY, accum, None, None, dq, None)
    }
}

/// cuDNN's state on one device: its handle and the plans built so far (`None`: cuDNN has no
/// engine for that shape; the portable kernels run it).
pub(crate) struct Cudnn {
    handle: sys::cudnnHandle_t,
    plans: HashMap<SdpaKey, Option<Plan>>,
}

// SAFETY: a cuDNN handle may be used from any thread (each call binds the context first); the
// `Mutex` around `Cudnn` keeps calls on it from running concurrently. The plans' shared
// descriptors (`Rc`) are cloned and dropped only by code holding that lock (building a plan,
// dropping the ones not kept), never by two threads at once.
unsafe impl Send for Cudnn {}

impl Drop for Cudnn {
    fn drop(&mut self) {
        self.plans.clear();
        // SAFETY: created in `open`, destroyed once, after its plans.
        let _ = unsafe { sys::cudnnDestroy(self.handle) };
    }
}

/// Whether `GRAPHED_CUDNN_DEBUG=1` asks for the reason each plan cuDNN refused and for each
/// plan's workspace.
fn debug() -> bool {
    std::env::var("GRAPHED_CUDNN_DEBUG").is_ok_and(|v| v == "1")
}

impl Cudnn {
    /// A handle, or `None` when libcudnn is missing, older than cuDNN 9.10, or cannot start.
    /// The caller bound the device's context.
    pub(crate) fn open() -> Option<Cudnn> {
        // SAFETY: only tries to dlopen the library by name.
        if !unsafe { sys::is_culib_present() } {
            return None;
        }
        // SAFETY: the library is present; cudnnGetVersion takes no arguments.
        let version = unsafe { sys::cudnnGetVersion() };
        if version < MIN_VERSION {
            return None;
        }
        let mut handle = ptr::null_mut();
        // SAFETY: writes one handle; a context is current.
        let status = unsafe { sys::cudnnCreate(&mut handle) };
        if status != sys::cudnnStatus_t::CUDNN_STATUS_SUCCESS {
            if debug() {
                eprintln!("graphed: cudnnCreate: {status:?}");
            }
            return None;
        }
        Some(Cudnn { handle, plans: HashMap::new() })
    }

    /// The plan's workspace in bytes, building the plan the first time; `None` when cuDNN has
    /// no engine for this shape. The plan is the heuristics' first that finalizes, or with
    /// `choose` the one it picks of the first [`TUNE_PLANS`] (see `cudnn_tune.rs`).
    pub(super) fn workspace(&mut self, key: SdpaKey, choose: Option<ChoosePlan<'_>>) -> Option<usize> {
        if !self.plans.contains_key(&key) {
            let limit = if choose.is_some() || debug() { TUNE_PLANS } else { 1 };
            let mut plans = match build(self.handle, key, limit) {
                Ok(p) => p,
                Err(e) => {
                    if debug() {
                        eprintln!("graphed: cuDNN attention {key:?}: {e}");
                    }
                    Vec::new()
                }
            };
            let chosen = match choose {
                Some(choose) if plans.len() > 1 => choose(&plans).min(plans.len() - 1),
                _ => 0,
            };
            if debug() {
                let all: Vec<usize> = plans.iter().map(|p| p.workspace).collect();
                eprintln!("graphed: cuDNN attention {key:?}: plans' workspaces {all:?} bytes, plan {chosen} kept");
            }
            let plan = (chosen < plans.len()).then(|| plans.swap_remove(chosen));
            self.plans.insert(key, plan);
        }
        self.plans[&key].as_ref().map(|p| p.workspace)
    }

    /// The handle (used under the lock around `Cudnn`).
    pub(super) fn handle(&self) -> sys::cudnnHandle_t {
        self.handle
    }

    /// Runs the plan of `key` (built by [`Cudnn::workspace`]) on `stream`: `ptrs` are the real
    /// tensors' device addresses by unique id (see [`uid`]), `workspace` holds at least the
    /// plan's bytes.
    ///
    /// # Safety
    /// Every pointer addresses a live device block of the key's shape and dtype; the context is
    /// bound; nothing else uses the workspace until the stream reaches this work.
    pub(crate) unsafe fn execute(
        &self,
        key: SdpaKey,
        stream: sys::cudaStream_t,
        tensors: &SdpaPointers,
        workspace: u64,
    ) -> Result<()> {
        let Some(Some(plan)) = self.plans.get(&key) else {
            return Err(Error::cuda(
                "cudnnBackendExecute",
                CudnnError(sys::cudnnStatus_t::CUDNN_STATUS_NOT_INITIALIZED),
            ));
        };
        // SAFETY: forwarded from the caller.
        unsafe { execute_plan(self.handle, plan, key, stream, tensors, workspace) }
    }
}

/// Runs `plan` (built for `key`) on `stream` with `handle`, as [`Cudnn::execute`] says.
///
/// # Safety
/// As [`Cudnn::execute`]; `handle` is the one the plan was built with, used by no other call now.
pub(super) unsafe fn execute_plan(
    handle: sys::cudnnHandle_t,
    plan: &Plan,
    key: SdpaKey,
    stream: sys::cudaStream_t,
    tensors: &SdpaPointers,
    workspace: u64,
) -> Result<()> {
    {
        // SAFETY: the handle is live; the stream belongs to the bound context.
        check("cudnnSetStream", unsafe { sys::cudnnSetStream(handle, stream) })?;
        let scale = 1.0f32 / (key.head_dim as f32).sqrt();
        let (neg_inf, one) = (f32::NEG_INFINITY, 1.0f32);
        let host = |v: &f32| v as *const f32 as *mut c_void;
        let dev = |p: u64| p as *mut c_void;
        let mut entries: Vec<(i64, *mut c_void)> = vec![
            (uid::Q, dev(tensors.q)),
            (uid::K, dev(tensors.k)),
            (uid::V, dev(tensors.v)),
            (uid::O, dev(tensors.o)),
            (uid::STATS, dev(tensors.stats)),
            (uid::SCALE, host(&scale)),
        ];
        if key.causal {
            entries.push((uid::NEG_INF, host(&neg_inf)));
        }
        if let Some(g) = &tensors.grads {
            entries.extend([
                (uid::DO, dev(g.dout)),
                (uid::DQ, dev(g.dq)),
                (uid::DK, dev(g.dk)),
                (uid::DV, dev(g.dv)),
                (uid::DSUM, dev(g.dsum)),
                (uid::ONE, host(&one)),
            ]);
            if let Some(accum) = g.dq_accum {
                entries.push((uid::DQ_ACCUM, dev(accum)));
            }
        }
        let (ids, ptrs): (Vec<i64>, Vec<*mut c_void>) = entries.into_iter().unzip();
        let pack = Desc::new(Kind::CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR)?;
        // SAFETY: VOID_PTR attributes take `void*`s; the host scalars above outlive the execute
        // call, which reads them (by-value tensors are copied into the launch).
        unsafe {
            pack.set(Attr::CUDNN_ATTR_VARIANT_PACK_WORKSPACE, AType::CUDNN_TYPE_VOID_PTR, &[dev(workspace)])?;
            pack.set(Attr::CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, AType::CUDNN_TYPE_VOID_PTR, &ptrs)?;
        }
        pack.ints(Attr::CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, &ids)?;
        let pack = pack.finalize("cudnnBackendFinalize(variant pack)")?;
        // SAFETY: plan and pack are finalized; the caller vouches for the pointers.
        check("cudnnBackendExecute", unsafe { sys::cudnnBackendExecute(handle, plan.plan.0, pack.0) })
    }
}

/// The device addresses of one call's tensors.
pub(crate) struct SdpaPointers {
    pub(crate) q: u64,
    pub(crate) k: u64,
    pub(crate) v: u64,
    pub(crate) o: u64,
    pub(crate) stats: u64,
    /// The backward's: dO in, dQ/dK/dV out, and the f32 `[batch, heads, seq]` scratch of
    /// `rowsum(dO ∘ O)`.
    pub(crate) grads: Option<SdpaGrads>,
}

impl SdpaPointers {
    /// The same tensors from a chunk's first sequence on: `qkv` bytes into q, k, v and their
    /// grads, `at` bytes into out and dO, `row` bytes into the statistics and the `rowsum`
    /// scratch (the accumulator, used only by unchunked calls, stays).
    pub(crate) fn offset(&self, qkv: u64, at: u64, row: u64) -> SdpaPointers {
        SdpaPointers {
            q: self.q + qkv,
            k: self.k + qkv,
            v: self.v + qkv,
            o: self.o + at,
            stats: self.stats + row,
            grads: self.grads.as_ref().map(|g| SdpaGrads {
                dout: g.dout + at,
                dq: g.dq + qkv,
                dk: g.dk + qkv,
                dv: g.dv + qkv,
                dsum: g.dsum + row,
                dq_accum: g.dq_accum,
            }),
        }
    }
}

/// See [`SdpaPointers::grads`].
pub(crate) struct SdpaGrads {
    pub(crate) dout: u64,
    pub(crate) dq: u64,
    pub(crate) dk: u64,
    pub(crate) dv: u64,
    pub(crate) dsum: u64,
    /// The zeroed f32 `[batch, heads, seq, head_dim]` accumulator of a nondeterministic
    /// backward.
    pub(crate) dq_accum: Option<u64>,
}

/// Builds the operation graph of `key` and the execution plans cuDNN's heuristics offer that
/// finalize, in the heuristics' order, `limit` of them at most: none when none does.
fn build(handle: sys::cudnnHandle_t, key: SdpaKey, limit: usize) -> Result<Vec<Plan>> {
    let mut g = Builder::new(key);
    match key.pass {
        SdpaPass::Forward => g.forward()?,
        SdpaPass::Backward => g.backward()?,
    }
    let graph = Desc::new(Kind::CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR)?;
    let ops: Vec<&Desc> = g.ops.iter().collect();
    graph.descs(Attr::CUDNN_ATTR_OPERATIONGRAPH_OPS, &ops)?;
    graph.handle(Attr::CUDNN_ATTR_OPERATIONGRAPH_HANDLE, handle)?;
    let graph = graph.finalize("cudnnBackendFinalize(operation graph)")?;
    let heur = Desc::new(Kind::CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR)?;
    heur.descs(Attr::CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, &[&graph])?;
    // SAFETY: HEUR_MODE takes `cudnnBackendHeurMode_t`, a C enum.
    unsafe {
        heur.set(
            Attr::CUDNN_ATTR_ENGINEHEUR_MODE,
            AType::CUDNN_TYPE_HEUR_MODE,
            &[sys::cudnnBackendHeurMode_t::CUDNN_HEUR_MODE_A],
        )?
    };
    let heur = heur.finalize("cudnnBackendFinalize(engine heuristics)")?;
    let mut count = 0i64;
    // SAFETY: asks how many configurations there are (no elements written).
    check("cudnnBackendGetAttribute", unsafe {
        sys::cudnnBackendGetAttribute(
            heur.0,
            Attr::CUDNN_ATTR_ENGINEHEUR_RESULTS,
            AType::CUDNN_TYPE_BACKEND_DESCRIPTOR,
            0,
            &mut count,
            ptr::null_mut(),
        )
    })?;
    let cfgs: Vec<Desc> =
        (0..count.max(0)).map(|_| Desc::new(Kind::CUDNN_BACKEND_ENGINECFG_DESCRIPTOR)).collect::<Result<_>>()?;
    let mut raw: Vec<sys::cudnnBackendDescriptor_t> = cfgs.iter().map(|d| d.0).collect();
    let mut got = 0i64;
    // SAFETY: `raw` holds `count` created ENGINECFG descriptors for cuDNN to fill.
    check("cudnnBackendGetAttribute", unsafe {
        sys::cudnnBackendGetAttribute(
            heur.0,
            Attr::CUDNN_ATTR_ENGINEHEUR_RESULTS,
            AType::CUDNN_TYPE_BACKEND_DESCRIPTOR,
            count,
            &mut got,
            raw.as_mut_ptr() as *mut c_void,
        )
    })?;
    let mut last = None;
    let mut made: Vec<(Desc, usize)> = Vec::new();
    for cfg in cfgs.iter().take(got.max(0) as usize) {
        if made.len() >= limit {
            break;
        }
        let plan = Desc::new(Kind::CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR)?;
        plan.handle(Attr::CUDNN_ATTR_EXECUTION_PLAN_HANDLE, handle)?;
        plan.descs(Attr::CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, &[cfg])?;
        match plan.finalize("cudnnBackendFinalize(execution plan)") {
            Ok(plan) => {
                let workspace = plan.get_i64(Attr::CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE)?.max(0) as usize;
                made.push((plan, workspace));
            }
            Err(e) => last = Some(e),
        }
    }
    match last {
        Some(e) if made.is_empty() && debug() => return Err(e),
        _ if made.is_empty() => return Ok(Vec::new()),
        _ => {}
    }
    // Every plan keeps what it was built from alive; the plans of one graph share it.
    let mut keep: Vec<Desc> = g.tensors.into_values().collect();
    keep.extend(g.ops);
    keep.extend(g.subs);
    keep.extend([graph, heur]);
    keep.extend(cfgs);
    let shared = std::rc::Rc::new(keep);
    Ok(made.into_iter().map(|(plan, workspace)| Plan { plan, workspace, _keep: shared.clone() }).collect())
}

/// Runs `f` with this thread's stream-capture mode relaxed: cuDNN may allocate and compile
/// while it opens or builds a plan, which a capture in progress (global or thread-local mode)
/// would otherwise refuse. Nothing `f` does is enqueued on a capturing stream.
fn relaxed<R>(f: impl FnOnce() -> R) -> R {
    let mut mode = cu::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED;
    // SAFETY: swaps this thread's capture mode (one enum in, the old one out); restored below.
    let swapped = unsafe { cu::cuThreadExchangeStreamCaptureMode(&mut mode) } == cu::CUresult::CUDA_SUCCESS;
    let r = f();
    if swapped {
        // SAFETY: puts the old mode back.
        let _ = unsafe { cu::cuThreadExchangeStreamCaptureMode(&mut mode) };
    }
    r
}

fn lock(m: &Mutex<Cudnn>) -> std::sync::MutexGuard<'_, Cudnn> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl CudaBackend {
    /// cuDNN on this device, opened the first time it is asked for.
    fn cudnn(&self) -> Option<&Mutex<Cudnn>> {
        self.cudnn
            .get_or_init(|| {
                self.bind().ok()?;
                relaxed(Cudnn::open).map(Mutex::new)
            })
            .as_ref()
    }

    /// The workspace cuDNN's fused attention needs for `key`, its plan built the first time;
    /// `None` when libcudnn is absent or has no engine for this shape (the portable kernels run
    /// it then).
    pub(crate) fn cudnn_sdpa_workspace(&self, key: SdpaKey) -> Result<Option<usize>> {
        let Some(m) = self.cudnn() else { return Ok(None) };
        let mut c = lock(m);
        self.bind()?;
        let handle = c.handle();
        let time = |plans: &[Plan]| self.time_sdpa_plans(handle, key, plans);
        let choose: Option<ChoosePlan<'_>> =
            if super::cudnn_tune::requested() && !super::capture::is_capturing() { Some(&time) } else { None };
        Ok(relaxed(|| c.workspace(key, choose)))
    }

    /// Runs cuDNN's fused attention for `key` on the device stream (its plan built by
    /// [`CudaBackend::cudnn_sdpa_workspace`]).
    ///
    /// # Safety
    /// As [`Cudnn::execute`]: every pointer addresses a live block of the key's shape and
    /// dtype, the workspace holds the plan's bytes.
    pub(crate) unsafe fn cudnn_sdpa(&self, key: SdpaKey, tensors: &SdpaPointers, workspace: u64) -> Result<()> {
        let _entered = self.gate.enter()?;
        self.injected(FaultPoint::KernelLaunch, "cudnnBackendExecute")?;
        let Some(m) = self.cudnn() else {
            return Err(Error::cuda(
                "cudnnBackendExecute",
                CudnnError(sys::cudnnStatus_t::CUDNN_STATUS_NOT_INITIALIZED),
            ));
        };
        let c = lock(m);
        self.bind()?;
        // SAFETY: forwarded from the caller; the stream is this device's.
        unsafe { c.execute(key, self.stream.cu_stream() as sys::cudaStream_t, tensors, workspace) }
    }
}
