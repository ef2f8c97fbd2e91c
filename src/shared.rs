//! The state every part of a spool shares: the buffer, the store, the counters, the control
//! flags the app's calls set, and the published delivery state. The handle ([`crate::EventSpool`]),
//! the delivery worker and the spiller thread each hold an `Arc` of it.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use crate::buffer::{MemoryBuffer, SPILL_BACKLOG_MIN};
use crate::clock::Clock;
use crate::config::{Config, Durability};
use crate::error::Result;
use crate::event::{QueuedEvent, SendNote};
use crate::observers::Observers;
use crate::quarantine::{MemoryQuarantine, QuarantinedEvent};
use crate::state::{DeliveryObserver, DeliveryState, DeliveryStatus, Notice};
use crate::stats::{Counters, DropReason};
use crate::store::{Inserted, Store};
use crate::transport::Transport;

/// Locks a mutex even if a panicking thread poisoned it: every structure behind these locks is
/// left consistent between statements, and a caught panic must not wedge the app's `track()`.
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Requests from the app to the worker. Edges (`retry_now`, `dismiss`, ...) are consumed once.
#[derive(Clone, Debug)]
pub struct Control {
    pub online: bool,
    pub online_changed: bool,
    pub enabled: bool,
    pub enabled_changed: bool,
    pub flush: bool,
    pub retry_now: bool,
    pub dismiss: bool,
    pub resume: bool,
    pub api_key_changed: bool,
    /// Whether the app is in the foreground; the background → foreground edge starts a fresh
    /// failure episode, as a reconnect does.
    pub foreground: bool,
    pub foreground_changed: bool,
    pub shutdown: bool,
}

impl Default for Control {
    fn default() -> Self {
        Control {
            online: true,
            online_changed: false,
            enabled: true,
            enabled_changed: false,
            flush: false,
            retry_now: false,
            dismiss: false,
            resume: false,
            api_key_changed: false,
            foreground: true,
            foreground_changed: false,
            shutdown: false,
        }
    }
}

/// The published state; a retry (or probe) deadline is kept on the monotonic clock so `state()`
/// can say how long is left at the moment it is called.
pub struct StateCell {
    pub state: DeliveryState,
    pub retry_deadline_ms: Option<u64>,
    pub last_published: Option<DeliveryStatus>,
    /// The most recent published statuses, numbered, so `wait_for` sees a state that came and
    /// went between two of its wake-ups (a zero-delay retry lasts microseconds).
    pub recent: VecDeque<(u64, DeliveryStatus)>,
    pub published: u64,
}

/// How many events one spill takes while the spill lock is held. The delivery worker waits for
/// the spill in progress before it reads the store, so this bounds its wait: on a loaded
/// machine a 9,000-event commit into a store at its cap took about 280 ms, and delivery fell to
/// a few batches a second. A thousand rows per transaction is also where the raw SQLite
/// baseline commits.
pub const SPILL_CHUNK: usize = 1_000;

/// How many published statuses `wait_for` can look back over.
pub const RECENT_STATUSES: usize = 64;

/// The spiller thread's mailbox: generations let `durability = always` wait for its own commit.
#[derive(Default)]
pub struct SpillSignal {
    pub requested: u64,
    pub committed: u64,
    pub failed: u64,
    /// Why the last failed commit failed, for the `durability = always` caller waiting on it.
    pub last_error: String,
    pub stop: bool,
}

pub struct Shared {
    pub config: Config,
    pub api_key: Mutex<Option<String>>,
    pub clock: Arc<dyn Clock>,
    pub transport: Arc<dyn Transport>,
    /// Taken by every `track()`. `parking_lot` because a thread tracking in a tight loop retakes
    /// a plain mutex before a woken waiter runs; its eventual fairness lets the spill thread and
    /// the worker in.
    pub buffer: parking_lot::Mutex<MemoryBuffer>,
    /// Serializes moving events between memory and the store (spill, persist, batch assembly,
    /// acknowledgement) so no event is ever in neither place or counted in both. Under sustained
    /// tracking the spill thread takes it chunk after chunk; it hands it over fairly between
    /// chunks (see [`Shared::spill_now`]), so the worker waits for one chunk at most.
    pub spill_lock: parking_lot::Mutex<()>,
    pub store: Option<Store>,
    pub memory_quarantine: Mutex<MemoryQuarantine>,
    pub counters: Counters,
    pub next_seq: AtomicU64,
    pub control: Mutex<Control>,
    pub wake: tokio::sync::Notify,
    /// Set by `track()` when `flush_at` is reached, so only the first such call wakes the worker.
    pub flush_at_reached: AtomicBool,
    pub enabled: AtomicBool,
    pub state: Mutex<StateCell>,
    pub state_changed: Condvar,
    pub observers: Arc<Observers>,
    pub spill: Mutex<SpillSignal>,
    pub spill_cv: Condvar,
    pub shutdown: tokio::sync::watch::Sender<bool>,
    /// Seeds the worker's retry and probe jitter (tests and simulations replay a run); `None`
    /// draws from the system.
    pub jitter_seed: Option<u64>,
    /// Notices raised while a lock was held (the spill lock, mostly), waiting for the thread
    /// that raised them to let go of it: see [`Shared::notice_later`].
    pub deferred_notices: Mutex<Vec<Notice>>,
}

