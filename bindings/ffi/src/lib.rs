//! The UniFFI surface that Kotlin, Swift and Python apps see: one object ([`EventSpool`]), a
//! config record named as docs/configuration.md, plain records for state and stats, two foreign
//! traits ([`DeliveryObserver`], [`HttpTransport`]) and two error enums.
//!
//! This crate only converts: the core stays free of UniFFI types, and every rule lives there.
//! A change here is a breaking change for apps, so it stays small.
//!
//! Panics: every fallible entry point runs under `catch_unwind` and turns a panic into
//! [`SpoolError::Internal`]; the few infallible ones only set flags, and UniFFI's scaffolding
//! catches anything left, so nothing unwinds into foreign code (the crate must not be built
//! with `panic = "abort"`).

mod batch;
mod foreign;
mod types;

// The namespace stays `eventspool` (module `uniffi.eventspool` in Kotlin, `eventspool` in
// Python and Swift), whatever this crate is called.
uniffi::setup_scaffolding!("eventspool");

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

pub use batch::{BatchReport, Refusal, RefusedLine};
pub use foreign::{
    DeliveryObserver, HttpTransport, HttpTransportError, ObserverError, TransportRequest,
    TransportResponse,
};
pub use types::{
    AttemptFailure, Consent, DeferReason, DeliveryConditions, DeliveryState, DeliveryStatus,
    DirectiveInForce, DrainOutcome, EncryptionKey, NewEvent, PauseReason, Priority,
    QuarantineSelector, QuarantinedEvent, SpoolNotice, SpoolStats,
};

use eventspool::ConfigError;
use eventspool::Error;
use eventspool::ListFilter;
use eventspool::{Compression, Config, Durability, EncryptionKeys, SettingValue};

/// The errors apps catch (`SpoolException` in Kotlin). Named so it shadows nothing in Kotlin,
/// Swift or Python; messages never hold the API key or an event payload.
#[derive(Debug, PartialEq, Eq, thiserror::Error, uniffi::Error)]
pub enum SpoolError {
    /// A configuration value was refused; `field` is its docs/configuration.md name.
    #[error("invalid configuration: {field}: {reason}")]
    InvalidConfig { field: String, reason: String },
    /// The event was refused at `track` (bad name, properties not a JSON object, bad id...).
    #[error("invalid event: {reason}")]
    InvalidEvent { reason: String },
    #[error("event is {size} bytes serialized, over max_event_bytes ({limit})")]
    EventTooLarge { size: u64, limit: u64 },
    /// `set_enabled(false)` is in force.
    #[error("tracking is disabled")]
    TrackingDisabled,
    #[error("the spool is shut down")]
    ShutDown,
    /// Tracking consent is `Denied`: nothing is recorded.
    #[error("tracking consent is denied: the event was not recorded")]
    ConsentDenied,
    /// `set_consent(Denied)` is recorded and in force (nothing is sent), but deleting what was
    /// kept did not finish (`reason` says what is left); the spool retries in the background.
    #[error("consent denied and in force, but the kept data is not deleted yet: {reason}")]
    WipeIncomplete { reason: String },
    #[error("storage: {reason}")]
    Storage { reason: String },
    /// The built-in HTTP client could not be set up; pass your own `HttpTransport`.
    #[error("HTTP client: {reason}")]
    HttpClient { reason: String },
    /// The system refused a thread or the delivery runtime at open; `reason` names which.
    #[error("cannot start: {reason}")]
    Runtime { reason: String },
    /// The store holds rows sealed with key `key_id`, and `encryption_keys` does not supply
    /// it or supplies another key under that id. Nothing was opened and the store is left as it
    /// is: open again with the right key.
    #[error("encryption key id {key_id}: {reason}")]
    EncryptionKey { key_id: u32, reason: String },
    #[error("not found: {reason}")]
    NotFound { reason: String },
    /// A blocking call made where it would wait for itself: `deliver_within` from inside a
    /// `DeliveryObserver` callback (it runs on the worker the drain needs).
    #[error("called on the wrong thread: {reason}")]
    WrongThread { reason: String },
    /// A `track_batch` that could not be recorded whole (larger than memory without a store, or
    /// the store refused what memory could not hold); nothing of it was recorded.
    #[error("batch refused, nothing recorded: {reason}")]
    BatchRefused { reason: String },
    /// `durability = always` could not put these events in the store (disk full, I/O error).
    /// They are queued in memory and will be delivered (at most max(memory_capacity, 10,000) of
    /// them, the oldest beyond that dropped as `memory_overflow`); a crash before the store
    /// recovers loses them.
    #[error("tracked in memory only, not durable: {reason}")]
    NotDurable {
        event_ids: Vec<String>,
        reason: String,
    },
    /// A bug in the SDK was caught at the boundary; the app keeps running.
    #[error("internal error: {reason}")]
    Internal { reason: String },
}

