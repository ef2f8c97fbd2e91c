//! The process the kill -9 test (tests/reliability/crash.rs) runs and kills: it tracks events
//! against a collector and prints each `event_id` on stdout once that event is durable, so the
//! parent knows exactly which events the SDK promised to keep.
//!
//! `crash_child DB URL SEED COUNT MODE [MAX_DISK_BYTES]`
//!
//! MODE is `always` (durability = always: durable when `track()` returns), `persist` (durability
//! = spill, `persist()` every few events: durable when `persist()` returns), `drain` (track
//! nothing, deliver what the store holds, shut down cleanly and print `drained`), or `hold`
//! (open the store, print `open`, then sleep: a second process tries the same store meanwhile),
//! or `deny` (track COUNT events carrying `deny-secret-SEED`, persist them, then
//! `set_consent(Denied)`, printing `recorded` and blocking between the denial's record and its
//! delete, where the parent kills it; tests/reliability/denial.rs).
//!
//! Exit codes: 0 done, 3 the store could not be opened (the error is printed on stderr).

use std::io::Write;
use std::time::Duration;

use eventspool::{Config, Durability, EventSpool, Selector};
use serde_json::json;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.len() < 6 {
        eprintln!(
            "usage: crash_child DB URL SEED COUNT always|persist|drain|hold|deny [MAX_DISK_BYTES]"
        );
        std::process::exit(2);
    }
    let (db, url, mode) = (&args[1], &args[2], args[5].as_str());
    let seed: u64 = args[3].parse().unwrap_or(0);
    let count: u64 = args[4].parse().unwrap_or(0);
    let mut config = Config::new(url.clone());
    config.db_path = Some(db.into());
    config.memory_capacity = 20;
    config.flush_at = 5;
    config.flush_interval_ms = 50;
    config.min_batch_interval_ms = 0;
    config.max_batch_events = 10;
    config.backoff_base_ms = 5;
    config.backoff_cap_ms = 50;
    config.max_auto_attempts = 1000;
    config.attempt_timeout_ms = 2000;
    config.compression = eventspool::Compression::None;
    if let Some(cap) = args.get(6).and_then(|c| c.parse().ok()) {
        config.max_disk_bytes = cap;
    }
    if mode == "deny" {
        // Kept, never sent: the denial must delete every one of them.
        config.consent = eventspool::Consent::Pending;
    }
    config.durability = if mode == "always" {
        Durability::Always
    } else {
        Durability::Spill
    };
    let spool = match EventSpool::open(config) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("open failed: {e}");
            std::process::exit(3);
        }
    };
    let mut out = std::io::stdout().lock();
    match mode {
        "hold" => {
            let _ = writeln!(out, "open");
            let _ = out.flush();
            std::thread::sleep(Duration::from_secs(30));
            return;
        }
        "deny" => {
            for i in 0..count {
                let secret = format!("deny-secret-{seed}-{i:05}");
                if let Err(e) = spool.track("private", json!({ "secret": secret })) {
                    eprintln!("track failed: {e}");
                }
            }
            if let Err(e) = spool.persist() {
                eprintln!("persist failed: {e}");
            }
            eventspool::testing::between_denial_record_and_delete(|| {
                let mut out = std::io::stdout().lock();
                let _ = writeln!(out, "recorded");
                let _ = out.flush();
                std::thread::sleep(Duration::from_secs(30));
            });
            let result = spool.set_consent(eventspool::Consent::Denied);
            let _ = writeln!(out, "deleted {result:?}");
            return;
        }
        "drain" => {
            let drained = spool.wait_drained(Duration::from_secs(60));
            let _ = spool.shutdown(Duration::from_secs(5));
            let _ = writeln!(out, "{}", if drained { "drained" } else { "not drained" });
            return;
        }
        _ => {}
    }
    // Under a disk cap, large events make eviction run within the first few hundred events.
    let small_cap = args
        .get(6)
        .and_then(|c| c.parse::<u64>().ok())
        .is_some_and(|c| c < 1 << 20);
    let pad_len = if small_cap { 1500 } else { 100 } + (seed % 200) as usize;
    let pad = "p".repeat(pad_len);
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut unpersisted = Vec::new();
    for i in 0..count {
        // Every 17th event is refused by the collector (it ends in quarantine), and every 150
        // events the quarantine is redriven, so kills also land during redrive. (Redriven events
        // keep their old timestamps and go first; redriving more often than that fills most
        // batches with events the collector refuses again.)
        let name = if i % 17 == 16 { "poison" } else { "crash_test" };
        let id = match spool.track(name, json!({"i": i, "seed": seed, "pad": pad})) {
            Ok(id) => id,
            Err(e) => {
                eprintln!("track failed: {e}");
                continue;
            }
        };
        if mode == "always" {
            let _ = writeln!(out, "{id}");
            let _ = out.flush();
        } else {
            unpersisted.push(id);
            if unpersisted.len() > rng.usize(..8) && spool.persist().is_ok() {
                for id in unpersisted.drain(..) {
                    let _ = writeln!(out, "{id}");
                }
                let _ = out.flush();
            }
        }
        if i % 150 == 149 {
            let _ = spool.quarantine_redrive(&Selector::All);
        }
        if rng.u8(..4) == 0 {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    let _ = spool.shutdown(Duration::from_secs(5));
}
