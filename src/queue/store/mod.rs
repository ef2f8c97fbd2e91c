//! The SQLite store: the queue's overflow on disk, the quarantine, and persistent counters, in one
//! file that never grows past `max_disk_bytes` (database plus WAL, measured on disk).
//!
//! One process owns a store at a time: a lock file next to it refuses a second handle with a
//! clear error instead of letting two senders race ("database is locked", double sends). Within
//! that owner, the events of the batch in flight are leased in memory so the disk cap never
//! evicts what the collector may be acknowledging; a crash leaves them in the table, so they are
//! sent again after restart with the same `event_id`s.
//!
//! This file holds the [`Store`] itself and its small accessors. The rest is split by concern:
//! opening (open.rs), the count saved at close (count_at_close.rs), writes and the disk cap
//! (writes.rs), reads and leases (reads.rs), rows leaving the queue (deletes.rs), the dead
//! letters' transactions (dead_letters.rs), besides the schema, the frontier, the WAL watch, the
//! thread that runs the checkpoints (checkpointer.rs) and the SQL of the quarantine, consent and
//! fleet.

mod checkpointer;
mod consent_sql;
mod count_at_close;
mod dead_letters;
mod deletes;
pub mod faults;
mod fleet_sql;
mod frontier;
mod in_flight;
mod open;
mod quarantine_sql;
mod read_ahead;
mod reads;
pub mod schema;
mod wal;
mod writes;

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use rusqlite::{Connection, ErrorCode, Transaction, params};
use uuid::Uuid;

use crate::crypto::Keyring;
use crate::error::{Error, Result};
use crate::event::{
    EventId, LANE_CRITICAL, LANE_NORMAL, OrderKey, QueuedEvent, SendNote, with_wire_head,
};
use crate::quarantine::{QuarantinedEvent, reason};
use crate::sync::lock;

pub use consent_sql::WAL_TRUNCATE_BOUND;
use deletes::rows_present;
use faults::FaultPoint;
use frontier::{
    Frontier, IN_ORDER_ABOVE, IN_ORDER_BELOW, IN_ORDER_FROM, IN_ORDER_ROWS, INDEXED_ALL,
    INDEXED_ROWS_OF_LANE,
};
pub(crate) use open::check_keys;
use quarantine_sql::ByteLimits;
pub use quarantine_sql::QuarantineSql;
use wal::WalWatch;
use writes::db_excess;

/// Counter names persisted in the `counters` table.
pub mod counter {
    pub const DISK_CAP: &str = "dropped.disk_cap";
    pub const EXPIRED: &str = "dropped.expired";
    pub const QUARANTINE_CAP: &str = "dropped.quarantine_cap";
    pub const QUARANTINE_EXPIRED: &str = "dropped.quarantine_expired";
    pub const CONSENT_DENIED: &str = "dropped.consent_denied";
}

/// Names in the `meta` table.
pub mod meta {
    /// Tracking consent as the app last set it (`pending`, `granted`, `denied`).
    pub const CONSENT: &str = "consent";
    /// The opt-out as the app last set it (`true`, `false`); see [`super::consent_sql`].
    pub const ENABLED: &str = "enabled";
    /// The random id this install reports under (src/fleet); a denial deletes it.
    pub const INSTALL_ID: &str = "install_id";
    /// The rows of the batch a denial spared because it was on the wire (seqs, comma
    /// separated), written with the denial's deletion: an open that finds it deletes them, so a
    /// crash before the answer never lets a later grant send them ([`super::consent_sql`]).
    pub const SPARED_BY_DENIAL: &str = "spared_by_denial";
    /// The queued rows when the last owner let go of the store ([`super::Store::release_ownership`]);
    /// taken out by the next open, so it is present only after a clean close.
    pub const QUEUE_ROWS_AT_CLOSE: &str = "queue_rows_at_close";
}

