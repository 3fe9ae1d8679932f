// Generation's bookkeeping, shared by two programs: decode.cu's generation_step (the main
// kernels) and conditional.cu's graphed_generation_step_set (the condition kernels, compiled
// apart), so a step whose kernel also sets a WHILE node's condition keeps the same books.
// Plain C types: the condition program has none of the main one's.
//
// One block: thread b (strided) records sequence b's token at column `step` of tokens ([batch,
// max_new]): the sampled one while the sequence is active, the pad token once it is done. An
// active sequence counts its token and is done when the token is the end token (stop[0], -1 for
// none) or its count reaches limits[b]. Writes the ids the next step embeds (the recorded token,
// as a float) and their positions (lengths[b], the cache length after this step's append). Then
// thread 0 advances step and sets active = (some sequence is active and step < max_new), the
// loop condition; __syncthreads_or makes every thread read step before it changes. Returns that
// flag, the same in every thread.
__device__ __forceinline__ int generation_step_block(int* tokens, int* counts, int* done, const int* limits, const int* stop, int* step, int* active, float* next_ids, float* positions, const int* sampled, const int* lengths, unsigned int batch, unsigned int max_new) {
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
