//! The spill: moving events from memory to the store. The spill thread's loop
//! ([`Queue::run_spiller`]) and its turns ([`Queue::spill_now`]), the gathering before a turn,
//! the chunk a turn writes, the back-off after a refusal ([`Queue::spill_retry_delay`]), the
//! hand-back of written events' JSON to the tracking threads, and [`Queue::persist`], which moves
//! everything at once. Separate from `mod.rs` because it is the one path that writes queued events
//! into SQLite; `track()`'s side (the inbox, the durable callers' tickets) stays there.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::buffer::spill_backlog_ceiling;
use super::store::{Inserted, PartialInsert, Store};
use super::{Queue, Spent};
use crate::config::Durability;
use crate::error::Result;
use crate::event::QueuedEvent;
use crate::state::Notice;
use crate::stats::DropReason;
use crate::sync::lock;

/// How many events one spill takes while the spill lock is held. The delivery worker waits for
/// the spill in progress before it reads the store, so this bounds its wait: on a loaded
/// machine a 9,000-event commit into a store at its cap took about 280 ms, and delivery fell to
/// a few batches a second. A thousand rows per transaction is also where the raw SQLite
/// baseline commits.
pub const SPILL_CHUNK: usize = 1_000;

/// A spill waits for this many events past `memory_capacity` ([`Queue::gather`]), for at most
/// [`SPILL_LINGER_MAX`]: an event past `memory_capacity` reaches the store at most that much
/// later, and at most this many wait with it. Every commit writes at least a page of WAL (4 KB)
/// for each page it touches, for events of a few hundred bytes: an offline app tracking 20
/// events a second with memory full wrote one commit per event, about 19 bytes to disk per byte
/// of event; lingering two seconds puts 40 events in a commit. The crash window of `durability =
/// spill` grows by the same bound: `memory_capacity` events plus at most this many, at most two
/// seconds old (decision 0068).
pub(super) const SPILL_BATCH_MIN: usize = 256;

/// Past `memory_capacity` by this many events, the spill has fallen behind tracking, and the
/// tracking threads seal the bodies of a store sealing with ChaCha20-Poly1305 ahead
/// ([`Store::seal_ahead`]): the cost moves from the spill thread, the slower side then, to the
/// threads making events, until the backlog is under it again (decisions 0070, 0074).
pub(super) const SEAL_AHEAD_PAST: usize = SPILL_CHUNK;
pub(super) const SPILL_LINGER_MAX: Duration = Duration::from_secs(2);

/// The gathering while a burst is being written ([`Queue::gather_burst`]): at most
/// [`BURST_GATHER_MAX`], and over once no event came for [`BURST_STEP`].
const BURST_STEP: Duration = Duration::from_micros(200);
const BURST_GATHER_MAX: Duration = Duration::from_millis(2);

/// A refused spill is tried again after [`SPILL_RETRY_FIRST`], doubled after each refusal in a
/// row up to [`SPILL_RETRY_MAX`], and at once when new events ask for a spill. A full disk stays
/// full for minutes to hours: a retry every second would wake the device thousands of times an
/// hour for nothing.
pub const SPILL_RETRY_FIRST: Duration = Duration::from_secs(1);
pub const SPILL_RETRY_MAX: Duration = Duration::from_secs(30);

/// The most spent JSON strings, and bytes, waiting for tracking threads to free them; past
/// either the spill thread frees the rest itself.
pub(super) const SPENT_MAX: usize = SPILL_CHUNK;
pub(super) const SPENT_BYTES_MAX: usize = 512 << 10;

impl Queue {
    /// Moves the oldest part of the spill queue into the store (all of it with `durability =
    /// always`, whose callers wait for one shared commit). The caller holds `spill_lock`, so a
    /// refusal is queued as a notice for the caller to deliver after it let go.
    pub(super) fn spill_locked(&self) -> Result<usize> {
        self.spill_chunk(SPILL_CHUNK)
    }

    /// What a durable caller writes itself, holding the spill lock: with `durability = spill`
    /// only as many of the oldest events as durable callers wait for (critical events sort
    /// before every normal one, so those are theirs), a small commit that does not make the
    /// caller pay for a 1,000-row chunk (nor for the checkpoint such a chunk may bring); with
    /// `always`, everything queued (group commit).
    pub(super) fn spill_for_durable(&self) -> Result<()> {
        let waiting = lock(&self.signal).waiting.len();
        self.spill_chunk(waiting.clamp(1, SPILL_CHUNK)).map(drop)
    }

