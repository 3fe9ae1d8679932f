// A deterministic attention backward for Hopper (sm_90a): wgmma on shared-memory descriptors,
// one pass over the query tiles per key tile (five products, not the portable kernels' seven),
// dQ added into an f32 accumulator in a fixed order of key tiles. Its own NVRTC program
// (backend/cuda_hopper.rs), compiled for sm_90a after core.cu, ops.cu, half.cu and flash.cu (it
// uses flash.cu's loads, swizzle, packing and exp2); bench/hopper_bwd.py tests and times it.
//
// Head dim 64, bf16 or f16, the layouts of flash.cu (q [batch, seq, heads*64] rows qld apart,
// k and v rows kvld apart, grouped-query heads; lse and dsum f32 [batch, heads, seq]).
//
// A block is one key tile of 128 keys of one kv head of one batch row: two warpgroups of 64 keys
// each. K and V stay in shared memory; the block walks the query tiles (64 queries, every query
// head of the group) that see its keys, with Q, dO, lse and dsum of the next tile loading
// (cp.async, two stages) while this one computes:
//   Sᵀ = K·Qᵀ, dPᵀ = V·dOᵀ                   (wgmma, both operands K-major in shared memory)
//   Pᵀ = exp(Sᵀ·scale - lse), dSᵀ = Pᵀ∘(dPᵀ - dsum)   (registers)
//   dV += Pᵀ·dO, dK += dSᵀ·Q                 (wgmma, A from registers, B N-major)
//   dQ_tile = dS·K                           (dSᵀ through shared memory, both operands M/N-major)
// Each warpgroup's dQ part goes to shared memory, the block adds the two (warpgroup 0 first) and
// then adds the sum into dq_acc (f32 [batch, heads, query tiles * 64, 64]) when its turn comes:
// a key tile's turn for a query tile is its position in a fixed order of the key tiles that see
// that query tile (HB_ORDER 0: the last key tile first; 1: the first key tile first), counted in
// sem (u32 [batch, heads, query tiles], zero at launch and left at zero). The first in the order
// stores, the middle ones add, the last one adds, scales and writes dq in 16-bit and resets the
// count. Work items are taken in order by a persistent grid (hb_bwd below), so a block only ever
// waits for items taken before its own.
//
// Shared tiles are rows of 64 16-bit values (128 bytes) with chunk c of row r at chunk c ^ (r & 7)
// from a 1024-byte-aligned base: flash.cu's swizzle, which is the layout wgmma's 128-byte swizzle
// mode reads.

#ifndef HB_ORDER
#define HB_ORDER 1
#endif
// HB_PIPE 1: a tile's dQ turn (the wait and the add into dq_acc) runs in the next iteration,
// while the tensor cores compute that iteration's first two products (two stages of dQ parts).
#ifndef HB_PIPE
#define HB_PIPE 1
#endif
// HB_TURN (bench/hopper_bwd.py's diagnostics; the runtime's is 1): 1 the ordered dQ sum; 4 the
// same without the fence before the release store (the release orders the block's stores);
// timing only, dq wrong: 0 no dQ sum at all, 2 each part added by atomics without turns, 3 the
// ordered adds without their waits.
#ifndef HB_TURN
#define HB_TURN 1
#endif
#define HB_WAITS (HB_TURN == 1 || HB_TURN == 4)     // a block waits for its turn
#define HB_RELEASES (HB_TURN != 0 && HB_TURN != 2)  // and counts it done

#define HB_SK 0
#define HB_SV 16384
#define HB_SQ 32768
#define HB_SO 49152
#define HB_SDS 65536
#define HB_SDQ 81920
#define HB_DQLD 72
#define HB_SL (HB_SDQ + (HB_PIPE ? 2 : 1) * 2 * 64 * HB_DQLD * 4)
#define HB_SMEM (HB_SL + 1024 + 1024)

