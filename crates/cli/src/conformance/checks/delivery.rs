//! The checks about a batch getting in: the 2xx body, dedup, a malformed event, both body
//! encodings, and members in any order.

use std::collections::HashMap;

use eventspool::classify::Outcome;
use serde_json::{Map, Value};

use crate::conformance::answer::{Counts, brief, delivered, describe, unexpected};
use crate::conformance::context::{Answer, Ctx, Ev, Req};
use crate::conformance::verdict::{Judged, Verdict, stored_once};

/// Members of a 2xx body that docs/protocol.md names; others are reported as ignored.
const KNOWN_MEMBERS: [&str; 6] = [
    "accepted",
    "duplicates",
    "rejected",
    "directives",
    "reports_seen",
    "reports_alone",
];

fn ids(events: &[Ev]) -> Vec<&str> {
    events.iter().map(|e| e.id.as_str()).collect()
}

/// A check's own events could not be built: a bug here, reported as the check's failure.
pub fn internal(e: String) -> Verdict {
    Verdict::fail(
        format!("the check could not run: {e}"),
        "report this as a bug of eventspool conformance",
    )
}

/// `answer_body`: a fresh batch's 2xx is one the SDK reads whole and understands.
pub fn answer_body(ctx: &mut Ctx) -> Judged {
    const N: usize = 5;
    let events = ctx.events(N, 0).map_err(internal)?;
    let answer = ctx.send(ctx.request(&events, 1, false));
    let Some(response) = answer
        .response()
        .filter(|r| (200..300).contains(&r.status) && !r.truncated)
    else {
        return Err(unexpected(ctx, &answer, "2xx"));
    };
    let status = response.status;
    let shape = |did: String, fix: &str| Verdict::fail(did, fix);
    let value = serde_json::from_slice::<Value>(&response.body).ok();
    let Some(Value::Object(body)) = value else {
        let kind = if response.body.is_empty() {
            "an empty body"
        } else if value.is_some() {
            "JSON that is not an object"
        } else {
            "a body that is not JSON"
        };
        let back = stored_once(ctx, &ids(&events), "the batch")?;
        return Ok(Verdict::pass(format!(
            "{status} with {kind}: the SDK reads it as all delivered (counts are optional); {back}"
        )));
    };
    for key in ["accepted", "duplicates"] {
        if let Some(v) = body.get(key).filter(|v| !v.is_u64()) {
            return Err(shape(
                format!("{status} with `{key}`: {v}"),
                &format!(
                    "make `{key}` a non-negative integer, the number of events of the batch it \
                     counts (docs/protocol.md §Responses)"
                ),
            ));
        }
    }
    let sent: Vec<&str> = ids(&events);
    match body.get("rejected") {
        None | Some(Value::Null) => {}
        Some(Value::Array(list)) => {
            for (i, entry) in list.iter().enumerate() {
                let id = entry.get("event_id").and_then(Value::as_str);
                let reason_ok = entry.get("reason").is_none_or(Value::is_string);
                if id.is_none() || !reason_ok {
                    return Err(shape(
                        format!("{status} with rejected[{i}] = {entry}"),
                        "list each refused event as {\"event_id\":\"…\",\"reason\":\"…\"}: the SDK \
                         cannot read this list, takes the whole batch as delivered and deletes \
                         the refused events",
                    ));
                }
                if let Some(id) = id.filter(|id| !sent.contains(id)) {
                    return Err(shape(
                        format!("{status}: rejected names {id}, which is not in the batch"),
                        "list in rejected only ids of the batch being answered",
                    ));
                }
            }
        }
        Some(other) => {
            return Err(shape(
                format!("{status} with `rejected`: {other}"),
                "make `rejected` a list of {\"event_id\",\"reason\"}: the SDK cannot read this, \
                 takes the whole batch as delivered and deletes any refused event",
            ));
        }
    }
    delivered(ctx, &answer, "a 2xx without rejections for valid events")?;
    let counts = Counts::of(&answer);
    if let Some(a) = counts.accepted.filter(|&a| a != N as u64) {
        return Err(Verdict::fail(
            format!("{status}: accepted {a} of {N} new events, none listed in rejected"),
            "count every stored event of the batch in `accepted` and list each refused one in \
             `rejected`: the SDK deletes every event a 2xx does not reject",
        ));
    }
    if let Some(d) = counts.duplicates.filter(|&d| d != 0) {
        return Err(Verdict::fail(
            format!("{status}: duplicates {d} for {N} events never sent before"),
            "count as duplicates only event_ids stored before",
        ));
    }
    let unknown: Vec<&str> = body
        .keys()
        .map(String::as_str)
        .filter(|k| !KNOWN_MEMBERS.contains(k))
        .collect();
    let back = stored_once(ctx, &sent, "the batch")?;
    let mut did = format!("{status}, {}", counts.said());
    if !unknown.is_empty() {
        did.push_str(&format!(
            " (also {}: ignored by the SDK)",
            unknown.join(", ")
        ));
    }
    Ok(Verdict::pass(format!("{did}; {back}")))
}

