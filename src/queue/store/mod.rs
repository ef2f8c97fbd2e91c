//! The SQLite store: the queue's overflow on disk, the quarantine, and persistent counters, in one
//! file that never grows past `max_disk_bytes` (database plus WAL, measured on disk).
//!
//! One process owns a store at a time: a lock file next to it refuses a second handle with a
//! clear error instead of letting two senders race ("database is locked", double sends). Within
//! that owner, the events of the batch in flight are leased in memory so the disk cap never
//! evicts what the collector may be acknowledging; a crash leaves them in the table, so they are
//! sent again after restart with the same `event_id`s.

mod consent_sql;
mod count_at_close;
pub mod faults;
mod fleet_sql;
mod frontier;
mod open;
mod quarantine_sql;
pub mod schema;
mod wal;

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
use crate::shared::lock;

pub use consent_sql::WAL_TRUNCATE_BOUND;
use faults::FaultPoint;
use frontier::{Frontier, IN_ORDER_FROM, IN_ORDER_ROWS, INDEXED_ALL, INDEXED_ROWS_OF_LANE};
pub(crate) use open::check_keys;
use quarantine_sql::ByteLimits;
pub use quarantine_sql::QuarantineSql;
use wal::WalWatch;

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
    /// Checkpoints that failed after a commit ([`Store::checkpoint_if_needed`]).
    checkpoint_errors: AtomicU64,
    /// Queued rows whose fate is decided (delivered, expired) but whose delete failed: hidden
    /// from reads and from [`Store::len`], deleted first by the next write transaction that
    /// commits ([`Store::settle_owed`]). A crash before that leaves them queued, to be sent
    /// again with the same ids (the collector deduplicates), never lost.
    owed: Mutex<Vec<Owed>>,
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
    /// Where the connection came from (faults.rs). Last, so the connection closes first.
    faults: FaultPoint,
}

/// Why [`Store::connect`] gave no connection, short of an SQLite error.
enum Refused {
    /// Not a store this build may use: moved aside.
    Unusable(schema::Unusable),
    /// A wrong or missing key: refused, the file left as it was.
    Key(Error),
}

/// A row the store owes a delete ([`Store::owed`]), and the persisted counter the delete bumps.
#[derive(Clone, Copy, Debug)]
struct Owed {
    seq: u64,
    counted_as: Option<&'static str>,
}

/// A connection to a store that is ours, configured and migrated.
struct Connected {
    conn: Connection,
    rows: u64,
    page_size: u64,
    wal: Arc<WalWatch>,
    frontier: Frontier,
}

/// [`Store::accepted_floor`] before the first scan: anything may be due.
const FLOOR_UNKNOWN: i64 = i64::MIN;

/// [`Store::pages_bound`] when the next insert must measure.
const PAGES_UNKNOWN: u64 = u64::MAX;

