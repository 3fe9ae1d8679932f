// Decoding with a KV cache: attention of one new query token per sequence against the cache
// (flash-decoding: the cache split across blocks, then a combine), the same with the step's
// keys and values appended by the attention kernels themselves (read from one GEMM's q/k/v
// rows; a cache of one split in one kernel), appending a step's keys and values at each
// sequence's length, writing a prompt's keys and values (prefill), the
// bookkeeping of a generation step, and filling 32-bit words. NVRTC compiles this file after
// core.cu, ops.cu, half.cu, transformer.cu and flash.cu in one program: u16, u32, u64, ld, st,
// warp_sum, gr_neg_inf and the 16-bit types come from there.
//
// Layout: q and out are [batch, heads, D], the caches [batch, kv_heads, max_len, D] (kv_heads
// divides heads: query head h reads key/value head h / (heads / kv_heads)), lengths an i32
// [batch]: sequence b attends to cache positions 0..lengths[b]. Lengths are read on the device
// only, so one captured graph serves every length; the launch shape depends on max_len alone.
// Scores, softmax and sums are f32; the output rounds to the cache's dtype. No atomics on data:
// every sum runs in an order fixed by the sizes, so results are bitwise reproducible.

// ---------------------------------------------------------------- cache errors in the error word
//
// Words 4-7 of the device's error word (see transformer.cu for words 0-3): words 4-5, one u64,
// the minimum over reports of (sequence << 32 | length bits), all ones when clear; word 6
// max_len (the largest reported); word 7 the op bits (1: decode_attention, 2: kv_cache_append),
// zero when clear. CudaBackend reads and clears it on synchronize.
__device__ __forceinline__ void gr_report_cache(u32* err, u32 seq, int len, u32 max_len, u32 op_bit) {
    atomicMin(reinterpret_cast<unsigned long long*>(err + 4), ((u64)seq << 32) | (u64)(u32)len);
    atomicMax(err + 6, max_len);
    atomicOr(err + 7, op_bit);
}

#define DEC_WARPS 4

// The heads one block of the one-pass build covers: DEC_ONE_HEADS * DEC_WARPS warps, 1024
// threads, the most a block holds.
#define DEC_ONE_HEADS 8
// Lanes hold columns lane + 32 e, e < DEC_ANY_E, in the build for a head dim read at run time.
#define DEC_ANY_E 4

