//! Tracking consent (README §Consent): whether the user has said yes to sending their events.
//!
//! Three states, because a GDPR-style consent flow has three: the app asks the user first
//! (`Pending`: record and keep, send nothing), the user agreed (`Granted`: send the backlog and
//! everything after), or refused (`Denied`: delete what was kept, refuse new events). An opt-out
//! switch (`set_enabled`) has only two, and cannot keep events while the question is open.

use crate::error::ConfigError;
use crate::setting::SettingValue;

/// The user's answer to "may we send your events?". Exhaustive: an app switching over it must
/// handle every answer.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Consent {
    /// Not asked yet: events are recorded and stored, nothing is sent.
    Pending,
    /// Events are sent: the backlog kept while pending, and everything after.
    #[default]
    Granted,
    /// Everything kept is deleted (counted `consent_denied`, never sent); `track()` is refused
    /// with [`crate::Error::ConsentDenied`].
    Denied,
}

impl Consent {
    /// The snake_case name used in config, JSON and the store.
    pub fn as_str(self) -> &'static str {
        match self {
            Consent::Pending => "pending",
            Consent::Granted => "granted",
            Consent::Denied => "denied",
        }
    }

    /// As kept in an atomic, so `track()` checks consent without a lock.
    pub(crate) fn to_u8(self) -> u8 {
        self as u8
    }

    pub(crate) fn from_u8(v: u8) -> Consent {
        match v {
            0 => Consent::Pending,
            1 => Consent::Granted,
            _ => Consent::Denied,
        }
    }

    /// The state named by [`Consent::as_str`], or `None`.
    pub fn from_name(name: &str) -> Option<Consent> {
        match name {
            "pending" => Some(Consent::Pending),
            "granted" => Some(Consent::Granted),
            "denied" => Some(Consent::Denied),
            _ => None,
        }
    }
}

impl std::fmt::Display for Consent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl SettingValue for Consent {
    fn parse(name: &str, value: &str) -> Result<Self, ConfigError> {
        Consent::from_name(value).ok_or_else(|| {
            ConfigError::new(
                name,
                format!("'{value}' is not one of: pending, granted, denied"),
            )
        })
    }
}
