// Fused attention (the FlashAttention-2 algorithm) on tensor cores: mma.sync m16n8k16 with
// ldmatrix and cp.async, written for NVRTC (sm_80 and newer; no headers). NVRTC compiles this
// file after core.cu and half.cu in one program: u16, u32 and u64 come from there.
//
// Layout: q is [batch, seq, heads * D], k and v are [batch, seq, kv_heads * D] (the outputs of
// linear layers, heads side by side; kv_heads divides heads: grouped-query attention), rows qld
// (q) and kvld (k, v) elements apart: heads * D and kv_heads * D for separate tensors, the
// packed row's width when q, k and v are column blocks of one [batch, seq, width] tensor (one
// projection's output). The grads dq, dk, dv have their input's row stride; out and dout are
// [batch, seq, heads * D]; lse and dsum are f32 [batch, heads, seq]. Storage is bf16 or f16 (raw
// 16-bit words), every product accumulates in f32.
//
// Forward: one block per (query tile, head, batch); each warp owns 16 query rows, keeps its Q
// fragments in registers and streams K/V tiles through two shared-memory stages (cp.async,
// the next tile loads while this one computes), with the online softmax in f32 registers.
// Only the row logsumexp is saved. Backward: a prep kernel computes dsum = rowsum(dO * O); one
// kernel per (key tile, kv head, batch) accumulates dK and dV over the query tiles (and over
// the query heads of its group), one per (query tile, head, batch) accumulates dQ over the key
// tiles. Both recompute P from lse; no atomics anywhere, so every result is bitwise
// reproducible (the price: Q·Kᵀ and dO·Vᵀ are computed twice, 7 products instead of 5).
//
// Shared memory tiles are rows of D 16-bit values in 16-byte chunks; chunk c of row r lives at
// chunk c ^ (r & 7), so the 8 rows an ldmatrix reads fall in 8 different bank groups.

#define FA_LOG2E 1.4426950408889634f
#define FA_LN2 0.6931471805599453f
#define FA_NEG_INF __uint_as_float(0xff800000u)

extern __shared__ __align__(128) unsigned char fa_smem[];

// The loops over the elements of a warp's MT_ x (N_ / 8) score fragments, four each, fully
// unrolled: `FA_EACH_ELEM(MT, BN) { ... s[mt][nt][e] ... }`. Element e of fragment (mt, nt) is
// column nt * 8 + 2 * t + (e & 1) and row mt * 16 + gr + 8 * (e >> 1) of the warp's part.
#define FA_EACH_ELEM(MT_, N_)                                   \
    _Pragma("unroll") for (int mt = 0; mt < (MT_); ++mt)        \
        _Pragma("unroll") for (int nt = 0; nt < (N_) / 8; ++nt) \
            _Pragma("unroll") for (int e = 0; e < 4; ++e)

__device__ __forceinline__ u32 fa_min(u32 a, u32 b) { return a < b ? a : b; }

__device__ __forceinline__ u32 fa_saddr(const void* p) { return (u32)__cvta_generic_to_shared(p); }

// 16 bytes global -> shared, zero-filled when !ok (src must still be a valid address).
__device__ __forceinline__ void fa_cp16(void* dst, const void* src, bool ok) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(fa_saddr(dst)), "l"(src), "r"(ok ? 16 : 0));
}
// 4 bytes global -> shared, zero-filled when !ok.
__device__ __forceinline__ void fa_cp4(void* dst, const void* src, bool ok) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(fa_saddr(dst)), "l"(src), "r"(ok ? 4 : 0));
}
__device__ __forceinline__ void fa_commit() { asm volatile("cp.async.commit_group;\n" ::); }
__device__ __forceinline__ void fa_wait1() { asm volatile("cp.async.wait_group 1;\n" ::); }
__device__ __forceinline__ void fa_wait0() { asm volatile("cp.async.wait_group 0;\n" ::); }

__device__ __forceinline__ void fa_ldsm(u32* r, const void* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(fa_saddr(p)));
}
__device__ __forceinline__ void fa_ldsm_t(u32* r, const void* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(fa_saddr(p)));
}

