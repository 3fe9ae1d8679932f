//! Command-line pieces the examples share; each example parses its flags with clap's derive.
#![allow(dead_code)]

use clap::builder::{PossibleValuesParser, TypedValueParser};
use graphed::DType;

/// Parses `f32`, `bf16` or `f16` (the possible values show in `--help` and in errors).
pub fn dtype() -> impl TypedValueParser<Value = DType> {
    PossibleValuesParser::new(["f32", "bf16", "f16"]).map(|s| match s.as_str() {
        "bf16" => DType::BF16,
        "f16" => DType::F16,
        _ => DType::F32,
    })
}

/// Parses one `LxHxB` shape of the benchmark model: L blocks of Linear(H, H), batch B.
pub fn shape(s: &str) -> Result<(usize, usize, usize), String> {
    let parts: Vec<&str> = s.split('x').collect();
    let bad = || format!("`{s}` is not LxHxB (three positive integers, e.g. 8x256x32)");
    match parts[..] {
        [l, h, b] => {
            let n = |v: &str| v.parse::<usize>().ok().filter(|n| *n > 0).ok_or_else(bad);
            Ok((n(l)?, n(h)?, n(b)?))
        }
        _ => Err(bad()),
    }
}