// Attention of one query per (head, sequence) against the cache, flash-decoding's first pass.
// D is the head dim the build is for, or 0: read at run time (d, at most 32 * DEC_ANY_E; the
// lanes skip the columns past it). Two-pass (ONE false): one block of DEC_WARPS warps per (split,
// query head, sequence); the split's keys [split * split_len, min(keys, (split + 1) *
// split_len)) go to the warps in turn (key j to warp j % DEC_WARPS), each warp keeps an online
// softmax (max m, sum l, unnormalised P·V in registers: lane owns columns lane + 32 e), then the
// block merges its warps in warp order and writes the split's normalised output (f32 [batch,
// heads, splits, D]) and its logsumexp (f32 [batch, heads, splits]; -inf when the split holds no
// key), which decode_combine_t merges. A length outside 0..max_len counts as 0 keys and is
// reported by the block of split 0, head 0.
//
// APPEND: the step's new key and value are appended first. q is then the rows of one GEMM
// ([batch, (heads + 2 kv_heads) * D]: the query of every head, then the key and the value of
// every kv head), and the sequence attends to keys + 1 positions, the new key at position len
// read from those rows (the bits the cache gets); the block of each split and kv head that
// holds position len and whose query head is its group's first writes the new row into the
// cache (the other blocks of the group read it from the rows, so no block reads what another
// writes). Lengths are left to the combine, which runs once every block has read them. A full
// cache (len == max_len) attends to its max_len keys, appends nothing and is reported as the
// append's (op bit 2), as is a length outside 0..max_len; the unfused append and attention
// report both the same way.
//
// ONE (APPEND, one split, heads <= DEC_ONE_HEADS): one block per sequence holds every head
// (head h is warps h * DEC_WARPS ...), writes the output in T as the combine of one split does
// (0 + 1 · r, so a -0 becomes +0: the same bits), and its thread 0 increments lengths[b] once
// the barrier shows every thread of the sequence has read it. The same keys to the same warps,
// the same merge: bitwise the two-pass result.
template <typename T, int D, bool APPEND, bool ONE>
__device__ __forceinline__ void decode_attend_t(float* part_o, float* part_lse, T* out, const T* q, T* kc, T* vc, int* lengths, u32 heads, u32 kv_heads, u32 max_len, u32 split_len, float scale, u32 d_rt, u32* err) {
    constexpr int E = D != 0 ? D / 32 : DEC_ANY_E;
    constexpr int HB = ONE ? DEC_ONE_HEADS : 1;
    __shared__ float s_m[HB][DEC_WARPS], s_l[HB][DEC_WARPS];
    __shared__ float s_acc[HB][DEC_WARPS][32 * E];
    const u32 d = D != 0 ? (u32)D : d_rt;
    const u32 lane = threadIdx.x & 31, warp = (threadIdx.x >> 5) % DEC_WARPS, hb = (threadIdx.x >> 5) / DEC_WARPS;
    const u32 s = ONE ? 0u : blockIdx.x, h = ONE ? hb : blockIdx.y, b = ONE ? blockIdx.x : blockIdx.z;
    const u32 splits = ONE ? 1u : gridDim.x;
    const int raw = lengths[b];
    const bool bad = raw < 0 || raw > (int)max_len;
    const bool room = !bad && raw < (int)max_len;
    if (s == 0 && h == 0 && threadIdx.x == 0) {
        if (APPEND && !room) gr_report_cache(err, b, raw, max_len, 2u);
        if (!APPEND && bad) gr_report_cache(err, b, raw, max_len, 1u);
    }
    const u32 len = bad ? 0u : (u32)raw;
    const u32 keys = APPEND && room ? len + 1 : len;
    const u32 group = heads / kv_heads, kvh = h / group;
    const u64 row = APPEND ? (u64)(heads + 2 * kv_heads) * d : (u64)heads * d;
    const T* knew = q + (u64)b * row + (u64)(heads + kvh) * d;
    const T* vnew = knew + (u64)kv_heads * d;
    const bool writer = APPEND && h % group == 0;
    const T* qrow = q + (u64)b * row + (u64)h * d;
    float qr[E];
#pragma unroll
    for (int e = 0; e < E; ++e) {
        const u32 col = lane + 32 * e;
        qr[e] = col < d ? ld(qrow, col) * scale : 0.0f;
    }
    const u64 base = ((u64)b * kv_heads + kvh) * (u64)max_len * d;
    const u32 j0 = s * split_len;
    const u32 j1 = keys < j0 + split_len ? keys : j0 + split_len;
    float m = gr_neg_inf(), l = 0.0f;
    float acc[E];
#pragma unroll
    for (int e = 0; e < E; ++e) acc[e] = 0.0f;
    for (u32 j = j0 + warp; j < j1; j += DEC_WARPS) {
        const bool fresh = APPEND && j == len;
        const T* kr = fresh ? knew : kc + base + (u64)j * d;
        const T* vr = fresh ? vnew : vc + base + (u64)j * d;
        float sc = 0.0f;
#pragma unroll
        for (int e = 0; e < E; ++e) {
            const u32 col = lane + 32 * e;
            if (col < d) sc += qr[e] * ld(kr, col);
        }
        sc = warp_sum(sc);
        const float mn = fmaxf(m, sc);
        const float c = expf(m - mn);
        const float p = expf(sc - mn);
        l = l * c + p;
#pragma unroll
        for (int e = 0; e < E; ++e) {
            const u32 col = lane + 32 * e;
            if (col < d) acc[e] = acc[e] * c + p * ld(vr, col);
        }
        if (fresh && writer) {
#pragma unroll
            for (int e = 0; e < E; ++e) {
                const u32 col = lane + 32 * e;
                if (col < d) {
                    kc[base + (u64)j * d + col] = kr[col];
                    vc[base + (u64)j * d + col] = vr[col];
                }
            }
        }
        m = mn;
    }
    if (lane == 0) {
        s_m[hb][warp] = m;
        s_l[hb][warp] = l;
    }
#pragma unroll
    for (int e = 0; e < E; ++e) {
        const u32 col = lane + 32 * e;
        if (col < d) s_acc[hb][warp][col] = acc[e];
    }
    __syncthreads();
    float mx = gr_neg_inf();
    for (int w = 0; w < DEC_WARPS; ++w) mx = fmaxf(mx, s_m[hb][w]);
    const u64 po = ((u64)b * heads + h) * splits + s;
    for (u32 col = threadIdx.x - hb * 32 * DEC_WARPS; col < d; col += 32 * DEC_WARPS) {
        float sum = 0.0f, o = 0.0f;
        if (mx != gr_neg_inf()) {
            for (int w = 0; w < DEC_WARPS; ++w) {
                const float c = s_m[hb][w] == gr_neg_inf() ? 0.0f : expf(s_m[hb][w] - mx);
                sum += s_l[hb][w] * c;
                o += s_acc[hb][w][col] * c;
            }
        }
        const float r = sum > 0.0f ? o / sum : 0.0f;
        if constexpr (ONE) {
            st(out, ((u64)b * heads + h) * d + col, 0.0f + r);
        } else {
            part_o[po * d + col] = r;
            if (col == 0) part_lse[po] = sum > 0.0f ? mx + logf(sum) : gr_neg_inf();
        }
    }
    if constexpr (ONE && APPEND) {
        if (room && threadIdx.x == 0) lengths[b] = raw + 1;
    }
}

