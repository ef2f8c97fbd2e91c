//! Opening a spool: [`SpoolBuilder`] (the collaborators an app or a test supplies), the shared
//! state built from the config and the store, and the threads started over it (or none, for a
//! spool a test steps). Separate from the handle because it runs once, before any verb.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};

use futures_util::FutureExt;

use super::{EventSpool, Handle};
use crate::clock::{Clock, SystemClock};
use crate::config::{Config, Durability};
use crate::consent::Consent;
use crate::control::Control;
use crate::error::{ConfigError, Error, Result};
use crate::fleet::Fleet;
use crate::observers::Observers;
use crate::queue::{OpenedQueue, Queue, QueueParams};
use crate::shared::{Shared, StateCell};
use crate::state::{DeferReason, DeliveryObserver, DeliveryState, Notice};
use crate::stats::Entry;
use crate::stats::Ledger;
use crate::sync::lock;
use crate::transport::Transport;
#[cfg(feature = "reqwest")]
use crate::transport::{ReqwestTransport, TransportError};
use crate::worker;

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
    /// What the store seals new rows with, when a test chooses (feature `test-util`).
    aead: Option<crate::crypto::Aead>,
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

    /// Seals new rows with `aead` instead of the one this CPU runs fastest
    /// ([`crate::crypto::Aead::for_this_cpu`]), so that a test covers both formats, and a store
    /// holding both, on any machine.
    #[cfg(feature = "test-util")]
    pub fn aead(mut self, aead: crate::crypto::Aead) -> Self {
        self.aead = Some(aead);
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
            aead: None,
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
        let counters = Ledger::default();
        let deferred_notices = Arc::new(Mutex::new(Vec::new()));
        let mut params = QueueParams::of(&config);
        if let Some(aead) = b.aead {
            params.aead = aead;
        }
        let open_queue = || -> Result<OpenedQueue> {
            Ok(match &config.db_path {
                Some(path) => Queue::open_with(
                    path,
                    config.max_disk_bytes,
                    clock.wall_ms(),
                    params,
                    counters.clone(),
                    deferred_notices.clone(),
                    b.faults,
                )?,
                None => OpenedQueue {
                    queue: Queue::in_memory(params, counters.clone(), deferred_notices.clone()),
                    restored: 0,
                    next_seq: 1,
                    recovered: None,
                    unfinished_denial: None,
                },
            })
        };
        let (transport, opened): (Arc<dyn Transport>, _) = match b.transport {
            Some(t) => (t, open_queue()),
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
            // The built-in client reads the system's TLS roots, 3-4 ms measured here: it is
            // built on a thread of its own while this one opens the store, so `open()` costs
            // the app's thread the longer of the two instead of both.
            #[cfg(feature = "reqwest")]
            None => {
                let (client, opened) = beside(ReqwestTransport::new, open_queue);
                let client =
                    client.map_err(|source: TransportError| Error::HttpClient { source })?;
                (Arc::new(client), opened)
            }
        };
        let OpenedQueue {
            queue,
            restored,
            next_seq,
            recovered,
            unfinished_denial,
        } = opened?;
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
            wire_seqs: Mutex::new(Vec::new()),
            discard_owed: AtomicBool::new(unfinished_denial.is_some()),
            consent_verb: Mutex::new(()),
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
        // Without the thread the writers checkpoint in their own threads, as a stepped spool's
        // do: slower, never wrong.
        if let Err(e) = shared.queue.checkpoint_in_background() {
            tracing::warn!(error = %e, "no checkpoint thread; checkpoints run in the writing threads");
        }
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
            }),
        };
        Ok((spool, stepper))
    }
}

/// The spill thread: see [`Queue::run_spiller`].
fn spiller(s: Arc<Shared>) {
    s.queue.run_spiller(|| s.deliver_notices());
}

/// Runs `side` on a thread of its own while `main` runs on this one, or after `main` on this
/// one when no thread can be started (a process at its thread limit still opens). `Copy`, as a
/// function item is, so that a thread that could not start leaves it callable here.
#[cfg(feature = "reqwest")]
fn beside<A: Send, B>(side: impl FnOnce() -> A + Send + Copy, main: impl FnOnce() -> B) -> (A, B) {
    std::thread::scope(|scope| {
        let thread = std::thread::Builder::new()
            .name("eventspool-open".into())
            .spawn_scoped(scope, side);
        let b = main();
        let a = match thread {
            Ok(thread) => thread
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic)),
            Err(_) => side(),
        };
        (a, b)
    })
}
