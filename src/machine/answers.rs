//! The transport's answer ([`Input::Answer`](super::Input::Answer)) classified into what happens
//! next: delivered, partly rejected, refused (split in halves, a lone event quarantined or the
//! whole request found refused, the size a 413 teaches), cut short, transient (the isolation of
//! events that go unanswered, the size a timeout teaches) or paused. Separate as the largest part
//! of the transitions, the one the split and the quarantine live in; the retry a transient failure
//! schedules is [`super::schedule`]'s.

use super::{Action, Asked, Batch, Events, Machine, Mode, Refused};
use crate::classify::{Failure, Outcome};
use crate::event::SendNote;
use crate::quarantine::reason;
use crate::split::{LoneRefusal, Split};
use crate::state::PauseReason;

impl Machine {
    pub(super) fn answer(
        &mut self,
        now: u64,
        note: Option<SendNote>,
        outcome: Outcome,
        body_bytes: u64,
    ) {
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
        if batch.events.is_empty() && matches!(outcome, Outcome::Poisoned { .. }) {
            // A lone report refused: nothing to split or quarantine; it waits for the next
            // request (src/fleet).
            return;
        }
        if !matches!(outcome, Outcome::Transient { .. }) && self.probing.take().is_some() {
            // The collector answered the probe: whatever comes next is a new episode.
            self.fresh_episode();
        }
        if matches!(outcome, Outcome::Delivered | Outcome::Partial { .. }) {
            self.size_limit.accepted(batch.body_bytes);
            self.stall_limit.accepted(batch.body_bytes);
        }
        match &outcome {
            Outcome::Transient {
                retry_after_ms: Some(asked),
                ..
            } => {
                self.not_before_ms = Some(now + (*asked).min(self.policy.retry_after_cap_ms));
            }
            // The server answered without asking for time: whatever it asked before is over.
            Outcome::Transient { .. } | Outcome::CutShort { .. } => {}
            _ => self.not_before_ms = None,
        }
        if matches!(outcome, Outcome::Delivered | Outcome::Partial { .. })
            && let Some(split) = &mut self.split
        {
            for held in split.accepted() {
                self.judge_alone(held, batch.body_bytes);
            }
        }
        match outcome {
            Outcome::Delivered => self.delivered(batch.events),
            Outcome::Partial { rejected } => {
                let status = Some(200);
                // Compared as UUIDs: a collector's other spelling of an id must not make its
                // event look delivered.
                let unmatched = rejected
                    .iter()
                    .filter(|r| !batch.events.iter().any(|(e, _)| r.id == Some(e.id.0)))
                    .count() as u64;
                if unmatched > 0 {
                    self.out.push(Action::UnmatchedRejections(unmatched));
                }
                let mut good = Vec::new();
                for (event, from_store) in batch.events {
                    let Some(rejection) = rejected.iter().find(|r| r.id == Some(event.id.0)) else {
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
                } else {
                    // A batch of one that was never split (`max_batch_events = 1`, or the one
                    // event pending when it was taken) is judged as the lone piece of a split
                    // whose sibling is the next batch (`lone_refusal` starts it): the verdict
                    // must not hang on how the queue happened to be cut.
                    let why = if too_large {
                        self.size_limit.refused(batch.body_bytes);
                        reason::TOO_LARGE
                    } else {
                        reason::BAD_REQUEST
                    };
                    self.lone_refusal(batch, status, why, detail);
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
                if self.last_send_timed_out {
                    self.stall_limit.timed_out(batch.body_bytes);
                }
                if let Some(batch) = self.isolate_unanswered(batch, &failure, retry_after_ms, now) {
                    if self.last_send_timed_out
                        && batch.events.len() > 1
                        && batch.body_bytes > self.stall_limit.bytes()
                    {
                        // Too large for the link: the retry goes in halves, as the next
                        // batches will.
                        self.resend_in_halves(batch);
                    } else {
                        self.work.push_front(batch);
                    }
                    self.transient(failure, retry_after_ms, now);
                }
            }
            Outcome::Auth { failure } => self.pause(batch, PauseReason::Auth, failure),
            Outcome::Config { failure } => self.pause(batch, PauseReason::Config, failure),
        }
        // Every piece is answered. A split still holding a suspect goes on: the next batch the
        // drain asks for is its sibling ([`Machine::no_sibling`] if there is none). A probe
        // batch asked for has the lone event waiting behind it: the split goes on too.
        if self.work.is_empty()
            && self.asked.is_none()
            && self.split.as_ref().is_some_and(|split| !split.holds())
        {
            self.split = None;
        }
    }

    /// A lone refused event that the collector took other requests beside: its refusal is its
    /// own, and it is quarantined. Except a stale 413, sent again once, first in the work (it is
    /// older than the pieces still to go): a 413 for a body no proxy limits to
    /// ([`Refused::below_any_size_limit`]), or no larger than one just accepted
    /// (`accepted_bytes`, 0 when none is at hand), was not about its size (a proxy in front
    /// was fixed, or its limit raised, between the requests).
    fn judge_alone(&mut self, refused: Refused, accepted_bytes: u64) {
        let stale = refused.reason == reason::TOO_LARGE
            && (refused.below_any_size_limit() || refused.batch.body_bytes <= accepted_bytes)
            && !refused.batch.resent_after_413;
        if stale {
            let mut again = refused.batch;
            again.resent_after_413 = true;
            self.work.push_front(again);
        } else {
            self.quarantine_batch(
                refused.batch,
                refused.reason,
                refused.detail,
                refused.status,
            );
        }
    }

    /// The drain found nothing more to send while a split held a lone refused event: there is
    /// no sibling to tell a refused request from a refused event, so the held events are
    /// judged alone, as the collector answered them. Except a 413 for a body no proxy limits
    /// to ([`Refused::below_any_size_limit`]): every body is refused, and delivery pauses with
    /// the events kept (decision 0071) rather than send each event of a trickle to the
    /// quarantine in turn. Returns whether it paused.
    pub(super) fn no_sibling(&mut self) -> bool {
        let Some(split) = self.split.take() else {
            return false;
        };
        let held = split.finish();
        let every_body_refused = held
            .iter()
            .any(|r| r.reason == reason::TOO_LARGE && r.below_any_size_limit());
        if every_body_refused {
            let what = "every body is refused as too large, even a single event of under 1 KiB";
            self.request_refused(held, what);
            return true;
        }
        for r in held {
            self.quarantine_batch(r.batch, r.reason, r.detail, r.status);
        }
        false
    }

    /// A lone event refused with 400/422 (`why` is `bad_request`) or 413 (`too_large`):
    /// quarantined, unless the split it came from (one of its own, for a batch of one) has had
    /// no request accepted, which may mean the collector (or a proxy) refuses the request, or
    /// every body, whatever its events.
    fn lone_refusal(&mut self, batch: Batch, status: u16, why: &'static str, detail: String) {
        let refused = Refused {
            batch,
            status,
            reason: why,
            detail,
        };
        let verdict = self
            .split
            .get_or_insert_with(|| Split::new(1))
            .lone_refusal(refused);
        match verdict {
            LoneRefusal::Quarantine(r) => self.judge_alone(r, 0),
            LoneRefusal::Held => {}
            LoneRefusal::RequestRefused(all) => {
                let events = self.split.take().map_or(0, |split| split.events());
                let what = if why == reason::TOO_LARGE {
                    "every body is refused as too large, down to a single event"
                } else {
                    "the request is refused, not its events"
                };
                let what = format!("{what}: {events} events sent, single events included");
                self.request_refused(all, &what);
            }
        }
    }

    /// The collector (or a proxy before it) refuses requests whatever their events: pause as
    /// `Paused{config}`, the refused events given back to the queue first, nothing quarantined.
    fn request_refused(&mut self, refused: Vec<Refused>, what: &str) {
        let Some(last) = refused.last() else {
            return;
        };
        let failure = Failure {
            status: Some(last.status),
            message: format!(
                "{what}, none accepted; nothing quarantined (collector: {})",
                crate::classify::status_text(last.status, last.detail.as_bytes())
            ),
        };
        for r in refused.into_iter().rev() {
            self.work.push_front(r.batch);
        }
        if let Some(front) = self.work.pop_front() {
            self.pause(front, PauseReason::Config, failure);
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
            if self.probing.is_some() {
                // One probe is one request: the halves wait for the next slot.
                self.transient(failure.clone(), retry_after_ms, now);
            }
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
            if self.probing.is_some() {
                // The probe got no answer: the next request waits for the next slot.
                self.transient(failure.clone(), retry_after_ms, now);
            }
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

    fn pause(&mut self, batch: Batch, reason: PauseReason, failure: Failure) {
        tracing::warn!(error = %failure, reason = reason.as_str(), "delivery paused");
        self.work.push_front(batch);
        self.release_work();
        self.pause = Some((reason, failure.clone()));
        self.mode = Mode::Paused { reason, failure };
    }
}
