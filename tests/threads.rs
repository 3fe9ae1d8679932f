//! One device driven from two threads at once: eager ops (GEMMs included) on one thread while
//! the other captures and replays graphs in thread-local mode. Nothing of one thread may land
//! in the other's graph, and every result must be right.

mod common;

use common::{on_each_backend, random, rel_err};
use std::sync::atomic::{AtomicBool, Ordering};

use graphed::{ops, CaptureMode, Device, Graph, NodeKind, Result, Tensor};

fn assert_send_sync<T: Send + Sync>() {}

#[test]
fn device_and_tensors_are_send_and_sync() {
    assert_send_sync::<Device>();
    assert_send_sync::<Tensor>();
}

const ROUNDS: usize = 40;

/// Captures `y = 2 * x + y` style work repeatedly and checks the graph and its replay.
fn capturing_thread(dev: &Device) -> Result<()> {
    let x = random(dev, &[256], 1)?;
    let want_x = x.to_vec()?;
    for round in 0..ROUNDS {
        let y = Tensor::zeros(dev, &[256])?;
        let mut g = Graph::new(dev);
        // Grow the graph's pool before capturing so no allocation happens inside.
        g.capture(CaptureMode::ThreadLocal, || {
            ops::axpy_(&y, 2.0, &x)?;
            // Hold the capture open long enough for the other thread to try to run work.
            std::thread::sleep(std::time::Duration::from_millis(2));
            ops::scale_(&y, 0.5)
        })?;
        let kernels = g.nodes()?.iter().filter(|n| n.kind == NodeKind::Kernel).count();
        assert_eq!(kernels, 2, "round {round}: only this thread's two kernels are in the graph");
        g.replay()?;
        g.replay()?;
        let want: Vec<f32> = want_x.iter().map(|v| ((2.0 * v) * 0.5 + 2.0 * v) * 0.5).collect();
        assert_eq!(y.to_vec()?, want, "round {round}: replays");
    }
    Ok(())
}

/// Sets its flag when dropped, on unwinding too.
struct Done<'a>(&'a AtomicBool);

impl Drop for Done<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Release);
    }
}

/// Eager GEMMs and elementwise ops, checked against the CPU reference, until `done`.
fn eager_thread(dev: &Device, done: &AtomicBool) -> Result<()> {
    let (m, k, n) = (16, 32, 24);
    let mut round = 0;
    // The capturing thread takes seconds; a loop still running after minutes means it never
    // said it was done: fail with that, instead of hanging the suite.
    let start = std::time::Instant::now();
    while !done.load(Ordering::Acquire) || round < ROUNDS {
        assert!(
            start.elapsed() < std::time::Duration::from_secs(300),
            "eager thread: no stop after 300 s (round {round})"
        );
        round += 1;
        let a = random(dev, &[m, k], 10 + round as u64)?;
        let w = random(dev, &[n, k], 20 + round as u64)?;
        let y = ops::linear(&a, &w, None)?;
        let want = ops::cpu::linear(&a.to_vec()?, &w.to_vec()?, None, m, k, n);
        assert!(rel_err(&y.to_vec()?, &want) < 1e-5, "round {round}: linear");
        let s = ops::add(&y, &y)?;
        let twice: Vec<f32> = y.to_vec()?.iter().map(|v| v + v).collect();
        assert_eq!(s.to_vec()?, twice, "round {round}: add");
    }
    Ok(())
}

#[test]
fn one_device_from_two_threads_at_once() {
    on_each_backend(|dev| {
        let done = AtomicBool::new(false);
        std::thread::scope(|s| {
            let b = s.spawn(|| eager_thread(dev, &done));
            // The eager thread stops once `done` is set, which a failed assertion in the
            // capturing thread must do too: unwinding, the scope waits for the eager thread.
            let stop = Done(&done);
            let a = capturing_thread(dev);
            drop(stop);
            let b = b.join().expect("eager thread");
            a.and(b)
        })?;
        assert!(dev.take_drop_errors().is_empty());
        Ok(())
    });
}

#[test]
fn two_threads_capture_in_turn() {
    on_each_backend(|dev| {
        std::thread::scope(|s| {
            let a = s.spawn(|| capturing_thread(dev));
            let b = s.spawn(|| capturing_thread(dev));
            a.join().expect("thread a").and(b.join().expect("thread b"))
        })
    });
}
