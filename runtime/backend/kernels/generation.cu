// Generation's bookkeeping and greedy sampling's merge, shared by two programs: decode.cu's
// generation_step and argmax kernels (the main kernels) and conditional.cu's
// graphed_generation_step_set and graphed_greedy_record_set (the condition kernels, compiled
// apart), so a step whose kernel also sets a WHILE node's condition keeps the same books and
// picks the same tokens. Plain C types: the condition program has none of the main one's.

// Greedy sampling's order: (value, index) with the larger value first, then the lower index;
// ARGMAX_NONE (no value yet, or NaN) last. A total order, so every merge gives the same pair.
#define ARGMAX_NONE 0xffffffffu
__device__ __forceinline__ bool argmax_better(float v, unsigned int i, float bv, unsigned int bi) {
    return i != ARGMAX_NONE && (bi == ARGMAX_NONE || v > bv || (v == bv && i < bi));
}

// The block's (value, index) pairs merged by a fixed tree into out[0] (0 when every thread's
// index is none); a total order, so the result is the same on every run.
__device__ __forceinline__ void argmax_block_merge(int* out, float bv, unsigned int bi, float* s_v, unsigned int* s_i) {
    s_v[threadIdx.x] = bv;
    s_i[threadIdx.x] = bi;
    __syncthreads();
    for (unsigned int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s && argmax_better(s_v[threadIdx.x + s], s_i[threadIdx.x + s], s_v[threadIdx.x], s_i[threadIdx.x])) {
            s_v[threadIdx.x] = s_v[threadIdx.x + s];
            s_i[threadIdx.x] = s_i[threadIdx.x + s];
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) *out = s_i[0] == ARGMAX_NONE ? 0 : (int)s_i[0];
    __syncthreads();
}
//
// One block: thread b (strided) records sequence b's token at column `step` of tokens ([batch,
// max_new]): the sampled one while the sequence is active, the pad token once it is done. An
// active sequence counts its token and is done when the token is the end token (stop[0], -1 for
// none) or its count reaches limits[b]. Writes the ids the next step embeds (the recorded token,
// as a float) and their positions (lengths[b], the cache length after this step's append). Then
// thread 0 advances step and sets active = (some sequence is active and step < max_new), the
// loop condition; __syncthreads_or makes every thread read step before it changes. Returns that
// flag, the same in every thread. `sampled` is read with volatile loads: in the greedy step
// below other blocks of the same launch wrote it.
__device__ __forceinline__ int generation_step_block(int* tokens, int* counts, int* done, const int* limits, const int* stop, int* step, int* active, float* next_ids, float* positions, const volatile int* sampled, const int* lengths, unsigned int batch, unsigned int max_new) {
    const int s = *step;
    const int end = stop[0], pad = stop[1];
    int any = 0;
    for (unsigned int b = threadIdx.x; b < batch; b += blockDim.x) {
        const bool was_done = done[b] != 0;
        const int tok = was_done ? pad : sampled[b];
        if (s >= 0 && s < (int)max_new) tokens[(unsigned long long)b * max_new + s] = tok;
        if (!was_done) {
            const int n = counts[b] + 1;
            counts[b] = n;
            if (tok == end || n >= limits[b]) {
                done[b] = 1;
            } else {
                any = 1;
            }
        }
        next_ids[b] = (float)tok;
        positions[b] = (float)lengths[b];
    }
    const int any_active = __syncthreads_or(any);
    const int flag = (any_active && s + 1 < (int)max_new) ? 1 : 0;
    if (threadIdx.x == 0) {
        *step = s + 1;
        *active = flag;
    }
    return flag;
}

// Greedy sampling and the bookkeeping in one launch of `batch` blocks of 256 threads: block r
// takes the argmax of row r of `logits` ([batch, cols]; bf16 when is_bf16, else f32) into
// sampled[r], as the argmax kernel does (each thread scans its columns in order, then the fixed
// merge), then the last block to finish (arrivals[0] counts the blocks; that block puts it back
// to 0 for the next launch) keeps the books over every row with generation_step_block. Returns
// the loop flag in that block, -1 in the others.
__device__ __forceinline__ int greedy_record_block(const void* logits, unsigned int is_bf16, unsigned int cols, int* sampled, int* arrivals, int* tokens, int* counts, int* done, const int* limits, const int* stop, int* step, int* active, float* next_ids, float* positions, const int* lengths, unsigned int batch, unsigned int max_new) {
    __shared__ float s_v[256];
    __shared__ unsigned int s_i[256];
    __shared__ int s_last;
    const unsigned long long row = (unsigned long long)blockIdx.x * cols;
    float bv = 0.0f;
    unsigned int bi = ARGMAX_NONE;
    for (unsigned int j = threadIdx.x; j < cols; j += blockDim.x) {
        const float v = is_bf16 ? __uint_as_float((unsigned int)((const unsigned short*)logits)[row + j] << 16)
                                : ((const float*)logits)[row + j];
        if (v == v && argmax_better(v, j, bv, bi)) {
            bv = v;
            bi = j;
        }
    }
    argmax_block_merge(sampled + blockIdx.x, bv, bi, s_v, s_i);
    if (threadIdx.x == 0) {
        __threadfence();
        s_last = atomicAdd(arrivals, 1) == (int)gridDim.x - 1;
    }
    __syncthreads();
    if (!s_last) return -1;
    __threadfence();
    const int flag = generation_step_block(tokens, counts, done, limits, stop, step, active, next_ids, positions, sampled, lengths, batch, max_new);
    if (threadIdx.x == 0) *arrivals = 0;
    return flag;
}
