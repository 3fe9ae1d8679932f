//! Fused attention through the runtime: TFLOP/s of `ops::flash_attention` and its backward at
//! sequence 512 to 8192, head dim 64 and 128, causal and not, in bf16 (16384 tokens a call and
//! 2048 features, as the FlashAttention papers measure). Each call is captured in a graph of
//! `LAUNCHES` calls and replayed under `Device::time_ms`, so launch overhead is out of the
//! figure. FLOPs: forward `4 · batch · heads · seq² · head_dim` (halved when causal), backward
//! 2.5 times that (FlashAttention's convention: five products; our backward runs seven, so it
//! stays free of atomics). `bench/flash_sweep.py` prints PyTorch's SDPA beside these.
//!
//! `cargo run --release --example attention_bench [-- --quick] [--json FILE]` (`--help`; a GPU is needed;
//! on the host backend it runs one small case of each kind as a smoke test).

use clap::Parser;
#[path = "common/timing.rs"]
mod timing;

use graphed::ops::{self, Attention, AttentionEngine};
use graphed::{DType, Device, Result, Tensor};

const LAUNCHES: usize = 5;

fn random(dev: &Device, dims: &[usize], seed: u64) -> Result<Tensor> {
    let n: usize = dims.iter().product();
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let v: Vec<f32> = (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 40) as f32 / (1u64 << 24) as f32 * 4.0 - 2.0
        })
        .collect();
    Tensor::from_slice_as(dev, &v, dims, DType::BF16)
}

/// TFLOP/s of `ops::flash_attention` and its backward at sequence 512 to 8192, head dim 64 and
/// 128, causal and not, in bf16 (a GPU is needed for a measurement; on the host backend it runs
/// one small case of each kind).
#[derive(Parser)]
#[command(name = "attention_bench")]
struct Args {
    /// Fewer cases (always so on the host backend).
    #[arg(long)]
    quick: bool,
    /// Also write the results as JSON to this file.
    #[arg(long, value_name = "FILE")]
    json: Option<String>,
    /// The engine: auto (cuDNN where it runs, else portable), portable, cudnn or
    /// cudnn-nondeterministic (the backward with atomics).
    #[arg(long, default_value = "auto", value_parser = ["auto", "portable", "cudnn", "cudnn-nondeterministic"])]
    engine: String,
    /// The GPT example's attention shapes instead (8 heads of 64, causal, 4096 tokens a call:
    /// 16 x 256, 4 x 1024, 1 x 4096), timed in microseconds.
    #[arg(long)]
    gpt: bool,
}

fn main() -> Result<()> {
    let args = Args::parse();
    let dev = Device::default_device();
    let quick = args.quick || !dev.is_cuda();
    let json = args.json;
    let engine = match args.engine.as_str() {
        "portable" => AttentionEngine::Portable,
        "cudnn" => AttentionEngine::Cudnn,
        "cudnn-nondeterministic" => AttentionEngine::CudnnNondeterministic,
        _ => AttentionEngine::Auto,
    };
    if args.gpt {
        return gpt_shapes(&dev, engine);
    }
    println!("fused attention on {}, bf16, TFLOP/s (forward / backward), engine {engine:?}", dev.name());
    println!("| seq | head dim | causal | forward | backward | forward ms | backward ms |");
    println!("|---|---|---|---|---|---|---|");
    let (tokens, width) = if dev.is_cuda() { (16384, 2048) } else { (256, 256) };
    let seqs: &[usize] = if !dev.is_cuda() {
        &[128]
    } else if quick {
        &[1024, 4096]
    } else {
        &[512, 1024, 2048, 4096, 8192]
    };
    let mut rows = Vec::new();
    for head_dim in Attention::HEAD_DIMS {
        for causal in [true, false] {
            for &seq in seqs {
                let (batch, heads) = ((tokens / seq).max(1), width / head_dim);
                let dims = [batch, seq, heads * head_dim];
                let (q, k, v, d) = (
                    random(&dev, &dims, 1)?,
                    random(&dev, &dims, 2)?,
                    random(&dev, &dims, 3)?,
                    random(&dev, &dims, 4)?,
                );
                let at = if causal { Attention::causal(heads) } else { Attention::full(heads) };
                let at = at.engine(engine);
                let (out, lse) = ops::flash_attention(&q, &k, &v, &at)?;
                let reps = if dev.is_cuda() { 20 } else { 1 };
                let fwd =
                    timing::ms_per_call(&dev, LAUNCHES, reps, || ops::flash_attention(&q, &k, &v, &at).map(drop))?;
                let bwd = timing::ms_per_call(&dev, LAUNCHES, reps, || {
                    ops::flash_attention_backward(&d, &q, &k, &v, &out, &lse, &at).map(drop)
                })?;
                let flops = 4.0 * (batch * heads * seq * seq * head_dim) as f64 / if causal { 2.0 } else { 1.0 };
                let (tf, tb) = (flops / fwd / 1e9, 2.5 * flops / bwd / 1e9);
                let ran = ops::attention_engines(&q, &at)?;
                println!(
                    "| {seq} | {head_dim} | {} | {tf:.0} | {tb:.0} | {fwd:.3} | {bwd:.3} | {:?}/{:?}",
                    causal as u8, ran.forward, ran.backward
                );
                rows.push(format!(
                    "{{\"seq\": {seq}, \"head_dim\": {head_dim}, \"causal\": {causal}, \"fwd_tflops\": {tf:.1}, \"bwd_tflops\": {tb:.1}, \"fwd_ms\": {fwd:.4}, \"bwd_ms\": {bwd:.4}, \"engines\": \"{:?}/{:?}\"}}",
                    ran.forward, ran.backward
                ));
            }
        }
    }
    if let Some(path) = json {
        let body = format!("{{\"device\": \"{}\", \"rows\": [\n{}\n]}}\n", dev.name(), rows.join(",\n"));
        std::fs::write(&path, body).map_err(|e| graphed::Error::msg(format!("--json {path}: {e}")))?;
    }
    Ok(())
}

/// `--gpt`: forward and backward microseconds at the GPT example's attention shapes.
fn gpt_shapes(dev: &Device, engine: AttentionEngine) -> Result<()> {
    println!("the GPT's attention on {}, bf16, 8 heads of 64, causal, engine {engine:?}", dev.name());
    println!("| context x batch | forward us | backward us | engines |");
    println!("|---|---|---|---|");
    let shapes: &[(usize, usize)] = if dev.is_cuda() { &[(256, 16), (1024, 4), (4096, 1)] } else { &[(64, 2)] };
    for &(seq, batch) in shapes {
        let dims = [batch, seq, 512];
        let (q, k, v, d) =
            (random(dev, &dims, 1)?, random(dev, &dims, 2)?, random(dev, &dims, 3)?, random(dev, &dims, 4)?);
        let at = Attention::causal(8).engine(engine);
        let (out, lse) = ops::flash_attention(&q, &k, &v, &at)?;
        let reps = if dev.is_cuda() { 20 } else { 1 };
        let fwd = timing::ms_per_call(dev, LAUNCHES, reps, || ops::flash_attention(&q, &k, &v, &at).map(drop))?;
        let bwd = timing::ms_per_call(dev, LAUNCHES, reps, || {
            ops::flash_attention_backward(&d, &q, &k, &v, &out, &lse, &at).map(drop)
        })?;
        let ran = ops::attention_engines(&q, &at)?;
        println!("| {seq} x {batch} | {:.1} | {:.1} | {:?}/{:?} |", fwd * 1e3, bwd * 1e3, ran.forward, ran.backward);
    }
    Ok(())
}
