//! Per-op GPU time against the device-memory bandwidth floor.
//!
//! For each op at one realistic size, captures a graph of `LAUNCHES` launches of the op,
//! replays it many times under `Device::time_ms`, and reports the time per op next to the
//! bytes the op's kernels must move and the time those bytes take at the measured
//! device-to-device copy bandwidth (the floor). A ratio near 1 means the op runs at copy speed;
//! GEMMs are compute-bound, so their ratio is large and their TFLOP/s are printed instead.
//!
//! Every memory-bound op runs in f32 and again in bf16 (16-byte vectorised kernels in both), and
//! the summary prints the worst ratio per dtype against the 1.3x target of #12; GEMMs run in f32
//! and bf16 (tensor cores, f32 accumulation).
//!
//! Then the optimizer over the GPT's parameter set (the example's default GPU configuration: 8
//! layers, d_model 512, hidden 1368, context 256, 76 tensors, 25.6M weights in bf16 with f32
//! masters): one `step_and_zero_grad` with the multi-tensor launch against one launch per
//! tensor, with its bytes against the bandwidth floor and its kernels a step; and the f16 step
//! with a loss scaler: without a scaler (no check), with the update launched at every step
//! (its kernels read the overflow flag), and with the update under the IF node, on good steps
//! and on overflowed ones (every step skipped), and `step()` alone (an IF node with no else
//! body). `--optimizer` runs only this part.
//!
//! Run: `cargo run --release --example op_bench [-- --optimizer | --only NAME,...]` (on the host backend it uses
//! small sizes; `GRAPHED_DEVICE=host` forces it).

#[path = "common/timing.rs"]
mod timing;

use clap::Parser;
use graphed::ops::{self, Gelu};
use graphed::optim::{AdamW, AdamWConfig, Launches, LossScaler, LossScalerConfig, MixedAdamW, Sgd, SgdConfig};
use graphed::{CaptureMode, DType, Device, Generator, Graph, Param, Result, Tensor};

/// Launches of the op per captured graph.
const LAUNCHES: usize = 20;

type OpFn<'a> = Box<dyn FnMut() -> Result<()> + 'a>;

struct Case<'a> {
    name: &'static str,
    dtype: DType,
    size: String,
    /// Bytes the op's kernels read and write at the least (each tensor once per kernel).
    bytes: f64,
    /// Floating-point operations, for GEMMs.
    flops: f64,
    run: OpFn<'a>,
}

/// A memory-bound case moving `bytes`.
fn elementwise<'a>(name: &'static str, size: &str, bytes: f64, run: OpFn<'a>) -> Case<'a> {
    Case { name, dtype: DType::F32, size: size.to_string(), bytes, flops: 0.0, run }
}

/// Device time per launch in microseconds: a graph of `LAUNCHES` launches, replayed `reps`
/// times after one warm-up replay.
fn time_per_launch(dev: &Device, reps: usize, f: &mut OpFn<'_>) -> Result<f64> {
    Ok(timing::ms_per_call(dev, LAUNCHES, reps, f)? * 1e3)
}

/// Each op's GPU time against its device-memory bandwidth floor, in f32 and bf16 (small sizes
/// on the host backend).
#[derive(Parser)]
#[command(name = "op_bench", after_help = "Set GRAPHED_DEVICE=host to run on the CPU when a GPU is present.")]
struct Args {
    /// Only the optimizer over the GPT's parameters: multi-tensor against per-tensor AdamW, and
    /// the loss scaler's IF node against the step without it.
    #[arg(long)]
    optimizer: bool,
    /// Only the ops whose names contain one of these (comma-separated), and not the optimizer:
    /// `--only rms_norm,softmax` times the row kernels alone.
    #[arg(long, value_delimiter = ',')]
    only: Vec<String>,
}

