//! When the next request goes after a transient failure: the retry of the failure episode
//! (backoff, `Retry-After` and the budget, by [`crate::retry`]) or, once the budget is spent,
//! `WaitingForUser` with its next slow probe; and forgetting the episode. Separate so that the one
//! place where a failure becomes a deadline reads on its own.

use super::{Machine, Mode};
use crate::classify::Failure;
use crate::retry::{AfterFailure, Episode, after_failure, next_delay_ms, probe_delay_ms};
use crate::state::DeliveryState;

impl Machine {
    /// Forgets the failure episode: the next failure starts a new one with the whole budget.
    pub(super) fn fresh_episode(&mut self) {
        self.episode = None;
        self.manual_attempt = false;
        self.probing = None;
        self.probes_failed = 0;
    }

    pub(super) fn transient(&mut self, failure: Failure, retry_after_ms: Option<u64>, now: u64) {
        if let Some(attempts) = self.probing.take() {
            // A failed probe keeps the state; only the time of the next one moves, further out.
            self.probes_failed += 1;
            tracing::info!(error = %failure, probes = self.probes_failed, "delivery probe failed");
            self.mode = self.waiting_for_user(attempts, failure, now);
            return;
        }
        let p = &self.policy;
        let episode = Episode::record_failure(&mut self.episode, now);
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
        // Never before a server's `Retry-After`: the probe is an automatic request too.
        let probe_at_ms = (now + delay).max(self.not_before_ms.unwrap_or(0));
        Mode::WaitingForUser {
            attempts,
            failure,
            probe_at_ms,
        }
    }
}
