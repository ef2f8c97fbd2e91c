//! Opening the store: the owner's lock, the connection configured and migrated, a damaged
//! file moved aside for a fresh one, and the keys checked before anything is written. Apart
//! from the rest because none of it runs once there is a `Store` to use (the admin tools run
//! the key check on their own connection).

use super::count_at_close::queued_rows;
use super::in_flight;
use super::reads::{BODY, body_ad};
use super::writes::{INSERT_EVENT, INSERT_EVENTS_MANY};
use super::*;

/// Why [`Store::connect`] gave no connection, short of an SQLite error.
enum Refused {
    /// Not a store this build may use: moved aside.
    Unusable(schema::Unusable),
    /// A wrong or missing key: refused, the file left as it was.
    Key(Error),
}

/// A connection to a store that is ours, configured and migrated.
struct Connected {
    conn: Connection,
    rows: u64,
    /// Rows the last batch on the wire still owes a send count (in_flight.rs).
    in_flight: Vec<u64>,
    page_size: u64,
    wal: Arc<WalWatch>,
    frontier: Frontier,
}

impl Store {
    /// Opens (or creates) the store. With `keys`, a wrong or missing key for the rows it holds
    /// is refused here, naming the key id, and the file is left as it is (never moved aside:
    /// the rows are fine, the key is not).
    #[cfg(test)]
    pub fn open(path: &Path, max_disk_bytes: u64, wall_ms: i64, keys: Keyring) -> Result<Opened> {
        Store::open_with(path, max_disk_bytes, wall_ms, keys, FaultPoint::default())
    }

    /// [`Store::open`] with the connection opened through `faults` (faults.rs).
    pub fn open_with(
        path: &Path,
        max_disk_bytes: u64,
        wall_ms: i64,
        keys: Keyring,
        faults: FaultPoint,
    ) -> Result<Opened> {
        let lock = acquire_lock(path)?;
        create_private(path)?;
        let budget = DiskBudget::new(max_disk_bytes);
        match Store::connect(path, budget, wall_ms, &keys, &faults) {
            Ok(Ok(connected)) => Ok(Opened {
                store: Store::new(connected, path, budget, lock, keys, faults),
                recovered: None,
            }),
            Ok(Err(Refused::Key(e))) => Err(e),
            Ok(Err(Refused::Unusable(unusable))) => Store::recover(
                path,
                budget,
                lock,
                unusable.to_string(),
                wall_ms,
                keys,
                faults,
            ),
            Err(e) if is_corruption(&e) => {
                Store::recover(path, budget, lock, e.to_string(), wall_ms, keys, faults)
            }
            Err(e) => Err(storage("cannot open store", path, e)),
        }
    }

    fn new(
        connected: Connected,
        path: &Path,
        budget: DiskBudget,
        lock: File,
        keys: Keyring,
        faults: FaultPoint,
    ) -> Store {
        let Connected {
            conn,
            rows,
            in_flight,
            page_size,
            wal,
            frontier,
        } = connected;
        let store = Store {
            conn: Mutex::new(conn),
            path: path.to_path_buf(),
            budget,
            page_size,
            rows: AtomicU64::new(rows),
            leased: Mutex::new(Vec::new()),
            lock: Mutex::new(Some(lock)),
            insert_transactions: AtomicU64::new(0),
            checkpoint_errors: Arc::new(AtomicU64::new(0)),
            background: Mutex::new(None),
            owed: Mutex::new(Vec::new()),
            owed_reports: Mutex::new(Vec::new()),
            count_drifted: std::sync::atomic::AtomicBool::new(false),
            keys,
            undecryptable: AtomicU64::new(0),
            undecryptable_evicted: AtomicU64::new(0),
            accepted_floor: AtomicI64::new(FLOOR_UNKNOWN),
            pages_bound: AtomicU64::new(PAGES_UNKNOWN),
            wal,
            db_file_bytes: AtomicU64::new(0),
            frontier: Mutex::new(frontier),
            quarantine_counts: Mutex::new(None),
            in_flight: Mutex::new(in_flight),
            recorded_ahead: Mutex::new(Vec::new()),
            read_ahead: Mutex::new(None),
            given_back: AtomicU64::new(0),
            faults,
        };
        // What the open wrote (a migration, the send the record owed the batch on the wire at
        // a crash: a whole batch of updated rows) may have taken the WAL past its share, and
        // SQLite's own checkpoint leaves the file at its size: the cap's check runs as after
        // any write.
        {
            let conn = store.conn();
            store.checkpoint_if_needed(&conn);
        }
        store
    }

