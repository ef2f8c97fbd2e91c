//! The checks a device makes of the spool after every step, after a denial and at the end of a
//! run: the promises of README and docs/ against what memory, the store's files, the observers
//! and the collector say.

use std::collections::HashSet;

use eventspool::{DeliveryState, ListFilter, QuarantinedEvent};

use super::{Device, Finding, lock};

impl Device {
    /// The oracles that hold after every step.
    pub fn check(&mut self) -> Result<(), Finding> {
        if let Some(f) = lock(&self.heard).findings.first() {
            return Err(f.clone());
        }
        let Some(spool) = self.spool() else {
            return Ok(());
        };
        let st = spool.stats();
        let raw = st.tracked as i128 + st.restored as i128 + st.redriven as i128
            - st.delivered as i128
            - st.quarantined as i128
            - st.dropped_from_queue() as i128;
        let held = (st.pending_memory + st.pending_disk) as i128;
        if raw != held || st.pending as i128 != held {
            return Err(format!(
                "ledger: tracked {} + restored {} + redriven {} - delivered {} - quarantined {} - dropped {} = {raw}, but memory holds {} and the store {} (pending says {})",
                st.tracked,
                st.restored,
                st.redriven,
                st.delivered,
                st.quarantined,
                st.dropped_from_queue(),
                st.pending_memory,
                st.pending_disk,
                st.pending
            ));
        }
        // A sampled event gets its id and is counted `sampled`, not tracked.
        let sampled = st.dropped.get("sampled").copied().unwrap_or(0);
        if st.tracked + sampled != self.tracked {
            return Err(format!(
                "stats().tracked is {} and {sampled} sampled, but track returned {} ids",
                st.tracked, self.tracked
            ));
        }
        if st.delivered != self.acks {
            return Err(format!(
                "the spool counts {} delivered but the collector acknowledged {} in answers it read whole",
                st.delivered, self.acks
            ));
        }
        // The countdown the UI shows is when the next automatic request may go: never before
        // a collector's Retry-After in force (docs/delivery.md).
        let now = self.now();
        if let Some(hold) = self.retry_after_hold.filter(|h| *h > now) {
            let shown = match spool.state().state {
                DeliveryState::RetryScheduled { retry_in_ms, .. } => Some(retry_in_ms),
                DeliveryState::WaitingForUser { probe_in_ms, .. } => Some(probe_in_ms),
                _ => None,
            };
            if let Some(left) = shown
                && now + left + 1_000 < hold
            {
                return Err(format!(
                    "the UI says the next try is in {left} ms, but the collector's Retry-After holds for {} ms",
                    hold - now
                ));
            }
        }
        // The directives whose answers landed are read now; a store fault since may have lost
        // the record that they ran.
        let landed = std::mem::take(&mut self.directive_landed);
        if !self.faults.armed() {
            for id in landed {
                self.directive_faults.insert(id, self.figures.faults);
            }
        }
        // A directive id applied before came again (docs/protocol.md §Directives: one-shot
        // actions run once per id, whatever ids came between).
        if let Some((id, redriven, quarantine, cap)) = self.replayed.take() {
            let evicted = st.dropped.get("quarantine_cap").copied().unwrap_or(0) > cap;
            let purged = quarantine
                .iter()
                .find(|(reason, n)| st.quarantine.get(*reason).copied().unwrap_or(0) < **n);
            if st.redriven > redriven {
                return Err(format!(
                    "directive {id} came again and redrove {} dead letters again",
                    st.redriven - redriven
                ));
            }
            if let Some((reason, n)) = purged.filter(|_| !evicted) {
                return Err(format!(
                    "directive {id} came again and purged dead letters again ({reason}: {n} before, {} after)",
                    st.quarantine.get(reason).copied().unwrap_or(0)
                ));
            }
        }
        self.scan_spared_back()?;
        // The files' sizes every 8th check: two stat calls each, the most costly check.
        self.checks += 1;
        if !self.checks.is_multiple_of(8) {
            return Ok(());
        }
        let on_disk = eventspool::disk_usage(&self.db);
        if on_disk > self.config.max_disk_bytes {
            return Err(format!(
                "the store takes {on_disk} bytes on disk, over max_disk_bytes {}",
                self.config.max_disk_bytes
            ));
        }
        // A sealed store's files read through every 64th check (and at every restart): the
        // costliest check of all.
        if self.checks.is_multiple_of(64) {
            self.scan_sealed()?;
        }
        Ok(())
    }

    /// After a "no" that changed the record returned Ok (`set_consent(Denied|Pending)`,
    /// `set_enabled(false)`): no byte of the WAL is left unsynced, so a power cut cannot take the
    /// answer back (README §Consent; the store's fault point counts the bytes). The database
    /// file is not judged: SQLite writes it only in checkpoints, which sync the WAL first, so
    /// what a failed checkpoint left unsynced there is still in the synced WAL.
    pub(super) fn synced_no(&self, verb: &str) -> Result<(), Finding> {
        match self.faults.unsynced_bytes() {
            (_, 0) => Ok(()),
            (_, wal) => Err(format!(
                "{verb} returned Ok with {wal} bytes of the WAL not synced: a power cut could take the answer back"
            )),
        }
    }

