// Op kernels (see runtime/ops and runtime/optim/). NVRTC compiles this file after core.cu,
// in one program: philox_uniform and rng_load come from there.
//
// Conventions: f32 only (the elementwise kernels of every dtype, f32 included, are the
// vectorised templates of half.cu); element counts are u32 (checked by the ops) but loop indices are u64,
// so grid-stride loops never wrap; every reduction adds in a fixed order that depends only on
// the launch shape (which depends only on the sizes), never on timing, and no kernel uses
// atomics, so a replayed graph is bitwise equal to the eager run.

typedef unsigned int u32;
typedef unsigned long long u64;

// Rows of the column-reduction blocks (blockDim.y); the ops launch (32, GR_COL_Y) blocks.
#define GR_COL_Y 16

__device__ __forceinline__ u64 gr_tid() { return (u64)blockIdx.x * blockDim.x + threadIdx.x; }
__device__ __forceinline__ u64 gr_stride() { return (u64)gridDim.x * blockDim.x; }
__device__ __forceinline__ float gr_nan() { return __int_as_float(0x7fc00000); }
__device__ __forceinline__ float gr_neg_inf() { return -__int_as_float(0x7f800000); }

// Butterfly sums: every lane ends with the same bits (a + b == b + a).
__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Sum over the block; every thread gets the same total. blockDim.x is a multiple of 32 and at
// most 1024; `sh` is a 32-float shared array. Safe to call repeatedly with the same `sh`.
__device__ float block_sum(float v, float* sh) {
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int nwarps = blockDim.x >> 5;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) sh[warp] = v;
    __syncthreads();
    v = (lane < nwarps) ? sh[lane] : 0.0f;
    return warp_sum(v);
}

// block_sum over twice the block's threads, each thread holding two lanes' values: a (lane t)
// and b (lane t + blockDim.x). The same sums in the same order as block_sum in a block of
// 2 x blockDim.x threads whose thread t holds a and thread t + blockDim.x b, so the same bits.
// At most 512 threads (the lanes' warps fit one warp's lanes).
__device__ float block_sum_lanes2(float a, float b, float* sh) {
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int nwarps = blockDim.x >> 5;
    a = warp_sum(a);
    b = warp_sum(b);
    __syncthreads();
    if (lane == 0) {
        sh[warp] = a;
        sh[warp + nwarps] = b;
    }
    __syncthreads();
    float v = (lane < 2 * nwarps) ? sh[lane] : 0.0f;
    return warp_sum(v);
}

__device__ float block_max(float v, float* sh) {
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int nwarps = blockDim.x >> 5;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) sh[warp] = v;
    __syncthreads();
    v = (lane < nwarps) ? sh[lane] : gr_neg_inf();
    return warp_max(v);
}

// ---------------------------------------------------------------- elementwise

#define GR_SQRT_2_OVER_PI 0.7978845608028654f
#define GR_GELU_C 0.044715f
#define GR_INV_SQRT_2 0.7071067811865476f
#define GR_INV_SQRT_2PI 0.3989422804014327f
// log2(e), log2(e) / 2, log2(sqrt(2 pi)); 2u log2(e) = x (A + B x^2) for the tanh form's u.
#define GR_LOG2E 1.4426950408889634f
#define GR_HALF_LOG2E 0.7213475204444817f
#define GR_LOG2_SQRT_2PI 1.3257480647361593f
#define GR_GELU_TANH_A (2.0f * GR_SQRT_2_OVER_PI * GR_LOG2E)
#define GR_GELU_TANH_B (GR_GELU_TANH_A * GR_GELU_C)

// approx: 0 = exact (erf), 1 = tanh approximation.
__device__ __forceinline__ float gelu_value(float x, u32 approx) {
    if (approx != 0u) {
        float u = GR_SQRT_2_OVER_PI * (x + GR_GELU_C * x * x * x);
        return 0.5f * x * (1.0f + tanhf(u));
    }
    return 0.5f * x * (1.0f + erff(x * GR_INV_SQRT_2));
}

__device__ __forceinline__ float gelu_grad(float x, u32 approx) {
    if (approx != 0u) {
        float x2 = x * x;
        float t = tanhf(GR_SQRT_2_OVER_PI * (x + GR_GELU_C * x2 * x));
        return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * GR_SQRT_2_OVER_PI * (1.0f + 3.0f * GR_GELU_C * x2);
    }
    float cdf = 0.5f * (1.0f + erff(x * GR_INV_SQRT_2));
    float pdf = expf(-0.5f * x * x) * GR_INV_SQRT_2PI;
    return cdf + x * pdf;
}