/// How `max_disk_bytes` is shared between the database file and its WAL, how much of the
/// database the dead letters may take, and how much one transaction may write so the WAL stays
/// inside its share between checkpoints.
///
/// The dead letters' budget is a quarter of the database's share: they never take more (the
/// oldest go first, `quarantine_cap`), and queued events, which may use the rest and any of it
/// the dead letters leave free, are never evicted to make room for them.
#[derive(Clone, Copy, Debug)]
struct DiskBudget {
    cap: u64,
    db_bytes: u64,
    dead_bytes: u64,
    wal_bytes: u64,
    txn_bytes: u64,
}

impl DiskBudget {
    fn new(cap: u64) -> DiskBudget {
        let wal_bytes = cap / 4;
        let db_bytes = cap - wal_bytes;
        DiskBudget {
            cap,
            db_bytes,
            dead_bytes: db_bytes / 4,
            wal_bytes,
            txn_bytes: (cap / 32).max(1),
        }
    }
}

/// The most pages the WAL gathers before the store checkpoints it (SQLite's own default), whatever
/// the cap allows. After a complete checkpoint the next commit writes the WAL from its start
/// again, over blocks the file system already holds; a WAL left to grow to a large cap's share
/// appends every frame to new blocks instead, which made a one-row commit cost about twice a
/// raw one in the benchmark (8 GiB cap), and makes SQLite's frame lookup slower on reads.
const WAL_CHECKPOINT_PAGES_MAX: u64 = 1_000;

/// The same bound for the checkpointer's thread (checkpointer.rs), higher because its copy runs
/// off the writers' threads. What a writer still pays is the start of the log over: the frames
/// added while the thread copied are copied by the next commit, two syncs, 1.2-1.5 ms measured,
/// which on a drain delays the next answer. At 1,000 pages a 100,000-event drain met about 14
/// of them; at 4,000 (16 MiB of log at 4 KiB pages, still written over from its start) it met
/// 3, and the slowest hundredth of the deletes beside its requests went from 1.4-1.5 ms to
/// 0.16-0.27 ms.
const BACKGROUND_CHECKPOINT_PAGES_MAX: u64 = 4_000;

/// The frames at which a commit asks for a passive checkpoint. In the committing thread, at
/// half the WAL's share: the disk cap's truncating checkpoint
/// ([`Store::checkpoint_if_needed`]) fires at the same point, so a small cap's log is emptied
/// at each crossing. On the checkpointer's thread, at a quarter: the log starts over well
/// before the cap needs it truncated, so the truncating one (which the writer runs, and
/// waits for) stays for a log the thread could not keep down.
fn checkpoint_frames(budget: DiskBudget, page_size: u64, background: bool) -> u64 {
    let (share, most) = if background {
        (4, BACKGROUND_CHECKPOINT_PAGES_MAX)
    } else {
        (2, WAL_CHECKPOINT_PAGES_MAX)
    };
    (budget.wal_bytes / share / page_size.max(512)).clamp(8, most)
}

/// What a write that failed part-way had done ([`Store::insert`]): the transactions before
/// the one that failed committed `committed` events (the first ones given) and evicted what
/// `done` says. The store counts them; the caller keeps the rest.
#[derive(Debug)]
pub struct PartialInsert {
    pub done: Inserted,
    pub committed: usize,
    pub error: Error,
}

/// What [`Store::take_undecryptable`] reports.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Undecryptable {
    pub quarantined: u64,
    pub evicted: u64,
}

/// What an insert did besides inserting.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Inserted {
    pub inserted: u64,
    /// Oldest queued events removed to honour the disk cap.
    pub evicted: u64,
    /// Oldest quarantined events removed to honour the disk cap.
    pub evicted_quarantine: u64,
}

