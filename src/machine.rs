//! The delivery state machine of [docs/delivery.md](../docs/delivery.md) as a pure type: it
//! decides, the worker ([`crate::worker`]) performs. No runtime, no threads, no clock reads, no
//! I/O: every fact comes in as an [`Input`] (the app's control verbs, the clock and the queue at
//! the driver's turn, the batch the queue gave, the transport's answer, already classified by
//! [`crate::classify`]), and every effect goes out as an [`Action`] (publish a state, wait until a
//! time, take a batch, send it, ack, quarantine, release, drop). The retry formula and budgets
//! are [`crate::retry`]'s, what a split teaches is [`crate::split`]'s; this module only holds the
//! transitions between them.
//!
//! Why a separate type: every transition of the state table can then be tested as a row (start
//! state, input, expected actions and next state) without a socket, a thread or a wait, and the
//! worker shrinks to a loop that gathers inputs and carries out actions.
//!
//! The protocol between the two: the driver feeds [`Input::Control`] with the verbs taken since
//! its last turn, then [`Input::Tick`] with the clock and the queue, and performs the actions in
//! order. [`Action::NextBatch`], [`Action::ProbeBatch`] and [`Action::Send`] are questions: the
//! driver answers them with [`Input::Batch`] and [`Input::Answer`], and the machine always asks
//! last, so the answer's actions follow. A turn whose actions end without [`Action::Wait`] is
//! followed at once by the next turn.

use std::collections::VecDeque;

use crate::classify::{Failure, Outcome};
use crate::config::{BATCH_OVERHEAD_BYTES, Config};
use crate::event::{QueuedEvent, SendNote};
use crate::quarantine::reason;
use crate::retry::{AfterFailure, Episode, after_failure, next_delay_ms, probe_delay_ms};
use crate::shared::Control;
use crate::split::{LoneRefusal, SizeLimit, Split};
use crate::state::{DeliveryState, PauseReason};
use crate::transport::{HttpResponse, TransportError};

/// Events of a batch, each with whether it was read from the store (the queue gives it back or
/// deletes it where it lives).
pub type Events = Vec<(QueuedEvent, bool)>;

/// The settings the transitions depend on (a copy of those of [`Config`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Policy {
    pub flush_interval_ms: u64,
    pub min_batch_interval_ms: u64,
    pub max_batch_bytes: u64,
    pub max_auto_attempts: u32,
    pub backoff_base_ms: u64,
    pub backoff_cap_ms: u64,
    pub retry_after_cap_ms: u64,
    pub max_retry_elapsed_ms: u64,
    pub probe_base_ms: u64,
    pub probe_cap_ms: u64,
    pub max_event_sends: u32,
    pub max_event_age_ms: u64,
}

impl Policy {
    pub fn of(c: &Config) -> Policy {
        Policy {
            flush_interval_ms: c.flush_interval_ms,
            min_batch_interval_ms: c.min_batch_interval_ms,
            max_batch_bytes: c.max_batch_bytes,
            max_auto_attempts: c.max_auto_attempts,
            backoff_base_ms: c.backoff_base_ms,
            backoff_cap_ms: c.backoff_cap_ms,
            retry_after_cap_ms: c.retry_after_cap_ms,
            max_retry_elapsed_ms: c.max_retry_elapsed_ms,
            probe_base_ms: c.probe_base_ms,
            probe_cap_ms: c.probe_cap_ms,
            max_event_sends: c.max_event_sends,
            max_event_age_ms: c.max_event_age_ms,
        }
    }
}

/// Where the jitter samples come from: a generator (seeded for reproducible runs), or one fixed
/// unit, so a table row can name the exact deadline.
#[derive(Debug)]
pub enum Jitter {
    Random(fastrand::Rng),
    #[cfg_attr(not(test), allow(dead_code))]
    Fixed(f64),
}

impl Jitter {
    pub fn seeded(seed: Option<u64>) -> Jitter {
        Jitter::Random(match seed {
            Some(seed) => fastrand::Rng::with_seed(seed),
            None => fastrand::Rng::new(),
        })
    }

    fn unit(&mut self) -> f64 {
        match self {
            Jitter::Random(rng) => rng.f64(),
            Jitter::Fixed(unit) => *unit,
        }
    }
}

/// What the machine is told.
#[derive(Clone, Debug)]
pub enum Input {
    /// The app's verbs and edges since the driver last looked
    /// ([`crate::shared::Shared::take_control`]), at `now_ms`.
    Control { verbs: Control, now_ms: u64 },
    /// The driver's turn (also after a timer fired): the monotonic and wall clocks, the events
    /// pending, and whether `flush_at` was reached since the last drain started.
    Tick {
        now_ms: u64,
        wall_ms: i64,
        pending: u64,
        flush_at: bool,
    },
    /// The answer to [`Action::NextBatch`] / [`Action::ProbeBatch`]: the batch the queue leased,
    /// in delivery order, or `None` when it is empty. `wall_ms` is read after it was taken.
    Batch {
        events: Option<Events>,
        wall_ms: i64,
    },
    /// The answer to [`Action::Send`]: `note` is what the transport's result says about the
    /// send ([`SendNote::Answered`] for any HTTP answer, [`SendNote::NotSent`] for a refused
    /// connection, `None` when the effect is unknown), `outcome` its classification,
    /// `body_bytes` the body's size before compression.
    Answer {
        now_ms: u64,
        note: Option<SendNote>,
        outcome: Outcome,
        body_bytes: u64,
    },
}

/// What a transport's result says about the send: any HTTP answer means the collector saw it; a
/// refused connection or a TLS failure means the request never went out; a timeout or a broken
/// connection leaves the effect unknown (`None`).
pub fn send_note(result: &Result<HttpResponse, TransportError>) -> Option<SendNote> {
    match result {
        Ok(_) => Some(SendNote::Answered),
        Err(TransportError::Connect(_) | TransportError::Tls(_)) => Some(SendNote::NotSent),
        Err(TransportError::Timeout | TransportError::Io(_)) => None,
    }
}

