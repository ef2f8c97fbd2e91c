//! Calls that meet each other — observers calling back into the spool, `persist()`
//! during a send, `track()` racing `shutdown()`, and one `track_batch` call larger than memory
//! (a foreign transport that ignores its timeout: bindings/ffi/tests/foreign_transport.rs).

use std::time::{Duration, Instant};

use eventspool::{DropReason, Error, EventSpool, NewEvent};
use eventspool_collector::Scripted;
use serde_json::json;

use crate::common::*;
use crate::reentrant::Reentrant;

/// Waits (real time, bounded) for a condition on something another thread changes.
fn wait_until(what: &str, timeout: Duration, cond: impl Fn() -> bool) {
    let deadline = Instant::now() + timeout;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Every verb, `shutdown` included, can be called from `on_state` (the worker's thread) without
/// a deadlock, with a store and memory-only alike.
#[test]
fn an_observer_may_call_every_verb_from_on_state() {
    for with_store in [false, true] {
        let collector = collector();
        let dir = tempfile::tempdir().unwrap();
        let mut c = config(&collector);
        if with_store {
            c.db_path = Some(dir.path().join("events.db"));
        }
        let spool = EventSpool::builder(c).start_offline().open().unwrap();
        let (observer, rx) = Reentrant::new(false);
        observer.spool.set(spool.clone()).ok().unwrap();
        let _observer = spool.add_observer(observer.clone());
        spool.track("before", json!({})).unwrap();
        spool.set_online(true);
        let what = observer.assert_returned(&rx, Duration::from_secs(30));
        assert!(
            matches!(spool.track("after", json!({})), Err(Error::ShutDown)),
            "shutdown() from {what} did not take effect"
        );
    }
}

/// A batch is in flight when the app calls `persist()` (going to the background) and then
/// `purge_pending()`: the in-flight events are not copied to where the purge (or eviction) can
/// delete them, the 2xx counts each once, and `pending` equals what memory and store hold.
#[test]
fn persist_while_a_batch_is_in_flight_keeps_each_event_in_one_place() {
    let collector = collector();
    collector.push_script([Scripted::Delay(Duration::from_millis(1500))]);
    let dir = tempfile::tempdir().unwrap();
    let mut c = config(&collector);
    c.db_path = Some(dir.path().join("events.db"));
    c.flush_at = 5;
    let spool = EventSpool::builder(c)
        .clock(instant_clock())
        .start_offline()
        .open()
        .unwrap();
    for i in 0..5 {
        spool.track("in_flight", json!({"i": i})).unwrap();
    }
    // All five leave in one batch.
    spool.set_online(true);
    // The collector took the request (the script item is claimed on arrival) and holds it.
    wait_until("the batch to reach the collector", WAIT, || {
        collector.pending_script() == 0
    });
    spool.persist().unwrap();
    let stats = spool.stats();
    assert_eq!(
        stats.pending_memory + stats.pending_disk,
        stats.pending,
        "an in-flight event is counted in two places after persist(): {stats:?}"
    );
    assert_eq!(
        spool.purge_pending().unwrap(),
        0,
        "purge_pending() deleted events of the batch in flight"
    );
    assert!(spool.wait_drained(WAIT), "{}", spool.state());
    assert_eq!(collector.request_count(), 1, "one batch of five");
    let stats = spool.stats();
    assert_eq!(stats.delivered, 5, "{stats:?}");
    assert_eq!(stats.dropped(DropReason::Purged), 0, "{stats:?}");
    assert_eq!(
        (stats.pending, stats.pending_memory, stats.pending_disk),
        (0, 0, 0),
        "{stats:?}"
    );
    assert!(stats.balances(), "{stats:?}");
    assert_eq!(collector.distinct_count(), 5);
    // The store really is empty: a reopen restores nothing.
    spool.shutdown(WAIT).unwrap();
    drop(spool);
    let mut c = config(&collector);
    c.db_path = Some(dir.path().join("events.db"));
    let again = EventSpool::builder(c).start_offline().open().unwrap();
    assert_eq!(again.stats().restored, 0);
}

/// Threads track in a tight loop while another calls `shutdown()`: every `track()` that
/// returned `Ok` is in the store afterwards (none of them is lost at exit).
#[test]
fn track_racing_shutdown_either_fails_or_is_persisted() {
    let collector = collector();
    let rounds = 30;
    let mut lost_rounds = Vec::new();
    for round in 0..rounds {
        let dir = tempfile::tempdir().unwrap();
        let mut c = config(&collector);
        c.db_path = Some(dir.path().join("events.db"));
        c.memory_capacity = 100_000;
        c.max_disk_bytes = 256 * 1024 * 1024;
        let spool = EventSpool::builder(c.clone())
            .start_offline()
            .open()
            .unwrap();
        // Big enough that preparing one takes a while, so a thread is often mid-track() when
        // shutdown() begins.
        let pad = "p".repeat(16 * 1024);
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let spool = spool.clone();
                let pad = pad.clone();
                std::thread::spawn(move || {
                    let mut ok = 0u64;
                    for i in 0..2_000 {
                        match spool.track("race", json!({"i": i, "pad": pad})) {
                            Ok(_) => ok += 1,
                            Err(Error::ShutDown) => break,
                            Err(e) => panic!("track() failed otherwise: {e}"),
                        }
                    }
                    ok
                })
            })
            .collect();
        wait_until("some events tracked", WAIT, || spool.stats().tracked >= 40);
        spool.shutdown(WAIT).unwrap();
        let ok: u64 = threads.into_iter().map(|t| t.join().unwrap()).sum();
        let stats = spool.stats();
        assert_eq!(stats.dropped_from_queue(), 0, "{stats:?}");
        drop(spool);
        let again = EventSpool::builder(c).start_offline().open().unwrap();
        let restored = again.stats().restored;
        if restored != ok {
            lost_rounds.push((round, ok, restored));
        }
    }
    assert!(
        lost_rounds.is_empty(),
        "track() returned Ok for events that were not persisted at shutdown \
         (round, Ok returns, restored): {lost_rounds:?}"
    );
}

