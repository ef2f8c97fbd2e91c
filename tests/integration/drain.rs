//! `deliver_within`, the bounded drain a platform job runs inside its time
//! budget. Real collector, real SQLite, the budget on a `ManualClock` the test moves.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use eventspool::{DeliveryState, DrainOutcome, EventSpool, PauseReason};
use eventspool_collector::{Behavior, Scripted};
use serde_json::json;

use crate::common::*;
use crate::rig::{Rig, rig};

/// Runs `deliver_within(budget)` on a thread of its own, as a platform job would, so the test
/// can move the clock meanwhile.
fn drain_on_thread(
    spool: &EventSpool,
    budget: Duration,
) -> std::thread::JoinHandle<eventspool::Result<DrainOutcome>> {
    let spool = spool.clone();
    std::thread::spawn(move || spool.deliver_within(budget))
}

#[test]
fn deliver_within_drains_what_was_tracked() {
    // Neither flush_at nor the periodic flush would send these: only the drain does.
    let rig = rig()
        .stored()
        .config(|c| {
            c.flush_at = 10_000;
            c.max_batch_events = 50;
        })
        .open();
    let ids: HashSet<String> = rig
        .track_n("drained", 250)
        .iter()
        .map(|id| id.to_string())
        .collect();
    let outcome = rig.deliver_within(Duration::from_secs(30)).unwrap();
    assert_eq!(outcome, DrainOutcome::Drained);
    assert_eq!(rig.collector.distinct_count(), 250);
    assert_eq!(rig.stats().pending, 0);
    assert_eq!(
        rig.collector.request_count(),
        5,
        "250 events in batches of 50"
    );
    assert_ids_kept(&rig.collector, &ids);
    // Nothing pending: a second drain says so at once, without a request.
    assert_eq!(
        rig.deliver_within(Duration::from_secs(30)).unwrap(),
        DrainOutcome::Drained
    );
    assert_eq!(rig.collector.request_count(), 5);
}

#[test]
fn deliver_within_stops_at_its_budget_behind_the_throttle() {
    // 100 events, 10 per batch, a batch a second: a 3 s budget has room for 3 of the 10.
    let rig = rig()
        .config(|c| {
            c.flush_at = 10_000;
            c.max_batch_events = 10;
            c.min_batch_interval_ms = 1_000;
        })
        .open();
    rig.track_n("backlog", 100);
    let job = drain_on_thread(&rig.spool, Duration::from_secs(3));
    assert!(rig.collector.wait_for_requests(1, WAIT), "the drain sent");
    // Steps start once the worker waits out the throttle, so each second sends one batch.
    let parked = (0..5_000).any(|_| {
        let parked = rig.clock.sleepers() == 1;
        if !parked {
            std::thread::sleep(Duration::from_millis(1));
        }
        parked
    });
    assert!(parked, "the worker waits for the throttle; {}", rig.state());
    // Up to the deadline and no further: once the worker has answered the drain, the job's
    // thread may still be on its way out when the worker parks again, and a step taken then
    // would send one more batch that the budget never had.
    for _ in 0..3 {
        if job.is_finished() {
            break;
        }
        assert!(
            rig.clock
                .step(Duration::from_secs(1), WAIT, || job.is_finished()),
            "the worker did not react to the clock; {}",
            rig.state()
        );
    }
    let answered = (0..WAIT.as_millis()).any(|_| {
        let done = job.is_finished();
        if !done {
            std::thread::sleep(Duration::from_millis(1));
        }
        done
    });
    assert!(answered, "no answer at the deadline; {}", rig.state());
    let outcome = job.join().unwrap().unwrap();
    assert_eq!(outcome, DrainOutcome::DeadlineReached);
    // Batches at 0, 1 and 2 s were answered before the deadline at 3 s; the one due at 3 s may
    // be on its way (delivery goes on as after a flush), no more.
    let distinct = rig.collector.distinct_count();
    assert!(
        (30..=40).contains(&distinct),
        "{distinct} delivered in {} requests by {:?}",
        rig.collector.request_count(),
        eventspool::Clock::now_ms(&rig.clock)
    );
    assert!(rig.stats().pending >= 60, "{}", rig.state());
}

#[test]
fn deliver_within_says_when_the_collector_asked_to_come_back() {
    let rig = rig()
        .collector(|c| {
            c.push_script([Scripted::Status {
                status: 503,
                body: String::new(),
                headers: vec![("Retry-After".into(), "30".into())],
            }])
        })
        .open();
    rig.track_n("later", 5);
    let outcome = rig.deliver_within(Duration::from_secs(10)).unwrap();
    // The retry is due at 30 s, after the 10 s budget: the job hears so at once.
    assert_eq!(outcome, DrainOutcome::RetryAfter { ms: 30_000 });
    assert_eq!(rig.collector.request_count(), 1);
    assert!(matches!(
        rig.state().state,
        DeliveryState::RetryScheduled { attempt: 1, .. }
    ));
}

#[test]
fn deliver_within_waits_for_a_retry_due_inside_its_budget() {
    let rig = rig().collector(|c| c.push_statuses(&[503])).open();
    rig.track_n("soon", 5);
    let job = drain_on_thread(&rig.spool, Duration::from_secs(60));
    let (retry_in_ms, _) = rig.until(|s| match s {
        DeliveryState::RetryScheduled { retry_in_ms, .. } => Some(*retry_in_ms),
        _ => None,
    });
    assert!(
        !job.is_finished(),
        "a retry inside the budget is waited for"
    );
    rig.clock.advance(Duration::from_millis(retry_in_ms));
    assert_eq!(job.join().unwrap().unwrap(), DrainOutcome::Drained);
    assert_eq!(rig.collector.distinct_count(), 5);
    assert_eq!(rig.collector.request_count(), 2);
}

