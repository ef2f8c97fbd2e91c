//! Helpers shared by the workspace's tests and examples, in one place rather than included
//! file by file with `#[path]` across crates. Never published, never linked by an app: the root
//! crate and `eventspool-cli` take it as a dev-dependency.
//!
//! The root crate's tests depend on it while it depends on the root crate (a dev-dependency
//! cycle cargo allows): both see one `eventspool`, built once with the features of the test
//! build, so its types are the same on either side.

/// Drives a failure episode on a stepped clock (the integration and proxy suites).
pub mod episode;
/// The fleet reconnect simulation (`examples/fleet` at full size, `tests/fleet.rs` reduced).
pub mod fleet_sim;
/// A real nginx run by a test (the proxy and topology suites).
pub mod nginx;
/// An observer that calls back into the spool (the integration and reliability suites).
pub mod reentrant;
/// A slow uplink in user space (the integration suite and the benchmarks).
pub mod throttle;
/// A tiny tmpfs that fills mid-write (the reliability and CLI suites).
pub mod tinyfs;
