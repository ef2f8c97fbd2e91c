//! Retry-After values: seconds, HTTP dates, garbage.
#![no_main]

use std::time::{Duration, SystemTime};

use eventspool::retry::parse_retry_after;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_780_000_000);
    let _ = parse_retry_after(&String::from_utf8_lossy(data), now);
});
