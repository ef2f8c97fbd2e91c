//! `track()` on the in-memory path against the least any SDK must do per event: read the clock,
//! make a UUID v7, serialize the event with serde_json, push it on a `Mutex<VecDeque>`.

use std::collections::VecDeque;
use std::sync::{Arc, Barrier, Mutex};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use eventspool::{Config, EventSpool};
use serde::Serialize;
use serde_json::{Value, json};

use crate::{EVENT_NAME, Row, percentile, properties};

const CALLS: usize = 200_000;
const WARMUP: usize = 20_000;
const THREADS: usize = 4;

#[derive(Serialize)]
struct RawEvent<'a> {
    event_id: &'a str,
    name: &'a str,
    timestamp_ms: u128,
    properties: &'a Value,
}

/// The baseline: what a minimal hand-written queue pays for the same event.
pub fn raw_track(queue: &Mutex<VecDeque<String>>, properties: Value) {
    let id = uuid::Uuid::now_v7();
    let mut buf = uuid::Uuid::encode_buffer();
    let ts = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or(0);
    let event = RawEvent {
        event_id: id.hyphenated().encode_lower(&mut buf),
        name: EVENT_NAME,
        timestamp_ms: ts,
        properties: &properties,
    };
    let json = serde_json::to_string(&event).unwrap_or_default();
    queue
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .push_back(json);
}

/// The raw baseline's per-call nanoseconds, sorted: `calls` calls on one thread.
pub fn raw_latencies(calls: usize) -> Vec<u64> {
    let queue = Arc::new(Mutex::new(VecDeque::with_capacity(calls + WARMUP)));
    let q = queue.clone();
    measure(1, calls, Arc::new(move |v| raw_track(&q, v)))
}

fn spool() -> Result<EventSpool, eventspool::Error> {
    let mut cfg = Config::new("http://127.0.0.1:9/unused");
    cfg.memory_capacity = 2_000_000;
    EventSpool::builder(cfg).start_offline().open()
}

/// Per-call nanoseconds of `f` over `calls` calls on each of `threads` threads (the property
/// value is cloned outside the timed region: building the app's JSON is the app's cost).
fn measure(threads: usize, calls: usize, f: Arc<dyn Fn(Value) + Send + Sync>) -> Vec<u64> {
    let barrier = Arc::new(Barrier::new(threads));
    let handles: Vec<_> = (0..threads)
        .map(|_| {
            let f = f.clone();
            let barrier = barrier.clone();
            std::thread::spawn(move || {
                let template = properties();
                for _ in 0..WARMUP / threads {
                    f(template.clone());
                }
                barrier.wait();
                let mut times = Vec::with_capacity(calls);
                for _ in 0..calls {
                    let value = template.clone();
                    let t = Instant::now();
                    f(value);
                    times.push(t.elapsed().as_nanos() as u64);
                }
                times
            })
        })
        .collect();
    let mut all: Vec<u64> = handles
        .into_iter()
        .flat_map(|h| h.join().unwrap_or_default())
        .collect();
    all.sort_unstable();
    all
}

pub fn run() -> Result<Vec<Row>, Box<dyn std::error::Error>> {
    let mut rows = Vec::new();
    for threads in [1, THREADS] {
        let calls = CALLS / threads;
        let queue = Arc::new(Mutex::new(VecDeque::with_capacity(CALLS + WARMUP)));
        let q = queue.clone();
        let base = measure(threads, calls, Arc::new(move |v| raw_track(&q, v)));
        drop(queue);
        let s = spool()?;
        let s2 = s.clone();
        let ours = measure(
            threads,
            calls,
            Arc::new(move |v| {
                let _ = s2.track(EVENT_NAME, v);
            }),
        );
        let stats = s.stats();
        s.shutdown(std::time::Duration::from_secs(5))?;
        let label = if threads == 1 {
            "1 thread".to_string()
        } else {
            format!("{threads} threads")
        };
        let detail =
            json!({"calls": ours.len(), "tracked": stats.tracked, "dropped": stats.dropped});
        rows.push(
            Row::cost(
                format!("track() median, {label}"),
                percentile(&ours, 0.5) as f64,
                percentile(&base, 0.5) as f64,
                "ns",
                Some(3.0),
            )
            .with(detail.clone()),
        );
        rows.push(
            Row::cost(
                format!("track() p99, {label}"),
                percentile(&ours, 0.99) as f64,
                percentile(&base, 0.99) as f64,
                "ns",
                None,
            )
            .with(detail),
        );
    }
    Ok(rows)
}
