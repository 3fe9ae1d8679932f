//! The capture state of a device's stream, in one place.
//!
//! A device has one stream, and a capture records everything queued on it. If another thread
//! queued work while a capture is in progress, that work would land in the captured graph (and
//! in global mode its allocations would invalidate the capture). So the stream has a gate:
//! every primitive that touches the stream or allocates passes through [`StreamGate::enter`].
//! While a thread captures, only that thread passes; the others wait until the capture ends
//! (with a deadline, so a capture that never ends is an error, not a hang). A capture begins
//! only once no other thread is inside a primitive, so none of their work is half-captured.
//! Without a capture, passing the gate costs two atomic operations.
//!
//! A capture may be inside the body of a conditional node for a while (`Condition::run_if`):
//! the gate counts those bodies, so that nothing ends the capture from inside one.

use std::cell::{Cell, RefCell};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::thread::ThreadId;
use std::time::{Duration, Instant};

use super::CaptureMode;
use crate::error::Invalidation;
use crate::{Error, Result};

/// How long a thread waits for another thread's capture to end before giving up.
const WAIT_FOR_CAPTURE: Duration = Duration::from_secs(120);

thread_local! {
    /// Number of captures this thread has in progress, on any device.
    static CAPTURES: Cell<usize> = const { Cell::new(0) };
    /// The gates this thread is inside (by address), with the nesting depth: a primitive that
    /// calls another (a copy that synchronizes) passes again at once, even while a capture
    /// on another thread waits for this one to leave.
    static HELD: RefCell<Vec<(usize, usize)>> = const { RefCell::new(Vec::new()) };
}

/// This thread's nesting depth in `gate` after adding `delta` (0 when not inside).
fn held(gate: &StreamGate, delta: isize) -> usize {
    let key = gate as *const StreamGate as usize;
    HELD.with(|h| {
        let mut h = h.borrow_mut();
        let i = match h.iter().position(|(g, _)| *g == key) {
            Some(i) => i,
            None if delta > 0 => {
                h.push((key, 0));
                h.len() - 1
            }
            None => return 0,
        };
        let depth = (h[i].1 as isize + delta).max(0) as usize;
        if depth == 0 {
            h.swap_remove(i);
        } else {
            h[i].1 = depth;
        }
        depth
    })
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
    /// A thread waiting for the stream to drain before its capture begins.
    beginning: Option<ThreadId>,
    /// Conditional bodies of the capture in progress being captured now, outermost first
    /// (nested ones count each): for each, what its last kernel may do for a WHILE node.
    bodies: Vec<Option<LoopFold>>,
    /// A conditional branch of the capture in progress failed on CUDA: its node cannot be
    /// taken back out (no call frees a conditional handle), so the capture ends discarded.
    failed_branch: bool,
}

/// A WHILE body being captured whose node tests one i32 flag for nonzero: a kernel that writes
/// that flag may set the node's condition itself (unless `GRAPHED_FOLD_CONDITION=0`), and when it is
/// the body's last node no condition kernel follows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct LoopFold {
    /// The node's conditional handle.
    pub(crate) handle: u64,
    /// The device address of the flag the node tests.
    pub(crate) flag: u64,
    /// The kernel node (by address) that set the condition last, if one did.
    pub(crate) set_by: Option<usize>,
}

/// The capture state of one stream and the gate every stream primitive passes.
///
/// The common case, no capture anywhere, costs two atomic operations per primitive: `inside`
/// counts the primitives in progress and `capturing` says whether a capture is in progress or
/// about to begin. Both are sequentially consistent, so either a primitive sees `capturing`
/// (and takes the slow path under the lock) or the beginning capture sees it inside (and waits
/// for it to leave).
#[derive(Debug, Default)]
pub(crate) struct StreamGate {
    inside: AtomicUsize,
    capturing: AtomicBool,
    state: Mutex<GateState>,
    changed: Condvar,
}

/// Held while a primitive runs; leaving wakes a thread waiting to begin a capture.
pub(crate) struct Entered<'a> {
    /// `None` for the capturing thread's own primitives, which nobody waits for.
    gate: Option<&'a StreamGate>,
}

impl Drop for Entered<'_> {
    fn drop(&mut self) {
        if let Some(gate) = self.gate {
            if held(gate, -1) > 0 {
                return; // a nested entry: the outer one still counts
            }
            let left = gate.inside.fetch_sub(1, Ordering::SeqCst) - 1;
            if left == 0 && gate.capturing.load(Ordering::SeqCst) {
                gate.notify();
            }
        }
    }
}

