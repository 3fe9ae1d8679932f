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
