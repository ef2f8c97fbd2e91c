//! The classification table of docs/protocol.md §Responses, in one place: every way an attempt can
//! end, mapped to what the SDK does next. Pure functions of the response, tested row by row.
//!
//! | answer | outcome |
//! |---|---|
//! | 2xx read whole, without a `rejected` list (empty, other JSON, not JSON) | `Delivered` |
//! | 2xx read whole, with a non-empty `rejected` list | `Partial` (reasons cut to 1 KiB) |
//! | 2xx cut short: longer than the bound for its batch, or torn mid-body | `CutShort`: effect unknown; a batch of more than one event is split in halves and resent (a smaller batch gets a smaller answer), one event is retried like a transient failure |
//! | 400, 422 / 413 | `Poisoned` (split, or quarantine one event) |
//! | 408, 425, 429, 5xx, no answer at all | `Transient` (429/503 honour `Retry-After`) |
//! | 401, 403 | `Auth` (pause) |
//! | other 4xx, 3xx | `Config` (pause) |
//!
//! A cut 2xx is not a success: the part not read may list refused events, and deleting those as
//! delivered would lose them. The read bound (`response_bound`) fits the
//! largest legal answer to the batch sent, so only a collector breaking the protocol (reasons
//! longer than 1 KiB) or a connection breaking mid-answer gets here. Resending costs duplicates
//! the collector dedups; resending in halves means an answer that is simply too long for its
//! batch fits once the batch is small enough, instead of failing the same way for ever.

use std::time::SystemTime;

use serde::Deserialize;

use crate::retry::parse_retry_after;
use crate::transport::{HttpResponse, TransportError};

/// At most this much of a response body is kept with a quarantined event, for triage (defined
/// with the read bound it sizes, in the transport module).
pub use crate::transport::MAX_KEPT_BODY_BYTES;
/// At most this many characters of a response's text go into a [`Failure`]: it is shown on one
/// status line, where a proxy's error page would otherwise spill a dozen lines of HTML.
pub const MAX_STATUS_TEXT_CHARS: usize = 120;

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
    /// A 2xx whose body was cut short (over the bound for its batch, or torn): nothing is known
    /// about which events it accepted. Split and resend (one event: retry), same ids.
    CutShort { failure: Failure },
    /// 408, 425, 429, 5xx, no response at all: try again later with the same ids.
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
    /// As the collector wrote it.
    pub event_id: String,
    #[serde(default)]
    pub reason: String,
    /// `event_id` read as a UUID (any spelling: upper case, without hyphens, braced), which is
    /// what is compared with the batch's ids; `None` when it is not one.
    #[serde(skip)]
    pub id: Option<uuid::Uuid>,
}

