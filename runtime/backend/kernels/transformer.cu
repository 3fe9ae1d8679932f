// Transformer kernels (#13): token embedding, RMSNorm, SwiGLU, the softmax of causal attention.
// NVRTC compiles this file after ops.cu and half.cu, in one program: u32, u64, gr_tid,
// gr_stride, block_sum, block_max, GR_COL_Y, the 16-bit types and ld/st/map2 come from there.
// Every kernel is a template over the storage type T (f32, bf16, f16): values load to f32,
// statistics and sums stay f32, stores round to T. No atomics on data: every sum runs in an
// order fixed by the sizes (the error word below is the only atomic target).

// ---------------------------------------------------------------- the device's error word
//
// Four u32 words per device (CudaBackend::err_word, fixed for the device's life, so graphs may
// capture its address): words 0-1, one u64, the minimum over reports of (position << 32 | id
// bits), all ones when clear; word 2 the vocabulary (the largest reported); word 3 the op bits
// (1: embedding, 2: embedding_backward), zero when clear. The host reads and clears it.
__device__ __forceinline__ void gr_report_token(u32* err, u64 pos, float id, u32 vocab, u32 op_bit) {
    atomicMin(reinterpret_cast<unsigned long long*>(err), (pos << 32) | (u64)__float_as_uint(id));
    atomicMax(err + 2, vocab);
    atomicOr(err + 3, op_bit);
}

// The row `id` selects, or -1 for a value that is not an integer in 0..vocab.
__device__ __forceinline__ long long token_row(float id, u32 vocab) {
    return (id >= 0.0f && id < (float)vocab && id == floorf(id)) ? (long long)id : -1;
}

// y[t, :] = table[ids[t], :], one block per token (grid-stride). A bad id gives a zero row and
// is reported in the error word.
template <typename T>
__device__ __forceinline__ void embedding_t(T* y, const float* ids, const T* table, u32 tokens, u32 vocab, u32 d, u32* err) {
    for (u64 t = blockIdx.x; t < tokens; t += gridDim.x) {
        const long long r = token_row(ids[t], vocab);
        if (r < 0 && threadIdx.x == 0) gr_report_token(err, t, ids[t], vocab, 1u);
        for (u32 j = threadIdx.x; j < d; j += blockDim.x) st(y, t * d + j, r < 0 ? 0.0f : ld(table, (u64)r * d + j));
    }
}

// dtable[v, :] += sum over tokens t with ids[t] == v of dy[t, :]: one block per vocabulary row.
// The block reads the ids in tiles of blockDim.x (a multiple of 32, at most 1024), lists the
// tile's tokens of row v in token order (a ballot per warp, warps in order), then each thread
// adds those tokens' dy for its column, in f32: tokens in order, so the sum is deterministic
// without atomics (and the same as a plain scan). dtable is T or f32 (the f32 grad of a 16-bit
// table). Bad ids add nothing; row 0's block reports them.
template <typename TG, typename T>
__device__ __forceinline__ void embedding_bwd_t(TG* dtable, const T* dy, const float* ids, u32 tokens, u32 vocab, u32 d, u32* err) {
    __shared__ u32 hits[1024];
    __shared__ u32 warp_off[33];
    const u32 lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    for (u64 v = blockIdx.x; v < vocab; v += gridDim.x) {
        for (u32 j0 = 0; j0 < d; j0 += blockDim.x) {
            const u32 j = j0 + threadIdx.x;
            float s = 0.0f;
            for (u64 t0 = 0; t0 < tokens; t0 += blockDim.x) {
                const u64 t = t0 + threadIdx.x;
                const long long r = t < tokens ? token_row(ids[t], vocab) : -2;
                if (r == -1 && v == 0 && j0 == 0) gr_report_token(err, t, ids[t], vocab, 2u);
                const bool hit = r == (long long)v;
                const u32 mask = __ballot_sync(0xffffffffu, hit);
                if (lane == 0) warp_off[warp] = __popc(mask);
                __syncthreads();
                if (threadIdx.x == 0) {
                    u32 acc = 0;
                    for (u32 w = 0; w < nwarps; ++w) {
                        const u32 c = warp_off[w];
                        warp_off[w] = acc;
                        acc += c;
                    }
                    warp_off[32] = acc;
                }
                __syncthreads();
                if (hit) hits[warp_off[warp] + __popc(mask & ((1u << lane) - 1u))] = (u32)(t - t0);
                __syncthreads();
                const u32 n = warp_off[32];
                if (j < d) {
                    // Eight loads in flight, added in token order: the same sum, bit for bit,
                    // as one at a time (a frequent row's block waited on each load in turn).
                    u32 k = 0;
                    for (; k + 8 <= n; k += 8) {
                        float a[8];
#pragma unroll
                        for (u32 u = 0; u < 8; ++u) a[u] = ld(dy, (t0 + hits[k + u]) * d + j);
#pragma unroll
                        for (u32 u = 0; u < 8; ++u) s += a[u];
                    }
                    for (; k < n; ++k) s += ld(dy, (t0 + hits[k]) * d + j);
                }
                __syncthreads();
            }
            if (j < d) st(dtable, v * d + j, ld(dtable, v * d + j) + s);
        }
    }
}

// The warp of a one-warp-per-row kernel: rows r = blockIdx.x * warps + warp, + grid warps.
#define GR_WARP_ROWS(r, rows) \
    for (u64 r = (u64)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5); r < (rows); r += (u64)gridDim.x * (blockDim.x >> 5))

// y = x * rstd * gamma, rstd = 1 / sqrt(mean(x^2) + eps); one warp per row.
template <typename T>
__device__ __forceinline__ void rms_norm_t(T* y, float* rstd_out, const T* x, const T* gamma, u32 rows, u32 d, float eps) {
    constexpr u32 W = 16 / sizeof(T);
    const u32 lane = threadIdx.x & 31;
    // 16 bytes a load and store when the rows allow it (every row start 16-byte aligned).
    const bool vec = d % W == 0 && al16(x) && al16(y) && al16(gamma);
    GR_WARP_ROWS(r, rows) {
        const T* xr = x + r * d;
        float s = 0.0f;
        if (vec) {
            for (u32 c = lane; c < d / W; c += 32) {
                Pack<T> px;
                px.raw = reinterpret_cast<const uint4*>(xr)[c];
#pragma unroll
                for (u32 k = 0; k < W; ++k) s += ld(px.e, k) * ld(px.e, k);
            }
        } else {
            for (u32 j = lane; j < d; j += 32) s += ld(xr, j) * ld(xr, j);
        }
        const float rstd = 1.0f / sqrtf(warp_sum(s) / (float)d + eps);
        if (vec) {
            for (u32 c = lane; c < d / W; c += 32) {
                Pack<T> px, pg, py;
                px.raw = reinterpret_cast<const uint4*>(xr)[c];
                pg.raw = reinterpret_cast<const uint4*>(gamma)[c];
#pragma unroll
                for (u32 k = 0; k < W; ++k) st(py.e, k, ld(px.e, k) * rstd * ld(pg.e, k));
                reinterpret_cast<uint4*>(y + r * d)[c] = py.raw;
            }
        } else {
            for (u32 j = lane; j < d; j += 32) st(y, r * d + j, ld(xr, j) * rstd * ld(gamma, j));
        }
        if (lane == 0) rstd_out[r] = rstd;
    }
}

// dx = rstd * (g - xhat * mean(g * xhat)), g = dy * gamma, xhat = x * rstd; one warp per row,
// 16 bytes a load and store when the rows allow it.
template <typename T>
__device__ __forceinline__ void rms_norm_bwd_t(T* dx, const T* dy, const T* x, const T* gamma, const float* rstd, u32 rows, u32 d) {
    constexpr u32 W = 16 / sizeof(T);
    const u32 lane = threadIdx.x & 31;
    const bool vec = d % W == 0 && al16(dx) && al16(dy) && al16(x) && al16(gamma);
    GR_WARP_ROWS(r, rows) {
        const float rs = rstd[r];
        float s = 0.0f;
        if (vec) {
            for (u32 c = lane; c < d / W; c += 32) {
                Pack<T> pd, px, pg;
                pd.raw = reinterpret_cast<const uint4*>(dy + r * d)[c];
                px.raw = reinterpret_cast<const uint4*>(x + r * d)[c];
                pg.raw = reinterpret_cast<const uint4*>(gamma)[c];
#pragma unroll
                for (u32 k = 0; k < W; ++k) s += ld(pd.e, k) * ld(pg.e, k) * ld(px.e, k) * rs;
            }
        } else {
            for (u32 j = lane; j < d; j += 32) s += ld(dy, r * d + j) * ld(gamma, j) * ld(x, r * d + j) * rs;
        }
        const float m = warp_sum(s) / (float)d;
        if (vec) {
            for (u32 c = lane; c < d / W; c += 32) {
                Pack<T> pd, px, pg, po;
                pd.raw = reinterpret_cast<const uint4*>(dy + r * d)[c];
                px.raw = reinterpret_cast<const uint4*>(x + r * d)[c];
                pg.raw = reinterpret_cast<const uint4*>(gamma)[c];
#pragma unroll
                for (u32 k = 0; k < W; ++k) st(po.e, k, rs * (ld(pd.e, k) * ld(pg.e, k) - ld(px.e, k) * rs * m));
                reinterpret_cast<uint4*>(dx + r * d)[c] = po.raw;
            }
        } else {
            for (u32 j = lane; j < d; j += 32) {
                const float xh = ld(x, r * d + j) * rs;
                st(dx, r * d + j, rs * (ld(dy, r * d + j) * ld(gamma, j) - xh * m));
            }
        }
    }
}

// The first pass of dgamma[j] += sum_r dy[r, j] * x[r, j] * rstd[r]: (32, GR_COL_Y) blocks on a
// (column blocks, row chunks) grid; block (x, y) sums rows [y * chunk, (y + 1) * chunk) of its 32
// columns in f32 into partial[y, column]. col_partials_acc adds the chunks in order.
template <typename T>
__device__ __forceinline__ void rms_norm_bwd_params_partial_t(float* partial, const T* dy, const T* x, const float* rstd, u32 rows, u32 d, u32 chunk) {
    __shared__ float sh[GR_COL_Y][33];
    const u64 c = (u64)blockIdx.x * 32 + threadIdx.x;
    const u64 r0 = (u64)blockIdx.y * chunk;
    const u64 r1 = r0 + chunk < rows ? r0 + chunk : rows;
    float s = 0.0f;
    if (c < d) {
        for (u64 r = r0 + threadIdx.y; r < r1; r += GR_COL_Y) s += ld(dy, r * d + c) * (ld(x, r * d + c) * rstd[r]);
    }
    sh[threadIdx.y][threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.y == 0 && c < d) {
        float t = 0.0f;
        for (int k = 0; k < GR_COL_Y; ++k) t += sh[k][threadIdx.x];
        partial[(u64)blockIdx.y * d + c] = t;
    }
}

// out[c] += sum over k < chunks of partial[k, c], in k order; out is T or f32. Blocks of
// (32, GR_COL_Y) threads over column blocks (col_dims): thread (x, y) adds the chunks k = y mod
// GR_COL_Y in order, four loads in flight, then row y = 0 adds the GR_COL_Y sums in order.
template <typename TG>
__device__ __forceinline__ void col_partials_acc_t(TG* out, const float* partial, u32 chunks, u32 d) {
    __shared__ float sh[GR_COL_Y][33];
    for (u64 c0 = (u64)blockIdx.x * 32; c0 < d; c0 += (u64)gridDim.x * 32) {
        const u64 c = c0 + threadIdx.x;
        float s = 0.0f;
        if (c < d) {
            u64 k = threadIdx.y;
            for (; k + 3 * GR_COL_Y < chunks; k += 4 * GR_COL_Y) {
                const float a0 = partial[k * d + c];
                const float a1 = partial[(k + GR_COL_Y) * d + c];
                const float a2 = partial[(k + 2 * GR_COL_Y) * d + c];
                const float a3 = partial[(k + 3 * GR_COL_Y) * d + c];
                s += a0;
                s += a1;
                s += a2;
                s += a3;
            }
            for (; k < chunks; k += GR_COL_Y) s += partial[k * d + c];
        }
        sh[threadIdx.y][threadIdx.x] = s;
        __syncthreads();
        if (threadIdx.y == 0 && c < d) {
            float t = 0.0f;
            for (int k = 0; k < GR_COL_Y; ++k) t += sh[k][threadIdx.x];
            st(out, c, ld(out, c) + t);
        }
        __syncthreads();
    }
}

