//! Sgd and AdamW: the CPU reference over several steps, a captured step replayed under a
//! changing learning rate against eager steps (bitwise), zero_grad, bad hyper-parameters.

mod common;
mod ops_support;

use common::{on_each_backend, random_vec};
use graphed::ops::cpu;
use graphed::optim::{AdamW, AdamWConfig, Sgd, SgdConfig};
use graphed::{CaptureMode, Device, Error, Graph, OptimError, Param, Result, Tensor};
use ops_support::*;

/// Matches [`OptimError::HyperParameter`] for the field `name`.
fn hyper(name: &'static str) -> impl Fn(&Error) -> bool {
    move |e| matches!(e, Error::Optim(OptimError::HyperParameter { name: n, .. }) if *n == name)
}

/// Parameter shapes, including sizes that are not multiples of 256.
const SHAPES: &[&[usize]] = &[&[1], &[7, 33], &[257], &[300, 301]];
const STEPS: usize = 6;

fn params(dev: &Device, seed: u64) -> Result<Vec<Param>> {
    SHAPES
        .iter()
        .enumerate()
        .map(|(i, d)| Param::new(Tensor::from_slice(dev, &random_vec(d.iter().product(), seed + i as u64), d)?))
        .collect()
}

/// The grads of iteration `it`, written into each parameter's grad buffer.
fn set_grads(ps: &[Param], it: usize) -> Result<()> {
    for (i, p) in ps.iter().enumerate() {
        p.grad.copy_from_slice(&random_vec(p.grad.numel(), 1000 + 31 * it as u64 + i as u64))?;
    }
    Ok(())
}

fn lr_at(it: usize) -> f32 {
    0.1 / (1.0 + it as f32) // a decaying schedule
}

fn values(ps: &[Param]) -> Result<Vec<Vec<f32>>> {
    ps.iter().map(|p| p.value.to_vec()).collect()
}

#[test]
fn sgd_matches_reference() {
    on_each_backend(|dev| {
        for (momentum, wd) in [(0.0f32, 0.0f32), (0.9, 0.0), (0.9, 1e-2), (0.0, 0.1)] {
            let ps = params(dev, 1)?;
            let opt = Sgd::new(&ps, SgdConfig { lr: lr_at(0), momentum, weight_decay: wd })?;
            let mut want = values(&ps)?;
            let mut bufs: Vec<Vec<f32>> = want.iter().map(|v| vec![0.0; v.len()]).collect();
            for it in 0..STEPS {
                set_grads(&ps, it)?;
                opt.set_lr(lr_at(it))?;
                assert_eq!(opt.lr()?, lr_at(it));
                opt.step()?;
                for ((w, b), p) in want.iter_mut().zip(&mut bufs).zip(&ps) {
                    let buf = (momentum != 0.0).then_some(b.as_mut_slice());
                    cpu::sgd_step(w, &p.grad.to_vec()?, buf, lr_at(it), momentum, wd);
                }
            }
            for (i, (p, w)) in ps.iter().zip(&want).enumerate() {
                check_ref(dev, &format!("sgd m={momentum} wd={wd} param {i}"), &p.value.to_vec()?, w, TOL)?;
            }
        }
        Ok(())
    });
}

#[test]
fn adamw_matches_reference() {
    on_each_backend(|dev| {
        for wd in [0.0f32, 1e-2] {
            let ps = params(dev, 2)?;
            let config = AdamWConfig { lr: lr_at(0), weight_decay: wd, ..Default::default() };
            let opt = AdamW::new(&ps, config)?;
            let mut want = values(&ps)?;
            let mut m: Vec<Vec<f32>> = want.iter().map(|v| vec![0.0; v.len()]).collect();
            let mut v = m.clone();
            for it in 0..STEPS {
                set_grads(&ps, it)?;
                opt.set_lr(lr_at(it))?;
                opt.step()?;
                for (((w, mi), vi), p) in want.iter_mut().zip(&mut m).zip(&mut v).zip(&ps) {
                    cpu::adamw_step(
                        w,
                        &p.grad.to_vec()?,
                        mi,
                        vi,
                        lr_at(it),
                        it as u32 + 1,
                        config.beta1,
                        config.beta2,
                        config.eps,
                        wd,
                    );
                }
            }
            assert_eq!(opt.step_count()?, STEPS as u64);
            for (i, (p, w)) in ps.iter().zip(&want).enumerate() {
                check_ref(dev, &format!("adamw wd={wd} param {i}"), &p.value.to_vec()?, w, TOL)?;
            }
        }
        Ok(())
    });
}

