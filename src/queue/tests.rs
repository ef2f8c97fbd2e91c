//! The queue's own tests: the inbox, group commit, and the spill thread keeping up.

use super::spill::{SEAL_AHEAD_PAST, SPENT_BYTES_MAX, SPENT_MAX, SPILL_LINGER_MAX};
use super::*;
use crate::event::EventId;

fn event(ts: i64, seq: u64) -> QueuedEvent {
    let id = EventId::new();
    QueuedEvent {
        ts_ms: ts,
        seq,
        id,
        json: format!(r#"{{"event_id":"{id}","name":"e"}}"#).into_boxed_str(),
        accepted_ms: ts,
        sends: 0,
        unanswered: 0,
        critical: false,
        sealed: Default::default(),
    }
}

fn params(memory_capacity: u64, durability: Durability) -> QueueParams {
    QueueParams {
        memory_capacity,
        durability,
        quarantine_max_events: 1_000,
        quarantine_retention_ms: 1_000_000,
        encryption_keys: Default::default(),
        aead: crate::crypto::Aead::for_this_cpu(),
    }
}

/// Events tracked into the inbox (shuffled timestamps) come out in delivery order, and the
/// memory-only limit still drops exactly the oldest, counted.
#[test]
fn the_inbox_keeps_delivery_order_and_the_memory_limit() {
    let counters = Ledger::default();
    let q = Queue::in_memory(
        params(4, Durability::Spill),
        counters.clone(),
        Default::default(),
    );
    for (ts, seq) in [(50, 1), (10, 2), (40, 3), (20, 4), (30, 5), (60, 6)] {
        q.push(event(ts, seq));
    }
    let batch: Vec<_> = q
        .next_batch(10, u64::MAX)
        .into_iter()
        .map(|(e, from_store)| ((e.ts_ms, e.seq), from_store))
        .collect();
    assert_eq!(
        batch,
        [(30, 5), (40, 3), (50, 1), (60, 6)].map(|k| (k, false)),
        "the two oldest were dropped, the rest in timestamp order"
    );
    assert_eq!(counters.snapshot().dropped(DropReason::MemoryOverflow), 2);
}

/// `durability = always`: callers that queue while a commit is under way share the next
/// one. Eight callers queue while the spill lock is held elsewhere; once it is let go, one
/// transaction holds all eight events and every caller returns `Ok`.
#[test]
fn durable_callers_waiting_together_share_one_commit() {
    let dir = tempfile::tempdir().unwrap();
    let opened = Queue::open(
        &dir.path().join("q.db"),
        64 << 20,
        0,
        params(1_000, Durability::Always),
        Ledger::default(),
        Default::default(),
    )
    .unwrap();
    let q = Arc::new(opened.queue);
    let store_commits = || q.store.as_ref().unwrap().insert_transactions();
    let held = q.spill_lock.lock();
    let callers: Vec<_> = (0..8u64)
        .map(|i| {
            let q = q.clone();
            std::thread::spawn(move || q.push_durably([event(100 + i as i64, i + 1)], None))
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(10);
    while lock(&q.signal).requested < 8 {
        assert!(Instant::now() < deadline, "the callers did not queue");
        std::thread::yield_now();
    }
    drop(held);
    for caller in callers {
        assert_eq!(caller.join().unwrap(), Ok(()));
    }
    assert_eq!(q.store.as_ref().unwrap().len(), 8);
    assert_eq!(store_commits(), 1, "one commit for the eight callers");
    // A caller on its own commits on its own thread and returns.
    assert_eq!(q.push_durably([event(200, 9)], None), Ok(()));
    assert_eq!(store_commits(), 2);
    assert_eq!(q.store.as_ref().unwrap().len(), 9);
}

/// `durability = always` on four threads: every caller's event is on disk (read by another
/// connection) when its call returns, every event once, in fewer commits than calls or as
/// many, never more.
#[test]
fn durable_callers_on_four_threads_find_their_events_on_disk_when_they_return() {
    const THREADS: u64 = 4;
    const CALLS: u64 = 150;
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("q.db");
    let opened = Queue::open(
        &db,
        64 << 20,
        0,
        params(1_000, Durability::Always),
        Ledger::default(),
        Default::default(),
    )
    .unwrap();
    let q = Arc::new(opened.queue);
    let callers: Vec<_> = (0..THREADS)
        .map(|t| {
            let (q, db) = (q.clone(), db.clone());
            std::thread::spawn(move || {
                let reader = rusqlite::Connection::open_with_flags(
                    &db,
                    rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY,
                )
                .unwrap();
                for i in 0..CALLS {
                    let seq = 1 + t * CALLS + i;
                    let e = event(1_000 + seq as i64, seq);
                    let id = e.id.to_string();
                    assert_eq!(q.push_durably([e], None), Ok(()), "thread {t}, call {i}");
                    let rows: i64 = reader
                        .query_row(
                            "SELECT count(*) FROM events WHERE event_id = ?1",
                            [&id],
                            |r| r.get(0),
                        )
                        .unwrap();
                    assert_eq!(rows, 1, "thread {t}, call {i}: returned before its commit");
                }
            })
        })
        .collect();
    for caller in callers {
        caller.join().unwrap();
    }
    let store = q.store.as_ref().unwrap();
    assert_eq!(store.len(), THREADS * CALLS);
    assert!(store.insert_transactions() <= THREADS * CALLS);
    assert_eq!(q.memory().len(), 0, "nothing is also kept in memory");
}

/// `durability = always`: a caller whose event another thread committed (the spill thread,
/// `persist()`) returns while that thread still holds the spill lock, the caller inside the
/// gate (waiting for that lock) included. Before decision 0067, every caller waited for the
/// spill lock to learn its outcome, each in turn.
#[test]
fn durable_callers_another_thread_committed_for_leave_while_it_holds_the_spill_lock() {
    let dir = tempfile::tempdir().unwrap();
    let opened = Queue::open(
        &dir.path().join("q.db"),
        64 << 20,
        0,
        params(1_000, Durability::Always),
        Ledger::default(),
        Default::default(),
    )
    .unwrap();
    let q = Arc::new(opened.queue);
    let held = q.spill_lock.lock();
    let (done, returned) = std::sync::mpsc::channel();
    let callers: Vec<_> = (0..4u64)
        .map(|i| {
            let (q, done) = (q.clone(), done.clone());
            std::thread::spawn(move || {
                let outcome = q.push_durably([event(100 + i as i64, i + 1)], None);
                done.send(()).unwrap();
                outcome
            })
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(10);
    // All four queued, and one of them inside the gate, waiting for the spill lock.
    while lock(&q.signal).tickets.len() < 4 || q.durable_gate.try_lock().is_ok() {
        assert!(Instant::now() < deadline, "the callers did not queue");
        std::thread::yield_now();
    }
    // The commit another thread makes, the spill lock held, as `spill_now` does.
    q.spill_for_durable().unwrap();
    assert_eq!(q.store.as_ref().unwrap().len(), 4);
    for n in 0..4 {
        returned
            .recv_timeout(Duration::from_secs(3))
            .unwrap_or_else(|_| panic!("{n} of the 4 callers returned while the lock was held"));
    }
    drop(held);
    for caller in callers {
        assert_eq!(caller.join().unwrap(), Ok(()));
    }
    assert_eq!(q.store.as_ref().unwrap().insert_transactions(), 1);
}

/// `durability = always`: a caller that waited at the gate behind another keeps its own
/// deadline once inside; it does not wait for the spill lock a second full bound. Before,
/// the time left was taken before the wait at the gate and counted again from its end.
#[test]
fn a_caller_that_waited_at_the_gate_keeps_its_deadline_inside() {
    a_caller_behind_one_stuck_inside_keeps_its_bound(|q, e| q.push_durably([e], None));
}

/// `track()` of one durable event waits for the gate before it makes its event (decision
/// 0075). Its bound counts from before that wait: behind a caller that waits out its own bound
/// inside (the disk stuck), it leaves once its time is spent, not a whole bound later.
#[test]
fn a_caller_that_waited_for_a_pass_keeps_the_bound_counted_from_its_call() {
    a_caller_behind_one_stuck_inside_keeps_its_bound(|q, e| {
        let pass = q.durable_pass();
        q.push_durably([e], Some(pass))
    });
}

/// Two callers `enter` the gate one after the other, with no commit possible (the spill lock
/// held throughout, as by a spill stuck in the disk): the second returns within its own bound,
/// counted from its call, refused for its own event.
fn a_caller_behind_one_stuck_inside_keeps_its_bound(
    enter: fn(&Queue, QueuedEvent) -> std::result::Result<(), Refusal>,
) {
    const WAIT: Duration = Duration::from_secs(2);
    let dir = tempfile::tempdir().unwrap();
    let mut queue = Queue::open(
        &dir.path().join("q.db"),
        64 << 20,
        0,
        params(1_000, Durability::Always),
        Ledger::default(),
        Default::default(),
    )
    .unwrap()
    .queue;
    queue.commit_wait = WAIT;
    let q = Arc::new(queue);
    let held = q.spill_lock.lock();
    let inside = {
        let q = q.clone();
        std::thread::spawn(move || enter(&q, event(100, 1)))
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while q.durable_gate.try_lock().is_ok() {
        assert!(Instant::now() < deadline, "the first caller did not get in");
        std::thread::yield_now();
    }
    let behind = {
        let q = q.clone();
        std::thread::spawn(move || {
            let started = Instant::now();
            let outcome = enter(&q, event(101, 2));
            (outcome, started.elapsed())
        })
    };
    assert!(inside.join().unwrap().is_err(), "nothing could commit");
    let (outcome, waited) = behind.join().unwrap();
    let refusal = outcome.expect_err("nothing could commit");
    assert!(
        refusal.reason.contains("did not commit"),
        "{}",
        refusal.reason
    );
    assert_eq!(refusal.event_ids.len(), 1, "{refusal:?}");
    assert!(
        waited < WAIT + WAIT / 2,
        "the caller behind returned after {waited:?}, its bound is {WAIT:?}"
    );
    drop(held);
}

/// A queue with a store in `dir` and `durability = spill`, and its spill thread running.
fn spilling_queue(dir: &Path, capacity: u64) -> (Arc<Queue>, std::thread::JoinHandle<()>) {
    let q = Arc::new(
        Queue::open(
            &dir.join("q.db"),
            1 << 30,
            0,
            params(capacity, Durability::Spill),
            Ledger::default(),
            Default::default(),
        )
        .unwrap()
        .queue,
    );
    let spiller = {
        let q = q.clone();
        std::thread::spawn(move || q.run_spiller(|| {}))
    };
    (q, spiller)
}

/// The spill thread never falls asleep while tracked events wait in memory past
/// `memory_capacity`. Tracking asks it once per fold of the inbox; a request that arrived
/// after the fold but was counted as served by the spill in progress left every event
/// tracked from then on in the inbox until something else folded it (`stats()`, a batch),
/// and a crash lost them. Nothing here folds: only the spill thread moves events.
#[test]
fn the_spill_thread_keeps_up_with_tracking_without_being_polled() {
    const CAPACITY: u64 = 100;
    const ROUND: u64 = 2_000;
    let dir = tempfile::tempdir().unwrap();
    let (q, spiller) = spilling_queue(dir.path(), CAPACITY);
    let store = || q.store.as_ref().unwrap().len();
    let mut seq = 0;
    for round in 1..=10u64 {
        for _ in 0..ROUND {
            seq += 1;
            q.push(event(seq as i64, seq));
        }
        let want = round * ROUND - CAPACITY;
        let deadline = Instant::now() + Duration::from_secs(10);
        while store() < want && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(
            store(),
            want,
            "round {round}: everything past memory_capacity is on disk"
        );
    }
    q.stop_spiller();
    spiller.join().unwrap();
}

/// An offline trickle past `memory_capacity` (an app tracking tens of events a second with
/// memory full) reaches the store in a few commits, not one per event: each commit writes at
/// least a page of WAL for an event of a few hundred bytes. The spill lingers for more, at most
/// [`SPILL_LINGER_MAX`], and the events are on disk within that bound.
#[test]
fn a_trickle_past_memory_capacity_is_written_in_a_few_commits() {
    const CAPACITY: u64 = 10;
    const TRICKLE: u64 = 30;
    let dir = tempfile::tempdir().unwrap();
    let (q, spiller) = spilling_queue(dir.path(), CAPACITY);
    let store = q.store.as_ref().unwrap();
    for seq in 1..=CAPACITY {
        q.push(event(seq as i64, seq));
    }
    let first_past = Instant::now();
    for seq in CAPACITY + 1..=CAPACITY + TRICKLE {
        q.push(event(seq as i64, seq));
        std::thread::sleep(Duration::from_millis(10));
    }
    // The bound, with room for a loaded machine.
    let deadline = first_past + SPILL_LINGER_MAX + Duration::from_secs(3);
    while store.len() < TRICKLE && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(
        store.len(),
        TRICKLE,
        "every event past memory_capacity reached the store"
    );
    assert!(
        store.insert_transactions() <= 2,
        "{} commits for a trickle of {TRICKLE} events 10 ms apart",
        store.insert_transactions()
    );
    q.stop_spiller();
    spiller.join().unwrap();
}

/// A lingering spill does not wait out its bound once a burst has filled a chunk's worth: the
/// burst would otherwise pile up in memory for the whole linger, and past the spill backlog's
/// ceiling the oldest are dropped. Told by how the linger ended, not by a time: a test that
/// timed the writes failed on a busy machine.
#[test]
fn a_burst_during_a_trickle_linger_is_written_without_waiting_for_its_end() {
    const CAPACITY: u64 = 10;
    const BURST: u64 = 2_000;
    let dir = tempfile::tempdir().unwrap();
    let (q, spiller) = spilling_queue(dir.path(), CAPACITY);
    let store = q.store.as_ref().unwrap();
    for seq in 1..=CAPACITY + 1 {
        q.push(event(seq as i64, seq));
    }
    // The spill thread lingers for the one event past memory_capacity.
    wait_until(|| q.hot.spill_lingering.load(Ordering::SeqCst));
    for seq in CAPACITY + 2..=CAPACITY + 1 + BURST {
        q.push(event(seq as i64, seq));
    }
    let written = BURST + 1;
    wait_until(|| store.len() >= written);
    assert_eq!(
        q.lingers_ran_out(),
        0,
        "the linger waited out its bound with a burst of {BURST} in memory"
    );
    q.stop_spiller();
    spiller.join().unwrap();
}

/// A burst is on disk once it ends: its tail, shorter than a chunk's worth, goes when tracking
/// pauses, not a linger later. With every spill lingering, 10,000 events past
/// `memory_capacity` took 2.3 s to reach the disk instead of about 30 ms (the `spill` bench).
#[test]
fn a_bursts_tail_reaches_the_store_without_a_linger() {
    const CAPACITY: u64 = 10;
    const BURST: u64 = 3_100;
    let dir = tempfile::tempdir().unwrap();
    let (q, spiller) = spilling_queue(dir.path(), CAPACITY);
    let store = q.store.as_ref().unwrap();
    // The whole burst is tracked before the spill writes (as in a release build, where
    // tracking outruns the disk): the last chunk leaves a tail of 100.
    let held = q.spill_lock.lock();
    for seq in 1..=CAPACITY + BURST {
        q.push(event(seq as i64, seq));
    }
    drop(held);
    wait_until(|| store.len() >= BURST);
    assert_eq!(store.len(), BURST, "the burst's events on disk");
    assert_eq!(q.lingers_ran_out(), 0, "the tail waited out a linger");
    q.stop_spiller();
    spiller.join().unwrap();
}

/// Polls `done` every millisecond for up to [`BUSY_MACHINE_WAIT`]: long enough for a loaded
/// debug build, and the assertions after it say what went wrong, not the time it took.
fn wait_until(done: impl Fn() -> bool) {
    let start = Instant::now();
    while !done() && start.elapsed() < BUSY_MACHINE_WAIT {
        std::thread::sleep(Duration::from_millis(1));
    }
}

const BUSY_MACHINE_WAIT: Duration = Duration::from_secs(30);

/// The written events' JSON goes to the tracking threads to free, within its bounds, and
/// what they leave is freed once the spill has nothing more to write: nothing piles up.
#[test]
fn spent_json_stays_bounded_and_is_freed_once_the_spill_is_done() {
    const CAPACITY: u64 = 100;
    let dir = tempfile::tempdir().unwrap();
    let (q, spiller) = spilling_queue(dir.path(), CAPACITY);
    let spent = || {
        let inbox = q.hot.inbox.lock();
        let counted: usize = inbox.spent.iter().map(|j| j.len()).sum();
        assert_eq!(
            inbox.spent_bytes, counted,
            "the byte count follows the strings"
        );
        (inbox.spent.len(), inbox.spent_bytes)
    };
    let mut most = (0, 0);
    for seq in 1..=5_000u64 {
        q.push(event(seq as i64, seq));
        let (n, bytes) = spent();
        most = (most.0.max(n), most.1.max(bytes));
    }
    assert!(most.0 <= SPENT_MAX && most.1 <= SPENT_BYTES_MAX, "{most:?}");
    let deadline = Instant::now() + Duration::from_secs(10);
    while (q.store.as_ref().unwrap().len() < 4_900 || spent().0 > 0) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(q.store.as_ref().unwrap().len(), 4_900);
    assert_eq!(
        spent(),
        (0, 0),
        "freed once the spill had nothing more to write"
    );
    q.stop_spiller();
    spiller.join().unwrap();
}

/// A store sealing with ChaCha20-Poly1305 whose spill is behind: the events tracked once
/// memory is `SEAL_AHEAD_PAST` past its capacity carry their sealed bodies from the tracking
/// thread, the spill writes those bytes as they are, and every row opens back to its event's
/// own JSON, those the spill sealed itself as well. A store sealing with AES-256-GCM leaves
/// every seal to the spill (decision 0074).
#[test]
fn bodies_sealed_ahead_by_tracking_are_written_as_they_are_and_open() {
    for aead in [Aead::ChaCha20Poly1305, Aead::Aes256Gcm] {
        sealed_ahead_with(aead);
    }
}

fn sealed_ahead_with(aead: Aead) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("q.db");
    let mut p = params(10, Durability::Spill);
    p.encryption_keys = crate::EncryptionKeys::new([(1, [3u8; 32])]);
    p.aead = aead;
    let opened = Queue::open(&path, 64 << 20, 0, p, Ledger::default(), Default::default()).unwrap();
    let q = opened.queue;
    let n = 10 + SEAL_AHEAD_PAST as u64 + 300;
    let events: Vec<QueuedEvent> = (1..=n)
        .map(|seq| super::failure_tests::event_of(seq, 40, false))
        .collect();
    for e in &events {
        q.push(e.clone());
    }
    // No spill thread: everything waits in the inbox.
    let ahead: HashMap<u64, Box<[u8]>> = q
        .hot
        .inbox
        .lock()
        .events
        .iter()
        .filter_map(|e| Some((e.seq, e.sealed.0.clone()?)))
        .collect();
    // Every other one (the even seqs) past the point where the spill is behind; none with AES.
    let past: Vec<u64> = (10 + SEAL_AHEAD_PAST as u64 + 2..=n)
        .filter(|seq| seq.is_multiple_of(2) && aead == Aead::ChaCha20Poly1305)
        .collect();
    let mut sealed: Vec<u64> = ahead.keys().copied().collect();
    sealed.sort_unstable();
    assert_eq!(sealed, past, "the events sealed ahead with {aead:?}");
    while q.memory().spill_len() > 0 {
        q.spill_now().unwrap();
    }
    let conn = rusqlite::Connection::open(&path).unwrap();
    let mut stmt = conn.prepare("SELECT seq, body FROM events").unwrap();
    let rows: Vec<(i64, Vec<u8>)> = stmt
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .collect::<rusqlite::Result<_>>()
        .unwrap();
    assert_eq!(rows.len() as u64, n - 10, "all but memory's ten on disk");
    for (seq, body) in &rows {
        if let Some(sealed) = ahead.get(&(*seq as u64)) {
            assert_eq!(
                &body[..],
                &sealed[..],
                "seq {seq}: not the bytes sealed ahead"
            );
        }
    }
    let read: HashMap<u64, Box<str>> = q
        .next_batch(n as usize, u64::MAX)
        .into_iter()
        .map(|(e, _)| (e.seq, e.json))
        .collect();
    assert_eq!(read.len() as u64, n);
    for e in &events {
        assert_eq!(read[&e.seq], e.json, "seq {} opens to another JSON", e.seq);
    }
}
