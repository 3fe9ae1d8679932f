//! The misuse catalogue: every refused call changes nothing.
//!
//! Each case makes one wrong call at one point of a training step and asserts the error
//! variant; then the pool's bytes are checked unchanged, the same step continues with the
//! correct calls, and its results (outputs, input grads, parameter grads) must equal an eager
//! run of the same step bit for bit. Cases cover the type-erased `make_graphed` pipeline, the
//! raw `Graph`, the `#[graphed]` impl form and the struct form, on each backend, and requests
//! for more memory than a device or a pool's limit allows. Calls that fail part-way (faults,
//! not misuse) are swept in tests/faults.rs; malformed safetensors files are fuzzed in
//! tests/checkpoint_fuzz.rs; schedules that differ across ranks are in tests/dist_emulated.rs.

mod common;

use common::model::{Block, BlockGradOutputs, BlockInputs, GraphedBlock};
use common::{on_each_backend, random};
use graphed::{
    graphed, make_graphed, ops, CaptureMode, Cx, DType, Device, Error, Graph, GraphOptions, GraphedModules, HookKind,
    HookRegistry, Module, Param, PoolStats, Result, ScheduleError, SetupError, Slot, SlotKind, Tensor,
};

const B: usize = 4;
const D: usize = 8;

/// Chunk 1 of the pipeline: two inputs, `gelu(linear(x)) + y`; `y` needs no grad.
pub struct TwoIn {
    lin: Block,
}

#[graphed(warmup = 2)]
impl TwoIn {
    pub fn forward(&self, cx: &mut Cx, x: &Tensor, y: &Tensor) -> Result<Tensor> {
        let h = self.lin.forward(cx, x)?;
        ops::add(&h, y)
    }
    pub fn backward(&mut self, cx: &mut Cx, dz: &Tensor) -> Result<(Option<Tensor>, Option<Tensor>)> {
        Ok((self.lin.backward(cx, dz)?, None))
    }
}

/// The pipeline's schedule: 2 chunks, 2 microbatches.
const ORDER: [i32; 8] = [1, 2, 1, 2, -2, -1, -2, -1];

/// One action of a step, in `ORDER`.
#[derive(Clone, Copy, Debug)]
enum Act {
    F(usize),
    B(usize),
}

const ACTS: [Act; 8] = [Act::F(0), Act::F(1), Act::F(0), Act::F(1), Act::B(1), Act::B(0), Act::B(1), Act::B(0)];

/// The data of one step.
struct Data {
    x: [Tensor; 2],
    y: [Tensor; 2],
    dz: [Tensor; 2],
}

fn data(dev: &Device, seed: u64) -> Result<Data> {
    let t = |s: u64| random(dev, &[B, D], seed * 100 + s);
    Ok(Data {
        x: [t(1)?.with_requires_grad(true), t(2)?.with_requires_grad(true)],
        y: [t(3)?, t(4)?],
        dz: [t(5)?, t(6)?],
    })
}

fn modules(dev: &Device) -> Result<(TwoIn, Block)> {
    Ok((TwoIn { lin: Block::new(dev, D, D, 1)? }, Block::new(dev, D, D, 2)?))
}

fn params(a: &TwoIn, b: &Block) -> Vec<Param> {
    a.lin.params().into_iter().chain(b.params()).collect()
}

/// Everything a step produces, read back to the host.
#[derive(Debug, PartialEq)]
struct Results {
    outputs: Vec<Vec<f32>>,
    dx: Vec<Vec<f32>>,
    grads: Vec<Vec<f32>>,
}

/// The graphed pipeline and its state within a step.
struct Rig {
    dev: Device,
    g: GraphedModules,
    data: Data,
    /// The first chunk's output per microbatch (input of the second chunk).
    mid: [Option<Tensor>; 2],
    /// The second chunk's input grad per microbatch (grad output of the first chunk).
    dmid: [Option<Tensor>; 2],
    next_f: [usize; 2],
    next_b: [usize; 2],
    results: Results,
    /// A handle to a static output from an earlier step: stale now.
    stale: Tensor,
}

impl Rig {
    fn new(dev: &Device) -> Result<Rig> {
        let (a, b) = modules(dev)?;
        let d = data(dev, 1)?;
        let samples = vec![vec![vec![Some(d.x[0].clone()), Some(d.y[0].clone())]], vec![vec![Some(d.x[0].clone())]]];
        let opts = GraphOptions::new().warmup(2).order(ORDER.to_vec());
        let g = make_graphed(vec![Box::new(a), Box::new(b)], samples, opts)?;
        let mut rig = Rig {
            dev: dev.clone(),
            g,
            data: d,
            mid: [None, None],
            dmid: [None, None],
            next_f: [0; 2],
            next_b: [0; 2],
            results: Results { outputs: vec![], dx: vec![], grads: vec![] },
            stale: Tensor::zeros(dev, &[1])?,
        };
        // Two full steps; a handle from the first is stale after the second.
        for seed in [0, 1] {
            rig.start_step(seed)?;
            for act in ACTS {
                rig.act(act)?;
            }
            if seed == 0 {
                rig.stale = rig.mid[0].clone().expect("mid");
            }
        }
        assert!(!rig.stale.is_fresh());
        rig.start_step(2)?;
        Ok(rig)
    }

    fn start_step(&mut self, seed: u64) -> Result<()> {
        self.data = data(&self.dev, seed)?;
        self.mid = [None, None];
        self.dmid = [None, None];
        self.next_f = [0; 2];
        self.next_b = [0; 2];
        self.results = Results { outputs: vec![], dx: vec![], grads: vec![] };
        Ok(())
    }

    fn act(&mut self, act: Act) -> Result<()> {
        match act {
            Act::F(0) => {
                let m = self.next_f[0];
                let out = self.g.forward(0, &[Some(self.data.x[m].clone()), Some(self.data.y[m].clone())])?;
                self.mid[m] = out[0].clone();
                self.next_f[0] += 1;
            }
            Act::F(_) => {
                let m = self.next_f[1];
                let out = self.g.forward(1, &[self.mid[m].clone()])?;
                self.results.outputs.push(out[0].as_ref().expect("output").to_vec()?);
                self.next_f[1] += 1;
            }
            Act::B(1) => {
                let m = self.next_b[1];
                let dx = self.g.backward(1, &[Some(self.data.dz[m].clone())])?;
                self.dmid[m] = dx[0].clone();
                self.next_b[1] += 1;
            }
            Act::B(_) => {
                let m = self.next_b[0];
                let dx = self.g.backward(0, &[self.dmid[m].clone()])?;
                self.results.dx.push(dx[0].as_ref().expect("dx").to_vec()?);
                assert!(dx[1].is_none(), "y needs no grad");
                self.next_b[0] += 1;
            }
        }
        Ok(())
    }

    fn finish(&mut self) -> Result<Results> {
        let a = self.g.module::<TwoIn>(0).expect("chunk 1");
        let b = self.g.module::<Block>(1).expect("chunk 2");
        let grads = params(a, b).iter().map(|p| p.grad.to_vec()).collect::<Result<_>>()?;
        Ok(Results {
            grads,
            ..std::mem::replace(&mut self.results, Results { outputs: vec![], dx: vec![], grads: vec![] })
        })
    }

