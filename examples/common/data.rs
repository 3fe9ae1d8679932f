//! Deterministic synthetic data shared by the examples, the benchmark and the tests.
#![allow(dead_code)]

use graphed::{Device, Result, Tensor};

/// Deterministic values in [-scale, scale) (xorshift), so nothing runs on zeros.
pub fn random_vec(n: usize, seed: u64, scale: f32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0) * scale
        })
        .collect()
}

/// A tensor of `random_vec` values.
pub fn random(dev: &Device, dims: &[usize], seed: u64, scale: f32) -> Result<Tensor> {
    Tensor::from_slice(dev, &random_vec(dims.iter().product(), seed, scale), dims)
}
