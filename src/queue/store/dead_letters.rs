//! The store's side of the quarantine: the transactions quarantine_sql.rs runs in, kept to
//! the dead letters' budget and the disk cap, events moving from the queue into it, redrive
//! back into the queue, and the counts by reason `stats()` reads. Apart from quarantine_sql.rs,
//! which is only SQL, because these also keep the queue's own bookkeeping.

use super::reads::{BODY, body_ad};
use super::writes::INSERT_EVENT;
use super::*;

impl Store {
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
    pub(super) fn forget_quarantine_counts(&self) {
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
        // After every commit, not only one that changed rows: `DELETE FROM quarantine` on an
        // empty table still rewrites its pages (a few WAL frames each time), and repeated
        // purges pushed the WAL past the cap (`model_replay_empty_purges_keep_the_store_inside_its_cap`).
        // The check reads two atomics unless the WAL is over its share.
        self.checkpoint_if_needed(&conn);
        drop(conn);
        self.unlease_gone(from_queue);
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
