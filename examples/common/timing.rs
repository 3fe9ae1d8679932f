//! Device time per call of a piece of GPU work: a graph of `launches` calls, replayed `reps`
//! times after one warm-up replay under `Device::time_ms`, so launch overhead stays out.

use graphed::{CaptureMode, Device, Graph, Result};

/// Milliseconds of device time per call of `f`.
pub fn ms_per_call(dev: &Device, launches: usize, reps: usize, mut f: impl FnMut() -> Result<()>) -> Result<f64> {
    let mut g = Graph::new(dev);
    g.capture(CaptureMode::Global, || {
        for _ in 0..launches {
            f()?;
        }
        Ok(())
    })?;
    g.replay()?;
    dev.synchronize()?;
    let ms = dev.time_ms(|| {
        for _ in 0..reps {
            g.replay()?;
        }
        Ok(())
    })?;
    Ok(ms as f64 / (reps * launches) as f64)
}
