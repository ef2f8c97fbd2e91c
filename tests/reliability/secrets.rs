//! The API key and event payloads never reach logs or error strings; store files are private.

use std::io::Write;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use eventspool::{DeliveryState, EventSpool, NewEvent};
use eventspool_collector::{Behavior, CollectorConfig, ReferenceCollector, Scripted};
use serde_json::json;

use crate::common::fast_config;

const KEY: &str = "sk_live_Zq8UNMISTAKABLE4key";
const SECOND_KEY: &str = "sk_live_Yp7SECONDKEYvalue";
const PAYLOAD: &str = "payload-7f3c-PRIVATE-card-4111";

/// Every `tracing` record of the process at TRACE level, as text.
fn captured() -> Arc<Mutex<Vec<u8>>> {
    static BUF: OnceLock<Arc<Mutex<Vec<u8>>>> = OnceLock::new();
    BUF.get_or_init(|| {
        let buf = Arc::new(Mutex::new(Vec::new()));
        let sink = buf.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::TRACE)
            .with_ansi(false)
            .with_writer(move || Sink(sink.clone()))
            .finish();
        tracing::subscriber::set_global_default(subscriber).expect("one global subscriber");
        buf
    })
    .clone()
}

struct Sink(Arc<Mutex<Vec<u8>>>);

impl Write for Sink {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn assert_clean(what: &str, text: &str) {
    for secret in [KEY, SECOND_KEY, PAYLOAD] {
        assert!(!text.contains(secret), "{what} contains {secret:?}");
    }
}

#[test]
fn keys_and_payloads_stay_out_of_logs_and_errors() {
    let logs = captured();
    let collector = ReferenceCollector::start(CollectorConfig {
        behavior: Behavior {
            required_api_key: Some("the-right-key".into()),
            partial_reject_name: Some("rejected_one".into()),
            ..Behavior::default()
        },
        ..CollectorConfig::default()
    })
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("events.db");
    let mut c = fast_config(&collector.url());
    c.api_key = Some(KEY.into());
    c.db_path = Some(db.clone());
    c.attempt_timeout_ms = 200;
    c.max_auto_attempts = 2;
    let mut texts = Vec::new();
    let spool = EventSpool::open(c).unwrap();
    let record = |texts: &mut Vec<String>, spool: &EventSpool| {
        texts.push(format!("{:?}", spool.state()));
        texts.push(format!("{:?}", spool.stats()));
    };
    // Auth failure, twice (wrong key, then a second wrong key).
    spool.track("screen", json!({"secret": PAYLOAD})).unwrap();
    let st = spool
        .wait_for(Duration::from_secs(10), |s| {
            matches!(s.state, DeliveryState::Paused { .. })
        })
        .unwrap();
    texts.push(format!("{st:?}"));
    spool.set_api_key(Some(SECOND_KEY.into())).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while collector.request_count() < 2 {
        assert!(
            std::time::Instant::now() < deadline,
            "no attempt with the second key"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    spool
        .wait_for(Duration::from_secs(10), |s| {
            matches!(s.state, DeliveryState::Paused { .. })
        })
        .unwrap();
    record(&mut texts, &spool);
    // A 500, then a hang cut by the attempt timeout, then a rejected event to quarantine.
    collector.set_behavior(Behavior {
        partial_reject_name: Some("rejected_one".into()),
        ..Behavior::default()
    });
    collector.push_script([
        Scripted::Status {
            status: 500,
            body: "internal error".into(),
            headers: vec![],
        },
        Scripted::Hang,
    ]);
    spool
        .track("rejected_one", json!({"secret": PAYLOAD}))
        .unwrap();
    spool.resume();
    spool
        .wait_for(Duration::from_secs(10), |s| {
            matches!(s.state, DeliveryState::RetryScheduled { .. })
        })
        .unwrap();
    record(&mut texts, &spool);
    if spool
        .wait_for(Duration::from_secs(1), |s| {
            matches!(s.state, DeliveryState::WaitingForUser { .. })
        })
        .is_some()
    {
        record(&mut texts, &spool);
        spool.retry_now();
    }
    assert!(
        spool.wait_drained(Duration::from_secs(10)),
        "{:?}",
        spool.state()
    );
    record(&mut texts, &spool);
    // Input errors must not echo the payload either.
    let big = json!({"secret": PAYLOAD, "pad": "x".repeat(64 * 1024)});
    texts.push(spool.track("big", big).unwrap_err().to_string());
    texts.push(
        spool
            .track("not_an_object", json!([PAYLOAD]))
            .unwrap_err()
            .to_string(),
    );
    let mut bad = NewEvent::new("bad_id", json!({"secret": PAYLOAD}));
    bad.event_id = Some("not-a-uuid".into());
    texts.push(spool.track_event(bad).unwrap_err().to_string());
    texts.push(
        spool
            .set_api_key(Some(format!("{KEY}\n")))
            .unwrap_err()
            .to_string(),
    );
    let quarantined = spool.quarantine_list(&Default::default()).unwrap();
    assert_eq!(quarantined.len(), 1);
    texts.extend(quarantined.iter().map(|q| q.detail.clone()));
    for (i, t) in texts.iter().enumerate() {
        assert_clean(&format!("error/state string #{i} ({t})"), t);
    }
    spool.persist().unwrap();
    // Files: database, WAL, SHM and lock readable by the owner only.
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        for suffix in ["", "-wal", "-shm", ".lock"] {
            let path = format!("{}{suffix}", db.display());
            let mode = std::fs::metadata(&path)
                .unwrap_or_else(|e| panic!("{path}: {e}"))
                .permissions()
                .mode()
                & 0o777;
            assert_eq!(mode, 0o600, "{path} has mode {mode:o}");
        }
    }
    spool.shutdown(Duration::from_secs(5)).unwrap();
    let text = String::from_utf8_lossy(&logs.lock().unwrap()).to_string();
    assert!(
        text.len() > 100,
        "nothing was logged: the capture is broken ({} bytes)",
        text.len()
    );
    assert_clean("tracing output", &text);
}
