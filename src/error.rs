//! The public error type. Messages name what is wrong and never carry an API key or an event's
//! payload, so they are safe to log and to show across the FFI.

use std::fmt;

/// A configuration value the SDK refuses, with the docs/configuration.md name of the field.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ConfigError {
    pub field: String,
    pub reason: String,
}

impl ConfigError {
    pub fn new(field: &str, reason: impl Into<String>) -> ConfigError {
        ConfigError {
            field: field.to_string(),
            reason: reason.into(),
        }
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.reason)
    }
}

impl std::error::Error for ConfigError {}

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    #[error("invalid configuration: {0}")]
    Config(#[from] ConfigError),
    /// The event was refused at `track()`; the text names the field.
    #[error("invalid event: {0}")]
    InvalidEvent(String),
    #[error("event is {size} bytes serialized, over max_event_bytes ({limit})")]
    EventTooLarge { size: u64, limit: u64 },
    /// `set_enabled(false)` is in force: the user opted out, nothing is recorded.
    #[error("tracking is disabled")]
    Disabled,
    #[error("the spool is shut down")]
    ShutDown,
    /// Tracking consent is `denied`: nothing is recorded until the app sets it to `pending` or
    /// `granted` again.
    #[error("tracking consent is denied: the event was not recorded")]
    ConsentDenied,
    /// `set_consent(Denied)` is recorded and in force (nothing is sent, `track()` is refused),
    /// but deleting what was kept did not finish: the text says what is left (rows, or the
    /// WAL's old pages while another connection reads the file). The spool tries again in the
    /// background until it is done, and no later grant sends what the denial covered.
    #[error(
        "consent denied and in force, but the kept data is not deleted yet: {0}; the deletion is retried"
    )]
    WipeIncomplete(String),
    /// The SQLite store failed; the text says which operation.
    #[error("storage: {0}")]
    Storage(String),
    /// The built-in HTTP client could not be set up (TLS roots, client options); nothing was
    /// opened. An app with its own HTTP stack passes a [`crate::Transport`] instead.
    #[error("HTTP client: {source}")]
    HttpClient {
        #[source]
        source: crate::transport::TransportError,
    },
    /// The operating system refused a thread or the delivery runtime at `open()` (thread limit,
    /// out of memory); `what` names which. The spool did not open.
    #[error("cannot start {what}: {source}")]
    Runtime {
        what: &'static str,
        #[source]
        source: std::io::Error,
    },
    /// The store holds rows sealed with encryption key `key_id`, and that key was not
    /// supplied or is not the one they were sealed with. Nothing was opened, and the store is
    /// left exactly as it is: supply the key (config `encryption_keys`) and open again.
    #[error("encryption key id {key_id}: {reason}")]
    EncryptionKey { key_id: u32, reason: String },
    #[error("not found: {0}")]
    NotFound(String),
    /// A blocking call made on a thread it would wait for: `deliver_within()` from a delivery
    /// observer, which runs on the worker the drain needs.
    #[error("called on the wrong thread: {0}")]
    WrongThread(String),
    /// A `track_batch` call that could not be recorded whole (more events than memory holds
    /// without a store, or a store that refused the part memory could not hold): nothing of
    /// it was recorded.
    #[error("batch refused, nothing recorded: {0}")]
    BatchRefused(String),
    /// `durability = always` could not put these events in the store (disk full, I/O error, or
    /// no commit within the wait). They are queued in memory and will be delivered (memory keeps
    /// at most `max(memory_capacity, SPILL_BACKLOG_MIN)` such events, the oldest beyond that
    /// dropped as `memory_overflow`), but a crash before the store recovers loses them; the app
    /// that chose `always` decides what that means.
    #[error("tracked in memory only, not durable ({} event(s)): {reason}", event_ids.len())]
    NotDurable {
        event_ids: Vec<crate::EventId>,
        reason: String,
    },
}

impl From<rusqlite::Error> for Error {
    fn from(e: rusqlite::Error) -> Error {
        Error::Storage(e.to_string())
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use std::error::Error as _;

    use super::*;
    use crate::transport::TransportError;

    /// A failure at `open()` that is not the store's says what failed and keeps its cause.
    #[test]
    fn failures_at_open_name_what_failed_and_keep_their_source() {
        let e = Error::HttpClient {
            source: TransportError::Tls("no root certificates".into()),
        };
        assert_eq!(e.to_string(), "HTTP client: TLS: no root certificates");
        assert!(e.source().is_some_and(|s| s.is::<TransportError>()));
        let e = Error::Runtime {
            what: "the spill thread",
            source: std::io::Error::other("thread limit"),
        };
        assert_eq!(e.to_string(), "cannot start the spill thread: thread limit");
        assert!(e.source().is_some_and(|s| s.is::<std::io::Error>()));
    }
}
