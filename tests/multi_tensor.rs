//! Multi-tensor AdamW (one launch over a table of every parameter) against the per-tensor
//! launches it replaces: bitwise equal weights, master weights, moments, grads, step counts and
//! loss-scaler state, over many tensors of odd sizes (chunk boundaries included), in f32, bf16
//! and f16, with and without a loss scaler and a forced overflow, eager and replayed, with and
//! without the IF node that skips a captured step's update. Host always; CUDA when a GPU is
//! usable.

mod common;
mod ops_support;

use common::{on_each_backend, random_vec};
use graphed::optim::{
    AdamW, AdamWConfig, Launches, LossScaler, LossScalerConfig, MixedAdamW, MixedSgd, Sgd, SgdConfig,
};
use graphed::{CaptureMode, DType, Device, Error, Graph, Param, Result, Tensor};

/// Element counts around the kernels' 8192-element chunks, the 4-element vectors and the tails.
const SIZES: &[usize] = &[1, 3, 4, 7, 255, 256, 257, 1023, 8191, 8192, 8193, 16387, 24576, 40001, 33 * 7, 2];
const STEPS: usize = 5;
/// The step whose grads overflow (with a loss scaler).
const OVERFLOW_AT: usize = 2;
const SCALE: f32 = 256.0;
const CFG: AdamWConfig = AdamWConfig { lr: 1e-2, beta1: 0.9, beta2: 0.999, eps: 1e-8, weight_decay: 1e-2 };

#[derive(Clone, Copy, Debug)]
struct Case {
    dtype: DType,
    scaler: bool,
    zero: bool,
}

#[derive(Clone, Copy, Debug, PartialEq)]
struct Variant {
    launches: Launches,
    captured: bool,
    /// The IF node of a captured mixed step with a scaler.
    node: bool,
}

enum Opt {
    F32(Box<AdamW>),
    Mixed(Box<MixedAdamW>),
}

impl Opt {
    fn step(&self, zero: bool) -> Result<()> {
        match (self, zero) {
            (Opt::F32(o), false) => o.step(),
            (Opt::F32(o), true) => o.step_and_zero_grad(),
            (Opt::Mixed(o), false) => o.step(),
            (Opt::Mixed(o), true) => o.step_and_zero_grad(),
        }
    }

    /// Everything a step writes, as bits: f32 weights (masters), moments, counters.
    fn state(&self) -> Result<Vec<Vec<u32>>> {
        let (weights, (m, v)) = match self {
            Opt::F32(o) => (o.params(), o.moments()),
            Opt::Mixed(o) => (o.masters(), o.moments()),
        };
        let mut out = Vec::new();
        for t in weights.iter().map(|p| &p.value).chain(m).chain(v) {
            out.push(bits(t)?);
        }
        let count = match self {
            Opt::F32(o) => o.step_count()?,
            Opt::Mixed(o) => o.step_count()?,
        };
        out.push(vec![count as u32]);
        if let Opt::Mixed(o) = self {
            if let Some(s) = o.scaler() {
                out.push(vec![s.scale()?.to_bits(), s.skipped_steps()? as u32]);
            }
        }
        Ok(out)
    }
}

fn bits(t: &Tensor) -> Result<Vec<u32>> {
    Ok(t.to_vec()?.iter().map(|v| v.to_bits()).collect())
}

/// The grads of step `step`: scaled as a scaled loss's backward gives them, one infinite at
/// [`OVERFLOW_AT`] with a scaler.
fn set_grads(ps: &[Param], case: Case, step: usize) -> Result<()> {
    for (i, p) in ps.iter().enumerate() {
        let scale = if case.scaler { SCALE } else { 1.0 };
        let mut g: Vec<f32> =
            random_vec(p.grad.numel(), 500 + 37 * step as u64 + i as u64).iter().map(|v| v * scale).collect();
        if case.scaler && step == OVERFLOW_AT && i == SIZES.len() / 2 {
            g[p.grad.numel() / 2] = f32::INFINITY;
        }
        p.grad.copy_from_slice(&g)?;
    }
    Ok(())
}

/// Runs [`STEPS`] steps of `case` the way `variant` says; the state after each step, with the
/// model weights and grads.
fn run(dev: &Device, case: Case, variant: Variant) -> Result<Vec<Vec<u32>>> {
    let ps: Vec<Param> = SIZES
        .iter()
        .enumerate()
        .map(|(i, &n)| Param::new(Tensor::from_slice_as(dev, &random_vec(n, 100 + i as u64), &[n], case.dtype)?))
        .collect::<Result<_>>()?;
    let opt = match case.dtype {
        DType::F32 => Opt::F32(Box::new(AdamW::new(&ps, CFG)?.with_launches(variant.launches))),
        _ => {
            let scaler = match case.scaler {
                true => Some(LossScaler::new(dev, LossScalerConfig { init_scale: SCALE, ..Default::default() })?),
                false => None,
            };
            let o = MixedAdamW::new(&ps, CFG, scaler)?;
            Opt::Mixed(Box::new(o.with_launches(variant.launches).with_conditional_skip(variant.node)))
        }
    };
    let mut graph = Graph::new(dev);
    let mut out = Vec::new();
    for step in 0..STEPS {
        set_grads(&ps, case, step)?;
        if variant.captured {
            if !graph.is_captured() {
                graph.capture(CaptureMode::Global, || opt.step(case.zero))?;
            }
            graph.replay()?;
        } else {
            opt.step(case.zero)?;
        }
        out.extend(opt.state()?);
        for p in &ps {
            out.push(bits(&p.value)?);
            out.push(bits(&p.grad)?);
        }
    }
    if let Opt::Mixed(o) = &opt {
        if let Some(s) = o.scaler() {
            // The forced overflow was seen, and only it.
            assert_eq!((s.skipped_steps()?, o.step_count()?), (1, STEPS as u64 - 1), "{case:?}, {variant:?}");
        }
    }
    Ok(out)
}

