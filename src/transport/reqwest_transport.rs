//! The built-in transport: reqwest over rustls with the ring provider, configured so that the
//! SDK's own retry policy is the only one (no client retries, no redirects followed).

use std::error::Error as _;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Once};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use tokio::time::Instant;

use futures_util::future::BoxFuture;

use super::{HttpRequest, HttpResponse, Transport, TransportError};
use crate::sync::lock;

/// Public (re-exported at the root) so that a tool speaking to a collector in the SDK's name
/// reads each answer as the SDK does: the same read bound, no redirects, no retries of its own.
pub struct ReqwestTransport {
    client: reqwest::Client,
    /// The endpoint parsed once: every request of a spool goes to the same URL, and parsing
    /// it (host, IDNA) was a measurable part of each request's own work.
    parsed: std::sync::Mutex<Option<(String, reqwest::Url)>>,
}

impl ReqwestTransport {
    pub fn new() -> Result<ReqwestTransport, TransportError> {
        install_crypto_provider();
        let client = reqwest::Client::builder()
            // A redirect would send the batch (and the API key) somewhere the app did not name.
            .redirect(reqwest::redirect::Policy::none())
            .retry(reqwest::retry::never())
            .pool_max_idle_per_host(2)
            .build()
            .map_err(|e| TransportError::Tls(describe(&e)))?;
        Ok(ReqwestTransport {
            client,
            parsed: std::sync::Mutex::new(None),
        })
    }

    /// The request's URL, parsed once per endpoint; `None` when it does not parse, for
    /// reqwest to report as it does.
    fn url(&self, text: &str) -> Option<reqwest::Url> {
        let mut parsed = lock(&self.parsed);
        if let Some((known, url)) = parsed.as_ref()
            && known == text
        {
            return Some(url.clone());
        }
        let url = reqwest::Url::parse(text).ok()?;
        *parsed = Some((text.to_string(), url.clone()));
        Some(url)
    }
}

/// reqwest is built without a default crypto provider (ring is smaller than aws-lc-rs in a
/// mobile library); install ring once per process unless the app installed one of its own.
fn install_crypto_provider() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        if rustls::crypto::CryptoProvider::get_default().is_none() {
            let _ = rustls::crypto::ring::default_provider().install_default();
        }
    });
}

impl Transport for ReqwestTransport {
    fn send(
        &self,
        request: HttpRequest,
    ) -> BoxFuture<'static, Result<HttpResponse, TransportError>> {
        let client = self.client.clone();
        let url = self.url(&request.url);
        Box::pin(async move {
            let progress = Arc::new(Progress::new());
            let stall = request.stall_timeout;
            tokio::select! {
                result = exchange(client, url, request, progress.clone()) => result,
                () = progress.stalled(stall) => Err(TransportError::Timeout),
            }
        })
    }
}

/// How many body bytes the connection is handed at a time: each step it takes is progress. The
/// HTTP stack buffers a few steps ahead of the socket, so a small step keeps what counts as
/// "moved" close to what the link has carried.
const UPLOAD_STEP_BYTES: usize = 1024;

/// When a byte last moved, on tokio's clock (time since the attempt began).
struct Progress {
    began: Instant,
    last_nanos: AtomicU64,
}

impl Progress {
    fn new() -> Progress {
        Progress {
            began: Instant::now(),
            last_nanos: AtomicU64::new(0),
        }
    }

    fn moved(&self) {
        let nanos = u64::try_from(self.began.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.last_nanos.fetch_max(nanos, Ordering::Relaxed);
    }

    /// Ends once nothing has moved for `stall`. Bounded: every turn sleeps until the earliest
    /// moment the stall could be complete, and the attempt's ceiling ends the exchange anyway.
    async fn stalled(&self, stall: Duration) {
        loop {
            let last = self.began + Duration::from_nanos(self.last_nanos.load(Ordering::Relaxed));
            let due = last + stall;
            if Instant::now() >= due {
                return;
            }
            tokio::time::sleep_until(due).await;
        }
    }
}

/// The request body, handed to the connection [`UPLOAD_STEP_BYTES`] at a time; its exact
/// length still goes out as `Content-Length`.
struct ProgressBody {
    rest: Bytes,
    progress: Arc<Progress>,
}

impl http_body::Body for ProgressBody {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
        let this = self.get_mut();
        if this.rest.is_empty() {
            return Poll::Ready(None);
        }
        // Asked for the next step: the connection took the last one.
        this.progress.moved();
        let step = this.rest.split_to(this.rest.len().min(UPLOAD_STEP_BYTES));
        Poll::Ready(Some(Ok(http_body::Frame::data(step))))
    }