/// Steps one optimizer eagerly and replays a captured step of a twin, under the same grads
/// and learning-rate schedule; the parameters must stay bitwise equal.
fn captured_equals_eager<O>(
    dev: &Device,
    make: impl Fn(&[Param]) -> Result<O>,
    set_lr: impl Fn(&O, f32) -> Result<()>,
    step: impl Fn(&O) -> Result<()>,
) -> Result<()> {
    let (eager_ps, graph_ps) = (params(dev, 3)?, params(dev, 3)?);
    let (eager, graphed) = (make(&eager_ps)?, make(&graph_ps)?);
    let mut g = Graph::new(dev);
    g.capture(CaptureMode::Global, || step(&graphed))?;
    bitwise_eq("capture does not step", &values(&graph_ps)?.concat(), &values(&eager_ps)?.concat())?;
    for it in 0..STEPS {
        set_grads(&eager_ps, it)?;
        set_grads(&graph_ps, it)?;
        set_lr(&eager, lr_at(it))?;
        set_lr(&graphed, lr_at(it))?;
        step(&eager)?;
        g.replay()?;
        for (i, (a, b)) in values(&graph_ps)?.iter().zip(&values(&eager_ps)?).enumerate() {
            bitwise_eq(&format!("iteration {it}, param {i}"), a, b)?;
        }
    }
    Ok(())
}

#[test]
fn captured_steps_replay_bitwise_equal_to_eager_under_a_schedule() {
    on_each_backend(|dev| {
        let sgd = SgdConfig { lr: 1.0, momentum: 0.9, weight_decay: 1e-3 };
        captured_equals_eager(dev, |ps| Sgd::new(ps, sgd), |o, lr| o.set_lr(lr), |o| o.step())?;
        captured_equals_eager(dev, |ps| AdamW::new(ps, AdamWConfig::default()), |o, lr| o.set_lr(lr), |o| o.step())?;
        // AdamW's step counter advances on the device with each replay.
        let ps = params(dev, 4)?;
        let opt = AdamW::new(&ps, AdamWConfig::default())?;
        let mut g = Graph::new(dev);
        g.capture(CaptureMode::Global, || opt.step())?;
        assert_eq!(opt.step_count()?, 0);
        for _ in 0..5 {
            g.replay()?;
        }
        opt.step()?;
        assert_eq!(opt.step_count()?, 6);
        Ok(())
    });
}

#[test]
fn zero_grad_and_set_lr_rules() {
    on_each_backend(|dev| {
        let ps = params(dev, 5)?;
        set_grads(&ps, 0)?;
        let sgd = Sgd::new(&ps, SgdConfig::default())?;
        sgd.zero_grad()?;
        assert!(ps.iter().all(|p| p.grad.to_vec().unwrap().iter().all(|v| *v == 0.0)));
        set_grads(&ps, 1)?;
        let adam = AdamW::new(&ps, AdamWConfig::default())?;
        // zero_grad is capturable.
        let mut g = Graph::new(dev);
        g.capture(CaptureMode::Global, || {
            // Writing the rate from the host is illegal inside a capture.
            expect_err("set_lr in capture", adam.set_lr(0.5), |e| matches!(e, Error::IllegalDuringCapture { .. }))?;
            adam.zero_grad()
        })?;
        assert!(ps[0].grad.to_vec()?.iter().any(|v| *v != 0.0), "capture only records");
        g.replay()?;
        assert!(ps.iter().all(|p| p.grad.to_vec().unwrap().iter().all(|v| *v == 0.0)));
        expect_err("negative lr", sgd.set_lr(-1.0), hyper("lr"))?;
        expect_err("nan lr", adam.set_lr(f32::NAN), hyper("lr"))?;
        Ok(())
    });
}