thread_local! {
    /// Set while this thread runs an app observer, so a notice its own calls raise (a
    /// `persist()` on a full disk from `on_notice`) is not handed back to it in a loop.
    static IN_OBSERVER: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

impl Shared {
    pub fn control(&self, f: impl FnOnce(&mut Control)) {
        f(&mut lock(&self.control));
        self.wake.notify_one();
    }

    pub fn take_control(&self) -> Control {
        let mut c = lock(&self.control);
        let snapshot = c.clone();
        c.online_changed = false;
        c.enabled_changed = false;
        c.flush = false;
        c.retry_now = false;
        c.dismiss = false;
        c.resume = false;
        c.api_key_changed = false;
        c.foreground_changed = false;
        snapshot
    }

    pub fn status(&self) -> DeliveryStatus {
        let cell = lock(&self.state);
        let mut state = cell.state.clone();
        if let (
            DeliveryState::RetryScheduled {
                retry_in_ms: left_ms,
                next_retry_at_ms: at_ms,
                ..
            }
            | DeliveryState::WaitingForUser {
                probe_in_ms: left_ms,
                next_probe_at_ms: at_ms,
                ..
            },
            Some(deadline),
        ) = (&mut state, cell.retry_deadline_ms)
        {
            let now = self.clock.now_ms();
            *left_ms = deadline.saturating_sub(now);
            *at_ms = self.clock.wall_ms() + *left_ms as i64;
        }
        DeliveryStatus {
            state,
            pending: self.counters.pending(),
        }
    }

    /// Records a new state and tells the observers if what they would render changed.
    /// Observers run after every lock is released; a panicking one is contained and counted.
    pub fn publish(&self, state: DeliveryState, retry_deadline_ms: Option<u64>) {
        let status = {
            let mut cell = lock(&self.state);
            cell.state = state;
            cell.retry_deadline_ms = retry_deadline_ms;
            drop(cell);
            let status = self.status();
            let mut cell = lock(&self.state);
            if cell.last_published.as_ref() == Some(&status) {
                None
            } else {
                cell.last_published = Some(status.clone());
                cell.published += 1;
                let number = cell.published;
                if cell.recent.len() == RECENT_STATUSES {
                    cell.recent.pop_front();
                }
                cell.recent.push_back((number, status.clone()));
                Some(status)
            }
        };
        self.state_changed.notify_all();
        if let Some(status) = status {
            let observers = self.observers.snapshot();
            for observer in observers {
                self.observe(|| observer.on_state(&status));
            }
        }
    }

    /// Tells the observers now. The caller holds no lock: an observer may call any verb of the
    /// API, `shutdown()` included.
    pub fn notice(&self, notice: Notice) {
        tracing::warn!(?notice, "eventspool notice");
        if IN_OBSERVER.get() {
            // Raised by an observer's own call back into the spool (a `persist()` on a full disk
            // from `on_notice`): it waits for the next delivery outside any observer, or an
            // observer that answers each notice with a call that fails would never return.
            lock(&self.deferred_notices).push(notice);
            return;
        }
        let observers = self.observers.snapshot();
        for observer in observers {
            self.observe(|| observer.on_notice(&notice));
        }
    }

    /// Queues a notice raised with a lock held; the thread delivers it with
    /// [`Shared::deliver_notices`] once it let go, so no observer ever runs under a lock of
    /// ours (it may call `persist()`, `purge_pending()` or `shutdown()`, which take them).
    pub fn notice_later(&self, notice: Notice) {
        tracing::warn!(?notice, "eventspool notice");
        lock(&self.deferred_notices).push(notice);
    }

    /// Delivers the notices [`Shared::notice_later`] queued. Call it with no lock held; inside
    /// an observer it leaves them for the next delivery outside one.
    pub fn deliver_notices(&self) {
        if IN_OBSERVER.get() {
            return;
        }
        let notices = std::mem::take(&mut *lock(&self.deferred_notices));
        for notice in notices {
            let observers = self.observers.snapshot();
            for observer in observers {
                self.observe(|| observer.on_notice(&notice));
            }
        }
    }

    /// Runs an app observer, contained, marking the thread as inside one.
    fn observe(&self, f: impl FnOnce()) {
        let outer = IN_OBSERVER.replace(true);
        self.contain("observer", f);
        IN_OBSERVER.set(outer);
    }

    /// Runs app-supplied code so that its panic cannot unwind into the SDK.
    pub fn contain(&self, what: &str, f: impl FnOnce()) {
        if std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).is_err() {
            self.counters.panics.fetch_add(1, Ordering::Relaxed);
            tracing::error!("{what} panicked; contained");
        }
    }

    pub fn next_seq(&self) -> u64 {
        self.next_seq.fetch_add(1, Ordering::Relaxed)
    }

    /// Moves the oldest part of the spill queue into the store (all of it with `durability =
    /// always`, whose callers wait for one shared commit). The caller holds `spill_lock`, so a
    /// refusal is queued as a notice for [`Shared::deliver_notices`] after the caller let go.
    pub fn spill_locked(&self) -> Result<()> {
        let Some(store) = &self.store else {
            return Ok(());
        };
        let (events, generation, rest) = {
            let mut buffer = self.buffer.lock();
            let events = match self.config.durability {
                Durability::Spill => buffer.take_spill(SPILL_CHUNK),
                Durability::Always => buffer.take_unstored(),
            };
            (events, lock(&self.spill).requested, buffer.spill_len())
        };
        if events.is_empty() {
            self.mark_committed(generation, None);
            return Ok(());
        }
        match self.insert_counted(store, &events) {
            Ok(_) => {
                // Everything requested up to `generation` is on disk only once nothing was left.
                if rest == 0 {
                    self.mark_committed(generation, None);
                }
                Ok(())
            }
            Err(e) => {
                self.give_back_refused(events);
                self.counters.store_errors.fetch_add(1, Ordering::Relaxed);
                self.mark_committed(generation, Some(e.to_string()));
                self.notice_later(Notice::StoreUnavailable {
                    reason: e.to_string(),
                });
                Err(e)
            }
        }
    }

    /// Puts back events the store refused. With `spill` they wait to spill again (the worker
    /// reads that queue too). With `always` they join the queue the worker reads, bounded like
    /// the spill backlog (`max(memory_capacity, SPILL_BACKLOG_MIN)`, the oldest dropped as
    /// `memory_overflow`): a full disk must neither hide them from delivery nor grow memory.
    fn give_back_refused(&self, events: Vec<QueuedEvent>) {
        match self.config.durability {
            Durability::Spill => self.buffer.lock().return_spill(events),
            Durability::Always => {
                let max = (self.config.memory_capacity as usize).max(SPILL_BACKLOG_MIN);
                let dropped = self.buffer.lock().keep_refused(events, max);
                self.counters.drop(DropReason::MemoryOverflow, dropped);
            }
        }
    }

    /// Writes events into the store's queue and counts what its cap evicted to make room
    /// (`disk_cap`, `quarantine_cap`): spill, persist and a large `track_batch` all write
    /// through here, so no eviction goes uncounted.
    pub fn insert_counted(&self, store: &Store, events: &[QueuedEvent]) -> Result<Inserted> {
        let report = store.insert(events)?;
        self.counters.drop(DropReason::DiskCap, report.evicted);
        self.counters
            .drop(DropReason::QuarantineCap, report.evicted_quarantine);
        Ok(report)
    }

    /// Spills now; a thread waiting for the lock (the delivery worker) gets it next.
    pub fn spill_now(&self) -> Result<()> {
        let guard = self.spill_lock.lock();
        let result = self.spill_locked();
        parking_lot::MutexGuard::unlock_fair(guard);
        self.deliver_notices();
        result
    }

    fn mark_committed(&self, generation: u64, error: Option<String>) {
        let mut s = lock(&self.spill);
        match error {
            None => s.committed = s.committed.max(generation),
            Some(e) => {
                s.failed = s.failed.max(generation);
                s.last_error = e;
            }
        }
        drop(s);
        self.spill_cv.notify_all();
    }

    /// Takes events out of the queue after the collector answered for them (delivered or
    /// quarantined): from the store, and from the in-flight set in memory.
    pub fn remove_from_queue(&self, events: &[(QueuedEvent, bool)]) -> Result<()> {
        let _guard = self.spill_lock.lock();
        let (memory, mut on_disk) = seqs_by_origin(events);
        on_disk.extend(self.buffer.lock().acknowledge(&memory));
        if let Some(store) = &self.store
            && !on_disk.is_empty()
        {
            store.delete(&on_disk)?;
        }
        Ok(())
    }

    /// Gives events of an unanswered batch back to the queue, each to where it came from.
    pub fn return_to_queue(&self, events: &[(QueuedEvent, bool)]) {
        let _guard = self.spill_lock.lock();
        let (memory, on_disk) = seqs_by_origin(events);
        self.buffer.lock().release(&memory);
        if let Some(store) = &self.store {
            store.release(&on_disk);
            // Memory events `persist()` wrote as leased rows meanwhile now queue in the store.
            store.release(&memory);
        }
    }

    /// Records a send's bookkeeping for a batch's events where each one lives: the in-flight copy
    /// in memory (and its row, when `persist()` copied it there) or its row in the store.
    pub fn note_sends(&self, events: &[(QueuedEvent, bool)], note: SendNote) -> Result<()> {
        let _guard = self.spill_lock.lock();
        let (memory, mut on_disk) = seqs_by_origin(events);
        on_disk.extend(self.buffer.lock().note_sends(&memory, note));
        match &self.store {
            Some(store) => store.note_sends(&on_disk, note),
            None => Ok(()),
        }
    }

    /// Takes events of a batch out of the queue because they expired before they could be sent
    /// (again); counts them `expired`.
    pub fn drop_expired(&self, events: &[(QueuedEvent, bool)]) -> Result<()> {
        let _guard = self.spill_lock.lock();
        let (memory, mut on_disk) = seqs_by_origin(events);
        on_disk.extend(self.buffer.lock().acknowledge(&memory));
        self.counters.drop(DropReason::Expired, events.len() as u64);
        match &self.store {
            Some(store) if !on_disk.is_empty() => store.delete_expired(&on_disk).map(|_| ()),
            _ => Ok(()),
        }
    }

    /// Stores quarantined events (SQLite or memory) and applies the quarantine's limits.
    /// `from_queue` are the store seqs of those events, deleted from the queue in the same
    /// transaction (see [`crate::store::Store::with_quarantine_moving`]).
    pub fn add_to_quarantine(
        &self,
        entries: Vec<QuarantinedEvent>,
        from_queue: &[u64],
    ) -> Result<()> {
        let now = self.clock.wall_ms();
        let cutoff = now.saturating_sub(self.config.quarantine_retention_ms as i64);
        let max = self.config.quarantine_max_events;
        let evicted = match &self.store {
            Some(store) => {
                store.with_quarantine_moving(from_queue, |q| q.add(&entries, max, cutoff))?
            }
            None => lock(&self.memory_quarantine).add(entries, max, cutoff),
        };
        self.counters.drop(DropReason::QuarantineCap, evicted.cap);
        self.counters
            .drop(DropReason::QuarantineExpired, evicted.expired);
        Ok(())
    }

    /// Moves everything in memory to the store (see [`crate::EventSpool::persist`]). A refusal
    /// is told to the observers as `StoreUnavailable` before this returns, like a refused
    /// spill: the app that sees `Err` has been told by then.
    pub fn persist(&self) -> Result<u64> {
        let result = self.persist_locked();
        self.deliver_notices();
        result
    }

    fn persist_locked(&self) -> Result<u64> {
        let s = self;
        let Some(store) = &s.store else { return Ok(0) };
        let _guard = s.spill_lock.lock();
        let (moved, copies) = s.buffer.lock().take_for_persist();
        // The batch in flight is written as leased rows: eviction, expiry and purge_pending()
        // skip them and no other batch reads them, so each event stays in one place, counted once.
        let copy_seqs: Vec<u64> = copies.iter().map(|e| e.seq).collect();
        store.lease(&copy_seqs);
        let first_copy = moved.len();
        let mut all = moved;
        all.extend(copies);
        match s.insert_counted(store, &all) {
            Ok(report) => Ok(report.inserted),
            Err(e) => {
                all.truncate(first_copy);
                store.release(&copy_seqs);
                s.buffer.lock().unmark_persisted(&copy_seqs);
                s.give_back_refused(all);
                s.counters.store_errors.fetch_add(1, Ordering::Relaxed);
                s.notice_later(Notice::StoreUnavailable {
                    reason: e.to_string(),
                });
                Err(e)
            }
        }
    }
}

/// The seqs of a batch's events, split by where each came from: (memory, store). The flag beside
/// each event says it was read from the store.
pub fn seqs_by_origin(events: &[(QueuedEvent, bool)]) -> (Vec<u64>, Vec<u64>) {
    let (disk, memory): (Vec<_>, Vec<_>) = events.iter().partition(|(_, from_store)| *from_store);
    let seqs = |v: Vec<&(QueuedEvent, bool)>| v.iter().map(|(e, _)| e.seq).collect();
    (seqs(memory), seqs(disk))
}
