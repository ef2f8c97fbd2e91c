//! One request, from head to verdict: script first, then the standing [`Behavior`], then the
//! normal store path. Every request leaves exactly one [`RequestRecord`], even when the client
//! goes away mid-way (a drop guard records it as "abandoned").

use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, LengthLimitError, Limited};
use hyper::body::Incoming;
use hyper::header::{self, HeaderMap, HeaderName, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};
use serde_json::json;

use super::sink::{Accepted, Unavailable};
use super::state::Shared;
use super::wire::{self, DecodeError, WireEvent};
use super::{Behavior, MAX_DECODED_BODY_BYTES, MAX_RAW_BODY_BYTES, RequestRecord, Scripted};

const LOG_TARGET: &str = "eventspool::collector";
const ATTEMPT_HEADER: &str = "x-eventspool-attempt";

/// Returned from the service to make hyper close the connection without writing a response.
#[derive(Debug)]
pub(super) struct DropConnection;

impl std::fmt::Display for DropConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("connection dropped on purpose after storing the batch")
    }
}

impl std::error::Error for DropConnection {}

/// What the body turned out to be; decided once, consulted in precedence order.
enum Body {
    Batch(Vec<WireEvent>),
    TooLarge(String),
    Unsupported(String),
    BadGzip(String),
    Invalid(String),
}

/// A response under construction.
struct Reply {
    status: u16,
    body: Bytes,
    headers: Vec<(HeaderName, HeaderValue)>,
}

impl Reply {
    fn json(status: u16, value: serde_json::Value) -> Reply {
        Reply {
            status,
            body: Bytes::from(value.to_string()),
            headers: vec![(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            )],
        }
    }

    fn error(status: u16, message: &str) -> Reply {
        Reply::json(status, json!({ "error": message }))
    }

    fn has(&self, name: &HeaderName) -> bool {
        self.headers.iter().any(|(n, _)| n == name)
    }

    fn into_response(mut self, retry_after: Option<&str>) -> Response<Full<Bytes>> {
        if matches!(self.status, 429 | 503)
            && !self.has(&header::RETRY_AFTER)
            && let Some(v) = retry_after.and_then(|v| HeaderValue::from_str(v).ok())
        {
            self.headers.push((header::RETRY_AFTER, v));
        }
        let mut response = Response::new(Full::new(self.body));
        // Scripted statuses are checked before they get here; 500 covers the impossible rest.
        *response.status_mut() =
            StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let headers = response.headers_mut();
        for (name, value) in self.headers {
            headers.append(name, value);
        }
        response
    }
}

/// The request's record until its verdict; records "abandoned" if dropped before one.
struct Pending {
    shared: Arc<Shared>,
    record: Option<RequestRecord>,
    /// The client reports the body carried, totalled once the batch is stored.
    reports: Vec<serde_json::Value>,
}

impl Pending {
    fn finish(&mut self, status: Option<u16>, outcome: &str) {
        if let Some(mut record) = self.record.take() {
            record.status = status;
            record.outcome = outcome.to_owned();
            tracing::info!(
                target: LOG_TARGET,
                request = record.index,
                status = status.map_or_else(|| "-".to_owned(), |s| s.to_string()),
                events = record.event_ids.len(),
                bytes = record.body_bytes,
                outcome,
                "batch"
            );
            self.shared.record(record);
        }
    }

    fn index(&self) -> usize {
        self.record.as_ref().map_or(0, |r| r.index)
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        self.finish(None, "abandoned");
    }
}

fn header_text(headers: &HeaderMap, name: impl header::AsHeaderName) -> Option<String> {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
}

fn new_record(index: usize, at: Instant, headers: &HeaderMap) -> RequestRecord {
    let content_encoding = header_text(headers, header::CONTENT_ENCODING);
    RequestRecord {
        index,
        at,
        status: None,
        body_bytes: 0,
        decoded_bytes: 0,
        gzip: content_encoding.as_deref().is_some_and(wire::is_gzip),
        attempt: header_text(headers, ATTEMPT_HEADER).and_then(|a| a.trim().parse().ok()),
        authorization: header_text(headers, header::AUTHORIZATION),
        user_agent: header_text(headers, header::USER_AGENT),
        content_type: header_text(headers, header::CONTENT_TYPE),
        sent_at: None,
        event_ids: Vec::new(),
        timestamps: Vec::new(),
        names: Vec::new(),
        outcome: String::new(),
    }
}

