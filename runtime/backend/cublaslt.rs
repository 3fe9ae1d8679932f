//! cublasLt GEMMs with fused epilogues: bias, GELU, and bias + GELU with the pre-activation
//! saved for the backward (cublasLt's `*_AUX` epilogues), and a residual added to the product
//! (`D = A·B + C` with C apart from D, which `cublasGemmEx` cannot do). The algorithm for each shape comes
//! from cublasLt's heuristic once (under `GRAPHED_GEMM=tuned`, the fastest of its candidates,
//! timed: see `cublaslt_gemm.rs`) and is cached with its descriptors; the workspace is the
//! cuBLAS one (same stream, so the two never overlap). Nothing allocates device memory here,
//! so these GEMMs capture like the cuBLAS ones.

use std::collections::HashMap;
use std::ffi::c_void;
use std::mem::size_of;

use cudarc::cublaslt::{result as lt, sys};

use super::cublaslt_gemm::{GemmRoute, CANDIDATES};
use super::cuda::{CudaBackend, CUBLAS_WORKSPACE_BYTES};
use crate::{DType, Error, Result};

/// What cublasLt applies to the GEMM result before storing it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum LtEpilogue {
    /// Nothing: the product as it is (plus the residual, when one is given).
    Plain,
    /// `+ bias`.
    Bias,
    /// GELU (cublasLt's tanh form), the pre-activation stored in `aux`.
    GeluAux,
    /// `+ bias`, then GELU; the pre-activation stored in `aux`.
    GeluAuxBias,
}

impl LtEpilogue {
    fn raw(self) -> sys::cublasLtEpilogue_t {
        match self {
            LtEpilogue::Plain => sys::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_DEFAULT,
            LtEpilogue::Bias => sys::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_BIAS,
            LtEpilogue::GeluAux => sys::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_GELU_AUX,
            LtEpilogue::GeluAuxBias => sys::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_GELU_AUX_BIAS,
        }
    }
}

/// `y[rows, out] = epilogue(x[rows, in] · w[out, in]ᵀ) (+ residual[rows, out])`, all pointers
/// device addresses; the residual is added in f32 before the one rounding to the dtype.
#[derive(Clone, Copy, Debug)]
pub(crate) struct LtLinear {
    pub(crate) op: &'static str,
    pub(crate) epilogue: LtEpilogue,
    pub(crate) dtype: DType,
    pub(crate) tf32: bool,
    pub(crate) rows: usize,
    pub(crate) input: usize,
    pub(crate) out: usize,
    pub(crate) x: u64,
    pub(crate) w: u64,
    pub(crate) y: u64,
    /// 0 when the epilogue has no bias.
    pub(crate) bias: u64,
    /// 0 when the epilogue has no aux output.
    pub(crate) aux: u64,
    /// 0 for none: `y`'s shape and dtype, read as cublasLt's C with `beta = 1` (it may not be `y`).
    pub(crate) residual: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct Key {
    epilogue: LtEpilogue,
    dtype: DType,
    tf32: bool,
    rows: usize,
    input: usize,
    out: usize,
    /// C (the residual) apart from D: only algorithms that support it
    /// (`CUBLASLT_ALGO_CAP_OUT_OF_PLACE_RESULT_SUPPORT`).
    out_of_place: bool,
    /// What the operands' addresses are multiples of ([`alignment`]).
    align: u32,
}

/// The descriptors and the chosen algorithm of one shape.
struct Plan {
    desc: sys::cublasLtMatmulDesc_t,
    a: sys::cublasLtMatrixLayout_t,
    b: sys::cublasLtMatrixLayout_t,
    d: sys::cublasLtMatrixLayout_t,
    algo: sys::cublasLtMatmulAlgo_t,
}

/// The cublasLt handle and the per-shape plans (`None`: cublasLt has no algorithm for it): the
/// linear ops' fused epilogues here, the plain GEMMs of `GRAPHED_GEMM` in `cublaslt_gemm.rs`.
pub(crate) struct Lt {
    handle: sys::cublasLtHandle_t,
    plans: HashMap<Key, Option<Plan>>,
    pub(crate) gemms: super::cublaslt_gemm::GemmPlans,
}

// SAFETY: the handle and descriptors are plain host objects that cublasLt allows to be used
// from any thread; `CudaBackend` keeps `Lt` in a `Mutex`, so they are never used concurrently.
unsafe impl Send for Lt {}

impl std::fmt::Debug for Lt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Lt({} plans)", self.plans.len())
    }
}

