//! Issue 3: classification rows, retry budgets and the state machine the UI shows.

use std::sync::Arc;
use std::time::Duration;

use eventspool::retry::backoff_ceiling_ms;
use eventspool::{Clock, DeliveryState, EventSpool, PauseReason};
use eventspool_collector::Scripted;
use serde_json::json;

use crate::common::*;
use crate::rig::{Rig, pick, rig};

const STEP: Duration = Duration::from_secs(1);

/// The seed story: outage → Sending → RetryScheduled 1..5 of 5 with a ticking countdown →
/// WaitingForUser{5} → retry_now fails → WaitingForUser{6} → collector back → retry_now → Idle.
#[test]
fn seed_story_outage_countdown_manual_retry_and_drain() {
    let rig = rig()
        .collector(|c| c.set_outage(true).unwrap())
        // The seed UI's "attempt 2 of 5". All 30 events are tracked before the first send
        // (the explicit flush below starts it, not `flush_at` at the 20th): a countdown status
        // republished because `pending` grew would repeat its `retry_in_ms`.
        .config(|c| {
            c.max_auto_attempts = 5;
            c.flush_at = 1_000;
        })
        .open();
    let Rig {
        collector,
        clock,
        recorder,
        spool,
        ..
    } = &rig;
    let (base, cap) = (rig.config.backoff_base_ms, rig.config.backoff_cap_ms);
    rig.track_n("story", 30);
    rig.flush_until(pick!(DeliveryState::RetryScheduled { attempt: 1, .. }));
    // Step the clock a second at a time until the budget is spent.
    let mut steps = 0;
    loop {
        let state = spool.state().state;
        if matches!(state, DeliveryState::WaitingForUser { .. }) {
            break;
        }
        steps += 1;
        assert!(steps < 400, "budget never ran out");
        let settled = || matches!(spool.state().state, DeliveryState::WaitingForUser { .. });
        assert!(
            clock.step(STEP, WAIT, settled),
            "worker did not react to the clock"
        );
    }
    assert!(matches!(
        spool.state().state,
        DeliveryState::WaitingForUser { attempts: 5, .. }
    ));
    spool.retry_now();
    wait_state(spool, "6 attempts", |s| {
        matches!(s, DeliveryState::WaitingForUser { attempts: 6, .. })
    });
    collector.set_outage(false).unwrap();
    spool.retry_now();
    assert!(spool.wait_drained(WAIT), "{}", spool.state());
    assert_eq!(collector.distinct_count(), 30);

    // The observer is called just after the state is published; give it that moment.
    let _ = spool.wait_for(WAIT, |_| {
        recorder.seen().last().is_some_and(|s| s.pending == 0)
    });
    let seen = recorder.seen();
    let names: Vec<&str> = seen.iter().map(|s| s.state.name()).collect();
    assert_eq!(
        names.iter().position(|n| *n == "sending"),
        Some(names.iter().position(|n| *n != "idle").unwrap())
    );
    let mut attempts_seen = Vec::new();
    let mut last: Option<(u32, u64)> = None;
    for status in &seen {
        if let DeliveryState::RetryScheduled {
            attempt,
            max_attempts,
            retry_in_ms,
            ..
        } = status.state
        {
            assert_eq!(max_attempts, 5);
            assert!(
                retry_in_ms <= backoff_ceiling_ms(attempt, base, cap),
                "countdown over the bound"
            );
            if attempts_seen.last() != Some(&attempt) {
                attempts_seen.push(attempt);
            } else if let Some((a, previous)) = last
                && a == attempt
            {
                assert!(
                    retry_in_ms < previous,
                    "countdown ticks down: {previous} then {retry_in_ms}"
                );
                assert!(previous - retry_in_ms <= 1000, "once a second");
            }
            last = Some((attempt, retry_in_ms));
        }
    }
    assert_eq!(attempts_seen, [1, 2, 3, 4, 5]);
    let waiting: Vec<u32> = seen
        .iter()
        .filter_map(|s| match s.state {
            DeliveryState::WaitingForUser { attempts, .. } => Some(attempts),
            _ => None,
        })
        .collect();
    assert_eq!(waiting.first(), Some(&5));
    assert!(waiting.contains(&6));
    let end = seen.last().unwrap();
    assert_eq!((end.state.clone(), end.pending), (DeliveryState::Idle, 0));
    let ticks = seen
        .iter()
        .filter(|s| matches!(s.state, DeliveryState::RetryScheduled { .. }))
        .count();
    assert!(
        ticks > 5,
        "observer saw the countdown tick ({ticks} RetryScheduled calls)"
    );
}