    /// Never deletes what it cannot read: the file (with its WAL and SHM) is renamed with a
    /// timestamp for diagnosis and a fresh store takes its place.
    fn recover(
        path: &Path,
        budget: DiskBudget,
        lock: File,
        reason: String,
        wall_ms: i64,
        keys: Keyring,
        faults: FaultPoint,
    ) -> Result<Opened> {
        let aside = PathBuf::from(format!("{}.unusable-{wall_ms}", path.display()));
        for suffix in ["", "-wal", "-shm"] {
            let from = PathBuf::from(format!("{}{suffix}", path.display()));
            if from.exists() {
                let to = PathBuf::from(format!("{}{suffix}", aside.display()));
                std::fs::rename(&from, &to).map_err(|e| storage("cannot move aside", &from, e))?;
            }
        }
        tracing::warn!(path = %path.display(), moved_to = %aside.display(), %reason, "store unusable, moved aside");
        create_private(path)?;
        match Store::connect(path, budget, wall_ms, &keys, &faults) {
            Ok(Ok(connected)) => Ok(Opened {
                store: Store::new(connected, path, budget, lock, keys, faults),
                recovered: Some((aside, reason)),
            }),
            Ok(Err(Refused::Key(e))) => Err(e),
            Ok(Err(Refused::Unusable(unusable))) => {
                Err(storage("fresh store unusable", path, unusable))
            }
            Err(e) => Err(storage("cannot create store", path, e)),
        }
    }

    /// Connects and migrates. The keys are checked before anything is written (a refused
    /// key leaves the file as it was: no migration, no saved count taken out), and recorded
    /// after the migration.
    fn connect(
        path: &Path,
        budget: DiskBudget,
        wall_ms: i64,
        keys: &Keyring,
        faults: &FaultPoint,
    ) -> rusqlite::Result<Result<Connected, Refused>> {
        let mut conn = faults.open(path)?;
        let version = match schema::inspect(&conn)? {
            Ok(version) => version,
            Err(unusable) => return Ok(Err(Refused::Unusable(unusable))),
        };
        let page_size: u64 =
            conn.pragma_query_value(None, "page_size", |r| r.get::<_, i64>(0))? as u64;
        let checkpoint_pages = checkpoint_frames(budget, page_size, false);
        schema::configure(&conn, budget.wal_bytes / 2)?;
        let wal = WalWatch::install(&mut conn, page_size, checkpoint_pages, &wal_path(path))?;
        // The key records exist from version 4; before, nothing is sealed.
        if version >= 4
            && let Err(e) = check_keys(&conn, keys, path, false)
        {
            return Ok(Err(Refused::Key(e)));
        }
        // The owner lock is held, so nothing changed the file since `inspect` read it.
        schema::migrate(&mut conn, version, wall_ms, &mut |to, tx| match to {
            7 => reseal_bodies(tx, keys),
            _ => Ok(()),
        })?;
        if let Err(e) = check_keys(&conn, keys, path, true) {
            return Ok(Err(Refused::Key(e)));
        }
        let rows = queued_rows(&mut conn)?;
        let in_flight = in_flight::settle_at_open(&mut conn);
        conn.query_row("SELECT count(*) FROM quarantine", [], |r| {
            r.get::<_, i64>(0)
        })?;
        let frontier = Frontier::load(&conn)?;
        // Compiled now rather than by the first spill, which a burst waits on (the 25-row
        // statement has 250 parameters).
        conn.prepare_cached(INSERT_EVENT)?;
        conn.prepare_cached(&INSERT_EVENTS_MANY)?;
        Ok(Ok(Connected {
            conn,
            rows,
            in_flight,
            page_size,
            wal,
            frontier,
        }))
    }
}

