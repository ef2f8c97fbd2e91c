//! The reference collector as a separate process, for binding suites (Kotlin, Python) that need
//! a real outage: kill the process and the port refuses connections; start it again on the same
//! port with the same `--db` and the events it stored still count as stored.
//!
//! `collector_process [--listen 127.0.0.1:PORT] [--db PATH] [--script STATUS[:RETRY_AFTER]|pass]...`
//!
//! Each `--script` queues one answer for the next POST, in order (`--script 503:1` is a 503 with
//! `Retry-After: 1`, `pass` handles that one request normally, so a script can let some batches
//! through before answering 503); the requests after the script are handled normally. A suite that needs a
//! collector telling it to come back later uses it (the Android job's `RetryAfter`).
//!
//! Prints the batch URL on the first stdout line (the real port when PORT is 0), then serves
//! until stdin closes or the process is killed. `GET /stats` answers
//! `{"distinct","received","requests"}`.

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use eventspool_collector::{CollectorConfig, ReferenceCollector, Scripted};

fn main() {
    if let Err(e) = run() {
        eprintln!("collector_process: {e}");
        std::process::exit(2);
    }
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let mut config = CollectorConfig::default();
    let mut script = Vec::new();
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = |name: &str| args.next().ok_or_else(|| format!("{name} needs a value"));
        match arg.as_str() {
            "--listen" => {
                let text = value("--listen")?;
                config.listen = text
                    .parse::<SocketAddr>()
                    .map_err(|e| format!("--listen '{text}': {e}"))?;
                if !config.listen.ip().is_loopback() {
                    return Err(
                        format!("--listen '{text}': only loopback addresses are served").into(),
                    );
                }
            }
            "--db" => config.db_path = Some(PathBuf::from(value("--db")?)),
            "--script" => script.push(parse_script(&value("--script")?)?),
            other => {
                return Err(format!(
                    "unknown argument '{other}' (known: --listen ADDR, --db PATH, --script STATUS[:RETRY_AFTER]|pass)"
                )
                .into());
            }
        }
    }
    let collector = ReferenceCollector::start(config)?;
    collector.push_script(script);
    let mut out = std::io::stdout().lock();
    writeln!(out, "{}", collector.url())?;
    out.flush()?;
    drop(out);
    // Serve until the parent closes our stdin (or kills us): no orphan outlives its test run.
    let mut sink = [0u8; 256];
    let mut stdin = std::io::stdin().lock();
    while matches!(stdin.read(&mut sink), Ok(n) if n > 0) {}
    collector.shutdown();
    Ok(())
}

/// `pass`, `STATUS` or `STATUS:RETRY_AFTER` (the header's value as sent, e.g. delta-seconds).
fn parse_script(text: &str) -> Result<Scripted, String> {
    if text == "pass" {
        return Ok(Scripted::Delay(Duration::ZERO));
    }
    let (status, retry_after) = match text.split_once(':') {
        Some((status, retry_after)) => (status, Some(retry_after)),
        None => (text, None),
    };
    let status = status
        .parse::<u16>()
        .ok()
        .filter(|s| (100..=599).contains(s))
        .ok_or_else(|| format!("--script '{text}': 'pass' or a status, a number in 100..=599"))?;
    let headers = match retry_after {
        Some("") => return Err(format!("--script '{text}': Retry-After after ':' is empty")),
        Some(value) => vec![("Retry-After".to_string(), value.to_string())],
        None => Vec::new(),
    };
    Ok(Scripted::Status {
        status,
        body: String::new(),
        headers,
    })
}
