//! Mixed-precision optimizers (#12): f32 master weights behind bf16/f16 model weights, the
//! model rewritten inside the (captured) step, and device-side dynamic loss scaling that skips
//! a step on overflow without a host sync. Host always; CUDA when a GPU is usable.

mod common;

use common::{if_else_in_one_node, on_each_backend, random_vec, rel_err};
use graphed::ops::{self, cpu};
use graphed::optim::{AdamWConfig, LossScaler, LossScalerConfig, MixedAdamW};
use graphed::{CaptureMode, DType, Device, Error, Graph, OptimError, Param, Result, Tensor};

const CFG: AdamWConfig = AdamWConfig { lr: 1e-2, beta1: 0.9, beta2: 0.999, eps: 1e-8, weight_decay: 1e-2 };

fn param(dev: &Device, n: usize, seed: u64, dtype: DType) -> Result<Param> {
    Param::new(Tensor::from_slice_as(dev, &random_vec(n, seed), &[n], dtype)?)
}

/// The f32 reference of `steps` AdamW steps from `p0` with the grads `grads[t]`.
fn reference(p0: &[f32], grads: &[Vec<f32>]) -> Vec<f32> {
    let (mut p, mut m, mut v) = (p0.to_vec(), vec![0.0; p0.len()], vec![0.0; p0.len()]);
    for (t, g) in grads.iter().enumerate() {
        cpu::adamw_step(
            &mut p,
            g,
            &mut m,
            &mut v,
            CFG.lr,
            t as u32 + 1,
            CFG.beta1,
            CFG.beta2,
            CFG.eps,
            CFG.weight_decay,
        );
    }
    p
}

fn check_master_and_model(dev: &Device, opt: &MixedAdamW, p: &Param, want: &[f32]) -> Result<()> {
    let master = opt.masters()[0].value.to_vec()?;
    let e = rel_err(&master, want);
    // The host runs the reference's arithmetic; CUDA's sqrtf/division agree to the last bit
    // or one ulp.
    let tol = if dev.is_host() { 0.0 } else { 1e-6 };
    assert!(e <= tol, "master weights: relative error {e:e}");
    let rounded: Vec<f32> = master.iter().map(|v| p.value.dtype().round(*v)).collect();
    assert_eq!(p.value.to_vec()?, rounded, "the model weights are the masters rounded");
    Ok(())
}

#[test]
fn bf16_weights_follow_f32_masters_eager_and_captured() {
    on_each_backend(|dev| {
        let n = 1001;
        let grads: Vec<Vec<f32>> = (0..4).map(|t| random_vec(n, 100 + t)).collect();
        let p = param(dev, n, 1, DType::BF16)?;
        let p0 = p.value.to_vec()?;
        let opt = MixedAdamW::new(std::slice::from_ref(&p), CFG, None)?;
        for g in &grads[..2] {
            p.grad.copy_from_slice(g)?;
            opt.step()?;
        }
        check_master_and_model(dev, &opt, &p, &reference(&p0, &grads[..2]))?;
        // The same step captured: each replay reads the grad buffer and the device step count.
        let mut graph = Graph::new(dev);
        graph.capture(CaptureMode::Global, || opt.step())?;
        for g in &grads[2..] {
            p.grad.copy_from_slice(g)?;
            graph.replay()?;
        }
        assert_eq!(opt.step_count()?, 4);
        check_master_and_model(dev, &opt, &p, &reference(&p0, &grads))
    });
}

#[test]
fn replayed_mixed_steps_equal_eager_steps_bitwise() {
    on_each_backend(|dev| {
        let run = |captured: bool| -> Result<(Vec<f32>, Vec<f32>)> {
            let p = param(dev, 777, 3, DType::BF16)?;
            let opt = MixedAdamW::new(std::slice::from_ref(&p), CFG, None)?;
            let mut graph = Graph::new(dev);
            if captured {
                graph.capture(CaptureMode::Global, || opt.step())?;
            }
            for t in 0..3 {
                p.grad.copy_from_slice(&random_vec(777, 10 + t))?;
                if captured {
                    graph.replay()?
                } else {
                    opt.step()?
                }
            }
            Ok((opt.masters()[0].value.to_vec()?, p.value.to_vec()?))
        };
        let (eager, replayed) = (run(false)?, run(true)?);
        assert_eq!(
            eager.0.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            replayed.0.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
        );
        assert_eq!(eager.1, replayed.1);
        Ok(())
    });
}

