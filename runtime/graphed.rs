//! `make_graphed`: warm up, capture and replay modules, the counterpart of PyTorch's
//! `make_graphed_callables` and Transformer Engine's extension of it. Read top to bottom:
//! options, validation of the schedule, static surfaces, warm-up, capture, replay.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use crate::pool::MemRange;
use crate::{CaptureMode, Cx, Device, Error, Graph, GraphPool, HookKind, HookRegistry, Module, Result, Tensor};

/// How `make_graphed` warms up and captures.
///
/// ```
/// use graphed::GraphOptions;
/// let opts = GraphOptions::new().warmup(2).order(vec![1, 2, -2, -1]);
/// assert_eq!(opts.warmup_iters(), 2);
/// ```
#[derive(Clone, Debug)]
pub struct GraphOptions {
    warmup: usize,
    order: Option<Vec<i32>>,
    allow_unused_input: bool,
    capture_mode: CaptureMode,
    training: bool,
    chained: bool,
    hooks: HookRegistry,
}

impl Default for GraphOptions {
    fn default() -> Self {
        GraphOptions {
            warmup: 3,
            order: None,
            allow_unused_input: false,
            capture_mode: CaptureMode::Global,
            training: true,
            chained: false,
            hooks: HookRegistry::new(),
        }
    }
}

impl GraphOptions {
    /// Defaults: 3 warm-up iterations, module order, training, global capture mode.
    pub fn new() -> GraphOptions {
        GraphOptions::default()
    }
    /// Eager warm-up iterations before capture (at least 1).
    pub fn warmup(mut self, n: usize) -> Self {
        self.warmup = n;
        self
    }
    /// The number of warm-up iterations.
    pub fn warmup_iters(&self) -> usize {
        self.warmup
    }
    /// A pipeline schedule: `+c` the forward of chunk `c` (1-indexed) for its next
    /// microbatch, `-c` the backward of its oldest outstanding one.
    pub fn order(mut self, order: Vec<i32>) -> Self {
        self.order = Some(order);
        self
    }
    /// Allow inputs that need a grad to get none from backward.
    pub fn allow_unused_input(mut self, allow: bool) -> Self {
        self.allow_unused_input = allow;
        self
    }
    /// The CUDA capture mode.
    pub fn capture_mode(mut self, mode: CaptureMode) -> Self {
        self.capture_mode = mode;
        self
    }
    /// Capture for inference: forward graphs only, modules in eval mode.
    pub fn inference(mut self) -> Self {
        self.training = false;
        self
    }
    /// Chain the chunks: chunk `c + 1`'s first input *is* chunk `c`'s first output buffer (and
    /// chunk `c`'s grad output is chunk `c + 1`'s grad input), so passing outputs along costs
    /// no copies. Samples for chained inputs are only used for their shape.
    pub fn chained(mut self, chained: bool) -> Self {
        self.chained = chained;
        self
    }
    /// Hooks registered at run time (see [`HookRegistry`]).
    pub fn hooks(mut self, hooks: &HookRegistry) -> Self {
        self.hooks = hooks.clone();
        self
    }
}

/// One entry of a schedule: forward or backward of a chunk (0-indexed here).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Step {
    Forward(usize),
    Backward(usize),
}

/// Checks a schedule and returns (steps, microbatches); `None` gives module order.
fn schedule(order: Option<&[i32]>, chunks: usize, training: bool) -> Result<(Vec<Step>, usize)> {
    let bad = |detail: String| Error::invalid("make_graphed order", detail);
    let Some(order) = order else {
        let mut steps: Vec<Step> = (0..chunks).map(Step::Forward).collect();
        if training {
            steps.extend((0..chunks).rev().map(Step::Backward));
        }
        return Ok((steps, 1));
    };
    if order.is_empty() || order.len() % (2 * chunks) != 0 {
        return Err(bad(format!("length {} is not a multiple of 2 x {chunks} chunks", order.len())));
    }
    let m = order.len() / (2 * chunks);
    let (mut fwd, mut bwd) = (vec![0usize; chunks], vec![0usize; chunks]);
    let mut steps = Vec::with_capacity(order.len());
    for &e in order {
        let c = e.unsigned_abs() as usize;
        if e == 0 || c > chunks {
            return Err(bad(format!("entry {e}: chunks are numbered 1..={chunks}")));
        }
        if e > 0 {
            fwd[c - 1] += 1;
            steps.push(Step::Forward(c - 1));
        } else {
            bwd[c - 1] += 1;
            if bwd[c - 1] > fwd[c - 1] {
                return Err(bad(format!("backward of chunk {c} before its forward")));
            }
            if training {
                steps.push(Step::Backward(c - 1));
            }
        }
    }
    if fwd.iter().chain(&bwd).any(|&n| n != m) {
        return Err(bad(format!(
            "each chunk needs {m} forwards and {m} backwards (forwards {fwd:?}, backwards {bwd:?})"
        )));
    }
    Ok((steps, m))
}

