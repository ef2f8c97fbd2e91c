//! The queued count the last owner leaves behind when it lets go cleanly, and the next open
//! takes out, so opening a large store does not count its table. Apart because both ends
//! (release and open) must agree on it, and a wrong count must never be saved.

use super::*;

impl Store {
    /// Gives up ownership so another handle may open the store (after `shutdown()`, while
    /// clones of the old handle may still be alive). The caller no longer writes to it.
    pub fn release_ownership(&self) {
        self.stop_background_checkpoints();
        let mut conn = self.conn();
        self.try_settle_owed(&mut conn);
        // For the next open (`queued_rows`), guarded against writers that do not know it. Not
        // when the count may be wrong (a drift, rows still owed a delete): that open counts the
        // table, and so it does if this write fails.
        if !self.count_drifted.load(Ordering::Relaxed) && lock(&self.owed).is_empty() {
            let saved = (|| -> rusqlite::Result<()> {
                let tx = conn.transaction()?;
                write_meta(&tx, meta::QUEUE_ROWS_AT_CLOSE, &self.len().to_string())?;
                tx.execute_batch(&schema::guard_saved_count(meta::QUEUE_ROWS_AT_CLOSE))?;
                tx.commit()
            })();
            if let Err(e) = saved {
                tracing::debug!(error = %e, "the queued count was not saved; the next open counts");
            }
        }
        let _ = conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()));
        drop(conn);
        lock(&self.lock).take();
    }
}

/// The queued rows at open. Counting them reads every page of the table (the ordering index,
/// which SQLite counted before, is partial now: frontier.rs), about 2 ms for a 10 MB store
/// with a warm cache and far more from cold flash, on the thread that opens the spool. So the
/// last owner leaves the count behind when it lets go cleanly, and the next open takes it
/// out (one small write) before anything else can change the table: after a crash there is
/// none, and the table is counted. Past the open the store keeps the count itself (`rows`).
pub(super) fn queued_rows(conn: &mut Connection) -> rusqlite::Result<u64> {
    let saved = read_meta(conn, meta::QUEUE_ROWS_AT_CLOSE)?;
    // The count and its guard go in one small write, before anything else can change the
    // table (a store without either writes nothing here). On a full disk the write fails and
    // both stay: the count is still right (the guard voids it at the first change of the
    // table), so the store opens all the same.
    let taken = (|| -> rusqlite::Result<()> {
        let tx = conn.transaction()?;
        tx.execute(
            "DELETE FROM meta WHERE name = ?1",
            [meta::QUEUE_ROWS_AT_CLOSE],
        )?;
        tx.execute_batch(schema::UNGUARD_SAVED_COUNT)?;
        tx.commit()
    })();
    if let Err(e) = taken {
        tracing::warn!(error = %e, "the saved queued count could not be taken out; its guard stays");
    }
    if let Some(rows) = saved.and_then(|s| s.parse().ok()) {
        return Ok(rows);
    }
    let rows: i64 = conn.query_row("SELECT count(*) FROM events", [], |r| r.get(0))?;
    Ok(rows as u64)
}
