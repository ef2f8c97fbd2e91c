//! The one seam between the SDK and the network: a request goes in, a response or a transport
//! error comes out. The built-in [`ReqwestTransport`] serves desktop, tests and the CLI; a mobile
//! app plugs in its platform stack (OkHttp, URLSession) through the FFI so it gets the system
//! trust store, proxies and background sessions.

mod reqwest_transport;

use std::time::Duration;

use futures_util::future::BoxFuture;

pub use reqwest_transport::ReqwestTransport;

/// Response bodies are read up to this many bytes: enough for any `rejected` list we act on,
/// small enough that a hostile collector cannot make the SDK allocate without bound.
pub const MAX_RESPONSE_BYTES: usize = 64 * 1024;

#[derive(Clone, Debug)]
pub struct HttpRequest {
    pub method: String,
    pub url: String,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    /// The whole attempt must finish within this; the worker enforces it too.
    pub timeout: Duration,
}

#[derive(Clone, Debug, Default)]
pub struct HttpResponse {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    /// At most [`MAX_RESPONSE_BYTES`].
    pub body: Vec<u8>,
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

/// Why no HTTP response came back. Every kind is transient (DESIGN §3); `Timeout` and `Io`
/// after the body was sent mean the collector may have stored the batch, so the resend carries
/// the same `event_id`s.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
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
