// The elementwise kernels of every dtype (f32, bf16, f16; issue #12), vectorised, and the bf16
// and f16 variants of the reductions. NVRTC compiles this file after core.cu and ops.cu, in one
// program: gr_tid, block_sum, gelu_value, philox_uniform and rng_load come from there.
//
// Storage types are plain 16-bit structs (no cuda_fp16.h / cuda_bf16.h needed): every kernel
// loads to f32, computes in f32 and rounds to nearest even on store, exactly as the host
// backend does through the `half` crate, so elementwise results agree bit for bit (but for
// the transcendentals: GELU's 16-bit form, gelu16_value in ops.cu, is within one rounding step
// of the host's). Reductions accumulate in f32 and write f32.

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
// crate's rule, so NaN bits agree too). From sm_80 on the hardware conversion rounds every
// other value (subnormals kept: no .ftz), the same bits in one instruction.
__device__ __forceinline__ u16 f32_to_bf16_bits(float v) {
    const u32 x = __float_as_uint(v);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (u16)((x >> 16) | 0x0040u);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    u16 h;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(v));
    return h;
#else
    const u32 round_bit = 0x8000u;
    if ((x & round_bit) != 0u && (x & (3u * round_bit - 1u)) != 0u) return (u16)((x >> 16) + 1u);
    return (u16)(x >> 16);
#endif
}

__device__ __forceinline__ void st(float* p, u64 i, float v) { p[i] = v; }
__device__ __forceinline__ void st(bf16_t* p, u64 i, float v) { p[i].x = f32_to_bf16_bits(v); }
__device__ __forceinline__ void st(f16_t* p, u64 i, float v) {
    u16 h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(v));
    p[i].x = h;
}

// ---------------------------------------------------------------- vectorised maps
//
// Memory-bound kernels move 16 bytes per load and store (4 floats or 8 16-bit values) when
// every pointer is 16-byte aligned (pool blocks are 256-byte aligned, so they always are),
// then finish the tail element by element. The ops launch one thread per 16 bytes
// (LaunchDims::vectorized); the loops are grid-stride, so any grid is correct. Element i gets
// exactly the math of the scalar loop, so results do not depend on the path taken.

template <typename T> union Pack { uint4 raw; T e[16 / sizeof(T)]; };

__device__ __forceinline__ bool al16(const void* p) { return ((u64)p & 15) == 0; }

// Two bf16 bits of (lo, hi) in one word: one packed conversion from sm_80 on (the conversion
// pipe runs a quarter as fast as the FP32 one, so this halves a 16-bit kernel's conversions),
// the same bits as f32_to_bf16_bits of each (a NaN takes the per-value path: its rule differs
// from the hardware's).
__device__ __forceinline__ u32 bf16x2_bits(float lo, float hi) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    if (lo == lo && hi == hi) {
        u32 r;
        asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
        return r;
    }
#endif
    return (u32)f32_to_bf16_bits(lo) | ((u32)f32_to_bf16_bits(hi) << 16);
}

// p.e[k] = v[k] rounded to T, every k: what st(p.e, k, v[k]) stores, bf16 two values a
// conversion.
template <typename T, u32 N> __device__ __forceinline__ void st_all(T (&e)[N], const float (&v)[N]) {
#pragma unroll
    for (u32 k = 0; k < N; ++k) st(e, k, v[k]);
}
template <u32 N> __device__ __forceinline__ void st_all(bf16_t (&e)[N], const float (&v)[N]) {
    static_assert(N % 2 == 0, "whole pairs");
#pragma unroll
    for (u32 k = 0; k < N; k += 2) {
        const u32 b = bf16x2_bits(v[k], v[k + 1]);
        e[k].x = (u16)b;
        e[k + 1].x = (u16)(b >> 16);
    }
}

// y from x, 16 bytes at a time: group(v, px, py) fills y's v-th 16-byte group from x's; the
// tail element by element, y[i] = one(i, x[i]).
template <typename T, typename G, typename F>
__device__ __forceinline__ void map1_groups(T* y, const T* x, u32 n, G group, F one) {
    constexpr u32 W = 16 / sizeof(T);
    u64 done = 0;
    if (al16(y) && al16(x)) {
        const u64 nv = n / W;
        for (u64 v = gr_tid(); v < nv; v += gr_stride()) {
            Pack<T> px, py;
            px.raw = reinterpret_cast<const uint4*>(x)[v];
            group(v, px, py);
            reinterpret_cast<uint4*>(y)[v] = py.raw;
        }
        done = nv * W;
    }
    for (u64 i = done + gr_tid(); i < n; i += gr_stride()) st(y, i, one(i, ld(x, i)));
}

// y[i] = f(i, x[i]).
template <typename T, typename F> __device__ __forceinline__ void map1(T* y, const T* x, u32 n, F f) {
    constexpr u32 W = 16 / sizeof(T);
    map1_groups(y, x, n, [=](u64 v, const Pack<T>& px, Pack<T>& py) {
        float o[W];
#pragma unroll
        for (u32 k = 0; k < W; ++k) o[k] = f(v * W + k, ld(px.e, k));
        st_all(py.e, o);
    }, f);
}

// y[i] = f(i, a[i], b[i]); y may be a or b (in place).
template <typename T, typename F> __device__ __forceinline__ void map2(T* y, const T* a, const T* b, u32 n, F f) {
    constexpr u32 W = 16 / sizeof(T);
    u64 done = 0;
    if (al16(y) && al16(a) && al16(b)) {
        const u64 nv = n / W;
        for (u64 v = gr_tid(); v < nv; v += gr_stride()) {
            Pack<T> pa, pb, py;
            pa.raw = reinterpret_cast<const uint4*>(a)[v];
            pb.raw = reinterpret_cast<const uint4*>(b)[v];
            float o[W];
#pragma unroll
            for (u32 k = 0; k < W; ++k) o[k] = f(v * W + k, ld(pa.e, k), ld(pb.e, k));
            st_all(py.e, o);
            reinterpret_cast<uint4*>(y)[v] = py.raw;
        }
        done = nv * W;
    }
    for (u64 i = done + gr_tid(); i < n; i += gr_stride()) st(y, i, f(i, ld(a, i), ld(b, i)));
}

// ---------------------------------------------------------------- fill and casts

// Store-only: one 16-byte pattern of v repeated.
template <typename T> __device__ __forceinline__ void fill_t(T* y, float v, u32 n) {
    constexpr u32 W = 16 / sizeof(T);
    u64 done = 0;
    if (al16(y)) {
        Pack<T> p;
#pragma unroll
        for (u32 k = 0; k < W; ++k) st(p.e, k, v);
        const u64 nv = n / W;
        for (u64 i = gr_tid(); i < nv; i += gr_stride()) reinterpret_cast<uint4*>(y)[i] = p.raw;
        done = nv * W;
    }
    for (u64 i = done + gr_tid(); i < n; i += gr_stride()) st(y, i, v);
}

extern "C" __global__ void fill_f32(float* y, float v, u32 n) { GR_PDL_ENTRY(); fill_t(y, v, n); }

// Both 16-bit dtypes: the host rounds the value and passes its bit pattern, which a bf16 store
// of the f32 with those high bits reproduces exactly (only the pattern is stored, so this holds
// for f16 patterns too).
extern "C" __global__ void fill_u16(u16* y, u32 bits, u32 n) {
    GR_PDL_ENTRY();
    fill_t(reinterpret_cast<bf16_t*>(y), __uint_as_float(bits << 16), n);
}

