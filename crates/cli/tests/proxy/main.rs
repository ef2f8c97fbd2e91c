//! eventspool behind a real nginx: the SDK and its CLI
//! talk to nginx on 127.0.0.1, which proxies to the reference collector, and each scenario
//! makes nginx answer for the collector the way proxies do in the field: 413 before the body
//! is read, 429/503 from `limit_req`, 502 with the upstream down, 504 after the collector
//! stored the batch, 400 for an oversize header, 401 from a gateway that checks the key.
//!
//! nginx must be installed (`bash .ci/run` installs Debian's package); without it every
//! scenario fails saying so. Each scenario prints one line: requests sent (by nginx's status),
//! events delivered and quarantined — `cargo test --workspace --all-features --test proxy -- --nocapture`.
//! (The suite lives in the CLI's crate: the oversize-header scenario runs the real binary.)

mod harness;
mod scenarios;

use eventspool_testkit::{episode, nginx};
