//! Property tests over every input surface (the fuzz targets in fuzz/ cover the same ground with
//! coverage guidance; these run in CI): nothing may panic, and each answer must be consistent.

use std::time::{Duration, SystemTime};

use eventspool::classify::{Outcome, classify};
use eventspool::retry::parse_retry_after;
use eventspool::{CONFIG_NAMES, Config, HttpResponse, NewEvent, TransportError};
use proptest::prelude::*;

/// Strings that are mostly plausible and sometimes hostile.
fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        ".{0,40}",
        "[a-z_]{0,300}",
        "\\PC{0,20}",
        Just(String::new()),
        Just("\u{0}\u{feff}\u{202e}".to_string()),
        (0usize..70_000).prop_map(|n| "x".repeat(n)),
    ]
}

fn json_value() -> impl Strategy<Value = serde_json::Value> {
    let leaf = prop_oneof![
        Just(serde_json::Value::Null),
        any::<bool>().prop_map(serde_json::Value::from),
        any::<i64>().prop_map(serde_json::Value::from),
        any::<f64>().prop_map(serde_json::Value::from),
        text().prop_map(serde_json::Value::from),
    ];
    leaf.prop_recursive(4, 64, 8, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..8).prop_map(serde_json::Value::from),
            prop::collection::btree_map(".{0,12}", inner, 0..8)
                .prop_map(|m| serde_json::Value::Object(m.into_iter().collect())),
        ]
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2_000, ..ProptestConfig::default() })]

    /// track() input: any name, properties, ids, timestamps, session ids and size limit.
    #[test]
    fn prepare_never_panics_and_respects_the_size_limit(
        name in text(),
        props in json_value(),
        id in proptest::option::of(prop_oneof![".{0,40}", Just("0190a4a0-0000-7000-8000-000000000000".to_string())]),
        ts in proptest::option::of(prop_oneof![".{0,40}", Just("2026-11-29T21:00:00Z".to_string()), Just("9999-12-31T23:59:59.999999999+14:00".to_string())]),
        session in proptest::option::of(text()),
        now in any::<i64>(),
        max in prop_oneof![0u64..4096, Just(32 * 1024u64), any::<u64>()],
    ) {
        let mut e = NewEvent::new(&name, props);
        e.event_id = id;
        e.timestamp = ts;
        e.session_id = session;
        if let Ok(json) = e.to_wire_json(now, max) {
            prop_assert!(json.len() as u64 <= max, "{} bytes over {max}", json.len());
            prop_assert!(serde_json::from_str::<serde_json::Value>(&json).is_ok());
        }
    }

    /// Property JSON as the bindings pass it: a string that may not be JSON at all.
    #[test]
    fn property_strings_from_bindings_never_panic(raw in prop_oneof![".{0,200}", json_value().prop_map(|v| v.to_string())]) {
        if let Ok(v) = serde_json::from_str::<serde_json::Value>(&raw) {
            let _ = NewEvent::new("e", v).to_wire_json(0, 32 * 1024);
        }
    }

    /// Collector answers: any status, headers and body (including `rejected` lists).
    #[test]
    fn classify_never_panics(
        status in prop_oneof![100u16..600, any::<u16>()],
        headers in prop::collection::vec((prop_oneof![Just("Retry-After".to_string()), ".{0,12}"], ".{0,40}"), 0..4),
        body in prop_oneof![
            prop::collection::vec(any::<u8>(), 0..2048),
            json_value().prop_map(|v| serde_json::json!({"rejected": v}).to_string().into_bytes()),
            prop::collection::vec((".{0,40}", ".{0,20}"), 0..50).prop_map(|r| serde_json::json!({
                "rejected": r.into_iter().map(|(id, reason)| serde_json::json!({"event_id": id, "reason": reason})).collect::<Vec<_>>()
            }).to_string().into_bytes()),
        ],
        error in proptest::option::of(".{0,40}"),
    ) {
        let result = match error {
            Some(e) => Err(TransportError::Io(e)),
            None => Ok(HttpResponse { status, headers, body, truncated: false }),
        };
        let outcome = classify(&result, SystemTime::now());
        if let Outcome::Transient { failure, .. } | Outcome::Auth { failure } | Outcome::Config { failure } = &outcome {
            prop_assert!(failure.message.len() <= 4 * 1024, "error message of {} bytes", failure.message.len());
        }
    }

    /// Retry-After: seconds, HTTP dates, garbage; never panics, never overflows.
    #[test]
    fn retry_after_never_panics(value in prop_oneof![".{0,40}", any::<u64>().prop_map(|n| n.to_string()), any::<i64>().prop_map(|n| n.to_string()), Just("Fri, 31 Dec 9999 23:59:59 GMT".to_string())], offset in 0u64..4_000_000_000) {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(offset);
        let _ = parse_retry_after(&value, now);
    }

    /// Config::set with any name and value, then validate: an error names a field, never panics.
    #[test]
    fn config_set_and_validate_never_panic(pairs in prop::collection::vec((prop_oneof![prop::sample::select(CONFIG_NAMES).prop_map(str::to_string), ".{0,20}"], prop_oneof![".{0,30}", any::<u64>().prop_map(|n| n.to_string()), Just("0".to_string())]), 0..6)) {
        let mut c = Config::new("https://collector.example/v1/batch");
        for (name, value) in &pairs {
            if let Err(e) = c.set(name, value) {
                prop_assert!(!e.to_string().is_empty());
            }
        }
        let _ = c.validate();
    }
}
