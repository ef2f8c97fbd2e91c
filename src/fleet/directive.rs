//! Directives a collector may put in a 2xx answer (docs/protocol.md §Directives), parsed and
//! checked here as pure functions of the JSON and the clock: nothing is applied until every field
//! has been checked, and a field that fails is ignored and counted, never guessed at.
//!
//! The bounds below are what keeps a collector (or whoever answers in its name) from steering a
//! device further than a server should: one-shot actions touch only the quarantine, the pause is
//! capped like `Retry-After`, and every setting ends with its expiry.

use serde_json::{Map, Value};

use crate::event::parse_timestamp;
use crate::quarantine::reason;

/// Longest directive id; an id is an opaque name, not data.
pub const MAX_ID_BYTES: usize = 64;
/// A directive lives at most this long on a device (then the app's own settings hold again).
pub const MAX_TTL_MS: u64 = 30 * 24 * 3600 * 1000;
/// Its life when the collector gives none.
pub const DEFAULT_TTL_MS: u64 = 24 * 3600 * 1000;
/// Entries of `sample_rate` (name prefixes) and of `drop_names`.
pub const MAX_SAMPLE_PREFIXES: usize = 32;
pub const MAX_DROP_NAMES: usize = 64;
/// Same as an event name's limit.
pub const MAX_NAME_BYTES: usize = 256;

/// The quarantine reasons `redrive` and `purge_quarantine` may name.
pub const REASONS: [&str; 4] = [
    reason::REJECTED,
    reason::BAD_REQUEST,
    reason::TOO_LARGE,
    reason::MAX_SENDS,
];

/// A checked directive: what to do once (by `id`) and what holds until `expires_at_ms`.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Directive {
    pub id: String,
    /// Its life from its arrival (`ttl_ms`, capped): counted on the monotonic clock.
    #[serde(default)]
    pub ttl_ms: u64,
    /// Wall clock, ms, as estimated at its arrival: only bounds its life after a restart (see
    /// [`Directive::left_at_restart`]).
    pub expires_at_ms: i64,
    /// The life it had left when it was last kept in the store (`None` in a store written
    /// before it was kept).
    #[serde(default)]
    pub left_ms: Option<u64>,
    pub redrive: Vec<String>,
    pub purge_quarantine: Vec<String>,
    /// Wall clock, ms, as the collector asked it.
    pub pause_asked_ms: Option<i64>,
    /// The same, capped at `retry_after_cap_ms` from its arrival (see [`Directive::cap_pause`]).
    pub pause_until_ms: Option<i64>,
    /// (name prefix, fraction kept), longest prefix first.
    pub sample_rate: Vec<(String, f64)>,
    pub drop_names: Vec<String>,
}

impl Directive {
    /// A pause lasts at most `cap_ms` from its arrival at `now_ms`, like `Retry-After`; the
    /// capped end is what is kept, so a restart does not pause again from the start.
    pub fn cap_pause(&mut self, now_ms: i64, cap_ms: u64) {
        self.pause_until_ms = self
            .pause_asked_ms
            .map(|at| at.min(now_ms.saturating_add(cap_ms as i64)));
    }

    /// The fraction of new events named `name` to keep: the longest matching prefix decides.
    pub fn keep_fraction(&self, name: &str) -> f64 {
        self.sample_rate
            .iter()
            .find(|(prefix, _)| name.starts_with(prefix.as_str()))
            .map_or(1.0, |(_, rate)| *rate)
    }

    /// The life it has left when a restart finds it in the store at wall time `wall_ms`: what
    /// was left when it was kept (the monotonic clock does not survive a restart), and never
    /// more than its wall-clock end says, so a clock put right in between can only end it
    /// sooner.
    pub fn left_at_restart(&self, wall_ms: i64) -> u64 {
        let by_wall = self.expires_at_ms.saturating_sub(wall_ms).max(0) as u64;
        self.left_ms.unwrap_or(by_wall).min(by_wall).min(MAX_TTL_MS)
    }

    pub fn drops_name(&self, name: &str) -> bool {
        self.drop_names.iter().any(|n| n == name)
    }
}

/// What a `directives` object yielded: the directive (when its id and expiry are usable) and
/// the fields that were ignored, each with why.
#[derive(Debug, Default, PartialEq)]
pub struct Parsed {
    pub directive: Option<Directive>,
    pub ignored: Vec<String>,
}

