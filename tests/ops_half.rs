//! bf16 and f16 (#12): storage and rounding, casts, elementwise ops bit for bit against the CPU
//! reference (f32 math, round to nearest even on store), f32 reductions, GEMMs with f32
//! accumulation and f32 weight grads, graphed == eager bitwise, dtype errors. Host always;
//! CUDA when a GPU is usable.

mod common;
mod ops_support;

use common::{on_each_backend, random_vec, rel_err};
use graphed::half::{bf16, f16};
use graphed::ops::{self, cpu, Gelu};
use graphed::{DType, Device, Error, Generator, Result, Tensor};
use ops_support::*;

const HALVES: [DType; 2] = [DType::BF16, DType::F16];

/// Relative error allowed against the reference where the math differs in the last f32 bit
/// (transcendentals, GEMM summation order): one rounding step of the dtype.
fn tol(dtype: DType) -> f64 {
    match dtype {
        DType::BF16 => 1e-2,
        _ => 1e-3,
    }
}

fn rounded(dtype: DType, v: &[f32]) -> Vec<f32> {
    v.iter().map(|x| dtype.round(*x)).collect()
}

/// A tensor of `dtype` with random values (already representable, so the f32 inputs of the
/// reference are exactly the tensor's).
fn rand_as(dev: &Device, dims: &[usize], seed: u64, dtype: DType) -> Result<Tensor> {
    Tensor::from_slice_as(dev, &random_vec(dims.iter().product(), seed), dims, dtype)
}

fn close(what: &str, got: &[f32], want: &[f32], tol: f64) -> Result<()> {
    let e = rel_err(got, want);
    if e.is_nan() || e >= tol {
        return Err(Error::msg(format!("{what}: relative error {e:e} (tolerance {tol:e})")));
    }
    Ok(())
}

#[test]
fn storage_rounds_to_nearest_even_like_the_half_crate() {
    on_each_backend(|dev| {
        let v: Vec<f32> =
            random_vec(1001, 3).into_iter().map(|x| x * 1000.0).chain([1.0 + 1.0 / 256.0, 65520.0, 1e-9]).collect();
        let n = v.len();
        let b = Tensor::from_slice_as(dev, &v, &[n], DType::BF16)?;
        let want: Vec<bf16> = v.iter().map(|x| bf16::from_f32(*x)).collect();
        assert_eq!(b.to_bf16_vec()?, want);
        assert_eq!(b.to_vec()?, want.iter().map(|x| x.to_f32()).collect::<Vec<_>>());
        let h = Tensor::from_slice_as(dev, &v, &[n], DType::F16)?;
        let want: Vec<f16> = v.iter().map(|x| f16::from_f32(*x)).collect();
        assert_eq!(h.to_f16_vec()?, want);
        assert_eq!(h.to_vec()?[n - 2], f32::INFINITY, "65520 overflows f16 (ties to even: 65536)");
        // Exact round trips through the raw constructors, and odd lengths next to each other in
        // one slab keep their neighbours intact.
        let raw: Vec<bf16> = (0..7).map(|i| bf16::from_f32(i as f32 - 3.5)).collect();
        let (t1, t2) = (Tensor::from_bf16(dev, &raw, &[7])?, Tensor::from_bf16(dev, &raw[..3], &[3])?);
        assert_eq!((t1.to_bf16_vec()?, t2.to_bf16_vec()?), (raw.clone(), raw[..3].to_vec()));
        expect_err("to_bf16_vec on f16", h.to_bf16_vec(), |e| matches!(e, Error::DType { .. }))?;
        assert_eq!(Tensor::full_as(dev, &[5], 0.1, DType::BF16)?.to_vec()?, vec![DType::BF16.round(0.1); 5]);
        Ok(())
    });
}

