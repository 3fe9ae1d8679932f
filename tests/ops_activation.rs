//! relu, gelu and dropout with their backwards: CPU reference, finite differences, graph
//! replay, the graph-safe dropout mask, errors.

mod common;
mod ops_support;

use common::{on_each_backend, random, random_vec};
use graphed::ops::{self, cpu, Gelu};
use graphed::{CaptureMode, DType, Error, Generator, Graph, OpError, Tensor};
use ops_support::*;

/// Element counts, including non-multiples of 256 and more than one grid-stride round.
const SIZES: &[usize] = &[1, 7, 255, 257, 1000, 65_537];

/// Random values spread over [-4, 4), where GELU's tails matter.
fn wide(n: usize, seed: u64) -> Vec<f32> {
    random_vec(n, seed).into_iter().map(|v| 4.0 * v).collect()
}

#[test]
fn relu_forward_backward_match_reference() {
    on_each_backend(|dev| {
        for &n in SIZES {
            let (x, dy) = (random(dev, &[n], n as u64)?, random(dev, &[n], n as u64 + 1)?);
            let (xv, dyv) = (x.to_vec()?, dy.to_vec()?);
            check_ref(dev, &format!("relu {n}"), &ops::relu(&x)?.to_vec()?, &cpu::relu(&xv), TOL)?;
            check_ref(
                dev,
                &format!("relu_backward {n}"),
                &ops::relu_backward(&dy, &x)?.to_vec()?,
                &cpu::relu_backward(&dyv, &xv),
                TOL,
            )?;
        }
        Ok(())
    });
}

#[test]
fn gelu_forward_backward_match_reference() {
    on_each_backend(|dev| {
        for approx in [Gelu::Erf, Gelu::Tanh] {
            for &n in SIZES {
                let (xv, dyv) = (wide(n, 3 * n as u64), random_vec(n, 3 * n as u64 + 1));
                let (x, dy) = (Tensor::from_slice(dev, &xv, &[n])?, Tensor::from_slice(dev, &dyv, &[n])?);
                let what = format!("gelu {approx:?} {n}");
                check_ref(dev, &what, &ops::gelu(&x, approx)?.to_vec()?, &cpu::gelu(&xv, approx), TOL)?;
                check_ref(
                    dev,
                    &format!("{what} backward"),
                    &ops::gelu_backward(&dy, &x, approx)?.to_vec()?,
                    &cpu::gelu_backward(&dyv, &xv, approx),
                    TOL,
                )?;
            }
        }
        Ok(())
    });
}

#[test]
fn gelu_default_is_erf_and_known_values() {
    assert_eq!(Gelu::default(), Gelu::Erf);
    assert!((cpu::erf(0.5) - 0.520_499_877_813_046_5).abs() < 1e-15);
    assert!((cpu::erf(-2.5) + 0.999_593_047_982_555).abs() < 1e-15);
    on_each_backend(|dev| {
        // PyTorch: F.gelu(torch.tensor([-2., -0.5, 1., 3.])), and with approximate='tanh'.
        let x = Tensor::from_slice(dev, &[-2.0, -0.5, 1.0, 3.0], &[4])?;
        let cases = [
            (Gelu::Erf, [-0.045_500_26f32, -0.154_268_7, 0.841_344_7, 2.995_950_4]),
            (Gelu::Tanh, [-0.045_402_3f32, -0.154_286, 0.841_192, 2.996_362_7]),
        ];
        for (approx, want) in cases {
            for (got, want) in ops::gelu(&x, approx)?.to_vec()?.iter().zip(want) {
                assert!((got - want).abs() < 1e-6, "{approx:?} gelu {got} vs {want}");
            }
        }
        Ok(())
    });
}

#[test]
fn activation_backwards_match_finite_differences() {
    on_each_backend(|dev| {
        let n = 300;
        // Keep ReLU's inputs away from its kink at 0.
        let xv: Vec<f32> = wide(n, 9).into_iter().map(|v| if v.abs() < 0.1 { v + 0.5 } else { v }).collect();
        let r = random_vec(n, 10);
        let (x, dy) = (Tensor::from_slice(dev, &xv, &[n])?, Tensor::from_slice(dev, &r, &[n])?);
        check_fd("relu", &ops::relu_backward(&dy, &x)?.to_vec()?, &fd_grad(&xv, |x| dot(&r, &cpu::relu(x))))?;
        for approx in [Gelu::Erf, Gelu::Tanh] {
            let fd = fd_grad(&xv, |x| dot(&r, &cpu::gelu(x, approx)));
            check_fd(&format!("gelu {approx:?}"), &ops::gelu_backward(&dy, &x, approx)?.to_vec()?, &fd)?;
        }
        // Dropout with a fixed mask is linear in x.
        let rng = Generator::new(dev, 5)?;
        let (_, mask) = ops::dropout(&x, 0.3, &rng, true)?;
        let mv = mask.unwrap().to_vec()?;
        let fd = fd_grad(&xv, |x| dot(&r, &cpu::mul(x, &mv)));
        let mask = Tensor::from_slice(dev, &mv, &[n])?;
        check_fd("dropout", &ops::dropout_backward(&dy, &mask)?.to_vec()?, &fd)
    });
}

