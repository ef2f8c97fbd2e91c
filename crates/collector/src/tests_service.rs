//! The collector as a service: its bounds, its own endpoints, its keys and its drain, over real
//! loopback sockets. Raw `TcpStream`s where the point is what happens on the connection.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::*;

const TS: &str = "2026-11-29T11:58:00.001Z";
/// Bounds every read of a test: a collector that leaves a client waiting fails here.
const READ_BOUND: Duration = Duration::from_secs(5);

fn start(config: CollectorConfig) -> ReferenceCollector {
    ReferenceCollector::start(config).expect("collector starts")
}

fn batch(n: usize) -> String {
    let events: Vec<Value> = (0..n)
        .map(|i| {
            json!({"event_id": format!("e-{i}"), "name": "tap", "timestamp": TS,
                   "properties": {"i": i}})
        })
        .collect();
    json!({"sent_at": TS, "batch": events}).to_string()
}

fn connect(addr: SocketAddr) -> TcpStream {
    let s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(READ_BOUND)).unwrap();
    s
}

/// Sends `head` then `body` on a fresh connection and reads until the server closes it or the
/// bound passes; returns what was read (a timeout is a failure with what came so far).
fn exchange(addr: SocketAddr, head: &str, body: &str) -> Result<String, String> {
    let mut s = connect(addr);
    s.write_all(head.as_bytes()).map_err(|e| e.to_string())?;
    let _ = s.write_all(body.as_bytes());
    read_all(&mut s)
}

/// One answer, read up to the end its `content-length` gives, whether or not the connection
/// closes after it.
fn read_answer(s: &mut TcpStream) -> Result<String, String> {
    let mut out = Vec::new();
    let mut buf = [0u8; 8192];
    loop {
        let text = String::from_utf8_lossy(&out).into_owned();
        if let Some((head, body)) = text.split_once("\r\n\r\n") {
            let length = head
                .lines()
                .find_map(|l| {
                    l.to_ascii_lowercase()
                        .strip_prefix("content-length:")
                        .map(|v| v.trim().to_string())
                })
                .and_then(|v| v.parse::<usize>().ok())
                .unwrap_or(0);
            if body.len() >= length {
                return Ok(text);
            }
        }
        match s.read(&mut buf) {
            Ok(0) => return Ok(text),
            Ok(n) => out.extend_from_slice(&buf[..n]),
            Err(e) => return Err(format!("{e} after reading {text:?}")),
        }
    }
}

fn read_all(s: &mut TcpStream) -> Result<String, String> {
    let mut out = Vec::new();
    let mut buf = [0u8; 8192];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return Ok(String::from_utf8_lossy(&out).into_owned()),
            Ok(n) => out.extend_from_slice(&buf[..n]),
            // A reset after the answer arrived still leaves the answer to look at.
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset && !out.is_empty() => {
                return Ok(String::from_utf8_lossy(&out).into_owned());
            }
            Err(e) => {
                return Err(format!(
                    "{e} after reading {:?}",
                    String::from_utf8_lossy(&out)
                ));
            }
        }
    }
}

fn request(method: &str, path: &str, body: &str, extra: &str) -> String {
    format!(
        "{method} {path} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n\
         content-length: {}\r\nconnection: close\r\n{extra}\r\n{body}",
        body.len()
    )
}

fn post(addr: SocketAddr, path: &str, body: &str, extra: &str) -> String {
    exchange(addr, &request("POST", path, body, extra), "").expect("an answer")
}

fn get(addr: SocketAddr, path: &str, extra: &str) -> String {
    exchange(addr, &request("GET", path, "", extra), "").expect("an answer")
}

