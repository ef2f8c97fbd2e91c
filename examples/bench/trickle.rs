//! An offline app tracking a trickle of events with memory full: every event goes past
//! `memory_capacity` into the spill backlog, and what matters is what reaching the disk costs.
//! One commit per event writes a WAL frame of a whole page (or several) for about 250 bytes of
//! event. The figure is bytes written to disk (`write_bytes` of `/proc/self/io`, the bytes this
//! process caused to be sent to storage) per byte of event, the events' own JSON being the
//! baseline; `wchar` (bytes handed to `write()`) and write system calls beside it.

use std::time::{Duration, Instant};

use eventspool::{Config, EventSpool};
use serde_json::json;

use crate::{EVENT_NAME, Row, properties, wire_size};

const CAPACITY: u64 = 100;
/// The trickle's rate (the figure: tens of events a second).
const PER_SECOND: u64 = 20;

/// One field of `/proc/self/io` (0 where there is none).
fn io_field(name: &str) -> u64 {
    std::fs::read_to_string("/proc/self/io")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

pub fn run(quick: bool) -> Result<Vec<Row>, Box<dyn std::error::Error>> {
    let seconds: u64 = if quick { 10 } else { 30 };
    let dir = tempfile::tempdir()?;
    let mut cfg = Config::new("http://127.0.0.1:9/unused");
    cfg.db_path = Some(dir.path().join("trickle.db"));
    cfg.memory_capacity = CAPACITY;
    let spool = EventSpool::builder(cfg).start_offline().open()?;
    for _ in 0..CAPACITY {
        spool.track(EVENT_NAME, properties())?;
    }
    let on_disk = || spool.stats().pending_disk;
    let settle = |want: u64| {
        let deadline = Instant::now() + Duration::from_secs(30);
        while on_disk() < want && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    settle(0);
    let before = (
        io_field("write_bytes"),
        io_field("wchar"),
        io_field("syscw"),
    );
    let events = seconds * PER_SECOND;
    let start = Instant::now();
    for i in 0..events {
        let due = start + Duration::from_millis(i * 1_000 / PER_SECOND);
        if let Some(wait) = due.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
        spool.track(EVENT_NAME, properties())?;
    }
    // Until the last of them is on disk (a lingering spill writes them within its bound).
    settle(events);
    let written = on_disk();
    let after = (
        io_field("write_bytes"),
        io_field("wchar"),
        io_field("syscw"),
    );
    spool.shutdown(Duration::from_secs(10))?;
    let event_bytes = (events * wire_size() as u64) as f64;
    let disk = (after.0 - before.0) as f64;
    Ok(vec![
        Row::limit(
            format!(
                "trickle {PER_SECOND}/s offline past memory_capacity: disk bytes per event byte"
            ),
            disk / event_bytes,
            "x",
            Some(3.0),
        )
        .with(json!({
            "events": events,
            "seconds": seconds,
            "on_disk_at_end": written,
            "event_bytes": event_bytes,
            "write_bytes": after.0 - before.0,
            "wchar_per_event_byte": (after.1 - before.1) as f64 / event_bytes,
            "write_syscalls_per_event": (after.2 - before.2) as f64 / events as f64,
            "loadavg": crate::loadavg(),
        })),
    ])
}