/// What the driver does, in order.
#[derive(Clone, Debug, PartialEq)]
pub enum Action {
    /// Record and announce this state; `deadline_ms` (monotonic) is the retry or probe time the
    /// countdown is computed from.
    Publish {
        state: DeliveryState,
        deadline_ms: Option<u64>,
    },
    /// Sleep until `until_ms` (monotonic), or until the app asks for something; then a new turn.
    Wait { until_ms: Option<u64> },
    /// Clear the "flush_at reached" flag: a drain has started, or found the queue empty.
    FlushAtSeen,
    /// Drop what expired from the queue, lease the next batch of at most `room_bytes` of event
    /// JSON, deliver deferred notices; answer with [`Input::Batch`].
    NextBatch { room_bytes: u64 },
    /// Lease the next batch (no expiry pass) to go first as a probe; answer with [`Input::Batch`].
    ProbeBatch { room_bytes: u64 },
    /// Send [`Machine::in_flight`] with this `X-Eventspool-Attempt` and `sent_at`; its events
    /// already count this send, record [`SendNote::Sending`] for them in the queue first. Answer
    /// with [`Input::Answer`].
    Send { attempt: u32, wall_ms: i64 },
    /// Record a send's bookkeeping for these events in the queue (they stay queued).
    NoteSends { events: Events, note: SendNote },
    /// Delivered: delete them from the queue and count them.
    Ack(Events),
    /// Move them to the quarantine with this reason (a [`crate::quarantine::reason`]).
    Quarantine {
        events: Events,
        reason: &'static str,
        detail: String,
        status: Option<u16>,
        attempts: u32,
    },
    /// They expired before they could be sent (again): delete them as `expired` and name them.
    DropExpired(Events),
    /// Give them back to the queue, in place.
    Release(Events),
    /// Shutdown: the worker ends.
    Stop,
}

/// Where the machine stands; the published [`DeliveryState`] is derived from it.
#[derive(Clone, Debug)]
enum Mode {
    Idle,
    Draining,
    RetryWait {
        attempt: u32,
        deadline_ms: u64,
        failure: Failure,
    },
    /// The budget is spent; the slow probe goes out at `probe_at_ms` (monotonic).
    WaitingForUser {
        attempts: u32,
        failure: Failure,
        probe_at_ms: u64,
    },
    Paused {
        reason: PauseReason,
        failure: Failure,
    },
    Offline,
    Disabled,
}

/// A batch being delivered: its events, how many times this batch was sent (the quarantine
/// records it; `X-Eventspool-Attempt` is derived from the events' own send counts, which outlive
/// a batch), and the size of its last body before compression, for [`SizeLimit`].
#[derive(Debug)]
struct Batch {
    events: Events,
    attempts: u32,
    body_bytes: u64,
}

impl Batch {
    fn new(events: Events) -> Batch {
        Batch {
            events,
            attempts: 0,
            body_bytes: 0,
        }
    }
}

/// A lone event refused with 400/422 during a split, held until the split shows whether the
/// collector refuses it or every request (see [`crate::split`]).
#[derive(Debug)]
struct Refused {
    batch: Batch,
    status: u16,
    detail: String,
}

/// The question asked with [`Action::NextBatch`] / [`Action::ProbeBatch`], waiting for its
/// [`Input::Batch`].
#[derive(Debug)]
enum Asked {
    /// The drain needs its next batch.
    Drain,
    /// A lone event past `max_event_sends` got no answer; a probe batch goes first if there is
    /// one, the event waits behind it (see [`Machine::isolate_unanswered`]).
    Probe {
        lone: Batch,
        failure: Failure,
        retry_after_ms: Option<u64>,
        now_ms: u64,
    },
}

#[derive(Debug)]
pub struct Machine {
    policy: Policy,
    jitter: Jitter,
    mode: Mode,
    episode: Option<Episode>,
    /// The batch in flight first; after a 400/413 split, its halves in order.
    work: VecDeque<Batch>,
    /// While `work` holds the pieces of a split: what the split has shown so far.
    split: Option<Split<Refused>>,
    /// The body size a proxy or the collector accepts, learned from 413s (life of the spool).
    size_limit: SizeLimit,
    next_periodic_ms: u64,
    /// After `dismiss()`: the user said "back", so `flush_at` does not restart sending; the next
    /// periodic flush or an explicit trigger does.
    suppress_flush_at: bool,
    /// The next failure answers a manual `retry_now()` from `WaitingForUser`.
    manual_attempt: bool,
    /// The request in flight is `WaitingForUser`'s automatic probe; holds the attempt count
    /// the state keeps if it fails.
    probing: Option<u32>,
    /// Probes that failed since the budget was spent: the next one waits longer.
    probes_failed: u32,
    last_send_ms: Option<u64>,
    /// A pause outlives going offline and back: only `resume()` or new credentials end it, so a
    /// reconnect does not spend a request on an endpoint already known to refuse.
    pause: Option<(PauseReason, Failure)>,
    /// HTTP answers (any status) received so far: an isolation compares it with its mark.
    answers: u64,
    /// While events past `max_event_sends` are being isolated: `answers` when it began (or when
    /// a probe was last scheduled). An answer since then shows the collector is alive, so an
    /// event that alone still gets none is the cause.
    isolation: Option<u64>,
    /// The last request got no answer at all (timeout, connection dropped): effect unknown.
    last_send_unanswered: bool,
    /// The app's last word on connectivity: where the machine rests when nothing is sent.
    online: bool,
    asked: Option<Asked>,
    out: Vec<Action>,
}

impl Machine {
    /// A machine at `now_ms`, starting where the app's settings put it before the worker ran
    /// (`control` is a peek: its edges are still to be fed).
    pub fn new(policy: Policy, jitter: Jitter, now_ms: u64, control: &Control) -> Machine {
        let mode = if !control.enabled {
            Mode::Disabled
        } else if !control.online {
            Mode::Offline
        } else {
            Mode::Idle
        };
        Machine {
            size_limit: SizeLimit::new(policy.max_batch_bytes),
            next_periodic_ms: now_ms + policy.flush_interval_ms,
            policy,
            jitter,
            mode,
            episode: None,
            work: VecDeque::new(),
            split: None,
            suppress_flush_at: false,
            manual_attempt: false,
            probing: None,
            probes_failed: 0,
            last_send_ms: None,
            pause: None,
            answers: 0,
            isolation: None,
            last_send_unanswered: false,
            online: control.online,
            asked: None,
            out: Vec::new(),
        }
    }

