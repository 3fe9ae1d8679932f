// One decoding step of a pre-norm decoder in ONE kernel (ops::DecoderStep): token and position
// embeddings, then per layer RMSNorm, the q/k/v projection with the step's keys and values
// appended to the layer's KV cache, attention of the new token against its cache, the output
// projection and the residual add, RMSNorm, the gate/up projection with SwiGLU, the down
// projection and the residual add; then the final RMSNorm and the head's logits. At small
// batches a decoding step is all latency (the GPT of examples/gpt: 8 layers of 6 MB, 8 kernels
// a layer of 4-6 us each), so this kernel is persistent: one block a multiprocessor, launched
// cooperatively (the driver guarantees every block is resident), the stages separated by a
// grid-wide barrier of ours: 5 a layer (4 at batches up to FD_FUSE_O, where the attention stage
// computes the output projection too), plus one for the embeddings where the first stage
// cannot sum them as it stages its rows.
//
// NVRTC compiles this file after core.cu, ops.cu and half.cu (u32, u64, warp_sum, gr_neg_inf,
// bf16_t, ld/st, f32_to_bf16_bits come from there), with these defines: FD_D (d_model), FD_HEADS,
// FD_HID (the MLP's hidden width), and FD_WBUF_BYTES, FD_ABUF_BYTES, FD_NT (below). Storage is
// bf16; the GEMMs take n8 tiles of output columns as block tasks, f32 accumulation: up to FD_GV
// sequences one warp a column on the CUDA cores (fd_gv: each lane's 16-byte chunks of K in
// order, then the butterfly), above it on tensor cores (mma.sync m16n8k16, FD_NT tiles a pass,
// the K steps shared by the block's 8 warps and summed through shared memory in warp order). No
// atomics on data: the order depends on the sizes only, so the step is bitwise reproducible
// (eager == graphed), and a sequence's sums depend on the batch it is in only through the
// batch's next power of two (the GEMMs' path, FD_GV; the attention stage's teams,
// fd_team_warps), so a batch and the bucket it is padded to sum alike.
// Intermediates round to bf16 where the unfused ops store them (x, the normed rows, q/k/v, the
// attention output, the q/k/v and gate/up projections' outputs, the residual sums, SwiGLU's
// output, the logits); the output and down projections are added to the residual stream in f32
// and the sum rounded once, as ops::linear_residual does.
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
// The most sequences a step takes, in m16 tiles (four; fewer compile less code, for
// measurements: GRAPHED_DECODER_MT).
#ifndef FD_MT
#define FD_MT 4
#endif
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
// Attention's passes of keys loaded at once (registers: 2 x FD_HD / 64 16-byte words a pass).
#ifndef FD_APIPE
#define FD_APIPE (FD_HD <= 64 ? 8 : 4)
#endif
// The output projection's passes of Wo words loaded with the keys, where attention computes it
// (registers: FD_HD / 64 16-byte words a pass).
#ifndef FD_OPIPE
#define FD_OPIPE 4
#endif
// The largest batch whose GEMM stages run as one warp a column on the CUDA cores (fd_gv) rather
// than on tensor cores (fd_kpass): a power of two, 1 to 32. H200, the GPT of examples/gpt (call
// O of 2026-12-03): 0.198 to 0.158 ms a token at batch 1, 0.211 to 0.192 at 4; with 16 (and
// the changes of the attention stage tried in the same call), batch 8 ran 0.255 ms against
// 0.232 and batch 16 0.355 against 0.259: from 8 rows on, an m16 tile is no longer mostly
// padding.
#ifndef FD_GV
#define FD_GV 4
#endif
#if FD_GV < 1 || FD_GV > 32 || (FD_GV & (FD_GV - 1)) != 0
#error "FD_GV is a power of two up to 32 (lane b returns row b; a batch and its bucket take one path)"
#endif
// The fewest (tile, row tile) tasks of a GEMM stage for which a block gives each task to one warp
// over all of K (fd_wpass) instead of passes of FD_NT tiles with K split over the warps
// (fd_kpass): the same sums, bit for bit, without a pass's partial sums through shared memory
// and its block barrier. 0: never. 3 (H200, 2026-12-04 call E, ms a token against 0: batch 64
// 0.359 against 0.404, 32 0.296 against 0.306, 1 to 16 within 1.3%; 2 slowed 8 and 16 by 7%, 4
// and 5 gained less at 64).
#ifndef FD_WPASS_MIN
#define FD_WPASS_MIN 3
#endif

// The fewest warps a team of the attention stage (fd_team_warps): 1, 2, 4 or 8 (8: one block a
// task at every batch).
#ifndef FD_ATEAM_MIN
#define FD_ATEAM_MIN 1
#endif
#if FD_ATEAM_MIN < 1 || FD_ATEAM_MIN > FD_WARPS || (FD_ATEAM_MIN & (FD_ATEAM_MIN - 1)) != 0
#error "FD_ATEAM_MIN is 1, 2, 4 or 8"
#endif
// The largest batch whose attention stage computes the output projection too (one barrier
// and one stage fewer a layer); 0 never.
#ifndef FD_FUSE_O
#define FD_FUSE_O 4
#endif

// FD_CLUSTER (0: off, the default): the grid is one thread-block cluster of FD_CLUSTER blocks (2
// to 16; the host launches exactly one, GRAPHED_DECODER_CLUSTER), and the stages are separated
// by the cluster's hardware barrier (barrier.cluster, release at arrival, acquire at the wait)
// instead of the grid barrier's global count. Fewer multiprocessors stream the weights, but no
// barrier round trip goes through L2: an experiment for small batches, where the step is the
// chain of its stages' latencies (bench/decode_probe.py measures both barriers).
#ifndef FD_CLUSTER
#define FD_CLUSTER 0
#endif
#if FD_CLUSTER < 0 || FD_CLUSTER > 16
#error "FD_CLUSTER is 0 (the grid barrier) or a cluster of 1 to 16 blocks"
#endif
#if FD_CLUSTER
#define FD_CLUSTER_DIMS __cluster_dims__(FD_CLUSTER, 1, 1)
#else
#define FD_CLUSTER_DIMS
#endif