__device__ __forceinline__ void hb_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void hb_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void hb_wait() { asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory"); }
// Writes of the generic proxy (stores, cp.async) made visible to wgmma's reads (async proxy).
__device__ __forceinline__ void hb_proxy_fence() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
// Pins registers in place around the asynchronous products.
__device__ __forceinline__ void hb_keep(float* d) {
#pragma unroll
    for (int i = 0; i < 32; ++i) asm volatile("" : "+f"(d[i])::"memory");
}
__device__ __forceinline__ void hb_keep_u(u32 (*a)[4]) {
#pragma unroll
    for (int i = 0; i < 4; ++i) asm volatile("" : "+r"(a[i][0]), "+r"(a[i][1]), "+r"(a[i][2]), "+r"(a[i][3])::"memory");
}

// A shared-memory matrix descriptor, 128-byte swizzle. Both byte offsets are 1024 (8 rows of
// 128 bytes): every operand here is one swizzle atom wide in its contiguous dimension, so the
// only offset wgmma uses is the one between groups of 8 rows, whichever field holds it.
__device__ __forceinline__ u64 hb_desc(u32 saddr) {
    return (u64)((saddr & 0x3FFFFu) >> 4) | ((u64)(1024 >> 4) << 16) | ((u64)(1024 >> 4) << 32) | (1ull << 62);
}

// d (64 x 64 f32, a warpgroup's accumulators) = or += A·B, k = 16, A and B from descriptors.
template <bool BF16, int TA, int TB>
__device__ __forceinline__ void hb_ss(float* d, u64 da, u64 db, int acc) {
    if constexpr (BF16) {
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1, %35, %36;\n}\n"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
                     : "l"(da), "l"(db), "r"(acc), "n"(TA), "n"(TB));
    } else {
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1, %35, %36;\n}\n"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
                     : "l"(da), "l"(db), "r"(acc), "n"(TA), "n"(TB));
    }
}

// The same with A (64 x 16, four words a thread: mma.sync's A fragment, warp w rows 16w..) in
// registers.
template <bool BF16, int TB>
__device__ __forceinline__ void hb_rs(float* d, const u32* a, u64 db, int acc) {
    if constexpr (BF16) {
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%32, %33, %34, %35}, %36, p, 1, 1, %38;\n}\n"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(acc), "n"(TB));
    } else {
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%32, %33, %34, %35}, %36, p, 1, 1, %38;\n}\n"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(acc), "n"(TB));
    }
}

// A warpgroup's 64 x 64 accumulators as four k steps of A fragments, rounded.
template <bool BF16>
__device__ __forceinline__ void hb_to_a(u32 (*a)[4], const float* c) {
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
        a[kk][0] = fa_pack<BF16>(c[8 * kk + 0], c[8 * kk + 1]);
        a[kk][1] = fa_pack<BF16>(c[8 * kk + 2], c[8 * kk + 3]);
        a[kk][2] = fa_pack<BF16>(c[8 * kk + 4], c[8 * kk + 5]);
        a[kk][3] = fa_pack<BF16>(c[8 * kk + 6], c[8 * kk + 7]);
    }
}

