//! The request of eventspool batch v1 (docs/protocol.md §Request): the body, built by joining
//! events' stored wire JSON so a resend is byte-identical in its events, and the headers.
//!
//! Public (re-exported at the root) because tools that speak to a collector in the SDK's name,
//! the CLI's `conformance` checks, must send exactly what the delivery worker sends.

use std::cell::RefCell;
use std::io::Write;
use std::time::Duration;

use flate2::write::GzEncoder;
use flate2::{Compress, Compression as Level, Crc, FlushCompress, Status};

use crate::config::{Compression, Config};
use crate::event::format_timestamp;
use crate::transport::{HttpRequest, response_bound};

/// `User-Agent` of every request.
pub const USER_AGENT: &str = concat!("eventspool/", env!("CARGO_PKG_VERSION"));

/// Bodies up to this size are sent as they are: gzip would save little and cost a copy.
pub const GZIP_THRESHOLD_BYTES: usize = 1024;

/// A body's text around its `sent_at`, its events and its reports (see [`batch_body`]).
const SENT_AT_KEY: &[u8] = b"{\"sent_at\":\"";
const BATCH_KEY: &[u8] = b"\",\"batch\":[";
const REPORTS_KEY: &[u8] = b",\"reports\":";

/// `reports` is the JSON array of client reports the request carries (src/fleet), an additive
/// member that a collector which does not know it ignores.
pub fn batch_body<'a>(
    events: impl Iterator<Item = &'a str>,
    sent_at_ms: i64,
    reports: Option<&str>,
) -> Vec<u8> {
    let events: Vec<&str> = events.collect();
    let sent_at = format_timestamp(sent_at_ms);
    // Sized once. Grown from a 4 KiB guess, a drain's 25 KB body took three reallocations, and
    // their page faults (fresh pages zeroed by the kernel) were 6 % of the delivery thread's
    // time in a drain.
    let len = SENT_AT_KEY.len()
        + sent_at.len()
        + BATCH_KEY.len()
        + b"]}".len()
        + events.iter().map(|e| e.len() + 1).sum::<usize>()
        + reports.map_or(0, |r| REPORTS_KEY.len() + r.len());
    let mut body = Vec::with_capacity(len);
    body.extend_from_slice(SENT_AT_KEY);
    body.extend_from_slice(sent_at.as_bytes());
    body.extend_from_slice(BATCH_KEY);
    for (i, event) in events.into_iter().enumerate() {
        if i > 0 {
            body.push(b',');
        }
        body.extend_from_slice(event.as_bytes());
    }
    body.push(b']');
    if let Some(reports) = reports {
        body.extend_from_slice(REPORTS_KEY);
        body.extend_from_slice(reports.as_bytes());
    }
    body.push(b'}');
    body
}

/// The ceiling of one attempt, in `attempt_timeout_ms`: far above it, so a batch on a slow link
/// that keeps moving is not cut (a 100-event batch needs ~50 s at 2 KB/s, under the default
/// 120 s), yet a link that trickles a byte now and then cannot hold the one request in flight
/// for ever. A timeout of either kind teaches a smaller batch (`src/split.rs`).
pub const ATTEMPT_CEILING_FACTOR: u32 = 12;

/// The request that carries `body` (from [`batch_body`], holding `events` events) to
/// `config.endpoint`, as the delivery worker sends it: gzip past [`GZIP_THRESHOLD_BYTES`] when
/// `config.compression` says so, the headers of docs/protocol.md §Request (`attempt` is
/// `X-Eventspool-Attempt`), `attempt_timeout_ms` as the stall timeout under its ceiling, and the
/// read bound of the batch.
pub fn batch_request(
    config: &Config,
    api_key: Option<&str>,
    body: Vec<u8>,
    events: usize,
    attempt: u32,
) -> HttpRequest {
    request_for(config, api_key, encode_body(config, body), events, attempt)
}

/// A batch body as it goes on the wire ([`encode_body`]).
pub struct WireBody {
    bytes: Vec<u8>,
    gzip: bool,
}

/// `body` (from [`batch_body`]) as it goes on the wire: gzip past [`GZIP_THRESHOLD_BYTES`] when
/// `config.compression` says so. Apart from [`request_for`], so a drain can encode the next
/// body while the request before it is on the wire.
pub fn encode_body(config: &Config, body: Vec<u8>) -> WireBody {
    if config.compression == Compression::Gzip && body.len() > GZIP_THRESHOLD_BYTES {
        return WireBody {
            bytes: gzip(&body),
            gzip: true,
        };
    }
    WireBody {
        bytes: body,
        gzip: false,
    }
}

/// [`batch_request`] of a body already encoded.
pub fn request_for(
    config: &Config,
    api_key: Option<&str>,
    body: WireBody,
    events: usize,
    attempt: u32,
) -> HttpRequest {
    let mut headers = vec![
        ("Content-Type".to_string(), "application/json".to_string()),
        ("User-Agent".to_string(), USER_AGENT.to_string()),
        ("X-Eventspool-Attempt".to_string(), attempt.to_string()),
    ];
    if body.gzip {
        headers.push(("Content-Encoding".to_string(), "gzip".to_string()));
    }
    if let Some(key) = api_key {
        headers.push(("Authorization".to_string(), format!("Bearer {key}")));
    }
    HttpRequest {
        method: "POST".into(),
        url: config.endpoint.clone(),
        headers,
        body: body.bytes,
        stall_timeout: Duration::from_millis(config.attempt_timeout_ms),
        timeout: Duration::from_millis(config.attempt_timeout_ms)
            .saturating_mul(ATTEMPT_CEILING_FACTOR),
        max_response_bytes: response_bound(events),
    }
}

