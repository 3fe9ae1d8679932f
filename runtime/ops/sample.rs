//! Sampling on the device: the next token of each sequence chosen from its logits without a
//! read to the host, so a decoding loop stays inside one graph.

use crate::backend::{BuiltinKernel, CudaBackend, KArg, LaunchDims};
use crate::ops::{at_most, check_like, cpu, exec, k, n32, Exec};
use crate::{DType, Error, Generator, Result, ShapeProblem, Tensor};

/// Checks `logits` (`[batch, vocab]`, both nonzero, a float dtype, indices that fit an i32);
/// returns its dtype, batch and vocabulary size.
fn check_logits(op: &'static str, logits: &Tensor) -> Result<(DType, usize, usize)> {
    let dtype = check_like(op, &[logits])?;
    let &[batch, vocab] = logits.dims() else {
        return Err(Error::shape(op, ShapeProblem::layout("logits", "[batch, vocab]", logits.dims())));
    };
    if batch == 0 || vocab == 0 {
        return Err(Error::shape(
            op,
            ShapeProblem::layout("logits", "[batch, vocab] with both nonzero", logits.dims()),
        ));
    }
    n32(op, batch * vocab)?;
    at_most(op, "vocabulary size", vocab, i32::MAX as usize)?;
    Ok((dtype, batch, vocab))
}

/// Launches a kernel with one block of 256 threads per row of `logits` (the argmax and
/// sampling kernels' merge trees and counts are sized for it); its arguments are `out`, then
/// `logits` (`tensors`), then `rest`.
fn launch_rows(c: &CudaBackend, kernel: BuiltinKernel, tensors: [&Tensor; 2], rest: &[KArg]) -> Result<()> {
    let [out, logits] = tensors;
    let mut args = vec![KArg::Ptr(out.cuda_ptr()?), KArg::Ptr(logits.cuda_ptr()?)];
    args.extend_from_slice(rest);
    c.launch(kernel, LaunchDims::rows(logits.dims()[0].min(1 << 20), 256), &args)
}

/// Greedy sampling: for each row of `logits` (`[batch, vocab]`, f32, bf16 or f16), the index
/// of its largest value, as an [`DType::I32`] tensor `[batch]`. Ties go to the lowest index;
/// NaN is never chosen (a row of NaN only gives 0). Deterministic: the same on every run, and
/// the same on CUDA as the CPU reference ([`cpu::argmax`]) the host backend runs.
///
/// ```
/// # use graphed::{ops, Device, Tensor};
/// let dev = Device::host();
/// let logits = Tensor::from_slice(&dev, &[0.1, 2.0, 2.0, -1.0, f32::NAN, -3.0], &[2, 3])?;
/// assert_eq!(ops::argmax(&logits)?.to_i32_vec()?, vec![1, 0]); // a tie: the lower index; NaN skipped
/// # Ok::<(), graphed::Error>(())
/// ```
pub fn argmax(logits: &Tensor) -> Result<Tensor> {
    const OP: &str = "argmax";
    let (dtype, batch, vocab) = check_logits(OP, logits)?;
    let out = Tensor::empty_as(logits.device(), &[batch], DType::I32)?;
    let kernel = k::ARGMAX_ROWS.get(dtype);
    match exec(logits.device()) {
        Exec::Host(h) => {
            let (xp, op) = (logits.host_ptr()?, out.host_ptr()?);
            h.run(kernel, move || {
                op.write_i32(&cpu::argmax(&xp.read(), batch, vocab));
                Ok(())
            })?;
        }
        Exec::Cuda(c) => launch_rows(c, kernel, [&out, logits], &[KArg::U32(batch as u32), KArg::U32(vocab as u32)])?,
    }
    Ok(out)
}

/// How [`sample`] picks the next token: from `softmax(logits / temperature)` restricted to the
/// `top_k` largest logits (0 keeps the whole vocabulary). A temperature of 0 is greedy
/// ([`argmax`]), and so is `top_k` 1.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sampling {
    /// Divides the logits before the softmax: below 1 sharpens, above 1 flattens; 0 is greedy.
    pub temperature: f32,
    /// Only the `top_k` largest logits of a row can be drawn (ties at the cut all can); 0: all.
    pub top_k: usize,
}

impl Sampling {
    /// Always the most likely token.
    pub fn greedy() -> Sampling {
        Sampling { temperature: 0.0, top_k: 0 }
    }

