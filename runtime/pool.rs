//! `GraphPool`: a caching allocator over slabs, shared by the graphs of one `make_graphed` call.
//!
//! Slabs are allocated outside the stream order (`cuMemAlloc`) and carved into blocks; a freed
//! block goes back to its slab's free list and is handed to the next request that fits. During
//! a capture, blocks freed by an earlier capture are reused by later ones, exactly as PyTorch's
//! private graph pools do; that is only safe if replays follow capture order. Graphed modules
//! keep to their schedule's order (their replay cursor); the pool checks the capture order of
//! every graph it lends to (see [`GraphPool::check_replay`]), which is what orders raw graphs
//! and captures sharing one pool. Why slabs and not CUDA graph memory nodes is in
//! docs/DESIGN-DECISIONS.md.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use crate::backend::CaptureMode;
use crate::backend::{Backend, FaultPoint, HostPtr, Ptr};
use crate::{Error, Result};

/// Every block is a multiple of this many bytes (and so aligned to it).
const ALIGN: usize = 256;
/// The smallest slab the pool asks the driver for.
const MIN_SLAB: usize = 64 << 10;

static NEXT_POOL_ID: AtomicUsize = AtomicUsize::new(1);

/// Byte counts of a pool: what it holds now and at most, and its limit.
///
/// ```
/// use graphed::{Device, Tensor};
/// let dev = Device::host();
/// let pool = dev.new_pool().with_limit(1 << 20);
/// let t = dev.with_pool(&pool, || Tensor::zeros(&dev, &[1024]))?;
/// let s = pool.stats();
/// assert_eq!((s.in_use, s.limit), (4096, Some(1 << 20)));
/// drop(t);
/// assert_eq!((pool.stats().in_use, pool.stats().peak_in_use), (0, 4096));
/// # Ok::<(), graphed::Error>(())
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PoolStats {
    /// Bytes obtained from the driver (the sum of the slabs).
    pub reserved: usize,
    /// Bytes in blocks handed out and not yet freed.
    pub in_use: usize,
    /// The most bytes in use at once since the pool was made.
    pub peak_in_use: usize,
    /// The most bytes reserved at once since the pool was made.
    pub peak_reserved: usize,
    /// Number of slabs.
    pub slabs: usize,
    /// The most bytes the pool may reserve ([`GraphPool::with_limit`]), if limited.
    pub limit: Option<usize>,
}

struct Slab {
    mem: Ptr,
    bytes: usize,
    /// Free ranges: offset -> length, coalesced.
    free: BTreeMap<usize, usize>,
}

/// The order replays must follow: the captured graphs in capture order, split into groups
/// that are alternatives of each other (the shape buckets of one capture). Replays go around
/// their group as a cycle; starting a group over, or starting another group, is always
/// allowed at the group's first graph.
#[derive(Default)]
struct ReplayOrder {
    /// Graph ids, labels and groups in capture order (groups are consecutive runs).
    captured: Vec<(u64, String, u64)>,
    /// Index into `captured` of the graph expected next.
    next: usize,
    /// Bumped whenever `captured` changes, so an old ticket cannot move `next`.
    serial: u64,
    /// The group graphs captured from now on join ([`GraphPool::begin_replay_group`]).
    group: u64,
}

impl ReplayOrder {
    /// The indices `[start, end)` of the group holding index `i`.
    fn group_of(&self, i: usize) -> (usize, usize) {
        let g = self.captured[i].2;
        let start = self.captured[..i].iter().rposition(|x| x.2 != g).map_or(0, |p| p + 1);
        let end = self.captured[i..].iter().position(|x| x.2 != g).map_or(self.captured.len(), |p| i + p);
        (start, end)
    }

    /// The index after `i` going around `i`'s group.
    fn after(&self, i: usize) -> usize {
        let (start, end) = self.group_of(i);
        if i + 1 < end {
            i + 1
        } else {
            start
        }
    }

    /// Whether index `i` is the first graph of its group.
    fn starts_group(&self, i: usize) -> bool {
        i == 0 || self.captured[i - 1].2 != self.captured[i].2
    }
}

