//! The fleet run against the topology: hundreds of real `EventSpool`s in one process (each
//! its own SQLite store) track one event a second each through nginx into three collectors
//! and an R3 stream on a 3-node cluster; the whole cluster is stopped for 60 s and restarted.
//! What a fleet operator needs to hold: devices hear 503 with `Retry-After` while the broker
//! is gone (never a timeout, which would make them resend with the effect unknown), the
//! request rate at the balancer after the outage peaks at no more than twice the steady rate
//! (the SDK's full jitter spreads the comeback), and every event reaches the warehouse
//! exactly once.
//!
//! `EVENTSPOOL_FLEET_SPOOLS` (default 200) and `EVENTSPOOL_FLEET_OUTAGE_SECS` (default 60)
//! size it; the real clock runs, since the outage is a real cluster being down.

use std::collections::HashMap;
use std::io::Write;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use eventspool::{Config, DeliveryState, DeliveryStatus, EventSpool};
use serde_json::json;

use crate::collectors::{CollectorProcess, LoadBalancer};
use crate::nats::Cluster;
use crate::process::example_binary;

const STREAM: &str = "FLEET";
const COLLECTORS: usize = 3;
/// Steady traffic before the outage: the first seconds (spools opening) are not counted.
const STEADY: Duration = Duration::from_secs(12);
const WARM_UP: f64 = 4.0;
/// Tracking goes on this long after the cluster is back.
const AFTER: Duration = Duration::from_secs(5);
const DRAIN_TIMEOUT: Duration = Duration::from_secs(90);
/// The SDK's attempt timeout: a request that took this long at the balancer timed out.
const ATTEMPT_TIMEOUT_MS: u64 = 10_000;

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// A device's settings: the SDK's defaults (backoff 1 s .. 15 s, full jitter, Retry-After
/// honoured), one flush a second, and a retry budget that outlasts the outage instead of
/// handing it to the user.
fn spool_config(endpoint: &str, db: std::path::PathBuf, outage: Duration) -> Config {
    let mut c = Config::new(endpoint.to_owned());
    c.db_path = Some(db);
    c.flush_interval_ms = 1_000;
    c.flush_at = 100;
    c.attempt_timeout_ms = ATTEMPT_TIMEOUT_MS;
    c.max_auto_attempts = 1_000;
    c.max_retry_elapsed_ms = (outage.as_millis() as u64) * 3;
    c
}

/// Counts the retries a device scheduled after a request that got no answer in time.
#[derive(Default)]
struct Timeouts {
    timed_out: AtomicU64,
    no_answer: AtomicU64,
}

