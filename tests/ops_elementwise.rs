//! add, mul, scale, sum and mean: CPU reference, deterministic reductions, graph replay, errors.

mod common;
mod ops_support;

use common::{on_each_backend, random};
use graphed::ops::{self, cpu};
use graphed::{Device, Error, Tensor};
use ops_support::*;

const SHAPES: &[&[usize]] = &[&[1], &[7], &[255], &[257], &[3, 333], &[1000, 1001], &[2, 3, 4, 5]];

#[test]
fn add_mul_scale_match_reference() {
    on_each_backend(|dev| {
        for (i, dims) in SHAPES.iter().enumerate() {
            let (a, b) = (random(dev, dims, 2 * i as u64)?, random(dev, dims, 2 * i as u64 + 1)?);
            let (av, bv) = (a.to_vec()?, b.to_vec()?);
            let add = ops::add(&a, &b)?;
            assert_eq!(add.dims(), *dims);
            check_ref(dev, &format!("add {dims:?}"), &add.to_vec()?, &cpu::add(&av, &bv), TOL)?;
            check_ref(dev, &format!("mul {dims:?}"), &ops::mul(&a, &b)?.to_vec()?, &cpu::mul(&av, &bv), TOL)?;
            let s = ops::scale(&a, -1.5)?;
            check_ref(dev, &format!("scale {dims:?}"), &s.to_vec()?, &cpu::scale(&av, -1.5), TOL)?;
            assert_eq!(a.to_vec()?, av, "scale is out of place");
        }
        Ok(())
    });
}

#[test]
fn sum_and_mean_match_reference() {
    on_each_backend(|dev| {
        for (i, dims) in SHAPES.iter().chain([&[(1usize << 20) + 3][..], &[3000, 2049]].iter()).enumerate() {
            let x = random(dev, dims, 50 + i as u64)?;
            let xv = x.to_vec()?;
            // The sum of random signs is small: compare with a tolerance relative to Σ|x|.
            let (s, m) = (ops::sum(&x)?.to_vec()?[0], ops::mean(&x)?.to_vec()?[0]);
            let abs: f64 = xv.iter().map(|v| v.abs() as f64).sum();
            if dev.is_host() {
                assert_eq!(s.to_bits(), cpu::sum(&xv).to_bits());
                assert_eq!(m.to_bits(), cpu::mean(&xv).to_bits());
            } else {
                let (rs, rm) = (cpu::sum(&xv) as f64, cpu::mean(&xv) as f64);
                assert!((s as f64 - rs).abs() <= TOL * abs.max(1.0), "sum {dims:?}: {s} vs {rs}");
                assert!((m as f64 - rm).abs() <= TOL * (abs / xv.len() as f64).max(1e-3), "mean {dims:?}: {m} vs {rm}");
            }
        }
        // Exact small cases.
        let x = Tensor::from_slice(dev, &[1.0, 2.0, 3.0, 4.0, 5.0], &[5])?;
        assert_eq!(ops::sum(&x)?.to_vec()?, vec![15.0]);
        assert_eq!(ops::mean(&x)?.to_vec()?, vec![3.0]);
        Ok(())
    });
}

#[test]
fn reductions_are_deterministic_and_replay_bitwise() {
    on_each_backend(|dev| {
        let x = random(dev, &[1 << 21], 9)?;
        let first = ops::sum(&x)?.to_vec()?;
        for _ in 0..3 {
            bitwise_eq("repeated sum", &ops::sum(&x)?.to_vec()?, &first)?;
        }
        let (a, b) = (random(dev, &[513, 257], 1)?, random(dev, &[513, 257], 2)?);
        eager_vs_replay(dev, || {
            Ok(vec![
                ops::add(&a, &b)?,
                ops::mul(&a, &b)?,
                ops::scale(&a, 0.3)?,
                ops::sum(&a)?,
                ops::mean(&b)?,
                ops::sum(&x)?,
            ])
        })
    });
}

#[test]
fn elementwise_rejects_mismatches() {
    on_each_backend(|dev| {
        let (a, b) = (random(dev, &[4, 5], 1)?, random(dev, &[5, 4], 2)?);
        expect_err("add shapes", ops::add(&a, &b), is_shape)?;
        expect_err("mul shapes", ops::mul(&a, &random(dev, &[20], 3)?), is_shape)?;
        let other = random(&Device::host(), &[4, 5], 4)?;
        expect_err("add devices", ops::add(&a, &other), |e| matches!(e, Error::DeviceMismatch { .. }))?;
        // Two host devices share a name: the message says they are two, and why.
        if dev.is_host() {
            let e = ops::add(&a, &other).unwrap_err().to_string();
            assert!(e.contains("two separate host devices") && e.contains("Device::host()"), "{e}");
        }
        Ok(())
    });
}

/// `scale_by_`: `y *= s[0]` read on the device (so a replay follows the scale's new value), in
/// every dtype; a scale that is not one f32 element is a typed error that leaves `y` as it was.
#[test]
fn scale_by_reads_its_scale_on_the_device() {
    use graphed::{CaptureMode, DType, Graph};
    on_each_backend(|dev| {
        for dtype in [DType::F32, DType::BF16, DType::F16] {
            let y = Tensor::from_slice_as(dev, &[1.0, -2.0, 4.0], &[3], dtype)?;
            let s = Tensor::from_slice(dev, &[0.5], &[1])?;
            let mut g = Graph::new(dev);
            g.capture(CaptureMode::Global, || ops::scale_by_(&y, &s))?;
            g.replay()?;
            s.copy_from_slice(&[-2.0])?;
            g.replay()?;
            assert_eq!(y.to_vec()?, vec![-1.0, 2.0, -4.0], "{dtype}");
            let before = y.to_vec()?;
            let two = Tensor::from_slice(dev, &[1.0, 2.0], &[2])?;
            assert!(matches!(ops::scale_by_(&y, &two), Err(Error::Shape { .. })), "{dtype}");
            let half = Tensor::from_slice_as(dev, &[1.0], &[1], DType::BF16)?;
            assert!(matches!(ops::scale_by_(&y, &half), Err(Error::DType { .. })), "{dtype}");
            assert_eq!(y.to_vec()?, before, "{dtype}: a refused scale_by_ changed y");
        }
        Ok(())
    });
}
