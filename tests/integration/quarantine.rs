//! Issue 3: refused events go to quarantine without blocking the queue, and come back on redrive.

use std::time::Duration;

use eventspool::{DeliveryState, DropReason, EventSpool, ListFilter, Selector};
use eventspool_collector::{Behavior, Scripted};
use serde_json::json;

use crate::common::*;

fn poison_behavior() -> Behavior {
    Behavior {
        reject_name: Some("poison".into()),
        ..Default::default()
    }
}

#[test]
fn one_poison_event_is_isolated_and_redriven_with_its_id() {
    let collector = collector();
    collector.set_behavior(poison_behavior());
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(&collector);
    cfg.db_path = Some(dir.path().join("q.db"));
    cfg.max_batch_events = 100;
    let spool = EventSpool::builder(cfg).start_offline().open().unwrap();
    let mut poison_id = String::new();
    for i in 0..1_000 {
        let name = if i == 437 { "poison" } else { "fine" };
        let id = spool.track(name, json!({"i": i})).unwrap();
        if i == 437 {
            poison_id = id.to_string();
        }
    }
    spool.set_online(true);
    assert!(spool.wait_drained(WAIT), "{}", spool.state());
    assert_eq!(collector.distinct_count(), 999);
    let stats = spool.stats();
    assert_eq!((stats.delivered, stats.quarantined), (999, 1));
    assert_eq!(stats.quarantine.get("bad_request"), Some(&1));
    let extra = collector.request_count() - 10;
    eprintln!("isolating one poison event among 1,000 took {extra} extra requests");
    assert!(
        extra <= 2 * 7 + 2,
        "{extra} extra requests to isolate one event in 100"
    );
    let q = spool
        .quarantine_get(&poison_id)
        .unwrap()
        .expect("quarantined");
    assert_eq!((q.reason.as_str(), q.status), ("bad_request", Some(400)));
    assert!(
        q.detail.contains("poison"),
        "detail keeps the collector's words: {}",
        q.detail
    );

    collector.set_behavior(Behavior::default());
    assert_eq!(
        spool
            .quarantine_redrive(&Selector::Ids(vec![poison_id.clone()]))
            .unwrap(),
        1
    );
    assert!(spool.wait_drained(WAIT));
    assert_eq!(collector.distinct_count(), 1_000);
    assert!(
        collector.contains(&poison_id),
        "redriven with the same event_id"
    );
    let stats = spool.stats();
    assert!(stats.balances(), "{stats:?}");
    assert!(
        spool
            .quarantine_list(&ListFilter::default())
            .unwrap()
            .is_empty()
    );
}

#[test]
fn too_large_batches_split_until_they_fit() {
    let collector = collector();
    collector.set_behavior(Behavior {
        max_body_bytes: Some(6_000),
        ..Default::default()
    });
    let mut cfg = config(&collector);
    cfg.compression = eventspool::Compression::None;
    cfg.max_batch_events = 50;
    let spool = EventSpool::builder(cfg).start_offline().open().unwrap();
    for i in 0..200 {
        spool
            .track("small", json!({"i": i, "pad": "a".repeat(100)}))
            .unwrap();
    }
    let huge = spool
        .track("huge", json!({"pad": "b".repeat(8_000)}))
        .unwrap()
        .to_string();
    spool.set_online(true);
    assert!(spool.wait_drained(WAIT), "{}", spool.state());
    assert_eq!(collector.distinct_count(), 200);
    let q = spool
        .quarantine_get(&huge)
        .unwrap()
        .expect("the event that alone exceeds the limit");
    assert_eq!((q.reason.as_str(), q.status), ("too_large", Some(413)));
    assert!(spool.stats().balances());
}

#[test]
fn partial_rejections_quarantine_exactly_the_listed_events() {
    let collector = collector();
    collector.set_behavior(Behavior {
        partial_reject_name: Some("bad".into()),
        ..Default::default()
    });
    let spool = EventSpool::builder(config(&collector))
        .start_offline()
        .open()
        .unwrap();
    let mut bad = Vec::new();
    for i in 0..300 {
        let name = if i % 37 == 0 { "bad" } else { "good" };
        let id = spool.track(name, json!({"i": i})).unwrap().to_string();
        if name == "bad" {
            bad.push(id);
        }
    }
    spool.set_online(true);
    assert!(spool.wait_drained(WAIT));
    let listed: Vec<String> = spool
        .quarantine_list(&ListFilter::default())
        .unwrap()
        .into_iter()
        .map(|q| q.event_id)
        .collect();
    assert_eq!(listed, bad);
    assert_eq!(collector.distinct_count(), 300 - bad.len() as u64);
    let stats = spool.stats();
    assert_eq!(stats.quarantine.get("rejected"), Some(&(bad.len() as u64)));
    assert!(stats.balances());
}

