//! A desktop tool that records its own usage and survives being run offline.
//!
//! Each run tracks a few usage events into a store on disk. When the collector is unreachable
//! the events simply wait in the store; the next run that finds the collector delivers them too,
//! with their original ids and timestamps.
//!
//! ```sh
//! cargo run --example desktop_tool                      # no collector yet: events kept on disk
//! eventspool collector --listen 127.0.0.1:8080 &        # start one
//! cargo run --example desktop_tool                      # this run's events and the backlog go out
//! cargo run --example desktop_tool -- --db my.db --endpoint https://collector.example/v1/batch
//! ```

use std::path::PathBuf;
use std::time::{Duration, Instant};

use eventspool::{Config, DeliveryState, EventSpool};
use serde_json::json;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut endpoint = "http://127.0.0.1:8080/v1/batch".to_string();
    let mut db = std::env::temp_dir()
        .join("eventspool-desktop-tool")
        .join("usage.db");
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--endpoint" => endpoint = args.next().ok_or("--endpoint needs a URL")?,
            "--db" => db = PathBuf::from(args.next().ok_or("--db needs a path")?),
            other => {
                return Err(format!("unknown argument {other}; see the example's header").into());
            }
        }
    }
    if let Some(parent) = db.parent() {
        std::fs::create_dir_all(parent)?;
    }

    let mut config = Config::new(endpoint.clone());
    config.db_path = Some(db.clone());
    // A short-lived tool: a couple of quick tries, then leave the rest for the next run.
    config.max_auto_attempts = 2;
    config.backoff_base_ms = 200;
    config.backoff_cap_ms = 500;
    config.attempt_timeout_ms = 3000;
    config.min_batch_interval_ms = 0;
    let spool = EventSpool::open(config)?;
    let restored = spool.stats().restored;

    let started = Instant::now();
    spool.track(
        "tool_started",
        json!({"version": env!("CARGO_PKG_VERSION"), "os": std::env::consts::OS}),
    )?;
    let words = do_the_work();
    spool.track(
        "command_run",
        json!({"command": "count-words", "words": words}),
    )?;
    spool.track(
        "tool_exited",
        json!({"duration_ms": started.elapsed().as_millis() as u64}),
    )?;

    // Give delivery a moment; whatever does not go out stays in the store for the next run.
    spool.flush();
    let end = spool.wait_for(Duration::from_secs(5), |st| {
        (st.pending == 0 && st.state == DeliveryState::Idle)
            || matches!(
                st.state,
                DeliveryState::WaitingForUser { .. } | DeliveryState::Paused { .. }
            )
    });
    let stats = spool.stats();
    spool.shutdown(Duration::from_secs(5))?;
    let state = end.map_or("timeout", |st| st.state.name());
    eprintln!(
        "usage events: {restored} from earlier runs, 3 from this run; delivered {}, kept in {} for next time: {} ({state})",
        stats.delivered,
        db.display(),
        stats.pending
    );
    println!(
        "{}",
        json!({"restored": restored, "delivered": stats.delivered, "pending": stats.pending, "state": state})
    );
    Ok(())
}

/// Stands in for whatever the tool really does.
fn do_the_work() -> usize {
    let text = "events wait on disk while the network is away and leave when it is back";
    text.split_whitespace().count()
}
