//! The numbers an app, a test or an operator reads to know where every event went.
//!
//! The ledger this handle keeps, and that tests check exactly:
//! `tracked + restored + redriven = delivered + quarantined + dropped (queue reasons) + pending`.
//! `restored` counts events found in the store at open; the quarantine's own evictions
//! (`quarantine_cap`, `quarantine_expired`) leave the quarantine, not the queue, so they are
//! reported under `dropped` but are not part of that sum; so are `sampled` and `name_dropped`,
//! events a collector directive kept out at `track()` (never queued, never `tracked`).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};

/// Why events left without being delivered.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
#[non_exhaustive]
pub enum DropReason {
    /// Memory-only mode (or a store that could not keep up or was unavailable): memory was full.
    MemoryOverflow,
    /// The store reached `max_disk_bytes`; the oldest went first.
    DiskCap,
    /// Older than `max_event_age_ms`; never sent.
    Expired,
    /// `purge_pending()` after opting out.
    Purged,
    /// Quarantine over `quarantine_max_events`.
    QuarantineCap,
    /// Quarantined longer than `quarantine_retention_ms`.
    QuarantineExpired,
    /// Left out at `track()` by a collector's `sample_rate` directive (never queued).
    Sampled,
    /// Refused at `track()` by a collector's `drop_names` directive (never queued).
    NameDropped,
    /// Tracking consent was denied: what was kept for the user is deleted, never sent.
    ConsentDenied,
    /// Only in memory when the spool shut down, because the store refused them (disk full,
    /// I/O error): nothing was left to keep them.
    StoreRefused,
    /// Dead letters the store refused (they waited in memory meanwhile) when the spool shut
    /// down; like the quarantine's other drops, not part of the queue's ledger.
    QuarantineRefused,
}

impl DropReason {
    pub const ALL: [DropReason; 11] = [
        DropReason::MemoryOverflow,
        DropReason::DiskCap,
        DropReason::Expired,
        DropReason::Purged,
        DropReason::QuarantineCap,
        DropReason::QuarantineExpired,
        DropReason::Sampled,
        DropReason::NameDropped,
        DropReason::ConsentDenied,
        DropReason::StoreRefused,
        DropReason::QuarantineRefused,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            DropReason::MemoryOverflow => "memory_overflow",
            DropReason::DiskCap => "disk_cap",
            DropReason::Expired => "expired",
            DropReason::Purged => "purged",
            DropReason::QuarantineCap => "quarantine_cap",
            DropReason::QuarantineExpired => "quarantine_expired",
            DropReason::Sampled => "sampled",
            DropReason::NameDropped => "name_dropped",
            DropReason::ConsentDenied => "consent_denied",
            DropReason::StoreRefused => "store_refused",
            DropReason::QuarantineRefused => "quarantine_refused",
        }
    }

    /// Whether the events came out of the queue (and so count against `pending`). The
    /// directives' drops never entered it: they are not `tracked` either.
    pub fn leaves_queue(self) -> bool {
        !matches!(
            self,
            DropReason::QuarantineCap
                | DropReason::QuarantineExpired
                | DropReason::QuarantineRefused
                | DropReason::Sampled
                | DropReason::NameDropped
        )
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Stats {
    pub tracked: u64,
    pub restored: u64,
    pub redriven: u64,
    pub delivered: u64,
    pub quarantined: u64,
    /// By [`DropReason::as_str`].
    pub dropped: BTreeMap<String, u64>,
    /// Not yet delivered: in memory plus in the store.
    pub pending: u64,
    pub pending_memory: u64,
    pub pending_disk: u64,
    /// Events in quarantine now, by reason.
    pub quarantine: BTreeMap<String, u64>,
    /// On-disk size of the store (database plus WAL), 0 without one.
    pub store_bytes: u64,
    pub requests: u64,
    pub batches_delivered: u64,
    /// Times the store could not take events (disk full, I/O error).
    pub store_errors: u64,
    /// Checkpoints (the WAL copied back into the database) that failed after a write that
    /// committed: the write stands, the WAL is checkpointed after a later one.
    pub checkpoint_errors: u64,
    /// Store files found unusable and moved aside.
    pub stores_recovered: u64,
    /// Panics caught inside background tasks or observers.
    pub panics: u64,
    /// Ids a collector's 2xx listed as `rejected` that name no event of the batch it answers
    /// (compared as UUIDs, whatever their spelling): a collector bug worth a look, never
    /// taken for one of the batch's events.
    pub rejections_unmatched: u64,
    /// The body size (bytes before compression) timeouts have taught on the link in use: the
    /// next batches are no larger, and grow back after successes (docs/delivery.md §Slow
    /// links). `None` while nothing is taught, or after a reconnect.
    pub slow_link_batch_bytes: Option<u64>,
    /// Collector directives taken, and directive fields ignored (malformed, unknown, expired,
    /// or turned off with `directives = false`); see docs/protocol.md §Directives.
    pub directives_applied: u64,
    pub directives_ignored: u64,
    /// The collector's directive in force now, if any (docs/protocol.md §Directives); the app
    /// may end it with [`crate::EventSpool::clear_directive`].
    pub directive: Option<DirectiveInForce>,
}

/// A collector's directive as it holds on this device now: what it does and when it ends.
#[derive(Clone, Debug, Default, PartialEq)]
#[non_exhaustive]
pub struct DirectiveInForce {
    pub id: String,
    /// Milliseconds of its life left, counted on the device's monotonic clock from its arrival.
    pub expires_in_ms: u64,
    /// The same as a wall-clock estimate (Unix ms), for display.
    pub expires_at_ms: i64,
    /// No request before this (Unix ms), already capped at `retry_after_cap_ms`.
    pub pause_until_ms: Option<i64>,
    /// (name prefix, fraction kept), longest prefix first; the critical lane is never sampled.
    pub sample_rate: Vec<(String, f64)>,
    /// Names `track()` refuses; the critical lane is never refused.
    pub drop_names: Vec<String>,
    /// Its one-shot actions (run once per id, when it first arrived).
    pub redrive: Vec<String>,
    pub purge_quarantine: Vec<String>,
}

/// The fractions are checked to lie in [0, 1] when the directive is read, so none is NaN and
/// equality is an equivalence.
impl Eq for DirectiveInForce {}

impl Stats {
    pub fn dropped(&self, reason: DropReason) -> u64 {
        self.dropped.get(reason.as_str()).copied().unwrap_or(0)
    }

    /// Drops that took events out of the queue.
    pub fn dropped_from_queue(&self) -> u64 {
        DropReason::ALL
            .iter()
            .filter(|r| r.leaves_queue())
            .map(|r| self.dropped(*r))
            .sum()
    }

    /// Whether the ledger balances (see the module docs).
    pub fn balances(&self) -> bool {
        // Summed wide: a wrapped-around `pending` (a miscount) must fail, not wrap back to equal.
        let wide = |v: u64| u128::from(v);
        wide(self.tracked) + wide(self.restored) + wide(self.redriven)
            == wide(self.delivered)
                + wide(self.quarantined)
                + wide(self.dropped_from_queue())
                + wide(self.pending)
    }
}

/// How events enter the queue, for [`Counters::entered`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Entry {
    /// `track()` and its kin.
    Tracked,
    /// Found in the store at open.
    Restored,
    /// Moved back from the quarantine.
    Redriven,
}