/// The static surfaces and graphs of one (chunk, microbatch).
struct Surface {
    label: String,
    forward: Graph,
    backward: Option<Graph>,
    inputs: Vec<Option<Tensor>>,
    outputs: Vec<Option<Tensor>>,
    grad_outputs: Vec<Option<Tensor>>,
    grad_inputs: Vec<Option<Tensor>>,
    /// What the captured forward saved for the captured backward (kept alive).
    saved: Option<Cx>,
    /// Buffers each replay overwrites (its own outputs, and other surfaces' buffers that lie in
    /// its temporaries): handles to them go stale on replay.
    forward_clobbers: Vec<Tensor>,
    backward_clobbers: Vec<Tensor>,
    forward_temps: Vec<MemRange>,
    backward_temps: Vec<MemRange>,
}

/// A microbatch whose backward has not run yet.
enum Pending {
    Graphed(usize),
    Eager(Cx),
}

/// Modules captured into graphs that share one pool; see [`make_graphed`].
pub struct GraphedModules {
    device: Device,
    modules: Vec<Box<dyn Module>>,
    pool: GraphPool,
    surfaces: Vec<Vec<Surface>>,
    next_forward: Vec<usize>,
    pending: Vec<VecDeque<Pending>>,
    captured_training: bool,
    training: bool,
    options: GraphOptions,
    capture_time: Duration,
}

impl std::fmt::Debug for GraphedModules {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<_> = self.modules.iter().map(|m| m.name()).collect();
        write!(f, "GraphedModules({names:?}, {} microbatches, {:?})", self.microbatches(), self.pool)
    }
}

fn first_device(samples: &[Vec<Vec<Option<Tensor>>>]) -> Option<Device> {
    samples.iter().flatten().flatten().flatten().next().map(|t| t.device().clone())
}

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
pub fn make_graphed(
    modules: Vec<Box<dyn Module>>,
    samples: Vec<Vec<Vec<Option<Tensor>>>>,
    options: GraphOptions,
) -> Result<GraphedModules> {
    let chunks = modules.len();
    if chunks == 0 {
        return Err(Error::invalid("make_graphed", "no modules"));
    }
    if options.warmup == 0 {
        return Err(Error::invalid("make_graphed", "warmup must be at least 1 (kernels must load before capture)"));
    }
    if samples.len() != chunks {
        return Err(Error::invalid("make_graphed", format!("{} sample lists for {chunks} modules", samples.len())));
    }
    let device = first_device(&samples)
        .ok_or_else(|| Error::invalid("make_graphed", "no sample tensor to take the device from"))?;
    let (steps, microbatches) = schedule(options.order.as_deref(), chunks, options.training)?;
    for (c, (m, s)) in modules.iter().zip(&samples).enumerate() {
        if s.len() != 1 && s.len() != microbatches {
            return Err(Error::invalid(
                "make_graphed",
                format!("chunk {}: {} sample sets for {microbatches} microbatches", c + 1, s.len()),
            ));
        }
        for set in s {
            if set.len() != m.num_inputs() {
                return Err(Error::Graphed {
                    module: m.name().into(),
                    detail: format!("{} sample inputs for a forward of {} tensor arguments", set.len(), m.num_inputs()),
                });
            }
        }
    }

    let started = Instant::now();
    let pool = device.new_pool();
    let mut g = GraphedModules {
        device: device.clone(),
        pool: pool.clone(),
        surfaces: Vec::new(),
        next_forward: vec![0; chunks],
        pending: (0..chunks).map(|_| VecDeque::new()).collect(),
        captured_training: options.training,
        training: options.training,
        capture_time: Duration::ZERO,
        modules,
        options,
    };
    let rng_state = device.rng()?.save()?;
    device.with_pool(&pool, || -> Result<()> {
        g.make_surfaces(&samples, microbatches)?;
        for _ in 0..g.options.warmup {
            g.warm_up(&steps)?;
        }
        g.capture(&steps)
    })?;
    g.compute_clobbers();
    device.rng()?.restore(&rng_state)?;
    device.synchronize()?;
    g.capture_time = started.elapsed();
    Ok(g)
}