// Two axes of an [outer, len1, mid, len2, inner] tensor resized (one axis: mid = len2 = 1): the
// positions below both source lengths copied, the rest of dst set to the bit pattern `pad`.
// Pads a call's inputs into a shape bucket's static buffers and trims the bucket's outputs
// back to the real size.
template <typename T>
__device__ __forceinline__ void resize_axes_t(T* dst, const T* src, u32 outer, u32 dl1, u32 sl1, u32 mid, u32 dl2,
                                              u32 sl2, u32 inner, T pad) {
    const u64 n = (u64)outer * dl1 * mid * dl2 * inner;
    for (u64 i = gr_tid(); i < n; i += gr_stride()) {
        u64 q = i;
        const u64 k = q % inner;
        q /= inner;
        const u64 j2 = q % dl2;
        q /= dl2;
        const u64 m = q % mid;
        q /= mid;
        const u64 j1 = q % dl1;
        const u64 o = q / dl1;
        dst[i] = (j1 < sl1 && j2 < sl2) ? src[(((o * sl1 + j1) * mid + m) * sl2 + j2) * inner + k] : pad;
    }
}

extern "C" __global__ void resize_axes_u32(u32* dst, const u32* src, u32 outer, u32 dl1, u32 sl1, u32 mid, u32 dl2,
                                           u32 sl2, u32 inner, u32 pad) {
    GR_PDL_ENTRY();
    resize_axes_t(dst, src, outer, dl1, sl1, mid, dl2, sl2, inner, pad);
}

// dst[r * dld + c] = src[r * sld + c] for r < rows, c < cols: one column block of a row-major
// tensor copied to or from a tensor of its own (ops::split_columns, ops::concat_columns; the
// host moves the pointers to the block's first column).
template <typename T>
__device__ __forceinline__ void copy_cols_t(T* dst, const T* src, u32 rows, u32 cols, u32 dld, u32 sld) {
    const u64 n = (u64)rows * cols;
    for (u64 i = gr_tid(); i < n; i += gr_stride()) {
        const u64 r = i / cols, c = i % cols;
        dst[r * dld + c] = src[r * sld + c];
    }
}

extern "C" __global__ void copy_cols_u32(u32* dst, const u32* src, u32 rows, u32 cols, u32 dld, u32 sld) {
    GR_PDL_ENTRY();
    copy_cols_t(dst, src, rows, cols, dld, sld);
}

extern "C" __global__ void copy_cols_u16(u16* dst, const u16* src, u32 rows, u32 cols, u32 dld, u32 sld) {
    GR_PDL_ENTRY();
    copy_cols_t(dst, src, rows, cols, dld, sld);
}

extern "C" __global__ void resize_axes_u16(u16* dst, const u16* src, u32 outer, u32 dl1, u32 sl1, u32 mid, u32 dl2,
                                           u32 sl2, u32 inner, u32 pad) {
    GR_PDL_ENTRY();
    resize_axes_t(dst, src, outer, dl1, sl1, mid, dl2, sl2, inner, (u16)pad);
}

// 8 elements per thread and iteration: 16 or 32 bytes each side, in whole uint4s.
template <typename T> union Pack8 { uint4 raw[8 * sizeof(T) / 16]; T e[8]; };

template <typename O, typename I>
__device__ __forceinline__ void cast_t(O* y, const I* x, u32 n) {
    u64 done = 0;
    if (al16(y) && al16(x)) {
        const u64 nv = n / 8;
        for (u64 v = gr_tid(); v < nv; v += gr_stride()) {
            Pack8<I> pi;
            Pack8<O> po;
#pragma unroll
            for (u32 r = 0; r < 8 * sizeof(I) / 16; ++r) pi.raw[r] = reinterpret_cast<const uint4*>(x + v * 8)[r];
#pragma unroll
            for (u32 k = 0; k < 8; ++k) st(po.e, k, ld(pi.e, k));
#pragma unroll
            for (u32 r = 0; r < 8 * sizeof(O) / 16; ++r) reinterpret_cast<uint4*>(y + v * 8)[r] = po.raw[r];
        }
        done = nv * 8;
    }
    for (u64 i = done + gr_tid(); i < n; i += gr_stride()) st(y, i, ld(x, i));
}

extern "C" __global__ void cast_f32_bf16(bf16_t* y, const float* x, u32 n) { GR_PDL_ENTRY(); cast_t(y, x, n); }
extern "C" __global__ void cast_f32_f16(f16_t* y, const float* x, u32 n) { GR_PDL_ENTRY(); cast_t(y, x, n); }
extern "C" __global__ void cast_bf16_f32(float* y, const bf16_t* x, u32 n) { GR_PDL_ENTRY(); cast_t(y, x, n); }
extern "C" __global__ void cast_f16_f32(float* y, const f16_t* x, u32 n) { GR_PDL_ENTRY(); cast_t(y, x, n); }
extern "C" __global__ void cast_bf16_f16(f16_t* y, const bf16_t* x, u32 n) { GR_PDL_ENTRY(); cast_t(y, x, n); }
extern "C" __global__ void cast_f16_bf16(bf16_t* y, const f16_t* x, u32 n) { GR_PDL_ENTRY(); cast_t(y, x, n); }

// ---------------------------------------------------------------- elementwise

// y = a * x + y
template <typename T> __device__ __forceinline__ void axpy_t(T* y, const T* x, float a, u32 n) {
    map2(y, x, y, n, [=](u64, float xv, float yv) { return fmaf(a, xv, yv); });
}
template <typename T> __device__ __forceinline__ void scale_t(T* y, float a, u32 n) {
    map1(y, y, n, [=](u64, float v) { return v * a; });
}
template <typename T> __device__ __forceinline__ void add_t(T* y, const T* a, const T* b, u32 n) {
    map2(y, a, b, n, [](u64, float u, float v) { return u + v; });
}
template <typename T> __device__ __forceinline__ void mul_t(T* y, const T* a, const T* b, u32 n) {
    map2(y, a, b, n, [](u64, float u, float v) { return u * v; });
}
template <typename T> __device__ __forceinline__ void scale_out_t(T* y, const T* x, float a, u32 n) {
    map1(y, x, n, [=](u64, float v) { return v * a; });
}
// y[r, j] = x[r, j] + b[j] over n = rows * d elements; y may be x (in place). The column is
// found once per 16 bytes and then stepped (a division per element made the 16-bit kernels
// compute-bound: 1.9x their bandwidth floor).
template <typename T> __device__ __forceinline__ void bias_add_t(T* y, const T* x, const T* b, u32 n, u32 d) {
    constexpr u32 W = 16 / sizeof(T);
    const bool whole = d % W == 0 && al16(b);  // a group's bias is one 16-byte load
    map1_groups(y, x, n, [=](u64 v, const Pack<T>& px, Pack<T>& py) {
        u32 j = (u32)((v * W) % d);
        if (whole) {
            Pack<T> pb;
            pb.raw = reinterpret_cast<const uint4*>(b + j)[0];
#pragma unroll
            for (u32 k = 0; k < W; ++k) st(py.e, k, ld(px.e, k) + ld(pb.e, k));
            return;
        }
#pragma unroll
        for (u32 k = 0; k < W; ++k) {
            st(py.e, k, ld(px.e, k) + ld(b, j));
            j = (j + 1 == d) ? 0 : j + 1;
        }
    }, [=](u64 i, float v) { return v + ld(b, i % d); });
}
template <typename T> __device__ __forceinline__ void relu_t(T* y, const T* x, u32 n) {
    map1(y, x, n, [](u64, float v) { return v > 0.0f ? v : 0.0f; });
}
template <typename T> __device__ __forceinline__ void relu_bwd_t(T* dx, const T* dy, const T* x, u32 n) {
    map2(dx, dy, x, n, [](u64, float g, float v) { return v > 0.0f ? g : 0.0f; });
}
template <typename T> __device__ __forceinline__ void gelu_t(T* y, const T* x, u32 n, u32 approx) {
    map1(y, x, n, [=](u64, float v) { return gelu_of<T>(v, approx); });
}
template <typename T> __device__ __forceinline__ void gelu_bwd_t(T* dx, const T* dy, const T* x, u32 n, u32 approx) {
    map2(dx, dy, x, n, [=](u64, float g, float v) { return g * gelu_grad_of<T>(v, approx); });
}
// dpred = (pred - target) * scale, scale = 2 * dloss / n.
template <typename T> __device__ __forceinline__ void mse_bwd_t(T* dp, const T* p, const T* t, float scale, u32 n) {
    map2(dp, p, t, n, [=](u64, float u, float v) { return (u - v) * scale; });
}
// Dropout with the generator state read through a pointer (graph-safe): element i keeps its
// value, times `scale` = 1 / (1 - p), when uniform(seed, offset + i) >= p; y is computed from
// the unrounded scale, the stored mask is rounded to T. The op launches rng_advance(state, n)
// right after. Vectorised like map1, with two outputs; the uniforms come a Philox block (four
// counters) at a time, so a thread's 16 bytes cost W / 4 Philox calls when offset % 4 == 0 (S)
// and one more otherwise (S is the same for every thread: one instantiation per value).
__device__ __forceinline__ float dropout_keep(float u, float p, float scale) { return u >= p ? scale : 0.0f; }