/// The hyper service function.
pub(super) async fn handle(
    shared: Arc<Shared>,
    req: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, DropConnection> {
    // A process-level collector is inspected over HTTP by tests in other languages: the bindings
    // suites read the distinct count here instead of linking Rust.
    if req.method() == Method::GET && req.uri().path() == "/stats" {
        let mut stats = serde_json::json!({
            "distinct": shared.distinct_count(),
            "received": shared.received_count(),
            "requests": shared.request_count(),
        });
        if let Some(sink) = shared.sink() {
            stats["sink"] = sink.stats();
        }
        return Ok(Reply::json(200, stats).into_response(None));
    }
    // The fleet's client report totals (docs/protocol.md §Client reports).
    if req.method() == Method::GET && req.uri().path() == "/fleet" {
        let totals = shared.fleet_totals().to_json();
        return Ok(Reply::json(200, totals).into_response(None));
    }
    // Held until the answer is built (or the connection drops): the request is in flight.
    let _in_flight = shared.enter();
    let at = Instant::now();
    let index = shared.next_index();
    let mut pending = Pending {
        shared: Arc::clone(&shared),
        record: Some(new_record(index, at, req.headers())),
        reports: Vec::new(),
    };
    if req.method() != Method::POST {
        let mut reply = Reply::error(405, "only POST is accepted");
        reply
            .headers
            .push((header::ALLOW, HeaderValue::from_static("POST")));
        pending.finish(Some(405), "method not allowed");
        return Ok(reply.into_response(None));
    }
    // Claimed before the body is read so that concurrent requests consume the script in
    // arrival order, not in the order their bodies complete.
    let scripted = shared.pop_script();
    let (parts, body) = req.into_parts();
    let body = read_body(&mut pending, &parts.headers, body).await;

    match scripted {
        Some(Scripted::Status {
            status,
            body,
            headers,
        }) => {
            let reply = scripted_reply(status, body, headers);
            let outcome = if reply.status == status {
                format!("scripted {status}")
            } else {
                format!("scripted invalid status {status}")
            };
            pending.finish(Some(reply.status), &outcome);
            let retry_after = shared.behavior().retry_after;
            Ok(reply.into_response(retry_after.as_deref()))
        }
        None if shared.roll_failure(shared.behavior().drop_rate) => {
            store_then_drop(&shared, &mut pending, &body).await;
            Err(DropConnection)
        }
        Some(Scripted::StoreThenDrop) => {
            store_then_drop(&shared, &mut pending, &body).await;
            Err(DropConnection)
        }
        Some(Scripted::Hang) => {
            pending.finish(None, "hung");
            // Ends only when the connection task is aborted (outage or shutdown).
            std::future::pending().await
        }
        Some(Scripted::RejectAll { reason }) => {
            let reply = match &body {
                Body::Batch(events) => {
                    let rejected: Vec<_> = events
                        .iter()
                        .map(|e| json!({ "event_id": e.event_id, "reason": reason }))
                        .collect();
                    Reply::json(200, json!({ "accepted": 0, "rejected": rejected }))
                }
                _ => Reply::error(400, "scripted rejection of an unreadable batch"),
            };
            let status = reply.status;
            pending.finish(Some(status), "scripted reject all");
            Ok(reply.into_response(None))
        }
        Some(Scripted::Delay(d)) => {
            tokio::time::sleep(d).await;
            Ok(by_behavior(&shared, &mut pending, &parts.headers, body).await)
        }
        Some(Scripted::StoreThenDelay(d)) => {
            let response = by_behavior(&shared, &mut pending, &parts.headers, body).await;
            tokio::time::sleep(d).await;
            Ok(response)
        }
        None if carries_name(&body, shared.behavior().drop_name.as_deref()) => {
            pending.finish(None, "dropped");
            Err(DropConnection)
        }
        None => Ok(by_behavior(&shared, &mut pending, &parts.headers, body).await),
    }
}

/// Whether the batch holds an event with this name (see [`Behavior::drop_name`]).
fn carries_name(body: &Body, name: Option<&str>) -> bool {
    match (body, name) {
        (Body::Batch(events), Some(name)) => events.iter().any(|e| e.name == name),
        _ => false,
    }
}

/// Reads, decodes and validates the body, filling the record's size and summary fields.
async fn read_body(pending: &mut Pending, headers: &HeaderMap, body: Incoming) -> Body {
    let raw = match Limited::new(body, MAX_RAW_BODY_BYTES).collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(e) if e.is::<LengthLimitError>() => {
            // The body was not read to the end; the declared length is the best size known.
            if let Some(record) = pending.record.as_mut() {
                record.body_bytes = header_text(headers, header::CONTENT_LENGTH)
                    .and_then(|l| l.trim().parse().ok())
                    .unwrap_or(MAX_RAW_BODY_BYTES);
            }
            return Body::TooLarge(format!("body exceeds {MAX_RAW_BODY_BYTES} bytes"));
        }
        Err(e) => return Body::Invalid(format!("body could not be read: {e}")),
    };
    let encoding = header_text(headers, header::CONTENT_ENCODING);
    let decoded = wire::decode(&raw, encoding.as_deref(), MAX_DECODED_BODY_BYTES);
    let Some(record) = pending.record.as_mut() else {
        return Body::Invalid("request already answered".into());
    };
    record.body_bytes = raw.len();
    let decoded = match decoded {
        Ok(d) => d,
        Err(DecodeError::TooLarge(m)) => return Body::TooLarge(m),
        Err(DecodeError::BadGzip(m)) => return Body::BadGzip(m),
        Err(DecodeError::Unsupported(m)) => return Body::Unsupported(m),
    };
    record.decoded_bytes = decoded.len();
    let (summary, parsed) = wire::parse(&decoded);
    record.sent_at = summary.sent_at;
    record.event_ids = summary.event_ids;
    record.timestamps = summary.timestamps;
    record.names = summary.names;
    pending.reports = summary.reports;
    match parsed {
        Ok(events) => Body::Batch(events),
        Err(m) => Body::Invalid(m),
    }
}

