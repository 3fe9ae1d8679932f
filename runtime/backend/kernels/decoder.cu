// One decoding step of a pre-norm decoder in ONE kernel (ops::DecoderStep): token and position
// embeddings, then per layer RMSNorm, the q/k/v projection with the step's keys and values
// appended to the layer's KV cache, attention of the new token against its cache, the output
// projection and the residual add, RMSNorm, the gate/up projection with SwiGLU, the down
// projection and the residual add; then the final RMSNorm and the head's logits. At small
// batches a decoding step is all latency (the GPT of examples/gpt: 8 layers of 6 MB, 8 kernels
// a layer of 4-6 us each), so this kernel is persistent: one block a multiprocessor, launched
// cooperatively (the driver guarantees every block is resident), the stages separated by a
// grid-wide barrier of ours (1 + 5 a layer).
//
// NVRTC compiles this file after core.cu, ops.cu and half.cu (u32, u64, warp_sum, gr_neg_inf,
// bf16_t, ld/st, f32_to_bf16_bits come from there), with these defines: FD_D (d_model), FD_HEADS,
// FD_HID (the MLP's hidden width), and FD_WBUF_BYTES, FD_ABUF_BYTES, FD_NT (below). Storage is
// bf16; every GEMM runs on tensor cores (mma.sync m16n8k16, f32 accumulation), n8 tiles of
// output columns as block tasks (FD_NT a pass), the K steps shared by the block's 8 warps and
// summed through shared memory in warp order: no atomics on data, the
// order depends on the sizes only, so the step is bitwise reproducible (eager == graphed).
// Intermediates round to bf16 where the unfused ops store them (x, the normed rows, q/k/v, the
// attention output, each projection's output, the residual sums, SwiGLU's output, the logits).
//
// Buffers written by one block and read by others inside the kernel (the residual stream x, q,
// the attention output, SwiGLU's output, the caches and the lengths) are read with ld.global.cg
// (L2, never a stale L1 line) or staged into shared memory once a stage; the weights are copied
// into shared memory (cp.async) during the barrier before their stage, or read with plain loads
// where they do not fit.

#if !defined(FD_D) || !defined(FD_HEADS) || !defined(FD_HID)
#error "FD_D, FD_HEADS and FD_HID must be defined"
#endif
#define FD_HD (FD_D / FD_HEADS)
#define FD_WARPS 8
#define FD_THREADS (FD_WARPS * 32)
// The most sequences a step takes: four m16 tiles.
#define FD_MT 4
// The bytes of dynamic shared memory that hold a GEMM stage's weight rows (the host launches
// with this much): each stage's rows are copied there (cp.async) while the grid waits at the
// barrier before the stage, so a stage starts with its weights on chip and waits only for its
// activations. 0 reads every weight from global memory as it goes.
#ifndef FD_WBUF_BYTES
#define FD_WBUF_BYTES 0
#endif
// The bytes of dynamic shared memory (after the weights') that hold a GEMM stage's activation
// rows, read once a stage with 16-byte loads (the RMSNorm applied) where they fit (batch rows of
// K / 2 words, padded as the weights'), instead of once a tile pass and warp from L2.
#ifndef FD_ABUF_BYTES
#define FD_ABUF_BYTES 0
#endif
// The n8 tiles a block computes in one pass over K (sharing the activation loads).
#ifndef FD_NT
#define FD_NT 2
#endif

// The table the host writes once (ops::DecoderStep::new): a header, then one FdLayer a layer.
struct FdHeader {
    const bf16_t* tok;
    const bf16_t* pos;
    const bf16_t* head_norm;
    const bf16_t* head;
    u32 layers, vocab, ctx, max_len;
};
struct FdLayer {
    const bf16_t* norm1;
    const bf16_t* qkv;      // [3 D, D]: q, k, v rows
    const bf16_t* wo;       // [D, D]
    const bf16_t* norm2;
    const bf16_t* gate_up;  // [2 HID, D]: gate rows, then up rows
    const bf16_t* down;     // [D, HID]
    bf16_t* kc;             // [cache batch, HEADS, max_len, HD]
    bf16_t* vc;
    int* lengths;           // [cache batch]
};

