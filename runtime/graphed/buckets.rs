//! Shape buckets: the same modules captured once per size of one declared axis, largest
//! first, into one pool, so that a smaller bucket's warm-up and capture reuse the memory the
//! larger ones released (as vLLM and SGLang capture their batch sizes). A call picks its
//! bucket from a table in O(1), pads its inputs into the bucket's static inputs and gets its
//! outputs back trimmed to its real size; the module reads the real size on the device
//! ([`crate::Cx::bucket_length`]), so one graph serves every size in its bucket.
//!
//! The smaller buckets' static buffers (inputs, outputs, grads) are the first elements of the
//! largest bucket's (`reuse::Slot::prefix`), and their temporaries and saved activations lie
//! in memory the larger buckets' captures released, so the whole list costs little more pool
//! than the largest bucket alone.
//!
//! A call's bucket is the smallest that holds it, except that a forward continuing an
//! iteration (a later chunk, or a later microbatch of a pipeline schedule) stays in the
//! iteration's bucket when it fits there; a fused step takes the bucket of its longest
//! microbatch.
//!
//! Only one bucket is active at a time: its graphs, surfaces and queues sit in
//! [`GraphedModules`]' fields, the others are parked here and swapped in when a call needs
//! them. Switching buckets while the active one has microbatches waiting for their backward
//! abandons them (their backward is then [`Error::NoPendingForward`]): the smaller bucket's
//! graphs write the memory that held their saved activations.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use super::schedule::Schedule;
use super::{GraphedModules, Pending, Surface};
use crate::backend::AxisResize;
use crate::{BucketError, Error, Result, Slot, SlotKind, Tensor};

/// What a call larger than the largest bucket does.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum AboveLargest {
    /// Refuse it: [`BucketError::AboveLargest`] (the default).
    #[default]
    Error,
    /// Run the modules eagerly at the call's real size (as vLLM does above its largest
    /// captured batch).
    Eager,
}

/// Shape buckets over one axis of the inputs ([`crate::GraphOptions::buckets`]): the sizes
/// to capture, what pads an input up to its bucket, and what happens above the largest.
///
/// The bucketed inputs are those whose sample has the largest bucket's size along `axis`;
/// samples are given at the largest bucket's size, and each smaller bucket's samples are their
/// first positions along `axis`. Outputs (and grads) whose size along `axis` follows the
/// bucket's are trimmed to the call's size.
///
/// ```
/// use graphed::{AboveLargest, Buckets};
/// let b = Buckets::powers_of_two(1, 128, 1024).pad(1, -100.0).above_largest(AboveLargest::Eager);
/// assert_eq!(b.sizes(), &[128, 256, 512, 1024]);
/// assert_eq!((b.bucket_of(129), b.bucket_of(1024), b.bucket_of(1025)), (Some(256), Some(1024), None));
/// assert_eq!(Buckets::step(0, 8, 20).sizes(), &[8, 16, 20]);
/// assert_eq!(Buckets::new(0, [4, 1, 2, 2]).sizes(), &[1, 2, 4]);
/// # Ok::<(), graphed::Error>(())
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct Buckets {
    axis: usize,
    /// Ascending, without repeats.
    sizes: Vec<usize>,
    pads: Vec<(usize, f32)>,
    above: AboveLargest,
    /// A rule that made no list (kept to be reported by `make_graphed`).
    rule_error: Option<String>,
}

impl Buckets {
    /// Buckets of these sizes along `axis` (in any order; repeats are dropped).
    pub fn new(axis: usize, sizes: impl IntoIterator<Item = usize>) -> Buckets {
        let mut sizes: Vec<usize> = sizes.into_iter().collect();
        sizes.sort_unstable();
        sizes.dedup();
        Buckets { axis, sizes, pads: Vec::new(), above: AboveLargest::Error, rule_error: None }
    }

