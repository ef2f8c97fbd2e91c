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

// The public surface is the root re-exports below, plus three modules with an API of their own:
// `admin` (store inspection and quarantine triage without a spool, for tools like the CLI),
// `classify` (docs/protocol.md §Responses as a pure function) and `retry` (docs/delivery.md
// §Retry as pure functions), which simulations and fuzzers drive directly. Everything else is
// internal and may change without notice.
pub mod admin;
pub mod classify;
pub(crate) mod clock;
pub(crate) mod config;
mod consent;
mod control;
pub(crate) mod crypto;
pub(crate) mod error;
pub(crate) mod event;
mod fleet;
mod machine;
mod observers;
pub(crate) mod quarantine;
mod queue;
pub mod retry;
mod setting;
mod shared;
pub(crate) mod split;
mod spool;
pub(crate) mod state;
pub(crate) mod stats;
mod sync;
#[cfg(feature = "test-util")]
mod take_point;
#[cfg(feature = "test-util")]
#[doc(hidden)]
pub mod testing;
pub(crate) mod transport;
mod wire;
mod worker;

pub use classify::Failure;
#[cfg(feature = "test-util")]
pub use clock::ManualClock;
pub use clock::{Clock, Sleep, SystemClock};
#[doc(hidden)]
pub use config::redacted_key;
pub use config::{CONFIG_NAMES, Compression, Config, Durability, SettingValue};
pub use consent::Consent;
#[cfg(feature = "test-util")]
pub use crypto::Aead;
#[doc(hidden)]
pub use crypto::Redact;
pub use crypto::{EncryptionKeys, KEY_BYTES};
pub use error::{ConfigError, Error, Result};
pub use event::{EventId, NewEvent, Priority, format_timestamp};
/// What the SDK would ignore of a 2xx answer's `directives` (docs/protocol.md §Directives).
pub use fleet::directive::problems as directive_problems;
pub use observers::ObserverHandle;
/// The `reason` a quarantined event carries (`Selector::Reason` takes one).
pub use quarantine::reason as quarantine_reason;
pub use quarantine::{ListFilter, QuarantinedEvent, Selector};
pub use queue::SPILL_BACKLOG_MIN;
pub use queue::disk_usage;
#[cfg(feature = "test-util")]
pub use queue::{FaultError, FaultSite, StoreFaults};
pub use spool::{EventSpool, SpoolBuilder};
pub use state::{
    DeferReason, DeliveryConditions, DeliveryObserver, DeliveryState, DeliveryStatus, DrainOutcome,
    Notice, PauseReason,
};
pub use stats::{DirectiveInForce, DropReason, Stats};
#[cfg(feature = "reqwest")]
pub use transport::ReqwestTransport;
pub use transport::{HttpRequest, HttpResponse, Transport, TransportError, response_bound};
pub use wire::{batch_body, batch_request};