impl GraphedModules {
    /// Static inputs for every (chunk, microbatch): copies of the samples, in the pool.
    fn make_surfaces(&mut self, samples: &[Vec<Vec<Option<Tensor>>>], microbatches: usize) -> Result<()> {
        for (c, s) in samples.iter().enumerate() {
            let mut row = Vec::with_capacity(microbatches);
            for m in 0..microbatches {
                let set = &s[m.min(s.len() - 1)];
                let label = format!("{}[chunk {}, microbatch {}]", self.modules[c].name(), c + 1, m);
                let mut inputs = Vec::with_capacity(set.len());
                for (i, t) in set.iter().enumerate() {
                    let chained = self.options.chained && c > 0 && i == 0;
                    inputs.push(match t {
                        Some(t) if !chained => {
                            let st = t.deep_clone()?;
                            st.set_owner(format!("{label} input {i}"));
                            Some(st)
                        }
                        _ => None, // absent optional input, or filled in by chaining at capture
                    });
                }
                let pool = self.pool.clone();
                row.push(Surface {
                    forward: Graph::with_pool(&self.device, &pool),
                    backward: None,
                    inputs,
                    outputs: Vec::new(),
                    grad_outputs: Vec::new(),
                    grad_inputs: Vec::new(),
                    saved: None,
                    forward_clobbers: Vec::new(),
                    backward_clobbers: Vec::new(),
                    forward_temps: Vec::new(),
                    backward_temps: Vec::new(),
                    label,
                });
            }
            self.surfaces.push(row);
        }
        Ok(())
    }

    fn run_hooks(&mut self, chunk: usize, kind: HookKind) -> Result<()> {
        let module = &mut self.modules[chunk];
        let name = module.name();
        self.options
            .hooks
            .run(chunk, kind, || module.run_hooks(kind))
            .map_err(|e| e.context(format!("{} hook of {name}", kind.name())))
    }

    fn needs_input_grad(inputs: &[Option<Tensor>]) -> Vec<bool> {
        inputs.iter().map(|t| t.as_ref().is_some_and(|t| t.requires_grad())).collect()
    }

    /// One eager iteration following the schedule, with zero grad outputs.
    fn warm_up(&mut self, steps: &[Step]) -> Result<()> {
        let mut queues: Vec<VecDeque<(Cx, Vec<Option<Tensor>>)>> =
            (0..self.modules.len()).map(|_| VecDeque::new()).collect();
        let mut next = vec![0usize; self.modules.len()];
        // First output of each (chunk, microbatch) this iteration, for chaining.
        let mut first_outputs: Vec<Vec<Option<Tensor>>> = self.surfaces.iter().map(|r| vec![None; r.len()]).collect();
        for &step in steps {
            match step {
                Step::Forward(c) => {
                    let m = next[c];
                    next[c] += 1;
                    let prev = if c > 0 { first_outputs[c - 1][m].clone() } else { None };
                    let inputs = self.chained_inputs(c, m, prev)?;
                    self.run_hooks(c, HookKind::PreForward)?;
                    let mut cx = Cx::new(&self.device);
                    cx.set_training(self.captured_training);
                    cx.set_needs_input_grad(Self::needs_input_grad(&inputs));
                    let outs = self.modules[c].forward(&mut cx, &inputs)?;
                    self.run_hooks(c, HookKind::Forward)?;
                    first_outputs[c][m] = outs.first().cloned().flatten();
                    queues[c].push_back((cx, outs));
                }
                Step::Backward(c) => {
                    let (mut cx, outs) = queues[c]
                        .pop_front()
                        .ok_or_else(|| Error::invalid("make_graphed", "backward without forward"))?;
                    self.run_hooks(c, HookKind::PreBackward)?;
                    let grads = outs
                        .iter()
                        .map(|o| o.as_ref().map(|o| Tensor::zeros(&self.device, o.dims())).transpose())
                        .collect::<Result<Vec<_>>>()?;
                    self.modules[c].backward(&mut cx, &grads)?;
                    self.run_hooks(c, HookKind::Backward)?;
                }
            }
        }
        self.device.synchronize()
    }

