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

fn map_error(e: reqwest::Error) -> TransportError {
    let text = describe(&e);
    if e.is_timeout() {
        TransportError::Timeout
    } else if text.contains("certificate") || text.contains("tls") || text.contains("TLS") {
        TransportError::Tls(text)
    } else if e.is_connect() {
        TransportError::Connect(text)
    } else {
        TransportError::Io(text)
    }
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
