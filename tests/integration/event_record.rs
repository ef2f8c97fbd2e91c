//! The per-event record kept beside each queued event: when the SDK accepted it (age is counted
//! from there, docs/delivery.md §Retry) and how many requests carried it (`X-Eventspool-Attempt`,
//! `max_event_sends`). Real collector on 127.0.0.1, real SQLite files, the injected clock.

use std::time::Duration;

use eventspool::{DeliveryState, DropReason, EventSpool, NewEvent, Selector};
use eventspool_collector::Behavior;
use serde_json::json;

use crate::common::*;
use crate::episode::drive_to_waiting_for_user;
use crate::rig::{Rig, pick, rig};

const DAY_MS: i64 = 24 * 3600 * 1000;

fn event_at(name: &str, timestamp: &str) -> NewEvent {
    NewEvent {
        timestamp: Some(timestamp.into()),
        ..NewEvent::new(name, json!({}))
    }
}

/// An importer's historical timestamp is the event's, not its age: the event was accepted now.
#[test]
fn explicit_old_timestamp_is_delivered_not_expired() {
    let rig = rig().instant().open();
    let Rig {
        collector, spool, ..
    } = &rig;
    // The clock stands at 2025-11-29; this event happened almost a year earlier.
    let id = spool
        .track_event(event_at("imported", "2025-01-02T03:04:05.006Z"))
        .unwrap();
    rig.flush_drained();
    let stats = spool.stats();
    assert_eq!(
        (stats.delivered, stats.dropped(DropReason::Expired)),
        (1, 0),
        "an old timestamp must not make the event expire at acceptance"
    );
    assert!(collector.contains(&id.to_string()));
    let stored = collector.events();
    assert_eq!(stored[0].timestamp, "2025-01-02T03:04:05.006Z");
}

/// A dead letter redriven after more than `max_event_age_ms` starts a new life at the redrive.
#[test]
fn redriven_dead_letter_older_than_max_age_is_delivered() {
    let collector = collector();
    collector.set_behavior(Behavior {
        reject_name: Some("poison".into()),
        ..Default::default()
    });
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(&collector);
    cfg.db_path = Some(dir.path().join("r.db"));
    let (clock, dyn_clock) = manual_clock();
    clock.set_auto_advance(true);
    let spool = EventSpool::builder(cfg).clock(dyn_clock).open().unwrap();
    let id = spool.track("poison", json!({})).unwrap();
    spool.flush();
    assert!(spool.wait_drained(WAIT), "{}", spool.state());
    assert_eq!(spool.stats().quarantined, 1);
    // Eight days in the quarantine (the default max age is seven), then fixed and redriven.
    clock.jump_wall(8 * DAY_MS);
    collector.set_behavior(Behavior::default());
    assert_eq!(spool.quarantine_redrive(&Selector::All).unwrap(), 1);
    assert!(spool.wait_drained(WAIT), "{}", spool.state());
    let stats = spool.stats();
    assert_eq!(
        (stats.delivered, stats.dropped(DropReason::Expired)),
        (1, 0),
        "a redrive is a new acceptance"
    );
    assert!(collector.contains(&id.to_string()));
}

/// The acceptance time is stored with the row: a reopen does not make an event young again.
#[test]
fn acceptance_time_survives_a_reopen() {
    let collector = collector();
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(&collector);
    cfg.db_path = Some(dir.path().join("a.db"));
    let (clock, dyn_clock) = manual_clock();
    clock.set_auto_advance(true);
    let spool = EventSpool::builder(cfg.clone())
        .clock(dyn_clock.clone())
        .start_offline()
        .open()
        .unwrap();
    spool.track("old", json!({})).unwrap();
    clock.jump_wall(3 * DAY_MS);
    let young = spool.track("young", json!({})).unwrap();
    spool.shutdown(Duration::from_secs(10)).unwrap();
    drop(spool);
    // Five more days: the first event is eight days old, the second five.
    clock.jump_wall(5 * DAY_MS);
    let spool = EventSpool::builder(cfg).clock(dyn_clock).open().unwrap();
    spool.flush();
    assert!(spool.wait_drained(WAIT), "{}", spool.state());
    let stats = spool.stats();
    assert_eq!(
        (stats.delivered, stats.dropped(DropReason::Expired)),
        (1, 1)
    );
    assert_eq!(collector.events().len(), 1);
    assert!(collector.contains(&young.to_string()));
}

