//! Issue 2: the core pipeline end to end.

use std::collections::HashSet;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use eventspool::{DropReason, EventSpool, NewEvent, disk_usage};
use eventspool_collector::{ReferenceCollector, Scripted};
use serde_json::json;

use crate::common::*;

#[test]
fn offline_backlog_survives_a_restart_and_drains_completely() {
    let collector = collector();
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(&collector);
    cfg.db_path = Some(dir.path().join("events.db"));
    cfg.memory_capacity = 100;
    let mut ids = HashSet::new();
    {
        let spool = EventSpool::builder(cfg.clone())
            .start_offline()
            .open()
            .unwrap();
        for i in 0..10_000 {
            ids.insert(spool.track("offline", json!({"i": i})).unwrap().to_string());
        }
        let stats = spool.stats();
        assert_eq!(stats.tracked, 10_000);
        assert_eq!(stats.dropped_from_queue(), 0);
        // Dropping the handle persists what is still in memory.
    }
    assert_eq!(collector.request_count(), 0, "offline means no attempts");
    let spool = EventSpool::open(cfg).unwrap();
    assert_eq!(spool.stats().restored, 10_000);
    assert!(spool.wait_drained(WAIT), "drained: {}", spool.state());
    let stats = spool.stats();
    assert_eq!(stats.delivered, 10_000);
    assert!(stats.balances(), "{stats:?}");
    assert_eq!(collector.distinct_count(), 10_000);
    assert_ids_kept(&collector, &ids);
}

#[test]
fn shuffled_timestamps_leave_in_timestamp_order_across_batches() {
    let collector = collector();
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(&collector);
    cfg.db_path = Some(dir.path().join("events.db"));
    cfg.memory_capacity = 50;
    cfg.max_batch_events = 25;
    let spool = EventSpool::builder(cfg).start_offline().open().unwrap();
    let mut rng = fastrand::Rng::with_seed(7);
    let mut seconds: Vec<u32> = (0..400).collect();
    rng.shuffle(&mut seconds);
    for s in &seconds {
        // A few equal timestamps too, so ties must keep track() order.
        let ts = format!("2026-11-29T10:{:02}:{:02}.000Z", (s / 2) / 60, (s / 2) % 60);
        let mut e = NewEvent::new("shuffled", json!({"s": s}));
        e.timestamp = Some(ts);
        spool.track_event(e).unwrap();
    }
    spool.set_online(true);
    assert!(spool.wait_drained(WAIT));
    let requests = collector.requests();
    assert!(requests.len() >= 16, "400 events in batches of 25");
    let stamps: Vec<String> = requests.iter().flat_map(|r| r.timestamps.clone()).collect();
    assert_eq!(stamps.len(), 400);
    let mut sorted = stamps.clone();
    sorted.sort();
    assert_eq!(stamps, sorted, "batches leave in timestamp order");
    // Ties: within equal timestamps, track() order (the `s` values were tracked in shuffled
    // order, so check against the order they were tracked in).
    let events = collector.events();
    let position: std::collections::HashMap<u32, usize> =
        seconds.iter().enumerate().map(|(i, s)| (*s, i)).collect();
    for pair in events.windows(2) {
        if pair[0].timestamp == pair[1].timestamp {
            let a = position[&(pair[0].properties["s"].as_u64().unwrap() as u32)];
            let b = position[&(pair[1].properties["s"].as_u64().unwrap() as u32)];
            assert!(a < b, "ties keep track() order");
        }
    }
}

#[test]
fn batches_respect_event_and_byte_limits() {
    let collector = collector();
    let mut cfg = config(&collector);
    cfg.max_batch_events = 30;
    cfg.max_event_bytes = 2_000;
    cfg.max_batch_bytes = 8_000;
    cfg.compression = eventspool::Compression::None;
    let spool = EventSpool::builder(cfg).start_offline().open().unwrap();
    for i in 0..500 {
        let pad = "x".repeat((i * 37) % 1_500);
        spool.track("sized", json!({"pad": pad})).unwrap();
    }
    spool.set_online(true);
    assert!(spool.wait_drained(WAIT));
    assert_eq!(collector.distinct_count(), 500);
    let requests = collector.requests();
    for r in &requests {
        assert!(
            r.event_ids.len() <= 30,
            "{} events in one batch",
            r.event_ids.len()
        );
        assert!(
            r.decoded_bytes <= 8_000,
            "{} bytes in one batch",
            r.decoded_bytes
        );
    }
    assert!(
        requests.iter().any(|r| r.decoded_bytes > 6_000),
        "byte limit, not count, bounded some batches"
    );
}

