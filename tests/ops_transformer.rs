//! embedding, rms_norm and swiglu with their backwards (#13): CPU reference, finite
//! differences, graph replay, errors; swiglu_packed (gate and up in one tensor) against swiglu.

mod common;
mod ops_support;

use common::{on_each_backend, random, random_vec};
use graphed::ops::{self, cpu};
use graphed::{CaptureMode, DType, Device, Error, Graph, OpError, Result, Tensor};
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

fn is_bad_token(e: &Error) -> bool {
    matches!(e, Error::TokenOutOfRange { pos: 1, vocab: 4, .. })
}

/// A bad id is `Error::TokenOutOfRange` on every backend: at the call on the host, at the next
/// read or synchronize on CUDA (the kernels report it in the device's error word), which then
/// reads clear again.
#[test]
fn embedding_rejects_bad_ids_and_shapes() {
    on_each_backend(|dev| {
        let table = random(dev, &[4, 3], 1)?;
        for bad in [4.0, -1.0, 1.5, f32::NAN] {
            let id = Tensor::from_slice(dev, &[0.0, bad], &[2])?;
            expect_err("bad id", ops::embedding(&id, &table).and_then(|y| y.to_vec()), is_bad_token)?;
            dev.synchronize()?;
            let (dy, dt) = (Tensor::zeros(dev, &[2, 3])?, Tensor::zeros(dev, &[4, 3])?);
            let r = ops::embedding_backward(&dy, &id, &dt).and_then(|()| dt.to_vec());
            expect_err("bad id backward", r, |e| matches!(e, Error::TokenOutOfRange { pos: 1, .. }))?;
            dev.synchronize()?;
        }
        let id = Tensor::from_slice(dev, &[0.0, 1.0], &[2])?;
        expect_err("1-d table", ops::embedding(&id, &Tensor::zeros(dev, &[4])?), is_shape)?;
        let (dy, dt) = (Tensor::zeros(dev, &[2, 2])?, Tensor::zeros(dev, &[4, 3])?);
        expect_err("dy shape", ops::embedding_backward(&dy, &id, &dt), is_shape)
    });
}

/// An id that turns bad after capture surfaces when the graph replays (host: the replay fails;
/// CUDA: the next read after the replay fails), and good ids replay cleanly afterwards.
#[test]
fn a_bad_id_in_a_replayed_graph_is_an_error() {
    on_each_backend(|dev| {
        let (table, id) = (random(dev, &[4, 3], 1)?, Tensor::from_slice(dev, &[0.0, 1.0], &[2])?);
        let mut g = Graph::new(dev);
        let y = g.capture(CaptureMode::Global, || ops::embedding(&id, &table))?;
        id.copy_from_slice(&[0.0, 9.0])?;
        let r = g.replay().and_then(|()| y.to_vec());
        expect_err("replay", r, |e| matches!(e, Error::TokenOutOfRange { pos: 1, vocab: 4, .. }))?;
        id.copy_from_slice(&[2.0, 3.0])?;
        g.replay()?;
        check_ref(dev, "good ids again", &y.to_vec()?, &cpu::embedding(&[2.0, 3.0], &table.to_vec()?, 4, 3)?, TOL)
    });
}

