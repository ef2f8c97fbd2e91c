//! The device clock stepping by hours: delivery order follows (timestamp, track order), retry
//! timers run on the monotonic clock, nothing expires or waits because of the step.

use std::sync::Arc;
use std::time::Duration;

use eventspool::{DeliveryState, EventSpool, ManualClock};
use eventspool_collector::{CollectorConfig, ReferenceCollector, Scripted};
use serde_json::json;

use crate::common::fast_config;

const HOUR_MS: i64 = 3_600_000;
const START_MS: i64 = 1_780_000_000_000;

#[test]
fn wall_clock_steps_keep_order_and_timers() {
    let collector = ReferenceCollector::start(CollectorConfig::default()).unwrap();
    let clock = Arc::new(ManualClock::new(START_MS));
    let dir = tempfile::tempdir().unwrap();
    let mut c = fast_config(&collector.url());
    c.db_path = Some(dir.path().join("events.db"));
    c.memory_capacity = 4; // some events in memory, some spilled: both sides are ordered
    c.backoff_base_ms = 60_000;
    c.backoff_cap_ms = 60_000;
    c.max_event_age_ms = 24 * HOUR_MS as u64;
    let spool = EventSpool::builder(c)
        .clock(Arc::new(clock.clone()))
        .start_offline()
        .open()
        .unwrap();

    // Track order a0..a2, then the clock steps back 3 h (b*), then forward 6 h (c*).
    let mut expected = Vec::new();
    for (step, label) in [(0, 'a'), (-3 * HOUR_MS, 'b'), (6 * HOUR_MS, 'c')] {
        clock.jump_wall(step);
        for i in 0..3 {
            let id = spool
                .track("jump", json!({"label": format!("{label}{i}")}))
                .unwrap();
            expected.push((clock_wall(&clock), expected.len(), id.to_string()));
        }
    }
    expected.sort();
    let expected_ids: Vec<String> = expected.into_iter().map(|(_, _, id)| id).collect();

    // First attempt fails: a retry is scheduled 0..60 s ahead on the monotonic clock.
    collector.push_statuses(&[503]);
    spool.set_online(true);
    let st = spool
        .wait_for(Duration::from_secs(10), |s| {
            matches!(s.state, DeliveryState::RetryScheduled { .. })
        })
        .expect("no retry scheduled after a 503");
    let DeliveryState::RetryScheduled {
        retry_in_ms: before,
        ..
    } = st.state
    else {
        unreachable!()
    };
    // Steps of the wall clock in either direction do not move the countdown.
    for step in [-5 * HOUR_MS, 10 * HOUR_MS, -5 * HOUR_MS] {
        clock.jump_wall(step);
        let DeliveryState::RetryScheduled { retry_in_ms, .. } = spool.state().state else {
            panic!(
                "retry abandoned after a wall-clock step: {:?}",
                spool.state()
            )
        };
        assert_eq!(
            retry_in_ms, before,
            "the retry countdown followed the wall clock"
        );
    }
    assert_eq!(
        collector.request_count(),
        1,
        "a wall-clock step triggered an early retry"
    );
    // Monotonic time passing does fire it.
    clock.advance(Duration::from_millis(before + 1));
    assert!(
        spool.wait_drained(Duration::from_secs(10)),
        "did not deliver after the retry: {:?}",
        spool.stats()
    );
    let stats = spool.stats();
    assert_eq!(stats.delivered, 9, "{stats:?}");
    assert_eq!(
        stats.dropped.values().sum::<u64>(),
        0,
        "something expired because of a clock step: {stats:?}"
    );
    let delivered: Vec<String> = collector
        .requests()
        .iter()
        .flat_map(|r| r.event_ids.clone())
        .collect();
    let mut seen = std::collections::HashSet::new();
    let delivered: Vec<String> = delivered
        .into_iter()
        .filter(|id| seen.insert(id.clone()))
        .collect();
    assert_eq!(
        delivered, expected_ids,
        "delivery order is not (timestamp, track order)"
    );
}

fn clock_wall(clock: &Arc<ManualClock>) -> i64 {
    eventspool::Clock::wall_ms(clock)
}

/// Backwards by a day while a batch hangs: the attempt timeout (monotonic) still ends it.
#[test]
fn wall_clock_step_during_an_attempt_does_not_stall_it() {
    let collector = ReferenceCollector::start(CollectorConfig::default()).unwrap();
    collector.push_script([Scripted::Hang]);
    let mut c = fast_config(&collector.url());
    c.attempt_timeout_ms = 200;
    let clock = Arc::new(ManualClock::auto_advancing(START_MS));
    let spool = EventSpool::builder(c)
        .clock(Arc::new(clock.clone()))
        .open()
        .unwrap();
    spool.track("x", json!({})).unwrap();
    clock.jump_wall(-24 * HOUR_MS);
    assert!(
        spool.wait_drained(Duration::from_secs(15)),
        "{:?}",
        spool.state()
    );
    assert_eq!(collector.distinct_count(), 1);
}