fn scripted_reply(status: u16, body: String, headers: Vec<(String, String)>) -> Reply {
    // 1xx would confuse the HTTP framing; anything outside 200..=599 is a script mistake.
    if !(200..=599).contains(&status) {
        return Reply::error(500, "invalid scripted status");
    }
    let mut reply = Reply {
        status,
        body: Bytes::from(body),
        headers: Vec::new(),
    };
    for (name, value) in headers {
        match (
            HeaderName::from_bytes(name.as_bytes()),
            HeaderValue::from_str(&value),
        ) {
            (Ok(n), Ok(v)) => reply.headers.push((n, v)),
            _ => {
                tracing::warn!(target: LOG_TARGET, header = %name, "skipping invalid scripted header")
            }
        }
    }
    if !reply.body.is_empty() && !reply.has(&header::CONTENT_TYPE) {
        reply.headers.push((
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        ));
    }
    reply
}

fn bearer_matches(authorization: Option<&str>, key: &str) -> bool {
    authorization
        .and_then(|a| a.trim().split_once(' '))
        .is_some_and(|(scheme, token)| scheme.eq_ignore_ascii_case("bearer") && token.trim() == key)
}

/// The unscripted path, in the precedence order documented on [`Behavior`].
async fn by_behavior(
    shared: &Shared,
    pending: &mut Pending,
    headers: &HeaderMap,
    body: Body,
) -> Response<Full<Bytes>> {
    let behavior = shared.behavior();
    if let Some(d) = behavior.delay {
        tokio::time::sleep(d).await;
    }
    // Re-read after the delay so a test can change behaviour while a request waits.
    let behavior = if behavior.delay.is_some() {
        shared.behavior()
    } else {
        behavior
    };
    let (status, outcome, reply) = verdict(shared, pending, headers, body, &behavior).await;
    pending.finish(Some(status), &outcome);
    reply.into_response(behavior.retry_after.as_deref())
}

