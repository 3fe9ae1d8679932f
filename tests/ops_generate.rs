//! Generation's bookkeeping on the device (`ops::Generation`, `ops::generation_step`): the
//! kernel against the CPU reference step by step (end tokens, limits, padded rows); a toy
//! decoding loop (embed the last token, pick the next by argmax, record) as the body of a WHILE
//! graph that stops by itself, equal to the same step replayed one launch at a time and run
//! eagerly; prefixes for smaller batches; and bad arguments refused before anything changes.

mod common;
mod ops_support;

use common::on_each_backend;
use graphed::ops::{self, cpu, Generation, Stop};
use graphed::{CaptureMode, Condition, DType, Device, Error, Generator, Graph, OpError, Result, Tensor};
use ops_support::*;

/// The reference's state after `start(limits, stop)` for `batch` sequences of `max_new`.
fn started(batch: usize, max_new: usize, limits: &[usize], stop: Stop) -> cpu::GenerationState {
    let lim: Vec<i32> = (0..batch).map(|b| limits.get(b).map_or(0, |&l| l as i32)).collect();
    let pad = stop.pad as i32;
    cpu::GenerationState {
        tokens: vec![pad; batch * max_new],
        counts: vec![0; batch],
        done: lim.iter().map(|&l| i32::from(l == 0)).collect(),
        limits: lim,
        stop: [stop.end.map_or(-1, |e| e as i32), pad],
        step: 0,
        max_new,
    }
}

#[test]
fn generation_step_matches_the_cpu_reference() {
    on_each_backend(|dev| {
        let (batch, max_new) = (5, 6);
        let g = Generation::new(dev, batch, max_new)?;
        // Sequence 3 is padding (no limit given), sequence 1 may produce 2 tokens.
        let (limits, stop) = ([6, 2, 6], Stop { end: Some(9), pad: 4 });
        let limits = [limits.as_slice(), &[0, 5]].concat();
        g.start(&limits, stop)?;
        let mut want = started(batch, max_new, &limits, stop);
        let lengths = Tensor::from_i32(dev, &[3, 4, 5, 6, 7], &[batch])?;
        let steps = [[1, 2, 3, 4, 5], [9, 2, 3, 4, 5], [1, 9, 9, 4, 5], [1, 2, 3, 4, 9], [7, 7, 7, 7, 7]];
        for (i, sampled) in steps.iter().enumerate() {
            ops::generation_step(&g, &Tensor::from_i32(dev, sampled, &[batch])?, &lengths)?;
            let (next, positions, active) = cpu::generation_step(&mut want, sampled, &lengths.to_i32_vec()?);
            let what = format!("step {i}");
            let record: Vec<i32> = g.record()?.concat();
            assert_eq!(record, want.tokens, "{what}: tokens");
            assert_eq!(g.steps()?, want.step as usize, "{what}: steps");
            assert_eq!(g.is_active()?, active, "{what}: the loop flag");
            bitwise_eq(&format!("{what}: next ids"), &g.next_ids().to_vec()?, &next)?;
            bitwise_eq(&format!("{what}: positions"), &g.positions().to_vec()?, &positions)?;
        }
        // Sequence 0 stopped on its end token at step 1, 1 on its limit, 2 on the end token at
        // step 2, 3 never started, 4 on the end token at step 3.
        assert_eq!(g.tokens()?, vec![vec![1, 9], vec![2, 2], vec![3, 3, 9], vec![], vec![5, 5, 5, 9]]);
        assert!(!g.is_active()?);
        Ok(())
    });
}

/// A toy model: token `t` is followed by `(3t + 1) mod vocab` (the argmax of row `t` of a
/// table of logits). The step embeds each sequence's last token (a row of the table), takes
/// the argmax and records it; as the body of a WHILE loop on the flag it runs until every
/// sequence reached the end token or its limit, in one launch.
struct Toy {
    table: Tensor,
    lengths: Tensor,
    vocab: usize,
}

impl Toy {
    fn new(dev: &Device, batch: usize, vocab: usize) -> Result<Toy> {
        let mut logits = vec![0.0f32; vocab * vocab];
        for t in 0..vocab {
            logits[t * vocab + (3 * t + 1) % vocab] = 1.0;
        }
        let table = Tensor::from_slice_as(dev, &logits, &[vocab, vocab], DType::BF16)?;
        let lengths = Tensor::from_i32(dev, &vec![0; batch], &[batch])?;
        Ok(Toy { table, lengths, vocab })
    }