/// The kernels' rounding to bf16 (a cast on the device; every 16-bit store goes through it)
/// gives the `half` crate's bits at the edges: ties to even both ways, the largest finite values
/// and the overflow past them, subnormals (kept, not flushed), signed zeros, infinities, and NaNs
/// (quiet, sign and high payload kept).
#[test]
fn bf16_rounding_on_the_device_matches_the_half_crate_at_the_edges() {
    on_each_backend(|dev| {
        let bits: [u32; 22] = [
            0x0000_0000,
            0x8000_0000, // +0, -0
            0x3f80_8000,
            0x3f81_8000,
            0xbf80_8000, // ties: to even (down), to even (up), negative
            0x3f80_8001,
            0x3f80_7fff, // just above and below a tie
            0x7f7f_ffff,
            0x7f7f_7fff,
            0x7f7f_8000,
            0xff7f_ffff, // largest finite: overflow, not, tie, negative
            0x0000_0001,
            0x0000_8000,
            0x0000_c000,
            0x807f_ffff,
            0x0080_0000,
            0x007f_8000, // subnormals, smallest normal
            0x7f80_0000,
            0xff80_0000, // infinities
            0x7fc1_2345,
            0xffa0_0001,
            0x7f80_0001, // NaNs: quiet with payload, negative signalling, smallest signalling
        ];
        let v: Vec<f32> = bits.iter().map(|b| f32::from_bits(*b)).collect();
        let x = Tensor::from_slice(dev, &v, &[v.len()])?;
        let got = ops::cast(&x, DType::BF16)?.to_bf16_vec()?;
        for ((g, b), x) in got.iter().zip(bits).zip(&v) {
            let want = bf16::from_f32(*x);
            assert_eq!(
                g.to_bits(),
                want.to_bits(),
                "{b:#010x} on {}: {:#06x} vs {:#06x}",
                dev.name(),
                g.to_bits(),
                want.to_bits()
            );
        }
        Ok(())
    });
}

#[test]
fn fresh_host_memory_is_nan_in_every_dtype() -> Result<()> {
    let dev = Device::host();
    for dtype in [DType::F32, DType::BF16, DType::F16] {
        let t = Tensor::empty_as(&dev, &[5], dtype)?;
        assert!(t.to_vec()?.iter().all(|v| v.is_nan()), "{dtype}");
    }
    Ok(())
}

#[test]
fn casts_round_and_widen_exactly() {
    on_each_backend(|dev| {
        let v: Vec<f32> = random_vec(777, 9).into_iter().map(|x| x * 300.0).collect();
        let x = Tensor::from_slice(dev, &v, &[777])?;
        for to in HALVES {
            let y = ops::cast(&x, to)?;
            assert_eq!(y.dtype(), to);
            bitwise_eq(&format!("f32 -> {to}"), &y.to_vec()?, &rounded(to, &v))?;
            bitwise_eq(&format!("{to} -> f32"), &ops::cast(&y, DType::F32)?.to_vec()?, &rounded(to, &v))?;
            let other = if to == DType::BF16 { DType::F16 } else { DType::BF16 };
            let z = ops::cast(&y, other)?;
            bitwise_eq(&format!("{to} -> {other}"), &z.to_vec()?, &rounded(other, &rounded(to, &v)))?;
            eager_vs_replay(dev, || Ok(vec![ops::cast(&x, to)?, ops::cast(&y, DType::F32)?, y.to_dtype(other)?]))?;
        }
        Ok(())
    });
}