#[test]
fn f16_without_loss_scaling_is_refused() {
    on_each_backend(|dev| {
        let p = param(dev, 8, 1, DType::F16)?;
        let r = MixedAdamW::new(std::slice::from_ref(&p), CFG, None);
        assert!(matches!(r, Err(Error::F16NeedsLossScaling { op: "MixedAdamW::new" })), "{r:?}");
        let f = param(dev, 8, 2, DType::F32)?;
        assert!(matches!(MixedAdamW::new(&[f], CFG, None), Err(Error::DType { .. })));
        let bad = LossScaler::new(dev, LossScalerConfig { backoff_factor: 1.5, ..Default::default() });
        assert!(matches!(bad, Err(Error::Optim(OptimError::HyperParameter { name: "backoff_factor", .. }))));
        let scaler = LossScaler::new(dev, LossScalerConfig::default())?;
        MixedAdamW::new(&[p], CFG, Some(scaler)).map(|_| ())
    });
}

#[test]
fn loss_scaling_skips_overflowing_steps_on_the_device() {
    on_each_backend(|dev| {
        let n = 300;
        let p = param(dev, n, 5, DType::F16)?;
        let p0 = p.value.to_vec()?;
        let cfg = LossScalerConfig { init_scale: 1024.0, growth_factor: 2.0, backoff_factor: 0.5, growth_interval: 2 };
        let opt = MixedAdamW::new(std::slice::from_ref(&p), CFG, Some(LossScaler::new(dev, cfg)?))?;
        let scaler = opt.scaler().expect("a scaler");
        // The whole step (unscale, check, skip-or-update, rescale) as one graph.
        let mut graph = Graph::new(dev);
        graph.capture(CaptureMode::Global, || opt.step())?;
        let g1 = random_vec(n, 7);
        let mut applied = Vec::new();
        // Grads arrive scaled by the current scale, as backward of a scaled loss gives them.
        let scaled = |g: &[f32], s: f32| g.iter().map(|v| v * s).collect::<Vec<f32>>();

        // 1: an overflow (an infinite grad): skipped, the scale halves.
        let mut bad = scaled(&g1, 1024.0);
        bad[17] = f32::INFINITY;
        p.grad.copy_from_slice(&bad)?;
        graph.replay()?;
        assert_eq!((scaler.scale()?, scaler.skipped_steps()?, opt.step_count()?), (512.0, 1, 0));
        assert_eq!(opt.masters()[0].value.to_vec()?, p0, "a skipped step changes no weight");

        // 2 and 3: finite grads at scale 512; after 2 good steps the scale doubles.
        for t in 0..2 {
            let g = random_vec(n, 20 + t);
            p.grad.copy_from_slice(&scaled(&g, 512.0))?;
            graph.replay()?;
            applied.push(g);
        }
        assert_eq!((scaler.scale()?, scaler.skipped_steps()?, opt.step_count()?), (1024.0, 1, 2));
        let want = reference(&p0, &applied);
        let master = opt.masters()[0].value.to_vec()?;
        // Unscaling by a power of two is exact: the reference sees the same grads.
        assert!(rel_err(&master, &want) <= if dev.is_host() { 0.0 } else { 1e-6 });
        assert_eq!(p.value.to_vec()?, master.iter().map(|v| DType::F16.round(*v)).collect::<Vec<_>>());
        Ok(())
    });
}

#[test]
fn scaling_the_loss_grad_reads_the_device_scale() {
    on_each_backend(|dev| {
        let scaler = LossScaler::new(dev, LossScalerConfig { init_scale: 8.0, ..Default::default() })?;
        let pred = Tensor::from_slice_as(dev, &[1.0, 2.0, 3.0], &[3], DType::F16)?;
        let target = Tensor::from_slice_as(dev, &[0.0, 0.0, 0.0], &[3], DType::F16)?;
        let mut graph = Graph::new(dev);
        let d = graph.capture(CaptureMode::Global, || {
            let d = ops::mse_backward(&pred, &target, 1.0)?;
            scaler.scale_grad_(&d)?;
            Ok(d)
        })?;
        graph.replay()?;
        let want: Vec<f32> = cpu::mse_backward(&[1.0, 2.0, 3.0], &[0.0; 3], 1.0)
            .iter()
            .map(|v| DType::F16.round(DType::F16.round(*v) * 8.0))
            .collect();
        assert_eq!(d.to_vec()?, want);
        Ok(())
    });
}