__device__ __forceinline__ u32 hb_ld_acquire(const u32* p) {
    u32 v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ void hb_st_release(u32* p, u32 v) { asm volatile("st.release.gpu.global.u32 [%0], %1;\n" ::"l"(p), "r"(v) : "memory"); }

// One work item: key tile, kv head and batch row `item` (item / (kv_heads * batch) is the key
// tile's rank in the order, the rest the kv head and batch row).
template <bool BF16>
__device__ __forceinline__ void hb_item(u32 item, u16* dq, u16* dk, u16* dv, float* dq_acc, u32* sem, u32* err, const u16* q, const u16* k, const u16* v, const u16* dout, const float* lse, const float* dsum, u32 batch, u32 seq, u32 heads, u32 kv_heads, u32 qld, u32 kvld, u32 causal, float scale) {
    const u32 raw = fa_saddr(fa_smem);
    const u32 sb = (raw + 1023u) & ~1023u;
    unsigned char* base = fa_smem + (sb - raw);
    u16* sK = reinterpret_cast<u16*>(base + HB_SK);
    u16* sV = reinterpret_cast<u16*>(base + HB_SV);
    u16* sQ = reinterpret_cast<u16*>(base + HB_SQ);
    u16* sO = reinterpret_cast<u16*>(base + HB_SO);
    u16* sDS = reinterpret_cast<u16*>(base + HB_SDS);
    float* sDQ = reinterpret_cast<float*>(base + HB_SDQ);
    float* sL = reinterpret_cast<float*>(base + HB_SL);
    float* sD = sL + 128;
    const int tid = threadIdx.x, wg = tid >> 7, warp = (tid >> 5) & 3, lane = tid & 31, gr = lane >> 2, t = lane & 3;

    const u32 groups = kv_heads * batch, group = heads / kv_heads;
    const u32 ntk = (seq + 127) / 128, nqt = (seq + 63) / 64;
    const u32 rank = item / groups, rest = item % groups;
    const u32 kvh = rest % kv_heads, b = rest / kv_heads;
    const u32 j = HB_ORDER == 0 ? ntk - 1 - rank : rank;
    const u64 qs = qld, ks = kvld, os = (u64)heads * 64;
    const u64 koff = (u64)b * seq * ks + (u64)kvh * 64;
    const u32 k0 = j * 128, kw0 = k0 + wg * 64;
    const u32 first = causal ? k0 / 64 : 0;
    const u32 per_head = nqt - first, iters = per_head * group;

    fa_load<64, 128, 256>(sK, k + koff, ks, k0, seq);
    fa_load<64, 128, 256>(sV, v + koff, ks, k0, seq);
    fa_commit();
    auto tile_of = [&](u32 it) { const u32 n = it % per_head; return HB_ORDER == 0 ? first + n : nqt - 1 - n; };
    auto head_of = [&](u32 it) { return kvh * group + it / per_head; };
    auto load_q = [&](u32 it, int st) {
        const u32 h = head_of(it), q0 = tile_of(it) * 64;
        const u64 qoff = (u64)b * seq * qs + (u64)h * 64, ooff = (u64)b * seq * os + (u64)h * 64;
        const u64 loff = ((u64)b * heads + h) * seq;
        fa_load<64, 64, 256>(sQ + st * 4096, q + qoff, qs, q0, seq);
        fa_load<64, 64, 256>(sO + st * 4096, dout + ooff, os, q0, seq);
        fa_load_f32<64, 256>(sL + st * 64, lse + loff, q0, seq);
        fa_load_f32<64, 256>(sD + st * 64, dsum + loff, q0, seq);
    };
    load_q(0, 0);
    fa_commit();

    float dva[32], dka[32];
#pragma unroll
    for (int i = 0; i < 32; ++i) dva[i] = dka[i] = 0.0f;
    const float sl2 = scale * FA_LOG2E;
    const u32 aK = sb + HB_SK + wg * 8192, aV = sb + HB_SV + wg * 8192, aDS = sb + HB_SDS + wg * 8192;

    // The turn of this block for query tile qt of head h: it waits (thread 0) for the key tiles
    // before it in the order, then the block adds its part (both warpgroups' rows of sDQ stage
    // `ps`) into dq_acc, or writes dq when it is the last; `hb_release` then counts it.
    auto turn = [&](u32 h, u32 qt) {
        const u32 q0 = qt * 64;
        const u32 jmax = causal ? fa_min(ntk - 1, (q0 + 63) / 128) : ntk - 1;
        const u32 pos = HB_ORDER == 0 ? jmax - j : j;
        return make_uint2(pos, jmax);
    };
    auto wait_turn = [&](u32 h, u32 qt) {
        const uint2 pl = turn(h, qt);
        if (HB_WAITS && tid == 0 && pl.x > 0) {
            const u32* sm = sem + ((u64)b * heads + h) * nqt + qt;
            const long long t0 = clock64();
            while (hb_ld_acquire(sm) != pl.x) {
                // A few seconds: give up rather than hang, counted in the device's error word
                // (CudaBackend::stall_word), which the next synchronize reports.
                if (clock64() - t0 > (1ll << 32)) {
                    atomicAdd(err, 1u);
                    break;
                }
            }
        }
    };
    auto add_turn = [&](u32 h, u32 qt, int ps) {
        const uint2 pl = turn(h, qt);
        const u32 q0 = qt * 64, pos = pl.x, last = pl.y;
        const float* part = sDQ + ps * 2 * 64 * HB_DQLD;
        float* acc = dq_acc + (((u64)b * heads + h) * nqt * 64 + q0) * 64;
        if (HB_TURN == 0) return;
#pragma unroll
        for (int r4 = 0; r4 < 4; ++r4) {
            const int f = tid + 256 * r4, row = f >> 4, c4 = (f & 15) * 4;
            const float4 p0 = *reinterpret_cast<const float4*>(part + row * HB_DQLD + c4);
            const float4 p1 = *reinterpret_cast<const float4*>(part + 64 * HB_DQLD + row * HB_DQLD + c4);
            float4 x = make_float4(p0.x + p1.x, p0.y + p1.y, p0.z + p1.z, p0.w + p1.w);
            if (HB_TURN == 2) {
                float* a = acc + row * 64 + c4;
                atomicAdd(a, x.x), atomicAdd(a + 1, x.y), atomicAdd(a + 2, x.z), atomicAdd(a + 3, x.w);
                continue;
            }
            if (pos > 0) {
                const float4 o = __ldcg(reinterpret_cast<const float4*>(acc + row * 64 + c4));
                x = make_float4(o.x + x.x, o.y + x.y, o.z + x.z, o.w + x.w);
            }
            if (pos == last) {
                if (q0 + row < seq) {
                    uint2 w;
                    w.x = fa_pack<BF16>(x.x * scale, x.y * scale);
                    w.y = fa_pack<BF16>(x.z * scale, x.w * scale);
                    *reinterpret_cast<uint2*>(dq + ((u64)b * seq + q0 + row) * qs + (u64)h * 64 + c4) = w;
                }
            } else {
                __stcg(reinterpret_cast<float4*>(acc + row * 64 + c4), x);
            }
        }
    };
    // After a block barrier that follows every thread's add_turn.
    auto release_turn = [&](u32 h, u32 qt) {
        const uint2 pl = turn(h, qt);
        if (HB_RELEASES && tid == 0) {
            u32* sm = sem + ((u64)b * heads + h) * nqt + qt;
            if (pl.x == pl.y) {
                if (pl.x > 0) *sm = 0u;
            } else {
                if (HB_TURN != 4) __threadfence();
                hb_st_release(sm, pl.x + 1);
            }
        }
    };

    for (u32 it = 0; it < iters; ++it) {
        const int st = it & 1;
        // Stage st (issued an iteration ago, or before the loop) has landed; the barrier also
        // holds the next load back until both warpgroups waited for their products of the
        // previous iteration, which read stage st ^ 1 (a warpgroup's wgmma wait covers its own
        // products only).
        fa_wait0();
        hb_proxy_fence();
        __syncthreads();
        if (it + 1 < iters) load_q(it + 1, st ^ 1);
        fa_commit();
        const u32 qt = tile_of(it), q0 = qt * 64;
        const u32 aQ = sb + HB_SQ + st * 8192, aO = sb + HB_SO + st * 8192;

        // Sᵀ = K·Qᵀ and dPᵀ = V·dOᵀ: this warpgroup's 64 keys x the tile's 64 queries.
        float s[32], dp[32];
        hb_fence();
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) hb_ss<BF16, 0, 0>(s, hb_desc(aK + kk * 32), hb_desc(aQ + kk * 32), kk);
        hb_commit();
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) hb_ss<BF16, 0, 0>(dp, hb_desc(aV + kk * 32), hb_desc(aO + kk * 32), kk);
        hb_commit();
#if HB_PIPE
        // The previous tile's dQ turn while the tensor cores run this tile's first products.
        if (it > 0) {
            wait_turn(head_of(it - 1), tile_of(it - 1));
            __syncthreads();
            add_turn(head_of(it - 1), tile_of(it - 1), st ^ 1);
        }
#endif
        const float* cL = sL + st * 64;
        const float* cD = sD + st * 64;
        const bool edge = q0 + 63 >= seq || (causal && q0 < kw0 + 63);

        // Pᵀ as soon as Sᵀ is in (dPᵀ may still be running), then dV += Pᵀ·dO (k = the tile's
        // queries: 16 rows of dO a step) while dSᵀ is computed.
        hb_wait<1>();
        hb_keep(s);
#pragma unroll
        for (int c = 0; c < 8; ++c) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int col = 8 * c + 2 * t + (e & 1);
                const u32 qi = q0 + col, key = kw0 + 16 * warp + gr + 8 * (e >> 1);
                const bool masked = edge && (qi >= seq || (causal && qi < key));
                s[4 * c + e] = masked ? 0.0f : fa_exp2(s[4 * c + e] * sl2 - cL[col] * FA_LOG2E);
            }
        }
        u32 pa[4][4], da[4][4];
        hb_to_a<BF16>(pa, s);
        hb_fence();
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) hb_rs<BF16, 1>(dva, pa[kk], hb_desc(aO + kk * 2048), 1);
        hb_commit();

        // dSᵀ = Pᵀ∘(dPᵀ - dsum), then dK += dSᵀ·Q.
        hb_wait<1>();
        hb_keep(dp);
