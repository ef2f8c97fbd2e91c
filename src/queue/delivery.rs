//! The delivery worker's side of the queue: the next batch in delivery order from memory and
//! the store together, and the answers for it (acknowledged, released, sends noted, expired).
//! Separate from `mod.rs` because these are the only calls the worker makes on the queue, and
//! each of them handles a batch's events where each one came from ([`seqs_by_origin`]).

use super::Queue;
use crate::config::Durability;
use crate::error::Result;
use crate::event::{EventId, QueuedEvent, SendNote};
use crate::stats::{DropReason, Exit};

impl Queue {
    /// The next batch in delivery order from memory and store together: at most `limit`
    /// events and `room` bytes (each event's size plus its comma; the first event is always
    /// taken, so a limit learned below one event still sends). Each event comes with whether
    /// it was read from the store; all of them are leased until [`Queue::ack`] or
    /// [`Queue::release`].
    pub fn next_batch(&self, limit: usize, room: u64) -> Vec<(QueuedEvent, bool)> {
        // Held while the batch is picked, so a spill in progress (events in neither memory nor
        // the store yet) finishes first. Events still waiting to spill are read from memory,
        // except with `durability = always`: there a caller is waiting for them to reach the
        // disk, so they are committed first and read from the store.
        let _guard = self.spill_lock.lock();
        let always = self.params.durability == Durability::Always;
        // A durable caller's events are written before a batch could take them from memory.
        if (always || self.durable_waiting())
            && let Err(e) = self.spill_locked()
        {
            tracing::warn!(error = %e, "spill before batch failed; sending what is stored");
        }
        let from_store = match &self.store {
            Some(store) => {
                let events = store.oldest(limit).unwrap_or_else(|e| {
                    tracing::warn!(error = %e, "reading the store failed; sending from memory");
                    Vec::new()
                });
                let undecryptable = store.take_undecryptable();
                self.counters
                    .left(Exit::Quarantined, undecryptable.quarantined);
                self.counters
                    .drop(DropReason::QuarantineCap, undecryptable.evicted);
                events
            }
            None => Vec::new(),
        };
        let mut memory = self.memory();
        let mut picked: Vec<(QueuedEvent, bool)> = Vec::new();
        let mut memory_keys = Vec::new();
        let mut bytes = 0u64;
        {
            let mut disk = from_store.into_iter().peekable();
            let mut in_memory = memory.peek(limit, !always).peekable();
            while picked.len() < limit {
                let take_disk = match (disk.peek(), in_memory.peek()) {
                    (Some(d), Some(m)) => d.key() <= m.key(),
                    (Some(_), None) => true,
                    (None, Some(_)) => false,
                    (None, None) => break,
                };
                let size = if take_disk {
                    disk.peek().map(QueuedEvent::bytes)
                } else {
                    in_memory.peek().map(|m| m.bytes())
                };
                let size = size.unwrap_or(0) + 1;
                if !fits(picked.len(), bytes, size, room) {
                    break;
                }
                bytes += size;
                if take_disk {
                    if let Some(event) = disk.next() {
                        picked.push((event, true));
                    }
                } else if let Some(event) = in_memory.next() {
                    memory_keys.push(event.key());
                    picked.push((event.clone(), false));
                }
            }
        }
        if picked.is_empty() {
            // Nothing more to send: the acknowledged rows' deletes wait for no later batch.
            if let Some(store) = &self.store {
                store.settle();
            }
            return picked;
        }
        memory.lease(&memory_keys);
        drop(memory);
        if let Some(store) = &self.store {
            store.lease(&seqs_by_origin(&picked).1);
        }
        picked
    }

