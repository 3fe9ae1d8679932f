//! A byte-level GPT trained with one graphed module per transformer block: the main job.
//!
//! `cargo run --release --example gpt -- --help` lists the flags: `--steps`, `--data`,
//! `--size tiny|gpu`, `--context`, `--batch`, `--dtype f32|bf16`,
//! `--mode eager|graphed|fused|floor|pipeline|pipeline-eager` (`--eager` is `--mode eager`),
//! `--no-checkpoint`, `--recompute nothing|swiglu|all`, `--dropout`, `--lr`, `--weight-decay`, `--seed`, `--eval-every`, `--warmup`, `--plot FILE.png`,
//! `--json FILE`, `--lengths fixed|ragged`, `--buckets N`, `--bucket-min N`, `--estimate`; and for generation
//! `--save PATH`, `--load PATH`, `--generate`, `--prompts N`, `--prompt-len N`,
//! `--max-new-tokens N`, `--temperature T`, `--top-k K`, `--max-batch N`, `--decode-bench`, `--bench-min-batch N`,
//! `--unfused-decode`.
//!
//! The text is, by default, the repository's own README.md, docs/*.md and Rust sources, read
//! from the directory the binary runs in (run it from the repository root); `--data FILE`
//! trains on a file instead. A missing or empty corpus is an error, not a panic. On the host
//! backend the tiny configuration (3 layers, d_model 96, context 96, f32) trains 500 steps in
//! about a minute; on a GPU the default is 8 layers, d_model 512, 8 heads, context 256, batch
//! 16, in bf16 with f32 master weights and grads (`MixedAdamW`). Prints step, loss, tokens/s and
//! ETA, the validation loss every `--eval-every` steps (4 batches; 32 after the last step), 200
//! sampled bytes at the end, and draws
//! the loss chart as a PNG (`--plot`, default in the temp directory).
//!
//! `--mode`: `graphed` (default) captures the embedding, every block and the head (the chunks
//! of one `#[graphed(chained)]` struct, `model::Gpt`), odd blocks checkpointed (their activations
//! recomputed inside the backward graph; `--no-checkpoint` keeps them), and the optimizer step as
//! one more graph;
//! `fused` replays those graphs as one launch per step; `floor` captures the whole step as one
//! graph; `eager` runs it op by op. These four train bit for bit alike (tests/gpt.rs).
//! `pipeline` splits the model into two chunks (embedding + first half of the blocks, second
//! half + head) over 4 microbatches in an interleaved order, graphed per (chunk, microbatch)
//! and replayed as one launch; `pipeline-eager` runs that schedule op by op, and the two train
//! bit for bit alike. The pipeline modes split each batch into microbatches, so their losses
//! differ from the other four modes' (same data, another summation order).
//!
//! The learning rate warms up linearly over `--warmup` steps (default 5%) to its peak (3e-3 for
//! the tiny model, 6e-4 for the GPU one), then follows a cosine to a tenth of it, computed on the
//! device inside AdamW's step from its step count (`optim::WarmupCosine`). `--dropout P` drops
//! each block's two residual branches while training (graph-safe RNG: every replay draws a
//! fresh mask; a checkpointed block recomputes the same one).
//!
//! `--lengths ragged` trains on rows of different lengths, cut at line boundaries (a length
//! drawn per step, log-uniform from `--bucket-min` to the context), as documents are. The
//! graphed modes then capture the model once per sequence bucket (`--buckets N` sizes from
//! `--bucket-min` to the context, geometric, largest first, in one pool: `GraphOptions::buckets`)
//! and each step replays the smallest bucket that holds its longest row, padded (ids with byte
//! 0, labels with `ops::IGNORE_LABEL`, which the loss leaves out); `--buckets 1` pads every
//! step to the context instead. The progress lines report the padding waste, and tokens/s
//! counts real tokens only.
//!
//! Generation (`decode.rs`, `passes.rs`, `generate.rs`): KV caches for `--max-batch`
//! sequences, a prefill and a one-token decode step, sampling (`--temperature`, `--top-k`)
//! and stopping on the device; the decode step captured once per batch bucket (1, 2, 4, ...)
//! and run under a WHILE node after the prefill in one graph, so a whole request is one launch.
//! `--save PATH` writes the trained weights as safetensors; `--load PATH` skips training and
//! reads them (give the `--size`, `--context` and `--dtype` of the run that saved them).
//! `--generate` continues `--prompts N` prompts of the validation text (at most
//! `--prompt-len` bytes) by `--max-new-tokens` each, after training or from `--load`.
//! `--decode-bench` skips training (random weights unless `--load`: the speed does not depend
//! on them) and times prompts of `--prompt-len` continued by `--max-new-tokens` at batch 1,
//! 2, 4, ... `--max-batch`, as a WHILE loop, one graph replay per token, and eagerly:
//! tokens/s, per-token latency, CPU time per token, host launches per request; `--json` gets
//! the figures, `--plot` the chart of tokens/s by batch size. The decode step is the fused one
//! (`graphed::ops::DecoderStep`: on the GPU one kernel for the whole step, over the model's
//! stacked q/k/v and gate/up weights); `--unfused-decode` runs the
//! training forward's ops
//! instead, to compare.

