//! Recording events: `track()`, `track_event()` and `track_batch()`, from the checks a call
//! passes (the spool accepting, the event valid, the collector's directive) to the queue and
//! the worker's wake-up. Separate because it is the hot path, and the only one that makes
//! events.

use std::sync::atomic::Ordering;

use super::EventSpool;
use crate::config::Durability;
use crate::consent::Consent;
use crate::error::{Error, Result};
use crate::event::{self, EventFields, EventId, NewEvent, Priority, QueuedEvent};
use crate::fleet::Screen;
use crate::stats::{DropReason, Entry};

impl EventSpool {
    /// Records an event now. Never waits on disk or network (except with `durability = always`,
    /// which waits for the shared commit that makes it durable, and returns
    /// [`Error::NotDurable`] with the event's id when the store could not take it).
    pub fn track(&self, name: &str, properties: serde_json::Value) -> Result<EventId> {
        self.track_fields(EventFields::new(name, &properties))
    }

    /// Records an event with any of its optional fields set by the caller. A critical event
    /// ([`Priority::Critical`]) is in the store before this returns, as with `durability =
    /// always` (memory-only spools have no store: it is queued first in memory), and starts a
    /// drain at once (docs/critical-lane.md).
    pub fn track_event(&self, event: NewEvent) -> Result<EventId> {
        self.track_fields(event.fields())
    }

    fn track_fields(&self, event: EventFields<'_>) -> Result<EventId> {
        let critical = event.priority == Priority::Critical;
        let accepted = {
            let _admitted = self.handle.admission.read_recursive();
            self.check_accepting()?;
            let pass = self.durable_pass(critical);
            let queued = self.prepare(event)?;
            let id = queued.id;
            match self.screen(event.name, critical) {
                Screen::Keep => {}
                Screen::Sampled => {
                    self.shared().counters.drop(DropReason::Sampled, 1);
                    return Ok(id);
                }
                Screen::NameDropped => return Err(self.name_dropped(event.name)),
            }
            self.accept(std::iter::once(queued), 1, critical, pass)
                .map(|()| id)
                .map_err(|refusal| Error::NotDurable {
                    event_ids: refusal.event_ids,
                    reason: refusal.reason,
                })
        };
        if critical || self.shared().config.durability == Durability::Always {
            // A refused commit made on this thread is told once the call let go of every lock.
            self.shared().deliver_notices();
        }
        accepted
    }

    /// Records several events, all or none: each is checked first, and the first bad one is
    /// named by its position (1-based) with nothing recorded. One call for many events is what
    /// makes tracking cheap from bindings whose per-call cost dwarfs the SDK's own.
    pub fn track_batch(&self, events: &[NewEvent]) -> Result<Vec<EventId>> {
        let result = {
            let _admitted = self.handle.admission.read_recursive();
            self.track_batch_admitted(events)
        };
        // A store refusal is told once the call let go of every lock (an observer may call
        // shutdown(), which waits for admitted calls).
        self.shared().deliver_notices();
        result
    }

    fn track_batch_admitted(&self, events: &[NewEvent]) -> Result<Vec<EventId>> {
        self.check_accepting()?;
        let prepared = events
            .iter()
            .enumerate()
            .map(|(i, e)| {
                self.prepare(e.fields())
                    .map_err(|err| Error::InvalidEvent(format!("event {}: {err}", i + 1)))
            })
            .collect::<Result<Vec<_>>>()?;
        let ids: Vec<EventId> = prepared.iter().map(|q| q.id).collect();
        // The collector's directives, by the rule `track()` follows: a refused name refuses the
        // call (here the whole batch, naming the event), a sampled event is left out. What is
        // left out is counted only once the batch is recorded: a refused batch records nothing,
        // and its retry must not count the same events twice.
        let mut kept = Vec::with_capacity(prepared.len());
        let mut sampled = 0;
        for (i, (queued, event)) in prepared.into_iter().zip(events).enumerate() {
            match self.screen(&event.name, queued.critical) {
                Screen::Keep => kept.push(queued),
                Screen::Sampled => sampled += 1,
                Screen::NameDropped => {
                    let refused = self.name_dropped(&event.name);
                    return Err(Error::InvalidEvent(format!("event {}: {refused}", i + 1)));
                }
            }
        }
        let recorded = self.record_batch(kept);
        if !matches!(recorded, Err(Error::BatchRefused(_))) {
            self.shared().counters.drop(DropReason::Sampled, sampled);
        }
        recorded.map(|()| ids)
    }

