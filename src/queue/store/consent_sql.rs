//! The store's part of README §Consent: a denial deletes everything kept for the user, so that
//! the file keeps none of it, and the open of a store whose record says `denied` finishes that
//! deletion before anything else (a crash between the record and the delete, or a delete that
//! failed, must not leave the user's events for a later grant to send).
//!
//! What "none of it" takes in SQLite: `secure_delete` overwrites the deleted content (SQLite
//! otherwise leaves it in freed cells and pages), `incremental_vacuum` gives the freed pages
//! back to the file system, and a truncating checkpoint empties the WAL, which still holds the
//! old pages. That checkpoint cannot finish while another connection holds a read transaction
//! (`eventspool status` is such a reader): it is tried again within [`WAL_TRUNCATE_BOUND`], and
//! then the deletion is reported as not done, naming the WAL, never claimed.

use std::time::{Duration, Instant};

use rusqlite::Connection;

use super::{Store, bump, counter, meta, read_meta, remove_seqs, rows_present, wal_path};
use crate::error::{Error, Result};
use crate::sync::lock;

/// How long `set_consent(Denied)` waits for readers to let go of the WAL before it says the
/// deletion is not done (the delivery worker then tries again, once each time, every few
/// seconds).
pub const WAL_TRUNCATE_BOUND: Duration = Duration::from_millis(1500);
/// The busy timeout of each truncation try: short, so the bound above holds (the store's own
/// busy timeout is seconds).
const TRUNCATE_TRY: Duration = Duration::from_millis(100);

/// Which rows a wipe deletes.
#[derive(Clone, Copy)]
enum Wipe<'a> {
    /// A denial: every queued row but these (the batch on the wire), every dead letter, the
    /// waiting client reports and the install id.
    AllBut(&'a [u64]),
    /// Only these queued rows.
    Only(&'a [u64]),
}

/// What a denial's deletion did.
#[derive(Debug)]
pub struct Discarded {
    /// Queued events deleted.
    pub queued: u64,
    /// Dead letters deleted.
    pub dead: u64,
    /// The rows are deleted but the WAL could not be emptied: their old pages are still in it.
    pub wal_left: Option<Error>,
}

impl Store {
    /// Consent denied: deletes every queued event but the rows of the request on the wire
    /// (`on_wire`, when there is one), every dead letter, the client
    /// reports waiting to be sent and the install id they name, in one transaction, and empties
    /// the WAL (see the module docs). The queued events deleted are counted `consent_denied` in
    /// the store. An error means nothing was deleted; [`Discarded::wal_left`] that the rows are
    /// gone but the WAL still holds their old pages. Either way: call again. `wait` is how long
    /// to wait for readers of the WAL (zero: try once).
    pub fn discard_for_consent(
        &self,
        wait: Duration,
        on_wire: Option<&[u64]>,
    ) -> Result<Discarded> {
        #[cfg(feature = "test-util")]
        if crate::testing::consent_delete_fails(&self.path) {
            return Err(Error::Storage(
                "deleting the kept events failed (test fault)".into(),
            ));
        }
        // Of the rows leased to the worker, only the request on the wire is spared: what it
        // holds beside it (a batch's other half) goes with the rest.
        let spared = on_wire.unwrap_or_default();
        self.forget_quarantine_counts();
        let done = self.wipe(wait, Wipe::AllBut(spared))?;
        self.leased().retain(|s| spared.contains(s));
        Ok(done)
    }

    /// The rows of a batch a denial spared because it was on the wire, come back unanswered:
    /// deleted as the denial would have deleted them (nothing of them left in the file), and
    /// counted `consent_denied`. Nothing else is touched: what was kept since a later grant
    /// stays.
    pub fn discard_spared(&self, seqs: &[u64], wait: Duration) -> Result<Discarded> {
        let done = self.wipe(wait, Wipe::Only(seqs));
        if done.is_err() {
            // Never read nor sent again: owed, deleted (and counted) by the next write that
            // commits, as a failed delete of delivered rows is.
            let present = rows_present(&self.conn(), seqs).unwrap_or_else(|_| seqs.to_vec());
            self.owe(&present, Some(counter::CONSENT_DENIED));
            remove_seqs(&mut self.leased(), seqs);
            self.forget_rows(present.len() as u64);
        }
        done
    }

    /// Deletes what `rows` names in one transaction that leaves none of its bytes in the file,
    /// then empties the WAL (see the module docs).
    fn wipe(&self, wait: Duration, rows: Wipe<'_>) -> Result<Discarded> {
        let mut conn = self.conn();
        conn.pragma_update(None, "secure_delete", true)?;
        let result = (|| -> Result<(u64, u64)> {
            let tx = conn.transaction()?;
            let settled = self.settle_owed(&tx)?;
            let (queued, dead) = match rows {
                Wipe::AllBut(leased) => {
                    let queued = delete_all_but(&tx, leased)?;
                    let dead = tx.execute("DELETE FROM quarantine", [])? as u64;
                    tx.execute("DELETE FROM reports", [])?;
                    tx.execute("DELETE FROM meta WHERE name = ?1", [meta::INSTALL_ID])?;
                    match leased {
                        [] => tx.execute(
                            "DELETE FROM meta WHERE name = ?1",
                            [meta::SPARED_BY_DENIAL],
                        )?,
                        spared => tx.execute(
                            "INSERT OR REPLACE INTO meta (name, value) VALUES (?1, ?2)",
                            (meta::SPARED_BY_DENIAL, seq_list(spared)),
                        )?,
                    };
                    (queued, dead)
                }
                Wipe::Only(seqs) => {
                    let mut stmt = tx.prepare_cached("DELETE FROM events WHERE seq = ?1")?;
                    let mut queued = 0;
                    for seq in seqs {
                        queued += stmt.execute([*seq as i64])? as u64;
                    }
                    tx.execute("DELETE FROM meta WHERE name = ?1", [meta::SPARED_BY_DENIAL])?;
                    (queued, 0)
                }
            };
            if queued > 0 {
                bump(&tx, counter::CONSENT_DENIED, queued)?;
            }
            {
                let mut stmt = tx.prepare("PRAGMA incremental_vacuum")?;
                let mut rows = stmt.query([])?;
                while rows.next()?.is_some() {}
            }
            tx.commit()?;
            if let Wipe::Only(seqs) = rows {
                remove_seqs(&mut self.leased(), seqs);
            }
            self.owed_settled(&settled);
            // The reports went with the rest.
            lock(&self.owed_reports).clear();
            Ok((queued, dead))
        })();
        let restored = conn.pragma_update(None, "secure_delete", "FAST");
        let (queued, dead) = self.checked(&conn, result)?;
        restored?;
        self.forget_rows(queued);
        let wal_left = self.truncate_wal(&conn, wait).err();
        if wal_left.is_none() {
            self.wal.truncated();
        }
        Ok(Discarded {
            queued,
            dead,
            wal_left,
        })
    }

    /// At open: when the record says `denied`, carries out the deletion (nothing is leased yet,
    /// so everything goes; a reader of the WAL is not waited for, the worker tries again).
    /// Returns what it deleted, `None` when the record says otherwise.
    pub fn finish_recorded_denial(&self) -> Result<Option<Discarded>> {
        let recorded = read_meta(&self.conn(), meta::CONSENT)?;
        if recorded.as_deref() != Some(crate::Consent::Denied.as_str()) {
            return Ok(None);
        }
        self.discard_for_consent(Duration::ZERO, None).map(Some)
    }

    /// At open: the rows a denial spared on the wire before the last run ended (a crash before
    /// their answer) are deleted now, whatever consent says since. `None` when there was no
    /// such record.
    pub fn finish_spared(&self) -> Result<Option<Discarded>> {
        let Some(recorded) = read_meta(&self.conn(), meta::SPARED_BY_DENIAL)? else {
            return Ok(None);
        };
        let seqs: Vec<u64> = recorded
            .split(',')
            .filter_map(|s| s.trim().parse().ok())
            .collect();
        self.discard_spared(&seqs, Duration::ZERO).map(Some)
    }

    /// `PRAGMA wal_checkpoint(TRUNCATE)` until its result says no reader kept it from finishing,
    /// for at most `wait` after the first try.
    fn truncate_wal(&self, conn: &Connection, wait: Duration) -> Result<()> {
        let _one_checkpoint = self.wal.hold_checkpoints();
        conn.busy_timeout(TRUNCATE_TRY)?;
        let deadline = Instant::now() + wait;
        let result = loop {
            // (busy, frames in the log, frames checkpointed); `busy` is 1 when a reader or
            // writer kept the checkpoint from completing.
            let busy = conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |r| {
                r.get::<_, i64>(0)
            });
            match busy {
                Ok(0) => break Ok(()),
                Ok(_) if Instant::now() < deadline => std::thread::sleep(TRUNCATE_TRY),
                Ok(_) => {
                    break Err(Error::Storage(format!(
                        "the WAL {} could not be truncated (waited {} ms): another connection \
                         holds a read transaction on the store (an `eventspool status`, or any \
                         reader); the deleted events' old pages stay in it until that reader \
                         closes",
                        wal_path(&self.path).display(),
                        wait.as_millis()
                    )));
                }
                Err(e) => break Err(e.into()),
            }
        };
        conn.busy_timeout(super::schema::BUSY_TIMEOUT)?;
        result
    }
}

