//! The store's part of the fleet loop (src/fleet): the client reports that wait for a 2xx (its
//! small named values, the install id and the directives in force, live in the `meta` table
//! through [`Store::meta`]). The tables are in [`super::schema`].

use rusqlite::params;

use super::Store;
use crate::error::{Error, Result};
use crate::sync::lock;

impl Store {
    /// The reports no 2xx has covered yet, oldest first.
    pub fn reports(&self) -> Result<Vec<(u64, String)>> {
        let conn = self.conn();
        let mut stmt = conn.prepare("SELECT id, body FROM reports ORDER BY id")?;
        let mut rows = stmt
            .query_map([], |r| Ok((r.get::<_, i64>(0)? as u64, r.get(1)?)))?
            .collect::<rusqlite::Result<Vec<_>>>()?;
        let covered = lock(&self.owed_reports);
        rows.retain(|(id, _)| !covered.contains(id));
        Ok(rows)
    }

    /// Keeps a report until a 2xx covers it, and the next id, in one transaction: an id is never
    /// given to two reports, even across a crash. A report that would take the database past
    /// its share of `max_disk_bytes` is refused, not kept at the cost of a queued event: the
    /// caller keeps its counts for the next report (reports pile up while the network is down,
    /// one per request, on a store the backlog has filled to its share).
    pub fn report_add(&self, id: u64, body: &str) -> Result<()> {
        let mut conn = self.conn();
        let conn = &mut *conn;
        let added = self.beside_the_queue(conn, || -> Result<()> {
            let tx = conn.unchecked_transaction()?;
            tx.prepare_cached("INSERT OR REPLACE INTO reports (id, body) VALUES (?1, ?2)")?
                .execute(params![id as i64, body])?;
            super::write_meta(&tx, "next_report", &(id + 1).to_string())?;
            let over = super::db_excess(&tx, self.page_size, self.budget.db_bytes)?;
            if over > 0 {
                drop(tx);
                return Err(Error::Storage(format!(
                    "no room for a client report: the database would pass its share of max_disk_bytes ({} bytes) by {over} bytes",
                    self.budget.db_bytes
                )));
            }
            tx.commit()?;
            Ok(())
        });
        self.checked(conn, added)?;
        self.checkpoint_if_needed(conn);
        Ok(())
    }

    /// Forgets one of the small named values of the `meta` table (the directive in force, when
    /// the app ends it).
    pub fn delete_meta(&self, name: &str) -> Result<()> {
        let conn = self.conn();
        let deleted = conn.execute("DELETE FROM meta WHERE name = ?1", [name]);
        self.checked(&conn, deleted.map_err(Error::from))?;
        self.checkpoint_if_needed(&conn);
        Ok(())
    }

    /// Forgets reports a 2xx covered: no longer read, and deleted with the delivered rows by
    /// the next [`Store::settle`] (beside the next request, before the worker waits, at
    /// close), not by a commit of their own on the way to the next request.
    pub fn reports_delete(&self, ids: &[u64]) -> Result<()> {
        lock(&self.owed_reports).extend_from_slice(ids);
        Ok(())
    }
}
