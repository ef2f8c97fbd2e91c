//! The in-memory queue `track()` writes to. Events are kept sorted by delivery order
//! (timestamp, then track order), so callers that pass shuffled timestamps still get ordered
//! batches, and the overflow that moves to disk is always the oldest.

use std::collections::{BTreeMap, VecDeque};

use super::ordered::Ordered;
use crate::event::{EventId, OrderKey, QueuedEvent, SendNote};

/// The spill queue holds at most `max(memory_capacity, SPILL_BACKLOG_MIN)` events. A burst faster
/// than SQLite can commit (hundreds of thousands of events a second) is absorbed up to there;
/// past it the oldest are dropped and counted (`memory_overflow`) rather than making `track()`
/// wait on the disk. Bulk importers that must not drop use `durability = always`.
pub const SPILL_BACKLOG_MIN: usize = 10_000;

/// How many events the spill backlog holds at most beside a queue of `capacity`.
pub fn spill_backlog_ceiling(capacity: usize) -> usize {
    capacity.max(SPILL_BACKLOG_MIN)
}

#[derive(Default)]
pub struct MemoryBuffer {
    /// Waiting to be sent, in delivery order.
    queued: Ordered,
    /// Overflow handed to the spiller, oldest first; not yet in the store. The delivery worker
    /// reads it as part of memory (see [`MemoryBuffer::peek`]), so a batch never waits for the
    /// whole spill backlog to be written first.
    /// A ring buffer: the fold appends at the back while the spill takes chunks off the front,
    /// each in time proportional to the chunk, however long the backlog.
    spill: VecDeque<QueuedEvent>,
    /// False once an event older than the last one joined `spill` (only callers that pass
    /// their own timestamps do that); it is sorted again before anyone relies on its order.
    spill_unsorted: bool,
    /// The inbox's other half (see [`super::Queue`]'s fold): empty, with the room a fold needed.
    pub inbox_spare: Vec<QueuedEvent>,
    /// Events of the batch being sent that came from memory, by seq. `persisted` marks those
    /// `persist()` wrote to the store meanwhile as leased rows: from then on the store holds
    /// (and counts) them, this copy is only the batch's, and the acknowledgement deletes the row.
    in_flight: BTreeMap<u64, (QueuedEvent, bool)>,
}

/// What an insert displaced.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Overflow {
    /// Oldest events dropped because memory was full and could not spill (counted by the caller).
    pub dropped: u64,
    /// True when the spill queue went from empty to non-empty: the spiller should wake.
    pub spill_started: bool,
}

impl MemoryBuffer {
    /// Adds an event and enforces `capacity`: with a store the oldest move to the spill queue
    /// (itself bounded, see [`SPILL_BACKLOG_MIN`]); without one they drop.
    pub fn push(&mut self, event: QueuedEvent, capacity: usize, spill_enabled: bool) -> Overflow {
        self.queued.insert(event);
        self.enforce_ceiling(capacity, spill_enabled)
    }

    /// [`MemoryBuffer::push`] for many events at once (the inbox, when it is folded in): memory
    /// keeps the same events as if they came one by one (the ones evicted last), and past the
    /// spill backlog's ceiling the oldest of all are dropped. Events that sort after everything
    /// queued (a fold of `track()` calls) are appended, and the oldest leave from the front.
    /// `events` is left empty, with its room.
    pub fn push_many(
        &mut self,
        events: &mut Vec<QueuedEvent>,
        capacity: usize,
        spill_enabled: bool,
    ) -> Overflow {
        self.queued.insert_many(events);
        self.enforce_ceiling(capacity, spill_enabled)
    }

