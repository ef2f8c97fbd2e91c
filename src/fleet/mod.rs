//! The fleet loop: each device's loss ledger reaches the collector as client reports, and the
//! collector can steer the device with directives (docs/protocol.md §Client reports,
//! §Directives).
//!
//! Reports ride on requests that go anyway. Before a batch is sent, what changed in the ledger
//! since the last report is cut into a new report with the next id and kept in the store; every
//! request carries the oldest waiting reports, and a 2xx covers them (they are then forgotten).
//! Anything else (no answer, a 5xx, a restart) leaves them waiting, and they are resent with the
//! same ids, so a collector that totals each (install, id) once gets exact totals whatever the
//! network lost, repeated or reordered. When nothing else is to be sent, a report waits for the
//! periodic flush and goes alone, and only to a collector that asked for that
//! (`"reports_alone": true` in a 2xx): any other collector never gets a request it did not ask
//! for, and a device's request count stays what its events make it.
//!
//! Directives come back in 2xx bodies, checked by [`directive`] and applied here: the one-shot
//! actions (`redrive`, `purge_quarantine`) once per directive id, the settings (`pause_until`,
//! `sample_rate`, `drop_names`) until the directive expires. The latest directive replaces the
//! one in force.

pub mod directive;
pub mod report;

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use serde_json::Value;

use crate::queue::Queue;
use crate::shared::lock;
use crate::stats::Stats;
use directive::Directive;
use report::Tally;

/// Reports waiting for a 2xx, at most: past it no new report is cut (its counts stay in the
/// next one), so a collector that never answers 2xx cannot grow the store.
pub const MAX_WAITING_REPORTS: usize = 32;
/// Reports one request carries: a backlog after a long outage drains a few per request.
pub const MAX_REPORTS_PER_REQUEST: usize = 4;
/// Body bytes a batch leaves for its reports, at most (a report is a few hundred bytes): taken
/// from the room of the events, so a body never outgrows `max_batch_bytes` or a limit a 413
/// taught. At most a quarter of the room, so small batch limits keep most of it for events.
pub const MAX_REPORT_ROOM_BYTES: u64 = 4096;

/// The part of a batch's `room` (bytes of event JSON) kept for its reports.
pub fn report_room(room: u64) -> u64 {
    MAX_REPORT_ROOM_BYTES.min(room / 4)
}

/// Names in the store's `fleet` table.
mod key {
    pub const INSTALL_ID: &str = crate::queue::INSTALL_ID_NAME;
    pub const NEXT_REPORT: &str = "next_report";
    pub const DIRECTIVE: &str = "directive";
    pub const APPLIED: &str = "applied";
}

/// What `track()` does with a new event under the directive in force.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Screen {
    Keep,
    /// Left out by `sample_rate`, counted `sampled`.
    Sampled,
    /// Refused by `drop_names`, counted `name_dropped`.
    NameDropped,
}

/// What a 2xx asks the worker to do now.
#[derive(Debug, Default, PartialEq)]
pub struct Steer {
    pub redrive: Vec<String>,
    pub purge_quarantine: Vec<String>,
}

pub struct Fleet {
    /// `None` while consent is denied: a denial deletes it (README §Consent), and a new grant
    /// makes a new one, so reports from before and after cannot be linked.
    install_id: Mutex<Option<String>>,
    directives_on: bool,
    /// `retry_after_cap_ms`: the longest a `pause_until` holds.
    pause_cap_ms: u64,
    /// A directive is in force: `screen` (on every `track()`) takes the lock only then.
    steering: AtomicBool,
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    next_report: u64,
    /// Reports cut and not yet covered by a 2xx, oldest first: (id, wire JSON).
    waiting: Vec<(u64, String)>,
    /// The ledger as of the last report cut (this handle's counters start at zero).
    baseline: Tally,
    quarantined: BTreeMap<String, u64>,
    quarantine_purged: u64,
    /// A 2xx said `"reports_alone": true`: a lone report may go with a periodic flush.
    lone_reports: bool,
    directive: Option<Directive>,
    /// The id whose one-shot actions ran (persisted, so a restart does not run them again).
    applied: Option<String>,
    /// A pause the machine has not been told yet (wall ms).
    pause_untold: Option<i64>,
    sample_rng: Option<fastrand::Rng>,
    applied_count: u64,
    ignored_count: u64,
}

