// bench/xent_sweep.py's own kernels, compiled after the runtime's main program (its helpers:
// RnInput, rn_row_max/rn_row_sum, label_ok, st_all): the cross-entropy row kernel as it was
// before session 22 (old_sx_rows_*, below: thread 0 reads the label's logit again from memory
// after the row's reductions; expf) and a one-reduction form (online_sx_rows_*: each thread's max and sum of
// exps merged across the row, the online softmax; other bits than sx_rows). Measurement
// variants only: the runtime launches neither. old_softmax_xent_*: the one-block-a-row kernel
// before session 22 (three reads of the row: its max, its sum, the probabilities).
template <typename T>
__device__ __forceinline__ void online_sx_rows_t(T* probs, float* row_loss, const T* logits, const float* labels, u32 rows, u32 c) {
    constexpr u32 W = 16 / sizeof(T);
    constexpr u32 V = RN_FWD_VPT;
    __shared__ float red_m[32], red_s[32];
    const bool vec = c % W == 0 && al16(probs) && al16(logits);
    const u64 groups = ((u64)rows + blockDim.y - 1) / blockDim.y;
    RnInput<T, V, (RN_PREFETCH != 0)> in_x(logits, c, vec, groups, rows);
    for (u64 grp = blockIdx.x; grp < groups; grp += gridDim.x) {
        const u64 r = grp * blockDim.y + threadIdx.y;
        const bool ok = r < rows;
        const float l = ok ? labels[r] : IGNORE_LABEL;
        const bool lok = label_ok(l, c);
        const u32 lj = lok ? (u32)l : 0xffffffffu;
        Pack<T> px[V];
        in_x.take(px, grp, groups, rows);
        float mt = gr_neg_inf(), xl = 0.0f;
        bool mine = false;
#pragma unroll
        for (u32 i = 0; i < V; ++i) {
#pragma unroll
            for (u32 k = 0; k < W; ++k) {
                if (rn_in(vec, i, k, W, c)) {
                    const float v = ld(px[i].e, k);
                    mt = fmaxf(mt, v);
                    if (rn_col(vec, i, k, W) == lj) { xl = v; mine = true; }
                }
            }
        }
        float e[V * W];
        float st_ = 0.0f;
#pragma unroll
        for (u32 i = 0; i < V; ++i) {
#pragma unroll
            for (u32 k = 0; k < W; ++k) {
                e[i * W + k] = rn_in(vec, i, k, W, c) ? expf(ld(px[i].e, k) - mt) : 0.0f;
                st_ += e[i * W + k];
            }
        }
        float m = mt, s = st_;
        const u32 tpr = blockDim.x;
        for (u32 o = (tpr < 32u ? tpr : 32u) >> 1; o > 0; o >>= 1) {
            const float mo = __shfl_xor_sync(0xffffffffu, m, o), so = __shfl_xor_sync(0xffffffffu, s, o);
            sx_merge(m, s, mo, so);
        }
        if (tpr > 32u) {
            const u32 lin = threadIdx.y * tpr + threadIdx.x, wpr = tpr >> 5;
            __syncthreads();
            if ((lin & 31u) == 0u) { red_m[lin >> 5] = m; red_s[lin >> 5] = s; }
            __syncthreads();
            m = red_m[threadIdx.y * wpr];
            s = red_s[threadIdx.y * wpr];
            for (u32 w = 1; w < wpr; ++w) sx_merge(m, s, red_m[threadIdx.y * wpr + w], red_s[threadIdx.y * wpr + w]);
        }
        const float f = (mt == gr_neg_inf() ? 0.0f : expf(mt - m)) / s;
#pragma unroll
        for (u32 i = 0; i < V; ++i) {
            float o[W];
#pragma unroll
            for (u32 k = 0; k < W; ++k) o[k] = e[i * W + k] * f;
            st_all(px[i].e, o);
        }
        if (ok) {
            rn_store(probs + r * c, px, c, vec);
            if (mine) {
                row_loss[r] = (m + logf(s)) - xl;
            } else if (!lok && threadIdx.x == 0) {
                row_loss[r] = l == IGNORE_LABEL ? 0.0f : gr_nan();
            }
        }
    }
}
extern "C" __global__ void online_sx_rows_f32(float* p, float* rl, const float* x, const float* l, u32 rows, u32 c) { online_sx_rows_t(p, rl, x, l, rows, c); }
extern "C" __global__ void online_sx_rows_bf16(bf16_t* p, float* rl, const bf16_t* x, const float* l, u32 rows, u32 c) { online_sx_rows_t(p, rl, x, l, rows, c); }
// The one-reduction form held to 64 registers (four 256-thread blocks an SM), as the runtime's
// sx_rows_* are since session 23 (they took 93 at 4 words a thread: two blocks an SM).
extern "C" __global__ void __launch_bounds__(256, 4) lb_online_sx_rows_f32(float* p, float* rl, const float* x, const float* l, u32 rows, u32 c) { online_sx_rows_t(p, rl, x, l, rows, c); }
extern "C" __global__ void __launch_bounds__(256, 4) lb_online_sx_rows_bf16(bf16_t* p, float* rl, const bf16_t* x, const float* l, u32 rows, u32 c) { online_sx_rows_t(p, rl, x, l, rows, c); }

