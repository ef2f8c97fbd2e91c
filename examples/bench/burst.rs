//! `track()` while the store works: a paced burst into a store at its disk cap (every spill
//! evicts) against the same burst into an empty store; and `durability = always` against a raw
//! one-row SQLite commit (WAL, `synchronous=NORMAL`).

use std::path::Path;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use eventspool::{Config, Durability, EventSpool};
use serde_json::json;

use crate::{EVENT_NAME, Row, percentile, properties};

/// The default disk cap, where the issue saw `track()` slow down.
const CAP: u64 = 10 << 20;
/// Events of one burst, each timed alone.
const BURST: usize = 30_000;
/// One `track()` every 10 µs: a busy app (a binding pays about 20 µs a call), slower than the
/// store commits, so the burst measures `track()` beside the spill and not the overflow path.
const PERIOD: Duration = Duration::from_micros(10);
const REPS: usize = 3;

fn config(db: &Path) -> Config {
    let mut cfg = Config::new("http://127.0.0.1:9/unused");
    cfg.db_path = Some(db.to_path_buf());
    cfg.max_disk_bytes = CAP;
    cfg.memory_capacity = 1_000;
    cfg
}

/// Fills a store past its cap through `track()` + `persist()`, so it holds as much as the cap
/// allows and every further write evicts.
fn fill_to_cap(path: &Path) -> Result<u64, Box<dyn std::error::Error>> {
    let mut cfg = config(path);
    cfg.memory_capacity = 20_000;
    let spool = EventSpool::builder(cfg).start_offline().open()?;
    let template = properties();
    for _ in 0..12 {
        for _ in 0..5_000 {
            spool.track(EVENT_NAME, template.clone())?;
        }
        spool.persist()?;
    }
    let evicted = spool.stats().dropped(eventspool::DropReason::DiskCap);
    spool.shutdown(Duration::from_secs(30))?;
    if evicted == 0 {
        return Err("the store did not reach its cap".into());
    }
    Ok(evicted)
}

/// One paced burst into the store at `db`; per-call nanoseconds, sorted, and what the cap
/// evicted meanwhile.
fn burst(db: &Path) -> Result<(Vec<u64>, u64), Box<dyn std::error::Error>> {
    let spool = EventSpool::builder(config(db)).start_offline().open()?;
    let template = properties();
    let mut times = Vec::with_capacity(BURST);
    let start = Instant::now();
    for i in 0..BURST {
        let due = start + PERIOD * i as u32;
        while Instant::now() < due {
            std::hint::spin_loop();
        }
        let value = template.clone();
        let t = Instant::now();
        spool.track(EVENT_NAME, value)?;
        times.push(t.elapsed().as_nanos() as u64);
    }
    spool.persist()?;
    let evicted = spool.stats().dropped(eventspool::DropReason::DiskCap);
    spool.shutdown(Duration::from_secs(30))?;
    times.sort_unstable();
    Ok((times, evicted))
}

pub fn near_cap() -> Result<Vec<Row>, Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let full = dir.path().join("full.db");
    let evicted_filling = fill_to_cap(&full)?;
    let (mut at_cap, mut empty) = (Vec::new(), Vec::new());
    let (mut evicted_at_cap, mut evicted_empty) = (Vec::new(), Vec::new());
    for rep in 0..REPS {
        let copy = dir.path().join(format!("full-{rep}.db"));
        std::fs::copy(&full, &copy)?;
        let (t, e) = burst(&copy)?;
        at_cap.push(t);
        evicted_at_cap.push(e);
        let (t, e) = burst(&dir.path().join(format!("empty-{rep}.db")))?;
        empty.push(t);
        evicted_empty.push(e);
    }
    let merged = |runs: Vec<Vec<u64>>| {
        let mut all: Vec<u64> = runs.into_iter().flatten().collect();
        all.sort_unstable();
        all
    };
    let (at_cap, empty) = (merged(at_cap), merged(empty));
    let detail = json!({
        "burst": BURST, "reps": REPS, "period_us": PERIOD.as_micros() as u64,
        "max_disk_bytes": CAP, "evicted_while_filling": evicted_filling,
        "evicted_during_bursts_at_cap": evicted_at_cap, "evicted_during_bursts_empty": evicted_empty,
    });
    Ok(vec![
        Row::cost(
            "track() burst median, store at cap vs empty",
            percentile(&at_cap, 0.5) as f64,
            percentile(&empty, 0.5) as f64,
            "ns",
            Some(1.2),
        )
        .with(detail.clone()),
        Row::cost(
            "track() burst p99, store at cap vs empty",
            percentile(&at_cap, 0.99) as f64,
            percentile(&empty, 0.99) as f64,
            "ns",
            None,
        )
        .with(detail),
    ])
}

