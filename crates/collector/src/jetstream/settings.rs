//! The stream's settings, stated in full by the collector and checked against the broker at
//! start: a stream created by someone else, or with an earlier collector's flags, is brought
//! to these settings (or, with [`StreamPolicy::Report`], the differences are reported) instead
//! of being used as it happens to be.
//!
//! What is unsafe about JetStream's defaults for this stream: one replica (a broker machine
//! lost after the 2xx loses the batch), no `max_bytes`/`max_age` (a stalled loader fills the
//! disk), and `discard = old` (a full stream silently deletes the oldest events, which were
//! acknowledged to devices). With `discard = new` a full stream refuses the publish, the
//! client hears 503 with `Retry-After` and keeps its events.

use std::time::Duration;

use async_nats::jetstream::ErrorCode;
use async_nats::jetstream::stream::{Config, DiscardPolicy, StorageType};
use async_nats::jetstream::{self, context::GetStreamErrorKind};

/// What the collector does with an existing stream whose settings differ from its own.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum StreamPolicy {
    /// Update the stream to the collector's settings (a setting the broker cannot change,
    /// such as the storage type, fails the start naming it).
    #[default]
    Apply,
    /// Leave the stream as it is; log each difference at start and show it in `/stats`.
    Report,
}

/// The settings this collector wants for one stream.
#[derive(Clone, Debug)]
pub(super) struct Wanted {
    pub name: String,
    pub subjects: Vec<String>,
    pub replicas: usize,
    pub max_bytes: i64,
    pub max_age: Duration,
    pub max_msg_size: i32,
    pub duplicate_window: Duration,
}

impl Wanted {
    fn config(&self) -> Config {
        Config {
            name: self.name.clone(),
            subjects: self.subjects.clone(),
            storage: StorageType::File,
            num_replicas: self.replicas,
            max_bytes: self.max_bytes,
            max_age: self.max_age,
            max_message_size: self.max_msg_size,
            discard: DiscardPolicy::New,
            duplicate_window: self.duplicate_window,
            ..Default::default()
        }
    }
}

/// The differences between a stream's settings and the wanted ones, one line each.
fn differences(have: &Config, want: &Config) -> Vec<String> {
    let mut out = Vec::new();
    let mut check = |name: &str, have: String, want: String| {
        if have != want {
            out.push(format!("{name}: {have} (wanted {want})"));
        }
    };
    check(
        "subjects",
        format!("{:?}", have.subjects),
        format!("{:?}", want.subjects),
    );
    check(
        "storage",
        format!("{:?}", have.storage),
        format!("{:?}", want.storage),
    );
    check(
        "num_replicas",
        have.num_replicas.max(1).to_string(),
        want.num_replicas.to_string(),
    );
    check(
        "max_bytes",
        have.max_bytes.to_string(),
        want.max_bytes.to_string(),
    );
    check(
        "max_age",
        format!("{:?}", have.max_age),
        format!("{:?}", want.max_age),
    );
    check(
        "max_message_size",
        have.max_message_size.to_string(),
        want.max_message_size.to_string(),
    );
    check(
        "discard",
        format!("{:?}", have.discard),
        format!("{:?}", want.discard),
    );
    check(
        "duplicate_window",
        format!("{:?}", have.duplicate_window),
        format!("{:?}", want.duplicate_window),
    );
    out
}

/// What [`ensure`] found and did.
#[derive(Clone, Debug, Default)]
pub(super) struct Outcome {
    /// `created`, `unchanged`, `updated` or `differs`.
    pub action: &'static str,
    /// What differed (updated, or only reported).
    pub differences: Vec<String>,
    /// The stream's settings in force now.
    pub replicas: usize,
    pub max_bytes: i64,
    pub max_msg_size: i32,
}

/// Creates the stream, or checks (and with `Apply`, updates) an existing one.
pub(super) async fn ensure(
    context: &jetstream::Context,
    wanted: &Wanted,
    policy: StreamPolicy,
) -> Result<Outcome, String> {
    let want = wanted.config();
    let existing = match context.get_stream(&wanted.name).await {
        Ok(mut stream) => Some(
            stream
                .info()
                .await
                .map_err(|e| format!("stream {} info: {e}", wanted.name))?
                .config
                .clone(),
        ),
        Err(e) => match e.kind() {
            GetStreamErrorKind::JetStream(js) if js.error_code() == ErrorCode::STREAM_NOT_FOUND => {
                None
            }
            _ => return Err(format!("stream {}: {e}", wanted.name)),
        },
    };
    let Some(have) = existing else {
        context
            .create_stream(want.clone())
            .await
            .map_err(|e| format!("creating stream {}: {e}", wanted.name))?;
        return Ok(outcome("created", Vec::new(), &want));
    };
    let differences = differences(&have, &want);
    if differences.is_empty() {
        return Ok(outcome("unchanged", differences, &have));
    }
    match policy {
        StreamPolicy::Apply => {
            context.update_stream(&want).await.map_err(|e| {
                format!(
                    "stream {} differs ({}) and cannot be updated: {e}",
                    wanted.name,
                    differences.join("; ")
                )
            })?;
            Ok(outcome("updated", differences, &want))
        }
        StreamPolicy::Report => Ok(outcome("differs", differences, &have)),
    }
}

fn outcome(action: &'static str, differences: Vec<String>, config: &Config) -> Outcome {
    Outcome {
        action,
        differences,
        replicas: config.num_replicas.max(1),
        max_bytes: config.max_bytes,
        max_msg_size: config.max_message_size,
    }
}