pub struct Store {
    conn: Mutex<Connection>,
    path: PathBuf,
    budget: DiskBudget,
    page_size: u64,
    /// Queued rows, kept in memory so stats never count the table.
    rows: AtomicU64,
    /// Seqs of the batch in flight: the disk cap and expiry leave them alone.
    leased: Mutex<Vec<u64>>,
    /// The owner's lock; `None` once given up by [`Store::release_ownership`].
    lock: Mutex<Option<File>>,
    /// Transactions that wrote queued events: group commit is visible in it.
    insert_transactions: AtomicU64,
    /// Checkpoints that failed after a commit ([`Store::checkpoint_if_needed`], and the
    /// background ones: checkpointer.rs).
    checkpoint_errors: Arc<AtomicU64>,
    /// The thread that runs the passive checkpoints, once there is one (checkpointer.rs).
    background: Mutex<Option<checkpointer::Background>>,
    /// Queued rows whose fate is decided (delivered, expired) but whose delete failed: hidden
    /// from reads and from [`Store::len`], deleted first by the next write transaction that
    /// commits ([`Store::settle_owed`]). A crash before that leaves them queued, to be sent
    /// again with the same ids (the collector deduplicates), never lost.
    owed: Mutex<Vec<Owed>>,
    /// Client reports a 2xx covered, deleted like the delivered rows: by the next
    /// [`Store::settle`], while the next request is on the wire, instead of by a commit of
    /// their own between an answer and the next request. A crash before that sends them
    /// again; the collector counts each report id once.
    owed_reports: Mutex<Vec<u64>>,
    /// Set when more rows left than the store counted: the count is not saved at close, so
    /// the next open counts the table.
    count_drifted: std::sync::atomic::AtomicBool,
    /// The keys rows are sealed and opened with (crypto.rs); plain text without any.
    keys: Keyring,
    /// Queued rows [`Store::oldest`] found undecryptable and moved to the quarantine, not yet
    /// counted by the queue ([`Store::take_undecryptable`]).
    undecryptable: AtomicU64,
    /// Dead letters evicted to make room for them, likewise.
    undecryptable_evicted: AtomicU64,
    /// No queued row was accepted before this (ms), or [`FLOOR_UNKNOWN`]. It lets
    /// [`Store::expire`], which runs before every batch, answer "nothing is due" without
    /// reading the table, and without an index on `accepted` that every commit would write
    /// (schema step 4 → 5). Lowered by every write that queues a row, raised only by a scan;
    /// both under the connection lock, so it never passes a row it has not seen.
    accepted_floor: AtomicI64,
    /// An upper bound of the database's pages (free pages included), or [`PAGES_UNKNOWN`]: the
    /// last `page_count` the cap measured plus the most every insert since could have added.
    /// While it stays inside the database's share, an insert needs no measuring (a `PRAGMA
    /// page_count` is re-prepared at every run: a tenth of a one-row commit). Any other use
    /// of the connection forgets it ([`Store::conn`]), so only inserts ever add to it.
    pages_bound: AtomicU64,
    /// The WAL's size as SQLite reports it (wal.rs), for the check after each write.
    wal: Arc<WalWatch>,
    /// The database file's size when last read; read again only after a checkpoint.
    db_file_bytes: AtomicU64,
    /// Which new rows skip the ordering index (frontier.rs). Taken only with the connection
    /// held.
    frontier: Mutex<Frontier>,
    /// The dead letters by reason as last counted, or `None` once any write may have changed
    /// them: `stats()` reads this instead of waiting for the connection behind a spill, and a
    /// sealed store does not open every reason at each call. Set, and cleared, only with the
    /// connection held.
    quarantine_counts: Mutex<Option<BTreeMap<String, u64>>>,
    /// The rows on the wire as the `meta` record names them (in_flight.rs), whose send count
    /// has not reached them yet.
    in_flight: Mutex<Vec<u64>>,
    /// Rows the record also names, read ahead for the next batch and not sent yet, sorted
    /// ([`Store::settle_recording_ahead`]).
    recorded_ahead: Mutex<Vec<u64>>,
    /// The next batch's rows, read while the one before it was on the wire (read_ahead.rs).
    read_ahead: Mutex<Option<read_ahead::ReadAhead>>,
    /// Batches given back to the queue ([`Store::release`]): a read ahead from before one is
    /// not taken.
    given_back: AtomicU64,
    /// Where the connection came from (faults.rs). Last, so the connection closes first.
    faults: FaultPoint,
}