    /// `min`, `2·min`, `4·min`, ... up to `max`, and `max` itself.
    pub fn powers_of_two(axis: usize, min: usize, max: usize) -> Buckets {
        if min == 0 || min > max {
            return Buckets::refused(axis, format!("powers of two from {min} to {max}"));
        }
        let sizes = std::iter::successors(Some(min), |s| s.checked_mul(2)).take_while(|s| *s < max);
        Buckets::new(axis, sizes.chain([max]))
    }

    /// `step`, `2·step`, ... up to `max`, and `max` itself.
    pub fn step(axis: usize, step: usize, max: usize) -> Buckets {
        if step == 0 || step > max {
            return Buckets::refused(axis, format!("a step of {step} up to {max}"));
        }
        Buckets::new(axis, (1..).map(|k| k * step).take_while(|s| *s < max).chain([max]))
    }

    fn refused(axis: usize, rule: String) -> Buckets {
        Buckets { rule_error: Some(format!("{rule} makes no list of sizes")), ..Buckets::new(axis, []) }
    }

    /// The value input `input` (of every chunk) is padded with up to its bucket's size
    /// (rounded to the input's dtype); 0 where not given. A loss's labels are usually padded
    /// with an index the loss ignores.
    pub fn pad(mut self, input: usize, value: f32) -> Buckets {
        self.pads.retain(|(i, _)| *i != input);
        self.pads.push((input, value));
        self
    }

    /// What a call larger than the largest bucket does.
    pub fn above_largest(mut self, above: AboveLargest) -> Buckets {
        self.above = above;
        self
    }

    /// The same buckets (axis, pads, what happens above) with other sizes.
    pub(super) fn with_sizes(&self, sizes: impl IntoIterator<Item = usize>) -> Buckets {
        Buckets { pads: self.pads.clone(), above: self.above, ..Buckets::new(self.axis, sizes) }
    }

    /// The bucketed axis.
    pub fn axis(&self) -> usize {
        self.axis
    }

    /// The sizes, ascending.
    pub fn sizes(&self) -> &[usize] {
        &self.sizes
    }

    /// The smallest bucket that holds `size`, if any.
    pub fn bucket_of(&self, size: usize) -> Option<usize> {
        self.sizes.iter().copied().find(|s| *s >= size)
    }

    /// What input `input` is padded with.
    pub fn pad_value(&self, input: usize) -> f32 {
        self.pads.iter().find(|(i, _)| *i == input).map_or(0.0, |(_, v)| *v)
    }

    /// The largest size, if any.
    fn largest(&self) -> usize {
        self.sizes.last().copied().unwrap_or(0)
    }

    /// The list makes sense (checked by `make_graphed` before anything runs).
    pub(super) fn validate(&self) -> Result<()> {
        if let Some(detail) = &self.rule_error {
            return Err(BucketError::BadRule { detail: detail.clone() }.into());
        }
        if self.sizes.is_empty() || self.sizes[0] == 0 {
            return Err(BucketError::NoSizes { sizes: self.sizes.clone() }.into());
        }
        Ok(())
    }
}

/// What capturing one bucket took ([`GraphedModules::bucket_reports`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BucketReport {
    /// The bucket's size along the bucketed axis.
    pub size: usize,
    /// Wall time of its warm-up and capture.
    pub capture_time: Duration,
    /// Bytes its warm-up and capture added to the pool's reservation (0 when it fit in
    /// memory the larger buckets had released).
    pub added_bytes: usize,
    /// The pool's reserved bytes once it was captured.
    pub reserved_bytes: usize,
}

/// The real sizes of a bucket's calls, per microbatch and per (chunk, microbatch).
#[derive(Default)]
pub(super) struct Lengths {
    /// Per microbatch: the f32 `[1]` tensor the graphs read the real size from, and the value
    /// last written to it.
    device: Vec<(Tensor, usize)>,
    /// `[chunk][microbatch]`: the real size of the microbatch now in flight there.
    real: Vec<Vec<usize>>,
}