    /// Enforces `capacity`, then the spill backlog's ceiling: past it the oldest of all are
    /// dropped (counted by the caller).
    fn enforce_ceiling(&mut self, capacity: usize, spill_enabled: bool) -> Overflow {
        let mut overflow = self.enforce(capacity, spill_enabled);
        let ceiling = spill_backlog_ceiling(capacity);
        if self.spill.len() > ceiling {
            self.sort_spill();
            let excess = self.spill.len() - ceiling;
            // The oldest normal events go first; critical ones only when nothing else is left.
            // Sorted, the critical ones lead (their lane sorts first) and the oldest normal ones
            // follow them: one range, removed without walking the backlog. A `retain` over the
            // backlog made each `track()` at the ceiling cost a pass over its 10,000 events.
            let critical = self.spill.partition_point(|e| e.critical);
            let normal = excess.min(self.spill.len() - critical);
            self.spill.drain(critical..critical + normal);
            self.spill.drain(..excess - normal);
            overflow.dropped += excess as u64;
        }
        overflow
    }

    /// Moves the oldest past `capacity` to the spill queue, or drops them without a store.
    fn enforce(&mut self, capacity: usize, spill_enabled: bool) -> Overflow {
        let mut overflow = Overflow::default();
        let excess = self.queued.len().saturating_sub(capacity);
        if spill_enabled {
            overflow.spill_started = excess > 0 && self.spill.is_empty();
            self.spill.reserve(excess);
            for oldest in self.queued.evict(excess) {
                append_spill(&mut self.spill, &mut self.spill_unsorted, oldest);
            }
        } else {
            overflow.dropped = self.queued.evict(excess).count() as u64;
        }
        overflow
    }

    /// How many events memory can take now without dropping any: the room left in the queue
    /// (`capacity`) plus the room left in the spill backlog.
    pub fn room(&self, capacity: usize) -> usize {
        let ceiling = spill_backlog_ceiling(capacity);
        capacity.saturating_sub(self.queued.len()) + ceiling.saturating_sub(self.spill.len())
    }

    /// Adds the events of one `track_batch` call that its caller made room for (see
    /// [`MemoryBuffer::room`]): like [`MemoryBuffer::push`], but the spill backlog may pass its
    /// ceiling by what other threads added meanwhile rather than drop part of the batch.
    /// Returns true when the spiller should wake.
    pub fn push_batch(&mut self, mut events: Vec<QueuedEvent>, capacity: usize) -> bool {
        self.queued.insert_many(&mut events);
        self.enforce(capacity, true).spill_started
    }

    /// Adds straight to the spill queue (durability `always`).
    pub fn push_spill(&mut self, event: QueuedEvent) -> bool {
        let started = self.spill.is_empty();
        append_spill(&mut self.spill, &mut self.spill_unsorted, event);
        started
    }

    fn sort_spill(&mut self) {
        if self.spill_unsorted {
            self.spill
                .make_contiguous()
                .sort_unstable_by_key(QueuedEvent::key);
            self.spill_unsorted = false;
        }
    }

    /// Takes up to `max` of the oldest events waiting to spill.
    pub fn take_spill(&mut self, max: usize) -> Vec<QueuedEvent> {
        if max >= self.spill.len() {
            self.spill_unsorted = false;
            return std::mem::take(&mut self.spill).into();
        }
        self.sort_spill();
        self.spill.drain(..max).collect()
    }

    pub fn spill_len(&self) -> usize {
        self.spill.len()
    }

    /// Puts back a spill that the store refused, ahead of newer overflow.
    pub fn return_spill(&mut self, events: Vec<QueuedEvent>) {
        let mut events = VecDeque::from(events);
        events.append(&mut self.spill);
        self.spill = events;
        self.spill_unsorted = true;
    }

    /// Everything waiting for the store and not in flight (new events and those a full disk
    /// refused before): what one `durability = always` commit writes, and what `persist()`
    /// moves.
    pub fn take_unstored(&mut self) -> Vec<QueuedEvent> {
        let mut events: Vec<QueuedEvent> = std::mem::take(&mut self.spill).into();
        self.spill_unsorted = false;
        events.extend(self.queued.take_all());
        events
    }

    /// `durability = always`: keeps events the store refused in the queue, where the worker
    /// delivers them while the disk stays full (their callers were told `NotDurable`), at most
    /// `max` of them; the oldest beyond that are dropped and their count returned
    /// (`memory_overflow`).
    pub fn keep_refused(&mut self, mut events: Vec<QueuedEvent>, max: usize) -> u64 {
        self.queued.insert_many(&mut events);
        let excess = self.queued.len().saturating_sub(max);
        self.queued.evict(excess).count() as u64
    }