    /// Records what a `track_batch` kept, all or none (`BatchRefused`).
    fn record_batch(&self, prepared: Vec<QueuedEvent>) -> Result<()> {
        let n = prepared.len() as u64;
        let s = self.shared();
        // A batch holding a critical event is committed whole before the call returns.
        let critical = prepared.iter().any(|q| q.critical);
        if s.config.durability == Durability::Spill && !(critical && s.queue.has_store()) {
            if s.queue.has_store() {
                let first = s.queue.push_batch_spilling(prepared)?;
                self.wake_if_due(first);
                return Ok(());
            }
            if n > s.config.memory_capacity {
                return Err(Error::BatchRefused(format!(
                    "{n} events are more than memory_capacity ({}) holds, and without a \
                     db_path there is no store to spill to; split the batch",
                    s.config.memory_capacity
                )));
            }
        }
        match self.accept(prepared, n, critical, None) {
            Ok(()) => Ok(()),
            // Names the events that are only in memory; the others are on disk.
            Err(refusal) => Err(Error::NotDurable {
                event_ids: refusal.event_ids,
                reason: refusal.reason,
            }),
        }
    }

    /// What the collector's directive in force (src/fleet) says of a new event named `name`;
    /// the critical lane is always kept. Counts nothing: the callers count what they record.
    fn screen(&self, name: &str, critical: bool) -> Screen {
        let s = self.shared();
        s.fleet.screen(name, critical, || s.clock.now_ms())
    }

    /// A name `drop_names` refuses, counted (one refusal per call): the error `track()` gives.
    fn name_dropped(&self, name: &str) -> Error {
        self.shared().counters.drop(DropReason::NameDropped, 1);
        Error::InvalidEvent(format!(
            "name {:?} is refused by the collector's drop_names directive",
            event::truncate(name, 64)
        ))
    }

    fn check_accepting(&self) -> Result<()> {
        if self.handle.closed.load(Ordering::Relaxed) {
            return Err(Error::ShutDown);
        }
        if !self.shared().enabled.load(Ordering::Relaxed) {
            return Err(Error::Disabled);
        }
        if Consent::from_u8(self.shared().consent.load(Ordering::SeqCst)) == Consent::Denied {
            return Err(Error::ConsentDenied);
        }
        Ok(())
    }

    /// For one event bound for the store before the call returns (`durability = always`, or
    /// critical): the gate durable callers pass, entered before the event is made, so that it
    /// is made while no other durable caller commits (decision 0075).
    fn durable_pass(&self, critical: bool) -> Option<crate::queue::DurablePass<'_>> {
        self.in_the_store_on_return(critical)
            .then(|| self.shared().queue.durable_pass())
    }

    /// Whether events tracked now are in the store before the call returns: `durability =
    /// always` or a critical event, with a store to commit to.
    fn in_the_store_on_return(&self, critical: bool) -> bool {
        let s = self.shared();
        (critical || s.config.durability == Durability::Always) && s.queue.has_store()
    }

    fn prepare(&self, event: EventFields<'_>) -> Result<QueuedEvent> {
        let s = self.shared();
        event::prepare(
            event,
            s.clock.wall_ms(),
            s.next_seq(),
            s.config.max_event_bytes,
        )
    }

    /// Queues validated events and wakes the worker when a flush trigger is reached, or at once
    /// for a critical event. The events are queued either way; `Err` (only with `durability =
    /// always` or a critical event) says why they are not in the store. `pass`: the gate of
    /// durable callers, when this caller entered it before it made the events
    /// ([`EventSpool::durable_pass`]).
    fn accept(
        &self,
        events: impl IntoIterator<Item = QueuedEvent>,
        n: u64,
        critical: bool,
        pass: Option<crate::queue::DurablePass<'_>>,
    ) -> std::result::Result<(), crate::queue::Refusal> {
        let s = self.shared();
        if n == 0 {
            return Ok(());
        }
        // The first pending event arms the worker's periodic flush (an idle worker with nothing
        // to send sleeps without a deadline).
        let first = s.counters.entered(Entry::Tracked, n) == 0;
        let durable = if self.in_the_store_on_return(critical) {
            s.queue.push_durably(events, pass)
        } else {
            for event in events {
                s.queue.push(event);
            }
            Ok(())
        };
        if critical {
            s.critical_waiting.store(true, Ordering::SeqCst);
            s.wake.notify_one();
        } else {
            self.wake_if_due(first);
        }
        durable
    }

    /// Wakes the worker when `flush_at` is reached, or for the first pending event (which
    /// arms its periodic flush).
    fn wake_if_due(&self, first: bool) {
        let s = self.shared();
        if s.counters.pending() >= s.config.flush_at && !s.flush_at_reached.load(Ordering::Relaxed)
        {
            s.flush_at_reached.store(true, Ordering::SeqCst);
            s.wake.notify_one();
        } else if first {
            s.wake.notify_one();
        }
    }
}