/// One bucket's graphs and queues, parked while another bucket is active.
#[derive(Default)]
pub(super) struct BucketState {
    surfaces: Vec<Vec<Surface>>,
    next_forward: Vec<usize>,
    pending: Vec<VecDeque<Pending>>,
    wgrad: super::wgrad::Wgrad,
    fused: Option<super::fused::Fused>,
    staging: Option<super::staging::Staging>,
    lengths: Lengths,
}

/// The buckets of a capture: the options, the lookup table and the parked buckets.
pub(super) struct BucketSet {
    spec: Buckets,
    /// For each size `0..=largest`: the index in `spec.sizes` of its bucket.
    table: Vec<u32>,
    /// Index in `spec.sizes` of the bucket whose state is in `GraphedModules`.
    active: usize,
    /// Per index in `spec.sizes`; `None` for the active one.
    parked: Vec<Option<BucketState>>,
    reports: Vec<BucketReport>,
    /// `[chunk][input]`: whether the input changes size with the bucket.
    inputs: Vec<Vec<bool>>,
    /// `[chunk][output]`: whether the output changes size with the bucket.
    outputs: Vec<Vec<bool>>,
    /// The active bucket's real sizes, on the device and per microbatch.
    lengths: Lengths,
    /// While a smaller bucket is captured: the largest bucket's surfaces, whose buffers it
    /// takes the first elements of (see `reuse::Slot`).
    alias: Option<Vec<Vec<Surface>>>,
}

/// Where a call goes.
pub(super) enum Route {
    /// No buckets: the captured shapes, exactly.
    Plain,
    /// Bucket `index` (in ascending order), for a call of real size `len`.
    Bucket { index: usize, len: usize },
    /// Above the largest bucket, with [`AboveLargest::Eager`]: eagerly, at size `len`.
    Eager { len: usize },
}

/// Which slots [`GraphedModules::copies_in`] checks: of `chunk` (its surfaces labelled
/// `module`), of `kind`, from index `from`, for a call of real size `len` (with buckets),
/// refusing an input that requires a grad its sample did not when `requires_grad`.
pub(super) struct SlotsAt<'a> {
    pub(super) chunk: usize,
    pub(super) module: &'a str,
    pub(super) kind: SlotKind,
    pub(super) from: usize,
    pub(super) len: Option<usize>,
    pub(super) requires_grad: bool,
}

/// A copy a checked call makes before it launches.
pub(super) enum CopyIn {
    /// The whole tensor, same shape.
    Whole { dst: Tensor, src: Tensor },
    /// Padded up along the bucketed axis.
    Pad { dst: Tensor, src: Tensor, layout: AxisResize, value: f32 },
}

impl CopyIn {
    pub(super) fn run(&self) -> Result<()> {
        match self {
            CopyIn::Whole { dst, src } => dst.copy_(src),
            CopyIn::Pad { dst, src, layout, value } => {
                dst.device().backend().resize_axis(&dst.ptr()?, &src.ptr()?, *layout, *value, dst.dtype())
            }
        }
    }
}

/// The `[outer, len, inner]` layout of `dims` around `axis`.
fn around(dims: &[usize], axis: usize) -> (usize, usize, usize) {
    (dims[..axis].iter().product(), dims[axis], dims[axis + 1..].iter().product())
}

/// `dims` with `axis` set to `len`.
fn with_len(dims: &[usize], axis: usize, len: usize) -> Vec<usize> {
    let mut d = dims.to_vec();
    d[axis] = len;
    d
}

/// `t`'s first `len` positions along `axis`: a view when they are the buffer's first
/// elements, a copy otherwise (in the device's current pool).
fn trimmed(t: &Tensor, axis: usize, len: usize) -> Result<Tensor> {
    let (outer, full, inner) = around(t.dims(), axis);
    if len == full {
        return Ok(t.clone());
    }
    let dims = with_len(t.dims(), axis, len);
    if outer == 1 {
        return t.prefix_view(&dims);
    }
    let out = Tensor::empty_as(t.device(), &dims, t.dtype())?.with_requires_grad(t.requires_grad());
    let layout = AxisResize { outer, dst_len: len, src_len: full, inner };
    t.device().backend().resize_axis(&out.ptr()?, &t.ptr()?, layout, 0.0, t.dtype())?;
    Ok(out)
}

