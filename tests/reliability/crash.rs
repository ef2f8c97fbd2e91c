//! Kill -9: a real child process tracks and delivers, is killed with SIGKILL at a seeded random
//! moment (mid-spill, mid-batch, mid-eviction, mid-redrive), and is restarted on the same store.
//! Every event the child reported durable must end up at the collector or still in the store
//! (queue or quarantine); the store must pass `PRAGMA integrity_check` after every kill.
//!
//! `EVENTSPOOL_KILLS=50 cargo test --test reliability crash -- --nocapture` is the full run.

use std::collections::HashSet;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use eventspool_collector::{Behavior, CollectorConfig, ReferenceCollector};

use crate::common::{crash_child, env_count, integrity_ok, seed};

struct Figures {
    kills: u64,
    durable: usize,
    lost: usize,
    corruptions: usize,
    collector_distinct: u64,
    collector_received: u64,
    quarantined: usize,
    disk_cap_drops: u64,
    /// Dead letters the quarantine's share of the cap evicted (persisted `dropped.quarantine_cap`):
    /// a durable event refused by the collector and then evicted from the quarantine is counted
    /// there, not as `disk_cap`.
    quarantine_cap_drops: u64,
}

fn rows(db: &Path, sql: &str) -> HashSet<String> {
    let conn = rusqlite::Connection::open(db).expect("open store for inspection");
    let mut stmt = conn.prepare(sql).expect("prepare");
    stmt.query_map([], |r| r.get::<_, String>(0))
        .expect("query")
        .map(|r| r.expect("row"))
        .collect()
}

fn counter(db: &Path, name: &str) -> u64 {
    let conn = rusqlite::Connection::open(db).expect("open store for inspection");
    conn.query_row("SELECT value FROM counters WHERE name = ?1", [name], |r| {
        r.get::<_, i64>(0)
    })
    .unwrap_or(0) as u64
}