// ---------------------------------------------------------------- RMSNorm with rows in registers
//
// Blocks of (tpr, rpb) threads: tpr = blockDim.x threads (a power of two) on each of rpb =
// blockDim.y rows. Each thread holds V 16-byte words of its row (V * W values, scattered by tpr,
// when the row is not made of whole aligned 16-byte words), so a row is read from memory once
// however wide it is. The host picks tpr so that tpr * V * W >= d (RowTiles in
// backend/kernels.rs; V is RN_FWD_VPT or RN_BWD_VPT, given as NVRTC defines). Row sums: each
// thread adds its values in order, then a butterfly over the row's lanes and, for rows wider
// than a warp, the row's warps in order through shared memory; the order depends on d only.
// add_rms_norm is the same kernel with a residual (the sum is rounded to T before its
// statistics, so fused and unfused agree bit for bit), and so is its backward.
#if !defined(RN_FWD_VPT) || !defined(RN_BWD_VPT)
#error "RN_FWD_VPT and RN_BWD_VPT (16-byte words a thread holds) must be defined"
#endif

// RN_PREFETCH_FWD (the RMSNorm forward) and RN_PREFETCH (every other row kernel): 1 loads the
// next row group's inputs before the current one is reduced (software pipelining: the loads stay
// in flight through the reduction and the stores, which a grid of few blocks a multiprocessor
// otherwise leaves idle), 0 loads each group when it starts. RowTiles::nvrtc_defines sets both:
// on the H200 (examples/op_bench, 4096 x 4096, 2026-12-03) the RMSNorm forward is faster without
// (1.83x against 2.12x of its floor; residual add + RMSNorm 1.18x against 1.39x), layer norm
// (1.12x against 1.46x) and softmax cross-entropy (1.61x against 1.83x) with.
#ifndef RN_PREFETCH
#define RN_PREFETCH 1
#endif
#ifndef RN_PREFETCH_FWD
#define RN_PREFETCH_FWD 0
#endif

// The backward's per-block weight-grad reduction: blockDim.x * blockDim.y * W floats.
extern __shared__ __align__(16) float gr_row_smem[];

// The column of value k of word i of this thread's slice.
__device__ __forceinline__ u32 rn_col(bool vec, u32 i, u32 k, u32 w) {
    return vec ? (threadIdx.x + i * blockDim.x) * w + k : threadIdx.x + (i * w + k) * blockDim.x;
}

// This thread's slice of a row (zeros past d, or everywhere when !ok).
template <typename T, u32 V>
__device__ __forceinline__ void rn_load(Pack<T> (&p)[V], const T* row, u32 d, bool vec, bool ok) {
    constexpr u32 W = 16 / sizeof(T);
#pragma unroll
    for (u32 i = 0; i < V; ++i) {
        if (vec) {
            const u32 c = threadIdx.x + i * blockDim.x;
            if (ok && c < d / W) {
                p[i].raw = reinterpret_cast<const uint4*>(row)[c];
            } else {
                p[i].raw.x = 0u;
                p[i].raw.y = 0u;
                p[i].raw.z = 0u;
                p[i].raw.w = 0u;
            }
        } else {
#pragma unroll
            for (u32 k = 0; k < W; ++k) {
                const u32 j = rn_col(false, i, k, W);
                if (ok && j < d) {
                    p[i].e[k] = row[j];
                } else {
                    st(p[i].e, k, 0.0f);
                }
            }
        }
    }
}

template <typename T, u32 V>
__device__ __forceinline__ void rn_store(T* row, const Pack<T> (&p)[V], u32 d, bool vec) {
    constexpr u32 W = 16 / sizeof(T);
#pragma unroll
    for (u32 i = 0; i < V; ++i) {
        if (vec) {
            const u32 c = threadIdx.x + i * blockDim.x;
            if (c < d / W) reinterpret_cast<uint4*>(row)[c] = p[i].raw;
        } else {
#pragma unroll
            for (u32 k = 0; k < W; ++k) {
                const u32 j = rn_col(false, i, k, W);
                if (j < d) row[j] = p[i].e[k];
            }
        }
    }
}

