// The cross-entropy's mean folded into its row-in-shared-memory kernel, two ways, for
// bench/xent_fold.py (compiled after the runtime's kernels: sx_smem_t, block_sum and
// IGNORE_LABEL come from there). The runtime launches the row kernel and then a one-block mean
// (xent_mean_f32); the mean's launch and the gap before it are most of what keeps the bf16
// 4096 x 4096 op above 1.3x of its bandwidth floor.
//
// - xf_spin_*: the grid's last block, once its own row is done, reads every row's loss from
//   `slots` as it arrives: a slot holds XF_EMPTY (a NaN no kernel writes) until its row's block
//   stores the loss there, so the data is its own flag and no block fences or counts; the last
//   block is the last one the hardware starts, so every other block is running or done. It
//   leaves every slot XF_EMPTY again for the next launch.
// - xf_ticket_*: every block's thread 0 fences its row's loss and takes a ticket (atomicAdd);
//   the block with the last ticket adds the losses and sets the ticket back to 0.
//
// Both add a thread's rows (i = threadIdx.x mod blockDim.x) in order, then the block's threads
// (block_sum): an order fixed by the rows and the block size.

#define XF_EMPTY 0x7fbadbadu
#ifndef XF_U
#define XF_U 8
#endif

__device__ __forceinline__ float xf_ld(const float* p) {
    float v;
    asm volatile("ld.relaxed.gpu.global.f32 %0, [%1];" : "=f"(v) : "l"(p) : "memory");
    return v;
}

// out[0] = the mean of slots[0..rows) over the rows whose label is not ignored; WAIT: poll each
// slot until it is no longer XF_EMPTY, then set it back.
template <bool WAIT>
__device__ __forceinline__ void xf_mean(float* out, float* slots, const float* labels, u32 rows) {
    __shared__ float sh[32];
    float s = 0.0f, n = 0.0f;
    // The labels first: they are there from the start (while the last rows are still running).
    for (u32 i = threadIdx.x; i < rows; i += blockDim.x) n += labels[i] != IGNORE_LABEL ? 1.0f : 0.0f;
    for (u32 base = 0; base < rows; base += XF_U * blockDim.x) {
        float v[XF_U];
#pragma unroll
        for (u32 k = 0; k < XF_U; ++k) {
            const u32 i = base + threadIdx.x + k * blockDim.x;
            v[k] = i < rows ? xf_ld(slots + i) : 0.0f;
        }
        if (WAIT) {
            for (bool again = true; again;) {
                again = false;
#pragma unroll
                for (u32 k = 0; k < XF_U; ++k) {
                    const u32 i = base + threadIdx.x + k * blockDim.x;
                    if (i < rows && __float_as_uint(v[k]) == XF_EMPTY) {
                        v[k] = xf_ld(slots + i);
                        again = true;
                    }
                }
            }
        }
#pragma unroll
        for (u32 k = 0; k < XF_U; ++k) {
            const u32 i = base + threadIdx.x + k * blockDim.x;
            if (i < rows) {
                s += v[k];
                if (WAIT) slots[i] = __uint_as_float(XF_EMPTY);
            }
        }
    }
    n = block_sum(n, sh);
    s = block_sum(s, sh);
    if (threadIdx.x == 0) out[0] = n > 0.0f ? s * __fdiv_rn(1.0f, n) : 0.0f;
}

template <typename T>
__device__ __forceinline__ void xf_spin_t(T* probs, float* slots, const T* logits, const float* labels, u32 rows, u32 c, float* out) {
    sx_smem_t<T, false>(probs, slots, logits, labels, rows, c);
    if (blockIdx.x == gridDim.x - 1) xf_mean<true>(out, slots, labels, rows);
}

template <typename T>
__device__ __forceinline__ void xf_ticket_t(T* probs, float* row_loss, const T* logits, const float* labels, u32 rows, u32 c, float* out,
                                            u32* ticket) {
    sx_smem_t<T, false>(probs, row_loss, logits, labels, rows, c);
    __shared__ bool last;
    if (threadIdx.x == 0) {
        __threadfence();
        last = atomicAdd(ticket, 1u) == gridDim.x - 1;
    }
    __syncthreads();
    if (!last) return;
    __threadfence();
    xf_mean<false>(out, row_loss, labels, rows);
    if (threadIdx.x == 0) *ticket = 0;
}

extern "C" __global__ void __launch_bounds__(1024) xf_spin_f32(float* p, float* slots, const float* x, const float* l, u32 rows, u32 c, float* out) {
    xf_spin_t<float>(p, slots, x, l, rows, c, out);
}
extern "C" __global__ void __launch_bounds__(1024) xf_spin_bf16(bf16_t* p, float* slots, const bf16_t* x, const float* l, u32 rows, u32 c, float* out) {
    xf_spin_t<bf16_t>(p, slots, x, l, rows, c, out);
}
extern "C" __global__ void __launch_bounds__(1024) xf_ticket_f32(float* p, float* rl, const float* x, const float* l, u32 rows, u32 c, float* out, u32* t) {
    xf_ticket_t<float>(p, rl, x, l, rows, c, out, t);
}
extern "C" __global__ void __launch_bounds__(1024) xf_ticket_bf16(bf16_t* p, float* rl, const bf16_t* x, const float* l, u32 rows, u32 c, float* out, u32* t) {
    xf_ticket_t<bf16_t>(p, rl, x, l, rows, c, out, t);
}
