//! Bring your own kernels and parameters: a pre-norm RMSNorm + SwiGLU MLP whose RMSNorm and
//! SwiGLU (forward and backward) are our own CUDA C kernels, compiled by NVRTC on a GPU and
//! run by their host implementations on the host backend, inside a `#[graphed]` module.
//!
//! Each block: `x + W_down · swiglu(W_gate · rmsnorm(x), W_up · rmsnorm(x))`, with
//! `swiglu(g, u) = silu(g) · u`; two blocks, trained with AdamW built from the module's
//! parameters (`#[derive(Parameters)]`) to regress a fixed random linear map. Two copies from
//! the same init, one eager and one graphed, must agree bit for bit (every loss and every
//! final parameter); then the trained parameters go through a safetensors file and back.
//!
//! `cargo run --release --example custom_kernel` (`--steps N`, `--help`; `GRAPHED_DEVICE=host` forces
//! the host backend).

use clap::builder::TypedValueParser;
use clap::Parser;
use graphed::optim::{AdamW, AdamWConfig};
use graphed::KernelArg::{In, InOut, Out, F32, U32};
use graphed::{
    check_kernel_against_host, graphed, load_safetensors, ops, save_safetensors, Arg, CheckArg, Cx, Device, Error,
    Generator, HostArgs, Kernel, LaunchConfig, Param, Parameters, Result, Tensor,
};

#[path = "common/data.rs"]
mod data;

/// Our kernels. Row kernels run one block of `ROW_THREADS` threads per row and reduce in
/// shared memory in a fixed tree order, so every run gives the same bits.
const SOURCE: &str = r#"
#define REDUCE(partial)                                                        \
    __syncthreads();                                                           \
    for (unsigned k = blockDim.x / 2; k > 0; k >>= 1) {                        \
        if (threadIdx.x < k) partial[threadIdx.x] += partial[threadIdx.x + k]; \
        __syncthreads();                                                       \
    }

extern "C" __global__ void rmsnorm_fwd(float* y, float* rstd, const float* x, const float* g,
                                       unsigned rows, unsigned d, float eps) {
    extern __shared__ float partial[];
    unsigned r = blockIdx.x;
    if (r >= rows) return;
    const float* xr = x + (size_t)r * d;
    float s = 0.0f;
    for (unsigned j = threadIdx.x; j < d; j += blockDim.x) s += xr[j] * xr[j];
    partial[threadIdx.x] = s;
    REDUCE(partial)
    float inv = 1.0f / sqrtf(partial[0] / (float)d + eps);
    for (unsigned j = threadIdx.x; j < d; j += blockDim.x) y[(size_t)r * d + j] = (xr[j] * inv) * g[j];
    if (threadIdx.x == 0) rstd[r] = inv;
}

extern "C" __global__ void rmsnorm_bwd(float* dx, const float* dy, const float* x, const float* g,
                                       const float* rstd, unsigned rows, unsigned d) {
    extern __shared__ float partial[];
    unsigned r = blockIdx.x;
    if (r >= rows) return;
    size_t o = (size_t)r * d;
    float s = 0.0f;
    for (unsigned j = threadIdx.x; j < d; j += blockDim.x) s += (g[j] * dy[o + j]) * x[o + j];
    partial[threadIdx.x] = s;
    REDUCE(partial)
    float inv = rstd[r];
    float c = partial[0] * (inv * inv * inv) / (float)d;
    for (unsigned j = threadIdx.x; j < d; j += blockDim.x) dx[o + j] = inv * g[j] * dy[o + j] - c * x[o + j];
}

extern "C" __global__ void rmsnorm_dgamma(float* dg, const float* dy, const float* x, const float* rstd,
                                          unsigned rows, unsigned d) {
    unsigned j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= d) return;
    float s = 0.0f;
    for (unsigned r = 0; r < rows; ++r) s += dy[(size_t)r * d + j] * (x[(size_t)r * d + j] * rstd[r]);
    dg[j] += s;
}

extern "C" __global__ void swiglu_fwd(float* h, const float* gate, const float* up, unsigned n) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float g = gate[i];
    h[i] = (g / (1.0f + expf(-g))) * up[i];
}

extern "C" __global__ void swiglu_bwd(float* dgate, float* dup, const float* dh, const float* gate,
                                      const float* up, unsigned n) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float g = gate[i], s = 1.0f / (1.0f + expf(-g));
    dgate[i] = dh[i] * up[i] * (s * (1.0f + g * (1.0f - s)));
    dup[i] = dh[i] * (g * s);
}
"#;