    /// Takes one input; returns what to do, in order.
    pub fn feed(&mut self, input: Input) -> Vec<Action> {
        match input {
            Input::Control { verbs, now_ms } => self.control(&verbs, now_ms),
            Input::Tick {
                now_ms,
                wall_ms,
                pending,
                flush_at,
            } => self.tick(now_ms, wall_ms, pending, flush_at),
            Input::Batch { events, wall_ms } => self.batch(events, wall_ms),
            Input::Answer {
                now_ms,
                note,
                outcome,
                body_bytes,
            } => self.answer(now_ms, note, outcome, body_bytes),
        }
        std::mem::take(&mut self.out)
    }

    /// The batch [`Action::Send`] sends.
    pub fn in_flight(&self) -> &[(QueuedEvent, bool)] {
        self.work.front().map_or(&[], |b| &b.events)
    }

    fn publish(&mut self, state: DeliveryState, deadline_ms: Option<u64>) {
        self.out.push(Action::Publish { state, deadline_ms });
    }

    fn rest(&mut self, state: DeliveryState, until_ms: Option<u64>) {
        self.publish(state, None);
        self.out.push(Action::Wait { until_ms });
    }

    fn tick(&mut self, now: u64, wall_ms: i64, pending: u64, flush_at_reached: bool) {
        match self.mode.clone() {
            Mode::Disabled => self.rest(DeliveryState::Disabled, None),
            Mode::Offline => self.rest(DeliveryState::Offline, None),
            Mode::Paused { reason, failure } => self.rest(
                DeliveryState::Paused {
                    reason,
                    last_error: failure,
                },
                None,
            ),
            Mode::WaitingForUser {
                attempts,
                failure,
                probe_at_ms,
            } => {
                if now >= probe_at_ms {
                    // One request behind the state the UI shows; see `transient`.
                    self.probing = Some(attempts);
                    self.mode = Mode::Draining;
                    return;
                }
                let state = DeliveryState::WaitingForUser {
                    attempts,
                    last_error: failure,
                    next_probe_at_ms: 0,
                    probe_in_ms: 0,
                };
                self.publish(state, Some(probe_at_ms));
                self.out.push(Action::Wait {
                    until_ms: Some(probe_at_ms),
                });
            }
            Mode::Idle => {
                let flush_at = !self.suppress_flush_at && flush_at_reached;
                if pending > 0 && (flush_at || now >= self.next_periodic_ms) {
                    self.start_drain(now);
                    return;
                }
                if now >= self.next_periodic_ms {
                    self.next_periodic_ms = now + self.policy.flush_interval_ms;
                }
                let deadline = (pending > 0).then_some(self.next_periodic_ms);
                self.rest(DeliveryState::Idle, deadline);
            }
            Mode::RetryWait {
                attempt,
                deadline_ms,
                failure,
            } => {
                if now >= deadline_ms {
                    self.mode = Mode::Draining;
                    return;
                }
                let state = DeliveryState::RetryScheduled {
                    attempt,
                    max_attempts: self.policy.max_auto_attempts,
                    next_retry_at_ms: 0,
                    retry_in_ms: 0,
                    last_error: failure,
                };
                self.publish(state, Some(deadline_ms));
                // Wake on each whole second of the countdown, so observers see it tick.
                let left = deadline_ms - now;
                let tick = now
                    + if left.is_multiple_of(1000) {
                        1000
                    } else {
                        left % 1000
                    };
                self.out.push(Action::Wait {
                    until_ms: Some(tick.min(deadline_ms)),
                });
            }
            Mode::Draining => self.drain_step(now, wall_ms),
        }
    }

    fn start_drain(&mut self, now: u64) {
        self.mode = Mode::Draining;
        self.suppress_flush_at = false;
        self.out.push(Action::FlushAtSeen);
        self.next_periodic_ms = now + self.policy.flush_interval_ms;
    }

    /// Turns the app's requests into mode changes (the arrows of docs/delivery.md §States).
    fn control(&mut self, c: &Control, now: u64) {
        if c.shutdown {
            self.release_work();
            self.out.push(Action::Stop);
            return;
        }
        self.online = c.online;
        if let Some((reason, _)) = &self.pause
            && (c.resume || (c.api_key_changed && *reason == PauseReason::Auth))
        {
            self.pause = None;
            if matches!(self.mode, Mode::Paused { .. }) {
                self.start_drain(now);
            }
        }
        if c.enabled_changed {
            self.release_work();
            self.fresh_episode();
            self.mode = if c.enabled {
                self.resting_mode()
            } else {
                Mode::Disabled
            };
        }
        if matches!(self.mode, Mode::Disabled) {
            return;
        }
        if c.online_changed {
            self.release_work();
            // A reconnect starts a fresh failure episode: the old budget was spent on a dead link.
            self.fresh_episode();
            if c.online && self.pause.is_none() {
                self.start_drain(now);
            } else {
                self.mode = self.resting_mode();
            }
        }
        if !c.online {
            self.mode = Mode::Offline;
            return;
        }
        if c.foreground_changed
            && c.foreground
            && matches!(
                self.mode,
                Mode::RetryWait { .. } | Mode::WaitingForUser { .. }
            )
        {
            // Back in the foreground: the user is looking and the outage may be long over, so
            // the budget starts again now, as after a reconnect.
            self.fresh_episode();
            self.mode = Mode::Draining;
        }
        match &self.mode {
            Mode::RetryWait { .. } | Mode::WaitingForUser { .. } if c.dismiss => {
                self.release_work();
                self.fresh_episode();
                self.suppress_flush_at = true;
                self.next_periodic_ms = now + self.policy.flush_interval_ms;
                self.mode = Mode::Idle;
            }
            Mode::RetryWait { .. } if c.retry_now => self.mode = Mode::Draining,
            Mode::WaitingForUser { .. } if c.retry_now => {
                self.manual_attempt = true;
                self.mode = Mode::Draining;
            }
            Mode::Idle if c.retry_now || c.flush => self.start_drain(now),
            _ => {}
        }
    }
}

impl Machine {
    /// Forgets the failure episode: the next failure starts a new one with the whole budget.
    fn fresh_episode(&mut self) {
        self.episode = None;
        self.manual_attempt = false;
        self.probing = None;
        self.probes_failed = 0;
    }

