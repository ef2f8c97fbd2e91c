//! [`EventSpool`], the handle an app holds: `track()` and the few verbs of docs/delivery.md
//! §States. Cheap to clone and share between threads; the last clone to go shuts the spool down.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use futures_util::FutureExt;

use crate::buffer::MemoryBuffer;
use crate::clock::{Clock, SystemClock};
use crate::config::{Config, Durability};
use crate::error::{ConfigError, Error, Result};
use crate::event::{self, EventId, NewEvent, QueuedEvent};
use crate::quarantine::{ListFilter, MemoryQuarantine, QuarantinedEvent, Selector};
use crate::shared::{Control, Shared, SpillSignal, StateCell, lock};
use crate::state::{DeliveryObserver, DeliveryState, DeliveryStatus, Notice};
use crate::stats::{Counters, DropReason, Entry, Stats};
use crate::store::Store;
use crate::transport::Transport;
#[cfg(feature = "reqwest")]
use crate::transport::{ReqwestTransport, TransportError};
use crate::worker;

/// How long `track()` with `durability = always` waits for its commit before it gives up on
/// durability (the event stays queued in memory and the call returns `Error::NotDurable`).
const ALWAYS_COMMIT_WAIT: Duration = Duration::from_secs(5);

/// How long `shutdown()` waits for the worker to hand back a batch whose attempt it abandoned
/// once the caller's timeout passed.
const ABANDON_GRACE: Duration = Duration::from_millis(200);

/// Options beyond [`Config`]: collaborators an app or a test supplies.
pub struct SpoolBuilder {
    config: Config,
    clock: Option<Arc<dyn Clock>>,
    transport: Option<Arc<dyn Transport>>,
    observers: Vec<Arc<dyn DeliveryObserver>>,
    online: bool,
    jitter_seed: Option<u64>,
}