    fn pool(&self) -> (PoolStats, usize) {
        (self.g.pool().stats(), self.dev.reserved_bytes())
    }
}

/// The same steps run eagerly from the same initial parameters: `warm_steps` first (the rig's
/// full steps, whose grads the tested step accumulates onto), then `seed`'s, whose outputs and
/// input grads are returned with the final parameter grads.
fn eager_step(dev: &Device, warm_steps: &[u64], seed: u64) -> Result<Results> {
    let (mut a, mut b) = modules(dev)?;
    let mut results = Results { outputs: vec![], dx: vec![], grads: vec![] };
    for (i, &s) in warm_steps.iter().chain([&seed]).enumerate() {
        let d = data(dev, s)?;
        let mut cxa = [Cx::new(dev), Cx::new(dev)];
        let mut cxb = [Cx::new(dev), Cx::new(dev)];
        let mut mid = Vec::new();
        let mut outs = Vec::new();
        for m in 0..2 {
            cxa[m].set_needs_input_grad(vec![true, false]);
            let h = a.forward(&mut cxa[m], &d.x[m], &d.y[m])?;
            cxb[m].set_needs_input_grad(vec![true]);
            outs.push(b.forward(&mut cxb[m], &h)?.to_vec()?);
            mid.push(h);
        }
        let mut dxs = Vec::new();
        for m in 0..2 {
            let dh = b.backward(&mut cxb[m], &d.dz[m])?.expect("dh");
            dxs.push(a.backward(&mut cxa[m], &dh)?.0.expect("dx").to_vec()?);
        }
        if i == warm_steps.len() {
            results.outputs = outs;
            results.dx = dxs;
        }
    }
    results.grads = params(&a, &b).iter().map(|p| p.grad.to_vec()).collect::<Result<_>>()?;
    Ok(results)
}

type Misuse = fn(&mut Rig) -> Error;
type Expect = fn(&Error) -> bool;
type Samples = Vec<Vec<Vec<Option<Tensor>>>>;
/// Parameter values and grads, and the RNG's (seed, offset).
type Snapshot = (Vec<Vec<f32>>, (u64, u64));

/// Runs the correct step with `misuse` made before action `at`; checks the variant, the pool
/// and the results against eager.
fn case(dev: &Device, name: &str, at: usize, misuse: Misuse, expect: Expect) -> Result<()> {
    let mut rig = Rig::new(dev)?;
    for (i, act) in ACTS.into_iter().enumerate() {
        if i == at {
            let before = rig.pool();
            let err = misuse(&mut rig);
            assert!(expect(&err), "{name}: unexpected error {err:?}");
            assert_eq!(rig.pool(), before, "{name}: the refused call changed the pool");
        }
        rig.act(act).map_err(|e| e.context(format!("{name}: the correct call after the misuse")))?;
    }
    if at == ACTS.len() {
        let err = misuse(&mut rig);
        assert!(expect(&err), "{name}: unexpected error {err:?}");
    }
    let got = rig.finish()?;
    let want = eager_step(dev, &[0, 1], 2)?;
    assert_eq!(got, want, "{name}: the step after the refused call differs from eager");
    Ok(())
}

fn xs(rig: &Rig, m: usize) -> Vec<Option<Tensor>> {
    vec![Some(rig.data.x[m].clone()), Some(rig.data.y[m].clone())]
}

fn err<T: std::fmt::Debug>(r: Result<T>) -> Error {
    r.expect_err("the misuse must be refused")
}

#[test]
fn refused_graphed_calls_change_nothing() {
    let cases: Vec<(&str, usize, Misuse, Expect)> = vec![
        (
            "forward of chunk 2 before chunk 1",
            0,
            |r| err(r.g.forward(1, &[Some(r.data.x[0].clone())])),
            |e| matches!(e, Error::ReplayOrder { .. }),
        ),
        (
            "forward of chunk 1 twice in a row",
            1,
            |r| {
                let x = xs(r, 1);
                err(r.g.forward(0, &x))
            },
            |e| matches!(e, Error::ReplayOrder { .. }),
        ),
        (
            "forward with one input of two",
            0,
            |r| err(r.g.forward(0, &[Some(r.data.x[0].clone())])),
            |e| matches!(e, Error::Arity { kind: SlotKind::Input, expected: 2, got: 1, .. }),
        ),
        (
            "forward with three inputs",
            0,
            |r| {
                let mut x = xs(r, 0);
                x.push(None);
                err(r.g.forward(0, &x))
            },
            |e| matches!(e, Error::Arity { expected: 2, got: 3, .. }),
        ),
        (
            "wrong shape at input 0",
            0,
            |r| {
                let mut x = xs(r, 0);
                x[0] = Some(random(&r.dev, &[B + 1, D], 9).unwrap());
                err(r.g.forward(0, &x))
            },
            |e| matches!(e, Error::SlotShape { slot: Slot { kind: SlotKind::Input, index: 0 }, .. }),
        ),
        (
            "wrong shape at input 1 (input 0 fine)",
            2,
            |r| {
                let mut x = xs(r, 1);
                x[1] = Some(random(&r.dev, &[B, D + 1], 9).unwrap());
                err(r.g.forward(0, &x))
            },
            |e| matches!(e, Error::SlotShape { slot: Slot { kind: SlotKind::Input, index: 1 }, .. }),
        ),
        (
            "None for a captured input",
            0,
            |r| {
                let mut x = xs(r, 0);
                x[1] = None;
                err(r.g.forward(0, &x))
            },
            |e| matches!(e, Error::SlotPresence { captured_some: true, .. }),
        ),
        (
            "a stale handle as input",
            0,
            |r| {
                let mut x = xs(r, 0);
                x[1] = Some(r.stale.clone());
                err(r.g.forward(0, &x))
            },
            |e| matches!(e, Error::StaleTensor { .. }),
        ),
        (
            "an input from another device",
            0,
            |r| {
                let mut x = xs(r, 0);
                x[1] = Some(random(&Device::host(), &[B, D], 9).unwrap());
                err(r.g.forward(0, &x))
            },
            |e| matches!(e, Error::SlotDevice { .. }),
        ),
        (
            "an input that requires a grad the capture does not compute",
            0,
            |r| {
                let mut x = xs(r, 0);
                x[1] = Some(r.data.y[0].clone().with_requires_grad(true));
                err(r.g.forward(0, &x))
            },
            |e| matches!(e, Error::SlotRequiresGrad { .. }),
        ),
        // Each chunk's next forward is microbatch 0 again, whose backward is still pending: a
        // refused call must not touch its static inputs. (Chunk 1's forward at that point
        // restarts the cycle, abandoning the step, unless its inputs are refused first.)
        (
            "forward of chunk 2 before the step's backwards, new input",
            4,
            |r| {
                let x = vec![Some(random(&r.dev, &[B, D], 77).unwrap().with_requires_grad(true))];
                err(r.g.forward(1, &x))
            },
            |e| matches!(e, Error::ReplayOrder { .. }),
        ),
        (
            "bad input 1 on a pending microbatch's surface",
            4,
            |r| {
                let x = vec![
                    Some(random(&r.dev, &[B, D], 77).unwrap().with_requires_grad(true)),
                    Some(random(&r.dev, &[B, 1], 78).unwrap()),
                ];
                err(r.g.forward(0, &x))
            },
            |e| matches!(e, Error::SlotShape { slot: Slot { index: 1, .. }, .. }),
        ),
        (
            "forward of a chunk that does not exist",
            0,
            |r| err(r.g.forward(2, &[])),
            |e| matches!(e, Error::ChunkOutOfRange { chunk: 2, chunks: 2 }),
        ),
        (
            "backward before any forward",
            0,
            |r| err(r.g.backward(0, &[Some(r.data.dz[0].clone())])),
            |e| matches!(e, Error::NoPendingForward { .. }),
        ),
        (
            "backward of chunk 1 before chunk 2's",
            4,
            |r| err(r.g.backward(0, &[Some(r.data.dz[0].clone())])),
            |e| matches!(e, Error::ReplayOrder { .. }),
        ),
        (
            "backward with a grad of the wrong shape",
            4,
            |r| err(r.g.backward(1, &[Some(random(&r.dev, &[B, D + 2], 9).unwrap())])),
            |e| matches!(e, Error::SlotShape { slot: Slot { kind: SlotKind::GradOutput, index: 0 }, .. }),
        ),
        (
            "backward with two grads for one output",
            4,
            |r| err(r.g.backward(1, &[Some(r.data.dz[0].clone()), None])),
            |e| matches!(e, Error::Arity { kind: SlotKind::GradOutput, .. }),
        ),
        (
            "backward with None for a tensor output",
            4,
            |r| err(r.g.backward(1, &[None])),
            |e| matches!(e, Error::SlotPresence { .. }),
        ),
        (
            "backward with a stale grad",
            4,
            |r| {
                let s = r.stale.clone();
                err(r.g.backward(1, &[Some(s)]))
            },
            |e| matches!(e, Error::StaleTensor { .. }),
        ),
        (
            "backward with a grad from another device",
            4,
            |r| err(r.g.backward(1, &[Some(random(&Device::host(), &[B, D], 9).unwrap())])),
            |e| matches!(e, Error::SlotDevice { .. }),
        ),
        (
            "backward of a chunk that does not exist",
            4,
            |r| err(r.g.backward(7, &[])),
            |e| matches!(e, Error::ChunkOutOfRange { chunk: 7, .. }),
        ),
        (
            "a second backward of the step",
            ACTS.len(),
            |r| err(r.g.backward(0, &[Some(r.data.dz[0].clone())])),
            |e| matches!(e, Error::NoPendingForward { .. }),
        ),
    ];
    on_each_backend(|dev| {
        for (name, at, misuse, expect) in &cases {
            case(dev, name, *at, *misuse, *expect)?;
        }
        Ok(())
    });
}

