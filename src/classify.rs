//! The classification table of DESIGN §3, in one place: every way an attempt can end, mapped to
//! what the SDK does next. Pure functions of the response, tested row by row.

use std::time::SystemTime;

use serde::Deserialize;

use crate::retry::parse_retry_after;
use crate::transport::{HttpResponse, TransportError};

/// At most this much of a response body is kept with a quarantined event or an error.
pub const MAX_KEPT_BODY_BYTES: usize = 1024;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// 2xx without a `rejected` list: the whole batch is delivered.
    Delivered,
    /// 2xx listing some events as refused for good: those go to quarantine, the rest are delivered.
    Partial { rejected: Vec<Rejection> },
    /// 400/422 (`too_large` false) or 413 (`too_large` true): something in the batch is bad.
    /// More than one event: split in halves and resend; one event: quarantine it.
    Poisoned {
        status: u16,
        too_large: bool,
        detail: String,
    },
    /// 408, 425, 429, 5xx, or no response at all: try again later with the same ids.
    Transient {
        failure: Failure,
        retry_after_ms: Option<u64>,
    },
    /// 401/403: stop until the app sets new credentials or resumes.
    Auth { failure: Failure },
    /// Any other 4xx, and 3xx (redirects are not followed): the endpoint is wrong; stop.
    Config { failure: Failure },
}

/// An event the collector refused inside a 2xx answer.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
pub struct Rejection {
    pub event_id: String,
    #[serde(default)]
    pub reason: String,
}

/// What the UI and stats show about a failed attempt: the status (if any) and a short message
/// that never contains the API key or an event payload.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Failure {
    pub status: Option<u16>,
    pub message: String,
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.status {
            Some(status) => write!(f, "HTTP {status}: {}", self.message),
            None => f.write_str(&self.message),
        }
    }
}

#[derive(Deserialize)]
struct PartialBody {
    #[serde(default)]
    rejected: Vec<Rejection>,
}

pub fn classify(result: &Result<HttpResponse, TransportError>, now: SystemTime) -> Outcome {
    let response = match result {
        Ok(response) => response,
        Err(error) => {
            return Outcome::Transient {
                failure: Failure {
                    status: None,
                    message: error.to_string(),
                },
                retry_after_ms: None,
            };
        }
    };
    let status = response.status;
    let failure = || Failure {
        status: Some(status),
        message: body_excerpt(&response.body),
    };
    match status {
        200..=299 => match serde_json::from_slice::<PartialBody>(&response.body) {
            Ok(body) if !body.rejected.is_empty() => Outcome::Partial {
                rejected: body.rejected,
            },
            _ => Outcome::Delivered,
        },
        400 | 422 | 413 => Outcome::Poisoned {
            status,
            too_large: status == 413,
            detail: body_excerpt(&response.body),
        },
        408 | 425 | 429 | 500..=599 => Outcome::Transient {
            failure: failure(),
            retry_after_ms: response
                .header("retry-after")
                .and_then(|v| parse_retry_after(v, now)),
        },
        401 | 403 => Outcome::Auth { failure: failure() },
        _ => Outcome::Config { failure: failure() },
    }
}

/// The first KiB of a body as text, cut at a character boundary, for diagnosis.
pub fn body_excerpt(body: &[u8]) -> String {
    let text = String::from_utf8_lossy(&body[..body.len().min(MAX_KEPT_BODY_BYTES)]);
    text.trim_end_matches('\u{FFFD}').trim().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(status: u16, body: &str, headers: &[(&str, &str)]) -> Outcome {
        let response = HttpResponse {
            status,
            headers: headers
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            body: body.as_bytes().to_vec(),
        };
        classify(&Ok(response), SystemTime::now())
    }

    #[test]
    fn the_table_row_by_row() {
        assert_eq!(answer(200, "", &[]), Outcome::Delivered);
        assert_eq!(answer(204, "{\"accepted\":3}", &[]), Outcome::Delivered);
        assert_eq!(answer(200, "not json", &[]), Outcome::Delivered);
        match answer(
            200,
            r#"{"rejected":[{"event_id":"a","reason":"bad name"}]}"#,
            &[],
        ) {
            Outcome::Partial { rejected } => assert_eq!(rejected[0].reason, "bad name"),
            other => panic!("{other:?}"),
        }
        for status in [400, 422] {
            assert!(matches!(
                answer(status, "", &[]),
                Outcome::Poisoned {
                    too_large: false,
                    ..
                }
            ));
        }
        assert!(matches!(
            answer(413, "", &[]),
            Outcome::Poisoned {
                too_large: true,
                ..
            }
        ));
        for status in [408, 425, 429, 500, 502, 503, 504, 599] {
            assert!(
                matches!(answer(status, "", &[]), Outcome::Transient { .. }),
                "{status}"
            );
        }
        for status in [401, 403] {
            assert!(matches!(answer(status, "", &[]), Outcome::Auth { .. }));
        }
        for status in [301, 302, 307, 404, 405, 409, 410] {
            assert!(
                matches!(answer(status, "", &[]), Outcome::Config { .. }),
                "{status}"
            );
        }
        for error in [
            TransportError::Timeout,
            TransportError::Connect("refused".into()),
        ] {
            assert!(matches!(
                classify(&Err(error), SystemTime::now()),
                Outcome::Transient { .. }
            ));
        }
    }

    #[test]
    fn retry_after_is_read_from_429() {
        match answer(429, "", &[("Retry-After", "7")]) {
            Outcome::Transient { retry_after_ms, .. } => assert_eq!(retry_after_ms, Some(7000)),
            other => panic!("{other:?}"),
        }
        match answer(503, "", &[("retry-after", "garbage")]) {
            Outcome::Transient { retry_after_ms, .. } => assert_eq!(retry_after_ms, None),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn kept_body_is_bounded() {
        let big = "x".repeat(100_000);
        match answer(400, &big, &[]) {
            Outcome::Poisoned { detail, .. } => assert_eq!(detail.len(), MAX_KEPT_BODY_BYTES),
            other => panic!("{other:?}"),
        }
    }
}
