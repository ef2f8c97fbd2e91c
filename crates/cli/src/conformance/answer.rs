//! Reading a collector's answer the way a check reports it: the counts a 2xx may carry, one
//! line saying what came back, and, for an answer a check did not expect, what the SDK does
//! with it and what the collector should do instead.

use eventspool::TransportError;
use eventspool::classify::Outcome;
use serde_json::Value;

use super::context::{Answer, Ctx};
use super::verdict::Verdict;

/// The counts of a 2xx body (docs/protocol.md: `accepted`, `duplicates`, `rejected`), read
/// leniently: a count that is not a non-negative integer is absent here (the `answer_body`
/// check is the one that judges their shape).
#[derive(Debug, Default)]
pub struct Counts {
    pub accepted: Option<u64>,
    pub duplicates: Option<u64>,
    /// Ids listed in a readable `rejected` list.
    pub rejected: Vec<String>,
}

impl Counts {
    pub fn of(answer: &Answer) -> Counts {
        let Some(body) = answer
            .response()
            .and_then(|r| serde_json::from_slice::<Value>(&r.body).ok())
        else {
            return Counts::default();
        };
        let rejected = body
            .get("rejected")
            .and_then(Value::as_array)
            .map(|list| {
                list.iter()
                    .filter_map(|r| r.get("event_id").and_then(Value::as_str))
                    .map(str::to_owned)
                    .collect()
            })
            .unwrap_or_default();
        Counts {
            accepted: body.get("accepted").and_then(Value::as_u64),
            duplicates: body.get("duplicates").and_then(Value::as_u64),
            rejected,
        }
    }

    /// `accepted 5, duplicates 0` (what the body said), or `no counts`.
    pub fn said(&self) -> String {
        let mut parts = Vec::new();
        if let Some(a) = self.accepted {
            parts.push(format!("accepted {a}"));
        }
        if let Some(d) = self.duplicates {
            parts.push(format!("duplicates {d}"));
        }
        if !self.rejected.is_empty() {
            parts.push(format!("{} rejected", self.rejected.len()));
        }
        if parts.is_empty() {
            "no counts".into()
        } else {
            parts.join(", ")
        }
    }
}

/// `200 (accepted 8, duplicates 0)`: the status and the counts, for an answer that passed.
pub fn brief(answer: &Answer) -> String {
    match answer.status() {
        Some(status) => format!("{status} ({})", Counts::of(answer).said()),
        None => "no answer".into(),
    }
}

/// At most this much of an answer body goes into a report line.
const EXCERPT_CHARS: usize = 80;

/// The body's text on one line, cut short.
pub fn excerpt(body: &[u8]) -> String {
    let text = String::from_utf8_lossy(body);
    let line: String = text.split_whitespace().collect::<Vec<_>>().join(" ");
    if line.chars().count() > EXCERPT_CHARS {
        let cut: String = line.chars().take(EXCERPT_CHARS).collect();
        format!("{cut}…")
    } else {
        line
    }
}

/// One line: `200 {"accepted":5}`, `no answer within 10 s`, `could not connect: ...`.
pub fn describe(ctx: &Ctx, answer: &Answer) -> String {
    match &answer.result {
        Ok(r) => {
            let body = excerpt(&r.body);
            let cut = if r.truncated {
                format!(
                    " (cut short at the SDK's read bound, {} bytes)",
                    r.body.len()
                )
            } else {
                String::new()
            };
            if body.is_empty() {
                format!("{}{cut}", r.status)
            } else {
                format!("{} {body}{cut}", r.status)
            }
        }
        Err(TransportError::Timeout) => {
            format!("no answer within {} s", ctx.opts.deadline.as_secs_f64())
        }
        Err(e) => e.to_string(),
    }
}

/// A check got `answer` where it expected `expected`: say what came back, what the SDK does
/// with that, and what to change.
pub fn unexpected(ctx: &Ctx, answer: &Answer, expected: &str) -> Verdict {
    let did = format!("{} (expected {expected})", describe(ctx, answer));
    let fix = match (&answer.result, answer.outcome()) {
        (Err(TransportError::Connect(_)), _) => format!(
            "start the collector, or check --endpoint ({})",
            ctx.opts.endpoint
        ),
        (Err(TransportError::Timeout), _) => "answer within the SDK's attempt timeout (10 s by \
             default); when busy, answer 503 with Retry-After at once instead of holding the request"
            .to_string(),
        (Err(_), _) => "answer every request with a status: a connection closed without one makes \
             the SDK resend with the effect unknown"
            .to_string(),
        (Ok(_), Outcome::CutShort { .. }) => "keep a 2xx answer within the SDK's read bound, 64 KiB \
             + 1,152 bytes per event (docs/protocol.md §Read bound): past it the SDK cannot tell \
             what was accepted and resends"
            .to_string(),
        (Ok(_), Outcome::Partial { .. }) => "list in rejected only events that break \
             docs/protocol.md §Event; these were valid, and the SDK quarantines them"
            .to_string(),
        (Ok(_), Outcome::Auth { .. }) if ctx.opts.api_key.is_none() => {
            "the collector wants an API key: pass --api-key".to_string()
        }
        (Ok(_), Outcome::Auth { .. }) => {
            "the collector refuses the key given with --api-key: check it".to_string()
        }
        (Ok(_), Outcome::Poisoned { too_large: true, .. }) => "accept bodies this size: they are \
             within the SDK's defaults (max_batch_bytes 512 KiB)"
            .to_string(),
        (Ok(_), Outcome::Poisoned { .. }) => "accept a valid batch: on 400/422 the SDK halves the \
             batch and quarantines events as bad_request"
            .to_string(),
        (Ok(r), Outcome::Transient { .. }) if matches!(r.status, 429 | 503) => "a busy answer makes \
             the SDK wait and resend; run the checks while the collector is not overloaded (the \
             load check, --load, is about shedding)"
            .to_string(),
        (Ok(_), Outcome::Transient { .. }) => "accept a valid batch: the SDK retries a 5xx with \
             backoff, and every event behind it waits"
            .to_string(),
        (Ok(r), Outcome::Config { .. }) if (300..400).contains(&r.status) => "the SDK follows no \
             redirect and pauses: point --endpoint at the batch URL itself"
            .to_string(),
        (Ok(_), Outcome::Config { .. }) => "the SDK pauses delivery on this status (a \
             configuration error): check --endpoint's path, and answer POSTs of batch v1 there"
            .to_string(),
        (Ok(_), Outcome::Delivered) => "answer as the check expects (see docs/cli.md)".to_string(),
    };
    Verdict::fail(did, fix)
}

/// `Ok` when the SDK would take this answer as "all delivered"; otherwise the verdict to return.
pub fn delivered(ctx: &Ctx, answer: &Answer, expected: &str) -> Result<(), Verdict> {
    match answer.outcome() {
        Outcome::Delivered => Ok(()),
        _ => Err(unexpected(ctx, answer, expected)),
    }
}
