//! The protocol between the machine and its driver ([`crate::worker`]): what the machine is told
//! ([`Input`]), what the driver is to do ([`Action`]), the events a batch carries ([`Events`]), and
//! what a transport's result says about a send ([`send_note`], [`timed_out`]). Separate because
//! the driver and the table tests speak this vocabulary and nothing else of the machine; the doc
//! of [`crate::machine`] says how the two take turns.

use crate::classify::Outcome;
use crate::control::Control;
use crate::event::{QueuedEvent, SendNote};
use crate::state::{DeliveryState, DrainOutcome};
use crate::transport::{HttpResponse, TransportError};

/// Events of a batch, each with whether it was read from the store (the queue gives it back or
/// deletes it where it lives).
pub type Events = Vec<(QueuedEvent, bool)>;

/// What the machine is told.
#[derive(Clone, Debug)]
pub enum Input {
    /// The app's verbs and edges since the driver last looked
    /// ([`crate::shared::Shared::take_control`]), at `now_ms`.
    Control { verbs: Control, now_ms: u64 },
    /// The driver's turn (also after a timer fired): the monotonic and wall clocks, the events
    /// pending, whether `flush_at` was reached since the last drain started, whether a
    /// critical event was tracked since the last batch was assembled, and whether a denial's
    /// deletion is still owed (it failed: [`Action::DiscardForConsent`] is tried again).
    Tick {
        now_ms: u64,
        wall_ms: i64,
        pending: u64,
        flush_at: bool,
        critical: bool,
        discard_owed: bool,
    },
    /// The answer to [`Action::NextBatch`] / [`Action::ProbeBatch`]: the batch the queue leased,
    /// in delivery order, or `None` when it is empty. `wall_ms` is read after it was taken.
    Batch {
        events: Option<Events>,
        wall_ms: i64,
    },
    /// The fleet loop (src/fleet), before each [`Input::Tick`]: whether a client report waits
    /// with nothing else to send (it goes with the next periodic flush, never sooner), and a
    /// collector's `pause_until` as a delay from `now_ms` (no request before it; capped by
    /// `retry_after_cap_ms`, as `Retry-After` is).
    Fleet {
        now_ms: u64,
        report_due: bool,
        pause_ms: Option<u64>,
    },
    /// The answer to [`Action::Send`] when the driver did not start it: between taking the batch
    /// and sending it, the app withdrew its consent or opted out (README §Consent). Nothing left;
    /// the batch goes back, and the control that follows says where the machine rests.
    Withheld { now_ms: u64 },
    /// The answer to [`Action::Send`]: `note` is what the transport's result says about the
    /// send ([`SendNote::Answered`] for any HTTP answer, [`SendNote::NotSent`] for a refused
    /// connection, `None` when the effect is unknown), `outcome` its classification,
    /// `body_bytes` the body's size before compression, `timed_out` whether it ended in a
    /// timeout ([`timed_out`]).
    Answer {
        now_ms: u64,
        note: Option<SendNote>,
        outcome: Outcome,
        body_bytes: u64,
        timed_out: bool,
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

/// Whether the attempt ended in a timeout (no byte moved for `attempt_timeout_ms`, or the
/// attempt's ceiling): on a slow link that says the batch was too large for it, and teaches a
/// smaller one ([`SizeLimit::for_stalls`]).
///
/// [`SizeLimit::for_stalls`]: crate::split::SizeLimit::for_stalls
pub fn timed_out(result: &Result<HttpResponse, TransportError>) -> bool {
    matches!(result, Err(TransportError::Timeout))
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
    ///
    /// [`Machine::in_flight`]: super::Machine::in_flight
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
    /// A 2xx listed this many `rejected` ids that name no event of its batch: count them.
    UnmatchedRejections(u64),
    /// Give them back to the queue, in place.
    Release(Events),
    /// The bounded drain `id` ended this way: hand it to its caller.
    DrainDone { id: u64, outcome: DrainOutcome },
    /// Consent was denied: delete every queued event and dead letter (README §Consent), after
    /// any [`Action::Release`] before it. Also while a failed deletion is owed, every
    /// [`DISCARD_RETRY_MS`].
    ///
    /// [`DISCARD_RETRY_MS`]: super::DISCARD_RETRY_MS
    DiscardForConsent,
    /// Shutdown: the worker ends.
    Stop,
}