#[derive(graphed::Parameters)]
struct Half {
    w: Param,
    h: Param,
    f: Param,
}

#[test]
fn sixteen_bit_parameters_round_trip_through_safetensors_bit_for_bit() {
    on_each_backend(|dev| {
        let make = |seed| -> Result<Half> {
            Ok(Half {
                w: param(dev, 33, seed, DType::BF16)?,
                h: param(dev, 7, seed + 1, DType::F16)?,
                f: param(dev, 5, seed + 2, DType::F32)?,
            })
        };
        let (saved, loaded) = (make(1)?, make(10)?);
        let path = std::env::temp_dir().join(format!(
            "graphed-half-{}-{}.safetensors",
            dev.name().replace(' ', "_"),
            std::process::id()
        ));
        graphed::save_safetensors(&saved, &path)?;
        graphed::load_safetensors(&loaded, &path)?;
        assert_eq!(loaded.w.value.to_bf16_vec()?, saved.w.value.to_bf16_vec()?);
        assert_eq!(loaded.h.value.to_f16_vec()?, saved.h.value.to_f16_vec()?);
        assert_eq!(loaded.f.value.to_vec()?, saved.f.value.to_vec()?);
        // A bf16 tensor in the file for an f32 parameter is refused before anything is written.
        let wrong = Half {
            w: param(dev, 33, 20, DType::F32)?,
            h: param(dev, 7, 21, DType::F16)?,
            f: param(dev, 5, 22, DType::F32)?,
        };
        let before = wrong.h.value.to_f16_vec()?;
        let r = graphed::load_safetensors(&wrong, &path);
        assert!(matches!(r, Err(Error::CheckpointTensorMismatch { ref tensor, .. }) if tensor == "w"), "{r:?}");
        assert_eq!(wrong.h.value.to_f16_vec()?, before);
        std::fs::remove_file(&path).ok();
        Ok(())
    });
}

#[test]
fn mixed_sgd_follows_f32_masters_and_skips_overflows() {
    on_each_backend(|dev| {
        use graphed::optim::{MixedSgd, SgdConfig};
        let cfg = SgdConfig { lr: 0.05, momentum: 0.9, weight_decay: 1e-2 };
        let n = 500;
        for dtype in [DType::BF16, DType::F16] {
            let p = param(dev, n, 40, dtype)?;
            let p0 = p.value.to_vec()?;
            let scaler = LossScaler::new(dev, LossScalerConfig { init_scale: 256.0, ..Default::default() })?;
            let opt = MixedSgd::new(std::slice::from_ref(&p), cfg, Some(scaler))?;
            let mut graph = Graph::new(dev);
            graph.capture(CaptureMode::Global, || opt.step())?;
            let (mut want, mut buf) = (p0.clone(), vec![0.0; n]);
            for t in 0..3u64 {
                let g = random_vec(n, 50 + t);
                let mut scaled: Vec<f32> = g.iter().map(|v| v * 256.0).collect();
                if t == 1 {
                    scaled[3] = f32::NAN; // skipped; the scale halves to 128
                }
                let s = opt.scaler().expect("scaler").scale()?;
                let scaled: Vec<f32> = if t == 2 { g.iter().map(|v| v * s).collect() } else { scaled };
                p.grad.copy_from_slice(&scaled)?;
                graph.replay()?;
                if t != 1 {
                    cpu::sgd_step(&mut want, &g, Some(&mut buf), cfg.lr, cfg.momentum, cfg.weight_decay);
                }
            }
            assert_eq!(opt.scaler().expect("scaler").skipped_steps()?, 1);
            let master = opt.masters()[0].value.to_vec()?;
            assert!(rel_err(&master, &want) <= if dev.is_host() { 0.0 } else { 1e-6 }, "{dtype} masters");
            assert_eq!(p.value.to_vec()?, master.iter().map(|v| dtype.round(*v)).collect::<Vec<_>>());
        }
        let f16 = param(dev, 4, 1, DType::F16)?;
        let r = MixedSgd::new(&[f16], SgdConfig::default(), None);
        assert!(matches!(r, Err(Error::F16NeedsLossScaling { op: "MixedSgd::new" })), "{r:?}");
        Ok(())
    });
}

