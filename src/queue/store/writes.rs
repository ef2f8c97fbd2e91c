//! Writing queued rows and keeping the disk cap: inserts in bounded transactions, the page
//! bound that spares most inserts a measurement, eviction of the oldest rows at the cap, and
//! the WAL checkpoint after every write. Apart because the cap is the store's hardest
//! invariant, and these are the paths that keep it (the dead letters' budget is in
//! quarantine_sql.rs).

use super::reads::{BODY, body_ad};
use super::*;
use crate::crypto::Stored;

impl Store {
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
        let key_id = self.keys.current_id();
        // Text and blobs are copied by SQLite as they are bound (rusqlite binds them transient).
        stmt.raw_bind_parameter(at + 1, e.seq as i64)?;
        stmt.raw_bind_parameter(at + 2, e.ts_ms)?;
        stmt.raw_bind_parameter(at + 3, &*id)?;
        match &e.sealed.0 {
            Some(sealed) => stmt.raw_bind_parameter(at + 4, &**sealed)?,
            None => stmt.raw_bind_parameter(at + 4, self.body(e, id))?,
        }
        stmt.raw_bind_parameter(at + 5, e.accepted_ms)?;
        stmt.raw_bind_parameter(at + 6, e.sends)?;
        stmt.raw_bind_parameter(at + 7, e.unanswered)?;
        stmt.raw_bind_parameter(at + 8, e.lane())?;
        stmt.raw_bind_parameter(at + 9, key_id)?;
        stmt.raw_bind_parameter(at + 10, frontier.admit(e.key()))
    }

    /// The `body` column of `e`'s row (`id` its text): the wire JSON without the head that
    /// repeats the id and timestamp columns (a quarter of the row), sealed with the current key
    /// when the store has one, bound to the row's id, timestamp and lane (`body_ad`).
    fn body<'a>(&self, e: &'a QueuedEvent, id: &str) -> Stored<'a> {
        let mut buf = String::new();
        let (ad, plain) = self.body_input(e, id, &mut buf);
        self.keys.seal(BODY, ad, plain)
    }

    /// What `e`'s body is sealed with and what it seals: the associated data (written into
    /// `buf`) and the plain text.
    fn body_input<'a, 'b>(
        &self,
        e: &'a QueuedEvent,
        id: &'b str,
        buf: &'b mut String,
    ) -> (&'b str, &'a str) {
        let ad = body_ad(self.keys.current_id(), id, e.ts_ms, e.lane(), buf);
        (ad, e.wire_tail(id).unwrap_or(&e.json))
    }

    /// The AEAD new rows are sealed with; `None` for plain text (no current key).
    pub fn seals_with(&self) -> Option<crate::crypto::Aead> {
        self.keys.aead()
    }

    /// `e`'s body sealed now, for a tracking thread to attach to an event bound for the spill
    /// while memory is full: the spill thread then only writes it, and the sealing, the
    /// costliest step of an encrypted row, runs on the thread that made the event, in parallel
    /// with the spill's writes. `None` for a store without keys.
    pub fn seal_ahead(&self, e: &QueuedEvent) -> Option<Box<[u8]>> {
        let mut id_buf = Uuid::encode_buffer();
        let id = e.id.0.hyphenated().encode_lower(&mut id_buf);
        let mut buf = String::new();
        let (ad, plain) = self.body_input(e, id, &mut buf);
        Some(self.keys.seal_ahead(BODY, ad, plain)?.into_boxed_slice())
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
    pub(super) fn after_failed_write(&self) {
        let conn = self.conn();
        self.after_failed_write_on(&conn);
    }

    /// [`Store::after_failed_write`] on the connection the caller holds, its transaction
    /// rolled back. Every write that can fail calls one of the two: a commit that fails
    /// part-way leaves frames in the WAL file whatever it wrote (rows, counts, records).
    pub(super) fn after_failed_write_on(&self, conn: &Connection) {
        self.wal.measure(&wal_path(&self.path));
        self.checkpoint_if_needed(conn);
    }

    /// `result`, the outcome of a write on `conn` (its transaction over), after
    /// [`Store::after_failed_write_on`] when it failed.
    pub(super) fn checked<T>(&self, conn: &Connection, result: Result<T>) -> Result<T> {
        if result.is_err() {
            self.after_failed_write_on(conn);
        }
        result
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
    pub(super) fn checkpoint_if_needed(&self, conn: &Connection) {
        let wal = self.wal.max_bytes();
        if wal > self.budget.wal_bytes / 2 || self.db_file_bytes() + wal > self.budget.cap {
            let _one_checkpoint = self.wal.hold_checkpoints();
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

    /// The database file's size: read again only when a checkpoint may have changed it.
    fn db_file_bytes(&self) -> u64 {
        if self.wal.take_db_file_changed() {
            self.db_file_bytes
                .store(file_size(&self.path), Ordering::Relaxed);
        }
        self.db_file_bytes.load(Ordering::Relaxed)
    }
}

/// The most pages one inserted row can add to the database besides its overflow pages: each
/// of its two b-trees (the table and the `(lane, ts, seq)` index) splits at most every level,
/// a split adding at most two pages (SQLite rebalances three siblings into at most five), and
/// may gain a root level; plus a pointer-map page (`auto_vacuum`). A height of 6 holds far
/// more rows than any cap allows; the figure is rounded up generously, since it only decides
/// when to measure.
const ROW_PAGES_MAX: u64 = 64;

/// The one way a row enters the queue (spill, persist, redrive); an id already queued is kept.
pub(super) const INSERT_EVENT: &str = "INSERT OR IGNORE INTO events
     (seq, ts, event_id, body, accepted, sends, unanswered, lane, key_id, in_order)
     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)";

/// The parameters of one row in [`INSERT_EVENT`], in the order [`Store::bind_event`] binds them.
const INSERT_COLUMNS: usize = 10;

/// Rows per statement when a spill writes many: one statement's setup, step and reset for 25
/// rows instead of one each made a 1,000-row transaction about a fifth cheaper per row
/// (measured beside single-row statements on the same table, WAL, `synchronous = NORMAL`).
const ROWS_PER_INSERT: usize = 25;

/// [`INSERT_EVENT`] for [`ROWS_PER_INSERT`] rows at once.
pub(super) static INSERT_EVENTS_MANY: std::sync::LazyLock<String> =
    std::sync::LazyLock::new(|| {
        let (head, one) = INSERT_EVENT
            .split_once("VALUES")
            .expect("INSERT_EVENT has a VALUES list");
        let row = one.trim().replace(|c: char| c.is_ascii_digit(), "");
        format!("{head}VALUES {}", vec![row; ROWS_PER_INSERT].join(", "))
    });

/// How far the database is over `db_bytes`, after handing free pages back to the file system:
/// `page_count` is the file's size after commit (free pages included), so freed pages are
/// returned with an incremental vacuum before measuring again.
pub(super) fn db_excess(tx: &Transaction<'_>, page_size: u64, db_bytes: u64) -> Result<u64> {
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

/// The disk cap's eviction: the oldest of the normal lane first, critical events only when no
/// normal one is left (docs/critical-lane.md). The normal lane is the in-order rows (from
/// `in_order_floor`, by seq) merged with its indexed ones; critical rows are all indexed.
pub(super) fn evict_oldest(
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