#[test]
fn deliver_within_is_blocked_offline_and_paused() {
    let offline = rig().offline().open();
    offline.track_n("offline", 3);
    assert_eq!(
        offline.deliver_within(Duration::from_secs(10)).unwrap(),
        DrainOutcome::Blocked {
            state: DeliveryState::Offline
        }
    );
    assert_eq!(offline.collector.request_count(), 0);

    let paused = rig().collector(|c| c.push_statuses(&[401])).open();
    paused.track_n("refused", 3);
    match paused.deliver_within(Duration::from_secs(10)).unwrap() {
        DrainOutcome::Blocked {
            state: DeliveryState::Paused { reason, last_error },
        } => {
            assert_eq!(reason, PauseReason::Auth);
            assert_eq!(last_error.status, Some(401));
        }
        other => panic!("expected Blocked{{Paused}}, got {other:?}"),
    }
    assert_eq!(paused.collector.request_count(), 1);
    assert_eq!(paused.stats().pending, 3);
}

/// The drain asks the worker; it never sends beside it. Two jobs drain while the app tracks,
/// flushes and reaches `flush_at` on another thread, against a collector that takes 5 ms per
/// answer: the collector never sees two requests at once.
#[test]
fn deliver_within_and_the_worker_never_have_two_requests_in_flight() {
    let rig = rig()
        .collector(|c| {
            c.set_behavior(Behavior {
                delay: Some(Duration::from_millis(5)),
                ..Behavior::default()
            })
        })
        .config(|c| {
            c.flush_at = 10;
            c.max_batch_events = 10;
        })
        .open();
    let app = {
        let spool = rig.spool.clone();
        std::thread::spawn(move || {
            for i in 0..300 {
                spool.track("busy", json!({ "i": i })).unwrap();
                if i % 25 == 0 {
                    spool.flush();
                }
            }
        })
    };
    let jobs: Vec<_> = (0..2)
        .map(|_| drain_on_thread(&rig.spool, Duration::from_secs(60)))
        .collect();
    app.join().unwrap();
    for job in jobs {
        let outcome = job.join().unwrap().unwrap();
        assert_eq!(outcome, DrainOutcome::Drained);
    }
    // The drains may have found the queue empty before the app's last events: one more.
    assert_eq!(
        rig.deliver_within(Duration::from_secs(60)).unwrap(),
        DrainOutcome::Drained
    );
    assert_eq!(rig.collector.distinct_count(), 300);
    assert!(rig.collector.request_count() >= 30);
    assert_eq!(rig.collector.max_concurrent_requests(), 1);
}

/// The whole story of a platform job: the app tracked offline and persisted when it went to the
/// background; the process died (the spool dropped); the job opens the store again and drains.
#[test]
fn deliver_within_on_a_reopened_store_delivers_what_was_persisted() {
    let collector = collector();
    let dir = tempfile::tempdir().unwrap();
    let mut config = config(&collector);
    config.db_path = Some(dir.path().join("events.db"));
    config.flush_at = 10_000;
    let (_, clock) = manual_clock();
    let ids: HashSet<String> = {
        let app = EventSpool::builder(config.clone())
            .clock(clock.clone())
            .start_offline()
            .open()
            .unwrap();
        let ids = (0..120)
            .map(|i| {
                app.track("persisted", json!({ "i": i }))
                    .unwrap()
                    .to_string()
            })
            .collect();
        assert_eq!(app.persist().unwrap(), 120);
        ids
        // Dropped here, as a process that dies in the background.
    };
    assert_eq!(collector.request_count(), 0);
    let job = EventSpool::builder(config).clock(clock).open().unwrap();
    assert_eq!(job.stats().restored, 120);
    assert_eq!(
        job.deliver_within(Duration::from_secs(30)).unwrap(),
        DrainOutcome::Drained
    );
    assert_eq!(collector.distinct_count(), 120);
    assert_eq!(collector.received_count(), 120, "no duplicates");
    assert_ids_kept(&collector, &ids);
    job.shutdown(Duration::from_secs(2)).unwrap();
}

#[test]
fn deliver_within_after_shutdown_is_refused() {
    let rig = rig().open();
    let Rig { spool, .. } = &rig;
    spool.shutdown(Duration::from_secs(2)).unwrap();
    assert!(matches!(
        spool.deliver_within(Duration::from_secs(1)),
        Err(eventspool::Error::ShutDown)
    ));
}

/// From an observer (the worker's thread) the drain would wait for itself: refused, not hung.
#[test]
fn deliver_within_from_an_observer_is_refused() {
    let rig = rig().offline().open();
    let seen = Arc::new(std::sync::Mutex::new(None));
    let (spool, slot) = (rig.spool.clone(), seen.clone());
    let _handle = rig.add_observer(Arc::new(move |_: &eventspool::DeliveryStatus| {
        let mut slot = slot.lock().unwrap();
        if slot.is_none() {
            *slot = Some(spool.deliver_within(Duration::from_secs(1)).map(|_| ()));
        }
    }));
    rig.track_n("wake", 1);
    rig.dismiss();
    let done = rig.wait_for(WAIT, |_| seen.lock().unwrap().is_some());
    assert!(done.is_some(), "the observer ran");
    let result = seen.lock().unwrap().take().unwrap();
    assert!(
        matches!(result, Err(eventspool::Error::WrongThread(_))),
        "{result:?}"
    );
}
