//! The background checkpoints (checkpointer.rs): a commit past the threshold does not wait for
//! the checkpoint, nor does the commit a request waits for copy what a caught-up checkpointer
//! left, the log still starts over, a failure is counted and the writes stand, and giving the
//! store up stops the thread.

use std::sync::mpsc;
use std::time::{Duration, Instant};

use super::faults::{FaultError, FaultSite, StoreFaults};
use super::tests::event;
use super::*;

/// A cap whose WAL share makes the thresholds small: 16 MiB gives a quarter to the WAL; the
/// checkpointer starts at a quarter of that (256 pages of 4 KiB), the disk cap's truncating
/// checkpoint at half.
const CAP: u64 = 16 << 20;

/// How long a test waits for the checkpointer's thread before it calls it stuck: far more than
/// a checkpoint of a few dozen pages takes, however busy the machine.
const PATIENCE: Duration = Duration::from_secs(20);

/// Inserts `rows` events of about 1 KB from `first`, ten to a transaction.
fn insert(store: &Store, first: u64, rows: u64) {
    let events: Vec<_> = (first..first + rows).map(|seq| event(seq, 1_000)).collect();
    for chunk in events.chunks(10) {
        store.insert(chunk).unwrap();
    }
}

/// Inserts from `first` until a commit leaves the log past the threshold (it asked for a
/// checkpoint); returns the next seq.
fn fill_past_threshold(store: &Store, first: u64) -> u64 {
    let mut next = first;
    // Bounded: each turn adds ten rows of about 1 KB, a few pages.
    while store.wal.frames_now() < store.wal.threshold() && next < first + 10_000 {
        insert(store, next, 10);
        next += 10;
    }
    next
}

/// Polls `done` until it holds, for at most [`PATIENCE`].
fn wait_for(what: &str, done: impl Fn() -> bool) {
    let deadline = Instant::now() + PATIENCE;
    while !done() {
        assert!(Instant::now() < deadline, "waited {PATIENCE:?} for {what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

fn open_background(path: &Path, faults: FaultPoint) -> Store {
    let store = Store::open_with(path, CAP, 0, Keyring::plain(), faults)
        .unwrap()
        .store;
    store.checkpoint_in_background().unwrap();
    store
}

/// A checkpoint that takes long (here: held by the test, as a slow disk would hold it) is not
/// the committing thread's wait, and once it is done the log starts over as before: the
/// commit after the checkpointer caught up copies the few frames added meanwhile itself.
#[test]
fn a_commit_past_the_threshold_leaves_the_checkpoint_to_its_thread_and_the_log_starts_over() {
    let dir = tempfile::tempdir().unwrap();
    let store = open_background(&dir.path().join("s.db"), FaultPoint::default());
    let held = store.wal.hold_checkpoints();
    let mut rows = 0;
    let (done_tx, done_rx) = mpsc::channel();
    std::thread::scope(|scope| {
        scope.spawn(|| done_tx.send(fill_past_threshold(&store, 1)).unwrap());
        let returned = done_rx.recv_timeout(PATIENCE);
        drop(held);
        let Ok(next) = returned else {
            panic!("the commit past the threshold waited for the checkpoint held meanwhile");
        };
        rows = next - 1;
    });
    let threshold = store.wal.threshold();
    assert_eq!(threshold, 256);
    assert!(
        store.wal.frames_now() >= threshold,
        "the log is not past the threshold ({} frames): the test proves nothing",
        store.wal.frames_now()
    );
    wait_for("the checkpointer to catch up", || {
        store.checkpointer_caught_up()
    });
    // The commit that copies the remainder, then the write that starts the log over.
    insert(&store, rows + 1, 20);
    assert!(
        store.wal.frames_now() < threshold,
        "the log did not start over: {} frames after the checkpointer caught up",
        store.wal.frames_now()
    );
    assert_eq!(store.checkpoint_errors(), 0);
    assert_eq!(store.len(), rows + 20);
}

/// A background checkpoint that fails is counted; the commits that asked for it stood, and
/// the rows are all there.
#[test]
fn a_failing_background_checkpoint_is_counted_and_the_writes_stand() {
    let dir = tempfile::tempdir().unwrap();
    let faults = StoreFaults::new();
    let store = open_background(
        &dir.path().join("s.db"),
        FaultPoint::new(Some(faults.clone())),
    );
    faults.fail_next(FaultSite::Checkpoint, 1_000_000, FaultError::IoErr);
    let rows = fill_past_threshold(&store, 1) - 1;
    wait_for("the failed checkpoint to be counted", || {
        store.checkpoint_errors() > 0
    });
    assert!(faults.injected(FaultSite::Checkpoint) > 0);
    faults.disarm();
    assert_eq!(store.len(), rows);
    assert_eq!(store.oldest(100_000).unwrap().len() as u64, rows);
}

/// A store given up stops its checkpointer (no thread of the old owner touches the file once
/// another may own it); its writers, if any, checkpoint in their own threads again.
#[test]
fn giving_the_store_up_stops_its_checkpointer() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.db");
    let store = open_background(&path, FaultPoint::default());
    let rows = fill_past_threshold(&store, 1) - 1;
    assert!(!store.checkpointer_stopped());
    store.release_ownership();
    assert!(store.checkpointer_stopped());
    let next = Store::open(&path, CAP, 0, Keyring::plain()).unwrap().store;
    assert_eq!(next.len(), rows);
}

/// The count of a send about to go out (`note_sending`) is a commit the request waits for:
/// after the checkpointer caught up, it leaves the frames added since to the next commit
/// instead of copying them itself (held here by the test, as a slow disk would hold them). The
/// next commit copies them, and the log still starts over.
#[test]
fn the_commit_a_request_waits_for_leaves_the_remainder_to_the_next_commit() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.db");
    let store = open_background(&path, FaultPoint::default());
    // A reader that began before the checkpoint keeps the log from starting over, so the next
    // commit adds frames past the ones the checkpointer copied: the remainder a committing
    // thread would copy.
    let held = store.wal.hold_checkpoints();
    let rows = fill_past_threshold(&store, 1) - 1;
    let reader = Connection::open(&path).unwrap();
    reader.execute_batch("BEGIN").unwrap();
    let seen: i64 = reader
        .query_row("SELECT count(*) FROM events", [], |r| r.get(0))
        .unwrap();
    assert_eq!(seen as u64, rows);
    drop(held);
    let threshold = store.wal.threshold();
    wait_for("the checkpointer to catch up", || {
        store.checkpointer_caught_up()
    });
    let held = store.wal.hold_checkpoints();
    let (done_tx, done_rx) = mpsc::channel();
    std::thread::scope(|scope| {
        scope.spawn(|| done_tx.send(store.note_sending(&[1, 2, 3])).unwrap());
        let returned = done_rx.recv_timeout(PATIENCE);
        drop(held);
        match returned {
            Ok(written) => written.unwrap(),
            Err(_) => panic!("the send count waited for the checkpoint held meanwhile"),
        }
    });
    assert!(
        store.wal.frames_now() >= threshold,
        "the log started over at the send count ({} frames): the test proves nothing",
        store.wal.frames_now()
    );
    assert!(
        store.checkpointer_caught_up(),
        "the send count took the remainder over"
    );
    reader.execute_batch("COMMIT").unwrap();
    // The commit that copies the remainder, then the write that starts the log over.
    insert(&store, rows + 1, 20);
    assert!(
        store.wal.frames_now() < threshold,
        "the log did not start over: {} frames after the checkpointer caught up",
        store.wal.frames_now()
    );
    assert_eq!(store.len(), rows + 20);
}
