//! The queue: the one owner of every pending event, in memory ([`buffer`]) and in the SQLite
//! store ([`store`]), and of the moves between the two (spill, persist, batch assembly,
//! acknowledgement, redrive, purge) and the quarantine. No other module touches the buffer or the
//! store: `track()` pushes here, the delivery worker takes batches and answers for them here, the
//! spill thread runs [`Queue::run_spiller`], and the admin tool opens a store-only queue.
//!
//! # Locks, in the order they are taken
//!
//! 0. `durable_gate`: `durability = always` callers pass it one at a time, and only the one
//!    inside takes `spill_lock` to commit (see [`Queue::push_durably`]). `track()` of one
//!    durable event takes it before it makes the event ([`Queue::durable_pass`]), holding
//!    nothing but the spool's admission then; inside it, the event's making takes only the
//!    fleet's directive lock (a leaf), and the queue's locks below.
//! 1. `spill_lock`: serializes moving events between memory and the store, so no event is ever
//!    in neither place or counted in both. Held by the spill (one chunk), persist, batch
//!    assembly, acknowledgement, redrive and purge; never by `track()` with `durability =
//!    spill`. With `durability = always` the caller inside the gate takes it and commits for
//!    everyone who queued meanwhile.
//! 2. `buffer`: the sorted memory queue, the spill backlog and the batch in flight. Held for
//!    in-memory work only, never across SQLite.
//! 3. `inbox`: where `track()` appends while memory has room. It is the only lock on the hot
//!    path, held for one `Vec::push`, so a tracking thread never waits for a batch being picked,
//!    a spill chunk being taken, or the store's cap work. Whoever takes `buffer` first folds the
//!    inbox into it (taking `inbox` inside `buffer`, only to swap the `Vec` out), so every reader
//!    sees delivery order.
//! 4. `signal` (the spill thread's mailbox), then the store's own connection mutex and lease
//!    list, and the memory quarantine: leaves, taken last and alone. Under the connection
//!    mutex a writer takes the store's checkpoint lock or the checkpointer's phase, each alone
//!    (store/checkpointer.rs); the checkpointer's thread takes the phase inside the checkpoint
//!    lock, and never the connection mutex.
//!
//! Nothing here calls app code; refusals are queued as notices for the caller to deliver once
//! it let go of every lock ([`crate::shared::Shared::deliver_notices`]).

pub(crate) mod buffer;
mod consent;
mod dead_letters;
mod delivery;
mod fleet;
mod ordered;
mod spill;
pub(crate) mod store;

use crossbeam_utils::CachePadded;
use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use crate::config::Durability;
use crate::crypto::Aead;
use crate::error::{Error, Result};
use crate::event::{EventId, QueuedEvent, SealedAhead};
use crate::quarantine::{MemoryQuarantine, Selector};
use crate::state::Notice;
use crate::stats::Ledger;
use crate::stats::{DropReason, Entry};
use crate::sync::lock;

use buffer::MemoryBuffer;
pub use buffer::SPILL_BACKLOG_MIN;
pub use consent::WAL_TRUNCATE_BOUND;
use store::Store;
pub use store::disk_usage;
pub use store::faults::FaultPoint;
#[cfg(feature = "test-util")]
pub use store::faults::{FaultError, FaultSite, StoreFaults};
/// The `meta` name of the install id (src/fleet keeps it there; a denial deletes it).
pub use store::meta::INSTALL_ID as INSTALL_ID_NAME;
pub(crate) use store::{QuarantineSql, check_keys, schema};

/// The most room each half of the inbox keeps once folded (events, about 70 bytes each): what a
/// burst grew it to, so the next burst does not grow it again, within a bound.
const INBOX_ROOM_MAX: usize = 4_096;

/// How long `track()` with `durability = always` waits for its commit before it gives up on
/// durability (the event stays queued in memory and the call returns `Error::NotDurable`).
const ALWAYS_COMMIT_WAIT: Duration = Duration::from_secs(5);

