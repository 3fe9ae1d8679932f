//! A KV cache as module state under the DSL: a `#[graphed]` decode step whose forward appends
//! the new token's key and value to caches it owns and attends over them, bucketed by batch
//! (`buckets(axis = 0, ...)`), its impl without a `backward` (an inference module: forward
//! graphs only, though its weights need grads), its warm-up undone by capture-time hooks that
//! put the cache lengths back. Replayed token by token it gives the
//! eager step's outputs and caches bit for bit at every batch size; a call reads and writes the
//! first rows of the caches, as many as its bucket has (a batch padded to its bucket appends the
//! padding's zeros to the padding rows: a module whose state must not see them reads the real
//! size, `Cx::bucket_length`).

mod common;

use common::{on_each_backend, random};
use graphed::{capture_time_hook, graphed, ops, Cx, Device, Error, Param, Result, Tensor};

const D: usize = 8;
const MAX_BATCH: usize = 4;
const MAX_LEN: usize = 6;

/// One attention head's decoding step over its own KV caches. Its weights need grads (they
/// could be a model's being trained), but the impl has no `backward`: an inference module.
struct Step {
    wq: Param,
    wk: Param,
    wv: Param,
    k_cache: Tensor,
    v_cache: Tensor,
    lengths: Tensor,
    /// The lengths before a warm-up iteration, put back after it.
    saved: Vec<i32>,
}

impl Step {
    fn new(dev: &Device) -> Result<Step> {
        let cache = || Tensor::zeros(dev, &[MAX_BATCH, 1, MAX_LEN, D]);
        Ok(Step {
            wq: Param::new(random(dev, &[D, D], 1)?)?,
            wk: Param::new(random(dev, &[D, D], 2)?)?,
            wv: Param::new(random(dev, &[D, D], 3)?)?,
            k_cache: cache()?,
            v_cache: cache()?,
            lengths: Tensor::from_i32(dev, &[0; MAX_BATCH], &[MAX_BATCH])?,
            saved: Vec::new(),
        })
    }

    /// The step on `x` (`[batch, D]`) over the first `batch` sequences' caches.
    fn run(&self, x: &Tensor) -> Result<Tensor> {
        let b = x.dims()[0];
        let kc = self.k_cache.prefix_view(&[b, 1, MAX_LEN, D])?;
        let vc = self.v_cache.prefix_view(&[b, 1, MAX_LEN, D])?;
        let lengths = self.lengths.prefix_view(&[b])?;
        let proj = |w: &Param| -> Result<Tensor> { ops::linear(x, &w.value, None)?.reshape(&[b, 1, D]) };
        let (q, k, v) = (proj(&self.wq)?, proj(&self.wk)?, proj(&self.wv)?);
        ops::kv_cache_append(&kc, &vc, &lengths, &k, &v)?;
        ops::decode_attention(&q, &kc, &vc, &lengths)?.reshape(&[b, D])
    }
}

#[graphed(warmup = 2, buckets(axis = 0, sizes = [1, 2, 4]))]
impl Step {
    fn forward(&self, _cx: &mut Cx, x: &Tensor) -> Result<Tensor> {
        self.run(x)
    }

    #[capture_time_hook(pre_forward)]
    fn remember_lengths(&mut self) -> Result<()> {
        self.saved = self.lengths.to_i32_vec()?;
        Ok(())
    }

    #[capture_time_hook(forward)]
    fn restore_lengths(&mut self) -> Result<()> {
        self.lengths.copy_from_i32(&self.saved)
    }
}

