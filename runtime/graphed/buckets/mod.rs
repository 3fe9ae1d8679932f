//! Shape buckets: the same modules captured once per size of one or two declared axes (every
//! combination of their sizes), largest first, into one pool, so that a smaller bucket's warm-up and capture reuse the memory the
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
//! Only one bucket is active at a time: its surfaces, its cursor and its fused step sit in
//! [`GraphedModules`]' fields, the others are parked here and swapped in when a call needs
//! them. Switching buckets while the active one has microbatches waiting for their backward
//! abandons them (their backward is then [`Error::NoPendingForward`]): the smaller bucket's
//! graphs write the memory that held their saved activations.

mod layout;
mod spec;

pub(crate) use layout::{bucket_samples, bucketed_inputs, Along, CopyIn};
pub(crate) use spec::Lens;
pub use spec::{AboveLargest, BucketReport, Buckets};

use std::time::Instant;

use layout::{any, layout, resized_dims, trimmed};
use spec::MAX_AXES;

use super::capture::{Capture, Samples};
use super::cursor::Cursor;
use super::schedule::Schedule;
use super::surface::{Draft, Surface};
use super::GraphedModules;
use crate::{BucketError, DType, Error, Result, Slot, SlotKind, Tensor};

/// The real sizes of a bucket's calls, per microbatch and per (chunk, microbatch).
#[derive(Default)]
pub(super) struct Lengths {
    /// Per microbatch: the f32 `[axes]` tensor the graphs read the real sizes from, and the
    /// values last written to it.
    device: Vec<(Tensor, Lens)>,
    /// `[chunk][microbatch]`: the real sizes of the microbatch now in flight there.
    real: Vec<Vec<Lens>>,
}

impl Lengths {
    /// The device length tensor the graphs of microbatch `m` read.
    pub(super) fn tensor(&self, m: usize) -> Option<Tensor> {
        self.device.get(m).map(|(t, _)| t.clone())
    }
}

/// One bucket's graphs and where its iteration stands, parked while another bucket is active.
struct BucketState {
    surfaces: Vec<Vec<Surface>>,
    cursor: Cursor,
    fused: Option<super::fused::Fused>,
    staging: Option<super::staging::Staging>,
    lengths: Lengths,
}

/// The buckets of a capture: the options, the lookup tables and the parked buckets.
pub(super) struct BucketSet {
    spec: Buckets,
    /// Per declared axis, for each size `0..=largest`: the index of its bucket along the axis.
    tables: Vec<Vec<u32>>,
    /// Index (see `Buckets::shape`) of the bucket whose state is in `GraphedModules`.
    active: usize,
    /// Per bucket index; `None` for the active one.
    parked: Vec<Option<BucketState>>,
    reports: Vec<BucketReport>,
    /// `[chunk][input]`: along which axes the input follows the buckets.
    inputs: Vec<Vec<Along>>,
    /// `[chunk][output]`: along which axes the output follows the buckets.
    outputs: Vec<Vec<Along>>,
    /// The active bucket's real sizes, on the device and per microbatch.
    lengths: Lengths,
}

/// What shape buckets add to a capture: the declared buckets, along which axes each input
/// follows them, and what capturing each bucket took.
pub(super) struct BucketsCaptured {
    pub(super) spec: Buckets,
    pub(super) inputs: Vec<Vec<Along>>,
    pub(super) reports: Vec<BucketReport>,
}

/// Where a call goes.
pub(super) enum Route {
    /// No buckets: the captured shapes, exactly.
    Plain,
    /// Bucket `index`, for a call of real sizes `len`.
    Bucket { index: usize, len: Lens },
    /// Above the largest bucket, with [`AboveLargest::Eager`]: eagerly, at sizes `len`.
    Eager { len: Lens },
}

/// Which slots [`GraphedModules::copies_in`] checks: of `chunk` (its surfaces labelled
/// `module`), of `kind`, from index `from`, for a call of real sizes `len` (with buckets),
/// refusing an input that requires a grad its sample did not when `requires_grad`.
pub(super) struct SlotsAt<'a> {
    pub(super) chunk: usize,
    pub(super) module: &'a str,
    pub(super) kind: SlotKind,
    pub(super) from: usize,
    pub(super) len: Option<Lens>,
    pub(super) requires_grad: bool,
}