// One block of d threads per (query head, sequence): the splits' outputs weighted by
// exp(lse_split - max lse), in split order. A sequence with no key (length 0, or a reported bad
// length) gets zeros. With lengths (decode_attend_t's APPEND, every block of which has read
// them), the block of head 0 then advances the sequence's length where the append found room.
template <typename T>
__device__ __forceinline__ void decode_combine_t(T* out, const float* part_o, const float* part_lse, u32 heads, u32 splits, u32 d, int* lengths, u32 max_len) {
    const u64 row = (u64)blockIdx.y * heads + blockIdx.x;
    const float* lse = part_lse + row * splits;
    float mx = gr_neg_inf();
    for (u32 s = 0; s < splits; ++s) mx = fmaxf(mx, lse[s]);
    for (u32 c = threadIdx.x; c < d; c += blockDim.x) {
        float wsum = 0.0f, o = 0.0f;
        if (mx != gr_neg_inf()) {
            for (u32 s = 0; s < splits; ++s) {
                if (lse[s] == gr_neg_inf()) continue;
                const float w = expf(lse[s] - mx);
                wsum += w;
                o += w * part_o[(row * splits + s) * d + c];
            }
        }
        st(out, row * d + c, wsum > 0.0f ? o / wsum : 0.0f);
    }
    if (lengths != nullptr && blockIdx.x == 0 && threadIdx.x == 0) {
        const int len = lengths[blockIdx.y];
        if (len >= 0 && len < (int)max_len) lengths[blockIdx.y] = len + 1;
    }
}

// One block per sequence: copies the step's keys and values ([batch, kv_heads, d], raw words W)
// to cache position lengths[b], then thread 0 increments lengths[b] (after the barrier, so every
// thread has read the old length). A full cache (length == max_len) or a length outside
// 0..max_len is left unchanged and reported.
template <typename W>
__device__ __forceinline__ void kv_append_t(W* kc, W* vc, int* lengths, const W* k, const W* v, u32 kv_heads, u32 max_len, u32 d, u32* err) {
    const u32 b = blockIdx.x;
    const int len = lengths[b];
    const bool ok = len >= 0 && len < (int)max_len;
    if (ok) {
        const u64 n = (u64)kv_heads * d;
        for (u64 i = threadIdx.x; i < n; i += blockDim.x) {
            const u64 h = i / d, e = i % d;
            const u64 dst = (((u64)b * kv_heads + h) * max_len + (u64)len) * d + e;
            const u64 src = (u64)b * n + i;
            kc[dst] = k[src];
            vc[dst] = v[src];
        }
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        if (ok) {
            lengths[b] = len + 1;
        } else {
            gr_report_cache(err, b, len, max_len, 2u);
        }
    }
}

