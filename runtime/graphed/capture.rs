//! `make_graphed`: validation, static surfaces, warm-up and capture, in that order. A failure
//! at any point restores the RNG state, frees the graphs' pool and hands the modules back.

use std::time::{Duration, Instant};

use super::buckets::{bucket_samples, bucketed_inputs, BucketsCaptured, Lengths};
use super::cursor::Cursor;
use super::reuse::{adopt, reusable, Slot, SlotPlan};
use super::schedule::{Pass, Step};
use super::surface::Draft;
use super::{new_cx, Config, GraphOptions, GraphedModules, Schedule};
use crate::graph::CaptureSet;
use crate::{
    Cx, Device, Error, Graph, GraphPool, HookKind, Module, Result, ScheduleError, SetupError, SignatureError, Tensor,
};

pub use super::capture_error::CaptureError;

/// The modules as `make_graphed` hands them back on failure.
pub type Modules = Vec<Box<dyn Module>>;

/// Sample inputs: `[chunk][microbatch][input]`.
pub(super) type Samples = Vec<Vec<Vec<Option<Tensor>>>>;

/// Warms up and captures `modules` into graphs sharing one pool.
///
/// `samples[chunk][microbatch][input]` are example inputs (their shapes, and `requires_grad`
/// for whether a grad is wanted); one microbatch entry per chunk stands for all. Without
/// `order`, forwards are captured in module order and backwards in reverse (PyTorch's tuple
/// form). With `order`, capture follows the schedule exactly and each (chunk, microbatch) gets
/// its own graphs and static surfaces (Transformer Engine's form).
///
/// Warm-up runs `warmup` eager iterations in the graphs' pool, with zero grad outputs so
/// parameter grads do not change; the device RNG state is restored after capture, so neither
/// warm-up nor capture changes the numbers a run draws.
///
/// Everything about the arguments is checked before anything runs; when modules talk to
/// other ranks ([`Module::collectives`]), every rank's schedule is compared with the others'
/// first, and a mismatch is [`crate::DistError::ScheduleMismatch`] on every rank. If warm-up
/// or capture then fails (a hook, a module, the driver, memory, a pool's limit), the RNG state
/// and the grads of the parameters the modules expose are restored, the pool gives back what
/// the call took, and the modules come back inside the [`CaptureError`].
pub fn make_graphed(
    modules: Modules,
    samples: Samples,
    options: GraphOptions,
) -> std::result::Result<GraphedModules, CaptureError<Modules>> {
    let has_backward = options.training && needs_backward(&modules, &samples);
    let validated = without_backward(&modules, &samples, &options)
        .and_then(|()| validate(&modules, &samples, &options, has_backward));
    // Modules that talk to other ranks: every rank must be about to capture the same schedule
    // (a typed error on every rank otherwise, before anything runs). A rank whose own
    // arguments are refused takes part all the same, so its peers hear of it at once.
    let agreed = super::agree::check_schedules(&modules, &options, has_backward, validated.is_ok());
    let (device, schedule, checkpointed) = match (validated, agreed) {
        (Ok(v), Ok(())) => v,
        (Err(e), _) | (Ok(_), Err(e)) => return Err(CaptureError::new(e, modules)),
    };
    // Warm-up and capture draw random numbers and run backwards: save what they would change.
    // The grads' copies are in the default pool, for this call only: the slabs they grow are
    // given back once they are dropped, so the pool keeps no copy of every grad afterwards.
    let default_pool = device.default_pool();
    let default_mark = default_pool.mark();
    let saved = device.rng().and_then(|g| g.save()).and_then(|rng| Ok((rng, GradSnapshot::take(&modules)?)));
    let (rng_state, grads) = match saved {
        Ok(s) => s,
        Err(e) => {
            default_pool.release_since(default_mark);
            return Err(CaptureError::new(e, modules));
        }
    };
    let started = Instant::now();
    let pool = match &options.pool {
        Some(pool) => pool.clone(),
        None => device.new_pool(),
    };
    if options.pool.is_none() {
        pool.set_limit(options.pool_limit);
    }
    let mark = pool.mark();
    // Each bucket's samples, made before the pool is current (they are not the graphs').
    let bucketed = match &options.buckets {
        None => Ok(None),
        Some(spec) => bucketed_inputs(&samples, spec).and_then(|flags| {
            let per_size = (0..spec.count()).map(|i| bucket_samples(&samples, &flags, spec, &spec.shape(i)));
            let per_size = per_size.collect::<Result<Vec<_>>>()?;
            Ok(Some((spec.clone(), flags, per_size)))
        }),
    };
    let plan = SlotPlan::new(&schedule, modules.len(), options.reuse_buffers);
    let config = Config::new(options, schedule.clone(), plan, checkpointed);
    let mut capture = Capture::new(device.clone(), pool.clone(), modules, config);
    let captured = bucketed.and_then(|bucketed| {
        device.with_pool(&pool, || match bucketed {
            Some((spec, flags, per_size)) => {
                let reports = capture.buckets(&spec, &per_size, &schedule)?;
                Ok(Some(BucketsCaptured { spec, inputs: flags, reports }))
            }
            None => capture.iteration(&samples, &schedule).map(|()| None),
        })
    });
    // Put the RNG state and the parameter grads back, whether the capture worked or not.
    let restore = || {
        device
            .rng()
            .and_then(|r| r.restore(&rng_state))
            .and_then(|()| grads.restore())
            .and_then(|()| device.synchronize())
    };
    let restored = restore();
    let result = match captured.and_then(|buckets| restored.map(|()| buckets)) {
        Ok(buckets) => Ok(capture.finish(started.elapsed(), buckets)),
        Err(e) => {
            // Restore once more: the failure may have been in the first restore (a transient
            // fault in a copy), and restoring is idempotent. Should this fail too, the cause
            // is still the error returned; the second failure is kept with the drop errors.
            if let Err(again) = restore() {
                device
                    .backend()
                    .drop_errors
                    .report(again.context("restoring the RNG state and grads after a failed capture"));
            }
            let modules = capture.into_modules();
            // A pool of the caller's gives back the slabs this call grew; our own goes away.
            pool.release_since(mark);
            Err(CaptureError::new(e, modules))
        }
    };
    drop(grads);
    default_pool.release_since(default_mark);
    result
}