fn main() -> Result<()> {
    let args = Args::parse();
    let dev = Device::default_device();
    let gpu = dev.is_cuda();
    println!("op_bench on {}", dev.name());
    let (rows, cols) = if gpu { (4096usize, 4096usize) } else { (256, 256) };
    let lin = if gpu { 4096usize } else { 128 };
    let reps = if gpu { 20 } else { 2 };
    let n = rows * cols;
    let nb = (n * 4) as f64;
    let size = format!("{rows}x{cols}");

    // Device-to-device copy bandwidth, measured the same way.
    println!("measuring copy bandwidth ({} MiB copies)...", (n * 4) >> 20);
    let (src, dst) = (Tensor::zeros(&dev, &[n])?, Tensor::zeros(&dev, &[n])?);
    let mut copy: OpFn = Box::new(|| ops::copy_(&dst, &src));
    let copy_us = time_per_launch(&dev, reps, &mut copy)?;
    let bandwidth = 2.0 * nb / (copy_us * 1e-6);
    println!("copy: {copy_us:.1} us per {size} copy = {:.0} GB/s (read + write)", bandwidth / 1e9);
    if args.optimizer {
        return optimizer_bench(&dev, reps, bandwidth);
    }

    println!("preparing inputs...");
    let rand = |dims: &[usize], seed: u64| -> Result<Tensor> {
        let len: usize = dims.iter().product();
        let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        let v: Vec<f32> = (0..len)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
            })
            .collect();
        Tensor::from_slice(&dev, &v, dims)
    };
    let (a, b, dy) = (rand(&[rows, cols], 1)?, rand(&[rows, cols], 2)?, rand(&[rows, cols], 3)?);
    let (gamma, beta) = (rand(&[cols], 4)?, rand(&[cols], 5)?);
    let labels = Tensor::from_slice(&dev, &(0..rows).map(|i| (i % cols) as f32).collect::<Vec<_>>(), &[rows])?;
    let rng = Generator::new(&dev, 0)?;
    let (_, mask) = ops::dropout(&a, 0.1, &rng, true)?;
    let mask = mask.expect("training dropout has a mask");
    let (_, mean, rstd) = ops::layer_norm(&a, &gamma, &beta, 1e-5)?;
    let (_, probs) = ops::softmax_cross_entropy(&a, &labels)?;
    let (dgamma, dbeta) = (Tensor::zeros(&dev, &[cols])?, Tensor::zeros(&dev, &[cols])?);
    let (x, w, bias, ly) = (rand(&[lin, lin], 6)?, rand(&[lin, lin], 7)?, rand(&[lin], 8)?, rand(&[lin, lin], 9)?);
    let (dw, db) = (Tensor::zeros(&dev, &[lin, lin])?, Tensor::zeros(&dev, &[lin])?);
    let sgd_p = Param::new(rand(&[rows, cols], 10)?)?;
    let adam_p = Param::new(rand(&[rows, cols], 11)?)?;
    ops::fill_(&sgd_p.grad, 1e-3)?;
    ops::fill_(&adam_p.grad, 1e-3)?;
    let sgd = Sgd::new(&[sgd_p], SgdConfig { lr: 1e-3, momentum: 0.9, weight_decay: 0.0 })?;
    let adam = AdamW::new(&[adam_p], AdamWConfig::default())?;

    // bf16 copies of the inputs, for the same ops in bf16.
    let h = |t: &Tensor| t.to_dtype(DType::BF16);
    let (_, mask16) = ops::dropout(&h(&a)?, 0.1, &rng, true)?;
    let t16 = Bf16Inputs {
        a: h(&a)?,
        b: h(&b)?,
        dy: h(&dy)?,
        bias: h(&gamma)?,
        x: h(&x)?,
        w: h(&w)?,
        lin_bias: h(&bias)?,
        lin_dy: h(&ly)?,
        mask: mask16.expect("training dropout has a mask"),
    };
    // The GPT's row and elementwise kernels in bf16 (RMSNorm, SwiGLU) and AdamW over bf16
    // weights with f32 masters and grads.
    let rstd16 = ops::rms_norm(&t16.a, &t16.bias, 1e-5)?.1;
    let (sum16, _, sum_rstd16) = ops::add_rms_norm(&t16.a, &t16.b, &t16.bias, 1e-5)?;
    let dgamma16 = Tensor::zeros(&dev, &[cols])?;
    let mixed_p = Param::new(h(&rand(&[rows, cols], 12)?)?)?;
    ops::fill_(&mixed_p.grad, 1e-3)?;
    let mixed = MixedAdamW::new(&[mixed_p], AdamWConfig::default(), None)?;
    let gpt = GptOps { rstd: &rstd16, sum: &sum16, sum_rstd: &sum_rstd16, dgamma: &dgamma16, adamw: &mixed };
    let gemm_inputs = GptGemmInputs::new(&dev, gpu)?;
    let xent_inputs = XentInputs::new(&dev, gpu)?;

    let gemm_bytes = 3.0 * (lin * lin * 4) as f64;
    let gemm_flops = 2.0 * (lin as f64).powi(3);
    let ew = |name: &'static str, tensors: f64, run| elementwise(name, &size, tensors * nb, run);
    let mut cases: Vec<Case> = vec![
        ew("add", 3.0, Box::new(|| ops::add(&a, &b).map(drop))),
        ew("mul", 3.0, Box::new(|| ops::mul(&a, &b).map(drop))),
        ew("scale", 2.0, Box::new(|| ops::scale(&a, 0.5).map(drop))),
        ew("bias_add", 2.0, Box::new(|| ops::bias_add(&a, &gamma).map(drop))),
        ew("relu", 2.0, Box::new(|| ops::relu(&a).map(drop))),
        ew("relu_backward", 3.0, Box::new(|| ops::relu_backward(&dy, &a).map(drop))),
        ew("gelu (erf)", 2.0, Box::new(|| ops::gelu(&a, Gelu::Erf).map(drop))),
        ew("gelu (tanh)", 2.0, Box::new(|| ops::gelu(&a, Gelu::Tanh).map(drop))),
        ew("gelu_backward (erf)", 3.0, Box::new(|| ops::gelu_backward(&dy, &a, Gelu::Erf).map(drop))),
        ew("dropout", 3.0, Box::new(|| ops::dropout(&a, 0.1, &rng, true).map(drop))),
        ew("dropout_backward", 3.0, Box::new(|| ops::dropout_backward(&dy, &mask).map(drop))),
        ew("sum", 1.0, Box::new(|| ops::sum(&a).map(drop))),
        ew("mean", 1.0, Box::new(|| ops::mean(&a).map(drop))),
        ew("layer_norm", 2.0, Box::new(|| ops::layer_norm(&a, &gamma, &beta, 1e-5).map(drop))),
        // dy and x read, dx written: the op's floor (the two-kernel form off sm_90 reads dy and
        // x twice, the one-pass form once, plus the parameters' grads a block).
        ew(
            "layer_norm_backward",
            3.0,
            Box::new(|| ops::layer_norm_backward(&dy, &a, &gamma, &mean, &rstd, &dgamma, &dbeta).map(drop)),
        ),
        ew("softmax_cross_entropy", 2.0, Box::new(|| ops::softmax_cross_entropy(&a, &labels).map(drop))),
        ew(
            "softmax_xent_backward",
            2.0,
            Box::new(|| ops::softmax_cross_entropy_backward(&probs, &labels, 1.0).map(drop)),
        ),
        ew("mse_loss", 2.0, Box::new(|| ops::mse_loss(&a, &b).map(drop))),
        ew("mse_backward", 3.0, Box::new(|| ops::mse_backward(&a, &b, 1.0).map(drop))),
        // p, g, buf read; p, buf written.
        ew("sgd step (momentum)", 5.0, Box::new(|| sgd.step())),
        // p, g, m, v read; p, m, v written.
        ew("adamw step", 7.0, Box::new(|| adam.step())),
        Case {
            name: "linear (+bias)",
            dtype: DType::F32,
            size: format!("{lin}x{lin}x{lin}"),
            bytes: gemm_bytes,
            flops: gemm_flops,
            run: Box::new(|| ops::linear(&x, &w, Some(&bias)).map(drop)),
        },
        Case {
            name: "linear_backward",
            dtype: DType::F32,
            size: format!("{lin}x{lin}x{lin}"),
            bytes: 2.0 * gemm_bytes,
            flops: 2.0 * gemm_flops,
            run: Box::new(|| ops::linear_backward(&ly, &x, &w, &dw, Some(&db), true).map(drop)),
        },
    ];

    cases.extend(bf16_cases(&t16, &a, &rng, (&dw, &db), &size, lin));
    cases.extend(gpt_cases(&t16, &gpt, &size));
    cases.extend(gpt_gemm_cases(&gemm_inputs));
    cases.extend(xent_cases(&xent_inputs));

    if !args.only.is_empty() {
        // A name that matches no op is refused before anything is timed, with the names there are.
        if let Some(o) = args.only.iter().find(|o| !cases.iter().any(|c| c.name.contains(o.as_str()))) {
            let mut names: Vec<&str> = Vec::new();
            for c in &cases {
                if !names.contains(&c.name) {
                    names.push(c.name);
                }
            }
            let detail = format!("--only {o:?} names no op; the ops are: {}", names.join(", "));
            return Err(graphed::Error::InvalidArgument { op: "op_bench", detail });
        }
        cases.retain(|c| args.only.iter().any(|o| c.name.contains(o.as_str())));
    }
    let mut rows_out = Vec::new();
    let total = cases.len();
    for (i, c) in cases.iter_mut().enumerate() {
        println!("[{}/{total}] {} {} {}...", i + 1, c.name, c.dtype, c.size);
        let us = time_per_launch(&dev, reps, &mut c.run)?;
        rows_out.push((c.name, c.dtype, c.size.clone(), us, c.bytes, c.flops));
    }

    gemm_step_total(&rows_out, &gemm_inputs);
    report(rows_out, reps, bandwidth);
    if !args.only.is_empty() {
        return Ok(());
    }
    optimizer_bench(&dev, reps, bandwidth)
}