fn status(answer: &str) -> u16 {
    answer
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

fn limits(f: impl FnOnce(&mut Limits)) -> CollectorConfig {
    let mut config = CollectorConfig::default();
    f(&mut config.limits);
    config
}

#[test]
fn service_a_body_declared_past_the_limit_is_413_before_it_is_sent() {
    let c = start(CollectorConfig::default());
    // A 57 MB batch announced: the answer must come without the body being sent.
    let head = "POST /v1/batch HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n\
                content-length: 57000000\r\nconnection: close\r\n\r\n";
    let started = Instant::now();
    let mut s = connect(c.addr());
    s.write_all(head.as_bytes()).unwrap();
    // The connection stays open after the answer (the refused body would be read and thrown
    // away, so a client still writing it can read the 413): read the answer by its length.
    let answer = read_answer(&mut s).expect("answered before the body");
    assert_eq!(status(&answer), 413, "{answer}");
    assert!(started.elapsed() < READ_BOUND);
    assert_eq!(c.requests()[0].outcome, "too large");
}

#[test]
fn service_a_batch_past_max_batch_events_is_413() {
    let c = start(CollectorConfig::default());
    let answer = post(c.addr(), "/v1/batch", &batch(MAX_BATCH_EVENTS + 1), "");
    assert_eq!(status(&answer), 413, "{answer}");
    assert!(answer.contains("send smaller batches"), "{answer}");
    assert_eq!(c.distinct_count(), 0);
    let ok = post(c.addr(), "/v1/batch", &batch(MAX_BATCH_EVENTS), "");
    assert_eq!(status(&ok), 200, "{ok}");
}

#[test]
fn service_a_connection_past_the_limit_gets_503_with_retry_after() {
    let c = start(limits(|l| l.max_connections = 2));
    let held: Vec<TcpStream> = (0..2).map(|_| connect(c.addr())).collect();
    // The two held connections are accepted before the third arrives.
    std::thread::sleep(Duration::from_millis(200));
    let answer = exchange(c.addr(), &request("POST", "/v1/batch", &batch(1), ""), "")
        .expect("the connection past the limit is answered, not dropped");
    assert_eq!(status(&answer), 503, "{answer}");
    assert!(
        answer.to_ascii_lowercase().contains("retry-after: 1"),
        "{answer}"
    );
    drop(held);
}

#[test]
fn service_a_trickling_client_is_cut_off_at_the_header_timeout() {
    let c = start(limits(|l| {
        l.header_read_timeout = Duration::from_millis(300)
    }));
    let mut s = connect(c.addr());
    s.write_all(b"POST /v1/batch HTTP/1.1\r\nhost: x\r\n")
        .unwrap();
    let started = Instant::now();
    // Never finishes the head: the server must close the connection by itself.
    let closed = read_all(&mut s);
    assert!(
        closed.is_ok(),
        "a trickling client held the connection: {closed:?}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
}

#[test]
fn service_a_body_that_stops_arriving_gets_408() {
    let c = start(limits(|l| l.request_timeout = Duration::from_millis(300)));
    let mut s = connect(c.addr());
    let body = batch(3);
    write!(
        s,
        "POST /v1/batch HTTP/1.1\r\nhost: x\r\ncontent-length: {}\r\n\r\n{}",
        body.len(),
        &body[..10]
    )
    .unwrap();
    let answer = read_all(&mut s).expect("answered while the body never completes");
    assert_eq!(status(&answer), 408, "{answer}");
    assert_eq!(c.requests()[0].outcome, "body timeout");
}

#[test]
fn service_requests_past_the_in_flight_bound_get_503_at_once() {
    let c = start(CollectorConfig {
        behavior: Behavior {
            delay: Some(Duration::from_millis(1500)),
            ..Behavior::default()
        },
        ..limits(|l| l.max_requests_in_flight = 2)
    });
    let addr = c.addr();
    let slow: Vec<_> = (0..2)
        .map(|_| std::thread::spawn(move || post(addr, "/v1/batch", &batch(1), "")))
        .collect();
    assert!(
        wait(|| c.shared.in_flight() == 2),
        "two requests are in flight"
    );
    let started = Instant::now();
    let third = post(addr, "/v1/batch", &batch(1), "");
    assert_eq!(status(&third), 503, "{third}");
    assert!(
        third.to_ascii_lowercase().contains("retry-after"),
        "{third}"
    );
    assert!(
        started.elapsed() < Duration::from_millis(1000),
        "shed at once, not after the others: {:?}",
        started.elapsed()
    );
    for t in slow {
        assert_eq!(status(&t.join().unwrap()), 200);
    }
}

#[test]
fn service_admin_paths_take_no_post_and_store_nothing() {
    let c = start(CollectorConfig::default());
    for path in ["/stats", "/fleet", "/metrics", "/livez", "/readyz"] {
        let answer = post(c.addr(), path, &batch(2), "");
        assert_eq!(status(&answer), 405, "POST {path}: {answer}");
    }
    assert_eq!(c.distinct_count(), 0, "no batch was taken on an admin path");
    let only = start(CollectorConfig {
        batch_path: Some("/v1/batch".into()),
        ..CollectorConfig::default()
    });
    assert_eq!(status(&post(only.addr(), "/v2/other", &batch(1), "")), 404);
    assert_eq!(status(&post(only.addr(), "/v1/batch", &batch(1), "")), 200);
}

#[test]
fn service_liveness_readiness_and_their_failure_while_draining() {
    let c = start(CollectorConfig::default());
    assert_eq!(status(&get(c.addr(), "/livez", "")), 200);
    let ready = get(c.addr(), "/readyz", "");
    assert_eq!(status(&ready), 200, "{ready}");
    c.shared.set_draining();
    let draining = get(c.addr(), "/readyz", "");
    assert_eq!(status(&draining), 503, "{draining}");
    assert!(draining.contains("draining"), "{draining}");
    assert_eq!(status(&get(c.addr(), "/livez", "")), 200, "still alive");
}

#[test]
fn service_project_keys_gate_batches_and_admin_endpoints() {
    let keys = ApiKeys::new([
        ("shop", "shop-key-0123456789"),
        ("blog", "blog-key-0123456789"),
    ])
    .unwrap();
    let c = start(CollectorConfig {
        api_keys: Some(keys),
        ..CollectorConfig::default()
    });
    let auth = "authorization: Bearer shop-key-0123456789\r\n";
    assert_eq!(status(&post(c.addr(), "/v1/batch", &batch(1), "")), 401);
    let wrong = "authorization: Bearer shop-key-012345678\r\n";
    assert_eq!(status(&post(c.addr(), "/v1/batch", &batch(1), wrong)), 401);
    assert_eq!(status(&post(c.addr(), "/v1/batch", &batch(1), auth)), 200);
    assert_eq!(status(&get(c.addr(), "/stats", "")), 401);
    assert_eq!(status(&get(c.addr(), "/metrics", "")), 401);
    assert_eq!(status(&get(c.addr(), "/stats", auth)), 200);
    // A balancer's health checks need no key.
    assert_eq!(status(&get(c.addr(), "/readyz", "")), 200);
}

#[test]
fn service_metrics_are_prometheus_text() {
    let c = start(CollectorConfig::default());
    post(c.addr(), "/v1/batch", &batch(3), "");
    post(c.addr(), "/v1/batch", &batch(3), "");
    let text = get(c.addr(), "/metrics", "");
    assert_eq!(status(&text), 200, "{text}");
    for line in [
        "eventspool_collector_requests_total{status=\"200\"} 2",
        "eventspool_collector_events_total{outcome=\"accepted\"} 3",
        "eventspool_collector_events_total{outcome=\"duplicate\"} 3",
        "eventspool_collector_store_seconds_count 2",
        "eventspool_collector_requests_in_flight 0",
        "eventspool_collector_broker_connected 1",
        "eventspool_collector_ready 1",
    ] {
        assert!(text.contains(line), "missing {line:?} in:\n{text}");
    }
}

#[test]
fn service_drain_finishes_the_request_in_flight_then_refuses_connections() {
    let c = start(CollectorConfig::default());
    let addr = c.addr();
    c.push_script([Scripted::Delay(Duration::from_millis(800))]);
    let in_flight = std::thread::spawn(move || post(addr, "/v1/batch", &batch(2), ""));
    assert!(
        wait(|| c.shared.in_flight() == 1),
        "the request is in flight"
    );
    let report = c.drain(Duration::from_millis(100), Duration::from_secs(5));
    let answer = in_flight.join().unwrap();
    assert_eq!(
        status(&answer),
        200,
        "the request in flight was answered: {answer}"
    );
    assert_eq!(report.requests_cut, 0, "{report:?}");
    assert!(
        TcpStream::connect_timeout(&addr, Duration::from_millis(500)).is_err(),
        "after the drain nothing listens"
    );
}

/// Polls a condition the test cannot be woken on, bounded.
fn wait(mut done: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + READ_BOUND;
    while Instant::now() < deadline {
        if done() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    done()
}