mod corpus;
mod decode;
mod ends;
mod generate;
mod model;
mod passes;
mod pipeline;
mod plot;
mod runner;

use std::path::{Path, PathBuf};
use std::time::Instant;

use clap::builder::TypedValueParser;
use clap::{Parser, ValueEnum};
use decode::{DecodeOptions, Decoder, Weights};
use graphed::ops::Sampling;
use graphed::optim::WarmupCosine;
use graphed::{DType, Device, Error, Result};
use model::{Config, Gpt, Recompute};
use runner::{Mode, Rng, Trainer};

/// The learning rate after warm-up; a cosine decays it to a tenth by the last step.
fn peak_lr(cfg: &Config) -> f32 {
    if cfg.d_model >= 512 {
        6e-4
    } else {
        3e-3
    }
}

/// How a step runs (`runner::Mode`), as the command line spells it.
#[derive(Clone, Copy, Debug, ValueEnum)]
enum ModeArg {
    /// op by op, no graphs
    Eager,
    /// one graph per module (embedding, each block, head) and one for the optimizer step
    Graphed,
    /// the per-module graphs replayed as one launch per step
    Fused,
    /// the whole step captured as one graph
    Floor,
    /// two pipeline chunks x 4 microbatches, graphed per (chunk, microbatch), one launch
    Pipeline,
    /// the pipeline schedule, op by op
    PipelineEager,
}

impl From<ModeArg> for Mode {
    fn from(m: ModeArg) -> Mode {
        match m {
            ModeArg::Eager => Mode::Eager,
            ModeArg::Graphed => Mode::Graphed,
            ModeArg::Fused => Mode::Fused,
            ModeArg::Floor => Mode::Floor,
            ModeArg::Pipeline => Mode::Pipeline,
            ModeArg::PipelineEager => Mode::PipelineEager,
        }
    }
}

/// The model's size.
#[derive(Clone, Copy, Debug, ValueEnum)]
enum Size {
    /// 3 layers, d_model 96, 4 heads, context 96, batch 8 (the host default).
    Tiny,
    /// 8 layers, d_model 512, 8 heads, context 256, batch 16 (the GPU default).
    Gpu,
}

/// Which attention kernels the blocks run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum AttentionArg {
    /// `ops::flash_attention` where it runs (bf16 at head dim 64 or 128), else unfused.
    Fused,
    /// `ops::causal_attention` everywhere.
    Unfused,
}

/// What each block recomputes in its backward (`model::Recompute`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum RecomputeArg {
    /// Keep everything the backward reads.
    Nothing,
    /// SwiGLU's output.
    Swiglu,
    /// SwiGLU's output and the two norms' outputs.
    All,
}

impl From<RecomputeArg> for Recompute {
    fn from(r: RecomputeArg) -> Recompute {
        match r {
            RecomputeArg::Nothing => Recompute::Nothing,
            RecomputeArg::Swiglu => Recompute::Swiglu,
            RecomputeArg::All => Recompute::All,
        }
    }
}

/// The dtype of weights and activations.
#[derive(Clone, Copy, Debug, ValueEnum)]
enum DTypeArg {
    /// float32 throughout (the host default).
    F32,
    /// bf16 weights and activations, f32 master weights and grads (the GPU default).
    Bf16,
}

