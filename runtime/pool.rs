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
//!
//! Lending memory between captures has a second consequence: a buffer a later capture hands
//! out (an output) can lie where an earlier graph keeps a temporary, and then each replay of
//! the earlier graph overwrites it. The pool remembers what each graph's capture allocated
//! (the memory its replays write) and the buffers each capture made; when a capture ends, its
//! buffers that lie in memory an earlier graph of another capture set writes are registered
//! with that graph, whose replays make every handle to them stale, and with their own graph,
//! whose replays write them again (see [`Resident`]).
//!
//! Best fit alone fragments a pool that lends a large transient (an attention backward's
//! workspace) from one capture to the next: a small block made after the transient is freed
//! (the layer's input grad, live into the next layer's backward) finds no other room and is
//! carved out of the transient's range, so the next layer's transient no longer fits and the
//! pool grows by a second one. So the pool keeps room for the largest block it has taken back
//! ([`PoolState::keep_room`]): a request of at most half that size that would split the last
//! free range holding it grows the pool by its own size instead, where growing is possible.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};

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
    /// The graphs in capture order (groups are consecutive runs).
    captured: Vec<Captured>,
    /// Index into `captured` of the graph expected next.
    next: usize,
    /// Bumped whenever `captured` changes, so an old ticket cannot move `next`.
    serial: u64,
    /// The group graphs captured from now on join ([`GraphPool::begin_replay_group`]).
    group: u64,
    /// Per graph of `captured` (same index): the buffers its replays overwrite or write
    /// again, for a replay to read without allocating. `None` while no graph has any (no
    /// capture left a buffer in memory another capture set's graph writes), so a replay then
    /// costs nothing more than the order's check.
    residents: Option<Arc<[Residents]>>,
}

/// A graph in a pool's capture order.
struct Captured {
    id: u64,
    label: String,
    /// Its replay group ([`GraphPool::begin_replay_group`]).
    group: u64,
    /// Its capture set (see [`GraphPool::register_capture`]).
    set: u64,
    /// The memory its capture allocated, which each replay writes.
    writes: Vec<MemRange>,
    residents: Residents,
}

/// The buffers one graph's replay makes stale or valid again.
#[derive(Clone, Default)]
struct Residents {
    /// Buffers of later captures (of other sets) that lie in memory this graph writes: each
    /// replay overwrites them, so every handle to them goes stale.
    overwrites: Vec<Weak<dyn Resident>>,
    /// Buffers this graph's capture made in memory that graphs of other sets write: each
    /// replay writes them again, so handles to them are valid again.
    rewrites: Vec<Weak<dyn Resident>>,
}

impl Residents {
    fn is_empty(&self) -> bool {
        self.overwrites.is_empty() && self.rewrites.is_empty()
    }

    /// After the graph's replay. Never called with the pool's lock held: upgrading makes a
    /// strong handle, whose drop may free the buffer, which returns its block to the pool.
    fn replayed(&self) {
        for b in self.overwrites.iter().filter_map(Weak::upgrade) {
            b.overwritten();
        }
        for b in self.rewrites.iter().filter_map(Weak::upgrade) {
            b.rewritten();
        }
    }

    /// Forgets buffers that no longer exist.
    fn prune(&mut self) {
        self.overwrites.retain(|b| b.strong_count() > 0);
        self.rewrites.retain(|b| b.strong_count() > 0);
    }
}

/// A buffer made on pool memory (a tensor's), whose handles the pool makes stale when a graph
/// of another capture overwrites that memory, and valid again when the graph whose capture
/// made it writes it again (see [`GraphPool::register_capture`]).
pub(crate) trait Resident: Send + Sync {
    /// A replay overwrote the memory: every handle to the buffer is stale.
    fn overwritten(&self);
    /// The graph that made the buffer wrote it again: handles are valid again, unless a
    /// replay of their own made them stale meanwhile.
    fn rewritten(&self);
}

impl ReplayOrder {
    /// The indices `[start, end)` of the group holding index `i`.
    fn group_of(&self, i: usize) -> (usize, usize) {
        let g = self.captured[i].group;
        let start = self.captured[..i].iter().rposition(|x| x.group != g).map_or(0, |p| p + 1);
        let end = self.captured[i..].iter().position(|x| x.group != g).map_or(self.captured.len(), |p| i + p);
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
        i == 0 || self.captured[i - 1].group != self.captured[i].group
    }

    /// The index of graph `id`, expected at `at`.
    fn index_of(&self, id: u64, at: usize) -> Option<usize> {
        match self.captured.get(at) {
            Some(c) if c.id == id => Some(at),
            _ => self.captured.iter().position(|c| c.id == id),
        }
    }