pub(super) fn data_type(d: DType) -> sys::cudaDataType {
    match d {
        DType::F32 => sys::cudaDataType::CUDA_R_32F,
        DType::BF16 => sys::cudaDataType::CUDA_R_16BF,
        DType::F16 => sys::cudaDataType::CUDA_R_16F,
        // Never reached: the GEMM ops take float dtypes only (check_like); cuBLAS refuses it.
        DType::I32 => sys::cudaDataType::CUDA_R_32I,
    }
}

pub(super) fn lt_err(call: &'static str) -> impl Fn(lt::CublasError) -> Error {
    move |e| Error::cuda(call, e)
}

/// Sets one attribute of a matmul descriptor from a plain value.
///
/// # Safety
/// `desc` is a live descriptor and `T` is the attribute's documented type.
pub(super) unsafe fn set_desc<T>(
    desc: sys::cublasLtMatmulDesc_t,
    attr: sys::cublasLtMatmulDescAttributes_t,
    v: &T,
) -> Result<()> {
    // SAFETY: forwarded from the caller; `v` outlives the call, which copies it.
    unsafe { lt::set_matmul_desc_attribute(desc, attr, v as *const T as *const c_void, size_of::<T>()) }
        .map_err(lt_err("cublasLtMatmulDescSetAttribute"))
}

impl Lt {
    /// A cublasLt handle, or `None` when libcublasLt cannot be loaded or initialised (the
    /// fused ops then run unfused).
    pub(crate) fn open() -> Option<Lt> {
        // SAFETY: only tries to dlopen the library by name.
        if !unsafe { sys::is_culib_present() } {
            return None;
        }
        lt::create_handle().ok().map(|handle| Lt { handle, plans: HashMap::new(), gemms: HashMap::new() })
    }

    /// The handle (used under the lock around `Lt`).
    pub(crate) fn handle(&self) -> sys::cublasLtHandle_t {
        self.handle
    }

    /// The plan of `key`, made once: descriptors, layouts and an algorithm, the heuristic's
    /// first, or with `candidates` above 1 the one `choose` picks of the heuristic's first
    /// `candidates` usable ones (in its order).
    fn plan(
        &mut self,
        key: Key,
        candidates: usize,
        choose: impl FnOnce(&Plan, &[sys::cublasLtMatmulAlgo_t]) -> usize,
    ) -> Result<Option<&Plan>> {
        if !self.plans.contains_key(&key) {
            let plan = make_plan(self.handle, key, candidates)?.map(|(mut plan, algos)| {
                let chosen = if algos.len() > 1 { choose(&plan, &algos) } else { 0 };
                plan.algo = algos[chosen.min(algos.len() - 1)];
                plan
            });
            self.plans.insert(key, plan);
        }
        Ok(self.plans.get(&key).and_then(Option::as_ref))
    }
}

