//! Generation with the GPT of examples/gpt (`decode.rs`, `passes.rs`), tiny configurations, on
//! each backend: the graphed decode (one replay per token, and the WHILE loop) produces the
//! eager decode's tokens; the WHILE loop the per-token replay loop's; the prefill's and the
//! decode steps' logits are the training forward's at the same positions; sequences stop on
//! their end token (the others continue) and on their length; a batch of 3 in bucket 4 is the
//! batch of 3 alone; a request the cache cannot hold is refused before anything runs; a
//! saved checkpoint loads into a fresh model that generates the same tokens; and the fused
//! decode step (stacked q/k/v and gate/up GEMMs, the append inside the attention kernel)
//! produces the unfused step's tokens on every path (on the host with the same logits, bit for
//! bit), with its one-kernel batch limit taken from the options.

mod common;

#[path = "../examples/gpt/corpus.rs"]
mod corpus;
#[path = "../examples/gpt/decode.rs"]
mod decode;
#[path = "../examples/gpt/ends.rs"]
mod ends;
#[path = "../examples/gpt/model.rs"]
mod model;
#[path = "../examples/gpt/passes.rs"]
mod passes;
#[path = "../examples/gpt/pipeline.rs"]
mod pipeline;
#[path = "../examples/gpt/runner.rs"]
mod runner;

use common::{on_each_backend, rel_err};
use decode::{DecodeOptions, Decoder, Path, Request, Weights};
use graphed::ops::{Sampling, Stop};
use graphed::{Cx, DType, Device, Error, Result, Tensor};
use model::{Config, Gpt, Recompute};

/// f32, head dim 8: the host's kind of model (decode attention's run-time head dim).
const TINY: Config = Config {
    layers: 2,
    d_model: 32,
    heads: 4,
    context: 24,
    batch: 4,
    hidden: 48,
    dropout: 0.0,
    dtype: DType::F32,
    fused_attention: true,
    recompute: Recompute::Nothing,
};

/// bf16, head dim 64: the GPU's kind (fused attention in the prefill, decode attention's
/// kernels built for head dim 64).
const TINY_BF16: Config = Config { d_model: 128, heads: 2, hidden: 96, dtype: DType::BF16, ..TINY };

fn options(cfg: &Config) -> DecodeOptions {
    DecodeOptions {
        max_batch: 4,
        max_len: cfg.context,
        prompt_buckets: vec![8, 16],
        sampling: Sampling::greedy(),
        seed: 1,
        graphs: true,
        fused_step: true,
        fused_batch_limit: None,
    }
}

fn weights(gpt: &Gpt) -> Weights {
    let blocks: Vec<&model::Block> = gpt.blocks.iter().collect();
    Weights::of(&gpt.embed, &blocks, &gpt.head)
}

fn decoder(dev: &Device, gpt: &Gpt, cfg: &Config) -> Result<Decoder> {
    Decoder::new(dev, weights(gpt), options(cfg))
}

fn prompts() -> Vec<Vec<u8>> {
    vec![b"the qu".to_vec(), b"a lazy dog".to_vec(), b"fox".to_vec()]
}

#[test]
fn graphed_decode_produces_the_eager_decodes_tokens() {
    for cfg in [TINY, TINY_BF16] {
        on_each_backend(|dev| {
            let gpt = Gpt::new(dev, &cfg, 3)?;
            let mut dec = decoder(dev, &gpt, &cfg)?;
            let req = Request::new(prompts(), 12);
            let eager = dec.generate(&req, Path::Eager)?;
            assert_eq!((eager.batch, eager.prompt_len), (4, 16));
            assert!(eager.tokens.iter().all(|t| t.len() == 12), "{:?}", eager.tokens);
            for path in [Path::Replay, Path::WhileLoop] {
                let got = dec.generate(&req, path)?;
                assert_eq!(got.tokens, eager.tokens, "{} {}: tokens differ from eager", cfg.dtype, path.name());
            }
            Ok(())
        });
    }
}

#[test]
fn the_while_loop_produces_the_per_token_replay_loops_tokens_in_one_launch() {
    on_each_backend(|dev| {
        let gpt = Gpt::new(dev, &TINY, 4)?;
        let mut dec = decoder(dev, &gpt, &TINY)?;
        for req in
            [Request::new(prompts(), 14), Request { max_new_tokens: vec![3, 14, 11], ..Request::new(prompts(), 0) }]
        {
            let replay = dec.generate(&req, Path::Replay)?;
            let lp = dec.generate(&req, Path::WhileLoop)?;
            assert_eq!(lp.tokens, replay.tokens);
            let most = req.max_new_tokens.iter().copied().max().unwrap_or(0);
            // One graph: the prefill and the loop; the replay loop launches a graph per token.
            assert_eq!((lp.launches, lp.steps, lp.syncs), (Some(1), most, 0));
            assert_eq!(replay.launches, Some(most));
            assert_eq!(replay.syncs, (most - 1) / decode::POLL);
        }
        Ok(())
    });
}