    /// Everything not yet in the store, for `persist()`: the queue and spill are moved out
    /// (first), the in-flight events are copied and marked persisted (second). The caller
    /// writes the copies as leased rows, so nothing (eviction, expiry, `purge_pending()`, the
    /// next batch) touches them until the batch is answered.
    pub fn take_for_persist(&mut self) -> (Vec<QueuedEvent>, Vec<QueuedEvent>) {
        let moved = self.take_unstored();
        let mut copies = Vec::new();
        for (event, persisted) in self.in_flight.values_mut() {
            if !*persisted {
                *persisted = true;
                copies.push(event.clone());
            }
        }
        (moved, copies)
    }

    /// Which of these in-flight events `persist()` copied to the store.
    pub fn persisted_of(&self, seqs: &[u64]) -> Vec<u64> {
        seqs.iter()
            .copied()
            .filter(|seq| {
                self.in_flight
                    .get(seq)
                    .is_some_and(|(_, persisted)| *persisted)
            })
            .collect()
    }

    /// Undoes the mark of [`MemoryBuffer::take_for_persist`] when the store write failed.
    pub fn unmark_persisted(&mut self, seqs: &[u64]) {
        for seq in seqs {
            if let Some((_, persisted)) = self.in_flight.get_mut(seq) {
                *persisted = false;
            }
        }
    }

    /// The first `limit` events in memory in delivery order, without removing them: the queued
    /// ones, and with `with_spill` those waiting to spill too.
    pub fn peek(&mut self, limit: usize, with_spill: bool) -> impl Iterator<Item = &QueuedEvent> {
        self.sort_spill();
        let mut queued = self.queued.iter().peekable();
        let spill: &[QueuedEvent] = if with_spill {
            self.spill.make_contiguous()
        } else {
            &[]
        };
        let mut spill = spill.iter().peekable();
        std::iter::from_fn(move || match (queued.peek(), spill.peek()) {
            (Some(q), Some(s)) if s.key() < q.key() => spill.next(),
            (Some(_), _) => queued.next(),
            (None, _) => spill.next(),
        })
        .take(limit)
    }

    /// Moves these events (queued or waiting to spill) into the in-flight set.
    /// Returns the seqs of those it found. The caller already holds copies to send.
    pub fn lease(&mut self, keys: &[OrderKey]) -> Vec<u64> {
        let mut out = Vec::with_capacity(keys.len());
        let mut in_spill = Vec::new();
        for key in keys {
            match self.queued.remove(key) {
                Some(event) => out.push(event),
                None => in_spill.push(*key),
            }
        }
        if !in_spill.is_empty() {
            in_spill.sort_unstable();
            let (leased, kept): (VecDeque<_>, VecDeque<_>) = std::mem::take(&mut self.spill)
                .into_iter()
                .partition(|e| in_spill.binary_search(&e.key()).is_ok());
            self.spill = kept;
            out.extend(leased);
        }
        out.into_iter()
            .map(|event| {
                let seq = event.seq;
                self.in_flight.insert(seq, (event, false));
                seq
            })
            .collect()
    }

    /// Returns in-flight events to the queue (the attempt failed or was abandoned).
    /// Events `persist()` copied to the store meanwhile are not returned: the store has them.
    pub fn release(&mut self, seqs: &[u64]) {
        let mut back: Vec<QueuedEvent> = seqs
            .iter()
            .filter_map(|seq| match self.in_flight.remove(seq) {
                Some((event, false)) => Some(event),
                _ => None,
            })
            .collect();
        self.queued.insert_many(&mut back);
    }

    /// Returns every in-flight event to the queue (the worker restarted).
    pub fn release_all(&mut self) {
        let seqs: Vec<u64> = self.in_flight.keys().copied().collect();
        self.release(&seqs);
    }

    /// Forgets acknowledged in-flight events; returns the seqs the store also holds.
    pub fn acknowledge(&mut self, seqs: &[u64]) -> Vec<u64> {
        seqs.iter()
            .filter_map(|seq| match self.in_flight.remove(seq) {
                Some((_, true)) => Some(*seq),
                _ => None,
            })
            .collect()
    }