/// The descriptors of `key` and the algorithms to choose from (at least one, the first the
/// heuristic's first usable one): `candidates` of them at most. `None` when there is none.
fn make_plan(
    handle: sys::cublasLtHandle_t,
    key: Key,
    candidates: usize,
) -> Result<Option<(Plan, Vec<sys::cublasLtMatmulAlgo_t>)>> {
    let compute = match (key.dtype, key.tf32) {
        (DType::F32, true) => sys::cublasComputeType_t::CUBLAS_COMPUTE_32F_FAST_TF32,
        _ => sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
    };
    let (m, n, k) = (key.out as u64, key.rows as u64, key.input as u64);
    let dt = data_type(key.dtype);
    let desc =
        lt::create_matmul_desc(compute, sys::cudaDataType::CUDA_R_32F).map_err(lt_err("cublasLtMatmulDescCreate"))?;
    // Row-major y = x wᵀ is column-major D[out, rows] = op(A) B with A = w seen as [in, out]
    // (transposed) and B = x seen as [in, rows].
    let layouts = (|| -> Result<_> {
        let a = lt::create_matrix_layout(dt, k, m, k as i64).map_err(lt_err("cublasLtMatrixLayoutCreate"))?;
        let b = lt::create_matrix_layout(dt, k, n, k as i64).map_err(lt_err("cublasLtMatrixLayoutCreate"))?;
        let d = lt::create_matrix_layout(dt, m, n, m as i64).map_err(lt_err("cublasLtMatrixLayoutCreate"))?;
        Ok((a, b, d))
    })()?;
    let (a, b, d) = layouts;
    use sys::cublasLtMatmulDescAttributes_t as A;
    // SAFETY: `desc` was just created; TRANSA/TRANSB are cublasOperation_t (i32: 1 = T,
    // 0 = N), EPILOGUE is cublasLtEpilogue_t, AUX_LD is i64.
    unsafe {
        set_desc(desc, A::CUBLASLT_MATMUL_DESC_TRANSA, &1i32)?;
        set_desc(desc, A::CUBLASLT_MATMUL_DESC_TRANSB, &0i32)?;
        set_desc(desc, A::CUBLASLT_MATMUL_DESC_EPILOGUE, &key.epilogue.raw())?;
        if matches!(key.epilogue, LtEpilogue::GeluAux | LtEpilogue::GeluAuxBias) {
            set_desc(desc, A::CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &(m as i64))?;
        }
    }
    // Out of place, of the heuristic's eight best (or the candidates asked for) those that
    // write D apart from C; in place, its first.
    let asked = if candidates > 1 {
        candidates.max(8)
    } else if key.out_of_place {
        8
    } else {
        1
    };
    // SAFETY: the descriptor and layouts were just made; the heuristic reads them only.
    let found = unsafe { choices(handle, desc, (a, b, d), asked, key.out_of_place, key.align) };
    match found {
        Ok(mut algos) if !algos.is_empty() => {
            algos.truncate(candidates.max(1));
            // SAFETY: an all-zero algorithm is plain data, replaced by the caller before use.
            Ok(Some((Plan { desc, a, b, d, algo: unsafe { std::mem::zeroed() } }, algos)))
        }
        _ => {
            // No algorithm for this shape and epilogue: the op runs unfused.
            // SAFETY: created above and not used anywhere else.
            unsafe { destroy_plan(desc, a, b, d) };
            Ok(None)
        }
    }
}

/// The heuristic's usable algorithms of its `asked` best within the cuBLAS workspace (see
/// [`usable_algos`]), C with D's layout, for operands whose addresses are multiples of `align`
/// bytes (see [`alignment`]: an algorithm chosen for better-aligned operands may refuse them).
///
/// # Safety
/// The handle, descriptor and layouts are live.
pub(super) unsafe fn choices(
    handle: sys::cublasLtHandle_t,
    desc: sys::cublasLtMatmulDesc_t,
    layouts: (sys::cublasLtMatrixLayout_t, sys::cublasLtMatrixLayout_t, sys::cublasLtMatrixLayout_t),
    asked: usize,
    out_of_place: bool,
    align: u32,
) -> std::result::Result<Vec<sys::cublasLtMatmulAlgo_t>, lt::CublasError> {
    use sys::cublasLtMatmulPreferenceAttributes_t as P;
    let pref = lt::create_matmul_pref()?;
    let bytes = CUBLAS_WORKSPACE_BYTES as u64;
    // SAFETY: `pref` was just created; MAX_WORKSPACE_BYTES is a u64, the alignments u32; the
    // rest is forwarded from the caller. The heuristic reads the live descriptors only (no
    // device work).
    let found = unsafe {
        let set = |attr, v: *const c_void, n| lt::set_matmul_pref_attribute(pref, attr, v, n);
        set(P::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &bytes as *const u64 as *const c_void, size_of::<u64>())
            .and_then(|()| {
                [
                    P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
                    P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                    P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
                    P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
                ]
                .into_iter()
                .try_for_each(|attr| set(attr, &align as *const u32 as *const c_void, size_of::<u32>()))
            })
            .and_then(|()| usable_algos(handle, desc, layouts, pref, asked, out_of_place))
    };
    // SAFETY: created above, destroyed once.
    let _ = unsafe { lt::destroy_matmul_pref(pref) };
    found
}