// c[0..4] += A (16x16, 4 words) * B (16x8, 2 words), f32 accumulators.
template <bool BF16>
__device__ __forceinline__ void fa_mma(float* c, const u32* a, u32 b0, u32 b1) {
    if constexpr (BF16) {
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    } else {
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
}

// Two f32 values rounded to nearest even into one word (lo in the low half).
template <bool BF16>
__device__ __forceinline__ u32 fa_pack(float lo, float hi) {
    u32 r;
    if constexpr (BF16) {
        asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
    } else {
        asm("cvt.rn.f16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
    }
    return r;
}

__device__ __forceinline__ float fa_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

// Element offset of (row, chunk) in a swizzled tile of D columns.
template <int D>
__device__ __forceinline__ int fa_off(int row, int chunk) {
    return row * D + ((chunk ^ (row & 7)) << 3);
}

// Loads ROWS rows of a [.., stride] matrix from row `row0` into a swizzled tile; rows at or past
// `rows` are zero-filled. NT threads share the work.
template <int D, int ROWS, int NT>
__device__ __forceinline__ void fa_load(u16* s, const u16* g, u64 stride, u32 row0, u32 rows) {
    constexpr int CH = D / 8, N = ROWS * CH;
#pragma unroll
    for (int it = 0; it < (N + NT - 1) / NT; ++it) {
        const int i = it * NT + threadIdx.x;
        if (N % NT != 0 && i >= N) break;
        const int r = i / CH, c = i % CH;
        const bool ok = row0 + r < rows;
        const u16* src = ok ? g + (u64)(row0 + r) * stride + c * 8 : g;
        fa_cp16(s + fa_off<D>(r, c), src, ok);
    }
}

// Loads N f32 values from g[i0..] into s (zero past n).
template <int N, int NT>
__device__ __forceinline__ void fa_load_f32(float* s, const float* g, u32 i0, u32 n) {
    for (int i = threadIdx.x; i < N; i += NT) {
        const bool ok = i0 + i < n;
        fa_cp4(s + i, ok ? g + i0 + i : g, ok);
    }
}

// A fragment (16 rows from `row0`, k columns 16*kk..) of a swizzled tile.
template <int D>
__device__ __forceinline__ void fa_frag_a(u32* a, const u16* s, int row0, int kk) {
    const int lane = threadIdx.x & 31;
    fa_ldsm(a, s + fa_off<D>(row0 + (lane & 15), kk * 2 + (lane >> 4)));
}

// B fragments of two n8 tiles (rows n0..n0+16 of the tile, k columns 16*kk..) for a product
// with the tile transposed (S = Q·Kᵀ): {b0, b1} of tile n0, {b2, b3} of tile n0 + 8.
template <int D>
__device__ __forceinline__ void fa_frag_bt(u32* b, const u16* s, int n0, int kk) {
    const int lane = threadIdx.x & 31;
    fa_ldsm(b, s + fa_off<D>(n0 + (lane & 7) + ((lane >> 4) << 3), kk * 2 + ((lane >> 3) & 1)));
}

// B fragments for a product with the tile itself (O = P·V; k = its rows k0..k0+16, n = its
// columns): {b0, b1} of columns 16*dp.., {b2, b3} of columns 16*dp + 8...
template <int D>
__device__ __forceinline__ void fa_frag_b(u32* b, const u16* s, int k0, int dp) {
    const int lane = threadIdx.x & 31;
    fa_ldsm_t(b, s + fa_off<D>(k0 + (lane & 7) + (((lane >> 3) & 1) << 3), dp * 2 + (lane >> 4)));
}

// acc[mt] (16 x D f32 each) += A[mt] (16 x 16*KS, fragments in registers) * tile (rows k0.. are
// k, its D columns n), for MT row blocks: each B fragment loaded once serves all MT.
template <bool BF16, int D, int KS, int MT>
__device__ __forceinline__ void fa_mma_rows_b(float (*acc)[D / 8][4], const u32 (*a)[KS][4], const u16* s, int k0) {
#pragma unroll
    for (int kc = 0; kc < KS; ++kc) {
#pragma unroll
        for (int dp = 0; dp < D / 16; ++dp) {
            u32 b[4];
            fa_frag_b<D>(b, s, k0 + kc * 16, dp);
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) {
                fa_mma<BF16>(acc[mt][2 * dp], a[mt][kc], b[0], b[1]);
                fa_mma<BF16>(acc[mt][2 * dp + 1], a[mt][kc], b[2], b[3]);
            }
        }
    }
}

// acc[mt] (16 x N f32 each) = A[mt] (16 x D) * tileᵀ (N rows of D), for MT row blocks. A comes
// from registers (`areg`, when AREG) or from rows a_row0 + 16*mt.. of the shared tile `sa`.
template <bool BF16, int D, int N, int MT, bool AREG>
__device__ __forceinline__ void fa_mma_bt(float (*acc)[N / 8][4], const u32 (*areg)[D / 16][4], const u16* sa, int a_row0, const u16* s) {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
        for (int nt = 0; nt < N / 8; ++nt) acc[mt][nt][0] = acc[mt][nt][1] = acc[mt][nt][2] = acc[mt][nt][3] = 0.0f;
    }
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
        u32 a[MT][4];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
            if constexpr (AREG) {
                a[mt][0] = areg[mt][kk][0];
                a[mt][1] = areg[mt][kk][1];
                a[mt][2] = areg[mt][kk][2];
                a[mt][3] = areg[mt][kk][3];
            } else {
                fa_frag_a<D>(a[mt], sa, a_row0 + 16 * mt, kk);
            }
        }
#pragma unroll
        for (int np = 0; np < N / 16; ++np) {
            u32 b[4];
            fa_frag_bt<D>(b, s, np * 16, kk);
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) {
                fa_mma<BF16>(acc[mt][2 * np], a[mt], b[0], b[1]);
                fa_mma<BF16>(acc[mt][2 * np + 1], a[mt], b[2], b[3]);
            }
        }
    }
}

// The accumulators of a 16 x N product as A fragments (16 x 16 per k step), rounded.
template <bool BF16, int N>
__device__ __forceinline__ void fa_to_a(u32 (*a)[4], const float (*c)[4]) {
#pragma unroll
    for (int kc = 0; kc < N / 16; ++kc) {
        a[kc][0] = fa_pack<BF16>(c[2 * kc][0], c[2 * kc][1]);
        a[kc][1] = fa_pack<BF16>(c[2 * kc][2], c[2 * kc][3]);
        a[kc][2] = fa_pack<BF16>(c[2 * kc + 1][0], c[2 * kc + 1][1]);
        a[kc][3] = fa_pack<BF16>(c[2 * kc + 1][2], c[2 * kc + 1][3]);
    }
}

// acc[mt] += C[mt] * tile, with C (MT blocks of 16 x N f32 accumulators, from a product) rounded
// to A fragments first: O += P·V, dQ += dS·K, dV += Pᵀ·dO, dK += dSᵀ·Q.
template <bool BF16, int D, int N, int MT>
__device__ __forceinline__ void fa_acc_product(float (*acc)[D / 8][4], const float (*c)[N / 8][4], const u16* s) {
    u32 a[MT][N / 16][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) fa_to_a<BF16, N>(a[mt], c[mt]);
    fa_mma_rows_b<BF16, D, N / 16, MT>(acc, a, s, 0);
}

