//! Publishing one batch with a bound on what is in flight across all batches.
//!
//! async-nats gives each context a fixed number of ack permits and, by default, a publish
//! without one waits with no limit; a loop that publishes a whole batch before awaiting any
//! ack then wedges as soon as the batches in flight hold more events than there are permits
//! (one 6,000-event batch did, and so did 700 concurrent 100-event ones). Here a batch first
//! takes one permit per event from the collector's own budget, waiting at most
//! `admission_wait`; if they are not free by then the client hears 503 with `Retry-After`
//! (the collector is full, which readiness says too). The context gets as many permits as the
//! budget and errors instead of waiting, so it can never be the one that blocks. Acks are
//! collected while the batch is still being published.
//!
//! The publishing runs as a task of its own: a client that goes away (or a request deadline
//! that passes) does not cancel it half way, so every permit comes back once its ack or its
//! timeout does, and what landed is counted.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_nats::HeaderMap;
use async_nats::jetstream::ErrorCode;
use async_nats::jetstream::context::{PublishAckFuture, PublishErrorKind};
use async_nats::jetstream::{self, message::PublishMessage};
use futures_util::FutureExt;
use futures_util::stream::{FuturesUnordered, StreamExt};
use tokio::sync::Semaphore;

use super::super::sink::{Accepted, SinkBatch, Unavailable};

const LOG_TARGET: &str = "eventspool::collector::jetstream";
/// The header naming an event's project; its `Nats-Msg-Id` is `project:event_id`.
pub const PROJECT_HEADER: &str = "Eventspool-Project";

/// Counters since start, for `GET /stats` (and the outcome line of the topology test).
#[derive(Default)]
pub(super) struct Counters {
    pub batches: AtomicU64,
    pub stored: AtomicU64,
    pub duplicates: AtomicU64,
    pub rejected: AtomicU64,
    pub unavailable: AtomicU64,
    pub at_capacity: AtomicU64,
    pub reports: AtomicU64,
}

pub(super) struct Publisher {
    pub context: jetstream::Context,
    pub subject: String,
    pub reports_subject: String,
    /// One permit per event (or report) published and not yet acknowledged.
    pub permits: Arc<Semaphore>,
    pub capacity: usize,
    pub admission_wait: Duration,
    /// The largest message the broker and the stream take (payload plus headers).
    pub max_message: usize,
    pub retry_after: String,
    pub counters: Counters,
}

/// How one message fared.
enum Fate {
    New,
    Duplicate,
    /// Refused for what it is: it will never be stored, so the client must not resend it.
    Rejected(String),
    /// Refused for now (broker down or full): the batch gets a 503.
    Unavailable(String),
}

/// An ack error's verdict: a message the stream can never take is rejected, a full stream
/// (discard = new) or a broker that did not answer is unavailable.
fn classify(error: &async_nats::jetstream::context::PublishError) -> Fate {
    if error.kind() == PublishErrorKind::MaxPayloadExceeded {
        return Fate::Rejected(format!("event too large for the broker: {error}"));
    }
    let api = std::error::Error::source(error)
        .and_then(|s| s.downcast_ref::<async_nats::jetstream::Error>());
    match api.map(|e| e.error_code()) {
        Some(ErrorCode::STREAM_MESSAGE_EXCEEDS_MAXIMUM)
        | Some(ErrorCode::STREAM_HEADER_EXCEEDS_MAXIMUM) => {
            Fate::Rejected(format!("event too large for the stream: {error}"))
        }
        _ => {
            let detail = api.map_or_else(|| error.to_string(), |e| e.to_string());
            Fate::Unavailable(format!("not stored: {detail}"))
        }
    }
}

impl Publisher {
    pub(super) fn unavailable(&self, message: String) -> Unavailable {
        self.counters.unavailable.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(target: LOG_TARGET, %message, "batch not acknowledged");
        Unavailable {
            message,
            retry_after: self.retry_after.clone(),
        }
    }

    pub(super) fn in_flight(&self) -> usize {
        self.capacity
            .saturating_sub(self.permits.available_permits())
    }

    /// Validates, admits and publishes the batch; see the module doc.
    pub(super) async fn publish(
        self: Arc<Self>,
        batch: Arc<SinkBatch>,
    ) -> Result<Accepted, Unavailable> {
        let mut accepted = Accepted::default();
        let mut ok = Vec::with_capacity(batch.events.len());
        for (i, e) in batch.events.iter().enumerate() {
            match check(&e.event_id, e.raw.len(), &batch.project, self.max_message) {
                Ok(()) => ok.push(i),
                Err(reason) => accepted.rejected.push((e.event_id.clone(), reason)),
            }
        }
        let messages = ok.len() + batch.reports.len();
        if messages == 0 {
            return Ok(accepted);
        }
        let wanted = u32::try_from(messages).unwrap_or(u32::MAX);
        let permits = match tokio::time::timeout(
            self.admission_wait,
            Arc::clone(&self.permits).acquire_many_owned(wanted),
        )
        .await
        {
            Ok(Ok(p)) => p,
            Ok(Err(_)) | Err(_) => {
                self.counters.at_capacity.fetch_add(1, Ordering::Relaxed);
                return Err(self.unavailable(format!(
                    "collector at capacity: {} of {} events in flight",
                    self.in_flight(),
                    self.capacity
                )));
            }
        };
        let me = Arc::clone(&self);
        let task = tokio::spawn(async move {
            let result = me.publish_admitted(&batch, &ok, accepted).await;
            drop(permits);
            result
        });
        match task.await {
            Ok(result) => result,
            Err(e) => Err(self.unavailable(format!("publishing failed: {e}"))),
        }
    }

