//! Reports against the reference collector's totals, through a hostile transit: the real
//! [`Fleet`] cuts, carries and forgets reports; the real `FleetBook` totals them; in between,
//! requests and answers are lost, repeated and reordered at random.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use eventspool_collector::FleetBook;
use proptest::prelude::*;
use serde_json::Value;

use super::*;
use crate::config::Durability;
use crate::queue::QueueParams;
use crate::stats::Ledger;

fn queue() -> Queue {
    let params = QueueParams {
        memory_capacity: 100,
        durability: Durability::Spill,
        quarantine_max_events: 100,
        quarantine_retention_ms: 1_000_000,
        encryption_keys: Default::default(),
        aead: crate::crypto::Aead::for_this_cpu(),
    };
    Queue::in_memory(params, Ledger::default(), Arc::new(Mutex::new(Vec::new())))
}

/// What happens between two sends.
#[derive(Clone, Debug)]
enum Step {
    /// The ledger moves: events tracked, delivered, quarantined, dropped.
    Move {
        tracked: u64,
        delivered: u64,
        quarantined: u64,
        expired: u64,
    },
    /// A request leaves. `arrives`: the collector gets it (else it is lost); `copies` extra
    /// copies reach it later (a proxy retrying); `answered`: the 2xx reaches the device.
    Send {
        arrives: bool,
        copies: u8,
        answered: bool,
    },
    /// A copy held in transit arrives now (reordered after later requests).
    Late(usize),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        (0u64..20, 0u64..20, 0u64..3, 0u64..2).prop_map(|(t, d, q, e)| Step::Move {
            tracked: t,
            delivered: d,
            quarantined: q,
            expired: e,
        }),
        (any::<bool>(), 0u8..3, any::<bool>()).prop_map(|(a, c, r)| Step::Send {
            arrives: a,
            copies: c,
            answered: r,
        }),
        (0usize..8).prop_map(Step::Late),
    ]
}

/// The device's ledger as the test drives it (what `Stats` would say).
fn stats(t: u64, d: u64, expired: u64) -> Stats {
    let mut s = Stats {
        tracked: t,
        delivered: d,
        ..Stats::default()
    };
    s.dropped.insert("expired".into(), expired);
    s
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn lost_repeated_and_reordered_reports_still_total_exactly(
        steps in proptest::collection::vec(step(), 1..60),
    ) {
        let q = queue();
        let fleet = Fleet::load(&q, true, 60_000, (0, 0), crate::Consent::Granted);
        let mut book = FleetBook::default();
        let (mut t, mut d, mut quarantined, mut expired) = (0, 0, 0, 0);
        let mut in_transit: Vec<Value> = Vec::new();
        let deliver = |book: &mut FleetBook, body: &str| -> Result<(), TestCaseError> {
            let reports: Vec<Value> = serde_json::from_str(body).unwrap();
            for r in &reports {
                prop_assert!(book.add(r).is_some(), "a report the collector cannot read: {}", r);
            }
            Ok(())
        };
        for s in steps {
            match s {
                Step::Move { tracked, delivered, quarantined: qn, expired: e } => {
                    t += tracked;
                    d += delivered;
                    expired += e;
                    quarantined += qn;
                    fleet.count_quarantined("bad_request", qn);
                }
                Step::Send { arrives, copies, answered } => {
                    fleet.cut(&q, &stats(t, d, expired));
                    let (ids, body) = fleet.for_request(u64::MAX);
                    let Some(body) = body else { continue };
                    if arrives {
                        deliver(&mut book, &body)?;
                        for _ in 0..copies {
                            in_transit.extend(serde_json::from_str::<Vec<Value>>(&body).unwrap());
                        }
                        if answered {
                            fleet.answered(&q, &ids, br#"{"reports_seen":[]}"#, (0, 0));
                        }
                    }
                }
                Step::Late(i) => {
                    if !in_transit.is_empty() {
                        let r = in_transit.remove(i % in_transit.len());
                        prop_assert!(book.add(&r).is_some());
                    }
                }
            }
        }
        // The network heals: requests go and are answered until nothing waits.
        for _ in 0..=MAX_WAITING_REPORTS + 1 {
            fleet.cut(&q, &stats(t, d, expired));
            let (ids, body) = fleet.for_request(u64::MAX);
            let Some(body) = body else { break };
            deliver(&mut book, &body)?;
            fleet.answered(&q, &ids, b"{}", (0, 0));
        }
        for r in in_transit {
            book.add(&r);
        }
        prop_assert!(fleet.for_request(u64::MAX).1.is_none(), "reports still waiting");
        let totals = book.totals();
        let mut want = BTreeMap::new();
        for (name, n) in [
            ("tracked", t),
            ("delivered", d),
            ("quarantined.bad_request", quarantined),
            ("dropped.expired", expired),
        ] {
            if n > 0 {
                want.insert(name.to_string(), n);
            }
        }
        prop_assert_eq!(totals.counts, want);
        prop_assert_eq!(totals.malformed, 0);
    }
}

/// Reports and the install id outlive the handle: a reopened store resends the reports no 2xx
/// covered, with their ids, and continues the numbering.
#[test]
fn reports_and_the_install_id_survive_a_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.db");
    let params = QueueParams {
        memory_capacity: 100,
        durability: Durability::Spill,
        quarantine_max_events: 100,
        quarantine_retention_ms: 1_000_000,
        encryption_keys: Default::default(),
        aead: crate::crypto::Aead::for_this_cpu(),
    };
    let open = || {
        crate::queue::Queue::open(
            &path,
            1 << 20,
            0,
            params.clone(),
            Ledger::default(),
            Arc::new(Mutex::new(Vec::new())),
        )
        .unwrap()
        .queue
    };
    let (install, first) = {
        let q = open();
        let fleet = Fleet::load(&q, true, 60_000, (0, 0), crate::Consent::Granted);
        fleet.cut(&q, &stats(5, 0, 0));
        fleet.cut(&q, &stats(7, 2, 0));
        let (ids, body) = fleet.for_request(u64::MAX);
        assert_eq!(ids, vec![1, 2]);
        fleet.answered(&q, &[1], b"{}", (0, 0));
        q.release_ownership();
        (fleet.install_id().unwrap(), body.unwrap())
    };
    let q = open();
    let fleet = Fleet::load(&q, true, 60_000, (0, 0), crate::Consent::Granted);
    assert_eq!(fleet.install_id(), Some(install));
    let (ids, body) = fleet.for_request(u64::MAX);
    assert_eq!(ids, vec![2], "the uncovered report waits, with its id");
    let first: Vec<Value> = serde_json::from_str(&first).unwrap();
    let again: Vec<Value> = serde_json::from_str(&body.unwrap()).unwrap();
    assert_eq!(again[0], first[1], "byte for byte the same report");
    fleet.cut(&q, &stats(1, 0, 0));
    assert_eq!(
        fleet.for_request(u64::MAX).0,
        vec![2, 3],
        "numbering goes on"
    );
}