const ROW_THREADS: u32 = 128;
const EPS: f32 = 1e-6;

fn rmsnorm_fwd_host(a: &HostArgs) -> Result<()> {
    let (x, g, d, eps) = (a.input(2)?, a.input(3)?, a.u32(5)? as usize, a.f32(6)?);
    let (mut y, mut rstd) = (a.output(0)?, a.output(1)?);
    for (r, xr) in x.chunks(d).enumerate() {
        let inv = 1.0 / (xr.iter().map(|v| v * v).sum::<f32>() / d as f32 + eps).sqrt();
        for j in 0..d {
            y[r * d + j] = (xr[j] * inv) * g[j];
        }
        rstd[r] = inv;
    }
    Ok(())
}

fn rmsnorm_bwd_host(a: &HostArgs) -> Result<()> {
    let (dy, x, g, rstd, d) = (a.input(1)?, a.input(2)?, a.input(3)?, a.input(4)?, a.u32(6)? as usize);
    let mut dx = a.output(0)?;
    for (r, inv) in rstd.iter().enumerate() {
        let o = r * d;
        let s: f32 = (0..d).map(|j| (g[j] * dy[o + j]) * x[o + j]).sum();
        let c = s * (inv * inv * inv) / d as f32;
        for j in 0..d {
            dx[o + j] = inv * g[j] * dy[o + j] - c * x[o + j];
        }
    }
    Ok(())
}

fn rmsnorm_dgamma_host(a: &HostArgs) -> Result<()> {
    let (dy, x, rstd, d) = (a.input(1)?, a.input(2)?, a.input(3)?, a.u32(5)? as usize);
    for (j, dg) in a.output(0)?.iter_mut().enumerate() {
        *dg += rstd.iter().enumerate().map(|(r, inv)| dy[r * d + j] * (x[r * d + j] * inv)).sum::<f32>();
    }
    Ok(())
}

fn silu_sigmoid(g: f32) -> f32 {
    1.0 / (1.0 + (-g).exp())
}

fn swiglu_fwd_host(a: &HostArgs) -> Result<()> {
    let (gate, up) = (a.input(1)?, a.input(2)?);
    for (i, h) in a.output(0)?.iter_mut().enumerate() {
        *h = (gate[i] * silu_sigmoid(gate[i])) * up[i];
    }
    Ok(())
}

fn swiglu_bwd_host(a: &HostArgs) -> Result<()> {
    let (dh, gate, up) = (a.input(2)?, a.input(3)?, a.input(4)?);
    let (mut dgate, mut dup) = (a.output(0)?, a.output(1)?);
    for i in 0..dh.len() {
        let (g, s) = (gate[i], silu_sigmoid(gate[i]));
        dgate[i] = dh[i] * up[i] * (s * (1.0 + g * (1.0 - s)));
        dup[i] = dh[i] * (g * s);
    }
    Ok(())
}

/// The five kernels, declared once and shared (a `Kernel` clone shares its compile cache).
#[derive(Clone)]
struct Kernels {
    rms_fwd: Kernel,
    rms_bwd: Kernel,
    rms_dgamma: Kernel,
    swiglu_fwd: Kernel,
    swiglu_bwd: Kernel,
}

impl Kernels {
    fn new() -> Result<Kernels> {
        use Arg::{TensorIn as I, TensorInOut as IO, TensorOut as O, F32 as F, U32 as U};
        Ok(Kernels {
            rms_fwd: Kernel::new("rmsnorm_fwd", SOURCE, &[O, O, I, I, U, U, F], rmsnorm_fwd_host)?,
            rms_bwd: Kernel::new("rmsnorm_bwd", SOURCE, &[O, I, I, I, I, U, U], rmsnorm_bwd_host)?,
            rms_dgamma: Kernel::new("rmsnorm_dgamma", SOURCE, &[IO, I, I, I, U, U], rmsnorm_dgamma_host)?,
            swiglu_fwd: Kernel::new("swiglu_fwd", SOURCE, &[O, I, I, U], swiglu_fwd_host)?,
            swiglu_bwd: Kernel::new("swiglu_bwd", SOURCE, &[O, O, I, I, I, U], swiglu_bwd_host)?,
        })
    }