// A warp's A fragments of MT row blocks (rows row0 + 16*mt..) of a shared tile, all k steps.
template <int D, int MT>
__device__ __forceinline__ void fa_frags(u32 (*a)[D / 16][4], const u16* s, int row0) {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk) fa_frag_a<D>(a[mt][kk], s, row0 + 16 * mt, kk);
    }
}

template <int D, int MT>
__device__ __forceinline__ void fa_zero(float (*acc)[D / 8][4]) {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
        for (int dt = 0; dt < D / 8; ++dt) acc[mt][dt][0] = acc[mt][dt][1] = acc[mt][dt][2] = acc[mt][dt][3] = 0.0f;
    }
}

// Writes a warp's 16 x D f32 accumulators (times `mul`) to rows row0.. of g (rows < rows only),
// through the warp's own 16 rows of the swizzled tile `s` (local rows srow0..), 16 bytes a store.
template <bool BF16, int D>
__device__ __forceinline__ void fa_store(u16* g, u64 stride, u32 row0, u32 rows, u16* s, int srow0, const float (*acc)[4], float mul0, float mul1) {
    const int lane = threadIdx.x & 31, gr = lane >> 2, t = lane & 3;
#pragma unroll
    for (int dt = 0; dt < D / 8; ++dt) {
        *reinterpret_cast<u32*>(s + fa_off<D>(srow0 + gr, dt) + 2 * t) = fa_pack<BF16>(acc[dt][0] * mul0, acc[dt][1] * mul0);
        *reinterpret_cast<u32*>(s + fa_off<D>(srow0 + gr + 8, dt) + 2 * t) = fa_pack<BF16>(acc[dt][2] * mul1, acc[dt][3] * mul1);
    }
    __syncwarp();
    constexpr int CH = D / 8;
#pragma unroll
    for (int i = lane; i < 16 * CH; i += 32) {
        const int r = i / CH, c = i % CH;
        if (row0 + r < rows) {
            *reinterpret_cast<uint4*>(g + (u64)(row0 + r) * stride + c * 8) = *reinterpret_cast<const uint4*>(s + fa_off<D>(srow0 + r, c));
        }
    }
}

// The K/V pipeline of the forward and dQ loops: starts loading tile j + 1 into the other stage
// (when there is one), then waits for tile j and makes it visible to the whole block.
// Returns the offset of tile j's stage in sK and sV.
template <int D, int BN, int NT>
__device__ __forceinline__ int fa_next_kv(u16* sK, u16* sV, const u16* kb, const u16* vb, u64 ks, u32 j, u32 ntiles, u32 seq) {
    const int other = (j & 1) ^ 1;
    if (j + 1 < ntiles) {
        fa_load<D, BN, NT>(sK + other * BN * D, kb, ks, (j + 1) * BN, seq);
        fa_load<D, BN, NT>(sV + other * BN * D, vb, ks, (j + 1) * BN, seq);
    }
    fa_commit();
    fa_wait1();
    __syncthreads();
    return (j & 1) * BN * D;
}

// The first K/V tile of the forward and dQ loops into stage 0, after the caller committed its
// own loads (Q, and dO): waits for those and makes them visible to the whole block; tile 0 may
// still be in flight (fa_next_kv waits for it).
template <int D, int BN, int NT>
__device__ __forceinline__ void fa_first_kv(u16* sK, u16* sV, const u16* kb, const u16* vb, u64 ks, u32 seq) {
    fa_load<D, BN, NT>(sK, kb, ks, 0, seq);
    fa_load<D, BN, NT>(sV, vb, ks, 0, seq);
    fa_commit();
    fa_wait1();
    __syncthreads();
}

// Where a block of the forward or the dQ kernel stands: its query tile of BM rows (the longest
// rows first when causal), head h and batch b; the row strides of q (qs), of k and v (ks) and
// of out and dout (os); the offsets of the head's first q row (qoff) and out row (ooff); the
// key/value head's first K and V rows; the first row of this warp's RW (w0); the key tiles of
// BN the block visits.
struct FaQTile {
    u32 h, b, q0, w0, ntiles;
    u64 qs, ks, os, qoff, ooff;
    const u16* kb;
    const u16* vb;
};
template <int D, int BN, int BM, int RW>
__device__ __forceinline__ FaQTile fa_qtile(const u16* k, const u16* v, u32 seq, u32 heads, u32 kv_heads, u32 qld, u32 kvld, u32 causal, int warp) {
    FaQTile g;
    const u32 qtiles = (seq + BM - 1) / BM;
    const u32 qt = causal ? qtiles - 1 - blockIdx.x : blockIdx.x;
    g.h = blockIdx.y;
    g.b = blockIdx.z;
    const u32 kvh = g.h / (heads / kv_heads);
    g.qs = qld;
    g.ks = kvld;
    g.os = (u64)heads * D;
    g.qoff = (u64)g.b * seq * g.qs + (u64)g.h * D;
    g.ooff = (u64)g.b * seq * g.os + (u64)g.h * D;
    g.kb = k + (u64)g.b * seq * g.ks + (u64)kvh * D;
    g.vb = v + (u64)g.b * seq * g.ks + (u64)kvh * D;
    g.q0 = qt * BM;
    g.w0 = g.q0 + warp * RW;
    const u32 kend = causal ? fa_min(seq, g.q0 + BM) : seq;
    g.ntiles = (kend + BN - 1) / BN;
    return g;
}

