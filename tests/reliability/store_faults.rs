//! Damaged, foreign, full, read-only and doubly-opened stores.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use eventspool::{DeliveryStatus, Durability, Error, EventSpool, NewEvent, Notice};
use eventspool_collector::{CollectorConfig, ReferenceCollector};
use serde_json::json;

use crate::common::{fast_config, integrity_ok};
use crate::reentrant::Reentrant;
use crate::tinyfs::{TinyFs, fill};

/// Records notices so a test can check what the app was told.
#[derive(Default)]
struct Notices(Mutex<Vec<Notice>>);

impl eventspool::DeliveryObserver for Notices {
    fn on_state(&self, _: &DeliveryStatus) {}
    fn on_notice(&self, notice: &Notice) {
        self.0.lock().unwrap().push(notice.clone());
    }
}

fn store_with_events(db: &Path, url: &str, n: usize) {
    let mut c = fast_config(url);
    c.db_path = Some(db.into());
    let spool = EventSpool::builder(c).start_offline().open().unwrap();
    for i in 0..n {
        spool.track("old", json!({"i": i})).unwrap();
    }
    spool.shutdown(Duration::from_secs(5)).unwrap();
}

/// Opens the damaged file and checks: moved aside intact, fresh store, reported, still works.
fn opens_after_moving_aside(db: &Path, collector: &ReferenceCollector, what: &str) {
    let original = std::fs::read(db).unwrap();
    let notices = Arc::new(Notices::default());
    let mut c = fast_config(&collector.url());
    c.db_path = Some(db.into());
    let spool = EventSpool::builder(c)
        .observer(notices.clone())
        .open()
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    assert_eq!(spool.stats().stores_recovered, 1, "{what}: not counted");
    let moved: PathBuf = match notices.0.lock().unwrap().first() {
        Some(Notice::StoreRecovered { moved_to, .. }) => moved_to.into(),
        other => panic!("{what}: no StoreRecovered notice: {other:?}"),
    };
    assert!(
        moved
            .file_name()
            .unwrap()
            .to_string_lossy()
            .contains(".unusable-"),
        "{what}: {moved:?}"
    );
    assert!(
        std::fs::read(&moved).unwrap() == original,
        "{what}: the unusable file was not kept as it was"
    );
    let before = collector.distinct_count();
    for i in 0..5 {
        spool.track("after_recovery", json!({"i": i})).unwrap();
    }
    spool.persist().unwrap();
    assert!(
        spool.wait_drained(Duration::from_secs(10)),
        "{what}: fresh store does not deliver"
    );
    assert_eq!(collector.distinct_count(), before + 5, "{what}");
    spool.shutdown(Duration::from_secs(5)).unwrap();
    integrity_ok(db).unwrap();
}

#[test]
fn corrupt_and_foreign_stores_are_moved_aside_never_deleted() {
    let collector = ReferenceCollector::start(CollectorConfig::default()).unwrap();
    let dir = tempfile::tempdir().unwrap();

    let db = dir.path().join("random.db");
    let mut rng = fastrand::Rng::with_seed(7);
    std::fs::write(&db, (0..16384).map(|_| rng.u8(..)).collect::<Vec<u8>>()).unwrap();
    opens_after_moving_aside(&db, &collector, "random bytes");

    let db = dir.path().join("truncated.db");
    store_with_events(&db, &collector.url(), 300);
    let _ = std::fs::remove_file(format!("{}-wal", db.display()));
    let len = std::fs::metadata(&db).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&db)
        .unwrap()
        .set_len(len / 2 + 7)
        .unwrap();
    opens_after_moving_aside(&db, &collector, "truncated file");

    let db = dir.path().join("foreign.db");
    let conn = rusqlite::Connection::open(&db).unwrap();
    conn.execute_batch("CREATE TABLE users (name TEXT); INSERT INTO users VALUES ('precious');")
        .unwrap();
    drop(conn);
    opens_after_moving_aside(&db, &collector, "another schema");

    let db = dir.path().join("newer.db");
    store_with_events(&db, &collector.url(), 3);
    let conn = rusqlite::Connection::open(&db).unwrap();
    conn.pragma_update(None, "user_version", 99).unwrap();
    conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
        .unwrap();
    drop(conn);
    opens_after_moving_aside(&db, &collector, "newer schema version");
}