    /// Drops events in memory (queued or waiting to spill) accepted before `cutoff_ms`; returns
    /// their ids. Acceptance is not the delivery order, so both queues are scanned; they are
    /// bounded (`memory_capacity`, [`SPILL_BACKLOG_MIN`]), and the scan costs far less than the
    /// batch it precedes.
    pub fn expire(&mut self, cutoff_ms: i64) -> Vec<EventId> {
        let mut gone = Vec::new();
        let mut keep = |e: &QueuedEvent| {
            let fresh = e.accepted_ms >= cutoff_ms;
            if !fresh {
                gone.push(e.id);
            }
            fresh
        };
        self.queued.retain(|e| keep(e));
        self.spill.retain(|e| keep(e));
        gone
    }

    /// Applies a send's bookkeeping to in-flight events; returns the seqs of those `persist()`
    /// copied to the store meanwhile, whose rows need the same change.
    pub fn note_sends(&mut self, seqs: &[u64], note: SendNote) -> Vec<u64> {
        let mut persisted = Vec::new();
        for seq in seqs {
            if let Some((event, copied)) = self.in_flight.get_mut(seq) {
                note.apply(event);
                if *copied {
                    persisted.push(*seq);
                }
            }
        }
        persisted
    }

    /// Empties the queue and spill (opt-out purge); returns how many were removed.
    pub fn clear(&mut self) -> u64 {
        let n = self.queued.len() + self.spill.len();
        self.queued.clear();
        self.spill.clear();
        self.spill_unsorted = false;
        n as u64
    }

    /// The seqs of the events in flight.
    pub fn in_flight_seqs(&self) -> impl Iterator<Item = u64> + '_ {
        self.in_flight.keys().copied()
    }

    /// Forgets the in-flight events, `but` those (a denial deleting what the worker holds, but
    /// the request on the wire); a later release of them finds nothing. Returns how many of
    /// them memory held alone (the store counts the rows it deletes of the others).
    pub fn forget_in_flight(&mut self, but: &[u64]) -> u64 {
        let mut alone = 0;
        self.in_flight.retain(|seq, (_, persisted)| {
            let keep = but.contains(seq);
            if !keep && !*persisted {
                alone += 1;
            }
            keep
        });
        alone
    }

    /// Events queued or waiting to spill (not those in flight).
    pub fn held(&self) -> usize {
        self.queued.len() + self.spill.len()
    }

    /// The ids of the in-flight events memory counts (those the store does not hold).
    #[cfg(test)]
    pub fn in_flight_ids(&self) -> Vec<String> {
        self.in_flight
            .values()
            .filter(|(_, persisted)| !*persisted)
            .map(|(e, _)| e.id.to_string())
            .collect()
    }

    #[cfg(test)]
    pub fn queued_len(&self) -> usize {
        self.queued.len()
    }

    /// Events memory holds: queued, waiting to spill, and in flight unless the store holds them.
    pub fn len(&self) -> usize {
        let persisted = self.in_flight.values().filter(|(_, p)| *p).count();
        self.queued.len() + self.spill.len() + self.in_flight.len() - persisted
    }
}

