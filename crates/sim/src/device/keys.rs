//! Encryption at rest on a device (docs/encryption.md): whether its store seals, the keys the
//! app supplies and rotates, a row damaged on disk while the process is down, and the check
//! that a sealed store never writes an event's payload in plain text.

use eventspool::EncryptionKeys;

use super::{Device, Finding};

/// How a device's app treats encryption over the run, drawn from the keys stream of its seed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    /// Never supplies keys.
    Plain,
    /// Seals from the first open.
    Sealed,
    /// Stores in plain text until its first [`crate::plan::Step::Rekey`] adds a key.
    AddsKey,
}

pub(super) struct Sealing {
    kind: Kind,
    /// The keys of `encryption_keys`, the current one first.
    keys: Vec<(u32, [u8; 32])>,
    /// Events from this index on were tracked while the store sealed: none of their payload
    /// may be in its files in plain text.
    from: Option<usize>,
    seed: u64,
    /// Which row a damage hits.
    rng: fastrand::Rng,
    /// Rows damaged before (by event id): damaged again the same way, a row would open again.
    damaged: std::collections::HashSet<String>,
}

impl Sealing {
    pub(super) fn draw(seed: u64) -> Sealing {
        let mut rng = fastrand::Rng::with_seed(seed ^ 0x6b65_795f_6b69_6e64);
        let kind = match rng.u32(0..4) {
            0 => Kind::Sealed,
            1 => Kind::AddsKey,
            _ => Kind::Plain,
        };
        let mut sealing = Sealing {
            kind,
            keys: Vec::new(),
            from: None,
            seed,
            rng,
            damaged: Default::default(),
        };
        if kind == Kind::Sealed {
            sealing.add_key(0);
        }
        sealing
    }

    pub(super) fn keys(&self) -> EncryptionKeys {
        EncryptionKeys::new(self.keys.iter().copied())
    }

    pub(super) fn sealed(&self) -> bool {
        !self.keys.is_empty()
    }

    /// A new current key, the old ones kept (rows sealed with them stay readable).
    fn add_key(&mut self, tracked: usize) {
        let id = self.keys.first().map_or(1, |(id, _)| id + 1);
        let mut r = fastrand::Rng::with_seed(self.seed ^ u64::from(id));
        let key = std::array::from_fn(|_| r.u8(..));
        self.keys.insert(0, (id, key));
        self.from.get_or_insert(tracked);
    }
}

impl Device {
    /// [`crate::plan::Step::Rekey`]: a release that rotates the key (or adds the first one)
    /// restarts the app with it.
    pub(super) fn rekey(&mut self) -> Result<(), Finding> {
        if self.sealing.kind == Kind::Plain {
            return Ok(());
        }
        self.sealing.add_key(self.events.len());
        self.config.encryption_keys = self.sealing.keys();
        self.trace.line(
            self.now(),
            format_args!(
                "encryption_keys now {:?}",
                self.config.encryption_keys.ids()
            ),
        );
        self.restart()
    }

    /// [`crate::plan::Step::Damage`]: the process dies, and one byte of the body of a sealed
    /// row, queued or dead letter, changes on disk before it starts again.
    pub(super) fn damage(&mut self) -> Result<(), Finding> {
        if !self.sealing.sealed() {
            return Ok(());
        }
        self.die()?;
        match self.damage_a_row() {
            Ok(Some((table, id))) => {
                // By index: an event id has random bits, the trace must not.
                let idx = self.by_id.get(&id).copied();
                self.trace.line(
                    self.now(),
                    format_args!("damaged a row of {table}: event {idx:?}"),
                );
                self.figures.damaged += 1;
                if let Some(idx) = idx {
                    self.events[idx].damaged = true;
                }
            }
            Ok(None) => {}
            Err(e) => return Err(format!("could not damage a row of the store: {e}")),
        }
        self.open();
        Ok(())
    }

    /// Changes one byte in the middle of the body of one sealed row, queued or dead letter,
    /// picked by the device's own generator (queued rows in seq order, then dead letters in
    /// the order they came), through a connection of its own (the spool is closed); then
    /// empties the WAL again, as the closed spool left it. Returns the table and the event id.
    fn damage_a_row(&mut self) -> rusqlite::Result<Option<(&'static str, String)>> {
        if !self.db.exists() {
            return Ok(None);
        }
        let conn = rusqlite::Connection::open(&self.db)?;
        let mut sealed: Vec<(&'static str, String)> = Vec::new();
        for (table, order) in [("events", "seq"), ("quarantine", "quarantined_seq")] {
            let ids: Vec<String> = conn
                .prepare(&format!(
                    "SELECT event_id FROM {table} WHERE key_id != 0 ORDER BY {order}"
                ))?
                .query_map([], |r| r.get(0))?
                .collect::<rusqlite::Result<_>>()?;
            sealed.extend(
                ids.into_iter()
                    .filter(|id| !self.sealing.damaged.contains(id))
                    .map(|id| (table, id)),
            );
        }
        if sealed.is_empty() {
            return Ok(None);
        }
        let (table, id) = sealed[self.sealing.rng.usize(0..sealed.len())].clone();
        self.sealing.damaged.insert(id.clone());
        let mut body: Vec<u8> = conn.query_row(
            &format!("SELECT body FROM {table} WHERE event_id = ?1"),
            [&id],
            |r| r.get(0),
        )?;
        let at = body.len() / 2;
        body[at] ^= 0x5a;
        conn.execute(
            &format!("UPDATE {table} SET body = ?2 WHERE event_id = ?1"),
            rusqlite::params![id, body],
        )?;
        conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))?;
        Ok(Some((table, id)))
    }

    /// A sealed store's files hold no payload of an event tracked while it sealed, in plain
    /// text (docs/encryption.md: every payload the store writes is sealed).
    pub(super) fn scan_sealed(&self) -> Result<(), Finding> {
        let Some(from) = self.sealing.from else {
            return Ok(());
        };
        self.files().payload(|idx| idx >= from).map_err(|(file, idx)| {
            format!(
                "{file} holds the payload of event {idx} in plain text, tracked while the store sealed (from event {from} on)"
            )
        })
    }
}