impl From<Error> for SpoolError {
    fn from(e: Error) -> Self {
        match e {
            Error::Config(c) => SpoolError::InvalidConfig {
                field: c.field,
                reason: c.reason,
            },
            Error::InvalidEvent(reason) => SpoolError::InvalidEvent { reason },
            Error::EventTooLarge { size, limit } => SpoolError::EventTooLarge { size, limit },
            Error::Disabled => SpoolError::TrackingDisabled,
            Error::ShutDown => SpoolError::ShutDown,
            Error::ConsentDenied => SpoolError::ConsentDenied,
            Error::WipeIncomplete(reason) => SpoolError::WipeIncomplete { reason },
            Error::Storage(reason) => SpoolError::Storage { reason },
            e @ Error::HttpClient { .. } => SpoolError::HttpClient {
                reason: e.to_string(),
            },
            Error::Runtime { what, source } => SpoolError::Runtime {
                reason: format!("{what}: {source}"),
            },
            Error::NotFound(reason) => SpoolError::NotFound { reason },
            Error::WrongThread(reason) => SpoolError::WrongThread { reason },
            Error::EncryptionKey { key_id, reason } => SpoolError::EncryptionKey { key_id, reason },
            Error::BatchRefused(reason) => SpoolError::BatchRefused { reason },
            Error::NotDurable { event_ids, reason } => SpoolError::NotDurable {
                event_ids: event_ids.iter().map(ToString::to_string).collect(),
                reason,
            },
            // An error this surface has no variant for yet still arrives, with its message.
            other => SpoolError::Internal {
                reason: other.to_string(),
            },
        }
    }
}

/// Runs an entry point so that neither a core error nor a panic escapes untyped.
fn guard<T>(f: impl FnOnce() -> Result<T, Error>) -> Result<T, SpoolError> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(result) => result.map_err(SpoolError::from),
        Err(panic) => {
            let reason = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "panic".into());
            Err(SpoolError::Internal { reason })
        }
    }
}

/// For the verbs that only set a flag: a panic there is logged and swallowed.
fn quietly(f: impl FnOnce()) {
    if catch_unwind(AssertUnwindSafe(f)).is_err() {
        tracing::error!("panic in an FFI call; contained");
    }
}