const COMMITS: usize = 2_000;
const ALWAYS_THREADS: usize = 4;

/// Raw rusqlite: one row per transaction, WAL, `synchronous=NORMAL`, the rows made beforehand;
/// per-commit nanoseconds, sorted.
fn raw_one_row_commits(path: &Path, n: usize) -> rusqlite::Result<Vec<u64>> {
    let conn = rusqlite::Connection::open(path)?;
    conn.query_row("PRAGMA journal_mode=WAL", [], |_| Ok(()))?;
    conn.execute_batch(
        "PRAGMA synchronous=NORMAL;
         CREATE TABLE events (seq INTEGER PRIMARY KEY, ts INTEGER NOT NULL, event_id TEXT NOT NULL, body TEXT NOT NULL);
         CREATE INDEX events_ts ON events(ts, seq);",
    )?;
    let props = properties();
    let rows: Vec<(i64, String, String)> = (0..n)
        .map(|i| {
            let id = uuid::Uuid::now_v7().to_string();
            let ts = 1_764_417_600_000i64 + i as i64;
            let body = json!({"event_id": id, "name": EVENT_NAME, "timestamp": eventspool::format_timestamp(ts), "properties": props}).to_string();
            (ts, id, body)
        })
        .collect();
    let mut stmt = conn
        .prepare_cached("INSERT INTO events (seq, ts, event_id, body) VALUES (?1, ?2, ?3, ?4)")?;
    let mut times = Vec::with_capacity(n);
    for (i, (ts, id, body)) in rows.iter().enumerate() {
        let t = Instant::now();
        // Autocommit: one statement is one transaction, committed before `execute` returns.
        stmt.execute(rusqlite::params![i as i64, ts, id, body])?;
        times.push(t.elapsed().as_nanos() as u64);
    }
    times.sort_unstable();
    Ok(times)
}

/// `track()` with `durability = always` on `threads` threads, `n` calls in all; per-call
/// nanoseconds, sorted.
fn always_tracks(
    path: &Path,
    threads: usize,
    n: usize,
) -> Result<Vec<u64>, Box<dyn std::error::Error>> {
    let mut cfg = Config::new("http://127.0.0.1:9/unused");
    cfg.db_path = Some(path.to_path_buf());
    cfg.max_disk_bytes = 8 << 30;
    cfg.durability = Durability::Always;
    let spool = EventSpool::builder(cfg).start_offline().open()?;
    let barrier = Arc::new(Barrier::new(threads));
    let handles: Vec<_> = (0..threads)
        .map(|_| {
            let spool = spool.clone();
            let barrier = barrier.clone();
            std::thread::spawn(move || {
                let template = properties();
                let mut times = Vec::with_capacity(n / threads);
                barrier.wait();
                for _ in 0..n / threads {
                    let value = template.clone();
                    let t = Instant::now();
                    let ok = spool.track(EVENT_NAME, value).is_ok();
                    times.push(t.elapsed().as_nanos() as u64);
                    if !ok {
                        return Err("durability = always: track() returned an error");
                    }
                }
                Ok(times)
            })
        })
        .collect();
    let mut all = Vec::with_capacity(n);
    for h in handles {
        all.extend(h.join().map_err(|_| "tracking thread panicked")??);
    }
    let on_disk = spool.stats().pending_disk;
    spool.shutdown(Duration::from_secs(30))?;
    if on_disk != (n / threads * threads) as u64 {
        return Err(format!("durability = always: {on_disk} of {n} on disk").into());
    }
    all.sort_unstable();
    Ok(all)
}

pub fn always() -> Result<Vec<Row>, Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let raw = raw_one_row_commits(&dir.path().join("raw.db"), COMMITS)?;
    let one = always_tracks(&dir.path().join("always-1.db"), 1, COMMITS)?;
    let four = always_tracks(&dir.path().join("always-4.db"), ALWAYS_THREADS, COMMITS)?;
    let detail = json!({
        "calls": COMMITS,
        "raw_p99_ns": percentile(&raw, 0.99),
        "always_1_thread_p99_ns": percentile(&one, 0.99),
        "always_4_threads_p99_ns": percentile(&four, 0.99),
    });
    Ok(vec![
        Row::cost(
            "track() durability=always median, 1 thread",
            percentile(&one, 0.5) as f64,
            percentile(&raw, 0.5) as f64,
            "ns",
            Some(1.5),
        )
        .with(detail.clone()),
        Row::cost(
            "track() durability=always median, 4 threads",
            percentile(&four, 0.5) as f64,
            percentile(&raw, 0.5) as f64,
            "ns",
            None,
        )
        .with(detail),
    ])
}
