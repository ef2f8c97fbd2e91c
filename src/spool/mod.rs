//! [`EventSpool`], the handle an app holds: `track()` and the few verbs of docs/delivery.md
//! §States. Cheap to clone and share between threads; the last clone to go shuts the spool down.
//!
//! This file holds the handle and its shutdown; the rest is split by concern: `builder`
//! opens a spool ([`SpoolBuilder`]), `tracking` records events, and `verbs` holds what the
//! app and its UI call afterwards (connectivity, consent, state, the quarantine).

mod builder;
mod tracking;
mod verbs;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::error::Result;
use crate::shared::Shared;
use crate::state::Notice;
use crate::stats::DropReason;
use crate::sync::lock;

pub use builder::SpoolBuilder;

/// How long `shutdown()` waits for the worker to hand back a batch whose attempt it abandoned
/// once the caller's timeout passed.
const ABANDON_GRACE: Duration = Duration::from_millis(200);

struct Handle {
    shared: Arc<Shared>,
    runtime: Mutex<Option<tokio::runtime::Runtime>>,
    worker_done: Mutex<Option<std::sync::mpsc::Receiver<()>>>,
    spiller: Mutex<Option<JoinHandle<()>>>,
    closed: AtomicBool,
    /// Held shared by each `track()` from its `closed` check until its events are queued;
    /// `shutdown()` takes it exclusively once, after setting `closed`, so its final persist
    /// sees every event a `track()` returned `Ok` for.
    admission: parking_lot::RwLock<()>,
}

/// The spool. See the crate documentation for the life of an event.
#[derive(Clone)]
pub struct EventSpool {
    handle: Arc<Handle>,
}

impl EventSpool {
    /// Ends this handle as a killed process would: nothing is persisted, no count is left for
    /// the next open, what memory held is gone; the store's files stay as they are on disk.
    /// The last clone going closes the connection and frees the owner lock. Feature `test-util`.
    #[cfg(feature = "test-util")]
    pub fn crash(self) {
        self.handle.closed.store(true, Ordering::SeqCst);
        self.shared().queue.stop_spiller();
    }

    fn shared(&self) -> &Shared {
        &self.handle.shared
    }
}

impl Handle {
    /// Whether this thread is the delivery worker's (an observer called from there).
    fn on_worker_thread(&self) -> bool {
        let rt = lock(&self.runtime);
        match (tokio::runtime::Handle::try_current(), rt.as_ref()) {
            (Ok(current), Some(rt)) => current.id() == rt.handle().id(),
            _ => false,
        }
    }

    pub fn shutdown(&self, timeout: Duration) -> Result<()> {
        let h = self;
        if h.closed.swap(true, Ordering::SeqCst) {
            return Ok(());
        }
        // Waits for the track() calls already past their `closed` check: their events are
        // queued before the final persist below, and every later call sees `closed`.
        drop(h.admission.write());
        let s = &h.shared;
        // The worker stops at its next step: an attempt in flight gets its answer first (within
        // `timeout`), so a batch the collector accepted is not left queued to be sent again.
        s.control(|c| c.shutdown = true);
        let on_worker_thread = h.on_worker_thread();
        let mut worker_stopped = false;
        if on_worker_thread {
            // Called from an observer: the worker cannot be waited for from its own thread.
            s.shutdown.send_replace(true);
        } else if let Some(done) = lock(&h.worker_done).take() {
            worker_stopped = done.recv_timeout(timeout).is_ok();
            if !worker_stopped {
                // The answer did not come in time: abandon the attempt (its events stay queued
                // and are sent again with the same ids) and give the worker a moment to hand
                // its batch back before the final persist.
                s.shutdown.send_replace(true);
                worker_stopped = done.recv_timeout(ABANDON_GRACE).is_ok();
            }
        } else {
            s.shutdown.send_replace(true);
        }
        // Callers of deliver_within still waiting get `ShutDown`: their senders go.
        lock(&s.drains).waiting.clear();
        let result = s.persist().map(|_| ());
        if s.queue.has_store() {
            // What the store refused (memory holds it only after a failed persist) cannot
            // outlive this handle: counted, and named.
            let lost = s.queue.drop_unstored();
            if !lost.is_empty() {
                s.notice(Notice::EventsDropped {
                    reason: DropReason::StoreRefused.as_str().to_string(),
                    event_ids: lost.iter().map(|id| id.to_string()).collect(),
                });
            }
        }
        // What changed since the last client report is kept as one more, sent after a restart.
        s.fleet.cut(&s.queue, &s.counters.snapshot());
        s.fleet.save_clock(&s.queue, s.clock.now_ms());
        s.queue.stop_spiller();
        // Not from the worker's thread, nor from the spill thread itself (an observer told of a
        // refused spill calls shutdown() there): it ends once the callback returns.
        if let Some(thread) = lock(&h.spiller).take()
            && !on_worker_thread
            && thread.thread().id() != std::thread::current().id()
        {
            let _ = thread.join();
        }
        if let Some(rt) = lock(&h.runtime).take() {
            rt.shutdown_background();
        }
        // Nothing of this handle writes to the store any more (track() and the queue and
        // quarantine verbs refuse after shutdown), so a new handle may open it even while clones
        // of this one live. A worker that did not stop in time keeps it owned until the last drop.
        if worker_stopped {
            s.queue.release_ownership();
        }
        result
    }
}

impl Drop for Handle {
    fn drop(&mut self) {
        let _ = self.shutdown(Duration::from_secs(2));
    }
}
