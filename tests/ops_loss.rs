//! softmax_cross_entropy, mse_loss and their backwards: CPU reference, finite differences,
//! graph replay, bad labels and shapes.

mod common;
mod ops_support;

use common::{on_each_backend, random, random_vec};
use graphed::ops::{self, cpu};
use graphed::{CaptureMode, DType, Device, Error, Graph, OpError, Result, Tensor};
use ops_support::*;

fn is_label(e: &Error) -> bool {
    matches!(e, Error::Op(OpError::Label { row: 1, classes: 4, .. }))
}

/// (rows, classes), including non-multiples of 32 and 256, and a batch past the rows whose mean
/// one block takes on CUDA (16,384: larger ones take the partial sums).
/// On CUDA, rows of 8 KB or more take the row in shared memory: (7, 4096) and (5, 9000) whole
/// 16-byte words, (5, 4099) and (3, 50_257) (GPT-2's vocabulary) rows that start and end inside
/// a word, (100, 4096) a hundred rows of them; rows past
/// a block's shared memory split over a cluster of blocks on an H100 or H200 ((2, 70_000) whole
/// words and (2, 60_001) not, two blocks; (2, 150_001) three); rows past eight blocks' shared
/// memory (2, 500_000) one block a row, two reads.
const SHAPES: &[(usize, usize)] = &[
    (1, 1),
    (1, 2),
    (4, 10),
    (33, 257),
    (64, 1000),
    (300, 3),
    (70_001, 3),
    (7, 4096),
    (5, 4099),
    (5, 9000),
    (3, 50_257),
    (2, 70_000),
    (2, 60_001),
    (100, 4096),
    (2, 150_001),
    (2, 500_000),
];

/// Labels `0..classes` spread over the rows, as f32.
fn labels(rows: usize, classes: usize, seed: u64) -> Vec<f32> {
    random_vec(rows, seed)
        .into_iter()
        .map(|v| (((v + 1.0) * 0.5 * classes as f32) as usize).min(classes - 1) as f32)
        .collect()
}

fn logits(dev: &Device, rows: usize, classes: usize, seed: u64) -> Result<Tensor> {
    let v: Vec<f32> = random_vec(rows * classes, seed).into_iter().map(|x| 5.0 * x).collect();
    Tensor::from_slice(dev, &v, &[rows, classes])
}

#[test]
fn softmax_cross_entropy_matches_reference() {
    on_each_backend(|dev| {
        for (i, &(n, c)) in SHAPES.iter().enumerate() {
            let seed = 10 * i as u64;
            let x = logits(dev, n, c, seed)?;
            let lv = labels(n, c, seed + 1);
            let l = Tensor::from_slice(dev, &lv, &[n])?;
            let (loss, probs) = ops::softmax_cross_entropy(&x, &l)?;
            assert_eq!((loss.dims(), probs.dims()), (&[1][..], &[n, c][..]));
            let (rloss, rprobs) = cpu::softmax_cross_entropy(&x.to_vec()?, &lv, c)?;
            let what = format!("softmax_cross_entropy {n}x{c}");
            check_ref(dev, &what, &loss.to_vec()?, &[rloss], TOL)?;
            check_ref(dev, &format!("{what} probs"), &probs.to_vec()?, &rprobs, TOL)?;
            for scale in [1.0f32, 0.25] {
                let d = ops::softmax_cross_entropy_backward(&probs, &l, scale)?;
                let rd = cpu::softmax_cross_entropy_backward(&probs.to_vec()?, &lv, c, scale)?;
                check_ref(dev, &format!("{what} backward x{scale}"), &d.to_vec()?, &rd, TOL)?;
            }
        }
        Ok(())
    });
}