// Same layout and rules as decode.cu's and transformer.cu's reports (CudaBackend reads them).
__device__ __forceinline__ void fd_report_cache(u32* err, u32 seq, int len, u32 max_len) {
    atomicMin(reinterpret_cast<unsigned long long*>(err + 4), ((u64)seq << 32) | (u64)(u32)len);
    atomicMax(err + 6, max_len);
    atomicOr(err + 7, 2u);
}
__device__ __forceinline__ void fd_report_token(u32* err, u64 pos, float id, u32 vocab) {
    atomicMin(reinterpret_cast<unsigned long long*>(err), (pos << 32) | (u64)__float_as_uint(id));
    atomicMax(err + 2, vocab);
    atomicOr(err + 3, 1u);
}
__device__ __forceinline__ long long fd_row(float id, u32 vocab) {
    return (id >= 0.0f && id < (float)vocab && id == floorf(id)) ? (long long)id : -1;
}

__device__ __forceinline__ u32 fd_ld32cg(const void* p) {
    u32 v;
    asm volatile("ld.global.cg.b32 %0, [%1];" : "=r"(v) : "l"(p));
    return v;
}
__device__ __forceinline__ uint4 fd_ld128cg(const void* p) {
    uint4 v;
    asm volatile("ld.global.cg.v4.b32 {%0,%1,%2,%3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    return v;
}
__device__ __forceinline__ int fd_ldi_cg(const int* p) { return (int)fd_ld32cg(p); }
__device__ __forceinline__ float fd_lo(u32 w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float fd_hi(u32 w) { return __uint_as_float(w & 0xffff0000u); }
__device__ __forceinline__ u32 fd_pack(float lo, float hi) {
    return (u32)f32_to_bf16_bits(lo) | ((u32)f32_to_bf16_bits(hi) << 16);
}
__device__ __forceinline__ float fd_round(float v) { return __uint_as_float(((u32)f32_to_bf16_bits(v)) << 16); }
__device__ __forceinline__ float fd_ldcg(const bf16_t* p, u64 i) {
    u16 h;
    asm volatile("ld.global.cg.b16 %0, [%1];" : "=h"(h) : "l"(p + i));
    return __uint_as_float(((u32)h) << 16);
}
__device__ __forceinline__ void fd_st(bf16_t* p, u64 i, float v) { p[i].x = f32_to_bf16_bits(v); }

__device__ __forceinline__ void fd_mma(float* c, u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
    // Not volatile: a pure function of its registers, so the compiler may issue the next K
    // steps' loads (volatile, kept in order among themselves) before it.
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// The grid-wide barrier: one 64-bit count of arrivals that only grows (it never wraps). Each
// launch adds gridDim.x a barrier, so it is a multiple of gridDim.x when a launch starts; a
// block's thread 0 reads it before its first arrival (fd_sync_base: no block can pass the first
// barrier before it arrives, so the value is the launch's base plus fewer than gridDim.x) and
// waits, barrier after barrier, for base + gridDim.x * (barriers so far). One relaxed add an
// arrival after a release fence, relaxed polls then an acquire fence: the writes of every block
// before the barrier are visible to every block after it.
__device__ __forceinline__ unsigned long long fd_ld_relaxed(const unsigned long long* p) {
    unsigned long long v;
    asm volatile("ld.relaxed.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ unsigned long long fd_sync_base(const unsigned long long* bar) {
    if (threadIdx.x != 0) return 0ull;
    const unsigned long long v = fd_ld_relaxed(bar);
    return v - v % gridDim.x;
}
__device__ __forceinline__ void fd_sync(unsigned long long* bar, unsigned long long& target) {
    __syncthreads();
    if (threadIdx.x == 0) {
        target += gridDim.x;
        asm volatile("fence.acq_rel.gpu;" ::: "memory");
        asm volatile("red.relaxed.gpu.global.add.u64 [%0], 1;" ::"l"(bar) : "memory");
        while (fd_ld_relaxed(bar) < target) {
        }
        asm volatile("fence.acq_rel.gpu;" ::: "memory");
    }
    __syncthreads();
}

struct FdShared {
    float red[FD_WARPS][2][FD_MT][16][8];  // the warps' partial tiles (two operands)
    float rstd[FD_MT * 16];
    int len[FD_MT * 16];  // the lengths at the q/k/v stage (where its keys and values go)
    float am[FD_WARPS], al[FD_WARPS];
    float aacc[FD_WARPS][FD_HD];
};

// rstd of each of the first `batch` rows of x ([batch, FD_D]) into sh.rstd: one warp a row,
// each lane's squares in order, then the butterfly.
__device__ __forceinline__ void fd_rstd(FdShared& sh, const bf16_t* x, u32 batch, float eps) {
    const u32 lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (u32 b = warp; b < batch; b += FD_WARPS) {
        float s = 0.0f;
        for (u32 c = lane; c < FD_D / 8; c += 32) {
            const uint4 v = fd_ld128cg(x + (u64)b * FD_D + c * 8);
            const u32 w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const float lo = fd_lo(w[i]), hi = fd_hi(w[i]);
                s += lo * lo;
                s += hi * hi;
            }
        }
        s = warp_sum(s);
        if (lane == 0) sh.rstd[b] = 1.0f / sqrtf(s / (float)FD_D + eps);
    }
    __syncthreads();
}

extern __shared__ __align__(16) u32 fd_wbuf[];

// The n8 tiles of an n-column stage that this block computes: blockIdx.x, + gridDim.x, ...
__device__ __forceinline__ u32 fd_block_tiles(u32 n) {
    const u32 tiles = n / 8;
    return blockIdx.x < tiles ? (tiles - blockIdx.x + gridDim.x - 1) / gridDim.x : 0u;
}

// A stage's weight rows in fd_wbuf: ROWS rows a tile (the up rows after the gate rows with
// PAIR), SW words a row (K / 2, padded so that the eight rows a fragment load reads start in
// eight different bank quads), the block's first FIT tiles (the rest are read from global
// memory).
template <int K, bool PAIR> struct FdW {
    static constexpr u32 ROWS = PAIR ? 16 : 8;
    static constexpr u32 SW = K / 2 + ((K / 2) % 8 == 0 ? 4 : 0);
    static constexpr u32 FIT = FD_WBUF_BYTES / (ROWS * SW * 4);
};

// Starts copying this block's weight rows of a stage (w, n columns, pair as fd_gemm's) into
// fd_wbuf; fd_gemm waits for them. Call after every warp has finished the previous stage's
// reads of fd_wbuf (fd_gemm ends with __syncthreads).
template <int K, bool PAIR> __device__ __forceinline__ void fd_prefetch(const bf16_t* w, u32 n, u32 pair) {
    using P = FdW<K, PAIR>;
    constexpr u32 CPR = K / 8;  // 16-byte chunks a row (K % 8 == 0: the host checks)
    const u32 tiles = fd_block_tiles(n);
    const u32 npf = tiles < P::FIT ? tiles : P::FIT;
    const u32 total = npf * P::ROWS * CPR;
    for (u32 c = threadIdx.x; c < total; c += FD_THREADS) {
        const u32 row = c / CPR, o = c - row * CPR;
        const u32 ti = row / P::ROWS, r = row - ti * P::ROWS;
        const u32 tile = blockIdx.x + ti * gridDim.x;
        const u32 wr = (PAIR && r >= 8) ? pair + tile * 8 + (r - 8) : tile * 8 + r;
        const bf16_t* src = w + (u64)wr * K + o * 8;
        const u32 dst = (u32)__cvta_generic_to_shared(fd_wbuf + row * P::SW + o * 4);
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(src) : "memory");
    }
    asm volatile("cp.async.commit_group;" ::: "memory");
}

// One GEMM stage: for every n8 tile of `n` output columns (the block's tasks: tiles blockIdx.x,
// + gridDim.x, ..., FD_NT at a time), out[b, j] = sum_k A[b, k] W[j, k] for the first `batch`
// rows, handed to `epi(b, j, v, v2)`. A is `a` ([batch, K] bf16) or, with NORM, the RMSNorm of
// it (a * rstd[b] * gamma[k], rounded to bf16 as rms_norm stores it). With PAIR each tile also
// computes the columns `pair` rows further down W (SwiGLU's up next to its gate) as v2. The
// block's first tiles come from fd_wbuf (fd_prefetch), the rest from W in global memory.
template <int K, bool NORM, bool PAIR, typename Epi>
__device__ __forceinline__ void fd_gemm(FdShared& sh, const bf16_t* a, const bf16_t* gamma, const bf16_t* w, u32 n, u32 pair, u32 batch, Epi epi) {
    using P = FdW<K, PAIR>;
    constexpr u32 KS = (K + 15) / 16;
    const u32 lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const u32 mtiles = (batch + 15) / 16;
    const u32 mine = fd_block_tiles(n);
    // The activation rows in shared memory (normed and rounded as below) where they fit.
    u32* abuf = fd_wbuf + FD_WBUF_BYTES / 4;
    const bool staged = mine > 0 && batch * P::SW * 4 <= FD_ABUF_BYTES;
    if (staged) {
        constexpr u32 CPR = K / 8;
        for (u32 c = threadIdx.x; c < batch * CPR; c += FD_THREADS) {
            const u32 b = c / CPR, o = c - b * CPR;
            const uint4 v = fd_ld128cg(a + (u64)b * K + o * 8);
            u32 w4[4] = {v.x, v.y, v.z, v.w};
            if constexpr (NORM) {
                const uint4 gv = reinterpret_cast<const uint4*>(gamma)[o];
                const u32 g4[4] = {gv.x, gv.y, gv.z, gv.w};
                const float r = sh.rstd[b];
#pragma unroll
                for (int i = 0; i < 4; ++i) w4[i] = fd_pack(fd_lo(w4[i]) * r * fd_lo(g4[i]), fd_hi(w4[i]) * r * fd_hi(g4[i]));
            }
            *reinterpret_cast<uint4*>(abuf + b * P::SW + o * 4) = make_uint4(w4[0], w4[1], w4[2], w4[3]);
        }
    }
    asm volatile("cp.async.wait_all;" ::: "memory");
    __syncthreads();
    for (u32 t0 = 0; t0 < mine; t0 += FD_NT) {
        float acc[FD_NT][FD_MT][4], acc2[FD_NT][FD_MT][4];
#pragma unroll
        for (int j = 0; j < FD_NT; ++j)
#pragma unroll
            for (int m = 0; m < FD_MT; ++m)
#pragma unroll
                for (int i = 0; i < 4; ++i) acc[j][m][i] = acc2[j][m][i] = 0.0f;
        // Each tile's two weight rows for this lane: in fd_wbuf (words) or in W (global).
        const u32* wrow[FD_NT];
        const u32* wrow2[FD_NT];
#pragma unroll
        for (u32 j = 0; j < FD_NT; ++j) {
            const u32 ti = t0 + j, n0 = (blockIdx.x + ti * gridDim.x) * 8;
            if (ti < P::FIT) {
                wrow[j] = fd_wbuf + (ti * P::ROWS + g) * P::SW;
                wrow2[j] = fd_wbuf + (ti * P::ROWS + 8 + g) * P::SW;
            } else {
                wrow[j] = reinterpret_cast<const u32*>(w + (u64)(n0 + g) * K);
                wrow2[j] = reinterpret_cast<const u32*>(w + (u64)(pair + n0 + g) * K);
            }
        }
#pragma unroll 4
        for (u32 ks = warp; ks < KS; ks += FD_WARPS) {
            const u32 k0 = ks * 16;
            const bool hi_ok = k0 + 8 < K;
            u32 bw[FD_NT][2], cw[FD_NT][2];
#pragma unroll
            for (u32 j = 0; j < FD_NT; ++j) {
                const bool in = t0 + j < mine;
                bw[j][0] = in ? wrow[j][(k0 >> 1) + t] : 0u;
                bw[j][1] = in && hi_ok ? wrow[j][((k0 + 8) >> 1) + t] : 0u;
                cw[j][0] = cw[j][1] = 0u;
                if constexpr (PAIR) {
                    cw[j][0] = in ? wrow2[j][(k0 >> 1) + t] : 0u;
                    cw[j][1] = in && hi_ok ? wrow2[j][((k0 + 8) >> 1) + t] : 0u;
                }
            }
            u32 ga = 0u, gb = 0u;
            if constexpr (NORM) {
                if (!staged) {
                    ga = reinterpret_cast<const u32*>(gamma)[(k0 >> 1) + t];
                    gb = hi_ok ? reinterpret_cast<const u32*>(gamma)[((k0 + 8) >> 1) + t] : 0u;
                }
            }
#pragma unroll
            for (u32 m = 0; m < FD_MT; ++m) {
                if (m >= mtiles) break;
                const u32 r0 = m * 16 + g, r1 = r0 + 8;
                u32 av[4] = {0u, 0u, 0u, 0u};
                const u32 rows[2] = {r0, r1};
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    if (rows[h] >= batch) continue;
                    if (staged) {
                        const u32* srow = abuf + rows[h] * P::SW;
                        av[h] = srow[(k0 >> 1) + t];
                        av[2 + h] = hi_ok ? srow[((k0 + 8) >> 1) + t] : 0u;
                        continue;
                    }
                    const u32* arow = reinterpret_cast<const u32*>(a + (u64)rows[h] * K);
                    u32 lo = fd_ld32cg(arow + (k0 >> 1) + t);
                    u32 hi = hi_ok ? fd_ld32cg(arow + ((k0 + 8) >> 1) + t) : 0u;
                    if constexpr (NORM) {
                        const float r = sh.rstd[rows[h]];
                        lo = fd_pack(fd_lo(lo) * r * fd_lo(ga), fd_hi(lo) * r * fd_hi(ga));
                        hi = hi_ok ? fd_pack(fd_lo(hi) * r * fd_lo(gb), fd_hi(hi) * r * fd_hi(gb)) : 0u;
                    }
                    av[h] = lo;
                    av[2 + h] = hi;
                }
                __syncwarp();  // mma.sync wants the whole warp, converged after the row tests
#pragma unroll
                for (u32 j = 0; j < FD_NT; ++j) {
                    if (t0 + j >= mine) break;
                    fd_mma(acc[j][m], av[0], av[1], av[2], av[3], bw[j][0], bw[j][1]);
                    if constexpr (PAIR) fd_mma(acc2[j][m], av[0], av[1], av[2], av[3], cw[j][0], cw[j][1]);
                }
            }
        }
        // Each tile's warps' partial sums, added in warp order.
#pragma unroll
        for (u32 j = 0; j < FD_NT; ++j) {
            if (t0 + j >= mine) break;
            const u32 n0 = (blockIdx.x + (t0 + j) * gridDim.x) * 8;
#pragma unroll
            for (u32 m = 0; m < FD_MT; ++m) {
                if (m >= mtiles) break;
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                    const u32 row = g + (i >= 2 ? 8 : 0), col = 2 * t + (i & 1);
                    sh.red[warp][0][m][row][col] = acc[j][m][i];
                    if constexpr (PAIR) sh.red[warp][1][m][row][col] = acc2[j][m][i];
                }
            }
            __syncthreads();
            for (u32 e = threadIdx.x; e < mtiles * 128; e += FD_THREADS) {
                const u32 m = e >> 7, row = (e >> 3) & 15, col = e & 7;
                const u32 b = m * 16 + row;
                if (b >= batch) continue;
                float v = 0.0f, v2 = 0.0f;
#pragma unroll
                for (int wi = 0; wi < FD_WARPS; ++wi) {
                    v += sh.red[wi][0][m][row][col];
                    if constexpr (PAIR) v2 += sh.red[wi][1][m][row][col];
                }
                epi(b, n0 + col, v, v2);
            }
            __syncthreads();
        }
    }
}

