//! `fleet --real`: the reconnect herd against the real topology of docs/scale.md instead of the
//! model: a nats-server with JetStream, three JetStream collectors, and a few thousand simulated
//! clients that were offline together and reconnect within a second, each sending its backlog of
//! batches and retrying with the SDK's own full jitter (`eventspool::retry`). First the collectors'
//! capacity is measured in the same run (enough clients in a closed loop to keep them busy); the
//! herd's peak request rate is then reported against it: the herd figure, real instead of modelled.
//!
//! Clients spread over the collectors round-robin on their own (a load balancer's job; the
//! topology test puts nginx there), open a fresh connection per request as a phone coming
//! back from an outage does, and give a request up after the SDK's 10 s attempt timeout.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use eventspool::retry::{AfterFailure, Episode, after_failure, next_delay_ms};
use eventspool_collector::{CollectorConfig, JetStreamConfig, ReferenceCollector};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[path = "../support/nats.rs"]
mod nats;

const COLLECTORS: usize = 3;
const EVENTS_PER_BATCH: usize = 20;
/// The SDK's defaults (src/config.rs): what a real device would do.
const BACKOFF_BASE_MS: u64 = 1_000;
const BACKOFF_CAP_MS: u64 = 15_000;
const MAX_AUTO_ATTEMPTS: u32 = 10;
const MAX_RETRY_ELAPSED_MS: u64 = 60_000;
const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(10);
const WINDOW_MS: u64 = 100;

pub struct RealParams {
    pub clients: usize,
    pub batches_per_client: usize,
    pub reconnect_spread_ms: u64,
}

/// One request's fate, at the client.
enum Sent {
    Ok,
    /// A failure of this kind, with the answer's Retry-After in ms if it had one.
    Failed(Failure, Option<u64>),
}

/// Why a request failed, for the report.
#[derive(Clone, Copy)]
enum Failure {
    /// Connect refused, reset, closed without an answer.
    Connection,
    /// No answer within the attempt timeout.
    Timeout,
    /// An answer that is not 2xx (503 from a collector whose broker did not ack in time).
    Status,
}

fn event(id: &str, i: usize) -> String {
    format!(
        r#"{{"event_id":"{id}","name":"screen_view","timestamp":"2026-12-01T12:00:00.000Z","properties":{{"n":{i},"screen":"settings/notifications"}}}}"#
    )
}

fn body(ids: &[String]) -> String {
    let events: Vec<String> = ids.iter().enumerate().map(|(i, id)| event(id, i)).collect();
    format!(
        r#"{{"sent_at":"2026-12-01T12:00:01.000Z","batch":[{}]}}"#,
        events.join(",")
    )
}

async fn post(addr: SocketAddr, body: &str) -> Sent {
    let exchange = async {
        let mut s = tokio::net::TcpStream::connect(addr).await?;
        let head = format!(
            "POST /v1/batch HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\nConnection: close\r\n\r\n",
            body.len()
        );
        s.write_all(head.as_bytes()).await?;
        s.write_all(body.as_bytes()).await?;
        let mut answer = Vec::new();
        s.read_to_end(&mut answer).await?;
        Ok::<_, std::io::Error>(String::from_utf8_lossy(&answer).into_owned())
    };
    let answer = match tokio::time::timeout(ATTEMPT_TIMEOUT, exchange).await {
        Ok(Ok(a)) if !a.is_empty() => a,
        Ok(_) => return Sent::Failed(Failure::Connection, None),
        Err(_) => return Sent::Failed(Failure::Timeout, None),
    };
    let status = answer.split_whitespace().nth(1).unwrap_or("");
    if status.starts_with('2') {
        return Sent::Ok;
    }
    let retry_after = answer.lines().find_map(|l| {
        let (name, value) = l.split_once(':')?;
        name.eq_ignore_ascii_case("retry-after")
            .then(|| value.trim().parse::<u64>().ok().map(|s| s * 1000))
            .flatten()
    });
    Sent::Failed(Failure::Status, retry_after)
}

/// Request start times (ms since the herd began), shared by every client.
#[derive(Default)]
struct Log {
    starts: std::sync::Mutex<Vec<u64>>,
    failed: [AtomicU64; 3],
    gave_up: AtomicU64,
}

