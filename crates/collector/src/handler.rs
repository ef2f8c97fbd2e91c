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

use super::admin;
use super::auth::{DEFAULT_PROJECT, bearer_matches};
use super::sink::{Accepted, SinkBatch, SinkEvent, SinkReport, Unavailable};
use super::state::Shared;
use super::wire::{self, DecodeError, WireEvent};
use super::{Behavior, RequestRecord, Scripted};

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
    /// The body did not arrive before the request's deadline (408).
    TimedOut(String),
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
    /// The dedup scope of the batch (its key's project).
    project: String,
    /// Until when the collector waits for the body and for its store or broker.
    deadline: tokio::time::Instant,
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
            self.shared.metrics().answered(status);
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
    let mut response = route(&shared, req).await?;
    // A draining collector answers what it was sent, then closes: the client's next request
    // opens a connection the balancer gives to another collector.
    if shared.draining() {
        response
            .headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    Ok(response)
}

async fn route(
    shared: &Arc<Shared>,
    req: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, DropConnection> {
    let path = req.uri().path().to_owned();
    if let Some(response) = admin::answer(shared, req.method(), &path, req.headers()) {
        return Ok(response);
    }
    if let Some(batch_path) = shared.batch_path()
        && path != batch_path
    {
        let message = format!("no such path; batches go to {batch_path}");
        return Ok(Reply::error(404, &message).into_response(None));
    }
    // Held until the answer is built (or the connection drops): the request is in flight.
    let _in_flight = shared.enter();
    let at = Instant::now();
    let index = shared.next_index();
    let limits = shared.limits().clone();
    let mut pending = Pending {
        shared: Arc::clone(shared),
        record: Some(new_record(index, at, req.headers())),
        reports: Vec::new(),
        project: DEFAULT_PROJECT.to_owned(),
        deadline: tokio::time::Instant::now() + limits.request_timeout,
    };
    if req.method() != Method::POST {
        let mut reply = Reply::error(405, "only POST is accepted");
        reply
            .headers
            .push((header::ALLOW, HeaderValue::from_static("POST")));
        pending.finish(Some(405), "method not allowed");
        return Ok(reply.into_response(None));
    }
    // The service's own bounds come before anything is read or scripted: past them the client
    // hears 503 (or 413) at once instead of waiting for its own timeout.
    let declared = header_text(req.headers(), header::CONTENT_LENGTH)
        .and_then(|l| l.trim().parse::<usize>().ok());
    let retry_after = limits.retry_after_secs.to_string();
    if shared.in_flight() > limits.max_requests_in_flight {
        return Ok(shed(
            &mut pending,
            503,
            "requests",
            "too many requests in flight",
            &retry_after,
        ));
    }
    if let Some(length) = declared
        && length > limits.max_body_bytes
    {
        if let Some(record) = pending.record.as_mut() {
            record.body_bytes = length;
        }
        let message = format!("body of {length} bytes exceeds {}", limits.max_body_bytes);
        // Answered now, read after: the answer goes out at once, and the body the client is
        // still writing is taken and thrown away, so its writes find an open socket.
        tokio::spawn(linger(req.into_body(), pending.deadline));
        return Ok(shed(
            &mut pending,
            413,
            "batch_size",
            &message,
            &retry_after,
        ));
    }
    if let Some(keys) = shared.api_keys() {
        let auth = header_text(req.headers(), header::AUTHORIZATION);
        match keys.project_of(auth.as_deref()) {
            Some(project) => pending.project = project.to_owned(),
            None => {
                pending.finish(Some(401), "unauthorized");
                return Ok(Reply::error(401, "missing or wrong API key").into_response(None));
            }
        }
    }
    let Some(_bytes) = shared.take_bytes(declared.unwrap_or(limits.max_body_bytes)) else {
        return Ok(shed(
            &mut pending,
            503,
            "bytes",
            "request bytes in flight at their bound",
            &retry_after,
        ));
    };
    // Claimed before the body is read so that concurrent requests consume the script in
    // arrival order, not in the order their bodies complete.
    let scripted = shared.pop_script();
    let (parts, body) = req.into_parts();
    let body = read_body(shared, &mut pending, &parts.headers, body).await;

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
            store_then_drop(shared, &mut pending, &body).await;
            Err(DropConnection)
        }
        Some(Scripted::StoreThenDrop) => {
            store_then_drop(shared, &mut pending, &body).await;
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
            // The wait is the script's, not the client's: the deadline starts after it.
            pending.deadline = tokio::time::Instant::now() + limits.request_timeout;
            Ok(by_behavior(shared, &mut pending, &parts.headers, body).await)
        }
        Some(Scripted::StoreThenDelay(d)) => {
            let response = by_behavior(shared, &mut pending, &parts.headers, body).await;
            tokio::time::sleep(d).await;
            Ok(response)
        }
        None if carries_name(&body, shared.behavior().drop_name.as_deref()) => {
            pending.finish(None, "dropped");
            Err(DropConnection)
        }
        None => Ok(by_behavior(shared, &mut pending, &parts.headers, body).await),
    }
}

