//! Captures sharing one pool: a buffer a later capture hands out can lie in memory an earlier
//! graph writes as a temporary (the pool lends freed blocks to later captures). Each replay of
//! the earlier graph overwrites it, so every handle to it goes stale then, and a typed error
//! on use says so; the graph that made the buffer writes it again. Graphed modules sharing a
//! pool (`GraphOptions::pool`) and raw graphs (`Graph::with_pool`) alike; captures that share
//! nothing keep their handles as before.

mod common;

use common::model::{Block, BlockInputs, GraphedBlock};
use common::{on_each_backend, random};
use graphed::{ops, CaptureMode, Cx, Device, Error, Graph, Result, Tensor};

const B: usize = 4;
const H: usize = 8;

/// Whether `r` is an `Error::StaleTensor` that another capture's graph caused.
fn overwritten_by_another_capture<T>(r: Result<T>) -> bool {
    matches!(r, Err(Error::StaleTensor { overwritten_by_another_capture: true, .. }))
}

/// Two blocks graphed one after the other into one pool; the later one's output is held
/// across the earlier one's replays.
#[test]
fn a_later_modules_output_goes_stale_when_an_earlier_module_overwrites_it() {
    on_each_backend(|dev| {
        let x = random(dev, &[B, H], 5)?.with_requires_grad(true);
        let dy = random(dev, &[B, H], 6)?;
        let pool = dev.new_pool();
        let opts = || GraphedBlock::options().pool(&pool);
        let mut a = GraphedBlock::new(Block::new(dev, H, H, 1)?, BlockInputs { x: x.clone() }, opts())?;
        let mut b = GraphedBlock::new(Block::new(dev, H, H, 2)?, BlockInputs { x: x.clone() }, opts())?;
        a.forward(&x)?;
        a.backward(&dy)?;
        let yb = b.forward(&x)?;
        let before = yb.to_vec()?;
        assert_eq!(before, Block::new(dev, H, H, 2)?.forward(&mut Cx::new(dev), &x)?.to_vec()?);
        b.backward(&dy)?;
        assert!(yb.is_fresh(), "nothing replayed since b's forward");
        // The next iteration: a's graphs write their temporaries, where b's output lies (the
        // pool lent them to b's capture).
        let x2 = random(dev, &[B, H], 7)?.with_requires_grad(true);
        a.forward(&x2)?;
        a.backward(&dy)?;
        if yb.is_fresh() {
            // Only where the allocator placed b's output elsewhere: then it must not change.
            assert!(!dev.is_host(), "on the host b's output lies in a's temporaries");
            assert_eq!(yb.to_vec()?, before, "a fresh handle read changed memory");
        } else {
            assert!(overwritten_by_another_capture(yb.to_vec()), "{:?}", yb.to_vec().err());
            assert!(overwritten_by_another_capture(ops::add(&yb, &x)), "an op refuses it too");
            let message = yb.to_vec().expect_err("stale").to_string();
            assert!(message.contains("another capture sharing the pool"), "{message}");
            // Passed back in, it is refused and changes nothing: b's forward is still due.
            assert!(overwritten_by_another_capture(b.forward(&yb)), "a stale input");
        }
        // b's own replay writes its output again: the new handle is valid and right, the old
        // one stays stale (b's forward overwrote it, as any graphed output).
        let yb2 = b.forward(&x)?;
        assert!(yb2.is_fresh());
        assert_eq!(yb2.to_vec()?, before);
        assert!(!yb.is_fresh(), "b's own replay made the old handle stale");
        b.backward(&dy)?;
        assert_eq!(yb2.to_vec()?, before, "b's backward does not touch it");
        Ok(())
    });
}

/// The same through a fused step each: a's step overwrites what b's step left.
#[test]
fn a_fused_step_of_an_earlier_module_makes_a_later_modules_outputs_stale() {
    on_each_backend(|dev| {
        let x = random(dev, &[B, H], 15)?.with_requires_grad(true);
        let pool = dev.new_pool();
        let opts = || GraphedBlock::options().pool(&pool);
        let mut a = GraphedBlock::new(Block::new(dev, H, H, 11)?, BlockInputs { x: x.clone() }, opts())?;
        let mut b = GraphedBlock::new(Block::new(dev, H, H, 12)?, BlockInputs { x: x.clone() }, opts())?;
        a.fuse()?;
        b.fuse()?;
        a.step()?;
        b.step()?;
        let yb = b.inner().outputs(0, 0)?.remove(0).expect("output");
        let before = yb.to_vec()?;
        a.step()?;
        if yb.is_fresh() {
            assert!(!dev.is_host(), "on the host b's output lies in a's temporaries");
            assert_eq!(yb.to_vec()?, before, "a fresh handle read changed memory");
        } else {
            assert!(overwritten_by_another_capture(yb.to_vec()));
            // A handle asked for now is stale as well: the memory holds a's temporaries.
            let now = b.inner().outputs(0, 0)?.remove(0).expect("output");
            assert!(!now.is_fresh(), "b has not written its output again yet");
        }
        b.step()?;
        let yb2 = b.inner().outputs(0, 0)?.remove(0).expect("output");
        assert!(yb2.is_fresh());
        assert_eq!(yb2.to_vec()?, before);
        Ok(())
    });
}