/// How events leave the queue without a drop reason, for [`Counters::left`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Exit {
    Delivered,
    Quarantined,
}

/// The live counters behind [`Stats`]; lock-free so `track()` pays a few atomic adds.
///
/// Every move of events changes two ledger counters (`tracked` and `pending`, `delivered` and
/// `pending`, ...). The moves go through [`Counters::entered`], [`Counters::left`] and
/// [`Counters::drop`], which hold the shared side of a gate while they update; a
/// [`Counters::snapshot`] takes the exclusive side for the few loads it makes, so it never sees
/// a move half done and a snapshot taken while events move still balances exactly. Many moves
/// pass the gate at once; a snapshot waits only for the moves in progress (a few atomic adds),
/// and `parking_lot`'s lock lets it in ahead of new ones, so a thread tracking in a tight loop
/// cannot starve `stats()`.
#[derive(Default)]
pub struct Counters {
    tracked: AtomicU64,
    restored: AtomicU64,
    redriven: AtomicU64,
    delivered: AtomicU64,
    quarantined: AtomicU64,
    pending: AtomicI64,
    pub requests: AtomicU64,
    pub batches_delivered: AtomicU64,
    pub store_errors: AtomicU64,
    pub stores_recovered: AtomicU64,
    pub panics: AtomicU64,
    pub rejections_unmatched: AtomicU64,
    /// [`Stats::slow_link_batch_bytes`], 0 for none; the worker stores it after each answer.
    pub slow_link_batch_bytes: AtomicU64,
    dropped: [AtomicU64; DropReason::ALL.len()],
    /// Shared by moves, exclusive for a snapshot.
    gate: parking_lot::RwLock<()>,
}

