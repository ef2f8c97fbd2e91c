//! The quarantine's side of the queue: dead letters written (to the store, or held in memory
//! while it refuses them), listed, redriven back into the queue and purged. Separate from
//! `mod.rs` because these verbs touch the quarantine tables and the memory quarantine, never
//! the buffer's order or the spill.

use std::sync::atomic::Ordering;

use super::Queue;
use super::delivery::seqs_by_origin;
use super::store::Store;
use crate::error::Result;
use crate::event::{EventId, QueuedEvent};
use crate::quarantine::{ListFilter, QuarantinedEvent, Selector};
use crate::stats::{DropReason, Entry};
use crate::sync::lock;

impl Queue {
    /// Stores quarantined events (SQLite or memory) and applies the quarantine's limits; the
    /// batch's stored rows leave the queue in the same transaction (see
    /// `Store::with_quarantine_moving`). The caller then [`Queue::ack`]s the batch.
    pub fn quarantine(
        &self,
        entries: Vec<QuarantinedEvent>,
        events: &[(QueuedEvent, bool)],
        wall_ms: i64,
    ) -> Result<()> {
        let cutoff = wall_ms.saturating_sub(self.params.quarantine_retention_ms as i64);
        let max = self.params.quarantine_max_events;
        // Under the spill lock, so `persist()` cannot copy one of these events meanwhile.
        let _guard = self.spill_lock.lock();
        let (memory, mut from_queue) = seqs_by_origin(events);
        // Memory events `persist()` copied to the store leave the queue in the same
        // transaction as their dead letters are written.
        from_queue.extend(self.memory().persisted_of(&memory));
        let evicted = match &self.store {
            Some(store) => {
                // Dead letters the store refused before go with these.
                let mut all = lock(&self.memory_quarantine).take(&Selector::All);
                all.extend(entries);
                match store.with_quarantine_moving(&from_queue, |q| q.add(&all, max, cutoff)) {
                    Ok(evicted) => evicted,
                    Err(e) => {
                        // The store refused them (a full disk): they wait in memory as dead
                        // letters, are written by the next quarantine or persist() that
                        // succeeds, and count as quarantined meanwhile, so the batch is not
                        // sent again and again; its rows leave the queue with its
                        // acknowledgement.
                        tracing::warn!(error = %e, events = all.len(), "the store refused dead letters; kept in memory");
                        self.counters.store_errors.fetch_add(1, Ordering::Relaxed);
                        lock(&self.memory_quarantine).add(all, max, cutoff)
                    }
                }
            }
            None => lock(&self.memory_quarantine).add(entries, max, cutoff),
        };
        self.counters.drop(DropReason::QuarantineCap, evicted.cap);
        self.counters
            .drop(DropReason::QuarantineExpired, evicted.expired);
        Ok(())
    }

    /// Moves quarantined events back to the queue with their original `event_id`, new seqs
    /// from `next_seq` and acceptance `wall_ms`; counts them `redriven`.
    pub fn redrive(
        &self,
        selector: &Selector,
        wall_ms: i64,
        mut next_seq: impl FnMut() -> u64,
    ) -> Result<u64> {
        // The store first: if it refuses, nothing was redriven.
        let stored = match &self.store {
            Some(store) => {
                let _guard = self.spill_lock.lock();
                let n = store.redrive(selector, wall_ms, &mut next_seq)?;
                // Counted before the lock goes, so the worker cannot deliver them first and
                // take `pending` below zero.
                self.counters.entered(Entry::Redriven, n);
                n
            }
            None => 0,
        };
        Ok(stored + self.redrive_from_memory(selector, wall_ms, &mut next_seq)?)
    }

    /// Redrives the dead letters memory holds (a memory-only spool's, or those the store
    /// refused) into the memory queue.
    fn redrive_from_memory(
        &self,
        selector: &Selector,
        wall_ms: i64,
        next_seq: &mut impl FnMut() -> u64,
    ) -> Result<u64> {
        let taken = lock(&self.memory_quarantine).take(selector);
        let n = taken.len() as u64;
        self.counters.entered(Entry::Redriven, n);
        for q in taken {
            let id = EventId::parse(&q.event_id)?;
            let event = QueuedEvent {
                ts_ms: q.ts_ms,
                seq: next_seq(),
                id,
                json: q.body.into_boxed_str(),
                // A new acceptance with a fresh send budget (see `Store::redrive`).
                accepted_ms: wall_ms,
                sends: q.sends,
                unanswered: 0,
                critical: false,
                sealed: Default::default(),
            };
            let overflow = self
                .memory()
                .push(event, self.capacity(), self.store.is_some());
            self.counters
                .drop(DropReason::MemoryOverflow, overflow.dropped);
        }
        Ok(n)
    }

    /// The first free seq of the store (an operator's redrive continues from it).
    pub fn store_next_seq(&self) -> Result<u64> {
        match &self.store {
            Some(store) => store.next_seq(),
            None => Ok(1),
        }
    }

    /// Quarantined events, oldest first (those the store refused, held in memory, last).
    pub fn quarantine_list(&self, filter: &ListFilter) -> Result<Vec<QuarantinedEvent>> {
        let held = lock(&self.memory_quarantine).list(filter);
        match &self.store {
            Some(store) => {
                let mut listed = store.with_quarantine(|q| q.list(filter))?;
                listed.extend(held);
                Ok(listed)
            }
            None => Ok(held),
        }
    }

    pub fn quarantine_get(&self, event_id: &str) -> Result<Option<QuarantinedEvent>> {
        if let Some(held) = lock(&self.memory_quarantine).get(event_id) {
            return Ok(Some(held));
        }
        match &self.store {
            Some(store) => store.with_quarantine(|q| q.get(event_id)),
            None => Ok(None),
        }
    }

    /// Deletes quarantined events for good. Returns how many.
    pub fn quarantine_purge(&self, selector: &Selector) -> Result<u64> {
        // The store first: if it refuses, nothing was purged.
        let stored = match &self.store {
            Some(store) => store.with_quarantine(|q| q.purge(selector))?,
            None => 0,
        };
        Ok(stored + lock(&self.memory_quarantine).take(selector).len() as u64)
    }

    /// Writes the dead letters the store refused before (held in memory) when it takes them
    /// now; the caller holds the spill lock.
    pub(super) fn write_held_dead_letters(&self, store: &Store) {
        let held = lock(&self.memory_quarantine).take(&Selector::All);
        if held.is_empty() {
            return;
        }
        let max = self.params.quarantine_max_events;
        // The age limit is applied by the next regular quarantine write, which knows the clock.
        match store.with_quarantine(|q| q.add(&held, max, i64::MIN)) {
            Ok(evicted) => {
                self.counters.drop(DropReason::QuarantineCap, evicted.cap);
            }
            Err(_) => {
                lock(&self.memory_quarantine).add(held, u64::MAX, i64::MIN);
            }
        }
    }
}
