//! [`EventSpool`], the handle an app holds: `track()` and the few verbs of docs/delivery.md
//! §States. Cheap to clone and share between threads; the last clone to go shuts the spool down.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use futures_util::FutureExt;

use crate::clock::{Clock, SystemClock};
use crate::config::{Config, Durability};
use crate::consent::Consent;
use crate::error::{ConfigError, Error, Result};
use crate::event::{self, EventFields, EventId, NewEvent, Priority, QueuedEvent};
use crate::fleet::{Fleet, Screen};
use crate::observers::{ObserverHandle, Observers};
use crate::quarantine::{ListFilter, QuarantinedEvent, Selector};
use crate::queue::{Queue, QueueParams};
use crate::shared::{Control, DrainRequest, Ledger, Shared, StateCell, lock};
use crate::state::{
    DeferReason, DeliveryConditions, DeliveryObserver, DeliveryState, DeliveryStatus, DrainOutcome,
    Notice,
};
use crate::stats::{DropReason, Entry, Stats};
use crate::transport::Transport;
#[cfg(feature = "reqwest")]
use crate::transport::{ReqwestTransport, TransportError};
use crate::worker;

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
    /// How the store opens its connection (a test's fault point, feature `test-util`).
    faults: crate::queue::FaultPoint,
}

impl SpoolBuilder {
    /// Time source for timers, timestamps and ages (tests inject a `ManualClock`, feature `test-util`).
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

    /// Seeds the retry and probe jitter, so a run on a `ManualClock` (feature `test-util`) can be
    /// replayed exactly. Apps leave it unset: a fleet must not share one sequence of delays.
    pub fn jitter_seed(mut self, seed: u64) -> Self {
        self.jitter_seed = Some(seed);
        self
    }

    /// Opens the store through a fault point that fails the writes a test chooses (see
    /// [`crate::StoreFaults`]). Here rather than in [`Config`], which holds settings that have a
    /// text form: like the clock, it is a collaborator a test hands over.
    #[cfg(feature = "test-util")]
    pub fn store_faults(mut self, faults: crate::StoreFaults) -> Self {
        self.faults = crate::queue::FaultPoint::new(Some(faults));
        self
    }

    pub fn open(self) -> Result<EventSpool> {
        EventSpool::start(self)
    }