/// The GPT's parameter shapes (examples/gpt: embeddings, per block two norms, four attention
/// and three MLP weights, the final norm and the head): the GPU default configuration, or a
/// small one on the host backend.
fn gpt_shapes(gpu: bool) -> Vec<Vec<usize>> {
    let (layers, d, hidden, context, vocab) = if gpu { (8, 512, 1368, 256, 256) } else { (2, 64, 160, 32, 256) };
    let mut shapes = vec![vec![vocab, d], vec![context, d]];
    for _ in 0..layers {
        shapes.extend([vec![d], vec![d, d], vec![d, d], vec![d, d], vec![d, d], vec![d]]);
        shapes.extend([vec![hidden, d], vec![hidden, d], vec![d, hidden]]);
    }
    shapes.extend([vec![d], vec![vocab, d]]);
    shapes
}

/// The GPT's parameters in `dtype` with small grads.
fn gpt_params(dev: &Device, dtype: DType) -> Result<Vec<Param>> {
    gpt_shapes(dev.is_cuda())
        .iter()
        .map(|dims| {
            let p = Param::new(Tensor::full_as(dev, dims, 0.5, dtype)?)?;
            graphed::ops::fill_(&p.grad, 1e-3)?;
            Ok(p)
        })
        .collect()
}

/// Kernel launches in one captured call of `f` (the graph's top-level kernel nodes).
fn kernels_per_call(dev: &Device, f: &mut OpFn<'_>) -> Result<usize> {
    let mut g = Graph::new(dev);
    g.capture(CaptureMode::Global, f)?;
    Ok(g.nodes()?.iter().filter(|n| n.kernel.is_some()).count())
}