/// What the UI and stats show about a failed attempt: the status (if any) and a short one-line
/// message ([`status_text`]) that never contains the API key or an event payload.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Failure {
    pub status: Option<u16>,
    pub message: String,
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.status {
            Some(status) => {
                write!(f, "HTTP {status}")?;
                if let Some(phrase) = reason_phrase(status) {
                    write!(f, " {phrase}")?;
                }
                if !self.message.is_empty() {
                    write!(f, ": {}", self.message)?;
                }
                Ok(())
            }
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
        message: status_text(status, &response.body),
    };
    match status {
        200..=299 if response.truncated => Outcome::CutShort {
            failure: Failure {
                status: Some(status),
                message: format!(
                    "answer cut short after {} bytes; delivery unknown, resending",
                    response.body.len()
                ),
            },
        },
        // A web page is not the collector's answer: a captive portal (hotel, airport Wi-Fi)
        // answers every request with its sign-in page and a 200, and the batch never left the
        // network. Transient: retried with the same ids once the network lets it through.
        200..=299 if is_web_page(response) => Outcome::Transient {
            failure: Failure {
                status: Some(status),
                message: format!(
                    "HTTP {status} with a web page, not the collector's answer (a captive portal?)"
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
                        id: uuid::Uuid::parse_str(r.event_id.trim()).ok(),
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

/// Whether the answer says it is an HTML page (`Content-Type: text/html`).
fn is_web_page(response: &HttpResponse) -> bool {
    response.header("content-type").is_some_and(|v| {
        v.split(';')
            .next()
            .is_some_and(|t| t.trim().eq_ignore_ascii_case("text/html"))
    })
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

/// The standard reason phrase of a status ("Bad Gateway"), when it has one.
pub fn reason_phrase(status: u16) -> Option<&'static str> {
    http::StatusCode::from_u16(status).ok()?.canonical_reason()
}

/// A response body as one line of text a person can read: markup stripped (an HTML page keeps
/// only its visible text, without `<head>`, scripts or comments), whitespace collapsed, a
/// leading copy of the status and its reason phrase dropped (error pages repeat it), and at most
/// [`MAX_STATUS_TEXT_CHARS`] characters. The quarantine keeps [`body_excerpt`] instead.
pub fn status_text(status: u16, body: &[u8]) -> String {
    let text = String::from_utf8_lossy(&body[..body.len().min(MAX_KEPT_BODY_BYTES)]);
    // A character cut by the bound is not part of the text.
    let visible = strip_markup(text.trim_end_matches('\u{FFFD}'));
    let mut line = visible.split_whitespace().collect::<Vec<_>>().join(" ");
    // "502 Bad Gateway …": the status line says that already. A server's own wording of the
    // phrase ("503 Service Temporarily Unavailable") stays, without the number.
    if let Some(after) = line.strip_prefix(&format!("{status} ")) {
        let phrase = reason_phrase(status).unwrap_or_default();
        let after = match after.get(..phrase.len()) {
            Some(head) if !phrase.is_empty() && head.eq_ignore_ascii_case(phrase) => {
                &after[phrase.len()..]
            }
            _ => after,
        };
        line = after.trim_start_matches([' ', ':', '-', '.']).to_string();
    }
    if line.chars().count() > MAX_STATUS_TEXT_CHARS {
        line = line.chars().take(MAX_STATUS_TEXT_CHARS - 1).collect();
        line.truncate(line.trim_end().len());
        line.push('…');
    }
    line
}

/// The text outside tags, with control characters as spaces and the common entities decoded.
/// A `<` not followed by a letter, `/` or `!` is text (`a < b` in a JSON message survives).
fn strip_markup(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(c) = rest.chars().next() {
        let is_tag = c == '<'
            && rest[1..]
                .chars()
                .next()
                .is_some_and(|n| n.is_ascii_alphabetic() || n == '/' || n == '!');
        if !is_tag {
            if let Some((entity, decoded)) = ENTITIES.iter().find(|(e, _)| rest.starts_with(e)) {
                out.push(*decoded);
                rest = &rest[entity.len()..];
            } else {
                out.push(if c.is_control() { ' ' } else { c });
                rest = &rest[c.len_utf8()..];
            }
            continue;
        }
        // A tag separates words, as a browser renders block elements apart.
        out.push(' ');
        if let Some(comment) = rest.strip_prefix("<!--") {
            rest = comment.find("-->").map_or("", |end| &comment[end + 3..]);
            continue;
        }
        let end = rest.find('>').map_or(rest.len(), |i| i + 1);
        let name: String = rest[1..end]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric())
            .collect::<String>()
            .to_ascii_lowercase();
        rest = &rest[end..];
        // Invisible content: skip to the closing tag.
        if matches!(name.as_str(), "head" | "script" | "style" | "title") {
            let close = format!("</{name}");
            let lower = rest.to_ascii_lowercase();
            rest = match lower.find(&close) {
                Some(at) => {
                    let after = &rest[at..];
                    after.find('>').map_or("", |i| &after[i + 1..])
                }
                None => "",
            };
        }
    }
    out
}

const ENTITIES: [(&str, char); 7] = [
    ("&amp;", '&'),
    ("&lt;", '<'),
    ("&gt;", '>'),
    ("&quot;", '"'),
    ("&#39;", '\''),
    ("&apos;", '\''),
    ("&nbsp;", ' '),
];

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

    /// A captive portal (hotel or airport Wi-Fi) answers every request with its sign-in page
    /// and a 200: the collector never saw the batch, so it must not be taken as delivered.
    #[test]
    fn a_2xx_web_page_is_not_the_collectors_answer() {
        let page = "<!DOCTYPE html><html><body>Sign in to the network</body></html>";
        for content_type in ["text/html", "text/html; charset=utf-8", "TEXT/HTML"] {
            match answer(200, page, &[("Content-Type", content_type)]) {
                Outcome::Transient { failure, .. } => {
                    assert_eq!(failure.status, Some(200));
                    assert!(failure.message.contains("web page"), "{}", failure.message);
                }
                other => panic!("{content_type}: {other:?}"),
            }
        }
        // A collector's plain 2xx (empty, text, JSON) is still a success.
        assert!(matches!(answer(200, "", &[]), Outcome::Delivered));
        assert!(matches!(
            answer(200, "ok", &[("Content-Type", "text/plain")]),
            Outcome::Delivered
        ));
        assert!(matches!(
            answer(204, "", &[("Content-Type", "application/json")]),
            Outcome::Delivered
        ));
    }

    #[test]
    fn a_cut_short_2xx_is_cut_short_never_delivered() {
        for body in ["", "not json", r#"{"rejected":[{"event_id":"a","re"#, "{}"] {
            match cut_answer(200, body) {
                Outcome::CutShort { failure } => {
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

    /// nginx's stock 502 page, as `proxy_pass` to a closed port answers it.
    const NGINX_502: &str = "<html>\r\n<head><title>502 Bad Gateway</title></head>\r\n<body>\r\n<center><h1>502 Bad Gateway</h1></center>\r\n<hr><center>nginx/1.22.1</center>\r\n</body>\r\n</html>\r\n<!-- a padding to disable MSIE and Chrome friendly error page -->\r\n<!-- a padding to disable MSIE and Chrome friendly error page -->\r\n<!-- a padding to disable MSIE and Chrome friendly error page -->\r\n<!-- a padding to disable MSIE and Chrome friendly error page -->\r\n<!-- a padding to disable MSIE and Chrome friendly error page -->\r\n<!-- a padding to disable MSIE and Chrome friendly error page -->\r\n";

    #[test]
    fn a_proxy_error_page_becomes_one_readable_line() {
        let Outcome::Transient { failure, .. } = answer(502, NGINX_502, &[]) else {
            panic!("502 is transient");
        };
        let line = failure.to_string();
        assert_eq!(line, "HTTP 502 Bad Gateway: nginx/1.22.1");
        assert!(!failure.message.contains('<'), "{:?}", failure.message);
    }

    #[test]
    fn status_text_is_one_short_line() {
        // nginx's 400 for a header over large_client_header_buffers.
        let page = "<html>\r\n<head><title>400 Request Header Or Cookie Too Large</title></head>\r\n<body>\r\n<center><h1>400 Bad Request</h1></center>\r\n<center>Request Header Or Cookie Too Large</center>\r\n<hr><center>nginx/1.22.1</center>\r\n</body>\r\n</html>\r\n";
        assert_eq!(
            status_text(400, page.as_bytes()),
            "Request Header Or Cookie Too Large nginx/1.22.1"
        );
        // JSON is not markup: kept, a `<` in it included.
        assert_eq!(
            status_text(503, b"{\"error\": \"queue   full,\n a < b\"}"),
            r#"{"error": "queue full, a < b"}"#
        );
        assert_eq!(
            status_text(
                500,
                b"<p>x &amp; y</p><script>alert(1)</script><style>p{}</style>"
            ),
            "x & y"
        );
        // Long text: cut at a character boundary, marked, never more than the bound.
        let long = "é".repeat(500);
        let cut = status_text(500, long.as_bytes());
        assert_eq!(cut.chars().count(), MAX_STATUS_TEXT_CHARS);
        assert!(cut.ends_with('…'));
        // A body cut by the 1 KiB bound inside a character ends at the last whole one.
        let cut_inside = format!("{}ok é", " ".repeat(MAX_KEPT_BODY_BYTES - 4));
        assert_eq!(status_text(500, cut_inside.as_bytes()), "ok");
        // Unclosed markup and a stray `<` never panic or loop.
        for odd in ["<", "<a", "<!--", "<head>x", "</", "a<b", "<\u{e9}"] {
            let line = status_text(502, odd.as_bytes());
            assert!(!line.contains('\n'), "{odd:?} -> {line:?}");
        }
        // No body, or only the repeated reason: the status line has just the status.
        let failure = |status, body: &str| Failure {
            status: Some(status),
            message: status_text(status, body.as_bytes()),
        };
        assert_eq!(failure(503, "").to_string(), "HTTP 503 Service Unavailable");
        assert_eq!(
            failure(429, "<h1>429 Too Many Requests</h1>").to_string(),
            "HTTP 429 Too Many Requests"
        );
        assert_eq!(failure(599, "odd").to_string(), "HTTP 599: odd");
        assert_eq!(
            failure(503, "<h1>503 Service Temporarily Unavailable</h1>").to_string(),
            "HTTP 503 Service Unavailable: Service Temporarily Unavailable"
        );
        // Only a leading status is dropped, not a number that merely starts the same.
        assert_eq!(
            failure(500, "5000 rows").to_string(),
            "HTTP 500 Internal Server Error: 5000 rows"
        );
    }

    #[test]
    fn the_quarantine_keeps_the_page_itself() {
        match answer(413, NGINX_502, &[]) {
            Outcome::Poisoned { detail, .. } => assert!(detail.starts_with("<html>\r\n<head>")),
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