// uniform >= p on the raw word, without the conversion: philox_unit(w) = (w >> 8) * 2^-24 is
// exact, so it is >= p exactly when w >> 8 >= ceil(p * 2^24), that is when w >= thr =
// ceil(p * 2^24) << 8 (p * 2^24 is exact; p < 1 keeps thr below 2^32). The same decisions, bit
// for bit, at an integer compare each (the conversion pipe runs a quarter as fast).
__device__ __forceinline__ u32 dropout_threshold(float p) {
    return p <= 0.0f ? 0u : ((u32)ceilf(p * 16777216.0f)) << 8;
}

template <typename T, u32 S>
__device__ __forceinline__ void dropout_vec(T* y, T* mask, const T* x, u64 seed, u64 offset, float p, float scale, u64 nv) {
    constexpr u32 W = 16 / sizeof(T);
    constexpr u32 NB = (S + W + 3) / 4;
    const u32 thr = dropout_threshold(p);
    // The two mask values as T, rounded once.
    T keep_bits[1], drop_bits[1];
    st(keep_bits, 0, scale);
    st(drop_bits, 0, 0.0f);
    for (u64 v = gr_tid(); v < nv; v += gr_stride()) {
        // Element v * W + k has counter offset + v * W + k: word (S + k) % 4 of block b0 + (S + k) / 4.
        const u64 b0 = (offset + v * W) >> 2;
        u32 w[NB * 4];
#pragma unroll
        for (u32 j = 0; j < NB; ++j) {
            const uint4 b = philox4(seed, b0 + j);
            w[4 * j] = b.x;
            w[4 * j + 1] = b.y;
            w[4 * j + 2] = b.z;
            w[4 * j + 3] = b.w;
        }
        Pack<T> px, py, pm;
        px.raw = reinterpret_cast<const uint4*>(x)[v];
        float o[W];
#pragma unroll
        for (u32 k = 0; k < W; ++k) {
            const bool kept = w[S + k] >= thr;
            pm.e[k] = kept ? keep_bits[0] : drop_bits[0];
            o[k] = ld(px.e, k) * (kept ? scale : 0.0f);
        }
        st_all(py.e, o);
        reinterpret_cast<uint4*>(mask)[v] = pm.raw;
        reinterpret_cast<uint4*>(y)[v] = py.raw;
    }
}

template <typename T>
__device__ __forceinline__ void dropout_t(T* y, T* mask, const T* x, const u32* state, float p, float scale, u32 n) {
    constexpr u32 W = 16 / sizeof(T);
    u64 seed, offset;
    rng_load(state, seed, offset);
    u64 done = 0;
    if (al16(y) && al16(mask) && al16(x)) {
        const u64 nv = n / W;
        switch ((u32)(offset & 3)) {
        case 0: dropout_vec<T, 0>(y, mask, x, seed, offset, p, scale, nv); break;
        case 1: dropout_vec<T, 1>(y, mask, x, seed, offset, p, scale, nv); break;
        case 2: dropout_vec<T, 2>(y, mask, x, seed, offset, p, scale, nv); break;
        default: dropout_vec<T, 3>(y, mask, x, seed, offset, p, scale, nv); break;
        }
        done = nv * W;
    }
    for (u64 i = done + gr_tid(); i < n; i += gr_stride()) {
        const float m = dropout_keep(philox_uniform(seed, offset + i), p, scale);
        st(mask, i, m);
        st(y, i, ld(x, i) * m);
    }
}

extern "C" __global__ void axpy_f32(float* y, const float* x, float a, u32 n) { GR_PDL_ENTRY(); axpy_t(y, x, a, n); }
extern "C" __global__ void scale_f32(float* y, float a, u32 n) { GR_PDL_ENTRY(); scale_t(y, a, n); }
extern "C" __global__ void add_f32(float* y, const float* a, const float* b, u32 n) { GR_PDL_ENTRY(); add_t(y, a, b, n); }
extern "C" __global__ void mul_f32(float* y, const float* a, const float* b, u32 n) { GR_PDL_ENTRY(); mul_t(y, a, b, n); }
extern "C" __global__ void scale_out_f32(float* y, const float* x, float a, u32 n) { GR_PDL_ENTRY(); scale_out_t(y, x, a, n); }
extern "C" __global__ void bias_add_f32(float* y, const float* x, const float* b, u32 n, u32 d) { GR_PDL_ENTRY(); bias_add_t(y, x, b, n, d); }
extern "C" __global__ void relu_f32(float* y, const float* x, u32 n) { GR_PDL_ENTRY(); relu_t(y, x, n); }
extern "C" __global__ void relu_bwd_f32(float* dx, const float* dy, const float* x, u32 n) { GR_PDL_ENTRY(); relu_bwd_t(dx, dy, x, n); }
extern "C" __global__ void gelu_f32(float* y, const float* x, u32 n, u32 approx) { GR_PDL_ENTRY(); gelu_t(y, x, n, approx); }
extern "C" __global__ void gelu_bwd_f32(float* dx, const float* dy, const float* x, u32 n, u32 approx) { GR_PDL_ENTRY(); gelu_bwd_t(dx, dy, x, n, approx); }
extern "C" __global__ void mse_bwd_f32(float* dp, const float* p, const float* t, float scale, u32 n) { GR_PDL_ENTRY(); mse_bwd_t(dp, p, t, scale, n); }
extern "C" __global__ void dropout_f32(float* y, float* mask, const float* x, const u32* state, float p, float scale, u32 n) { GR_PDL_ENTRY(); dropout_t(y, mask, x, state, p, scale, n); }
extern "C" __global__ void axpy_bf16(bf16_t* y, const bf16_t* x, float a, u32 n) { GR_PDL_ENTRY(); axpy_t(y, x, a, n); }
extern "C" __global__ void axpy_f16(f16_t* y, const f16_t* x, float a, u32 n) { GR_PDL_ENTRY(); axpy_t(y, x, a, n); }
extern "C" __global__ void scale_bf16(bf16_t* y, float a, u32 n) { GR_PDL_ENTRY(); scale_t(y, a, n); }
extern "C" __global__ void scale_f16(f16_t* y, float a, u32 n) { GR_PDL_ENTRY(); scale_t(y, a, n); }
extern "C" __global__ void add_bf16(bf16_t* y, const bf16_t* a, const bf16_t* b, u32 n) { GR_PDL_ENTRY(); add_t(y, a, b, n); }
extern "C" __global__ void add_f16(f16_t* y, const f16_t* a, const f16_t* b, u32 n) { GR_PDL_ENTRY(); add_t(y, a, b, n); }
extern "C" __global__ void mul_bf16(bf16_t* y, const bf16_t* a, const bf16_t* b, u32 n) { GR_PDL_ENTRY(); mul_t(y, a, b, n); }
extern "C" __global__ void mul_f16(f16_t* y, const f16_t* a, const f16_t* b, u32 n) { GR_PDL_ENTRY(); mul_t(y, a, b, n); }
extern "C" __global__ void scale_out_bf16(bf16_t* y, const bf16_t* x, float a, u32 n) { GR_PDL_ENTRY(); scale_out_t(y, x, a, n); }
extern "C" __global__ void scale_out_f16(f16_t* y, const f16_t* x, float a, u32 n) { GR_PDL_ENTRY(); scale_out_t(y, x, a, n); }
extern "C" __global__ void bias_add_bf16(bf16_t* y, const bf16_t* x, const bf16_t* b, u32 n, u32 d) { GR_PDL_ENTRY(); bias_add_t(y, x, b, n, d); }
extern "C" __global__ void bias_add_f16(f16_t* y, const f16_t* x, const f16_t* b, u32 n, u32 d) { GR_PDL_ENTRY(); bias_add_t(y, x, b, n, d); }
extern "C" __global__ void relu_bf16(bf16_t* y, const bf16_t* x, u32 n) { GR_PDL_ENTRY(); relu_t(y, x, n); }
extern "C" __global__ void relu_f16(f16_t* y, const f16_t* x, u32 n) { GR_PDL_ENTRY(); relu_t(y, x, n); }
extern "C" __global__ void relu_bwd_bf16(bf16_t* dx, const bf16_t* dy, const bf16_t* x, u32 n) { GR_PDL_ENTRY(); relu_bwd_t(dx, dy, x, n); }
extern "C" __global__ void relu_bwd_f16(f16_t* dx, const f16_t* dy, const f16_t* x, u32 n) { GR_PDL_ENTRY(); relu_bwd_t(dx, dy, x, n); }
extern "C" __global__ void gelu_bf16(bf16_t* y, const bf16_t* x, u32 n, u32 approx) { GR_PDL_ENTRY(); gelu_t(y, x, n, approx); }
extern "C" __global__ void gelu_f16(f16_t* y, const f16_t* x, u32 n, u32 approx) { GR_PDL_ENTRY(); gelu_t(y, x, n, approx); }
extern "C" __global__ void gelu_bwd_bf16(bf16_t* dx, const bf16_t* dy, const bf16_t* x, u32 n, u32 approx) { GR_PDL_ENTRY(); gelu_bwd_t(dx, dy, x, n, approx); }
extern "C" __global__ void gelu_bwd_f16(f16_t* dx, const f16_t* dy, const f16_t* x, u32 n, u32 approx) { GR_PDL_ENTRY(); gelu_bwd_t(dx, dy, x, n, approx); }
extern "C" __global__ void dropout_bf16(bf16_t* y, bf16_t* mask, const bf16_t* x, const u32* state, float p, float scale, u32 n) { GR_PDL_ENTRY(); dropout_t(y, mask, x, state, p, scale, n); }
extern "C" __global__ void dropout_f16(f16_t* y, f16_t* mask, const f16_t* x, const u32* state, float p, float scale, u32 n) { GR_PDL_ENTRY(); dropout_t(y, mask, x, state, p, scale, n); }
extern "C" __global__ void mse_bwd_bf16(bf16_t* dp, const bf16_t* p, const bf16_t* t, float scale, u32 n) { GR_PDL_ENTRY(); mse_bwd_t(dp, p, t, scale, n); }
extern "C" __global__ void mse_bwd_f16(f16_t* dp, const f16_t* p, const f16_t* t, float scale, u32 n) { GR_PDL_ENTRY(); mse_bwd_t(dp, p, t, scale, n); }

