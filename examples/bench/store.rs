//! The store's paths against raw SQLite and a raw HTTP loop: spill while offline, draining a
//! stored backlog to the reference collector, and a cold open with a backlog.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use eventspool::{Compression, Config, EncryptionKeys, EventSpool};
use eventspool_collector::{CollectorConfig, ReferenceCollector};
use serde_json::json;

use crate::{EVENT_NAME, Row, percentile, properties};

/// The disk cap for spill and drain: large enough that nothing is evicted. The store derives its
/// WAL limit from it, so `BENCH_DISK_CAP=<bytes>` lets a run see what that costs.
fn big_cap() -> u64 {
    std::env::var("BENCH_DISK_CAP")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(8 << 30)
}

fn config(endpoint: &str, db: &Path) -> Config {
    let mut cfg = Config::new(endpoint);
    cfg.db_path = Some(db.to_path_buf());
    cfg.max_disk_bytes = big_cap();
    cfg
}

/// Rows as the SDK would store them (ts, id, wire JSON), made before any timing starts.
pub fn rows(n: usize) -> Vec<(i64, String, String)> {
    let props = properties();
    let base_ms = 1_764_417_600_000i64;
    (0..n)
        .map(|i| {
            let id = uuid::Uuid::now_v7().to_string();
            let ts = base_ms + i as i64;
            let json = json!({"event_id": id, "name": EVENT_NAME, "timestamp": eventspool::format_timestamp(ts), "properties": props}).to_string();
            (ts, id, json)
        })
        .collect()
}

/// The raw baselines' table, in a new file: WAL, `synchronous=NORMAL`, an integer key (seq), ts,
/// id and body, and an index on (ts, seq).
pub fn raw_table(path: &Path) -> rusqlite::Result<rusqlite::Connection> {
    let conn = rusqlite::Connection::open(path)?;
    conn.query_row("PRAGMA journal_mode=WAL", [], |_| Ok(()))?;
    conn.execute_batch(
        "PRAGMA synchronous=NORMAL;
         CREATE TABLE events (seq INTEGER PRIMARY KEY, ts INTEGER NOT NULL, event_id TEXT NOT NULL, body TEXT NOT NULL);
         CREATE INDEX events_ts ON events(ts, seq);",
    )?;
    Ok(conn)
}

/// Raw rusqlite into [`raw_table`]: 1,000-row transactions.
fn raw_insert(path: &Path, rows: &[(i64, String, String)]) -> rusqlite::Result<f64> {
    let mut conn = raw_table(path)?;
    let t = Instant::now();
    for (chunk_no, chunk) in rows.chunks(1000).enumerate() {
        let tx = conn.transaction()?;
        {
            let mut stmt = tx.prepare_cached(
                "INSERT INTO events (seq, ts, event_id, body) VALUES (?1, ?2, ?3, ?4)",
            )?;
            for (i, (ts, id, body)) in chunk.iter().enumerate() {
                stmt.execute(rusqlite::params![
                    (chunk_no * 1000 + i) as i64,
                    ts,
                    id,
                    body
                ])?;
            }
        }
        tx.commit()?;
    }
    Ok(rows.len() as f64 / t.elapsed().as_secs_f64())
}

/// Waits until the spiller has written everything past memory's capacity: memory back down to
/// it and every one of the `tracked` events in memory, on disk or dropped (a burst past the
/// spill backlog drops the oldest, counted), none in a chunk being written.
///
/// It asks every [`SPILL_POLL`]: the run ends at the first answer that says done, so the figure
/// is late by up to one interval plus a `stats()` call.
fn wait_spilled(spool: &EventSpool, capacity: u64, tracked: u64) -> eventspool::Stats {
    loop {
        let stats = spool.stats();
        let dropped: u64 = stats.dropped.values().sum();
        if stats.pending_memory <= capacity
            && stats.pending_memory + stats.pending_disk + dropped == tracked
        {
            return stats;
        }
        std::thread::sleep(SPILL_POLL);
    }
}

