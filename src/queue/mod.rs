//! The queue: the one owner of every pending event, in memory ([`buffer`]) and in the SQLite
//! store ([`store`]), and of the moves between the two (spill, persist, batch assembly,
//! acknowledgement, redrive, purge) and the quarantine. No other module touches the buffer or the
//! store: `track()` pushes here, the delivery worker takes batches and answers for them here, the
//! spill thread runs [`Queue::run_spiller`], and the admin tool opens a store-only queue.
//!
//! # Locks, in the order they are taken
//!
//! 1. `spill_lock`: serializes moving events between memory and the store, so no event is ever
//!    in neither place or counted in both. Held by the spill (one chunk), persist, batch
//!    assembly, acknowledgement, redrive and purge; never by `track()` with `durability =
//!    spill`. With `durability = always` it is the group-commit lock: the caller that gets it
//!    commits for everyone who queued meanwhile (see [`Queue::push_durably`]).
//! 2. `buffer`: the sorted memory queue, the spill backlog and the batch in flight. Held for
//!    in-memory work only, never across SQLite.
//! 3. `inbox`: where `track()` appends while memory has room. It is the only lock on the hot
//!    path, held for one `Vec::push`, so a tracking thread never waits for a batch being picked,
//!    a spill chunk being taken, or the store's cap work. Whoever takes `buffer` first folds the
//!    inbox into it (taking `inbox` inside `buffer`, only to swap the `Vec` out), so every reader
//!    sees delivery order.
//! 4. `signal` (the spill thread's mailbox), then the store's own connection mutex and lease
//!    list, and the memory quarantine: leaves, taken last and alone.
//!
//! Nothing here calls app code; refusals are queued as notices for the caller to deliver once
//! it let go of every lock ([`crate::shared::Shared::deliver_notices`]).

pub(crate) mod buffer;
mod consent;
mod fleet;
mod ordered;
pub(crate) mod store;

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use crate::config::Durability;
use crate::error::{Error, Result};
use crate::event::{EventId, QueuedEvent, SendNote};
use crate::quarantine::{ListFilter, MemoryQuarantine, QuarantinedEvent, Selector};
use crate::shared::{Ledger, lock};
use crate::state::Notice;
use crate::stats::{DropReason, Entry, Exit};

use buffer::MemoryBuffer;
pub use buffer::SPILL_BACKLOG_MIN;
pub use consent::WAL_TRUNCATE_BOUND;
pub use store::disk_usage;
pub use store::faults::FaultPoint;
#[cfg(feature = "test-util")]
pub use store::faults::{FaultError, FaultSite, StoreFaults};
/// The `meta` name of the install id (src/fleet keeps it there; a denial deletes it).
pub use store::meta::INSTALL_ID as INSTALL_ID_NAME;
use store::{Inserted, PartialInsert, Store};
pub(crate) use store::{QuarantineSql, check_keys, schema};

/// How many events one spill takes while the spill lock is held. The delivery worker waits for
/// the spill in progress before it reads the store, so this bounds its wait: on a loaded
/// machine a 9,000-event commit into a store at its cap took about 280 ms, and delivery fell to
/// a few batches a second. A thousand rows per transaction is also where the raw SQLite
/// baseline commits.
pub const SPILL_CHUNK: usize = 1_000;

/// A spill waits for this many events past `memory_capacity` while they keep coming
/// ([`Queue::gather`]), checking every [`SPILL_LINGER_STEP`] that they still do, for at most
/// [`SPILL_LINGER_MAX`]: an event past `memory_capacity` reaches the store at most that much later.
const SPILL_BATCH_MIN: usize = 256;
const SPILL_LINGER_STEP: Duration = Duration::from_micros(200);
const SPILL_LINGER_MAX: Duration = Duration::from_millis(2);

/// A refused spill is tried again after [`SPILL_RETRY_FIRST`], doubled after each refusal in a
/// row up to [`SPILL_RETRY_MAX`], and at once when new events ask for a spill. A full disk stays
/// full for minutes to hours: a retry every second would wake the device thousands of times an
/// hour for nothing.
pub const SPILL_RETRY_FIRST: Duration = Duration::from_secs(1);
pub const SPILL_RETRY_MAX: Duration = Duration::from_secs(30);

/// The most room each half of the inbox keeps once folded (events, about 70 bytes each): what a
/// burst grew it to, so the next burst does not grow it again, within a bound.
const INBOX_ROOM_MAX: usize = 4_096;

/// How long `track()` with `durability = always` waits for its commit before it gives up on
/// durability (the event stays queued in memory and the call returns `Error::NotDurable`).
const ALWAYS_COMMIT_WAIT: Duration = Duration::from_secs(5);

