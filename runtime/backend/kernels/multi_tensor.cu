// Multi-tensor kernels (runtime/optim/multi_tensor.rs): one launch reaches every element of
// every tensor of a table built once in device memory, where PyTorch's fused AdamW and apex's
// multi_tensor_apply pack the pointers into each launch's arguments. NVRTC compiles this file
// after ops.cu, half.cu and mixed.cu, in one program: adamw_elem, ld/st, al16 and Pack4 come
// from there.
//
// The table: one MtTensor per tensor (five pointers, whose roles are the kernel's, and the
// element count) and one MtChunk per chunk of `chunk` elements (the tensor's index and the
// chunk's first element; `chunk` is a multiple of 4, so a chunk starts as aligned as its
// tensor). Block b updates chunk b. Each element gets exactly the arithmetic of the one-tensor
// kernels (the same adamw_elem, the same rounding of the 16-bit weights, the same product for
// the unscale), so the results are bitwise those of one launch per tensor. The kernels read the
// table at every launch and nothing else about the tensors, so a captured launch stays valid
// as long as the table's tensors live (the optimizer holds them).

struct MtTensor { u64 ptr[5]; u64 n; };
struct MtChunk { u32 tensor; u32 start; };

// The slots of an optimizer's table: the f32 weights (the master weights in mixed precision),
// their f32 grads, the two moments, and the 16-bit model weights (null in f32).
#define MT_P 0
#define MT_G 1
#define MT_M 2
#define MT_V 3
#define MT_MODEL 4

// This block's chunk: slot `s` of its tensor at the chunk's first element, and its length.
struct MtChunkView { const MtTensor* t; u64 start; u32 len; };
__device__ __forceinline__ MtChunkView mt_chunk(const MtTensor* table, const MtChunk* chunks, u32 chunk) {
    const MtChunk c = chunks[blockIdx.x];
    const MtTensor* t = table + c.tensor;
    const u64 start = c.start;
    const u64 left = t->n - start;
    return {t, start, (u32)(left < (u64)chunk ? left : (u64)chunk)};
}
template <typename T> __device__ __forceinline__ T* mt_slot(const MtChunkView& c, int s) {
    return reinterpret_cast<T*>(c.t->ptr[s]) + c.start;
}

// Sets g[0..n) to zero, 16 bytes a store where g allows it.
__device__ __forceinline__ void mt_zero(float* g, u32 n) {
    const u32 nv = al16(g) ? n / 4 : 0;
    const float4 zero4 = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    for (u32 i = threadIdx.x; i < nv; i += blockDim.x) reinterpret_cast<float4*>(g)[i] = zero4;
    for (u32 i = nv * 4 + threadIdx.x; i < n; i += blockDim.x) g[i] = 0.0f;
}