#[test]
fn a_mode_switch_mid_step_runs_eagerly_and_the_step_still_matches() {
    on_each_backend(|dev| {
        let mut rig = Rig::new(dev)?;
        for (i, act) in ACTS.into_iter().enumerate() {
            if i == 2 {
                rig.g.eval();
                let x = xs(&rig, 0);
                let eager = rig.g.forward(0, &x)?;
                assert!(!eager[0].as_ref().expect("out").same_buffer(rig.mid[0].as_ref().expect("mid")));
                rig.g.train();
            }
            rig.act(act)?;
        }
        assert_eq!(rig.finish()?, eager_step(dev, &[0, 1], 2)?);
        Ok(())
    });
}

#[test]
fn refused_raw_graph_calls_change_nothing() {
    on_each_backend(|dev| {
        let x = random(dev, &[16], 1)?;
        let y = Tensor::zeros(dev, &[16])?;
        let pool = dev.new_pool();
        let mut a = Graph::with_pool(dev, &pool);
        let mut b = Graph::with_pool(dev, &pool);
        assert!(matches!(a.replay(), Err(Error::NotCaptured { .. })), "replay before capture");
        assert!(matches!(a.capture_end(), Err(Error::NotCapturing { .. })), "capture_end without begin");
        a.capture(CaptureMode::Global, || ops::axpy_(&y, 1.0, &x))?;
        b.capture(CaptureMode::Global, || ops::axpy_(&y, 2.0, &x))?;
        let stats = pool.stats();
        assert!(matches!(a.capture(CaptureMode::Global, || Ok(())), Err(Error::AlreadyCaptured { .. })));
        assert!(matches!(b.replay(), Err(Error::ReplayOrder { .. })), "b before a");
        // Replay during another graph's capture, and synchronize inside a capture.
        let late: Vec<Box<dyn Module>> = vec![Box::new(Block::new(dev, 16, 16, 1)?)];
        let late_sample = vec![vec![vec![Some(x.reshape(&[1, 16])?)]]];
        let mut c = Graph::new(dev);
        c.capture_begin(CaptureMode::Global)?;
        assert!(matches!(a.replay(), Err(Error::IllegalDuringCapture { .. })));
        assert!(matches!(dev.synchronize(), Err(Error::IllegalDuringCapture { .. })));
        assert!(matches!(c.capture_begin(CaptureMode::Global), Err(Error::AlreadyCapturing { .. })));
        assert!(matches!(
            make_graphed(late, late_sample, GraphOptions::new()),
            Err(e) if matches!(e.error(), Error::IllegalDuringCapture { .. })
        ));
        ops::scale_(&y, 1.0)?;
        c.capture_end()?;
        assert_eq!(pool.stats(), stats, "refused calls left the pool alone");
        // None of the refused replays ran: the correct order gives exactly 3 x per cycle.
        a.replay()?;
        b.replay()?;
        a.replay()?;
        b.replay()?;
        let want: Vec<f32> = x.to_vec()?.iter().map(|v| 0.0 + v + 2.0 * v + v + 2.0 * v).collect();
        assert_eq!(y.to_vec()?, want);
        a.reset()?;
        assert!(matches!(a.replay(), Err(Error::NotCaptured { .. })), "reset then replay");
        b.replay()?; // alone in the pool's order now
        Ok(())
    });
}

/// Fails its `pre_backward` hook while `fail` is set.
pub struct Flaky {
    lin: Block,
    fail: bool,
    p: f32,
}

#[graphed(warmup = 2)]
impl Flaky {
    pub fn forward(&self, cx: &mut Cx, x: &Tensor) -> Result<Tensor> {
        let h = self.lin.forward(cx, x)?;
        let (y, mask) = ops::dropout(&h, self.p, &cx.device().rng()?, cx.training())?;
        cx.save(&mask.expect("training"));
        Ok(y)
    }
    pub fn backward(&mut self, cx: &mut Cx, dy: &Tensor) -> Result<Option<Tensor>> {
        let mask = cx.saved(2)?;
        let dh = ops::dropout_backward(dy, &mask)?;
        self.lin.backward(cx, &dh)
    }
    #[capture_time_hook(pre_backward)]
    fn maybe_fail(&mut self) -> Result<()> {
        if self.fail {
            return Err(Error::msg("pre_backward failed on purpose"));
        }
        Ok(())
    }
}

use graphed::capture_time_hook;