// The sum over this thread's row (every thread of the row gets the same bits). Every thread of
// the block calls it (it may synchronize the block); `red` is a 32-float shared array.
__device__ __forceinline__ float rn_row_sum(float v, float* red) {
    const u32 tpr = blockDim.x;
    for (u32 o = (tpr < 32u ? tpr : 32u) >> 1; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (tpr <= 32u) return v;
    const u32 lin = threadIdx.y * tpr + threadIdx.x, wpr = tpr >> 5;
    __syncthreads();
    if ((lin & 31u) == 0u) red[lin >> 5] = v;
    __syncthreads();
    float t = 0.0f;
    for (u32 w = 0; w < wpr; ++w) t += red[threadIdx.y * wpr + w];
    return t;
}

// The largest value over this thread's row, as rn_row_sum.
__device__ __forceinline__ float rn_row_max(float v, float* red) {
    const u32 tpr = blockDim.x;
    for (u32 o = (tpr < 32u ? tpr : 32u) >> 1; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    if (tpr <= 32u) return v;
    const u32 lin = threadIdx.y * tpr + threadIdx.x, wpr = tpr >> 5;
    __syncthreads();
    if ((lin & 31u) == 0u) red[lin >> 5] = v;
    __syncthreads();
    float t = red[threadIdx.y * wpr];
    for (u32 w = 1; w < wpr; ++w) t = fmaxf(t, red[threadIdx.y * wpr + w]);
    return t;
}

// Whether value k of word i of this thread's slice is in the row.
__device__ __forceinline__ bool rn_in(bool vec, u32 i, u32 k, u32 w, u32 d) {
    return vec ? threadIdx.x + i * blockDim.x < d / w : rn_col(false, i, k, w) < d;
}

template <typename T, u32 V> __device__ __forceinline__ void rn_copy(Pack<T> (&dst)[V], const Pack<T> (&src)[V]) {
#pragma unroll
    for (u32 i = 0; i < V; ++i) dst[i].raw = src[i].raw;
}

// Row (group) `grp` of this thread: its row index and whether it is one (past the last group or
// the last row: no loads, no stores).
__device__ __forceinline__ u64 rn_row(u64 grp, u64 groups, u32 rows, bool& ok) {
    const u64 r = grp * blockDim.y + threadIdx.y;
    ok = grp < groups && r < rows;
    return r;
}

// One input of a row kernel (layer norm's and cross-entropy's), this thread's slice of its row
// group by group (groups blockIdx.x, + gridDim.x, ...): with P (RN_PREFETCH) the next group's
// slice is loaded when this one is taken, so its loads are in flight through this group's
// reduction and stores; without, each group's is loaded when it is taken. (The RMSNorm kernels keep their loads inline: the same look-ahead
// through this helper ran their backward at 1.77x of its floor against 1.64x, and the residual
// add + RMSNorm backward at 1.57x against 1.33x, on the H200, 2026-12-03.)
template <typename T, u32 V, bool P> struct RnInput {
    const T* src;
    u32 d;
    bool vec;
    Pack<T> next[V];

    __device__ __forceinline__ RnInput(const T* src_, u32 d_, bool vec_, u64 groups, u32 rows) : src(src_), d(d_), vec(vec_) {
        if (P) {
            bool ok;
            const u64 r = rn_row(blockIdx.x, groups, rows, ok);
            rn_load(next, src + r * d, d, vec, ok);
        }
    }

    // Group grp's slice into cur (zeros past the row's end and for a group past the last row).
    __device__ __forceinline__ void take(Pack<T> (&cur)[V], u64 grp, u64 groups, u32 rows) {
        bool ok;
        if (P) {
            rn_copy(cur, next);
            const u64 r = rn_row(grp + gridDim.x, groups, rows, ok);
            rn_load(next, src + r * d, d, vec, ok);
        } else {
            const u64 r = rn_row(grp, groups, rows, ok);
            rn_load(cur, src + r * d, d, vec, ok);
        }
    }
};

// Whether the RMSNorm row kernels (register and ring forms) move whole 16-byte words: rows of
// whole words and every tensor (the residual and its sum, dsum, where given) 16-byte aligned.
template <typename T>
__device__ __forceinline__ bool rn_fwd_vec(const T* y, const T* sum_out, const T* x, const T* res, const T* gamma, u32 d) {
    return d % (16 / sizeof(T)) == 0 && al16(y) && al16(x) && al16(gamma) && (res == nullptr || (al16(res) && al16(sum_out)));
}
template <typename T>
__device__ __forceinline__ bool rn_bwd_vec(const T* dx, const T* dy, const T* dsum, const T* x, const T* gamma, u32 d) {
    return d % (16 / sizeof(T)) == 0 && al16(dx) && al16(dy) && al16(x) && al16(gamma) && (dsum == nullptr || al16(dsum));
}

// y = s * rstd * gamma, rstd = 1 / sqrt(mean(s^2) + eps), s = x (res null) or x + res rounded
// to T and stored to sum_out. Row groups of blockDim.y rows, grid-stride over the groups.
template <typename T>
__device__ __forceinline__ void rms_rows_t(T* y, float* rstd_out, T* sum_out, const T* x, const T* res, const T* gamma, u32 rows, u32 d, float eps) {
    constexpr u32 W = 16 / sizeof(T);
    constexpr u32 V = RN_FWD_VPT;
    __shared__ float red[32];
    const bool add = res != nullptr;
    const bool vec = rn_fwd_vec(y, sum_out, x, res, gamma, d);
    Pack<T> g[V];
    rn_load(g, gamma, d, vec, true);
    const u64 groups = ((u64)rows + blockDim.y - 1) / blockDim.y;
    Pack<T> nx[V], nr[V];
    if (RN_PREFETCH_FWD) {
        bool ok0;
        const u64 r0 = rn_row(blockIdx.x, groups, rows, ok0);
        rn_load(nx, x + r0 * d, d, vec, ok0);
        if (add) rn_load(nr, res + r0 * d, d, vec, ok0);
    }
    for (u64 grp = blockIdx.x; grp < groups; grp += gridDim.x) {
        const u64 r = grp * blockDim.y + threadIdx.y;
        const bool ok = r < rows;
        Pack<T> px[V], pr[V];
        if (RN_PREFETCH_FWD) {
            rn_copy(px, nx);
            if (add) rn_copy(pr, nr);
            bool okn;
            const u64 rn = rn_row(grp + gridDim.x, groups, rows, okn);
            rn_load(nx, x + rn * d, d, vec, okn);
            if (add) rn_load(nr, res + rn * d, d, vec, okn);
        } else {
            rn_load(px, x + r * d, d, vec, ok);
            if (add) rn_load(pr, res + r * d, d, vec, ok);
        }
        if (add) {
#pragma unroll
            for (u32 i = 0; i < V; ++i) {
#pragma unroll
                for (u32 k = 0; k < W; ++k) st(px[i].e, k, ld(px[i].e, k) + ld(pr[i].e, k));
            }
            if (ok) rn_store(sum_out + r * d, px, d, vec);
        }
        float s = 0.0f;
#pragma unroll
        for (u32 i = 0; i < V; ++i) {
#pragma unroll
            for (u32 k = 0; k < W; ++k) {
                const float v = ld(px[i].e, k);
                s += v * v;
            }
        }
        const float rstd = 1.0f / sqrtf(rn_row_sum(s, red) / (float)d + eps);
#pragma unroll
        for (u32 i = 0; i < V; ++i) {
            float o[W];
#pragma unroll
            for (u32 k = 0; k < W; ++k) o[k] = ld(px[i].e, k) * rstd * ld(g[i].e, k);
            st_all(px[i].e, o);
        }
        if (ok) {
            rn_store(y + r * d, px, d, vec);
            if (threadIdx.x == 0) rstd_out[r] = rstd;
        }
    }
}

// rms_rows_t with the row groups in flight in shared memory (a measurement variant, not yet
// launched by the runtime: bench/row_sweep.py times it against rms_rows_t). The RMSNorm forward
// is latency-bound (its floor is 1.84x away while the residual add + RMSNorm, the same kernel
// with twice the loads a row, is at 1.19x): a block loads a group, reduces it and stores it
// before it loads the next, and loading ahead in registers costs the occupancy it would win
// (2.12x against 1.83x, 2026-12-03). Here each thread copies its own 16-byte words of the next
// RN_RING - 1 groups into shared memory with cp.async (no registers) while it works on the
// current one, and reads the current one from there twice (the sum of squares, then the
// normalisation), holding only gamma: more bytes in flight and fewer registers. The threads,
// the sums' order and the roundings are rms_rows_t's: the same bits. A thread reads back only
// the words it copied, so the ring needs no block barrier. Rows of whole aligned 16-byte words
// only (the runtime runs rms_rows_t for others). Dynamic shared memory: RN_RING x blockDim.y rows x d values (x, then
// res's rows when given).
#ifndef RN_RING
#define RN_RING 2
#endif
template <typename T>
__device__ __forceinline__ void rms_ring_t(T* y, float* rstd_out, T* sum_out, const T* x, const T* res, const T* gamma, u32 rows, u32 d, float eps) {
    constexpr u32 W = 16 / sizeof(T);
    constexpr u32 V = RN_FWD_VPT;
    __shared__ float red[32];
    const bool add = res != nullptr;
    // The runtime launches the ring only where every row is whole aligned 16-byte words
    // (`ring_words` in ops/transformer.rs, the same test) and runs rms_rows_t elsewhere: with
    // rms_rows_t inlined here as the fallback the kernel took 168 registers against 80 without
    // (ptxas 12.9, sm_90), which undoes what the ring is for.
    if (!rn_fwd_vec(y, sum_out, x, res, gamma, d)) return;
    const u32 words = d / W, rows_words = blockDim.y * words;
    const u32 slot_words = rows_words * (add ? 2u : 1u);
    uint4* ring = reinterpret_cast<uint4*>(gr_row_smem);
    Pack<T> g[V];
    rn_load(g, gamma, d, true, true);
    const u64 groups = ((u64)rows + blockDim.y - 1) / blockDim.y;
    // This thread's words of group grp into slot `slot` (nothing past the last row), then one
    // commit group, empty or not, so that every thread counts its groups alike.
    const auto issue = [&](u64 grp, u32 slot) {
        bool ok;
        const u64 r = rn_row(grp, groups, rows, ok);
#pragma unroll
        for (u32 i = 0; i < V; ++i) {
            const u32 c = threadIdx.x + i * blockDim.x;
            if (!ok || c >= words) continue;
            uint4* at = ring + (u64)slot * slot_words + threadIdx.y * words + c;
            asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"((u32)__cvta_generic_to_shared(at)), "l"(x + r * d + (u64)c * W) : "memory");
            if (add) {
                asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"((u32)__cvta_generic_to_shared(at + rows_words)), "l"(res + r * d + (u64)c * W)
                             : "memory");
            }
        }
        asm volatile("cp.async.commit_group;" ::: "memory");
    };
    // This thread's words of the group in `slot`: x, or x + res rounded to T (as rms_rows_t).
    const auto take = [&](Pack<T>& p, u32 slot, u32 i) {
        const uint4* at = ring + (u64)slot * slot_words + threadIdx.y * words + threadIdx.x + i * blockDim.x;
        p.raw = at[0];
        if (add) {
            Pack<T> pr;
            pr.raw = at[rows_words];
#pragma unroll
            for (u32 k = 0; k < W; ++k) st(p.e, k, ld(p.e, k) + ld(pr.e, k));
        }
    };
#pragma unroll
    for (u32 s = 0; s + 1 < RN_RING; ++s) issue(blockIdx.x + (u64)s * gridDim.x, s);
    u32 slot = 0;
    for (u64 grp = blockIdx.x; grp < groups; grp += gridDim.x) {
        issue(grp + (u64)(RN_RING - 1) * gridDim.x, (slot + RN_RING - 1) % RN_RING);
        asm volatile("cp.async.wait_group %0;" ::"n"(RN_RING - 1) : "memory");
        const u64 r = grp * blockDim.y + threadIdx.y;
        const bool ok = r < rows;
        float s = 0.0f;
#pragma unroll
        for (u32 i = 0; i < V; ++i) {
            Pack<T> p;
            p.raw = make_uint4(0u, 0u, 0u, 0u);
            if (ok && threadIdx.x + i * blockDim.x < words) take(p, slot, i);
#pragma unroll
            for (u32 k = 0; k < W; ++k) {
                const float v = ld(p.e, k);
                s += v * v;
            }
        }
        const float rstd = 1.0f / sqrtf(rn_row_sum(s, red) / (float)d + eps);
        if (ok) {
#pragma unroll
            for (u32 i = 0; i < V; ++i) {
                const u32 c = threadIdx.x + i * blockDim.x;
                if (c >= words) continue;
                Pack<T> p;
                take(p, slot, i);
                if (add) reinterpret_cast<uint4*>(sum_out + r * d)[c] = p.raw;
                float o[W];
#pragma unroll
                for (u32 k = 0; k < W; ++k) o[k] = ld(p.e, k) * rstd * ld(g[i].e, k);
                st_all(p.e, o);
                reinterpret_cast<uint4*>(y + r * d)[c] = p.raw;
            }
            if (threadIdx.x == 0) rstd_out[r] = rstd;
        }
        slot = (slot + 1) % RN_RING;
    }
    asm volatile("cp.async.wait_all;" ::: "memory");
}

// The RMSNorm backward's gamma-grad partials: out[0..d] (the block's row of partials, in global
// or shared memory) = the block's rows' sums (acc: this thread's V x W, as its words' columns),
// added in row order (threadIdx.y) through gr_row_smem, one word of each thread at a time.
template <u32 V, u32 W>
__device__ __forceinline__ void rn_write_partials(const float (&acc)[V * W], float* out, u32 d, bool vec) {
    const u32 tpr = blockDim.x, rpb = blockDim.y, lin = threadIdx.y * tpr + threadIdx.x;
#pragma unroll
    for (u32 i = 0; i < V; ++i) {
        __syncthreads();
#pragma unroll
        for (u32 k = 0; k < W; ++k) gr_row_smem[lin * W + k] = acc[i * W + k];
        __syncthreads();
        for (u32 e = lin; e < tpr * W; e += tpr * rpb) {
            float t = 0.0f;
            for (u32 j = 0; j < rpb; ++j) t += gr_row_smem[j * tpr * W + e];
            const u32 c = vec ? (e / W + i * tpr) * W + e % W : e / W + (i * W + e % W) * tpr;
            if (c < d) out[c] = t;
        }
    }
}

// rn_write_partials for a launch in thread block clusters (rms_ring_bwd_cl; sm_90): each block
// adds its rows as rn_write_partials does, into its own shared memory (`row`, d floats, 16-byte
// aligned; d a multiple of 4), then block `rank` adds the cluster's rows for its share of the
// columns (whole 16-byte words), block by block in rank order, through distributed shared
// memory, and writes them to partial[blockIdx.x / blocks, :]. So the partials are one row a
// cluster, not one a block, and their sums keep a fixed order: the weight grad stays
// deterministic. Every block of the cluster calls it (two cluster barriers).
template <u32 V, u32 W>
__device__ __forceinline__ void rn_cluster_partials(const float (&acc)[V * W], float* partial, u32 d, float* row) {
    const u32 lin = threadIdx.y * blockDim.x + threadIdx.x, nt = blockDim.x * blockDim.y;
    rn_write_partials<V, W>(acc, row, d, true);
    const GrCluster cl = gr_cluster();
    gr_cluster_sync();
    const u32 quads = d / 4, share = (quads + cl.blocks - 1) / cl.blocks;
    const u32 q1 = min(quads, (cl.rank + 1) * share);
    float4* out = reinterpret_cast<float4*>(partial + (u64)(blockIdx.x / cl.blocks) * d);
    for (u32 q = cl.rank * share + lin; q < q1; q += nt) {
        float4 t = gr_cluster_ld4(row + 4 * q, 0);
        for (u32 b = 1; b < cl.blocks; ++b) {
            const float4 v = gr_cluster_ld4(row + 4 * q, b);
            t.x += v.x;
            t.y += v.y;
            t.z += v.z;
            t.w += v.w;
        }
        out[q] = t;
    }
    // No block leaves while another still reads its shared memory.
    gr_cluster_sync();
}

// dx = rstd * (g - xhat * mean(g * xhat)) (+ dsum, after rounding that to T, when dsum is not
// null), g = dy * gamma, xhat = x * rstd; and partial[blockIdx.x, :] = sum over the block's rows
// of dy * xhat: each thread adds its rows in order in registers, then the block adds its rows
// in order (threadIdx.y) through gr_row_smem, one word of each thread at a time. The grid is
// a fixed number of blocks (RowTiles), so col_partials_acc then adds the partials in a fixed
// order: the weight grad is deterministic without atomics.
template <typename T>
__device__ __forceinline__ void rms_rows_bwd_t(T* dx, float* partial, const T* dy, const T* dsum, const T* x, const T* gamma, const float* rstd, u32 rows, u32 d) {
    constexpr u32 W = 16 / sizeof(T);
    constexpr u32 V = RN_BWD_VPT;
    __shared__ float red[32];
    const bool add = dsum != nullptr;
    const bool vec = rn_bwd_vec(dx, dy, dsum, x, gamma, d);
    Pack<T> g[V];
    rn_load(g, gamma, d, vec, true);
    float acc[V * W];
#pragma unroll
    for (u32 e = 0; e < V * W; ++e) acc[e] = 0.0f;
    const u64 groups = ((u64)rows + blockDim.y - 1) / blockDim.y;
    Pack<T> nd[V], nx[V], ns[V];
    float nrs = 0.0f;
    if (RN_PREFETCH) {
        bool ok0;
        const u64 r0 = rn_row(blockIdx.x, groups, rows, ok0);
        rn_load(nd, dy + r0 * d, d, vec, ok0);
        rn_load(nx, x + r0 * d, d, vec, ok0);
        if (add) rn_load(ns, dsum + r0 * d, d, vec, ok0);
        nrs = ok0 ? rstd[r0] : 0.0f;
    }
    for (u64 grp = blockIdx.x; grp < groups; grp += gridDim.x) {
        const u64 r = grp * blockDim.y + threadIdx.y;
        const bool ok = r < rows;
        Pack<T> pd[V], px[V], ps[V];
        float rs;
        if (RN_PREFETCH) {
            rn_copy(pd, nd);
            rn_copy(px, nx);
            if (add) rn_copy(ps, ns);
            rs = nrs;
            bool okn;
            const u64 rn = rn_row(grp + gridDim.x, groups, rows, okn);
            rn_load(nd, dy + rn * d, d, vec, okn);
            rn_load(nx, x + rn * d, d, vec, okn);
            if (add) rn_load(ns, dsum + rn * d, d, vec, okn);
            nrs = okn ? rstd[rn] : 0.0f;
        } else {
            rn_load(pd, dy + r * d, d, vec, ok);
            rn_load(px, x + r * d, d, vec, ok);
            if (add) rn_load(ps, dsum + r * d, d, vec, ok);
            rs = ok ? rstd[r] : 0.0f;
        }
        float s = 0.0f;
#pragma unroll
        for (u32 i = 0; i < V; ++i) {
#pragma unroll
            for (u32 k = 0; k < W; ++k) s += ld(pd[i].e, k) * ld(g[i].e, k) * ld(px[i].e, k) * rs;
        }
        const float m = rn_row_sum(s, red) / (float)d;
#pragma unroll
        for (u32 i = 0; i < V; ++i) {
            float o[W];
#pragma unroll
            for (u32 k = 0; k < W; ++k) {
                const float dv = ld(pd[i].e, k), xv = ld(px[i].e, k);
                acc[i * W + k] += dv * (xv * rs);
                o[k] = rs * (dv * ld(g[i].e, k) - xv * rs * m);
            }
            st_all(px[i].e, o);
        }
        if (add) {
#pragma unroll
            for (u32 i = 0; i < V; ++i) {
                float o[W];
#pragma unroll
                for (u32 k = 0; k < W; ++k) o[k] = ld(px[i].e, k) + ld(ps[i].e, k);
                st_all(px[i].e, o);
            }
        }
        if (ok) rn_store(dx + r * d, px, d, vec);
    }
    rn_write_partials<V, W>(acc, partial + (u64)blockIdx.x * d, d, vec);
}

// RMSNorm forward (and residual add + RMSNorm) with the row in shared memory, as the
// cross-entropy's sx_smem_t holds it (half.cu: SxStages, gr_cp16, gr_sx_row): rms_rows_t's
// math, a block a row (grid-stride past the grid). Each thread copies its 16-byte words of x
// (and of res) with cp.async in SX_STAGES commit groups and adds its squares over each group as
// it lands (with res: x + res rounded to T, stored to sum_out and kept in shared memory); after
// the block's sum it writes y = s * rstd * gamma from shared memory. As many rows in flight an
// SM as its threads and shared memory hold, where rms_rows_t holds one row group a block and the
// ring two: on the H100 (bench/row_sweep.py kind smem, 2026-12-06) 1.13x to 1.15x of the floor at
// 4096 x 4096 in bf16 against the ring's 1.26x at the runtime's launch, and 1.04x with the
// residual add. The runtime launches it for bf16 rows of 8 KB and more (ops/transformer.rs);
// other bits than rms_rows_t (the sum of squares in another order), the same for the plain and
// the add forms (the same lanes a row). Rows of whole aligned words only.
//
// The lanes: the sum of squares is taken over the launch's lanes (the host's thread count for
// the row, `lanes` in rms_smem_launch, ops/transformer.rs), each lane summing its words w = lane + i *
// lanes in order, then block_sum's tree. K = 1 runs a thread a lane; K = 2 (rms_smem2_bf16, the
// plain form at half the threads: twice the rows in flight a multiprocessor) a thread two
// lanes, t and t + blockDim.x, in that order's sums and tree (block_sum_lanes2), so the bits
// are those of K = 1.
template <typename T, u32 K>
__device__ __forceinline__ void rms_smem_t(T* y, float* rstd_out, T* sum_out, const T* x, const T* res, const T* gamma, u32 rows, u32 d, float eps) {
    constexpr u32 W = 16 / sizeof(T);
    if (!rn_fwd_vec(y, sum_out, x, res, gamma, d)) return;
    const bool add = res != nullptr;
    uint4* row = gr_sx_row;
    __shared__ float red[32];
    const SxStages stg(d / W);
    const u32 words = stg.words;
    for (u64 r = blockIdx.x; r < rows; r += gridDim.x) {
        const uint4* xw = reinterpret_cast<const uint4*>(x + r * d);
        const uint4* rw = add ? reinterpret_cast<const uint4*>(res + r * d) : nullptr;
        stg.issue([&](u32 w) {
            gr_cp16(row + w, xw + w);
            if (add) gr_cp16(row + words + w, rw + w);
        });
        float s = 0.0f, s2 = 0.0f;
        stg.land([&](u32 w) {
            Pack<T> p;
            p.raw = row[w];
            if (add) {
                Pack<T> q;
                q.raw = row[words + w];
#pragma unroll
                for (u32 k = 0; k < W; ++k) st(p.e, k, ld(p.e, k) + ld(q.e, k));
                row[w] = p.raw;
                reinterpret_cast<uint4*>(sum_out + r * d)[w] = p.raw;
            }
            if (K == 2 && w % (2u * blockDim.x) >= blockDim.x) {
                // The second lane's word (lane t + blockDim.x).
#pragma unroll
                for (u32 k = 0; k < W; ++k) {
                    const float v = ld(p.e, k);
                    s2 += v * v;
                }
            } else {
#pragma unroll
                for (u32 k = 0; k < W; ++k) {
                    const float v = ld(p.e, k);
                    s += v * v;
                }
            }
        });
        const float tot = K == 2 ? block_sum_lanes2(s, s2, red) : block_sum(s, red);
        const float rstd = 1.0f / sqrtf(tot / (float)d + eps);
        for (u32 w = threadIdx.x; w < words; w += blockDim.x) {
            Pack<T> p, gg;
            p.raw = row[w];
            gg.raw = __ldg(reinterpret_cast<const uint4*>(gamma) + w);
            float o[W];
#pragma unroll
            for (u32 k = 0; k < W; ++k) o[k] = ld(p.e, k) * rstd * ld(gg.e, k);
            st_all(p.e, o);
            reinterpret_cast<uint4*>(y + r * d)[w] = p.raw;
        }
        if (threadIdx.x == 0) rstd_out[r] = rstd;
    }
}

// rms_rows_bwd_t with the row groups in flight in shared memory, as rms_ring_t is to
// rms_rows_t (a measurement variant, not yet launched by the runtime; bench/row_sweep.py): each
// thread copies its own words of dy, x (and dsum) and its row's rstd for the next RN_RING - 1
// groups with cp.async, and reads the current group from there twice, holding gamma and the
// gamma grad's sums in registers. The same threads, sums and roundings as rms_rows_bwd_t: the
// same bits. Dynamic shared memory: the partials' reduction (blockDim.x * blockDim.y * W floats,
// as rms_rows_bwd_t), then RN_RING slots of dy's, x's (and dsum's) rows and one rstd a thread.
template <typename T, bool CLUSTER>
__device__ __forceinline__ void rms_ring_bwd_t(T* dx, float* partial, const T* dy, const T* dsum, const T* x, const T* gamma, const float* rstd, u32 rows, u32 d) {
    constexpr u32 W = 16 / sizeof(T);
    constexpr u32 V = RN_BWD_VPT;
    __shared__ float red[32];
    const bool add = dsum != nullptr;
    // Launched only where rn_bwd_vec holds (see rms_ring_t): 179 registers with
    // rms_rows_bwd_t inlined as the fallback, 96 without.
    if (!rn_bwd_vec(dx, dy, dsum, x, gamma, d)) return;
    const u32 tpr = blockDim.x, rpb = blockDim.y, lin = threadIdx.y * tpr + threadIdx.x;
    const u32 words = d / W, rows_words = rpb * words, rs_words = (tpr * rpb + 3) / 4;
    const u32 slot_words = rows_words * (add ? 3u : 2u) + rs_words;
    uint4* ring = reinterpret_cast<uint4*>(gr_row_smem + tpr * rpb * W);
    Pack<T> g[V];
    rn_load(g, gamma, d, true, true);
    float acc[V * W];
#pragma unroll
    for (u32 e = 0; e < V * W; ++e) acc[e] = 0.0f;
    const u64 groups = ((u64)rows + rpb - 1) / rpb;
    const auto issue = [&](u64 grp, u32 slot) {
        bool ok;
        const u64 r = rn_row(grp, groups, rows, ok);
        uint4* base = ring + (u64)slot * slot_words;
        if (ok) {
#pragma unroll
            for (u32 i = 0; i < V; ++i) {
                const u32 c = threadIdx.x + i * tpr;
                if (c >= words) continue;
                const u32 at = threadIdx.y * words + c;
                const u64 src = r * d + (u64)c * W;
                asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"((u32)__cvta_generic_to_shared(base + at)), "l"(dy + src) : "memory");
                asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"((u32)__cvta_generic_to_shared(base + rows_words + at)), "l"(x + src) : "memory");
                if (add) {
                    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"((u32)__cvta_generic_to_shared(base + 2 * rows_words + at)), "l"(dsum + src)
                                 : "memory");
                }
            }
            const float* rs_at = reinterpret_cast<const float*>(base + rows_words * (add ? 3u : 2u)) + lin;
            asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"((u32)__cvta_generic_to_shared(rs_at)), "l"(rstd + r) : "memory");
        }
        asm volatile("cp.async.commit_group;" ::: "memory");
    };
#pragma unroll
    for (u32 s = 0; s + 1 < RN_RING; ++s) issue(blockIdx.x + (u64)s * gridDim.x, s);
    u32 slot = 0;
    for (u64 grp = blockIdx.x; grp < groups; grp += gridDim.x) {
        issue(grp + (u64)(RN_RING - 1) * gridDim.x, (slot + RN_RING - 1) % RN_RING);
        asm volatile("cp.async.wait_group %0;" ::"n"(RN_RING - 1) : "memory");
        const u64 r = grp * rpb + threadIdx.y;
        const bool ok = r < rows;
        const uint4* base = ring + (u64)slot * slot_words;
        const float rs = ok ? reinterpret_cast<const float*>(base + rows_words * (add ? 3u : 2u))[lin] : 0.0f;
        // This thread's word i of dy, x (and dsum) in the slot: zeros past the row or the rows.
        const auto take = [&](Pack<T>& pd, Pack<T>& px, u32 i) {
            const u32 c = threadIdx.x + i * tpr;
            const bool in = ok && c < words;
            const u32 at = threadIdx.y * words + c;
            pd.raw = in ? base[at] : make_uint4(0u, 0u, 0u, 0u);
            px.raw = in ? base[rows_words + at] : make_uint4(0u, 0u, 0u, 0u);
        };
        float s = 0.0f;
#pragma unroll
        for (u32 i = 0; i < V; ++i) {
            Pack<T> pd, px;
            take(pd, px, i);
#pragma unroll
            for (u32 k = 0; k < W; ++k) s += ld(pd.e, k) * ld(g[i].e, k) * ld(px.e, k) * rs;
        }
        const float m = rn_row_sum(s, red) / (float)d;
#pragma unroll
        for (u32 i = 0; i < V; ++i) {
            Pack<T> pd, px;
            take(pd, px, i);
            float o[W];
#pragma unroll
            for (u32 k = 0; k < W; ++k) {
                const float dv = ld(pd.e, k), xv = ld(px.e, k);
                acc[i * W + k] += dv * (xv * rs);
                o[k] = rs * (dv * ld(g[i].e, k) - xv * rs * m);
            }
            st_all(px.e, o);
            const u32 c = threadIdx.x + i * tpr;
            if (!ok || c >= words) continue;
            if (add) {
                Pack<T> ps;
                ps.raw = base[2 * rows_words + threadIdx.y * words + c];
#pragma unroll
                for (u32 k = 0; k < W; ++k) o[k] = ld(px.e, k) + ld(ps.e, k);
                st_all(px.e, o);
            }
            reinterpret_cast<uint4*>(dx + r * d)[c] = px.raw;
        }
        slot = (slot + 1) % RN_RING;
    }
    asm volatile("cp.async.wait_all;" ::: "memory");
    // In clusters the ring's room (at least 4 * d bytes: two slots of dy's and x's rows) holds
    // the block's partial row once the groups are done.
    if (CLUSTER) rn_cluster_partials<V, W>(acc, partial, d, reinterpret_cast<float*>(ring));
    else rn_write_partials<V, W>(acc, partial + (u64)blockIdx.x * d, d, true);
}