/// What the SDK does on a status, for a fix that says why it matters.
fn sdk_on(answer: &Answer) -> &'static str {
    match answer.outcome() {
        Outcome::Poisoned { .. } => "halves the batch and quarantines its events as bad_request",
        Outcome::Auth { .. } => "pauses until the app sets a new key",
        Outcome::Config { .. } => "pauses delivery as for a wrong endpoint",
        Outcome::Transient { .. } | Outcome::CutShort { .. } => {
            "resends the same ids for ever, and every event behind them waits"
        }
        Outcome::Partial { .. } => "quarantines the events it lists as rejected",
        Outcome::Delivered => "takes it as delivered",
    }
}

/// A resend of ids the collector may already hold must be a plain 2xx.
fn resend_delivered(ctx: &Ctx, answer: &Answer, which: &str) -> Result<(), Verdict> {
    if matches!(answer.outcome(), Outcome::Delivered) {
        return Ok(());
    }
    let mut verdict = unexpected(ctx, answer, "2xx");
    if answer.response().is_some() {
        verdict.did = format!("{which}: {}", describe(ctx, answer));
        verdict.fix = Some(format!(
            "answer a resend of ids already stored with 2xx, counting them in `duplicates`: a \
             resend is how the SDK recovers from any doubt, and on this answer it {}",
            sdk_on(answer)
        ));
    }
    Err(verdict)
}

const DEDUP_FIX: &str = "store each event once by event_id, and count a resent id in `duplicates`, \
                         not `accepted`: the SDK resends the same ids after any doubt";

/// `dedup`: a batch resent after a 2xx, and one resent after an answer that never arrived, are
/// each answered 2xx and stored once.
pub fn dedup(ctx: &mut Ctx) -> Judged {
    const N: u64 = 5;
    let a = ctx.events(N as usize, 0).map_err(internal)?;
    let first = ctx.send(ctx.request(&a, 1, false));
    delivered(ctx, &first, "2xx for a new batch")?;
    let again = ctx.send(ctx.request(&a, 2, false));
    resend_delivered(ctx, &again, "the same batch again")?;
    let resent = Counts::of(&again);
    if resent.duplicates.is_some_and(|d| d != N) || resent.accepted.is_some_and(|a| a != 0) {
        return Err(Verdict::fail(
            format!(
                "the same {N} events again: {} ({})",
                again.status().unwrap_or(0),
                resent.said()
            ),
            DEDUP_FIX,
        ));
    }
    let mut did = format!(
        "resent after a 2xx: {} ({})",
        again.status().unwrap_or(0),
        resent.said()
    );

    let b = ctx.events(N as usize, 0).map_err(internal)?;
    let cut = ctx.request(&b, 1, false);
    match ctx.send_unanswered(&cut) {
        Err(why) if why.starts_with("needs") => {
            let back = stored_once(ctx, &ids(&a), "resent after a 2xx")?;
            did.push_str(&format!(
                "; the unanswered case was not run ({why}); {back}"
            ));
            return Ok(Verdict::pass(did));
        }
        Err(why) => {
            return Err(Verdict::fail(
                format!("a batch whose answer is dropped: {why}"),
                "accept the connection and the request (see the other checks)",
            ));
        }
        Ok(_) => {}
    }
    let second = ctx.send(ctx.request(&b, 2, false));
    resend_delivered(ctx, &second, "resent after no answer")?;
    let c2 = Counts::of(&second);
    let covered = c2.accepted.unwrap_or(0) + c2.duplicates.unwrap_or(0);
    if c2.accepted.is_some() && c2.duplicates.is_some() && covered != N {
        return Err(Verdict::fail(
            format!(
                "resent after no answer: {} ({}), {covered} of {N} counted",
                second.status().unwrap_or(0),
                c2.said()
            ),
            DEDUP_FIX,
        ));
    }
    let third = ctx.send(ctx.request(&b, 3, false));
    resend_delivered(ctx, &third, "resent once more")?;
    let c3 = Counts::of(&third);
    if c3.duplicates.is_some_and(|d| d != N) || c3.accepted.is_some_and(|a| a != 0) {
        return Err(Verdict::fail(
            format!(
                "resent after no answer, then again: {} ({})",
                third.status().unwrap_or(0),
                c3.said()
            ),
            DEDUP_FIX,
        ));
    }
    let all: Vec<&str> = ids(&a).into_iter().chain(ids(&b)).collect();
    let back = stored_once(ctx, &all, "the resent batches")?;
    did.push_str(&format!(
        "; resent after an answer dropped unread: {} ({}), then {} ({}); {back}",
        second.status().unwrap_or(0),
        c2.said(),
        third.status().unwrap_or(0),
        c3.said(),
    ));
    Ok(Verdict::pass(did))
}

