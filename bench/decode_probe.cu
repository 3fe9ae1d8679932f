// The primitives a one-token decoding step is made of, measured apart (bench/decode_probe.py):
// the grid-wide barrier of ops::DecoderStep (kernels/decoder.cu's fd_arrive/fd_wait) with and
// without an exchange of each stage's output through L2; a thread-block cluster's barrier with
// the same exchange through distributed shared memory or through L2; and how fast a given number
// of multiprocessors stream a model's weights from memory (16-byte loads, or the tensor memory
// accelerator's bulk copies into a ring of shared memory). Not part of the runtime: a probe that
// says whether a decoding step on one cluster (no grid barrier, stage outputs pushed into the
// other blocks' shared memory) could beat the persistent grid at batch 1.
//
// NVRTC, sm_90 on. CS (the cluster size, 1 to 16) picks the cluster kernels' compile-time
// cluster shape; STAGES and CHUNK are the bulk stream's ring (slots, bytes a slot).

typedef unsigned int u32;
typedef unsigned long long u64;

#ifndef CS
#define CS 8
#endif

extern __shared__ uint4 dp_smem[];

__device__ __forceinline__ u64 dp_ld_relaxed(const u64* p) {
    u64 v;
    asm volatile("ld.relaxed.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ u64 dp_timer() {
    u64 t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
__device__ __forceinline__ uint4 dp_ld_cg(const uint4* p) {
    uint4 v;
    asm volatile("ld.global.cg.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ uint4 dp_ld_nc(const uint4* p) {
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    return v;
}
// A stage's word w of block `from`, stage i: what every reader checks.
__device__ __forceinline__ uint4 dp_word(u32 i, u32 from, u32 w) { return make_uint4(i, from, w, 0x5a5a5a5au); }
__device__ __forceinline__ u32 dp_wrong(uint4 v, u32 i, u32 from, u32 w) { return (v.x != i) | (v.y != from) | (v.z != w) | (v.w != 0x5a5a5a5au); }

// Every block's words of stage i (total, wpb a block) read from L2 into shared memory, as the
// decoder stages its rows; returns the words read wrong.
__device__ __forceinline__ u32 dp_stage_from_l2(const uint4* half, u32 total, u32 wpb, u32 i) {
    u32 errs = 0;
    for (u32 w = threadIdx.x; w < total; w += blockDim.x) {
        const uint4 v = dp_ld_cg(half + w);
        errs += dp_wrong(v, i, w / wpb, w % wpb);
        dp_smem[w] = v;
    }
    return errs;
}

// ---------------------------------------------------------------- the grid barrier
//
// decoder.cu's: a block barrier, then thread 0 adds one to a 64-bit count after a release
// fence and polls it (relaxed) until every block of the launch arrived, then an acquire fence
// and a block barrier. The count starts at zero for each launch (the host clears it).
__device__ __forceinline__ void dp_grid_sync(u64* bar, u64& target) {
    __syncthreads();
    if (threadIdx.x == 0) {
        target += gridDim.x;
        asm volatile("fence.acq_rel.gpu;" ::: "memory");
        asm volatile("red.relaxed.gpu.global.add.u64 [%0], 1;" ::"l"(bar) : "memory");
        while (dp_ld_relaxed(bar) < target) {
        }
        asm volatile("fence.acq_rel.gpu;" ::: "memory");
    }
    __syncthreads();
}

// n stages: each block writes its `wpb` 16-byte words of the stage's output (one half of buf by
// the stage's parity), the grid barrier, then every block reads all gridDim.x * wpb words from
// L2 (ld.global.cg, as the decoder stages its rows) into shared memory and checks them. wpb 0:
// the barrier alone. ns[0]: block 0's time for the n stages (%globaltimer); bad: words read
// wrong (must be 0).
// A timed run's ends: every block started (the grid barrier), then the clock; at the end the
// words read wrong counted and block 0's time stored.
__device__ __forceinline__ u64 dp_begin(u64* bar, u64& target) {
    dp_grid_sync(bar, target);
    return dp_timer();
}
__device__ __forceinline__ void dp_end(u64 t0, u32 errs, u32* bad, u64* ns) {
    const u64 t1 = dp_timer();
    if (errs) atomicAdd(bad, errs);
    if (threadIdx.x == 0 && blockIdx.x == 0) ns[0] = t1 - t0;
}

extern "C" __global__ void grid_stages(u64* bar, uint4* buf, u32 n, u32 wpb, u32* bad, u64* ns) {
    u64 target = 0;
    const u32 total = gridDim.x * wpb;
    u32 errs = 0;
    const u64 t0 = dp_begin(bar, target);
    for (u32 i = 0; i < n; ++i) {
        uint4* half = buf + (u64)(i & 1u) * total;
        for (u32 w = threadIdx.x; w < wpb; w += blockDim.x) half[blockIdx.x * wpb + w] = dp_word(i, blockIdx.x, w);
        dp_grid_sync(bar, target);
        errs += dp_stage_from_l2(half, total, wpb, i);
        __syncthreads();
    }
    dp_end(t0, errs, bad, ns);
}

// ---------------------------------------------------------------- flagged lines, no barrier
//
// The same exchange without the grid barrier: each 16-byte line a block writes carries 8 bytes of
// data as two 8-byte units, each a 32-bit datum beside a 32-bit flag (the stage's number + 1;
// NCCL's LL protocol), stored with one 16-byte store of two 64-bit units. A unit is read whole
// (single-copy atomic), so a reader that sees the flag in a unit sees that unit's datum: it polls
// every line of the stage until both flags are the stage's, with no fence, count or second
// load. The readers of stage i all finished reading it before any block writes stage i + 2 into
// the same half (each block reads all of stage i + 1 first, and stage i + 1's lines are written
// only after their blocks read stage i), so two halves suffice. lpb: lines a block; buf zeroed.
__device__ __forceinline__ void dp_st_line(uint4* p, u32 d0, u32 d1, u32 flag) {
    const u64 a = ((u64)flag << 32) | d0, b = ((u64)flag << 32) | d1;
    asm volatile("st.volatile.global.v2.u64 [%0], {%1, %2};" ::"l"(p), "l"(a), "l"(b) : "memory");
}
__device__ __forceinline__ void dp_ld_line(const uint4* p, u64& a, u64& b) {
    asm volatile("ld.volatile.global.v2.u64 {%0, %1}, [%2];" : "=l"(a), "=l"(b) : "l"(p) : "memory");
}
extern "C" __global__ void flag_stages(u64* bar, uint4* buf, u32 n, u32 lpb, u32* bad, u64* ns) {
    u64 target = 0;
    const u32 total = gridDim.x * lpb;
    u32 errs = 0;
    const u64 t0 = dp_begin(bar, target);
    for (u32 i = 0; i < n; ++i) {
        uint4* half = buf + (u64)(i & 1u) * total;
        const u32 flag = i + 1;
        for (u32 w = threadIdx.x; w < lpb; w += blockDim.x) dp_st_line(half + blockIdx.x * lpb + w, i ^ blockIdx.x, w, flag);
        for (u32 w = threadIdx.x; w < total; w += blockDim.x) {
            u64 a, b;
            do {
                dp_ld_line(half + w, a, b);
            } while ((u32)(a >> 32) != flag || (u32)(b >> 32) != flag);
            errs += ((u32)a != (i ^ (w / lpb))) | ((u32)b != w % lpb);
            dp_smem[w] = make_uint4((u32)a, (u32)b, 0u, 0u);
        }
        __syncthreads();
    }
    dp_end(t0, errs, bad, ns);
}

// ---------------------------------------------------------------- a cluster's barrier
__device__ __forceinline__ u32 dp_cluster_rank() {
    u32 r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
    return r;
}
__device__ __forceinline__ void dp_cluster_sync() {
    asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
    asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");
}
__device__ __forceinline__ void dp_st_cluster(const void* local, u32 rank, uint4 v) {
    u32 remote;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"((u32)__cvta_generic_to_shared(local)), "r"(rank));
    asm volatile("st.shared::cluster.v4.u32 [%0], {%1, %2, %3, %4};" ::"r"(remote), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w) : "memory");
}

// n stages on one cluster of CS blocks (the grid is one cluster: blockIdx.x is the rank). Each
// block's wpb words of a stage go to every block of the cluster: with dsmem, stored straight
// into each block's shared memory (mapa + st.shared::cluster; two halves by parity), the
// cluster barrier, then each block reads its own shared memory; without, written to global
// memory, the cluster barrier, then read from L2 as the grid version does. Checked as there.
extern "C" __global__ void __cluster_dims__(CS, 1, 1) cluster_stages(uint4* buf, u32 n, u32 wpb, u32 dsmem, u32* bad, u64* ns) {
    const u32 rank = dp_cluster_rank(), total = CS * wpb;
    u32 errs = 0;
    dp_cluster_sync();
    const u64 t0 = dp_timer();
    for (u32 i = 0; i < n; ++i) {
        const u32 par = i & 1u;
        if (dsmem) {
            uint4* half = dp_smem + par * total;
            for (u32 e = threadIdx.x; e < CS * wpb; e += blockDim.x) {
                const u32 to = e / wpb, w = e % wpb;
                dp_st_cluster(half + rank * wpb + w, to, dp_word(i, rank, w));
            }
            dp_cluster_sync();
            for (u32 w = threadIdx.x; w < total; w += blockDim.x) errs += dp_wrong(half[w], i, w / wpb, w % wpb);
        } else {
            uint4* half = buf + (u64)par * total;
            for (u32 w = threadIdx.x; w < wpb; w += blockDim.x) half[rank * wpb + w] = dp_word(i, rank, w);
            dp_cluster_sync();
            errs += dp_stage_from_l2(half, total, wpb, i);
        }
        __syncthreads();
    }
    const u64 t1 = dp_timer();
    // No block may leave while another can still store into its shared memory.
    dp_cluster_sync();
    if (errs) atomicAdd(bad, errs);
    if (threadIdx.x == 0 && rank == 0) ns[0] = t1 - t0;
}

// ---------------------------------------------------------------- streaming the weights
//
// Block b reads its share (per_block 16-byte words, a multiple of blockDim.x * 8) of w, reps
// times over, 8 loads in flight a thread (ld.global.nc, no L1 allocation). sink keeps the loads.
extern "C" __global__ void stream_ld(const uint4* w, u64 per_block, u32 reps, u32* sink) {
    const uint4* p = w + (u64)blockIdx.x * per_block;
    u32 acc = 0;
    for (u32 r = 0; r < reps; ++r) {
        for (u64 base = 0; base < per_block; base += (u64)blockDim.x * 8) {
            uint4 v[8];
#pragma unroll
            for (u32 u = 0; u < 8; ++u) v[u] = dp_ld_nc(p + base + u * blockDim.x + threadIdx.x);
#pragma unroll
            for (u32 u = 0; u < 8; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
        }
    }
    if (acc == 0x9e3779b9u) sink[0] = acc;
}

#ifndef STAGES
#define STAGES 4
#endif

// The same share through the tensor memory accelerator: thread 0 keeps STAGES bulk copies of
// `chunk` bytes in flight (cp.async.bulk into a ring of shared memory, each slot completing on
// its own mbarrier); every thread waits for a slot, reads a word of it, and the block barrier
// hands the slot back for the next copy. per_block is a multiple of chunk (bytes).
extern "C" __global__ void stream_bulk(const uint4* w, u64 per_block, u32 reps, u32 chunk, u32* sink) {
    __shared__ __align__(8) u64 mbar[STAGES];
    const char* src = reinterpret_cast<const char*>(w) + (u64)blockIdx.x * per_block;
    char* ring = reinterpret_cast<char*>(dp_smem);
    const u32 per_rep = (u32)(per_block / chunk), total = per_rep * reps;
    if (threadIdx.x == 0) {
        for (u32 s = 0; s < STAGES; ++s) {
            asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"((u32)__cvta_generic_to_shared(&mbar[s])) : "memory");
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    }
    __syncthreads();
    auto issue = [&](u32 c) {
        const u32 s = c % STAGES;
        const u32 bar = (u32)__cvta_generic_to_shared(&mbar[s]);
        const u32 dst = (u32)__cvta_generic_to_shared(ring + (u64)s * chunk);
        asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(chunk) : "memory");
        asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(dst),
                     "l"(src + (u64)(c % per_rep) * chunk), "r"(chunk), "r"(bar)
                     : "memory");
    };
    if (threadIdx.x == 0) {
        for (u32 c = 0; c < STAGES && c < total; ++c) issue(c);
    }
    u32 acc = 0;
    for (u32 c = 0; c < total; ++c) {
        const u32 s = c % STAGES, par = (c / STAGES) & 1u;
        const u32 bar = (u32)__cvta_generic_to_shared(&mbar[s]);
        u32 done = 0;
        while (!done) {
            asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
                         : "=r"(done)
                         : "r"(bar), "r"(par)
                         : "memory");
        }
        acc ^= reinterpret_cast<const u32*>(ring + (u64)s * chunk)[threadIdx.x % (chunk / 4)];
        __syncthreads();
        if (threadIdx.x == 0 && c + STAGES < total) {
            asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
            issue(c + STAGES);
        }
    }
    if (acc == 0x9e3779b9u) sink[0] = acc;
}
