//! The WAL's passive checkpoints on a thread of their own (decision 0076).
//!
//! A checkpoint copies the WAL's pages back into the database and syncs both files: about 6 ms
//! for the 1,000 pages the store lets gather, measured while draining a backlog. Run by the
//! thread whose commit crossed that threshold (SQLite's way, and the store's before), it stalled
//! that thread: the delivery worker between an answer and the next request, with the collector
//! idle meanwhile, or the app's own thread inside a `durability = always` `track()`. A passive
//! checkpoint takes no lock a writer needs, so a second connection runs it beside the writers,
//! and the commit that asked for it returns at once.
//!
//! A spool with threads hands its checkpoints here ([`Store::checkpoint_in_background`]). A
//! stepped spool (the simulation) and the admin tools keep them in the committing thread, so a
//! simulated run stays a function of its seed. The truncating checkpoints (the disk cap, a
//! consent denial, the close) stay on the store's own connection, and wait for a background
//! one in progress ([`WalWatch::hold_checkpoints`]) instead of finding the WAL busy.

use std::path::PathBuf;
use std::sync::Condvar;
use std::thread::JoinHandle;

use super::*;

/// The checkpointer's side shared with the WAL hook (wal.rs) and the store.
pub(super) struct Checkpointer {
    phase: Mutex<Phase>,
    wake: Condvar,
    /// The store's count of failed checkpoints; the commits that asked for them stood.
    errors: Arc<AtomicU64>,
    /// The frames the last caught-up checkpoint copied back (the log's length then).
    copied: AtomicU64,
}

/// The most frames a commit's thread copies back itself after the checkpointer caught up
/// ([`Phase::CaughtUp`]); past it, the thread takes another turn. Draining a backlog adds a
/// handful while a turn runs; a stream of one-event commits (`durability = always`) can add
/// hundreds, which is the stall this module exists to keep off that thread.
const REMAINDER_FRAMES_MAX: u64 = 64;

/// Where the checkpointer is between two restarts of the log.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// Nothing asked.
    Idle,
    /// A commit found the log past the threshold; the thread has not started on it yet.
    Asked,
    /// The thread is checkpointing.
    Running,
    /// The thread copied back every frame the log held when it started. The log starts over
    /// only at a write that begins with every frame copied back, and commits made meanwhile
    /// added frames: the next commit's thread copies those itself when they are few
    /// ([`REMAINDER_FRAMES_MAX`]), so the write after it starts the log over.
    CaughtUp,
    /// No thread (stopped, or its connection could not be opened): the writers checkpoint.
    Stopped,
}

/// What the thread of a commit that found the log past the threshold does.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Turn {
    /// Nothing: the checkpointer has it.
    Handed,
    /// Nothing now: the frames left after the checkpointer caught up are the next commit's
    /// to copy, this one being a commit a request waits for ([`WalWatch::sparing`]).
    Deferred,
    /// Checkpoint now, on the committing connection.
    Inline,
}

impl Checkpointer {
    fn new(errors: Arc<AtomicU64>) -> Checkpointer {
        Checkpointer {
            phase: Mutex::new(Phase::Idle),
            wake: Condvar::new(),
            errors,
            copied: AtomicU64::new(0),
        }
    }

    /// Called by the WAL hook after a commit that left `frames` in the log, past the
    /// threshold; `sparing` when a request waits for that commit.
    pub(super) fn turn(&self, frames: u64, sparing: bool) -> Turn {
        let mut phase = lock(&self.phase);
        match *phase {
            Phase::CaughtUp
                if frames.saturating_sub(self.copied.load(Ordering::Relaxed))
                    <= REMAINDER_FRAMES_MAX =>
            {
                if sparing {
                    return Turn::Deferred;
                }
                *phase = Phase::Idle;
                Turn::Inline
            }
            Phase::Idle | Phase::CaughtUp => {
                *phase = Phase::Asked;
                self.wake.notify_one();
                Turn::Handed
            }
            Phase::Asked | Phase::Running => Turn::Handed,
            Phase::Stopped => Turn::Inline,
        }
    }

    /// Waits until asked; `false` once stopped.
    fn next_turn(&self) -> bool {
        let mut phase = lock(&self.phase);
        loop {
            match *phase {
                Phase::Stopped => return false,
                Phase::Asked => {
                    *phase = Phase::Running;
                    return true;
                }
                _ => phase = self.wake.wait(phase).unwrap_or_else(|p| p.into_inner()),
            }
        }
    }

    /// After a checkpoint: caught up when it copied back the whole log (`copied` frames),
    /// else idle (the next commit asks again). A stop that came meanwhile stands.
    fn finished(&self, copied: Option<u64>) {
        let mut phase = lock(&self.phase);
        if *phase == Phase::Running {
            *phase = match copied {
                Some(frames) => {
                    self.copied.store(frames, Ordering::Relaxed);
                    Phase::CaughtUp
                }
                None => Phase::Idle,
            };
        }
    }

    fn stop(&self) {
        *lock(&self.phase) = Phase::Stopped;
        self.wake.notify_one();
    }

    fn run(&self, path: PathBuf, faults: FaultPoint, wal: Arc<WalWatch>) {
        let conn = match connect(&path, &faults) {
            Ok(conn) => conn,
            Err(e) => {
                self.errors.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(error = %e, path = %path.display(), "cannot open a connection for background checkpoints; the writers checkpoint");
                self.stop();
                return;
            }
        };
        while self.next_turn() {
            let _one_checkpoint = wal.hold_checkpoints();
            // (busy, frames in the log, frames copied back); busy when a reader still uses
            // older frames.
            let result = conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |r| {
                Ok((
                    r.get::<_, i64>(0)?,
                    r.get::<_, i64>(1)?,
                    r.get::<_, i64>(2)?,
                ))
            });
            match result {
                Ok((busy, log, copied)) => {
                    wal.checkpointed();
                    let whole = busy == 0 && copied == log;
                    self.finished(whole.then_some(copied.max(0) as u64));
                }
                Err(e) => {
                    self.errors.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(error = %e, path = %path.display(), "background checkpoint failed; the writes stand");
                    self.finished(None);
                }
            }
        }
    }
}

