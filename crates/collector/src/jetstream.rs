//! The collector's NATS JetStream sink: each accepted event becomes one stream message whose
//! `Nats-Msg-Id` is its `event_id`, and the client hears 2xx only once JetStream acknowledged
//! every event of the batch.
//!
//! Why a broker, and why this shape (README "Collecting at scale"): a phone that resends a
//! batch after a timeout reaches whichever collector the load balancer picks, so the dedup
//! cannot live in a collector. JetStream drops a message whose `Nats-Msg-Id` it already holds
//! within the stream's `duplicate_window` and says so in the ack (`duplicate: true`), which
//! absorbs retry storms; the warehouse catches what arrives later than the window.
//!
//! The NATS connection lives on a thread and runtime of its own, like the HTTP server: its
//! reconnect task must keep running however the collector's runtime is driven, and the
//! client handle it yields can be used from any runtime. The sink keeps no event: collector
//! processes with this sink are stateless and can be killed at any time.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc as std_mpsc;
use std::thread::JoinHandle;
use std::time::Duration;

use async_nats::connection::State;
use async_nats::jetstream::{self, message::PublishMessage, stream};
use bytes::Bytes;
use futures_util::future::join_all;
use serde_json::json;
use tokio::sync::oneshot;

use super::sink::{Accepted, Publishing, Sink, Unavailable};
use super::wire::WireEvent;

const LOG_TARGET: &str = "eventspool::collector::jetstream";
/// Bounds the connect and the stream lookup at start; a broker that cannot be reached by then
/// fails the start with a clear error instead of a collector that answers 503 for ever.
const START_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest pause between reconnect attempts: a restarted broker is found again within this.
const MAX_RECONNECT_DELAY: Duration = Duration::from_millis(500);

/// Where and how the sink publishes.
#[derive(Clone, Debug)]
pub struct JetStreamConfig {
    /// NATS server URL, e.g. `nats://127.0.0.1:4222`.
    pub url: String,
    /// Stream name, created (file storage) if missing.
    pub stream: String,
    /// Subject every event is published on; the stream is created listening on it.
    pub subject: String,
    /// How long JetStream remembers a `Nats-Msg-Id` to drop a resent copy. Only used when the
    /// stream is created; an existing stream keeps its own.
    pub duplicate_window: Duration,
    /// Longest wait for JetStream's acks of one batch; past it the client gets a 503.
    pub ack_timeout: Duration,
    /// `Retry-After` (seconds) on the 503 for a broker that is down, slow or refusing.
    pub retry_after_secs: u32,
}

impl Default for JetStreamConfig {
    fn default() -> Self {
        JetStreamConfig {
            url: "nats://127.0.0.1:4222".into(),
            stream: "EVENTSPOOL".into(),
            subject: "eventspool.events".into(),
            // JetStream's own default; resends after longer outages reach the warehouse stage.
            duplicate_window: Duration::from_secs(120),
            ack_timeout: Duration::from_secs(5),
            retry_after_secs: 2,
        }
    }
}

/// Counters since start, for `GET /stats` (and the outcome line of the topology test).
#[derive(Default)]
struct Counters {
    batches: AtomicU64,
    stored: AtomicU64,
    duplicates: AtomicU64,
    rejected: AtomicU64,
    unavailable: AtomicU64,
}

pub(super) struct JetStreamSink {
    client: async_nats::Client,
    context: jetstream::Context,
    subject: String,
    retry_after: String,
    counters: Counters,
    /// Dropping it ends the connection thread's runtime.
    _stop: oneshot::Sender<()>,
    _thread: JoinHandle<()>,
}

fn start_error(config: &JetStreamConfig, what: impl std::fmt::Display) -> std::io::Error {
    std::io::Error::other(format!(
        "JetStream at {} (stream {}): {what}",
        config.url, config.stream
    ))
}