// ---------------------------------------------------------------- reductions (f32 out)

// Per-block partial sums over a grid-stride range (sum_final_f32 adds the partials), of x and
// of (a - b)^2.
// Each thread adds 16 bytes at a time (their elements in order, then into its running sum)
// when the inputs are 16-byte aligned, then the tail element by element; the order depends only
// on the size and the alignment, so a replay adds in the order of its eager run.
template <typename T> __device__ __forceinline__ void sum_partial_t(float* partial, const T* x, u32 n) {
    __shared__ float sh[32];
    constexpr u32 W = 16 / sizeof(T);
    float s = 0.0f;
    u64 done = 0;
    if (al16(x)) {
        const u64 nv = n / W;
#pragma unroll 4
        for (u64 v = gr_tid(); v < nv; v += gr_stride()) {
            Pack<T> p;
            p.raw = reinterpret_cast<const uint4*>(x)[v];
            float t = 0.0f;
#pragma unroll
            for (u32 k = 0; k < W; ++k) t += ld(p.e, k);
            s += t;
        }
        done = nv * W;
    }
    for (u64 i = done + gr_tid(); i < n; i += gr_stride()) s += ld(x, i);
    s = block_sum(s, sh);
    if (threadIdx.x == 0) partial[blockIdx.x] = s;
}
template <typename T> __device__ __forceinline__ void sqdiff_partial_t(float* partial, const T* a, const T* b, u32 n) {
    __shared__ float sh[32];
    constexpr u32 W = 16 / sizeof(T);
    float s = 0.0f;
    u64 done = 0;
    if (al16(a) && al16(b)) {
        const u64 nv = n / W;
#pragma unroll 4
        for (u64 v = gr_tid(); v < nv; v += gr_stride()) {
            Pack<T> pa, pb;
            pa.raw = reinterpret_cast<const uint4*>(a)[v];
            pb.raw = reinterpret_cast<const uint4*>(b)[v];
            float t = 0.0f;
#pragma unroll
            for (u32 k = 0; k < W; ++k) {
                const float d = ld(pa.e, k) - ld(pb.e, k);
                t += d * d;
            }
            s += t;
        }
        done = nv * W;
    }
    for (u64 i = done + gr_tid(); i < n; i += gr_stride()) {
        const float d = ld(a, i) - ld(b, i);
        s += d * d;
    }
    s = block_sum(s, sh);
    if (threadIdx.x == 0) partial[blockIdx.x] = s;
}
// out[c] += sum over rows of a[r, c], in an f32 accumulator (the bias grad). Blocks of (32,
// GR_COL_Y) threads: x picks the column, y a stripe of rows; the stripes are added in order of y.
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

extern "C" __global__ void sum_partial_f32(float* partial, const float* x, u32 n) { GR_PDL_ENTRY(); sum_partial_t(partial, x, n); }
extern "C" __global__ void sqdiff_partial_f32(float* partial, const float* a, const float* b, u32 n) { GR_PDL_ENTRY(); sqdiff_partial_t(partial, a, b, n); }
extern "C" __global__ void col_sum_acc_f32(float* out, const float* a, u32 rows, u32 cols) { GR_PDL_ENTRY(); col_sum_acc_t(out, a, rows, cols); }
extern "C" __global__ void sum_partial_bf16(float* partial, const bf16_t* x, u32 n) { GR_PDL_ENTRY(); sum_partial_t(partial, x, n); }
extern "C" __global__ void sum_partial_f16(float* partial, const f16_t* x, u32 n) { GR_PDL_ENTRY(); sum_partial_t(partial, x, n); }
extern "C" __global__ void sqdiff_partial_bf16(float* partial, const bf16_t* a, const bf16_t* b, u32 n) { GR_PDL_ENTRY(); sqdiff_partial_t(partial, a, b, n); }
extern "C" __global__ void sqdiff_partial_f16(float* partial, const f16_t* a, const f16_t* b, u32 n) { GR_PDL_ENTRY(); sqdiff_partial_t(partial, a, b, n); }
extern "C" __global__ void col_sum_acc_bf16(float* out, const bf16_t* a, u32 rows, u32 cols) { GR_PDL_ENTRY(); col_sum_acc_t(out, a, rows, cols); }
extern "C" __global__ void col_sum_acc_f16(float* out, const f16_t* a, u32 rows, u32 cols) { GR_PDL_ENTRY(); col_sum_acc_t(out, a, rows, cols); }

// ---------------------------------------------------------------- layer norm and softmax (16-bit)
//
// In f32, bf16 and f16 (float instantiations are the f32 kernels): statistics, mean and rstd,
// row losses and parameter grads stay f32. One block per row; dx = rstd * (g - mean(g) - xhat *
// mean(g * xhat)) with g = dy * gamma; dgamma/dbeta accumulate over column blocks.

