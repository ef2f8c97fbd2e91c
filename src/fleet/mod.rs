//! The fleet loop: each device's loss ledger reaches the collector as client reports, and the
//! collector can steer the device with directives (docs/protocol.md §Client reports,
//! §Directives).
//!
//! Reports ride on requests that go anyway. Before a batch is sent, what changed in the ledger
//! since the last report is cut into a new report with the next id and kept in the store; every
//! request carries the oldest waiting reports, and a 2xx covers them (they are then forgotten).
//! Draining a backlog, a change of the events' way through alone (nothing lost) waits up to
//! [`DRAIN_REPORT_INTERVAL_MS`] (decision 0078), so a drain's requests do not each carry one.
//! Anything else (no answer, a 5xx, a restart) leaves them waiting, and they are resent with the
//! same ids, so a collector that totals each (install, id) once gets exact totals whatever the
//! network lost, repeated or reordered. When nothing else is to be sent, a report waits for the
//! periodic flush and goes alone, and only to a collector that asked for that
//! (`"reports_alone": true` in a 2xx): any other collector never gets a request it did not ask
//! for, and a device's request count stays what its events make it.
//!
//! Directives come back in 2xx bodies, checked by [`directive`] and applied here: the one-shot
//! actions (`redrive`, `purge_quarantine`) once per directive id (every id applied is remembered,
//! not only the last, so ids that alternate cannot loop dead letters through redrives), the
//! settings (`pause_until`, `sample_rate`, `drop_names`) until the directive expires, counted on
//! the device's monotonic clock from its arrival (a wall clock that was wrong then cannot
//! stretch it). The settings never touch the critical lane. The latest directive replaces the
//! one in force; the app sees it in [`Stats::directive`] and may end it.

pub mod directive;
pub mod report;

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use serde_json::Value;

use crate::queue::Queue;
use crate::stats::{DirectiveInForce, Stats};
use crate::sync::lock;
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

/// Draining, a report of the events' way through alone (tracked, restored, redriven,
/// delivered: nothing lost) is cut at most this often, on the monotonic clock. Cut for every
/// batch, it made the collector record a report with every request of a drain, which the
/// events themselves never ask of it; losses are cut before the next request whenever they
/// happen, and a drain's last counts go with the first request after it.
pub const DRAIN_REPORT_INTERVAL_MS: u64 = 5_000;

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

/// Directive ids whose one-shot actions ran that are remembered at most: past it the one that
/// would be forgotten soonest goes first. A collector needs far fewer.
pub const MAX_APPLIED_IDS: usize = 64;
/// How long an applied id is remembered: the longest any directive may live, so an id repeated
/// by a collector as long as its directive can hold is never run twice.
pub const APPLIED_MEMORY_MS: u64 = directive::MAX_TTL_MS;

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
    /// When the directive in force ends, on the monotonic clock (its `ttl_ms` from its arrival;
    /// kept in the store as the time left).
    expires_mono_ms: u64,
    /// The ids whose one-shot actions ran, each with when it is forgotten (monotonic), at most
    /// [`MAX_APPLIED_IDS`]; persisted as the time left, so a restart does not run them again.
    applied: Vec<(String, u64)>,
    /// A pause the machine has not been told yet (wall ms).
    pause_untold: Option<i64>,
    /// The app ended the directive in force: the machine is told its pause is over.
    pause_ended: bool,
    /// Draws who is kept under `sample_rate`: from the OS's entropy at first use, or from the
    /// spool's jitter seed (`SpoolBuilder::jitter_seed`), so a run that seeds its delays also
    /// replays which events were sampled.
    sample_rng: Option<fastrand::Rng>,
    applied_count: u64,
    ignored_count: u64,
    /// A report was cut while the last request was on the wire ([`Fleet::cut_ahead`]): the
    /// next request carries it instead of cutting one more.
    cut_ahead: bool,
    /// When the last report was cut by a request (monotonic ms); `None` before the first.
    last_cut_ms: Option<u64>,
}

impl Fleet {
    /// Seeds the sampling draw (see `Inner::sample_rng`).
    pub fn seed_sampling(&self, seed: u64) {
        lock(&self.inner).sample_rng = Some(fastrand::Rng::with_seed(seed ^ 0x5a4d_504c_4500));
    }