#[test]
fn disk_cap_holds_on_disk_and_every_event_is_accounted_for() {
    let collector = collector();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("events.db");
    let mut cfg = config(&collector);
    cfg.db_path = Some(path.clone());
    cfg.memory_capacity = 100;
    cfg.max_event_bytes = 1_024;
    cfg.max_disk_bytes = 256 * 1024;
    let cap = cfg.max_disk_bytes;
    let spool = EventSpool::builder(cfg).start_offline().open().unwrap();
    let mut max_seen = 0;
    for i in 0..6_000 {
        spool
            .track("capped", json!({"i": i, "pad": "y".repeat(200)}))
            .unwrap();
        if i % 100 == 0 {
            spool.persist().unwrap();
            max_seen = max_seen.max(disk_usage(&path));
            assert!(
                disk_usage(&path) <= cap,
                "store is {} bytes on disk, cap {cap}",
                disk_usage(&path)
            );
        }
    }
    spool.persist().unwrap();
    let evicted = spool.stats().dropped(DropReason::DiskCap);
    assert!(
        evicted > 0,
        "6,000 events of ~300 bytes cannot fit in 256 KiB"
    );
    assert!(disk_usage(&path) <= cap);
    spool.set_online(true);
    assert!(spool.wait_drained(WAIT));
    let stats = spool.stats();
    assert_eq!(
        stats.delivered + stats.dropped(DropReason::DiskCap),
        6_000,
        "{stats:?}"
    );
    assert!(stats.balances());
    assert_eq!(collector.distinct_count(), stats.delivered);
    assert!(
        max_seen > cap / 2,
        "the test filled the store (max {max_seen})"
    );
}

#[test]
fn memory_only_overflow_is_counted_exactly() {
    let collector = collector();
    let mut cfg = config(&collector);
    cfg.memory_capacity = 250;
    let spool = EventSpool::builder(cfg).start_offline().open().unwrap();
    for i in 0..1_000 {
        spool.track("m", json!({"i": i})).unwrap();
    }
    let stats = spool.stats();
    assert_eq!(stats.dropped(DropReason::MemoryOverflow), 750);
    assert_eq!(stats.pending, 250);
    spool.set_online(true);
    assert!(spool.wait_drained(WAIT));
    assert_eq!(collector.distinct_count(), 250);
    // The newest survive: the oldest were dropped first.
    let kept: HashSet<u64> = collector
        .events()
        .iter()
        .map(|e| e.properties["i"].as_u64().unwrap())
        .collect();
    assert_eq!(kept, (750..1_000).collect());
}

#[test]
fn server_errors_and_dropped_connections_end_with_every_event_once() {
    let collector = collector();
    collector.push_script([
        Scripted::status(503),
        Scripted::StoreThenDrop,
        Scripted::status(500),
        Scripted::StoreThenDrop,
        Scripted::status(502),
        Scripted::status(408),
    ]);
    let mut cfg = config(&collector);
    cfg.max_batch_events = 40;
    cfg.max_auto_attempts = 10;
    let spool = EventSpool::builder(cfg)
        .clock(instant_clock())
        .start_offline()
        .open()
        .unwrap();
    let mut ids = HashSet::new();
    for i in 0..400 {
        ids.insert(spool.track("flaky", json!({"i": i})).unwrap().to_string());
    }
    spool.set_online(true);
    assert!(spool.wait_drained(WAIT), "{}", spool.state());
    assert_eq!(collector.distinct_count(), 400);
    assert_ids_kept(&collector, &ids);
    let resent: Vec<u32> = collector
        .requests()
        .iter()
        .filter_map(|r| r.attempt)
        .filter(|a| *a > 1)
        .collect();
    assert!(!resent.is_empty(), "resends carry X-Eventspool-Attempt > 1");
    assert!(
        collector.received_count() > 400,
        "the dropped connections' batches were received twice"
    );
    assert_eq!(spool.stats().delivered, 400);
}

#[test]
fn gzip_bodies_arrive_intact() {
    let collector = collector();
    let cfg = config(&collector);
    let spool = EventSpool::builder(cfg).start_offline().open().unwrap();
    for i in 0..300 {
        spool
            .track("zipped", json!({"i": i, "text": "ünïcødé ✓ ".repeat(5)}))
            .unwrap();
    }
    spool.set_online(true);
    assert!(spool.wait_drained(WAIT));
    let requests = collector.requests();
    assert!(
        requests.iter().all(|r| r.gzip),
        "bodies over 1 KiB are gzipped"
    );
    assert!(requests.iter().all(|r| r.body_bytes < r.decoded_bytes));
    assert_eq!(collector.distinct_count(), 300);
    assert!(collector.events().iter().all(|e| {
        e.properties["text"]
            .as_str()
            .unwrap()
            .starts_with("ünïcødé ✓")
    }));
}

