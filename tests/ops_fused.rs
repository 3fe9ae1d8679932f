//! linear_fused (cublasLt epilogues: bias, GELU, bias + GELU) and its backward, in f32, bf16
//! and f16: against the CPU reference (the epilogue works on the f32 accumulator and rounds
//! once), replay == eager bitwise, argument errors. Host always; CUDA when a GPU is usable.

mod common;
mod ops_support;

use common::{on_each_backend, random_vec};
use graphed::ops::{self, cpu, Epilogue, Gelu};
use graphed::{DType, Error, OpError, Tensor};
use ops_support::*;

/// Tolerance on CUDA: cublasLt's GELU and summation order differ from the reference in the
/// last bits of f32, which in bf16 can move one rounding step.
fn tol(dtype: DType) -> f64 {
    if dtype == DType::BF16 {
        1e-2
    } else {
        2e-3
    }
}

fn rounded(dtype: DType, v: &[f32]) -> Vec<f32> {
    v.iter().map(|x| dtype.round(*x)).collect()
}

#[test]
fn fused_epilogues_match_the_reference() {
    on_each_backend(|dev| {
        for dtype in [DType::F32, DType::BF16, DType::F16] {
            for &(n, k, m) in &[(8usize, 64usize, 32usize), (64, 256, 128), (5, 24, 40)] {
                let t = |dims: &[usize], seed| {
                    Tensor::from_slice_as(dev, &random_vec(dims.iter().product(), seed), dims, dtype)
                };
                let (x, w, b) = (t(&[n, k], 1)?, t(&[m, k], 2)?, t(&[m], 3)?);
                let (xv, wv, bv) = (x.to_vec()?, w.to_vec()?, b.to_vec()?);
                for (epi, bias) in [(Epilogue::Bias, true), (Epilogue::Gelu, false), (Epilogue::BiasGelu, true)] {
                    let what = format!("{epi:?} {dtype} {n}x{k}x{m}");
                    let (y, pre) = ops::linear_fused(&x, &w, bias.then_some(&b), epi)?;
                    let z = cpu::linear(&xv, &wv, bias.then_some(bv.as_slice()), n, k, m);
                    match pre {
                        None => check_ref(dev, &what, &y.to_vec()?, &rounded(dtype, &z), tol(dtype))?,
                        Some(pre) => {
                            check_ref(dev, &format!("{what} pre"), &pre.to_vec()?, &rounded(dtype, &z), tol(dtype))?;
                            let want = rounded(dtype, &cpu::gelu(&z, Gelu::Tanh));
                            check_ref(dev, &format!("{what} y"), &y.to_vec()?, &want, tol(dtype))?;
                        }
                    }
                }
            }
        }
        Ok(())
    });
}

#[test]
fn fused_backward_and_replay() {
    on_each_backend(|dev| {
        for dtype in [DType::F32, DType::BF16] {
            let t = |dims: &[usize], seed| {
                Tensor::from_slice_as(dev, &random_vec(dims.iter().product(), seed), dims, dtype)
            };
            let (x, w, b, dy) = (t(&[64, 96], 1)?, t(&[80, 96], 2)?, t(&[80], 3)?, t(&[64, 80], 4)?);
            let (_, pre) = ops::linear_fused(&x, &w, Some(&b), Epilogue::BiasGelu)?;
            let pre = pre.expect("pre-activation");
            let (dw, db) = (Tensor::zeros(dev, &[80, 96])?, Tensor::zeros(dev, &[80])?);
            let dx = ops::linear_fused_backward(&dy, &x, &w, Some(&pre), &dw, Some(&db), true)?.expect("dx");
            // The reference: the same composition on the host values.
            let dh = rounded(dtype, &cpu::gelu_backward(&dy.to_vec()?, &pre.to_vec()?, Gelu::Tanh));
            let (mut dwr, mut dbr) = (vec![0.0; 80 * 96], vec![0.0; 80]);
            let dxr = cpu::linear_backward(&dh, &x.to_vec()?, &w.to_vec()?, 64, 96, 80, &mut dwr, Some(&mut dbr), true)
                .expect("dx");
            check_ref(dev, "fused dx", &dx.to_vec()?, &rounded(dtype, &dxr), tol(dtype))?;
            check_ref(dev, "fused dw", &dw.to_vec()?, &dwr, tol(dtype))?;
            check_ref(dev, "fused db", &db.to_vec()?, &dbr, tol(dtype))?;
            eager_vs_replay(dev, || {
                let (y, pre) = ops::linear_fused(&x, &w, Some(&b), Epilogue::BiasGelu)?;
                let pre = pre.expect("pre");
                let (dw, db) = (Tensor::zeros(dev, &[80, 96])?, Tensor::zeros(dev, &[80])?);
                let dx = ops::linear_fused_backward(&dy, &x, &w, Some(&pre), &dw, Some(&db), true)?.expect("dx");
                Ok(vec![y, pre, dx, dw, db])
            })?;
        }
        Ok(())
    });
}

#[test]
fn fused_argument_errors() {
    on_each_backend(|dev| {
        let x = Tensor::from_slice(dev, &random_vec(32, 1), &[4, 8])?;
        let w = Tensor::from_slice(dev, &random_vec(24, 2), &[3, 8])?;
        let b = Tensor::from_slice(dev, &random_vec(3, 3), &[3])?;
        let bias = |needs_bias| move |e: &Error| matches!(e, Error::Op(OpError::EpilogueBias { needs_bias: n, .. }) if *n == needs_bias);
        expect_err("bias epilogue without a bias", ops::linear_fused(&x, &w, None, Epilogue::Bias), bias(true))?;
        expect_err("gelu epilogue with a bias", ops::linear_fused(&x, &w, Some(&b), Epilogue::Gelu), bias(false))?;
        let b16 = b.to_dtype(DType::BF16)?;
        let r = ops::linear_fused(&x, &w, Some(&b16), Epilogue::BiasGelu);
        expect_err("bf16 bias on f32", r, |e| matches!(e, Error::DTypeMismatch { .. }))?;
        let w4 = Tensor::from_slice(dev, &random_vec(28, 4), &[4, 7])?;
        expect_err("shapes", ops::linear_fused(&x, &w4, None, Epilogue::Gelu), is_shape)?;
        Ok(())
    });
}
