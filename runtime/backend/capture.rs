//! The capture state of a device's stream, in one place.
//!
//! A device has one stream, and a capture records everything queued on it. If another thread
//! queued work while a capture is in progress, that work would land in the captured graph (and
//! in global mode its allocations would invalidate the capture). So the stream has a gate:
//! every primitive that touches the stream or allocates passes through [`StreamGate::enter`].
//! While a thread captures, only that thread passes; the others wait until the capture ends
//! (with a deadline, so a capture that never ends is an error, not a hang). A capture begins
//! only once no other thread is inside a primitive, so none of their work is half-captured.

use std::cell::Cell;
use std::sync::{Condvar, Mutex, MutexGuard};
use std::thread::ThreadId;
use std::time::{Duration, Instant};

use crate::graph::CaptureMode;
use crate::{Error, Result};

/// How long a thread waits for another thread's capture to end before giving up.
const WAIT_FOR_CAPTURE: Duration = Duration::from_secs(120);

thread_local! {
    /// Number of captures this thread has in progress, on any device.
    static CAPTURES: Cell<usize> = const { Cell::new(0) };
}

/// Whether this thread is capturing a graph right now (on any device), like PyTorch's
/// `torch.cuda.is_current_stream_capturing()`.
///
/// Capture-time hooks always see `false`: they run outside captures.
///
/// ```
/// assert!(!graphed::is_capturing());
/// ```
pub fn is_capturing() -> bool {
    CAPTURES.with(|c| c.get() > 0)
}

#[derive(Debug, Default)]
struct GateState {
    /// The capture in progress: its mode and the thread that owns it.
    capture: Option<(CaptureMode, ThreadId)>,
    /// Threads inside a primitive right now, with how many nested entries each.
    inside: Vec<(ThreadId, usize)>,
}

/// The capture state of one stream and the gate every stream primitive passes.
#[derive(Debug, Default)]
pub(crate) struct StreamGate {
    state: Mutex<GateState>,
    changed: Condvar,
}

/// Held while a primitive runs; leaving wakes a thread waiting to begin a capture.
pub(crate) struct Entered<'a> {
    gate: &'a StreamGate,
    thread: ThreadId,
}

impl Drop for Entered<'_> {
    fn drop(&mut self) {
        let mut st = self.gate.lock();
        if let Some(i) = st.inside.iter().position(|(t, _)| *t == self.thread) {
            st.inside[i].1 -= 1;
            if st.inside[i].1 == 0 {
                st.inside.swap_remove(i);
            }
        }
        drop(st);
        self.gate.changed.notify_all();
    }
}

impl StreamGate {
    fn lock(&self) -> MutexGuard<'_, GateState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Waits until `ready` holds for the state, or the deadline passes.
    fn wait_until<'a>(
        &'a self,
        mut st: MutexGuard<'a, GateState>,
        what: &'static str,
        ready: impl Fn(&GateState) -> bool,
    ) -> Result<MutexGuard<'a, GateState>> {
        let deadline = Instant::now() + WAIT_FOR_CAPTURE;
        while !ready(&st) {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(Error::DeviceBusy { waiting: what, waited: WAIT_FOR_CAPTURE });
            }
            st = self.changed.wait_timeout(st, left).unwrap_or_else(|e| e.into_inner()).0;
        }
        Ok(st)
    }

    /// Enters a primitive: passes at once on the capturing thread or when nothing captures,
    /// otherwise waits for the other thread's capture to end.
    pub(crate) fn enter(&self) -> Result<Entered<'_>> {
        let me = std::thread::current().id();
        let st = self.lock();
        let mut st =
            self.wait_until(st, "another thread's capture to end", |s| s.capture.is_none_or(|(_, owner)| owner == me))?;
        match st.inside.iter_mut().find(|(t, _)| *t == me) {
            Some(entry) => entry.1 += 1,
            None => st.inside.push((me, 1)),
        }
        Ok(Entered { gate: self, thread: me })
    }

    /// The capture mode in progress, if the calling thread is the one capturing.
    pub(crate) fn my_capture(&self) -> Option<CaptureMode> {
        let me = std::thread::current().id();
        self.lock().capture.filter(|(_, owner)| *owner == me).map(|(mode, _)| mode)
    }

    /// Marks the stream as capturing for this thread, once no other thread is inside a
    /// primitive; `start` begins the backend's own capture while the gate is held.
    pub(crate) fn begin(&self, mode: CaptureMode, start: impl FnOnce() -> Result<()>) -> Result<()> {
        let me = std::thread::current().id();
        let st = self.lock();
        if st.capture.is_some_and(|(_, owner)| owner == me) {
            return Err(Error::AlreadyCapturing { graph: "this device's stream".into() });
        }
        let mut st = self.wait_until(st, "other threads' work to leave the stream", |s| {
            s.capture.is_none() && s.inside.iter().all(|(t, _)| *t == me)
        })?;
        start()?;
        st.capture = Some((mode, me));
        CAPTURES.with(|c| c.set(c.get() + 1));
        Ok(())
    }

    /// Ends this thread's capture; `finish` ends the backend's capture while the gate is held.
    /// The stream is out of capture mode afterwards whatever `finish` returns.
    pub(crate) fn end<R>(&self, finish: impl FnOnce() -> Result<R>) -> Result<R> {
        let me = std::thread::current().id();
        let mut st = self.lock();
        if !st.capture.is_some_and(|(_, owner)| owner == me) {
            return Err(Error::NotCapturing { graph: "this device's stream".into() });
        }
        let out = finish();
        st.capture = None;
        CAPTURES.with(|c| c.set(c.get().saturating_sub(1)));
        drop(st);
        self.changed.notify_all();
        out
    }
}
