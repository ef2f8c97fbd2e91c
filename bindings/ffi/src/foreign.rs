//! Traits the app implements in Kotlin, Swift or Python, and their adapters onto the core's
//! [`eventspool::DeliveryObserver`] and [`eventspool::Transport`].
//!
//! Every method returns `Result` so that an exception thrown in foreign code (of any type)
//! comes back to Rust as an `Err` instead of a panic; the adapters count or classify it and
//! delivery goes on.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use futures_util::future::BoxFuture;

use super::types::{DeliveryStatus, SpoolNotice};
use eventspool::{Transport, TransportError};

/// What an observer may throw. Any exception is accepted: an undeclared one arrives as
/// `Unexpected`. Either way it is logged, counted in `callback_errors`, and ignored.
#[derive(Debug, thiserror::Error, uniffi::Error)]
pub enum ObserverError {
    #[error("observer failed: {reason}")]
    Failed { reason: String },
    #[error("observer threw: {reason}")]
    Unexpected { reason: String },
}

impl From<uniffi::UnexpectedUniFFICallbackError> for ObserverError {
    fn from(e: uniffi::UnexpectedUniFFICallbackError) -> Self {
        ObserverError::Unexpected { reason: e.reason }
    }
}

/// Told about every state change and, while a retry is scheduled, once a second with the
/// countdown. Runs on an SDK thread with no SDK lock held: hop to the UI thread yourself and
/// return quickly. Any method of the spool may be called from here, `shutdown` included (it
/// then does not wait for the thread the callback runs on).
#[uniffi::export(foreign)]
pub trait DeliveryObserver: Send + Sync {
    fn on_state(&self, status: DeliveryStatus) -> Result<(), ObserverError>;
    fn on_notice(&self, notice: SpoolNotice) -> Result<(), ObserverError>;
}

/// Bridges a foreign observer to the core, counting what it throws.
pub(crate) struct ObserverAdapter {
    pub observer: Arc<dyn DeliveryObserver>,
    pub errors: Arc<AtomicU64>,
}

impl ObserverAdapter {
    fn check(&self, result: Result<(), ObserverError>) {
        if let Err(e) = result {
            self.errors.fetch_add(1, Ordering::Relaxed);
            tracing::warn!("{e}; ignored");
        }
    }
}

impl eventspool::DeliveryObserver for ObserverAdapter {
    fn on_state(&self, status: &eventspool::DeliveryStatus) {
        self.check(self.observer.on_state(status.into()));
    }

    fn on_notice(&self, notice: &eventspool::Notice) {
        self.check(self.observer.on_notice(notice.into()));
    }
}

/// One HTTP request the SDK wants sent (docs/protocol.md §Request: a POST of a gzip or JSON batch).
#[derive(Clone, uniffi::Record)]
pub struct TransportRequest {
    pub method: String,
    pub url: String,
    pub headers: HashMap<String, String>,
    pub body: Vec<u8>,
    /// The ceiling of the whole exchange, however it moves; the SDK gives up on it after that
    /// anyway. A stack that can only set a total deadline uses this one.
    pub timeout_ms: u64,
    /// Fail the exchange with a timeout when no byte moves for this long: as the body goes up,
    /// then while the answer is awaited and read (`attempt_timeout_ms`). A slow link that keeps
    /// moving must not be cut by it. OkHttp: `writeTimeout` and `readTimeout`; URLSession:
    /// `timeoutIntervalForRequest` (which counts from the last data received or sent), with
    /// `timeout_ms` as `timeoutIntervalForResource`. 0 from an older SDK: use `timeout_ms`.
    #[uniffi(default = 0)]
    pub stall_timeout_ms: u64,
    /// Read at most this many bytes of the answer, plus one: the SDK keeps `max_response_bytes`
    /// and takes a longer body as cut short (docs/protocol.md §Read bound), so reading further
    /// only lets a hostile or broken collector fill the app's memory. 0: no bound given.
    #[uniffi(default = 0)]
    pub max_response_bytes: u64,
}

/// Headers are shown by name only, as for [`eventspool::HttpRequest`]: `Authorization` carries the API key.
impl std::fmt::Debug for TransportRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut names: Vec<&str> = self.headers.keys().map(String::as_str).collect();
        names.sort_unstable();
        f.debug_struct("TransportRequest")
            .field("method", &self.method)
            .field("url", &self.url)
            .field("headers", &names)
            .field("body_bytes", &self.body.len())
            .field("timeout_ms", &self.timeout_ms)
            .field("stall_timeout_ms", &self.stall_timeout_ms)
            .field("max_response_bytes", &self.max_response_bytes)
            .finish()
    }
}

/// Any HTTP answer, whatever its status: the SDK classifies it (docs/protocol.md §Responses). Do
/// not follow redirects and do not retry: the SDK is the only layer that retries.
#[derive(Clone, Debug, uniffi::Record)]
pub struct TransportResponse {
    pub status: u16,
    #[uniffi(default)]
    pub headers: HashMap<String, String>,
    #[uniffi(default)]
    pub body: Vec<u8>,
}