/// How often [`wait_spilled`] asks. At 2 ms a 10k-event run, about 9 ms long, was rounded up
/// by 1 ms on average (up to 2), a tenth of the figure, which the raw side does not pay.
/// Asking more often takes memory's lock more often while the spill works, which can only
/// slow the spool down (`stats()` no longer waits for the store while a chunk is written).
const SPILL_POLL: Duration = Duration::from_micros(250);

/// Spill runs up to this size build the app's property values before timing (about 1 KiB each).
const PREBUILT_MAX: usize = 200_000;

/// Runs below 1M events are repeated this many times; the report takes each side's median.
pub fn reps(n: usize) -> usize {
    if n >= 1_000_000 { 1 } else { 3 }
}

/// Spill runs of up to 10,000 events last about 10 ms, and of three the first was often far
/// off on both sides (the process's first allocations fault in fresh pages) while the
/// machine's write-back stalled another now and then: five, so two such runs leave the median
/// alone.
fn spill_reps(n: usize) -> usize {
    if n <= 10_000 { 5 } else { reps(n) }
}

/// CPU time (user + system) this process has used so far, in seconds, from `/proc/self/stat`
/// (clock ticks, 100 per second on Linux). The drain figures report it beside wall time: on a
/// shared machine wall time also counts waiting for the disk and for other tenants, CPU time
/// is the work done per event, so it shows whether the cost itself grows with the backlog.
fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let after_name = stat.rsplit(')').next().unwrap_or_default();
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    // Fields 14 and 15 of proc(5) (utime, stime); the slice starts at field 3.
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    (ticks(11) + ticks(12)) / 100.0
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

pub fn spill(sizes: &[usize]) -> Result<Vec<Row>, Box<dyn std::error::Error>> {
    let mut out = Vec::new();
    for &n in sizes {
        let (mut ours, mut base, mut details) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..spill_reps(n) {
            let (o, b, d) = spill_once(n, &EncryptionKeys::default())?;
            ours.push(o);
            base.push(b);
            details.push(d);
        }
        let (o, b) = (median(ours.clone()), median(base.clone()));
        let made: Vec<f64> = details
            .iter()
            .filter_map(|d| d["raw_with_row_creation_events_per_s"].as_f64())
            .collect();
        let made = median(made);
        out.push(
            Row::rate(
                format!("spill offline, {n} events"),
                o,
                b,
                "events/s",
                Some(0.8),
            )
            .with(json!({
                "ours_runs": ours, "baseline_runs": base, "runs": details,
                "ours_us_per_event": 1e6 / o, "baseline_us_per_event": 1e6 / b,
                "ratio_vs_raw_with_row_creation": o / made,
            })),
        );
    }
    Ok(out)
}

fn spill_once(
    n: usize,
    keys: &EncryptionKeys,
) -> Result<(f64, f64, serde_json::Value), Box<dyn std::error::Error>> {
    {
        let dir = tempfile::tempdir()?;
        let base = raw_insert(&dir.path().join("raw.db"), &rows(n))?;
        // The same raw insert paying for making its rows (uuid + serde_json), as track() does.
        let t = Instant::now();
        let made = rows(n);
        let making_s = t.elapsed().as_secs_f64();
        let insert_rate = raw_insert(&dir.path().join("raw-made.db"), &made)?;
        let with_creation = n as f64 / (making_s + n as f64 / insert_rate);
        let spool = offline_spill_spool(&dir.path().join("events.db"), keys)?;
        let template = properties();
        // The app's properties are built before the clock starts, as the raw side's rows are
        // (and as the `track` rows do): building them is the app's cost, not the SDK's. Past
        // PREBUILT_MAX events that would hold too much memory, so they are cloned in the loop.
        let prebuilt: Option<Vec<serde_json::Value>> =
            (n <= PREBUILT_MAX).then(|| (0..n).map(|_| template.clone()).collect());
        let prebuilt_values = prebuilt.is_some();
        let t = Instant::now();
        match prebuilt {
            Some(values) => {
                for value in values {
                    spool.track(EVENT_NAME, value)?;
                }
            }
            None => {
                for _ in 0..n {
                    spool.track(EVENT_NAME, template.clone())?;
                }
            }
        }
        let tracked_in = t.elapsed();
        let stats = wait_spilled(&spool, 1_000, n as u64);
        let elapsed = t.elapsed().as_secs_f64();
        let rate = stats.pending_disk as f64 / elapsed;
        spool.shutdown(Duration::from_secs(10))?;
        let dropped: u64 = stats.dropped.values().sum();
        Ok((
            rate,
            base,
            json!({
                "on_disk": stats.pending_disk, "dropped": dropped,
                "raw_with_row_creation_events_per_s": with_creation,
                "track_loop_s": tracked_in.as_secs_f64(), "until_spilled_s": elapsed,
                "app_values_built_before_timing": prebuilt_values,
            }),
        ))
    }
}

