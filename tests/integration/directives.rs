//! The collector's power over a device (docs/protocol.md §Directives), tried as a wrong or
//! hostile collector would use it: a directive never touches the critical lane, one rule
//! screens `track`, `track_event` and `track_batch` alike and counts once, and a directive's
//! life is counted from its arrival on the device's monotonic clock, not its wall clock.

use std::sync::Arc;
use std::time::Duration;

use eventspool::{DropReason, Error, EventSpool, ManualClock, NewEvent};
use eventspool_collector::{Behavior, ReferenceCollector};
use serde_json::{Value, json};

use crate::common::*;

const DAY_MS: i64 = 24 * 3600 * 1000;

/// A spool on a fresh collector that answers every 2xx with `directive`, and the clock it runs
/// on; one event is delivered so the directive is in force when this returns.
fn steered(
    directive: Value,
    tweak: impl FnOnce(&mut eventspool::Config),
) -> (ReferenceCollector, EventSpool, Arc<ManualClock>) {
    let collector = collector();
    collector.set_behavior(Behavior {
        directives: Some(directive),
        ..Behavior::default()
    });
    let mut c = config(&collector);
    c.flush_at = 1;
    tweak(&mut c);
    let (clock, dyn_clock) = manual_clock();
    let spool = EventSpool::builder(c).clock(dyn_clock).open().unwrap();
    spool.track("hello", json!({})).unwrap();
    assert!(spool.wait_drained(WAIT), "{}", spool.state());
    assert_eq!(spool.stats().directives_applied, 1, "{:?}", spool.stats());
    (collector, spool, clock)
}

/// `sample_rate` and `drop_names` apply to the normal lane only: a critical event is never
/// sampled out or refused by a collector.
#[test]
fn no_directive_touches_critical_events() {
    let (collector, spool, _clock) = steered(
        json!({"id": "x", "sample_rate": {"crash": 0}, "drop_names": ["crash_fatal"]}),
        |_| {},
    );
    let sampled = spool
        .track_event(NewEvent::new("crash_report", json!({})).critical())
        .unwrap();
    let named = spool
        .track_event(NewEvent::new("crash_fatal", json!({})).critical())
        .unwrap();
    assert!(spool.wait_drained(WAIT), "{}", spool.state());
    let stats = spool.stats();
    assert!(
        collector.contains(&sampled.to_string()) && collector.contains(&named.to_string()),
        "critical events vanished: {stats:?}"
    );
    assert_eq!(stats.dropped(DropReason::Sampled), 0, "{stats:?}");
    assert_eq!(stats.dropped(DropReason::NameDropped), 0, "{stats:?}");
    // The normal lane is still steered.
    assert!(matches!(
        spool.track("crash_fatal", json!({})),
        Err(Error::InvalidEvent(_))
    ));
}

/// An empty prefix, which would sample every name, is refused as malformed and counted.
#[test]
fn an_empty_sample_prefix_is_ignored_and_counted() {
    let (collector, spool, _clock) = steered(json!({"id": "x", "sample_rate": {"": 0}}), |_| {});
    let id = spool.track("screen_view", json!({})).unwrap();
    assert!(spool.wait_drained(WAIT), "{}", spool.state());
    assert!(collector.contains(&id.to_string()), "{:?}", spool.stats());
    assert!(spool.stats().directives_ignored >= 1, "{:?}", spool.stats());
}

/// `track_batch` and `drop_names` agree with `track`: a refused name fails the batch naming its
/// position, nothing of it is recorded, and it is counted once.
#[test]
fn track_batch_refuses_a_dropped_name_like_track() {
    let (_collector, spool, _clock) = steered(json!({"id": "x", "drop_names": ["spam"]}), |_| {});
    let before = spool.stats();
    let batch = [
        NewEvent::new("ok", json!({})),
        NewEvent::new("spam", json!({})),
        NewEvent::new("ok", json!({})),
    ];
    match spool.track_batch(&batch) {
        Err(Error::InvalidEvent(why)) => {
            assert!(
                why.contains("event 2") && why.contains("drop_names"),
                "{why}"
            )
        }
        other => panic!("a batch with a dropped name: {other:?}"),
    }
    let after = spool.stats();
    assert_eq!(after.tracked, before.tracked, "nothing recorded: {after:?}");
    assert_eq!(
        after.dropped(DropReason::NameDropped) - before.dropped(DropReason::NameDropped),
        1,
        "counted once: {after:?}"
    );
}