/// Generates the FFI config record from the one table of settings (`config_table!` in
/// config.rs): every field but the required one is optional, absent meaning the default.
macro_rules! define_spool_config {
    (
        required { $(#[$rmeta:meta])* $req:ident: $rty:ty; }
        optional { $( $(#[$meta:meta])* $name:ident: $ty:ty = $default:expr, ffi $fty:ty, $show:ident; )* }
    ) => {
        /// The configuration of docs/configuration.md. Every field but `endpoint` is optional:
        /// absent means the documented default. `Debug` never shows the API key.
        #[derive(Clone, Default, uniffi::Record)]
        pub struct SpoolConfig {
            $(#[$rmeta])*
            pub $req: $rty,
            $( $(#[$meta])* #[uniffi(default)] pub $name: Option<$fty>, )*
        }

        impl std::fmt::Debug for SpoolConfig {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.debug_struct("SpoolConfig")
                    .field(stringify!($req), &self.$req)
                    $( .field(stringify!($name), eventspool::config_shown!($show, &self.$name)) )*
                    .finish()
            }
        }

        impl TryFrom<SpoolConfig> for Config {
            type Error = SpoolError;

            fn try_from(r: SpoolConfig) -> Result<Config, SpoolError> {
                let mut c = Config::new(r.$req);
                $(
                    if let Some(v) = r.$name {
                        c.$name = FromRecord::from_record(stringify!($name), v)
                            .map_err(|e| SpoolError::from(Error::from(e)))?;
                    }
                )*
                c.validate().map_err(|e| SpoolError::from(Error::from(e)))?;
                Ok(c)
            }
        }
    };
}

eventspool::config_table!(define_spool_config);

/// How a value the app put in [`SpoolConfig`] becomes the core setting. Numbers and flags pass
/// through; the textual enums go through the parser the CLI uses, so the error names the field.
trait FromRecord<F>: Sized {
    fn from_record(name: &str, value: F) -> Result<Self, ConfigError>;
}

macro_rules! passes_through {
    ($($t:ty),*) => {
        $(impl FromRecord<$t> for $t {
            fn from_record(_: &str, value: $t) -> Result<Self, ConfigError> {
                Ok(value)
            }
        })*
    };
}
passes_through!(u64, u32, bool);

/// An API key is taken as given (an empty one is refused by validation, not made "none").
impl FromRecord<String> for Option<String> {
    fn from_record(_: &str, value: String) -> Result<Self, ConfigError> {
        Ok(Some(value))
    }
}

impl FromRecord<String> for Option<PathBuf> {
    fn from_record(_: &str, value: String) -> Result<Self, ConfigError> {
        Ok(Some(PathBuf::from(value)))
    }
}

/// Keys as bytes (from Android Keystore, iOS Keychain); a key of the wrong length is refused,
/// naming its id.
impl FromRecord<Vec<EncryptionKey>> for EncryptionKeys {
    fn from_record(_: &str, value: Vec<EncryptionKey>) -> Result<Self, ConfigError> {
        EncryptionKeys::from_slices(value.iter().map(|k| (k.key_id, k.key.as_slice())))
    }
}

impl FromRecord<String> for Compression {
    fn from_record(name: &str, value: String) -> Result<Self, ConfigError> {
        SettingValue::parse(name, &value)
    }
}

impl FromRecord<String> for Durability {
    fn from_record(name: &str, value: String) -> Result<Self, ConfigError> {
        SettingValue::parse(name, &value)
    }
}

impl FromRecord<String> for eventspool::Consent {
    fn from_record(name: &str, value: String) -> Result<Self, ConfigError> {
        SettingValue::parse(name, &value)
    }
}

/// The spool an app holds for its lifetime. Every method returns at once (none waits on the
/// network) except `shutdown` and `wait_drained`, which wait at most as long as told.
/// `shutdown` (or Kotlin `close()`/`use {}`, or dropping it in Swift/Python) stops delivery,
/// persists what is in memory and releases the store file, so another spool may open it.
#[derive(uniffi::Object)]
pub struct EventSpool {
    handle: Mutex<Handle>,
    callback_errors: Arc<AtomicU64>,
}

enum Handle {
    Open(eventspool::EventSpool),
    /// After shutdown: dropping the core handle is what closes the store and its lock; the
    /// final state and stats stay so a UI can still render them.
    Closed(Box<(DeliveryStatus, SpoolStats)>),
}

impl EventSpool {
    /// A clone of the core handle (cheap), so no lock is held while the core works; after
    /// shutdown, the final state and stats.
    fn current(&self) -> Result<eventspool::EventSpool, Box<(DeliveryStatus, SpoolStats)>> {
        match &*lock(&self.handle) {
            Handle::Open(core) => Ok(core.clone()),
            Handle::Closed(last) => Err(last.clone()),
        }
    }

    fn core(&self) -> Option<eventspool::EventSpool> {
        self.current().ok()
    }

    fn with_core<T>(
        &self,
        f: impl FnOnce(&eventspool::EventSpool) -> Result<T, Error>,
    ) -> Result<T, SpoolError> {
        guard(|| f(&self.core().ok_or(Error::ShutDown)?))
    }

    fn verb(&self, f: impl FnOnce(&eventspool::EventSpool)) {
        if let Some(core) = self.core() {
            quietly(|| f(&core));
        }
    }

    fn stats_of(&self, core: &eventspool::EventSpool) -> SpoolStats {
        SpoolStats::from_core(
            core.stats(),
            self.callback_errors.load(Ordering::Relaxed),
            core.install_id(),
        )
    }
}

#[uniffi::export]
impl EventSpool {
    /// Opens the spool (and its store, when `db_path` is set). `transport` replaces the built-in
    /// HTTP client with the app's; `observer` sees the very first state; `start_offline` makes
    /// no attempt until `set_online(true)`.
    #[uniffi::constructor(default(transport = None, observer = None, start_offline = false))]
    pub fn new(
        config: SpoolConfig,
        transport: Option<Arc<dyn HttpTransport>>,
        observer: Option<Arc<dyn DeliveryObserver>>,
        start_offline: bool,
    ) -> Result<Arc<EventSpool>, SpoolError> {
        let config = Config::try_from(config)?;
        let callback_errors = Arc::new(AtomicU64::new(0));
        let errors = callback_errors.clone();
        let inner = guard(move || {
            let mut builder = eventspool::EventSpool::builder(config);
            if let Some(t) = transport {
                builder = builder.transport(Arc::new(foreign::TransportAdapter::new(t)));
            }
            if let Some(o) = observer {
                builder = builder.observer(Arc::new(foreign::ObserverAdapter {
                    observer: o,
                    errors,
                }));
            }
            if start_offline {
                builder = builder.start_offline();
            }
            builder.open()
        })?;
        Ok(Arc::new(EventSpool {
            handle: Mutex::new(Handle::Open(inner)),
            callback_errors,
        }))
    }

    /// Records an event; `properties_json` must be a JSON object. Returns its `event_id`.
    pub fn track(&self, name: String, properties_json: String) -> Result<String, SpoolError> {
        self.track_event(NewEvent {
            name,
            properties_json,
            event_id: None,
            timestamp: None,
            session_id: None,
            priority: None,
        })
    }

    /// Records many events in one call, all or none: `events_jsonl` holds one JSON object per
    /// line (`{"name", "properties"?, "timestamp"?, "event_id"?, "session_id"?, "priority"?}`, the format of
    /// `eventspool send`). A bad line is named by its number and nothing is recorded. Returns
    /// how many were recorded. Each call across the FFI costs microseconds in the generated
    /// glue, so a scripting host that tracks at a high rate batches here.
    pub fn track_batch(&self, events_jsonl: String) -> Result<u64, SpoolError> {
        self.with_core(|core| {
            let mut events = Vec::new();
            for (i, line) in events_jsonl.lines().enumerate() {
                if let Some(event) = eventspool::NewEvent::from_numbered_line(i + 1, line)
                    .map_err(Error::InvalidEvent)?
                {
                    events.push(event);
                }
            }
            core.track_batch(&events).map(|ids| ids.len() as u64)
        })
    }

    /// Records an event with its optional fields set by the caller. Returns its `event_id`.
    pub fn track_event(&self, event: NewEvent) -> Result<String, SpoolError> {
        self.with_core(|spool| {
            let properties = parse_properties(&event.properties_json)?;
            let core = eventspool::NewEvent {
                name: event.name,
                properties,
                event_id: event.event_id,
                timestamp: event.timestamp,
                session_id: event.session_id,
                priority: event.priority.map(Into::into).unwrap_or_default(),
            };
            spool.track_event(core).map(|id| id.to_string())
        })
    }

    /// Whether the device has a network; going online sends what is pending.
    pub fn set_online(&self, online: bool) {
        self.verb(|core| core.set_online(online));
    }

    /// Whether the app is in the foreground (call it from the lifecycle callbacks); coming back
    /// starts a fresh failure episode, so a retry or a `WaitingForUser` sends again at once.
    pub fn set_foreground(&self, foreground: bool) {
        self.verb(|core| core.set_foreground(foreground));
    }

    /// What the platform knows about the device (metered network, power saving, low battery);
    /// call it whenever one changes. Where the config says not to deliver under one, the state
    /// becomes `Deferred`; when they allow it again delivery resumes as after a reconnect.
    pub fn set_conditions(&self, conditions: DeliveryConditions) {
        self.verb(|core| core.set_conditions(conditions.into()));
    }

    /// Runs delivery for at most `budget_ms` and says how it ended (for a `JobService` or a
    /// `BGTask`: reschedule from the outcome). Blocks the calling thread: never call it on the
    /// UI thread, nor from a `DeliveryObserver` (`WrongThread`). The SDK's worker still does
    /// the sending, one request at a time; a request in flight at the deadline is answered
    /// first (within `attempt_timeout_ms` of the link falling silent, at most 12 times that in
    /// all), so leave at least `attempt_timeout_ms` of the platform's budget.
    pub fn deliver_within(&self, budget_ms: u64) -> Result<DrainOutcome, SpoolError> {
        self.with_core(|core| {
            let outcome = core.deliver_within(Duration::from_millis(budget_ms))?;
            Ok(DrainOutcome::from_core(outcome, core.state().pending))
        })
    }

    /// Sends pending events now.
    pub fn flush(&self) {
        self.verb(|core| core.flush());
    }

    /// "Retry now": skips the countdown, or makes one attempt from `WaitingForUser`.
    pub fn retry_now(&self) {
        self.verb(|core| core.retry_now());
    }

    /// "Back": stop retrying, keep every event.
    pub fn dismiss(&self) {
        self.verb(|core| core.dismiss());
    }

    /// Leaves `Paused`.
    pub fn resume(&self) {
        self.verb(|core| core.resume());
    }

    /// New credentials (or none); leaves `Paused{auth}`.
    pub fn set_api_key(&self, api_key: Option<String>) -> Result<(), SpoolError> {
        self.with_core(|core| core.set_api_key(api_key))
    }

    /// Opt-out: `false` stops delivery and makes `track` fail with `TrackingDisabled`; once it
    /// returned, no request starts. Recorded in the store, so the spool opens disabled after a
    /// restart; fails (nothing changed) when the record cannot be written.
    pub fn set_enabled(&self, enabled: bool) -> Result<(), SpoolError> {
        self.with_core(|core| core.set_enabled(enabled))
    }

    /// Tracking consent (README §Consent): `Pending` keeps events and sends nothing (state
    /// `Deferred{Consent}`), `Granted` sends the backlog, `Denied` deletes what was kept and
    /// makes `track` fail with `ConsentDenied`. Recorded in the store, so it holds after a
    /// restart.
    pub fn set_consent(&self, consent: Consent) -> Result<(), SpoolError> {
        self.with_core(|core| core.set_consent(consent.into()))
    }

    /// The tracking consent in force; after `shutdown`, `ShutDown`.
    pub fn consent(&self) -> Result<Consent, SpoolError> {
        self.with_core(|core| Ok(core.consent().into()))
    }

    /// Ends the collector's directive in force (`SpoolStats.directive`): its `sample_rate`,
    /// `drop_names` and `pause_until` stop holding now. Returns whether one was in force.
    pub fn clear_directive(&self) -> Result<bool, SpoolError> {
        self.with_core(|core| core.clear_directive())
    }

    /// Deletes every queued event not in flight (after an opt-out); returns how many.
    pub fn purge_pending(&self) -> Result<u64, SpoolError> {
        self.with_core(|core| core.purge_pending())
    }

    /// The current state, with the countdown computed now; after `shutdown`, the last one.
    pub fn state(&self) -> DeliveryStatus {
        match self.current() {
            Ok(core) => (&core.state()).into(),
            Err(last) => last.0,
        }
    }

    /// Where every event went; after `shutdown`, the final figures.
    pub fn stats(&self) -> SpoolStats {
        match self.current() {
            Ok(core) => self.stats_of(&core),
            Err(last) => last.1,
        }
    }

    /// Registers another observer; it hears the next change. It stays registered while the
    /// returned handle lives: `remove()` it (Kotlin: `close()`, e.g. in `onDestroy`) or let it
    /// be collected, and the spool lets go of the observer. After `shutdown` nothing is
    /// registered and the handle does nothing.
    pub fn add_observer(&self, observer: Arc<dyn DeliveryObserver>) -> Arc<ObserverHandle> {
        let errors = self.callback_errors.clone();
        let inner = self.core().and_then(|core| {
            catch_unwind(AssertUnwindSafe(|| {
                core.add_observer(Arc::new(foreign::ObserverAdapter { observer, errors }))
            }))
            .ok()
        });
        Arc::new(ObserverHandle {
            inner: Mutex::new(inner),
        })
    }

    /// Blocks up to `timeout_ms` until nothing is pending and delivery is idle. For scripts,
    /// tests and desktop tools; never call it on a UI thread.
    pub fn wait_drained(&self, timeout_ms: u64) -> bool {
        match self.current() {
            Ok(core) => core.wait_drained(Duration::from_millis(timeout_ms)),
            Err(last) => last.0.pending == 0,
        }
    }

    /// Writes what is in memory to the store: call it when the app goes to the background.
    pub fn persist(&self) -> Result<u64, SpoolError> {
        self.with_core(|core| core.persist())
    }

    /// Stops delivery (waiting at most `timeout_ms` for a request in flight), persists what is
    /// in memory and releases the store. Later calls fail with `ShutDown` (`state` and `stats`
    /// keep answering with the final figures); calling it twice is fine.
    pub fn shutdown(&self, timeout_ms: u64) -> Result<(), SpoolError> {
        let Some(core) = self.core() else {
            return Ok(());
        };
        let result = guard(|| core.shutdown(Duration::from_millis(timeout_ms)));
        let last = Handle::Closed(Box::new(((&core.state()).into(), self.stats_of(&core))));
        *lock(&self.handle) = last;
        // Our handle goes last, which closes the store (unless a call still running holds a
        // clone; then it closes as that call returns).
        drop(core);
        result
    }

    /// Quarantined events, oldest first; `limit` 0 means all.
    #[uniffi::method(default(reason = None, offset = 0, limit = 0))]
    pub fn quarantine_list(
        &self,
        reason: Option<String>,
        offset: u64,
        limit: u64,
    ) -> Result<Vec<QuarantinedEvent>, SpoolError> {
        self.with_core(|core| {
            let filter = ListFilter {
                reason,
                offset,
                limit,
            };
            Ok(core
                .quarantine_list(&filter)?
                .into_iter()
                .map(QuarantinedEvent::from)
                .collect())
        })
    }

    pub fn quarantine_get(&self, event_id: String) -> Result<Option<QuarantinedEvent>, SpoolError> {
        self.with_core(|core| Ok(core.quarantine_get(&event_id)?.map(QuarantinedEvent::from)))
    }

    /// Puts quarantined events back in the queue with their original ids; returns how many.
    pub fn quarantine_redrive(&self, selector: QuarantineSelector) -> Result<u64, SpoolError> {
        self.with_core(|core| core.quarantine_redrive(&selector.into()))
    }

    /// Deletes quarantined events for good; returns how many.
    pub fn quarantine_purge(&self, selector: QuarantineSelector) -> Result<u64, SpoolError> {
        self.with_core(|core| core.quarantine_purge(&selector.into()))
    }
}

/// What `add_observer` returns. Dropping it (Kotlin `close()`, Swift or Python releasing the
/// last reference, or the foreign GC collecting it) or calling `remove()` unregisters the
/// observer, and the spool drops its reference to the foreign object.
#[derive(uniffi::Object)]
pub struct ObserverHandle {
    inner: Mutex<Option<eventspool::ObserverHandle>>,
}

#[uniffi::export]
impl ObserverHandle {
    /// Unregisters the observer now; no call to it begins after this returns. Safe from inside
    /// its own callback; calling it again does nothing.
    pub fn remove(&self) {
        // Taken out of the lock first: dropping the core handle releases the foreign observer,
        // which runs foreign code.
        let inner = lock(&self.inner).take();
        quietly(|| drop(inner));
    }
}

fn parse_properties(json: &str) -> Result<serde_json::Value, Error> {
    serde_json::from_str(json).map_err(|e| {
        // Python's json.dumps and JavaScript-ish encoders write these for a float that is not
        // a number; serde only says "expected value": name the value, which is what to fix.
        let non_number = non_finite_at(json, &e)
            .map(|word| format!(" ({word} is not a JSON number: send null or a string)"))
            .unwrap_or_default();
        Error::InvalidEvent(format!(
            "properties_json is not valid JSON: {e}{non_number}"
        ))
    })
}

/// `NaN`, `Infinity` or `-Infinity` where serde's syntax error points, if that is what stands there.
fn non_finite_at(json: &str, e: &serde_json::Error) -> Option<&'static str> {
    if !e.is_syntax() {
        return None;
    }
    let line = json.lines().nth(e.line().checked_sub(1)?)?;
    let start = line.char_indices().nth(e.column().checked_sub(1)?)?.0;
    // serde points at the first byte it could not take: the value's start, or just after a '-'.
    let from = if start > 0 && line[..start].ends_with('-') {
        start - 1
    } else {
        start
    };
    let rest = &line[from..];
    ["-Infinity", "Infinity", "NaN"]
        .into_iter()
        .find(|word| rest.starts_with(word))
}

/// Locks a mutex even if a thread panicked while holding it: the guarded values (the handle,
/// a callback slot) stay consistent at every step, and a poisoned lock must not turn into a
/// second panic at the boundary.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests;
