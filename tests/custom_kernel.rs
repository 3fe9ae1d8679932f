//! Custom kernels (#11) on each backend: captured == eager bit for bit inside a `#[graphed]`
//! module and a raw graph, typed launch errors, the warm-up rule, host-implementation failures,
//! NVRTC errors with their log, and the device-vs-host check.

mod common;

use std::sync::LazyLock;

use common::{on_each_backend, random};
use graphed::KernelArg::{In, InOut, Out, F32, U32};
use graphed::{
    check_kernel_against_host, graphed, Arg, CaptureMode, CheckArg, Cx, Device, Error, Graph, HostArgs, Kernel,
    KernelError, LaunchConfig, Param, Result, Tensor,
};

const SOURCE: &str = r#"
extern "C" __global__ void sqscale_fwd(float* y, const float* x, const float* w, unsigned n) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = w[i] * (x[i] * x[i]);
}
extern "C" __global__ void sqscale_bwd(float* dx, float* dw, const float* dy, const float* x, const float* w, unsigned n) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        dx[i] = (2.0f * w[i]) * (x[i] * dy[i]);
        dw[i] = dw[i] + dy[i] * (x[i] * x[i]);
    }
}
"#;

fn fwd_host(a: &HostArgs) -> Result<()> {
    let (x, w) = (a.input(1)?, a.input(2)?);
    for (i, y) in a.output(0)?.iter_mut().enumerate() {
        *y = w[i] * (x[i] * x[i]);
    }
    Ok(())
}

fn bwd_host(a: &HostArgs) -> Result<()> {
    let (dy, x, w) = (a.input(2)?, a.input(3)?, a.input(4)?);
    let (mut dx, mut dw) = (a.output(0)?, a.output(1)?);
    for i in 0..dx.len() {
        dx[i] = (2.0 * w[i]) * (x[i] * dy[i]);
        dw[i] += dy[i] * (x[i] * x[i]);
    }
    Ok(())
}

fn fwd_kernel() -> Kernel {
    let sig = [Arg::TensorOut, Arg::TensorIn, Arg::TensorIn, Arg::U32];
    Kernel::new("sqscale_fwd", SOURCE, &sig, fwd_host).expect("a valid declaration")
}

static FWD: LazyLock<Kernel> = LazyLock::new(fwd_kernel);
static BWD: LazyLock<Kernel> = LazyLock::new(|| {
    let sig = [Arg::TensorOut, Arg::TensorInOut, Arg::TensorIn, Arg::TensorIn, Arg::TensorIn, Arg::U32];
    Kernel::new("sqscale_bwd", SOURCE, &sig, bwd_host).expect("a valid declaration")
});

/// `y = w * x²` elementwise, forward and backward written as custom kernels.
struct SqScale {
    w: Param,
}

#[graphed(warmup = 2)]
impl SqScale {
    fn forward(&self, cx: &mut Cx, x: &Tensor) -> Result<Tensor> {
        let n = x.numel() as u32;
        let y = Tensor::empty_like(x)?;
        FWD.launch(LaunchConfig::for_elements(x.numel()), &[Out(&y), In(x), In(&self.w.value), U32(n)])?;
        cx.save(x);
        Ok(y)
    }

    fn backward(&mut self, cx: &mut Cx, dy: &Tensor) -> Result<Option<Tensor>> {
        let x = cx.saved(0)?;
        let dx = Tensor::empty_like(&x)?;
        let args = [Out(&dx), InOut(&self.w.grad), In(dy), In(&x), In(&self.w.value), U32(x.numel() as u32)];
        BWD.launch(LaunchConfig::for_elements(x.numel()), &args)?;
        Ok(cx.needs_input_grad(0).then_some(dx))
    }
}

const N: usize = 300;

/// Three steps, eager or graphed; every output, input grad and the final weight grad.
fn three_steps(dev: &Device, graphed: bool) -> Result<Vec<Vec<f32>>> {
    let module = SqScale { w: Param::new(random(dev, &[N], 1)?)? };
    let w_grad = module.w.grad.clone();
    let mut seen = Vec::new();
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
        seen.push(y);
        seen.push(dx.ok_or_else(|| Error::msg("dx is needed"))?.to_vec()?);
    }
    seen.push(w_grad.to_vec()?);
    Ok(seen)
}

fn bits(v: &[Vec<f32>]) -> Vec<Vec<u32>> {
    v.iter().map(|r| r.iter().map(|x| x.to_bits()).collect()).collect()
}

#[test]
fn graphed_module_with_custom_kernels_matches_eager_bitwise() {
    on_each_backend(|dev| {
        let eager = three_steps(dev, false)?;
        let graphed = three_steps(dev, true)?;
        assert_eq!(bits(&eager), bits(&graphed));
        // And the values are right (not just equal to each other): y = w·x² for step 0.
        let (w, x) = (common::random_vec(N, 1), common::random_vec(N, 10));
        let want: Vec<f32> = (0..N).map(|i| w[i] * (x[i] * x[i])).collect();
        assert!(common::rel_err(&eager[0], &want) < 1e-6);
        Ok(())
    });
}

