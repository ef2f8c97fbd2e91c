//! The checks about what a collector refuses and how: a body over its limit, a missing or
//! wrong key, load it cannot take, and the directives it sends.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Instant, SystemTime};

use eventspool::TransportError;
use eventspool::classify::Outcome;
use eventspool::retry::parse_retry_after;
use serde_json::json;

use super::delivery::internal;
use crate::conformance::answer::{Counts, delivered, describe, excerpt, unexpected};
use crate::conformance::context::{Answer, Ctx, Ev, MAX_PAD_BYTES, Req};
use crate::conformance::verdict::{Judged, Verdict};

/// Body sizes tried when no `--body-limit` is given: the SDK's default `max_batch_bytes`, then
/// larger, up to a bound that keeps the check cheap.
const PROBE_BYTES: [usize; 3] = [512 << 10, 2 << 20, 8 << 20];
/// The body sent to check a stated limit is this much over it.
const OVER_BY: usize = 1024;
/// Events per request in the load check (small: the check is about the number of requests).
pub const LOAD_EVENTS_PER_REQUEST: usize = 20;

fn mib(bytes: usize) -> String {
    if bytes >= 1 << 20 && bytes.is_multiple_of(1 << 20) {
        format!("{} MiB", bytes >> 20)
    } else if bytes >= 1 << 10 && bytes.is_multiple_of(1 << 10) {
        format!("{} KiB", bytes >> 10)
    } else {
        format!("{bytes} bytes")
    }
}

/// Events whose batch body is `target` bytes, or at most 16 short of it. Event sizes are
/// adjusted through their padding; the body is measured, not estimated.
fn events_for_body(ctx: &mut Ctx, target: usize) -> Result<Vec<Ev>, String> {
    let measure = |events: &[Ev]| {
        eventspool::batch_body(events.iter().map(|e| e.json.as_str()), 0, None).len()
    };
    let per_event = MAX_PAD_BYTES;
    let n = target.div_ceil(per_event).max(1);
    let mut events = ctx.events(n, 1)?;
    let base = measure(&events);
    if base > target {
        return Err(format!("cannot build a body as small as {target} bytes"));
    }
    let extra = target - base;
    let each = extra / n;
    events = ctx.events(n - 1, 1 + each)?;
    // The last event takes what is left; a couple of rounds absorb the digits of the counter.
    let mut last_pad = 1 + each + extra % n;
    for _ in 0..4 {
        let mut last = ctx.events(1, last_pad)?;
        let mut all = events.clone();
        all.append(&mut last);
        let len = measure(&all);
        if len <= target && target - len <= 16 {
            return Ok(all);
        }
        last_pad = if len > target {
            last_pad.saturating_sub(len - target)
        } else {
            last_pad + (target - len)
        };
        if last_pad == 0 || last_pad > MAX_PAD_BYTES {
            break;
        }
    }
    Err(format!("cannot build a body of {target} bytes"))
}

/// One body of about `target` bytes, as identity (a limit counts the body as sent).
fn body_request(ctx: &mut Ctx, target: usize) -> Result<Req, Verdict> {
    let events = events_for_body(ctx, target).map_err(internal)?;
    Ok(ctx.request(&events, 1, false))
}

/// What to say about a 413 answer: whether it names the limit (optional, helps operators).
fn says_limit(answer: &Answer) -> String {
    let body = answer
        .response()
        .map(|r| excerpt(&r.body))
        .unwrap_or_default();
    if body.is_empty() {
        "with an empty body".into()
    } else {
        format!("saying {body}")
    }
}