#[test]
fn concurrent_track_from_eight_threads_loses_nothing() {
    let collector = collector();
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(&collector);
    cfg.db_path = Some(dir.path().join("events.db"));
    cfg.memory_capacity = 500;
    let spool = EventSpool::open(cfg).unwrap();
    let threads: Vec<_> = (0..8)
        .map(|t| {
            let spool = spool.clone();
            std::thread::spawn(move || {
                for i in 0..5_000 {
                    spool.track("threaded", json!({"t": t, "i": i})).unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let stats = spool.stats();
    assert_eq!(stats.tracked, 40_000);
    assert_eq!(
        stats.delivered + stats.dropped_from_queue() + stats.pending,
        40_000
    );
    assert!(spool.wait_drained(WAIT), "{}", spool.state());
    let stats = spool.stats();
    assert!(stats.balances(), "{stats:?}");
    assert_eq!(collector.distinct_count(), stats.delivered);
    assert_eq!(stats.delivered + stats.dropped_from_queue(), 40_000);
}

#[test]
fn headers_follow_the_protocol() {
    let collector = collector();
    let mut cfg = config(&collector);
    cfg.api_key = Some("test-key".into());
    let spool = EventSpool::open(cfg).unwrap();
    spool.track("h", json!({})).unwrap();
    spool.flush();
    assert!(spool.wait_drained(WAIT));
    let r = &collector.requests()[0];
    assert_eq!(r.authorization.as_deref(), Some("Bearer test-key"));
    assert!(r.user_agent.as_deref().unwrap().starts_with("eventspool/"));
    assert_eq!(r.content_type.as_deref(), Some("application/json"));
    assert_eq!(r.attempt, Some(1));
    assert!(r.sent_at.is_some());
    assert!(!r.gzip, "a small body is not compressed");
}

#[test]
fn flush_at_and_the_periodic_flush_trigger_sending() {
    let collector = collector();
    let (clock, dyn_clock) = manual_clock();
    let mut cfg = config(&collector);
    cfg.flush_at = 5;
    cfg.flush_interval_ms = 30_000;
    let spool = EventSpool::builder(cfg).clock(dyn_clock).open().unwrap();
    for i in 0..4 {
        spool.track("below", json!({"i": i})).unwrap();
    }
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(
        collector.request_count(),
        0,
        "4 < flush_at: nothing sent yet"
    );
    spool.track("fifth", json!({})).unwrap();
    assert!(collector.wait_for_distinct(5, WAIT), "flush_at reached");
    assert!(spool.wait_drained(WAIT));
    spool.track("lonely", json!({})).unwrap();
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(collector.distinct_count(), 5);
    clock.advance(Duration::from_millis(30_000));
    assert!(collector.wait_for_distinct(6, WAIT), "periodic flush");
    let _ = Arc::strong_count(&clock);
}

#[test]
fn bad_input_is_refused_with_named_reasons() {
    let collector = collector();
    let spool = EventSpool::builder(config(&collector))
        .start_offline()
        .open()
        .unwrap();
    let err = |r: eventspool::Result<eventspool::EventId>| r.unwrap_err().to_string();
    assert!(err(spool.track("", json!({}))).contains("name is empty"));
    assert!(err(spool.track("x", json!([1, 2]))).contains("must be a JSON object"));
    assert!(err(spool.track("x", json!({"big": "z".repeat(40_000)}))).contains("max_event_bytes"));
    let mut bad = config(&collector);
    bad.max_batch_events = 0;
    let e = EventSpool::open(bad).err().unwrap().to_string();
    assert!(e.contains("max_batch_events"), "{e}");
    assert_eq!(spool.stats().tracked, 0);
}

#[test]
fn events_older_than_max_event_age_are_counted_and_never_sent() {
    let collector = collector();
    let dir = tempfile::tempdir().unwrap();
    let (clock, dyn_clock) = manual_clock();
    let mut cfg = config(&collector);
    cfg.db_path = Some(dir.path().join("age.db"));
    cfg.memory_capacity = 10;
    cfg.max_event_age_ms = 3_600_000;
    let spool = EventSpool::builder(cfg)
        .clock(dyn_clock)
        .start_offline()
        .open()
        .unwrap();
    for i in 0..30 {
        spool.track("old", json!({"i": i})).unwrap();
    }
    clock.advance(Duration::from_secs(2 * 3600));
    for i in 0..15 {
        spool.track("fresh", json!({"i": i})).unwrap();
    }
    spool.set_online(true);
    assert!(spool.wait_drained(WAIT), "{}", spool.state());
    let stats = spool.stats();
    assert_eq!(stats.dropped(DropReason::Expired), 30);
    assert_eq!(stats.delivered, 15);
    assert!(collector.events().iter().all(|e| e.name == "fresh"));
    assert!(stats.balances());
}

/// A store holding `old` events tracked two hours ago, reopened offline now with a one-hour
/// age limit (the same clock, moved on while it was closed).
fn reopened_past_its_age(collector: &ReferenceCollector, dir: &Path, old: u32) -> EventSpool {
    let (clock, dyn_clock) = manual_clock();
    let mut cfg = config(collector);
    cfg.db_path = Some(dir.join("age.db"));
    cfg.max_event_age_ms = 3_600_000;
    let open = |cfg| {
        EventSpool::builder(cfg)
            .clock(dyn_clock.clone())
            .start_offline()
            .open()
            .unwrap()
    };
    let spool = open(cfg.clone());
    for i in 0..old {
        spool.track("old", json!({"i": i})).unwrap();
    }
    spool.shutdown(WAIT).unwrap();
    clock.advance(Duration::from_secs(2 * 3600));
    open(cfg)
}

/// A backlog reopened past its age and sent at once: the store's first age check waits until
/// the worker has nothing to send, so the batches taken before it hold expired events. The
/// machine drops them before sending: none reaches the collector, each is counted once, and the
/// fresh ones go out.
#[test]
fn a_reopened_backlog_past_its_age_is_counted_and_never_sent() {
    let collector = collector();
    let dir = tempfile::tempdir().unwrap();
    let spool = reopened_past_its_age(&collector, dir.path(), 250);
    for i in 0..30 {
        spool.track("fresh", json!({"i": i})).unwrap();
    }
    spool.set_online(true);
    assert!(spool.wait_drained(WAIT), "{}", spool.state());
    let stats = spool.stats();
    assert_eq!(stats.dropped(DropReason::Expired), 250);
    assert_eq!(stats.delivered, 30);
    assert_eq!(collector.events().len(), 30);
    assert!(collector.events().iter().all(|e| e.name == "fresh"));
    assert!(stats.balances());
}

/// The store's first age check runs when the worker has nothing to send: a backlog reopened
/// offline past its age leaves the disk, counted, without waiting for the network.
#[test]
fn a_backlog_reopened_offline_past_its_age_is_dropped_without_waiting_for_the_network() {
    let collector = collector();
    let dir = tempfile::tempdir().unwrap();
    let spool = reopened_past_its_age(&collector, dir.path(), 40);
    let deadline = std::time::Instant::now() + WAIT;
    // Bounded by WAIT: the worker's first sleep runs the check.
    while spool.stats().dropped(DropReason::Expired) < 40 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    let stats = spool.stats();
    assert_eq!(stats.dropped(DropReason::Expired), 40);
    assert_eq!(stats.pending_disk, 0);
    assert_eq!(stats.requests, 0);
    assert!(stats.balances());
}

/// The next batch's send is recorded ahead only when it follows at once (decision 0077). With
/// the throttle (`min_batch_interval_ms`, 1 s by default) the worker pauses between batches,
/// and a crash in that pause must not count a send on rows that never left: their first
/// request would say it is a resend. The clock here never moves, so the worker stays in the
/// pause after the first answer.
#[test]
fn a_crash_in_the_throttle_pause_counts_no_send_on_the_next_batch() {
    let collector = collector();
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("events.db");
    let open = || {
        let mut cfg = config(&collector);
        cfg.db_path = Some(db.clone());
        cfg.max_batch_events = 10;
        cfg.min_batch_interval_ms = 1_000;
        EventSpool::builder(cfg)
            .clock(Arc::new(Arc::new(eventspool::ManualClock::new(
                1_764_417_600_000,
            ))))
            .open()
    };
    let spool = open().unwrap();
    spool.set_online(false);
    for i in 0..30 {
        spool.track("e", json!({ "i": i })).unwrap();
    }
    assert_eq!(spool.persist().unwrap(), 30);
    spool.set_online(true);
    spool.flush();
    let deadline = std::time::Instant::now() + WAIT;
    while spool.stats().delivered < 10 {
        assert!(std::time::Instant::now() < deadline, "{}", spool.state());
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(
        collector.request_count(),
        1,
        "the throttle let a second batch go"
    );
    spool.crash();
    // The next open applies what the record of the rows on the wire still owes. The crashed
    // handle's threads let go of the store a moment after `crash()` returns.
    let reopened = loop {
        match open() {
            Ok(spool) => break spool,
            Err(e) if std::time::Instant::now() < deadline + WAIT => {
                assert!(e.to_string().contains("one owner at a time"), "{e}");
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(e) => panic!("the store stayed owned after the crash: {e}"),
        }
    };
    reopened.set_online(false);
    let sends: Vec<(i64, i64)> = rusqlite::Connection::open(&db)
        .unwrap()
        // The 20 events after the first batch (whose rows may or may not be deleted yet).
        .prepare("SELECT sends, unanswered FROM events ORDER BY seq DESC LIMIT 20")
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(
        sends,
        vec![(0, 0); 20],
        "the batches after the pause were never sent"
    );
    reopened.shutdown(WAIT).unwrap();
}