    fn step(&self, g: &Generation) -> Result<()> {
        let logits = ops::embedding(g.next_ids(), &self.table)?;
        let lengths = self.lengths.prefix_view(&[g.batch()])?;
        ops::generation_step(g, &ops::argmax(&logits)?, &lengths)
    }

    /// The same step through `ops::sample_and_record` (greedy): one kernel for the argmax, the
    /// books and the loop's condition where `GRAPHED_FOLD_CONDITION=1` lets it.
    fn step_sampled(&self, g: &Generation, rng: &Generator) -> Result<()> {
        let logits = ops::embedding(g.next_ids(), &self.table)?;
        let lengths = self.lengths.prefix_view(&[g.batch()])?;
        ops::sample_and_record(g, &logits, ops::Sampling::greedy(), rng, &lengths).map(drop)
    }

    /// The chain from `first` until `end` or `limit` tokens.
    fn expected(&self, first: i32, end: i32, limit: usize) -> Vec<i32> {
        let mut out = vec![first];
        while *out.last().expect("one token") != end && out.len() < limit {
            out.push((3 * out.last().expect("one token") + 1) % self.vocab as i32);
        }
        out
    }
}

#[test]
fn a_while_loop_generates_until_every_sequence_stopped_in_one_launch() {
    on_each_backend(|dev| {
        let (batch, max_new, vocab) = (4, 12, 16);
        let toy = Toy::new(dev, batch, vocab)?;
        let g = Generation::new(dev, batch, max_new)?;
        let stop = Stop { end: Some(15), pad: 0 };
        // The first token of each sequence is recorded as a prefill would: by a step on it.
        let begin = |limits: &[usize], first: &[i32]| -> Result<()> {
            g.start(limits, stop)?;
            ops::generation_step(&g, &Tensor::from_i32(dev, first, &[batch])?, &toy.lengths)
        };
        let (limits, first) = ([12, 12, 3, 12], [2, 5, 1, 15]);
        let want: Vec<Vec<i32>> = first.iter().zip(limits).map(|(&f, l)| toy.expected(f, 15, l)).collect();
        // Eager: the host checks the flag after each step.
        begin(&limits, &first)?;
        while g.is_active()? {
            toy.step(&g)?;
        }
        let (eager, eager_steps) = (g.record()?, g.steps()?);
        assert_eq!(g.tokens()?, want, "eager");
        // One graph of the step, replayed while the flag holds.
        let mut body = Graph::new(dev);
        body.capture(CaptureMode::Global, || toy.step(&g))?;
        begin(&limits, &first)?;
        while g.is_active()? {
            body.replay()?;
        }
        assert_eq!((g.record()?, g.steps()?), (eager.clone(), eager_steps), "replayed step by step");
        // The same step as the body of a WHILE loop: one launch.
        let mut lp = body.while_loop(&Condition::nonzero(g.active())?)?;
        begin(&limits, &first)?;
        lp.launch()?;
        assert_eq!((g.record()?, g.steps()?), (eager, eager_steps), "the WHILE loop");
        // The longest sequence sets the steps: 5 -> 0 -> 1 -> ... never meets 15 and runs to its
        // limit of 12.
        assert_eq!(eager_steps, want.iter().map(Vec::len).max().unwrap_or(0));
        // Without an end token every sequence runs to its limit, and the loop stops at max_new.
        g.start(&[max_new; 4], Stop { end: None, pad: 0 })?;
        ops::generation_step(&g, &Tensor::from_i32(dev, &first, &[batch])?, &toy.lengths)?;
        lp.launch()?;
        assert_eq!(g.steps()?, max_new);
        assert!(g.tokens()?.iter().all(|t| t.len() == max_new));
        Ok(())
    });
}

