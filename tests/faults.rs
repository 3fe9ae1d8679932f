//! Faults as well as misuse: every allocation, launch, copy, collective and file access can
//! fail without losing anything.
//!
//! Memory first: an impossible request and a pool at its limit are typed errors, and a
//! failed `make_graphed` hands the module back with its parameters, grads, the RNG state and
//! the pools as they were. Then the sweep: representative workloads (the MLP stack, a 2-chunk
//! pipeline with buffer reuse and `w(c)` weight grads, an MLP that recomputes its norm's and
//! SwiGLU's outputs in its backward, attention over one q/k/v projection read in place, the fused step, a data-parallel step on
//! emulated ranks, a safetensors save and load, a decoder step over its KV caches, an eager
//! optimizer step, a `#[graphed]` struct model, a graph with WHILE and IF nodes) run once per
//! fault point with that point failing (`graphed::fault`), and each run must end in a typed
//! error (no panic) that leaves parameters, grads, the RNG state, the pools' bytes (and the
//! file, for a save; the caches, for a decoder step; the moments, masters and step count, for
//! an optimizer) exactly as before, with the modules handed back where the call takes them by
//! value; the same call, retried without the fault, must then succeed and give what a run that
//! never failed gives (a whole chain's backward, several launches, resumes where it stopped).

mod common;
#[path = "../examples/common/split_linear.rs"]
mod split_linear;

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;

use common::model::{Block, Mse, Stack};
use common::{backends, random};
use graphed::dist::{self, Config, DataParallel, ReduceOp};
use graphed::fault::{FaultPlan, FaultPoint};
use graphed::{
    graphed, load_safetensors, make_graphed, ops, save_safetensors, Cx, Device, Error, GraphOptions, GraphPool,
    GraphedModules, Module, OrderEntry, Param, Parameters, Result, SetupError, Tensor,
};
use split_linear::Split;

const B: usize = 3;
const H: usize = 8;

// ---------------------------------------------------------------------------------------
// Memory: impossible requests and pool limits.

/// A block whose forward asks for `extra` more elements of scratch when set (a module whose
/// activations do not fit).
pub struct Hungry {
    lin: Block,
    extra: Option<Vec<usize>>,
}

#[graphed(warmup = 2)]
impl Hungry {
    pub fn forward(&self, cx: &mut Cx, x: &Tensor) -> Result<Tensor> {
        if let Some(dims) = &self.extra {
            Tensor::empty(x.device(), dims)?;
        }
        self.lin.forward(cx, x)
    }
    pub fn backward(&mut self, cx: &mut Cx, dy: &Tensor) -> Result<Option<Tensor>> {
        self.lin.backward(cx, dy)
    }
}

/// Parameter values and grads (bit patterns), the RNG state, and pool bytes: what a failed
/// call must leave as it was.
#[derive(Debug, PartialEq)]
struct Snapshot {
    params: Vec<Vec<u32>>,
    rng: (u64, u64),
    /// `in_use` of the device's default pool and of each watched pool.
    in_use: Vec<usize>,
    /// Device bytes outside the default pool (its cache may keep a slab it grew).
    reserved_elsewhere: usize,
    /// Whatever else the call may change (a file's bytes).
    extra: Vec<u8>,
}

impl Snapshot {
    /// What differs, in words.
    fn diff(&self, after: &Snapshot) -> String {
        let mut d = Vec::new();
        for (i, (a, b)) in self.params.iter().zip(&after.params).enumerate() {
            if a != b {
                d.push(format!("parameter {} {}", i / 2, if i % 2 == 0 { "value" } else { "grad" }));
            }
        }
        if self.params.len() != after.params.len() {
            d.push("the number of parameters".into());
        }
        if self.rng != after.rng {
            d.push(format!("the RNG state {:?} -> {:?}", self.rng, after.rng));
        }
        if self.in_use != after.in_use {
            d.push(format!("pool bytes in use {:?} -> {:?}", self.in_use, after.in_use));
        }
        if self.reserved_elsewhere != after.reserved_elsewhere {
            d.push(format!("device bytes reserved {} -> {}", self.reserved_elsewhere, after.reserved_elsewhere));
        }
        if self.extra != after.extra {
            d.push("the workload's other state (a file's bytes, the caches)".into());
        }
        d.join(", ")
    }
}

fn bits(t: &Tensor) -> Result<Vec<u32>> {
    Ok(t.to_vec()?.into_iter().map(f32::to_bits).collect())
}

fn snapshot(dev: &Device, params: &[Param], pools: &[GraphPool], extra: Vec<u8>) -> Result<Snapshot> {
    let mut v = Vec::new();
    for p in params {
        v.push(bits(&p.value)?);
        v.push(bits(&p.grad)?);
    }
    let rng = dev.rng()?.seed_and_offset()?; // first: the generator may be made now
    let default = dev.default_pool().stats();
    let mut in_use = vec![default.in_use];
    in_use.extend(pools.iter().map(|p| p.stats().in_use));
    Ok(Snapshot { params: v, rng, in_use, reserved_elsewhere: dev.reserved_bytes() - default.reserved, extra })
}

#[test]
fn an_impossible_request_is_out_of_memory_not_a_panic() {
    for b in backends() {
        let dev = &b.device;
        let before = dev.reserved_bytes();
        // 2^63 bytes: more than any device holds (on the host the allocator refuses it).
        let e = Tensor::empty(dev, &[1 << 61]).unwrap_err();
        assert!(matches!(e, Error::OutOfMemory { requested, .. } if requested == 1 << 63), "{e:?}");
        // A size that does not even fit in usize.
        let e = Tensor::empty(dev, &[usize::MAX, 3]).unwrap_err();
        assert!(matches!(e, Error::OutOfMemory { requested: usize::MAX, .. }), "{e:?}");
        let e = Tensor::empty_as(dev, &[usize::MAX / 2 + 1], graphed::DType::BF16).unwrap_err();
        assert!(matches!(e, Error::OutOfMemory { requested: usize::MAX, .. }), "{e:?}");
        assert_eq!(dev.reserved_bytes(), before, "on {}: nothing allocated", dev.name());
        // The device is fine afterwards.
        assert_eq!(Tensor::full(dev, &[3], 2.0).and_then(|t| t.to_vec()).expect("a small tensor"), vec![2.0; 3]);
    }
}

/// Activations that do not fit: 2^63 bytes, and 1 GiB more than the device says it has free
/// (a real `cuMemAlloc` failure on a GPU; refused against `MemAvailable` on the host).
#[test]
fn out_of_memory_in_warm_up_hands_the_module_back_unchanged() {
    for b in backends() {
        let dev = &b.device;
        let free = match Tensor::empty(dev, &[1 << 61]) {
            Err(Error::OutOfMemory { available: Some(free), .. }) => Some(free),
            _ => None,
        };
        let mut sizes = vec![1usize << 61];
        match free {
            Some(free) => sizes.push((free + (1 << 30)) / 4),
            None => println!("on {}: the free memory is unknown; the over-free-memory case is skipped", dev.name()),
        }
        for elements in sizes {
            dev.rng().and_then(|r| r.manual_seed(3)).expect("seed");
            let x = random(dev, &[B, H], 1).expect("x").with_requires_grad(true);
            let hungry = Hungry { lin: Block::new(dev, H, H, 2).expect("block"), extra: Some(vec![elements]) };
            let params = hungry.lin.params();
            let before = snapshot(dev, &params, &[], vec![]).expect("snapshot");
            let err = hungry.make_graphed(&x).expect_err("activations that do not fit");
            match err.error().root() {
                Error::OutOfMemory { requested, .. } => assert!(*requested >= elements * 4, "{requested}"),
                e => panic!("on {}, {elements} floats: {e:?}", dev.name()),
            }
            let mut hungry = err.into_inner();
            assert!(hungry.lin.w.value.same_buffer(&params[0].value), "the same module comes back");
            assert_eq!(snapshot(dev, &params, &[], vec![]).expect("snapshot"), before, "on {}", dev.name());
            // Fix the cause: the capture works and matches eager.
            hungry.extra = None;
            let mut g = hungry.make_graphed(&x).expect("capture");
            let y = g.forward(&x).and_then(|y| y.to_vec()).expect("replay");
            let mut cx = Cx::new(dev);
            let eager = Block::new(dev, H, H, 2).and_then(|b| b.forward(&mut cx, &x)?.to_vec()).expect("eager");
            assert_eq!(y, eager);
        }
    }
}

