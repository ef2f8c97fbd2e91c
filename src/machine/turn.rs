//! The driver's turn ([`Input::Tick`](super::Input::Tick)): in each mode, rest, count down to the
//! retry or the probe, or drain; and the drain itself: the throttle between batches, the question
//! for the next batch and its answer ([`Input::Batch`](super::Input::Batch)), the age limit before
//! every send, and the send. Separate from the answers: this is what goes out, [`super::answers`]
//! is what comes back of it.

use super::{Action, Asked, Batch, Events, Machine, Mode};
use crate::config::BATCH_OVERHEAD_BYTES;
use crate::event::SendNote;
use crate::state::DeliveryState;

impl Machine {
    pub(super) fn tick(&mut self, now: u64, wall_ms: i64, pending: u64, flush_at_reached: bool) {
        match self.mode.clone() {
            Mode::Disabled if self.discard_owed => {
                let retry = self.discard_retry_ms;
                self.rest(DeliveryState::Disabled, Some(retry))
            }
            Mode::Disabled => self.rest(DeliveryState::Disabled, None),
            Mode::Offline => self.rest(DeliveryState::Offline, None),
            Mode::Deferred { reason } => self.rest(DeliveryState::Deferred { reason }, None),
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
            Mode::Draining if self.hold(now).is_some() => self.rest_held(now, pending),
            Mode::Idle => {
                let flush_at = !self.suppress_flush_at && flush_at_reached;
                let periodic = now >= self.next_periodic_ms;
                // An open drain is an explicit trigger (after a dismiss() too), and so is a
                // critical event waiting.
                let drain_open = !self.drains.is_empty();
                let events_due =
                    pending > 0 && (flush_at || periodic || drain_open || self.critical);
                let report_alone = !events_due && self.report_due && periodic;
                if drain_open || events_due || report_alone {
                    if self.hold(now).is_some() {
                        // Not started: `flush_at` stays unseen, so the drain starts once the
                        // hold ends.
                        self.rest_held(now, pending);
                        return;
                    }
                    // With no event to carry it, the report goes alone (see `batch`).
                    self.report_only = report_alone;
                    self.start_drain(now);
                    return;
                }
                if periodic {
                    self.next_periodic_ms = now + self.policy.flush_interval_ms;
                }
                let deadline = (pending > 0 || self.report_due).then_some(self.next_periodic_ms);
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

    pub(super) fn start_drain(&mut self, now: u64) {
        self.mode = Mode::Draining;
        self.suppress_flush_at = false;
        self.out.push(Action::FlushAtSeen);
        self.next_periodic_ms = now + self.policy.flush_interval_ms;
    }

    /// The event JSON a new batch may carry: the size limits learned from 413s and from
    /// timeouts within `max_batch_bytes`, less the envelope.
    pub(super) fn room_bytes(&self) -> u64 {
        self.size_limit
            .bytes()
            .min(self.stall_limit.bytes())
            .min(self.policy.max_batch_bytes)
            .saturating_sub(BATCH_OVERHEAD_BYTES)
    }

    fn drain_step(&mut self, now: u64, wall_ms: i64) {
        if let Some(last) = self.last_send_ms {
            let ready_at = last + self.policy.min_batch_interval_ms;
            // A critical event skips the throttle: the next batch (it goes first in it) is asked
            // for now.
            let critical_next = self.critical && self.work.is_empty();
            if now < ready_at && self.policy.min_batch_interval_ms > 0 && !critical_next {
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

    pub(super) fn batch(&mut self, events: Option<Events>, wall_ms: i64) {
        match (self.asked.take(), events) {
            (Some(Asked::Drain), Some(events)) => {
                self.report_only = false;
                if let Some(split) = &mut self.split {
                    // The sibling of a held lone event: its answer is the split's evidence.
                    split.joined(events.len());
                }
                self.work.push_back(Batch::new(events));
                self.send_front(wall_ms);
            }
            (Some(Asked::Drain), None) if std::mem::take(&mut self.report_only) => {
                self.work.push_back(Batch::new(Vec::new()));
                self.send_front(wall_ms);
            }
            (Some(Asked::Drain), None) => {
                // A lone refused event held for a sibling is judged now; if that pauses, the
                // drain ends paused, not idle.
                if !self.no_sibling() {
                    self.mode = Mode::Idle;
                    self.drained = true;
                    self.out.push(Action::FlushAtSeen);
                }
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
}