template <typename T>
__device__ __forceinline__ void layer_norm_t(T* y, float* mean_out, float* rstd_out, const T* x, const T* gamma, const T* beta, u32 rows, u32 d, float eps) {
    __shared__ float sh[32];
    for (u64 r = blockIdx.x; r < rows; r += gridDim.x) {
        const T* xr = x + r * d;
        T* yr = y + r * d;
        float s = 0.0f;
        for (u32 j = threadIdx.x; j < d; j += blockDim.x) s += ld(xr, j);
        const float mean = block_sum(s, sh) / (float)d;
        float v = 0.0f;
        for (u32 j = threadIdx.x; j < d; j += blockDim.x) {
            float c = ld(xr, j) - mean;
            v += c * c;
        }
        const float var = block_sum(v, sh) / (float)d;
        const float rstd = 1.0f / sqrtf(var + eps);
        for (u32 j = threadIdx.x; j < d; j += blockDim.x) st(yr, j, (ld(xr, j) - mean) * rstd * ld(gamma, j) + ld(beta, j));
        if (threadIdx.x == 0) {
            mean_out[r] = mean;
            rstd_out[r] = rstd;
        }
    }
}

template <typename T>
__device__ __forceinline__ void layer_norm_bwd_t(T* dx, const T* dy, const T* x, const T* gamma, const float* mean, const float* rstd, u32 rows, u32 d) {
    __shared__ float sh[32];
    for (u64 r = blockIdx.x; r < rows; r += gridDim.x) {
        const T* xr = x + r * d;
        const T* dyr = dy + r * d;
        T* dxr = dx + r * d;
        const float mu = mean[r];
        const float rs = rstd[r];
        float a = 0.0f;
        float b = 0.0f;
        for (u32 j = threadIdx.x; j < d; j += blockDim.x) {
            float g = ld(dyr, j) * ld(gamma, j);
            float xh = (ld(xr, j) - mu) * rs;
            a += g;
            b += g * xh;
        }
        const float ma = block_sum(a, sh) / (float)d;
        const float mb = block_sum(b, sh) / (float)d;
        for (u32 j = threadIdx.x; j < d; j += blockDim.x) {
            float g = ld(dyr, j) * ld(gamma, j);
            float xh = (ld(xr, j) - mu) * rs;
            st(dxr, j, rs * (g - ma - xh * mb));
        }
    }
}

template <typename T>
__device__ __forceinline__ void layer_norm_bwd_params_t(float* dgamma, float* dbeta, const T* dy, const T* x, const float* mean, const float* rstd, u32 rows, u32 d) {
    __shared__ float shg[GR_COL_Y][33];
    __shared__ float shb[GR_COL_Y][33];
    for (u64 c0 = (u64)blockIdx.x * 32; c0 < d; c0 += (u64)gridDim.x * 32) {
        u64 c = c0 + threadIdx.x;
        float sg = 0.0f;
        float sb = 0.0f;
        if (c < d) {
            for (u64 r = threadIdx.y; r < rows; r += GR_COL_Y) {
                float g = ld(dy, r * d + c);
                float xh = (ld(x, r * d + c) - mean[r]) * rstd[r];
                sg += g * xh;
                sb += g;
            }
        }
        shg[threadIdx.y][threadIdx.x] = sg;
        shb[threadIdx.y][threadIdx.x] = sb;
        __syncthreads();
        if (threadIdx.y == 0 && c < d) {
            float tg = 0.0f;
            float tb = 0.0f;
            for (int k = 0; k < GR_COL_Y; ++k) {
                tg += shg[k][threadIdx.x];
                tb += shb[k][threadIdx.x];
            }
            dgamma[c] += tg;
            dbeta[c] += tb;
        }
        __syncthreads();
    }
}

// The online softmax's running (max m, sum s of exp(x - m)): v added, or another pair merged,
// each sum rescaled to the larger max. Merging is commutative bit for bit (fmaxf, and a sum of
// two products), so both lanes of a butterfly get the same bits. A -inf value or max (nothing
// yet) adds nothing; +inf or NaN makes the sum NaN, as exp(x - max) summed does.
__device__ __forceinline__ void sx_merge(float& m, float& s, float mo, float so) {
    const float mx = fmaxf(m, mo);
    if (mx == gr_neg_inf()) return;
    s = s * expf(m - mx) + so * expf(mo - mx);
    m = mx;
}
__device__ __forceinline__ void sx_add(float& m, float& s, float v) {
    if (v > m) {
        s = s * expf(m - v) + 1.0f;
        m = v;
    } else if (v != gr_neg_inf()) {
        s += expf(v - m);  // a -inf logit (masked) adds nothing, before a finite max too
    }
}

// (m, s) merged over the block; every thread gets the same bits (order fixed by blockDim.x).
__device__ __forceinline__ void block_max_sum(float& m, float& s, float* sh_m, float* sh_s) {
    const u32 lane = threadIdx.x & 31u, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    for (u32 o = 16; o > 0; o >>= 1) sx_merge(m, s, __shfl_xor_sync(0xffffffffu, m, o), __shfl_xor_sync(0xffffffffu, s, o));
    __syncthreads();
    if (lane == 0) {
        sh_m[warp] = m;
        sh_s[warp] = s;
    }
    __syncthreads();
    m = lane < nwarps ? sh_m[lane] : gr_neg_inf();
    s = lane < nwarps ? sh_s[lane] : 0.0f;
    for (u32 o = 16; o > 0; o >>= 1) sx_merge(m, s, __shfl_xor_sync(0xffffffffu, m, o), __shfl_xor_sync(0xffffffffu, s, o));
}

// One block a row (rows past eight blocks' shared memory or below sm_90 past one block's, or
// misaligned probs; sx_smem_t takes the others, one block or a cluster a row): the row's max and sum of exps in one pass (the online softmax), the probabilities in
// a second; two reads of the row, 16 bytes a load and store where the row is made of whole
// aligned words (H100, 2026-12-06, bench/xent_sweep.py kind vec: 1.51x of the floor in f32 and
// 1.60x in bf16 at 1024 x 131072, against 1.97x and 3.15x two bytes a load in bf16).
template <typename T>
__device__ __forceinline__ void softmax_xent_t(T* probs, float* row_loss, const T* logits, const float* labels, u32 rows, u32 c) {
    constexpr u32 W = 16 / sizeof(T);
    __shared__ float sh_m[32], sh_s[32];
    const bool vec = c % W == 0 && al16(probs) && al16(logits);
    for (u64 r = blockIdx.x; r < rows; r += gridDim.x) {
        const T* xr = logits + r * c;
        T* pr = probs + r * c;
        float m = gr_neg_inf(), s = 0.0f;
        if (vec) {
            for (u32 w = threadIdx.x; w < c / W; w += blockDim.x) {
                Pack<T> p;
                p.raw = reinterpret_cast<const uint4*>(xr)[w];
#pragma unroll
                for (u32 k = 0; k < W; ++k) sx_add(m, s, ld(p.e, k));
            }
        } else {
            for (u32 j = threadIdx.x; j < c; j += blockDim.x) sx_add(m, s, ld(xr, j));
        }
        block_max_sum(m, s, sh_m, sh_s);
        const float inv = 1.0f / s;
        if (vec) {
            for (u32 w = threadIdx.x; w < c / W; w += blockDim.x) {
                Pack<T> p, q;
                p.raw = reinterpret_cast<const uint4*>(xr)[w];
                float o[W];
#pragma unroll
                for (u32 k = 0; k < W; ++k) o[k] = expf(ld(p.e, k) - m) * inv;
                st_all(q.e, o);
                reinterpret_cast<uint4*>(pr)[w] = q.raw;
            }
        } else {
            for (u32 j = threadIdx.x; j < c; j += blockDim.x) st(pr, j, expf(ld(xr, j) - m) * inv);
        }
        if (threadIdx.x == 0) {
            const float l = labels[r];
            row_loss[r] = label_ok(l, c) ? (m + logf(s)) - ld(xr, (u32)l) : l == IGNORE_LABEL ? 0.0f : gr_nan();
        }
    }
}

