//! Issue 11, delivery decisions: a 400 that refuses the request rather than its events, the
//! size a proxy accepts, and delivery that resumes by itself after a short outage.

use std::time::Duration;

use eventspool::collector::{Behavior, Scripted};
use eventspool::{Compression, DeliveryState, EventSpool, ManualClock, PauseReason};
use serde_json::json;

use crate::common::*;

/// nginx's "400 Request Header Or Cookie Too Large" answers every request alike: the split must
/// stop after a few requests, pause as a configuration problem and quarantine nothing.
#[test]
fn a_400_for_every_request_pauses_instead_of_quarantining_the_batch() {
    let collector = collector();
    let nginx_400 = Scripted::Status {
        status: 400,
        body: "<html><head><title>400 Request Header Or Cookie Too Large</title></head></html>"
            .into(),
        headers: vec![("Content-Type".into(), "text/html".into())],
    };
    collector.push_script(std::iter::repeat_n(nginx_400, 500));
    let spool = EventSpool::builder(config(&collector))
        .clock(instant_clock())
        .start_offline()
        .open()
        .unwrap();
    let n = 100;
    for i in 0..n {
        spool.track("fine", json!({"i": i})).unwrap();
    }
    spool.set_online(true);
    let status = spool
        .wait_for(WAIT, |s| {
            matches!(s.state, DeliveryState::Paused { .. }) || s.pending < n
        })
        .unwrap_or_else(|| panic!("neither paused nor quarantined: {}", spool.state()));
    let requests = collector.request_count();
    let stats = spool.stats();
    eprintln!(
        "400 on every request: {requests} requests, quarantined {}, state {}",
        stats.quarantined, status
    );
    assert_eq!(stats.quarantined, 0, "nothing quarantined: {stats:?}");
    assert_eq!(status.pending, n, "every event stays queued");
    let DeliveryState::Paused { reason, last_error } = status.state else {
        panic!("expected Paused{{config}}, got {}", status);
    };
    assert_eq!(reason, PauseReason::Config);
    assert_eq!(last_error.status, Some(400));
    assert!(
        last_error.message.contains("request"),
        "the state says the request is refused: {}",
        last_error.message
    );
    // log2(100) ≈ 7 halvings to reach one event, and its sibling to confirm.
    assert!(requests <= 12, "{requests} requests before pausing");

    collector.clear_script();
    spool.resume();
    assert!(spool.wait_drained(WAIT), "{}", spool.state());
    assert_eq!(collector.distinct_count(), n);
}

/// The first event of a batch is the poison one: the split reaches it before any request has
/// succeeded, yet the collector accepts its sibling, so it is still isolated and quarantined.
#[test]
fn a_poison_event_at_the_head_of_a_batch_is_still_quarantined() {
    let collector = collector();
    collector.set_behavior(Behavior {
        reject_name: Some("poison".into()),
        ..Default::default()
    });
    let spool = EventSpool::builder(config(&collector))
        .clock(instant_clock())
        .start_offline()
        .open()
        .unwrap();
    let poison = spool.track("poison", json!({})).unwrap().to_string();
    for i in 0..99 {
        spool.track("fine", json!({"i": i})).unwrap();
    }
    spool.set_online(true);
    assert!(spool.wait_drained(WAIT), "{}", spool.state());
    assert_eq!(collector.distinct_count(), 99);
    let q = spool.quarantine_get(&poison).unwrap().expect("quarantined");
    assert_eq!(q.reason, "bad_request");
    assert_eq!(spool.stats().quarantined, 1);
}

/// Behind `client_max_body_size 16k` with `compression = none`: once a 413 has taught the size
/// that fits, later batches are cut to it, so the limit costs a few requests, not one per batch.
#[test]
fn a_proxy_body_limit_is_remembered() {
    let collector = collector();
    collector.set_behavior(Behavior {
        max_body_bytes: Some(16 * 1024),
        ..Default::default()
    });
    let mut cfg = config(&collector);
    cfg.compression = Compression::None;
    cfg.memory_capacity = 5_000;
    let spool = EventSpool::builder(cfg)
        .clock(instant_clock())
        .start_offline()
        .open()
        .unwrap();
    let n = 3_000;
    for i in 0..n {
        spool
            .track("small", json!({"i": i, "pad": "p".repeat(150)}))
            .unwrap();
    }
    spool.set_online(true);
    assert!(spool.wait_drained(WAIT), "{}", spool.state());
    assert_eq!(collector.distinct_count(), n);
    assert_eq!(spool.stats().quarantined, 0);
    let requests = collector.requests();
    assert_eq!(
        requests.len(),
        collector.request_count(),
        "every request kept"
    );
    let refused = requests.iter().filter(|r| r.status == Some(413)).count();
    let accepted = requests.iter().filter(|r| r.status == Some(200)).count();
    eprintln!("16 KiB limit, 3,000 events: {accepted} accepted, {refused} refused with 413");
    assert!(
        refused * 10 <= accepted,
        "{refused} 413s for {accepted} accepted requests (over 10%)"
    );
}

const TICK: Duration = Duration::from_millis(100);

/// Waits (bounded, real time) until the worker is parked on something in the future: not sending,
/// and no retry or probe whose time has come.
fn settle(spool: &EventSpool) {
    let start = std::time::Instant::now();
    loop {
        let s = spool.state();
        let at_rest = match s.state {
            DeliveryState::Sending => false,
            DeliveryState::RetryScheduled { retry_in_ms, .. } => retry_in_ms > 0,
            DeliveryState::Idle => s.pending < 20,
            _ => true,
        };
        if at_rest {
            return;
        }
        assert!(start.elapsed() < WAIT, "worker never settled: {s}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// The side-by-side harness of issue 11 on the driven clock: an app tracks 200 events/s for
/// 10 s, the collector is down from 3 s to 23 s, the app lives until 40 s. With the default
/// retry policy every event is delivered by then, without anyone pressing "retry".
fn short_outage_run(clock: &ManualClock, spool: &EventSpool, collector: &ReferenceCollectorRef) {
    for tick in 0..400u64 {
        let t_ms = tick * 100;
        if t_ms == 3_000 {
            collector.set_outage(true).unwrap();
        }
        if t_ms == 23_000 {
            collector.set_outage(false).unwrap();
        }
        if t_ms < 10_000 {
            for i in 0..20 {
                spool.track("live", json!({"t": t_ms, "i": i})).unwrap();
            }
        }
        settle(spool);
        clock.advance(TICK);
    }
    settle(spool);
}

type ReferenceCollectorRef = eventspool::collector::ReferenceCollector;

#[test]
fn a_short_outage_recovers_without_the_user() {
    let collector = collector();
    let (clock, dyn_clock) = manual_clock();
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(&collector);
    cfg.db_path = Some(dir.path().join("live.db"));
    let spool = EventSpool::builder(cfg).clock(dyn_clock).open().unwrap();
    short_outage_run(&clock, &spool, &collector);
    let status = spool.state();
    eprintln!(
        "short outage: {} of 2000 delivered by 40 s, {} requests, state {status}",
        collector.distinct_count(),
        collector.request_count()
    );
    assert_eq!(
        collector.distinct_count(),
        2_000,
        "delivered within the linger; state {status}"
    );
    assert_eq!(status.pending, 0);
    let stats = spool.stats();
    assert_eq!(
        stats.dropped_from_queue() + stats.quarantined,
        0,
        "{stats:?}"
    );
}
