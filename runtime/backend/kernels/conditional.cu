// The condition of a conditional graph node, set on the device: a program of its own, compiled
// by NVRTC the first time a device builds a conditional graph (not with the other kernels: an
// NVRTC older than CUDA 12.4 cannot build it, and every other kernel must still load there).
// Compiled after scale_update.cu (amp_update_state) and generation.cu (generation_step_block).
//
// cudaGraphSetConditional is a device-runtime builtin: declared __cudart_builtin__, NVRTC lowers
// it inline, so the PTX loads with cuModuleLoadData as it is (no -rdc, no cudadevrt link; the
// declaration is the one NVIDIA NeMo's NVRTC-compiled loop conditions use).
typedef __device_builtin__ unsigned long long cudaGraphConditionalHandle;
extern "C" __device__ __cudart_builtin__ void cudaGraphSetConditional(cudaGraphConditionalHandle handle, unsigned int value);

// value[0] (an i32 when is_i32, else an f32) < limit when below, else value[0] != 0. Compared in
// double, so every i32 is exact.
__device__ __forceinline__ bool graphed_test(const void* value, unsigned int is_i32, unsigned int below, float limit) {
    const double v = is_i32 ? (double)*(const int*)value : (double)*(const float*)value;
    return below ? v < (double)limit : v != 0.0;
}

// One thread: sets the node's condition to the test's outcome.
extern "C" __global__ void graphed_set_conditional(cudaGraphConditionalHandle handle, const void* value, unsigned int is_i32, unsigned int below, float limit) {
    cudaGraphSetConditional(handle, graphed_test(value, is_i32, below, limit) ? 1u : 0u);
}

// The same test, setting two conditions at once: `then` to its outcome and `otherwise` to the
// opposite (the two IF nodes of an if/else, evaluated once before either body runs).
extern "C" __global__ void graphed_set_conditional2(cudaGraphConditionalHandle then, cudaGraphConditionalHandle otherwise, const void* value, unsigned int is_i32, unsigned int below, float limit) {
    const bool on = graphed_test(value, is_i32, below, limit);
    cudaGraphSetConditional(then, on ? 1u : 0u);
    cudaGraphSetConditional(otherwise, on ? 0u : 1u);
}

// The loss scaler's update (scale_update.cu, amp_update's arithmetic), then the test and the
// conditions as the kernels above set them (`otherwise` too when `two`): the update that ends a
// mixed-precision step and the setting of the IF node(s) that skip its optimizer update, one
// launch. The update may go first: it reads only the overflow flag, which the test reads too,
// and writes only what neither branch reads. One thread.
extern "C" __global__ void graphed_amp_update_set(cudaGraphConditionalHandle then, cudaGraphConditionalHandle otherwise, unsigned int two, float* scaler, float growth, float backoff, unsigned int interval, const void* value, unsigned int is_i32, unsigned int below, float limit) {
    amp_update_state(scaler, growth, backoff, interval);
    const bool on = graphed_test(value, is_i32, below, limit);
    cudaGraphSetConditional(then, on ? 1u : 0u);
    if (two) cudaGraphSetConditional(otherwise, on ? 0u : 1u);
}

// One generation step (generation.cu, decode.cu's generation_step) that also sets the condition
// of the WHILE node whose body it ends, from the flag it writes: the loop's test (the flag
// nonzero) without a kernel of its own after each pass. `handle` is that node's; the runtime
// launches this kernel only where the step is the last work of the body and the node tests
// this flag (`GRAPHED_FOLD_CONDITION=1`). One block, as generation_step.
// Greedy sampling and the bookkeeping in one launch (generation.cu's greedy_record_block) that
// also sets the condition of the WHILE node whose body it ends, as graphed_generation_step_set
// does: a decoding step's argmax, bookkeeping and condition in one kernel instead of three.
// `batch` blocks of 256 threads.
extern "C" __global__ void graphed_greedy_record_set(cudaGraphConditionalHandle handle, const void* logits, unsigned int is_bf16, unsigned int cols, int* sampled, int* arrivals, int* tokens, int* counts, int* done, const int* limits, const int* stop, int* step, int* active, float* next_ids, float* positions, const int* lengths, unsigned int batch, unsigned int max_new) {
    const int flag = greedy_record_block(logits, is_bf16, cols, sampled, arrivals, tokens, counts, done, limits, stop, step, active, next_ids, positions, lengths, batch, max_new);
    if (flag >= 0 && threadIdx.x == 0) cudaGraphSetConditional(handle, flag ? 1u : 0u);
}

extern "C" __global__ void graphed_generation_step_set(cudaGraphConditionalHandle handle, int* tokens, int* counts, int* done, const int* limits, const int* stop, int* step, int* active, float* next_ids, float* positions, const int* sampled, const int* lengths, unsigned int batch, unsigned int max_new) {
    const int flag = generation_step_block(tokens, counts, done, limits, stop, step, active, next_ids, positions, sampled, lengths, batch, max_new);
    if (threadIdx.x == 0) cudaGraphSetConditional(handle, flag ? 1u : 0u);
}
