//! The transitions as tables: each row is (start, input, actions, next state), where the start
//! is a list of inputs fed to a fresh machine, and actions and state are written the way
//! docs/delivery.md and docs/states.md name them. Times are relative to the row's input:
//! `+1000` is a second after it. No runtime, no sockets, no threads: the inputs are the answers a
//! driver would give, the HTTP answers go through the real [`crate::classify::classify`].

use super::*;
use crate::classify::classify;
use crate::event::{EventId, SendNote};
use crate::transport::{HttpResponse, TransportError};
use std::time::{Duration, SystemTime};

const NOW0: u64 = 1_000_000;
const WALL0: i64 = 1_800_000_000_000;
/// What [`Rig`] says each event adds to a body, for the size limit a 413 teaches.
const EVENT_BODY: u64 = 1000;

fn policy() -> Policy {
    Policy {
        flush_interval_ms: 10_000,
        min_batch_interval_ms: 0,
        max_batch_bytes: 512 * 1024,
        max_auto_attempts: 3,
        backoff_base_ms: 1000,
        backoff_cap_ms: 30_000,
        retry_after_cap_ms: 60_000,
        max_retry_elapsed_ms: 300_000,
        probe_base_ms: 60_000,
        probe_cap_ms: 900_000,
        max_event_sends: 10,
        max_event_age_ms: 3_600_000,
        // Every condition defers in the tables, unless a table says otherwise.
        deliver_on_metered: false,
        deliver_on_low_power: false,
        deliver_on_battery_low: false,
    }
}

/// One input of a row, as the app, the clock, the queue or the collector gives it.
#[derive(Clone, Debug)]
enum In {
    // The app's verbs.
    Flush,
    RetryNow,
    Dismiss,
    Resume,
    NewKey,
    Online(bool),
    Enabled(bool),
    Foreground(bool),
    SetConsent(Consent),
    // The device's conditions (`set_conditions`), one at a time; the others keep their value.
    Metered(bool),
    LowPower(bool),
    BatteryLow(bool),
    /// `deliver_within` with this budget (ms).
    Drain(u64),
    Shutdown,
    // The driver's turn: 3 events pending; `flush_at` reached; nothing pending; `ms` later.
    Tick,
    TickFlushAt,
    TickEmpty,
    TickAfter(u64),
    /// 3 pending, a critical event among them tracked since the last batch was taken.
    TickCritical,
    TickEmptyAfter(u64),
    // The fleet loop: a client report waits with nothing else to send; a collector's
    // `pause_until` this many ms ahead.
    ReportDue,
    PauseFor(u64),
    /// A turn at the retry or probe time the machine set.
    Fire,
    // The queue's answer: a batch of n events, or nothing.
    Batch(usize),
    Empty,
    // The collector's answer: an HTTP status; with `Retry-After` (seconds); a 2xx refusing
    // the event at this index of the batch; a 2xx cut short; a timeout; a refused connection.
    Status(u16),
    RetryAfter(u16, u64),
    Rejected(usize),
    CutShort,
    Timeout,
    Refused,
    /// A 2xx refusing the event at this index with its id in upper case, without hyphens.
    RejectedRespelled(usize),
    /// A 2xx refusing an id that is in no event of the batch.
    RejectedUnknown,
    /// The driver did not start the send asked for: the app withdrew consent or opted out
    /// between the batch being taken and the request.
    Withheld,
    /// The denial's deletion failed, or (`false`) has now succeeded: what the driver says in
    /// its next ticks.
    DiscardOwed(bool),
}

use In::*;

/// A machine, the app's control cell, and the clocks, as the worker holds them.
struct Rig {
    m: Machine,
    app: Control,
    now: u64,
    next_seq: u64,
    next_drain: u64,
    /// What the driver says of a denial's deletion in its ticks: it failed and is owed.
    discard_owed: bool,
}

impl Rig {
    fn new(policy: Policy) -> Rig {
        let app = Control::default();
        Rig {
            m: Machine::new(policy, Jitter::Fixed(1.0), NOW0, &app),
            app,
            now: NOW0,
            next_seq: 1,
            next_drain: 1,
            discard_owed: false,
        }
    }

    fn wall(&self) -> i64 {
        WALL0 + (self.now - NOW0) as i64
    }

    /// Sets the app's control cell like the spool's verbs do, then takes it like
    /// `Shared::take_control`: the edges are seen once.
    fn verb(&mut self, f: impl FnOnce(&mut Control)) -> Vec<Action> {
        f(&mut self.app);
        let verbs = self.app.clone();
        let app = &mut self.app;
        app.online_changed = false;
        app.enabled_changed = false;
        app.flush = false;
        app.retry_now = false;
        app.dismiss = false;
        app.resume = false;
        app.api_key_changed = false;
        app.foreground_changed = false;
        app.consent_changed = false;
        app.drains.clear();
        app.shutdown = false;
        self.m.feed(Input::Control {
            verbs,
            now_ms: self.now,
        })
    }

    fn tick(&mut self, pending: u64, flush_at: bool) -> Vec<Action> {
        self.tick_with(pending, flush_at, false)
    }

    fn tick_with(&mut self, pending: u64, flush_at: bool, critical: bool) -> Vec<Action> {
        self.m.feed(Input::Tick {
            now_ms: self.now,
            wall_ms: self.wall(),
            pending,
            flush_at,
            critical,
            discard_owed: self.discard_owed,
        })
    }

    fn events(&mut self, n: usize) -> Events {
        (0..n)
            .map(|_| {
                let seq = self.next_seq;
                self.next_seq += 1;
                let event = QueuedEvent {
                    ts_ms: WALL0,
                    seq,
                    id: EventId::new(),
                    json: format!("{{\"n\":{seq}}}").into(),
                    accepted_ms: WALL0,
                    sends: 0,
                    unanswered: 0,
                    critical: false,
                    sealed: Default::default(),
                };
                (event, seq.is_multiple_of(2))
            })
            .collect()
    }

    fn answer(&mut self, result: Result<HttpResponse, TransportError>) -> Vec<Action> {
        let body_bytes = EVENT_BODY * self.m.in_flight().len() as u64;
        let now = SystemTime::UNIX_EPOCH + Duration::from_millis(self.wall() as u64);
        self.m.feed(Input::Answer {
            now_ms: self.now,
            note: send_note(&result),
            outcome: classify(&result, now),
            body_bytes,
            timed_out: timed_out(&result),
        })
    }

    fn http(status: u16, headers: &[(&str, &str)], body: &str) -> HttpResponse {
        HttpResponse {
            status,
            headers: headers
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            body: body.as_bytes().to_vec(),
            truncated: false,
        }
    }