/// The most pages one inserted row can add to the database besides its overflow pages: each
/// of its two b-trees (the table and the `(lane, ts, seq)` index) splits at most every level,
/// a split adding at most two pages (SQLite rebalances three siblings into at most five), and
/// may gain a root level; plus a pointer-map page (`auto_vacuum`). A height of 6 holds far
/// more rows than any cap allows; the figure is rounded up generously, since it only decides
/// when to measure.
const ROW_PAGES_MAX: u64 = 64;

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

    /// Deletes, inside `tx`, the rows the store owes a delete ([`Store::owed`]), bumping the
    /// counters they are owed under; returns their seqs, for [`Store::owed_settled`] once `tx`
    /// committed.
    fn settle_owed(&self, tx: &Transaction<'_>) -> Result<Vec<u64>> {
        let owed: Vec<Owed> = lock(&self.owed).clone();
        if owed.is_empty() {
            return Ok(Vec::new());
        }
        let mut counted: BTreeMap<&'static str, u64> = BTreeMap::new();
        {
            let mut stmt = tx.prepare_cached("DELETE FROM events WHERE seq = ?1")?;
            for o in &owed {
                let n = stmt.execute([o.seq as i64])? as u64;
                if let Some(name) = o.counted_as {
                    *counted.entry(name).or_default() += n;
                }
            }
        }
        for (name, n) in counted {
            if n > 0 {
                bump(tx, name, n)?;
            }
        }
        Ok(owed.iter().map(|o| o.seq).collect())
    }

    /// After the transaction that ran [`Store::settle_owed`] committed.
    fn owed_settled(&self, seqs: &[u64]) {
        if seqs.is_empty() {
            return;
        }
        let mut owed = lock(&self.owed);
        owed.retain(|o| !seqs.contains(&o.seq));
        self.faults.note_owed(owed.len() as u64);
    }

    /// The seqs a read must pass over: the batch in flight and the rows owed a delete.
    fn skipped(&self) -> Vec<u64> {
        let mut seqs = self.leased().clone();
        seqs.extend(lock(&self.owed).iter().map(|o| o.seq));
        seqs
    }

    /// Settles the owed deletes on their own, when there are any (before a read).
    fn try_settle_owed(&self, conn: &mut Connection) {
        if lock(&self.owed).is_empty() {
            return;
        }
        let settled = (|| -> Result<Vec<u64>> {
            let tx = conn.transaction()?;
            let settled = self.settle_owed(&tx)?;
            tx.commit()?;
            Ok(settled)
        })();
        match settled {
            Ok(seqs) => {
                self.owed_settled(&seqs);
                self.checkpoint_if_needed(conn);
            }
            Err(e) => tracing::debug!(error = %e, "owed deletes still failing"),
        }
    }

    /// The next free seq, so `track()` order continues across restarts.
    pub fn next_seq(&self) -> Result<u64> {
        let max: Option<i64> = self
            .conn()
            .query_row("SELECT max(seq) FROM events", [], |r| r.get(0))?;
        Ok(max.map(|m| m as u64 + 1).unwrap_or(1))
    }

    /// Bytes the store occupies on disk now: the database file plus its WAL.
    pub fn disk_usage(&self) -> u64 {
        disk_usage(&self.path)
    }

    /// Writes events in transactions of bounded size, evicting the oldest to stay under the cap.
    /// A transaction that fails leaves those before it committed: the error says how many
    /// events they held (a prefix of `events`) and what they evicted, and the store counts
    /// them, so the caller keeps in memory only the events after them.
    pub fn insert(&self, events: &[QueuedEvent]) -> std::result::Result<Inserted, PartialInsert> {
        self.insert_in(events, false)
    }

    /// [`Store::insert`] in one transaction: all of `events` or none (`track_batch`, whose
    /// caller is told the whole batch was refused). The WAL holds the whole write until it
    /// commits, so it may pass its share of the cap by up to the batch's size meanwhile; the
    /// checkpoint after the commit takes it back.
    pub fn insert_all(&self, events: &[QueuedEvent]) -> Result<Inserted> {
        self.insert_in(events, true).map_err(|partial| {
            debug_assert_eq!(partial.committed, 0);
            partial.error
        })
    }

    fn insert_in(
        &self,
        events: &[QueuedEvent],
        one_transaction: bool,
    ) -> std::result::Result<Inserted, PartialInsert> {
        let mut done = Inserted::default();
        let mut committed = 0;
        let result = self.insert_chunks(events, one_transaction, &mut done, &mut committed);
        // What committed is on disk, whatever came after it.
        self.rows.fetch_add(done.inserted, Ordering::Relaxed);
        self.forget_rows(done.evicted);
        match result {
            Ok(()) => Ok(done),
            Err(error) => {
                self.after_failed_write();
                Err(PartialInsert {
                    done,
                    committed,
                    error,
                })
            }
        }
    }

    /// The transactions of [`Store::insert_in`]: `done` and `committed` grow only when one
    /// commits.
    fn insert_chunks(
        &self,
        events: &[QueuedEvent],
        one_transaction: bool,
        done: &mut Inserted,
        committed: &mut usize,
    ) -> Result<()> {
        // Not `conn()`: an insert keeps the page bound, adding its own rows to it.
        let conn = lock(&self.conn);
        let leased = self.leased().clone();
        let mut frontier = lock(&self.frontier);
        let owes = !lock(&self.owed).is_empty();
        let mut tx: Option<Transaction<'_>> = None;
        let mut pending = Inserted::default();
        let mut settled = Vec::new();
        let mut start = 0;
        while start < events.len() {
            let mut end = start;
            let mut bytes = 0;
            while end < events.len()
                && (end == start || bytes + events[end].bytes() <= self.budget.txn_bytes)
            {
                bytes += events[end].bytes();
                end += 1;
            }
            let chunk = &events[start..end];
            let added_pages = self.growth_bound(chunk);
            if tx.is_none()
                && !one_transaction
                && !owes
                && let [event] = chunk
                && self.reserve_pages(added_pages)
            {
                // One row that needs no cap work (`durability = always` alone): one statement in
                // autocommit is as atomic as a transaction, without its BEGIN and COMMIT.
                let mut stmt = conn.prepare_cached(INSERT_EVENT)?;
                self.bind_event(&mut stmt, 0, event, &mut frontier)?;
                self.lower_accepted_floor(event.accepted_ms);
                done.inserted += stmt.raw_execute()? as u64;
                drop(stmt);
                *committed = end;
                self.insert_transactions.fetch_add(1, Ordering::Relaxed);
                self.checkpoint_if_needed(&conn);
                start = end;
                continue;
            }
            if tx.is_none() {
                // Unchecked: the connection's mutex is held, and the open transaction must not
                // keep the guard borrowed mutably (the autocommit path and checkpoints read it).
                let t = conn.unchecked_transaction()?;
                settled = self.settle_owed(&t)?;
                tx = Some(t);
            }
            let t = tx.as_ref().expect("a transaction is open");
            {
                let mut many = t.prepare_cached(&INSERT_EVENTS_MANY)?;
                let mut one = t.prepare_cached(INSERT_EVENT)?;
                for rows in chunk.chunks(ROWS_PER_INSERT) {
                    let stmt = if rows.len() == ROWS_PER_INSERT {
                        &mut many
                    } else {
                        &mut one
                    };
                    for row in rows.chunks(stmt.parameter_count() / INSERT_COLUMNS) {
                        for (i, e) in row.iter().enumerate() {
                            self.bind_event(stmt, i * INSERT_COLUMNS, e, &mut frontier)?;
                        }
                        pending.inserted += stmt.raw_execute()? as u64;
                    }
                }
            }
            if let Some(oldest) = chunk.iter().map(|e| e.accepted_ms).min() {
                self.lower_accepted_floor(oldest);
            }
            let (evicted, evicted_quarantine) =
                self.enforce_cap(t, &leased, added_pages, frontier.floor())?;
            pending.evicted += evicted;
            pending.evicted_quarantine += evicted_quarantine;
            start = end;
            if one_transaction && start < events.len() {
                continue;
            }
            tx.take().expect("a transaction is open").commit()?;
            self.owed_settled(&settled);
            settled.clear();
            self.insert_transactions.fetch_add(1, Ordering::Relaxed);
            done.inserted += pending.inserted;
            done.evicted += pending.evicted;
            done.evicted_quarantine += pending.evicted_quarantine;
            pending = Inserted::default();
            *committed = end;
            self.checkpoint_if_needed(&conn);
        }
        Ok(())
    }

    /// Binds one event's row to the `INSERT_COLUMNS` parameters of `stmt` after `at`; the
    /// frontier says whether it skips the ordering index, and moves past it if so.
    fn bind_event(
        &self,
        stmt: &mut rusqlite::Statement<'_>,
        at: usize,
        e: &QueuedEvent,
        frontier: &mut Frontier,
    ) -> rusqlite::Result<()> {
        let mut id_buf = Uuid::encode_buffer();
        let id = e.id.0.hyphenated().encode_lower(&mut id_buf);
        // Without the head that repeats the id and timestamp columns: a quarter of the row.
        let mut ad = String::new();
        let key_id = self.keys.current_id();
        let ad = body_ad(key_id, id, e.ts_ms, e.lane(), &mut ad);
        let body = self.keys.seal(BODY, ad, e.wire_tail(id).unwrap_or(&e.json));
        // Text and blobs are copied by SQLite as they are bound (rusqlite binds them transient).
        stmt.raw_bind_parameter(at + 1, e.seq as i64)?;
        stmt.raw_bind_parameter(at + 2, e.ts_ms)?;
        stmt.raw_bind_parameter(at + 3, &*id)?;
        stmt.raw_bind_parameter(at + 4, body)?;
        stmt.raw_bind_parameter(at + 5, e.accepted_ms)?;
        stmt.raw_bind_parameter(at + 6, e.sends)?;
        stmt.raw_bind_parameter(at + 7, e.unanswered)?;
        stmt.raw_bind_parameter(at + 8, e.lane())?;
        stmt.raw_bind_parameter(at + 9, key_id)?;
        stmt.raw_bind_parameter(at + 10, frontier.admit(e.key()))
    }

    /// Inside a write transaction: evict the oldest rows until the database fits its share of
    /// the cap: dead letters while they are over their own budget (a store written before the
    /// budget existed), otherwise queued events, which are then the ones over their share.
    /// `added_pages` bounds what this transaction's inserts may have added: while the bound
    /// stays inside the share, nothing is measured.
    /// `in_order_floor` is where the in-order rows start ([`Frontier::floor`]).
    fn enforce_cap(
        &self,
        tx: &Transaction<'_>,
        leased: &[u64],
        added_pages: u64,
        in_order_floor: u64,
    ) -> Result<(u64, u64)> {
        if self.reserve_pages(added_pages) {
            return Ok((0, 0));
        }
        let (evicted, evicted_quarantine) = self.evict_to_share(tx, leased, in_order_floor)?;
        self.pages_bound.store(db_pages(tx)?, Ordering::Relaxed);
        Ok((evicted, evicted_quarantine))
    }

    /// Adds `added_pages` to the page bound if it then stays inside the database's share, so
    /// the insert needs neither measuring nor evicting; false when the cap must be checked.
    fn reserve_pages(&self, added_pages: u64) -> bool {
        let known = self.pages_bound.load(Ordering::Relaxed);
        if known == PAGES_UNKNOWN {
            return false;
        }
        let bound = known.saturating_add(added_pages);
        let fits = bound.saturating_mul(self.page_size) <= self.budget.db_bytes;
        if fits {
            self.pages_bound.store(bound, Ordering::Relaxed);
        }
        fits
    }

    /// The most pages `rows` can add to the database: [`ROW_PAGES_MAX`] each, plus their
    /// payload's overflow pages twice over (the body, and room for its cell's spill).
    fn growth_bound(&self, rows: &[QueuedEvent]) -> u64 {
        let usable = self.page_size.saturating_sub(64).max(256);
        rows.iter()
            .map(|e| ROW_PAGES_MAX + 2 * e.bytes().div_ceil(usable))
            .sum()
    }

    fn evict_to_share(
        &self,
        tx: &Transaction<'_>,
        leased: &[u64],
        in_order_floor: u64,
    ) -> Result<(u64, u64)> {
        let (mut evicted, mut evicted_quarantine) = (0u64, 0u64);
        // Measured again only after dead letters went: evicting queued rows does not change it.
        let mut measured: Option<u64> = None;
        for _ in 0..10_000 {
            let excess = db_excess(tx, self.page_size, self.budget.db_bytes)?;
            if excess == 0 {
                break;
            }
            let dead_over = match measured {
                Some(over) => over,
                None => QuarantineSql::used_bytes(tx)?.saturating_sub(self.budget.dead_bytes),
            };
            measured = Some(dead_over);
            let want = (excess / 256).clamp(8, 4096);
            if dead_over == 0 {
                let n = evict_oldest(tx, want, leased, in_order_floor)?;
                if n > 0 {
                    evicted += n;
                    continue;
                }
            }
            // Dead letters over their budget, or nothing queued left to evict (all in flight).
            let want = if dead_over > 0 {
                (dead_over / 512).clamp(1, 1024)
            } else {
                want
            };
            self.forget_quarantine_counts();
            let q = QuarantineSql::evict_oldest(tx, want)?;
            if q == 0 {
                break;
            }
            evicted_quarantine += q;
            measured = None;
        }
        if evicted > 0 {
            bump(tx, counter::DISK_CAP, evicted)?;
        }
        if evicted_quarantine > 0 {
            bump(tx, counter::QUARANTINE_CAP, evicted_quarantine)?;
        }
        Ok((evicted, evicted_quarantine))
    }

    /// After a write transaction that failed (rolled back): the frames it wrote before the
    /// failure stay in the WAL file, so the file may be past its share with nothing committed;
    /// the file is measured and the checkpoint that keeps the cap runs as after a commit. (A
    /// full disk may refuse that checkpoint too; it is counted and tried after the next write.)
    fn after_failed_write(&self) {
        let conn = self.conn();
        self.wal.measure(&wal_path(&self.path));
        self.checkpoint_if_needed(&conn);
    }

    /// Keeps the WAL inside its share of the cap: a checkpoint that truncates it once it passes
    /// half its share (the other half is the room the next transaction may need).
    /// Run after every write transaction, not only inserts: bookkeeping and deletes add WAL
    /// frames too, and SQLite's own auto-checkpoint leaves the WAL file at its size.
    /// The WAL's size is what SQLite reported (wal.rs); the database file's is read from the
    /// file system only after a checkpoint.
    /// Never the write's error: it runs after a commit that stood, so a checkpoint that fails
    /// (a full disk cannot take the pages back into the database) is logged and counted
    /// ([`Store::checkpoint_errors`]) and tried again after the next write.
    fn checkpoint_if_needed(&self, conn: &Connection) {
        let wal = self.wal.max_bytes();
        if wal > self.budget.wal_bytes / 2 || self.db_file_bytes() + wal > self.budget.cap {
            // (busy, frames in the log, frames checkpointed): busy means readers kept it from
            // finishing, so nothing was truncated.
            match conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |r| {
                r.get::<_, i64>(0)
            }) {
                Ok(0) => self.wal.truncated(),
                Ok(_) => {}
                Err(e) => {
                    self.checkpoint_errors.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(error = %e, path = %self.path.display(), "checkpoint after a write failed; the write stands");
                }
            }
        }
    }

    /// Checkpoints that failed after a write that committed ([`Store::checkpoint_if_needed`]).
    pub fn checkpoint_errors(&self) -> u64 {
        self.checkpoint_errors.load(Ordering::Relaxed)
    }

    /// The database file's size: read again only when a checkpoint may have changed it.
    fn db_file_bytes(&self) -> u64 {
        if self.wal.take_db_file_changed() {
            self.db_file_bytes
                .store(file_size(&self.path), Ordering::Relaxed);
        }
        self.db_file_bytes.load(Ordering::Relaxed)
    }

    /// The oldest queued events in delivery order (never the leased ones), for the next batch.
    /// A row whose body does not open with its key (damaged on disk) is moved to the
    /// quarantine as `undecryptable` instead, and counted for [`Store::take_undecryptable`].
    /// The queued rows of the normal lane: how many skip the ordering index and how many are in
    /// it (frontier.rs), for a simulation's check that the index stays the exception.
    #[cfg(feature = "test-util")]
    pub fn normal_rows_by_order(&self) -> Result<(u64, u64)> {
        let conn = self.conn();
        Ok(conn.query_row(
            "SELECT COALESCE(SUM(in_order = 1), 0), COALESCE(SUM(in_order = 0), 0) FROM events WHERE lane = ?1",
            params![LANE_NORMAL],
            |r| Ok((r.get::<_, i64>(0)? as u64, r.get::<_, i64>(1)? as u64)),
        )?)
    }

    pub fn oldest(&self, limit: usize) -> Result<Vec<QueuedEvent>> {
        let mut out = Vec::with_capacity(limit);
        let mut unreadable: Vec<(u64, QuarantinedEvent)> = Vec::new();
        {
            let mut conn = self.conn();
            self.try_settle_owed(&mut conn);
            let skipped = self.skipped();
            let mut frontier = lock(&self.frontier);
            // Without a LIMIT: both runs are read in the order they are stored (the table by
            // seq, the partial index), so SQLite steps only as far as the merge asks, and rows
            // passed over (in flight, owed a delete, undecryptable) cannot use up one run's
            // share of the read and let the other run's later rows jump ahead.
            let mut in_order = conn.prepare_cached(&format!(
                "SELECT {QUEUED_COLUMNS} FROM events {IN_ORDER_FROM}"
            ))?;
            let mut indexed = conn.prepare_cached(&format!(
                "SELECT {QUEUED_COLUMNS} FROM events {INDEXED_ALL}"
            ))?;
            let mut a_rows = in_order.query(params![frontier.floor() as i64])?;
            let mut b_rows = indexed.query([])?;
            let (mut a, mut b) = (a_rows.next()?, b_rows.next()?);
            frontier.observed(a.map(|r| r.get::<_, i64>(0)).transpose()?.map(|s| s as u64));
            // The two runs, each in delivery order, merged; a row's body is opened only once it
            // is taken.
            while out.len() < limit {
                let (row, from_a) = match (a, b) {
                    (None, None) => break,
                    (Some(x), None) => (x, true),
                    (None, Some(y)) => (y, false),
                    (Some(x), Some(y)) if queued_key(x)? < queued_key(y)? => (x, true),
                    (Some(_), Some(y)) => (y, false),
                };
                match self.queued_row(row, &skipped)? {
                    None => {}
                    Some(Ok(event)) => out.push(event),
                    Some(Err(bad)) => unreadable.push(bad),
                }
                if out.len() == limit {
                    break;
                }
                if from_a {
                    a = a_rows.next()?;
                } else {
                    b = b_rows.next()?;
                }
            }
        }
        if !unreadable.is_empty() {
            self.quarantine_undecryptable(unreadable)?;
        }
        Ok(out)
    }

    /// One row of [`QUEUED_COLUMNS`]: `None` for a row in flight or whose id does not parse
    /// (skipped before its body is opened), `Err` for a body that does not open with its key.
    #[allow(clippy::type_complexity)]
    fn queued_row(
        &self,
        r: &rusqlite::Row<'_>,
        skipped: &[u64],
    ) -> rusqlite::Result<Option<std::result::Result<QueuedEvent, (u64, QuarantinedEvent)>>> {
        let seq = r.get::<_, i64>(0)? as u64;
        if skipped.contains(&seq) {
            return Ok(None);
        }
        let id_text = r.get_ref(2)?.as_str()?;
        let Ok(id) = Uuid::try_parse(id_text) else {
            return Ok(None);
        };
        let key_id: u32 = r.get(7)?;
        let ts_ms: i64 = r.get(1)?;
        let sends: u32 = r.get(5)?;
        let lane: u8 = r.get(8)?;
        let mut ad = String::new();
        Ok(Some(
            match self.keys.open(
                key_id,
                BODY,
                body_ad(key_id, id_text, ts_ms, lane, &mut ad),
                r.get_ref(3)?,
            ) {
                Ok(stored) => Ok(QueuedEvent {
                    ts_ms,
                    seq,
                    id: EventId(id),
                    json: with_wire_head(id_text, ts_ms, stored).into_boxed_str(),
                    accepted_ms: r.get(4)?,
                    sends,
                    unanswered: r.get(6)?,
                    critical: lane == LANE_CRITICAL,
                }),
                Err(_) => Err((seq, undecryptable_entry(id_text, ts_ms, sends, key_id))),
            },
        ))
    }

    /// Moves undecryptable queued rows to the quarantine in one transaction (their queued rows
    /// go in it too), so nothing leaves without a trace.
    fn quarantine_undecryptable(&self, rows: Vec<(u64, QuarantinedEvent)>) -> Result<()> {
        let (seqs, entries): (Vec<u64>, Vec<QuarantinedEvent>) = rows.into_iter().unzip();
        tracing::warn!(
            events = seqs.len(),
            "stored events failed authentication; quarantined as undecryptable"
        );
        // The quarantine's count and age limits are applied by its next regular insert, which
        // knows the spool's clock; the byte limits hold now, and what they evict is counted.
        let before = self.len();
        let evicted =
            self.with_quarantine_moving(&seqs, |q| q.add(&entries, u64::MAX, i64::MIN))?;
        let moved = before.saturating_sub(self.len());
        self.undecryptable.fetch_add(moved, Ordering::Relaxed);
        self.undecryptable_evicted
            .fetch_add(evicted.cap + evicted.expired, Ordering::Relaxed);
        Ok(())
    }

    /// Since the last call: queued rows moved to the quarantine as undecryptable (the queue
    /// counts them quarantined), and dead letters their arrival evicted (`quarantine_cap`).
    pub fn take_undecryptable(&self) -> Undecryptable {
        Undecryptable {
            quarantined: self.undecryptable.swap(0, Ordering::Relaxed),
            evicted: self.undecryptable_evicted.swap(0, Ordering::Relaxed),
        }
    }

    /// Marks events as part of the batch in flight.
    pub fn lease(&self, seqs: &[u64]) {
        self.leased().extend_from_slice(seqs);
    }

    pub fn release(&self, seqs: &[u64]) {
        self.leased().retain(|s| !seqs.contains(s));
    }

    pub fn release_all(&self) {
        self.leased().clear();
    }

    /// Deletes acknowledged (or quarantined) events; returns how many rows went.
    pub fn delete(&self, seqs: &[u64]) -> Result<u64> {
        self.delete_rows(seqs, None)
    }

    /// Deletes these rows and lets go of their leases, in one transaction that also bumps the
    /// persisted counter `counted_as` (when given) by the rows that went. Their fate is decided
    /// (delivered, expired), so a delete that fails is owed instead ([`Store::owed`]): the
    /// rows are no longer read or counted, and the next write that commits deletes them.
    fn delete_rows(&self, seqs: &[u64], counted_as: Option<&'static str>) -> Result<u64> {
        let mut conn = self.conn();
        let result = (|| -> Result<(u64, Vec<u64>)> {
            let tx = conn.transaction()?;
            let settled = self.settle_owed(&tx)?;
            let mut n = 0;
            {
                let mut stmt = tx.prepare_cached("DELETE FROM events WHERE seq = ?1")?;
                for seq in seqs {
                    n += stmt.execute([*seq as i64])? as u64;
                }
            }
            if let Some(name) = counted_as
                && n > 0
            {
                bump(&tx, name, n)?;
            }
            tx.commit()?;
            Ok((n, settled))
        })();
        let n = match result {
            Ok((n, settled)) => {
                self.owed_settled(&settled);
                self.checkpoint_if_needed(&conn);
                n
            }
            Err(e) => {
                let present = rows_present(&conn, seqs).unwrap_or(seqs.to_vec());
                tracing::warn!(error = %e, rows = present.len(), "deleting rows failed; they are hidden and deleted by the next write");
                let mut owed = lock(&self.owed);
                owed.extend(present.iter().map(|&seq| Owed { seq, counted_as }));
                self.faults.note_owed(owed.len() as u64);
                present.len() as u64
            }
        };
        drop(conn);
        self.release(seqs);
        self.forget_rows(n);
        Ok(n)
    }

    /// Deletes queued events accepted before `cutoff_ms` (never leased ones), counted
    /// `expired`; returns their ids, at most [`EXPIRE_MAX`] a call. With nothing due (the
    /// accepted floor is at or past the cutoff) it reads nothing; otherwise it scans the table
    /// and sets the floor to what is left.
    pub fn expire(&self, cutoff_ms: i64) -> Result<Vec<EventId>> {
        if cutoff_ms <= self.accepted_floor.load(Ordering::Relaxed) {
            return Ok(Vec::new());
        }
        let leased = self.leased().clone();
        let mut conn = self.conn();
        let tx = conn.transaction()?;
        let settled = self.settle_owed(&tx)?;
        let rows: Vec<(i64, String)> = {
            // Rows are mostly in acceptance order by seq, so the scan meets the due ones first
            // and stops at the limit.
            let mut stmt =
                tx.prepare_cached("SELECT seq, event_id FROM events WHERE accepted < ?1 LIMIT ?2")?;
            stmt.query_map(params![cutoff_ms, EXPIRE_MAX as i64], |r| {
                Ok((r.get(0)?, r.get(1)?))
            })?
            .collect::<rusqlite::Result<_>>()?
        };
        let all_found = rows.len() < EXPIRE_MAX;
        let mut gone = Vec::new();
        {
            let mut stmt = tx.prepare_cached("DELETE FROM events WHERE seq = ?1")?;
            for (seq, id) in rows
                .into_iter()
                .filter(|(s, _)| !leased.contains(&(*s as u64)))
            {
                if stmt.execute([seq])? > 0
                    && let Ok(id) = Uuid::try_parse(&id)
                {
                    gone.push(EventId(id));
                }
            }
        }
        let n = gone.len() as u64;
        if n > 0 {
            bump(&tx, counter::EXPIRED, n)?;
        }
        // With every due row found, what is left (leased rows too) sets the floor; otherwise
        // it stays below the cutoff and the next call scans again.
        let floor: Option<Option<i64>> = if all_found {
            Some(tx.query_row("SELECT min(accepted) FROM events", [], |r| r.get(0))?)
        } else {
            None
        };
        tx.commit()?;
        self.owed_settled(&settled);
        if let Some(floor) = floor {
            self.accepted_floor
                .store(floor.unwrap_or(i64::MAX), Ordering::Relaxed);
        }
        self.checkpoint_if_needed(&conn);
        self.forget_rows(n);
        Ok(gone)
    }

    /// Deletes leased events of a batch that expired before it could be sent again, counted
    /// `expired` like [`Store::expire`]; returns how many rows went.
    pub fn delete_expired(&self, seqs: &[u64]) -> Result<u64> {
        self.delete_rows(seqs, Some(counter::EXPIRED))
    }

    /// Applies a send's bookkeeping ([`SendNote`]) to these rows, in one transaction.
    pub fn note_sends(&self, seqs: &[u64], note: SendNote) -> Result<()> {
        if seqs.is_empty() {
            return Ok(());
        }
        let (sends, unanswered) = note.deltas();
        let mut conn = self.conn();
        let tx = conn.transaction()?;
        {
            let mut stmt = tx.prepare_cached(
                "UPDATE events SET sends = max(sends + ?2, 0), unanswered = max(unanswered + ?3, 0)
                 WHERE seq = ?1",
            )?;
            for seq in seqs {
                stmt.execute(params![*seq as i64, sends, unanswered])?;
            }
        }
        tx.commit()?;
        self.checkpoint_if_needed(&conn);
        Ok(())
    }

    /// Deletes every queued event that is not in flight (opt-out); returns how many.
    pub fn purge_queue(&self) -> Result<u64> {
        let leased = self.leased().clone();
        let mut conn = self.conn();
        let tx = conn.transaction()?;
        // Owed rows first, uncounted: they are not queued any more.
        let settled = self.settle_owed(&tx)?;
        let n = delete_unleased(&tx, &leased)?;
        tx.commit()?;
        self.owed_settled(&settled);
        self.checkpoint_if_needed(&conn);
        drop(conn);
        self.forget_rows(n);
        Ok(n)
    }

    /// A small named value kept across restarts: what the app decided (see [`meta`]) and the
    /// fleet loop's install id, directives and report numbering (src/fleet).
    pub fn meta(&self, name: &str) -> Result<Option<String>> {
        Ok(read_meta(&self.conn(), name)?)
    }

    pub fn set_meta(&self, name: &str, value: &str) -> Result<()> {
        let conn = self.conn();
        write_meta(&conn, name, value)?;
        self.checkpoint_if_needed(&conn);
        Ok(())
    }

    /// The dead letters by reason ([`QuarantineSql::counts`]), counted again only after a
    /// write that may have changed them.
    pub fn quarantine_counts(&self) -> Result<BTreeMap<String, u64>> {
        if let Some(counts) = lock(&self.quarantine_counts).as_ref() {
            return Ok(counts.clone());
        }
        let mut conn = self.conn();
        let tx = conn.transaction()?;
        let counts = QuarantineSql::bounded(&tx, self.byte_limits(), &self.keys).counts()?;
        tx.commit()?;
        *lock(&self.quarantine_counts) = Some(counts.clone());
        Ok(counts)
    }

    fn byte_limits(&self) -> ByteLimits {
        ByteLimits {
            db_bytes: self.budget.db_bytes,
            dead_bytes: self.budget.dead_bytes,
            page_size: self.page_size,
        }
    }

    /// Called with the connection held, before anything that may change the dead letters.
    fn forget_quarantine_counts(&self) {
        *lock(&self.quarantine_counts) = None;
    }

    /// Runs `f` with the quarantine tables, in one transaction whose inserts keep to the
    /// dead letters' budget and the disk cap.
    pub fn with_quarantine<T>(&self, f: impl FnOnce(&QuarantineSql<'_>) -> Result<T>) -> Result<T> {
        self.with_quarantine_moving(&[], f)
    }

    /// [`Store::with_quarantine`] for events that move from the queue into the quarantine: their
    /// queued rows (`from_queue`, seqs of the batch in flight) are deleted in the same
    /// transaction, so the space they free counts before the dead letters' limits are applied
    /// and a dead letter is never evicted for its own queued copy.
    pub fn with_quarantine_moving<T>(
        &self,
        from_queue: &[u64],
        f: impl FnOnce(&QuarantineSql<'_>) -> Result<T>,
    ) -> Result<T> {
        let mut conn = self.conn();
        self.forget_quarantine_counts();
        let before = conn.total_changes();
        let written = (|| {
            let tx = conn.transaction()?;
            let settled = self.settle_owed(&tx)?;
            let mut moved = 0;
            {
                let mut stmt = tx.prepare_cached("DELETE FROM events WHERE seq = ?1")?;
                for seq in from_queue {
                    moved += stmt.execute([*seq as i64])? as u64;
                }
            }
            let out = f(&QuarantineSql::bounded(&tx, self.byte_limits(), &self.keys))?;
            tx.commit()?;
            Ok((out, settled, moved))
        })();
        let (out, settled, moved) = match written {
            Ok(written) => written,
            Err(e) => {
                drop(conn);
                self.after_failed_write();
                return Err(e);
            }
        };
        self.owed_settled(&settled);
        if conn.total_changes() != before {
            self.checkpoint_if_needed(&conn);
        }
        drop(conn);
        self.release(from_queue);
        self.forget_rows(moved);
        Ok(out)
    }

    /// Moves selected quarantined events back into the queue with new seqs and the same ids.
    /// A redrive is a new acceptance (`now_ms`, so the age limit starts again) with a fresh
    /// `max_event_sends` budget; the sends so far are kept, so the collector still sees a resend.
    pub fn redrive(
        &self,
        selector: &crate::quarantine::Selector,
        now_ms: i64,
        mut next_seq: impl FnMut() -> u64,
    ) -> Result<u64> {
        let n = self.with_quarantine(|q| {
            let taken = q.take(selector)?;
            let mut stmt = q.tx().prepare_cached(INSERT_EVENT)?;
            let mut n = 0;
            for e in &taken {
                let mut ad = String::new();
                let ad = body_ad(
                    self.keys.current_id(),
                    &e.event_id,
                    e.ts_ms,
                    LANE_NORMAL,
                    &mut ad,
                );
                n += stmt.execute(params![
                    next_seq() as i64,
                    e.ts_ms,
                    e.event_id,
                    self.keys.seal(BODY, ad, &e.body),
                    now_ms,
                    e.sends,
                    0,
                    LANE_NORMAL,
                    self.keys.current_id(),
                    // Back with its old timestamp: behind the frontier, so indexed.
                    false
                ])? as u64;
            }
            self.lower_accepted_floor(now_ms);
            Ok(n)
        })?;
        self.rows.fetch_add(n, Ordering::Relaxed);
        Ok(n)
    }
}

/// The most expired rows one [`Store::expire`] deletes (and names in its notice).
const EXPIRE_MAX: usize = 10_000;

/// The one way a row enters the queue (spill, persist, redrive); an id already queued is kept.
const INSERT_EVENT: &str = "INSERT OR IGNORE INTO events
     (seq, ts, event_id, body, accepted, sends, unanswered, lane, key_id, in_order)
     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)";