/// After "Back", reaching `flush_at` does not restart sending; the next periodic flush does,
/// exactly `flush_interval_ms` after the dismiss on the driven clock.
#[test]
fn dismiss_keeps_events_until_the_next_periodic_flush() {
    let rig = rig().collector(|c| c.set_outage(true).unwrap()).open();
    let Rig {
        collector,
        clock,
        recorder,
        spool,
        ..
    } = &rig;
    let flush_interval = Duration::from_millis(rig.config.flush_interval_ms);
    rig.track_n("kept", 25);
    rig.flush_until(pick!(DeliveryState::RetryScheduled { .. }));
    let dismissed_at = clock.now_ms();
    spool.dismiss();
    let status = wait_state(spool, "idle", |s| *s == DeliveryState::Idle);
    assert_eq!(status.pending, 25, "dismiss keeps every event");
    collector.set_outage(false).unwrap();
    let requests = collector.request_count();
    spool.track("more", json!({})).unwrap();
    // Up to 1 ms before the periodic flush is due: nothing may be sent.
    clock.advance(flush_interval - Duration::from_millis(1));
    let shown = settle(spool, recorder);
    assert_eq!(
        (
            shown.state,
            collector.request_count(),
            collector.distinct_count()
        ),
        (DeliveryState::Idle, requests, 0),
        "after Back, flush_at does not restart sending"
    );
    assert_eq!(
        clock.now_ms(),
        dismissed_at + flush_interval.as_millis() as u64 - 1
    );
    // The periodic flush is due: it sends everything.
    clock.advance(Duration::from_millis(1));
    assert!(spool.wait_drained(WAIT), "{}", spool.state());
    assert_eq!(collector.distinct_count(), 28);
}

#[test]
fn unauthorized_pauses_without_requests_until_a_new_key() {
    let rig = rig()
        .collector(|c| {
            c.set_behavior(eventspool_collector::Behavior {
                required_api_key: Some("good".into()),
                ..Default::default()
            })
        })
        .config(|c| c.api_key = Some("stale".into()))
        .open();
    let Rig {
        collector,
        clock,
        recorder,
        spool,
        ..
    } = &rig;
    rig.track_n("auth", 40);
    let ((reason, last_error), status) = rig.until(pick!(
        DeliveryState::Paused { reason, last_error } => (reason, last_error)
    ));
    assert_eq!(reason, PauseReason::Auth);
    assert_eq!(last_error.status, Some(401));
    assert_eq!(status.pending, 40, "a pause drops nothing");
    let requests = collector.request_count();
    assert_eq!(requests, 1, "one refused request pauses");
    spool.flush();
    spool.retry_now();
    spool.track("while paused", json!({})).unwrap();
    clock.advance(PAST_EVERY_TIMER);
    let shown = settle(spool, recorder);
    assert!(
        matches!(
            shown.state,
            DeliveryState::Paused {
                reason: PauseReason::Auth,
                ..
            }
        ),
        "{shown:?}"
    );
    assert_eq!(
        collector.request_count(),
        requests,
        "no request while paused, with the clock past every timer"
    );
    spool.set_api_key(Some("good".into())).unwrap();
    assert!(spool.wait_drained(WAIT), "{}", spool.state());
    assert_eq!(collector.distinct_count(), 43);
    let stats = spool.stats();
    assert_eq!(stats.quarantined + stats.dropped_from_queue(), 0);
}

#[test]
fn other_4xx_and_redirects_pause_as_config() {
    for status in [404u16, 302] {
        let rig = rig()
            .collector(|c| c.push_statuses(&[status]))
            .instant()
            .open();
        rig.track_n("c", 1);
        let (_, s) = rig.flush_until(pick!(DeliveryState::Paused {
            reason: PauseReason::Config,
            ..
        }));
        assert_eq!(s.pending, 1);
        rig.resume();
        assert!(rig.wait_drained(WAIT));
        assert_eq!(rig.collector.distinct_count(), 1);
    }
}