#[test]
fn a_pool_limit_is_a_typed_error_that_leaves_nothing_behind() {
    for b in backends() {
        let dev = &b.device;
        let x = random(dev, &[B, H], 1).expect("x").with_requires_grad(true);
        // A 16 MiB scratch tensor in warm-up, under a 1 MiB limit.
        let hungry = Hungry { lin: Block::new(dev, H, H, 2).expect("block"), extra: Some(vec![4 << 20]) };
        let params = hungry.lin.params();
        let before = snapshot(dev, &params, &[], vec![]).expect("snapshot");
        let opts = GraphedHungry::options().pool_limit(1 << 20);
        let err = GraphedHungry::new(hungry, graphed_inputs(&x), opts).expect_err("over the limit");
        match err.error().root() {
            Error::PoolLimit { requested, limit, reserved, .. } => {
                assert_eq!((*requested, *limit), (16 << 20, 1 << 20));
                assert!(*reserved <= 1 << 20);
            }
            e => panic!("on {}: {e:?}", dev.name()),
        }
        let mut hungry = err.into_inner();
        assert_eq!(snapshot(dev, &params, &[], vec![]).expect("snapshot"), before);
        // Within the limit the same capture works, and the pool never passes it.
        hungry.extra = Some(vec![64 << 10]);
        let g = GraphedHungry::new(hungry, graphed_inputs(&x), GraphedHungry::options().pool_limit(1 << 20))
            .expect("within the limit");
        let stats = g.inner().pool().stats();
        assert_eq!(stats.limit, Some(1 << 20));
        assert!(stats.peak_reserved <= 1 << 20 && stats.peak_in_use <= stats.peak_reserved, "{stats:?}");

        // A user's pool with a limit: refused growth changes nothing, the pool stays usable.
        let pool = dev.new_pool().with_limit(128 << 10);
        let a = dev.with_pool(&pool, || Tensor::zeros(dev, &[16 << 10])).expect("64 KiB fits");
        let s = pool.stats();
        let e = dev.with_pool(&pool, || Tensor::zeros(dev, &[32 << 10])).unwrap_err();
        assert!(matches!(e, Error::PoolLimit { requested: 131072, limit: 131072, .. }), "{e:?}");
        assert_eq!(pool.stats(), s, "a refused request changes no count");
        pool.set_limit(None);
        let c = dev.with_pool(&pool, || Tensor::zeros(dev, &[32 << 10])).expect("the limit lifted");
        assert_eq!(pool.stats().in_use, 3 * (64 << 10));
        drop((a, c));
        assert_eq!(pool.stats().in_use, 0);
        // pool_limit together with a given pool is refused before anything runs.
        let block = Block::new(dev, H, H, 2).expect("block");
        let opts = GraphOptions::new().pool(&pool).pool_limit(1);
        let err = make_graphed(vec![Box::new(block)], vec![vec![vec![Some(x.clone())]]], opts).unwrap_err();
        assert!(matches!(err.error(), Error::Setup(SetupError::PoolLimitWithPool)), "{:?}", err.error());
    }
}

fn graphed_inputs(x: &Tensor) -> HungryInputs {
    HungryInputs { x: x.clone() }
}

// ---------------------------------------------------------------------------------------
// The sweep.

/// A workload: calls of the API, each swept separately. `setup(dev, k)` builds everything
/// up to call `k` (without faults); `call` makes call `k`; a call that takes modules by value
/// puts them back into the state from its error.
trait Workload {
    type State;
    /// The calls, by name.
    const CALLS: &'static [&'static str];
    fn setup(&self, dev: &Device, call: usize) -> Result<Self::State>;
    fn call(&self, st: &mut Self::State, call: usize) -> Result<()>;
    /// The parameters now (of the modules wherever they are: handed back or graphed).
    fn params(&self, st: &Self::State) -> Vec<Param>;
    /// The pools whose bytes must not change (besides the device's default pool).
    fn pools(&self, st: &Self::State) -> Vec<GraphPool>;
    /// Other state a failed call must leave alone (bytes of a file, a decoder's caches).
    fn extra(&self, _st: &Self::State) -> Vec<u8> {
        Vec::new()
    }
    /// What a successful call produced, read after it (outputs, grads, a replay's results).
    fn observe(&self, st: &mut Self::State, call: usize) -> Result<Vec<Vec<u32>>>;
    /// Whether the call is several launches that a failure can stop partway, after which the
    /// same call resumes (a whole chain's backward): then what the failure leaves is not
    /// compared, only the retry's results.
    fn resumes(&self, _call: usize) -> bool {
        false
    }
}

/// Which passes of a point to fail: all of them up to `CAP`, else `CAP` spread evenly (the
/// first and the last included).
fn picks(count: u64) -> Vec<u64> {
    const CAP: u64 = 1000;
    if count <= CAP {
        return (0..count).collect();
    }
    let mut v: Vec<u64> = (0..CAP).map(|i| i * (count - 1) / (CAP - 1)).collect();
    v.dedup();
    v
}

/// The error kinds a failure at `point` may surface as (inside any context).
fn typed_for(point: FaultPoint, e: &Error) -> bool {
    let root = match e.root() {
        Error::Hook { source, .. } => source.root(),
        r => r,
    };
    match point {
        FaultPoint::Alloc | FaultPoint::SlabGrowth => matches!(root, Error::OutOfMemory { .. }),
        FaultPoint::KernelLaunch | FaultPoint::GraphInstantiate | FaultPoint::GraphLaunch | FaultPoint::Copy => {
            matches!(root, Error::Cuda { .. })
        }
        FaultPoint::Collective => matches!(root, Error::Dist(_)),
        FaultPoint::FileRead | FaultPoint::FileWrite => matches!(root, Error::CheckpointIo { .. }),
        _ => false,
    }
}

/// What the sweep saw.
#[derive(Default)]
struct Report {
    points: usize,
    failures: Vec<String>,
}

impl Report {
    fn fail(&mut self, what: String) {
        eprintln!("FAULT SWEEP FAILURE: {what}");
        self.failures.push(what);
    }
}

/// Sweeps every call of `w` on `dev`: every fault point it passes (or a spread of them),
/// each failing once.
fn sweep<W: Workload>(dev: &Device, name: &str, w: &W, report: &mut Report) -> Result<()> {
    let plan = FaultPlan::of(dev);
    for (k, call_name) in W::CALLS.iter().enumerate() {
        // A run without faults: which points the call passes, and what it gives.
        let mut st = w.setup(dev, k)?;
        plan.count();
        let r = w.call(&mut st, k);
        plan.off();
        r.map_err(|e| e.context(format!("{name}: {call_name} without faults")))?;
        let counts = plan.counts();
        let reference = w.observe(&mut st, k)?;
        drop(st);
        let mut swept = 0;
        for point in FaultPoint::ALL {
            for n in picks(counts.get(point)) {
                let at = format!("{name} on {}: {call_name}, {point:?} #{n}", dev.name());
                swept += 1;
                let mut st = w.setup(dev, k)?;
                let before = snapshot(dev, &w.params(&st), &w.pools(&st), w.extra(&st))?;
                plan.fail(point, n);
                let r = catch_unwind(AssertUnwindSafe(|| w.call(&mut st, k)));
                let fired = plan.fired();
                plan.off();
                match r {
                    Err(_) => {
                        report.fail(format!("{at}: panicked"));
                        continue;
                    }
                    Ok(Ok(())) if fired.is_some() => {
                        report.fail(format!("{at}: the fault fired but the call succeeded"));
                        continue;
                    }
                    Ok(Ok(())) => {
                        report.fail(format!("{at}: not reached (the run passed fewer points than counted)"));
                        continue;
                    }
                    Ok(Err(e)) if !typed_for(point, &e) => {
                        report.fail(format!("{at}: unexpected error {e:?}"));
                        continue;
                    }
                    Ok(Err(_)) => {}
                }
                let after = snapshot(dev, &w.params(&st), &w.pools(&st), w.extra(&st))?;
                if after != before && !w.resumes(k) {
                    report.fail(format!("{at}: changed {}", before.diff(&after)));
                    continue;
                }
                if let Err(e) = w.call(&mut st, k) {
                    report.fail(format!("{at}: the retry failed: {e}"));
                    continue;
                }
                match w.observe(&mut st, k) {
                    Ok(got) if got == reference => {}
                    Ok(_) => report.fail(format!("{at}: the retry's results differ from a run without faults")),
                    Err(e) => report.fail(format!("{at}: reading the retry's results: {e}")),
                }
            }
        }
        report.points += swept;
        println!(
            "  {name} on {}: {call_name}: {swept} fault points swept ({} passes counted)",
            dev.name(),
            counts.total()
        );
    }
    Ok(())
}