#[test]
fn a_second_handle_on_one_store_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = fast_config("http://127.0.0.1:9/v1/batch");
    c.db_path = Some(dir.path().join("events.db"));
    let first = EventSpool::builder(c.clone())
        .start_offline()
        .open()
        .unwrap();
    let err = EventSpool::builder(c.clone())
        .start_offline()
        .open()
        .err()
        .expect("second handle was not refused");
    let text = err.to_string();
    assert!(
        text.contains("already open") && text.contains("events.db"),
        "unclear error: {text}"
    );
    first.track("kept", json!({})).unwrap();
    first.shutdown(Duration::from_secs(5)).unwrap();
    drop(first);
    let again = EventSpool::builder(c).start_offline().open().unwrap();
    assert_eq!(again.stats().restored, 1);
}

/// `shutdown()` releases the store even while clones of the handle are still alive (an FFI
/// object or a clone held by another thread), so the app can reopen it.
#[test]
fn shutdown_releases_the_store_for_a_new_handle() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = fast_config("http://127.0.0.1:9/v1/batch");
    c.db_path = Some(dir.path().join("events.db"));
    let first = EventSpool::builder(c.clone())
        .start_offline()
        .open()
        .unwrap();
    let clone = first.clone();
    first.track("kept", json!({})).unwrap();
    first.shutdown(Duration::from_secs(5)).unwrap();
    let again = EventSpool::builder(c).start_offline().open();
    assert!(
        again.is_ok(),
        "reopen after shutdown() refused: {:?}",
        again.err().map(|e| e.to_string())
    );
    assert_eq!(again.unwrap().stats().restored, 1);
    drop(clone);
}

#[test]
fn a_store_path_that_cannot_exist_is_refused_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("plain-file");
    std::fs::write(&file, b"not a directory").unwrap();
    let mut c = fast_config("http://127.0.0.1:9/v1/batch");
    c.db_path = Some(file.join("events.db"));
    let err = EventSpool::open(c)
        .err()
        .expect("opened a store under a regular file");
    assert!(
        err.to_string().contains("plain-file"),
        "error does not name the path: {err}"
    );
}

fn full_disk() {
    let fs = TinyFs::mount(1024 * 1024);
    let collector = ReferenceCollector::start(CollectorConfig::default()).unwrap();
    let notices = Arc::new(Notices::default());
    let mut c = fast_config(&collector.url());
    c.db_path = Some(fs.path().join("events.db"));
    c.memory_capacity = 50;
    let spool = EventSpool::builder(c)
        .observer(notices.clone())
        .start_offline()
        .open()
        .unwrap();
    // Some events reach the store while there is room.
    for i in 0..200 {
        spool.track("before", json!({"i": i})).unwrap();
    }
    spool.persist().unwrap();
    let stored = spool.stats().pending_disk;
    assert!(stored > 0);
    let filler = fill(fs.path());
    // The disk refuses: track() still works, in memory, and the condition is visible.
    for i in 0..500 {
        spool
            .track("during", json!({"i": i, "pad": "x".repeat(200)}))
            .unwrap();
    }
    assert!(
        spool.persist().is_err(),
        "persist() claimed success on a full disk"
    );
    let stats = spool.stats();
    assert!(
        stats.store_errors > 0,
        "store errors not counted: {stats:?}"
    );
    assert!(stats.balances(), "{stats:?}");
    assert!(
        notices
            .0
            .lock()
            .unwrap()
            .iter()
            .any(|n| matches!(n, Notice::StoreUnavailable { .. })),
        "no StoreUnavailable notice"
    );
    // Delivery of what is stored goes on meanwhile.
    spool.set_online(true);
    let got = collector.wait_for_distinct(stored, Duration::from_secs(20));
    assert!(
        got,
        "stored events were not delivered while the disk was full"
    );
    // Space returns: spilling resumes and everything drains.
    std::fs::remove_file(filler).unwrap();
    let errors = spool.stats().store_errors;
    spool.persist().unwrap();
    assert!(
        spool.wait_drained(Duration::from_secs(30)),
        "did not drain after space returned: {:?}",
        spool.stats()
    );
    let stats = spool.stats();
    assert_eq!(collector.distinct_count(), 700, "{stats:?}");
    assert_eq!(stats.delivered, 700, "{stats:?}");
    assert!(stats.balances(), "{stats:?}");
    assert_eq!(stats.panics, 0);
    eprintln!(
        "full disk: store_errors {} while full, requests {}, collector received {} distinct {}",
        errors,
        stats.requests,
        collector.received_count(),
        collector.distinct_count()
    );
    spool.shutdown(Duration::from_secs(5)).unwrap();
    integrity_ok(&fs.path().join("events.db")).unwrap();
}