// Softmax cross-entropy with the row in shared memory (the launch picks it for rows of 8 KB up
// to a block's shared memory; ops/loss.rs): one read of the row from memory. Each thread copies
// its 16-byte words of the row (w = threadIdx.x + i * blockDim.x) into dynamic shared memory
// with cp.async (L2 only) in SX_STAGES commit groups and takes its max over each group as it
// lands; the sum of exps and the probabilities then come from shared memory, each exp computed
// twice, the same way (one FFMA and ex2, as sx_rows_t). A thread reads only the words it
// copied, so the block reductions are the only barriers; thread 0 reads the label's logit from
// shared memory after the max's. A row keeps its alignment there: shared word w holds the row's
// first aligned word + w, so a row that starts or ends inside a word (c not a multiple of
// 16 / sizeof(T)) has those partial words copied and stored value by value. probs must lie at
// the same address mod 16 as logits (the launch checks it). On the H100 (bench/xent_sweep.py,
// 2026-12-06) 0.99x of the bandwidth floor at 4096 x 32768 in f32 and bf16, where the two-read
// kernel below took 1.99x and 3.19x, and 1.01x (f32) and 1.13x (bf16) at 4096 x 4096, where the
// register kernel took 1.11x and 1.39x. A row past one block's shared memory is split over a
// thread block cluster (sx_cluster_*: sm_90, up to SX_CLUSTER_MAX blocks, the launch's cluster
// size): each block copies its share of the row's words, and the blocks exchange their max and
// their sum of exps through shared memory (gr_cluster_push), so the row is still read once.
#define SX_STAGES 4
__device__ __forceinline__ void sx_wait_stage(u32 left) {
    // cp.async.wait_group takes an immediate: the groups still allowed in flight.
    switch (left) {
        case 0: asm volatile("cp.async.wait_group 0;" ::: "memory"); break;
        case 1: asm volatile("cp.async.wait_group 1;" ::: "memory"); break;
        case 2: asm volatile("cp.async.wait_group 2;" ::: "memory"); break;
        default: asm volatile("cp.async.wait_group 3;" ::: "memory"); break;
    }
}
// The row (dynamic shared memory).
extern __shared__ __align__(16) uint4 gr_sx_row[];
// One 16-byte cp.async (L2 only) from global memory into shared memory.
__device__ __forceinline__ void gr_cp16(uint4* smem, const uint4* src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"((u32)__cvta_generic_to_shared(smem)), "l"(src) : "memory");
}
// A row of `words` 16-byte words spread over the block (word w = threadIdx.x + i * blockDim.x)
// and copied into shared memory in SX_STAGES commit groups: issue(copy) calls copy(w) for this
// thread's words, a commit group a stage; land(take) waits for each stage in turn and calls
// take(w) for its words.
struct SxStages {
    u32 words, per, step;
    __device__ __forceinline__ explicit SxStages(u32 n)
        : words(n), per((n + blockDim.x - 1) / blockDim.x), step((per + SX_STAGES - 1) / SX_STAGES) {}
    template <typename F>
    __device__ __forceinline__ void each(u32 g, F f) const {
        for (u32 i = g * step; i < (g + 1) * step && i < per; ++i) {
            const u32 w = threadIdx.x + i * blockDim.x;
            if (w < words) f(w);
        }
    }
    template <typename F>
    __device__ __forceinline__ void issue(F copy) const {
        for (u32 g = 0; g < SX_STAGES; ++g) {
            each(g, copy);
            asm volatile("cp.async.commit_group;" ::: "memory");
        }
    }
    template <typename F>
    __device__ __forceinline__ void land(F take) const {
        for (u32 g = 0; g < SX_STAGES; ++g) {
            sx_wait_stage(SX_STAGES - 1 - g);
            each(g, take);
        }
    }
};
// Whether word w of a row of c values starting `off` values into its first word is all row,
// and whether its value k is part of the row.
__device__ __forceinline__ bool sx_whole(u32 w, u32 off, u32 c, u32 W) { return w * W >= off && (w + 1) * W <= off + c; }
__device__ __forceinline__ bool sx_in(u32 w, u32 k, u32 off, u32 c, u32 W) { return w * W + k >= off && w * W + k - off < c; }
// exp(v - max) as the cross-entropy kernels take it: ml = -max log2(e), one FFMA and ex2.
__device__ __forceinline__ float sx_exp(float v, float ml) { return gr_ex2(fmaf(v, GR_LOG2E, ml)); }

// Thread block clusters (sm_90): a launch without clusters is one block of rank 0. A cluster's
// blocks exchange a value each through their shared memory: thread 0 of every block stores it
// in slot `rank` of `slots` in every block of the cluster (mapa), and after gr_cluster_sync
// (the cluster's hardware barrier, release at arrival, acquire at the wait) each block reads
// the cluster's values from its own slots, in rank order.
// This block's rank in its cluster and the cluster's blocks.
struct GrCluster {
    u32 rank, blocks;
};
__device__ __forceinline__ GrCluster gr_cluster() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    GrCluster c;
    asm("mov.u32 %0, %%cluster_ctarank;\n\tmov.u32 %1, %%cluster_nctarank;" : "=r"(c.rank), "=r"(c.blocks));
    return c;
#else
    return GrCluster{0u, 1u};
#endif
}
__device__ __forceinline__ void gr_cluster_arrive() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
#endif
}
__device__ __forceinline__ void gr_cluster_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");
#endif
}
__device__ __forceinline__ void gr_cluster_sync() {
    gr_cluster_arrive();
    gr_cluster_wait();
}
__device__ __forceinline__ void gr_cluster_push(float* slots, u32 rank, u32 blocks, float v) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if (threadIdx.x == 0) {
        const u32 local = (u32)__cvta_generic_to_shared(slots + rank);
        for (u32 b = 0; b < blocks; ++b) {
            u32 remote;
            asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(local), "r"(b));
            asm volatile("st.shared::cluster.f32 [%0], %1;" ::"r"(remote), "f"(v) : "memory");
        }
    }
#else
    if (threadIdx.x == 0) slots[rank] = v;
#endif
}
// Four f32 values at `local` (this block's shared memory address) in block `block` of the
// cluster (mapa, then one 16-byte distributed shared memory load); below sm_90 this block's own.
__device__ __forceinline__ float4 gr_cluster_ld4(const float* local, u32 block) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    u32 remote;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"((u32)__cvta_generic_to_shared(local)), "r"(block));
    float4 v;
    asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];" : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "r"(remote) : "memory");
    return v;
#else
    (void)block;
    return *reinterpret_cast<const float4*>(local);
#endif
}
// The most blocks a cluster of the cross-entropy takes (the portable cluster size).
#define SX_CLUSTER_MAX 8

