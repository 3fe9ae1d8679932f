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

// dtable[v, :] += sum over tokens t with ids[t] == v of dy[t, :]: one block per vocabulary row
// scans every token in order (a sort-free scan; deterministic without atomics), summing in f32.
// dtable is T or f32 (the f32 grad of a 16-bit table). Bad ids add nothing; the thread of row 0,
// column 0 reports them.
template <typename TG, typename T>
__device__ __forceinline__ void embedding_bwd_t(TG* dtable, const T* dy, const float* ids, u32 tokens, u32 vocab, u32 d, u32* err) {
    for (u64 v = blockIdx.x; v < vocab; v += gridDim.x) {
        for (u32 j = threadIdx.x; j < d; j += blockDim.x) {
            float s = 0.0f;
            for (u64 t = 0; t < tokens; ++t) {
                const long long r = token_row(ids[t], vocab);
                if (r == (long long)v) s += ld(dy, t * d + j);
                else if (r < 0 && v == 0 && j == 0) gr_report_token(err, t, ids[t], vocab, 2u);
            }
            st(dtable, v * d + j, ld(dtable, v * d + j) + s);
        }
    }
}

// y = x * rstd * gamma, rstd = 1 / sqrt(mean(x^2) + eps); one block per row.
template <typename T>
__device__ __forceinline__ void rms_norm_t(T* y, float* rstd_out, const T* x, const T* gamma, u32 rows, u32 d, float eps) {
    __shared__ float sh[32];
    for (u64 r = blockIdx.x; r < rows; r += gridDim.x) {
        const T* xr = x + r * d;
        float s = 0.0f;
        for (u32 j = threadIdx.x; j < d; j += blockDim.x) s += ld(xr, j) * ld(xr, j);
        const float rstd = 1.0f / sqrtf(block_sum(s, sh) / (float)d + eps);
        for (u32 j = threadIdx.x; j < d; j += blockDim.x) st(y, r * d + j, ld(xr, j) * rstd * ld(gamma, j));
        if (threadIdx.x == 0) rstd_out[r] = rstd;
    }
}

// dx = rstd * (g - xhat * mean(g * xhat)), g = dy * gamma, xhat = x * rstd; one block per row.
template <typename T>
__device__ __forceinline__ void rms_norm_bwd_t(T* dx, const T* dy, const T* x, const T* gamma, const float* rstd, u32 rows, u32 d) {
    __shared__ float sh[32];
    for (u64 r = blockIdx.x; r < rows; r += gridDim.x) {
        const float rs = rstd[r];
        float s = 0.0f;
        for (u32 j = threadIdx.x; j < d; j += blockDim.x) s += ld(dy, r * d + j) * ld(gamma, j) * ld(x, r * d + j) * rs;
        const float m = block_sum(s, sh) / (float)d;
        for (u32 j = threadIdx.x; j < d; j += blockDim.x) {
            const float xh = ld(x, r * d + j) * rs;
            st(dx, r * d + j, rs * (ld(dy, r * d + j) * ld(gamma, j) - xh * m));
        }
    }
}

// dgamma[j] += sum_r dy[r, j] * x[r, j] * rstd[r], summed in f32; dgamma is T or f32.
// (32, GR_COL_Y) column blocks.
template <typename TG, typename T>
__device__ __forceinline__ void rms_norm_bwd_params_t(TG* dgamma, const T* dy, const T* x, const float* rstd, u32 rows, u32 d) {
    __shared__ float sh[GR_COL_Y][33];
    for (u64 c0 = (u64)blockIdx.x * 32; c0 < d; c0 += (u64)gridDim.x * 32) {
        const u64 c = c0 + threadIdx.x;
        float s = 0.0f;
        if (c < d) {
            for (u64 r = threadIdx.y; r < rows; r += GR_COL_Y) s += ld(dy, r * d + c) * (ld(x, r * d + c) * rstd[r]);
        }
        sh[threadIdx.y][threadIdx.x] = s;
        __syncthreads();
        if (threadIdx.y == 0 && c < d) {
            float t = 0.0f;
            for (int k = 0; k < GR_COL_Y; ++k) t += sh[k][threadIdx.x];
            st(dgamma, c, ld(dgamma, c) + t);
        }
        __syncthreads();
    }
}