fn all_bits(tensors: impl IntoIterator<Item = Tensor>) -> Result<Vec<Vec<u32>>> {
    tensors.into_iter().map(|t| bits(&t)).collect()
}

fn param_bits(params: &[Param]) -> Result<Vec<Vec<u32>>> {
    all_bits(params.iter().flat_map(|p| [p.value.clone(), p.grad.clone()]))
}

/// The MLP job's shape: a stack of Linear + GELU blocks, then dropout (warm-up and capture
/// draw random numbers, which `make_graphed` must give back) and a weight-decay term added to
/// the first weight's grad in backward (warm-up changes grads, which it must restore too).
pub struct Net {
    stack: Stack,
}

#[graphed(warmup = 3)]
impl Net {
    pub fn forward(&self, cx: &mut Cx, x: &Tensor) -> Result<Tensor> {
        let h = self.stack.forward(cx, x)?;
        let (y, mask) = ops::dropout(&h, 0.25, &x.device().rng()?, cx.training())?;
        if let Some(mask) = mask {
            cx.save(&mask);
        }
        Ok(y)
    }
    pub fn backward(&mut self, cx: &mut Cx, dy: &Tensor) -> Result<Option<Tensor>> {
        let dh = ops::dropout_backward(dy, &cx.saved(0)?)?;
        let w = &self.stack.blocks[0].w;
        ops::axpy_(&w.grad, 1e-2, &w.value)?;
        self.stack.backward(cx, &dh)
    }
}

/// `make_graphed` restores the grads of the parameters a module exposes.
impl Parameters for Net {
    fn visit_params(&self, prefix: &str, f: &mut dyn FnMut(&str, &Param)) {
        for (i, p) in self.stack.params().iter().enumerate() {
            f(&format!("{prefix}p{i}"), p);
        }
    }
}

/// The MLP net captured by the typed wrapper (which takes it by value), then one training
/// step of replays.
struct Mlp;

struct MlpState {
    dev: Device,
    x: Tensor,
    dy: Tensor,
    net: Option<Net>,
    g: Option<GraphedNet>,
}

impl Workload for Mlp {
    type State = MlpState;
    const CALLS: &'static [&'static str] = &["make_graphed", "forward", "backward"];

    fn setup(&self, dev: &Device, call: usize) -> Result<MlpState> {
        dev.rng()?.manual_seed(11)?;
        let x = random(dev, &[B, H], 1)?.with_requires_grad(true);
        let dy = random(dev, &[B, H], 2)?;
        let net = Net { stack: Stack::new(dev, 2, H, 5)? };
        for (i, p) in net.stack.params().iter().enumerate() {
            p.grad.copy_from_slice(&common::random_vec(p.grad.numel(), 80 + i as u64))?;
        }
        let mut st = MlpState { dev: dev.clone(), x, dy, net: Some(net), g: None };
        for k in 0..call {
            self.call(&mut st, k)?;
        }
        Ok(st)
    }

    fn call(&self, st: &mut MlpState, call: usize) -> Result<()> {
        match call {
            0 => {
                let net = st.net.take().expect("the net");
                match net.make_graphed(&st.x) {
                    Ok(g) => st.g = Some(g),
                    Err(e) => {
                        let (e, net) = e.into_parts();
                        st.net = Some(net);
                        return Err(e);
                    }
                }
            }
            1 => drop(st.g.as_mut().expect("graphed").forward(&st.x)?),
            _ => drop(st.g.as_mut().expect("graphed").backward(&st.dy)?),
        }
        Ok(())
    }

    fn params(&self, st: &MlpState) -> Vec<Param> {
        match (&st.net, &st.g) {
            (Some(n), _) => n.stack.params(),
            (None, Some(g)) => g.module().stack.params(),
            (None, None) => panic!("the net was lost"),
        }
    }

    fn pools(&self, st: &MlpState) -> Vec<GraphPool> {
        st.g.iter().map(|g| g.inner().pool().clone()).collect()
    }

    fn observe(&self, st: &mut MlpState, call: usize) -> Result<Vec<Vec<u32>>> {
        let mut out = param_bits(&self.params(st))?;
        out.push(bits(&Tensor::from_slice(&st.dev, &[st.dev.rng()?.seed_and_offset()?.1 as f32], &[1])?)?);
        let g = st.g.as_mut().expect("graphed");
        if call == 0 {
            // The captured graphs compute what eager code does.
            out.push(bits(&g.forward(&st.x)?)?);
            out.extend(g.backward(&st.dy)?.map(|d| bits(&d)).transpose()?);
        }
        Ok(out)
    }
}

/// A pre-norm SwiGLU MLP whose backward keeps neither the norm's nor SwiGLU's output and makes
/// both again (`linear_input_grad`, `swiglu_packed_backward_recompute`, `rms_norm_recompute`),
/// as the GPT's blocks do under `--recompute all`.
#[derive(Parameters)]
pub struct Recomputing {
    norm: Param,
    w_gu: Param,
    w_down: Param,
}

/// The recomputing MLP's hidden width (not a multiple of the 16-byte packs).
const HID: usize = 12;

#[graphed(warmup = 2)]
impl Recomputing {
    pub fn forward(&self, cx: &mut Cx, x: &Tensor) -> Result<Tensor> {
        let (h, rstd) = ops::rms_norm(x, &self.norm.value, 1e-5)?;
        let gu = ops::linear(&h, &self.w_gu.value, None)?;
        let y = ops::linear(&ops::swiglu_packed(&gu)?, &self.w_down.value, None)?;
        for t in [x, &rstd, &gu] {
            cx.save(t);
        }
        Ok(y)
    }
    pub fn backward(&mut self, cx: &mut Cx, dy: &Tensor) -> Result<Option<Tensor>> {
        let (x, rstd, gu) = (cx.saved(0)?, cx.saved(1)?, cx.saved(2)?);
        let ds = ops::linear_input_grad(dy, &self.w_down.value)?;
        let (dgu, s) = ops::swiglu_packed_backward_recompute(&ds, &gu)?;
        ops::linear_backward(dy, &s, &self.w_down.value, &self.w_down.grad, None, false)?;
        let h = ops::rms_norm_recompute(&x, &self.norm.value, &rstd)?;
        let dh = ops::linear_backward(&dgu, &h, &self.w_gu.value, &self.w_gu.grad, None, true)?
            .ok_or_else(|| Error::msg("linear_backward returned no dx"))?;
        Ok(Some(ops::rms_norm_backward(&dh, &x, &self.norm.value, &rstd, &self.norm.grad)?))
    }
}