#pragma unroll
        for (int c = 0; c < 8; ++c) {
#pragma unroll
            for (int e = 0; e < 4; ++e) dp[4 * c + e] = s[4 * c + e] * (dp[4 * c + e] - cD[8 * c + 2 * t + (e & 1)]);
        }
        hb_to_a<BF16>(da, dp);
        // dSᵀ (keys x queries) to shared memory for dQ, before dK's product takes da as its A
        // operand (reading an operand register of a product in flight is undefined in PTX).
        {
            const int r0 = wg * 64 + 16 * warp + gr;
#pragma unroll
            for (int kk = 0; kk < 4; ++kk) {
                *reinterpret_cast<u32*>(sDS + fa_off<64>(r0, 2 * kk) + 2 * t) = da[kk][0];
                *reinterpret_cast<u32*>(sDS + fa_off<64>(r0 + 8, 2 * kk) + 2 * t) = da[kk][1];
                *reinterpret_cast<u32*>(sDS + fa_off<64>(r0, 2 * kk + 1) + 2 * t) = da[kk][2];
                *reinterpret_cast<u32*>(sDS + fa_off<64>(r0 + 8, 2 * kk + 1) + 2 * t) = da[kk][3];
            }
        }
        hb_fence();
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) hb_rs<BF16, 1>(dka, da[kk], hb_desc(aQ + kk * 2048), 1);
        hb_commit();
        hb_proxy_fence();
        __syncthreads();