// GELU for 16-bit storage (bf16, f16), where the f32 forms above are compute-bound: erff's two
// branches run as one with selects and tanhf carries a polynomial besides its exponential, about
// 30 instructions an element, so bf16 GELU ran at 1.60x its bandwidth floor on the H200. These
// forms take about half: an exponential and a reciprocal on the SFU (ex2.approx, rcp.approx,
// relative error near 2^-22) and a few FMAs. Their result is rounded to 8 or 11 bits, so
// their f32 error (a few units in the last place) moves a stored value only where the exact one
// lies within that much of a rounding boundary. The f32 kernels keep the forms above.
__device__ __forceinline__ float gr_ex2(float v) {
    float r;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(v));
    return r;
}
__device__ __forceinline__ float gr_rcp(float v) {
    float r;
    asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(v));
    return r;
}

// The standard normal tail Q(|x|) = 1 - Φ(|x|), given m = x * x, as t · 2^(p(t) - m · log2(e)/2)
// with t = 1 / (1 + 0.4 |x|): p is a degree-8 polynomial fitted in f32 to log2(Q / t) + m ·
// log2(e)/2 over |x| <= 14 (scripts/fit-gelu.py; relative error 1.5e-7 before the SFU's). It
// keeps relative accuracy far into the tail, where 1 + erf(x) in f32 cancels to nothing: GELU of
// a large negative x is x · Q, a value bf16 can hold down to x = -13.
__device__ __forceinline__ float gr_normal_tail(float x, float m) {
    const float t = gr_rcp(fmaf(0.4f, fabsf(x), 1.0f));
    float p = 2.739437819e-01f;
    p = fmaf(p, t, -1.402859211e+00f);
    p = fmaf(p, t, 2.801246166e+00f);
    p = fmaf(p, t, -2.515251160e+00f);
    p = fmaf(p, t, 7.742679119e-01f);
    p = fmaf(p, t, -2.584778368e-01f);
    p = fmaf(p, t, 5.360431671e-01f);
    p = fmaf(p, t, 1.438610077e+00f);
    p = fmaf(p, t, -2.647522688e+00f);
    return t * gr_ex2(fmaf(m, -GR_HALF_LOG2E, p));
}

// Φ(x), the normal CDF, from the tail (m = x * x).
__device__ __forceinline__ float gr_normal_cdf(float x, float m) {
    const float q = gr_normal_tail(x, m);
    return x >= 0.0f ? 1.0f - q : q;
}

// gelu_value for 16-bit storage: x · Φ(x), or with approx, 0.5 x (1 + tanh(u)) written as
// x · σ(2u) = x / (1 + 2^(-2u log2(e))), which neither cancels nor overflows (x / inf = -0).
__device__ __forceinline__ float gelu16_value(float x, u32 approx) {
    const float m = x * x;
    if (approx != 0u) return x * gr_rcp(1.0f + gr_ex2(-x * fmaf(m, GR_GELU_TANH_B, GR_GELU_TANH_A)));
    return x * gr_normal_cdf(x, m);
}

// gelu_grad for 16-bit storage: Φ(x) + x φ(x); with approx, s + x s (1 - s) 2u', where
// s = σ(2u).
__device__ __forceinline__ float gelu16_grad(float x, u32 approx) {
    const float m = x * x;
    if (approx != 0u) {
        const float e = gr_ex2(-x * fmaf(m, GR_GELU_TANH_B, GR_GELU_TANH_A));
        const float s = gr_rcp(1.0f + e);
        // 2u' at min(x^2, 1e4): past |x| = 100 the term it scales is 0 (s is 0 or 1), and an
        // infinite 2u' would make it NaN.
        const float du = fmaf(fminf(m, 1e4f), 6.0f * GR_GELU_C * GR_SQRT_2_OVER_PI, 2.0f * GR_SQRT_2_OVER_PI);
        return fmaf(x * s * (1.0f - s), du, s);
    }
    const float pdf = gr_ex2(fmaf(m, -GR_HALF_LOG2E, -GR_LOG2_SQRT_2PI));
    return fmaf(x, pdf, gr_normal_cdf(x, m));
}

// The GELU forms a kernel of storage type T computes with: f32 keeps erff and tanhf.
template <typename T> __device__ __forceinline__ float gelu_of(float x, u32 approx) {
    return sizeof(T) == 4 ? gelu_value(x, approx) : gelu16_value(x, approx);
}
template <typename T> __device__ __forceinline__ float gelu_grad_of(float x, u32 approx) {
    return sizeof(T) == 4 ? gelu_grad(x, approx) : gelu16_grad(x, approx);
}

