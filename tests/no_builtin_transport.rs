//! The SDK built without its `reqwest` feature (what a mobile app that brings its own HTTP stack
//! links): a spool needs a `Transport` from the app, says so at `open()` naming `transport`,
//! and delivers through the one it is given. `.ci/run` runs it:
//! `cargo test -p eventspool --no-default-features --test no_builtin_transport`.
#![cfg(not(feature = "reqwest"))]

use std::sync::Arc;
use std::time::Duration;

use eventspool::{Config, Error, EventSpool, HttpRequest, HttpResponse, Transport, TransportError};
use eventspool_collector::{CollectorConfig, ReferenceCollector};
use futures_util::future::BoxFuture;

#[test]
fn open_without_a_transport_is_refused_naming_it() {
    let collector = ReferenceCollector::start(CollectorConfig::default()).unwrap();
    match EventSpool::open(Config::new(collector.url())) {
        Err(Error::Config(e)) => {
            assert_eq!(e.field, "transport", "{e}");
            assert!(e.reason.contains("SpoolBuilder::transport"), "{e}");
        }
        Err(other) => panic!("wrong error: {other}"),
        Ok(_) => panic!("opened without any HTTP transport"),
    }
    assert_eq!(collector.request_count(), 0);
}

/// The app's own stack, here a plain HTTP/1.1 POST over a socket to the loopback collector.
struct PlainHttp;

impl Transport for PlainHttp {
    fn send(
        &self,
        request: HttpRequest,
    ) -> BoxFuture<'static, Result<HttpResponse, TransportError>> {
        Box::pin(async move {
            tokio::task::spawn_blocking(move || post(&request))
                .await
                .map_err(|e| TransportError::Io(e.to_string()))?
        })
    }
}

fn post(request: &HttpRequest) -> Result<HttpResponse, TransportError> {
    use std::io::{Read, Write};
    let io = |e: std::io::Error| TransportError::Io(e.to_string());
    let rest = request.url.strip_prefix("http://").expect("loopback http");
    let (host, path) = rest.split_once('/').expect("a path");
    let mut stream = std::net::TcpStream::connect(host).map_err(io)?;
    stream.set_read_timeout(Some(request.timeout)).map_err(io)?;
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
    let split = answer
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| TransportError::Io("no end of headers".into()))?;
    let head = String::from_utf8_lossy(&answer[..split]).to_string();
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| TransportError::Io("no status line".into()))?;
    Ok(HttpResponse {
        status,
        headers: Vec::new(),
        body: answer[split + 4..].to_vec(),
        truncated: false,
    })
}

#[test]
fn a_transport_from_the_app_delivers() {
    let collector = ReferenceCollector::start(CollectorConfig::default()).unwrap();
    let mut config = Config::new(collector.url());
    config.min_batch_interval_ms = 0;
    let spool = EventSpool::builder(config)
        .transport(Arc::new(PlainHttp))
        .open()
        .unwrap();
    let ids: Vec<String> = (0..3)
        .map(|i| {
            spool
                .track("e", serde_json::json!({ "i": i }))
                .unwrap()
                .to_string()
        })
        .collect();
    spool.flush();
    let status = spool.wait_for(Duration::from_secs(30), |s| s.pending == 0);
    assert_eq!(status.map(|s| s.pending), Some(0));
    assert!(ids.iter().all(|id| collector.contains(id)), "{ids:?}");
    spool.shutdown(Duration::from_secs(5)).unwrap();
}