impl Capture {
    /// Warms up and captures every bucket, largest first, each into its own replay group of
    /// the one pool (`samples` per bucket index); what each took, smallest first.
    pub(super) fn buckets(
        &mut self,
        spec: &Buckets,
        samples: &[Samples],
        schedule: &Schedule,
    ) -> Result<Vec<BucketReport>> {
        let n = spec.count();
        let mut reports = Vec::with_capacity(n);
        for index in (0..n).rev() {
            let started = Instant::now();
            let before = self.pool.stats().reserved;
            if index + 1 < n {
                self.pool.begin_replay_group();
            }
            let shape = spec.shape(index);
            self.lengths = Some(self.new_lengths(spec, shape, schedule.microbatches())?);
            self.iteration(&samples[index], schedule)?;
            let reserved = self.pool.stats().reserved;
            reports.push(BucketReport {
                size: shape[0],
                shape: shape[..spec.ndims()].to_vec(),
                capture_time: started.elapsed(),
                added_bytes: reserved.saturating_sub(before),
                reserved_bytes: reserved,
            });
            let drafts = std::mem::take(&mut self.drafts);
            self.done.push((drafts, self.lengths.take().unwrap_or_default()));
        }
        reports.reverse();
        Ok(reports)
    }

    /// The device length tensors of a new bucket (one per microbatch, outside the memory any
    /// graph writes), holding the bucket's shape as the samples do.
    fn new_lengths(&self, spec: &Buckets, shape: Lens, microbatches: usize) -> Result<Lengths> {
        let mut device = Vec::with_capacity(microbatches);
        let values: Vec<f32> = shape[..spec.ndims()].iter().map(|&n| n as f32).collect();
        for _ in 0..microbatches {
            let t = Tensor::empty_untouched(&self.device, &[spec.ndims()], DType::F32)?;
            self.device.backend().write_values(&t.ptr()?, &values, DType::F32)?;
            device.push((t, shape));
        }
        let real = vec![vec![shape; microbatches]; self.modules.len()];
        Ok(Lengths { device, real })
    }
}

impl BucketSet {
    /// The buckets of a capture, `done` largest first: every draft made a surface (with
    /// clobber lists across the buckets), the largest bucket's surfaces returned as the
    /// active ones, the others parked.
    pub(super) fn new(
        captured: BucketsCaptured,
        done: Vec<(Vec<Vec<Draft>>, Lengths)>,
        chunks: usize,
        pool: usize,
    ) -> (Vec<Vec<Surface>>, BucketSet) {
        let BucketsCaptured { spec, inputs, reports } = captured;
        let (drafts, mut lengths): (Vec<_>, Vec<_>) = done.into_iter().rev().unzip();
        let mut surfaces = super::clobbers::finish(drafts, pool);
        let tables = (0..spec.ndims())
            .map(|d| {
                let sizes = spec.dim(d).1;
                let largest = sizes.last().copied().unwrap_or(0);
                (0..=largest).map(|size| sizes.iter().position(|s| *s >= size).unwrap_or(0) as u32).collect()
            })
            .collect();
        let outputs = bucketed_outputs(&spec, &surfaces, chunks);
        let (active, active_lengths) = (surfaces.pop().unwrap_or_default(), lengths.pop().unwrap_or_default());
        let mut parked: Vec<Option<BucketState>> = surfaces
            .into_iter()
            .zip(lengths)
            .map(|(surfaces, lengths)| {
                let cursor = Cursor::new(chunks);
                Some(BucketState { surfaces, cursor, fused: None, staging: None, lengths })
            })
            .collect();
        parked.push(None);
        let set = BucketSet {
            active: parked.len() - 1,
            spec,
            tables,
            parked,
            reports,
            inputs,
            outputs,
            lengths: active_lengths,
        };
        (active, set)
    }
}

/// Along which axes each output follows the buckets: those where its size is the bucket's
/// in every bucket (`surfaces` per bucket index).
fn bucketed_outputs(spec: &Buckets, surfaces: &[Vec<Vec<Surface>>], chunks: usize) -> Vec<Vec<Along>> {
    let first = |c: usize| surfaces.iter().find_map(|b| b.get(c)?.first());
    (0..chunks)
        .map(|c| {
            let width = first(c).map_or(0, |s| s.outputs.len());
            (0..width)
                .map(|i| {
                    let mut along = [false; MAX_AXES];
                    for (d, flag) in along.iter_mut().enumerate().take(spec.ndims()) {
                        let (axis, _) = spec.dim(d);
                        *flag = surfaces.iter().enumerate().all(|(index, bucket)| {
                            bucket
                                .get(c)
                                .and_then(|row| row.first()?.outputs.get(i)?.as_ref())
                                .is_some_and(|t| t.dims().get(axis) == Some(&spec.shape(index)[d]))
                        });
                    }
                    along
                })
                .collect()
        })
        .collect()
}