// ---------------------------------------------------------------- reductions

// Per-block partial sums (sum_partial_f32, sqdiff_partial_f32 of (a - b)^2) are the float
// instantiations of the templates in half.cu; sum_final_f32 adds the partials.

// out[0] = scale * sum(partial[0..m]); launched with one block.
extern "C" __global__ void sum_final_f32(float* out, const float* partial, u32 m, float scale) {
    GR_PDL_ENTRY();
    __shared__ float sh[32];
    float s = 0.0f;
    for (u32 i = threadIdx.x; i < m; i += blockDim.x) s += partial[i];
    s = block_sum(s, sh);
    if (threadIdx.x == 0) out[0] = s * scale;
}

// out[c] += sum over rows of a[r, c] (col_sum_acc_f32): the float instantiation of
// col_sum_acc_t in half.cu.

// ---------------------------------------------------------------- layer norm

// The f32 layer norm kernels are the float instantiations of the templates in half.cu.

// ---------------------------------------------------------------- losses

// A label is valid when it is an integer in [0, c); NaN fails every comparison.
__device__ __forceinline__ bool label_ok(float l, u32 c) {
    return l >= 0.0f && l < (float)c && l == floorf(l);
}

// The label of a row the loss ignores (padding): PyTorch's default ignore_index.
#define IGNORE_LABEL (-100.0f)

// Per-block partial counts of the rows the loss does not ignore.
extern "C" __global__ void count_labels_partial_f32(float* partial, const float* labels, u32 n) {
    GR_PDL_ENTRY();
    __shared__ float sh[32];
    float s = 0.0f;
    for (u64 i = gr_tid(); i < n; i += gr_stride()) s += labels[i] != IGNORE_LABEL ? 1.0f : 0.0f;
    s = block_sum(s, sh);
    if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

// The mean loss over the rows not ignored: the partial sums' total times 1/count, rounded as
// the host rounds 1/rows (so a batch with nothing ignored gives the plain mean bit for bit);
// 0 when every row is ignored.
extern "C" __global__ void mean_final_f32(float* out, const float* partial, const float* partial_count, u32 m) {
    GR_PDL_ENTRY();
    __shared__ float sh[32];
    float s = 0.0f, n = 0.0f;
    for (u32 i = threadIdx.x; i < m; i += blockDim.x) s += partial[i];
    s = block_sum(s, sh);
    for (u32 i = threadIdx.x; i < m; i += blockDim.x) n += partial_count[i];
    n = block_sum(n, sh);
    if (threadIdx.x == 0) out[0] = n > 0.0f ? s * __fdiv_rn(1.0f, n) : 0.0f;
}

// The mean loss over the rows not ignored in one launch of one block, for batches of at most
// XENT_ONE_BLOCK_ROWS rows (ops/loss.rs; the partial-sum kernels above take larger ones): each
// thread adds its rows (i = threadIdx.x mod blockDim.x) in order, then the block adds its
// threads', an order fixed by n. Rounded as mean_final_f32 rounds. With row_loss null, out[0]
// is the count of rows not ignored (the backward's divisor). A thread's loads go out eight
// rows at a time before it adds them (the same order): one round trip to memory for every
// 8 x blockDim.x rows instead of one a row.
extern "C" __global__ void xent_mean_f32(float* out, const float* row_loss, const float* labels, u32 n) {
    GR_PDL_ENTRY();
    __shared__ float sh[32];
    constexpr u32 U = 8;
    const bool has_loss = row_loss != nullptr;
    float s = 0.0f, c = 0.0f;
    u32 i = threadIdx.x;
    for (; i + (U - 1) * blockDim.x < n; i += U * blockDim.x) {
        float lv[U], lb[U];
#pragma unroll
        for (u32 k = 0; k < U; ++k) {
            lb[k] = labels[i + k * blockDim.x];
            lv[k] = has_loss ? row_loss[i + k * blockDim.x] : 0.0f;
        }
#pragma unroll
        for (u32 k = 0; k < U; ++k) {
            if (has_loss) s += lv[k];
            c += lb[k] != IGNORE_LABEL ? 1.0f : 0.0f;
        }
    }
    for (; i < n; i += blockDim.x) {
        if (has_loss) s += row_loss[i];
        c += labels[i] != IGNORE_LABEL ? 1.0f : 0.0f;
    }
    c = block_sum(c, sh);
    if (row_loss == nullptr) {
        if (threadIdx.x == 0) out[0] = c;
        return;
    }
    s = block_sum(s, sh);
    if (threadIdx.x == 0) out[0] = c > 0.0f ? s * __fdiv_rn(1.0f, c) : 0.0f;
}

// The f32 softmax cross-entropy kernels are the float instantiations of the templates in
// half.cu (one block per row: probs = softmax(logits), row_loss = logsumexp - logit[label], NaN
// for a label that is not a class id; dlogits = (probs - onehot(label)) * scale).

// ---------------------------------------------------------------- optimizers

// SGD (PyTorch semantics, dampening 0): g += wd * p; buf = momentum * buf + g; p -= lr * buf.
// lr is read from device memory so a captured step follows a changing schedule. buf is unused
// (may be null) when use_momentum is 0.
// One SGD element update, shared with the mixed-precision kernel of mixed.cu: the new value of
// parameter element i, whose grad is gi; buf[i] is read and written only with momentum.
__device__ __forceinline__ float sgd_elem(float p, float gi, float* buf, u64 i, float rate, float momentum, float wd, u32 use_momentum) {
    gi = gi + wd * p;
    if (use_momentum != 0u) {
        gi = momentum * buf[i] + gi;
        buf[i] = gi;
    }
    return p - rate * gi;
}
extern "C" __global__ void sgd_step_f32(float* p, const float* g, float* buf, const float* lr, float momentum, float wd, u32 use_momentum, u32 n) {
    GR_PDL_ENTRY();
    const float rate = lr[0];
    for (u64 i = gr_tid(); i < n; i += gr_stride()) p[i] = sgd_elem(p[i], g[i], buf, i, rate, momentum, wd, use_momentum);
}

// AdamW's per-step scalars: st[0] holds the step count as u32 bits; increments it and stores
// the bias corrections st[1] = 1 - beta1^t and st[2] = 1 - beta2^t.
extern "C" __global__ void adamw_prepare_f32(float* st, float beta1, float beta2) {
    GR_PDL_ENTRY();
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        const u32 t = __float_as_uint(st[0]) + 1u;
        st[0] = __uint_as_float(t);
        st[1] = 1.0f - powf(beta1, (float)t);
        st[2] = 1.0f - powf(beta2, (float)t);
    }
}

