//! A device's requests: the fate the world gives each one the moment the worker starts it (the
//! collector's answer, a lost answer, a refused connection, a timeout), the checks a request
//! start must pass, and the answer landing at its simulated time.

use std::io::Read;
use std::sync::{Arc, Mutex};

use eventspool::{HttpRequest, HttpResponse, TransportError};
use serde_json::Value;

use super::{
    Device, FAILING_HOUR_REQUESTS, FRESH_START_REQUESTS, Finding, RETRY_AFTER_CAP_MS, lock,
};
use crate::collector::{Mood, Received};
use crate::net::Slot;
use crate::plan::{HOUR_MS, SECOND_MS};

/// A request the world decided the fate of, waiting for its moment.
pub(super) struct Flight {
    pub(super) at_ms: u64,
    pub(super) slot: Arc<Mutex<Slot>>,
    pub(super) answer: Result<HttpResponse, TransportError>,
    /// Ids the collector acknowledged in a 2xx the device will read whole.
    pub(super) acked: usize,
    pub(super) retry_after_s: Option<u64>,
    pub(super) directive: Option<(String, bool, Option<i64>)>,
    /// Event indexes the request carried.
    pub(super) carried: Vec<usize>,
    /// Events a 2xx read whole lists as `rejected` (the SDK quarantines each).
    pub(super) rejected: Vec<usize>,
    /// A denial returned Ok while it was on the wire: what does not come back delivered is
    /// deleted as the denial deletes (README §Consent).
    pub(super) spared: bool,
}