/// Compares two runs, naming the first tensor that differs.
fn same(what: &str, got: &[Vec<u32>], want: &[Vec<u32>]) -> Result<()> {
    if got.len() != want.len() {
        return Err(Error::msg(format!("{what}: {} tensors vs {}", got.len(), want.len())));
    }
    for (i, (a, b)) in got.iter().zip(want).enumerate() {
        if let Some(j) = a.iter().zip(b).position(|(x, y)| x != y) {
            return Err(Error::msg(format!(
                "{what}: tensor {i} differs at element {j}: {:e} vs {:e}",
                f32::from_bits(a[j]),
                f32::from_bits(b[j])
            )));
        }
        if a.len() != b.len() {
            return Err(Error::msg(format!("{what}: tensor {i} has {} values vs {}", a.len(), b.len())));
        }
    }
    Ok(())
}

#[test]
fn multi_tensor_adamw_is_bitwise_the_per_tensor_path() {
    on_each_backend(|dev| {
        let cases = [
            Case { dtype: DType::F32, scaler: false, zero: false },
            Case { dtype: DType::F32, scaler: false, zero: true },
            Case { dtype: DType::BF16, scaler: false, zero: true },
            Case { dtype: DType::BF16, scaler: true, zero: false },
            Case { dtype: DType::F16, scaler: true, zero: true },
            Case { dtype: DType::F16, scaler: true, zero: false },
        ];
        for case in cases {
            let reference = Variant { launches: Launches::PerTensor, captured: false, node: false };
            let want = run(dev, case, reference)?;
            let variants = [
                Variant { launches: Launches::PerTensor, captured: true, node: false },
                Variant { launches: Launches::MultiTensor, captured: false, node: true },
                Variant { launches: Launches::MultiTensor, captured: true, node: false },
                Variant { launches: Launches::MultiTensor, captured: true, node: true },
            ];
            for variant in variants {
                same(&format!("{case:?}, {variant:?}"), &run(dev, case, variant)?, &want)?;
            }
        }
        Ok(())
    });
}

/// Sizes that fill a table's chunks exactly and leave a tail, and a model of bf16 and f16
/// weights at once (two tables, two launches), step bitwise as the per-tensor path.
#[test]
fn a_model_of_two_sixteen_bit_dtypes_updates_through_two_tables() {
    on_each_backend(|dev| {
        let run = |launches: Launches| -> Result<Vec<Vec<u32>>> {
            let ps = [(8192, DType::BF16), (5, DType::F16), (8193, DType::F16), (100, DType::BF16)]
                .iter()
                .enumerate()
                .map(|(i, &(n, dt))| Param::new(Tensor::from_slice_as(dev, &random_vec(n, 7 + i as u64), &[n], dt)?))
                .collect::<Result<Vec<_>>>()?;
            let scaler = LossScaler::new(dev, LossScalerConfig::default())?;
            let opt = MixedAdamW::new(&ps, CFG, Some(scaler))?.with_launches(launches);
            let mut graph = Graph::new(dev);
            graph.capture(CaptureMode::Global, || opt.step_and_zero_grad())?;
            let mut out = Vec::new();
            for step in 0..3u64 {
                for (i, p) in ps.iter().enumerate() {
                    let g: Vec<f32> =
                        random_vec(p.grad.numel(), 40 + 5 * step + i as u64).iter().map(|v| v * 65536.0).collect();
                    p.grad.copy_from_slice(&g)?;
                }
                graph.replay()?;
                for p in opt.masters().iter().chain(&ps) {
                    out.push(bits(&p.value)?);
                    out.push(bits(&p.grad)?);
                }
            }
            Ok(out)
        };
        same("bf16 + f16 model", &run(Launches::MultiTensor)?, &run(Launches::PerTensor)?)
    });
}

