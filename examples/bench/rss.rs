//! Peak memory while 1,000,000 events pass through a spool with `memory_capacity = 10,000` and a
//! 100 MB disk cap, delivered as they come to the reference collector. The spool runs in a child
//! process (this binary, `--rss-child URL`) so `VmHWM` is that scenario's alone; the collector
//! stays in the parent so its memory is not counted.

use std::time::{Duration, Instant};

use eventspool::{Config, EventSpool};
use serde_json::{Value, json};

use crate::{EVENT_NAME, Row, properties};

const EVENTS: u64 = 1_000_000;
const CAP: u64 = 100 * 1000 * 1000;
/// Tracking paces: one the collector absorbs (events pass through), and one five times higher,
/// so the store fills to its cap and the oldest are evicted while delivery goes on.
const PACES: [(u64, &str); 2] = [(20_000, "steady"), (100_000, "overload")];

fn status_kb(field: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

pub fn child(url: &str, events_per_s: u64) -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let db = dir.path().join("events.db");
    let mut cfg = Config::new(url);
    cfg.db_path = Some(db.clone());
    cfg.memory_capacity = 10_000;
    cfg.max_disk_bytes = CAP;
    cfg.min_batch_interval_ms = 0;
    let spool = EventSpool::open(cfg)?;
    let template = properties();
    let mut samples = Vec::new();
    let sample = |tracked: u64, spool: &EventSpool| -> Value {
        let stats = spool.stats();
        json!({
            "tracked": tracked, "vm_rss_kb": status_kb("VmRSS:"), "vm_hwm_kb": status_kb("VmHWM:"),
            "store_bytes": eventspool::disk_usage(&db), "cap_bytes": CAP, "delivered": stats.delivered,
            "pending_memory": stats.pending_memory, "pending_disk": stats.pending_disk, "dropped": stats.dropped,
        })
    };
    let t = Instant::now();
    for i in 1..=EVENTS {
        spool.track(EVENT_NAME, template.clone())?;
        if i % 1_000 == 0 {
            let due = Duration::from_secs_f64(i as f64 / events_per_s as f64);
            if let Some(wait) = due.checked_sub(t.elapsed()) {
                std::thread::sleep(wait);
            }
        }
        if i % 100_000 == 0 {
            samples.push(sample(i, &spool));
        }
    }
    let drained = spool.wait_drained(Duration::from_secs(300));
    samples.push(sample(EVENTS, &spool));
    let stats = spool.stats();
    spool.shutdown(Duration::from_secs(10))?;
    println!(
        "{}",
        json!({
            "events_per_s": events_per_s, "samples": samples, "drained": drained, "seconds": t.elapsed().as_secs_f64(),
            "delivered": stats.delivered, "dropped": stats.dropped, "balances": stats.balances(),
        })
    );
    Ok(())
}

pub fn run() -> Result<Vec<Row>, Box<dyn std::error::Error>> {
    let mut rows = Vec::new();
    for (pace, label) in PACES {
        rows.extend(scenario(pace, label)?);
    }
    Ok(rows)
}

fn scenario(pace: u64, label: &str) -> Result<Vec<Row>, Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let collector =
        eventspool_collector::ReferenceCollector::start(eventspool_collector::CollectorConfig {
            db_path: Some(dir.path().join("collector.db")),
            max_request_records: 16,
            ..Default::default()
        })?;
    let output = std::process::Command::new(std::env::current_exe()?)
        .args(["--rss-child", &collector.url(), &pace.to_string()])
        .output()?;
    if !output.status.success() {
        return Err(format!(
            "rss child failed: {}",
            String::from_utf8_lossy(&output.stderr)
        )
        .into());
    }
    let report: Value = serde_json::from_slice(&output.stdout)?;
    let samples = report["samples"].as_array().cloned().unwrap_or_default();
    let at = |tracked: u64, field: &str| {
        samples
            .iter()
            .find(|s| s["tracked"] == tracked)
            .and_then(|s| s[field].as_u64())
            .unwrap_or(0) as f64
            / 1024.0
    };
    let peak_mb = samples
        .iter()
        .filter_map(|s| s["vm_hwm_kb"].as_u64())
        .max()
        .unwrap_or(0) as f64
        / 1024.0;
    let max_store = samples
        .iter()
        .filter_map(|s| s["store_bytes"].as_u64())
        .max()
        .unwrap_or(0) as f64
        / 1e6;
    let growth = at(EVENTS, "vm_rss_kb") - at(100_000, "vm_rss_kb");
    let name = format!("{label}, 1M events at {}k/s", pace / 1000);
    Ok(vec![
        Row::limit(format!("peak RSS (VmHWM), {name}"), peak_mb, "MiB", Some(64.0)).with(report.clone()),
        Row::limit(format!("RSS growth 100k -> 1M, {name}"), growth, "MiB", None)
            .with(json!({"rss_100k_mib": at(100_000, "vm_rss_kb"), "rss_1m_mib": at(EVENTS, "vm_rss_kb")})),
        Row::limit(format!("largest store at any sample, {name}"), max_store, "MB", Some(CAP as f64 / 1e6)),
    ])
}
