//! The batch on the wire, recorded as one `meta` row instead of a count written on each of its
//! rows.
//!
//! A send is counted before its request goes out (decision 0043), so an app killed
//! mid-request still counts it. Written on the rows themselves, that count rewrote every row
//! of every batch just before it was sent, and most of those rows are deleted a moment later
//! when the collector acknowledges them. Instead [`Store::note_sending`] writes which rows are
//! on the wire in one row, and the count reaches the rows only where it is still needed
//! (decision 0069): when another count is noted on them (the answer failed, the send was
//! withheld), when they are given back to the queue unanswered, when the next send finds
//! them still queued (a timeout, then a retry), and at the next open after a crash. Rows
//! delivered meanwhile never get it: they are gone.
//!
//! Draining a backlog without a pause between batches, even that one row was a commit between
//! an answer and the next request, with the collector idle. So the commit made while a request
//! is on the wire also adds the rows read ahead for the next batch to the record
//! ([`Store::settle_recording_ahead`], decision 0077): when that batch leaves, its count is
//! already kept, and its send writes nothing. A crash in between counts a send those rows had not had yet: the early count a
//! crash between the record and its request always made, over a longer window. It never
//! counts one too few.

use super::*;

/// The `meta` row naming the rows on the wire: their seqs, comma-separated.
const IN_FLIGHT: &str = "in_flight";

impl Store {
    /// Counts [`SendNote::Sending`] for these rows before their request goes out: the record
    /// of the rows on the wire is replaced, and what the one it replaces still owes rows that
    /// are queued is applied to them, in one transaction.
    pub fn note_sending(&self, seqs: &[u64]) -> Result<()> {
        let conn = self.conn();
        let mut recorded = lock(&self.in_flight);
        // What an earlier send still owes rows that are queued (a timeout, then this resend);
        // rows owed a delete were delivered, and their count no longer matters.
        // Sorted: a drain's batch of 100 is owed a delete as the next one leaves.
        let mut owed: Vec<u64> = lock(&self.owed).iter().map(|o| o.seq).collect();
        owed.sort_unstable();
        let due: Vec<u64> = recorded
            .iter()
            .copied()
            .filter(|s| owed.binary_search(s).is_err())
            .collect();
        {
            let mut ahead = lock(&self.recorded_ahead);
            let counted = due.is_empty() && seqs.iter().all(|s| ahead.binary_search(s).is_ok());
            // Rows recorded ahead and left out of this batch stay named on the record until
            // its next write (a crash counts them early, like any row recorded ahead); their
            // own send records them again.
            ahead.clear();
            if counted {
                // Recorded while the request before was on the wire: already counted.
                *recorded = seqs.to_vec();
                return Ok(());
            }
        }
        let written = (|| -> Result<()> {
            let tx = conn.unchecked_transaction()?;
            apply(&tx, &due, SendNote::Sending)?;
            record(&tx, seqs)?;
            self.wal.sparing(|| tx.commit())?;
            Ok(())
        })();
        self.checked(&conn, written)?;
        *recorded = seqs.to_vec();
        drop(recorded);
        self.checkpoint_if_needed(&conn);
        Ok(())
    }

    /// Inside `tx`, before another count is written on `seqs`: the send the record still owes
    /// those of them on the wire is applied first, and they leave the record. Returns the record
    /// as it is once `tx` commits.
    pub(super) fn settle_in_flight(&self, tx: &Transaction<'_>, seqs: &[u64]) -> Result<Vec<u64>> {
        let recorded = lock(&self.in_flight).clone();
        let (due, kept): (Vec<u64>, Vec<u64>) =
            recorded.into_iter().partition(|s| seqs.contains(s));
        if due.is_empty() {
            return Ok(kept);
        }
        // The record this writes names the rows still on the wire alone.
        lock(&self.recorded_ahead).clear();
        apply(tx, &due, SendNote::Sending)?;
        record(tx, &kept)?;
        Ok(kept)
    }