/// Masked logits (-inf, a vocabulary mask) get probability 0 and leave the loss finite, on the
/// register kernels (1,000 classes), the row in shared memory (9,000 and 4,099), a cluster of
/// blocks a row (70,000 and 60,001, where one block's part of a row may be all masked) and the
/// one-block-a-row kernel (500,000), also where a row starts with them (the one-block kernel's
/// running max is still -inf there).
#[test]
fn masked_logits_get_zero_probability() {
    on_each_backend(|dev| {
        for (n, c) in [(6usize, 1000usize), (6, 9000), (6, 4099), (4, 70_000), (4, 60_001), (2, 500_000)] {
            let mut v: Vec<f32> = random_vec(n * c, 5).into_iter().map(|x| 5.0 * x).collect();
            for r in 0..n {
                let masked = if r % 2 == 0 { 0..c / 3 } else { c / 2..c / 2 + 7 };
                for j in masked {
                    v[r * c + j] = f32::NEG_INFINITY;
                }
            }
            let lv: Vec<f32> = (0..n).map(|r| (c - 1 - r) as f32).collect();
            let (x, l) = (Tensor::from_slice(dev, &v, &[n, c])?, Tensor::from_slice(dev, &lv, &[n])?);
            let (loss, probs) = ops::softmax_cross_entropy(&x, &l)?;
            let (rloss, rprobs) = cpu::softmax_cross_entropy(&v, &lv, c)?;
            let what = format!("masked softmax_cross_entropy {n}x{c}");
            let (got, p) = (loss.to_vec()?, probs.to_vec()?);
            assert!(got[0].is_finite(), "{what}: loss {}", got[0]);
            check_ref(dev, &what, &got, &[rloss], TOL)?;
            check_ref(dev, &format!("{what} probs"), &p, &rprobs, TOL)?;
            for (i, (pv, xv)) in p.iter().zip(&v).enumerate() {
                if *xv == f32::NEG_INFINITY {
                    assert_eq!(*pv, 0.0, "{what}: element {i} is masked");
                }
            }
        }
        Ok(())
    });
}

/// bf16 and f16 logits at every width the CUDA kernels split on: registers (10, 1000), the row
/// in shared memory with whole words (4096, 8192) and with rows starting inside a word (4099, 50,257), a cluster of blocks a row past one
/// block's shared memory (131,072 whole words, 120,001 not); probs
/// within a rounding of the reference, the backward bit for bit the reference's (one f32 product
/// a value, rounded once), graphed equal to eager bit for bit.
#[test]
fn cross_entropy_in_16_bit_at_every_width() {
    on_each_backend(|dev| {
        for dtype in [DType::BF16, DType::F16] {
            let tol = if dtype == DType::BF16 { 1e-2 } else { 1e-3 };
            for (i, &(n, c)) in [
                (9usize, 10usize),
                (5, 1000),
                (6, 4096),
                (40, 8192),
                (5, 4099),
                (3, 50_257),
                (2, 131_072),
                (2, 120_001),
            ]
            .iter()
            .enumerate()
            {
                let seed = 300 + 10 * i as u64;
                let v: Vec<f32> = random_vec(n * c, seed).into_iter().map(|x| 4.0 * x).collect();
                let x = Tensor::from_slice_as(dev, &v, &[n, c], dtype)?;
                let lv = labels(n, c, seed + 1);
                let l = Tensor::from_slice(dev, &lv, &[n])?;
                let (loss, probs) = ops::softmax_cross_entropy(&x, &l)?;
                let (rloss, rprobs) = cpu::softmax_cross_entropy(&x.to_vec()?, &lv, c)?;
                let what = format!("{dtype:?} softmax_cross_entropy {n}x{c}");
                check_ref(dev, &what, &loss.to_vec()?, &[rloss], TOL)?;
                let rounded: Vec<f32> = rprobs.iter().map(|p| dtype.round(*p)).collect();
                check_ref(dev, &format!("{what} probs"), &probs.to_vec()?, &rounded, tol)?;
                // The backward: 16 bytes a load on CUDA where a word straddles two rows too.
                let d = ops::softmax_cross_entropy_backward(&probs, &l, 0.5)?;
                let rd = cpu::softmax_cross_entropy_backward(&probs.to_vec()?, &lv, c, 0.5)?;
                let rd: Vec<f32> = rd.iter().map(|v| dtype.round(*v)).collect();
                bitwise_eq(&format!("{what} backward"), &d.to_vec()?, &rd)?;
                eager_vs_replay(dev, || {
                    let (loss, probs) = ops::softmax_cross_entropy(&x, &l)?;
                    let d = ops::softmax_cross_entropy_backward(&probs, &l, 0.5)?;
                    Ok(vec![loss, probs, d])
                })?;
            }
        }
        Ok(())
    });
}