/// The alignment cublasLt may assume of operands at `ptrs` (0s, absent operands, ignored): the
/// largest power of two, up to 256 (its default assumption), that divides every address.
pub(super) fn alignment(ptrs: &[u64]) -> u32 {
    ptrs.iter().filter(|&&p| p != 0).map(|&p| 1u64 << p.trailing_zeros().min(8)).min().unwrap_or(256) as u32
}

/// The heuristic's usable algorithms of its `asked` best, in its order: those that ran its
/// check and fit the workspace, and with `out_of_place` only those that write D apart from C
/// (not every algorithm does: cublasLt's `CUBLASLT_ALGO_CAP_OUT_OF_PLACE_RESULT_SUPPORT`).
///
/// # Safety
/// The handle, descriptor, layouts and preference are live.
unsafe fn usable_algos(
    handle: sys::cublasLtHandle_t,
    desc: sys::cublasLtMatmulDesc_t,
    (a, b, d): (sys::cublasLtMatrixLayout_t, sys::cublasLtMatrixLayout_t, sys::cublasLtMatrixLayout_t),
    pref: sys::cublasLtMatmulPreference_t,
    asked: usize,
    out_of_place: bool,
) -> std::result::Result<Vec<sys::cublasLtMatmulAlgo_t>, lt::CublasError> {
    // SAFETY: forwarded from the caller.
    let results = unsafe { heuristic(handle, desc, (a, b, d, d), pref, asked) }?;
    let writes_apart = |algo: &sys::cublasLtMatmulAlgo_t| {
        let mut supported = 0i32;
        let mut written = 0usize;
        // SAFETY: the algorithm came from the heuristic; the attribute is an i32 flag written into a live local.
        let status = unsafe {
            sys::cublasLtMatmulAlgoCapGetAttribute(
                algo,
                sys::cublasLtMatmulAlgoCapAttributes_t::CUBLASLT_ALGO_CAP_OUT_OF_PLACE_RESULT_SUPPORT,
                &mut supported as *mut i32 as *mut c_void,
                size_of::<i32>(),
                &mut written,
            )
        };
        status == sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS && supported != 0
    };
    let usable: Vec<_> = results
        .iter()
        .filter(|r| r.state == sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS && r.workspaceSize <= CUBLAS_WORKSPACE_BYTES)
        .filter(|r| !out_of_place || writes_apart(&r.algo))
        .map(|r| r.algo)
        .collect();
    if usable.is_empty() {
        return Err(lt::CublasError(sys::cublasStatus_t::CUBLAS_STATUS_NOT_SUPPORTED));
    }
    Ok(usable)
}

/// The heuristic's best algorithms for the problem, at most `asked` of them, best first (each
/// with its own `state`: not every one may run).
///
/// # Safety
/// The handle, descriptor, layouts and preference are live.
pub(super) unsafe fn heuristic(
    handle: sys::cublasLtHandle_t,
    desc: sys::cublasLtMatmulDesc_t,
    (a, b, c, d): (
        sys::cublasLtMatrixLayout_t,
        sys::cublasLtMatrixLayout_t,
        sys::cublasLtMatrixLayout_t,
        sys::cublasLtMatrixLayout_t,
    ),
    pref: sys::cublasLtMatmulPreference_t,
    asked: usize,
) -> std::result::Result<Vec<sys::cublasLtMatmulHeuristicResult_t>, lt::CublasError> {
    // SAFETY: the results are plain data, written by the call below before they are read.
    let mut results: Vec<sys::cublasLtMatmulHeuristicResult_t> = vec![unsafe { std::mem::zeroed() }; asked];
    let mut count = 0i32;
    // SAFETY: forwarded from the caller; `results` holds `asked` entries and `count` is a live local.
    unsafe {
        sys::cublasLtMatmulAlgoGetHeuristic(
            handle,
            desc,
            a,
            b,
            c,
            d,
            pref,
            asked as i32,
            results.as_mut_ptr(),
            &mut count,
        )
    }
    .result()?;
    results.truncate(count.clamp(0, asked as i32) as usize);
    Ok(results)
}

