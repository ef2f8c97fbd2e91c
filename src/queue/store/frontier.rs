//! Which queued rows need the ordering index.
//!
//! Batches and the disk cap read the queue in delivery order (lane, timestamp, seq). Nearly
//! every row is written in that order too: `track()` stamps events with the clock and the next
//! seq, and a spill writes them oldest first. Such a row is marked `in_order = 1` and gets no
//! entry in the index (schema step 5 → 6: the index is partial, `WHERE in_order = 0`); ordered
//! reads merge the in-order rows, read by seq along the table itself, with the indexed ones.
//! Writing the index was about a fifth of a spill's SQLite time.
//!
//! The rule that keeps the merge right: by seq, the in-order rows are also in delivery order.
//! A row joins them only if both its seq and its order key are past those of the last row that
//! joined ([`Frontier::admit`]); deleting rows never breaks it. Critical events, redriven ones
//! and anything older than the frontier (an importer's timestamps, a clock set back) are
//! indexed as before.

use rusqlite::{Connection, OptionalExtension};

use crate::event::{LANE_NORMAL, OrderKey};

/// The in-order rows from a seq on (`?1`, [`Frontier::floor`]), in delivery order, at most
/// `?2`: the table walked by seq.
pub const IN_ORDER_ROWS: &str = "WHERE seq >= ?1 AND in_order = 1 ORDER BY seq LIMIT ?2";
/// [`IN_ORDER_ROWS`] without a limit, for a read that steps only as far as it needs.
pub const IN_ORDER_FROM: &str = "WHERE seq >= ?1 AND in_order = 1 ORDER BY seq";
/// The in-order rows from `?1` up to, not including, `?2`.
pub const IN_ORDER_BELOW: &str = "WHERE seq >= ?1 AND seq < ?2 AND in_order = 1 ORDER BY seq";
/// The in-order rows past `?1`.
pub const IN_ORDER_ABOVE: &str = "WHERE seq > ?1 AND in_order = 1 ORDER BY seq";
/// The indexed rows in delivery order: the partial index walked.
pub const INDEXED_ALL: &str = "WHERE in_order = 0 ORDER BY lane, ts, seq";
/// The indexed rows of lane `?1` in delivery order, at most `?2`.
pub const INDEXED_ROWS_OF_LANE: &str = "WHERE in_order = 0 AND lane = ?1 ORDER BY ts, seq LIMIT ?2";

/// The last in-order row's key, and a lower bound of the in-order rows' seqs.
#[derive(Debug, Default)]
pub struct Frontier {
    last: Option<OrderKey>,
    /// No in-order row has a smaller seq. Reads of the in-order rows start here, so the rows
    /// before it that are not in order (an upgraded store's, say) are not walked past again at
    /// every batch. Raised by each read to the first in-order row it found.
    floor: u64,
}

impl Frontier {
    /// The frontier of the rows on disk: the in-order row with the highest seq, found from the
    /// end of the table (at once, unless the newest rows are all indexed).
    pub fn load(conn: &Connection) -> rusqlite::Result<Frontier> {
        let last = conn
            .query_row(
                "SELECT lane, ts, seq FROM events WHERE in_order = 1 ORDER BY seq DESC LIMIT 1",
                [],
                |r| {
                    Ok((
                        r.get::<_, u8>(0)?,
                        r.get::<_, i64>(1)?,
                        r.get::<_, i64>(2)? as u64,
                    ))
                },
            )
            .optional()?;
        Ok(Frontier { last, floor: 0 })
    }

    /// Whether a row with this key may skip the index; if so it becomes the frontier. Called for
    /// every row written, in the order they are written (a rolled-back write only leaves the
    /// frontier further on, which keeps the rule). A row below the floor never joins: the
    /// reads of the in-order rows start there.
    pub fn admit(&mut self, key: OrderKey) -> bool {
        let (lane, _, seq) = key;
        let fits = lane == LANE_NORMAL
            && seq >= self.floor
            && self.last.is_none_or(|last| key > last && seq > last.2);
        if fits {
            self.last = Some(key);
        }
        fits
    }

    pub fn floor(&self) -> u64 {
        self.floor
    }

    /// The lowest seq a new row may have and still skip the index: past the last in-order row
    /// and not below the floor. Seqs are handed out again from the rows on disk at open
    /// ([`super::Store::next_seq`]); rows deleted after the frontier was read (an open that
    /// finishes a denial) must not bring them below it.
    pub fn next_free(&self) -> u64 {
        self.last.map_or(0, |(_, _, seq)| seq + 1).max(self.floor)
    }

    /// After a read of the in-order rows from [`Frontier::floor`]: `first` is the seq of the
    /// first one it met, or `None` when there was none. Then no in-order row exists at all, and
    /// the frontier starts again from nothing (above the floor): otherwise one future-dated
    /// event (an importer, a wrong clock), once delivered, would leave every later row indexed
    /// and every batch read walking all of them.
    pub fn observed(&mut self, first: Option<u64>) {
        let floor = match (first, self.last) {
            (Some(seq), _) => seq,
            (None, Some(last)) => {
                self.last = None;
                last.2 + 1
            }
            (None, None) => return,
        };
        self.floor = self.floor.max(floor);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::LANE_CRITICAL;

    #[test]
    fn only_rows_past_the_frontier_in_both_seq_and_order_skip_the_index() {
        let mut f = Frontier::default();
        assert!(f.admit((LANE_NORMAL, 100, 5)));
        assert!(f.admit((LANE_NORMAL, 100, 6)), "same timestamp, later seq");
        assert!(!f.admit((LANE_NORMAL, 90, 7)), "an older timestamp");
        assert!(
            !f.admit((LANE_NORMAL, 200, 4)),
            "a later timestamp with an earlier seq would break seq order"
        );
        assert!(
            !f.admit((LANE_CRITICAL, 300, 8)),
            "critical rows are indexed"
        );
        assert!(
            f.admit((LANE_NORMAL, 101, 9)),
            "the frontier moved only on admits"
        );
    }

    #[test]
    fn the_floor_only_rises() {
        let mut f = Frontier::default();
        f.observed(None);
        assert_eq!(f.floor(), 0, "nothing known yet");
        f.admit((LANE_NORMAL, 1, 10));
        f.observed(Some(10));
        assert_eq!(f.floor(), 10);
        f.observed(Some(3));
        assert_eq!(f.floor(), 10);
        f.observed(None);
        assert_eq!(
            f.floor(),
            11,
            "every in-order row is gone: new ones come after 10"
        );
        assert!(
            f.admit((LANE_NORMAL, 0, 11)),
            "with no in-order row left, the frontier starts again"
        );
        assert!(!f.admit((LANE_NORMAL, -5, 12)), "behind the new frontier");
        let mut g = Frontier {
            last: None,
            floor: 20,
        };
        assert!(!g.admit((LANE_NORMAL, 1, 19)), "below the floor");
    }
}
