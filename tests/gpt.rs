//! The GPT of examples/gpt (#13) with a tiny configuration and dropout: every way of running a
//! step (one graph per module, with and without every other block checkpointed; those graphs
//! fused into one launch; the whole step as one graph) trains bit for bit like the eager model
//! over 20 steps, in f32 and bf16, on each backend; the loss goes down; and bad input (a corpus
//! that is missing, a token outside the vocabulary, a sequence past the context) is a typed
//! error.

mod common;

#[path = "../examples/gpt/corpus.rs"]
mod corpus;
#[path = "../examples/gpt/ends.rs"]
mod ends;
#[path = "../examples/gpt/model.rs"]
mod model;
#[path = "../examples/gpt/pipeline.rs"]
mod pipeline;
#[path = "../examples/gpt/runner.rs"]
mod runner;

use std::path::Path;

use common::on_each_backend;
use graphed::{DType, Device, Error, Result, Tensor};
use model::{Config, Recompute};
use runner::{Mode, Rng, Trainer};

const TINY: Config = Config {
    layers: 2,
    d_model: 32,
    heads: 4,
    context: 16,
    batch: 4,
    hidden: 48,
    dropout: 0.1,
    dtype: DType::F32,
    fused_attention: true,
    recompute: Recompute::Nothing,
};

/// Repetitive text a tiny model learns quickly.
fn text() -> Vec<u8> {
    b"the quick brown fox jumps over the lazy dog; ".repeat(60)
}

fn train(dev: &Device, cfg: Config, mode: Mode, checkpoint: bool, steps: usize) -> Result<(Vec<u32>, Trainer)> {
    let splits = corpus::Splits::new(text(), cfg.context)?;
    let mut trainer = Trainer::new(dev, cfg, 5, 3e-3, mode, checkpoint)?;
    dev.rng()?.manual_seed(99)?; // the same dropout masks in every run
    let mut rng = Rng(11);
    let mut losses = Vec::new();
    for _ in 0..steps {
        let n = mode.microbatches();
        let batches = corpus::microbatches(dev, &splits.train, cfg.batch, n, cfg.context, &mut rng)?;
        losses.push(trainer.step(&batches)?.to_vec()?[0].to_bits());
    }
    Ok((losses, trainer))
}

fn every_mode_trains_bit_for_bit_like_eager(cfg: Config) {
    on_each_backend(|dev| {
        let (eager_losses, eager) = train(dev, cfg, Mode::Eager, false, 20)?;
        let want = eager.param_bits()?;
        for (mode, checkpoint) in
            [(Mode::Graphed, false), (Mode::Graphed, true), (Mode::Fused, true), (Mode::Floor, false)]
        {
            let (losses, t) = train(dev, cfg, mode, checkpoint, 20)?;
            let what = format!("{} {mode:?} (checkpoint {checkpoint})", cfg.dtype);
            assert_eq!(eager_losses, losses, "{what}: losses differ from eager");
            assert!(want == t.param_bits()?, "{what}: parameters differ from eager after 20 steps");
        }
        let (first, last) = (f32::from_bits(eager_losses[0]), f32::from_bits(eager_losses[19]));
        assert!(last < first * 0.8, "the loss did not go down: {first} -> {last}");
        let sample = eager.generate(b"the quick", 20, &mut Rng(1))?;
        assert_eq!(sample.len(), 20);
        Ok(())
    });
}