    fn is_end_stream(&self) -> bool {
        self.rest.is_empty()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        http_body::SizeHint::with_exact(self.rest.len() as u64)
    }
}

/// One request and its bounded answer; every step that moves bytes tells `progress`. The
/// request's `timeout` is the attempt's ceiling.
async fn exchange(
    client: reqwest::Client,
    url: Option<reqwest::Url>,
    request: HttpRequest,
    progress: Arc<Progress>,
) -> Result<HttpResponse, TransportError> {
    let method = reqwest::Method::from_bytes(request.method.as_bytes())
        .map_err(|_| TransportError::Io(format!("bad method {}", request.method)))?;
    let builder = match url {
        Some(url) => client.request(method, url),
        None => client.request(method, &request.url),
    };
    let mut builder = builder.timeout(request.timeout);
    for (name, value) in &request.headers {
        builder = builder.header(name, value);
    }
    let body = reqwest::Body::wrap(ProgressBody {
        rest: Bytes::from(request.body),
        progress: progress.clone(),
    });
    let mut response = builder.body(body).send().await.map_err(map_error)?;
    progress.moved();
    let status = response.status().as_u16();
    let headers = response
        .headers()
        .iter()
        .filter_map(|(k, v)| Some((k.as_str().to_string(), v.to_str().ok()?.to_string())))
        .collect();
    let bound = request.max_response_bytes;
    let mut body = Vec::new();
    let mut truncated = false;
    // Bounded: each turn adds a non-empty chunk until the bound, or ends the loop.
    loop {
        match response.chunk().await {
            Ok(Some(chunk)) => {
                progress.moved();
                let room = bound - body.len();
                if chunk.len() > room {
                    body.extend_from_slice(&chunk[..room]);
                    truncated = true;
                    break;
                }
                body.extend_from_slice(&chunk);
            }
            Ok(None) => break,
            // The status already arrived; a torn body is not the whole answer, and
            // classify treats it so.
            Err(_) => {
                truncated = true;
                break;
            }
        }
    }
    Ok(HttpResponse {
        status,
        headers,
        body,
        truncated,
    })
}

/// Classified by the error's kind and its source chain, never by its words (which hold the
/// URL: `/mtls/v1/batch` is not a TLS failure). "Never sent" (`Connect`, `Tls`) only for a
/// failure of the connector, which runs before any byte of the request is written: the TCP
/// connect, DNS, and the TLS handshake (a rustls error in the chain says which). Anything
/// after that (a connection dropped once the request was on its way, a TLS error mid-stream)
/// may have reached the collector: `Io`, effect unknown.
fn map_error(e: reqwest::Error) -> TransportError {
    let text = describe(&e);
    if e.is_timeout() {
        TransportError::Timeout
    } else if e.is_connect() && caused_by_tls(&e) {
        TransportError::Tls(text)
    } else if e.is_connect() {
        TransportError::Connect(text)
    } else {
        TransportError::Io(text)
    }
}

