// Transformer kernels (#13): token embedding, RMSNorm, SwiGLU, causal softmax. NVRTC compiles
// this file after ops.cu, in one program: u32, u64, gr_tid, gr_stride, block_sum, block_max and
// GR_COL_Y come from there. f32 only; no atomics, every sum in an order fixed by the sizes.

// The row `id` selects, or -1 for a value that is not an integer in 0..vocab.
__device__ __forceinline__ long long token_row(float id, u32 vocab) {
    return (id >= 0.0f && id < (float)vocab && id == floorf(id)) ? (long long)id : -1;
}

// y[t, :] = table[ids[t], :], one block per token (grid-stride). A bad id gives a NaN row.
extern "C" __global__ void embedding_f32(float* y, const float* ids, const float* table, u32 tokens, u32 vocab, u32 d) {
    for (u64 t = blockIdx.x; t < tokens; t += gridDim.x) {
        const long long r = token_row(ids[t], vocab);
        for (u32 j = threadIdx.x; j < d; j += blockDim.x) y[t * d + j] = r < 0 ? __int_as_float(0x7fc00000) : table[(u64)r * d + j];
    }
}

// dtable[v, :] += sum over tokens t with ids[t] == v of dy[t, :]: one block per vocabulary row
// scans every token in order (a sort-free scan; deterministic without atomics).
extern "C" __global__ void embedding_bwd_f32(float* dtable, const float* dy, const float* ids, u32 tokens, u32 vocab, u32 d) {
    for (u64 v = blockIdx.x; v < vocab; v += gridDim.x) {
        for (u32 j = threadIdx.x; j < d; j += blockDim.x) {
            float s = 0.0f;
            for (u64 t = 0; t < tokens; ++t) {
                if (token_row(ids[t], vocab) == (long long)v) s += dy[t * d + j];
            }
            dtable[v * d + j] += s;
        }
    }
}

// y = x * rstd * gamma, rstd = 1 / sqrt(mean(x^2) + eps); one block per row.
extern "C" __global__ void rms_norm_f32(float* y, float* rstd_out, const float* x, const float* gamma, u32 rows, u32 d, float eps) {
    __shared__ float sh[32];
    for (u64 r = blockIdx.x; r < rows; r += gridDim.x) {
        const float* xr = x + r * d;
        float s = 0.0f;
        for (u32 j = threadIdx.x; j < d; j += blockDim.x) s += xr[j] * xr[j];
        const float rstd = 1.0f / sqrtf(block_sum(s, sh) / (float)d + eps);
        for (u32 j = threadIdx.x; j < d; j += blockDim.x) y[r * d + j] = xr[j] * rstd * gamma[j];
        if (threadIdx.x == 0) rstd_out[r] = rstd;
    }
}

// dx = rstd * (g - xhat * mean(g * xhat)), g = dy * gamma, xhat = x * rstd; one block per row.
extern "C" __global__ void rms_norm_bwd_f32(float* dx, const float* dy, const float* x, const float* gamma, const float* rstd, u32 rows, u32 d) {
    __shared__ float sh[32];
    for (u64 r = blockIdx.x; r < rows; r += gridDim.x) {
        const float rs = rstd[r];
        float s = 0.0f;
        for (u32 j = threadIdx.x; j < d; j += blockDim.x) s += dy[r * d + j] * gamma[j] * x[r * d + j] * rs;
        const float m = block_sum(s, sh) / (float)d;
        for (u32 j = threadIdx.x; j < d; j += blockDim.x) {
            const float xh = x[r * d + j] * rs;
            dx[r * d + j] = rs * (dy[r * d + j] * gamma[j] - xh * m);
        }
    }
}

// dgamma[j] += sum_r dy[r, j] * x[r, j] * rstd[r]; (32, GR_COL_Y) column blocks.
extern "C" __global__ void rms_norm_bwd_params_f32(float* dgamma, const float* dy, const float* x, const float* rstd, u32 rows, u32 d) {
    __shared__ float sh[GR_COL_Y][33];
    for (u64 c0 = (u64)blockIdx.x * 32; c0 < d; c0 += (u64)gridDim.x * 32) {
        const u64 c = c0 + threadIdx.x;
        float s = 0.0f;
        if (c < d) {
            for (u64 r = threadIdx.y; r < rows; r += GR_COL_Y) s += dy[r * d + c] * (x[r * d + c] * rstd[r]);
        }
        sh[threadIdx.y][threadIdx.x] = s;
        __syncthreads();
        if (threadIdx.y == 0 && c < d) {
            float t = 0.0f;
            for (int k = 0; k < GR_COL_Y; ++k) t += sh[k][threadIdx.x];
            dgamma[c] += t;
        }
        __syncthreads();
    }
}

__device__ __forceinline__ float sigmoidf(float x) { return 1.0f / (1.0f + expf(-x)); }

// y = silu(gate) * up.
extern "C" __global__ void swiglu_f32(float* y, const float* gate, const float* up, u32 n) {
    for (u64 i = gr_tid(); i < n; i += gr_stride()) y[i] = gate[i] * sigmoidf(gate[i]) * up[i];
}

// dgate = dy * up * s * (1 + g * (1 - s)), dup = dy * g * s, s = sigmoid(g).
extern "C" __global__ void swiglu_bwd_f32(float* dgate, float* dup, const float* dy, const float* gate, const float* up, u32 n) {
    for (u64 i = gr_tid(); i < n; i += gr_stride()) {
        const float g = gate[i];
        const float s = sigmoidf(g);
        dgate[i] = dy[i] * up[i] * s * (1.0f + g * (1.0f - s));
        dup[i] = dy[i] * g * s;
    }
}

// Causal softmax over rows of t scores (rows = batch * t): row r is query position i = r % t;
// y[r, j] = softmax_j(scale * x[r, j]) over j <= i, and 0 for j > i. One block per row.
extern "C" __global__ void causal_softmax_f32(float* y, const float* x, u32 rows, u32 t, float scale) {
    __shared__ float sh[32];
    for (u64 r = blockIdx.x; r < rows; r += gridDim.x) {
        const u32 i = (u32)(r % t);
        const float* xr = x + r * t;
        float m = gr_neg_inf();
        for (u32 j = threadIdx.x; j <= i; j += blockDim.x) m = fmaxf(m, scale * xr[j]);
        m = block_max(m, sh);
        float s = 0.0f;
        for (u32 j = threadIdx.x; j <= i; j += blockDim.x) s += expf(scale * xr[j] - m);
        const float inv = 1.0f / block_sum(s, sh);
        for (u32 j = threadIdx.x; j < t; j += blockDim.x) y[r * t + j] = j <= i ? expf(scale * xr[j] - m) * inv : 0.0f;
    }
}

// dx[r, j] = scale * y[r, j] * (dy[r, j] - sum_k y[r, k] * dy[r, k]); 0 above the diagonal.
extern "C" __global__ void causal_softmax_bwd_f32(float* dx, const float* dy, const float* y, u32 rows, u32 t, float scale) {
    __shared__ float sh[32];
    for (u64 r = blockIdx.x; r < rows; r += gridDim.x) {
        const u32 i = (u32)(r % t);
        float s = 0.0f;
        for (u32 j = threadIdx.x; j <= i; j += blockDim.x) s += y[r * t + j] * dy[r * t + j];
        s = block_sum(s, sh);
        for (u32 j = threadIdx.x; j < t; j += blockDim.x) dx[r * t + j] = j <= i ? scale * y[r * t + j] * (dy[r * t + j] - s) : 0.0f;
    }
}

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