impl SpoolBuilder {
    /// Time source for timers, timestamps and ages (tests inject a [`crate::ManualClock`]).
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = Some(clock);
        self
    }

    /// The HTTP stack (default: the built-in reqwest transport; required when the crate is built
    /// without its `reqwest` feature).
    pub fn transport(mut self, transport: Arc<dyn Transport>) -> Self {
        self.transport = Some(transport);
        self
    }

    /// An observer registered before the worker starts, so it sees the very first state.
    pub fn observer(mut self, observer: Arc<dyn DeliveryObserver>) -> Self {
        self.observers.push(observer);
        self
    }

    /// Starts offline (no attempt until `set_online(true)`), as an app that knows it has no network.
    pub fn start_offline(mut self) -> Self {
        self.online = false;
        self
    }

    /// Seeds the retry and probe jitter, so a run on a [`crate::ManualClock`] can be replayed
    /// exactly. Apps leave it unset: a fleet must not share one sequence of delays.
    pub fn jitter_seed(mut self, seed: u64) -> Self {
        self.jitter_seed = Some(seed);
        self
    }

    pub fn open(self) -> Result<EventSpool> {
        EventSpool::start(self)
    }
}

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
    /// Opens a spool with the built-in transport and the system clock.
    pub fn open(config: Config) -> Result<EventSpool> {
        EventSpool::builder(config).open()
    }

    pub fn builder(config: Config) -> SpoolBuilder {
        SpoolBuilder {
            config,
            clock: None,
            transport: None,
            observers: Vec::new(),
            online: true,
            jitter_seed: None,
        }
    }

    fn start(b: SpoolBuilder) -> Result<EventSpool> {
        let config = b.config;
        config.validate()?;
        if config.durability == Durability::Always && config.db_path.is_none() {
            return Err(ConfigError::new(
                "durability",
                "'always' needs db_path: there is no store to write to",
            )
            .into());
        }
        let clock = b.clock.unwrap_or_else(|| Arc::new(SystemClock::new()));
        let transport: Arc<dyn Transport> = match b.transport {
            Some(t) => t,
            // Without the built-in transport the app must bring one: say so rather than fail at
            // the first send.
            #[cfg(not(feature = "reqwest"))]
            None => {
                return Err(ConfigError::new(
                    "transport",
                    "this build has no built-in HTTP transport (feature `reqwest` is off): pass one with SpoolBuilder::transport",
                )
                .into());
            }
            #[cfg(feature = "reqwest")]
            None => Arc::new(
                ReqwestTransport::new()
                    .map_err(|e: TransportError| Error::Storage(format!("HTTP client: {e}")))?,
            ),
        };
        let mut recovered = None;
        let store = match &config.db_path {
            Some(path) => {
                let opened = Store::open(path, config.max_disk_bytes, clock.wall_ms())?;
                recovered = opened.recovered;
                Some(opened.store)
            }
            None => None,
        };
        let restored = store.as_ref().map(Store::len).unwrap_or(0);
        let next_seq = match &store {
            Some(s) => s.next_seq()?,
            None => 1,
        };
        let (shutdown, _) = tokio::sync::watch::channel(false);
        let shared = Arc::new(Shared {
            api_key: Mutex::new(config.api_key.clone()),
            clock,
            transport,
            buffer: parking_lot::Mutex::new(MemoryBuffer::default()),
            spill_lock: parking_lot::Mutex::new(()),
            store,
            memory_quarantine: Mutex::new(MemoryQuarantine::default()),
            counters: Counters::default(),
            next_seq: AtomicU64::new(next_seq),
            control: Mutex::new(Control {
                online: b.online,
                ..Control::default()
            }),
            wake: tokio::sync::Notify::new(),
            flush_at_reached: AtomicBool::new(false),
            enabled: AtomicBool::new(true),
            state: Mutex::new(StateCell {
                state: if b.online {
                    DeliveryState::Idle
                } else {
                    DeliveryState::Offline
                },
                retry_deadline_ms: None,
                last_published: None,
                recent: Default::default(),
                published: 0,
            }),
            state_changed: Condvar::new(),
            observers: Mutex::new(b.observers),
            spill: Mutex::new(SpillSignal::default()),
            spill_cv: Condvar::new(),
            shutdown,
            jitter_seed: b.jitter_seed,
            deferred_notices: Mutex::new(Vec::new()),
            config,
        });
        shared.counters.entered(Entry::Restored, restored);
        if restored >= shared.config.flush_at {
            shared.flush_at_reached.store(true, Ordering::SeqCst);
        }
        if let Some((moved_to, reason)) = recovered {
            shared
                .counters
                .stores_recovered
                .fetch_add(1, Ordering::Relaxed);
            shared.notice(Notice::StoreRecovered {
                moved_to: moved_to.display().to_string(),
                reason,
            });
        }
        let spiller = match &shared.store {
            Some(_) => {
                let s = shared.clone();
                Some(
                    std::thread::Builder::new()
                        .name("eventspool-spill".into())
                        .spawn(move || spiller(s))
                        .map_err(|e| Error::Storage(format!("cannot start spill thread: {e}")))?,
                )
            }
            None => None,
        };
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("eventspool-worker")
            .enable_all()
            .build()
            .map_err(|e| Error::Storage(format!("cannot start worker runtime: {e}")))?;
        let (done_tx, done_rx) = std::sync::mpsc::channel();
        let s = shared.clone();
        runtime.spawn(async move {
            loop {
                let run = std::panic::AssertUnwindSafe(worker::run(s.clone()))
                    .catch_unwind()
                    .await;
                if run.is_ok() || lock(&s.control).shutdown {
                    break;
                }
                s.counters.panics.fetch_add(1, Ordering::Relaxed);
                s.notice(Notice::InternalError {
                    message: "delivery worker panicked; restarted".into(),
                });
            }
            let _ = done_tx.send(());
        });
        Ok(EventSpool {
            handle: Arc::new(Handle {
                shared,
                runtime: Mutex::new(Some(runtime)),
                worker_done: Mutex::new(Some(done_rx)),
                spiller: Mutex::new(spiller),
                closed: AtomicBool::new(false),
                admission: parking_lot::RwLock::new(()),
            }),
        })
    }

    fn shared(&self) -> &Shared {
        &self.handle.shared
    }

    /// Records an event now. Never waits on disk or network (except with `durability = always`,
    /// which waits for the shared commit that makes it durable, and returns
    /// [`Error::NotDurable`] with the event's id when the store could not take it).
    pub fn track(&self, name: &str, properties: serde_json::Value) -> Result<EventId> {
        self.track_event(NewEvent::new(name, properties))
    }

    /// Records an event with any of its optional fields set by the caller.
    pub fn track_event(&self, event: NewEvent) -> Result<EventId> {
        let _admitted = self.handle.admission.read_recursive();
        self.check_accepting()?;
        let queued = self.prepare(&event)?;
        let id = queued.id;
        self.accept(std::iter::once(queued), 1)
            .map_err(|reason| Error::NotDurable {
                event_ids: vec![id],
                reason,
            })?;
        Ok(id)
    }

    /// Records several events, all or none: each is checked first, and the first bad one is
    /// named by its position (1-based) with nothing recorded. One call for many events is what
    /// makes tracking cheap from bindings whose per-call cost dwarfs the SDK's own.
    pub fn track_batch(&self, events: &[NewEvent]) -> Result<Vec<EventId>> {
        let result = {
            let _admitted = self.handle.admission.read_recursive();
            self.track_batch_admitted(events)
        };
        // A store refusal is told once the call let go of every lock (an observer may call
        // shutdown(), which waits for admitted calls).
        self.shared().deliver_notices();
        result
    }

    fn track_batch_admitted(&self, events: &[NewEvent]) -> Result<Vec<EventId>> {
        self.check_accepting()?;
        let prepared = events
            .iter()
            .enumerate()
            .map(|(i, e)| {
                self.prepare(e)
                    .map_err(|err| Error::InvalidEvent(format!("event {}: {err}", i + 1)))
            })
            .collect::<Result<Vec<_>>>()?;
        let ids: Vec<EventId> = prepared.iter().map(|q| q.id).collect();
        let n = prepared.len() as u64;
        let s = self.shared();
        if s.config.durability == Durability::Spill {
            match &s.store {
                Some(store) => {
                    self.accept_spilling(store, prepared)?;
                    return Ok(ids);
                }
                None if n > s.config.memory_capacity => {
                    return Err(Error::BatchRefused(format!(
                        "{n} events are more than memory_capacity ({}) holds, and without a \
                         db_path there is no store to spill to; split the batch",
                        s.config.memory_capacity
                    )));
                }
                None => {}
            }
        }
        match self.accept(prepared, n) {
            Ok(()) => Ok(ids),
            Err(reason) => Err(Error::NotDurable {
                event_ids: ids,
                reason,
            }),
        }
    }

    fn check_accepting(&self) -> Result<()> {
        if self.handle.closed.load(Ordering::Relaxed) {
            return Err(Error::ShutDown);
        }
        if !self.shared().enabled.load(Ordering::Relaxed) {
            return Err(Error::Disabled);
        }
        Ok(())
    }

    fn prepare(&self, event: &NewEvent) -> Result<QueuedEvent> {
        let s = self.shared();
        event::prepare(
            event,
            s.clock.wall_ms(),
            s.next_seq(),
            s.config.max_event_bytes,
        )
    }

    /// Queues validated events and wakes the worker when a flush trigger is reached. The events
    /// are queued either way; `Err` (only with `durability = always`) says why they are not in
    /// the store.
    fn accept(
        &self,
        events: impl IntoIterator<Item = QueuedEvent>,
        n: u64,
    ) -> std::result::Result<(), String> {
        let s = self.shared();
        if n == 0 {
            return Ok(());
        }
        // The first pending event arms the worker's periodic flush (an idle worker with nothing
        // to send sleeps without a deadline).
        let first = s.counters.entered(Entry::Tracked, n) == 0;
        let durable = match s.config.durability {
            Durability::Spill => {
                for event in events {
                    self.enqueue(event);
                }
                Ok(())
            }
            Durability::Always => self.enqueue_durably(events),
        };
        self.wake_if_due(first);
        durable
    }

    /// `track_batch` with a store (`durability = spill`): the whole batch is recorded, never
    /// part of it dropped. What memory has room for is queued; the oldest rest is written to
    /// the store on the caller's thread (back-pressure: a bulk call waits for the disk rather
    /// than memory growing or events dropping). If the store refuses, nothing is recorded (the
    /// notice is delivered by the caller once it let go of the admission lock).
    fn accept_spilling(&self, store: &Store, mut events: Vec<QueuedEvent>) -> Result<()> {
        let s = self.shared();
        let n = events.len() as u64;
        if n == 0 {
            return Ok(());
        }
        let capacity = s.config.memory_capacity as usize;
        {
            // The worker and the spiller wait while the batch is split between memory and the
            // store, so no event is seen half-recorded; other threads' track() calls do not.
            let _guard = s.spill_lock.lock();
            let room = s.buffer.lock().room(capacity);
            let mut written = Ok(());
            if events.len() > room {
                events.sort_unstable_by_key(QueuedEvent::key);
                let rest = events.split_off(events.len() - room);
                let direct = std::mem::replace(&mut events, rest);
                written = match s.insert_counted(store, &direct) {
                    Ok(_) => Ok(()),
                    Err(e) => {
                        s.counters.store_errors.fetch_add(1, Ordering::Relaxed);
                        s.notice_later(Notice::StoreUnavailable {
                            reason: e.to_string(),
                        });
                        Err(Error::BatchRefused(format!(
                            "{n} events do not fit in memory (room for {room}) and the store \
                             refused the rest: {e}"
                        )))
                    }
                };
            }
            if written.is_ok() {
                let first = s.counters.entered(Entry::Tracked, n) == 0;
                if s.buffer.lock().push_batch(events, capacity) {
                    lock(&s.spill).requested += 1;
                    s.spill_cv.notify_all();
                }
                self.wake_if_due(first);
            }
            written
        }
    }

    /// Wakes the worker when `flush_at` is reached, or for the first pending event (which
    /// arms its periodic flush).
    fn wake_if_due(&self, first: bool) {
        let s = self.shared();
        if s.counters.pending() >= s.config.flush_at && !s.flush_at_reached.load(Ordering::Relaxed)
        {
            s.flush_at_reached.store(true, Ordering::SeqCst);
            s.wake.notify_one();
        } else if first {
            s.wake.notify_one();
        }
    }

    fn enqueue(&self, event: QueuedEvent) {
        let s = self.shared();
        let overflow =
            s.buffer
                .lock()
                .push(event, s.config.memory_capacity as usize, s.store.is_some());
        s.counters
            .drop(DropReason::MemoryOverflow, overflow.dropped);
        if overflow.spill_started {
            lock(&s.spill).requested += 1;
            s.spill_cv.notify_all();
        }
    }

    /// Hands the events to the spill thread and waits for the commit that holds them (callers
    /// arriving meanwhile share it).
    fn enqueue_durably(
        &self,
        events: impl IntoIterator<Item = QueuedEvent>,
    ) -> std::result::Result<(), String> {
        let s = self.shared();
        let generation = {
            let mut buffer = s.buffer.lock();
            for event in events {
                buffer.push_spill(event);
            }
            let mut spill = lock(&s.spill);
            spill.requested += 1;
            spill.requested
        };
        s.spill_cv.notify_all();
        let on_spill_thread = lock(&self.handle.spiller)
            .as_ref()
            .is_some_and(|t| t.thread().id() == std::thread::current().id());
        if on_spill_thread {
            // An observer told of a refused spill tracks from the spill thread itself: nobody
            // else would make this commit, so make it here.
            let _ = s.spill_now();
        }
        let deadline = Instant::now() + ALWAYS_COMMIT_WAIT;
        let mut spill = lock(&s.spill);
        while spill.committed < generation && spill.failed < generation && !spill.stop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            spill = s
                .spill_cv
                .wait_timeout(spill, left)
                .map(|(g, _)| g)
                .unwrap_or_else(|p| p.into_inner().0);
        }
        if spill.committed >= generation {
            Ok(())
        } else if spill.failed >= generation {
            Err(format!("the store refused the write: {}", spill.last_error))
        } else if spill.stop {
            Err("the spool shut down before the store committed".into())
        } else {
            Err(format!(
                "the store did not commit within {} s",
                ALWAYS_COMMIT_WAIT.as_secs()
            ))
        }
    }

    /// Tells the spool whether the device has a network. Offline means no attempts at all; the
    /// offline → online edge starts a fresh failure episode and sends what is pending.
    pub fn set_online(&self, online: bool) {
        self.shared().control(|c| {
            if c.online != online {
                c.online = online;
                c.online_changed = true;
            }
        });
    }

    /// Tells the spool whether the app is in the foreground. Coming back to the foreground starts
    /// a fresh failure episode: from `RetryScheduled` or `WaitingForUser` it sends at once with
    /// the whole automatic budget again, as a reconnect does (the user is looking, and the
    /// outage may be long over). Going to the background changes nothing by itself.
    pub fn set_foreground(&self, foreground: bool) {
        self.shared().control(|c| {
            if c.foreground != foreground {
                c.foreground = foreground;
                c.foreground_changed = true;
            }
        });
    }

    /// Asks for pending events to be sent now (no effect while offline, paused or disabled).
    pub fn flush(&self) {
        self.shared().control(|c| c.flush = true);
    }

    /// Skips the countdown; from `WaitingForUser`, makes one manual attempt.
    pub fn retry_now(&self) {
        self.shared().control(|c| c.retry_now = true);
    }

    /// The user's "Back": stop retrying, keep every event, stay idle until the next trigger
    /// (the periodic flush, `flush()`, `retry_now()` or a reconnect), not `flush_at`.
    pub fn dismiss(&self) {
        self.shared().control(|c| c.dismiss = true);
    }

    /// Leaves `Paused`.
    pub fn resume(&self) {
        self.shared().control(|c| c.resume = true);
    }

    /// New credentials; leaves `Paused{auth}`.
    pub fn set_api_key(&self, api_key: Option<String>) -> Result<()> {
        if let Some(key) = &api_key {
            crate::config::check_api_key(key)?;
        }
        *lock(&self.shared().api_key) = api_key;
        self.shared().control(|c| c.api_key_changed = true);
        Ok(())
    }

    /// Opt-out: `false` stops delivery and makes `track()` return [`Error::Disabled`]; what is
    /// queued stays until [`EventSpool::purge_pending`] or `set_enabled(true)`.
    pub fn set_enabled(&self, enabled: bool) {
        self.shared().enabled.store(enabled, Ordering::SeqCst);
        self.shared().control(|c| {
            if c.enabled != enabled {
                c.enabled = enabled;
                c.enabled_changed = true;
            }
        });
    }

    /// Deletes every queued event (memory and store) that is not in flight; returns how many.
    pub fn purge_pending(&self) -> Result<u64> {
        if self.handle.closed.load(Ordering::Relaxed) {
            return Err(Error::ShutDown);
        }
        let s = self.shared();
        let _guard = s.spill_lock.lock();
        let mut n = s.buffer.lock().clear();
        if let Some(store) = &s.store {
            n += store.purge_queue()?;
        }
        s.counters.drop(DropReason::Purged, n);
        Ok(n)
    }

    /// The current state, with `retry_in_ms` computed now.
    pub fn state(&self) -> DeliveryStatus {
        self.shared().status()
    }

    pub fn add_observer(&self, observer: Arc<dyn DeliveryObserver>) {
        lock(&self.shared().observers).push(observer);
    }

    pub fn stats(&self) -> Stats {
        let s = self.shared();
        let mut stats = s.counters.snapshot();
        stats.pending_memory = s.buffer.lock().len() as u64;
        if let Some(store) = &s.store {
            stats.pending_disk = store.len();
            stats.store_bytes = store.disk_usage();
            stats.quarantine = store.with_quarantine(|q| q.counts()).unwrap_or_default();
        } else {
            stats.quarantine = lock(&s.memory_quarantine).counts();
        }
        stats
    }

    /// Waits (real time) until `done` holds for the current state or for one published while
    /// waiting (so a state that lasted microseconds is not missed), or the timeout passes.
    pub fn wait_for(
        &self,
        timeout: Duration,
        done: impl Fn(&DeliveryStatus) -> bool,
    ) -> Option<DeliveryStatus> {
        let s = self.shared();
        let deadline = Instant::now() + timeout;
        let mut seen = lock(&s.state).published;
        loop {
            let status = s.status();
            if done(&status) {
                return Some(status);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return None;
            }
            let cell = lock(&s.state);
            let (cell, _) = s
                .state_changed
                .wait_timeout(cell, left.min(Duration::from_millis(20)))
                .unwrap_or_else(|p| p.into_inner());
            // States published while this thread slept count too, however briefly they lasted.
            // The predicate runs after the lock is released: it may call back into the spool.
            let meanwhile: Vec<DeliveryStatus> = cell
                .recent
                .iter()
                .filter(|(n, _)| *n > seen)
                .map(|(_, status)| status.clone())
                .collect();
            seen = cell.published;
            drop(cell);
            if let Some(status) = meanwhile.into_iter().find(|status| done(status)) {
                return Some(status);
            }
        }
    }

    /// Waits until nothing is pending and the worker is idle, or the timeout passes.
    pub fn wait_drained(&self, timeout: Duration) -> bool {
        self.wait_for(timeout, |st| st.is_drained()).is_some()
    }

    /// Moves everything in memory to the store now: call it when the app goes to the background.
    /// Returns how many events were written. Without a store it does nothing.
    pub fn persist(&self) -> Result<u64> {
        self.shared().persist()
    }

    /// Stops the worker (waiting at most `timeout` for an attempt in flight), writes what is in
    /// memory to the store when there is one, and releases the store. Safe to call twice, and
    /// from an observer (then it does not wait for the worker it is running on).
    pub fn shutdown(&self, timeout: Duration) -> Result<()> {
        self.handle.shutdown(timeout)
    }

    /// Quarantined events, oldest first.
    pub fn quarantine_list(&self, filter: &ListFilter) -> Result<Vec<QuarantinedEvent>> {
        match &self.shared().store {
            Some(store) => store.with_quarantine(|q| q.list(filter)),
            None => Ok(lock(&self.shared().memory_quarantine).list(filter)),
        }
    }

    pub fn quarantine_get(&self, event_id: &str) -> Result<Option<QuarantinedEvent>> {
        match &self.shared().store {
            Some(store) => store.with_quarantine(|q| q.get(event_id)),
            None => Ok(lock(&self.shared().memory_quarantine).get(event_id)),
        }
    }

    /// Puts quarantined events back in the queue with their original `event_id`; they go out
    /// through the normal throttled batches. Returns how many.
    pub fn quarantine_redrive(&self, selector: &Selector) -> Result<u64> {
        if self.handle.closed.load(Ordering::Relaxed) {
            return Err(Error::ShutDown);
        }
        let s = self.shared();
        let n = match &s.store {
            Some(store) => {
                let _guard = s.spill_lock.lock();
                let n = store.redrive(selector, s.clock.wall_ms(), || s.next_seq())?;
                // Counted before the lock goes, so the worker cannot deliver them first and
                // take `pending` below zero.
                s.counters.entered(Entry::Redriven, n);
                n
            }
            None => {
                let taken = lock(&s.memory_quarantine).take(selector);
                let n = taken.len() as u64;
                s.counters.entered(Entry::Redriven, n);
                for q in taken {
                    let id = EventId::parse(&q.event_id)?;
                    let event = QueuedEvent {
                        ts_ms: q.ts_ms,
                        seq: s.next_seq(),
                        id,
                        json: q.body.into_boxed_str(),
                        // A new acceptance with a fresh send budget (see `Store::redrive`).
                        accepted_ms: s.clock.wall_ms(),
                        sends: q.sends,
                        unanswered: 0,
                    };
                    let overflow =
                        s.buffer
                            .lock()
                            .push(event, s.config.memory_capacity as usize, false);
                    s.counters
                        .drop(DropReason::MemoryOverflow, overflow.dropped);
                }
                self.flush();
                return Ok(n);
            }
        };
        self.flush();
        Ok(n)
    }

    /// Deletes quarantined events for good. Returns how many.
    pub fn quarantine_purge(&self, selector: &Selector) -> Result<u64> {
        if self.handle.closed.load(Ordering::Relaxed) {
            return Err(Error::ShutDown);
        }
        match &self.shared().store {
            Some(store) => store.with_quarantine(|q| q.purge(selector)),
            None => Ok(lock(&self.shared().memory_quarantine).take(selector).len() as u64),
        }
    }
}

