//! The quarantine's SQL, run inside a transaction the [`super::Store`] opens.
//!
//! Body, reason and detail are sealed with the store's current key (crypto.rs), so selecting by
//! reason cannot be done by SQL on a sealed store: rows are opened and filtered here. The
//! quarantine is bounded (`quarantine_max_events`, its byte budget), which bounds that work.

use std::collections::BTreeMap;

use rusqlite::{Row, Transaction, params, params_from_iter};

use super::{bump, counter};
use crate::crypto::Keyring;
use crate::error::Result;
use crate::quarantine::{Evicted, ListFilter, QuarantinedEvent, Selector, reason};

pub struct QuarantineSql<'a> {
    tx: &'a Transaction<'a>,
    /// The store's byte limits, which every insert keeps to; `None` for read-only access.
    limits: Option<ByteLimits>,
    keys: &'a Keyring,
}

/// Associated-data names of the sealed columns (crypto.rs).
const BODY: &str = "quarantine.body";
const REASON: &str = "quarantine.reason";
const DETAIL: &str = "quarantine.detail";

/// What the quarantine may take of `max_disk_bytes` (see the store's `DiskBudget`).
#[derive(Clone, Copy, Debug)]
pub struct ByteLimits {
    /// The database file's share of the cap (the WAL has the rest).
    pub db_bytes: u64,
    /// The dead letters' own budget inside `db_bytes`.
    pub dead_bytes: u64,
    pub page_size: u64,
}

const COLUMNS: &str = "event_id, ts, body, reason, detail, status, attempts, first_failed_ms, last_failed_ms, sends, key_id";

/// A row as stored, its sealed columns opened. One that does not open (damaged on disk) is
/// shown as `undecryptable` with an empty body, so it can be seen and purged, never sent.
fn row_to_event(keys: &Keyring, r: &Row<'_>) -> rusqlite::Result<QuarantinedEvent> {
    let event_id: String = r.get(0)?;
    let key_id: u32 = r.get(10)?;
    let opened = (|| {
        Ok::<_, crate::crypto::Unreadable>((
            keys.open(
                key_id,
                BODY,
                &event_id,
                r.get_ref(2).map_err(|_| crate::crypto::Unreadable)?,
            )?,
            keys.open(
                key_id,
                REASON,
                &event_id,
                r.get_ref(3).map_err(|_| crate::crypto::Unreadable)?,
            )?,
            keys.open(
                key_id,
                DETAIL,
                &event_id,
                r.get_ref(4).map_err(|_| crate::crypto::Unreadable)?,
            )?,
        ))
    })();
    let (body, reason, detail) = opened.unwrap_or_else(|_| {
        (
            String::new(),
            reason::UNDECRYPTABLE.to_string(),
            format!(
                "sealed with encryption key id {key_id}; the stored ciphertext failed authentication (damaged on disk)"
            ),
        )
    });
    Ok(QuarantinedEvent {
        event_id,
        ts_ms: r.get(1)?,
        body,
        reason,
        detail,
        status: r.get::<_, Option<i64>>(5)?.map(|s| s as u16),
        attempts: r.get::<_, i64>(6)? as u32,
        first_failed_ms: r.get(7)?,
        last_failed_ms: r.get(8)?,
        sends: r.get(9)?,
    })
}

/// The WHERE clause and its parameters for the rows a selector may match: exact for ids and
/// all; for a reason, every row (the reason is sealed; [`Selector::matches`] decides).
fn where_clause(selector: &Selector) -> (String, Vec<String>) {
    match selector {
        Selector::All | Selector::Reason(_) => (String::new(), Vec::new()),
        Selector::Ids(ids) if ids.is_empty() => (" WHERE 0".into(), Vec::new()),
        Selector::Ids(ids) => {
            let marks = vec!["?"; ids.len()].join(",");
            (format!(" WHERE event_id IN ({marks})"), ids.clone())
        }
    }
}

impl<'a> QuarantineSql<'a> {
    /// Access without byte limits: for reading (and for purges, which only free space).
    pub fn new(tx: &'a Transaction<'a>, keys: &'a Keyring) -> Self {
        QuarantineSql {
            tx,
            limits: None,
            keys,
        }
    }

    /// Access whose inserts keep the dead letters inside their budget and the file inside the cap.
    pub fn bounded(tx: &'a Transaction<'a>, limits: ByteLimits, keys: &'a Keyring) -> Self {
        QuarantineSql {
            tx,
            limits: Some(limits),
            keys,
        }
    }

