//! The numbers an app, a test or an operator reads to know where every event went.
//!
//! The ledger this handle keeps, and that tests check exactly:
//! `tracked + restored + redriven = delivered + quarantined + dropped (queue reasons) + pending`.
//! `restored` counts events found in the store at open; the quarantine's own evictions
//! (`quarantine_cap`, `quarantine_expired`) leave the quarantine, not the queue, so they are
//! reported under `dropped` but are not part of that sum.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};

/// Why events left without being delivered.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
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
}

impl DropReason {
    pub const ALL: [DropReason; 6] = [
        DropReason::MemoryOverflow,
        DropReason::DiskCap,
        DropReason::Expired,
        DropReason::Purged,
        DropReason::QuarantineCap,
        DropReason::QuarantineExpired,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            DropReason::MemoryOverflow => "memory_overflow",
            DropReason::DiskCap => "disk_cap",
            DropReason::Expired => "expired",
            DropReason::Purged => "purged",
            DropReason::QuarantineCap => "quarantine_cap",
            DropReason::QuarantineExpired => "quarantine_expired",
        }
    }

    /// Whether the events came out of the queue (and so count against `pending`).
    pub fn leaves_queue(self) -> bool {
        !matches!(
            self,
            DropReason::QuarantineCap | DropReason::QuarantineExpired
        )
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
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
    /// Store files found unusable and moved aside.
    pub stores_recovered: u64,
    /// Panics caught inside background tasks or observers.
    pub panics: u64,
}

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

/// The live counters behind [`Stats`]; lock-free so `track()` pays a few atomic adds.
#[derive(Default)]
pub struct Counters {
    pub tracked: AtomicU64,
    pub restored: AtomicU64,
    pub redriven: AtomicU64,
    pub delivered: AtomicU64,
    pub quarantined: AtomicU64,
    pub pending: AtomicI64,
    pub requests: AtomicU64,
    pub batches_delivered: AtomicU64,
    pub store_errors: AtomicU64,
    pub stores_recovered: AtomicU64,
    pub panics: AtomicU64,
    dropped: [AtomicU64; 6],
}

impl Counters {
    /// Counts events that entered the queue; returns the pending count before them.
    pub fn enqueued(&self, n: u64) -> i64 {
        self.pending.fetch_add(n as i64, Ordering::SeqCst)
    }

    /// Counts events that left the queue without a drop reason (delivered or quarantined).
    pub fn dequeued(&self, n: u64) {
        self.pending.fetch_sub(n as i64, Ordering::SeqCst);
    }

    pub fn drop(&self, reason: DropReason, n: u64) {
        if n == 0 {
            return;
        }
        self.dropped[reason as usize].fetch_add(n, Ordering::Relaxed);
        if reason.leaves_queue() {
            self.dequeued(n);
        }
    }

    /// Not clamped: a count below zero is a ledger bug (an event counted out twice), and it
    /// shows as an absurdly large `pending` that fails [`Stats::balances`] instead of hiding as 0.
    pub fn pending(&self) -> u64 {
        self.pending.load(Ordering::SeqCst) as u64
    }

    pub fn snapshot(&self) -> Stats {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
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
            ..Stats::default()
        }
    }
}