impl Handle {
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
        let on_worker_thread = {
            let rt = lock(&h.runtime);
            match (tokio::runtime::Handle::try_current(), rt.as_ref()) {
                (Ok(current), Some(rt)) => current.id() == rt.handle().id(),
                _ => false,
            }
        };
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
        let result = s.persist().map(|_| ());
        {
            let mut spill = lock(&s.spill);
            spill.stop = true;
        }
        s.spill_cv.notify_all();
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
        if worker_stopped && let Some(store) = &s.store {
            store.release_ownership();
        }
        result
    }
}

impl Drop for Handle {
    fn drop(&mut self) {
        let _ = self.shutdown(Duration::from_secs(2));
    }
}

/// The spill thread: moves overflow to disk so `track()` never waits on SQLite. It wakes when
/// the spill queue starts filling and commits whatever has gathered by then in one go.
fn spiller(s: Arc<Shared>) {
    loop {
        {
            let mut spill = lock(&s.spill);
            while spill.committed >= spill.requested && !spill.stop {
                spill = s.spill_cv.wait(spill).unwrap_or_else(|p| p.into_inner());
            }
            if spill.stop {
                return;
            }
        }
        if s.spill_now().is_err() {
            // The store refused (disk full, I/O error): try again in a second, events stay in memory.
            let spill = lock(&s.spill);
            if !spill.stop {
                let _ = s.spill_cv.wait_timeout(spill, Duration::from_secs(1));
            }
        }
    }
}