impl Fleet {
    /// Reads what the store keeps (install id, waiting reports, directive in force), making the
    /// install id on first use unless consent is `denied`.
    pub fn load(
        queue: &Queue,
        directives_on: bool,
        pause_cap_ms: u64,
        wall_ms: i64,
        consent: crate::Consent,
    ) -> Fleet {
        let get = |name| {
            queue.fleet_get(name).unwrap_or_else(|e| {
                tracing::warn!(error = %e, name, "could not read the fleet table");
                None
            })
        };
        let install_id = match get(key::INSTALL_ID) {
            _ if consent == crate::Consent::Denied => None,
            Some(id) => Some(id),
            None => new_install_id(queue),
        };
        let waiting = queue.reports().unwrap_or_default();
        let next_report = get(key::NEXT_REPORT)
            .and_then(|n| n.parse().ok())
            .unwrap_or(1)
            .max(waiting.last().map_or(1, |(id, _)| id + 1));
        let directive = get(key::DIRECTIVE)
            .and_then(|d| serde_json::from_str::<Directive>(&d).ok())
            .filter(|d| directives_on && d.expires_at_ms > wall_ms);
        let pause_untold = directive
            .as_ref()
            .and_then(|d| d.pause_until_ms)
            .filter(|at| *at > wall_ms);
        Fleet {
            install_id: Mutex::new(install_id),
            directives_on,
            pause_cap_ms,
            steering: AtomicBool::new(directive.is_some()),
            inner: Mutex::new(Inner {
                next_report,
                waiting,
                directive,
                applied: get(key::APPLIED),
                pause_untold,
                ..Inner::default()
            }),
        }
    }

    pub fn install_id(&self) -> Option<String> {
        lock(&self.install_id).clone()
    }

    /// Consent denied: the install id and the reports waiting to be sent are forgotten (the
    /// queue's deletion took them out of the store), and the ledger so far is never reported.
    pub fn forget_install(&self, stats: &Stats) {
        lock(&self.install_id).take();
        let mut g = lock(&self.inner);
        g.waiting.clear();
        g.baseline = Tally::of(stats, &g.quarantined, g.quarantine_purged);
    }

    /// Consent granted: a new install id if the last denial deleted it. The first report
    /// under it counts from now.
    pub fn ensure_install(&self, queue: &Queue, stats: &Stats) {
        let mut id = lock(&self.install_id);
        if id.is_none() {
            *id = new_install_id(queue);
            let mut g = lock(&self.inner);
            g.baseline = Tally::of(stats, &g.quarantined, g.quarantine_purged);
        }
    }

    /// Quarantined events by reason, which [`Stats`] keeps only as a total.
    pub fn count_quarantined(&self, reason: &str, n: u64) {
        *lock(&self.inner)
            .quarantined
            .entry(reason.to_string())
            .or_default() += n;
    }

    pub fn count_quarantine_purged(&self, n: u64) {
        lock(&self.inner).quarantine_purged += n;
    }

    /// Directives (applied, ignored) so far, for [`Stats`].
    pub fn directive_counts(&self) -> (u64, u64) {
        let g = lock(&self.inner);
        (g.applied_count, g.ignored_count)
    }

    /// Cuts a report of what changed since the last one (nothing when nothing changed) and
    /// keeps it in the store. `stats` is a full [`Stats`] (queue sizes filled in).
    pub fn cut(&self, queue: &Queue, stats: &Stats) {
        let Some(install_id) = self.install_id() else {
            // Denied: nothing is sent, and nothing under an id a denial deleted is kept.
            return;
        };
        let mut g = lock(&self.inner);
        let now = Tally::of(stats, &g.quarantined, g.quarantine_purged);
        let delta = now.since(&g.baseline);
        if delta.is_empty() || g.waiting.len() >= MAX_WAITING_REPORTS {
            return;
        }
        let id = g.next_report;
        let quarantine_size = stats.quarantine.values().sum();
        let body = delta
            .to_report(&install_id, id, stats.pending, quarantine_size)
            .to_string();
        if let Err(e) = queue.report_add(id, &body) {
            // Not cut: the counts stay in the delta and go in the next report.
            tracing::warn!(error = %e, "could not keep a client report");
            return;
        }
        g.next_report = id + 1;
        g.waiting.push((id, body));
        g.baseline = now;
    }

    /// The reports the next request carries, the oldest that fit in `room` bytes of body:
    /// their ids and the JSON array for the body.
    pub fn for_request(&self, room: u64) -> (Vec<u64>, Option<String>) {
        let g = lock(&self.inner);
        // `,"reports":[` and `]`, then each report and its comma.
        let mut used = 13;
        let some: Vec<_> = g
            .waiting
            .iter()
            .take(MAX_REPORTS_PER_REQUEST)
            .take_while(|(_, body)| {
                used += body.len() as u64 + 1;
                used <= room
            })
            .collect();
        if some.is_empty() {
            return (Vec::new(), None);
        }
        let ids = some.iter().map(|(id, _)| *id).collect();
        let bodies: Vec<&str> = some.iter().map(|(_, b)| b.as_str()).collect();
        (ids, Some(format!("[{}]", bodies.join(","))))
    }

    /// Whether a report waits (or would be cut) with nothing else to send, for a collector that
    /// asked for lone reports: the machine then sends it with the next periodic flush.
    pub fn report_due(&self, stats: &Stats) -> bool {
        let g = lock(&self.inner);
        if !g.lone_reports {
            return false;
        }
        !g.waiting.is_empty()
            || !Tally::of(stats, &g.quarantined, g.quarantine_purged)
                .since(&g.baseline)
                .is_empty()
    }