/// A body over the limit must be answered 413; anything else, with what the SDK then does.
fn over_limit_answer(ctx: &Ctx, answer: &Answer, bytes: usize, did: &str) -> Judged {
    match &answer.result {
        Ok(r) if r.status == 413 => Ok(Verdict::pass(format!(
            "{did}413 for {} {}; the SDK halves and remembers the size",
            mib(bytes),
            says_limit(answer)
        ))),
        Ok(r) if matches!(r.status, 400 | 422) => Err(Verdict::fail(
            format!(
                "{did}{} for a body of {} over the limit",
                r.status,
                mib(bytes)
            ),
            format!(
                "answer 413, not {}: the SDK reads {} as a bad event, halves the batch and \
                 quarantines lone events as bad_request; on 413 it halves and remembers the size",
                r.status, r.status
            ),
        )),
        Ok(r) if (200..300).contains(&r.status) => Err(Verdict::fail(
            format!(
                "{did}{} for a body of {}, over --body-limit",
                r.status,
                mib(bytes)
            ),
            "answer 413 to bodies over your limit, or pass the real limit as --body-limit",
        )),
        _ => {
            let mut v = unexpected(ctx, answer, "413");
            v.did = format!("{did}{}", v.did);
            v.fix = Some(
                "read (or discard) a body over the limit and answer 413: on any other answer the \
                 SDK resends the same body and never learns the size"
                    .into(),
            );
            Err(v)
        }
    }
}

/// `body_limit`: a body over the collector's limit gets 413.
pub fn body_limit(ctx: &mut Ctx) -> Judged {
    if let Some(limit) = ctx.opts.body_limit {
        let within = body_request(ctx, limit)?;
        let within_bytes = within.http.body.len();
        let answer = ctx.send(within);
        if answer.status() == Some(413) {
            return Err(Verdict::fail(
                format!("413 for {within_bytes} bytes, within --body-limit {limit}"),
                "accept bodies up to your limit, or pass the real limit as --body-limit",
            ));
        }
        delivered(ctx, &answer, "2xx for a body within --body-limit")?;
        let over = body_request(ctx, limit + OVER_BY)?;
        let over_bytes = over.http.body.len();
        let answer = ctx.send(over);
        return over_limit_answer(
            ctx,
            &answer,
            over_bytes,
            &format!("2xx for {within_bytes} bytes; "),
        );
    }
    let mut accepted = Vec::new();
    for target in PROBE_BYTES {
        let request = body_request(ctx, target)?;
        let answer = ctx.send(request);
        if matches!(answer.outcome(), Outcome::Delivered) {
            accepted.push(mib(target));
            continue;
        }
        if answer.status().is_some_and(|s| (200..300).contains(&s)) {
            return Err(unexpected(ctx, &answer, "2xx or 413"));
        }
        let before = if accepted.is_empty() {
            String::new()
        } else {
            format!("2xx for {}; ", accepted.join(", "))
        };
        let mut verdict = over_limit_answer(ctx, &answer, target, &before)?;
        if target <= PROBE_BYTES[0] {
            verdict.did.push_str(
                " (below the SDK's default max_batch_bytes: devices halve their batches)",
            );
        }
        return Ok(verdict);
    }
    Ok(Verdict::not_applicable(format!(
        "2xx for {}: no limit found up to {} (pass --body-limit BYTES to check yours)",
        accepted.join(", "),
        mib(PROBE_BYTES[PROBE_BYTES.len() - 1])
    )))
}

/// An answer to a request without the right key: 401/403, or what is wrong with it.
fn refused(ctx: &Ctx, answer: &Answer, how: &str) -> Result<u16, Verdict> {
    let Some(status) = answer.status() else {
        return Err(unexpected(ctx, answer, "401 or 403"));
    };
    let said = format!("{how}: {}", describe(ctx, answer));
    let fix = match status {
        401 | 403 => return Ok(status),
        200..=299 => {
            "refuse a request without the right `Authorization: Bearer KEY` with 401: anyone \
             can write into this collector"
                .to_string()
        }
        400 | 413 | 422 => format!(
            "answer 401 (or 403): on {status} the SDK halves the batch and quarantines its \
             events as bad_request"
        ),
        429 | 500..=599 | 408 | 425 => format!(
            "answer 401 (or 403): the SDK retries a {status} for ever instead of pausing for a \
             new key"
        ),
        _ => format!(
            "answer 401 (or 403): on {status} the SDK pauses as for a wrong endpoint, which a \
             new key does not end"
        ),
    };
    Err(Verdict::fail(said, fix))
}

