//! layer_norm and its backward: CPU reference, finite differences, graph replay, errors.

mod common;
mod ops_support;

use common::{on_each_backend, random, random_vec};
use graphed::ops::{self, cpu};
use graphed::{Error, OpError, Tensor};
use ops_support::*;

/// (rows, d), including widths that are not multiples of 32 or of the block size.
// On CUDA (sm_90) the f32 backward runs in one pass where rows are whole 16-byte words of at
// most 4096 values (ops/norm.rs, ln_ring_bwd_f32; a grid of at most 132 blocks): (300, 4096) and
// (1000, 64) take it over many rows a block, (130, 768) and (5, 1000) over one, (2, 4100) not.
const SHAPES: &[(usize, usize)] =
    &[(1, 1), (1, 2), (3, 5), (7, 33), (33, 257), (5, 1000), (130, 768), (2, 4099), (300, 4096), (1000, 64), (2, 4100)];
const EPS: f32 = 1e-5;

/// Inputs with a non-zero mean and a spread unlike 1, so the normalization does work.
fn inputs(n: usize, seed: u64) -> Vec<f32> {
    random_vec(n, seed).into_iter().map(|v| 3.0 * v + 0.7).collect()
}

#[test]
fn layer_norm_forward_matches_reference() {
    on_each_backend(|dev| {
        for (i, &(n, d)) in SHAPES.iter().enumerate() {
            let seed = 10 * i as u64;
            let xv = inputs(n * d, seed);
            let x = Tensor::from_slice(dev, &xv, &[n, d])?;
            let (g, b) = (random(dev, &[d], seed + 1)?, random(dev, &[d], seed + 2)?);
            let (y, mean, rstd) = ops::layer_norm(&x, &g, &b, EPS)?;
            assert_eq!((mean.dims(), rstd.dims()), (&[n][..], &[n][..]));
            let (ry, rm, rr) = cpu::layer_norm(&xv, &g.to_vec()?, &b.to_vec()?, d, EPS);
            let what = format!("layer_norm {n}x{d}");
            check_ref(dev, &what, &y.to_vec()?, &ry, TOL)?;
            check_ref(dev, &format!("{what} mean"), &mean.to_vec()?, &rm, TOL)?;
            check_ref(dev, &format!("{what} rstd"), &rstd.to_vec()?, &rr, TOL)?;
        }
        Ok(())
    });
}

#[test]
fn layer_norm_backward_matches_reference_and_accumulates() {
    on_each_backend(|dev| {
        for (i, &(n, d)) in SHAPES.iter().enumerate() {
            let seed = 100 + 10 * i as u64;
            let xv = inputs(n * d, seed);
            let x = Tensor::from_slice(dev, &xv, &[n, d])?;
            let (g, b, dy) =
                (random(dev, &[d], seed + 1)?, random(dev, &[d], seed + 2)?, random(dev, &[n, d], seed + 3)?);
            let (_, mean, rstd) = ops::layer_norm(&x, &g, &b, EPS)?;
            let (dg0, db0) = (random_vec(d, seed + 4), random_vec(d, seed + 5));
            let (dg, db) = (Tensor::from_slice(dev, &dg0, &[d])?, Tensor::from_slice(dev, &db0, &[d])?);
            let dx = ops::layer_norm_backward(&dy, &x, &g, &mean, &rstd, &dg, &db)?;
            let (mut rdg, mut rdb) = (dg0, db0);
            let rdx = cpu::layer_norm_backward(
                &dy.to_vec()?,
                &xv,
                &g.to_vec()?,
                &mean.to_vec()?,
                &rstd.to_vec()?,
                d,
                &mut rdg,
                &mut rdb,
            );
            let what = format!("layer_norm_backward {n}x{d}");
            // For d <= 2 the normalized row is (up to eps) the constant ±1, so dx is pure
            // cancellation, near zero: compare absolutely, on the scale rstd·|dy·gamma| of the
            // terms that cancel.
            if d <= 2 {
                let gmax = dy.to_vec()?.iter().map(|v| v.abs()).fold(0.0f32, f32::max)
                    * g.to_vec()?.iter().map(|v| v.abs()).fold(0.0f32, f32::max);
                let rmax = rstd.to_vec()?.iter().fold(0.0f32, |m, v| m.max(*v));
                let bound = 1e-5 * (rmax * gmax).max(1.0);
                let worst = dx.to_vec()?.iter().zip(&rdx).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
                assert!(
                    if dev.is_host() { worst == 0.0 } else { worst <= bound },
                    "{what}: dx off by {worst} (bound {bound})"
                );
            } else {
                check_ref(dev, &format!("{what} dx"), &dx.to_vec()?, &rdx, TOL)?;
            }
            check_ref(dev, &format!("{what} dgamma"), &dg.to_vec()?, &rdg, TOL)?;
            check_ref(dev, &format!("{what} dbeta"), &db.to_vec()?, &rdb, TOL)?;
        }
        Ok(())
    });
}

