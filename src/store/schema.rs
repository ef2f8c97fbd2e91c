//! The SQL schema, its version, and the upgrade steps: the one place that says what is on disk.
//!
//! `PRAGMA user_version` holds the version. Each entry of [`MIGRATIONS`] upgrades from its index
//! to index + 1, so a store written by any earlier release opens and is upgraded in place. A store
//! of a newer version, or one that is not ours, is never modified: the opener moves it aside.

use rusqlite::{Connection, OptionalExtension};

/// The version this build writes.
pub const SCHEMA_VERSION: i64 = 1;

/// Upgrade steps: `MIGRATIONS[v]` takes a store from version `v` to `v + 1`.
const MIGRATIONS: &[&str] = &[
    // 0 → 1: the queue, the quarantine and persistent counters.
    "CREATE TABLE events (
        seq      INTEGER PRIMARY KEY,  -- track() order; breaks timestamp ties
        ts       INTEGER NOT NULL,     -- event timestamp, ms since the epoch, UTC
        event_id TEXT NOT NULL,
        body     TEXT NOT NULL         -- the event's wire JSON, exactly as it is sent
    );
    CREATE INDEX events_by_delivery_order ON events(ts, seq);
    CREATE TABLE quarantine (
        event_id        TEXT PRIMARY KEY,
        ts              INTEGER NOT NULL,
        body            TEXT NOT NULL,
        reason          TEXT NOT NULL,     -- rejected | bad_request | too_large
        detail          TEXT NOT NULL,     -- the collector's words, at most 1 KiB of its body
        status          INTEGER,
        attempts        INTEGER NOT NULL,
        first_failed_ms INTEGER NOT NULL,
        last_failed_ms  INTEGER NOT NULL,
        quarantined_seq INTEGER NOT NULL   -- insertion order: the cap evicts the oldest first
    );
    CREATE INDEX quarantine_by_age ON quarantine(quarantined_seq);
    CREATE INDEX quarantine_by_reason ON quarantine(reason);
    CREATE TABLE counters (
        name  TEXT PRIMARY KEY,            -- dropped.disk_cap, dropped.quarantine_cap, ...
        value INTEGER NOT NULL
    );",
];

/// Why an existing file cannot be used as a store.
#[derive(Debug)]
pub enum Unusable {
    /// Written by a newer release: opening it would risk its data.
    NewerVersion(i64),
    /// A valid SQLite file holding someone else's tables.
    Foreign,
}

impl std::fmt::Display for Unusable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Unusable::NewerVersion(v) => {
                write!(
                    f,
                    "schema version {v} is newer than this release understands ({SCHEMA_VERSION})"
                )
            }
            Unusable::Foreign => f.write_str("the file is an SQLite database of another schema"),
        }
    }
}

/// Settings that must hold for every connection. `auto_vacuum` only takes effect before the first
/// table exists, which is why it comes before the migrations; it lets the store hand freed pages
/// back to the file system so the on-disk size can honour `max_disk_bytes`.
pub fn configure(
    conn: &Connection,
    wal_limit_bytes: u64,
    autocheckpoint_pages: u64,
) -> rusqlite::Result<()> {
    conn.busy_timeout(std::time::Duration::from_secs(5))?;
    conn.pragma_update(None, "auto_vacuum", "INCREMENTAL")?;
    conn.query_row("PRAGMA journal_mode = WAL", [], |_| Ok(()))?;
    conn.pragma_update(None, "synchronous", "NORMAL")?;
    conn.query_row(
        &format!("PRAGMA journal_size_limit = {wal_limit_bytes}"),
        [],
        |_| Ok(()),
    )?;
    conn.query_row(
        &format!("PRAGMA wal_autocheckpoint = {autocheckpoint_pages}"),
        [],
        |_| Ok(()),
    )?;
    Ok(())
}

/// Says whether this file is ours to use, reading only: it must run before [`configure`], whose
/// `journal_mode = WAL` rewrites the header of a file that may belong to someone else.
pub fn inspect(conn: &Connection) -> Result<Result<i64, Unusable>, rusqlite::Error> {
    let version: i64 = conn.pragma_query_value(None, "user_version", |row| row.get(0))?;
    if version > SCHEMA_VERSION {
        return Ok(Err(Unusable::NewerVersion(version)));
    }
    if version == 0 {
        let foreign: Option<String> = conn
            .query_row(
                "SELECT name FROM sqlite_master WHERE type = 'table' LIMIT 1",
                [],
                |r| r.get(0),
            )
            .optional()?;
        if foreign.is_some() {
            return Ok(Err(Unusable::Foreign));
        }
    }
    Ok(Ok(version))
}

/// Brings the schema from `version` (what [`inspect`] found) to [`SCHEMA_VERSION`].
pub fn migrate(conn: &mut Connection, version: i64) -> rusqlite::Result<()> {
    for (from, step) in MIGRATIONS.iter().enumerate().skip(version as usize) {
        let tx = conn.transaction()?;
        tx.execute_batch(step)?;
        tx.pragma_update(None, "user_version", from as i64 + 1)?;
        tx.commit()?;
    }
    Ok(())
}
