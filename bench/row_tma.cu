// Row kernels with their rows streamed by the tensor memory accelerator (bench/row_tma.py): a
// persistent grid (a few blocks a multiprocessor), each block a ring of RT_STAGES slots of whole
// rows in shared memory, each slot filled by one bulk copy (cp.async.bulk, completing on the
// slot's mbarrier) that thread 0 issues RT_STAGES rows ahead. The H200's op benchmark (session
// 35) found the runtime's row kernels at the H100's times on a card with 1.38x its bandwidth
// (RMSNorm 1.67x its floor, its backward 1.73x, the loss head 1.84x): bound by the bytes each
// multiprocessor keeps in flight and the instructions that issue them, not by bandwidth. Here a
// block keeps RT_STAGES rows in flight with one instruction a row; a thread owns the same
// 16-byte words of every row (word w = threadIdx.x + i * blockDim.x), so gamma sits in its
// registers and the gamma grad's sums too.
//
// Not part of the runtime: a measurement of the form, with the runtime's math (f32 sums, bf16
// results rounded to nearest even) but its own summation order. Rows of 16-byte multiples.
// Kernels: rt_rms_fwd (y, rstd from x, gamma), rt_rms_bwd (dx and a row of gamma-grad partials
// a block, from dy, x, gamma, rstd; rt_col_sum adds the partials in block order), rt_xent_fwd
// (softmax probabilities and each row's loss from logits and labels). Two forms measured here
// are the runtime's own now, which bench/row_tma.py times from there: LayerNorm's f32 backward
// in one pass (ln_ring_bwd_f32, kernels/transformer.cu) and the cross-entropy's grad with the
// rows counted by every block (softmax_xent_bwd_counted_bf16, kernels/half.cu).

typedef unsigned int u32;
typedef unsigned long long u64;
typedef unsigned short u16;

#ifndef RT_STAGES
#define RT_STAGES 4
#endif
// Most 16-byte words of a row a thread holds (rows of at most RT_WPT x blockDim.x words).
#ifndef RT_WPT
#define RT_WPT 4
#endif

extern __shared__ __align__(128) uint4 rt_ring[];

__device__ __forceinline__ float rt_lo(u32 w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float rt_hi(u32 w) { return __uint_as_float(w & 0xffff0000u); }
// f32 to bf16 as the runtime rounds (half.cu's f32_to_bf16_bits): nearest even, a NaN kept quiet.
__device__ __forceinline__ u32 rt_bf16(float v) {
    const u32 u = __float_as_uint(v);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (u >> 16) | 0x0040u;
    unsigned short h;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(v));
    return h;
}
__device__ __forceinline__ u32 rt_pack(float lo, float hi) { return rt_bf16(lo) | (rt_bf16(hi) << 16); }

__device__ __forceinline__ u32 rt_smem(const void* p) { return (u32)__cvta_generic_to_shared(p); }
__device__ __forceinline__ void rt_bar_init(u64* bar) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(rt_smem(bar)) : "memory");
}
// Slot `bar` expects `bytes`; one bulk copy of each (src, bytes) pair lands in dst.
__device__ __forceinline__ void rt_expect(u64* bar, u32 bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(rt_smem(bar)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void rt_bulk(void* dst, const void* src, u32 bytes, u64* bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(rt_smem(dst)), "l"(src),
                 "r"(bytes), "r"(rt_smem(bar))
                 : "memory");
}
__device__ __forceinline__ void rt_wait(u64* bar, u32 parity) {
    u32 done = 0;
    while (!done) {
        asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
                     : "=r"(done)
                     : "r"(rt_smem(bar)), "r"(parity)
                     : "memory");
    }
}
// The ring's mbarriers, initialised by thread 0 before the block's first barrier.
__device__ __forceinline__ void rt_init(u64* bars) {
    if (threadIdx.x == 0) {
        for (u32 s = 0; s < RT_STAGES; ++s) rt_bar_init(&bars[s]);
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
}
// Thread 0, after a block barrier that every read of slot s came before: the slot back to the
// async proxy.
__device__ __forceinline__ void rt_release() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }

// A block's rows: k-th is blockIdx.x + k * gridDim.x; mine of them below rows.
__device__ __forceinline__ u32 rt_mine(u32 rows) { return blockIdx.x < rows ? (rows - blockIdx.x + gridDim.x - 1) / gridDim.x : 0u; }
__device__ __forceinline__ u64 rt_row(u32 k) { return blockIdx.x + (u64)k * gridDim.x; }
// Thread 0 fills the ring: the block's first RT_STAGES rows.
template <typename Issue> __device__ __forceinline__ void rt_fill(Issue issue, u32 mine) {
    if (threadIdx.x == 0)
        for (u32 k = 0; k < RT_STAGES && k < mine; ++k) issue(k);
}
// Thread 0: the block's row k of `src` (rows of d bf16 values) into slot k % RT_STAGES.
__device__ __forceinline__ void rt_issue_row(u64* bars, const u16* src, u32 k, u32 d) {
    const u32 s = k % RT_STAGES;
    rt_expect(&bars[s], d * 2);
    rt_bulk(rt_ring + (u64)s * (d / 8), src + rt_row(k) * d, d * 2, &bars[s]);
}
// Thread 0: the block's row k of two tensors a and b (rows of `bytes` bytes) into the two halves
// of slot k % RT_STAGES, both copies completing on the slot's mbarrier.
__device__ __forceinline__ void rt_issue_pair(u64* bars, const void* a, const void* b, u32 k, u32 bytes) {
    const u32 s = k % RT_STAGES, words = bytes / 16;
    const u64 off = rt_row(k) * bytes;
    rt_expect(&bars[s], 2 * bytes);
    rt_bulk(rt_ring + (u64)(2 * s) * words, static_cast<const char*>(a) + off, bytes, &bars[s]);
    rt_bulk(rt_ring + (u64)(2 * s + 1) * words, static_cast<const char*>(b) + off, bytes, &bars[s]);
}
// A per-row scalar read a row ahead (the next row's value loads while this row waits).
struct RtAhead {
    const float* p;
    float next;
    __device__ __forceinline__ RtAhead(const float* p_, u32 mine) : p(p_), next(mine > 0 ? p_[blockIdx.x] : 0.0f) {}
    __device__ __forceinline__ float take(u32 k, u32 mine) {
        const float v = next;
        if (k + 1 < mine) next = p[rt_row(k + 1)];
        return v;
    }
};