#[test]
fn full_disk_keeps_tracking_in_memory_and_resumes() {
    full_disk();
}

/// A store on a read-only file system cannot be opened: construction is refused with an error
/// naming the path (the app decides whether to run without `db_path`), rather than silently
/// running memory-only while the app believes its events are kept.
#[test]
fn read_only_location_is_refused_naming_the_path() {
    let fs = TinyFs::mount(1024 * 1024);
    let mut c = fast_config("http://127.0.0.1:9/v1/batch");
    c.db_path = Some(fs.path().join("events.db"));
    let spool = EventSpool::builder(c.clone())
        .start_offline()
        .open()
        .unwrap();
    spool.track("kept", json!({})).unwrap();
    spool.shutdown(Duration::from_secs(5)).unwrap();
    drop(spool);
    fs.remount("ro");
    for path in [fs.path().join("events.db"), fs.path().join("new.db")] {
        c.db_path = Some(path.clone());
        let err = EventSpool::builder(c.clone())
            .start_offline()
            .open()
            .err()
            .expect("opened a store on a read-only fs");
        assert!(
            err.to_string().contains(&path.display().to_string()),
            "error does not name the path: {err}"
        );
    }
    fs.remount("rw");
    c.db_path = Some(fs.path().join("events.db"));
    let spool = EventSpool::builder(c).start_offline().open().unwrap();
    assert_eq!(
        spool.stats().restored,
        1,
        "the store was damaged by the read-only attempt"
    );
}

/// With `durability = always`, an event the store could not take is never reported as durable:
/// `track()` names it in `Error::NotDurable`, it stays queued in memory, reaches the store once
/// space returns, and is delivered with its id.
#[test]
fn durability_always_names_the_events_a_full_disk_kept_in_memory_only() {
    let fs = TinyFs::mount(1024 * 1024);
    let collector = ReferenceCollector::start(CollectorConfig::default()).unwrap();
    let mut c = fast_config(&collector.url());
    c.db_path = Some(fs.path().join("events.db"));
    c.durability = Durability::Always;
    let spool = EventSpool::builder(c).start_offline().open().unwrap();
    let mut tracked = vec![spool.track("before", json!({})).unwrap()];
    assert_eq!(
        spool.stats().pending_disk,
        1,
        "`always` returned before the commit"
    );

    let filler = fill(fs.path());
    let mut not_durable = Vec::new();
    for i in 0..2_000 {
        match spool.track("during", json!({"i": i, "pad": "x".repeat(200)})) {
            Ok(id) => tracked.push(id),
            Err(Error::NotDurable { event_ids, reason }) => {
                assert_eq!(event_ids.len(), 1, "{event_ids:?}");
                assert!(reason.contains("store"), "reason says nothing: {reason}");
                tracked.extend(&event_ids);
                not_durable.extend(event_ids);
                if not_durable.len() >= 20 {
                    break;
                }
            }
            Err(e) => panic!("track() on a full disk failed otherwise: {e}"),
        }
    }
    assert!(
        !not_durable.is_empty(),
        "2,000 events on a full 1 MiB disk and track() never said one was not durable"
    );
    let batch = vec![NewEvent::new("batch", json!({"pad": "y".repeat(200)})); 3];
    match spool.track_batch(&batch) {
        Ok(ids) => tracked.extend(ids),
        Err(Error::NotDurable { event_ids, .. }) => {
            assert_eq!(event_ids.len(), 3, "a batch names all its events");
            tracked.extend(event_ids);
        }
        Err(e) => panic!("track_batch() on a full disk failed otherwise: {e}"),
    }
    let stats = spool.stats();
    assert_eq!(stats.pending, tracked.len() as u64, "{stats:?}");
    assert!(stats.store_errors > 0, "{stats:?}");

    // Space returns: the next commit takes the events kept in memory along with the new one.
    std::fs::remove_file(filler).unwrap();
    tracked.push(spool.track("after", json!({})).unwrap());
    let stats = spool.stats();
    assert_eq!(
        stats.pending_disk,
        tracked.len() as u64,
        "events kept in memory did not reach the store once it had room: {stats:?}"
    );
    spool.set_online(true);
    assert!(
        spool.wait_drained(Duration::from_secs(30)),
        "{:?}",
        spool.stats()
    );
    for id in &not_durable {
        assert!(collector.contains(&id.to_string()), "{id} never delivered");
    }
    assert_eq!(collector.distinct_count(), tracked.len() as u64);
    eprintln!(
        "always on a full disk: {} of {} events reported not durable, all {} delivered",
        not_durable.len() + 3,
        tracked.len(),
        collector.distinct_count()
    );
    spool.shutdown(Duration::from_secs(5)).unwrap();
    integrity_ok(&fs.path().join("events.db")).unwrap();
}