/// The samples of a smaller bucket: the bucketed inputs' first `size` positions along the
/// axis (copies, made outside any graph pool), the rest as given.
pub(super) fn bucket_samples(
    samples: &super::capture::Samples,
    bucketed: &[Vec<bool>],
    axis: usize,
    size: usize,
) -> Result<super::capture::Samples> {
    let mut out = Vec::with_capacity(samples.len());
    for (c, chunk) in samples.iter().enumerate() {
        let mut rows = Vec::with_capacity(chunk.len());
        for set in chunk {
            let mut row = Vec::with_capacity(set.len());
            for (i, t) in set.iter().enumerate() {
                row.push(match t {
                    Some(t) if bucketed[c].get(i).copied().unwrap_or(false) => Some(trimmed(t, axis, size)?),
                    t => t.clone(),
                });
            }
            rows.push(row);
        }
        out.push(rows);
    }
    Ok(out)
}

/// Which sample inputs are bucketed: those with the largest bucket's size along the axis.
pub(super) fn bucketed_inputs(samples: &super::capture::Samples, spec: &Buckets) -> Result<Vec<Vec<bool>>> {
    let flags: Vec<Vec<bool>> = samples
        .iter()
        .map(|chunk| {
            chunk.first().map_or_else(Vec::new, |set| {
                set.iter()
                    .map(|t| t.as_ref().is_some_and(|t| t.dims().get(spec.axis) == Some(&spec.largest())))
                    .collect()
            })
        })
        .collect();
    if !flags.iter().flatten().any(|b| *b) {
        return Err(BucketError::NoBucketedInput { axis: spec.axis, largest: spec.largest() }.into());
    }
    Ok(flags)
}

impl GraphedModules {
    /// Warms up and captures every bucket, largest first, each into its own replay group of
    /// the one pool; leaves the largest active. `samples` are at the largest bucket's size.
    pub(super) fn capture_buckets(
        &mut self,
        spec: &Buckets,
        samples: &[super::capture::Samples],
        bucketed: Vec<Vec<bool>>,
        schedule: &Schedule,
    ) -> Result<()> {
        let n = spec.sizes.len();
        let mut table = vec![0u32; spec.largest() + 1];
        for (size, slot) in table.iter_mut().enumerate() {
            *slot = spec.sizes.iter().position(|s| *s >= size).unwrap_or(0) as u32;
        }
        self.buckets = Some(Box::new(BucketSet {
            spec: spec.clone(),
            table,
            active: n - 1,
            parked: (0..n).map(|_| None).collect(),
            reports: Vec::with_capacity(n),
            inputs: bucketed,
            outputs: Vec::new(),
            lengths: Lengths::default(),
            alias: None,
        }));
        let mut parked: Vec<Option<BucketState>> = (0..n).map(|_| None).collect();
        let mut reports = Vec::with_capacity(n);
        for index in (0..n).rev() {
            let started = Instant::now();
            let before = self.pool.stats().reserved;
            if index + 1 < n {
                self.pool.begin_replay_group();
            }
            let lengths = self.new_lengths(spec.sizes[index], schedule.microbatches())?;
            self.set_mut()?.lengths = lengths;
            self.make_surfaces(&samples[index], schedule.microbatches())?;
            for _ in 0..self.config.options.warmup {
                self.iterate(schedule, super::capture::Phase::WarmUp)?;
            }
            self.iterate(schedule, super::capture::Phase::Capture)?;
            let reserved = self.pool.stats().reserved;
            reports.push(BucketReport {
                size: spec.sizes[index],
                capture_time: started.elapsed(),
                added_bytes: reserved.saturating_sub(before),
                reserved_bytes: reserved,
            });
            let mut state = self.take_bucket_state();
            if index + 1 == n {
                // The smaller buckets take the first elements of the largest one's buffers.
                self.set_mut()?.alias = Some(std::mem::take(&mut state.surfaces));
            }
            parked[index] = Some(state);
        }
        if let (Some(largest), Some(surfaces)) = (parked[n - 1].as_mut(), self.set_mut()?.alias.take()) {
            largest.surfaces = surfaces;
        }
        reports.reverse();
        let outputs = self.bucketed_outputs(spec, &parked);
        let mut largest = parked[n - 1].take().unwrap_or_default();
        let set = self.set_mut()?;
        (set.parked, set.reports, set.outputs) = (parked, reports, outputs);
        self.swap_bucket(&mut largest);
        self.bucket_clobbers();
        Ok(())
    }