// ---------------------------------------------------------------- layer norm and softmax rows
//
// The rows-in-registers form of layer_norm_t, layer_norm_bwd_t (dx) and softmax_xent_t (half.cu),
// launched as the RMSNorm forward (RowTiles::fwd_launch, RN_FWD_VPT words a thread) when a row
// fits: each row is read from memory once. Same math per value; the row sums add each thread's
// values in order, then its row's lanes and warps as rn_row_sum does (an order fixed by d).

// y = (x - mean) * rstd * gamma + beta; mean and rstd (f32) per row.
template <typename T>
__device__ __forceinline__ void ln_rows_t(T* y, float* mean_out, float* rstd_out, const T* x, const T* gamma, const T* beta, u32 rows, u32 d, float eps) {
    constexpr u32 W = 16 / sizeof(T);
    constexpr u32 V = RN_FWD_VPT;
    __shared__ float red[32];
    const bool vec = d % W == 0 && al16(y) && al16(x) && al16(gamma) && al16(beta);
    Pack<T> g[V], b[V];
    rn_load(g, gamma, d, vec, true);
    rn_load(b, beta, d, vec, true);
    const u64 groups = ((u64)rows + blockDim.y - 1) / blockDim.y;
    RnInput<T, V, (RN_PREFETCH != 0)> in_x(x, d, vec, groups, rows);
    for (u64 grp = blockIdx.x; grp < groups; grp += gridDim.x) {
        const u64 r = grp * blockDim.y + threadIdx.y;
        const bool ok = r < rows;
        Pack<T> px[V];
        in_x.take(px, grp, groups, rows);
        float s = 0.0f;
#pragma unroll
        for (u32 i = 0; i < V; ++i) {
#pragma unroll
            for (u32 k = 0; k < W; ++k) s += ld(px[i].e, k);
        }
        const float mean = rn_row_sum(s, red) / (float)d;
        float v = 0.0f;
#pragma unroll
        for (u32 i = 0; i < V; ++i) {
#pragma unroll
            for (u32 k = 0; k < W; ++k) {
                const float c = ld(px[i].e, k) - mean;
                if (rn_in(vec, i, k, W, d)) v += c * c;
            }
        }
        const float var = rn_row_sum(v, red) / (float)d;
        const float rstd = 1.0f / sqrtf(var + eps);
#pragma unroll
        for (u32 i = 0; i < V; ++i) {
            float o[W];
#pragma unroll
            for (u32 k = 0; k < W; ++k) o[k] = (ld(px[i].e, k) - mean) * rstd * ld(g[i].e, k) + ld(b[i].e, k);
            st_all(px[i].e, o);
        }
        if (ok) {
            rn_store(y + r * d, px, d, vec);
            if (threadIdx.x == 0) {
                mean_out[r] = mean;
                rstd_out[r] = rstd;
            }
        }
    }
}