    /// After `captured` changed: the cycle starts over, old tickets no longer move it, and
    /// the per-index view of the residents is rebuilt (without the buffers gone since).
    fn changed(&mut self) {
        self.next = 0;
        self.serial += 1;
        self.captured.iter_mut().for_each(|c| c.residents.prune());
        let any = self.captured.iter().any(|c| !c.residents.is_empty());
        self.residents = any.then(|| self.captured.iter().map(|c| c.residents.clone()).collect());
    }

    /// The residents of the graphs from `id` (expected at index `at`) to index `last`, for a
    /// replay that ran them, to apply once the lock is released.
    fn residents_of(&self, id: u64, at: usize, last: Option<usize>) -> Option<(Arc<[Residents]>, usize, usize)> {
        let all = self.residents.as_ref()?;
        let first = self.index_of(id, at)?;
        Some((all.clone(), first, last.unwrap_or(first)))
    }
}

struct PoolState {
    slabs: Vec<Slab>,
    stats: PoolStats,
    order: ReplayOrder,
    /// While a capture is in progress: what it allocates.
    tracking: Option<Tracked>,
    /// Every range some capture wrote (the union of what tracking returned): bound static
    /// buffers are placed outside it, so no graph's replay can overwrite them.
    written: Vec<MemRange>,
    /// The largest block freed so far, the pool keeps a free range for (see the module's
    /// docs): a request of at most half of it that would split the last free range of at
    /// least this size grows the pool instead. `None` once growing for that was refused (the
    /// limit, the device's memory): the pool then splits as best fit says.
    keep_room: Option<usize>,
    /// Whether the last [`Error::PoolGrowthDuringCapture`] was for keeping room (the request
    /// fitted): if growing then fails, the retried capture splits instead.
    refused_for_room: bool,
}

/// What a capture allocated ([`GraphPool::begin_tracking`]).
#[derive(Default)]
pub(crate) struct Tracked {
    /// Every block: the memory the captured graph writes on each replay, whether freed during
    /// the capture (temporaries) or later (saved activations released once the backward is
    /// captured).
    writes: Vec<MemRange>,
    /// The buffers made on those blocks, some of which outlive the capture (its outputs).
    made: Vec<(MemRange, Weak<dyn Resident>)>,
    /// Whether the capture is retried after the pool grows ([`Graph::capture`]), so that a
    /// request that fits may still be refused to keep room ([`PoolState::keep_room`]).
    ///
    /// [`Graph::capture`]: crate::Graph::capture
    retried: bool,
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
/// Memory a capture allocated and freed (its temporaries) is lent to later captures, and its
/// graph writes it again on every replay. So graphs sharing a pool replay in capture order
/// ([`Error::ReplayOrder`] otherwise), and a buffer a later capture hands out (an output, an
/// input grad) may lie in memory an earlier graph writes. Then each replay of that earlier
/// graph overwrites it, and from then on every handle to it is stale
/// ([`Tensor::is_fresh`](crate::Tensor::is_fresh) is false, using it is
/// [`Error::StaleTensor`] with `overwritten_by_another_capture`), until the graph that made it
/// writes it again: a raw graph's handles are then valid again, a graphed module hands out
/// fresh ones as always. The graphs of one `make_graphed` call keep track of this among
/// themselves (a replay stales the handles it overwrites); the pool does it between captures:
/// separately graphed modules sharing it ([`GraphOptions::pool`](crate::GraphOptions::pool)),
/// raw graphs ([`Graph::with_pool`](crate::Graph::with_pool)), or both. Static inputs and grad
/// outputs of graphed modules are placed where no graph writes, so they are never overwritten.
///
/// ```
/// use graphed::{ops, CaptureMode, Device, Graph, Tensor};
/// let dev = Device::host();
/// let pool = dev.new_pool();
/// let x = Tensor::full(&dev, &[1024], 1.0)?;
/// let y = Tensor::zeros(&dev, &[1024])?;
/// let mut first = Graph::with_pool(&dev, &pool);
/// first.capture(CaptureMode::Global, || ops::axpy_(&y, 1.0, &ops::scale(&x, 2.0)?))?; // a temporary
/// let mut second = Graph::with_pool(&dev, &pool);
/// let out = second.capture(CaptureMode::Global, || ops::scale(&x, 3.0))?; // where it was
/// first.replay()?;
/// assert!(!out.is_fresh()); // the first graph's temporary overwrote it
/// assert!(out.to_vec().is_err());
/// second.replay()?;
/// assert_eq!(out.to_vec()?, vec![3.0; 1024]); // written again
/// # Ok::<(), graphed::Error>(())
/// ```
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
    /// Whether it was allocated during a capture (see [`Block::made`]).
    tracked: bool,
    pub(crate) ptr: Ptr,
}

