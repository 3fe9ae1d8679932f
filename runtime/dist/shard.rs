//! `ShardedParams`: FSDP-style parameters. Each rank keeps one shard of every parameter (and
//! its grad, so the optimizer state is sharded too); the full weights exist only between a
//! module's `pre_forward` and `backward` capture-time hooks.

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex, MutexGuard};

use super::{Communicator, ReduceOp};
use crate::{ops, DistError, Error, Param, Result, ShapeProblem, Tensor};

struct Entry {
    name: String,
    dims: Vec<usize>,
    shard: Param,
    /// The full weight and grad while materialised.
    full: Option<Param>,
}

/// One rank's shards of a module's parameters, and the full-weight buffers around them.
///
/// The module keeps a `ShardedParams` and reads its weights through [`ShardedParams::full`].
/// Its `pre_forward` and `pre_backward` capture-time hooks call
/// [`ShardedParams::materialise`] (allocate the full buffers: outside any capture, from the
/// graphs' pool during `make_graphed`), its `forward` and `backward` hooks call
/// [`ShardedParams::release`]. Its forward calls [`ShardedParams::gather`] (all-gather the
/// shards into the full buffers); its backward gathers again, computes, and calls
/// [`ShardedParams::reduce_grads`] (reduce-scatter the full grads into the shard grads).
/// Gather and reduce are stream ops, captured and run on every replay; materialise and release
/// run only in warm-up and at capture. Released buffers go back to the graphs' pool, where
/// later captures (the next layer's) reuse them (safe because replay follows capture order),
/// so only the layer running holds full weights, as with FSDP's reshard-after-forward.
///
/// An optimizer runs on [`ShardedParams::shards`]: elementwise optimizers (SGD, AdamW) give
/// bitwise what data parallelism gives.
///
/// ```
/// use graphed::dist::{self, ShardedParams};
/// use graphed::Tensor;
/// let out = dist::run_emulated(2, |comm| {
///     let full = Tensor::from_slice(comm.device(), &[1.0, 2.0, 3.0, 4.0], &[2, 2])?;
///     let sp = ShardedParams::new(comm.clone(), vec![("w".into(), full)])?;
///     assert_eq!(sp.shards()[0].value.dims(), &[2]); // half of the weight per rank
///     sp.materialise()?;
///     sp.gather()?;
///     let w = sp.full(0)?.value.to_vec()?;
///     sp.release()?;
///     Ok(w)
/// })?;
/// assert_eq!(out[1], vec![1.0, 2.0, 3.0, 4.0]);
/// # Ok::<(), graphed::Error>(())
/// ```
#[derive(Clone)]
pub struct ShardedParams {
    comm: Communicator,
    entries: Arc<Mutex<Vec<Entry>>>,
}

impl std::fmt::Debug for ShardedParams {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<String> = self.lock().iter().map(|e| e.name.clone()).collect();
        write!(f, "ShardedParams({names:?}, rank {} of {})", self.comm.rank(), self.comm.world_size())
    }
}

impl ShardedParams {
    /// Keeps this rank's shard of each full parameter value (every rank passes the same
    /// values; each keeps the contiguous part `rank` of `world_size`). Each parameter's number
    /// of elements must divide by the world size. Every rank must pass the same names and
    /// shapes (checked by hash, a typed error on every rank otherwise).
    pub fn new(comm: Communicator, full_values: Vec<(String, Tensor)>) -> Result<ShardedParams> {
        let world = comm.world_size();
        for (name, t) in &full_values {
            if t.numel() % world != 0 {
                let problem = ShapeProblem::Shard { param: name.clone(), elements: t.numel(), ranks: world };
                return Err(Error::shape("ShardedParams::new", problem));
            }
            if t.device() != comm.device() {
                let (param, device, communicator) = (Some(name.clone()), t.device().name(), comm.device().name());
                return Err(DistError::Device { op: "ShardedParams::new", param, device, communicator }.into());
            }
        }
        let mut h = DefaultHasher::new();
        for (name, t) in &full_values {
            (name, t.dims()).hash(&mut h);
        }
        comm.check_same("sharded parameter layouts", h.finish())?;
        let dev = comm.device().clone();
        let mut entries = Vec::with_capacity(full_values.len());
        for (name, t) in full_values {
            let n = t.numel() / world;
            let values = t.to_vec()?;
            let mine = &values[comm.rank() * n..(comm.rank() + 1) * n];
            let shard =
                dev.with_pool(&dev.default_pool(), || Tensor::from_slice(&dev, mine, &[n]).and_then(Param::new))?;
            entries.push(Entry { name, dims: t.dims().to_vec(), shard, full: None });
        }
        Ok(ShardedParams { comm, entries: Arc::new(Mutex::new(entries)) })
    }