    /// The inputs of (chunk, microbatch): its static inputs, with a chained first input taken
    /// from the previous chunk's outputs.
    /// `prev` is the previous chunk's first output for this microbatch, if it ran yet.
    fn chained_inputs(&self, c: usize, m: usize, prev: Option<Tensor>) -> Result<Vec<Option<Tensor>>> {
        let mut inputs = self.surfaces[c][m].inputs.clone();
        if self.options.chained && c > 0 {
            let prev = prev.ok_or_else(|| {
                Error::invalid(
                    "make_graphed",
                    format!("chained: chunk {} microbatch {m} runs before chunk {} produced its output", c + 1, c),
                )
            })?;
            if let Some(first) = inputs.first_mut() {
                *first = Some(prev.with_requires_grad(true));
            }
        }
        Ok(inputs)
    }

    /// Captures every step into its own graph, in schedule order.
    fn capture(&mut self, steps: &[Step]) -> Result<()> {
        let mode = self.options.capture_mode;
        let mut next = vec![0usize; self.modules.len()];
        let mut queues: Vec<VecDeque<usize>> = (0..self.modules.len()).map(|_| VecDeque::new()).collect();
        for &step in steps {
            match step {
                Step::Forward(c) => {
                    let m = next[c];
                    next[c] += 1;
                    let prev = if c > 0 { self.surfaces[c - 1][m].outputs.first().cloned().flatten() } else { None };
                    let inputs = self.chained_inputs(c, m, prev)?;
                    self.surfaces[c][m].inputs = inputs.clone();
                    self.run_hooks(c, HookKind::PreForward)?;
                    let mut cx_template = Cx::new(&self.device);
                    cx_template.set_training(self.captured_training);
                    cx_template.set_needs_input_grad(Self::needs_input_grad(&inputs));
                    self.pool.begin_tracking();
                    let module = &self.modules[c];
                    let s = &mut self.surfaces[c][m];
                    s.forward.set_label(format!("{} forward", s.label));
                    let captured = s.forward.capture(mode, || {
                        let mut cx = cx_template.clone();
                        let outs = module.forward(&mut cx, &inputs)?;
                        Ok((cx, outs))
                    });
                    s.forward_temps = self.pool.end_tracking();
                    let (cx, outs) =
                        captured.map_err(|e| e.context(format!("capturing the forward of {}", s.label)))?;
                    for (i, o) in outs.iter().enumerate() {
                        if let Some(o) = o {
                            o.set_owner(format!("{} output {i}", s.label));
                        }
                    }
                    s.outputs = outs;
                    s.saved = Some(cx);
                    self.run_hooks(c, HookKind::Forward)?;
                    queues[c].push_back(m);
                }
                Step::Backward(c) => {
                    let m = queues[c]
                        .pop_front()
                        .ok_or_else(|| Error::invalid("make_graphed", "backward without forward"))?;
                    self.run_hooks(c, HookKind::PreBackward)?;
                    let grad_outputs = self.static_grad_outputs(c, m)?;
                    let cx_template = self.surfaces[c][m]
                        .saved
                        .clone()
                        .ok_or_else(|| Error::GraphState("no saved forward".into()))?;
                    self.pool.begin_tracking();
                    let allow_unused = self.options.allow_unused_input;
                    let device = self.device.clone();
                    let module = &mut self.modules[c];
                    let name = module.name();
                    let s = &mut self.surfaces[c][m];
                    let mut graph = Graph::with_pool(&device, &self.pool);
                    graph.set_label(format!("{} backward", s.label));
                    let captured = graph.capture(mode, || {
                        let mut cx = cx_template.clone();
                        module.backward(&mut cx, &grad_outputs)
                    });
                    s.backward_temps = self.pool.end_tracking();
                    let grads = captured.map_err(|e| e.context(format!("capturing the backward of {}", s.label)))?;
                    if grads.len() != s.inputs.len() {
                        return Err(Error::Graphed {
                            module: name.into(),
                            detail: format!("backward returned {} grads for {} inputs", grads.len(), s.inputs.len()),
                        });
                    }
                    let mut grad_inputs = Vec::with_capacity(grads.len());
                    for (i, (g, x)) in grads.into_iter().zip(&s.inputs).enumerate() {
                        let wanted = x.as_ref().is_some_and(|x| x.requires_grad());
                        match (wanted, g) {
                            (true, Some(g)) => {
                                g.set_owner(format!("{} grad input {i}", s.label));
                                grad_inputs.push(Some(g));
                            }
                            (true, None) if !allow_unused => {
                                return Err(Error::Graphed {
                                    module: name.into(),
                                    detail: format!("input {i} needs a grad but backward returned none; pass allow_unused_input to allow it"),
                                })
                            }
                            _ => grad_inputs.push(None),
                        }
                    }
                    s.grad_outputs = grad_outputs;
                    s.grad_inputs = grad_inputs;
                    s.backward = Some(graph);
                    self.run_hooks(c, HookKind::Backward)?;
                }
            }
        }
        Ok(())
    }

