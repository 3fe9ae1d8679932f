// bf16 and f16 kernels (issue #12). NVRTC compiles this file after core.cu and ops.cu, in one
// program: gr_tid, block_sum, gelu_value, philox_uniform and rng_load come from there.
//
// Storage types are plain 16-bit structs (no cuda_fp16.h / cuda_bf16.h needed): every kernel
// loads to f32, computes in f32 and rounds to nearest even on store, exactly as the host
// backend does through the `half` crate, so elementwise results agree bit for bit. Reductions
// accumulate in f32 and write f32.

typedef unsigned short u16;

struct bf16_t { u16 x; };
struct f16_t { u16 x; };

__device__ __forceinline__ float ld(const float* p, u64 i) { return p[i]; }
__device__ __forceinline__ float ld(const bf16_t* p, u64 i) { return __uint_as_float(((u32)p[i].x) << 16); }
__device__ __forceinline__ float ld(const f16_t* p, u64 i) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(p[i].x));
    return f;
}

// Round to nearest even; a NaN keeps its sign and high payload and is made quiet (the `half`
// crate's rule, so NaN bits agree too).
__device__ __forceinline__ u16 f32_to_bf16_bits(float v) {
    const u32 x = __float_as_uint(v);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (u16)((x >> 16) | 0x0040u);
    const u32 round_bit = 0x8000u;
    if ((x & round_bit) != 0u && (x & (3u * round_bit - 1u)) != 0u) return (u16)((x >> 16) + 1u);
    return (u16)(x >> 16);
}

__device__ __forceinline__ void st(float* p, u64 i, float v) { p[i] = v; }
__device__ __forceinline__ void st(bf16_t* p, u64 i, float v) { p[i].x = f32_to_bf16_bits(v); }
__device__ __forceinline__ void st(f16_t* p, u64 i, float v) {
    u16 h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(v));
    p[i].x = h;
}

// ---------------------------------------------------------------- fill and casts

// Both 16-bit dtypes: the host rounds the value and passes its bit pattern.
extern "C" __global__ void fill_u16(u16* y, u32 bits, u32 n) {
    for (u64 i = gr_tid(); i < n; i += gr_stride()) y[i] = (u16)bits;
}

template <typename O, typename I>
__device__ __forceinline__ void cast_t(O* y, const I* x, u32 n) {
    for (u64 i = gr_tid(); i < n; i += gr_stride()) st(y, i, ld(x, i));
}

extern "C" __global__ void cast_f32_bf16(bf16_t* y, const float* x, u32 n) { cast_t(y, x, n); }
extern "C" __global__ void cast_f32_f16(f16_t* y, const float* x, u32 n) { cast_t(y, x, n); }
extern "C" __global__ void cast_bf16_f32(float* y, const bf16_t* x, u32 n) { cast_t(y, x, n); }
extern "C" __global__ void cast_f16_f32(float* y, const f16_t* x, u32 n) { cast_t(y, x, n); }
extern "C" __global__ void cast_bf16_f16(f16_t* y, const bf16_t* x, u32 n) { cast_t(y, x, n); }
extern "C" __global__ void cast_f16_bf16(bf16_t* y, const f16_t* x, u32 n) { cast_t(y, x, n); }

// ---------------------------------------------------------------- elementwise

