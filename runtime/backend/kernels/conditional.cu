// The condition of a conditional graph node, set on the device: a program of its own, compiled
// by NVRTC the first time a device builds a conditional graph (not with the other kernels: an
// NVRTC older than CUDA 12.4 cannot build it, and every other kernel must still load there).
//
// cudaGraphSetConditional is a device-runtime builtin: declared __cudart_builtin__, NVRTC lowers
// it inline, so the PTX loads with cuModuleLoadData as it is (no -rdc, no cudadevrt link; the
// declaration is the one NVIDIA NeMo's NVRTC-compiled loop conditions use).
typedef __device_builtin__ unsigned long long cudaGraphConditionalHandle;
extern "C" __device__ __cudart_builtin__ void cudaGraphSetConditional(cudaGraphConditionalHandle handle, unsigned int value);

// One thread: reads value[0] (an i32 when is_i32, else an f32) and sets the node's condition to
// value < limit when below, else value != 0. Compared in double, so every i32 is exact.
extern "C" __global__ void graphed_set_conditional(cudaGraphConditionalHandle handle, const void* value, unsigned int is_i32, unsigned int below, float limit) {
    const double v = is_i32 ? (double)*(const int*)value : (double)*(const float*)value;
    const bool on = below ? v < (double)limit : v != 0.0;
    cudaGraphSetConditional(handle, on ? 1u : 0u);
}

// The same test, setting two conditions at once: `then` to its outcome and `otherwise` to the
// opposite (the two IF nodes of an if/else, evaluated once before either body runs).
extern "C" __global__ void graphed_set_conditional2(cudaGraphConditionalHandle then, cudaGraphConditionalHandle otherwise, const void* value, unsigned int is_i32, unsigned int below, float limit) {
    const double v = is_i32 ? (double)*(const int*)value : (double)*(const float*)value;
    const bool on = below ? v < (double)limit : v != 0.0;
    cudaGraphSetConditional(then, on ? 1u : 0u);
    cudaGraphSetConditional(otherwise, on ? 0u : 1u);
}