/// A batch waiting for its retry is checked for age again before it goes out: events that
/// expired meanwhile are dropped (`expired`), never sent.
#[test]
fn retry_now_drops_events_that_expired_while_waiting() {
    let rig = rig()
        .collector(|c| c.push_statuses(&[503]))
        .config(|c| c.max_event_age_ms = 60_000)
        .open();
    let Rig {
        collector,
        clock,
        spool,
        ..
    } = &rig;
    rig.track_n("e", 3);
    clock.jump_wall(30_000);
    let fresh = spool.track("fresh", json!({})).unwrap();
    rig.flush_until(pick!(DeliveryState::RetryScheduled { attempt: 1, .. }));
    assert_eq!(collector.request_count(), 1);
    // Forty seconds later the first three are 70 s old, the fourth 40 s.
    clock.jump_wall(40_000);
    spool.retry_now();
    assert!(spool.wait_drained(WAIT), "{}", spool.state());
    let stats = spool.stats();
    assert_eq!(
        (stats.dropped(DropReason::Expired), stats.delivered),
        (3, 1),
        "expired events must leave as `expired`, the fresh one delivered"
    );
    let requests = collector.requests();
    assert_eq!(requests.len(), 2);
    assert_eq!(requests[1].event_ids, vec![fresh.to_string()]);
    assert!(stats.balances(), "{stats:?}");
}

/// `X-Eventspool-Attempt` counts the sends of the batch's events, whatever happened between
/// them: a reconnect, the halves of a split, a restart.
#[test]
fn attempt_header_counts_real_resends() {
    let collector = collector();
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(&collector);
    cfg.db_path = Some(dir.path().join("h.db"));
    let (clock, dyn_clock) = manual_clock();
    let spool = EventSpool::builder(cfg.clone())
        .clock(dyn_clock.clone())
        .open()
        .unwrap();
    for i in 0..4 {
        spool.track("e", json!({"i": i})).unwrap();
    }
    // Request 0: 503. Then offline and back: a fresh episode, but the same events again.
    collector.push_statuses(&[503]);
    spool.flush();
    wait_state(&spool, "retry", |s| {
        matches!(s, DeliveryState::RetryScheduled { .. })
    });
    spool.set_online(false);
    wait_state(&spool, "offline", |s| matches!(s, DeliveryState::Offline));
    // Request 1: 400, so the batch is split; request 2, its first half, gets a 503.
    collector.push_statuses(&[400, 503]);
    spool.set_online(true);
    assert!(collector.wait_for_requests(3, WAIT));
    wait_state(&spool, "retry of a half", |s| {
        matches!(s, DeliveryState::RetryScheduled { .. })
    });
    // A restart while the first half waits for its retry; then both halves go out together.
    spool.shutdown(Duration::from_secs(10)).unwrap();
    drop(spool);
    let spool = EventSpool::builder(cfg).clock(dyn_clock).open().unwrap();
    clock.set_auto_advance(true);
    spool.flush();
    assert!(spool.wait_drained(WAIT), "{}", spool.state());
    let attempts: Vec<Option<u32>> = collector.requests().iter().map(|r| r.attempt).collect();
    let sizes: Vec<usize> = collector
        .requests()
        .iter()
        .map(|r| r.event_ids.len())
        .collect();
    assert_eq!(sizes, [4, 4, 2, 4], "attempts: {attempts:?}");
    assert_eq!(
        attempts,
        [Some(1), Some(2), Some(3), Some(4)],
        "each request says how many times its events were sent before, plus one"
    );
    assert_eq!(collector.distinct_count(), 4);
}