/// Trains a byte-level GPT, one graphed module per transformer block, on this repository's
/// text (run it from the repository root) or on `--data FILE`.
#[derive(Debug, Parser)]
#[command(name = "gpt", after_help = "Set GRAPHED_DEVICE=host to run on the CPU when a GPU is present.")]
struct Args {
    /// Training steps [default: 2000 on a GPU, 500 on the host].
    #[arg(long, value_name = "N")]
    steps: Option<usize>,
    /// Train on this text file instead of the repository's README, docs and Rust sources.
    #[arg(long, value_name = "FILE")]
    data: Option<PathBuf>,
    /// Model size [default: gpu on a GPU, tiny on the host].
    #[arg(long, value_enum)]
    size: Option<Size>,
    /// Sequence length: the size's context unless given (the tiny size 96, the gpu size 256).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..).map(|n| n as usize))]
    context: Option<usize>,
    /// Sequences per step: the size's batch unless given (the tiny size 8, the gpu size 16).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..).map(|n| n as usize))]
    batch: Option<usize>,
    /// Weights and activations [default: bf16 on a GPU, f32 on the host].
    #[arg(long, value_enum)]
    dtype: Option<DTypeArg>,
    /// How a step runs.
    #[arg(long, value_enum, default_value = "graphed")]
    mode: ModeArg,
    /// The same as `--mode eager`.
    #[arg(long, conflicts_with = "mode")]
    eager: bool,
    /// Attention kernels: fused (FlashAttention-2 tiles, where the dtype and head dimension
    /// allow) or unfused (`causal_attention`: GEMMs around a softmax kernel).
    #[arg(long, value_enum, default_value = "fused")]
    attention: AttentionArg,
    /// Keep every block's activations (graphed and fused modes checkpoint the odd blocks).
    #[arg(long)]
    no_checkpoint: bool,
    /// What each block recomputes in its backward instead of keeping it (less memory, the same
    /// bits; `model::Recompute`): SwiGLU's output, or that and the two norms' outputs.
    #[arg(long, value_enum, default_value = "nothing")]
    recompute: RecomputeArg,
    /// Dropout probability on each block's two residual branches while training.
    #[arg(long, value_name = "P", default_value_t = 0.0, value_parser = probability)]
    dropout: f32,
    /// The peak learning rate [default: 6e-4 for d_model 512 and up, 3e-3 below].
    #[arg(long, value_name = "LR")]
    lr: Option<f32>,
    /// AdamW's decoupled weight decay (`p *= 1 - lr·W` a step, every parameter; AdamW rejects a
    /// negative or non-finite W).
    #[arg(long, value_name = "W", default_value_t = 0.0)]
    weight_decay: f32,
    /// Another draw of the run: N > 0 (at most 1,000,000) draws other initial weights and other
    /// training batches (the validation batches stay the same); 0 is the run docs/BENCHMARKS.md
    /// reports.
    #[arg(long, value_name = "N", default_value_t = 0, value_parser = clap::value_parser!(u64).range(0..=1_000_000))]
    seed: u64,
    /// Validation loss every N steps [default: a tenth of --steps].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    eval_every: Option<u64>,
    /// Learning-rate warm-up steps [default: a twentieth of --steps].
    #[arg(long, value_name = "N")]
    warmup: Option<usize>,
    /// Where to write the loss chart [default: graphed-gpt-loss.png in the temp directory].
    #[arg(long, value_name = "FILE.png")]
    plot: Option<PathBuf>,
    /// Also write the run's figures (tokens/s, ms/step, losses, pool) as one JSON line here.
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
    /// Training rows: fixed windows of the context, or ragged rows cut at line boundaries.
    #[arg(long, value_enum, default_value = "fixed")]
    lengths: LengthsArg,
    /// With ragged rows, the number of sequence buckets the graphed modes capture (1: pad every
    /// step to the context).
    #[arg(long, value_name = "N", default_value_t = 8, value_parser = clap::value_parser!(u64).range(1..=64).map(|n| n as usize))]
    buckets: usize,
    /// With ragged rows and buckets, estimate the graph pool before capturing (and compare).
    #[arg(long)]
    estimate: bool,
    /// With ragged rows, the smallest bucket and the shortest length drawn [default: the
    /// context / 8, at least 16].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(2..).map(|n| n as usize))]
    bucket_min: Option<usize>,
    /// After training, write the weights here (safetensors, named as the model names them).
    #[arg(long, value_name = "PATH")]
    save: Option<PathBuf>,
    /// Skip training and read the weights --save wrote (with that run's --size, --context and
    /// --dtype).
    #[arg(long, value_name = "PATH")]
    load: Option<PathBuf>,
    /// Continue prompts of the validation text with the KV-cache decoder (after training, or
    /// from --load).
    #[arg(long)]
    generate: bool,
    /// Prompts --generate continues in one batch (at most --max-batch).
    #[arg(long, value_name = "N", default_value_t = 4, value_parser = clap::value_parser!(u64).range(1..).map(|n| n as usize))]
    prompts: usize,
    /// The longest prompt of --generate, and every prompt's length in --decode-bench
    /// [default: a quarter of the context].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..).map(|n| n as usize))]
    prompt_len: Option<usize>,
    /// New tokens per prompt; prompt and new tokens must fit the context [default: half the
    /// context].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..).map(|n| n as usize))]
    max_new_tokens: Option<usize>,
    /// Sampling temperature of --generate (0: greedy).
    #[arg(long, value_name = "T", default_value_t = 0.8)]
    temperature: f32,
    /// Sample among the K most likely tokens only (0: all).
    #[arg(long, value_name = "K", default_value_t = 0)]
    top_k: usize,
    /// The largest batch the decoder captures graphs for [default: 64 on a GPU, 8 on the host].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..=1024).map(|n| n as usize))]
    max_batch: Option<usize>,
    /// Skip training and time decoding at batch 1, 2, 4, ... --max-batch (greedy, no end
    /// token), writing --json and the --plot chart of tokens/s by batch size.
    #[arg(long)]
    decode_bench: bool,
    /// --decode-bench times only the batches of at least N (a profiler's run of one batch).
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=1024).map(|n| n as usize))]
    bench_min_batch: usize,
    /// Decode with the training forward's ops (separate q, k and v GEMMs, the cache append its
    /// own kernel) instead of the fused step.
    #[arg(long)]
    unfused_decode: bool,
    /// The largest batch the fused step runs as one kernel [default: the step's, 64]; larger
    /// batches run the unfused ops.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(0..=64).map(|n| n as usize))]
    fused_batch_limit: Option<usize>,
}