#[test]
fn elementwise_ops_agree_bit_for_bit() {
    on_each_backend(|dev| {
        for dtype in HALVES {
            for (i, dims) in [&[1usize][..], &[257], &[33, 65]].iter().enumerate() {
                let s = 10 * i as u64;
                let (a, b) = (rand_as(dev, dims, s, dtype)?, rand_as(dev, dims, s + 1, dtype)?);
                let (av, bv) = (a.to_vec()?, b.to_vec()?);
                let r = |v: Vec<f32>| rounded(dtype, &v);
                let what = |op: &str| format!("{op} {dtype} {dims:?}");
                bitwise_eq(&what("add"), &ops::add(&a, &b)?.to_vec()?, &r(cpu::add(&av, &bv)))?;
                bitwise_eq(&what("mul"), &ops::mul(&a, &b)?.to_vec()?, &r(cpu::mul(&av, &bv)))?;
                bitwise_eq(&what("scale"), &ops::scale(&a, -1.7)?.to_vec()?, &r(cpu::scale(&av, -1.7)))?;
                bitwise_eq(&what("relu"), &ops::relu(&a)?.to_vec()?, &r(cpu::relu(&av)))?;
                bitwise_eq(
                    &what("relu_bwd"),
                    &ops::relu_backward(&b, &a)?.to_vec()?,
                    &r(cpu::relu_backward(&bv, &av)),
                )?;
                let d = *dims.last().unwrap();
                let bias = rand_as(dev, &[d], s + 2, dtype)?;
                let want = r(cpu::bias_add(&av, &bias.to_vec()?, d));
                bitwise_eq(&what("bias_add"), &ops::bias_add(&a, &bias)?.to_vec()?, &want)?;
                let y = a.deep_clone()?;
                ops::axpy_(&y, 0.3, &b)?;
                let want: Vec<f32> = av.iter().zip(&bv).map(|(y, x)| dtype.round(0.3f32.mul_add(*x, *y))).collect();
                bitwise_eq(&what("axpy_"), &y.to_vec()?, &want)?;
                ops::scale_(&y, 2.5)?;
                bitwise_eq(&what("scale_"), &y.to_vec()?, &r(cpu::scale(&want, 2.5)))?;
                let want = r(cpu::mse_backward(&av, &bv, 0.5));
                bitwise_eq(&what("mse_backward"), &ops::mse_backward(&a, &b, 0.5)?.to_vec()?, &want)?;
                for g in [Gelu::Erf, Gelu::Tanh] {
                    // Bitwise on the host; on CUDA erff/tanhf/expf may differ from the reference in
                    // the last f32 bit, which can move a rounding: one step of the dtype.
                    let got = ops::gelu(&a, g)?.to_vec()?;
                    check_ref(dev, &what("gelu"), &got, &r(cpu::gelu(&av, g)), tol(dtype))?;
                    let got = ops::gelu_backward(&b, &a, g)?.to_vec()?;
                    check_ref(dev, &what("gelu_bwd"), &got, &r(cpu::gelu_backward(&bv, &av, g)), tol(dtype))?;
                }
            }
        }
        Ok(())
    });
}

/// `v`'s place in the dtype's order of values (±0 both 0), for counting rounding steps.
fn order(dtype: DType, v: f32) -> i64 {
    let bits = match dtype {
        DType::BF16 => bf16::from_f32(v).to_bits(),
        _ => f16::from_f32(v).to_bits(),
    };
    let mag = (bits & 0x7fff) as i64;
    if bits & 0x8000 != 0 {
        -mag
    } else {
        mag
    }
}

/// Every finite bf16 and f16 value, both infinities and a NaN: GELU (both forms) and its backward
/// on 16-bit storage, against the f64 reference rounded to the dtype. On CUDA these kernels take
/// SFU forms (about half erff's instructions; their f32 error is a few units in the last place):
/// every value within one rounding step of the reference, at most 1% of them a step away, and
/// the same NaNs and infinities. That includes the negative tail, where 0.5 x (1 + erf(x / √2))
/// in f32 cancels to nothing long before bf16 underflows (down to 2^-120). Bitwise on the host.
#[test]
fn gelu_in_half_precision_is_within_one_rounding_step_everywhere() {
    const TINY: f32 = 7.5e-37;
    on_each_backend(|dev| {
        for dtype in HALVES {
            let mut xs: Vec<f32> = (0..=u16::MAX)
                .map(|b| match dtype {
                    DType::BF16 => bf16::from_bits(b).to_f32(),
                    _ => f16::from_bits(b).to_f32(),
                })
                .filter(|v| v.is_finite())
                .collect();
            xs.extend([f32::INFINITY, f32::NEG_INFINITY, f32::NAN]);
            let n = xs.len();
            let x = Tensor::from_slice_as(dev, &xs, &[n], dtype)?;
            let ones = Tensor::from_slice_as(dev, &vec![1.0; n], &[n], dtype)?;
            for g in [Gelu::Erf, Gelu::Tanh] {
                let cases = [
                    ("gelu", ops::gelu(&x, g)?.to_vec()?, rounded(dtype, &cpu::gelu(&xs, g))),
                    (
                        "gelu_backward",
                        ops::gelu_backward(&ones, &x, g)?.to_vec()?,
                        rounded(dtype, &cpu::gelu_backward(&vec![1.0; n], &xs, g)),
                    ),
                ];
                for (op, got, want) in cases {
                    let what = format!("{op} {g:?} {dtype} on {}", dev.name());
                    if dev.is_host() {
                        bitwise_eq(&what, &got, &want)?;
                        continue;
                    }
                    let mut off = 0usize;
                    for ((x, got), want) in xs.iter().zip(&got).zip(&want) {
                        if got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()) {
                            continue;
                        }
                        // Below 2^-120 the SFU's flush to zero shows (x / (1 + 2^128) is 0 on the
                        // device): values under 1e-36, where f32 math cancelled to 0 long before.
                        if got.abs().max(want.abs()) < TINY {
                            continue;
                        }
                        let steps = (order(dtype, *got) - order(dtype, *want)).abs();
                        if steps > 1 || got.is_nan() || want.is_nan() || got.is_infinite() != want.is_infinite() {
                            return Err(Error::msg(format!("{what}: at x = {x:e}, {got:e} against {want:e}")));
                        }
                        off += steps as usize;
                    }
                    if off * 100 > n {
                        return Err(Error::msg(format!("{what}: {off} of {n} values a step away (at most 1%)")));
                    }
                    println!("{what}: {off} of {n} values a rounding step from the reference, none further");
                }
            }
        }
        Ok(())
    });
}

