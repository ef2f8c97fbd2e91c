//! Decoding and validating "eventspool batch v1" bodies.
//!
//! Validation is strict (the reference collector is where an SDK encoding bug should surface
//! as a clear 400), but the summary used for request records is lenient, so that a test can
//! still see which ids a rejected body carried.

use std::borrow::Cow;
use std::io::Read;

use flate2::read::MultiGzDecoder;
use serde_json::{Map, Value};

/// The longest event name docs/protocol.md §Event allows.
const MAX_NAME_BYTES: usize = 256;

/// One event of a valid batch.
#[derive(Debug)]
pub(super) struct WireEvent {
    pub event_id: String,
    pub name: String,
    pub timestamp: String,
    pub session_id: Option<String>,
    pub properties: Value,
    /// The event's JSON as sent; filled only for a sink (see [`raw_events`]).
    pub raw: bytes::Bytes,
}

/// Why a body could not be turned into bytes to parse.
#[derive(Debug)]
pub(super) enum DecodeError {
    /// Decoded size passed the limit (413).
    TooLarge(String),
    /// The gzip stream is corrupt (400).
    BadGzip(String),
    /// A Content-Encoding other than gzip or identity (415).
    Unsupported(String),
}

/// Whether a `Content-Encoding` value names gzip (either spelling HTTP allows).
pub(super) fn is_gzip(encoding: &str) -> bool {
    let encoding = encoding.trim();
    encoding.eq_ignore_ascii_case("gzip") || encoding.eq_ignore_ascii_case("x-gzip")
}

/// Undoes `Content-Encoding`, reading at most `limit` decoded bytes. An unencoded body is
/// borrowed, not copied: it can be 64 MiB.
pub(super) fn decode<'a>(
    raw: &'a [u8],
    content_encoding: Option<&str>,
    limit: usize,
) -> Result<Cow<'a, [u8]>, DecodeError> {
    let encoding = content_encoding.map(str::trim).unwrap_or("");
    if encoding.is_empty() || encoding.eq_ignore_ascii_case("identity") {
        return Ok(Cow::Borrowed(raw));
    }
    if !is_gzip(encoding) {
        return Err(DecodeError::Unsupported(format!(
            "unsupported content-encoding {encoding:?}; use gzip or none"
        )));
    }
    let mut out = Vec::new();
    // One byte past the limit tells "exactly at the limit" from "over it".
    let cap = u64::try_from(limit).unwrap_or(u64::MAX).saturating_add(1);
    MultiGzDecoder::new(raw)
        .take(cap)
        .read_to_end(&mut out)
        .map_err(|e| DecodeError::BadGzip(format!("gzip body does not decode: {e}")))?;
    if out.len() > limit {
        return Err(DecodeError::TooLarge(format!(
            "decoded body exceeds {limit} bytes"
        )));
    }
    Ok(Cow::Owned(out))
}

/// Whatever could be read out of a body, valid or not, for the request record.
#[derive(Debug, Default)]
pub(super) struct Summary {
    pub sent_at: Option<String>,
    pub event_ids: Vec<String>,
    pub timestamps: Vec<String>,
    pub names: Vec<String>,
    /// The client reports the body carried (docs/protocol.md §Client reports), as they came:
    /// [`crate::FleetBook`] reads them, and ignores (counts) what it cannot.
    pub reports: Vec<Value>,
}

/// Parses a decoded body. The summary is best effort; the result says whether the body is a
/// valid batch, and if not, names the first problem.
pub(super) fn parse(bytes: &[u8]) -> (Summary, Result<Vec<WireEvent>, String>) {
    let value: Value = match serde_json::from_slice(bytes) {
        Ok(v) => v,
        Err(e) => return (Summary::default(), Err(format!("body is not JSON: {e}"))),
    };
    let summary = summarize(&value);
    (summary, validate(value))
}

fn summarize(value: &Value) -> Summary {
    let text = |v: Option<&Value>| v.and_then(Value::as_str).unwrap_or("").to_owned();
    let mut s = Summary {
        sent_at: value
            .get("sent_at")
            .and_then(Value::as_str)
            .map(str::to_owned),
        ..Summary::default()
    };
    if let Some(reports) = value.get("reports").and_then(Value::as_array) {
        s.reports = reports.clone();
    }
    if let Some(events) = value.get("batch").and_then(Value::as_array) {
        for event in events {
            s.event_ids.push(text(event.get("event_id")));
            s.timestamps.push(text(event.get("timestamp")));
            s.names.push(text(event.get("name")));
        }
    }
    s
}

fn validate(value: Value) -> Result<Vec<WireEvent>, String> {
    let Value::Object(mut top) = value else {
        return Err("body is not a JSON object".into());
    };
    match top.get("sent_at") {
        None => return Err("missing sent_at".into()),
        Some(Value::String(s)) if is_rfc3339(s) => {}
        Some(_) => return Err("sent_at is not an RFC 3339 date-time string".into()),
    }
    let events = match top.remove("batch") {
        Some(Value::Array(events)) => events,
        Some(_) => return Err("batch is not an array".into()),
        None => return Err("missing batch".into()),
    };
    events
        .into_iter()
        .enumerate()
        .map(|(i, event)| match event {
            Value::Object(fields) => event_from(fields).map_err(|e| format!("batch[{i}]: {e}")),
            _ => Err(format!("batch[{i}] is not an object")),
        })
        .collect()
}