    /// Each kernel's CUDA code against its host implementation (trivial on the host backend).
    fn check(&self, dev: &Device, (rows, d, h): (usize, usize, usize)) -> Result<()> {
        let (rd, r1, d1, rh) = ([rows, d], [rows], [d], [rows * h]);
        let (t, u) = (CheckArg::Tensor, |v: usize| CheckArg::U32(v as u32));
        let row = row_config(rows);
        let cases: [(&Kernel, LaunchConfig, Vec<CheckArg>); 5] = [
            (&self.rms_fwd, row, vec![t(&rd), t(&r1), t(&rd), t(&d1), u(rows), u(d), CheckArg::F32(EPS)]),
            (&self.rms_bwd, row, vec![t(&rd), t(&rd), t(&rd), t(&d1), t(&r1), u(rows), u(d)]),
            (&self.rms_dgamma, LaunchConfig::for_elements(d), vec![t(&d1), t(&rd), t(&rd), t(&r1), u(rows), u(d)]),
            (&self.swiglu_fwd, LaunchConfig::for_elements(rows * h), vec![t(&rh), t(&rh), t(&rh), u(rows * h)]),
            (
                &self.swiglu_bwd,
                LaunchConfig::for_elements(rows * h),
                vec![t(&rh), t(&rh), t(&rh), t(&rh), t(&rh), u(rows * h)],
            ),
        ];
        for (kernel, cfg, args) in cases {
            // rstd must be positive for rmsnorm_bwd/dgamma to mean anything; random values in
            // [-1, 1) still exercise every element, which is what the check is for.
            let report = check_kernel_against_host(kernel, dev, cfg, &args, 7, 1e-5)?;
            println!("  {report}");
            if !report.passed() {
                return Err(Error::msg(format!("kernel `{}` disagrees with its host implementation", kernel.name())));
            }
        }
        Ok(())
    }
}

fn row_config(rows: usize) -> LaunchConfig {
    LaunchConfig { grid: (rows as u32, 1, 1), block: (ROW_THREADS, 1, 1), shared_mem_bytes: ROW_THREADS * 4 }
}

#[derive(Parameters)]
struct RmsNorm {
    g: Param,
}

/// One pre-norm SwiGLU MLP block; weights `[out, in]` as in PyTorch.
#[derive(Parameters)]
struct SwiGluBlock {
    norm: RmsNorm,
    w_gate: Param,
    w_up: Param,
    w_down: Param,
    kernels: Kernels,
}

impl SwiGluBlock {
    fn new(dev: &Device, d: usize, h: usize, seed: u64, kernels: &Kernels) -> Result<SwiGluBlock> {
        let init = |dims: &[usize], fan_in: usize, s: u64| {
            Param::new(data::random(dev, dims, seed * 10 + s, 1.0 / (fan_in as f32).sqrt())?)
        };
        Ok(SwiGluBlock {
            norm: RmsNorm { g: Param::new(Tensor::full(dev, &[d], 1.0)?)? },
            w_gate: init(&[h, d], d, 1)?,
            w_up: init(&[h, d], d, 2)?,
            w_down: init(&[d, h], h, 3)?,
            kernels: kernels.clone(),
        })
    }

    fn forward(&self, cx: &mut Cx, x: &Tensor) -> Result<Tensor> {
        let (rows, d) = (x.dims()[0], x.dims()[1]);
        let (k, g) = (&self.kernels, &self.norm.g.value);
        let (xn, rstd) = (Tensor::empty_like(x)?, Tensor::empty(x.device(), &[rows])?);
        let (r32, d32) = (rows as u32, d as u32);
        k.rms_fwd.launch(row_config(rows), &[Out(&xn), Out(&rstd), In(x), In(g), U32(r32), U32(d32), F32(EPS)])?;
        let gate = ops::linear(&xn, &self.w_gate.value, None)?;
        let up = ops::linear(&xn, &self.w_up.value, None)?;
        let h = Tensor::empty_like(&gate)?;
        let n = gate.numel();
        k.swiglu_fwd.launch(LaunchConfig::for_elements(n), &[Out(&h), In(&gate), In(&up), U32(n as u32)])?;
        let y = ops::add(x, &ops::linear(&h, &self.w_down.value, None)?)?;
        for t in [x, &rstd, &xn, &gate, &up, &h] {
            cx.save(t);
        }
        Ok(y)
    }