    /// The bucket set, while capturing the buckets.
    fn set_mut(&mut self) -> Result<&mut BucketSet> {
        self.buckets.as_deref_mut().ok_or_else(|| Error::invalid("shape buckets", "capturing without a bucket set"))
    }

    /// The device length tensors of a new bucket (one per microbatch, outside the memory any
    /// graph writes), holding the bucket's size as the samples do.
    fn new_lengths(&self, size: usize, microbatches: usize) -> Result<Lengths> {
        let mut device = Vec::with_capacity(microbatches);
        for _ in 0..microbatches {
            let t = Tensor::empty_untouched(&self.device, &[1], crate::DType::F32)?;
            self.device.backend().fill(&t.ptr()?, 1, size as f32, crate::DType::F32)?;
            device.push((t, size));
        }
        let real = vec![vec![size; microbatches]; self.modules.len()];
        Ok(Lengths { device, real })
    }

    /// The active bucket's state, moved out (the fields left empty for the next bucket).
    fn take_bucket_state(&mut self) -> BucketState {
        let chunks = self.modules.len();
        let mut state = BucketState {
            next_forward: vec![0; chunks],
            pending: (0..chunks).map(|_| VecDeque::new()).collect(),
            ..Default::default()
        };
        self.swap_bucket(&mut state);
        state
    }

    /// Exchanges the active bucket's state with `state`.
    fn swap_bucket(&mut self, state: &mut BucketState) {
        std::mem::swap(&mut self.surfaces, &mut state.surfaces);
        std::mem::swap(&mut self.next_forward, &mut state.next_forward);
        std::mem::swap(&mut self.pending, &mut state.pending);
        std::mem::swap(&mut self.wgrad, &mut state.wgrad);
        std::mem::swap(&mut self.config.fused, &mut state.fused);
        std::mem::swap(&mut self.config.staging, &mut state.staging);
        if let Some(set) = self.buckets.as_deref_mut() {
            std::mem::swap(&mut set.lengths, &mut state.lengths);
        }
    }

    /// Makes bucket `index` the active one: a move, undone by activating the previous one.
    fn activate(&mut self, index: usize) {
        let Some(set) = self.buckets.as_deref_mut() else { return };
        if set.active == index {
            return;
        }
        let (previous, Some(mut state)) = (set.active, set.parked.get_mut(index).and_then(Option::take)) else {
            return;
        };
        set.active = index;
        self.swap_bucket(&mut state);
        if let Some(set) = self.buckets.as_deref_mut() {
            set.parked[previous] = Some(state);
        }
    }

    /// Which outputs follow the bucket's size: those whose size along the axis is the
    /// bucket's in every bucket.
    fn bucketed_outputs(&self, spec: &Buckets, parked: &[Option<BucketState>]) -> Vec<Vec<bool>> {
        let chunks = self.modules.len();
        (0..chunks)
            .map(|c| {
                let width =
                    parked.iter().flatten().find_map(|s| s.surfaces.get(c)?.first()).map_or(0, |s| s.outputs.len());
                (0..width)
                    .map(|i| {
                        parked.iter().zip(&spec.sizes).all(|(state, size)| {
                            state
                                .as_ref()
                                .and_then(|s| s.surfaces.get(c)?.first()?.outputs.get(i)?.as_ref())
                                .is_some_and(|t| t.dims().get(spec.axis) == Some(size))
                        })
                    })
                    .collect()
            })
            .collect()
    }