fn event_from(mut fields: Map<String, Value>) -> Result<WireEvent, String> {
    let event_id = required_string(&mut fields, "event_id")?;
    if event_id.is_empty() {
        return Err("event_id is empty".into());
    }
    let name = required_string(&mut fields, "name")?;
    if name.is_empty() || name.len() > MAX_NAME_BYTES {
        return Err(format!(
            "name must be 1 to {MAX_NAME_BYTES} bytes, got {}",
            name.len()
        ));
    }
    let timestamp = required_string(&mut fields, "timestamp")?;
    if !is_rfc3339(&timestamp) {
        return Err("timestamp is not an RFC 3339 date-time".into());
    }
    let session_id = match fields.remove("session_id") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s),
        Some(_) => return Err("session_id is not a string".into()),
    };
    let properties = match fields.remove("properties") {
        Some(v @ Value::Object(_)) => v,
        Some(_) => return Err("properties is not a JSON object".into()),
        None => return Err("missing properties".into()),
    };
    Ok(WireEvent {
        event_id,
        name,
        timestamp,
        session_id,
        properties,
        raw: bytes::Bytes::new(),
    })
}

/// The bytes of each element of the body's `batch` array, exactly as sent: what a sink stores,
/// so the stream holds the event the SDK sent and not a re-encoding of it. Only called on a
/// body [`parse`] found valid.
pub(super) fn raw_events(bytes: &[u8]) -> Result<Vec<bytes::Bytes>, String> {
    #[derive(serde::Deserialize)]
    struct Top<'a> {
        #[serde(borrow)]
        batch: Vec<&'a serde_json::value::RawValue>,
    }
    let top: Top<'_> =
        serde_json::from_slice(bytes).map_err(|e| format!("batch cannot be read: {e}"))?;
    Ok(top
        .batch
        .into_iter()
        .map(|raw| bytes::Bytes::copy_from_slice(raw.get().as_bytes()))
        .collect())
}

fn required_string(fields: &mut Map<String, Value>, key: &str) -> Result<String, String> {
    match fields.remove(key) {
        Some(Value::String(s)) => Ok(s),
        Some(_) => Err(format!("{key} is not a string")),
        None => Err(format!("missing {key}")),
    }
}

fn is_rfc3339(s: &str) -> bool {
    chrono::DateTime::parse_from_rfc3339(s).is_ok()
}

#[cfg(test)]
mod wire_tests {
    use super::*;

    #[test]
    fn collector_wire_names_the_first_problem() {
        let bad = |body: &str| parse(body.as_bytes()).1.unwrap_err();
        assert!(bad("[1]").contains("not a JSON object"));
        assert!(bad(r#"{"batch":[]}"#).contains("missing sent_at"));
        assert!(bad(r#"{"sent_at":"x","batch":[]}"#).contains("sent_at"));
        let ts = "2026-11-29T12:00:00.000Z";
        let body = format!(
            r#"{{"sent_at":"{ts}","batch":[{{"event_id":"a","name":"n","timestamp":"{ts}","properties":{{}}}},{{"event_id":"b","name":"n","timestamp":"{ts}","properties":[]}}]}}"#
        );
        let (summary, result) = parse(body.as_bytes());
        assert_eq!(
            result.err().as_deref(),
            Some("batch[1]: properties is not a JSON object")
        );
        assert_eq!(summary.event_ids, ["a", "b"]);
    }

    #[test]
    fn collector_wire_raw_events_are_the_bytes_sent() {
        let body = r#"{ "batch" : [ {"name":"a",  "event_id":"1"} ,{"z":[1, 2]}], "sent_at":"x"}"#;
        let raw = raw_events(body.as_bytes()).unwrap();
        assert_eq!(raw[0], r#"{"name":"a",  "event_id":"1"}"#.as_bytes());
        assert_eq!(raw[1], r#"{"z":[1, 2]}"#.as_bytes());
    }

    #[test]
    fn collector_wire_gzip_is_bounded() {
        use flate2::{Compression, write::GzEncoder};
        use std::io::Write;
        let mut enc = GzEncoder::new(Vec::new(), Compression::fast());
        enc.write_all(&[b'x'; 1000]).unwrap();
        let gz = enc.finish().unwrap();
        assert_eq!(
            decode(&gz, Some("gzip"), 1000).map(|v| v.len()).ok(),
            Some(1000)
        );
        assert!(matches!(
            decode(&gz, Some("gzip"), 999),
            Err(DecodeError::TooLarge(_))
        ));
        assert!(matches!(
            decode(b"nope", Some("gzip"), 10),
            Err(DecodeError::BadGzip(_))
        ));
        assert!(matches!(
            decode(b"x", Some("br"), 10),
            Err(DecodeError::Unsupported(_))
        ));
    }
}