/// A request refused by one of the service's bounds, counted under it.
fn shed(
    pending: &mut Pending,
    status: u16,
    bound: &str,
    message: &str,
    retry_after: &str,
) -> Response<Full<Bytes>> {
    pending.shared.metrics().shed(bound);
    let outcome = if status == 413 {
        "too large"
    } else {
        "overloaded"
    };
    pending.finish(Some(status), outcome);
    Reply::error(status, message).into_response(Some(retry_after))
}

/// Most bytes of a refused body read and thrown away before its 413 (see [`linger`]).
const LINGER_BYTES: usize = 64 << 20;

/// Reads and discards a body the collector has already refused and answered, up to
/// [`LINGER_BYTES`] or the request's deadline, as nginx's lingering close does: a client still
/// writing its body when the connection closes sees a broken pipe, not the 413 that tells the
/// SDK to split, and resends the same batch for ever. Past either bound the connection closes
/// anyway.
async fn linger(mut body: Incoming, deadline: tokio::time::Instant) {
    let mut read = 0usize;
    while read < LINGER_BYTES {
        match tokio::time::timeout_at(deadline, body.frame()).await {
            Ok(Some(Ok(frame))) => read += frame.data_ref().map_or(0, |d| d.len()),
            _ => return,
        }
    }
}

/// Whether the batch holds an event with this name (see [`Behavior::drop_name`]).
fn carries_name(body: &Body, name: Option<&str>) -> bool {
    match (body, name) {
        (Body::Batch(events), Some(name)) => events.iter().any(|e| e.name == name),
        _ => false,
    }
}

/// Bodies from this size on are decoded and parsed on the blocking pool.
const BLOCKING_DECODE_BYTES: usize = 64 << 10;

/// Reads, decodes and validates the body, filling the record's size and summary fields. The
/// body must arrive before the request's deadline.
async fn read_body(
    shared: &Shared,
    pending: &mut Pending,
    headers: &HeaderMap,
    body: Incoming,
) -> Body {
    let limits = shared.limits();
    let max_raw = limits.max_body_bytes;
    let collected =
        tokio::time::timeout_at(pending.deadline, Limited::new(body, max_raw).collect()).await;
    let raw = match collected {
        Ok(Ok(collected)) => collected.to_bytes(),
        Ok(Err(e)) if e.is::<LengthLimitError>() => {
            // The body was not read to the end; the declared length is the best size known.
            if let Some(record) = pending.record.as_mut() {
                record.body_bytes = header_text(headers, header::CONTENT_LENGTH)
                    .and_then(|l| l.trim().parse().ok())
                    .unwrap_or(max_raw);
            }
            shared.metrics().shed("batch_size");
            return Body::TooLarge(format!("body exceeds {max_raw} bytes"));
        }
        Ok(Err(e)) => return Body::Invalid(format!("body could not be read: {e}")),
        Err(_) => {
            shared.metrics().shed("body_timeout");
            return Body::TimedOut(format!(
                "body not received within {:?}",
                limits.request_timeout
            ));
        }
    };
    let encoding = header_text(headers, header::CONTENT_ENCODING);
    let Some(record) = pending.record.as_mut() else {
        return Body::Invalid("request already answered".into());
    };
    record.body_bytes = raw.len();
    let (max_decoded, max_events) = (limits.max_decoded_bytes, limits.max_batch_events);
    let keep_raw = shared.sink().is_some();
    let work =
        move || decode_and_parse(&raw, encoding.as_deref(), max_decoded, max_events, keep_raw);
    let decoded = if record.body_bytes >= BLOCKING_DECODE_BYTES {
        match tokio::task::spawn_blocking(work).await {
            Ok(d) => d,
            Err(e) => Decoded {
                decoded_bytes: 0,
                summary: None,
                body: Body::Invalid(format!("body could not be decoded: {e}")),
            },
        }
    } else {
        work()
    };
    record.decoded_bytes = decoded.decoded_bytes;
    if let Some(summary) = decoded.summary {
        record.sent_at = summary.sent_at;
        record.event_ids = summary.event_ids;
        record.timestamps = summary.timestamps;
        record.names = summary.names;
        pending.reports = summary.reports;
    }
    if matches!(decoded.body, Body::TooLarge(_)) {
        shared.metrics().shed("batch_size");
    }
    decoded.body
}