/// Runs one child to completion or to its kill; returns the ids it reported durable.
fn run_child(
    db: &Path,
    url: &str,
    seed: u64,
    mode: &str,
    cap: Option<u64>,
    kill_after: Option<Duration>,
) -> Vec<String> {
    let mut cmd = Command::new(crash_child());
    cmd.arg(db)
        .arg(url)
        .arg(seed.to_string())
        .arg("100000")
        .arg(mode);
    if let Some(cap) = cap {
        cmd.arg(cap.to_string());
    }
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn crash_child");
    let stdout = child.stdout.take().expect("stdout");
    let reader = std::thread::spawn(move || {
        BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
            .collect::<Vec<String>>()
    });
    match kill_after {
        Some(after) => {
            std::thread::sleep(after);
            // SIGKILL: no destructor, no shutdown(), no flush of anything the child holds.
            let _ = child.kill();
        }
        None => {
            let deadline = Instant::now() + Duration::from_secs(90);
            while child.try_wait().ok().flatten().is_none() {
                assert!(Instant::now() < deadline, "child did not finish");
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
    let _ = child.wait();
    reader.join().expect("reader thread")
}

fn kill_loop(
    test: &str,
    kills: u64,
    cap: Option<u64>,
    fail_rate: f64,
    window_ms: std::ops::Range<u64>,
) -> Figures {
    let seed = seed(test);
    let mut rng = fastrand::Rng::with_seed(seed);
    let collector = ReferenceCollector::start(CollectorConfig {
        behavior: Behavior {
            delay: Some(Duration::from_millis(3)),
            partial_reject_name: Some("poison".into()),
            fail_rate,
            seed,
            ..Behavior::default()
        },
        ..CollectorConfig::default()
    })
    .expect("collector");
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("events.db");
    let mut durable = HashSet::new();
    let mut corruptions = 0;
    for k in 0..kills {
        let mode = if rng.bool() { "always" } else { "persist" };
        // Spread kills from "just after open" to "well into delivery" (spill, batches, eviction,
        // redrive all happen within the first few hundred milliseconds).
        let after = Duration::from_millis(rng.u64(window_ms.clone()));
        let ids = run_child(&db, &collector.url(), rng.u64(..), mode, cap, Some(after));
        durable.extend(ids);
        if let Err(e) = integrity_ok(&db) {
            eprintln!("{test}: kill {k}: integrity_check failed: {e}");
            corruptions += 1;
        }
    }
    let queued_before_drain = rows(&db, "SELECT event_id FROM events").len();
    let distinct_ids_before_drain = rows(&db, "SELECT DISTINCT event_id FROM events").len();
    eprintln!(
        "{test}: before the drain the store holds {queued_before_drain} queued rows ({distinct_ids_before_drain} distinct ids), {} bytes, dropped.disk_cap {}",
        eventspool::disk_usage(&db),
        counter(&db, "dropped.disk_cap")
    );
    // A clean last run delivers what the store still holds; poison events stay in quarantine.
    collector.set_behavior(Behavior {
        partial_reject_name: Some("poison".into()),
        ..Behavior::default()
    });
    let last = run_child(&db, &collector.url(), 0, "drain", cap, None);
    assert_eq!(last, vec!["drained".to_string()], "final drain");
    if let Err(e) = integrity_ok(&db) {
        eprintln!("{test}: integrity_check after drain failed: {e}");
        corruptions += 1;
    }
    let delivered: HashSet<String> = collector.events().into_iter().map(|e| e.event_id).collect();
    let quarantined = rows(&db, "SELECT event_id FROM quarantine");
    let queued = rows(&db, "SELECT event_id FROM events");
    let lost = durable
        .iter()
        .filter(|id| {
            !delivered.contains(*id) && !quarantined.contains(*id) && !queued.contains(*id)
        })
        .count();
    let figures = Figures {
        kills,
        durable: durable.len(),
        lost,
        corruptions,
        collector_distinct: collector.distinct_count(),
        collector_received: collector.received_count(),
        quarantined: quarantined.len(),
        disk_cap_drops: counter(&db, "dropped.disk_cap"),
        quarantine_cap_drops: counter(&db, "dropped.quarantine_cap"),
    };
    eprintln!(
        "{test}: kills survived {}, durable {}, lost {}, corruptions {}, collector distinct {} (received {}), quarantined {}, dropped.disk_cap {}, dropped.quarantine_cap {}",
        figures.kills,
        figures.durable,
        figures.lost,
        figures.corruptions,
        figures.collector_distinct,
        figures.collector_received,
        figures.quarantined,
        figures.disk_cap_drops,
        figures.quarantine_cap_drops
    );
    figures
}

#[test]
fn kill_9_loses_nothing_durable() {
    let kills = env_count("EVENTSPOOL_KILLS", 12);
    let f = kill_loop(
        "kill_9_loses_nothing_durable",
        kills,
        // Children track faster than they deliver, so the backlog grows over the runs: a cap
        // far above it keeps eviction out of this loss check (the next test covers eviction).
        Some(256 << 20),
        0.1,
        15..400,
    );
    assert!(
        f.durable > 0,
        "the child reported nothing durable: the test proved nothing"
    );
    assert_eq!(f.corruptions, 0, "store corrupted by a kill");
    assert_eq!(
        f.disk_cap_drops, 0,
        "the cap was meant to be large enough for nothing to be evicted"
    );
    assert_eq!(f.lost, 0, "events reported durable were lost");
    assert!(f.collector_distinct as usize + f.quarantined >= f.durable);
}

/// Same, with a disk cap small enough that eviction runs (and gets killed) constantly: every
/// event missing at the end must be accounted for by the persisted `dropped.disk_cap` counter.
/// The collector fails 90% of requests so the backlog outgrows the 128 KiB cap.
#[test]
fn kill_9_during_eviction_counts_every_drop() {
    let kills = (env_count("EVENTSPOOL_KILLS", 12) / 2).max(4);
    let f = kill_loop(
        "kill_9_during_eviction_counts_every_drop",
        kills,
        Some(128 * 1024),
        0.9,
        // Long enough that each run outgrows the cap even on a loaded machine.
        200..1000,
    );
    assert_eq!(f.corruptions, 0, "store corrupted by a kill");
    assert!(
        f.disk_cap_drops > 0,
        "nothing was evicted: the test proved nothing"
    );
    let evicted = f.disk_cap_drops + f.quarantine_cap_drops;
    assert!(
        f.lost as u64 <= evicted,
        "{} lost but only {evicted} counted as evicted ({} from the queue, {} from the quarantine)",
        f.lost,
        f.disk_cap_drops,
        f.quarantine_cap_drops
    );
}

/// A second process on a store that one process holds is refused with a clear error, and the
/// holder is unaffected.
#[test]
fn second_process_is_refused() {
    let collector = ReferenceCollector::start(CollectorConfig::default()).expect("collector");
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("events.db");
    let mut holder = Command::new(crash_child())
        .arg(&db)
        .arg(collector.url())
        .args(["0", "0", "hold"])
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn holder");
    let mut line = String::new();
    BufReader::new(holder.stdout.take().expect("stdout"))
        .read_line(&mut line)
        .expect("read");
    assert_eq!(line.trim(), "open");
    let second = Command::new(crash_child())
        .arg(&db)
        .arg(collector.url())
        .args(["0", "10", "always"])
        .output()
        .expect("run second");
    let _ = holder.kill();
    let _ = holder.wait();
    let stderr = String::from_utf8_lossy(&second.stderr);
    assert_eq!(
        second.status.code(),
        Some(3),
        "second process was not refused: {stderr}"
    );
    assert!(stderr.contains("already open"), "unclear error: {stderr}");
    assert!(
        stderr.contains(&db.display().to_string()),
        "error does not name the store: {stderr}"
    );
    // After the holder died (SIGKILL), the lock went with it: a new process opens the store.
    let third = Command::new(crash_child())
        .arg(&db)
        .arg(collector.url())
        .args(["0", "3", "always"])
        .output()
        .expect("run third");
    assert!(
        third.status.success(),
        "store still locked after its holder died"
    );
}