/// AdamW over the GPT's parameters, multi-tensor against per-tensor, and the loss scaler's IF
/// node against the f16 step without a check and with the update always launched.
fn optimizer_bench(dev: &Device, reps: usize, bandwidth: f64) -> Result<()> {
    let cfg = AdamWConfig::default();
    let bf16 = gpt_params(dev, DType::BF16)?;
    let elements: usize = bf16.iter().map(|p| p.value.numel()).sum();
    let multi = MixedAdamW::new(&bf16, cfg, None)?;
    let per_tensor = MixedAdamW::new(&bf16, cfg, None)?.with_launches(Launches::PerTensor);
    // Read: master, grad, two moments; written: master, moments, the bf16 weight, the zeroed grad.
    let bytes = (elements * (16 + 12 + 2 + 4)) as f64;
    let floor = bytes / bandwidth * 1e6;
    println!();
    println!(
        "AdamW step_and_zero_grad over the GPT's parameters: {} tensors, {:.1}M weights (bf16, f32 masters), {:.0} MB moved, floor {floor:.1} us",
        bf16.len(),
        elements as f64 / 1e6,
        bytes / 1e6
    );
    let mut ran: Vec<(&str, f64, usize)> = Vec::new();
    for (name, opt) in [("multi-tensor", &multi), ("per-tensor", &per_tensor)] {
        let mut step: OpFn = Box::new(|| opt.step_and_zero_grad());
        let launches = kernels_per_call(dev, &mut step)?;
        let us = time_per_launch(dev, reps, &mut step)?;
        println!("  {name:<13} {us:>9.1} us  {launches:>3} kernels a step  {:.2}x the floor", us / floor);
        ran.push((name, us, launches));
    }
    if let [(_, mt, _), (_, pt, _)] = ran[..] {
        println!("  multi-tensor saves {:.1} us a step ({:.2}x faster)", pt - mt, pt / mt);
    }

    // The f16 step with a loss scaler, its grads finite (good steps) or not (every step skipped).
    let plain = MixedAdamW::new(&gpt_params(dev, DType::BF16)?, cfg, None)?;
    let scaled = |node: bool| -> Result<(Vec<Param>, MixedAdamW)> {
        let ps = gpt_params(dev, DType::F16)?;
        let scaler = LossScaler::new(
            dev,
            LossScalerConfig { init_scale: 1.0, growth_interval: u32::MAX, ..Default::default() },
        )?;
        let opt = MixedAdamW::new(&ps, cfg, Some(scaler))?.with_conditional_skip(node);
        Ok((ps, opt))
    };
    let ((_, launched), (_, under_if)) = (scaled(false)?, scaled(true)?);
    let ((bad_ps, bad_launched), (bad_ps_if, bad_under_if)) = (scaled(false)?, scaled(true)?);
    for ps in [&bad_ps, &bad_ps_if] {
        ps[1].grad.copy_from_slice(&vec![f32::INFINITY; ps[1].grad.numel()])?;
    }
    println!("the f16 step with a loss scaler (same weights; overflowed steps run step(), so every step skips):");
    let cases: [(&str, &MixedAdamW, bool); 7] = [
        ("no scaler (no check; bf16)", &plain, true),
        ("scaler, update launched", &launched, true),
        ("scaler, IF node", &under_if, true),
        ("overflow, update launched", &bad_launched, false),
        ("overflow, IF node", &bad_under_if, false),
        // step() without the zeroing: one IF node with no else body.
        ("step(), update launched", &launched, false),
        ("step(), IF node", &under_if, false),
    ];
    let mut us = Vec::new();
    for (name, opt, zero) in cases {
        let mut step: OpFn = Box::new(move || if zero { opt.step_and_zero_grad() } else { opt.step() });
        let launches = kernels_per_call(dev, &mut step)?;
        let t = time_per_launch(dev, reps, &mut step)?;
        println!("  {name:<28} {t:>9.1} us  {launches:>3} top-level kernels a step");
        us.push(t);
    }
    let overhead = us[2] - us[1];
    let verdict = if overhead <= 5.0 { "PASS" } else { "MISS" };
    println!(
        "  IF node: {overhead:+.1} us on a good step against the update launched (target <= 5 us: {verdict}); a skipped step {:.1} us against {:.1} us; the check (unscale pass, flag, IF node) costs {:+.1} us over no scaler",
        us[4], us[3], us[2] - us[0]
    );
    println!(
        "  step() (an IF node with no else body, nothing zeroed): {:+.1} us on a good step against the update launched ({:.1} against {:.1} us)",
        us[6] - us[5],
        us[6],
        us[5]
    );
    Ok(())
}

