//! A critical `track_event` (durable before it returns, `durability = spill`) behind a full
//! spill backlog while another thread tracks as fast as it can: the caller waits for its own
//! chunk (critical events are written first), not for the whole backlog. Beside it, in the same
//! run and under the same load: the same call into an idle spool, and a raw 1,000-row SQLite
//! transaction (the size of a spill chunk, which the caller may have to wait for), timed
//! between the critical calls: the caller should cost at most about that chunk plus its own
//! one-row commit, however long the backlog.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use eventspool::{Config, EventSpool, NewEvent};
use serde_json::json;

use crate::{EVENT_NAME, Row, percentile, properties};

const CALLS: usize = 100;
const BACKLOG: u64 = 9_000;
const CAPACITY: u64 = 1_000;
/// Events one spill transaction writes (the queue's `SPILL_CHUNK`).
const SPILL_CHUNK: usize = 1_000;

fn spool(dir: &std::path::Path, name: &str) -> eventspool::Result<EventSpool> {
    let mut cfg = Config::new("http://127.0.0.1:9/unused");
    cfg.db_path = Some(dir.join(name));
    cfg.max_disk_bytes = 8 << 30;
    cfg.memory_capacity = CAPACITY;
    EventSpool::builder(cfg).start_offline().open()
}

/// Per-call nanoseconds of `CALLS` critical events, sorted; with `load`, each call waits for a
/// backlog of at least `BACKLOG` events waiting to spill while a second thread tracks flat out.
fn critical_calls(
    spool: &EventSpool,
    load: bool,
    mut raw: Option<&mut RawChunks>,
) -> Result<(Vec<u64>, u64), Box<dyn std::error::Error>> {
    let stop = Arc::new(AtomicBool::new(false));
    let tracker = load.then(|| {
        let spool = spool.clone();
        let stop = stop.clone();
        std::thread::spawn(move || {
            let template = properties();
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let _ = spool.track(EVENT_NAME, template.clone());
                n += 1;
            }
            n
        })
    });
    let mut times = Vec::with_capacity(CALLS);
    for _ in 0..CALLS {
        if load {
            // Waits (bounded) for the backlog the tracking thread keeps up.
            let deadline = Instant::now() + Duration::from_secs(10);
            loop {
                let st = spool.stats();
                if st.pending_memory >= CAPACITY + BACKLOG || Instant::now() > deadline {
                    break;
                }
                std::thread::sleep(Duration::from_micros(200));
            }
        }
        if let Some(raw) = raw.as_deref_mut() {
            raw.commit()?;
        }
        let event = NewEvent::new("purchase", properties()).critical();
        let t = Instant::now();
        spool.track_event(event)?;
        times.push(t.elapsed().as_nanos() as u64);
    }
    stop.store(true, Ordering::Relaxed);
    let tracked = tracker.map(|t| t.join().unwrap_or(0)).unwrap_or(0);
    times.sort_unstable();
    Ok((times, tracked))
}

/// Raw rusqlite into the baselines' table, 1,000 rows per transaction (a spill chunk).
struct RawChunks {
    conn: rusqlite::Connection,
    rows: Vec<(i64, String, String)>,
    next: usize,
    times: Vec<u64>,
}

impl RawChunks {
    fn commit(&mut self) -> rusqlite::Result<()> {
        let t = Instant::now();
        let tx = self.conn.transaction()?;
        {
            let mut stmt = tx.prepare_cached(
                "INSERT INTO events (seq, ts, event_id, body) VALUES (?1, ?2, ?3, ?4)",
            )?;
            for _ in 0..SPILL_CHUNK {
                let (ts, id, body) = &self.rows[self.next % self.rows.len()];
                stmt.execute(rusqlite::params![self.next as i64, ts, id, body])?;
                self.next += 1;
            }
        }
        tx.commit()?;
        self.times.push(t.elapsed().as_nanos() as u64);
        Ok(())
    }
}

pub fn run() -> Result<Vec<Row>, Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let loaded = spool(dir.path(), "loaded.db")?;
    let idle = spool(dir.path(), "idle.db")?;
    let mut raw = RawChunks {
        conn: crate::store::raw_table(&dir.path().join("raw.db"))?,
        rows: crate::store::rows(SPILL_CHUNK),
        next: 0,
        times: Vec::new(),
    };
    let (idle_times, _) = critical_calls(&idle, false, None)?;
    let (times, tracked) = critical_calls(&loaded, true, Some(&mut raw))?;
    raw.times.sort_unstable();
    let stats = loaded.stats();
    loaded.shutdown(Duration::from_secs(60))?;
    idle.shutdown(Duration::from_secs(60))?;
    let ms = |ns: u64| ns as f64 / 1e6;
    let detail = json!({
        "calls": CALLS, "backlog_at_least": BACKLOG, "memory_capacity": CAPACITY,
        "second_thread_tracked": tracked, "memory_overflow": stats.dropped(eventspool::DropReason::MemoryOverflow),
        "loaded_p50_ms": ms(percentile(&times, 0.5)), "loaded_max_ms": ms(*times.last().unwrap_or(&0)),
        "loaded_over_50_ms": times.iter().filter(|t| **t > 50_000_000).count(),
        "idle_p50_ms": ms(percentile(&idle_times, 0.5)), "idle_p99_ms": ms(percentile(&idle_times, 0.99)),
        "raw_chunk_p50_ms": ms(percentile(&raw.times, 0.5)), "raw_chunk_p99_ms": ms(percentile(&raw.times, 0.99)),
        "loadavg": crate::loadavg(),
    });
    Ok(vec![
        Row::limit(
            "critical track_event p99, 9,000 backlog + a tracking thread",
            ms(percentile(&times, 0.99)),
            "ms",
            Some(50.0),
        )
        .with(detail.clone()),
        Row::cost(
            "critical track_event p99 vs a raw 1,000-row commit p99",
            ms(percentile(&times, 0.99)),
            ms(percentile(&raw.times, 0.99)),
            "ms",
            Some(2.0),
        )
        .with(detail.clone()),
        Row::cost(
            "critical track_event p99, that load vs an idle spool",
            ms(percentile(&times, 0.99)),
            ms(percentile(&idle_times, 0.99)),
            "ms",
            None,
        )
        .with(detail),
    ])
}