/// The spill rows' spool: offline, a memory of 1,000, so that everything past it spills.
fn offline_spill_spool(
    path: &Path,
    keys: &EncryptionKeys,
) -> Result<EventSpool, Box<dyn std::error::Error>> {
    let mut cfg = config("http://127.0.0.1:9/unused", path);
    cfg.memory_capacity = 1_000;
    cfg.encryption_keys = keys.clone();
    Ok(EventSpool::builder(cfg).start_offline().open()?)
}

/// Each `track()` call's nanoseconds, sorted, while `n` events spill offline past a memory of
/// 1,000 (the spill rows' setup), the app's values built before.
fn track_latencies(
    n: usize,
    keys: &EncryptionKeys,
) -> Result<Vec<u64>, Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let spool = offline_spill_spool(&dir.path().join("events.db"), keys)?;
    let template = properties();
    let mut times = Vec::with_capacity(n);
    for _ in 0..n {
        let value = template.clone();
        let t = Instant::now();
        spool.track(EVENT_NAME, value)?;
        times.push(t.elapsed().as_nanos() as u64);
    }
    wait_spilled(&spool, 1_000, n as u64);
    spool.shutdown(Duration::from_secs(10))?;
    times.sort_unstable();
    Ok(times)
}

/// Fills a store with `n` events through `track()` + `persist()` (nothing dropped), closed.
fn fill(path: &Path, n: usize, keys: &EncryptionKeys) -> Result<(), Box<dyn std::error::Error>> {
    let mut cfg = config("http://127.0.0.1:9/unused", path);
    cfg.memory_capacity = 20_000;
    cfg.encryption_keys = keys.clone();
    let spool = EventSpool::builder(cfg).start_offline().open()?;
    let template = properties();
    for i in 0..n {
        spool.track(EVENT_NAME, template.clone())?;
        if (i + 1) % 10_000 == 0 {
            spool.persist()?;
        }
    }
    spool.shutdown(Duration::from_secs(30))?;
    Ok(())
}

fn copy_store(from: &Path, to: &Path) -> std::io::Result<()> {
    std::fs::copy(from, to)?;
    let wal = PathBuf::from(format!("{}-wal", from.display()));
    if wal.exists() {
        std::fs::copy(&wal, format!("{}-wal", to.display()))?;
    }
    Ok(())
}

fn collector(dir: &Path, name: &str) -> std::io::Result<ReferenceCollector> {
    ReferenceCollector::start(CollectorConfig {
        db_path: Some(dir.join(name)),
        max_request_records: 16,
        ..CollectorConfig::default()
    })
}

/// Opens a copy of the filled store online and times it until the collector holds every event.
fn drain_ours(
    dir: &Path,
    filled: &Path,
    n: usize,
    compression: Compression,
    keys: &EncryptionKeys,
    tag: &str,
) -> Result<(f64, u64, f64), Box<dyn std::error::Error>> {
    let db = dir.join(format!("drain-{tag}.db"));
    copy_store(filled, &db)?;
    let c = collector(dir, &format!("collector-{tag}.db"))?;
    let mut cfg = config(&c.url(), &db);
    cfg.min_batch_interval_ms = 0;
    cfg.compression = compression;
    cfg.encryption_keys = keys.clone();
    let t = Instant::now();
    let cpu = cpu_seconds();
    let spool = EventSpool::open(cfg)?;
    let drained = spool.wait_drained(Duration::from_secs(1800));
    let elapsed = t.elapsed().as_secs_f64();
    let cpu_us_per_event = (cpu_seconds() - cpu) * 1e6 / n as f64;
    let requests = spool.stats().requests;
    spool.shutdown(Duration::from_secs(10))?;
    if !drained || c.distinct_count() != n as u64 {
        return Err(format!(
            "drain {tag}: drained={drained}, collector holds {} of {n}",
            c.distinct_count()
        )
        .into());
    }
    Ok((n as f64 / elapsed, requests, cpu_us_per_event))
}

