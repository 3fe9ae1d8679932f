//! `ops::DecoderStep`, the one-kernel decoding step: step after step against its unfused
//! reference (`run_unfused`: bit for bit on the host backend, where `run` is that reference;
//! within a stated tolerance on CUDA, where `run` is one persistent kernel whose GEMMs sum in
//! another order), at batches of one, several and more than one 16-row tile, head dims 64 and
//! 128, a hidden width that is not a multiple of 16; the lengths and the caches it writes; the
//! kernel bitwise reproducible and graphed == eager; batches above the kernel's limit running
//! the unfused ops; and the errors: bad shapes before anything runs, a full cache and a bad
//! token id reported from the device as the unfused ops report them.

mod common;
mod ops_support;

use common::{on_each_backend, random_vec};
use graphed::ops::{DecoderLayer, DecoderStep, DecoderWeights, DECODER_STEP_MAX_FUSED_BATCH};
use graphed::{CaptureMode, DType, Device, Error, Graph, Result, Tensor};
use ops_support::*;

/// A small decoder's sizes.
#[derive(Clone, Copy, Debug)]
struct Sizes {
    layers: usize,
    d: usize,
    heads: usize,
    hidden: usize,
    vocab: usize,
    ctx: usize,
    cache_batch: usize,
    max_len: usize,
}

/// Weights (bf16, fan-in scaled uniform values, norms' gains around 1) and one cache set.
struct Model {
    tok: Tensor,
    pos: Tensor,
    head_norm: Tensor,
    head: Tensor,
    layers: Vec<[Tensor; 6]>,
    caches: Vec<[Tensor; 3]>,
    s: Sizes,
}

fn weight(dev: &Device, dims: &[usize], scale: f32, seed: u64) -> Result<Tensor> {
    let v: Vec<f32> = random_vec(dims.iter().product(), seed).into_iter().map(|x| (2.0 * x - 1.0) * scale).collect();
    Tensor::from_slice_as(dev, &v, dims, DType::BF16)
}

fn gain(dev: &Device, d: usize, seed: u64) -> Result<Tensor> {
    let v: Vec<f32> = random_vec(d, seed).into_iter().map(|x| 0.75 + 0.5 * x).collect();
    Tensor::from_slice_as(dev, &v, &[d], DType::BF16)
}

impl Model {
    fn new(dev: &Device, s: Sizes, seed: u64) -> Result<Model> {
        let (d, h) = (s.d, s.hidden);
        let fan = |n: usize| 1.0 / (n as f32).sqrt();
        let layers = (0..s.layers as u64)
            .map(|i| {
                let k = seed + 100 * (i + 1);
                Ok([
                    gain(dev, d, k)?,
                    weight(dev, &[3 * d, d], fan(d), k + 1)?,
                    weight(dev, &[d, d], fan(d), k + 2)?,
                    gain(dev, d, k + 3)?,
                    weight(dev, &[2 * h, d], fan(d), k + 4)?,
                    weight(dev, &[d, h], fan(h), k + 5)?,
                ])
            })
            .collect::<Result<_>>()?;
        let m = Model {
            tok: weight(dev, &[s.vocab, d], 1.0, seed)?,
            pos: weight(dev, &[s.ctx, d], 0.5, seed + 1)?,
            head_norm: gain(dev, d, seed + 2)?,
            head: weight(dev, &[s.vocab, d], fan(d), seed + 3)?,
            layers,
            caches: Vec::new(),
            s,
        };
        Ok(Model { caches: m.fresh_caches(dev, &vec![0; s.cache_batch])?, ..m })
    }

    /// Zeroed caches with `lengths`.
    fn fresh_caches(&self, dev: &Device, lengths: &[i32]) -> Result<Vec<[Tensor; 3]>> {
        let s = self.s;
        let dims = [s.cache_batch, s.heads, s.max_len, s.d / s.heads];
        (0..s.layers)
            .map(|_| {
                Ok([
                    Tensor::zeros_as(dev, &dims, DType::BF16)?,
                    Tensor::zeros_as(dev, &dims, DType::BF16)?,
                    Tensor::from_i32(dev, lengths, &[s.cache_batch])?,
                ])
            })
            .collect()
    }

