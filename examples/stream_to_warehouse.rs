//! The warehouse stage's loader: reads a JetStream stream of eventspool events and writes one
//! JSON line per message for ClickHouse (`FORMAT JSONEachRow`), as `warehouse_chdb.py` loads
//! them into a `ReplacingMergeTree ORDER BY (project, event_id)` table (docs/scale.md).
//!
//! `stream_to_warehouse --nats nats://127.0.0.1:4222 [--stream NAME] [--from-seq N]`
//! `stream_to_warehouse --nats URL --reports [--stream EVENTSPOOL_REPORTS]`
//!
//! Reads every message stored when it starts (from `--from-seq`, default 1), then exits;
//! stderr gets `read N messages, last sequence S`. Each line carries the stream sequence, so
//! a loader that restarts resumes from the last one it loaded: what it loads twice, and every
//! copy that came back later than JetStream's `duplicate_window`, the table's merge removes.
//! The project comes from the `Eventspool-Project` header (the key the batch was sent with).
//!
//! With `--reports` it reads the client reports' stream instead and prints the fleet's totals,
//! each report counted once per install however often it was stored (`FleetBook`), as one
//! JSON object.

use std::io::Write;
use std::time::Duration;

use async_nats::jetstream::{self, consumer::DeliverPolicy, consumer::pull::OrderedConfig};
use eventspool_collector::{DEFAULT_PROJECT, FleetBook, PROJECT_HEADER};
use futures_util::StreamExt;
use serde_json::{Value, json};

/// Bounds the wait for each message; the stream's count is known before reading.
const READ_TIMEOUT: Duration = Duration::from_secs(20);

fn main() {
    if let Err(e) = run() {
        eprintln!("stream_to_warehouse: {e}");
        std::process::exit(2);
    }
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let mut url = String::from("nats://127.0.0.1:4222");
    let mut stream = String::from("EVENTSPOOL");
    let mut from: u64 = 1;
    let mut reports = false;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        if arg == "--reports" {
            reports = true;
            if stream == "EVENTSPOOL" {
                stream = "EVENTSPOOL_REPORTS".into();
            }
            continue;
        }
        let mut value = || args.next().ok_or_else(|| format!("{arg} needs a value"));
        match arg.as_str() {
            "--nats" => url = value()?,
            "--stream" => stream = value()?,
            "--from-seq" => {
                let text = value()?;
                from = text
                    .parse()
                    .map_err(|e| format!("--from-seq '{text}': {e}"))?;
                if from == 0 {
                    return Err("--from-seq counts from 1".into());
                }
            }
            other => {
                return Err(format!(
                    "unknown argument '{other}' (known: --nats, --stream, --from-seq, --reports)"
                )
                .into());
            }
        }
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(load(&url, &stream, from, reports))
}

async fn load(
    url: &str,
    stream: &str,
    from: u64,
    reports: bool,
) -> Result<(), Box<dyn std::error::Error>> {
    let client = async_nats::connect(url).await?;
    let context = jetstream::new(client);
    let mut handle = context.get_stream(stream).await?;
    let last = handle.info().await?.state.last_sequence;
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    let mut read = 0u64;
    let mut book = FleetBook::default();
    if last >= from {
        let consumer = handle
            .create_consumer(OrderedConfig {
                deliver_policy: DeliverPolicy::ByStartSequence {
                    start_sequence: from,
                },
                ..OrderedConfig::default()
            })
            .await?;
        let mut messages = consumer.messages().await?;
        loop {
            let message = tokio::time::timeout(READ_TIMEOUT, messages.next())
                .await
                .map_err(|_| format!("no message within {READ_TIMEOUT:?}"))?
                .ok_or("stream ended")??;
            let sequence = message.info().map_err(|e| e.to_string())?.stream_sequence;
            let payload: Value = serde_json::from_slice(&message.payload)?;
            read += 1;
            if reports {
                book.add(&payload);
                if sequence >= last {
                    break;
                }
                continue;
            }
            let event = payload;
            let project = message
                .headers
                .as_ref()
                .and_then(|h| h.get(PROJECT_HEADER))
                .map_or(DEFAULT_PROJECT.to_owned(), |v| v.as_str().to_owned());
            // Properties stay one JSON string: the table is for dedup, not a schema of its own.
            let row = json!({
                "project": project,
                "event_id": event["event_id"],
                "name": event["name"],
                "timestamp": event["timestamp"],
                "session_id": event["session_id"],
                "properties": event["properties"].to_string(),
                "stream_seq": sequence,
            });
            writeln!(out, "{row}")?;
            if sequence >= last {
                break;
            }
        }
    }
    if reports {
        writeln!(out, "{}", book.totals().to_json())?;
    }
    out.flush()?;
    eprintln!("read {read} messages, last sequence {last}");
    Ok(())
}
