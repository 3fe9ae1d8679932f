//! Runtime foundation: graphs, pools, capture modes, scoped capture, illegal ops, RNG.
//! Every behaviour runs on each available backend (host always, CUDA when a GPU is usable).

mod common;

use common::{on_each_backend, random};
use graphed::{ops, CaptureMode, CudaVersion, Device, Error, Generator, Graph, NodeKind, Result, Tensor};

/// y = 2x + y, then y *= 0.5, as the captured work.
fn work(y: &Tensor, x: &Tensor) -> Result<()> {
    ops::axpy_(y, 2.0, x)?;
    ops::scale_(y, 0.5)
}

#[test]
fn capture_then_replay_equals_eager() {
    on_each_backend(|dev| {
        let x = random(dev, &[1000], 1)?;
        let y_eager = random(dev, &[1000], 2)?;
        let y_graph = y_eager.deep_clone()?;
        let mut g = Graph::new(dev);
        g.capture(CaptureMode::Global, || work(&y_graph, &x))?;
        for _ in 0..3 {
            work(&y_eager, &x)?;
            g.replay()?;
        }
        assert_eq!(y_eager.to_vec()?, y_graph.to_vec()?, "replay must equal eager bitwise");
        Ok(())
    });
}

#[test]
fn replay_sees_new_input_values() {
    on_each_backend(|dev| {
        let x = random(dev, &[300], 3)?;
        let y = Tensor::zeros(dev, &[300])?;
        let mut g = Graph::new(dev);
        g.capture(CaptureMode::Global, || ops::axpy_(&y, 1.0, &x))?;
        g.replay()?;
        let first = y.to_vec()?;
        x.copy_from_slice(&vec![1.0; 300])?;
        g.replay()?;
        let second = y.to_vec()?;
        for (a, b) in first.iter().zip(&second) {
            assert_eq!(*b, a + 1.0);
        }
        Ok(())
    });
}

#[test]
fn reset_then_recapture() {
    on_each_backend(|dev| {
        let y = Tensor::zeros(dev, &[10])?;
        let mut g = Graph::new(dev);
        g.capture(CaptureMode::Global, || ops::fill_(&y, 1.0))?;
        assert!(matches!(g.capture(CaptureMode::Global, || ops::fill_(&y, 3.0)), Err(Error::AlreadyCaptured { .. })));
        g.replay()?;
        assert_eq!(y.to_vec()?, vec![1.0; 10]);
        g.reset()?;
        assert!(!g.is_captured());
        assert!(matches!(g.replay(), Err(Error::NotCaptured { .. })));
        g.capture(CaptureMode::Global, || ops::fill_(&y, 2.0))?;
        g.replay()?;
        assert_eq!(y.to_vec()?, vec![2.0; 10]);
        Ok(())
    });
}

#[test]
fn two_graphs_share_a_pool_and_must_replay_in_capture_order() {
    on_each_backend(|dev| {
        let pool = dev.new_pool();
        let x = random(dev, &[4096], 4)?;
        let out_a = Tensor::zeros(dev, &[4096])?;
        let out_b = Tensor::zeros(dev, &[4096])?;
        let mut a = Graph::with_pool(dev, &pool);
        let mut b = Graph::with_pool(dev, &pool);
        // Graph A uses a temporary and frees it; graph B's temporary reuses that block.
        a.capture(CaptureMode::Global, || {
            let t = x.deep_clone()?;
            ops::scale_(&t, 3.0)?;
            out_a.copy_(&t)
        })?;
        let after_a = pool.stats();
        b.capture(CaptureMode::Global, || {
            let t = x.deep_clone()?;
            ops::scale_(&t, 5.0)?;
            out_b.copy_(&t)
        })?;
        assert_eq!(pool.stats().reserved, after_a.reserved, "B must reuse the block A freed");
        assert_eq!(pool.stats().in_use, 0);
        a.replay()?;
        b.replay()?;
        a.replay()?;
        b.replay()?;
        let xs = x.to_vec()?;
        assert_eq!(out_a.to_vec()?, xs.iter().map(|v| v * 3.0).collect::<Vec<_>>());
        assert_eq!(out_b.to_vec()?, xs.iter().map(|v| v * 5.0).collect::<Vec<_>>());
        // B twice in a row diverges from the capture order: an error, not a silent overwrite.
        let err = b.replay().unwrap_err();
        assert!(matches!(err, Error::ReplayOrder { .. }), "{err}");
        // Starting the cycle again at A is allowed.
        a.replay()?;
        b.replay()?;
        Ok(())
    });
}

