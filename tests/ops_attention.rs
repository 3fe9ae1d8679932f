//! causal_attention and its backward (#13): a naive reference, the CPU reference, finite
//! differences, graph replay, errors.

mod common;
mod ops_support;

use common::{on_each_backend, random, random_vec};
use graphed::ops::{self, cpu, cpu::AttnDims, cpu::AttnSaved};
use graphed::{DType, Tensor};
use ops_support::*;

/// Attention written out with plain loops, in f64: an independent check of `cpu::causal_attention`.
fn naive(q: &[f32], k: &[f32], v: &[f32], a: AttnDims) -> Vec<f64> {
    let (t, dh, w) = (a.seq, a.head_dim, a.heads * a.head_dim);
    let scale = 1.0 / (dh as f64).sqrt();
    let mut out = vec![0.0f64; q.len()];
    let at = |x: &[f32], b: usize, i: usize, h: usize, e: usize| x[(b * t + i) * w + h * dh + e] as f64;
    for b in 0..a.batch {
        for h in 0..a.heads {
            for i in 0..t {
                let s: Vec<f64> = (0..=i)
                    .map(|j| (0..dh).map(|e| at(q, b, i, h, e) * at(k, b, j, h, e)).sum::<f64>() * scale)
                    .collect();
                let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let z: f64 = s.iter().map(|x| (x - m).exp()).sum();
                for e in 0..dh {
                    out[(b * t + i) * w + h * dh + e] =
                        s.iter().enumerate().map(|(j, x)| (x - m).exp() / z * at(v, b, j, h, e)).sum();
                }
            }
        }
    }
    out
}

/// The row logsumexps of the scaled, causally masked scores, with plain loops in f64.
fn naive_lse(q: &[f32], k: &[f32], a: AttnDims) -> Vec<f64> {
    let (t, dh, w) = (a.seq, a.head_dim, a.heads * a.head_dim);
    let scale = 1.0 / (dh as f64).sqrt();
    let at = |x: &[f32], b: usize, i: usize, h: usize, e: usize| x[(b * t + i) * w + h * dh + e] as f64;
    let mut lse = Vec::with_capacity(a.batch * a.heads * t);
    for b in 0..a.batch {
        for h in 0..a.heads {
            for i in 0..t {
                let s = (0..=i).map(|j| (0..dh).map(|e| at(q, b, i, h, e) * at(k, b, j, h, e)).sum::<f64>() * scale);
                lse.push(s.map(f64::exp).sum::<f64>().ln());
            }
        }
    }
    lse
}

const SHAPES: &[(usize, usize, usize, usize)] =
    &[(1, 1, 1, 1), (1, 2, 1, 4), (2, 5, 2, 3), (3, 33, 4, 16), (2, 70, 3, 32)];

#[test]
fn causal_attention_matches_references() {
    on_each_backend(|dev| {
        for (i, &(batch, seq, heads, head_dim)) in SHAPES.iter().enumerate() {
            let a = AttnDims { batch, seq, heads, head_dim };
            let dims = [batch, seq, heads * head_dim];
            let seed = 10 * i as u64;
            let (q, k, v) = (random(dev, &dims, seed)?, random(dev, &dims, seed + 1)?, random(dev, &dims, seed + 2)?);
            let (qv, kv, vv) = (q.to_vec()?, k.to_vec()?, v.to_vec()?);
            let (out, lse) = ops::causal_attention(&q, &k, &v, heads)?;
            assert_eq!((lse.dims(), lse.dtype()), (&[batch, heads, seq][..], DType::F32));
            let (ro, rl) = cpu::causal_attention(&qv, &kv, &vv, a, DType::F32);
            let what = format!("causal_attention {a:?}");
            assert!(rel_err64(&ro, &naive(&qv, &kv, &vv, a)) < 1e-6, "{what}: the CPU reference is off");
            assert!(rel_err64(&rl, &naive_lse(&qv, &kv, a)) < 1e-6, "{what}: the CPU reference's lse is off");
            check_ref(dev, &what, &out.to_vec()?, &ro, TOL_GEMM)?;
            check_ref(dev, &format!("{what} lse"), &lse.to_vec()?, &rl, TOL_GEMM)?;
            let dout = random(dev, &dims, seed + 3)?;
            let (dq, dk, dv) = ops::causal_attention_backward(&dout, &q, &k, &v, &out, &lse, heads)?;
            let (dov, ov, lv) = (dout.to_vec()?, out.to_vec()?, lse.to_vec()?);
            let saved = AttnSaved { dout: &dov, q: &qv, k: &kv, v: &vv, out: &ov, lse: &lv };
            let (rq, rk, rv) = cpu::causal_attention_backward(saved, a, DType::F32);
            check_ref(dev, &format!("{what} dq"), &dq.to_vec()?, &rq, TOL_GEMM)?;
            check_ref(dev, &format!("{what} dk"), &dk.to_vec()?, &rk, TOL_GEMM)?;
            check_ref(dev, &format!("{what} dv"), &dv.to_vec()?, &rv, TOL_GEMM)?;
        }
        Ok(())
    });
}