#[test]
fn dropout_in_half_precision_matches_the_reference_mask() {
    on_each_backend(|dev| {
        for dtype in HALVES {
            let rng = Generator::new(dev, 11)?;
            let x = rand_as(dev, &[4099], 5, dtype)?;
            let saved = rng.save()?;
            let (y, mask) = ops::dropout(&x, 0.1, &rng, true)?;
            let mask = mask.expect("a mask in training");
            assert_eq!((y.dtype(), mask.dtype()), (dtype, dtype));
            let m = cpu::dropout_mask(11, 0, 4099, 0.1);
            bitwise_eq("dropout y", &y.to_vec()?, &rounded(dtype, &cpu::mul(&x.to_vec()?, &m)))?;
            bitwise_eq("dropout mask", &mask.to_vec()?, &rounded(dtype, &m))?;
            rng.restore(&saved)?;
            let dy = rand_as(dev, &[4099], 6, dtype)?;
            let dx = ops::dropout_backward(&dy, &mask)?;
            bitwise_eq("dropout_backward", &dx.to_vec()?, &rounded(dtype, &cpu::mul(&dy.to_vec()?, &mask.to_vec()?)))?;
            eager_vs_replay(dev, || {
                rng.restore(&saved)?;
                let (y, m) = ops::dropout(&x, 0.1, &rng, true)?;
                Ok(vec![y, m.expect("mask")])
            })?;
        }
        Ok(())
    });
}

#[test]
fn reductions_accumulate_in_f32() {
    on_each_backend(|dev| {
        for dtype in HALVES {
            let (a, b) = (rand_as(dev, &[3, 1001], 1, dtype)?, rand_as(dev, &[3, 1001], 2, dtype)?);
            let (av, bv) = (a.to_vec()?, b.to_vec()?);
            let (s, m, l) = (ops::sum(&a)?, ops::mean(&a)?, ops::mse_loss(&a, &b)?);
            assert_eq!((s.dtype(), m.dtype(), l.dtype()), (DType::F32, DType::F32, DType::F32));
            let abs: f64 = av.iter().map(|v| v.abs() as f64).sum();
            let s = s.to_vec()?[0] as f64;
            assert!((s - cpu::sum(&av) as f64).abs() <= TOL * abs, "sum {dtype}: {s}");
            let m = m.to_vec()?[0] as f64;
            assert!((m - cpu::mean(&av) as f64).abs() <= TOL * abs / av.len() as f64, "mean {dtype}: {m}");
            check_ref(dev, "mse_loss", &l.to_vec()?, &[cpu::mse_loss(&av, &bv)], TOL)?;
            eager_vs_replay(dev, || Ok(vec![ops::sum(&a)?, ops::mean(&b)?, ops::mse_loss(&a, &b)?]))?;
        }
        Ok(())
    });
}

/// The CPU reference of a 16-bit linear: f32 math, the GEMM's output rounded, then the bias
/// added and rounded again (the two stores of the CUDA path).
fn linear_ref(dtype: DType, x: &[f32], w: &[f32], b: &[f32], (n, k, m): (usize, usize, usize)) -> Vec<f32> {
    let y = rounded(dtype, &cpu::linear(x, w, None, n, k, m));
    rounded(dtype, &cpu::bias_add(&y, b, m))
}