/// Whether a training-mode capture needs backward graphs: every module has a backward
/// (`Module::has_backward`), and grads are wanted ([`wants_grads`]). Otherwise only forwards
/// are captured (PyTorch #124582) and backward is `Error::ForwardOnly`.
fn needs_backward(modules: &Modules, samples: &Samples) -> bool {
    modules.iter().all(|m| m.has_backward()) && wants_grads(modules, samples)
}

/// `Err(SetupError::NoBackward)` for a training-mode capture that wants grads of modules of
/// which some, not all, have no backward: forward graphs alone would leave the others' grads
/// silently uncomputed. (With no backward anywhere the capture is plainly for inference.)
fn without_backward(modules: &Modules, samples: &Samples, options: &GraphOptions) -> Result<()> {
    let missing = modules.iter().position(|m| !m.has_backward());
    match missing {
        Some(i) if options.training && modules.iter().any(|m| m.has_backward()) && wants_grads(modules, samples) => {
            Err(SetupError::NoBackward { module: modules[i].name().into(), chunk: i + 1 }.into())
        }
        _ => Ok(()),
    }
}

/// Whether some sample input requires a grad, or some parameter does, or a module with a
/// backward does not expose its parameters (so nobody can tell what its backward computes).
fn wants_grads(modules: &Modules, samples: &Samples) -> bool {
    let input_needs = samples.iter().flatten().flatten().flatten().any(Tensor::requires_grad);
    let param_needs = modules.iter().any(|m| {
        let mut any = !m.exposes_params() && m.has_backward();
        m.visit_params(&mut |_, p| any |= p.requires_grad());
        any
    });
    input_needs || param_needs
}

/// Copies of every exposed parameter grad, taken before warm-up (whose backwards run on zero
/// grad outputs, but a module's backward may do anything) and written back after capture.
struct GradSnapshot(Vec<(Tensor, Tensor)>);

