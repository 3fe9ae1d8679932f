// bench/row_sweep.py's own RMSNorm forward (kind smem; session 23), compiled after the
// runtime's main program (its helpers: rn_fwd_vec, block_sum, Pack, gr_sx_row, gr_cp16 and
// SxStages from half.cu): rms_rows_t's math with the row in shared memory, as the
// cross-entropy's sx_smem_t holds it. A block a row (grid-stride past the grid); each thread
// copies its 16-byte words of x (and of res) with cp.async in SX_STAGES commit groups and adds
// its squares over each group as it lands (with res: x + res rounded to T, stored to sum_out
// and kept in shared memory); after the block's sum it writes y = s * rstd * gamma from shared
// memory, gamma read through L1. Many rows in flight an SM (as many blocks as its threads and
// shared memory hold) where rms_rows_t holds one row group a block and the ring two. Other
// bits than rms_rows_t (the sum of squares in another order). Rows of whole aligned words only.
template <typename T>
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
        float s = 0.0f;
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
#pragma unroll
            for (u32 k = 0; k < W; ++k) {
                const float v = ld(p.e, k);
                s += v * v;
            }
        });
        const float rstd = 1.0f / sqrtf(block_sum(s, red) / (float)d + eps);
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
extern "C" __global__ void __launch_bounds__(1024) rms_smem_bf16(bf16_t* y, float* rstd_out, bf16_t* sum_out, const bf16_t* x, const bf16_t* res, const bf16_t* gamma, u32 rows, u32 d, float eps) {
    rms_smem_t(y, rstd_out, sum_out, x, res, gamma, rows, d, eps);
}