// AdamW over a table (adamw_step_f32 in f32, adamw_mixed_* with 16-bit model weights). Skipped
// when `scaler` (null: never) flagged an overflow. zero_g: bit 0 zeroes each grad once an
// update read it, bit 1 zeroes it on a skipped step too (a step under an IF node leaves the
// skipped case to its other branch).
template <typename T, bool MODEL>
__device__ __forceinline__ void adamw_mt_t(const MtTensor* table, const MtChunk* chunks, u32 chunk, const float* lr, const float* sta, const float* scaler, float beta1, float beta2, float eps, float wd, u32 zero_g) {
    const MtChunkView c = mt_chunk(table, chunks, chunk);
    float* p = mt_slot<float>(c, MT_P);
    float* g = mt_slot<float>(c, MT_G);
    float* m = mt_slot<float>(c, MT_M);
    float* v = mt_slot<float>(c, MT_V);
    T* model = MODEL ? mt_slot<T>(c, MT_MODEL) : nullptr;
    const u32 n = c.len;
    if (scaler != nullptr && scaler[1] != 0.0f) {
        if ((zero_g & 2u) != 0u) mt_zero(g, n);
        return;
    }
    const bool zero = (zero_g & 1u) != 0u;
    const float rate = lr[0];
    const float step_size = rate / sta[1];
    const float bc2_sqrt = sqrtf(sta[2]);
    const float decay = __fsub_rn(1.0f, __fmul_rn(rate, wd));
    const bool vec = al16(p) && al16(g) && al16(m) && al16(v) && (!MODEL || ((u64)model & 7) == 0);
    const u32 nv = vec ? n / 4 : 0;
    const float4 zero4 = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    for (u32 i = threadIdx.x; i < nv; i += blockDim.x) {
        float4 pv = reinterpret_cast<const float4*>(p)[i], gv = reinterpret_cast<const float4*>(g)[i];
        float4 mv = reinterpret_cast<const float4*>(m)[i], vv = reinterpret_cast<const float4*>(v)[i];
        float pe[4] = {pv.x, pv.y, pv.z, pv.w}, ge[4] = {gv.x, gv.y, gv.z, gv.w};
        float me[4] = {mv.x, mv.y, mv.z, mv.w}, ve[4] = {vv.x, vv.y, vv.z, vv.w};
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            pe[e] = adamw_elem(pe[e], ge[e], &me[e], &ve[e], step_size, bc2_sqrt, decay, beta1, beta2, eps);
        }
        reinterpret_cast<float4*>(p)[i] = make_float4(pe[0], pe[1], pe[2], pe[3]);
        reinterpret_cast<float4*>(m)[i] = make_float4(me[0], me[1], me[2], me[3]);
        reinterpret_cast<float4*>(v)[i] = make_float4(ve[0], ve[1], ve[2], ve[3]);
        if constexpr (MODEL) {
            Pack4<T> out;
#pragma unroll
            for (int e = 0; e < 4; ++e) st(out.e, e, pe[e]);
            reinterpret_cast<uint2*>(model)[i] = out.raw;
        }
        if (zero) reinterpret_cast<float4*>(g)[i] = zero4;
    }
    for (u32 i = nv * 4 + threadIdx.x; i < n; i += blockDim.x) {
        const float pi = adamw_elem(p[i], g[i], &m[i], &v[i], step_size, bc2_sqrt, decay, beta1, beta2, eps);
        p[i] = pi;
        if constexpr (MODEL) st(model, i, pi);
        if (zero) g[i] = 0.0f;
    }
}
extern "C" __global__ void adamw_mt_f32(const MtTensor* table, const MtChunk* chunks, u32 chunk, const float* lr, const float* sta, const float* scaler, float beta1, float beta2, float eps, float wd, u32 zero_g) { GR_PDL_ENTRY(); adamw_mt_t<bf16_t, false>(table, chunks, chunk, lr, sta, scaler, beta1, beta2, eps, wd, zero_g); }
extern "C" __global__ void adamw_mt_bf16(const MtTensor* table, const MtChunk* chunks, u32 chunk, const float* lr, const float* sta, const float* scaler, float beta1, float beta2, float eps, float wd, u32 zero_g) { GR_PDL_ENTRY(); adamw_mt_t<bf16_t, true>(table, chunks, chunk, lr, sta, scaler, beta1, beta2, eps, wd, zero_g); }
extern "C" __global__ void adamw_mt_f16(const MtTensor* table, const MtChunk* chunks, u32 chunk, const float* lr, const float* sta, const float* scaler, float beta1, float beta2, float eps, float wd, u32 zero_g) { GR_PDL_ENTRY(); adamw_mt_t<f16_t, true>(table, chunks, chunk, lr, sta, scaler, beta1, beta2, eps, wd, zero_g); }

