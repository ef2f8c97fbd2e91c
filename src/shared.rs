//! The state every part of a spool shares: the queue (memory, store and the moves between them,
//! owned by [`crate::queue::Queue`]), the counters, the control flags the app's calls set, and
//! the published delivery state. The handle ([`crate::EventSpool`]), the delivery worker and the
//! spiller thread each hold an `Arc` of it.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};

use crate::clock::Clock;
use crate::config::Config;
use crate::control::{Control, DrainRequest};
use crate::error::Result;
use crate::fleet::Fleet;
use crate::observers::Observers;
use crate::queue::Queue;
use crate::state::{DeliveryObserver, DeliveryState, DeliveryStatus, DrainOutcome, Notice};
use crate::stats::Ledger;
use crate::sync::lock;
use crate::transport::Transport;

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

/// How many published statuses `wait_for` can look back over.
pub const RECENT_STATUSES: usize = 64;

pub struct Shared {
    pub config: Config,
    pub api_key: Mutex<Option<String>>,
    pub clock: Arc<dyn Clock>,
    pub transport: Arc<dyn Transport>,
    /// Every pending event, and the moves between memory and the store.
    pub queue: Queue,
    /// Client reports and collector directives (src/fleet).
    pub fleet: Fleet,
    pub counters: Ledger,
    pub next_seq: AtomicU64,
    pub control: Mutex<Control>,
    pub wake: tokio::sync::Notify,
    /// Set by `track()` when `flush_at` is reached, so only the first such call wakes the worker.
    pub flush_at_reached: AtomicBool,
    /// Set by `track()` for a critical event (docs/critical-lane.md): the worker starts a drain
    /// at once and skips the throttle; it clears this before it assembles the next batch, which
    /// then holds the critical events first.
    pub critical_waiting: AtomicBool,
    /// Tracking consent as `track()` checks it; the worker learns changes through `control`.
    /// An atomic, not a lock: every `track()` reads it ([`crate::Consent::to_u8`]).
    pub consent: std::sync::atomic::AtomicU8,
    pub enabled: AtomicBool,
    /// Between the app's "no" and the worker's send (README §Consent): `set_consent` and
    /// `set_enabled` change the flags above under the write side, the worker checks them and
    /// starts its request under the read side ([`Shared::delivery_allowed`]). So once either verb
    /// has returned, no request starts, even one whose batch was already taken; a request
    /// already on the wire may finish. Held for microseconds, never across an `await`.
    pub send_gate: parking_lot::RwLock<()>,
    /// A request of the worker is on the wire, or its answer not yet applied: set when the
    /// transport takes it (under [`Shared::send_gate`]), cleared once the worker moves on (waits
    /// or takes the next batch). A denial reads it under the gate: false means the batch the
    /// worker holds (taken, or held for its retry) will never go, so the denial deletes it
    /// too, and no answer can count it delivered afterwards.
    pub on_wire: AtomicBool,
    /// The seqs of the events in that request, set with `on_wire`: a denial spares these, not
    /// what the worker holds beside them.
    pub wire_seqs: Mutex<Vec<u64>>,
    /// A denial's deletion has not finished (a store error, a reader holding the WAL): nothing
    /// is sent, the worker tries again, and a new grant first finishes it.
    pub discard_owed: AtomicBool,
    /// Serializes `set_consent` and `set_enabled` calls, so the store's record, the flag
    /// `track()` checks and the worker's view end in the same state; the worker's own deletion
    /// for a denial runs under it too, so it never runs after a new grant (README §Consent).
    pub consent_verb: Mutex<()>,
    pub state: Mutex<StateCell>,
    pub state_changed: Condvar,
    pub observers: Arc<Observers>,
    pub shutdown: tokio::sync::watch::Sender<bool>,
    /// Seeds the worker's retry and probe jitter (tests and simulations replay a run); `None`
    /// draws from the system.
    pub jitter_seed: Option<u64>,
    /// Notices the queue raised while it held a lock (the spill lock, mostly), and notices
    /// raised inside an observer, waiting for [`Shared::deliver_notices`] outside any lock.
    pub deferred_notices: Arc<Mutex<Vec<Notice>>>,
    /// The callers of `deliver_within` waiting for their outcome, by request number: the
    /// worker answers each once; dropping a sender (shutdown) wakes its caller with an error.
    pub drains: Mutex<Drains>,
    /// The moment between taking a batch and sending it, as a simulation steps it
    /// ([`crate::testing::Stepper`]).
    #[cfg(feature = "test-util")]
    pub take_point: crate::take_point::TakePoint,
}

/// The bounded drains waiting for an outcome (see [`Shared::drains`]).
#[derive(Default)]
pub struct Drains {
    pub next_id: u64,
    pub waiting: Vec<(DrainRequest, std::sync::mpsc::Sender<DrainOutcome>)>,
}

thread_local! {
    /// Set while this thread runs an app observer, so a notice its own calls raise (a
    /// `persist()` on a full disk from `on_notice`) is not handed back to it in a loop.
    static IN_OBSERVER: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

impl Shared {
    /// The seqs of the worker's request on the wire, when there is one. The verbs read it under
    /// the send gate, so no request starts meanwhile.
    pub fn request_on_wire(&self) -> Option<Vec<u64>> {
        self.on_wire
            .load(Ordering::SeqCst)
            .then(|| lock(&self.wire_seqs).clone())
    }

    /// The counters with the queue's sizes and the fleet loop's counts filled in.
    pub fn full_stats(&self) -> crate::stats::Stats {
        let mut stats = self.counters.snapshot();
        self.queue.fill_stats(&mut stats);
        (stats.directives_applied, stats.directives_ignored) = self.fleet.directive_counts();
        stats.directive = self
            .fleet
            .in_force(self.clock.now_ms(), self.clock.wall_ms());
        stats
    }

    /// Whether a request may start now: consent granted and not opted out. Read under
    /// [`Shared::send_gate`] by the one place that starts requests (the worker).
    pub fn delivery_allowed(&self) -> bool {
        self.enabled.load(Ordering::SeqCst)
            && crate::Consent::from_u8(self.consent.load(Ordering::SeqCst))
                == crate::Consent::Granted
    }

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
        c.drains.clear();
        c.consent_changed = false;
        snapshot
    }

    /// Hands a bounded drain its outcome; its caller may have gone (shutdown), then nothing.
    pub fn finish_drain(&self, id: u64, outcome: DrainOutcome) {
        let mut drains = lock(&self.drains);
        if let Some(at) = drains.waiting.iter().position(|(r, _)| r.id == id) {
            let (_, reply) = drains.waiting.swap_remove(at);
            let _ = reply.send(outcome);
        }
    }

    /// After a restart of the worker (a caught panic) its machine knows no drain: ask again for
    /// every one still waiting, so no caller waits for an answer that never comes.
    pub fn reask_drains(&self) {
        let open: Vec<DrainRequest> = lock(&self.drains).waiting.iter().map(|(r, _)| *r).collect();
        if !open.is_empty() {
            self.control(|c| c.drains.extend(open));
        }
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

    /// Delivers the notices the queue raised under its locks. Call it with no lock held; inside
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

    /// Moves everything in memory to the store (see [`crate::EventSpool::persist`]). A refusal
    /// is told to the observers as `StoreUnavailable` before this returns, like a refused
    /// spill: the app that sees `Err` has been told by then.
    pub fn persist(&self) -> Result<u64> {
        let result = self.queue.persist();
        self.deliver_notices();
        result
    }
}