/// Ragged rows (cut at line boundaries, each step's batch as long as its longest row):
/// `mode` with sequence `buckets`, or eager on the same batches padded to the bucket each
/// step's graphs replay. Per-step loss bits and the buckets used.
fn train_ragged(
    dev: &Device,
    cfg: Config,
    mode: Mode,
    buckets: &[usize],
    steps: usize,
) -> Result<(Vec<u32>, Vec<usize>, Trainer)> {
    let splits = corpus::Splits::new(b"a line\nand a longer line of text\nshort\n".repeat(40), cfg.context)?;
    let graphed = mode != Mode::Eager;
    let mut trainer = Trainer::with_buckets(dev, cfg, 5, (3e-3, 0.0), mode, true, graphed.then(|| buckets.to_vec()))?;
    dev.rng()?.manual_seed(99)?;
    let mut rng = Rng(11);
    let (mut losses, mut used) = (Vec::new(), Vec::new());
    for _ in 0..steps {
        let r = corpus::ragged_batch(dev, &splits.train, cfg.batch, cfg.context, 3, &mut rng)?;
        let size = buckets.iter().copied().find(|s| *s >= r.ids.dims()[1]).expect("a bucket");
        let batch = if graphed { (r.ids, r.labels) } else { trainer.padded(&r.ids, &r.labels, size)? };
        losses.push(trainer.step(&[batch])?.to_vec()?[0].to_bits());
        used.push(size);
    }
    Ok((losses, used, trainer))
}

#[test]
fn ragged_rows_in_sequence_buckets_train_bit_for_bit_like_eager_on_the_padded_shapes() {
    on_each_backend(|dev| {
        let buckets = [4, 8, 12, 16];
        let (want, used, eager) = train_ragged(dev, TINY, Mode::Eager, &buckets, 16)?;
        let mut seen = used.clone();
        seen.sort_unstable();
        seen.dedup();
        assert!(seen.len() >= 3, "the steps should use several buckets, used {used:?}");
        for mode in [Mode::Graphed, Mode::Fused] {
            let (losses, _, t) = train_ragged(dev, TINY, mode, &buckets, 16)?;
            assert_eq!(want, losses, "{mode:?}: losses differ from eager on the padded shapes");
            assert!(eager.param_bits()? == t.param_bits()?, "{mode:?}: parameters differ from eager");
            let reports = t.bucket_reports();
            assert_eq!(reports.iter().map(|r| r.size).collect::<Vec<_>>(), buckets);
        }
        Ok(())
    });
}

#[test]
fn f32_graphed_fused_and_floor_train_bit_for_bit_like_eager() {
    every_mode_trains_bit_for_bit_like_eager(TINY);
}

#[test]
fn bf16_graphed_fused_and_floor_train_bit_for_bit_like_eager() {
    every_mode_trains_bit_for_bit_like_eager(Config { dtype: DType::BF16, ..TINY });
}

/// Head dimension 64 in bf16: the blocks run the fused attention kernels (`flash_attention`).
#[test]
fn bf16_with_fused_attention_trains_bit_for_bit_like_eager() {
    every_mode_trains_bit_for_bit_like_eager(Config { d_model: 128, heads: 2, hidden: 96, dtype: DType::BF16, ..TINY });
}