/// One `track_batch` call far larger than memory records every event (spilling as needed) with
/// nothing dropped, with a store big enough for it.
#[test]
fn a_large_track_batch_records_every_event_with_a_store() {
    let collector = collector();
    let dir = tempfile::tempdir().unwrap();
    let mut c = config(&collector);
    c.db_path = Some(dir.path().join("events.db"));
    c.max_disk_bytes = 512 * 1024 * 1024;
    let spool = EventSpool::builder(c).start_offline().open().unwrap();
    for round in 0..3 {
        let batch: Vec<NewEvent> = (0..15_000)
            .map(|i| NewEvent::new("bulk", json!({"round": round, "i": i})))
            .collect();
        let ids = spool.track_batch(&batch).unwrap();
        assert_eq!(ids.len(), 15_000);
        let stats = spool.stats();
        assert_eq!(
            stats.dropped(DropReason::MemoryOverflow),
            0,
            "round {round}: track_batch returned Ok while dropping part of its batch: {stats:?}"
        );
        assert_eq!(stats.pending, 15_000 * (round + 1), "{stats:?}");
        assert!(stats.balances(), "{stats:?}");
    }
    spool.persist().unwrap();
    assert_eq!(spool.stats().pending_disk, 45_000);
}

/// Without a store a batch larger than memory cannot be kept whole: the call is refused, saying
/// why, and nothing of it is recorded.
#[test]
fn a_track_batch_larger_than_memory_without_a_store_is_refused_whole() {
    let collector = collector();
    let mut c = config(&collector);
    c.memory_capacity = 100;
    let spool = EventSpool::builder(c).start_offline().open().unwrap();
    let batch: Vec<NewEvent> = (0..150)
        .map(|i| NewEvent::new("bulk", json!({"i": i})))
        .collect();
    let err = spool
        .track_batch(&batch)
        .expect_err("a batch of 150 into 100 events of memory returned Ok");
    let text = err.to_string();
    assert!(
        text.contains("150") && text.contains("memory_capacity"),
        "error does not say why: {text}"
    );
    let stats = spool.stats();
    assert_eq!((stats.tracked, stats.pending), (0, 0), "{stats:?}");
    assert_eq!(stats.dropped(DropReason::MemoryOverflow), 0, "{stats:?}");
    // A batch that fits is recorded whole.
    assert_eq!(spool.track_batch(&batch[..100]).unwrap().len(), 100);
    assert_eq!(spool.stats().pending, 100);
}

/// `shutdown(timeout)` lets the attempt in flight finish within the timeout: its answer is
/// recorded, so a batch the collector accepted is not left queued and resent after the restart.
#[test]
fn shutdown_waits_for_the_answer_to_the_batch_in_flight() {
    let collector = collector();
    collector.push_script([Scripted::Delay(Duration::from_millis(300))]);
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(&collector);
    cfg.db_path = Some(dir.path().join("inflight.db"));
    let spool = EventSpool::open(cfg.clone()).unwrap();
    let id = spool.track("in_flight", json!({})).unwrap().to_string();
    spool.flush();
    wait_until("the request to go out", WAIT, || {
        spool.stats().requests == 1
    });
    spool.shutdown(Duration::from_secs(10)).unwrap();
    let stats = spool.stats();
    assert_eq!(
        (stats.delivered, stats.pending),
        (1, 0),
        "the answer that came within the timeout counts: {stats:?}"
    );
    drop(spool);
    let reopened = EventSpool::open(cfg).unwrap();
    assert_eq!(reopened.stats().restored, 0, "nothing left to resend");
    assert!(collector.contains(&id));
    assert_eq!(collector.request_count(), 1);
}