    /// The weights with `caches`, as `DecoderStep::new` takes them.
    fn weights<'a>(&'a self, caches: &'a [[Tensor; 3]], heads: usize) -> DecoderWeights<'a> {
        let layers = self
            .layers
            .iter()
            .zip(caches)
            .map(|([norm1, qkv, wo, norm2, gate_up, down], [k_cache, v_cache, lengths])| DecoderLayer {
                norm1,
                qkv,
                wo,
                norm2,
                gate_up,
                down,
                k_cache,
                v_cache,
                lengths,
            })
            .collect();
        DecoderWeights {
            tok: &self.tok,
            pos: &self.pos,
            layers,
            head_norm: &self.head_norm,
            head: &self.head,
            heads,
            eps: 1e-5,
        }
    }

    fn step(&self, caches: &[[Tensor; 3]]) -> Result<DecoderStep> {
        // The kernel at every batch it takes (the default limit is lower).
        let mut step = DecoderStep::new(&self.weights(caches, self.s.heads))?;
        step.set_fused_batch_limit(DECODER_STEP_MAX_FUSED_BATCH)?;
        Ok(step)
    }
}

/// Whether the one kernel runs here; on CUDA without it (a GPU older than sm_80) the test
/// says it is skipped, or fails with `GRAPHED_REQUIRE_CUDA=1`. The cluster forms of the kernel
/// (`GRAPHED_DECODER_CLUSTER`, a measurement setting) need more shared memory a block and do
/// not fit every shape: there the test says it is skipped whatever the GPU.
fn kernel_runs(dev: &Device, step: &DecoderStep) -> bool {
    if dev.is_host() || step.is_fused() {
        return true;
    }
    if std::env::var_os("GRAPHED_DECODER_CLUSTER").is_some() {
        println!("note: skipped on {}: the cluster form of the step does not fit this shape", dev.name());
        return false;
    }
    assert!(
        std::env::var("GRAPHED_REQUIRE_CUDA").map_or(true, |v| v != "1"),
        "GRAPHED_REQUIRE_CUDA=1 but the one-kernel decoding step does not run on this GPU"
    );
    println!("note: skipped on {}: the one-kernel decoding step needs sm_80", dev.name());
    false
}

/// The largest difference between two logit sets over the largest reference magnitude.
fn rel_max(got: &[f32], want: &[f32]) -> f64 {
    let scale = want.iter().fold(0f64, |m, &x| m.max((x as f64).abs())).max(1e-3);
    got.iter().zip(want).fold(0f64, |m, (&a, &b)| m.max((a as f64 - b as f64).abs())) / scale
}

/// CUDA's kernel against the unfused ops: bf16 roundings of intermediates that can differ by
/// an ulp (2^-8 relative) where the sums run in another order, through a few layers.
const TOL: f64 = 3e-2;

/// Ids and positions of `batch` sequences at step `t` (positions are the lengths so far).
fn inputs(dev: &Device, s: Sizes, batch: usize, t: usize, start: &[i32]) -> Result<[Tensor; 2]> {
    let ids: Vec<f32> = (0..batch).map(|b| ((7 * b + 13 * t + 3) % s.vocab) as f32).collect();
    let pos: Vec<f32> = (0..batch).map(|b| (start[b] as usize + t) as f32).collect();
    Ok([Tensor::from_slice(dev, &ids, &[batch])?, Tensor::from_slice(dev, &pos, &[batch])?])
}

fn sizes(d: usize, heads: usize, hidden: usize, cache_batch: usize) -> Sizes {
    Sizes { layers: 3, d, heads, hidden, vocab: 64, ctx: 32, cache_batch, max_len: 24 }
}

