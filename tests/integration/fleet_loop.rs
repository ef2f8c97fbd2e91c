//! The fleet loop end to end (docs/decisions/0060): 50 spools on one reference
//! collector whose "bug" refuses every event with a `coupon` property. Each device quarantines
//! those events and reports it; the collector's totals show the leak; the bug is fixed and the
//! collector sends `redrive: ["bad_request"]`; every device redrives, and in the end the
//! collector holds each tracked event once and the reports balance the devices' own ledgers.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use eventspool::{EventSpool, ManualClock, Stats};
use eventspool_collector::{Behavior, FleetTotals, ReferenceCollector};
use serde_json::json;

use crate::common::{WAIT, collector, config};

const SPOOLS: usize = 50;
const GOOD: usize = 8;
const BAD: usize = 2;

/// Polls the collector's report totals until `done` holds, or fails naming what it saw.
fn totals_until(c: &ReferenceCollector, what: &str, done: impl Fn(&FleetTotals) -> bool) {
    let deadline = Instant::now() + WAIT;
    loop {
        let t = c.fleet_totals();
        if done(&t) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}: {t:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn sum(stats: &[Stats], f: impl Fn(&Stats) -> u64) -> u64 {
    stats.iter().map(f).sum()
}

#[test]
fn a_fleet_leak_is_reported_then_redriven_by_a_directive() {
    let c = collector();
    c.set_behavior(Behavior {
        reject_property: Some("coupon".into()),
        lone_reports: true,
        ..Behavior::default()
    });
    let dirs: Vec<_> = (0..SPOOLS).map(|_| tempfile::tempdir().unwrap()).collect();
    let spools: Vec<EventSpool> = dirs
        .iter()
        .map(|dir| {
            let mut cfg = config(&c);
            cfg.db_path = Some(dir.path().join("events.db"));
            cfg.flush_at = 1000;
            let clock = Arc::new(ManualClock::auto_advancing(1_764_417_600_000));
            EventSpool::builder(cfg)
                .clock(Arc::new(clock))
                .open()
                .unwrap()
        })
        .collect();
    let mut tracked = HashSet::new();
    for spool in &spools {
        for i in 0..GOOD + BAD {
            let props = if i % 5 == 4 {
                json!({"i": i, "coupon": "SAVE10"})
            } else {
                json!({"i": i})
            };
            tracked.insert(spool.track("checkout", props).unwrap().to_string());
        }
        spool.flush();
    }
    for spool in &spools {
        assert!(spool.wait_drained(WAIT), "{}", spool.state());
    }
    let (good, bad) = ((SPOOLS * GOOD) as u64, (SPOOLS * BAD) as u64);
    // The leak, as the collector sees it from the reports alone.
    totals_until(&c, "the reports of the leak", |t| {
        t.count("delivered") == good && t.quarantine_size == bad
    });
    let leak = c.fleet_totals();
    eprintln!("leak: {}", leak.to_json());
    assert_eq!(leak.installs, SPOOLS as u64);
    assert_eq!(leak.count("tracked"), good + bad);
    assert_eq!(leak.count("quarantined.bad_request"), bad);
    assert_eq!(leak.pending, 0);
    assert_eq!(c.distinct_count(), good);

    // The fix ships on the collector, with the directive that brings the events back.
    c.set_behavior(Behavior {
        directives: Some(json!({"id": "fix-coupon", "redrive": ["bad_request"]})),
        lone_reports: true,
        ..Behavior::default()
    });
    // Devices hear it with their next request (here: one more event each).
    for spool in &spools {
        tracked.insert(spool.track("app_open", json!({})).unwrap().to_string());
        spool.flush();
    }
    let all = (SPOOLS * (GOOD + BAD + 1)) as u64;
    assert!(
        c.wait_for_distinct(all, WAIT),
        "distinct {}",
        c.distinct_count()
    );
    for spool in &spools {
        assert!(spool.wait_drained(WAIT), "{}", spool.state());
    }
    totals_until(&c, "the reports of the redrive", |t| {
        t.count("delivered") == all && t.quarantine_size == 0
    });

    // Every tracked event, each once.
    let stored: Vec<String> = c.events().into_iter().map(|e| e.event_id).collect();
    let distinct: HashSet<String> = stored.iter().cloned().collect();
    assert_eq!(
        distinct, tracked,
        "the collector holds exactly what was tracked"
    );
    assert_eq!(stored.len() as u64, all, "each event stored once");

    // The reports balance: the sum of the device ledgers is the collector's totals.
    let stats: Vec<Stats> = spools.iter().map(|s| s.stats()).collect();
    let t = c.fleet_totals();
    eprintln!("after the redrive: {}", t.to_json());
    assert!(stats.iter().all(Stats::balances));
    assert_eq!(t.count("tracked"), sum(&stats, |s| s.tracked));
    assert_eq!(t.count("delivered"), sum(&stats, |s| s.delivered));
    assert_eq!(t.count("redriven"), sum(&stats, |s| s.redriven));
    assert_eq!(
        t.count("quarantined.bad_request"),
        sum(&stats, |s| s.quarantined)
    );
    assert_eq!(t.count("redriven"), bad);
    assert_eq!(t.count("tracked"), all);
    assert_eq!(t.pending, 0);
    assert!(sum(&stats, |s| s.directives_applied) >= SPOOLS as u64);
    assert_eq!(sum(&stats, |s| s.directives_ignored), 0);
    for spool in &spools {
        spool.shutdown(WAIT).unwrap();
    }
}

/// Waits until the worker is parked on the stepped clock (it has acted on everything so far).
fn parked(clock: &ManualClock) {
    let deadline = Instant::now() + WAIT;
    while clock.sleepers() == 0 {
        assert!(Instant::now() < deadline, "the worker never parked");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// The settings a directive carries, through the real collector: `sample_rate` and
/// `drop_names` act at `track()` (counted), `pause_until` holds requests only up to
/// `retry_after_cap_ms`, an unknown member is ignored and counted, and `directives = false`
/// turns it all off.
#[test]
fn directives_steer_new_events_and_pause_within_the_cap() {
    let directive = json!({"id": "d-1", "sample_rate": {"debug_": 0.0}, "drop_names": ["spam"],
                           "pause_until": "2030-01-01T00:00:00Z", "reboot": true});
    for on in [true, false] {
        let rig = crate::rig::rig()
            .collector(|c| {
                c.set_behavior(Behavior {
                    directives: Some(directive.clone()),
                    ..Behavior::default()
                })
            })
            .config(|c| {
                c.retry_after_cap_ms = 10_000;
                c.directives = on;
            })
            .stored()
            .open();
        rig.track_n("first", 1);
        rig.flush_drained();
        let sampled = rig.spool.track("debug_view", json!({}));
        let refused = rig.spool.track("spam", json!({}));
        let s = rig.stats();
        if !on {
            assert!(sampled.is_ok() && refused.is_ok());
            assert_eq!(s.dropped(eventspool::DropReason::Sampled), 0);
            assert_eq!((s.directives_applied, s.directives_ignored), (0, 1));
            continue;
        }
        assert!(sampled.is_ok(), "sampling is not the app's error");
        let err = refused.unwrap_err().to_string();
        assert!(err.contains("drop_names"), "{err}");
        assert_eq!(s.dropped(eventspool::DropReason::Sampled), 1);
        assert_eq!(s.dropped(eventspool::DropReason::NameDropped), 1);
        assert_eq!(s.pending, 0, "neither was queued");
        assert_eq!(
            (s.directives_applied, s.directives_ignored),
            (1, 1),
            "`reboot` ignored"
        );
        assert!(s.balances());
        // The pause: a flush sends nothing until the cap (10 s from its arrival) has passed.
        let before = rig.collector.request_count();
        rig.track_n("later", 1);
        rig.spool.flush();
        parked(&rig.clock);
        rig.clock.advance(Duration::from_millis(9_000));
        parked(&rig.clock);
        assert_eq!(
            rig.collector.request_count(),
            before,
            "nothing sent while paused"
        );
        assert_eq!(rig.stats().pending, 1);
        rig.clock.advance(Duration::from_millis(1_000));
        assert!(rig.spool.wait_drained(WAIT), "{}", rig.spool.state());
        assert_eq!(rig.collector.request_count(), before + 1);
    }
}
