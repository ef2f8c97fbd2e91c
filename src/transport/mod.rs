//! The one seam between the SDK and the network: a request goes in, a response or a transport
//! error comes out. The built-in [`ReqwestTransport`] serves desktop, tests and the CLI; a mobile
//! app plugs in its platform stack (OkHttp, URLSession) through the FFI so it gets the system
//! trust store, proxies and background sessions.

#[cfg(feature = "reqwest")]
mod reqwest_transport;

use std::time::Duration;

use futures_util::future::BoxFuture;

#[cfg(feature = "reqwest")]
pub use reqwest_transport::ReqwestTransport;

/// Room in any answer for what is not a `rejected` entry (counts, messages, whitespace), and the
/// whole bound for an answer to a batch of no events: the 64 KiB of docs/protocol.md §Read bound.
pub const RESPONSE_BASE_BYTES: usize = 64 * 1024;

/// The longest `reason` of a rejected event, as encoded in the answer's JSON, that the read bound
/// makes room for: what the quarantine keeps of the collector's words anyway (see `classify`).
pub const MAX_REJECTION_REASON_BYTES: usize = MAX_KEPT_BODY_BYTES;

/// At most this much of a response body is kept with a quarantined event, for triage
/// (`classify` cuts reasons and bodies to it).
pub const MAX_KEPT_BODY_BYTES: usize = 1024;

/// One `rejected` entry besides its reason: `{"event_id":"<36-char UUID>","reason":""},` is 52
/// bytes; the rest is room for whitespace and extra fields a collector may add.
pub const REJECTION_ENTRY_BYTES: usize = 128;

/// How much of the answer to a batch of `events` events is read. A 2xx may list every event of
/// the batch as rejected, so the bound grows with the batch: a 1,000-event batch may be answered
/// with ~1.1 MB that must be read whole, while a hostile collector still cannot make the SDK
/// allocate without bound. An answer longer than this is illegal and comes back cut short
/// ([`HttpResponse::truncated`]).
pub fn response_bound(events: usize) -> usize {
    RESPONSE_BASE_BYTES
        .saturating_add(events.saturating_mul(REJECTION_ENTRY_BYTES + MAX_REJECTION_REASON_BYTES))
}

#[derive(Clone)]
pub struct HttpRequest {
    pub method: String,
    pub url: String,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    /// The attempt fails ([`TransportError::Timeout`]) when no byte moves for this long: none of
    /// the body is taken by the connection while it is uploaded, then none of the answer arrives
    /// (`attempt_timeout_ms`). A slow link that keeps moving is never cut by it; a dead one is.
    pub stall_timeout: Duration,
    /// The ceiling of the whole attempt, however it moves (12 times `stall_timeout`, see
    /// `ATTEMPT_CEILING_FACTOR` in src/wire.rs); the worker enforces it too. A transport that cannot see progress
    /// uses this as its total deadline.
    pub timeout: Duration,
    /// Read at most this many bytes of the answer (`response_bound` of the batch); a transport
    /// that stops there sets [`HttpResponse::truncated`].
    pub max_response_bytes: usize,
}

/// Headers are shown by name only: `Authorization` carries the API key.
impl std::fmt::Debug for HttpRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<&str> = self.headers.iter().map(|(k, _)| k.as_str()).collect();
        f.debug_struct("HttpRequest")
            .field("method", &self.method)
            .field("url", &self.url)
            .field("headers", &names)
            .field("body_bytes", &self.body.len())
            .field("stall_timeout", &self.stall_timeout)
            .field("timeout", &self.timeout)
            .field("max_response_bytes", &self.max_response_bytes)
            .finish()
    }
}

#[derive(Clone, Debug, Default)]
pub struct HttpResponse {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    /// At most the request's `max_response_bytes`.
    pub body: Vec<u8>,
    /// The body is not the whole answer: it went past the bound, or the connection broke while
    /// it was read. A cut 2xx may name refused events in the part not read, so it is never
    /// taken as a success (see `classify`).
    pub truncated: bool,
}

impl HttpResponse {
    /// The first header of that name, case-insensitively.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// Why no HTTP response came back. Every kind is transient (docs/protocol.md §Responses); `Timeout`
/// and `Io` after the body was sent mean the collector may have stored the batch, so the resend
/// carries the same `event_id`s.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TransportError {
    #[error("could not connect: {0}")]
    Connect(String),
    #[error("timed out")]
    Timeout,
    #[error("TLS: {0}")]
    Tls(String),
    #[error("connection failed: {0}")]
    Io(String),
}

pub trait Transport: Send + Sync + 'static {
    fn send(
        &self,
        request: HttpRequest,
    ) -> BoxFuture<'static, Result<HttpResponse, TransportError>>;
}