#[test]
fn linear_in_half_precision_accumulates_in_f32() {
    on_each_backend(|dev| {
        for dtype in HALVES {
            for (i, &(n, k, m)) in [(3usize, 5usize, 7usize), (64, 257, 129), (128, 512, 256)].iter().enumerate() {
                let s = 20 * i as u64;
                let (x, w, b) = (
                    rand_as(dev, &[n, k], s, dtype)?,
                    rand_as(dev, &[m, k], s + 1, dtype)?,
                    rand_as(dev, &[m], s + 2, dtype)?,
                );
                let (xv, wv, bv) = (x.to_vec()?, w.to_vec()?, b.to_vec()?);
                let y = ops::linear(&x, &w, Some(&b))?;
                assert_eq!(y.dtype(), dtype);
                // check_ref is bitwise on the host backend (it runs the reference).
                let t = tol(dtype);
                check_ref(
                    dev,
                    &format!("linear {dtype} {n}x{k}x{m}"),
                    &y.to_vec()?,
                    &linear_ref(dtype, &xv, &wv, &bv, (n, k, m)),
                    t,
                )?;

                let dy = rand_as(dev, &[n, m], s + 3, dtype)?;
                let (dw, db) = (Tensor::full(dev, &[m, k], 0.5)?, Tensor::full(dev, &[m], -0.25)?);
                let dx = ops::linear_backward(&dy, &x, &w, &dw, Some(&db), true)?.expect("dx");
                assert_eq!((dx.dtype(), dw.dtype()), (dtype, DType::F32));
                let (mut dwr, mut dbr) = (vec![0.5; m * k], vec![-0.25; m]);
                let dxr =
                    cpu::linear_backward(&dy.to_vec()?, &xv, &wv, n, k, m, &mut dwr, Some(&mut dbr), true).expect("dx");
                // Products of 16-bit values are exact in f32: dw and db differ from the
                // reference only by f32 summation order.
                check_ref(dev, "dw (f32)", &dw.to_vec()?, &dwr, TOL_GEMM)?;
                check_ref(dev, "db (f32)", &db.to_vec()?, &dbr, TOL_GEMM)?;
                check_ref(dev, "dx", &dx.to_vec()?, &rounded(dtype, &dxr), t)?;
            }
        }
        Ok(())
    });
}

#[test]
fn half_precision_linear_replays_bitwise() {
    on_each_backend(|dev| {
        for dtype in HALVES {
            let (x, w, b) = (
                rand_as(dev, &[64, 96], 1, dtype)?,
                rand_as(dev, &[80, 96], 2, dtype)?,
                rand_as(dev, &[80], 3, dtype)?,
            );
            let dy = rand_as(dev, &[64, 80], 4, dtype)?;
            eager_vs_replay(dev, || {
                let h = ops::linear(&x, &w, Some(&b))?;
                let y = ops::gelu(&h, Gelu::Tanh)?;
                let dh = ops::gelu_backward(&dy, &h, Gelu::Tanh)?;
                let (dw, db) = (Tensor::zeros(dev, &[80, 96])?, Tensor::zeros(dev, &[80])?);
                let dx = ops::linear_backward(&dh, &x, &w, &dw, Some(&db), true)?.expect("dx");
                Ok(vec![y, dx, dw, db])
            })?;
        }
        Ok(())
    });
}