// SGD over a table (sgd_step_f32 in f32, sgd_mixed_* with 16-bit model weights): each element
// gets sgd_elem, the one-tensor kernels' arithmetic, so the results are theirs bit for bit. The
// momentum buffers sit in slot MT_M (null, and never read, without momentum). Skipped when
// `scaler` (null: never) flagged an overflow; zero_g as for adamw_mt_t.
template <typename T, bool MODEL>
__device__ __forceinline__ void sgd_mt_t(const MtTensor* table, const MtChunk* chunks, u32 chunk, const float* lr, const float* scaler, float momentum, float wd, u32 use_momentum, u32 zero_g) {
    const MtChunkView c = mt_chunk(table, chunks, chunk);
    float* p = mt_slot<float>(c, MT_P);
    float* g = mt_slot<float>(c, MT_G);
    float* buf = use_momentum != 0u ? mt_slot<float>(c, MT_M) : nullptr;
    T* model = MODEL ? mt_slot<T>(c, MT_MODEL) : nullptr;
    const u32 n = c.len;
    if (scaler != nullptr && scaler[1] != 0.0f) {
        if ((zero_g & 2u) != 0u) mt_zero(g, n);
        return;
    }
    const bool zero = (zero_g & 1u) != 0u;
    const float rate = lr[0];
    for (u32 i = threadIdx.x; i < n; i += blockDim.x) {
        const float pi = sgd_elem(p[i], g[i], buf, i, rate, momentum, wd, use_momentum);
        p[i] = pi;
        if constexpr (MODEL) st(model, i, pi);
        if (zero) g[i] = 0.0f;
    }
}
extern "C" __global__ void sgd_mt_f32(const MtTensor* table, const MtChunk* chunks, u32 chunk, const float* lr, const float* scaler, float momentum, float wd, u32 use_momentum, u32 zero_g) { GR_PDL_ENTRY(); sgd_mt_t<bf16_t, false>(table, chunks, chunk, lr, scaler, momentum, wd, use_momentum, zero_g); }
extern "C" __global__ void sgd_mt_bf16(const MtTensor* table, const MtChunk* chunks, u32 chunk, const float* lr, const float* scaler, float momentum, float wd, u32 use_momentum, u32 zero_g) { GR_PDL_ENTRY(); sgd_mt_t<bf16_t, true>(table, chunks, chunk, lr, scaler, momentum, wd, use_momentum, zero_g); }
extern "C" __global__ void sgd_mt_f16(const MtTensor* table, const MtChunk* chunks, u32 chunk, const float* lr, const float* scaler, float momentum, float wd, u32 use_momentum, u32 zero_g) { GR_PDL_ENTRY(); sgd_mt_t<f16_t, true>(table, chunks, chunk, lr, scaler, momentum, wd, use_momentum, zero_g); }

// amp_unscale_check over the grads (slot MT_G) of a table: g *= 1 / scale in place, and a
// non-finite result raises the flag (every writer stores 1, so timing does not matter).
extern "C" __global__ void amp_unscale_check_mt(const MtTensor* table, const MtChunk* chunks, u32 chunk, float* scaler) {
    GR_PDL_ENTRY();
    const MtChunkView c = mt_chunk(table, chunks, chunk);
    float* g = mt_slot<float>(c, MT_G);
    const u32 n = c.len;
    const float inv = 1.0f / scaler[0];
    const float big = 3.4028234663852886e38f;
    bool bad = false;
    const u32 nv = al16(g) ? n / 4 : 0;
    for (u32 i = threadIdx.x; i < nv; i += blockDim.x) {
        float4 x = reinterpret_cast<const float4*>(g)[i];
        x.x = x.x * inv;
        x.y = x.y * inv;
        x.z = x.z * inv;
        x.w = x.w * inv;
        reinterpret_cast<float4*>(g)[i] = x;
        // false for NaN and infinities
        bad = bad || !(fabsf(x.x) <= big) || !(fabsf(x.y) <= big) || !(fabsf(x.z) <= big) || !(fabsf(x.w) <= big);
    }
    for (u32 i = nv * 4 + threadIdx.x; i < n; i += blockDim.x) {
        const float x = g[i] * inv;
        g[i] = x;
        bad = bad || !(fabsf(x) <= big);
    }
    if (bad) scaler[1] = 1.0f;
}

// Zeroes the grads (slot MT_G) of a table: always when `scaler` is null, else only when it
// flagged an overflow (the other branch of a step whose update sits under an IF node).
extern "C" __global__ void zero_grads_mt(const MtTensor* table, const MtChunk* chunks, u32 chunk, const float* scaler) {
    GR_PDL_ENTRY();
    if (scaler != nullptr && scaler[1] == 0.0f) return;
    const MtChunkView c = mt_chunk(table, chunks, chunk);
    mt_zero(mt_slot<float>(c, MT_G), c.len);
}