    fn backward(&mut self, cx: &mut Cx, dy: &Tensor, need_dx: bool) -> Result<Option<Tensor>> {
        let [x, rstd, xn, gate, up, h] = [0, 1, 2, 3, 4, 5].map(|i| cx.saved(i));
        let (x, rstd, xn, gate, up, h) = (x?, rstd?, xn?, gate?, up?, h?);
        let k = &self.kernels;
        let dh = ops::linear_backward(dy, &h, &self.w_down.value, &self.w_down.grad, None, true)?
            .ok_or_else(|| Error::msg("linear_backward returned no dx"))?;
        let (dgate, dup) = (Tensor::empty_like(&gate)?, Tensor::empty_like(&up)?);
        let n = gate.numel();
        let args = [Out(&dgate), Out(&dup), In(&dh), In(&gate), In(&up), U32(n as u32)];
        k.swiglu_bwd.launch(LaunchConfig::for_elements(n), &args)?;
        let dxn_gate = ops::linear_backward(&dgate, &xn, &self.w_gate.value, &self.w_gate.grad, None, true)?;
        let dxn_up = ops::linear_backward(&dup, &xn, &self.w_up.value, &self.w_up.grad, None, true)?;
        let dxn = match (dxn_gate, dxn_up) {
            (Some(a), Some(b)) => ops::add(&a, &b)?,
            _ => return Err(Error::msg("linear_backward returned no dx")),
        };
        let (rows, d) = (x.dims()[0], x.dims()[1]);
        let (r32, d32) = (rows as u32, d as u32);
        let dg_args = [InOut(&self.norm.g.grad), In(&dxn), In(&x), In(&rstd), U32(r32), U32(d32)];
        k.rms_dgamma.launch(LaunchConfig::for_elements(d), &dg_args)?;
        if !need_dx {
            return Ok(None);
        }
        let dx_norm = Tensor::empty_like(&x)?;
        let g = &self.norm.g.value;
        let args = [Out(&dx_norm), In(&dxn), In(&x), In(g), In(&rstd), U32(r32), U32(d32)];
        k.rms_bwd.launch(row_config(rows), &args)?;
        Ok(Some(ops::add(dy, &dx_norm)?)) // the residual passes dy straight through
    }
}

/// Two blocks, captured as one module.
#[derive(Parameters)]
struct Model {
    blocks: Vec<SwiGluBlock>,
}

#[graphed(warmup = 3)]
impl Model {
    fn forward(&self, cx: &mut Cx, x: &Tensor) -> Result<Tensor> {
        let mut h = x.clone();
        for (i, b) in self.blocks.iter().enumerate() {
            h = b.forward(cx.child(i), &h)?;
        }
        Ok(h)
    }

    fn backward(&mut self, cx: &mut Cx, dy: &Tensor) -> Result<Option<Tensor>> {
        let need_dx = cx.needs_input_grad(0);
        let mut g = dy.clone();
        for (i, b) in self.blocks.iter_mut().enumerate().rev() {
            match b.backward(cx.child(i), &g, i > 0 || need_dx)? {
                Some(d) => g = d,
                None => return Ok(None),
            }
        }
        Ok(Some(g))
    }
}

struct Sizes {
    batch: usize,
    d: usize,
    hidden: usize,
}

fn model(dev: &Device, s: &Sizes, seed: u64, kernels: &Kernels) -> Result<Model> {
    let blocks = (0..2).map(|i| SwiGluBlock::new(dev, s.d, s.hidden, seed + i, kernels)).collect::<Result<_>>()?;
    Ok(Model { blocks })
}

/// A trained copy: the eager module, or the graphed wrapper that owns it.
enum Trained {
    Eager(Model),
    Graphed(GraphedModel),
}

impl Trained {
    fn model(&self) -> &Model {
        match self {
            Trained::Eager(m) => m,
            Trained::Graphed(g) => g.module(),
        }
    }
}

/// Trains one copy; its losses and the trained copy.
fn train(dev: &Device, s: &Sizes, steps: usize, graphed: bool, kernels: &Kernels) -> Result<(Vec<f32>, Trained)> {
    let m = model(dev, s, 1, kernels)?;
    let opt = AdamW::from_module(&m, AdamWConfig { lr: 3e-3, weight_decay: 0.0, ..Default::default() })?;
    let teacher = data::random(dev, &[s.d, s.d], 99, 1.0 / (s.d as f32).sqrt())?;
    let (x, ones) = (Tensor::zeros(dev, &[s.batch, s.d])?, Tensor::full(dev, &[s.batch, s.d], 1.0)?);
    let rng = Generator::new(dev, 2024)?;
    let (mut graphed_model, mut eager) = if graphed { (Some(m.make_graphed(&x)?), None) } else { (None, Some(m)) };
    let label = if graphed { "graphed" } else { "eager" };
    let mut losses = Vec::new();
    for step in 1..=steps {
        rng.uniform_(&x)?;
        ops::scale_(&x, 2.0)?;
        ops::axpy_(&x, -1.0, &ones)?;
        let target = ops::linear(&x, &teacher, None)?;
        let mut cx = Cx::new(dev);
        let y = match (&mut graphed_model, &mut eager) {
            (Some(g), _) => g.forward(&x)?,
            (_, Some(m)) => m.forward(&mut cx, &x)?,
            _ => unreachable!("one of the two is set"),
        };
        let loss = ops::mse_loss(&y, &target)?;
        let dy = ops::mse_backward(&y, &target, 1.0)?;
        match (&mut graphed_model, &mut eager) {
            (Some(g), _) => g.backward(&dy)?,
            (_, Some(m)) => m.backward(&mut cx, &dy)?,
            _ => unreachable!("one of the two is set"),
        };
        opt.step()?;
        opt.zero_grad()?;
        let l = loss.to_vec()?[0];
        losses.push(l);
        if step == 1 || step % (steps / 10).max(1) == 0 {
            println!("[{label:>7}] step {step:>4}/{steps}  loss {l:.6}");
        }
    }
    let trained = match (graphed_model, eager) {
        (Some(g), _) => Trained::Graphed(g),
        (_, Some(m)) => Trained::Eager(m),
        _ => unreachable!("one of the two is set"),
    };
    Ok((losses, trained))
}

