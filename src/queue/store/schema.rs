//! The SQL schema, its version, and the upgrade steps: the one place that says what is on disk.
//!
//! `PRAGMA user_version` holds the version. Each entry of [`MIGRATIONS`] upgrades from its index
//! to index + 1, so a store written by any earlier release opens and is upgraded in place. A store
//! of a newer version, or one that is not ours, is never modified: the opener moves it aside.
//!
//! The rule (docs/decisions/0021): every change to what a row means, not only to the tables,
//! bumps the version, with a step here (SQL, and where the rows themselves must be rewritten, a
//! data step the store runs in the same transaction). A build older than the store then moves
//! it aside instead of misreading it; a build of the same version never finds rows it does not
//! understand.

use rusqlite::{Connection, OptionalExtension, Transaction};

/// The version this build writes.
pub const SCHEMA_VERSION: i64 = 8;

/// Stands, in a step, for the wall clock at the upgrade (ms since the epoch, UTC): [`migrate`]
/// writes it in as an integer literal before the step runs.
const UPGRADE_MS: &str = ":upgrade_ms";

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
        reason          TEXT NOT NULL,     -- rejected | bad_request | too_large (v2: max_sends)
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
    // 1 → 2: the per-event record. Age is counted from acceptance, not from the event's own
    // timestamp (an importer's old timestamps must not expire at once), and each event counts the
    // requests that carried it (`X-Eventspool-Attempt`, `max_event_sends`). Version 1 did not
    // record acceptance: its rows get the upgrade time, so an upgrade never expires an event.
    "ALTER TABLE events ADD COLUMN accepted INTEGER NOT NULL DEFAULT 0;  -- ms, track() or redrive
    ALTER TABLE events ADD COLUMN sends INTEGER NOT NULL DEFAULT 0;     -- requests that carried it
    -- Of those, the ones no answer came back for: counted before the request goes out, taken
    -- back when an answer (any HTTP status) or a refused connection shows it had an effect or
    -- none, so a crash mid-request counts as unanswered.
    ALTER TABLE events ADD COLUMN unanswered INTEGER NOT NULL DEFAULT 0;
    UPDATE events SET accepted = :upgrade_ms;
    CREATE INDEX events_by_acceptance ON events(accepted);
    -- Kept so a redriven event still tells the collector it was sent before; reason gains
    -- max_sends (no answer after max_event_sends requests).
    ALTER TABLE quarantine ADD COLUMN sends INTEGER NOT NULL DEFAULT 0;",
    // 2 → 3: the critical lane, the store's own named values, and the client reports.
    // - `lane` orders delivery before the timestamp (0 critical, 1 normal: docs/critical-lane.md);
    //   the disk cap evicts lane 1 first. Earlier rows are all normal. Every ordered read now
    //   starts with the lane, so the (ts, seq) index gives way to (lane, ts, seq).
    // - `meta` holds small values that must outlive a restart, one row per name: what the app
    //   decided (`consent`: README §Consent) and the fleet loop's install id, directives in force
    //   and ledger baseline (src/fleet).
    // - A client report waits in `reports` until a 2xx covers it, so it survives restarts and is
    //   resent with the same id.
    "ALTER TABLE events ADD COLUMN lane INTEGER NOT NULL DEFAULT 1;  -- 0 critical, 1 normal
    DROP INDEX events_by_delivery_order;
    CREATE INDEX events_by_lane_order ON events(lane, ts, seq);
    CREATE TABLE meta (
        name  TEXT PRIMARY KEY,            -- consent | install_id | directives | applied | ...
        value TEXT NOT NULL
    );
    CREATE TABLE reports (
        id   INTEGER PRIMARY KEY,          -- the report's id, per install, increasing
        body TEXT NOT NULL                 -- its wire JSON, exactly as it is resent
    );",
    // 3 → 4: encryption at rest (crypto.rs). Each row records the key that sealed its payload
    // columns (events.body; quarantine body, reason, detail): 0 is plain text, which is what
    // every row of an older store is, and stays readable as such. `keys` holds, per key id,
    // a value sealed with that key, so a wrong or missing key is refused at open by id.
    ENCRYPTION_STEP,
    // 4 → 5: expiry no longer reads an index on `accepted`. Every commit wrote a page of it (a
    // one-row commit wrote three pages instead of two), for a read that finds nothing almost
    // always: the store now keeps a lower bound of `accepted` in memory and scans the table only
    // when the bound says an event may be due (`Store::expire`).
    "DROP INDEX events_by_acceptance;",
    // 5 → 6: a row written in delivery order skips the ordering index (frontier.rs): the index
    // is partial, over the rows that are not (`in_order = 0`: every older row, critical and
    // redriven events, an importer's timestamps). Ordered reads merge the in-order rows, read
    // by seq, with the indexed ones. Writing the index was about a fifth of a spill.
    "ALTER TABLE events ADD COLUMN in_order INTEGER NOT NULL DEFAULT 0;  -- 1: see frontier.rs
    DROP INDEX events_by_lane_order;
    CREATE INDEX events_out_of_order ON events(lane, ts, seq) WHERE in_order = 0;",
    // 6 → 7: what rows mean changed under version 6 without a bump, which a build from before
    // the changes would misread; from 7 on such a build moves the store aside instead.
    // - A queued body may leave out its head (`{"event_id":…,"timestamp":…,`), put back from
    //   the `event_id` and `ts` columns (event.rs `wire_tail`); an older build would send it
    //   without them.
    // - `in_order = 1` rows skip the ordering index (step 5 → 6 added the column, later builds
    //   rely on it for order).
    // - A sealed body's associated data names its timestamp and lane too (the store's
    //   `body_ad`): the data step seals every sealed body again.
    // - The queued count a clean close leaves (`queue_rows_at_close`) is guarded from now on
    //   ([`guard_saved_count`]); one saved under 6 may have been left stale by a build that
    //   did not know it, so it goes and the next open counts the table.
    "DELETE FROM meta WHERE name = 'queue_rows_at_close';",
    // 7 → 8: a sealed value may be AES-256-GCM, marked by bit 62 of its nonce's count
    // (crypto.rs, `Aead`); a build of 7 would try it as XChaCha20-Poly1305, fail, and quarantine
    // the event as undecryptable. The tables and the rows already written stay as they are.
    "",
];