    /// Where the machine rests when nothing is being sent: offline, paused, or idle.
    fn resting_mode(&self) -> Mode {
        if !self.online {
            Mode::Offline
        } else if let Some((reason, failure)) = &self.pause {
            Mode::Paused {
                reason: *reason,
                failure: failure.clone(),
            }
        } else {
            Mode::Idle
        }
    }

    /// The event JSON a new batch may carry: the learned size limit within `max_batch_bytes`,
    /// less the envelope.
    fn room_bytes(&self) -> u64 {
        self.size_limit
            .bytes()
            .min(self.policy.max_batch_bytes)
            .saturating_sub(BATCH_OVERHEAD_BYTES)
    }

    fn drain_step(&mut self, now: u64, wall_ms: i64) {
        if let Some(last) = self.last_send_ms {
            let ready_at = last + self.policy.min_batch_interval_ms;
            if now < ready_at && self.policy.min_batch_interval_ms > 0 {
                if self.probing.is_none() {
                    self.publish(DeliveryState::Sending, None);
                }
                self.out.push(Action::Wait {
                    until_ms: Some(ready_at),
                });
                return;
            }
        }
        if self.work.is_empty() {
            self.isolation = None;
            self.asked = Some(Asked::Drain);
            self.out.push(Action::NextBatch {
                room_bytes: self.room_bytes(),
            });
            return;
        }
        self.send_front(wall_ms);
    }

    fn batch(&mut self, events: Option<Events>, wall_ms: i64) {
        match (self.asked.take(), events) {
            (Some(Asked::Drain), Some(events)) => {
                self.work.push_back(Batch::new(events));
                self.send_front(wall_ms);
            }
            (Some(Asked::Drain), None) => {
                self.mode = Mode::Idle;
                self.out.push(Action::FlushAtSeen);
            }
            (
                Some(Asked::Probe {
                    lone,
                    failure,
                    now_ms,
                    ..
                }),
                Some(probe),
            ) => {
                self.work.push_back(Batch::new(probe));
                self.work.push_back(lone);
                self.transient(failure, None, now_ms);
            }
            (
                Some(Asked::Probe {
                    lone,
                    failure,
                    retry_after_ms,
                    now_ms,
                }),
                None,
            ) => {
                self.work.push_front(lone);
                self.transient(failure, retry_after_ms, now_ms);
            }
            // Nothing was asked: whatever came is not ours to send.
            (None, Some(events)) => self.out.push(Action::Release(events)),
            (None, None) => {}
        }
    }

    /// Sends the front batch, once the age limit has taken out what expired while it waited.
    fn send_front(&mut self, wall_ms: i64) {
        if !self.drop_expired_from_front(wall_ms) {
            return;
        }
        if self.probing.is_none() {
            // A probe runs behind `WaitingForUser`: the UI keeps showing that state.
            self.publish(DeliveryState::Sending, None);
        }
        let Some(batch) = self.work.front_mut() else {
            return;
        };
        batch.attempts += 1;
        // Sends of any of its events before this one, plus one: a collector tells a resend from a
        // first send whatever happened in between (reconnect, dismiss, restart, a split).
        let attempt = batch.events.iter().map(|(e, _)| e.sends).max().unwrap_or(0) + 1;
        // Counted before the request goes out, so a crash while it is in flight counts too.
        for (event, _) in &mut batch.events {
            SendNote::Sending.apply(event);
        }
        self.out.push(Action::Send { attempt, wall_ms });
    }

    /// The age limit holds before every send, retries included: events of the front batch that
    /// expired while it waited (retry, `WaitingForUser`) leave as `expired`, never sent. Returns
    /// whether anything is left to send.
    fn drop_expired_from_front(&mut self, wall_ms: i64) -> bool {
        let cutoff = wall_ms.saturating_sub(self.policy.max_event_age_ms as i64);
        let Some(batch) = self.work.front_mut() else {
            return false;
        };
        if batch.events.iter().all(|(e, _)| e.accepted_ms >= cutoff) {
            return true;
        }
        let (expired, keep): (Vec<_>, Vec<_>) = std::mem::take(&mut batch.events)
            .into_iter()
            .partition(|(e, _)| e.accepted_ms < cutoff);
        batch.events = keep;
        let left = !batch.events.is_empty();
        if !left {
            self.work.pop_front();
        }
        self.out.push(Action::DropExpired(expired));
        left
    }

    fn answer(&mut self, now: u64, note: Option<SendNote>, outcome: Outcome, body_bytes: u64) {
        let Some(batch) = self.work.front_mut() else {
            return;
        };
        batch.body_bytes = body_bytes;
        self.last_send_ms = Some(now);
        self.last_send_unanswered = note.is_none();
        self.answers += u64::from(note == Some(SendNote::Answered));
        // Events that leave the queue now need no bookkeeping; the others keep what we learned.
        if let Some(note) = note
            && !matches!(outcome, Outcome::Delivered | Outcome::Partial { .. })
        {
            for (event, _) in &mut batch.events {
                note.apply(event);
            }
            let events = batch.events.clone();
            self.out.push(Action::NoteSends { events, note });
        }
        self.handle(outcome, now);
    }