/// # Safety
/// Each object is live and destroyed once.
unsafe fn destroy_plan(
    desc: sys::cublasLtMatmulDesc_t,
    a: sys::cublasLtMatrixLayout_t,
    b: sys::cublasLtMatrixLayout_t,
    d: sys::cublasLtMatrixLayout_t,
) {
    // SAFETY: forwarded from the caller. Errors are ignored: only host memory is released.
    unsafe {
        let _ = lt::destroy_matmul_desc(desc);
        let _ = lt::destroy_matrix_layout(a);
        let _ = lt::destroy_matrix_layout(b);
        let _ = lt::destroy_matrix_layout(d);
    }
}

impl Drop for Lt {
    fn drop(&mut self) {
        for plan in self.plans.values().flatten() {
            // SAFETY: each plan's objects are destroyed once, here, after the device drained.
            unsafe { destroy_plan(plan.desc, plan.a, plan.b, plan.d) };
        }
        for plan in self.gemms.values().flatten() {
            // SAFETY: as above.
            unsafe { plan.destroy() };
        }
        // SAFETY: created in `open`, destroyed once.
        let _ = unsafe { lt::destroy_handle(self.handle) };
    }
}

/// One cublasLt matmul, `D = alpha · op(A)·op(B) + beta · C`: a plan's descriptor, the layouts
/// and addresses of A, B, C and D, and (alpha, beta).
pub(super) struct LtCall {
    pub(super) desc: sys::cublasLtMatmulDesc_t,
    pub(super) layouts: [sys::cublasLtMatrixLayout_t; 4],
    pub(super) ptrs: [u64; 4],
    pub(super) scale: (f32, f32),
}

impl CudaBackend {
    /// Runs `call` with `algo` on the device stream, with the cuBLAS workspace.
    ///
    /// # Safety
    /// The handle, descriptor and layouts are live; each address is a device block holding the
    /// matrix its layout describes; the workspace is used in this stream's order only.
    pub(super) unsafe fn lt_matmul(
        &self,
        handle: sys::cublasLtHandle_t,
        call: &LtCall,
        algo: &sys::cublasLtMatmulAlgo_t,
    ) -> std::result::Result<(), lt::CublasError> {
        let [la, lb, lc, ld] = call.layouts;
        let [a, b, c, d] = call.ptrs;
        let (alpha, beta) = call.scale;
        // SAFETY: forwarded from the caller; alpha and beta are f32 (the scale type) and live
        // through the call, which reads them on the host.
        unsafe {
            lt::matmul(
                handle,
                call.desc,
                (&alpha) as *const f32 as *const c_void,
                (&beta) as *const f32 as *const c_void,
                a as *const c_void,
                la,
                b as *const c_void,
                lb,
                c as *const c_void,
                lc,
                d as *mut c_void,
                ld,
                algo,
                self.cublas_workspace as *mut c_void,
                CUBLAS_WORKSPACE_BYTES,
                self.stream.cu_stream() as sys::cudaStream_t,
            )
        }
    }