/// The loop captured in the middle of a graph (`Condition::run_while`), with the step as the
/// body's last work (where `GRAPHED_FOLD_CONDITION=1` has it set the WHILE node's condition
/// itself on CUDA, so no condition kernel follows it), the step through
/// `ops::sample_and_record` (there, the argmax, the books and the condition in one kernel), and
/// the step with work after it (where a condition kernel must follow): each gives the eager
/// loop's tokens and steps, and the work after the step runs once a pass.
#[test]
fn a_loop_captured_inside_a_graph_ends_on_the_step_or_after_more_work() {
    on_each_backend(|dev| {
        let (batch, max_new, vocab) = (4, 10, 16);
        let toy = Toy::new(dev, batch, vocab)?;
        let g = Generation::new(dev, batch, max_new)?;
        let stop = Stop { end: Some(15), pad: 0 };
        let (limits, first) = ([10, 4, 10, 2], [2, 5, 1, 7]);
        let first = Tensor::from_i32(dev, &first, &[batch])?;
        let begin = || -> Result<()> {
            g.start(&limits, stop)?;
            ops::generation_step(&g, &first, &toy.lengths)
        };
        begin()?;
        while g.is_active()? {
            toy.step(&g)?;
        }
        let want = (g.record()?, g.steps()?);
        let (passes, one) = (Tensor::zeros(dev, &[1])?, Tensor::full(dev, &[1], 1.0)?);
        let active = Condition::nonzero(g.active())?;
        let rng = Generator::new(dev, 1)?;
        for (sampled, after) in [(false, false), (true, false), (false, true)] {
            let mut graph = Graph::new(dev);
            graph.capture(CaptureMode::Global, || {
                ops::fill_(&passes, 0.0)?;
                active.run_while(|| {
                    if sampled {
                        toy.step_sampled(&g, &rng)?;
                    } else {
                        toy.step(&g)?;
                    }
                    if after {
                        ops::axpy_(&passes, 1.0, &one)?;
                    }
                    Ok(())
                })
            })?;
            begin()?;
            graph.replay()?;
            let what = match (sampled, after) {
                (_, true) => "work after the step",
                (true, _) => "sample_and_record last",
                _ => "the step last",
            };
            assert_eq!((g.record()?, g.steps()?), want, "{what}");
            // The first step ran before the loop: every later one is a pass.
            let want_passes = if after { (want.1 - 1) as f32 } else { 0.0 };
            assert_eq!(passes.to_vec()?, vec![want_passes], "{what}: passes");
            if !dev.is_host() {
                // CUDA's dump of the graph, WHILE body included: the step that sets the
                // condition is there exactly when it is asked for.
                let path =
                    std::env::temp_dir().join(format!("graphed-fold-{}-{sampled}-{after}.dot", std::process::id()));
                graph.debug_dump(&path)?;
                let dot = std::fs::read_to_string(&path).map_err(|e| Error::msg(e.to_string()))?;
                let _ = std::fs::remove_file(&path);
                let folded = !std::env::var("GRAPHED_FOLD_CONDITION").is_ok_and(|v| v == "0");
                let kernel = if sampled { "graphed_greedy_record_set" } else { "graphed_generation_step_set" };
                assert_eq!(dot.contains(kernel), folded, "{what}: the folded step");
            }
        }
        Ok(())
    });
}

/// A graph captured on the first 2 sequences of a batch of 4 reads and writes only those; the
/// step counter and the flag are shared.
#[test]
fn a_prefix_runs_the_first_sequences_only() {
    on_each_backend(|dev| {
        let (batch, max_new, vocab) = (4, 5, 8);
        let toy = Toy::new(dev, batch, vocab)?;
        let g = Generation::new(dev, batch, max_new)?;
        let two = g.prefix(2)?;
        assert_eq!((two.batch(), two.max_new()), (2, max_new));
        let mut body = Graph::new(dev);
        body.capture(CaptureMode::Global, || toy.step(&two))?;
        let mut lp = body.while_loop(&Condition::nonzero(two.active())?)?;
        g.start(&[5, 5], Stop { end: None, pad: 7 })?;
        ops::generation_step(&two, &Tensor::from_i32(dev, &[1, 2], &[2])?, &toy.lengths.prefix_view(&[2])?)?;
        lp.launch()?;
        let tokens = g.tokens()?;
        assert_eq!(tokens[..2], [toy.expected(1, -1, 5), toy.expected(2, -1, 5)]);
        assert_eq!(tokens[2..], [Vec::<i32>::new(), Vec::new()], "rows 2 and 3 started stopped");
        assert_eq!(g.record()?[3], vec![7; max_new], "an unused row holds the pad token");
        assert_eq!(g.steps()?, 5);
        Ok(())
    });
}