/// `linear_residual`: the residual plus the product, rounded once (f32, bf16 and f16; the
/// host reference bit for bit on the host, within the dtype's GEMM tolerance on CUDA, where
/// cublasLt reads the residual as its C), never farther from the exact sum than a linear and an
/// add; leading dimensions flattened; replays bitwise; bad input refused before anything runs.
#[test]
fn linear_residual_rounds_the_sum_once() {
    on_each_backend(|dev| {
        for dtype in [DType::F32, DType::BF16, DType::F16] {
            for (i, &(n, k, m)) in
                [(1usize, 1usize, 1usize), (3, 5, 7), (64, 257, 129), (128, 512, 256)].iter().enumerate()
            {
                let s = 30 + 20 * i as u64;
                let (x, w, r) = (
                    rand_as(dev, &[n, k], s, dtype)?,
                    rand_as(dev, &[m, k], s + 1, dtype)?,
                    rand_as(dev, &[n, m], s + 2, dtype)?,
                );
                let (xv, wv, rv) = (x.to_vec()?, w.to_vec()?, r.to_vec()?);
                let y = ops::linear_residual(&x, &w, &r)?;
                assert_eq!((y.dims(), y.dtype()), (&[n, m][..], dtype));
                let exact: Vec<f32> =
                    cpu::linear(&xv, &wv, None, n, k, m).iter().zip(&rv).map(|(p, r)| p + r).collect();
                let what = format!("linear_residual {dtype} {n}x{k}x{m}");
                let t = if dtype == DType::F32 { TOL_GEMM } else { tol(dtype) };
                check_ref(dev, &what, &y.to_vec()?, &rounded(dtype, &exact), t)?;
                if dev.is_host() && dtype != DType::F32 {
                    // One rounding is never farther from the exact sum than two.
                    let twice = ops::add(&ops::linear(&x, &w, None)?, &r)?.to_vec()?;
                    let err = |v: &[f32]| v.iter().zip(&exact).map(|(a, b)| f64::from((a - b).abs())).sum::<f64>();
                    assert!(err(&y.to_vec()?) <= err(&twice), "{what}: one rounding is farther than two");
                }
            }
            // Leading dimensions, and replay against eager.
            let (x, w, r) = (
                rand_as(dev, &[2, 3, 40], 7, dtype)?,
                rand_as(dev, &[24, 40], 8, dtype)?,
                rand_as(dev, &[2, 3, 24], 9, dtype)?,
            );
            let flat = ops::linear_residual(&x.reshape(&[6, 40])?, &w, &r.reshape(&[6, 24])?)?;
            let y = ops::linear_residual(&x, &w, &r)?;
            assert_eq!(y.dims(), &[2, 3, 24]);
            bitwise_eq("linear_residual [2, 3, 40]", &y.to_vec()?, &flat.to_vec()?)?;
            eager_vs_replay(dev, || Ok(vec![ops::linear_residual(&x, &w, &r)?]))?;
        }
        // Refusals, each before anything runs.
        let (x, w, r) = (
            rand_as(dev, &[4, 3], 1, DType::BF16)?,
            rand_as(dev, &[5, 3], 2, DType::BF16)?,
            rand_as(dev, &[4, 5], 3, DType::BF16)?,
        );
        expect_err(
            "residual of another shape",
            ops::linear_residual(&x, &w, &rand_as(dev, &[5, 4], 4, DType::BF16)?),
            is_shape,
        )?;
        expect_err(
            "w that does not fit x",
            ops::linear_residual(&x, &rand_as(dev, &[5, 4], 5, DType::BF16)?, &r),
            is_shape,
        )?;
        expect_err("residual of another dtype", ops::linear_residual(&x, &w, &r.to_dtype(DType::F32)?), |e| {
            matches!(e, Error::DTypeMismatch { op: "linear_residual", .. })
        })?;
        let other = Device::host();
        let r2 = Tensor::zeros_as(&other, &[4, 5], DType::BF16)?;
        expect_err("residual on another device", ops::linear_residual(&x, &w, &r2), |e| {
            matches!(e, Error::DeviceMismatch { .. })
        })?;
        Ok(())
    });
}

#[test]
fn tf32_is_opt_in_and_close_to_f32() {
    on_each_backend(|dev| {
        let (x, w) = (common::random(dev, &[64, 256], 1)?, common::random(dev, &[128, 256], 2)?);
        let exact = cpu::linear(&x.to_vec()?, &w.to_vec()?, None, 64, 256, 128);
        assert!(!dev.tf32(), "TF32 is off by default");
        check_ref(dev, "f32 linear", &ops::linear(&x, &w, None)?.to_vec()?, &exact, TOL_GEMM)?;
        dev.set_tf32(true);
        let got = ops::linear(&x, &w, None)?.to_vec()?;
        // TF32 keeps 10 significand bits: about 1e-3 relative on these sums of 256 products.
        close("tf32 linear", &got, &exact, 5e-3)?;
        eager_vs_replay(dev, || Ok(vec![ops::linear(&x, &w, None)?]))?;
        dev.set_tf32(false);
        Ok(())
    });
}