impl GradSnapshot {
    fn take(modules: &Modules) -> Result<GradSnapshot> {
        let mut grads = Vec::new();
        for m in modules {
            m.visit_params(&mut |_, p| grads.push(p.grad.clone()));
        }
        let copies = grads.into_iter().map(|g| Ok((g.deep_clone()?, g))).collect::<Result<_>>()?;
        Ok(GradSnapshot(copies))
    }

    fn restore(&self) -> Result<()> {
        self.0.iter().try_for_each(|(copy, grad)| grad.copy_(copy))
    }
}

/// Everything `make_graphed` can check before it runs anything: the device, the schedule and
/// which chunks are checkpointed.
fn validate(
    modules: &Modules,
    samples: &Samples,
    options: &GraphOptions,
    has_backward: bool,
) -> Result<(Device, Schedule, Vec<bool>)> {
    let chunks = modules.len();
    if chunks == 0 {
        return Err(SetupError::NoModules.into());
    }
    if options.warmup == 0 {
        return Err(SetupError::ZeroWarmup.into());
    }
    if samples.len() != chunks {
        return Err(SetupError::SampleLists { modules: chunks, samples: samples.len() }.into());
    }
    let mut tensors = samples.iter().flatten().flatten().flatten();
    let device = tensors.next().map(|t| t.device().clone()).ok_or(SetupError::NoSampleTensor)?;
    for t in samples.iter().flatten().flatten().flatten() {
        if t.device() != &device {
            return Err(Error::DeviceMismatch { op: "make_graphed samples", a: device.name(), b: t.device().name() });
        }
        t.check_fresh()?;
    }
    if device.is_capturing() {
        return Err(Error::IllegalDuringCapture { op: "make_graphed" });
    }
    if let Some(spec) = &options.buckets {
        spec.validate()?;
        if options.pool.is_some() {
            let why = "the buckets' graphs are alternatives that share a pool of their own";
            return Err(crate::BucketError::Unsupported { option: "GraphOptions::pool", why }.into());
        }
        bucketed_inputs(samples, spec)?;
    }
    if let Some(pool) = &options.pool {
        if !pool.is_on(device.backend()) {
            return Err(SetupError::PoolOnOtherDevice { device: device.name() }.into());
        }
        if options.pool_limit.is_some() {
            return Err(SetupError::PoolLimitWithPool.into());
        }
    }
    let schedule = Schedule::new(options.order.as_deref(), chunks, has_backward)?;
    if options.chained {
        schedule.check_chained_flow()?;
    }
    let mut checkpointed = vec![false; chunks];
    for &c in options.checkpoint.iter().flatten() {
        match checkpointed.get_mut(c.wrapping_sub(1)) {
            Some(flag) => *flag = true,
            None => return Err(SetupError::CheckpointChunk { chunk: c, chunks }.into()),
        }
    }
    schedule.check_modules(modules, &checkpointed)?;
    for (c, (m, s)) in modules.iter().zip(samples).enumerate() {
        if s.is_empty() || (s.len() != 1 && s.len() != schedule.microbatches()) {
            let (chunk, sets, microbatches) = (c + 1, s.len(), schedule.microbatches());
            return Err(SetupError::SampleSets { chunk, sets, microbatches }.into());
        }
        for set in s {
            if set.len() != m.num_inputs() {
                let (module, expected, got) = (m.name().into(), m.num_inputs(), set.len());
                return Err(SetupError::SampleInputs { module, expected, got }.into());
            }
        }
    }
    Ok((device, schedule, checkpointed))
}

/// What one forward of an iteration left for its backward: its context and outputs.
type ForwardDone = (Cx, Vec<Option<Tensor>>);

/// Bytes of pool memory `cx` saved beyond the surface's own inputs and outputs.
fn saved_bytes(cx: &Cx, inputs: &[Option<Tensor>], outputs: &[Option<Tensor>], pool: usize) -> usize {
    let mut seen: Vec<Tensor> = inputs.iter().chain(outputs).flatten().cloned().collect();
    let mut bytes = 0;
    for t in cx.all_saved() {
        let (pid, range) = t.mem_range();
        if pid == pool && !seen.iter().any(|x| x.same_buffer(&t)) {
            bytes += range.bytes;
            seen.push(t);
        }
    }
    bytes
}