// Prefill: the keys and values of positions 0..seq of every sequence ([batch, seq, kv_heads,
// d], raw words W, as a projection [batch, seq, kv_heads * d] lays them out) into the caches
// ([batch, kv_heads, max_len, d]) at the same positions. Lengths are the caller's to set.
template <typename W>
__device__ __forceinline__ void kv_fill_t(W* kc, W* vc, const W* k, const W* v, u32 batch, u32 seq, u32 kv_heads, u32 max_len, u32 d) {
    const u64 n = (u64)batch * seq * kv_heads * d;
    for (u64 i = gr_tid(); i < n; i += gr_stride()) {
        const u64 e = i % d;
        u64 r = i / d;
        const u64 h = r % kv_heads;
        r /= kv_heads;
        const u64 t = r % seq, b = r / seq;
        const u64 dst = ((b * kv_heads + h) * max_len + t) * d + e;
        kc[dst] = k[i];
        vc[dst] = v[i];
    }
}

// One generation step's bookkeeping (generation.cu's generation_step_block), a kernel of the
// main program; the condition program's graphed_generation_step_set also sets a WHILE node's
// condition from the flag (conditional.cu).
extern "C" __global__ void generation_step(int* tokens, int* counts, int* done, const int* limits, const int* stop, int* step, int* active, float* next_ids, float* positions, const int* sampled, const int* lengths, u32 batch, u32 max_new) {
    GR_PDL_ENTRY();
    generation_step_block(tokens, counts, done, limits, stop, step, active, next_ids, positions, sampled, lengths, batch, max_new);
}

// Greedy sampling: out[r] = the index of the largest value of row r of x ([rows, cols]), the
// lowest index among equal ones, NaN never chosen (a row of NaN only gives 0). One block of 256
// threads per row: each thread scans its columns in order, then a fixed tree merges the
// threads; (value, lower index) is a total order, so the result is the same on every run.
// argmax_better and argmax_block_merge: generation.cu (the condition program's greedy step uses
// them too).
template <typename T>
__device__ __forceinline__ void argmax_rows_t(int* out, const T* x, u32 rows, u32 cols) {
    __shared__ float s_v[256];
    __shared__ u32 s_i[256];
    for (u64 r = blockIdx.x; r < rows; r += gridDim.x) {
        float bv = gr_neg_inf();
        u32 bi = ARGMAX_NONE;
        for (u32 j = threadIdx.x; j < cols; j += blockDim.x) {
            const float v = ld(x, r * cols + j);
            if (v == v && argmax_better(v, j, bv, bi)) {
                bv = v;
                bi = j;
            }
        }
        argmax_block_merge(out + r, bv, bi, s_v, s_i);
    }
}