async fn verdict(
    shared: &Shared,
    pending: &Pending,
    headers: &HeaderMap,
    body: Body,
    b: &Behavior,
) -> (u16, String, Reply) {
    let fail = |status: u16, outcome: &str, message: &str| {
        (status, outcome.to_owned(), Reply::error(status, message))
    };
    if let Some(key) = &b.required_api_key {
        let auth = header_text(headers, header::AUTHORIZATION);
        if !bearer_matches(auth.as_deref(), key) {
            return fail(401, "unauthorized", "missing or wrong API key");
        }
    }
    if let Body::TooLarge(m) = &body {
        return fail(413, "too large", m);
    }
    let body_bytes = pending.record.as_ref().map_or(0, |r| r.body_bytes);
    if let Some(max) = b.max_body_bytes
        && body_bytes > max
    {
        return fail(
            413,
            "too large",
            &format!("body of {body_bytes} bytes exceeds {max}"),
        );
    }
    if shared.roll_failure(b.fail_rate) {
        return fail(503, "injected 503", "injected failure");
    }
    let events = match body {
        Body::Batch(events) => events,
        Body::TooLarge(m) => return fail(413, "too large", &m),
        Body::Unsupported(m) => return fail(415, "unsupported encoding", &m),
        Body::BadGzip(m) => return fail(400, "bad gzip", &m),
        Body::Invalid(m) => return fail(400, "bad json", &m),
    };
    if let Some(poison) = &b.reject_name
        && events.iter().any(|e| &e.name == poison)
    {
        return fail(400, "poison", "poison event");
    }
    if let Some(property) = &b.reject_property
        && events.iter().any(|e| e.properties.get(property).is_some())
    {
        return fail(400, "poison", "poison property");
    }
    let (rejected, kept): (Vec<&WireEvent>, Vec<&WireEvent>) = events
        .iter()
        .partition(|e| b.partial_reject_name.as_ref() == Some(&e.name));
    let reason = b.partial_reject_reason.as_deref().unwrap_or("invalid name");
    let mut rejected: Vec<(String, String)> = rejected
        .iter()
        .map(|e| (e.event_id.clone(), reason.to_owned()))
        .collect();
    let (new, dup) = match store(shared, &kept, pending.index()).await {
        Ok(Accepted {
            new,
            duplicates,
            rejected: by_sink,
        }) => {
            rejected.extend(by_sink);
            (new, duplicates)
        }
        Err(Stored::Unavailable(u)) => {
            let mut reply = Reply::error(503, &u.message);
            if let Ok(v) = HeaderValue::from_str(&u.retry_after) {
                reply.headers.push((header::RETRY_AFTER, v));
            }
            return (503, "sink unavailable".into(), reply);
        }
        Err(Stored::Failed(e)) => {
            tracing::warn!(target: LOG_TARGET, error = %e, "storing a batch failed");
            return fail(500, "storage error", "storage failed");
        }
    };
    // The batch is stored: its reports count (once each), and the answer says which it read
    // and carries the directives in force.
    let mut body = json!({ "accepted": new, "duplicates": dup });
    if !pending.reports.is_empty() {
        body["reports_seen"] = json!(shared.add_reports(&pending.reports));
        if b.lone_reports {
            body["reports_alone"] = json!(true);
        }
    }
    if let Some(directives) = &b.directives {
        body["directives"] = directives.clone();
    }
    if rejected.is_empty() {
        (200, "stored".into(), Reply::json(200, body))
    } else {
        let rejected: Vec<_> = rejected
            .iter()
            .map(|(id, reason)| json!({ "event_id": id, "reason": reason }))
            .collect();
        body["rejected"] = json!(rejected);
        (200, "partial".into(), Reply::json(200, body))
    }
}

/// Stores the batch, then lets the caller close the connection without an answer.
async fn store_then_drop(shared: &Shared, pending: &mut Pending, body: &Body) {
    if let Body::Batch(events) = body {
        let all: Vec<&WireEvent> = events.iter().collect();
        match store(shared, &all, pending.index()).await {
            Ok(_) => {
                shared.add_reports(&pending.reports);
            }
            Err(Stored::Unavailable(u)) => {
                tracing::warn!(target: LOG_TARGET, error = %u.message, "publishing a dropped batch failed")
            }
            Err(Stored::Failed(e)) => {
                tracing::warn!(target: LOG_TARGET, error = %e, "storing a dropped batch failed")
            }
        }
    }
    pending.finish(None, "dropped");
}

/// Why [`store`] did not store a batch.
enum Stored {
    /// The sink cannot vouch for it: 503 with its `Retry-After`.
    Unavailable(Unavailable),
    /// The local store failed: 500.
    Failed(rusqlite::Error),
}

/// The one place a batch is stored: in the sink when there is one, else the local table.
async fn store(shared: &Shared, events: &[&WireEvent], request: usize) -> Result<Accepted, Stored> {
    match shared.sink() {
        Some(sink) => {
            let accepted = sink.publish(events).await.map_err(Stored::Unavailable)?;
            shared.count_received(accepted.new + accepted.duplicates);
            Ok(accepted)
        }
        None => {
            let (new, duplicates) = shared.store(events, request).map_err(Stored::Failed)?;
            Ok(Accepted {
                new,
                duplicates,
                rejected: Vec::new(),
            })
        }
    }
}
