// Core kernels of the graphed runtime: the graph-safe Philox RNG. (Fills, axpy and scale are
// the vectorised templates of half.cu.)
// Compiled once per context by NVRTC; every kernel is extern "C" so its name is stable.

typedef unsigned int u32;
typedef unsigned long long u64;

// Programmatic dependent launch, opt-in (GRAPHED_PDL=1 compiles with GR_PDL and launches the
// built-in kernels with the programmatic stream serialization attribute; sm_90 and newer).
// Every built-in kernel starts with GR_PDL_ENTRY(): it waits until the kernel before it in the
// stream has completed and its writes are visible, before touching memory, so a kernel that
// launched early reads nothing stale; then it lets the next kernel launch, whose blocks wait in
// turn. Without GR_PDL it is empty: the program is the one without it.
#if defined(GR_PDL) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define GR_PDL_ENTRY() asm volatile("griddepcontrol.wait;\n\tgriddepcontrol.launch_dependents;" ::: "memory")
#else
#define GR_PDL_ENTRY()
#endif

// Philox4x32-10, the counter-based generator of Salmon et al. (SC'11), as cuRAND and
// PyTorch use it. The host backend implements the same function bit for bit.
__device__ __forceinline__ void philox_round(u32& c0, u32& c1, u32& c2, u32& c3, u32 k0, u32 k1) {
    u64 p0 = (u64)0xD2511F53u * c0;
    u64 p1 = (u64)0xCD9E8D57u * c2;
    u32 hi0 = (u32)(p0 >> 32), lo0 = (u32)p0;
    u32 hi1 = (u32)(p1 >> 32), lo1 = (u32)p1;
    u32 n0 = hi1 ^ c1 ^ k0;
    u32 n2 = hi0 ^ c3 ^ k1;
    c0 = n0; c1 = lo1; c2 = n2; c3 = lo0;
}

// The four words of Philox block `block` under `seed`: counter (block lo, block hi, 0, 0), key
// (seed lo, seed hi).
__device__ __forceinline__ uint4 philox4(u64 seed, u64 block) {
    u32 c0 = (u32)block, c1 = (u32)(block >> 32), c2 = 0, c3 = 0;
    u32 k0 = (u32)seed, k1 = (u32)(seed >> 32);
#pragma unroll
    for (int r = 0; r < 10; ++r) {
        philox_round(c0, c1, c2, c3, k0, k1);
        k0 += 0x9E3779B9u;
        k1 += 0xBB67AE85u;
    }
    uint4 out;
    out.x = c0;
    out.y = c1;
    out.z = c2;
    out.w = c3;
    return out;
}

// Uniform in [0, 1) with 24 random bits: exact in float on every backend.
__device__ __forceinline__ float philox_unit(u32 bits) { return (float)(bits >> 8) * (1.0f / 16777216.0f); }

// The generator's stream: counter `e` is word e % 4 of block e / 4, so one Philox call serves
// four consecutive counters (the vectorised dropout draws whole blocks).
__device__ __forceinline__ float philox_uniform(u64 seed, u64 counter) {
    const uint4 b = philox4(seed, counter >> 2);
    const u32 k = (u32)(counter & 3);
    return philox_unit(k == 0 ? b.x : k == 1 ? b.y : k == 2 ? b.z : b.w);
}

// The uniforms of counters 4 * block .. 4 * block + 3.
__device__ __forceinline__ void philox_uniform4(u64 seed, u64 block, float& u0, float& u1, float& u2, float& u3) {
    const uint4 b = philox4(seed, block);
    u0 = philox_unit(b.x);
    u1 = philox_unit(b.y);
    u2 = philox_unit(b.z);
    u3 = philox_unit(b.w);
}

// The generator state lives in device memory as 4 words: seed lo, seed hi, offset lo, offset hi.
__device__ __forceinline__ void rng_load(const u32* state, u64& seed, u64& offset) {
    seed = (u64)state[0] | ((u64)state[1] << 32);
    offset = (u64)state[2] | ((u64)state[3] << 32);
}

extern "C" __global__ void rng_uniform_f32(float* y, const u32* state, u32 n) {
    GR_PDL_ENTRY();
    u64 seed, offset;
    rng_load(state, seed, offset);
    u32 i = blockIdx.x * blockDim.x + threadIdx.x;
    for (; i < n; i += gridDim.x * blockDim.x) y[i] = philox_uniform(seed, offset + i);
}

// Advances the offset by n: launched after every draw, so a replayed graph draws fresh numbers.
extern "C" __global__ void rng_advance(u32* state, u64 n) {
    GR_PDL_ENTRY();
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        u64 offset = ((u64)state[2] | ((u64)state[3] << 32)) + n;
        state[2] = (u32)offset;
        state[3] = (u32)(offset >> 32);
    }
}