/// The bf16 inputs of [`bf16_cases`].
struct Bf16Inputs {
    a: Tensor,
    b: Tensor,
    dy: Tensor,
    bias: Tensor,
    x: Tensor,
    w: Tensor,
    lin_bias: Tensor,
    lin_dy: Tensor,
    mask: Tensor,
}

/// The memory-bound ops, the casts and the GEMMs in bf16 (`a32` is the f32 source of the casts;
/// `grads` the f32 weight and bias grads of the GEMM backward).
fn bf16_cases<'a>(
    t: &'a Bf16Inputs,
    a32: &'a Tensor,
    rng: &'a Generator,
    (dw, db): (&'a Tensor, &'a Tensor),
    size: &str,
    lin: usize,
) -> Vec<Case<'a>> {
    let (nb16, nb32) = ((t.a.numel() * 2) as f64, (t.a.numel() * 4) as f64);
    let ew16 = |name: &'static str, bytes: f64, run| Case { dtype: DType::BF16, ..elementwise(name, size, bytes, run) };
    let gemm = |name: &'static str, bytes: f64, flops: f64, run| Case {
        name,
        dtype: DType::BF16,
        size: format!("{lin}x{lin}x{lin}"),
        bytes,
        flops,
        run,
    };
    let (gemm_bytes, gemm_flops) = (3.0 * (lin * lin * 2) as f64, 2.0 * (lin as f64).powi(3));
    vec![
        ew16("add", 3.0 * nb16, Box::new(|| ops::add(&t.a, &t.b).map(drop))),
        ew16("mul", 3.0 * nb16, Box::new(|| ops::mul(&t.a, &t.b).map(drop))),
        ew16("scale", 2.0 * nb16, Box::new(|| ops::scale(&t.a, 0.5).map(drop))),
        ew16("bias_add", 2.0 * nb16, Box::new(|| ops::bias_add(&t.a, &t.bias).map(drop))),
        ew16("relu", 2.0 * nb16, Box::new(|| ops::relu(&t.a).map(drop))),
        ew16("gelu (erf)", 2.0 * nb16, Box::new(|| ops::gelu(&t.a, Gelu::Erf).map(drop))),
        ew16("gelu_backward (erf)", 3.0 * nb16, Box::new(|| ops::gelu_backward(&t.dy, &t.a, Gelu::Erf).map(drop))),
        ew16("gelu (tanh)", 2.0 * nb16, Box::new(|| ops::gelu(&t.a, Gelu::Tanh).map(drop))),
        ew16("gelu_backward (tanh)", 3.0 * nb16, Box::new(|| ops::gelu_backward(&t.dy, &t.a, Gelu::Tanh).map(drop))),
        ew16("dropout", 3.0 * nb16, Box::new(|| ops::dropout(&t.a, 0.1, rng, true).map(drop))),
        ew16("dropout_backward", 3.0 * nb16, Box::new(|| ops::dropout_backward(&t.dy, &t.mask).map(drop))),
        ew16("sum", nb16, Box::new(|| ops::sum(&t.a).map(drop))),
        ew16("mse_backward", 3.0 * nb16, Box::new(|| ops::mse_backward(&t.a, &t.b, 1.0).map(drop))),
        ew16("cast f32 -> bf16", nb32 + nb16, Box::new(|| ops::cast(a32, DType::BF16).map(drop))),
        ew16("cast bf16 -> f32", nb32 + nb16, Box::new(|| ops::cast(&t.a, DType::F32).map(drop))),
        gemm(
            "linear (+bias)",
            gemm_bytes,
            gemm_flops,
            Box::new(|| ops::linear(&t.x, &t.w, Some(&t.lin_bias)).map(drop)),
        ),
        gemm(
            "linear_backward",
            2.0 * gemm_bytes,
            2.0 * gemm_flops,
            Box::new(|| ops::linear_backward(&t.lin_dy, &t.x, &t.w, dw, Some(db), true).map(drop)),
        ),
        // A projection back to a residual stream (`lin_dy` as the residual): the GEMM then an
        // add pass, against the residual added in the GEMM (read once, no second pass).
        gemm(
            "linear, then add",
            gemm_bytes + 3.0 * (lin * lin * 2) as f64,
            gemm_flops,
            Box::new(|| ops::add(&ops::linear(&t.x, &t.w, None)?, &t.lin_dy).map(drop)),
        ),
        gemm(
            "linear_residual",
            gemm_bytes + (lin * lin * 2) as f64,
            gemm_flops,
            Box::new(|| ops::linear_residual(&t.x, &t.w, &t.lin_dy).map(drop)),
        ),
    ]
}

