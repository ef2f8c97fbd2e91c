//! What the app's calls ask of the delivery worker ([`Control`]), set by the handle under the
//! shared state's lock and fed to the machine as one input. Its own module so the machine reads
//! it without importing the shared state that holds it.

use crate::state::DeliveryConditions;

/// Requests from the app to the worker. Edges (`retry_now`, `dismiss`, ...) are consumed once.
#[derive(Clone, Debug)]
pub struct Control {
    pub online: bool,
    pub online_changed: bool,
    pub enabled: bool,
    pub enabled_changed: bool,
    pub flush: bool,
    pub retry_now: bool,
    pub dismiss: bool,
    pub resume: bool,
    pub api_key_changed: bool,
    /// Whether the app is in the foreground; the background → foreground edge starts a fresh
    /// failure episode, as a reconnect does.
    pub foreground: bool,
    pub foreground_changed: bool,
    /// What the platform last said about the device (`set_conditions`); the machine compares
    /// it with the config's policy itself, so a level is enough, no edge.
    pub conditions: DeliveryConditions,
    /// Bounded drains asked for since the worker last looked (`deliver_within`).
    pub drains: Vec<DrainRequest>,
    /// Tracking consent ([`crate::Consent`]); its changes are an edge like `enabled`'s.
    pub consent: crate::Consent,
    pub consent_changed: bool,
    pub shutdown: bool,
}

/// One `deliver_within` call: its number (its reply waits under it in [`crate::shared::Shared::drains`]) and
/// when its budget ends on the spool's monotonic clock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DrainRequest {
    pub id: u64,
    pub deadline_ms: u64,
}

impl Default for Control {
    fn default() -> Self {
        Control {
            online: true,
            online_changed: false,
            enabled: true,
            enabled_changed: false,
            flush: false,
            retry_now: false,
            dismiss: false,
            resume: false,
            api_key_changed: false,
            foreground: true,
            foreground_changed: false,
            conditions: DeliveryConditions::default(),
            drains: Vec::new(),
            consent: crate::Consent::Granted,
            consent_changed: false,
            shutdown: false,
        }
    }
}
