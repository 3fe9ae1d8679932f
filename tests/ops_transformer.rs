//! embedding, rms_norm and swiglu with their backwards (#13): CPU reference, finite
//! differences, graph replay, errors.

mod common;
mod ops_support;

use common::{on_each_backend, random, random_vec};
use graphed::ops::{self, cpu};
use graphed::{Error, Tensor};
use ops_support::*;

const EPS: f32 = 1e-5;

/// Token ids in `0..vocab` from a fixed pseudo-random sequence (repeats included).
fn ids(n: usize, vocab: usize, seed: u64) -> Vec<f32> {
    random_vec(n, seed).into_iter().map(|v| ((v.abs() * 7919.0) as usize % vocab) as f32).collect()
}

#[test]
fn embedding_forward_and_backward_match_reference() {
    on_each_backend(|dev| {
        for (i, &(b, t, vocab, d)) in
            [(1, 1, 1, 1), (2, 5, 7, 33), (4, 64, 256, 96), (3, 17, 50, 1030)].iter().enumerate()
        {
            let seed = 10 * i as u64;
            let idv = ids(b * t, vocab, seed);
            let id = Tensor::from_slice(dev, &idv, &[b, t])?;
            let table = random(dev, &[vocab, d], seed + 1)?;
            let y = ops::embedding(&id, &table)?;
            assert_eq!(y.dims(), &[b, t, d]);
            let what = format!("embedding {b}x{t} vocab {vocab} d {d}");
            check_ref(dev, &what, &y.to_vec()?, &cpu::embedding(&idv, &table.to_vec()?, vocab, d)?, TOL)?;
            let dy = random(dev, &[b, t, d], seed + 2)?;
            let g0 = random_vec(vocab * d, seed + 3);
            let dtable = Tensor::from_slice(dev, &g0, &[vocab, d])?;
            ops::embedding_backward(&dy, &id, &dtable)?;
            let mut want = g0;
            cpu::embedding_backward(&dy.to_vec()?, &idv, vocab, d, &mut want)?;
            check_ref(dev, &format!("{what} backward"), &dtable.to_vec()?, &want, TOL)?;
        }
        Ok(())
    });
}

#[test]
fn embedding_rejects_bad_ids_and_shapes() {
    on_each_backend(|dev| {
        let table = random(dev, &[4, 3], 1)?;
        if dev.is_host() {
            for bad in [4.0, -1.0, 1.5, f32::NAN] {
                let id = Tensor::from_slice(dev, &[0.0, bad], &[2])?;
                let r = ops::embedding(&id, &table);
                expect_err("bad id", r, |e| matches!(e, Error::TokenOutOfRange { pos: 1, vocab: 4, .. }))?;
                let (dy, dt) = (Tensor::zeros(dev, &[2, 3])?, Tensor::zeros(dev, &[4, 3])?);
                let r = ops::embedding_backward(&dy, &id, &dt);
                expect_err("bad id backward", r, |e| matches!(e, Error::TokenOutOfRange { .. }))?;
            }
        }
        let id = Tensor::from_slice(dev, &[0.0, 1.0], &[2])?;
        expect_err("1-d table", ops::embedding(&id, &Tensor::zeros(dev, &[4])?), is_shape)?;
        let (dy, dt) = (Tensor::zeros(dev, &[2, 2])?, Tensor::zeros(dev, &[4, 3])?);
        expect_err("dy shape", ops::embedding_backward(&dy, &id, &dt), is_shape)
    });
}