/// An event on which the collector never answers (it drops the connection every time) is
/// isolated once its sends pass `max_event_sends`, and quarantined as `max_sends`; the good
/// events of its batch are delivered, and the count survives a reopen.
#[test]
fn event_that_never_gets_an_answer_is_quarantined_as_max_sends() {
    let collector = collector();
    collector.set_behavior(Behavior {
        drop_name: Some("poison".into()),
        ..Default::default()
    });
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(&collector);
    cfg.db_path = Some(dir.path().join("m.db"));
    // The first run gives up after two sends (one retry).
    cfg.max_auto_attempts = 1;
    cfg.backoff_cap_ms = 1_000;
    let (stepped, clock) = manual_clock();
    // Tracked offline, so no periodic flush can send a partial batch.
    let spool = EventSpool::builder(cfg.clone())
        .clock(clock)
        .start_offline()
        .open()
        .unwrap();
    let mut good = Vec::new();
    good.push(spool.track("fine", json!({"i": 0})).unwrap().to_string());
    let poison = spool.track("poison", json!({})).unwrap().to_string();
    for i in 1..4 {
        good.push(spool.track("fine", json!({"i": i})).unwrap().to_string());
    }
    spool.set_online(true);
    drive_to_waiting_for_user(&spool, &stepped);
    let first: Vec<(Option<u32>, String)> = collector
        .requests()
        .iter()
        .map(|r| (r.attempt, r.outcome.clone()))
        .collect();
    assert_eq!(
        collector.request_count(),
        2,
        "{first:?} {:?}",
        spool.stats()
    );
    spool.shutdown(Duration::from_secs(10)).unwrap();
    drop(spool);

    // Reopened with room for many retries: without a per-event limit they would go on for ever.
    cfg.max_auto_attempts = 50;
    cfg.backoff_cap_ms = 1_000;
    let spool = EventSpool::builder(cfg)
        .clock(instant_clock())
        .open()
        .unwrap();
    spool.flush();
    let done = spool.wait_for(WAIT, |st| {
        st.pending == 0 || matches!(st.state, DeliveryState::WaitingForUser { .. })
    });
    let stats = spool.stats();
    let requests = collector.requests();
    let attempts: Vec<Option<u32>> = requests.iter().map(|r| r.attempt).collect();
    assert!(
        done.is_some_and(|st| st.pending == 0),
        "never isolated: {} requests, attempts {attempts:?}, state {}",
        requests.len(),
        spool.state()
    );
    assert_eq!((stats.delivered, stats.quarantined), (4, 1), "{stats:?}");
    for id in &good {
        assert!(collector.contains(id), "good event {id} not delivered");
    }
    let q = spool
        .quarantine_get(&poison)
        .unwrap()
        .expect("the poison event is quarantined");
    assert_eq!(q.reason, "max_sends");
    assert!(!q.detail.is_empty(), "the last error is kept");
    // The whole batch went out 10 times (the default `max_event_sends`) counting the first
    // run's two: the count was kept in the store across the reopen.
    let sizes: Vec<usize> = requests.iter().map(|r| r.event_ids.len()).collect();
    eprintln!("max_sends: {} requests, sizes {sizes:?}", requests.len());
    let whole = requests.iter().filter(|r| r.event_ids.len() == 5).count();
    assert_eq!(whole, 10, "attempts {attempts:?}");
    assert_eq!(
        requests[2].attempt,
        Some(3),
        "the count survived the reopen"
    );
    assert!(!collector.contains(&poison));
    assert!(stats.balances(), "{stats:?}");
}

/// The poison event first in its batch: alone it fails before any other request was answered,
/// so the collector might just be down; the next piece goes first as a probe, and only once that
/// is answered is the event quarantined.
#[test]
fn max_sends_isolation_probes_before_quarantining_the_first_event() {
    let collector = collector();
    collector.set_behavior(Behavior {
        drop_name: Some("poison".into()),
        ..Default::default()
    });
    let mut cfg = config(&collector);
    cfg.max_event_sends = 2;
    let spool = EventSpool::builder(cfg)
        .clock(instant_clock())
        .start_offline()
        .open()
        .unwrap();
    let poison = spool.track("poison", json!({})).unwrap().to_string();
    for i in 0..3 {
        spool.track("fine", json!({"i": i})).unwrap();
    }
    spool.set_online(true);
    assert!(spool.wait_drained(WAIT), "{}", spool.state());
    let stats = spool.stats();
    assert_eq!((stats.delivered, stats.quarantined), (3, 1), "{stats:?}");
    let q = spool.quarantine_get(&poison).unwrap().expect("quarantined");
    assert_eq!(q.reason, "max_sends");
    let requests = collector.requests();
    let sizes: Vec<usize> = requests.iter().map(|r| r.event_ids.len()).collect();
    // Twice whole, then [poison, fine0] (split), [poison] alone (no answer yet: probe),
    // [fine0] delivered, [poison] again (now quarantined), [fine1, fine2].
    assert_eq!(sizes, [4, 4, 2, 1, 1, 1, 2]);
    assert_eq!(requests[3].event_ids, vec![poison.clone()]);
    assert_eq!(requests[5].event_ids, vec![poison]);
    assert_eq!(requests[4].status, Some(200));
}

