//! Concurrency soak: 8 threads calling track() while the collector fails 30% of requests and
//! drops 10% of connections after storing; time is virtual so backoffs cost nothing.
//!
//! CI runs 8 × 25,000; the full run is `EVENTSPOOL_SOAK_EVENTS=100000 cargo test --test
//! reliability soak -- --nocapture`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use eventspool::{EventSpool, ManualClock};
use eventspool_collector::{Behavior, CollectorConfig, ReferenceCollector};
use serde_json::json;

use crate::common::{env_count, fast_config, seed};

#[test]
fn eight_threads_with_a_failing_collector_account_for_every_event() {
    let per_thread = env_count("EVENTSPOOL_SOAK_EVENTS", 25_000);
    let threads = 8u64;
    let seed = seed("soak");
    let collector = ReferenceCollector::start(CollectorConfig {
        behavior: Behavior {
            fail_rate: 0.3,
            drop_rate: 0.1,
            seed,
            ..Behavior::default()
        },
        max_request_records: 100,
        ..CollectorConfig::default()
    })
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut c = fast_config(&collector.url());
    c.db_path = Some(dir.path().join("events.db"));
    c.max_disk_bytes = 1 << 30;
    c.memory_capacity = 20_000;
    c.max_batch_events = 500;
    c.max_batch_bytes = 1 << 20;
    c.flush_at = 500;
    c.max_auto_attempts = 1_000_000;
    c.max_retry_elapsed_ms = u64::MAX / 4;
    c.backoff_base_ms = 1_000;
    c.backoff_cap_ms = 30_000;
    let clock = Arc::new(ManualClock::auto_advancing(1_780_000_000_000));
    let spool = EventSpool::builder(c)
        .clock(Arc::new(clock.clone()))
        .open()
        .unwrap();
    let started = Instant::now();
    std::thread::scope(|scope| {
        for t in 0..threads {
            let spool = spool.clone();
            scope.spawn(move || {
                for i in 0..per_thread {
                    spool.track("soak", json!({"t": t, "i": i})).expect("track");
                }
            });
        }
    });
    let tracked_in = started.elapsed();
    let drained = spool.wait_drained(Duration::from_secs(600));
    let stats = spool.stats();
    eprintln!(
        "soak: {} tracked in {:?}, drained in {:?}: delivered {}, quarantined {}, dropped {:?}, pending {}, requests {}, collector distinct {} received {}",
        stats.tracked,
        tracked_in,
        started.elapsed(),
        stats.delivered,
        stats.quarantined,
        stats.dropped,
        stats.pending,
        stats.requests,
        collector.distinct_count(),
        collector.received_count()
    );
    assert!(drained, "did not drain: {stats:?}");
    assert_eq!(stats.tracked, threads * per_thread);
    assert!(stats.balances(), "ledger does not balance: {stats:?}");
    assert_eq!(
        stats.delivered + stats.quarantined + stats.dropped_from_queue() + stats.pending,
        stats.tracked
    );
    assert_eq!(
        collector.distinct_count(),
        stats.delivered,
        "collector distinct != delivered"
    );
    // The only drops allowed are the documented burst limit of the spill queue (buffer.rs,
    // SPILL_BACKLOG_MIN): counted, never silent.
    let other_drops =
        stats.dropped_from_queue() - stats.dropped(eventspool::DropReason::MemoryOverflow);
    assert_eq!(other_drops, 0, "{stats:?}");
    assert_eq!(stats.panics, 0);
    spool.shutdown(Duration::from_secs(5)).unwrap();
}
