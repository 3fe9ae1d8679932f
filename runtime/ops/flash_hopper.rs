//! The fused attention backward on graphed's Hopper kernel (`kernels/flash_hopper.cu`,
//! [`AttentionEngine::Hopper`](super::AttentionEngine::Hopper)): two launches after the dsum
//! kernel (the backward, then dQ's conversion), their scratch from the pool.

use crate::backend::cuda_hopper::{hopper_chains, HopperBwd, HOPPER_TILE};
use crate::backend::{CudaBackend, KArg};
use crate::ops::cpu::AttnShape;
use crate::{DType, Device, Result, Tensor};

use super::flash::sizes;

/// The backward from the addresses of q, k, v (`ins`, rows `lds` elements apart), dO, lse and
/// dsum (`saved`) into dq, dk, dv (`grads`, laid out as the inputs). Scratch: the f32 `dQ`
/// sums (`batch · heads · query tiles · chains · 128 · 64` words, no need to clear: the
/// first key tile of each chain's order stores), which the second launch adds and writes to dq,
/// and the turn counters (one a chain of a query tile) with the work counter, zeroed for each
/// call (a memset node in a graph). A wait the
/// kernel gives up is counted in the device's error word ([`CudaBackend::stall_word`]).
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
    let tiles = d.seq.div_ceil(HOPPER_TILE);
    let items = tiles * a.kv_heads * d.batch;
    let chains = hopper_chains(items, c.sm_count);
    let turns = d.batch * d.heads * tiles * chains;
    let acc = Tensor::empty(dev, &[turns * HOPPER_TILE * 64])?;
    let counters = Tensor::zeros(dev, &[turns + 1])?;
    let mut args = vec![
        KArg::Ptr(acc.cuda_ptr()?),
        KArg::Ptr(dkp),
        KArg::Ptr(dvp),
        KArg::Ptr(counters.cuda_ptr()?),
        KArg::Ptr(c.stall_word()),
    ];
    args.extend([qp, kp, vp, dop, lp, sp].map(KArg::Ptr));
    args.push(KArg::U32(d.batch as u32));
    let sizes = sizes(a, lds);
    args.extend(sizes.iter().cloned());
    args.push(KArg::U32(chains as u32));
    c.launch_hopper_bwd(k, dtype, items, &args)?;
    // dq from the sums: seq, heads, q's row stride, causal and the scale, as `sizes` has them.
    let [seq, heads, _, qld, _, causal, scale] = sizes;
    let chains = KArg::U32(chains as u32);
    let convert = [KArg::Ptr(dqp), KArg::Ptr(acc.cuda_ptr()?), seq, heads, qld, causal, scale, chains];
    c.launch_hopper_dq(k, dtype, [tiles, d.heads, d.batch], &convert)
}