    /// Clobber lists across buckets: a bucket's replay overwrites the handed-out buffers of
    /// other buckets that lie in memory it writes (a smaller bucket's outputs placed where a
    /// larger one keeps its temporaries).
    fn bucket_clobbers(&mut self) {
        let Some(n) = self.buckets.as_ref().map(|s| s.spec.sizes.len()) else { return };
        let active = self.buckets.as_ref().map_or(0, |s| s.active);
        for index in 0..n {
            self.activate(index);
            self.compute_clobbers();
            self.compute_wgrad_clobbers();
        }
        self.activate(active);
    }

    /// The handed-out buffers (outputs, grad inputs) of the parked buckets, which the active
    /// bucket's graphs may overwrite.
    pub(super) fn parked_handed_out(&self) -> Vec<Tensor> {
        let Some(set) = &self.buckets else { return Vec::new() };
        set.parked
            .iter()
            .flatten()
            .flat_map(|s| s.surfaces.iter().flatten())
            .flat_map(|s| s.outputs.iter().chain(&s.grad_inputs))
            .flatten()
            .cloned()
            .collect()
    }

    /// Where a call of `chunk` on `inputs` goes: its bucket from the bucketed inputs' size.
    pub(super) fn route(&self, chunk: usize, inputs: &[Option<Tensor>]) -> Result<Route> {
        let Some(set) = &self.buckets else { return Ok(Route::Plain) };
        let axis = set.spec.axis;
        let flags = set.inputs.get(chunk).map_or(&[][..], Vec::as_slice);
        let sizes: Vec<usize> = inputs
            .iter()
            .zip(flags)
            .filter(|(_, b)| **b)
            .filter_map(|(x, _)| x.as_ref()?.dims().get(axis).copied())
            .collect();
        let Some(&len) = sizes.first() else {
            // No bucketed input given (an arity or presence error follows): the active bucket.
            return Ok(Route::Bucket { index: set.active, len: set.spec.sizes[set.active] });
        };
        if sizes.iter().any(|s| *s != len) {
            return Err(BucketError::Lengths { module: self.modules[chunk].name().into(), axis, sizes }.into());
        }
        // A forward that continues an iteration (a later chunk, or a later microbatch of the
        // first) stays in the iteration's bucket where it fits: moving would abandon it.
        let continuing = chunk > 0 || self.next_forward.get(chunk).is_some_and(|&n| n > 0);
        if continuing && len <= set.spec.sizes[set.active] {
            return Ok(Route::Bucket { index: set.active, len });
        }
        match set.table.get(len) {
            Some(&index) => Ok(Route::Bucket { index: index as usize, len }),
            None if set.spec.above == AboveLargest::Eager => Ok(Route::Eager { len }),
            None => Err(BucketError::AboveLargest { size: len, largest: set.spec.largest() }.into()),
        }
    }

    /// Runs `check` with bucket `index` active; on a refusal the previous bucket is active
    /// again (nothing changed). On success the previous bucket, if another, is abandoned:
    /// its microbatches waiting for a backward can no longer run it.
    pub(super) fn in_bucket<T>(&mut self, index: usize, check: impl FnOnce(&mut Self) -> Result<T>) -> Result<T> {
        let previous = self.buckets.as_ref().map_or(index, |s| s.active);
        self.activate(index);
        match check(self) {
            Err(e) => {
                self.activate(previous);
                Err(e)
            }
            Ok(v) => {
                if previous != index {
                    if let Some(state) = self.buckets.as_mut().and_then(|s| s.parked[previous].as_mut()) {
                        state.pending.iter_mut().for_each(VecDeque::clear);
                        state.wgrad.clear_pending();
                        state.next_forward.fill(0);
                    }
                }
                Ok(v)
            }
        }
    }