/// Refuses a wrong or missing key by id before anything is read or written with it. With
/// `write` (the owner), records a check value for each supplied key not seen before and forgets
/// a key no longer supplied once no row uses it (rotation is complete).
pub(crate) fn check_keys(
    conn: &Connection,
    keys: &Keyring,
    path: &Path,
    write: bool,
) -> Result<()> {
    let recorded: Vec<(u32, Vec<u8>)> = {
        let mut stmt = conn.prepare("SELECT key_id, check_record FROM keys ORDER BY key_id")?;
        stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
            .collect::<rusqlite::Result<_>>()?
    };
    for (key_id, record) in &recorded {
        let key_id = *key_id;
        if keys.has(key_id) {
            if !keys.verifies(key_id, record) {
                return Err(Error::EncryptionKey {
                    key_id,
                    reason: format!(
                        "the key supplied for this id is not the one the store {} was sealed with; nothing was read or changed",
                        path.display()
                    ),
                });
            }
        } else if rows_sealed_with(conn, key_id)? {
            return Err(Error::EncryptionKey {
                key_id,
                reason: format!(
                    "the store {} holds events sealed with this key id, and encryption_keys does not supply it (supplied ids: {:?}); nothing was read or changed",
                    path.display(),
                    keys.ids()
                ),
            });
        } else if write {
            conn.execute("DELETE FROM keys WHERE key_id = ?1", [key_id])?;
        }
    }
    if write {
        for key_id in keys.ids() {
            if recorded.iter().all(|(id, _)| *id != key_id)
                && let Some(record) = keys.check_record(key_id)
            {
                conn.execute(
                    "INSERT INTO keys (key_id, check_record) VALUES (?1, ?2)",
                    params![key_id, record],
                )?;
            }
        }
    }
    Ok(())
}

/// Whether any queued or quarantined row is sealed with `key_id` (a scan, run only for a key
/// that is recorded but not supplied).
fn rows_sealed_with(conn: &Connection, key_id: u32) -> Result<bool> {
    Ok(conn.query_row(
        "SELECT EXISTS(SELECT 1 FROM events WHERE key_id = ?1)
             OR EXISTS(SELECT 1 FROM quarantine WHERE key_id = ?1)",
        [key_id],
        |r| r.get(0),
    )?)
}

/// Schema 6 → 7 ([`schema`]): every sealed queued body is opened with the associated data it
/// was sealed with (its column and id) and sealed again with [`body_ad`]'s, by the current key.
/// A body that does not open (damaged) is left as it is: the queue quarantines it as
/// `undecryptable` when it reads it, as before. The keys were checked first, so every key a
/// row uses is supplied.
fn reseal_bodies(tx: &Transaction<'_>, keys: &Keyring) -> rusqlite::Result<()> {
    let sealed: Vec<(i64, i64, String, u8, u32, Vec<u8>)> = {
        let mut stmt = tx.prepare(
            "SELECT seq, ts, event_id, lane, key_id, body FROM events WHERE key_id != 0",
        )?;
        stmt.query_map([], |r| {
            Ok((
                r.get(0)?,
                r.get(1)?,
                r.get(2)?,
                r.get(3)?,
                r.get(4)?,
                r.get(5)?,
            ))
        })?
        .collect::<rusqlite::Result<_>>()?
    };
    if sealed.is_empty() {
        return Ok(());
    }
    let mut update = tx.prepare("UPDATE events SET body = ?2, key_id = ?3 WHERE seq = ?1")?;
    let mut resealed = 0;
    for (seq, ts, id, lane, key_id, body) in sealed {
        let Ok(plain) = keys.open(key_id, BODY, &id, rusqlite::types::ValueRef::Blob(&body)) else {
            continue;
        };
        let current = keys.current_id();
        let mut ad = String::new();
        let ad = body_ad(current, &id, ts, lane, &mut ad);
        update.execute(params![seq, keys.seal(BODY, ad, &plain), current])?;
        resealed += 1;
    }
    tracing::info!(
        rows = resealed,
        "sealed bodies now bind their timestamp and lane"
    );
    Ok(())
}

/// Creates the database file readable by its owner only, before SQLite opens it (SQLite gives
/// the WAL and SHM the same mode as the database).
fn create_private(path: &Path) -> Result<()> {
    let mut options = OpenOptions::new();
    options.create(true).append(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    options
        .open(path)
        .map(|_| ())
        .map_err(|e| storage("cannot create", path, e))
}

/// One owner per store: an advisory lock on `<db>.lock`, released when the handle closes (or
/// the process dies, so a crash never leaves a stale lock behind).
fn acquire_lock(path: &Path) -> Result<File> {
    let lock_path = PathBuf::from(format!("{}.lock", path.display()));
    let mut options = OpenOptions::new();
    options.create(true).truncate(false).write(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    let file = options
        .open(&lock_path)
        .map_err(|e| storage("cannot create lock", &lock_path, e))?;
    match file.try_lock() {
        Ok(()) => Ok(file),
        Err(std::fs::TryLockError::WouldBlock) => Err(Error::Storage(format!(
            "store {} is already open in another handle or process; one owner at a time",
            path.display()
        ))),
        Err(std::fs::TryLockError::Error(e)) => Err(storage("cannot lock", &lock_path, e)),
    }
}