struct PoolState {
    slabs: Vec<Slab>,
    stats: PoolStats,
    order: ReplayOrder,
    /// While tracking (a capture): the ranges of every block allocated, which the captured
    /// graph writes on each replay, whether freed during the capture (temporaries) or later
    /// (saved activations released once the backward is captured).
    tracking: Option<Vec<MemRange>>,
    /// Every range some capture wrote (the union of what tracking returned): bound static
    /// buffers are placed outside it, so no graph's replay can overwrite them.
    written: Vec<MemRange>,
}

/// A range of pool memory: (slab, offset, bytes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct MemRange {
    pub(crate) slab: usize,
    pub(crate) offset: usize,
    pub(crate) bytes: usize,
}

impl MemRange {
    pub(crate) fn overlaps(&self, other: &MemRange) -> bool {
        self.slab == other.slab && self.offset < other.offset + other.bytes && other.offset < self.offset + self.bytes
    }
}

pub(crate) struct PoolInner {
    id: usize,
    backend: Arc<Backend>,
    state: Mutex<PoolState>,
}

impl Drop for PoolInner {
    fn drop(&mut self) {
        let state = self.state.get_mut().unwrap_or_else(|e| e.into_inner());
        for slab in &state.slabs {
            self.backend.free_slab(&slab.mem, slab.bytes);
        }
    }
}

/// A memory pool that several graphs share. Cloning gives another handle to the same pool.
///
/// ```
/// use graphed::{Device, Tensor};
/// let dev = Device::host();
/// let pool = dev.new_pool();
/// let t = dev.with_pool(&pool, || Tensor::zeros(&dev, &[1024]))?;
/// assert!(pool.stats().in_use >= 4096);
/// drop(t);
/// assert_eq!(pool.stats().in_use, 0);
/// # Ok::<(), graphed::Error>(())
/// ```
#[derive(Clone)]
pub struct GraphPool(pub(crate) Arc<PoolInner>);

impl std::fmt::Debug for GraphPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "GraphPool#{}({:?})", self.0.id, self.stats())
    }
}

impl PartialEq for GraphPool {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

/// A block handed out by a pool; returns to the pool when dropped.
pub(crate) struct Block {
    pool: Arc<PoolInner>,
    slab: usize,
    offset: usize,
    bytes: usize,
    pub(crate) ptr: Ptr,
}

impl Block {
    pub(crate) fn range(&self) -> MemRange {
        MemRange { slab: self.slab, offset: self.offset, bytes: self.bytes }
    }

    pub(crate) fn pool_id(&self) -> usize {
        self.pool.id
    }
}

impl std::fmt::Debug for Block {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Block(pool {}, slab {}, +{}, {} B)", self.pool.id, self.slab, self.offset, self.bytes)
    }
}

impl Drop for Block {
    fn drop(&mut self) {
        let mut st = self.pool.state.lock().unwrap_or_else(|e| e.into_inner());
        st.stats.in_use -= self.bytes;
        let free = &mut st.slabs[self.slab].free;
        let (mut off, mut len) = (self.offset, self.bytes);
        // Coalesce with the following and the preceding free range.
        if let Some(next_len) = free.remove(&(off + len)) {
            len += next_len;
        }
        if let Some((&prev_off, &prev_len)) = free.range(..off).next_back() {
            if prev_off + prev_len == off {
                free.remove(&prev_off);
                off = prev_off;
                len += prev_len;
            }
        }
        free.insert(off, len);
    }
}

impl GraphPool {
    pub(crate) fn new(backend: Arc<Backend>) -> GraphPool {
        GraphPool(Arc::new(PoolInner {
            id: NEXT_POOL_ID.fetch_add(1, Ordering::Relaxed),
            backend,
            state: Mutex::new(PoolState {
                slabs: Vec::new(),
                stats: PoolStats::default(),
                order: ReplayOrder::default(),
                tracking: None,
                written: Vec::new(),
            }),
        }))
    }