/// `run` against `run_unfused` on two copies of the same caches, step after step: logits
/// within TOL on CUDA (bitwise on the host), the lengths equal, the caches close.
fn against_unfused(dev: &Device, s: Sizes, batch: usize, steps: usize, start: &[i32]) -> Result<()> {
    let m = Model::new(dev, s, 11 + s.d as u64)?;
    let mut lengths = start.to_vec();
    lengths.resize(s.cache_batch, 0);
    let ours = m.fresh_caches(dev, &lengths)?;
    let theirs = m.fresh_caches(dev, &lengths)?;
    let (fused, unfused) = (m.step(&ours)?, m.step(&theirs)?);
    if !kernel_runs(dev, &fused) {
        return Ok(());
    }
    let mut worst = 0f64;
    for t in 0..steps {
        let [ids, pos] = inputs(dev, s, batch, t, &lengths)?;
        let got = fused.run(&ids, &pos)?;
        let want = unfused.run_unfused(&ids, &pos)?;
        assert_eq!(got.dims(), &[batch, s.vocab][..]);
        let (g, w) = (got.to_vec()?, want.to_vec()?);
        if dev.is_host() {
            bitwise_eq(&format!("step {t}: logits"), &g, &w)?;
        } else {
            let e = rel_max(&g, &w);
            worst = worst.max(e);
            assert!(
                e < TOL,
                "batch {batch}, d {}, step {t}: logits differ by {e:e} of their scale (tolerance {TOL:e})",
                s.d
            );
        }
        for (l, (a, b)) in ours.iter().zip(&theirs).enumerate() {
            assert_eq!(a[2].to_i32_vec()?, b[2].to_i32_vec()?, "step {t}, layer {l}: lengths");
        }
    }
    for (l, (a, b)) in ours.iter().zip(&theirs).enumerate() {
        for (i, what) in [(0, "k"), (1, "v")] {
            let (x, y) = (a[i].to_vec()?, b[i].to_vec()?);
            if dev.is_host() {
                bitwise_eq(&format!("layer {l}: {what} cache"), &x, &y)?;
            } else {
                let e = rel_max(&x, &y);
                assert!(e < TOL, "layer {l}: {what} cache differs by {e:e}");
            }
        }
    }
    let lens = ours[0][2].to_i32_vec()?;
    for b in 0..s.cache_batch {
        let want = lengths[b] + if b < batch { steps as i32 } else { 0 };
        assert_eq!(lens[b], want, "sequence {b}'s length");
    }
    if !dev.is_host() {
        println!("batch {batch}, d {}, hidden {}: worst logit difference {worst:e} of their scale", s.d, s.hidden);
    }
    Ok(())
}

#[test]
fn the_step_matches_the_unfused_ops_at_one_sequence() {
    on_each_backend(|dev| against_unfused(dev, sizes(128, 2, 176, 1), 1, 6, &[0]));
}

/// Several sequences at ragged lengths; a hidden width of 8 mod 16 (the GPT's 1368 is too).
#[test]
fn the_step_matches_the_unfused_ops_at_ragged_lengths() {
    on_each_backend(|dev| against_unfused(dev, sizes(128, 2, 168, 5), 3, 5, &[0, 7, 2]));
}

/// More than one 16-row tile, and head dim 128.
#[test]
fn the_step_matches_the_unfused_ops_across_row_tiles_and_head_dim_128() {
    on_each_backend(|dev| {
        against_unfused(dev, sizes(256, 2, 344, 40), 37, 3, &(0..37).map(|b: i32| b % 9).collect::<Vec<_>>())
    });
}

/// Attention in teams of fewer warps than a block (more (sequence, head) tasks than blocks):
/// on a 132-multiprocessor GPU, 8 heads at batch 20 (a bucket of 32: teams of 4 warps) and 33
/// (64: teams of 2), 16 heads at 33 (teams of 1), and head dim 128 (8 heads of 128 at 33).
#[test]
fn the_step_matches_the_unfused_ops_with_attention_in_teams_of_warps() {
    on_each_backend(|dev| {
        let lens = |n: i32| (0..n).map(|b| (b * 5) % 11).collect::<Vec<_>>();
        against_unfused(dev, sizes(512, 8, 344, 33), 20, 2, &lens(20))?;
        against_unfused(dev, sizes(512, 8, 344, 33), 33, 2, &lens(33))?;
        against_unfused(dev, sizes(1024, 16, 520, 33), 33, 2, &lens(33))?;
        against_unfused(dev, sizes(1024, 8, 520, 33), 33, 2, &lens(33))
    });
}

