//! The next batch's rows, read while the batch before it is on the wire.
//!
//! Draining a backlog, the worker would otherwise read the next rows only after the answer,
//! with the collector idle, then send, then wait: one batch's read time added to every
//! request. [`Store::read_ahead`] reads them during the wait instead (decision 0069), and
//! [`Store::oldest`] takes that read when nothing has changed since: no row of the connection
//! written (SQLite's change count), no batch given back ([`Store::release`]), none of the rows
//! leased or owed a delete in the meantime. Anything else and the read is forgotten and made
//! again, so what a batch holds never depends on whether the read ahead happened.

use super::*;

/// Rows [`Store::read_ahead`] read, and the state of the store they were read in.
pub(super) struct ReadAhead {
    rows: Vec<QueuedEvent>,
    /// The limit it read with; fewer rows than that means the queue had no more.
    limit: usize,
    /// `sqlite3_total_changes()` after the read: any insert, update or delete since moves it.
    changes: u64,
    /// [`Store::given_back`] before the read began.
    given_back: u64,
}

impl ReadAhead {
    pub(super) fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// Whether it holds the first `limit` rows: read with that limit or more, or the queue
    /// had fewer.
    fn covers(&self, limit: usize) -> bool {
        limit <= self.limit || self.rows.len() < self.limit
    }

    /// The seqs of the rows read, in delivery order.
    pub(super) fn seqs(&self) -> Vec<u64> {
        self.rows.iter().map(|e| e.seq).collect()
    }
}

impl Store {
    /// Reads the oldest `limit` queued rows (passing over the leased and the owed, like
    /// [`Store::oldest`]) and keeps them for the next [`Store::oldest`]. A pure read: it
    /// moves no frontier and quarantines nothing; a row that does not open ends it without
    /// keeping anything, for the next batch's own read to deal with. Nothing to read when the
    /// store holds only the batch in flight.
    pub fn read_ahead(&self, limit: usize) {
        if self.len() <= self.leased().len() as u64 {
            return;
        }
        // Not `conn()`: a read does not grow the database, so the inserts' page bound holds.
        let conn = lock(&self.conn);
        // Before the read learns what is leased: a batch given back from here on forgets it.
        let given_back = self.given_back.load(Ordering::SeqCst);
        let read = self.read_oldest(&conn, limit, None);
        let kept = match read {
            Ok((rows, unreadable)) if unreadable.is_empty() => Some(ReadAhead {
                rows,
                limit,
                changes: conn.total_changes(),
                given_back,
            }),
            Ok(_) => None,
            Err(e) => {
                tracing::debug!(error = %e, "reading ahead failed; the next batch reads itself");
                None
            }
        };
        *lock(&self.read_ahead) = kept;
    }

    /// What [`Store::read_ahead`] read, when it is still what a read now would return: nothing
    /// written since, no batch given back, none of its rows leased or owed since. Taken once.
    pub(super) fn take_read_ahead(
        &self,
        conn: &Connection,
        limit: usize,
    ) -> Option<Vec<QueuedEvent>> {
        let ahead = lock(&self.read_ahead).take()?;
        if ahead.changes != conn.total_changes()
            || ahead.given_back != self.given_back.load(Ordering::SeqCst)
        {
            return None;
        }
        if !ahead.covers(limit) {
            return None;
        }
        let skipped = self.skipped();
        if ahead.rows.iter().any(|e| skipped.contains(&e.seq)) {
            return None;
        }
        let mut rows = ahead.rows;
        rows.truncate(limit);
        Some(rows)
    }

    /// `f` over the rows read ahead, when a read ahead of at least `limit` rows (or of the
    /// whole queue) is kept; `None` otherwise. Whether the next batch will take them is
    /// [`Store::oldest`]'s to decide: this only shows them.
    pub fn with_read_ahead<T>(
        &self,
        limit: usize,
        f: impl FnOnce(&[QueuedEvent]) -> T,
    ) -> Option<T> {
        let ahead = lock(&self.read_ahead);
        let read = ahead.as_ref()?;
        if read.rows.is_empty() || !read.covers(limit) {
            return None;
        }
        Some(f(&read.rows))
    }

    /// Runs a write that touches no row a read ahead reads (the fleet's reports, the record of
    /// the rows on the wire, rows owed a delete): SQLite's change count moves, but a read
    /// ahead from before it still holds.
    pub(super) fn beside_the_queue<T>(&self, conn: &Connection, write: impl FnOnce() -> T) -> T {
        let before = conn.total_changes();
        let done = write();
        if let Some(ahead) = lock(&self.read_ahead).as_mut()
            && ahead.changes == before
        {
            ahead.changes = conn.total_changes();
        }
        done
    }

    /// Rows given back to the queue come before anything read ahead: counted after they are
    /// unleased, so a read that began before misses them and is not taken.
    pub(super) fn forget_read_ahead(&self) {
        self.given_back.fetch_add(1, Ordering::SeqCst);
    }
}
