//! Operating on a store file without a running spool: what an operator's tool needs to look at
//! a device's backlog and triage its quarantine.
//!
//! Two ways in. [`inspect`], [`quarantine_list`] and [`quarantine_get`] only read: they open
//! SQLite read-only, take no owner lock and wait on a busy store for a bounded time, so they can
//! report on a store another process is using without disturbing it, and a damaged file is
//! reported, never moved aside or replaced (that is the owner's recovery, not a reader's).
//! [`StoreAdmin`] changes things (redrive, purge), so it becomes the store's owner exactly as a
//! spool would, and is refused while a spool holds the store.
//!
//! A store an earlier release wrote (a lower schema version) is read as this release would read
//! it once upgraded: from a copy in memory, upgraded by the same steps an open runs
//! (`admin/read_view.rs`), so the file keeps its version until a spool opens it. A store of a
//! later release (a higher version) is named, with the version it holds, and not read.
//!
//! An encrypted store (config `encryption_keys`) needs its keys to show payloads: the
//! quarantine's readers and [`StoreAdmin`] take them, and refuse a wrong or missing one by key
//! id exactly as `open()` does. [`inspect`] reads only what is stored in the clear (counts,
//! timestamps, sizes); it counts sealed quarantine reasons it cannot open as `encrypted`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use rusqlite::{Connection, OpenFlags};

use crate::crypto::{EncryptionKeys, Keyring};
use crate::error::{Error, Result};
use crate::quarantine::{ListFilter, QuarantinedEvent, Selector};
use crate::queue::{QuarantineSql, Queue, QueueParams, check_keys, schema};

mod read_view;

/// The store format (`PRAGMA user_version`) this release writes, and the newest it reads.
pub const SCHEMA_VERSION: i64 = schema::SCHEMA_VERSION;

/// How long [`inspect`] waits for a writer to finish a transaction before giving up. A spool's
/// transactions are bounded in size, so this is generous.
const INSPECT_BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// A store's contents at one moment, as an operator sees them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StoreStatus {
    /// Queued events on disk (a closed store has nothing in memory).
    pub pending: u64,
    /// Database plus WAL, as the file system reports them.
    pub bytes: u64,
    /// Timestamps (ms since the epoch) of the oldest and newest queued events.
    pub oldest_ms: Option<i64>,
    pub newest_ms: Option<i64>,
    /// Quarantined events by reason.
    pub quarantine: BTreeMap<String, u64>,
    /// Persisted drop counters, by reason (without the `dropped.` prefix).
    pub dropped: BTreeMap<String, u64>,
    /// Tracking consent as recorded (README §Consent); `None` for a store that predates it and
    /// was not opened by a spool since.
    pub consent: Option<crate::Consent>,
    /// Of `pending`, the events in the critical lane (docs/critical-lane.md).
    pub pending_critical: u64,
    /// The schema version the file holds. Below [`SCHEMA_VERSION`] (a store an earlier release
    /// wrote that no spool of this one opened yet) the figures are read from a copy upgraded in
    /// memory, the file is left as it is, and the next open by a spool upgrades it in place.
    pub schema_version: i64,
}

/// Opens an existing store read-only and checks it is one of ours; every error names the file.
/// Returns the connection the readers read (the file, or for an earlier schema an upgraded
/// copy: [`read_view`]) and the schema version the file holds.
fn open_read_only(path: &Path) -> Result<(Connection, i64)> {
    if !path.exists() {
        return Err(Error::NotFound(format!("no store at {}", path.display())));
    }
    let named = |e: rusqlite::Error| Error::Storage(format!("cannot read {}: {e}", path.display()));
    let conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(|e| Error::Storage(format!("cannot open {} read-only: {e}", path.display())))?;
    conn.busy_timeout(INSPECT_BUSY_TIMEOUT).map_err(named)?;
    // The same recognition the store's opener uses: a foreign, newer or empty file is not read.
    match schema::inspect(&conn).map_err(named)? {
        Ok(SCHEMA_VERSION) => Ok((conn, SCHEMA_VERSION)),
        Ok(version) if version > 0 => read_view::upgraded_copy(path, &conn),
        Ok(_) => Err(Error::Storage(format!(
            "{} is not an eventspool store",
            path.display()
        ))),
        Err(schema::Unusable::NewerVersion(version)) => Err(Error::Storage(format!(
            "{} was written by a newer eventspool release (schema version {version}; this \
             release reads versions 1 to {SCHEMA_VERSION}): read it with that release or a later one",
            path.display()
        ))),
        Err(unusable) => Err(Error::Storage(format!("{}: {unusable}", path.display()))),
    }
}

