//! A stateless collector process publishing to NATS JetStream, the unit of the topology in the
//! docs/scale.md: run several behind a load balancer, stop or kill any of them.
//!
//! `jetstream_collector --nats URL[,URL...] [--listen ADDR:PORT] [--keys FILE] [--stream NAME]
//!  [--subject SUBJECT] [--reports-stream NAME] [--reports-subject SUBJECT]
//!  [--replicas N] [--max-bytes N] [--max-age-secs N] [--max-msg-size N]
//!  [--duplicate-window-secs N] [--stream-config apply|report]
//!  [--max-in-flight-events N] [--max-batch-events N] [--max-body-bytes N]
//!  [--max-connections N] [--workers N (default 2)] [--request-timeout-ms N] [--ack-timeout-ms N] [--retry-after N]
//!  [--drain-announce-ms N] [--drain-timeout-ms N] [--until-stdin-closes]
//!  [--lone-reports] [--drop-rate F] [--seed N]`
//!
//! Prints the batch URL on the first stdout line (the real port when PORT is 0), then serves
//! until SIGTERM or SIGINT: readiness fails at once, the socket closes after
//! `--drain-announce-ms` (default 5,000, the balancer's health interval and then some),
//! requests in flight finish (their acks), and the process exits 0 within
//! `--drain-timeout-ms` (default 10,000) after that, or 1 if it had to cut requests. With
//! `--until-stdin-closes` stdin's end is a SIGTERM too (a test harness that dies takes its
//! collectors with it).
//!
//! Batches are taken on `POST /v1/batch` only. `GET /livez`, `/readyz` (503 while the broker is
//! unreachable, the in-flight bounds are full, or draining), `/stats`, `/metrics`
//! (Prometheus); with `--keys` (lines `PROJECT KEY`) batches and `/stats`/`/metrics` need
//! `Authorization: Bearer KEY`, and the key's project scopes the dedup (`project:event_id`).
//! `--lone-reports` asks devices to send a waiting client report alone (docs/protocol.md).
//! One log line per acknowledged batch goes to stderr. `--drop-rate` makes that fraction of
//! batches "accepted then dropped" (for tests): published and acknowledged, then the
//! connection is closed without an answer.

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::time::Duration;

use eventspool_collector::{
    ApiKeys, Behavior, CollectorConfig, JetStreamConfig, ReferenceCollector, StreamPolicy,
};

const KNOWN: &str = "--listen, --nats, --keys, --stream, --subject, --reports-stream, \
    --reports-subject, --replicas, --max-bytes, --max-age-secs, --max-msg-size, \
    --duplicate-window-secs, --stream-config, --max-in-flight-events, --max-batch-events, \
    --max-body-bytes, --max-connections, --workers, --request-timeout-ms, --ack-timeout-ms, \
    --retry-after, --drain-announce-ms, --drain-timeout-ms, --until-stdin-closes, \
    --lone-reports, --drop-rate, --seed";

fn main() {
    match run() {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            eprintln!("jetstream_collector: {e}");
            std::process::exit(2);
        }
    }
}

struct Options {
    config: CollectorConfig,
    js: JetStreamConfig,
    announce: Duration,
    drain_timeout: Duration,
    until_stdin_closes: bool,
}

