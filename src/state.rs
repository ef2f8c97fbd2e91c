//! The delivery state a UI renders (docs/delivery.md §States) and the observer that is told about
//! it.
//!
//! ```text
//! Idle ──trigger──▶ Sending ──ok──▶ Idle
//!                     │ transient
//!                     ▼
//!            RetryScheduled{attempt, max_attempts, …} ──budget spent──▶ WaitingForUser{attempts}
//!                     │ timer / retry_now()                               │ retry_now() / dismiss()
//!                     ▼                                                   ▼
//!                  Sending                                           Sending / Idle
//!                                    WaitingForUser ──slow probe ok / foreground / reconnect──▶ Sending
//! Offline (set_online(false)): no attempts at all.  Paused{auth|config}: until resume()/new key.
//! Deferred{metered|low_power|battery_low} (set_conditions): no attempts until they allow it.
//! ```

use crate::classify::Failure;

/// Exhaustive on purpose, like [`DeliveryState`]: each reason asks the user for something else.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PauseReason {
    /// 401/403: the credentials were refused.
    Auth,
    /// Another 4xx or a 3xx: the endpoint is wrong.
    Config,
}

impl PauseReason {
    pub fn as_str(self) -> &'static str {
        match self {
            PauseReason::Auth => "auth",
            PauseReason::Config => "config",
        }
    }
}

/// Why delivery waits although it could send: a condition, not a failure. Exhaustive on purpose,
/// like [`DeliveryState`]: a UI words each one differently ("waiting for Wi-Fi").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeferReason {
    /// The network is metered and `deliver_on_metered` is false.
    Metered,
    /// The device saves power and `deliver_on_low_power` is false.
    LowPower,
    /// The battery is low and `deliver_on_battery_low` is false.
    BatteryLow,
    /// Tracking consent is `pending`: events are kept, nothing is sent until it is granted.
    Consent,
    /// The collector asked for no request before a time: a `pause_until` directive, or a
    /// server's `Retry-After` that outlives the episode it came in (docs/delivery.md §Retry).
    /// Delivery resumes by itself then; [`DrainOutcome::RetryAfter`] says when.
    Collector,
}

impl DeferReason {
    pub fn as_str(self) -> &'static str {
        match self {
            DeferReason::Metered => "metered",
            DeferReason::LowPower => "low_power",
            DeferReason::BatteryLow => "battery_low",
            DeferReason::Consent => "consent",
            DeferReason::Collector => "collector",
        }
    }

    /// The words of the status line.
    fn describe(self) -> &'static str {
        match self {
            DeferReason::Metered => "metered network",
            DeferReason::LowPower => "power saving",
            DeferReason::BatteryLow => "battery low",
            DeferReason::Consent => "consent",
            DeferReason::Collector => "the collector asked for a pause",
        }
    }
}

/// What the platform knows about the device, fed with [`crate::EventSpool::set_conditions`]
/// (Android: `NET_CAPABILITY_NOT_METERED`, `PowerManager.isPowerSaveMode`,
/// `BatteryManager`). Whether each one holds delivery back is the config's
/// (`deliver_on_metered`, `deliver_on_low_power`, `deliver_on_battery_low`). Default: none holds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DeliveryConditions {
    pub metered: bool,
    pub low_power: bool,
    pub battery_low: bool,
}

/// How [`crate::EventSpool::deliver_within`] ended (docs/delivery.md §Bounded drain). Exhaustive:
/// a platform job decides what to do next from it, and must handle each case.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DrainOutcome {
    /// The queue was found empty: everything tracked before (and during) the drain is delivered,
    /// quarantined or dropped.
    Drained,
    /// The budget passed with events still pending and delivery still possible.
    DeadlineReached,
    /// The next attempt (a scheduled retry, or the slow probe behind `WaitingForUser`) is due
    /// `ms` from now, after the budget: reschedule the platform job then.
    RetryAfter { ms: u64 },
    /// Nothing will be sent until the app, the user or the device changes something: `Offline`,
    /// `Paused`, `Disabled` or `Deferred`. Reschedule on that change (network back, conditions
    /// allowing, new key), not on a timer.
    Blocked { state: DeliveryState },
}

/// Not `#[non_exhaustive]`, on purpose: the states are the contract a UI renders
/// (docs/delivery.md §States), and a UI that switches over them, here or through the bindings,
/// must fail to compile when a state is added rather than show nothing for it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DeliveryState {
    Idle,
    Sending,
    RetryScheduled {
        /// Which automatic retry is next (1-based): "attempt 2 of 5".
        attempt: u32,
        max_attempts: u32,
        /// Wall-clock estimate (Unix ms) of the retry, for display; timers use the monotonic clock.
        next_retry_at_ms: i64,
        /// Milliseconds left, computed when this value was made.
        retry_in_ms: u64,
        last_error: Failure,
    },
    /// The automatic budget is spent; the UI offers "Retry now" and "Back". Behind it a slow
    /// automatic probe keeps running (one request at `next_probe_at_ms`); its success resumes
    /// delivery as a fresh episode, its failure only moves the probe time.
    WaitingForUser {
        attempts: u32,
        last_error: Failure,
        /// Wall-clock estimate (Unix ms) of the next automatic probe, for display.
        next_probe_at_ms: i64,
        /// Milliseconds until that probe, computed when this value was made.
        probe_in_ms: u64,
    },
    Offline,
    Paused {
        reason: PauseReason,
        last_error: Failure,
    },
    /// `set_enabled(false)`, or consent `denied`: the user opted out.
    Disabled,
    /// Delivery waits for a condition, not a failure: the device's conditions (metered network,
    /// power saving, low battery) forbid it by the config's policy, or consent is `pending`. No
    /// attempt, no retry budget spent, until it clears.
    Deferred {
        reason: DeferReason,
    },
}