/// A workload of one `#[graphed]` module captured by its typed wrapper, then one training step
/// of replays: `make_graphed`, `forward`, `backward`. `$inputs(dev)` makes the input, the
/// output's grad and the module; the module's grads start from `random_vec` at `$grad_seed`
/// on, so that a failure that touched them would show.
macro_rules! typed_module_workload {
    ($(#[$doc:meta])* $workload:ident, $state:ident, $module:ty, $graphed:ty, $grad_seed:expr, $inputs:expr) => {
        $(#[$doc])*
        struct $workload;

        struct $state {
            x: Tensor,
            dy: Tensor,
            module: Option<$module>,
            g: Option<$graphed>,
        }

        impl Workload for $workload {
            type State = $state;
            const CALLS: &'static [&'static str] = &["make_graphed", "forward", "backward"];

            fn setup(&self, dev: &Device, call: usize) -> Result<$state> {
                let inputs: fn(&Device) -> Result<(Tensor, Tensor, $module)> = $inputs;
                let (x, dy, module) = inputs(dev)?;
                for (i, p) in module.trainable_params().iter().enumerate() {
                    p.grad.copy_from_slice(&common::random_vec(p.grad.numel(), $grad_seed + i as u64))?;
                }
                let mut st = $state { x, dy, module: Some(module), g: None };
                for k in 0..call {
                    self.call(&mut st, k)?;
                }
                Ok(st)
            }

            fn call(&self, st: &mut $state, call: usize) -> Result<()> {
                match call {
                    0 => {
                        let module = st.module.take().expect("the module");
                        match module.make_graphed(&st.x) {
                            Ok(g) => st.g = Some(g),
                            Err(e) => {
                                let (e, module) = e.into_parts();
                                st.module = Some(module);
                                return Err(e);
                            }
                        }
                    }
                    1 => drop(st.g.as_mut().expect("graphed").forward(&st.x)?),
                    _ => drop(st.g.as_mut().expect("graphed").backward(&st.dy)?),
                }
                Ok(())
            }

            fn params(&self, st: &$state) -> Vec<Param> {
                match (&st.module, &st.g) {
                    (Some(m), _) => m.trainable_params(),
                    (None, Some(g)) => g.module().trainable_params(),
                    (None, None) => panic!("the module was lost"),
                }
            }

            fn pools(&self, st: &$state) -> Vec<GraphPool> {
                st.g.iter().map(|g| g.inner().pool().clone()).collect()
            }

            fn observe(&self, st: &mut $state, call: usize) -> Result<Vec<Vec<u32>>> {
                let mut out = param_bits(&self.params(st))?;
                let g = st.g.as_mut().expect("graphed");
                if call == 0 {
                    // The captured graphs compute what eager code does.
                    out.push(bits(&g.forward(&st.x)?)?);
                    out.extend(g.backward(&st.dy)?.map(|d| bits(&d)).transpose()?);
                }
                Ok(out)
            }
        }
    };
}

typed_module_workload!(
    /// The recomputing MLP captured by the typed wrapper, then one training step of replays.
    Recompute,
    RecomputeState,
    Recomputing,
    GraphedRecomputing,
    90,
    |dev| {
        let x = random(dev, &[B, H], 61)?.with_requires_grad(true);
        let dy = random(dev, &[B, H], 62)?;
        let module = Recomputing {
            norm: Param::new(random(dev, &[H], 63)?)?,
            w_gu: Param::new(random(dev, &[2 * HID, H], 64)?)?,
            w_down: Param::new(random(dev, &[H, HID], 65)?)?,
        };
        Ok((x, dy, module))
    }
);

/// Self-attention over one q/k/v projection read in place (`flash_attention_packed`, cuDNN's
/// plans and workspace on CUDA where it runs) whose output projection adds into the residual
/// in its GEMM (`linear_residual`, cublasLt on CUDA), bf16: one head of 64, `SEQ` positions.
#[derive(Parameters)]
pub struct PackedAttention {
    w_qkv: Param,
    wo: Param,
}

/// The attention workload's sequence length (not a multiple of the kernels' tiles).
const SEQ: usize = 20;
/// Its width: one head of 64.
const WIDTH: usize = 64;

#[graphed(warmup = 2)]
impl PackedAttention {
    pub fn forward(&self, cx: &mut Cx, x: &Tensor) -> Result<Tensor> {
        let qkv = ops::linear(x, &self.w_qkv.value, None)?;
        let (att, lse) = ops::flash_attention_packed(&qkv, &ops::Attention::causal(1))?;
        let y = ops::linear_residual(&att, &self.wo.value, x)?;
        for t in [x, &qkv, &att, &lse] {
            cx.save(t);
        }
        Ok(y)
    }
    pub fn backward(&mut self, cx: &mut Cx, dy: &Tensor) -> Result<Option<Tensor>> {
        let (x, qkv, att, lse) = (cx.saved(0)?, cx.saved(1)?, cx.saved(2)?, cx.saved(3)?);
        let datt = ops::linear_backward(dy, &att, &self.wo.value, &self.wo.grad, None, true)?
            .ok_or_else(|| Error::msg("linear_backward returned no dx"))?;
        let at = ops::Attention::causal(1);
        let dqkv = ops::flash_attention_packed_backward(&datt, &qkv, &att, &lse, &at)?;
        // The residual's grad is the output's.
        let dx = ops::linear_backward(&dqkv, &x, &self.w_qkv.value, &self.w_qkv.grad, None, true)?
            .ok_or_else(|| Error::msg("linear_backward returned no dx"))?;
        Ok(Some(ops::add(&dx, dy)?))
    }
}

typed_module_workload!(
    /// The packed attention block captured by the typed wrapper, then one training step of
    /// replays.
    Attention,
    AttentionState,
    PackedAttention,
    GraphedPackedAttention,
    95,
    |dev| {
        let bf16 = |dims: &[usize], seed: u64| random(dev, dims, seed)?.to_dtype(graphed::DType::BF16);
        let x = bf16(&[2, SEQ, WIDTH], 71)?.with_requires_grad(true);
        let dy = bf16(&[2, SEQ, WIDTH], 72)?;
        let module = PackedAttention {
            w_qkv: Param::new(bf16(&[3 * WIDTH, WIDTH], 73)?)?,
            wo: Param::new(bf16(&[WIDTH, WIDTH], 74)?)?,
        };
        Ok((x, dy, module))
    }
);

/// A 2-chunk pipeline of split layers over four microbatches, two in flight, with static
/// surfaces reused and separate weight-grad graphs (`w(c)`): make_graphed, then every
/// per-call replay of one iteration.
struct Pipeline;

const LONG: [i32; 24] = [1, 2, -2, 1, 2, -1, 92, -2, 91, 1, 2, -1, 92, -2, 91, 1, 2, -1, 92, -2, 91, -1, 92, 91];

fn long_order() -> Vec<OrderEntry> {
    LONG.iter().map(|&e| if e > 90 { OrderEntry::Wgrad((e - 90) as usize) } else { e.into() }).collect()
}

struct PipeState {
    dev: Device,
    xs: Vec<Tensor>,
    dys: Vec<Tensor>,
    modules: Option<Vec<Box<dyn Module>>>,
    params: Vec<Param>,
    g: Option<GraphedModules>,
    fwd: [usize; 2],
    bwd: [usize; 2],
}

fn split(dev: &Device, seed: u64) -> Result<Split> {
    Ok(Split { w: Param::new(random(dev, &[H, H], seed)?)?, b: Param::new(random(dev, &[H], seed + 1)?)? })
}

impl Workload for Pipeline {
    type State = PipeState;
    const CALLS: &'static [&'static str] = &[
        "make_graphed",
        "+1 mb0",
        "+2 mb0",
        "-2 mb0",
        "+1 mb1",
        "+2 mb1",
        "-1 mb0",
        "w(2) mb0",
        "-2 mb1",
        "w(1) mb0",
        "+1 mb2",
        "+2 mb2",
        "-1 mb1",
        "w(2) mb1",
        "-2 mb2",
        "w(1) mb1",
        "+1 mb3",
        "+2 mb3",
        "-1 mb2",
        "w(2) mb2",
        "-2 mb3",
        "w(1) mb2",
        "-1 mb3",
        "w(2) mb3",
        "w(1) mb3",
    ];

    fn setup(&self, dev: &Device, call: usize) -> Result<PipeState> {
        let xs = (0..4).map(|m| Ok(random(dev, &[B, H], 30 + m)?.with_requires_grad(true))).collect::<Result<_>>()?;
        let dys = (0..4).map(|m| random(dev, &[B, H], 40 + m)).collect::<Result<_>>()?;
        let (a, b) = (split(dev, 1)?, split(dev, 3)?);
        let params = a.parameters().into_iter().chain(b.parameters()).map(|(_, p)| p).collect();
        let mut st = PipeState {
            dev: dev.clone(),
            xs,
            dys,
            modules: Some(vec![Box::new(a), Box::new(b)]),
            params,
            g: None,
            fwd: [0; 2],
            bwd: [0; 2],
        };
        for k in 0..call {
            self.call(&mut st, k)?;
        }
        Ok(st)
    }

    fn call(&self, st: &mut PipeState, call: usize) -> Result<()> {
        if call == 0 {
            let hidden = Tensor::zeros(&st.dev, &[B, H])?.with_requires_grad(true);
            let samples = vec![vec![vec![Some(st.xs[0].clone())]], vec![vec![Some(hidden)]]];
            let opts = GraphOptions::new().warmup(2).order(long_order()).chained(true);
            let modules = st.modules.take().expect("the modules");
            return match make_graphed(modules, samples, opts) {
                Ok(g) => {
                    st.g = Some(g);
                    Ok(())
                }
                Err(e) => {
                    let (e, modules) = e.into_parts();
                    st.modules = Some(modules);
                    Err(e)
                }
            };
        }
        let g = st.g.as_mut().expect("graphed");
        match long_order()[call - 1] {
            OrderEntry::Forward(1) => {
                g.forward(0, &[Some(st.xs[st.fwd[0]].clone())])?;
                st.fwd[0] += 1;
            }
            OrderEntry::Forward(_) => {
                let h = g.outputs(0, st.fwd[1])?.remove(0);
                g.forward(1, &[h])?;
                st.fwd[1] += 1;
            }
            OrderEntry::Backward(2) => {
                g.backward(1, &[Some(st.dys[st.bwd[1]].clone())])?;
                st.bwd[1] += 1;
            }
            OrderEntry::Backward(_) => {
                let dh = g.grad_inputs(1, st.bwd[0])?.remove(0);
                g.backward(0, &[dh])?;
                st.bwd[0] += 1;
            }
            OrderEntry::Wgrad(c) => g.backward_weights(c - 1)?,
        }
        Ok(())
    }

    fn params(&self, st: &PipeState) -> Vec<Param> {
        assert!(st.modules.is_some() || st.g.is_some(), "the modules were lost");
        st.params.clone()
    }

    fn pools(&self, st: &PipeState) -> Vec<GraphPool> {
        st.g.iter().map(|g| g.pool().clone()).collect()
    }

    fn observe(&self, st: &mut PipeState, call: usize) -> Result<Vec<Vec<u32>>> {
        let mut out = param_bits(&st.params)?;
        if let Some(modules) = &st.modules {
            out.push(vec![modules.len() as u32]);
        }
        if call > 0 {
            let g = st.g.as_ref().expect("graphed");
            let (f, b) = (st.fwd, st.bwd);
            if f[1] > 0 {
                out.extend(
                    g.outputs(1, f[1] - 1)?.into_iter().flatten().map(|t| bits(&t)).collect::<Result<Vec<_>>>()?,
                );
            }
            if b[0] > 0 {
                out.extend(
                    g.grad_inputs(0, b[0] - 1)?.into_iter().flatten().map(|t| bits(&t)).collect::<Result<Vec<_>>>()?,
                );
            }
        }
        Ok(out)
    }
}