template <typename T>
__device__ __forceinline__ void old_softmax_xent_t(T* probs, float* row_loss, const T* logits, const float* labels, u32 rows, u32 c) {
    __shared__ float sh[32];
    for (u64 r = blockIdx.x; r < rows; r += gridDim.x) {
        const T* xr = logits + r * c;
        T* pr = probs + r * c;
        float m = gr_neg_inf();
        for (u32 j = threadIdx.x; j < c; j += blockDim.x) m = fmaxf(m, ld(xr, j));
        m = block_max(m, sh);
        float s = 0.0f;
        for (u32 j = threadIdx.x; j < c; j += blockDim.x) s += expf(ld(xr, j) - m);
        s = block_sum(s, sh);
        const float inv = 1.0f / s;
        for (u32 j = threadIdx.x; j < c; j += blockDim.x) st(pr, j, expf(ld(xr, j) - m) * inv);
        if (threadIdx.x == 0) {
            const float l = labels[r];
            row_loss[r] = label_ok(l, c) ? (m + logf(s)) - ld(xr, (u32)l) : l == IGNORE_LABEL ? 0.0f : gr_nan();
        }
    }
}
extern "C" __global__ void old_softmax_xent_f32(float* p, float* rl, const float* x, const float* l, u32 rows, u32 c) { old_softmax_xent_t(p, rl, x, l, rows, c); }
extern "C" __global__ void old_softmax_xent_bf16(bf16_t* p, float* rl, const bf16_t* x, const float* l, u32 rows, u32 c) { old_softmax_xent_t(p, rl, x, l, rows, c); }

// The runtime's sx_rows_t with expf for its exponentials (kind early: the label's logit read by
// thread 0 when the row group starts, as the runtime does), and with that read after the row's
// reductions too (LATE; kind old: the kernel before session 22, whose bits both give).
template <typename T, bool LATE>
__device__ __forceinline__ void early_sx_rows_t(T* probs, float* row_loss, const T* logits, const float* labels, u32 rows, u32 c) {
    constexpr u32 W = 16 / sizeof(T);
    constexpr u32 V = RN_FWD_VPT;
    __shared__ float red[32];
    const bool vec = c % W == 0 && al16(probs) && al16(logits);
    const u64 groups = ((u64)rows + blockDim.y - 1) / blockDim.y;
    RnInput<T, V, (RN_PREFETCH != 0)> in_x(logits, c, vec, groups, rows);
    for (u64 grp = blockIdx.x; grp < groups; grp += gridDim.x) {
        const u64 r = grp * blockDim.y + threadIdx.y;
        const bool ok = r < rows;
        const float l = ok ? labels[r] : IGNORE_LABEL;
        const bool lok = label_ok(l, c);
        float xl = (!LATE && ok && lok && threadIdx.x == 0) ? ld(logits + r * c, (u32)l) : 0.0f;
        Pack<T> px[V];
        in_x.take(px, grp, groups, rows);
        float m = gr_neg_inf();
#pragma unroll
        for (u32 i = 0; i < V; ++i) {
#pragma unroll
            for (u32 k = 0; k < W; ++k) {
                if (rn_in(vec, i, k, W, c)) m = fmaxf(m, ld(px[i].e, k));
            }
        }
        m = rn_row_max(m, red);
        float e[V * W];
        float s = 0.0f;
#pragma unroll
        for (u32 i = 0; i < V; ++i) {
#pragma unroll
            for (u32 k = 0; k < W; ++k) {
                const float v = ld(px[i].e, k);
                e[i * W + k] = rn_in(vec, i, k, W, c) ? expf(v - m) : 0.0f;
                s += e[i * W + k];
            }
        }
        s = rn_row_sum(s, red);
        const float inv = 1.0f / s;
#pragma unroll
        for (u32 i = 0; i < V; ++i) {
            float o[W];
#pragma unroll
            for (u32 k = 0; k < W; ++k) o[k] = e[i * W + k] * inv;
            st_all(px[i].e, o);
        }
        if (ok) {
            rn_store(probs + r * c, px, c, vec);
            if (LATE && lok && threadIdx.x == 0) xl = ld(logits + r * c, (u32)l);
            if (threadIdx.x == 0) row_loss[r] = lok ? (m + logf(s)) - xl : l == IGNORE_LABEL ? 0.0f : gr_nan();
        }
    }
}
extern "C" __global__ void old_sx_rows_f32(float* p, float* rl, const float* x, const float* l, u32 rows, u32 c) { early_sx_rows_t<float, true>(p, rl, x, l, rows, c); }
extern "C" __global__ void old_sx_rows_bf16(bf16_t* p, float* rl, const bf16_t* x, const float* l, u32 rows, u32 c) { early_sx_rows_t<bf16_t, true>(p, rl, x, l, rows, c); }
extern "C" __global__ void early_sx_rows_f32(float* p, float* rl, const float* x, const float* l, u32 rows, u32 c) { early_sx_rows_t<float, false>(p, rl, x, l, rows, c); }
extern "C" __global__ void early_sx_rows_bf16(bf16_t* p, float* rl, const bf16_t* x, const float* l, u32 rows, u32 c) { early_sx_rows_t<bf16_t, false>(p, rl, x, l, rows, c); }