    pub fn tx(&self) -> &Transaction<'a> {
        self.tx
    }

    /// Adds (or refreshes) entries, then applies the retention, the count cap and, with byte
    /// limits, the dead letters' byte budget and the disk cap (oldest dead letters out first,
    /// never a queued event: a live event is not evicted to make room for a dead one).
    pub fn add(
        &self,
        events: &[QuarantinedEvent],
        max_events: u64,
        retention_cutoff_ms: i64,
    ) -> Result<Evicted> {
        let next: i64 = self.tx.query_row(
            "SELECT coalesce(max(quarantined_seq), 0) + 1 FROM quarantine",
            [],
            |r| r.get(0),
        )?;
        {
            let mut stmt = self.tx.prepare_cached(
                "INSERT INTO quarantine (event_id, ts, body, reason, detail, status, attempts, first_failed_ms,
                     last_failed_ms, quarantined_seq, sends, key_id)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)
                 ON CONFLICT(event_id) DO UPDATE SET body = excluded.body, reason = excluded.reason,
                     detail = excluded.detail, key_id = excluded.key_id,
                     status = excluded.status, attempts = attempts + excluded.attempts,
                     last_failed_ms = excluded.last_failed_ms, quarantined_seq = excluded.quarantined_seq,
                     sends = max(sends, excluded.sends)",
            )?;
            let key_id = self.keys.current_id();
            for (i, e) in events.iter().enumerate() {
                let id = &e.event_id;
                stmt.execute(params![
                    e.event_id,
                    e.ts_ms,
                    self.keys.seal(BODY, id, &e.body),
                    self.keys.seal(REASON, id, &e.reason),
                    self.keys.seal(DETAIL, id, &e.detail),
                    e.status.map(i64::from),
                    e.attempts as i64,
                    e.first_failed_ms,
                    e.last_failed_ms,
                    next + i as i64,
                    e.sends,
                    key_id
                ])?;
            }
        }
        let mut evicted = self.enforce(max_events, retention_cutoff_ms)?;
        if let Some(limits) = self.limits {
            evicted.cap += self.enforce_bytes(limits)?;
        }
        Ok(evicted)
    }

    /// Evicts the oldest dead letters while they take more than their budget, then while the
    /// database is over its share of the cap; counted `quarantine_cap`. Returns how many went.
    fn enforce_bytes(&self, limits: ByteLimits) -> Result<u64> {
        let mut evicted = 0;
        for _ in 0..10_000 {
            let used = Self::used_bytes(self.tx)?;
            let excess = match used.checked_sub(limits.dead_bytes) {
                Some(over) if over > 0 => over,
                _ => super::db_excess(self.tx, limits.page_size, limits.db_bytes)?,
            };
            if excess == 0 {
                break;
            }
            let n = Self::evict_oldest(self.tx, (excess / 512).clamp(1, 1024))?;
            if n == 0 {
                break;
            }
            evicted += n;
        }
        if evicted > 0 {
            bump(self.tx, counter::QUARANTINE_CAP, evicted)?;
        }
        Ok(evicted)
    }

    /// Bytes the dead letters occupy: the used part of the pages of the quarantine table and its
    /// indexes (SQLite's `dbstat`), so the budget is measured in what the file really holds.
    pub fn used_bytes(tx: &Transaction<'_>) -> Result<u64> {
        let names: Vec<String> = {
            let mut stmt = tx.prepare_cached(
                "SELECT name FROM sqlite_schema WHERE tbl_name = 'quarantine' AND rootpage > 0",
            )?;
            stmt.query_map([], |r| r.get(0))?
                .collect::<rusqlite::Result<_>>()?
        };
        let mut stmt = tx.prepare_cached(
            "SELECT coalesce(sum(pgsize - unused), 0) FROM dbstat WHERE name = ?1 AND aggregate = 1",
        )?;
        let mut used = 0u64;
        for name in &names {
            used += stmt.query_row([name], |r| r.get::<_, i64>(0))? as u64;
        }
        Ok(used)
    }

    /// Applies `quarantine_retention_ms` and `quarantine_max_events`, oldest out first.
    pub fn enforce(&self, max_events: u64, retention_cutoff_ms: i64) -> Result<Evicted> {
        let expired = self.tx.execute(
            "DELETE FROM quarantine WHERE last_failed_ms < ?1",
            [retention_cutoff_ms],
        )? as u64;
        let count: i64 = self
            .tx
            .query_row("SELECT count(*) FROM quarantine", [], |r| r.get(0))?;
        let over = (count as u64).saturating_sub(max_events);
        let cap = if over > 0 {
            Self::evict_oldest(self.tx, over)?
        } else {
            0
        };
        if expired > 0 {
            bump(self.tx, counter::QUARANTINE_EXPIRED, expired)?;
        }
        if cap > 0 {
            bump(self.tx, counter::QUARANTINE_CAP, cap)?;
        }
        Ok(Evicted { cap, expired })
    }

    /// Removes the `n` oldest entries; the caller counts them.
    pub fn evict_oldest(tx: &Transaction<'_>, n: u64) -> Result<u64> {
        Ok(tx.execute(
            "DELETE FROM quarantine WHERE event_id IN
                 (SELECT event_id FROM quarantine ORDER BY quarantined_seq LIMIT ?1)",
            [n as i64],
        )? as u64)
    }

    pub fn list(&self, filter: &ListFilter) -> Result<Vec<QuarantinedEvent>> {
        let limit = if filter.limit == 0 {
            usize::MAX
        } else {
            filter.limit as usize
        };
        let Some(reason) = &filter.reason else {
            let sql = format!(
                "SELECT {COLUMNS} FROM quarantine ORDER BY quarantined_seq LIMIT {} OFFSET {}",
                if filter.limit == 0 {
                    -1
                } else {
                    filter.limit as i64
                },
                filter.offset
            );
            let mut stmt = self.tx.prepare(&sql)?;
            let rows = stmt.query_map([], |r| row_to_event(self.keys, r))?;
            return Ok(rows.collect::<rusqlite::Result<_>>()?);
        };
        Ok(self
            .select(&Selector::Reason(reason.clone()))?
            .into_iter()
            .skip(filter.offset as usize)
            .take(limit)
            .collect())
    }

    pub fn get(&self, event_id: &str) -> Result<Option<QuarantinedEvent>> {
        let mut stmt = self.tx.prepare_cached(&format!(
            "SELECT {COLUMNS} FROM quarantine WHERE event_id = ?1"
        ))?;
        let mut rows = stmt.query_map([event_id], |r| row_to_event(self.keys, r))?;
        Ok(rows.next().transpose()?)
    }

    /// The entries a selector matches, opened, oldest first.
    fn select(&self, selector: &Selector) -> Result<Vec<QuarantinedEvent>> {
        let (clause, args) = where_clause(selector);
        let mut stmt = self.tx.prepare(&format!(
            "SELECT {COLUMNS} FROM quarantine{clause} ORDER BY quarantined_seq"
        ))?;
        let rows = stmt.query_map(params_from_iter(args.iter()), |r| {
            row_to_event(self.keys, r)
        })?;
        let mut out = Vec::new();
        for row in rows {
            let e = row?;
            if selector.matches(&e) {
                out.push(e);
            }
        }
        Ok(out)
    }

    /// Removes and returns the selected entries, oldest first. Undecryptable entries are left
    /// where they are: they have no payload to send again.
    pub fn take(&self, selector: &Selector) -> Result<Vec<QuarantinedEvent>> {
        let taken: Vec<QuarantinedEvent> = self
            .select(selector)?
            .into_iter()
            .filter(|e| e.reason != reason::UNDECRYPTABLE)
            .collect();
        self.delete_ids(taken.iter().map(|e| e.event_id.as_str()))?;
        Ok(taken)
    }

    pub fn purge(&self, selector: &Selector) -> Result<u64> {
        match selector {
            Selector::Reason(_) => {
                let ids: Vec<String> = self
                    .select(selector)?
                    .into_iter()
                    .map(|e| e.event_id)
                    .collect();
                self.delete_ids(ids.iter().map(String::as_str))
            }
            _ => {
                let (clause, args) = where_clause(selector);
                Ok(self.tx.execute(
                    &format!("DELETE FROM quarantine{clause}"),
                    params_from_iter(args.iter()),
                )? as u64)
            }
        }
    }

    fn delete_ids<'i>(&self, ids: impl Iterator<Item = &'i str>) -> Result<u64> {
        let mut stmt = self
            .tx
            .prepare_cached("DELETE FROM quarantine WHERE event_id = ?1")?;
        let mut n = 0;
        for id in ids {
            n += stmt.execute([id])? as u64;
        }
        Ok(n)
    }

    /// Entries by reason. Plain rows are counted by SQL; sealed ones open only their reason.
    /// A row whose key is not supplied (read-only inspection without keys) counts as
    /// `encrypted`.
    pub fn counts(&self) -> Result<BTreeMap<String, u64>> {
        let mut out: BTreeMap<String, u64> = {
            let mut stmt = self.tx.prepare_cached(
                "SELECT reason, count(*) FROM quarantine WHERE key_id = 0 GROUP BY reason",
            )?;
            let rows = stmt.query_map([], |r| {
                Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)? as u64))
            })?;
            rows.collect::<rusqlite::Result<_>>()?
        };
        let mut stmt = self
            .tx
            .prepare_cached("SELECT event_id, key_id, reason FROM quarantine WHERE key_id != 0")?;
        let mut rows = stmt.query([])?;
        while let Some(r) = rows.next()? {
            let event_id: String = r.get(0)?;
            let key_id: u32 = r.get(1)?;
            let reason = if !self.keys.has(key_id) {
                "encrypted".to_string()
            } else {
                self.keys
                    .open(key_id, REASON, &event_id, r.get_ref(2)?)
                    .unwrap_or_else(|_| reason::UNDECRYPTABLE.to_string())
            };
            *out.entry(reason).or_default() += 1;
        }
        Ok(out)
    }
}
