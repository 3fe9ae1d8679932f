//! Graph-safe Philox random numbers: the generator's seed and offset live in device memory.
//!
//! Kernels read the state through a pointer and a tiny kernel advances the offset after each
//! draw, so a captured draw takes fresh numbers on every replay. Saving and restoring the state
//! are device-side copies, so they work inside a capture too (recomputation restores the
//! forward's state to redraw the same dropout mask). The host backend computes the same
//! Philox4x32-10 function, so both backends draw identical numbers for a seed and offset.

use crate::backend::Exec;
use crate::backend::{BuiltinKernel, KArg};
use crate::{Device, Error, Result, Tensor};

/// A counter-based random generator whose state is device memory.
///
/// ```
/// use graphed::{Device, Generator, Tensor};
/// let dev = Device::host();
/// let g = Generator::new(&dev, 42)?;
/// let a = Tensor::empty(&dev, &[4])?;
/// let saved = g.save()?;
/// g.uniform_(&a)?;
/// g.restore(&saved)?;
/// let b = Tensor::empty(&dev, &[4])?;
/// g.uniform_(&b)?;
/// assert_eq!(a.to_vec()?, b.to_vec()?); // the same state draws the same numbers
/// # Ok::<(), graphed::Error>(())
/// ```
#[derive(Clone, Debug)]
pub struct Generator {
    state: Tensor,
}

/// A saved generator state (device memory; restore it with [`Generator::restore`]).
#[derive(Clone, Debug)]
pub struct RngState(Tensor);

impl RngState {
    /// The device buffer holding the state.
    pub(crate) fn tensor(&self) -> &Tensor {
        &self.0
    }

    pub(crate) fn from_tensor(t: Tensor) -> RngState {
        RngState(t)
    }
}

/// The four state words: seed lo, seed hi, offset lo, offset hi.
fn words_u32(seed: u64, offset: u64) -> [u32; 4] {
    [seed as u32, (seed >> 32) as u32, offset as u32, (offset >> 32) as u32]
}

/// The state words as the f32 bit patterns the state tensor holds.
fn words(seed: u64, offset: u64) -> [f32; 4] {
    words_u32(seed, offset).map(f32::from_bits)
}

/// (seed, offset) from the four state words.
pub(crate) fn decode_state(w: &[u32]) -> (u64, u64) {
    (w[0] as u64 | ((w[1] as u64) << 32), w[2] as u64 | ((w[3] as u64) << 32))
}

impl Device {
    /// The device's default random generator (seed 0 until [`Generator::manual_seed`]).
    ///
    /// ```
    /// let dev = graphed::Device::host();
    /// assert_eq!(dev.rng()?.seed_and_offset()?, (0, 0));
    /// # Ok::<(), graphed::Error>(())
    /// ```
    pub fn rng(&self) -> Result<Generator> {
        let mut slot = self.rng_slot().lock().unwrap_or_else(|e| e.into_inner());
        if let Some(g) = slot.as_ref().and_then(|g| g.downcast_ref::<Generator>()) {
            return Ok(g.clone());
        }
        let g = self.with_pool(&self.default_pool(), || Generator::new(self, 0))?;
        *slot = Some(Box::new(g.clone()));
        Ok(g)
    }
}

impl Generator {
    /// A generator on `device` seeded with `seed`, offset 0.
    pub fn new(device: &Device, seed: u64) -> Result<Generator> {
        let state = Tensor::from_slice(device, &words(seed, 0), &[4])?;
        Ok(Generator { state })
    }

    /// Resets to `seed` and offset 0. Illegal during capture (a host write).
    pub fn manual_seed(&self, seed: u64) -> Result<()> {
        self.state.copy_from_slice(&words(seed, 0))
    }

    /// Reads (seed, offset) back to the host. Illegal during capture.
    pub fn seed_and_offset(&self) -> Result<(u64, u64)> {
        let w: Vec<u32> = self.state.to_vec()?.into_iter().map(f32::to_bits).collect();
        Ok(decode_state(&w))
    }

    /// Copies the state into new device memory. Capturable.
    pub fn save(&self) -> Result<RngState> {
        Ok(RngState(self.state.deep_clone()?))
    }

    /// Copies a saved state back. Capturable.
    pub fn restore(&self, saved: &RngState) -> Result<()> {
        self.state.copy_(&saved.0)
    }

    /// Copies a saved state into an existing state buffer (reusing its memory). Capturable.
    pub fn save_into(&self, saved: &RngState) -> Result<()> {
        saved.0.copy_(&self.state)
    }