/// Blocks that recompute SwiGLU's output, or it and their norms' outputs, in the backward train
/// bit for bit like blocks that keep them (eager, graphed with and without checkpoints, fused,
/// floor; with dropout; f32, bf16, and bf16 through the fused attention), and their graphs hold
/// less: at least the `h` or `2·d + h` elements a token of every block no longer keeps, less
/// what the backward of the largest block holds at once.
#[test]
fn recomputing_blocks_train_bit_for_bit_like_saving_ones_in_less_memory() {
    let fused = Config { d_model: 128, heads: 2, hidden: 96, dtype: DType::BF16, ..TINY };
    let modes = [
        (Mode::Eager, false),
        (Mode::Graphed, false),
        (Mode::Graphed, true),
        (Mode::Fused, true),
        (Mode::Floor, false),
    ];
    for cfg in [TINY, Config { dtype: DType::BF16, ..TINY }, fused] {
        on_each_backend(|dev| {
            for (mode, checkpoint) in modes {
                let (want, saving) = train(dev, cfg, mode, checkpoint, 12)?;
                for recompute in [Recompute::Swiglu, Recompute::All] {
                    let what = format!("{} {mode:?} (checkpoint {checkpoint}, {recompute:?})", cfg.dtype);
                    let (losses, recomputing) = train(dev, Config { recompute, ..cfg }, mode, checkpoint, 12)?;
                    assert_eq!(want, losses, "{what}: recomputing changed the losses");
                    let same = saving.param_bits()? == recomputing.param_bits()?;
                    assert!(same, "{what}: recomputing changed the parameters");
                }
            }
            Ok(())
        });
    }
    // The memory, at a size where a block's activations outgrow the pool's 64 KiB slabs.
    let cfg = Config { layers: 4, d_model: 64, heads: 4, context: 32, batch: 8, hidden: 256, ..TINY };
    on_each_backend(|dev| {
        let pool = |recompute| -> Result<usize> {
            Ok(train(dev, Config { recompute, ..cfg }, Mode::Graphed, false, 1)?.1.pool_bytes())
        };
        let kept = pool(Recompute::Nothing)?;
        for (recompute, elements) in [(Recompute::Swiglu, cfg.hidden), (Recompute::All, 2 * cfg.d_model + cfg.hidden)] {
            let less = pool(recompute)?;
            let per_block = cfg.batch * cfg.context * elements * cfg.dtype.size();
            assert!(
                kept >= less + (cfg.layers - 1) * per_block,
                "{recompute:?}: the pool holds {less} bytes recomputing, {kept} keeping: less than {} blocks' {per_block} saved",
                cfg.layers - 1
            );
        }
        Ok(())
    });
}

#[test]
fn the_graphed_pipeline_trains_bit_for_bit_like_its_eager_schedule() {
    for cfg in [TINY, Config { dtype: DType::BF16, ..TINY }] {
        on_each_backend(|dev| {
            let (eager_losses, eager) = train(dev, cfg, Mode::PipelineEager, false, 20)?;
            let (losses, graphed) = train(dev, cfg, Mode::Pipeline, false, 20)?;
            assert_eq!(eager_losses, losses, "{}: pipeline losses differ", cfg.dtype);
            assert!(eager.param_bits()? == graphed.param_bits()?, "{}: pipeline parameters differ", cfg.dtype);
            let (first, last) = (f32::from_bits(losses[0]), f32::from_bits(losses[19]));
            assert!(last < first * 0.8, "the pipelined loss did not go down: {first} -> {last}");
            Ok(())
        });
    }
}

#[test]
fn bad_input_is_a_typed_error() {
    on_each_backend(|dev| {
        let missing = corpus::load(Path::new("."), Some(Path::new("/nonexistent/graphed-corpus.txt")));
        assert!(matches!(missing, Err(Error::InvalidArgument { op: "corpus", .. })), "{missing:?}");
        let empty_dir = std::env::temp_dir().join(format!("graphed-gpt-empty-{}", std::process::id()));
        std::fs::create_dir_all(&empty_dir).map_err(|e| Error::msg(e.to_string()))?;
        let empty = corpus::load(&empty_dir, None);
        let _ = std::fs::remove_dir(&empty_dir);
        assert!(matches!(empty, Err(Error::InvalidArgument { op: "corpus", .. })), "{empty:?}");
        assert!(corpus::Splits::new(b"short".to_vec(), TINY.context).is_err());
        let trainer = Trainer::new(dev, TINY, 5, 1e-3, Mode::Eager, false)?;
        let long = Tensor::zeros(dev, &[1, TINY.context + 1])?;
        let r = trainer.embed()?.embed(&long);
        assert!(matches!(r, Err(Error::SequenceTooLong { len: 17, context: 16, .. })), "{:?}", r.err());
        // On the host at the call; on CUDA at the next read of the device (the error word).
        let bad = Tensor::from_slice(dev, &[65.0, 256.0], &[1, 2])?;
        let r = trainer.embed()?.embed(&bad).and_then(|(x, _)| x.to_vec());
        assert!(matches!(r, Err(Error::TokenOutOfRange { id: 256.0, pos: 1, .. })), "{:?}", r.err());
        dev.synchronize()?; // reported once: the device is usable again
        Ok(())
    });
}
