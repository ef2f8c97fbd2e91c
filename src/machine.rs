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
//!
//! Bounded drains (`deliver_within`) are requests in [`Input::Control`]; the machine answers
//! each with [`Action::DrainDone`] once its outcome is known (docs/delivery.md §Bounded drain),
//! always before the turn's [`Action::Wait`], and no wait outlasts an open drain's deadline.
//!
//! This file holds the machine and its entry point ([`Machine::feed`]); the rest lives beside it:
//! the protocol's types in `io`, the settings in `policy`, what the machine keeps between inputs
//! in `mode`, the driver's turn and the drain in `turn`, the app's verbs in `control`, the
//! transport's answers in `answers`, the retry and the probe after a failure in `schedule`, and
//! what holds sending back besides the mode in `holds`.

use std::collections::VecDeque;

use crate::classify::Failure;
use crate::consent::Consent;
use crate::control::{Control, DrainRequest};
use crate::event::QueuedEvent;
use crate::retry::Episode;
use crate::split::{SizeLimit, Split};
use crate::state::{DeferReason, DeliveryState, DrainOutcome, PauseReason};

pub use io::{Action, Events, Input, send_note, timed_out};
use mode::{Asked, Batch, Mode, Refused};
pub use policy::{Jitter, Policy};

/// How often a denial's deletion that failed (a store error, a reader holding the WAL) is tried
/// again while consent stays denied.
pub const DISCARD_RETRY_MS: u64 = 5_000;

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
    /// The body size the link carries within `attempt_timeout_ms`, learned from timeouts; for
    /// the link it was learned on: a reconnect or a change of the device's conditions (another
    /// network, perhaps) starts afresh.
    stall_limit: SizeLimit,
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
    /// The last request ended in a timeout.
    last_send_timed_out: bool,
    /// The app's last word on connectivity: where the machine rests when nothing is sent.
    online: bool,
    /// What the device's conditions, by the policy, say now: `Some` holds delivery back.
    deferred: Option<DeferReason>,
    /// Bounded drains waiting for their outcome.
    drains: Vec<DrainRequest>,
    /// The queue was found empty in this input: the open drains are drained.
    drained: bool,
    /// The monotonic time of the last input that carried one.
    now_ms: u64,
    /// Tracking consent: `Pending` defers every send, `Denied` disables.
    consent: Consent,
    /// A critical event waits (the last [`Input::Tick`] said so): a drain starts at once and
    /// the throttle before a new batch is skipped.
    critical: bool,
    asked: Option<Asked>,
    /// A client report waits with no event to carry it (see [`Input::Fleet`]).
    report_due: bool,
    /// This drain was started for a waiting report alone: when the queue has nothing, an
    /// empty batch carries it.
    report_only: bool,
    /// No request before this (monotonic), from a collector's `pause_until`.
    hold_until_ms: Option<u64>,
    /// A denial's deletion failed and is owed (the last [`Input::Tick`] said so), and when it
    /// is tried next.
    discard_owed: bool,
    discard_retry_ms: u64,
    /// No automatic request before this (monotonic): a server's `Retry-After`, capped at
    /// `retry_after_cap_ms`. It outlives the episode it came in (a reconnect or the foreground
    /// does not make the server ready sooner); only `retry_now()`, the user's own word, goes
    /// before it, and any answer that is not transient ends it.
    not_before_ms: Option<u64>,
    /// `retry_now()` came with the last [`Input::Control`]: the drain it starts may go before a
    /// server's `Retry-After`.
    manual_now: bool,
    out: Vec<Action>,
}

impl Machine {
    /// A machine at `now_ms`, starting where the app's settings put it before the worker ran
    /// (`control` is a peek: its edges are still to be fed).
    pub fn new(policy: Policy, jitter: Jitter, now_ms: u64, control: &Control) -> Machine {
        let deferred = policy.defer_reason(&control.conditions);
        let mode = if !control.enabled || control.consent == Consent::Denied {
            Mode::Disabled
        } else if control.consent == Consent::Pending {
            Mode::Deferred {
                reason: DeferReason::Consent,
            }
        } else if !control.online {
            Mode::Offline
        } else if let Some(reason) = deferred {
            Mode::Deferred { reason }
        } else {
            Mode::Idle
        };
        Machine {
            size_limit: SizeLimit::new(policy.max_batch_bytes),
            stall_limit: SizeLimit::for_stalls(policy.max_batch_bytes),
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
            last_send_timed_out: false,
            online: control.online,
            deferred,
            drains: Vec::new(),
            drained: false,
            now_ms,
            consent: control.consent,
            critical: false,
            asked: None,
            report_due: false,
            report_only: false,
            hold_until_ms: None,
            not_before_ms: None,
            discard_owed: false,
            discard_retry_ms: 0,
            manual_now: false,
            out: Vec::new(),
        }
    }

