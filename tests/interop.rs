//! cudarc interop (#11): the device's context and stream, device pointers, tensors over a
//! `CudaSlice`, and a kernel the test launches itself through cudarc inside a `#[graphed]`
//! module, captured and replayed == eager. The cudarc half only runs on a CUDA device.

mod common;

use std::sync::Arc;

use common::{on_each_backend, random};
use graphed::interop::cudarc::driver::{CudaFunction, LaunchConfig, PushKernelArg};
use graphed::interop::cudarc::nvrtc::compile_ptx;
use graphed::{graphed, ops, CaptureMode, Cx, Device, Error, Graph, Result, Tensor};

const SOURCE: &str = r#"
extern "C" __global__ void shift_scale(float* y, const float* x, const float* b, float a, unsigned n) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + b[i];
}
extern "C" __global__ void scale_only(float* dx, const float* dy, float a, unsigned n) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) dx[i] = a * dy[i];
}
"#;

/// `y = a * x + b`, forward and backward launched by the test itself through cudarc.
struct Affine {
    b: Tensor,
    a: f32,
    forward_fn: Arc<CudaFunction>,
    backward_fn: Arc<CudaFunction>,
}

fn launch(f: &CudaFunction, out: &Tensor, ins: &[&Tensor], a: f32) -> Result<()> {
    let stream = out.device().cuda_stream().ok_or_else(|| Error::msg("not a CUDA device"))?;
    let n = out.numel() as u32;
    let out_ptr = out.cuda_device_ptr()?;
    let in_ptrs = ins.iter().map(|t| t.cuda_device_ptr()).collect::<Result<Vec<u64>>>()?;
    let mut builder = stream.launch_builder(f);
    builder.arg(&out_ptr);
    for p in &in_ptrs {
        builder.arg(p);
    }
    builder.arg(&a).arg(&n);
    let cfg = LaunchConfig::for_num_elems(n);
    // SAFETY: the argument list matches the kernel's parameters, every pointer is a live
    // tensor of `n` floats on this device, and the launch goes to the device's own stream.
    unsafe { builder.launch(cfg) }.map_err(|e| Error::msg(format!("{e:?}")))?;
    Ok(())
}

#[graphed(warmup = 2)]
impl Affine {
    fn forward(&self, _cx: &mut Cx, x: &Tensor) -> Result<Tensor> {
        let y = Tensor::empty_like(x)?;
        launch(&self.forward_fn, &y, &[x, &self.b], self.a)?;
        Ok(y)
    }

    fn backward(&mut self, _cx: &mut Cx, dy: &Tensor) -> Result<Option<Tensor>> {
        let dx = Tensor::empty_like(dy)?;
        launch(&self.backward_fn, &dx, &[dy], self.a)?;
        Ok(Some(dx))
    }
}

const N: usize = 1000;

fn affine(dev: &Device) -> Result<Affine> {
    let ctx = dev.cuda_context().ok_or_else(|| Error::msg("not a CUDA device"))?;
    let stream = dev.cuda_stream().ok_or_else(|| Error::msg("not a CUDA device"))?;
    let module = ctx.load_module(compile_ptx(SOURCE).map_err(|e| Error::msg(format!("{e:?}")))?);
    let module = module.map_err(|e| Error::msg(format!("{e:?}")))?;
    let load = |name| module.load_function(name).map(Arc::new).map_err(|e| Error::msg(format!("{e:?}")));
    // The bias is a tensor over a slice the test uploaded itself through cudarc.
    let bias = stream.clone_htod(&common::random_vec(N, 3)).map_err(|e| Error::msg(format!("{e:?}")))?;
    let b = Tensor::from_cuda_slice(dev, bias, &[N])?;
    Ok(Affine { b, a: 1.5, forward_fn: load("shift_scale")?, backward_fn: load("scale_only")? })
}

fn steps(dev: &Device, graphed: bool) -> Result<Vec<Vec<u32>>> {
    let module = affine(dev)?;
    let mut out = Vec::new();
    let (mut g, mut eager) = if graphed {
        (Some(module.make_graphed(&Tensor::zeros(dev, &[N])?.with_requires_grad(true))?), None)
    } else {
        (None, Some(module))
    };
    for step in 0..3 {
        let mut cx = Cx::new(dev);
        let x = random(dev, &[N], 10 + step)?.with_requires_grad(true);
        let dy = random(dev, &[N], 20 + step)?;
        let (y, dx) = match (&mut g, &mut eager) {
            (Some(g), _) => (g.forward(&x)?.to_vec()?, g.backward(&dy)?),
            (_, Some(m)) => (m.forward(&mut cx, &x)?.to_vec()?, m.backward(&mut cx, &dy)?),
            _ => unreachable!(),
        };
        out.push(y.iter().map(|v| v.to_bits()).collect());
        let dx = dx.ok_or_else(|| Error::msg("dx is needed"))?.to_vec()?;
        out.push(dx.iter().map(|v| v.to_bits()).collect());
    }
    Ok(out)
}

