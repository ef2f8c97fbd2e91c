//! The whole topology under faults: dozens of spools, each with its own store, track through
//! nginx into three stateless collectors publishing to one JetStream stream, while one
//! collector is SIGKILLed mid-run, the broker is stopped for 10 s and restarted, and 5% of the
//! batches are accepted then dropped. A consumer reading the whole stream must find every
//! tracked event exactly once.
//!
//! The spools run on the real clock with sub-second backoffs (and the collectors' 1 s
//! `Retry-After`), since the outage they ride out is a real process being down for 10 s.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use eventspool::{Config, EventSpool};
use serde_json::json;

use crate::collectors::{CollectorProcess, LoadBalancer};
use crate::nats::NatsServer;
use crate::stream;

const STREAM: &str = "TOPOLOGY";
/// Spools in the app process (each its own SQLite store) and events each tracks: 24 × 150 =
/// 3,600 events, sized to keep the test near 30 s in a debug build on 2 busy cores.
const SPOOLS: usize = 24;
const EVENTS_PER_SPOOL: usize = 150;
const COLLECTORS: usize = 3;
const DROP_RATE: f64 = 0.05;
const BROKER_DOWN: Duration = Duration::from_secs(10);
/// Bounds the drain after the last fault; a healthy run needs a few seconds.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(60);

fn spool_config(endpoint: &str, db: std::path::PathBuf) -> Config {
    let mut c = Config::new(endpoint.to_owned());
    c.db_path = Some(db);
    c.min_batch_interval_ms = 0;
    c.max_batch_events = 50;
    c.flush_at = 25;
    c.flush_interval_ms = 200;
    c.backoff_base_ms = 50;
    c.backoff_cap_ms = 500;
    c.retry_after_cap_ms = 1_000;
    c.max_auto_attempts = 1_000;
    c.max_retry_elapsed_ms = 120_000;
    // Kills and accept-then-drop leave requests unanswered; none of these events is poison.
    c.max_event_sends = 50;
    c
}

/// Tracks events `range` on every spool; returns their ids.
fn track(spools: &[EventSpool], range: std::ops::Range<usize>) -> Vec<String> {
    let mut ids = Vec::new();
    for i in range {
        for (s, spool) in spools.iter().enumerate() {
            let props = json!({"spool": s, "n": i, "screen": "settings/notifications"});
            ids.push(spool.track("screen_view", props).unwrap().to_string());
        }
    }
    ids
}

/// Waits until collector `c` acknowledged at least `batches` batches, bounded.
fn wait_batches(c: &CollectorProcess, batches: u64, lb: &LoadBalancer, spool: &EventSpool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    let acked = || {
        c.stats()
            .and_then(|s| s["sink"]["batches"].as_u64())
            .unwrap_or(0)
    };
    while acked() < batches {
        assert!(
            Instant::now() < deadline,
            "collector acknowledged {} batches, not {batches}: stats {:?}, nginx answered {:?} \
             ({}), a spool's stats {:?}",
            acked(),
            c.stats(),
            lb.answered(),
            lb.error_log(),
            spool.stats()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn topology_three_collectors_behind_nginx_every_event_once_through_faults() {
    let started = Instant::now();
    let dir = tempfile::tempdir().unwrap();
    let mut nats = NatsServer::start();
    let mut collectors: Vec<CollectorProcess> = (0..COLLECTORS)
        .map(|i| {
            let log = dir.path().join(format!("collector{i}.log"));
            CollectorProcess::start(&nats.url(), STREAM, DROP_RATE, 14 + i as u64, &log)
        })
        .collect();
    let lb = LoadBalancer::start(&collectors.iter().map(|c| c.addr).collect::<Vec<_>>());
    let spools: Vec<EventSpool> = (0..SPOOLS)
        .map(|i| {
            let db = dir.path().join(format!("spool{i}.db"));
            EventSpool::open(spool_config(&lb.url(), db)).expect("spool opens")
        })
        .collect();
    let third = EVENTS_PER_SPOOL / 3;

    // Fault 1: a collector is SIGKILLed while batches flow through it.
    let mut tracked = track(&spools, 0..third);
    wait_batches(&collectors[0], 2, &lb, &spools[0]);
    collectors[0].kill();
    let killed_acked = collectors[0].acked("stored") + collectors[0].acked("duplicates");
    tracked.extend(track(&spools, third..2 * third));

    // Fault 2: the broker stops for 10 s while the app keeps tracking; then it restarts on
    // the same store and port, and the collectors reconnect by themselves.
    nats.stop();
    let down = Instant::now();
    tracked.extend(track(&spools, 2 * third..EVENTS_PER_SPOOL));
    std::thread::sleep(BROKER_DOWN.saturating_sub(down.elapsed()));
    nats.restart();
    let broker_down = down.elapsed();

    for spool in &spools {
        spool.flush();
    }
    for (i, spool) in spools.iter().enumerate() {
        assert!(
            spool.wait_drained(DRAIN_TIMEOUT),
            "spool {i} did not drain: {:?}\nnginx: {}",
            spool.stats(),
            lb.error_log()
        );
    }
    let mut quarantined = 0;
    for spool in &spools {
        quarantined += spool.stats().quarantined;
    }
    assert_eq!(quarantined, 0, "no event deserved the quarantine");

    let contents = stream::read_all(&nats.url(), STREAM);
    let tracked_set: HashSet<&String> = tracked.iter().collect();
    assert_eq!(tracked_set.len(), tracked.len(), "tracked ids are unique");
    let missing = tracked
        .iter()
        .filter(|id| !contents.copies.contains_key(*id))
        .count();
    let unknown: Vec<&String> = contents
        .copies
        .keys()
        .filter(|id| !tracked_set.contains(id))
        .collect();
    let twice: Vec<(&String, &u64)> = contents.copies.iter().filter(|(_, n)| **n > 1).collect();
    let acked_stored: u64 = collectors.iter().map(|c| c.acked("stored")).sum();
    let absorbed: u64 = collectors.iter().map(|c| c.acked("duplicates")).sum();
    let answered = lb.answered();
    println!(
        "topology: tracked {}, in stream {} distinct, {missing} missing, {absorbed} duplicates \
         absorbed ({} spools, {COLLECTORS} collectors, one SIGKILLed after {killed_acked} acked \
         events, broker down {:.1} s, {:.0}% accept-then-drop; nginx answered {answered:?}; \
         {acked_stored} first copies acked; {:.1} s)",
        tracked.len(),
        contents.copies.len(),
        SPOOLS,
        broker_down.as_secs_f64(),
        DROP_RATE * 100.0,
        started.elapsed().as_secs_f64()
    );
    assert_eq!(missing, 0, "every tracked event reached the stream");
    assert!(
        unknown.is_empty(),
        "the stream holds ids nobody tracked: {unknown:?}"
    );
    assert!(twice.is_empty(), "events stored twice: {twice:?}");
    assert_eq!(
        contents.messages,
        tracked.len() as u64,
        "one message per event"
    );
    assert_eq!(contents.id_mismatches, 0, "Nats-Msg-Id is the event_id");
    assert!(
        absorbed > 0,
        "accept-then-drop and the kill must have made resends that JetStream absorbed"
    );
    for spool in &spools {
        let _ = spool.shutdown(Duration::from_secs(5));
    }
}
