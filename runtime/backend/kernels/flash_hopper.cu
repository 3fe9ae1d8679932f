// A deterministic attention backward for Hopper (sm_90a): wgmma on shared-memory descriptors,
// one pass over the query tiles per key tile (five products, not the portable kernels' seven),
// dQ added into an f32 accumulator in a fixed order of key tiles by a warp of its own. Its own
// NVRTC program (backend/cuda_hopper.rs), compiled for sm_90a after core.cu, ops.cu, half.cu and
// flash.cu (it uses flash.cu's loads, swizzle, packing and exp2); bench/hopper_bwd.py tests and
// times it.
//
// Head dim 64, bf16 or f16, the layouts of flash.cu (q [batch, seq, heads*64] rows qld apart,
// k and v rows kvld apart, grouped-query heads; lse and dsum f32 [batch, heads, seq]).
//
// A block (three warpgroups) is one key tile of 128 keys of one kv head of one batch row. K and V
// stay in shared memory; the block walks the query tiles (128 queries, every query head of the
// group) that see its keys, with Q, dO, lse and dsum of the next tile loading (cp.async, two
// stages) while this one computes. Warpgroups 0 and 1 (the products; 240 registers a thread)
// each take 64 of the keys:
//   Sᵀ = K·Qᵀ, dPᵀ = V·dOᵀ                   (wgmma m64n128, both operands K-major in shared memory)
//   Pᵀ = exp(Sᵀ·scale - lse), dSᵀ = Pᵀ∘(dPᵀ - dsum)   (registers)
//   dV += Pᵀ·dO, dK += dSᵀ·Q                 (wgmma, A from registers, B N-major)
// then, with both halves of dSᵀ in shared memory, each takes 64 of the queries:
//   dQ part = dS·K over the block's 128 keys  (both operands M/N-major)
// and leaves its part in shared memory (two stages) in its accumulators' order: thread i's
// floats 4c..4c+3 at float4 c·128 + i, so that every store is a whole bank line. Warp 8 (the dQ
// writer; warpgroup 2 keeps 24 registers a thread, its other warps idle) adds each tile's part
// into dq_acc (f32 [batch, heads, query tiles, chains, 8192], the same order) with one bulk copy
// of the tensor memory accelerator when its turn comes: a key tile's turn for a query tile is
// its rank among the key tiles of its chain (below) that see that query tile, the first key tile
// first, counted in sem (u32 [batch, heads, query tiles, chains], zero at launch and left at
// zero). The first of a chain stores, the others add (cp.reduce.async.bulk, in that order, each
// waiting until the one before it is complete), so the sum's order is fixed and dq is the same
// bits on every run. hb_dq_convert then adds the chains in order and writes dq (times scale, in
// 16-bit). Work items are taken in order by a persistent grid
// (hb_bwd below), the longest first, so a block only ever waits for items taken before its own.
//
// Shared tiles are rows of 64 16-bit values (128 bytes) with chunk c of row r at chunk c ^ (r & 7)
// from a 1024-byte-aligned base: flash.cu's swizzle, which is the layout wgmma's 128-byte swizzle
// mode reads.

// HB_TURN (bench/hopper_bwd.py's diagnostic; the runtime's is 1): 1 the ordered dQ sum; 0 (timing
// only, dq wrong) the writer adds nothing and waits for nobody; 2 (timing only, dq wrong: a
// chain's first store may land after another key tile's add) the writer adds without waiting
// for its turn.
#ifndef HB_TURN
#define HB_TURN 1
#endif
// `chains` (a launch argument; ops/flash_hopper.rs picks it): a query tile's dQ is summed in
// this many chains, key tile j in chain j % chains, each chain in order of j into its own f32
// sum; hb_dq_convert adds the chains' sums in order of chain. Key tiles of different chains never
// wait for each other, so the chain of waits a wave's blocks form (each key tile waiting for the
// one before it) is `chains` times shorter.

