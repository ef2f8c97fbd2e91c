//! Where an accepted batch goes instead of the collector's own SQLite table.
//!
//! A collector past one machine does not keep events itself: it hands them to a broker and
//! answers the client only with what the broker said (see `jetstream.rs`). The handler asks
//! the sink once per batch, after every check of [`super::Behavior`] passed, and turns its
//! answer into the usual `{"accepted","duplicates","rejected"}` body, or a 503 with
//! `Retry-After` when the sink cannot vouch for the batch. With a sink the collector holds no
//! event of its own, so several processes can run side by side behind a load balancer.

use std::future::Future;
use std::pin::Pin;

use super::wire::WireEvent;

/// What the sink did with a batch it vouches for: every event not listed in `rejected` is
/// durably stored downstream (new or a duplicate of an earlier copy).
#[derive(Debug, Default)]
pub(super) struct Accepted {
    pub new: u64,
    pub duplicates: u64,
    /// `(event_id, reason)` of events that failed the sink's validation and were not stored.
    pub rejected: Vec<(String, String)>,
}

/// The sink cannot vouch for the batch (broker down, slow or refusing): the client is told to
/// come back later, and whatever did land downstream is deduplicated there by `event_id`.
#[derive(Debug)]
pub(super) struct Unavailable {
    pub message: String,
    /// `Retry-After` value for the 503.
    pub retry_after: String,
}

pub(super) type Publishing<'a> =
    Pin<Box<dyn Future<Output = Result<Accepted, Unavailable>> + Send + 'a>>;

pub(super) trait Sink: Send + Sync {
    /// Stores the batch downstream; resolves only once the downstream acknowledged every
    /// event it counts as accepted.
    fn publish<'a>(&'a self, events: &'a [&'a WireEvent]) -> Publishing<'a>;

    /// Counters for `GET /stats`, under the key `"sink"`.
    fn stats(&self) -> serde_json::Value;
}
