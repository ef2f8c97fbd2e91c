//! The app's HTTP stack behind the FFI (`HttpTransport`), against the real reference collector
//! on 127.0.0.1: a transport that ignores its timeout.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use eventspool_collector::{CollectorConfig, ReferenceCollector};
use eventspool_ffi::{
    EventSpool, HttpTransport, HttpTransportError, SpoolConfig, TransportRequest, TransportResponse,
};

fn collector() -> ReferenceCollector {
    ReferenceCollector::start(CollectorConfig::default()).expect("collector starts")
}

/// The app's HTTP stack as a foreign trait object, written in Rust: it ignores `timeout_ms`
/// on its first `slow` calls (blocking for `block`), and POSTs to the real collector over a
/// plain socket. It counts how many of its calls run at once.
struct StubbornTransport {
    slow: u64,
    block: Duration,
    calls: AtomicU64,
    active: AtomicU64,
    max_active: AtomicU64,
}

impl HttpTransport for StubbornTransport {
    fn send(&self, request: TransportRequest) -> Result<TransportResponse, HttpTransportError> {
        let now = self.active.fetch_add(1, Ordering::SeqCst) + 1;
        self.max_active.fetch_max(now, Ordering::SeqCst);
        let call = self.calls.fetch_add(1, Ordering::SeqCst);
        if call < self.slow {
            std::thread::sleep(self.block);
        }
        let result = post(&request);
        self.active.fetch_sub(1, Ordering::SeqCst);
        result
    }
}

fn post(request: &TransportRequest) -> Result<TransportResponse, HttpTransportError> {
    let io = |e: std::io::Error| HttpTransportError::Io {
        reason: e.to_string(),
    };
    let rest = request.url.strip_prefix("http://").expect("loopback http");
    let (host, path) = rest.split_once('/').expect("a path");
    let mut stream = TcpStream::connect(host).map_err(|e| HttpTransportError::Connect {
        reason: e.to_string(),
    })?;
    let mut head = format!(
        "{} /{path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\nContent-Length: {}\r\n",
        request.method,
        request.body.len()
    );
    for (k, v) in &request.headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes()).map_err(io)?;
    stream.write_all(&request.body).map_err(io)?;
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).map_err(io)?;
    let text = String::from_utf8_lossy(&answer);
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or(HttpTransportError::Io {
            reason: "no status line".into(),
        })?;
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.as_bytes().to_vec())
        .unwrap_or_default();
    Ok(TransportResponse {
        status,
        headers: Default::default(),
        body,
    })
}

/// A foreign transport that blocks well past `timeout_ms` never has a second request
/// started beside it: at most one call is ever in flight, and everything is delivered once
/// it answers again.
#[test]
fn a_transport_that_ignores_its_timeout_never_has_two_requests_in_flight() {
    let collector = collector();
    let transport = Arc::new(StubbornTransport {
        slow: 3,
        block: Duration::from_millis(1200),
        calls: AtomicU64::new(0),
        active: AtomicU64::new(0),
        max_active: AtomicU64::new(0),
    });
    let config = SpoolConfig {
        endpoint: collector.url(),
        attempt_timeout_ms: Some(100),
        backoff_base_ms: Some(5),
        backoff_cap_ms: Some(20),
        max_auto_attempts: Some(1_000),
        min_batch_interval_ms: Some(0),
        flush_at: Some(1),
        max_batch_events: Some(5),
        ..SpoolConfig::default()
    };
    let spool = EventSpool::new(config, Some(transport.clone()), None, false).unwrap();
    for i in 0..20 {
        spool
            .track("stubborn".into(), format!("{{\"i\":{i}}}"))
            .unwrap();
    }
    assert!(spool.wait_drained(60_000), "did not drain");
    assert_eq!(collector.distinct_count(), 20);
    assert_eq!(
        transport.max_active.load(Ordering::SeqCst),
        1,
        "several requests were in flight at once"
    );
    spool.shutdown(5_000).unwrap();
}