/// Every value the step writes, as bits: the model weights, the masters and the moments.
fn written(opt: &MixedAdamW, model: &[Param]) -> Result<Vec<Vec<u32>>> {
    let (m, v) = opt.moments();
    let tensors = model.iter().map(|p| &p.value).chain(opt.masters().iter().map(|p| &p.value)).chain(m).chain(v);
    tensors.map(|t| Ok(t.to_vec()?.iter().map(|x| x.to_bits()).collect())).collect()
}

/// A captured f16 step with a loss scaler puts its update under an IF node: the update's
/// kernels are not among the graph's nodes (they are in the node's body), the scale's update
/// is no launch of its own on CUDA (the kernel that sets the condition does it), and a replay after an
/// overflow leaves the weights, masters and moments bitwise as they were while it counts the
/// skip, zeroes the grads and halves the scale. (Bitwise equality with the step that launches
/// the update at every replay, eager and replayed: `tests/multi_tensor.rs`.)
#[test]
fn an_overflowed_captured_step_skips_its_update_under_an_if_node() {
    on_each_backend(|dev| {
        let model: Vec<Param> =
            (0..3).map(|i| param(dev, 1000 + 37 * i, 60 + i as u64, DType::F16)).collect::<Result<_>>()?;
        let cfg = LossScalerConfig { init_scale: 1024.0, ..Default::default() };
        let opt = MixedAdamW::new(&model, CFG, Some(LossScaler::new(dev, cfg)?))?;
        let scaler = opt.scaler().expect("a scaler");
        let mut graph = Graph::new(dev);
        graph.capture(CaptureMode::Global, || opt.step_and_zero_grad())?;
        let nodes = graph.nodes()?;
        let kernels: Vec<&str> = nodes.iter().filter_map(|n| n.kernel.as_deref()).collect();
        assert!(!kernels.iter().any(|k| k.starts_with("adamw")), "the update is outside the IF node: {kernels:?}");
        let conditionals = match dev.is_host() {
            // One recorded op tests the flag and runs one of the two bodies.
            true => kernels.iter().filter(|k| **k == "if_else").count(),
            // One IF node with an else body (CUDA 12.8), or one IF node a branch.
            false => nodes.iter().filter(|n| n.kind == graphed::NodeKind::Conditional).count(),
        };
        assert_eq!(conditionals, if dev.is_host() || if_else_in_one_node(dev) { 1 } else { 2 }, "{nodes:?}");
        // The scale's update runs before the node: on CUDA in the kernel that sets its
        // condition (no launch of its own), on the host as an op.
        let updates = |name: &str| kernels.iter().filter(|k| **k == name).count();
        assert_eq!(updates("amp_update"), usize::from(dev.is_host()), "{kernels:?}");
        assert_eq!(updates("graphed_amp_update_set"), usize::from(dev.is_cuda()), "{kernels:?}");
        let set_grads = |seed: u64, overflow: bool| -> Result<()> {
            for (i, p) in model.iter().enumerate() {
                let mut g: Vec<f32> = random_vec(p.grad.numel(), seed + i as u64).iter().map(|v| v * 1024.0).collect();
                if overflow && i == 1 {
                    g[5] = f32::NAN;
                }
                p.grad.copy_from_slice(&g)?;
            }
            Ok(())
        };
        // A good step moves the weights.
        let before = written(&opt, &model)?;
        set_grads(70, false)?;
        graph.replay()?;
        let moved = written(&opt, &model)?;
        assert!(moved != before, "a good step changes the weights");
        assert_eq!((opt.step_count()?, scaler.skipped_steps()?), (1, 0));
        // An overflow: nothing the update writes changes.
        set_grads(80, true)?;
        graph.replay()?;
        assert!(written(&opt, &model)? == moved, "a skipped step changed a weight, master or moment");
        assert_eq!((opt.step_count()?, scaler.skipped_steps()?, scaler.scale()?), (1, 1, 512.0));
        for p in &model {
            assert!(p.grad.to_vec()?.iter().all(|v| v.to_bits() == 0), "a skipped step zeroes the grads");
        }
        // The next good step updates again.
        set_grads(90, false)?;
        graph.replay()?;
        assert!(written(&opt, &model)? != moved);
        assert_eq!((opt.step_count()?, scaler.skipped_steps()?), (2, 1));
        Ok(())
    });
}
