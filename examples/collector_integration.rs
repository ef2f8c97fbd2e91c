//! How a collector team uses eventspool to produce realistic traffic and check their dedup.
//!
//! Real clients do not send tidy streams. After a reconnect a device sends its whole offline
//! backlog as a burst; a dropped connection after the collector stored a batch makes the client
//! resend the same `event_id`s; importers and skewed clocks produce out-of-order timestamps; an
//! idempotent producer may track the same id twice. This example drives all of that at a
//! collector and checks that it stores each event exactly once.
//!
//! It runs against the reference collector in-process so it works anywhere. To aim it at your
//! own collector, replace `collector.url()` with your endpoint and read your store's distinct
//! count instead of `collector.distinct_count()` (or run `eventspool collector` and read
//! `GET /stats`).
//!
//! `cargo run --example collector_integration`

use std::collections::HashSet;
use std::time::Duration;

use eventspool::{Config, EventSpool, NewEvent};
use eventspool_collector::{CollectorConfig, ReferenceCollector, Scripted};
use serde_json::json;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let collector = ReferenceCollector::start(CollectorConfig::default())?;
    let dir = std::env::temp_dir().join(format!(
        "eventspool-collector-integration-{}",
        std::process::id()
    ));
    std::fs::create_dir_all(&dir)?;

    let mut config = Config::new(collector.url());
    config.db_path = Some(dir.join("device.db"));
    config.memory_capacity = 100;
    config.max_batch_events = 50;
    config.min_batch_interval_ms = 0;
    config.backoff_base_ms = 10;
    config.backoff_cap_ms = 50;
    let device = EventSpool::builder(config).start_offline().open()?;

    // 1. Offline: 1,000 events whose timestamps arrive out of order (a skewed clock, an import).
    let base = chrono::Utc::now() - chrono::Duration::hours(2);
    let mut ids = HashSet::new();
    for i in 0..1000i64 {
        let jitter = (i * 7919) % 1000; // a fixed permutation: timestamps far from track() order
        let event = NewEvent {
            timestamp: Some((base + chrono::Duration::seconds(jitter)).to_rfc3339()),
            session_id: Some(format!("s-{}", i % 4)),
            ..NewEvent::new("screen_view", json!({"i": i}))
        };
        ids.insert(device.track_event(event)?.to_string());
    }
    // 2. An idempotent producer tracks the same ids twice (e.g. its own retry after a crash).
    let again: Vec<String> = ids.iter().take(50).cloned().collect();
    for id in &again {
        device.track_event(NewEvent {
            event_id: Some(id.clone()),
            ..NewEvent::new("purchase_retry", json!({"resend": true}))
        })?;
    }
    // 3. The collector stores the first two batches but the connection drops before the answer:
    //    the client cannot know, so it resends them with the same ids.
    collector.push_script([Scripted::StoreThenDrop, Scripted::StoreThenDrop]);

    // 4. Reconnect: the whole backlog leaves as a burst.
    device.set_online(true);
    if !device.wait_drained(Duration::from_secs(60)) {
        return Err(format!("not drained: {}", device.state()).into());
    }
    let stats = device.stats();
    device.shutdown(Duration::from_secs(5))?;

    let requests = collector.requests();
    let resent_batches = requests
        .iter()
        .filter(|r| r.attempt.unwrap_or(1) > 1)
        .count();
    let report = json!({
        "tracked": stats.tracked,
        "distinct_ids": ids.len(),
        "delivered_by_client": stats.delivered,
        "collector_received": collector.received_count(),
        "collector_distinct": collector.distinct_count(),
        "requests": requests.len(),
        "resent_batches": resent_batches,
    });
    println!("{report}");
    let _ = std::fs::remove_dir_all(&dir);

    // The checks a collector team cares about: every distinct id stored once, duplicates seen.
    if collector.distinct_count() != ids.len() as u64 {
        return Err(format!(
            "dedup broken: {} distinct stored, {} distinct tracked",
            collector.distinct_count(),
            ids.len()
        )
        .into());
    }
    if collector.received_count() <= collector.distinct_count() {
        return Err("expected the collector to see duplicates (resends and repeated ids)".into());
    }
    eprintln!(
        "ok: {} distinct events stored once despite {} received",
        ids.len(),
        collector.received_count()
    );
    Ok(())
}