/// How long the durable caller inside the gate waits for the spill lock before it looks
/// again at whether another thread's commit (the spill thread's, `persist()`'s) carried its
/// events.
const SPILL_LOCK_SLICE: Duration = Duration::from_millis(1);

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

/// A durable caller inside the gate ([`Queue::durable_pass`]): it makes its event and commits
/// it before the next caller gets in.
pub struct DurablePass<'a> {
    gate: std::sync::MutexGuard<'a, ()>,
    /// The caller's bound, counted from before it waited for the gate: a caller behind one
    /// that waits out its own bound then finds its time spent, and leaves.
    deadline: Instant,
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
    /// The AEAD new rows are sealed with: [`Aead::for_this_cpu`] (tests choose either).
    pub aead: Aead,
}

impl QueueParams {
    pub fn of(config: &crate::config::Config) -> QueueParams {
        QueueParams {
            memory_capacity: config.memory_capacity,
            durability: config.durability,
            quarantine_max_events: config.quarantine_max_events,
            quarantine_retention_ms: config.quarantine_retention_ms,
            encryption_keys: config.encryption_keys.clone(),
            aead: Aead::for_this_cpu(),
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
    /// What `track()` reads and writes, on cache lines of its own.
    hot: CachePadded<HotPath>,
    /// Lingers that waited out [`spill::SPILL_LINGER_MAX`] rather than end on a chunk's worth
    /// or a stop: what tells, without timing, that a burst did not wait for the bound.
    lingers_ran_out: AtomicU64,
    /// The spill thread's last turn wrote a chunk's worth: a burst is being written, and its
    /// tail is not held for a linger ([`Queue::gather`]).
    spill_bursting: AtomicBool,
    store: Option<Store>,
    memory_quarantine: Mutex<MemoryQuarantine>,
    signal: Mutex<SpillSignal>,
    spill_cv: Condvar,
    /// The door `durability = always` callers pass one at a time to commit
    /// ([`Queue::commit_through_gate`]). A plain mutex on purpose: the thread that lets it go
    /// takes it again before a woken waiter runs, and its next commit carries the waiters'
    /// queued events too, so each of them leaves as soon as it gets in (decision 0072).
    durable_gate: Mutex<()>,
    /// [`ALWAYS_COMMIT_WAIT`]; tests shorten it.
    commit_wait: Duration,
    /// Refused spills in a row ([`Queue::spill_retry_delay`]).
    spill_refusals: AtomicU32,
    /// The batch a consent denial spared because it was on the wire, by seq: deleted if it
    /// comes back unanswered, whatever consent says by then (consent.rs).
    spared_by_denial: Mutex<Vec<u64>>,
}

/// What [`Queue::push`] touches, apart from the lock it takes, kept off the cache lines that
/// the spill thread and the store write at every commit (their counters, the spill lock): a
/// tracking thread that shared a line with them lost it to the other core at each write
/// (BENCHMARKS.md, "`track()` off the lines the spill thread writes": the 4-thread p99 fell
/// to a third, the median during an encrypted spill by a tenth).
struct HotPath {
    /// `memory_capacity`, and what memory may hold with the spill backlog (`push`'s limit).
    capacity: usize,
    limit: usize,
    /// The store seals its rows with ChaCha20-Poly1305: `track()` seals ahead while the spill
    /// is behind (decision 0070). With AES-256-GCM the spill thread's seals are cheap enough
    /// that sharing them only costs `track()` (decision 0074).
    seals_ahead: bool,
    inbox: parking_lot::Mutex<Inbox>,
    /// Events in `buffer` (queued and waiting to spill) as of the last time it was let go, for
    /// the room check on the hot path. Only ever stale upwards between two holders' updates
    /// (a fold or a push), so the check errs on the side of the exact slow path.
    buffered: AtomicUsize,
    /// Set once an event past `memory_capacity` sits in the inbox and the spill thread was
    /// asked to fold it, so tracking threads ask once.
    fold_asked: AtomicBool,
    /// The spill thread is waiting for more events before it writes (a trickle past
    /// `memory_capacity`, [`Queue::gather`]); the tracking thread whose event fills a chunk's
    /// worth ends the wait.
    spill_lingering: AtomicBool,
    /// Memory held [`spill::SEAL_AHEAD_PAST`] events past its capacity at the last `track()`:
    /// the spill is behind, and tracking threads seal an encrypting store's bodies ahead.
    spill_behind: AtomicBool,
}

/// What the hot path's one lock guards.
#[derive(Default)]
struct Inbox {
    /// Tracked events not yet folded into the buffer, in `track()` order.
    events: Vec<QueuedEvent>,
    /// The wire JSON of events the spill thread has written, for tracking threads to free, two
    /// per `track()` call ([`Queue::hand_back`]), and its bytes.
    spent: Vec<Spent>,
    spent_bytes: usize,
}

/// What a written event leaves for a tracking thread to free: its wire JSON and the body sealed
/// ahead (both allocated by a tracking thread).
struct Spent(Box<str>, SealedAhead);

impl Spent {
    fn len(&self) -> usize {
        self.0.len() + self.1.len()
    }
}

impl Inbox {
    fn pop_spent(&mut self) -> Option<Spent> {
        let spent = self.spent.pop()?;
        self.spent_bytes -= spent.len();
        Some(spent)
    }
}

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
            .hot
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
        let keys = crate::crypto::Keyring::sealing_with(&params.encryption_keys, params.aead);
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
        let capacity = params.memory_capacity as usize;
        Queue {
            params,
            counters,
            notices,
            spill_lock: parking_lot::Mutex::new(()),
            buffer: parking_lot::Mutex::new(MemoryBuffer::default()),
            hot: CachePadded::new(HotPath {
                capacity,
                limit: match store {
                    Some(_) => capacity + buffer::spill_backlog_ceiling(capacity),
                    None => capacity,
                },
                seals_ahead: store
                    .as_ref()
                    .is_some_and(|s| s.seals_with() == Some(Aead::ChaCha20Poly1305)),
                inbox: parking_lot::Mutex::new(Inbox::default()),
                buffered: AtomicUsize::new(0),
                fold_asked: AtomicBool::new(false),
                spill_lingering: AtomicBool::new(false),
                spill_behind: AtomicBool::new(false),
            }),
            lingers_ran_out: AtomicU64::new(0),
            spill_bursting: AtomicBool::new(false),
            store,
            memory_quarantine: Mutex::new(MemoryQuarantine::default()),
            signal: Mutex::new(SpillSignal::default()),
            spill_cv: Condvar::new(),
            durable_gate: Mutex::new(()),
            commit_wait: ALWAYS_COMMIT_WAIT,
            spill_refusals: AtomicU32::new(0),
            spared_by_denial: Mutex::new(Vec::new()),
        }
    }

