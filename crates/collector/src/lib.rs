//! The reference collector: an in-process HTTP server that speaks "eventspool batch v1"
//! (docs/protocol.md) and stores each event once by `event_id`.
//!
//! Tests, examples, benchmarks and the CLI all need a collector that behaves like a real one
//! on a real socket, and that can also misbehave on demand: fail a fraction of requests, reject
//! a poison event, hang, drop a connection after storing (the "effect unknown" case), or vanish
//! entirely (an outage that really refuses connections). Faking the transport instead would hide
//! exactly the bugs that only show up on the wire (keep-alive reuse after a reset, gzip framing,
//! Retry-After parsing).
//!
//! The server runs on its own thread with its own tokio runtime (a few workers, see
//! [`Limits::workers`]). That keeps it usable from plain `#[test]` functions and from inside
//! other runtimes alike, and makes `Drop` safe anywhere: the runtime is created and dropped on
//! the collector's thread, never on the caller's.
//!
//! The same server is the JetStream service of docs/scale.md (feature
//! `jetstream`): bounded in what it takes on ([`Limits`]), with liveness, readiness and
//! Prometheus metrics (`admin.rs`), per-project keys (`auth.rs`) and a drain on shutdown
//! ([`ReferenceCollector::drain`]).
//!
//! This module deliberately depends on no other eventspool module: it parses the wire JSON
//! itself, so a bug in the SDK's encoder cannot be masked by sharing the decoder.

mod admin;
mod auth;
mod fleet;
mod handler;
#[cfg(feature = "jetstream")]
mod jetstream;
mod limits;
mod metrics;
mod server;
// Only the `jetstream` feature builds a sink; without it the seam is there but unused.
#[cfg_attr(not(feature = "jetstream"), allow(dead_code))]
mod sink;
mod state;
mod wire;

pub use auth::{ApiKeys, DEFAULT_PROJECT};
pub use fleet::{Counts, FleetBook, FleetTotals, report_key};
#[cfg(feature = "jetstream")]
pub use jetstream::{JetStreamConfig, PROJECT_HEADER, StreamPolicy};
pub use limits::{
    Limits, MAX_BATCH_EVENTS, MAX_CONNECTIONS, MAX_DECODED_BODY_BYTES, MAX_RAW_BODY_BYTES,
};

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_service;

use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use state::Shared;

/// Default for [`CollectorConfig::max_request_records`]. A record of a 100-event batch holds
/// roughly 15 KB of ids, names and timestamps, so this keeps the log near 150 MB at worst
/// during a long benchmark, while any ordinary test sees every request.
pub const DEFAULT_MAX_REQUEST_RECORDS: usize = 10_000;
/// How long `set_outage` waits for the server thread to confirm; only reached if that thread
/// is wedged, which would otherwise hang the calling test forever.
const CONTROL_TIMEOUT: Duration = Duration::from_secs(10);
/// How long shutdown waits for the server thread before detaching it, so that dropping a
/// collector can never hang a test run.
const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(5);

/// How to start a [`ReferenceCollector`].
#[derive(Clone, Debug)]
pub struct CollectorConfig {
    /// Where to listen; the default `127.0.0.1:0` picks a free port, see [`ReferenceCollector::addr`].
    pub listen: SocketAddr,
    /// SQLite file for stored events; `None` keeps them in memory, which is what tests want.
    /// With a file, events from earlier runs count as already stored (duplicates).
    pub db_path: Option<PathBuf>,
    /// Initial misbehaviour; change it later with [`ReferenceCollector::set_behavior`].
    pub behavior: Behavior,
    /// How many [`RequestRecord`]s to keep (the most recent ones). Request counts stay exact.
    pub max_request_records: usize,
    /// What the process takes on at once and how long it waits ([`Limits`]).
    pub limits: Limits,
    /// Per-project keys: a batch without one of them is answered 401 before its body is read,
    /// and `/stats`, `/fleet` and `/metrics` want one too. `None`: every request is of
    /// [`DEFAULT_PROJECT`] (and [`Behavior::required_api_key`] still applies).
    pub api_keys: Option<ApiKeys>,
    /// `Some(path)`: batches are taken on that path only (404 elsewhere). `None`: on any path
    /// but the collector's own (`/stats`, `/fleet`, `/metrics`, `/livez`, `/readyz`), which
    /// never take a POST.
    pub batch_path: Option<String>,
}

impl Default for CollectorConfig {
    fn default() -> Self {
        CollectorConfig {
            listen: SocketAddr::from((Ipv4Addr::LOCALHOST, 0)),
            db_path: None,
            behavior: Behavior::default(),
            max_request_records: DEFAULT_MAX_REQUEST_RECORDS,
            limits: Limits::default(),
            api_keys: None,
            batch_path: None,
        }
    }
}