    /// [`Queue::spill_locked`] taking at most `max` events waiting to spill (`durability =
    /// spill`); how many it wrote.
    fn spill_chunk(&self, max: usize) -> Result<usize> {
        let Some(store) = &self.store else {
            return Ok(0);
        };
        // The requests this spill answers are those made before the inbox is folded: a
        // `track()` that asks after the fold asked for events this spill does not see, so
        // counting its request as served would leave the spill thread asleep while they wait.
        // Every request counted here made its events visible to the fold first (`push` appends
        // before it asks, `push_durably` queues before it counts).
        let generation = lock(&self.signal).requested;
        let (events, rest) = {
            let mut memory = self.memory();
            let events = match self.params.durability {
                Durability::Spill => memory.take_spill(max),
                Durability::Always => memory.take_unstored(),
            };
            (events, memory.spill_len())
        };
        if events.is_empty() {
            self.mark_committed(generation, None);
            self.settle_tickets_gone();
            return Ok(0);
        }
        match self.insert_counted(store, &events) {
            Ok(_) => {
                // Everything requested up to `generation` is on disk only once nothing was left.
                if rest == 0 {
                    self.mark_committed(generation, None);
                }
                self.settle_tickets(&events, &[], None);
                let written = events.len();
                self.hand_back(events);
                Ok(written)
            }
            Err(partial) => {
                // The transactions before the one that failed committed: those events are on
                // disk only; the rest go back to memory.
                let mut events = events;
                let refused = events.split_off(partial.committed.min(events.len()));
                let e = partial.error;
                self.settle_tickets(&events, &refused, Some(&e.to_string()));
                self.hand_back(events);
                self.give_back_refused(refused);
                self.counters.store_errors.fetch_add(1, Ordering::Relaxed);
                self.mark_committed(generation, Some(e.to_string()));
                self.notice_later(Notice::StoreUnavailable {
                    reason: e.to_string(),
                });
                Err(e)
            }
        }
    }

    /// Gives the wire JSON of written events to the tracking threads to free, two per
    /// `track()` call. Each string was allocated by a tracking thread, and glibc's `free` of
    /// another thread's block takes that thread's arena lock, which the tracking thread takes for
    /// its own allocations: freeing a spilled chunk on the spill thread while tracking went on
    /// cost about ten times what it did with tracking idle (9,000 strings: 3.9 ms against
    /// 0.34 ms), and slowed `track()` as much. Freed where it was made, a string goes back to
    /// that thread's cache, and the next event's allocation takes it from there.
    /// With `durability = always` the caller spilled its own events; nothing to hand back.
    fn hand_back(&self, events: Vec<QueuedEvent>) {
        if self.params.durability == Durability::Always {
            return;
        }
        let mut spent = events
            .into_iter()
            .map(|e| Spent(e.json, e.sealed))
            .peekable();
        let mut inbox = self.hot.inbox.lock();
        while inbox.spent.len() < SPENT_MAX
            && let Some(one) = spent.next_if(|j| inbox.spent_bytes + j.len() <= SPENT_BYTES_MAX)
        {
            inbox.spent_bytes += one.len();
            inbox.spent.push(one);
        }
        drop(inbox);
        // Past the bounds (tracking stopped, or too few calls to keep up), freed here.
        drop(spent);
    }

    /// Frees what tracking threads left to free (the spill thread, before it waits).
    fn free_spent(&self) {
        let spent = {
            let mut inbox = self.hot.inbox.lock();
            inbox.spent_bytes = 0;
            std::mem::take(&mut inbox.spent)
        };
        drop(spent);
    }

    /// Spills one chunk now; a thread waiting for the lock (the delivery worker) gets it next.
    /// The caller delivers the notices.
    pub fn spill_now(&self) -> Result<()> {
        let guard = self.spill_lock.lock();
        // A durable caller waits: its events first, in a commit of their own.
        let result = if self.durable_waiting() {
            self.spill_for_durable()
        } else {
            self.spill_locked().map(|written| {
                self.spill_bursting
                    .store(written >= SPILL_BATCH_MIN, Ordering::Relaxed);
            })
        };
        parking_lot::MutexGuard::unlock_fair(guard);
        match &result {
            Ok(()) => self.spill_refusals.store(0, Ordering::Relaxed),
            Err(_) => {
                self.spill_refusals.fetch_add(1, Ordering::Relaxed);
            }
        }
        result
    }

    /// How long the spill thread waits before it tries a refused spill again (unless new
    /// events ask sooner): see [`SPILL_RETRY_FIRST`].
    pub fn spill_retry_delay(&self) -> Duration {
        let refusals = self.spill_refusals.load(Ordering::Relaxed);
        let doublings = refusals.saturating_sub(1).min(16);
        (SPILL_RETRY_FIRST * (1u32 << doublings)).min(SPILL_RETRY_MAX)
    }

    fn mark_committed(&self, generation: u64, error: Option<String>) {
        let failed = error.is_some();
        let mut s = lock(&self.signal);
        match error {
            None => s.committed = s.committed.max(generation),
            Some(e) => {
                s.failed = s.failed.max(generation);
                s.last_error = e;
            }
        }
        drop(s);
        // Only the spill thread waits on this, and only a refusal gives it work (a retry);
        // `durability = always` callers wait on the spill lock, not here.
        if failed {
            self.spill_cv.notify_all();
        }
    }

