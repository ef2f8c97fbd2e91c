//! Helpers shared by the fault tests.

use std::path::PathBuf;
use std::process::Command;

use eventspool::Config;

/// The `crash_child` example binary, built on demand when the test runs alone.
pub fn crash_child() -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    let debug_dir = exe
        .parent()
        .and_then(|p| p.parent())
        .expect("target dir")
        .to_path_buf();
    let bin = debug_dir.join("examples").join("crash_child");
    if !bin.exists() {
        let release = debug_dir.ends_with("release");
        let status = Command::new(env!("CARGO"))
            .args(["build", "--example", "crash_child"])
            .args(release.then_some("--release"))
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .status()
            .expect("cargo build");
        assert!(status.success(), "building crash_child failed");
    }
    bin
}

/// A seed from `EVENTSPOOL_SEED`, or a fresh one; printed so a failing run can be replayed.
pub fn seed(test: &str) -> u64 {
    let seed = std::env::var("EVENTSPOOL_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| fastrand::u64(..));
    eprintln!("{test}: seed {seed} (replay with EVENTSPOOL_SEED={seed})");
    seed
}

pub fn env_count(name: &str, ci_default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(ci_default)
}

/// A config for fast tests: no real backoff seconds, small batches, no throttle.
pub fn fast_config(url: &str) -> Config {
    let mut c = Config::new(url);
    c.min_batch_interval_ms = 0;
    c.flush_at = 1;
    c.flush_interval_ms = 50;
    c.backoff_base_ms = 5;
    c.backoff_cap_ms = 20;
    c
}

/// `PRAGMA integrity_check` on a store file no process holds.
pub fn integrity_ok(db: &std::path::Path) -> Result<(), String> {
    let conn = rusqlite::Connection::open(db).map_err(|e| e.to_string())?;
    let result: String = conn
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .map_err(|e| e.to_string())?;
    if result == "ok" { Ok(()) } else { Err(result) }
}