#if HB_PIPE
        if (it > 0) release_turn(head_of(it - 1), tile_of(it - 1));
#endif

        // This warpgroup's part of dQ for the tile: dS (queries x its 64 keys) · K (its 64 keys).
        float dqa[32];
        hb_fence();
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) hb_ss<BF16, 1, 1>(dqa, hb_desc(aDS + kk * 2048), hb_desc(aK + kk * 2048), kk);
        hb_commit();
        hb_wait<0>();
        hb_keep(dva);
        hb_keep(dka);
        hb_keep(dqa);
        hb_keep_u(pa);
        hb_keep_u(da);
        {
            float* pq = sDQ + (HB_PIPE ? st : 0) * 2 * 64 * HB_DQLD + wg * 64 * HB_DQLD;
            const int r0 = 16 * warp + gr;
#pragma unroll
            for (int c = 0; c < 8; ++c) {
                *reinterpret_cast<float2*>(pq + r0 * HB_DQLD + 8 * c + 2 * t) = make_float2(dqa[4 * c], dqa[4 * c + 1]);
                *reinterpret_cast<float2*>(pq + (r0 + 8) * HB_DQLD + 8 * c + 2 * t) = make_float2(dqa[4 * c + 2], dqa[4 * c + 3]);
            }
        }
#if !HB_PIPE
        wait_turn(head_of(it), qt);
        __syncthreads();
        add_turn(head_of(it), qt, 0);
        __syncthreads();
        release_turn(head_of(it), qt);