/// Which pass over the schedule: an eager warm-up iteration or the capture.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Phase {
    WarmUp,
    Capture,
}

/// `make_graphed` under way: the modules, what they are captured with, and a draft of every
/// (chunk, microbatch) that becomes a surface once everything is captured.
pub(super) struct Capture {
    pub(super) device: Device,
    pub(super) pool: GraphPool,
    pub(super) modules: Modules,
    pub(super) config: Box<Config>,
    /// `[chunk][microbatch]`: the drafts of the bucket being captured (of the whole capture
    /// without buckets).
    pub(super) drafts: Vec<Vec<Draft>>,
    /// With shape buckets: the real sizes the graphs of the bucket being captured read.
    pub(super) lengths: Option<Lengths>,
    /// With shape buckets: the buckets captured so far, largest first.
    pub(super) done: Vec<(Vec<Vec<Draft>>, Lengths)>,
    /// The capture set of every graph this call captures: their clobber lists cover the
    /// handles among them, the pool those of other captures sharing it.
    set: CaptureSet,
}

impl Capture {
    fn new(device: Device, pool: GraphPool, modules: Modules, config: Config) -> Capture {
        let config = Box::new(config);
        let set = CaptureSet::new();
        Capture { device, pool, modules, config, drafts: Vec::new(), lengths: None, done: Vec::new(), set }
    }

    /// An empty graph of this capture, in its pool and set.
    pub(super) fn new_graph(&self, label: String) -> Graph {
        let mut graph = Graph::with_pool(&self.device, &self.pool);
        graph.set_label(label);
        graph.join(self.set);
        graph
    }

    /// Gives the modules back, dropping everything captured so far.
    fn into_modules(self) -> Modules {
        self.modules
    }

    /// The schedule's warm-up iterations, then its capture, on `samples`.
    pub(super) fn iteration(&mut self, samples: &Samples, schedule: &Schedule) -> Result<()> {
        self.make_drafts(samples, schedule.microbatches())?;
        for _ in 0..self.config.options.warmup {
            self.iterate(schedule, Phase::WarmUp)?;
        }
        self.iterate(schedule, Phase::Capture)
    }

    /// The captured modules, every draft made a whole surface (see `clobbers`).
    fn finish(self, capture_time: Duration, buckets: Option<BucketsCaptured>) -> GraphedModules {
        let Capture { device, pool, modules, mut config, drafts, done, .. } = self;
        config.capture_time = capture_time;
        let chunks = modules.len();
        let (captured_training, has_backward) = (config.options.training, config.schedule.has_backward());
        let (surfaces, buckets) = match buckets {
            None => {
                let surfaces = super::clobbers::finish(vec![drafts], pool.id()).pop().unwrap_or_default();
                (surfaces, None)
            }
            Some(b) => {
                let (active, set) = super::buckets::BucketSet::new(b, done, chunks, pool.id());
                (active, Some(Box::new(set)))
            }
        };
        GraphedModules {
            device,
            modules,
            pool,
            surfaces,
            cursor: Cursor::new(chunks),
            captured_training,
            has_backward,
            training: captured_training,
            config,
            chain_slots: Vec::new(),
            chain_resume: None,
            buckets,
        }
    }