#[test]
fn raw_capture_replays_like_eager() {
    on_each_backend(|dev| {
        let (x, w) = (random(dev, &[N], 3)?, random(dev, &[N], 4)?);
        let (eager, y) = (Tensor::zeros(dev, &[N])?, Tensor::zeros(dev, &[N])?);
        let cfg = LaunchConfig::for_elements(N);
        FWD.launch(cfg, &[Out(&eager), In(&x), In(&w), U32(N as u32)])?;
        let mut g = Graph::new(dev);
        g.capture(CaptureMode::Global, || FWD.launch(cfg, &[Out(&y), In(&x), In(&w), U32(N as u32)]))?;
        g.replay()?;
        assert_eq!(bits(&[y.to_vec()?]), bits(&[eager.to_vec()?]));
        // A replay re-reads the inputs: change x, replay, compare with a new eager launch.
        x.copy_from_slice(&common::random_vec(N, 5))?;
        g.replay()?;
        FWD.launch(cfg, &[Out(&eager), In(&x), In(&w), U32(N as u32)])?;
        assert_eq!(bits(&[y.to_vec()?]), bits(&[eager.to_vec()?]));
        Ok(())
    });
}

#[test]
fn wrong_argument_count_kind_or_device_is_a_typed_error_and_runs_nothing() {
    on_each_backend(|dev| {
        let (x, w, y) = (random(dev, &[N], 3)?, random(dev, &[N], 4)?, Tensor::full(dev, &[N], 7.0)?);
        let cfg = LaunchConfig::for_elements(N);
        let e = FWD.launch(cfg, &[Out(&y), In(&x), In(&w)]).unwrap_err();
        assert!(
            matches!(&e, Error::Kernel(KernelError::ArgCount { kernel, expected: 4, got: 3 }) if kernel == "sqscale_fwd"),
            "{e}"
        );
        let e = FWD.launch(cfg, &[Out(&y), In(&x), In(&w), F32(1.0)]).unwrap_err();
        assert!(
            matches!(&e, Error::Kernel(KernelError::ArgKind { position: 3, expected: Arg::U32, got: Arg::F32, .. })),
            "{e}"
        );
        let e = FWD.launch(cfg, &[In(&y), In(&x), In(&w), U32(N as u32)]).unwrap_err();
        assert!(
            matches!(
                &e,
                Error::Kernel(KernelError::ArgKind { position: 0, expected: Arg::TensorOut, got: Arg::TensorIn, .. })
            ),
            "{e}"
        );
        let elsewhere = random(&Device::host(), &[N], 4)?;
        let e = FWD.launch(cfg, &[Out(&y), In(&x), In(&elsewhere), U32(N as u32)]).unwrap_err();
        assert!(matches!(&e, Error::Kernel(KernelError::DeviceMismatch { position: 2, .. })), "{e}");
        let zero = LaunchConfig { grid: (0, 1, 1), ..cfg };
        let e = FWD.launch(zero, &[Out(&y), In(&x), In(&w), U32(N as u32)]).unwrap_err();
        assert!(matches!(&e, Error::Kernel(KernelError::ZeroLaunchDim { grid: (0, 1, 1), .. })), "{e}");
        assert_eq!(y.to_vec()?, vec![7.0; N], "a refused launch wrote nothing");
        Ok(())
    });
}

#[test]
fn first_use_inside_a_capture_asks_for_a_warm_up() {
    on_each_backend(|dev| {
        let fresh = fwd_kernel(); // its own cache: never used anywhere yet
        let (x, w, y) = (random(dev, &[N], 3)?, random(dev, &[N], 4)?, Tensor::zeros(dev, &[N])?);
        let args = [Out(&y), In(&x), In(&w), U32(N as u32)];
        let cfg = LaunchConfig::for_elements(N);
        let mut g = Graph::new(dev);
        let e = g.capture(CaptureMode::Global, || fresh.launch(cfg, &args)).unwrap_err();
        assert!(
            matches!(e.root(), Error::Kernel(KernelError::NotCompiled { kernel, .. }) if kernel == "sqscale_fwd"),
            "{e}"
        );
        assert!(!dev.is_capturing(), "the failed capture was ended");
        assert!(!fresh.is_compiled(dev));
        fresh.compile(dev)?;
        assert!(fresh.is_compiled(dev));
        let mut g = Graph::new(dev);
        g.capture(CaptureMode::Global, || fresh.launch(cfg, &args))?;
        g.replay()?;
        let (xv, wv) = (x.to_vec()?, w.to_vec()?);
        let want: Vec<f32> = (0..N).map(|i| wv[i] * (xv[i] * xv[i])).collect();
        assert!(common::rel_err(&y.to_vec()?, &want) < 1e-6);
        Ok(())
    });
}

