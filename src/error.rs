//! The public error type. Messages name what is wrong and never carry an API key or an event's
//! payload, so they are safe to log and to show across the FFI.

use std::fmt;

/// A configuration value the SDK refuses, with the README §Configuration name of the field.
#[derive(Clone, Debug, PartialEq, Eq)]
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
    /// The SQLite store failed; the text says which operation.
    #[error("storage: {0}")]
    Storage(String),
    #[error("not found: {0}")]
    NotFound(String),
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