// The cross-entropy's one-block mean with every load a thread makes issued before it adds any
// (xent_mean_at_once_f32, 1,024 threads): for at most 8 x 1,024 rows each thread loads its
// rows (i, i + blockDim.x, ...) and labels into registers, masked, then adds them in that order,
// so the bits are xent_mean_f32's; the runtime's kernel issues eight rows at a time only where
// a thread has eight, and a loop iteration a row below that (4,096 rows: four). Measurement
// variant only: the runtime does not launch it (bench/xent_sweep.py, "the mean"). Session 25
// timed the runtime's kernel in this form (masked groups of eight, any row count) on an H100:
// 2.30 against 2.28 us at 4,096 rows, slower at 8,192 and 16,384; the loads are not the cost.
extern "C" __global__ void xent_mean_at_once_f32(float* out, const float* row_loss, const float* labels, u32 n) {
    __shared__ float sh[32];
    constexpr u32 U = 8;
    float lv[U], lb[U];
#pragma unroll
    for (u32 k = 0; k < U; ++k) {
        const u32 i = threadIdx.x + k * blockDim.x;
        lv[k] = i < n ? row_loss[i] : 0.0f;
        lb[k] = i < n ? labels[i] : IGNORE_LABEL;
    }
    float s = 0.0f, c = 0.0f;
#pragma unroll
    for (u32 k = 0; k < U; ++k) {
        if (threadIdx.x + k * blockDim.x < n) {
            s += lv[k];
            c += lb[k] != IGNORE_LABEL ? 1.0f : 0.0f;
        }
    }
    c = block_sum(c, sh);
    s = block_sum(s, sh);
    if (threadIdx.x == 0) out[0] = c > 0.0f ? s * __fdiv_rn(1.0f, c) : 0.0f;
}