#[test]
fn quarantine_cap_and_retention_evict_oldest_first_with_exact_counts() {
    for with_store in [true, false] {
        let collector = collector();
        collector.set_behavior(poison_behavior());
        let (clock, dyn_clock) = manual_clock();
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = config(&collector);
        if with_store {
            cfg.db_path = Some(dir.path().join("q.db"));
        }
        cfg.quarantine_max_events = 5;
        cfg.quarantine_retention_ms = 60_000;
        cfg.max_batch_events = 1;
        let spool = EventSpool::builder(cfg)
            .clock(dyn_clock)
            .start_offline()
            .open()
            .unwrap();
        // Each refused event alone is held until the next request shows the collector takes
        // requests (decision 0045): a good event follows each one.
        let mut ids = Vec::new();
        for i in 0..8 {
            ids.push(spool.track("poison", json!({"i": i})).unwrap().to_string());
            spool.track("fine", json!({"i": i})).unwrap();
        }
        spool.set_online(true);
        assert!(spool.wait_drained(WAIT), "{}", spool.state());
        let listed: Vec<String> = spool
            .quarantine_list(&ListFilter::default())
            .unwrap()
            .into_iter()
            .map(|q| q.event_id)
            .collect();
        assert_eq!(
            listed,
            ids[3..].to_vec(),
            "the newest five stay (store: {with_store})"
        );
        let stats = spool.stats();
        assert_eq!(stats.quarantined, 8);
        assert_eq!(stats.dropped(DropReason::QuarantineCap), 3);
        assert!(stats.balances());
        // Paging and filtering.
        let page = spool
            .quarantine_list(&ListFilter {
                reason: Some("bad_request".into()),
                offset: 1,
                limit: 2,
            })
            .unwrap();
        assert_eq!(
            page.iter().map(|q| q.event_id.clone()).collect::<Vec<_>>(),
            ids[4..6].to_vec()
        );
        // Retention: a minute later, one more quarantined event expires the old ones.
        clock.advance(Duration::from_millis(61_000));
        spool.set_online(false);
        spool.track("poison", json!({"late": true})).unwrap();
        spool.set_online(true);
        assert!(spool.wait_drained(WAIT));
        let stats = spool.stats();
        assert_eq!(stats.dropped(DropReason::QuarantineExpired), 5);
        assert_eq!(
            spool.quarantine_list(&ListFilter::default()).unwrap().len(),
            1
        );
        assert_eq!(spool.quarantine_purge(&Selector::All).unwrap(), 1);
    }
}

#[test]
fn quarantining_never_blocks_the_events_behind() {
    let collector = collector();
    collector.push_script([Scripted::status(422)]);
    let mut cfg = config(&collector);
    cfg.max_batch_events = 1;
    let spool = EventSpool::builder(cfg).start_offline().open().unwrap();
    let first = spool.track("first", json!({})).unwrap().to_string();
    for i in 0..20 {
        spool.track("next", json!({"i": i})).unwrap();
    }
    spool.set_online(true);
    assert!(spool.wait_drained(WAIT));
    assert_eq!(collector.distinct_count(), 20);
    assert!(spool.quarantine_get(&first).unwrap().is_some());
    assert_eq!(
        spool
            .quarantine_redrive(&Selector::Reason("bad_request".into()))
            .unwrap(),
        1
    );
    assert!(spool.wait_drained(WAIT));
    assert!(collector.contains(&first));
}