/// `auth`: without the key, and with a wrong one, 401/403; with `--api-key`, 2xx.
pub fn auth(ctx: &mut Ctx) -> Judged {
    let Some(key) = ctx.opts.api_key.clone() else {
        let events = ctx.events(1, 0).map_err(internal)?;
        let answer = ctx.send(ctx.request(&events, 1, false));
        return match answer.outcome() {
            Outcome::Delivered => Ok(Verdict::not_applicable(format!(
                "{} without Authorization; no --api-key given, so the collector takes any request",
                describe(ctx, &answer)
            ))),
            _ => Err(unexpected(ctx, &answer, "2xx, as no --api-key was given")),
        };
    };
    let without = |ctx: &mut Ctx, value: Option<String>| -> Result<Answer, Verdict> {
        let events = ctx.events(1, 0).map_err(internal)?;
        let mut request = ctx.request(&events, 1, false);
        request
            .http
            .headers
            .retain(|(k, _)| !k.eq_ignore_ascii_case("authorization"));
        if let Some(value) = value {
            request.http.headers.push(("Authorization".into(), value));
        }
        Ok(ctx.send(request))
    };
    let missing = without(ctx, None)?;
    let s1 = refused(ctx, &missing, "without Authorization")?;
    let wrong_key = format!("{key}-not-this-one");
    let wrong = without(ctx, Some(format!("Bearer {wrong_key}")))?;
    let s2 = refused(ctx, &wrong, "with a wrong key")?;
    let events = ctx.events(1, 0).map_err(internal)?;
    let right = ctx.send(ctx.request(&events, 1, false));
    delivered(ctx, &right, "2xx with --api-key")?;
    Ok(Verdict::pass(format!(
        "{s1} without Authorization, {s2} with a wrong key, {} with --api-key; the SDK pauses \
         on 401/403 until a new key",
        right.status().unwrap_or(0)
    )))
}

/// `directives`: every `directives` object any 2xx of the run carried is within the SDK's
/// bounds (docs/protocol.md §Directives).
pub fn directives(ctx: &mut Ctx) -> Judged {
    let events = ctx.events(3, 0).map_err(internal)?;
    let answer = ctx.send(ctx.request(&events, 1, false));
    delivered(ctx, &answer, "2xx")?;
    let seen: BTreeSet<String> = ctx
        .answers
        .iter()
        .filter_map(|body| body.get("directives"))
        .map(|d| d.to_string())
        .collect();
    if seen.is_empty() {
        return Ok(Verdict::not_applicable(format!(
            "none of the run's {} 2xx answers carried directives",
            ctx.answers.len()
        )));
    }
    let now = chrono::Utc::now().timestamp_millis();
    let mut problems = Vec::new();
    let mut names = Vec::new();
    for text in &seen {
        let value: serde_json::Value = serde_json::from_str(text).unwrap_or_default();
        names.push(
            value
                .get("id")
                .map(|id| id.to_string())
                .unwrap_or_else(|| "(no id)".into()),
        );
        problems.extend(eventspool::directive_problems(
            &json!({ "directives": value }),
            now,
        ));
    }
    if !problems.is_empty() {
        return Err(Verdict::fail(
            format!("the SDK ignores: {}", problems.join("; ")),
            "keep directives within docs/protocol.md §Directives (an id of 1-64 bytes, a positive \
             ttl_ms, known members of the right type within their bounds): the SDK ignores the \
             rest and counts it in directives_ignored",
        ));
    }
    Ok(Verdict::pass(format!(
        "directives seen: {} distinct ({}), each within the SDK's bounds",
        seen.len(),
        names.join(", ")
    )))
}