    /// Takes one input; returns what to do, in order.
    pub fn feed(&mut self, input: Input) -> Vec<Action> {
        match &input {
            Input::Control { now_ms, .. }
            | Input::Tick { now_ms, .. }
            | Input::Answer { now_ms, .. }
            | Input::Withheld { now_ms }
            | Input::Fleet { now_ms, .. } => self.now_ms = self.now_ms.max(*now_ms),
            Input::Batch { .. } => {}
        }
        match input {
            Input::Control { verbs, now_ms } => self.control(&verbs, now_ms),
            Input::Tick {
                now_ms,
                wall_ms,
                pending,
                flush_at,
                critical,
                discard_owed,
            } => {
                self.critical = critical;
                self.discard_owed = discard_owed && self.consent == Consent::Denied;
                if self.discard_owed {
                    self.retry_discard(now_ms);
                }
                self.tick(now_ms, wall_ms, pending, flush_at)
            }
            Input::Fleet {
                now_ms,
                report_due,
                pause_ms,
            } => {
                self.report_due = report_due;
                if let Some(ms) = pause_ms {
                    self.hold_until_ms = Some(now_ms + ms.min(self.policy.retry_after_cap_ms));
                }
            }
            Input::Withheld { .. } => self.withheld(),
            Input::Batch { events, wall_ms } => self.batch(events, wall_ms),
            Input::Answer {
                now_ms,
                note,
                outcome,
                body_bytes,
                timed_out,
            } => {
                self.last_send_timed_out = timed_out;
                self.answer(now_ms, note, outcome, body_bytes)
            }
        }
        self.settle_drains();
        std::mem::take(&mut self.out)
    }

    /// Answers the bounded drains whose outcome this input decided, before the turn's wait, and
    /// keeps any wait within the deadline of those still open (docs/delivery.md §Bounded drain).
    fn settle_drains(&mut self) {
        if self.drains.is_empty() {
            self.drained = false;
            return;
        }
        let now = self.now_ms;
        let blocked = match &self.mode {
            Mode::Disabled => Some(DeliveryState::Disabled),
            Mode::Offline => Some(DeliveryState::Offline),
            Mode::Paused { reason, failure } => Some(DeliveryState::Paused {
                reason: *reason,
                last_error: failure.clone(),
            }),
            Mode::Deferred { reason } => Some(DeliveryState::Deferred { reason: *reason }),
            _ => None,
        };
        // The next automatic attempt, when the machine waits for one.
        let next_attempt = match &self.mode {
            Mode::RetryWait { deadline_ms, .. } => Some(*deadline_ms),
            Mode::WaitingForUser { probe_at_ms, .. } => Some(*probe_at_ms),
            Mode::Idle | Mode::Draining => self.hold(now),
            _ => None,
        };
        let drained = std::mem::take(&mut self.drained);
        let mut done = Vec::new();
        self.drains.retain(|d| {
            let outcome = if drained {
                DrainOutcome::Drained
            } else if let Some(state) = &blocked {
                DrainOutcome::Blocked {
                    state: state.clone(),
                }
            } else if let Some(at) = next_attempt.filter(|at| *at > d.deadline_ms) {
                // Nothing happens before the budget ends: no reason to hold the caller.
                DrainOutcome::RetryAfter {
                    ms: at.saturating_sub(now),
                }
            } else if now >= d.deadline_ms {
                DrainOutcome::DeadlineReached
            } else {
                return true;
            };
            done.push(Action::DrainDone { id: d.id, outcome });
            false
        });
        let first_deadline = self.drains.iter().map(|d| d.deadline_ms).min();
        // Before the wait or the question that ends the turn, so the caller is not held by it.
        let mut at = self.out.len();
        for (i, action) in self.out.iter_mut().enumerate() {
            match action {
                Action::Wait { until_ms } => {
                    at = at.min(i);
                    if let Some(deadline) = first_deadline {
                        *until_ms = Some(until_ms.map_or(deadline, |t| t.min(deadline)));
                    }
                }
                Action::NextBatch { .. } | Action::ProbeBatch { .. } | Action::Send { .. } => {
                    at = at.min(i)
                }
                _ => {}
            }
        }
        self.out.splice(at..at, done);
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
}

impl Machine {
    /// The batch size timeouts taught on this link, if they taught one (shown in `Stats`).
    pub fn slow_link_batch_bytes(&self) -> Option<u64> {
        self.stall_limit.learned()
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

mod answers;
mod control;
mod holds;
mod io;
mod mode;
mod policy;
mod schedule;
#[cfg(test)]
mod tests;
mod turn;