/// The largest legal answer to a 1,000-event batch: every event listed in `rejected` with a
/// reason of the longest length the SDK keeps (1 KiB), about 1.1 MB of JSON. Every listed event
/// must end in the quarantine; none may be counted delivered.
#[test]
fn a_huge_rejected_list_quarantines_every_listed_event() {
    let collector = collector();
    let reason = "r".repeat(eventspool::classify::MAX_KEPT_BODY_BYTES);
    collector.push_script([Scripted::RejectAll {
        reason: reason.clone(),
    }]);
    let mut cfg = config(&collector);
    cfg.max_batch_events = 1_000;
    let spool = EventSpool::builder(cfg).start_offline().open().unwrap();
    let mut ids = Vec::new();
    for i in 0..1_000 {
        ids.push(spool.track("refused", json!({"i": i})).unwrap().to_string());
    }
    spool.set_online(true);
    assert!(spool.wait_drained(WAIT), "{}", spool.state());
    let stats = spool.stats();
    assert_eq!(
        (
            stats.delivered,
            stats.quarantined,
            collector.request_count()
        ),
        (0, 1_000, 1),
        "one request, every listed event quarantined, none delivered: {stats:?}"
    );
    assert_eq!(collector.distinct_count(), 0);
    let listed = spool.quarantine_list(&ListFilter::default()).unwrap();
    assert_eq!(
        listed
            .iter()
            .map(|q| q.event_id.clone())
            .collect::<Vec<_>>(),
        ids
    );
    assert!(
        listed
            .iter()
            .all(|q| q.reason == "rejected" && q.detail == reason)
    );
    assert!(stats.balances(), "{stats:?}");
}

/// A 2xx cut short is never read as "all delivered": nothing is known of which events it took,
/// so the batch goes again in halves, same ids (a smaller batch gets a smaller answer), and a
/// single event whose answer is cut waits through a retry like any transient failure.
#[test]
fn a_cut_short_2xx_is_never_taken_as_delivered() {
    let collector = collector();
    let (_clock, dyn_clock) = manual_clock();
    let mut cfg = config(&collector);
    cfg.max_batch_events = 10;
    let spool = EventSpool::builder(cfg)
        .clock(dyn_clock)
        .start_offline()
        .open()
        .unwrap();
    let mut ids = Vec::new();
    for i in 0..10 {
        ids.push(spool.track("e", json!({"i": i})).unwrap().to_string());
    }
    // A rejection of the first event whose reason is far past any bound: once cut, the body
    // no longer parses, and it used to be read as "all delivered".
    let cut = |id: &str| Scripted::Status {
        status: 200,
        body: format!(
            r#"{{"accepted":9,"rejected":[{{"event_id":"{id}","reason":"{}"}}]}}"#,
            "x".repeat(4 << 20)
        ),
        headers: Vec::new(),
    };
    collector.push_script([cut(&ids[0])]);
    spool.set_online(true);
    assert!(spool.wait_drained(WAIT), "{}", spool.state());
    let requests = collector.requests();
    let sent: Vec<Vec<String>> = requests.iter().map(|r| r.event_ids.clone()).collect();
    assert_eq!(
        sent,
        [ids.clone(), ids[..5].to_vec(), ids[5..].to_vec()],
        "the cut answer counted nothing: the batch went again in halves, same ids"
    );
    let stats = spool.stats();
    assert_eq!((stats.delivered, stats.quarantined), (10, 0), "{stats:?}");
    assert_eq!(collector.distinct_count(), 10);

    // One event alone, its answer cut again: a retry, nothing counted until an answer is read.
    let one = spool.track("e", json!({"i": 10})).unwrap().to_string();
    collector.push_script([cut(&one)]);
    spool.flush();
    let status = wait_state(&spool, "a retry after the cut answer", |s| {
        matches!(s, DeliveryState::RetryScheduled { attempt: 1, .. })
    });
    assert_eq!(status.pending, 1);
    assert_eq!(spool.stats().delivered, 10);
    let DeliveryState::RetryScheduled { last_error, .. } = status.state else {
        unreachable!()
    };
    assert_eq!(last_error.status, Some(200), "{last_error}");
    spool.retry_now();
    assert!(spool.wait_drained(WAIT), "{}", spool.state());
    assert_eq!(spool.stats().delivered, 11);
    let last: Vec<Vec<String>> = collector.requests()[3..]
        .iter()
        .map(|r| r.event_ids.clone())
        .collect();
    assert_eq!(last, [vec![one.clone()], vec![one]], "resent with its id");
}

/// Database plus WAL of a store, as the file system reports them (the `max_disk_bytes` measure).
fn store_files_bytes(db: &std::path::Path) -> u64 {
    let size = |p: std::path::PathBuf| std::fs::metadata(p).map(|m| m.len()).unwrap_or(0);
    size(db.to_path_buf()) + size(std::path::PathBuf::from(format!("{}-wal", db.display())))
}

