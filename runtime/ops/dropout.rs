//! Dropout with a graph-safe mask from the Philox generator.

use crate::backend::{KArg, LaunchDims};
use crate::error::OpError;
use crate::ops::activation::binary;
use crate::ops::{check_like, cpu, exec, k, n32, Exec};
use crate::{Error, Generator, Result, Tensor};

/// Dropout: in training, zeroes each element with probability `p` and scales the rest by
/// `1 / (1 - p)`; returns `(y, Some(mask))` with the mask in `x`'s dtype, values `0` or
/// `1 / (1 - p)`, so `y = x · mask` (in bf16 and f16, `y` is computed from the unrounded scale
/// and the stored mask is rounded). Out of training it returns `(copy of x, None)` and draws nothing.
///
/// The mask comes from `rng`: the kernel reads the generator's seed and offset through a
/// pointer and the offset is advanced on the device by `x.numel()` afterwards, so a captured
/// dropout draws a fresh mask on every replay, and restoring a saved state
/// ([`Generator::save`]/[`Generator::restore`], capturable) redraws the same mask (what
/// activation recomputation needs). The host backend draws the identical numbers.
///
/// `p` outside `[0, 1)` is [`OpError::DropoutP`].
///
/// ```
/// # use graphed::{ops, Device, Generator, Tensor};
/// let dev = Device::host();
/// let rng = Generator::new(&dev, 7)?;
/// let x = Tensor::full(&dev, &[1000], 1.0)?;
/// let saved = rng.save()?;
/// let (y, mask) = ops::dropout(&x, 0.25, &rng, true)?;
/// let y = y.to_vec()?;
/// assert!(y.iter().all(|v| *v == 0.0 || *v == 1.0 / 0.75));
/// rng.restore(&saved)?;
/// let (y2, _) = ops::dropout(&x, 0.25, &rng, true)?;
/// assert_eq!(y, y2.to_vec()?); // same state, same mask
/// let (e, none) = ops::dropout(&x, 0.25, &rng, false)?;
/// assert!(none.is_none() && e.to_vec()? == vec![1.0; 1000]);
/// # drop(mask);
/// # Ok::<(), graphed::Error>(())
/// ```
pub fn dropout(x: &Tensor, p: f32, rng: &Generator, training: bool) -> Result<(Tensor, Option<Tensor>)> {
    const OP: &str = "dropout";
    let dtype = check_like(OP, &[x])?;
    let kernel = k::DROPOUT.get(dtype);
    if !(0.0..1.0).contains(&p) {
        return Err(OpError::DropoutP { p }.into());
    }
    if rng.device() != x.device() {
        return Err(Error::DeviceMismatch { op: OP, a: x.device().name(), b: rng.device().name() });
    }
    if !training {
        return Ok((x.deep_clone()?, None));
    }
    let n = n32(OP, x.numel())?;
    let scale = cpu::dropout_scale(p);
    let (y, mask) = (Tensor::empty_like(x)?, Tensor::empty_like(x)?);
    match exec(x.device()) {
        Exec::Host(h) => {
            let (xp, yp, mp, st) = (x.host_ptr()?, y.host_ptr()?, mask.host_ptr()?, rng.state().host_ptr()?);
            h.run(kernel, move || {
                let (seed, offset) = crate::rng::decode_state(&st.read_u32());
                let m = cpu::dropout_mask(seed, offset, n as usize, p);
                yp.write(&cpu::mul(&xp.read(), &m));
                mp.write(&m);
                Ok(())
            })?;
        }
        Exec::Cuda(c) => c.launch(
            kernel,
            LaunchDims::vectorized(n as usize, dtype),
            &[
                KArg::Ptr(y.cuda_ptr()?),
                KArg::Ptr(mask.cuda_ptr()?),
                KArg::Ptr(x.cuda_ptr()?),
                KArg::Ptr(rng.state().cuda_ptr()?),
                KArg::F32(p),
                KArg::F32(scale),
                KArg::U32(n),
            ],
        )?,
    }
    rng.advance(n as u64)?;
    Ok((y, Some(mask)))
}

/// The backward of [`dropout`]: `dy · mask`.
///
/// ```
/// # use graphed::{ops, Device, Tensor};
/// let dev = Device::host();
/// let dy = Tensor::from_slice(&dev, &[1.0, 1.0], &[2])?;
/// let mask = Tensor::from_slice(&dev, &[0.0, 2.0], &[2])?;
/// assert_eq!(ops::dropout_backward(&dy, &mask)?.to_vec()?, vec![0.0, 2.0]);
/// # Ok::<(), graphed::Error>(())
/// ```
pub fn dropout_backward(dy: &Tensor, mask: &Tensor) -> Result<Tensor> {
    binary("dropout_backward", k::MUL, dy, mask, &[], cpu::mul)
}