    /// The pool's byte counts.
    pub fn stats(&self) -> PoolStats {
        self.0.state.lock().unwrap_or_else(|e| e.into_inner()).stats
    }

    /// Caps the bytes this pool may reserve from the device: a request that would make it
    /// grow past `bytes` fails with [`Error::PoolLimit`] (nothing allocated, nothing changed)
    /// instead of taking memory that something else needs (a KV cache, a second model).
    /// Memory already reserved stays; the limit applies to growth from now on, for every
    /// handle to the pool.
    ///
    /// ```
    /// use graphed::{Device, Error, Tensor};
    /// let dev = Device::host();
    /// let pool = dev.new_pool().with_limit(256 << 10);
    /// let a = dev.with_pool(&pool, || Tensor::zeros(&dev, &[32 << 10]))?; // 128 KiB: fits
    /// let b = dev.with_pool(&pool, || Tensor::zeros(&dev, &[64 << 10])); // 256 KiB more: no
    /// assert!(matches!(b, Err(Error::PoolLimit { requested: 262144, limit: 262144, .. })));
    /// assert_eq!(pool.stats().in_use, 128 << 10); // the refused request left nothing behind
    /// # drop(a);
    /// # Ok::<(), graphed::Error>(())
    /// ```
    pub fn with_limit(self, bytes: usize) -> GraphPool {
        self.set_limit(Some(bytes));
        self
    }

    /// Sets or lifts ([`None`]) the byte limit of [`GraphPool::with_limit`].
    ///
    /// ```
    /// let pool = graphed::Device::host().new_pool();
    /// pool.set_limit(Some(1 << 30));
    /// assert_eq!(pool.stats().limit, Some(1 << 30));
    /// pool.set_limit(None);
    /// assert_eq!(pool.stats().limit, None);
    /// ```
    pub fn set_limit(&self, limit: Option<usize>) {
        self.0.state.lock().unwrap_or_else(|e| e.into_inner()).stats.limit = limit;
    }

    /// Whether the pool's memory is on `device`.
    pub(crate) fn is_on(&self, device: &crate::Device) -> bool {
        Arc::ptr_eq(&self.0.backend, device.backend())
    }

    /// A number that identifies the pool in messages.
    pub fn id(&self) -> usize {
        self.0.id
    }

    /// Allocates `bytes` (rounded up to 256). Grows the pool by a slab when nothing free fits;
    /// growing is refused while a global or thread-local capture is in progress (a synchronous
    /// `cuMemAlloc` would invalidate it), with [`Error::PoolGrowthDuringCapture`].
    pub(crate) fn alloc(&self, bytes: usize) -> Result<Block> {
        self.alloc_where(bytes, false)
    }

    /// Allocates `bytes` in memory no capture of this pool has written, so no graph's replay
    /// can overwrite it: for static surfaces the caller fills before a fused step (a shared
    /// pool lends earlier graphs' temporaries to later allocations).
    pub(crate) fn alloc_untouched(&self, bytes: usize) -> Result<Block> {
        self.alloc_where(bytes, true)
    }

    fn alloc_where(&self, bytes: usize, untouched: bool) -> Result<Block> {
        if self.0.backend.faults.fires(FaultPoint::Alloc) {
            return Err(self.0.backend.out_of_memory(bytes));
        }
        let bytes = align(bytes).ok_or_else(|| self.0.backend.out_of_memory(bytes))?;
        let mut st = self.0.state.lock().unwrap_or_else(|e| e.into_inner());
        let written: &[MemRange] = if untouched { &st.written } else { &[] };
        let found = best_fit(&st.slabs, bytes, written);
        let (slab, offset) = match found {
            Some(hit) => hit,
            None => {
                // Only this thread's capture matters: another thread's allocation waits at the
                // gate until that capture ends.
                if matches!(self.0.backend.capture_mode(), Some(CaptureMode::Global | CaptureMode::ThreadLocal)) {
                    return Err(Error::PoolGrowthDuringCapture { bytes });
                }
                drop(st);
                self.grow(bytes)?;
                st = self.0.state.lock().unwrap_or_else(|e| e.into_inner());
                (st.slabs.len() - 1, 0)
            }
        };
        let s = &mut st.slabs[slab];
        let len = s.free.remove(&offset).unwrap_or(bytes);
        if len > bytes {
            s.free.insert(offset + bytes, len - bytes);
        }
        let ptr = match &s.mem {
            Ptr::Host(h) => {
                Ptr::Host(HostPtr { slab: h.slab.clone(), offset, len: bytes / 4, dtype: crate::DType::F32 })
            }
            Ptr::Cuda(base) => Ptr::Cuda(base + offset as u64),
        };
        st.stats.in_use += bytes;
        st.stats.peak_in_use = st.stats.peak_in_use.max(st.stats.in_use);
        if let Some(ranges) = st.tracking.as_mut() {
            ranges.push(MemRange { slab, offset, bytes });
        }
        Ok(Block { pool: self.0.clone(), slab, offset, bytes, ptr })
    }