/// `zero_grad` is one launch over the table, and equals the per-tensor fills.
#[test]
fn zero_grad_clears_every_grad_in_one_launch() {
    on_each_backend(|dev| {
        let ps: Vec<Param> = SIZES.iter().map(|&n| Param::new(Tensor::zeros(dev, &[n])?)).collect::<Result<_>>()?;
        let opt = AdamW::new(&ps, CFG)?;
        set_grads(&ps, Case { dtype: DType::F32, scaler: false, zero: false }, 0)?;
        let mut graph = Graph::new(dev);
        graph.capture(CaptureMode::Global, || opt.zero_grad())?;
        let kernels = graph.nodes()?.iter().filter(|n| n.kernel.is_some()).count();
        assert_eq!(kernels, 1, "one launch for {} grads", ps.len());
        graph.replay()?;
        for p in &ps {
            assert!(p.grad.to_vec()?.iter().all(|v| v.to_bits() == 0), "a grad is not zero");
        }
        Ok(())
    });
}

/// SGD (momentum and weight decay, or plain) over the same tensors: one launch over a table
/// against one launch a tensor, bitwise, in f32, bf16 and f16 (with a loss scaler and a forced
/// overflow), eager and replayed, with and without the IF node; and the update is one kernel.
#[test]
fn multi_tensor_sgd_is_bitwise_the_per_tensor_path() {
    const SGD: SgdConfig = SgdConfig { lr: 0.05, momentum: 0.9, weight_decay: 1e-2 };
    on_each_backend(|dev| {
        let run = |case: Case, config: SgdConfig, variant: Variant| -> Result<Vec<Vec<u32>>> {
            let ps: Vec<Param> = SIZES
                .iter()
                .enumerate()
                .map(|(i, &n)| {
                    Param::new(Tensor::from_slice_as(dev, &random_vec(n, 100 + i as u64), &[n], case.dtype)?)
                })
                .collect::<Result<_>>()?;
            enum Sgds {
                F32(Sgd),
                Mixed(Box<MixedSgd>),
            }
            let opt = match case.dtype {
                DType::F32 => Sgds::F32(Sgd::new(&ps, config)?.with_launches(variant.launches)),
                _ => {
                    let scaler = match case.scaler {
                        true => {
                            Some(LossScaler::new(dev, LossScalerConfig { init_scale: SCALE, ..Default::default() })?)
                        }
                        false => None,
                    };
                    let o = MixedSgd::new(&ps, config, scaler)?;
                    Sgds::Mixed(Box::new(o.with_launches(variant.launches).with_conditional_skip(variant.node)))
                }
            };
            let step = || match (&opt, case.zero) {
                (Sgds::F32(o), false) => o.step(),
                (Sgds::F32(o), true) => o.step().and_then(|()| o.zero_grad()),
                (Sgds::Mixed(o), false) => o.step(),
                (Sgds::Mixed(o), true) => o.step_and_zero_grad(),
            };
            let mut graph = Graph::new(dev);
            let mut out = Vec::new();
            for s in 0..STEPS {
                set_grads(&ps, case, s)?;
                if variant.captured {
                    if !graph.is_captured() {
                        graph.capture(CaptureMode::Global, step)?;
                        if let (Sgds::F32(_), false, Launches::MultiTensor) = (&opt, case.zero, variant.launches) {
                            let kernels = graph.nodes()?.iter().filter(|n| n.kernel.is_some()).count();
                            assert_eq!(kernels, 1, "one launch for {} parameters", ps.len());
                        }
                    }
                    graph.replay()?;
                } else {
                    step()?;
                }
                let (masters, bufs) = match &opt {
                    Sgds::F32(o) => (o.params(), o.momentum_buffers()),
                    Sgds::Mixed(o) => (o.masters(), o.momentum_buffers()),
                };
                for t in masters.iter().map(|p| &p.value).chain(bufs.iter().flatten()) {
                    out.push(bits(t)?);
                }
                for p in &ps {
                    out.push(bits(&p.value)?);
                    out.push(bits(&p.grad)?);
                }
                if let Sgds::Mixed(o) = &opt {
                    if let Some(sc) = o.scaler() {
                        out.push(vec![sc.scale()?.to_bits(), sc.skipped_steps()? as u32]);
                    }
                }
            }
            Ok(out)
        };
        let plain = SgdConfig { momentum: 0.0, ..SGD };
        let cases = [
            (Case { dtype: DType::F32, scaler: false, zero: false }, SGD),
            (Case { dtype: DType::F32, scaler: false, zero: true }, plain),
            (Case { dtype: DType::BF16, scaler: false, zero: true }, SGD),
            (Case { dtype: DType::BF16, scaler: true, zero: false }, plain),
            (Case { dtype: DType::F16, scaler: true, zero: true }, SGD),
        ];
        for (case, config) in cases {
            let reference = Variant { launches: Launches::PerTensor, captured: false, node: false };
            let want = run(case, config, reference)?;
            let variants = [
                Variant { launches: Launches::MultiTensor, captured: false, node: false },
                Variant { launches: Launches::MultiTensor, captured: true, node: false },
                Variant { launches: Launches::MultiTensor, captured: true, node: true },
                Variant { launches: Launches::PerTensor, captured: true, node: false },
            ];
            for variant in variants {
                same(
                    &format!("{case:?}, momentum {}, {variant:?}", config.momentum),
                    &run(case, config, variant)?,
                    &want,
                )?;
            }
        }
        Ok(())
    });
}