#[test]
fn ignored_labels_add_nothing_and_are_not_counted() {
    on_each_backend(|dev| {
        for (i, &(n, c)) in SHAPES.iter().enumerate() {
            let seed = 70 + 10 * i as u64;
            let x = logits(dev, n, c, seed)?;
            // Every third row ignored (padding), and the same rows left out entirely.
            let lv: Vec<f32> = labels(n, c, seed + 1)
                .into_iter()
                .enumerate()
                .map(|(r, l)| if r % 3 == 1 { ops::IGNORE_LABEL } else { l })
                .collect();
            let l = Tensor::from_slice(dev, &lv, &[n])?;
            let (loss, probs) = ops::softmax_cross_entropy(&x, &l)?;
            let kept: Vec<usize> = (0..n).filter(|r| r % 3 != 1).collect();
            let xv = x.to_vec()?;
            let kept_x: Vec<f32> = kept.iter().flat_map(|r| xv[r * c..(r + 1) * c].to_vec()).collect();
            let kept_l: Vec<f32> = kept.iter().map(|r| lv[*r]).collect();
            let (rloss, _) = cpu::softmax_cross_entropy(&kept_x, &kept_l, c)?;
            let what = format!("softmax_cross_entropy {n}x{c} with ignored rows");
            check_ref(dev, &what, &loss.to_vec()?, &[rloss], TOL)?;
            let d = ops::softmax_cross_entropy_backward(&probs, &l, 1.0)?.to_vec()?;
            let rd = cpu::softmax_cross_entropy_backward(&probs.to_vec()?, &lv, c, 1.0)?;
            check_ref(dev, &format!("{what} backward"), &d, &rd, TOL)?;
            for r in (1..n).step_by(3) {
                assert!(d[r * c..(r + 1) * c].iter().all(|v| *v == 0.0), "{what}: row {r} gets no grad");
            }
            // Nothing ignored: bit for bit the plain mean (the device divides as the host did).
            let plain_v = labels(n, c, seed + 1);
            let plain = Tensor::from_slice(dev, &plain_v, &[n])?;
            let (a, pa) = ops::softmax_cross_entropy(&x, &plain)?;
            let (b, _) = ops::softmax_cross_entropy(&x, &plain)?;
            assert_eq!(a.to_vec()?, b.to_vec()?);
            let da = ops::softmax_cross_entropy_backward(&pa, &plain, 0.5)?.to_vec()?;
            let scale = 0.5 / n as f32;
            let pv = pa.to_vec()?;
            for (j, v) in da.iter().enumerate() {
                let hot = if j % c == plain_v[j / c] as usize { 1.0 } else { 0.0 };
                assert_eq!(*v, (pv[j] - hot) * scale, "{what}: the plain grad scale is dloss/rows exactly");
            }
        }
        // Every row ignored: a zero loss and zero grads, never NaN.
        let x = logits(dev, 4, 3, 1)?;
        let l = Tensor::from_slice(dev, &[ops::IGNORE_LABEL; 4], &[4])?;
        let (loss, probs) = ops::softmax_cross_entropy(&x, &l)?;
        assert_eq!(loss.to_vec()?, vec![0.0]);
        assert!(ops::softmax_cross_entropy_backward(&probs, &l, 1.0)?.to_vec()?.iter().all(|v| *v == 0.0));
        ops::validate_labels(&l, 3)
    });
}

#[test]
fn softmax_cross_entropy_backward_matches_finite_differences() {
    on_each_backend(|dev| {
        let (n, c) = (5, 7);
        let xv = random_vec(n * c, 3);
        let lv = labels(n, c, 4);
        let (x, l) = (Tensor::from_slice(dev, &xv, &[n, c])?, Tensor::from_slice(dev, &lv, &[n])?);
        let (_, probs) = ops::softmax_cross_entropy(&x, &l)?;
        let scale = 0.5f32;
        let d = ops::softmax_cross_entropy_backward(&probs, &l, scale)?;
        let fd = fd_grad(&xv, |x| scale as f64 * cpu::softmax_cross_entropy(x, &lv, c).unwrap().0 as f64);
        check_fd("dlogits", &d.to_vec()?, &fd)
    });
}