/// The spill thread's mailbox, and the generations `durability = always` callers wait for.
#[derive(Default)]
struct SpillSignal {
    /// Spill mode: raised when the spill backlog starts filling; the spill thread works until
    /// `done` catches up. Always mode: one per durable push, so a caller knows its commit.
    requested: u64,
    committed: u64,
    failed: u64,
    /// Why the last failed commit failed.
    last_error: String,
    stop: bool,
    /// [`Queue::push_durably`] callers waiting for their own events to reach the store, by
    /// ticket, and the ticket of each event they wait for, by seq. Settled by whoever writes
    /// (or fails to write) those events: a caller is done once its own events are on disk,
    /// however long the rest of the spill backlog is.
    tickets: HashMap<u64, Ticket>,
    waiting: HashMap<u64, u64>,
    next_ticket: u64,
}

/// One durable caller's wait.
#[derive(Debug, Default)]
struct Ticket {
    /// Its events not yet written nor refused, by seq, with their ids.
    left: HashMap<u64, EventId>,
    /// Its events the store refused, and why.
    refused: Vec<EventId>,
    error: Option<String>,
}

/// Why [`Queue::push_durably`] could not make its events durable: which of them are only in
/// memory (queued all the same), and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub event_ids: Vec<EventId>,
    pub reason: String,
}

/// What the queue needs of a spool's configuration.
#[derive(Clone, Debug)]
pub struct QueueParams {
    pub memory_capacity: u64,
    pub durability: Durability,
    pub quarantine_max_events: u64,
    pub quarantine_retention_ms: u64,
    /// What the store seals its rows with (empty: plain text).
    pub encryption_keys: crate::EncryptionKeys,
}

impl QueueParams {
    pub fn of(config: &crate::config::Config) -> QueueParams {
        QueueParams {
            memory_capacity: config.memory_capacity,
            durability: config.durability,
            quarantine_max_events: config.quarantine_max_events,
            quarantine_retention_ms: config.quarantine_retention_ms,
            encryption_keys: config.encryption_keys.clone(),
        }
    }
}

/// A queue as opened: its store may have been found unusable and replaced.
pub struct OpenedQueue {
    pub queue: Queue,
    /// Events found in the store.
    pub restored: u64,
    /// The first free seq (`track()` order continues across restarts).
    pub next_seq: u64,
    /// Where an unusable store file was moved, and why.
    pub recovered: Option<(std::path::PathBuf, String)>,
    /// The store's record says `denied` and deleting what it kept did not finish at open: the
    /// spool must not deliver, and tries again.
    pub unfinished_denial: Option<Error>,
}

pub struct Queue {
    params: QueueParams,
    counters: Ledger,
    /// Notices raised under a lock, for the caller to deliver (shared with the spool).
    notices: Arc<Mutex<Vec<Notice>>>,
    spill_lock: parking_lot::Mutex<()>,
    /// `parking_lot` because a thread in a tight loop retakes a plain mutex before a woken
    /// waiter runs; its eventual fairness lets the spill thread and the worker in.
    buffer: parking_lot::Mutex<MemoryBuffer>,
    inbox: parking_lot::Mutex<Inbox>,
    /// Events in `buffer` (queued and waiting to spill) as of the last time it was let go, for
    /// the room check on the hot path. Only ever stale upwards between two holders' updates
    /// (a fold or a push), so the check errs on the side of the exact slow path.
    buffered: AtomicUsize,
    /// Set once an event past `memory_capacity` sits in the inbox and the spill thread was
    /// asked to fold it, so tracking threads ask once.
    fold_asked: AtomicBool,
    store: Option<Store>,
    memory_quarantine: Mutex<MemoryQuarantine>,
    signal: Mutex<SpillSignal>,
    spill_cv: Condvar,
    /// Refused spills in a row ([`Queue::spill_retry_delay`]).
    spill_refusals: AtomicU32,
}

/// What the hot path's one lock guards.
#[derive(Default)]
struct Inbox {
    /// Tracked events not yet folded into the buffer, in `track()` order.
    events: Vec<QueuedEvent>,
    /// The wire JSON of events the spill thread has written, for tracking threads to free, two
    /// per `track()` call ([`Queue::hand_back`]), and its bytes.
    spent: Vec<Box<str>>,
    spent_bytes: usize,
}

impl Inbox {
    fn pop_spent(&mut self) -> Option<Box<str>> {
        let json = self.spent.pop()?;
        self.spent_bytes -= json.len();
        Some(json)
    }
}

/// The most spent JSON strings, and bytes, waiting for tracking threads to free them; past
/// either the spill thread frees the rest itself.
const SPENT_MAX: usize = SPILL_CHUNK;
const SPENT_BYTES_MAX: usize = 512 << 10;

/// The buffer, with the inbox folded in. Keeps `buffered` up to date when let go.
struct Memory<'a> {
    queue: &'a Queue,
    buffer: parking_lot::MutexGuard<'a, MemoryBuffer>,
}

impl std::ops::Deref for Memory<'_> {
    type Target = MemoryBuffer;
    fn deref(&self) -> &MemoryBuffer {
        &self.buffer
    }
}

impl std::ops::DerefMut for Memory<'_> {
    fn deref_mut(&mut self) -> &mut MemoryBuffer {
        &mut self.buffer
    }
}