/// The parameters of one row in [`INSERT_EVENT`], in the order [`Store::bind_event`] binds them.
const INSERT_COLUMNS: usize = 10;

/// Rows per statement when a spill writes many: one statement's setup, step and reset for 25
/// rows instead of one each made a 1,000-row transaction about a fifth cheaper per row
/// (measured beside single-row statements on the same table, WAL, `synchronous = NORMAL`).
const ROWS_PER_INSERT: usize = 25;

/// [`INSERT_EVENT`] for [`ROWS_PER_INSERT`] rows at once.
static INSERT_EVENTS_MANY: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    let (head, one) = INSERT_EVENT
        .split_once("VALUES")
        .expect("INSERT_EVENT has a VALUES list");
    let row = one.trim().replace(|c: char| c.is_ascii_digit(), "");
    format!("{head}VALUES {}", vec![row; ROWS_PER_INSERT].join(", "))
});

/// What [`Store::oldest`] reads of a queued row, in the order [`Store::queued_row`] reads it.
const QUEUED_COLUMNS: &str = "seq, ts, event_id, body, accepted, sends, unanswered, key_id, lane";

/// The delivery order of a row of [`QUEUED_COLUMNS`].
fn queued_key(r: &rusqlite::Row<'_>) -> rusqlite::Result<OrderKey> {
    Ok((r.get(8)?, r.get(1)?, r.get::<_, i64>(0)? as u64))
}