// ------------------------------------------------------------------------------ forward
//
// Each warp owns RW = 16 * MT query rows (MT row blocks share every K/V fragment it loads), a
// block BM = RW * NW rows; BN keys a tile. Shared: Q (BM x D), then two stages of K and V (BN x
// D each). Q's fragments stay in registers when they are few (QREG), else they are re-read.
template <bool BF16, int D, int BN, int NW, int MT>
__device__ __forceinline__ void fa_fwd(u16* out, float* lse, const u16* q, const u16* k, const u16* v, u32 seq, u32 heads, u32 kv_heads, u32 qld, u32 kvld, u32 causal, float scale) {
    constexpr int RW = 16 * MT, BM = RW * NW, NT = NW * 32;
    constexpr bool QREG = MT * D <= 128;
    u16* sQ = reinterpret_cast<u16*>(fa_smem);
    u16* sK = sQ + BM * D;
    u16* sV = sK + 2 * BN * D;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, gr = lane >> 2, t = lane & 3;
    const FaQTile g = fa_qtile<D, BN, BM, RW>(k, v, seq, heads, kv_heads, qld, kvld, causal, warp);
    const u32 h = g.h, b = g.b, w0 = g.w0, ntiles = g.ntiles;
    const u64 qs = g.qs;

    fa_load<D, BM, NT>(sQ, q + g.qoff, qs, g.q0, seq);
    fa_commit();
    fa_first_kv<D, BN, NT>(sK, sV, g.kb, g.vb, g.ks, seq);
    u32 qf[QREG ? MT : 1][D / 16][4];
    if constexpr (QREG) fa_frags<D, MT>(qf, sQ, warp * RW);

    float o[MT][D / 8][4];
    fa_zero<D, MT>(o);
    float m[MT][2], l[MT][2];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) m[mt][0] = m[mt][1] = FA_NEG_INF, l[mt][0] = l[mt][1] = 0.0f;
    const float sl2 = scale * FA_LOG2E;

    for (u32 j = 0; j < ntiles; ++j) {
        const int st = fa_next_kv<D, BN, NT>(sK, sV, g.kb, g.vb, g.ks, j, ntiles, seq);
        const u16* cK = sK + st;
        const u16* cV = sV + st;
        float s[MT][BN / 8][4];
        fa_mma_bt<BF16, D, BN, MT, QREG>(s, qf, sQ, warp * RW, cK);
        const u32 k0 = j * BN;
        if (k0 + BN > seq || (causal && k0 + BN - 1 > w0)) {
            FA_EACH_ELEM(MT, BN) {
                const u32 col = k0 + nt * 8 + 2 * t + (e & 1), row = w0 + mt * 16 + gr + 8 * (e >> 1);
                if (col >= seq || (causal && col > row)) s[mt][nt][e] = FA_NEG_INF;
            }
        }
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
            for (int i = 0; i < 2; ++i) {
                float mx = FA_NEG_INF;
#pragma unroll
                for (int nt = 0; nt < BN / 8; ++nt) mx = fmaxf(mx, fmaxf(s[mt][nt][2 * i], s[mt][nt][2 * i + 1]));
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
                const float mnew = fmaxf(m[mt][i], mx * sl2);
                const float base = mnew == FA_NEG_INF ? 0.0f : mnew;
                const float alpha = fa_exp2(m[mt][i] - base);
                m[mt][i] = mnew;
                float sum = 0.0f;
#pragma unroll
                for (int nt = 0; nt < BN / 8; ++nt) {
                    s[mt][nt][2 * i] = fa_exp2(s[mt][nt][2 * i] * sl2 - base);
                    s[mt][nt][2 * i + 1] = fa_exp2(s[mt][nt][2 * i + 1] * sl2 - base);
                    sum += s[mt][nt][2 * i] + s[mt][nt][2 * i + 1];
                }
                l[mt][i] = l[mt][i] * alpha + sum;
#pragma unroll
                for (int dt = 0; dt < D / 8; ++dt) {
                    o[mt][dt][2 * i] *= alpha;
                    o[mt][dt][2 * i + 1] *= alpha;
                }
            }
        }
        fa_acc_product<BF16, D, BN, MT>(o, s, cV);
        __syncthreads();
    }
    fa_wait0();

    u16* ob = out + g.ooff;
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
        float inv[2];
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            float li = l[mt][i];
            li += __shfl_xor_sync(0xffffffffu, li, 1);
            li += __shfl_xor_sync(0xffffffffu, li, 2);
            inv[i] = li > 0.0f ? 1.0f / li : 0.0f;
            const u32 row = w0 + mt * 16 + gr + 8 * i;
            if (t == 0 && row < seq) {
                lse[((u64)b * heads + h) * seq + row] = li > 0.0f ? (m[mt][i] + __log2f(li)) * FA_LN2 : FA_NEG_INF;
            }
        }
        fa_store<BF16, D>(ob, g.os, w0 + mt * 16, seq, sQ, warp * RW + mt * 16, o[mt], inv[0], inv[1]);
    }
}

// ------------------------------------------------------------------------------ backward

// dsum[b, h, s] = sum over the head's d columns of dout * out. Each thread takes 16 bytes (8
// values) of one (token, head) row, the d / 8 threads of a row sum theirs with shuffles (d is 64
// or 128, and every row starts 16-byte aligned), so the loads are whole and coalesced. Every
// lane of a warp runs the same iterations (the shuffles need them all).
template <typename T>
__device__ __forceinline__ void fa_bwd_prep(float* dsum, const T* dout, const T* out, u32 tokens, u32 seq, u32 heads, u32 d) {
    const u32 g = d / 8;  // threads a row: 8 or 16
    const u64 total = (u64)tokens * heads * g, stride = (u64)gridDim.x * blockDim.x;
    for (u64 base = (u64)blockIdx.x * blockDim.x; base < total; base += stride) {
        const u64 i = base + threadIdx.x;
        float acc = 0.0f;
        if (i < total) {
            Pack<T> pa, po;
            pa.raw = reinterpret_cast<const uint4*>(dout)[i];
            po.raw = reinterpret_cast<const uint4*>(out)[i];
#pragma unroll
            for (u32 k = 0; k < 8; ++k) acc += ld(pa.e, k) * ld(po.e, k);
        }
        for (u32 o = g / 2; o > 0; o /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, o);
        if (i < total && i % g == 0) {
            const u64 row = i / g, tok = row / heads, h = row % heads, b = tok / seq, s = tok % seq;
            dsum[(b * heads + h) * seq + s] = acc;
        }
    }
}

