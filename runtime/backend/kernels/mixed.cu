// Mixed-precision training (issue #12): device-side dynamic loss scaling and AdamW over f32
// master weights that rewrites the 16-bit model weights in the same kernel. Compiled after
// half.cu (ld/st and the 16-bit storage types come from there).
//
// The loss scaler's state is 4 floats in device memory: [scale, found_inf, good_steps,
// skipped_steps]. Every decision (skip the step, grow or back off the scale) is taken on the
// device, so the whole step captures into one graph and never syncs with the host.

// Resets the overflow flag at the start of a step.
extern "C" __global__ void amp_begin(float* scaler) {
    GR_PDL_ENTRY();
    if (blockIdx.x == 0 && threadIdx.x == 0) scaler[1] = 0.0f;
}

// y *= scale (the loss grad, before backward).
template <typename T> __device__ __forceinline__ void amp_scale_t(T* y, const float* scaler, u32 n) {
    const float s = scaler[0];
    for (u64 i = gr_tid(); i < n; i += gr_stride()) st(y, i, ld(y, i) * s);
}
extern "C" __global__ void amp_scale_f32(float* y, const float* scaler, u32 n) { GR_PDL_ENTRY(); amp_scale_t(y, scaler, n); }
extern "C" __global__ void amp_scale_bf16(bf16_t* y, const float* scaler, u32 n) { GR_PDL_ENTRY(); amp_scale_t(y, scaler, n); }
extern "C" __global__ void amp_scale_f16(f16_t* y, const float* scaler, u32 n) { GR_PDL_ENTRY(); amp_scale_t(y, scaler, n); }

// g *= 1 / scale, in place; any non-finite result raises the flag (every writer stores 1, so
// the outcome does not depend on timing).
extern "C" __global__ void amp_unscale_check(float* g, float* scaler, u32 n) {
    GR_PDL_ENTRY();
    const float inv = 1.0f / scaler[0];
    bool bad = false;
    for (u64 i = gr_tid(); i < n; i += gr_stride()) {
        const float v = g[i] * inv;
        g[i] = v;
        bad = bad || !(fabsf(v) <= 3.4028234663852886e38f); // false for NaN and infinities
    }
    if (bad) scaler[1] = 1.0f;
}

// After the optimizer: on overflow back off and count a skipped step, else grow the scale
// every `interval` good steps (scale_update.cu).
extern "C" __global__ void amp_update(float* scaler, float growth, float backoff, u32 interval) {
    GR_PDL_ENTRY();
    if (blockIdx.x != 0 || threadIdx.x != 0) return;
    amp_update_state(scaler, growth, backoff, interval);
}

// adamw_prepare_f32, skipped when the scaler flagged an overflow.
extern "C" __global__ void adamw_prepare_mixed(float* st, const float* scaler, float beta1, float beta2) {
    GR_PDL_ENTRY();
    if (blockIdx.x == 0 && threadIdx.x == 0 && scaler[1] == 0.0f) {
        const u32 t = __float_as_uint(st[0]) + 1u;
        st[0] = __uint_as_float(t);
        st[1] = 1.0f - powf(beta1, (float)t);
        st[2] = 1.0f - powf(beta2, (float)t);
    }
}

