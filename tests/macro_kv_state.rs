//! Serving under the DSL: `#[graphed]` impls without a `backward` (inference modules: forward
//! graphs only, though their weights need grads), bucketed by batch (`buckets(axis = 0, ...)`),
//! each checked bit for bit against the same module run eagerly.
//!
//! - A decoding step over KV caches it owns (module state), its warm-up undone by capture-time
//!   hooks that put the cache lengths back. A call reads and writes the first rows of the
//!   caches, as many as its bucket has: a batch padded to its bucket appends the padding's zeros
//!   to the padding rows (a module whose state must not see them reads the real size,
//!   `Cx::bucket_length`).
//! - A chained stack of such steps (a decoder's layers), per token and fused into one launch.
//! - A whole request: the first tokens recorded, then a decoding step under a WHILE node until
//!   every sequence stopped (`Condition::run_while` inside the forward), one launch of its
//!   bucket's graph.

mod common;

use common::{on_each_backend, random};
use graphed::ops::{Generation, Stop};
use graphed::{capture_time_hook, graphed, ops, Condition, Cx, Device, Error, NodeKind, Param, Result, Tensor};

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

/// A whole request as one inference module: the first token of each sequence recorded, then
/// a decoding step under a WHILE node until every sequence stopped (`Condition::run_while`
/// inside the forward), bucketed by batch. A toy model: token `t` is followed by
/// `(3t + 1) mod VOCAB` (the argmax of row `t` of a table of logits). Each request is one
/// launch of its bucket's graph; the caller starts the bookkeeping (limits, the end token)
/// before it, and gets the recorded tokens back.
struct Request {
    table: Tensor,
    books: Generation,
    positions: Tensor,
}

const VOCAB: usize = 16;
const NEW: usize = 10;
const END: u32 = 15;

impl Request {
    fn new(dev: &Device) -> Result<Request> {
        let mut logits = vec![0.0f32; VOCAB * VOCAB];
        for t in 0..VOCAB {
            logits[t * VOCAB + (3 * t + 1) % VOCAB] = 1.0;
        }
        Ok(Request {
            table: Tensor::from_slice(dev, &logits, &[VOCAB, VOCAB])?,
            books: Generation::new(dev, MAX_BATCH, NEW)?,
            positions: Tensor::from_i32(dev, &[0; MAX_BATCH], &[MAX_BATCH])?,
        })
    }

    /// The request on `first` (`I32 [batch]`) over the first `batch` sequences' books; returns
    /// a copy of their recorded tokens (`I32 [batch, NEW]`).
    fn run(&self, first: &Tensor) -> Result<Tensor> {
        let b = first.dims()[0];
        let books = self.books.prefix(b)?;
        let positions = self.positions.prefix_view(&[b])?;
        ops::generation_step(&books, first, &positions)?;
        Condition::nonzero(books.active())?.run_while(|| {
            let logits = ops::embedding(books.next_ids(), &self.table)?;
            ops::generation_step(&books, &ops::argmax(&logits)?, &positions)
        })?;
        let tokens = books.recorded().clone();
        let out = Tensor::empty_like(&tokens)?;
        out.copy_(&tokens)?;
        Ok(out)
    }

    /// Starts a request of `limits.len()` sequences (the rows past them start stopped).
    fn start(&self, limits: &[usize]) -> Result<()> {
        self.books.start(limits, Stop { end: Some(END), pad: 0 })
    }
}

#[graphed(warmup = 1, buckets(axis = 0, sizes = [1, 2, 4]))]
impl Request {
    fn forward(&self, _cx: &mut Cx, first: &Tensor) -> Result<Tensor> {
        self.run(first)
    }

    /// Warm-up runs whole requests eagerly: start one at the largest batch.
    #[capture_time_hook(pre_forward)]
    fn begin(&mut self) -> Result<()> {
        self.start(&[NEW; MAX_BATCH])
    }
}

#[test]
fn a_request_is_one_launch_of_its_batch_buckets_graph() {
    on_each_backend(|dev| {
        let eager = Request::new(dev)?;
        let mut g = Request::new(dev)?.make_graphed(&Tensor::from_i32(dev, &[1; MAX_BATCH], &[MAX_BATCH])?)?;
        assert!(!g.inner().has_backward());
        let requests: [(&[i32], &[usize]); 4] =
            [(&[2, 5, 1], &[10, 10, 3]), (&[7], &[10]), (&[4, 15, 0, 9], &[10, 2, 10, 5]), (&[3, 3], &[1, 10])];
        for (first, limits) in requests {
            let first = Tensor::from_i32(dev, first, &[first.len()])?;
            eager.start(limits)?;
            let want = eager.run(&first)?.to_i32_vec()?;
            g.module().start(limits)?;
            let got = g.forward(&first)?;
            assert_eq!(got.dims(), [limits.len(), NEW], "trimmed to the request's batch");
            assert_eq!(got.to_i32_vec()?, want, "request of {}", limits.len());
            assert_eq!(g.module().books.steps()?, eager.books.steps()?);
            // The bucket's one graph holds the loop: a WHILE node on CUDA, the host backend's
            // loop op on the host.
            let (_, graph) = g.inner().graphs()[0];
            let loops = graph
                .nodes()?
                .into_iter()
                .filter(|n| n.kind == NodeKind::Conditional || n.kernel.as_deref() == Some("while_loop"));
            assert_eq!(loops.count(), 1, "one loop in the request's graph");
        }
        Ok(())
    });
}