// Attention of the new token of sequence b, head h, against its cache (whose position len the
// q/k/v stage wrote): one block a (sequence, head), 8 lanes a key (FD_HD / 8 values each, 16-byte
// loads), 4 keys a warp at a time, key j to warp (j / 4) % 8; online softmax per lane group,
// merged in the warp, then over the warps in order.
__device__ __forceinline__ void fd_attention(FdShared& sh, const FdLayer& L, const bf16_t* q, bf16_t* att, u32 batch, u32 max_len) {
    constexpr u32 E = FD_HD / 8;  // values a lane
    const u32 lane = threadIdx.x & 31, warp = threadIdx.x >> 5, grp = lane >> 3, gl = lane & 7;
    const float scale = 1.0f / sqrtf((float)FD_HD);
    for (u32 task = blockIdx.x; task < batch * FD_HEADS; task += gridDim.x) {
        const u32 b = task / FD_HEADS, h = task % FD_HEADS;
        const int raw = fd_ldi_cg(L.lengths + b);
        const bool bad = raw < 0 || raw > (int)max_len;
        const u32 keys = bad ? 0u : (raw < (int)max_len ? (u32)raw + 1 : (u32)raw);
        float qv[E];
#pragma unroll
        for (u32 e = 0; e < E; e += 8) {
            const uint4 v = fd_ld128cg(q + (u64)b * FD_D + h * FD_HD + gl * E + e);
            const u32 w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                qv[e + 2 * i] = fd_lo(w[i]) * scale;
                qv[e + 2 * i + 1] = fd_hi(w[i]) * scale;
            }
        }
        const u64 base = ((u64)b * FD_HEADS + h) * (u64)max_len * FD_HD + gl * E;
        float m = gr_neg_inf(), l = 0.0f, acc[E];
#pragma unroll
        for (u32 e = 0; e < E; ++e) acc[e] = 0.0f;
        // The loop runs alike in every lane of a warp (the shuffles need them all); a group
        // whose key is past the end takes no part in the softmax.
        // Each pass loads the keys and values of the next one first (software pipelining: the
        // loads are volatile, so the compiler keeps them where they are written).
        uint4 kcur[E / 8], vcur[E / 8], knext[E / 8], vnext[E / 8];
        const auto load = [&](u32 j, uint4* kd, uint4* vd) {
#pragma unroll
            for (u32 e = 0; e < E; e += 8) {
                const bool in = j < keys;
                kd[e / 8] = in ? fd_ld128cg(L.kc + base + (u64)j * FD_HD + e) : make_uint4(0u, 0u, 0u, 0u);
                vd[e / 8] = in ? fd_ld128cg(L.vc + base + (u64)j * FD_HD + e) : make_uint4(0u, 0u, 0u, 0u);
            }
        };
        load(warp * 4 + grp, kcur, vcur);
        for (u32 j0 = warp * 4; j0 < keys; j0 += FD_WARPS * 4) {
            const u32 j = j0 + grp;
            const bool ok = j < keys;
            load(j + FD_WARPS * 4, knext, vnext);
            float kv[E], vv[E];
#pragma unroll
            for (u32 e = 0; e < E; e += 8) {
                const uint4 k4 = kcur[e / 8], v4 = vcur[e / 8];
                kcur[e / 8] = knext[e / 8];
                vcur[e / 8] = vnext[e / 8];
                const u32 kw[4] = {k4.x, k4.y, k4.z, k4.w}, vw[4] = {v4.x, v4.y, v4.z, v4.w};
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                    kv[e + 2 * i] = fd_lo(kw[i]);
                    kv[e + 2 * i + 1] = fd_hi(kw[i]);
                    vv[e + 2 * i] = fd_lo(vw[i]);
                    vv[e + 2 * i + 1] = fd_hi(vw[i]);
                }
            }
            float s = 0.0f;
#pragma unroll
            for (u32 e = 0; e < E; ++e) s += qv[e] * kv[e];
            s += __shfl_xor_sync(0xffffffffu, s, 4);
            s += __shfl_xor_sync(0xffffffffu, s, 2);
            s += __shfl_xor_sync(0xffffffffu, s, 1);
            if (!ok) continue;
            const float mn = fmaxf(m, s);
            const float c = expf(m - mn), p = expf(s - mn);
            l = l * c + p;
#pragma unroll
            for (u32 e = 0; e < E; ++e) acc[e] = acc[e] * c + p * vv[e];
            m = mn;
        }
        // The warp's four groups: the max, then each group's sum and values rescaled to it.
        float mw = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 8));
        mw = fmaxf(mw, __shfl_xor_sync(0xffffffffu, mw, 16));
        const float cg = m == gr_neg_inf() ? 0.0f : expf(m - mw);
        l *= cg;
        l += __shfl_xor_sync(0xffffffffu, l, 8);
        l += __shfl_xor_sync(0xffffffffu, l, 16);