#[test]
fn retry_after_is_honoured_on_the_driven_clock_and_capped() {
    let rig = rig()
        .collector(|c| c.push_script([retry_after_429("7")]))
        .open();
    let Rig {
        collector,
        clock,
        spool,
        ..
    } = &rig;
    rig.track_n("limited", 1);
    let (retry_in_ms, _) =
        rig.flush_until(pick!(DeliveryState::RetryScheduled { retry_in_ms, .. } => retry_in_ms));
    assert!(
        retry_in_ms >= 7_000,
        "not before Retry-After: {retry_in_ms}"
    );
    for _ in 0..6 {
        clock.step(STEP, WAIT, || false);
        assert_eq!(collector.request_count(), 1, "no request before 7 s");
    }
    for _ in 0..30 {
        if collector.distinct_count() == 1 {
            break;
        }
        clock.step(STEP, WAIT, || spool.state().pending == 0);
    }
    assert!(collector.wait_for_distinct(1, WAIT));

    // Ten years is capped by retry_after_cap_ms.
    let collector = collector_with_retry_after("315360000");
    let (_clock, dyn_clock) = manual_clock();
    let mut cfg = config(&collector);
    cfg.retry_after_cap_ms = 60_000;
    let spool = EventSpool::builder(cfg).clock(dyn_clock).open().unwrap();
    spool.track("limited", json!({})).unwrap();
    spool.flush();
    let s = wait_state(&spool, "retry", |s| {
        matches!(s, DeliveryState::RetryScheduled { .. })
    });
    let DeliveryState::RetryScheduled { retry_in_ms, .. } = s.state else {
        unreachable!()
    };
    assert!(
        (60_000 - 1_000..=60_000).contains(&retry_in_ms),
        "capped: {retry_in_ms}"
    );
}

fn collector_with_retry_after(value: &str) -> eventspool_collector::ReferenceCollector {
    let c = collector();
    c.push_script([retry_after_429(value)]);
    c
}

/// A 429 asking to wait `Retry-After: value`.
fn retry_after_429(value: &str) -> Scripted {
    Scripted::Status {
        status: 429,
        body: String::new(),
        headers: vec![("Retry-After".into(), value.into())],
    }
}

/// Every 503 asks `Retry-After: 3` and the jitter window is 1 ms (always 0), so each retry waits
/// exactly 3 s on the driven clock. Retry k would start at k × 3 s after the episode began; the
/// 18 s budget allows k = 1..=6 (6 × 3 s = 18 s is not over it) and not the 7th: 7 requests,
/// then `WaitingForUser{6}` at 18 s, although 50 attempts were allowed.
#[test]
fn elapsed_budget_hands_over_to_the_user() {
    const DELAY_MS: u64 = 3_000;
    const BUDGET_MS: u64 = 18_000;
    let rig = rig()
        .collector(|c| {
            c.set_behavior(eventspool_collector::Behavior {
                fail_rate: 1.0,
                retry_after: Some((DELAY_MS / 1000).to_string()),
                ..Default::default()
            })
        })
        .config(|c| {
            c.max_auto_attempts = 50;
            c.max_retry_elapsed_ms = BUDGET_MS;
            c.backoff_base_ms = 1;
            c.backoff_cap_ms = 1;
        })
        .open();
    let Rig {
        collector,
        clock,
        spool,
        ..
    } = &rig;
    rig.track_n("e", 1);
    spool.flush();
    let start = clock.now_ms();
    let expected_retries = (BUDGET_MS / DELAY_MS) as u32;
    for attempt in 1..=expected_retries {
        let s = wait_state(spool, "a retry or the hand-over", |s| match s {
            DeliveryState::RetryScheduled { attempt: a, .. } => *a >= attempt,
            DeliveryState::WaitingForUser { .. } => true,
            _ => false,
        });
        let DeliveryState::RetryScheduled {
            attempt: announced,
            retry_in_ms,
            max_attempts,
            ..
        } = s.state
        else {
            panic!("retry {attempt} of {expected_retries} was not scheduled: {s:?}")
        };
        assert_eq!(announced, attempt);
        assert_eq!(
            (retry_in_ms, max_attempts),
            (DELAY_MS, 50),
            "retry {attempt}"
        );
        assert_eq!(collector.request_count(), attempt as usize);
        let next = |s: &DeliveryState| match s {
            DeliveryState::RetryScheduled { attempt: a, .. } => *a > attempt,
            DeliveryState::WaitingForUser { .. } => true,
            _ => false,
        };
        assert!(
            clock.step(Duration::from_millis(DELAY_MS), WAIT, || next(
                &spool.state().state
            )),
            "worker did not react to the clock"
        );
    }
    let (attempts, _) =
        rig.until(pick!(DeliveryState::WaitingForUser { attempts, .. } => attempts));
    assert_eq!(
        attempts, expected_retries,
        "the elapsed budget ended the episode"
    );
    assert_eq!(collector.request_count(), expected_retries as usize + 1);
    assert_eq!(clock.now_ms() - start, expected_retries as u64 * DELAY_MS);
}