/// The checkpointer's connection: through the same fault point as the store's, reading the WAL
/// once so the checkpoint finds it open. It holds no transaction between checkpoints.
fn connect(path: &Path, faults: &FaultPoint) -> rusqlite::Result<Connection> {
    let conn = faults.open(path)?;
    conn.busy_timeout(schema::BUSY_TIMEOUT)?;
    conn.pragma_update(None, "synchronous", schema::SYNCHRONOUS)?;
    conn.pragma_update(None, "cache_size", CHECKPOINTER_CACHE_PAGES)?;
    conn.query_row("SELECT count(*) FROM sqlite_schema", [], |_| Ok(()))?;
    Ok(conn)
}

/// A checkpoint copies pages from file to file without the page cache; the connection needs
/// only what reading the schema takes.
const CHECKPOINTER_CACHE_PAGES: i64 = 16;

/// The thread and its shared side, owned by the store, which stops and joins the thread when
/// it is given up or dropped.
pub(super) struct Background {
    shared: Arc<Checkpointer>,
    thread: Option<JoinHandle<()>>,
}

impl Background {
    pub(super) fn stop(&mut self) {
        self.shared.stop();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Store {
    /// From now on the WAL's passive checkpoints run on a thread of the store's own instead of
    /// in the thread whose commit asked for one. Once per store: later calls, and calls after
    /// [`Store::stop_background_checkpoints`], do nothing. An error leaves them where they were.
    pub fn checkpoint_in_background(&self) -> std::io::Result<()> {
        let mut background = lock(&self.background);
        if background.is_some() {
            return Ok(());
        }
        let shared = Arc::new(Checkpointer::new(self.checkpoint_errors.clone()));
        let (path, faults, wal) = (self.path.clone(), self.faults.clone(), self.wal.clone());
        let runner = shared.clone();
        let thread = std::thread::Builder::new()
            .name("eventspool-checkpoint".into())
            .spawn(move || runner.run(path, faults, wal))?;
        self.wal.hand_checkpoints_to(
            shared.clone(),
            checkpoint_frames(self.budget, self.page_size, true),
        );
        *background = Some(Background {
            shared,
            thread: Some(thread),
        });
        Ok(())
    }

    /// Stops the background checkpoints for good (the store is given up): the writers, if
    /// any, checkpoint in their own threads again.
    pub(super) fn stop_background_checkpoints(&self) {
        if let Some(background) = lock(&self.background).as_mut() {
            background.stop();
        }
    }
}

impl Drop for Store {
    /// The checkpointer's connection closes before the store's, so the store's close is the
    /// last one and runs SQLite's checkpoint at close, as without it.
    fn drop(&mut self) {
        self.stop_background_checkpoints();
    }
}

#[cfg(test)]
impl Store {
    /// Whether the checkpointer's last turn copied back the whole log and waits for a commit
    /// to copy the rest ([`Phase::CaughtUp`]).
    pub(super) fn checkpointer_caught_up(&self) -> bool {
        lock(&self.background)
            .as_ref()
            .is_some_and(|b| *lock(&b.shared.phase) == Phase::CaughtUp)
    }

    /// Whether the checkpointer's thread is gone (stopped, or never started).
    pub(super) fn checkpointer_stopped(&self) -> bool {
        lock(&self.background)
            .as_ref()
            .is_none_or(|b| *lock(&b.shared.phase) == Phase::Stopped && b.thread.is_none())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The turns of a checkpointer whose thread copied back a log of 300 frames while commits
    /// went on: a few frames more are the committing thread's to copy (then the log starts
    /// over at the next write), unless a request waits for that commit; many more go back to
    /// the thread.
    #[test]
    fn after_catching_up_a_commit_copies_a_few_frames_itself_and_hands_many_back() {
        let c = Checkpointer::new(Arc::new(AtomicU64::new(0)));
        assert_eq!(c.turn(300, false), Turn::Handed);
        assert_eq!(
            c.turn(310, false),
            Turn::Handed,
            "asked once, whatever the commits since"
        );
        assert!(c.next_turn());
        c.finished(Some(300));
        assert_eq!(
            c.turn(300 + REMAINDER_FRAMES_MAX, true),
            Turn::Deferred,
            "a commit a request waits for leaves the remainder to the next"
        );
        assert_eq!(*lock(&c.phase), Phase::CaughtUp);
        assert_eq!(c.turn(300 + REMAINDER_FRAMES_MAX, false), Turn::Inline);
        assert_eq!(*lock(&c.phase), Phase::Idle);

        assert_eq!(c.turn(400, false), Turn::Handed);
        assert!(c.next_turn());
        c.finished(Some(400));
        assert_eq!(c.turn(401 + REMAINDER_FRAMES_MAX, true), Turn::Handed);
        assert_eq!(*lock(&c.phase), Phase::Asked);

        assert!(c.next_turn());
        c.finished(None);
        assert_eq!(
            *lock(&c.phase),
            Phase::Idle,
            "a partial turn is not caught up"
        );
        c.stop();
        assert!(!c.next_turn());
        assert_eq!(
            c.turn(1_000, false),
            Turn::Inline,
            "without a thread, the writer checkpoints"
        );
    }
}
