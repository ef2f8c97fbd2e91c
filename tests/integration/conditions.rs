//! Delivery conditions. While the device's conditions forbid delivery by the
//! config's policy the state is `Deferred{reason}`: no request, no retry budget spent, whatever
//! the timers say; when they allow it again delivery resumes as after a reconnect.

use std::time::Duration;

use eventspool::{DeferReason, DeliveryConditions, DeliveryState};

use crate::common::*;
use crate::rig::{Rig, pick, rig};

const METERED: DeliveryConditions = DeliveryConditions {
    metered: true,
    low_power: false,
    battery_low: false,
};
const LOW_POWER: DeliveryConditions = DeliveryConditions {
    metered: false,
    low_power: true,
    battery_low: false,
};

/// Defers with `conditions`, checks that nothing is sent past every timer and trigger, then
/// allows delivery again and checks that everything arrives, the first request a first send.
fn deferred_until_allowed(rig: &Rig, conditions: DeliveryConditions, reason: DeferReason) {
    rig.set_conditions(conditions);
    wait_state(rig, "deferred", |s| {
        *s == DeliveryState::Deferred { reason }
    });
    // flush_at (5) reached, flush(), retry_now(), then past the periodic flush.
    rig.track_n("held", 12);
    rig.flush();
    rig.retry_now();
    rig.clock.advance(PAST_EVERY_TIMER);
    let shown = settle(rig, &rig.recorder);
    assert_eq!(shown.state, DeliveryState::Deferred { reason });
    assert_eq!(
        rig.collector.request_count(),
        0,
        "nothing sent while deferred"
    );
    assert_eq!(rig.stats().requests, 0);
    rig.set_conditions(DeliveryConditions::default());
    assert!(rig.wait_drained(WAIT), "{}", rig.state());
    // 12 held, 2 of settle().
    assert_eq!(rig.collector.distinct_count(), 14);
    assert_eq!(rig.collector.requests()[0].attempt, Some(1));
}

#[test]
fn a_metered_network_defers_delivery_until_it_is_allowed() {
    let rig = rig()
        .config(|c| {
            c.flush_at = 5;
            c.deliver_on_metered = false;
        })
        .open();
    deferred_until_allowed(&rig, METERED, DeferReason::Metered);
    let reason = DeferReason::Metered;
    assert!(
        rig.recorder
            .seen()
            .iter()
            .any(|s| s.state == DeliveryState::Deferred { reason }
                && s.to_string() == format!("deferred (metered network), {} pending", s.pending)),
        "the status line names the reason: {:?}",
        rig.recorder
            .seen()
            .iter()
            .map(|s| s.to_string())
            .collect::<Vec<_>>()
    );
}

#[test]
fn power_saving_defers_delivery_by_default() {
    let rig = rig().config(|c| c.flush_at = 5).open();
    deferred_until_allowed(&rig, LOW_POWER, DeferReason::LowPower);
}

#[test]
fn a_metered_network_is_allowed_by_default() {
    let rig = rig().config(|c| c.flush_at = 5).open();
    rig.set_conditions(METERED);
    rig.track_n("metered", 5);
    assert!(rig.wait_drained(WAIT), "{}", rig.state());
    assert_eq!(rig.collector.distinct_count(), 5);
}

/// A retry is scheduled, then the conditions defer: its timer sends nothing and no budget is
/// spent; allowed again, the next failure is retry 1 of a fresh episode, as after a reconnect.
#[test]
fn a_deferred_retry_resumes_as_a_fresh_episode() {
    let rig = rig()
        .collector(|c| c.push_statuses(&[503, 503, 503]))
        .config(|c| c.deliver_on_metered = false)
        .open();
    rig.track_n("flaky", 3);
    let (retry_in_ms, _) = rig.flush_until(pick!(
        DeliveryState::RetryScheduled { attempt: 1, retry_in_ms, .. } => retry_in_ms
    ));
    rig.clock.advance(Duration::from_millis(retry_in_ms));
    rig.until(pick!(DeliveryState::RetryScheduled { attempt: 2, .. }));
    assert_eq!(rig.collector.request_count(), 2);

    rig.set_conditions(METERED);
    wait_state(&rig, "deferred", |s| {
        *s == DeliveryState::Deferred {
            reason: DeferReason::Metered,
        }
    });
    rig.clock.advance(PAST_EVERY_TIMER);
    let shown = settle(&rig, &rig.recorder);
    assert!(matches!(shown.state, DeliveryState::Deferred { .. }));
    assert_eq!(
        rig.collector.request_count(),
        2,
        "the retry timer sent nothing"
    );

    rig.set_conditions(DeliveryConditions::default());
    // The third 503: retry 1 again, not 3.
    let (attempt, _) = rig.until(pick!(
        DeliveryState::RetryScheduled { attempt, .. } => attempt
    ));
    assert_eq!(attempt, 1, "a fresh episode");
    assert_eq!(rig.collector.request_count(), 3);
    rig.retry_now();
    assert!(rig.wait_drained(WAIT), "{}", rig.state());
    assert_eq!(rig.collector.distinct_count(), 3 + 2);
}

/// Offline takes precedence: a deferred spool that goes offline shows `Offline`; back online
/// with the conditions still forbidding, it is `Deferred` again and sends nothing.
#[test]
fn offline_takes_precedence_over_deferred() {
    let rig = rig().config(|c| c.deliver_on_metered = false).open();
    rig.set_conditions(METERED);
    wait_state(&rig, "deferred", |s| {
        matches!(s, DeliveryState::Deferred { .. })
    });
    rig.set_online(false);
    wait_state(&rig, "offline", |s| *s == DeliveryState::Offline);
    rig.track_n("queued", 3);
    rig.set_online(true);
    let shown = settle(&rig, &rig.recorder);
    assert_eq!(
        shown.state,
        DeliveryState::Deferred {
            reason: DeferReason::Metered
        }
    );
    assert_eq!(rig.collector.request_count(), 0);
}
