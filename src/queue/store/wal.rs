//! What the store knows of its WAL without asking the file system: SQLite reports the frames in
//! the log after every commit (`sqlite3_wal_hook`), so the store's check after each write
//! transaction ("is the WAL inside its share, are both files inside the cap?") costs no system
//! call. Measured in the `durability = always` benchmark, the two `stat` calls it made before
//! were about a tenth of a one-row commit.
//!
//! The hook takes over SQLite's automatic checkpoint (a connection has one WAL hook, and
//! `wal_autocheckpoint` is that hook), so the checkpoint threshold lives here too.

use std::ffi::c_int;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use rusqlite::Connection;

use super::checkpointer::{Checkpointer, Turn};

/// The WAL header, before the first frame.
const WAL_HEADER_BYTES: u64 = 32;
/// Each frame's header, before its page.
const FRAME_HEADER_BYTES: u64 = 24;

/// Upper bounds of the WAL file's size and a flag for the database file's, kept by the hook.
pub struct WalWatch {
    frame_bytes: u64,
    /// The most frames the log has held since the file was last truncated. The file never
    /// shrinks by itself below what was written (a restarted log overwrites it from the start),
    /// so this bounds its size.
    high_frames: AtomicU64,
    /// A checkpoint ran since the database file's size was last read: copying frames back is
    /// the only way that file changes size while the store owns it.
    db_file_changed: AtomicBool,
    /// The frames in the log at which a commit asks for a passive checkpoint.
    threshold: AtomicU64,
    /// Where the passive checkpoints go once a thread runs them (checkpointer.rs).
    background: OnceLock<Arc<Checkpointer>>,
    /// Held through every checkpoint the store runs but SQLite's own at close, so a truncating
    /// one never finds a background one busy with the WAL.
    running: Mutex<()>,
    /// The commit in progress is one a request waits for ([`WalWatch::sparing`]).
    sparing: AtomicBool,
    /// The frames in the log after the last commit.
    #[cfg(test)]
    frames_now: AtomicU64,
}

impl WalWatch {
    /// Installs the hook on the store's connection: it notes the frames after each commit and,
    /// once the log holds `checkpoint_frames`, checkpoints (passive, as SQLite's own automatic
    /// checkpoint does) or asks the store's checkpointer thread to. `wal_file` seeds the bound
    /// with a log left by an earlier run.
    pub fn install(
        conn: &mut Connection,
        page_size: u64,
        checkpoint_frames: u64,
        wal_file: &Path,
    ) -> rusqlite::Result<Arc<WalWatch>> {
        let frame_bytes = page_size + FRAME_HEADER_BYTES;
        let on_disk = std::fs::metadata(wal_file).map(|m| m.len()).unwrap_or(0);
        let watch = Arc::new(WalWatch {
            frame_bytes,
            high_frames: AtomicU64::new(on_disk.div_ceil(frame_bytes)),
            db_file_changed: AtomicBool::new(true),
            threshold: AtomicU64::new(checkpoint_frames),
            background: OnceLock::new(),
            running: Mutex::new(()),
            sparing: AtomicBool::new(false),
            #[cfg(test)]
            frames_now: AtomicU64::new(0),
        });
        let seen = watch.clone();
        conn.wal_hook(Some(
            move |wal: &mut rusqlite::hooks::Wal, frames: c_int| {
                let frames = frames.max(0) as u64;
                seen.high_frames.fetch_max(frames, Ordering::Relaxed);
                #[cfg(test)]
                seen.frames_now.store(frames, Ordering::Relaxed);
                if frames >= seen.threshold.load(Ordering::Relaxed)
                    && seen.background.get().map_or(Turn::Inline, |b| {
                        b.turn(frames, seen.sparing.load(Ordering::Relaxed))
                    }) == Turn::Inline
                {
                    seen.db_file_changed.store(true, Ordering::Relaxed);
                    // The commit already happened: an error here must not reach the statement that
                    // committed (its caller would take the write for failed). A checkpoint that
                    // could not finish is tried again after the next commit, as SQLite's would be.
                    let _one_checkpoint = seen.hold_checkpoints();
                    let _ = wal.checkpoint();
                }
                Ok(())
            },
        ))?;
        Ok(watch)
    }

    /// The WAL file's size is at most this.
    pub fn max_bytes(&self) -> u64 {
        match self.high_frames.load(Ordering::Relaxed) {
            0 => 0,
            frames => WAL_HEADER_BYTES + frames * self.frame_bytes,
        }
    }

    /// After a write that failed: the frames it wrote before the failure stay in the file,
    /// uncommitted, and no hook reported them. The file's size says how far it grew.
    pub fn measure(&self, wal_file: &Path) {
        let on_disk = std::fs::metadata(wal_file).map(|m| m.len()).unwrap_or(0);
        let frames = on_disk
            .saturating_sub(WAL_HEADER_BYTES)
            .div_ceil(self.frame_bytes);
        self.high_frames.fetch_max(frames, Ordering::Relaxed);
    }

    /// From now on the hook hands its checkpoints to `checkpointer` while its thread runs, at
    /// `checkpoint_frames`.
    pub fn hand_checkpoints_to(&self, checkpointer: Arc<Checkpointer>, checkpoint_frames: u64) {
        if self.background.set(checkpointer).is_ok() {
            self.threshold.store(checkpoint_frames, Ordering::Relaxed);
        }
    }

    /// Runs `commit`, a commit on the store's connection that a request waits for (the count of
    /// a send about to go out), so that it leaves the frames a caught-up checkpointer did not
    /// copy to the next commit ([`Checkpointer::turn`]): that copy syncs both files, a
    /// millisecond or more between an answer and the next request with the collector idle.
    /// The caller holds the connection, so no other commit of the store runs meanwhile.
    pub fn sparing<T>(&self, commit: impl FnOnce() -> T) -> T {
        struct Spared<'a>(&'a AtomicBool);
        impl Drop for Spared<'_> {
            fn drop(&mut self) {
                self.0.store(false, Ordering::Relaxed);
            }
        }
        self.sparing.store(true, Ordering::Relaxed);
        let _spared = Spared(&self.sparing);
        commit()
    }

    /// Keeps any other checkpoint of the store from running (and waits for one that is).
    pub fn hold_checkpoints(&self) -> MutexGuard<'_, ()> {
        crate::sync::lock(&self.running)
    }

    /// The frames in the log after the last commit.
    #[cfg(test)]
    pub fn frames_now(&self) -> u64 {
        self.frames_now.load(Ordering::Relaxed)
    }

    /// The frames at which a commit asks for a passive checkpoint.
    #[cfg(test)]
    pub fn threshold(&self) -> u64 {
        self.threshold.load(Ordering::Relaxed)
    }

    /// After a checkpoint on another connection: frames went back into the database file.
    pub fn checkpointed(&self) {
        self.db_file_changed.store(true, Ordering::Relaxed);
    }

    /// After a checkpoint that truncated the log to nothing.
    pub fn truncated(&self) {
        self.high_frames.store(0, Ordering::Relaxed);
        self.db_file_changed.store(true, Ordering::Relaxed);
    }

    /// Whether the database file may have changed size since this was last asked.
    pub fn take_db_file_changed(&self) -> bool {
        self.db_file_changed.swap(false, Ordering::Relaxed)
    }
}