/// A full disk makes the spool tell the app `StoreUnavailable`; the observer calls every verb
/// of the API from inside `on_notice` (`persist()`, `purge_pending()`, `quarantine_redrive()`,
/// `shutdown()`, ...) and each returns: no notice is delivered with a lock held, from the spill
/// thread or the worker, with either durability.
#[test]
fn an_observer_may_call_every_verb_from_on_notice() {
    for durability in [Durability::Spill, Durability::Always] {
        let fs = TinyFs::mount(1024 * 1024);
        let collector = ReferenceCollector::start(CollectorConfig::default()).unwrap();
        let mut c = fast_config(&collector.url());
        c.db_path = Some(fs.path().join("events.db"));
        c.memory_capacity = 10;
        c.durability = durability;
        // Offline, so every event past the ten in memory must go through the store: a worker
        // that keeps up with the tracker on a busy machine would otherwise leave nothing to
        // spill, and the test would wait for a notice that never comes.
        let spool = EventSpool::builder(c).start_offline().open().unwrap();
        let (observer, rx) = Reentrant::new(true);
        observer.spool.set(spool.clone()).ok().unwrap();
        let _observer = spool.add_observer(observer.clone());
        spool.track("before", json!({})).unwrap();
        let filler = fill(fs.path());
        // Overflow reaches the spill thread (or, with `always`, every event does); the store
        // refuses and the notice goes out.
        // Bounded, and it stops once the observer fired: pages SQLite allocated before the disk
        // filled are reused first, so how many events it takes to reach a refusal varies.
        let tracker = {
            let spool = spool.clone();
            let observer = observer.clone();
            std::thread::spawn(move || {
                for i in 0..20_000 {
                    if observer.fired.load(std::sync::atomic::Ordering::SeqCst) {
                        break;
                    }
                    match spool.track("during", json!({"i": i, "pad": "x".repeat(200)})) {
                        Ok(_) | Err(Error::NotDurable { .. }) => {}
                        Err(Error::ShutDown) => break,
                        Err(e) => panic!("track() failed otherwise: {e}"),
                    }
                }
            })
        };
        let what = observer.assert_returned(&rx, Duration::from_secs(30));
        assert!(what.contains("StoreUnavailable"), "{durability:?}: {what}");
        tracker.join().unwrap();
        assert!(
            matches!(spool.track("after", json!({})), Err(Error::ShutDown)),
            "{durability:?}: shutdown() from on_notice did not take effect"
        );
        std::fs::remove_file(filler).unwrap();
    }
}

