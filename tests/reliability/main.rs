//! Fault tests: crashes, damaged stores, full disks, clock jumps, hostile collectors, fuzzed
//! input, secrets in logs, and a concurrency soak. RELIABILITY.md lists what each proves.

mod clock_jumps;
mod common;
mod crash;
mod hostile;
mod props;
#[path = "../integration/reentrant.rs"]
mod reentrant;
mod secrets;
mod soak;
mod store_faults;