/// Triggers that take the queued count saved at a clean close out as soon as any writer adds
/// or deletes a queued row: a build or tool that does not know the count (and so does not
/// keep it) makes the next open count the table instead of trusting it. Created with the
/// count, dropped by the open that takes it ([`unguard_saved_count`]), so they never cost the
/// store's own writes anything.
pub fn guard_saved_count(name: &str) -> String {
    format!(
        "CREATE TRIGGER IF NOT EXISTS saved_count_void_on_insert AFTER INSERT ON events
             BEGIN DELETE FROM meta WHERE name = '{name}'; END;
         CREATE TRIGGER IF NOT EXISTS saved_count_void_on_delete AFTER DELETE ON events
             BEGIN DELETE FROM meta WHERE name = '{name}'; END;"
    )
}

/// Drops what [`guard_saved_count`] created.
pub const UNGUARD_SAVED_COUNT: &str = "DROP TRIGGER IF EXISTS saved_count_void_on_insert;
     DROP TRIGGER IF EXISTS saved_count_void_on_delete;";

/// The 3 → 4 step on its own, so it can move to another index when steps are renumbered.
const ENCRYPTION_STEP: &str = "ALTER TABLE events ADD COLUMN key_id INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE quarantine ADD COLUMN key_id INTEGER NOT NULL DEFAULT 0;
    CREATE TABLE keys (
        key_id INTEGER PRIMARY KEY,
        check_record BLOB NOT NULL         -- a known text sealed with the key (crypto.rs)
    );";