// dx = rstd * (g - mean(g) - xhat * mean(g * xhat)), g = dy * gamma, xhat = (x - mean) * rstd
// (the weight grads: layer_norm_bwd_params_t).
template <typename T>
__device__ __forceinline__ void ln_rows_bwd_t(T* dx, const T* dy, const T* x, const T* gamma, const float* mean, const float* rstd, u32 rows, u32 d) {
    constexpr u32 W = 16 / sizeof(T);
    constexpr u32 V = RN_FWD_VPT;
    __shared__ float red[32];
    const bool vec = d % W == 0 && al16(dx) && al16(dy) && al16(x) && al16(gamma);
    Pack<T> g[V];
    rn_load(g, gamma, d, vec, true);
    const u64 groups = ((u64)rows + blockDim.y - 1) / blockDim.y;
    RnInput<T, V, (RN_PREFETCH != 0)> in_d(dy, d, vec, groups, rows), in_x(x, d, vec, groups, rows);
    for (u64 grp = blockIdx.x; grp < groups; grp += gridDim.x) {
        const u64 r = grp * blockDim.y + threadIdx.y;
        const bool ok = r < rows;
        Pack<T> pd[V], px[V];
        in_d.take(pd, grp, groups, rows);
        in_x.take(px, grp, groups, rows);
        const float mu = ok ? mean[r] : 0.0f;
        const float rs = ok ? rstd[r] : 0.0f;
        float a = 0.0f, bsum = 0.0f;
#pragma unroll
        for (u32 i = 0; i < V; ++i) {
#pragma unroll
            for (u32 k = 0; k < W; ++k) {
                // Past d, dy and gamma are 0: g = 0 adds nothing to either sum.
                const float gv = ld(pd[i].e, k) * ld(g[i].e, k);
                const float xh = (ld(px[i].e, k) - mu) * rs;
                a += gv;
                bsum += gv * xh;
            }
        }
        const float ma = rn_row_sum(a, red) / (float)d;
        const float mb = rn_row_sum(bsum, red) / (float)d;
#pragma unroll
        for (u32 i = 0; i < V; ++i) {
            float o[W];
#pragma unroll
            for (u32 k = 0; k < W; ++k) {
                const float gv = ld(pd[i].e, k) * ld(g[i].e, k);
                const float xh = (ld(px[i].e, k) - mu) * rs;
                o[k] = rs * (gv - ma - xh * mb);
            }
            st_all(px[i].e, o);
        }
        if (ok) rn_store(dx + r * d, px, d, vec);
    }
}

// LayerNorm's f32 backward in one pass over dy and x (sm_90; ops/norm.rs launches it where it
// applies, ln_rows_bwd_t and layer_norm_bwd_params_t elsewhere, which read dy and x twice): a
// persistent grid whose blocks each keep a ring of LN_RING_STAGES slots of (dy's row, x's row)
// in shared memory, every slot filled by two bulk copies (cp.async.bulk, completing on the
// slot's mbarrier) that thread 0 issues LN_RING_STAGES rows ahead. A thread owns the same
// 16-byte words of every row (word w = threadIdx.x + i * blockDim.x, at most LN_RING_WPT of
// them), so gamma and its sums of the parameters' grads stay in its registers: at the end the
// block writes its sums of dy * xhat and of dy over its rows as its rows of pg and pb, which
// col_partials_acc adds in block order (a fixed grid, ops/norm.rs: the same bits on every run).
// Rows k = blockIdx.x + j * gridDim.x; LN_RING_STAGES from RowTiles::LN_RING_STAGES (kernels.rs).
// On the H100 (bench/row_tma.py, 2026-12-07) the form ran
// 4096 x 4096 in 95.9 us against the two kernels' 141.1, 16384 x 1024 in 107.8 against 300.6.
#ifndef LN_RING_STAGES
#define LN_RING_STAGES 2
#endif
#define LN_RING_WPT 4
__device__ __forceinline__ u32 lr_smem(const void* p) { return (u32)__cvta_generic_to_shared(p); }
__device__ __forceinline__ void lr_wait(u64* bar, u32 parity) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    u32 done = 0;
    while (!done) {
        asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
                     : "=r"(done)
                     : "r"(lr_smem(bar)), "r"(parity)
                     : "memory");
    }
#endif
}
// Thread 0: row k of the block's rows of dy and x (rows of `bytes` bytes) into the two halves of
// slot k % LN_RING_STAGES, both copies completing on the slot's mbarrier.
__device__ __forceinline__ void lr_issue(u64* bars, float4* ring, const float* dy, const float* x, u32 k, u32 bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    const u32 s = k % LN_RING_STAGES, words = bytes / 16;
    const u64 off = (blockIdx.x + (u64)k * gridDim.x) * bytes;
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(lr_smem(&bars[s])), "r"(2 * bytes) : "memory");
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(lr_smem(ring + (u64)(2 * s) * words)),
                 "l"(reinterpret_cast<const char*>(dy) + off), "r"(bytes), "r"(lr_smem(&bars[s]))
                 : "memory");
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(lr_smem(ring + (u64)(2 * s + 1) * words)),
                 "l"(reinterpret_cast<const char*>(x) + off), "r"(bytes), "r"(lr_smem(&bars[s]))
                 : "memory");