#[test]
fn mixing_dtypes_without_a_cast_is_a_typed_error() {
    on_each_backend(|dev| {
        let a = rand_as(dev, &[4, 8], 1, DType::BF16)?;
        let f = common::random(dev, &[4, 8], 2)?;
        let h = rand_as(dev, &[4, 8], 3, DType::F16)?;
        let mismatch = |e: &Error| matches!(e, Error::DTypeMismatch { op: "add", a: DType::BF16, b: DType::F32 });
        expect_err("bf16 + f32", ops::add(&a, &f), mismatch)?;
        expect_err("bf16 * f16", ops::mul(&a, &h), |e| matches!(e, Error::DTypeMismatch { .. }))?;
        let w = rand_as(dev, &[3, 8], 4, DType::BF16)?;
        expect_err("linear bf16 x f32 w", ops::linear(&f, &w, None), |e| {
            matches!(e, Error::DTypeMismatch { op: "linear", .. })
        })?;
        let dy = rand_as(dev, &[4, 3], 5, DType::BF16)?;
        let dw16 = Tensor::zeros_as(dev, &[3, 8], DType::BF16)?;
        let r = ops::linear_backward(&dy, &a, &w, &dw16, None, true);
        expect_err("bf16 weight grad", r, |e| matches!(e, Error::DType { expected: DType::F32, .. }))?;
        let (g, b) = (rand_as(dev, &[8], 6, DType::BF16)?, rand_as(dev, &[8], 7, DType::BF16)?);
        let (_, mean, rstd) = ops::layer_norm(&a, &g, &b, 1e-5)?;
        let dg16 = Tensor::zeros_as(dev, &[8], DType::BF16)?;
        let r = ops::layer_norm_backward(&a, &a, &g, &mean, &rstd, &dg16, &dg16);
        expect_err("bf16 dgamma", r, |e| matches!(e, Error::DType { expected: DType::F32, .. }))?;
        let g32 = common::random(dev, &[8], 8)?;
        let r = ops::layer_norm(&a, &g32, &b, 1e-5);
        expect_err("layer_norm bf16 x, f32 gamma", r, |e| matches!(e, Error::DTypeMismatch { op: "layer_norm", .. }))?;
        let labels = Tensor::from_slice_as(dev, &[0.0, 1.0, 2.0, 3.0], &[4], DType::BF16)?;
        let r = ops::softmax_cross_entropy(&a, &labels);
        expect_err("bf16 labels", r, |e| matches!(e, Error::DType { expected: DType::F32, .. }))?;
        let rng = Generator::new(dev, 1)?;
        expect_err("uniform_ into bf16", rng.uniform_(&a), |e| matches!(e, Error::DType { .. }))?;
        // Nothing was queued: the inputs are unchanged and the ops still work.
        assert_eq!(ops::add(&a, &a)?.to_vec()?, rounded(DType::BF16, &cpu::add(&a.to_vec()?, &a.to_vec()?)));
        Ok(())
    });
}