    /// Adds a free slab with room for a block of `bytes`.
    fn grow(&self, bytes: usize) -> Result<()> {
        self.grow_for(bytes, 0)
    }

    /// Adds a free slab with room for a block of `bytes`, of at least `hint` bytes where the
    /// limit leaves room for that (used before a capture is retried after
    /// [`Error::PoolGrowthDuringCapture`]; the retry then finds room one allocation further).
    /// Past the pool's limit, [`Error::PoolLimit`]; without device memory,
    /// [`Error::OutOfMemory`]; either way the pool is unchanged.
    pub(crate) fn grow_for(&self, bytes: usize, hint: usize) -> Result<()> {
        let need = align(bytes).ok_or_else(|| self.0.backend.out_of_memory(bytes))?;
        let mut slab_bytes = need.max(MIN_SLAB).max(align(hint).unwrap_or(need));
        {
            // Reserve the bytes under the lock, so that two threads cannot both pass the limit.
            let mut st = self.0.state.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(limit) = st.stats.limit {
                let room = limit.saturating_sub(st.stats.reserved) / ALIGN * ALIGN;
                if need > room {
                    let (reserved, in_use) = (st.stats.reserved, st.stats.in_use);
                    return Err(Error::PoolLimit { pool: self.0.id, requested: need, limit, reserved, in_use });
                }
                slab_bytes = slab_bytes.min(room);
            }
            st.stats.reserved += slab_bytes;
        }
        let mem = self.0.backend.alloc_slab(slab_bytes);
        let mut st = self.0.state.lock().unwrap_or_else(|e| e.into_inner());
        let mem = match mem {
            Ok(mem) => mem,
            Err(e) => {
                st.stats.reserved -= slab_bytes;
                return Err(e);
            }
        };
        let mut free = BTreeMap::new();
        free.insert(0, slab_bytes);
        st.slabs.push(Slab { mem, bytes: slab_bytes, free });
        st.stats.peak_reserved = st.stats.peak_reserved.max(st.stats.reserved);
        st.stats.slabs += 1;
        Ok(())
    }

    /// Where the pool stands now, so that a call that fails can give back the slabs it grew
    /// ([`GraphPool::release_since`]).
    pub(crate) fn mark(&self) -> PoolMark {
        PoolMark(self.0.state.lock().unwrap_or_else(|e| e.into_inner()).slabs.len())
    }

    /// Frees the slabs added since `mark` that hold no block, last first (stopping at one
    /// that still holds a block, so slab indices stay valid): after a failed call, the pool
    /// holds the bytes it held before.
    pub(crate) fn release_since(&self, mark: PoolMark) {
        let mut freed = Vec::new();
        {
            let mut st = self.0.state.lock().unwrap_or_else(|e| e.into_inner());
            while st.slabs.len() > mark.0 {
                let last = st.slabs.last().expect("more slabs than the mark");
                if last.free.get(&0) != Some(&last.bytes) {
                    break;
                }
                let slab = st.slabs.pop().expect("checked above");
                st.stats.reserved -= slab.bytes;
                st.stats.slabs -= 1;
                freed.push(slab);
            }
            let slabs = st.slabs.len();
            st.written.retain(|r| r.slab < slabs);
        }
        for slab in freed {
            self.0.backend.free_slab(&slab.mem, slab.bytes);
        }
    }