    /// The copies that bring `given` into slots `at.from..` of `captured` (a surface's
    /// static buffers, or a fused step's bound ones) for a call of real size `at.len`
    /// (`None`: no buckets, shapes exact). A bucketed slot accepts a tensor of its static
    /// shape with `len` along the axis (padded up), or the static buffer itself.
    pub(super) fn copies_in(
        &self,
        at: SlotsAt<'_>,
        given: &[Option<Tensor>],
        captured: &[Option<Tensor>],
    ) -> Result<Vec<CopyIn>> {
        let SlotsAt { chunk, module, kind, from, len, requires_grad } = at;
        if from + given.len() != captured.len() {
            let (expected, got) = (captured.len(), from + given.len());
            return Err(Error::Arity { module: module.into(), kind, expected, got });
        }
        let set = self.buckets.as_deref().filter(|_| len.is_some());
        let mut copies = Vec::new();
        for (i, (x, st)) in given.iter().zip(&captured[from..]).enumerate() {
            let index = from + i;
            let slot = Slot { kind, index };
            let bucketed = set.is_some_and(|set| {
                let flags = if kind == SlotKind::Input { &set.inputs } else { &set.outputs };
                flags.get(chunk).and_then(|f| f.get(index)).copied().unwrap_or(false)
            });
            let (Some(set), Some(len), Some(xt), Some(stt)) = (set.filter(|_| bucketed), len, x, st) else {
                if let Some((x, st)) = super::replay::check_slot(module, slot, x, st, requires_grad)? {
                    copies.push(CopyIn::Whole { dst: st.refreshed(), src: x.clone() });
                }
                continue;
            };
            let axis = set.spec.axis;
            let full = stt.dims().get(axis).copied().unwrap_or(0);
            if len == full || (xt.same_buffer(stt) && xt.dims() == stt.dims()) {
                if let Some((x, st)) = super::replay::check_slot(module, slot, x, st, requires_grad)? {
                    copies.push(CopyIn::Whole { dst: st.refreshed(), src: x.clone() });
                }
                continue;
            }
            let view = Some(stt.prefix_view(&with_len(stt.dims(), axis, len))?);
            super::replay::check_slot(module, slot, x, &view, requires_grad)?;
            let (outer, _, inner) = around(stt.dims(), axis);
            let value = if kind == SlotKind::Input { set.spec.pad_value(index) } else { 0.0 };
            copies.push(CopyIn::Pad {
                dst: stt.refreshed(),
                src: xt.clone(),
                layout: AxisResize { outer, dst_len: full, src_len: len, inner },
                value,
            });
        }
        Ok(copies)
    }

    /// Before replaying (chunk, microbatch) for a call of real size `len`: the microbatch's
    /// device length updated if it changed (a 4-byte copy on the stream), the size recorded
    /// for its backward.
    pub(super) fn set_length(&mut self, chunk: usize, m: usize, len: Option<usize>) -> Result<()> {
        let Some(len) = len else { return Ok(()) };
        let Some(set) = self.buckets.as_deref_mut() else { return Ok(()) };
        if let Some((t, written)) = set.lengths.device.get_mut(m) {
            if *written != len {
                t.device().backend().write_values(&t.ptr()?, &[len as f32], crate::DType::F32)?;
                *written = len;
            }
        }
        if let Some(r) = set.lengths.real.get_mut(chunk).and_then(|row| row.get_mut(m)) {
            *r = len;
        }
        Ok(())
    }

    /// The real size of the microbatch in flight at (chunk, microbatch), with buckets.
    pub(super) fn real_length(&self, chunk: usize, m: usize) -> Option<usize> {
        self.buckets.as_ref()?.lengths.real.get(chunk)?.get(m).copied()
    }

    /// The device length tensor the graphs of microbatch `m` read (with buckets).
    pub(super) fn length_tensor(&self, m: usize) -> Option<Tensor> {
        self.buckets.as_ref()?.lengths.device.get(m).map(|(t, _)| t.clone())
    }