/// The training forward's logits (`[seq, vocab]`) for one sequence of bytes.
fn forward_logits(gpt: &Gpt, text: &[u8]) -> Result<Vec<f32>> {
    let dev = gpt.embed.tok.value.device();
    let ids: Vec<f32> = text.iter().map(|&b| f32::from(b)).collect();
    let (mut h, _) = gpt.embed.embed(&Tensor::from_slice(dev, &ids, &[1, ids.len()])?)?;
    for b in &gpt.blocks {
        let mut cx = Cx::new(dev);
        cx.set_training(false);
        h = b.forward(&mut cx, &h)?;
    }
    gpt.head.logits(&h)?.0.to_vec()
}

#[test]
fn prefill_and_decode_logits_are_the_training_forwards() {
    for cfg in [TINY, TINY_BF16] {
        on_each_backend(|dev| {
            let gpt = Gpt::new(dev, &cfg, 5)?;
            let dec = decoder(dev, &gpt, &cfg)?;
            let text = b"the quick brown fox jumps";
            let (prompt, vocab) = (9, model::VOCAB);
            let want = forward_logits(&gpt, &text[..cfg.context.min(text.len())])?;
            let st = dec.state().prefix(1)?;
            st.books.start(&[cfg.context - prompt], Stop { end: None, pad: 0 })?;
            let inputs = passes::PrefillInputs::new(dev, 1, prompt)?;
            inputs.write(&[text[..prompt].to_vec()])?;
            let got = passes::prefill(dec.weights(), &st, &inputs, dec.sampler())?.to_vec()?;
            let at = |t: usize| &want[t * vocab..(t + 1) * vocab];
            let what = format!("{} on {}", cfg.dtype, dev.name());
            // Relative error allowed: f32 sums in another order (decode attention against the
            // causal attention's; on CUDA, GEMMs of other sizes too), and in bf16 roundings
            // of each layer's output that follow them.
            let tol = if cfg.dtype == DType::F32 { 1e-4 } else { 3e-2 };
            // The prefill runs the training forward's ops: on the host, the same bits.
            if dev.is_host() {
                assert!(got == at(prompt - 1), "{what}: prefill logits differ from the forward's");
            } else {
                let e = rel_err(&got, at(prompt - 1));
                assert!(e < tol, "{what}: prefill logits, relative error {e}");
            }
            // Decode steps fed the text's next bytes, alternating the unfused and the fused
            // step over one cache.
            let fused_step = dec.fused().ok_or_else(|| Error::msg("the decoder makes the fused step"))?;
            for (t, &byte) in text.iter().enumerate().take(cfg.context).skip(prompt) {
                let id = Tensor::from_slice(dev, &[f32::from(byte)], &[1])?;
                let pos = Tensor::from_slice(dev, &[t as f32], &[1])?;
                let fused = t % 2 == 1;
                let got = if fused {
                    fused_step.step.run(&id, &pos)?
                } else {
                    passes::step_logits(dec.weights(), &st, &id, &pos)?
                };
                let got = got.to_vec()?;
                let e = rel_err(&got, at(t));
                assert!(e < tol, "{what}: decode logits (fused: {fused}) at position {t}, relative error {e}");
            }
            assert_eq!(st.caches[0].lengths.to_i32_vec()?, vec![text.len().min(cfg.context) as i32]);
            Ok(())
        });
    }
}

/// A token `a` produces first at index 2 or later (so a decode step, not the prefill, meets
/// it) and `b` never produces, with that index.
fn token_only_in(a: &[u8], b: &[u8]) -> Option<(usize, u8)> {
    a.iter().copied().enumerate().find(|&(i, t)| i >= 2 && !a[..i].contains(&t) && !b.contains(&t))
}

#[test]
fn a_sequence_stops_on_its_end_token_and_the_others_continue() {
    on_each_backend(|dev| {
        let gpt = Gpt::new(dev, &TINY, 6)?;
        let mut dec = decoder(dev, &gpt, &TINY)?;
        let free = dec.generate(&Request::new(prompts(), 14), Path::WhileLoop)?;
        let (a, b) = (&free.tokens[0], &free.tokens[1]);
        let (k, end) = token_only_in(a, b)
            .ok_or_else(|| Error::msg(format!("the test needs a token of {a:?} that {b:?} lacks")))?;
        for path in [Path::WhileLoop, Path::Replay, Path::Eager] {
            let got = dec.generate(&Request::new(prompts(), 14).with_end(end), path)?;
            assert_eq!(got.tokens[0], a[..=k], "{}: sequence 0 stops on its end token", path.name());
            assert_eq!(&got.tokens[1], b, "{}: sequence 1 continues", path.name());
            let c = &free.tokens[2];
            let stop_c = c.iter().position(|&t| t == end).map_or(c.len(), |i| i + 1);
            assert_eq!(got.tokens[2], c[..stop_c], "{}: sequence 2", path.name());
        }
        // A stopped sequence records the end token from then on.
        let record = dec.state().books.record()?;
        assert!(record[0][k..].iter().all(|&t| t == i32::from(end)), "{:?}", record[0]);
        Ok(())
    });
}

