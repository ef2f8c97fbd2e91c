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
mod buffer;
pub mod classify;
pub mod clock;
pub mod config;
pub mod error;
pub mod event;
pub mod quarantine;
pub mod retry;
mod shared;
pub mod split;
mod spool;
pub mod state;
pub mod stats;
mod store;
pub mod transport;
mod wire;
mod worker;

pub use buffer::SPILL_BACKLOG_MIN;
pub use clock::{Clock, ManualClock, SystemClock};
pub use config::{Compression, Config, Durability};
pub use error::{ConfigError, Error, Result};
pub use event::{EventId, NewEvent};
pub use quarantine::{ListFilter, QuarantinedEvent, Selector};
pub use spool::{EventSpool, SpoolBuilder};
pub use state::{DeliveryObserver, DeliveryState, DeliveryStatus, Notice, PauseReason};
pub use stats::{DropReason, Stats};
pub use store::disk_usage;
pub use transport::{HttpRequest, HttpResponse, Transport, TransportError};
