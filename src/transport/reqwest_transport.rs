//! The built-in transport: reqwest over rustls with the ring provider, configured so that the
//! SDK's own retry policy is the only one (no client retries, no redirects followed).

use std::error::Error as _;
use std::sync::Once;

use futures_util::future::BoxFuture;

use super::{HttpRequest, HttpResponse, Transport, TransportError};

/// Public (re-exported at the root) so that a tool speaking to a collector in the SDK's name
/// reads each answer as the SDK does: the same read bound, no redirects, no retries of its own.
pub struct ReqwestTransport {
    client: reqwest::Client,
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
        Ok(ReqwestTransport { client })
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
        Box::pin(async move {
            let method = reqwest::Method::from_bytes(request.method.as_bytes())
                .map_err(|_| TransportError::Io(format!("bad method {}", request.method)))?;
            let mut builder = client
                .request(method, &request.url)
                .timeout(request.timeout);
            for (name, value) in &request.headers {
                builder = builder.header(name, value);
            }
            let mut response = builder.body(request.body).send().await.map_err(map_error)?;
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
        })
    }
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