/// Appends to the spill queue, marking it unsorted when `event` sorts before its last one.
/// (On the fields, not on `MemoryBuffer`, so it can run while the memory queue is borrowed.)
fn append_spill(spill: &mut VecDeque<QueuedEvent>, unsorted: &mut bool, event: QueuedEvent) {
    if spill.back().is_some_and(|last| event.key() < last.key()) {
        *unsorted = true;
    }
    spill.push_back(event);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::LANE_NORMAL;

    /// Timestamp and seq: the order within a lane.
    fn ts_seq(e: &QueuedEvent) -> (i64, u64) {
        (e.ts_ms, e.seq)
    }

    fn ev(ts: i64, seq: u64) -> QueuedEvent {
        super::super::ordered::test_event(ts, seq, false)
    }

    /// Past the spill backlog's ceiling the oldest normal events are dropped, critical ones
    /// only once no normal one is left, and what stays keeps its order.
    #[test]
    fn past_the_ceiling_the_oldest_normal_events_go_and_critical_ones_stay() {
        let capacity = 1;
        let ceiling = SPILL_BACKLOG_MIN;
        let mut b = MemoryBuffer::default();
        let critical = |ts, seq| super::super::ordered::test_event(ts, seq, true);
        // Three critical events among the oldest, then normal ones up to the ceiling.
        let mut seq = 0;
        for ts in 0..(ceiling + capacity) as i64 {
            seq += 1;
            let e = if ts % 1_000 == 0 && ts < 3_000 {
                critical(ts, seq)
            } else {
                ev(ts, seq)
            };
            assert_eq!(b.push(e, capacity, true).dropped, 0);
        }
        // Five more: the five oldest normal events go.
        let mut dropped = 0;
        for ts in 0..5 {
            seq += 1;
            dropped += b.push(ev(1_000_000 + ts, seq), capacity, true).dropped;
        }
        assert_eq!(dropped, 5);
        let spill = b.take_spill(usize::MAX);
        assert_eq!(spill.len(), ceiling);
        // Memory's queue keeps critical events before normal ones; the spill backlog the rest.
        let mut crit: Vec<i64> = spill
            .iter()
            .chain(b.queued.iter())
            .filter(|e| e.critical)
            .map(|e| e.ts_ms)
            .collect();
        crit.sort_unstable();
        assert_eq!(crit, [0, 1_000, 2_000], "critical events stay");
        let first_normal: Vec<i64> = spill
            .iter()
            .filter(|e| !e.critical)
            .take(3)
            .map(|e| e.ts_ms)
            .collect();
        assert_eq!(
            first_normal,
            [6, 7, 8],
            "the five oldest normal ones (1 to 5) went"
        );
        assert!(
            spill.windows(2).all(|w| w[0].key() < w[1].key()),
            "in delivery order"
        );
    }

    #[test]
    fn keeps_delivery_order_and_spills_the_oldest() {
        let mut b = MemoryBuffer::default();
        for (ts, seq) in [(30, 1), (10, 2), (20, 3), (10, 4)] {
            b.push(ev(ts, seq), 3, true);
        }
        let spilled = b.take_spill(usize::MAX);
        assert_eq!(spilled.iter().map(ts_seq).collect::<Vec<_>>(), [(10, 2)]);
        let order: Vec<_> = b.peek(10, true).map(ts_seq).collect();
        assert_eq!(order, [(10, 4), (20, 3), (30, 1)]);
    }

    #[test]
    fn memory_only_overflow_is_counted() {
        let mut b = MemoryBuffer::default();
        let dropped: u64 = (0..10)
            .map(|i| b.push(ev(i, i as u64), 4, false).dropped)
            .sum();
        assert_eq!(dropped, 6);
        assert_eq!(b.len(), 4);
    }

    #[test]
    fn events_waiting_to_spill_are_read_and_leased_in_order_with_the_queue() {
        let mut b = MemoryBuffer::default();
        // Capacity 2: each push past it moves the oldest queued event to the spill queue, which
        // ends up holding (5,1), (1,3), (3,5), (7,4) in that (unsorted) order; (8,6) and (9,2)
        // stay queued.
        for (ts, seq) in [(5, 1), (9, 2), (1, 3), (7, 4), (3, 5), (8, 6)] {
            b.push(ev(ts, seq), 2, true);
        }
        assert_eq!(b.spill_len(), 4);
        let order: Vec<_> = b.peek(10, true).map(ts_seq).collect();
        assert_eq!(order, [(1, 3), (3, 5), (5, 1), (7, 4), (8, 6), (9, 2)]);
        assert_eq!(b.peek(2, true).count(), 2);
        // A batch may take events straight from the spill queue: they leave it.
        assert_eq!(
            b.lease(&[(LANE_NORMAL, 1, 3), (LANE_NORMAL, 7, 4)]).len(),
            2
        );
        assert_eq!(b.spill_len(), 2);
        // The spiller takes the oldest first, a bounded number at a time.
        let first: Vec<_> = b.take_spill(1).iter().map(ts_seq).collect();
        assert_eq!(first, [(3, 5)]);
        // A released event returns to the queue; expiry reaches the spill queue too: (1,3) and
        // (8,6) queued, (5,1) waiting to spill; the in-flight (7,4) is not touched.
        b.release(&[3]);
        assert_eq!(b.expire(9).len(), 3);
        let left: Vec<_> = b.peek(10, true).map(ts_seq).collect();
        assert_eq!(left, [(9, 2)]);
        assert_eq!(b.len(), 2, "(9,2) and the in-flight (7,4)");
    }

    #[test]
    fn lease_release_and_acknowledge() {
        let mut b = MemoryBuffer::default();
        for i in 0..4 {
            b.push(ev(i, i as u64), 10, true);
        }
        let leased = b.lease(&[(LANE_NORMAL, 0, 0), (LANE_NORMAL, 1, 1)]);
        assert_eq!(leased.len(), 2);
        assert_eq!(b.queued_len(), 2);
        let (moved, copies) = b.take_for_persist();
        assert_eq!(
            (moved.len(), copies.len()),
            (2, 2),
            "queued two plus in-flight two"
        );
        assert_eq!(
            b.acknowledge(&[0]),
            vec![0],
            "persisted in-flight events must be deleted from the store"
        );
        b.release(&[1]);
        assert_eq!(
            b.queued_len(),
            0,
            "a persisted event is not returned to memory"
        );
    }

    #[test]
    fn refused_events_stay_readable_and_bounded() {
        let mut b = MemoryBuffer::default();
        for i in 0..6 {
            b.push_spill(ev(i, i as u64));
        }
        let events = b.take_unstored();
        assert_eq!(events.len(), 6);
        assert_eq!(b.keep_refused(events, 4), 2, "the two oldest go");
        let order: Vec<_> = b.peek(10, false).map(ts_seq).collect();
        assert_eq!(order, [(2, 2), (3, 3), (4, 4), (5, 5)]);
        b.push_spill(ev(9, 9));
        assert_eq!(
            b.take_unstored().len(),
            5,
            "refused events are retried with new ones"
        );
    }

    #[test]
    fn expire_drops_only_older_events() {
        let mut b = MemoryBuffer::default();
        for i in 0..5 {
            b.push(ev(i * 10, i as u64), 10, true);
        }
        assert_eq!(b.expire(25).len(), 3);
        assert_eq!(b.queued_len(), 2);
    }

    /// A fold of many events at once keeps in memory and spills the same events as pushing
    /// them one by one, critical ones included (evicted last), with shuffled timestamps.
    #[test]
    fn a_bulk_fold_keeps_and_spills_what_single_pushes_would() {
        let events: Vec<QueuedEvent> = (0..500u64)
            .map(|i| QueuedEvent {
                critical: i % 37 == 0,
                ..ev(((i * 7919) % 503) as i64, i + 1)
            })
            .collect();
        let (mut one, mut bulk) = (MemoryBuffer::default(), MemoryBuffer::default());
        for e in events.clone() {
            one.push(e, 100, true);
        }
        bulk.push(ev(1_000, 10_000), 100, true);
        one.push(ev(1_000, 10_000), 100, true);
        let overflow = bulk.push_many(&mut events.clone(), 100, true);
        assert!(overflow.spill_started);
        let kept = |b: &MemoryBuffer| b.queued.iter().map(QueuedEvent::key).collect::<Vec<_>>();
        let spilled = |b: &mut MemoryBuffer| {
            let mut v: Vec<_> = b.take_spill(usize::MAX).iter().map(ts_seq).collect();
            v.sort_unstable();
            v
        };
        assert_eq!(kept(&bulk).len(), 100);
        assert_eq!(kept(&bulk), kept(&one));
        assert_eq!(spilled(&mut bulk), spilled(&mut one));
        assert!(
            bulk.queued.iter().filter(|e| e.critical).count() >= 13,
            "critical events stay in memory while normal ones can go"
        );
    }
}