fn snapshot(dev: &Device, lin: &Block) -> Result<Snapshot> {
    let v = lin.params().iter().flat_map(|p| [p.value.to_vec(), p.grad.to_vec()]).collect::<Result<_>>()?;
    Ok((v, dev.rng()?.seed_and_offset()?))
}

#[test]
fn a_failed_capture_hands_the_module_back_and_leaves_no_trace() {
    on_each_backend(|dev| {
        dev.rng()?.manual_seed(7)?;
        let x = random(dev, &[B, D], 3)?.with_requires_grad(true);
        let flaky = Flaky { lin: Block::new(dev, D, D, 4)?, fail: true, p: 0.25 };
        let before = snapshot(dev, &flaky.lin)?;
        let reserved = dev.reserved_bytes();
        let err = flaky.make_graphed(&x).expect_err("the hook fails");
        assert!(matches!(err.error(), Error::Hook { kind: "pre_backward", .. }), "{:?}", err.error());
        let mut flaky = err.into_inner();
        assert_eq!(snapshot(dev, &flaky.lin)?, before, "params, grads and the RNG are untouched");
        assert_eq!(dev.reserved_bytes(), reserved, "the pool's memory was given back");
        // Fix the cause and capture again: the run matches eager from the same seed.
        flaky.fail = false;
        let mut g = flaky.make_graphed(&x)?;
        let mut eager = Flaky { lin: Block::new(dev, D, D, 4)?, fail: false, p: 0.25 };
        let mut cx_e = Cx::new(dev);
        let seed_state = dev.rng()?.save()?;
        let y = g.forward(&x)?.to_vec()?;
        g.backward(&x)?;
        dev.rng()?.restore(&seed_state)?;
        cx_e.set_needs_input_grad(vec![true]);
        assert_eq!(y, eager.forward(&mut cx_e, &x)?.to_vec()?);
        eager.backward(&mut cx_e, &x)?;
        assert_eq!(g.module().lin.w.grad.to_vec()?, eager.lin.w.grad.to_vec()?);
        Ok(())
    });
}

#[test]
fn refused_make_graphed_arguments_hand_the_modules_back() {
    on_each_backend(|dev| {
        let x = random(dev, &[B, D], 3)?;
        let boxed = || -> Result<Vec<Box<dyn Module>>> { Ok(vec![Box::new(Block::new(dev, D, D, 1)?)]) };
        let sample = || vec![vec![vec![Some(x.clone())]]];
        let cases: Vec<(&str, Samples, GraphOptions, Expect)> = vec![
            ("warmup 0", sample(), GraphOptions::new().warmup(0), |e| {
                matches!(e, Error::Setup(SetupError::ZeroWarmup))
            }),
            ("order of the wrong length", sample(), GraphOptions::new().order(vec![1, -1, 1]), |e| {
                matches!(e, Error::Schedule(ScheduleError::PassCount { passes: 3, chunks: 1 }))
            }),
            ("order with a chunk out of range", sample(), GraphOptions::new().order(vec![2, -2]), |e| {
                matches!(e, Error::Schedule(ScheduleError::ChunkOutOfRange { chunk: 2, chunks: 1 }))
            }),
            ("order with a backward first", sample(), GraphOptions::new().order(vec![-1, 1]), |e| {
                matches!(e, Error::Schedule(ScheduleError::BackwardBeforeForward { chunk: 1 }))
            }),
            ("no samples", vec![], GraphOptions::new(), |e| {
                matches!(e, Error::Setup(SetupError::SampleLists { modules: 1, samples: 0 }))
            }),
            (
                "two inputs for a one-input forward",
                vec![vec![vec![Some(x.clone()), Some(x.clone())]]],
                GraphOptions::new(),
                |e| matches!(e, Error::Setup(SetupError::SampleInputs { expected: 1, got: 2, .. })),
            ),
            (
                "samples on two devices",
                vec![vec![vec![Some(x.clone())], vec![Some(random(&Device::host(), &[B, D], 1).unwrap())]]],
                GraphOptions::new().order(vec![1, 1, -1, -1]),
                |e| matches!(e, Error::DeviceMismatch { .. }),
            ),
        ];
        for (name, samples, opts, expect) in cases {
            let reserved = dev.reserved_bytes();
            let err = make_graphed(boxed()?, samples, opts).expect_err(name);
            assert!(expect(err.error()), "{name}: {:?}", err.error());
            assert_eq!(err.into_inner().len(), 1, "{name}: the module comes back");
            assert_eq!(dev.reserved_bytes(), reserved, "{name}: no memory kept");
        }
        // A module without a backward (an inference module) behind a trainable one: forward
        // graphs alone would leave the block's grads uncomputed. Refused before anything ran:
        // both modules come back, the block's weights and grads as they were.
        let block = Block::new(dev, D, D, 1)?;
        let before: Vec<Vec<f32>> =
            block.params().iter().flat_map(|p| [p.value.to_vec(), p.grad.to_vec()]).collect::<Result<_>>()?;
        let reserved = dev.reserved_bytes();
        let mixed: Vec<Box<dyn Module>> = vec![Box::new(Twice), Box::new(block)];
        let err = make_graphed(mixed, vec![sample()[0].clone(), sample()[0].clone()], GraphOptions::new())
            .expect_err("an inference module among trainable ones");
        assert!(matches!(err.error(), Error::Setup(SetupError::NoBackward { chunk: 1, .. })), "{:?}", err.error());
        assert_eq!(dev.reserved_bytes(), reserved, "no memory kept");
        let mut back = err.into_inner().into_iter();
        let _twice = back.next().expect("the inference module comes back");
        let block: Box<dyn std::any::Any> = back.next().expect("the block comes back");
        let block = block.downcast::<Block>().map_err(|_| Error::msg("not the block"))?;
        let after: Vec<Vec<f32>> =
            block.params().iter().flat_map(|p| [p.value.to_vec(), p.grad.to_vec()]).collect::<Result<_>>()?;
        assert_eq!(after, before, "the block's weights and grads as they were");
        // A registered hook that fails in warm-up: the struct comes back whole.
        let hooks = HookRegistry::new();
        let h = hooks.register(0, HookKind::Forward, false, || Err(Error::msg("no")));
        let err = GraphedBlock::new(
            Block::new(dev, D, D, 1)?,
            common::model::BlockInputs { x: x.clone() },
            GraphedBlock::options().hooks(&hooks),
        )
        .expect_err("hook fails");
        assert!(matches!(err.error(), Error::Hook { kind: "forward", .. }));
        h.remove();
        let block = err.into_inner();
        let mut g = block.make_graphed(&x)?;
        g.forward(&x)?;
        Ok(())
    });
}

/// An inference module: a `#[graphed]` impl with no `backward`.
struct Twice;

#[graphed(warmup = 1)]
impl Twice {
    fn forward(&self, _cx: &mut Cx, x: &Tensor) -> Result<Tensor> {
        ops::scale(x, 2.0)
    }
}