#[test]
fn causal_attention_backward_matches_finite_differences() {
    on_each_backend(|dev| {
        let a = AttnDims { batch: 2, seq: 6, heads: 2, head_dim: 3 };
        let dims = [2, 6, 6];
        let n = 72;
        let (qv, kv, vv, r) = (random_vec(n, 1), random_vec(n, 2), random_vec(n, 3), random_vec(n, 4));
        let t = |x: &[f32]| Tensor::from_slice(dev, x, &dims);
        let (q, k, v) = (t(&qv)?, t(&kv)?, t(&vv)?);
        let (out, lse) = ops::causal_attention(&q, &k, &v, 2)?;
        let (dq, dk, dv) = ops::causal_attention_backward(&t(&r)?, &q, &k, &v, &out, &lse, 2)?;
        let loss = |q: &[f32], k: &[f32], v: &[f32]| dot(&r, &cpu::causal_attention(q, k, v, a, DType::F32).0);
        check_fd("dq", &dq.to_vec()?, &fd_grad(&qv, |q| loss(q, &kv, &vv)))?;
        check_fd("dk", &dk.to_vec()?, &fd_grad(&kv, |k| loss(&qv, k, &vv)))?;
        check_fd("dv", &dv.to_vec()?, &fd_grad(&vv, |v| loss(&qv, &kv, v)))
    });
}

#[test]
fn causal_attention_replays_bitwise_equal_to_eager() {
    on_each_backend(|dev| {
        let dims = [3, 40, 64];
        let (q, k, v, d) =
            (random(dev, &dims, 1)?, random(dev, &dims, 2)?, random(dev, &dims, 3)?, random(dev, &dims, 4)?);
        eager_vs_replay(dev, || {
            let (out, lse) = ops::causal_attention(&q, &k, &v, 4)?;
            let (dq, dk, dv) = ops::causal_attention_backward(&d, &q, &k, &v, &out, &lse, 4)?;
            Ok(vec![out, lse, dq, dk, dv])
        })
    });
}

#[test]
fn causal_attention_rejects_bad_shapes() {
    on_each_backend(|dev| {
        let x = Tensor::zeros(dev, &[2, 4, 6])?;
        expect_err("heads", ops::causal_attention(&x, &x, &x, 4), is_shape)?;
        expect_err("zero heads", ops::causal_attention(&x, &x, &x, 0), is_shape)?;
        expect_err("rank", ops::causal_attention(&Tensor::zeros(dev, &[8, 6])?, &x, &x, 2), is_shape)?;
        let (out, lse) = ops::causal_attention(&x, &x, &x, 2)?;
        expect_err(
            "dout",
            ops::causal_attention_backward(&Tensor::zeros(dev, &[2, 4, 3])?, &x, &x, &x, &out, &lse, 2),
            is_shape,
        )?;
        expect_err("out", ops::causal_attention_backward(&x, &x, &x, &x, &lse, &lse, 2), is_shape)?;
        expect_err("lse", ops::causal_attention_backward(&x, &x, &x, &x, &out, &lse, 3), is_shape)
    });
}

/// Attention in bf16 and f16 tracks the f32 op on the same inputs (values both dtypes hold
/// exactly): f32 scores, statistics and GEMM accumulation, the probabilities and dS rounded
/// to the dtype once. `lse` stays f32. Tolerance: a few roundings of the dtype.
#[test]
fn causal_attention_in_half_precision_tracks_f32() {
    on_each_backend(|dev| {
        let (heads, dims) = (3, [2, 19, 12]);
        let n: usize = dims.iter().product();
        for dtype in [DType::BF16, DType::F16] {
            let tol = if dtype == DType::BF16 { 1.5e-2 } else { 2e-3 }; // about 5x the host's error
            let vals: Vec<Vec<f32>> =
                (0..4).map(|s| random_vec(n, 40 + s).into_iter().map(|x| dtype.round(2.0 * x)).collect()).collect();
            let half = |v: &[f32]| Tensor::from_slice_as(dev, v, &dims, dtype);
            let full = |v: &[f32]| Tensor::from_slice(dev, v, &dims);
            let [q, k, v, d] = [0, 1, 2, 3].map(|i| half(&vals[i]));
            let [q, k, v, d] = [q?, k?, v?, d?];
            let [qf, kf, vf, df] = [0, 1, 2, 3].map(|i| full(&vals[i]));
            let [qf, kf, vf, df] = [qf?, kf?, vf?, df?];
            let ((out, lse), (outf, lsef)) =
                (ops::causal_attention(&q, &k, &v, heads)?, ops::causal_attention(&qf, &kf, &vf, heads)?);
            assert_eq!((out.dtype(), lse.dtype()), (dtype, DType::F32));
            let what = format!("causal_attention {dtype}");
            check_close(&what, &out.to_vec()?, &outf.to_vec()?, tol)?;
            check_close(&format!("{what} lse"), &lse.to_vec()?, &lsef.to_vec()?, TOL_GEMM)?;
            let grads = ops::causal_attention_backward(&d, &q, &k, &v, &out, &lse, heads)?;
            let gradsf = ops::causal_attention_backward(&df, &qf, &kf, &vf, &outf, &lsef, heads)?;
            for (name, g, gf) in [("dq", &grads.0, &gradsf.0), ("dk", &grads.1, &gradsf.1), ("dv", &grads.2, &gradsf.2)]
            {
                assert_eq!(g.dtype(), dtype);
                check_close(&format!("{what} {name}"), &g.to_vec()?, &gf.to_vec()?, tol)?;
            }
            eager_vs_replay(dev, || {
                let (out, lse) = ops::causal_attention(&q, &k, &v, heads)?;
                let (dq, dk, dv) = ops::causal_attention_backward(&d, &q, &k, &v, &out, &lse, heads)?;
                Ok(vec![out, lse, dq, dk, dv])
            })?;
        }
        Ok(())
    });
}

fn check_close(what: &str, got: &[f32], want: &[f32], tol: f64) -> graphed::Result<()> {
    let e = common::rel_err(got, want);
    if e.is_nan() || e >= tol {
        return Err(graphed::Error::msg(format!("{what}: relative error {e:e} to f32 (tolerance {tol:e})")));
    }
    Ok(())
}