// CLUSTER: the launch splits each row over a thread block cluster (sx_cluster_*); without it
// the cluster's rank and size are the constants 0 and 1 and the code for them compiles away.
template <typename T, bool CLUSTER>
__device__ __forceinline__ void sx_smem_t(T* probs, float* row_loss, const T* logits, const float* labels, u32 rows, u32 c) {
    constexpr u32 W = 16 / sizeof(T);
    uint4* sx_row = gr_sx_row;
    __shared__ float red[32];
    __shared__ float cl_m[CLUSTER ? SX_CLUSTER_MAX : 1], cl_s[CLUSTER ? SX_CLUSTER_MAX : 1];
    // A row too wide for one block's shared memory is split over a cluster: block `rank` holds
    // the row's words [rank * per, (rank + 1) * per) (the launch sizes its shared memory).
    const GrCluster cl = CLUSTER ? gr_cluster() : GrCluster{0u, 1u};
    const u32 rank = cl.rank, parts = cl.blocks;
    // Every block of the cluster has started before the first store into its shared memory.
    if (CLUSTER) gr_cluster_arrive();
    bool first = true;
    for (u64 r = blockIdx.x / parts; r < rows; r += gridDim.x / parts) {
        const T* xr = logits + r * c;
        T* pr = probs + r * c;
        const u32 off = (u32)(((unsigned long long)xr & 15ull) / sizeof(T));
        const uint4* xw = reinterpret_cast<const uint4*>(xr - off);
        uint4* pw = reinterpret_cast<uint4*>(pr - off);
        const u32 all = (off + c + W - 1) / W, per = (all + parts - 1) / parts;
        const u32 w0 = min(all, rank * per);
        // This block's words: shared word w holds the row's word g = w0 + w.
        const SxStages stg(min(per, all - w0));
        const u32 words = stg.words;
        const float l = labels[r];
        stg.issue([&](u32 w) {
            const u32 g = w0 + w;
            if (sx_whole(g, off, c, W)) {
                gr_cp16(sx_row + w, xw + g);
            } else {
                T* sv = reinterpret_cast<T*>(sx_row + w);
                for (u32 k = 0; k < W; ++k) {
                    if (sx_in(g, k, off, c, W)) sv[k] = xr[g * W + k - off];
                }
            }
        });
        float m = gr_neg_inf();
        stg.land([&](u32 w) {
            const u32 g = w0 + w;
            Pack<T> p;
            p.raw = sx_row[w];
            const bool whole = sx_whole(g, off, c, W);
#pragma unroll
            for (u32 k = 0; k < W; ++k) {
                if (whole || sx_in(g, k, off, c, W)) m = fmaxf(m, ld(p.e, k));
            }
        });
        m = block_max(m, red);
        if (CLUSTER) {
            if (first) gr_cluster_wait();
            first = false;
            gr_cluster_push(cl_m, rank, parts, m);
            gr_cluster_sync();
            m = cl_m[0];
            for (u32 b = 1; b < parts; ++b) m = fmaxf(m, cl_m[b]);
        }
        const bool lok = label_ok(l, c);
        // The block that holds the label's logit writes the row's loss (rank 0 for a bad label).
        const u32 at = lok ? off + (u32)l : 0u;
        const bool mine = !CLUSTER || (lok ? (at / W >= w0 && at / W < w0 + words) : rank == 0);
        const float xl = (threadIdx.x == 0 && lok && mine) ? ld(reinterpret_cast<const T*>(sx_row), at - w0 * W) : 0.0f;
        const float ml = -m * GR_LOG2E;
        float s = 0.0f;
        for (u32 w = threadIdx.x; w < words; w += blockDim.x) {
            const u32 g = w0 + w;
            Pack<T> p;
            p.raw = sx_row[w];
            const bool whole = sx_whole(g, off, c, W);
#pragma unroll
            for (u32 k = 0; k < W; ++k) {
                if (whole || sx_in(g, k, off, c, W)) s += sx_exp(ld(p.e, k), ml);
            }
        }
        s = block_sum(s, red);
        if (CLUSTER) {
            // Every block adds the parts in rank order: the same bits in each.
            gr_cluster_push(cl_s, rank, parts, s);
            gr_cluster_sync();
            s = cl_s[0];
            for (u32 b = 1; b < parts; ++b) s += cl_s[b];
        }
        const float inv = 1.0f / s;
        for (u32 w = threadIdx.x; w < words; w += blockDim.x) {
            const u32 g = w0 + w;
            Pack<T> p, q;
            p.raw = sx_row[w];
            float o[W];
#pragma unroll
            for (u32 k = 0; k < W; ++k) o[k] = sx_exp(ld(p.e, k), ml) * inv;
            if (sx_whole(g, off, c, W)) {
                st_all(q.e, o);
                pw[g] = q.raw;
            } else {
                for (u32 k = 0; k < W; ++k) {
                    if (sx_in(g, k, off, c, W)) st(pr, g * W + k - off, o[k]);
                }
            }
        }
        if (threadIdx.x == 0 && mine) row_loss[r] = lok ? (m + logf(s)) - xl : l == IGNORE_LABEL ? 0.0f : gr_nan();
    }
    // A block with no row still arrived once; it waits so that the cluster's barrier phases
    // stay paired.
    if (CLUSTER && first) gr_cluster_wait();
}

// dlogits = (probs - onehot(label)) * scale, 16 bytes a load and store where the tensors are
// aligned and a row holds at least a word (the row found once a word, in 32-bit arithmetic: the
// op keeps rows * c in u32 range; a word that straddles two rows takes the next row's label for
// its values past the row's end), else element by element; the same math either way. (With
// rows of whole words only, bf16 at 4096 x 50257 ran element by element at 1.96x of the
// floor: H100, op_bench, 2026-12-06.)
__device__ __forceinline__ float xent_grad(float p, u32 j, float l, u32 c, float scale) {
    if (!label_ok(l, c)) return l == IGNORE_LABEL ? 0.0f : gr_nan();
    const float hot = (j == (u32)l) ? 1.0f : 0.0f;
    return (p - hot) * scale;
}

// The grad with its scale given (dloss_scale / the rows not ignored, rounded as the host rounds
// dloss / rows): softmax_xent_bwd_t and softmax_xent_bwd_counted_t below.
template <typename T>
__device__ __forceinline__ void softmax_xent_grad_t(T* dlogits, const T* probs, const float* labels, float scale, u32 rows, u32 c) {
    constexpr u32 W = 16 / sizeof(T);
    const u32 n = rows * c;
    u32 done = 0;
    if (c >= W && al16(dlogits) && al16(probs)) {
        // A word may straddle two rows (c not a multiple of W): its values past the row's end
        // belong to the next row (one row at most, c >= W), with that row's label.
        const u32 nv = n / W;
        for (u64 v = gr_tid(); v < nv; v += gr_stride()) {
            const u32 i = (u32)v * W, r = i / c, j = i - r * c;
            const float l = labels[r];
            const float l2 = j + W > c ? labels[r + 1] : l;
            Pack<T> pp, pd;
            pp.raw = reinterpret_cast<const uint4*>(probs)[v];
            float o[W];
#pragma unroll
            for (u32 k = 0; k < W; ++k) {
                const u32 jk = j + k;
                o[k] = jk < c ? xent_grad(ld(pp.e, k), jk, l, c, scale) : xent_grad(ld(pp.e, k), jk - c, l2, c, scale);
            }
            st_all(pd.e, o);
            reinterpret_cast<uint4*>(dlogits)[v] = pd.raw;
        }
        done = nv * W;
    }
    for (u64 i = done + gr_tid(); i < n; i += gr_stride()) {
        const u32 r = (u32)i / c, j = (u32)i - r * c;
        st(dlogits, i, xent_grad(ld(probs, i), j, labels[r], c, scale));
    }
}

// The grad of a mean over the rows not ignored, their count in `count` (xent_mean_f32 before it).
template <typename T>
__device__ __forceinline__ void softmax_xent_bwd_t(T* dlogits, const T* probs, const float* labels, float dloss_scale,
                                                   const float* count, u32 rows, u32 c) {
    softmax_xent_grad_t(dlogits, probs, labels, __fdiv_rn(dloss_scale, *count), rows, c);
}

// The same grad with the rows not ignored counted by every block of the launch, not by a launch
// of one block before it (ops/loss.rs launches a few blocks a multiprocessor, which then stride
// over the tensor; for batches up to XENT_ONE_BLOCK_ROWS rows, which a block reads from L2 in
// a few round trips: each thread 8 labels a trip). An integer count, exact as xent_mean_f32's
// f32 count is below 2^24 rows: the same divisor, so the same bits, and one launch and its gap
// fewer.
template <typename T>
__device__ __forceinline__ void softmax_xent_bwd_counted_t(T* dlogits, const T* probs, const float* labels, float dloss_scale, u32 rows, u32 c) {
    constexpr u32 U = 8;
    __shared__ u32 counted;
    if (threadIdx.x == 0) counted = 0;
    __syncthreads();
    u32 n = 0, r = threadIdx.x;
    for (; r + (U - 1) * blockDim.x < rows; r += U * blockDim.x) {
        float lb[U];
#pragma unroll
        for (u32 k = 0; k < U; ++k) lb[k] = labels[r + k * blockDim.x];
#pragma unroll
        for (u32 k = 0; k < U; ++k) n += lb[k] != IGNORE_LABEL ? 1u : 0u;
    }
    for (; r < rows; r += blockDim.x) n += labels[r] != IGNORE_LABEL ? 1u : 0u;
#pragma unroll
    for (u32 o = 16; o > 0; o >>= 1) n += __shfl_xor_sync(0xffffffffu, n, o);
    if ((threadIdx.x & 31) == 0) atomicAdd(&counted, n);
    __syncthreads();
    softmax_xent_grad_t(dlogits, probs, labels, __fdiv_rn(dloss_scale, (float)counted), rows, c);
}