/// A collector that answers nothing at all is down, not poisoned: nothing is quarantined, the
/// events stay queued, and the usual retry budget ends in `WaitingForUser`.
#[test]
fn a_collector_that_never_answers_quarantines_nothing() {
    let collector = collector();
    collector.set_behavior(Behavior {
        drop_rate: 1.0,
        ..Default::default()
    });
    let mut cfg = config(&collector);
    cfg.max_event_sends = 2;
    cfg.max_auto_attempts = 5;
    let (stepped, clock) = manual_clock();
    let spool = EventSpool::builder(cfg)
        .clock(clock)
        .start_offline()
        .open()
        .unwrap();
    for i in 0..4 {
        spool.track("fine", json!({"i": i})).unwrap();
    }
    spool.set_online(true);
    let st = drive_to_waiting_for_user(&spool, &stepped);
    let stats = spool.stats();
    assert_eq!((stats.quarantined, st.pending), (0, 4), "{stats:?}");
    let n = collector.request_count();
    // The episode's six failures (the first send and five retries: the whole batch once, then
    // the two singles in turn), plus the two sends that led to splits without a backoff: the
    // second whole send and its first half.
    assert_eq!(n, 8, "requests bounded by the retry budget");
}

/// `dismiss()` and a pause ended by `resume()` do not restart the header either.
#[test]
fn attempt_header_counts_resends_after_dismiss_and_resume() {
    let collector = collector();
    let mut cfg = config(&collector);
    cfg.max_auto_attempts = 1;
    let (stepped, clock) = manual_clock();
    let spool = EventSpool::builder(cfg).clock(clock).open().unwrap();
    spool.track("e", json!({})).unwrap();
    collector.push_statuses(&[503, 503, 401]);
    spool.flush();
    drive_to_waiting_for_user(&spool, &stepped);
    spool.dismiss();
    wait_state(&spool, "idle", |s| matches!(s, DeliveryState::Idle));
    spool.flush();
    wait_state(&spool, "paused", |s| {
        matches!(s, DeliveryState::Paused { .. })
    });
    spool.resume();
    assert!(spool.wait_drained(WAIT), "{}", spool.state());
    let attempts: Vec<Option<u32>> = collector.requests().iter().map(|r| r.attempt).collect();
    assert_eq!(attempts, [Some(1), Some(2), Some(3), Some(4)]);
}

/// A refused connection sent nothing: it neither counts as a send nor as one without an answer,
/// so the first request that reaches the collector says attempt 1.
#[test]
fn refused_connections_are_not_counted_as_sends() {
    let collector = collector();
    collector.set_outage(true).unwrap();
    let mut cfg = config(&collector);
    cfg.max_auto_attempts = 3;
    cfg.max_event_sends = 1;
    let spool = EventSpool::builder(cfg)
        .clock(instant_clock())
        .open()
        .unwrap();
    spool.track("e", json!({})).unwrap();
    spool.flush();
    wait_state(&spool, "budget spent on refused connections", |s| {
        matches!(s, DeliveryState::WaitingForUser { .. })
    });
    collector.set_outage(false).unwrap();
    spool.retry_now();
    assert!(spool.wait_drained(WAIT), "{}", spool.state());
    let attempts: Vec<Option<u32>> = collector.requests().iter().map(|r| r.attempt).collect();
    assert_eq!(attempts, [Some(1)]);
    assert_eq!(
        spool.stats().quarantined,
        0,
        "refusals are not unanswered sends"
    );
}
