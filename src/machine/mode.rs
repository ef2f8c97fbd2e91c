//! What the machine keeps between inputs besides its counters: where it stands ([`Mode`]), a batch
//! in hand ([`Batch`]), a lone refusal a split holds ([`Refused`]), and the question waiting for
//! the queue's answer ([`Asked`]). Private to the machine; separate so that the transitions, in
//! the sibling modules, share one definition of them.

use super::Events;
use crate::classify::Failure;
use crate::split::MIN_LEARNED_BYTES;
use crate::state::{DeferReason, PauseReason};

/// Where the machine stands; the published [`DeliveryState`] is derived from it.
///
/// [`DeliveryState`]: crate::state::DeliveryState
#[derive(Clone, Debug)]
pub(super) enum Mode {
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
    /// Delivery waits for a condition, not a failure: consent `pending`, or the device's
    /// conditions by the policy (see [`Policy::defer_reason`]).
    ///
    /// [`Policy::defer_reason`]: super::Policy::defer_reason
    Deferred {
        reason: DeferReason,
    },
}

/// A batch being delivered: its events, how many times this batch was sent (the quarantine
/// records it; `X-Eventspool-Attempt` is derived from the events' own send counts, which outlive
/// a batch), and the size of its last body before compression, for [`SizeLimit`].
///
/// [`SizeLimit`]: crate::split::SizeLimit
#[derive(Debug)]
pub(super) struct Batch {
    pub(super) events: Events,
    pub(super) attempts: u32,
    pub(super) body_bytes: u64,
    /// Sent again because its 413 was found stale (see `Machine::judge_alone`): a second 413
    /// is its own.
    pub(super) resent_after_413: bool,
}

impl Batch {
    pub(super) fn new(events: Events) -> Batch {
        Batch {
            events,
            attempts: 0,
            body_bytes: 0,
            resent_after_413: false,
        }
    }
}

/// A lone event refused with 400/422/413 during a split, held until the split shows whether the
/// collector refuses it or every request (see [`crate::split`]).
#[derive(Debug)]
pub(super) struct Refused {
    pub(super) batch: Batch,
    pub(super) status: u16,
    /// The quarantine reason it gets if the collector turns out to take other requests.
    pub(super) reason: &'static str,
    pub(super) detail: String,
}

impl Refused {
    /// Its body is under [`MIN_LEARNED_BYTES`]: no proxy limits bodies to that, so a 413 for
    /// it says every body is refused, not that it is too large.
    pub(super) fn below_any_size_limit(&self) -> bool {
        self.batch.body_bytes < MIN_LEARNED_BYTES
    }
}

/// The question asked with [`Action::NextBatch`] / [`Action::ProbeBatch`], waiting for its
/// [`Input::Batch`].
///
/// [`Action::NextBatch`]: super::Action::NextBatch
/// [`Action::ProbeBatch`]: super::Action::ProbeBatch
/// [`Input::Batch`]: super::Input::Batch
#[derive(Debug)]
pub(super) enum Asked {
    /// The drain needs its next batch.
    Drain,
    /// A lone event past `max_event_sends` got no answer; a probe batch goes first if there is
    /// one, the event waits behind it (see [`Machine::isolate_unanswered`]).
    ///
    /// [`Machine::isolate_unanswered`]: super::Machine::isolate_unanswered
    Probe {
        lone: Batch,
        failure: Failure,
        retry_after_ms: Option<u64>,
        now_ms: u64,
    },
}
