//! The classification table of DESIGN §3, in one place: every way an attempt can end, mapped to
//! what the SDK does next. Pure functions of the response, tested row by row.
//!
//! | answer | outcome |
//! |---|---|
//! | 2xx read whole, without a `rejected` list (empty, other JSON, not JSON) | `Delivered` |
//! | 2xx read whole, with a non-empty `rejected` list | `Partial` (reasons cut to 1 KiB) |
//! | 2xx cut short: longer than the bound for its batch, or torn mid-body | `Transient`: effect unknown, resent with the same ids |
//! | 400, 422 / 413 | `Poisoned` (split, or quarantine one event) |
//! | 408, 425, 429, 5xx, no answer at all | `Transient` (429/503 honour `Retry-After`) |
//! | 401, 403 | `Auth` (pause) |
//! | other 4xx, 3xx | `Config` (pause) |
//!
//! A cut 2xx is not a success: the part not read may list refused events, and deleting those as
//! delivered would lose them. The read bound ([`crate::transport::response_bound`]) fits the
//! largest legal answer to the batch sent, so only a collector breaking the protocol (or a
//! connection breaking mid-answer) gets here; resending costs a duplicate the collector dedups.

use std::time::SystemTime;

use serde::Deserialize;

use crate::retry::parse_retry_after;
use crate::transport::{HttpResponse, TransportError};

/// At most this much of a response body is kept with a quarantined event or an error.
pub const MAX_KEPT_BODY_BYTES: usize = 1024;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// 2xx read whole, without a `rejected` list: the whole batch is delivered.
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
    /// 408, 425, 429, 5xx, no response at all, or a 2xx cut short: try again later with the
    /// same ids.
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
        200..=299 if response.truncated => Outcome::Transient {
            failure: Failure {
                status: Some(status),
                message: format!(
                    "answer cut short after {} bytes; delivery unknown, resending",
                    response.body.len()
                ),
            },
            retry_after_ms: None,
        },
        200..=299 => match serde_json::from_slice::<PartialBody>(&response.body) {
            Ok(body) if !body.rejected.is_empty() => Outcome::Partial {
                rejected: body
                    .rejected
                    .into_iter()
                    .map(|r| Rejection {
                        reason: cut(&r.reason, MAX_KEPT_BODY_BYTES).to_string(),
                        event_id: r.event_id,
                    })
                    .collect(),
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

/// At most `max` bytes of `text`, cut at a character boundary.
fn cut(text: &str, max: usize) -> &str {
    let mut end = text.len().min(max);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
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
            truncated: false,
        };
        classify(&Ok(response), SystemTime::now())
    }

    fn cut_answer(status: u16, body: &str) -> Outcome {
        let response = HttpResponse {
            status,
            body: body.as_bytes().to_vec(),
            truncated: true,
            ..Default::default()
        };
        classify(&Ok(response), SystemTime::now())
    }

    #[test]
    fn a_cut_short_2xx_is_transient_never_delivered() {
        for body in ["", "not json", r#"{"rejected":[{"event_id":"a","re"#, "{}"] {
            match cut_answer(200, body) {
                Outcome::Transient { failure, .. } => {
                    assert_eq!(failure.status, Some(200));
                    assert!(failure.message.contains("cut short"), "{failure}");
                }
                other => panic!("{body:?}: {other:?}"),
            }
        }
        // Whatever else is cut keeps its own row: the status decides, the body is only detail.
        assert!(matches!(cut_answer(503, "x"), Outcome::Transient { .. }));
        assert!(matches!(cut_answer(400, "x"), Outcome::Poisoned { .. }));
        assert!(matches!(cut_answer(401, "x"), Outcome::Auth { .. }));
    }

    #[test]
    fn rejection_reasons_are_kept_to_a_kib() {
        let long = "é".repeat(2000);
        let body = serde_json::json!({"rejected": [{"event_id": "a", "reason": long}]}).to_string();
        match answer(200, &body, &[]) {
            Outcome::Partial { rejected } => {
                assert!(rejected[0].reason.len() <= MAX_KEPT_BODY_BYTES);
                assert!(rejected[0].reason.len() >= MAX_KEPT_BODY_BYTES - 1);
            }
            other => panic!("{other:?}"),
        }
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
