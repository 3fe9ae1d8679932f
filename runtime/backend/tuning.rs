//! Choosing among a library's candidates by timing them: the GEMM algorithms of cublasLt
//! (`cublaslt_gemm.rs`, `GRAPHED_GEMM=tuned`) and cuDNN's attention plans (`cudnn_tune.rs`,
//! `GRAPHED_ATTENTION_TUNE=1`). Each candidate runs once on scratch operands of the call's
//! shape, then is timed in rounds; the least time counts, and the library's own first choice is
//! kept unless another is clearly faster. Never inside a capture: timing synchronises the
//! device and the scratch memory is allocated and freed.

use cudarc::driver::result as driver;

use super::cuda::CudaBackend;
use crate::Result;

/// Launches of each candidate per timing, and timings per candidate (the least counts).
const TIMED_LAUNCHES: usize = 4;
const ROUNDS: usize = 2;

/// The library's first choice is kept unless another is faster by more than this fraction:
/// timings a few percent apart are noise.
const KEEP_FIRST_WITHIN: f32 = 0.03;

/// The index of the candidate to keep, from each candidate's time in ms (`None`: it failed to
/// run), candidate 0 being the library's first choice: the fastest, unless the first is within
/// [`KEEP_FIRST_WITHIN`] of it. `None` when none ran.
pub(crate) fn pick_timed(times: &[Option<f32>]) -> Option<usize> {
    let (best, best_ms) = times
        .iter()
        .enumerate()
        .filter_map(|(i, t)| t.filter(|ms| ms.is_finite()).map(|ms| (i, ms)))
        .min_by(|a, b| a.1.total_cmp(&b.1))?;
    match times.first().copied().flatten() {
        Some(first) if first.is_finite() && first <= best_ms * (1.0 + KEEP_FIRST_WITHIN) => Some(0),
        _ => Some(best),
    }
}

/// Device memory for the timing runs, freed on drop.
struct Scratch(Vec<u64>);

impl Drop for Scratch {
    fn drop(&mut self) {
        for &p in self.0.iter().filter(|&&p| p != 0) {
            // SAFETY: allocated by `Scratch::new`, freed once; the timing synchronised the
            // stream, so no launch still reads it.
            let _ = unsafe { driver::free_sync(p) };
        }
    }
}

impl Scratch {
    /// One block an operand, filled with a small constant (0x3f bytes: about 0.75 in f32 and
    /// bf16): timings do not depend on the values, but zeros could run faster than real data.
    /// An operand of 0 bytes (one the call does not read) gets no memory: its address is 0.
    fn new(bytes: &[usize]) -> std::result::Result<Scratch, driver::DriverError> {
        let mut s = Scratch(Vec::new());
        for &b in bytes {
            if b == 0 {
                s.0.push(0);
                continue;
            }
            // SAFETY: plain allocations, freed by `drop`.
            let p = unsafe { driver::malloc_sync(b) }?;
            s.0.push(p);
            // SAFETY: `p` holds `b` bytes.
            unsafe { driver::memset_d8_sync(p, 0x3f, b) }?;
        }
        Ok(s)
    }
}

impl CudaBackend {
    /// Times `run` with each of `choices` on scratch blocks of `bytes` (one an operand, in the
    /// order `run` reads them) and returns the index [`pick_timed`] keeps: 0, the library's
    /// first choice, when the scratch memory cannot be had or nothing else ran. The caller
    /// checked that no capture is in progress on this thread.
    pub(super) fn time_choices<T>(
        &self,
        bytes: &[usize],
        choices: &[T],
        run: &dyn Fn(&T, &[u64]) -> Result<()>,
    ) -> usize {
        let Ok(scratch) = Scratch::new(bytes) else { return 0 };
        let run = |choice| run(choice, &scratch.0);
        let mut times: Vec<Option<f32>> = choices.iter().map(|c| run(c).ok().map(|()| f32::INFINITY)).collect();
        for _ in 0..ROUNDS {
            for (choice, best) in choices.iter().zip(times.iter_mut()) {
                let Some(ms) = best else { continue };
                match self.time_ms(&mut || (0..TIMED_LAUNCHES).try_for_each(|_| run(choice))) {
                    Ok(t) => *ms = ms.min(t / TIMED_LAUNCHES as f32),
                    Err(_) => *best = None,
                }
            }
        }
        pick_timed(&times).unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_choice_is_kept_unless_another_is_clearly_faster() {
        // Within 3% of the fastest: the library's first stays.
        assert_eq!(pick_timed(&[Some(1.02), Some(1.0), Some(1.5)]), Some(0));
        // More than 3% slower: the fastest.
        assert_eq!(pick_timed(&[Some(1.2), Some(1.3), Some(1.0)]), Some(2));
        // The first failed to run: the fastest of the rest.
        assert_eq!(pick_timed(&[None, Some(2.0), Some(1.0)]), Some(2));
        // Failed timings (infinite: ran once, never timed) never win.
        assert_eq!(pick_timed(&[Some(f32::INFINITY), Some(2.0)]), Some(1));
        assert_eq!(pick_timed(&[None, None]), None);
        assert_eq!(pick_timed(&[]), None);
    }
}