/// Whether a rustls error is in the source chain. The TLS stream reports it as an `io::Error`
/// (possibly inside another one), which hides what it wraps from `source()`: those are opened.
fn caused_by_tls(e: &reqwest::Error) -> bool {
    fn is_tls(err: &(dyn std::error::Error + 'static)) -> bool {
        if err.is::<rustls::Error>() {
            return true;
        }
        match err
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
        {
            Some(inner) => is_tls(inner),
            None => false,
        }
    }
    let mut next = e.source();
    while let Some(err) = next {
        if is_tls(err) {
            return true;
        }
        next = err.source();
    }
    false
}

/// The error chain in one line. reqwest's messages hold the URL, never headers or the body, so
/// the API key and payloads stay out of it.
fn describe(e: &reqwest::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use std::io::{BufRead, BufReader, Read};
    use std::net::TcpListener;
    use std::time::Duration;

    use super::*;

    fn request(url: String) -> HttpRequest {
        HttpRequest {
            method: "POST".into(),
            url,
            headers: vec![("Content-Type".into(), "application/json".into())],
            body: br#"{"events":[]}"#.to_vec(),
            stall_timeout: Duration::from_secs(5),
            timeout: Duration::from_secs(5),
            max_response_bytes: 1024,
        }
    }

    fn send(url: String) -> Result<HttpResponse, TransportError> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(ReqwestTransport::new().unwrap().send(request(url)))
    }

    /// A server on 127.0.0.1 that reads one whole request (head and body) and closes the
    /// connection without a word: the collector may have stored it.
    fn reads_then_hangs_up() -> (String, std::thread::JoinHandle<()>) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let server = std::thread::spawn(move || {
            let (stream, _) = listener.accept().unwrap();
            let mut reader = BufReader::new(stream);
            let mut length = 0;
            loop {
                let mut line = String::new();
                reader.read_line(&mut line).unwrap();
                if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                    length = v.trim().parse().unwrap();
                }
                if line == "\r\n" {
                    break;
                }
            }
            let mut body = vec![0; length];
            reader.read_exact(&mut body).unwrap();
        });
        (format!("http://127.0.0.1:{port}"), server)
    }

    /// docs/protocol.md §Responses: "never sent" only when no byte of the request can have
    /// left. A connection dropped after the body was read is effect-unknown, whatever the URL
    /// says (`/mtls/` holds "tls"), so `max_event_sends` counts it.
    #[test]
    fn a_dropped_connection_is_effect_unknown_whatever_the_url_says() {
        let (base, server) = reads_then_hangs_up();
        let result = send(format!("{base}/mtls/v1/batch"));
        server.join().unwrap();
        assert!(
            matches!(result, Err(TransportError::Io(_))),
            "the body was read: effect unknown, got {result:?}"
        );
    }

    /// A server on 127.0.0.1 that reads the request body `step` bytes every `pause`, then
    /// answers 200: a slow uplink that keeps moving.
    fn reads_slowly(step: usize, pause: Duration) -> (String, std::thread::JoinHandle<()>) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let server = std::thread::spawn(move || {
            use std::io::Write;
            let (stream, _) = listener.accept().unwrap();
            let mut reader = BufReader::new(stream);
            let mut length = 0;
            loop {
                let mut line = String::new();
                reader.read_line(&mut line).unwrap();
                if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                    length = v.trim().parse().unwrap();
                }
                if line == "\r\n" {
                    break;
                }
            }
            let mut chunk = vec![0; step];
            let mut left: usize = length;
            while left > 0 {
                let n = left.min(step);
                reader.read_exact(&mut chunk[..n]).unwrap();
                left -= n;
                std::thread::sleep(pause);
            }
            let _ = reader
                .get_mut()
                .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}");
        });
        (format!("http://127.0.0.1:{port}"), server)
    }

    /// `stall_timeout` is "no byte moved", not "slow": an upload that takes over twice as long
    /// as it, moving all along, is answered; the same upload under a total deadline of that
    /// length is not. The OS buffers megabytes on loopback, and the answer's wait counts from
    /// the body's last step handed over, so the stall timeout leaves room for them to drain.
    #[test]
    fn a_slow_upload_that_keeps_moving_outlasts_the_stall_timeout() {
        // Far larger than what the OS buffers on loopback, so the reader paces the upload.
        let body = vec![b' '; 16 << 20];
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let transport = ReqwestTransport::new().unwrap();
        let (base, server) = reads_slowly(64 << 10, Duration::from_millis(20));
        let started = std::time::Instant::now();
        let slow = HttpRequest {
            body: body.clone(),
            stall_timeout: Duration::from_secs(2),
            timeout: Duration::from_secs(30),
            ..request(base)
        };
        let result = rt.block_on(transport.send(slow));
        server.join().unwrap();
        let took = started.elapsed();
        assert_eq!(result.map(|r| r.status), Ok(200), "after {took:?}");
        assert!(took > Duration::from_secs(4), "not slow enough: {took:?}");
        let (base, server) = reads_slowly(64 << 10, Duration::from_millis(20));
        let deadline = HttpRequest {
            body,
            stall_timeout: Duration::from_secs(2),
            timeout: Duration::from_secs(2),
            ..request(base)
        };
        let result = rt.block_on(transport.send(deadline));
        drop(rt);
        let _ = server.join();
        assert_eq!(result.map(|r| r.status), Err(TransportError::Timeout));
    }

    /// Nothing listening: refused before any byte left.
    #[test]
    fn a_refused_connection_is_never_sent() {
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let result = send(format!("http://127.0.0.1:{port}/certificate/v1/batch"));
        assert!(
            matches!(result, Err(TransportError::Connect(_))),
            "{result:?}"
        );
    }

    /// A TLS handshake that fails (a plain-HTTP server behind an `https` URL) fails before the
    /// request: never sent, and named as TLS.
    #[test]
    fn a_failed_handshake_is_tls_and_never_sent() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let server = std::thread::spawn(move || {
            use std::io::Write;
            let (mut stream, _) = listener.accept().unwrap();
            let _ = stream.write_all(b"HTTP/1.1 400 Bad Request\r\n\r\n");
        });
        let result = send(format!("https://127.0.0.1:{port}/v1/batch"));
        server.join().unwrap();
        assert!(matches!(result, Err(TransportError::Tls(_))), "{result:?}");
    }
}
