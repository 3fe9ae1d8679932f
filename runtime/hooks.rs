//! Capture-time hooks registered at run time, for modules the caller does not own.

use std::sync::{Arc, Mutex};

use crate::{HookKind, Result};

type HookFn = Box<dyn FnMut() -> Result<()> + Send>;

struct Entry {
    id: u64,
    chunk: usize,
    kind: HookKind,
    prepend: bool,
    f: HookFn,
}

#[derive(Default)]
struct Inner {
    next_id: u64,
    entries: Vec<Entry>,
    /// Ids removed while their entries were taken out to run.
    removed: Vec<u64>,
}

/// Hooks registered at run time, shared between the caller and the graphed modules.
///
/// A hook runs at the same points as a `#[capture_time_hook]` of the module it is registered
/// for: in every warm-up iteration, once during capture (outside it) and on eager calls, never
/// on replay. Hooks of one kind run in registration order after the module's own; `prepend`
/// puts a hook before all others (the latest prepended first).
///
/// ```
/// use graphed::{HookKind, HookRegistry};
/// let hooks = HookRegistry::new();
/// let handle = hooks.register(0, HookKind::PreForward, false, || Ok(()));
/// assert_eq!(hooks.len(), 1);
/// handle.remove();
/// assert_eq!(hooks.len(), 0);
/// ```
#[derive(Clone, Default)]
pub struct HookRegistry(Arc<Mutex<Inner>>);

impl std::fmt::Debug for HookRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "HookRegistry({} hooks)", self.len())
    }
}

/// Removes its hook when [`HookHandle::remove`] is called (dropping it keeps the hook).
#[derive(Debug)]
#[must_use = "keep the handle to remove the hook later, or call `.remove()`"]
pub struct HookHandle {
    registry: HookRegistry,
    id: u64,
}

impl HookHandle {
    /// Unregisters the hook.
    pub fn remove(self) {
        let mut inner = self.registry.lock();
        let before = inner.entries.len();
        inner.entries.retain(|e| e.id != self.id);
        if inner.entries.len() == before {
            inner.removed.push(self.id);
        }
    }
}

impl HookRegistry {
    /// An empty registry.
    pub fn new() -> HookRegistry {
        HookRegistry::default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Registers `f` to run at `kind` for chunk (module) `chunk`.
    pub fn register(
        &self,
        chunk: usize,
        kind: HookKind,
        prepend: bool,
        f: impl FnMut() -> Result<()> + Send + 'static,
    ) -> HookHandle {
        let mut inner = self.lock();
        inner.next_id += 1;
        let id = inner.next_id;
        let entry = Entry { id, chunk, kind, prepend, f: Box::new(f) };
        if prepend {
            inner.entries.insert(0, entry);
        } else {
            inner.entries.push(entry);
        }
        HookHandle { registry: self.clone(), id }
    }

    /// Number of registered hooks.
    pub fn len(&self) -> usize {
        self.lock().entries.len()
    }

    /// Whether no hook is registered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Runs the hooks of `kind` for `chunk`: prepended ones, then `declared` (the module's
    /// own), then appended ones.
    pub(crate) fn run(&self, chunk: usize, kind: HookKind, declared: impl FnOnce() -> Result<()>) -> Result<()> {
        // The hooks run without the lock held, so a hook may register or remove hooks; those
        // changes take effect from the next run.
        let mut taken = std::mem::take(&mut self.lock().entries);
        let run = || -> Result<()> {
            for e in taken.iter_mut().filter(|e| e.prepend && e.chunk == chunk && e.kind == kind) {
                (e.f)()?;
            }
            declared()?;
            for e in taken.iter_mut().filter(|e| !e.prepend && e.chunk == chunk && e.kind == kind) {
                (e.f)()?;
            }
            Ok(())
        };
        let result = run();
        let mut inner = self.lock();
        let added = std::mem::take(&mut inner.entries);
        let removed = std::mem::take(&mut inner.removed);
        taken.retain(|e| !removed.contains(&e.id));
        let (front, back): (Vec<Entry>, Vec<Entry>) = added.into_iter().partition(|e| e.prepend);
        inner.entries = front.into_iter().chain(taken).chain(back).collect();
        result
    }
}