fn bits(m: &impl Parameters) -> Result<Vec<(String, Vec<u32>)>> {
    m.parameters().into_iter().map(|(n, p)| Ok((n, p.value.to_vec()?.iter().map(|v| v.to_bits()).collect()))).collect()
}

/// Your own CUDA C kernels (RMSNorm, SwiGLU) and parameters inside a `#[graphed]` MLP, graphed
/// == eager bit for bit, then a safetensors round trip.
#[derive(Parser)]
#[command(name = "custom_kernel", after_help = "Set GRAPHED_DEVICE=host to run on the CPU when a GPU is present.")]
struct Args {
    /// AdamW steps of each run [default: 500 on a GPU, 200 on the host].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..).map(|n| n as usize))]
    steps: Option<usize>,
}

fn main() -> Result<()> {
    let args = Args::parse();
    let dev = Device::default_device();
    let s =
        if dev.is_cuda() { Sizes { batch: 64, d: 256, hidden: 512 } } else { Sizes { batch: 16, d: 32, hidden: 64 } };
    let steps = args.steps.unwrap_or(if dev.is_cuda() { 500 } else { 200 });
    println!(
        "custom kernels on {}: 2 x (RMSNorm + SwiGLU MLP {} -> {} -> {}), batch {}, AdamW, {steps} steps",
        dev.name(),
        s.d,
        s.hidden,
        s.d,
        s.batch
    );
    let kernels = Kernels::new()?;
    println!("kernel checks (device vs host implementation):");
    kernels.check(&dev, (s.batch, s.d, s.hidden))?;

    let (eager_losses, eager) = train(&dev, &s, steps, false, &kernels)?;
    let (graphed_losses, graphed) = train(&dev, &s, steps, true, &kernels)?;
    let (eager, graphed) = (eager.model(), graphed.model());
    let same_losses = eager_losses.iter().map(|l| l.to_bits()).eq(graphed_losses.iter().map(|l| l.to_bits()));
    let same_params = bits(eager)? == bits(graphed)?;
    let names: Vec<String> = graphed.parameters().into_iter().map(|(n, _)| n).collect();
    println!("\nparameters ({}): {}", names.len(), names.join(", "));

    let path = std::env::temp_dir().join(format!("graphed-custom-kernel-{}.safetensors", std::process::id()));
    save_safetensors(graphed, &path)?;
    let reloaded = model(&dev, &s, 500, &kernels)?;
    load_safetensors(&reloaded, &path)?;
    let same_reload = bits(&reloaded)? == bits(graphed)?;
    let file_bytes = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
    std::fs::remove_file(&path).ok();

    let (first, last) = (graphed_losses[0], graphed_losses[graphed_losses.len() - 1]);
    let yes = |b: bool| if b { "yes, bit for bit" } else { "NO" };
    println!("\nsummary");
    println!("  device                     {}", dev.name());
    println!("  loss                       {first:.6} -> {last:.6} ({:.1}x lower)", first / last.max(1e-30));
    println!("  eager == graphed losses    {}", yes(same_losses));
    println!("  eager == graphed params    {}", yes(same_params));
    println!("  safetensors round trip     {} ({file_bytes} bytes)", yes(same_reload));
    if !(same_losses && same_params && same_reload) || last >= first {
        return Err(Error::msg("graphed must match eager, the reload must be exact and the loss must fall"));
    }
    Ok(())
}
