//! Answers from a network that is wrong, not hostile (docs/decisions/0045): a proxy refusing
//! every body as too large pauses the spool with every event kept, after a handful of requests.

use eventspool::{DeliveryState, PauseReason};
use eventspool_collector::Behavior;
use serde_json::json;

use crate::common::*;

/// 413 to every body, down to a single event: the split finds nothing accepted and pauses
/// (`Paused{config}`, the reason in the last error) instead of quarantining all 200 events.
#[test]
fn a_proxy_refusing_every_body_as_too_large_pauses_and_quarantines_nothing() {
    let collector = collector();
    collector.set_behavior(Behavior {
        max_body_bytes: Some(10),
        ..Behavior::default()
    });
    let mut c = config(&collector);
    c.flush_at = 1_000;
    c.max_batch_events = 200;
    // Offline until all 200 are queued: the instant clock fires the flush timer at once, and a
    // batch taken mid-loop of a single event is judged alone (decision 0045) and quarantined.
    let spool = eventspool::EventSpool::builder(c)
        .clock(instant_clock())
        .start_offline()
        .open()
        .unwrap();
    for i in 0..200 {
        spool.track("e", json!({ "i": i })).unwrap();
    }
    spool.set_online(true);
    spool.flush();
    let status = wait_state(&spool, "paused", |s| {
        matches!(s, DeliveryState::Paused { .. })
    });
    let DeliveryState::Paused { reason, last_error } = &status.state else {
        unreachable!()
    };
    assert_eq!(*reason, PauseReason::Config);
    assert_eq!(last_error.status, Some(413));
    assert!(last_error.message.contains("too large"), "{last_error}");
    let stats = spool.stats();
    assert_eq!(stats.quarantined, 0, "{stats:?}");
    assert_eq!(stats.pending, 200, "every event kept: {stats:?}");
    // 200 → 100 → 50 → 25 → 13 → 7 → 4 → 2 → 1, then the sibling: about log2(200) + 2.
    assert!(stats.requests <= 12, "{} requests", stats.requests);
}