#define HB_SK 0
#define HB_SV 16384
#define HB_SQ 32768   // two stages of 128 query rows
#define HB_SO 65536   // two stages of 128 dO rows
#define HB_SDS 98304  // dSᵀ: two halves (queries 0-63, 64-127) of 128 key rows
#define HB_SDQ 131072 // dQ parts: two stages of two warpgroups' 4096 floats
#define HB_SL 196608  // lse: two stages of 128 floats, then dsum
#define HB_SMEM (HB_SL + 2048 + 1024)
#define HB_THREADS 384
#define HB_TILE_F32 8192  // a query tile's floats in dq_acc

// Named barriers (0 is __syncthreads): the product warpgroups among themselves; a stage of dQ
// parts full (products to writer) and empty (writer to products), one each a stage.
#define HB_BAR_MMA 1
#define HB_BAR_FULL 2
#define HB_BAR_EMPTY 4
#define HB_MMA_THREADS 256
#define HB_STAGE_THREADS 288  // a dQ stage's barriers: the product warpgroups and the writer warp

__device__ __forceinline__ void hb_bar_sync(int id, int n) { asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(n) : "memory"); }
__device__ __forceinline__ void hb_bar_arrive(int id, int n) { asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(n) : "memory"); }
template <int N>
__device__ __forceinline__ void hb_regs_inc() { asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N)); }
template <int N>
__device__ __forceinline__ void hb_regs_dec() { asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N)); }

// The tensor memory accelerator's bulk copies from shared to global memory: a store, or an add of
// f32 values (performed at L2); bytes a multiple of 16, both addresses 16-byte aligned.
__device__ __forceinline__ void hb_bulk_store(float* g, u32 s, u32 bytes) {
    asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;\n" ::"l"(g), "r"(s), "r"(bytes) : "memory");
}
__device__ __forceinline__ void hb_bulk_add(float* g, u32 s, u32 bytes) {
    asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n" ::"l"(g), "r"(s), "r"(bytes) : "memory");
}
// Waits until the bulk copies issued so far are complete: shared memory read and global memory
// written.
__device__ __forceinline__ void hb_bulk_done() {
    asm volatile("cp.async.bulk.commit_group;\ncp.async.bulk.wait_group 0;\n" ::: "memory");
}
// Orders the generic proxy's global accesses of this thread with the async proxy's (bulk copies).
__device__ __forceinline__ void hb_proxy_fence_global() { asm volatile("fence.proxy.async.global;\n" ::: "memory"); }