    fn input(&mut self, input: &In) -> Vec<Action> {
        match input {
            Flush => self.verb(|c| c.flush = true),
            RetryNow => self.verb(|c| c.retry_now = true),
            Dismiss => self.verb(|c| c.dismiss = true),
            Resume => self.verb(|c| c.resume = true),
            NewKey => self.verb(|c| c.api_key_changed = true),
            Online(on) => self.verb(|c| {
                c.online_changed = c.online != *on;
                c.online = *on;
            }),
            Enabled(on) => self.verb(|c| {
                c.enabled_changed = c.enabled != *on;
                c.enabled = *on;
            }),
            Foreground(on) => self.verb(|c| {
                c.foreground_changed = c.foreground != *on;
                c.foreground = *on;
            }),
            Metered(on) => self.verb(|c| c.conditions.metered = *on),
            LowPower(on) => self.verb(|c| c.conditions.low_power = *on),
            BatteryLow(on) => self.verb(|c| c.conditions.battery_low = *on),
            Drain(budget) => {
                let request = DrainRequest {
                    id: self.next_drain,
                    deadline_ms: self.now + budget,
                };
                self.next_drain += 1;
                self.verb(|c| c.drains.push(request))
            }
            SetConsent(consent) => self.verb(|c| {
                c.consent_changed = c.consent != *consent;
                c.consent = *consent;
            }),
            Shutdown => self.verb(|c| c.shutdown = true),
            Tick => self.tick(3, false),
            TickCritical => self.tick_with(3, false, true),
            TickFlushAt => self.tick(3, true),
            TickEmpty => self.tick(0, false),
            TickAfter(ms) => {
                self.now += ms;
                self.tick(3, false)
            }
            TickEmptyAfter(ms) => {
                self.now += ms;
                self.tick(0, false)
            }
            ReportDue => self.m.feed(Input::Fleet {
                now_ms: self.now,
                report_due: true,
                pause_ms: None,
            }),
            PauseFor(ms) => self.m.feed(Input::Fleet {
                now_ms: self.now,
                report_due: false,
                pause_ms: Some(*ms),
            }),
            Fire => {
                match self.m.mode {
                    Mode::RetryWait { deadline_ms, .. } => self.now = deadline_ms,
                    Mode::WaitingForUser { probe_at_ms, .. } => self.now = probe_at_ms,
                    ref other => panic!("nothing to fire in {other:?}"),
                }
                self.tick(3, false)
            }
            Batch(n) => {
                let events = Some(self.events(*n));
                let wall_ms = self.wall();
                self.m.feed(Input::Batch { events, wall_ms })
            }
            Empty => {
                let wall_ms = self.wall();
                self.m.feed(Input::Batch {
                    events: None,
                    wall_ms,
                })
            }
            Status(status) => self.answer(Ok(Rig::http(*status, &[], ""))),
            RetryAfter(status, seconds) => {
                let seconds = seconds.to_string();
                self.answer(Ok(Rig::http(*status, &[("Retry-After", &seconds)], "")))
            }
            Rejected(index) => {
                let id = self.m.in_flight()[*index].0.id.to_string();
                let body = format!(r#"{{"rejected":[{{"event_id":"{id}","reason":"bad"}}]}}"#);
                self.answer(Ok(Rig::http(200, &[], &body)))
            }
            RejectedRespelled(index) => {
                let id = self.m.in_flight()[*index].0.id.0.simple().to_string();
                let id = id.to_ascii_uppercase();
                let body = format!(r#"{{"rejected":[{{"event_id":"{id}","reason":"bad"}}]}}"#);
                self.answer(Ok(Rig::http(200, &[], &body)))
            }
            RejectedUnknown => {
                let id = EventId::new();
                let body = format!(r#"{{"rejected":[{{"event_id":"{id}","reason":"bad"}}]}}"#);
                self.answer(Ok(Rig::http(200, &[], &body)))
            }
            CutShort => {
                let mut response = Rig::http(200, &[], "{\"rej");
                response.truncated = true;
                self.answer(Ok(response))
            }
            Timeout => self.answer(Err(TransportError::Timeout)),
            Refused => self.answer(Err(TransportError::Connect("refused".into()))),
            Withheld => self.m.feed(Input::Withheld { now_ms: self.now }),
            DiscardOwed(owed) => {
                self.discard_owed = *owed;
                Vec::new()
            }
        }
    }

    /// An action as a row writes it; times relative to `self.now`.
    fn show(&self, action: &Action) -> String {
        let rel = |t: u64| format!("+{}", t as i64 - self.now as i64);
        match action {
            Action::Publish { state, deadline_ms } => {
                let detail = match state {
                    DeliveryState::RetryScheduled {
                        attempt,
                        max_attempts,
                        ..
                    } => format!(" {attempt}/{max_attempts}"),
                    DeliveryState::WaitingForUser { attempts, .. } => format!(" {attempts}"),
                    DeliveryState::Paused { reason, .. } => format!(" {}", reason.as_str()),
                    DeliveryState::Deferred { reason } => format!(" {}", reason.as_str()),
                    _ => String::new(),
                };
                let at = deadline_ms.map_or(String::new(), |t| format!(" {}", rel(t)));
                format!("publish {}{detail}{at}", state.name())
            }
            Action::Wait { until_ms: None } => "wait".into(),
            Action::Wait { until_ms: Some(t) } => format!("wait {}", rel(*t)),
            Action::FlushAtSeen => "flush_at seen".into(),
            Action::NextBatch { room_bytes } => format!("next batch <={room_bytes}"),
            Action::ProbeBatch { room_bytes } => format!("probe batch <={room_bytes}"),
            Action::Send { attempt, .. } => {
                format!("send {} #{attempt}", self.m.in_flight().len())
            }
            Action::NoteSends { events, note } => {
                let note = match note {
                    SendNote::Sending => "sending",
                    SendNote::Answered => "answered",
                    SendNote::NotSent => "not_sent",
                };
                format!("note {note} {}", events.len())
            }
            Action::Ack(events) => format!("ack {}", events.len()),
            Action::Quarantine { events, reason, .. } => {
                format!("quarantine {reason} {}", events.len())
            }
            Action::DropExpired(events) => format!("drop expired {}", events.len()),
            Action::Release(events) => format!("release {}", events.len()),
            Action::UnmatchedRejections(n) => format!("unmatched rejections {n}"),
            Action::DiscardForConsent => "discard for consent".into(),
            Action::DrainDone { id, outcome } => {
                let what = match outcome {
                    DrainOutcome::Drained => "drained".to_string(),
                    DrainOutcome::DeadlineReached => "deadline".to_string(),
                    DrainOutcome::RetryAfter { ms } => format!("retry_after +{ms}"),
                    DrainOutcome::Blocked { state } => {
                        let detail = match state {
                            DeliveryState::Paused { reason, .. } => format!(" {}", reason.as_str()),
                            DeliveryState::Deferred { reason } => format!(" {}", reason.as_str()),
                            _ => String::new(),
                        };
                        format!("blocked {}{detail}", state.name())
                    }
                };
                format!("drain {id} {what}")
            }
            Action::Stop => "stop".into(),
        }
    }

    /// The machine's state as the state table names it, then what outlives it: a hold (no
    /// request before it) and the failure episode (its failures so far).
    fn state(&self) -> String {
        let rel = |t: u64| format!("+{}", t as i64 - self.now as i64);
        let mut state = self.mode();
        let hold = [self.m.hold_until_ms, self.m.not_before_ms]
            .into_iter()
            .flatten()
            .filter(|t| *t > self.now)
            .max();
        if let Some(until) = hold.filter(|_| matches!(self.m.mode, Mode::Idle | Mode::Draining)) {
            state.push_str(&format!(" held {}", rel(until)));
        }
        if let Some(episode) = &self.m.episode {
            state.push_str(&format!(" ep{}", episode.failures));
        }
        state
    }

    fn mode(&self) -> String {
        let rel = |t: u64| format!("+{}", t as i64 - self.now as i64);
        match &self.m.mode {
            Mode::Idle => "idle".into(),
            Mode::Draining if self.m.probing.is_some() => "probing".into(),
            Mode::Draining => "sending".into(),
            Mode::RetryWait {
                attempt,
                deadline_ms,
                ..
            } => format!("retry_scheduled {attempt} {}", rel(*deadline_ms)),
            Mode::WaitingForUser {
                attempts,
                probe_at_ms,
                ..
            } => format!("waiting_for_user {attempts} {}", rel(*probe_at_ms)),
            Mode::Paused { reason, .. } => format!("paused {}", reason.as_str()),
            Mode::Offline => "offline".into(),
            Mode::Disabled => "disabled".into(),
            Mode::Deferred { reason } => format!("deferred {}", reason.as_str()),
        }
    }
}

struct Row {
    start: Vec<In>,
    input: In,
    actions: &'static [&'static str],
    to: &'static str,
}

fn row(start: Vec<In>, input: In, actions: &'static [&'static str], to: &'static str) -> Row {
    Row {
        start,
        input,
        actions,
        to,
    }
}

/// In a row's actions: what follows is the driver's next turn (a [`Tick`], as the worker's loop
/// feeds one after every control), and the row's state is the one after it. A row whose input
/// does nothing by itself shows what the worker does next instead of only `&[]`.
const THEN_TICK: &str = "then tick:";

/// The one loop every table runs: each row from a fresh machine. Returns the rows driven.
fn drive(policy: Policy, rows: &[Row]) -> usize {
    for (i, r) in rows.iter().enumerate() {
        let mut rig = Rig::new(policy.clone());
        for step in &r.start {
            rig.input(step);
        }
        let from = rig.state();
        let out = rig.input(&r.input);
        let actions: Vec<String> = out.iter().map(|a| rig.show(a)).collect();
        let context = format!("row {i}: from {from} ({:?}), {:?}", r.start, r.input);
        if std::env::var("BLESS_ROWS").is_ok() {
            let mut shown = actions.clone();
            if r.actions.is_empty() || r.actions.contains(&THEN_TICK) {
                shown.push(THEN_TICK.to_string());
                let out = rig.input(&Tick);
                shown.extend(out.iter().map(|a| rig.show(a)));
            }
            println!(
                "BLESS\t{}\t{i}\t{}\t{}",
                std::thread::current().name().unwrap_or(""),
                serde_json::to_string(&shown).unwrap(),
                rig.state()
            );
            continue;
        }
        assert!(
            !r.actions.is_empty(),
            "{context}: a row without actions must show the next turn ({THEN_TICK:?})"
        );
        let (now, next) = match r.actions.iter().position(|a| *a == THEN_TICK) {
            Some(at) => (&r.actions[..at], Some(&r.actions[at + 1..])),
            None => (r.actions, None),
        };
        assert_eq!(actions, now, "actions of {context}");
        if let Some(next) = next {
            let out = rig.input(&Tick);
            let actions: Vec<String> = out.iter().map(|a| rig.show(a)).collect();
            assert_eq!(actions, next, "the turn after {context}");
        }
        assert_eq!(rig.state(), r.to, "next state of {context}");
    }
    rows.len()
}

// Start states, as what brings a fresh machine there.
fn idle() -> Vec<In> {
    vec![]
}
fn then(mut start: Vec<In>, more: &[In]) -> Vec<In> {
    start.extend_from_slice(more);
    start
}
/// A drain started, the queue not asked yet.
fn draining() -> Vec<In> {
    vec![Flush]
}
/// A drain that asked the queue for its batch.
fn asked() -> Vec<In> {
    vec![Flush, Tick]
}
/// A batch of `n` in flight.
fn sending(n: usize) -> Vec<In> {
    vec![Flush, Tick, Batch(n)]
}
/// Retry `k` of 3 scheduled, the batch of 3 waiting.
fn retry(k: usize) -> Vec<In> {
    let mut steps = then(sending(3), &[Status(503)]);
    for _ in 1..k {
        steps.extend_from_slice(&[Fire, Tick, Status(503)]);
    }
    steps
}
/// Retry `k` sent and in flight.
fn retrying(k: usize) -> Vec<In> {
    then(retry(k), &[Fire, Tick])
}
/// The budget of 3 retries spent: `WaitingForUser{3}`, the first probe a minute out.
fn waiting() -> Vec<In> {
    then(retrying(3), &[Status(503)])
}
/// The slow probe in flight behind `WaitingForUser`.
fn probing() -> Vec<In> {
    then(waiting(), &[Fire, Tick])
}
fn paused_auth() -> Vec<In> {
    then(sending(3), &[Status(401)])
}
fn paused_config() -> Vec<In> {
    then(sending(3), &[Status(404)])
}
fn offline() -> Vec<In> {
    vec![Online(false)]
}
fn disabled() -> Vec<In> {
    vec![Enabled(false)]
}

/// docs/delivery.md §States and the table of docs/states.md, arrow by arrow.
#[test]
fn the_state_table_row_by_row() {
    let rows = [
        // Idle ──flush trigger──▶ Sending
        row(idle(), Flush, &["flush_at seen"], "sending"),
        row(idle(), RetryNow, &["flush_at seen"], "sending"),
        row(idle(), TickFlushAt, &["flush_at seen"], "sending"),
        row(idle(), TickAfter(10_000), &["flush_at seen"], "sending"),
        row(idle(), Tick, &["publish idle", "wait +10000"], "idle"),
        row(idle(), TickEmpty, &["publish idle", "wait"], "idle"),
        row(
            idle(),
            Dismiss,
            &["then tick:", "publish idle", "wait +10000"],
            "idle",
        ),
        row(
            idle(),
            Resume,
            &["then tick:", "publish idle", "wait +10000"],
            "idle",
        ),
        // A batch nobody asked for is not sent: it goes back.
        row(idle(), Batch(2), &["release 2"], "idle"),
        // Sending: take a batch, send it, ok ──▶ Idle once the queue is empty.
        row(draining(), Tick, &["next batch <=524224"], "sending"),
        row(asked(), Empty, &["flush_at seen"], "idle"),
        row(
            asked(),
            Batch(3),
            &["publish sending", "send 3 #1"],
            "sending",
        ),
        row(sending(3), Status(200), &["ack 3"], "sending"),
        row(
            then(sending(3), &[Status(200)]),
            Tick,
            &["next batch <=524224"],
            "sending",
        ),
        // Sending ── transient ──▶ RetryScheduled{1 of 3}
        row(
            sending(3),
            Status(503),
            &["note answered 3", "publish retry_scheduled 1/3 +1000"],
            "retry_scheduled 1 +1000 ep1",
        ),
        // RetryScheduled: the countdown ticks each second; timer / retry_now() ──▶ Sending.
        row(
            retry(1),
            Tick,
            &["publish retry_scheduled 1/3 +1000", "wait +1000"],
            "retry_scheduled 1 +1000 ep1",
        ),
        row(
            retry(2),
            TickAfter(500),
            &["publish retry_scheduled 2/3 +1500", "wait +500"],
            "retry_scheduled 2 +1500 ep2",
        ),
        row(
            retry(1),
            Fire,
            &["then tick:", "publish sending", "send 3 #2"],
            "sending ep1",
        ),
        row(
            then(retry(1), &[Fire]),
            Tick,
            &["publish sending", "send 3 #2"],
            "sending ep1",
        ),
        row(
            retry(1),
            RetryNow,
            &["then tick:", "publish sending", "send 3 #2"],
            "sending ep1",
        ),
        row(
            retry(1),
            Flush,
            &[
                "then tick:",
                "publish retry_scheduled 1/3 +1000",
                "wait +1000",
            ],
            "retry_scheduled 1 +1000 ep1",
        ),
        // RetryScheduled ── set_foreground(true) (fresh episode) ──▶ Sending
        row(
            then(retry(2), &[Foreground(false)]),
            Foreground(true),
            &["then tick:", "publish sending", "send 3 #3"],
            "sending",
        ),
        row(
            then(retry(2), &[Foreground(false), Foreground(true), Tick]),
            Status(503),
            &["note answered 3", "publish retry_scheduled 1/3 +1000"],
            "retry_scheduled 1 +1000 ep1",
        ),
        // RetryScheduled ── dismiss() ──▶ Idle, events kept; flush_at suppressed.
        row(retry(1), Dismiss, &["release 3"], "idle"),
        row(
            then(retry(1), &[Dismiss]),
            TickFlushAt,
            &["publish idle", "wait +10000"],
            "idle",
        ),
        row(
            then(retry(1), &[Dismiss]),
            Flush,
            &["flush_at seen"],
            "sending",
        ),
        row(
            then(retry(1), &[Dismiss]),
            TickAfter(10_000),
            &["flush_at seen"],
            "sending",
        ),
        // RetryScheduled ── budget spent ──▶ WaitingForUser{attempts}
        row(
            retrying(3),
            Status(503),
            &["note answered 3"],
            "waiting_for_user 3 +60000 ep4",
        ),
        // WaitingForUser: shows the probe time; retry_now() ──▶ Sending (one manual attempt).
        row(
            waiting(),
            Tick,
            &["publish waiting_for_user 3 +60000", "wait +60000"],
            "waiting_for_user 3 +60000 ep4",
        ),
        row(
            waiting(),
            RetryNow,
            &["then tick:", "publish sending", "send 3 #5"],
            "sending ep4",
        ),
        row(
            then(waiting(), &[RetryNow, Tick]),
            Status(503),
            &["note answered 3"],
            "waiting_for_user 4 +60000 ep5",
        ),
        // WaitingForUser ── set_foreground(true), reconnect ──▶ Sending (fresh episode)
        row(
            then(waiting(), &[Foreground(false)]),
            Foreground(true),
            &["then tick:", "publish sending", "send 3 #5"],
            "sending",
        ),
        row(
            then(waiting(), &[Online(false)]),
            Online(true),
            &["flush_at seen"],
            "sending",
        ),
        row(waiting(), Online(false), &["release 3"], "offline"),
        // WaitingForUser ── dismiss() ──▶ Idle, events kept
        row(waiting(), Dismiss, &["release 3"], "idle"),
        // Sending ── 401/403 ──▶ Paused{auth}; other 4xx/3xx ──▶ Paused{config}
        row(
            sending(3),
            Status(401),
            &["note answered 3", "release 3"],
            "paused auth",
        ),
        row(
            sending(3),
            Status(403),
            &["note answered 3", "release 3"],
            "paused auth",
        ),
        row(
            sending(3),
            Status(404),
            &["note answered 3", "release 3"],
            "paused config",
        ),
        row(
            sending(3),
            Status(302),
            &["note answered 3", "release 3"],
            "paused config",
        ),
        // Paused ── resume(), or set_api_key() for auth ──▶ Sending
        row(
            paused_auth(),
            Tick,
            &["publish paused auth", "wait"],
            "paused auth",
        ),
        row(paused_auth(), Resume, &["flush_at seen"], "sending"),
        row(paused_auth(), NewKey, &["flush_at seen"], "sending"),
        row(
            paused_auth(),
            Flush,
            &["then tick:", "publish paused auth", "wait"],
            "paused auth",
        ),
        row(
            paused_config(),
            NewKey,
            &["then tick:", "publish paused config", "wait"],
            "paused config",
        ),
        row(paused_config(), Resume, &["flush_at seen"], "sending"),
        // Offline: no attempts; set_online(true) ──▶ Sending, unless paused.
        row(
            idle(),
            Online(false),
            &["then tick:", "publish offline", "wait"],
            "offline",
        ),
        row(offline(), Tick, &["publish offline", "wait"], "offline"),
        row(
            offline(),
            Flush,
            &["then tick:", "publish offline", "wait"],
            "offline",
        ),
        row(offline(), Online(true), &["flush_at seen"], "sending"),
        row(sending(3), Online(false), &["release 3"], "offline"),
        row(
            then(paused_auth(), &[Online(false)]),
            Online(true),
            &["then tick:", "publish paused auth", "wait"],
            "paused auth",
        ),
        // Disabled ── set_enabled(true) ──▶ Idle (Offline or Paused if that is where it was)
        row(
            idle(),
            Enabled(false),
            &["then tick:", "publish disabled", "wait"],
            "disabled",
        ),
        row(sending(3), Enabled(false), &["release 3"], "disabled"),
        row(disabled(), Tick, &["publish disabled", "wait"], "disabled"),
        row(
            disabled(),
            Flush,
            &["then tick:", "publish disabled", "wait"],
            "disabled",
        ),
        row(
            disabled(),
            Online(false),
            &["then tick:", "publish disabled", "wait"],
            "disabled",
        ),
        row(
            disabled(),
            Enabled(true),
            &["then tick:", "publish idle", "wait +10000"],
            "idle",
        ),
        row(
            then(offline(), &[Enabled(false)]),
            Enabled(true),
            &["then tick:", "publish offline", "wait"],
            "offline",
        ),
        row(
            then(paused_auth(), &[Enabled(false)]),
            Enabled(true),
            &["then tick:", "publish paused auth", "wait"],
            "paused auth",
        ),
        // Shutdown gives the batch in flight back.
        row(sending(3), Shutdown, &["release 3", "stop"], "sending"),
        row(
            retry(1),
            Shutdown,
            &["release 3", "stop"],
            "retry_scheduled 1 +1000 ep1",
        ),
    ];
    assert_eq!(drive(policy(), &rows), 61);
}

/// docs/delivery.md §Retry: the per-episode budgets and what starts a fresh episode.
#[test]
fn budgets() {
    let rows = [
        // max_auto_attempts (3): retries 1, 2, 3 with doubling ceilings, then the hand-over.
        row(
            retrying(1),
            Status(503),
            &["note answered 3", "publish retry_scheduled 2/3 +2000"],
            "retry_scheduled 2 +2000 ep2",
        ),
        row(
            retrying(2),
            Status(503),
            &["note answered 3", "publish retry_scheduled 3/3 +4000"],
            "retry_scheduled 3 +4000 ep3",
        ),
        row(
            retrying(3),
            Timeout,
            &[
                "then tick:",
                "publish waiting_for_user 3 +60000",
                "wait +60000",
            ],
            "waiting_for_user 3 +60000 ep4",
        ),
        // Every kind of transient answer spends the budget alike.
        row(
            sending(3),
            Status(500),
            &["note answered 3", "publish retry_scheduled 1/3 +1000"],
            "retry_scheduled 1 +1000 ep1",
        ),
        row(
            sending(3),
            Status(408),
            &["note answered 3", "publish retry_scheduled 1/3 +1000"],
            "retry_scheduled 1 +1000 ep1",
        ),
        row(
            sending(3),
            Timeout,
            &["publish retry_scheduled 1/3 +1000"],
            "retry_scheduled 1 +1000 ep1",
        ),
        row(
            sending(3),
            Refused,
            &["note not_sent 3", "publish retry_scheduled 1/3 +1000"],
            "retry_scheduled 1 +1000 ep1",
        ),
        // A delivery ends the episode: the next failure is retry 1 again.
        row(
            then(retrying(2), &[Status(200), Tick, Batch(2)]),
            Status(503),
            &["note answered 2", "publish retry_scheduled 1/3 +1000"],
            "retry_scheduled 1 +1000 ep1",
        ),
        // A reconnect and a dismiss() start a fresh episode too.
        row(
            then(retry(2), &[Online(false), Online(true), Tick, Batch(3)]),
            Status(503),
            &["note answered 3", "publish retry_scheduled 1/3 +1000"],
            "retry_scheduled 1 +1000 ep1",
        ),
        row(
            then(retry(2), &[Dismiss, Flush, Tick, Batch(3)]),
            Status(503),
            &["note answered 3", "publish retry_scheduled 1/3 +1000"],
            "retry_scheduled 1 +1000 ep1",
        ),
        // retry_now() from RetryScheduled is the scheduled retry, early: same episode.
        row(
            then(retry(1), &[RetryNow, Tick]),
            Status(503),
            &["note answered 3", "publish retry_scheduled 2/3 +2000"],
            "retry_scheduled 2 +2000 ep2",
        ),
        // Each manual attempt that fails adds one and schedules no automatic retry.
        row(
            then(waiting(), &[RetryNow, Tick, Status(503), RetryNow, Tick]),
            Status(503),
            &["note answered 3"],
            "waiting_for_user 5 +60000 ep6",
        ),
    ];
    assert_eq!(drive(policy(), &rows), 12);

    // max_retry_elapsed_ms: no retry that would start later than that after the first failure.
    let short = Policy {
        max_retry_elapsed_ms: 2_500,
        ..policy()
    };
    let rows = [
        row(
            sending(3),
            Status(503),
            &["note answered 3", "publish retry_scheduled 1/3 +1000"],
            "retry_scheduled 1 +1000 ep1",
        ),
        // At +1000 the next retry would start at +3000 > 2500: hand over after one retry.
        row(
            retrying(1),
            Status(503),
            &["note answered 3"],
            "waiting_for_user 1 +60000 ep2",
        ),
    ];
    assert_eq!(drive(short, &rows), 2);
}

/// `Retry-After` (429/503): no earlier than asked, capped by `retry_after_cap_ms` (60 s here);
/// a shorter one than the backoff leaves the backoff.
#[test]
fn retry_after_is_honoured_and_capped() {
    let rows = [
        row(
            sending(3),
            RetryAfter(429, 7),
            &["note answered 3", "publish retry_scheduled 1/3 +7000"],
            "retry_scheduled 1 +7000 ep1",
        ),
        row(
            sending(3),
            RetryAfter(503, 1_000_000),
            &["note answered 3", "publish retry_scheduled 1/3 +60000"],
            "retry_scheduled 1 +60000 ep1",
        ),
        row(
            retrying(2),
            RetryAfter(503, 1),
            &["note answered 3", "publish retry_scheduled 3/3 +4000"],
            "retry_scheduled 3 +4000 ep3",
        ),
        row(
            sending(3),
            RetryAfter(503, 0),
            &["note answered 3", "publish retry_scheduled 1/3 +1000"],
            "retry_scheduled 1 +1000 ep1",
        ),
    ];
    assert_eq!(drive(policy(), &rows), 4);
}

/// 400/413 bisection (docs/protocol.md §Responses, src/split.rs): halves without backoff until
/// the bad event stands alone; a lone refusal is quarantined once a sibling was accepted; a
/// refusal of every request pauses with nothing quarantined.
#[test]
fn bisection() {
    let split4 = || then(sending(4), &[Status(400)]);
    let split2 = || then(sending(2), &[Status(400)]);
    let rows = [
        row(sending(4), Status(400), &["note answered 4"], "sending"),
        row(sending(4), Status(422), &["note answered 4"], "sending"),
        row(split4(), Tick, &["publish sending", "send 2 #2"], "sending"),
        row(
            then(split4(), &[Tick, Status(200)]),
            Tick,
            &["publish sending", "send 2 #2"],
            "sending",
        ),
        // A batch of one refused (`max_batch_events = 1`, or the one event pending when the
        // batch was taken) is held like the lone piece of a split: the next batch is its
        // sibling, so the verdict does not hang on how the queue was cut.
        row(
            sending(1),
            Status(400),
            &["note answered 1", THEN_TICK, "next batch <=524224"],
            "sending",
        ),
        row(
            sending(1),
            Status(413),
            &["note answered 1", THEN_TICK, "next batch <=960"],
            "sending",
        ),
        // The next batch is accepted: the collector takes requests, the lone event is bad.
        row(
            then(sending(1), &[Status(400), Tick, Batch(3)]),
            Status(200),
            &["quarantine bad_request 1", "ack 3"],
            "sending",
        ),
        // Nothing behind it: judged alone...
        row(
            then(sending(1), &[Status(400), Tick]),
            Empty,
            &["quarantine bad_request 1", "flush_at seen"],
            "idle",
        ),
        // ...but a 413 for a body under MIN_LEARNED_BYTES (one event here is 1,000 bytes) is no
        // size limit: every body is refused; pause with the event kept.
        row(
            then(sending(1), &[Status(413), Tick]),
            Empty,
            &["release 1"],
            "paused config",
        ),
        // The next batch, alone too, refused too: every request is refused; pause with both
        // events kept.
        row(
            then(sending(1), &[Status(400), Tick, Batch(1)]),
            Status(400),
            &["note answered 1", "release 2"],
            "paused config",
        ),
        // A larger next batch refused is split as usual, within the same evidence.
        row(
            then(
                sending(1),
                &[Status(413), Tick, Batch(2), Status(413), Tick],
            ),
            Status(413),
            &["note answered 1", "release 3"],
            "paused config",
        ),
        // Offline meanwhile: the held event goes back to the queue.
        row(
            then(sending(1), &[Status(400)]),
            Online(false),
            &["release 1"],
            "offline",
        ),
        // In a split: the first lone refusal is held until a sibling shows the collector
        // takes requests...
        row(
            then(split2(), &[Tick]),
            Status(400),
            &["note answered 1"],
            "sending",
        ),
        row(
            then(split2(), &[Tick, Status(400), Tick]),
            Status(200),
            &["quarantine bad_request 1", "ack 1"],
            "sending",
        ),
        // A 413 held, then a body as large accepted: the refusal was not about its size (a
        // proxy fixed between the two requests); it is sent again, once...
        row(
            then(split2(), &[Tick, Status(413), Tick]),
            Status(200),
            &["ack 1", THEN_TICK, "publish sending", "send 1 #3"],
            "sending",
        ),
        // ...and refused with 413 again, the collector taking other requests, it is quarantined.
        row(
            then(split2(), &[Tick, Status(413), Tick, Status(200), Tick]),
            Status(413),
            &["note answered 1", "quarantine too_large 1"],
            "sending",
        ),
        // A 413 for one event after a request of the split was accepted, its body under 1 KiB:
        // no size limit; it goes again first, once.
        row(
            then(split4(), &[Tick, Status(200), Tick, Status(413), Tick]),
            Status(413),
            &["note answered 1", THEN_TICK, "publish sending", "send 1 #4"],
            "sending",
        ),
        // ...after which every lone refusal is the event's own.
        row(
            then(split4(), &[Tick, Status(200), Tick, Status(400), Tick]),
            Status(400),
            &["note answered 1", "quarantine bad_request 1"],
            "sending",
        ),
        // A second lone refusal with nothing accepted: the request is refused; pause with
        // every event given back, none quarantined.
        row(
            then(split2(), &[Tick, Status(400), Tick]),
            Status(400),
            &["note answered 1", "release 2"],
            "paused config",
        ),
        // A lone 413 counts as a refusal too: with nothing accepted, pause.
        row(
            then(split2(), &[Tick, Status(400), Tick]),
            Status(413),
            &["note answered 1", "release 2"],
            "paused config",
        ),
        // A held event goes back to the queue when the split is abandoned.
        row(
            then(split2(), &[Tick, Status(400)]),
            Online(false),
            &["release 2"],
            "offline",
        ),
        // A 413 halves the batch and teaches the size: the next batch is cut at half.
        row(sending(4), Status(413), &["note answered 4"], "sending"),
        row(
            then(
                sending(4),
                &[Status(413), Tick, Status(200), Tick, Status(200)],
            ),
            Tick,
            &["next batch <=1936"],
            "sending",
        ),
        // A 2xx cut short: halves for a batch, a transient failure for a lone event.
        row(sending(2), CutShort, &["note answered 2"], "sending"),
        row(
            sending(1),
            CutShort,
            &["note answered 1", "publish retry_scheduled 1/3 +1000"],
            "retry_scheduled 1 +1000 ep1",
        ),
        // A 2xx naming refused events: those to the quarantine, the rest delivered.
        row(
            sending(3),
            Rejected(1),
            &["quarantine rejected 1", "ack 2"],
            "sending",
        ),
    ];
    assert_eq!(drive(policy(), &rows), 26);
}

/// `max_event_sends` (2 here): an event in requests that got no answer is isolated by halving,
/// quarantined as `max_sends` once the collector answered another request, and never while the
/// collector answers nothing (the next batch goes first as a probe).
#[test]
fn max_sends_isolation() {
    let p = Policy {
        max_event_sends: 2,
        ..policy()
    };
    // Two unanswered sends of a batch of 2: both events at the limit.
    let twice = || then(sending(2), &[Timeout, Fire, Tick]);
    // The same for a lone event with nothing queued behind it.
    let lone = || then(sending(1), &[Timeout, Fire, Tick]);
    let rows = [
        row(
            sending(2),
            Timeout,
            &["publish retry_scheduled 1/3 +1000"],
            "retry_scheduled 1 +1000 ep1",
        ),
        // Halved without backoff, the halves sent at once.
        row(
            twice(),
            Timeout,
            &["then tick:", "publish sending", "send 1 #3"],
            "sending ep1",
        ),
        row(
            then(twice(), &[Timeout]),
            Tick,
            &["publish sending", "send 1 #3"],
            "sending ep1",
        ),
        // Alone, unanswered, nothing answered since: its sibling goes first, after backoff.
        row(
            then(twice(), &[Timeout, Tick]),
            Timeout,
            &["publish retry_scheduled 2/3 +2000"],
            "retry_scheduled 2 +2000 ep2",
        ),
        // Alone with nothing behind: the next batch is asked for, to go first as a probe.
        row(lone(), Timeout, &["probe batch <=524224"], "sending ep1"),
        row(
            then(lone(), &[Timeout]),
            Batch(3),
            &["publish retry_scheduled 2/3 +2000"],
            "retry_scheduled 2 +2000 ep2",
        ),
        row(
            then(lone(), &[Timeout, Batch(3), Fire]),
            Tick,
            &["publish sending", "send 3 #1"],
            "sending ep2",
        ),
        row(
            then(lone(), &[Timeout]),
            Empty,
            &["publish retry_scheduled 2/3 +2000"],
            "retry_scheduled 2 +2000 ep2",
        ),
        // A collector that answers nothing quarantines nothing.
        row(
            then(lone(), &[Timeout, Empty, Fire, Tick]),
            Timeout,
            &["probe batch <=524224"],
            "sending ep2",
        ),
        // The probe is answered, then the event alone is not: it is the cause.
        row(
            then(lone(), &[Timeout, Batch(3), Fire, Tick, Status(200), Tick]),
            Timeout,
            &["quarantine max_sends 1"],
            "sending",
        ),
        // An answered failure is an ordinary transient one, whatever the counts.
        row(
            twice(),
            Status(503),
            &["note answered 2", "publish retry_scheduled 2/3 +2000"],
            "retry_scheduled 2 +2000 ep2",
        ),
    ];
    assert_eq!(drive(p, &rows), 11);
}

/// docs/delivery.md §Slow probe: one request behind `WaitingForUser`, the state kept while it
/// is in flight; a failure moves the next probe out (doubling to `probe_cap_ms`), any answer
/// that is not transient ends the episode.
#[test]
fn slow_probe_behind_waiting_for_user() {
    let rows = [
        row(waiting(), Fire, &["then tick:", "send 3 #5"], "probing ep4"),
        // No `Sending` is published for the probe: the UI keeps showing WaitingForUser.
        row(
            then(waiting(), &[Fire]),
            Tick,
            &["send 3 #5"],
            "probing ep4",
        ),
        row(
            probing(),
            Status(503),
            &["note answered 3"],
            "waiting_for_user 3 +120000 ep4",
        ),
        row(
            then(probing(), &[Status(503), Fire, Tick]),
            Timeout,
            &[
                "then tick:",
                "publish waiting_for_user 3 +240000",
                "wait +240000",
            ],
            "waiting_for_user 3 +240000 ep4",
        ),
        row(
            then(probing(), &[Status(503)]),
            Tick,
            &["publish waiting_for_user 3 +120000", "wait +120000"],
            "waiting_for_user 3 +120000 ep4",
        ),
        row(probing(), Status(200), &["ack 3"], "sending"),
        // A success drains as a fresh episode.
        row(
            then(probing(), &[Status(200), Tick, Batch(2)]),
            Status(503),
            &["note answered 2", "publish retry_scheduled 1/3 +1000"],
            "retry_scheduled 1 +1000 ep1",
        ),
        row(
            probing(),
            Status(401),
            &["note answered 3", "release 3"],
            "paused auth",
        ),
        // A fresh episode after foreground resets the probe's doubling too.
        row(
            then(
                probing(),
                &[
                    Status(503),
                    Foreground(false),
                    Foreground(true),
                    Tick,
                    Status(503),
                ],
            ),
            Tick,
            &["publish retry_scheduled 1/3 +1000", "wait +1000"],
            "retry_scheduled 1 +1000 ep1",
        ),
    ];
    assert_eq!(drive(policy(), &rows), 9);
}

/// Foreground and background: only the background → foreground edge does anything, and only
/// from RetryScheduled or WaitingForUser.
#[test]
fn foreground_and_background() {
    let rows = [
        row(
            idle(),
            Foreground(false),
            &["then tick:", "publish idle", "wait +10000"],
            "idle",
        ),
        row(
            then(idle(), &[Foreground(false)]),
            Foreground(true),
            &["then tick:", "publish idle", "wait +10000"],
            "idle",
        ),
        row(
            retry(1),
            Foreground(false),
            &[
                "then tick:",
                "publish retry_scheduled 1/3 +1000",
                "wait +1000",
            ],
            "retry_scheduled 1 +1000 ep1",
        ),
        row(
            waiting(),
            Foreground(false),
            &[
                "then tick:",
                "publish waiting_for_user 3 +60000",
                "wait +60000",
            ],
            "waiting_for_user 3 +60000 ep4",
        ),
        row(
            then(paused_auth(), &[Foreground(false)]),
            Foreground(true),
            &["then tick:", "publish paused auth", "wait"],
            "paused auth",
        ),
        row(
            then(offline(), &[Foreground(false)]),
            Foreground(true),
            &["then tick:", "publish offline", "wait"],
            "offline",
        ),
        row(
            then(sending(3), &[Foreground(false)]),
            Foreground(true),
            &["then tick:", "publish sending", "send 3 #2"],
            "sending",
        ),
    ];
    assert_eq!(drive(policy(), &rows), 7);
}

/// Offline: no attempts from any state; back online drains as a fresh episode.
#[test]
fn offline_from_every_state() {
    let rows = [
        row(retry(2), Online(false), &["release 3"], "offline"),
        row(
            then(retry(2), &[Online(false)]),
            TickAfter(5_000),
            &["publish offline", "wait"],
            "offline",
        ),
        row(
            then(retry(2), &[Online(false)]),
            RetryNow,
            &["then tick:", "publish offline", "wait"],
            "offline",
        ),
        row(probing(), Online(false), &["release 3"], "offline"),
        row(
            then(asked(), &[Empty, Online(false)]),
            TickFlushAt,
            &["publish offline", "wait"],
            "offline",
        ),
        row(
            paused_config(),
            Online(false),
            &["then tick:", "publish offline", "wait"],
            "offline",
        ),
        row(
            then(paused_config(), &[Online(false), Online(true)]),
            Resume,
            &["flush_at seen"],
            "sending",
        ),
        row(
            then(offline(), &[Online(true)]),
            Tick,
            &["next batch <=524224"],
            "sending",
        ),
    ];
    assert_eq!(drive(policy(), &rows), 8);
}

/// The age limit before every send, retries included, and `min_batch_interval_ms`.
#[test]
fn age_and_interval() {
    let aged = Policy {
        max_event_age_ms: 1_500,
        ..policy()
    };
    let rows = [
        // Retry 1 fires at +1000: still young enough.
        row(
            then(retry(1), &[Fire]),
            Tick,
            &["publish sending", "send 3 #2"],
            "sending ep1",
        ),
        // Retry 2 fires at +3000: every event of the batch expired while it waited.
        row(
            then(retry(2), &[Fire]),
            Tick,
            &["drop expired 3"],
            "sending ep2",
        ),
        row(
            then(retry(2), &[Fire, Tick]),
            Tick,
            &["next batch <=524224"],
            "sending ep2",
        ),
    ];
    assert_eq!(drive(aged, &rows), 3);

    let spaced = Policy {
        min_batch_interval_ms: 500,
        ..policy()
    };
    let rows = [
        row(
            then(sending(3), &[Status(200)]),
            Tick,
            &["publish sending", "wait +500"],
            "sending",
        ),
        row(
            then(sending(3), &[Status(200)]),
            TickAfter(500),
            &["next batch <=524224"],
            "sending",
        ),
        // The probe waits out the interval behind WaitingForUser, publishing nothing.
        row(
            then(waiting(), &[Fire]),
            Tick,
            &["send 3 #5"],
            "probing ep4",
        ),
    ];
    assert_eq!(drive(spaced, &rows), 3);
}

/// The fleet loop's two inputs: a lone client report goes with the periodic flush and never
/// sooner; a collector's `pause_until` holds every request until it ends, capped like
/// `Retry-After` (`retry_after_cap_ms` is 60 s here).
#[test]
fn fleet_report_and_pause() {
    let rows = [
        // Nothing to send: the idle worker sleeps without a deadline...
        row(
            idle(),
            TickEmptyAfter(10_000),
            &["publish idle", "wait"],
            "idle",
        ),
        // ...but a waiting report arms the periodic flush, and goes with it.
        row(
            vec![ReportDue],
            TickEmpty,
            &["publish idle", "wait +10000"],
            "idle",
        ),
        row(
            vec![ReportDue],
            TickEmptyAfter(10_000),
            &["flush_at seen"],
            "sending",
        ),
        // The queue has nothing: an empty batch carries the report; a 2xx ends it.
        row(
            vec![ReportDue, TickEmptyAfter(10_000), TickEmpty],
            Empty,
            &["publish sending", "send 0 #1"],
            "sending",
        ),
        row(
            vec![ReportDue, TickEmptyAfter(10_000), TickEmpty, Empty],
            Status(200),
            &["then tick:", "next batch <=524224"],
            "sending",
        ),
        row(
            vec![ReportDue, TickEmptyAfter(10_000), TickEmpty, Empty],
            Status(400),
            &["note answered 0"],
            "sending",
        ),
        // An ordinary drain that empties the queue costs no request for the report.
        row(
            vec![ReportDue, Flush, Tick, Batch(3), Status(200), Tick],
            Empty,
            &["flush_at seen"],
            "idle",
        ),
        // A pause: the drain a flush starts rests until it ends, then sends.
        row(
            vec![PauseFor(5_000), Flush],
            Tick,
            &["publish deferred collector +5000", "wait +5000"],
            "sending held +5000",
        ),
        row(
            vec![PauseFor(5_000), Flush],
            TickAfter(5_000),
            &["next batch <=524224"],
            "sending",
        ),
        // flush_at does not break it either.
        row(
            vec![PauseFor(5_000)],
            TickFlushAt,
            &["publish deferred collector +5000", "wait +5000"],
            "idle held +5000",
        ),
        // Capped: a pause of days lasts retry_after_cap_ms.
        row(
            vec![PauseFor(86_400_000)],
            TickFlushAt,
            &["publish deferred collector +60000", "wait +60000"],
            "idle held +60000",
        ),
        // A retry whose time comes during a pause waits for its end.
        row(
            then(retry(1), &[PauseFor(30_000), Fire]),
            Tick,
            &["publish deferred collector +29000", "wait +29000"],
            "sending held +29000 ep1",
        ),
    ];
    assert_eq!(drive(policy(), &rows), 12);
}

fn deferred() -> Vec<In> {
    vec![Metered(true)]
}

/// Delivery conditions (docs/delivery.md §Conditions): `Deferred{reason}` from each state that
/// can be deferred, the way back (as a reconnect: a fresh episode), timers that must not send
/// while deferred, and the precedence Disabled > Offline > Paused > Deferred.
#[test]
fn deferred_by_conditions() {
    let rows = [
        // Idle, Sending (between batches, a split's halves in hand), RetryScheduled,
        // WaitingForUser ── conditions forbid ──▶ Deferred; what was in hand goes back.
        row(
            idle(),
            Metered(true),
            &["then tick:", "publish deferred metered", "wait"],
            "deferred metered",
        ),
        row(
            idle(),
            LowPower(true),
            &["then tick:", "publish deferred low_power", "wait"],
            "deferred low_power",
        ),
        row(
            idle(),
            BatteryLow(true),
            &["then tick:", "publish deferred battery_low", "wait"],
            "deferred battery_low",
        ),
        row(
            draining(),
            Metered(true),
            &["then tick:", "publish deferred metered", "wait"],
            "deferred metered",
        ),
        row(
            then(sending(4), &[Status(400)]),
            Metered(true),
            &["release 4"],
            "deferred metered",
        ),
        row(retry(1), Metered(true), &["release 3"], "deferred metered"),
        row(waiting(), Metered(true), &["release 3"], "deferred metered"),
        // Deferred: no attempt; the verbs that would send do nothing.
        row(
            deferred(),
            Tick,
            &["publish deferred metered", "wait"],
            "deferred metered",
        ),
        row(
            deferred(),
            Flush,
            &["then tick:", "publish deferred metered", "wait"],
            "deferred metered",
        ),
        row(
            deferred(),
            RetryNow,
            &["then tick:", "publish deferred metered", "wait"],
            "deferred metered",
        ),
        row(
            deferred(),
            Dismiss,
            &["then tick:", "publish deferred metered", "wait"],
            "deferred metered",
        ),
        row(
            then(deferred(), &[Foreground(false)]),
            Foreground(true),
            &["then tick:", "publish deferred metered", "wait"],
            "deferred metered",
        ),
        row(
            deferred(),
            TickFlushAt,
            &["publish deferred metered", "wait"],
            "deferred metered",
        ),
        // Retry and probe timers do not fire sends while deferred.
        row(
            then(retry(1), &[Metered(true)]),
            TickAfter(3_600_000),
            &["publish deferred metered", "wait"],
            "deferred metered",
        ),
        row(
            then(waiting(), &[Metered(true)]),
            TickAfter(3_600_000),
            &["publish deferred metered", "wait"],
            "deferred metered",
        ),
        // Deferred ── conditions allow ──▶ Sending, as after a reconnect.
        row(deferred(), Metered(false), &["flush_at seen"], "sending"),
        row(
            then(retry(2), &[Metered(true)]),
            Metered(false),
            &["flush_at seen"],
            "sending",
        ),
        // No budget spent: the retry of an episode begun before the deferral starts again at 1.
        row(
            then(retry(2), &[Metered(true), Metered(false), Tick, Batch(3)]),
            Status(503),
            &["note answered 3", "publish retry_scheduled 1/3 +1000"],
            "retry_scheduled 1 +1000 ep1",
        ),
        row(
            then(waiting(), &[Metered(true), Metered(false), Tick, Batch(3)]),
            Status(503),
            &["note answered 3", "publish retry_scheduled 1/3 +1000"],
            "retry_scheduled 1 +1000 ep1",
        ),
        // The reason shown when several forbid: metered, then low power, then battery low.
        row(
            then(idle(), &[LowPower(true)]),
            Metered(true),
            &["then tick:", "publish deferred metered", "wait"],
            "deferred metered",
        ),
        row(
            then(idle(), &[Metered(true), BatteryLow(true)]),
            Metered(false),
            &["then tick:", "publish deferred battery_low", "wait"],
            "deferred battery_low",
        ),
        // Precedence: Disabled > Offline > Paused > Deferred.
        row(
            paused_auth(),
            Metered(true),
            &["then tick:", "publish paused auth", "wait"],
            "paused auth",
        ),
        row(
            then(paused_auth(), &[Metered(true)]),
            Metered(false),
            &["then tick:", "publish paused auth", "wait"],
            "paused auth",
        ),
        row(
            then(paused_auth(), &[Metered(true)]),
            Resume,
            &["then tick:", "publish deferred metered", "wait"],
            "deferred metered",
        ),
        row(
            offline(),
            Metered(true),
            &["then tick:", "publish offline", "wait"],
            "offline",
        ),
        row(
            then(offline(), &[Metered(true)]),
            Online(true),
            &["then tick:", "publish deferred metered", "wait"],
            "deferred metered",
        ),
        row(
            then(offline(), &[Metered(true)]),
            Metered(false),
            &["then tick:", "publish offline", "wait"],
            "offline",
        ),
        row(
            deferred(),
            Online(false),
            &["then tick:", "publish offline", "wait"],
            "offline",
        ),
        row(
            disabled(),
            Metered(true),
            &["then tick:", "publish disabled", "wait"],
            "disabled",
        ),
        row(
            then(disabled(), &[Metered(true)]),
            Enabled(true),
            &["then tick:", "publish deferred metered", "wait"],
            "deferred metered",
        ),
        row(
            deferred(),
            Enabled(false),
            &["then tick:", "publish disabled", "wait"],
            "disabled",
        ),
    ];
    assert_eq!(drive(policy(), &rows), 31);

    // A condition the policy allows changes nothing.
    let allowing = Policy {
        deliver_on_metered: true,
        ..policy()
    };
    let rows = [
        row(
            idle(),
            Metered(true),
            &["then tick:", "publish idle", "wait +10000"],
            "idle",
        ),
        row(
            then(retry(1), &[Metered(true)]),
            Fire,
            &["then tick:", "publish sending", "send 3 #2"],
            "sending ep1",
        ),
        row(
            then(idle(), &[Metered(true)]),
            LowPower(true),
            &["then tick:", "publish deferred low_power", "wait"],
            "deferred low_power",
        ),
    ];
    assert_eq!(drive(allowing, &rows), 3);
}

/// A drain started.
fn drain_sending(n: usize) -> Vec<In> {
    vec![Drain(5_000), Tick, Batch(n)]
}

/// The bounded drain (docs/delivery.md §Bounded drain): each outcome, when it is told, and that
/// no wait outlasts the budget.
#[test]
fn bounded_drain() {
    let rows = [
        // From Idle it is a flush trigger; the queue found empty ──▶ Drained.
        row(idle(), Drain(5_000), &["flush_at seen"], "sending"),
        row(
            then(idle(), &[Drain(5_000)]),
            Tick,
            &["next batch <=524224"],
            "sending",
        ),
        row(
            then(idle(), &[Drain(5_000), Tick]),
            Empty,
            &["flush_at seen", "drain 1 drained"],
            "idle",
        ),
        row(drain_sending(3), Status(200), &["ack 3"], "sending"),
        row(
            then(drain_sending(3), &[Status(200), Tick]),
            Empty,
            &["flush_at seen", "drain 1 drained"],
            "idle",
        ),
        // A drain already under way is joined.
        row(
            sending(3),
            Drain(5_000),
            &["then tick:", "publish sending", "send 3 #2"],
            "sending",
        ),
        // The budget passes with events pending ──▶ DeadlineReached, told before the next
        // question; delivery goes on as after any flush.
        row(
            then(drain_sending(3), &[Status(200)]),
            TickAfter(5_000),
            &["drain 1 deadline", "next batch <=524224"],
            "sending",
        ),
        // Two drains: each ends at its own deadline.
        row(
            then(
                idle(),
                &[Drain(1_000), Drain(5_000), Tick, Batch(3), Status(200)],
            ),
            TickAfter(1_000),
            &["drain 1 deadline", "next batch <=524224"],
            "sending",
        ),
        // A retry within the budget is waited for; the countdown's wait ends by the deadline.
        row(
            retry(1),
            Drain(5_000),
            &[
                "then tick:",
                "publish retry_scheduled 1/3 +1000",
                "wait +1000",
            ],
            "retry_scheduled 1 +1000 ep1",
        ),
        row(
            then(retry(1), &[Drain(5_000)]),
            Tick,
            &["publish retry_scheduled 1/3 +1000", "wait +1000"],
            "retry_scheduled 1 +1000 ep1",
        ),
        row(
            then(retry(1), &[Drain(5_000)]),
            Fire,
            &["then tick:", "publish sending", "send 3 #2"],
            "sending ep1",
        ),
        // A retry after the budget ──▶ RetryAfter{ms until it}, at once.
        row(
            retry(1),
            Drain(500),
            &["drain 1 retry_after +1000"],
            "retry_scheduled 1 +1000 ep1",
        ),
        row(
            drain_sending(3),
            RetryAfter(503, 30),
            &[
                "note answered 3",
                "publish retry_scheduled 1/3 +30000",
                "drain 1 retry_after +30000",
            ],
            "retry_scheduled 1 +30000 ep1",
        ),
        // WaitingForUser: the slow probe is the next attempt.
        row(
            waiting(),
            Drain(5_000),
            &["drain 1 retry_after +60000"],
            "waiting_for_user 3 +60000 ep4",
        ),
        // Offline, Paused, Disabled, Deferred ──▶ Blocked{state}, at once.
        row(
            offline(),
            Drain(5_000),
            &["drain 1 blocked offline"],
            "offline",
        ),
        row(
            paused_auth(),
            Drain(5_000),
            &["drain 1 blocked paused auth"],
            "paused auth",
        ),
        row(
            disabled(),
            Drain(5_000),
            &["drain 1 blocked disabled"],
            "disabled",
        ),
        row(
            deferred(),
            Drain(5_000),
            &["drain 1 blocked deferred metered"],
            "deferred metered",
        ),
        // ... or when the drain runs into them.
        row(
            drain_sending(3),
            Status(401),
            &[
                "note answered 3",
                "release 3",
                "drain 1 blocked paused auth",
            ],
            "paused auth",
        ),
        row(
            then(drain_sending(3), &[Status(200)]),
            Metered(true),
            &["drain 1 blocked deferred metered"],
            "deferred metered",
        ),
        row(
            then(drain_sending(3), &[Status(200)]),
            Online(false),
            &["drain 1 blocked offline"],
            "offline",
        ),
        // "Back" during the drain's retry: the drain asks again at the next turn.
        row(
            then(retry(1), &[Drain(5_000)]),
            Dismiss,
            &["release 3"],
            "idle",
        ),
        row(
            then(retry(1), &[Drain(5_000), Dismiss]),
            Tick,
            &["flush_at seen"],
            "sending",
        ),
    ];
    assert_eq!(drive(policy(), &rows), 23);

    // With a pause between batches, the throttle's wait ends by the deadline too.
    let spaced = Policy {
        min_batch_interval_ms: 1_000,
        ..policy()
    };
    let rows = [
        row(
            then(idle(), &[Drain(2_500), Tick, Batch(3), Status(200)]),
            Tick,
            &["publish sending", "wait +1000"],
            "sending",
        ),
        row(
            then(idle(), &[Drain(400), Tick, Batch(3), Status(200)]),
            Tick,
            &["publish sending", "wait +400"],
            "sending",
        ),
        row(
            then(idle(), &[Drain(400), Tick, Batch(3), Status(200)]),
            TickAfter(400),
            &["publish sending", "drain 1 deadline", "wait +600"],
            "sending",
        ),
    ];
    assert_eq!(drive(spaced, &rows), 3);
}

fn consent_pending() -> Vec<In> {
    vec![SetConsent(Consent::Pending)]
}

/// README §Consent: `pending` defers every send (whatever the network, `flush_at` or the
/// timer), `granted` sends the backlog at once, `denied` disables and discards what was kept,
/// after giving back what was in flight.
#[test]
fn consent_row_by_row() {
    let rows = [
        row(
            idle(),
            SetConsent(Consent::Pending),
            &["then tick:", "publish deferred consent", "wait"],
            "deferred consent",
        ),
        row(
            consent_pending(),
            Tick,
            &["publish deferred consent", "wait"],
            "deferred consent",
        ),
        row(
            consent_pending(),
            TickFlushAt,
            &["publish deferred consent", "wait"],
            "deferred consent",
        ),
        row(
            consent_pending(),
            TickAfter(3_600_000),
            &["publish deferred consent", "wait"],
            "deferred consent",
        ),
        row(
            consent_pending(),
            TickCritical,
            &["publish deferred consent", "wait"],
            "deferred consent",
        ),
        row(
            consent_pending(),
            Flush,
            &["then tick:", "publish deferred consent", "wait"],
            "deferred consent",
        ),
        row(
            consent_pending(),
            RetryNow,
            &["then tick:", "publish deferred consent", "wait"],
            "deferred consent",
        ),
        // Going offline and back while pending changes nothing that is shown.
        row(
            consent_pending(),
            Online(false),
            &["then tick:", "publish deferred consent", "wait"],
            "deferred consent",
        ),
        row(
            then(consent_pending(), &[Online(false)]),
            Online(true),
            &["then tick:", "publish deferred consent", "wait"],
            "deferred consent",
        ),
        // Pending ── granted ──▶ Sending: the backlog goes now.
        row(
            consent_pending(),
            SetConsent(Consent::Granted),
            &["flush_at seen"],
            "sending",
        ),
        row(
            then(consent_pending(), &[SetConsent(Consent::Granted)]),
            Tick,
            &["next batch <=524224"],
            "sending",
        ),
        // Granted while offline: rest offline, send on reconnect.
        row(
            then(consent_pending(), &[Online(false)]),
            SetConsent(Consent::Granted),
            &["then tick:", "publish offline", "wait"],
            "offline",
        ),
        // Pending ── denied ──▶ Disabled, what was kept discarded.
        row(
            consent_pending(),
            SetConsent(Consent::Denied),
            &["discard for consent"],
            "disabled",
        ),
        // Sending ── denied ──▶ the batch comes back first, then everything goes.
        row(
            sending(3),
            SetConsent(Consent::Denied),
            &["release 3", "discard for consent"],
            "disabled",
        ),
        row(
            sending(3),
            SetConsent(Consent::Pending),
            &["release 3"],
            "deferred consent",
        ),
        row(
            retry(1),
            SetConsent(Consent::Pending),
            &["release 3"],
            "deferred consent",
        ),
        row(
            then(consent_pending(), &[SetConsent(Consent::Denied)]),
            Tick,
            &["publish disabled", "wait"],
            "disabled",
        ),
        // Denied ── granted ──▶ sending again; set_enabled(true) alone does not undo a denial.
        row(
            then(consent_pending(), &[SetConsent(Consent::Denied)]),
            SetConsent(Consent::Granted),
            &["flush_at seen"],
            "sending",
        ),
        row(
            then(consent_pending(), &[SetConsent(Consent::Denied)]),
            Enabled(true),
            &["then tick:", "publish disabled", "wait"],
            "disabled",
        ),
        // Opted out and pending: the opt-out wins until it is lifted, then pending holds.
        row(
            then(disabled(), &[SetConsent(Consent::Pending)]),
            Tick,
            &["publish disabled", "wait"],
            "disabled",
        ),
        row(
            then(disabled(), &[SetConsent(Consent::Pending)]),
            Enabled(true),
            &["then tick:", "publish deferred consent", "wait"],
            "deferred consent",
        ),
    ];
    assert_eq!(drive(policy(), &rows), rows.len());
}

/// docs/critical-lane.md: a critical event starts a drain without `flush_at` or the timer, and
/// the next batch is asked for without the throttle; a backoff still holds.
#[test]
fn critical_lane_row_by_row() {
    let throttled = Policy {
        min_batch_interval_ms: 1000,
        ..policy()
    };
    let after_one = then(sending(3), &[Status(200)]);
    let rows = [
        row(idle(), TickCritical, &["flush_at seen"], "sending"),
        row(
            after_one.clone(),
            Tick,
            &["publish sending", "wait +1000"],
            "sending",
        ),
        row(
            after_one.clone(),
            TickCritical,
            &["next batch <=524224"],
            "sending",
        ),
        row(
            then(sending(3), &[Status(503)]),
            TickCritical,
            &["publish retry_scheduled 1/3 +1000", "wait +1000"],
            "retry_scheduled 1 +1000 ep1",
        ),
        row(
            offline(),
            TickCritical,
            &["publish offline", "wait"],
            "offline",
        ),
    ];
    assert_eq!(drive(throttled, &rows), rows.len());
}

mod orderings;

/// A timeout teaches the batch size as a 413 does (src/split.rs): the timed-out batch is sent
/// again in halves after the backoff and the next batches are cut at half; successes grow it
/// back; a reconnect forgets it; a timeout of a few KB teaches nothing.
#[test]
fn timeouts_teach_a_batch_size_for_the_link() {
    let timed_out = || then(sending(10), &[Timeout, Fire]);
    let rows = [
        row(
            timed_out(),
            Tick,
            &["publish sending", "send 5 #2"],
            "sending ep1",
        ),
        row(
            then(timed_out(), &[Tick, Status(200), Tick, Status(200)]),
            Tick,
            &["next batch <=4936"],
            "sending",
        ),
        row(
            then(
                timed_out(),
                &[Tick, Status(200), Online(false), Online(true)],
            ),
            Tick,
            &["next batch <=524224"],
            "sending",
        ),
        row(
            then(sending(4), &[Timeout, Fire]),
            Tick,
            &["publish sending", "send 4 #2"],
            "sending ep1",
        ),
    ];
    assert_eq!(drive(policy(), &rows), 4);
}