impl Device {
    /// Decides the fate of a request the worker just started.
    pub(super) fn dispatch(
        &mut self,
        request: HttpRequest,
        slot: Arc<Mutex<Slot>>,
        step: u64,
    ) -> Result<(), Finding> {
        // Order is judged when a batch is taken (`Device::note_takes`), on the device's own tick.
        let _ = step;
        self.figures.requests += 1;
        let now = self.now();
        if lock(&self.link).started_after_no > 0 {
            return Err(
                "a request started after set_consent(Denied) or set_enabled(false) returned".into(),
            );
        }
        if let Some(until) = self.retry_after_hold.filter(|u| *u > now) {
            return Err(format!(
                "a request {} ms before the collector's Retry-After ended",
                until - now
            ));
        }
        if let Some(until) = self.pause_hold.filter(|u| *u > now) {
            return Err(format!(
                "a request {} ms before the directive's pause_until ended",
                until - now
            ));
        }
        let body = decode(&request)?;
        let parsed: Value = serde_json::from_slice(&body)
            .map_err(|e| format!("a request body that is not JSON: {e}"))?;
        let mut received = Vec::new();
        let mut carried = Vec::new();
        let mut first_ts: [Option<(i64, usize)>; 2] = [None; 2];
        for e in parsed["batch"].as_array().into_iter().flatten() {
            let id = e["event_id"].as_str().unwrap_or_default().to_string();
            if !self.by_id.contains_key(&id) {
                self.learn_id(&id, e);
            }
            let Some(&idx) = self.by_id.get(&id) else {
                return Err(format!(
                    "the collector got an id the app never tracked: {id}"
                ));
            };
            let ev = &mut self.events[idx];
            if ev.denied {
                return Err(format!(
                    "event {idx}, tracked before a denial, went out in a request that started after it"
                ));
            }
            if ev.damaged {
                return Err(format!(
                    "event {idx}, whose sealed row was damaged on disk, went out in a request (its payload cannot open)"
                ));
            }
            let lane = usize::from(ev.critical);
            if !ev.sent && !ev.redriven {
                if let Some((prev, _)) = first_ts[lane]
                    && ev.ts_ms < prev
                {
                    return Err(format!(
                        "event {idx} (ts {}) follows a newer one in its batch",
                        ev.ts_ms
                    ));
                }
                first_ts[lane] = Some((ev.ts_ms, idx));
            }
            ev.sent = true;
            received.push(Received {
                id,
                name: e["name"].as_str().unwrap_or_default().to_string(),
            });
            carried.push(idx);
        }
        let stall = request.stall_timeout.as_millis() as u64;
        let mood = Mood {
            refuse_every_body: now < self.refuse_until && !self.healed,
            body_limit: 48 * 1024,
            wall_ms: self.wall(),
        };
        let latency = self.net.u64(20..=400);
        let roll = if self.healed {
            1000
        } else {
            self.net.u32(0..1000)
        };
        let (at, answer, kind, reply) = if now < self.partition_until && !self.healed {
            match self.net.bool() {
                true => (
                    now + 5,
                    Err(TransportError::Connect("refused".into())),
                    "refused",
                    None,
                ),
                false => (
                    now + stall,
                    Err(TransportError::Timeout),
                    "unanswered",
                    None,
                ),
            }
        } else if now < self.overloaded_until && !self.healed {
            let reply = self.collector.overloaded(&mut self.net);
            (
                now + latency,
                Ok(reply.response.clone()),
                "refusal",
                Some(reply),
            )
        } else if roll < 10 {
            (
                now + 5,
                Err(TransportError::Connect("refused".into())),
                "refused",
                None,
            )
        } else if roll < 20 {
            (
                now + latency,
                Err(TransportError::Io("reset before the body".into())),
                "reset",
                None,
            )
        } else if roll < 40 || (now < self.slow_until && body.len() > 8 * 1024 && !self.healed) {
            // The body went (or some of it); the collector may have stored it; no answer.
            if self.net.bool() {
                let _ = self
                    .collector
                    .answer(&mut self.net, &received, body.len(), &mood);
            }
            (now + stall, Err(TransportError::Timeout), "timeout", None)
        } else if roll < 50 {
            let _ = self
                .collector
                .answer(&mut self.net, &received, body.len(), &mood);
            (
                now + latency,
                Err(TransportError::Io(
                    "connection closed before the answer".into(),
                )),
                "answer lost",
                None,
            )
        } else {
            let mut reply = if self.healed {
                self.collector.answer_healthy(&received, body.len(), &mood)
            } else {
                self.collector
                    .answer(&mut self.net, &received, body.len(), &mood)
            };
            if reply.response.body.len() > request.max_response_bytes {
                reply.response.body.truncate(request.max_response_bytes);
                reply.response.truncated = true;
            }
            let status = reply.response.status;
            (
                now + latency,
                Ok(reply.response.clone()),
                if status >= 300 {
                    "refusal"
                } else if is_html(&reply.response) {
                    "portal"
                } else {
                    "2xx"
                },
                Some(reply),
            )
        };
        let read_whole = matches!(&answer, Ok(r) if (200..300).contains(&r.status) && !r.truncated && !is_html(r));
        let status = answer.as_ref().map(|r| r.status).ok();
        self.trace.line(
            now,
            format_args!(
                "request {} events {:?}: {kind} {status:?} rejected {:?}",
                carried.len(),
                &carried[..carried.len().min(4)],
                reply
                    .as_ref()
                    .map(|r| r
                        .refused
                        .iter()
                        .map(|id| self.by_id[id])
                        .collect::<Vec<_>>())
                    .unwrap_or_default()
            ),
        );
        if !matches!(status, Some(200..=299))
            && !matches!(status, Some(400 | 413 | 401 | 403 | 404))
        {
            let hour = now / HOUR_MS;
            let (failed, fresh) = *self
                .failing
                .entry(hour)
                .and_modify(|e| e.0 += 1)
                .or_insert((1, 0));
            let bound = FAILING_HOUR_REQUESTS + FRESH_START_REQUESTS * (fresh + 1);
            if failed > bound && !self.healed {
                return Err(format!(
                    "{failed} failing requests in simulated hour {hour} ({fresh} fresh starts): a hot loop"
                ));
            }
        }
        self.flight = Some(Flight {
            at_ms: at,
            slot,
            acked: match (&reply, read_whole) {
                (Some(r), true) => r.acked.len(),
                _ => 0,
            },
            retry_after_s: reply.as_ref().and_then(|r| r.retry_after_s),
            directive: match read_whole {
                true => reply.as_ref().and_then(|r| r.directive.clone()),
                false => None,
            },
            rejected: match (&reply, read_whole) {
                (Some(r), true) => r.refused.iter().map(|id| self.by_id[id]).collect(),
                _ => Vec::new(),
            },
            answer,
            carried,
            spared: false,
        });
        Ok(())
    }

