//! Collector answers: status, headers and body (including `rejected` lists) from raw bytes.
#![no_main]

use std::time::SystemTime;

use eventspool::classify::classify;
use eventspool::HttpResponse;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if data.len() < 2 {
        return;
    }
    let status = u16::from_le_bytes([data[0], data[1]]) % 1000;
    let rest = &data[2..];
    let split = rest.iter().position(|b| *b == 0).unwrap_or(rest.len());
    let header_text = String::from_utf8_lossy(&rest[..split]);
    let headers = header_text
        .lines()
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.to_string(), v.trim().to_string()))
        .collect();
    let body = rest.get(split + 1..).unwrap_or_default().to_vec();
    let _ = classify(
        &Ok(HttpResponse {
            status,
            headers,
            body,
            truncated: data[1] & 1 == 1,
        }),
        SystemTime::now(),
    );
});