fn panicking() -> Kernel {
    let sig = [Arg::TensorOut, Arg::TensorIn, Arg::TensorIn, Arg::U32];
    Kernel::new("sqscale_fwd", SOURCE, &sig, |a| {
        a.output(0)?[0] = 42.0; // half-written when it panics: must not reach the tensor
        panic!("the host implementation gave up at element {}", 1)
    })
    .expect("a valid declaration")
}

#[test]
fn a_panicking_host_implementation_is_an_error_and_leaves_outputs_unchanged() {
    on_each_backend(|dev| {
        let k = panicking();
        let (x, w, y) = (random(dev, &[N], 3)?, random(dev, &[N], 4)?, Tensor::full(dev, &[N], 7.0)?);
        let cfg = LaunchConfig::for_elements(N);
        let dims = [N];
        let t = CheckArg::Tensor(&dims);
        let e = check_kernel_against_host(&k, dev, cfg, &[t, t, t, CheckArg::U32(N as u32)], 1, 1e-6).unwrap_err();
        assert!(
            matches!(e.root(), Error::Kernel(KernelError::HostPanic { kernel, message }) if kernel == "sqscale_fwd" && message.contains("gave up at element 1")),
            "{e}"
        );
        if dev.is_host() {
            let e = k.launch(cfg, &[Out(&y), In(&x), In(&w), U32(N as u32)]).unwrap_err();
            assert!(matches!(&e, Error::Kernel(KernelError::HostPanic { .. })), "{e}");
            assert_eq!(y.to_vec()?, vec![7.0; N]);
            // Recorded into a graph, the panic surfaces at replay, again without writing.
            let mut g = Graph::new(dev);
            g.capture(CaptureMode::Global, || k.launch(cfg, &[Out(&y), In(&x), In(&w), U32(N as u32)]))?;
            let e = g.replay().unwrap_err();
            assert!(matches!(e.root(), Error::Kernel(KernelError::HostPanic { .. })), "{e}");
            assert_eq!(y.to_vec()?, vec![7.0; N]);
        }
        Ok(())
    });
}

#[test]
fn a_host_implementation_asking_for_the_wrong_kind_gets_a_typed_error() {
    on_each_backend(|dev| {
        let sig = [Arg::TensorOut, Arg::TensorIn, Arg::TensorIn, Arg::U32];
        let k = Kernel::new("sqscale_fwd", SOURCE, &sig, |a| {
            let _ = a.f32(3)?; // it is a u32
            Ok(())
        })?;
        let dims = [N];
        let t = CheckArg::Tensor(&dims);
        let cfg = LaunchConfig::for_elements(N);
        let e = check_kernel_against_host(&k, dev, cfg, &[t, t, t, CheckArg::U32(N as u32)], 1, 1e-6).unwrap_err();
        assert!(
            matches!(e.root(), Error::Kernel(KernelError::ArgKind { position: 3, expected: Arg::F32, got: Arg::U32, kernel }) if kernel == "sqscale_fwd"),
            "{e}"
        );
        Ok(())
    });
}

#[test]
fn the_device_kernel_agrees_with_its_host_implementation() {
    on_each_backend(|dev| {
        let dims = [1000];
        let t = CheckArg::Tensor(&dims);
        let cfg = LaunchConfig::for_elements(1000);
        let report = check_kernel_against_host(&FWD, dev, cfg, &[t, t, t, CheckArg::U32(1000)], 9, 1e-6)?;
        assert!(report.passed(), "{report}");
        assert_eq!(report.outputs.len(), 1);
        assert_eq!(report.outputs[0].position, 0);
        if dev.is_cuda() {
            // A host implementation that disagrees is caught (on the host both sides are it).
            let sig = [Arg::TensorOut, Arg::TensorIn, Arg::TensorIn, Arg::U32];
            let wrong = Kernel::new("sqscale_fwd", SOURCE, &sig, |a| {
                a.output(0)?.iter_mut().for_each(|y| *y = 0.5);
                Ok(())
            })?;
            let report = check_kernel_against_host(&wrong, dev, cfg, &[t, t, t, CheckArg::U32(1000)], 9, 1e-6)?;
            assert!(!report.passed(), "{report}");
        }
        Ok(())
    });
}