    /// Grad-output buffers for (chunk, microbatch): one per `Some` output, none for `None`
    /// outputs; with chaining, the next chunk's grad input is reused.
    fn static_grad_outputs(&self, c: usize, m: usize) -> Result<Vec<Option<Tensor>>> {
        let s = &self.surfaces[c][m];
        let mut grads = Vec::with_capacity(s.outputs.len());
        for (i, o) in s.outputs.iter().enumerate() {
            let chained = self.options.chained && i == 0 && c + 1 < self.surfaces.len();
            let g = match o {
                None => None,
                Some(_) if chained => {
                    let next = &self.surfaces[c + 1][m];
                    match next.grad_inputs.first().cloned().flatten() {
                        Some(g) => Some(g),
                        None => {
                            return Err(Error::invalid(
                                "make_graphed",
                                format!(
                                    "chained: the backward of chunk {} microbatch {m} must come before chunk {}'s",
                                    c + 2,
                                    c + 1
                                ),
                            ))
                        }
                    }
                }
                Some(o) => {
                    let g = Tensor::zeros(&self.device, o.dims())?;
                    g.set_owner(format!("{} grad output {i}", s.label));
                    Some(g)
                }
            };
            grads.push(g);
        }
        Ok(grads)
    }

    /// For each graph, the handed-out buffers its replay overwrites: its own outputs (or grad
    /// inputs) and any other surface's buffers that lie in memory it uses as temporaries.
    fn compute_clobbers(&mut self) {
        let mut handed: Vec<Tensor> = Vec::new();
        for s in self.surfaces.iter().flatten() {
            handed.extend(s.outputs.iter().flatten().cloned());
            handed.extend(s.grad_inputs.iter().flatten().cloned());
        }
        let pool_id = self.pool.id();
        let hits = |temps: &[MemRange], own: &[Option<Tensor>]| -> Vec<Tensor> {
            let mut v: Vec<Tensor> = own.iter().flatten().cloned().collect();
            for t in &handed {
                let (pid, r) = t.mem_range();
                if pid == pool_id && temps.iter().any(|x| x.overlaps(&r)) && !v.iter().any(|o| o.same_buffer(t)) {
                    v.push(t.clone());
                }
            }
            v
        };
        for s in self.surfaces.iter_mut().flatten() {
            s.forward_clobbers = hits(&s.forward_temps, &s.outputs);
            s.backward_clobbers = hits(&s.backward_temps, &s.grad_inputs);
        }
    }

    /// Runs the forward of `chunk` for its next microbatch: copies each input into its static
    /// input (unless it already is that buffer), replays, and returns the static outputs.
    /// In the mode other than the one captured, runs the module eagerly.
    ///
    /// `cx` is taken for symmetry with the eager module; graphed modules keep the contexts of
    /// their microbatches themselves.
    pub fn forward(&mut self, chunk: usize, cx: &mut Cx, inputs: &[Option<Tensor>]) -> Result<Vec<Option<Tensor>>> {
        let _ = cx;
        self.check_chunk(chunk)?;
        if self.training != self.captured_training {
            return self.eager_forward(chunk, inputs);
        }
        let m = self.next_forward[chunk];
        let s = &mut self.surfaces[chunk][m];
        if inputs.len() != s.inputs.len() {
            return Err(Error::Graphed {
                module: s.label.clone(),
                detail: format!("{} inputs given, the forward takes {}", inputs.len(), s.inputs.len()),
            });
        }
        for (i, (given, st)) in inputs.iter().zip(&s.inputs).enumerate() {
            copy_in(&s.label, "input", i, given.as_ref(), st.as_ref())?;
        }
        let restarted = s.forward.replay_checked()?;
        if restarted {
            // An iteration was abandoned half-way: its handles go stale and its microbatches
            // can no longer run backward.
            self.invalidate_all();
            self.pending.iter_mut().for_each(VecDeque::clear);
            self.next_forward.fill(0);
        }
        self.next_forward[chunk] = (m + 1) % self.surfaces[chunk].len();
        let s = &self.surfaces[chunk][m];
        for t in &s.forward_clobbers {
            t.bump_generation();
        }
        if self.captured_training {
            self.pending[chunk].push_back(Pending::Graphed(m));
        }
        Ok(s.outputs.iter().map(|o| o.as_ref().map(Tensor::refreshed)).collect())
    }