#[test]
fn a_kernel_launched_through_cudarc_is_captured_and_replays_like_eager() {
    on_each_backend(|dev| {
        if dev.is_host() {
            common::say_skipped("note: cudarc interop needs a CUDA device; skipped on the host");
            return Ok(());
        }
        let eager = steps(dev, false)?;
        let graphed = steps(dev, true)?;
        assert_eq!(eager, graphed);
        // And the numbers are right: y = 1.5 x + b for step 0.
        let (x, b) = (common::random_vec(N, 10), common::random_vec(N, 3));
        let want: Vec<f32> = (0..N).map(|i| 1.5 * x[i] + b[i]).collect();
        let got: Vec<f32> = eager[0].iter().map(|v| f32::from_bits(*v)).collect();
        assert!(common::rel_err(&got, &want) < 1e-6);
        Ok(())
    });
}

#[test]
fn context_stream_and_pointers_exist_exactly_on_cuda() {
    on_each_backend(|dev| {
        let t = random(dev, &[8], 1)?;
        assert_eq!(dev.cuda_context().is_some(), dev.is_cuda());
        assert_eq!(dev.cuda_stream().is_some(), dev.is_cuda());
        match t.cuda_device_ptr() {
            Ok(p) => assert!(dev.is_cuda() && p != 0),
            Err(e) => {
                assert!(dev.is_host() && matches!(e, Error::Interop { op: "Tensor::cuda_device_ptr", .. }), "{e}")
            }
        }
        if let (Some(stream), Some(ctx)) = (dev.cuda_stream(), dev.cuda_context()) {
            assert_eq!(ctx.ordinal(), 0);
            let slice = stream.clone_htod(&common::random_vec(6, 2)).map_err(|e| Error::msg(format!("{e:?}")))?;
            let e = Tensor::from_cuda_slice(dev, slice, &[4]).unwrap_err();
            assert!(matches!(e, Error::Shape { .. }), "{e}");
            let slice = stream.clone_htod(&common::random_vec(6, 2)).map_err(|e| Error::msg(format!("{e:?}")))?;
            let e = Tensor::from_cuda_slice(&Device::host(), slice, &[6]).unwrap_err();
            assert!(matches!(e, Error::Interop { .. }), "{e}");
            let slice = stream.clone_htod(&common::random_vec(6, 2)).map_err(|e| Error::msg(format!("{e:?}")))?;
            let wrapped = Tensor::from_cuda_slice(dev, slice, &[2, 3])?;
            assert_eq!(wrapped.to_vec()?, common::random_vec(6, 2));
            // Graphed ops work on it like on any tensor.
            let doubled = ops::scale(&wrapped, 2.0)?;
            let want: Vec<f32> = common::random_vec(6, 2).iter().map(|v| v * 2.0).collect();
            assert_eq!(doubled.to_vec()?, want);
        }
        Ok(())
    });
}

#[test]
fn a_wrapped_slice_dropped_during_a_capture_does_not_break_it() {
    on_each_backend(|dev| {
        let Some(stream) = dev.cuda_stream() else {
            common::say_skipped("note: cudarc interop needs a CUDA device; skipped on the host");
            return Ok(());
        };
        let slice = stream.clone_htod(&common::random_vec(6, 2)).map_err(|e| Error::msg(format!("{e:?}")))?;
        let mut held = Some(Tensor::from_cuda_slice(dev, slice, &[6])?);
        let y = Tensor::zeros(dev, &[6])?;
        let mut g = Graph::new(dev);
        // Freeing the slice here would invalidate the capture: it is parked instead.
        g.capture(CaptureMode::Global, || {
            drop(held.take());
            ops::fill_(&y, 1.5)
        })?;
        g.replay()?;
        assert_eq!(y.to_vec()?, vec![1.5; 6]);
        // The parked slice is freed at the next chance, outside the capture.
        let slice = stream.clone_htod(&common::random_vec(6, 3)).map_err(|e| Error::msg(format!("{e:?}")))?;
        drop(Tensor::from_cuda_slice(dev, slice, &[6])?);
        dev.synchronize()?;
        Ok(())
    });
}