#endif
}
// The block's sums of a and b over its threads (every thread gets them), warps in order; `par`
// alternates between red's halves so that the next row's stores cannot overtake this row's reads.
__device__ __forceinline__ float2 lr_block_sum2(float a, float b, float2* red, u32 par) {
#pragma unroll
    for (u32 o = 16; o > 0; o >>= 1) {
        a += __shfl_xor_sync(0xffffffffu, a, o);
        b += __shfl_xor_sync(0xffffffffu, b, o);
    }
    float2* r = red + par * 32;
    if ((threadIdx.x & 31) == 0) r[threadIdx.x >> 5] = make_float2(a, b);
    __syncthreads();
    float2 t = make_float2(0.0f, 0.0f);
    for (u32 w = 0; w < (blockDim.x + 31) / 32; ++w) {
        t.x += r[w].x;
        t.y += r[w].y;
    }
    return t;
}
// dx = rstd (g - mean(g) - xhat mean(g xhat)), g = dy gamma, xhat = (x - mean) rstd, as
// ln_rows_bwd_t computes it; rows of d f32 values, d % 4 == 0, d / 4 <= LN_RING_WPT * blockDim.x,
// every row 16-byte aligned. Dynamic shared memory: LN_RING_STAGES * 2 * d floats.
extern "C" __global__ void ln_ring_bwd_f32(float* dx, float* pg, float* pb, const float* dy, const float* x, const float* gamma, const float* mean,
                                           const float* rstd, u32 rows, u32 d) {
    GR_PDL_ENTRY();
    __shared__ __align__(8) u64 bars[LN_RING_STAGES];
    __shared__ float2 red[64];
    float4* ring = reinterpret_cast<float4*>(gr_row_smem);
    const u32 words = d / 4, bytes = d * 4;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if (threadIdx.x == 0) {
        for (u32 s = 0; s < LN_RING_STAGES; ++s) asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(lr_smem(&bars[s])) : "memory");
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
#endif
    __syncthreads();
    float4 g[LN_RING_WPT], ag[LN_RING_WPT], ab[LN_RING_WPT];
#pragma unroll
    for (u32 i = 0; i < LN_RING_WPT; ++i) {
        const u32 w = threadIdx.x + i * blockDim.x;
        g[i] = w < words ? reinterpret_cast<const float4*>(gamma)[w] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        ag[i] = ab[i] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
    const u32 mine = blockIdx.x < rows ? (rows - blockIdx.x + gridDim.x - 1) / gridDim.x : 0u;
    if (threadIdx.x == 0)
        for (u32 k = 0; k < LN_RING_STAGES && k < mine; ++k) lr_issue(bars, ring, dy, x, k, bytes);
    // Each row's mean and rstd, read a row ahead.
    float mu_next = mine > 0 ? mean[blockIdx.x] : 0.0f, rs_next = mine > 0 ? rstd[blockIdx.x] : 0.0f;
    for (u32 k = 0; k < mine; ++k) {
        const u32 s = k % LN_RING_STAGES;
        const u64 r = blockIdx.x + (u64)k * gridDim.x;
        const float mu = mu_next, rs = rs_next;
        if (k + 1 < mine) {
            mu_next = mean[r + gridDim.x];
            rs_next = rstd[r + gridDim.x];
        }
        lr_wait(&bars[s], (k / LN_RING_STAGES) & 1u);
        float4 gv[LN_RING_WPT], xh[LN_RING_WPT];
        float a = 0.0f, b = 0.0f;
#pragma unroll
        for (u32 i = 0; i < LN_RING_WPT; ++i) {
            const u32 w = threadIdx.x + i * blockDim.x;
            const bool in = w < words;
            const float4 e = in ? ring[(u64)(2 * s) * words + w] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            const float4 v = in ? ring[(u64)(2 * s + 1) * words + w] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            xh[i] = in ? make_float4((v.x - mu) * rs, (v.y - mu) * rs, (v.z - mu) * rs, (v.w - mu) * rs) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            gv[i] = make_float4(e.x * g[i].x, e.y * g[i].y, e.z * g[i].z, e.w * g[i].w);
            ag[i].x += e.x * xh[i].x;
            ag[i].y += e.y * xh[i].y;
            ag[i].z += e.z * xh[i].z;
            ag[i].w += e.w * xh[i].w;
            ab[i].x += e.x;
            ab[i].y += e.y;
            ab[i].z += e.z;
            ab[i].w += e.w;
            a += gv[i].x + gv[i].y + gv[i].z + gv[i].w;
            b += gv[i].x * xh[i].x + gv[i].y * xh[i].y + gv[i].z * xh[i].z + gv[i].w * xh[i].w;
        }
        // Its barrier: every read of slot s is done, so thread 0 hands it back to the async
        // proxy and refills it.
        const float2 t = lr_block_sum2(a, b, red, k & 1u);
        if (threadIdx.x == 0 && k + LN_RING_STAGES < mine) {
            asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
            lr_issue(bars, ring, dy, x, k + LN_RING_STAGES, bytes);
        }
        const float ma = t.x / (float)d, mb = t.y / (float)d;
#pragma unroll
        for (u32 i = 0; i < LN_RING_WPT; ++i) {
            const u32 w = threadIdx.x + i * blockDim.x;
            if (w >= words) break;
            reinterpret_cast<float4*>(dx + r * d)[w] =
                make_float4(rs * (gv[i].x - ma - xh[i].x * mb), rs * (gv[i].y - ma - xh[i].y * mb), rs * (gv[i].z - ma - xh[i].z * mb),
                            rs * (gv[i].w - ma - xh[i].w * mb));
        }
    }
#pragma unroll
    for (u32 i = 0; i < LN_RING_WPT; ++i) {
        const u32 w = threadIdx.x + i * blockDim.x;
        if (w >= words) break;
        reinterpret_cast<float4*>(pg + (u64)blockIdx.x * d)[w] = ag[i];
        reinterpret_cast<float4*>(pb + (u64)blockIdx.x * d)[w] = ab[i];
    }
}

// probs = softmax(logits) per row, row_loss = logsumexp - logit[label] (0 for an ignored row,
// NaN for a label that is not a class id); each exp computed once, as ex2(x log2(e) - max
// log2(e)) (one FFMA and the SFU; bf16 rows are compute-bound). Thread 0 reads the label's
// logit when the row group starts, its latency behind the row's reductions. The kernels are
// held to 64 registers (four 256-thread blocks an SM, __launch_bounds__(256, 4)) and launched a
// block a row group (ops/loss.rs): together, bf16 at 4096 x 4096 ran at 1.18x of the floor
// against 1.31x at 93 registers and RowTiles' cap; the bounds alone, at the cap, moved nothing
// (1.31x and 1.31x; H100, bench/xent_sweep.py kind rows64, 2026-12-06). Rows of 8 KB and more
// take sx_smem_t (half.cu).
template <typename T>
__device__ __forceinline__ void sx_rows_t(T* probs, float* row_loss, const T* logits, const float* labels, u32 rows, u32 c) {
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
        const float xl = (ok && lok && threadIdx.x == 0) ? ld(logits + r * c, (u32)l) : 0.0f;
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
        const float ml = -m * GR_LOG2E;
        float e[V * W];
        float s = 0.0f;
#pragma unroll
        for (u32 i = 0; i < V; ++i) {
#pragma unroll
            for (u32 k = 0; k < W; ++k) {
                e[i * W + k] = rn_in(vec, i, k, W, c) ? sx_exp(ld(px[i].e, k), ml) : 0.0f;
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
            if (threadIdx.x == 0) row_loss[r] = lok ? (m + logf(s)) - xl : l == IGNORE_LABEL ? 0.0f : gr_nan();
        }
    }
}

// y[b, q, p, e] = x[b, p, q, e]: swaps dimensions 1 and 2 of a [b, p, q, e] tensor (attention
// moves [batch, seq, heads, head_dim] to [batch, heads, seq, head_dim] and back). One thread per
// 16 bytes of output when a row of e elements is made of whole 16-byte words (the buffers are
// 256-byte aligned), else one per element.
template <typename T>
__device__ __forceinline__ void swap12_t(T* y, const T* x, u32 b, u32 p, u32 q, u32 e) {
    const u32 vec = 16 / sizeof(T);
    const bool wide = e % vec == 0;
    const u32 ev = wide ? e / vec : e;
    const u64 n = (u64)b * p * q * ev;
    for (u64 i = gr_tid(); i < n; i += gr_stride()) {
        const u64 ee = i % ev;
        u64 r = i / ev;
        const u64 pp = r % p;
        r /= p;
        const u64 qq = r % q;
        const u64 src = ((r / q * p + pp) * q + qq) * ev + ee;
        if (wide) {
            reinterpret_cast<uint4*>(y)[i] = reinterpret_cast<const uint4*>(x)[src];
        } else {
            st(y, i, ld(x, src));
        }
    }
}

__device__ __forceinline__ float sigmoidf(float x) { return 1.0f / (1.0f + expf(-x)); }

// y = silu(gate) * up.
__device__ __forceinline__ float swiglu_elem(float g, float u) { return g * sigmoidf(g) * u; }
template <typename T> __device__ __forceinline__ void swiglu_t(T* y, const T* gate, const T* up, u32 n) {
    map2(y, gate, up, n, [](u64, float g, float u) { return swiglu_elem(g, u); });
}

// swiglu_t over one tensor holding gate and up side by side: y[r, j] = silu(gu[r, j]) *
// gu[r, h + j] for rows r of gu ([rows, 2h], one GEMM's output against the two weights
// stacked), y [rows, h]. 16 bytes a load and store when h and the pointers allow it (a pack
// never straddles a row), else element by element; the same math as swiglu_t either way.
template <typename T> __device__ __forceinline__ void swiglu_packed_t(T* y, const T* gu, u32 rows, u32 h) {
    constexpr u32 W = 16 / sizeof(T);
    const u64 n = (u64)rows * h;
    if (al16(y) && al16(gu) && h % W == 0) {
        for (u64 v = gr_tid(); v < n / W; v += gr_stride()) {
            const u64 i = v * W, r = i / h, j = i % h;
            Pack<T> pg, pu, py;
            pg.raw = *reinterpret_cast<const uint4*>(gu + r * 2 * h + j);
            pu.raw = *reinterpret_cast<const uint4*>(gu + r * 2 * h + h + j);
#pragma unroll
            for (u32 k = 0; k < W; ++k) st(py.e, k, swiglu_elem(ld(pg.e, k), ld(pu.e, k)));
            reinterpret_cast<uint4*>(y)[v] = py.raw;
        }
        return;
    }
    for (u64 i = gr_tid(); i < n; i += gr_stride()) {
        const u64 r = i / h, j = i % h;
        st(y, i, swiglu_elem(ld(gu, r * 2 * h + j), ld(gu, r * 2 * h + h + j)));
    }
}

// dgate = dy * up * s * (1 + g * (1 - s)), dup = dy * g * s, s = sigmoid(g), and, when y is not
// null, the forward's y = swiglu_elem(g, u) again (bit for bit what swiglu_t stored, so a caller
// may recompute it here instead of saving it): 16 bytes a load and store (as half.cu's maps),
// then the tail element by element, the same math either way.
__device__ __forceinline__ void swiglu_bwd_elem(float d, float g, float u, float& dg, float& du) {
    const float s = sigmoidf(g);
    dg = d * u * s * (1.0f + g * (1.0f - s));
    du = d * g * s;
}
// One 16-byte pack of swiglu_bwd_elem: the grads of gate and up, and y again when with_y.
template <typename T>
__device__ __forceinline__ void swiglu_bwd_pack(const Pack<T>& pd, const Pack<T>& pg, const Pack<T>& pu, Pack<T>& og, Pack<T>& ou,
                                                Pack<T>& oy, bool with_y) {
    constexpr u32 W = 16 / sizeof(T);
#pragma unroll
    for (u32 k = 0; k < W; ++k) {
        float dg, du;
        swiglu_bwd_elem(ld(pd.e, k), ld(pg.e, k), ld(pu.e, k), dg, du);
        st(og.e, k, dg);
        st(ou.e, k, du);
        if (with_y) st(oy.e, k, swiglu_elem(ld(pg.e, k), ld(pu.e, k)));
    }
}
template <typename T>
__device__ __forceinline__ void swiglu_bwd_t(T* dgate, T* dup, T* y, const T* dy, const T* gate, const T* up, u32 n) {
    constexpr u32 W = 16 / sizeof(T);
    u64 done = 0;
    if (al16(dgate) && al16(dup) && al16(y) && al16(dy) && al16(gate) && al16(up)) {
        const u64 nv = n / W;
        for (u64 v = gr_tid(); v < nv; v += gr_stride()) {
            Pack<T> pd, pg, pu, og, ou, oy;
            pd.raw = reinterpret_cast<const uint4*>(dy)[v];
            pg.raw = reinterpret_cast<const uint4*>(gate)[v];
            pu.raw = reinterpret_cast<const uint4*>(up)[v];
            swiglu_bwd_pack(pd, pg, pu, og, ou, oy, y != nullptr);
            reinterpret_cast<uint4*>(dgate)[v] = og.raw;
            reinterpret_cast<uint4*>(dup)[v] = ou.raw;
            if (y) reinterpret_cast<uint4*>(y)[v] = oy.raw;
        }
        done = nv * W;
    }
    for (u64 i = done + gr_tid(); i < n; i += gr_stride()) {
        float dg, du;
        swiglu_bwd_elem(ld(dy, i), ld(gate, i), ld(up, i), dg, du);
        st(dgate, i, dg);
        st(dup, i, du);
        if (y) st(y, i, swiglu_elem(ld(gate, i), ld(up, i)));
    }
}

// swiglu_bwd_t over one tensor holding gate and up side by side (swiglu_packed_t's layout):
// dgu[r, j] = dgate and dgu[r, h + j] = dup of dy[r, j], gate gu[r, j] and up gu[r, h + j]; and,
// when y is not null, y[r, j] = swiglu_elem again. 16 bytes a load and store when h and the
// pointers allow it (a pack never straddles a row), else element by element; the same math as
// swiglu_bwd_t either way.
template <typename T>
__device__ __forceinline__ void swiglu_packed_bwd_t(T* dgu, T* y, const T* dy, const T* gu, u32 rows, u32 h) {
    constexpr u32 W = 16 / sizeof(T);
    const u64 n = (u64)rows * h;
    if (al16(dgu) && al16(y) && al16(dy) && al16(gu) && h % W == 0) {
        for (u64 v = gr_tid(); v < n / W; v += gr_stride()) {
            const u64 i = v * W, r = i / h, j = i % h, at = r * 2 * h + j;
            Pack<T> pd, pg, pu, og, ou, oy;
            pd.raw = reinterpret_cast<const uint4*>(dy)[v];
            pg.raw = *reinterpret_cast<const uint4*>(gu + at);
            pu.raw = *reinterpret_cast<const uint4*>(gu + at + h);
            swiglu_bwd_pack(pd, pg, pu, og, ou, oy, y != nullptr);
            *reinterpret_cast<uint4*>(dgu + at) = og.raw;
            *reinterpret_cast<uint4*>(dgu + at + h) = ou.raw;
            if (y) reinterpret_cast<uint4*>(y)[v] = oy.raw;
        }
        return;
    }
    for (u64 i = gr_tid(); i < n; i += gr_stride()) {
        const u64 r = i / h, j = i % h, at = r * 2 * h + j;
        const float g = ld(gu, at), u = ld(gu, at + h);
        float dg, du;
        swiglu_bwd_elem(ld(dy, i), g, u, dg, du);
        st(dgu, at, dg);
        st(dgu, at + h, du);
        if (y) st(y, i, swiglu_elem(g, u));
    }
}

// RMSNorm's y again from its saved rstd: y = x * rstd[row] * gamma, the forward's expression on
// the same floats (rms_norm_t, rms_rows_t), so bit for bit what they stored. 16 bytes a load and
// store when d and the pointers allow it (a pack never straddles a row), else element by element.
template <typename T>
__device__ __forceinline__ void rms_norm_apply_t(T* y, const T* x, const T* gamma, const float* rstd, u32 rows, u32 d) {
    constexpr u32 W = 16 / sizeof(T);
    const u64 n = (u64)rows * d;
    if (al16(y) && al16(x) && al16(gamma) && d % W == 0) {
        for (u64 v = gr_tid(); v < n / W; v += gr_stride()) {
            const u64 i = v * W, j = i % d;
            const float rs = rstd[i / d];
            Pack<T> px, pg, py;
            px.raw = reinterpret_cast<const uint4*>(x)[v];
            pg.raw = *reinterpret_cast<const uint4*>(gamma + j);
#pragma unroll
            for (u32 k = 0; k < W; ++k) st(py.e, k, ld(px.e, k) * rs * ld(pg.e, k));
            reinterpret_cast<uint4*>(y)[v] = py.raw;
        }
        return;
    }
    for (u64 i = gr_tid(); i < n; i += gr_stride()) st(y, i, ld(x, i) * rstd[i / d] * ld(gamma, i % d));
}

// ---------------------------------------------------------------- causal attention
//
// Score rows r < rows = batch * heads * t, row r of head (b, h) at query position i = r % t.
// Scores s are f32 (the GEMM's output); probabilities and dS are stored in T for the next GEMM.

// p[r, j] = softmax_j(scale * s[r, j]) over j <= i, 0 for j > i; lse[r] = m + log(sum_j
// exp(scale * s[r, j] - m)), m the row's largest scaled score. One warp per row; p may be s
// (each lane reads an element before it writes it).
template <typename T>
__device__ __forceinline__ void attn_softmax_lse_t(T* p, float* lse, const float* s, u32 rows, u32 t, float scale) {
    const u32 lane = threadIdx.x & 31;
    GR_WARP_ROWS(r, rows) {
        const u32 i = (u32)(r % t);
        const float* sr = s + r * t;
        float m = gr_neg_inf();
        for (u32 j = lane; j <= i; j += 32) m = fmaxf(m, scale * sr[j]);
        m = warp_max(m);
        float z = 0.0f;
        for (u32 j = lane; j <= i; j += 32) z += expf(scale * sr[j] - m);
        z = warp_sum(z);
        const float inv = 1.0f / z;
        for (u32 j = lane; j < t; j += 32) st(p, r * t + j, j <= i ? expf(scale * sr[j] - m) * inv : 0.0f);
        if (lane == 0) lse[r] = m + logf(z);
    }
}

// The backward's fused score kernel, one warp per row r = (b * heads + h) * t + i:
// D = sum_e dout[b, i, h, e] * out[b, i, h, e] ([batch, t, heads * dh] tensors), P = exp(scale *
// s - lse[r]) for j <= i (0 above), p = P and ds = scale * P * (dp - D). p may be s and ds may be
// dp (each element is read before it is written, by the same lane).
template <typename T>
__device__ __forceinline__ void attn_bwd_scores_t(T* p, T* ds, const float* s, const float* dp, const float* lse, const T* dout, const T* out, u32 rows, u32 t, u32 heads, u32 dh, float scale) {
    const u32 lane = threadIdx.x & 31;
    GR_WARP_ROWS(r, rows) {
        const u64 i = r % t;
        const u64 bh = r / t;
        const u64 o = ((bh / heads) * t + i) * ((u64)heads * dh) + (bh % heads) * dh;
        float d = 0.0f;
        for (u32 e = lane; e < dh; e += 32) d += ld(dout, o + e) * ld(out, o + e);
        d = warp_sum(d);
        const float l = lse[r];
        for (u32 j = lane; j < t; j += 32) {
            const u64 x = r * t + j;
            const float pj = j <= i ? expf(scale * s[x] - l) : 0.0f;
            const float g = scale * pj * (dp[x] - d);
            st(p, x, pj);
            st(ds, x, g);
        }
    }
}

// ---------------------------------------------------------------- instantiations

extern "C" __global__ void embedding_f32(float* y, const float* ids, const float* table, u32 tokens, u32 vocab, u32 d, u32* err) { GR_PDL_ENTRY(); embedding_t(y, ids, table, tokens, vocab, d, err); }
extern "C" __global__ void embedding_bwd_f32(float* dtable, const float* dy, const float* ids, u32 tokens, u32 vocab, u32 d, u32* err) { GR_PDL_ENTRY(); embedding_bwd_t(dtable, dy, ids, tokens, vocab, d, err); }
extern "C" __global__ void rms_norm_f32(float* y, float* rstd_out, const float* x, const float* gamma, u32 rows, u32 d, float eps) { GR_PDL_ENTRY(); rms_norm_t(y, rstd_out, x, gamma, rows, d, eps); }
extern "C" __global__ void rms_norm_bwd_f32(float* dx, const float* dy, const float* x, const float* gamma, const float* rstd, u32 rows, u32 d) { GR_PDL_ENTRY(); rms_norm_bwd_t(dx, dy, x, gamma, rstd, rows, d); }
extern "C" __global__ void rms_norm_bwd_params_partial_f32(float* partial, const float* dy, const float* x, const float* rstd, u32 rows, u32 d, u32 chunk) { GR_PDL_ENTRY(); rms_norm_bwd_params_partial_t(partial, dy, x, rstd, rows, d, chunk); }
extern "C" __global__ void col_partials_acc_f32(float* out, const float* partial, u32 chunks, u32 d) { GR_PDL_ENTRY(); col_partials_acc_t(out, partial, chunks, d); }
extern "C" __global__ void swap12_f32(float* y, const float* x, u32 b, u32 p, u32 q, u32 e) { GR_PDL_ENTRY(); swap12_t(y, x, b, p, q, e); }
extern "C" __global__ void swiglu_f32(float* y, const float* gate, const float* up, u32 n) { GR_PDL_ENTRY(); swiglu_t(y, gate, up, n); }
extern "C" __global__ void swiglu_packed_f32(float* y, const float* gu, u32 rows, u32 h) { GR_PDL_ENTRY(); swiglu_packed_t(y, gu, rows, h); }
extern "C" __global__ void swiglu_bwd_f32(float* dgate, float* dup, float* y, const float* dy, const float* gate, const float* up, u32 n) { GR_PDL_ENTRY(); swiglu_bwd_t(dgate, dup, y, dy, gate, up, n); }
extern "C" __global__ void swiglu_packed_bwd_f32(float* dgu, float* y, const float* dy, const float* gu, u32 rows, u32 h) { GR_PDL_ENTRY(); swiglu_packed_bwd_t(dgu, y, dy, gu, rows, h); }
extern "C" __global__ void rms_norm_apply_f32(float* y, const float* x, const float* gamma, const float* rstd, u32 rows, u32 d) { GR_PDL_ENTRY(); rms_norm_apply_t(y, x, gamma, rstd, rows, d); }
extern "C" __global__ void attn_softmax_lse_f32(float* p, float* lse, const float* s, u32 rows, u32 t, float scale) { GR_PDL_ENTRY(); attn_softmax_lse_t(p, lse, s, rows, t, scale); }
extern "C" __global__ void attn_bwd_scores_f32(float* p, float* ds, const float* s, const float* dp, const float* lse, const float* dout, const float* out, u32 rows, u32 t, u32 heads, u32 dh, float scale) { GR_PDL_ENTRY(); attn_bwd_scores_t(p, ds, s, dp, lse, dout, out, rows, t, heads, dh, scale); }
extern "C" __global__ void embedding_bf16(bf16_t* y, const float* ids, const bf16_t* table, u32 tokens, u32 vocab, u32 d, u32* err) { GR_PDL_ENTRY(); embedding_t(y, ids, table, tokens, vocab, d, err); }
extern "C" __global__ void embedding_bwd_bf16(bf16_t* dtable, const bf16_t* dy, const float* ids, u32 tokens, u32 vocab, u32 d, u32* err) { GR_PDL_ENTRY(); embedding_bwd_t(dtable, dy, ids, tokens, vocab, d, err); }
extern "C" __global__ void rms_norm_bf16(bf16_t* y, float* rstd_out, const bf16_t* x, const bf16_t* gamma, u32 rows, u32 d, float eps) { GR_PDL_ENTRY(); rms_norm_t(y, rstd_out, x, gamma, rows, d, eps); }
extern "C" __global__ void rms_norm_bwd_bf16(bf16_t* dx, const bf16_t* dy, const bf16_t* x, const bf16_t* gamma, const float* rstd, u32 rows, u32 d) { GR_PDL_ENTRY(); rms_norm_bwd_t(dx, dy, x, gamma, rstd, rows, d); }
extern "C" __global__ void rms_norm_bwd_params_partial_bf16(float* partial, const bf16_t* dy, const bf16_t* x, const float* rstd, u32 rows, u32 d, u32 chunk) { GR_PDL_ENTRY(); rms_norm_bwd_params_partial_t(partial, dy, x, rstd, rows, d, chunk); }
extern "C" __global__ void col_partials_acc_bf16(bf16_t* out, const float* partial, u32 chunks, u32 d) { GR_PDL_ENTRY(); col_partials_acc_t(out, partial, chunks, d); }
extern "C" __global__ void swap12_bf16(bf16_t* y, const bf16_t* x, u32 b, u32 p, u32 q, u32 e) { GR_PDL_ENTRY(); swap12_t(y, x, b, p, q, e); }
extern "C" __global__ void swiglu_bf16(bf16_t* y, const bf16_t* gate, const bf16_t* up, u32 n) { GR_PDL_ENTRY(); swiglu_t(y, gate, up, n); }
extern "C" __global__ void swiglu_packed_bf16(bf16_t* y, const bf16_t* gu, u32 rows, u32 h) { GR_PDL_ENTRY(); swiglu_packed_t(y, gu, rows, h); }
extern "C" __global__ void swiglu_bwd_bf16(bf16_t* dgate, bf16_t* dup, bf16_t* y, const bf16_t* dy, const bf16_t* gate, const bf16_t* up, u32 n) { GR_PDL_ENTRY(); swiglu_bwd_t(dgate, dup, y, dy, gate, up, n); }
extern "C" __global__ void swiglu_packed_bwd_bf16(bf16_t* dgu, bf16_t* y, const bf16_t* dy, const bf16_t* gu, u32 rows, u32 h) { GR_PDL_ENTRY(); swiglu_packed_bwd_t(dgu, y, dy, gu, rows, h); }
extern "C" __global__ void rms_norm_apply_bf16(bf16_t* y, const bf16_t* x, const bf16_t* gamma, const float* rstd, u32 rows, u32 d) { GR_PDL_ENTRY(); rms_norm_apply_t(y, x, gamma, rstd, rows, d); }
extern "C" __global__ void attn_softmax_lse_bf16(bf16_t* p, float* lse, const float* s, u32 rows, u32 t, float scale) { GR_PDL_ENTRY(); attn_softmax_lse_t(p, lse, s, rows, t, scale); }
extern "C" __global__ void attn_bwd_scores_bf16(bf16_t* p, bf16_t* ds, const float* s, const float* dp, const float* lse, const bf16_t* dout, const bf16_t* out, u32 rows, u32 t, u32 heads, u32 dh, float scale) { GR_PDL_ENTRY(); attn_bwd_scores_t(p, ds, s, dp, lse, dout, out, rows, t, heads, dh, scale); }
extern "C" __global__ void embedding_f16(f16_t* y, const float* ids, const f16_t* table, u32 tokens, u32 vocab, u32 d, u32* err) { GR_PDL_ENTRY(); embedding_t(y, ids, table, tokens, vocab, d, err); }
extern "C" __global__ void embedding_bwd_f16(f16_t* dtable, const f16_t* dy, const float* ids, u32 tokens, u32 vocab, u32 d, u32* err) { GR_PDL_ENTRY(); embedding_bwd_t(dtable, dy, ids, tokens, vocab, d, err); }
extern "C" __global__ void rms_norm_f16(f16_t* y, float* rstd_out, const f16_t* x, const f16_t* gamma, u32 rows, u32 d, float eps) { GR_PDL_ENTRY(); rms_norm_t(y, rstd_out, x, gamma, rows, d, eps); }
extern "C" __global__ void rms_norm_bwd_f16(f16_t* dx, const f16_t* dy, const f16_t* x, const f16_t* gamma, const float* rstd, u32 rows, u32 d) { GR_PDL_ENTRY(); rms_norm_bwd_t(dx, dy, x, gamma, rstd, rows, d); }
extern "C" __global__ void rms_norm_bwd_params_partial_f16(float* partial, const f16_t* dy, const f16_t* x, const float* rstd, u32 rows, u32 d, u32 chunk) { GR_PDL_ENTRY(); rms_norm_bwd_params_partial_t(partial, dy, x, rstd, rows, d, chunk); }
extern "C" __global__ void col_partials_acc_f16(f16_t* out, const float* partial, u32 chunks, u32 d) { GR_PDL_ENTRY(); col_partials_acc_t(out, partial, chunks, d); }
extern "C" __global__ void swap12_f16(f16_t* y, const f16_t* x, u32 b, u32 p, u32 q, u32 e) { GR_PDL_ENTRY(); swap12_t(y, x, b, p, q, e); }
extern "C" __global__ void swiglu_f16(f16_t* y, const f16_t* gate, const f16_t* up, u32 n) { GR_PDL_ENTRY(); swiglu_t(y, gate, up, n); }
extern "C" __global__ void swiglu_packed_f16(f16_t* y, const f16_t* gu, u32 rows, u32 h) { GR_PDL_ENTRY(); swiglu_packed_t(y, gu, rows, h); }
extern "C" __global__ void swiglu_bwd_f16(f16_t* dgate, f16_t* dup, f16_t* y, const f16_t* dy, const f16_t* gate, const f16_t* up, u32 n) { GR_PDL_ENTRY(); swiglu_bwd_t(dgate, dup, y, dy, gate, up, n); }
extern "C" __global__ void swiglu_packed_bwd_f16(f16_t* dgu, f16_t* y, const f16_t* dy, const f16_t* gu, u32 rows, u32 h) { GR_PDL_ENTRY(); swiglu_packed_bwd_t(dgu, y, dy, gu, rows, h); }
extern "C" __global__ void rms_norm_apply_f16(f16_t* y, const f16_t* x, const f16_t* gamma, const float* rstd, u32 rows, u32 d) { GR_PDL_ENTRY(); rms_norm_apply_t(y, x, gamma, rstd, rows, d); }
extern "C" __global__ void attn_softmax_lse_f16(f16_t* p, float* lse, const float* s, u32 rows, u32 t, float scale) { GR_PDL_ENTRY(); attn_softmax_lse_t(p, lse, s, rows, t, scale); }
extern "C" __global__ void attn_bwd_scores_f16(f16_t* p, f16_t* ds, const float* s, const float* dp, const float* lse, const f16_t* dout, const f16_t* out, u32 rows, u32 t, u32 heads, u32 dh, float scale) { GR_PDL_ENTRY(); attn_bwd_scores_t(p, ds, s, dp, lse, dout, out, rows, t, heads, dh, scale); }
// RMSNorm (and residual add + RMSNorm) with rows in registers.
extern "C" __global__ void rms_rows_f32(float* y, float* rstd_out, float* sum_out, const float* x, const float* res, const float* gamma, u32 rows, u32 d, float eps) { GR_PDL_ENTRY(); rms_rows_t(y, rstd_out, sum_out, x, res, gamma, rows, d, eps); }
extern "C" __global__ void rms_rows_bwd_f32(float* dx, float* partial, const float* dy, const float* dsum, const float* x, const float* gamma, const float* rstd, u32 rows, u32 d) { GR_PDL_ENTRY(); rms_rows_bwd_t(dx, partial, dy, dsum, x, gamma, rstd, rows, d); }
extern "C" __global__ void rms_rows_bf16(bf16_t* y, float* rstd_out, bf16_t* sum_out, const bf16_t* x, const bf16_t* res, const bf16_t* gamma, u32 rows, u32 d, float eps) { GR_PDL_ENTRY(); rms_rows_t(y, rstd_out, sum_out, x, res, gamma, rows, d, eps); }
extern "C" __global__ void rms_ring_bwd_bf16(bf16_t* dx, float* partial, const bf16_t* dy, const bf16_t* dsum, const bf16_t* x, const bf16_t* gamma, const float* rstd, u32 rows, u32 d) { GR_PDL_ENTRY(); rms_ring_bwd_t<bf16_t, false>(dx, partial, dy, dsum, x, gamma, rstd, rows, d); }
// The same in thread block clusters (sm_90): one row of gamma-grad partials a cluster.
extern "C" __global__ void rms_ring_bwd_cl_bf16(bf16_t* dx, float* partial, const bf16_t* dy, const bf16_t* dsum, const bf16_t* x, const bf16_t* gamma, const float* rstd, u32 rows, u32 d) { GR_PDL_ENTRY(); rms_ring_bwd_t<bf16_t, true>(dx, partial, dy, dsum, x, gamma, rstd, rows, d); }
extern "C" __global__ void __launch_bounds__(1024) rms_smem_bf16(bf16_t* y, float* rstd_out, bf16_t* sum_out, const bf16_t* x, const bf16_t* res, const bf16_t* gamma, u32 rows, u32 d, float eps) { GR_PDL_ENTRY(); rms_smem_t<bf16_t, 1>(y, rstd_out, sum_out, x, res, gamma, rows, d, eps); }
extern "C" __global__ void __launch_bounds__(512) rms_smem2_bf16(bf16_t* y, float* rstd_out, bf16_t* sum_out, const bf16_t* x, const bf16_t* res, const bf16_t* gamma, u32 rows, u32 d, float eps) { GR_PDL_ENTRY(); rms_smem_t<bf16_t, 2>(y, rstd_out, sum_out, x, res, gamma, rows, d, eps); }
extern "C" __global__ void rms_ring_bf16(bf16_t* y, float* rstd_out, bf16_t* sum_out, const bf16_t* x, const bf16_t* res, const bf16_t* gamma, u32 rows, u32 d, float eps) { GR_PDL_ENTRY(); rms_ring_t(y, rstd_out, sum_out, x, res, gamma, rows, d, eps); }
extern "C" __global__ void rms_rows_bwd_bf16(bf16_t* dx, float* partial, const bf16_t* dy, const bf16_t* dsum, const bf16_t* x, const bf16_t* gamma, const float* rstd, u32 rows, u32 d) { GR_PDL_ENTRY(); rms_rows_bwd_t(dx, partial, dy, dsum, x, gamma, rstd, rows, d); }
extern "C" __global__ void rms_rows_f16(f16_t* y, float* rstd_out, f16_t* sum_out, const f16_t* x, const f16_t* res, const f16_t* gamma, u32 rows, u32 d, float eps) { GR_PDL_ENTRY(); rms_rows_t(y, rstd_out, sum_out, x, res, gamma, rows, d, eps); }
extern "C" __global__ void rms_rows_bwd_f16(f16_t* dx, float* partial, const f16_t* dy, const f16_t* dsum, const f16_t* x, const f16_t* gamma, const float* rstd, u32 rows, u32 d) { GR_PDL_ENTRY(); rms_rows_bwd_t(dx, partial, dy, dsum, x, gamma, rstd, rows, d); }
// Layer norm (forward, dx) and softmax cross-entropy with rows in registers.
extern "C" __global__ void ln_rows_f32(float* y, float* mean_out, float* rstd_out, const float* x, const float* gamma, const float* beta, u32 rows, u32 d, float eps) { GR_PDL_ENTRY(); ln_rows_t(y, mean_out, rstd_out, x, gamma, beta, rows, d, eps); }
extern "C" __global__ void ln_rows_bf16(bf16_t* y, float* mean_out, float* rstd_out, const bf16_t* x, const bf16_t* gamma, const bf16_t* beta, u32 rows, u32 d, float eps) { GR_PDL_ENTRY(); ln_rows_t(y, mean_out, rstd_out, x, gamma, beta, rows, d, eps); }
extern "C" __global__ void ln_rows_f16(f16_t* y, float* mean_out, float* rstd_out, const f16_t* x, const f16_t* gamma, const f16_t* beta, u32 rows, u32 d, float eps) { GR_PDL_ENTRY(); ln_rows_t(y, mean_out, rstd_out, x, gamma, beta, rows, d, eps); }
extern "C" __global__ void ln_rows_bwd_f32(float* dx, const float* dy, const float* x, const float* gamma, const float* mean, const float* rstd, u32 rows, u32 d) { GR_PDL_ENTRY(); ln_rows_bwd_t(dx, dy, x, gamma, mean, rstd, rows, d); }
extern "C" __global__ void ln_rows_bwd_bf16(bf16_t* dx, const bf16_t* dy, const bf16_t* x, const bf16_t* gamma, const float* mean, const float* rstd, u32 rows, u32 d) { GR_PDL_ENTRY(); ln_rows_bwd_t(dx, dy, x, gamma, mean, rstd, rows, d); }
extern "C" __global__ void ln_rows_bwd_f16(f16_t* dx, const f16_t* dy, const f16_t* x, const f16_t* gamma, const float* mean, const float* rstd, u32 rows, u32 d) { GR_PDL_ENTRY(); ln_rows_bwd_t(dx, dy, x, gamma, mean, rstd, rows, d); }
extern "C" __global__ void __launch_bounds__(256, 4) sx_rows_f32(float* probs, float* row_loss, const float* logits, const float* labels, u32 rows, u32 c) { GR_PDL_ENTRY(); sx_rows_t(probs, row_loss, logits, labels, rows, c); }
extern "C" __global__ void __launch_bounds__(256, 4) sx_rows_bf16(bf16_t* probs, float* row_loss, const bf16_t* logits, const float* labels, u32 rows, u32 c) { GR_PDL_ENTRY(); sx_rows_t(probs, row_loss, logits, labels, rows, c); }
extern "C" __global__ void __launch_bounds__(256, 4) sx_rows_f16(f16_t* probs, float* row_loss, const f16_t* logits, const float* labels, u32 rows, u32 c) { GR_PDL_ENTRY(); sx_rows_t(probs, row_loss, logits, labels, rows, c); }
// The f32 grads of 16-bit parameters (mixed precision): the embedding table (RMSNorm's gamma
// accumulates through col_partials_acc_f32).
extern "C" __global__ void embedding_bwd_bf16_f32(float* dtable, const bf16_t* dy, const float* ids, u32 tokens, u32 vocab, u32 d, u32* err) { GR_PDL_ENTRY(); embedding_bwd_t(dtable, dy, ids, tokens, vocab, d, err); }
extern "C" __global__ void embedding_bwd_f16_f32(float* dtable, const f16_t* dy, const float* ids, u32 tokens, u32 vocab, u32 d, u32* err) { GR_PDL_ENTRY(); embedding_bwd_t(dtable, dy, ids, tokens, vocab, d, err); }

// AdamW's learning rate from its step count (state[0], u32 bits, already incremented): linear
// warm-up to `peak` over `warmup` steps, then a cosine down to `floor_lr` at step `total`.
extern "C" __global__ void lr_warmup_cosine_f32(float* lr, const float* state, float peak, float floor_lr, u32 warmup, u32 total) {
    GR_PDL_ENTRY();
    if (blockIdx.x != 0 || threadIdx.x != 0) return;
    const u32 t = __float_as_uint(state[0]);
    if (t <= warmup) {
        lr[0] = peak * (float)t / (float)(warmup > 1u ? warmup : 1u);
        return;
    }
    const u32 span = total - warmup > 1u ? total - warmup : 1u;
    const float p = fminf((float)(t - warmup) / (float)span, 1.0f);
    lr[0] = floor_lr + (peak - floor_lr) * 0.5f * (1.0f + cosf(3.14159265358979f * p));
}