/// Main shipped two schemas under version 3. The fleet merge (c4aaebf, shipped to 94994ab)
/// wrote a `fleet` table of small values and no lane; the consent merge (d46c3eb) rewrote the
/// 2 → 3 step into today's: the `lane` column, its index, and the same values in `meta` beside
/// consent. A store of the first form gets what the second added before the steps after 3 run.
/// It is known by its tables, not its number: a release of versions 4 and 5 ran their steps on
/// such a store before 5 → 6 failed on the missing lane index, leaving it at 5.
const FLEET_FORM_TO_3: &str = "ALTER TABLE events ADD COLUMN lane INTEGER NOT NULL DEFAULT 1;
    DROP INDEX events_by_delivery_order;
    CREATE INDEX events_by_lane_order ON events(lane, ts, seq);
    ALTER TABLE fleet RENAME TO meta;";

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
/// How long a statement waits for another connection's lock before it fails as busy.
pub const BUSY_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// How often the store syncs: `NORMAL`, in WAL mode at checkpoints only. A commit survives the
/// process dying at once; a power cut can take back what was committed since the last
/// checkpoint (never tear it: the WAL's checksums end it at a whole transaction). The writes
/// that must survive that too are committed [`SYNCED`] ([`super::Store::set_meta_synced`]).
pub const SYNCHRONOUS: &str = "NORMAL";
/// The WAL synced with each commit: for the records a power cut must not take back.
pub const SYNCED: &str = "FULL";