    /// `slots` handed back for a call of real size `len`: the bucketed ones trimmed. `kind`
    /// says which slots they correspond to: `Input` for grad inputs, `GradOutput` for outputs.
    pub(super) fn trim(
        &self,
        chunk: usize,
        kind: SlotKind,
        slots: Vec<Option<Tensor>>,
        len: Option<usize>,
    ) -> Result<Vec<Option<Tensor>>> {
        let (Some(len), Some(set)) = (len, &self.buckets) else { return Ok(slots) };
        let flags = match kind {
            SlotKind::Input => set.inputs.get(chunk),
            SlotKind::GradOutput => set.outputs.get(chunk),
        };
        let axis = set.spec.axis;
        slots
            .into_iter()
            .enumerate()
            .map(|(i, t)| match t {
                Some(t) if flags.and_then(|f| f.get(i)).copied().unwrap_or(false) => Ok(Some(trimmed(&t, axis, len)?)),
                t => Ok(t),
            })
            .collect()
    }

    /// A fresh length tensor for an eager call of size `len` (above the largest bucket).
    pub(super) fn eager_length(&self, len: usize) -> Result<Tensor> {
        Tensor::from_slice(&self.device, &[len as f32], &[1])
    }

    /// With shape buckets: what capturing each bucket took, smallest first.
    ///
    /// ```
    /// # use graphed::{make_graphed, ops, Buckets, Cx, Device, GraphOptions, Module, Result, Tensor};
    /// # struct Double;
    /// # impl Module for Double {
    /// #     fn name(&self) -> &'static str { "Double" }
    /// #     fn num_inputs(&self) -> usize { 1 }
    /// #     fn forward(&self, _cx: &mut Cx, x: &[Option<Tensor>]) -> Result<Vec<Option<Tensor>>> {
    /// #         let x = x[0].as_ref().ok_or_else(|| graphed::Error::msg("x"))?;
    /// #         Ok(vec![Some(ops::scale(x, 2.0)?)])
    /// #     }
    /// #     fn backward(&mut self, _cx: &mut Cx, g: &[Option<Tensor>]) -> Result<Vec<Option<Tensor>>> { Ok(vec![None]) }
    /// # }
    /// let dev = Device::host();
    /// let x = Tensor::zeros(&dev, &[1, 8])?;
    /// let opts = GraphOptions::new().inference().buckets(Buckets::new(1, [2, 4, 8]));
    /// let mut g = make_graphed(vec![Box::new(Double)], vec![vec![vec![Some(x)]]], opts)?;
    /// let sizes: Vec<usize> = g.bucket_reports().iter().map(|r| r.size).collect();
    /// assert_eq!(sizes, [2, 4, 8]);
    /// let y = g.forward(0, &[Some(Tensor::from_slice(&dev, &[1.0, 2.0, 3.0], &[1, 3])?)])?;
    /// assert_eq!(y[0].as_ref().map(|y| y.dims().to_vec()), Some(vec![1, 3]));
    /// assert_eq!(y[0].as_ref().map(|y| y.to_vec()).transpose()?, Some(vec![2.0, 4.0, 6.0]));
    /// # Ok::<(), graphed::Error>(())
    /// ```
    pub fn bucket_reports(&self) -> &[BucketReport] {
        self.buckets.as_ref().map_or(&[], |s| &s.reports)
    }

    /// While a smaller bucket is captured: the largest bucket's surface of (chunk, microbatch).
    pub(super) fn bucket_alias(&self, c: usize, m: usize) -> Option<&Surface> {
        self.buckets.as_ref()?.alias.as_ref()?.get(c)?.get(m)
    }

    /// The number of buckets, with shape buckets.
    pub(super) fn bucket_count(&self) -> Option<usize> {
        self.buckets.as_ref().map(|s| s.spec.sizes.len())
    }

    /// The index of the active bucket, with shape buckets.
    pub(super) fn active_bucket_index(&self) -> Option<usize> {
        self.buckets.as_ref().map(|s| s.active)
    }

    /// With shape buckets: the size of the bucket whose graphs replay next.
    pub fn active_bucket(&self) -> Option<usize> {
        self.buckets.as_ref().map(|s| s.spec.sizes[s.active])
    }
}
