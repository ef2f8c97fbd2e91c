//! The end of a run: the world heals, every device must drain by itself within a bound
//! (liveness), then the index probe runs. Apart from the run's steps (app.rs) because none of
//! this happens while the plan runs.

use eventspool::{Consent, DeliveryConditions, DeliveryState};

use super::{Device, Finding};
use crate::plan::When;

/// After the world heals, every device drains within this (the longest probe wait, a
/// collector's longest hold, and room for backoff), plus [`LIVENESS_PER_EVENT_MS`] per event
/// it holds (the throttle between batches).
pub const LIVENESS_BASE_MS: u64 =
    15 * crate::plan::MINUTE_MS + super::RETRY_AFTER_CAP_MS + 10 * crate::plan::MINUTE_MS;
pub const LIVENESS_PER_EVENT_MS: u64 = 50;

/// The phases of the index probe after the world healed: a future-dated event, then one
/// written behind it, then rows in delivery order, each phase once the last one's events are
/// delivered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Probe {
    Off,
    Future,
    Behind,
    Done,
}

impl Device {
    /// The end of the run: the network and the disk heal, the user says yes, and nothing else
    /// happens; the app turns back what it turned off (`resume()` once for a pause the
    /// collector's config caused: that is what the UI's button is for).
    pub fn heal(&mut self) {
        self.healed = true;
        self.plan.truncate(self.next_step);
        self.at_take = None;
        self.on_wire = None;
        self.faults.disarm();
        self.disk_full_until = None;
        self.open();
        let Some(spool) = self.spool.clone() else {
            return;
        };
        let _ = spool.set_consent(Consent::Granted);
        let _ = spool.set_enabled(true);
        self.consent = Consent::Granted;
        self.enabled = true;
        self.said_no();
        spool.set_online(true);
        spool.set_foreground(true);
        spool.set_conditions(DeliveryConditions::default());
        if matches!(spool.state().state, DeliveryState::Paused { .. }) {
            spool.resume();
        }
    }

    /// The world healed: [`Device::heal`], and the time this device may take to drain.
    pub fn heal_now(&mut self) -> Result<(), Finding> {
        self.dirty = true;
        self.heal();
        self.pending_at_heal = self.pending();
        Ok(())
    }

    /// Whether the index probe is over (or never ran: a device without a store).
    pub fn probe_done(&self) -> bool {
        self.probe == Probe::Done
    }

    /// While the probe runs: when its current phase began (its events must be delivered
    /// within [`heal::LIVENESS_BASE_MS`] of it).
    pub fn probe_since(&self) -> Option<u64> {
        (self.probe != Probe::Off).then_some(self.probe_since)
    }

    /// The next phase of the probe that src/queue/store/frontier.rs's promise needs, once the
    /// device holds nothing: a future-dated event goes to disk at the frontier and is
    /// delivered; then an event behind it, which is indexed, is delivered (its batch read
    /// finds no row in order left); then rows written in delivery order must skip the ordering
    /// index again. Otherwise one event from a wrong clock would leave every later row indexed
    /// and every batch read walking the table.
    pub fn probe_step(&mut self) -> Result<(), Finding> {
        self.dirty = true;
        self.probe_since = self.now();
        let Some(spool) = self.spool.clone() else {
            self.probe = Probe::Done;
            return Ok(());
        };
        let step = self.tick;
        match self.probe {
            Probe::Off => {
                self.track("ok", When::Future(30), false, step);
                let _ = spool.persist();
                self.probe = Probe::Future;
            }
            Probe::Future => {
                self.track("ok", When::Now, false, step);
                let _ = spool.persist();
                self.probe = Probe::Behind;
            }
            Probe::Behind => {
                for _ in 0..3 {
                    self.track("ok", When::Now, false, step);
                }
                let _ = spool.persist();
                self.probe = Probe::Done;
                let shape = self
                    .stepper
                    .as_ref()
                    .and_then(|st| st.normal_rows_by_order());
                if let Some(Ok((in_order, indexed))) = shape
                    && indexed > 0
                {
                    return Err(format!(
                        "after the store drained, {indexed} of {} rows written in delivery order went into the ordering index: a delivered future-dated event still holds the frontier",
                        in_order + indexed
                    ));
                }
            }
            Probe::Done => {}
        }
        Ok(())
    }

    pub fn liveness_bound(&self) -> u64 {
        LIVENESS_BASE_MS + self.pending_at_heal * LIVENESS_PER_EVENT_MS
    }
}