/// What became of one event while `malformed_event` split its batch as the SDK does.
#[derive(Debug)]
enum Fate {
    /// Covered by a 2xx that did not reject it; `short` is how many events of that answer's
    /// batch its counts leave out (none when it has no counts).
    Delivered {
        short: Option<u64>,
    },
    Rejected {
        reason: String,
    },
    RefusedAlone {
        status: u16,
    },
}

/// Sends `events`, and on 400/422 halves them as the SDK does (src/split.rs) until each bad
/// event is alone. At most 2n − 1 requests for n events.
fn deliver_splitting(
    ctx: &mut Ctx,
    events: &[Ev],
    attempt: u32,
    fates: &mut HashMap<String, Fate>,
    steps: &mut Vec<String>,
) -> Result<(), Verdict> {
    let answer = ctx.send(ctx.request(events, attempt, false));
    let status = answer.status().unwrap_or(0);
    steps.push(format!("{}→{status}", events.len()));
    match answer.outcome() {
        Outcome::Delivered => {
            let c = Counts::of(&answer);
            let short = c
                .accepted
                .map(|a| (events.len() as u64).saturating_sub(a + c.duplicates.unwrap_or(0)));
            for e in events {
                fates.insert(e.id.clone(), Fate::Delivered { short });
            }
        }
        Outcome::Partial { rejected } => {
            for e in events {
                let fate = match rejected.iter().find(|r| r.event_id == e.id) {
                    Some(r) => Fate::Rejected {
                        reason: r.reason.clone(),
                    },
                    None => Fate::Delivered { short: None },
                };
                fates.insert(e.id.clone(), fate);
            }
        }
        Outcome::Poisoned {
            too_large: false, ..
        } if events.len() > 1 => {
            let (left, right) = events.split_at(events.len() / 2);
            deliver_splitting(ctx, left, attempt + 1, fates, steps)?;
            deliver_splitting(ctx, right, attempt + 1, fates, steps)?;
        }
        Outcome::Poisoned {
            too_large: false, ..
        } => {
            fates.insert(events[0].id.clone(), Fate::RefusedAlone { status });
        }
        _ => {
            let mut v = unexpected(
                ctx,
                &answer,
                "400/422, or a 2xx listing the bad event in rejected",
            );
            if answer.response().is_some() {
                v.fix = Some(format!(
                    "answer a batch holding a malformed event with 400 (or list the event in \
                     `rejected` of a 2xx): on this answer the SDK {}",
                    sdk_on(&answer)
                ));
            }
            return Err(v);
        }
    }
    Ok(())
}

/// The event's wire JSON with a timestamp that is not RFC 3339: what no eventspool release
/// sends, and what a collector must refuse, or keep, but never lose without a word.
fn malform(json: &str) -> Result<String, String> {
    let mut value: Value =
        serde_json::from_str(json).map_err(|e| format!("cannot read a test event: {e}"))?;
    value["timestamp"] = Value::String("not-a-timestamp".into());
    Ok(value.to_string())
}

