//! The collector's own endpoints, beside the batch path: `GET /livez`, `/readyz`, `/stats`,
//! `/fleet` and `/metrics`. None takes a POST (a batch sent there is refused, not stored).
//!
//! Liveness and readiness are two questions for two callers. `/livez` answers whether the
//! process serves HTTP at all (restart it if not). `/readyz` answers whether a batch sent now
//! would be stored: a load balancer takes a collector out of rotation while it fails (broker
//! unreachable, its in-flight bounds full, draining), and puts it back when it passes again.

use bytes::Bytes;
use http_body_util::Full;
use hyper::header::{self, HeaderMap, HeaderValue};
use hyper::{Method, Response, StatusCode};
use serde_json::json;

use super::auth::bearer_token;
use super::metrics::Gauges;
use super::state::Shared;

/// Paths that are never a batch path.
pub(super) const RESERVED: [&str; 6] = [
    "/stats", "/fleet", "/metrics", "/livez", "/readyz", "/healthz",
];

pub(super) fn is_reserved(path: &str) -> bool {
    RESERVED.contains(&path)
}

fn json_response(status: u16, value: serde_json::Value) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(value.to_string())));
    *response.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::OK);
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}

/// Why the collector would not store a batch now, or `Ok`.
pub(super) fn readiness(shared: &Shared) -> Result<(), String> {
    if shared.draining() {
        return Err("draining: shutting down".into());
    }
    let limits = shared.limits();
    if shared.in_flight() >= limits.max_requests_in_flight {
        return Err(format!(
            "{} requests in flight, the most allowed",
            shared.in_flight()
        ));
    }
    if shared.bytes_free() < limits.max_body_bytes {
        return Err("request bytes in flight at their bound".into());
    }
    match shared.sink() {
        Some(sink) => sink.readiness(),
        None => Ok(()),
    }
}

/// The answer for a reserved path, `None` for any other.
pub(super) fn answer(
    shared: &Shared,
    method: &Method,
    path: &str,
    headers: &HeaderMap,
) -> Option<Response<Full<Bytes>>> {
    if !is_reserved(path) {
        return None;
    }
    if method != Method::GET && method != Method::HEAD {
        let mut r = json_response(405, json!({"error": format!("{path} answers GET only")}));
        r.headers_mut()
            .insert(header::ALLOW, HeaderValue::from_static("GET"));
        return Some(r);
    }
    let response = match path {
        "/livez" | "/healthz" => json_response(200, json!({"live": true})),
        "/readyz" => match readiness(shared) {
            Ok(()) => json_response(200, json!({"ready": true})),
            Err(why) => json_response(503, json!({"ready": false, "reason": why})),
        },
        // Counters and totals are the operator's, behind the same keys as the batches.
        _ if !admin_allowed(shared, headers) => {
            json_response(401, json!({"error": "missing or wrong API key"}))
        }
        "/stats" => {
            // The bindings suites read the distinct count here instead of linking Rust.
            let mut stats = json!({
                "distinct": shared.distinct_count(),
                "received": shared.received_count(),
                "requests": shared.request_count(),
            });
            if let Some(sink) = shared.sink() {
                stats["sink"] = sink.stats();
            }
            json_response(200, stats)
        }
        // The fleet's client report totals (docs/protocol.md §Client reports); behind a sink the
        // reports are in the broker, totalled by its reader, and this stays empty.
        "/fleet" => json_response(200, shared.fleet_totals().to_json()),
        _ => {
            let gauges = Gauges {
                requests_in_flight: shared.in_flight(),
                events_in_flight: shared.sink().map_or(0, |s| s.events_in_flight()),
                bytes_in_flight: shared
                    .limits()
                    .max_bytes_in_flight
                    .saturating_sub(shared.bytes_free()),
                broker_connected: shared.sink().is_none_or(|s| s.connected()),
                ready: readiness(shared).is_ok(),
            };
            let mut r = Response::new(Full::new(Bytes::from(shared.metrics().render(&gauges))));
            r.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
            );
            r
        }
    };
    Some(response)
}

/// With keys configured, the admin endpoints want one of them (any project's).
fn admin_allowed(shared: &Shared, headers: &HeaderMap) -> bool {
    let Some(keys) = shared.api_keys() else {
        return true;
    };
    let auth = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    bearer_token(auth).is_some() && keys.project_of(auth).is_some()
}