#[test]
fn a_kv_cache_held_by_a_graphed_module_decodes_like_the_eager_step_in_every_bucket() {
    on_each_backend(|dev| {
        let eager = Step::new(dev)?;
        let mut g = Step::new(dev)?.make_graphed(&random(dev, &[MAX_BATCH, D], 9)?)?;
        assert_eq!(g.module().lengths.to_i32_vec()?, vec![0; MAX_BATCH], "warm-up undone");
        // Forward graphs only, one a bucket, though the weights need grads; the untyped
        // backward is a typed error (the typed wrapper has no `backward` at all).
        assert!(!g.inner().has_backward());
        assert_eq!(g.inner().bucket_reports().len(), 3, "three buckets");
        assert_eq!(g.inner().graphs().len(), 1, "the active bucket's forward graph alone");
        let refused = g.inner_mut().backward(0, &[Some(Tensor::zeros(dev, &[MAX_BATCH, D])?)]);
        assert!(matches!(refused, Err(Error::ForwardOnly { .. })), "{refused:?}");
        assert!(g.module().wq.grad.to_vec()?.iter().all(|&x| x == 0.0), "no grad was computed");
        for batch in [3, 1, 4, 2] {
            for c in [&eager, g.module()] {
                c.lengths.copy_from_i32(&[0; MAX_BATCH])?;
            }
            for t in 0..MAX_LEN {
                let x = random(dev, &[batch, D], 100 + t as u64)?;
                let want = eager.run(&x)?.to_vec()?;
                let got = g.forward(&x)?.to_vec()?;
                assert_eq!(got, want, "batch {batch}, token {t}");
            }
            // The call ran its bucket's graph: the bucket's rows were appended to, the padding
            // rows (zeros) too; the rows past the bucket were not.
            let bucket = [1, 2, 4].into_iter().find(|&s| s >= batch).unwrap_or(MAX_BATCH);
            let mut lengths = vec![MAX_LEN as i32; bucket];
            lengths.resize(MAX_BATCH, 0);
            assert_eq!(g.module().lengths.to_i32_vec()?, lengths, "batch {batch}: its bucket's rows appended");
            let rows = batch * MAX_LEN * D;
            for (name, got, want) in
                [("key", &g.module().k_cache, &eager.k_cache), ("value", &g.module().v_cache, &eager.v_cache)]
            {
                assert_eq!(got.to_vec()?[..rows], want.to_vec()?[..rows], "batch {batch}: the {name} cache");
            }
        }
        Ok(())
    });
}

/// Two such steps chained (each layer its own caches): a stack of inference modules declared
/// as one struct, as a decoder's layers are.
#[graphed(warmup = 2, chained, buckets(axis = 0, sizes = [2, 4]))]
struct Layers {
    layers: Vec<Step>,
}

#[test]
fn a_chained_stack_of_inference_layers_decodes_like_its_eager_layers() {
    on_each_backend(|dev| {
        let eager = [Step::new(dev)?, Step::new(dev)?];
        let layers = Layers { layers: vec![Step::new(dev)?, Step::new(dev)?] };
        let mut g = layers.make_graphed(LayersInputs { x: random(dev, &[MAX_BATCH, D], 9)? }, ())?;
        assert!(!g.inner().has_backward());
        assert_eq!(g.inner().chunks(), 2);
        for t in 0..MAX_LEN {
            let x = random(dev, &[2, D], 200 + t as u64)?;
            let want = eager[1].run(&eager[0].run(&x)?)?.to_vec()?;
            let got = g.forward(LayersInputs { x }, ())?.output_0.to_vec()?;
            assert_eq!(got, want, "token {t}");
        }
        for layer in 0..2 {
            let step = g.inner().module::<Step>(layer).expect("a layer");
            assert_eq!(step.lengths.to_i32_vec()?, [MAX_LEN as i32, MAX_LEN as i32, 0, 0], "layer {layer}");
        }
        Ok(())
    });
}

/// The same stack fused: one launch a token for both layers (the forward-only schedule's one
/// step), equal to the eager layers.
#[test]
fn a_fused_inference_stack_decodes_a_token_a_launch() {
    on_each_backend(|dev| {
        let eager = [Step::new(dev)?, Step::new(dev)?];
        let layers = Layers { layers: vec![Step::new(dev)?, Step::new(dev)?] };
        let mut g = layers.make_graphed(LayersInputs { x: random(dev, &[MAX_BATCH, D], 9)? }, ())?;
        g.fuse()?;
        for t in 0..MAX_LEN {
            let x = random(dev, &[4, D], 200 + t as u64)?;
            let want = eager[1].run(&eager[0].run(&x)?)?.to_vec()?;
            let got = g.step(LayersInputs { x }, (), ())?.output_0.to_vec()?;
            assert_eq!(got, want, "token {t}");
        }
        Ok(())
    });
}
