//! The queue's part of README §Consent: the recorded consent and opt-out, and the deletion a
//! denial asks for, in memory and in the store (its SQL is in `store/consent_sql.rs`).

use super::{Queue, Store, store};
use crate::error::{Error, Result};
use crate::quarantine::Selector;
use crate::stats::DropReason;
use crate::sync::lock;
pub use store::WAL_TRUNCATE_BOUND;

/// At open, before the queue is read: a store whose record says `denied` has its kept events
/// deleted now (a crash between the record and the delete, or a failed delete, left them).
/// `Some` when that did not finish.
pub(super) fn finish_recorded_denial(store: &Store) -> Option<Error> {
    // The batch a denial spared on the wire, when the run ended before its answer. A failed
    // delete leaves its rows owed (never read nor sent) and the record for the next open.
    match store.finish_spared() {
        Ok(None) => {}
        Ok(Some(done)) => tracing::info!(
            events = done.queued,
            wal_left = done.wal_left.is_some(),
            "consent denied: the batch that was on the wire when the last run ended is deleted"
        ),
        Err(e) => {
            tracing::error!(error = %e, "could not delete the batch a denial spared before the last run ended; its rows are hidden until they are")
        }
    }
    match store.finish_recorded_denial() {
        Ok(None) => None,
        Ok(Some(done)) => {
            tracing::info!(
                events = done.queued,
                dead_letters = done.dead,
                "consent denied: the deletion recorded before the last close is done"
            );
            done.wal_left
        }
        Err(e) => Some(e),
    }
}

impl Queue {
    /// Consent denied (README §Consent): deletes every queued event but the request on the
    /// wire (`on_wire`, its seqs, when there is one), in memory and in the store, the whole
    /// quarantine, the waiting client reports and the install id, leaving none of the user's
    /// data in the file; counts the queued ones `consent_denied` and returns how many. What the
    /// worker holds beside that request (a batch's other half) goes too. An error says the
    /// file may still hold some of it (the rows, or the WAL's old pages): the caller tries
    /// again. The request spared is deleted when it comes back unanswered
    /// ([`Queue::release`]). `wait` bounds how long a reader holding the WAL is waited for
    /// (zero: one try).
    pub fn discard_for_consent(
        &self,
        wait: std::time::Duration,
        on_wire: Option<&[u64]>,
    ) -> Result<u64> {
        let _guard = self.spill_lock.lock();
        {
            // Everything the worker holds now never goes out again, even under a grant that
            // follows before the answer (the worker sees only the latest consent): the
            // request on the wire may finish, the rest is deleted below.
            let mut spared = lock(&self.spared_by_denial);
            spared.clear();
            if on_wire.is_some() {
                spared.extend(self.memory().in_flight_seqs());
                if let Some(store) = &self.store {
                    spared.extend(store.leased_seqs());
                }
                spared.sort_unstable();
                spared.dedup();
            }
        }
        let mut n = self.memory().clear();
        n += self.memory().forget_in_flight(on_wire.unwrap_or_default());
        self.settle_tickets_gone();
        // Counted before the store is touched: a store error must not hide what memory lost.
        self.counters.drop(DropReason::ConsentDenied, n);
        // Memory's dead letters: all of them without a store, those the store refused with one.
        let mut dead = lock(&self.memory_quarantine).take(&Selector::All).len() as u64;
        let wal_left = match &self.store {
            Some(store) => {
                let done = store.discard_for_consent(wait, on_wire)?;
                self.counters.drop(DropReason::ConsentDenied, done.queued);
                n += done.queued;
                dead += done.dead;
                done.wal_left
            }
            None => None,
        };
        tracing::info!(
            events = n,
            dead_letters = dead,
            "consent denied: kept events deleted"
        );
        match wal_left {
            Some(e) => Err(e),
            None => Ok(n),
        }
    }

    /// Whether a denial covered any of these events while the worker held them: they must
    /// not be sent again, whatever consent says now ([`Queue::release`] deletes them).
    pub fn spared_by_denial(&self, events: &[(crate::event::QueuedEvent, bool)]) -> bool {
        let spared = lock(&self.spared_by_denial);
        !spared.is_empty() && events.iter().any(|(e, _)| spared.contains(&e.seq))
    }