/// Sampled events of a batch that is then refused (`BatchRefused`) are not counted: nothing of
/// it was recorded, and the app's retry of the batch must not count them twice.
#[test]
fn a_refused_batch_counts_nothing_sampled() {
    let (_collector, spool, _clock) = steered(json!({"id": "x", "sample_rate": {"s_": 0}}), |c| {
        c.memory_capacity = 2;
    });
    let batch: Vec<NewEvent> = ["s_a", "s_b", "k1", "k2", "k3"]
        .iter()
        .map(|n| NewEvent::new(*n, json!({})))
        .collect();
    assert!(matches!(
        spool.track_batch(&batch),
        Err(Error::BatchRefused(_))
    ));
    let stats = spool.stats();
    assert_eq!(stats.dropped(DropReason::Sampled), 0, "{stats:?}");
    spool.track_batch(&batch[..3]).unwrap();
    assert_eq!(
        spool.stats().dropped(DropReason::Sampled),
        2,
        "{:?}",
        spool.stats()
    );
}

/// A one-hour `drop_names` that arrived while the device's clock was a year fast ends an hour
/// after its arrival, by the monotonic clock, once the wall clock is put right.
#[test]
fn a_directive_lives_from_its_arrival_not_by_the_wall_clock() {
    let collector = collector();
    collector.set_behavior(Behavior {
        directives: Some(json!({"id": "x", "ttl_ms": 3_600_000, "drop_names": ["spam"]})),
        ..Behavior::default()
    });
    let mut c = config(&collector);
    c.flush_at = 1;
    let (clock, dyn_clock) = manual_clock();
    clock.jump_wall(365 * DAY_MS);
    let spool = EventSpool::builder(c).clock(dyn_clock).open().unwrap();
    spool.track("hello", json!({})).unwrap();
    assert!(spool.wait_drained(WAIT), "{}", spool.state());
    collector.set_behavior(Behavior::default());
    assert!(spool.track("spam", json!({})).is_err(), "in force");
    clock.jump_wall(-365 * DAY_MS);
    clock.advance(Duration::from_secs(2 * 24 * 3600));
    assert!(
        spool.track("spam", json!({})).is_ok(),
        "two days after a one-hour directive arrived, it still holds"
    );
}

/// The directive in force is visible (id, fields, expiry) and the app can end it; a pause it
/// holds is a state a UI can word (`Deferred{collector}`), and a bounded drain is told when it
/// ends instead of running out its budget.
#[test]
fn the_app_sees_the_directive_in_force_and_ends_it() {
    let (collector, spool, _clock) = steered(
        json!({"id": "fix-1", "ttl_ms": 3_600_000, "drop_names": ["spam"],
               "sample_rate": {"debug_": 0.5}, "pause_until": "2025-11-29T12:10:00Z"}),
        |_| {},
    );
    collector.set_behavior(Behavior::default());
    let d = spool.stats().directive.expect("a directive in force");
    assert_eq!(d.id, "fix-1");
    assert_eq!(d.drop_names, vec!["spam".to_string()]);
    assert_eq!(d.sample_rate, vec![("debug_".to_string(), 0.5)]);
    assert_eq!(d.expires_in_ms, 3_600_000, "{d:?}");
    assert!(d.pause_until_ms.is_some(), "{d:?}");
    // The pause holds what is tracked now, visibly.
    let held = spool.track("later", json!({})).unwrap();
    spool.flush();
    wait_state(&spool, "deferred by the collector", |s| {
        *s == eventspool::DeliveryState::Deferred {
            reason: eventspool::DeferReason::Collector,
        }
    });
    match spool.deliver_within(Duration::from_secs(5)).unwrap() {
        eventspool::DrainOutcome::RetryAfter { ms } => assert!(ms > 5_000, "{ms}"),
        other => panic!("a drain behind a collector's pause: {other:?}"),
    }
    assert!(!collector.contains(&held.to_string()));
    assert!(spool.clear_directive().unwrap(), "one was in force");
    assert_eq!(spool.stats().directive, None);
    spool.flush();
    assert!(spool.wait_drained(WAIT), "{}", spool.state());
    assert!(
        collector.contains(&held.to_string()),
        "the pause ended with it"
    );
    assert!(spool.track("spam", json!({})).is_ok(), "drop_names ended");
    assert!(!spool.clear_directive().unwrap(), "none left");
}