/// Offline: no attempt at all, whatever the app asks and however far the clock goes. A
/// reconnect starts a fresh failure episode: the budget spent before (5 of 5) is forgotten, and
/// the first failure after it announces retry 1 of 5 again, not a sixth attempt.
#[test]
fn offline_makes_no_attempts_and_reconnect_starts_a_fresh_episode() {
    let rig = rig()
        .collector(|c| c.set_outage(true).unwrap())
        .config(|c| c.max_auto_attempts = 5)
        .open();
    let Rig {
        collector,
        clock,
        recorder,
        spool,
        ..
    } = &rig;
    rig.track_n("o", 1);
    spool.flush();
    let waiting = |s: &DeliveryState| matches!(s, DeliveryState::WaitingForUser { .. });
    for _ in 0..400 {
        if waiting(&spool.state().state) {
            break;
        }
        assert!(
            clock.step(STEP, WAIT, || waiting(&spool.state().state)),
            "worker did not react to the clock"
        );
    }
    let s = wait_state(spool, "waiting", waiting);
    assert!(
        matches!(s.state, DeliveryState::WaitingForUser { attempts: 5, .. }),
        "{s:?}"
    );
    spool.set_online(false);
    wait_state(spool, "offline", |s| *s == DeliveryState::Offline);
    // The collector refuses connections, so the SDK's own count of attempts is the measure.
    let before = spool.stats().requests;
    assert_eq!(before, 6, "the first send and 5 retries");
    spool.flush();
    spool.retry_now();
    clock.advance(PAST_EVERY_TIMER);
    let shown = settle(spool, recorder);
    assert_eq!(shown.state, DeliveryState::Offline);
    assert_eq!(
        spool.stats().requests,
        before,
        "offline: no attempts at all, with the clock past every timer"
    );

    // Back online while the collector is still down: one attempt, then retry 1 of 5. Read from
    // what the observer was shown, not from the state now: the full jitter may draw a delay of
    // 0 ms, and that retry runs at once whatever the manual clock says.
    let from = recorder.seen().len();
    spool.set_online(true);
    let first_retry = || {
        recorder.seen()[from..]
            .iter()
            .find(|s| {
                matches!(
                    s.state,
                    DeliveryState::RetryScheduled { .. } | DeliveryState::WaitingForUser { .. }
                )
            })
            .cloned()
    };
    spool.wait_for(WAIT, |_| first_retry().is_some());
    let s = first_retry().expect("a retry shown after the reconnect");
    assert!(
        matches!(
            s.state,
            DeliveryState::RetryScheduled {
                attempt: 1,
                max_attempts: 5,
                ..
            }
        ),
        "a reconnect starts a fresh episode: {s:?}"
    );
    assert!(spool.stats().requests > before);
    let after: Vec<&str> = recorder.seen()[from..]
        .iter()
        .map(|s| s.state.name())
        .collect();
    assert!(
        !after.contains(&"waiting_for_user"),
        "no hand-over to the user after the reconnect: {after:?}"
    );
    collector.set_outage(false).unwrap();
    let drained = || spool.state().is_drained();
    for _ in 0..100 {
        if drained() {
            break;
        }
        clock.step(STEP, WAIT, drained);
    }
    assert!(spool.wait_drained(WAIT), "{}", spool.state());
    assert_eq!(
        collector.distinct_count(),
        3,
        "the event and the two markers"
    );
}