/// The pipeline above fused into one launch (its reused surfaces get bound buffers of their
/// own: `fuse` allocates and copies): `fuse`, then a `step`.
struct Fused;

struct FusedState {
    g: GraphedModules,
    params: Vec<Param>,
}

impl Workload for Fused {
    type State = FusedState;
    const CALLS: &'static [&'static str] = &["fuse", "step"];

    fn setup(&self, dev: &Device, call: usize) -> Result<FusedState> {
        let pipe = Pipeline.setup(dev, 1)?;
        let mut st = FusedState { g: pipe.g.expect("graphed"), params: pipe.params };
        if call > 0 {
            st.g.fuse()?;
            for m in 0..4 {
                st.g.static_inputs(0, m)?[0].as_ref().expect("x").copy_(&pipe.xs[m])?;
                st.g.static_grad_outputs(1, m)?[0].as_ref().expect("dy").copy_(&pipe.dys[m])?;
            }
        }
        Ok(st)
    }

    fn call(&self, st: &mut FusedState, call: usize) -> Result<()> {
        match call {
            0 => st.g.fuse(),
            _ => st.g.step(),
        }
    }

    fn params(&self, st: &FusedState) -> Vec<Param> {
        st.params.clone()
    }

    fn pools(&self, st: &FusedState) -> Vec<GraphPool> {
        vec![st.g.pool().clone()]
    }

    fn observe(&self, st: &mut FusedState, call: usize) -> Result<Vec<Vec<u32>>> {
        let mut out = param_bits(&st.params)?;
        out.push(vec![u32::from(st.g.is_fused())]);
        if call > 0 {
            for m in 0..4 {
                out.push(bits(st.g.outputs(1, m)?[0].as_ref().expect("y"))?);
                out.push(bits(st.g.grad_inputs(0, m)?[0].as_ref().expect("dx"))?);
            }
        }
        Ok(out)
    }
}

/// A safetensors save over an earlier file, and a load of a file with other values.
struct Checkpoint;

struct CheckpointState {
    module: Split,
    path: PathBuf,
}

fn temp_file(name: &str, dev: &Device) -> PathBuf {
    let backend = if dev.is_host() { "host" } else { "cuda" };
    std::env::temp_dir().join(format!("graphed-faults-{name}-{backend}-{}.safetensors", std::process::id()))
}

impl Workload for Checkpoint {
    type State = CheckpointState;
    const CALLS: &'static [&'static str] = &["save", "load"];

    fn setup(&self, dev: &Device, call: usize) -> Result<CheckpointState> {
        let path = temp_file(&format!("call{call}"), dev);
        // An earlier file with other values: a failed save must leave it, a load reads it.
        save_safetensors(&split(dev, 20)?, &path)?;
        let module = split(dev, 21)?;
        module.w.grad.copy_from_slice(&common::random_vec(H * H, 22))?;
        Ok(CheckpointState { module, path })
    }

    fn call(&self, st: &mut CheckpointState, call: usize) -> Result<()> {
        match call {
            0 => save_safetensors(&st.module, &st.path),
            _ => load_safetensors(&st.module, &st.path),
        }
    }

    fn params(&self, st: &CheckpointState) -> Vec<Param> {
        st.module.parameters().into_iter().map(|(_, p)| p).collect()
    }

    fn pools(&self, _st: &CheckpointState) -> Vec<GraphPool> {
        Vec::new()
    }

    fn extra(&self, st: &CheckpointState) -> Vec<u8> {
        std::fs::read(&st.path).unwrap_or_default()
    }

    fn observe(&self, st: &mut CheckpointState, _call: usize) -> Result<Vec<Vec<u32>>> {
        let mut out = param_bits(&self.params(st))?;
        out.push(self.extra(st).into_iter().map(u32::from).collect());
        Ok(out)
    }
}

/// A decoder's step over its KV caches (`ops::DecoderStep`): `new` (on CUDA it writes the
/// one kernel's table), then one `run` of 3 sequences that appends to every layer's cache. A
/// failed run leaves every cache as it was: its lengths, and what they cover.
struct Decoding;

/// Sizes of the decoding workload: vocab, context, d_model, heads, hidden, cache length,
/// cached sequences, layers.
const DEC: (usize, usize, usize, usize, usize, usize, usize, usize) = (16, 8, 8, 2, 16, 6, 3, 2);