/// The associated-data name of a queued event's body (crypto.rs).
const BODY: &str = "events.body";

/// What a sealed body's associated data names besides its column (schema 7): the row's event
/// id, timestamp and lane, the clear columns the event is sent with and ordered by. The head
/// of the wire JSON (`event_id`, `timestamp`) is rebuilt from those columns, so a `ts` changed
/// on disk, or swapped between rows, fails authentication like a damaged body instead of
/// sending the event with another time; so does a moved lane. Built into `buf` only for a
/// sealed row (`key_id` not 0): plain rows have no associated data.
fn body_ad<'a>(key_id: u32, id: &'a str, ts_ms: i64, lane: u8, buf: &'a mut String) -> &'a str {
    if key_id == 0 {
        return id;
    }
    use std::fmt::Write;
    let _ = write!(buf, "{id}|{ts_ms}|{lane}");
    buf
}

/// The quarantine entry of a row whose payload is lost: its id, timestamp and sends are kept.
fn undecryptable_entry(event_id: &str, ts_ms: i64, sends: u32, key_id: u32) -> QuarantinedEvent {
    let now_ms = chrono::Utc::now().timestamp_millis();
    QuarantinedEvent {
        event_id: event_id.to_string(),
        ts_ms,
        body: String::new(),
        reason: reason::UNDECRYPTABLE.to_string(),
        detail: format!(
            "sealed with encryption key id {key_id}; the stored ciphertext failed authentication (damaged on disk), its payload is lost"
        ),
        status: None,
        attempts: 0,
        first_failed_ms: now_ms,
        last_failed_ms: now_ms,
        sends,
    }
}