// FD_DSMEM (with FD_CLUSTER; 0, the default, off): the stage outputs that every block stages
// whole as its next input are also stored straight into every block's shared memory, a mirror
// after the two buffers (FD_MIRROR_BYTES: the residual stream x, the heads' output-projection
// parts, SwiGLU's output s and the queries q, for FD_MIRROR_B rows), so that the next stage reads
// them from its own shared memory instead of L2. It serves batches up to FD_MIRROR_B whose attention stage
// computes the output projection (fuse_o), from the second layer on for x (the first layer's
// x comes from the embeddings, staged by each block from L2 as before). The global copies are
// still written, and what the mirror does not hold (the caches, the down projection's residual
// x2) is read through L2 as before. Every value is the one the global copy holds: the
// step's results do not change.
#ifndef FD_DSMEM
#define FD_DSMEM 0
#endif
#if FD_DSMEM && !FD_CLUSTER
#error "FD_DSMEM needs FD_CLUSTER"
#endif
#ifndef FD_MIRROR_B
#define FD_MIRROR_B 2
#endif
#define FD_MIRROR_BYTES (FD_DSMEM ? FD_MIRROR_B * (FD_HEADS * FD_D * 4 + FD_D * 4 + FD_HID * 2) : 0)

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
// arrival after a release fence, acquire polls: the writes of every block before the barrier
// are visible to every block after it. Relaxed polls and a fence after them ran 3.8% to 5.6%
// slower a token at every batch (H100, session 28): the fence delays each block's leave, and
// at batch 64 it also waited for the weight copies thread 0 had just issued (fd_prefetch,
// between arrival and wait; the copies issued by warps 1 to 7 alone took 4% off there).
__device__ __forceinline__ unsigned long long fd_ld_relaxed(const unsigned long long* p) {
    unsigned long long v;
    asm volatile("ld.relaxed.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ unsigned long long fd_ld_acquire(const unsigned long long* p) {
    unsigned long long v;
    asm volatile("ld.acquire.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ unsigned long long fd_sync_base(const unsigned long long* bar) {
    if (threadIdx.x != 0) return 0ull;
    const unsigned long long v = fd_ld_relaxed(bar);
    return v - v % gridDim.x;
}
// The warps' partial tiles of a tile pass (fd_kpass), two operands: FD_MT row tiles for one
// column tile at a time, or, with one row tile, every column tile of the pass at once in one of
// two halves (the pass's parity: the next pass writes the other half, so one barrier a pass).
#define FD_RED_MT (FD_WARPS * 2 * FD_MT * 128)
#define FD_RED_ONE (FD_NT * FD_WARPS * 2 * 128)
#define FD_RED (FD_RED_MT > 2 * FD_RED_ONE ? FD_RED_MT : 2 * FD_RED_ONE)
__device__ __forceinline__ u32 fd_red(u32 warp, u32 op, u32 m, u32 e) { return ((warp * 2 + op) * FD_MT + m) * 128 + e; }
__device__ __forceinline__ u32 fd_red_one(u32 half, u32 j, u32 warp, u32 op, u32 e) {
    return half * FD_RED_ONE + ((j * FD_WARPS + warp) * 2 + op) * 128 + e;
}

// A GEMM stage's share of the grid for this block: the grid splits into `groups` groups of vg
// blocks (blocks past groups * vg idle), group i computing every n8 tile of the stage for rows
// [row0, row0 + rows) only. Each block then stages 1 / groups of the batch's rows, and a stage
// of few tiles (the projections back to d_model: 64 tiles of 512 columns) keeps more blocks
// busy. Block vb of its group computes the tiles vb, vb + vg, ... (fd_block_tiles). The groups
// take whole 16-row tiles, and a sum does not depend on the tile or the pass that computes it
// (fd_kpass), so the grouping changes no result.
struct FdPart {
    u32 vb, vg, row0, rows;
    u32 per;  // the rows of a group (the last one's may be fewer)
};
// FdShared::part's entries: the q/k/v, gate/up, output, down and head projections.
#define FD_P_QKV 0
#define FD_P_GU 1
#define FD_P_O 2
#define FD_P_DOWN 3
#define FD_P_HEAD 4

struct FdShared {
    // A GEMM stage's (fd_kpass) and the attention stage's buffers share their memory: the
    // static shared memory of a block is at most 48 KB.
    union {
        struct {
            float red[FD_RED];                 // the warps' partial tiles (see fd_red)
            float sum[FD_NT][2][FD_MT * 128];      // a pass's tiles' sums, two operands
            float res[FD_NT][FD_MT * 128];         // and their residual values
        } g;
        struct {
            float am[FD_WARPS], al[FD_WARPS];
            float aacc[FD_WARPS][FD_HD];
            float arow[FD_HD];  // a head's attention row, for the output projection in its stage
        } a;
    };
    float rstd[FD_MT * 16];
    FdPart part[5];  // each GEMM stage kind's share of this block (FD_P_*, fd_part), once a launch
    int len[FD_MT * 16];  // the lengths at the q/k/v stage (where its keys and values go)
    FdLayer layer;        // the table entry of the layer about to start (fd_next_layer)
    long long erow[FD_MT * 16][2];  // each sequence's token and position rows (-1: bad)
#ifdef FD_TRACE
    unsigned long long* trace;  // FD_TRACE_SLOTS words a stage and block (thread 0 writes them)
    u32 stage;
#endif
};

// With FD_TRACE (GRAPHED_DECODER_TRACE on the host) thread 0 of every block records clock64 at
// points of each stage: FD_T_READY (its inputs on chip), FD_T_KDONE (its first tile pass's K
// loop done), FD_T_ARRIVE (at the barrier), FD_T_LEAVE (past it), and %globaltimer at arrival
// and leave; the last stage slot holds the kernel's start. Off, the marks compile to nothing.
#define FD_TRACE_STAGES 64
#define FD_TRACE_SLOTS 6
#define FD_T_READY 0
#define FD_T_KDONE 1
#define FD_T_ARRIVE 2
#define FD_T_LEAVE 3
#define FD_T_GT_ARRIVE 4
#define FD_T_GT_LEAVE 5
#ifdef FD_TRACE
__device__ __forceinline__ unsigned long long fd_globaltimer() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %globaltimer;" : "=l"(t));
    return t;
}
__device__ __forceinline__ void fd_mark_at(FdShared& sh, u32 stage, u32 slot, unsigned long long v) {
    if (threadIdx.x == 0 && sh.trace != nullptr && stage < FD_TRACE_STAGES)
        sh.trace[((u64)blockIdx.x * FD_TRACE_STAGES + stage) * FD_TRACE_SLOTS + slot] = v;
}
#define FD_MARK(sh, slot) fd_mark_at(sh, sh.stage, slot, clock64())
#define FD_MARK_GT(sh, slot) fd_mark_at(sh, sh.stage, slot, fd_globaltimer())
#else
#define FD_MARK(sh, slot) \
    do {              \
    } while (0)
#define FD_MARK_GT(sh, slot) \
    do {                 \
    } while (0)
#endif

// The grid barrier in two halves, so that a block can issue work that no other block waits for
// (the next stage's weight copy) between its arrival and its wait: fd_arrive once every thread
// of the block is done with the stage's writes, fd_wait until every block has arrived.
// With FD_CLUSTER, every thread arrives at the cluster's barrier (release: its writes before
// are visible to every thread of the cluster past the wait) and waits there (acquire); the
// block barrier before the arrival stays (fd_prefetch relies on it).
__device__ __forceinline__ void fd_arrive(FdShared& sh, unsigned long long* bar, unsigned long long& target) {
    __syncthreads();
    if (threadIdx.x == 0) {
        FD_MARK(sh, FD_T_ARRIVE);
        FD_MARK_GT(sh, FD_T_GT_ARRIVE);
#if !FD_CLUSTER
        target += gridDim.x;
        asm volatile("fence.acq_rel.gpu;" ::: "memory");
        asm volatile("red.relaxed.gpu.global.add.u64 [%0], 1;" ::"l"(bar) : "memory");
#endif
    }
#if FD_CLUSTER
    (void)bar;
    (void)target;
    asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
#endif
}
__device__ __forceinline__ void fd_wait(FdShared& sh, unsigned long long* bar, const unsigned long long& target) {
#if FD_CLUSTER
    (void)bar;
    (void)target;
    asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");
#endif
    if (threadIdx.x == 0) {
#if !FD_CLUSTER
        while (fd_ld_acquire(bar) < target) {
        }
#endif
        FD_MARK(sh, FD_T_LEAVE);
        FD_MARK_GT(sh, FD_T_GT_LEAVE);
#ifdef FD_TRACE
        ++sh.stage;
        FD_MARK(sh, FD_T_READY);  // a stage with no staging is ready when it starts
        fd_mark_at(sh, sh.stage, FD_T_KDONE, 0ull);
#endif
    }
    __syncthreads();
}
__device__ __forceinline__ void fd_sync(FdShared& sh, unsigned long long* bar, unsigned long long& target) {
    fd_arrive(sh, bar, target);
    fd_wait(sh, bar, target);
}

// rstd of each of the first `batch` rows ([batch, FD_D], 16 bytes a load through `ld16(b, c)`:
// row b's values 8c..8c+7) into sh.rstd: one warp a row, each lane's squares in order, then the
// butterfly.
template <typename Ld> __device__ __forceinline__ void fd_rstd(FdShared& sh, u32 batch, float eps, Ld ld16) {
    const u32 lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (u32 b = warp; b < batch; b += FD_WARPS) {
        float s = 0.0f;
        for (u32 c = lane; c < FD_D / 8; c += 32) {
            const uint4 v = ld16(b, c);
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

// Eight values of a row normed: v * rstd * gamma, rounded to bf16 as rms_norm stores them.
__device__ __forceinline__ uint4 fd_norm8(uint4 v, uint4 gv, float r) {
    return make_uint4(fd_pack(fd_lo(v.x) * r * fd_lo(gv.x), fd_hi(v.x) * r * fd_hi(gv.x)),
                      fd_pack(fd_lo(v.y) * r * fd_lo(gv.y), fd_hi(v.y) * r * fd_hi(gv.y)),
                      fd_pack(fd_lo(v.z) * r * fd_lo(gv.z), fd_hi(v.z) * r * fd_hi(gv.z)),
                      fd_pack(fd_lo(v.w) * r * fd_lo(gv.w), fd_hi(v.w) * r * fd_hi(gv.w)));
}

extern __shared__ __align__(16) u32 fd_wbuf[];

// This block's mirror (FD_DSMEM), after the weight and activation buffers: the heads' parts
// [FD_HEADS, batch, FD_D] f32, then x [batch, FD_D], s [batch, FD_HID] and q [batch, FD_D] bf16 (the global
// copies' layouts at the launch's batch; every part 16-byte aligned: the host rounds the
// buffers to 16 bytes and FD_D, FD_HID are multiples of 8).
struct FdMirror {
    float* part;
    bf16_t* x;
    bf16_t* s;
    bf16_t* q;
};
__device__ __forceinline__ FdMirror fd_mirror() {
    char* base = reinterpret_cast<char*>(fd_wbuf) + FD_WBUF_BYTES + FD_ABUF_BYTES;
    FdMirror m;
    m.part = reinterpret_cast<float*>(base);
    m.x = reinterpret_cast<bf16_t*>(base + (u64)FD_MIRROR_B * FD_HEADS * FD_D * 4);
    m.s = m.x + (u64)FD_MIRROR_B * FD_D;
    m.q = m.s + (u64)FD_MIRROR_B * FD_HID;
    return m;
}
#if FD_CLUSTER
// Stores v at `local` (an address in this block's mirror) in every block of the cluster, this
// one included: the same offset of each block's shared memory (mapa).
__device__ __forceinline__ u32 fd_remote(const void* local, u32 rank) {
    u32 r;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r) : "r"((u32)__cvta_generic_to_shared(local)), "r"(rank));
    return r;
}
__device__ __forceinline__ void fd_push_bf16(bf16_t* local, float v) {
    const unsigned short bits = f32_to_bf16_bits(v);
#pragma unroll 1
    for (u32 r = 0; r < FD_CLUSTER; ++r) asm volatile("st.shared::cluster.u16 [%0], %1;" ::"r"(fd_remote(local, r)), "h"(bits) : "memory");
}
__device__ __forceinline__ void fd_push_f32(float* local, float v) {
#pragma unroll 1
    for (u32 r = 0; r < FD_CLUSTER; ++r) asm volatile("st.shared::cluster.f32 [%0], %1;" ::"r"(fd_remote(local, r)), "f"(v) : "memory");
}
#else
__device__ __forceinline__ void fd_push_bf16(bf16_t*, float) {}
__device__ __forceinline__ void fd_push_f32(float*, float) {}
#endif


// A stage's weight rows in fd_wbuf: ROWS rows a tile (the up rows after the gate rows with
// PAIR), SW words a row (K / 2, padded so that the eight rows a fragment load reads start in
// eight different bank quads), the block's first FIT tiles (the rest are read from global
// memory).
template <int K, bool PAIR> struct FdW {
    static constexpr u32 ROWS = PAIR ? 16 : 8;
    static constexpr u32 SW = K / 2 + ((K / 2) % 8 == 0 ? 4 : 0);
    static constexpr u32 FIT = FD_WBUF_BYTES / (ROWS * SW * 4);
};

// The n8 tiles of an n-column stage that block vb of a group of vg computes.
__device__ __forceinline__ u32 fd_block_tiles(u32 n, u32 vb, u32 vg) {
    const u32 tiles = n / 8;
    return vb < tiles ? (tiles - vb + vg - 1) / vg : 0u;
}

// The fewest rows a group of a GEMM stage takes (a multiple of 16; 64 or more: one group, every
// block stages every row).
#ifndef FD_GROUP_ROWS
#define FD_GROUP_ROWS 16
#endif
#if FD_GROUP_ROWS < 16 || FD_GROUP_ROWS % 16 != 0
#error "FD_GROUP_ROWS is a multiple of 16"
#endif

// This block's share of an n-column GEMM stage of K (pair as fd_gemm's) at `batch` rows: the
// groups that give each FD_GROUP_ROWS rows or more (at most 4), fewer where a block's tiles
// would then outgrow its weight buffer (P::FIT) while one group's fit. Every block computes
// the same groups, so fd_prefetch and fd_gemm agree. The kernel computes each stage kind's
// share once a launch (FdShared::part: its divisions cost a stage about 0.4 us, H200 call A of
// 2026-12-04, when every stage computed its own).
template <int K, bool PAIR> __device__ __forceinline__ FdPart fd_part(u32 n, u32 batch) {
    using P = FdW<K, PAIR>;
    const u32 mtiles = (batch + 15) / 16, tiles = n / 8;
    u32 groups = (mtiles * 16 + FD_GROUP_ROWS - 1) / FD_GROUP_ROWS;
    if (batch <= FD_GV || groups < 1) groups = 1;
    if (groups > 4) groups = 4;
    if (groups > mtiles) groups = mtiles;
    // A grid of fewer blocks than groups (a small cluster) gives each block a group at most.
    if (groups > gridDim.x) groups = gridDim.x;
    const u32 one = (tiles + gridDim.x - 1) / gridDim.x;
    const u32 room = P::FIT > one ? P::FIT : one;
    while (groups > 1 && (tiles + gridDim.x / groups - 1) / (gridDim.x / groups) > room) --groups;
    const u32 vg = gridDim.x / groups, gi = blockIdx.x / vg;
    const u32 per = (mtiles + groups - 1) / groups * 16;
    FdPart part{blockIdx.x - gi * vg, vg, gi * per, 0u, per};
    if (gi < groups && part.row0 < batch) part.rows = batch - part.row0 < per ? batch - part.row0 : per;
    return part;
}

// This block's share of GEMM stage kind k (FD_P_*) in the kernel: read from FdShared::part,
// where fd_part put it once a launch. Built for one row tile (FD_MT 1, at most 16 sequences,
// GRAPHED_DECODER_MT=1), every stage is one group of the whole grid, which is fd_part's answer
// at 16 rows or fewer: {blockIdx.x, gridDim.x, 0, batch, 16}. That share is written out where it
// is used, so the compiler folds a block's rows to the batch again (read from shared memory it
// cannot: H200 call B of 2026-12-04, batch 1 5% slower than with the shares computed in place).
#if FD_MT == 1
#define FD_PART(k) (FdPart{blockIdx.x, gridDim.x, 0u, batch, 16u})
#else
#define FD_PART(k) (sh.part[k])
#endif

// Starts copying this block's weight rows of a stage (w, n columns, pair and part as fd_gemm's) into
// fd_wbuf; fd_gemm waits for them. Call after every warp has finished the previous stage's
// reads of fd_wbuf (the kernel calls it at its start, and after fd_arrive's block barrier).
template <int K, bool PAIR> __device__ __forceinline__ void fd_prefetch(const bf16_t* w, u32 n, u32 pair, const FdPart part) {
    using P = FdW<K, PAIR>;
    constexpr u32 CPR = K / 8;  // 16-byte chunks a row (K % 8 == 0: the host checks)
    const u32 tiles = part.rows > 0 ? fd_block_tiles(n, part.vb, part.vg) : 0u;
    const u32 npf = tiles < P::FIT ? tiles : P::FIT;
    const u32 total = npf * P::ROWS * CPR;
    for (u32 c = threadIdx.x; c < total; c += FD_THREADS) {
        const u32 row = c / CPR, o = c - row * CPR;
        const u32 ti = row / P::ROWS, r = row - ti * P::ROWS;
        const u32 tile = part.vb + ti * part.vg;
        const u32 wr = (PAIR && r >= 8) ? pair + tile * 8 + (r - 8) : tile * 8 + r;
        const bf16_t* src = w + (u64)wr * K + o * 8;
        const u32 dst = (u32)__cvta_generic_to_shared(fd_wbuf + row * P::SW + o * 4);
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(src) : "memory");
    }
    asm volatile("cp.async.commit_group;" ::: "memory");
}

// fd_gemm's row sources: a's rows ([batch, K] bf16, read through L2), or the embeddings' sum
// (token row sh.erow[b][0] plus position row sh.erow[b][1], rounded as add_rms_norm rounds its
// residual sum; a row of -1, a bad id or position, counts as zeros).
template <int K> struct FdRows {
    const bf16_t* a;
    __device__ __forceinline__ uint4 operator()(u32 b, u32 v) const { return fd_ld128cg(a + (u64)b * K + v); }
};
// The same rows from this block's mirror (FD_DSMEM).
template <int K> struct FdRowsLocal {
    const bf16_t* a;
    __device__ __forceinline__ uint4 operator()(u32 b, u32 v) const { return *reinterpret_cast<const uint4*>(a + (u64)b * K + v); }
};
struct FdEmbedded {
    const FdShared* sh;
    const bf16_t* tok;
    const bf16_t* pos;
    __device__ __forceinline__ uint4 operator()(u32 b, u32 v) const {
        const long long r = sh->erow[b][0], p = sh->erow[b][1];
        const uint4 z = make_uint4(0u, 0u, 0u, 0u);
        const uint4 t = r < 0 ? z : *reinterpret_cast<const uint4*>(tok + (u64)r * FD_D + v);
        const uint4 q = p < 0 ? z : *reinterpret_cast<const uint4*>(pos + (u64)p * FD_D + v);
        return make_uint4(fd_pack(fd_lo(t.x) + fd_lo(q.x), fd_hi(t.x) + fd_hi(q.x)), fd_pack(fd_lo(t.y) + fd_lo(q.y), fd_hi(t.y) + fd_hi(q.y)),
                          fd_pack(fd_lo(t.z) + fd_lo(q.z), fd_hi(t.z) + fd_hi(q.z)), fd_pack(fd_lo(t.w) + fd_lo(q.w), fd_hi(t.w) + fd_hi(q.w)));
    }
};

// Epilogue elements a thread handles per tile (FD_MT m16 tiles of 16 x 8 values), at most.
#define FD_EPT ((FD_MT * 128 + FD_THREADS - 1) / FD_THREADS)

// One GEMM stage's K work, as fd_gemm hands it to fd_kpass. The K loop is not inlined into
// each stage: one copy serves every stage of the same K, pair and row tiles (fd_kpass's
// template), so that a stage runs code that the stages before it brought on chip. With a copy
// for every stage kind (seven, each unrolled over the row and column tiles and inlined three
// times) the kernel measured 480 KB of machine code, far more than the instruction caches hold.
struct FdPass {
    const bf16_t* a;      // the rows [batch, K] (read through L2 where they are not staged whole)
    const bf16_t* gamma;  // the RMSNorm's weights (norm)
    const bf16_t* w;      // W: n rows of K (then the pair's rows, `pair` rows further down)
    const bf16_t* resid;  // the residual's rows [batch, n] (row stride n), or null
    u32* abuf;            // the activation buffer
    u32 n, pair, batch, mine, mtiles;
    u32 vb, vg;  // the block's place in its group (FdPart)
    u32 sw;   // words a row of abuf
    u32 ksc;  // K steps a staged chunk (all of them where the rows are staged whole; 0: not staged)
    bool norm, whole;
};

// fd_kpass's K loop over steps [ks0, ks1) (this warp's: ks0 + warp, + FD_WARPS, ...) for the
// tiles t0.. of the pass and the first MT row tiles: the weight fragments through wrow/wrow2,
// the activation fragments from abuf (rows p.sw words apart, holding values from step ks0 on)
// when staged, else from p.a through L2 (normed with p.norm). Forced inline, so that the
// calls over all of K keep constant bounds.
template <int K, bool PAIR, int MT>
__device__ __forceinline__ void fd_kloop(const FdShared& sh, const FdPass& p, float (&acc)[FD_NT][MT][4], float (&acc2)[FD_NT][MT][4],
                                         const u32* const (&wrow)[FD_NT], const u32* const (&wrow2)[FD_NT], bool staged, u32 ks0, u32 ks1, u32 t0) {
    const u32 lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const u32 mine = p.mine, mtiles = p.mtiles, batch = p.batch, sw = p.sw;
    const bool norm = p.norm && !staged;
    using P = FdW<K, PAIR>;
    if (staged && t0 + FD_NT <= mine && t0 + FD_NT <= P::FIT) {
        // The common case on its own: every tile of the pass in the weight buffer and the rows
        // staged. The same fragments into the same mma in the same order as the loop below
        // (the same bits), addressed from fd_wbuf itself with the row tests hoisted, so that the
        // step is shared-memory loads and mma (in the loop below the weights come through
        // generic pointers, global or shared, and every row and tile test sits inside the
        // step: about 100 instructions a step for 2 mma at batch 64, Nsight Compute, H100).
        const u32* ab = fd_wbuf + FD_WBUF_BYTES / 4;
        const u32* wr[FD_NT];
        const u32* wr2[FD_NT];
#pragma unroll
        for (u32 j = 0; j < FD_NT; ++j) {
            wr[j] = fd_wbuf + ((t0 + j) * P::ROWS + g) * P::SW + t;
            wr2[j] = fd_wbuf + ((t0 + j) * P::ROWS + 8 + g) * P::SW + t;
        }
        const u32* ar[MT][2];
        bool aok[MT][2];
#pragma unroll
        for (u32 m = 0; m < MT; ++m) {
#pragma unroll
            for (u32 h = 0; h < 2; ++h) {
                const u32 row = m * 16 + g + 8 * h;
                aok[m][h] = m < mtiles && row < batch;
                ar[m][h] = ab + (aok[m][h] ? row : 0u) * sw + t;
            }
        }
#pragma unroll 1
        for (u32 ks = ks0 + warp; ks < ks1; ks += FD_WARPS) {
            const u32 k0 = ks * 16, kl = k0 - ks0 * 16;
            const bool hi_ok = k0 + 8 < K;
            const u32 wl = k0 >> 1, wh = (k0 + 8) >> 1, al = kl >> 1, ah = (kl + 8) >> 1;
            u32 bw[FD_NT][2], cw[FD_NT][2];
#pragma unroll
            for (u32 j = 0; j < FD_NT; ++j) {
                bw[j][0] = wr[j][wl];
                bw[j][1] = hi_ok ? wr[j][wh] : 0u;
                cw[j][0] = cw[j][1] = 0u;
                if constexpr (PAIR) {
                    cw[j][0] = wr2[j][wl];
                    cw[j][1] = hi_ok ? wr2[j][wh] : 0u;
                }
            }
#pragma unroll
            for (u32 m = 0; m < MT; ++m) {
                if (m >= mtiles) break;
                const u32 av0 = aok[m][0] ? ar[m][0][al] : 0u, av1 = aok[m][1] ? ar[m][1][al] : 0u;
                const u32 av2 = aok[m][0] && hi_ok ? ar[m][0][ah] : 0u, av3 = aok[m][1] && hi_ok ? ar[m][1][ah] : 0u;
                __syncwarp();  // mma.sync wants the whole warp, converged after the row tests
#pragma unroll
                for (u32 j = 0; j < FD_NT; ++j) {
                    fd_mma(acc[j][m], av0, av1, av2, av3, bw[j][0], bw[j][1]);
                    if constexpr (PAIR) fd_mma(acc2[j][m], av0, av1, av2, av3, cw[j][0], cw[j][1]);
                }
            }
        }
        return;
    }
    // Not unrolled: a step's loads and MMAs are few at small batches, and an unrolled loop's
    // machine code is what the warps wait for (H200 call L, batch 1: 0.231 ms a token unrolled
    // four times, 0.204 not; a fifth of the warps' stall samples are on instruction fetch).
#pragma unroll 1
    for (u32 ks = ks0 + warp; ks < ks1; ks += FD_WARPS) {
        const u32 k0 = ks * 16, kl = k0 - ks0 * 16;  // kl: in the staged chunk
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
        if (norm) {
            ga = reinterpret_cast<const u32*>(p.gamma)[(k0 >> 1) + t];
            gb = hi_ok ? reinterpret_cast<const u32*>(p.gamma)[((k0 + 8) >> 1) + t] : 0u;
        }
#pragma unroll
        for (u32 m = 0; m < MT; ++m) {
            if (m >= mtiles) break;
            const u32 r0 = m * 16 + g, r1 = r0 + 8;
            u32 av[4] = {0u, 0u, 0u, 0u};
            const u32 rows[2] = {r0, r1};
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                if (rows[h] >= batch) continue;
                if (staged) {
                    const u32* srow = p.abuf + rows[h] * sw;
                    av[h] = srow[(kl >> 1) + t];
                    av[2 + h] = hi_ok ? srow[((kl + 8) >> 1) + t] : 0u;
                    continue;
                }
                const u32* arow = reinterpret_cast<const u32*>(p.a + (u64)rows[h] * K);
                u32 lo = fd_ld32cg(arow + (k0 >> 1) + t);
                u32 hi = hi_ok ? fd_ld32cg(arow + ((k0 + 8) >> 1) + t) : 0u;
                if (norm) {
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
}

// One pass of a GEMM stage over K for the block's tiles t0 .. t0 + FD_NT - 1 and its first MT
// row tiles (see fd_gemm): each tile's sums (the warps' partial sums added in warp order) go to
// sh.g.sum, its residual values (p.resid, loaded before the K loop so that the epilogue waits
// for no load) to sh.g.res, at the index of the thread that hands them to the epilogue (element
// e = threadIdx.x + i FD_THREADS: row (e >> 7) * 16 + ((e >> 3) & 15), column e & 7). Rows that
// are not staged whole are staged here in chunks of p.ksc K steps (from p.a, normed with
// p.norm), or not at all (p.ksc 0). Not inlined (see FdPass). When it returns, every warp of
// the block is done with fd_wbuf and the activation buffer (the barrier before the sums); a
// thread reads back only the sums it stored itself.
template <int K, bool PAIR, int MT>
__device__ __noinline__ void fd_kpass(FdShared& sh, const FdPass p, u32 t0) {
    using P = FdW<K, PAIR>;
    constexpr u32 KS = (K + 15) / 16;
    const u32 lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    float acc[FD_NT][MT][4], acc2[FD_NT][MT][4];
#pragma unroll
    for (int j = 0; j < FD_NT; ++j)
#pragma unroll
        for (int m = 0; m < MT; ++m)
#pragma unroll
            for (int i = 0; i < 4; ++i) acc[j][m][i] = acc2[j][m][i] = 0.0f;
    // Each tile's two weight rows for this lane: in fd_wbuf (words) or in W (global).
    const u32* wrow[FD_NT];
    const u32* wrow2[FD_NT];
    float rv[FD_NT][FD_EPT];
#pragma unroll
    for (u32 j = 0; j < FD_NT; ++j) {
        const u32 ti = t0 + j, n0 = (p.vb + ti * p.vg) * 8;
        if (ti < P::FIT) {
            wrow[j] = fd_wbuf + (ti * P::ROWS + g) * P::SW;
            wrow2[j] = fd_wbuf + (ti * P::ROWS + 8 + g) * P::SW;
        } else {
            wrow[j] = reinterpret_cast<const u32*>(p.w + (u64)(n0 + g) * K);
            wrow2[j] = reinterpret_cast<const u32*>(p.w + (u64)(p.pair + n0 + g) * K);
        }
#pragma unroll
        for (u32 i = 0; i < FD_EPT; ++i) {
            rv[j][i] = 0.0f;
            const u32 e = threadIdx.x + i * FD_THREADS, b = (e >> 7) * 16 + ((e >> 3) & 15);
            if (p.resid != nullptr && ti < p.mine && e < p.mtiles * 128 && b < p.batch) rv[j][i] = fd_ldcg(p.resid, (u64)b * p.n + n0 + (e & 7));
        }
    }
    const bool staged = p.ksc > 0;
    if (staged && !p.whole) {
        for (u32 ks0 = 0; ks0 < KS; ks0 += p.ksc) {
            const u32 ks1 = ks0 + p.ksc < KS ? ks0 + p.ksc : KS;
            // Values [v0, v1) of the rows into the buffer, normed with p.norm.
            const u32 v0 = ks0 * 16, v1 = ks1 * 16 < K ? ks1 * 16 : K, cpr = (v1 - v0) / 8;
            __syncthreads();  // every warp is done with the chunk before
            for (u32 c = threadIdx.x; c < p.batch * cpr; c += FD_THREADS) {
                const u32 b = c / cpr, o = c - b * cpr;
                uint4 v = fd_ld128cg(p.a + (u64)b * K + v0 + o * 8);
                if (p.norm) v = fd_norm8(v, reinterpret_cast<const uint4*>(p.gamma)[v0 / 8 + o], sh.rstd[b]);
                *reinterpret_cast<uint4*>(p.abuf + b * p.sw + o * 4) = v;
            }
            __syncthreads();
            fd_kloop<K, PAIR, MT>(sh, p, acc, acc2, wrow, wrow2, true, ks0, ks1, t0);
        }
    } else {
        fd_kloop<K, PAIR, MT>(sh, p, acc, acc2, wrow, wrow2, staged, 0u, KS, t0);
    }
    if (t0 == 0) FD_MARK(sh, FD_T_KDONE);
    // Each tile's warps' partial sums, added in warp order.
    if constexpr (MT == 1) {
        // Every tile of the pass at once, in the half of red that the pass's parity names:
        // one barrier a pass. The next pass writes the other half; the one after writes this
        // half again only past the next pass's barrier, which every thread reaches after its
        // sums here. Every warp is done with fd_wbuf and the activation buffer at the barrier.
        const u32 half = (t0 / FD_NT) & 1u;
#pragma unroll
        for (u32 j = 0; j < FD_NT; ++j) {
            if (t0 + j >= p.mine) break;
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const u32 e = (g + (i >= 2 ? 8 : 0)) * 8 + 2 * t + (i & 1);
                sh.g.red[fd_red_one(half, j, warp, 0, e)] = acc[j][0][i];
                if constexpr (PAIR) sh.g.red[fd_red_one(half, j, warp, 1, e)] = acc2[j][0][i];
            }
        }
        __syncthreads();
        const u32 e = threadIdx.x;
        if (e < 128) {
#pragma unroll
            for (u32 j = 0; j < FD_NT; ++j) {
                if (t0 + j >= p.mine) break;
                float v = 0.0f, v2 = 0.0f;
#pragma unroll
                for (int wi = 0; wi < FD_WARPS; ++wi) {
                    v += sh.g.red[fd_red_one(half, j, wi, 0, e)];
                    if constexpr (PAIR) v2 += sh.g.red[fd_red_one(half, j, wi, 1, e)];
                }
                sh.g.sum[j][0][e] = v;
                sh.g.sum[j][1][e] = v2;
                sh.g.res[j][e] = rv[j][0];
            }
        }
        return;
    }
#pragma unroll
    for (u32 j = 0; j < FD_NT; ++j) {
        if (t0 + j >= p.mine) break;
#pragma unroll
        for (u32 m = 0; m < MT; ++m) {
            if (m >= p.mtiles) break;
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const u32 e = (g + (i >= 2 ? 8 : 0)) * 8 + 2 * t + (i & 1);
                sh.g.red[fd_red(warp, 0, m, e)] = acc[j][m][i];
                if constexpr (PAIR) sh.g.red[fd_red(warp, 1, m, e)] = acc2[j][m][i];
            }
        }
        __syncthreads();
#pragma unroll
        for (u32 i = 0; i < FD_EPT; ++i) {
            const u32 e = threadIdx.x + i * FD_THREADS;
            if (e >= p.mtiles * 128) break;
            const u32 m = e >> 7;
            float v = 0.0f, v2 = 0.0f;
#pragma unroll
            for (int wi = 0; wi < FD_WARPS; ++wi) {
                v += sh.g.red[fd_red(wi, 0, m, e & 127)];
                if constexpr (PAIR) v2 += sh.g.red[fd_red(wi, 1, m, e & 127)];
            }
            sh.g.sum[j][0][e] = v;
            sh.g.sum[j][1][e] = v2;
            sh.g.res[j][e] = rv[j][i];
        }
        __syncthreads();
    }
}

#if FD_WPASS_MIN > 0
// fd_gemm's K work as one warp a task: the block's tiles t (0 .. p.mine - 1) by row tiles m (0 ..
// p.mtiles - 1), task t * mtiles + m to warp (task mod FD_WARPS), each over all of K from the
// rows staged whole (p.whole). A warp keeps eight accumulators, step ks into accumulator ks mod
// 8, and adds them in order at the end: the sums fd_kpass's warp w makes of steps ks = w mod 8,
// added in warp order, so every element is bit for bit what fd_kpass gives (the same fragments
// into the same mma, in the same order). The eight chains are independent, so a warp's steps
// overlap. Each task's sums go to sh.g.red (128 values a task, then the pair's 128 with PAIR; the
// caller checks they fit), element e = row * 8 + column of the 16 x 8 tile; then a block barrier.
// Not inlined (see FdPass).
template <int K, bool PAIR>
__device__ __noinline__ void fd_wpass(FdShared& sh, const FdPass p) {
    using P = FdW<K, PAIR>;
    constexpr u32 KS = (K + 15) / 16;
    const u32 lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const u32 tasks = p.mine * p.mtiles;
#pragma unroll 1
    for (u32 task = warp; task < tasks; task += FD_WARPS) {
        const u32 ti = task / p.mtiles, m = task - ti * p.mtiles, n0 = (p.vb + ti * p.vg) * 8;
        const u32* wrow;
        const u32* wrow2;
        if (ti < P::FIT) {
            wrow = fd_wbuf + (ti * P::ROWS + g) * P::SW;
            wrow2 = fd_wbuf + (ti * P::ROWS + 8 + g) * P::SW;
        } else {
            wrow = reinterpret_cast<const u32*>(p.w + (u64)(n0 + g) * K);
            wrow2 = reinterpret_cast<const u32*>(p.w + (u64)(p.pair + n0 + g) * K);
        }
        const u32 r0 = m * 16 + g, r1 = r0 + 8;
        const bool ok0 = r0 < p.batch, ok1 = r1 < p.batch;
        const u32* s0 = p.abuf + (ok0 ? r0 : 0u) * p.sw;
        const u32* s1 = p.abuf + (ok1 ? r1 : 0u) * p.sw;
        float acc[8][4], acc2[8][4];
#pragma unroll
        for (int r = 0; r < 8; ++r)
#pragma unroll
            for (int i = 0; i < 4; ++i) acc[r][i] = acc2[r][i] = 0.0f;
#pragma unroll 1
        for (u32 ks0 = 0; ks0 < KS; ks0 += 8) {
#pragma unroll
            for (u32 r = 0; r < 8; ++r) {
                const u32 ks = ks0 + r;
                if (ks >= KS) break;  // the same in the whole warp
                const u32 k0 = ks * 16, lo = (k0 >> 1) + t, hi = ((k0 + 8) >> 1) + t;
                const bool hi_ok = k0 + 8 < K;
                const u32 a0 = ok0 ? s0[lo] : 0u, a1 = ok1 ? s1[lo] : 0u;
                const u32 a2 = ok0 && hi_ok ? s0[hi] : 0u, a3 = ok1 && hi_ok ? s1[hi] : 0u;
                fd_mma(acc[r], a0, a1, a2, a3, wrow[lo], hi_ok ? wrow[hi] : 0u);
                if constexpr (PAIR) fd_mma(acc2[r], a0, a1, a2, a3, wrow2[lo], hi_ok ? wrow2[hi] : 0u);
            }
        }
        float* out = sh.g.red + task * (PAIR ? 256 : 128);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const u32 e = (g + (i >= 2 ? 8 : 0)) * 8 + 2 * t + (i & 1);
            float v = 0.0f, v2 = 0.0f;
#pragma unroll
            for (int r = 0; r < 8; ++r) {
                v += acc[r][i];
                if constexpr (PAIR) v2 += acc2[r][i];
            }
            out[e] = v;
            if constexpr (PAIR) out[128 + e] = v2;
        }
    }
    __syncthreads();
}
#endif

// Adds the products of eight values of a row (a) and of a weight row (w) to s, in order.
__device__ __forceinline__ void fd_dot8(float& s, uint4 a, uint4 w) {
    const u32 aw[4] = {a.x, a.y, a.z, a.w}, ww[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        s += fd_lo(aw[i]) * fd_lo(ww[i]);
        s += fd_hi(aw[i]) * fd_hi(ww[i]);
    }
}

// fd_gemm's K work at small batches (at most FD_GV rows, staged whole in abuf, rows sw words
// apart): one warp a column, its weight row w (and with PAIR the pair's row w2), each lane the
// 16-byte chunks c = lane, lane + 32, ... of K in turn (eight products in order each), then the
// butterfly. Lane b returns row b's sums. At one to a few rows an m16n8k16 tile is mostly
// padding, and its warps' partial sums cost a pass through shared memory and a block barrier;
// here a column's sum stays in its warp. Not inlined (see FdPass): one copy a K and pair.
template <int K, bool PAIR>
__device__ __noinline__ float2 fd_gv(const u32* abuf, u32 sw, const uint4* w, const uint4* w2, u32 batch) {
    constexpr u32 CPR = K / 8;
    const u32 lane = threadIdx.x & 31;
    float s[FD_GV], s2[FD_GV];
#pragma unroll
    for (int b = 0; b < FD_GV; ++b) s[b] = s2[b] = 0.0f;
#pragma unroll 1
    for (u32 c = lane; c < CPR; c += 32) {
        const uint4 wv = w[c];
        uint4 wv2 = make_uint4(0u, 0u, 0u, 0u);
        if constexpr (PAIR) wv2 = w2[c];
#pragma unroll
        for (u32 b = 0; b < FD_GV; ++b) {
            if (b >= batch) break;
            const uint4 av = *reinterpret_cast<const uint4*>(abuf + b * sw + c * 4);
            fd_dot8(s[b], av, wv);
            if constexpr (PAIR) fd_dot8(s2[b], av, wv2);
        }
    }
    float v = 0.0f, v2 = 0.0f;
#pragma unroll
    for (u32 b = 0; b < FD_GV; ++b) {
        if (b >= batch) break;  // the same in the whole warp (the shuffles want every lane)
        const float t = warp_sum(s[b]);
        if (lane == b) v = t;
        if constexpr (PAIR) {
            const float t2 = warp_sum(s2[b]);
            if (lane == b) v2 = t2;
        }
    }
    return make_float2(v, v2);
}

// One GEMM stage: for every n8 tile of `n` output columns, out[b, j] = sum_k A[b, k] W[j, k] for
// the batch's rows, handed to `epi(b, j, v, v2, r)`. The block's tasks are its group's rows
// (`part`, from fd_part) in the tiles vb, vb + vg, ..., FD_NT at a time. A is `a_all` ([batch, K] bf16) or,
// with NORM, the RMSNorm of it (a * rstd[b] * gamma[k], rounded to bf16 as rms_norm stores it;
// the rstd in eps). With
// PAIR each tile also computes the columns `pair` rows further down W (SwiGLU's up next to its
// gate) as v2. With RESID, r is resid_all[b, j] (row stride n); otherwise 0. The block's first
// tiles' weights come from fd_wbuf (fd_prefetch), the rest from W in global memory.
//
// The activation rows go to shared memory once (16-byte loads; NORM: the raw rows, their rstd
// from there, then normed in place) where the batch's rows fit FD_ABUF_BYTES; where they do not,
// in chunks of K (a multiple of 8 K steps, so each warp's steps and their order stay those of
// one pass), staged again each tile pass (fd_kpass, from `a`); with no room for a chunk, every
// warp reads its fragments from L2. Every way sums the same products in the same order: the
// result does not depend on the buffers' sizes. (Up to FD_GV sequences the columns are one
// warp's each, fd_gv, which reads the rows staged whole; with a buffer too small for them, a
// measurement setting of GRAPHED_DECODER_ABUF, those batches take the tensor-core order.)
//
// `src(b, v)` gives row b's values v..v+7 (16 bytes) for the whole rows' staging; FdRows reads
// them from `a`, FdEmbedded sums the embeddings, FdResidSum the heads' projections (those two
// only where the rows fit whole: the callers make sure). With `keep`, the first block of each
// group also stores its staged raw rows there (the residual stream, when src computes it).
template <int K, bool NORM, bool PAIR, bool RESID, typename Src, typename Epi>
__device__ __forceinline__ void fd_gemm(FdShared& sh, const bf16_t* a_all, Src src, bf16_t* keep, const bf16_t* gamma, const bf16_t* w, u32 n,
                                        u32 pair, const FdPart part, float eps, const bf16_t* resid_all, Epi epi) {
    using P = FdW<K, PAIR>;
    constexpr u32 KS = (K + 15) / 16;
    // This block's rows (its group's) and tiles; below, row b is row row0 + b of the batch.
    const u32 batch = part.rows, row0 = part.row0;
    const bf16_t* a = a_all + (u64)row0 * K;
    const bf16_t* resid = RESID ? resid_all + (u64)row0 * n : nullptr;
    const u32 mtiles = (batch + 15) / 16;
    const u32 mine = batch > 0 ? fd_block_tiles(n, part.vb, part.vg) : 0u;
    const bool keeper = keep != nullptr && part.vb == 0 && batch > 0;
    if (mine == 0 && !keeper) {
        asm volatile("cp.async.wait_all;" ::: "memory");
        return;
    }
    // The activation buffer: whole rows of P::SW words, or chunks of ksc K steps (sw words a
    // row), or none.
    u32* abuf = fd_wbuf + FD_WBUF_BYTES / 4;
    const bool whole = batch * P::SW * 4 <= FD_ABUF_BYTES;
    u32 ksc = KS, sw = P::SW;
    if (!whole) {
        const u32 per_row = FD_ABUF_BYTES / 4 / batch;
        ksc = per_row >= 8 * 8 + 4 ? (per_row - 4) / 64 * 8 : 0u;
        sw = ksc * 8 + 4;
    }
    if (whole) {
        // The RMSNorm's weights for this thread's first 16 bytes load with its rows, not after
        // the rstd (one memory round trip fewer before the stage can start).
        uint4 g0 = make_uint4(0u, 0u, 0u, 0u);
        if (NORM && threadIdx.x < batch * (K / 8)) g0 = reinterpret_cast<const uint4*>(gamma)[threadIdx.x % (K / 8)];
        for (u32 c = threadIdx.x; c < batch * (K / 8); c += FD_THREADS) {
            const u32 b = c / (K / 8), o = c - b * (K / 8);
            const uint4 v = src(row0 + b, o * 8);
            if (keeper) *reinterpret_cast<uint4*>(keep + (u64)(row0 + b) * K + o * 8) = v;
            *reinterpret_cast<uint4*>(abuf + b * sw + o * 4) = v;
        }
        if constexpr (NORM) {
            static_assert(!NORM || K == FD_D, "the normed input is the residual stream");
            __syncthreads();
            fd_rstd(sh, batch, eps, [&](u32 b, u32 c) { return *reinterpret_cast<const uint4*>(abuf + b * sw + c * 4); });
            for (u32 c = threadIdx.x; c < batch * (K / 8); c += FD_THREADS) {
                const u32 b = c / (K / 8), o = c - b * (K / 8);
                uint4* at = reinterpret_cast<uint4*>(abuf + b * sw + o * 4);
                *at = fd_norm8(*at, c == threadIdx.x ? g0 : reinterpret_cast<const uint4*>(gamma)[o], sh.rstd[b]);
            }
        }
    } else if constexpr (NORM) {
        fd_rstd(sh, batch, eps, [&](u32 b, u32 c) { return fd_ld128cg(a + (u64)b * K + c * 8); });
    }
    asm volatile("cp.async.wait_all;" ::: "memory");
    __syncthreads();
    if (mine == 0) return;
    FD_MARK(sh, FD_T_READY);
    if (whole && batch <= FD_GV) {
        // Warp w computes column w of each of the block's tiles; lane b hands row b to epi.
        const u32 lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll 1
        for (u32 ti = 0; ti < mine; ++ti) {
            const u32 col = (part.vb + ti * part.vg) * 8 + warp;
            float r = 0.0f;
            if (RESID && lane < batch) r = fd_ldcg(resid, (u64)lane * n + col);
            const u32* wr = ti < P::FIT ? fd_wbuf + (ti * P::ROWS + warp) * P::SW : reinterpret_cast<const u32*>(w + (u64)col * K);
            const u32* wr2 = ti < P::FIT ? fd_wbuf + (ti * P::ROWS + 8 + warp) * P::SW : reinterpret_cast<const u32*>(w + (u64)(pair + col) * K);
            const float2 v = fd_gv<K, PAIR>(abuf, sw, reinterpret_cast<const uint4*>(wr), reinterpret_cast<const uint4*>(wr2), batch);
            if (ti == 0) FD_MARK(sh, FD_T_KDONE);
            if (lane < batch) epi(row0 + lane, col, v.x, v.y, r);
        }
        return;
    }
    const FdPass p{a, gamma, w, resid, abuf, n, pair, batch, mine, mtiles, part.vb, part.vg, sw, ksc, NORM, whole};
#if FD_WPASS_MIN > 0
    // Enough tasks for the warps, and their sums fit sh.g.red: one warp a task (fd_wpass).
    if (whole && mine * mtiles >= FD_WPASS_MIN && mine * mtiles * (PAIR ? 256u : 128u) <= FD_RED) {
        fd_wpass<K, PAIR>(sh, p);
        FD_MARK(sh, FD_T_KDONE);
        for (u32 c = threadIdx.x; c < mine * mtiles * 128; c += FD_THREADS) {
            const u32 task = c >> 7, e = c & 127, ti = task / mtiles, b = (task - ti * mtiles) * 16 + (e >> 3);
            if (b >= batch) continue;
            const u32 j = (part.vb + ti * part.vg) * 8 + (e & 7);
            const float* sums = sh.g.red + task * (PAIR ? 256 : 128);
            epi(row0 + b, j, sums[e], PAIR ? sums[128 + e] : 0.0f, RESID ? fd_ldcg(resid, (u64)b * n + j) : 0.0f);
        }
        return;
    }
#endif
    for (u32 t0 = 0; t0 < mine; t0 += FD_NT) {
        // One row tile (16 sequences or fewer) runs the K loop built for one.
        if (mtiles == 1) {
            fd_kpass<K, PAIR, 1>(sh, p, t0);
        } else {
            fd_kpass<K, PAIR, FD_MT>(sh, p, t0);
        }
        // Each element's sums and residual value, as this thread stored them in fd_kpass.
#pragma unroll
        for (u32 j = 0; j < FD_NT; ++j) {
            if (t0 + j >= mine) break;
            const u32 n0 = (part.vb + (t0 + j) * part.vg) * 8;
#pragma unroll
            for (u32 i = 0; i < FD_EPT; ++i) {
                const u32 e = threadIdx.x + i * FD_THREADS;
                if (e >= mtiles * 128) break;
                const u32 b = (e >> 7) * 16 + ((e >> 3) & 15);
                if (b < batch) epi(row0 + b, n0 + (e & 7), sh.g.sum[j][0][e], sh.g.sum[j][1][e], sh.g.res[j][e]);
            }
        }
    }
}

// The warps of a team of the attention stage (fd_attention): the whole block where the tasks
// (sequence, head) of the batch's bucket fit the grid's blocks, else the most that still take
// every task in one round (at least FD_ATEAM_MIN). It depends on the next power of two of the
// batch, so a batch and the bucket it is padded to (ops::DecoderStep) sum alike.
__device__ __forceinline__ u32 fd_team_warps(u32 batch) {
    u32 bucket = 1;
    while (bucket < batch) bucket *= 2;
    u32 w = FD_WARPS;
    while (w > FD_ATEAM_MIN && (u64)bucket * FD_HEADS > (u64)gridDim.x * (FD_WARPS / w)) w /= 2;
    return w;
}

// Attention of the new token of sequence b, head h, against its cache (whose position len the
// q/k/v stage wrote): one team of W warps a (sequence, head) (fd_team_warps: the whole block up
// to as many tasks as blocks, then 4, 2 or 1 warps, so that the tasks take one round: H200, the
// GPT of examples/gpt at batch 64, one block a task ran 512 tasks in four rounds, 17 us of a
// layer's 75), 8 lanes a key (FD_HD / 8 values each, 16-byte loads), 4 keys a warp at a time,
// key j to the team's warp (j / 4) % W; online softmax per lane group, merged in the warp, then
// over the team's warps in order. The teams of a block go through a round together (the block's
// barriers), those without a task idle.
//
// With `part` (small batches, see fd_fused_o), the output projection follows in the same stage:
// the tasks are (sequence, head, chunk of the projection's columns), as many as there are
// blocks; each computes its head's attention row (rounded to bf16 as att stores it), then
// part[h, b, n] = sum_c att[c] Wo[n, h HD + c] over its chunk's columns n (f32, in c order,
// each lane 8 ... E values, then the butterfly over 8 lanes), which the next stage sums over
// the heads in order. Otherwise the tasks are (sequence, head) and att gets the rows.
template <u32 W>
__device__ __forceinline__ void fd_attention(FdShared& sh, const FdLayer& L, const bf16_t* q, bf16_t* att, float* part, float* mpart, const bf16_t* mq,
                                             u32 batch, u32 max_len) {
    static_assert(W >= 1 && W <= FD_WARPS && FD_WARPS % W == 0, "a team is 1, 2, 4 or 8 warps");
    constexpr u32 E = FD_HD / 8;  // values a lane
    const u32 lane = threadIdx.x & 31, warp = threadIdx.x >> 5, grp = lane >> 3, gl = lane & 7;
    const float scale = 1.0f / sqrtf((float)FD_HD);
    // The projection's column chunks a (sequence, head): a power of two dividing D / 8, at most
    // the blocks a (sequence, head) and at most 4. Every chunk's task computes its head's
    // attention again, reading the head's whole cache: at batch 1, 16 chunks read each cache 16
    // times, 4 read it 4 times, in the same time (H200 call N: 0.196 ms a token either way).
    // What the cap saves is L2 traffic.
    u32 chunks = 1;
    if (W != FD_WARPS) part = nullptr;  // the projection needs the whole block a task
    if (part != nullptr) {
        const u32 most = gridDim.x / (batch * FD_HEADS);
        while (chunks * 2 <= most && chunks < 4 && (FD_D / 8) % (chunks * 2) == 0) chunks *= 2;
    }
    const u32 cols = FD_D / chunks, tasks = batch * FD_HEADS * chunks;
    const u32 team = warp / W, tw = warp % W, tt = threadIdx.x - team * W * 32;
    for (u32 round = 0; round < tasks; round += gridDim.x * (FD_WARPS / W)) {
        const u32 task = round + team * gridDim.x + blockIdx.x;
        if (W == FD_WARPS && task >= tasks) break;  // the whole block alike
        const bool active = task < tasks;
        const u32 b = task / (FD_HEADS * chunks), h = (task / chunks) % FD_HEADS, n0 = (task % chunks) * cols;
        // The first FD_OPIPE passes' Wo words (32 columns a pass, 8 lanes a column), loaded
        // now so that they arrive with the keys.
        const u32 og = threadIdx.x >> 3, ol = threadIdx.x & 7;
        uint4 wv[FD_OPIPE][E / 8];
        if (part != nullptr) {
#pragma unroll
            for (u32 p = 0; p < FD_OPIPE; ++p) {
                const u32 n = n0 + p * (FD_THREADS / 8) + og;
#pragma unroll
                for (u32 e = 0; e < E; e += 8)
                    wv[p][e / 8] = n < n0 + cols ? *reinterpret_cast<const uint4*>(L.wo + (u64)n * FD_D + h * FD_HD + ol * E + e) : make_uint4(0u, 0u, 0u, 0u);
            }
        }
        // The length the q/k/v stage wrote this sequence's key and value at (sh.len, from
        // fd_next_layer): no load on the stage's chain (H100, session 29: 0.3% to 1.5% less a
        // token in one run, within its noise in a second).
        const int raw = active ? sh.len[b] : -1;
        const bool bad = raw < 0 || raw > (int)max_len;
        const u32 keys = bad ? 0u : (raw < (int)max_len ? (u32)raw + 1 : (u32)raw);
        float qv[E];
#pragma unroll
        for (u32 e = 0; e < E; e += 8) {
            const u64 at = (u64)b * FD_D + h * FD_HD + gl * E + e;
            const uint4 v = !active ? make_uint4(0u, 0u, 0u, 0u) : mq != nullptr ? *reinterpret_cast<const uint4*>(mq + at) : fd_ld128cg(q + at);
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
        // whose key is past the end takes no part in the softmax. Each round loads the keys and
        // values of FD_APIPE passes of the team's 4 x W keys first (the loads are volatile, so
        // the compiler keeps them ahead of the math), so a round waits for memory once: at the
        // GPT's lengths, once a task.
        for (u32 j0 = tw * 4; j0 < keys; j0 += W * 4 * FD_APIPE) {
            uint4 kb[FD_APIPE][E / 8], vb[FD_APIPE][E / 8];
#pragma unroll
            for (u32 p = 0; p < FD_APIPE; ++p) {
                const u32 j = j0 + p * W * 4 + grp;
#pragma unroll
                for (u32 e = 0; e < E; e += 8) {
                    const bool in = j < keys;
                    kb[p][e / 8] = in ? fd_ld128cg(L.kc + base + (u64)j * FD_HD + e) : make_uint4(0u, 0u, 0u, 0u);
                    vb[p][e / 8] = in ? fd_ld128cg(L.vc + base + (u64)j * FD_HD + e) : make_uint4(0u, 0u, 0u, 0u);
                }
            }
#pragma unroll
            for (u32 p = 0; p < FD_APIPE; ++p) {
                if (j0 + p * W * 4 >= keys) break;  // the same in the whole warp
                const u32 j = j0 + p * W * 4 + grp;
                float kv[E], vv[E];
#pragma unroll
                for (u32 e = 0; e < E; e += 8) {
                    const uint4 k4 = kb[p][e / 8], v4 = vb[p][e / 8];
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
                if (j >= keys) continue;
                const float mn = fmaxf(m, s);
                const float c = expf(m - mn), pr = expf(s - mn);
                l = l * c + pr;
#pragma unroll
                for (u32 e = 0; e < E; ++e) acc[e] = acc[e] * c + pr * vv[e];
                m = mn;
            }
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
            sh.a.am[warp] = mw;
            sh.a.al[warp] = l;
        }
        if (grp == 0) {
#pragma unroll
            for (u32 e = 0; e < E; ++e) sh.a.aacc[warp][gl * E + e] = acc[e];
        }
        __syncthreads();
        for (u32 col = tt; active && col < FD_HD; col += W * 32) {
            const u32 w0 = team * W;
            float mx = gr_neg_inf();
            for (u32 w = w0; w < w0 + W; ++w) mx = fmaxf(mx, sh.a.am[w]);
            float sum = 0.0f, o = 0.0f;
            if (mx != gr_neg_inf()) {
                for (u32 w = w0; w < w0 + W; ++w) {
                    const float c = sh.a.am[w] == gr_neg_inf() ? 0.0f : expf(sh.a.am[w] - mx);
                    sum += sh.a.al[w] * c;
                    o += sh.a.aacc[w][col] * c;
                }
            }
            const float v = sum > 0.0f ? o / sum : 0.0f;
            if (part == nullptr) {
                fd_st(att, (u64)b * FD_D + h * FD_HD + col, v);
            } else {
                sh.a.arow[col] = fd_round(v);
            }
        }
        __syncthreads();
        if (part == nullptr) continue;
        // This chunk's columns of the output projection, FD_THREADS / 8 columns a pass.
        float av[E];
#pragma unroll
        for (u32 e = 0; e < E; ++e) av[e] = sh.a.arow[ol * E + e];
        for (u32 p0 = 0; p0 * (FD_THREADS / 8) < cols; p0 += FD_OPIPE) {
#pragma unroll
            for (u32 p = 0; p < FD_OPIPE; ++p) {
                const u32 n = n0 + (p0 + p) * (FD_THREADS / 8) + og;
                if (p0 > 0) {
#pragma unroll
                    for (u32 e = 0; e < E; e += 8)
                        wv[p][e / 8] = n < n0 + cols ? *reinterpret_cast<const uint4*>(L.wo + (u64)n * FD_D + h * FD_HD + ol * E + e) : make_uint4(0u, 0u, 0u, 0u);
                }
                float acc = 0.0f;
#pragma unroll
                for (u32 e = 0; e < E; e += 8) {
                    const u32 ww[4] = {wv[p][e / 8].x, wv[p][e / 8].y, wv[p][e / 8].z, wv[p][e / 8].w};
#pragma unroll
                    for (int i = 0; i < 4; ++i) {
                        acc += av[e + 2 * i] * fd_lo(ww[i]);
                        acc += av[e + 2 * i + 1] * fd_hi(ww[i]);
                    }
                }
                acc += __shfl_xor_sync(0xffffffffu, acc, 4);
                acc += __shfl_xor_sync(0xffffffffu, acc, 2);
                acc += __shfl_xor_sync(0xffffffffu, acc, 1);
                if (ol == 0 && n < n0 + cols) {
                    const u64 at = ((u64)h * batch + b) * FD_D + n;
                    part[at] = acc;
                    if (mpart != nullptr) fd_push_f32(mpart + at, acc);
                }
            }
        }
        // No barrier here: the next task writes sh.a's merge buffers before its first barrier
        // and its row after it, and every thread read this task's buffers before this task's
        // second barrier and its row before the next task's first.
    }
}

// The teams' attention stage (W < FD_WARPS) out of line: the kernel's body keeps the code that
// the batches of one block a task run, as it was before teams.
template <u32 W>
__device__ __noinline__ void fd_attention_team(FdShared& sh, const FdLayer L, const bf16_t* q, bf16_t* att, u32 batch, u32 max_len) {
    fd_attention<W>(sh, L, q, att, nullptr, nullptr, nullptr, batch, max_len);
}

// The residual stream after the output projection, from its per-head partial sums (the
// attention stage's `part`): x + the sum over heads in order, in f32, rounded once (as
// ops::linear_residual adds), 8 values at v of row b, for fd_gemm's staging.
// With LOCAL (FD_DSMEM) the parts come from this block's mirror, and x too where x_local.
template <bool LOCAL> struct FdResidSum {
    const bf16_t* x;
    const float* part;
    u32 batch;
    bool x_local;
    __device__ __forceinline__ uint4 operator()(u32 b, u32 v) const {
        float sum[8];
#pragma unroll
        for (int i = 0; i < 8; ++i) sum[i] = 0.0f;
#pragma unroll
        for (u32 h = 0; h < FD_HEADS; ++h) {
            const float* p = part + ((u64)h * batch + b) * FD_D + v;
            const uint4 lo = LOCAL ? *reinterpret_cast<const uint4*>(p) : fd_ld128cg(p);
            const uint4 hi = LOCAL ? *reinterpret_cast<const uint4*>(p + 4) : fd_ld128cg(p + 4);
            const u32 w[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
#pragma unroll
            for (int i = 0; i < 8; ++i) sum[i] += __uint_as_float(w[i]);
        }
        const uint4 xv = LOCAL && x_local ? *reinterpret_cast<const uint4*>(x + (u64)b * FD_D + v) : fd_ld128cg(x + (u64)b * FD_D + v);
        const u32 xw[4] = {xv.x, xv.y, xv.z, xv.w};
        u32 out[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) out[i] = fd_pack(fd_lo(xw[i]) + sum[2 * i], fd_hi(xw[i]) + sum[2 * i + 1]);
        return make_uint4(out[0], out[1], out[2], out[3]);
    }
};

// The table entry and lengths of layer li into sh.layer and sh.len, read by warps 1 and up
// (warp 0's thread 0 polls the barrier) between a barrier's arrival and its wait, so that a
// layer's first stage does not start with two dependent round trips to memory. No block writes
// a layer's lengths before that layer's attention stage; sh.len is read in the q/k/v and
// attention stages, sh.layer at a layer's start (past the barrier's block barrier). On the
// H100 (session 28) this alone took 2.4% off a token at batch 1 and 1.6% at 64; with fd_wait's
// acquire polls, the q/k/v stage's inputs at batch 1 went from 1.78 us to 1.23.
static_assert(FD_MT * 16 + 32 <= FD_THREADS && sizeof(FdLayer) % 8 == 0, "fd_next_layer's threads");
__device__ __forceinline__ void fd_next_layer(FdShared& sh, const FdLayer* layers, u32 li, u32 batch) {
    const u32 t = threadIdx.x - 32;
    if (threadIdx.x >= 32 && t < batch) sh.len[t] = fd_ldi_cg(layers[li].lengths + t);
    constexpr u32 WORDS = sizeof(FdLayer) / 8;
    const u32 u = threadIdx.x - (FD_THREADS - 32);
    if (threadIdx.x >= FD_THREADS - 32 && u < WORDS)
        reinterpret_cast<unsigned long long*>(&sh.layer)[u] = reinterpret_cast<const unsigned long long*>(layers + li)[u];
}

// The step. work holds x [batch, D], q [batch, D], att [batch, D], s [batch, HID], x2 [batch,
// D] (bf16), then part [HEADS, batch, D] (f32, at a 16-byte boundary); bar
// a 64-bit zeroed word (see fd_sync); logits [batch, vocab]; trace the stage marks' buffer
// (FD_TRACE only; null records none). Launched with FD_WBUF_BYTES + FD_ABUF_BYTES of dynamic
// shared memory.
extern "C" __global__ void __launch_bounds__(FD_THREADS, 1) FD_CLUSTER_DIMS
    decoder_step_bf16(const FdHeader* hdr, const float* ids, const float* positions, bf16_t* logits, bf16_t* work, unsigned long long* bar, u32* err, u32 batch, float eps,
                      unsigned long long* trace) {
    __shared__ FdShared sh;
#ifdef FD_TRACE
    if (threadIdx.x == 0) {
        sh.trace = trace;
        sh.stage = 0;
        fd_mark_at(sh, FD_TRACE_STAGES - 1, FD_T_READY, clock64());
        fd_mark_at(sh, FD_TRACE_STAGES - 1, FD_T_GT_LEAVE, fd_globaltimer());
        FD_MARK(sh, FD_T_READY);
        fd_mark_at(sh, 0, FD_T_KDONE, 0ull);
    }
#else
    (void)trace;
#endif
    const FdHeader H = *hdr;
    const FdLayer* layers = reinterpret_cast<const FdLayer*>(hdr + 1);
    bf16_t* x = work;
    bf16_t* q = x + (u64)batch * FD_D;
    bf16_t* att = q + (u64)batch * FD_D;
    bf16_t* s = att + (u64)batch * FD_D;
    bf16_t* x2 = s + (u64)batch * FD_HID;
    float* part = reinterpret_cast<float*>(x2 + (u64)batch * FD_D);
    // Small batches: attention computes the output projection too (fd_attention), when the
    // next stage's rows fit the activation buffer whole (it sums the heads' parts as it stages).
    const bool fuse_o = batch <= FD_FUSE_O && batch * FdW<FD_D, true>::SW * 4 <= FD_ABUF_BYTES;
    // The attention stage's teams (one block a task where the tasks fit the grid, and with fuse_o).
    const u32 ateam = fuse_o ? FD_WARPS : fd_team_warps(batch);
    // FD_DSMEM: this launch's stage outputs go to every block's mirror as well (see FD_DSMEM).
    const bool mirror = FD_DSMEM && fuse_o && batch <= FD_MIRROR_B;
    const FdMirror mir = fd_mirror();
    unsigned long long target = fd_sync_base(bar);
    // Each GEMM stage kind's share of this block, once (see fd_part; FD_PART).
#if FD_MT > 1
    switch (threadIdx.x) {
        case FD_P_QKV: sh.part[FD_P_QKV] = fd_part<FD_D, false>(3 * FD_D, batch); break;
        case FD_P_GU: sh.part[FD_P_GU] = fd_part<FD_D, true>(FD_HID, batch); break;
        case FD_P_O: sh.part[FD_P_O] = fd_part<FD_D, false>(FD_D, batch); break;
        case FD_P_DOWN: sh.part[FD_P_DOWN] = fd_part<FD_HID, false>(FD_D, batch); break;
        case FD_P_HEAD: sh.part[FD_P_HEAD] = fd_part<FD_D, false>(H.vocab, batch); break;
        default: break;
    }
#endif
    __syncthreads();
#if FD_DSMEM
    // A block may write into another's shared memory only once every block of the cluster has
    // started (CUDA Programming Guide, "Distributed Shared Memory"), and the first stage pushes
    // before any other barrier where the embeddings are summed in it: one cluster barrier
    // first, its arrival here and its wait before the embeddings (the first weight copies
    // between). Arrivals and waits alternate, as the barrier requires.
    asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
#endif
    if (H.layers > 0) {
        fd_prefetch<FD_D, false>(layers[0].qkv, 3 * FD_D, 0, FD_PART(FD_P_QKV));
        fd_next_layer(sh, layers, 0, batch);
    } else {
        fd_prefetch<FD_D, false>(H.head, H.vocab, 0, FD_PART(FD_P_HEAD));
    }

    // The embeddings' sum, rounded as add_rms_norm rounds its residual sum. A bad id or
    // position gives a zero row and is reported as ops::embedding reports it. Where the rows
    // fit the activation buffer, the first q/k/v stage sums them as it stages its input (every
    // block its group's rows, the group's first block keeping them as the residual stream): no
    // stage and barrier of their own.
    const bool embed_in_stage = H.layers > 0 && FD_PART(FD_P_QKV).per * FdW<FD_D, false>::SW * 4 <= FD_ABUF_BYTES;
#ifdef FD_TRACE
    // The stages' layout, for bench/decoder_trace.py.
    fd_mark_at(sh, FD_TRACE_STAGES - 1, FD_T_KDONE, (fuse_o ? 2ull : 0ull) | (embed_in_stage ? 1ull : 0ull));
    fd_mark_at(sh, FD_TRACE_STAGES - 1, FD_T_ARRIVE, H.layers);
#endif
    for (u32 b = threadIdx.x; b < batch; b += FD_THREADS) {
        const long long r = fd_row(ids[b], H.vocab), p = fd_row(positions[b], H.ctx);
        sh.erow[b][0] = r;
        sh.erow[b][1] = p;
        if (blockIdx.x == 0) {
            if (r < 0) fd_report_token(err, b, ids[b], H.vocab);
            if (p < 0) fd_report_token(err, b, positions[b], H.ctx);
        }
    }
    __syncthreads();
#if FD_DSMEM
    asm volatile("barrier.cluster.wait.aligned;" ::: "memory");
#endif
    const FdEmbedded embedded{&sh, H.tok, H.pos};
    if (!embed_in_stage) {
        for (u32 c = blockIdx.x * FD_THREADS + threadIdx.x; c < batch * (FD_D / 8); c += gridDim.x * FD_THREADS) {
            const u32 b = c / (FD_D / 8), o = c - b * (FD_D / 8);
            *reinterpret_cast<uint4*>(x + (u64)b * FD_D + o * 8) = embedded(b, o * 8);
        }
        fd_sync(sh, bar, target);
    }

    // Each GEMM stage starts the copy of the next stage's weights (fd_prefetch) between its
    // arrival at the barrier that ends it and its wait there.
    for (u32 li = 0; li < H.layers; ++li) {
        const FdLayer L = sh.layer;
        const u32 max_len = H.max_len;
        // RMSNorm and q/k/v; k and v go to the cache at the sequence's length (sh.len, read
        // with sh.layer by fd_next_layer).
        const auto qkv_out = [&](u32 b, u32 j, float v, float, float) {
            if (j < FD_D) {
                fd_st(q, (u64)b * FD_D + j, v);
                if (mirror) fd_push_bf16(mir.q + (u64)b * FD_D + j, v);
                return;
            }
            const int raw = sh.len[b];
            const bool room = raw >= 0 && raw < (int)max_len;
            if (j == FD_D && !room) fd_report_cache(err, b, raw, max_len);
            if (!room) return;
            const u32 jj = j < 2 * FD_D ? j - FD_D : j - 2 * FD_D;
            const u64 at = (((u64)b * FD_HEADS + jj / FD_HD) * max_len + (u64)raw) * FD_HD + jj % FD_HD;
            fd_st(j < 2 * FD_D ? L.kc : L.vc, at, v);
        };
        if (li == 0 && embed_in_stage) {
            fd_gemm<FD_D, true, false, false>(sh, x, embedded, x, L.norm1, L.qkv, 3 * FD_D, 0, FD_PART(FD_P_QKV), eps, nullptr, qkv_out);
        } else if (mirror && li > 0) {
            fd_gemm<FD_D, true, false, false>(sh, x, FdRowsLocal<FD_D>{mir.x}, nullptr, L.norm1, L.qkv, 3 * FD_D, 0, FD_PART(FD_P_QKV), eps, nullptr, qkv_out);
        } else {
            fd_gemm<FD_D, true, false, false>(sh, x, FdRows<FD_D>{x}, nullptr, L.norm1, L.qkv, 3 * FD_D, 0, FD_PART(FD_P_QKV), eps, nullptr, qkv_out);
        }
        fd_arrive(sh, bar, target);
        if (fuse_o) {
            fd_prefetch<FD_D, true>(L.gate_up, FD_HID, FD_HID, FD_PART(FD_P_GU));
        } else {
            fd_prefetch<FD_D, false>(L.wo, FD_D, 0, FD_PART(FD_P_O));
        }
        fd_wait(sh, bar, target);
        switch (ateam) {
            case 1: fd_attention_team<1>(sh, L, q, att, batch, max_len); break;
            case 2: fd_attention_team<2>(sh, L, q, att, batch, max_len); break;
            case 4: fd_attention_team<4>(sh, L, q, att, batch, max_len); break;
            default: fd_attention<FD_WARPS>(sh, L, q, att, fuse_o ? part : nullptr, mirror ? mir.part : nullptr, mirror ? mir.q : nullptr, batch, max_len);
        }
        fd_sync(sh, bar, target);
        // The lengths advance once every block has read them (the two stages above).
        if (blockIdx.x == 0) {
            for (u32 b = threadIdx.x; b < batch; b += FD_THREADS) {
                const int raw = fd_ldi_cg(L.lengths + b);
                if (raw >= 0 && raw < (int)max_len) L.lengths[b] = raw + 1;
            }
        }
        const auto swiglu_out = [&](u32 b, u32 j, float v, float v2, float) {
            const float gt = fd_round(v), up = fd_round(v2);
            const float o = gt * (1.0f / (1.0f + expf(-gt))) * up;
            fd_st(s, (u64)b * FD_HID + j, o);
            if (mirror) fd_push_bf16(mir.s + (u64)b * FD_HID + j, o);
        };
        if (mirror) {
            // As below, the parts (and from the second layer x) from this block's mirror.
            const FdResidSum<true> sum{li > 0 ? mir.x : x, mir.part, batch, li > 0};
            fd_gemm<FD_D, true, true, false>(sh, x, sum, x2, L.norm2, L.gate_up, FD_HID, FD_HID, FD_PART(FD_P_GU), eps, nullptr, swiglu_out);
        } else if (fuse_o) {
            // RMSNorm of the residual stream plus the heads' projections (block 0 keeps the
            // sum in x2, which the down projection's residual add reads), gate and up, SwiGLU.
            const FdResidSum<false> sum{x, part, batch, false};
            fd_gemm<FD_D, true, true, false>(sh, x, sum, x2, L.norm2, L.gate_up, FD_HID, FD_HID, FD_PART(FD_P_GU), eps, nullptr, swiglu_out);
        } else {
            // The output projection added to the residual stream in f32, rounded once (in
            // place: each column's owner reads and writes it).
            fd_gemm<FD_D, false, false, true>(sh, att, FdRows<FD_D>{att}, nullptr, nullptr, L.wo, FD_D, 0, FD_PART(FD_P_O), eps, x, [&](u32 b, u32 j, float v, float, float r) {
                fd_st(x, (u64)b * FD_D + j, r + v);
            });
            fd_arrive(sh, bar, target);
            fd_prefetch<FD_D, true>(L.gate_up, FD_HID, FD_HID, FD_PART(FD_P_GU));
            fd_wait(sh, bar, target);
            // RMSNorm, gate and up, SwiGLU.
            fd_gemm<FD_D, true, true, false>(sh, x, FdRows<FD_D>{x}, nullptr, L.norm2, L.gate_up, FD_HID, FD_HID, FD_PART(FD_P_GU), eps, nullptr, swiglu_out);
        }
        fd_arrive(sh, bar, target);
        fd_prefetch<FD_HID, false>(L.down, FD_D, 0, FD_PART(FD_P_DOWN));
        fd_wait(sh, bar, target);
        const auto down_out = [&](u32 b, u32 j, float v, float, float r) {
            fd_st(x, (u64)b * FD_D + j, r + v);
            if (mirror) fd_push_bf16(mir.x + (u64)b * FD_D + j, r + v);
        };
        if (mirror) {
            fd_gemm<FD_HID, false, false, true>(sh, s, FdRowsLocal<FD_HID>{mir.s}, nullptr, nullptr, L.down, FD_D, 0, FD_PART(FD_P_DOWN), eps, x2, down_out);
        } else {
            fd_gemm<FD_HID, false, false, true>(sh, s, FdRows<FD_HID>{s}, nullptr, nullptr, L.down, FD_D, 0, FD_PART(FD_P_DOWN), eps, fuse_o ? x2 : x, down_out);
        }
        fd_arrive(sh, bar, target);
        if (li + 1 < H.layers) {
            fd_prefetch<FD_D, false>(layers[li + 1].qkv, 3 * FD_D, 0, FD_PART(FD_P_QKV));
            fd_next_layer(sh, layers, li + 1, batch);
        } else {
            fd_prefetch<FD_D, false>(H.head, H.vocab, 0, FD_PART(FD_P_HEAD));
        }
        fd_wait(sh, bar, target);
    }
    // The final RMSNorm and the head.
    const auto head_out = [&](u32 b, u32 j, float v, float, float) { fd_st(logits, (u64)b * H.vocab + j, v); };
    if (mirror && H.layers > 0) {
        fd_gemm<FD_D, true, false, false>(sh, x, FdRowsLocal<FD_D>{mir.x}, nullptr, H.head_norm, H.head, H.vocab, 0, FD_PART(FD_P_HEAD), eps, nullptr, head_out);
    } else {
        fd_gemm<FD_D, true, false, false>(sh, x, FdRows<FD_D>{x}, nullptr, H.head_norm, H.head, H.vocab, 0, FD_PART(FD_P_HEAD), eps, nullptr, head_out);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        FD_MARK(sh, FD_T_ARRIVE);
        FD_MARK_GT(sh, FD_T_GT_ARRIVE);
        FD_MARK(sh, FD_T_LEAVE);
        FD_MARK_GT(sh, FD_T_GT_LEAVE);
    }
}