/// A sequence's logits and cache rows do not depend on the other sequences of its batch, bit for
/// bit, among the batches of one bucket (the next power of two, which the kernel's summation
/// order may depend on): 33 and 64 sequences (on CUDA, rows split into different groups of the
/// GEMM stages and a lone 16-row tile at 33; attention in teams of 2 at both), 20 and 32. The
/// hidden size, 600 (75 column tiles of the gate/up pair), gives 9 blocks of each of the 4
/// groups 3 tiles at 64, which each warp then sums alone over all of K (`FD_WPASS_MIN` 3), where
/// at 33 (3 groups) every block has at most 2 and splits K over its warps: this also checks that
/// the two ways sum alike. (`GRAPHED_DECODER_WPASS=5` does the same for the q/k/v tiles, 4 a
/// block at 33 and 6 at 64.)
#[test]
fn a_sequence_sums_alike_in_every_batch_of_its_bucket() {
    on_each_backend(|dev| {
        let s = sizes(512, 8, 600, 64);
        let m = Model::new(dev, s, 29)?;
        let lens: Vec<i32> = (0..64).map(|b| (b * 5) % 11).collect();
        for (few, many) in [(33, 64), (20, 32)] {
            let run = |batch: usize| -> Result<Option<(Vec<f32>, Vec<f32>)>> {
                let caches = m.fresh_caches(dev, &lens)?;
                let step = m.step(&caches)?;
                if !kernel_runs(dev, &step) {
                    return Ok(None);
                }
                let mut logits = Vec::new();
                for t in 0..2 {
                    let [ids, pos] = inputs(dev, s, batch, t, &lens)?;
                    logits.extend(step.run(&ids, &pos)?.to_vec()?.into_iter().take(few * s.vocab));
                }
                let per_seq = s.heads * s.max_len * (s.d / s.heads);
                let cache = caches[s.layers - 1][1].to_vec()?.into_iter().take(few * per_seq).collect();
                Ok(Some((logits, cache)))
            };
            let (Some((a, ca)), Some((b, cb))) = (run(few)?, run(many)?) else {
                return Ok(());
            };
            bitwise_eq(&format!("logits of the first {few} sequences, batch {few} against {many}"), &a, &b)?;
            bitwise_eq(&format!("the last layer's v cache, batch {few} against {many}"), &ca, &cb)?;
        }
        Ok(())
    });
}

/// Attention and the output projection in one stage (batches up to 4) where each head's share
/// of the projection takes several passes of 32 columns: d_model 1024 in 16 heads leaves two
/// blocks of a 132-multiprocessor GPU to each (sequence, head), 512 columns each.
#[test]
fn the_step_matches_the_unfused_ops_with_the_projection_in_several_column_passes() {
    on_each_backend(|dev| against_unfused(dev, sizes(1024, 16, 520, 4), 4, 3, &[0, 5, 1, 9]));
}

/// The most sequences the kernel takes, and one more (the unfused ops then run).
#[test]
fn the_step_takes_up_to_its_batch_limit_and_falls_back_past_it() {
    on_each_backend(|dev| {
        let n = DECODER_STEP_MAX_FUSED_BATCH;
        against_unfused(dev, sizes(128, 2, 176, n + 1), n, 2, &vec![1; n])?;
        let s = sizes(128, 2, 176, n + 1);
        let m = Model::new(dev, s, 5)?;
        let step = m.step(&m.caches)?;
        let [ids, pos] = inputs(dev, s, n + 1, 0, &vec![0; n + 1])?;
        let got = step.run(&ids, &pos)?.to_vec()?;
        let m2 = Model::new(dev, s, 5)?;
        let want = m2.step(&m2.caches)?.run_unfused(&ids, &pos)?.to_vec()?;
        bitwise_eq("past the limit: run is run_unfused", &got, &want)
    });
}

/// The kernel is deterministic (two runs from the same state give the same bits), and a
/// captured step replays bitwise what the eager one gave.
#[test]
fn the_step_is_reproducible_and_graphed_equals_eager() {
    on_each_backend(|dev| {
        let s = sizes(128, 2, 176, 4);
        let m = Model::new(dev, s, 3)?;
        let step = m.step(&m.caches)?;
        if !kernel_runs(dev, &step) {
            return Ok(());
        }
        let [ids, pos] = inputs(dev, s, 4, 0, &[0; 4])?;
        let reset = || -> Result<()> {
            for [k, v, l] in &m.caches {
                k.copy_from_slice(&vec![0.0; k.numel()])?;
                v.copy_from_slice(&vec![0.0; v.numel()])?;
                l.copy_from_i32(&[0; 4])?;
            }
            Ok(())
        };
        let eager = step.run(&ids, &pos)?.to_vec()?;
        let cache = m.caches[2][0].to_vec()?;
        reset()?;
        bitwise_eq("a second eager run", &step.run(&ids, &pos)?.to_vec()?, &eager)?;
        reset()?;
        let mut g = Graph::new(dev);
        let out = g.capture(CaptureMode::Global, || step.run(&ids, &pos))?;
        reset()?;
        g.replay()?;
        bitwise_eq("the replay", &out.to_vec()?, &eager)?;
        bitwise_eq("the replay's cache", &m.caches[2][0].to_vec()?, &cache)?;
        assert_eq!(m.caches[1][2].to_i32_vec()?, vec![1; 4]);
        // The next replay is the next position.
        g.replay()?;
        assert_eq!(m.caches[1][2].to_i32_vec()?, vec![2; 4]);
        Ok(())
    });
}

