//! Events in delivery order, in a ring buffer.
//!
//! Nearly every event arrives in order: `track()` stamps it with the clock and the next seq, so
//! it sorts after everything already queued, and the oldest leave first (to a batch or to the
//! spill). A ring buffer makes both ends O(1) and moves events with `memcpy`; an ordered map
//! paid a tree insert and a tree removal per event, and rebuilt the tree on every bulk merge,
//! which was a fifth of the spill thread's time. Events that arrive out of order (an importer's
//! timestamps, a batch released after a failed send) are placed by binary search, or merged in
//! one pass when many come at once.

use std::collections::VecDeque;

use crate::event::{LANE_CRITICAL, OrderKey, QueuedEvent};

/// A run of events kept sorted by [`QueuedEvent::key`] (lane, timestamp, seq). Keys are unique:
/// the seq is.
#[derive(Default)]
pub struct Ordered {
    events: VecDeque<QueuedEvent>,
}

impl Ordered {
    pub fn len(&self) -> usize {
        self.events.len()
    }

    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.events.is_empty()
    }

    /// Where `key` is, or would go.
    fn position(&self, key: &OrderKey) -> Result<usize, usize> {
        self.events.binary_search_by(|e| e.key().cmp(key))
    }

    /// Adds one event in its place: O(1) at either end, else a binary search and a move of the
    /// shorter side.
    pub fn insert(&mut self, event: QueuedEvent) {
        let key = event.key();
        match self.events.back() {
            None => self.events.push_back(event),
            Some(last) if last.key() < key => self.events.push_back(event),
            _ => match self.position(&key) {
                Ok(at) => self.events[at] = event,
                Err(at) => self.events.insert(at, event),
            },
        }
    }

    /// Adds many events, leaving `events` empty (with its room): appended when they sort after
    /// everything held (the usual case, a fold of `track()` calls), otherwise sorted and merged
    /// in one pass.
    pub fn insert_many(&mut self, events: &mut Vec<QueuedEvent>) {
        if events.is_empty() {
            return;
        }
        if !events.is_sorted_by_key(QueuedEvent::key) {
            events.sort_unstable_by_key(QueuedEvent::key);
        }
        let first = events[0].key();
        if self.events.back().is_none_or(|last| last.key() < first) {
            self.events.extend(events.drain(..));
            return;
        }
        if events.len() < 8 {
            for event in events.drain(..) {
                self.insert(event);
            }
            return;
        }
        let room = self.events.len() + events.len();
        let old = std::mem::replace(&mut self.events, VecDeque::with_capacity(room));
        let (mut old, mut new) = (old.into_iter().peekable(), events.drain(..).peekable());
        loop {
            let next = match (old.peek(), new.peek()) {
                (Some(a), Some(b)) if b.key() < a.key() => new.next(),
                (Some(_), _) => old.next(),
                (None, _) => new.next(),
            };
            match next {
                Some(event) => self.events.push_back(event),
                None => break,
            }
        }
    }

    /// Critical events at the front (they sort first).
    fn critical_count(&self) -> usize {
        if self
            .events
            .front()
            .is_none_or(|e| e.lane() != LANE_CRITICAL)
        {
            return 0;
        }
        self.events.partition_point(|e| e.lane() == LANE_CRITICAL)
    }

    /// Removes the `n` events that leave memory first when it is full, in that order: the oldest of
    /// the normal lane, then critical ones only when no normal event is left
    /// (docs/critical-lane.md: critical events are evicted last).
    pub fn evict(&mut self, n: usize) -> impl Iterator<Item = QueuedEvent> + '_ {
        let n = n.min(self.events.len());
        let critical = self.critical_count();
        let normal = (self.events.len() - critical).min(n);
        // Taken from the back of the critical run so that, once the normal events are gone,
        // the critical ones left over are still the oldest of their lane.
        let mut from_normal: Vec<QueuedEvent> = Vec::new();
        if critical > 0 && normal > 0 {
            from_normal = self.events.drain(critical..critical + normal).collect();
        }
        let front = if critical == 0 { n } else { n - normal };
        from_normal.into_iter().chain(self.events.drain(..front))
    }

    /// Removes the event with this key.
    pub fn remove(&mut self, key: &OrderKey) -> Option<QueuedEvent> {
        let at = self.position(key).ok()?;
        self.events.remove(at)
    }

    /// In delivery order.
    pub fn iter(&self) -> impl Iterator<Item = &QueuedEvent> {
        self.events.iter()
    }

    pub fn retain(&mut self, keep: impl FnMut(&QueuedEvent) -> bool) {
        self.events.retain(keep);
    }

    /// Empties it, in delivery order.
    pub fn take_all(&mut self) -> impl Iterator<Item = QueuedEvent> + '_ {
        self.events.drain(..)
    }

    pub fn clear(&mut self) {
        self.events.clear();
    }
}