/// `durability = always` on a full disk: the events the store refused are delivered while the
/// collector is reachable (the disk still full), and the memory they take is bounded, the
/// excess counted as `memory_overflow`.
#[test]
fn durability_always_on_a_full_disk_delivers_and_bounds_memory() {
    let fs = TinyFs::mount(1024 * 1024);
    let collector = ReferenceCollector::start(CollectorConfig::default()).unwrap();
    let mut c = fast_config(&collector.url());
    c.db_path = Some(fs.path().join("events.db"));
    c.durability = Durability::Always;
    c.memory_capacity = 100;
    let spool = EventSpool::builder(c).start_offline().open().unwrap();
    spool.track("before", json!({})).unwrap();
    let filler = fill(fs.path());
    let mut refused = 0u64;
    for round in 0..25 {
        let batch: Vec<NewEvent> = (0..1_000)
            .map(|i| NewEvent::new("during", json!({"round": round, "i": i})))
            .collect();
        match spool.track_batch(&batch) {
            Err(Error::NotDurable { event_ids, .. }) => refused += event_ids.len() as u64,
            Ok(_) => {}
            Err(e) => panic!("track_batch() on a full disk failed otherwise: {e}"),
        }
    }
    assert!(refused > 20_000, "the full disk took the events? {refused}");
    let stats = spool.stats();
    assert!(
        stats.pending_memory <= eventspool::SPILL_BACKLOG_MIN as u64,
        "memory grows without bound on a full disk: {} events held: {stats:?}",
        stats.pending_memory
    );
    assert!(stats.balances(), "{stats:?}");
    let kept = stats.pending;
    // The collector is reachable while the disk stays full: what memory holds goes out.
    spool.set_online(true);
    assert!(
        spool.wait_drained(Duration::from_secs(60)),
        "events the store refused were not delivered: {:?}",
        spool.stats()
    );
    let stats = spool.stats();
    assert_eq!(stats.delivered, kept, "{stats:?}");
    assert_eq!(collector.distinct_count(), kept);
    assert_eq!(
        stats.dropped(eventspool::DropReason::MemoryOverflow),
        1 + 25_000 - kept,
        "{stats:?}"
    );
    assert!(stats.balances(), "{stats:?}");
    eprintln!(
        "always on a full disk: {refused} refused by the store, {kept} kept in memory and delivered"
    );
    std::fs::remove_file(filler).unwrap();
    spool.shutdown(Duration::from_secs(5)).unwrap();
    integrity_ok(&fs.path().join("events.db")).unwrap();
}

/// A `track_batch` larger than memory on a full disk (`durability = spill`) is refused whole,
/// saying why, rather than recorded in part: nothing of it is counted or queued.
#[test]
fn a_track_batch_the_full_disk_cannot_take_is_refused_whole() {
    let fs = TinyFs::mount(1024 * 1024);
    let collector = ReferenceCollector::start(CollectorConfig::default()).unwrap();
    let notices = Arc::new(Notices::default());
    let mut c = fast_config(&collector.url());
    c.db_path = Some(fs.path().join("events.db"));
    c.memory_capacity = 100;
    let spool = EventSpool::builder(c)
        .observer(notices.clone())
        .start_offline()
        .open()
        .unwrap();
    let filler = fill(fs.path());
    // Memory holds 100 queued plus 10,000 waiting to spill; the rest must go to the store.
    let batch: Vec<NewEvent> = (0..11_000)
        .map(|i| NewEvent::new("bulk", json!({"i": i})))
        .collect();
    let err = spool
        .track_batch(&batch)
        .expect_err("a batch a full disk cannot take returned Ok");
    assert!(
        matches!(err, Error::BatchRefused(_)) && err.to_string().contains("store"),
        "{err}"
    );
    let stats = spool.stats();
    assert_eq!((stats.tracked, stats.pending), (0, 0), "{stats:?}");
    assert_eq!(stats.dropped_from_queue(), 0, "{stats:?}");
    assert!(
        notices
            .0
            .lock()
            .unwrap()
            .iter()
            .any(|n| matches!(n, Notice::StoreUnavailable { .. })),
        "no StoreUnavailable notice"
    );
    std::fs::remove_file(filler).unwrap();
    assert_eq!(spool.track_batch(&batch).unwrap().len(), 11_000);
    assert_eq!(spool.stats().dropped_from_queue(), 0);
}

/// A clock whose `wall_ms()` blocks on the thread named `verb` until released: a verb that
/// reads the clock between its `closed` check and its write is held exactly there.
struct GateClock {
    inner: Arc<eventspool::ManualClock>,
    gate: Mutex<(bool, bool)>,
    changed: std::sync::Condvar,
}

impl GateClock {
    fn new() -> Arc<GateClock> {
        Arc::new(GateClock {
            inner: Arc::new(eventspool::ManualClock::new(1_764_417_600_000)),
            gate: Mutex::new((false, false)),
            changed: std::sync::Condvar::new(),
        })
    }

    /// Waits (bounded) until the verb thread is held in `wall_ms`.
    fn wait_held(&self) {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        let mut g = self.gate.lock().unwrap();
        while !g.0 {
            assert!(
                std::time::Instant::now() < deadline,
                "the verb never read the clock"
            );
            g = self
                .changed
                .wait_timeout(g, Duration::from_millis(20))
                .unwrap()
                .0;
        }
    }