    /// After `set_consent(Denied)` returned: no byte of an event's payload in the store's files,
    /// and no event id (in the clear in every row, sealed store or not: the file keeps none of
    /// the events' bytes), except those of the batch on the wire (it may finish).
    pub(super) fn scan_after_denial(&mut self) -> Result<(), Finding> {
        if self.faults.armed() {
            return Ok(());
        }
        let in_flight: HashSet<usize> = self
            .flight
            .iter()
            .flat_map(|f| f.carried.iter().copied())
            .collect();
        let files = self.files();
        files
            .payload(|idx| !in_flight.contains(&idx))
            .map_err(|(file, idx)| {
                format!("after set_consent(Denied) returned, {file} still holds the payload of event {idx}")
            })?;
        files
            .ids(&self.by_id, |idx| !in_flight.contains(&idx))
            .map_err(|(file, idx)| {
                format!(
                    "after set_consent(Denied) returned, {file} still holds the id of event {idx}"
                )
            })
    }

    /// Once the worker has settled after the answer (or the end) of a request a denial spared
    /// on the wire: none of the bytes of its events that did not come back delivered, nor their
    /// ids, are in the store's files (README §Consent: deleted as the denial deletes).
    pub(super) fn scan_spared_back(&mut self) -> Result<(), Finding> {
        let Some(back) = self.spared_back.take() else {
            return Ok(());
        };
        if self.faults.armed() || self.store_faulted {
            return Ok(());
        }
        let back: HashSet<usize> = back.into_iter().collect();
        let on_wire: HashSet<usize> = self
            .flight
            .iter()
            .flat_map(|f| f.carried.iter().copied())
            .collect();
        let hit = |idx: usize| back.contains(&idx) && !on_wire.contains(&idx);
        let said = |what: &str, (file, idx): (String, usize)| {
            format!(
                "event {idx} of a request a denial spared on the wire came back undelivered, and {file} still holds its {what}"
            )
        };
        let files = self.files();
        files.payload(hit).map_err(|e| said("payload", e))?;
        files.ids(&self.by_id, hit).map_err(|e| said("id", e))
    }

    /// Every event the app tracked is delivered, quarantined, or was dropped with its id named
    /// (or may have gone without a name: in memory when the process died, or deleted by a
    /// denial).
    pub fn audit(&mut self) -> Result<(), Finding> {
        let Some(spool) = self.spool.clone() else {
            return Err("the store never opened again after the disk healed".into());
        };
        let listed = spool
            .quarantine_list(&ListFilter::default())
            .map_err(|e| format!("quarantine_list: {e}"))?;
        self.check_too_large(&listed)?;
        // A damaged row's payload is lost: quarantined, it is there as `undecryptable`.
        for q in &listed {
            let Some(&idx) = self.by_id.get(&q.event_id) else {
                continue;
            };
            if !self.events[idx].damaged {
                continue;
            }
            if q.reason != "undecryptable" {
                return Err(format!(
                    "event {idx}, whose sealed row was damaged on disk, is quarantined as {:?}, not undecryptable",
                    q.reason
                ));
            }
            self.figures.undecryptable += 1;
        }
        let quarantined: HashSet<String> = listed.into_iter().map(|q| q.event_id).collect();
        self.scan_sealed()?;
        self.add_drops();
        let heard = lock(&self.heard);
        // Drops counted without naming ids (the disk cap, memory overflow, sampling): each may
        // explain one event that is nowhere.
        let unnamed = self
            .drops_counted
            .saturating_sub(heard.dropped.len() as u64);
        let missing: Vec<usize> = self
            .events
            .iter()
            .enumerate()
            .filter(|(_, e)| {
                !(self.collector.stored.contains_key(&e.id)
                    || quarantined.contains(&e.id)
                    || heard.dropped.contains_key(&e.id)
                    || self.purgeable.contains(&e.id)
                    || e.exposed)
            })
            .map(|(idx, _)| idx)
            .collect();
        if missing.len() as u64 > unnamed {
            return Err(format!(
                "{} events are neither delivered, quarantined nor dropped with their id named, and only {unnamed} drops were counted without ids (first: event {})",
                missing.len(),
                missing[0]
            ));
        }
        Ok(())
    }

    /// The collector takes 48 KiB, so a 413 for one event alone is a proxy's that refuses every
    /// body. For a body under 1 KiB the SDK keeps such an event (a pause) or sends it again
    /// once the collector takes requests, and quarantines it as too large only after a second
    /// 413 (decision 0071); a larger body (the event with a client report) may pass for a size
    /// limit. Checked whenever the dead letters are about to change by choice (a purge, a
    /// redrive) and at the audit.
    pub(super) fn check_too_large(&self, listed: &[QuarantinedEvent]) -> Result<(), Finding> {
        for q in listed.iter().filter(|q| q.reason == "too_large") {
            let refusals = self
                .collector
                .refusals
                .get(&q.event_id)
                .copied()
                .unwrap_or(0);
            if refusals < 2 && !self.collector.large_lone_413.contains(&q.event_id) {
                let idx = self.by_id.get(&q.event_id).copied().unwrap_or(usize::MAX);
                return Err(format!(
                    "event {idx} is quarantined as too_large after {refusals} refusal(s) of a body under 1 KiB"
                ));
            }
        }
        Ok(())
    }

    /// What the handle about to go counted as dropped (a crash loses nothing already counted).
    pub(super) fn add_drops(&mut self) {
        if let Some(spool) = self.spool() {
            let n: u64 = spool.stats().dropped.values().sum();
            self.drops_counted += n;
        }
    }
}