// AdamW (PyTorch semantics): p *= 1 - lr * wd; m, v moments; p -= lr / bc1 * m / (sqrt(v) /
// sqrt(bc2) + eps).
// One AdamW element update (shared with the mixed-precision kernels of mixed.cu); returns the
// new parameter and updates the moments in place.
// Every operation rounded on its own (no FMA contraction, which NVRTC would decide per call
// site): the per-parameter and multi-tensor kernels give the same bits, and so does the CPU
// reference's f32 arithmetic for the same step size and bias corrections.
__device__ __forceinline__ float adamw_elem(float p, float g, float* m, float* v, float step_size, float bc2_sqrt, float decay, float beta1, float beta2, float eps) {
    const float mi = __fadd_rn(__fmul_rn(beta1, *m), __fmul_rn(__fsub_rn(1.0f, beta1), g));
    const float vi = __fadd_rn(__fmul_rn(beta2, *v), __fmul_rn(__fmul_rn(__fsub_rn(1.0f, beta2), g), g));
    *m = mi;
    *v = vi;
    const float denom = __fadd_rn(__fdiv_rn(sqrtf(vi), bc2_sqrt), eps);
    return __fsub_rn(__fmul_rn(p, decay), __fmul_rn(step_size, __fdiv_rn(mi, denom)));
}

// zero_g != 0 also zeroes each grad once read (optimizer.step_and_zero_grad: no fill launches).
extern "C" __global__ void adamw_step_f32(float* p, float* g, float* m, float* v, const float* lr, const float* st, float beta1, float beta2, float eps, float wd, u32 zero_g, u32 n) {
    GR_PDL_ENTRY();
    const float rate = lr[0];
    const float step_size = rate / st[1];
    const float bc2_sqrt = sqrtf(st[2]);
    const float decay = __fsub_rn(1.0f, __fmul_rn(rate, wd));
    for (u64 i = gr_tid(); i < n; i += gr_stride()) {
        p[i] = adamw_elem(p[i], g[i], &m[i], &v[i], step_size, bc2_sqrt, decay, beta1, beta2, eps);
        if (zero_g != 0u) g[i] = 0.0f;
    }
}