    /// Runs `g` through cublasLt on the device stream. `Ok(false)` when cublasLt is not
    /// available or has no algorithm for this shape and epilogue: the caller runs the unfused
    /// ops instead. A refused launch is [`Error::GemmRejected`].
    pub(crate) fn lt_linear(&self, g: &LtLinear) -> Result<bool> {
        let Some(lt_state) = &self.lt else { return Ok(false) };
        let _entered = self.gate.enter()?;
        self.injected_gemm("cublasLtMatmul")?;
        let mut lt_state = lt_state.lock().unwrap_or_else(|e| e.into_inner());
        self.bind()?;
        let key = Key {
            epilogue: g.epilogue,
            dtype: g.dtype,
            tf32: g.tf32,
            rows: g.rows,
            input: g.input,
            out: g.out,
            out_of_place: g.residual != 0,
            align: alignment(&[g.x, g.w, g.y, g.residual, g.bias, g.aux]),
        };
        let handle = lt_state.handle;
        // `GRAPHED_GEMM=tuned`: the fastest of the heuristic's candidates, timed the first time
        // the shape runs outside a capture (see `cublaslt_gemm.rs`).
        let tuned = GemmRoute::requested() == GemmRoute::Timed && !super::capture::is_capturing();
        let candidates = if tuned { CANDIDATES } else { 1 };
        let Some(plan) = lt_state.plan(key, candidates, |plan, algos| self.time_linear(handle, &key, plan, algos))?
        else {
            return Ok(false);
        };
        use sys::cublasLtMatmulDescAttributes_t as A;
        // C is the residual (beta 1) or, unread, y itself (beta 0); it shares D's layout.
        let (alpha, beta, c) = if g.residual != 0 { (1.0f32, 1.0f32, g.residual) } else { (1.0f32, 0.0f32, g.y) };
        // SAFETY: the op checked every pointer against a live block of the right size and the
        // shapes against the plan's layouts; the pointer attributes are `*const c_void`; the
        // workspace is the cuBLAS one, used only on this stream; the Lt lock and the cuBLAS
        // stream order keep the two from overlapping.
        let status = unsafe {
            if g.bias != 0 {
                set_desc(plan.desc, A::CUBLASLT_MATMUL_DESC_BIAS_POINTER, &(g.bias as *const c_void))?;
            }
            if g.aux != 0 {
                set_desc(plan.desc, A::CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &(g.aux as *const c_void))?;
            }
            self.lt_matmul(
                handle,
                &LtCall {
                    desc: plan.desc,
                    layouts: [plan.a, plan.b, plan.d, plan.d],
                    ptrs: [g.w, g.x, c, g.y],
                    scale: (alpha, beta),
                },
                &plan.algo,
            )
        };
        status.map(|()| true).map_err(|e| Error::GemmRejected {
            op: g.op,
            dtype: g.dtype,
            m: g.out,
            n: g.rows,
            k: g.input,
            status: format!("cublasLtMatmul: {e:?}"),
        })
    }

    /// Times `algos` for `key` on scratch operands (w, x, y, the residual, the bias, the aux
    /// output) and returns the index to keep (see `tuning.rs`).
    fn time_linear(
        &self,
        handle: sys::cublasLtHandle_t,
        key: &Key,
        plan: &Plan,
        algos: &[sys::cublasLtMatmulAlgo_t],
    ) -> usize {
        let s = key.dtype.size();
        let (rows, input, out) = (key.rows, key.input, key.out);
        let with_bias = matches!(key.epilogue, LtEpilogue::Bias | LtEpilogue::GeluAuxBias);
        let with_aux = matches!(key.epilogue, LtEpilogue::GeluAux | LtEpilogue::GeluAuxBias);
        // W, X, D, then C, the bias and the aux output where the plan reads or writes them.
        let only = |used: bool, b: usize| if used { b } else { 0 };
        let bytes = [
            out * input * s,
            rows * input * s,
            rows * out * s,
            only(key.out_of_place, rows * out * s),
            only(with_bias, out * s),
            only(with_aux, rows * out * s),
        ];
        let (alpha, beta) = (1.0f32, if key.out_of_place { 1.0f32 } else { 0.0 });
        use sys::cublasLtMatmulDescAttributes_t as A;
        self.time_choices(&bytes, algos, &|algo, p| {
            let c = if key.out_of_place { p[3] } else { p[2] };
            // SAFETY: the scratch blocks hold the operands the plan's layouts describe (the bias
            // `out` elements, the aux output D's shape); the pointer attributes are
            // `*const c_void`; alpha and beta are f32 and live through the call; the workspace is
            // used in stream order. The calls that run the plan set the pointers again.
            unsafe {
                if with_bias {
                    set_desc(plan.desc, A::CUBLASLT_MATMUL_DESC_BIAS_POINTER, &(p[4] as *const c_void))?;
                }
                if with_aux {
                    set_desc(plan.desc, A::CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &(p[5] as *const c_void))?;
                }
                self.lt_matmul(
                    handle,
                    &LtCall {
                        desc: plan.desc,
                        layouts: [plan.a, plan.b, plan.d, plan.d],
                        ptrs: [p[0], p[1], c, p[2]],
                        scale: (alpha, beta),
                    },
                    algo,
                )
                .map_err(lt_err("cublasLtMatmul"))
            }
        })
    }
}