#[test]
fn nvrtc_errors_carry_the_compiler_log() {
    on_each_backend(|dev| {
        if dev.is_host() {
            common::say_skipped("note: NVRTC is only used on CUDA; the compile-error check is skipped on the host");
            return Ok(());
        }
        let broken = "extern \"C\" __global__ void broken(float* y) { y[0] = undeclared_name; }";
        let k = Kernel::new("broken", broken, &[Arg::TensorOut], |_| Ok(()))?;
        let e = k.compile(dev).unwrap_err();
        assert!(
            matches!(&e, Error::Kernel(KernelError::Compile { kernel, log, .. }) if kernel == "broken" && log.contains("undeclared_name")),
            "{e}"
        );
        let y = Tensor::zeros(dev, &[1])?;
        let e = k.launch(LaunchConfig::new(1, 1), &[Out(&y)]).unwrap_err();
        assert!(matches!(&e, Error::Kernel(KernelError::Compile { .. })), "{e}");
        // The entry is only in a comment: compiles, but has no such function.
        let k = Kernel::new(
            "absent",
            "// absent\nextern \"C\" __global__ void other(float* y) {}",
            &[Arg::TensorOut],
            |_| Ok(()),
        )?;
        let e = k.compile(dev).unwrap_err();
        assert!(matches!(&e, Error::Kernel(KernelError::Compile { log, .. }) if log.contains("absent")), "{e}");
        Ok(())
    });
}

#[test]
fn bad_declarations_are_refused() {
    let ok = |_: &HostArgs| Ok(());
    let e = Kernel::new("2fast", "extern \"C\" __global__ void 2fast(float* y) {}", &[Arg::TensorOut], ok).unwrap_err();
    assert!(matches!(&e, Error::Kernel(KernelError::EntryNotIdentifier { kernel }) if kernel == "2fast"), "{e}");
    let e = Kernel::new("f", "extern \"C\" __global__ void f(unsigned n) {}", &[Arg::U32], ok).unwrap_err();
    assert!(matches!(&e, Error::Kernel(KernelError::NoTensorArg { .. })), "{e}");
    let e = Kernel::new("g", "extern \"C\" __global__ void f(float* y) {}", &[Arg::TensorOut], ok).unwrap_err();
    assert!(matches!(&e, Error::Kernel(KernelError::EntryNotInSource { .. })), "{e}");
}

#[test]
fn a_stale_tensor_argument_is_refused() {
    on_each_backend(|dev| {
        let module = SqScale { w: Param::new(random(dev, &[N], 1)?)? };
        let mut g = module.make_graphed(&Tensor::zeros(dev, &[N])?.with_requires_grad(true))?;
        let x = random(dev, &[N], 2)?.with_requires_grad(true);
        let y0 = g.forward(&x)?;
        g.backward(&random(dev, &[N], 3)?)?;
        let _y1 = g.forward(&x)?; // overwrites y0's static buffer
        let (w, out) = (random(dev, &[N], 4)?, Tensor::full(dev, &[N], 7.0)?);
        let e = FWD.launch(LaunchConfig::for_elements(N), &[Out(&out), In(&y0), In(&w), U32(N as u32)]).unwrap_err();
        assert!(matches!(&e, Error::StaleTensor { .. }), "{e}");
        assert_eq!(out.to_vec()?, vec![7.0; N]);
        Ok(())
    });
}

#[test]
fn host_argument_misuse_is_an_error_not_a_panic() {
    on_each_backend(|dev| {
        let sig = [Arg::TensorOut, Arg::TensorIn, Arg::TensorIn, Arg::U32];
        let dims = [N];
        let t = CheckArg::Tensor(&dims);
        let args = [t, t, t, CheckArg::U32(N as u32)];
        let cfg = LaunchConfig::for_elements(N);
        let twice = Kernel::new("sqscale_fwd", SOURCE, &sig, |a| {
            let _first = a.output(0)?;
            let _second = a.output(0)?; // a second mutable borrow of the same output
            Ok(())
        })?;
        let e = check_kernel_against_host(&twice, dev, cfg, &args, 1, 1e-6).unwrap_err();
        assert!(matches!(e.root(), Error::Kernel(KernelError::ArgBorrowed { position: 0, .. })), "{e}");
        let out_of_range = Kernel::new("sqscale_fwd", SOURCE, &sig, |a| a.input(9).map(drop))?;
        let e = check_kernel_against_host(&out_of_range, dev, cfg, &args, 1, 1e-6).unwrap_err();
        assert!(matches!(e.root(), Error::Kernel(KernelError::ArgPosition { position: 9, count: 4, .. })), "{e}");
        let write_input = Kernel::new("sqscale_fwd", SOURCE, &sig, |a| a.output(1).map(drop))?;
        let e = check_kernel_against_host(&write_input, dev, cfg, &args, 1, 1e-6).unwrap_err();
        assert!(
            matches!(
                e.root(),
                Error::Kernel(KernelError::ArgKind { position: 1, expected: Arg::TensorOut, got: Arg::TensorIn, .. })
            ),
            "{e}"
        );
        Ok(())
    });
}