#[test]
fn dropout_mask_matches_reference_and_statistics() {
    on_each_backend(|dev| {
        for &n in &[1usize, 257, 100_003] {
            for p in [0.0f32, 0.1, 0.5, 0.9] {
                let rng = Generator::new(dev, 1234)?;
                ops::dropout(&Tensor::zeros(dev, &[3])?, 0.5, &rng, true)?; // a non-zero offset
                let (seed, offset) = rng.seed_and_offset()?;
                assert_eq!((seed, offset), (1234, 3));
                let x = random(dev, &[n], 77)?;
                let (y, mask) = ops::dropout(&x, p, &rng, true)?;
                let mask = mask.expect("training returns the mask").to_vec()?;
                // Both backends draw the same Philox numbers: the mask is exact everywhere.
                let want = cpu::dropout_mask(seed, offset, n, p);
                bitwise_eq(&format!("mask n={n} p={p}"), &mask, &want)?;
                bitwise_eq(&format!("y n={n} p={p}"), &y.to_vec()?, &cpu::mul(&x.to_vec()?, &want))?;
                assert_eq!(rng.seed_and_offset()?, (seed, offset + n as u64), "the offset advances by n");
                let scale = 1.0 / (1.0 - p);
                assert!(mask.iter().all(|m| *m == 0.0 || *m == scale));
                if n > 100_000 {
                    let dropped = mask.iter().filter(|m| **m == 0.0).count() as f64 / n as f64;
                    assert!((dropped - p as f64).abs() < 0.01, "dropped {dropped} for p = {p}");
                }
            }
        }
        Ok(())
    });
}

/// The vectorised kernels draw a Philox block (four counters) at a time: every offset modulo 4,
/// in f32 and in bf16 (16 bytes are 4 or 8 values), matches the reference's counter by counter.
#[test]
fn dropout_matches_the_reference_at_every_offset_alignment() {
    on_each_backend(|dev| {
        for dtype in [DType::F32, DType::BF16] {
            for pre in 0..6usize {
                let rng = Generator::new(dev, 4321)?;
                if pre > 0 {
                    ops::dropout(&Tensor::zeros(dev, &[pre])?, 0.5, &rng, true)?;
                }
                let (seed, offset) = rng.seed_and_offset()?;
                assert_eq!(offset, pre as u64);
                let x = random(dev, &[1003], 9)?.to_dtype(dtype)?;
                let (y, mask) = ops::dropout(&x, 0.3, &rng, true)?;
                let want: Vec<f32> =
                    cpu::dropout_mask(seed, offset, 1003, 0.3).iter().map(|m| dtype.round(*m)).collect();
                let what = format!("{dtype} offset {offset}");
                bitwise_eq(&format!("mask {what}"), &mask.expect("a mask").to_vec()?, &want)?;
                let (full, xv) = (cpu::dropout_mask(seed, offset, 1003, 0.3), x.to_vec()?);
                let y_want: Vec<f32> = cpu::mul(&xv, &full).iter().map(|v| dtype.round(*v)).collect();
                bitwise_eq(&format!("y {what}"), &y.to_vec()?, &y_want)?;
            }
        }
        Ok(())
    });
}