// Row r of the variants below in shared memory as sx_smem_t holds it (no cluster): the row's
// first aligned word and on, `off` values into it; the whole words copied with cp.async in
// SxStages' groups, the partial ones value by value (issue), and a word of probabilities stored
// (store: 16 bytes, or value by value in a partial word).
template <typename T>
struct SxRow {
    static constexpr u32 W = 16 / sizeof(T);
    const T* xr;
    T* pr;
    u32 off, c;
    __device__ __forceinline__ SxRow(const T* logits, T* probs, u64 r, u32 c_)
        : xr(logits + r * c_), pr(probs + r * c_), off((u32)(((unsigned long long)xr & 15ull) / sizeof(T))), c(c_) {}
    __device__ __forceinline__ u32 words() const { return (off + c + W - 1) / W; }
    __device__ __forceinline__ bool whole(u32 w) const { return sx_whole(w, off, c, W); }
    __device__ __forceinline__ bool in(u32 w, u32 k) const { return sx_in(w, k, off, c, W); }
    __device__ __forceinline__ void issue(const SxStages& stg, uint4* row) const {
        const uint4* xw = reinterpret_cast<const uint4*>(xr - off);
        stg.issue([&](u32 w) {
            if (whole(w)) {
                gr_cp16(row + w, xw + w);
            } else {
                T* sv = reinterpret_cast<T*>(row + w);
                for (u32 k = 0; k < W; ++k) {
                    if (in(w, k)) sv[k] = xr[w * W + k - off];
                }
            }
        });
    }
    __device__ __forceinline__ void store(u32 w, const float (&o)[W]) const {
        if (whole(w)) {
            Pack<T> q;
            st_all(q.e, o);
            reinterpret_cast<uint4*>(pr - off)[w] = q.raw;
        } else {
            for (u32 k = 0; k < W; ++k) {
                if (in(w, k)) st(pr, w * W + k - off, o[k]);
            }
        }
    }
};

// The runtime's row in shared memory (sx_smem_t, one block a row, no cluster) with the row's
// sum of exps taken as its stages land (online_sx_smem_*): each thread keeps a running (max,
// sum) over its words, one rescale a word (the word's max first, then its exps against the
// larger max), merged across the block once (block_max_sum). Against sx_smem_t: one pass over
// shared memory and one block reduction fewer, and the sum's exps computed while later stages
// are still in flight; the probabilities' pass is sx_smem_t's. Other bits than sx_smem (the sum
// is rescaled). A measurement variant (session 39): on the H200 the bf16 cross-entropy
// forward takes the H100's microseconds at every width (30.7 against 30.8 us at 4096 x 4096,
// 182.7 against 186.6 at 4096 x 32768), so it waits on the multiprocessor's work, not on DRAM.
template <typename T>
__device__ __forceinline__ void online_sx_smem_t(T* probs, float* row_loss, const T* logits, const float* labels, u32 rows, u32 c) {
    constexpr u32 W = 16 / sizeof(T);
    uint4* sx_row = gr_sx_row;
    __shared__ float sh_m[32], sh_s[32];
    for (u64 r = blockIdx.x; r < rows; r += gridDim.x) {
        const SxRow<T> row(logits, probs, r, c);
        const SxStages stg(row.words());
        const u32 words = stg.words;
        const float l = labels[r];
        row.issue(stg, sx_row);
        float m = gr_neg_inf(), s = 0.0f;
        stg.land([&](u32 w) {
            Pack<T> p;
            p.raw = sx_row[w];
            const bool whole = row.whole(w);
            float wm = gr_neg_inf();
#pragma unroll
            for (u32 k = 0; k < W; ++k) {
                if (whole || row.in(w, k)) wm = fmaxf(wm, ld(p.e, k));
            }
            if (wm == gr_neg_inf()) return;  // every value masked: nothing to add
            const float mx = fmaxf(m, wm), ml = -mx * GR_LOG2E;
            float ws = 0.0f;
#pragma unroll
            for (u32 k = 0; k < W; ++k) {
                if (whole || row.in(w, k)) ws += sx_exp(ld(p.e, k), ml);
            }
            // exp(m - mx): 1 when the max stays, 0 from nothing yet (m = -inf).
            s = s * gr_ex2((m - mx) * GR_LOG2E) + ws;
            m = mx;
        });
        block_max_sum(m, s, sh_m, sh_s);
        // The row's loss comes from the thread that copied the label's word (thread 0 for a bad
        // label): a thread reads only the words it copied, so the block reduction is the only
        // barrier, as in sx_smem_t.
        const bool lok = label_ok(l, c);
        const u32 at = lok ? row.off + (u32)l : 0u;
        const bool mine = (at / W) % blockDim.x == threadIdx.x;
        const float xl = (mine && lok) ? ld(reinterpret_cast<const T*>(sx_row), at) : 0.0f;
        const float ml = -m * GR_LOG2E;
        const float inv = 1.0f / s;
        for (u32 w = threadIdx.x; w < words; w += blockDim.x) {
            Pack<T> p;
            p.raw = sx_row[w];
            float o[W];
#pragma unroll
            for (u32 k = 0; k < W; ++k) o[k] = sx_exp(ld(p.e, k), ml) * inv;
            row.store(w, o);
        }
        if (mine) row_loss[r] = lok ? (m + logf(s)) - xl : l == IGNORE_LABEL ? 0.0f : gr_nan();
    }
}
extern "C" __global__ void __launch_bounds__(1024) online_sx_smem_f32(float* p, float* rl, const float* x, const float* l, u32 rows, u32 c) { online_sx_smem_t(p, rl, x, l, rows, c); }
extern "C" __global__ void __launch_bounds__(1024) online_sx_smem_bf16(bf16_t* p, float* rl, const bf16_t* x, const float* l, u32 rows, u32 c) { online_sx_smem_t(p, rl, x, l, rows, c); }

