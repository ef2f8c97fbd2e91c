//! The app's side of a device: the plan's steps carried out on the spool (track, consent,
//! restarts, faults, ...), and what the simulation notes of each event it tracked. Apart from
//! the world's loop (mod.rs) and the checks (oracle.rs), so a new verb is added in one place.

use eventspool::{
    Consent, DeliveryConditions, FaultError, FaultSite, ListFilter, NewEvent, QuarantinedEvent,
    Selector, format_timestamp,
};
use serde_json::{Value, json};

use super::{Device, Ev, Finding, lock};
use crate::plan::{MINUTE_MS, Step, When};

impl Device {
    pub(super) fn payload(&self, idx: usize) -> Value {
        json!({"p": format!("SIMPAYLOAD-{idx}-"), "pad": "x".repeat(idx * 37 % 400)})
    }

    pub(super) fn new_event(&self, name: &str, when: When, idx: usize) -> NewEvent {
        let mut e = NewEvent::new(name, self.payload(idx));
        let at = match when {
            When::Now => None,
            When::Past(min) => Some(self.wall() - i64::from(min) * MINUTE_MS as i64),
            When::Future(min) => Some(self.wall() + i64::from(min) * MINUTE_MS as i64),
        };
        e.timestamp = at.map(format_timestamp);
        e
    }

    pub(super) fn record(&mut self, id: String, critical: bool, ts_ms: i64, step: u64) {
        self.by_id.insert(id.clone(), self.events.len());
        self.events.push(Ev {
            id,
            critical,
            ts_ms,
            accepted_step: {
                let _ = step;
                self.tick += 1;
                self.tick
            },
            sent: false,
            taken: false,
            redriven: false,
            exposed: false,
            denied: false,
            damaged: false,
        });
        self.tracked += 1;
        self.figures.events += 1;
    }

    pub(super) fn ts_of(&self, when: When) -> i64 {
        match when {
            When::Now => self.wall(),
            When::Past(min) => self.wall() - i64::from(min) * MINUTE_MS as i64,
            When::Future(min) => self.wall() + i64::from(min) * MINUTE_MS as i64,
        }
    }

    pub(super) fn track(&mut self, name: &'static str, when: When, critical: bool, step: u64) {
        let Some(spool) = self.spool.clone() else {
            return;
        };
        let idx = self.events.len();
        let mut e = self.new_event(name, when, idx);
        if critical {
            e = e.critical();
        }
        let ts = self.ts_of(when);
        // New events wake a spill thread that waits to retry (`Queue::run_spiller`).
        self.spill_retry_at = None;
        match spool.track_event(e) {
            Ok(id) => self.record(id.to_string(), critical, ts, step),
            // Queued in memory, not durable: accepted all the same.
            Err(eventspool::Error::NotDurable { event_ids, .. }) => {
                for id in event_ids {
                    self.record(id.to_string(), critical, ts, step);
                }
            }
            Err(_) => {}
        }
    }

    /// The dead letters a purge about to run may delete: gone by choice, not lost.
    pub(super) fn note_purgeable(&mut self) -> Result<(), Finding> {
        let list = self.checked_dead_letters()?;
        self.purgeable.extend(list.into_iter().map(|q| q.event_id));
        Ok(())
    }

    /// The quarantine as listed now (empty without a handle, or when it cannot be read),
    /// checked before its dead letters leave by choice (a purge, a redrive).
    fn checked_dead_letters(&self) -> Result<Vec<QuarantinedEvent>, Finding> {
        let Some(Ok(list)) = self
            .spool()
            .map(|spool| spool.quarantine_list(&ListFilter::default()))
        else {
            return Ok(Vec::new());
        };
        self.check_too_large(&list)?;
        Ok(list)
    }

