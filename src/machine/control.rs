//! The app's verbs and edges ([`Input::Control`](super::Input::Control)) as mode changes (the
//! arrows of docs/delivery.md §States): shutdown, connectivity, consent and enabling, resume and
//! new credentials, the device's conditions, the foreground, dismiss, retry_now and flush; and
//! where the machine rests when nothing is sent. Separate because these transitions start from what
//! the app says, not from what the collector answered.

use super::{Action, DISCARD_RETRY_MS, Machine, Mode};
use crate::consent::Consent;
use crate::control::Control;
use crate::split::SizeLimit;
use crate::state::{DeferReason, PauseReason};

impl Machine {
    /// Turns the app's requests into mode changes (the arrows of docs/delivery.md §States).
    pub(super) fn control(&mut self, c: &Control, now: u64) {
        if c.shutdown {
            self.release_work();
            self.out.push(Action::Stop);
            return;
        }
        self.online = c.online;
        self.manual_now = c.retry_now;
        for d in &c.drains {
            if !self.drains.iter().any(|open| open.id == d.id) {
                self.drains.push(*d);
            }
        }
        let was_deferred = self.deferred;
        self.deferred = self.policy.defer_reason(&c.conditions);
        if let Some((reason, _)) = &self.pause
            && (c.resume || (c.api_key_changed && *reason == PauseReason::Auth))
        {
            if *reason == PauseReason::Config {
                // The operator changed something (the endpoint, the proxy): what 413s taught
                // about sizes may no longer hold, and a proxy that still refuses every body
                // pauses again after a few requests (see `lone_refusal`).
                self.size_limit = SizeLimit::new(self.policy.max_batch_bytes);
            }
            self.pause = None;
            if matches!(self.mode, Mode::Paused { .. }) {
                self.resume_sending(now);
            }
        }
        if c.enabled_changed || c.consent_changed {
            self.release_work();
            self.fresh_episode();
            if c.consent_changed && c.consent == Consent::Denied {
                // After the release: what came back from the batch in flight goes too.
                self.out.push(Action::DiscardForConsent);
                self.discard_retry_ms = now + DISCARD_RETRY_MS;
            }
            let granted_now = c.consent_changed
                && c.consent == Consent::Granted
                && self.consent != Consent::Granted;
            self.consent = c.consent;
            self.mode = if !c.enabled || c.consent == Consent::Denied {
                Mode::Disabled
            } else if c.consent == Consent::Pending {
                Mode::Deferred {
                    reason: DeferReason::Consent,
                }
            } else if granted_now && c.online && self.pause.is_none() && self.deferred.is_none() {
                // The backlog kept while consent was pending goes out now, not at the next
                // periodic flush.
                self.start_drain(now);
                Mode::Draining
            } else {
                self.resting_mode()
            };
        }
        if matches!(
            self.mode,
            Mode::Disabled
                | Mode::Deferred {
                    reason: DeferReason::Consent
                }
        ) {
            return;
        }
        if c.online_changed {
            self.release_work();
            // A reconnect starts a fresh failure episode: the old budget was spent on a dead link.
            self.fresh_episode();
            self.new_link();
            if c.online && self.pause.is_none() {
                self.resume_sending(now);
            } else {
                self.mode = self.resting_mode();
            }
        }
        if !c.online {
            self.mode = Mode::Offline;
            return;
        }
        match (was_deferred, self.deferred) {
            (None, Some(_)) => {
                // As going offline: what was in hand goes back, and the episode ends, so no
                // budget is spent while the conditions forbid sending.
                self.release_work();
                self.fresh_episode();
                self.mode = self.resting_mode();
            }
            (Some(_), None) => {
                // As a reconnect: a fresh episode, and what is pending goes now.
                self.fresh_episode();
                self.new_link();
                if matches!(self.mode, Mode::Deferred { .. }) {
                    self.start_drain(now);
                }
            }
            (Some(_), Some(reason)) if matches!(self.mode, Mode::Deferred { .. }) => {
                self.mode = Mode::Deferred { reason };
            }
            _ => {}
        }
        if self.deferred.is_some() {
            // Deferred (or paused behind it): no verb sends until the conditions allow it.
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
            Mode::Idle if c.retry_now || c.flush || !c.drains.is_empty() => self.start_drain(now),
            _ => {}
        }
    }

    /// Leaves a pause or goes back online: sends, unless the conditions defer delivery.
    fn resume_sending(&mut self, now: u64) {
        if self.consent != Consent::Granted {
            self.mode = self.resting_mode();
            return;
        }
        match self.deferred {
            Some(reason) => self.mode = Mode::Deferred { reason },
            None => self.start_drain(now),
        }
    }

    /// The link may be another one (a reconnect, the device's conditions changed): what
    /// timeouts taught about its speed no longer holds.
    fn new_link(&mut self) {
        self.stall_limit = SizeLimit::for_stalls(self.policy.max_batch_bytes);
    }

    /// Where the machine rests when nothing is being sent: disabled (consent denied), deferred
    /// for consent, offline, paused, deferred by the device's conditions, or idle, in that
    /// precedence (docs/delivery.md §States).
    fn resting_mode(&self) -> Mode {
        if self.consent == Consent::Denied {
            Mode::Disabled
        } else if self.consent == Consent::Pending {
            // Consent pending wins over offline: the user is asked first, whatever the network.
            Mode::Deferred {
                reason: DeferReason::Consent,
            }
        } else if !self.online {
            Mode::Offline
        } else if let Some((reason, failure)) = &self.pause {
            Mode::Paused {
                reason: *reason,
                failure: failure.clone(),
            }
        } else if let Some(reason) = self.deferred {
            Mode::Deferred { reason }
        } else {
            Mode::Idle
        }
    }
}