/// What the GPT's kernels need beside [`Bf16Inputs`].
struct GptOps<'a> {
    rstd: &'a Tensor,
    /// `a + b` and its rstd, from `add_rms_norm`.
    sum: &'a Tensor,
    sum_rstd: &'a Tensor,
    dgamma: &'a Tensor,
    adamw: &'a MixedAdamW,
}

/// RMSNorm (forward, backward with the f32 gamma grad), the residual add fused with it (reads
/// x and the residual, writes the sum and the norm; its backward reads dy, the residual grad and
/// the sum and writes one grad), SwiGLU (forward, backward) in bf16, the two recomputations a
/// block that keeps less runs in its backward (SwiGLU's backward writing its forward output
/// too; RMSNorm's output from the saved rstd: read x, write y), and one AdamW step over
/// bf16 weights: the least bytes each must move (the gamma, the row statistics and the gamma
/// grad's partial sums are left out; AdamW reads the f32 master, moments and grad and writes the
/// master, moments and the bf16 weight: 30 bytes an element).
fn gpt_cases<'a>(t: &'a Bf16Inputs, g: &'a GptOps<'a>, size: &str) -> Vec<Case<'a>> {
    let n = t.a.numel() as f64;
    let ew16 = |name: &'static str, bytes: f64, run| Case { dtype: DType::BF16, ..elementwise(name, size, bytes, run) };
    vec![
        ew16("rms_norm", 4.0 * n, Box::new(|| ops::rms_norm(&t.a, &t.bias, 1e-5).map(drop))),
        ew16(
            "rms_norm_backward",
            6.0 * n,
            Box::new(|| ops::rms_norm_backward(&t.dy, &t.a, &t.bias, g.rstd, g.dgamma).map(drop)),
        ),
        ew16("add_rms_norm", 8.0 * n, Box::new(|| ops::add_rms_norm(&t.a, &t.b, &t.bias, 1e-5).map(drop))),
        ew16(
            "add_rms_norm_backward",
            8.0 * n,
            Box::new(|| ops::add_rms_norm_backward(&t.dy, &t.b, g.sum, &t.bias, g.sum_rstd, g.dgamma).map(drop)),
        ),
        ew16("swiglu", 6.0 * n, Box::new(|| ops::swiglu(&t.a, &t.b).map(drop))),
        ew16("swiglu_backward", 10.0 * n, Box::new(|| ops::swiglu_backward(&t.dy, &t.a, &t.b).map(drop))),
        ew16(
            "swiglu_backward_recompute",
            12.0 * n,
            Box::new(|| ops::swiglu_backward_recompute(&t.dy, &t.a, &t.b).map(drop)),
        ),
        ew16("rms_norm_recompute", 4.0 * n, Box::new(|| ops::rms_norm_recompute(&t.a, &t.bias, g.rstd).map(drop))),
        ew16("MixedAdamW::step", 30.0 * n, Box::new(|| g.adamw.step())),
    ]
}

/// The GPT's GEMMs at one step's 4096 tokens (the example's GPU configuration: d_model 512,
/// hidden 1368, byte vocabulary; every shape of `scripts/gpt-shapes.sh` has 4096 tokens a step,
/// so these are its GEMMs at each), a small version on the host backend: bf16 activations and
/// weights, f32 weight grads accumulated, as the blocks run them.
struct GptGemmInputs {
    tokens: usize,
    layers: usize,
    projections: Vec<Projection>,
    /// The residual stream `[tokens, d_model]` the projections back to it add.
    residual: Tensor,
}