#[test]
fn mse_matches_reference_and_finite_differences() {
    on_each_backend(|dev| {
        for &n in &[1usize, 7, 257, 1000, 100_003] {
            let (p, t) = (random(dev, &[n], n as u64)?, random(dev, &[n], n as u64 + 1)?);
            let (pv, tv) = (p.to_vec()?, t.to_vec()?);
            check_ref(
                dev,
                &format!("mse_loss {n}"),
                &ops::mse_loss(&p, &t)?.to_vec()?,
                &[cpu::mse_loss(&pv, &tv)],
                TOL,
            )?;
            let d = ops::mse_backward(&p, &t, 3.0)?;
            check_ref(dev, &format!("mse_backward {n}"), &d.to_vec()?, &cpu::mse_backward(&pv, &tv, 3.0), TOL)?;
        }
        let (pv, tv) = (random_vec(40, 1), random_vec(40, 2));
        let (p, t) = (Tensor::from_slice(dev, &pv, &[8, 5])?, Tensor::from_slice(dev, &tv, &[8, 5])?);
        let fd = fd_grad(&pv, |p| 2.0 * cpu::mse_loss(p, &tv) as f64);
        check_fd("dpred", &ops::mse_backward(&p, &t, 2.0)?.to_vec()?, &fd)
    });
}

/// The mean over the rows of the wide-row kernels: repeated launches and graph replays give the
/// same bits, a bad label makes one launch's mean NaN (on CUDA) and leaves the next one clean,
/// and a batch whose rows are all ignored gives 0. Shapes: a row in shared memory, a cluster of
/// blocks a row, and the most rows the mean's one-block launch takes (16,384) and one more (its
/// partial sums).
#[test]
fn the_mean_over_wide_rows_is_repeatable() {
    on_each_backend(|dev| {
        for &(n, c) in &[(100usize, 4096usize), (33, 70_000), (16_384, 2048), (16_385, 2048)] {
            let x = logits(dev, n, c, 7)?;
            let lv = labels(n, c, 8);
            let l = Tensor::from_slice(dev, &lv, &[n])?;
            let what = format!("mean {n}x{c}");
            let first = ops::softmax_cross_entropy(&x, &l)?.0.to_vec()?;
            let (rloss, _) = cpu::softmax_cross_entropy(&x.to_vec()?, &lv, c)?;
            check_ref(dev, &what, &first, &[rloss], TOL)?;
            if !dev.is_host() {
                let mut bad = lv.clone();
                bad[n - 1] = c as f32;
                let lb = Tensor::from_slice(dev, &bad, &[n])?;
                assert!(ops::softmax_cross_entropy(&x, &lb)?.0.to_vec()?[0].is_nan(), "{what}: a bad label");
            }
            for _ in 0..3 {
                assert_eq!(ops::softmax_cross_entropy(&x, &l)?.0.to_vec()?, first, "{what}: launched again");
            }
            let none = Tensor::from_slice(dev, &vec![ops::IGNORE_LABEL; n], &[n])?;
            assert_eq!(ops::softmax_cross_entropy(&x, &none)?.0.to_vec()?, vec![0.0], "{what}: all ignored");
            eager_vs_replay(dev, || {
                let (a, _) = ops::softmax_cross_entropy(&x, &l)?;
                let (b, _) = ops::softmax_cross_entropy(&x, &none)?;
                Ok(vec![a, b])
            })?;
            assert_eq!(ops::softmax_cross_entropy(&x, &l)?.0.to_vec()?, first, "{what}: after the replays");
            // The backward on both sides of the batch whose blocks count the rows themselves
            // (ops/loss.rs): every fifth row ignored, the grad (p - onehot) * (0.5 / kept) as the
            // host computes it, bit for bit.
            let lv5: Vec<f32> =
                lv.iter().enumerate().map(|(r, v)| if r % 5 == 2 { ops::IGNORE_LABEL } else { *v }).collect();
            let l5 = Tensor::from_slice(dev, &lv5, &[n])?;
            let probs = ops::softmax_cross_entropy(&x, &l5)?.1;
            let d = ops::softmax_cross_entropy_backward(&probs, &l5, 0.5)?.to_vec()?;
            let scale = 0.5 / lv5.iter().filter(|v| **v != ops::IGNORE_LABEL).count() as f32;
            let pv = probs.to_vec()?;
            for (j, v) in d.iter().enumerate() {
                let lab = lv5[j / c];
                let want = if lab == ops::IGNORE_LABEL {
                    0.0
                } else {
                    (pv[j] - if j % c == lab as usize { 1.0 } else { 0.0 }) * scale
                };
                assert_eq!(v.to_bits(), want.to_bits(), "{what}: grad element {j}");
            }
        }
        Ok(())
    });
}