    fn handle(&mut self, outcome: Outcome, now: u64) {
        let Some(batch) = self.work.pop_front() else {
            return;
        };
        if !matches!(outcome, Outcome::Transient { .. }) && self.probing.take().is_some() {
            // The collector answered the probe: whatever comes next is a new episode.
            self.fresh_episode();
        }
        if matches!(outcome, Outcome::Delivered | Outcome::Partial { .. }) {
            self.size_limit.accepted(batch.body_bytes);
        }
        if matches!(outcome, Outcome::Delivered | Outcome::Partial { .. })
            && let Some(split) = &mut self.split
        {
            for held in split.accepted() {
                self.quarantine_batch(held.batch, reason::BAD_REQUEST, held.detail, held.status);
            }
        }
        match outcome {
            Outcome::Delivered => self.delivered(batch.events),
            Outcome::Partial { rejected } => {
                let status = Some(200);
                let mut good = Vec::new();
                for (event, from_store) in batch.events {
                    let id = event.id.to_string();
                    let Some(rejection) = rejected.iter().find(|r| r.event_id == id) else {
                        good.push((event, from_store));
                        continue;
                    };
                    let why = rejection.reason.clone();
                    self.quarantine(
                        vec![(event, from_store)],
                        reason::REJECTED,
                        why,
                        status,
                        batch.attempts,
                    );
                }
                self.delivered(good);
            }
            Outcome::Poisoned {
                status,
                too_large,
                detail,
            } => {
                if batch.events.len() > 1 {
                    let n = batch.events.len();
                    self.split.get_or_insert_with(|| Split::new(n));
                    if too_large {
                        self.size_limit.refused(batch.body_bytes);
                    }
                    self.resend_in_halves(batch);
                } else if too_large {
                    self.size_limit.refused(batch.body_bytes);
                    self.quarantine_batch(batch, reason::TOO_LARGE, detail, status);
                } else {
                    self.lone_refusal(batch, status, detail);
                }
            }
            Outcome::CutShort { failure } => {
                if batch.events.len() > 1 {
                    self.resend_in_halves(batch);
                } else {
                    self.work.push_front(batch);
                    self.transient(failure, None, now);
                }
            }
            Outcome::Transient {
                failure,
                retry_after_ms,
            } => {
                if let Some(batch) = self.isolate_unanswered(batch, &failure, retry_after_ms, now) {
                    self.work.push_front(batch);
                    self.transient(failure, retry_after_ms, now);
                }
            }
            Outcome::Auth { failure } => self.pause(batch, PauseReason::Auth, failure),
            Outcome::Config { failure } => self.pause(batch, PauseReason::Config, failure),
        }
        // A probe batch asked for has the lone event waiting behind it: the split goes on.
        if self.work.is_empty()
            && self.asked.is_none()
            && let Some(split) = self.split.take()
        {
            for held in split.finish() {
                self.quarantine_batch(held.batch, reason::BAD_REQUEST, held.detail, held.status);
            }
        }
    }

    /// A lone event refused with 400/422: quarantined, unless the split it came from has had
    /// no request accepted, which may mean the collector (or a proxy) refuses the request.
    fn lone_refusal(&mut self, batch: Batch, status: u16, detail: String) {
        let refused = Refused {
            batch,
            status,
            detail,
        };
        let verdict = match &mut self.split {
            Some(split) => split.lone_refusal(refused),
            None => LoneRefusal::Quarantine(refused),
        };
        match verdict {
            LoneRefusal::Quarantine(r) => {
                self.quarantine_batch(r.batch, reason::BAD_REQUEST, r.detail, r.status)
            }
            LoneRefusal::Held => {}
            LoneRefusal::RequestRefused(all) => {
                let events = self.split.as_ref().map_or(0, Split::events);
                let failure = Failure {
                    status: Some(status),
                    message: format!(
                        "the request is refused, not its events: a batch of {events} split to \
                         single events, none accepted; nothing quarantined (collector: {})",
                        all.last().map_or(String::new(), |r| {
                            crate::classify::status_text(status, r.detail.as_bytes())
                        })
                    ),
                };
                for r in all.into_iter().rev() {
                    self.work.push_front(r.batch);
                }
                let front = self.work.pop_front();
                if let Some(front) = front {
                    self.pause(front, PauseReason::Config, failure);
                }
            }
        }
    }

    /// Puts the two halves of a batch at the front of the work, in order, each as a new batch:
    /// the one bisection step of a 400/413, a cut-short answer and `max_sends` isolation.
    fn resend_in_halves(&mut self, batch: Batch) {
        let mut left = batch.events;
        let right = left.split_off(left.len() / 2);
        self.work.push_front(Batch::new(right));
        self.work.push_front(Batch::new(left));
    }

    fn quarantine_batch(&mut self, batch: Batch, why: &'static str, detail: String, status: u16) {
        self.quarantine(batch.events, why, detail, Some(status), batch.attempts);
    }

    /// `max_event_sends` (docs/delivery.md §Retry): a request that got no answer, carrying an event
    /// that has now gone unanswered that many times, is bisected like a 400 (no backoff) until the
    /// event is alone. Alone and still unanswered, it is quarantined as `max_sends` when the
    /// collector answered some other request since the isolation began; otherwise the collector may
    /// just be down, so the next batch goes first as a probe (after the usual backoff) and the
    /// event waits behind it. Returns the batch when its failure is an ordinary transient one.
    fn isolate_unanswered(
        &mut self,
        batch: Batch,
        failure: &Failure,
        retry_after_ms: Option<u64>,
        now: u64,
    ) -> Option<Batch> {
        let limit = self.policy.max_event_sends;
        if !self.last_send_unanswered || !batch.events.iter().any(|(e, _)| e.unanswered >= limit) {
            return Some(batch);
        }
        if batch.events.len() > 1 {
            self.isolation.get_or_insert(self.answers);
            self.resend_in_halves(batch);
            return None;
        }
        if self.isolation.is_some_and(|mark| self.answers > mark) {
            let sends = batch.events.first().map_or(0, |(e, _)| e.unanswered);
            let detail = format!("no answer to {sends} requests carrying it; last: {failure}");
            self.quarantine(
                batch.events,
                reason::MAX_SENDS,
                detail,
                None,
                batch.attempts,
            );
            return None;
        }
        self.isolation = Some(self.answers);
        if self.work.is_empty() {
            // The rest follows in `batch` once the queue has answered.
            self.asked = Some(Asked::Probe {
                lone: batch,
                failure: failure.clone(),
                retry_after_ms,
                now_ms: now,
            });
            self.out.push(Action::ProbeBatch {
                room_bytes: self.room_bytes(),
            });
            return None;
        }
        self.work.insert(1, batch);
        self.transient(failure.clone(), None, now);
        None
    }

    fn delivered(&mut self, events: Events) {
        if events.is_empty() {
            return;
        }
        self.out.push(Action::Ack(events));
        self.fresh_episode();
    }

    fn quarantine(
        &mut self,
        events: Events,
        why: &'static str,
        detail: String,
        status: Option<u16>,
        attempts: u32,
    ) {
        self.out.push(Action::Quarantine {
            events,
            reason: why,
            detail,
            status,
            attempts,
        });
    }

