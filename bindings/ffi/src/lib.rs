//! The UniFFI surface that Kotlin, Swift and Python apps see: one object ([`EventSpool`]), a
//! config record named as README §Configuration, plain records for state and stats, two foreign
//! traits ([`DeliveryObserver`], [`HttpTransport`]) and two error enums.
//!
//! This crate only converts: the core stays free of UniFFI types, and every rule lives there.
//! A change here is a breaking change for apps, so it stays small.
//!
//! Panics: every fallible entry point runs under `catch_unwind` and turns a panic into
//! [`SpoolError::Internal`]; the few infallible ones only set flags, and UniFFI's scaffolding
//! catches anything left, so nothing unwinds into foreign code (the crate must not be built
//! with `panic = "abort"`).

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

pub use foreign::{
    DeliveryObserver, HttpTransport, HttpTransportError, ObserverError, TransportRequest,
    TransportResponse,
};
pub use types::{
    AttemptFailure, DeliveryState, DeliveryStatus, NewEvent, PauseReason, QuarantineSelector,
    QuarantinedEvent, SpoolNotice, SpoolStats,
};

use eventspool::config::Config;
use eventspool::error::Error;
use eventspool::quarantine::ListFilter;

/// The errors apps catch (`SpoolException` in Kotlin). Named so it shadows nothing in Kotlin,
/// Swift or Python; messages never hold the API key or an event payload.
#[derive(Debug, PartialEq, Eq, thiserror::Error, uniffi::Error)]
pub enum SpoolError {
    /// A configuration value was refused; `field` is its README §Configuration name.
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
    #[error("storage: {reason}")]
    Storage { reason: String },
    #[error("not found: {reason}")]
    NotFound { reason: String },
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
            Error::Storage(reason) => SpoolError::Storage { reason },
            Error::NotFound(reason) => SpoolError::NotFound { reason },
            Error::BatchRefused(reason) => SpoolError::BatchRefused { reason },
            Error::NotDurable { event_ids, reason } => SpoolError::NotDurable {
                event_ids: event_ids.iter().map(ToString::to_string).collect(),
                reason,
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

/// The configuration of README §Configuration. Every field but `endpoint` is optional: absent means
/// the documented default. `Debug` never shows the API key.
#[derive(Clone, Default, uniffi::Record)]
pub struct SpoolConfig {
    pub endpoint: String,
    #[uniffi(default)]
    pub api_key: Option<String>,
    /// SQLite file (created 0600); absent keeps events in memory only.
    #[uniffi(default)]
    pub db_path: Option<String>,
    #[uniffi(default)]
    pub memory_capacity: Option<u64>,
    #[uniffi(default)]
    pub max_disk_bytes: Option<u64>,
    #[uniffi(default)]
    pub max_event_bytes: Option<u64>,
    #[uniffi(default)]
    pub max_batch_events: Option<u64>,
    #[uniffi(default)]
    pub max_batch_bytes: Option<u64>,
    #[uniffi(default)]
    pub min_batch_interval_ms: Option<u64>,
    #[uniffi(default)]
    pub flush_at: Option<u64>,
    #[uniffi(default)]
    pub flush_interval_ms: Option<u64>,
    #[uniffi(default)]
    pub backoff_base_ms: Option<u64>,
    #[uniffi(default)]
    pub backoff_cap_ms: Option<u64>,
    #[uniffi(default)]
    pub max_auto_attempts: Option<u32>,
    #[uniffi(default)]
    pub max_retry_elapsed_ms: Option<u64>,
    #[uniffi(default)]
    pub probe_base_ms: Option<u64>,
    #[uniffi(default)]
    pub probe_cap_ms: Option<u64>,
    #[uniffi(default)]
    pub attempt_timeout_ms: Option<u64>,
    #[uniffi(default)]
    pub retry_after_cap_ms: Option<u64>,
    #[uniffi(default)]
    pub max_event_age_ms: Option<u64>,
    /// Sends without an answer before an event is quarantined as `max_sends` (default 10).
    #[uniffi(default)]
    pub max_event_sends: Option<u32>,
    #[uniffi(default)]
    pub quarantine_max_events: Option<u64>,
    #[uniffi(default)]
    pub quarantine_retention_ms: Option<u64>,
    /// `"gzip"` (default) or `"none"`.
    #[uniffi(default)]
    pub compression: Option<String>,
    /// `"spill"` (default) or `"always"`.
    #[uniffi(default)]
    pub durability: Option<String>,
    #[uniffi(default)]
    pub allow_insecure_http: Option<bool>,
}

impl std::fmt::Debug for SpoolConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Destructured without `..`, so a new field must be placed here (and thought about).
        let SpoolConfig {
            endpoint,
            api_key,
            db_path,
            memory_capacity,
            max_disk_bytes,
            max_event_bytes,
            max_batch_events,
            max_batch_bytes,
            min_batch_interval_ms,
            flush_at,
            flush_interval_ms,
            backoff_base_ms,
            backoff_cap_ms,
            max_auto_attempts,
            max_retry_elapsed_ms,
            probe_base_ms,
            probe_cap_ms,
            attempt_timeout_ms,
            retry_after_cap_ms,
            max_event_age_ms,
            max_event_sends,
            quarantine_max_events,
            quarantine_retention_ms,
            compression,
            durability,
            allow_insecure_http,
        } = self;
        f.debug_struct("SpoolConfig")
            .field("endpoint", endpoint)
            .field("api_key", &eventspool::config::redacted_key(api_key))
            .field("db_path", db_path)
            .field("memory_capacity", memory_capacity)
            .field("max_disk_bytes", max_disk_bytes)
            .field("max_event_bytes", max_event_bytes)
            .field("max_batch_events", max_batch_events)
            .field("max_batch_bytes", max_batch_bytes)
            .field("min_batch_interval_ms", min_batch_interval_ms)
            .field("flush_at", flush_at)
            .field("flush_interval_ms", flush_interval_ms)
            .field("backoff_base_ms", backoff_base_ms)
            .field("backoff_cap_ms", backoff_cap_ms)
            .field("max_auto_attempts", max_auto_attempts)
            .field("max_retry_elapsed_ms", max_retry_elapsed_ms)
            .field("probe_base_ms", probe_base_ms)
            .field("probe_cap_ms", probe_cap_ms)
            .field("attempt_timeout_ms", attempt_timeout_ms)
            .field("retry_after_cap_ms", retry_after_cap_ms)
            .field("max_event_age_ms", max_event_age_ms)
            .field("max_event_sends", max_event_sends)
            .field("quarantine_max_events", quarantine_max_events)
            .field("quarantine_retention_ms", quarantine_retention_ms)
            .field("compression", compression)
            .field("durability", durability)
            .field("allow_insecure_http", allow_insecure_http)
            .finish()
    }
}

