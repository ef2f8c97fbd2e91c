//! The check at the end of every scenario: a consumer that reads the whole stream, the way a
//! warehouse loader would, and what it found.

use std::collections::BTreeMap;
use std::time::Duration;

use async_nats::jetstream::{self, consumer::pull::OrderedConfig};
use futures_util::StreamExt;

/// Bounds each wait for the next message; the stream is complete when read.
const READ_TIMEOUT: Duration = Duration::from_secs(20);

/// What the stream holds.
pub struct Contents {
    /// Messages in the stream.
    pub messages: u64,
    /// Copies per `event_id` (read from the payload), and whether `Nats-Msg-Id` matched it.
    pub copies: BTreeMap<String, u64>,
    /// Messages whose `Nats-Msg-Id` header was missing or differed from
    /// `project:event_id` (the project from the `Eventspool-Project` header).
    pub id_mismatches: u64,
    /// Each message's payload as stored, by sequence.
    pub payloads: Vec<bytes::Bytes>,
    /// Each message's project header, by sequence.
    pub projects: Vec<String>,
    headers: Vec<Option<String>>,
}

/// Totals every client report in `stream` once per (install, report id), as the fleet's
/// reader downstream does.
pub fn read_reports(url: &str, stream: &str) -> (u64, eventspool_collector::FleetTotals) {
    let contents = read_all_raw(url, stream);
    let mut book = eventspool_collector::FleetBook::default();
    for payload in &contents.payloads {
        let report: serde_json::Value = serde_json::from_slice(payload).expect("report JSON");
        book.add(&report);
    }
    (contents.messages, book.totals())
}

/// Reads every message of `stream` with an ordered consumer (from the first sequence).
pub fn read_all(url: &str, stream: &str) -> Contents {
    let mut contents = read_all_raw(url, stream);
    let pairs: Vec<(String, bool)> = contents
        .payloads
        .iter()
        .zip(&contents.projects)
        .zip(&contents.headers)
        .map(|((payload, project), header)| {
            let event: serde_json::Value =
                serde_json::from_slice(payload).expect("payload is an event as JSON");
            let id = event["event_id"].as_str().expect("event_id").to_owned();
            let matches = header.as_deref() == Some(format!("{project}:{id}").as_str());
            (id, matches)
        })
        .collect();
    for (id, matches) in pairs {
        if !matches {
            contents.id_mismatches += 1;
        }
        *contents.copies.entry(id).or_insert(0) += 1;
    }
    contents
}

/// Every message's payload and headers, unread.
fn read_all_raw(url: &str, stream: &str) -> Contents {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        let urls: Vec<&str> = url.split(',').collect();
        let client = async_nats::connect(urls.as_slice())
            .await
            .expect("connect to read the stream");
        let context = jetstream::new(client);
        // A cluster that has just lost and re-elected a stream leader can time out the API
        // requests below for a few seconds; each is asked again a bounded number of times.
        let mut last_error = String::new();
        let mut opened = None;
        for _ in 0..API_ATTEMPTS {
            match open_ordered(&context, stream).await {
                Ok(ready) => {
                    opened = Some(ready);
                    break;
                }
                Err(e) => {
                    last_error = e;
                    tokio::time::sleep(API_PAUSE).await;
                }
            }
        }
        let (messages, mut reading) = opened.unwrap_or_else(|| {
            panic!("ordered consumer of {stream}: {API_ATTEMPTS} attempts, last: {last_error}")
        });
        let mut contents = Contents {
            messages,
            copies: BTreeMap::new(),
            id_mismatches: 0,
            payloads: Vec::new(),
            projects: Vec::new(),
            headers: Vec::new(),
        };
        for _ in 0..messages {
            let message = tokio::time::timeout(READ_TIMEOUT, reading.next())
                .await
                .unwrap_or_else(|_| panic!("stream read stalled; {messages} messages expected"))
                .expect("stream ended early")
                .expect("message");
            let header = |name: &str| {
                message
                    .headers
                    .as_ref()
                    .and_then(|h| h.get(name))
                    .map(|v| v.as_str().to_owned())
            };
            contents.headers.push(header("Nats-Msg-Id"));
            contents
                .projects
                .push(header(eventspool_collector::PROJECT_HEADER).unwrap_or_default());
            contents.payloads.push(message.payload.clone());
        }
        contents
    })
}

/// How often, and how far apart, the reader asks the cluster again for the stream and its consumer.
const API_ATTEMPTS: u32 = 10;
const API_PAUSE: Duration = Duration::from_millis(1_000);

/// The stream's message count and an ordered consumer's messages, from the first sequence.
async fn open_ordered(
    context: &jetstream::Context,
    stream: &str,
) -> Result<(u64, jetstream::consumer::pull::Ordered), String> {
    let mut handle = context
        .get_stream(stream)
        .await
        .map_err(|e| format!("stream: {e}"))?;
    let messages = handle
        .info()
        .await
        .map_err(|e| format!("stream info: {e}"))?
        .state
        .messages;
    let consumer = handle
        .create_consumer(OrderedConfig::default())
        .await
        .map_err(|e| format!("ordered consumer: {e}"))?;
    let reading = consumer
        .messages()
        .await
        .map_err(|e| format!("consume: {e}"))?;
    Ok((messages, reading))
}
