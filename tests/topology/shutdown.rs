//! The collector process as a service: SIGTERM drains it (readiness fails, requests in flight
//! finish with their acks, exit 0), and it listens on any address with per-project keys.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use crate::collectors::CollectorProcess;
use crate::nats::NatsServer;
use crate::process::signal;
use crate::sink::{batch, ids};

fn post(addr: SocketAddr, body: &str, key: Option<&str>) -> Result<u16, String> {
    let mut s = TcpStream::connect(addr).map_err(|e| format!("connect: {e}"))?;
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let auth = key.map_or(String::new(), |k| format!("Authorization: Bearer {k}\r\n"));
    write!(
        s,
        "POST /v1/batch HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n{auth}\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .map_err(|e| e.to_string())?;
    let mut text = String::new();
    s.read_to_string(&mut text)
        .map_err(|e| format!("read: {e}"))?;
    text.split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("no HTTP answer (connection closed): {text:?}"))
}

/// Defect 7: SIGTERM killed the process outright and aborted requests in flight.
#[test]
fn service_sigterm_drains_the_request_in_flight_and_exits_0() {
    let nats = NatsServer::start();
    let dir = tempfile::tempdir().unwrap();
    let mut c = CollectorProcess::start_with(
        &nats.url(),
        "DRAIN",
        0.0,
        1,
        &dir.path().join("collector.log"),
        &[
            "--replicas",
            "1",
            "--ack-timeout-ms",
            "6000",
            "--drain-announce-ms",
            "1000",
        ],
    );
    let addr = c.addr;
    // The broker stops answering: the batch waits for its acks in the collector.
    nats.freeze();
    let ids = ids(20);
    let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
    let body = batch(&ids).to_string();
    let request = std::thread::spawn(move || post(addr, &body, None));
    let deadline = Instant::now() + Duration::from_secs(10);
    while !c
        .get("/metrics")
        .is_some_and(|(_, m)| m.contains("eventspool_collector_requests_in_flight 1"))
    {
        assert!(
            Instant::now() < deadline,
            "the batch never reached the collector"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let terminated = Instant::now();
    signal_term(&c);
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match c.get("/readyz") {
            Some((503, body)) if body.contains("draining") => break,
            other => assert!(
                Instant::now() < deadline,
                "readiness did not fail on SIGTERM: {other:?}"
            ),
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    nats.resume();
    let answer = request.join().unwrap();
    assert_eq!(
        answer,
        Ok(200),
        "the request in flight at SIGTERM was answered"
    );
    let code = c.terminate(Duration::from_secs(15));
    let took = terminated.elapsed();
    assert_eq!(code, Some(0), "a clean drain exits 0:\n{}", c.log_text());
    assert!(
        TcpStream::connect_timeout(&addr, Duration::from_millis(300)).is_err(),
        "nothing listens after the drain"
    );
    println!(
        "shutdown: SIGTERM with a batch waiting for acks: readiness 503, the batch answered 200, exit 0 after {took:.1?}"
    );
}

fn signal_term(c: &CollectorProcess) {
    signal(c.child(), "TERM");
}

/// Defect 8: keys per project from a file, 401 without one (admin endpoints too), and
/// `--listen` on any address.
#[test]
fn service_keys_from_a_file_and_any_listen_address() {
    let nats = NatsServer::start();
    let dir = tempfile::tempdir().unwrap();
    let keys = dir.path().join("keys");
    std::fs::write(
        &keys,
        "# project key\nshop shop-key-0123456789\nblog blog-key-0123456789\n",
    )
    .unwrap();
    let c = CollectorProcess::start_with(
        &nats.url(),
        "KEYS",
        0.0,
        1,
        &dir.path().join("collector.log"),
        &[
            "--replicas",
            "1",
            "--listen",
            "0.0.0.0:0",
            "--keys",
            keys.to_str().unwrap(),
        ],
    );
    let ids = ids(2);
    let body = batch(&[&ids[0], &ids[1]]).to_string();
    assert_eq!(post(c.addr, &body, None), Ok(401));
    assert_eq!(post(c.addr, &body, Some("shop-key-01234567")), Ok(401));
    assert_eq!(post(c.addr, &body, Some("shop-key-0123456789")), Ok(200));
    assert_eq!(post(c.addr, &body, Some("blog-key-0123456789")), Ok(200));
    assert_eq!(c.get("/stats").map(|(s, _)| s), Some(401));
    assert_eq!(c.get("/readyz").map(|(s, _)| s), Some(200));
    let stats = c
        .stats_with_key("blog-key-0123456789")
        .expect("stats with a key");
    assert_eq!(stats["sink"]["stored"], 4, "2 events × 2 projects: {stats}");
}