/// No HTTP answer came back. Every kind is transient: the batch is retried with the same ids.
#[derive(Debug, thiserror::Error, uniffi::Error)]
pub enum HttpTransportError {
    #[error("could not connect: {reason}")]
    Connect { reason: String },
    #[error("timed out")]
    Timeout,
    #[error("TLS: {reason}")]
    Tls { reason: String },
    #[error("connection failed: {reason}")]
    Io { reason: String },
}

impl From<uniffi::UnexpectedUniFFICallbackError> for HttpTransportError {
    fn from(e: uniffi::UnexpectedUniFFICallbackError) -> Self {
        HttpTransportError::Io {
            reason: format!("transport threw: {}", e.reason),
        }
    }
}

impl From<HttpTransportError> for TransportError {
    fn from(e: HttpTransportError) -> Self {
        match e {
            HttpTransportError::Connect { reason } => TransportError::Connect(reason),
            HttpTransportError::Timeout => TransportError::Timeout,
            HttpTransportError::Tls { reason } => TransportError::Tls(reason),
            HttpTransportError::Io { reason } => TransportError::Io(reason),
        }
    }
}

/// The app's own HTTP stack (OkHttp, URLSession, java.net.http, requests...): the platform's
/// trust store, proxies and pinning. Called on an SDK thread that may block.
#[uniffi::export(foreign)]
pub trait HttpTransport: Send + Sync {
    fn send(&self, request: TransportRequest) -> Result<TransportResponse, HttpTransportError>;
}

/// Runs the foreign call on tokio's blocking pool so the delivery worker's own thread stays free
/// for timers and the attempt timeout.
///
/// A blocking foreign call cannot be cancelled: when the worker gives up on an attempt (its
/// timeout), the call goes on until the app's code returns. So the adapter itself keeps at most
/// one call running: the next attempt waits for the previous call to return (within its own
/// timeout) and then counts as not sent, to be sent again after the backoff; it never starts a
/// second request or a second blocking thread beside it, whatever the transport does with
/// `timeout_ms`, nor a request later than the first poll the SDK's consent check covers.
pub(crate) struct TransportAdapter {
    foreign: Arc<dyn HttpTransport>,
    /// One permit, held by the blocking call from its start until the foreign code returns.
    one_call: Arc<tokio::sync::Semaphore>,
}

impl TransportAdapter {
    pub(crate) fn new(foreign: Arc<dyn HttpTransport>) -> TransportAdapter {
        TransportAdapter {
            foreign,
            one_call: Arc::new(tokio::sync::Semaphore::new(1)),
        }
    }
}

impl Transport for TransportAdapter {
    fn send(
        &self,
        request: eventspool::HttpRequest,
    ) -> BoxFuture<'static, Result<eventspool::HttpResponse, TransportError>> {
        let foreign = self.foreign.clone();
        let one_call = self.one_call.clone();
        let bound = request.max_response_bytes;
        Box::pin(async move {
            let call = TransportRequest {
                method: request.method,
                url: request.url,
                headers: request.headers.into_iter().collect(),
                body: request.body,
                timeout_ms: duration_ms(request.timeout),
                stall_timeout_ms: duration_ms(request.stall_timeout),
                max_response_bytes: bound as u64,
            };
            // The foreign call starts in the first poll, which the SDK makes while it holds
            // the consent check (README §Consent): a call started later could go out after
            // `set_consent(Denied)` returned. So when an abandoned call (one that outlived its
            // attempt) still runs, this attempt waits for it to return and then reports itself
            // not sent; the SDK's backoff sends it again.
            let permit = match one_call.clone().try_acquire_owned() {
                Ok(permit) => permit,
                Err(tokio::sync::TryAcquireError::NoPermits) => {
                    let _ = one_call.acquire().await;
                    return Err(TransportError::Connect(
                        "the app's HTTP transport was still running an abandoned call; \
                         this request was not sent"
                            .into(),
                    ));
                }
                Err(tokio::sync::TryAcquireError::Closed) => {
                    return Err(TransportError::Io(
                        "the app's HTTP transport is closed".into(),
                    ));
                }
            };
            // A panic in the foreign call comes back as the task's `JoinError`; the permit goes
            // with the closure either way.
            let joined = tokio::task::spawn_blocking(move || {
                let _running = permit;
                foreign.send(call)
            })
            .await;
            match joined {
                Ok(Ok(mut response)) => {
                    let truncated = response.body.len() > bound;
                    response.body.truncate(bound);
                    Ok(eventspool::HttpResponse {
                        status: response.status,
                        headers: response.headers.into_iter().collect(),
                        body: response.body,
                        truncated,
                    })
                }
                Ok(Err(e)) => Err(e.into()),
                Err(_) => Err(TransportError::Io(
                    "the app's HTTP transport panicked".into(),
                )),
            }
        })
    }
}

fn duration_ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}
