//! The plain GEMMs of [`GemmEx`] (the linear ops' forward without an epilogue, their input
//! grads and their weight grads) through cublasLt, with the algorithm chosen once per shape:
//! cublasLt's heuristic's first, or the fastest of its candidates timed on scratch buffers.
//!
//! A measurement setting, `GRAPHED_GEMM` (read once a process): unset or `cublas`,
//! `cublasGemmEx` with its default algorithm (what the runtime has always done); `lt`, cublasLt
//! with its heuristic's first algorithm; `tuned`, cublasLt with the fastest of the heuristic's
//! first [`CANDIDATES`] algorithms, timed the first time a shape runs outside a capture. A
//! shape first met inside a capture takes the heuristic's first without timing (timing
//! synchronises the device), and keeps it. Once chosen, a shape's algorithm never changes in
//! the process, so a graph and the eager calls of one process give the same bits; two
//! processes may time two algorithms differently and differ in the last bits of their sums.

use std::collections::HashMap;

use cudarc::cublaslt::{result as lt, sys};

use super::cublaslt::{alignment, choices, data_type, lt_err, LtCall};
use super::cuda::CudaBackend;
use super::cuda_gemm::GemmEx;
use crate::{DType, Error, Result};

/// How [`GemmEx`] calls reach cuBLAS (`GRAPHED_GEMM`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum GemmRoute {
    /// `cublasGemmEx`, its default algorithm (the default).
    Cublas,
    /// cublasLt, the heuristic's first algorithm (`GRAPHED_GEMM=lt`).
    Heuristic,
    /// cublasLt, the fastest of the heuristic's candidates, timed (`GRAPHED_GEMM=tuned`).
    Timed,
}

impl GemmRoute {
    /// The route a setting's value names; anything else is the default.
    pub(crate) fn parse(value: Option<&str>) -> GemmRoute {
        match value {
            Some("lt") => GemmRoute::Heuristic,
            Some("tuned") => GemmRoute::Timed,
            _ => GemmRoute::Cublas,
        }
    }

    /// `GRAPHED_GEMM`, read once a process.
    pub(crate) fn requested() -> GemmRoute {
        static ROUTE: std::sync::OnceLock<GemmRoute> = std::sync::OnceLock::new();
        *ROUTE.get_or_init(|| GemmRoute::parse(std::env::var("GRAPHED_GEMM").ok().as_deref()))
    }
}

/// How many of the heuristic's algorithms a timed choice tries.
pub(crate) const CANDIDATES: usize = 16;

/// What fixes a plan: the operation, the shapes, the leading dimensions and the dtypes. The
/// addresses are given at each call.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct GemmKey {
    trans_a: bool,
    trans_b: bool,
    m: usize,
    n: usize,
    k: usize,
    lda: usize,
    ldb: usize,
    ldc: usize,
    a: DType,
    b: DType,
    c: DType,
    tf32: bool,
    /// Whether C is read (`beta` not 0): an algorithm is timed as it will run.
    accumulate: bool,
    route: GemmRoute,
    /// What the operands' addresses are multiples of (see `cublaslt::alignment`).
    align: u32,
}

impl GemmKey {
    fn of(g: &GemmEx, route: GemmRoute) -> GemmKey {
        GemmKey {
            trans_a: g.trans_a,
            trans_b: g.trans_b,
            m: g.m,
            n: g.n,
            k: g.k,
            lda: g.a.ld,
            ldb: g.b.ld,
            ldc: g.c.ld,
            a: g.a.dtype,
            b: g.b.dtype,
            c: g.c.dtype,
            tf32: g.tf32,
            accumulate: g.beta != 0.0,
            route,
            align: alignment(&[g.a.ptr, g.b.ptr, g.c.ptr]),
        }
    }

    /// The column-major (rows, columns) each operand is stored as.
    fn stored(&self) -> [(usize, usize); 3] {
        let a = if self.trans_a { (self.k, self.m) } else { (self.m, self.k) };
        let b = if self.trans_b { (self.n, self.k) } else { (self.k, self.n) };
        [a, b, (self.m, self.n)]
    }

    /// Bytes each operand spans: its leading dimension times its columns.
    fn bytes(&self) -> [usize; 3] {
        let [(_, ca), (_, cb), (_, cc)] = self.stored();
        [self.lda * ca * self.a.size(), self.ldb * cb * self.b.size(), self.ldc * cc * self.c.size()]
    }
}

/// The descriptors and the chosen algorithm of one [`GemmKey`].
pub(crate) struct GemmPlan {
    desc: sys::cublasLtMatmulDesc_t,
    a: sys::cublasLtMatrixLayout_t,
    b: sys::cublasLtMatrixLayout_t,
    c: sys::cublasLtMatrixLayout_t,
    algo: sys::cublasLtMatmulAlgo_t,
}