thread_local! {
    /// The deflate state of this thread, reset for each body: a new one allocates and zeroes
    /// about 300 KB, which cost a draining worker more than compressing its 25 KB batch did.
    static DEFLATE: RefCell<Option<Compress>> = const { RefCell::new(None) };
}

/// The gzip member header (RFC 1952): deflate, no name or time, "fastest" (XFL 4), OS unknown.
const GZIP_HEADER: [u8; 10] = [0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 4, 255];

/// Gzip at the fastest level: on a phone the radio time saved matters more than the last bytes.
pub fn gzip(body: &[u8]) -> Vec<u8> {
    DEFLATE.with(|state| {
        let mut state = state.borrow_mut();
        let deflate = state.get_or_insert_with(|| Compress::new(Level::fast(), false));
        deflate.reset();
        let mut out = Vec::with_capacity(GZIP_HEADER.len() + body.len() / 3 + 64);
        out.extend_from_slice(&GZIP_HEADER);
        // Each turn gives the stream more room; deflate ends it once the room holds the rest.
        loop {
            out.reserve(4096 + body.len() / 8);
            let read = deflate.total_in() as usize;
            match deflate.compress_vec(&body[read..], &mut out, FlushCompress::Finish) {
                Ok(Status::StreamEnd) => break,
                Ok(Status::Ok | Status::BufError) => {}
                // Only a misuse of the stream fails; the next body starts from a fresh one.
                Err(_) => {
                    *state = None;
                    return fresh_gzip(body);
                }
            }
        }
        let mut crc = Crc::new();
        crc.update(body);
        out.extend_from_slice(&crc.sum().to_le_bytes());
        out.extend_from_slice(&(body.len() as u32).to_le_bytes());
        out
    })
}

/// `body` through a deflate state of its own: what [`gzip`] does if the reused one ever fails.
fn fresh_gzip(body: &[u8]) -> Vec<u8> {
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

    /// The body is allocated once, at its size: a change to what a body holds that leaves the
    /// size out grows it again (a reallocation into fresh pages per request).
    #[test]
    fn body_is_allocated_once_at_its_size() {
        // A drain's batch: 100 events of about 250 bytes.
        let large = format!(
            r#"{{"name":"screen_view","properties":{{"x":"{}"}}}}"#,
            "y".repeat(210)
        );
        let mut events = vec![r#"{"a":1}"#, r#"{"bb":22}"#, r#"{"ccc":333}"#];
        events.extend(std::iter::repeat_n(large.as_str(), 100));
        for reports in [None, Some(r#"[{"report_id":1}]"#)] {
            for n in [0, 1, 2, 3, events.len()] {
                let body = batch_body(events[..n].iter().copied(), 1_764_417_600_123, reports);
                assert!(
                    body.capacity() - body.len() <= 1,
                    "{n} events, reports {reports:?}: {} bytes in a buffer of {}",
                    body.len(),
                    body.capacity()
                );
            }
        }
    }

    fn gunzip(gz: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        flate2::read::GzDecoder::new(gz)
            .read_to_end(&mut out)
            .unwrap();
        out
    }

    /// The deflate state is reused: bodies one after another on one thread, a large
    /// incompressible one among them (several turns of output room), each come back whole.
    #[test]
    fn gzip_reuses_its_state_and_each_body_round_trips() {
        let mut noise = Vec::with_capacity(300_000);
        let mut x = 0x2545_f491_4f6c_dd1du64;
        while noise.len() < 300_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            noise.extend_from_slice(&x.to_le_bytes());
        }
        let bodies: [&[u8]; 5] = [b"{\"a\":1}", &noise, b"", &[b'x'; 50_000], b"{\"b\":2}"];
        for body in bodies {
            assert_eq!(gunzip(&gzip(body)), body);
        }
        assert!(gzip(&[b'x'; 50_000]).len() < 1_000);
        for body in bodies {
            assert_eq!(gzip(body), fresh_gzip(body), "{} bytes", body.len());
        }
    }

    #[test]
    fn a_request_is_gzipped_past_the_threshold_and_carries_the_key() {
        let header = |r: &HttpRequest, name: &str| {
            r.headers
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.clone())
        };
        let mut config = Config::new("http://127.0.0.1:1/v1/batch");
        let small = batch_request(&config, None, vec![b'x'; GZIP_THRESHOLD_BYTES], 1, 1);
        assert_eq!(header(&small, "Content-Encoding"), None);
        assert_eq!(header(&small, "Authorization"), None);
        assert_eq!(header(&small, "X-Eventspool-Attempt").as_deref(), Some("1"));
        assert_eq!(small.max_response_bytes, response_bound(1));
        let large = batch_request(&config, Some("k"), vec![b'x'; 4096], 3, 2);
        assert_eq!(header(&large, "Content-Encoding").as_deref(), Some("gzip"));
        assert_eq!(header(&large, "Authorization").as_deref(), Some("Bearer k"));
        assert_eq!(header(&large, "X-Eventspool-Attempt").as_deref(), Some("2"));
        assert!(large.body.len() < 4096);
        config.compression = Compression::None;
        let plain = batch_request(&config, None, vec![b'x'; 4096], 3, 1);
        assert_eq!(header(&plain, "Content-Encoding"), None);
        assert_eq!(plain.body.len(), 4096);
    }
}