    /// The store's file, for the test hooks keyed by it (feature `test-util`).
    #[cfg(feature = "test-util")]
    pub fn store_path(&self) -> Option<&std::path::Path> {
        self.store.as_ref().map(|s| s.path())
    }

    pub fn has_store(&self) -> bool {
        self.store.is_some()
    }

    /// `memory_capacity`, as `track()` reads it.
    fn capacity(&self) -> usize {
        self.hot.capacity
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
            let mut inbox = self.hot.inbox.lock();
            self.hot.fold_asked.store(false, Ordering::SeqCst);
            if inbox.events.is_empty() {
                false
            } else {
                // Counted as buffered before the inbox is let go, so the hot path never sees
                // these events in neither count; the fold only moves or drops them, so the
                // exact figure stored when this guard goes is never above it.
                self.hot
                    .buffered
                    .fetch_add(inbox.events.len(), Ordering::SeqCst);
                std::mem::swap(&mut inbox.events, &mut taken);
                true
            }
        };
        // Sorted into the buffer outside the inbox lock: tracking threads go on appending.
        let spill_started = folding && {
            let overflow = memory.push_many(&mut taken, self.capacity(), self.store.is_some());
            self.hot.buffered.store(memory.held(), Ordering::SeqCst);
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

    /// Events in memory, the inbox included, for the checks that do not fold it.
    fn held(&self, inbox: &Inbox) -> usize {
        self.hot.buffered.load(Ordering::SeqCst) + inbox.events.len()
    }

    // ---- track() -------------------------------------------------------------------------

    /// Queues one event (`durability = spill`, or memory only). While memory has room this is
    /// one `Vec::push` under the inbox lock; at the limit it takes the exact path (the oldest
    /// move to the spill backlog, or drop, counted).
    pub fn push(&self, mut event: QueuedEvent) {
        let (capacity, limit) = (self.capacity(), self.hot.limit);
        // The spill is behind: this event is bound for it, and a ChaCha-sealing store's body is
        // sealed here, before the lock, on the thread that made the event, so that the spill
        // thread only writes it (decision 0070). Every other event: the two sides then share
        // the sealing, and most calls do not pay for one. The flag is the last call's look at
        // memory: one event late either way, sealed by the spill thread or sealed and not
        // spilled. A store sealing with AES-256-GCM (decision 0074), a plain store, or none,
        // pays for neither the seal nor the flag, and the store's own lines are not read
        // (`seals_ahead` first).
        let sealing = if self.hot.seals_ahead {
            self.store.as_ref()
        } else {
            None
        };
        if let Some(store) = sealing
            && event.seq.is_multiple_of(2)
            && self.hot.spill_behind.load(Ordering::Relaxed)
        {
            event.sealed = SealedAhead(store.seal_ahead(&event));
        }
        let event = {
            let mut inbox = self.hot.inbox.lock();
            let held = self.held(&inbox);
            if sealing.is_some() {
                let behind = held >= capacity + spill::SEAL_AHEAD_PAST;
                if behind != self.hot.spill_behind.load(Ordering::Relaxed) {
                    self.hot.spill_behind.store(behind, Ordering::Relaxed);
                }
            }
            if held < limit {
                inbox.events.push(event);
                // Freed by the caller once the lock is let go (see `hand_back`): two per call,
                // so tracking frees them faster than a spill that keeps pace hands them back.
                let spent = [inbox.pop_spent(), inbox.pop_spent()];
                // Past `memory_capacity` the oldest belong in the spill backlog: the spill
                // thread folds the inbox and writes them. Asked once per fold: the flag is read
                // before it is swapped, so the calls after the first only read a shared line.
                let ask = held >= capacity
                    && !self.hot.fold_asked.load(Ordering::SeqCst)
                    && !self.hot.fold_asked.swap(true, Ordering::SeqCst);
                // A spill lingering for more ([`Queue::gather`]) has a chunk's worth now.
                let full = held >= capacity + spill::SPILL_BATCH_MIN
                    && self.hot.spill_lingering.load(Ordering::SeqCst);
                drop(inbox);
                drop(spent);
                if ask {
                    self.ask_spiller();
                }
                if full {
                    self.wake_lingering_spill();
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

    /// Waits for the gate and enters it: `track()` of one durable event takes it before it
    /// makes the event, and keeps it through the commit ([`Queue::push_durably`]), so
    /// durable callers make their events one at a time, never beside the commit of another.
    /// On two cores that is what makes four such callers as fast as four raw commits behind
    /// a mutex (decision 0075). Who waits here has queued nothing yet: a caller is in the gate
    /// for its own event only, then one commit.
    pub fn durable_pass(&self) -> DurablePass<'_> {
        let deadline = Instant::now() + self.commit_wait;
        DurablePass {
            gate: lock(&self.durable_gate),
            deadline,
        }
    }

    /// `durability = always` (or a critical event): queues the events and returns once the
    /// store holds them, or why not. Group commit on the callers' own threads: each caller
    /// queues its events, then passes the gate ([`Queue::commit_through_gate`]), where it
    /// leaves at once if an earlier commit carried them, or commits everything queued by then.
    /// Whatever a spill or `persist()` commits meanwhile counts too. `track()` of one event
    /// enters the gate before it makes the event instead, and passes it here (`pass`: its first
    /// pass through the gate, and the deadline counted from before it); `None` queues first,
    /// then waits for the gate. With `durability = spill` (a critical event) the caller writes
    /// only the oldest events, as many as durable callers wait for (critical events sort before
    /// every normal one), so it is done once its own events commit, not once the whole backlog
    /// is on disk. The deadline ([`ALWAYS_COMMIT_WAIT`]) is checked before each pass and inside
    /// the gate.
    pub fn push_durably(
        &self,
        events: impl IntoIterator<Item = QueuedEvent>,
        mut pass: Option<DurablePass<'_>>,
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
        let deadline = pass
            .as_ref()
            .map_or_else(|| Instant::now() + self.commit_wait, |pass| pass.deadline);
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
                        self.commit_wait.as_secs()
                    )
                };
                return Err(self.abandon_ticket(ticket, reason));
            }
            self.commit_through_gate(ticket, deadline, pass.take());
        }
    }