/// How far the database is over `db_bytes`, after handing free pages back to the file system:
/// `page_count` is the file's size after commit (free pages included), so freed pages are
/// returned with an incremental vacuum before measuring again.
fn db_excess(tx: &Transaction<'_>, page_size: u64, db_bytes: u64) -> Result<u64> {
    for _ in 0..10_000 {
        // Cached statements: this runs once per spill transaction, on the path every
        // `durability = always` commit takes.
        let pages = db_pages(tx)?;
        if pages * page_size <= db_bytes {
            return Ok(0);
        }
        let free: u64 = tx
            .prepare_cached("PRAGMA freelist_count")?
            .query_row([], |r| r.get::<_, i64>(0))? as u64;
        if free == 0 {
            return Ok(pages * page_size - db_bytes);
        }
        let mut stmt = tx.prepare("PRAGMA incremental_vacuum")?;
        let mut rows = stmt.query([])?;
        while rows.next()?.is_some() {}
    }
    Ok(0)
}

/// The database's pages now, free pages included.
fn db_pages(conn: &Connection) -> Result<u64> {
    // Cached, though SQLite re-prepares a PRAGMA at every run.
    Ok(conn
        .prepare_cached("PRAGMA page_count")?
        .query_row([], |r| r.get::<_, i64>(0))? as u64)
}