    /// Events leave the queue (delivered, quarantined): a denial has nothing left to delete of
    /// them.
    pub(super) fn forget_spared(&self, seqs: impl IntoIterator<Item = u64>) {
        let mut spared = lock(&self.spared_by_denial);
        if !spared.is_empty() {
            for seq in seqs {
                spared.retain(|s| *s != seq);
            }
        }
    }

    /// Of events the collector rejected for good, deletes those a denial spared while they
    /// were on the wire (the denial deleted every dead letter; these are no different) and
    /// returns the others, for the quarantine.
    pub fn drop_spared(
        &self,
        events: Vec<(crate::event::QueuedEvent, bool)>,
    ) -> Vec<(crate::event::QueuedEvent, bool)> {
        if lock(&self.spared_by_denial).is_empty() {
            return events;
        }
        let _guard = self.spill_lock.lock();
        self.discard_spared(&events)
    }

    /// Of events coming back unanswered, takes out those a denial spared while they were on
    /// the wire and deletes them as the denial would have (counted `consent_denied`); returns
    /// the others, to go back to the queue. Called with the spill lock held.
    pub(super) fn discard_spared(
        &self,
        events: &[(crate::event::QueuedEvent, bool)],
    ) -> Vec<(crate::event::QueuedEvent, bool)> {
        let denied: Vec<u64> = {
            let mut spared = lock(&self.spared_by_denial);
            if spared.is_empty() {
                return events.to_vec();
            }
            let denied = events
                .iter()
                .map(|(e, _)| e.seq)
                .filter(|seq| spared.contains(seq))
                .collect::<Vec<_>>();
            spared.retain(|s| !denied.contains(s));
            denied
        };
        if denied.is_empty() {
            return events.to_vec();
        }
        // Counted once each, and only those still held: the denial deleted (and counted) what
        // the worker held beside the request on the wire.
        let held: std::collections::HashSet<u64> = {
            let mut held: std::collections::HashSet<u64> = self.memory().in_flight_seqs().collect();
            if let Some(store) = &self.store {
                held.extend(store.leased_seqs());
            }
            held
        };
        let still = denied.iter().filter(|s| held.contains(s)).count() as u64;
        // Out of memory's hands first: whatever the store does, none of them is sent again.
        self.memory().acknowledge(&denied);
        self.counters.drop(DropReason::ConsentDenied, still);
        if let Some(store) = &self.store
            && let Err(e) = store.discard_spared(&denied, WAL_TRUNCATE_BOUND)
        {
            tracing::error!(error = %e, "could not delete the batch a denial spared; its rows stay hidden until the next write deletes them");
        }
        tracing::info!(
            events = denied.len(),
            "consent denied: the batch that was on the wire came back unanswered and is deleted"
        );
        events
            .iter()
            .filter(|(e, _)| !denied.contains(&e.seq))
            .cloned()
            .collect()
    }

    /// Consent as the store recorded it, if it has a store and a record.
    pub fn stored_consent(&self) -> Result<Option<crate::Consent>> {
        let Some(store) = &self.store else {
            return Ok(None);
        };
        Ok(store
            .meta(store::meta::CONSENT)?
            .and_then(|v| crate::Consent::from_name(&v)))
    }

    /// Records consent in the store (nothing without one), so it holds after a restart.
    pub fn store_consent(&self, consent: crate::Consent) -> Result<()> {
        match &self.store {
            Some(store) => store.set_meta_synced(store::meta::CONSENT, consent.as_str()),
            None => Ok(()),
        }
    }

    /// The opt-out as the store recorded it (`set_enabled`), if it has a store and a record.
    pub fn stored_enabled(&self) -> Result<Option<bool>> {
        let Some(store) = &self.store else {
            return Ok(None);
        };
        Ok(store
            .meta(store::meta::ENABLED)?
            .and_then(|v| v.parse().ok()))
    }

    /// Records the opt-out in the store (nothing without one), so it holds after a restart.
    pub fn store_enabled(&self, enabled: bool) -> Result<()> {
        match &self.store {
            Some(store) => store.set_meta_synced(store::meta::ENABLED, &enabled.to_string()),
            None => Ok(()),
        }
    }
}