    /// One pass of a durable caller through the gate: inside, it leaves if a commit made
    /// meanwhile carried its events; otherwise it takes the spill lock and commits everything
    /// queued by then (no lingering for more callers). Who queued and arrives during that
    /// commit (a `track_batch`) waits at the gate; the caller that leaves usually takes the
    /// gate again for its next event before they wake, and that commit carries theirs as well.
    /// `track()` of one event enters with `pass`, taken before it queued anything
    /// ([`Queue::durable_pass`]). The spill lock is waited for in slices so that a commit
    /// another thread makes (the spill thread, `persist()`) lets the caller leave while that
    /// thread still holds it, and never past `deadline`. A caller waits at the gate for at most
    /// the caller inside: until that one's deadline, then one commit.
    fn commit_through_gate(&self, ticket: u64, deadline: Instant, pass: Option<DurablePass<'_>>) {
        let _gate = match pass {
            Some(pass) => pass.gate,
            None => lock(&self.durable_gate),
        };
        while !self.ticket_outcome_ready(ticket) {
            let slice = deadline.saturating_duration_since(Instant::now());
            if slice.is_zero() {
                return;
            }
            if let Some(guard) = self.spill_lock.try_lock_for(slice.min(SPILL_LOCK_SLICE)) {
                let _ = self.spill_for_durable();
                parking_lot::MutexGuard::unlock_fair(guard);
                return;
            }
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

    /// See [`Store::normal_rows_by_order`]; `None` without a store.
    #[cfg(feature = "test-util")]
    pub fn normal_rows_by_order(&self) -> Option<Result<(u64, u64)>> {
        self.store.as_ref().map(Store::normal_rows_by_order)
    }

    /// What [`crate::Stats`] reports of the queue: events in memory, in the store, the store's
    /// bytes on disk, and the quarantine by reason.
    pub fn fill_stats(&self, stats: &mut crate::stats::Stats) {
        stats.pending_memory = self.memory().len() as u64;
        stats.quarantine = self.quarantine_by_reason();
        if let Some(store) = &self.store {
            stats.pending_disk = store.len();
            stats.store_bytes = store.disk_usage();
            stats.checkpoint_errors = store.checkpoint_errors();
        }
    }

    /// The quarantine's events by reason, in memory and in the store.
    pub fn quarantine_by_reason(&self) -> std::collections::BTreeMap<String, u64> {
        let mut counts = lock(&self.memory_quarantine).counts();
        if let Some(store) = &self.store {
            for (reason, n) in store.quarantine_counts().unwrap_or_default() {
                *counts.entry(reason).or_default() += n;
            }
        }
        counts
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

    /// The store's passive checkpoints from now on run on a thread of its own (a spool with
    /// threads; see store/checkpointer.rs). Without a store, nothing to do.
    pub fn checkpoint_in_background(&self) -> std::io::Result<()> {
        match &self.store {
            Some(store) => store.checkpoint_in_background(),
            None => Ok(()),
        }
    }

    /// Gives up the store's owner lock (after shutdown) so another handle may open it.
    pub fn release_ownership(&self) {
        if let Some(store) = &self.store {
            store.release_ownership();
        }
    }
}

#[cfg(test)]
mod failure_tests;

#[cfg(test)]
mod fault_table;

#[cfg(test)]
mod tests;
