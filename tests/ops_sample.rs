//! Sampling on the device (`ops::sample`): the CPU reference's tokens on both backends across
//! dtypes, temperatures and top-k cuts; the distribution it draws from (softmax of the scaled
//! logits over the top-k); reproducibility from the generator's state, eager against replay;
//! greedy settings equal to argmax; and the errors, before anything runs.

mod common;
mod ops_support;

use common::{on_each_backend, random_vec};
use graphed::ops::{self, cpu, Sampling};
use graphed::{CaptureMode, DType, Device, Error, Generator, Graph, Result, Tensor};
use ops_support::*;

/// The generator's (seed, offset) as the reference takes them.
fn state(rng: &Generator) -> Result<(u64, u64)> {
    rng.seed_and_offset()
}

/// The reference's tokens on every backend (bitwise: indices; the noise's logarithms are f64
/// on both sides, so only scores within an f64 rounding of each other could differ, which
/// these seeds do not hit), across dtypes, vocabularies not a multiple of the block, top-k
/// cuts with ties at the cut, and NaN (never drawn).
#[test]
fn sample_matches_the_reference() {
    on_each_backend(|dev| {
        let rng = Generator::new(dev, 11)?;
        for dtype in [DType::F32, DType::BF16, DType::F16] {
            for (batch, vocab) in [(1, 1), (3, 7), (5, 256), (2, 50257)] {
                let mut x: Vec<f32> =
                    random_vec(batch * vocab, vocab as u64).into_iter().map(|v| dtype.round(4.0 * v)).collect();
                if vocab >= 7 {
                    x[0] = f32::NAN;
                    x[2] = 3.0;
                    x[5] = 3.0; // a tie, at the cut for top_k 2 if nothing else is larger
                }
                let t = Tensor::from_slice_as(dev, &x, &[batch, vocab], dtype)?;
                for (temperature, top_k) in [(1.0, 0), (0.7, 2), (1.3, 5), (0.05, 40), (2.0, vocab)] {
                    let (seed, offset) = state(&rng)?;
                    let got = ops::sample(&t, Sampling { temperature, top_k }, &rng)?;
                    assert_eq!(got.dtype(), DType::I32);
                    let want = cpu::sample(&t.to_vec()?, batch, vocab, temperature, top_k, seed, offset);
                    let what = format!("{dtype} [{batch}, {vocab}] t={temperature} k={top_k}");
                    assert_eq!(got.to_i32_vec()?, want, "{what}");
                    let drawn = if top_k == 1 { 0 } else { batch * vocab }; // top_k 1 is greedy
                    assert_eq!(state(&rng)?, (seed, offset + drawn as u64), "{what}: offset");
                    if vocab >= 7 {
                        assert_ne!(want[0], 0, "{what}: NaN drawn");
                    }
                }
            }
        }
        Ok(())
    });
}

/// Drawn from softmax(logits / temperature) over the top-k: 40,000 rows of the same 6 logits,
/// counts within 5 standard deviations of the expected ones, nothing outside the top-k.
#[test]
fn sample_draws_from_the_tempered_top_k_softmax() {
    on_each_backend(|dev| {
        let rng = Generator::new(dev, 5)?;
        let logits = [1.0f32, 0.0, 2.5, -1.0, 2.0, 0.5];
        let rows = 40_000;
        let x: Vec<f32> = (0..rows).flat_map(|_| logits).collect();
        let t = Tensor::from_slice(dev, &x, &[rows, 6])?;
        for (temperature, top_k) in [(1.0f32, 0usize), (0.5, 3), (2.0, 4)] {
            let mut order: Vec<usize> = (0..6).collect();
            order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]));
            let kept = if top_k == 0 { &order[..] } else { &order[..top_k] };
            let z: f64 = kept.iter().map(|&j| (logits[j] as f64 / temperature as f64).exp()).sum();
            let mut counts = [0usize; 6];
            for j in ops::sample(&t, Sampling { temperature, top_k }, &rng)?.to_i32_vec()? {
                counts[j as usize] += 1;
            }
            for j in 0..6 {
                let p = if kept.contains(&j) { (logits[j] as f64 / temperature as f64).exp() / z } else { 0.0 };
                let (mean, sd) = (p * rows as f64, (rows as f64 * p * (1.0 - p)).sqrt());
                let what = format!("t={temperature} k={top_k} token {j}: {} drawn, {mean:.0} expected", counts[j]);
                if p == 0.0 {
                    assert_eq!(counts[j], 0, "{what}");
                } else {
                    assert!((counts[j] as f64 - mean).abs() <= 5.0 * sd, "{what}");
                }
            }
        }
        Ok(())
    });
}

