//! The critical lane (docs/critical-lane.md): durable before `track()` returns, past
//! `flush_at` and the throttle, ahead of the normal backlog, evicted last at the disk cap, and
//! in timestamp order within each lane.

use eventspool::{DropReason, NewEvent};
use serde_json::json;

use crate::common::*;
use crate::rig::rig;

fn critical(name: &str, properties: serde_json::Value) -> NewEvent {
    NewEvent::new(name, properties).critical()
}

/// A 10,000-event backlog built offline, then one critical event: on reconnect it is the
/// first event of the first batch, and the backlog follows in its own order.
#[test]
fn after_a_10000_event_backlog_a_critical_event_goes_in_the_first_batch() {
    let rig = rig().stored().offline().instant().open();
    let mut normal = Vec::new();
    for chunk in 0..10 {
        let events: Vec<NewEvent> = (0..1000)
            .map(|i| NewEvent::new("backlog", json!({ "i": chunk * 1000 + i })))
            .collect();
        normal.extend(rig.track_batch(&events).unwrap());
    }
    let urgent = rig.track_event(critical("crash", json!({}))).unwrap();
    assert_eq!(rig.stats().pending, 10_001);
    rig.set_online(true);
    assert!(rig.wait_drained(WAIT), "{}", rig.state());
    let requests = rig.collector.requests();
    assert_eq!(
        requests[0].event_ids.first(),
        Some(&urgent.to_string()),
        "the critical event leads the first batch"
    );
    let order: Vec<String> = requests
        .iter()
        .flat_map(|r| r.event_ids.iter().cloned())
        .filter(|id| *id != urgent.to_string())
        .collect();
    let normal: Vec<String> = normal.iter().map(ToString::to_string).collect();
    assert_eq!(order, normal, "the backlog in its own order");
}

/// At the disk cap the normal lane is evicted (counted `disk_cap`) and the critical events,
/// though the oldest, all survive and are delivered.
#[test]
fn at_the_disk_cap_critical_events_survive_while_normal_ones_are_evicted() {
    let rig = rig()
        .stored()
        .offline()
        .instant()
        .config(|c| {
            c.max_disk_bytes = 256 * 1024;
            c.memory_capacity = 50;
        })
        .open();
    let pad = "x".repeat(400);
    let urgent: Vec<String> = (0..40)
        .map(|i| {
            rig.track_event(critical("purchase", json!({ "i": i, "pad": pad })))
                .unwrap()
                .to_string()
        })
        .collect();
    for chunk in 0..10 {
        let events: Vec<NewEvent> = (0..200)
            .map(|i| NewEvent::new("normal", json!({ "i": chunk * 200 + i, "pad": pad })))
            .collect();
        rig.track_batch(&events).unwrap();
    }
    rig.persist().unwrap();
    let stats = rig.stats();
    let evicted = stats.dropped(DropReason::DiskCap);
    assert!(evicted > 0, "the cap was reached: {stats:?}");
    rig.set_online(true);
    assert!(rig.wait_drained(WAIT), "{}", rig.state());
    for id in &urgent {
        assert!(rig.collector.contains(id), "critical {id} was lost");
    }
    let stats = rig.stats();
    assert_eq!(
        stats.delivered + stats.dropped(DropReason::DiskCap),
        2_040,
        "every normal event delivered or counted: {stats:?}"
    );
    assert_eq!(stats.delivered, 2_040 - evicted);
}

/// Shuffled timestamps in both lanes: the critical lane goes first, each lane in timestamp
/// order, with a store and memory-only alike.
#[test]
fn each_lane_keeps_timestamp_order() {
    for stored in [false, true] {
        let mut b = rig().offline().instant();
        if stored {
            // Most of both lanes spill: the order holds across memory and the store.
            b = b.stored().config(|c| c.memory_capacity = 4);
        }
        let rig = b.open();
        let stamps = [7, 3, 9, 1, 5, 8, 2, 6, 4, 0];
        for (n, s) in stamps.iter().enumerate() {
            let ts = format!("2026-11-29T12:00:0{s}.000Z");
            let mut e = NewEvent::new("normal", json!({ "s": s }));
            e.timestamp = Some(ts.clone());
            rig.track_event(e).unwrap();
            if n % 3 == 0 {
                let mut e = critical("critical", json!({ "s": s }));
                e.timestamp = Some(ts);
                rig.track_event(e).unwrap();
            }
        }
        rig.set_online(true);
        assert!(rig.wait_drained(WAIT), "{}", rig.state());
        let got: Vec<(String, String)> = rig
            .collector
            .requests()
            .iter()
            .flat_map(|r| r.event_ids.clone())
            .map(|id| {
                let e = rig
                    .collector
                    .events()
                    .into_iter()
                    .find(|e| e.event_id == id)
                    .unwrap();
                (e.name, e.timestamp)
            })
            .collect();
        let mut want: Vec<(String, String)> = Vec::new();
        let mut crit: Vec<_> = [7, 1, 2, 0]
            .iter()
            .map(|s| {
                (
                    "critical".to_string(),
                    format!("2026-11-29T12:00:0{s}.000Z"),
                )
            })
            .collect();
        crit.sort();
        let mut norm: Vec<_> = stamps
            .iter()
            .map(|s| ("normal".to_string(), format!("2026-11-29T12:00:0{s}.000Z")))
            .collect();
        norm.sort();
        want.extend(crit);
        want.extend(norm);
        assert_eq!(got, want, "stored: {stored}");
    }
}