/// `load` (opt-in): many requests at once; every answer is 2xx, or 429/503 with a readable
/// `Retry-After`, and none comes after the deadline.
pub fn load(ctx: &mut Ctx) -> Judged {
    let n = ctx.opts.load_requests;
    let at_once = ctx.opts.load_concurrency;
    let mut requests = Vec::with_capacity(n);
    for _ in 0..n {
        let events = ctx.events(LOAD_EVENTS_PER_REQUEST, 0).map_err(internal)?;
        requests.push(ctx.request(&events, 1, false));
    }
    let started = Instant::now();
    let answers = ctx.send_all(requests, at_once);
    let took = started.elapsed();
    let mut statuses: BTreeMap<String, usize> = BTreeMap::new();
    let (mut timeouts, mut no_retry_after, mut other) = (0usize, Vec::new(), Vec::new());
    let mut slowest = std::time::Duration::ZERO;
    for answer in &answers {
        slowest = slowest.max(answer.elapsed);
        match &answer.result {
            Err(TransportError::Timeout) => timeouts += 1,
            Err(e) => other.push(e.to_string()),
            Ok(r) => {
                *statuses.entry(r.status.to_string()).or_default() += 1;
                match r.status {
                    200..=299 if matches!(answer.outcome(), Outcome::Delivered) => {
                        if Counts::of(answer)
                            .accepted
                            .is_some_and(|a| a != LOAD_EVENTS_PER_REQUEST as u64)
                        {
                            other.push(format!("{} (counts short)", describe(ctx, answer)));
                        }
                    }
                    429 | 503 => {
                        let readable = r
                            .header("retry-after")
                            .and_then(|v| parse_retry_after(v, SystemTime::now()));
                        if readable.is_none() {
                            no_retry_after.push(r.status);
                        }
                    }
                    _ => other.push(describe(ctx, answer)),
                }
            }
        }
    }
    let tally: Vec<String> = statuses.iter().map(|(s, k)| format!("{k} × {s}")).collect();
    let did = format!(
        "{n} requests of {LOAD_EVENTS_PER_REQUEST} events, {at_once} at a time, in {:.1} s: {}{}; \
         slowest {:.2} s",
        took.as_secs_f64(),
        if tally.is_empty() {
            "no answer".to_string()
        } else {
            tally.join(", ")
        },
        if timeouts > 0 {
            format!(
                ", {timeouts} without an answer within {} s",
                ctx.opts.deadline.as_secs_f64()
            )
        } else {
            String::new()
        },
        slowest.as_secs_f64()
    );
    if timeouts > 0 {
        return Err(Verdict::fail(
            did,
            "when busy, answer 503 (or 429) with Retry-After at once: a request held past the \
             device's timeout is resent with the effect unknown, which adds to the load",
        ));
    }
    if !no_retry_after.is_empty() {
        return Err(Verdict::fail(
            format!(
                "{did}; {} busy answers without a readable Retry-After",
                no_retry_after.len()
            ),
            "add Retry-After (seconds) to every 429/503: without it devices come back on their own \
             backoff, all at once after an outage",
        ));
    }
    if let Some(first) = other.first() {
        return Err(Verdict::fail(
            format!("{did}; {} other answers, first: {first}", other.len()),
            "under load answer 2xx, or 429/503 with Retry-After: other statuses make devices \
             quarantine (4xx) or retry without pacing (5xx)",
        ));
    }
    Ok(Verdict::pass(did))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conformance::context::Options;

    fn ctx() -> Ctx {
        Ctx::new(
            Options {
                endpoint: "http://127.0.0.1:9/v1/batch".into(),
                api_key: None,
                deadline: std::time::Duration::from_secs(1),
                allow_insecure_http: false,
                body_limit: None,
                load_requests: 1,
                load_concurrency: 1,
            },
            None,
        )
        .unwrap()
    }

    #[test]
    fn a_body_of_a_given_size_is_built_to_within_16_bytes() {
        let mut ctx = ctx();
        ctx.begin("body_limit");
        for target in [1024, 40_000, 512 << 10, 1_000_000 + OVER_BY, 8 << 20] {
            let events = events_for_body(&mut ctx, target).unwrap();
            let request = ctx.request(&events, 1, false);
            let len = request.http.body.len();
            assert!(len <= target && target - len <= 16, "{target}: {len}");
            assert_eq!(request.events, events.len());
        }
    }
}