#pragma unroll
        for (u32 e = 0; e < E; ++e) {
            float v = acc[e] * cg;
            v += __shfl_xor_sync(0xffffffffu, v, 8);
            v += __shfl_xor_sync(0xffffffffu, v, 16);
            acc[e] = v;
        }
        if (lane == 0) {
            sh.am[warp] = mw;
            sh.al[warp] = l;
        }
        if (grp == 0) {
#pragma unroll
            for (u32 e = 0; e < E; ++e) sh.aacc[warp][gl * E + e] = acc[e];
        }
        __syncthreads();
        for (u32 col = threadIdx.x; col < FD_HD; col += FD_THREADS) {
            float mx = gr_neg_inf();
            for (int w = 0; w < FD_WARPS; ++w) mx = fmaxf(mx, sh.am[w]);
            float sum = 0.0f, o = 0.0f;
            if (mx != gr_neg_inf()) {
                for (int w = 0; w < FD_WARPS; ++w) {
                    const float c = sh.am[w] == gr_neg_inf() ? 0.0f : expf(sh.am[w] - mx);
                    sum += sh.al[w] * c;
                    o += sh.aacc[w][col] * c;
                }
            }
            fd_st(att, (u64)b * FD_D + h * FD_HD + col, sum > 0.0f ? o / sum : 0.0f);
        }
        __syncthreads();
    }
}