    fn release(&self) {
        self.gate.lock().unwrap().1 = true;
        self.changed.notify_all();
    }
}

impl eventspool::Clock for GateClock {
    fn now_ms(&self) -> u64 {
        self.inner.now_ms()
    }

    fn wall_ms(&self) -> i64 {
        if std::thread::current().name() == Some("verb") {
            let mut g = self.gate.lock().unwrap();
            g.0 = true;
            self.changed.notify_all();
            while !g.1 {
                g = self.changed.wait(g).unwrap();
            }
        }
        self.inner.wall_ms()
    }

    fn sleep_until(&self, deadline_ms: u64) -> eventspool::Sleep {
        self.inner.sleep_until(deadline_ms)
    }
}

/// Defect 11: a verb that passed its `closed` check (here `quarantine_redrive`, held between
/// its check and its write) holds `shutdown()` back until it is done: `shutdown()` then saves
/// the queued count and lets go of the store, and no write of this handle may come after that
/// (a second handle may own the file by then).
#[test]
fn a_verb_past_its_check_holds_shutdown_until_it_is_done() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = fast_config("http://127.0.0.1:9/v1/batch");
    c.db_path = Some(dir.path().join("events.db"));
    let clock = GateClock::new();
    let spool = EventSpool::builder(c)
        .clock(clock.clone())
        .start_offline()
        .open()
        .unwrap();
    let verb = {
        let spool = spool.clone();
        std::thread::Builder::new()
            .name("verb".into())
            .spawn(move || spool.quarantine_redrive(&eventspool::Selector::All))
            .unwrap()
    };
    clock.wait_held();
    let shutdown = {
        let spool = spool.clone();
        std::thread::spawn(move || spool.shutdown(Duration::from_secs(5)))
    };
    // As long as shutdown() takes when nothing holds it back, and then some.
    let deadline = std::time::Instant::now() + Duration::from_secs(1);
    while !shutdown.is_finished() && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    let finished_early = shutdown.is_finished();
    clock.release();
    let redriven = verb.join().unwrap();
    shutdown.join().unwrap().unwrap();
    assert!(
        !finished_early,
        "shutdown() returned while quarantine_redrive, past its check, had yet to write \
         (it then wrote to a released store: {redriven:?})"
    );
}

/// A real file system that fills in the middle of a spill (a 1 MiB tmpfs under a store whose
/// cap is far above it): the spill thread's transactions fail part-way, tracking goes on in
/// memory; once space returns, every tracked event is delivered exactly once or counted.
#[test]
fn a_disk_that_fills_during_a_spill_leaves_every_event_delivered_once_or_counted() {
    let fs = TinyFs::mount(1024 * 1024);
    let collector = ReferenceCollector::start(CollectorConfig::default()).unwrap();
    let notices = Arc::new(Notices::default());
    let mut c = fast_config(&collector.url());
    c.db_path = Some(fs.path().join("events.db"));
    c.max_disk_bytes = 8 << 20;
    c.memory_capacity = 100;
    let spool = EventSpool::builder(c)
        .observer(notices.clone())
        .start_offline()
        .open()
        .unwrap();
    let mut tracked = 0u64;
    for i in 0..20_000 {
        spool
            .track("burst", json!({"i": i, "pad": "x".repeat(120)}))
            .unwrap();
        tracked += 1;
        if i % 2_000 == 1_999 {
            let _ = spool.persist();
        }
    }
    let stats = spool.stats();
    assert!(
        stats.store_errors > 0,
        "the 1 MiB file system never filled: {stats:?}"
    );
    assert!(stats.balances(), "{stats:?}");
    assert!(
        notices
            .0
            .lock()
            .unwrap()
            .iter()
            .any(|n| matches!(n, Notice::StoreUnavailable { .. })),
        "no StoreUnavailable notice"
    );
    let on_disk = spool.stats().pending_disk;
    fs.remount("size=64m");
    spool.persist().unwrap();
    spool.set_online(true);
    assert!(
        spool.wait_drained(Duration::from_secs(120)),
        "did not drain once space returned: {:?}",
        spool.stats()
    );
    let stats = spool.stats();
    assert_eq!(
        tracked,
        stats.delivered + stats.dropped_from_queue(),
        "tracked = delivered + dropped: {stats:?}"
    );
    assert_eq!(collector.distinct_count(), stats.delivered, "{stats:?}");
    assert_eq!(
        collector.received_count(),
        collector.distinct_count(),
        "an event arrived twice"
    );
    eprintln!(
        "disk full mid-spill: {tracked} tracked, {on_disk} on the full disk, {} store errors, {} delivered, dropped {:?}",
        stats.store_errors, stats.delivered, stats.dropped
    );
    spool.shutdown(Duration::from_secs(5)).unwrap();
    integrity_ok(&fs.path().join("events.db")).unwrap();
}