// dQ for a tile of BM = 16 * MT * NW query rows (RW = 16 * MT a warp), over the key tiles.
// Shared: Q, dO (BM x D), two stages of K and V (BN x D). Q's and dO's fragments stay in
// registers when they are few (FREG).
template <bool BF16, int D, int BN, int NW, int MT>
__device__ __forceinline__ void fa_bwd_dq(u16* dq, const u16* q, const u16* k, const u16* v, const u16* dout, const float* lse, const float* dsum, u32 seq, u32 heads, u32 kv_heads, u32 qld, u32 kvld, u32 causal, float scale) {
    constexpr int RW = 16 * MT, BM = RW * NW, NT = NW * 32;
    constexpr bool FREG = MT * D <= 128;
    u16* sQ = reinterpret_cast<u16*>(fa_smem);
    u16* sO = sQ + BM * D;
    u16* sK = sO + BM * D;
    u16* sV = sK + 2 * BN * D;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, gr = lane >> 2, t = lane & 3;
    const FaQTile g = fa_qtile<D, BN, BM, RW>(k, v, seq, heads, kv_heads, qld, kvld, causal, warp);
    const u32 h = g.h, b = g.b, w0 = g.w0, ntiles = g.ntiles;
    const u64 qs = g.qs, qoff = g.qoff;

    fa_load<D, BM, NT>(sQ, q + qoff, qs, g.q0, seq);
    fa_load<D, BM, NT>(sO, dout + g.ooff, g.os, g.q0, seq);
    fa_commit();
    fa_first_kv<D, BN, NT>(sK, sV, g.kb, g.vb, g.ks, seq);
    u32 qf[FREG ? MT : 1][D / 16][4], df[FREG ? MT : 1][D / 16][4];
    if constexpr (FREG) {
        fa_frags<D, MT>(qf, sQ, warp * RW);
        fa_frags<D, MT>(df, sO, warp * RW);
    }
    const float sl2 = scale * FA_LOG2E;
    float lse2[MT][2], dd[MT][2];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            const u64 at = ((u64)b * heads + h) * seq + fa_min(w0 + mt * 16 + gr + 8 * i, seq - 1);
            lse2[mt][i] = lse[at] * FA_LOG2E;
            dd[mt][i] = dsum[at];
        }
    }
    float acc[MT][D / 8][4];
    fa_zero<D, MT>(acc);

    for (u32 j = 0; j < ntiles; ++j) {
        const int st = fa_next_kv<D, BN, NT>(sK, sV, g.kb, g.vb, g.ks, j, ntiles, seq);
        const u16* cK = sK + st;
        const u16* cV = sV + st;
        float s[MT][BN / 8][4], dp[MT][BN / 8][4];
        fa_mma_bt<BF16, D, BN, MT, FREG>(s, qf, sQ, warp * RW, cK);
        fa_mma_bt<BF16, D, BN, MT, FREG>(dp, df, sO, warp * RW, cV);
        const u32 k0 = j * BN;
        const bool edge = k0 + BN > seq || (causal && k0 + BN - 1 > w0);
        FA_EACH_ELEM(MT, BN) {
            const int i = e >> 1;
            const u32 col = k0 + nt * 8 + 2 * t + (e & 1), row = w0 + mt * 16 + gr + 8 * i;
            const bool masked = edge && (col >= seq || (causal && col > row));
            const float p = masked ? 0.0f : fa_exp2(s[mt][nt][e] * sl2 - lse2[mt][i]);
            s[mt][nt][e] = p * (dp[mt][nt][e] - dd[mt][i]);
        }
        fa_acc_product<BF16, D, BN, MT>(acc, s, cK);
        __syncthreads();
    }
    fa_wait0();
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) fa_store<BF16, D>(dq + qoff, qs, w0 + mt * 16, seq, sQ, warp * RW + mt * 16, acc[mt], scale, scale);
}