    /// Static inputs for every (chunk, microbatch): copies of the samples, in the pool; a
    /// microbatch that reuses an earlier one's surfaces shares its buffers where they match.
    fn make_drafts(&mut self, samples: &Samples, microbatches: usize) -> Result<()> {
        for (c, s) in samples.iter().enumerate() {
            let mut row: Vec<Draft> = Vec::with_capacity(microbatches);
            for m in 0..microbatches {
                let set = &s[m.min(s.len() - 1)];
                let label = format!("{}[chunk {}, microbatch {}]", self.modules[c].name(), c + 1, m);
                let owner = self.config.plan.owner(c, m);
                let slot = if owner == m { self.slot_of(c, m, |s| &s.inputs) } else { Slot::of(&row[owner].inputs) };
                let mut inputs = Vec::with_capacity(set.len());
                for (i, t) in set.iter().enumerate() {
                    inputs.push(match t {
                        Some(_) if self.config.is_chained_input(c, i) => None, // filled in at capture
                        Some(t) if reusable(&slot, i, t).is_some() => {
                            let st = reusable(&slot, i, t).map(|st| st.with_requires_grad(t.requires_grad()));
                            // A larger bucket's buffer: this bucket's sample goes in (an
                            // earlier microbatch's already holds a sample of the shape).
                            if let Some(st) = st.as_ref().filter(|_| slot.prefix) {
                                st.copy_(t)?;
                            }
                            st
                        }
                        Some(t) => {
                            // Static inputs are bound buffers (a fused step reads them as the
                            // caller left them): never in memory a graph of this pool writes.
                            let st = Tensor::empty_untouched(&self.device, t.dims(), t.dtype())?;
                            st.copy_(t)?;
                            let st = st.with_requires_grad(t.requires_grad());
                            st.set_owner(format!("{label} input {i}"));
                            Some(st)
                        }
                        None => None, // an absent optional input
                    });
                }
                let forward = self.new_graph(format!("{label} forward"));
                row.push(Draft {
                    forward,
                    backward: None,
                    wgrad: None,
                    inputs,
                    outputs: Vec::new(),
                    grad_outputs: Vec::new(),
                    grad_inputs: Vec::new(),
                    saved: None,
                    saved_bytes: 0,
                    label,
                });
            }
            self.drafts.push(row);
        }
        Ok(())
    }

    /// One pass over the schedule: eager with zero grad outputs (warm-up), or each step
    /// captured into its own graph. Hooks run around every step, outside any capture.
    fn iterate(&mut self, schedule: &Schedule, phase: Phase) -> Result<()> {
        // Per (chunk, microbatch): what the forward saved and returned this iteration.
        let mut done: Vec<Vec<Option<ForwardDone>>> =
            self.drafts.iter().map(|r| r.iter().map(|_| None).collect()).collect();
        // Per (chunk, microbatch): the first output, until a chained next chunk reads it (kept
        // no longer: during warm-up it is an eager tensor holding pool memory).
        let mut firsts: Vec<Vec<Option<Tensor>>> = self.drafts.iter().map(|r| vec![None; r.len()]).collect();
        for &Step { pass, chunk: c, microbatch: m } in schedule.steps() {
            match pass {
                Pass::Forward => {
                    let prev = if c > 0 { firsts[c - 1][m].take() } else { None };
                    let inputs = self.chained_inputs(c, m, prev)?;
                    self.config.run_hooks(&mut self.modules, c, HookKind::PreForward)?;
                    let mut cx = new_cx(&self.device, self.config.options.training, &inputs);
                    cx.set_bucket_length(self.lengths.as_ref().and_then(|l| l.tensor(m)));
                    let outs = match phase {
                        Phase::WarmUp => {
                            let mut cx = cx.clone();
                            let ck = self.config.checkpointed[c];
                            let outs = crate::checkpoint::forward_of(self.modules[c].as_ref(), ck, &mut cx, &inputs)?;
                            done[c][m] = Some((cx, outs.clone()));
                            outs
                        }
                        Phase::Capture => {
                            let (cx, outs) = self.capture_forward(c, m, inputs, cx)?;
                            done[c][m] = Some((cx, outs.clone()));
                            outs
                        }
                    };
                    if c + 1 < firsts.len() {
                        firsts[c][m] = outs.into_iter().next().flatten();
                    }
                    self.config.run_hooks(&mut self.modules, c, HookKind::Forward)?;
                }
                Pass::Backward => {
                    let (cx, outs) = done[c][m].take().ok_or(ScheduleError::BackwardBeforeForward { chunk: c + 1 })?;
                    self.config.run_hooks(&mut self.modules, c, HookKind::PreBackward)?;
                    let deferred = self.config.schedule.defers(c);
                    let cx = match phase {
                        Phase::WarmUp => {
                            let grads = self.warm_up_grad_outputs(c, m, &outs)?;
                            let mut cx = cx.clone();
                            let ck = self.config.checkpointed[c];
                            super::wgrad::run_backward(self.modules[c].as_mut(), &mut cx, &grads, deferred, ck)?;
                            cx
                        }
                        Phase::Capture => self.capture_backward(c, m, cx)?,
                    };
                    // Deferred weight grads read what the backward left in its context.
                    if deferred {
                        done[c][m] = Some((cx, Vec::new()));
                    }
                    self.config.run_hooks(&mut self.modules, c, HookKind::Backward)?;
                }
                Pass::Wgrad => {
                    let (cx, _) = done[c][m].take().ok_or(ScheduleError::WgradBeforeBackward { chunk: c + 1 })?;
                    self.wgrad_step(c, m, cx, phase == Phase::Capture)?;
                }
            }
        }
        if phase == Phase::WarmUp {
            self.device.synchronize()?;
        }
        Ok(())
    }