/// Requests for more memory than there is, or than a pool may hold, and a pool limit with a
/// pool given: typed errors that change nothing; a capture refused for memory hands its
/// module back with parameters, grads and the RNG state as they were.
#[test]
fn refused_memory_requests_change_nothing() {
    on_each_backend(|dev| {
        // More than any device holds, and a size that overflows: nothing allocated.
        let (pool, reserved) = (dev.default_pool().stats(), dev.reserved_bytes());
        assert!(matches!(Tensor::empty(dev, &[1 << 61]), Err(Error::OutOfMemory { .. })));
        assert!(matches!(Tensor::empty(dev, &[usize::MAX, 2]), Err(Error::OutOfMemory { requested: usize::MAX, .. })));
        assert_eq!((dev.default_pool().stats(), dev.reserved_bytes()), (pool, reserved));
        // A pool at its limit refuses to grow and keeps what it holds.
        let limited = dev.new_pool().with_limit(64 << 10);
        let held = dev.with_pool(&limited, || Tensor::zeros(dev, &[8 << 10]))?;
        let stats = limited.stats();
        let e = dev.with_pool(&limited, || Tensor::zeros(dev, &[16 << 10])).unwrap_err();
        assert!(matches!(e, Error::PoolLimit { limit: 65536, in_use: 32768, .. }), "{e:?}");
        assert_eq!(limited.stats(), stats);
        drop(held);
        // A capture whose warm-up needs more than its pool may hold: the module comes back.
        dev.rng()?.manual_seed(9)?;
        let x = random(dev, &[B, D], 3)?.with_requires_grad(true);
        let flaky = Flaky { lin: Block::new(dev, D, D, 4)?, fail: false, p: 0.25 };
        let before = snapshot(dev, &flaky.lin)?;
        let reserved = dev.reserved_bytes();
        let err = GraphedFlaky::new(flaky, FlakyInputs { x: x.clone() }, GraphedFlaky::options().pool_limit(256))
            .expect_err("a 256-byte pool cannot hold the activations");
        assert!(matches!(err.error().root(), Error::PoolLimit { limit: 256, .. }), "{:?}", err.error());
        let flaky = err.into_inner();
        assert_eq!(snapshot(dev, &flaky.lin)?, before, "params, grads and the RNG are untouched");
        assert_eq!(dev.reserved_bytes(), reserved, "the pool's memory was given back");
        // pool_limit with a pool given is refused before anything runs.
        let opts = GraphedFlaky::options().pool(&limited).pool_limit(1 << 20);
        let err = GraphedFlaky::new(flaky, FlakyInputs { x: x.clone() }, opts).expect_err("both");
        assert!(matches!(err.error(), Error::Setup(SetupError::PoolLimitWithPool)), "{:?}", err.error());
        // With room, the same module captures.
        let mut g = err.into_inner().make_graphed(&x)?;
        g.forward(&x)?;
        Ok(())
    });
}

/// A constructor from host values checks their count against the dims before it allocates:
/// a mismatch, or dims whose product overflows, is a shape error (not an allocation made
/// first, or an out-of-memory error), and the pool and the device memory are as before.
#[test]
fn values_that_do_not_fill_their_dims_are_refused_before_anything_is_allocated() {
    on_each_backend(|dev| {
        let (pool, reserved) = (dev.default_pool().stats(), dev.reserved_bytes());
        let is_values = |e: &Error, got: usize| matches!(e, Error::Shape { problem: graphed::ShapeProblem::Elements { what: "values", got: g, .. }, .. } if *g == got);
        let huge = [1usize << 62, 4];
        for (what, e) in [
            ("from_slice", Tensor::from_slice(dev, &[1.0, 2.0], &[3]).unwrap_err()),
            ("from_slice, overflowing dims", Tensor::from_slice(dev, &[1.0], &huge).unwrap_err()),
            ("from_slice_as", Tensor::from_slice_as(dev, &[1.0], &huge, DType::BF16).unwrap_err()),
            ("from_i32", Tensor::from_i32(dev, &[1], &huge).unwrap_err()),
            ("from_bf16", Tensor::from_bf16(dev, &[graphed::half::bf16::ONE], &huge).unwrap_err()),
        ] {
            let got = if what == "from_slice" { 2 } else { 1 };
            assert!(is_values(&e, got), "{what}: {e:?}");
        }
        assert_eq!((dev.default_pool().stats(), dev.reserved_bytes()), (pool, reserved));
        Ok(())
    });
}

/// A parameter of an integer value is refused before its grad is allocated: the pool and the
/// device memory are as before, and the value keeps its flag (integers have no grad).
#[test]
fn a_refused_integer_parameter_changes_nothing() {
    on_each_backend(|dev| {
        let index = Tensor::from_i32(dev, &[4, 2, 7], &[3])?;
        let (pool, reserved) = (dev.default_pool().stats(), dev.reserved_bytes());
        let e = Param::new(index.clone()).unwrap_err();
        assert!(matches!(e, Error::DType { op: "Param::new", got: DType::I32, .. }), "{e:?}");
        assert_eq!((dev.default_pool().stats(), dev.reserved_bytes()), (pool, reserved));
        assert!(!index.requires_grad());
        assert_eq!(index.to_i32_vec()?, [4, 2, 7]);
        // Frozen, the same value is held.
        assert!(!Param::frozen(index)?.requires_grad());
        Ok(())
    });
}

/// Fused attention (separate or packed q/k/v) refuses what its kernels are not built for, and a
/// wrong layout, before it allocates or launches anything, as the column copies and the
/// residual projection do: the pool and the device memory are as before.
#[test]
fn refused_attention_calls_change_nothing() {
    use graphed::ops::Attention;
    on_each_backend(|dev| {
        let bf = |dims: &[usize]| Tensor::zeros_as(dev, dims, DType::BF16);
        let (x, narrow, f) = (bf(&[2, 8, 128])?, bf(&[2, 8, 64])?, Tensor::zeros(dev, &[2, 8, 128])?);
        let (out, lse) = ops::flash_attention(&x, &x, &x, &Attention::causal(2))?;
        let packed = bf(&[2, 8, 384])?; // q, k and v of 2 heads of 64, packed
        let (odd, thin, short) = (bf(&[2, 8, 385])?, bf(&[2, 8, 192])?, bf(&[2, 7, 64])?);
        let (w_half, w_square) = (bf(&[64, 128])?, bf(&[128, 128])?);
        let before = (dev.default_pool().stats(), dev.reserved_bytes());
        let at = Attention::causal(2);
        let mut refusals = vec![
            ops::flash_attention(&x, &x, &x, &Attention::causal(4)).map(drop), // head dim 32
            ops::flash_attention(&f, &f, &f, &at).map(drop),                   // f32
            ops::flash_attention(&x, &f, &f, &at).map(drop),                   // dtypes mixed
            ops::flash_attention(&x, &x, &x, &at.kv_heads(3)).map(drop),       // 3 does not divide 2
            ops::flash_attention(&x, &narrow, &narrow, &at).map(drop),         // k, v too narrow
            ops::flash_attention_backward(&narrow, &x, &x, &x, &out, &lse, &at).map(drop),
            ops::flash_attention_backward(&x, &x, &x, &x, &out, &out, &at).map(drop), // lse not f32
            ops::flash_attention_packed(&odd, &at).map(drop),                         // not 6 blocks
            ops::flash_attention_packed(&thin, &at).map(drop),                        // head dim 32
            ops::flash_attention_packed(&x, &at.kv_heads(3)).map(drop),               // 3 does not divide 2
            ops::flash_attention_packed_backward(&narrow, &packed, &out, &lse, &at).map(drop), // dout width
            ops::flash_attention_packed_backward(&out, &packed, &out, &out, &at).map(drop), // lse
            ops::split_columns(&x, &[64, 63]).map(drop),                              // widths sum to 127
            ops::concat_columns(&[&x, &short]).map(drop),                             // leading dims differ
            ops::linear_residual(&x, &w_half, &x).map(drop),                          // residual of another shape
            ops::linear_residual(&x, &w_square, &f).map(drop),                        // residual of another dtype
        ];
        if dev.is_cuda() {
            // cuDNN asked for where it does not run (grouped heads; or no libcudnn): refused, not
            // rerouted. (The host backend runs its reference whatever the engine.)
            let gqa = at.kv_heads(1).engine(ops::AttentionEngine::Cudnn);
            refusals.push(ops::flash_attention(&x, &narrow, &narrow, &gqa).map(drop));
        }
        for (i, r) in refusals.into_iter().enumerate() {
            let e = r.expect_err("refused");
            assert!(
                matches!(
                    e,
                    Error::AttentionUnsupported { .. }
                        | Error::Shape { .. }
                        | Error::DType { .. }
                        | Error::DTypeMismatch { .. }
                ),
                "refusal {i}: {e:?}"
            );
        }
        assert_eq!(
            (dev.default_pool().stats(), dev.reserved_bytes()),
            before,
            "refused attention calls left memory alone"
        );
        Ok(())
    });
}

