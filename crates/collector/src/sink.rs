//! Where an accepted batch goes instead of the collector's own SQLite table.
//!
//! A collector past one machine does not keep events itself: it hands them to a broker and
//! answers the client only with what the broker said (see `jetstream/`). The handler asks
//! the sink once per batch, after every check of [`super::Behavior`] passed, and turns its
//! answer into the usual `{"accepted","duplicates","rejected"}` body, or a 503 with
//! `Retry-After` when the sink cannot vouch for the batch. With a sink the collector holds no
//! event of its own (nor the batch's client reports: the sink stores them too), so several
//! processes can run side by side behind a load balancer.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use bytes::Bytes;

/// One event to store downstream: its id and its JSON exactly as the client sent it.
#[derive(Debug)]
pub(super) struct SinkEvent {
    pub event_id: String,
    pub raw: Bytes,
}

/// One client report (docs/protocol.md §Client reports) to store downstream.
#[derive(Debug)]
pub(super) struct SinkReport {
    pub install_id: String,
    pub report_id: u64,
    pub raw: Bytes,
}

/// A batch as the sink gets it: owned, so its publishing can outlive the request (a client
/// that goes away must not leave acks unawaited).
#[derive(Debug)]
pub(super) struct SinkBatch {
    /// The dedup scope: stored ids are `project:event_id`.
    pub project: String,
    pub events: Vec<SinkEvent>,
    pub reports: Vec<SinkReport>,
}

/// What the sink did with a batch it vouches for: every event not listed in `rejected` is
/// durably stored downstream (new or a duplicate of an earlier copy), and so is every report
/// listed in `reports_seen`.
#[derive(Debug, Default)]
pub(super) struct Accepted {
    pub new: u64,
    pub duplicates: u64,
    /// `(event_id, reason)` of events that failed the sink's validation and were not stored.
    pub rejected: Vec<(String, String)>,
    /// Report ids stored downstream (the answer's `reports_seen`).
    pub reports_seen: Vec<u64>,
}

/// The sink cannot vouch for the batch (broker down, slow, full or at capacity): the client
/// is told to come back later, and whatever did land downstream is deduplicated there.
#[derive(Debug)]
pub(super) struct Unavailable {
    pub message: String,
    /// `Retry-After` value for the 503.
    pub retry_after: String,
}

pub(super) type Publishing = Pin<Box<dyn Future<Output = Result<Accepted, Unavailable>> + Send>>;

pub(super) trait Sink: Send + Sync {
    /// Stores the batch downstream; resolves only once the downstream acknowledged every
    /// event and report it counts as stored. Runs to its end even if the caller stops
    /// waiting: the caller's deadline turns into a 503, the work in flight into duplicates.
    fn publish(&self, batch: Arc<SinkBatch>) -> Publishing;

    /// `Err(why)` while a batch could not be stored now (broker unreachable, no room in flight):
    /// what `GET /readyz` reports.
    fn readiness(&self) -> Result<(), String>;

    /// Whether the broker connection is up, for `/metrics`.
    fn connected(&self) -> bool;

    /// Events published and not yet acknowledged.
    fn events_in_flight(&self) -> usize;

    /// Counters for `GET /stats`, under the key `"sink"`.
    fn stats(&self) -> serde_json::Value;
}