/// One of the GPT's projections, as its GEMM cases run it.
struct Projection {
    /// The cases' names: forward, backward.
    names: [&'static str; 2],
    /// The input `[tokens, in]`.
    x: Tensor,
    /// The weight `[out, in]`.
    w: Tensor,
    /// The output's grad `[tokens, out]`.
    dy: Tensor,
    /// The f32 weight grad the backward accumulates into.
    dw: Tensor,
    /// Whether the forward adds the residual stream in the GEMM (`ops::linear_residual`).
    residual: bool,
}

impl GptGemmInputs {
    fn new(dev: &Device, gpu: bool) -> Result<GptGemmInputs> {
        let (tokens, layers, d, hidden, vocab) = if gpu { (4096, 8, 512, 1368, 256) } else { (64, 2, 64, 160, 256) };
        let mut seed = 0x5EEDu64;
        let mut rand = |dims: &[usize]| -> Result<Tensor> {
            let len: usize = dims.iter().product();
            let v: Vec<f32> = (0..len)
                .map(|_| {
                    seed ^= seed << 13;
                    seed ^= seed >> 7;
                    seed ^= seed << 17;
                    ((seed >> 40) as f32 / (1u64 << 24) as f32) - 0.5
                })
                .collect();
            Tensor::from_slice(dev, &v, dims)?.to_dtype(DType::BF16)
        };
        let mut projections = Vec::new();
        for (names, input, out, residual) in [
            (["gpt gemm qkv fwd", "gpt gemm qkv bwd"], d, 3 * d, false),
            (["gpt gemm attn out fwd", "gpt gemm attn out bwd"], d, d, true),
            (["gpt gemm gate/up fwd", "gpt gemm gate/up bwd"], d, 2 * hidden, false),
            (["gpt gemm down fwd", "gpt gemm down bwd"], hidden, d, true),
            (["gpt gemm head fwd", "gpt gemm head bwd"], d, vocab, false),
        ] {
            let (x, w, dy) = (rand(&[tokens, input])?, rand(&[out, input])?, rand(&[tokens, out])?);
            projections.push(Projection { names, x, w, dy, dw: Tensor::zeros(dev, &[out, input])?, residual });
        }
        Ok(GptGemmInputs { tokens, layers, projections, residual: rand(&[tokens, d])? })
    }

    /// How many times a step runs the case `name` (a projection's forward or backward): once a
    /// block, the head's once.
    fn per_step(&self, name: &str) -> usize {
        if name.contains("head") {
            1
        } else {
            self.layers
        }
    }
}

/// Each projection's forward (with the residual added in the GEMM where the blocks add it) and
/// backward (`dx` and the accumulated weight grad), named `<projection> fwd` and `bwd`. Which
/// algorithm cuBLAS runs is `GRAPHED_GEMM`'s (see the runtime's `cublaslt_gemm.rs`).
/// Cross-entropy as a language model's head computes it, at each of the CUDA forward's kernels:
/// bf16 logits at op_bench's shape and a 32,768-word vocabulary in f32 and bf16 (the row in
/// shared memory), GPT-2's 50,257 words in bf16 (rows that start inside a 16-byte word),
/// 1,024 classes in f32 and bf16 (rows in registers) and 131,072 in bf16 (past the shared
/// memory: one block a row, two reads). Each: logits, labels and the forward's probabilities.
struct XentInputs {
    heads: Vec<(DType, usize, usize, Tensor, Tensor, Tensor)>,
}

impl XentInputs {
    fn new(dev: &Device, gpu: bool) -> Result<XentInputs> {
        let shapes: &[(DType, usize, usize)] = if gpu {
            &[
                (DType::BF16, 4096, 4096),
                (DType::F32, 4096, 32768),
                (DType::BF16, 4096, 32768),
                (DType::BF16, 4096, 50257),
                (DType::F32, 16384, 1024),
                (DType::BF16, 16384, 1024),
                (DType::BF16, 1024, 131072),
            ]
        } else {
            &[(DType::BF16, 64, 256), (DType::F32, 64, 2048), (DType::BF16, 64, 2048)]
        };
        let mut heads = Vec::new();
        for &(dtype, rows, vocab) in shapes {
            let v: Vec<f32> = (0..rows * vocab).map(|i| ((i * 7919 % 1000) as f32) * 0.01 - 5.0).collect();
            let logits = Tensor::from_slice_as(dev, &v, &[rows, vocab], dtype)?;
            let labels =
                Tensor::from_slice(dev, &(0..rows).map(|i| (i * 31 % vocab) as f32).collect::<Vec<_>>(), &[rows])?;
            let (_, probs) = ops::softmax_cross_entropy(&logits, &labels)?;
            heads.push((dtype, rows, vocab, logits, labels, probs));
        }
        Ok(XentInputs { heads })
    }
}

/// The loss head's forward (logits read, probabilities written) and backward (probabilities
/// read, the logits' grad written).
fn xent_cases(x: &XentInputs) -> Vec<Case<'_>> {
    let mut cases = Vec::new();
    for (dtype, rows, vocab, logits, labels, probs) in &x.heads {
        let bytes = 2.0 * (rows * vocab * dtype.size()) as f64;
        let size = format!("{rows}x{vocab}");
        cases.push(Case {
            name: "softmax_cross_entropy",
            dtype: *dtype,
            size: size.clone(),
            bytes,
            flops: 0.0,
            run: Box::new(move || ops::softmax_cross_entropy(logits, labels).map(drop)),
        });
        cases.push(Case {
            name: "softmax_xent_backward",
            dtype: *dtype,
            size,
            bytes,
            flops: 0.0,
            run: Box::new(move || ops::softmax_cross_entropy_backward(probs, labels, 1.0).map(drop)),
        });
    }
    cases
}