    /// Whether no random draw is needed (temperature 0 or `top_k` 1).
    pub fn is_greedy(&self) -> bool {
        self.temperature == 0.0 || self.top_k == 1
    }

    /// A negative, NaN or infinite temperature is [`Error::InvalidTemperature`], greedy or not.
    pub(crate) fn check(&self) -> Result<()> {
        let temperature = self.temperature;
        if !(temperature.is_finite() && temperature >= 0.0) {
            return Err(Error::InvalidTemperature { temperature });
        }
        Ok(())
    }
}

/// Samples one token per row of `logits` (`[batch, vocab]`, f32, bf16 or f16) on the device, as
/// an [`DType::I32`] tensor `[batch]`: greedy when [`Sampling::is_greedy`] (exactly
/// [`argmax`], no random numbers drawn), else from `softmax(logits / temperature)` over the
/// row's `top_k` largest logits, with `rng`'s Philox stream (advanced by `batch · vocab`).
///
/// It uses the Gumbel-max trick: the token with the largest `logit / temperature + g`, `g`
/// Gumbel noise from one uniform per logit, is a draw from that softmax, and finding it is an
/// argmax, so nothing is sorted or summed: the result is the same on every run and between
/// eager calls and graph replays. The top-k cut is a radix select (no sort). The CPU reference
/// ([`cpu::sample`]) is the same function; the noise's logarithms are computed in f64 on both
/// sides and rounded to f32, so they agree unless two scores of a row fall within one f64
/// rounding of each other. NaN logits are never drawn.
///
/// A negative, NaN or infinite temperature is [`Error::InvalidTemperature`]; `rng` on another
/// device is [`Error::DeviceMismatch`]. Both are checked before anything runs.
///
/// ```
/// # use graphed::{ops, ops::Sampling, Device, Generator, Tensor};
/// let dev = Device::host();
/// let rng = Generator::new(&dev, 7)?;
/// let logits = Tensor::from_slice(&dev, &[0.0, 9.0, 1.0, 5.0, 4.0, 3.0], &[2, 3])?;
/// let greedy = ops::sample(&logits, Sampling::greedy(), &rng)?;
/// assert_eq!(greedy.to_i32_vec()?, vec![1, 0]);
/// // top-k 2 at temperature 1: row 0 draws 1 or 2, never 0; row 1 draws 0 or 1.
/// let t = ops::sample(&logits, Sampling { temperature: 1.0, top_k: 2 }, &rng)?.to_i32_vec()?;
/// assert!(t[0] != 0 && t[1] != 2);
/// assert!(ops::sample(&logits, Sampling { temperature: -1.0, top_k: 0 }, &rng).is_err());
/// # Ok::<(), graphed::Error>(())
/// ```
pub fn sample(logits: &Tensor, sampling: Sampling, rng: &Generator) -> Result<Tensor> {
    const OP: &str = "sample";
    sampling.check()?;
    let Sampling { temperature, top_k } = sampling;
    if rng.device() != logits.device() {
        return Err(Error::DeviceMismatch { op: OP, a: logits.device().name(), b: rng.device().name() });
    }
    if sampling.is_greedy() {
        return argmax(logits);
    }
    let (dtype, batch, vocab) = check_logits(OP, logits)?;
    let top_k = top_k.min(vocab);
    let out = Tensor::empty_as(logits.device(), &[batch], DType::I32)?;
    let kernel = k::SAMPLE_ROWS.get(dtype);
    match exec(logits.device()) {
        Exec::Host(h) => {
            let (xp, op, st) = (logits.host_ptr()?, out.host_ptr()?, rng.state().host_ptr()?);
            h.run(kernel, move || {
                let (seed, offset) = crate::rng::decode_state(&st.read_u32());
                op.write_i32(&cpu::sample(&xp.read(), batch, vocab, temperature, top_k, seed, offset));
                Ok(())
            })?;
        }
        Exec::Cuda(c) => {
            let rest = [
                KArg::Ptr(rng.state().cuda_ptr()?),
                KArg::U32(batch as u32),
                KArg::U32(vocab as u32),
                KArg::F32(temperature),
                KArg::U32(top_k as u32),
            ];
            launch_rows(c, kernel, [&out, logits], &rest)?;
        }
    }
    rng.advance((batch * vocab) as u64)?;
    Ok(out)
}
