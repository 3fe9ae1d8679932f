//! linear, linear_backward and bias_add: CPU reference, finite differences, graph replay, errors.

mod common;
mod ops_support;

use common::{on_each_backend, random, random_vec};
use graphed::ops::{self, cpu};
use graphed::{Device, Error, Tensor};
use ops_support::*;

/// (rows, in, out), including sizes that are not multiples of 32 or 256.
const SHAPES: &[(usize, usize, usize)] = &[(1, 1, 1), (3, 5, 7), (17, 300, 129), (64, 257, 513), (300, 64, 33)];

#[test]
fn linear_forward_matches_reference() {
    on_each_backend(|dev| {
        for (i, &(n, k, m)) in SHAPES.iter().enumerate() {
            let seed = 10 * i as u64;
            let (x, w, b) =
                (random(dev, &[n, k], seed)?, random(dev, &[m, k], seed + 1)?, random(dev, &[m], seed + 2)?);
            let (xv, wv, bv) = (x.to_vec()?, w.to_vec()?, b.to_vec()?);
            let y = ops::linear(&x, &w, Some(&b))?;
            assert_eq!(y.dims(), &[n, m]);
            check_ref(
                dev,
                &format!("linear {n}x{k}x{m}"),
                &y.to_vec()?,
                &cpu::linear(&xv, &wv, Some(&bv), n, k, m),
                TOL_GEMM,
            )?;
            let y = ops::linear(&x, &w, None)?;
            check_ref(
                dev,
                &format!("linear {n}x{k}x{m} no bias"),
                &y.to_vec()?,
                &cpu::linear(&xv, &wv, None, n, k, m),
                TOL_GEMM,
            )?;
        }
        Ok(())
    });
}

#[test]
fn linear_flattens_leading_dimensions() {
    on_each_backend(|dev| {
        let (x, w) = (random(dev, &[2, 3, 5], 1)?, random(dev, &[4, 5], 2)?);
        let y = ops::linear(&x, &w, None)?;
        assert_eq!(y.dims(), &[2, 3, 4]);
        check_ref(
            dev,
            "linear [2,3,5]",
            &y.to_vec()?,
            &cpu::linear(&x.to_vec()?, &w.to_vec()?, None, 6, 5, 4),
            TOL_GEMM,
        )
    });
}

#[test]
fn linear_backward_matches_reference_and_accumulates() {
    on_each_backend(|dev| {
        for (i, &(n, k, m)) in SHAPES.iter().enumerate() {
            let seed = 100 + 10 * i as u64;
            let (x, w, dy) =
                (random(dev, &[n, k], seed)?, random(dev, &[m, k], seed + 1)?, random(dev, &[n, m], seed + 2)?);
            // Non-zero starting grads: the op must add to them (beta = 1).
            let (dw0, db0) = (random_vec(m * k, seed + 3), random_vec(m, seed + 4));
            let (dw, db) = (Tensor::from_slice(dev, &dw0, &[m, k])?, Tensor::from_slice(dev, &db0, &[m])?);
            let dx = ops::linear_backward(&dy, &x, &w, &dw, Some(&db), true)?.expect("dx was asked for");
            let (mut rdw, mut rdb) = (dw0.clone(), db0.clone());
            let rdx = cpu::linear_backward(
                &dy.to_vec()?,
                &x.to_vec()?,
                &w.to_vec()?,
                n,
                k,
                m,
                &mut rdw,
                Some(&mut rdb),
                true,
            )
            .unwrap();
            let what = format!("{n}x{k}x{m}");
            check_ref(dev, &format!("dx {what}"), &dx.to_vec()?, &rdx, TOL_GEMM)?;
            check_ref(dev, &format!("dw {what}"), &dw.to_vec()?, &rdw, TOL_GEMM)?;
            check_ref(dev, &format!("db {what}"), &db.to_vec()?, &rdb, TOL)?;
            // Without dx and without db: only dw moves.
            let before = db.to_vec()?;
            assert!(ops::linear_backward(&dy, &x, &w, &dw, None, false)?.is_none());
            assert_eq!(db.to_vec()?, before);
        }
        Ok(())
    });
}

#[test]
fn linear_backward_matches_finite_differences() {
    on_each_backend(|dev| {
        let (n, k, m) = (4, 6, 5);
        let (xv, wv, bv, r) = (random_vec(n * k, 1), random_vec(m * k, 2), random_vec(m, 3), random_vec(n * m, 4));
        let (x, w) = (Tensor::from_slice(dev, &xv, &[n, k])?, Tensor::from_slice(dev, &wv, &[m, k])?);
        let dy = Tensor::from_slice(dev, &r, &[n, m])?;
        let (dw, db) = (Tensor::zeros(dev, &[m, k])?, Tensor::zeros(dev, &[m])?);
        let dx = ops::linear_backward(&dy, &x, &w, &dw, Some(&db), true)?.unwrap();
        let loss = |x: &[f32], w: &[f32], b: &[f32]| dot(&r, &cpu::linear(x, w, Some(b), n, k, m));
        check_fd("dx", &dx.to_vec()?, &fd_grad(&xv, |x| loss(x, &wv, &bv)))?;
        check_fd("dw", &dw.to_vec()?, &fd_grad(&wv, |w| loss(&xv, w, &bv)))?;
        check_fd("db", &db.to_vec()?, &fd_grad(&bv, |b| loss(&xv, &wv, b)))
    });
}

