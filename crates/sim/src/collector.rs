//! The simulated collector: deduplicates by `event_id` like the reference collector, records
//! what each id went through, and answers from the device's seeded stream: successes, partial
//! `rejected` lists (some longer than the SDK's read bound), every refusal of docs/protocol.md
//! §Responses, a captive portal's web page, and directives, hostile ones included. Each device
//! has its own view (ids never repeat across devices), so one device replays alone.

use std::collections::{HashMap, HashSet};

use eventspool::{HttpResponse, format_timestamp};
use serde_json::{Value, json};

/// An event as the collector read it from a request.
pub struct Received {
    pub id: String,
    pub name: String,
}

/// What became of one request at the collector.
pub struct Reply {
    pub response: HttpResponse,
    /// Ids it stored (new or duplicate) and acknowledged: in a 2xx, not rejected.
    pub acked: Vec<String>,
    /// Ids listed in `rejected`, or alone in a 400/413 (the SDK quarantines those).
    pub refused: Vec<String>,
    /// `Retry-After`, in seconds.
    pub retry_after_s: Option<u64>,
    /// The directive the answer carried: (id, holds a redrive, pause_until in wall ms).
    pub directive: Option<(String, bool, Option<i64>)>,
}

/// Per-id history at the collector.
#[derive(Default)]
pub struct Collector {
    /// Times each id was stored (acknowledged in a 2xx read whole or not).
    pub stored: HashMap<String, u32>,
    /// Times each id was refused alone or listed as rejected.
    pub refusals: HashMap<String, u32>,
    pub requests: u64,
    /// Ids refused alone with a 413 for a body of at least [`SMALL_BODY_BYTES`] (the event
    /// with a client report beside it): the SDK may take that for a size limit.
    pub large_lone_413: HashSet<String>,
    /// Answers in a thousand that carry a directive: most collectors send one now and then,
    /// some (a fleet being steered, a misconfigured one) in many answers, so that ids come back
    /// round (A, B, A) while the quarantine holds dead letters.
    pub directive_per_mille: u32,
}

/// How the collector and whatever stands in front of it behave right now for this device.
pub struct Mood {
    /// A proxy answering 413 to every body.
    pub refuse_every_body: bool,
    /// The largest body (uncompressed bytes) the collector takes.
    pub body_limit: usize,
    /// The device's wall clock, for `pause_until`.
    pub wall_ms: i64,
}

/// The SDK's floor for a size a 413 may teach: a 413 for a smaller body is no size limit.
pub const SMALL_BODY_BYTES: usize = eventspool::testing::MIN_LEARNED_BYTES as usize;

/// A reason long enough that a 2xx rejecting a whole batch of them outgrows the SDK's read bound.
const LONG_REASON_BYTES: usize = 4 * 1024;

impl Collector {
    /// Answers one request that reached it. `roll` decides among the answers; `events` is the
    /// batch as read; `body_len` its uncompressed size.
    pub fn answer(
        &mut self,
        rng: &mut fastrand::Rng,
        events: &[Received],
        body_len: usize,
        mood: &Mood,
    ) -> Reply {
        let roll = rng.u32(0..1000);
        self.answer_with(roll, rng, events, body_len, mood, true)
    }