#[test]
fn layer_norm_backward_matches_finite_differences() {
    on_each_backend(|dev| {
        let (n, d) = (3, 37);
        let (xv, gv, bv, r) = (inputs(n * d, 1), random_vec(d, 2), random_vec(d, 3), random_vec(n * d, 4));
        let x = Tensor::from_slice(dev, &xv, &[n, d])?;
        let (g, b, dy) = (
            Tensor::from_slice(dev, &gv, &[d])?,
            Tensor::from_slice(dev, &bv, &[d])?,
            Tensor::from_slice(dev, &r, &[n, d])?,
        );
        let (_, mean, rstd) = ops::layer_norm(&x, &g, &b, EPS)?;
        let (dg, db) = (Tensor::zeros(dev, &[d])?, Tensor::zeros(dev, &[d])?);
        let dx = ops::layer_norm_backward(&dy, &x, &g, &mean, &rstd, &dg, &db)?;
        let loss = |x: &[f32], g: &[f32], b: &[f32]| dot(&r, &cpu::layer_norm(x, g, b, d, EPS).0);
        check_fd("dx", &dx.to_vec()?, &fd_grad(&xv, |x| loss(x, &gv, &bv)))?;
        check_fd("dgamma", &dg.to_vec()?, &fd_grad(&gv, |g| loss(&xv, g, &bv)))?;
        check_fd("dbeta", &db.to_vec()?, &fd_grad(&bv, |b| loss(&xv, &gv, b)))
    });
}

#[test]
fn layer_norm_handles_leading_dimensions() {
    on_each_backend(|dev| {
        let xv = inputs(2 * 3 * 10, 5);
        let x = Tensor::from_slice(dev, &xv, &[2, 3, 10])?;
        let (g, b) = (random(dev, &[10], 6)?, random(dev, &[10], 7)?);
        let (y, mean, _) = ops::layer_norm(&x, &g, &b, EPS)?;
        assert_eq!((y.dims(), mean.dims()), (&[2, 3, 10][..], &[6][..]));
        check_ref(
            dev,
            "layer_norm [2,3,10]",
            &y.to_vec()?,
            &cpu::layer_norm(&xv, &g.to_vec()?, &b.to_vec()?, 10, EPS).0,
            TOL,
        )
    });
}

#[test]
fn layer_norm_replays_bitwise_equal_to_eager() {
    on_each_backend(|dev| {
        // The two-kernel backward (rows of 1025 values), then the one-pass one (1024).
        for (n, d) in [(67, 1025), (400, 1024)] {
            let x = Tensor::from_slice(dev, &inputs(n * d, 1), &[n, d])?;
            let (g, b, dy) = (random(dev, &[d], 2)?, random(dev, &[d], 3)?, random(dev, &[n, d], 4)?);
            eager_vs_replay(dev, || {
                let (y, mean, rstd) = ops::layer_norm(&x, &g, &b, EPS)?;
                let (dg, db) = (Tensor::zeros(dev, &[d])?, Tensor::zeros(dev, &[d])?);
                let dx = ops::layer_norm_backward(&dy, &x, &g, &mean, &rstd, &dg, &db)?;
                Ok(vec![y, mean, rstd, dx, dg, db])
            })?;
        }
        Ok(())
    });
}

#[test]
fn layer_norm_rejects_bad_input() {
    on_each_backend(|dev| {
        let (x, g, b) = (random(dev, &[4, 6], 1)?, random(dev, &[6], 2)?, random(dev, &[6], 3)?);
        let short = random(dev, &[5], 4)?;
        expect_err("gamma length", ops::layer_norm(&x, &short, &b, EPS), is_shape)?;
        expect_err("beta length", ops::layer_norm(&x, &g, &short, EPS), is_shape)?;
        expect_err("scalar x", ops::layer_norm(&Tensor::zeros(dev, &[])?, &g, &b, EPS), is_shape)?;
        expect_err("eps", ops::layer_norm(&x, &g, &b, -1.0), |e| {
            matches!(e, Error::Op(OpError::Eps { op: "layer_norm", .. }))
        })?;
        let (_, mean, rstd) = ops::layer_norm(&x, &g, &b, EPS)?;
        let (dg, db) = (Tensor::zeros(dev, &[6])?, Tensor::zeros(dev, &[6])?);
        expect_err(
            "dy shape",
            ops::layer_norm_backward(&random(dev, &[4, 5], 5)?, &x, &g, &mean, &rstd, &dg, &db),
            is_shape,
        )?;
        expect_err("mean length", ops::layer_norm_backward(&x, &x, &g, &short, &rstd, &dg, &db), is_shape)?;
        expect_err("dgamma length", ops::layer_norm_backward(&x, &x, &g, &mean, &rstd, &short, &db), is_shape)?;
        Ok(())
    });
}
