//! The settings the transitions depend on ([`Policy`], a copy of [`Config`]'s) and where the
//! jitter of retry and probe delays comes from ([`Jitter`]): what the machine is built with and
//! never changes. Separate from the transitions: the worker and the table tests build a machine
//! from these without reading through the state it keeps.

use crate::config::Config;
use crate::state::{DeferReason, DeliveryConditions};

/// The settings the transitions depend on (a copy of those of [`Config`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Policy {
    pub flush_interval_ms: u64,
    pub min_batch_interval_ms: u64,
    pub max_batch_bytes: u64,
    pub max_auto_attempts: u32,
    pub backoff_base_ms: u64,
    pub backoff_cap_ms: u64,
    pub retry_after_cap_ms: u64,
    pub max_retry_elapsed_ms: u64,
    pub probe_base_ms: u64,
    pub probe_cap_ms: u64,
    pub max_event_sends: u32,
    pub max_event_age_ms: u64,
    pub deliver_on_metered: bool,
    pub deliver_on_low_power: bool,
    pub deliver_on_battery_low: bool,
}

impl Policy {
    pub fn of(c: &Config) -> Policy {
        Policy {
            flush_interval_ms: c.flush_interval_ms,
            min_batch_interval_ms: c.min_batch_interval_ms,
            max_batch_bytes: c.max_batch_bytes,
            max_auto_attempts: c.max_auto_attempts,
            backoff_base_ms: c.backoff_base_ms,
            backoff_cap_ms: c.backoff_cap_ms,
            retry_after_cap_ms: c.retry_after_cap_ms,
            max_retry_elapsed_ms: c.max_retry_elapsed_ms,
            probe_base_ms: c.probe_base_ms,
            probe_cap_ms: c.probe_cap_ms,
            max_event_sends: c.max_event_sends,
            max_event_age_ms: c.max_event_age_ms,
            deliver_on_metered: c.deliver_on_metered,
            deliver_on_low_power: c.deliver_on_low_power,
            deliver_on_battery_low: c.deliver_on_battery_low,
        }
    }

    /// Whether these conditions hold delivery back, and why. When several do, the reason shown
    /// is the first of metered, low power, battery low: the one an app most often words as
    /// "waiting for Wi-Fi".
    pub fn defer_reason(&self, c: &DeliveryConditions) -> Option<DeferReason> {
        if c.metered && !self.deliver_on_metered {
            Some(DeferReason::Metered)
        } else if c.low_power && !self.deliver_on_low_power {
            Some(DeferReason::LowPower)
        } else if c.battery_low && !self.deliver_on_battery_low {
            Some(DeferReason::BatteryLow)
        } else {
            None
        }
    }
}

/// Where the jitter samples come from: a generator (seeded for reproducible runs), or one fixed
/// unit, so a table row can name the exact deadline.
#[derive(Debug)]
pub enum Jitter {
    Random(fastrand::Rng),
    #[cfg_attr(not(test), allow(dead_code))]
    Fixed(f64),
}

impl Jitter {
    pub fn seeded(seed: Option<u64>) -> Jitter {
        Jitter::Random(match seed {
            Some(seed) => fastrand::Rng::with_seed(seed),
            None => fastrand::Rng::new(),
        })
    }

    pub(super) fn unit(&mut self) -> f64 {
        match self {
            Jitter::Random(rng) => rng.f64(),
            Jitter::Fixed(unit) => *unit,
        }
    }
}