// adamw_step_f32 on the f32 master weights, then the 16-bit model weights rewritten from them
// (rounded to nearest even); nothing changes when the scaler flagged an overflow. zero_g != 0
// also zeroes each grad once read (skipped steps too). Four elements a thread and iteration
// (16-byte loads and stores of the f32 tensors, 8 bytes of the 16-bit weights) when every
// pointer allows it (pool blocks are 256-byte aligned; a wrapped foreign buffer may not be),
// the rest one by one: the same arithmetic per element either way.
template <typename T> union Pack4 { uint2 raw; T e[4]; };
template <typename T>
__device__ __forceinline__ void adamw_mixed_t(float* p, T* model, float* g, float* m, float* v, const float* lr, const float* sta, const float* scaler, float beta1, float beta2, float eps, float wd, u32 zero_g, u32 n) {
    const bool vec = al16(p) && al16(g) && al16(m) && al16(v) && ((u64)model & 7) == 0;
    const u64 nv = vec ? n / 4 : 0;
    const float4 zero4 = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (scaler[1] != 0.0f) {
        if (zero_g != 0u) {
            for (u64 i = gr_tid(); i < nv; i += gr_stride()) reinterpret_cast<float4*>(g)[i] = zero4;
            for (u64 i = nv * 4 + gr_tid(); i < n; i += gr_stride()) g[i] = 0.0f;
        }
        return;
    }
    const float rate = lr[0];
    const float step_size = rate / sta[1];
    const float bc2_sqrt = sqrtf(sta[2]);
    const float decay = __fsub_rn(1.0f, __fmul_rn(rate, wd));
    for (u64 i = gr_tid(); i < nv; i += gr_stride()) {
        float4 pv = reinterpret_cast<const float4*>(p)[i], gv = reinterpret_cast<const float4*>(g)[i];
        float4 mv = reinterpret_cast<const float4*>(m)[i], vv = reinterpret_cast<const float4*>(v)[i];
        float pe[4] = {pv.x, pv.y, pv.z, pv.w}, ge[4] = {gv.x, gv.y, gv.z, gv.w};
        float me[4] = {mv.x, mv.y, mv.z, mv.w}, ve[4] = {vv.x, vv.y, vv.z, vv.w};
        Pack4<T> out;
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            pe[e] = adamw_elem(pe[e], ge[e], &me[e], &ve[e], step_size, bc2_sqrt, decay, beta1, beta2, eps);
            st(out.e, e, pe[e]);
        }
        reinterpret_cast<float4*>(p)[i] = make_float4(pe[0], pe[1], pe[2], pe[3]);
        reinterpret_cast<float4*>(m)[i] = make_float4(me[0], me[1], me[2], me[3]);
        reinterpret_cast<float4*>(v)[i] = make_float4(ve[0], ve[1], ve[2], ve[3]);
        reinterpret_cast<uint2*>(model)[i] = out.raw;
        if (zero_g != 0u) reinterpret_cast<float4*>(g)[i] = zero4;
    }
    for (u64 i = nv * 4 + gr_tid(); i < n; i += gr_stride()) {
        const float pi = adamw_elem(p[i], g[i], &m[i], &v[i], step_size, bc2_sqrt, decay, beta1, beta2, eps);
        p[i] = pi;
        st(model, i, pi);
        if (zero_g != 0u) g[i] = 0.0f;
    }
}
extern "C" __global__ void adamw_mixed_bf16(float* p, bf16_t* model, float* g, float* m, float* v, const float* lr, const float* sta, const float* scaler, float beta1, float beta2, float eps, float wd, u32 zero_g, u32 n) { GR_PDL_ENTRY(); adamw_mixed_t(p, model, g, m, v, lr, sta, scaler, beta1, beta2, eps, wd, zero_g, n); }
extern "C" __global__ void adamw_mixed_f16(float* p, f16_t* model, float* g, float* m, float* v, const float* lr, const float* sta, const float* scaler, float beta1, float beta2, float eps, float wd, u32 zero_g, u32 n) { GR_PDL_ENTRY(); adamw_mixed_t(p, model, g, m, v, lr, sta, scaler, beta1, beta2, eps, wd, zero_g, n); }

// sgd_step_f32 on the f32 master weights, then the 16-bit model weights rewritten from them;
// nothing changes when the scaler flagged an overflow. buf is unused (may be null) when
// use_momentum is 0.
template <typename T>
__device__ __forceinline__ void sgd_mixed_t(float* p, T* model, const float* g, float* buf, const float* lr, const float* scaler, float momentum, float wd, u32 use_momentum, u32 n) {
    if (scaler[1] != 0.0f) return;
    const float rate = lr[0];
    for (u64 i = gr_tid(); i < n; i += gr_stride()) {
        const float pi = sgd_elem(p[i], g[i], buf, i, rate, momentum, wd, use_momentum);
        p[i] = pi;
        st(model, i, pi);
    }
}
extern "C" __global__ void sgd_mixed_bf16(float* p, bf16_t* model, const float* g, float* buf, const float* lr, const float* scaler, float momentum, float wd, u32 use_momentum, u32 n) { GR_PDL_ENTRY(); sgd_mixed_t(p, model, g, buf, lr, scaler, momentum, wd, use_momentum, n); }
extern "C" __global__ void sgd_mixed_f16(float* p, f16_t* model, const float* g, float* buf, const float* lr, const float* scaler, float momentum, float wd, u32 use_momentum, u32 n) { GR_PDL_ENTRY(); sgd_mixed_t(p, model, g, buf, lr, scaler, momentum, wd, use_momentum, n); }