/// A row the store owes a delete ([`Store::owed`]), and the persisted counter the delete bumps.
#[derive(Clone, Copy, Debug)]
struct Owed {
    seq: u64,
    counted_as: Option<&'static str>,
}

/// [`Store::accepted_floor`] before the first scan: anything may be due.
const FLOOR_UNKNOWN: i64 = i64::MIN;

/// [`Store::pages_bound`] when the next insert must measure.
const PAGES_UNKNOWN: u64 = u64::MAX;

/// A store as opened: the file may have been moved aside and replaced.
pub struct Opened {
    pub store: Store,
    /// Where an unusable file was moved, and why.
    pub recovered: Option<(PathBuf, String)>,
}

fn sqlite_code(e: &rusqlite::Error) -> Option<ErrorCode> {
    match e {
        rusqlite::Error::SqliteFailure(f, _) => Some(f.code),
        _ => None,
    }
}

/// The file is damaged or not an SQLite database at all (as opposed to, say, a full disk).
fn is_corruption(e: &rusqlite::Error) -> bool {
    matches!(
        sqlite_code(e),
        Some(ErrorCode::DatabaseCorrupt | ErrorCode::NotADatabase)
    )
}

fn storage(what: &str, path: &Path, e: impl std::fmt::Display) -> Error {
    Error::Storage(format!("{what} {}: {e}", path.display()))
}

impl Store {
    /// The connection, for anything but an insert: whatever it does may grow the database, so
    /// the insert after it measures again ([`Store::pages_bound`]).
    fn conn(&self) -> MutexGuard<'_, Connection> {
        let conn = lock(&self.conn);
        self.pages_bound.store(PAGES_UNKNOWN, Ordering::Relaxed);
        conn
    }

    /// No queued row is older than `accepted_ms` from now on (called with the connection held).
    fn lower_accepted_floor(&self, accepted_ms: i64) {
        self.accepted_floor
            .fetch_min(accepted_ms, Ordering::Relaxed);
    }

    /// The rows leased to the batch in flight.
    pub fn leased_seqs(&self) -> Vec<u64> {
        self.leased().clone()
    }

    fn leased(&self) -> MutexGuard<'_, Vec<u64>> {
        lock(&self.leased)
    }

    /// Queued events on disk.
    pub fn len(&self) -> u64 {
        self.rows.load(Ordering::Relaxed)
    }

    /// Transactions [`Store::insert`] committed so far.
    #[cfg(test)]
    pub fn insert_transactions(&self) -> u64 {
        self.insert_transactions.load(Ordering::Relaxed)
    }

    /// Counts rows that left the table. Never below zero: more leaving than were counted is a
    /// drift, and the count is then not saved at close ([`Store::count_drifted`]).
    fn forget_rows(&self, n: u64) {
        let before = self
            .rows
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |rows| {
                Some(rows.saturating_sub(n))
            })
            .unwrap_or(0);
        if before < n {
            self.count_drifted.store(true, Ordering::Relaxed);
            tracing::warn!(
                counted = before,
                left = n,
                "the store's queued count drifted"
            );
        }
    }

    /// The next free seq, so `track()` order continues across restarts: past the rows on disk,
    /// and past the frontier, which may name rows deleted since it was read (frontier.rs).
    pub fn next_seq(&self) -> Result<u64> {
        let max: Option<i64> = self
            .conn()
            .query_row("SELECT max(seq) FROM events", [], |r| r.get(0))?;
        let after_rows = max.map(|m| m as u64 + 1).unwrap_or(1);
        Ok(after_rows.max(lock(&self.frontier).next_free()))
    }

    /// The database file.
    #[cfg(feature = "test-util")]
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Bytes the store occupies on disk now: the database file plus its WAL.
    pub fn disk_usage(&self) -> u64 {
        disk_usage(&self.path)
    }

    /// Checkpoints that failed after a write that committed ([`Store::checkpoint_if_needed`],
    /// and the background ones: checkpointer.rs).
    pub fn checkpoint_errors(&self) -> u64 {
        self.checkpoint_errors.load(Ordering::Relaxed)
    }

    /// A small named value kept across restarts: what the app decided (see [`meta`]) and the
    /// fleet loop's install id, directives and report numbering (src/fleet).
    pub fn meta(&self, name: &str) -> Result<Option<String>> {
        Ok(read_meta(&self.conn(), name)?)
    }

    pub fn set_meta(&self, name: &str, value: &str) -> Result<()> {
        self.put_meta(name, value, false)
    }

    /// [`Store::set_meta`] for what the app decided that must hold after a power cut too (the
    /// opt-out, consent): committed with the WAL synced ([`schema::SYNCED`]), so the verb that
    /// writes it returns once it, and everything committed before it, is on the disk. One sync,
    /// on a verb an app calls rarely.
    pub fn set_meta_synced(&self, name: &str, value: &str) -> Result<()> {
        self.put_meta(name, value, true)
    }

    fn put_meta(&self, name: &str, value: &str, synced: bool) -> Result<()> {
        let conn = self.conn();
        if synced {
            conn.pragma_update(None, "synchronous", schema::SYNCED)?;
        }
        let written = write_meta(&conn, name, value);
        let restored = match synced {
            true => conn.pragma_update(None, "synchronous", schema::SYNCHRONOUS),
            false => Ok(()),
        };
        self.checked(&conn, written.map_err(Error::from))?;
        restored?;
        self.checkpoint_if_needed(&conn);
        Ok(())
    }
}