#[test]
fn dropout_restore_reproduces_mask_and_eval_is_identity() {
    on_each_backend(|dev| {
        let rng = Generator::new(dev, 99)?;
        let x = random(dev, &[513], 1)?;
        let saved = rng.save()?;
        let (y1, m1) = ops::dropout(&x, 0.4, &rng, true)?;
        let (y2, m2) = ops::dropout(&x, 0.4, &rng, true)?;
        assert_ne!(m1.as_ref().unwrap().to_vec()?, m2.unwrap().to_vec()?, "consecutive draws differ");
        rng.restore(&saved)?;
        let (y3, m3) = ops::dropout(&x, 0.4, &rng, true)?;
        bitwise_eq("restored mask", &m3.unwrap().to_vec()?, &m1.unwrap().to_vec()?)?;
        bitwise_eq("restored y", &y3.to_vec()?, &y1.to_vec()?)?;
        drop(y2);
        let before = rng.seed_and_offset()?;
        let (e, none) = ops::dropout(&x, 0.4, &rng, false)?;
        assert!(none.is_none());
        assert!(!e.same_buffer(&x), "eval dropout returns a copy");
        bitwise_eq("eval dropout", &e.to_vec()?, &x.to_vec()?)?;
        assert_eq!(rng.seed_and_offset()?, before, "eval draws nothing");
        Ok(())
    });
}

#[test]
fn dropout_in_a_graph_draws_fresh_masks_and_restores_inside() {
    on_each_backend(|dev| {
        let rng = Generator::new(dev, 3)?;
        let x = random(dev, &[1000], 2)?;
        // Fresh numbers on each replay.
        let mut g = Graph::new(dev);
        let (_, mask) = g.capture(CaptureMode::Global, || ops::dropout(&x, 0.5, &rng, true))?;
        let mask = mask.unwrap();
        let start = rng.seed_and_offset()?;
        g.replay()?;
        let a = mask.to_vec()?;
        g.replay()?;
        let b = mask.to_vec()?;
        assert_ne!(a, b, "each replay draws a fresh mask");
        assert_eq!(rng.seed_and_offset()?.1, start.1 + 2000);
        bitwise_eq("first replay's mask", &a, &cpu::dropout_mask(start.0, start.1, 1000, 0.5))?;
        // Save, draw, restore, redraw inside one graph: the two masks are equal (recomputation).
        let mut g2 = Graph::new(dev);
        let saved = rng.save()?;
        let (m1, m2) = g2.capture(CaptureMode::Global, || {
            rng.save_into(&saved)?;
            let (_, m1) = ops::dropout(&x, 0.5, &rng, true)?;
            rng.restore(&saved)?;
            let (_, m2) = ops::dropout(&x, 0.5, &rng, true)?;
            Ok((m1.unwrap(), m2.unwrap()))
        })?;
        for _ in 0..2 {
            g2.replay()?;
            bitwise_eq("recomputed mask", &m2.to_vec()?, &m1.to_vec()?)?;
        }
        Ok(())
    });
}

#[test]
fn activations_replay_bitwise_equal_to_eager() {
    on_each_backend(|dev| {
        let (x, dy) = (random(dev, &[33, 257], 1)?, random(dev, &[33, 257], 2)?);
        eager_vs_replay(dev, || {
            Ok(vec![
                ops::relu(&x)?,
                ops::relu_backward(&dy, &x)?,
                ops::gelu(&x, Gelu::Erf)?,
                ops::gelu(&x, Gelu::Tanh)?,
                ops::gelu_backward(&dy, &x, Gelu::Erf)?,
                ops::gelu_backward(&dy, &x, Gelu::Tanh)?,
            ])
        })?;
        // Dropout: restore the generator first in both runs, so both draw the same mask.
        let rng = Generator::new(dev, 11)?;
        let saved = rng.save()?;
        eager_vs_replay(dev, || {
            rng.restore(&saved)?;
            let (y, mask) = ops::dropout(&x, 0.2, &rng, true)?;
            let mask = mask.unwrap();
            let dx = ops::dropout_backward(&dy, &mask)?;
            Ok(vec![y, mask, dx])
        })
    });
}

#[test]
fn activations_reject_bad_input() {
    on_each_backend(|dev| {
        let (x, rng) = (random(dev, &[10], 1)?, Generator::new(dev, 0)?);
        let short = random(dev, &[9], 2)?;
        expect_err("relu_backward shapes", ops::relu_backward(&short, &x), is_shape)?;
        expect_err("gelu_backward shapes", ops::gelu_backward(&x, &short, Gelu::Tanh), is_shape)?;
        expect_err("dropout_backward shapes", ops::dropout_backward(&x, &short), is_shape)?;
        for p in [1.0f32, 1.5, -0.1, f32::NAN] {
            expect_err(&format!("dropout p = {p}"), ops::dropout(&x, p, &rng, true), |e| {
                matches!(e, Error::Op(OpError::DropoutP { .. }))
            })?;
        }
        assert_eq!(rng.seed_and_offset()?.1, 0, "a rejected dropout draws nothing");
        Ok(())
    });
}