impl Block {
    pub(crate) fn range(&self) -> MemRange {
        MemRange { slab: self.slab, offset: self.offset, bytes: self.bytes }
    }

    /// Records `buffer`, just made on this block, with the capture that allocated the block
    /// (nothing when no capture did).
    pub(crate) fn made(&self, buffer: impl FnOnce() -> Weak<dyn Resident>) {
        if !self.tracked {
            return;
        }
        let mut st = self.pool.state.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(t) = st.tracking.as_mut() {
            t.made.push((self.range(), buffer()));
        }
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
        if let Some(keep) = st.keep_room.as_mut() {
            *keep = (*keep).max(self.bytes);
        }
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
                keep_room: Some(0),
                refused_for_room: false,
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

    /// Whether the pool's memory is on `backend` (a device's: `pool.is_on(device.backend())`).
    pub(crate) fn is_on(&self, backend: &Arc<Backend>) -> bool {
        Arc::ptr_eq(&self.0.backend, backend)
    }

    /// A number that identifies the pool in messages.
    pub fn id(&self) -> usize {
        self.0.id
    }

    /// Allocates `bytes` (rounded up to 256). Grows the pool by a slab when nothing free fits,
    /// or when the block would split the last free range that holds the largest block freed
    /// so far and the request is at most half that (see the module's docs; if growing fails
    /// then, the range is split after all); growing is refused while a global or thread-local
    /// capture is in progress (a synchronous `cuMemAlloc` would invalidate it), with
    /// [`Error::PoolGrowthDuringCapture`], which keeping room only asks for in a capture that
    /// is retried after growing ([`Graph::capture`](crate::Graph::capture)).
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
        // Only this thread's capture matters: another thread's allocation waits at the gate
        // until that capture ends.
        let capturing = matches!(self.0.backend.capture_mode(), Some(CaptureMode::Global | CaptureMode::ThreadLocal));
        let (slab, offset) = match found {
            Some((slab, offset, len)) if !st.spares_room(bytes, len) => (slab, offset),
            Some((slab, offset, _)) => {
                // Splitting would take the room the largest block needs: grow instead, where
                // that can be done now or by the capture's retry.
                if capturing {
                    if st.tracking.as_ref().is_some_and(|t| t.retried) {
                        st.refused_for_room = true;
                        return Err(Error::PoolGrowthDuringCapture { bytes });
                    }
                    (slab, offset)
                } else {
                    drop(st);
                    let grown = self.grow(bytes);
                    st = self.0.state.lock().unwrap_or_else(|e| e.into_inner());
                    match grown {
                        Ok(()) => (st.slabs.len() - 1, 0),
                        Err(_) => {
                            // No memory to keep room with: best fit, as if never asked.
                            st.keep_room = None;
                            let written: &[MemRange] = if untouched { &st.written } else { &[] };
                            match best_fit(&st.slabs, bytes, written) {
                                Some((slab, offset, _)) => (slab, offset),
                                None => {
                                    drop(st);
                                    self.grow(bytes)?;
                                    st = self.0.state.lock().unwrap_or_else(|e| e.into_inner());
                                    (st.slabs.len() - 1, 0)
                                }
                            }
                        }
                    }
                }
            }
            None => {
                if capturing {
                    st.refused_for_room = false;
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
        let tracked = match st.tracking.as_mut() {
            Some(t) => {
                t.writes.push(MemRange { slab, offset, bytes });
                true
            }
            None => false,
        };
        Ok(Block { pool: self.0.clone(), slab, offset, bytes, tracked, ptr })
    }

    /// Adds a free slab with room for a block of `bytes`.
    fn grow(&self, bytes: usize) -> Result<()> {
        self.grow_for(bytes, 0)
    }

    /// Before a capture is retried after [`Error::PoolGrowthDuringCapture`] for `bytes`:
    /// [`GraphPool::grow_for`] with `hint`. When the request was refused only to keep room
    /// for the largest block (it fitted) and growing fails, the pool stops keeping room and
    /// the retry splits the range as best fit says; otherwise the error is returned.
    pub(crate) fn grow_for_retry(&self, bytes: usize, hint: usize) -> Result<()> {
        let grown = self.grow_for(bytes, hint);
        let mut st = self.0.state.lock().unwrap_or_else(|e| e.into_inner());
        match grown {
            Err(_) if std::mem::take(&mut st.refused_for_room) => {
                st.keep_room = None;
                Ok(())
            }
            grown => {
                st.refused_for_room = false;
                grown
            }
        }
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
            st.order.captured.iter_mut().for_each(|c| c.writes.retain(|r| r.slab < slabs));
        }
        for slab in freed {
            self.0.backend.free_slab(&slab.mem, slab.bytes);
        }
    }

    /// Starts recording the blocks allocated from now on, and the buffers made on them (what
    /// a capture writes and makes); `retried` when the capture is run again after the pool
    /// grows ([`Error::PoolGrowthDuringCapture`]).
    pub(crate) fn begin_tracking(&self, retried: bool) {
        let mut st = self.0.state.lock().unwrap_or_else(|e| e.into_inner());
        st.tracking = Some(Tracked { retried, ..Tracked::default() });
    }

    /// Stops recording; what was allocated since `begin_tracking`. Static buffers placed from
    /// now on avoid that memory ([`GraphPool::alloc_untouched`]).
    pub(crate) fn end_tracking(&self) -> Tracked {
        let mut st = self.0.state.lock().unwrap_or_else(|e| e.into_inner());
        let tracked = st.tracking.take().unwrap_or_default();
        st.written.extend(tracked.writes.iter().copied());
        tracked
    }

    /// Records that graph `id` of capture set `set` was captured into this pool, after all
    /// earlier ones, having allocated `tracked`; returns the memory its replays write.
    ///
    /// A capture set is graphs that track among themselves which handed-out buffers their
    /// replays overwrite (the graphs of one `make_graphed` call, through their clobber
    /// lists); a raw graph is a set of its own. Between sets the pool does it: each buffer
    /// the capture made that is still alive (an output, which outlives the capture) and lies
    /// in memory an earlier graph of another set writes is registered with that graph, whose
    /// replays overwrite it (its handles go stale), and with this one, whose replays write it
    /// again (they are valid again). The other way round cannot happen: an earlier capture's
    /// live buffer was never free for this one to allocate.
    pub(crate) fn register_capture(&self, id: u64, label: &str, set: u64, tracked: Tracked) -> Vec<MemRange> {
        let Tracked { writes, made, .. } = tracked;
        let mut st = self.0.state.lock().unwrap_or_else(|e| e.into_inner());
        let order = &mut st.order;
        let mut rewrites = Vec::new();
        for (range, buffer) in made.into_iter().filter(|(_, b)| b.strong_count() > 0) {
            let mut lent = false;
            for earlier in order.captured.iter_mut().filter(|c| c.set != set) {
                if earlier.writes.iter().any(|w| w.overlaps(&range)) {
                    earlier.residents.overwrites.push(buffer.clone());
                    lent = true;
                }
            }
            if lent {
                rewrites.push(buffer);
            }
        }
        let (label, group, residents) =
            (label.to_string(), order.group, Residents { overwrites: Vec::new(), rewrites });
        order.captured.push(Captured { id, label, group, set, writes: writes.clone(), residents });
        order.changed();
        writes
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
        // The room kept is for the largest block of the group's own captures (another shape
        // bucket's may never be asked for again).
        if let Some(keep) = st.keep_room.as_mut() {
            *keep = 0;
        }
    }

    /// Forgets graph `id` (it was reset). Buffers it made that other graphs overwrite stay
    /// stale from then on: no replay writes them again.
    pub(crate) fn unregister_capture(&self, id: u64) {
        let mut st = self.0.state.lock().unwrap_or_else(|e| e.into_inner());
        st.order.captured.retain(|c| c.id != id);
        st.order.changed();
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
        let serial = order.serial;
        if n <= 1 {
            return Ok(ReplayTicket { id, at: 0, next: 0, restarted: false, serial });
        }
        let expected = order.next;
        if order.captured[expected].id == id {
            return Ok(ReplayTicket { id, at: expected, next: order.after(expected), restarted: false, serial });
        }
        let at = order.captured.iter().position(|c| c.id == id);
        if let Some(i) = at.filter(|i| order.starts_group(*i)) {
            let restarted = !order.starts_group(expected);
            return Ok(ReplayTicket { id, at: i, next: order.after(i), restarted, serial });
        }
        let got = at.map(|i| order.captured[i].label.clone()).unwrap_or_else(|| format!("graph #{id}"));
        let (start, end) = order.group_of(at.unwrap_or(expected));
        Err(Error::ReplayOrder {
            got,
            expected: order.captured[expected].label.clone(),
            order: order.captured[start..end].iter().map(|c| c.label.clone()).collect(),
        })
    }

    /// Advances the replay order as `ticket` says, once its graph has launched; returns
    /// whether the replay restarted the cycle in the middle. A ticket from before a capture
    /// or reset changed the order does not move it (the order restarted anyway). Handles to
    /// the buffers of other captures that the graph overwrites go stale, and to those of its
    /// own capture that it writes again are valid again; with none (no capture set lent
    /// memory to another), that costs one branch: no allocation, no scan.
    pub(crate) fn advance_replay(&self, ticket: ReplayTicket) -> bool {
        let residents = {
            let mut st = self.0.state.lock().unwrap_or_else(|e| e.into_inner());
            if st.order.serial == ticket.serial {
                st.order.next = ticket.next;
            }
            st.order.residents_of(ticket.id, ticket.at, None)
        };
        if let Some((residents, i, _)) = residents {
            residents[i].replayed();
        }
        ticket.restarted
    }
}

impl GraphPool {
    /// Whether `ids` are a run of this pool's capture order (consecutive, in order).
    pub(crate) fn is_capture_run(&self, ids: &[u64]) -> bool {
        let st = self.0.state.lock().unwrap_or_else(|e| e.into_inner());
        let captured: Vec<u64> = st.order.captured.iter().map(|c| c.id).collect();
        match ids.first().and_then(|first| captured.iter().position(|g| g == first)) {
            Some(start) => captured.get(start..start + ids.len()) == Some(ids),
            None => false,
        }
    }

    /// Whether some graph's replays make handles of another capture stale or valid again
    /// (otherwise a replay does nothing beyond the order's bookkeeping).
    #[cfg(test)]
    pub(crate) fn lends_between_captures(&self) -> bool {
        self.0.state.lock().unwrap_or_else(|e| e.into_inner()).order.residents.is_some()
    }

    /// After a fused launch that stood for a run of graphs from the ticket's to `last`: the
    /// order continues after `last`, and each graph of the run makes handles stale or valid
    /// again as its own replay would ([`GraphPool::advance_replay`]). Returns whether the run
    /// restarted the cycle (`ticket`).
    pub(crate) fn advance_replay_past(&self, ticket: ReplayTicket, last: u64) -> bool {
        let residents = {
            let mut st = self.0.state.lock().unwrap_or_else(|e| e.into_inner());
            let end = st.order.captured.iter().position(|c| c.id == last);
            if let Some(i) = end.filter(|_| st.order.serial == ticket.serial) {
                st.order.next = st.order.after(i);
            }
            end.and_then(|end| st.order.residents_of(ticket.id, ticket.at, Some(end)))
        };
        if let Some((residents, first, end)) = residents {
            residents.get(first..=end).into_iter().flatten().for_each(Residents::replayed);
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
    /// The graph, and its index in the capture order when the ticket was issued.
    id: u64,
    at: usize,
    next: usize,
    restarted: bool,
    serial: u64,
}

/// `bytes` (at least 1) rounded up to the block alignment; `None` when that overflows.
fn align(bytes: usize) -> Option<usize> {
    bytes.max(1).checked_next_multiple_of(ALIGN)
}

impl PoolState {
    /// Whether a block of `bytes` (aligned) carved out of a free range of `len` would leave
    /// no free range that holds the largest block freed so far, and is small enough (at most
    /// half of that block) that growing the pool by it is the better deal.
    fn spares_room(&self, bytes: usize, len: usize) -> bool {
        let Some(keep) = self.keep_room.filter(|&k| bytes <= k / 2) else {
            return false;
        };
        if len < keep || len - bytes >= keep {
            return false; // the range cannot hold it anyway, or still does after the split
        }
        // Another free range that holds it keeps the room.
        let holding = self.slabs.iter().flat_map(|s| s.free.values()).filter(|&&l| l >= keep).count();
        holding < 2
    }
}

/// The smallest free range of at least `bytes` that overlaps none of `avoid`: its slab, offset
/// and length.
fn best_fit(slabs: &[Slab], bytes: usize, avoid: &[MemRange]) -> Option<(usize, usize, usize)> {
    let mut best: Option<(usize, usize, usize)> = None;
    for (i, s) in slabs.iter().enumerate() {
        for (&off, &len) in &s.free {
            let range = MemRange { slab: i, offset: off, bytes: len };
            if len >= bytes && best.is_none_or(|(_, _, l)| len < l) && !avoid.iter().any(|w| w.overlaps(&range)) {
                best = Some((i, off, len));
            }
        }
    }
    best
}