    /// The spill thread: moves overflow to disk so `track()` never waits on SQLite. It wakes
    /// when the spill backlog starts filling and commits it chunk by chunk. `deliver` hands the
    /// notices of a refusal to the observers (no lock held); a refused spill is retried after
    /// [`Queue::spill_retry_delay`], its events kept in memory meanwhile.
    pub fn run_spiller(&self, deliver: impl Fn()) {
        loop {
            {
                if self.spill_done() {
                    // Nothing more to write: no tracking burst is going on to free the rest.
                    self.free_spent();
                }
                let mut signal = lock(&self.signal);
                while signal.committed >= signal.requested && !signal.stop {
                    signal = self
                        .spill_cv
                        .wait(signal)
                        .unwrap_or_else(|p| p.into_inner());
                }
                if signal.stop {
                    return;
                }
            }
            self.gather();
            let result = self.spill_now();
            deliver();
            if result.is_err() {
                let signal = lock(&self.signal);
                if !signal.stop {
                    let _ = self.spill_cv.wait_timeout(signal, self.spill_retry_delay());
                }
            }
        }
    }

    /// Before a spill: gathers a chunk's worth instead of committing every few events. After a
    /// spill that wrote a chunk's worth a burst is being written: its tail goes once tracking
    /// pauses ([`Queue::gather_burst`]). Otherwise the spill lingers ([`Queue::linger`]). With
    /// `durability = always` callers wait for their commit, and a durable caller (a critical
    /// event) writes its own: no gathering for them.
    fn gather(&self) {
        if self.params.durability != Durability::Spill || self.durable_waiting() {
            return;
        }
        if self.spill_bursting.load(Ordering::Relaxed) {
            self.gather_burst();
        } else {
            self.linger();
        }
    }

    /// While a burst is being written: waits until [`SPILL_BATCH_MIN`] events are past
    /// `memory_capacity`, or no event came for [`BURST_STEP`], or [`BURST_GATHER_MAX`] has
    /// passed. A spill thread as fast as tracking otherwise wrote every few events in a
    /// transaction of their own: each rewrote the last pages of the table, so a 10,000-event
    /// burst in chunks of 40-70 put enough frames in the WAL to cross the checkpoint threshold
    /// (an 8-9 ms checkpoint inside the burst), and each chunk's fold made tracking ask again.
    /// The tail of the burst goes as soon as tracking pauses: a burst is on disk when it ends,
    /// not a linger later (the `spill` bench's 10,000 events took 2.3 s instead of 30 ms).
    fn gather_burst(&self) {
        let deadline = Instant::now() + BURST_GATHER_MAX;
        let mut seen = self.overflow();
        while seen < SPILL_BATCH_MIN {
            {
                let signal = lock(&self.signal);
                let left = deadline.saturating_duration_since(Instant::now());
                if signal.stop || left.is_zero() {
                    return;
                }
                let _ = self.spill_cv.wait_timeout(signal, BURST_STEP.min(left));
            }
            let now = self.overflow();
            if now <= seen {
                return;
            }
            seen = now;
        }
    }

