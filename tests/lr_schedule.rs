//! AdamW's device-side warm-up + cosine learning rate (#13): eager steps and replays of a
//! captured step follow `WarmupCosine::lr_at`; bad schedules are typed errors.

mod common;
mod ops_support;

use common::on_each_backend;
use graphed::optim::{AdamW, AdamWConfig, WarmupCosine};
use graphed::{ops, CaptureMode, Error, Graph, OptimError, Param, Tensor};
use ops_support::*;

const S: WarmupCosine = WarmupCosine { peak: 3e-3, floor: 3e-4, warmup: 5, total: 25 };

#[test]
fn the_rate_follows_the_schedule_eagerly_and_under_replay() {
    on_each_backend(|dev| {
        let p = Param::new(Tensor::full(dev, &[8], 1.0)?)?;
        ops::fill_(&p.grad, 0.5)?;
        let opt =
            AdamW::new(std::slice::from_ref(&p), AdamWConfig { lr: 9.0, ..Default::default() })?.with_schedule(S)?;
        for t in 1..=3 {
            opt.step()?;
            check_ref(dev, &format!("eager step {t}"), &[opt.lr()?], &[S.lr_at(t)], 1e-6)?;
        }
        let mut g = Graph::new(dev);
        g.capture(CaptureMode::Global, || opt.step())?;
        let mut seen = Vec::new();
        for t in 4..=30 {
            g.replay()?;
            check_ref(dev, &format!("replay, step {t}"), &[opt.lr()?], &[S.lr_at(t)], 1e-6)?;
            seen.push(opt.lr()?);
        }
        assert_eq!(opt.step_count()?, 30);
        // Up to the peak at step 5, down to the floor at 25, flat after.
        assert!(seen[0] < seen[1] && seen[1] > seen[10] && seen[10] > seen[21]);
        assert_eq!(S.lr_at(5), S.peak);
        assert_eq!(S.lr_at(25), S.floor);
        Ok(())
    });
}

#[test]
fn a_bad_schedule_is_a_typed_error() {
    on_each_backend(|dev| {
        let p = Param::new(Tensor::zeros(dev, &[2])?)?;
        for bad in [
            WarmupCosine { floor: 1.0, ..S },
            WarmupCosine { warmup: 30, ..S },
            WarmupCosine { peak: f32::NAN, ..S },
            WarmupCosine { floor: -1.0, ..S },
        ] {
            let r = AdamW::new(std::slice::from_ref(&p), AdamWConfig::default())?.with_schedule(bad);
            expect_err("bad schedule", r.map(|_| ()), |e| {
                matches!(e, Error::Optim(OptimError::Schedule { op: "AdamW::with_schedule", .. }))
            })?;
        }
        Ok(())
    });
}