#[test]
fn losses_replay_bitwise_equal_to_eager() {
    on_each_backend(|dev| {
        let (n, c) = (129, 1001);
        let x = logits(dev, n, c, 1)?;
        let l = Tensor::from_slice(dev, &labels(n, c, 2), &[n])?;
        let (p, t) = (random(dev, &[300, 301], 3)?, random(dev, &[300, 301], 4)?);
        eager_vs_replay(dev, || {
            let (loss, probs) = ops::softmax_cross_entropy(&x, &l)?;
            let d = ops::softmax_cross_entropy_backward(&probs, &l, 1.0)?;
            Ok(vec![loss, probs, d, ops::mse_loss(&p, &t)?, ops::mse_backward(&p, &t, 0.5)?])
        })
    });
}

#[test]
fn bad_labels_are_typed_errors_on_host_and_nan_on_cuda() {
    on_each_backend(|dev| {
        let x = logits(dev, 3, 4, 1)?;
        let probs = ops::softmax_cross_entropy(&x, &Tensor::from_slice(dev, &[0.0, 1.0, 3.0], &[3])?)?.1;
        for bad in [4.0f32, -1.0, 1.5, f32::NAN, 1e9] {
            let l = Tensor::from_slice(dev, &[0.0, bad, 2.0], &[3])?;
            expect_err(&format!("validate_labels {bad}"), ops::validate_labels(&l, 4), is_label)?;
            if dev.is_host() {
                expect_err(&format!("forward label {bad}"), ops::softmax_cross_entropy(&x, &l), is_label)?;
                expect_err(
                    &format!("backward label {bad}"),
                    ops::softmax_cross_entropy_backward(&probs, &l, 1.0),
                    is_label,
                )?;
            } else {
                // The kernel never reads out of bounds: the bad row's loss (so the mean) is NaN
                // and so is its grad row; the other rows are untouched.
                let (loss, _) = ops::softmax_cross_entropy(&x, &l)?;
                assert!(loss.to_vec()?[0].is_nan(), "label {bad}: loss should be NaN");
                let d = ops::softmax_cross_entropy_backward(&probs, &l, 1.0)?.to_vec()?;
                assert!(d[4..8].iter().all(|v| v.is_nan()) && d[..4].iter().chain(&d[8..]).all(|v| v.is_finite()));
            }
        }
        // A graph that captured the op reports the bad label when it replays on the host.
        let l = Tensor::from_slice(dev, &[0.0, 1.0, 2.0], &[3])?;
        let mut g = Graph::new(dev);
        let (loss, _) = g.capture(CaptureMode::Global, || {
            // Reading labels back is illegal during a capture.
            expect_err("validate_labels in capture", ops::validate_labels(&l, 4), |e| {
                matches!(e, Error::IllegalDuringCapture { .. })
            })?;
            ops::softmax_cross_entropy(&x, &l)
        })?;
        g.replay()?;
        assert!(loss.to_vec()?[0].is_finite());
        l.copy_from_slice(&[0.0, 9.0, 2.0])?;
        if dev.is_host() {
            expect_err("replay with a bad label", g.replay(), is_label)?;
        } else {
            g.replay()?;
            assert!(loss.to_vec()?[0].is_nan());
        }
        Ok(())
    });
}

#[test]
fn losses_reject_bad_shapes() {
    on_each_backend(|dev| {
        let x = logits(dev, 3, 4, 1)?;
        let l = Tensor::from_slice(dev, &[0.0, 1.0, 2.0], &[3])?;
        expect_err("labels length", ops::softmax_cross_entropy(&x, &Tensor::zeros(dev, &[2])?), is_shape)?;
        expect_err("labels rank", ops::softmax_cross_entropy(&x, &Tensor::zeros(dev, &[3, 1])?), is_shape)?;
        expect_err("logits rank", ops::softmax_cross_entropy(&Tensor::zeros(dev, &[12])?, &l), is_shape)?;
        expect_err("no classes", ops::softmax_cross_entropy(&Tensor::zeros(dev, &[3, 0])?, &l), is_shape)?;
        expect_err(
            "backward labels",
            ops::softmax_cross_entropy_backward(&x, &Tensor::zeros(dev, &[4])?, 1.0),
            is_shape,
        )?;
        let (p, t) = (random(dev, &[4, 5], 1)?, random(dev, &[5, 4], 2)?);
        expect_err("mse shapes", ops::mse_loss(&p, &t), is_shape)?;
        expect_err("mse_backward shapes", ops::mse_backward(&p, &t, 1.0), is_shape)?;
        Ok(())
    });
}