    /// While a request is on the wire, after [`Store::read_ahead`]: one commit deletes what
    /// the last answer delivered (and the reports it covered, as [`Store::settle`]) and adds
    /// the rows read ahead to the record of the rows on the wire, so the next batch's send
    /// finds its count kept and writes nothing ([`Store::note_sending`]). The read ahead still
    /// holds after it: the rows it deletes are owed ones, which the read passed over. When the
    /// commit fails, the next send records its rows itself.
    pub fn settle_recording_ahead(&self) {
        let next: Vec<u64> = match lock(&self.read_ahead).as_ref() {
            Some(read) if !read.is_empty() => read.seqs(),
            _ => return self.settle(),
        };
        let conn = self.conn();
        let mut named = lock(&self.in_flight).clone();
        named.extend_from_slice(&next);
        let recorded = self.beside_the_queue(&conn, || {
            self.settle_owed_with(&conn, |tx| Ok(record(tx, &named)?))
        });
        if recorded {
            let mut ahead = next;
            ahead.sort_unstable();
            *lock(&self.recorded_ahead) = ahead;
        }
    }

    /// Rows given back to the queue unanswered get the send the record owes them now, so a
    /// read sees their true counts.
    pub(super) fn settle_in_flight_now(&self, seqs: &[u64]) {
        let due = lock(&self.in_flight).iter().any(|s| seqs.contains(s));
        if !due {
            return;
        }
        let conn = self.conn();
        let settled = (|| -> Result<Vec<u64>> {
            let tx = conn.unchecked_transaction()?;
            let kept = self.settle_in_flight(&tx, seqs)?;
            tx.commit()?;
            Ok(kept)
        })();
        match settled {
            Ok(kept) => {
                *lock(&self.in_flight) = kept;
                // A whole batch's counts: the WAL may be past its share now.
                self.checkpoint_if_needed(&conn);
            }
            // Left in the record: the next send or the next open applies it.
            Err(e) => {
                tracing::warn!(error = %e, "could not record the send counts");
                self.after_failed_write_on(&conn);
            }
        }
    }

    /// Delivered rows deleted: nothing is owed to them any more.
    pub(super) fn forget_in_flight(&self, seqs: &[u64]) {
        remove_seqs(&mut lock(&self.in_flight), seqs);
    }
}

/// At open, before anything else writes: the send that the batch on the wire at the last
/// close (or crash) still owes its queued rows is applied to them, and the record goes. When
/// that write fails, returns the seqs, for the first send to apply.
pub(super) fn settle_at_open(conn: &mut Connection) -> Vec<u64> {
    let settled = (|| -> rusqlite::Result<Vec<u64>> {
        let Some(text) = read_meta(conn, IN_FLIGHT)? else {
            return Ok(Vec::new());
        };
        let seqs = parse(&text);
        let tx = conn.transaction()?;
        apply(&tx, &seqs, SendNote::Sending)?;
        record(&tx, &[])?;
        tx.commit()?;
        Ok(Vec::new())
    })();
    settled.unwrap_or_else(|e| {
        tracing::warn!(error = %e, "could not count the send a crash interrupted; the next send does");
        read_meta(conn, IN_FLIGHT)
            .ok()
            .flatten()
            .map(|text| parse(&text))
            .unwrap_or_default()
    })
}

/// Writes `note`'s counts on these rows (those still queued).
pub(super) fn apply(tx: &Transaction<'_>, seqs: &[u64], note: SendNote) -> rusqlite::Result<()> {
    if seqs.is_empty() {
        return Ok(());
    }
    let (sends, unanswered) = note.deltas();
    let mut stmt = tx.prepare_cached(
        "UPDATE events SET sends = max(sends + ?2, 0), unanswered = max(unanswered + ?3, 0)
         WHERE seq = ?1",
    )?;
    for seq in seqs {
        stmt.execute(params![*seq as i64, sends, unanswered])?;
    }
    Ok(())
}

/// Replaces the record with these seqs (none: no record).
fn record(tx: &Transaction<'_>, seqs: &[u64]) -> rusqlite::Result<()> {
    if seqs.is_empty() {
        tx.prepare_cached("DELETE FROM meta WHERE name = ?1")?
            .execute([IN_FLIGHT])?;
        return Ok(());
    }
    let text = seqs
        .iter()
        .map(u64::to_string)
        .collect::<Vec<_>>()
        .join(",");
    write_meta(tx, IN_FLIGHT, &text)
}

fn parse(text: &str) -> Vec<u64> {
    text.split(',').filter_map(|s| s.parse().ok()).collect()
}