template <typename T> __device__ __forceinline__ void axpy_t(T* y, const T* x, float a, u32 n) {
    for (u64 i = gr_tid(); i < n; i += gr_stride()) st(y, i, fmaf(a, ld(x, i), ld(y, i)));
}
template <typename T> __device__ __forceinline__ void scale_t(T* y, float a, u32 n) {
    for (u64 i = gr_tid(); i < n; i += gr_stride()) st(y, i, ld(y, i) * a);
}
template <typename T> __device__ __forceinline__ void add_t(T* y, const T* a, const T* b, u32 n) {
    for (u64 i = gr_tid(); i < n; i += gr_stride()) st(y, i, ld(a, i) + ld(b, i));
}
template <typename T> __device__ __forceinline__ void mul_t(T* y, const T* a, const T* b, u32 n) {
    for (u64 i = gr_tid(); i < n; i += gr_stride()) st(y, i, ld(a, i) * ld(b, i));
}
template <typename T> __device__ __forceinline__ void scale_out_t(T* y, const T* x, float a, u32 n) {
    for (u64 i = gr_tid(); i < n; i += gr_stride()) st(y, i, ld(x, i) * a);
}
template <typename T> __device__ __forceinline__ void bias_add_t(T* y, const T* x, const T* b, u32 n, u32 d) {
    for (u64 i = gr_tid(); i < n; i += gr_stride()) st(y, i, ld(x, i) + ld(b, i % d));
}
template <typename T> __device__ __forceinline__ void relu_t(T* y, const T* x, u32 n) {
    for (u64 i = gr_tid(); i < n; i += gr_stride()) {
        const float v = ld(x, i);
        st(y, i, v > 0.0f ? v : 0.0f);
    }
}
template <typename T> __device__ __forceinline__ void relu_bwd_t(T* dx, const T* dy, const T* x, u32 n) {
    for (u64 i = gr_tid(); i < n; i += gr_stride()) st(dx, i, ld(x, i) > 0.0f ? ld(dy, i) : 0.0f);
}
template <typename T> __device__ __forceinline__ void gelu_t(T* y, const T* x, u32 n, u32 approx) {
    for (u64 i = gr_tid(); i < n; i += gr_stride()) st(y, i, gelu_value(ld(x, i), approx));
}
template <typename T> __device__ __forceinline__ void gelu_bwd_t(T* dx, const T* dy, const T* x, u32 n, u32 approx) {
    for (u64 i = gr_tid(); i < n; i += gr_stride()) st(dx, i, ld(dy, i) * gelu_grad(ld(x, i), approx));
}
// As dropout_f32; y is computed from the unrounded scale, the stored mask is rounded.
template <typename T>
__device__ __forceinline__ void dropout_t(T* y, T* mask, const T* x, const u32* state, float p, float scale, u32 n) {
    u64 seed, offset;
    rng_load(state, seed, offset);
    for (u64 i = gr_tid(); i < n; i += gr_stride()) {
        const float m = philox_uniform(seed, offset + i) >= p ? scale : 0.0f;
        st(mask, i, m);
        st(y, i, ld(x, i) * m);
    }
}
template <typename T> __device__ __forceinline__ void mse_bwd_t(T* dp, const T* p, const T* t, float scale, u32 n) {
    for (u64 i = gr_tid(); i < n; i += gr_stride()) st(dp, i, (ld(p, i) - ld(t, i)) * scale);
}

extern "C" __global__ void axpy_bf16(bf16_t* y, const bf16_t* x, float a, u32 n) { axpy_t(y, x, a, n); }
extern "C" __global__ void axpy_f16(f16_t* y, const f16_t* x, float a, u32 n) { axpy_t(y, x, a, n); }
extern "C" __global__ void scale_bf16(bf16_t* y, float a, u32 n) { scale_t(y, a, n); }
extern "C" __global__ void scale_f16(f16_t* y, float a, u32 n) { scale_t(y, a, n); }
extern "C" __global__ void add_bf16(bf16_t* y, const bf16_t* a, const bf16_t* b, u32 n) { add_t(y, a, b, n); }
extern "C" __global__ void add_f16(f16_t* y, const f16_t* a, const f16_t* b, u32 n) { add_t(y, a, b, n); }
extern "C" __global__ void mul_bf16(bf16_t* y, const bf16_t* a, const bf16_t* b, u32 n) { mul_t(y, a, b, n); }
extern "C" __global__ void mul_f16(f16_t* y, const f16_t* a, const f16_t* b, u32 n) { mul_t(y, a, b, n); }
extern "C" __global__ void scale_out_bf16(bf16_t* y, const bf16_t* x, float a, u32 n) { scale_out_t(y, x, a, n); }
extern "C" __global__ void scale_out_f16(f16_t* y, const f16_t* x, float a, u32 n) { scale_out_t(y, x, a, n); }
extern "C" __global__ void bias_add_bf16(bf16_t* y, const bf16_t* x, const bf16_t* b, u32 n, u32 d) { bias_add_t(y, x, b, n, d); }
extern "C" __global__ void bias_add_f16(f16_t* y, const f16_t* x, const f16_t* b, u32 n, u32 d) { bias_add_t(y, x, b, n, d); }
extern "C" __global__ void relu_bf16(bf16_t* y, const bf16_t* x, u32 n) { relu_t(y, x, n); }
extern "C" __global__ void relu_f16(f16_t* y, const f16_t* x, u32 n) { relu_t(y, x, n); }
extern "C" __global__ void relu_bwd_bf16(bf16_t* dx, const bf16_t* dy, const bf16_t* x, u32 n) { relu_bwd_t(dx, dy, x, n); }
extern "C" __global__ void relu_bwd_f16(f16_t* dx, const f16_t* dy, const f16_t* x, u32 n) { relu_bwd_t(dx, dy, x, n); }
extern "C" __global__ void gelu_bf16(bf16_t* y, const bf16_t* x, u32 n, u32 approx) { gelu_t(y, x, n, approx); }
extern "C" __global__ void gelu_f16(f16_t* y, const f16_t* x, u32 n, u32 approx) { gelu_t(y, x, n, approx); }
extern "C" __global__ void gelu_bwd_bf16(bf16_t* dx, const bf16_t* dy, const bf16_t* x, u32 n, u32 approx) { gelu_bwd_t(dx, dy, x, n, approx); }
extern "C" __global__ void gelu_bwd_f16(f16_t* dx, const f16_t* dy, const f16_t* x, u32 n, u32 approx) { gelu_bwd_t(dx, dy, x, n, approx); }
extern "C" __global__ void dropout_bf16(bf16_t* y, bf16_t* mask, const bf16_t* x, const u32* state, float p, float scale, u32 n) { dropout_t(y, mask, x, state, p, scale, n); }
extern "C" __global__ void dropout_f16(f16_t* y, f16_t* mask, const f16_t* x, const u32* state, float p, float scale, u32 n) { dropout_t(y, mask, x, state, p, scale, n); }
extern "C" __global__ void mse_bwd_bf16(bf16_t* dp, const bf16_t* p, const bf16_t* t, float scale, u32 n) { mse_bwd_t(dp, p, t, scale, n); }
extern "C" __global__ void mse_bwd_f16(f16_t* dp, const f16_t* p, const f16_t* t, float scale, u32 n) { mse_bwd_t(dp, p, t, scale, n); }