    /// Starts recording the blocks allocated from now on (the memory a capture writes).
    pub(crate) fn begin_tracking(&self) {
        let mut st = self.0.state.lock().unwrap_or_else(|e| e.into_inner());
        st.tracking = Some(Vec::new());
    }

    /// Stops recording; the ranges of every block allocated since `begin_tracking`.
    pub(crate) fn end_tracking(&self) -> Vec<MemRange> {
        let mut st = self.0.state.lock().unwrap_or_else(|e| e.into_inner());
        let ranges = st.tracking.take().unwrap_or_default();
        st.written.extend(ranges.iter().copied());
        ranges
    }

    /// Records that graph `id` was captured into this pool, after all earlier ones.
    pub(crate) fn register_capture(&self, id: u64, label: &str) {
        let mut st = self.0.state.lock().unwrap_or_else(|e| e.into_inner());
        let group = st.order.group;
        st.order.captured.push((id, label.to_string(), group));
        st.order.next = 0;
        st.order.serial += 1;
    }

    /// Graphs captured into this pool from now on form a new replay group: an alternative to
    /// the graphs captured before (another shape bucket of the same modules), whose replays may
    /// start at its first graph whenever the previous group is between iterations.
    ///
    /// A graph that is a group by itself replays at any time, before or after any other graph
    /// of the pool. That is right only when nothing it leaves in the pool is read by another
    /// graph: its results go to buffers allocated outside the pool (a decoder's KV cache and
    /// token record, say), and what it allocated during its capture is dead once it ends,
    /// which the pool then lends to the next capture. Graphs that hand results to each other
    /// through pool memory (a forward and its backward) belong in one group, where the pool
    /// enforces their capture order.
    ///
    /// ```
    /// use graphed::{ops, CaptureMode, Device, Graph, Tensor};
    /// let dev = Device::host();
    /// let pool = dev.new_pool();
    /// let (x, y) = (Tensor::full(&dev, &[2], 1.0)?, Tensor::zeros(&dev, &[2])?);
    /// let mut graphs = Vec::new();
    /// for a in [1.0, 10.0] {
    ///     pool.begin_replay_group(); // each graph alone: any replay order
    ///     let mut g = Graph::with_pool(&dev, &pool);
    ///     g.capture(CaptureMode::Global, || ops::axpy_(&y, a, &ops::scale(&x, 1.0)?))?;
    ///     graphs.push(g);
    /// }
    /// graphs[1].replay()?; // captured second, replayed first
    /// graphs[1].replay()?;
    /// graphs[0].replay()?;
    /// assert_eq!(y.to_vec()?, vec![21.0, 21.0]);
    /// # Ok::<(), graphed::Error>(())
    /// ```
    pub fn begin_replay_group(&self) {
        let mut st = self.0.state.lock().unwrap_or_else(|e| e.into_inner());
        st.order.group += 1;
    }

    /// Forgets graph `id` (it was reset).
    pub(crate) fn unregister_capture(&self, id: u64) {
        let mut st = self.0.state.lock().unwrap_or_else(|e| e.into_inner());
        st.order.captured.retain(|(g, _, _)| *g != id);
        st.order.next = 0;
        st.order.serial += 1;
    }