impl TryFrom<SpoolConfig> for Config {
    type Error = SpoolError;

    fn try_from(r: SpoolConfig) -> Result<Config, SpoolError> {
        let mut c = Config::new(r.endpoint);
        c.api_key = r.api_key;
        c.db_path = r.db_path.map(PathBuf::from);
        let numbers: [(&mut u64, Option<u64>); 18] = [
            (&mut c.memory_capacity, r.memory_capacity),
            (&mut c.max_disk_bytes, r.max_disk_bytes),
            (&mut c.max_event_bytes, r.max_event_bytes),
            (&mut c.max_batch_events, r.max_batch_events),
            (&mut c.max_batch_bytes, r.max_batch_bytes),
            (&mut c.min_batch_interval_ms, r.min_batch_interval_ms),
            (&mut c.flush_at, r.flush_at),
            (&mut c.flush_interval_ms, r.flush_interval_ms),
            (&mut c.backoff_base_ms, r.backoff_base_ms),
            (&mut c.backoff_cap_ms, r.backoff_cap_ms),
            (&mut c.max_retry_elapsed_ms, r.max_retry_elapsed_ms),
            (&mut c.probe_base_ms, r.probe_base_ms),
            (&mut c.probe_cap_ms, r.probe_cap_ms),
            (&mut c.attempt_timeout_ms, r.attempt_timeout_ms),
            (&mut c.retry_after_cap_ms, r.retry_after_cap_ms),
            (&mut c.max_event_age_ms, r.max_event_age_ms),
            (&mut c.quarantine_max_events, r.quarantine_max_events),
            (&mut c.quarantine_retention_ms, r.quarantine_retention_ms),
        ];
        for (field, value) in numbers {
            if let Some(v) = value {
                *field = v;
            }
        }
        if let Some(v) = r.max_auto_attempts {
            c.max_auto_attempts = v;
        }
        if let Some(v) = r.max_event_sends {
            c.max_event_sends = v;
        }
        if let Some(v) = r.allow_insecure_http {
            c.allow_insecure_http = v;
        }
        // The textual settings go through the one parser the CLI uses, so the error names the field.
        for (name, value) in [("compression", r.compression), ("durability", r.durability)] {
            if let Some(v) = value {
                c.set(name, &v)
                    .map_err(|e| SpoolError::from(Error::from(e)))?;
            }
        }
        c.validate().map_err(|e| SpoolError::from(Error::from(e)))?;
        Ok(c)
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
        SpoolStats::from_core(core.stats(), self.callback_errors.load(Ordering::Relaxed))
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
        })
    }

    /// Records many events in one call, all or none: `events_jsonl` holds one JSON object per
    /// line (`{"name", "properties"?, "timestamp"?, "event_id"?, "session_id"?}`, the format of
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

    /// Opt-out: `false` stops delivery and makes `track` fail with `TrackingDisabled`.
    pub fn set_enabled(&self, enabled: bool) {
        self.verb(|core| core.set_enabled(enabled));
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

    /// Registers another observer; it hears the next change.
    pub fn add_observer(&self, observer: Arc<dyn DeliveryObserver>) {
        let errors = self.callback_errors.clone();
        self.verb(|core| {
            core.add_observer(Arc::new(foreign::ObserverAdapter { observer, errors }))
        });
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

fn parse_properties(json: &str) -> Result<serde_json::Value, Error> {
    serde_json::from_str(json)
        .map_err(|e| Error::InvalidEvent(format!("properties_json is not valid JSON: {e}")))
}

/// Locks a mutex even if a thread panicked while holding it: the guarded values (the handle,
/// a callback slot) stay consistent at every step, and a poisoned lock must not turn into a
/// second panic at the boundary.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn absent_fields_keep_the_defaults() {
        let c = Config::try_from(SpoolConfig {
            endpoint: "https://x.example/b".into(),
            ..Default::default()
        })
        .unwrap();
        let d = Config::new("https://x.example/b");
        assert_eq!(
            (c.flush_at, c.backoff_cap_ms, c.max_auto_attempts),
            (d.flush_at, d.backoff_cap_ms, d.max_auto_attempts)
        );
    }

    #[test]
    fn max_event_sends_passes_through() {
        let c = Config::try_from(SpoolConfig {
            endpoint: "https://x.example/b".into(),
            max_event_sends: Some(3),
            ..Default::default()
        })
        .unwrap();
        assert_eq!(c.max_event_sends, 3);
    }

    #[test]
    fn bad_config_names_the_field() {
        let bad = SpoolConfig {
            endpoint: "https://x.example".into(),
            flush_at: Some(0),
            ..Default::default()
        };
        match Config::try_from(bad) {
            Err(SpoolError::InvalidConfig { field, .. }) => assert_eq!(field, "flush_at"),
            other => panic!("{other:?}"),
        }
        let bad = SpoolConfig {
            endpoint: "https://x.example".into(),
            compression: Some("zip".into()),
            ..Default::default()
        };
        assert!(
            matches!(Config::try_from(bad), Err(SpoolError::InvalidConfig { field, .. }) if field == "compression")
        );
    }

    /// Regression: a `flush()` made before the worker's first turn used to be swallowed.
    #[cfg(feature = "reqwest")]
    #[test]
    fn flush_right_after_open_delivers() {
        use eventspool_collector::{CollectorConfig, ReferenceCollector};
        let collector = ReferenceCollector::start(CollectorConfig::default()).unwrap();
        for _ in 0..5 {
            let config = SpoolConfig {
                endpoint: collector.url(),
                min_batch_interval_ms: Some(0),
                ..Default::default()
            };
            let spool = EventSpool::new(config, None, None, false).unwrap();
            spool.track("e".into(), "{}".into()).unwrap();
            spool.flush();
            assert!(spool.wait_drained(10_000), "{}", spool.state().summary);
            spool.shutdown(2_000).unwrap();
        }
        assert_eq!(collector.distinct_count(), 5);
    }

    #[test]
    fn debug_never_prints_the_api_key() {
        let record = SpoolConfig {
            endpoint: "https://x.example/b".into(),
            api_key: Some("sk-live-0123456789".into()),
            ..Default::default()
        };
        let text = format!("{record:?} {record:#?}");
        assert!(!text.contains("sk-live-0123456789"), "{text}");
        assert!(text.contains("api_key"), "the field is still shown: {text}");
        let config = Config::try_from(record).unwrap();
        let text = format!("{config:?}");
        assert!(!text.contains("sk-live-0123456789"), "{text}");
    }

    /// The app's transport hands over whatever it read; the adapter keeps the batch's bound and
    /// says when it cut, so a long 2xx is never mistaken for a whole one.
    #[test]
    fn a_foreign_answer_over_the_bound_comes_back_marked_cut() {
        use eventspool::transport::{HttpRequest, Transport, response_bound};
        struct Answers(usize);
        impl foreign::HttpTransport for Answers {
            fn send(
                &self,
                _request: foreign::TransportRequest,
            ) -> Result<foreign::TransportResponse, foreign::HttpTransportError> {
                Ok(foreign::TransportResponse {
                    status: 200,
                    headers: Default::default(),
                    body: vec![b' '; self.0],
                })
            }
        }
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let bound = response_bound(10);
        for (len, cut) in [(bound, false), (bound + 1, true), (10 << 20, true)] {
            let adapter = foreign::TransportAdapter::new(Arc::new(Answers(len)));
            let request = HttpRequest {
                method: "POST".into(),
                url: "https://x.example/b".into(),
                headers: Vec::new(),
                body: Vec::new(),
                timeout: std::time::Duration::from_secs(1),
                max_response_bytes: bound,
            };
            let response = runtime.block_on(adapter.send(request)).unwrap();
            assert_eq!(
                (response.body.len(), response.truncated),
                (len.min(bound), cut),
                "{len}"
            );
        }
    }

    #[test]
    fn panics_become_typed_errors() {
        let r: Result<(), SpoolError> = guard(|| panic!("boom"));
        assert_eq!(
            r,
            Err(SpoolError::Internal {
                reason: "boom".into()
            })
        );
    }
}