/// Which of `seqs` have a row (a read: it works on a full disk).
fn rows_present(conn: &Connection, seqs: &[u64]) -> rusqlite::Result<Vec<u64>> {
    let mut stmt = conn.prepare_cached("SELECT 1 FROM events WHERE seq = ?1")?;
    let mut present = Vec::new();
    for &seq in seqs {
        if stmt.exists([seq as i64])? {
            present.push(seq);
        }
    }
    Ok(present)
}

/// The value named `name` in the `meta` table ([`meta`]), if any.
fn read_meta(conn: &Connection, name: &str) -> rusqlite::Result<Option<String>> {
    use rusqlite::OptionalExtension;
    conn.query_row("SELECT value FROM meta WHERE name = ?1", [name], |r| {
        r.get(0)
    })
    .optional()
}

/// Sets the value named `name` in the `meta` table (also inside a transaction: `conn` may be
/// one).
fn write_meta(conn: &Connection, name: &str, value: &str) -> rusqlite::Result<()> {
    conn.execute(
        "INSERT INTO meta (name, value) VALUES (?1, ?2)
         ON CONFLICT(name) DO UPDATE SET value = ?2",
        params![name, value],
    )?;
    Ok(())
}

/// Deletes every queued row but the leased ones (the batch in flight, whose answer decides
/// where its events go); returns how many went.
fn delete_unleased(conn: &Connection, leased: &[u64]) -> Result<u64> {
    let n = if leased.is_empty() {
        conn.execute("DELETE FROM events", [])?
    } else {
        let list = leased
            .iter()
            .map(|s| s.to_string())
            .collect::<Vec<_>>()
            .join(",");
        conn.execute(&format!("DELETE FROM events WHERE seq NOT IN ({list})"), [])?
    };
    Ok(n as u64)
}

