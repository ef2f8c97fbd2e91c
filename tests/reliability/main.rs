//! Fault tests: crashes, damaged stores, full disks, clock jumps, hostile collectors, fuzzed
//! input, secrets in logs, a concurrency soak, and one model test over the whole engine. RELIABILITY.md lists what each proves.

mod clock_jumps;
mod common;
mod crash;
mod denial;
mod hostile;
mod model;
mod props;
mod secrets;
mod soak;
mod store_faults;

use eventspool_testkit::{reentrant, tinyfs};