    /// Runs the backward of `chunk` for its oldest outstanding microbatch (`cx` as in
    /// [`GraphedModules::forward`]): copies the grad
    /// outputs in (skipping `None` outputs), replays, and returns the grads of the inputs
    /// (`None` for inputs that need none). Parameter grads accumulate.
    pub fn backward(
        &mut self,
        chunk: usize,
        cx: &mut Cx,
        grad_outputs: &[Option<Tensor>],
    ) -> Result<Vec<Option<Tensor>>> {
        let _ = cx;
        self.check_chunk(chunk)?;
        let pending = self.pending[chunk].pop_front().ok_or_else(|| Error::Graphed {
            module: self.modules[chunk].name().into(),
            detail: "backward without an outstanding forward".into(),
        })?;
        let m = match pending {
            Pending::Eager(mut cx) => return self.eager_backward(chunk, &mut cx, grad_outputs),
            Pending::Graphed(m) => m,
        };
        let s = &mut self.surfaces[chunk][m];
        if grad_outputs.len() != s.grad_outputs.len() {
            return Err(Error::Graphed {
                module: s.label.clone(),
                detail: format!("{} grad outputs given for {} outputs", grad_outputs.len(), s.grad_outputs.len()),
            });
        }
        for (i, (given, st)) in grad_outputs.iter().zip(&s.grad_outputs).enumerate() {
            if st.is_some() {
                copy_in(&s.label, "grad output", i, given.as_ref(), st.as_ref())?;
            }
        }
        let graph = s.backward.as_mut().ok_or_else(|| Error::GraphState(format!("{}: no backward graph", s.label)))?;
        if graph.replay_checked()? {
            // Only a forward graph can start a cycle, so this does not happen; stay safe anyway.
            self.invalidate_all();
        }
        let s = &self.surfaces[chunk][m];
        for t in &s.backward_clobbers {
            t.bump_generation();
        }
        Ok(s.grad_inputs.iter().map(|g| g.as_ref().map(Tensor::refreshed)).collect())
    }

    fn check_chunk(&self, chunk: usize) -> Result<()> {
        if chunk >= self.modules.len() {
            return Err(Error::invalid("GraphedModules", format!("chunk {chunk} of {}", self.modules.len())));
        }
        Ok(())
    }

    /// An abandoned cycle: every handed-out buffer may be overwritten out of turn.
    fn invalidate_all(&self) {
        for s in self.surfaces.iter().flatten() {
            for t in s.outputs.iter().chain(&s.grad_inputs).flatten() {
                t.bump_generation();
            }
        }
    }

    fn eager_forward(&mut self, chunk: usize, inputs: &[Option<Tensor>]) -> Result<Vec<Option<Tensor>>> {
        self.run_hooks(chunk, HookKind::PreForward)?;
        let mut cx = Cx::new(&self.device);
        cx.set_training(self.training);
        cx.set_needs_input_grad(Self::needs_input_grad(inputs));
        let outs = self.modules[chunk].forward(&mut cx, inputs)?;
        self.run_hooks(chunk, HookKind::Forward)?;
        if self.training {
            self.pending[chunk].push_back(Pending::Eager(cx));
        }
        Ok(outs)
    }

    fn eager_backward(
        &mut self,
        chunk: usize,
        cx: &mut Cx,
        grad_outputs: &[Option<Tensor>],
    ) -> Result<Vec<Option<Tensor>>> {
        self.run_hooks(chunk, HookKind::PreBackward)?;
        let grads = self.modules[chunk].backward(cx, grad_outputs)?;
        self.run_hooks(chunk, HookKind::Backward)?;
        Ok(grads)
    }

