//! Collectors that hang, flood, redirect, lie about Retry-After, or present a bad certificate.

use std::net::TcpListener;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use eventspool::{Config, DeliveryState, EventSpool, ManualClock, PauseReason};
use eventspool_collector::{CollectorConfig, ReferenceCollector, Scripted};
use serde_json::json;

use crate::common::fast_config;

fn status(status: u16, body: String, headers: &[(&str, &str)]) -> Scripted {
    Scripted::Status {
        status,
        body,
        headers: headers
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    }
}

#[test]
fn endless_response_is_cut_by_the_attempt_timeout() {
    let collector = ReferenceCollector::start(CollectorConfig::default()).unwrap();
    collector.push_script([Scripted::Hang, Scripted::Hang]);
    let mut c = fast_config(&collector.url());
    c.attempt_timeout_ms = 200;
    let spool = EventSpool::open(c).unwrap();
    let started = Instant::now();
    spool.track("x", json!({})).unwrap();
    let st = spool
        .wait_for(Duration::from_secs(10), |s| {
            matches!(s.state, DeliveryState::RetryScheduled { .. })
        })
        .expect("a hung attempt never ended");
    let DeliveryState::RetryScheduled { last_error, .. } = st.state else {
        unreachable!()
    };
    assert!(last_error.message.contains("timed out"), "{last_error}");
    assert!(spool.wait_drained(Duration::from_secs(10)));
    // Two hangs of 200 ms plus backoffs of at most 20 ms: far below any timeout of seconds.
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "took {:?}",
        started.elapsed()
    );
    assert_eq!(collector.distinct_count(), 1);
}

#[test]
fn gigantic_response_bodies_are_read_bounded() {
    let collector = ReferenceCollector::start(CollectorConfig::default()).unwrap();
    let huge = "A".repeat(8 << 20);
    collector.push_script([
        status(503, huge.clone(), &[]),
        status(500, format!("{{\"rejected\":[{huge}"), &[]),
    ]);
    let spool = EventSpool::open(fast_config(&collector.url())).unwrap();
    spool.track("x", json!({})).unwrap();
    assert!(
        spool.wait_drained(Duration::from_secs(15)),
        "{:?}",
        spool.state()
    );
    assert_eq!(collector.distinct_count(), 1);
    assert!(spool.stats().balances());
}

