//! Answers from a network that is wrong, not hostile (docs/decisions/0045, 0071): a proxy refusing
//! every body as too large pauses the spool with every event kept, after a handful of requests,
//! however the queue is cut into batches.

use eventspool::{DeliveryState, DeliveryStatus, PauseReason, Stats};
use eventspool_collector::Behavior;
use serde_json::json;

use crate::common::*;

/// 413 to every body, down to a single event: the split finds nothing accepted and pauses
/// (`Paused{config}`, the reason in the last error) instead of quarantining all 200 events.
#[test]
fn a_proxy_refusing_every_body_as_too_large_pauses_and_quarantines_nothing() {
    let (status, stats) = every_body_refused(200, 200);
    assert_paused_on_413(&status);
    assert_eq!(stats.quarantined, 0, "{stats:?}");
    assert_eq!(stats.pending, 200, "every event kept: {stats:?}");
    // 200 → 100 → 50 → 25 → 13 → 7 → 4 → 2 → 1, then the sibling: about log2(200) + 2.
    assert!(stats.requests <= 12, "{} requests", stats.requests);
}

/// The same proxy with batches of one event (`max_batch_events = 1`, or one event pending when
/// the batch was taken): the first refused event waits for the next batch's answer instead of
/// being judged alone, so the spool pauses after two requests with nothing quarantined.
#[test]
fn a_proxy_refusing_every_body_pauses_when_each_batch_holds_one_event() {
    let (status, stats) = every_body_refused(1, 20);
    assert_paused_on_413(&status);
    assert_eq!(stats.quarantined, 0, "{stats:?}");
    assert_eq!(stats.pending, 20, "every event kept: {stats:?}");
    assert_eq!(stats.requests, 2, "{stats:?}");
}

/// The same proxy and an app tracking one event at a time, nothing pending behind it: a 413 for
/// a body of a few hundred bytes is no size limit any proxy has, so the event is kept and the
/// spool pauses, instead of every event of the trickle going to the quarantine one by one.
#[test]
fn a_proxy_refusing_every_body_pauses_on_the_first_event_of_a_trickle() {
    let (status, stats) = every_body_refused(1, 1);
    assert_paused_on_413(&status);
    assert_eq!(stats.quarantined, 0, "{stats:?}");
    assert_eq!(stats.pending, 1, "the event kept: {stats:?}");
    assert_eq!(stats.requests, 1, "{stats:?}");
}

/// `events` tracked offline, then delivered in batches of at most `max_batch_events` to a
/// collector refusing every body above 10 bytes; returns the paused state and the counts.
fn every_body_refused(max_batch_events: u64, events: u64) -> (DeliveryStatus, Stats) {
    let collector = collector();
    collector.set_behavior(Behavior {
        max_body_bytes: Some(10),
        ..Behavior::default()
    });
    let mut c = config(&collector);
    c.flush_at = 1_000;
    c.max_batch_events = max_batch_events;
    // Offline until all are queued: the instant clock fires the flush timer at once, and the
    // batches are then cut the same way on every run.
    let spool = eventspool::EventSpool::builder(c)
        .clock(instant_clock())
        .start_offline()
        .open()
        .unwrap();
    for i in 0..events {
        spool.track("e", json!({ "i": i })).unwrap();
    }
    spool.set_online(true);
    spool.flush();
    let status = wait_state(&spool, "paused", |s| {
        matches!(s, DeliveryState::Paused { .. })
    });
    (status, spool.stats())
}

fn assert_paused_on_413(status: &DeliveryStatus) {
    let DeliveryState::Paused { reason, last_error } = &status.state else {
        unreachable!()
    };
    assert_eq!(*reason, PauseReason::Config);
    assert_eq!(last_error.status, Some(413));
    assert!(last_error.message.contains("too large"), "{last_error}");
}