/// Takes every seq of `gone` out of `list` (the leased rows, the record of the rows on the
/// wire): one sort of `gone`, then a binary search per element, not a pass over `gone` each.
fn remove_seqs(list: &mut Vec<u64>, gone: &[u64]) {
    if list.is_empty() || gone.is_empty() {
        return;
    }
    let mut gone = gone.to_vec();
    gone.sort_unstable();
    list.retain(|s| gone.binary_search(s).is_err());
}

/// The value named `name` in the `meta` table ([`meta`]), if any.
fn read_meta(conn: &Connection, name: &str) -> rusqlite::Result<Option<String>> {
    use rusqlite::OptionalExtension;
    conn.prepare_cached("SELECT value FROM meta WHERE name = ?1")?
        .query_row([name], |r| r.get(0))
        .optional()
}

/// Sets the value named `name` in the `meta` table (also inside a transaction: `conn` may be
/// one). Cached, like [`bump`]: a batch's send record and report are written with it.
fn write_meta(conn: &Connection, name: &str, value: &str) -> rusqlite::Result<()> {
    conn.prepare_cached(
        "INSERT INTO meta (name, value) VALUES (?1, ?2)
         ON CONFLICT(name) DO UPDATE SET value = ?2",
    )?
    .execute(params![name, value])?;
    Ok(())
}

pub(crate) fn bump(tx: &Transaction<'_>, name: &str, by: u64) -> Result<()> {
    tx.prepare_cached(
        "INSERT INTO counters (name, value) VALUES (?1, ?2) ON CONFLICT(name) DO UPDATE SET value = value + ?2",
    )?
    .execute(params![name, by as i64])?;
    Ok(())
}

fn wal_path(path: &Path) -> PathBuf {
    PathBuf::from(format!("{}-wal", path.display()))
}

fn file_size(path: &Path) -> u64 {
    std::fs::metadata(path).map(|m| m.len()).unwrap_or(0)
}

/// Database file plus WAL, as the file system reports them.
pub fn disk_usage(path: &Path) -> u64 {
    file_size(path) + file_size(&wal_path(path))
}

#[cfg(test)]
mod checkpointer_tests;
#[cfg(test)]
mod failure_tests;

#[cfg(test)]
mod pipeline_tests;
#[cfg(test)]
mod tests;
