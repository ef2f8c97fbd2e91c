//! Where the store's connection comes from, and, for tests (feature `test-util`), a fault point
//! that makes its writes fail the way a real disk does.
//!
//! A full disk fails a write in the middle: a spill's third transaction, the commit record after
//! the pages went out, the checkpoint after a commit that stood. Filling a real file system
//! before the first write never reaches those paths, and a tmpfs that fills by itself reaches
//! them at a place no test chooses. [`StoreFaults`] chooses the place: it sits under SQLite as a
//! VFS that forwards every call to the platform's own and fails the N-th write, commit or
//! checkpoint with `SQLITE_FULL` or `SQLITE_IOERR`, or keeps the disk full until disarmed. SQLite
//! then does what it does on a real disk (rolls the transaction back, puts the pager in its
//! error state until the next read resets it), so the store's failure paths run as they would
//! in the field, and nothing in the store's own code knows about the fault point.

use std::path::Path;

use rusqlite::Connection;

/// How the store opens its connection: plainly, or (tests) through a [`StoreFaults`] VFS. A
/// zero-sized value in a build without `test-util`.
#[derive(Clone, Default)]
pub struct FaultPoint {
    #[cfg(any(test, feature = "test-util"))]
    faults: Option<StoreFaults>,
}

impl FaultPoint {
    #[cfg(any(test, feature = "test-util"))]
    pub fn new(faults: Option<StoreFaults>) -> FaultPoint {
        FaultPoint { faults }
    }

    pub fn open(&self, path: &Path) -> rusqlite::Result<Connection> {
        #[cfg(any(test, feature = "test-util"))]
        if let Some(faults) = &self.faults {
            return Connection::open_with_flags_and_vfs(
                path,
                rusqlite::OpenFlags::default(),
                faults.vfs_name(),
            );
        }
        Connection::open(path)
    }

    /// Tells the test harness how many queued rows the store holds back from reads and counts
    /// because it owes them a delete (see the store's `owed`).
    #[allow(unused_variables)]
    pub fn note_owed(&self, rows: u64) {
        #[cfg(any(test, feature = "test-util"))]
        if let Some(faults) = &self.faults {
            faults
                .plan
                .owed
                .store(rows, std::sync::atomic::Ordering::Relaxed);
        }
    }
}

#[cfg(any(test, feature = "test-util"))]
pub use harness::{FaultError, FaultSite, StoreFaults};

#[cfg(any(test, feature = "test-util"))]
mod harness {
    use std::ffi::{CString, c_int, c_void};
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::{Arc, Mutex, OnceLock};

    use rusqlite::ffi;

