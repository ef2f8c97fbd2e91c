//! Delivery over a slow uplink: 400 events of 1 KB (incompressible properties, sent without
//! gzip) through the throttling proxy of `eventspool_testkit::throttle` in front of the reference
//! collector, at 20, 8 and 2 KB/s with 300 ms latency and the default config.
//!
//! Scaled so the run stays short: each link runs [`SCALE`] times faster with the latency and
//! the config's paces (`attempt_timeout_ms`, `min_batch_interval_ms`, the backoff) [`SCALE`]
//! times shorter, which keeps every ratio of the real link (a batch's upload time to the
//! timeout, the latency to either); times are reported scaled back to the real link. The baseline is the time the link needs to carry every event once.

use std::time::{Duration, Instant};

use eventspool::{Compression, Config, EventSpool};
use eventspool_collector::{CollectorConfig, ReferenceCollector};
use serde_json::json;

use crate::Row;
use crate::throttle::{Link, Throttle};

const SCALE: u64 = 10;
const EVENTS: usize = 400;
const LATENCY_MS: u64 = 300;

pub fn run() -> Result<Vec<Row>, Box<dyn std::error::Error>> {
    let mut rows = Vec::new();
    for kbps in [20, 8, 2] {
        rows.extend(one_link(kbps)?);
    }
    Ok(rows)
}

fn one_link(kbps: u64) -> Result<Vec<Row>, Box<dyn std::error::Error>> {
    let bytes_per_sec = kbps * 1024 * SCALE;
    let collector = ReferenceCollector::start(CollectorConfig::default())?;
    let throttle = Throttle::start(
        collector.addr(),
        Link {
            bytes_per_sec,
            latency: Duration::from_millis(LATENCY_MS / SCALE),
        },
    )?;
    let mut c = Config::new(format!("http://{}/v1/batch", throttle.addr()));
    c.compression = Compression::None;
    // Every duration of the defaults that paces delivery, scaled with the link.
    let defaults = c.clone();
    c.attempt_timeout_ms = defaults.attempt_timeout_ms / SCALE;
    c.min_batch_interval_ms = defaults.min_batch_interval_ms / SCALE;
    c.backoff_base_ms = defaults.backoff_base_ms / SCALE;
    c.backoff_cap_ms = defaults.backoff_cap_ms / SCALE;
    let spool = EventSpool::builder(c).start_offline().open()?;
    for i in 0..EVENTS {
        let blob: String = (0..1024).map(|_| fastrand::alphanumeric()).collect();
        spool.track("slow", json!({"i": i, "blob": blob}))?;
    }
    // Bounded: three times the transfer of 1.2 KB per event, real link time scaled.
    let nominal = Duration::from_secs_f64(EVENTS as f64 * 1200.0 / bytes_per_sec as f64);
    let started = Instant::now();
    spool.set_online(true);
    spool.flush();
    let all = collector.wait_for_distinct(EVENTS as u64, nominal * 3 + Duration::from_secs(5));
    let took = started.elapsed().as_secs_f64() * SCALE as f64;
    let stats = spool.stats();
    spool.shutdown(Duration::from_secs(5))?;
    drop(throttle);
    let distinct = collector.distinct_count();
    let received = collector.received_count();
    let accepted_bytes: usize = collector
        .requests()
        .iter()
        .filter(|r| r.status.is_some_and(|s| (200..300).contains(&s)))
        .map(|r| r.body_bytes)
        .sum();
    collector.shutdown();
    let transfer =
        accepted_bytes as f64 / received.max(1) as f64 * EVENTS as f64 / (kbps * 1024) as f64;
    let copies = received as f64 / distinct.max(1) as f64;
    let detail = json!({
        "delivered": distinct, "received": received, "requests": stats.requests,
        "all_delivered": all, "scale": SCALE, "slow_link_batch_bytes": stats.slow_link_batch_bytes,
    });
    let time = if all { took } else { f64::INFINITY };
    Ok(vec![
        Row::cost(
            format!("400 x 1 KB over {kbps} KB/s, 300 ms: time"),
            time,
            transfer,
            "s",
            Some(2.0),
        )
        .with(detail.clone()),
        Row::limit(
            format!("400 x 1 KB over {kbps} KB/s, 300 ms: copies/event"),
            copies,
            "copies",
            Some(1.25),
        )
        .with(detail),
    ])
}
