// The wgmma operand forms of runtime/backend/kernels/flash_hopper.cu, tested one at a time by
// bench/hopper_bwd.py (compiled after that file, for sm_90a).
//
// One warpgroup, 64 x 64 x 64 bf16 products into c (f32 [64][64] row-major), each operand
// [64][64] row-major in global memory, staged into a swizzled tile as the kernel above does:
//   mode 0: c = a · bᵀ      (A and B K-major: Sᵀ = K·Qᵀ)
//   mode 1: c = a · b       (A from registers, B N-major: dV += Pᵀ·dO)
//   mode 2: c = aᵀ · b      (A M-major, B N-major: dQ = dS·K with dSᵀ stored)
//   mode 3: c = a · bᵀ      (m64n128: b [128][64], c [64][128]: Sᵀ = K·Qᵀ over a 128-query tile)
// A warpgroup's accumulators (N columns, rows r and r + 8 of this thread) to c [64][N].
template <int N>
__device__ __forceinline__ void hb_test_store(float* c, const float* d, int r, int t) {
#pragma unroll
    for (int cc = 0; cc < N / 8; ++cc) {
        c[r * N + 8 * cc + 2 * t] = d[4 * cc];
        c[r * N + 8 * cc + 2 * t + 1] = d[4 * cc + 1];
        c[(r + 8) * N + 8 * cc + 2 * t] = d[4 * cc + 2];
        c[(r + 8) * N + 8 * cc + 2 * t + 1] = d[4 * cc + 3];
    }
}

extern "C" __global__ void __launch_bounds__(128) hb_layout_test(float* c, const u16* a, const u16* b, u32 mode) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && defined(__CUDA_ARCH_FEAT_SM90_ALL)
    const u32 raw = fa_saddr(fa_smem);
    const u32 sb = (raw + 1023u) & ~1023u;
    u16* sA = reinterpret_cast<u16*>(fa_smem + (sb - raw));
    u16* sB = sA + 4096;
    fa_load<64, 64, 128>(sA, a, 64, 0, 64);
    fa_load<64, 128, 128>(sB, b, 64, 0, mode == 3 ? 128 : 64);
    fa_commit();
    fa_wait0();
    hb_proxy_fence();
    __syncthreads();
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, gr = lane >> 2, t = lane & 3;
    if (mode == 3) {
        float d[64];
        hb_fence();
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) hb_ss128<true>(d, hb_desc(sb + kk * 32), hb_desc(sb + 8192 + kk * 32), kk);
        hb_commit();
        hb_wait<0>();
        hb_keep<64>(d);
        hb_test_store<128>(c, d, 16 * warp + gr, t);
        return;
    }
    float d[32];
#pragma unroll
    for (int i = 0; i < 32; ++i) d[i] = 0.0f;
    hb_fence();
    if (mode == 0) {
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) hb_ss<true, 0, 0>(d, hb_desc(sb + kk * 32), hb_desc(sb + 8192 + kk * 32), kk);
    } else if (mode == 1) {
        u32 ar[4][4];
        const int r = 16 * warp + gr;
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) {
            ar[kk][0] = *reinterpret_cast<const u32*>(a + r * 64 + 16 * kk + 2 * t);
            ar[kk][1] = *reinterpret_cast<const u32*>(a + (r + 8) * 64 + 16 * kk + 2 * t);
            ar[kk][2] = *reinterpret_cast<const u32*>(a + r * 64 + 16 * kk + 8 + 2 * t);
            ar[kk][3] = *reinterpret_cast<const u32*>(a + (r + 8) * 64 + 16 * kk + 8 + 2 * t);
        }
        hb_fence();
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) hb_rs<true, 1>(d, ar[kk], hb_desc(sb + 8192 + kk * 2048), kk);
        hb_commit();
        hb_wait<0>();
        hb_keep_u<4>(ar);
    } else {
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) hb_ss<true, 1, 1>(d, hb_desc(sb + kk * 2048), hb_desc(sb + 8192 + kk * 2048), kk);
    }
    hb_commit();
    hb_wait<0>();
    hb_keep(d);
    hb_test_store<64>(c, d, 16 * warp + gr, t);
#endif
}
