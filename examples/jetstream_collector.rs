//! A stateless collector process publishing to NATS JetStream, the unit of the topology in the
//! README's "Collecting at scale": run several behind a load balancer, kill any of them.
//!
//! `jetstream_collector --nats nats://127.0.0.1:4222 [--listen 127.0.0.1:PORT] [--stream NAME]
//!  [--subject SUBJECT] [--duplicate-window-secs N] [--ack-timeout-ms N] [--retry-after N]
//!  [--drop-rate F] [--seed N]`
//!
//! Prints the batch URL on the first stdout line (the real port when PORT is 0), then serves
//! until stdin closes or the process is killed. `GET /stats` answers
//! `{"distinct","received","requests","sink":{"batches","stored","duplicates",...}}`; with
//! `RUST_LOG`-free defaults one log line per acknowledged batch goes to stderr.
//! `--drop-rate` makes that fraction of batches "accepted then dropped": published and
//! acknowledged, then the connection is closed without an answer.

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::time::Duration;

use eventspool_collector::{Behavior, CollectorConfig, JetStreamConfig, ReferenceCollector};

fn main() {
    if let Err(e) = run() {
        eprintln!("jetstream_collector: {e}");
        std::process::exit(2);
    }
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let mut config = CollectorConfig {
        // Nothing reads the request log of a process; keep it from growing.
        max_request_records: 0,
        ..CollectorConfig::default()
    };
    let mut js = JetStreamConfig::default();
    let mut behavior = Behavior::default();
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = |name: &str| args.next().ok_or_else(|| format!("{name} needs a value"));
        let number = |name: &str, text: String| {
            text.parse::<u64>()
                .map_err(|e| format!("{name} '{text}': {e}"))
        };
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
            "--nats" => js.url = value("--nats")?,
            "--stream" => js.stream = value("--stream")?,
            "--subject" => js.subject = value("--subject")?,
            "--duplicate-window-secs" => {
                let v = number(&arg, value(&arg)?)?;
                js.duplicate_window = Duration::from_secs(v);
            }
            "--ack-timeout-ms" => {
                let v = number(&arg, value(&arg)?)?;
                js.ack_timeout = Duration::from_millis(v);
            }
            "--retry-after" => {
                let v = number(&arg, value(&arg)?)?;
                js.retry_after_secs = u32::try_from(v).map_err(|e| format!("{arg}: {e}"))?;
            }
            "--drop-rate" => {
                let text = value(&arg)?;
                let rate: f64 = text.parse().map_err(|e| format!("{arg} '{text}': {e}"))?;
                if !(0.0..=1.0).contains(&rate) {
                    return Err(format!("{arg} '{text}': must be within 0.0..=1.0").into());
                }
                behavior.drop_rate = rate;
            }
            "--seed" => behavior.seed = number(&arg, value(&arg)?)?,
            other => {
                return Err(format!(
                    "unknown argument '{other}' (known: --listen, --nats, --stream, --subject, \
                     --duplicate-window-secs, --ack-timeout-ms, --retry-after, --drop-rate, --seed)"
                )
                .into());
            }
        }
    }
    config.behavior = behavior;
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .with_target(true)
        .with_max_level(tracing::Level::INFO)
        .init();
    let collector = ReferenceCollector::start_jetstream(config, &js)?;
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
