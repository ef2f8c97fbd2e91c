//! Delivery decisions: a 400 that refuses the request rather than its events, the
//! size a proxy accepts, and delivery that resumes by itself after a short outage.

use std::time::Duration;

use eventspool::{Compression, DeliveryState, EventSpool, ManualClock, PauseReason};
use eventspool_collector::{Behavior, Scripted};
use serde_json::json;

use crate::common::*;
use crate::rig::{Rig, pick, rig};

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
            DeliveryState::WaitingForUser { probe_in_ms, .. } => probe_in_ms > 0,
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

/// The side-by-side outage harness on the driven clock: an app tracks 200 events/s for
/// 10 s, the collector is down from 3 s to 23 s, the app lives until 40 s.
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

type ReferenceCollectorRef = eventspool_collector::ReferenceCollector;

/// With the default retry policy every event is delivered by 40 s, without anyone pressing
/// "retry". The jitter is seeded so each run replays exactly; several seeds, because the
/// policy must not depend on one lucky draw.
#[test]
fn a_short_outage_recovers_without_the_user() {
    for seed in [1, 2, 3, 4, 5] {
        let collector = collector();
        let (clock, dyn_clock) = manual_clock();
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = config(&collector);
        cfg.db_path = Some(dir.path().join("live.db"));
        let spool = EventSpool::builder(cfg)
            .clock(dyn_clock)
            .jitter_seed(seed)
            .open()
            .unwrap();
        short_outage_run(&clock, &spool, &collector);
        let status = spool.state();
        eprintln!(
            "short outage, seed {seed}: {} of 2000 delivered by 40 s, {} requests, state {status}",
            collector.distinct_count(),
            spool.stats().requests
        );
        assert_eq!(
            collector.distinct_count(),
            2_000,
            "seed {seed}: delivered within the linger; state {status}"
        );
        assert_eq!(status.pending, 0);
        let stats = spool.stats();
        assert_eq!(
            stats.dropped_from_queue() + stats.quarantined,
            0,
            "{stats:?}"
        );
    }
}

/// Steps the clock a second at a time (bounded) until the state satisfies `done`; the worker
/// must already be in a failure state (`settle` cannot tell a flush not yet taken up from rest).
fn step_until(
    clock: &ManualClock,
    spool: &EventSpool,
    what: &str,
    done: impl Fn(&DeliveryState) -> bool,
) {
    for _ in 0..2_000 {
        settle(spool);
        if done(&spool.state().state) {
            return;
        }
        clock.advance(Duration::from_secs(1));
    }
    panic!("never reached {what}: {}", spool.state());
}

/// Behind `WaitingForUser` a slow probe runs: one request at the announced time; a failure keeps
/// the state and moves the next probe further out; a success drains as a fresh episode.
#[test]
fn waiting_for_user_probes_slowly_and_resumes_by_itself() {
    let rig = rig()
        .collector(|c| c.set_outage(true).unwrap())
        .config(|c| c.max_auto_attempts = 2)
        .seed(7)
        .offline()
        .open();
    let Rig {
        collector,
        clock,
        recorder,
        config: cfg,
        spool,
        ..
    } = &rig;
    rig.track_n("p", 30);
    // One batch of 30, sent when the app comes online.
    spool.set_online(true);
    rig.until(pick!(DeliveryState::RetryScheduled { .. }));
    step_until(clock, spool, "waiting for user", |s| {
        matches!(s, DeliveryState::WaitingForUser { .. })
    });
    let probe_in = |s: &DeliveryState| match s {
        DeliveryState::WaitingForUser {
            attempts,
            probe_in_ms,
            next_probe_at_ms,
            ..
        } => (*attempts, *probe_in_ms, *next_probe_at_ms),
        other => panic!("not waiting for the user: {other:?}"),
    };
    let (attempts, first_in, at) = probe_in(&spool.state().state);
    assert_eq!(attempts, 2);
    assert!(
        first_in > 0 && first_in <= cfg.probe_base_ms,
        "first probe within probe_base_ms: {first_in}"
    );
    assert_eq!(at, clock_wall(clock) + first_in as i64, "next_probe_at_ms");
    let requests = spool.stats().requests;

    // Just before the probe: nothing is sent.
    clock.advance(Duration::from_millis(first_in - 1));
    settle(spool);
    assert_eq!(
        spool.stats().requests,
        requests,
        "no request before the probe time"
    );
    // The probe, still in the outage: one request, the state stays, the next probe is later.
    clock.advance(Duration::from_millis(1));
    let deadline = std::time::Instant::now() + WAIT;
    while spool.stats().requests == requests {
        assert!(
            std::time::Instant::now() < deadline,
            "the probe never went out"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    settle(spool);
    assert_eq!(
        spool.stats().requests,
        requests + 1,
        "one request per probe"
    );
    let (attempts_after, second_in, _) = probe_in(&spool.state().state);
    assert_eq!(attempts_after, 2, "a failed probe keeps the state");
    assert!(
        second_in > 0 && second_in <= 2 * cfg.probe_base_ms,
        "{second_in}"
    );
    assert_eq!(spool.state().pending, 30);
    let shown: Vec<&str> = recorder
        .seen()
        .iter()
        .map(|s| s.state.name())
        .skip_while(|n| *n != "waiting_for_user")
        .collect();
    assert!(
        !shown.is_empty() && shown.iter().all(|n| *n == "waiting_for_user"),
        "the probe runs behind WaitingForUser, the UI saw {shown:?}"
    );

    // The collector is back: the next probe delivers everything, as a fresh episode.
    collector.set_outage(false).unwrap();
    clock.advance(Duration::from_millis(second_in));
    assert!(spool.wait_drained(WAIT), "{}", spool.state());
    assert_eq!(collector.distinct_count(), 30);
    assert_eq!(
        spool.stats().requests,
        requests + 2,
        "collector saw {:?}",
        collector
            .requests()
            .iter()
            .map(|r| (r.status, r.event_ids.len(), r.attempt))
            .collect::<Vec<_>>()
    );
}

fn clock_wall(clock: &std::sync::Arc<ManualClock>) -> i64 {
    use eventspool::Clock;
    clock.wall_ms()
}

/// Returning to the foreground starts a fresh episode: from `WaitingForUser` and from a
/// scheduled retry it sends at once, without waiting for the probe or the countdown (the clock
/// does not move once the worker is parked on a future deadline).
#[test]
fn coming_to_the_foreground_sends_again_at_once() {
    for max_auto_attempts in [1, 10] {
        let rig = rig()
            .collector(|c| c.set_outage(true).unwrap())
            .config(|c| {
                c.max_auto_attempts = max_auto_attempts;
                c.backoff_base_ms = 60_000;
                c.backoff_cap_ms = 60_000;
            })
            .seed(3)
            .open();
        let Rig {
            collector,
            clock,
            spool,
            ..
        } = &rig;
        rig.track_n("f", 1);
        rig.flush_until(pick!(DeliveryState::RetryScheduled { .. }));
        if max_auto_attempts == 1 {
            step_until(clock, spool, "waiting for user", |s| {
                matches!(s, DeliveryState::WaitingForUser { .. })
            });
        }
        settle(spool);
        let parked = spool.state();
        collector.set_outage(false).unwrap();
        spool.set_foreground(false);
        spool.set_foreground(true);
        assert!(
            spool.wait_drained(WAIT),
            "foreground did not resume delivery from {parked}: {}",
            spool.state()
        );
        assert_eq!(collector.distinct_count(), 1);
    }
}