#[test]
fn sequences_stop_on_their_length() {
    on_each_backend(|dev| {
        let gpt = Gpt::new(dev, &TINY, 7)?;
        let mut dec = decoder(dev, &gpt, &TINY)?;
        let free = dec.generate(&Request::new(prompts(), 9), Path::WhileLoop)?;
        let req = Request { max_new_tokens: vec![2, 5, 9], ..Request::new(prompts(), 0) };
        for path in [Path::WhileLoop, Path::Replay, Path::Eager] {
            let got = dec.generate(&req, path)?;
            for (b, &n) in req.max_new_tokens.iter().enumerate() {
                assert_eq!(got.tokens[b], free.tokens[b][..n], "{}: sequence {b}", path.name());
            }
        }
        // The loop ran as long as the longest: the prefill's step and 8 more.
        assert_eq!(dec.generate(&req, Path::WhileLoop)?.steps, 9);
        Ok(())
    });
}

#[test]
fn a_batch_of_three_in_bucket_four_is_the_batch_of_three_alone() {
    on_each_backend(|dev| {
        let gpt = Gpt::new(dev, &TINY, 8)?;
        let mut dec = decoder(dev, &gpt, &TINY)?;
        let req = Request::new(prompts(), 10);
        let alone = dec.generate(&req, Path::EagerExact)?;
        assert_eq!((alone.batch, alone.prompt_len), (3, 10));
        let bucketed = dec.generate(&req, Path::WhileLoop)?;
        assert_eq!((bucketed.batch, bucketed.prompt_len), (4, 16));
        assert_eq!(bucketed.tokens, alone.tokens);
        // The padding row started stopped: it recorded nothing but pad tokens.
        assert_eq!(dec.state().books.record()?[3], vec![0; TINY.context]);
        Ok(())
    });
}

#[test]
fn a_request_the_cache_cannot_hold_is_refused_before_anything_runs() {
    on_each_backend(|dev| {
        let gpt = Gpt::new(dev, &TINY, 9)?;
        let mut dec = decoder(dev, &gpt, &TINY)?;
        let first = dec.generate(&Request::new(prompts(), 5), Path::WhileLoop)?;
        let state = |dec: &Decoder| -> Result<_> {
            let st = dec.state();
            Ok((st.books.record()?, st.books.steps()?, st.caches[0].lengths.to_i32_vec()?, st.caches[1].k.to_vec()?))
        };
        let before = state(&dec)?;
        // "a lazy dog" (10) + 15 > 24 positions.
        let too_long = Request::new(prompts(), 15);
        for path in [Path::WhileLoop, Path::Replay, Path::Eager, Path::EagerExact] {
            let r = dec.generate(&too_long, path);
            assert!(matches!(r, Err(Error::SequenceTooLong { len: 25, context: 24, .. })), "{}: {r:?}", path.name());
        }
        let five = Request::new(vec![b"x".to_vec(); 5], 2);
        assert!(
            matches!(dec.generate(&five, Path::Eager), Err(Error::InvalidArgument { .. })),
            "more prompts than the largest batch"
        );
        let long_prompt = Request::new(vec![vec![b'y'; 17]], 2);
        assert!(
            matches!(dec.generate(&long_prompt, Path::WhileLoop), Err(Error::InvalidArgument { .. })),
            "above the largest prompt bucket"
        );
        assert!(
            matches!(dec.generate(&Request::new(vec![Vec::new()], 2), Path::Eager), Err(Error::InvalidArgument { .. })),
            "an empty prompt"
        );
        assert!(before == state(&dec)?, "a refused request changed the decoder's state");
        // The decoder works on.
        assert_eq!(dec.generate(&Request::new(prompts(), 5), Path::WhileLoop)?.tokens, first.tokens);
        Ok(())
    });
}

