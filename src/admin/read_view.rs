//! What the read-only tools read from a store an earlier release wrote.
//!
//! Its tables are not today's (schema 1 has no `key_id`, no `lane`, no `meta`; later ones lack
//! other columns), and a reader must not upgrade the file: that is the owner's step, taken at
//! the next open, and an operator's look must leave the store exactly as the device wrote it.
//! So the reader copies the store into memory (SQLite's backup, one consistent snapshot that
//! includes the WAL) and runs the same upgrade steps on the copy (`schema::migrate`, the one
//! home of the schema). Every reader then runs today's SQL: no second description of older
//! schemas to keep in step, and the figures are the ones the store will show once upgraded.
//!
//! The copy costs memory of the store's size, once per command; a store is capped by
//! `max_disk_bytes` (10 MiB by default), and only a store no spool of this release has opened
//! yet takes this path.

use std::path::Path;
use std::time::{Duration, Instant};

use rusqlite::Connection;
use rusqlite::backup::{Backup, StepResult};

use super::INSPECT_BUSY_TIMEOUT;
use crate::error::{Error, Result};
use crate::queue::schema;

/// Between tries of a copy a writer's lock refused.
const BUSY_PAUSE: Duration = Duration::from_millis(10);

/// A copy in memory of the store `source` reads, upgraded to this release's schema, and the
/// version the copied snapshot held. The file is only read.
pub(super) fn upgraded_copy(path: &Path, source: &Connection) -> Result<(Connection, i64)> {
    let failed = |what: &str, e: rusqlite::Error| {
        Error::Storage(format!("cannot read {} ({what}): {e}", path.display()))
    };
    let mut copy = Connection::open_in_memory().map_err(|e| failed("a copy in memory", e))?;
    {
        let backup = Backup::new(source, &mut copy).map_err(|e| failed("copying it", e))?;
        let deadline = Instant::now() + INSPECT_BUSY_TIMEOUT;
        // -1: every page in one step, so the copy is one snapshot of the store.
        loop {
            match backup.step(-1).map_err(|e| failed("copying it", e))? {
                StepResult::Done => break,
                _ if Instant::now() < deadline => std::thread::sleep(BUSY_PAUSE),
                _ => {
                    return Err(Error::Storage(format!(
                        "cannot read {}: busy for {INSPECT_BUSY_TIMEOUT:?} (a writer holds it)",
                        path.display()
                    )));
                }
            }
        }
    }
    // The snapshot's own version: a spool may have upgraded the file since the caller looked.
    let version = match schema::inspect(&copy).map_err(|e| failed("copying it", e))? {
        Ok(version) => version,
        Err(unusable) => return Err(Error::Storage(format!("{}: {unusable}", path.display()))),
    };
    // The data steps are left out: they re-seal queued bodies (7: the timestamp and lane join
    // the associated data), which the read-only tools never open.
    let mut no_data_steps = |_: i64, _: &rusqlite::Transaction<'_>| Ok(());
    schema::migrate(
        &mut copy,
        version,
        chrono::Utc::now().timestamp_millis(),
        &mut no_data_steps,
    )
    .map_err(|e| {
        failed(
            &format!("schema version {version}, upgrading a copy in memory"),
            e,
        )
    })?;
    Ok((copy, version))
}
