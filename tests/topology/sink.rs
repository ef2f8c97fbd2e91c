//! The JetStream sink on its own: one in-process collector, one real nats-server, raw HTTP
//! requests, so each answer can be matched against what JetStream holds.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use eventspool_collector::{CollectorConfig, JetStreamConfig, ReferenceCollector, Scripted};
use serde_json::{Value, json};

use crate::nats::NatsServer;
use crate::stream;

const STREAM: &str = "SINKTEST";
/// How long the collector holds a received batch before publishing it: the window in which
/// the test takes the broker away. Far longer than a local SIGTERM/SIGSTOP takes.
const HOLD: Duration = Duration::from_millis(1500);

/// A finished HTTP exchange.
pub struct Answer {
    pub status: u16,
    pub retry_after: Option<String>,
    pub body: Value,
}

/// POSTs a batch and reads the whole answer (`Connection: close`), bounded.
pub fn post(addr: SocketAddr, batch: &Value) -> Answer {
    let body = batch.to_string();
    let mut s = TcpStream::connect(addr).expect("connect to the collector");
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    write!(
        s,
        "POST /v1/batch HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).expect("read the answer");
    let (head, body) = text.split_once("\r\n\r\n").expect("an HTTP answer");
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .expect("a status line");
    let retry_after = head.lines().find_map(|l| {
        let (name, value) = l.split_once(':')?;
        name.eq_ignore_ascii_case("retry-after")
            .then(|| value.trim().to_owned())
    });
    Answer {
        status,
        retry_after,
        body: serde_json::from_str(body).unwrap_or(Value::Null),
    }
}

fn event(id: &str) -> Value {
    json!({"event_id": id, "name": "tap", "timestamp": "2026-12-01T12:00:00.000Z",
           "properties": {"screen": "home"}})
}

pub fn batch(ids: &[&str]) -> Value {
    json!({"sent_at": "2026-12-01T12:00:01.000Z",
           "batch": ids.iter().map(|id| event(id)).collect::<Vec<_>>()})
}

pub fn ids(n: usize) -> Vec<String> {
    ids_from(0, n)
}

/// `n` canonical UUIDs starting at `first`.
pub fn ids_from(first: usize, n: usize) -> Vec<String> {
    (first..first + n)
        .map(|i| format!("01932f5e-7a1b-7c3d-8e4f-{:012x}", i + 1))
        .collect()
}

/// The settings of a test stream on one server: one replica (all a single server holds).
pub fn single(nats: &NatsServer, stream: &str) -> JetStreamConfig {
    JetStreamConfig {
        url: nats.url(),
        stream: stream.into(),
        subject: format!("{}.events", stream.to_lowercase()),
        reports_stream: format!("{stream}_REPORTS"),
        reports_subject: format!("{}.reports", stream.to_lowercase()),
        replicas: 1,
        max_bytes: 64 << 20,
        ..JetStreamConfig::default()
    }
}

fn collector(nats: &NatsServer, ack_timeout: Duration) -> ReferenceCollector {
    let js = JetStreamConfig {
        subject: "sinktest.events".into(),
        ack_timeout,
        retry_after_secs: 3,
        ..single(nats, STREAM)
    };
    ReferenceCollector::start_jetstream(CollectorConfig::default(), &js)
        .expect("collector with a JetStream sink starts")
}

/// POSTs until the collector answers 200 again (its client reconnects after a broker restart
/// within half a second), bounded; returns that answer and the number of 503s before it.
fn post_until_ok(addr: SocketAddr, batch: &Value) -> (Answer, u32) {
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut refused = 0;
    loop {
        let answer = post(addr, batch);
        if answer.status == 200 {
            return (answer, refused);
        }
        assert_eq!(answer.status, 503, "only 503 while the broker comes back");
        refused += 1;
        assert!(Instant::now() < deadline, "collector never reconnected");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn jetstream_sink_stores_each_event_once_by_event_id_and_rejects_bad_ids() {
    let nats = NatsServer::start();
    let c = collector(&nats, Duration::from_secs(5));
    let ids = ids(3);
    let mut all: Vec<&str> = ids.iter().map(String::as_str).collect();
    all.push("not-a-uuid");
    let first = post(c.addr(), &batch(&all));
    assert_eq!(first.status, 200, "{}", first.body);
    assert_eq!(first.body["accepted"], 3, "{}", first.body);
    assert_eq!(first.body["duplicates"], 0, "{}", first.body);
    assert_eq!(
        first.body["rejected"],
        json!([{"event_id": "not-a-uuid", "reason": "event_id is not a UUID"}])
    );
    // The phone resends after a timeout: JetStream recognises every id.
    let again = post(c.addr(), &batch(&all[..3]));
    assert_eq!(again.status, 200, "{}", again.body);
    assert_eq!(
        (&again.body["accepted"], &again.body["duplicates"]),
        (&json!(0), &json!(3)),
        "{}",
        again.body
    );
    let contents = stream::read_all(&nats.url(), STREAM);
    assert_eq!(contents.messages, 3);
    assert_eq!(contents.id_mismatches, 0, "Nats-Msg-Id is the event_id");
    let stored: Vec<&String> = contents.copies.keys().collect();
    assert_eq!(stored, ids.iter().collect::<Vec<_>>());
    println!(
        "sink: a batch of 4 (one id not a UUID) and its resend of 3: rejected {}, in stream {} \
         distinct, {} duplicates absorbed",
        first.body["rejected"].as_array().map_or(0, Vec::len),
        contents.copies.len(),
        again.body["duplicates"]
    );
}

/// The broker goes away after the collector read the batch and before it published it: the
/// client must hear 503 with Retry-After, never 2xx; once the broker is back the same batch is
/// stored, once.
#[test]
fn jetstream_sink_answers_503_when_the_broker_stops_between_receive_and_publish() {
    let mut nats = NatsServer::start();
    let c = collector(&nats, Duration::from_secs(2));
    let (addr, body) = refused_while(&c, || nats.stop());
    nats.restart();
    let (ok, refused) = post_until_ok(addr, &body);
    assert_eq!(ok.body["accepted"], 20, "{}", ok.body);
    let contents = stream::read_all(&nats.url(), STREAM);
    assert_eq!(contents.messages, 20);
    assert!(contents.copies.values().all(|&n| n == 1));
    println!(
        "broker stopped mid-request: answered 503 (Retry-After 3), {refused} more 503 until \
         reconnected, then 200; in stream 20 distinct"
    );
}

/// A broker that hangs (SIGSTOP) after the collector read the batch: no ack within the ack
/// timeout means 503, and the copies that did land once the broker wakes are the duplicates
/// JetStream absorbs when the client resends.
#[test]
fn jetstream_sink_answers_503_when_the_broker_hangs_and_absorbs_the_resend() {
    let nats = NatsServer::start();
    let c = collector(&nats, Duration::from_millis(800));
    let (addr, body) = refused_while(&c, || nats.freeze());
    nats.resume();
    let (ok, refused) = post_until_ok(addr, &body);
    let (new, dup) = (
        ok.body["accepted"].as_u64().unwrap(),
        ok.body["duplicates"].as_u64().unwrap(),
    );
    assert_eq!(new + dup, 20, "{}", ok.body);
    let contents = stream::read_all(&nats.url(), STREAM);
    assert_eq!(contents.messages, 20);
    assert!(contents.copies.values().all(|&n| n == 1));
    println!(
        "broker frozen mid-request: answered 503 after the ack timeout, {refused} more 503, then \
         200 with {new} new and {dup} duplicates absorbed; in stream 20 distinct"
    );
}

/// Sends a batch of 20 that the collector holds for [`HOLD`] after reading it; `fault` takes
/// the broker away meanwhile. The answer must be 503 with the collector's Retry-After, never a
/// 2xx. Returns the collector's address and the batch, for the resend.
fn refused_while(c: &ReferenceCollector, fault: impl FnOnce()) -> (SocketAddr, Value) {
    let ids = ids(20);
    let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
    c.push_script([Scripted::Delay(HOLD)]);
    let addr = c.addr();
    let body = batch(&ids);
    let sent = body.clone();
    let request = std::thread::spawn(move || post(addr, &sent));
    // The request is in the collector's hands (held for HOLD) while the broker goes away.
    assert!(
        wait_until(Duration::from_secs(10), || c.pending_script() == 0),
        "the collector never took the request"
    );
    fault();
    let answer = request.join().unwrap();
    assert_eq!(
        answer.status, 503,
        "a batch JetStream never acknowledged was answered {}: {}",
        answer.status, answer.body
    );
    assert_eq!(answer.retry_after.as_deref(), Some("3"));
    (addr, body)
}

/// Polls a condition a test cannot be woken on, bounded.
fn wait_until(timeout: Duration, mut done: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if done() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    done()
}
