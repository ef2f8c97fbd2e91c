//! Rows leaving the queue: acknowledged, expired, purged on opt-out, and the deletes the store
//! owes when one failed (the rows are hidden and deleted by the next write that commits).
//! Apart because every way out keeps the queued count and the persisted counters in step.

use super::*;

impl Store {
    /// Deletes, inside `tx`, the rows the store owes a delete ([`Store::owed`]), bumping the
    /// counters they are owed under; returns their seqs, for [`Store::owed_settled`] once `tx`
    /// committed.
    pub(super) fn settle_owed(&self, tx: &Transaction<'_>) -> Result<Vec<u64>> {
        let mut owed: Vec<Owed> = lock(&self.owed).clone();
        if owed.is_empty() {
            return Ok(Vec::new());
        }
        owed.sort_unstable_by_key(|o| o.seq);
        let mut counted: BTreeMap<&'static str, u64> = BTreeMap::new();
        {
            // A delivered batch's rows are mostly consecutive seqs: each run of them goes in
            // one statement, a range every seq of which is owed, so it deletes nothing else.
            let mut range = tx.prepare_cached("DELETE FROM events WHERE seq BETWEEN ?1 AND ?2")?;
            for run in owed.chunk_by(|a, b| b.seq == a.seq + 1 && b.counted_as == a.counted_as) {
                let (first, last) = (run[0].seq, run[run.len() - 1].seq);
                let n = range.execute([first as i64, last as i64])? as u64;
                if let Some(name) = run[0].counted_as {
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

    /// After the transaction that ran [`Store::settle_owed`] committed; `seqs` sorted, as
    /// that returns them.
    pub(super) fn owed_settled(&self, seqs: &[u64]) {
        if seqs.is_empty() {
            return;
        }
        self.forget_in_flight(seqs);
        let mut owed = lock(&self.owed);
        owed.retain(|o| seqs.binary_search(&o.seq).is_err());
        self.faults.note_owed(owed.len() as u64);
    }

    /// Settles the owed deletes on their own, when there are any (before a read), the
    /// covered reports' ([`Store::reports_delete`]) with them.
    pub(super) fn try_settle_owed(&self, conn: &mut Connection) {
        if lock(&self.owed).is_empty() && lock(&self.owed_reports).is_empty() {
            return;
        }
        self.settle_owed_with(conn, |_| Ok(()));
    }

    /// One transaction: the owed deletes, the covered reports' deletes, and `also`. False when
    /// it failed (everything stays owed, for the next write that commits).
    pub(super) fn settle_owed_with(
        &self,
        conn: &Connection,
        also: impl FnOnce(&Transaction<'_>) -> Result<()>,
    ) -> bool {
        let reports: Vec<u64> = lock(&self.owed_reports).clone();
        let settled = (|| -> Result<Vec<u64>> {
            let tx = conn.unchecked_transaction()?;
            let settled = self.settle_owed(&tx)?;
            let mut stmt = tx.prepare_cached("DELETE FROM reports WHERE id = ?1")?;
            for id in &reports {
                stmt.execute([*id as i64])?;
            }
            drop(stmt);
            also(&tx)?;
            tx.commit()?;
            Ok(settled)
        })();
        match settled {
            Ok(seqs) => {
                self.owed_settled(&seqs);
                lock(&self.owed_reports).retain(|id| !reports.contains(id));
                self.checkpoint_if_needed(conn);
                true
            }
            Err(e) => {
                tracing::debug!(error = %e, "owed deletes still failing");
                self.after_failed_write_on(conn);
                false
            }
        }
    }

    /// Acknowledged rows, deleted later instead of before the next request: by
    /// [`Store::settle`], which the worker calls once that request is on the wire and before
    /// it waits, or by any write that commits first. They are owed from here on, so no read
    /// or count sees them; a crash before the delete leaves them queued, to be sent again with
    /// the same ids, which the collector deduplicates (decision 0069). Rows no longer leased
    /// (deleted with the rest on a denial) are deleted now, as by [`Store::delete`], so the
    /// count only forgets rows that are there.
    pub fn delete_later(&self, seqs: &[u64]) -> Result<()> {
        // Sorted, so that each of a batch's rows is found without a pass over the others.
        let (seqs, now): (Vec<u64>, Vec<u64>) = {
            let mut leased = self.leased().clone();
            leased.sort_unstable();
            seqs.iter()
                .copied()
                .partition(|s| leased.binary_search(s).is_ok())
        };
        if !now.is_empty() {
            self.delete(&now)?;
        }
        if seqs.is_empty() {
            return Ok(());
        }
        self.owe(&seqs, None);
        // Owed before unleased, so a read ahead never sees them as neither.
        remove_seqs(&mut self.leased(), &seqs);
        self.forget_rows(seqs.len() as u64);
        Ok(())
    }

    /// Hides these rows until a commit deletes them ([`Store::owed`]), bumping `counted_as`.
    pub(super) fn owe(&self, seqs: &[u64], counted_as: Option<&'static str>) {
        let mut owed = lock(&self.owed);
        owed.extend(seqs.iter().map(|&seq| Owed { seq, counted_as }));
        self.faults.note_owed(owed.len() as u64);
    }

    /// Commits the deletes the store owes, when it owes any.
    pub fn settle(&self) {
        if lock(&self.owed).is_empty() && lock(&self.owed_reports).is_empty() {
            return;
        }
        let mut conn = self.conn();
        self.try_settle_owed(&mut conn);
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
                self.owe(&present, counted_as);
                self.after_failed_write_on(&conn);
                present.len() as u64
            }
        };
        drop(conn);
        self.unlease_gone(seqs);
        self.forget_rows(n);
        Ok(n)
    }

    /// Whether a scan found the oldest queued row's acceptance since the store opened
    /// ([`Store::accepted_floor`]): until then, [`Store::expire`] reads every row.
    pub fn oldest_known(&self) -> bool {
        self.accepted_floor.load(Ordering::Relaxed) != FLOOR_UNKNOWN
    }

    /// Deletes queued events accepted before `cutoff_ms` (never leased ones), counted
    /// `expired`; returns their ids, at most [`EXPIRE_MAX`] a call. With nothing due (the
    /// accepted floor is at or past the cutoff) it reads nothing; otherwise it reads the oldest
    /// acceptance, which becomes the floor when it is not due, and only when it is scans for
    /// the due rows and sets the floor to what is left.
    pub fn expire(&self, cutoff_ms: i64) -> Result<Vec<EventId>> {
        if cutoff_ms <= self.accepted_floor.load(Ordering::Relaxed) {
            return Ok(Vec::new());
        }
        let leased = self.leased().clone();
        let mut conn = self.conn();
        // The oldest acceptance first, one read: when nothing is due (a backlog opened within
        // `max_event_age_ms`) it sets the floor without the scan for due rows, a second read of
        // the whole table before the first batch of a drain.
        let oldest: Option<i64> = conn
            .prepare_cached("SELECT min(accepted) FROM events")?
            .query_row([], |r| r.get(0))?;
        if oldest.is_none_or(|oldest| oldest >= cutoff_ms) {
            self.accepted_floor
                .store(oldest.unwrap_or(i64::MAX), Ordering::Relaxed);
            return Ok(Vec::new());
        }
        let written = (|| -> Result<_> {
            let tx = conn.transaction()?;
            let settled = self.settle_owed(&tx)?;
            let rows: Vec<(i64, String)> = {
                // Rows are mostly in acceptance order by seq, so the scan meets the due ones first
                // and stops at the limit.
                let mut stmt = tx.prepare_cached(
                    "SELECT seq, event_id FROM events WHERE accepted < ?1 LIMIT ?2",
                )?;
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
            Ok((settled, floor, gone))
        })();
        let (settled, floor, gone) = self.checked(&conn, written)?;
        let n = gone.len() as u64;
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

    /// Deletes every queued event that is not in flight (opt-out); returns how many.
    pub fn purge_queue(&self) -> Result<u64> {
        let leased = self.leased().clone();
        let mut conn = self.conn();
        let written = (|| -> Result<(Vec<u64>, u64)> {
            let tx = conn.transaction()?;
            // Owed rows first, uncounted: they are not queued any more.
            let settled = self.settle_owed(&tx)?;
            let n = delete_unleased(&tx, &leased)?;
            tx.commit()?;
            Ok((settled, n))
        })();
        let (settled, n) = self.checked(&conn, written)?;
        self.owed_settled(&settled);
        self.checkpoint_if_needed(&conn);
        drop(conn);
        self.forget_rows(n);
        Ok(n)
    }
}

/// The most expired rows one [`Store::expire`] deletes (and names in its notice).
const EXPIRE_MAX: usize = 10_000;

/// Which of `seqs` have a row (a read: it works on a full disk).
pub(super) fn rows_present(conn: &Connection, seqs: &[u64]) -> rusqlite::Result<Vec<u64>> {
    let mut stmt = conn.prepare_cached("SELECT 1 FROM events WHERE seq = ?1")?;
    let mut present = Vec::new();
    for &seq in seqs {
        if stmt.exists([seq as i64])? {
            present.push(seq);
        }
    }
    Ok(present)
}

/// Deletes every queued row but the leased ones (the batch in flight, whose answer decides
/// where its events go); returns how many went.
pub(super) fn delete_unleased(conn: &Connection, leased: &[u64]) -> Result<u64> {
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
