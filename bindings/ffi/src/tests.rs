//! The FFI surface's own tests (the generated bindings are tested in each language's suite).

use super::*;

#[test]
fn a_non_finite_number_is_named() {
    for (json, word) in [
        (r#"{"score": NaN}"#, "NaN"),
        (r#"{"a": 1, "b": Infinity}"#, "Infinity"),
        ("{\n \"c\": [1, -Infinity]}", "-Infinity"),
    ] {
        let Err(Error::InvalidEvent(reason)) = parse_properties(json) else {
            panic!("{json} was accepted");
        };
        assert!(
            reason.contains(&format!("({word} is not a JSON number")),
            "{json}: {reason}"
        );
    }
    let Err(Error::InvalidEvent(reason)) = parse_properties(r#"{"a": nope}"#) else {
        panic!("accepted");
    };
    assert!(!reason.contains("not a JSON number"), "{reason}");
}

#[test]
fn absent_fields_keep_the_defaults() {
    let c = Config::try_from(SpoolConfig {
        endpoint: "https://x.example/b".into(),
        ..Default::default()
    })
    .unwrap();
    let d = Config::new("https://x.example/b");
    assert_eq!(
        (c.flush_at, c.backoff_cap_ms, c.max_auto_attempts),
        (d.flush_at, d.backoff_cap_ms, d.max_auto_attempts)
    );
}

#[test]
fn max_event_sends_passes_through() {
    let c = Config::try_from(SpoolConfig {
        endpoint: "https://x.example/b".into(),
        max_event_sends: Some(3),
        ..Default::default()
    })
    .unwrap();
    assert_eq!(c.max_event_sends, 3);
}

#[test]
fn bad_config_names_the_field() {
    let bad = SpoolConfig {
        endpoint: "https://x.example".into(),
        flush_at: Some(0),
        ..Default::default()
    };
    match Config::try_from(bad) {
        Err(SpoolError::InvalidConfig { field, .. }) => assert_eq!(field, "flush_at"),
        other => panic!("{other:?}"),
    }
    let bad = SpoolConfig {
        endpoint: "https://x.example".into(),
        compression: Some("zip".into()),
        ..Default::default()
    };
    assert!(
        matches!(Config::try_from(bad), Err(SpoolError::InvalidConfig { field, .. }) if field == "compression")
    );
}

/// Regression: a `flush()` made before the worker's first turn used to be swallowed.
#[cfg(feature = "reqwest")]
#[test]
fn flush_right_after_open_delivers() {
    use eventspool_collector::{CollectorConfig, ReferenceCollector};
    let collector = ReferenceCollector::start(CollectorConfig::default()).unwrap();
    for _ in 0..5 {
        let config = SpoolConfig {
            endpoint: collector.url(),
            min_batch_interval_ms: Some(0),
            ..Default::default()
        };
        let spool = EventSpool::new(config, None, None, false).unwrap();
        spool.track("e".into(), "{}".into()).unwrap();
        spool.flush();
        assert!(spool.wait_drained(10_000), "{}", spool.state().summary);
        spool.shutdown(2_000).unwrap();
    }
    assert_eq!(collector.distinct_count(), 5);
}

#[test]
fn debug_never_prints_the_api_key() {
    let record = SpoolConfig {
        endpoint: "https://x.example/b".into(),
        api_key: Some("sk-live-0123456789".into()),
        ..Default::default()
    };
    let text = format!("{record:?} {record:#?}");
    assert!(!text.contains("sk-live-0123456789"), "{text}");
    assert!(text.contains("api_key"), "the field is still shown: {text}");
    let config = Config::try_from(record).unwrap();
    let text = format!("{config:?}");
    assert!(!text.contains("sk-live-0123456789"), "{text}");
}

/// The request handed to the app's transport carries the key in `Authorization`; logging it
/// with `{:?}` must not print the key.
#[test]
fn debug_of_a_transport_request_never_prints_the_api_key() {
    let request = foreign::TransportRequest {
        method: "POST".into(),
        url: "https://x.example/b".into(),
        headers: [(
            "Authorization".to_string(),
            "Bearer sk-live-0123456789".to_string(),
        )]
        .into_iter()
        .collect(),
        body: b"{}".to_vec(),
        timeout_ms: 12_000,
        stall_timeout_ms: 1_000,
        max_response_bytes: 65_536,
    };
    let text = format!("{request:?} {request:#?}");
    assert!(!text.contains("sk-live-0123456789"), "{text}");
    assert!(
        text.contains("Authorization"),
        "the header is still named: {text}"
    );
}

/// The app's transport hands over whatever it read; the adapter keeps the batch's bound and
/// says when it cut, so a long 2xx is never mistaken for a whole one.
#[test]
fn a_foreign_answer_over_the_bound_comes_back_marked_cut() {
    use eventspool::{HttpRequest, Transport, response_bound};
    struct Answers(usize);
    impl foreign::HttpTransport for Answers {
        fn send(
            &self,
            _request: foreign::TransportRequest,
        ) -> Result<foreign::TransportResponse, foreign::HttpTransportError> {
            Ok(foreign::TransportResponse {
                status: 200,
                headers: Default::default(),
                body: vec![b' '; self.0],
            })
        }
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let bound = response_bound(10);
    for (len, cut) in [(bound, false), (bound + 1, true), (10 << 20, true)] {
        let adapter = foreign::TransportAdapter::new(Arc::new(Answers(len)));
        let request = HttpRequest {
            method: "POST".into(),
            url: "https://x.example/b".into(),
            headers: Vec::new(),
            body: Vec::new(),
            stall_timeout: std::time::Duration::from_secs(1),
            timeout: std::time::Duration::from_secs(1),
            max_response_bytes: bound,
        };
        let response = runtime.block_on(adapter.send(request)).unwrap();
        assert_eq!(
            (response.body.len(), response.truncated),
            (len.min(bound), cut),
            "{len}"
        );
    }
}

#[test]
fn open_failures_keep_their_kind_across_the_ffi() {
    let e = SpoolError::from(Error::HttpClient {
        source: eventspool::TransportError::Tls("no roots".into()),
    });
    assert_eq!(
        e,
        SpoolError::HttpClient {
            reason: "HTTP client: TLS: no roots".into()
        }
    );
    let e = SpoolError::from(Error::Runtime {
        what: "the delivery runtime",
        source: std::io::Error::other("out of memory"),
    });
    assert_eq!(
        e,
        SpoolError::Runtime {
            reason: "the delivery runtime: out of memory".into()
        }
    );
}

/// The FFI handle is what a Kotlin/Swift/Python app holds: removing or dropping it must
/// release the spool's reference to the foreign observer, or the foreign GC can never
/// collect it (nor the screen it captures).
#[test]
fn the_ffi_handle_releases_the_foreign_observer() {
    struct Quiet;
    impl foreign::DeliveryObserver for Quiet {
        fn on_state(&self, _: DeliveryStatus) -> Result<(), foreign::ObserverError> {
            Ok(())
        }
        fn on_notice(&self, _: SpoolNotice) -> Result<(), foreign::ObserverError> {
            Ok(())
        }
    }
    let config = SpoolConfig {
        endpoint: "http://127.0.0.1:9/b".into(),
        ..Default::default()
    };
    let spool = EventSpool::new(config, None, None, true).unwrap();
    let (removed, dropped): (Arc<dyn DeliveryObserver>, Arc<dyn DeliveryObserver>) =
        (Arc::new(Quiet), Arc::new(Quiet));
    let removed_handle = spool.add_observer(removed.clone());
    let dropped_handle = spool.add_observer(dropped.clone());
    assert_eq!(
        (Arc::strong_count(&removed), Arc::strong_count(&dropped)),
        (2, 2),
        "registered: the spool holds each"
    );
    removed_handle.remove();
    removed_handle.remove();
    drop(dropped_handle);
    // A state being told on the worker thread as the handles went may hold the entries a
    // moment longer: wait for the release, bounded.
    let released = |o: &Arc<dyn DeliveryObserver>| {
        (0..500).any(|_| {
            let done = Arc::strong_count(o) == 1;
            if !done {
                std::thread::sleep(Duration::from_millis(10));
            }
            done
        })
    };
    assert!(
        released(&removed) && released(&dropped),
        "the spool let go of both"
    );
    spool.shutdown(1_000).unwrap();
    // After shutdown nothing is registered; the handle is inert.
    let late: Arc<dyn DeliveryObserver> = Arc::new(Quiet);
    let handle = spool.add_observer(late.clone());
    assert_eq!(Arc::strong_count(&late), 1);
    handle.remove();
}

#[test]
fn panics_become_typed_errors() {
    let r: Result<(), SpoolError> = guard(|| panic!("boom"));
    assert_eq!(
        r,
        Err(SpoolError::Internal {
            reason: "boom".into()
        })
    );
}