struct DecodingState {
    /// tok, pos, head_norm, head, then per layer norm1, qkv, wo, norm2, gate_up, down.
    weights: Vec<Tensor>,
    /// Per layer: k cache, v cache, lengths.
    caches: Vec<[Tensor; 3]>,
    step: Option<ops::DecoderStep>,
    ids: Tensor,
    positions: Tensor,
    logits: Option<Tensor>,
}

impl DecodingState {
    fn step(&self) -> Result<ops::DecoderStep> {
        let (_, _, _, heads, ..) = DEC;
        let w = &self.weights;
        let layers = self
            .caches
            .iter()
            .enumerate()
            .map(|(i, [k, v, l])| {
                let lw = &w[4 + 6 * i..4 + 6 * (i + 1)];
                ops::DecoderLayer {
                    norm1: &lw[0],
                    qkv: &lw[1],
                    wo: &lw[2],
                    norm2: &lw[3],
                    gate_up: &lw[4],
                    down: &lw[5],
                    k_cache: k,
                    v_cache: v,
                    lengths: l,
                }
            })
            .collect();
        let dw =
            ops::DecoderWeights { tok: &w[0], pos: &w[1], layers, head_norm: &w[2], head: &w[3], heads, eps: 1e-5 };
        ops::DecoderStep::new(&dw)
    }
}

impl Workload for Decoding {
    type State = DecodingState;
    const CALLS: &'static [&'static str] = &["DecoderStep::new", "DecoderStep::run"];

    fn setup(&self, dev: &Device, call: usize) -> Result<DecodingState> {
        let (vocab, ctx, d, heads, hidden, max_len, seqs, layers) = DEC;
        let mut dims = vec![vec![vocab, d], vec![ctx, d], vec![d], vec![vocab, d]];
        for _ in 0..layers {
            dims.extend([vec![d], vec![3 * d, d], vec![d, d], vec![d], vec![2 * hidden, d], vec![d, hidden]]);
        }
        let weights =
            dims.iter().enumerate().map(|(i, dims)| random(dev, dims, 200 + i as u64)).collect::<Result<_>>()?;
        let lens = [2, 0, 3];
        let caches = (0..layers)
            .map(|i| -> Result<[Tensor; 3]> {
                let cache = [seqs, heads, max_len, d / heads];
                Ok([
                    random(dev, &cache, 300 + i as u64)?,
                    random(dev, &cache, 400 + i as u64)?,
                    Tensor::from_i32(dev, &lens, &[seqs])?,
                ])
            })
            .collect::<Result<_>>()?;
        let ids = Tensor::from_slice(dev, &[3.0, 7.0, 1.0], &[seqs])?;
        let positions = Tensor::from_slice(dev, &lens.map(|l| l as f32), &[seqs])?;
        let mut st = DecodingState { weights, caches, step: None, ids, positions, logits: None };
        if call > 0 {
            st.step = Some(st.step()?);
        }
        Ok(st)
    }

    fn call(&self, st: &mut DecodingState, call: usize) -> Result<()> {
        match call {
            0 => st.step = Some(st.step()?),
            _ => st.logits = Some(st.step.as_ref().expect("the step").run(&st.ids, &st.positions)?),
        }
        Ok(())
    }

    fn params(&self, _st: &DecodingState) -> Vec<Param> {
        Vec::new()
    }

    fn pools(&self, _st: &DecodingState) -> Vec<GraphPool> {
        Vec::new()
    }

    /// The weights, each cache's lengths and the keys and values they cover (positions past a
    /// length hold nothing: a failed step may have written there).
    fn extra(&self, st: &DecodingState) -> Vec<u8> {
        let (_, _, d, heads, _, max_len, ..) = DEC;
        let mut out = Vec::new();
        let mut push = |v: &[f32]| out.extend(v.iter().flat_map(|x| x.to_bits().to_le_bytes()));
        for w in &st.weights {
            push(&w.to_vec().expect("weights"));
        }
        for [k, v, l] in &st.caches {
            let lens = l.to_i32_vec().expect("lengths");
            push(&lens.iter().map(|&x| x as f32).collect::<Vec<_>>());
            let (k, v) = (k.to_vec().expect("k cache"), v.to_vec().expect("v cache"));
            let hd = d / heads;
            for (b, &len) in lens.iter().enumerate() {
                for h in 0..heads {
                    let at = (b * heads + h) * max_len * hd;
                    let n = len.clamp(0, max_len as i32) as usize * hd;
                    push(&k[at..at + n]);
                    push(&v[at..at + n]);
                }
            }
        }
        out
    }

    fn observe(&self, st: &mut DecodingState, _call: usize) -> Result<Vec<Vec<u32>>> {
        let mut out = vec![self.extra(st).into_iter().map(u32::from).collect()];
        out.push(vec![u32::from(st.step.as_ref().is_some_and(|s| s.is_fused()))]);
        if let Some(l) = &st.logits {
            out.push(bits(l)?);
        }
        Ok(out)
    }
}

/// One optimizer step, eager, in its default form (one launch over every parameter): AdamW
/// over f32 weights, the mixed-precision AdamW over bf16 weights, and over f16 weights with a
/// loss scaler; SGD with momentum over f32 weights, and its mixed-precision form over bf16
/// weights with a loss scaler. A failed step leaves the weights, grads, masters, moments (or
/// momentum buffers), step count and scale as they were. Not swept, because it does not hold
/// to it: `Launches::PerTensor` (a failed launch leaves the parameters before it updated).
struct Optimizer;

enum Opt {
    Adam(graphed::optim::AdamW),
    Mixed(graphed::optim::MixedAdamW),
    Sgd(graphed::optim::Sgd),
    MixedSgd(graphed::optim::MixedSgd),
}

struct OptimizerState {
    params: Vec<Param>,
    opt: Opt,
}