#[test]
fn absurd_retry_after_is_capped_and_garbage_ignored() {
    let collector = ReferenceCollector::start(CollectorConfig::default()).unwrap();
    let mut c = fast_config(&collector.url());
    c.retry_after_cap_ms = 300;
    c.backoff_base_ms = 5;
    c.backoff_cap_ms = 20;
    // Every announced retry is recorded (a jittered delay may be 0, so the state itself can be
    // gone before a poll sees it), and a stepped clock makes the test, not the machine's load,
    // decide when the retry happens.
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let record = seen.clone();
    let observer = move |s: &eventspool::DeliveryStatus| {
        if let DeliveryState::RetryScheduled { retry_in_ms, .. } = s.state {
            record.lock().unwrap().push(retry_in_ms);
        }
    };
    let clock = Arc::new(ManualClock::new(1_764_417_600_000));
    let spool = EventSpool::builder(c)
        .clock(Arc::new(clock.clone()))
        .observer(Arc::new(observer))
        .start_offline()
        .open()
        .unwrap();
    for (value, bound) in [
        ("999999999999", 300), // ~31,000 years in seconds
        ("Fri, 31 Dec 9999 23:59:59 GMT", 300),
        ("soon, honestly", 20), // unparseable: the normal backoff applies
        ("-5", 20),
        ("1e9", 20),
    ] {
        seen.lock().unwrap().clear();
        spool.track("x", json!({})).unwrap();
        collector.push_script([status(429, String::new(), &[("Retry-After", value)])]);
        spool.set_online(true);
        let deadline = Instant::now() + Duration::from_secs(10);
        while seen.lock().unwrap().is_empty() {
            assert!(
                Instant::now() < deadline,
                "Retry-After {value:?}: no retry announced: {:?}",
                spool.state()
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        let retry_in_ms = seen.lock().unwrap()[0];
        assert!(
            retry_in_ms <= bound,
            "Retry-After {value:?}: waits {retry_in_ms} ms, bound {bound}"
        );
        // One step past the deadline: the worker sleeps until then, so it parks only once.
        clock.step(
            Duration::from_millis(bound + 1),
            Duration::from_secs(10),
            || spool.state().pending == 0,
        );
        assert!(spool.wait_drained(Duration::from_secs(10)), "{value:?}");
        spool.set_online(false);
        spool
            .wait_for(Duration::from_secs(5), |s| {
                s.state == DeliveryState::Offline
            })
            .unwrap();
    }
    assert_eq!(collector.distinct_count(), 5);
}

#[test]
fn redirects_are_not_followed() {
    let collector = ReferenceCollector::start(CollectorConfig::default()).unwrap();
    let elsewhere = ReferenceCollector::start(CollectorConfig::default()).unwrap();
    collector.push_script([status(
        302,
        String::new(),
        &[("Location", &elsewhere.url())],
    )]);
    let spool = EventSpool::open(fast_config(&collector.url())).unwrap();
    spool.track("x", json!({})).unwrap();
    let st = spool
        .wait_for(Duration::from_secs(10), |s| {
            matches!(s.state, DeliveryState::Paused { .. })
        })
        .expect("a redirect did not pause delivery");
    let DeliveryState::Paused { reason, last_error } = st.state else {
        unreachable!()
    };
    assert_eq!(reason, PauseReason::Config);
    assert_eq!(last_error.status, Some(302));
    assert_eq!(elsewhere.request_count(), 0, "the redirect was followed");
    assert_eq!(spool.stats().pending, 1, "the event must stay queued");
}

#[test]
fn plain_http_to_a_remote_host_is_refused_at_construction() {
    let err = EventSpool::open(Config::new("http://collector.example.com/v1/batch"))
        .err()
        .expect("accepted");
    let text = err.to_string();
    assert!(
        text.contains("endpoint") && text.contains("allow_insecure_http"),
        "{text}"
    );
}

/// A TLS server on 127.0.0.1 with a self-signed certificate: the handshake must fail and the
/// state must say it was the certificate, not a generic network error.
#[test]
fn a_bad_certificate_is_refused_and_the_state_says_why() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    listener.set_nonblocking(true).unwrap();
    let cert =
        rcgen::generate_simple_self_signed(vec!["localhost".into(), "127.0.0.1".into()]).unwrap();
    let key = rustls::pki_types::PrivateKeyDer::Pkcs8(cert.signing_key.serialize_der().into());
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let server_config = Arc::new(
        rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(vec![cert.cert.der().clone()], key)
            .unwrap(),
    );
    let stop = Arc::new(AtomicBool::new(false));
    let handshakes = Arc::new(AtomicUsize::new(0));
    let server = {
        let (stop, handshakes) = (stop.clone(), handshakes.clone());
        std::thread::spawn(move || {
            let deadline = Instant::now() + Duration::from_secs(30);
            while !stop.load(Ordering::SeqCst) && Instant::now() < deadline {
                match listener.accept() {
                    Ok((mut tcp, _)) => {
                        let _ = tcp.set_nonblocking(false);
                        let _ = tcp.set_read_timeout(Some(Duration::from_secs(2)));
                        handshakes.fetch_add(1, Ordering::SeqCst);
                        if let Ok(mut conn) = rustls::ServerConnection::new(server_config.clone()) {
                            while conn.is_handshaking() {
                                if conn.complete_io(&mut tcp).is_err() {
                                    break;
                                }
                            }
                        }
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(10)),
                }
            }
        })
    };
    let mut c = fast_config(&format!("https://localhost:{port}/v1/batch"));
    c.max_auto_attempts = 2;
    let spool = EventSpool::open(c).unwrap();
    spool.track("x", json!({})).unwrap();
    let st = spool
        .wait_for(Duration::from_secs(15), |s| {
            matches!(
                s.state,
                DeliveryState::RetryScheduled { .. } | DeliveryState::WaitingForUser { .. }
            )
        })
        .expect("no failure state for a bad certificate");
    let message = match st.state {
        DeliveryState::RetryScheduled { last_error, .. }
        | DeliveryState::WaitingForUser { last_error, .. } => last_error.message,
        other => panic!("{other:?}"),
    };
    stop.store(true, Ordering::SeqCst);
    let _ = server.join();
    assert!(
        handshakes.load(Ordering::SeqCst) > 0,
        "the client never reached the TLS server"
    );
    let lower = message.to_lowercase();
    assert!(
        lower.contains("certificate") || lower.contains("tls"),
        "state does not say why: {message}"
    );
    assert_eq!(spool.stats().delivered, 0);
    assert_eq!(spool.stats().pending, 1, "the event must stay queued");
}