    /// Opens the spool without its threads: the delivery worker and the spill run only when the
    /// returned [`crate::testing::Stepper`] steps them, on the caller's thread, so a simulation
    /// under a clock of its own replays exactly from a seed. Feature `test-util`.
    #[cfg(feature = "test-util")]
    pub fn open_stepped(self) -> Result<(EventSpool, crate::testing::Stepper)> {
        EventSpool::start_stepped(self)
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
    /// Serializes `set_consent` calls, so the store's record, the flag `track()` checks and the
    /// worker's view end in the same state.
    consent_verb: Mutex<()>,
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
            faults: Default::default(),
        }
    }

    /// Everything of an open but the threads: the store opened, the decisions it records read
    /// back, the shared state built.
    fn build_shared(b: SpoolBuilder) -> Result<Arc<Shared>> {
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
                    .map_err(|source: TransportError| Error::HttpClient { source })?,
            ),
        };
        let counters = Ledger::default();
        let deferred_notices = Arc::new(Mutex::new(Vec::new()));
        let params = QueueParams::of(&config);
        let (queue, restored, next_seq, recovered, unfinished_denial) = match &config.db_path {
            Some(path) => {
                let opened = Queue::open_with(
                    path,
                    config.max_disk_bytes,
                    clock.wall_ms(),
                    params,
                    counters.clone(),
                    deferred_notices.clone(),
                    b.faults,
                )?;
                (
                    opened.queue,
                    opened.restored,
                    opened.next_seq,
                    opened.recovered,
                    opened.unfinished_denial,
                )
            }
            None => (
                Queue::in_memory(params, counters.clone(), deferred_notices.clone()),
                0,
                1,
                None,
                None,
            ),
        };
        // What the app last decided outlives a restart; the config only says where a store
        // without a record (or a memory-only spool) starts, and that start is recorded at once:
        // events kept under `pending` are never sent because a later config says `granted`,
        // only after `set_consent(Granted)`.
        let consent = match queue.stored_consent()? {
            Some(recorded) => recorded,
            None => {
                queue.store_consent(config.consent)?;
                config.consent
            }
        };
        // The opt-out likewise, except that either word opts out: the app's own record passed
        // as `enabled = false` opens the spool disabled whatever the store says.
        let enabled = match queue.stored_enabled()? {
            Some(recorded) => recorded && config.enabled,
            None => {
                queue.store_enabled(config.enabled)?;
                config.enabled
            }
        };
        if let Some(e) = &unfinished_denial {
            tracing::error!(error = %e, "the recorded denial's deletion did not finish at open; retrying");
        }
        let fleet = Fleet::load(
            &queue,
            config.directives,
            config.retry_after_cap_ms,
            (clock.wall_ms(), clock.now_ms()),
            consent,
        );
        if let Some(seed) = b.jitter_seed {
            fleet.seed_sampling(seed);
        }
        let (shutdown, _) = tokio::sync::watch::channel(false);
        let shared = Arc::new(Shared {
            fleet,
            api_key: Mutex::new(config.api_key.clone()),
            clock,
            transport,
            queue,
            counters,
            next_seq: AtomicU64::new(next_seq),
            control: Mutex::new(Control {
                online: b.online,
                consent,
                enabled,
                ..Control::default()
            }),
            wake: tokio::sync::Notify::new(),
            flush_at_reached: AtomicBool::new(false),
            critical_waiting: AtomicBool::new(false),
            consent: std::sync::atomic::AtomicU8::new(consent.to_u8()),
            enabled: AtomicBool::new(enabled),
            send_gate: parking_lot::RwLock::new(()),
            on_wire: AtomicBool::new(false),
            discard_owed: AtomicBool::new(unfinished_denial.is_some()),
            state: Mutex::new(StateCell {
                state: match consent {
                    _ if !enabled => DeliveryState::Disabled,
                    Consent::Denied => DeliveryState::Disabled,
                    Consent::Pending => DeliveryState::Deferred {
                        reason: DeferReason::Consent,
                    },
                    Consent::Granted if b.online => DeliveryState::Idle,
                    Consent::Granted => DeliveryState::Offline,
                },
                retry_deadline_ms: None,
                last_published: None,
                recent: Default::default(),
                published: 0,
            }),
            state_changed: Condvar::new(),
            observers: Observers::new(b.observers),
            shutdown,
            jitter_seed: b.jitter_seed,
            deferred_notices,
            drains: Mutex::new(Default::default()),
            #[cfg(feature = "test-util")]
            take_point: Default::default(),
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
        Ok(shared)
    }

    fn start(b: SpoolBuilder) -> Result<EventSpool> {
        let shared = EventSpool::build_shared(b)?;
        let spiller = match shared.queue.has_store() {
            true => {
                let s = shared.clone();
                Some(
                    std::thread::Builder::new()
                        .name("eventspool-spill".into())
                        .spawn(move || spiller(s))
                        .map_err(|source| Error::Runtime {
                            what: "the spill thread",
                            source,
                        })?,
                )
            }
            false => None,
        };
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("eventspool-worker")
            .enable_all()
            .build()
            .map_err(|source| Error::Runtime {
                what: "the delivery runtime",
                source,
            })?;
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
                consent_verb: Mutex::new(()),
            }),
        })
    }

    /// A spool whose worker and spill run only when a test steps them (see
    /// [`crate::testing::Stepper`]): no thread, no runtime of its own.
    #[cfg(feature = "test-util")]
    fn start_stepped(b: SpoolBuilder) -> Result<(EventSpool, crate::testing::Stepper)> {
        let shared = EventSpool::build_shared(b)?;
        let (done_tx, done_rx) = std::sync::mpsc::channel();
        let stepper = crate::testing::Stepper::new(shared.clone(), done_tx)?;
        let spool = EventSpool {
            handle: Arc::new(Handle {
                shared,
                runtime: Mutex::new(None),
                worker_done: Mutex::new(Some(done_rx)),
                spiller: Mutex::new(None),
                closed: AtomicBool::new(false),
                admission: parking_lot::RwLock::new(()),
                consent_verb: Mutex::new(()),
            }),
        };
        Ok((spool, stepper))
    }

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

    /// Records an event now. Never waits on disk or network (except with `durability = always`,
    /// which waits for the shared commit that makes it durable, and returns
    /// [`Error::NotDurable`] with the event's id when the store could not take it).
    pub fn track(&self, name: &str, properties: serde_json::Value) -> Result<EventId> {
        self.track_fields(EventFields::new(name, &properties))
    }

    /// Records an event with any of its optional fields set by the caller. A critical event
    /// ([`Priority::Critical`]) is in the store before this returns, as with `durability =
    /// always` (memory-only spools have no store: it is queued first in memory), and starts a
    /// drain at once (docs/critical-lane.md).
    pub fn track_event(&self, event: NewEvent) -> Result<EventId> {
        self.track_fields(event.fields())
    }

    fn track_fields(&self, event: EventFields<'_>) -> Result<EventId> {
        let critical = event.priority == Priority::Critical;
        let accepted = {
            let _admitted = self.handle.admission.read_recursive();
            self.check_accepting()?;
            let queued = self.prepare(event)?;
            let id = queued.id;
            match self.screen(event.name, critical) {
                Screen::Keep => {}
                Screen::Sampled => {
                    self.shared().counters.drop(DropReason::Sampled, 1);
                    return Ok(id);
                }
                Screen::NameDropped => return Err(self.name_dropped(event.name)),
            }
            self.accept(std::iter::once(queued), 1, critical)
                .map(|()| id)
                .map_err(|refusal| Error::NotDurable {
                    event_ids: refusal.event_ids,
                    reason: refusal.reason,
                })
        };
        if critical || self.shared().config.durability == Durability::Always {
            // A refused commit made on this thread is told once the call let go of every lock.
            self.shared().deliver_notices();
        }
        accepted
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
                self.prepare(e.fields())
                    .map_err(|err| Error::InvalidEvent(format!("event {}: {err}", i + 1)))
            })
            .collect::<Result<Vec<_>>>()?;
        let ids: Vec<EventId> = prepared.iter().map(|q| q.id).collect();
        // The collector's directives, by the rule `track()` follows: a refused name refuses the
        // call (here the whole batch, naming the event), a sampled event is left out. What is
        // left out is counted only once the batch is recorded: a refused batch records nothing,
        // and its retry must not count the same events twice.
        let mut kept = Vec::with_capacity(prepared.len());
        let mut sampled = 0;
        for (i, (queued, event)) in prepared.into_iter().zip(events).enumerate() {
            match self.screen(&event.name, queued.critical) {
                Screen::Keep => kept.push(queued),
                Screen::Sampled => sampled += 1,
                Screen::NameDropped => {
                    let refused = self.name_dropped(&event.name);
                    return Err(Error::InvalidEvent(format!("event {}: {refused}", i + 1)));
                }
            }
        }
        let recorded = self.record_batch(kept);
        if !matches!(recorded, Err(Error::BatchRefused(_))) {
            self.shared().counters.drop(DropReason::Sampled, sampled);
        }
        recorded.map(|()| ids)
    }

    /// Records what a `track_batch` kept, all or none (`BatchRefused`).
    fn record_batch(&self, prepared: Vec<QueuedEvent>) -> Result<()> {
        let n = prepared.len() as u64;
        let s = self.shared();
        // A batch holding a critical event is committed whole before the call returns.
        let critical = prepared.iter().any(|q| q.critical);
        if s.config.durability == Durability::Spill && !(critical && s.queue.has_store()) {
            if s.queue.has_store() {
                let first = s.queue.push_batch_spilling(prepared)?;
                self.wake_if_due(first);
                return Ok(());
            }
            if n > s.config.memory_capacity {
                return Err(Error::BatchRefused(format!(
                    "{n} events are more than memory_capacity ({}) holds, and without a \
                     db_path there is no store to spill to; split the batch",
                    s.config.memory_capacity
                )));
            }
        }
        match self.accept(prepared, n, critical) {
            Ok(()) => Ok(()),
            // Names the events that are only in memory; the others are on disk.
            Err(refusal) => Err(Error::NotDurable {
                event_ids: refusal.event_ids,
                reason: refusal.reason,
            }),
        }
    }

    /// What the collector's directive in force (src/fleet) says of a new event named `name`;
    /// the critical lane is always kept. Counts nothing: the callers count what they record.
    fn screen(&self, name: &str, critical: bool) -> Screen {
        let s = self.shared();
        s.fleet.screen(name, critical, || s.clock.now_ms())
    }

    /// A name `drop_names` refuses, counted (one refusal per call): the error `track()` gives.
    fn name_dropped(&self, name: &str) -> Error {
        self.shared().counters.drop(DropReason::NameDropped, 1);
        Error::InvalidEvent(format!(
            "name {:?} is refused by the collector's drop_names directive",
            event::truncate(name, 64)
        ))
    }

    fn check_accepting(&self) -> Result<()> {
        if self.handle.closed.load(Ordering::Relaxed) {
            return Err(Error::ShutDown);
        }
        if !self.shared().enabled.load(Ordering::Relaxed) {
            return Err(Error::Disabled);
        }
        if Consent::from_u8(self.shared().consent.load(Ordering::SeqCst)) == Consent::Denied {
            return Err(Error::ConsentDenied);
        }
        Ok(())
    }

    fn prepare(&self, event: EventFields<'_>) -> Result<QueuedEvent> {
        let s = self.shared();
        event::prepare(
            event,
            s.clock.wall_ms(),
            s.next_seq(),
            s.config.max_event_bytes,
        )
    }

    /// Queues validated events and wakes the worker when a flush trigger is reached, or at once
    /// for a critical event. The events are queued either way; `Err` (only with `durability =
    /// always` or a critical event) says why they are not in the store.
    fn accept(
        &self,
        events: impl IntoIterator<Item = QueuedEvent>,
        n: u64,
        critical: bool,
    ) -> std::result::Result<(), crate::queue::Refusal> {
        let s = self.shared();
        if n == 0 {
            return Ok(());
        }
        // The first pending event arms the worker's periodic flush (an idle worker with nothing
        // to send sleeps without a deadline).
        let first = s.counters.entered(Entry::Tracked, n) == 0;
        let durably = s.config.durability == Durability::Always || critical;
        let durable = if durably && s.queue.has_store() {
            s.queue.push_durably(events)
        } else {
            for event in events {
                s.queue.push(event);
            }
            Ok(())
        };
        if critical {
            s.critical_waiting.store(true, Ordering::SeqCst);
            s.wake.notify_one();
        } else {
            self.wake_if_due(first);
        }
        durable
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

    /// Tells the spool what the platform knows about the device: a metered network, power
    /// saving, a low battery. Where the config says not to deliver under one of them
    /// (`deliver_on_metered`, `deliver_on_low_power`, `deliver_on_battery_low`), the state becomes
    /// `Deferred{reason}`: no attempt, no retry budget spent. When they allow it again, delivery
    /// resumes as after a reconnect (a fresh episode, what is pending goes now).
    pub fn set_conditions(&self, conditions: DeliveryConditions) {
        self.shared().control(|c| c.conditions = conditions);
    }

    /// Runs delivery for at most `budget` (on the spool's clock) and says how it ended: for a
    /// platform's background job (Android `JobService`, iOS `BGTaskScheduler`), which gets a
    /// time budget and reschedules itself from the answer. Blocks the calling thread; never call
    /// it on a UI thread. The worker does the sending, as always, so one request at a time is
    /// in flight however the drain and the app's other triggers overlap; this call only starts
    /// a drain (as `flush()` does, whatever `flush_at` says) and waits for its outcome:
    ///
    /// - [`DrainOutcome::Drained`]: the queue was found empty;
    /// - [`DrainOutcome::DeadlineReached`]: the budget passed with events pending. A request in
    ///   flight at that moment is not abandoned: the answer comes after it (within
    ///   `attempt_timeout_ms` of the link falling silent, at most 12 × `attempt_timeout_ms`
    ///   after it started), so leave at least `attempt_timeout_ms` of the budget unclaimed;
    /// - [`DrainOutcome::RetryAfter`]: the next attempt (a retry, or the slow probe behind
    ///   `WaitingForUser`) falls after the budget; reschedule the job `ms` from now. A retry due
    ///   within the budget is waited for;
    /// - [`DrainOutcome::Blocked`]: `Offline`, `Paused`, `Disabled` or `Deferred`; nothing goes
    ///   until that changes.
    ///
    /// Fails with [`Error::ShutDown`] after (or during) `shutdown()`, and with
    /// [`Error::WrongThread`] from inside a delivery observer (it runs on the worker the drain
    /// waits for).
    pub fn deliver_within(&self, budget: Duration) -> Result<DrainOutcome> {
        if self.handle.on_worker_thread() {
            return Err(Error::WrongThread(
                "deliver_within() from a delivery observer would wait for the thread it runs on"
                    .into(),
            ));
        }
        let s = self.shared();
        let (reply, outcome) = std::sync::mpsc::channel();
        {
            // Registered under admission, so a shutdown() either refuses it here or finds it in
            // the registry it empties (which wakes this caller).
            let _admitted = self.handle.admission.read_recursive();
            if self.handle.closed.load(Ordering::Relaxed) {
                return Err(Error::ShutDown);
            }
            let budget_ms = u64::try_from(budget.as_millis()).unwrap_or(u64::MAX);
            let mut drains = lock(&s.drains);
            drains.next_id += 1;
            let request = DrainRequest {
                id: drains.next_id,
                deadline_ms: s.clock.now_ms().saturating_add(budget_ms),
            };
            drains.waiting.push((request, reply));
            drop(drains);
            s.control(|c| c.drains.push(request));
        }
        outcome.recv().map_err(|_| Error::ShutDown)
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
    /// queued stays until [`EventSpool::purge_pending`] or `set_enabled(true)`. Once it has
    /// returned `false`, no request starts (one already on the wire may finish). Recorded in the
    /// store before it returns, so the spool opens disabled after a restart (README §Consent);
    /// an error says the record could not be written, and nothing changed.
    pub fn set_enabled(&self, enabled: bool) -> Result<()> {
        let _admitted = self.admit_verb()?;
        let _one_at_a_time = lock(&self.handle.consent_verb);
        let s = self.shared();
        s.queue.store_enabled(enabled)?;
        // Flag and control together under the gate: a send the worker has not started yet
        // sees `false` and is withheld (README §Consent).
        let _gate = s.send_gate.write();
        s.enabled.store(enabled, Ordering::SeqCst);
        s.control(|c| {
            if c.enabled != enabled {
                c.enabled = enabled;
                c.enabled_changed = true;
            }
        });
        Ok(())
    }

    /// Tracking consent (README §Consent). `Pending`: events are recorded and stored, nothing
    /// is sent (state `Deferred{Consent}`). `Granted`: the backlog and everything after are
    /// sent. `Denied`: everything kept for the user (queue, quarantine, waiting client reports,
    /// the install id) is deleted, counted `consent_denied`, never sent, and `track()` returns
    /// [`Error::ConsentDenied`]. Once it has returned anything but `Granted`, no request starts
    /// (one already on the wire may finish, and if its events come back unanswered they are
    /// deleted too). The state is recorded in the store before anything else, so it holds after a
    /// restart, and an open whose record says `denied` finishes the deletion first (a memory-only
    /// spool starts from the `consent` setting at each open).
    ///
    /// After `Denied`, `Ok` means no event a `track()` returned `Ok` for is left queued (except
    /// a batch on the wire) and the file keeps none of their bytes. [`Error::WipeIncomplete`]
    /// means the denial is recorded and in force but the deletion did not finish (a store error,
    /// or a reader holding the WAL); it is retried in the background, and a later `Granted` or
    /// `Pending` first finishes it (returning that error, with nothing changed, if it still
    /// cannot).
    pub fn set_consent(&self, consent: Consent) -> Result<()> {
        // Upgradable: held like a verb's shared admission (shutdown() waits for it), and turned
        // into the exclusive one below without letting go.
        let admitted = self.handle.admission.upgradable_read();
        if self.handle.closed.load(Ordering::Relaxed) {
            return Err(Error::ShutDown);
        }
        let _one_at_a_time = lock(&self.handle.consent_verb);
        let s = self.shared();
        if consent != Consent::Denied && s.discard_owed.load(Ordering::SeqCst) {
            // Nothing the last denial covered may go out under a new answer.
            // Denied until now: nothing of the worker is on the wire.
            s.queue
                .discard_for_consent(crate::queue::WAL_TRUNCATE_BOUND, true)
                .map_err(|e| Error::WipeIncomplete(e.to_string()))?;
            s.discard_owed.store(false, Ordering::SeqCst);
        }
        s.queue.store_consent(consent)?;
        #[cfg(feature = "test-util")]
        if consent == Consent::Denied {
            crate::testing::denial_recorded();
        }
        // Whether the worker's batch is on the wire, read under the gate: once consent says no,
        // a batch not on the wire by now never goes, so the denial deletes it with the rest.
        let batch_not_on_wire = {
            // Flag and control together under the gate: a send the worker has not started yet
            // sees the new consent and is withheld, and the worker is told before anything
            // below can fail.
            let _gate = s.send_gate.write();
            s.consent.store(consent.to_u8(), Ordering::SeqCst);
            s.control(|c| {
                if c.consent != consent {
                    c.consent = consent;
                    c.consent_changed = true;
                }
            });
            !s.on_wire.load(Ordering::SeqCst)
        };
        match consent {
            Consent::Denied => {
                // Waits for the track() calls already past their consent check, so their
                // events are queued before the discard below; every later call sees `Denied`.
                // Upgraded, not let go: shutdown() cannot slip in between.
                let all = parking_lot::RwLockUpgradableReadGuard::upgrade(admitted);
                let _admitted = parking_lot::RwLockWriteGuard::downgrade_to_upgradable(all);
                s.fleet.forget_install(&s.full_stats());
                if let Err(e) = s
                    .queue
                    .discard_for_consent(crate::queue::WAL_TRUNCATE_BOUND, batch_not_on_wire)
                {
                    s.discard_owed.store(true, Ordering::SeqCst);
                    s.wake.notify_one();
                    return Err(Error::WipeIncomplete(e.to_string()));
                }
            }
            Consent::Granted => s.fleet.ensure_install(&s.queue, &s.full_stats()),
            Consent::Pending => {}
        }
        Ok(())
    }

    /// The tracking consent in force.
    pub fn consent(&self) -> Consent {
        Consent::from_u8(self.shared().consent.load(Ordering::SeqCst))
    }

    /// Deletes every queued event (memory and store) that is not in flight; returns how many.
    pub fn purge_pending(&self) -> Result<u64> {
        let _admitted = self.admit_verb()?;
        self.shared().queue.purge()
    }

    /// The admission a verb that writes to the store holds for its whole run, as `track()`
    /// does: `shutdown()` waits for it before it persists and lets go of the store, so nothing
    /// of this handle writes after that (a second handle may own the file by then). Refused
    /// once the spool is shut down.
    fn admit_verb(&self) -> Result<parking_lot::RwLockReadGuard<'_, ()>> {
        let admitted = self.handle.admission.read_recursive();
        if self.handle.closed.load(Ordering::Relaxed) {
            return Err(Error::ShutDown);
        }
        Ok(admitted)
    }

    /// The current state, with `retry_in_ms` computed now.
    pub fn state(&self) -> DeliveryStatus {
        self.shared().status()
    }

    /// Registers another observer; it hears the next change. It stays registered while the
    /// returned handle lives: drop it or call [`ObserverHandle::remove`] when the screen that
    /// shows the state goes away (an observer given to [`SpoolBuilder::observer`] stays for the
    /// spool's lifetime instead).
    pub fn add_observer(&self, observer: Arc<dyn DeliveryObserver>) -> ObserverHandle {
        self.shared().observers.add(observer)
    }

    pub fn stats(&self) -> Stats {
        let s = self.shared();
        s.full_stats()
    }

    /// The random id this install reports under (128 bits from the OS's generator, made once
    /// and kept in the store; a memory-only spool makes a new one each time it opens). It names
    /// the install, nothing else. `None` while consent is denied: a denial deletes it, and the
    /// next grant makes a new one, so reports from before and after cannot be linked.
    pub fn install_id(&self) -> Option<String> {
        self.shared().fleet.install_id()
    }

    /// Ends the collector's directive in force ([`Stats::directive`]): its `sample_rate`,
    /// `drop_names` and `pause_until` stop holding now (its one-shot actions already ran and are
    /// not run again; a collector that sends it again starts it again). Returns whether one was
    /// in force. To refuse directives for good, set `directives = false`.
    pub fn clear_directive(&self) -> Result<bool> {
        if self.handle.closed.load(Ordering::Relaxed) {
            return Err(Error::ShutDown);
        }
        let s = self.shared();
        let was = s.fleet.clear(&s.queue, s.clock.now_ms());
        // The worker learns the pause ended at its next turn.
        s.wake.notify_one();
        Ok(was)
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
        self.shared().queue.quarantine_list(filter)
    }

    pub fn quarantine_get(&self, event_id: &str) -> Result<Option<QuarantinedEvent>> {
        self.shared().queue.quarantine_get(event_id)
    }

    /// Puts quarantined events back in the queue with their original `event_id`; they go out
    /// through the normal throttled batches. Returns how many.
    pub fn quarantine_redrive(&self, selector: &Selector) -> Result<u64> {
        let n = {
            let _admitted = self.admit_verb()?;
            let s = self.shared();
            s.queue
                .redrive(selector, s.clock.wall_ms(), || s.next_seq())?
        };
        self.flush();
        Ok(n)
    }

    /// Deletes quarantined events for good. Returns how many.
    pub fn quarantine_purge(&self, selector: &Selector) -> Result<u64> {
        let _admitted = self.admit_verb()?;
        let s = self.shared();
        let n = s.queue.quarantine_purge(selector)?;
        s.fleet.count_quarantine_purged(n);
        Ok(n)
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
        s.fleet.cut(&s.queue, &s.full_stats());
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

/// The spill thread: see [`Queue::run_spiller`].
fn spiller(s: Arc<Shared>) {
    s.queue.run_spiller(|| s.deliver_notices());
}