impl Workload for Optimizer {
    type State = OptimizerState;
    const CALLS: &'static [&'static str] = &[
        "AdamW::step",
        "MixedAdamW::step (bf16)",
        "MixedAdamW::step (f16, loss scaler)",
        "Sgd::step (momentum)",
        "MixedSgd::step (bf16, loss scaler)",
    ];

    fn setup(&self, dev: &Device, call: usize) -> Result<OptimizerState> {
        use graphed::optim::{AdamW, AdamWConfig, LossScaler, LossScalerConfig, MixedAdamW, MixedSgd, Sgd, SgdConfig};
        use graphed::DType;
        let dtype = [DType::F32, DType::BF16, DType::F16, DType::F32, DType::BF16][call];
        let params = (0..3)
            .map(|i| -> Result<Param> {
                let dims = [[H, H], [H, 1], [2, H]][i];
                let value =
                    Tensor::from_slice_as(dev, &common::random_vec(dims[0] * dims[1], 500 + i as u64), &dims, dtype)?;
                let p = Param::new(value)?;
                p.grad.copy_from_slice(&common::random_vec(p.grad.numel(), 600 + i as u64))?;
                Ok(p)
            })
            .collect::<Result<Vec<_>>>()?;
        let config = AdamWConfig { lr: 1e-2, ..Default::default() };
        let sgd = SgdConfig { lr: 1e-2, momentum: 0.9, weight_decay: 1e-3 };
        let scaler = || LossScaler::new(dev, LossScalerConfig { init_scale: 64.0, ..Default::default() });
        let opt = match call {
            0 => Opt::Adam(AdamW::new(&params, config)?),
            1 => Opt::Mixed(MixedAdamW::new(&params, config, None)?),
            2 => Opt::Mixed(MixedAdamW::new(&params, config, Some(scaler()?))?),
            3 => {
                // A first step, so the momentum buffers hold something to keep.
                let o = Sgd::new(&params, sgd)?;
                o.step()?;
                Opt::Sgd(o)
            }
            _ => Opt::MixedSgd(MixedSgd::new(&params, sgd, Some(scaler()?))?),
        };
        Ok(OptimizerState { params, opt })
    }

    fn call(&self, st: &mut OptimizerState, _call: usize) -> Result<()> {
        match &st.opt {
            Opt::Adam(o) => o.step(),
            Opt::Mixed(o) => o.step(),
            Opt::Sgd(o) => o.step(),
            Opt::MixedSgd(o) => o.step(),
        }
    }

    fn params(&self, st: &OptimizerState) -> Vec<Param> {
        st.params.clone()
    }

    fn pools(&self, _st: &OptimizerState) -> Vec<GraphPool> {
        Vec::new()
    }

    /// The moments, the masters, the step count and the scale.
    fn extra(&self, st: &OptimizerState) -> Vec<u8> {
        let mut tensors: Vec<Tensor> = Vec::new();
        let mut words = Vec::new();
        match &st.opt {
            Opt::Adam(o) => {
                let (m, v) = o.moments();
                tensors.extend(m.iter().chain(v).cloned());
                words.push(o.step_count().expect("step count"));
            }
            Opt::Mixed(o) => {
                let (m, v) = o.moments();
                tensors.extend(m.iter().chain(v).cloned());
                tensors.extend(o.masters().iter().map(|p| p.value.clone()));
                words.push(o.step_count().expect("step count"));
                if let Some(s) = o.scaler() {
                    words.push(u64::from(s.scale().expect("scale").to_bits()));
                    words.push(s.skipped_steps().expect("skipped steps"));
                }
            }
            Opt::Sgd(o) => tensors.extend(o.momentum_buffers().iter().flatten().cloned()),
            Opt::MixedSgd(o) => {
                tensors.extend(o.momentum_buffers().iter().flatten().cloned());
                tensors.extend(o.masters().iter().map(|p| p.value.clone()));
                if let Some(s) = o.scaler() {
                    words.push(u64::from(s.scale().expect("scale").to_bits()));
                    words.push(s.skipped_steps().expect("skipped steps"));
                }
            }
        }
        let mut out: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
        for t in tensors {
            out.extend(bits(&t).expect("tensor").iter().flat_map(|w| w.to_le_bytes()));
        }
        out
    }

    fn observe(&self, st: &mut OptimizerState, _call: usize) -> Result<Vec<Vec<u32>>> {
        let mut out = param_bits(&st.params)?;
        out.push(self.extra(st).into_iter().map(u32::from).collect());
        Ok(out)
    }
}

/// A whole model declared as a `#[graphed]` struct, the DSL's face: a chained stack of blocks
/// and a loss head.
#[graphed(warmup = 2, chained)]
struct Declared {
    blocks: Vec<Block>,
    head: Mse,
}

/// The declared model through its generated API: `make_graphed` (which takes the model by
/// value and hands it back on failure), a typed forward and backward, `fuse`, a fused `step`.
struct Dsl;

struct DslState {
    x: Tensor,
    target: Tensor,
    dloss: Tensor,
    params: Vec<Param>,
    model: Option<Declared>,
    g: Option<GraphedDeclared>,
    /// What the last successful call returned.
    out: Vec<Tensor>,
}

impl DslState {
    fn inputs(&self) -> (DeclaredInputs, DeclaredExtraInputs) {
        (DeclaredInputs { x: self.x.clone() }, DeclaredExtraInputs { target: self.target.clone() })
    }
}

impl Workload for Dsl {
    type State = DslState;
    const CALLS: &'static [&'static str] = &["make_graphed", "forward", "backward", "fuse", "step"];

    fn setup(&self, dev: &Device, call: usize) -> Result<DslState> {
        let blocks = (0..3).map(|i| Block::new(dev, H, H, 40 + i)).collect::<Result<Vec<_>>>()?;
        let params = blocks.iter().flat_map(Block::params).collect();
        let mut st = DslState {
            x: random(dev, &[B, H], 41)?,
            target: random(dev, &[B, H], 42)?,
            dloss: Tensor::full(dev, &[1], 1.0)?,
            params,
            model: Some(Declared { blocks, head: Mse }),
            g: None,
            out: Vec::new(),
        };
        for k in 0..call {
            self.call(&mut st, k)?;
        }
        Ok(st)
    }

    fn call(&self, st: &mut DslState, call: usize) -> Result<()> {
        let (inputs, extras) = st.inputs();
        if call == 0 {
            let model = st.model.take().expect("the model");
            match model.make_graphed(inputs, extras) {
                Ok(g) => st.g = Some(g),
                Err(e) => {
                    let (e, model) = e.into_parts();
                    st.model = Some(model);
                    return Err(e);
                }
            }
            return Ok(());
        }
        let dloss = DeclaredGradOutputs { dloss: st.dloss.clone() };
        let g = st.g.as_mut().expect("graphed");
        st.out = match call {
            1 => vec![g.forward(inputs, extras)?.output_0],
            2 => g.backward(dloss)?.x.into_iter().collect(),
            3 => {
                g.fuse()?;
                Vec::new()
            }
            _ => vec![g.step(inputs, extras, dloss)?.output_0],
        };
        Ok(())
    }

    fn params(&self, st: &DslState) -> Vec<Param> {
        st.params.clone()
    }

    fn pools(&self, st: &DslState) -> Vec<GraphPool> {
        st.g.iter().map(|g| g.inner().pool().clone()).collect()
    }

    /// The backward is a replay a chunk: one that fails partway resumes where it stopped.
    fn resumes(&self, call: usize) -> bool {
        call == 2
    }

    fn observe(&self, st: &mut DslState, _call: usize) -> Result<Vec<Vec<u32>>> {
        let mut out = param_bits(&st.params)?;
        out.extend(all_bits(st.out.iter().cloned())?);
        out.push(vec![u32::from(st.g.as_ref().is_some_and(|g| g.inner().is_fused()))]);
        Ok(out)
    }
}

/// A graph with a WHILE loop and an IF node in it (`Condition::run_while`, `run_if`): its
/// capture, then a replay.
struct Conditional;

struct ConditionalState {
    counter: Tensor,
    x: Tensor,
    one: Tensor,
    flag: Tensor,
    graph: Option<graphed::Graph>,
}

impl Workload for Conditional {
    type State = ConditionalState;
    const CALLS: &'static [&'static str] = &["capture (WHILE and IF)", "replay"];

    fn setup(&self, dev: &Device, call: usize) -> Result<ConditionalState> {
        let mut st = ConditionalState {
            counter: Tensor::full(dev, &[1], 40.0)?,
            x: random(dev, &[B, H], 51)?,
            one: Tensor::full(dev, &[B, H], 1.0)?,
            flag: Tensor::full(dev, &[1], 1.0)?,
            graph: None,
        };
        if call > 0 {
            self.call(&mut st, 0)?;
        }
        Ok(st)
    }

    fn call(&self, st: &mut ConditionalState, call: usize) -> Result<()> {
        if call > 0 {
            return st.graph.as_mut().expect("captured").replay();
        }
        let below = graphed::Condition::below(&st.counter, 5.0)?;
        let when = graphed::Condition::nonzero(&st.flag)?;
        let (counter, x, one) = (st.counter.clone(), st.x.clone(), st.one.clone());
        let counter_one = Tensor::full(counter.device(), &[1], 1.0)?;
        let mut g = graphed::Graph::new(counter.device());
        g.capture(graphed::CaptureMode::Global, || {
            ops::fill_(&counter, 0.0)?;
            below.run_while(|| ops::axpy_(&counter, 1.0, &counter_one))?;
            when.run_if(|| ops::axpy_(&x, 0.5, &one))
        })?;
        st.graph = Some(g);
        Ok(())
    }

    fn params(&self, _st: &ConditionalState) -> Vec<Param> {
        Vec::new()
    }

    fn pools(&self, st: &ConditionalState) -> Vec<GraphPool> {
        st.graph.iter().map(|g| g.pool().clone()).collect()
    }

    /// The counter and x, which only a replay changes.
    fn extra(&self, st: &ConditionalState) -> Vec<u8> {
        let mut v = bits(&st.counter).expect("counter");
        v.extend(bits(&st.x).expect("x"));
        v.iter().flat_map(|w| w.to_le_bytes()).collect()
    }

    fn observe(&self, st: &mut ConditionalState, _call: usize) -> Result<Vec<Vec<u32>>> {
        Ok(vec![bits(&st.counter)?, bits(&st.x)?])
    }
}