pub fn configure(conn: &Connection, wal_limit_bytes: u64) -> rusqlite::Result<()> {
    conn.busy_timeout(BUSY_TIMEOUT)?;
    // Set only when it is not already: setting it writes the database header (a commit) even
    // when nothing changes, and an open refused for a wrong key must write nothing.
    let auto_vacuum: i64 = conn.pragma_query_value(None, "auto_vacuum", |r| r.get(0))?;
    if auto_vacuum != 2 {
        conn.pragma_update(None, "auto_vacuum", "INCREMENTAL")?;
    }
    conn.query_row("PRAGMA journal_mode = WAL", [], |_| Ok(()))?;
    conn.pragma_update(None, "synchronous", SYNCHRONOUS)?;
    // Every delete and update zeroes what it frees inside the pages it writes anyway (FAST:
    // no page is written only to be wiped). Without it a row rewritten or deleted earlier (a
    // send count, an acknowledged event) leaves its old bytes in the page's free space, and a
    // later denial, which wipes what it deletes itself, cannot reach them (README §Consent).
    conn.pragma_update(None, "secure_delete", "FAST")?;
    conn.query_row(
        &format!("PRAGMA journal_size_limit = {wal_limit_bytes}"),
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

/// A step that rewrites rows, run after the SQL of the step to the version it is given, in the
/// same transaction.
pub type DataStep<'a> = &'a mut dyn FnMut(i64, &Transaction<'_>) -> rusqlite::Result<()>;

/// Brings the schema from `version` (what [`inspect`] found) to [`SCHEMA_VERSION`]; `wall_ms` is
/// the time of the upgrade. Each step is one transaction.
pub fn migrate(
    conn: &mut Connection,
    version: i64,
    wall_ms: i64,
    data: DataStep<'_>,
) -> rusqlite::Result<()> {
    if (3..=5).contains(&version) && has_table(conn, "fleet")? {
        let tx = conn.transaction()?;
        tx.execute_batch(FLEET_FORM_TO_3)?;
        tx.commit()?;
    }
    for (from, step) in MIGRATIONS.iter().enumerate().skip(version as usize) {
        let to = from as i64 + 1;
        let tx = conn.transaction()?;
        tx.execute_batch(&step.replace(UPGRADE_MS, &wall_ms.to_string()))?;
        data(to, &tx)?;
        tx.pragma_update(None, "user_version", to)?;
        tx.commit()?;
    }
    Ok(())
}

fn has_table(conn: &Connection, name: &str) -> rusqlite::Result<bool> {
    conn.query_row(
        "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = ?1",
        [name],
        |r| r.get::<_, i64>(0),
    )
    .map(|n| n > 0)
}

/// A file as version `version` wrote it (its SQL, its `user_version`), for upgrade tests.
#[cfg(test)]
pub fn create_at(conn: &Connection, version: i64) {
    for step in &MIGRATIONS[..version as usize] {
        conn.execute_batch(&step.replace(UPGRADE_MS, "5")).unwrap();
    }
    conn.pragma_update(None, "user_version", version).unwrap();
}

/// A [`DataStep`] for stores without sealed rows (tests of the SQL alone).
#[cfg(test)]
pub fn no_data(_: i64, _: &Transaction<'_>) -> rusqlite::Result<()> {
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A file as version 1 wrote it (its SQL, its `user_version`), with one queued and one
    /// quarantined event.
    fn v1_file(path: &std::path::Path) {
        let conn = Connection::open(path).unwrap();
        conn.execute_batch(MIGRATIONS[0]).unwrap();
        conn.pragma_update(None, "user_version", 1).unwrap();
        conn.execute(
            "INSERT INTO events (seq, ts, event_id, body) VALUES (7, 1000, 'id-1', '{\"a\":1}')",
            [],
        )
        .unwrap();
        conn.execute(
            "INSERT INTO quarantine (event_id, ts, body, reason, detail, status, attempts,
                 first_failed_ms, last_failed_ms, quarantined_seq)
             VALUES ('id-2', 2000, '{}', 'rejected', 'no', 200, 1, 5, 5, 1)",
            [],
        )
        .unwrap();
        conn.execute("INSERT INTO counters VALUES ('dropped.disk_cap', 3)", [])
            .unwrap();
    }

    /// A file as version 2 wrote it, with one queued event: the upgrade adds the fleet tables
    /// and leaves the queue as it was.
    #[test]
    fn a_version_2_store_is_upgraded_in_place_and_gains_the_fleet_tables() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("v2.db");
        {
            let conn = Connection::open(&path).unwrap();
            conn.execute_batch(MIGRATIONS[0]).unwrap();
            conn.execute_batch(&MIGRATIONS[1].replace(UPGRADE_MS, "5"))
                .unwrap();
            conn.pragma_update(None, "user_version", 2).unwrap();
            conn.execute(
                "INSERT INTO events (seq, ts, event_id, body, accepted, sends, unanswered)
                 VALUES (9, 1000, 'id-1', '{}', 77, 2, 1)",
                [],
            )
            .unwrap();
        }
        let mut conn = Connection::open(&path).unwrap();
        let version = inspect(&conn).unwrap().unwrap();
        assert_eq!(version, 2);
        migrate(&mut conn, version, 1_764_417_600_000, &mut no_data).unwrap();
        let v: i64 = conn
            .pragma_query_value(None, "user_version", |r| r.get(0))
            .unwrap();
        assert_eq!(v, SCHEMA_VERSION);
        let row: (i64, i64, i64, i64) = conn
            .query_row(
                "SELECT seq, accepted, sends, unanswered FROM events",
                [],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)),
            )
            .unwrap();
        assert_eq!(row, (9, 77, 2, 1), "the queued event is untouched");
        conn.execute("INSERT INTO meta VALUES ('install_id', 'x')", [])
            .unwrap();
        conn.execute("INSERT INTO reports VALUES (1, '{}')", [])
            .unwrap();
        let n: i64 = conn
            .query_row("SELECT count(*) FROM reports", [], |r| r.get(0))
            .unwrap();
        assert_eq!(n, 1);
    }

    #[test]
    fn a_version_1_store_is_upgraded_in_place_and_keeps_its_rows() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("v1.db");
        v1_file(&path);
        let mut conn = Connection::open(&path).unwrap();
        let version = inspect(&conn).unwrap().unwrap();
        assert_eq!(version, 1);
        migrate(&mut conn, version, 1_764_417_600_000, &mut no_data).unwrap();
        let v: i64 = conn
            .pragma_query_value(None, "user_version", |r| r.get(0))
            .unwrap();
        assert_eq!(v, SCHEMA_VERSION);
        let row: (i64, i64, String, String, i64, i64, i64) = conn
            .query_row(
                "SELECT seq, ts, event_id, body, accepted, sends, unanswered FROM events",
                [],
                |r| {
                    Ok((
                        r.get(0)?,
                        r.get(1)?,
                        r.get(2)?,
                        r.get(3)?,
                        r.get(4)?,
                        r.get(5)?,
                        r.get(6)?,
                    ))
                },
            )
            .unwrap();
        assert_eq!(
            row,
            (
                7,
                1000,
                "id-1".into(),
                r#"{"a":1}"#.into(),
                1_764_417_600_000,
                0,
                0
            ),
            "the row survives; its acceptance is the upgrade time"
        );
        let q: (String, String, i64) = conn
            .query_row("SELECT event_id, reason, sends FROM quarantine", [], |r| {
                Ok((r.get(0)?, r.get(1)?, r.get(2)?))
            })
            .unwrap();
        assert_eq!(q, ("id-2".into(), "rejected".into(), 0));
        let n: i64 = conn
            .query_row("SELECT value FROM counters", [], |r| r.get(0))
            .unwrap();
        assert_eq!(n, 3);
        let lane: i64 = conn
            .query_row("SELECT lane FROM events", [], |r| r.get(0))
            .unwrap();
        assert_eq!(lane, 1, "an old row is in the normal lane");
        let meta: i64 = conn
            .query_row("SELECT count(*) FROM meta", [], |r| r.get(0))
            .unwrap();
        assert_eq!(meta, 0, "no consent recorded by an upgrade");
        // A second open finds nothing to do.
        assert_eq!(inspect(&conn).unwrap().unwrap(), SCHEMA_VERSION);
        migrate(&mut conn, SCHEMA_VERSION, 0, &mut no_data).unwrap();
    }

    /// The fleet form of version 3, as the 94994ab command wrote it (tests/fixtures/stores), and
    /// the same file left at version 5 by a release whose 5 → 6 step failed on it: both end
    /// at this version with the lane column and the fleet values in `meta`.
    #[test]
    fn a_store_of_the_fleet_form_of_version_3_is_upgraded_with_its_values() {
        let fixture = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/stores/v3-fleet-94994ab/store.db");
        for left_at in [3, 5] {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("fleet.db");
            std::fs::copy(&fixture, &path).unwrap();
            let mut conn = Connection::open(&path).unwrap();
            let install_id: String = conn
                .query_row(
                    "SELECT value FROM fleet WHERE name = 'install_id'",
                    [],
                    |r| r.get(0),
                )
                .unwrap();
            for step in 3..left_at {
                conn.execute_batch(MIGRATIONS[step as usize]).unwrap();
            }
            conn.pragma_update(None, "user_version", left_at).unwrap();
            let version = inspect(&conn).unwrap().unwrap();
            assert_eq!(version, left_at);
            migrate(&mut conn, version, 1_764_417_600_000, &mut no_data).unwrap();
            assert_eq!(inspect(&conn).unwrap().unwrap(), SCHEMA_VERSION);
            let kept: String = conn
                .query_row(
                    "SELECT value FROM meta WHERE name = 'install_id'",
                    [],
                    |r| r.get(0),
                )
                .unwrap();
            assert_eq!(kept, install_id, "left at {left_at}");
            let lanes: Vec<i64> = conn
                .prepare("SELECT DISTINCT lane FROM events")
                .unwrap()
                .query_map([], |r| r.get(0))
                .unwrap()
                .map(|r| r.unwrap())
                .collect();
            assert_eq!(
                lanes,
                [1],
                "left at {left_at}: every old row is in the normal lane"
            );
            assert!(!has_table(&conn, "fleet").unwrap());
        }
    }

    /// The same file through the store's opener: the queued event comes out for sending with
    /// its id and body, young (accepted at the upgrade) and never sent.
    #[test]
    fn a_version_1_store_opens_and_its_events_come_out_for_sending() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("v1.db");
        {
            let conn = Connection::open(&path).unwrap();
            conn.execute_batch(MIGRATIONS[0]).unwrap();
            conn.pragma_update(None, "user_version", 1).unwrap();
            conn.execute(
                "INSERT INTO events (seq, ts, event_id, body)
                 VALUES (3, 1000, '0193a0b2-7c4e-7000-8000-000000000001', '{\"name\":\"a\"}')",
                [],
            )
            .unwrap();
        }
        let opened = crate::queue::store::Store::open(
            &path,
            1 << 20,
            5_000,
            crate::crypto::Keyring::plain(),
        )
        .unwrap();
        assert!(
            opened.recovered.is_none(),
            "a v1 file is ours, not moved aside"
        );
        let store = opened.store;
        assert_eq!(store.len(), 1);
        let events = store.oldest(10).unwrap();
        assert_eq!(events.len(), 1);
        let e = &events[0];
        assert_eq!(
            (e.seq, e.ts_ms, e.id.to_string().as_str(), &*e.json),
            (
                3,
                1000,
                "0193a0b2-7c4e-7000-8000-000000000001",
                r#"{"name":"a"}"#
            )
        );
        assert_eq!((e.accepted_ms, e.sends, e.unanswered), (5_000, 0, 0));
        assert_eq!(
            store.expire(4_999).unwrap().len(),
            0,
            "not expired by its old ts"
        );
    }
}