/// Shapes and dtypes are checked before anything runs.
#[test]
fn bad_weights_and_inputs_are_refused() {
    on_each_backend(|dev| {
        let s = sizes(128, 2, 176, 2);
        let m = Model::new(dev, s, 1)?;
        let weights = |heads: usize| m.weights(&m.caches, heads);
        expect_err("heads that do not divide d_model", DecoderStep::new(&weights(3)), |e| {
            matches!(e, Error::InvalidArgument { .. })
        })?;
        expect_err("heads that disagree with the cache", DecoderStep::new(&weights(4)), is_shape)?;
        let mut w = weights(2);
        w.layers[1].wo = &m.head;
        expect_err("a wrong projection", DecoderStep::new(&w), is_shape)?;
        let mut w = weights(2);
        w.layers.clear();
        expect_err("no layer", DecoderStep::new(&w), |e| matches!(e, Error::InvalidArgument { .. }))?;
        let f32_gain = Tensor::full(dev, &[s.d], 1.0)?;
        let mut w = weights(2);
        w.head_norm = &f32_gain;
        expect_err("mixed dtypes", DecoderStep::new(&w), |e| matches!(e, Error::DTypeMismatch { .. }))?;
        let step = DecoderStep::new(&weights(2))?;
        let [ids, pos] = inputs(dev, s, 2, 0, &[0, 0])?;
        let [ids3, _] = inputs(dev, s, 3, 0, &[0, 0, 0])?;
        expect_err("more sequences than the caches hold", step.run(&ids3, &ids3), |e| {
            matches!(e, Error::Op(graphed::OpError::TooLarge { .. }))
        })?;
        let mut limited = DecoderStep::new(&weights(2))?;
        assert_eq!(limited.fused_batch_limit(), graphed::ops::DECODER_STEP_DEFAULT_FUSED_BATCH);
        let too_large = |e: &Error| matches!(e, Error::Op(graphed::OpError::TooLarge { .. }));
        expect_err("a fused batch limit past the kernel's", limited.set_fused_batch_limit(65), too_large)?;
        assert_eq!(limited.fused_batch_limit(), graphed::ops::DECODER_STEP_DEFAULT_FUSED_BATCH, "unchanged");
        expect_err("ids and positions of different lengths", step.run(&ids, &ids3), is_shape)?;
        let ids_i32 = Tensor::from_i32(dev, &[1, 2], &[2])?;
        expect_err("I32 ids", step.run(&ids_i32, &pos), |e| matches!(e, Error::DType { .. }))?;
        // Nothing ran: the lengths are untouched.
        assert_eq!(m.caches[0][2].to_i32_vec()?, vec![0, 0]);
        Ok(())
    });
}

/// A full cache and a bad token id are reported as the unfused ops report them; the full
/// sequence's length is left unchanged, the other sequence advances.
#[test]
fn a_full_cache_and_a_bad_token_are_reported() {
    on_each_backend(|dev| {
        let s = sizes(128, 2, 176, 2);
        let m = Model::new(dev, s, 2)?;
        let caches = m.fresh_caches(dev, &[s.max_len as i32, 3])?;
        let step = m.step(&caches)?;
        let ids = Tensor::from_slice(dev, &[1.0, 2.0], &[2])?;
        let pos = Tensor::from_slice(dev, &[5.0, 3.0], &[2])?;
        let full = |e: &Error| matches!(e, Error::CacheFull { sequence: 0, .. });
        expect_err("a full cache", step.run(&ids, &pos).and_then(|t| t.to_vec()), full)?;
        // (The host backend stops at the first layer's report; CUDA runs every layer.)
        assert_eq!(caches[0][2].to_i32_vec()?, vec![s.max_len as i32, 4]);
        let bad = Tensor::from_slice(dev, &[1.0, s.vocab as f32], &[2])?;
        let fresh = m.fresh_caches(dev, &[0, 0])?;
        let step = m.step(&fresh)?;
        let token = |e: &Error| matches!(e, Error::TokenOutOfRange { .. });
        expect_err("a bad token id", step.run(&bad, &pos).and_then(|t| t.to_vec()), token)?;
        Ok(())
    });
}
