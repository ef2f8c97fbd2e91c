//! Reading the next batch and holding it: the oldest rows in delivery order (the in-order
//! rows merged with the indexed ones), bodies opened with their key and the undecryptable moved
//! to the quarantine, the leases that keep the batch in flight from the cap and from expiry,
//! and the bookkeeping a send writes on its rows. Also the row format reads and writes share.

use super::in_flight;
use super::*;

impl Store {
    /// The seqs a read must pass over: the batch in flight and the rows owed a delete, sorted
    /// (a read asks about every row it steps on).
    pub(super) fn skipped(&self) -> Skipped {
        let mut seqs = self.leased().clone();
        seqs.extend(lock(&self.owed).iter().map(|o| o.seq));
        seqs.sort_unstable();
        Skipped(seqs)
    }

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

    /// The oldest queued events in delivery order (never the leased ones), for the next batch.
    /// A row whose body does not open with its key (damaged on disk) is moved to the
    /// quarantine as `undecryptable` instead, and counted for [`Store::take_undecryptable`];
    /// when that move fails (a full disk), the row stays where it is, passed over, and the
    /// rows that opened are still the batch: thrown away with the move, they would let newer
    /// events in memory go first. A later read moves it.
    /// What [`Store::read_ahead`] read while the last batch was on the wire is taken instead
    /// of reading again when nothing has changed since (read_ahead.rs).
    pub fn oldest(&self, limit: usize) -> Result<Vec<QueuedEvent>> {
        let (out, unreadable) = {
            let mut conn = self.conn();
            if let Some(rows) = self.take_read_ahead(&conn, limit) {
                return Ok(rows);
            }
            self.try_settle_owed(&mut conn);
            let mut frontier = lock(&self.frontier);
            self.read_oldest(&conn, limit, Some(&mut frontier))?
        };
        if !unreadable.is_empty()
            && let Err(e) = self.quarantine_undecryptable(unreadable)
        {
            tracing::warn!(
                error = %e,
                "could not move undecryptable events to the quarantine; they stay queued, passed over, until a later read"
            );
        }
        Ok(out)
    }

    /// The oldest queued events in delivery order, read with the connection held, and the
    /// rows among them whose body did not open. With `observe`, the read raises the
    /// frontier's floor to the first in-order row it met; a read ahead leaves it as it is.
    #[allow(clippy::type_complexity)]
    pub(super) fn read_oldest(
        &self,
        conn: &Connection,
        limit: usize,
        observe: Option<&mut Frontier>,
    ) -> Result<(Vec<QueuedEvent>, Vec<(u64, QuarantinedEvent)>)> {
        let mut out = Vec::with_capacity(limit);
        let mut unreadable: Vec<(u64, QuarantinedEvent)> = Vec::new();
        let skipped = self.skipped();
        let floor = match observe.as_deref() {
            Some(frontier) => frontier.floor(),
            None => lock(&self.frontier).floor(),
        };
        // Draining, the oldest rows are the batch on the wire (and those owed a delete), one
        // run of seqs: a read ahead reads the in-order rows below that run, then those above
        // it, instead of stepping over each. A read that observes does not split, as the first
        // row it meets raises the frontier's floor.
        let gap = match observe {
            Some(_) => None,
            None => skipped.longest_run_from(floor),
        };
        // Without a LIMIT: both runs are read in the order they are stored (the table by
        // seq, the partial index), so SQLite steps only as far as the merge asks, and rows
        // passed over (in flight, owed a delete, undecryptable) cannot use up one run's
        // share of the read and let the other run's later rows jump ahead.
        let mut in_order = conn.prepare_cached(&format!(
            "SELECT {QUEUED_COLUMNS} FROM events {IN_ORDER_FROM}"
        ))?;
        let mut below = conn.prepare_cached(&format!(
            "SELECT {QUEUED_COLUMNS} FROM events {IN_ORDER_BELOW}"
        ))?;
        let mut above = conn.prepare_cached(&format!(
            "SELECT {QUEUED_COLUMNS} FROM events {IN_ORDER_ABOVE}"
        ))?;
        let mut indexed = conn.prepare_cached(&format!(
            "SELECT {QUEUED_COLUMNS} FROM events {INDEXED_ALL}"
        ))?;
        let mut a_rows = match gap {
            Some((first, _)) => below.query(params![floor as i64, first as i64])?,
            None => in_order.query(params![floor as i64])?,
        };
        let mut b_rows = indexed.query([])?;
        let mut a = a_rows.next()?;
        // The rows above the run, read once those below it are all met.
        let mut above_left = gap.map(|(_, last)| (&mut above, last));
        if a.is_none()
            && let Some((stmt, last)) = above_left.take()
        {
            a_rows = stmt.query(params![last as i64])?;
            a = a_rows.next()?;
        }
        let mut b = b_rows.next()?;
        if let Some(frontier) = observe {
            frontier.observed(a.map(|r| r.get::<_, i64>(0)).transpose()?.map(|s| s as u64));
        }
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
                if a.is_none()
                    && let Some((stmt, last)) = above_left.take()
                {
                    a_rows = stmt.query(params![last as i64])?;
                    a = a_rows.next()?;
                }
            } else {
                b = b_rows.next()?;
            }
        }
        Ok((out, unreadable))
    }

    /// One row of [`QUEUED_COLUMNS`]: `None` for a row in flight or whose id does not parse
    /// (skipped before its body is opened), `Err` for a body that does not open with its key.
    #[allow(clippy::type_complexity)]
    fn queued_row(
        &self,
        r: &rusqlite::Row<'_>,
        skipped: &Skipped,
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
                    sealed: Default::default(),
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

    /// Gives rows of a batch back to the queue: they are read again, before what was read
    /// ahead of them.
    pub fn release(&self, seqs: &[u64]) {
        self.settle_in_flight_now(seqs);
        remove_seqs(&mut self.leased(), seqs);
        self.forget_read_ahead();
    }

    /// Lets go of rows that left the queue (deleted, moved, or owed a delete): they owe no
    /// send count either.
    pub(super) fn unlease_gone(&self, seqs: &[u64]) {
        self.forget_in_flight(seqs);
        remove_seqs(&mut self.leased(), seqs);
    }

    pub fn release_all(&self) {
        let on_the_wire = lock(&self.in_flight).clone();
        self.settle_in_flight_now(&on_the_wire);
        self.leased().clear();
        self.forget_read_ahead();
    }

    /// Applies a send's bookkeeping ([`SendNote`]) to these rows, in one transaction. The count
    /// of a send about to start goes to the record of the rows on the wire (in_flight.rs);
    /// any other first settles what that record owes these rows.
    pub fn note_sends(&self, seqs: &[u64], note: SendNote) -> Result<()> {
        if seqs.is_empty() {
            return Ok(());
        }
        if note == SendNote::Sending {
            return self.note_sending(seqs);
        }
        let mut conn = self.conn();
        let written = (|| -> Result<Vec<u64>> {
            let tx = conn.transaction()?;
            let kept = self.settle_in_flight(&tx, seqs)?;
            in_flight::apply(&tx, seqs, note)?;
            tx.commit()?;
            Ok(kept)
        })();
        let kept = self.checked(&conn, written)?;
        *lock(&self.in_flight) = kept;
        self.checkpoint_if_needed(&conn);
        Ok(())
    }
}