/// `malformed_event`: a batch of four with one bad event: the bad one is rejected (or refused
/// alone after halving), the good ones are delivered, nothing vanishes.
pub fn malformed_event(ctx: &mut Ctx) -> Judged {
    const BAD: usize = 2;
    let mut events = ctx.events(4, 0).map_err(internal)?;
    events[BAD].json = malform(&events[BAD].json).map_err(internal)?;
    let bad = events[BAD].id.clone();
    let mut fates = HashMap::new();
    let mut steps = Vec::new();
    deliver_splitting(ctx, &events, 1, &mut fates, &mut steps)?;
    let steps = format!("sent (events→status) {}", steps.join(", "));
    let good: Vec<&str> = events
        .iter()
        .filter(|e| e.id != bad)
        .map(|e| e.id.as_str())
        .collect();
    for id in &good {
        match fates.get(*id) {
            Some(Fate::Delivered { .. }) => {}
            Some(Fate::Rejected { reason }) => {
                return Err(Verdict::fail(
                    format!("{steps}; a valid event was listed in rejected ({reason})"),
                    "reject only the malformed event: the SDK quarantines what rejected lists",
                ));
            }
            Some(Fate::RefusedAlone { status }) => {
                return Err(Verdict::fail(
                    format!("{steps}; a valid event was refused alone with {status}"),
                    "refuse only the malformed event: the SDK quarantines a lone refused event",
                ));
            }
            None => return Err(internal("an event was never sent".into())),
        }
    }
    let silently = Verdict::fail(
        format!("{steps}; the malformed event was covered by a 2xx, not rejected, and not stored"),
        "list a refused event in `rejected` ({\"event_id\",\"reason\"}) or answer 400 for the \
         batch: the SDK deletes every event a 2xx does not reject, so this one is lost without \
         a trace",
    );
    let how = match fates.get(&bad) {
        Some(Fate::Rejected { reason }) => format!("listed in rejected ({reason})"),
        Some(Fate::RefusedAlone { status }) => format!("refused alone with {status}"),
        Some(Fate::Delivered { short: Some(s) }) if *s > 0 => {
            let mut v = silently;
            v.did = format!("{steps}; a 2xx covered the malformed event and counted {s} fewer");
            return Err(v);
        }
        Some(Fate::Delivered { short }) => match ctx.stored(&[bad.as_str()]) {
            Some(Ok(stored)) if stored.contains_key(&bad) => "kept as sent (read back)".into(),
            Some(Ok(_)) => return Err(silently),
            Some(Err(e)) => {
                return Err(Verdict::fail(
                    e,
                    "make --verify-cmd print the stored ids (docs/cli.md)",
                ));
            }
            None if short.is_some() => "kept as sent (its counts say so)".into(),
            None => {
                return Ok(Verdict::not_applicable(format!(
                    "{steps}; a 2xx without counts covered the malformed event: whether it was \
                     kept is unknown (pass --verify-cmd)"
                )));
            }
        },
        None => return Err(internal("the malformed event was never sent".into())),
    };
    let back = stored_once(ctx, &good, "the valid events")?;
    Ok(Verdict::pass(format!(
        "{steps}; the malformed event {how}, the 3 valid ones delivered; {back}"
    )))
}

/// `encodings`: a gzip body (as the SDK sends every body over 1 KiB) and an identity body.
pub fn encodings(ctx: &mut Ctx) -> Judged {
    const N: usize = 8;
    let gz = ctx.events(N, 300).map_err(internal)?;
    let request = ctx.request(&gz, 1, true);
    if !request
        .http
        .headers
        .iter()
        .any(|(k, v)| k == "Content-Encoding" && v == "gzip")
    {
        return Err(internal("the SDK did not gzip a body over 1 KiB".into()));
    }
    let gz_bytes = request.http.body.len();
    let gz_answer = ctx.send(request);
    accepted_all(
        ctx,
        &gz_answer,
        N,
        "decode `Content-Encoding: gzip`: the SDK gzips every body over 1 KiB (compression = \
         gzip is its default)",
    )?;
    let plain = ctx.events(N, 300).map_err(internal)?;
    let request = ctx.request(&plain, 1, false);
    let plain_bytes = request.http.body.len();
    let plain_answer = ctx.send(request);
    accepted_all(
        ctx,
        &plain_answer,
        N,
        "accept a body without Content-Encoding: the SDK sends bodies of 1 KiB or less, and all \
         of them with compression = none, as they are",
    )?;
    let all: Vec<&str> = ids(&gz).into_iter().chain(ids(&plain)).collect();
    let back = stored_once(ctx, &all, "both batches")?;
    Ok(Verdict::pass(format!(
        "gzip ({gz_bytes} bytes): {}; identity ({plain_bytes} bytes): {}; {back}",
        brief(&gz_answer),
        brief(&plain_answer)
    )))
}