/// Seqs as a `meta` value: decimal, comma separated.
fn seq_list(seqs: &[u64]) -> String {
    seqs.iter()
        .map(u64::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

/// Deletes every queued row but `kept` (the request on the wire); returns how many went. The
/// kept rows are read, every row deleted, and the kept ones written again. Deleting around them
/// would leave the pages that hold them as they are, and `secure_delete` zeroes deleted cells,
/// not the unused space between a page's cell pointers and its cells, where a rebalance leaves
/// the old copies of the cells it moved to another page (seen in the simulation: an event
/// delivered long before, in that space of the page a kept row was on). The table emptied, every
/// page of it is zeroed or freed, and the kept rows go to clean ones.
fn delete_all_but(conn: &Connection, kept: &[u64]) -> Result<u64> {
    let mut rows: Vec<Vec<rusqlite::types::Value>> = Vec::new();
    if !kept.is_empty() {
        let mut stmt = conn.prepare(&format!(
            "SELECT * FROM events WHERE seq IN ({})",
            seq_list(kept)
        ))?;
        let columns = stmt.column_count();
        let mut found = stmt.query([])?;
        while let Some(row) = found.next()? {
            rows.push(
                (0..columns)
                    .map(|i| row.get(i))
                    .collect::<rusqlite::Result<_>>()?,
            );
        }
    }
    let deleted = conn.execute("DELETE FROM events", [])? as u64;
    if let Some(first) = rows.first() {
        let marks = vec!["?"; first.len()].join(",");
        let mut insert = conn.prepare(&format!("INSERT INTO events VALUES ({marks})"))?;
        for row in &rows {
            insert.execute(rusqlite::params_from_iter(row))?;
        }
    }
    Ok(deleted - rows.len() as u64)
}