/// Reads the `directives` member of a 2xx body at wall time `now_ms`. A body without one gives
/// nothing and ignores nothing.
pub fn parse(body: &Value, now_ms: i64) -> Parsed {
    let Some(raw) = body.get("directives") else {
        return Parsed::default();
    };
    let mut out = Parsed::default();
    let Value::Object(fields) = raw else {
        out.ignored.push("directives: not an object".into());
        return out;
    };
    let id = match fields.get("id") {
        Some(Value::String(id)) if !id.is_empty() && id.len() <= MAX_ID_BYTES => id.clone(),
        _ => {
            out.ignored.push(format!(
                "directives: id must be a string of 1-{MAX_ID_BYTES} bytes"
            ));
            return out;
        }
    };
    let ttl = match fields.get("ttl_ms") {
        None => DEFAULT_TTL_MS,
        Some(v) => match v.as_u64() {
            Some(0) => {
                out.ignored
                    .push(format!("directives {id}: expired (ttl_ms 0)"));
                return out;
            }
            Some(ttl) => ttl.min(MAX_TTL_MS),
            None => {
                out.ignored
                    .push(format!("directives {id}: ttl_ms is not a positive integer"));
                return out;
            }
        },
    };
    let mut d = Directive {
        id: id.clone(),
        ttl_ms: ttl,
        expires_at_ms: now_ms.saturating_add(ttl as i64),
        ..Directive::default()
    };
    for (key, value) in fields {
        let result = match key.as_str() {
            "id" | "ttl_ms" => Ok(()),
            "redrive" => reasons(value).map(|r| d.redrive = r),
            "purge_quarantine" => reasons(value).map(|r| d.purge_quarantine = r),
            "pause_until" => pause_until(value, now_ms).map(|p| d.pause_asked_ms = p),
            "sample_rate" => sample_rate(value).map(|s| d.sample_rate = s),
            "drop_names" => drop_names(value).map(|n| d.drop_names = n),
            _ => Err("unknown directive".to_string()),
        };
        if let Err(why) = result {
            out.ignored.push(format!("directives {id}: {key}: {why}"));
        }
    }
    out.directive = Some(d);
    out
}

/// What a device would ignore of the `directives` in the 2xx answer `body` at wall time
/// `now_ms`, each with why (malformed, unknown, past a bound, expired); empty when they are
/// well formed or absent. For tools that check a collector's answers against the SDK's bounds.
pub fn problems(body: &Value, now_ms: i64) -> Vec<String> {
    parse(body, now_ms).ignored
}

fn strings(value: &Value, max: usize) -> Result<Vec<String>, String> {
    let Value::Array(items) = value else {
        return Err("not an array of strings".into());
    };
    if items.len() > max {
        return Err(format!("more than {max} entries"));
    }
    items
        .iter()
        .map(|v| match v {
            Value::String(s) if !s.is_empty() && s.len() <= MAX_NAME_BYTES => Ok(s.clone()),
            _ => Err(format!(
                "entries must be strings of 1-{MAX_NAME_BYTES} bytes"
            )),
        })
        .collect()
}

fn reasons(value: &Value) -> Result<Vec<String>, String> {
    let mut list = strings(value, REASONS.len())?;
    if let Some(bad) = list.iter().find(|r| !REASONS.contains(&r.as_str())) {
        return Err(format!("unknown quarantine reason {bad:?}"));
    }
    list.sort();
    list.dedup();
    Ok(list)
}

fn pause_until(value: &Value, now_ms: i64) -> Result<Option<i64>, String> {
    let Value::String(text) = value else {
        return Err("not an RFC 3339 date-time string".into());
    };
    let at = parse_timestamp(text).map_err(|_| "not an RFC 3339 date-time string".to_string())?;
    // A time already past asks for nothing.
    Ok((at > now_ms).then_some(at))
}

fn sample_rate(value: &Value) -> Result<Vec<(String, f64)>, String> {
    let Value::Object(map) = value else {
        return Err("not an object of name prefix to fraction".into());
    };
    if map.len() > MAX_SAMPLE_PREFIXES {
        return Err(format!("more than {MAX_SAMPLE_PREFIXES} prefixes"));
    }
    let mut rates = rates(map)?;
    // Longest prefix first, so the most specific one decides.
    rates.sort_by(|a, b| b.0.len().cmp(&a.0.len()).then(a.0.cmp(&b.0)));
    Ok(rates)
}

