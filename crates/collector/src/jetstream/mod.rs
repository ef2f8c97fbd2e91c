//! The collector's NATS JetStream sink: each accepted event becomes one stream message, its
//! bytes as the client sent them, whose `Nats-Msg-Id` is `project:event_id` (the project of
//! the request's API key), and the client hears 2xx only once JetStream acknowledged every
//! event of the batch; the batch's client reports go to a stream of their own first.
//!
//! Why a broker, and why this shape (docs/scale.md): a phone that resends a
//! batch after a timeout reaches whichever collector the load balancer picks, so the dedup
//! cannot live in a collector. JetStream drops a message whose `Nats-Msg-Id` it already holds
//! within the stream's `duplicate_window` and says so in the ack (`duplicate: true`), which
//! absorbs retry storms; the warehouse catches what arrives later than the window.
//!
//! The NATS connection lives on a thread and runtime of its own, like the HTTP server: its
//! reconnect task must keep running however the collector's runtime is driven, and the
//! client handle it yields can be used from any runtime. The sink keeps no event: collector
//! processes with this sink are stateless and can be killed at any time.

mod publish;
mod settings;

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::sync::mpsc as std_mpsc;
use std::thread::JoinHandle;
use std::time::Duration;

use async_nats::connection::State;
use async_nats::jetstream;
use serde_json::json;
use tokio::sync::{Semaphore, oneshot};

pub use publish::PROJECT_HEADER;
pub use settings::StreamPolicy;

use super::sink::{Publishing, Sink, SinkBatch};
use publish::{Counters, Publisher};
use settings::{Outcome, Wanted};

const LOG_TARGET: &str = "eventspool::collector::jetstream";
/// Bounds the connect and the stream lookup at start; a broker that cannot be reached by then
/// fails the start with a clear error instead of a collector that answers 503 for ever.
const START_TIMEOUT: Duration = Duration::from_secs(20);
/// Longest pause between reconnect attempts: a restarted broker is found again within this.
const MAX_RECONNECT_DELAY: Duration = Duration::from_millis(500);

/// Where and how the sink publishes, and the streams it keeps (docs/scale.md).
#[derive(Clone, Debug)]
pub struct JetStreamConfig {
    /// NATS server URL, e.g. `nats://127.0.0.1:4222`; several, comma-separated, for a cluster.
    pub url: String,
    /// Stream name, created (file storage) if missing, checked against the settings below.
    pub stream: String,
    /// Subject every event is published on; the stream is created listening on it.
    pub subject: String,
    /// How long JetStream remembers a `Nats-Msg-Id` to drop a resent copy.
    pub duplicate_window: Duration,
    /// Replicas of each stream: 3 on a cluster, so a broker machine lost after the 2xx loses
    /// nothing (a single server can only hold 1).
    pub replicas: usize,
    /// Bytes each stream may hold; with `discard = new` a full stream refuses publishes (503)
    /// rather than deleting acknowledged events.
    pub max_bytes: i64,
    /// How long the stream keeps an event; the warehouse loader must read it within this.
    pub max_age: Duration,
    /// Largest message the stream takes; a larger event is listed in `rejected`.
    pub max_msg_size: i32,
    /// What to do with an existing stream whose settings differ.
    pub stream_policy: StreamPolicy,
    /// Stream and subject of the client reports (docs/protocol.md §Client reports), stored
    /// before the answer that lists them in `reports_seen`, with the same settings.
    pub reports_stream: String,
    pub reports_subject: String,
    /// Events (and reports) published and not yet acknowledged, over all batches at once.
    pub max_in_flight_events: usize,
    /// How long a batch waits for room in flight before it gets a 503.
    pub admission_wait: Duration,
    /// Longest wait for JetStream's acks of one batch; past it the client gets a 503.
    pub ack_timeout: Duration,
    /// `Retry-After` (seconds) on the 503 for a broker that is down, slow, full or refusing.
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
            replicas: 3,
            max_bytes: 1 << 30,
            max_age: Duration::from_secs(7 * 24 * 3600),
            max_msg_size: 1 << 20,
            stream_policy: StreamPolicy::Apply,
            reports_stream: "EVENTSPOOL_REPORTS".into(),
            reports_subject: "eventspool.reports".into(),
            max_in_flight_events: 4_096,
            admission_wait: Duration::from_millis(500),
            ack_timeout: Duration::from_secs(5),
            retry_after_secs: 2,
        }
    }
}