// The step. work holds x [batch, D], q [batch, D], att [batch, D], s [batch, HID] (bf16); bar
// a 64-bit zeroed word (see fd_sync); logits [batch, vocab]. Launched with FD_WBUF_BYTES +
// FD_ABUF_BYTES of dynamic shared memory.
extern "C" __global__ void __launch_bounds__(FD_THREADS, 1)
    decoder_step_bf16(const FdHeader* hdr, const float* ids, const float* positions, bf16_t* logits, bf16_t* work, unsigned long long* bar, u32* err, u32 batch, float eps) {
    __shared__ FdShared sh;
    const FdHeader H = *hdr;
    const FdLayer* layers = reinterpret_cast<const FdLayer*>(hdr + 1);
    bf16_t* x = work;
    bf16_t* q = x + (u64)batch * FD_D;
    bf16_t* att = q + (u64)batch * FD_D;
    bf16_t* s = att + (u64)batch * FD_D;
    unsigned long long target = fd_sync_base(bar);
    if (H.layers > 0) {
        fd_prefetch<FD_D, false>(layers[0].qkv, 3 * FD_D, 0);
    } else {
        fd_prefetch<FD_D, false>(H.head, H.vocab, 0);
    }

    // The embeddings' sum, rounded as add_rms_norm rounds its residual sum. A bad id or
    // position gives a zero row and is reported as ops::embedding reports it.
    for (u32 b = blockIdx.x; b < batch; b += gridDim.x) {
        const long long r = fd_row(ids[b], H.vocab), p = fd_row(positions[b], H.ctx);
        if (threadIdx.x == 0) {
            if (r < 0) fd_report_token(err, b, ids[b], H.vocab);
            if (p < 0) fd_report_token(err, b, positions[b], H.ctx);
        }
        for (u32 c = threadIdx.x; c < FD_D; c += FD_THREADS) {
            const float tv = r < 0 ? 0.0f : ld(H.tok, (u64)r * FD_D + c);
            const float pv = p < 0 ? 0.0f : ld(H.pos, (u64)p * FD_D + c);
            fd_st(x, (u64)b * FD_D + c, tv + pv);
        }
    }
    fd_sync(bar, target);

    // Each GEMM stage starts the copy of the next stage's weights (fd_prefetch) before the
    // barrier that ends it.
    for (u32 li = 0; li < H.layers; ++li) {
        const FdLayer L = layers[li];
        const u32 max_len = H.max_len;
        // RMSNorm and q/k/v; k and v go to the cache at the sequence's length.
        for (u32 b = threadIdx.x; b < batch; b += FD_THREADS) sh.len[b] = fd_ldi_cg(L.lengths + b);
        fd_rstd(sh, x, batch, eps);
        fd_gemm<FD_D, true, false>(sh, x, L.norm1, L.qkv, 3 * FD_D, 0, batch, [&](u32 b, u32 j, float v, float) {
            if (j < FD_D) {
                fd_st(q, (u64)b * FD_D + j, v);
                return;
            }
            const int raw = sh.len[b];
            const bool room = raw >= 0 && raw < (int)max_len;
            if (j == FD_D && !room) fd_report_cache(err, b, raw, max_len);
            if (!room) return;
            const u32 jj = j < 2 * FD_D ? j - FD_D : j - 2 * FD_D;
            const u64 at = (((u64)b * FD_HEADS + jj / FD_HD) * max_len + (u64)raw) * FD_HD + jj % FD_HD;
            fd_st(j < 2 * FD_D ? L.kc : L.vc, at, v);
        });
        fd_prefetch<FD_D, false>(L.wo, FD_D, 0);
        fd_sync(bar, target);
        fd_attention(sh, L, q, att, batch, max_len);
        fd_sync(bar, target);
        // The lengths advance once every block has read them (the two stages above).
        if (blockIdx.x == 0) {
            for (u32 b = threadIdx.x; b < batch; b += FD_THREADS) {
                const int raw = fd_ldi_cg(L.lengths + b);
                if (raw >= 0 && raw < (int)max_len) L.lengths[b] = raw + 1;
            }
        }
        // The output projection, rounded, added to the residual stream (in place: each
        // column's owner reads and writes it).
        fd_gemm<FD_D, false, false>(sh, att, nullptr, L.wo, FD_D, 0, batch, [&](u32 b, u32 j, float v, float) {
            const u64 i = (u64)b * FD_D + j;
            fd_st(x, i, fd_ldcg(x, i) + fd_round(v));
        });
        fd_prefetch<FD_D, true>(L.gate_up, FD_HID, FD_HID);
        fd_sync(bar, target);
        // RMSNorm, gate and up, SwiGLU.
        fd_rstd(sh, x, batch, eps);
        fd_gemm<FD_D, true, true>(sh, x, L.norm2, L.gate_up, FD_HID, FD_HID, batch, [&](u32 b, u32 j, float v, float v2) {
            const float gt = fd_round(v), up = fd_round(v2);
            fd_st(s, (u64)b * FD_HID + j, gt * (1.0f / (1.0f + expf(-gt))) * up);
        });
        fd_prefetch<FD_HID, false>(L.down, FD_D, 0);
        fd_sync(bar, target);
        fd_gemm<FD_HID, false, false>(sh, s, nullptr, L.down, FD_D, 0, batch, [&](u32 b, u32 j, float v, float) {
            const u64 i = (u64)b * FD_D + j;
            fd_st(x, i, fd_ldcg(x, i) + fd_round(v));
        });
        if (li + 1 < H.layers) {
            fd_prefetch<FD_D, false>(layers[li + 1].qkv, 3 * FD_D, 0);
        } else {
            fd_prefetch<FD_D, false>(H.head, H.vocab, 0);
        }
        fd_sync(bar, target);
    }
    // The final RMSNorm and the head.
    fd_rstd(sh, x, batch, eps);
    fd_gemm<FD_D, true, false>(sh, x, H.head_norm, H.head, H.vocab, 0, batch, [&](u32 b, u32 j, float v, float) {
        fd_st(logits, (u64)b * H.vocab + j, v);
    });
}