impl eventspool::DeliveryObserver for Timeouts {
    fn on_state(&self, status: &DeliveryStatus) {
        if let DeliveryState::RetryScheduled { last_error, .. } = &status.state
            && last_error.status.is_none()
        {
            self.no_answer.fetch_add(1, Ordering::Relaxed);
            if last_error.message.contains("timed out") {
                self.timed_out.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

#[test]
fn fleet_of_real_spools_rides_out_a_broker_outage_without_a_herd() {
    let spools_n = env_or("EVENTSPOOL_FLEET_SPOOLS", 200) as usize;
    let outage = Duration::from_secs(env_or("EVENTSPOOL_FLEET_OUTAGE_SECS", 60));
    let dir = tempfile::tempdir().unwrap();
    let mut cluster = Cluster::start(3);
    let collectors: Vec<CollectorProcess> = (0..COLLECTORS)
        .map(|i| {
            let log = dir.path().join(format!("collector{i}.log"));
            CollectorProcess::start_with(
                &cluster.urls(),
                STREAM,
                0.0,
                i as u64,
                &log,
                &["--replicas", "3", "--retry-after", "5"],
            )
        })
        .collect();
    let lb = LoadBalancer::start(&collectors.iter().map(|c| c.addr).collect::<Vec<_>>());
    let timeouts = Arc::new(Timeouts::default());
    let opening = Instant::now();
    // Opened (and shut down) from a few threads at once: each creates its SQLite store.
    let spools: Vec<EventSpool> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..8)
            .map(|w| {
                let (lb, dir, timeouts) = (&lb, dir.path(), &timeouts);
                scope.spawn(move || {
                    (w..spools_n)
                        .step_by(8)
                        .map(|i| {
                            let db = dir.join(format!("spool{i}.db"));
                            EventSpool::builder(spool_config(&lb.url(), db, outage))
                                .observer(
                                    Arc::clone(timeouts) as Arc<dyn eventspool::DeliveryObserver>
                                )
                                .open()
                                .expect("spool opens")
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        workers
            .into_iter()
            .flat_map(|w| w.join().expect("opening thread"))
            .collect()
    });
    let opened_in = opening.elapsed();
    let t0 = unix_now();
    let started = Instant::now();
    let mut tracked: Vec<String> = Vec::new();
    let mut tick = 0u64;
    let mut track_until = |until: Duration, tracked: &mut Vec<String>| {
        while started.elapsed() < until {
            for (s, spool) in spools.iter().enumerate() {
                let props = json!({"spool": s, "tick": tick, "screen": "home"});
                tracked.push(spool.track("screen_view", props).unwrap().to_string());
            }
            tick += 1;
            let next = Duration::from_secs(tick);
            std::thread::sleep(next.saturating_sub(started.elapsed()));
        }
    };
    track_until(STEADY, &mut tracked);
    let outage_began = unix_now() - t0;
    for node in &mut cluster.nodes {
        node.stop();
    }
    track_until(STEADY + outage, &mut tracked);
    for node in &mut cluster.nodes {
        node.restart();
    }
    let back = unix_now() - t0;
    track_until(STEADY + outage + AFTER, &mut tracked);
    for (i, spool) in spools.iter().enumerate() {
        assert!(
            spool.wait_drained(DRAIN_TIMEOUT),
            "spool {i} did not drain: {} {:?}",
            spool.state(),
            spool.stats()
        );
    }
    let drained = unix_now() - t0;

    // Requests per second at the balancer, by second since the start.
    let lines = lb.log_lines();
    let mut per_second: HashMap<i64, u64> = HashMap::new();
    for l in &lines {
        *per_second.entry((l.at - t0).floor() as i64).or_insert(0) += 1;
    }
    let rate = |from: f64, to: f64| -> Vec<u64> {
        (from.ceil() as i64..to.floor() as i64)
            .map(|s| per_second.get(&s).copied().unwrap_or(0))
            .collect()
    };
    let steady = rate(WARM_UP, outage_began);
    let steady_rate = steady.iter().sum::<u64>() as f64 / steady.len().max(1) as f64;
    let peak = rate(back, drained + 1.0).into_iter().max().unwrap_or(0);
    let during: Vec<_> = lines
        .iter()
        .filter(|l| l.at - t0 >= outage_began && l.at - t0 < back)
        .collect();
    let refused = during.iter().filter(|l| l.status == 503).count();
    let refused_without_retry_after = during
        .iter()
        .filter(|l| l.status == 503 && !l.retry_after)
        .count();
    let client_closed = lines.iter().filter(|l| l.status == 499).count();
    let slowest = lines.iter().map(|l| l.seconds).fold(0.0, f64::max);
    let statuses = lb.answered();

    // The warehouse: the whole stream through the loader into chdb, each id once.
    let loading = Instant::now();
    let warehouse = load_warehouse(&cluster.urls(), dir.path());
    let loaded_in = loading.elapsed();
    let twice = warehouse.values().filter(|&&n| n != 1).count();
    let missing = tracked
        .iter()
        .filter(|id| !warehouse.contains_key(&format!("default:{id}")))
        .count();
    println!(
        "fleet: {spools_n} spools (each its own store) tracked {} events, 1 a second each, \
         through nginx into {COLLECTORS} collectors and an R3 stream on 3 nodes; the cluster down \
         {:.1} s: {refused} × 503 ({refused_without_retry_after} without Retry-After); steady \
         {steady_rate:.0} req/s, peak after the outage {peak} req/s = {:.2} × steady; slowest \
         request {slowest:.2} s, {client_closed} closed by the client, {} retries after a timeout \
         ({} after no answer); drained {:.1} s after the cluster was back; nginx {statuses:?}; \
         warehouse {} rows (FINAL), {missing} missing, {twice} not once; spools opened in \
         {opened_in:.1?}, warehouse loaded in {loaded_in:.1?}",
        tracked.len(),
        back - outage_began,
        peak as f64 / steady_rate,
        timeouts.timed_out.load(Ordering::Relaxed),
        timeouts.no_answer.load(Ordering::Relaxed),
        drained - back,
        warehouse.len(),
    );
    assert!(spools_n >= 200 || std::env::var_os("EVENTSPOOL_FLEET_SPOOLS").is_some());
    assert!(refused > 0, "devices heard 503 while the cluster was down");
    assert_eq!(
        refused_without_retry_after, 0,
        "every 503 carried Retry-After"
    );
    assert!(
        peak as f64 <= 2.0 * steady_rate,
        "peak {peak} req/s after the outage is over twice the steady {steady_rate:.1} req/s"
    );
    assert_eq!(client_closed, 0, "no device gave up waiting for an answer");
    assert!(
        slowest < ATTEMPT_TIMEOUT_MS as f64 / 1000.0,
        "a request took {slowest} s, past the devices' attempt timeout"
    );
    assert_eq!(
        timeouts.timed_out.load(Ordering::Relaxed),
        0,
        "no device's request timed out"
    );
    assert_eq!(missing, 0, "every tracked event is in the warehouse");
    assert_eq!(twice, 0, "every event is in the warehouse exactly once");
    assert_eq!(warehouse.len(), tracked.len(), "and nothing else is");
    std::thread::scope(|scope| {
        for chunk in spools.chunks(spools.len().div_ceil(8).max(1)) {
            scope.spawn(move || {
                for spool in chunk {
                    let _ = spool.shutdown(Duration::from_secs(5));
                }
            });
        }
    });
}

/// Loads the whole stream into chdb through `stream_to_warehouse` and `warehouse_chdb.py`;
/// returns the copies of each `project:event_id` a `FINAL` query sees.
fn load_warehouse(urls: &str, dir: &std::path::Path) -> HashMap<String, u64> {
    let loader = Command::new(example_binary("stream_to_warehouse"))
        .args([
            "--nats",
            urls.split(',').next().unwrap(),
            "--stream",
            STREAM,
        ])
        .output()
        .expect("run stream_to_warehouse");
    assert!(
        loader.status.success(),
        "loader failed: {}",
        String::from_utf8_lossy(&loader.stderr)
    );
    let ids = dir.join("warehouse-ids.tsv");
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/warehouse_chdb.py");
    let mut python = Command::new("python3")
        .arg(script)
        .arg(dir.join("chdb"))
        .arg("--ids")
        .arg(&ids)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run python3");
    python
        .stdin
        .take()
        .unwrap()
        .write_all(&loader.stdout)
        .unwrap();
    let out = python.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "warehouse_chdb.py failed (chdb is needed: `pip install chdb`): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::read_to_string(&ids)
        .expect("ids written")
        .lines()
        .filter_map(|l| {
            let (id, n) = l.split_once('\t')?;
            Some((id.to_owned(), n.trim().parse().ok()?))
        })
        .collect()
}

fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}