impl Drop for Memory<'_> {
    fn drop(&mut self) {
        self.queue
            .buffered
            .store(self.buffer.held(), Ordering::SeqCst);
    }
}

impl Queue {
    /// A queue without a store (memory only).
    pub fn in_memory(
        params: QueueParams,
        counters: Ledger,
        notices: Arc<Mutex<Vec<Notice>>>,
    ) -> Queue {
        Queue::new(params, counters, notices, None)
    }

    /// Opens the store at `path` (taking its owner lock) and a queue over it.
    pub fn open(
        path: &Path,
        max_disk_bytes: u64,
        wall_ms: i64,
        params: QueueParams,
        counters: Ledger,
        notices: Arc<Mutex<Vec<Notice>>>,
    ) -> Result<OpenedQueue> {
        Queue::open_with(
            path,
            max_disk_bytes,
            wall_ms,
            params,
            counters,
            notices,
            FaultPoint::default(),
        )
    }

    /// [`Queue::open`] with the store's connection opened through `faults` (tests).
    pub fn open_with(
        path: &Path,
        max_disk_bytes: u64,
        wall_ms: i64,
        params: QueueParams,
        counters: Ledger,
        notices: Arc<Mutex<Vec<Notice>>>,
        faults: FaultPoint,
    ) -> Result<OpenedQueue> {
        let keys = crate::crypto::Keyring::new(&params.encryption_keys);
        let opened = Store::open_with(path, max_disk_bytes, wall_ms, keys, faults)?;
        // Before anything reads the queue: a recorded denial is carried out (README §Consent).
        let unfinished_denial = consent::finish_recorded_denial(&opened.store);
        let restored = opened.store.len();
        let next_seq = opened.store.next_seq()?;
        Ok(OpenedQueue {
            queue: Queue::new(params, counters, notices, Some(opened.store)),
            restored,
            next_seq,
            recovered: opened.recovered,
            unfinished_denial,
        })
    }

    fn new(
        params: QueueParams,
        counters: Ledger,
        notices: Arc<Mutex<Vec<Notice>>>,
        store: Option<Store>,
    ) -> Queue {
        Queue {
            params,
            counters,
            notices,
            spill_lock: parking_lot::Mutex::new(()),
            buffer: parking_lot::Mutex::new(MemoryBuffer::default()),
            inbox: parking_lot::Mutex::new(Inbox::default()),
            buffered: AtomicUsize::new(0),
            fold_asked: AtomicBool::new(false),
            store,
            memory_quarantine: Mutex::new(MemoryQuarantine::default()),
            signal: Mutex::new(SpillSignal::default()),
            spill_cv: Condvar::new(),
            spill_refusals: AtomicU32::new(0),
        }
    }

    pub fn has_store(&self) -> bool {
        self.store.is_some()
    }

    fn capacity(&self) -> usize {
        self.params.memory_capacity as usize
    }

    fn notice_later(&self, notice: Notice) {
        tracing::warn!(?notice, "eventspool notice");
        lock(&self.notices).push(notice);
    }