    /// What [`Queue::next_batch`] would take now, when it can be told without taking it: memory
    /// holds nothing to send and the store's read ahead holds the next rows (a drain of a stored
    /// backlog). `f` sees those events; `None` otherwise. Takes nothing and writes nothing.
    pub fn next_batch_ahead<T>(
        &self,
        limit: usize,
        room: u64,
        f: impl FnOnce(&[QueuedEvent]) -> T,
    ) -> Option<T> {
        let store = self.store.as_ref()?;
        let _guard = self.spill_lock.lock();
        if self.memory().held() > 0 || self.durable_waiting() {
            return None;
        }
        store.with_read_ahead(limit, |rows| {
            let (mut taken, mut bytes) = (0, 0);
            for event in rows.iter().take(limit) {
                let size = event.bytes() + 1;
                if !fits(taken, bytes, size, room) {
                    break;
                }
                (taken, bytes) = (taken + 1, bytes + size);
            }
            f(&rows[..taken])
        })
    }

    /// Takes events out of the queue after the collector answered for them (delivered or
    /// quarantined): from the store, and from the in-flight set in memory.
    pub fn ack(&self, events: &[(QueuedEvent, bool)]) -> Result<()> {
        self.take_out(events, false)
    }

    /// Takes a delivered batch's events out of the queue like [`Queue::ack`], but its rows in
    /// the store are deleted later ([`Store::delete_later`]): by [`Queue::settle`] while the
    /// next request is on the wire, or before the worker waits.
    ///
    /// [`Store::delete_later`]: super::store::Store::delete_later
    pub fn delivered(&self, events: &[(QueuedEvent, bool)]) -> Result<()> {
        self.take_out(events, true)
    }

    /// [`Queue::ack`] and [`Queue::delivered`]: out of memory's in-flight set now, out of the
    /// store now or, with `later`, by a later commit.
    fn take_out(&self, events: &[(QueuedEvent, bool)], later: bool) -> Result<()> {
        let _guard = self.spill_lock.lock();
        self.forget_spared(events.iter().map(|(e, _)| e.seq));
        let (memory, mut on_disk) = seqs_by_origin(events);
        on_disk.extend(self.memory().acknowledge(&memory));
        match &self.store {
            Some(store) if !on_disk.is_empty() => match later {
                true => store.delete_later(&on_disk),
                false => store.delete(&on_disk).map(drop),
            },
            _ => Ok(()),
        }
    }

    /// Commits the deletes [`Queue::delivered`] left for later: the worker calls it while the
    /// next request is on the wire and before it waits, so an idle spool keeps no delivered
    /// row on disk.
    pub fn settle(&self) {
        if let Some(store) = &self.store {
            store.settle();
        }
    }

    /// The store's work while a batch is on the wire: reads the next `limit` rows, for the
    /// next [`Queue::next_batch`] to take if nothing changes before it (store/read_ahead.rs),
    /// then deletes what the last answer delivered. With `record_next` (the next request
    /// follows the answer at once), the same commit records the rows read as the ones the
    /// next send counts (store/in_flight.rs): that send then has nothing to write between the
    /// answer and its request.
    pub fn beside_the_request(&self, limit: usize, record_next: bool) {
        if let Some(store) = &self.store {
            store.read_ahead(limit);
            if record_next {
                store.settle_recording_ahead();
            } else {
                store.settle();
            }
        }
    }

    /// Gives events of an unanswered batch back to the queue, each to where it came from.
    pub fn release(&self, events: &[(QueuedEvent, bool)]) {
        let _guard = self.spill_lock.lock();
        let events = self.discard_spared(events);
        let (memory, on_disk) = seqs_by_origin(&events);
        self.memory().release(&memory);
        if let Some(store) = &self.store {
            store.release(&on_disk);
            // Memory events `persist()` wrote as leased rows meanwhile now queue in the store.
            store.release(&memory);
        }
    }

    /// After a restart of the worker (a caught panic), nothing is in flight any more.
    pub fn release_all(&self) {
        let _guard = self.spill_lock.lock();
        self.memory().release_all();
        if let Some(store) = &self.store {
            store.release_all();
        }
    }

