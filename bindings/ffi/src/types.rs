//! The records and enums apps see through UniFFI, and their conversions from the core types.
//! Plain data only: every field is something a Kotlin, Swift or Python UI can render directly.

use std::collections::HashMap;

use eventspool::DeferReason as CoreDeferReason;
use eventspool::PauseReason as CorePauseReason;
use eventspool::Stats;
use eventspool::classify::Failure;

/// Why the last attempt failed: the HTTP status when there was one, and a short text that
/// never holds the API key or an event payload.
/// One key of `SpoolConfig.encryption_keys`: its id (recorded with every row it seals; from 1)
/// and its 32 bytes. The first key of the list seals new rows, the others only open old ones.
/// `Debug` never shows the bytes.
#[derive(Clone, PartialEq, Eq, uniffi::Record)]
pub struct EncryptionKey {
    pub key_id: u32,
    pub key: Vec<u8>,
}

impl std::fmt::Debug for EncryptionKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "EncryptionKey {{ key_id: {}, key: <redacted> }}",
            self.key_id
        )
    }
}

#[derive(Clone, Debug, PartialEq, Eq, uniffi::Record)]
pub struct AttemptFailure {
    pub status: Option<u16>,
    pub message: String,
}

impl From<&Failure> for AttemptFailure {
    fn from(f: &Failure) -> Self {
        AttemptFailure {
            status: f.status,
            message: f.message.clone(),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, uniffi::Enum)]
pub enum PauseReason {
    /// 401/403: the credentials were refused; `set_api_key` or `resume` continues.
    Auth,
    /// Another 4xx or a 3xx: the endpoint is wrong; `resume` continues.
    Config,
}

/// Why delivery waits although it could send: consent pending, the device's conditions
/// (`set_conditions` and the `deliver_on_*` config), or the collector's word.
#[derive(Clone, Copy, Debug, PartialEq, Eq, uniffi::Enum)]
pub enum DeferReason {
    /// The network is metered and `deliver_on_metered` is false.
    Metered,
    /// The device saves power and `deliver_on_low_power` is false.
    LowPower,
    /// The battery is low and `deliver_on_battery_low` is false.
    BatteryLow,
    /// Tracking consent is pending: events are kept, nothing is sent until `set_consent(Granted)`.
    Consent,
    /// The collector asked for no request before a time (a `pause_until` directive, or a
    /// server's `Retry-After`); delivery resumes by itself, `deliver_within` says when.
    Collector,
}

impl From<CoreDeferReason> for DeferReason {
    fn from(r: CoreDeferReason) -> Self {
        match r {
            CoreDeferReason::Metered => DeferReason::Metered,
            CoreDeferReason::LowPower => DeferReason::LowPower,
            CoreDeferReason::BatteryLow => DeferReason::BatteryLow,
            CoreDeferReason::Consent => DeferReason::Consent,
            CoreDeferReason::Collector => DeferReason::Collector,
        }
    }
}

/// Tracking consent (README §Consent).
#[derive(Clone, Copy, Debug, PartialEq, Eq, uniffi::Enum)]
pub enum Consent {
    /// Record and store events, send nothing (the app asks the user first).
    Pending,
    /// Send the backlog and everything after.
    Granted,
    /// Delete what was kept (counted `consent_denied`) and refuse new events.
    Denied,
}

impl From<Consent> for eventspool::Consent {
    fn from(c: Consent) -> Self {
        match c {
            Consent::Pending => eventspool::Consent::Pending,
            Consent::Granted => eventspool::Consent::Granted,
            Consent::Denied => eventspool::Consent::Denied,
        }
    }
}

/// What the platform knows about the device (Android: a metered network, power-save mode, a
/// low battery); `set_conditions` hands it over whenever it changes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, uniffi::Record)]
pub struct DeliveryConditions {
    #[uniffi(default = false)]
    pub metered: bool,
    #[uniffi(default = false)]
    pub low_power: bool,
    #[uniffi(default = false)]
    pub battery_low: bool,
}

impl From<DeliveryConditions> for eventspool::DeliveryConditions {
    fn from(c: DeliveryConditions) -> Self {
        eventspool::DeliveryConditions {
            metered: c.metered,
            low_power: c.low_power,
            battery_low: c.battery_low,
        }
    }
}

impl From<eventspool::Consent> for Consent {
    fn from(c: eventspool::Consent) -> Self {
        match c {
            eventspool::Consent::Pending => Consent::Pending,
            eventspool::Consent::Granted => Consent::Granted,
            eventspool::Consent::Denied => Consent::Denied,
        }
    }
}

/// How `deliver_within` ended: what a background job does next.
#[derive(Clone, Debug, PartialEq, Eq, uniffi::Enum)]
pub enum DrainOutcome {
    /// Nothing is pending: finish the job.
    Drained,
    /// The budget passed with events pending: reschedule soon.
    DeadlineReached,
    /// The next attempt is `ms` from now, after the budget: reschedule then.
    RetryAfter { ms: u64 },
    /// Offline, paused, disabled or deferred: reschedule on that change (network back,
    /// conditions allowing, new key), not on a timer. `status` is the state at that moment.
    Blocked { status: DeliveryStatus },
}

impl DrainOutcome {
    /// `pending` is the spool's count when the outcome came, for `Blocked`'s status line.
    pub(crate) fn from_core(o: eventspool::DrainOutcome, pending: u64) -> Self {
        match o {
            eventspool::DrainOutcome::Drained => DrainOutcome::Drained,
            eventspool::DrainOutcome::DeadlineReached => DrainOutcome::DeadlineReached,
            eventspool::DrainOutcome::RetryAfter { ms } => DrainOutcome::RetryAfter { ms },
            eventspool::DrainOutcome::Blocked { state } => DrainOutcome::Blocked {
                status: (&eventspool::DeliveryStatus::new(state, pending)).into(),
            },
        }
    }
}

/// The lane an event travels in (docs/critical-lane.md).
#[derive(Clone, Copy, Debug, PartialEq, Eq, uniffi::Enum)]
pub enum Priority {
    Normal,
    /// Durable before `track_event` returns, sent before the normal backlog, evicted last.
    Critical,
}

impl From<Priority> for eventspool::Priority {
    fn from(p: Priority) -> Self {
        match p {
            Priority::Normal => eventspool::Priority::Normal,
            Priority::Critical => eventspool::Priority::Critical,
        }
    }
}

/// docs/delivery.md §States, as a UI renders it.
#[derive(Clone, Debug, PartialEq, Eq, uniffi::Enum)]
pub enum DeliveryState {
    Idle,
    Sending,
    /// "attempt {attempt} of {max_attempts} — next try in {retry_in_ms / 1000} s".
    RetryScheduled {
        attempt: u32,
        max_attempts: u32,
        /// Wall-clock estimate (Unix ms) of the next try, for display.
        next_retry_at_ms: i64,
        /// Milliseconds left when this value was made.
        retry_in_ms: u64,
        last_error: AttemptFailure,
    },
    /// The automatic budget is spent: show "Retry now" (`retry_now`) and "Back" (`dismiss`).
    /// A slow automatic probe keeps running behind it; it resumes delivery by itself once the
    /// collector answers.
    WaitingForUser {
        attempts: u32,
        last_error: AttemptFailure,
        /// Wall-clock estimate (Unix ms) of the next automatic probe, for display.
        next_probe_at_ms: i64,
        /// Milliseconds until that probe when this value was made.
        probe_in_ms: u64,
    },
    Offline,
    Paused {
        reason: PauseReason,
        last_error: AttemptFailure,
    },
    Disabled,
    /// Events are kept and not sent until the condition clears: consent pending, or the
    /// device's conditions forbid delivery by the config's policy (it resumes by itself when
    /// `set_conditions` says they allow it).
    Deferred {
        reason: DeferReason,
    },
}

/// The state plus how many events are not delivered yet.
#[derive(Clone, Debug, PartialEq, Eq, uniffi::Record)]
pub struct DeliveryStatus {
    pub state: DeliveryState,
    pub pending: u64,
    /// The seed UI's sentence, for logs or a quick status line.
    pub summary: String,
}

impl From<&eventspool::DeliveryStatus> for DeliveryStatus {
    fn from(s: &eventspool::DeliveryStatus) -> Self {
        use eventspool::DeliveryState as S;
        let state = match &s.state {
            S::Idle => DeliveryState::Idle,
            S::Sending => DeliveryState::Sending,
            S::RetryScheduled {
                attempt,
                max_attempts,
                next_retry_at_ms,
                retry_in_ms,
                last_error,
            } => DeliveryState::RetryScheduled {
                attempt: *attempt,
                max_attempts: *max_attempts,
                next_retry_at_ms: *next_retry_at_ms,
                retry_in_ms: *retry_in_ms,
                last_error: last_error.into(),
            },
            S::WaitingForUser {
                attempts,
                last_error,
                next_probe_at_ms,
                probe_in_ms,
            } => DeliveryState::WaitingForUser {
                attempts: *attempts,
                last_error: last_error.into(),
                next_probe_at_ms: *next_probe_at_ms,
                probe_in_ms: *probe_in_ms,
            },
            S::Offline => DeliveryState::Offline,
            S::Paused { reason, last_error } => DeliveryState::Paused {
                reason: match reason {
                    CorePauseReason::Auth => PauseReason::Auth,
                    CorePauseReason::Config => PauseReason::Config,
                },
                last_error: last_error.into(),
            },
            S::Disabled => DeliveryState::Disabled,
            S::Deferred { reason } => DeliveryState::Deferred {
                reason: (*reason).into(),
            },
        };
        DeliveryStatus {
            state,
            pending: s.pending,
            summary: s.to_string(),
        }
    }
}

/// Things beside the state machine an app may log or surface.
#[derive(Clone, Debug, PartialEq, Eq, uniffi::Enum)]
pub enum SpoolNotice {
    /// The store file was unusable, moved aside to `moved_to`, and a fresh one made.
    StoreRecovered { moved_to: String, reason: String },
    /// The store cannot take events now (disk full, read-only); they stay in memory.
    StoreUnavailable { reason: String },
    /// A background task panicked and was restarted; delivery goes on.
    InternalProblem { message: String },
    /// These events were dropped (counted under `reason` in the stats), e.g. `expired`.
    EventsDropped {
        reason: String,
        event_ids: Vec<String>,
    },
}

impl From<&eventspool::Notice> for SpoolNotice {
    fn from(n: &eventspool::Notice) -> Self {
        match n {
            eventspool::Notice::StoreRecovered { moved_to, reason } => {
                SpoolNotice::StoreRecovered {
                    moved_to: moved_to.clone(),
                    reason: reason.clone(),
                }
            }
            eventspool::Notice::StoreUnavailable { reason } => SpoolNotice::StoreUnavailable {
                reason: reason.clone(),
            },
            eventspool::Notice::InternalError { message } => SpoolNotice::InternalProblem {
                message: message.clone(),
            },
            eventspool::Notice::EventsDropped { reason, event_ids } => SpoolNotice::EventsDropped {
                reason: reason.clone(),
                event_ids: event_ids.clone(),
            },
            // A notice this surface does not have a variant for yet is still told, as text.
            other => SpoolNotice::InternalProblem {
                message: format!("{other:?}"),
            },
        }
    }
}

/// Where every event went. The ledger `tracked + restored + redriven = delivered + quarantined +
/// dropped (queue reasons) + pending` holds; `callback_errors` counts exceptions thrown by the
/// app's observers, which are contained and never stop delivery.
#[derive(Clone, Debug, PartialEq, uniffi::Record)]
pub struct SpoolStats {
    pub tracked: u64,
    pub restored: u64,
    pub redriven: u64,
    pub delivered: u64,
    pub quarantined: u64,
    /// By reason: `memory_overflow`, `disk_cap`, `expired`, `purged`, `quarantine_cap`, `quarantine_expired`.
    pub dropped: HashMap<String, u64>,
    pub pending: u64,
    pub pending_memory: u64,
    pub pending_disk: u64,
    /// Events in quarantine now, by reason (`rejected`, `bad_request`, `too_large`).
    pub quarantine: HashMap<String, u64>,
    pub store_bytes: u64,
    pub requests: u64,
    pub batches_delivered: u64,
    pub store_errors: u64,
    pub stores_recovered: u64,
    pub panics: u64,
    pub callback_errors: u64,
    /// Collector directives taken, and directive fields ignored (docs/protocol.md §Directives).
    #[uniffi(default)]
    pub directives_applied: u64,
    #[uniffi(default)]
    pub directives_ignored: u64,
    /// The collector's directive in force, if any; `clear_directive` ends it.
    #[uniffi(default)]
    pub directive: Option<DirectiveInForce>,
    /// The random id this install reports under; `None` while consent is denied.
    #[uniffi(default)]
    pub install_id: Option<String>,
    /// `rejected` ids in a 2xx that named no event of the batch (a collector bug).
    #[uniffi(default)]
    pub rejections_unmatched: u64,
    /// The batch body size timeouts taught on the link in use (a slow uplink); `None` while
    /// nothing is taught, or after a reconnect.
    #[uniffi(default)]
    pub slow_link_batch_bytes: Option<u64>,
}

/// A collector's directive as it holds on this device now (docs/protocol.md §Directives).
#[derive(Clone, Debug, PartialEq, uniffi::Record)]
pub struct DirectiveInForce {
    pub id: String,
    /// Its life left, counted on the device's monotonic clock from its arrival.
    pub expires_in_ms: u64,
    /// The same as a wall-clock estimate (Unix ms), for display.
    pub expires_at_ms: i64,
    /// No request before this (Unix ms), already capped.
    pub pause_until_ms: Option<i64>,
    /// Name prefix to the fraction of new events kept; the critical lane is never sampled.
    pub sample_rate: HashMap<String, f64>,
    /// Names `track` refuses; the critical lane is never refused.
    pub drop_names: Vec<String>,
    pub redrive: Vec<String>,
    pub purge_quarantine: Vec<String>,
}

impl From<eventspool::DirectiveInForce> for DirectiveInForce {
    fn from(d: eventspool::DirectiveInForce) -> Self {
        DirectiveInForce {
            id: d.id,
            expires_in_ms: d.expires_in_ms,
            expires_at_ms: d.expires_at_ms,
            pause_until_ms: d.pause_until_ms,
            sample_rate: d.sample_rate.into_iter().collect(),
            drop_names: d.drop_names,
            redrive: d.redrive,
            purge_quarantine: d.purge_quarantine,
        }
    }
}

impl SpoolStats {
    pub(crate) fn from_core(s: Stats, callback_errors: u64, install_id: Option<String>) -> Self {
        SpoolStats {
            tracked: s.tracked,
            restored: s.restored,
            redriven: s.redriven,
            delivered: s.delivered,
            quarantined: s.quarantined,
            dropped: s.dropped.into_iter().collect(),
            pending: s.pending,
            pending_memory: s.pending_memory,
            pending_disk: s.pending_disk,
            quarantine: s.quarantine.into_iter().collect(),
            store_bytes: s.store_bytes,
            requests: s.requests,
            batches_delivered: s.batches_delivered,
            store_errors: s.store_errors,
            stores_recovered: s.stores_recovered,
            panics: s.panics,
            callback_errors,
            directives_applied: s.directives_applied,
            directives_ignored: s.directives_ignored,
            directive: s.directive.map(Into::into),
            install_id,
            rejections_unmatched: s.rejections_unmatched,
            slow_link_batch_bytes: s.slow_link_batch_bytes,
        }
    }
}

/// An event with every optional field the caller may set (idempotent producers pass their own
/// `event_id`, importers a historical `timestamp`).
#[derive(Clone, Debug, uniffi::Record)]
pub struct NewEvent {
    pub name: String,
    /// A JSON object, as text.
    #[uniffi(default = "{}")]
    pub properties_json: String,
    /// A UUID; made at `track` when absent.
    #[uniffi(default)]
    pub event_id: Option<String>,
    /// RFC 3339; now when absent.
    #[uniffi(default)]
    pub timestamp: Option<String>,
    #[uniffi(default)]
    pub session_id: Option<String>,
    /// Normal when absent.
    #[uniffi(default)]
    pub priority: Option<Priority>,
}

/// An event the collector refused for good.
#[derive(Clone, Debug, PartialEq, Eq, uniffi::Record)]
pub struct QuarantinedEvent {
    pub event_id: String,
    /// The event's own timestamp, Unix ms.
    pub ts_ms: i64,
    /// The event's wire JSON.
    pub body: String,
    /// `rejected`, `bad_request`, `too_large` or `max_sends`.
    pub reason: String,
    /// The collector's words (at most 1 KiB).
    pub detail: String,
    pub status: Option<u16>,
    pub attempts: u32,
    pub first_failed_ms: i64,
    pub last_failed_ms: i64,
}

impl From<eventspool::QuarantinedEvent> for QuarantinedEvent {
    fn from(q: eventspool::QuarantinedEvent) -> Self {
        QuarantinedEvent {
            event_id: q.event_id,
            ts_ms: q.ts_ms,
            body: q.body,
            reason: q.reason,
            detail: q.detail,
            status: q.status,
            attempts: q.attempts,
            first_failed_ms: q.first_failed_ms,
            last_failed_ms: q.last_failed_ms,
        }
    }
}

/// Which quarantined events a redrive or purge applies to.
#[derive(Clone, Debug, PartialEq, Eq, uniffi::Enum)]
pub enum QuarantineSelector {
    Ids { ids: Vec<String> },
    Reason { reason: String },
    All,
}

impl From<QuarantineSelector> for eventspool::Selector {
    fn from(s: QuarantineSelector) -> Self {
        match s {
            QuarantineSelector::Ids { ids } => eventspool::Selector::Ids(ids),
            QuarantineSelector::Reason { reason } => eventspool::Selector::Reason(reason),
            QuarantineSelector::All => eventspool::Selector::All,
        }
    }
}