/// How training rows are cut.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum LengthsArg {
    /// windows of exactly the context
    Fixed,
    /// rows of different lengths cut at line boundaries, padded to a sequence bucket
    Ragged,
}

/// `n` sequence buckets from `min` to `context`, geometric, each rounded up to a multiple of 16
/// (of 64 from 256 on: whole attention tiles), without repeats; the last is the context.
fn bucket_sizes(min: usize, context: usize, n: usize) -> Vec<usize> {
    let min = min.clamp(1, context) as f64;
    let mut sizes: Vec<usize> = (0..n)
        .map(|k| {
            let s = if n == 1 { context as f64 } else { min * (context as f64 / min).powf(k as f64 / (n - 1) as f64) };
            let unit = if s >= 256.0 { 64 } else { 16 };
            (s.round() as usize).div_ceil(unit).saturating_mul(unit).min(context)
        })
        .collect();
    sizes.push(context);
    sizes.sort_unstable();
    sizes.dedup();
    sizes
}

/// A dropout probability in [0, 1).
fn probability(s: &str) -> std::result::Result<f32, String> {
    match s.parse::<f32>() {
        Ok(p) if (0.0..1.0).contains(&p) => Ok(p),
        Ok(p) => Err(format!("{p} is not in [0, 1)")),
        Err(e) => Err(e.to_string()),
    }
}

impl Args {
    fn mode(&self) -> Mode {
        if self.eager {
            Mode::Eager
        } else {
            self.mode.into()
        }
    }

    fn config(&self, dev: &Device) -> Config {
        let dtype = match self.dtype {
            Some(DTypeArg::F32) => DType::F32,
            Some(DTypeArg::Bf16) => DType::BF16,
            None if dev.is_cuda() => DType::BF16,
            None => DType::F32,
        };
        let (dropout, fused_attention) = (self.dropout, self.attention == AttentionArg::Fused);
        let tiny = Config {
            layers: 3,
            d_model: 96,
            heads: 4,
            context: 96,
            batch: 8,
            hidden: 256,
            dropout,
            dtype,
            fused_attention,
            recompute: self.recompute.into(),
        };
        let gpu = Config {
            layers: 8,
            d_model: 512,
            heads: 8,
            context: 256,
            batch: 16,
            hidden: 1368,
            dropout,
            dtype,
            fused_attention,
            recompute: self.recompute.into(),
        };
        let c = match self.size {
            Some(Size::Tiny) => tiny,
            Some(Size::Gpu) => gpu,
            None if dev.is_cuda() => gpu,
            None => tiny,
        };
        // `--context N` and `--batch N` change the size's sequence length and batch.
        Config { context: self.context.unwrap_or(c.context), batch: self.batch.unwrap_or(c.batch), ..c }
    }
}

/// What a run measured.
struct Measured {
    train_curve: Vec<(usize, f32)>,
    val_curve: Vec<(usize, f32)>,
    /// Seconds of training after the first 10 steps (evaluation excluded).
    steady_secs: f64,
    steady_steps: usize,
    /// Real tokens trained on after the first 10 steps.
    steady_tokens: f64,
    /// Token positions computed (real and padding) after the first 10 steps.
    steady_positions: f64,
    /// Bytes every pool of the device held once training ran, before the first evaluation
    /// (whose eager forward grows the default pool): the graph pool, and outside it the
    /// weights, the f32 masters and grads, the optimizer's moments and the data, which is what
    /// PyTorch's reserved memory counts too.
    device_bytes: usize,
}