/// Standing misbehaviour, applied to every request that no [`Scripted`] item claims.
///
/// `drop_name` is checked first (no answer at all). Then checks run in this order:
/// `required_api_key` (401), `max_body_bytes` (413), `fail_rate`
/// (503), body validity (400), `reject_name` (400), then the normal path with
/// `partial_reject_name`. `delay` is waited before all of them.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Behavior {
    /// Fraction of requests answered 503, drawn from an rng seeded with `seed` so a failing
    /// run can be replayed.
    pub fail_rate: f64,
    /// Seed for `fail_rate`; the rng restarts from it on every `set_behavior`.
    pub seed: u64,
    /// Any batch containing an event with this name is answered 400 `{"error":"poison event"}`,
    /// which makes the SDK split batches until the event is alone.
    pub reject_name: Option<String>,
    /// Events with this name are listed in a 200 answer's `rejected` array (reason
    /// `"invalid name"`) and not stored; the rest of the batch is stored.
    pub partial_reject_name: Option<String>,
    /// The `reason` given for each `partial_reject_name` rejection instead of `"invalid name"`.
    /// A long one makes a legal `rejected` list outgrow a client's response read bound, which
    /// is how a test checks that a cut 2xx body is never read as "all delivered".
    pub partial_reject_reason: Option<String>,
    /// Bodies larger than this as sent (before gzip decoding) are answered 413.
    pub max_body_bytes: Option<usize>,
    /// Value of the `Retry-After` header added to every 429 and 503 answer.
    pub retry_after: Option<String>,
    /// Wait this long before answering each request (to provoke client timeouts).
    pub delay: Option<Duration>,
    /// When set, requests without `Authorization: Bearer <key>` are answered 401.
    pub required_api_key: Option<String>,
    /// Fraction of unscripted requests whose batch is stored and whose connection is then closed
    /// without an answer (as [`Scripted::StoreThenDrop`]), drawn from the same seeded rng as
    /// `fail_rate`: soak tests use it for "the network died after the collector read it".
    pub drop_rate: f64,
    /// Any batch containing an event with this property (a key of `properties`) is answered
    /// 400 like `reject_name`: a collector bug that refuses good events, which the SDK
    /// quarantines as `bad_request` until a directive redrives them.
    pub reject_property: Option<String>,
    /// Says `"reports_alone": true` in 2xx answers to requests that carry client reports: the
    /// SDK then sends a waiting report alone with its periodic flush when it has no event to
    /// send (one request per flush interval at most, and only after a change), so the totals
    /// catch up without new events.
    pub lone_reports: bool,
    /// Sent as `directives` in every 2xx answer (docs/protocol.md §Directives), as is: a test
    /// or an operator steers the fleet with it, and can send malformed ones on purpose.
    pub directives: Option<serde_json::Value>,
    /// Any batch containing an event with this name is neither stored nor answered: the
    /// connection is closed as soon as the body is read. A collector that crashes (or times out)
    /// on one event every time, an effect-unknown failure that only `max_event_sends` ends.
    pub drop_name: Option<String>,
}

/// One-shot behaviour for the next request, queued with [`ReferenceCollector::push_script`].
/// Scripted items are consumed first-in first-out, one per POST, and take precedence over
/// [`Behavior`].
#[derive(Clone, Debug, PartialEq)]
pub enum Scripted {
    /// Answer exactly this (nothing is stored). A `Retry-After` from [`Behavior::retry_after`]
    /// is added to a 429 or 503 unless `headers` already set one.
    Status {
        status: u16,
        body: String,
        headers: Vec<(String, String)>,
    },
    /// Store the batch's events, then close the connection without answering: the client
    /// cannot know whether its batch landed, which is the case `event_id` dedup exists for.
    StoreThenDrop,
    /// Wait, then handle the request normally (Behavior included).
    Delay(Duration),
    /// Handle the request normally (the batch is stored), then wait this long before
    /// answering: behind a proxy or a client whose timeout is shorter, the batch landed but the
    /// sender sees a timeout or a 504, the other "effect unknown" case.
    StoreThenDelay(Duration),
    /// Never answer; the connection stays open until an outage or shutdown.
    Hang,
    /// Answer 200 listing every event of the batch in `rejected`, each with this `reason`, and
    /// store none: the largest legal answer to a batch, for clients that bound what they read.
    RejectAll { reason: String },
}

impl Scripted {
    /// A bare status with an empty body and no extra headers.
    pub fn status(status: u16) -> Scripted {
        Scripted::Status {
            status,
            body: String::new(),
            headers: Vec::new(),
        }
    }
}

/// An event as the collector stored it (first copy wins).
#[derive(Clone, Debug, PartialEq)]
pub struct StoredEvent {
    pub event_id: String,
    pub name: String,
    pub timestamp: String,
    pub session_id: Option<String>,
    pub properties: serde_json::Value,
    /// [`RequestRecord::index`] of the request that first delivered this event.
    pub first_seen_request: usize,
}