impl DeliveryState {
    /// The snake_case name used in JSON summaries and logs.
    pub fn name(&self) -> &'static str {
        match self {
            DeliveryState::Idle => "idle",
            DeliveryState::Sending => "sending",
            DeliveryState::RetryScheduled { .. } => "retry_scheduled",
            DeliveryState::WaitingForUser { .. } => "waiting_for_user",
            DeliveryState::Offline => "offline",
            DeliveryState::Paused { .. } => "paused",
            DeliveryState::Disabled => "disabled",
            DeliveryState::Deferred { .. } => "deferred",
        }
    }
}

/// The state plus the number of events not yet delivered: everything a status line needs.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct DeliveryStatus {
    pub state: DeliveryState,
    pub pending: u64,
}

impl DeliveryStatus {
    /// A status as `state()` would give it (the bindings make one for a drain's `Blocked`).
    pub fn new(state: DeliveryState, pending: u64) -> DeliveryStatus {
        DeliveryStatus { state, pending }
    }

    /// Nothing pending and nothing being sent: what "done" means for scripts and tools.
    pub fn is_drained(&self) -> bool {
        self.pending == 0 && self.state == DeliveryState::Idle
    }
}

impl std::fmt::Display for DeliveryStatus {
    /// The seed UI's wording, handy for logs and terminal tools.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.state {
            DeliveryState::Idle => write!(f, "idle, {} pending", self.pending),
            DeliveryState::Sending => write!(f, "sending, {} pending", self.pending),
            DeliveryState::RetryScheduled {
                attempt,
                max_attempts,
                retry_in_ms,
                last_error,
                ..
            } => write!(
                f,
                "connection lost ({last_error}): attempt {attempt} of {max_attempts}, next try in {} s, {} pending",
                retry_in_ms.div_ceil(1000),
                self.pending
            ),
            // No automatic retry fitted the budget at all (a `Retry-After` past it, or
            // `max_auto_attempts = 0`): "gave up after 0 attempts" would misstate it.
            DeliveryState::WaitingForUser {
                attempts: 0,
                last_error,
                ..
            } => write!(
                f,
                "not retrying automatically ({last_error}), waiting for retry, {} pending",
                self.pending
            ),
            DeliveryState::WaitingForUser {
                attempts,
                last_error,
                ..
            } => write!(
                f,
                "gave up after {attempts} attempt{} ({last_error}), waiting for retry, {} pending",
                if *attempts == 1 { "" } else { "s" },
                self.pending
            ),
            DeliveryState::Offline => write!(f, "offline, {} pending", self.pending),
            DeliveryState::Paused { reason, last_error } => {
                write!(
                    f,
                    "paused ({}: {last_error}), {} pending",
                    reason.as_str(),
                    self.pending
                )
            }
            DeliveryState::Disabled => write!(f, "disabled, {} pending", self.pending),
            DeliveryState::Deferred { reason } => {
                write!(
                    f,
                    "deferred ({}), {} pending",
                    reason.describe(),
                    self.pending
                )
            }
        }
    }
}

/// Notices beside the state machine that an app may want to surface or log.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Notice {
    /// The store file could not be used and was moved aside to this path; a fresh one was made.
    StoreRecovered { moved_to: String, reason: String },
    /// The store could not take events (disk full, read-only); they stay in memory meanwhile.
    StoreUnavailable { reason: String },
    /// A background task panicked; delivery was restarted.
    InternalError { message: String },
    /// These events left the queue without being delivered, for this reason (a
    /// [`crate::DropReason`] name, e.g. `expired`); they are counted under it in the stats too.
    /// Sent after the fact, once per batch of drops, so a tool can name each event it lost.
    EventsDropped {
        reason: String,
        event_ids: Vec<String>,
    },
}

/// Told about every transition and, while a retry is scheduled, once a second with the
/// countdown. States come on the SDK's worker thread; a notice on whichever SDK thread (or the
/// app's own, in `persist()`) met the condition. Always with no lock of the SDK held, so it may
/// call any verb, `shutdown()` included (which then does not wait for the thread it runs on); an
/// app hops to its UI thread itself. A panic inside it is caught and does not stop delivery.
pub trait DeliveryObserver: Send + Sync {
    fn on_state(&self, status: &DeliveryStatus);
    fn on_notice(&self, _notice: &Notice) {}
}

impl<F: Fn(&DeliveryStatus) + Send + Sync> DeliveryObserver for F {
    fn on_state(&self, status: &DeliveryStatus) {
        self(status)
    }
}
