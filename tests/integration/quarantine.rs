//! Issue 3: refused events go to quarantine without blocking the queue, and come back on redrive.

use std::time::Duration;

use eventspool::collector::{Behavior, Scripted};
use eventspool::{DropReason, EventSpool, ListFilter, Selector};
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
        let mut ids = Vec::new();
        for i in 0..8 {
            ids.push(spool.track("poison", json!({"i": i})).unwrap().to_string());
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