    /// Carries out one step of the plan.
    pub(super) fn apply(&mut self, s: &Step, step: u64) -> Result<(), Finding> {
        self.trace.line(self.now(), format_args!("{s:?}"));
        // Before the handle is borrowed for the step: a crash must drop the last one.
        match s {
            Step::Restart => return self.restart(),
            Step::Crash => return self.crash(),
            Step::Rekey => return self.rekey(),
            Step::Damage => return self.damage(),
            Step::AtTake(verb) => {
                if self.at_take.is_none() {
                    self.at_take = Some((**verb).clone());
                }
                return Ok(());
            }
            Step::OnWire(steps) => {
                if self.on_wire.is_none() {
                    self.on_wire = Some(steps.clone());
                }
                return Ok(());
            }
            _ => {}
        }
        let Some(spool) = self.spool.clone() else {
            return Ok(());
        };
        match s {
            Step::Track { n, name, when } => {
                for _ in 0..*n {
                    self.track(name, *when, false, step);
                }
            }
            Step::Critical => self.track("crash", When::Now, true, step),
            Step::Burst { n } => {
                for _ in 0..*n {
                    self.track("ok", When::Now, false, step);
                }
            }
            Step::Batch { n } => {
                let first = self.events.len();
                let batch: Vec<NewEvent> = (0..*n as usize)
                    .map(|i| self.new_event("ok", When::Now, first + i))
                    .collect();
                let ts = self.wall();
                self.spill_retry_at = None;
                match spool.track_batch(&batch) {
                    Ok(ids) => {
                        for id in ids {
                            self.record(id.to_string(), false, ts, step);
                        }
                    }
                    // The whole batch is recorded; the error names the events memory holds
                    // (the others are on disk, learnt from their payload when they reach the
                    // collector). Every event of the batch has the same timestamp and lane, so
                    // which of them a named id is does not matter to any oracle: the named
                    // ones are taken as the batch's last.
                    Err(eventspool::Error::NotDurable { mut event_ids, .. }) => {
                        event_ids.sort();
                        let unnamed = batch.len().saturating_sub(event_ids.len());
                        for i in 0..unnamed {
                            self.record(format!("unnamed-{}", first + i), false, ts, step);
                        }
                        for id in event_ids.into_iter().take(batch.len()) {
                            self.record(id.to_string(), false, ts, step);
                        }
                    }
                    Err(_) => {}
                }
            }
            Step::Persist => {
                let _ = spool.persist();
            }
            Step::Online(on) => {
                spool.set_online(*on);
                self.fresh_start();
            }
            Step::Foreground(on) => {
                spool.set_foreground(*on);
                self.fresh_start();
            }
            Step::Metered(on) => spool.set_conditions(DeliveryConditions {
                metered: *on,
                ..DeliveryConditions::default()
            }),
            Step::Consent(c) => {
                let before = spool.consent();
                let done = spool.set_consent(*c).is_ok();
                // A denial whose deletion failed is still in force (README §Consent).
                self.consent = spool.consent();
                if self.consent == Consent::Denied {
                    self.expose_all();
                    for e in &mut self.events {
                        e.denied = true;
                    }
                }
                self.said_no();
                // A record that did not change writes nothing, and was synced when it was
                // written.
                if done && *c != Consent::Granted && before != *c {
                    self.synced_no(&format!("set_consent({c:?})"))?;
                }
                // Only a denial that returned Ok claims the wipe.
                if done && *c == Consent::Denied {
                    if let Some(f) = self.flight.as_mut() {
                        f.spared = true;
                    }
                    self.scan_after_denial()?;
                }
                self.fresh_start();
            }
            Step::Enabled(on) => {
                if spool.set_enabled(*on).is_ok() {
                    if !*on && self.enabled {
                        self.synced_no("set_enabled(false)")?;
                    }
                    self.enabled = *on;
                }
                self.said_no();
                self.fresh_start();
            }
            Step::RetryNow => {
                spool.retry_now();
                self.retry_after_hold = None;
                self.fresh_start();
            }
            Step::Dismiss => spool.dismiss(),
            Step::Resume => {
                spool.resume();
                self.fresh_start();
            }
            Step::Flush => {
                spool.flush();
                self.fresh_start();
            }
            Step::Redrive => {
                self.replayed = None;
                self.checked_dead_letters()?;
                if spool
                    .quarantine_redrive(&Selector::All)
                    .is_ok_and(|n| n > 0)
                {
                    self.redrives += 1;
                }
                self.mark_redriven();
            }
            Step::PurgeQuarantine => {
                self.replayed = None;
                self.note_purgeable()?;
                let _ = spool.quarantine_purge(&Selector::All);
            }
            Step::ClearDirective => {
                if spool.clear_directive().is_ok() {
                    self.pause_hold = None;
                }
            }
            Step::Restart
            | Step::Crash
            | Step::Rekey
            | Step::Damage
            | Step::AtTake(_)
            | Step::OnWire(_) => {}
            Step::SkewWall(ms) => self.clock.skew_wall(*ms),
            Step::Partition { ms } => self.partition_until = self.now() + ms,
            Step::RefuseBodies { ms } => self.refuse_until = self.now() + ms,
            Step::Overloaded { ms } => self.overloaded_until = self.now() + ms,
            Step::SlowLink { ms } => self.slow_until = self.now() + ms,
            Step::FailWrites { k } => {
                self.fault();
                self.faults
                    .fail_next(FaultSite::Write, *k, FaultError::IoErr);
            }
            Step::FailNthWrite { n } => {
                self.fault();
                self.faults.fail_nth(FaultSite::Write, *n, FaultError::Full);
            }
            Step::FailCheckpoint => {
                self.fault();
                self.faults
                    .fail_nth(FaultSite::Checkpoint, 1, FaultError::IoErr);
            }
            Step::DiskFull { ms } => {
                self.fault();
                self.faults.fill_disk(FaultError::Full);
                self.disk_full_until = Some(self.now() + ms);
            }
        }
        Ok(())
    }

    pub(super) fn fault(&mut self) {
        self.figures.faults += 1;
        self.store_faulted = true;
    }

    pub(super) fn said_no(&mut self) {
        let no = self.consent == Consent::Denied || !self.enabled;
        lock(&self.link).said_no = no;
    }

    /// Every event not yet accounted for may go without a per-id notice (a crash, a denial).
    pub(super) fn expose_all(&mut self) {
        for e in &mut self.events {
            e.exposed = true;
        }
    }

    pub(super) fn mark_redriven(&mut self) {
        let Some(spool) = self.spool() else { return };
        let _ = spool;
        for e in &mut self.events {
            if !e.sent && !e.taken {
                continue;
            }
            e.redriven = true;
        }
    }
}