/// A critical event is in the store when `track_event` returns (durability `spill`), starts a
/// drain without `flush_at` or the periodic flush, and skips the throttle between batches: on
/// a clock that moves only when the test moves it.
#[test]
fn a_critical_event_is_durable_and_skips_flush_at_and_the_throttle() {
    let rig = rig()
        .stored()
        .offline()
        .config(|c| {
            c.flush_at = 1_000;
            c.flush_interval_ms = 3_600_000;
            c.min_batch_interval_ms = 60_000;
            c.max_batch_events = 10;
        })
        .open();
    let db = rig.config.db_path.clone().unwrap();
    let first = rig.track_event(critical("crash", json!({}))).unwrap();
    let status = eventspool::admin::inspect(&db).unwrap();
    assert_eq!(
        (status.pending, status.pending_critical),
        (1, 1),
        "on disk before track_event returned"
    );
    rig.set_online(true);
    assert!(rig.collector.wait_for_requests(1, WAIT), "{}", rig.state());
    assert_eq!(rig.collector.requests()[0].event_ids, [first.to_string()]);
    // The answer is in (the throttle counts from it); past the throttle the drain finds the
    // queue empty and rests.
    assert!(rig.wait_for(WAIT, |s| s.pending == 0).is_some());
    rig.clock.advance(std::time::Duration::from_secs(60));
    assert!(rig.wait_drained(WAIT), "{}", rig.state());
    // Idle, far from flush_at and the periodic flush.
    let second = rig.track_event(critical("purchase", json!({}))).unwrap();
    assert!(
        rig.collector.wait_for_requests(2, WAIT),
        "the critical event waited: {}",
        rig.state()
    );
    assert_eq!(rig.collector.requests()[1].event_ids, [second.to_string()]);
    // A normal backlog draining under a one-minute throttle (counted from the answer).
    assert!(rig.wait_for(WAIT, |s| s.pending == 0).is_some());
    rig.track_n("normal", 30);
    rig.clock.advance(std::time::Duration::from_secs(60));
    assert!(rig.collector.wait_for_requests(3, WAIT), "{}", rig.state());
    let third = rig.track_event(critical("purchase", json!({}))).unwrap();
    assert!(
        rig.collector.wait_for_requests(4, WAIT),
        "the critical event waited for the throttle: {}",
        rig.state()
    );
    let requests = rig.collector.requests();
    assert_eq!(requests[3].event_ids[0], third.to_string());
    assert_eq!(requests[2].event_ids.len(), 10);
    assert!(
        rig.wait_for(WAIT, |s| s.pending == 11).is_some(),
        "{}",
        rig.state()
    );
    assert_eq!(
        rig.collector.request_count(),
        4,
        "the rest waits for the throttle"
    );
}

/// A critical event tracked while a drain's request is on the wire goes in the next request
/// the worker takes, not in a body built ahead for the backlog's next rows: the collector gets
/// it at the head of a request, and every event once. The collector answers slowly, so the
/// event lands while each request is on the wire and after the next body was built.
#[test]
fn a_critical_event_tracked_during_a_drain_goes_in_the_next_request_sent() {
    let rig = rig().stored().offline().instant().open();
    let backlog: Vec<NewEvent> = (0..1000)
        .map(|i| NewEvent::new("backlog", json!({ "i": i })))
        .collect();
    let mut tracked = rig.track_batch(&backlog).unwrap();
    rig.persist().unwrap();
    rig.collector.set_behavior(eventspool_collector::Behavior {
        delay: Some(std::time::Duration::from_millis(40)),
        ..Default::default()
    });
    rig.set_online(true);
    assert!(rig.collector.wait_for_requests(2, WAIT));
    let urgent = rig.track_event(critical("crash", json!({}))).unwrap();
    tracked.push(urgent);
    assert!(rig.wait_drained(WAIT), "{}", rig.state());
    let requests = rig.collector.requests();
    let carrying: Vec<_> = requests
        .iter()
        .filter(|r| r.event_ids.contains(&urgent.to_string()))
        .collect();
    assert_eq!(
        carrying.len(),
        1,
        "the critical event reached the collector once"
    );
    assert_eq!(
        carrying[0].event_ids.first(),
        Some(&urgent.to_string()),
        "the critical event leads its request"
    );
    let received: Vec<String> = requests.iter().flat_map(|r| r.event_ids.clone()).collect();
    let mut expected: Vec<String> = tracked.iter().map(ToString::to_string).collect();
    let mut got = received.clone();
    expected.sort();
    got.sort();
    assert_eq!(got, expected, "every event once");
}