    /// Switches to training mode (graphs captured for training replay; otherwise eager).
    pub fn train(&mut self) {
        self.training = true;
    }

    /// Switches to eval mode (graphs captured for inference replay; otherwise eager).
    pub fn eval(&mut self) {
        self.training = false;
    }

    /// Whether in training mode.
    pub fn is_training(&self) -> bool {
        self.training
    }

    /// The module of `chunk`, if it is a `T`.
    pub fn module<T: Module>(&self, chunk: usize) -> Option<&T> {
        let m: &dyn std::any::Any = self.modules.get(chunk)?.as_ref();
        m.downcast_ref::<T>()
    }

    /// The module of `chunk`, mutably, if it is a `T`.
    pub fn module_mut<T: Module>(&mut self, chunk: usize) -> Option<&mut T> {
        let m: &mut dyn std::any::Any = self.modules.get_mut(chunk)?.as_mut();
        m.downcast_mut::<T>()
    }

    /// The pool all graphs share.
    pub fn pool(&self) -> &GraphPool {
        &self.pool
    }

    /// Registers a capture-time hook for `chunk` (it runs on eager calls from now on; it ran
    /// during capture only if registered through [`GraphOptions::hooks`] before).
    pub fn register_hook(
        &self,
        chunk: usize,
        kind: HookKind,
        prepend: bool,
        f: impl FnMut() -> Result<()> + Send + 'static,
    ) -> crate::HookHandle {
        self.options.hooks.register(chunk, kind, prepend, f)
    }

    /// Wall time of warm-up plus capture.
    pub fn capture_time(&self) -> Duration {
        self.capture_time
    }

    /// Microbatches per chunk.
    pub fn microbatches(&self) -> usize {
        self.surfaces.first().map_or(0, Vec::len)
    }

    /// Number of chunks (modules).
    pub fn chunks(&self) -> usize {
        self.modules.len()
    }

    /// The device.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// The graphs in capture order: (label, graph).
    pub fn graphs(&self) -> Vec<(&str, &Graph)> {
        let mut v = Vec::new();
        for s in self.surfaces.iter().flatten() {
            v.push((s.forward.label(), &s.forward));
            if let Some(b) = &s.backward {
                v.push((b.label(), b));
            }
        }
        v
    }

    /// Bytes of the static surfaces and saved activations that must stay live, for comparing
    /// with the pool's reserved bytes.
    pub fn live_bytes(&self) -> usize {
        let mut seen: Vec<Tensor> = Vec::new();
        for s in self.surfaces.iter().flatten() {
            let saved = s.saved.as_ref().map(Cx::all_saved).unwrap_or_default();
            for t in s
                .inputs
                .iter()
                .chain(&s.outputs)
                .chain(&s.grad_outputs)
                .chain(&s.grad_inputs)
                .flatten()
                .chain(saved.iter())
            {
                let (pid, _) = t.mem_range();
                if pid == self.pool.id() && !seen.iter().any(|x| x.same_buffer(t)) {
                    seen.push(t.clone());
                }
            }
        }
        seen.iter().map(|t| t.mem_range().1.bytes).sum()
    }
}

/// Copies `given` into the static buffer `st` unless it already is that buffer.
fn copy_in(label: &str, what: &str, i: usize, given: Option<&Tensor>, st: Option<&Tensor>) -> Result<()> {
    match (given, st) {
        (Some(x), Some(st)) => {
            if x.same_buffer(st) {
                // Already in place; a stale handle still errors.
                x.ptr()?;
                return Ok(());
            }
            if x.dims() != st.dims() || x.dtype() != st.dtype() {
                return Err(Error::Graphed {
                    module: label.into(),
                    detail: format!(
                        "{what} {i} has shape {:?} ({:?}) but was captured with {:?} ({:?}); capture again for a new shape",
                        x.dims(),
                        x.dtype(),
                        st.dims(),
                        st.dtype()
                    ),
                });
            }
            st.refreshed().copy_(x)
        }
        (None, None) => Ok(()),
        (None, Some(_)) => Err(Error::Graphed {
            module: label.into(),
            detail: format!("{what} {i} is None but was captured with a tensor"),
        }),
        (Some(_), None) => Err(Error::Graphed {
            module: label.into(),
            detail: format!("{what} {i} is a tensor but was captured as None"),
        }),
    }
}