#[test]
fn bias_add_matches_reference() {
    on_each_backend(|dev| {
        for &(n, d) in &[(1, 1), (3, 7), (33, 257), (5, 1000)] {
            let (x, b) = (random(dev, &[n, d], 5)?, random(dev, &[d], 6)?);
            let y = ops::bias_add(&x, &b)?;
            check_ref(
                dev,
                &format!("bias_add {n}x{d}"),
                &y.to_vec()?,
                &cpu::bias_add(&x.to_vec()?, &b.to_vec()?, d),
                TOL,
            )?;
        }
        Ok(())
    });
}

#[test]
fn linear_ops_replay_bitwise_equal_to_eager() {
    on_each_backend(|dev| {
        let (n, k, m) = (37, 129, 65);
        let (x, w, b, dy) =
            (random(dev, &[n, k], 1)?, random(dev, &[m, k], 2)?, random(dev, &[m], 3)?, random(dev, &[n, m], 4)?);
        eager_vs_replay(dev, || {
            Ok(vec![ops::linear(&x, &w, Some(&b))?, ops::linear(&x, &w, None)?, ops::bias_add(&dy, &b)?])
        })?;
        eager_vs_replay(dev, || {
            let (dw, db) = (Tensor::zeros(dev, &[m, k])?, Tensor::zeros(dev, &[m])?);
            let dx = ops::linear_backward(&dy, &x, &w, &dw, Some(&db), true)?.unwrap();
            Ok(vec![dx, dw, db])
        })
    });
}

#[test]
fn linear_rejects_bad_shapes() {
    on_each_backend(|dev| {
        let (x, w, b) = (random(dev, &[4, 3], 1)?, random(dev, &[5, 3], 2)?, random(dev, &[5], 3)?);
        let dy = random(dev, &[4, 5], 4)?;
        let (dw, db) = (Tensor::zeros(dev, &[5, 3])?, Tensor::zeros(dev, &[5])?);
        expect_err("w in != x in", ops::linear(&x, &random(dev, &[5, 4], 5)?, None), is_shape)?;
        expect_err("w rank 1", ops::linear(&x, &random(dev, &[3], 5)?, None), is_shape)?;
        expect_err("b wrong length", ops::linear(&x, &w, Some(&random(dev, &[4], 5)?)), is_shape)?;
        expect_err("scalar x", ops::linear(&Tensor::zeros(dev, &[])?, &w, None), is_shape)?;
        expect_err(
            "dy wrong",
            ops::linear_backward(&random(dev, &[4, 4], 6)?, &x, &w, &dw, Some(&db), true),
            is_shape,
        )?;
        expect_err("dw wrong", ops::linear_backward(&dy, &x, &w, &Tensor::zeros(dev, &[3, 5])?, None, true), is_shape)?;
        expect_err(
            "db wrong",
            ops::linear_backward(&dy, &x, &w, &dw, Some(&Tensor::zeros(dev, &[3])?), true),
            is_shape,
        )?;
        expect_err("bias_add b wrong", ops::bias_add(&x, &b), is_shape)?;
        // Another device's tensor.
        let other = Device::host();
        let w2 = random(&other, &[5, 3], 2)?;
        expect_err("device mismatch", ops::linear(&x, &w2, None), |e| matches!(e, Error::DeviceMismatch { .. }))?;
        Ok(())
    });
}