impl GraphedModules {
    /// Exchanges the active bucket's state with `state`.
    fn swap_bucket(&mut self, state: &mut BucketState) {
        std::mem::swap(&mut self.surfaces, &mut state.surfaces);
        std::mem::swap(&mut self.cursor, &mut state.cursor);
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

    /// Where a call of `chunk` on `inputs` goes: its bucket from the bucketed inputs' sizes.
    pub(super) fn route(&self, chunk: usize, inputs: &[Option<Tensor>]) -> Result<Route> {
        let Some(set) = &self.buckets else { return Ok(Route::Plain) };
        let spec = &set.spec;
        let flags = set.inputs.get(chunk).map_or(&[][..], Vec::as_slice);
        let active = spec.shape(set.active);
        // Along each axis: the size the bucketed inputs agree on (the active bucket's where no
        // input given has one; an arity or presence error follows).
        let mut len = active;
        for (d, slot) in len.iter_mut().enumerate().take(spec.ndims()) {
            let (axis, _) = spec.dim(d);
            let mut sizes = inputs
                .iter()
                .zip(flags)
                .filter(|(_, along)| along[d])
                .filter_map(|(x, _)| x.as_ref()?.dims().get(axis).copied());
            // No allocation on the replay path unless the sizes disagree.
            if let Some(n) = sizes.next() {
                if sizes.any(|s| s != n) {
                    let sizes = inputs
                        .iter()
                        .zip(flags)
                        .filter(|(_, along)| along[d])
                        .filter_map(|(x, _)| x.as_ref()?.dims().get(axis).copied())
                        .collect();
                    return Err(BucketError::Lengths { module: self.modules[chunk].name().into(), axis, sizes }.into());
                }
                *slot = n;
            }
        }
        // A forward that continues an iteration (a later chunk, or a later microbatch of the
        // first) stays in the iteration's bucket where it fits: moving would abandon it.
        let continuing = chunk > 0 || self.cursor.next_forward(chunk) > 0;
        if continuing && (0..spec.ndims()).all(|d| len[d] <= active[d]) {
            return Ok(Route::Bucket { index: set.active, len });
        }
        let mut at = [0; MAX_AXES];
        let mut fits = true;
        for (d, table) in set.tables.iter().enumerate() {
            match table.get(len[d]) {
                Some(&i) => at[d] = i as usize,
                None => fits = false,
            }
        }
        match fits.then_some(at) {
            Some(at) => Ok(Route::Bucket { index: spec.index(&at[..spec.ndims()]), len }),
            None if spec.above() == AboveLargest::Eager => Ok(Route::Eager { len }),
            None => {
                let largest = spec.largest();
                let d = (0..spec.ndims()).find(|&d| len[d] > largest[d]).unwrap_or(0);
                Err(BucketError::AboveLargest { size: len[d], largest: largest[d] }.into())
            }
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
                        state.cursor.reset();
                    }
                }
                Ok(v)
            }
        }
    }

    /// The copies that bring `given` into slots `at.from..` of `captured` (a surface's
    /// static buffers, or a fused step's bound ones) for a call of real sizes `at.len`
    /// (`None`: no buckets, shapes exact). A bucketed slot accepts a tensor of its static
    /// shape with the call's sizes along the bucketed axes (padded up), or the static buffer
    /// itself.
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
            let along = set.and_then(|set| {
                let flags = if kind == SlotKind::Input { &set.inputs } else { &set.outputs };
                flags.get(chunk)?.get(index).copied()
            });
            let whole = |copies: &mut Vec<CopyIn>| -> Result<()> {
                if let Some((x, st)) = super::replay::check_slot(module, slot, x, st, requires_grad)? {
                    copies.push(CopyIn::Whole { dst: st.refreshed(), src: x.clone() });
                }
                Ok(())
            };
            let (Some(set), Some(len), Some(along), Some(xt), Some(stt)) = (set, len, along, x, st) else {
                whole(&mut copies)?;
                continue;
            };
            let expected = resized_dims(stt.dims(), &set.spec, &along, &len);
            if !any(&along) || expected == stt.dims() || (xt.same_buffer(stt) && xt.dims() == stt.dims()) {
                whole(&mut copies)?;
                continue;
            }
            let view = Some(stt.prefix_view(&expected)?);
            super::replay::check_slot(module, slot, x, &view, requires_grad)?;
            let layout = layout(stt.dims(), &expected)?;
            let value = if kind == SlotKind::Input { set.spec.pad_value(index) } else { 0.0 };
            copies.push(CopyIn::Pad { dst: stt.refreshed(), src: xt.clone(), layout, value });
        }
        Ok(copies)
    }

    /// Before replaying (chunk, microbatch) for a call of real sizes `len`: the microbatch's
    /// device lengths updated if they changed (a few bytes copied on the stream), the sizes
    /// recorded for its backward.
    pub(super) fn set_length(&mut self, chunk: usize, m: usize, len: Option<Lens>) -> Result<()> {
        let Some(len) = len else { return Ok(()) };
        let Some(set) = self.buckets.as_deref_mut() else { return Ok(()) };
        let ndims = set.spec.ndims();
        if let Some((t, written)) = set.lengths.device.get_mut(m) {
            if *written != len {
                let values: Vec<f32> = len[..ndims].iter().map(|&n| n as f32).collect();
                t.device().backend().write_values(&t.ptr()?, &values, DType::F32)?;
                *written = len;
            }
        }
        if let Some(r) = set.lengths.real.get_mut(chunk).and_then(|row| row.get_mut(m)) {
            *r = len;
        }
        Ok(())
    }

    /// The real sizes of the microbatch in flight at (chunk, microbatch), with buckets.
    pub(super) fn real_length(&self, chunk: usize, m: usize) -> Option<Lens> {
        self.buckets.as_ref()?.lengths.real.get(chunk)?.get(m).copied()
    }

    /// `slots` handed back for a call of real sizes `len`: the bucketed ones trimmed. `kind`
    /// says which slots they correspond to: `Input` for grad inputs, `GradOutput` for outputs.
    pub(super) fn trim(
        &self,
        chunk: usize,
        kind: SlotKind,
        slots: Vec<Option<Tensor>>,
        len: Option<Lens>,
    ) -> Result<Vec<Option<Tensor>>> {
        let (Some(len), Some(set)) = (len, &self.buckets) else { return Ok(slots) };
        let flags = match kind {
            SlotKind::Input => set.inputs.get(chunk),
            SlotKind::GradOutput => set.outputs.get(chunk),
        };
        slots
            .into_iter()
            .enumerate()
            .map(|(i, t)| match (t, flags.and_then(|f| f.get(i))) {
                (Some(t), Some(along)) if any(along) => {
                    Ok(Some(trimmed(&t, &resized_dims(t.dims(), &set.spec, along, &len))?))
                }
                (t, _) => Ok(t),
            })
            .collect()
    }

    /// A fresh length tensor for an eager call of sizes `len` (above the largest bucket).
    pub(super) fn eager_length(&self, len: Lens) -> Result<Tensor> {
        let ndims = self.buckets.as_ref().map_or(1, |s| s.spec.ndims());
        let values: Vec<f32> = len[..ndims].iter().map(|&n| n as f32).collect();
        Tensor::from_slice(&self.device, &values, &[ndims])
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

    /// The number of buckets, with shape buckets.
    pub(super) fn bucket_count(&self) -> Option<usize> {
        self.buckets.as_ref().map(|s| s.spec.count())
    }

    /// The index of the active bucket, with shape buckets.
    pub(super) fn active_bucket_index(&self) -> Option<usize> {
        self.buckets.as_ref().map(|s| s.active)
    }

    /// With shape buckets: the size along the first declared axis of the bucket whose graphs
    /// replay next.
    pub fn active_bucket(&self) -> Option<usize> {
        self.buckets.as_ref().map(|s| s.spec.shape(s.active)[0])
    }

    /// With shape buckets: the sizes along every declared axis of the bucket whose graphs
    /// replay next.
    pub fn active_bucket_shape(&self) -> Option<Vec<usize>> {
        self.buckets.as_ref().map(|s| s.spec.shape(s.active)[..s.spec.ndims()].to_vec())
    }
}