    /// Records a send's bookkeeping for a batch's events where each one lives: the in-flight copy
    /// in memory (and its row, when `persist()` copied it there) or its row in the store.
    pub fn note_sends(&self, events: &[(QueuedEvent, bool)], note: SendNote) -> Result<()> {
        let _guard = self.spill_lock.lock();
        let (memory, mut on_disk) = seqs_by_origin(events);
        on_disk.extend(self.memory().note_sends(&memory, note));
        match &self.store {
            Some(store) => store.note_sends(&on_disk, note),
            None => Ok(()),
        }
    }

    /// Takes events of a batch out of the queue because they expired before they could be sent
    /// (again); counts them `expired`.
    pub fn drop_expired(&self, events: &[(QueuedEvent, bool)]) -> Result<()> {
        let _guard = self.spill_lock.lock();
        self.forget_spared(events.iter().map(|(e, _)| e.seq));
        let (memory, mut on_disk) = seqs_by_origin(events);
        on_disk.extend(self.memory().acknowledge(&memory));
        self.counters.drop(DropReason::Expired, events.len() as u64);
        match &self.store {
            Some(store) if !on_disk.is_empty() => store.delete_expired(&on_disk).map(|_| ()),
            _ => Ok(()),
        }
    }

    /// Drops every queued event (not in flight), in memory and in the store, accepted before
    /// `cutoff_ms`; counts them `expired` and returns their ids. The store's first check since
    /// it opened, which reads every row, is left to [`Queue::expire_first_scan`].
    pub fn expire(&self, cutoff_ms: i64) -> Vec<EventId> {
        let mut gone = self.memory().expire(cutoff_ms);
        self.counters.drop(DropReason::Expired, gone.len() as u64);
        if self.store.as_ref().is_some_and(|s| s.oldest_known()) {
            gone.extend(self.expire_stored(cutoff_ms));
        }
        gone
    }

    /// The store's first age check since it opened, when [`Queue::expire`] has not run it. It
    /// reads every row to find the oldest acceptance (no index on it; see
    /// `Store::accepted_floor`): 2-4 ms for 10,000 rows, 10-12 ms for 100,000. Run before the
    /// first batch of a backlog, or while a request was on the wire, it kept the collector
    /// idle that long, so the delivery worker runs it when it has nothing to send. Until then
    /// the machine holds the age limit on every batch it sends, as it does for retries.
    pub fn expire_first_scan(&self, cutoff_ms: i64) -> Vec<EventId> {
        match &self.store {
            Some(store) if !store.oldest_known() => self.expire_stored(cutoff_ms),
            _ => Vec::new(),
        }
    }

    fn expire_stored(&self, cutoff_ms: i64) -> Vec<EventId> {
        let mut gone = Vec::new();
        if let Some(store) = &self.store {
            match store.expire(cutoff_ms) {
                Ok(ids) => {
                    self.counters.drop(DropReason::Expired, ids.len() as u64);
                    gone.extend(ids);
                }
                Err(e) => tracing::warn!(error = %e, "expiring stored events failed"),
            }
        }
        gone
    }
}

/// The seqs of a batch's events, split by where each came from: (memory, store). The flag beside
/// each event says it was read from the store.
pub(super) fn seqs_by_origin(events: &[(QueuedEvent, bool)]) -> (Vec<u64>, Vec<u64>) {
    let (disk, memory): (Vec<_>, Vec<_>) = events.iter().partition(|(_, from_store)| *from_store);
    let seqs = |v: Vec<&(QueuedEvent, bool)>| v.iter().map(|(e, _)| e.seq).collect();
    (seqs(memory), seqs(disk))
}

/// Whether an event of `size` bytes (its JSON and a comma) joins a batch that holds `picked`
/// events of `bytes` so far, under `room`: the first always does, so an event larger than the
/// room still goes (alone), and the collector's answer says what to do with it.
fn fits(picked: usize, bytes: u64, size: u64, room: u64) -> bool {
    picked == 0 || bytes + size <= room
}