/// A real file system with room for part of a spill chunk: the disk is filled while tracking
/// goes on, so the spill thread's next chunk is a full 1,000 events (about 250 KB, four
/// transactions at a 2 MiB cap); then 150 KB are freed and the chunk is written. Its first
/// transactions commit, a later one meets the full disk. Those events are on disk only: what
/// memory and the store hold is what is pending (none in both), and once space returns each
/// event is delivered once or counted.
#[test]
fn a_spill_chunk_the_disk_takes_part_of_leaves_each_event_in_one_place() {
    let fs = TinyFs::mount(4 * 1024 * 1024);
    let collector = ReferenceCollector::start(CollectorConfig::default()).unwrap();
    let mut c = fast_config(&collector.url());
    c.db_path = Some(fs.path().join("events.db"));
    c.max_disk_bytes = 2 << 20;
    c.memory_capacity = 100;
    let spool = EventSpool::builder(c).start_offline().open().unwrap();
    let track = |from: u64, n: u64| {
        for i in from..from + n {
            spool
                .track("burst", json!({"i": i, "pad": "x".repeat(120)}))
                .unwrap();
        }
    };
    track(0, 200);
    spool.persist().unwrap();
    let filler = fill(fs.path());
    // The spill thread meets the full disk and the backlog grows past a chunk.
    track(200, 3_000);
    let _ = spool.persist();
    let wait_errors = |more_than: u64| {
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while spool.stats().store_errors <= more_than {
            assert!(std::time::Instant::now() < deadline, "no store error");
            std::thread::sleep(Duration::from_millis(2));
        }
    };
    wait_errors(0);
    let before = spool.stats();
    // Room for part of the next chunk; one more event wakes the spill thread.
    let free = 150 * 1024;
    let len = std::fs::metadata(&filler).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&filler)
        .unwrap()
        .set_len(len.saturating_sub(free))
        .unwrap();
    track(3_200, 1);
    // Until a spill after the space came back has committed part of the chunk and met the full
    // disk again. Not merely one more error: the spill thread's back-off may fail one more
    // attempt between `before` and the space coming back.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let after = loop {
        let now = spool.stats();
        if now.pending_disk > before.pending_disk && now.store_errors > before.store_errors {
            break now;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "nothing of the chunk committed (the test proves nothing): before {before:?}, now {now:?}"
        );
        std::thread::sleep(Duration::from_millis(2));
    };
    assert!(after.balances(), "{after:?}");
    assert_eq!(
        after.pending_memory + after.pending_disk,
        after.pending,
        "memory and the store hold more than is pending: the committed part of the chunk is in \
         both (before {before:?}, after {after:?})"
    );
    std::fs::remove_file(&filler).unwrap();
    spool.persist().unwrap();
    spool.set_online(true);
    assert!(
        spool.wait_drained(Duration::from_secs(60)),
        "did not drain once space returned: {:?}",
        spool.stats()
    );
    let stats = spool.stats();
    assert_eq!(
        3_201,
        stats.delivered + stats.dropped_from_queue(),
        "tracked = delivered + dropped: {stats:?}"
    );
    assert_eq!(collector.distinct_count(), stats.delivered, "{stats:?}");
    assert_eq!(
        collector.received_count(),
        collector.distinct_count(),
        "an event arrived twice"
    );
    eprintln!(
        "part of a spill chunk on disk: {} rows before, {} after; {} delivered, dropped {:?}",
        before.pending_disk, after.pending_disk, stats.delivered, stats.dropped
    );
    spool.shutdown(Duration::from_secs(5)).unwrap();
}
