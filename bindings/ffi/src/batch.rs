//! `track_batch_report`: a batch handed over by a foreign layer's background thread (Kotlin's
//! hand-off), where every event's fate must come back in one call.
//!
//! Why beside `track_batch`: that one is all or none, right for a script that wants to know its
//! input was bad. A layer whose `track()` already returned needs the opposite: record what can be
//! recorded and name, per event, why the rest was not. Retrying the refused batch event by event
//! from the foreign side costs one FFI call per event (tens of microseconds each through JNA) and
//! loses the reason; here the fallback runs in Rust, and a refusal that is the spool's, not the
//! events' (consent denied, tracking disabled, shut down), comes back once for the whole batch.

use eventspool::Error;

use crate::{EventSpool, SpoolError, guard};

/// Why an event or a batch was not recorded: a stable `reason` code (the counters' name) and the
/// message for a log.
#[derive(Debug, Clone, PartialEq, Eq, uniffi::Record)]
pub struct Refusal {
    /// `invalid_event`, `event_too_large`, `tracking_disabled`, `consent_denied`, `shut_down`,
    /// `storage`, `batch_refused` or `internal`.
    pub reason: String,
    pub message: String,
}

/// One refused line of the batch; the batch's other lines were recorded.
#[derive(Debug, Clone, PartialEq, Eq, uniffi::Record)]
pub struct RefusedLine {
    /// 1-based, as in the input.
    pub line: u64,
    pub refusal: Refusal,
}

/// What `track_batch_report` did with every line of its batch.
#[derive(Debug, Clone, PartialEq, Eq, uniffi::Record)]
pub struct BatchReport {
    /// Events the spool took (those a `sample_rate` directive left out included: they are
    /// counted in `stats().dropped`, by the core).
    pub recorded: u64,
    /// Set when the spool refused the whole batch for a reason of its own (consent denied,
    /// tracking disabled, shut down): nothing was recorded and `refused` is empty.
    pub refused_all: Option<Refusal>,
    /// Lines refused for what they hold (bad JSON, too large, a name the collector drops).
    pub refused: Vec<RefusedLine>,
    /// Under `durability = always` (or for critical events), the store could not take them:
    /// recorded in memory and delivered, but not durable yet (`SpoolError.NotDurable`).
    pub not_durable: Option<String>,
}

/// The counters' name for a refusal: one table, used for the whole batch and for each event.
pub(crate) fn reason_code(e: &Error) -> &'static str {
    match e {
        Error::InvalidEvent(_) => "invalid_event",
        Error::EventTooLarge { .. } => "event_too_large",
        Error::Disabled => "tracking_disabled",
        Error::ConsentDenied => "consent_denied",
        Error::ShutDown => "shut_down",
        Error::Storage(_) => "storage",
        Error::BatchRefused(_) => "batch_refused",
        _ => "internal",
    }
}

fn refusal(e: &Error) -> Refusal {
    Refusal {
        reason: reason_code(e).to_string(),
        message: e.to_string(),
    }
}

/// A refusal that is the spool's state, the same for every event of any batch.
fn refuses_every_event(e: &Error) -> bool {
    matches!(e, Error::Disabled | Error::ConsentDenied | Error::ShutDown)
}

#[uniffi::export]
impl EventSpool {
    /// Records the events of `events_jsonl` (the lines of `track_batch`) that can be recorded
    /// and reports, in one call, why the others were not: a foreign layer's background thread
    /// hands its queue over with it. The events go in one `track_batch` (one commit under
    /// `durability = always`); only when that refuses a line does each event go alone, so one
    /// bad event costs only itself. Never fails: even `ShutDown` comes back as `refused_all`.
    pub fn track_batch_report(&self, events_jsonl: String) -> BatchReport {
        let outcome = guard(|| {
            let Some(core) = self.core() else {
                return Ok(whole(&Error::ShutDown));
            };
            Ok(record(&core, &events_jsonl))
        });
        outcome.unwrap_or_else(|e: SpoolError| BatchReport {
            recorded: 0,
            refused_all: Some(Refusal {
                reason: "internal".into(),
                message: e.to_string(),
            }),
            refused: Vec::new(),
            not_durable: None,
        })
    }
}