// dK and dV for a tile of BN = 16 * MT * NW keys (RW = 16 * MT a warp), over the query tiles
// (BM rows) of every query head of its group. Shared: K, V (BN x D), two stages of Q and dO
// (BM x D) and of lse, dsum (BM). With two row blocks a warp the tile is taken QC = 16 queries
// at a time (small S and dP, so the 32 keys' accumulators fit) with K's fragments in registers;
// a chunk entirely above the diagonal is skipped.
template <bool BF16, int D, int BM, int NW, int MT>
__device__ __forceinline__ void fa_bwd_dkdv(u16* dk, u16* dv, const u16* q, const u16* k, const u16* v, const u16* dout, const float* lse, const float* dsum, u32 seq, u32 heads, u32 kv_heads, u32 qld, u32 kvld, u32 causal, float scale) {
    constexpr int RW = 16 * MT, BN = RW * NW, NT = NW * 32;
    constexpr int QC = MT == 1 ? BM : 16;
    constexpr bool KREG = QC == 16 && MT * D <= 128;
    u16* sK = reinterpret_cast<u16*>(fa_smem);
    u16* sV = sK + BN * D;
    u16* sQ = sV + BN * D;
    u16* sO = sQ + 2 * BM * D;
    float* sL = reinterpret_cast<float*>(sO + 2 * BM * D);
    float* sD = sL + 2 * BM;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, gr = lane >> 2, t = lane & 3;
    const u32 kvh = blockIdx.y, b = blockIdx.z, group = heads / kv_heads;
    const u64 qs = qld, ks = kvld, os = (u64)heads * D;
    const u64 koff = (u64)b * seq * ks + (u64)kvh * D;
    const u32 k0 = blockIdx.x * BN, w0 = k0 + warp * RW;
    const u32 qtiles = (seq + BM - 1) / BM;
    const u32 first = causal ? k0 / BM : 0;  // the first query tile that sees these keys
    const u32 per_head = qtiles - first, iters = per_head * group;

    fa_load<D, BN, NT>(sK, k + koff, ks, k0, seq);
    fa_load<D, BN, NT>(sV, v + koff, ks, k0, seq);
    fa_commit();
    auto load_q = [&](u32 it, int st) {
        const u32 h = kvh * group + it / per_head, q0 = (first + it % per_head) * BM;
        const u64 qoff = (u64)b * seq * qs + (u64)h * D, ooff = (u64)b * seq * os + (u64)h * D;
        const u64 loff = ((u64)b * heads + h) * seq;
        fa_load<D, BM, NT>(sQ + st * BM * D, q + qoff, qs, q0, seq);
        fa_load<D, BM, NT>(sO + st * BM * D, dout + ooff, os, q0, seq);
        fa_load_f32<BM, NT>(sL + st * BM, lse + loff, q0, seq);
        fa_load_f32<BM, NT>(sD + st * BM, dsum + loff, q0, seq);
    };
    load_q(0, 0);
    fa_commit();

    float dka[MT][D / 8][4], dva[MT][D / 8][4];
    fa_zero<D, MT>(dka);
    fa_zero<D, MT>(dva);
    u32 kf[KREG ? MT : 1][D / 16][4];
    const float sl2 = scale * FA_LOG2E;

    for (u32 it = 0; it < iters; ++it) {
        const int st = it & 1;
        if (it + 1 < iters) load_q(it + 1, st ^ 1);
        fa_commit();
        fa_wait1();
        __syncthreads();
        if constexpr (KREG) {
            if (it == 0) fa_frags<D, MT>(kf, sK, warp * RW);
        }
        const u32 q0 = (first + it % per_head) * BM;
#pragma unroll 1
        for (int c = 0; c < BM / QC; ++c) {
            const u32 c0 = q0 + c * QC;  // this chunk's first query
            if (causal && c0 + QC - 1 < w0) continue;  // every query before every key of the warp
            const u16* cQ = sQ + st * BM * D + c * QC * D;
            const u16* cO = sO + st * BM * D + c * QC * D;
            const float* cL = sL + st * BM + c * QC;
            const float* cD = sD + st * BM + c * QC;
            // Sᵀ = K·Qᵀ and dPᵀ = V·dOᵀ (RW keys x QC queries a warp).
            float s[MT][QC / 8][4], dp[MT][QC / 8][4];
            fa_mma_bt<BF16, D, QC, MT, KREG>(s, kf, sK, warp * RW, cQ);
            fa_mma_bt<BF16, D, QC, MT, false>(dp, nullptr, sV, warp * RW, cO);
            // Two forms (`edge` is the same for the warp): one loop for both, the mask
            // `edge && (...)`, compiled to a branch and a convergence barrier an element, each
            // element's lse load and exp2 waiting for the one before (as in flash_hopper.cu).
            const bool edge = c0 + QC > seq || (causal && c0 < w0 + RW - 1);
            if (edge) {
                FA_EACH_ELEM(MT, QC) {
                    const int qc = nt * 8 + 2 * t + (e & 1);
                    const u32 qi = c0 + qc, key = w0 + mt * 16 + gr + 8 * (e >> 1);
                    const bool masked = qi >= seq || (causal && qi < key);
                    const float p = masked ? 0.0f : fa_exp2(s[mt][nt][e] * sl2 - cL[qc] * FA_LOG2E);
                    s[mt][nt][e] = p;
                    dp[mt][nt][e] = p * (dp[mt][nt][e] - cD[qc]);
                }
            } else {
                FA_EACH_ELEM(MT, QC) {
                    const int qc = nt * 8 + 2 * t + (e & 1);
                    const float p = fa_exp2(s[mt][nt][e] * sl2 - cL[qc] * FA_LOG2E);
                    s[mt][nt][e] = p;
                    dp[mt][nt][e] = p * (dp[mt][nt][e] - cD[qc]);
                }
            }
            fa_acc_product<BF16, D, QC, MT>(dva, s, cO);
            fa_acc_product<BF16, D, QC, MT>(dka, dp, cQ);
        }
        __syncthreads();
    }
    fa_wait0();
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
        fa_store<BF16, D>(dk + koff, ks, w0 + mt * 16, seq, sK, warp * RW + mt * 16, dka[mt], scale, scale);
        fa_store<BF16, D>(dv + koff, ks, w0 + mt * 16, seq, sV, warp * RW + mt * 16, dva[mt], 1.0f, 1.0f);
    }
}

// ------------------------------------------------------------------------------ entry points
//
// Tile shapes: the host passes -DFA_<KIND><D>=tile,warps,mt for the forward (keys a tile, warps
// of 16 * mt query rows), dQ (the same) and dK/dV (queries a tile, warps of 16 * mt keys) at D =
// 64 and 128
// (FlashTiles in backend/kernels.rs, which also sizes the grids and shared memory). Below
// sm_80 (no bf16 mma, ldmatrix or cp.async) the entry points are empty and the op refuses the
// device before launching.
#if !defined(FA_FWD64) || !defined(FA_FWD128) || !defined(FA_DQ64) || !defined(FA_DQ128) || !defined(FA_DKV64) || !defined(FA_DKV128)
#error "flash.cu needs the tile shapes: -DFA_FWD64=tile,warps,mt and the other five (FlashTiles)"
#endif
// The small-grid builds at head dim 64 (`_s_` in their names): narrower tiles for calls with few
// (batch, head) pairs, where more, shorter blocks balance the causal rows' unequal work.
#if !defined(FA_FWDS64) || !defined(FA_DQS64) || !defined(FA_DKVS64)
#error "flash.cu needs the small-grid tile shapes: -DFA_FWDS64=tile,warps,mt, FA_DQS64, FA_DKVS64 (FlashTiles)"
#endif
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
#define FA_BODY(...) __VA_ARGS__
#else
#define FA_BODY(...)
#endif