#[test]
fn opt_out_stops_tracking_and_purge_deletes_the_queue() {
    let rig = rig()
        .config(|c| c.memory_capacity = 10)
        .stored()
        .offline()
        .open();
    let Rig {
        collector,
        clock,
        recorder,
        spool,
        ..
    } = &rig;
    rig.track_n("before", 50);
    spool.set_enabled(false).unwrap();
    wait_state(spool, "disabled", |s| *s == DeliveryState::Disabled);
    assert!(matches!(
        spool.track("after", json!({})),
        Err(eventspool::Error::Disabled)
    ));
    // 50 queued, online, asked to send, the clock past every timer: still nothing is sent.
    spool.set_online(true);
    spool.flush();
    spool.retry_now();
    clock.advance(PAST_EVERY_TIMER);
    assert_eq!(spool.purge_pending().unwrap(), 50);
    // The known point: the worker shows the purge (a no-op wake makes it publish).
    spool.dismiss();
    let purged_shown = || {
        recorder
            .seen()
            .iter()
            .any(|s| s.state == DeliveryState::Disabled && s.pending == 0)
    };
    spool.wait_for(WAIT, |_| purged_shown());
    assert!(purged_shown(), "{}", spool.state());
    assert_eq!(
        (collector.request_count(), spool.stats().requests),
        (0, 0),
        "nothing queued is sent after opt-out"
    );
    let stats = spool.stats();
    assert_eq!(stats.dropped(eventspool::DropReason::Purged), 50);
    assert!(stats.balances());
}

#[test]
fn a_panicking_observer_does_not_stop_delivery() {
    let collector = collector();
    let spool = EventSpool::builder(config(&collector))
        .observer(Arc::new(|_: &eventspool::DeliveryStatus| {
            panic!("observer bug")
        }))
        .open()
        .unwrap();
    for i in 0..30 {
        spool.track("p", json!({"i": i})).unwrap();
    }
    assert!(spool.wait_drained(WAIT));
    assert_eq!(collector.distinct_count(), 30);
    assert!(spool.stats().panics > 0);
}

#[test]
fn a_pause_survives_a_reconnect() {
    let rig = rig().collector(|c| c.push_statuses(&[403])).open();
    let Rig {
        collector,
        clock,
        recorder,
        spool,
        ..
    } = &rig;
    rig.track_n("x", 1);
    rig.flush_until(pick!(DeliveryState::Paused {
        reason: PauseReason::Auth,
        ..
    }));
    spool.set_online(false);
    wait_state(spool, "offline", |s| *s == DeliveryState::Offline);
    spool.set_online(true);
    wait_state(spool, "paused again", |s| {
        matches!(s, DeliveryState::Paused { .. })
    });
    clock.advance(PAST_EVERY_TIMER);
    let shown = settle(spool, recorder);
    assert!(
        matches!(
            shown.state,
            DeliveryState::Paused {
                reason: PauseReason::Auth,
                ..
            }
        ),
        "{shown:?}"
    );
    assert_eq!(
        collector.request_count(),
        1,
        "a reconnect does not retry a refused key, with the clock past every timer"
    );
    spool.resume();
    assert!(spool.wait_drained(WAIT));
    assert_eq!(
        collector.distinct_count(),
        3,
        "the event and the two markers"
    );
}

#[test]
fn wait_for_sees_a_state_that_lasted_only_an_instant() {
    let collector = collector();
    collector.push_statuses(&[503]);
    let spool = EventSpool::builder(config(&collector))
        .clock(instant_clock())
        .start_offline()
        .open()
        .unwrap();
    spool.track("blink", json!({})).unwrap();
    // On the auto-advancing clock the retry fires the moment it is scheduled. The spool goes
    // online from inside the first call of the predicate, so the whole episode happens after
    // wait_for began looking (going online before the call let a loaded machine run the
    // episode before wait_for started).
    let online = std::sync::Once::new();
    let seen = spool.wait_for(WAIT, |s| {
        online.call_once(|| spool.set_online(true));
        matches!(s.state, DeliveryState::RetryScheduled { attempt: 1, .. })
    });
    assert!(seen.is_some(), "the retry was announced, however briefly");
    assert!(spool.wait_drained(WAIT));
}