/// The struct form: two chunks with a schedule.
#[graphed(warmup = 1, order = [1, 2, -2, -1])]
pub struct TwoStage {
    first: Block,
    second: Block,
}

#[test]
fn refused_struct_form_calls_change_nothing() {
    on_each_backend(|dev| {
        let x = random(dev, &[B, D], 5)?.with_requires_grad(true);
        let dy = random(dev, &[B, D], 6)?;
        let two = TwoStage { first: Block::new(dev, D, D, 1)?, second: Block::new(dev, D, D, 2)? };
        let mut g = two.make_graphed(vec![vec![vec![Some(x.clone())]], vec![vec![Some(x.clone())]]])?;
        let stats = g.inner().pool().stats();
        let xin = || BlockInputs { x: x.clone() };
        let dyin = || BlockGradOutputs { dy: dy.clone() };
        assert!(matches!(g.forward_second(xin()), Err(Error::ReplayOrder { .. })));
        assert!(matches!(g.backward_first(dyin()), Err(Error::NoPendingForward { .. })));
        let h = g.forward_first(xin())?.output_0;
        assert!(matches!(g.backward_second(dyin()), Err(Error::NoPendingForward { .. })));
        let y = g.forward_second(BlockInputs { x: h })?.output_0.to_vec()?;
        assert!(matches!(g.backward_first(dyin()), Err(Error::ReplayOrder { .. })));
        let dh = g.backward_second(dyin())?.x.expect("dh");
        let dx = g.backward_first(BlockGradOutputs { dy: dh })?.x.expect("dx").to_vec()?;
        assert_eq!(g.inner().pool().stats(), stats);
        // Eager.
        let (mut a, mut b) = (Block::new(dev, D, D, 1)?, Block::new(dev, D, D, 2)?);
        let (mut ca, mut cb) = (Cx::new(dev), Cx::new(dev));
        let h = a.forward(&mut ca, &x)?;
        assert_eq!(y, b.forward(&mut cb, &h)?.to_vec()?);
        let dh = b.backward(&mut cb, &dy)?.expect("dh");
        assert_eq!(dx, a.backward(&mut ca, &dh)?.expect("dx").to_vec()?);
        assert_eq!(g.module_first().w.grad.to_vec()?, a.w.grad.to_vec()?);
        assert_eq!(g.module_second().w.grad.to_vec()?, b.w.grad.to_vec()?);
        Ok(())
    });
}

#[test]
fn refused_impl_form_calls_change_nothing() {
    on_each_backend(|dev| {
        let x = random(dev, &[B, D], 5)?.with_requires_grad(true);
        let dy = random(dev, &[B, D], 6)?;
        let mut g = Block::new(dev, D, D, 3)?.make_graphed(&x)?;
        let stats = g.inner().pool().stats();
        assert!(matches!(g.backward(&dy), Err(Error::NoPendingForward { .. })));
        assert!(matches!(g.forward(&random(dev, &[B, D + 1], 1)?), Err(Error::SlotShape { .. })));
        let y = g.forward(&x)?;
        assert!(matches!(g.backward(&random(dev, &[1, D], 1)?), Err(Error::SlotShape { .. })));
        let yv = y.to_vec()?;
        let dx = g.backward(&dy)?.expect("dx").to_vec()?;
        assert!(matches!(g.backward(&dy), Err(Error::NoPendingForward { .. })), "double backward");
        assert_eq!(g.inner().pool().stats(), stats);
        let mut e = Block::new(dev, D, D, 3)?;
        let mut ce = Cx::new(dev);
        assert_eq!(yv, e.forward(&mut ce, &x)?.to_vec()?);
        assert_eq!(dx, e.backward(&mut ce, &dy)?.expect("dx").to_vec()?);
        assert_eq!(g.module().w.grad.to_vec()?, e.w.grad.to_vec()?);
        Ok(())
    });
}