/// Runs `f` in one read transaction of a store opened read-only, naming the file on error.
fn read<T>(path: &Path, f: impl FnOnce(&rusqlite::Transaction<'_>, i64) -> Result<T>) -> Result<T> {
    let (mut conn, version) = open_read_only(path)?;
    let named = |e: Error| match e {
        Error::Storage(m) if !m.contains(&path.display().to_string()) => {
            Error::Storage(format!("cannot read {}: {m}", path.display()))
        }
        other => other,
    };
    let tx = conn.transaction().map_err(Error::from).map_err(named)?;
    let out = f(&tx, version).map_err(named)?;
    tx.commit().map_err(Error::from).map_err(named)?;
    Ok(out)
}

/// Runs `f` on the quarantine of a store opened read-only, with `keys` checked first: a wrong
/// or missing key is refused naming its id ([`Error::EncryptionKey`]).
fn read_quarantine<T>(
    path: &Path,
    keys: &EncryptionKeys,
    f: impl FnOnce(&QuarantineSql<'_>) -> Result<T>,
) -> Result<T> {
    let keyring = Keyring::new(keys);
    read(path, |tx, _| {
        check_keys(tx, &keyring, path, false)?;
        f(&QuarantineSql::new(tx, &keyring))
    })
}

/// Quarantined events, oldest first, read without becoming the owner: the file is never changed.
/// `keys` are the store's `encryption_keys` (empty for a plain store).
pub fn quarantine_list(
    path: &Path,
    keys: &EncryptionKeys,
    filter: &ListFilter,
) -> Result<Vec<QuarantinedEvent>> {
    read_quarantine(path, keys, |q| q.list(filter))
}

/// One quarantined event, read without becoming the owner: the file is never changed.
pub fn quarantine_get(
    path: &Path,
    keys: &EncryptionKeys,
    event_id: &str,
) -> Result<Option<QuarantinedEvent>> {
    read_quarantine(path, keys, |q| q.get(event_id))
}

/// Reads a store's status without becoming its owner; safe while a spool is using it.
pub fn inspect(path: &Path) -> Result<StoreStatus> {
    // One read transaction, so the figures agree with each other.
    read(path, |tx, version| status_of(tx, path, version))
}

fn status_of(tx: &rusqlite::Transaction<'_>, path: &Path, version: i64) -> Result<StoreStatus> {
    let (pending, oldest_ms, newest_ms): (i64, Option<i64>, Option<i64>) =
        tx.query_row("SELECT count(*), min(ts), max(ts) FROM events", [], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?))
        })?;
    let keyring = Keyring::plain();
    let quarantine = QuarantineSql::new(tx, &keyring).counts()?;
    let dropped = pairs(
        tx,
        "SELECT name, value FROM counters WHERE name LIKE 'dropped.%'",
    )?
    .into_iter()
    .map(|(k, v)| (k.trim_start_matches("dropped.").to_string(), v))
    .collect();
    let consent = pairs_text(tx, "SELECT name, value FROM meta WHERE name = 'consent'")?
        .values()
        .next()
        .and_then(|v| crate::Consent::from_name(v));
    let pending_critical: i64 =
        tx.query_row("SELECT count(*) FROM events WHERE lane = 0", [], |r| {
            r.get(0)
        })?;
    Ok(StoreStatus {
        schema_version: version,
        consent,
        pending_critical: pending_critical as u64,
        pending: pending as u64,
        bytes: crate::queue::disk_usage(path),
        oldest_ms,
        newest_ms,
        quarantine,
        dropped,
    })
}

fn pairs_text(conn: &Connection, sql: &str) -> Result<BTreeMap<String, String>> {
    let mut stmt = conn.prepare(sql)?;
    let rows = stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?;
    Ok(rows.collect::<rusqlite::Result<_>>()?)
}

fn pairs(conn: &Connection, sql: &str) -> Result<BTreeMap<String, u64>> {
    let mut stmt = conn.prepare(sql)?;
    let rows = stmt.query_map([], |r| {
        Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)? as u64))
    })?;
    Ok(rows.collect::<rusqlite::Result<_>>()?)
}

/// A store opened as its owner, for quarantine triage while no spool is running on it.
pub struct StoreAdmin {
    queue: Queue,
    path: PathBuf,
}

impl StoreAdmin {
    /// Opens (or creates) the store and takes its owner lock; refused while a spool holds it,
    /// and refused naming the key id when `keys` (the store's `encryption_keys`, empty for a
    /// plain store) lack or mismatch one its rows need.
    /// `max_disk_bytes` is only used for writes, and redrive writes nothing new in size.
    pub fn open(path: &Path, keys: &EncryptionKeys) -> Result<StoreAdmin> {
        let mut defaults = crate::Config::new("http://127.0.0.1/unused");
        defaults.encryption_keys = keys.clone();
        let opened = Queue::open(
            path,
            crate::config::DEFAULT_MAX_DISK_BYTES,
            chrono::Utc::now().timestamp_millis(),
            QueueParams::of(&defaults),
            Default::default(),
            Default::default(),
        )?;
        Ok(StoreAdmin {
            queue: opened.queue,
            path: path.to_path_buf(),
        })
    }

    pub fn status(&self) -> Result<StoreStatus> {
        inspect(&self.path)
    }

    /// Quarantined events, oldest first.
    pub fn list(&self, filter: &ListFilter) -> Result<Vec<QuarantinedEvent>> {
        self.queue.quarantine_list(filter)
    }

    pub fn get(&self, event_id: &str) -> Result<Option<QuarantinedEvent>> {
        self.queue.quarantine_get(event_id)
    }

    /// Moves the selected events back to the queue with their original `event_id`; the next
    /// spool (or `eventspool flush`) on this store delivers them. Returns how many.
    pub fn redrive(&self, selector: &Selector) -> Result<u64> {
        let mut next = self.queue.store_next_seq()?;
        let now_ms = chrono::Utc::now().timestamp_millis();
        self.queue.redrive(selector, now_ms, || {
            next += 1;
            next - 1
        })
    }

    /// Deletes the selected quarantined events for good. Returns how many.
    pub fn purge(&self, selector: &Selector) -> Result<u64> {
        self.queue.quarantine_purge(selector)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inspect_reports_a_missing_file_and_an_empty_store() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("events.db");
        assert!(matches!(inspect(&path), Err(Error::NotFound(_))));
        let admin = StoreAdmin::open(&path, &EncryptionKeys::default()).unwrap();
        let status = admin.status().unwrap();
        assert_eq!(status.pending, 0);
        assert_eq!(status.oldest_ms, None);
        assert!(status.bytes > 0);
        // The owner lock is held, yet a read-only look still works.
        assert_eq!(inspect(&path).unwrap().pending, 0);
        assert!(
            StoreAdmin::open(&path, &EncryptionKeys::default()).is_err(),
            "a second owner must be refused"
        );
    }
}