__device__ __forceinline__ float sigmoidf(float x) { return 1.0f / (1.0f + expf(-x)); }

// y = silu(gate) * up.
template <typename T> __device__ __forceinline__ void swiglu_t(T* y, const T* gate, const T* up, u32 n) {
    map2(y, gate, up, n, [](u64, float g, float u) { return g * sigmoidf(g) * u; });
}

// dgate = dy * up * s * (1 + g * (1 - s)), dup = dy * g * s, s = sigmoid(g).
template <typename T>
__device__ __forceinline__ void swiglu_bwd_t(T* dgate, T* dup, const T* dy, const T* gate, const T* up, u32 n) {
    for (u64 i = gr_tid(); i < n; i += gr_stride()) {
        const float g = ld(gate, i);
        const float s = sigmoidf(g);
        const float d = ld(dy, i);
        st(dgate, i, d * ld(up, i) * s * (1.0f + g * (1.0f - s)));
        st(dup, i, d * g * s);
    }
}

// ---------------------------------------------------------------- causal attention
//
// Score rows r < rows = batch * heads * t, row r of head (b, h) at query position i = r % t.
// Scores s are f32 (the GEMM's output); probabilities and dS are stored in T for the next GEMM.

// p[r, j] = softmax_j(scale * s[r, j]) over j <= i, 0 for j > i; lse[r] = m + log(sum_j
// exp(scale * s[r, j] - m)), m the row's largest scaled score. One block per row; p may be s.
template <typename T>
__device__ __forceinline__ void attn_softmax_lse_t(T* p, float* lse, const float* s, u32 rows, u32 t, float scale) {
    __shared__ float sh[32];
    for (u64 r = blockIdx.x; r < rows; r += gridDim.x) {
        const u32 i = (u32)(r % t);
        const float* sr = s + r * t;
        float m = gr_neg_inf();
        for (u32 j = threadIdx.x; j <= i; j += blockDim.x) m = fmaxf(m, scale * sr[j]);
        m = block_max(m, sh);
        float z = 0.0f;
        for (u32 j = threadIdx.x; j <= i; j += blockDim.x) z += expf(scale * sr[j] - m);
        z = block_sum(z, sh);
        const float inv = 1.0f / z;
        for (u32 j = threadIdx.x; j < t; j += blockDim.x) st(p, r * t + j, j <= i ? expf(scale * sr[j] - m) * inv : 0.0f);
        if (threadIdx.x == 0) lse[r] = m + logf(z);
    }
}

// The backward's fused score kernel, one block per row r = (b * heads + h) * t + i:
// D = sum_e dout[b, i, h, e] * out[b, i, h, e] ([batch, t, heads * dh] tensors), P = exp(scale *
// s - lse[r]) for j <= i (0 above), p = P and ds = scale * P * (dp - D). p may be s and ds may be
// dp (each element is read before it is written, by the same thread).
template <typename T>
__device__ __forceinline__ void attn_bwd_scores_t(T* p, T* ds, const float* s, const float* dp, const float* lse, const T* dout, const T* out, u32 rows, u32 t, u32 heads, u32 dh, float scale) {
    __shared__ float sh[32];
    for (u64 r = blockIdx.x; r < rows; r += gridDim.x) {
        const u64 i = r % t;
        const u64 bh = r / t;
        const u64 o = ((bh / heads) * t + i) * ((u64)heads * dh) + (bh % heads) * dh;
        float d = 0.0f;
        for (u32 e = threadIdx.x; e < dh; e += blockDim.x) d += ld(dout, o + e) * ld(out, o + e);
        d = block_sum(d, sh);
        const float l = lse[r];
        for (u32 j = threadIdx.x; j < t; j += blockDim.x) {
            const u64 x = r * t + j;
            const float pj = j <= i ? expf(scale * s[x] - l) : 0.0f;
            const float g = scale * pj * (dp[x] - d);
            st(p, x, pj);
            st(ds, x, g);
        }
    }
}

// ---------------------------------------------------------------- instantiations

