//! Integration tests: the real spool against the reference collector on 127.0.0.1 and a real
//! SQLite file in a temp dir. One binary with many modules, to link once.

mod common;
mod concurrency;
mod conditions;
mod consent;
mod consent_store;
mod critical;
mod directives;
mod drain;
mod encryption;
mod event_record;
mod failures;
mod fleet_loop;
mod observers;
mod pipeline;
mod policy;
mod quarantine;
mod rig;
mod slowlink;
mod upgrade;
mod wrong_network;

use eventspool_testkit::{episode, reentrant, throttle};
