//! The whole story in one run: a reference collector on loopback, an app that tracks events
//! while offline (memory overflows to the SQLite store), comes back online and drains.
//!
//! `cargo run --release --example quickstart`

use std::time::{Duration, Instant};

use eventspool::{Config, EventSpool};
use eventspool_collector::{CollectorConfig, ReferenceCollector};
use serde_json::json;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let collector = ReferenceCollector::start(CollectorConfig::default())?;
    let dir = tempfile::tempdir()?;
    let mut config = Config::new(collector.url());
    config.db_path = Some(dir.path().join("events.db"));
    config.memory_capacity = 200;
    config.min_batch_interval_ms = 0;

    let spool = EventSpool::builder(config).start_offline().open()?;
    let tracked = 5_000u64;
    let started = Instant::now();
    for i in 0..tracked {
        spool.track(
            "screen_view",
            json!({"screen": format!("screen-{}", i % 12), "i": i}),
        )?;
    }
    let stats = spool.stats();
    eprintln!(
        "tracked {tracked} events offline in {:?}: {} in memory, {} spilled to disk",
        started.elapsed(),
        stats.pending_memory,
        stats.pending_disk
    );

    eprintln!("back online: draining to {}", collector.url());
    let started = Instant::now();
    spool.set_online(true);
    let drained = spool.wait_drained(Duration::from_secs(120));
    let stats = spool.stats();
    eprintln!(
        "drained={drained} in {:?}: delivered {} in {} batches over {} requests",
        started.elapsed(),
        stats.delivered,
        stats.batches_delivered,
        stats.requests
    );
    spool.shutdown(Duration::from_secs(5))?;

    let distinct = collector.distinct_count();
    println!(
        "{}",
        json!({"tracked": tracked, "delivered": stats.delivered, "collector_distinct": distinct,
               "pending": stats.pending, "dropped": stats.dropped})
    );
    if stats.delivered != tracked || distinct != tracked {
        return Err(format!(
            "expected {tracked} delivered and distinct, got {} and {distinct}",
            stats.delivered
        )
        .into());
    }
    Ok(())
}