pub(super) struct JetStreamSink {
    client: async_nats::Client,
    publisher: Arc<Publisher>,
    streams: Vec<(String, Outcome)>,
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

/// What the connection thread hands back once connected and the streams are in shape.
struct Opened {
    client: async_nats::Client,
    context: jetstream::Context,
    streams: Vec<(String, Outcome)>,
}

impl JetStreamSink {
    /// Connects, creates or checks both streams, and returns once that is done.
    pub(super) fn connect(config: &JetStreamConfig) -> std::io::Result<JetStreamSink> {
        for subject in [&config.subject, &config.reports_subject] {
            if subject.is_empty() || subject.contains(char::is_whitespace) {
                return Err(start_error(
                    config,
                    "subjects must be non-empty, without spaces",
                ));
            }
        }
        if config.subject == config.reports_subject || config.stream == config.reports_stream {
            return Err(start_error(
                config,
                "events and reports need a stream and a subject each",
            ));
        }
        if config.max_in_flight_events == 0 || config.replicas == 0 {
            return Err(start_error(
                config,
                "max_in_flight_events and replicas must be at least 1",
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
        let opened = match ready_rx.recv() {
            Ok(Ok(opened)) => opened,
            Ok(Err(e)) => return Err(start_error(config, e)),
            Err(_) => return Err(start_error(config, "connection thread ended")),
        };
        for (name, outcome) in &opened.streams {
            if outcome.differences.is_empty() {
                tracing::info!(target: LOG_TARGET, stream = %name, action = outcome.action, "stream settings");
            } else {
                tracing::warn!(
                    target: LOG_TARGET,
                    stream = %name,
                    action = outcome.action,
                    differences = %outcome.differences.join("; "),
                    "stream settings"
                );
            }
        }
        let server_max = opened.client.server_info().max_payload;
        let stream_max = opened
            .streams
            .iter()
            .map(|(_, o)| o.max_msg_size)
            .filter(|&m| m > 0)
            .min()
            .map_or(usize::MAX, |m| m as usize);
        let publisher = Publisher {
            context: opened.context,
            subject: config.subject.clone(),
            reports_subject: config.reports_subject.clone(),
            permits: Arc::new(Semaphore::new(config.max_in_flight_events)),
            capacity: config.max_in_flight_events,
            admission_wait: config.admission_wait,
            max_message: server_max.min(stream_max),
            retry_after: config.retry_after_secs.to_string(),
            counters: Counters::default(),
        };
        Ok(JetStreamSink {
            client: opened.client,
            publisher: Arc::new(publisher),
            streams: opened.streams,
            _stop: stop,
            _thread: thread,
        })
    }
}

impl Sink for JetStreamSink {
    fn publish(&self, batch: Arc<SinkBatch>) -> Publishing {
        let publisher = Arc::clone(&self.publisher);
        // A broker known to be gone gets no publish at all: the client would only wait out
        // the ack timeout to hear the same 503.
        if self.client.connection_state() != State::Connected {
            let unavailable = publisher.unavailable("broker not connected".into());
            return Box::pin(async move { Err(unavailable) });
        }
        Box::pin(publisher.publish(batch))
    }

    fn readiness(&self) -> Result<(), String> {
        if self.client.connection_state() != State::Connected {
            return Err("broker not connected".into());
        }
        let p = &self.publisher;
        // Ready while an SDK-sized batch (100 events) would be admitted at once.
        if p.permits.available_permits() < 100.min(p.capacity) {
            return Err(format!(
                "{} of {} events in flight",
                p.in_flight(),
                p.capacity
            ));
        }
        Ok(())
    }

    fn connected(&self) -> bool {
        self.client.connection_state() == State::Connected
    }

    fn events_in_flight(&self) -> usize {
        self.publisher.in_flight()
    }

    fn stats(&self) -> serde_json::Value {
        let c = &self.publisher.counters;
        let get = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
        let streams: serde_json::Map<String, serde_json::Value> = self
            .streams
            .iter()
            .map(|(name, o)| {
                (
                    name.clone(),
                    json!({"action": o.action, "differences": o.differences,
                           "replicas": o.replicas, "max_bytes": o.max_bytes}),
                )
            })
            .collect();
        json!({
            "batches": get(&c.batches),
            "stored": get(&c.stored),
            "duplicates": get(&c.duplicates),
            "rejected": get(&c.rejected),
            "unavailable": get(&c.unavailable),
            "at_capacity": get(&c.at_capacity),
            "reports": get(&c.reports),
            "in_flight": self.publisher.in_flight(),
            "streams": streams,
        })
    }
}

/// Connects with reconnects for ever (a broker restart must not need a collector restart)
/// and brings both streams to the configured settings.
async fn open(config: &JetStreamConfig) -> Result<Opened, String> {
    let urls: Vec<&str> = config.url.split(',').map(str::trim).collect();
    let client = async_nats::ConnectOptions::new()
        .name("eventspool-collector")
        .max_reconnects(None)
        .reconnect_delay_callback(|attempts| {
            MAX_RECONNECT_DELAY.min(Duration::from_millis(50 * attempts as u64))
        })
        .connect(urls.as_slice())
        .await
        .map_err(|e| format!("connect: {e}"))?;
    let context = jetstream::ContextBuilder::new()
        .timeout(config.ack_timeout)
        // As many permits as the collector's own budget, and an error rather than a wait if
        // they were ever short: the budget (publish.rs) is what makes batches wait, bounded.
        .max_ack_inflight(config.max_in_flight_events)
        .backpressure_on_inflight(false)
        // A dropped ack future (its batch's task ended early) gives its permit back in time.
        .ack_timeout(config.ack_timeout)
        .build(client.clone());
    let mut streams = Vec::new();
    for (name, subject) in [
        (&config.stream, &config.subject),
        (&config.reports_stream, &config.reports_subject),
    ] {
        let wanted = Wanted {
            name: name.clone(),
            subjects: vec![subject.clone()],
            replicas: config.replicas,
            max_bytes: config.max_bytes,
            max_age: config.max_age,
            max_msg_size: config.max_msg_size,
            duplicate_window: config.duplicate_window,
        };
        // A cluster that just started elects its JetStream leader first; its requests time
        // out until then. The start's own bound (START_TIMEOUT) ends the retries.
        let outcome = loop {
            match settings::ensure(&context, &wanted, config.stream_policy).await {
                Ok(outcome) => break outcome,
                // "no suitable peers": the cluster's servers are not all known to it yet.
                Err(e)
                    if e.contains("timed out")
                        || e.contains("no responders")
                        || e.contains("no suitable peers") =>
                {
                    tracing::info!(target: LOG_TARGET, error = %e, "JetStream not ready; retrying");
                    tokio::time::sleep(Duration::from_millis(250)).await;
                }
                Err(e) => return Err(e),
            }
        };
        streams.push((name.clone(), outcome));
    }
    Ok(Opened {
        client,
        context,
        streams,
    })
}