/// Held while the capturing thread captures the body of a conditional node; leaving the body
/// drops it.
pub(crate) struct Body<'a> {
    gate: &'a StreamGate,
}

impl Drop for Body<'_> {
    fn drop(&mut self) {
        let mut st = self.gate.lock();
        st.bodies.pop();
    }
}

impl StreamGate {
    fn lock(&self) -> MutexGuard<'_, GateState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn notify(&self) {
        drop(self.lock());
        self.changed.notify_all();
    }

    /// Waits until `ready` holds for the state, or the deadline passes.
    fn wait_until<'a>(
        &'a self,
        mut st: MutexGuard<'a, GateState>,
        what: &'static str,
        ready: impl Fn(&StreamGate, &GateState) -> bool,
    ) -> Result<MutexGuard<'a, GateState>> {
        let deadline = Instant::now() + WAIT_FOR_CAPTURE;
        while !ready(self, &st) {
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
        if held(self, 0) > 0 {
            // Already inside (counted): a nested primitive passes.
            held(self, 1);
            return Ok(Entered { gate: Some(self) });
        }
        loop {
            self.inside.fetch_add(1, Ordering::SeqCst);
            if !self.capturing.load(Ordering::SeqCst) {
                held(self, 1);
                return Ok(Entered { gate: Some(self) });
            }
            // A capture is in progress or beginning: step back out and look under the lock.
            let left = self.inside.fetch_sub(1, Ordering::SeqCst) - 1;
            if left == 0 {
                self.notify();
            }
            let me = std::thread::current().id();
            let st = self.lock();
            if st.capture.is_some_and(|(_, owner)| owner == me) {
                return Ok(Entered { gate: None });
            }
            let _st = self.wait_until(st, "another thread's capture to end", |_, s| {
                s.capture.is_none() && s.beginning.is_none()
            })?;
        }
    }

    /// Enters a primitive only when no capture is in progress or beginning: `None` instead of
    /// waiting. For a watchdog's probe, which must neither land in a capture nor wait for one.
    pub(crate) fn try_enter(&self) -> Option<Entered<'_>> {
        if held(self, 0) > 0 {
            held(self, 1);
            return Some(Entered { gate: Some(self) });
        }
        self.inside.fetch_add(1, Ordering::SeqCst);
        if !self.capturing.load(Ordering::SeqCst) {
            held(self, 1);
            return Some(Entered { gate: Some(self) });
        }
        let left = self.inside.fetch_sub(1, Ordering::SeqCst) - 1;
        if left == 0 {
            self.notify();
        }
        None
    }

    /// The capture mode in progress, if the calling thread is the one capturing.
    pub(crate) fn my_capture(&self) -> Option<CaptureMode> {
        if !self.capturing.load(Ordering::SeqCst) {
            return None;
        }
        let me = std::thread::current().id();
        self.lock().capture.filter(|(_, owner)| *owner == me).map(|(mode, _)| mode)
    }

    /// Marks the capture in progress, which must be this thread's, as capturing the body of a
    /// conditional node until the guard drops; `fold` for a WHILE body whose condition a
    /// kernel of the body may set (see [`LoopFold`]).
    pub(crate) fn enter_body(&self, fold: Option<LoopFold>) -> Result<Body<'_>> {
        let me = std::thread::current().id();
        let mut st = self.lock();
        if !st.capture.is_some_and(|(_, owner)| owner == me) {
            return Err(Error::NotCapturing { graph: "this device's stream".into() });
        }
        st.bodies.push(fold);
        Ok(Body { gate: self })
    }

    /// Whether this thread is capturing the body of a conditional node.
    pub(crate) fn in_body(&self) -> bool {
        if !self.capturing.load(Ordering::SeqCst) {
            return false;
        }
        let me = std::thread::current().id();
        let st = self.lock();
        !st.bodies.is_empty() && st.capture.is_some_and(|(_, owner)| owner == me)
    }

    /// The conditional handle of the WHILE node whose body this thread captures right now
    /// (the innermost body, not one nested in it) when that node tests `flag` (a device
    /// address) for nonzero and may be set by a kernel of the body: `None` otherwise.
    pub(crate) fn loop_fold(&self, flag: u64) -> Option<u64> {
        if !self.capturing.load(Ordering::SeqCst) {
            return None;
        }
        let me = std::thread::current().id();
        let st = self.lock();
        if !st.capture.is_some_and(|(_, owner)| owner == me) {
            return None;
        }
        st.bodies.last().copied().flatten().filter(|f| f.flag == flag).map(|f| f.handle)
    }

    /// Records that kernel node `node` (by address) of the innermost body set its WHILE
    /// node's condition (after [`StreamGate::loop_fold`] gave the handle).
    pub(crate) fn set_loop_fold(&self, node: usize) {
        if let Some(Some(f)) = self.lock().bodies.last_mut() {
            f.set_by = Some(node);
        }
    }

    /// The kernel node that last set the innermost body's WHILE condition, if one did.
    pub(crate) fn loop_fold_node(&self) -> Option<usize> {
        self.lock().bodies.last().copied().flatten().and_then(|f| f.set_by)
    }

    /// Marks the stream as capturing for this thread, once no other thread is inside a
    /// primitive; `start` begins the backend's own capture while the gate is held.
    pub(crate) fn begin(&self, mode: CaptureMode, start: impl FnOnce() -> Result<()>) -> Result<()> {
        let me = std::thread::current().id();
        let st = self.lock();
        if st.capture.is_some_and(|(_, owner)| owner == me) {
            return Err(Error::AlreadyCapturing { graph: "this device's stream".into() });
        }
        let mut st = self
            .wait_until(st, "another thread's capture to end", |_, s| s.capture.is_none() && s.beginning.is_none())?;
        st.beginning = Some(me);
        self.capturing.store(true, Ordering::SeqCst);
        let drained =
            self.wait_until(st, "other threads' work to leave the stream", |g, _| g.inside.load(Ordering::SeqCst) == 0);
        let mut st = match drained {
            Ok(st) => st,
            Err(e) => {
                self.abandon_begin();
                return Err(e);
            }
        };
        st.beginning = None;
        // A `start` that fails or panics leaves no capture behind: `capturing` set with no
        // capture would make every other thread's primitive spin in `enter`.
        let started = std::panic::catch_unwind(std::panic::AssertUnwindSafe(start));
        if !matches!(started, Ok(Ok(()))) {
            self.capturing.store(false, Ordering::SeqCst);
            drop(st);
            self.changed.notify_all();
            return match started {
                Ok(r) => r,
                Err(panic) => std::panic::resume_unwind(panic),
            };
        }
        st.capture = Some((mode, me));
        CAPTURES.with(|c| c.set(c.get() + 1));
        Ok(())
    }

    fn abandon_begin(&self) {
        let mut st = self.lock();
        st.beginning = None;
        self.capturing.store(st.capture.is_some(), Ordering::SeqCst);
        drop(st);
        self.changed.notify_all();
    }

    /// Ends this thread's capture; `finish` ends the backend's capture while the gate is held.
    /// The stream is out of capture mode afterwards whatever `finish` returns.
    pub(crate) fn end<R>(&self, finish: impl FnOnce() -> Result<R>) -> Result<R> {
        let me = std::thread::current().id();
        let mut st = self.lock();
        if !st.capture.is_some_and(|(_, owner)| owner == me) {
            return Err(Error::NotCapturing { graph: "this device's stream".into() });
        }
        if !st.bodies.is_empty() {
            return Err(Error::IllegalInConditionalBody { op: "ending the capture" });
        }
        let failed_branch = std::mem::take(&mut st.failed_branch);
        // The stream leaves capture mode however `finish` ends, a panic included.
        let out = std::panic::catch_unwind(std::panic::AssertUnwindSafe(finish));
        st.capture = None;
        self.capturing.store(false, Ordering::SeqCst);
        CAPTURES.with(|c| c.set(c.get().saturating_sub(1)));
        drop(st);
        self.changed.notify_all();
        let out = out.unwrap_or_else(|panic| std::panic::resume_unwind(panic));
        match (out, failed_branch) {
            (Ok(_), true) => Err(Error::CaptureInvalidated { cause: Invalidation::FailedConditionalBranch }),
            (out, _) => out,
        }
    }

    /// Marks the capture in progress as ending discarded (a conditional branch failed on CUDA).
    pub(crate) fn fail_branch(&self) {
        self.lock().failed_branch = true;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;
    use std::time::Duration;

    /// A thread inside a primitive that enters again (a copy that synchronizes) must pass
    /// while another thread waits to begin a capture: the nested entry cannot wait for a
    /// capture that waits for it.
    #[test]
    fn a_nested_entry_passes_while_a_capture_waits_to_begin() {
        let gate = StreamGate::default();
        let (inside_tx, inside_rx) = mpsc::channel();
        let (nested_tx, nested_rx) = mpsc::channel();
        std::thread::scope(|s| {
            s.spawn(|| {
                let outer = gate.enter().expect("outer");
                inside_tx.send(()).expect("send");
                // Give the other thread time to start waiting in `begin`.
                std::thread::sleep(Duration::from_millis(50));
                let nested = gate.enter().expect("nested");
                nested_tx.send(()).expect("send");
                drop(nested);
                drop(outer);
            });
            inside_rx.recv().expect("inside");
            let begun = s.spawn(|| gate.begin(CaptureMode::ThreadLocal, || Ok(())));
            nested_rx.recv_timeout(Duration::from_secs(10)).expect("the nested entry passed");
            begun.join().expect("begin").expect("the capture began once the other thread left");
            gate.end(|| Ok(())).expect_err("end belongs to the capturing thread");
        });
    }

    /// A capture whose start or finish panics leaves the gate open: other threads pass, and
    /// the panicking thread may capture again.
    #[test]
    fn a_panic_in_begin_or_end_leaves_the_gate_open() {
        let gate = StreamGate::default();
        let begun = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            gate.begin(CaptureMode::Global, || panic!("the backend's start panicked"))
        }));
        assert!(begun.is_err(), "the panic goes on");
        assert!(!gate.capturing.load(Ordering::SeqCst));
        std::thread::scope(|s| {
            let passed = s.spawn(|| gate.try_enter().map(drop).is_some()).join().expect("thread");
            assert!(passed, "another thread passes at once");
        });
        gate.begin(CaptureMode::Global, || Ok(())).expect("begin again");
        let ended = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            gate.end(|| -> Result<()> { panic!("the backend's finish panicked") })
        }));
        assert!(ended.is_err(), "the panic goes on");
        assert_eq!(gate.my_capture(), None, "the stream left capture mode");
        assert!(!is_capturing());
        std::thread::scope(|s| {
            let passed = s.spawn(|| gate.try_enter().map(drop).is_some()).join().expect("thread");
            assert!(passed, "another thread passes at once");
        });
    }

    #[test]
    fn the_capturing_thread_passes_and_others_wait() {
        let gate = StreamGate::default();
        gate.begin(CaptureMode::Global, || Ok(())).expect("begin");
        assert_eq!(gate.my_capture(), Some(CaptureMode::Global));
        drop(gate.enter().expect("the owner passes"));
        std::thread::scope(|s| {
            let other = s.spawn(|| {
                assert_eq!(gate.my_capture(), None);
                let t = Instant::now();
                drop(gate.enter().expect("passes after the capture ends"));
                t.elapsed()
            });
            std::thread::sleep(Duration::from_millis(50));
            gate.end(|| Ok(())).expect("end");
            assert!(other.join().expect("other") >= Duration::from_millis(40), "it waited");
        });
    }

    /// A WHILE body whose node may be set by one of its kernels gives its handle for its own
    /// flag only, only to the capturing thread, and not from a body nested in it; the node
    /// that set it is the innermost body's, and leaving the body forgets it.
    #[test]
    fn a_loop_fold_is_the_innermost_bodys_and_its_flags_only() {
        let gate = StreamGate::default();
        let fold = LoopFold { handle: 7, flag: 0x1000, set_by: None };
        assert_eq!(gate.loop_fold(0x1000), None, "no capture");
        gate.begin(CaptureMode::Global, || Ok(())).expect("begin");
        assert_eq!(gate.loop_fold(0x1000), None, "no body");
        {
            let _body = gate.enter_body(Some(fold)).expect("body");
            assert_eq!(gate.loop_fold(0x1000), Some(7));
            assert_eq!(gate.loop_fold(0x2000), None, "another flag");
            std::thread::scope(|s| {
                assert_eq!(s.spawn(|| gate.loop_fold(0x1000)).join().expect("thread"), None, "another thread");
            });
            assert_eq!(gate.loop_fold_node(), None);
            {
                let _nested = gate.enter_body(None).expect("an IF body inside");
                assert_eq!(gate.loop_fold(0x1000), None, "a nested body");
                gate.set_loop_fold(99);
                assert_eq!(gate.loop_fold_node(), None, "recorded nowhere");
            }
            gate.set_loop_fold(42);
            gate.set_loop_fold(43);
            assert_eq!(gate.loop_fold_node(), Some(43), "the last kernel that set it");
            gate.end(|| Ok(())).expect_err("not from inside a body");
        }
        assert_eq!((gate.loop_fold(0x1000), gate.loop_fold_node()), (None, None), "left the body");
        gate.end(|| Ok(())).expect("end");
    }
}
