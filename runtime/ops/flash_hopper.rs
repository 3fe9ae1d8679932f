//! The fused attention backward on graphed's Hopper kernel (`kernels/flash_hopper.cu`,
//! [`AttentionEngine::Hopper`](super::AttentionEngine::Hopper)): one launch after the dsum
//! kernel, its scratch from the pool.

use crate::backend::cuda_hopper::HopperBwd;
use crate::backend::{CudaBackend, KArg};
use crate::ops::cpu::AttnShape;
use crate::{DType, Device, Result, Tensor};

use super::flash::sizes;

/// The backward from the addresses of q, k, v (`ins`, rows `lds` elements apart), dO, lse and
/// dsum (`saved`) into dq, dk, dv (`grads`, laid out as the inputs). Scratch: the f32 `dQ`
/// accumulator (`batch · heads · query tiles · 64 · 64` words, no need to clear: the first key
/// tile of each query tile's order stores) and the turn counters with the work counter, zeroed
/// for each call (a memset node in a graph). A wait the kernel gives up is counted in the
/// device's error word ([`CudaBackend::stall_word`]).
#[allow(clippy::too_many_arguments)]
pub(super) fn backward(
    c: &CudaBackend,
    k: &HopperBwd,
    a: AttnShape,
    dtype: DType,
    lds: [usize; 2],
    [qp, kp, vp]: [u64; 3],
    [dop, lp, sp]: [u64; 3],
    [dqp, dkp, dvp]: [u64; 3],
    dev: &Device,
) -> Result<()> {
    let d = a.dims;
    let (query_tiles, key_tiles) = (d.seq.div_ceil(64), d.seq.div_ceil(128));
    let turns = d.batch * d.heads * query_tiles;
    let acc = Tensor::empty(dev, &[turns * 64 * 64])?;
    let counters = Tensor::zeros(dev, &[turns + 1])?;
    let mut args = vec![
        KArg::Ptr(dqp),
        KArg::Ptr(dkp),
        KArg::Ptr(dvp),
        KArg::Ptr(acc.cuda_ptr()?),
        KArg::Ptr(counters.cuda_ptr()?),
        KArg::Ptr(c.stall_word()),
    ];
    args.extend([qp, kp, vp, dop, lp, sp].map(KArg::Ptr));
    args.push(KArg::U32(d.batch as u32));
    args.extend(sizes(a, lds));
    c.launch_hopper_bwd(k, dtype, key_tiles * a.kv_heads * d.batch, &args)
}