    /// What a fault fails.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub enum FaultSite {
        /// A write to the WAL that is not a commit record: a page, a frame header, the WAL's
        /// own header. A transaction writes its pages when it commits (or when its cache
        /// spills), so the first write of a transaction fails it before its commit record.
        Write,
        /// The commit record of a transaction: the header of its last WAL frame, written after
        /// all its pages. Failing it fails exactly that transaction's commit.
        Commit,
        /// A checkpoint (the WAL copied back into the database: the store's truncating ones,
        /// the passive ones after a commit, the one at close), failed as it starts.
        Checkpoint,
    }

    impl FaultSite {
        fn index(self) -> usize {
            match self {
                FaultSite::Write => 0,
                FaultSite::Commit => 1,
                FaultSite::Checkpoint => 2,
            }
        }
    }

    /// The error a fault returns.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub enum FaultError {
        /// `SQLITE_FULL`: no space left.
        Full,
        /// `SQLITE_IOERR_WRITE` (`SQLITE_IOERR` for a checkpoint): the device failed.
        IoErr,
    }

    impl FaultError {
        fn code(self, site: FaultSite) -> c_int {
            match (self, site) {
                (FaultError::Full, _) => ffi::SQLITE_FULL,
                (FaultError::IoErr, FaultSite::Checkpoint) => ffi::SQLITE_IOERR,
                (FaultError::IoErr, _) => ffi::SQLITE_IOERR_WRITE,
            }
        }
    }

    /// The fault point of one store (behind feature `test-util`; give it to
    /// `SpoolBuilder::store_faults`). Each handle is its own VFS under SQLite with its own plan,
    /// so many stores in one process (a simulation of many devices) fail independently; clones
    /// share the plan, so a test keeps one to steer the store it gave the other to.
    ///
    /// - [`StoreFaults::fail_nth`]: the n-th [`FaultSite`] from now fails (1 = the next).
    /// - [`StoreFaults::fail_next`]: the next k of a site fail.
    /// - [`StoreFaults::fill_disk`]: from now on the disk is full ([`FaultError::Full`]: every
    ///   write that would grow the database or the WAL fails, as on a real file system, where
    ///   rewriting blocks a file already holds still works) or failing ([`FaultError::IoErr`]:
    ///   every write fails), until [`StoreFaults::disarm`].
    /// - [`StoreFaults::disarm`]: every rule and the full disk are lifted.
    ///
    /// Counting starts when the store opens through it, so an operation's writes are found by
    /// reading [`StoreFaults::seen`] before it. Writes to the database file itself happen only in
    /// checkpoints and are failed only by a full or failing disk. Temporary files are never
    /// failed.
    #[derive(Clone, Default)]
    pub struct StoreFaults {
        pub(super) plan: Arc<Plan>,
    }

    impl std::fmt::Debug for StoreFaults {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            let s = self.plan.lock();
            f.debug_struct("StoreFaults")
                .field("seen", &s.seen)
                .field("injected", &s.injected)
                .field("disk", &s.disk)
                .finish()
        }
    }

    #[derive(Default)]
    pub(super) struct Plan {
        state: Mutex<State>,
        vfs: OnceLock<Registered>,
        /// Queued rows the store holds back because it owes them a delete.
        pub(super) owed: AtomicU64,
    }

    #[derive(Default)]
    struct State {
        /// Operations seen so far, by [`FaultSite::index`].
        seen: [u64; 3],
        /// Faults returned so far, by site.
        injected: [u64; 3],
        rules: Vec<Rule>,
        disk: Option<FaultError>,
        /// Bytes written to the database file and to the WAL since each was last synced: what
        /// a power cut could take back (SQLite keeps a file's order of writes only up to its
        /// last sync).
        unsynced: [u64; 2],
    }

    /// Fails the operations of `site` numbered `first..=last` (counted since the store opened).
    struct Rule {
        site: FaultSite,
        first: u64,
        last: u64,
        error: FaultError,
    }

    impl StoreFaults {
        pub fn new() -> StoreFaults {
            StoreFaults::default()
        }

        /// The `n`-th operation of `site` from now fails with `error` (`n` = 1: the next one).
        pub fn fail_nth(&self, site: FaultSite, n: u64, error: FaultError) {
            let mut s = self.plan.lock();
            let at = s.seen[site.index()] + n.max(1);
            s.rules.push(Rule {
                site,
                first: at,
                last: at,
                error,
            });
        }

        /// The next `k` operations of `site` fail with `error`.
        pub fn fail_next(&self, site: FaultSite, k: u64, error: FaultError) {
            if k == 0 {
                return;
            }
            let mut s = self.plan.lock();
            let next = s.seen[site.index()] + 1;
            s.rules.push(Rule {
                site,
                first: next,
                last: next + k - 1,
                error,
            });
        }

        /// The disk is full (or failing) from now until [`StoreFaults::disarm`].
        pub fn fill_disk(&self, error: FaultError) {
            self.plan.lock().disk = Some(error);
        }

        /// Lifts every rule and the full disk.
        pub fn disarm(&self) {
            let mut s = self.plan.lock();
            s.rules.clear();
            s.disk = None;
        }

        /// Operations of `site` seen since the store opened, failed ones included.
        pub fn seen(&self, site: FaultSite) -> u64 {
            self.plan.lock().seen[site.index()]
        }

        /// Faults returned so far at `site`.
        pub fn injected(&self, site: FaultSite) -> u64 {
            self.plan.lock().injected[site.index()]
        }

        /// Whether a rule is still waiting to fire or the disk is full.
        pub fn armed(&self) -> bool {
            let s = self.plan.lock();
            s.disk.is_some() || s.rules.iter().any(|r| r.last > s.seen[r.site.index()])
        }

        /// Bytes the store wrote to its database file and to its WAL, each since that file was
        /// last synced: (0, 0) means a power cut now would take back nothing it wrote.
        pub fn unsynced_bytes(&self) -> (u64, u64) {
            let s = self.plan.lock();
            (s.unsynced[0], s.unsynced[1])
        }

        /// Queued rows the store still holds on disk only because a delete it owes them failed
        /// (delivered, expired or refused events whose rows must go): hidden from batches and
        /// from `pending_disk`, deleted by the store's next write that succeeds. A test that
        /// counts the table's rows adds this to `pending_disk`.
        pub fn owed_rows(&self) -> u64 {
            self.plan.owed.load(Ordering::Relaxed)
        }

        /// The name this plan's VFS is registered under (registered at the first call).
        pub(super) fn vfs_name(&self) -> &str {
            let plan: &Plan = &self.plan;
            plan.vfs
                .get_or_init(|| Registered::new(plan))
                .name
                .to_str()
                .expect("the VFS name is ASCII")
        }
    }

    impl Plan {
        fn lock(&self) -> std::sync::MutexGuard<'_, State> {
            self.state.lock().unwrap_or_else(|p| p.into_inner())
        }

        /// Counts one operation of `site` and says whether it fails, and how.
        fn hit(&self, site: FaultSite) -> Option<c_int> {
            let mut s = self.lock();
            let i = site.index();
            s.seen[i] += 1;
            let n = s.seen[i];
            let error = s
                .rules
                .iter()
                .find(|r| r.site == site && (r.first..=r.last).contains(&n))
                .map(|r| r.error);
            s.rules.retain(|r| r.last > n || r.site != site);
            let error = error?;
            s.injected[i] += 1;
            Some(error.code(site))
        }

        /// What the full or failing disk says to a write that `grows` its file (or not).
        fn disk(&self, grows: bool) -> Option<c_int> {
            let mut s = self.lock();
            let code = match s.disk? {
                FaultError::Full if grows => ffi::SQLITE_FULL,
                FaultError::Full => return None,
                FaultError::IoErr => ffi::SQLITE_IOERR_WRITE,
            };
            s.injected[FaultSite::Write.index()] += 1;
            Some(code)
        }
    }

    /// The VFS registered for one plan: the platform's default VFS with another name and an
    /// `xOpen` that wraps each file. Unregistered when the plan goes, after every connection
    /// that used it (the store closes its connection before it lets go of the plan).
    struct Registered {
        vfs: Box<ffi::sqlite3_vfs>,
        name: CString,
        _app: Box<AppData>,
    }

    // SAFETY: the raw pointers inside are only read by SQLite, which serializes its VFS list.
    unsafe impl Send for Registered {}
    unsafe impl Sync for Registered {}

    struct AppData {
        real: *mut ffi::sqlite3_vfs,
        plan: *const Plan,
    }

    static NEXT_NAME: AtomicU64 = AtomicU64::new(1);

    impl Registered {
        fn new(plan: &Plan) -> Registered {
            let name = CString::new(format!(
                "eventspool-faults-{}",
                NEXT_NAME.fetch_add(1, Ordering::Relaxed)
            ))
            .expect("no NUL in the VFS name");
            // SAFETY: `sqlite3_vfs_find(NULL)` initializes SQLite and returns the default VFS,
            // which lives as long as the process.
            let real = unsafe { ffi::sqlite3_vfs_find(std::ptr::null()) };
            assert!(!real.is_null(), "SQLite has no default VFS");
            let app = Box::new(AppData {
                real,
                plan: plan as *const Plan,
            });
            // Every method but xOpen is the platform's own: the unix VFS ignores the VFS
            // pointer they are given, and xOpen passes the real one on.
            let mut vfs = Box::new(unsafe { *real });
            vfs.szOsFile = (real_offset() + unsafe { (*real).szOsFile } as usize) as c_int;
            vfs.pNext = std::ptr::null_mut();
            vfs.zName = name.as_ptr();
            vfs.pAppData = &*app as *const AppData as *mut c_void;
            vfs.xOpen = Some(x_open);
            // SAFETY: `vfs` and what it points to live in `Registered` until it unregisters.
            let rc = unsafe { ffi::sqlite3_vfs_register(&mut *vfs, 0) };
            assert_eq!(rc, ffi::SQLITE_OK, "registering the fault VFS");
            Registered {
                vfs,
                name,
                _app: app,
            }
        }
    }

    impl Drop for Registered {
        fn drop(&mut self) {
            // SAFETY: registered in `new`; no connection uses it any more.
            unsafe { ffi::sqlite3_vfs_unregister(&mut *self.vfs) };
        }
    }

    #[derive(Clone, Copy, PartialEq, Eq)]
    enum Kind {
        Database,
        Wal,
        Other,
    }

    impl Kind {
        /// Where [`State::unsynced`] counts this file's writes (the shared-memory index and
        /// temporary files hold nothing a power cut could lose).
        fn synced_index(self) -> Option<usize> {
            match self {
                Kind::Database => Some(0),
                Kind::Wal => Some(1),
                Kind::Other => None,
            }
        }
    }

    /// The file SQLite holds: ours first (its methods are [`METHODS`]), the platform's right
    /// after it in the same allocation.
    #[repr(C)]
    struct FaultFile {
        base: ffi::sqlite3_file,
        plan: *const Plan,
        kind: Kind,
        real: *mut ffi::sqlite3_file,
    }

    fn real_offset() -> usize {
        std::mem::size_of::<FaultFile>().next_multiple_of(16)
    }

    unsafe extern "C" fn x_open(
        vfs: *mut ffi::sqlite3_vfs,
        name: ffi::sqlite3_filename,
        file: *mut ffi::sqlite3_file,
        flags: c_int,
        out_flags: *mut c_int,
    ) -> c_int {
        // SAFETY: SQLite gives us `szOsFile` bytes at `file` and our VFS, whose app data is ours.
        unsafe {
            let app = &*((*vfs).pAppData as *const AppData);
            let ours = file as *mut FaultFile;
            let real = (file as *mut u8).add(real_offset()) as *mut ffi::sqlite3_file;
            (*ours).base.pMethods = std::ptr::null();
            (*real).pMethods = std::ptr::null();
            let open = (*app.real).xOpen.expect("the default VFS opens files");
            let rc = open(app.real, name, real, flags, out_flags);
            if (*real).pMethods.is_null() {
                return rc;
            }
            (*ours).plan = app.plan;
            (*ours).real = real;
            (*ours).kind = if flags & ffi::SQLITE_OPEN_MAIN_DB != 0 {
                Kind::Database
            } else if flags & ffi::SQLITE_OPEN_WAL != 0 {
                Kind::Wal
            } else {
                Kind::Other
            };
            (*ours).base.pMethods = &METHODS;
            rc
        }
    }

    /// The platform's file and its methods behind one of ours.
    ///
    /// # Safety
    /// `file` must be a [`FaultFile`] that [`x_open`] opened.
    unsafe fn real(
        file: *mut ffi::sqlite3_file,
    ) -> (*mut ffi::sqlite3_file, &'static ffi::sqlite3_io_methods) {
        // SAFETY: per the contract, `real` was opened and has methods.
        unsafe {
            let real = (*(file as *mut FaultFile)).real;
            (real, &*(*real).pMethods)
        }
    }

    static METHODS: ffi::sqlite3_io_methods = ffi::sqlite3_io_methods {
        iVersion: 3,
        xClose: Some(x_close),
        xRead: Some(x_read),
        xWrite: Some(x_write),
        xTruncate: Some(x_truncate),
        xSync: Some(x_sync),
        xFileSize: Some(x_file_size),
        xLock: Some(x_lock),
        xUnlock: Some(x_unlock),
        xCheckReservedLock: Some(x_check_reserved_lock),
        xFileControl: Some(x_file_control),
        xSectorSize: Some(x_sector_size),
        xDeviceCharacteristics: Some(x_device_characteristics),
        xShmMap: Some(x_shm_map),
        xShmLock: Some(x_shm_lock),
        xShmBarrier: Some(x_shm_barrier),
        xShmUnmap: Some(x_shm_unmap),
        xFetch: Some(x_fetch),
        xUnfetch: Some(x_unfetch),
    };

    /// Forwards a call to the platform's method, or answers `missing` if it has none.
    macro_rules! forward {
        ($file:expr, $method:ident, $missing:expr $(, $arg:expr)*) => {{
            // SAFETY: SQLite calls these only on files `x_open` opened.
            let (real, methods) = unsafe { real($file) };
            match methods.$method {
                Some(f) => unsafe { f(real $(, $arg)*) },
                None => $missing,
            }
        }};
    }

    unsafe extern "C" fn x_close(file: *mut ffi::sqlite3_file) -> c_int {
        forward!(file, xClose, ffi::SQLITE_OK)
    }

    unsafe extern "C" fn x_read(
        file: *mut ffi::sqlite3_file,
        buf: *mut c_void,
        amount: c_int,
        offset: ffi::sqlite3_int64,
    ) -> c_int {
        forward!(file, xRead, ffi::SQLITE_IOERR_READ, buf, amount, offset)
    }

    /// A WAL frame header (24 bytes, after the 32-byte WAL header) whose "database size after
    /// commit" field is set: the commit record.
    fn is_commit_record(kind: Kind, buf: *const c_void, amount: c_int, offset: i64) -> bool {
        if kind != Kind::Wal || amount != 24 || offset < 32 {
            return false;
        }
        // SAFETY: SQLite hands us `amount` readable bytes.
        let header = unsafe { std::slice::from_raw_parts(buf as *const u8, 24) };
        header[4..8] != [0, 0, 0, 0]
    }

    unsafe extern "C" fn x_write(
        file: *mut ffi::sqlite3_file,
        buf: *const c_void,
        amount: c_int,
        offset: ffi::sqlite3_int64,
    ) -> c_int {
        // SAFETY: `file` is ours (see `x_open`) and its plan outlives it.
        let (kind, plan) = unsafe {
            let ours = &*(file as *const FaultFile);
            (ours.kind, &*ours.plan)
        };
        if kind != Kind::Other {
            if kind == Kind::Wal {
                let site = if is_commit_record(kind, buf, amount, offset) {
                    FaultSite::Commit
                } else {
                    FaultSite::Write
                };
                if let Some(rc) = plan.hit(site) {
                    return rc;
                }
            }
            let mut size: ffi::sqlite3_int64 = 0;
            let rc = forward!(file, xFileSize, ffi::SQLITE_IOERR_FSTAT, &mut size);
            let grows = rc != ffi::SQLITE_OK || offset + amount as i64 > size;
            if let Some(rc) = plan.disk(grows) {
                return rc;
            }
        }
        let rc = forward!(file, xWrite, ffi::SQLITE_IOERR_WRITE, buf, amount, offset);
        if let (ffi::SQLITE_OK, Some(i)) = (rc, kind.synced_index()) {
            plan.lock().unsynced[i] += amount.max(0) as u64;
        }
        rc
    }

    unsafe extern "C" fn x_truncate(
        file: *mut ffi::sqlite3_file,
        size: ffi::sqlite3_int64,
    ) -> c_int {
        forward!(file, xTruncate, ffi::SQLITE_IOERR_TRUNCATE, size)
    }

    unsafe extern "C" fn x_sync(file: *mut ffi::sqlite3_file, flags: c_int) -> c_int {
        let rc = forward!(file, xSync, ffi::SQLITE_IOERR_FSYNC, flags);
        // SAFETY: `file` is ours (see `x_open`) and its plan outlives it.
        let (kind, plan) = unsafe {
            let ours = &*(file as *const FaultFile);
            (ours.kind, &*ours.plan)
        };
        if let (ffi::SQLITE_OK, Some(i)) = (rc, kind.synced_index()) {
            plan.lock().unsynced[i] = 0;
        }
        rc
    }

    unsafe extern "C" fn x_file_size(
        file: *mut ffi::sqlite3_file,
        size: *mut ffi::sqlite3_int64,
    ) -> c_int {
        forward!(file, xFileSize, ffi::SQLITE_IOERR_FSTAT, size)
    }

    unsafe extern "C" fn x_lock(file: *mut ffi::sqlite3_file, level: c_int) -> c_int {
        forward!(file, xLock, ffi::SQLITE_IOERR_LOCK, level)
    }

    unsafe extern "C" fn x_unlock(file: *mut ffi::sqlite3_file, level: c_int) -> c_int {
        forward!(file, xUnlock, ffi::SQLITE_IOERR_UNLOCK, level)
    }

    unsafe extern "C" fn x_check_reserved_lock(
        file: *mut ffi::sqlite3_file,
        out: *mut c_int,
    ) -> c_int {
        forward!(
            file,
            xCheckReservedLock,
            ffi::SQLITE_IOERR_CHECKRESERVEDLOCK,
            out
        )
    }

    unsafe extern "C" fn x_file_control(
        file: *mut ffi::sqlite3_file,
        op: c_int,
        arg: *mut c_void,
    ) -> c_int {
        forward!(file, xFileControl, ffi::SQLITE_NOTFOUND, op, arg)
    }

    unsafe extern "C" fn x_sector_size(file: *mut ffi::sqlite3_file) -> c_int {
        forward!(file, xSectorSize, 4096)
    }

    unsafe extern "C" fn x_device_characteristics(file: *mut ffi::sqlite3_file) -> c_int {
        forward!(file, xDeviceCharacteristics, 0)
    }

    unsafe extern "C" fn x_shm_map(
        file: *mut ffi::sqlite3_file,
        page: c_int,
        page_size: c_int,
        extend: c_int,
        out: *mut *mut c_void,
    ) -> c_int {
        forward!(
            file,
            xShmMap,
            ffi::SQLITE_IOERR_SHMMAP,
            page,
            page_size,
            extend,
            out
        )
    }

    /// The checkpointer's lock (`WAL_CKPT_LOCK`, slot 1, taken alone and exclusive) is where
    /// every checkpoint starts, and only a checkpoint takes it that way.
    unsafe extern "C" fn x_shm_lock(
        file: *mut ffi::sqlite3_file,
        offset: c_int,
        n: c_int,
        flags: c_int,
    ) -> c_int {
        // SAFETY: `file` is ours (see `x_open`) and its plan outlives it.
        let (kind, plan) = unsafe {
            let ours = &*(file as *const FaultFile);
            (ours.kind, &*ours.plan)
        };
        if kind == Kind::Database
            && offset == 1
            && n == 1
            && flags == ffi::SQLITE_SHM_LOCK | ffi::SQLITE_SHM_EXCLUSIVE
            && let Some(rc) = plan.hit(FaultSite::Checkpoint)
        {
            return rc;
        }
        forward!(file, xShmLock, ffi::SQLITE_IOERR_SHMLOCK, offset, n, flags)
    }

    unsafe extern "C" fn x_shm_barrier(file: *mut ffi::sqlite3_file) {
        forward!(file, xShmBarrier, ())
    }

    unsafe extern "C" fn x_shm_unmap(file: *mut ffi::sqlite3_file, delete: c_int) -> c_int {
        forward!(file, xShmUnmap, ffi::SQLITE_OK, delete)
    }

    unsafe extern "C" fn x_fetch(
        file: *mut ffi::sqlite3_file,
        offset: ffi::sqlite3_int64,
        amount: c_int,
        out: *mut *mut c_void,
    ) -> c_int {
        // SAFETY: `out` is SQLite's to write; without the platform's xFetch there is no map.
        forward!(
            file,
            xFetch,
            {
                unsafe { *out = std::ptr::null_mut() };
                ffi::SQLITE_OK
            },
            offset,
            amount,
            out
        )
    }

    unsafe extern "C" fn x_unfetch(
        file: *mut ffi::sqlite3_file,
        offset: ffi::sqlite3_int64,
        page: *mut c_void,
    ) -> c_int {
        forward!(file, xUnfetch, ffi::SQLITE_OK, offset, page)
    }
}