/// One client: its backlog, sent in order, each batch retried with the SDK's budget rule.
async fn client(
    n: usize,
    addrs: Arc<Vec<SocketAddr>>,
    p: Arc<RealParams>,
    log: Arc<Log>,
    t0: Instant,
) -> Option<u64> {
    let mut rng = fastrand::Rng::with_seed(n as u64);
    tokio::time::sleep(Duration::from_millis(rng.u64(0..=p.reconnect_spread_ms))).await;
    let mut pick = n;
    for _ in 0..p.batches_per_client {
        let ids: Vec<String> = (0..EVENTS_PER_BATCH)
            .map(|_| uuid::Uuid::now_v7().to_string())
            .collect();
        let body = body(&ids);
        let mut episode: Option<Episode> = None;
        loop {
            let addr = addrs[pick % addrs.len()];
            pick += 1;
            let now = t0.elapsed().as_millis() as u64;
            log.starts.lock().unwrap().push(now);
            let retry_after = match post(addr, &body).await {
                Sent::Ok => break,
                Sent::Failed(kind, retry_after) => {
                    log.failed[kind as usize].fetch_add(1, Ordering::Relaxed);
                    retry_after
                }
            };
            let now = t0.elapsed().as_millis() as u64;
            let e = Episode::record_failure(&mut episode, now);
            let attempt = e.failures;
            let delay = next_delay_ms(
                attempt,
                BACKOFF_BASE_MS,
                BACKOFF_CAP_MS,
                retry_after,
                300_000,
                rng.f64(),
            );
            match after_failure(
                e,
                now,
                false,
                MAX_AUTO_ATTEMPTS,
                MAX_RETRY_ELAPSED_MS,
                delay,
            ) {
                AfterFailure::Retry { delay_ms, .. } => {
                    tokio::time::sleep(Duration::from_millis(delay_ms)).await
                }
                AfterFailure::WaitForUser { .. } => {
                    log.gave_up.fetch_add(1, Ordering::Relaxed);
                    return None;
                }
            }
        }
    }
    Some(t0.elapsed().as_millis() as u64)
}

