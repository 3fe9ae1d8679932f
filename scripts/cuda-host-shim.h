// A host shim to syntax/type-check the NVRTC sources with g++ (not a CUDA compiler).
#include <cmath>
#define __global__
#define __device__
#define __forceinline__ inline
#define __noinline__ __attribute__((noinline))
#define __shared__ static
#define asm(...) ((void)0)
#define extern_C
struct dim3s { unsigned x, y, z; };
static dim3s threadIdx, blockIdx, blockDim, gridDim;
struct uint4 { unsigned x, y, z, w; };
inline unsigned __float_as_uint(float f) { unsigned u; __builtin_memcpy(&u, &f, 4); return u; }
inline float __uint_as_float(unsigned u) { float f; __builtin_memcpy(&f, &u, 4); return f; }
inline float __int_as_float(int u) { float f; __builtin_memcpy(&f, &u, 4); return f; }
inline float __shfl_xor_sync(unsigned, float v, int) { return v; }
template <class T> inline T __shfl_sync(unsigned, T v, int) { return v; }
inline long long clock64() { return 0; }
inline void __syncthreads() {}
inline int __syncthreads_or(int p) { return p; }
using std::isfinite;
// Atomics and warp votes (transformer.cu's error word and the embedding backward's compaction).
inline unsigned long long atomicMin(unsigned long long* a, unsigned long long v) { unsigned long long o = *a; if (v < o) *a = v; return o; }
inline unsigned atomicMax(unsigned* a, unsigned v) { unsigned o = *a; if (v > o) *a = v; return o; }
inline unsigned atomicOr(unsigned* a, unsigned v) { unsigned o = *a; *a |= v; return o; }
inline unsigned atomicAdd(unsigned* a, unsigned v) { unsigned o = *a; *a += v; return o; }
inline int atomicAdd(int* a, int v) { int o = *a; *a += v; return o; }
inline float atomicAdd(float* a, float v) { float o = *a; *a += v; return o; }
inline unsigned atomicExch(unsigned* a, unsigned v) { unsigned o = *a; *a = v; return o; }
inline void __threadfence() {}
inline unsigned __ballot_sync(unsigned, bool p) { return p ? 1u : 0u; }
inline int __popc(unsigned v) { return __builtin_popcount(v); }
// flash.cu: launch bounds, alignment, dynamic shared memory, warp intrinsics.
#define __launch_bounds__(...)
#define __cluster_dims__(...)
#define __align__(n)
inline unsigned long long __cvta_generic_to_shared(const void* p) { return (unsigned long long)p; }
inline void __syncwarp() {}
template <class T> inline T __ldg(const T* p) { return *p; }
template <class T> inline T __ldcg(const T* p) { return *p; }
template <class T> inline void __stcg(T* p, T v) { *p = v; }
inline unsigned int min(unsigned int a, unsigned int b) { return a < b ? a : b; }
inline float __log2f(float x) { return std::log2(x); }
inline float __fdiv_rn(float a, float b) { return a / b; }
using std::fmaxf;
// mixed.cu's vectorised AdamW.
struct float2 { float x, y; };
inline float2 make_float2(float x, float y) { return float2{x, y}; }
struct float4 { float x, y, z, w; };
struct uint2 { unsigned x, y; };
inline uint2 make_uint2(unsigned x, unsigned y) { return uint2{x, y}; }
inline float4 make_float4(float x, float y, float z, float w) { return float4{x, y, z, w}; }
// decode.cu's sampling (rounding-exact adds).
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline uint4 make_uint4(unsigned a, unsigned b, unsigned c, unsigned d) { return uint4{a, b, c, d}; }