    /// The inputs of (chunk, microbatch): its static inputs, with a chained first input taken
    /// from `prev`, the previous chunk's first output for this microbatch.
    fn chained_inputs(&self, c: usize, m: usize, prev: Option<Tensor>) -> Result<Vec<Option<Tensor>>> {
        let mut inputs = self.drafts[c][m].inputs.clone();
        if self.config.options.chained && c > 0 {
            let prev = prev.ok_or(ScheduleError::ChainedForward { chunk: c + 1, microbatch: m + 1 })?;
            if let Some(first) = inputs.first_mut() {
                *first = Some(prev.with_requires_grad(true));
            }
        }
        Ok(inputs)
    }

    /// Captures the forward of (chunk, microbatch) into its graph; the context it saved and
    /// its static outputs.
    fn capture_forward(
        &mut self,
        c: usize,
        m: usize,
        inputs: Vec<Option<Tensor>>,
        cx_template: Cx,
    ) -> Result<(Cx, Vec<Option<Tensor>>)> {
        let mode = self.config.options.capture_mode;
        self.drafts[c][m].inputs = inputs.clone();
        let slot = self.slot_of(c, m, |s| &s.outputs);
        let module = &self.modules[c];
        let checkpointed = self.config.checkpointed[c];
        let s = &mut self.drafts[c][m];
        let captured = s.forward.capture(mode, || {
            let mut cx = cx_template.clone();
            let outs = crate::checkpoint::forward_of(module.as_ref(), checkpointed, &mut cx, &inputs)?;
            Ok((cx, adopt(outs, &slot)?))
        });
        let (cx, outs) = captured.map_err(|e| e.context(format!("capturing the forward of {}", s.label)))?;
        for (i, o) in outs.iter().enumerate() {
            if let Some(o) = o {
                o.set_owner(format!("{} output {i}", s.label));
            }
        }
        s.outputs = outs.clone();
        s.saved_bytes = saved_bytes(&cx, &s.inputs, &s.outputs, self.pool.id());
        s.saved = Some(cx.clone());
        Ok((cx, outs))
    }

    /// Captures the backward of (chunk, microbatch) into its graph and checks its grads; the
    /// context the backward left (what deferred weight grads read).
    fn capture_backward(&mut self, c: usize, m: usize, cx_template: Cx) -> Result<Cx> {
        let mode = self.config.options.capture_mode;
        let grad_outputs = self.new_grad_outputs(c, m)?;
        let allow_unused = self.config.options.allow_unused_input;
        let slot = self.slot_of(c, m, |s| &s.grad_inputs);
        let mut graph = self.new_graph(format!("{} backward", self.drafts[c][m].label));
        let module = &mut self.modules[c];
        let name = module.name();
        let s = &mut self.drafts[c][m];
        let (deferred, checkpointed) = (self.config.schedule.defers(c), self.config.checkpointed[c]);
        let captured = graph.capture(mode, || {
            let mut cx = cx_template.clone();
            let grads = super::wgrad::run_backward(module.as_mut(), &mut cx, &grad_outputs, deferred, checkpointed)?;
            Ok((cx, adopt(grads, &slot)?))
        });
        let (cx, grads) = captured.map_err(|e| e.context(format!("capturing the backward of {}", s.label)))?;
        if grads.len() != s.inputs.len() {
            let (module, inputs, got) = (name.into(), s.inputs.len(), grads.len());
            return Err(SignatureError::GradCount { module, inputs, got }.into());
        }
        let mut grad_inputs = Vec::with_capacity(grads.len());
        for (i, (g, x)) in grads.into_iter().zip(&s.inputs).enumerate() {
            let wanted = x.as_ref().is_some_and(|x| x.requires_grad());
            match (wanted, g) {
                (true, Some(g)) => {
                    g.set_owner(format!("{} grad input {i}", s.label));
                    grad_inputs.push(Some(g));
                }
                (true, None) if !allow_unused => return Err(Error::UnusedInput { module: name.into(), input: i }),
                _ => grad_inputs.push(None),
            }
        }
        s.grad_outputs = grad_outputs;
        s.grad_inputs = grad_inputs;
        s.backward = Some(graph);
        // The saved activations go back to the pool: later captures may reuse their memory,
        // which is safe because every graph captured from now on replays after this backward
        // (replay order is enforced) and the graphs that write it list its users as clobbered.
        // Deferred weight grads keep what they need alive through the context returned.
        s.saved = None;
        Ok(cx)
    }