/// Batches of the validation text at each evaluation, and at the last one.
const VAL_BATCHES: usize = 4;
const FINAL_VAL_BATCHES: usize = 32;

/// The training loop: progress lines, validation every `eval_every` steps ([`VAL_BATCHES`]
/// batches; [`FINAL_VAL_BATCHES`] after the last step).
fn train(
    trainer: &mut Trainer,
    splits: &corpus::Splits,
    steps: usize,
    eval_every: usize,
    lengths: Lengths,
    seed: u64,
) -> Result<Measured> {
    let (cfg, dev) = (trainer.cfg, trainer.device().clone());
    let (mut rng, mut val_rng) = (Rng((0x9E37_79B9_7F4A_7C15 ^ seed.wrapping_mul(0x2545_F491_4F6C_DD1D)) | 1), Rng(42));
    let mut m = Measured {
        train_curve: Vec::new(),
        val_curve: Vec::new(),
        steady_secs: 0.0,
        steady_steps: 0,
        steady_tokens: 0.0,
        steady_positions: 0.0,
        device_bytes: 0,
    };
    let (t0, mut lap) = (Instant::now(), Instant::now());
    let (mut tokens_all, mut positions_all) = (0.0, 0.0);
    for step in 1..=steps {
        let n = trainer.mode.microbatches();
        let (batches, tokens, positions) = match lengths {
            Lengths::Fixed => {
                let tokens = (cfg.batch * cfg.context) as f64;
                (corpus::microbatches(&dev, &splits.train, cfg.batch, n, cfg.context, &mut rng)?, tokens, tokens)
            }
            Lengths::Ragged { min } => {
                let r = corpus::ragged_batch(&dev, &splits.train, cfg.batch, cfg.context, min, &mut rng)?;
                let bucket = trainer.bucket_of(r.ids.dims()[1]);
                let batch = if trainer.mode == Mode::Eager || trainer.buckets().is_some() {
                    (r.ids, r.labels)
                } else {
                    trainer.padded(&r.ids, &r.labels, cfg.context)?
                };
                (vec![batch], r.tokens as f64, (cfg.batch * bucket) as f64)
            }
        };
        let loss = trainer.step(&batches)?;
        tokens_all += tokens;
        positions_all += positions;
        if step > 10.min(steps) {
            m.steady_tokens += tokens;
            m.steady_positions += positions;
        }
        if step == 10.min(steps) {
            dev.synchronize()?;
            lap = Instant::now();
        }
        if step == 1 || step % (steps / 100).max(1) == 0 || step == steps {
            m.train_curve.push((step, loss.to_vec()?[0]));
        }
        if step == 1 || step % (steps / 20).max(1) == 0 || step == steps {
            let (l, secs) = (loss.to_vec()?[0], t0.elapsed().as_secs_f64());
            let eta = secs / step as f64 * (steps - step) as f64;
            let rate = tokens_all / secs;
            let waste = match lengths {
                Lengths::Fixed => String::new(),
                Lengths::Ragged { .. } => format!(
                    "  padding {:>4.1}% (this step {:>4.1}%)",
                    100.0 * (1.0 - tokens_all / positions_all),
                    100.0 * (1.0 - tokens / positions)
                ),
            };
            println!("step {step:>5}/{steps}  loss {l:.4}  {rate:>9.0} tokens/s  ETA {eta:>6.1} s{waste}");
        }
        if step % eval_every == 0 || step == steps {
            dev.synchronize()?;
            if m.device_bytes == 0 {
                m.device_bytes = dev.reserved_bytes();
            }
            if step > 10.min(steps) {
                m.steady_secs += lap.elapsed().as_secs_f64();
            }
            // The last evaluation takes more batches: four random windows a batch wander by
            // several hundredths from one evaluation to the next.
            let batches = if step == steps { FINAL_VAL_BATCHES } else { VAL_BATCHES };
            let mut total = 0.0;
            for _ in 0..batches {
                let (ids, labels) = corpus::batch(&dev, &splits.val, cfg.batch, cfg.context, &mut val_rng)?;
                total += trainer.eval_loss(&ids, &labels)?;
            }
            let val = total / batches as f32;
            let note = if step == steps { format!(" ({batches} batches)") } else { String::new() };
            println!("step {step:>5}/{steps}  validation loss {val:.4}{note}");
            m.val_curve.push((step, val));
            lap = Instant::now();
        }
    }
    m.steady_steps = steps.saturating_sub(10);
    Ok(m)
}

