//! What one collector process takes on at once, and how long it waits for a client.
//!
//! Every bound turns overload into an answer the SDK knows what to do with: 413 (split the
//! batch), 408, or 503 with `Retry-After` (back off, same ids). A client left waiting until its
//! own attempt timeout is the one outcome a collector must never produce: the device then
//! resends with the effect unknown, and a fleet doing that at once is a retry storm.

use std::time::Duration;

/// The SDK's default batch holds 100 events in at most 512 KiB (`max_batch_events`,
/// `max_batch_bytes`); the defaults leave room for 8× that and no more.
#[derive(Clone, Debug, PartialEq)]
pub struct Limits {
    /// Largest body as sent (compressed or not); a declared `Content-Length` past it is
    /// answered 413 before the body is read, a chunked body as soon as it passes it.
    pub max_body_bytes: usize,
    /// Largest body after gzip decoding (413); bounds a decompression bomb.
    pub max_decoded_bytes: usize,
    /// Most events in one batch (413, so the SDK splits it); a JetStream collector also needs
    /// it at most its [`crate::JetStreamConfig::max_in_flight_events`].
    pub max_batch_events: usize,
    /// Open connections; the next one is answered 503 with `Retry-After` and closed.
    pub max_connections: usize,
    /// POSTs read and handled at once; the next is answered 503 with `Retry-After` at once.
    pub max_requests_in_flight: usize,
    /// Bytes of request bodies held at once (declared length, or `max_body_bytes` for a body
    /// without one); a request that does not fit is answered 503 with `Retry-After`. With the
    /// decoded copy and the parsed events, memory stays within a few times this.
    pub max_bytes_in_flight: usize,
    /// The head of a request must arrive within this; a keep-alive connection idle this long
    /// is closed too. Ends trickling clients.
    pub header_read_timeout: Duration,
    /// From a request's head to its answer for everything the collector itself waits on: the
    /// body must arrive within it (else 408) and a broker must acknowledge within it (else
    /// 503). Keep it below the SDK's `attempt_timeout_ms` (10 s) and the balancer's read
    /// timeout. Scripted delays of the reference collector are not cut by it.
    pub request_timeout: Duration,
    /// `Retry-After` (seconds) on the collector's own 503s (connections, requests or bytes
    /// over their bound, a draining process).
    pub retry_after_secs: u32,
    /// Worker threads of the server's runtime. 1 (the default) is a current-thread runtime:
    /// what tests want, answers come in the order their requests arrived, and a test's
    /// `ManualClock` steps race no second thread. The JetStream service runs 2
    /// (`jetstream_collector --workers`). Either way, bodies of 64 KiB or more are decoded and
    /// parsed on the blocking pool, so a large batch never stalls the small ones.
    pub workers: usize,
}

/// Default for [`Limits::max_body_bytes`].
pub const MAX_RAW_BODY_BYTES: usize = 4 << 20;
/// Default for [`Limits::max_decoded_bytes`].
pub const MAX_DECODED_BODY_BYTES: usize = 8 << 20;
/// Default for [`Limits::max_connections`].
pub const MAX_CONNECTIONS: usize = 1024;
/// Default for [`Limits::max_batch_events`]: 10× the SDK's default batch.
pub const MAX_BATCH_EVENTS: usize = 1_000;

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_body_bytes: MAX_RAW_BODY_BYTES,
            max_decoded_bytes: MAX_DECODED_BODY_BYTES,
            max_batch_events: MAX_BATCH_EVENTS,
            max_connections: MAX_CONNECTIONS,
            max_requests_in_flight: 1_024,
            max_bytes_in_flight: 64 << 20,
            header_read_timeout: Duration::from_secs(10),
            request_timeout: Duration::from_secs(8),
            retry_after_secs: 1,
            workers: 1,
        }
    }
}

impl Limits {
    /// Names the first bound that cannot work.
    pub(crate) fn check(&self) -> Result<(), String> {
        let positive = [
            ("max_body_bytes", self.max_body_bytes),
            ("max_decoded_bytes", self.max_decoded_bytes),
            ("max_batch_events", self.max_batch_events),
            ("max_connections", self.max_connections),
            ("max_requests_in_flight", self.max_requests_in_flight),
            ("workers", self.workers),
        ];
        if let Some((name, _)) = positive.iter().find(|(_, v)| *v == 0) {
            return Err(format!("limits.{name} must be at least 1"));
        }
        if self.max_bytes_in_flight < self.max_body_bytes {
            return Err(format!(
                "limits.max_bytes_in_flight ({}) must hold one body of max_body_bytes ({})",
                self.max_bytes_in_flight, self.max_body_bytes
            ));
        }
        if self.header_read_timeout.is_zero() || self.request_timeout.is_zero() {
            return Err("limits.header_read_timeout and request_timeout must be > 0".into());
        }
        Ok(())
    }
}