/// One rank's outcome in the data-parallel sweep: the error it ended with (a failed capture,
/// or a replay the group's abort failed), the passes counted during the swept call (rank 0),
/// and its parameter grads after the step.
type RankOutcome = (Option<Error>, graphed::fault::FaultCounts, Vec<Vec<u32>>);

/// One data-parallel run on two emulated ranks: capture, forward, backward; with `fault`,
/// rank 0's call `call` fails at that point. Rank 0 checks that its failed call changed
/// nothing and, for a replay, retries it; a failed capture aborts the group.
fn data_parallel_run(call: usize, fault: Option<(FaultPoint, u64)>) -> Result<Vec<Result<RankOutcome>>> {
    let cfg = Config::default().timeout(std::time::Duration::from_secs(20));
    dist::run_emulated_each(2, &cfg, move |comm| {
        let dev = comm.device().clone();
        dev.rng()?.manual_seed(5)?;
        let rank = comm.rank();
        let stack = Stack::new(&dev, 2, H, 9)?;
        let params = stack.params();
        let named = params.iter().enumerate().map(|(i, p)| (format!("p{i}"), p.clone())).collect();
        let dp = DataParallel::with_params(stack, named, comm.clone(), ReduceOp::Sum, 1 << 20)?;
        let x = random(&dev, &[B, H], 60 + rank as u64)?.with_requires_grad(true);
        let dy = random(&dev, &[B, H], 70 + rank as u64)?;
        let plan = FaultPlan::of(&dev);
        let swept = |k: usize| k == call && rank == 0;
        let arm = |k: usize| match fault {
            Some((point, n)) if swept(k) => plan.fail(point, n),
            None if swept(k) => plan.count(),
            _ => {}
        };
        let mut counts = Default::default();
        let before = snapshot(&dev, &params, &[], vec![])?;
        arm(0);
        let samples = vec![vec![vec![Some(x.clone())]]];
        let captured = make_graphed(vec![Box::new(dp)], samples, GraphOptions::new().warmup(2));
        if swept(0) {
            counts = plan.counts();
        }
        plan.off();
        let mut g = match captured {
            Ok(g) => g,
            Err(e) => {
                let (e, modules) = e.into_parts();
                comm.abort("make_graphed failed");
                if modules.len() != 1 || snapshot(&dev, &params, &[], vec![])? != before {
                    return Err(Error::msg(format!("rank {rank}: a failed make_graphed changed state: {e}")));
                }
                return Ok((Some(e), counts, Vec::new()));
            }
        };
        for k in 1..3 {
            let mut replay = || {
                if k == 1 {
                    g.forward(0, &[Some(x.clone())]).map(drop)
                } else {
                    g.backward(0, &[Some(dy.clone())]).map(drop)
                }
            };
            let before = snapshot(&dev, &params, &[], vec![])?;
            arm(k);
            let r = replay();
            if swept(k) {
                counts = plan.counts();
            }
            plan.off();
            match r {
                Ok(()) => {}
                Err(e) if swept(k) && fault.is_some() => {
                    if !matches!(e.root(), Error::Cuda { .. }) {
                        return Err(Error::msg(format!("rank 0: a failed replay gave {e:?}, not the driver's error")));
                    }
                    if snapshot(&dev, &params, &[], vec![])? != before {
                        return Err(Error::msg(format!("rank 0: a failed replay changed state: {e}")));
                    }
                    replay()?; // the retry, while rank 1 waits in the all-reduce
                }
                // The group was aborted under this rank: a typed error, and it stops.
                Err(e) => return Ok((Some(e), counts, Vec::new())),
            }
        }
        let grads = params.iter().map(|p| bits(&p.grad)).collect::<Result<Vec<_>>>()?;
        Ok((None, counts, grads))
    })
}

/// A data-parallel step on two emulated ranks: faults on rank 0's device during
/// `make_graphed` (whose warm-up all-reduces) and during each replay of a step.
///
/// A rank whose `make_graphed` fails aborts the group (as a real job would), so every rank's
/// `make_graphed` fails with a typed error and hands its module back unchanged; a fresh group
/// then captures. A replay that fails on rank 0 is retried there while rank 1 waits in the
/// all-reduce; the step then completes on both with the grads of a step that never failed.
fn sweep_data_parallel(report: &mut Report) -> Result<()> {
    const CALLS: [&str; 3] = ["make_graphed", "forward", "backward"];
    let reference: Vec<Vec<Vec<u32>>> =
        data_parallel_run(usize::MAX, None)?.into_iter().map(|r| r.map(|o| o.2)).collect::<Result<_>>()?;
    assert_eq!(reference[0], reference[1], "the ranks' grads are all-reduced");
    for (call, name) in CALLS.iter().enumerate() {
        let counts = data_parallel_run(call, None)?.remove(0)?.1;
        let mut swept = 0;
        for point in FaultPoint::ALL {
            for n in picks(counts.get(point)) {
                swept += 1;
                let at = format!("data parallel (2 emulated ranks): {name} on rank 0, {point:?} #{n}");
                for (rank, r) in data_parallel_run(call, Some((point, n)))?.into_iter().enumerate() {
                    match r {
                        Err(e) => report.fail(format!("{at}: rank {rank}: {e}")),
                        Ok((Some(e), _, _)) if call > 0 => {
                            report.fail(format!("{at}: rank {rank}: the retried step failed: {e:?}"))
                        }
                        Ok((Some(e), _, _)) => {
                            let own = rank == 0 && typed_for(point, &e);
                            if !own && !matches!(e.root(), Error::Dist(_)) {
                                report.fail(format!("{at}: rank {rank}: untyped error {e:?}"));
                            }
                        }
                        Ok((None, _, grads)) if grads != reference[rank] => {
                            report.fail(format!("{at}: rank {rank}: the grads differ from a step without faults"))
                        }
                        Ok(_) => {}
                    }
                }
            }
        }
        report.points += swept;
        println!("  data parallel (2 emulated ranks): {name}: {swept} fault points swept on rank 0");
    }
    Ok(())
}

#[test]
fn every_fault_point_is_a_typed_error_that_leaves_nothing_behind() {
    let started = std::time::Instant::now();
    let mut report = Report::default();
    for b in backends() {
        let dev = &b.device;
        println!("fault sweep on {}:", dev.name());
        let run = |report: &mut Report| -> Result<()> {
            sweep(dev, "MLP stack", &Mlp, report)?;
            sweep(dev, "an MLP that recomputes in its backward", &Recompute, report)?;
            sweep(dev, "attention over packed q/k/v", &Attention, report)?;
            sweep(dev, "2-chunk pipeline, reuse and w(c)", &Pipeline, report)?;
            sweep(dev, "fused step", &Fused, report)?;
            sweep(dev, "safetensors", &Checkpoint, report)?;
            sweep(dev, "decoder step", &Decoding, report)?;
            sweep(dev, "optimizer step", &Optimizer, report)?;
            sweep(dev, "a #[graphed] struct model", &Dsl, report)?;
            sweep(dev, "conditional graph", &Conditional, report)?;
            for call in 0..2 {
                std::fs::remove_file(temp_file(&format!("call{call}"), dev)).ok();
            }
            Ok(())
        };
        if let Err(e) = run(&mut report) {
            panic!("on {}: {e}", dev.name());
        }
    }
    if let Err(e) = sweep_data_parallel(&mut report) {
        panic!("data parallel: {e}");
    }
    println!(
        "fault sweep: {} fault points swept in {:.1} s, {} failures",
        report.points,
        started.elapsed().as_secs_f64(),
        report.failures.len()
    );
    assert!(
        report.failures.is_empty(),
        "{} of {} fault points failed:\n{}",
        report.failures.len(),
        report.points,
        report.failures.join("\n")
    );
}