fn gpt_gemm_cases(g: &GptGemmInputs) -> Vec<Case<'_>> {
    let mut cases = Vec::new();
    for Projection { names: [fwd_name, bwd_name], x, w, dy, dw, residual } in &g.projections {
        let (input, out) = (w.dims()[1], w.dims()[0]);
        let size = format!("{}x{input}x{out}", g.tokens);
        let flops = 2.0 * (g.tokens * input * out) as f64;
        let bytes = 2.0 * (g.tokens * input + input * out + g.tokens * out) as f64;
        let fwd: OpFn = if *residual {
            Box::new(move || ops::linear_residual(x, w, &g.residual).map(drop))
        } else {
            Box::new(move || ops::linear(x, w, None).map(drop))
        };
        let bwd: OpFn = Box::new(move || ops::linear_backward(dy, x, w, dw, None, true).map(drop));
        cases.push(Case { name: fwd_name, dtype: DType::BF16, size: size.clone(), bytes, flops, run: fwd });
        cases.push(Case { name: bwd_name, dtype: DType::BF16, size, bytes: 2.0 * bytes, flops: 2.0 * flops, run: bwd });
    }
    cases
}

/// The GPT's GEMMs of one step (no recomputation), from the timed `gpt gemm` cases, when all of
/// them ran: the sum of each projection's time a step, and the rate over all of them.
fn gemm_step_total(rows: &[Timed], g: &GptGemmInputs) {
    let gemms: Vec<&Timed> = rows.iter().filter(|r| r.0.starts_with("gpt gemm")).collect();
    if gemms.len() != 2 * g.projections.len() {
        return;
    }
    let (mut us, mut flops) = (0.0, 0.0);
    for r in gemms {
        let n = g.per_step(r.0) as f64;
        us += n * r.3;
        flops += n * r.5;
    }
    let route = std::env::var("GRAPHED_GEMM").unwrap_or_else(|_| "cublas".into());
    println!(
        "the GPT's GEMMs a step ({} tokens, {} layers, GRAPHED_GEMM={route}): {us:.1} us, {:.1} TFLOP/s",
        g.tokens,
        g.layers,
        flops / (us * 1e-6) / 1e12
    );
}

/// One timed case: name, dtype, size, us per op, bytes moved, FLOPs.
type Timed = (&'static str, DType, String, f64, f64, f64);

/// The table, then the worst memory-bound ratio per dtype against the 1.3x target.
fn report(rows_out: Vec<Timed>, reps: usize, bandwidth: f64) {
    println!();
    println!("{LAUNCHES} launches per graph, {reps} replays; copy bandwidth {:.0} GB/s", bandwidth / 1e9);
    println!(
        "{:<26} {:>5} {:>16} {:>12} {:>12} {:>12} {:>8}  note",
        "op", "dtype", "size", "us/op", "MB moved", "floor us", "ratio"
    );
    // The worst memory-bound ratio per dtype (GEMMs are compute-bound and left out).
    let mut worst: Vec<(DType, f64, &str)> = Vec::new();
    for (name, dtype, size, us, bytes, flops) in rows_out {
        let floor = bytes / bandwidth * 1e6;
        let note = if flops > 0.0 {
            let tf32 = if dtype == DType::F32 { ", no TF32" } else { ", f32 accumulation" };
            format!("{:.1} TFLOP/s ({dtype}{tf32})", flops / (us * 1e-6) / 1e12)
        } else {
            match worst.iter_mut().find(|w| w.0 == dtype) {
                Some(w) if us / floor > w.1 => *w = (dtype, us / floor, name),
                Some(_) => {}
                None => worst.push((dtype, us / floor, name)),
            }
            String::new()
        };
        println!(
            "{name:<26} {dtype:>5} {size:>16} {us:>12.1} {:>12.1} {floor:>12.1} {:>8.2}  {note}",
            bytes / 1e6,
            us / floor
        );
    }
    println!();
    for (dtype, ratio, name) in worst {
        let verdict = if ratio <= 1.3 { "PASS" } else { "MISS" };
        println!(
            "memory-bound ops in {dtype}: worst {ratio:.2}x of the bandwidth floor ({name}); target <= 1.3x: {verdict}"
        );
    }
}