#[test]
fn bad_arguments_are_refused_before_anything_changes() {
    on_each_backend(|dev| {
        let (batch, max_new) = (3, 4);
        let size = |e: &Error| matches!(e, Error::Op(OpError::GenerationSize { .. }));
        expect_err("no sequences", Generation::new(dev, 0, 4), size)?;
        expect_err("no tokens", Generation::new(dev, 3, 0), size)?;
        let g = Generation::new(dev, batch, max_new)?;
        let stop = Stop { end: Some(1), pad: 0 };
        g.start(&[4, 4, 4], stop)?;
        expect_err("too many limits", g.start(&[1, 1, 1, 1], stop), |e| {
            matches!(e, Error::Op(OpError::GenerationLimits { limits: 4, batch: 3 }))
        })?;
        expect_err("a limit above max_new", g.start(&[5], stop), |e| {
            matches!(e, Error::Op(OpError::GenerationLimit { limit: 5, .. }))
        })?;
        expect_err("an end token past i32", g.start(&[1], Stop { end: Some(u32::MAX), pad: 0 }), |e| {
            matches!(e, Error::Op(OpError::TooLarge { what: "token id", .. }))
        })?;
        let prefix = |e: &Error| matches!(e, Error::Op(OpError::GenerationPrefix { sequences: 3, .. }));
        expect_err("prefix 0", g.prefix(0), prefix)?;
        expect_err("prefix past the batch", g.prefix(4), prefix)?;
        let lengths = Tensor::from_i32(dev, &[0, 0, 0], &[batch])?;
        let sampled = Tensor::from_i32(dev, &[2, 2, 2], &[batch])?;
        let dtype = |e: &Error| matches!(e, Error::DType { expected: DType::I32, .. });
        expect_err("f32 tokens", ops::generation_step(&g, &Tensor::zeros(dev, &[batch])?, &lengths), dtype)?;
        expect_err("f32 lengths", ops::generation_step(&g, &sampled, &Tensor::zeros(dev, &[batch])?), dtype)?;
        let two = Tensor::from_i32(dev, &[2, 2], &[2])?;
        expect_err("tokens of another batch", ops::generation_step(&g, &two, &lengths), is_shape)?;
        expect_err("lengths of another batch", ops::generation_step(&g, &sampled, &two), is_shape)?;
        // Sampling and recording: checked before a random number is drawn.
        let rng = Generator::new(dev, 9)?;
        let (drawn, logits) = (rng.seed_and_offset()?, Tensor::zeros(dev, &[batch, 5])?);
        let sampling = ops::Sampling { temperature: 1.0, top_k: 0 };
        let bad_lengths = ops::sample_and_record(&g, &logits, sampling, &rng, &Tensor::zeros(dev, &[batch])?);
        expect_err("f32 lengths, sampled", bad_lengths, dtype)?;
        let other_rows = ops::sample_and_record(&g, &Tensor::zeros(dev, &[2, 5])?, sampling, &rng, &lengths);
        expect_err("logits of another batch", other_rows, is_shape)?;
        let elsewhere =
            ops::sample_and_record(&g, &Tensor::zeros(&Device::host(), &[batch, 5])?, sampling, &rng, &lengths);
        expect_err("logits on another device", elsewhere, |e| matches!(e, Error::DeviceMismatch { .. }))?;
        assert_eq!(rng.seed_and_offset()?, drawn, "no random number drawn");
        // Starting is a host write: refused during a capture.
        let mut graph = Graph::new(dev);
        let during = graph.capture(CaptureMode::Global, || g.start(&[1], stop));
        expect_err("start during a capture", during, |e| matches!(e, Error::IllegalDuringCapture { .. }))?;
        // Nothing changed: the state is the first start's.
        assert_eq!((g.steps()?, g.is_active()?), (0, true));
        assert_eq!(g.record()?, vec![vec![0; max_new]; batch]);
        ops::generation_step(&g, &sampled, &lengths)?;
        assert_eq!(g.tokens()?, vec![vec![2]; 3]);
        Ok(())
    });
}