/// Dead letters live inside `max_disk_bytes`, in a budget of their own: a collector that refuses
/// everything never makes the file set outgrow the cap, the oldest dead letters go first (counted
/// `quarantine_cap`), and live events that fit the live share are never evicted for them.
#[test]
fn dead_letters_have_their_own_budget_inside_the_disk_cap() {
    const CAP: u64 = 256 * 1024;
    let collector = collector();
    collector.set_behavior(Behavior {
        partial_reject_name: Some("refused".into()),
        ..Default::default()
    });
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("q.db");
    let mut cfg = config(&collector);
    cfg.db_path = Some(db.clone());
    cfg.max_disk_bytes = CAP;
    cfg.memory_capacity = 100;
    cfg.max_batch_events = 50;
    cfg.compression = eventspool::Compression::None;
    let spool = EventSpool::open(cfg).unwrap();
    let pad = "p".repeat(300);
    let peak = std::cell::Cell::new(0);
    let sample = |what: &str| {
        let bytes = store_files_bytes(&db);
        peak.set(peak.get().max(bytes));
        assert!(
            bytes <= CAP,
            "{what}: store files {bytes} bytes over the cap {CAP}"
        );
    };
    // Phase 1: 1,200 events (~500 KB of wire JSON), every one refused; they go out from memory,
    // so only the quarantine writes to the store.
    for step in 0..24 {
        for i in 0..50 {
            spool
                .track("refused", json!({"step": step, "i": i, "pad": pad}))
                .unwrap();
        }
        assert!(spool.wait_drained(WAIT), "{}", spool.state());
        sample(&format!("step {step} drained"));
    }
    let stats = spool.stats();
    assert_eq!(
        (stats.delivered, stats.quarantined),
        (0, 1_200),
        "{stats:?}"
    );
    let kept = stats.quarantine.get("rejected").copied().unwrap_or(0);
    assert!(kept > 0, "the newest dead letters are kept: {stats:?}");
    assert_eq!(
        stats.dropped(DropReason::QuarantineCap),
        1_200 - kept,
        "every dead letter is kept or counted quarantine_cap: {stats:?}"
    );
    let listed = spool.quarantine_list(&ListFilter::default()).unwrap();
    let newest_step = |q: &eventspool::QuarantinedEvent| {
        let v: serde_json::Value = serde_json::from_str(&q.body).unwrap();
        v["properties"]["step"].as_u64().unwrap()
    };
    assert_eq!(listed.len() as u64, kept);
    assert_eq!(newest_step(listed.last().unwrap()), 23, "oldest out first");
    assert!(newest_step(&listed[0]) > 0, "the oldest went first");
    assert!(stats.balances(), "{stats:?}");
    eprintln!(
        "phase 1: {kept} dead letters kept, peak {} bytes of {CAP}",
        peak.get()
    );

    // Phase 2: offline, 150 live events (well inside the live share): none is evicted, and the
    // dead letters inside their budget stay too.
    spool.set_online(false);
    for i in 0..150 {
        spool.track("live", json!({"i": i, "pad": pad})).unwrap();
        if i % 25 == 24 {
            spool.persist().unwrap();
            sample(&format!("live {i}"));
        }
    }
    let stats = spool.stats();
    assert_eq!(
        stats.dropped(DropReason::DiskCap),
        0,
        "no live event evicted while dead letters hold space: {stats:?}"
    );
    assert_eq!(
        (stats.pending, stats.quarantine.get("rejected").copied()),
        (150, Some(kept))
    );

    // Phase 3: live events far past the cap: the oldest live go (disk_cap), the dead letters keep
    // their budget, and the files stay under the cap.
    for i in 0..3_000 {
        spool.track("live", json!({"more": i, "pad": pad})).unwrap();
        if i % 100 == 99 {
            spool.persist().unwrap();
            sample(&format!("more {i}"));
        }
    }
    let stats = spool.stats();
    assert!(stats.dropped(DropReason::DiskCap) > 0, "{stats:?}");
    assert_eq!(
        stats.quarantine.get("rejected").copied(),
        Some(kept),
        "{stats:?}"
    );
    assert_eq!(
        stats.tracked,
        stats.delivered + stats.quarantined + stats.dropped_from_queue() + stats.pending
    );
    assert!(stats.balances(), "{stats:?}");
    eprintln!("peak {} bytes of {CAP}; {stats:?}", peak.get());
}
