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
    /// Messages whose `Nats-Msg-Id` header was missing or differed from the payload's id.
    pub id_mismatches: u64,
}

/// Reads every message of `stream` with an ordered consumer (from the first sequence).
pub fn read_all(url: &str, stream: &str) -> Contents {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        let client = async_nats::connect(url)
            .await
            .expect("connect to read the stream");
        let context = jetstream::new(client);
        let mut handle = context.get_stream(stream).await.expect("stream exists");
        let messages = handle.info().await.expect("stream info").state.messages;
        let consumer = handle
            .create_consumer(OrderedConfig::default())
            .await
            .expect("ordered consumer");
        let mut reading = consumer.messages().await.expect("consume");
        let mut contents = Contents {
            messages,
            copies: BTreeMap::new(),
            id_mismatches: 0,
        };
        for _ in 0..messages {
            let message = tokio::time::timeout(READ_TIMEOUT, reading.next())
                .await
                .unwrap_or_else(|_| panic!("stream read stalled; {messages} messages expected"))
                .expect("stream ended early")
                .expect("message");
            let event: serde_json::Value =
                serde_json::from_slice(&message.payload).expect("payload is an event as JSON");
            let id = event["event_id"].as_str().expect("event_id").to_owned();
            let header = message
                .headers
                .as_ref()
                .and_then(|h| h.get("Nats-Msg-Id"))
                .map(|v| v.as_str().to_owned());
            if header.as_deref() != Some(id.as_str()) {
                contents.id_mismatches += 1;
            }
            *contents.copies.entry(id).or_insert(0) += 1;
        }
        contents
    })
}