#define FA_NW(A, B, C) B
#define FA_NW_OF(CFG) FA_NW(CFG)

extern "C" __global__ void __launch_bounds__(32 * FA_NW_OF(FA_FWD64)) flash_fwd_bf16_d64(u16* out, float* lse, const u16* q, const u16* k, const u16* v, u32 seq, u32 heads, u32 kv_heads, u32 qld, u32 kvld, u32 causal, float scale) { GR_PDL_ENTRY(); FA_BODY(fa_fwd<true, 64, FA_FWD64>(out, lse, q, k, v, seq, heads, kv_heads, qld, kvld, causal, scale);) }
extern "C" __global__ void __launch_bounds__(32 * FA_NW_OF(FA_FWD128)) flash_fwd_bf16_d128(u16* out, float* lse, const u16* q, const u16* k, const u16* v, u32 seq, u32 heads, u32 kv_heads, u32 qld, u32 kvld, u32 causal, float scale) { GR_PDL_ENTRY(); FA_BODY(fa_fwd<true, 128, FA_FWD128>(out, lse, q, k, v, seq, heads, kv_heads, qld, kvld, causal, scale);) }
extern "C" __global__ void __launch_bounds__(32 * FA_NW_OF(FA_FWD64)) flash_fwd_f16_d64(u16* out, float* lse, const u16* q, const u16* k, const u16* v, u32 seq, u32 heads, u32 kv_heads, u32 qld, u32 kvld, u32 causal, float scale) { GR_PDL_ENTRY(); FA_BODY(fa_fwd<false, 64, FA_FWD64>(out, lse, q, k, v, seq, heads, kv_heads, qld, kvld, causal, scale);) }
extern "C" __global__ void __launch_bounds__(32 * FA_NW_OF(FA_FWD128)) flash_fwd_f16_d128(u16* out, float* lse, const u16* q, const u16* k, const u16* v, u32 seq, u32 heads, u32 kv_heads, u32 qld, u32 kvld, u32 causal, float scale) { GR_PDL_ENTRY(); FA_BODY(fa_fwd<false, 128, FA_FWD128>(out, lse, q, k, v, seq, heads, kv_heads, qld, kvld, causal, scale);) }

extern "C" __global__ void flash_bwd_prep_bf16(float* dsum, const bf16_t* dout, const bf16_t* out, u32 tokens, u32 seq, u32 heads, u32 d) { GR_PDL_ENTRY(); fa_bwd_prep(dsum, dout, out, tokens, seq, heads, d); }
extern "C" __global__ void flash_bwd_prep_f16(float* dsum, const f16_t* dout, const f16_t* out, u32 tokens, u32 seq, u32 heads, u32 d) { GR_PDL_ENTRY(); fa_bwd_prep(dsum, dout, out, tokens, seq, heads, d); }

extern "C" __global__ void __launch_bounds__(32 * FA_NW_OF(FA_DQ64)) flash_bwd_dq_bf16_d64(u16* dq, const u16* q, const u16* k, const u16* v, const u16* dout, const float* lse, const float* dsum, u32 seq, u32 heads, u32 kv_heads, u32 qld, u32 kvld, u32 causal, float scale) { GR_PDL_ENTRY(); FA_BODY(fa_bwd_dq<true, 64, FA_DQ64>(dq, q, k, v, dout, lse, dsum, seq, heads, kv_heads, qld, kvld, causal, scale);) }
extern "C" __global__ void __launch_bounds__(32 * FA_NW_OF(FA_DQ128)) flash_bwd_dq_bf16_d128(u16* dq, const u16* q, const u16* k, const u16* v, const u16* dout, const float* lse, const float* dsum, u32 seq, u32 heads, u32 kv_heads, u32 qld, u32 kvld, u32 causal, float scale) { GR_PDL_ENTRY(); FA_BODY(fa_bwd_dq<true, 128, FA_DQ128>(dq, q, k, v, dout, lse, dsum, seq, heads, kv_heads, qld, kvld, causal, scale);) }
extern "C" __global__ void __launch_bounds__(32 * FA_NW_OF(FA_DQ64)) flash_bwd_dq_f16_d64(u16* dq, const u16* q, const u16* k, const u16* v, const u16* dout, const float* lse, const float* dsum, u32 seq, u32 heads, u32 kv_heads, u32 qld, u32 kvld, u32 causal, float scale) { GR_PDL_ENTRY(); FA_BODY(fa_bwd_dq<false, 64, FA_DQ64>(dq, q, k, v, dout, lse, dsum, seq, heads, kv_heads, qld, kvld, causal, scale);) }
extern "C" __global__ void __launch_bounds__(32 * FA_NW_OF(FA_DQ128)) flash_bwd_dq_f16_d128(u16* dq, const u16* q, const u16* k, const u16* v, const u16* dout, const float* lse, const float* dsum, u32 seq, u32 heads, u32 kv_heads, u32 qld, u32 kvld, u32 causal, float scale) { GR_PDL_ENTRY(); FA_BODY(fa_bwd_dq<false, 128, FA_DQ128>(dq, q, k, v, dout, lse, dsum, seq, heads, kv_heads, qld, kvld, causal, scale);) }