impl GemmPlan {
    /// # Safety
    /// Called once, when no call uses the plan any more.
    pub(crate) unsafe fn destroy(&self) {
        // SAFETY: forwarded from the caller. Errors are ignored: only host memory is released.
        unsafe {
            let _ = lt::destroy_matmul_desc(self.desc);
            let _ = lt::destroy_matrix_layout(self.a);
            let _ = lt::destroy_matrix_layout(self.b);
            let _ = lt::destroy_matrix_layout(self.c);
        }
    }
}

/// The plans by key (`None`: cublasLt has no algorithm for it; `cublasGemmEx` runs it).
pub(crate) type GemmPlans = HashMap<GemmKey, Option<GemmPlan>>;

/// The descriptor and layouts of `key` (the algorithm still to choose).
fn describe(key: &GemmKey) -> Result<GemmPlan> {
    let compute = if key.a == DType::F32 && key.tf32 {
        sys::cublasComputeType_t::CUBLAS_COMPUTE_32F_FAST_TF32
    } else {
        sys::cublasComputeType_t::CUBLAS_COMPUTE_32F
    };
    let desc =
        lt::create_matmul_desc(compute, sys::cudaDataType::CUDA_R_32F).map_err(lt_err("cublasLtMatmulDescCreate"))?;
    let [(ra, ca), (rb, cb), (rc, cc)] = key.stored();
    let layouts = [(key.a, ra, ca, key.lda), (key.b, rb, cb, key.ldb), (key.c, rc, cc, key.ldc)]
        .map(|(dt, rows, cols, ld)| lt::create_matrix_layout(data_type(dt), rows as u64, cols as u64, ld as i64));
    let plan = match layouts {
        [Ok(a), Ok(b), Ok(c)] => {
            // SAFETY: an all-zero algorithm is plain data, replaced before any matmul reads it.
            GemmPlan { desc, a, b, c, algo: unsafe { std::mem::zeroed() } }
        }
        made => {
            // SAFETY: created above, used nowhere else, each destroyed once.
            unsafe {
                let _ = lt::destroy_matmul_desc(desc);
                for l in made.iter().flatten() {
                    let _ = lt::destroy_matrix_layout(*l);
                }
            }
            // One of them failed (this arm matches no other way).
            let failed = made.into_iter().find_map(|r| r.err());
            let e = failed.unwrap_or(lt::CublasError(sys::cublasStatus_t::CUBLAS_STATUS_INTERNAL_ERROR));
            return Err(lt_err("cublasLtMatrixLayoutCreate")(e));
        }
    };
    use sys::cublasLtMatmulDescAttributes_t as A;
    let op = |t: bool| if t { 1i32 } else { 0i32 };
    // SAFETY: `desc` is live; TRANSA/TRANSB are cublasOperation_t (i32: 1 = T, 0 = N).
    let set = unsafe {
        super::cublaslt::set_desc(plan.desc, A::CUBLASLT_MATMUL_DESC_TRANSA, &op(key.trans_a))
            .and_then(|()| super::cublaslt::set_desc(plan.desc, A::CUBLASLT_MATMUL_DESC_TRANSB, &op(key.trans_b)))
    };
    set.inspect_err(|_| {
        // SAFETY: created above, used nowhere else.
        unsafe { plan.destroy() }
    })?;
    Ok(plan)
}

impl CudaBackend {
    /// Runs `g` through cublasLt as `route` says. `Ok(false)` when cublasLt is not there or
    /// has no algorithm for it: the caller runs `cublasGemmEx`.
    pub(crate) fn lt_gemm(&self, g: &GemmEx, route: GemmRoute) -> Result<bool> {
        let Some(lt_state) = &self.lt else { return Ok(false) };
        let mut lt_state = lt_state.lock().unwrap_or_else(|e| e.into_inner());
        let key = GemmKey::of(g, route);
        let handle = lt_state.handle();
        let plan = match lt_state.gemms.entry(key) {
            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::hash_map::Entry::Vacant(e) => e.insert(self.plan_gemm(handle, &key)?),
        };
        let Some(plan) = plan.as_ref() else { return Ok(false) };
        // SAFETY: the op checked every operand against a live block holding the matrix its
        // dimensions and leading dimension describe, which the plan's layouts restate; alpha
        // and beta are f32 (the scale type) and live through the call; the workspace is the
        // cuBLAS one, used in this stream's order only.
        let status = unsafe {
            self.lt_matmul(
                handle,
                &LtCall {
                    desc: plan.desc,
                    layouts: [plan.a, plan.b, plan.c, plan.c],
                    ptrs: [g.a.ptr, g.b.ptr, g.c.ptr, g.c.ptr],
                    scale: (g.alpha, g.beta),
                },
                &plan.algo,
            )
        };
        status.map(|()| true).map_err(|e| Error::GemmRejected {
            op: g.op,
            dtype: g.a.dtype,
            m: g.m,
            n: g.n,
            k: g.k,
            status: format!("cublasLtMatmul: {e:?}"),
        })
    }