    /// Zero grad outputs for a warm-up backward. The first warm-up allocates the static
    /// grad-output buffers of (chunk, microbatch) here, before any capture, so no graph's
    /// temporaries can ever lie in them: the fused step reads them as the caller left them.
    /// `None` outputs get none; with chaining, the next chunk's grad input stands in at
    /// capture.
    fn warm_up_grad_outputs(&mut self, c: usize, m: usize, outs: &[Option<Tensor>]) -> Result<Vec<Option<Tensor>>> {
        if self.drafts[c][m].grad_outputs.is_empty() {
            let label = self.drafts[c][m].label.clone();
            // The owner's backward comes before this microbatch's forward: its buffers exist.
            let slot = self.slot_of(c, m, |s| &s.grad_outputs);
            let mut statics = Vec::with_capacity(outs.len());
            for (i, o) in outs.iter().enumerate() {
                statics.push(match o {
                    Some(_) if self.config.is_chained_grad_output(c, i) => None, // filled in at capture
                    Some(o) if reusable(&slot, i, o).is_some() => reusable(&slot, i, o),
                    Some(o) => {
                        let g = Tensor::empty_untouched(&self.device, o.dims(), o.dtype())?;
                        crate::ops::fill_(&g, 0.0)?;
                        g.set_owner(format!("{label} grad output {i}"));
                        Some(g)
                    }
                    None => None, // no grad for a None output
                });
            }
            self.drafts[c][m].grad_outputs = statics;
        }
        // The static buffers hold zeros during warm-up (nothing has written them yet).
        outs.iter()
            .map(|o| o.as_ref().map(|o| Tensor::zeros_as(&self.device, o.dims(), o.dtype())).transpose())
            .collect()
    }

    /// The static grad outputs of (chunk, microbatch) for its backward capture: the buffers
    /// the warm-up allocated, with a chained slot taken from the next chunk's grad input.
    fn new_grad_outputs(&self, c: usize, m: usize) -> Result<Vec<Option<Tensor>>> {
        let s = &self.drafts[c][m];
        let mut grads = Vec::with_capacity(s.outputs.len());
        for (i, o) in s.outputs.iter().enumerate() {
            let g = match o {
                None => None,
                Some(_) if self.config.is_chained_grad_output(c, i) => {
                    let next = &self.drafts[c + 1][m];
                    let g = next.grad_inputs.first().cloned().flatten();
                    Some(g.ok_or(ScheduleError::ChainedBackward { chunk: c + 1, microbatch: m + 1 })?)
                }
                Some(o) => match s.grad_outputs.get(i).cloned().flatten() {
                    Some(g) if g.dims() == o.dims() => Some(g),
                    _ => {
                        // The captured output's shape differs from the warm-up's: allocate now,
                        // outside the memory graphs write, as the warm-up does.
                        let g = Tensor::empty_untouched(&self.device, o.dims(), o.dtype())?;
                        crate::ops::fill_(&g, 0.0)?;
                        g.set_owner(format!("{} grad output {i}", s.label));
                        Some(g)
                    }
                },
            };
            grads.push(g);
        }
        Ok(grads)
    }
}