impl Counters {
    /// Runs one move of the ledger, marked so a snapshot never sees half of it.
    fn moving<T>(&self, f: impl FnOnce() -> T) -> T {
        let _move = self.gate.read();
        f()
    }

    /// Counts events that entered the queue; returns the pending count before them.
    pub fn entered(&self, how: Entry, n: u64) -> i64 {
        if n == 0 {
            return self.pending.load(Ordering::SeqCst);
        }
        let counter = match how {
            Entry::Tracked => &self.tracked,
            Entry::Restored => &self.restored,
            Entry::Redriven => &self.redriven,
        };
        self.moving(|| {
            counter.fetch_add(n, Ordering::SeqCst);
            self.pending.fetch_add(n as i64, Ordering::SeqCst)
        })
    }

    /// Counts events that left the queue delivered or quarantined.
    pub fn left(&self, how: Exit, n: u64) {
        if n == 0 {
            return;
        }
        let counter = match how {
            Exit::Delivered => &self.delivered,
            Exit::Quarantined => &self.quarantined,
        };
        self.moving(|| {
            counter.fetch_add(n, Ordering::SeqCst);
            self.pending.fetch_sub(n as i64, Ordering::SeqCst);
        });
    }

    pub fn drop(&self, reason: DropReason, n: u64) {
        if n == 0 {
            return;
        }
        self.moving(|| {
            self.dropped[reason as usize].fetch_add(n, Ordering::SeqCst);
            if reason.leaves_queue() {
                self.pending.fetch_sub(n as i64, Ordering::SeqCst);
            }
        });
    }

    /// Not clamped: a count below zero is a ledger bug (an event counted out twice), and it
    /// shows as an absurdly large `pending` that fails [`Stats::balances`] instead of hiding as 0.
    pub fn pending(&self) -> u64 {
        self.pending.load(Ordering::SeqCst) as u64
    }

    /// The counters as one consistent picture (see the type's docs).
    pub fn snapshot(&self) -> Stats {
        let _no_move = self.gate.write();
        self.read()
    }

    fn read(&self) -> Stats {
        let get = |c: &AtomicU64| c.load(Ordering::SeqCst);
        Stats {
            tracked: get(&self.tracked),
            restored: get(&self.restored),
            redriven: get(&self.redriven),
            delivered: get(&self.delivered),
            quarantined: get(&self.quarantined),
            dropped: DropReason::ALL
                .iter()
                .map(|r| (r.as_str().to_string(), get(&self.dropped[*r as usize])))
                .collect(),
            pending: self.pending(),
            requests: get(&self.requests),
            batches_delivered: get(&self.batches_delivered),
            store_errors: get(&self.store_errors),
            stores_recovered: get(&self.stores_recovered),
            panics: get(&self.panics),
            rejections_unmatched: get(&self.rejections_unmatched),
            slow_link_batch_bytes: Some(get(&self.slow_link_batch_bytes)).filter(|b| *b > 0),
            ..Stats::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::AtomicBool;

    /// Snapshots taken while other threads move events in and out still balance: without the
    /// in-progress marks a reader between `delivered += n` and `pending -= n` saw the events in
    /// neither place (a flaky ledger check under load).
    #[test]
    fn a_snapshot_taken_while_events_move_balances() {
        let counters = Arc::new(Counters::default());
        let stop = Arc::new(AtomicBool::new(false));
        let movers: Vec<_> = (0..3)
            .map(|i| {
                let (c, stop) = (counters.clone(), stop.clone());
                std::thread::spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        c.entered(Entry::Tracked, 3);
                        c.left(Exit::Delivered, 1);
                        Counters::drop(&c, DropReason::Expired, 1);
                        c.left(
                            if i == 0 {
                                Exit::Quarantined
                            } else {
                                Exit::Delivered
                            },
                            1,
                        );
                    }
                })
            })
            .collect();
        let mut unbalanced = 0;
        for _ in 0..20_000 {
            if !counters.snapshot().balances() {
                unbalanced += 1;
            }
        }
        stop.store(true, Ordering::Relaxed);
        for m in movers {
            m.join().unwrap();
        }
        assert_eq!(unbalanced, 0, "snapshots that did not balance");
        assert!(counters.snapshot().balances());
    }
}

/// The spool's counters, shared by the handle, the worker and the queue. A newtype so that
/// `counters.drop(reason, n)` keeps meaning [`Counters::drop`] (on an `Arc` it would name the
/// destructor).
#[derive(Clone, Default)]
pub struct Ledger(std::sync::Arc<Counters>);

impl std::ops::Deref for Ledger {
    type Target = Counters;
    fn deref(&self) -> &Counters {
        &self.0
    }
}