    fn lock(&self) -> MutexGuard<'_, Vec<Entry>> {
        self.entries.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// This rank's shards (what the optimizer updates), in order.
    pub fn shards(&self) -> Vec<Param> {
        self.lock().iter().map(|e| e.shard.clone()).collect()
    }

    /// Bytes of this rank's shards (values and grads).
    pub fn shard_bytes(&self) -> usize {
        self.lock().iter().map(|e| 2 * e.shard.value.numel() * 4).sum()
    }

    /// Bytes the full parameters (values and grads) take when materialised.
    pub fn full_bytes(&self) -> usize {
        self.lock().iter().map(|e| 2 * e.dims.iter().product::<usize>() * 4).sum()
    }

    /// The communicator.
    pub fn communicator(&self) -> &Communicator {
        &self.comm
    }

    /// The full parameter `index` (value and grad buffers), while materialised.
    pub fn full(&self, index: usize) -> Result<Param> {
        let entries = self.lock();
        let e = entries.get(index).ok_or(DistError::ParamOutOfRange { index, params: entries.len() })?;
        e.full
            .clone()
            .ok_or_else(|| DistError::NotMaterialised { op: "ShardedParams::full", param: e.name.clone() }.into())
    }

    /// Allocates the full value and grad buffers (a no-op for those already there). Outside a
    /// capture only: call it from a `pre_forward` capture-time hook.
    pub fn materialise(&self) -> Result<()> {
        self.comm.device().backend().forbid_during_capture("ShardedParams::materialise")?;
        let dev = self.comm.device().clone();
        let mut entries = self.lock();
        let missing: Vec<usize> = (0..entries.len()).filter(|i| entries[*i].full.is_none()).collect();
        let mut made = Vec::with_capacity(missing.len());
        for &i in &missing {
            let value = Tensor::empty(&dev, &entries[i].dims)?.with_requires_grad(true);
            let grad = Tensor::empty(&dev, &entries[i].dims)?;
            made.push(Param { value, grad });
        }
        for (i, p) in missing.into_iter().zip(made) {
            entries[i].full = Some(p);
        }
        Ok(())
    }

    /// Drops the full buffers (their memory goes back to the pool it came from). Outside a
    /// capture only: call it from a `backward` capture-time hook.
    pub fn release(&self) -> Result<()> {
        self.comm.device().backend().forbid_during_capture("ShardedParams::release")?;
        self.lock().iter_mut().for_each(|e| e.full = None);
        Ok(())
    }

    fn all_full(&self, op: &'static str) -> Result<Vec<(Param, Param)>> {
        let entries = self.lock();
        entries
            .iter()
            .map(|e| match &e.full {
                Some(f) => Ok((e.shard.clone(), f.clone())),
                None => Err(DistError::NotMaterialised { op, param: e.name.clone() }.into()),
            })
            .collect()
    }

    /// All-gathers every shard into its full value buffer and zeroes the full grads, on the
    /// stream (captured when capturing). Call it at the start of forward.
    pub fn gather(&self) -> Result<()> {
        let all = self.all_full("ShardedParams::gather")?;
        for (shard, full) in &all {
            self.comm.all_gather(&shard.value, &full.value.reshape(&[full.value.numel()])?)?;
            ops::fill_(&full.grad, 0.0)?;
        }
        Ok(())
    }

    /// Reduce-scatters (sums) every full grad over the ranks and adds this rank's part to its
    /// shard grad, on the stream (captured when capturing). Call it at the end of backward.
    pub fn reduce_grads(&self) -> Result<()> {
        let all = self.all_full("ShardedParams::reduce_grads")?;
        for (shard, full) in &all {
            let part = Tensor::empty_like(&shard.grad)?;
            self.comm.reduce_scatter(&full.grad.reshape(&[full.grad.numel()])?, &part, ReduceOp::Sum)?;
            ops::axpy_(&shard.grad, 1.0, &part)?;
        }
        Ok(())
    }
}