#[test]
fn rms_norm_matches_reference_and_finite_differences() {
    on_each_backend(|dev| {
        // (1200, 1000): more row groups than the backward's blocks; (3, 9000) and (2, 20000): rows
        // too wide for the register kernels on CUDA (backward, then both), the plain kernels.
        let shapes = [(1, 1), (3, 5), (7, 33), (33, 257), (130, 768), (2, 4099), (1200, 1000), (3, 9000), (2, 20000)];
        for (i, &(n, d)) in shapes.iter().enumerate() {
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
        expect_err("bad eps", ops::rms_norm(&x, &g, -1.0), |e| matches!(e, Error::Op(OpError::Eps { .. })))
    });
}

/// The bf16 RMSNorm backward with more row groups than the grid's blocks against the reference,
/// the gamma grad accumulated into an f32 grad; two runs give the same bits, and a replay the
/// eager bits. On CUDA this is the plain ring kernel by default; with
/// `GRAPHED_RMS_BWD_CLUSTER=8` on sm_90 (as `scripts/rms-bwd-cluster.sh` runs it) the cluster
/// form, `rms_ring_bwd_cl_bf16`, whose blocks add their partials in distributed shared memory.
#[test]
fn rms_norm_bf16_backward_over_many_blocks_matches_reference() {
    on_each_backend(|dev| {
        for (i, &(n, d)) in [(1200usize, 1000usize), (4096, 512), (600, 4096), (77, 96)].iter().enumerate() {
            let seed = 1300 + 10 * i as u64;
            let what = format!("bf16 rms_norm_backward {n}x{d}");
            let xv: Vec<f32> = random_vec(n * d, seed).into_iter().map(|v| 3.0 * v + 0.7).collect();
            let x = Tensor::from_slice_as(dev, &xv, &[n, d], DType::BF16)?;
            let g = Tensor::from_slice_as(dev, &random_vec(d, seed + 1), &[d], DType::BF16)?;
            let dy = Tensor::from_slice_as(dev, &random_vec(n * d, seed + 2), &[n, d], DType::BF16)?;
            let (_, rstd) = ops::rms_norm(&x, &g, EPS)?;
            let g0 = random_vec(d, seed + 3);
            let run = || -> Result<(Tensor, Tensor)> {
                let dg = Tensor::from_slice(dev, &g0, &[d])?;
                Ok((ops::rms_norm_backward(&dy, &x, &g, &rstd, &dg)?, dg))
            };
            let (dx, dg) = run()?;
            let mut rdg = g0.clone();
            let rdx = cpu::rms_norm_backward(&dy.to_vec()?, &x.to_vec()?, &g.to_vec()?, &rstd.to_vec()?, d, &mut rdg);
            let rdx: Vec<f32> = rdx.iter().map(|v| DType::BF16.round(*v)).collect();
            check_ref(dev, &format!("{what} dx"), &dx.to_vec()?, &rdx, 1e-2)?;
            check_ref(dev, &format!("{what} dgamma"), &dg.to_vec()?, &rdg, TOL)?;
            let (dx2, dg2) = run()?;
            bitwise_eq(&format!("{what} dx, run twice"), &dx2.to_vec()?, &dx.to_vec()?)?;
            bitwise_eq(&format!("{what} dgamma, run twice"), &dg2.to_vec()?, &dg.to_vec()?)?;
            eager_vs_replay(dev, || {
                let dg = Tensor::zeros(dev, &[d])?;
                Ok(vec![ops::rms_norm_backward(&dy, &x, &g, &rstd, &dg)?, dg])
            })?;
        }
        Ok(())
    });
}

/// bf16 rows of 8 KB and more (on CUDA the row in shared memory, `rms_smem_bf16`), plain and with
/// the residual add, against the reference within bf16's rounding, graphed equal to eager; (2,
/// 4100) is not whole 16-byte words and takes the register kernel.
#[test]
fn rms_norm_bf16_wide_rows_match_reference() {
    on_each_backend(|dev| {
        for (i, &(n, d)) in [(5usize, 4096usize), (3, 12_000), (2, 50_000), (2, 4100)].iter().enumerate() {
            let seed = 900 + 10 * i as u64;
            let xv: Vec<f32> = random_vec(n * d, seed).into_iter().map(|v| 3.0 * v + 0.7).collect();
            let x = Tensor::from_slice_as(dev, &xv, &[n, d], DType::BF16)?;
            let r = Tensor::from_slice_as(dev, &random_vec(n * d, seed + 1), &[n, d], DType::BF16)?;
            let g = Tensor::from_slice_as(dev, &random_vec(d, seed + 2), &[d], DType::BF16)?;
            let what = format!("bf16 rms_norm {n}x{d}");
            let (y, rstd) = ops::rms_norm(&x, &g, EPS)?;
            let (ry, rr) = cpu::rms_norm(&x.to_vec()?, &g.to_vec()?, d, EPS);
            let ry: Vec<f32> = ry.iter().map(|v| DType::BF16.round(*v)).collect();
            check_ref(dev, &what, &y.to_vec()?, &ry, 1e-2)?;
            check_ref(dev, &format!("{what} rstd"), &rstd.to_vec()?, &rr, TOL)?;
            let (sum, ya, rstda) = ops::add_rms_norm(&x, &r, &g, EPS)?;
            let (rya, rra) = cpu::rms_norm(&sum.to_vec()?, &g.to_vec()?, d, EPS);
            let rya: Vec<f32> = rya.iter().map(|v| DType::BF16.round(*v)).collect();
            check_ref(dev, &format!("{what} with the add"), &ya.to_vec()?, &rya, 1e-2)?;
            check_ref(dev, &format!("{what} with the add, rstd"), &rstda.to_vec()?, &rra, TOL)?;
            eager_vs_replay(dev, || {
                let (y, rstd) = ops::rms_norm(&x, &g, EPS)?;
                let (sum, ya, rstda) = ops::add_rms_norm(&x, &r, &g, EPS)?;
                Ok(vec![y, rstd, sum, ya, rstda])
            })?;
        }
        Ok(())
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

/// `swiglu_packed` of `[gate | up]` rows is bitwise `swiglu` of the two halves, in every dtype,
/// for half-widths the 16-byte packs divide (1368: the GPU GPT's hidden width) and ones they
/// do not, eager and replayed; a width that cannot hold two halves is refused.
#[test]
fn swiglu_packed_is_swiglu_of_the_halves_bitwise() {
    on_each_backend(|dev| {
        for dtype in [DType::F32, DType::BF16, DType::F16] {
            for (i, &(rows, h)) in [(1usize, 1368usize), (3, 8), (5, 13), (2, 4)].iter().enumerate() {
                let seed = 400 + 10 * i as u64;
                let gu: Vec<f32> = random_vec(rows * 2 * h, seed).into_iter().map(|v| dtype.round(4.0 * v)).collect();
                let (gate, up): (Vec<f32>, Vec<f32>) =
                    gu.chunks(2 * h).flat_map(|r| r[..h].iter().zip(&r[h..])).unzip();
                let t = |v: &[f32], w: usize| Tensor::from_slice_as(dev, v, &[rows, w], dtype);
                let packed = t(&gu, 2 * h)?;
                let y = ops::swiglu_packed(&packed)?;
                assert_eq!((y.dtype(), y.dims()), (dtype, &[rows, h][..]));
                let want = ops::swiglu(&t(&gate, h)?, &t(&up, h)?)?.to_vec()?;
                bitwise_eq(&format!("swiglu_packed {dtype} {rows}x{h}"), &y.to_vec()?, &want)?;
            }
            let packed = Tensor::from_slice_as(dev, &random_vec(2 * 3 * 32, 5), &[2, 3, 32], dtype)?;
            assert_eq!(ops::swiglu_packed(&packed)?.dims(), &[2, 3, 16]);
            eager_vs_replay(dev, || Ok(vec![ops::swiglu_packed(&packed)?]))?;
        }
        expect_err("odd width", ops::swiglu_packed(&Tensor::zeros(dev, &[2, 7])?), is_shape)?;
        expect_err("no width", ops::swiglu_packed(&Tensor::zeros(dev, &[2, 0])?), is_shape)
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

/// Relative error allowed between a 16-bit op and the f32 op on the same inputs (values both
/// dtypes hold exactly): a few roundings of the dtype, f32 statistics and sums on both sides.
fn half_tol(dtype: DType) -> f64 {
    if dtype == DType::BF16 {
        2e-2
    } else {
        3e-3
    }
}

/// The same random values as an f32 tensor and a `dtype` tensor (rounded to `dtype` first).
fn pair(dev: &Device, dims: &[usize], seed: u64, dtype: DType) -> Result<(Tensor, Tensor)> {
    let v: Vec<f32> = random_vec(dims.iter().product(), seed).into_iter().map(|x| dtype.round(x)).collect();
    Ok((Tensor::from_slice_as(dev, &v, dims, dtype)?, Tensor::from_slice(dev, &v, dims)?))
}

fn close(what: &str, dtype: DType, half: &Tensor, full: &Tensor, tol: f64) -> Result<()> {
    assert_eq!(half.dtype(), dtype, "{what}: dtype");
    let e = common::rel_err(&half.to_vec()?, &full.to_vec()?);
    if e.is_nan() || e >= tol {
        return Err(Error::msg(format!("{what} {dtype}: relative error {e:e} to f32 (tolerance {tol:e})")));
    }
    Ok(())
}

/// embedding, rms_norm and swiglu (and their backwards) in bf16 and f16 track the f32 ops;
/// the parameter grads accumulate into f32 or into the parameter's dtype.
#[test]
fn transformer_ops_in_half_precision_track_f32() {
    on_each_backend(|dev| {
        let (t, vocab, d) = (37, 50, 70);
        let id = Tensor::from_slice(dev, &ids(t, vocab, 1), &[t])?;
        for dtype in [DType::BF16, DType::F16] {
            let tol = half_tol(dtype);
            let ((t16, t32), (g16, g32)) = (pair(dev, &[vocab, d], 2, dtype)?, pair(dev, &[d], 3, dtype)?);
            let (x16, x32) = (ops::embedding(&id, &t16)?, ops::embedding(&id, &t32)?);
            close("embedding", dtype, &x16, &x32, 1e-30)?; // a copy: exact
            let ((h16, r16), (h32, r32)) = (ops::rms_norm(&x16, &g16, EPS)?, ops::rms_norm(&x32, &g32, EPS)?);
            check_ref(dev, "rms_norm rstd (f32)", &r16.to_vec()?, &r32.to_vec()?, TOL)?;
            close("rms_norm", dtype, &h16, &h32, tol)?;
            let (s16, s32) = (ops::swiglu(&h16, &x16)?, ops::swiglu(&h32, &x32)?);
            close("swiglu", dtype, &s16, &s32, tol)?;
            let (dy16, dy32) = pair(dev, &[t, d], 4, dtype)?;
            let ((dh16, dx16), (dh32, dx32)) =
                (ops::swiglu_backward(&dy16, &h16, &x16)?, ops::swiglu_backward(&dy32, &h32, &x32)?);
            close("swiglu_backward dgate", dtype, &dh16, &dh32, tol)?;
            close("swiglu_backward dup", dtype, &dx16, &dx32, tol)?;
            let dg32 = Tensor::zeros(dev, &[d])?;
            let dn32 = ops::rms_norm_backward(&dy32, &x32, &g32, &r32, &dg32)?;
            let de32 = Tensor::zeros(dev, &[vocab, d])?;
            ops::embedding_backward(&dy32, &id, &de32)?;
            for grad_dtype in [DType::F32, dtype] {
                let dg = Tensor::full_as(dev, &[d], 0.0, grad_dtype)?;
                let dn16 = ops::rms_norm_backward(&dy16, &x16, &g16, &r16, &dg)?;
                close("rms_norm_backward dx", dtype, &dn16, &dn32, tol)?;
                close("rms_norm_backward dgamma", grad_dtype, &dg, &dg32, tol)?;
                let de = Tensor::full_as(dev, &[vocab, d], 0.0, grad_dtype)?;
                ops::embedding_backward(&dy16, &id, &de)?;
                close("embedding_backward", grad_dtype, &de, &de32, tol)?;
            }
            let other = if dtype == DType::BF16 { DType::F16 } else { DType::BF16 };
            let bad = Tensor::zeros_as(dev, &[d], other)?;
            let mismatch = |e: &Error| matches!(e, Error::DTypeMismatch { .. });
            expect_err("dgamma dtype", ops::rms_norm_backward(&dy16, &x16, &g16, &r16, &bad), mismatch)?;
            expect_err("gamma dtype", ops::rms_norm(&x16, &bad, EPS), mismatch)?;
        }
        Ok(())
    });
}

/// add_rms_norm and its backward give the bits of the unfused ops (add, then rms_norm; then
/// rms_norm_backward, then add), in every dtype, for narrow, wide and too-wide rows, with the
/// gamma grad in f32 and in the parameter's dtype; and they replay bit for bit.
#[test]
fn add_rms_norm_equals_the_unfused_ops_bitwise() {
    on_each_backend(|dev| {
        for dtype in [DType::F32, DType::BF16, DType::F16] {
            for (i, &(n, d)) in
                [(1, 1), (5, 7), (64, 512), (33, 1030), (300, 96), (4, 4096), (3, 9000), (2, 20000)].iter().enumerate()
            {
                let seed = 500 + 10 * i as u64;
                let what = format!("add_rms_norm {dtype} {n}x{d}");
                let (x, _) = pair(dev, &[n, d], seed, dtype)?;
                let (r, _) = pair(dev, &[n, d], seed + 1, dtype)?;
                let (g, _) = pair(dev, &[d], seed + 2, dtype)?;
                let (sum, y, rstd) = ops::add_rms_norm(&x, &r, &g, EPS)?;
                let s2 = ops::add(&x, &r)?;
                let (y2, rstd2) = ops::rms_norm(&s2, &g, EPS)?;
                bitwise_eq(&format!("{what} sum"), &sum.to_vec()?, &s2.to_vec()?)?;
                bitwise_eq(&format!("{what} normed"), &y.to_vec()?, &y2.to_vec()?)?;
                bitwise_eq(&format!("{what} rstd"), &rstd.to_vec()?, &rstd2.to_vec()?)?;
                let (dy, _) = pair(dev, &[n, d], seed + 3, dtype)?;
                let (dsum, _) = pair(dev, &[n, d], seed + 4, dtype)?;
                for grad_dtype in [DType::F32, dtype] {
                    let g0 = random_vec(d, seed + 5);
                    let dg = Tensor::from_slice_as(dev, &g0, &[d], grad_dtype)?;
                    let dg2 = Tensor::from_slice_as(dev, &g0, &[d], grad_dtype)?;
                    let dx = ops::add_rms_norm_backward(&dy, &dsum, &sum, &g, &rstd, &dg)?;
                    let dx2 = ops::add(&dsum, &ops::rms_norm_backward(&dy, &s2, &g, &rstd2, &dg2)?)?;
                    bitwise_eq(&format!("{what} backward dx"), &dx.to_vec()?, &dx2.to_vec()?)?;
                    bitwise_eq(&format!("{what} backward dgamma ({grad_dtype})"), &dg.to_vec()?, &dg2.to_vec()?)?;
                }
            }
        }
        let (x, r, g) = (random(dev, &[3, 8], 1)?, random(dev, &[3, 8], 2)?, random(dev, &[8], 3)?);
        eager_vs_replay(dev, || {
            let (sum, y, rstd) = ops::add_rms_norm(&x, &r, &g, EPS)?;
            let dg = Tensor::zeros(dev, &[8])?;
            let dx = ops::add_rms_norm_backward(&y, &x, &sum, &g, &rstd, &dg)?;
            Ok(vec![sum, y, rstd, dx, dg])
        })
    });
}

#[test]
fn add_rms_norm_rejects_bad_arguments() {
    on_each_backend(|dev| {
        let (x, g) = (random(dev, &[3, 8], 1)?, random(dev, &[8], 2)?);
        expect_err("residual shape", ops::add_rms_norm(&x, &random(dev, &[3, 7], 3)?, &g, EPS), is_shape)?;
        expect_err("residual shape", ops::add_rms_norm(&x, &random(dev, &[24], 3)?, &g, EPS), is_shape)?;
        let half = Tensor::zeros_as(dev, &[3, 8], DType::BF16)?;
        let mismatch = |e: &Error| matches!(e, Error::DTypeMismatch { .. });
        expect_err("residual dtype", ops::add_rms_norm(&x, &half, &g, EPS), mismatch)?;
        expect_err("gamma shape", ops::add_rms_norm(&x, &x, &random(dev, &[9], 4)?, EPS), is_shape)?;
        expect_err("bad eps", ops::add_rms_norm(&x, &x, &g, f32::NAN), |e| {
            matches!(e, Error::Op(OpError::Eps { .. }))
        })?;
        let (sum, _, rstd) = ops::add_rms_norm(&x, &x, &g, EPS)?;
        let dg = Tensor::zeros(dev, &[8])?;
        let r = ops::add_rms_norm_backward(&x, &random(dev, &[3, 9], 5)?, &sum, &g, &rstd, &dg);
        expect_err("dsum shape", r, is_shape)?;
        expect_err("dsum dtype", ops::add_rms_norm_backward(&x, &half, &sum, &g, &rstd, &dg), mismatch)?;
        let r = ops::add_rms_norm_backward(&x, &x, &sum, &g, &random(dev, &[4], 6)?, &dg);
        expect_err("rstd shape", r, is_shape)
    });
}

/// What a backward recomputes instead of saving is the forward's output bit for bit: RMSNorm's
/// `y` from its saved `rstd` (after `rms_norm` and after `add_rms_norm`, rows the 16-byte packs
/// divide and rows they do not, rows too wide for the register kernel), and SwiGLU's `y` from
/// the backward pass over `gate` and `up`, whose grads stay `swiglu_backward`'s; in every dtype,
/// eager and replayed. Bad arguments are typed errors.
#[test]
fn recomputed_outputs_are_the_forward_bits() {
    on_each_backend(|dev| {
        for dtype in [DType::F32, DType::BF16, DType::F16] {
            for (i, &(n, d)) in [(1, 1), (5, 7), (64, 512), (33, 1030), (3, 9000), (2, 20000)].iter().enumerate() {
                let seed = 700 + 10 * i as u64;
                let what = format!("rms_norm_recompute {dtype} {n}x{d}");
                let (x, _) = pair(dev, &[n, d], seed, dtype)?;
                let (r, _) = pair(dev, &[n, d], seed + 1, dtype)?;
                let (g, _) = pair(dev, &[d], seed + 2, dtype)?;
                let (y, rstd) = ops::rms_norm(&x, &g, EPS)?;
                bitwise_eq(&what, &ops::rms_norm_recompute(&x, &g, &rstd)?.to_vec()?, &y.to_vec()?)?;
                let (sum, y2, rstd2) = ops::add_rms_norm(&x, &r, &g, EPS)?;
                let again = ops::rms_norm_recompute(&sum, &g, &rstd2)?;
                bitwise_eq(&format!("{what} after add_rms_norm"), &again.to_vec()?, &y2.to_vec()?)?;
            }
            for (i, &n) in [1usize, 7, 8, 4096 * 3 + 5, 16 * 1368].iter().enumerate() {
                let what = format!("swiglu_backward_recompute {dtype} {n}");
                let seed = 800 + 10 * i as u64;
                let ((gate, _), (up, _), (dy, _)) = (
                    pair(dev, &[n], seed, dtype)?,
                    pair(dev, &[n], seed + 1, dtype)?,
                    pair(dev, &[n], seed + 2, dtype)?,
                );
                let (dg, du, y) = ops::swiglu_backward_recompute(&dy, &gate, &up)?;
                let (dg2, du2) = ops::swiglu_backward(&dy, &gate, &up)?;
                bitwise_eq(&format!("{what} y"), &y.to_vec()?, &ops::swiglu(&gate, &up)?.to_vec()?)?;
                bitwise_eq(&format!("{what} dgate"), &dg.to_vec()?, &dg2.to_vec()?)?;
                bitwise_eq(&format!("{what} dup"), &du.to_vec()?, &du2.to_vec()?)?;
                assert_eq!((y.dtype(), y.dims()), (dtype, &[n][..]));
            }
        }
        let (x, g, dy) = (random(dev, &[6, 40], 1)?, random(dev, &[40], 2)?, random(dev, &[6, 40], 3)?);
        eager_vs_replay(dev, || {
            let (_, rstd) = ops::rms_norm(&x, &g, EPS)?;
            let h = ops::rms_norm_recompute(&x, &g, &rstd)?;
            let (dg, du, y) = ops::swiglu_backward_recompute(&dy, &h, &x)?;
            Ok(vec![h, dg, du, y])
        })?;
        let (_, rstd) = ops::rms_norm(&x, &g, EPS)?;
        expect_err("gamma shape", ops::rms_norm_recompute(&x, &random(dev, &[39], 4)?, &rstd), is_shape)?;
        expect_err("rstd shape", ops::rms_norm_recompute(&x, &g, &random(dev, &[5], 5)?), is_shape)?;
        let half = Tensor::zeros_as(dev, &[6], DType::BF16)?;
        let mismatch = |e: &Error| matches!(e, Error::DTypeMismatch { .. });
        expect_err("rstd dtype", ops::rms_norm_recompute(&x, &g, &half), |e| {
            matches!(e, Error::DType { expected: DType::F32, .. })
        })?;
        expect_err("no row", ops::rms_norm_recompute(&Tensor::zeros(dev, &[3, 0])?, &g, &rstd), is_shape)?;
        expect_err("up shape", ops::swiglu_backward_recompute(&dy, &x, &random(dev, &[6, 41], 6)?), is_shape)?;
        expect_err("dy dtype", ops::swiglu_backward_recompute(&dy.to_dtype(DType::BF16)?, &x, &x), mismatch)
    });
}

/// `swiglu_packed_backward` of `[gate | up]` rows is bitwise `swiglu_backward` of the two
/// halves, packed the same way, and its recomputing form gives `swiglu_packed`'s output bit
/// for bit, in every dtype, for half-widths the 16-byte packs divide and ones they do not,
/// eager and replayed; a `dy` that is not the output's shape, or a bad `gu`, is refused.
#[test]
fn swiglu_packed_backward_is_the_halves_backward_bitwise() {
    on_each_backend(|dev| {
        for dtype in [DType::F32, DType::BF16, DType::F16] {
            for (i, &(rows, h)) in [(1usize, 1368usize), (3, 8), (5, 13), (2, 4), (64, 96)].iter().enumerate() {
                let what = format!("swiglu_packed_backward {dtype} {rows}x{h}");
                let seed = 900 + 10 * i as u64;
                let gu: Vec<f32> = random_vec(rows * 2 * h, seed).into_iter().map(|v| dtype.round(4.0 * v)).collect();
                let dyv: Vec<f32> = random_vec(rows * h, seed + 1).into_iter().map(|v| dtype.round(v)).collect();
                let (gate, up): (Vec<f32>, Vec<f32>) =
                    gu.chunks(2 * h).flat_map(|r| r[..h].iter().zip(&r[h..])).unzip();
                let t = |v: &[f32], w: usize| Tensor::from_slice_as(dev, v, &[rows, w], dtype);
                let (packed, dy) = (t(&gu, 2 * h)?, t(&dyv, h)?);
                let dgu = ops::swiglu_packed_backward(&dy, &packed)?;
                assert_eq!((dgu.dtype(), dgu.dims()), (dtype, &[rows, 2 * h][..]));
                let (dg, du) = ops::swiglu_backward(&dy, &t(&gate, h)?, &t(&up, h)?)?;
                let (dg, du) = (dg.to_vec()?, du.to_vec()?);
                let want: Vec<f32> =
                    dg.chunks(h).zip(du.chunks(h)).flat_map(|(a, b)| a.iter().chain(b).copied()).collect();
                bitwise_eq(&what, &dgu.to_vec()?, &want)?;
                let (dgu2, y) = ops::swiglu_packed_backward_recompute(&dy, &packed)?;
                bitwise_eq(&format!("{what} recomputing"), &dgu2.to_vec()?, &want)?;
                bitwise_eq(&format!("{what} y"), &y.to_vec()?, &ops::swiglu_packed(&packed)?.to_vec()?)?;
            }
            let packed = Tensor::from_slice_as(dev, &random_vec(2 * 3 * 32, 5), &[2, 3, 32], dtype)?;
            let dy = Tensor::from_slice_as(dev, &random_vec(2 * 3 * 16, 6), &[2, 3, 16], dtype)?;
            eager_vs_replay(dev, || {
                let (dgu, y) = ops::swiglu_packed_backward_recompute(&dy, &packed)?;
                Ok(vec![ops::swiglu_packed_backward(&dy, &packed)?, dgu, y])
            })?;
        }
        let gu = Tensor::zeros(dev, &[2, 8])?;
        expect_err("dy width", ops::swiglu_packed_backward(&Tensor::zeros(dev, &[2, 8])?, &gu), is_shape)?;
        expect_err("dy rows", ops::swiglu_packed_backward(&Tensor::zeros(dev, &[3, 4])?, &gu), is_shape)?;
        let odd = Tensor::zeros(dev, &[2, 7])?;
        expect_err("odd width", ops::swiglu_packed_backward(&Tensor::zeros(dev, &[2, 3])?, &odd), is_shape)?;
        let half = Tensor::zeros_as(dev, &[2, 4], DType::BF16)?;
        let mismatch = |e: &Error| matches!(e, Error::DTypeMismatch { .. });
        expect_err("dy dtype", ops::swiglu_packed_backward_recompute(&half, &gu), mismatch)
    });
}