/// The answer delivers all `n` events of a fresh batch; `fix` is what to do when it is a status
/// the collector should not have given.
fn accepted_all(ctx: &Ctx, answer: &Answer, n: usize, fix: &str) -> Result<(), Verdict> {
    if let Err(mut v) = delivered(ctx, answer, "2xx") {
        if answer
            .status()
            .is_some_and(|s| s >= 400 && !matches!(s, 401 | 403 | 429 | 503))
        {
            v.fix = Some(fix.to_owned());
        }
        return Err(v);
    }
    let c = Counts::of(answer);
    if let Some(a) = c.accepted.filter(|&a| a != n as u64) {
        return Err(Verdict::fail(
            format!("{}: accepted {a} of {n}", describe(ctx, answer)),
            fix,
        ));
    }
    Ok(())
}

/// The event's members in the reverse of the order eventspool writes them today.
fn reversed(json: &str) -> Result<String, String> {
    let map: Map<String, Value> =
        serde_json::from_str(json).map_err(|e| format!("cannot read a test event: {e}"))?;
    let order = ["properties", "session_id", "name", "timestamp", "event_id"];
    let mut members: Vec<String> = Vec::new();
    for key in order {
        if let Some(v) = map.get(key) {
            members.push(format!("{}:{v}", Value::String(key.into())));
        }
    }
    for (key, v) in map.iter().filter(|(k, _)| !order.contains(&k.as_str())) {
        members.push(format!("{}:{v}", Value::String(key.clone())));
    }
    Ok(format!("{{{}}}", members.join(",")))
}

/// `field_order`: events whose members come in another order are read all the same.
pub fn field_order(ctx: &mut Ctx) -> Judged {
    const N: usize = 3;
    let events = ctx.events(N, 0).map_err(internal)?;
    let reordered = events
        .iter()
        .map(|e| reversed(&e.json))
        .collect::<Result<Vec<_>, _>>()
        .map_err(internal)?;
    let request: Req = ctx.request_of_json(reordered.iter().map(String::as_str), 1, false);
    let answer = ctx.send(request);
    accepted_all(
        ctx,
        &answer,
        N,
        "read an event's members by name, in any order (docs/protocol.md §Event): queued events \
         of older releases are resent in the order they were written",
    )?;
    let back = stored_once(ctx, &ids(&events), "the batch")?;
    Ok(Verdict::pass(format!(
        "members in reverse order (properties … event_id): {}; {back}",
        brief(&answer)
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    const EVENT: &str = r#"{"event_id":"0193","timestamp":"2026-11-29T11:58:00.001Z","name":"n","properties":{"a":1}}"#;

    #[test]
    fn reversed_members_keep_every_value() {
        let text = reversed(EVENT).unwrap();
        assert!(
            text.starts_with(r#"{"properties":{"a":1},"name":"n""#),
            "{text}"
        );
        assert!(text.ends_with(r#""event_id":"0193"}"#), "{text}");
        let a: Value = serde_json::from_str(EVENT).unwrap();
        let b: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(a, b);
    }

    #[test]
    fn a_malformed_event_differs_only_in_its_timestamp() {
        let bad: Value = serde_json::from_str(&malform(EVENT).unwrap()).unwrap();
        assert_eq!(bad["timestamp"], "not-a-timestamp");
        assert_eq!(bad["event_id"], "0193");
        assert_eq!(bad["properties"]["a"], 1);
    }
}