/// What the collector saw of one request and what it did, kept so tests can assert on
/// resends, headers and batch composition after the fact.
#[derive(Clone, Debug)]
pub struct RequestRecord {
    /// 0-based, in order of arrival.
    pub index: usize,
    /// When the request's head arrived.
    pub at: Instant,
    /// `None` when the request got no answer (dropped, hung, or the client went away).
    pub status: Option<u16>,
    /// Body length as sent on the wire (compressed if gzip).
    pub body_bytes: usize,
    /// Body length after gzip decoding (equal to `body_bytes` when not compressed).
    pub decoded_bytes: usize,
    pub gzip: bool,
    /// `X-Eventspool-Attempt`, when present and a number.
    pub attempt: Option<u32>,
    pub authorization: Option<String>,
    pub user_agent: Option<String>,
    pub content_type: Option<String>,
    pub sent_at: Option<String>,
    /// Ids, timestamps and names of the batch's events, as far as the body could be read;
    /// filled for rejected and scripted requests too, so resends can be compared.
    pub event_ids: Vec<String>,
    pub timestamps: Vec<String>,
    pub names: Vec<String>,
    /// Short verdict: "stored", "partial", "scripted 503", "scripted reject all",
    /// "injected 503", "poison", "too large", "unauthorized", "bad json", "bad gzip",
    /// "unsupported encoding", "method not allowed", "storage error", "sink unavailable"
    /// (a JetStream collector's 503), "dropped", "hung", "abandoned".
    pub outcome: String,
}

/// A running reference collector. Dropping it shuts the server down.
pub struct ReferenceCollector {
    shared: Arc<Shared>,
    addr: SocketAddr,
    server: server::ServerThread,
}

impl ReferenceCollector {
    /// Opens the store, binds the socket and starts serving on a dedicated thread.
    /// Returns once the socket accepts connections.
    pub fn start(config: CollectorConfig) -> std::io::Result<ReferenceCollector> {
        Self::serve(config, None)
    }

    /// `start`, with accepted batches going to `sink` instead of the store when there is one.
    fn serve(
        config: CollectorConfig,
        sink: Option<Box<dyn sink::Sink>>,
    ) -> std::io::Result<ReferenceCollector> {
        config.limits.check().map_err(std::io::Error::other)?;
        if let Some(path) = &config.batch_path
            && (!path.starts_with('/') || admin::is_reserved(path))
        {
            return Err(std::io::Error::other(format!(
                "batch_path {path:?} must start with / and not be one of the collector's own paths"
            )));
        }
        let store = state::Store::open(config.db_path.as_deref())
            .map_err(|e| std::io::Error::other(format!("collector database: {e}")))?;
        let mut shared = Shared::new(store, &config);
        if let Some(sink) = sink {
            shared = shared.with_sink(sink);
        }
        let shared = Arc::new(shared);
        let (server, addr) = server::spawn(config.listen, Arc::clone(&shared))?;
        Ok(ReferenceCollector {
            shared,
            addr,
            server,
        })
    }

    /// Starts a stateless collector that publishes every accepted event to NATS JetStream
    /// (`Nats-Msg-Id` = `event_id`) and answers 2xx only once JetStream acknowledged the whole
    /// batch; a broker that is down or slow gets the client a 503 with `Retry-After`.
    /// `config.db_path` must be `None`: such a collector keeps no event of its own.
    #[cfg(feature = "jetstream")]
    pub fn start_jetstream(
        config: CollectorConfig,
        jetstream: &JetStreamConfig,
    ) -> std::io::Result<ReferenceCollector> {
        if config.db_path.is_some() {
            return Err(std::io::Error::other(
                "a JetStream collector keeps no database: leave db_path unset",
            ));
        }
        if config.limits.max_batch_events > jetstream.max_in_flight_events {
            return Err(std::io::Error::other(format!(
                "limits.max_batch_events ({}) must be at most max_in_flight_events ({}): a \
                 larger batch could never be admitted",
                config.limits.max_batch_events, jetstream.max_in_flight_events
            )));
        }
        let sink = jetstream::JetStreamSink::connect(jetstream)?;
        Self::serve(config, Some(Box::new(sink)))
    }

    /// The bound address (the real port when the config asked for port 0).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The batch endpoint: `http://ADDR` and [`CollectorConfig::batch_path`], else `/v1/batch`
    /// (any path but the collector's own is taken then; this is the canonical one).
    pub fn url(&self) -> String {
        let path = self.shared.batch_path().unwrap_or("/v1/batch");
        format!("http://{}{path}", self.addr)
    }

    /// Queues one-shot behaviours for the next requests.
    pub fn push_script(&self, items: impl IntoIterator<Item = Scripted>) {
        self.shared.push_script(items);
    }