#[test]
fn a_saved_checkpoint_loads_into_a_fresh_model_that_generates_the_same_tokens() {
    on_each_backend(|dev| {
        let gpt = Gpt::new(dev, &TINY, 10)?;
        let path = std::env::temp_dir().join(format!("graphed-gpt-generate-{}.safetensors", std::process::id()));
        let mut dec = decoder(dev, &gpt, &TINY)?;
        graphed::save_safetensors(dec.weights(), &path)?;
        let want = dec.generate(&Request::new(prompts(), 8), Path::WhileLoop)?;
        let fresh = Gpt::new(dev, &TINY, 11)?;
        let mut other = decoder(dev, &fresh, &TINY)?;
        assert_ne!(
            other.generate(&Request::new(prompts(), 8), Path::Eager)?.tokens,
            want.tokens,
            "another seed, other tokens"
        );
        // A load writes into the shared tensors: the model itself, which the captured graphs
        // and the fused step read (no copy to write again).
        let loaded = graphed::load_safetensors(other.weights(), &path);
        let _ = std::fs::remove_file(&path);
        loaded?;
        assert!(fresh.head.head.value.to_vec()? == gpt.head.head.value.to_vec()?);
        assert_eq!(other.generate(&Request::new(prompts(), 8), Path::WhileLoop)?.tokens, want.tokens);
        Ok(())
    });
}

/// The fused decode step produces the unfused step's tokens, eagerly, replayed and in the
/// WHILE loop, for both kinds of model (the bf16 one takes the one-pass attention kernel on
/// CUDA), with at least 2 kernels fewer a block; a step's logits are bitwise the unfused step's on the
/// host, within the dtype's rounding on CUDA.
#[test]
fn the_fused_decode_step_produces_the_unfused_steps_tokens() {
    for cfg in [TINY, TINY_BF16] {
        on_each_backend(|dev| {
            let gpt = Gpt::new(dev, &cfg, 12)?;
            let mut fused = decoder(dev, &gpt, &cfg)?;
            let mut unfused = Decoder::new(dev, weights(&gpt), DecodeOptions { fused_step: false, ..options(&cfg) })?;
            let req = Request::new(prompts(), 12);
            let want = unfused.generate(&req, Path::Eager)?;
            for path in [Path::Eager, Path::Replay, Path::WhileLoop] {
                let got = fused.generate(&req, path)?;
                assert_eq!(got.tokens, want.tokens, "{} {}: fused tokens differ", cfg.dtype, path.name());
            }
            // The graphs of the fused step launch fewer kernels: at least 2 a block (it reads q, k
            // and v in place where the training forward's ops copy them out of the q/k/v GEMM's
            // output, one host node or three kernels, and appends to the cache inside attention;
            // both run q/k/v and gate/up as one GEMM each).
            let nodes = |d: &Decoder| d.step_nodes(4).ok_or_else(|| Error::msg("no decode graph at batch 4"));
            assert!(nodes(&fused)? + 2 * cfg.layers <= nodes(&unfused)?, "{} vs {}", nodes(&fused)?, nodes(&unfused)?);
            // One more step from the states the requests left (the same tokens, so the same
            // caches up to the projections' rounding): on the host the same logits, bit for
            // bit; on CUDA, where the stacked GEMMs may round differently, within the dtype's
            // rounding.
            let (a, b) = (fused.state().prefix(4)?, unfused.state().prefix(4)?);
            let lf = passes::decode_step(fused.weights(), fused.fused(), &a, fused.sampler())?.to_vec()?;
            let lu = passes::decode_step(unfused.weights(), None, &b, unfused.sampler())?.to_vec()?;
            if dev.is_host() {
                assert!(lf == lu, "{}: fused logits differ from the unfused step's", cfg.dtype);
            } else {
                let tol = if cfg.dtype == DType::F32 { 1e-5 } else { 1e-2 };
                let e = rel_err(&lf, &lu);
                assert!(e < tol, "{}: fused logits, relative error {e} against the unfused step's", cfg.dtype);
            }
            Ok(())
        });
    }
}

/// `DecodeOptions::fused_batch_limit` reaches the fused step: a limit past the one kernel's 64
/// is refused when the decoder is made, and a limit of 0 (every batch through the fused ops,
/// never the one kernel) decodes the default decoder's tokens.
#[test]
fn the_fused_batch_limit_reaches_the_step() {
    on_each_backend(|dev| {
        let cfg = TINY_BF16;
        let gpt = Gpt::new(dev, &cfg, 12)?;
        let refused = Decoder::new(dev, weights(&gpt), DecodeOptions { fused_batch_limit: Some(65), ..options(&cfg) });
        assert!(
            matches!(refused, Err(Error::Op(graphed::OpError::TooLarge { .. }))),
            "a fused batch limit of 65 is refused"
        );
        let mut never =
            Decoder::new(dev, weights(&gpt), DecodeOptions { fused_batch_limit: Some(0), ..options(&cfg) })?;
        assert_eq!(never.fused().map(|f| f.step.fused_batch_limit()), Some(0));
        let mut default = decoder(dev, &gpt, &cfg)?;
        let req = Request::new(prompts(), 12);
        assert_eq!(never.generate(&req, Path::WhileLoop)?.tokens, default.generate(&req, Path::WhileLoop)?.tokens);
        Ok(())
    })
}