/// An event for the memory queue's tests: timestamp, seq, lane; accepted at its timestamp.
#[cfg(test)]
pub(super) fn test_event(ts: i64, seq: u64, critical: bool) -> QueuedEvent {
    QueuedEvent {
        ts_ms: ts,
        seq,
        id: crate::event::EventId::new(),
        json: "{}".into(),
        accepted_ms: ts,
        sends: 0,
        unanswered: 0,
        critical,
        sealed: Default::default(),
    }
}

#[cfg(test)]
mod tests {
    use super::test_event as ev;
    use super::*;

    fn keys(o: &Ordered) -> Vec<OrderKey> {
        o.iter().map(QueuedEvent::key).collect()
    }

    /// Inserted one at a time, many at a time (in order, shuffled, small and large), and removed
    /// by key, it always holds what a sorted list would.
    #[test]
    fn holds_what_a_sorted_list_would_however_events_arrive() {
        let mut o = Ordered::default();
        let mut model: Vec<OrderKey> = Vec::new();
        let mut seq = 0u64;
        let mut next = |n: usize, spread: i64, step: i64| {
            (0..n)
                .map(|i| {
                    seq += 1;
                    let ts = (seq as i64 * step + (i as i64 * 7_919) % spread.max(1)) % 10_000;
                    ev(ts, seq, seq.is_multiple_of(29))
                })
                .collect::<Vec<_>>()
        };
        for round in 0..40 {
            let batch = match round % 4 {
                0 => next(200, 1, 10),   // in order
                1 => next(3, 500, 1),    // a few, out of order
                2 => next(90, 4_000, 3), // many, shuffled
                _ => next(1, 9_000, 1),  // one
            };
            model.extend(batch.iter().map(QueuedEvent::key));
            if round % 3 == 0 {
                for e in batch {
                    o.insert(e);
                }
            } else {
                o.insert_many(&mut batch.clone());
            }
            model.sort_unstable();
            if round % 5 == 4 {
                let gone = model.remove(model.len() / 2);
                assert_eq!(o.remove(&gone).map(|e| e.key()), Some(gone));
            }
            assert_eq!(keys(&o), model, "round {round}");
        }
    }

    /// Eviction takes the oldest normal events first, critical ones only when no normal one is
    /// left, and leaves the rest in order.
    #[test]
    fn evicts_normal_events_first_then_the_oldest_critical() {
        let mut o = Ordered::default();
        o.insert_many(&mut vec![
            ev(5, 1, true),
            ev(1, 2, false),
            ev(9, 3, true),
            ev(3, 4, false),
            ev(7, 5, false),
        ]);
        let first: Vec<_> = o.evict(2).map(|e| e.seq).collect();
        assert_eq!(first, [2, 4]);
        let next: Vec<_> = o.evict(2).map(|e| e.seq).collect();
        assert_eq!(
            next,
            [5, 1],
            "the last normal one, then the oldest critical"
        );
        assert_eq!(o.iter().map(|e| e.seq).collect::<Vec<_>>(), [3]);
        assert_eq!(o.evict(5).count(), 1);
        assert!(o.is_empty());
    }
}
