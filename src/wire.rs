//! The request body of eventspool batch v1 (docs/protocol.md §Request), built by joining events'
//! stored wire JSON, so a resend is byte-identical in its events.

use std::io::Write;

use flate2::Compression as Level;
use flate2::write::GzEncoder;

use crate::event::format_timestamp;

/// Bodies up to this size are sent as they are: gzip would save little and cost a copy.
pub const GZIP_THRESHOLD_BYTES: usize = 1024;

/// `reports` is the JSON array of client reports the request carries (src/fleet), an additive
/// member that a collector which does not know it ignores.
pub fn batch_body<'a>(
    events: impl Iterator<Item = &'a str>,
    sent_at_ms: i64,
    reports: Option<&str>,
) -> Vec<u8> {
    let mut body = Vec::with_capacity(4096);
    body.extend_from_slice(b"{\"sent_at\":\"");
    body.extend_from_slice(format_timestamp(sent_at_ms).as_bytes());
    body.extend_from_slice(b"\",\"batch\":[");
    for (i, event) in events.enumerate() {
        if i > 0 {
            body.push(b',');
        }
        body.extend_from_slice(event.as_bytes());
    }
    body.push(b']');
    if let Some(reports) = reports {
        body.extend_from_slice(b",\"reports\":");
        body.extend_from_slice(reports.as_bytes());
    }
    body.push(b'}');
    body
}

/// Gzip at the fastest level: on a phone the radio time saved matters more than the last bytes.
pub fn gzip(body: &[u8]) -> Vec<u8> {
    let mut encoder = GzEncoder::new(Vec::with_capacity(body.len() / 3 + 64), Level::fast());
    // Writing into a Vec cannot fail.
    let _ = encoder.write_all(body);
    encoder.finish().unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    #[test]
    fn body_is_valid_json_and_gzip_round_trips() {
        let body = batch_body([r#"{"a":1}"#, r#"{"b":2}"#].into_iter(), 0, None);
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["sent_at"], "1970-01-01T00:00:00.000Z");
        assert_eq!(v["batch"][1]["b"], 2);
        let mut out = Vec::new();
        flate2::read::GzDecoder::new(&gzip(&body)[..])
            .read_to_end(&mut out)
            .unwrap();
        assert_eq!(out, body);
        let with = batch_body(std::iter::empty(), 0, Some(r#"[{"report_id":1}]"#));
        let v: serde_json::Value = serde_json::from_slice(&with).unwrap();
        assert_eq!(v["batch"], serde_json::json!([]));
        assert_eq!(v["reports"][0]["report_id"], 1);
    }
}