/// The disk cap's eviction: the oldest of the normal lane first, critical events only when no
/// normal one is left (docs/critical-lane.md). The normal lane is the in-order rows (from
/// `in_order_floor`, by seq) merged with its indexed ones; critical rows are all indexed.
fn evict_oldest(
    tx: &Transaction<'_>,
    want: u64,
    leased: &[u64],
    in_order_floor: u64,
) -> Result<u64> {
    let limit = want as usize + leased.len();
    let oldest_normal = {
        let mut in_order =
            tx.prepare_cached(&format!("SELECT ts, seq FROM events {IN_ORDER_ROWS}"))?;
        let mut indexed = tx.prepare_cached(&format!(
            "SELECT ts, seq FROM events {INDEXED_ROWS_OF_LANE}"
        ))?;
        let pair = |r: &rusqlite::Row<'_>| Ok((r.get::<_, i64>(0)?, r.get::<_, i64>(1)?));
        let a = in_order
            .query_map(params![in_order_floor as i64, limit as i64], pair)?
            .collect::<rusqlite::Result<Vec<(i64, i64)>>>()?;
        let b = indexed
            .query_map(params![LANE_NORMAL, limit as i64], pair)?
            .collect::<rusqlite::Result<Vec<(i64, i64)>>>()?;
        let mut both = a;
        both.extend(b);
        both.sort_unstable();
        both.truncate(limit);
        both
    };
    let mut seqs: Vec<i64> = oldest_normal.into_iter().map(|(_, seq)| seq).collect();
    if seqs.len() < limit {
        let mut stmt =
            tx.prepare_cached(&format!("SELECT seq FROM events {INDEXED_ROWS_OF_LANE}"))?;
        let left = (limit - seqs.len()) as i64;
        let rows = stmt.query_map(params![LANE_CRITICAL, left], |r| r.get(0))?;
        seqs.extend(rows.collect::<rusqlite::Result<Vec<i64>>>()?);
    }
    let mut stmt = tx.prepare_cached("DELETE FROM events WHERE seq = ?1")?;
    let mut n = 0;
    for seq in seqs
        .into_iter()
        .filter(|s| !leased.contains(&(*s as u64)))
        .take(want as usize)
    {
        n += stmt.execute([seq])? as u64;
    }
    Ok(n)
}

pub(crate) fn bump(tx: &Transaction<'_>, name: &str, by: u64) -> Result<()> {
    tx.execute(
        "INSERT INTO counters (name, value) VALUES (?1, ?2) ON CONFLICT(name) DO UPDATE SET value = value + ?2",
        params![name, by as i64],
    )?;
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
mod failure_tests;

#[cfg(test)]
mod tests;