/// What decoding and parsing a body gave.
struct Decoded {
    decoded_bytes: usize,
    summary: Option<wire::Summary>,
    body: Body,
}

fn decode_and_parse(
    raw: &[u8],
    encoding: Option<&str>,
    max_decoded: usize,
    max_events: usize,
    keep_raw: bool,
) -> Decoded {
    let fail = |body| Decoded {
        decoded_bytes: 0,
        summary: None,
        body,
    };
    let decoded = match wire::decode(raw, encoding, max_decoded) {
        Ok(d) => d,
        Err(DecodeError::TooLarge(m)) => return fail(Body::TooLarge(m)),
        Err(DecodeError::BadGzip(m)) => return fail(Body::BadGzip(m)),
        Err(DecodeError::Unsupported(m)) => return fail(Body::Unsupported(m)),
    };
    let (summary, parsed) = wire::parse(&decoded);
    let body = match parsed {
        Ok(events) if events.len() > max_events => Body::TooLarge(format!(
            "batch of {} events exceeds {max_events}; send smaller batches",
            events.len()
        )),
        Ok(mut events) if keep_raw => match wire::raw_events(&decoded) {
            Ok(raws) if raws.len() == events.len() => {
                for (event, raw) in events.iter_mut().zip(raws) {
                    event.raw = raw;
                }
                Body::Batch(events)
            }
            Ok(_) => Body::Invalid("batch cannot be read twice alike".into()),
            Err(m) => Body::Invalid(m),
        },
        Ok(events) => Body::Batch(events),
        Err(m) => Body::Invalid(m),
    };
    Decoded {
        decoded_bytes: decoded.len(),
        summary: Some(summary),
        body,
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
        Body::TimedOut(m) => {
            let mut reply = Reply::error(408, &m);
            reply
                .headers
                .push((header::CONNECTION, HeaderValue::from_static("close")));
            return (408, "body timeout".into(), reply);
        }
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
    let (new, dup, reports_seen) = match store(shared, pending, &kept).await {
        Ok(Accepted {
            new,
            duplicates,
            rejected: by_sink,
            reports_seen,
        }) => {
            rejected.extend(by_sink);
            (new, duplicates, reports_seen)
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
    shared.metrics().events(new, dup, rejected.len() as u64);
    // The batch is stored: its reports count (once each), and the answer says which it read
    // and carries the directives in force.
    let mut body = json!({ "accepted": new, "duplicates": dup });
    if !pending.reports.is_empty() {
        body["reports_seen"] = json!(reports_seen);
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
        match store(shared, pending, &all).await {
            Ok(_) => {}
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

/// The one place a batch is stored: in the sink when there is one (events and reports, before
/// the request's deadline), else the local table (and the reports in the fleet book).
async fn store(
    shared: &Shared,
    pending: &Pending,
    events: &[&WireEvent],
) -> Result<Accepted, Stored> {
    let started = Instant::now();
    let result = match shared.sink() {
        Some(sink) => {
            let batch = Arc::new(sink_batch(pending, events));
            let published = tokio::time::timeout_at(pending.deadline, sink.publish(batch)).await;
            let accepted = match published {
                Ok(result) => result.map_err(Stored::Unavailable)?,
                Err(_) => {
                    return Err(Stored::Unavailable(Unavailable {
                        message: format!(
                            "not acknowledged within the request timeout ({:?})",
                            shared.limits().request_timeout
                        ),
                        retry_after: shared.limits().retry_after_secs.to_string(),
                    }));
                }
            };
            shared.count_received(accepted.new + accepted.duplicates);
            accepted
        }
        None => {
            let (new, duplicates) = shared
                .store(events, pending.index())
                .map_err(Stored::Failed)?;
            Accepted {
                new,
                duplicates,
                rejected: Vec::new(),
                reports_seen: shared.add_reports(&pending.reports),
            }
        }
    };
    shared.metrics().stored_in(started.elapsed());
    Ok(result)
}

/// The owned batch a sink publishes: each event's bytes as sent, each readable report.
fn sink_batch(pending: &Pending, events: &[&WireEvent]) -> SinkBatch {
    let reports = pending
        .reports
        .iter()
        .filter_map(|report| match crate::fleet::report_key(report) {
            Ok((install_id, report_id)) => Some(SinkReport {
                install_id,
                report_id,
                raw: Bytes::from(report.to_string()),
            }),
            Err(why) => {
                tracing::warn!(target: LOG_TARGET, %why, "client report ignored");
                None
            }
        })
        .collect();
    SinkBatch {
        project: pending.project.clone(),
        events: events
            .iter()
            .map(|e| SinkEvent {
                event_id: e.event_id.clone(),
                raw: e.raw.clone(),
            })
            .collect(),
        reports,
    }
}