#[test]
fn every_capture_mode_captures() {
    on_each_backend(|dev| {
        for mode in [CaptureMode::Global, CaptureMode::ThreadLocal, CaptureMode::Relaxed] {
            let x = random(dev, &[777], 5)?;
            let y = Tensor::zeros(dev, &[777])?;
            let mut g = Graph::new(dev);
            g.capture(mode, || {
                // Allocating inside the capture exercises pool growth under each mode.
                let t = x.deep_clone()?;
                ops::axpy_(&y, 1.0, &t)
            })?;
            g.replay()?;
            g.replay()?;
            let want: Vec<f32> = x.to_vec()?.iter().map(|v| v + v).collect();
            assert_eq!(y.to_vec()?, want, "{mode:?}");
        }
        Ok(())
    });
}

#[test]
fn scoped_capture_ends_on_error_and_on_panic() {
    on_each_backend(|dev| {
        let y = Tensor::zeros(dev, &[64])?;
        let mut g = Graph::new(dev);
        let err = g.capture(CaptureMode::Global, || -> Result<()> {
            ops::fill_(&y, 1.0)?;
            Err(Error::msg("user code failed"))
        });
        assert_eq!(err.unwrap_err().to_string(), "user code failed");
        assert!(!dev.is_capturing());
        assert!(!graphed::is_capturing());
        assert!(!g.is_captured());

        let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let _ = g.capture(CaptureMode::Global, || -> Result<()> {
                ops::fill_(&y, 1.0)?;
                panic!("boom inside capture")
            });
        }));
        assert!(panicked.is_err());
        assert!(!dev.is_capturing());

        // The stream is usable: eager work runs and the graph can capture again.
        ops::fill_(&y, 7.0)?;
        assert_eq!(y.to_vec()?, vec![7.0; 64]);
        g.capture(CaptureMode::Global, || ops::fill_(&y, 2.0))?;
        g.replay()?;
        assert_eq!(y.to_vec()?, vec![2.0; 64]);
        Ok(())
    });
}

#[test]
fn illegal_operations_during_capture_are_typed_errors() {
    on_each_backend(|dev| {
        let y = Tensor::zeros(dev, &[8])?;
        let mut g = Graph::new(dev);
        let e = g.capture(CaptureMode::Global, || dev.synchronize()).unwrap_err();
        assert!(matches!(e, Error::IllegalDuringCapture { op: "synchronize" }), "{e}");
        let e = g.capture(CaptureMode::Global, || y.to_vec().map(|_| ())).unwrap_err();
        assert!(matches!(e, Error::IllegalDuringCapture { .. }), "{e}");
        let e = g.capture(CaptureMode::Global, || y.copy_from_slice(&[1.0; 8])).unwrap_err();
        assert!(matches!(e, Error::IllegalDuringCapture { .. }), "{e}");
        let e = g.capture(CaptureMode::Global, || Tensor::from_slice(dev, &[1.0], &[1]).map(|_| ())).unwrap_err();
        assert!(matches!(e, Error::IllegalDuringCapture { .. }), "{e}");
        assert!(!dev.is_capturing());
        ops::fill_(&y, 3.0)?;
        assert_eq!(y.to_vec()?, vec![3.0; 8]);
        Ok(())
    });
}

#[test]
fn nodes_dot_and_keep_graph() {
    on_each_backend(|dev| {
        let x = random(dev, &[100], 6)?;
        let y = Tensor::zeros(dev, &[100])?;
        let mut g = Graph::new(dev);
        g.set_keep_graph(true);
        g.capture(CaptureMode::Global, || work(&y, &x))?;
        let nodes = g.nodes()?;
        let kernels: Vec<_> =
            nodes.iter().filter(|n| n.kind == NodeKind::Kernel).filter_map(|n| n.kernel.clone()).collect();
        assert_eq!(kernels, vec!["axpy_f32".to_string(), "scale_f32".to_string()]);
        let scale = nodes.iter().find(|n| n.kernel.as_deref() == Some("scale_f32")).expect("scale node");
        let axpy = nodes.iter().find(|n| n.kernel.as_deref() == Some("axpy_f32")).expect("axpy node");
        assert_eq!(scale.dependencies, vec![axpy.index]);
        let dot = g.to_dot()?;
        assert!(dot.contains("axpy_f32") && dot.contains("->"), "{dot}");
        let path = std::env::temp_dir().join(format!("graphed-dump-{}.dot", std::process::id()));
        g.debug_dump(&path)?;
        assert!(std::fs::metadata(&path).map(|m| m.len() > 0).unwrap_or(false));
        let _ = std::fs::remove_file(&path);
        g.instantiate()?;
        g.replay()?;
        let want: Vec<f32> = x.to_vec()?.iter().map(|v| (2.0 * v) * 0.5).collect();
        assert_eq!(y.to_vec()?, want);
        Ok(())
    });
}