    async fn publish_admitted(
        &self,
        batch: &SinkBatch,
        ok: &[usize],
        mut accepted: Accepted,
    ) -> Result<Accepted, Unavailable> {
        // (message index, ack): events first (their index in the batch), then reports.
        let mut acks: FuturesUnordered<_> = FuturesUnordered::new();
        let mut fates: Vec<Option<Fate>> = Vec::new();
        let sent = |fates: &mut Vec<Option<Fate>>| {
            fates.push(None);
            fates.len() - 1
        };
        let settle = |fates: &mut Vec<Option<Fate>>, slot: usize, result| {
            fates[slot] = Some(match result {
                Ok(ack) => {
                    let ack: async_nats::jetstream::publish::PublishAck = ack;
                    if ack.duplicate {
                        Fate::Duplicate
                    } else {
                        Fate::New
                    }
                }
                Err(e) => classify(&e),
            });
        };
        let messages = ok
            .iter()
            .map(|&i| {
                let e = &batch.events[i];
                (
                    self.subject.as_str(),
                    format!("{}:{}", batch.project, e.event_id),
                    e.raw.clone(),
                )
            })
            .chain(batch.reports.iter().map(|r| {
                (
                    self.reports_subject.as_str(),
                    format!("{}:{}:{}", batch.project, r.install_id, r.report_id),
                    r.raw.clone(),
                )
            }));
        for (subject, id, payload) in messages {
            let slot = sent(&mut fates);
            let mut headers = HeaderMap::new();
            headers.insert(PROJECT_HEADER, batch.project.as_str());
            let message = PublishMessage::build()
                .payload(payload)
                .headers(headers)
                .message_id(id);
            match self.context.send_publish(subject.to_owned(), message).await {
                Ok(ack) => acks.push(wait(slot, ack)),
                Err(e) => settle(&mut fates, slot, Err(e)),
            }
            // Take the acks that are in already; nothing waits on them here.
            while let Some(Some((slot, result))) = acks.next().now_or_never() {
                settle(&mut fates, slot, result);
            }
        }
        while let Some((slot, result)) = acks.next().await {
            settle(&mut fates, slot, result);
        }
        let c = &self.counters;
        let mut unavailable = None;
        for (n, fate) in fates.into_iter().enumerate() {
            let Some(fate) = fate else { continue };
            let event = ok.get(n).map(|&i| &batch.events[i]);
            match (fate, event) {
                (Fate::New, Some(_)) => accepted.new += 1,
                (Fate::Duplicate, Some(_)) => accepted.duplicates += 1,
                (Fate::New | Fate::Duplicate, None) => {
                    let report = &batch.reports[n - ok.len()];
                    accepted.reports_seen.push(report.report_id);
                }
                (Fate::Rejected(reason), Some(e)) => {
                    accepted.rejected.push((e.event_id.clone(), reason))
                }
                // A report the stream cannot take is left out of `reports_seen`: the device
                // keeps it and the fleet totals miss it, which its own counters show.
                (Fate::Rejected(reason), None) => {
                    tracing::warn!(target: LOG_TARGET, %reason, "client report refused")
                }
                (Fate::Unavailable(why), _) => {
                    unavailable.get_or_insert(why);
                }
            }
        }
        if let Some(why) = unavailable {
            return Err(self.unavailable(why));
        }
        c.batches.fetch_add(1, Ordering::Relaxed);
        c.stored.fetch_add(accepted.new, Ordering::Relaxed);
        c.duplicates
            .fetch_add(accepted.duplicates, Ordering::Relaxed);
        c.rejected
            .fetch_add(accepted.rejected.len() as u64, Ordering::Relaxed);
        c.reports
            .fetch_add(accepted.reports_seen.len() as u64, Ordering::Relaxed);
        tracing::info!(
            target: LOG_TARGET,
            project = %batch.project,
            stored = accepted.new,
            duplicates = accepted.duplicates,
            rejected = accepted.rejected.len(),
            reports = accepted.reports_seen.len(),
            "acknowledged"
        );
        Ok(accepted)
    }
}

async fn wait(
    slot: usize,
    ack: PublishAckFuture,
) -> (
    usize,
    Result<
        async_nats::jetstream::publish::PublishAck,
        async_nats::jetstream::context::PublishError,
    >,
) {
    (slot, ack.await)
}

/// The sink's own validation on top of the wire format's: the `event_id` is the dedup key of
/// both stages, so it must be a UUID in the canonical form the SDK sends (a differently
/// spelled copy of the same id would not be recognised as a duplicate); and the message must
/// fit what the broker takes, or it would be refused every time it is resent.
fn check(event_id: &str, payload: usize, project: &str, max_message: usize) -> Result<(), String> {
    match uuid::Uuid::try_parse(event_id) {
        Ok(id) if id.hyphenated().to_string() == event_id => {}
        Ok(_) => return Err("event_id is not a lower-case hyphenated UUID".into()),
        Err(_) => return Err("event_id is not a UUID".into()),
    }
    // The headers: Nats-Msg-Id and the project, with the framing NATS adds (NATS/1.0, CRLFs).
    let headers = 64 + 2 * project.len() + event_id.len();
    if payload + headers > max_message {
        return Err(format!(
            "event of {payload} bytes exceeds the broker's message limit of {max_message} bytes"
        ));
    }
    Ok(())
}