    fn transient(&mut self, failure: Failure, retry_after_ms: Option<u64>, now: u64) {
        if let Some(attempts) = self.probing.take() {
            // A failed probe keeps the state; only the time of the next one moves, further out.
            self.probes_failed += 1;
            tracing::info!(error = %failure, probes = self.probes_failed, "delivery probe failed");
            self.mode = self.waiting_for_user(attempts, failure, now);
            return;
        }
        let p = &self.policy;
        let episode = self.episode.get_or_insert(Episode {
            started_ms: now,
            failures: 0,
        });
        episode.failures += 1;
        let next_attempt = episode.failures;
        let delay = next_delay_ms(
            next_attempt,
            p.backoff_base_ms,
            p.backoff_cap_ms,
            retry_after_ms,
            p.retry_after_cap_ms,
            self.jitter.unit(),
        );
        let manual = std::mem::take(&mut self.manual_attempt);
        tracing::info!(error = %failure, failures = episode.failures, "delivery attempt failed");
        let verdict = after_failure(
            episode,
            now,
            manual,
            p.max_auto_attempts,
            p.max_retry_elapsed_ms,
            delay,
        );
        self.mode = match verdict {
            AfterFailure::Retry { attempt, delay_ms } => {
                // Announced here, not only by the countdown turn: a zero delay must still show
                // "attempt k of n" to the user.
                let state = DeliveryState::RetryScheduled {
                    attempt,
                    max_attempts: self.policy.max_auto_attempts,
                    next_retry_at_ms: 0,
                    retry_in_ms: 0,
                    last_error: failure.clone(),
                };
                self.publish(state, Some(now + delay_ms));
                Mode::RetryWait {
                    attempt,
                    deadline_ms: now + delay_ms,
                    failure,
                }
            }
            AfterFailure::WaitForUser { attempts } => self.waiting_for_user(attempts, failure, now),
        };
    }

    /// `WaitingForUser`, with the next slow probe scheduled (docs/delivery.md §Slow probe).
    fn waiting_for_user(&mut self, attempts: u32, failure: Failure, now: u64) -> Mode {
        let delay = probe_delay_ms(
            self.probes_failed + 1,
            self.policy.probe_base_ms,
            self.policy.probe_cap_ms,
            self.jitter.unit(),
        );
        Mode::WaitingForUser {
            attempts,
            failure,
            probe_at_ms: now + delay,
        }
    }

    fn pause(&mut self, batch: Batch, reason: PauseReason, failure: Failure) {
        tracing::warn!(error = %failure, reason = reason.as_str(), "delivery paused");
        self.work.push_front(batch);
        self.release_work();
        self.pause = Some((reason, failure.clone()));
        self.mode = Mode::Paused { reason, failure };
    }

    /// Gives the events of unfinished batches (and of a split's held events) back to the queue,
    /// in place.
    fn release_work(&mut self) {
        let held = self.split.take().map(Split::abandon).unwrap_or_default();
        let asked = match self.asked.take() {
            Some(Asked::Probe { lone, .. }) => Some(lone),
            _ => None,
        };
        let events: Events = held
            .into_iter()
            .map(|r| r.batch)
            .chain(self.work.drain(..))
            .chain(asked)
            .flat_map(|b| b.events)
            .collect();
        if !events.is_empty() {
            self.out.push(Action::Release(events));
        }
    }
}

/// The transitions as tables: each row is (start, input, actions, next state), where the start
/// is a list of inputs fed to a fresh machine, and actions and state are written the way
/// docs/delivery.md and README's state table name them. Times are relative to the row's input:
/// `+1000` is a second after it. No runtime, no sockets, no threads: the inputs are the answers a
/// driver would give, the HTTP answers go through the real [`crate::classify::classify`].
#[cfg(test)]
mod tests {
    use super::*;
    use crate::classify::classify;
    use crate::event::EventId;
    use std::time::{Duration, SystemTime};