#[test]
fn rng_draws_fresh_numbers_per_replay_and_repeats_after_restore() {
    on_each_backend(|dev| {
        let rng = Generator::new(dev, 1234)?;
        let out = Tensor::zeros(dev, &[1000])?;
        let saved = rng.save()?;
        let mut g = Graph::new(dev);
        g.capture(CaptureMode::Global, || rng.uniform_(&out))?;
        g.replay()?;
        let a = out.to_vec()?;
        g.replay()?;
        let b = out.to_vec()?;
        assert_ne!(a, b, "each replay must draw fresh numbers");
        assert!(a.iter().all(|v| (0.0..1.0).contains(v)));
        let mean = a.iter().sum::<f32>() / a.len() as f32;
        assert!((mean - 0.5).abs() < 0.05, "mean {mean}");
        rng.restore(&saved)?;
        g.replay()?;
        assert_eq!(out.to_vec()?, a, "restoring the state must repeat the draw");
        assert_eq!(rng.seed_and_offset()?, (1234, 1000));

        // Save and restore inside a capture: the graph redraws the same numbers each replay.
        let twice = Tensor::zeros(dev, &[2, 500])?;
        let first = twice.reshape(&[1000])?;
        let mut g2 = Graph::new(dev);
        let slot = rng.save()?;
        let second = Tensor::zeros(dev, &[1000])?;
        g2.capture(CaptureMode::Global, || {
            rng.save_into(&slot)?;
            rng.uniform_(&first)?;
            rng.restore(&slot)?;
            rng.uniform_(&second)
        })?;
        g2.replay()?;
        let (p, q) = (first.to_vec()?, second.to_vec()?);
        assert_eq!(p, q);
        g2.replay()?;
        assert_ne!(first.to_vec()?, p, "replays still advance the generator");
        Ok(())
    });
}

#[test]
fn host_and_cuda_draw_identical_numbers() {
    let host = Device::host();
    let gh = Generator::new(&host, 99).unwrap();
    let th = Tensor::zeros(&host, &[513]).unwrap();
    gh.uniform_(&th).unwrap();
    let want = th.to_vec().unwrap();
    for b in common::backends() {
        let gd = Generator::new(&b.device, 99).unwrap();
        let td = Tensor::zeros(&b.device, &[513]).unwrap();
        gd.uniform_(&td).unwrap();
        assert_eq!(td.to_vec().unwrap(), want, "on {}", b.device.name());
    }
}

#[test]
fn default_device_never_panics_and_cuda_errors_cleanly_without_gpu() {
    let dev = Device::default_device();
    assert!(!dev.name().is_empty());
    if let Err(e) = Device::cuda(64) {
        assert!(matches!(e, Error::CudaUnavailable { .. }), "{e}");
    }
}

#[test]
fn capabilities_report_the_driver_on_each_backend() {
    for b in common::backends() {
        let caps = b.device.capabilities();
        if b.device.is_host() {
            assert_eq!(caps, Device::host().capabilities());
            assert_eq!(caps.driver, None);
            assert!(!caps.conditional_nodes && !caps.cublas_lt && caps.nccl.is_none());
        } else {
            let driver = caps.driver.expect("a CUDA device knows its driver's version");
            assert!(driver >= CudaVersion::MIN_DRIVER, "{caps}");
            assert_eq!(caps.conditional_nodes, driver >= CudaVersion::CONDITIONAL_NODES);
            eprintln!("{}: {caps}", b.device.name());
        }
    }
}

#[test]
fn pool_reports_bytes_and_reuses_blocks() {
    on_each_backend(|dev| {
        let pool = dev.new_pool();
        let (a, b) =
            dev.with_pool(&pool, || -> Result<_> { Ok((Tensor::zeros(dev, &[1000])?, Tensor::zeros(dev, &[10])?)) })?;
        let st = pool.stats();
        assert_eq!(st.in_use, 4096 + 256);
        assert!(st.reserved >= st.in_use);
        drop(a);
        let c = dev.with_pool(&pool, || Tensor::zeros(dev, &[900]))?;
        assert_eq!(pool.stats().reserved, st.reserved, "the freed block is reused");
        drop((b, c));
        assert_eq!(pool.stats().in_use, 0);
        Ok(())
    });
}