    /// The answer of a healthy collector after the world healed: whoever ran it fixed what made
    /// it refuse events, so it takes every body within its size limit, no directive.
    pub fn answer_healthy(&mut self, events: &[Received], body_len: usize, mood: &Mood) -> Reply {
        let mut reply = Reply {
            response: response(200, ""),
            acked: Vec::new(),
            refused: Vec::new(),
            retry_after_s: None,
            directive: None,
        };
        if body_len > mood.body_limit {
            reply.response = response(413, "Request Entity Too Large");
            return reply;
        }
        self.requests += 1;
        for e in events {
            *self.stored.entry(e.id.clone()).or_default() += 1;
            reply.acked.push(e.id.clone());
        }
        reply.response = response(200, &format!(r#"{{"accepted":{}}}"#, events.len()));
        reply
    }

    /// An overloaded collector's answer: 503 and a `Retry-After` of 30 s to 10 min.
    pub fn overloaded(&mut self, rng: &mut fastrand::Rng) -> Reply {
        self.requests += 1;
        let s = rng.u64(30..=600);
        let mut response = response(503, r#"{"error":"overloaded"}"#);
        response.headers.push(("Retry-After".into(), s.to_string()));
        Reply {
            response,
            acked: Vec::new(),
            refused: Vec::new(),
            retry_after_s: Some(s),
            directive: None,
        }
    }

    fn answer_with(
        &mut self,
        roll: u32,
        rng: &mut fastrand::Rng,
        events: &[Received],
        body_len: usize,
        mood: &Mood,
        directives: bool,
    ) -> Reply {
        self.requests += 1;
        let mut reply = Reply {
            response: response(200, ""),
            acked: Vec::new(),
            refused: Vec::new(),
            retry_after_s: None,
            directive: None,
        };
        let transient = |status: u16, secs: Option<u64>| {
            let mut r = response(status, r#"{"error":"busy"}"#);
            if let Some(s) = secs {
                r.headers.push(("Retry-After".into(), s.to_string()));
            }
            r
        };
        match roll {
            0..15 => {
                let s = rng.u64(1..=600);
                reply.response = transient(503, Some(s));
                reply.retry_after_s = Some(s);
            }
            15..25 => {
                let s = rng.u64(1..=120);
                reply.response = transient(429, Some(s));
                reply.retry_after_s = Some(s);
            }
            25..40 => reply.response = transient(500, None),
            40..45 => reply.response = transient(408, None),
            45..47 => reply.response = response(401, r#"{"error":"bad key"}"#),
            47..49 => reply.response = response(404, "no such route"),
            49..57 => reply.response = response(400, r#"{"error":"malformed request"}"#),
            57..60 => {
                // A captive portal: a web page, not the collector.
                reply.response = response(200, "<html><body>Sign in to the network</body></html>");
                reply.response.headers = vec![("Content-Type".into(), "text/html".into())];
            }
            _ if mood.refuse_every_body || body_len > mood.body_limit => {
                reply.response = response(413, "Request Entity Too Large");
                if events.len() == 1 {
                    reply.refused.push(events[0].id.clone());
                    if body_len >= SMALL_BODY_BYTES {
                        self.large_lone_413.insert(events[0].id.clone());
                    }
                }
            }
            _ if events.iter().any(|e| e.name == "poison") => {
                reply.response = response(400, r#"{"error":"bad event"}"#);
                if events.len() == 1 {
                    reply.refused.push(events[0].id.clone());
                }
            }
            _ => self.accept(rng, events, roll >= 990, directives, mood, &mut reply),
        }
        for id in &reply.refused {
            *self.refusals.entry(id.clone()).or_default() += 1;
        }
        reply
    }

    fn accept(
        &mut self,
        rng: &mut fastrand::Rng,
        events: &[Received],
        reject_all: bool,
        directives: bool,
        mood: &Mood,
        reply: &mut Reply,
    ) {
        let mut rejected = Vec::new();
        let mut duplicates = 0;
        for e in events {
            if reject_all || e.name == "reject" {
                let reason = match reject_all {
                    true => "r".repeat(LONG_REASON_BYTES),
                    false => "name not allowed".to_string(),
                };
                rejected.push(json!({"event_id": e.id, "reason": reason}));
                reply.refused.push(e.id.clone());
                continue;
            }
            let n = self.stored.entry(e.id.clone()).or_default();
            if *n > 0 {
                duplicates += 1;
            }
            *n += 1;
            reply.acked.push(e.id.clone());
        }
        let mut body = json!({"accepted": reply.acked.len(), "duplicates": duplicates});
        if !rejected.is_empty() {
            body["rejected"] = Value::Array(rejected);
        }
        if directives && rng.u32(0..1000) < self.directive_per_mille {
            let (directive, summary) = directive(rng, mood.wall_ms);
            body["directives"] = directive;
            reply.directive = Some(summary);
        }
        reply.response = response(200, &body.to_string());
    }
}

/// One of a handful of directives, picked by id: the same id always carries the same actions
/// (instances behind a load balancer serving different directives give A, B, A). Some are
/// hostile: an empty sampling prefix, a pause for a day.
fn directive(rng: &mut fastrand::Rng, wall_ms: i64) -> (Value, (String, bool, Option<i64>)) {
    let pick = rng.u32(0..5);
    let id = format!("d{pick}");
    let pause = |ms: i64| format_timestamp(wall_ms + ms);
    let (d, redrive, pause_ms) = match pick {
        0 => (
            json!({"id": id, "ttl_ms": 3_600_000, "redrive": ["rejected", "bad_request", "too_large"]}),
            true,
            None,
        ),
        1 => (
            json!({"id": id, "purge_quarantine": ["too_large"], "sample_rate": {"samp_": 0.5}}),
            false,
            None,
        ),
        2 => {
            let ms = rng.i64(10_000..600_000);
            (
                json!({"id": id, "drop_names": ["legacy_ping"], "pause_until": pause(ms)}),
                false,
                Some(ms),
            )
        }
        3 => (json!({"id": id, "sample_rate": {"": 0.0}}), false, None),
        _ => (
            json!({"id": id, "redrive": ["max_sends", "rejected"], "pause_until": pause(86_400_000)}),
            true,
            Some(86_400_000),
        ),
    };
    (d, (id, redrive, pause_ms.map(|ms| wall_ms + ms)))
}

fn response(status: u16, body: &str) -> HttpResponse {
    HttpResponse {
        status,
        headers: vec![("Content-Type".into(), "application/json".into())],
        body: body.as_bytes().to_vec(),
        truncated: false,
    }
}