#[test]
fn optimizers_reject_bad_configuration() {
    on_each_backend(|dev| {
        let ps = params(dev, 6)?;
        let no_params = |e: &Error| matches!(e, Error::Optim(OptimError::NoParams { .. }));
        expect_err("no params", Sgd::new(&[], SgdConfig::default()), no_params)?;
        expect_err("no params", AdamW::new(&[], AdamWConfig::default()), no_params)?;
        expect_err("momentum", Sgd::new(&ps, SgdConfig { momentum: -0.5, ..Default::default() }), hyper("momentum"))?;
        expect_err("beta1", AdamW::new(&ps, AdamWConfig { beta1: 1.0, ..Default::default() }), hyper("beta1"))?;
        expect_err("beta2", AdamW::new(&ps, AdamWConfig { beta2: -0.1, ..Default::default() }), hyper("beta2"))?;
        expect_err("eps", AdamW::new(&ps, AdamWConfig { eps: f32::INFINITY, ..Default::default() }), hyper("eps"))?;
        // A grad of the wrong shape.
        let bad = Param { value: Tensor::zeros(dev, &[3])?, grad: Tensor::zeros(dev, &[4])? };
        expect_err("grad shape", Sgd::new(&[bad], SgdConfig::default()), is_shape)?;
        Ok(())
    });
}

/// `step_and_zero_grad` (the grads zeroed inside the update kernels) equals `step` then
/// `zero_grad` bit for bit, for f32 AdamW and for AdamW over bf16 weights with f32 masters,
/// eager and replayed from a graph.
#[test]
fn step_and_zero_grad_equals_step_then_zero_grad() {
    use graphed::optim::MixedAdamW;
    use graphed::DType;
    on_each_backend(|dev| {
        for dtype in [DType::F32, DType::BF16] {
            let run = |fused: bool| -> Result<Vec<Vec<u32>>> {
                let ps: Vec<Param> = SHAPES
                    .iter()
                    .enumerate()
                    .map(|(i, s)| {
                        let n: usize = s.iter().product();
                        Param::new(Tensor::from_slice_as(dev, &random_vec(n, 90 + i as u64), s, dtype)?)
                    })
                    .collect::<Result<_>>()?;
                let cfg = AdamWConfig { lr: 1e-2, ..Default::default() };
                let step: Box<dyn Fn() -> Result<()>> = match dtype {
                    DType::F32 => {
                        let o = AdamW::new(&ps, cfg)?;
                        if fused {
                            Box::new(move || o.step_and_zero_grad())
                        } else {
                            Box::new(move || o.step().and_then(|()| o.zero_grad()))
                        }
                    }
                    _ => {
                        let o = MixedAdamW::new(&ps, cfg, None)?;
                        if fused {
                            Box::new(move || o.step_and_zero_grad())
                        } else {
                            Box::new(move || o.step().and_then(|()| o.zero_grad()))
                        }
                    }
                };
                let mut g = Graph::new(dev);
                let mut out = Vec::new();
                for s in 0..4 {
                    for (i, p) in ps.iter().enumerate() {
                        p.grad.copy_from_slice(&random_vec(p.grad.numel(), 200 + 10 * s + i as u64))?;
                    }
                    match s {
                        0 => step()?,
                        1 => g.capture(CaptureMode::Global, &step)?,
                        _ => g.replay()?,
                    }
                    if s != 1 {
                        for p in &ps {
                            out.push(p.value.to_vec()?.iter().map(|v| v.to_bits()).collect());
                            out.push(p.grad.to_vec()?.iter().map(|v| v.to_bits()).collect());
                        }
                    }
                }
                Ok(out)
            };
            let (want, got) = (run(false)?, run(true)?);
            assert!(want == got, "{dtype}: step_and_zero_grad differs from step + zero_grad");
            assert!(got.iter().skip(1).step_by(2).all(|g| g.iter().all(|b| *b == 0)), "{dtype}: grads not zeroed");
        }
        Ok(())
    });
}