#[test]
fn rms_norm_matches_reference_and_finite_differences() {
    on_each_backend(|dev| {
        for (i, &(n, d)) in [(1, 1), (3, 5), (7, 33), (33, 257), (130, 768), (2, 4099)].iter().enumerate() {
            let seed = 100 + 10 * i as u64;
            let xv: Vec<f32> = random_vec(n * d, seed).into_iter().map(|v| 3.0 * v + 0.7).collect();
            let x = Tensor::from_slice(dev, &xv, &[n, d])?;
            let (g, dy) = (random(dev, &[d], seed + 1)?, random(dev, &[n, d], seed + 2)?);
            let (y, rstd) = ops::rms_norm(&x, &g, EPS)?;
            let (ry, rr) = cpu::rms_norm(&xv, &g.to_vec()?, d, EPS);
            let what = format!("rms_norm {n}x{d}");
            check_ref(dev, &what, &y.to_vec()?, &ry, TOL)?;
            check_ref(dev, &format!("{what} rstd"), &rstd.to_vec()?, &rr, TOL)?;
            let g0 = random_vec(d, seed + 3);
            let dg = Tensor::from_slice(dev, &g0, &[d])?;
            let dx = ops::rms_norm_backward(&dy, &x, &g, &rstd, &dg)?;
            let mut rdg = g0;
            let rdx = cpu::rms_norm_backward(&dy.to_vec()?, &xv, &g.to_vec()?, &rstd.to_vec()?, d, &mut rdg);
            if d > 1 {
                check_ref(dev, &format!("{what} dx"), &dx.to_vec()?, &rdx, TOL)?;
            }
            check_ref(dev, &format!("{what} dgamma"), &dg.to_vec()?, &rdg, TOL)?;
        }
        let (n, d) = (3, 37);
        let (xv, gv, r) = (random_vec(n * d, 1), random_vec(d, 2), random_vec(n * d, 3));
        let (x, g) = (Tensor::from_slice(dev, &xv, &[n, d])?, Tensor::from_slice(dev, &gv, &[d])?);
        let (_, rstd) = ops::rms_norm(&x, &g, EPS)?;
        let dg = Tensor::zeros(dev, &[d])?;
        let dx = ops::rms_norm_backward(&Tensor::from_slice(dev, &r, &[n, d])?, &x, &g, &rstd, &dg)?;
        let loss = |x: &[f32], g: &[f32]| dot(&r, &cpu::rms_norm(x, g, d, EPS).0);
        check_fd("rms_norm dx", &dx.to_vec()?, &fd_grad(&xv, |x| loss(x, &gv)))?;
        check_fd("rms_norm dgamma", &dg.to_vec()?, &fd_grad(&gv, |g| loss(&xv, g)))?;
        expect_err("gamma shape", ops::rms_norm(&x, &Tensor::zeros(dev, &[d + 1])?, EPS), is_shape)?;
        expect_err("bad eps", ops::rms_norm(&x, &g, -1.0), |e| matches!(e, Error::InvalidArgument { .. }))
    });
}

#[test]
fn swiglu_matches_reference_and_finite_differences() {
    on_each_backend(|dev| {
        for (i, &n) in [1usize, 7, 1000, 65537].iter().enumerate() {
            let seed = 200 + 10 * i as u64;
            let (gv, uv) = (random_vec(n, seed).iter().map(|v| 4.0 * v).collect::<Vec<_>>(), random_vec(n, seed + 1));
            let (g, u) = (Tensor::from_slice(dev, &gv, &[n])?, Tensor::from_slice(dev, &uv, &[n])?);
            let y = ops::swiglu(&g, &u)?;
            check_ref(dev, &format!("swiglu {n}"), &y.to_vec()?, &cpu::swiglu(&gv, &uv), TOL)?;
            let dy = random(dev, &[n], seed + 2)?;
            let (dg, du) = ops::swiglu_backward(&dy, &g, &u)?;
            let (rdg, rdu) = cpu::swiglu_backward(&dy.to_vec()?, &gv, &uv);
            check_ref(dev, &format!("swiglu_backward {n} dgate"), &dg.to_vec()?, &rdg, TOL)?;
            check_ref(dev, &format!("swiglu_backward {n} dup"), &du.to_vec()?, &rdu, TOL)?;
        }
        let n = 50;
        let (gv, uv, r) = (random_vec(n, 1), random_vec(n, 2), random_vec(n, 3));
        let (g, u) = (Tensor::from_slice(dev, &gv, &[n])?, Tensor::from_slice(dev, &uv, &[n])?);
        let (dg, du) = ops::swiglu_backward(&Tensor::from_slice(dev, &r, &[n])?, &g, &u)?;
        check_fd("swiglu dgate", &dg.to_vec()?, &fd_grad(&gv, |g| dot(&r, &cpu::swiglu(g, &uv))))?;
        check_fd("swiglu dup", &du.to_vec()?, &fd_grad(&uv, |u| dot(&r, &cpu::swiglu(&gv, u))))?;
        expect_err("shapes", ops::swiglu(&g, &Tensor::zeros(dev, &[n + 1])?), is_shape)
    });
}

#[test]
fn transformer_ops_replay_bitwise_equal_to_eager() {
    on_each_backend(|dev| {
        let (t, vocab, d) = (300, 256, 130);
        let id = Tensor::from_slice(dev, &ids(t, vocab, 1), &[t])?;
        let (table, gamma, dy) = (random(dev, &[vocab, d], 2)?, random(dev, &[d], 3)?, random(dev, &[t, d], 4)?);
        eager_vs_replay(dev, || {
            let x = ops::embedding(&id, &table)?;
            let (h, rstd) = ops::rms_norm(&x, &gamma, EPS)?;
            let y = ops::swiglu(&h, &x)?;
            let (dh, dx1) = ops::swiglu_backward(&dy, &h, &x)?;
            let dg = Tensor::zeros(dev, &[d])?;
            let dx2 = ops::rms_norm_backward(&dh, &x, &gamma, &rstd, &dg)?;
            let dx = ops::add(&dx1, &dx2)?;
            let dtable = Tensor::zeros(dev, &[vocab, d])?;
            ops::embedding_backward(&dx, &id, &dtable)?;
            Ok(vec![x, h, rstd, y, dg, dx, dtable])
        })
    });
}
