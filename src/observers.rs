//! The observers a spool tells about states and notices, and the handle that takes one away.
//!
//! A screen that shows the delivery state comes and goes while the spool lives for the whole
//! app: if registering an observer were for ever, the spool would keep every screen (and, over
//! the FFI, every Kotlin or Swift object it references) alive. [`crate::EventSpool::add_observer`]
//! therefore returns an [`ObserverHandle`]; dropping it or calling [`ObserverHandle::remove`]
//! unregisters the observer and releases the spool's reference to it.
//!
//! Observers are called from a snapshot taken with no lock held (they may call any verb), so a
//! removal cannot wait for calls in flight: each entry carries a `removed` flag checked just
//! before every call, and no call begins once `remove` returned. A call already running on
//! another SDK thread may still finish; removal from inside a callback is safe (it only takes
//! the list's lock, which no caller of an observer holds).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};

use crate::state::{DeliveryObserver, DeliveryStatus, Notice};
use crate::sync::lock;

/// Every registered observer, in registration order.
pub(crate) struct Observers {
    entries: Mutex<Vec<Arc<Entry>>>,
    next_id: AtomicU64,
}

/// One registered observer. The spool's only strong reference to the app's observer is here
/// (and in a snapshot being told), so removing the entry lets the app's object go.
pub(crate) struct Entry {
    id: u64,
    removed: AtomicBool,
    observer: Arc<dyn DeliveryObserver>,
}

impl Observers {
    /// The list with the builder's observers, which stay for the spool's lifetime.
    pub(crate) fn new(initial: Vec<Arc<dyn DeliveryObserver>>) -> Arc<Observers> {
        let observers = Arc::new(Observers {
            entries: Mutex::new(Vec::new()),
            next_id: AtomicU64::new(0),
        });
        for observer in initial {
            observers.register(observer);
        }
        observers
    }

    fn register(&self, observer: Arc<dyn DeliveryObserver>) -> u64 {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        lock(&self.entries).push(Arc::new(Entry {
            id,
            removed: AtomicBool::new(false),
            observer,
        }));
        id
    }

    /// Registers `observer` until the handle is dropped or removed.
    pub(crate) fn add(self: &Arc<Self>, observer: Arc<dyn DeliveryObserver>) -> ObserverHandle {
        ObserverHandle {
            id: self.register(observer),
            observers: Arc::downgrade(self),
        }
    }

    fn remove(&self, id: u64) {
        let removed = {
            let mut entries = lock(&self.entries);
            entries
                .iter()
                .position(|e| e.id == id)
                .map(|at| entries.remove(at))
        };
        if let Some(entry) = removed {
            entry.removed.store(true, Ordering::SeqCst);
        }
        // `entry` is dropped here, outside the lock: dropping a foreign observer may run
        // foreign code (a Kotlin or Python release), which must not happen under our lock.
    }

    /// The observers to tell now; call them with no lock held.
    pub(crate) fn snapshot(&self) -> Vec<Arc<Entry>> {
        lock(&self.entries).clone()
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        lock(&self.entries).len()
    }
}

/// Skips an observer removed after the snapshot was taken.
impl DeliveryObserver for Entry {
    fn on_state(&self, status: &DeliveryStatus) {
        if !self.removed.load(Ordering::SeqCst) {
            self.observer.on_state(status);
        }
    }

    fn on_notice(&self, notice: &Notice) {
        if !self.removed.load(Ordering::SeqCst) {
            self.observer.on_notice(notice);
        }
    }
}

/// Keeps an observer registered: dropping it, or [`ObserverHandle::remove`], unregisters it, and
/// the spool lets go of the observer. It does not keep the spool alive; after the spool is gone
/// it does nothing.
#[must_use = "dropping the handle unregisters the observer at once"]
pub struct ObserverHandle {
    id: u64,
    observers: Weak<Observers>,
}

impl ObserverHandle {
    /// Unregisters the observer now: no call to it begins after this returns (one already
    /// running on another thread may finish). Safe from inside the observer's own callback;
    /// calling it again does nothing.
    pub fn remove(&self) {
        if let Some(observers) = self.observers.upgrade() {
            observers.remove(self.id);
        }
    }
}

impl Drop for ObserverHandle {
    fn drop(&mut self) {
        self.remove();
    }
}

impl std::fmt::Debug for ObserverHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ObserverHandle")
            .field("id", &self.id)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::DeliveryState;

    fn status() -> DeliveryStatus {
        DeliveryStatus {
            state: DeliveryState::Idle,
            pending: 0,
        }
    }

    fn tell(observers: &Observers) {
        for entry in observers.snapshot() {
            entry.on_state(&status());
        }
    }

    #[test]
    fn a_removed_observer_is_released_and_never_called_again() {
        let observers = Observers::new(Vec::new());
        let calls = Arc::new(AtomicU64::new(0));
        let counted = calls.clone();
        let observer: Arc<dyn DeliveryObserver> = Arc::new(move |_: &DeliveryStatus| {
            counted.fetch_add(1, Ordering::SeqCst);
        });
        let handle = observers.add(observer.clone());
        tell(&observers);
        // A snapshot taken before the removal, told after it: the call must be skipped.
        let stale = observers.snapshot();
        handle.remove();
        for entry in stale {
            entry.on_state(&status());
        }
        drop(handle);
        tell(&observers);
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        assert_eq!(observers.len(), 0);
        assert_eq!(Arc::strong_count(&observer), 1, "the list let go of it");
    }

    #[test]
    fn a_handle_outliving_the_spool_does_nothing() {
        let observers = Observers::new(Vec::new());
        let handle = observers.add(Arc::new(|_: &DeliveryStatus| {}));
        drop(observers);
        handle.remove();
    }
}
