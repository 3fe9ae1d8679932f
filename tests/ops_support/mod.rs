//! Helpers shared by the `ops_*` tests: reference comparisons, finite differences and the
//! eager-versus-replay check.
#![allow(dead_code)]

use graphed::{CaptureMode, Device, Error, Graph, Result, Tensor};

use crate::common::rel_err;

/// Relative error allowed for elementwise and row kernels against the CPU reference on CUDA.
pub const TOL: f64 = 1e-5;
/// Relative error allowed for GEMM-based results on CUDA.
pub const TOL_GEMM: f64 = 1e-4;
/// Relative error allowed between a backward and central finite differences of the CPU
/// reference forward (step `FD_H` on f32 inputs, loss accumulated in f64): the truncation
/// error is O(h²) ≈ 1e-5 and the rounding of the f32 forward outputs ≈ 1e-5 at these sizes.
pub const TOL_FD: f64 = 2e-3;
/// The finite-difference step.
pub const FD_H: f32 = 1e-2;

/// Compares a backend's result with the CPU reference: bitwise on the host backend (it runs
/// the reference), relative error under `tol` on CUDA.
pub fn check_ref(dev: &Device, what: &str, got: &[f32], want: &[f32], tol: f64) -> Result<()> {
    if got.len() != want.len() {
        return Err(Error::msg(format!("{what}: {} values, reference has {}", got.len(), want.len())));
    }
    if dev.is_host() {
        return bitwise_eq(what, got, want);
    }
    let e = rel_err(got, want);
    if e.is_nan() || e >= tol {
        return Err(Error::msg(format!("{what}: relative error {e:e} against the CPU reference (tolerance {tol:e})")));
    }
    Ok(())
}

/// Bitwise equality (NaNs with the same bits are equal).
pub fn bitwise_eq(what: &str, got: &[f32], want: &[f32]) -> Result<()> {
    if got.len() != want.len() {
        return Err(Error::msg(format!("{what}: {} values vs {}", got.len(), want.len())));
    }
    if let Some(i) = got.iter().zip(want).position(|(a, b)| a.to_bits() != b.to_bits()) {
        return Err(Error::msg(format!("{what}: element {i} differs: {} vs {}", got[i], want[i])));
    }
    Ok(())
}

/// `‖a − b‖ / ‖b‖` with an f64 reference.
pub fn rel_err64(a: &[f32], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len(), "lengths differ");
    let num: f64 = a.iter().zip(b).map(|(x, y)| (*x as f64 - y).powi(2)).sum();
    let den: f64 = b.iter().map(|y| y.powi(2)).sum();
    (num / den.max(1e-30)).sqrt()
}

/// Checks a backward's result against finite differences.
pub fn check_fd(what: &str, got: &[f32], fd: &[f64]) -> Result<()> {
    let e = rel_err64(got, fd);
    if e.is_nan() || e >= TOL_FD {
        return Err(Error::msg(format!(
            "{what}: relative error {e:e} against finite differences (tolerance {TOL_FD:e})"
        )));
    }
    Ok(())
}

/// Central differences of the scalar `loss` at `x`, element by element. The step actually
/// taken (after rounding `x ± h` to f32) is the divisor.
pub fn fd_grad(x: &[f32], loss: impl Fn(&[f32]) -> f64) -> Vec<f64> {
    let mut xp = x.to_vec();
    (0..x.len())
        .map(|i| {
            let orig = x[i];
            xp[i] = orig + FD_H;
            let (up, fp) = (xp[i], loss(&xp));
            xp[i] = orig - FD_H;
            let (dn, fm) = (xp[i], loss(&xp));
            xp[i] = orig;
            (fp - fm) / (up as f64 - dn as f64)
        })
        .collect()
}

/// `Σ aᵢ·bᵢ` in f64: the scalar loss `⟨r, f(x)⟩` whose grad is the backward with `dy = r`.
pub fn dot(a: &[f32], b: &[f32]) -> f64 {
    a.iter().zip(b).map(|(x, y)| *x as f64 * *y as f64).sum()
}

/// Runs `f` eagerly, then captures it into a graph, replays once, and requires every output
/// of the replay to equal the eager output bitwise. `f` must create any accumulator it writes
/// (e.g. `Tensor::zeros`) itself, so both runs start from the same state.
pub fn eager_vs_replay(dev: &Device, mut f: impl FnMut() -> Result<Vec<Tensor>>) -> Result<()> {
    let eager: Vec<Vec<f32>> = f()?.iter().map(Tensor::to_vec).collect::<Result<_>>()?;
    let mut g = Graph::new(dev);
    let outs = g.capture(CaptureMode::Global, &mut f)?;
    g.replay()?;
    if outs.len() != eager.len() {
        return Err(Error::msg("the capture returned a different number of outputs"));
    }
    for (i, (o, e)) in outs.iter().zip(&eager).enumerate() {
        bitwise_eq(&format!("replayed output {i} vs eager"), &o.to_vec()?, e)?;
    }
    // A second replay gives the same again (the graph holds no hidden state).
    g.replay()?;
    for (i, (o, e)) in outs.iter().zip(&eager).enumerate() {
        bitwise_eq(&format!("second replay, output {i}"), &o.to_vec()?, e)?;
    }
    Ok(())
}

/// Requires `r` to be an error whose root is the variant `matches` accepts.
pub fn expect_err<T: std::fmt::Debug>(what: &str, r: Result<T>, matches: impl Fn(&Error) -> bool) -> Result<()> {
    match r {
        Err(e) if matches(e.root()) => Ok(()),
        Err(e) => Err(Error::msg(format!("{what}: wrong error: {e}"))),
        Ok(v) => Err(Error::msg(format!("{what}: expected an error, got {v:?}"))),
    }
}

pub fn is_shape(e: &Error) -> bool {
    matches!(e, Error::Shape { .. })
}