#endif
    }
#if HB_PIPE
    __syncthreads();
    wait_turn(head_of(iters - 1), tile_of(iters - 1));
    __syncthreads();
    add_turn(head_of(iters - 1), tile_of(iters - 1), (iters - 1) & 1);
    __syncthreads();
    release_turn(head_of(iters - 1), tile_of(iters - 1));
#endif
    fa_wait0();

    // dK (times scale) and dV, straight from the accumulators.
    const u32 r0 = kw0 + 16 * warp + gr;
#pragma unroll
    for (int c = 0; c < 8; ++c) {
#pragma unroll
        for (int hf = 0; hf < 2; ++hf) {
            const u32 row = r0 + 8 * hf;
            if (row < seq) {
                const u64 at = koff + (u64)row * ks + 8 * c + 2 * t;
                *reinterpret_cast<u32*>(dk + at) = fa_pack<BF16>(dka[4 * c + 2 * hf] * scale, dka[4 * c + 2 * hf + 1] * scale);
                *reinterpret_cast<u32*>(dv + at) = fa_pack<BF16>(dva[4 * c + 2 * hf], dva[4 * c + 2 * hf + 1]);
            }
        }
    }
}

// The kernel: a persistent grid (at most one block a multiprocessor) whose blocks take the work
// items in order from a counter (sem[batch * heads * query tiles], zero at launch; the last
// fetch, the grid's last block finding none left, sets it back to zero). A block waits only for
// items taken before its own, each held by a running block, so the waits always end, however
// many blocks are resident.
template <bool BF16>
__device__ __forceinline__ void hb_bwd(u16* dq, u16* dk, u16* dv, float* dq_acc, u32* sem, u32* err, const u16* q, const u16* k, const u16* v, const u16* dout, const float* lse, const float* dsum, u32 batch, u32 seq, u32 heads, u32 kv_heads, u32 qld, u32 kvld, u32 causal, float scale) {
    __shared__ u32 s_item;
    const u32 items = ((seq + 127) / 128) * kv_heads * batch;
    u32* counter = sem + (u64)batch * heads * ((seq + 63) / 64);
    for (;;) {
        if (threadIdx.x == 0) {
            const u32 got = atomicAdd(counter, 1u);
            if (got == items + gridDim.x - 1) *counter = 0u;
            s_item = got;
        }
        __syncthreads();
        const u32 item = s_item;
        if (item >= items) break;
        hb_item<BF16>(item, dq, dk, dv, dq_acc, sem, err, q, k, v, dout, lse, dsum, batch, seq, heads, kv_heads, qld, kvld, causal, scale);
        __syncthreads();
    }
}

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define HB_BODY(...) __VA_ARGS__
#else
#define HB_BODY(...)
#endif

extern "C" __global__ void __launch_bounds__(256, 1) hb_bwd_bf16_d64(u16* dq, u16* dk, u16* dv, float* dq_acc, u32* sem, u32* err, const u16* q, const u16* k, const u16* v, const u16* dout, const float* lse, const float* dsum, u32 batch, u32 seq, u32 heads, u32 kv_heads, u32 qld, u32 kvld, u32 causal, float scale) {
    HB_BODY(hb_bwd<true>(dq, dk, dv, dq_acc, sem, err, q, k, v, dout, lse, dsum, batch, seq, heads, kv_heads, qld, kvld, causal, scale);)
}
extern "C" __global__ void __launch_bounds__(256, 1) hb_bwd_f16_d64(u16* dq, u16* dk, u16* dv, float* dq_acc, u32* sem, u32* err, const u16* q, const u16* k, const u16* v, const u16* dout, const float* lse, const float* dsum, u32 batch, u32 seq, u32 heads, u32 kv_heads, u32 qld, u32 kvld, u32 causal, float scale) {
    HB_BODY(hb_bwd<false>(dq, dk, dv, dq_acc, sem, err, q, k, v, dout, lse, dsum, batch, seq, heads, kv_heads, qld, kvld, causal, scale);)
}

