//! eventspool keeps an app's analytics events safe while it is offline and delivers them when it
//! is back: `track()` never blocks, events wait in memory and spill to a capped SQLite store,
//! a background worker sends them in ordered, throttled batches with ids that never change, and
//! failures follow one visible policy (retry with full jitter, then hand over to the user;
//! refused events to a quarantine).
//!
//! ```no_run
//! use eventspool::{Config, EventSpool};
//! let mut config = Config::new("https://collector.example/v1/batch");
//! config.db_path = Some("events.db".into());
//! let spool = EventSpool::open(config)?;
//! spool.track("screen_view", serde_json::json!({"screen": "home"}))?;
//! # Ok::<(), eventspool::Error>(())
//! ```

pub mod admin;
pub mod classify;
pub mod clock;
pub mod config;
pub mod error;
pub mod event;
pub mod quarantine;
mod queue;
pub mod retry;
mod shared;
pub mod split;
mod spool;
pub mod state;
pub mod stats;
pub mod transport;
mod wire;
mod worker;

#[cfg(feature = "collector")]
pub mod collector;

/// The UniFFI surface for Kotlin, Swift and Python (`bindings/`).
#[cfg(feature = "ffi")]
pub mod ffi;
#[cfg(feature = "ffi")]
uniffi::setup_scaffolding!();

pub use clock::{Clock, ManualClock, SystemClock};
pub use config::{Compression, Config, Durability};
pub use error::{ConfigError, Error, Result};
pub use event::{EventId, NewEvent};
pub use quarantine::{ListFilter, QuarantinedEvent, Selector};
pub use queue::SPILL_BACKLOG_MIN;
pub use queue::disk_usage;
pub use spool::{EventSpool, SpoolBuilder};
pub use state::{DeliveryObserver, DeliveryState, DeliveryStatus, Notice, PauseReason};
pub use stats::{DropReason, Stats};
pub use transport::{HttpRequest, HttpResponse, Transport, TransportError};