fn whole(e: &Error) -> BatchReport {
    BatchReport {
        recorded: 0,
        refused_all: Some(refusal(e)),
        refused: Vec::new(),
        not_durable: None,
    }
}

fn record(core: &eventspool::EventSpool, events_jsonl: &str) -> BatchReport {
    let mut refused = Vec::new();
    let mut lines = Vec::new();
    let mut events = Vec::new();
    for (i, text) in events_jsonl.lines().enumerate() {
        match eventspool::NewEvent::from_numbered_line(i + 1, text) {
            Ok(Some(event)) => {
                lines.push(i as u64 + 1);
                events.push(event);
            }
            Ok(None) => {}
            Err(message) => refused.push(RefusedLine {
                line: i as u64 + 1,
                refusal: Refusal {
                    reason: "invalid_event".into(),
                    message,
                },
            }),
        }
    }
    let mut report = BatchReport {
        recorded: 0,
        refused_all: None,
        refused,
        not_durable: None,
    };
    if events.is_empty() {
        return report;
    }
    match core.track_batch(&events) {
        Ok(ids) => report.recorded = ids.len() as u64,
        Err(Error::NotDurable { event_ids, reason }) => {
            report.recorded = event_ids.len() as u64;
            report.not_durable = Some(reason);
        }
        Err(e) if refuses_every_event(&e) => {
            report.refused_all = Some(refusal(&e));
            report.refused.clear();
        }
        // A line refused for what it holds: each event alone, so only that one is lost.
        Err(_) => {
            for (line, event) in lines.into_iter().zip(events) {
                match core.track_event(event) {
                    Ok(_) => report.recorded += 1,
                    Err(Error::NotDurable { reason, .. }) => {
                        report.recorded += 1;
                        report.not_durable = Some(reason);
                    }
                    Err(e) => report.refused.push(RefusedLine {
                        line,
                        refusal: refusal(&e),
                    }),
                }
            }
            report.refused.sort_by_key(|r| r.line);
        }
    }
    report
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Consent, SpoolConfig};

    fn spool() -> std::sync::Arc<EventSpool> {
        let config = SpoolConfig {
            endpoint: "http://127.0.0.1:9/v1/batch".into(),
            max_event_bytes: Some(2_000),
            ..Default::default()
        };
        EventSpool::new(config, None, None, true).expect("open")
    }

    #[test]
    fn a_bad_line_costs_only_itself_and_says_why() {
        let spool = spool();
        let big = format!(
            r#"{{"name":"big","properties":{{"blob":"{}"}}}}"#,
            "x".repeat(3_000)
        );
        let jsonl = format!("{{\"name\":\"a\"}}\nnot json\n{big}\n{{\"name\":\"b\"}}\n");
        let report = spool.track_batch_report(jsonl);
        assert_eq!(report.recorded, 2, "{report:?}");
        assert_eq!(report.refused_all, None);
        let reasons: Vec<(u64, &str)> = report
            .refused
            .iter()
            .map(|r| (r.line, r.refusal.reason.as_str()))
            .collect();
        assert_eq!(reasons, [(2, "invalid_event"), (3, "event_too_large")]);
        assert_eq!(spool.stats().tracked, 2);
    }

    #[test]
    fn the_spools_own_refusal_comes_back_once_for_the_batch() {
        let spool = spool();
        spool.set_consent(Consent::Denied).expect("consent");
        let report = spool.track_batch_report("{\"name\":\"a\"}\n{\"name\":\"b\"}\n".into());
        assert_eq!(report.recorded, 0);
        assert_eq!(report.refused, []);
        assert_eq!(
            report.refused_all.map(|r| r.reason),
            Some("consent_denied".into())
        );

        spool.shutdown(1_000).expect("shutdown");
        let report = spool.track_batch_report("{\"name\":\"a\"}\n".into());
        assert_eq!(
            report.refused_all.map(|r| r.reason),
            Some("shut_down".into())
        );
    }
}
