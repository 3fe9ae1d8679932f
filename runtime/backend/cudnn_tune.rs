//! cuDNN's attention plans chosen by timing (`GRAPHED_ATTENTION_TUNE=1`, a measurement
//! setting, read once a process): where cuDNN's heuristics offer several execution plans for a
//! shape, each of the first `TUNE_PLANS` is run on scratch tensors of the shape and the
//! fastest kept (the heuristics' first unless another is clearly faster; see `tuning.rs`). The
//! first time a shape's plan is built outside a capture only; inside one, and without the
//! setting, the heuristics' first plan runs, as it always has. A shape's plan never changes in
//! the process once chosen, so graphs and eager calls run the same kernels.

use cudarc::cudnn::sys;

use super::cuda::CudaBackend;
use super::cudnn::{execute_plan, Plan, SdpaGrads, SdpaKey, SdpaPass, SdpaPointers};

/// `GRAPHED_ATTENTION_TUNE=1`, read once a process.
pub(super) fn requested() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("GRAPHED_ATTENTION_TUNE").is_ok_and(|v| v == "1"))
}

/// The scratch blocks a call of `key` reads and writes, in bytes, in the order
/// [`pointers`] takes them: q (or the packed q/k/v), k, v, out, the statistics, dO, dq (or
/// the packed grads), dk, dv, the `rowsum(dO ∘ O)` scratch, the nondeterministic backward's
/// f32 accumulator, and the workspace (0 where the call has none of it).
fn scratch_bytes(key: &SdpaKey, workspace: usize) -> [usize; 12] {
    let SdpaKey { batch: b, seq, heads: h, head_dim: d, .. } = *key;
    let (s, rows) = (key.dtype.size(), b * seq);
    let width = h * d;
    let (first, each) = if key.packed { (rows * 3 * width * s, 0) } else { (rows * width * s, rows * width * s) };
    let stats = b * h * seq * 4;
    let backward = key.pass == SdpaPass::Backward;
    let grad = |bytes: usize| if backward { bytes } else { 0 };
    let accum = if backward && !key.deterministic { b * h * seq * d * 4 } else { 0 };
    let out = rows * width * s;
    // The workspace as the calls that run the plan have it: at least one word, never null.
    let workspace = workspace.max(4);
    [first, each, each, out, stats, grad(out), grad(first), grad(each), grad(each), grad(stats), accum, workspace]
}

/// The tensors of a call of `key` in the scratch blocks `p` (see [`scratch_bytes`]).
fn pointers(key: &SdpaKey, p: &[u64]) -> SdpaPointers {
    let column = (key.heads * key.head_dim * key.dtype.size()) as u64;
    // Packed: k and v are the second and third column blocks of the first block.
    let qkv =
        |base: u64, k: u64, v: u64| if key.packed { (base, base + column, base + 2 * column) } else { (base, k, v) };
    let (q, k, v) = qkv(p[0], p[1], p[2]);
    let (dq, dk, dv) = qkv(p[6], p[7], p[8]);
    let grads = (key.pass == SdpaPass::Backward).then(|| SdpaGrads {
        dout: p[5],
        dq,
        dk,
        dv,
        dsum: p[9],
        dq_accum: (!key.deterministic).then_some(p[10]),
    });
    SdpaPointers { q, k, v, o: p[3], stats: p[4], grads }
}

impl CudaBackend {
    /// The index of the plan to keep of `plans` (built for `key` with `handle`), by timing
    /// each on scratch tensors. The caller holds the lock around cuDNN and checked that no
    /// capture is in progress.
    pub(super) fn time_sdpa_plans(&self, handle: sys::cudnnHandle_t, key: SdpaKey, plans: &[Plan]) -> usize {
        let workspace = plans.iter().map(|p| p.workspace).max().unwrap_or(0);
        let stream = self.stream.cu_stream() as sys::cudaStream_t;
        self.time_choices(&scratch_bytes(&key, workspace), plans, &|plan, p| {
            // SAFETY: the scratch blocks hold the key's tensors (see `scratch_bytes`) and the
            // largest plan's workspace; the lock around cuDNN is held by the caller, so the
            // handle is used by no other call; the stream is this device's.
            unsafe { execute_plan(handle, plan, key, stream, &pointers(&key, p), p[11]) }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::DType;

    fn key(pass: SdpaPass, packed: bool, deterministic: bool) -> SdpaKey {
        SdpaKey {
            pass,
            dtype: DType::BF16,
            batch: 2,
            seq: 128,
            heads: 4,
            head_dim: 64,
            causal: true,
            deterministic,
            packed,
        }
    }

    #[test]
    fn a_forward_needs_no_grads_and_a_packed_call_one_block_for_q_k_v() {
        let rows_bytes = 2 * 128 * 4 * 64 * 2;
        let stats = 2 * 4 * 128 * 4;
        let f = scratch_bytes(&key(SdpaPass::Forward, false, true), 7);
        assert_eq!(f, [rows_bytes, rows_bytes, rows_bytes, rows_bytes, stats, 0, 0, 0, 0, 0, 0, 7]);
        let b = scratch_bytes(&key(SdpaPass::Backward, true, false), 0);
        assert_eq!(b[..3], [3 * rows_bytes, 0, 0]);
        assert_eq!(b[5..11], [rows_bytes, 3 * rows_bytes, 0, 0, stats, 2 * 4 * 128 * 64 * 4]);
    }

    #[test]
    fn packed_tensors_are_column_blocks_of_the_first() {
        let k = key(SdpaPass::Backward, true, true);
        let p: Vec<u64> = (0..12).map(|i| 1_000_000 * (i + 1)).collect();
        let t = pointers(&k, &p);
        let column = 4 * 64 * 2;
        assert_eq!((t.q, t.k, t.v), (p[0], p[0] + column, p[0] + 2 * column));
        let g = t.grads.expect("a backward has grads");
        assert_eq!((g.dq, g.dk, g.dv), (p[6], p[6] + column, p[6] + 2 * column));
        assert_eq!(g.dq_accum, None);
        assert!(pointers(&key(SdpaPass::Forward, false, true), &p).grads.is_none());
    }
}