    /// Checks that replaying graph `id` now follows capture order, without changing anything:
    /// the returned ticket advances the order once the replay has launched
    /// ([`GraphPool::advance_replay`]).
    ///
    /// Replays must go around the capture order as a cycle (around their group's part of it,
    /// when the pool holds several replay groups). Starting at the first graph of a group is
    /// always allowed: when the expected graph was not the first of a group, an iteration was
    /// abandoned half-way (`restarted`), and the caller invalidates handles to its outputs.
    pub(crate) fn check_replay(&self, id: u64) -> Result<ReplayTicket> {
        let st = self.0.state.lock().unwrap_or_else(|e| e.into_inner());
        let order = &st.order;
        let n = order.captured.len();
        if n <= 1 {
            return Ok(ReplayTicket { next: 0, restarted: false, serial: order.serial });
        }
        let expected = order.next;
        if order.captured[expected].0 == id {
            return Ok(ReplayTicket { next: order.after(expected), restarted: false, serial: order.serial });
        }
        let at = order.captured.iter().position(|(g, _, _)| *g == id);
        if let Some(i) = at.filter(|i| order.starts_group(*i)) {
            let restarted = !order.starts_group(expected);
            return Ok(ReplayTicket { next: order.after(i), restarted, serial: order.serial });
        }
        let got = at.map(|i| order.captured[i].1.clone()).unwrap_or_else(|| format!("graph #{id}"));
        let (start, end) = order.group_of(at.unwrap_or(expected));
        Err(Error::ReplayOrder {
            got,
            expected: order.captured[expected].1.clone(),
            order: order.captured[start..end].iter().map(|(_, l, _)| l.as_str()).collect::<Vec<_>>().join(" -> "),
        })
    }

    /// Advances the replay order as `ticket` says; returns whether the replay restarted the
    /// cycle in the middle. A ticket from before a capture or reset changed the order is
    /// ignored (the order restarted anyway).
    pub(crate) fn advance_replay(&self, ticket: ReplayTicket) -> bool {
        let mut st = self.0.state.lock().unwrap_or_else(|e| e.into_inner());
        if st.order.serial == ticket.serial {
            st.order.next = ticket.next;
        }
        ticket.restarted
    }
}

impl GraphPool {
    /// Whether `ids` are a run of this pool's capture order (consecutive, in order).
    pub(crate) fn is_capture_run(&self, ids: &[u64]) -> bool {
        let st = self.0.state.lock().unwrap_or_else(|e| e.into_inner());
        let captured: Vec<u64> = st.order.captured.iter().map(|(g, _, _)| *g).collect();
        match ids.first().and_then(|first| captured.iter().position(|g| g == first)) {
            Some(start) => captured.get(start..start + ids.len()) == Some(ids),
            None => false,
        }
    }

    /// After a fused launch that stood for a run of graphs ending with `last`: the order
    /// continues after `last`. Returns whether the run restarted the cycle (`ticket`).
    pub(crate) fn advance_replay_past(&self, ticket: ReplayTicket, last: u64) -> bool {
        let mut st = self.0.state.lock().unwrap_or_else(|e| e.into_inner());
        if st.order.serial == ticket.serial {
            if let Some(i) = st.order.captured.iter().position(|(g, _, _)| *g == last) {
                st.order.next = st.order.after(i);
            }
        }
        ticket.restarted
    }
}

/// A pool's slab count at some point ([`GraphPool::mark`]).
#[derive(Clone, Copy, Debug)]
pub(crate) struct PoolMark(usize);

/// Permission to replay one graph now, from [`GraphPool::check_replay`].
#[derive(Clone, Copy, Debug)]
#[must_use]
pub(crate) struct ReplayTicket {
    next: usize,
    restarted: bool,
    serial: u64,
}

/// `bytes` (at least 1) rounded up to the block alignment; `None` when that overflows.
fn align(bytes: usize) -> Option<usize> {
    bytes.max(1).checked_next_multiple_of(ALIGN)
}

/// The smallest free range of at least `bytes` that overlaps none of `avoid`.
fn best_fit(slabs: &[Slab], bytes: usize, avoid: &[MemRange]) -> Option<(usize, usize)> {
    let mut best: Option<(usize, usize, usize)> = None;
    for (i, s) in slabs.iter().enumerate() {
        for (&off, &len) in &s.free {
            let range = MemRange { slab: i, offset: off, bytes: len };
            if len >= bytes && best.is_none_or(|(_, _, l)| len < l) && !avoid.iter().any(|w| w.overlaps(&range)) {
                best = Some((i, off, len));
            }
        }
    }
    best.map(|(i, off, _)| (i, off))
}