/// Greedy settings are argmax and draw nothing; the same state gives the same tokens; a
/// captured call replays what the eager call did (the state restored in the graph).
#[test]
fn sample_is_reproducible_and_greedy_is_argmax() {
    on_each_backend(|dev| {
        let rng = Generator::new(dev, 3)?;
        let x = Tensor::from_slice_as(dev, &random_vec(4 * 300, 9), &[4, 300], DType::BF16)?;
        let before = rng.seed_and_offset()?;
        for greedy in
            [Sampling::greedy(), Sampling { temperature: 0.0, top_k: 9 }, Sampling { temperature: 3.0, top_k: 1 }]
        {
            assert!(greedy.is_greedy());
            assert_eq!(ops::sample(&x, greedy, &rng)?.to_i32_vec()?, ops::argmax(&x)?.to_i32_vec()?);
        }
        assert_eq!(rng.seed_and_offset()?, before, "greedy sampling drew random numbers");
        let s = Sampling { temperature: 1.0, top_k: 50 };
        let saved = rng.save()?;
        let a = ops::sample(&x, s, &rng)?.to_i32_vec()?;
        let b = ops::sample(&x, s, &rng)?.to_i32_vec()?;
        rng.restore(&saved)?;
        assert_eq!(ops::sample(&x, s, &rng)?.to_i32_vec()?, a, "same state, same tokens");
        assert_ne!(a, b, "the state advanced: 4 rows of 50 candidates drew the same tokens twice");
        // Captured: the graph restores the state and samples, so each replay repeats `a`.
        let mut g = Graph::new(dev);
        let out = g.capture(CaptureMode::Global, || {
            rng.restore(&saved)?;
            ops::sample(&x, s, &rng)
        })?;
        for _ in 0..2 {
            g.replay()?;
            assert_eq!(out.to_i32_vec()?, a, "replay vs eager");
        }
        Ok(())
    });
}

/// Bad input is refused before anything runs: the generator's state does not move.
#[test]
fn sample_refuses_bad_input() {
    on_each_backend(|dev| {
        let rng = Generator::new(dev, 1)?;
        let x = Tensor::from_slice(dev, &[0.0, 1.0, 2.0, 3.0], &[2, 2])?;
        let before = rng.seed_and_offset()?;
        for temperature in [-1.0, f32::NAN, f32::INFINITY] {
            expect_err("temperature", ops::sample(&x, Sampling { temperature, top_k: 0 }, &rng), |e| {
                matches!(e, Error::InvalidTemperature { .. })
            })?;
        }
        let s = Sampling { temperature: 1.0, top_k: 0 };
        expect_err("rank", ops::sample(&Tensor::zeros(dev, &[4])?, s, &rng), is_shape)?;
        expect_err("empty", ops::sample(&Tensor::zeros(dev, &[2, 0])?, s, &rng), is_shape)?;
        let ints = Tensor::from_i32(dev, &[1, 2], &[1, 2])?;
        expect_err("i32 logits", ops::sample(&ints, s, &rng), |e| matches!(e, Error::DType { .. }))?;
        if dev.is_cuda() {
            let host_rng = Generator::new(&Device::host(), 1)?;
            expect_err("rng elsewhere", ops::sample(&x, s, &host_rng), |e| matches!(e, Error::DeviceMismatch { .. }))?;
        }
        assert_eq!(rng.seed_and_offset()?, before, "a refused call moved the generator");
        Ok(())
    });
}