impl JetStreamSink {
    /// Connects, creates the stream if missing, and returns once both are done.
    pub(super) fn connect(config: &JetStreamConfig) -> std::io::Result<JetStreamSink> {
        if config.subject.is_empty() || config.subject.contains(char::is_whitespace) {
            return Err(start_error(
                config,
                "subject must be non-empty, without spaces",
            ));
        }
        let (ready_tx, ready_rx) = std_mpsc::sync_channel(1);
        let (stop, stop_rx) = oneshot::channel::<()>();
        let thread_config = config.clone();
        let thread = std::thread::Builder::new()
            .name("eventspool-jetstream".into())
            .spawn(move || {
                let runtime = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(rt) => rt,
                    Err(e) => {
                        let _ = ready_tx.send(Err(e.to_string()));
                        return;
                    }
                };
                runtime.block_on(async move {
                    let connected = tokio::time::timeout(START_TIMEOUT, open(&thread_config)).await;
                    let result = match connected {
                        Ok(r) => r,
                        Err(_) => Err(format!("not reachable within {START_TIMEOUT:?}")),
                    };
                    let _ = ready_tx.send(result);
                    // Keeps the client's connection task running until the sink is dropped.
                    let _ = stop_rx.await;
                });
            })?;
        let (client, context) = match ready_rx.recv() {
            Ok(Ok(pair)) => pair,
            Ok(Err(e)) => return Err(start_error(config, e)),
            Err(_) => return Err(start_error(config, "connection thread ended")),
        };
        Ok(JetStreamSink {
            client,
            context,
            subject: config.subject.clone(),
            retry_after: config.retry_after_secs.to_string(),
            counters: Counters::default(),
            _stop: stop,
            _thread: thread,
        })
    }

    fn unavailable(&self, message: String) -> Unavailable {
        self.counters.unavailable.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(target: LOG_TARGET, %message, "batch not acknowledged");
        Unavailable {
            message,
            retry_after: self.retry_after.clone(),
        }
    }

    async fn publish_batch(&self, events: &[&WireEvent]) -> Result<Accepted, Unavailable> {
        // A broker known to be gone gets no publish at all: the client would only wait out
        // the ack timeout to hear the same 503.
        if self.client.connection_state() != State::Connected {
            return Err(self.unavailable("broker not connected".into()));
        }
        let mut accepted = Accepted::default();
        let mut acks = Vec::with_capacity(events.len());
        for e in events {
            if let Err(reason) = check(e) {
                accepted.rejected.push((e.event_id.clone(), reason));
                continue;
            }
            let message = PublishMessage::build()
                .payload(payload(e))
                .message_id(&e.event_id);
            match self
                .context
                .send_publish(self.subject.clone(), message)
                .await
            {
                Ok(ack) => acks.push(ack.into_future()),
                Err(err) => return Err(self.unavailable(format!("publish failed: {err}"))),
            }
        }
        // All publishes are on the wire; their acks come back in any order.
        for ack in join_all(acks).await {
            match ack {
                Ok(ack) if ack.duplicate => accepted.duplicates += 1,
                Ok(_) => accepted.new += 1,
                Err(err) => return Err(self.unavailable(format!("no ack: {err}"))),
            }
        }
        let c = &self.counters;
        c.batches.fetch_add(1, Ordering::Relaxed);
        c.stored.fetch_add(accepted.new, Ordering::Relaxed);
        c.duplicates
            .fetch_add(accepted.duplicates, Ordering::Relaxed);
        c.rejected
            .fetch_add(accepted.rejected.len() as u64, Ordering::Relaxed);
        tracing::info!(
            target: LOG_TARGET,
            stored = accepted.new,
            duplicates = accepted.duplicates,
            rejected = accepted.rejected.len(),
            "acknowledged"
        );
        Ok(accepted)
    }
}

impl Sink for JetStreamSink {
    fn publish<'a>(&'a self, events: &'a [&'a WireEvent]) -> Publishing<'a> {
        Box::pin(self.publish_batch(events))
    }

    fn stats(&self) -> serde_json::Value {
        let c = &self.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        json!({
            "batches": get(&c.batches),
            "stored": get(&c.stored),
            "duplicates": get(&c.duplicates),
            "rejected": get(&c.rejected),
            "unavailable": get(&c.unavailable),
        })
    }
}

/// Connects with reconnects for ever (a broker restart must not need a collector restart)
/// and makes sure the stream exists.
async fn open(
    config: &JetStreamConfig,
) -> Result<(async_nats::Client, jetstream::Context), String> {
    let client = async_nats::ConnectOptions::new()
        .name("eventspool-collector")
        .max_reconnects(None)
        .reconnect_delay_callback(|attempts| {
            MAX_RECONNECT_DELAY.min(Duration::from_millis(50 * attempts as u64))
        })
        .connect(config.url.as_str())
        .await
        .map_err(|e| format!("connect: {e}"))?;
    let mut context = jetstream::new(client.clone());
    context.set_timeout(config.ack_timeout);
    context
        .get_or_create_stream(stream::Config {
            name: config.stream.clone(),
            subjects: vec![config.subject.clone()],
            duplicate_window: config.duplicate_window,
            storage: stream::StorageType::File,
            ..Default::default()
        })
        .await
        .map_err(|e| format!("stream: {e}"))?;
    Ok((client, context))
}

/// The sink's own validation on top of the wire format's: the `event_id` is the dedup key of
/// both stages, so it must be a UUID in the canonical form the SDK sends (a differently
/// spelled copy of the same id would not be recognised as a duplicate).
fn check(e: &WireEvent) -> Result<(), String> {
    match uuid::Uuid::try_parse(&e.event_id) {
        Ok(id) if id.hyphenated().to_string() == e.event_id => Ok(()),
        Ok(_) => Err("event_id is not a lower-case hyphenated UUID".into()),
        Err(_) => Err("event_id is not a UUID".into()),
    }
}

/// The stream message: the event as the SDK sent it, one JSON object.
fn payload(e: &WireEvent) -> Bytes {
    Bytes::from(
        json!({
            "event_id": e.event_id,
            "name": e.name,
            "timestamp": e.timestamp,
            "session_id": e.session_id,
            "properties": e.properties,
        })
        .to_string(),
    )
}
