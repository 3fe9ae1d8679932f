//! `ops::split_columns` and `ops::concat_columns` on both backends: against the host reference,
//! each the other's inverse bit for bit, every dtype, replayed equal to eager, and their
//! refusals.

mod common;
mod ops_support;

use common::{on_each_backend, random_vec};
use graphed::ops::{self, cpu};
use graphed::{DType, Error, Tensor};
use ops_support::*;

/// Splits at uneven widths (1, 5 and 130 columns over 7 x 3 rows), joins the parts back, and
/// compares both with the host reference, for f32, bf16, f16 and i32; then the same calls
/// captured and replayed.
#[test]
fn split_and_concat_columns_are_inverse_copies() {
    on_each_backend(|dev| {
        let widths = [1, 5, 130];
        let width: usize = widths.iter().sum();
        for dtype in [DType::F32, DType::BF16, DType::F16, DType::I32] {
            let n = 7 * 3 * width;
            let values: Vec<f32> = random_vec(n, 5).into_iter().map(|x| (x * 100.0).round()).collect();
            let x = Tensor::from_slice_as(dev, &values, &[7, 3, width], dtype)?;
            let xs = x.to_vec()?;
            let parts = ops::split_columns(&x, &widths)?;
            let want = cpu::split_columns(&xs, &widths);
            for ((p, w), &cols) in parts.iter().zip(&want).zip(&widths) {
                assert_eq!((p.dims(), p.dtype()), (&[7, 3, cols][..], dtype));
                bitwise_eq(&format!("{dtype} split {cols}"), &p.to_vec()?, w)?;
            }
            let refs: Vec<&Tensor> = parts.iter().collect();
            let joined = ops::concat_columns(&refs)?;
            assert_eq!(joined.dims(), x.dims());
            bitwise_eq(&format!("{dtype} concat"), &joined.to_vec()?, &xs)?;
            eager_vs_replay(dev, || {
                let parts = ops::split_columns(&x, &widths)?;
                let refs: Vec<&Tensor> = parts.iter().collect();
                let joined = ops::concat_columns(&refs)?;
                Ok(parts.into_iter().chain([joined]).collect())
            })?;
        }
        Ok(())
    });
}

#[test]
fn split_and_concat_columns_refuse_bad_input_before_running() {
    on_each_backend(|dev| {
        let x = Tensor::zeros(dev, &[4, 6])?;
        expect_err("widths sum", ops::split_columns(&x, &[2, 3]), is_shape)?;
        expect_err("no widths", ops::split_columns(&x, &[]), is_shape)?;
        expect_err("zero width", ops::split_columns(&x, &[6, 0]), is_shape)?;
        expect_err("overflowing widths", ops::split_columns(&x, &[usize::MAX, 7]), is_shape)?;
        let scalar = Tensor::zeros(dev, &[])?;
        expect_err("rank 0", ops::split_columns(&scalar, &[1]), is_shape)?;
        expect_err("no parts", ops::concat_columns(&[]), is_shape)?;
        let rows5 = Tensor::zeros(dev, &[5, 2])?;
        expect_err("leading dims", ops::concat_columns(&[&x, &rows5]), is_shape)?;
        let half = Tensor::zeros_as(dev, &[4, 2], DType::BF16)?;
        expect_err("dtype mix", ops::concat_columns(&[&x, &half]), |e| matches!(e, Error::DTypeMismatch { .. }))?;
        Ok(())
    });
}