/// linear_backward_acc adds the input grad into a given tensor: in f32 exactly what
/// linear_backward + add gives on the host (within f32 GEMM rounding on CUDA), in bf16 within one
/// rounding (the sum is rounded once, not twice); dw and db accumulate as linear_backward's do;
/// captured, it replays bitwise; bad input is refused before anything runs.
#[test]
fn linear_backward_acc_adds_into_dx() {
    on_each_backend(|dev| {
        for dtype in [graphed::DType::F32, graphed::DType::BF16] {
            let (n, k, m) = (64, 257, 129);
            let t = |dims: &[usize], seed: u64| {
                Tensor::from_slice_as(dev, &random_vec(dims.iter().product(), seed), dims, dtype)
            };
            let (x, w, dy, other) = (t(&[n, k], 1)?, t(&[m, k], 2)?, t(&[n, m], 3)?, t(&[n, k], 4)?);
            let grads = || -> graphed::Result<(Tensor, Tensor)> {
                Ok((Tensor::zeros(dev, &[m, k])?, Tensor::zeros(dev, &[m])?))
            };
            let (dw1, db1) = grads()?;
            let dx = ops::linear_backward(&dy, &x, &w, &dw1, Some(&db1), true)?.expect("asked for dx");
            let want = ops::add(&other, &dx)?.to_vec()?;
            let (dw2, db2) = grads()?;
            let acc = other.deep_clone()?;
            ops::linear_backward_acc(&dy, &x, &w, &dw2, Some(&db2), &acc)?;
            let what = format!("{dtype} dx");
            if dtype == graphed::DType::F32 {
                check_ref(dev, &what, &acc.to_vec()?, &want, 1e-5)?;
            } else {
                // One rounding of the sum against two: within a bf16 ulp, on either backend.
                let e = common::rel_err(&acc.to_vec()?, &want);
                assert!(e < 1e-2, "{what}: relative error {e:e}");
            }
            bitwise_eq("dw", &dw2.to_vec()?, &dw1.to_vec()?)?;
            bitwise_eq("db", &db2.to_vec()?, &db1.to_vec()?)?;
            // Refusals change nothing.
            let before = acc.to_vec()?;
            let (dw3, _) = grads()?;
            let overlap = |e: &Error| matches!(e, Error::Overlap { input: "dy", .. });
            expect_err("dx is dy", ops::linear_backward_acc(&dy, &dy, &w, &dw3, None, &dy), |e| {
                matches!(e, Error::Shape { .. }) || overlap(e)
            })?;
            let x_again = x.deep_clone()?;
            expect_err("dx is x", ops::linear_backward_acc(&dy, &x_again, &w, &dw3, None, &x_again), |e| {
                matches!(e, Error::Overlap { input: "x", .. })
            })?;
            expect_err("dx shape", ops::linear_backward_acc(&dy, &x, &w, &dw3, None, &t(&[n, k + 1], 5)?), is_shape)?;
            assert_eq!(acc.to_vec()?, before, "{dtype}: a refused call changed dx");
            bitwise_eq("dw after refusals", &dw3.to_vec()?, &vec![0.0; m * k])?;
            eager_vs_replay(dev, || {
                let (dw, db) = grads()?;
                let acc = other.deep_clone()?;
                ops::linear_backward_acc(&dy, &x, &w, &dw, Some(&db), &acc)?;
                Ok(vec![acc, dw, db])
            })?;
        }
        Ok(())
    });
}

/// `linear_input_grad` is the `dx` of `linear_backward`, bit for bit, in every dtype and for
/// leading dimensions that flatten into rows; it touches no weight grad, replays as it runs, and
/// refuses a `dy` or `w` that do not fit.
#[test]
fn linear_input_grad_is_the_backward_dx() {
    on_each_backend(|dev| {
        for dtype in [graphed::DType::F32, graphed::DType::BF16, graphed::DType::F16] {
            for &(lead, k, m) in &[(&[64usize][..], 257usize, 129usize), (&[2, 3][..], 8, 5), (&[1][..], 1, 1)] {
                let n: usize = lead.iter().product();
                let t = |dims: &[usize], seed: u64| {
                    Tensor::from_slice_as(dev, &random_vec(dims.iter().product(), seed), dims, dtype)
                };
                let dims = |last: usize| lead.iter().copied().chain([last]).collect::<Vec<_>>();
                let (x, w, dy) = (t(&dims(k), 1)?, t(&[m, k], 2)?, t(&dims(m), 3)?);
                let dw = Tensor::zeros(dev, &[m, k])?;
                let full = ops::linear_backward(&dy, &x, &w, &dw, None, true)?.expect("asked for dx");
                let dx = ops::linear_input_grad(&dy, &w)?;
                assert_eq!((dx.dtype(), dx.dims()), (dtype, full.dims()), "{dtype} {n}x{k}x{m}");
                bitwise_eq(&format!("{dtype} {n}x{k}x{m} dx"), &dx.to_vec()?, &full.to_vec()?)?;
                eager_vs_replay(dev, || Ok(vec![ops::linear_input_grad(&dy, &w)?]))?;
            }
        }
        let (w, dy) = (random(dev, &[5, 8], 1)?, random(dev, &[3, 5], 2)?);
        expect_err("dy width", ops::linear_input_grad(&random(dev, &[3, 6], 3)?, &w), is_shape)?;
        expect_err("w rank", ops::linear_input_grad(&dy, &random(dev, &[40], 4)?), is_shape)?;
        expect_err("dy rank", ops::linear_input_grad(&Tensor::from_slice(dev, &[1.0], &[])?, &w), is_shape)?;
        expect_err(
            "empty w",
            ops::linear_input_grad(&Tensor::zeros(dev, &[3, 0])?, &Tensor::zeros(dev, &[0, 4])?),
            is_shape,
        )?;
        let half = Tensor::zeros_as(dev, &[3, 5], graphed::DType::BF16)?;
        expect_err("dtypes", ops::linear_input_grad(&half, &w), |e| matches!(e, Error::DTypeMismatch { .. }))
    });
}