fn parse() -> Result<Options, String> {
    let mut config = CollectorConfig {
        // Nothing reads the request log of a process; keep it from growing.
        max_request_records: 0,
        listen: SocketAddr::from(([127, 0, 0, 1], 8081)),
        batch_path: Some("/v1/batch".into()),
        ..CollectorConfig::default()
    };
    config.limits.workers = 2;
    let mut js = JetStreamConfig::default();
    let mut behavior = Behavior::default();
    let mut announce = Duration::from_secs(5);
    let mut drain_timeout = Duration::from_secs(10);
    let mut until_stdin_closes = false;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        if arg == "--until-stdin-closes" {
            until_stdin_closes = true;
            continue;
        }
        if arg == "--lone-reports" {
            behavior.lone_reports = true;
            continue;
        }
        let value = args.next().ok_or_else(|| format!("{arg} needs a value"))?;
        let number = |text: &str| {
            text.parse::<u64>()
                .map_err(|e| format!("{arg} '{text}': {e}"))
        };
        let ms = |text: &str| number(text).map(Duration::from_millis);
        match arg.as_str() {
            // Any address: behind a balancer on another machine the collector listens on a
            // routable one. Without TLS here, keep it to a private network.
            "--listen" => {
                config.listen = value
                    .parse::<SocketAddr>()
                    .map_err(|e| format!("--listen '{value}': {e}"))?;
            }
            "--nats" => js.url = value,
            "--keys" => config.api_keys = Some(ApiKeys::from_file(value.as_ref())?),
            "--stream" => js.stream = value,
            "--subject" => js.subject = value,
            "--reports-stream" => js.reports_stream = value,
            "--reports-subject" => js.reports_subject = value,
            "--replicas" => js.replicas = number(&value)? as usize,
            "--max-bytes" => {
                js.max_bytes = i64::try_from(number(&value)?).map_err(|e| format!("{arg}: {e}"))?
            }
            "--max-age-secs" => js.max_age = Duration::from_secs(number(&value)?),
            "--max-msg-size" => {
                js.max_msg_size =
                    i32::try_from(number(&value)?).map_err(|e| format!("{arg}: {e}"))?
            }
            "--duplicate-window-secs" => js.duplicate_window = Duration::from_secs(number(&value)?),
            "--stream-config" => {
                js.stream_policy = match value.as_str() {
                    "apply" => StreamPolicy::Apply,
                    "report" => StreamPolicy::Report,
                    other => return Err(format!("--stream-config '{other}': apply or report")),
                }
            }
            "--max-in-flight-events" => js.max_in_flight_events = number(&value)? as usize,
            "--max-batch-events" => config.limits.max_batch_events = number(&value)? as usize,
            "--max-body-bytes" => {
                config.limits.max_body_bytes = number(&value)? as usize;
                config.limits.max_decoded_bytes = config
                    .limits
                    .max_decoded_bytes
                    .max(config.limits.max_body_bytes);
            }
            "--max-connections" => config.limits.max_connections = number(&value)? as usize,
            "--workers" => config.limits.workers = number(&value)? as usize,
            "--request-timeout-ms" => config.limits.request_timeout = ms(&value)?,
            "--ack-timeout-ms" => js.ack_timeout = ms(&value)?,
            "--retry-after" => {
                let secs = u32::try_from(number(&value)?).map_err(|e| format!("{arg}: {e}"))?;
                js.retry_after_secs = secs;
                config.limits.retry_after_secs = secs;
            }
            "--drain-announce-ms" => announce = ms(&value)?,
            "--drain-timeout-ms" => drain_timeout = ms(&value)?,
            "--drop-rate" => {
                let rate: f64 = value.parse().map_err(|e| format!("{arg} '{value}': {e}"))?;
                if !(0.0..=1.0).contains(&rate) {
                    return Err(format!("{arg} '{value}': must be within 0.0..=1.0"));
                }
                behavior.drop_rate = rate;
            }
            "--seed" => behavior.seed = number(&value)?,
            other => return Err(format!("unknown argument '{other}' (known: {KNOWN})")),
        }
    }
    config.behavior = behavior;
    Ok(Options {
        config,
        js,
        announce,
        drain_timeout,
        until_stdin_closes,
    })
}

fn run() -> Result<i32, Box<dyn std::error::Error>> {
    let options = parse()?;
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .with_target(true)
        .with_max_level(tracing::Level::INFO)
        .init();
    let collector = ReferenceCollector::start_jetstream(options.config, &options.js)?;
    let mut out = std::io::stdout().lock();
    writeln!(out, "{}", collector.url())?;
    out.flush()?;
    drop(out);
    let why = wait_for_stop(options.until_stdin_closes)?;
    tracing::info!(target: "eventspool::collector", why, "draining");
    let report = collector.drain(options.announce, options.drain_timeout);
    tracing::info!(
        target: "eventspool::collector",
        elapsed_ms = report.elapsed.as_millis() as u64,
        cut = report.requests_cut,
        requests = report.requests,
        "stopped"
    );
    Ok(if report.requests_cut == 0 { 0 } else { 1 })
}

/// Blocks until SIGTERM, SIGINT or (with `stdin`) the end of stdin; says which.
fn wait_for_stop(stdin: bool) -> std::io::Result<&'static str> {
    let (tx, rx) = std::sync::mpsc::channel();
    if stdin {
        let tx = tx.clone();
        std::thread::spawn(move || {
            let mut sink = [0u8; 256];
            let mut stdin = std::io::stdin().lock();
            while matches!(stdin.read(&mut sink), Ok(n) if n > 0) {}
            let _ = tx.send("stdin closed");
        });
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        use tokio::signal::unix::{SignalKind, signal};
        let mut term = signal(SignalKind::terminate())?;
        let mut int = signal(SignalKind::interrupt())?;
        let (stdin_tx, mut stdin_rx) = tokio::sync::mpsc::unbounded_channel();
        std::thread::spawn(move || {
            if let Ok(why) = rx.recv() {
                let _ = stdin_tx.send(why);
            }
        });
        drop(tx);
        Ok(tokio::select! {
            _ = term.recv() => "SIGTERM",
            _ = int.recv() => "SIGINT",
            Some(why) = stdin_rx.recv() => why,
        })
    })
}