/// Shape buckets: every refused call (above the largest bucket, a size that fits no slot, a
/// grad output of another size than its forward's, inputs of another width) leaves the
/// parameters, grads, RNG, pool, the active bucket and the pending microbatch as they were,
/// and the step then finishes with correct calls.
#[test]
fn refused_bucketed_calls_change_nothing() {
    on_each_backend(|dev| {
        let rows = |n: usize, seed: u64| random(dev, &[n, D], seed);
        let x = rows(16, 1)?.with_requires_grad(true);
        let opts = GraphOptions::new().buckets(graphed::Buckets::new(0, [4, 8, 16]));
        let mut g = make_graphed(vec![Box::new(Block::new(dev, D, D, 2)?)], vec![vec![vec![Some(x)]]], opts)?;
        g.forward(0, &[Some(rows(5, 2)?.with_requires_grad(true))])?;
        let lin = g.module::<Block>(0).ok_or_else(|| Error::msg("block"))?;
        let (before, pool) = (snapshot(dev, lin)?, g.pool().stats());
        type Refusal = (&'static str, Result<Vec<Option<Tensor>>>, fn(&Error) -> bool);
        let refusals: Vec<Refusal> = vec![
            ("above the largest", g.forward(0, &[Some(rows(17, 3)?)]), |e| {
                matches!(e, Error::Bucket(graphed::BucketError::AboveLargest { size: 17, largest: 16 }))
            }),
            ("another width", g.forward(0, &[Some(random(dev, &[3, D + 1], 3)?)]), |e| {
                matches!(e, Error::SlotShape { .. })
            }),
            ("a grad of another size", g.backward(0, &[Some(rows(6, 4)?)]), |e| matches!(e, Error::SlotShape { .. })),
            ("no input", g.forward(0, &[None]), |e| matches!(e, Error::SlotPresence { .. })),
        ];
        for (what, r, want) in refusals {
            let e = r.expect_err(what);
            assert!(want(&e), "{what}: {e}");
            let lin = g.module::<Block>(0).ok_or_else(|| Error::msg("block"))?;
            assert_eq!(snapshot(dev, lin)?, before, "{what}: params, grads and the RNG are untouched");
            assert_eq!(g.pool().stats(), pool, "{what}: the pool is untouched");
            assert_eq!(g.active_bucket(), Some(8), "{what}: the active bucket is the same");
        }
        // The pending microbatch is still there: its backward runs and returns 5 rows.
        let dx = g.backward(0, &[Some(rows(5, 5)?)])?;
        assert_eq!(dx[0].as_ref().map(|t| t.dims().to_vec()), Some(vec![5, D]));
        Ok(())
    });
}

/// The tensors of a one-layer decoder in bf16 (0.01 everywhere; empty caches of 2 sequences of 8
/// positions with lengths 1 and 2), `d` wide in `heads` heads.
struct OneLayer {
    heads: usize,
    tok: Tensor,
    pos: Tensor,
    gain: Tensor,
    head: Tensor,
    qkv: Tensor,
    wo: Tensor,
    gate_up: Tensor,
    down: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    lengths: Tensor,
}

impl OneLayer {
    fn new(dev: &Device, d: usize, heads: usize) -> Result<OneLayer> {
        let (hidden, vocab) = (64, 16);
        let w = |dims: &[usize]| Tensor::full_as(dev, dims, 0.01, DType::BF16);
        let cache = || Tensor::zeros_as(dev, &[2, heads, 8, d / heads], DType::BF16);
        Ok(OneLayer {
            heads,
            tok: w(&[vocab, d])?,
            pos: w(&[8, d])?,
            gain: w(&[d])?,
            head: w(&[vocab, d])?,
            qkv: w(&[3 * d, d])?,
            wo: w(&[d, d])?,
            gate_up: w(&[2 * hidden, d])?,
            down: w(&[d, hidden])?,
            k_cache: cache()?,
            v_cache: cache()?,
            lengths: Tensor::from_i32(dev, &[1, 2], &[2])?,
        })
    }

    fn weights(&self) -> graphed::ops::DecoderWeights<'_> {
        let layer = graphed::ops::DecoderLayer {
            norm1: &self.gain,
            qkv: &self.qkv,
            wo: &self.wo,
            norm2: &self.gain,
            gate_up: &self.gate_up,
            down: &self.down,
            k_cache: &self.k_cache,
            v_cache: &self.v_cache,
            lengths: &self.lengths,
        };
        graphed::ops::DecoderWeights {
            tok: &self.tok,
            pos: &self.pos,
            layers: vec![layer],
            head_norm: &self.gain,
            head: &self.head,
            heads: self.heads,
            eps: 1e-5,
        }
    }
}

/// `ops::DecoderStep` refuses wrong weights, inputs and limits before it allocates or launches
/// anything: the pool and the device memory are as before, the caches and their lengths
/// untouched, the limit unchanged; the same step then runs.
#[test]
fn refused_decoder_step_calls_change_nothing() {
    use graphed::ops::{DecoderStep, DecoderWeights};
    on_each_backend(|dev| {
        let t = OneLayer::new(dev, 128, 2)?;
        let (good, head, lengths, k_cache, v_cache) = (t.weights(), &t.head, &t.lengths, &t.k_cache, &t.v_cache);
        let mut step = DecoderStep::new(&good)?;
        let limit = step.fused_batch_limit();
        let ids = Tensor::from_slice(dev, &[1.0, 2.0], &[2])?;
        let positions = Tensor::from_slice(dev, &[1.0, 2.0], &[2])?;
        let (three, i32_ids) = (Tensor::from_slice(dev, &[1.0; 3], &[3])?, Tensor::from_i32(dev, &[1, 2], &[2])?);
        let before = (dev.default_pool().stats(), dev.reserved_bytes());
        let caches_before = (k_cache.to_vec()?, v_cache.to_vec()?);
        fn changed<'a>(good: &DecoderWeights<'a>, f: impl FnOnce(&mut DecoderWeights<'a>)) -> Result<()> {
            let mut bad = good.clone();
            f(&mut bad);
            DecoderStep::new(&bad).map(drop)
        }
        let refusals = [
            changed(&good, |b| b.heads = 3),                  // does not divide d_model
            changed(&good, |b| b.heads = 4),                  // disagrees with the caches
            changed(&good, |b| b.layers[0].wo = head),        // a wrong projection
            changed(&good, |b| b.layers[0].lengths = &three), // f32 lengths
            changed(&good, |b| b.layers.clear()),             // no layer
            changed(&good, |b| b.eps = f32::NAN),
            step.run(&three, &three).map(drop),       // more sequences than the caches
            step.run(&ids, &three).map(drop),         // lengths differ
            step.run(&i32_ids, &positions).map(drop), // I32 ids
            step.set_fused_batch_limit(65),           // past the kernel's 64
        ];
        for (i, r) in refusals.into_iter().enumerate() {
            let e = r.expect_err("refused");
            assert!(
                matches!(e, Error::Shape { .. } | Error::DType { .. } | Error::InvalidArgument { .. } | Error::Op(_)),
                "refusal {i}: {e:?}"
            );
        }
        assert_eq!((dev.default_pool().stats(), dev.reserved_bytes()), before, "refused calls left memory alone");
        assert_eq!(lengths.to_i32_vec()?, vec![1, 2], "the lengths are untouched");
        assert!((k_cache.to_vec()?, v_cache.to_vec()?) == caches_before, "the caches are untouched");
        assert_eq!(step.fused_batch_limit(), limit);
        step.run(&ids, &positions)?.to_vec()?;
        assert_eq!(lengths.to_i32_vec()?, vec![2, 3], "the step then runs");
        Ok(())
    });
}

