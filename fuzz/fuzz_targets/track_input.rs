//! track() input as the bindings hand it over: name, property JSON as a string, optional id,
//! timestamp and session, and a size limit around the real ones.
#![no_main]

use eventspool::NewEvent;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let mut parts = text.split('\u{1}');
    let name = parts.next().unwrap_or_default();
    let props = parts.next().unwrap_or("{}");
    let Ok(props) = serde_json::from_str::<serde_json::Value>(props) else {
        return;
    };
    let mut event = NewEvent::new(name, props);
    event.event_id = parts.next().map(str::to_string);
    event.timestamp = parts.next().map(str::to_string);
    event.session_id = parts.next().map(str::to_string);
    let limit = [64, 1024, 32 * 1024, u64::MAX][data.len() % 4];
    if let Ok(json) = event.to_wire_json(data.len() as i64, limit) {
        assert!(json.len() as u64 <= limit);
    }
});