/// Raw graphs: the second capture's first output lands in the first graph's temporary, its
/// second one in memory the first graph never wrote.
#[test]
fn raw_graphs_sharing_a_pool_stale_exactly_the_outputs_they_overwrite() {
    on_each_backend(|dev| {
        let pool = dev.new_pool();
        let x = random(dev, &[4096], 21)?;
        let xs = x.to_vec()?;
        let times = |k: f32| xs.iter().map(|v| v * k).collect::<Vec<_>>();
        let mut first = Graph::with_pool(dev, &pool);
        let out1 = first.capture(CaptureMode::Global, || {
            let t = ops::scale(&x, 2.0)?; // a temporary, freed at the end of the capture
            ops::scale(&t, 3.0)
        })?;
        let mut second = Graph::with_pool(dev, &pool);
        let (lent, own) = second.capture(CaptureMode::Global, || Ok((ops::scale(&x, 5.0)?, ops::scale(&x, 7.0)?)))?;
        first.replay()?;
        second.replay()?;
        for (t, k) in [(&out1, 6.0), (&lent, 5.0), (&own, 7.0)] {
            assert!(t.is_fresh());
            assert_eq!(t.to_vec()?, times(k));
        }
        for _ in 0..2 {
            first.replay()?;
            // `lent` lies in the first graph's temporary: overwritten, and stale.
            assert!(!lent.is_fresh());
            assert!(overwritten_by_another_capture(lent.to_vec()));
            assert!(overwritten_by_another_capture(ops::scale(&lent, 1.0)));
            // `own` does not overlap it, and a graph never stales its own outputs.
            assert!(own.is_fresh() && out1.is_fresh());
            assert_eq!(own.to_vec()?, times(7.0));
            assert_eq!(out1.to_vec()?, times(6.0));
            // The second graph writes `lent` again: valid, and right.
            second.replay()?;
            assert!(lent.is_fresh());
            assert_eq!(lent.to_vec()?, times(5.0));
        }
        // Once the graph that made it is gone, nothing writes it again: stale for good.
        drop(second);
        first.replay()?;
        assert!(overwritten_by_another_capture(lent.to_vec()));
        first.replay()?;
        assert!(!lent.is_fresh());
        assert_eq!(own.to_vec()?, times(7.0), "outside the first graph's memory: untouched");
        Ok(())
    });
}

/// Modules in pools of their own share no memory: their handles behave as they always did.
#[test]
fn modules_in_pools_of_their_own_keep_their_handles() {
    on_each_backend(|dev| {
        let x = random(dev, &[B, H], 31)?.with_requires_grad(true);
        let dy = random(dev, &[B, H], 32)?;
        let inputs = || BlockInputs { x: x.clone() };
        let mut a = GraphedBlock::new(Block::new(dev, H, H, 1)?, inputs(), GraphedBlock::options())?;
        let mut b = GraphedBlock::new(Block::new(dev, H, H, 2)?, inputs(), GraphedBlock::options())?;
        assert!(a.inner().pool() != b.inner().pool());
        let yb = b.forward(&x)?;
        let dxb = b.backward(&dy)?.expect("dx");
        let (y, dx) = (yb.to_vec()?, dxb.to_vec()?);
        for seed in 33..35 {
            a.forward(&random(dev, &[B, H], seed)?)?;
            a.backward(&dy)?;
        }
        assert!(yb.is_fresh() && dxb.is_fresh());
        assert_eq!((yb.to_vec()?, dxb.to_vec()?), (y, dx));
        // Their own replays stale them, as before.
        b.forward(&x)?;
        assert!(matches!(yb.to_vec(), Err(Error::StaleTensor { overwritten_by_another_capture: false, .. })));
        Ok(())
    });
}

/// A raw graph alone in its pool: its output stays valid across its replays, which write it.
#[test]
fn a_raw_graphs_own_output_stays_valid_across_its_replays() {
    on_each_backend(|dev: &Device| {
        let x = random(dev, &[256], 41)?;
        let mut g = Graph::new(dev);
        let y: Tensor = g.capture(CaptureMode::Global, || ops::scale(&ops::scale(&x, 2.0)?, 0.5))?;
        for _ in 0..3 {
            g.replay()?;
            assert!(y.is_fresh());
            assert_eq!(y.to_vec()?, x.to_vec()?);
        }
        Ok(())
    });
}