/// An op given a stale handle (a static output of an earlier step, overwritten since) refuses
/// it with [`Error::StaleTensor`] before it allocates anything: the default pool (its peak
/// included) and the device memory are as before. Elementwise, activations, dropout,
/// reductions, casts, GEMMs, norms, losses, embeddings, column copies and argmax.
#[test]
fn ops_refuse_a_stale_input_before_allocating() {
    on_each_backend(|dev| {
        let rig = Rig::new(dev)?;
        let s = rig.stale.clone();
        assert_eq!(s.dims(), &[B, D]);
        let (x, w, gamma) = (random(dev, &[B, D], 7)?, random(dev, &[D, D], 8)?, random(dev, &[D], 9)?);
        let labels = Tensor::from_slice(dev, &[0.0, 1.0, 2.0, 3.0], &[B])?;
        let rng = graphed::Generator::new(dev, 5)?;
        let before = (dev.default_pool().stats(), dev.reserved_bytes());
        // Inside a pool that can hold nothing: an op that allocated before refusing would fail
        // with the pool's limit instead (an allocation freed again leaves no mark on the stats).
        let empty = dev.new_pool().with_limit(0);
        let refusals = dev.with_pool(&empty, || {
            [
                ("relu", ops::relu(&s).map(drop)),
                ("add, second", ops::add(&x, &s).map(drop)),
                ("mul, first", ops::mul(&s, &x).map(drop)),
                ("scale", ops::scale(&s, 2.0).map(drop)),
                ("sum", ops::sum(&s).map(drop)),
                ("cast", ops::cast(&s, DType::BF16).map(drop)),
                ("linear, x", ops::linear(&s, &w, None).map(drop)),
                ("rms_norm", ops::rms_norm(&s, &gamma, 1e-5).map(drop)),
                ("swiglu, up", ops::swiglu(&x, &s).map(drop)),
                ("mse_loss, target", ops::mse_loss(&x, &s).map(drop)),
                ("softmax_cross_entropy", ops::softmax_cross_entropy(&s, &labels).map(drop)),
                ("split_columns", ops::split_columns(&s, &[1, D - 1]).map(drop)),
                ("concat_columns", ops::concat_columns(&[&x, &s]).map(drop)),
                ("argmax", ops::argmax(&s).map(drop)),
                ("gelu", ops::gelu(&s, ops::Gelu::Tanh).map(drop)),
                ("dropout", ops::dropout(&s, 0.5, &rng, true).map(drop)),
                ("embedding, table", ops::embedding(&labels, &s).map(drop)),
                ("layer_norm", ops::layer_norm(&s, &gamma, &gamma, 1e-5).map(drop)),
            ]
        });
        for (what, r) in refusals {
            let e = r.expect_err(what);
            assert!(matches!(e, Error::StaleTensor { .. }), "{what}: {e:?}");
        }
        let after = (dev.default_pool().stats(), dev.reserved_bytes());
        assert_eq!(after, before, "refusals of a stale handle left memory alone");
        assert_eq!(empty.stats().peak_in_use, 0, "nothing was allocated");
        Ok(())
    });
}

/// Refusals that once came after an allocation now come before any: each call fails with its
/// own error (not an allocation's), and the device's fault plan counts no allocation and no
/// kernel launch from the first refusal to the last. Mixed-precision optimizers with a bad
/// hyper-parameter or a grad shaped unlike its value; a tensor from host values while a capture
/// is in progress; the fused linear's backward with a bad weight grad (its GELU grad was made
/// first); a decoding step over heads wider than its attention kernels (refused at every run).
#[test]
fn refusals_that_allocated_first_allocate_nothing() {
    use graphed::fault::{FaultPlan, FaultPoint};
    use graphed::ops::DecoderStep;
    use graphed::optim::{AdamWConfig, MixedAdamW, MixedSgd, SgdConfig};
    on_each_backend(|dev| {
        let bf = |dims: &[usize]| Tensor::full_as(dev, dims, 0.01, DType::BF16);
        let model = vec![Param::new(bf(&[4, 8])?)?];
        let misshapen = vec![Param { value: bf(&[4, 8])?, grad: Tensor::zeros(dev, &[8, 4])? }];
        let (x, w, dy, pre) =
            (random(dev, &[2, 8], 1)?, random(dev, &[4, 8], 2)?, random(dev, &[2, 4], 3)?, random(dev, &[2, 4], 4)?);
        let bad_dw = Tensor::zeros(dev, &[8, 4])?;
        // A decoding step over 2 heads of 256.
        let wide = OneLayer::new(dev, 512, 2)?;
        let plan = FaultPlan::of(dev);
        plan.count();
        let hyper = |e: &Error| matches!(e.root(), Error::Optim(graphed::OptimError::HyperParameter { .. }));
        let shape = |e: &Error| matches!(e, Error::Shape { .. });
        type Is<'a> = &'a dyn Fn(&Error) -> bool;
        let refusals: Vec<(&str, Result<()>, Is<'_>)> = vec![
            (
                "MixedAdamW, beta1 1.5",
                MixedAdamW::new(&model, AdamWConfig { beta1: 1.5, ..Default::default() }, None).map(drop),
                &hyper,
            ),
            (
                "MixedSgd, momentum -1",
                MixedSgd::new(&model, SgdConfig { momentum: -1.0, ..Default::default() }, None).map(drop),
                &hyper,
            ),
            (
                "MixedAdamW, grad shaped unlike its value",
                MixedAdamW::new(&misshapen, AdamWConfig::default(), None).map(drop),
                &shape,
            ),
            (
                "linear_fused_backward, dw of the wrong shape",
                ops::linear_fused_backward(&dy, &x, &w, Some(&pre), &bad_dw, None, true).map(drop),
                &shape,
            ),
            ("DecoderStep::new, head dim 256", DecoderStep::new(&wide.weights()).map(drop), &shape),
        ];
        let counts = plan.counts();
        plan.off();
        for (what, r, is) in refusals {
            let e = r.expect_err(what);
            assert!(is(&e), "{what}: {e:?}");
        }
        assert_eq!(
            (counts.get(FaultPoint::Alloc), counts.get(FaultPoint::KernelLaunch)),
            (0, 0),
            "allocations and launches"
        );
        // A tensor from host values inside a capture: refused before its block is taken from the
        // graph's pool.
        let mut g = Graph::new(dev);
        let r = g.capture(CaptureMode::Global, || {
            plan.count();
            let made = Tensor::from_slice(dev, &[1.0, 2.0], &[2]).map(drop);
            let bits = Tensor::from_i32(dev, &[1, 2], &[2]).map(drop);
            let allocs = plan.counts().get(FaultPoint::Alloc);
            plan.off();
            assert_eq!(allocs, 0, "from host values inside a capture: allocations");
            for (what, r) in [("from_slice", made), ("from_i32", bits)] {
                let e = r.expect_err(what);
                assert!(matches!(e, Error::IllegalDuringCapture { .. }), "{what}: {e:?}");
            }
            Ok(Vec::<Tensor>::new())
        });
        r?;
        Ok(())
    });
}

/// `sample_and_record` refuses a NaN or negative temperature whatever the top-k, before it
/// samples or records: greedy by `top_k = 1` too. The generation's books are untouched. (The
/// one-kernel greedy step that used to take such a temperature runs only inside a WHILE body
/// captured on CUDA (the fold, the default), which this test does not reach: eagerly
/// both backends refused it before the fix too, so this test pins the behaviour, not the fix.)
#[test]
fn sample_and_record_refuses_a_bad_temperature_even_when_greedy() {
    use graphed::ops::{self, Generation, Sampling};
    on_each_backend(|dev| {
        let g = Generation::new(dev, 2, 4)?;
        let lengths = Tensor::from_i32(dev, &[1, 1], &[2])?;
        g.start(&[4, 4], ops::Stop { end: None, pad: 0 })?;
        let rng = graphed::Generator::new(dev, 3)?;
        let logits = random(dev, &[2, 5], 4)?;
        for temperature in [f32::NAN, -1.0, f32::INFINITY] {
            let s = Sampling { temperature, top_k: 1 };
            let e = ops::sample_and_record(&g, &logits, s, &rng, &lengths).expect_err("refused");
            assert!(matches!(e, Error::InvalidTemperature { .. }), "{temperature}: {e:?}");
        }
        assert_eq!((g.steps()?, g.tokens()?), (0, vec![vec![], vec![]]), "nothing recorded");
        assert_eq!(lengths.to_i32_vec()?, vec![1, 1], "the lengths are untouched");
        Ok(())
    });
}