    /// A trickle: waits until [`SPILL_BATCH_MIN`] events are past `memory_capacity`, or
    /// [`SPILL_LINGER_MAX`] has passed. An app tracking tens of events a second with memory
    /// full otherwise wrote one commit per event (decision 0068). The inbox is not folded
    /// meanwhile, so tracking threads do not ask again; the one whose event reaches the
    /// threshold ends the wait ([`Queue::wake_lingering_spill`]), so memory never holds more
    /// than that many past its capacity for long.
    fn linger(&self) {
        let deadline = Instant::now() + SPILL_LINGER_MAX;
        loop {
            self.hot.spill_lingering.store(true, Ordering::SeqCst);
            if self.overflow() >= SPILL_BATCH_MIN {
                break;
            }
            let signal = lock(&self.signal);
            let left = deadline.saturating_duration_since(Instant::now());
            if signal.stop || left.is_zero() {
                break;
            }
            // Cleared by a tracking thread past the threshold before this lock was taken: look
            // again instead of waiting for a wake-up that already happened.
            if self.hot.spill_lingering.load(Ordering::SeqCst) {
                let _ = self.spill_cv.wait_timeout(signal, left);
            }
        }
        self.hot.spill_lingering.store(false, Ordering::SeqCst);
        if Instant::now() >= deadline {
            self.lingers_ran_out.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Ends a lingering spill's wait (see [`Queue::gather`]): called by the tracking thread
    /// whose event took memory [`SPILL_BATCH_MIN`] past its capacity, once per linger. The
    /// signal lock orders it after the spill thread's check, so the wake-up is never lost.
    pub(super) fn wake_lingering_spill(&self) {
        if self.hot.spill_lingering.swap(false, Ordering::SeqCst) {
            let _signal = lock(&self.signal);
            self.spill_cv.notify_all();
        }
    }

    /// How many lingers waited out their bound ([`SPILL_LINGER_MAX`]).
    #[cfg(test)]
    pub(super) fn lingers_ran_out(&self) -> u64 {
        self.lingers_ran_out.load(Ordering::Relaxed)
    }

    /// Events past `memory_capacity`, the inbox included, without folding it.
    fn overflow(&self) -> usize {
        let held = self.held(&self.hot.inbox.lock());
        held.saturating_sub(self.capacity())
    }

    fn spill_done(&self) -> bool {
        let signal = lock(&self.signal);
        signal.committed >= signal.requested
    }

    /// One turn of the spill thread's loop, for a spool stepped by a test (feature
    /// `test-util`): `None` when no spill was asked for, else what the spill did. No gathering:
    /// a stepped run has no burst going on in another thread to wait for.
    #[cfg(feature = "test-util")]
    pub fn spill_turn(&self) -> Option<Result<()>> {
        if self.spill_done() {
            return None;
        }
        Some(self.spill_now())
    }

    /// Ends the spill thread's loop (shutdown), and the wait of `durability = always` callers.
    pub fn stop_spiller(&self) {
        lock(&self.signal).stop = true;
        self.spill_cv.notify_all();
    }

    /// Puts back events the store refused. With `spill` they wait to spill again (the worker
    /// reads that queue too). With `always` they join the queue the worker reads, bounded like
    /// the spill backlog ([`spill_backlog_ceiling`], the oldest dropped as
    /// `memory_overflow`): a full disk must neither hide them from delivery nor grow memory.
    fn give_back_refused(&self, events: Vec<QueuedEvent>) {
        match self.params.durability {
            Durability::Spill => self.memory().return_spill(events),
            Durability::Always => {
                let max = spill_backlog_ceiling(self.capacity());
                let dropped = self.memory().keep_refused(events, max);
                self.counters.drop(DropReason::MemoryOverflow, dropped);
            }
        }
    }

    /// Writes events into the store's queue and counts what its cap evicted to make room
    /// (`disk_cap`, `quarantine_cap`): spill and persist write through here, so no eviction
    /// goes uncounted, not even one made by a transaction before the one that failed.
    fn insert_counted(
        &self,
        store: &Store,
        events: &[QueuedEvent],
    ) -> std::result::Result<Inserted, PartialInsert> {
        match store.insert(events) {
            Ok(report) => {
                self.count_evictions(report);
                Ok(report)
            }
            Err(partial) => {
                self.count_evictions(partial.done);
                Err(partial)
            }
        }
    }

    pub(super) fn count_evictions(&self, report: Inserted) {
        self.counters.drop(DropReason::DiskCap, report.evicted);
        self.counters
            .drop(DropReason::QuarantineCap, report.evicted_quarantine);
    }

    /// Moves everything in memory to the store (see [`crate::EventSpool::persist`]); a
    /// refusal is queued as a `StoreUnavailable` notice for the caller to deliver.
    pub fn persist(&self) -> Result<u64> {
        let Some(store) = &self.store else {
            return Ok(0);
        };
        let _guard = self.spill_lock.lock();
        let (moved, copies) = self.memory().take_for_persist();
        // The batch in flight is written as leased rows: eviction, expiry and purge_pending()
        // skip them and no other batch reads them, so each event stays in one place, counted once.
        let copy_seqs: Vec<u64> = copies.iter().map(|e| e.seq).collect();
        store.lease(&copy_seqs);
        self.write_held_dead_letters(store);
        let first_copy = moved.len();
        let mut all = moved;
        all.extend(copies);
        match self.insert_counted(store, &all) {
            Ok(report) => {
                self.settle_tickets(&all[..first_copy], &[], None);
                Ok(report.inserted)
            }
            Err(partial) => {
                // What committed is on disk: moved events and copies up to `committed`.
                let committed = partial.committed.min(all.len());
                let unstored_copies = &copy_seqs[committed.saturating_sub(first_copy)..];
                store.release(unstored_copies);
                self.memory().unmark_persisted(unstored_copies);
                all.truncate(first_copy);
                let refused = all.split_off(committed.min(first_copy));
                let e = partial.error;
                self.settle_tickets(&all, &refused, Some(&e.to_string()));
                self.give_back_refused(refused);
                self.counters.store_errors.fetch_add(1, Ordering::Relaxed);
                self.notice_later(Notice::StoreUnavailable {
                    reason: e.to_string(),
                });
                Err(e)
            }
        }
    }
}
