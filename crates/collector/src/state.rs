//! Everything the server thread and the test-facing handle share: the event store, the
//! script queue, the behaviour and the request log, under one mutex.
//!
//! One lock is enough: every critical section is short (a batch insert is well under a
//! millisecond), and one lock means a test never sees a request recorded but its events not
//! yet stored, or the reverse. What the service's bounds count (requests and bytes in flight,
//! draining) is outside it, in atomics and a semaphore.

use std::collections::VecDeque;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use rusqlite::{Connection, OptionalExtension, params};

use super::auth::ApiKeys;
use super::fleet::{Counts, FleetBook, FleetTotals};
use super::limits::Limits;
use super::metrics::Metrics;
use super::sink::Sink;
use super::wire::WireEvent;
use super::{Behavior, CollectorConfig, RequestRecord, Scripted, StoredEvent};

/// Distinct events by `event_id`, in SQLite because that is what a real collector would
/// dedup with, and because a file-backed store lets the CLI's collector survive restarts.
pub(super) struct Store {
    conn: Connection,
    distinct: u64,
    next_arrival: i64,
}

impl Store {
    pub(super) fn open(path: Option<&Path>) -> rusqlite::Result<Store> {
        let conn = match path {
            Some(p) => {
                let conn = Connection::open(p)?;
                // WAL + NORMAL: a collector on disk should not fsync per batch.
                conn.query_row("PRAGMA journal_mode=WAL", [], |_| Ok(()))?;
                conn.execute_batch("PRAGMA synchronous=NORMAL;")?;
                conn
            }
            None => Connection::open_in_memory()?,
        };
        conn.execute_batch(
            "CREATE TABLE IF NOT EXISTS events (
                event_id TEXT PRIMARY KEY NOT NULL,
                arrival INTEGER NOT NULL,
                name TEXT NOT NULL,
                timestamp TEXT NOT NULL,
                session_id TEXT,
                properties TEXT NOT NULL,
                first_seen_request INTEGER NOT NULL
            );
            CREATE INDEX IF NOT EXISTS events_by_arrival ON events(arrival);",
        )?;
        let (count, max): (i64, i64) = conn.query_row(
            "SELECT COUNT(*), COALESCE(MAX(arrival), 0) FROM events",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )?;
        Ok(Store {
            conn,
            distinct: u64::try_from(count).unwrap_or(0),
            next_arrival: max.saturating_add(1),
        })
    }

    /// Inserts events not seen before, in one transaction; returns (new, duplicates).
    fn insert(&mut self, events: &[&WireEvent], request: usize) -> rusqlite::Result<(u64, u64)> {
        let request = i64::try_from(request).unwrap_or(i64::MAX);
        let mut arrival = self.next_arrival;
        let (mut new, mut dup) = (0u64, 0u64);
        let tx = self.conn.transaction()?;
        {
            let mut stmt = tx.prepare_cached(
                "INSERT OR IGNORE INTO events
                 (event_id, arrival, name, timestamp, session_id, properties, first_seen_request)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
            )?;
            for e in events {
                let changed = stmt.execute(params![
                    e.event_id,
                    arrival,
                    e.name,
                    e.timestamp,
                    e.session_id,
                    e.properties.to_string(),
                    request
                ])?;
                if changed == 1 {
                    new += 1;
                    arrival += 1;
                } else {
                    dup += 1;
                }
            }
        }
        tx.commit()?;
        // Only after the commit: a failed transaction must not move the counters.
        self.distinct += new;
        self.next_arrival = arrival;
        Ok((new, dup))
    }

    fn contains(&self, event_id: &str) -> bool {
        self.conn
            .query_row(
                "SELECT 1 FROM events WHERE event_id = ?1",
                [event_id],
                |_| Ok(()),
            )
            .optional()
            .map(|found| found.is_some())
            .unwrap_or(false)
    }

    fn events(&self) -> rusqlite::Result<Vec<StoredEvent>> {
        let mut stmt = self.conn.prepare(
            "SELECT event_id, name, timestamp, session_id, properties, first_seen_request
             FROM events ORDER BY arrival",
        )?;
        let rows = stmt.query_map([], |r| {
            let properties: String = r.get(4)?;
            let first: i64 = r.get(5)?;
            Ok(StoredEvent {
                event_id: r.get(0)?,
                name: r.get(1)?,
                timestamp: r.get(2)?,
                session_id: r.get(3)?,
                properties: serde_json::from_str(&properties).unwrap_or(serde_json::Value::Null),
                first_seen_request: usize::try_from(first).unwrap_or(0),
            })
        })?;
        rows.collect()
    }
}

