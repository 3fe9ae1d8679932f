//! Sampling on the device: the next token of each sequence chosen from its logits without a
//! read to the host, so a decoding loop stays inside one graph.

use crate::backend::{KArg, LaunchDims};
use crate::ops::{check_like, cpu, exec, k, n32, Exec};
use crate::{DType, Error, Result, Tensor};

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
    let dtype = check_like(OP, &[logits])?;
    let &[batch, vocab] = logits.dims() else {
        return Err(Error::shape(OP, format!("logits must be [batch, vocab], got {:?}", logits.dims())));
    };
    if batch == 0 || vocab == 0 {
        return Err(Error::shape(OP, format!("logits {:?}: batch and vocab must be nonzero", logits.dims())));
    }
    n32(OP, batch * vocab)?;
    if vocab > i32::MAX as usize {
        return Err(Error::invalid(OP, format!("a vocabulary of {vocab} does not fit an i32 index")));
    }
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
        Exec::Cuda(c) => {
            let args = [
                KArg::Ptr(out.cuda_ptr()?),
                KArg::Ptr(logits.cuda_ptr()?),
                KArg::U32(batch as u32),
                KArg::U32(vocab as u32),
            ];
            // 256 threads: the kernel's tree merge is sized for it.
            c.launch(kernel, LaunchDims::rows(batch.min(1 << 20), 256), &args)?;
        }
    }
    Ok(out)
}