// ---------------------------------------------------------------- reductions (f32 out)

template <typename T> __device__ __forceinline__ void sum_partial_t(float* partial, const T* x, u32 n) {
    __shared__ float sh[32];
    float s = 0.0f;
    for (u64 i = gr_tid(); i < n; i += gr_stride()) s += ld(x, i);
    s = block_sum(s, sh);
    if (threadIdx.x == 0) partial[blockIdx.x] = s;
}
template <typename T> __device__ __forceinline__ void sqdiff_partial_t(float* partial, const T* a, const T* b, u32 n) {
    __shared__ float sh[32];
    float s = 0.0f;
    for (u64 i = gr_tid(); i < n; i += gr_stride()) {
        const float d = ld(a, i) - ld(b, i);
        s += d * d;
    }
    s = block_sum(s, sh);
    if (threadIdx.x == 0) partial[blockIdx.x] = s;
}
// As col_sum_acc_f32, reading 16-bit rows into an f32 accumulator (the bias grad).
template <typename T> __device__ __forceinline__ void col_sum_acc_t(float* out, const T* a, u32 rows, u32 cols) {
    __shared__ float sh[GR_COL_Y][33];
    for (u64 c0 = (u64)blockIdx.x * 32; c0 < cols; c0 += (u64)gridDim.x * 32) {
        u64 c = c0 + threadIdx.x;
        float s = 0.0f;
        if (c < cols) {
            for (u64 r = threadIdx.y; r < rows; r += GR_COL_Y) s += ld(a, r * cols + c);
        }
        sh[threadIdx.y][threadIdx.x] = s;
        __syncthreads();
        if (threadIdx.y == 0 && c < cols) {
            float t = 0.0f;
            for (int k = 0; k < GR_COL_Y; ++k) t += sh[k][threadIdx.x];
            out[c] += t;
        }
        __syncthreads();
    }
}

extern "C" __global__ void sum_partial_bf16(float* partial, const bf16_t* x, u32 n) { sum_partial_t(partial, x, n); }
extern "C" __global__ void sum_partial_f16(float* partial, const f16_t* x, u32 n) { sum_partial_t(partial, x, n); }
extern "C" __global__ void sqdiff_partial_bf16(float* partial, const bf16_t* a, const bf16_t* b, u32 n) { sqdiff_partial_t(partial, a, b, n); }
extern "C" __global__ void sqdiff_partial_f16(float* partial, const f16_t* a, const f16_t* b, u32 n) { sqdiff_partial_t(partial, a, b, n); }
extern "C" __global__ void col_sum_acc_bf16(float* out, const bf16_t* a, u32 rows, u32 cols) { col_sum_acc_t(out, a, rows, cols); }
extern "C" __global__ void col_sum_acc_f16(float* out, const f16_t* a, u32 rows, u32 cols) { col_sum_acc_t(out, a, rows, cols); }