// The runtime's row in shared memory (sx_smem_t, one block a row, no cluster) with each exp
// computed once (reg_sx_smem_*): the sum's pass keeps this thread's exps in registers (at most
// MAXW words a thread: the kernel returns where a row has more, and the sweep launches it only
// where it fits), and the probabilities' pass scales them instead of reading shared memory and
// taking the exps again. The same exps, the same sum in the same order and the same products
// as sx_smem_t: the same bits. A measurement variant (session 39), for the same reason as
// online_sx_smem_t: half the exps, and one pass over shared memory fewer.
template <typename T, u32 MAXW>
__device__ __forceinline__ void reg_sx_smem_t(T* probs, float* row_loss, const T* logits, const float* labels, u32 rows, u32 c) {
    constexpr u32 W = 16 / sizeof(T);
    uint4* sx_row = gr_sx_row;
    __shared__ float red[32];
    for (u64 r = blockIdx.x; r < rows; r += gridDim.x) {
        const SxRow<T> row(logits, probs, r, c);
        const SxStages stg(row.words());
        const u32 words = stg.words;
        if (words > MAXW * blockDim.x) return;  // the same for every thread of the block
        const float l = labels[r];
        row.issue(stg, sx_row);
        float m = gr_neg_inf();
        stg.land([&](u32 w) {
            Pack<T> p;
            p.raw = sx_row[w];
            const bool whole = row.whole(w);
#pragma unroll
            for (u32 k = 0; k < W; ++k) {
                if (whole || row.in(w, k)) m = fmaxf(m, ld(p.e, k));
            }
        });
        m = block_max(m, red);
        const bool lok = label_ok(l, c);
        const float xl = (threadIdx.x == 0 && lok) ? ld(reinterpret_cast<const T*>(sx_row), row.off + (u32)l) : 0.0f;
        const float ml = -m * GR_LOG2E;
        float e[MAXW][W];
        float s = 0.0f;
#pragma unroll
        for (u32 i = 0; i < MAXW; ++i) {
            const u32 w = threadIdx.x + i * blockDim.x;
            Pack<T> p;
            p.raw = w < words ? sx_row[w] : make_uint4(0u, 0u, 0u, 0u);
            const bool whole = row.whole(w);
#pragma unroll
            for (u32 k = 0; k < W; ++k) {
                const bool in = w < words && (whole || row.in(w, k));
                e[i][k] = in ? sx_exp(ld(p.e, k), ml) : 0.0f;
                if (in) s += e[i][k];
            }
        }
        s = block_sum(s, red);
        const float inv = 1.0f / s;
#pragma unroll
        for (u32 i = 0; i < MAXW; ++i) {
            const u32 w = threadIdx.x + i * blockDim.x;
            if (w >= words) break;
            float o[W];
#pragma unroll
            for (u32 k = 0; k < W; ++k) o[k] = e[i][k] * inv;
            row.store(w, o);
        }
        if (threadIdx.x == 0) row_loss[r] = lok ? (m + logf(s)) - xl : l == IGNORE_LABEL ? 0.0f : gr_nan();
    }
}
extern "C" __global__ void __launch_bounds__(1024) reg_sx_smem_f32(float* p, float* rl, const float* x, const float* l, u32 rows, u32 c) { reg_sx_smem_t<float, 4>(p, rl, x, l, rows, c); }
extern "C" __global__ void __launch_bounds__(1024) reg_sx_smem_bf16(bf16_t* p, float* rl, const bf16_t* x, const float* l, u32 rows, u32 c) { reg_sx_smem_t<bf16_t, 4>(p, rl, x, l, rows, c); }