    /// Fills `out` (f32) with uniform numbers in [0, 1) and advances the offset by its length.
    /// Draw into an f32 tensor and cast it (`ops::cast`) for bf16 or f16; another dtype is
    /// [`Error::DType`].
    pub fn uniform_(&self, out: &Tensor) -> Result<()> {
        if out.dtype() != crate::DType::F32 {
            return Err(Error::DType { op: "Generator::uniform_", got: out.dtype(), expected: crate::DType::F32 });
        }
        let n = out.numel();
        self.draw(out, BuiltinKernel::RngUniformF32, n)
    }

    /// The device the state lives on.
    pub fn device(&self) -> &Device {
        self.state.device()
    }

    /// Fills `out`'s `n` elements with uniforms from the current state (`kernel` on CUDA, the
    /// same Philox function on the host), then advances the offset by `n`.
    pub(crate) fn draw(&self, out: &Tensor, kernel: BuiltinKernel, n: usize) -> Result<()> {
        if out.device() != self.device() {
            return Err(Error::DeviceMismatch { op: "rng", a: out.device().name(), b: self.device().name() });
        }
        match out.device().backend().exec() {
            Exec::Host(h) => {
                let (y, st) = (out.host_ptr()?, self.state.host_ptr()?);
                h.run(kernel, move || {
                    let (seed, offset) = decode_state(&st.read_u32());
                    let v: Vec<f32> = (0..n).map(|i| philox_uniform(seed, offset + i as u64)).collect();
                    y.write(&v);
                    Ok(())
                })?;
            }
            Exec::Cuda(c) => {
                let st = self.state.cuda_ptr()?;
                c.launch(
                    kernel,
                    crate::backend::LaunchDims::elementwise(n),
                    &[KArg::Ptr(out.cuda_ptr()?), KArg::Ptr(st), KArg::U32(n as u32)],
                )?;
            }
        }
        self.advance(n as u64)
    }

    /// Advances the offset by `n` on the device stream (capturable): what an op that read the
    /// state directly in its own kernel queues after it, like [`Generator::draw`] does.
    pub(crate) fn advance(&self, n: u64) -> Result<()> {
        match self.device().backend().exec() {
            Exec::Host(h) => {
                let st = self.state.host_ptr()?;
                h.run(BuiltinKernel::RngAdvance, move || {
                    let (seed, offset) = decode_state(&st.read_u32());
                    st.write_u32(&words_u32(seed, offset + n));
                    Ok(())
                })
            }
            Exec::Cuda(c) => c.launch(
                BuiltinKernel::RngAdvance,
                crate::backend::LaunchDims::rows(1, 32),
                &[KArg::Ptr(self.state.cuda_ptr()?), KArg::U64(n)],
            ),
        }
    }

    /// The state buffer (for kernels that take it directly).
    pub(crate) fn state(&self) -> &Tensor {
        &self.state
    }
}

/// Philox4x32-10: 10 rounds over a 128-bit counter `(block lo, block hi, 0, 0)` with a 64-bit
/// key; returns the four words.
pub(crate) fn philox4(seed: u64, block: u64) -> [u32; 4] {
    let (mut c0, mut c1, mut c2, mut c3) = (block as u32, (block >> 32) as u32, 0u32, 0u32);
    let (mut k0, mut k1) = (seed as u32, (seed >> 32) as u32);
    for _ in 0..10 {
        let p0 = 0xD251_1F53u64 * c0 as u64;
        let p1 = 0xCD9E_8D57u64 * c2 as u64;
        let (hi0, lo0, hi1, lo1) = ((p0 >> 32) as u32, p0 as u32, (p1 >> 32) as u32, p1 as u32);
        (c0, c1, c2, c3) = (hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0);
        k0 = k0.wrapping_add(0x9E37_79B9);
        k1 = k1.wrapping_add(0xBB67_AE85);
    }
    [c0, c1, c2, c3]
}

/// The generator's uniform at `counter`, in [0, 1) with 24 random bits (exact on every
/// backend): word `counter % 4` of Philox block `counter / 4`, so one Philox call serves four
/// consecutive counters (the CUDA dropout draws whole blocks, 16 bytes of output a call).
pub(crate) fn philox_uniform(seed: u64, counter: u64) -> f32 {
    (philox4(seed, counter >> 2)[(counter & 3) as usize] >> 8) as f32 * (1.0 / 16_777_216.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Random123's known answer for Philox4x32-10 with a zero counter and key.
    #[test]
    fn philox_matches_the_known_answer() {
        assert_eq!(philox4(0, 0), [0x6627_e8d5, 0xe169_c58d, 0xbc57_ac4c, 0x9b00_dbd8]);
    }

    /// Counter `e` is word `e % 4` of block `e / 4`.
    #[test]
    fn four_counters_share_a_block() {
        let b = philox4(7, 3);
        for (k, w) in b.iter().enumerate() {
            assert_eq!(philox_uniform(7, 12 + k as u64), (w >> 8) as f32 / 16_777_216.0);
        }
    }
}