extern "C" __global__ void embedding_f32(float* y, const float* ids, const float* table, u32 tokens, u32 vocab, u32 d, u32* err) { embedding_t(y, ids, table, tokens, vocab, d, err); }
extern "C" __global__ void embedding_bwd_f32(float* dtable, const float* dy, const float* ids, u32 tokens, u32 vocab, u32 d, u32* err) { embedding_bwd_t(dtable, dy, ids, tokens, vocab, d, err); }
extern "C" __global__ void rms_norm_f32(float* y, float* rstd_out, const float* x, const float* gamma, u32 rows, u32 d, float eps) { rms_norm_t(y, rstd_out, x, gamma, rows, d, eps); }
extern "C" __global__ void rms_norm_bwd_f32(float* dx, const float* dy, const float* x, const float* gamma, const float* rstd, u32 rows, u32 d) { rms_norm_bwd_t(dx, dy, x, gamma, rstd, rows, d); }
extern "C" __global__ void rms_norm_bwd_params_f32(float* dgamma, const float* dy, const float* x, const float* rstd, u32 rows, u32 d) { rms_norm_bwd_params_t(dgamma, dy, x, rstd, rows, d); }
extern "C" __global__ void swiglu_f32(float* y, const float* gate, const float* up, u32 n) { swiglu_t(y, gate, up, n); }
extern "C" __global__ void swiglu_bwd_f32(float* dgate, float* dup, const float* dy, const float* gate, const float* up, u32 n) { swiglu_bwd_t(dgate, dup, dy, gate, up, n); }
extern "C" __global__ void attn_softmax_lse_f32(float* p, float* lse, const float* s, u32 rows, u32 t, float scale) { attn_softmax_lse_t(p, lse, s, rows, t, scale); }
extern "C" __global__ void attn_bwd_scores_f32(float* p, float* ds, const float* s, const float* dp, const float* lse, const float* dout, const float* out, u32 rows, u32 t, u32 heads, u32 dh, float scale) { attn_bwd_scores_t(p, ds, s, dp, lse, dout, out, rows, t, heads, dh, scale); }
extern "C" __global__ void embedding_bf16(bf16_t* y, const float* ids, const bf16_t* table, u32 tokens, u32 vocab, u32 d, u32* err) { embedding_t(y, ids, table, tokens, vocab, d, err); }
extern "C" __global__ void embedding_bwd_bf16(bf16_t* dtable, const bf16_t* dy, const float* ids, u32 tokens, u32 vocab, u32 d, u32* err) { embedding_bwd_t(dtable, dy, ids, tokens, vocab, d, err); }
extern "C" __global__ void rms_norm_bf16(bf16_t* y, float* rstd_out, const bf16_t* x, const bf16_t* gamma, u32 rows, u32 d, float eps) { rms_norm_t(y, rstd_out, x, gamma, rows, d, eps); }
extern "C" __global__ void rms_norm_bwd_bf16(bf16_t* dx, const bf16_t* dy, const bf16_t* x, const bf16_t* gamma, const float* rstd, u32 rows, u32 d) { rms_norm_bwd_t(dx, dy, x, gamma, rstd, rows, d); }
extern "C" __global__ void rms_norm_bwd_params_bf16(bf16_t* dgamma, const bf16_t* dy, const bf16_t* x, const float* rstd, u32 rows, u32 d) { rms_norm_bwd_params_t(dgamma, dy, x, rstd, rows, d); }
extern "C" __global__ void swiglu_bf16(bf16_t* y, const bf16_t* gate, const bf16_t* up, u32 n) { swiglu_t(y, gate, up, n); }
extern "C" __global__ void swiglu_bwd_bf16(bf16_t* dgate, bf16_t* dup, const bf16_t* dy, const bf16_t* gate, const bf16_t* up, u32 n) { swiglu_bwd_t(dgate, dup, dy, gate, up, n); }
extern "C" __global__ void attn_softmax_lse_bf16(bf16_t* p, float* lse, const float* s, u32 rows, u32 t, float scale) { attn_softmax_lse_t(p, lse, s, rows, t, scale); }
extern "C" __global__ void attn_bwd_scores_bf16(bf16_t* p, bf16_t* ds, const float* s, const float* dp, const float* lse, const bf16_t* dout, const bf16_t* out, u32 rows, u32 t, u32 heads, u32 dh, float scale) { attn_bwd_scores_t(p, ds, s, dp, lse, dout, out, rows, t, heads, dh, scale); }
extern "C" __global__ void embedding_f16(f16_t* y, const float* ids, const f16_t* table, u32 tokens, u32 vocab, u32 d, u32* err) { embedding_t(y, ids, table, tokens, vocab, d, err); }
extern "C" __global__ void embedding_bwd_f16(f16_t* dtable, const f16_t* dy, const float* ids, u32 tokens, u32 vocab, u32 d, u32* err) { embedding_bwd_t(dtable, dy, ids, tokens, vocab, d, err); }
extern "C" __global__ void rms_norm_f16(f16_t* y, float* rstd_out, const f16_t* x, const f16_t* gamma, u32 rows, u32 d, float eps) { rms_norm_t(y, rstd_out, x, gamma, rows, d, eps); }
extern "C" __global__ void rms_norm_bwd_f16(f16_t* dx, const f16_t* dy, const f16_t* x, const f16_t* gamma, const float* rstd, u32 rows, u32 d) { rms_norm_bwd_t(dx, dy, x, gamma, rstd, rows, d); }
extern "C" __global__ void rms_norm_bwd_params_f16(f16_t* dgamma, const f16_t* dy, const f16_t* x, const float* rstd, u32 rows, u32 d) { rms_norm_bwd_params_t(dgamma, dy, x, rstd, rows, d); }
extern "C" __global__ void swiglu_f16(f16_t* y, const f16_t* gate, const f16_t* up, u32 n) { swiglu_t(y, gate, up, n); }
extern "C" __global__ void swiglu_bwd_f16(f16_t* dgate, f16_t* dup, const f16_t* dy, const f16_t* gate, const f16_t* up, u32 n) { swiglu_bwd_t(dgate, dup, dy, gate, up, n); }
extern "C" __global__ void attn_softmax_lse_f16(f16_t* p, float* lse, const float* s, u32 rows, u32 t, float scale) { attn_softmax_lse_t(p, lse, s, rows, t, scale); }
extern "C" __global__ void attn_bwd_scores_f16(f16_t* p, f16_t* ds, const float* s, const float* dp, const float* lse, const f16_t* dout, const f16_t* out, u32 rows, u32 t, u32 heads, u32 dh, float scale) { attn_bwd_scores_t(p, ds, s, dp, lse, dout, out, rows, t, heads, dh, scale); }
// The f32 grads of 16-bit parameters (mixed precision): the embedding table, RMSNorm's gamma.
extern "C" __global__ void embedding_bwd_bf16_f32(float* dtable, const bf16_t* dy, const float* ids, u32 tokens, u32 vocab, u32 d, u32* err) { embedding_bwd_t(dtable, dy, ids, tokens, vocab, d, err); }
extern "C" __global__ void rms_norm_bwd_params_bf16_f32(float* dgamma, const bf16_t* dy, const bf16_t* x, const float* rstd, u32 rows, u32 d) { rms_norm_bwd_params_t(dgamma, dy, x, rstd, rows, d); }
extern "C" __global__ void embedding_bwd_f16_f32(float* dtable, const f16_t* dy, const float* ids, u32 tokens, u32 vocab, u32 d, u32* err) { embedding_bwd_t(dtable, dy, ids, tokens, vocab, d, err); }
extern "C" __global__ void rms_norm_bwd_params_f16_f32(float* dgamma, const f16_t* dy, const f16_t* x, const float* rstd, u32 rows, u32 d) { rms_norm_bwd_params_t(dgamma, dy, x, rstd, rows, d); }

// AdamW's learning rate from its step count (state[0], u32 bits, already incremented): linear
// warm-up to `peak` over `warmup` steps, then a cosine down to `floor_lr` at step `total`.
extern "C" __global__ void lr_warmup_cosine_f32(float* lr, const float* state, float peak, float floor_lr, u32 warmup, u32 total) {
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