    const NOW0: u64 = 1_000_000;
    const WALL0: i64 = 1_800_000_000_000;
    /// What [`Rig`] says each event adds to a body, for the size limit a 413 teaches.
    const EVENT_BODY: u64 = 100;

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
        Shutdown,
        // The driver's turn: 3 events pending; `flush_at` reached; nothing pending; `ms` later.
        Tick,
        TickFlushAt,
        TickEmpty,
        TickAfter(u64),
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
    }

    use In::*;

    /// A machine, the app's control cell, and the clocks, as the worker holds them.
    struct Rig {
        m: Machine,
        app: Control,
        now: u64,
        next_seq: u64,
    }

    impl Rig {
        fn new(policy: Policy) -> Rig {
            let app = Control::default();
            Rig {
                m: Machine::new(policy, Jitter::Fixed(1.0), NOW0, &app),
                app,
                now: NOW0,
                next_seq: 1,
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
            app.shutdown = false;
            self.m.feed(Input::Control {
                verbs,
                now_ms: self.now,
            })
        }

        fn tick(&mut self, pending: u64, flush_at: bool) -> Vec<Action> {
            self.m.feed(Input::Tick {
                now_ms: self.now,
                wall_ms: self.wall(),
                pending,
                flush_at,
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
                Shutdown => self.verb(|c| c.shutdown = true),
                Tick => self.tick(3, false),
                TickFlushAt => self.tick(3, true),
                TickEmpty => self.tick(0, false),
                TickAfter(ms) => {
                    self.now += ms;
                    self.tick(3, false)
                }
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
                CutShort => {
                    let mut response = Rig::http(200, &[], "{\"rej");
                    response.truncated = true;
                    self.answer(Ok(response))
                }
                Timeout => self.answer(Err(TransportError::Timeout)),
                Refused => self.answer(Err(TransportError::Connect("refused".into()))),
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
                Action::Stop => "stop".into(),
            }
        }

        /// The machine's state as the state table names it.
        fn state(&self) -> String {
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
            let to = rig.state();
            let context = format!("row {i}: from {from} ({:?}), {:?}", r.start, r.input);
            assert_eq!(actions, r.actions, "actions of {context}");
            assert_eq!(to, r.to, "next state of {context}");
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

    /// docs/delivery.md §States and README's "Delivery states" table, arrow by arrow.
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
            row(idle(), Dismiss, &[], "idle"),
            row(idle(), Resume, &[], "idle"),
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
                "retry_scheduled 1 +1000",
            ),
            // RetryScheduled: the countdown ticks each second; timer / retry_now() ──▶ Sending.
            row(
                retry(1),
                Tick,
                &["publish retry_scheduled 1/3 +1000", "wait +1000"],
                "retry_scheduled 1 +1000",
            ),
            row(
                retry(2),
                TickAfter(500),
                &["publish retry_scheduled 2/3 +1500", "wait +500"],
                "retry_scheduled 2 +1500",
            ),
            row(retry(1), Fire, &[], "sending"),
            row(
                then(retry(1), &[Fire]),
                Tick,
                &["publish sending", "send 3 #2"],
                "sending",
            ),
            row(retry(1), RetryNow, &[], "sending"),
            row(retry(1), Flush, &[], "retry_scheduled 1 +1000"),
            // RetryScheduled ── set_foreground(true) (fresh episode) ──▶ Sending
            row(
                then(retry(2), &[Foreground(false)]),
                Foreground(true),
                &[],
                "sending",
            ),
            row(
                then(retry(2), &[Foreground(false), Foreground(true), Tick]),
                Status(503),
                &["note answered 3", "publish retry_scheduled 1/3 +1000"],
                "retry_scheduled 1 +1000",
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
                "waiting_for_user 3 +60000",
            ),
            // WaitingForUser: shows the probe time; retry_now() ──▶ Sending (one manual attempt).
            row(
                waiting(),
                Tick,
                &["publish waiting_for_user 3 +60000", "wait +60000"],
                "waiting_for_user 3 +60000",
            ),
            row(waiting(), RetryNow, &[], "sending"),
            row(
                then(waiting(), &[RetryNow, Tick]),
                Status(503),
                &["note answered 3"],
                "waiting_for_user 4 +60000",
            ),
            // WaitingForUser ── set_foreground(true), reconnect ──▶ Sending (fresh episode)
            row(
                then(waiting(), &[Foreground(false)]),
                Foreground(true),
                &[],
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
            row(paused_auth(), Flush, &[], "paused auth"),
            row(paused_config(), NewKey, &[], "paused config"),
            row(paused_config(), Resume, &["flush_at seen"], "sending"),
            // Offline: no attempts; set_online(true) ──▶ Sending, unless paused.
            row(idle(), Online(false), &[], "offline"),
            row(offline(), Tick, &["publish offline", "wait"], "offline"),
            row(offline(), Flush, &[], "offline"),
            row(offline(), Online(true), &["flush_at seen"], "sending"),
            row(sending(3), Online(false), &["release 3"], "offline"),
            row(
                then(paused_auth(), &[Online(false)]),
                Online(true),
                &[],
                "paused auth",
            ),
            // Disabled ── set_enabled(true) ──▶ Idle (Offline or Paused if that is where it was)
            row(idle(), Enabled(false), &[], "disabled"),
            row(sending(3), Enabled(false), &["release 3"], "disabled"),
            row(disabled(), Tick, &["publish disabled", "wait"], "disabled"),
            row(disabled(), Flush, &[], "disabled"),
            row(disabled(), Online(false), &[], "disabled"),
            row(disabled(), Enabled(true), &[], "idle"),
            row(
                then(offline(), &[Enabled(false)]),
                Enabled(true),
                &[],
                "offline",
            ),
            row(
                then(paused_auth(), &[Enabled(false)]),
                Enabled(true),
                &[],
                "paused auth",
            ),
            // Shutdown gives the batch in flight back.
            row(sending(3), Shutdown, &["release 3", "stop"], "sending"),
            row(
                retry(1),
                Shutdown,
                &["release 3", "stop"],
                "retry_scheduled 1 +1000",
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
                "retry_scheduled 2 +2000",
            ),
            row(
                retrying(2),
                Status(503),
                &["note answered 3", "publish retry_scheduled 3/3 +4000"],
                "retry_scheduled 3 +4000",
            ),
            row(retrying(3), Timeout, &[], "waiting_for_user 3 +60000"),
            // Every kind of transient answer spends the budget alike.
            row(
                sending(3),
                Status(500),
                &["note answered 3", "publish retry_scheduled 1/3 +1000"],
                "retry_scheduled 1 +1000",
            ),
            row(
                sending(3),
                Status(408),
                &["note answered 3", "publish retry_scheduled 1/3 +1000"],
                "retry_scheduled 1 +1000",
            ),
            row(
                sending(3),
                Timeout,
                &["publish retry_scheduled 1/3 +1000"],
                "retry_scheduled 1 +1000",
            ),
            row(
                sending(3),
                Refused,
                &["note not_sent 3", "publish retry_scheduled 1/3 +1000"],
                "retry_scheduled 1 +1000",
            ),
            // A delivery ends the episode: the next failure is retry 1 again.
            row(
                then(retrying(2), &[Status(200), Tick, Batch(2)]),
                Status(503),
                &["note answered 2", "publish retry_scheduled 1/3 +1000"],
                "retry_scheduled 1 +1000",
            ),
            // A reconnect and a dismiss() start a fresh episode too.
            row(
                then(retry(2), &[Online(false), Online(true), Tick, Batch(3)]),
                Status(503),
                &["note answered 3", "publish retry_scheduled 1/3 +1000"],
                "retry_scheduled 1 +1000",
            ),
            row(
                then(retry(2), &[Dismiss, Flush, Tick, Batch(3)]),
                Status(503),
                &["note answered 3", "publish retry_scheduled 1/3 +1000"],
                "retry_scheduled 1 +1000",
            ),
            // retry_now() from RetryScheduled is the scheduled retry, early: same episode.
            row(
                then(retry(1), &[RetryNow, Tick]),
                Status(503),
                &["note answered 3", "publish retry_scheduled 2/3 +2000"],
                "retry_scheduled 2 +2000",
            ),
            // Each manual attempt that fails adds one and schedules no automatic retry.
            row(
                then(waiting(), &[RetryNow, Tick, Status(503), RetryNow, Tick]),
                Status(503),
                &["note answered 3"],
                "waiting_for_user 5 +60000",
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
                "retry_scheduled 1 +1000",
            ),
            // At +1000 the next retry would start at +3000 > 2500: hand over after one retry.
            row(
                retrying(1),
                Status(503),
                &["note answered 3"],
                "waiting_for_user 1 +60000",
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
                "retry_scheduled 1 +7000",
            ),
            row(
                sending(3),
                RetryAfter(503, 1_000_000),
                &["note answered 3", "publish retry_scheduled 1/3 +60000"],
                "retry_scheduled 1 +60000",
            ),
            row(
                retrying(2),
                RetryAfter(503, 1),
                &["note answered 3", "publish retry_scheduled 3/3 +4000"],
                "retry_scheduled 3 +4000",
            ),
            row(
                sending(3),
                RetryAfter(503, 0),
                &["note answered 3", "publish retry_scheduled 1/3 +1000"],
                "retry_scheduled 1 +1000",
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
            // A lone event refused outside a split is quarantined at once.
            row(
                sending(1),
                Status(400),
                &["note answered 1", "quarantine bad_request 1"],
                "sending",
            ),
            row(
                sending(1),
                Status(413),
                &["note answered 1", "quarantine too_large 1"],
                "sending",
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
            // The split ends with a held event still held: the collector judged it; quarantine.
            row(
                then(split2(), &[Tick, Status(400), Tick]),
                Status(413),
                &[
                    "note answered 1",
                    "quarantine too_large 1",
                    "quarantine bad_request 1",
                ],
                "sending",
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
                &["next batch <=136"],
                "sending",
            ),
            // A 2xx cut short: halves for a batch, a transient failure for a lone event.
            row(sending(2), CutShort, &["note answered 2"], "sending"),
            row(
                sending(1),
                CutShort,
                &["note answered 1", "publish retry_scheduled 1/3 +1000"],
                "retry_scheduled 1 +1000",
            ),
            // A 2xx naming refused events: those to the quarantine, the rest delivered.
            row(
                sending(3),
                Rejected(1),
                &["quarantine rejected 1", "ack 2"],
                "sending",
            ),
        ];
        assert_eq!(drive(policy(), &rows), 17);
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
                "retry_scheduled 1 +1000",
            ),
            // Halved without backoff, the halves sent at once.
            row(twice(), Timeout, &[], "sending"),
            row(
                then(twice(), &[Timeout]),
                Tick,
                &["publish sending", "send 1 #3"],
                "sending",
            ),
            // Alone, unanswered, nothing answered since: its sibling goes first, after backoff.
            row(
                then(twice(), &[Timeout, Tick]),
                Timeout,
                &["publish retry_scheduled 2/3 +2000"],
                "retry_scheduled 2 +2000",
            ),
            // Alone with nothing behind: the next batch is asked for, to go first as a probe.
            row(lone(), Timeout, &["probe batch <=524224"], "sending"),
            row(
                then(lone(), &[Timeout]),
                Batch(3),
                &["publish retry_scheduled 2/3 +2000"],
                "retry_scheduled 2 +2000",
            ),
            row(
                then(lone(), &[Timeout, Batch(3), Fire]),
                Tick,
                &["publish sending", "send 3 #1"],
                "sending",
            ),
            row(
                then(lone(), &[Timeout]),
                Empty,
                &["publish retry_scheduled 2/3 +2000"],
                "retry_scheduled 2 +2000",
            ),
            // A collector that answers nothing quarantines nothing.
            row(
                then(lone(), &[Timeout, Empty, Fire, Tick]),
                Timeout,
                &["probe batch <=524224"],
                "sending",
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
                "retry_scheduled 2 +2000",
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
            row(waiting(), Fire, &[], "probing"),
            // No `Sending` is published for the probe: the UI keeps showing WaitingForUser.
            row(then(waiting(), &[Fire]), Tick, &["send 3 #5"], "probing"),
            row(
                probing(),
                Status(503),
                &["note answered 3"],
                "waiting_for_user 3 +120000",
            ),
            row(
                then(probing(), &[Status(503), Fire, Tick]),
                Timeout,
                &[],
                "waiting_for_user 3 +240000",
            ),
            row(
                then(probing(), &[Status(503)]),
                Tick,
                &["publish waiting_for_user 3 +120000", "wait +120000"],
                "waiting_for_user 3 +120000",
            ),
            row(probing(), Status(200), &["ack 3"], "sending"),
            // A success drains as a fresh episode.
            row(
                then(probing(), &[Status(200), Tick, Batch(2)]),
                Status(503),
                &["note answered 2", "publish retry_scheduled 1/3 +1000"],
                "retry_scheduled 1 +1000",
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
                "retry_scheduled 1 +1000",
            ),
        ];
        assert_eq!(drive(policy(), &rows), 9);
    }

    /// Foreground and background: only the background → foreground edge does anything, and only
    /// from RetryScheduled or WaitingForUser.
    #[test]
    fn foreground_and_background() {
        let rows = [
            row(idle(), Foreground(false), &[], "idle"),
            row(
                then(idle(), &[Foreground(false)]),
                Foreground(true),
                &[],
                "idle",
            ),
            row(retry(1), Foreground(false), &[], "retry_scheduled 1 +1000"),
            row(
                waiting(),
                Foreground(false),
                &[],
                "waiting_for_user 3 +60000",
            ),
            row(
                then(paused_auth(), &[Foreground(false)]),
                Foreground(true),
                &[],
                "paused auth",
            ),
            row(
                then(offline(), &[Foreground(false)]),
                Foreground(true),
                &[],
                "offline",
            ),
            row(
                then(sending(3), &[Foreground(false)]),
                Foreground(true),
                &[],
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
            row(then(retry(2), &[Online(false)]), RetryNow, &[], "offline"),
            row(probing(), Online(false), &["release 3"], "offline"),
            row(
                then(asked(), &[Empty, Online(false)]),
                TickFlushAt,
                &["publish offline", "wait"],
                "offline",
            ),
            row(paused_config(), Online(false), &[], "offline"),
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
                "sending",
            ),
            // Retry 2 fires at +3000: every event of the batch expired while it waited.
            row(
                then(retry(2), &[Fire]),
                Tick,
                &["drop expired 3"],
                "sending",
            ),
            row(
                then(retry(2), &[Fire, Tick]),
                Tick,
                &["next batch <=524224"],
                "sending",
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
            row(then(waiting(), &[Fire]), Tick, &["send 3 #5"], "probing"),
        ];
        assert_eq!(drive(spaced, &rows), 3);
    }
}