/// A drain's rate against the raw loop's, at least.
const DRAIN_TARGET: f64 = 0.85;

/// The raw loop: the same stored bodies, 100 per request, POSTed one after another by reqwest.
fn drain_raw(
    dir: &Path,
    filled: &Path,
    n: usize,
    gzip: bool,
    tag: &str,
) -> Result<(f64, f64), Box<dyn std::error::Error>> {
    let conn = rusqlite::Connection::open(filled)?;
    // A stored row leaves out the head that repeats its id and timestamp columns (src/event.rs,
    // `QueuedEvent::wire_tail`): put back before the clock starts, as the store does on read.
    let bodies: Vec<String> = {
        let mut stmt = conn.prepare("SELECT event_id, ts, body FROM events ORDER BY ts, seq")?;
        stmt.query_map([], |r| {
            let (id, ts, body): (String, i64, String) = (r.get(0)?, r.get(1)?, r.get(2)?);
            Ok(if body.starts_with('{') {
                body
            } else {
                let ts = eventspool::format_timestamp(ts);
                format!(r#"{{"event_id":"{id}","timestamp":"{ts}",{body}"#)
            })
        })?
        .collect::<rusqlite::Result<_>>()?
    };
    drop(conn);
    let sent_at = eventspool::format_timestamp(1_764_417_600_000);
    let batches: Vec<Vec<u8>> = bodies
        .chunks(100)
        .map(|chunk| {
            format!(
                "{{\"sent_at\":\"{sent_at}\",\"batch\":[{}]}}",
                chunk.join(",")
            )
            .into_bytes()
        })
        .collect();
    let c = collector(dir, &format!("collector-raw-{tag}.db"))?;
    let _ = rustls::crypto::ring::default_provider().install_default();
    let client = reqwest::Client::builder()
        .retry(reqwest::retry::never())
        .build()?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let url = c.url();
    let t = Instant::now();
    let cpu = cpu_seconds();
    runtime.block_on(async {
        for body in batches {
            let mut request = client.post(&url).header("Content-Type", "application/json");
            let body = if gzip {
                request = request.header("Content-Encoding", "gzip");
                let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
                std::io::Write::write_all(&mut e, &body)?;
                e.finish()?
            } else {
                body
            };
            let response = request.body(body).send().await?;
            if !response.status().is_success() {
                return Err(format!("raw loop: collector answered {}", response.status()).into());
            }
            response.bytes().await?;
        }
        Ok::<(), Box<dyn std::error::Error>>(())
    })?;
    let elapsed = t.elapsed().as_secs_f64();
    let cpu_us_per_event = (cpu_seconds() - cpu) * 1e6 / n as f64;
    if c.distinct_count() != n as u64 {
        return Err(format!("raw loop: collector holds {} of {n}", c.distinct_count()).into());
    }
    Ok((n as f64 / elapsed, cpu_us_per_event))
}

pub fn drain(sizes: &[usize]) -> Result<Vec<Row>, Box<dyn std::error::Error>> {
    let mut out = Vec::new();
    for &n in sizes {
        let dir = tempfile::tempdir()?;
        let filled = dir.path().join("filled.db");
        fill(&filled, n, &EncryptionKeys::default())?;
        // Per side: wall-clock rates and CPU µs per event, one entry per repetition.
        let mut runs: [(Vec<f64>, Vec<f64>); 4] = Default::default();
        let [raw_plain, ours_plain, raw_gzip, ours_gzip] = &mut runs;
        let (mut requests, mut requests_gz) = (0, 0);
        for rep in 0..reps(n) {
            for (gzip, raw, ours, requests) in [
                (false, &mut *raw_plain, &mut *ours_plain, &mut requests),
                (true, &mut *raw_gzip, &mut *ours_gzip, &mut requests_gz),
            ] {
                let tag = format!("{}{rep}", if gzip { "gzip" } else { "plain" });
                let (rate, cpu) = drain_raw(dir.path(), &filled, n, gzip, &tag)?;
                raw.0.push(rate);
                raw.1.push(cpu);
                let compression = if gzip {
                    Compression::Gzip
                } else {
                    Compression::None
                };
                let (rate, r, cpu) = drain_ours(
                    dir.path(),
                    &filled,
                    n,
                    compression,
                    &EncryptionKeys::default(),
                    &tag,
                )?;
                ours.0.push(rate);
                ours.1.push(cpu);
                *requests = r;
            }
        }
        let detail = |raw: &(Vec<f64>, Vec<f64>), ours: &(Vec<f64>, Vec<f64>), requests: u64| {
            let (base, mine) = (median(raw.0.clone()), median(ours.0.clone()));
            let extra = json!({
                "events": n, "requests": requests,
                "ours_us_per_event": 1e6 / mine, "baseline_us_per_event": 1e6 / base,
                "ours_cpu_us_per_event": median(ours.1.clone()),
                "baseline_cpu_us_per_event": median(raw.1.clone()),
                "runs": {"ours_events_per_s": ours.0, "baseline_events_per_s": raw.0,
                         "ours_cpu_us_per_event": ours.1, "baseline_cpu_us_per_event": raw.1},
            });
            (mine, base, extra)
        };
        // The target is the wire-speed one (BENCHMARKS.md, "Draining a backlog while the
        // request is on the wire"), with gzip off and on.
        let (ours, base, extra) = detail(raw_plain, ours_plain, requests);
        out.push(
            Row::rate(
                format!("drain {n} stored events, gzip off"),
                ours,
                base,
                "events/s",
                Some(DRAIN_TARGET),
            )
            .with(extra),
        );
        let (ours, base, extra) = detail(raw_gzip, ours_gzip, requests_gz);
        out.push(
            Row::rate(
                format!("drain {n} stored events, gzip on"),
                ours,
                base,
                "events/s",
                Some(DRAIN_TARGET),
            )
            .with(extra),
        );
    }
    Ok(out)
}

/// What encryption at rest costs: spill and drain with `encryption_keys` against the same runs
/// without, interleaved in one process so both sides see the same machine. The baseline column
/// is the plain store; the ratio is encrypted / plain.
pub fn encryption(sizes: &[usize]) -> Result<Vec<Row>, Box<dyn std::error::Error>> {
    let keys = EncryptionKeys::new([(1, [0x5a; 32])]);
    let plain = EncryptionKeys::default();
    let mut out = Vec::new();
    for &n in sizes {
        let (mut sealed_runs, mut plain_runs) = (Vec::new(), Vec::new());
        for _ in 0..spill_reps(n) {
            plain_runs.push(spill_once(n, &plain)?.0);
            sealed_runs.push(spill_once(n, &keys)?.0);
        }
        let (o, b) = (median(sealed_runs.clone()), median(plain_runs.clone()));
        // While the spill is behind, the tracking thread seals bodies ahead: what that costs
        // each call, against the raw baseline of the `track` rows.
        let sealed_calls = track_latencies(n, &keys)?;
        let plain_calls = track_latencies(n, &plain)?;
        let raw_calls = crate::track::raw_latencies(n);
        out.push(
            Row::cost(
                format!("track() median while an encrypted spill of {n} runs, vs raw"),
                percentile(&sealed_calls, 0.5) as f64,
                percentile(&raw_calls, 0.5) as f64,
                "ns",
                Some(2.0),
            )
            .with(json!({
                "p99_ns": percentile(&sealed_calls, 0.99),
                "plain_spill_median_ns": percentile(&plain_calls, 0.5),
                "plain_spill_p99_ns": percentile(&plain_calls, 0.99),
                "raw_p99_ns": percentile(&raw_calls, 0.99),
            })),
        );
        out.push(
            Row::rate(
                format!("spill offline, {n} events, encrypted vs plain"),
                o,
                b,
                "events/s",
                Some(0.7),
            )
            .with(json!({
                "encrypted_runs": sealed_runs, "plain_runs": plain_runs,
                "encrypted_us_per_event": 1e6 / o, "plain_us_per_event": 1e6 / b,
            })),
        );
        let dir = tempfile::tempdir()?;
        let (filled_plain, filled_sealed) =
            (dir.path().join("plain.db"), dir.path().join("sealed.db"));
        fill(&filled_plain, n, &plain)?;
        fill(&filled_sealed, n, &keys)?;
        let (mut sealed_runs, mut plain_runs) = (Vec::new(), Vec::new());
        let (mut sealed_cpu, mut plain_cpu) = (Vec::new(), Vec::new());
        for rep in 0..reps(n) {
            let (rate, _, cpu) = drain_ours(
                dir.path(),
                &filled_plain,
                n,
                Compression::None,
                &plain,
                &format!("enc-plain{rep}"),
            )?;
            plain_runs.push(rate);
            plain_cpu.push(cpu);
            let (rate, _, cpu) = drain_ours(
                dir.path(),
                &filled_sealed,
                n,
                Compression::None,
                &keys,
                &format!("enc-sealed{rep}"),
            )?;
            sealed_runs.push(rate);
            sealed_cpu.push(cpu);
        }
        let (o, b) = (median(sealed_runs.clone()), median(plain_runs.clone()));
        out.push(
            Row::rate(
                format!("drain {n} stored events, gzip off, encrypted vs plain"),
                o,
                b,
                "events/s",
                Some(0.7),
            )
            .with(json!({
                "encrypted_runs": sealed_runs, "plain_runs": plain_runs,
                "encrypted_cpu_us_per_event": median(sealed_cpu),
                "plain_cpu_us_per_event": median(plain_cpu),
            })),
        );
    }
    Ok(out)
}

/// A store holding 10 MB of backlog, opened online against the collector: time until the
/// first `track()` has returned. Warm page cache (dropping it would disturb the whole machine).
pub fn cold_open() -> Result<Vec<Row>, Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let filled = dir.path().join("filled.db");
    let target = 10 * 1000 * 1000;
    {
        let mut cfg = config("http://127.0.0.1:9/unused", &filled);
        cfg.memory_capacity = 20_000;
        cfg.max_disk_bytes = 16 << 20;
        let spool = EventSpool::builder(cfg).start_offline().open()?;
        let template = properties();
        while eventspool::disk_usage(&filled) < target {
            for _ in 0..5_000 {
                spool.track(EVENT_NAME, template.clone())?;
            }
            spool.persist()?;
        }
        spool.shutdown(Duration::from_secs(30))?;
    }
    let bytes = eventspool::disk_usage(&filled);
    let c = collector(dir.path(), "collector.db")?;
    let mut times = Vec::new();
    let mut backlog = 0;
    for rep in 0..7 {
        let db = dir.path().join(format!("cold-{rep}.db"));
        copy_store(&filled, &db)?;
        let mut cfg = config(&c.url(), &db);
        cfg.max_disk_bytes = 16 << 20;
        let t = Instant::now();
        let spool = EventSpool::open(cfg)?;
        spool.track(EVENT_NAME, properties())?;
        times.push(t.elapsed().as_secs_f64() * 1000.0);
        backlog = spool.stats().restored;
        spool.shutdown(Duration::from_secs(10))?;
    }
    times.sort_by(f64::total_cmp);
    let median = times[times.len() / 2];
    Ok(vec![
        Row::limit(
            "cold open with 10 MB backlog to first track()",
            median,
            "ms",
            Some(50.0),
        )
        .with(json!({
            "store_bytes": bytes, "backlog_events": backlog, "runs_ms": times,
        })),
    ])
}
