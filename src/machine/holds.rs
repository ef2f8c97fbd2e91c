//! What holds sending back besides the mode: a collector's `pause_until` and a server's
//! `Retry-After` that outlives its episode (docs/delivery.md §Retry), a send the app withdrew
//! its word from between the batch and the request, and a denial's deletion that is owed
//! (README §Consent).

use super::{Action, Machine, Mode};
use crate::event::SendNote;
use crate::machine::DISCARD_RETRY_MS;
use crate::state::{DeferReason, DeliveryState};

impl Machine {
    /// The end of what holds every request back now, if anything does: a collector's
    /// `pause_until`, and a server's `Retry-After` unless the user just said `retry_now()`.
    pub(super) fn hold(&self, now: u64) -> Option<u64> {
        let retry_after = self.not_before_ms.filter(|_| !self.manual_now);
        [self.hold_until_ms, retry_after]
            .into_iter()
            .flatten()
            .filter(|until| *until > now)
            .max()
    }

    /// Rests while [`Machine::hold`] holds: `Deferred{collector}` with the time it ends while
    /// something waits to be sent (a batch already split keeps its place in the work and goes
    /// after), idle when nothing does. Open drains are then drained.
    pub(super) fn rest_held(&mut self, now: u64, pending: u64) {
        let Some(until) = self.hold(now) else {
            return;
        };
        if pending == 0 && self.work.is_empty() {
            if matches!(self.mode, Mode::Draining) {
                self.mode = Mode::Idle;
            }
            self.drained = !self.drains.is_empty();
            self.rest(DeliveryState::Idle, None);
            return;
        }
        self.publish(
            DeliveryState::Deferred {
                reason: DeferReason::Collector,
            },
            Some(until),
        );
        self.out.push(Action::Wait {
            until_ms: Some(until),
        });
    }

    /// A denial's deletion is owed: tried now if its time came, and the machine wakes for the
    /// next try.
    pub(super) fn retry_discard(&mut self, now: u64) {
        if now >= self.discard_retry_ms {
            self.out.push(Action::DiscardForConsent);
            self.discard_retry_ms = now + DISCARD_RETRY_MS;
        }
    }

    /// The send asked for was not started (see [`Input::Withheld`]): what its events counted for
    /// it is taken back, and everything in hand goes back to the queue.
    pub(super) fn withheld(&mut self) {
        if let Some(batch) = self.work.front_mut() {
            batch.attempts = batch.attempts.saturating_sub(1);
            for (event, _) in &mut batch.events {
                SendNote::NotSent.apply(event);
            }
            let events = batch.events.clone();
            if !events.is_empty() {
                self.out.push(Action::NoteSends {
                    events,
                    note: SendNote::NotSent,
                });
            }
        }
        self.probing = None;
        self.release_work();
        self.mode = Mode::Idle;
    }
}