// Sampling with a temperature and a top-k cut: out[r] = argmax over the candidates j of row r
// of x[r, j] / temperature + g(u), g(u) = -log(-log(u)) (Gumbel-max: the argmax is distributed
// as softmax(x / temperature) over the candidates), u from the generator's Philox stream at
// counter offset + r * cols + j with 23 random bits, in (0, 1). The candidates are the values
// not below the row's k-th largest (ties at the cut all stay; top_k 0 keeps the row), NaN never
// one. The k-th largest is found by a radix select over order-preserving keys, bit by bit, so
// nothing is sorted. g is computed in double and rounded, as the CPU reference does, so the two
// agree except where two scores fall within a double rounding of each other. One block of 256
// threads per row; the argmax merge is argmax_rows_t's fixed tree: deterministic.
__device__ __forceinline__ u32 sample_key(float v) {
    if (v != v) return 0u;  // NaN: below every candidate
    const u32 b = __float_as_uint(v);
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

__device__ __forceinline__ u32 block_count(u32 c, u32* sh) {
    for (int o = 16; o > 0; o >>= 1) c += __shfl_xor_sync(0xffffffffu, c, o);
    if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = c;
    __syncthreads();
    u32 t = 0;
    for (u32 w = 0; w < (blockDim.x >> 5); ++w) t += sh[w];
    __syncthreads();
    return t;
}

template <typename T>
__device__ __forceinline__ void sample_rows_t(int* out, const T* x, const u32* state, u32 rows, u32 cols, float temperature, u32 top_k) {
    __shared__ float s_v[256];
    __shared__ u32 s_i[256];
    __shared__ u32 s_c[8];
    u64 seed, offset;
    rng_load(state, seed, offset);
    for (u64 r = blockIdx.x; r < rows; r += gridDim.x) {
        const T* row = x + r * cols;
        // The cut: the largest key with at least top_k keys at or above it (1: every non-NaN).
        u32 cut = 1u;
        if (top_k != 0 && top_k < cols) {
            u32 t = 0u;
            for (int bit = 31; bit >= 0; --bit) {
                const u32 cand = t | (1u << bit);
                u32 c = 0;
                for (u32 j = threadIdx.x; j < cols; j += blockDim.x) c += sample_key(ld(row, j)) >= cand;
                if (block_count(c, s_c) >= top_k) t = cand;
            }
            cut = t > 1u ? t : 1u;
        }
        float bv = gr_neg_inf();
        u32 bi = ARGMAX_NONE;
        for (u32 j = threadIdx.x; j < cols; j += blockDim.x) {
            const float v = ld(row, j);
            if (sample_key(v) < cut) continue;
            const u64 e = offset + r * cols + j;
            const uint4 b = philox4(seed, e >> 2);
            const u32 w = (e & 3) == 0 ? b.x : (e & 3) == 1 ? b.y : (e & 3) == 2 ? b.z : b.w;
            const double u = ((double)(w >> 9) + 0.5) * (1.0 / 8388608.0);
            const float g = (float)(-log(-log(u)));
            const float s = __fadd_rn(__fdiv_rn(v, temperature), g);
            if (argmax_better(s, j, bv, bi)) {
                bv = s;
                bi = j;
            }
        }
        argmax_block_merge(out + r, bv, bi, s_v, s_i);
    }
}

// ---------------------------------------------------------------- instantiations

extern "C" __global__ void __launch_bounds__(32 * DEC_WARPS) decode_partial_bf16_d64(float* part_o, float* part_lse, const bf16_t* q, const bf16_t* kc, const bf16_t* vc, const int* lengths, u32 heads, u32 kv_heads, u32 max_len, u32 split_len, float scale, u32* err) { GR_PDL_ENTRY(); decode_attend_t<bf16_t, 64, false, false>(part_o, part_lse, nullptr, q, const_cast<bf16_t*>(kc), const_cast<bf16_t*>(vc), const_cast<int*>(lengths), heads, kv_heads, max_len, split_len, scale, 64, err); }
extern "C" __global__ void __launch_bounds__(32 * DEC_WARPS) decode_partial_bf16_d128(float* part_o, float* part_lse, const bf16_t* q, const bf16_t* kc, const bf16_t* vc, const int* lengths, u32 heads, u32 kv_heads, u32 max_len, u32 split_len, float scale, u32* err) { GR_PDL_ENTRY(); decode_attend_t<bf16_t, 128, false, false>(part_o, part_lse, nullptr, q, const_cast<bf16_t*>(kc), const_cast<bf16_t*>(vc), const_cast<int*>(lengths), heads, kv_heads, max_len, split_len, scale, 128, err); }
extern "C" __global__ void __launch_bounds__(32 * DEC_WARPS) decode_partial_f16_d64(float* part_o, float* part_lse, const f16_t* q, const f16_t* kc, const f16_t* vc, const int* lengths, u32 heads, u32 kv_heads, u32 max_len, u32 split_len, float scale, u32* err) { GR_PDL_ENTRY(); decode_attend_t<f16_t, 64, false, false>(part_o, part_lse, nullptr, q, const_cast<f16_t*>(kc), const_cast<f16_t*>(vc), const_cast<int*>(lengths), heads, kv_heads, max_len, split_len, scale, 64, err); }
extern "C" __global__ void __launch_bounds__(32 * DEC_WARPS) decode_partial_f16_d128(float* part_o, float* part_lse, const f16_t* q, const f16_t* kc, const f16_t* vc, const int* lengths, u32 heads, u32 kv_heads, u32 max_len, u32 split_len, float scale, u32* err) { GR_PDL_ENTRY(); decode_attend_t<f16_t, 128, false, false>(part_o, part_lse, nullptr, q, const_cast<f16_t*>(kc), const_cast<f16_t*>(vc), const_cast<int*>(lengths), heads, kv_heads, max_len, split_len, scale, 128, err); }
extern "C" __global__ void __launch_bounds__(32 * DEC_WARPS) decode_partial_f32_any(float* part_o, float* part_lse, const float* q, const float* kc, const float* vc, const int* lengths, u32 heads, u32 kv_heads, u32 max_len, u32 split_len, float scale, u32 d, u32* err) { GR_PDL_ENTRY(); decode_attend_t<float, 0, false, false>(part_o, part_lse, nullptr, q, const_cast<float*>(kc), const_cast<float*>(vc), const_cast<int*>(lengths), heads, kv_heads, max_len, split_len, scale, d, err); }
extern "C" __global__ void __launch_bounds__(32 * DEC_WARPS) decode_partial_bf16_any(float* part_o, float* part_lse, const bf16_t* q, const bf16_t* kc, const bf16_t* vc, const int* lengths, u32 heads, u32 kv_heads, u32 max_len, u32 split_len, float scale, u32 d, u32* err) { GR_PDL_ENTRY(); decode_attend_t<bf16_t, 0, false, false>(part_o, part_lse, nullptr, q, const_cast<bf16_t*>(kc), const_cast<bf16_t*>(vc), const_cast<int*>(lengths), heads, kv_heads, max_len, split_len, scale, d, err); }
extern "C" __global__ void __launch_bounds__(32 * DEC_WARPS) decode_partial_f16_any(float* part_o, float* part_lse, const f16_t* q, const f16_t* kc, const f16_t* vc, const int* lengths, u32 heads, u32 kv_heads, u32 max_len, u32 split_len, float scale, u32 d, u32* err) { GR_PDL_ENTRY(); decode_attend_t<f16_t, 0, false, false>(part_o, part_lse, nullptr, q, const_cast<f16_t*>(kc), const_cast<f16_t*>(vc), const_cast<int*>(lengths), heads, kv_heads, max_len, split_len, scale, d, err); }
extern "C" __global__ void decode_combine_f32(float* out, const float* part_o, const float* part_lse, u32 heads, u32 splits, u32 d) { GR_PDL_ENTRY(); decode_combine_t(out, part_o, part_lse, heads, splits, d, nullptr, 0u); }
extern "C" __global__ void decode_combine_bf16(bf16_t* out, const float* part_o, const float* part_lse, u32 heads, u32 splits, u32 d) { GR_PDL_ENTRY(); decode_combine_t(out, part_o, part_lse, heads, splits, d, nullptr, 0u); }
extern "C" __global__ void decode_combine_f16(f16_t* out, const float* part_o, const float* part_lse, u32 heads, u32 splits, u32 d) { GR_PDL_ENTRY(); decode_combine_t(out, part_o, part_lse, heads, splits, d, nullptr, 0u); }
extern "C" __global__ void __launch_bounds__(32 * DEC_WARPS) decode_append_partial_bf16_d64(float* part_o, float* part_lse, const bf16_t* qkv, bf16_t* kc, bf16_t* vc, const int* lengths, u32 heads, u32 kv_heads, u32 max_len, u32 split_len, float scale, u32* err) { GR_PDL_ENTRY(); decode_attend_t<bf16_t, 64, true, false>(part_o, part_lse, nullptr, qkv, kc, vc, const_cast<int*>(lengths), heads, kv_heads, max_len, split_len, scale, 64, err); }
extern "C" __global__ void __launch_bounds__(32 * DEC_WARPS) decode_append_partial_bf16_d128(float* part_o, float* part_lse, const bf16_t* qkv, bf16_t* kc, bf16_t* vc, const int* lengths, u32 heads, u32 kv_heads, u32 max_len, u32 split_len, float scale, u32* err) { GR_PDL_ENTRY(); decode_attend_t<bf16_t, 128, true, false>(part_o, part_lse, nullptr, qkv, kc, vc, const_cast<int*>(lengths), heads, kv_heads, max_len, split_len, scale, 128, err); }
extern "C" __global__ void __launch_bounds__(32 * DEC_WARPS) decode_append_partial_f16_d64(float* part_o, float* part_lse, const f16_t* qkv, f16_t* kc, f16_t* vc, const int* lengths, u32 heads, u32 kv_heads, u32 max_len, u32 split_len, float scale, u32* err) { GR_PDL_ENTRY(); decode_attend_t<f16_t, 64, true, false>(part_o, part_lse, nullptr, qkv, kc, vc, const_cast<int*>(lengths), heads, kv_heads, max_len, split_len, scale, 64, err); }
extern "C" __global__ void __launch_bounds__(32 * DEC_WARPS) decode_append_partial_f16_d128(float* part_o, float* part_lse, const f16_t* qkv, f16_t* kc, f16_t* vc, const int* lengths, u32 heads, u32 kv_heads, u32 max_len, u32 split_len, float scale, u32* err) { GR_PDL_ENTRY(); decode_attend_t<f16_t, 128, true, false>(part_o, part_lse, nullptr, qkv, kc, vc, const_cast<int*>(lengths), heads, kv_heads, max_len, split_len, scale, 128, err); }
extern "C" __global__ void __launch_bounds__(32 * DEC_WARPS) decode_append_partial_f32_any(float* part_o, float* part_lse, const float* qkv, float* kc, float* vc, const int* lengths, u32 heads, u32 kv_heads, u32 max_len, u32 split_len, float scale, u32 d, u32* err) { GR_PDL_ENTRY(); decode_attend_t<float, 0, true, false>(part_o, part_lse, nullptr, qkv, kc, vc, const_cast<int*>(lengths), heads, kv_heads, max_len, split_len, scale, d, err); }
extern "C" __global__ void __launch_bounds__(32 * DEC_WARPS) decode_append_partial_bf16_any(float* part_o, float* part_lse, const bf16_t* qkv, bf16_t* kc, bf16_t* vc, const int* lengths, u32 heads, u32 kv_heads, u32 max_len, u32 split_len, float scale, u32 d, u32* err) { GR_PDL_ENTRY(); decode_attend_t<bf16_t, 0, true, false>(part_o, part_lse, nullptr, qkv, kc, vc, const_cast<int*>(lengths), heads, kv_heads, max_len, split_len, scale, d, err); }
extern "C" __global__ void __launch_bounds__(32 * DEC_WARPS) decode_append_partial_f16_any(float* part_o, float* part_lse, const f16_t* qkv, f16_t* kc, f16_t* vc, const int* lengths, u32 heads, u32 kv_heads, u32 max_len, u32 split_len, float scale, u32 d, u32* err) { GR_PDL_ENTRY(); decode_attend_t<f16_t, 0, true, false>(part_o, part_lse, nullptr, qkv, kc, vc, const_cast<int*>(lengths), heads, kv_heads, max_len, split_len, scale, d, err); }
extern "C" __global__ void decode_append_combine_f32(float* out, const float* part_o, const float* part_lse, int* lengths, u32 heads, u32 splits, u32 d, u32 max_len) { GR_PDL_ENTRY(); decode_combine_t(out, part_o, part_lse, heads, splits, d, lengths, max_len); }
extern "C" __global__ void decode_append_combine_bf16(bf16_t* out, const float* part_o, const float* part_lse, int* lengths, u32 heads, u32 splits, u32 d, u32 max_len) { GR_PDL_ENTRY(); decode_combine_t(out, part_o, part_lse, heads, splits, d, lengths, max_len); }
extern "C" __global__ void decode_append_combine_f16(f16_t* out, const float* part_o, const float* part_lse, int* lengths, u32 heads, u32 splits, u32 d, u32 max_len) { GR_PDL_ENTRY(); decode_combine_t(out, part_o, part_lse, heads, splits, d, lengths, max_len); }
extern "C" __global__ void __launch_bounds__(32 * DEC_WARPS * DEC_ONE_HEADS) decode_append_one_bf16_d64(bf16_t* out, const bf16_t* qkv, bf16_t* kc, bf16_t* vc, int* lengths, u32 heads, u32 kv_heads, u32 max_len, float scale, u32* err) { GR_PDL_ENTRY(); decode_attend_t<bf16_t, 64, true, true>(nullptr, nullptr, out, qkv, kc, vc, lengths, heads, kv_heads, max_len, max_len, scale, 64, err); }
extern "C" __global__ void __launch_bounds__(32 * DEC_WARPS * DEC_ONE_HEADS) decode_append_one_bf16_d128(bf16_t* out, const bf16_t* qkv, bf16_t* kc, bf16_t* vc, int* lengths, u32 heads, u32 kv_heads, u32 max_len, float scale, u32* err) { GR_PDL_ENTRY(); decode_attend_t<bf16_t, 128, true, true>(nullptr, nullptr, out, qkv, kc, vc, lengths, heads, kv_heads, max_len, max_len, scale, 128, err); }
extern "C" __global__ void __launch_bounds__(32 * DEC_WARPS * DEC_ONE_HEADS) decode_append_one_f16_d64(f16_t* out, const f16_t* qkv, f16_t* kc, f16_t* vc, int* lengths, u32 heads, u32 kv_heads, u32 max_len, float scale, u32* err) { GR_PDL_ENTRY(); decode_attend_t<f16_t, 64, true, true>(nullptr, nullptr, out, qkv, kc, vc, lengths, heads, kv_heads, max_len, max_len, scale, 64, err); }
extern "C" __global__ void __launch_bounds__(32 * DEC_WARPS * DEC_ONE_HEADS) decode_append_one_f16_d128(f16_t* out, const f16_t* qkv, f16_t* kc, f16_t* vc, int* lengths, u32 heads, u32 kv_heads, u32 max_len, float scale, u32* err) { GR_PDL_ENTRY(); decode_attend_t<f16_t, 128, true, true>(nullptr, nullptr, out, qkv, kc, vc, lengths, heads, kv_heads, max_len, max_len, scale, 128, err); }
extern "C" __global__ void kv_cache_append_u16(u16* kc, u16* vc, int* lengths, const u16* k, const u16* v, u32 kv_heads, u32 max_len, u32 d, u32* err) { GR_PDL_ENTRY(); kv_append_t(kc, vc, lengths, k, v, kv_heads, max_len, d, err); }
extern "C" __global__ void kv_cache_append_u32(u32* kc, u32* vc, int* lengths, const u32* k, const u32* v, u32 kv_heads, u32 max_len, u32 d, u32* err) { GR_PDL_ENTRY(); kv_append_t(kc, vc, lengths, k, v, kv_heads, max_len, d, err); }
extern "C" __global__ void kv_cache_fill_u16(u16* kc, u16* vc, const u16* k, const u16* v, u32 batch, u32 seq, u32 kv_heads, u32 max_len, u32 d) { GR_PDL_ENTRY(); kv_fill_t(kc, vc, k, v, batch, seq, kv_heads, max_len, d); }
extern "C" __global__ void kv_cache_fill_u32(u32* kc, u32* vc, const u32* k, const u32* v, u32 batch, u32 seq, u32 kv_heads, u32 max_len, u32 d) { GR_PDL_ENTRY(); kv_fill_t(kc, vc, k, v, batch, seq, kv_heads, max_len, d); }
extern "C" __global__ void fill_u32(u32* y, u32 bits, u32 n) {
    GR_PDL_ENTRY();
    for (u64 i = gr_tid(); i < n; i += gr_stride()) y[i] = bits;
}
extern "C" __global__ void __launch_bounds__(256) argmax_rows_f32(int* out, const float* x, u32 rows, u32 cols) { GR_PDL_ENTRY(); argmax_rows_t(out, x, rows, cols); }
extern "C" __global__ void __launch_bounds__(256) argmax_rows_bf16(int* out, const bf16_t* x, u32 rows, u32 cols) { GR_PDL_ENTRY(); argmax_rows_t(out, x, rows, cols); }
extern "C" __global__ void __launch_bounds__(256) argmax_rows_f16(int* out, const f16_t* x, u32 rows, u32 cols) { GR_PDL_ENTRY(); argmax_rows_t(out, x, rows, cols); }
extern "C" __global__ void __launch_bounds__(256) sample_rows_f32(int* out, const float* x, const u32* state, u32 rows, u32 cols, float temperature, u32 top_k) { GR_PDL_ENTRY(); sample_rows_t(out, x, state, rows, cols, temperature, top_k); }
extern "C" __global__ void __launch_bounds__(256) sample_rows_bf16(int* out, const bf16_t* x, const u32* state, u32 rows, u32 cols, float temperature, u32 top_k) { GR_PDL_ENTRY(); sample_rows_t(out, x, state, rows, cols, temperature, top_k); }
extern "C" __global__ void __launch_bounds__(256) sample_rows_f16(int* out, const f16_t* x, const u32* state, u32 rows, u32 cols, float temperature, u32 top_k) { GR_PDL_ENTRY(); sample_rows_t(out, x, state, rows, cols, temperature, top_k); }