    /// The plan of `key`: the heuristic's first algorithm, or with [`GemmRoute::Timed`] outside
    /// a capture the one timing keeps. `None` when the heuristic has none.
    fn plan_gemm(&self, handle: sys::cublasLtHandle_t, key: &GemmKey) -> Result<Option<GemmPlan>> {
        let mut plan = describe(key)?;
        let asked = if key.route == GemmRoute::Timed { CANDIDATES } else { 1 };
        // SAFETY: the handle and the plan's objects are live.
        let found = unsafe { choices(handle, plan.desc, (plan.a, plan.b, plan.c), asked, false, key.align) };
        let algos = match found {
            Ok(a) if !a.is_empty() => a,
            _ => {
                // SAFETY: created by `describe`, used nowhere else.
                unsafe { plan.destroy() };
                return Ok(None);
            }
        };
        let timed = key.route == GemmRoute::Timed && algos.len() > 1 && !super::capture::is_capturing();
        let chosen = if timed { self.time_candidates(handle, key, &plan, &algos) } else { 0 };
        plan.algo = algos[chosen];
        Ok(Some(plan))
    }

    /// Times each of `algos` on scratch buffers of `key`'s sizes and returns the index to keep.
    fn time_candidates(
        &self,
        handle: sys::cublasLtHandle_t,
        key: &GemmKey,
        plan: &GemmPlan,
        algos: &[sys::cublasLtMatmulAlgo_t],
    ) -> usize {
        let (alpha, beta) = (1.0f32, if key.accumulate { 1.0f32 } else { 0.0 });
        self.time_choices(&key.bytes(), algos, &|algo, scratch| {
            // SAFETY: the scratch blocks hold the operands the layouts describe; alpha and
            // beta are f32 and live through the call; the workspace is used in stream order.
            unsafe {
                self.lt_matmul(
                    handle,
                    &LtCall {
                        desc: plan.desc,
                        layouts: [plan.a, plan.b, plan.c, plan.c],
                        ptrs: [scratch[0], scratch[1], scratch[2], scratch[2]],
                        scale: (alpha, beta),
                    },
                    algo,
                )
            }
            .map_err(lt_err("cublasLtMatmul"))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_route_is_named_by_the_setting() {
        assert_eq!(GemmRoute::parse(None), GemmRoute::Cublas);
        assert_eq!(GemmRoute::parse(Some("cublas")), GemmRoute::Cublas);
        assert_eq!(GemmRoute::parse(Some("lt")), GemmRoute::Heuristic);
        assert_eq!(GemmRoute::parse(Some("tuned")), GemmRoute::Timed);
        assert_eq!(GemmRoute::parse(Some("fast")), GemmRoute::Cublas);
    }

    #[test]
    fn the_alignment_is_the_least_of_the_operands_up_to_256_bytes() {
        assert_eq!(alignment(&[0x1000, 0x2000, 0x10_0000]), 256);
        // A column block of a packed q/k/v tensor (1,024 bytes in) and a row 16 bytes in.
        assert_eq!(alignment(&[0x1000 + 1024, 0x2000 + 16, 0x3000]), 16);
        assert_eq!(alignment(&[0x1002]), 2);
        // Absent operands (0) do not count.
        assert_eq!(alignment(&[0x1100, 0]), 256);
        assert_eq!(alignment(&[]), 256);
    }

    #[test]
    fn operands_span_their_leading_dimension_times_their_columns() {
        // The weight grad of a linear layer: dWᵀ[in, out] += xᵀ[in, N] · dy[N, out], x and dy
        // bf16, dW f32 (see ops::linear_backward).
        let key = GemmKey {
            trans_a: false,
            trans_b: true,
            m: 512,
            n: 1536,
            k: 4096,
            lda: 512,
            ldb: 1536,
            ldc: 512,
            a: DType::BF16,
            b: DType::BF16,
            c: DType::F32,
            tf32: false,
            accumulate: true,
            route: GemmRoute::Timed,
            align: 256,
        };
        assert_eq!(key.stored(), [(512, 4096), (1536, 4096), (512, 1536)]);
        assert_eq!(key.bytes(), [512 * 4096 * 2, 1536 * 4096 * 2, 512 * 1536 * 4]);
    }
}