/// A store-backed queue in `dir`, as a restart opens it.
fn stored_queue(dir: &std::path::Path) -> Queue {
    let params = QueueParams {
        memory_capacity: 100,
        durability: Durability::Spill,
        quarantine_max_events: 100,
        quarantine_retention_ms: 1_000_000,
        encryption_keys: Default::default(),
        aead: crate::crypto::Aead::for_this_cpu(),
    };
    crate::queue::Queue::open(
        &dir.join("s.db"),
        1 << 20,
        0,
        params,
        Ledger::default(),
        Arc::new(Mutex::new(Vec::new())),
    )
    .unwrap()
    .queue
}

fn redrive_directive(id: &str) -> Vec<u8> {
    format!(r#"{{"directives":{{"id":"{id}","redrive":["bad_request"]}}}}"#).into_bytes()
}

/// "Once per directive id" holds for every id seen, not only the last: A, B, A (one load
/// balancer's instances serving different directives) runs A's redrive once, also across a
/// restart, so a collector cannot loop dead letters through redrives.
#[test]
fn one_shot_actions_run_once_per_id_whatever_came_between() {
    let dir = tempfile::tempdir().unwrap();
    {
        let q = stored_queue(dir.path());
        let fleet = Fleet::load(&q, true, 60_000, (0, 0), crate::Consent::Granted);
        let once = |id: &str| {
            !fleet
                .answered(&q, &[], &redrive_directive(id), (0, 0))
                .redrive
                .is_empty()
        };
        assert!(once("A"), "A runs");
        assert!(once("B"), "B runs");
        assert!(!once("A"), "A again after B does not run again");
        assert!(!once("B"));
        q.release_ownership();
    }
    let q = stored_queue(dir.path());
    let fleet = Fleet::load(&q, true, 60_000, (0, 0), crate::Consent::Granted);
    let again = fleet.answered(&q, &[], &redrive_directive("A"), (0, 0));
    assert!(again.redrive.is_empty(), "nor after a restart");
    let c = fleet.answered(&q, &[], &redrive_directive("C"), (0, 0));
    assert_eq!(c.redrive, vec!["bad_request"], "a new id runs");
}

/// A directive's life is kept across a restart as the time it had left (the monotonic clock
/// starts again at every open), and a wall clock put back a year in between does not stretch it.
#[test]
fn a_directive_keeps_its_time_left_across_a_restart() {
    const HOUR: u64 = 3_600_000;
    const WALL: i64 = 1_800_000_000_000;
    let dir = tempfile::tempdir().unwrap();
    {
        let q = stored_queue(dir.path());
        let fleet = Fleet::load(&q, true, 60_000, (WALL, 0), crate::Consent::Granted);
        let body = br#"{"directives":{"id":"d","ttl_ms":3600000,"drop_names":["spam"]}}"#;
        fleet.answered(&q, &[], body, (WALL, 0));
        assert_eq!(fleet.screen("spam", false, || 10), Screen::NameDropped);
        // Half an hour later the app shuts down.
        fleet.save_clock(&q, HOUR / 2);
        q.release_ownership();
    }
    // The next process: its monotonic clock starts at 5; the wall clock went back a year.
    let q = stored_queue(dir.path());
    let year = 365 * 24 * HOUR as i64;
    let fleet = Fleet::load(&q, true, 60_000, (WALL - year, 5), crate::Consent::Granted);
    let d = fleet.in_force(5, WALL - year).expect("still in force");
    assert_eq!(d.expires_in_ms, HOUR / 2, "the half hour it had left");
    assert_eq!(
        fleet.screen("spam", false, || 5 + HOUR / 2 - 1),
        Screen::NameDropped
    );
    assert_eq!(fleet.screen("spam", false, || 5 + HOUR / 2), Screen::Keep);
    assert!(fleet.in_force(5 + HOUR / 2, WALL - year).is_none());
}

/// Issue 23, point 4: the install id is drawn from the OS's generator, not from one the
/// process seeds (a time-seeded generator, or `fastrand`'s, which any code in the process may
/// seed): two ids drawn after the process's generator was seeded alike still differ.
#[test]
fn install_ids_come_from_the_os_not_from_a_seeded_generator() {
    let dir = tempfile::tempdir().unwrap();
    let q = stored_queue(dir.path());
    fastrand::seed(7);
    let first = new_install_id(&q).expect("an id");
    fastrand::seed(7);
    let second = new_install_id(&q).expect("an id");
    assert_eq!(first.len(), 32, "128 bits as hex: {first}");
    assert_ne!(
        first, second,
        "the same id twice after the same seed: it comes from the process's generator"
    );
}

/// Draining (reports cut while a request is on the wire), a report of the events' way through
/// alone is cut at most every [`DRAIN_REPORT_INTERVAL_MS`]: cut for every batch, it made the
/// collector record a report with every request. A loss is cut at once, what waited goes with
/// the next report, and a request that does not follow another cuts whatever changed.
#[test]
fn a_drain_cuts_a_report_of_deliveries_alone_at_most_every_interval() {
    let q = queue();
    let fleet = Fleet::load(&q, true, 60_000, (0, 0), crate::Consent::Granted);
    let step = DRAIN_REPORT_INTERVAL_MS / 10;
    fleet.cut_ahead(&q, &stats(100, 0, 0), 0);
    for i in 1..10 {
        fleet.cut_ahead(&q, &stats(100, i * 10, 0), i * step);
    }
    assert_eq!(
        fleet.for_request(u64::MAX).0,
        vec![1],
        "deliveries alone were cut within the interval"
    );
    // An event expires: cut at once, with the deliveries that waited.
    fleet.cut_ahead(&q, &stats(100, 95, 1), 10 * step - 1);
    fleet.cut_ahead(&q, &stats(100, 96, 1), 10 * step);
    let (ids, body) = fleet.for_request(u64::MAX);
    assert_eq!(
        ids,
        vec![1, 2],
        "a loss waited, or deliveries alone did not"
    );
    let reports: Vec<Value> = serde_json::from_str(&body.unwrap()).unwrap();
    assert_eq!(reports[1]["delivered"], 95);
    assert_eq!(reports[1]["dropped"]["expired"], 1);
    // The interval since the last report passed: deliveries alone are cut.
    fleet.cut_ahead(&q, &stats(100, 97, 1), 20 * step - 1);
    fleet.forget_cut_ahead();
    // Not a drain: whatever changed is cut.
    fleet.cut_before_request(&q, 20 * step, || stats(100, 98, 1));
    let (ids, body) = fleet.for_request(u64::MAX);
    assert_eq!(ids, vec![1, 2, 3, 4]);
    let reports: Vec<Value> = serde_json::from_str(&body.unwrap()).unwrap();
    assert_eq!(
        (&reports[2]["delivered"], &reports[3]["delivered"]),
        (&2.into(), &1.into())
    );
}
