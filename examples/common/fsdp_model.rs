//! The examples' block with FSDP-sharded parameters: the same numbers as `model::Block`, but
//! each rank holds half of W and b, gathered by capture-time hooks and captured collectives.
#![allow(dead_code)]

use graphed::dist::{Communicator, ShardedParams};
use graphed::ops::{self, Gelu};
use graphed::{capture_time_hook, graphed, Cx, Result, Tensor};

use super::model::random;

/// `y = GELU(x W^T + b)` with W and b sharded over the ranks.
pub struct FsdpBlock {
    /// This rank's shards of W [out, in] and b [out].
    pub shards: ShardedParams,
}

impl FsdpBlock {
    /// Initialised exactly as `model::Block::new(dev, din, dout, seed)`.
    pub fn new(comm: &Communicator, din: usize, dout: usize, seed: u64) -> Result<FsdpBlock> {
        let (dev, k) = (comm.device(), 1.0 / (din as f32).sqrt());
        let w = random(dev, &[dout, din], seed, k)?;
        let b = random(dev, &[dout], seed ^ 0xB1A5, k)?;
        Ok(FsdpBlock { shards: ShardedParams::new(comm.clone(), vec![("w".into(), w), ("b".into(), b)])? })
    }
}

#[graphed(warmup = 2)]
impl FsdpBlock {
    pub fn forward(&self, cx: &mut Cx, x: &Tensor) -> Result<Tensor> {
        // Captured: every replay gathers the shards into the full buffers first.
        self.shards.gather()?;
        let (w, b) = (self.shards.full(0)?, self.shards.full(1)?);
        let h = ops::linear(x, &w.value, Some(&b.value))?;
        cx.save(x);
        cx.save(&h);
        ops::gelu(&h, Gelu::Erf)
    }

    pub fn backward(&mut self, cx: &mut Cx, dy: &Tensor) -> Result<Option<Tensor>> {
        // Resharded after forward: gather again (captured), as FSDP does.
        self.shards.gather()?;
        let (x, h) = (cx.saved(0)?, cx.saved(1)?);
        let (w, b) = (self.shards.full(0)?, self.shards.full(1)?);
        let dh = ops::gelu_backward(dy, &h, Gelu::Erf)?;
        let dx = ops::linear_backward(&dh, &x, &w.value, &w.grad, Some(&b.grad), cx.needs_input_grad(0))?;
        // Captured: every replay reduce-scatters the full grads into the shard grads.
        self.shards.reduce_grads()?;
        Ok(dx)
    }

    /// Outside the capture: the full buffers exist from here...
    #[capture_time_hook(pre_forward)]
    fn unshard(&mut self) -> Result<()> {
        self.shards.materialise()
    }

    /// ...to here, then go back to the graphs' pool for later layers' captures to reuse.
    #[capture_time_hook(forward)]
    fn reshard_after_forward(&mut self) -> Result<()> {
        self.shards.release()
    }

    /// The same for the backward.
    #[capture_time_hook(pre_backward)]
    fn unshard_for_backward(&mut self) -> Result<()> {
        self.shards.materialise()
    }

    #[capture_time_hook(backward)]
    fn reshard(&mut self) -> Result<()> {
        self.shards.release()
    }
}