#[test]
fn layer_norm_and_softmax_in_half_precision_keep_f32_statistics() {
    on_each_backend(|dev| {
        for dtype in HALVES {
            let (rows, d) = (37, 300);
            let (x, g, b) =
                (rand_as(dev, &[rows, d], 1, dtype)?, rand_as(dev, &[d], 2, dtype)?, rand_as(dev, &[d], 3, dtype)?);
            let (xv, gv, bv) = (x.to_vec()?, g.to_vec()?, b.to_vec()?);
            let (y, mean, rstd) = ops::layer_norm(&x, &g, &b, 1e-5)?;
            assert_eq!((y.dtype(), mean.dtype(), rstd.dtype()), (dtype, DType::F32, DType::F32));
            let (yr, mr, rr) = cpu::layer_norm(&xv, &gv, &bv, d, 1e-5);
            check_ref(dev, "layer_norm y", &y.to_vec()?, &rounded(dtype, &yr), tol(dtype))?;
            check_ref(dev, "layer_norm mean", &mean.to_vec()?, &mr, TOL)?;
            check_ref(dev, "layer_norm rstd", &rstd.to_vec()?, &rr, TOL)?;
            let dy = rand_as(dev, &[rows, d], 4, dtype)?;
            let (dg, db) = (Tensor::zeros(dev, &[d])?, Tensor::zeros(dev, &[d])?);
            let dx = ops::layer_norm_backward(&dy, &x, &g, &mean, &rstd, &dg, &db)?;
            let (mut dgr, mut dbr) = (vec![0.0; d], vec![0.0; d]);
            let dxr = cpu::layer_norm_backward(
                &dy.to_vec()?,
                &xv,
                &gv,
                &mean.to_vec()?,
                &rstd.to_vec()?,
                d,
                &mut dgr,
                &mut dbr,
            );
            check_ref(dev, "layer_norm dx", &dx.to_vec()?, &rounded(dtype, &dxr), tol(dtype))?;
            check_ref(dev, "layer_norm dgamma (f32)", &dg.to_vec()?, &dgr, 1e-4)?;
            check_ref(dev, "layer_norm dbeta (f32)", &db.to_vec()?, &dbr, 1e-4)?;

            let classes = 10;
            let logits = Tensor::from_slice_as(
                dev,
                &random_vec(rows * classes, 5).iter().map(|v| v * 4.0).collect::<Vec<_>>(),
                &[rows, classes],
                dtype,
            )?;
            let labels =
                Tensor::from_slice(dev, &(0..rows).map(|r| (r % classes) as f32).collect::<Vec<_>>(), &[rows])?;
            let (loss, probs) = ops::softmax_cross_entropy(&logits, &labels)?;
            assert_eq!((loss.dtype(), probs.dtype()), (DType::F32, dtype));
            let (lr, pr) = cpu::softmax_cross_entropy(&logits.to_vec()?, &labels.to_vec()?, classes)?;
            check_ref(dev, "xent loss", &loss.to_vec()?, &[lr], TOL)?;
            check_ref(dev, "xent probs", &probs.to_vec()?, &rounded(dtype, &pr), tol(dtype))?;
            let dl = ops::softmax_cross_entropy_backward(&probs, &labels, 1.0)?;
            let dr = cpu::softmax_cross_entropy_backward(&probs.to_vec()?, &labels.to_vec()?, classes, 1.0)?;
            check_ref(dev, "xent dlogits", &dl.to_vec()?, &rounded(dtype, &dr), tol(dtype))?;
            eager_vs_replay(dev, || {
                let (y, m, r) = ops::layer_norm(&x, &g, &b, 1e-5)?;
                let (l, p) = ops::softmax_cross_entropy(&logits, &labels)?;
                Ok(vec![y, m, r, l, p])
            })?;
        }
        Ok(())
    });
}

#[test]
fn linear_to_f32_keeps_the_accumulator() {
    on_each_backend(|dev| {
        for dtype in HALVES {
            let (n, k, m) = (16, 96, 24);
            let (x, w) = (rand_as(dev, &[n, k], 1, dtype)?, rand_as(dev, &[m, k], 2, dtype)?);
            let b = common::random(dev, &[m], 3)?;
            let y = ops::linear_to(&x, &w, Some(&b), DType::F32)?;
            assert_eq!(y.dtype(), DType::F32);
            let want = cpu::linear(&x.to_vec()?, &w.to_vec()?, Some(&b.to_vec()?), n, k, m);
            check_ref(dev, &format!("linear_to f32 from {dtype}"), &y.to_vec()?, &want, TOL_GEMM)?;
            let same = ops::linear_to(&x, &w, None, dtype)?;
            bitwise_eq("linear_to its own dtype", &same.to_vec()?, &ops::linear(&x, &w, None)?.to_vec()?)?;
            let other = if dtype == DType::BF16 { DType::F16 } else { DType::BF16 };
            let r = ops::linear_to(&x, &w, None, other);
            expect_err("16-bit to the other 16-bit", r, |e| matches!(e, Error::DTypeMismatch { op: "linear_to", .. }))?;
            let b16 = b.to_dtype(dtype)?;
            let r = ops::linear_to(&x, &w, Some(&b16), DType::F32);
            expect_err("bias not in the output dtype", r, |e| matches!(e, Error::DTypeMismatch { .. }))?;
            eager_vs_replay(dev, || Ok(vec![ops::linear_to(&x, &w, Some(&b), DType::F32)?]))?;
        }
        Ok(())
    });
}