/// How a run cuts its training rows.
#[derive(Clone, Copy, Debug)]
enum Lengths {
    Fixed,
    /// Ragged rows, the shortest length drawn `min`.
    Ragged {
        min: usize,
    },
}

/// Runs the job; an error is printed as its message (what went wrong and what to do), not as
/// its debug form, and the process exits with status 1.
fn main() -> std::process::ExitCode {
    match run() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn run() -> Result<()> {
    let args = Args::parse();
    let dev = Device::default_device();
    let cfg = args.config(&dev);
    let mode = args.mode();
    let steps = args.steps.unwrap_or(if dev.is_cuda() { 2000 } else { 500 });
    let eval_every = args.eval_every.map_or((steps / 10).max(1), |n| n as usize);
    let text = corpus::load(Path::new("."), args.data.as_deref())?;
    let splits = corpus::Splits::new(text, cfg.context)?;
    if args.load.is_some() || args.decode_bench {
        // No training: the saved weights, or (for the bench) random ones.
        let gpt = Gpt::new(&dev, &cfg, 7)?;
        let blocks: Vec<&model::Block> = gpt.blocks.iter().collect();
        let weights = Weights::of(&gpt.embed, &blocks, &gpt.head);
        let what = format!("{} layers, d_model {}, {}", cfg.layers, cfg.d_model, cfg.dtype);
        match &args.load {
            Some(path) => {
                graphed::load_safetensors(&weights, path)?;
                println!("GPT weights from {}: {what}", path.display());
            }
            None => println!("GPT with random weights (decoding speed does not depend on them): {what}"),
        }
        return generation(&args, &dev, &cfg, &weights, &splits.val);
    }
    let checkpoint = matches!(mode, Mode::Graphed | Mode::Fused) && !args.no_checkpoint;
    let ck = if checkpoint { ", odd blocks checkpointed" } else { "" };
    println!(
        "GPT on {}: {} layers, d_model {}, {} heads, context {}, batch {}, vocab 256 (bytes), {}; {} training / {} validation bytes; {}{ck}",
        dev.name(),
        cfg.layers,
        cfg.d_model,
        cfg.heads,
        cfg.context,
        cfg.batch,
        cfg.dtype,
        splits.train.len(),
        splits.val.len(),
        mode.name(),
    );
    let t0 = Instant::now();
    let warmup = args.warmup.unwrap_or((steps / 20).max(1)).min(steps);
    let (peak, total) =
        (args.lr.unwrap_or(peak_lr(&cfg)), u32::try_from(steps).map_err(|e| Error::msg(format!("--steps: {e}")))?);
    let schedule = WarmupCosine { peak, floor: peak / 10.0, warmup: warmup as u32, total };
    let graphed_mode = matches!(mode, Mode::Graphed | Mode::Fused);
    let lengths = match args.lengths {
        LengthsArg::Fixed => Lengths::Fixed,
        LengthsArg::Ragged => Lengths::Ragged { min: args.bucket_min.unwrap_or((cfg.context / 8).max(16)) },
    };
    if matches!(lengths, Lengths::Ragged { .. }) && matches!(mode, Mode::Pipeline | Mode::PipelineEager) {
        return Err(Error::msg("--lengths ragged runs one batch per step: use --mode graphed, fused, floor or eager"));
    }
    let buckets = match lengths {
        Lengths::Ragged { min } if graphed_mode && args.buckets > 1 => {
            Some(bucket_sizes(min, cfg.context, args.buckets))
        }
        _ => None,
    };
    // The pool the buckets will need, estimated before they are captured.
    let estimate = match &buckets {
        Some(b) if args.estimate => {
            let e = runner::estimate_bucket_pool(&dev, &cfg, checkpoint, b)?;
            let mb = e.bytes as f64 / 1e6;
            println!("estimated graph pool for sequence buckets {b:?}: {mb:.1} MB (probes {:?})", e.probes);
            Some(e.bytes)
        }
        _ => None,
    };
    // --seed is at most 1,000,000 (its parser), so the weights' seeds cannot overflow.
    let seed = 7 + 1000 * args.seed;
    let mut trainer = Trainer::with_buckets(&dev, cfg, seed, (peak, args.weight_decay), mode, checkpoint, buckets)?
        .with_schedule(schedule)?;
    let setup = t0.elapsed().as_secs_f64();
    let pool_at_start = trainer.pool_bytes();
    if graphed_mode {
        let mb = pool_at_start as f64 / 1e6;
        println!("captured {} modules in {setup:.1} s; graph pool {mb:.1} MB", cfg.layers + 2);
        if let Some(e) = estimate {
            let off = 100.0 * (e as f64 - pool_at_start as f64) / pool_at_start.max(1) as f64;
            println!("  the estimate was {:.1} MB: {off:+.1}% of the real pool", e as f64 / 1e6);
        }
        for r in trainer.bucket_reports() {
            println!(
                "  sequence bucket {:>5}: captured in {:>6.1} ms, pool +{:>7.1} MB (reserved {:.1} MB)",
                r.size,
                r.capture_time.as_secs_f64() * 1e3,
                r.added_bytes as f64 / 1e6,
                r.reserved_bytes as f64 / 1e6
            );
        }
    }
    let m = train(&mut trainer, &splits, steps, eval_every, lengths, args.seed)?;
    dev.synchronize()?;
    let pool_mb = trainer.pool_bytes() as f64 / 1e6;
    let device_mb = m.device_bytes as f64 / 1e6;
    if graphed_mode && trainer.pool_bytes() != pool_at_start {
        return Err(Error::msg("the graph pool grew during training: something was captured again"));
    }
    let rate = m.steady_tokens / m.steady_secs.max(1e-9);
    let waste = 1.0 - m.steady_tokens / m.steady_positions.max(1.0);
    let step_ms = m.steady_secs / m.steady_steps.max(1) as f64 * 1e3;
    println!("trained {steps} steps in {:.1} s: {rate:.0} tokens/s, {step_ms:.2} ms/step after step 10 (evaluation excluded); graph pool {pool_mb:.1} MB, every pool of the device {device_mb:.1} MB (before evaluation)", t0.elapsed().as_secs_f64() - setup);
    if let Lengths::Ragged { .. } = lengths {
        let buckets =
            trainer.buckets().map_or(String::from("none (every step padded to the context)"), |b| format!("{b:?}"));
        println!("ragged rows: {:.1}% of the computed positions were padding; sequence buckets {buckets}; no capture after setup", 100.0 * waste);
    }
    if let Some(path) = &args.json {
        let (first, last) = (m.train_curve.first().map_or(0.0, |p| p.1), m.train_curve.last().map_or(0.0, |p| p.1));
        let val = m.val_curve.last().map_or(0.0, |p| p.1);
        // Per bucket: size, capture ms, MB added to the pool; and the estimate, if made.
        let reports: Vec<String> = trainer
            .bucket_reports()
            .iter()
            .map(|r| {
                format!("[{}, {:.2}, {:.3}]", r.size, r.capture_time.as_secs_f64() * 1e3, r.added_bytes as f64 / 1e6)
            })
            .collect();
        let estimate_mb = estimate.map_or(String::from("null"), |e| format!("{:.2}", e as f64 / 1e6));
        let json = format!(
            "{{\"mode\": \"{mode:?}\", \"dtype\": \"{}\", \"checkpoint\": {checkpoint}, \"recompute\": \"{}\", \"context\": {}, \"batch\": {}, \"lengths\": \"{:?}\", \"buckets\": {}, \"bucket_reports\": [{}], \"estimate_mb\": {estimate_mb}, \"padding\": {waste:.4}, \"tokens_per_s\": {rate:.1}, \"step_ms\": {step_ms:.4}, \"setup_s\": {setup:.3}, \"pool_mb\": {pool_mb:.2}, \"device_mb\": {device_mb:.2}, \"loss_first\": {first}, \"loss_last\": {last}, \"val_last\": {val}}}\n",
            cfg.dtype,
            format!("{:?}", cfg.recompute).to_lowercase(),
            cfg.context,
            cfg.batch,
            args.lengths,
            trainer.buckets().map_or(1, <[usize]>::len),
            reports.join(", "),
        );
        std::fs::write(path, json).map_err(|e| Error::msg(format!("--json {}: {e}", path.display())))?;
    }
    let png = args.plot.clone().unwrap_or_else(|| std::env::temp_dir().join("graphed-gpt-loss.png"));
    let title = format!(
        "GPT loss: {} layers, d_model {}, {} on {}, {}{ck}",
        cfg.layers,
        cfg.d_model,
        cfg.dtype,
        dev.name(),
        mode.name()
    );
    plot::write_loss_png(&png, &title, &m.train_curve, &m.val_curve)?;
    println!("loss chart: {}", png.display());
    let blocks = (0..cfg.layers).map(|i| trainer.block(i)).collect::<Result<Vec<_>>>()?;
    let weights = Weights::of(trainer.embed()?, &blocks, trainer.head()?);
    if let Some(path) = &args.save {
        graphed::save_safetensors(&weights, path)?;
        println!("weights saved to {}", path.display());
    }
    if args.generate {
        return generation(&args, &dev, &cfg, &weights, &splits.val);
    }
    let prompt = &splits.val[..cfg.context.min(32)];
    let sample = trainer.generate(prompt, 200, &mut Rng(3))?;
    println!(
        "\nprompt:\n{}\n\n200 generated bytes:\n{}",
        String::from_utf8_lossy(prompt),
        String::from_utf8_lossy(&sample)
    );
    Ok(())
}

/// `--generate` and `--decode-bench` with `weights` (the trained model's, loaded, or random),
/// prompts cut from `text`.
fn generation(args: &Args, dev: &Device, cfg: &Config, weights: &Weights, text: &[u8]) -> Result<()> {
    let max_batch = args.max_batch.unwrap_or(if dev.is_cuda() { 64 } else { 8 });
    let prompt_len = args.prompt_len.unwrap_or((cfg.context / 4).max(1));
    let new_tokens = args.max_new_tokens.unwrap_or((cfg.context / 2).max(1));
    if prompt_len + new_tokens > cfg.context {
        return Err(Error::SequenceTooLong {
            op: "gpt --generate",
            len: prompt_len + new_tokens,
            context: cfg.context,
        });
    }
    if args.generate && args.prompts > max_batch {
        return Err(Error::msg(format!("--prompts {} is above --max-batch {max_batch}", args.prompts)));
    }
    if args.decode_bench && args.bench_min_batch > max_batch {
        return Err(Error::msg(format!(
            "--bench-min-batch {} is above --max-batch {max_batch}: no batch to time",
            args.bench_min_batch
        )));
    }
    // Prefill buckets: the powers of two from 16 below the prompt length, and the prompt length.
    let mut prompt_buckets: Vec<usize> = (4..12).map(|i| 1usize << i).filter(|&b| b < prompt_len).collect();
    prompt_buckets.push(prompt_len);
    let model = format!(
        "{} layers, d_model {}, {} heads, context {}, {}",
        cfg.layers, cfg.d_model, cfg.heads, cfg.context, cfg.dtype
    );
    let setup = generate::Setup { text, prompt_len, new_tokens, min_batch: args.bench_min_batch };
    let opts = |sampling| DecodeOptions {
        max_batch,
        max_len: cfg.context,
        prompt_buckets: prompt_buckets.clone(),
        sampling,
        seed: 3,
        graphs: true,
        fused_step: !args.unfused_decode,
        fused_batch_limit: args.fused_batch_limit,
    };
    if args.generate {
        let sampling = Sampling { temperature: args.temperature, top_k: args.top_k };
        let mut dec = Decoder::new(dev, weights.share(), opts(sampling))?;
        generate::generate(&mut dec, &setup, args.prompts)?;
    }
    if args.decode_bench {
        let mut dec = Decoder::new(dev, weights.share(), opts(Sampling::greedy()))?;
        let (capture, graphs, pool) = dec.capture_report();
        let step = if args.unfused_decode {
            "the training forward's ops".to_string()
        } else {
            let one = dec.fused().is_some_and(|f| f.step.is_fused());
            let how = if one { "one kernel a step" } else { "the unfused ops" };
            format!("fused ({how})")
        };
        println!(
            "decoding {model} on {}: {graphs} graphs (decode steps at batches {:?}, prefills at prompt lengths {prompt_buckets:?}) captured in {:.2} s, graph pool {:.1} MB; decode step: {step}",
            dev.name(),
            decode::batch_buckets(max_batch),
            capture.as_secs_f64(),
            pool as f64 / 1e6
        );
        let rows = generate::bench(&mut dec, &setup, if dev.is_cuda() { 5 } else { 2 })?;
        let report = generate::BenchReport {
            device: dev.name(),
            model,
            s: &setup,
            rows: &rows,
            capture_s: capture.as_secs_f64(),
            graphs,
            pool_bytes: pool,
            fused_step: !args.unfused_decode,
            one_kernel_batch: dec.fused().filter(|f| f.step.is_fused()).map_or(0, |f| f.step.fused_batch_limit()),
        };
        let png = args.plot.clone().unwrap_or_else(|| std::env::temp_dir().join("graphed-gpt-decode.png"));
        println!("decoding chart: {}", report.write(args.json.as_deref(), &png)?.display());
    }
    Ok(())
}