extern "C" __global__ void layer_norm_f32(float* y, float* mean_out, float* rstd_out, const float* x, const float* gamma, const float* beta, u32 rows, u32 d, float eps) { GR_PDL_ENTRY(); layer_norm_t(y, mean_out, rstd_out, x, gamma, beta, rows, d, eps); }
extern "C" __global__ void layer_norm_bwd_f32(float* dx, const float* dy, const float* x, const float* gamma, const float* mean, const float* rstd, u32 rows, u32 d) { GR_PDL_ENTRY(); layer_norm_bwd_t(dx, dy, x, gamma, mean, rstd, rows, d); }
extern "C" __global__ void layer_norm_bwd_params_f32(float* dgamma, float* dbeta, const float* dy, const float* x, const float* mean, const float* rstd, u32 rows, u32 d) { GR_PDL_ENTRY(); layer_norm_bwd_params_t(dgamma, dbeta, dy, x, mean, rstd, rows, d); }
extern "C" __global__ void softmax_xent_f32(float* probs, float* row_loss, const float* logits, const float* labels, u32 rows, u32 c) { GR_PDL_ENTRY(); softmax_xent_t(probs, row_loss, logits, labels, rows, c); }
extern "C" __global__ void softmax_xent_bwd_f32(float* dlogits, const float* probs, const float* labels, float dloss_scale, const float* count, u32 rows, u32 c) { GR_PDL_ENTRY(); softmax_xent_bwd_t(dlogits, probs, labels, dloss_scale, count, rows, c); }
extern "C" __global__ void softmax_xent_bwd_counted_f32(float* dlogits, const float* probs, const float* labels, float dloss_scale, u32 rows, u32 c) { GR_PDL_ENTRY(); softmax_xent_bwd_counted_t(dlogits, probs, labels, dloss_scale, rows, c); }
extern "C" __global__ void layer_norm_bf16(bf16_t* y, float* mean_out, float* rstd_out, const bf16_t* x, const bf16_t* gamma, const bf16_t* beta, u32 rows, u32 d, float eps) { GR_PDL_ENTRY(); layer_norm_t(y, mean_out, rstd_out, x, gamma, beta, rows, d, eps); }
extern "C" __global__ void layer_norm_f16(f16_t* y, float* mean_out, float* rstd_out, const f16_t* x, const f16_t* gamma, const f16_t* beta, u32 rows, u32 d, float eps) { GR_PDL_ENTRY(); layer_norm_t(y, mean_out, rstd_out, x, gamma, beta, rows, d, eps); }
extern "C" __global__ void layer_norm_bwd_bf16(bf16_t* dx, const bf16_t* dy, const bf16_t* x, const bf16_t* gamma, const float* mean, const float* rstd, u32 rows, u32 d) { GR_PDL_ENTRY(); layer_norm_bwd_t(dx, dy, x, gamma, mean, rstd, rows, d); }
extern "C" __global__ void layer_norm_bwd_f16(f16_t* dx, const f16_t* dy, const f16_t* x, const f16_t* gamma, const float* mean, const float* rstd, u32 rows, u32 d) { GR_PDL_ENTRY(); layer_norm_bwd_t(dx, dy, x, gamma, mean, rstd, rows, d); }
extern "C" __global__ void layer_norm_bwd_params_bf16(float* dgamma, float* dbeta, const bf16_t* dy, const bf16_t* x, const float* mean, const float* rstd, u32 rows, u32 d) { GR_PDL_ENTRY(); layer_norm_bwd_params_t(dgamma, dbeta, dy, x, mean, rstd, rows, d); }
extern "C" __global__ void layer_norm_bwd_params_f16(float* dgamma, float* dbeta, const f16_t* dy, const f16_t* x, const float* mean, const float* rstd, u32 rows, u32 d) { GR_PDL_ENTRY(); layer_norm_bwd_params_t(dgamma, dbeta, dy, x, mean, rstd, rows, d); }
extern "C" __global__ void __launch_bounds__(1024) sx_smem_f32(float* probs, float* row_loss, const float* logits, const float* labels, u32 rows, u32 c) { GR_PDL_ENTRY(); sx_smem_t<float, false>(probs, row_loss, logits, labels, rows, c); }
extern "C" __global__ void __launch_bounds__(1024) sx_cluster_f32(float* probs, float* row_loss, const float* logits, const float* labels, u32 rows, u32 c) { GR_PDL_ENTRY(); sx_smem_t<float, true>(probs, row_loss, logits, labels, rows, c); }
extern "C" __global__ void __launch_bounds__(1024) sx_smem_bf16(bf16_t* probs, float* row_loss, const bf16_t* logits, const float* labels, u32 rows, u32 c) { GR_PDL_ENTRY(); sx_smem_t<bf16_t, false>(probs, row_loss, logits, labels, rows, c); }
extern "C" __global__ void __launch_bounds__(1024) sx_cluster_bf16(bf16_t* probs, float* row_loss, const bf16_t* logits, const float* labels, u32 rows, u32 c) { GR_PDL_ENTRY(); sx_smem_t<bf16_t, true>(probs, row_loss, logits, labels, rows, c); }
extern "C" __global__ void __launch_bounds__(1024) sx_smem_f16(f16_t* probs, float* row_loss, const f16_t* logits, const float* labels, u32 rows, u32 c) { GR_PDL_ENTRY(); sx_smem_t<f16_t, false>(probs, row_loss, logits, labels, rows, c); }
extern "C" __global__ void __launch_bounds__(1024) sx_cluster_f16(f16_t* probs, float* row_loss, const f16_t* logits, const float* labels, u32 rows, u32 c) { GR_PDL_ENTRY(); sx_smem_t<f16_t, true>(probs, row_loss, logits, labels, rows, c); }
extern "C" __global__ void softmax_xent_bf16(bf16_t* probs, float* row_loss, const bf16_t* logits, const float* labels, u32 rows, u32 c) { GR_PDL_ENTRY(); softmax_xent_t(probs, row_loss, logits, labels, rows, c); }
extern "C" __global__ void softmax_xent_f16(f16_t* probs, float* row_loss, const f16_t* logits, const float* labels, u32 rows, u32 c) { GR_PDL_ENTRY(); softmax_xent_t(probs, row_loss, logits, labels, rows, c); }
extern "C" __global__ void softmax_xent_bwd_bf16(bf16_t* dlogits, const bf16_t* probs, const float* labels, float dloss_scale, const float* count, u32 rows, u32 c) { GR_PDL_ENTRY(); softmax_xent_bwd_t(dlogits, probs, labels, dloss_scale, count, rows, c); }
extern "C" __global__ void softmax_xent_bwd_f16(f16_t* dlogits, const f16_t* probs, const float* labels, float dloss_scale, const float* count, u32 rows, u32 c) { GR_PDL_ENTRY(); softmax_xent_bwd_t(dlogits, probs, labels, dloss_scale, count, rows, c); }
extern "C" __global__ void softmax_xent_bwd_counted_bf16(bf16_t* dlogits, const bf16_t* probs, const float* labels, float dloss_scale, u32 rows, u32 c) { GR_PDL_ENTRY(); softmax_xent_bwd_counted_t(dlogits, probs, labels, dloss_scale, rows, c); }
extern "C" __global__ void softmax_xent_bwd_counted_f16(f16_t* dlogits, const f16_t* probs, const float* labels, float dloss_scale, u32 rows, u32 c) { GR_PDL_ENTRY(); softmax_xent_bwd_counted_t(dlogits, probs, labels, dloss_scale, rows, c); }