__device__ __forceinline__ void hb_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void hb_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void hb_wait() { asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory"); }
// Writes of the generic proxy (stores, cp.async) made visible to wgmma's reads (async proxy).
__device__ __forceinline__ void hb_proxy_fence() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
// Pins registers in place around the asynchronous products.
template <int N = 32>
__device__ __forceinline__ void hb_keep(float* d) {
#pragma unroll
    for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}
template <int K>
__device__ __forceinline__ void hb_keep_u(u32 (*a)[4]) {
#pragma unroll
    for (int i = 0; i < K; ++i) asm volatile("" : "+r"(a[i][0]), "+r"(a[i][1]), "+r"(a[i][2]), "+r"(a[i][3])::"memory");
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

// d (64 x 128 f32: a warpgroup's 64 rows of Sᵀ or dPᵀ over a 128-query tile) = or += A·B, k = 16,
// A and B K-major from descriptors (B's 128 rows are 16 groups of 8, 1024 bytes apart).
#define HB_SS128(TY)                                                                                                   \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"                                                         \
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32." TY "." TY " {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1, 0, 0;\n}\n"    \
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])                                                                                                  \
                 : "l"(da), "l"(db), "r"(acc))
template <bool BF16>
__device__ __forceinline__ void hb_ss128(float* d, u64 da, u64 db, int acc) {
    if constexpr (BF16) {
        HB_SS128("bf16");
    } else {
        HB_SS128("f16");
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

// A warpgroup's 64 x 16K accumulators as K k steps of A fragments, rounded.
template <bool BF16, int K>
__device__ __forceinline__ void hb_to_a(u32 (*a)[4], const float* c) {
#pragma unroll
    for (int kk = 0; kk < K; ++kk) {
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

// One work item: key tile j, kv head kvh and batch row b of `item` (item / (kv_heads * batch) is
// the key tile, the rest the kv head and batch row), and the query tiles it walks: iteration it
// is query tile tile(it) (the last first) of query head head(it).
struct HbItem {
    u32 b, kvh, j, nt, group, per_head, iters;
    __device__ __forceinline__ HbItem(u32 item, u32 batch, u32 seq, u32 heads, u32 kv_heads, u32 causal) {
        const u32 groups = kv_heads * batch, rest = item % groups;
        j = item / groups;
        kvh = rest % kv_heads;
        b = rest / kv_heads;
        nt = (seq + 127) / 128;  // key tiles, and query tiles
        group = heads / kv_heads;
        per_head = nt - (causal ? j : 0);
        iters = per_head * group;
    }
    __device__ __forceinline__ u32 tile(u32 it) const { return nt - 1 - it % per_head; }
    __device__ __forceinline__ u32 head(u32 it) const { return kvh * group + it / per_head; }
};

// The shared-memory base, 1024-byte aligned, as an address and a pointer.
__device__ __forceinline__ u32 hb_base(unsigned char** base) {
    const u32 raw = fa_saddr(fa_smem);
    const u32 sb = (raw + 1023u) & ~1023u;
    *base = fa_smem + (sb - raw);
    return sb;
}

// The dQ writer (warp 8) for one item. Key tile j is at rank r = j / chains of its chain's
// order for each query tile it sees; the chain's last key tile there is the last of the chain up
// to the query tile's diagonal key tile (causal) or up to the last key tile.
__device__ __forceinline__ void hb_writer(const HbItem& w, float* dq_acc, u32* sem, u32* err, u32 heads, u32 causal, u32 chains) {
    unsigned char* base;
    const u32 sb = hb_base(&base);
    const int lane = threadIdx.x & 31;
    const u32 j = w.j, ch = j % chains, r = j / chains;
    for (u32 it = 0; it < w.iters; ++it) {
        const int st = it & 1;
        const u32 h = w.head(it), qt = w.tile(it), last = causal ? qt : w.nt - 1;
        const u32 chain_last = ch + chains * ((last - ch) / chains);  // j <= last, so ch <= last
        const u64 slot = (((u64)w.b * heads + h) * w.nt + qt) * chains + ch;
        u32* sm = sem + slot;
        float* acc = dq_acc + slot * HB_TILE_F32;
        if (HB_TURN == 1 && lane == 0 && r > 0) {
            const long long t0 = clock64();
            while (hb_ld_acquire(sm) != r) {
                // A few seconds: give up rather than hang, counted in the device's error word
                // (CudaBackend::stall_word), which the next synchronize reports.
                if (clock64() - t0 > (1ll << 32)) {
                    atomicAdd(err, 1u);
                    break;
                }
            }
            hb_proxy_fence_global();
        }
        __syncwarp();
        hb_bar_sync(HB_BAR_FULL + st, HB_STAGE_THREADS);
        if (HB_TURN && lane == 0) {
            const u32 part = sb + HB_SDQ + st * HB_TILE_F32 * 4;
            if (r == 0) {
                hb_bulk_store(acc, part, HB_TILE_F32 * 4);
            } else {
                hb_bulk_add(acc, part, HB_TILE_F32 * 4);
            }
            hb_bulk_done();
            hb_proxy_fence_global();
            if (HB_TURN == 1) {
                if (j == chain_last) {
                    if (r > 0) *sm = 0u;
                } else {
                    __threadfence();
                    hb_st_release(sm, r + 1);
                }
            }
        }
        __syncwarp();
        if (it + 2 < w.iters) hb_bar_arrive(HB_BAR_EMPTY + st, HB_STAGE_THREADS);
    }
}

// The products (warpgroups 0 and 1) for one item.
template <bool BF16>
__device__ __forceinline__ void hb_mma(const HbItem& w, u16* dk, u16* dv, const u16* q, const u16* k, const u16* v, const u16* dout, const float* lse, const float* dsum, u32 seq, u32 heads, u32 qld, u32 kvld, u32 causal, float scale) {
    unsigned char* base;
    const u32 sb = hb_base(&base);
    const int tid = threadIdx.x, wg = tid >> 7, warp = (tid >> 5) & 3, lane = tid & 31, gr = lane >> 2, t = lane & 3;
    const u32 b = w.b, j = w.j, iters = w.iters;
    u16* sK = reinterpret_cast<u16*>(base + HB_SK);
    u16* sV = reinterpret_cast<u16*>(base + HB_SV);
    u16* sQ = reinterpret_cast<u16*>(base + HB_SQ);
    u16* sO = reinterpret_cast<u16*>(base + HB_SO);
    u16* sDS = reinterpret_cast<u16*>(base + HB_SDS);
    float* sDQ = reinterpret_cast<float*>(base + HB_SDQ);
    float* sL = reinterpret_cast<float*>(base + HB_SL);
    float* sD = sL + 256;
    const u64 qs = qld, ks = kvld, os = (u64)heads * 64;
    const u64 koff = (u64)b * seq * ks + (u64)w.kvh * 64;
    const u32 k0 = j * 128, kw0 = k0 + wg * 64;

    fa_load<64, 128, HB_MMA_THREADS>(sK, k + koff, ks, k0, seq);
    fa_load<64, 128, HB_MMA_THREADS>(sV, v + koff, ks, k0, seq);
    fa_commit();
    auto load_q = [&](u32 it, int st) {
        const u32 h = w.head(it), q0 = w.tile(it) * 128;
        const u64 qoff = (u64)b * seq * qs + (u64)h * 64, ooff = (u64)b * seq * os + (u64)h * 64;
        const u64 loff = ((u64)b * heads + h) * seq;
        fa_load<64, 128, HB_MMA_THREADS>(sQ + st * 8192, q + qoff, qs, q0, seq);
        fa_load<64, 128, HB_MMA_THREADS>(sO + st * 8192, dout + ooff, os, q0, seq);
        fa_load_f32<128, HB_MMA_THREADS>(sL + st * 128, lse + loff, q0, seq);
        fa_load_f32<128, HB_MMA_THREADS>(sD + st * 128, dsum + loff, q0, seq);
    };
    load_q(0, 0);
    fa_commit();

    float dva[32], dka[32];
#pragma unroll
    for (int i = 0; i < 32; ++i) dva[i] = dka[i] = 0.0f;
    const float sl2 = scale * FA_LOG2E;
    // This warpgroup's 64 keys of K and V; all 128 keys of K (dQ's B); its 64 queries of dSᵀ.
    const u32 aK = sb + HB_SK + wg * 8192, aV = sb + HB_SV + wg * 8192, aKall = sb + HB_SK, aDS = sb + HB_SDS + wg * 16384;

    for (u32 it = 0; it < iters; ++it) {
        const int st = it & 1;
        // Stage st (issued an iteration ago, or before the loop) has landed; the barrier also
        // holds the next load back until both warpgroups waited for their products of the
        // previous iteration, which read stage st ^ 1 and dSᵀ (a warpgroup's wgmma wait covers
        // its own products only).
        fa_wait0();
        hb_proxy_fence();
        hb_bar_sync(HB_BAR_MMA, HB_MMA_THREADS);
        if (it + 1 < iters) load_q(it + 1, st ^ 1);
        fa_commit();
        const u32 q0 = w.tile(it) * 128;
        const u32 aQ = sb + HB_SQ + st * 16384, aO = sb + HB_SO + st * 16384;

        // Sᵀ = K·Qᵀ and dPᵀ = V·dOᵀ: this warpgroup's 64 keys x the tile's 128 queries.
        float s[64], dp[64];
        hb_fence();
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) hb_ss128<BF16>(s, hb_desc(aK + kk * 32), hb_desc(aQ + kk * 32), kk);
        hb_commit();
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) hb_ss128<BF16>(dp, hb_desc(aV + kk * 32), hb_desc(aO + kk * 32), kk);
        hb_commit();
        const float* cL = sL + st * 128;
        const float* cD = sD + st * 128;
        const bool edge = q0 + 127 >= seq || (causal && q0 < kw0 + 63);

        // Pᵀ as soon as Sᵀ is in (dPᵀ may still be running), then dV += Pᵀ·dO (k = the tile's
        // queries: 16 rows of dO a step) while dSᵀ is computed.
        // Two forms of the loop (`edge` is the same for the whole block): tiles with no masked
        // element take a plain one whose 64 exponents issue back to back; edge tiles take the
        // masked one, which compiles to predicated loads and exponents. One form for both, the
        // mask `edge && (...)`, compiled to a branch and a convergence barrier an element, each
        // element's lse load and exp2 waiting for the one before (cuobjdump of the sm_90a cubin).
        hb_wait<1>();
        hb_keep<64>(s);
        if (edge) {
#pragma unroll
            for (int c = 0; c < 16; ++c) {
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int col = 8 * c + 2 * t + (e & 1);
                    const u32 qi = q0 + col, key = kw0 + 16 * warp + gr + 8 * (e >> 1);
                    const bool masked = qi >= seq || (causal && qi < key);
                    s[4 * c + e] = masked ? 0.0f : fa_exp2(s[4 * c + e] * sl2 - cL[col] * FA_LOG2E);
                }
            }
        } else {
#pragma unroll
            for (int c = 0; c < 16; ++c) {
                const float2 l = *reinterpret_cast<const float2*>(cL + 8 * c + 2 * t);
#pragma unroll
                for (int e = 0; e < 4; ++e) s[4 * c + e] = fa_exp2(fmaf(s[4 * c + e], sl2, -((e & 1) ? l.y : l.x) * FA_LOG2E));
            }
        }
        u32 pa[8][4], da[8][4];
        hb_to_a<BF16, 8>(pa, s);
        hb_fence();
#pragma unroll
        for (int kk = 0; kk < 8; ++kk) hb_rs<BF16, 1>(dva, pa[kk], hb_desc(aO + kk * 2048), 1);
        hb_commit();

        // dSᵀ = Pᵀ∘(dPᵀ - dsum), then dK += dSᵀ·Q.
        hb_wait<1>();
        hb_keep<64>(dp);
#pragma unroll
        for (int c = 0; c < 16; ++c) {
#pragma unroll
            for (int e = 0; e < 4; ++e) dp[4 * c + e] = s[4 * c + e] * (dp[4 * c + e] - cD[8 * c + 2 * t + (e & 1)]);
        }
        hb_to_a<BF16, 8>(da, dp);
        // dSᵀ (keys x queries) to shared memory for dQ, before dK's product takes da as its A
        // operand (reading an operand register of a product in flight is undefined in PTX).
        // Queries 0-63 go to the first half, 64-127 to the second: k step kk's 16 queries are
        // chunks 2kk and 2kk + 1 of the tile, in half kk / 4.
        {
            const int r0 = wg * 64 + 16 * warp + gr;
#pragma unroll
            for (int kk = 0; kk < 8; ++kk) {
                u16* half = sDS + (kk >> 2) * 8192;
                const int ch = (2 * kk) & 7;
                *reinterpret_cast<u32*>(half + fa_off<64>(r0, ch) + 2 * t) = da[kk][0];
                *reinterpret_cast<u32*>(half + fa_off<64>(r0 + 8, ch) + 2 * t) = da[kk][1];
                *reinterpret_cast<u32*>(half + fa_off<64>(r0, ch + 1) + 2 * t) = da[kk][2];
                *reinterpret_cast<u32*>(half + fa_off<64>(r0 + 8, ch + 1) + 2 * t) = da[kk][3];
            }
        }
        hb_fence();
#pragma unroll
        for (int kk = 0; kk < 8; ++kk) hb_rs<BF16, 1>(dka, da[kk], hb_desc(aQ + kk * 2048), 1);
        hb_commit();
        hb_proxy_fence();
        hb_bar_sync(HB_BAR_MMA, HB_MMA_THREADS);

        // This warpgroup's 64 queries of the tile's dQ: dS (its queries x the 128 keys) · K.
        float dqa[32];
        hb_fence();
#pragma unroll
        for (int kk = 0; kk < 8; ++kk) hb_ss<BF16, 1, 1>(dqa, hb_desc(aDS + kk * 2048), hb_desc(aKall + kk * 2048), kk);
        hb_commit();
        hb_wait<0>();
        hb_keep(dva);
        hb_keep(dka);
        hb_keep(dqa);
        hb_keep_u<8>(pa);
        hb_keep_u<8>(da);
        // The part to stage st once the writer is done with what it held two tiles ago.
        if (it >= 2) hb_bar_sync(HB_BAR_EMPTY + st, HB_STAGE_THREADS);
        {
            float* pq = sDQ + st * HB_TILE_F32 + wg * 4096 + 4 * (tid & 127);
#pragma unroll
            for (int c = 0; c < 8; ++c) *reinterpret_cast<float4*>(pq + 512 * c) = make_float4(dqa[4 * c], dqa[4 * c + 1], dqa[4 * c + 2], dqa[4 * c + 3]);
        }
        hb_proxy_fence();
        hb_bar_arrive(HB_BAR_FULL + st, HB_STAGE_THREADS);
    }
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
// items in order from a counter (sem[batch * heads * query tiles * chains], zero at launch; the last
// fetch, the grid's last block finding none left, sets it back to zero). A block waits only for
// items taken before its own, each held by a running block, so the waits always end, however
// many blocks are resident.
template <bool BF16>
__device__ __forceinline__ void hb_bwd(float* dq_acc, u16* dk, u16* dv, u32* sem, u32* err, const u16* q, const u16* k, const u16* v, const u16* dout, const float* lse, const float* dsum, u32 batch, u32 seq, u32 heads, u32 kv_heads, u32 qld, u32 kvld, u32 causal, float scale, u32 chains) {
    __shared__ u32 s_item;
    const u32 nt = (seq + 127) / 128;
    const u32 items = nt * kv_heads * batch;
    u32* counter = sem + (u64)batch * heads * nt * chains;
    // Each role its own loop, so that the compiler holds each to its registers: the product
    // warpgroups take those warpgroup 2 does not need. Both loops meet at the same two block
    // barriers an item.
    if (threadIdx.x >= HB_MMA_THREADS) {
        hb_regs_dec<24>();
        for (;;) {
            __syncthreads();
            const u32 item = s_item;
            if (item >= items) break;
            if (threadIdx.x < HB_STAGE_THREADS) hb_writer(HbItem(item, batch, seq, heads, kv_heads, causal), dq_acc, sem, err, heads, causal, chains);
            __syncthreads();
        }
    } else {
        hb_regs_inc<240>();
        for (;;) {
            if (threadIdx.x == 0) {
                const u32 got = atomicAdd(counter, 1u);
                if (got == items + gridDim.x - 1) *counter = 0u;
                s_item = got;
            }
            __syncthreads();
            const u32 item = s_item;
            if (item >= items) break;
            hb_mma<BF16>(HbItem(item, batch, seq, heads, kv_heads, causal), dk, dv, q, k, v, dout, lse, dsum, seq, heads, qld, kvld, causal, scale);
            __syncthreads();
        }
    }
}

// dq (times scale, in 16-bit) from dq_acc: a block a query tile (grid: query tiles, heads, batch);
// the tile's chains added in order of chain, those with a key tile that sees the tile.
template <bool BF16>
__device__ __forceinline__ void hb_dq_convert(u16* dq, const float* dq_acc, u32 seq, u32 heads, u32 qld, u32 causal, float scale, u32 chains) {
    const u32 qt = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
    const float* a = dq_acc + (((u64)b * heads + h) * gridDim.x + qt) * chains * HB_TILE_F32;
    const u32 last = causal ? qt : gridDim.x - 1;
    u16* o = dq + (u64)b * seq * qld + (u64)h * 64;
#pragma unroll
    for (int i = 0; i < HB_TILE_F32 / 4 / 256; ++i) {
        // float4 p of the tile: warpgroup w's thread tw, its floats 4c..4c+3 (rows r and r + 8,
        // columns 8c + 2t and the next).
        const int p = threadIdx.x + 256 * i, w = p >> 10, c = (p >> 7) & 7, tw = p & 127;
        float4 x = *reinterpret_cast<const float4*>(a + 4 * p);
        for (u32 k = 1; k < chains; ++k) {
            if (k <= last) {
                const float4 y = *reinterpret_cast<const float4*>(a + k * HB_TILE_F32 + 4 * p);
                x.x += y.x;
                x.y += y.y;
                x.z += y.z;
                x.w += y.w;
            }
        }
        const int lane = tw & 31;
        const u32 r = qt * 128 + 64 * w + 16 * (tw >> 5) + (lane >> 2), col = 8 * c + 2 * (lane & 3);
        if (r < seq) *reinterpret_cast<u32*>(o + (u64)r * qld + col) = fa_pack<BF16>(x.x * scale, x.y * scale);
        if (r + 8 < seq) *reinterpret_cast<u32*>(o + (u64)(r + 8) * qld + col) = fa_pack<BF16>(x.z * scale, x.w * scale);
    }
}

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define HB_BODY(...) __VA_ARGS__
#else
#define HB_BODY(...)
#endif

extern "C" __global__ void __launch_bounds__(HB_THREADS, 1) hb_bwd_bf16_d64(float* dq_acc, u16* dk, u16* dv, u32* sem, u32* err, const u16* q, const u16* k, const u16* v, const u16* dout, const float* lse, const float* dsum, u32 batch, u32 seq, u32 heads, u32 kv_heads, u32 qld, u32 kvld, u32 causal, float scale, u32 chains) {
    HB_BODY(hb_bwd<true>(dq_acc, dk, dv, sem, err, q, k, v, dout, lse, dsum, batch, seq, heads, kv_heads, qld, kvld, causal, scale, chains);)
}
extern "C" __global__ void __launch_bounds__(HB_THREADS, 1) hb_bwd_f16_d64(float* dq_acc, u16* dk, u16* dv, u32* sem, u32* err, const u16* q, const u16* k, const u16* v, const u16* dout, const float* lse, const float* dsum, u32 batch, u32 seq, u32 heads, u32 kv_heads, u32 qld, u32 kvld, u32 causal, float scale, u32 chains) {
    HB_BODY(hb_bwd<false>(dq_acc, dk, dv, sem, err, q, k, v, dout, lse, dsum, batch, seq, heads, kv_heads, qld, kvld, causal, scale, chains);)
}
extern "C" __global__ void __launch_bounds__(256) hb_dq_convert_bf16(u16* dq, const float* dq_acc, u32 seq, u32 heads, u32 qld, u32 causal, float scale, u32 chains) {
    hb_dq_convert<true>(dq, dq_acc, seq, heads, qld, causal, scale, chains);
}
extern "C" __global__ void __launch_bounds__(256) hb_dq_convert_f16(u16* dq, const float* dq_acc, u32 seq, u32 heads, u32 qld, u32 causal, float scale, u32 chains) {
    hb_dq_convert<false>(dq, dq_acc, seq, heads, qld, causal, scale, chains);
}
