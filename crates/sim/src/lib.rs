//! Deterministic simulation of eventspool: many devices, each a **real** spool (the real delivery
//! machine, queue and SQLite store on real files), with everything around them simulated and
//! drawn from one seed: time (one clock, no real sleep; each spool's worker is a future the
//! world polls), the network and the collector (`collector`, `net`), the disk (the store's own
//! fault point), crashes and restarts, and the app's verbs at any moment (`plan`). After every
//! step the oracles of `device` check the promises of README and docs/; a failure prints the
//! command that replays it and the steps that matter. RELIABILITY.md §Simulation says what it
//! covers and what it does not.

pub mod clock;
pub mod collector;
pub mod device;
pub mod net;
pub mod plan;
pub mod trace;
pub mod world;

pub use world::{Failure, Params, Report, run, shrink};