    /// A 2xx read whole answered a request that carried reports `ids`: they are covered. Its
    /// body may carry directives; returns the one-shot actions to run now.
    pub fn answered(&self, queue: &Queue, ids: &[u64], body: &[u8], wall_ms: i64) -> Steer {
        let mut g = lock(&self.inner);
        if !ids.is_empty() {
            g.waiting.retain(|(id, _)| !ids.contains(id));
            if let Err(e) = queue.reports_delete(ids) {
                // Resent after a restart: the collector counts each id once.
                tracing::warn!(error = %e, "could not forget covered client reports");
            }
        }
        let Ok(value) = serde_json::from_slice::<Value>(body) else {
            return Steer::default();
        };
        if value.get("reports_alone") == Some(&Value::Bool(true)) {
            g.lone_reports = true;
        }
        if value.get("directives").is_none() {
            return Steer::default();
        }
        if !self.directives_on {
            g.ignored_count += 1;
            tracing::info!("collector directives ignored: turned off in config (directives)");
            return Steer::default();
        }
        let parsed = directive::parse(&value, wall_ms);
        for why in &parsed.ignored {
            tracing::warn!(%why, "collector directive ignored");
        }
        g.ignored_count += parsed.ignored.len() as u64;
        let Some(mut d) = parsed.directive else {
            return Steer::default();
        };
        d.cap_pause(wall_ms, self.pause_cap_ms);
        g.applied_count += 1;
        let first_time = g.applied.as_deref() != Some(d.id.as_str());
        let steer = if first_time {
            g.applied = Some(d.id.clone());
            if let Err(e) = queue.fleet_put(key::APPLIED, &d.id) {
                tracing::warn!(error = %e, "could not keep the applied directive id");
            }
            Steer {
                redrive: d.redrive.clone(),
                purge_quarantine: d.purge_quarantine.clone(),
            }
        } else {
            Steer::default()
        };
        // The same pause asked again (every 2xx repeats the directive) is not a new one.
        let old = g.directive.as_ref().filter(|o| o.id == d.id);
        if let Some(old) = old
            && old.pause_asked_ms == d.pause_asked_ms
        {
            d.pause_until_ms = old.pause_until_ms;
        } else {
            g.pause_untold = d.pause_until_ms;
        }
        if let Ok(json) = serde_json::to_string(&d)
            && let Err(e) = queue.fleet_put(key::DIRECTIVE, &json)
        {
            tracing::warn!(error = %e, "could not keep the directive in force");
        }
        g.directive = Some(d);
        self.steering.store(true, Ordering::Release);
        steer
    }

    /// A `pause_until` the delivery machine has not been told, as a delay from `wall_ms`.
    pub fn take_pause(&self, wall_ms: i64) -> Option<u64> {
        let at = lock(&self.inner).pause_untold.take()?;
        (at > wall_ms).then(|| (at - wall_ms) as u64)
    }

    /// What `track()` does with an event named `name` at `wall_ms`.
    /// `wall_ms` is read only while a directive is in force: `track()` calls this for every
    /// event.
    pub fn screen(&self, name: &str, wall_ms: impl FnOnce() -> i64) -> Screen {
        if !self.steering.load(Ordering::Acquire) {
            return Screen::Keep;
        }
        let wall_ms = wall_ms();
        let mut g = lock(&self.inner);
        let Some(d) = &g.directive else {
            return Screen::Keep;
        };
        if d.expires_at_ms <= wall_ms {
            g.directive = None;
            self.steering.store(false, Ordering::Release);
            return Screen::Keep;
        }
        if d.drops_name(name) {
            return Screen::NameDropped;
        }
        let keep = d.keep_fraction(name);
        if keep >= 1.0 {
            return Screen::Keep;
        }
        let draw = g.sample_rng.get_or_insert_with(fastrand::Rng::new).f64();
        if draw < keep {
            Screen::Keep
        } else {
            Screen::Sampled
        }
    }
}

/// 128 bits from the OS's generator as 32 hex digits, kept in the store: names a device install
/// and nothing else (no clock, no hardware id, no seed another id could be derived from), so
/// it cannot be tied to a user, a time or another install.
fn new_install_id(queue: &Queue) -> Option<String> {
    let mut bits = [0u8; 16];
    if let Err(e) = getrandom::getrandom(&mut bits) {
        // No OS randomness (it does not happen on the platforms served): an id made of anything
        // weaker could be guessed, so no report is cut until there is one.
        tracing::error!(error = %e, "no OS randomness for the install id");
        return None;
    }
    let id: String = bits.iter().map(|b| format!("{b:02x}")).collect();
    if let Err(e) = queue.fleet_put(key::INSTALL_ID, &id) {
        tracing::warn!(error = %e, "could not keep the install id");
    }
    Some(id)
}

#[cfg(test)]
mod tests;