extern "C" __global__ void __launch_bounds__(32 * FA_NW_OF(FA_DKV64)) flash_bwd_dkdv_bf16_d64(u16* dk, u16* dv, const u16* q, const u16* k, const u16* v, const u16* dout, const float* lse, const float* dsum, u32 seq, u32 heads, u32 kv_heads, u32 qld, u32 kvld, u32 causal, float scale) { GR_PDL_ENTRY(); FA_BODY(fa_bwd_dkdv<true, 64, FA_DKV64>(dk, dv, q, k, v, dout, lse, dsum, seq, heads, kv_heads, qld, kvld, causal, scale);) }
extern "C" __global__ void __launch_bounds__(32 * FA_NW_OF(FA_DKV128)) flash_bwd_dkdv_bf16_d128(u16* dk, u16* dv, const u16* q, const u16* k, const u16* v, const u16* dout, const float* lse, const float* dsum, u32 seq, u32 heads, u32 kv_heads, u32 qld, u32 kvld, u32 causal, float scale) { GR_PDL_ENTRY(); FA_BODY(fa_bwd_dkdv<true, 128, FA_DKV128>(dk, dv, q, k, v, dout, lse, dsum, seq, heads, kv_heads, qld, kvld, causal, scale);) }
extern "C" __global__ void __launch_bounds__(32 * FA_NW_OF(FA_DKV64)) flash_bwd_dkdv_f16_d64(u16* dk, u16* dv, const u16* q, const u16* k, const u16* v, const u16* dout, const float* lse, const float* dsum, u32 seq, u32 heads, u32 kv_heads, u32 qld, u32 kvld, u32 causal, float scale) { GR_PDL_ENTRY(); FA_BODY(fa_bwd_dkdv<false, 64, FA_DKV64>(dk, dv, q, k, v, dout, lse, dsum, seq, heads, kv_heads, qld, kvld, causal, scale);) }
extern "C" __global__ void __launch_bounds__(32 * FA_NW_OF(FA_DKV128)) flash_bwd_dkdv_f16_d128(u16* dk, u16* dv, const u16* q, const u16* k, const u16* v, const u16* dout, const float* lse, const float* dsum, u32 seq, u32 heads, u32 kv_heads, u32 qld, u32 kvld, u32 causal, float scale) { GR_PDL_ENTRY(); FA_BODY(fa_bwd_dkdv<false, 128, FA_DKV128>(dk, dv, q, k, v, dout, lse, dsum, seq, heads, kv_heads, qld, kvld, causal, scale);) }

extern "C" __global__ void __launch_bounds__(32 * FA_NW_OF(FA_FWDS64)) flash_fwd_s_bf16_d64(u16* out, float* lse, const u16* q, const u16* k, const u16* v, u32 seq, u32 heads, u32 kv_heads, u32 qld, u32 kvld, u32 causal, float scale) { GR_PDL_ENTRY(); FA_BODY(fa_fwd<true, 64, FA_FWDS64>(out, lse, q, k, v, seq, heads, kv_heads, qld, kvld, causal, scale);) }
extern "C" __global__ void __launch_bounds__(32 * FA_NW_OF(FA_DQS64)) flash_bwd_dq_s_bf16_d64(u16* dq, const u16* q, const u16* k, const u16* v, const u16* dout, const float* lse, const float* dsum, u32 seq, u32 heads, u32 kv_heads, u32 qld, u32 kvld, u32 causal, float scale) { GR_PDL_ENTRY(); FA_BODY(fa_bwd_dq<true, 64, FA_DQS64>(dq, q, k, v, dout, lse, dsum, seq, heads, kv_heads, qld, kvld, causal, scale);) }
extern "C" __global__ void __launch_bounds__(32 * FA_NW_OF(FA_DKVS64)) flash_bwd_dkdv_s_bf16_d64(u16* dk, u16* dv, const u16* q, const u16* k, const u16* v, const u16* dout, const float* lse, const float* dsum, u32 seq, u32 heads, u32 kv_heads, u32 qld, u32 kvld, u32 causal, float scale) { GR_PDL_ENTRY(); FA_BODY(fa_bwd_dkdv<true, 64, FA_DKVS64>(dk, dv, q, k, v, dout, lse, dsum, seq, heads, kv_heads, qld, kvld, causal, scale);) }
extern "C" __global__ void __launch_bounds__(32 * FA_NW_OF(FA_FWDS64)) flash_fwd_s_f16_d64(u16* out, float* lse, const u16* q, const u16* k, const u16* v, u32 seq, u32 heads, u32 kv_heads, u32 qld, u32 kvld, u32 causal, float scale) { GR_PDL_ENTRY(); FA_BODY(fa_fwd<false, 64, FA_FWDS64>(out, lse, q, k, v, seq, heads, kv_heads, qld, kvld, causal, scale);) }
extern "C" __global__ void __launch_bounds__(32 * FA_NW_OF(FA_DQS64)) flash_bwd_dq_s_f16_d64(u16* dq, const u16* q, const u16* k, const u16* v, const u16* dout, const float* lse, const float* dsum, u32 seq, u32 heads, u32 kv_heads, u32 qld, u32 kvld, u32 causal, float scale) { GR_PDL_ENTRY(); FA_BODY(fa_bwd_dq<false, 64, FA_DQS64>(dq, q, k, v, dout, lse, dsum, seq, heads, kv_heads, qld, kvld, causal, scale);) }
extern "C" __global__ void __launch_bounds__(32 * FA_NW_OF(FA_DKVS64)) flash_bwd_dkdv_s_f16_d64(u16* dk, u16* dv, const u16* q, const u16* k, const u16* v, const u16* dout, const float* lse, const float* dsum, u32 seq, u32 heads, u32 kv_heads, u32 qld, u32 kvld, u32 causal, float scale) { GR_PDL_ENTRY(); FA_BODY(fa_bwd_dkdv<false, 64, FA_DKVS64>(dk, dv, q, k, v, dout, lse, dsum, seq, heads, kv_heads, qld, kvld, causal, scale);) }