    /// Locks the buffer and folds the inbox into it, counting what that displaced.
    fn memory(&self) -> Memory<'_> {
        let mut memory = Memory {
            queue: self,
            buffer: self.buffer.lock(),
        };
        // The inbox is double-buffered: the fold swaps in the empty `Vec` the last fold drained,
        // so a burst neither allocates a fresh inbox per fold nor grows one from nothing.
        let mut taken = std::mem::take(&mut memory.inbox_spare);
        let folding = {
            let mut inbox = self.inbox.lock();
            self.fold_asked.store(false, Ordering::SeqCst);
            if inbox.events.is_empty() {
                false
            } else {
                // Counted as buffered before the inbox is let go, so the hot path never sees
                // these events in neither count; the fold only moves or drops them, so the
                // exact figure stored when this guard goes is never above it.
                self.buffered
                    .fetch_add(inbox.events.len(), Ordering::SeqCst);
                std::mem::swap(&mut inbox.events, &mut taken);
                true
            }
        };
        // Sorted into the buffer outside the inbox lock: tracking threads go on appending.
        let spill_started = folding && {
            let overflow = memory.push_many(&mut taken, self.capacity(), self.store.is_some());
            self.buffered.store(memory.held(), Ordering::SeqCst);
            self.counters
                .drop(DropReason::MemoryOverflow, overflow.dropped);
            overflow.spill_started
        };
        taken.shrink_to(INBOX_ROOM_MAX);
        memory.inbox_spare = taken;
        if spill_started {
            self.ask_spiller();
        }
        memory
    }

    fn ask_spiller(&self) {
        lock(&self.signal).requested += 1;
        self.spill_cv.notify_all();
    }

    // ---- track() -------------------------------------------------------------------------

    /// Queues one event (`durability = spill`, or memory only). While memory has room this is
    /// one `Vec::push` under the inbox lock; at the limit it takes the exact path (the oldest
    /// move to the spill backlog, or drop, counted).
    pub fn push(&self, event: QueuedEvent) {
        let capacity = self.capacity();
        let limit = match self.store {
            Some(_) => capacity + capacity.max(SPILL_BACKLOG_MIN),
            None => capacity,
        };
        let event = {
            let mut inbox = self.inbox.lock();
            let held = self.held(&inbox);
            if held < limit {
                inbox.events.push(event);
                // Freed by the caller once the lock is let go (see `hand_back`): two per call,
                // so tracking frees them faster than a spill that keeps pace hands them back.
                let spent = [inbox.pop_spent(), inbox.pop_spent()];
                // Past `memory_capacity` the oldest belong in the spill backlog: the spill
                // thread folds the inbox and writes them. Asked once per fold: the flag is read
                // before it is swapped, so the calls after the first only read a shared line.
                let ask = held >= capacity
                    && !self.fold_asked.load(Ordering::SeqCst)
                    && !self.fold_asked.swap(true, Ordering::SeqCst);
                drop(inbox);
                drop(spent);
                if ask {
                    self.ask_spiller();
                }
                return;
            }
            event
        };
        let overflow = {
            let mut memory = self.memory();
            memory.push(event, capacity, self.store.is_some())
        };
        self.counters
            .drop(DropReason::MemoryOverflow, overflow.dropped);
        if overflow.spill_started {
            self.ask_spiller();
        }
    }

    /// `durability = always` (or a critical event): queues the events and returns once the
    /// store holds them, or why not. Group commit on the callers' own threads: each caller
    /// queues its events, then waits for the spill lock; whoever gets it commits what is
    /// queued by then, and the callers whose events that commit held find their tickets
    /// settled and leave. With `durability = spill` (a critical event) the caller writes only
    /// the oldest events, as many as durable callers wait for (critical events sort before
    /// every normal one), so it is done once its own events commit, not once the whole backlog
    /// is on disk. The deadline ([`ALWAYS_COMMIT_WAIT`]) is checked after every commit.
    pub fn push_durably(
        &self,
        events: impl IntoIterator<Item = QueuedEvent>,
    ) -> std::result::Result<(), Refusal> {
        let ticket = {
            let mut memory = self.memory();
            let mut left = HashMap::new();
            for event in events {
                left.insert(event.seq, event.id);
                memory.push_spill(event);
            }
            let mut signal = lock(&self.signal);
            signal.requested += 1;
            signal.next_ticket += 1;
            let ticket = signal.next_ticket;
            for seq in left.keys() {
                signal.waiting.insert(*seq, ticket);
            }
            signal.tickets.insert(
                ticket,
                Ticket {
                    left,
                    ..Ticket::default()
                },
            );
            ticket
        };
        let deadline = Instant::now() + ALWAYS_COMMIT_WAIT;
        loop {
            if let Some(outcome) = self.ticket_outcome(ticket) {
                return outcome;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            let stopped = lock(&self.signal).stop;
            if stopped || left.is_zero() {
                let reason = if stopped {
                    "the spool shut down before the store committed".to_string()
                } else {
                    format!(
                        "the store did not commit within {} s",
                        ALWAYS_COMMIT_WAIT.as_secs()
                    )
                };
                return Err(self.abandon_ticket(ticket, reason));
            }
            let Some(guard) = self.spill_lock.try_lock_for(left) else {
                continue;
            };
            if self.ticket_outcome_ready(ticket) {
                parking_lot::MutexGuard::unlock_fair(guard);
                continue;
            }
            let _ = self.spill_for_durable();
            parking_lot::MutexGuard::unlock_fair(guard);
        }
    }

    /// Whether a ticket is settled (without taking it).
    fn ticket_outcome_ready(&self, ticket: u64) -> bool {
        lock(&self.signal)
            .tickets
            .get(&ticket)
            .is_none_or(|t| t.left.is_empty())
    }

    /// A settled ticket's outcome (and the ticket taken out), or `None` while it waits.
    fn ticket_outcome(&self, ticket: u64) -> Option<std::result::Result<(), Refusal>> {
        let mut signal = lock(&self.signal);
        if !signal.tickets.get(&ticket)?.left.is_empty() {
            return None;
        }
        let t = signal.tickets.remove(&ticket)?;
        Some(match t.error {
            None => Ok(()),
            Some(error) => Err(Refusal {
                event_ids: t.refused,
                reason: format!("the store refused the write: {error}"),
            }),
        })
    }

    /// Gives up waiting: the refusal names the ticket's events not yet on disk.
    fn abandon_ticket(&self, ticket: u64, reason: String) -> Refusal {
        let mut signal = lock(&self.signal);
        let t = signal.tickets.remove(&ticket).unwrap_or_default();
        for seq in t.left.keys() {
            signal.waiting.remove(seq);
        }
        let mut event_ids = t.refused;
        event_ids.extend(t.left.values());
        let reason = match t.error {
            Some(error) => format!("the store refused the write: {error}"),
            None => reason,
        };
        Refusal { event_ids, reason }
    }

    /// Settles the tickets of events that reached the store (`Ok`) or that it refused.
    fn settle_tickets(&self, stored: &[QueuedEvent], refused: &[QueuedEvent], error: Option<&str>) {
        let mut signal = lock(&self.signal);
        if signal.waiting.is_empty() {
            return;
        }
        for (events, refused) in [(stored, false), (refused, true)] {
            for e in events {
                let Some(ticket) = signal.waiting.remove(&e.seq) else {
                    continue;
                };
                if let Some(t) = signal.tickets.get_mut(&ticket) {
                    t.left.remove(&e.seq);
                    if refused {
                        t.refused.push(e.id);
                        t.error = error.map(str::to_string);
                    }
                }
            }
        }
    }

    /// Nothing waits to be written any more (the spill queue is empty, or memory was cleared):
    /// the events durable callers still wait for left memory otherwise (purged, discarded),
    /// and their wait is over.
    fn settle_tickets_gone(&self) {
        let mut signal = lock(&self.signal);
        if signal.waiting.is_empty() {
            return;
        }
        let gone: Vec<(u64, u64)> = signal.waiting.drain().collect();
        for (seq, ticket) in gone {
            if let Some(t) = signal.tickets.get_mut(&ticket) {
                t.left.remove(&seq);
            }
        }
    }

    /// Whether a durable caller waits for events still in memory.
    fn durable_waiting(&self) -> bool {
        !lock(&self.signal).waiting.is_empty()
    }

    /// `track_batch` with a store (`durability = spill`): the whole batch is recorded, never
    /// part of it dropped. What memory has room for is queued; the oldest rest is written to
    /// the store on the caller's thread (back-pressure: a bulk call waits for the disk rather
    /// than memory growing or events dropping). If the store refuses, nothing is recorded (the
    /// notice waits for the caller). The events count as tracked before the worker can see
    /// them; returns whether they were the first pending ones. Without a store, does nothing.
    pub fn push_batch_spilling(&self, mut events: Vec<QueuedEvent>) -> Result<bool> {
        let Some(store) = &self.store else {
            return Ok(false);
        };
        let n = events.len() as u64;
        if n == 0 {
            return Ok(false);
        }
        let capacity = self.capacity();
        // The worker and the spiller wait while the batch is split between memory and the
        // store, so no event is seen half-recorded; other threads' track() calls do not.
        let _guard = self.spill_lock.lock();
        let room = self.memory().room(capacity);
        if events.len() > room {
            events.sort_unstable_by_key(QueuedEvent::key);
            let rest = events.split_off(events.len() - room);
            let direct = std::mem::replace(&mut events, rest);
            // One transaction: the batch is all or none, and a write that failed part-way
            // must not leave some of its rows behind.
            if let Err(e) = store
                .insert_all(&direct)
                .map(|report| self.count_evictions(report))
            {
                self.counters.store_errors.fetch_add(1, Ordering::Relaxed);
                self.notice_later(Notice::StoreUnavailable {
                    reason: e.to_string(),
                });
                return Err(Error::BatchRefused(format!(
                    "{n} events do not fit in memory (room for {room}) and the store \
                     refused the rest: {e}"
                )));
            }
        }
        let first = self.counters.entered(Entry::Tracked, n) == 0;
        if self.memory().push_batch(events, capacity) {
            self.ask_spiller();
        }
        Ok(first)
    }

    // ---- the spill -----------------------------------------------------------------------

    /// Moves the oldest part of the spill queue into the store (all of it with `durability =
    /// always`, whose callers wait for one shared commit). The caller holds `spill_lock`, so a
    /// refusal is queued as a notice for the caller to deliver after it let go.
    fn spill_locked(&self) -> Result<()> {
        self.spill_chunk(SPILL_CHUNK)
    }

    /// What a durable caller writes itself, holding the spill lock: with `durability = spill`
    /// only as many of the oldest events as durable callers wait for (critical events sort
    /// before every normal one, so those are theirs), a small commit that does not make the
    /// caller pay for a 1,000-row chunk (nor for the checkpoint such a chunk may bring); with
    /// `always`, everything queued (group commit).
    fn spill_for_durable(&self) -> Result<()> {
        let waiting = lock(&self.signal).waiting.len();
        self.spill_chunk(waiting.clamp(1, SPILL_CHUNK))
    }

    /// [`Queue::spill_locked`] taking at most `max` events waiting to spill (`durability =
    /// spill`).
    fn spill_chunk(&self, max: usize) -> Result<()> {
        let Some(store) = &self.store else {
            return Ok(());
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
            return Ok(());
        }
        match self.insert_counted(store, &events) {
            Ok(_) => {
                // Everything requested up to `generation` is on disk only once nothing was left.
                if rest == 0 {
                    self.mark_committed(generation, None);
                }
                self.settle_tickets(&events, &[], None);
                self.hand_back(events);
                Ok(())
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
        let mut spent = events.into_iter().map(|e| e.json).peekable();
        let mut inbox = self.inbox.lock();
        while inbox.spent.len() < SPENT_MAX
            && let Some(json) = spent.next_if(|j| inbox.spent_bytes + j.len() <= SPENT_BYTES_MAX)
        {
            inbox.spent_bytes += json.len();
            inbox.spent.push(json);
        }
        drop(inbox);
        // Past the bounds (tracking stopped, or too few calls to keep up), freed here.
        drop(spent);
    }

    /// Frees what tracking threads left to free (the spill thread, before it waits).
    fn free_spent(&self) {
        let spent = {
            let mut inbox = self.inbox.lock();
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
            self.spill_locked()
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

    /// Before a spill, while tracking goes on: waits until [`SPILL_BATCH_MIN`] events are past
    /// `memory_capacity`, or they stop coming, or [`SPILL_LINGER_MAX`] has passed, whichever is
    /// first. A spill thread as fast as tracking otherwise wrote every few events in a
    /// transaction of their own: each rewrote the last pages of the table, so a 10,000-event
    /// burst in chunks of 40-70 put enough frames in the WAL to cross the checkpoint threshold
    /// (an 8-9 ms checkpoint inside the burst), and each chunk's fold made tracking ask again.
    /// The inbox is not folded meanwhile, so tracking threads do not ask again either.
    /// With `durability = always` callers wait for their commit: no gathering.
    fn gather(&self) {
        if self.params.durability != Durability::Spill || self.durable_waiting() {
            return;
        }
        let deadline = Instant::now() + SPILL_LINGER_MAX;
        let mut seen = self.overflow();
        while seen < SPILL_BATCH_MIN {
            {
                let signal = lock(&self.signal);
                let left = deadline.saturating_duration_since(Instant::now());
                if signal.stop || left.is_zero() {
                    return;
                }
                let _ = self
                    .spill_cv
                    .wait_timeout(signal, SPILL_LINGER_STEP.min(left));
            }
            let now = self.overflow();
            if now <= seen {
                // Nothing new for a step: the burst is over, write what there is.
                return;
            }
            seen = now;
        }
    }

    /// Events past `memory_capacity`, the inbox included, without folding it.
    fn overflow(&self) -> usize {
        let held = self.held(&self.inbox.lock());
        held.saturating_sub(self.capacity())
    }

    /// Events in memory, the inbox included, for the checks that do not fold it.
    fn held(&self, inbox: &Inbox) -> usize {
        self.buffered.load(Ordering::SeqCst) + inbox.events.len()
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
    /// the spill backlog (`max(memory_capacity, SPILL_BACKLOG_MIN)`, the oldest dropped as
    /// `memory_overflow`): a full disk must neither hide them from delivery nor grow memory.
    fn give_back_refused(&self, events: Vec<QueuedEvent>) {
        match self.params.durability {
            Durability::Spill => self.memory().return_spill(events),
            Durability::Always => {
                let max = self.capacity().max(SPILL_BACKLOG_MIN);
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

    fn count_evictions(&self, report: Inserted) {
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

    // ---- the delivery worker ---------------------------------------------------------------

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
                if !picked.is_empty() && bytes + size > room {
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
            return picked;
        }
        memory.lease(&memory_keys);
        drop(memory);
        if let Some(store) = &self.store {
            store.lease(&seqs_by_origin(&picked).1);
        }
        picked
    }

    /// Takes events out of the queue after the collector answered for them (delivered or
    /// quarantined): from the store, and from the in-flight set in memory.
    pub fn ack(&self, events: &[(QueuedEvent, bool)]) -> Result<()> {
        let _guard = self.spill_lock.lock();
        let (memory, mut on_disk) = seqs_by_origin(events);
        on_disk.extend(self.memory().acknowledge(&memory));
        if let Some(store) = &self.store
            && !on_disk.is_empty()
        {
            store.delete(&on_disk)?;
        }
        Ok(())
    }

    /// Gives events of an unanswered batch back to the queue, each to where it came from.
    pub fn release(&self, events: &[(QueuedEvent, bool)]) {
        let _guard = self.spill_lock.lock();
        let (memory, on_disk) = seqs_by_origin(events);
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
        let (memory, mut on_disk) = seqs_by_origin(events);
        on_disk.extend(self.memory().acknowledge(&memory));
        self.counters.drop(DropReason::Expired, events.len() as u64);
        match &self.store {
            Some(store) if !on_disk.is_empty() => store.delete_expired(&on_disk).map(|_| ()),
            _ => Ok(()),
        }
    }

    /// Drops every queued event (not in flight), in memory and in the store, accepted before
    /// `cutoff_ms`; counts them `expired` and returns their ids.
    pub fn expire(&self, cutoff_ms: i64) -> Vec<EventId> {
        let mut gone = self.memory().expire(cutoff_ms);
        self.counters.drop(DropReason::Expired, gone.len() as u64);
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

    // ---- the app's and the operator's verbs ------------------------------------------------

    /// Deletes every queued event (memory and store) that is not in flight; counts them
    /// `purged` and returns how many.
    pub fn purge(&self) -> Result<u64> {
        let _guard = self.spill_lock.lock();
        let mut n = self.memory().clear();
        self.settle_tickets_gone();
        // Counted before the store is touched: a store error must not hide what memory lost.
        self.counters.drop(DropReason::Purged, n);
        if let Some(store) = &self.store {
            let stored = store.purge_queue()?;
            self.counters.drop(DropReason::Purged, stored);
            n += stored;
        }
        Ok(n)
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
    fn write_held_dead_letters(&self, store: &Store) {
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

    /// What [`crate::Stats`] reports of the queue: events in memory, in the store, the store's
    /// bytes on disk, and the quarantine by reason.
    /// See [`Store::normal_rows_by_order`]; `None` without a store.
    #[cfg(feature = "test-util")]
    pub fn normal_rows_by_order(&self) -> Option<Result<(u64, u64)>> {
        self.store.as_ref().map(Store::normal_rows_by_order)
    }

    pub fn fill_stats(&self, stats: &mut crate::stats::Stats) {
        stats.pending_memory = self.memory().len() as u64;
        stats.quarantine = lock(&self.memory_quarantine).counts();
        if let Some(store) = &self.store {
            stats.pending_disk = store.len();
            stats.store_bytes = store.disk_usage();
            stats.checkpoint_errors = store.checkpoint_errors();
            for (reason, n) in store.quarantine_counts().unwrap_or_default() {
                *stats.quarantine.entry(reason).or_default() += n;
            }
        }
    }

    /// At shutdown, after a final persist the store refused: the events only memory holds
    /// cannot be kept, so they are dropped and counted (`store_refused`; dead letters it held,
    /// `quarantine_refused`); returns the events' ids.
    /// Those of a batch in flight stay (its answer decides; the store holds them if `persist`
    /// copied them).
    pub fn drop_unstored(&self) -> Vec<EventId> {
        let _guard = self.spill_lock.lock();
        let mut memory = self.memory();
        let ids: Vec<EventId> = memory.peek(usize::MAX, true).map(|e| e.id).collect();
        memory.clear();
        drop(memory);
        self.settle_tickets_gone();
        self.counters
            .drop(DropReason::StoreRefused, ids.len() as u64);
        if self.store.is_some() {
            let dead = lock(&self.memory_quarantine).take(&Selector::All).len() as u64;
            self.counters.drop(DropReason::QuarantineRefused, dead);
        }
        ids
    }

    /// Gives up the store's owner lock (after shutdown) so another handle may open it.
    pub fn release_ownership(&self) {
        if let Some(store) = &self.store {
            store.release_ownership();
        }
    }
}

/// The seqs of a batch's events, split by where each came from: (memory, store). The flag beside
/// each event says it was read from the store.
fn seqs_by_origin(events: &[(QueuedEvent, bool)]) -> (Vec<u64>, Vec<u64>) {
    let (disk, memory): (Vec<_>, Vec<_>) = events.iter().partition(|(_, from_store)| *from_store);
    let seqs = |v: Vec<&(QueuedEvent, bool)>| v.iter().map(|(e, _)| e.seq).collect();
    (seqs(memory), seqs(disk))
}

#[cfg(test)]
mod failure_tests;

#[cfg(test)]
mod fault_table;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::EventId;

    fn event(ts: i64, seq: u64) -> QueuedEvent {
        let id = EventId::new();
        QueuedEvent {
            ts_ms: ts,
            seq,
            id,
            json: format!(r#"{{"event_id":"{id}","name":"e"}}"#).into_boxed_str(),
            accepted_ms: ts,
            sends: 0,
            unanswered: 0,
            critical: false,
        }
    }

    fn params(memory_capacity: u64, durability: Durability) -> QueueParams {
        QueueParams {
            memory_capacity,
            durability,
            quarantine_max_events: 1_000,
            quarantine_retention_ms: 1_000_000,
            encryption_keys: Default::default(),
        }
    }

    /// Events tracked into the inbox (shuffled timestamps) come out in delivery order, and the
    /// memory-only limit still drops exactly the oldest, counted.
    #[test]
    fn the_inbox_keeps_delivery_order_and_the_memory_limit() {
        let counters = Ledger::default();
        let q = Queue::in_memory(
            params(4, Durability::Spill),
            counters.clone(),
            Default::default(),
        );
        for (ts, seq) in [(50, 1), (10, 2), (40, 3), (20, 4), (30, 5), (60, 6)] {
            q.push(event(ts, seq));
        }
        let batch: Vec<_> = q
            .next_batch(10, u64::MAX)
            .into_iter()
            .map(|(e, from_store)| ((e.ts_ms, e.seq), from_store))
            .collect();
        assert_eq!(
            batch,
            [(30, 5), (40, 3), (50, 1), (60, 6)].map(|k| (k, false)),
            "the two oldest were dropped, the rest in timestamp order"
        );
        assert_eq!(counters.snapshot().dropped(DropReason::MemoryOverflow), 2);
    }

    /// `durability = always`: callers that queue while a commit is under way share the next
    /// one. Eight callers queue while the spill lock is held elsewhere; once it is let go, one
    /// transaction holds all eight events and every caller returns `Ok`.
    #[test]
    fn durable_callers_waiting_together_share_one_commit() {
        let dir = tempfile::tempdir().unwrap();
        let opened = Queue::open(
            &dir.path().join("q.db"),
            64 << 20,
            0,
            params(1_000, Durability::Always),
            Ledger::default(),
            Default::default(),
        )
        .unwrap();
        let q = Arc::new(opened.queue);
        let store_commits = || q.store.as_ref().unwrap().insert_transactions();
        let held = q.spill_lock.lock();
        let callers: Vec<_> = (0..8u64)
            .map(|i| {
                let q = q.clone();
                std::thread::spawn(move || q.push_durably([event(100 + i as i64, i + 1)]))
            })
            .collect();
        let deadline = Instant::now() + Duration::from_secs(10);
        while lock(&q.signal).requested < 8 {
            assert!(Instant::now() < deadline, "the callers did not queue");
            std::thread::yield_now();
        }
        drop(held);
        for caller in callers {
            assert_eq!(caller.join().unwrap(), Ok(()));
        }
        assert_eq!(q.store.as_ref().unwrap().len(), 8);
        assert_eq!(store_commits(), 1, "one commit for the eight callers");
        // A caller on its own commits on its own thread and returns.
        assert_eq!(q.push_durably([event(200, 9)]), Ok(()));
        assert_eq!(store_commits(), 2);
        assert_eq!(q.store.as_ref().unwrap().len(), 9);
    }

    /// A queue with a store in `dir` and `durability = spill`, and its spill thread running.
    fn spilling_queue(dir: &Path, capacity: u64) -> (Arc<Queue>, std::thread::JoinHandle<()>) {
        let q = Arc::new(
            Queue::open(
                &dir.join("q.db"),
                1 << 30,
                0,
                params(capacity, Durability::Spill),
                Ledger::default(),
                Default::default(),
            )
            .unwrap()
            .queue,
        );
        let spiller = {
            let q = q.clone();
            std::thread::spawn(move || q.run_spiller(|| {}))
        };
        (q, spiller)
    }

    /// The spill thread never falls asleep while tracked events wait in memory past
    /// `memory_capacity`. Tracking asks it once per fold of the inbox; a request that arrived
    /// after the fold but was counted as served by the spill in progress left every event
    /// tracked from then on in the inbox until something else folded it (`stats()`, a batch),
    /// and a crash lost them. Nothing here folds: only the spill thread moves events.
    #[test]
    fn the_spill_thread_keeps_up_with_tracking_without_being_polled() {
        const CAPACITY: u64 = 100;
        const ROUND: u64 = 2_000;
        let dir = tempfile::tempdir().unwrap();
        let (q, spiller) = spilling_queue(dir.path(), CAPACITY);
        let store = || q.store.as_ref().unwrap().len();
        let mut seq = 0;
        for round in 1..=10u64 {
            for _ in 0..ROUND {
                seq += 1;
                q.push(event(seq as i64, seq));
            }
            let want = round * ROUND - CAPACITY;
            let deadline = Instant::now() + Duration::from_secs(10);
            while store() < want && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(1));
            }
            assert_eq!(
                store(),
                want,
                "round {round}: everything past memory_capacity is on disk"
            );
        }
        q.stop_spiller();
        spiller.join().unwrap();
    }

    /// The written events' JSON goes to the tracking threads to free, within its bounds, and
    /// what they leave is freed once the spill has nothing more to write: nothing piles up.
    #[test]
    fn spent_json_stays_bounded_and_is_freed_once_the_spill_is_done() {
        const CAPACITY: u64 = 100;
        let dir = tempfile::tempdir().unwrap();
        let (q, spiller) = spilling_queue(dir.path(), CAPACITY);
        let spent = || {
            let inbox = q.inbox.lock();
            let counted: usize = inbox.spent.iter().map(|j| j.len()).sum();
            assert_eq!(
                inbox.spent_bytes, counted,
                "the byte count follows the strings"
            );
            (inbox.spent.len(), inbox.spent_bytes)
        };
        let mut most = (0, 0);
        for seq in 1..=5_000u64 {
            q.push(event(seq as i64, seq));
            let (n, bytes) = spent();
            most = (most.0.max(n), most.1.max(bytes));
        }
        assert!(most.0 <= SPENT_MAX && most.1 <= SPENT_BYTES_MAX, "{most:?}");
        let deadline = Instant::now() + Duration::from_secs(10);
        while (q.store.as_ref().unwrap().len() < 4_900 || spent().0 > 0)
            && Instant::now() < deadline
        {
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(q.store.as_ref().unwrap().len(), 4_900);
        assert_eq!(
            spent(),
            (0, 0),
            "freed once the spill had nothing more to write"
        );
        q.stop_spiller();
        spiller.join().unwrap();
    }
}