struct State {
    store: Store,
    received: u64,
    script: VecDeque<Scripted>,
    behavior: Behavior,
    rng: fastrand::Rng,
    next_index: usize,
    records: VecDeque<RequestRecord>,
    record_limit: usize,
    recorded: usize,
    fleet: FleetBook,
}

pub(super) struct Shared {
    state: Mutex<State>,
    /// Signalled whenever events are stored or a request is recorded, for the wait helpers.
    changed: Condvar,
    /// Where accepted batches go instead of `Store` (a broker); `None` stores locally.
    sink: Option<Box<dyn Sink>>,
    /// POSTs being handled now, and the most there ever were at once: a client that promises
    /// one request in flight is checked against the second.
    in_flight: AtomicUsize,
    max_in_flight: AtomicUsize,
    limits: Limits,
    api_keys: Option<ApiKeys>,
    batch_path: Option<String>,
    /// Set by a drain: readiness fails and answers close their connection.
    draining: AtomicBool,
    /// Bytes of request bodies held now ([`Limits::max_bytes_in_flight`]).
    bytes: Arc<tokio::sync::Semaphore>,
    metrics: Metrics,
}

/// Counts one POST as in flight while it lives (see [`Shared::enter`]).
pub(super) struct InFlight(Arc<Shared>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Shared {
    pub(super) fn new(store: Store, config: &CollectorConfig) -> Shared {
        let behavior = config.behavior.clone();
        let record_limit = config.max_request_records;
        let rng = fastrand::Rng::with_seed(behavior.seed);
        Shared {
            state: Mutex::new(State {
                store,
                received: 0,
                script: VecDeque::new(),
                behavior,
                rng,
                next_index: 0,
                records: VecDeque::new(),
                record_limit,
                recorded: 0,
                fleet: FleetBook::default(),
            }),
            changed: Condvar::new(),
            sink: None,
            in_flight: AtomicUsize::new(0),
            max_in_flight: AtomicUsize::new(0),
            limits: config.limits.clone(),
            api_keys: config.api_keys.clone(),
            batch_path: config.batch_path.clone(),
            draining: AtomicBool::new(false),
            bytes: Arc::new(tokio::sync::Semaphore::new(
                config
                    .limits
                    .max_bytes_in_flight
                    .min(tokio::sync::Semaphore::MAX_PERMITS),
            )),
            metrics: Metrics::new(),
        }
    }

    pub(super) fn limits(&self) -> &Limits {
        &self.limits
    }

    pub(super) fn api_keys(&self) -> Option<&ApiKeys> {
        self.api_keys.as_ref()
    }

    pub(super) fn batch_path(&self) -> Option<&str> {
        self.batch_path.as_deref()
    }

    pub(super) fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    pub(super) fn set_draining(&self) {
        self.draining.store(true, Ordering::SeqCst);
    }

    pub(super) fn draining(&self) -> bool {
        self.draining.load(Ordering::SeqCst)
    }

    /// POSTs being handled now.
    pub(super) fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::SeqCst)
    }

    /// Takes `n` bytes of the in-flight budget, or `None` when they do not fit now.
    pub(super) fn take_bytes(&self, n: usize) -> Option<tokio::sync::OwnedSemaphorePermit> {
        let n = u32::try_from(n.max(1)).unwrap_or(u32::MAX);
        Arc::clone(&self.bytes).try_acquire_many_owned(n).ok()
    }

    /// Bytes of the in-flight budget left.
    pub(super) fn bytes_free(&self) -> usize {
        self.bytes.available_permits()
    }

    /// A POST arrived; it counts as in flight until the guard goes (answered, dropped, or its
    /// connection closed).
    pub(super) fn enter(self: &Arc<Self>) -> InFlight {
        let now = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        self.max_in_flight.fetch_max(now, Ordering::SeqCst);
        InFlight(Arc::clone(self))
    }

    pub(super) fn max_in_flight(&self) -> usize {
        self.max_in_flight.load(Ordering::SeqCst)
    }

    /// Sends accepted batches to `sink` instead of the local store.
    pub(super) fn with_sink(mut self, sink: Box<dyn Sink>) -> Shared {
        self.sink = Some(sink);
        self
    }

    pub(super) fn sink(&self) -> Option<&dyn Sink> {
        self.sink.as_deref()
    }

    /// Counts events a sink vouched for as received, as [`Shared::store`] does for local ones.
    pub(super) fn count_received(&self, events: u64) {
        self.lock().received += events;
        self.changed.notify_all();
    }

    /// A panic while holding the lock (only possible in a test assertion) must not take the
    /// server down with it, so poisoning is ignored.
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Totals the client reports a stored batch carried; returns the ids read.
    pub(super) fn add_reports(&self, reports: &[serde_json::Value]) -> Vec<u64> {
        let mut s = self.lock();
        reports.iter().filter_map(|r| s.fleet.add(r)).collect()
    }

    pub(super) fn fleet_totals(&self) -> FleetTotals {
        self.lock().fleet.totals()
    }

    pub(super) fn fleet_install(&self, install_id: &str) -> Option<Counts> {
        self.lock().fleet.install(install_id)
    }

    pub(super) fn next_index(&self) -> usize {
        let mut s = self.lock();
        let i = s.next_index;
        s.next_index += 1;
        i
    }

    pub(super) fn push_script(&self, items: impl IntoIterator<Item = Scripted>) {
        self.lock().script.extend(items);
    }

    pub(super) fn pop_script(&self) -> Option<Scripted> {
        self.lock().script.pop_front()
    }

    pub(super) fn pending_script(&self) -> usize {
        self.lock().script.len()
    }

    pub(super) fn clear_script(&self) {
        self.lock().script.clear();
    }

    pub(super) fn set_behavior(&self, b: Behavior) {
        let mut s = self.lock();
        s.rng = fastrand::Rng::with_seed(b.seed);
        s.behavior = b;
    }

    pub(super) fn behavior(&self) -> Behavior {
        self.lock().behavior.clone()
    }

    /// Draws from the seeded rng; true means "fail this request".
    pub(super) fn roll_failure(&self, rate: f64) -> bool {
        rate > 0.0 && self.lock().rng.f64() < rate
    }

    /// Stores events and counts them as received; returns (new, duplicates).
    pub(super) fn store(
        &self,
        events: &[&WireEvent],
        request: usize,
    ) -> rusqlite::Result<(u64, u64)> {
        let mut s = self.lock();
        let (new, dup) = s.store.insert(events, request)?;
        s.received += new + dup;
        drop(s);
        self.changed.notify_all();
        Ok((new, dup))
    }

    pub(super) fn record(&self, record: RequestRecord) {
        let mut s = self.lock();
        s.recorded += 1;
        if s.record_limit > 0 {
            if s.records.len() >= s.record_limit {
                s.records.pop_front();
            }
            s.records.push_back(record);
        }
        drop(s);
        self.changed.notify_all();
    }

    pub(super) fn distinct_count(&self) -> u64 {
        self.lock().store.distinct
    }

    pub(super) fn received_count(&self) -> u64 {
        self.lock().received
    }

    pub(super) fn contains(&self, event_id: &str) -> bool {
        self.lock().store.contains(event_id)
    }

    pub(super) fn events(&self) -> Vec<StoredEvent> {
        match self.lock().store.events() {
            Ok(events) => events,
            Err(e) => {
                tracing::warn!(target: "eventspool::collector", error = %e, "reading stored events failed");
                Vec::new()
            }
        }
    }

    pub(super) fn requests(&self) -> Vec<RequestRecord> {
        let mut records: Vec<RequestRecord> = self.lock().records.iter().cloned().collect();
        // Records are appended when a verdict is reached, which a delayed request reaches late.
        records.sort_by_key(|r| r.index);
        records
    }

    pub(super) fn request_count(&self) -> usize {
        self.lock().recorded
    }

    pub(super) fn wait_for_distinct(&self, n: u64, timeout: Duration) -> bool {
        self.wait_until(timeout, |s| s.store.distinct >= n)
    }

    pub(super) fn wait_for_requests(&self, n: usize, timeout: Duration) -> bool {
        self.wait_until(timeout, |s| s.recorded >= n)
    }

    fn wait_until(&self, timeout: Duration, done: impl Fn(&State) -> bool) -> bool {
        let deadline = Instant::now() + timeout;
        let mut s = self.lock();
        loop {
            if done(&s) {
                return true;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            s = match self.changed.wait_timeout(s, left) {
                Ok((guard, _)) => guard,
                Err(poisoned) => poisoned.into_inner().0,
            };
        }
    }
}