    /// Queues bare statuses, one per request.
    pub fn push_statuses(&self, statuses: &[u16]) {
        self.push_script(statuses.iter().map(|&s| Scripted::status(s)));
    }

    /// Scripted items not consumed yet.
    pub fn pending_script(&self) -> usize {
        self.shared.pending_script()
    }

    /// Forgets scripted items not consumed yet.
    pub fn clear_script(&self) {
        self.shared.clear_script();
    }

    /// Replaces the standing behaviour; also restarts the `fail_rate` rng from `b.seed`.
    pub fn set_behavior(&self, b: Behavior) {
        self.shared.set_behavior(b);
    }

    pub fn behavior(&self) -> Behavior {
        self.shared.behavior()
    }

    /// `down = true` closes the listening socket and every open connection, so clients see
    /// connection refused or reset, as with a real outage. `down = false` binds the same port
    /// again. Both return once the change is in effect; repeating a state is a no-op.
    pub fn set_outage(&self, down: bool) -> std::io::Result<()> {
        self.server.set_outage(down)
    }

    /// Distinct `event_id`s stored (including ones found in an existing database file).
    /// The client reports received so far, each counted once per install.
    pub fn fleet_totals(&self) -> FleetTotals {
        self.shared.fleet_totals()
    }

    /// One install's report totals.
    pub fn fleet_install(&self, install_id: &str) -> Option<Counts> {
        self.shared.fleet_install(install_id)
    }

    pub fn distinct_count(&self) -> u64 {
        self.shared.distinct_count()
    }

    /// Events received in accepted requests by this process, duplicates included. Events a
    /// 200 lists as rejected do not count; those of a `StoreThenDrop` request do (they were
    /// stored).
    pub fn received_count(&self) -> u64 {
        self.shared.received_count()
    }

    pub fn contains(&self, event_id: &str) -> bool {
        self.shared.contains(event_id)
    }

    /// Distinct stored events in order of first arrival.
    pub fn events(&self) -> Vec<StoredEvent> {
        self.shared.events()
    }

    /// Retained request records (see [`CollectorConfig::max_request_records`]), by index.
    pub fn requests(&self) -> Vec<RequestRecord> {
        self.shared.requests()
    }

    /// Requests seen so far, whatever their outcome (not capped by the record limit).
    /// A request counts once its verdict is known, so its record is already readable.
    pub fn request_count(&self) -> usize {
        self.shared.request_count()
    }

    /// The most POSTs this collector was handling at the same moment (from arrival until the
    /// answer was ready, or the connection went): 1 for a client that never overlaps requests.
    pub fn max_concurrent_requests(&self) -> usize {
        self.shared.max_in_flight()
    }

    /// Blocks until at least `n` distinct events are stored or `timeout` passes; returns
    /// whether the count was reached. Wakes on every store, so tests need no sleeps.
    /// It blocks the calling thread: in a single-threaded async test, let the client's
    /// future finish first, or the request it waits for never gets sent.
    pub fn wait_for_distinct(&self, n: u64, timeout: Duration) -> bool {
        self.shared.wait_for_distinct(n, timeout)
    }

    /// Blocks until at least `n` requests have a verdict or `timeout` passes.
    pub fn wait_for_requests(&self, n: usize, timeout: Duration) -> bool {
        self.shared.wait_for_requests(n, timeout)
    }

    /// Stops the server and joins its thread (bounded wait). Same as dropping.
    pub fn shutdown(mut self) {
        self.server.stop();
    }

    /// The orderly stop of a service (SIGTERM): readiness fails at once, so a balancer that
    /// polls `/readyz` stops sending here; after `announce` the listening socket closes (new
    /// connections are refused, which a balancer retries elsewhere); requests being handled
    /// finish (a JetStream batch waits for its acks) and each connection closes after its
    /// answer. Returns once every connection is closed, or after `timeout` with the rest cut;
    /// the report says which. Then the collector is stopped as by [`Self::shutdown`].
    pub fn drain(mut self, announce: Duration, timeout: Duration) -> DrainReport {
        let started = Instant::now();
        self.shared.set_draining();
        std::thread::sleep(announce);
        let cut = self.server.drain(timeout);
        self.server.stop();
        DrainReport {
            elapsed: started.elapsed(),
            requests_cut: cut,
            requests: self.shared.request_count(),
        }
    }
}

/// What [`ReferenceCollector::drain`] did.
#[derive(Clone, Debug, PartialEq)]
pub struct DrainReport {
    pub elapsed: Duration,
    /// Connections still busy when the timeout passed (0 for a clean drain).
    pub requests_cut: usize,
    /// Requests the collector saw over its life.
    pub requests: usize,
}

impl Drop for ReferenceCollector {
    fn drop(&mut self) {
        self.server.stop();
    }
}