/// What [`Store::oldest`] reads of a queued row, in the order [`Store::queued_row`] reads it.
pub(super) const QUEUED_COLUMNS: &str =
    "seq, ts, event_id, body, accepted, sends, unanswered, key_id, lane";

/// The delivery order of a row of [`QUEUED_COLUMNS`].
fn queued_key(r: &rusqlite::Row<'_>) -> rusqlite::Result<OrderKey> {
    Ok((r.get(8)?, r.get(1)?, r.get::<_, i64>(0)? as u64))
}

/// The associated-data name of a queued event's body (crypto.rs).
pub(super) const BODY: &str = "events.body";

/// What a sealed body's associated data names besides its column (schema 7): the row's event
/// id, timestamp and lane, the clear columns the event is sent with and ordered by. The head
/// of the wire JSON (`event_id`, `timestamp`) is rebuilt from those columns, so a `ts` changed
/// on disk, or swapped between rows, fails authentication like a damaged body instead of
/// sending the event with another time; so does a moved lane. Built into `buf` only for a
/// sealed row (`key_id` not 0): plain rows have no associated data.
pub(super) fn body_ad<'a>(
    key_id: u32,
    id: &'a str,
    ts_ms: i64,
    lane: u8,
    buf: &'a mut String,
) -> &'a str {
    if key_id == 0 {
        return id;
    }
    // Without `fmt`: formatting the two numbers took a third of sealing an event's body.
    let (mut ts, mut ln) = (itoa::Buffer::new(), itoa::Buffer::new());
    let (ts, ln) = (ts.format(ts_ms), ln.format(lane));
    buf.reserve(id.len() + ts.len() + ln.len() + 2);
    for part in [id, "|", ts, "|", ln] {
        buf.push_str(part);
    }
    buf
}

/// The quarantine entry of a row whose payload is lost: its id, timestamp and sends are kept.
pub(super) fn undecryptable_entry(
    event_id: &str,
    ts_ms: i64,
    sends: u32,
    key_id: u32,
) -> QuarantinedEvent {
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

/// The seqs a read passes over ([`Store::skipped`]), sorted.
pub(super) struct Skipped(Vec<u64>);

impl Skipped {
    pub(super) fn contains(&self, seq: &u64) -> bool {
        self.0.binary_search(seq).is_ok()
    }

    /// The longest run of consecutive seqs from `floor` on, (first, last), when it holds more
    /// than one.
    fn longest_run_from(&self, floor: u64) -> Option<(u64, u64)> {
        let from = self.0.partition_point(|&s| s < floor);
        self.0[from..]
            .chunk_by(|a, b| b == &(a + 1))
            .max_by_key(|run| run.len())
            .filter(|run| run.len() > 1)
            .map(|run| (run[0], run[run.len() - 1]))
    }
}