// A block's sum of v (every thread gets it): warp sums, then the warps' in order. red holds 32
// floats; `par` alternates between two halves so that the next call's stores cannot overtake
// this call's reads.
__device__ __forceinline__ float rt_block_sum(float v, float* red, u32 par) {
#pragma unroll
    for (u32 o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    float* r = red + par * 32;
    if ((threadIdx.x & 31) == 0) r[threadIdx.x >> 5] = v;
    __syncthreads();
    float s = 0.0f;
    for (u32 w = 0; w < (blockDim.x + 31) / 32; ++w) s += r[w];
    return s;
}
__device__ __forceinline__ float rt_block_max(float v, float* red, u32 par) {
#pragma unroll
    for (u32 o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    float* r = red + par * 32;
    if ((threadIdx.x & 31) == 0) r[threadIdx.x >> 5] = v;
    __syncthreads();
    float m = r[0];
    for (u32 w = 1; w < (blockDim.x + 31) / 32; ++w) m = fmaxf(m, r[w]);
    return m;
}

// ------------------------------------------------------------------------ RMSNorm forward
// rows of d bf16 values (d % 8 == 0, d / 8 <= RT_WPT * blockDim.x); the ring: RT_STAGES rows.
extern "C" __global__ void rt_rms_fwd(u16* y, float* rstd_out, const u16* x, const u16* gamma, u32 rows, u32 d, float eps) {
    __shared__ __align__(8) u64 bars[RT_STAGES];
    __shared__ float red[64];
    const u32 words = d / 8;
    rt_init(bars);
    uint4 g[RT_WPT];
#pragma unroll
    for (u32 i = 0; i < RT_WPT; ++i) {
        const u32 w = threadIdx.x + i * blockDim.x;
        g[i] = w < words ? reinterpret_cast<const uint4*>(gamma)[w] : make_uint4(0u, 0u, 0u, 0u);
    }
    const u32 mine = rt_mine(rows);
    auto issue = [&](u32 k) { rt_issue_row(bars, x, k, d); };
    rt_fill(issue, mine);
    for (u32 k = 0; k < mine; ++k) {
        const u32 s = k % RT_STAGES;
        const u64 r = rt_row(k);
        rt_wait(&bars[s], (k / RT_STAGES) & 1u);
        uint4 v[RT_WPT];
        float ss = 0.0f;
#pragma unroll
        for (u32 i = 0; i < RT_WPT; ++i) {
            const u32 w = threadIdx.x + i * blockDim.x;
            v[i] = w < words ? rt_ring[(u64)s * words + w] : make_uint4(0u, 0u, 0u, 0u);
            const u32 e[4] = {v[i].x, v[i].y, v[i].z, v[i].w};
#pragma unroll
            for (u32 j = 0; j < 4; ++j) ss += rt_lo(e[j]) * rt_lo(e[j]) + rt_hi(e[j]) * rt_hi(e[j]);
        }
        const float tot = rt_block_sum(ss, red, k & 1u);  // its barrier: every read of slot s is done
        if (threadIdx.x == 0 && k + RT_STAGES < mine) {
            rt_release();
            issue(k + RT_STAGES);
        }
        const float rs = 1.0f / sqrtf(tot / (float)d + eps);
#pragma unroll
        for (u32 i = 0; i < RT_WPT; ++i) {
            const u32 w = threadIdx.x + i * blockDim.x;
            if (w >= words) break;
            const u32 e[4] = {v[i].x, v[i].y, v[i].z, v[i].w}, ge[4] = {g[i].x, g[i].y, g[i].z, g[i].w};
            u32 o[4];
#pragma unroll
            for (u32 j = 0; j < 4; ++j) o[j] = rt_pack(rt_lo(e[j]) * rs * rt_lo(ge[j]), rt_hi(e[j]) * rs * rt_hi(ge[j]));
            reinterpret_cast<uint4*>(y + r * d)[w] = make_uint4(o[0], o[1], o[2], o[3]);
        }
        if (threadIdx.x == 0) rstd_out[r] = rs;
    }
}

// ------------------------------------------------------------------------ RMSNorm backward
// dx = rstd (g - xhat mean(g xhat)), g = dy gamma, xhat = x rstd; part[block, :] = the block's
// sum over its rows of dy xhat (rt_col_sum adds the blocks' rows in order). The ring: RT_STAGES
// slots of (dy's row, x's row), both copies completing on the slot's one mbarrier.
extern "C" __global__ void rt_rms_bwd(u16* dx, float* part, const u16* dy, const u16* x, const u16* gamma, const float* rstd, u32 rows, u32 d) {
    __shared__ __align__(8) u64 bars[RT_STAGES];
    __shared__ float red[64];
    const u32 words = d / 8, bytes = d * 2;
    rt_init(bars);
    uint4 g[RT_WPT];
    float acc[RT_WPT][8];
#pragma unroll
    for (u32 i = 0; i < RT_WPT; ++i) {
        const u32 w = threadIdx.x + i * blockDim.x;
        g[i] = w < words ? reinterpret_cast<const uint4*>(gamma)[w] : make_uint4(0u, 0u, 0u, 0u);
#pragma unroll
        for (u32 j = 0; j < 8; ++j) acc[i][j] = 0.0f;
    }
    const u32 mine = rt_mine(rows);
    auto issue = [&](u32 k) { rt_issue_pair(bars, dy, x, k, bytes); };
    rt_fill(issue, mine);
    RtAhead rs_ahead(rstd, mine);
    for (u32 k = 0; k < mine; ++k) {
        const u32 s = k % RT_STAGES;
        const u64 r = rt_row(k);
        const float rs = rs_ahead.take(k, mine);
        rt_wait(&bars[s], (k / RT_STAGES) & 1u);
        float gv[RT_WPT][8], xh[RT_WPT][8];
        float dot = 0.0f;
#pragma unroll
        for (u32 i = 0; i < RT_WPT; ++i) {
            const u32 w = threadIdx.x + i * blockDim.x;
            const bool in = w < words;
            const uint4 a = in ? rt_ring[(u64)(2 * s) * words + w] : make_uint4(0u, 0u, 0u, 0u);
            const uint4 b = in ? rt_ring[(u64)(2 * s + 1) * words + w] : make_uint4(0u, 0u, 0u, 0u);
            const u32 ae[4] = {a.x, a.y, a.z, a.w}, be[4] = {b.x, b.y, b.z, b.w}, ge[4] = {g[i].x, g[i].y, g[i].z, g[i].w};
#pragma unroll
            for (u32 j = 0; j < 4; ++j) {
                const float d0 = rt_lo(ae[j]), d1 = rt_hi(ae[j]);
                xh[i][2 * j] = rt_lo(be[j]) * rs;
                xh[i][2 * j + 1] = rt_hi(be[j]) * rs;
                gv[i][2 * j] = d0 * rt_lo(ge[j]);
                gv[i][2 * j + 1] = d1 * rt_hi(ge[j]);
                acc[i][2 * j] += d0 * xh[i][2 * j];
                acc[i][2 * j + 1] += d1 * xh[i][2 * j + 1];
                dot += gv[i][2 * j] * xh[i][2 * j] + gv[i][2 * j + 1] * xh[i][2 * j + 1];
            }
        }
        const float tot = rt_block_sum(dot, red, k & 1u);
        if (threadIdx.x == 0 && k + RT_STAGES < mine) {
            rt_release();
            issue(k + RT_STAGES);
        }
        const float mean = tot / (float)d;
#pragma unroll
        for (u32 i = 0; i < RT_WPT; ++i) {
            const u32 w = threadIdx.x + i * blockDim.x;
            if (w >= words) break;
            u32 o[4];
#pragma unroll
            for (u32 j = 0; j < 4; ++j)
                o[j] = rt_pack(rs * (gv[i][2 * j] - xh[i][2 * j] * mean), rs * (gv[i][2 * j + 1] - xh[i][2 * j + 1] * mean));
            reinterpret_cast<uint4*>(dx + r * d)[w] = make_uint4(o[0], o[1], o[2], o[3]);
        }
    }
#pragma unroll
    for (u32 i = 0; i < RT_WPT; ++i) {
        const u32 w = threadIdx.x + i * blockDim.x;
        if (w >= words) break;
        float4* p = reinterpret_cast<float4*>(part + (u64)blockIdx.x * d + w * 8);
        p[0] = make_float4(acc[i][0], acc[i][1], acc[i][2], acc[i][3]);
        p[1] = make_float4(acc[i][4], acc[i][5], acc[i][6], acc[i][7]);
    }
}

// out[c] = sum over b < blocks of part[b, c], in b order (one thread a column, 4 rows of loads in
// flight), added onto out[c] where `add` (the runtime accumulates LayerNorm's parameter grads).
extern "C" __global__ void rt_col_sum(float* out, const float* part, u32 blocks, u32 d, u32 add) {
    const u32 c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= d) return;
    float s = 0.0f;
    u32 b = 0;
    for (; b + 4 <= blocks; b += 4) {
        const float a0 = part[(u64)b * d + c], a1 = part[(u64)(b + 1) * d + c], a2 = part[(u64)(b + 2) * d + c], a3 = part[(u64)(b + 3) * d + c];
        s += a0;
        s += a1;
        s += a2;
        s += a3;
    }
    for (; b < blocks; ++b) s += part[(u64)b * d + c];
    out[c] = add ? out[c] + s : s;
}

// ------------------------------------------------------------------------ cross-entropy forward
// probs = softmax(logits) (bf16), loss[r] = log(sum exp) + max - logits[label] (0 for a label of
// -100, NaN for another label out of range); exponentials as ex2 of one FFMA, as the runtime's.
extern "C" __global__ void rt_xent_fwd(u16* probs, float* row_loss, const u16* logits, const float* labels, u32 rows, u32 c) {
    __shared__ __align__(8) u64 bars[RT_STAGES];
    __shared__ float red[64];
    const u32 words = c / 8;
    const float L2E = 1.4426950408889634f;
    rt_init(bars);
    const u32 mine = rt_mine(rows);
    auto issue = [&](u32 k) { rt_issue_row(bars, logits, k, c); };
    rt_fill(issue, mine);
    RtAhead lab_ahead(labels, mine);
    for (u32 k = 0; k < mine; ++k) {
        const u32 s = k % RT_STAGES;
        const u64 r = rt_row(k);
        const float lab = lab_ahead.take(k, mine);
        rt_wait(&bars[s], (k / RT_STAGES) & 1u);
        const bool lok = lab >= 0.0f && lab < (float)c && lab == floorf(lab);
        // Thread 0 takes the label's logit from the slot before the slot goes back.
        const float xl = (threadIdx.x == 0 && lok) ? __uint_as_float((u32)reinterpret_cast<const u16*>(rt_ring + (u64)s * words)[(u32)lab] << 16) : 0.0f;
        uint4 v[RT_WPT];
        float m = -__int_as_float(0x7f800000);
#pragma unroll
        for (u32 i = 0; i < RT_WPT; ++i) {
            const u32 w = threadIdx.x + i * blockDim.x;
            const bool in = w < words;
            v[i] = in ? rt_ring[(u64)s * words + w] : make_uint4(0u, 0u, 0u, 0u);
            if (in) {
                const u32 e[4] = {v[i].x, v[i].y, v[i].z, v[i].w};
#pragma unroll
                for (u32 j = 0; j < 4; ++j) m = fmaxf(m, fmaxf(rt_lo(e[j]), rt_hi(e[j])));
            }
        }
        m = rt_block_max(m, red, 0);  // its barrier: every read of slot s is done
        if (threadIdx.x == 0 && k + RT_STAGES < mine) {
            rt_release();
            issue(k + RT_STAGES);
        }
        const float ml = -m * L2E;
        float sum = 0.0f;
#pragma unroll
        for (u32 i = 0; i < RT_WPT; ++i) {
            const u32 w = threadIdx.x + i * blockDim.x;
            if (w >= words) break;
            const u32 e[4] = {v[i].x, v[i].y, v[i].z, v[i].w};
#pragma unroll
            for (u32 j = 0; j < 4; ++j) sum += exp2f(fmaf(rt_lo(e[j]), L2E, ml)) + exp2f(fmaf(rt_hi(e[j]), L2E, ml));
        }
        const float tot = rt_block_sum(sum, red, 1);
        const float inv = 1.0f / tot;
#pragma unroll
        for (u32 i = 0; i < RT_WPT; ++i) {
            const u32 w = threadIdx.x + i * blockDim.x;
            if (w >= words) break;
            const u32 e[4] = {v[i].x, v[i].y, v[i].z, v[i].w};
            u32 o[4];
#pragma unroll
            for (u32 j = 0; j < 4; ++j) o[j] = rt_pack(exp2f(fmaf(rt_lo(e[j]), L2E, ml)) * inv, exp2f(fmaf(rt_hi(e[j]), L2E, ml)) * inv);
            reinterpret_cast<uint4*>(probs + r * c)[w] = make_uint4(o[0], o[1], o[2], o[3]);
        }
        if (threadIdx.x == 0) row_loss[r] = lok ? (m + logf(tot)) - xl : (lab == -100.0f ? 0.0f : __int_as_float(0x7fc00000));
        // red's halves: the next row's max goes into half 0 after this row's second barrier
        // (every read of this row's max came before it), its sum into half 1 after its first
        // (every read of this row's sum came before that).
    }
}