fn rates(map: &Map<String, Value>) -> Result<Vec<(String, f64)>, String> {
    map.iter()
        .map(|(prefix, rate)| {
            if prefix.is_empty() || prefix.len() > MAX_NAME_BYTES {
                // An empty prefix would match every name.
                return Err(format!("a prefix must be 1-{MAX_NAME_BYTES} bytes"));
            }
            match rate.as_f64() {
                Some(r) if (0.0..=1.0).contains(&r) => Ok((prefix.clone(), r)),
                _ => Err(format!("rate for {prefix:?} is not a number in [0, 1]")),
            }
        })
        .collect()
}

fn drop_names(value: &Value) -> Result<Vec<String>, String> {
    strings(value, MAX_DROP_NAMES)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const NOW: i64 = 1_764_417_600_000;

    #[test]
    fn a_full_directive_parses_within_its_bounds() {
        let body = json!({"directives": {
            "id": "d-1", "ttl_ms": MAX_TTL_MS * 4,
            "redrive": ["bad_request", "bad_request"], "purge_quarantine": ["max_sends"],
            "pause_until": "2025-11-29T12:10:00.000Z",
            "sample_rate": {"debug_": 0.1, "debug_verbose_": 0.0},
            "drop_names": ["spam"]}});
        let p = parse(&body, NOW);
        assert_eq!(p.ignored, Vec::<String>::new());
        let d = p.directive.unwrap();
        assert_eq!(d.expires_at_ms, NOW + MAX_TTL_MS as i64, "ttl capped");
        assert_eq!(d.redrive, vec!["bad_request"]);
        assert_eq!(d.purge_quarantine, vec!["max_sends"]);
        assert_eq!(d.pause_asked_ms, Some(NOW + 600_000));
        let mut capped = d.clone();
        capped.cap_pause(NOW, 60_000);
        assert_eq!(
            capped.pause_until_ms,
            Some(NOW + 60_000),
            "capped like Retry-After"
        );
        assert_eq!(d.keep_fraction("debug_verbose_x"), 0.0);
        assert_eq!(d.keep_fraction("debug_x"), 0.1);
        assert_eq!(d.keep_fraction("screen_view"), 1.0);
        assert!(d.drops_name("spam") && !d.drops_name("spam2"));
    }

    #[test]
    fn malformed_unknown_and_expired_directives_are_ignored_one_by_one() {
        let body = json!({"directives": {
            "id": "d-2", "redrive": ["everything"], "sample_rate": {"a": 1.5},
            "drop_names": "spam", "pause_until": "tomorrow", "delete_queue": true,
            "purge_quarantine": ["rejected"]}});
        let p = parse(&body, NOW);
        assert_eq!(p.ignored.len(), 5, "{:?}", p.ignored);
        let d = p.directive.unwrap();
        assert_eq!(
            d.purge_quarantine,
            vec!["rejected"],
            "the good field still holds"
        );
        assert!(d.redrive.is_empty() && d.sample_rate.is_empty() && d.drop_names.is_empty());
        for bad in [
            json!({"directives": {"id": "d-3", "ttl_ms": 0, "redrive": ["rejected"]}}),
            json!({"directives": {"redrive": ["rejected"]}}),
            json!({"directives": {"id": "x".repeat(65)}}),
            json!({"directives": [1]}),
        ] {
            let p = parse(&bad, NOW);
            assert!(p.directive.is_none(), "{bad}");
            assert_eq!(p.ignored.len(), 1, "{bad}");
        }
        assert_eq!(parse(&json!({"accepted": 1}), NOW), Parsed::default());
    }

    /// An empty prefix would match every name: refused as malformed, like a rate out of range.
    #[test]
    fn an_empty_sample_prefix_is_malformed() {
        let p = parse(
            &json!({"directives": {"id": "x", "sample_rate": {"": 0}}}),
            NOW,
        );
        assert_eq!(p.ignored.len(), 1, "{:?}", p.ignored);
        assert!(p.ignored[0].contains("sample_rate"), "{:?}", p.ignored);
        assert!(p.directive.unwrap().sample_rate.is_empty());
    }
}