    /// The answer reaches the device (unless the worker gave the attempt up meanwhile).
    pub(super) fn land(&mut self, f: Flight) -> Result<(), Finding> {
        let gone = lock(&f.slot).gone;
        if f.spared {
            // Given up (a crash, a timeout) or answered: what the device did not read as
            // delivered must be gone from the files once the worker has settled.
            self.spared_back = Some(match gone || f.acked == 0 {
                true => f.carried.clone(),
                false => f.rejected.clone(),
            });
        }
        if gone {
            return Ok(());
        }
        let now = self.now();
        self.acks += f.acked as u64;
        self.retry_after_hold = f
            .retry_after_s
            .map(|s| now + (s * SECOND_MS).min(RETRY_AFTER_CAP_MS));
        if let Some((id, redrive, pause)) = f.directive {
            // A directive may purge dead letters (once per id): what the quarantine holds now
            // may be gone by the collector's choice.
            self.note_purgeable()?;
            let seen = self.directive_faults.get(&id).copied();
            if seen == Some(self.figures.faults)
                && let Some(spool) = self.spool()
            {
                let st = spool.stats();
                let cap = st.dropped.get("quarantine_cap").copied().unwrap_or(0);
                self.replayed = Some((id.clone(), st.redriven, st.quarantine, cap));
            }
            if seen.is_none() && !self.faults.armed() {
                self.directive_landed.push(id.clone());
            }
            if self.directive_ids.insert(id) {
                if redrive {
                    self.redrives += 1;
                    self.mark_redriven();
                }
                self.pause_hold = pause.map(|wall| {
                    let left = (wall - self.wall()).max(0) as u64;
                    now + left.min(RETRY_AFTER_CAP_MS)
                });
            } else {
                self.pause_hold = None;
            }
        }
        // A store that cannot take the dead letters keeps them queued (they are rejected again
        // later): only a healthy store's rejections count toward a loop.
        let healthy = !self.faults.armed();
        for idx in f.rejected.into_iter().filter(|_| healthy) {
            let n = self.rejections.entry(idx).or_default();
            *n += 1;
            if *n > 1 + self.redrives {
                return Err(format!(
                    "event {idx} was rejected {n} times with {} redrives (by the app or distinct directive ids): a redrive loop",
                    self.redrives
                ));
            }
        }
        Slot::answer(&f.slot, f.answer);
        Ok(())
    }

    /// An event of a `track_batch` whose error did not name it: its payload says which it is.
    pub(super) fn learn_id(&mut self, id: &str, event: &Value) {
        let Some(idx) = event["properties"]["p"]
            .as_str()
            .and_then(|p| p.strip_prefix("SIMPAYLOAD-"))
            .and_then(|p| p.trim_end_matches('-').parse::<usize>().ok())
        else {
            return;
        };
        let placeholder = format!("unnamed-{idx}");
        if self.by_id.remove(&placeholder).is_some() {
            self.events[idx].id = id.to_string();
            // Taken unnamed before this send: its order could not be judged then.
            self.events[idx].taken = true;
            self.by_id.insert(id.to_string(), idx);
        }
    }
}

fn is_html(r: &HttpResponse) -> bool {
    r.body.starts_with(b"<html")
}

/// The request body as the collector reads it (gunzipped when the SDK compressed it).
fn decode(request: &HttpRequest) -> Result<Vec<u8>, Finding> {
    let gzip = request
        .headers
        .iter()
        .any(|(k, v)| k.eq_ignore_ascii_case("content-encoding") && v == "gzip");
    if !gzip {
        return Ok(request.body.clone());
    }
    let mut out = Vec::new();
    flate2::read::GzDecoder::new(&request.body[..])
        .read_to_end(&mut out)
        .map_err(|e| format!("a gzip body that does not decode: {e}"))?;
    Ok(out)
}