    /// Reads what the store keeps (install id, waiting reports, directive in force), making the
    /// install id on first use unless consent is `denied`.
    pub fn load(
        queue: &Queue,
        directives_on: bool,
        pause_cap_ms: u64,
        (wall_ms, now_ms): (i64, u64),
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
            .filter(|_| directives_on)
            .map(|d| {
                let left = d.left_at_restart(wall_ms);
                (d, now_ms + left)
            })
            .filter(|(_, until)| *until > now_ms);
        let pause_untold = directive
            .as_ref()
            .and_then(|(d, _)| d.pause_until_ms)
            .filter(|at| *at > wall_ms);
        let applied = get(key::APPLIED)
            .map(|kept| applied_from_store(&kept, now_ms))
            .unwrap_or_default();
        let (directive, expires_mono_ms) = match directive {
            Some((d, until)) => (Some(d), until),
            None => (None, 0),
        };
        Fleet {
            install_id: Mutex::new(install_id),
            directives_on,
            pause_cap_ms,
            steering: AtomicBool::new(directive.is_some()),
            inner: Mutex::new(Inner {
                next_report,
                waiting,
                directive,
                expires_mono_ms,
                applied,
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

    /// Before a request leaves (at `now_ms`, monotonic): cuts a report ([`Fleet::cut`]) unless
    /// one was cut while the request before it was on the wire, so draining a backlog does not
    /// make a report's commit wait between every answer and the next request.
    pub fn cut_before_request(&self, queue: &Queue, now_ms: u64, stats: impl FnOnce() -> Stats) {
        if std::mem::take(&mut lock(&self.inner).cut_ahead) {
            return;
        }
        self.cut_at(queue, &stats(), Some(now_ms), false);
    }

    /// While a request is on the wire (at `now_ms`, monotonic): cuts a report (when the ledger
    /// changed) for the next request to carry, kept in the store before that request leaves
    /// like any other. That request cuts none of its own: what changes until it leaves (the
    /// answer to this one) goes in the report cut while it is on the wire. A change of the
    /// events' way through alone waits for [`DRAIN_REPORT_INTERVAL_MS`] since the last report.
    pub fn cut_ahead(&self, queue: &Queue, stats: &Stats, now_ms: u64) {
        self.cut_at(queue, stats, Some(now_ms), true);
        lock(&self.inner).cut_ahead = true;
    }

    /// No request follows at once (the worker waits): the next one cuts its own report, with
    /// everything up to when it leaves.
    pub fn forget_cut_ahead(&self) {
        lock(&self.inner).cut_ahead = false;
    }

    /// Cuts a report of what changed since the last one (nothing when nothing changed) and
    /// keeps it in the store. `stats` is the ledger's counters (`Counters::snapshot`); the
    /// quarantine's size is read from `queue`, and only for a report that is cut: a drain
    /// decides on every request, and cuts one every few seconds.
    pub fn cut(&self, queue: &Queue, stats: &Stats) {
        self.cut_at(queue, stats, None, false);
    }

    /// [`Fleet::cut`], by a request at `now_ms` when given; `flow_may_wait`: a delta without
    /// losses is held while the last report is younger than [`DRAIN_REPORT_INTERVAL_MS`].
    fn cut_at(&self, queue: &Queue, stats: &Stats, now_ms: Option<u64>, flow_may_wait: bool) {
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
        let recent = match (now_ms, g.last_cut_ms) {
            (Some(at), Some(last)) => at < last.saturating_add(DRAIN_REPORT_INTERVAL_MS),
            _ => false,
        };
        if flow_may_wait && recent && !delta.has_losses() {
            return;
        }
        let id = g.next_report;
        let quarantine_size = queue.quarantine_by_reason().values().sum();
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
        if now_ms.is_some() {
            g.last_cut_ms = now_ms;
        }
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
    /// body may carry directives; returns the one-shot actions to run now. `wall_ms` dates what
    /// the directive names in wall time (`pause_until`), `now_ms` (monotonic) starts its life.
    pub fn answered(
        &self,
        queue: &Queue,
        ids: &[u64],
        body: &[u8],
        (wall_ms, now_ms): (i64, u64),
    ) -> Steer {
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
        g.applied.retain(|(_, until)| *until > now_ms);
        let first_time = !g.applied.iter().any(|(id, _)| *id == d.id);
        let steer = if first_time {
            if g.applied.len() >= MAX_APPLIED_IDS
                && let Some(soonest) = (0..g.applied.len()).min_by_key(|i| g.applied[*i].1)
            {
                g.applied.swap_remove(soonest);
            }
            g.applied.push((d.id.clone(), now_ms + APPLIED_MEMORY_MS));
            if let Err(e) = queue.fleet_put(key::APPLIED, &applied_for_store(&g.applied, now_ms)) {
                tracing::warn!(error = %e, "could not keep the applied directive ids");
            }
            Steer {
                redrive: d.redrive.clone(),
                purge_quarantine: d.purge_quarantine.clone(),
            }
        } else {
            Steer::default()
        };
        // The same directive repeated (every 2xx repeats it) is not a new one: its pause and
        // its life go on from its first arrival.
        let live = g.expires_mono_ms > now_ms;
        let old = g
            .directive
            .as_ref()
            .filter(|o| live && o.id == d.id)
            .map(|o| (o.pause_asked_ms, o.pause_until_ms, o.expires_at_ms));
        if let Some((asked, until, expires_at_ms)) = old {
            if asked == d.pause_asked_ms {
                d.pause_until_ms = until;
            } else {
                g.pause_untold = d.pause_until_ms;
            }
            d.expires_at_ms = expires_at_ms;
        } else {
            g.pause_untold = d.pause_until_ms;
            g.expires_mono_ms = now_ms + d.ttl_ms;
        }
        g.directive = Some(d);
        self.keep_directive(queue, &g, now_ms);
        self.steering.store(true, Ordering::Release);
        steer
    }

    /// Keeps the directive in force in the store, with the time it has left.
    fn keep_directive(&self, queue: &Queue, g: &Inner, now_ms: u64) {
        let Some(d) = &g.directive else {
            return;
        };
        let mut kept = d.clone();
        kept.left_ms = Some(g.expires_mono_ms.saturating_sub(now_ms));
        if let Ok(json) = serde_json::to_string(&kept)
            && let Err(e) = queue.fleet_put(key::DIRECTIVE, &json)
        {
            tracing::warn!(error = %e, "could not keep the directive in force");
        }
    }

    /// Keeps the time the directive in force and the applied ids have left (at shutdown:
    /// the next open counts on from there).
    pub fn save_clock(&self, queue: &Queue, now_ms: u64) {
        let g = lock(&self.inner);
        self.keep_directive(queue, &g, now_ms);
        if !g.applied.is_empty()
            && let Err(e) = queue.fleet_put(key::APPLIED, &applied_for_store(&g.applied, now_ms))
        {
            tracing::warn!(error = %e, "could not keep the applied directive ids");
        }
    }

    /// The directive in force at `now_ms` (monotonic; `wall_ms` dates its end for display).
    pub fn in_force(&self, now_ms: u64, wall_ms: i64) -> Option<DirectiveInForce> {
        if !self.steering.load(Ordering::Acquire) {
            return None;
        }
        let g = lock(&self.inner);
        let d = g
            .directive
            .as_ref()
            .filter(|_| g.expires_mono_ms > now_ms)?;
        let expires_in_ms = g.expires_mono_ms - now_ms;
        Some(DirectiveInForce {
            id: d.id.clone(),
            expires_in_ms,
            expires_at_ms: wall_ms.saturating_add(expires_in_ms as i64),
            pause_until_ms: d.pause_until_ms.filter(|at| *at > wall_ms),
            sample_rate: d.sample_rate.clone(),
            drop_names: d.drop_names.clone(),
            redrive: d.redrive.clone(),
            purge_quarantine: d.purge_quarantine.clone(),
        })
    }

    /// The app ends the directive in force (its settings and its pause; the one-shot actions
    /// it ran are not run again). Returns whether one was in force.
    pub fn clear(&self, queue: &Queue, now_ms: u64) -> bool {
        let mut g = lock(&self.inner);
        let was = g.directive.take().is_some() && g.expires_mono_ms > now_ms;
        g.pause_untold = None;
        g.pause_ended = true;
        g.expires_mono_ms = 0;
        self.steering.store(false, Ordering::Release);
        if let Err(e) = queue.fleet_delete(key::DIRECTIVE) {
            tracing::warn!(error = %e, "could not forget the directive in force");
        }
        was
    }

    /// A `pause_until` the delivery machine has not been told, as a delay from `wall_ms`; zero
    /// once when the app ended the directive (the pause ends now).
    pub fn take_pause(&self, wall_ms: i64) -> Option<u64> {
        let mut g = lock(&self.inner);
        if std::mem::take(&mut g.pause_ended) && g.pause_untold.is_none() {
            return Some(0);
        }
        let at = g.pause_untold.take()?;
        (at > wall_ms).then(|| (at - wall_ms) as u64)
    }

    /// What `track()` does with a new event named `name`, of the critical lane or not, at
    /// `now_ms` (monotonic, read only while a directive is in force: `track()` calls this for
    /// every event). A critical event is always kept: no collector can silence a device's crash
    /// reports.
    pub fn screen(&self, name: &str, critical: bool, now_ms: impl FnOnce() -> u64) -> Screen {
        if critical || !self.steering.load(Ordering::Acquire) {
            return Screen::Keep;
        }
        let now_ms = now_ms();
        let mut g = lock(&self.inner);
        let Some(d) = &g.directive else {
            return Screen::Keep;
        };
        if g.expires_mono_ms <= now_ms {
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

/// The applied ids as kept: `[[id, ms left], ...]`.
fn applied_for_store(applied: &[(String, u64)], now_ms: u64) -> String {
    let kept: Vec<(&str, u64)> = applied
        .iter()
        .map(|(id, until)| (id.as_str(), until.saturating_sub(now_ms)))
        .collect();
    serde_json::to_string(&kept).unwrap_or_default()
}

/// The applied ids from the store, as of `now_ms`. A store written before ids were kept as a
/// list holds the one last id as plain text: it is remembered for the whole
/// [`APPLIED_MEMORY_MS`].
fn applied_from_store(kept: &str, now_ms: u64) -> Vec<(String, u64)> {
    match serde_json::from_str::<Vec<(String, u64)>>(kept) {
        Ok(list) => list
            .into_iter()
            .filter(|(_, left)| *left > 0)
            .map(|(id, left)| (id, now_ms + left.min(APPLIED_MEMORY_MS)))
            .take(MAX_APPLIED_IDS)
            .collect(),
        Err(_) => vec![(kept.to_string(), now_ms + APPLIED_MEMORY_MS)],
    }
}

#[cfg(test)]
mod tests;