/// Requests the collectors complete per second with `concurrency` clients in a closed loop.
async fn capacity(addrs: &[SocketAddr], concurrency: usize, secs: u64) -> f64 {
    let until = Instant::now() + Duration::from_secs(secs);
    let done = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let tasks: Vec<_> = (0..concurrency)
        .map(|n| {
            let addr = addrs[n % addrs.len()];
            let done = Arc::clone(&done);
            tokio::spawn(async move {
                while Instant::now() < until {
                    let ids: Vec<String> = (0..EVENTS_PER_BATCH)
                        .map(|_| uuid::Uuid::now_v7().to_string())
                        .collect();
                    if let Sent::Ok = post(addr, &body(&ids)).await {
                        done.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    for t in tasks {
        let _ = t.await;
    }
    done.load(Ordering::Relaxed) as f64 / started.elapsed().as_secs_f64()
}

pub fn run(p: RealParams) {
    let dir = tempfile::tempdir().expect("temp dir");
    let broker = nats::Broker::start(&dir.path().join("jetstream"));
    let js = JetStreamConfig {
        url: broker.url(),
        stream: "FLEET".into(),
        subject: "fleet.events".into(),
        // One server holds one replica.
        replicas: 1,
        ..JetStreamConfig::default()
    };
    let collectors: Vec<ReferenceCollector> = (0..COLLECTORS)
        .map(|_| {
            let config = CollectorConfig {
                max_request_records: 0,
                ..CollectorConfig::default()
            };
            ReferenceCollector::start_jetstream(config, &js).expect("collector starts")
        })
        .collect();
    let addrs = Arc::new(collectors.iter().map(|c| c.addr()).collect::<Vec<_>>());
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    let capacity = runtime.block_on(capacity(&addrs, 64, 3));
    let received = || collectors.iter().map(|c| c.received_count()).sum::<u64>();
    let before_herd = received();
    let p = Arc::new(p);
    let log = Arc::new(Log::default());
    let t0 = Instant::now();
    let finished: Vec<Option<u64>> = runtime.block_on(async {
        let tasks: Vec<_> = (0..p.clients)
            .map(|n| {
                tokio::spawn(client(
                    n,
                    Arc::clone(&addrs),
                    Arc::clone(&p),
                    Arc::clone(&log),
                    t0,
                ))
            })
            .collect();
        let mut out = Vec::with_capacity(tasks.len());
        for t in tasks {
            out.push(t.await.unwrap_or(None));
        }
        out
    });
    let mut starts = log.starts.lock().unwrap().clone();
    starts.sort_unstable();
    let mut windows = std::collections::BTreeMap::<u64, u64>::new();
    for s in &starts {
        *windows.entry(s / WINDOW_MS).or_insert(0) += 1;
    }
    let peak = windows.values().copied().max().unwrap_or(0) * (1000 / WINDOW_MS);
    let drained = finished.iter().filter(|f| f.is_some()).count();
    let failed: Vec<u64> = log
        .failed
        .iter()
        .map(|f| f.load(Ordering::Relaxed))
        .collect();
    let drain_ms = finished.iter().flatten().max().copied().unwrap_or(0);
    // Events of the herd's 2xx answers (duplicates included), against what it had to send,
    // and what the stream holds, read back from it.
    let acked = received() - before_herd;
    let backlog = (p.clients * p.batches_per_client * EVENTS_PER_BATCH) as u64;
    let (in_stream, distinct) = runtime.block_on(read_stream(&broker.url(), "FLEET"));
    let stored = in_stream;
    eprintln!(
        "fleet --real: {} clients x {} batches of {EVENTS_PER_BATCH} events, reconnecting within \
         {} ms, into {COLLECTORS} JetStream collectors and one nats-server on this machine",
        p.clients, p.batches_per_client, p.reconnect_spread_ms
    );
    eprintln!(
        "  measured capacity {capacity:.0} req/s; herd peak {peak} req/s over {WINDOW_MS} ms \
         windows = {:.1} x capacity; {} requests ({} connection failures, {} timeouts, {} non-2xx \
         answers, each retried with full jitter), {drained} \
         of {} clients drained in {:.1} s, {} gave up; {acked} events of 2xx answers; the \
         stream holds {stored} messages, {distinct} distinct ids (the capacity run's included), \
         of the herd's {backlog}",
        peak as f64 / capacity,
        starts.len(),
        failed[0],
        failed[1],
        failed[2],
        p.clients,
        drain_ms as f64 / 1000.0,
        log.gave_up.load(Ordering::Relaxed),
    );
    println!(
        "{}",
        serde_json::json!({
            "mode": "real", "clients": p.clients, "batches_per_client": p.batches_per_client,
            "events_per_batch": EVENTS_PER_BATCH, "collectors": COLLECTORS,
            "capacity_req_per_s": capacity, "peak_req_per_s": peak, "peak_window_ms": WINDOW_MS,
            "peak_over_capacity": peak as f64 / capacity, "requests": starts.len(),
            "connection_failures": failed[0], "timeouts": failed[1], "non_2xx": failed[2], "drained_clients": drained,
            "drain_s": drain_ms as f64 / 1000.0, "events_acked": acked, "events_sent": backlog,
            "stream_messages": stored, "stream_distinct_ids": distinct,
        })
    );
    drop(collectors);
    drop(broker);
}

/// The stream's message count and distinct `event_id`s, read from the stream itself.
async fn read_stream(url: &str, stream: &str) -> (u64, u64) {
    use async_nats::jetstream::{self, consumer::pull::OrderedConfig};
    use futures_util::StreamExt;
    let client = async_nats::connect(url).await.expect("connect");
    let context = jetstream::new(client);
    let mut handle = context.get_stream(stream).await.expect("stream");
    let messages = handle.info().await.expect("info").state.messages;
    let consumer = handle
        .create_consumer(OrderedConfig::default())
        .await
        .expect("consumer");
    let mut reading = consumer.messages().await.expect("messages");
    let mut ids = std::collections::HashSet::new();
    for _ in 0..messages {
        let message = tokio::time::timeout(Duration::from_secs(20), reading.next())
            .await
            .expect("stream read stalled")
            .expect("stream ended")
            .expect("message");
        let event: serde_json::Value = serde_json::from_slice(&message.payload).expect("JSON");
        ids.insert(event["event_id"].as_str().unwrap_or("").to_owned());
    }
    (messages, ids.len() as u64)
}
