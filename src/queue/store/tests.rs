//! The store's own tests: the disk cap under every kind of write, dead letters and their
//! budget, expiry, the ordering index, the row format and the count kept across a clean
//! close. Kept apart from the code they test so the store's files stay readable.

use super::reads::{QUEUED_COLUMNS, undecryptable_entry};
use super::writes::evict_oldest;
use super::*;
use crate::quarantine::QuarantinedEvent;

pub(super) fn event(seq: u64, pad: usize) -> QueuedEvent {
    let id = Uuid::now_v7();
    let json = format!(
        r#"{{"event_id":"{id}","name":"e","properties":{{"pad":"{}"}}}}"#,
        "p".repeat(pad)
    );
    QueuedEvent {
        ts_ms: 1_764_417_600_000 + seq as i64,
        seq,
        id: EventId(id),
        json: json.into_boxed_str(),
        accepted_ms: 1_764_417_600_000,
        sends: 0,
        unanswered: 0,
        critical: false,
        sealed: Default::default(),
    }
}

/// Every write keeps the files under the cap, not only inserts: a store filled to its
/// database share, then nothing but send bookkeeping (one UPDATE transaction per batch, as
/// the worker writes them), must not let the WAL push the total past `max_disk_bytes`.
#[test]
fn bookkeeping_writes_keep_the_wal_inside_the_cap() {
    const CAP: u64 = 128 * 1024;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.db");
    let store = Store::open(&path, CAP, 0, Keyring::plain()).unwrap().store;
    let live: Vec<_> = (1..=400).map(|s| event(s, 300)).collect();
    store.insert(&live).unwrap();
    let seqs: Vec<u64> = store.oldest(1_000).unwrap().iter().map(|e| e.seq).collect();
    assert!(
        seqs.len() > 50,
        "the store holds a backlog ({} rows)",
        seqs.len()
    );
    for (round, batch) in seqs.chunks(10).cycle().take(200).enumerate() {
        store.note_sends(batch, SendNote::Sending).unwrap();
        let bytes = store.disk_usage();
        assert!(
            bytes <= CAP,
            "round {round}: {bytes} bytes on disk, over the cap {CAP}"
        );
    }
}

/// Client reports are written while the network is down (one per request, up to
/// `MAX_WAITING_REPORTS` kept): on a store filled to its database share they must not push
/// the files past the cap. A report that does not fit is refused (its counts stay in the
/// next one), and no queued event is evicted for the SDK's own bookkeeping.
#[test]
fn waiting_client_reports_keep_the_files_inside_the_cap() {
    const CAP: u64 = 192 * 1024;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.db");
    let store = Store::open(&path, CAP, 0, Keyring::plain()).unwrap().store;
    let live: Vec<_> = (1..=2_000).map(|s| event(s, 300)).collect();
    let report = store.insert(&live).unwrap();
    assert!(report.evicted > 0, "the store is filled to its share");
    let queued = store.len();
    let body = format!(r#"{{"counts":"{}"}}"#, "c".repeat(600));
    let mut kept = 0;
    for id in 0..crate::fleet::MAX_WAITING_REPORTS as u64 {
        if store.report_add(id, &body).is_ok() {
            kept += 1;
        }
        let bytes = store.disk_usage();
        assert!(
            bytes <= CAP,
            "after report {id} ({kept} kept): {bytes} bytes on disk, over the cap {CAP}"
        );
    }
    assert_eq!(store.len(), queued, "no queued event evicted for a report");
}

/// The dead path on its own (`with_quarantine` → `QuarantineSql::add`): ten caps' worth of
/// dead letters never push the files past the cap and never cost a queued event.
#[test]
fn dead_letters_keep_to_their_budget_and_never_evict_queued_events() {
    const CAP: u64 = 256 * 1024;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.db");
    let store = Store::open(&path, CAP, 0, Keyring::plain()).unwrap().store;
    let live: Vec<_> = (1..=200).map(|s| event(s, 300)).collect();
    let report = store.insert(&live).unwrap();
    assert_eq!((report.inserted, report.evicted), (200, 0));
    let mut seq = 10_000;
    let mut evicted = 0;
    for round in 0..100 {
        let batch: Vec<QuarantinedEvent> = (0..30)
            .map(|_| {
                seq += 1;
                let e = event(seq, 800);
                QuarantinedEvent::new(&e, "rejected", "r".repeat(100), Some(200), 1, 0)
            })
            .collect();
        evicted += store
            .with_quarantine(|q| q.add(&batch, 1_000_000, i64::MIN))
            .unwrap()
            .cap;
        let bytes = store.disk_usage();
        assert!(
            bytes <= CAP,
            "round {round}: {bytes} bytes over the cap {CAP}"
        );
    }
    assert_eq!(
        store.oldest(1_000).unwrap().len(),
        200,
        "no queued event evicted"
    );
    assert_eq!(store.len(), 200);
    let kept = store
        .with_quarantine(|q| q.counts())
        .unwrap()
        .get("rejected")
        .copied()
        .unwrap_or(0);
    assert!(kept > 0, "the newest dead letters stay");
    assert_eq!(kept + evicted, 3_000, "every dead letter kept or counted");
    let used = store
        .with_quarantine(|q| QuarantineSql::used_bytes(q.tx()))
        .unwrap();
    assert!(
        used <= store.budget.dead_bytes,
        "{used} over {}",
        store.budget.dead_bytes
    );
}

/// The spill path: dead letters over their budget (here: a store filled under a larger cap)
/// are what goes first at the cap, not the queued events.
#[test]
fn at_the_cap_dead_letters_over_budget_go_before_queued_events() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.db");
    let mut seq = 0;
    let mut dead = |n: usize| -> Vec<QuarantinedEvent> {
        (0..n)
            .map(|_| {
                seq += 1;
                let e = event(seq, 800);
                QuarantinedEvent::new(&e, "rejected", String::new(), Some(200), 1, 0)
            })
            .collect()
    };
    {
        let big = Store::open(&path, 10 << 20, 0, Keyring::plain())
            .unwrap()
            .store;
        let batch = dead(400);
        let e = big
            .with_quarantine(|q| q.add(&batch, 1_000_000, i64::MIN))
            .unwrap();
        assert_eq!(e.cap, 0);
        big.release_ownership();
    }
    const CAP: u64 = 256 * 1024;
    let store = Store::open(&path, CAP, 0, Keyring::plain()).unwrap().store;
    let before = store.quarantine_counts().unwrap();
    assert_eq!(before["rejected"], 400);
    let live: Vec<_> = (100_000..100_200).map(|s| event(s, 300)).collect();
    let report = store.insert(&live).unwrap();
    assert_eq!(report.evicted, 0, "no queued event evicted: {report:?}");
    assert!(report.evicted_quarantine > 0, "{report:?}");
    let left = store.quarantine_counts().unwrap();
    assert_eq!(
        left.get("rejected").copied().unwrap_or(0),
        400 - report.evicted_quarantine,
        "the counts stats() reads follow the cap's eviction"
    );
    assert_eq!(store.oldest(1_000).unwrap().len(), 200);
    let used = store
        .with_quarantine(|q| QuarantineSql::used_bytes(q.tx()))
        .unwrap();
    assert!(
        used <= store.budget.dead_bytes,
        "{used} over {}",
        store.budget.dead_bytes
    );
    assert!(store.disk_usage() <= CAP, "{}", store.disk_usage());
}

fn accepted_at(seq: u64, accepted_ms: i64) -> QueuedEvent {
    QueuedEvent {
        accepted_ms,
        ..event(seq, 10)
    }
}

/// Expiry reads the table only when the accepted floor says something may be due, so
/// every way a row enters the queue must lower the floor: an old event persisted after a
/// scan, a redriven one, and rows found in the file at open.
#[test]
fn expiry_finds_every_due_row_however_it_entered() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.db");
    {
        let store = Store::open(&path, 1 << 20, 0, Keyring::plain())
            .unwrap()
            .store;
        store.insert(&[accepted_at(1, 10_000)]).unwrap();
        assert!(store.expire(5_000).unwrap().is_empty(), "nothing due yet");
        // Tracked long ago, written to the store only now (persist, a late spill).
        store.insert(&[accepted_at(2, 1_000)]).unwrap();
        let gone = store.expire(5_000).unwrap();
        assert_eq!(gone.len(), 1, "the old row inserted after a scan expires");
        assert_eq!(store.len(), 1);
        assert!(store.expire(9_999).unwrap().is_empty());
        assert_eq!(store.expire(10_001).unwrap().len(), 1);
        assert_eq!(store.len(), 0);
        // An empty store has no floor to speak of: the next row, however old, is seen.
        store.insert(&[accepted_at(3, 2_000)]).unwrap();
        assert_eq!(store.expire(3_000).unwrap().len(), 1);
        store.insert(&[accepted_at(4, 50_000)]).unwrap();
        assert!(store.expire(20_000).unwrap().is_empty());
        // A redrive is an acceptance too.
        let q = QuarantinedEvent {
            body: r#"{"name":"e"}"#.into(),
            reason: reason::REJECTED.into(),
            ..undecryptable_entry(&Uuid::now_v7().to_string(), 7, 0, 0)
        };
        store.with_quarantine(|sql| sql.add(&[q], 100, 0)).unwrap();
        let mut seq = 100;
        let moved = store
            .redrive(&crate::quarantine::Selector::All, 15_000, || {
                seq += 1;
                seq
            })
            .unwrap();
        assert_eq!(moved, 1);
        assert_eq!(store.expire(20_000).unwrap().len(), 1, "the redriven row");
        store.insert(&[accepted_at(5, 3_000)]).unwrap();
    }
    let store = Store::open(&path, 1 << 20, 0, Keyring::plain())
        .unwrap()
        .store;
    assert_eq!(store.len(), 2);
    assert_eq!(
        store.expire(20_000).unwrap().len(),
        1,
        "a reopened store scans before it trusts a floor"
    );
    assert_eq!(store.len(), 1);
}

/// One-row commits (`durability = always`) skip measuring the database while the page
/// bound says they fit; near the cap they measure and evict, and the files never pass it.
#[test]
fn one_row_commits_keep_to_the_cap_without_measuring_each() {
    const CAP: u64 = 256 * 1024;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.db");
    let store = Store::open(&path, CAP, 0, Keyring::plain()).unwrap().store;
    let mut evicted = 0;
    for seq in 1..=3_000 {
        evicted += store.insert(&[event(seq, 200)]).unwrap().evicted;
        let bytes = store.disk_usage();
        assert!(bytes <= CAP, "row {seq}: {bytes} bytes on disk, over {CAP}");
    }
    assert!(evicted > 0, "3,000 rows of 300 bytes do not fit in {CAP}");
    assert_eq!(
        store.len() + evicted,
        3_000,
        "every row is queued or counted"
    );
}

/// An event at timestamp `ts` with track-order `seq`.
fn at(ts: i64, seq: u64, critical: bool) -> QueuedEvent {
    QueuedEvent {
        ts_ms: ts,
        critical,
        ..event(seq, 10)
    }
}

fn keys(events: &[QueuedEvent]) -> Vec<OrderKey> {
    events.iter().map(QueuedEvent::key).collect()
}

fn indexed_rows(store: &Store) -> i64 {
    store
        .conn()
        .query_row(
            "SELECT count(*) FROM events INDEXED BY events_out_of_order WHERE in_order = 0",
            [],
            |r| r.get(0),
        )
        .unwrap()
}

/// Rows written in delivery order skip the index; whatever the mix (importer timestamps,
/// seqs out of step, critical and redriven rows, a reopen, deletions), batches read in
/// delivery order and the disk cap evicts the oldest normal rows first.
#[test]
fn in_order_rows_skip_the_index_and_every_read_keeps_delivery_order() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.db");
    let mut all: Vec<QueuedEvent> = Vec::new();
    {
        let store = Store::open(&path, 8 << 20, 0, Keyring::plain())
            .unwrap()
            .store;
        // A spill of 200 tracked events: all in order.
        let tracked: Vec<QueuedEvent> = (1..=200).map(|i| at(1_000 + i, i as u64, false)).collect();
        store.insert(&tracked).unwrap();
        all.extend(tracked);
        assert_eq!(
            indexed_rows(&store),
            0,
            "a spill in delivery order writes no index entry"
        );
        // Out of order: older timestamps, a later timestamp with an earlier seq, critical.
        let odd = vec![
            at(500, 201, false),
            at(1_100, 202, true),
            at(1_150, 203, false),
            at(5_000, 150_000, false),
            at(6_000, 300, false),
        ];
        store.insert(&odd).unwrap();
        all.extend(odd);
        assert_eq!(
            indexed_rows(&store),
            4,
            "only the last row is past the frontier"
        );
    }
    // Reopened: the frontier is found again, so a row behind it is indexed.
    let store = Store::open(&path, 8 << 20, 0, Keyring::plain())
        .unwrap()
        .store;
    let behind = at(5_500, 301, false);
    let past = at(7_000, 150_001, false);
    store.insert(&[behind.clone(), past.clone()]).unwrap();
    all.extend([behind, past]);
    assert_eq!(indexed_rows(&store), 5);
    all.sort_unstable_by_key(QueuedEvent::key);
    assert_eq!(keys(&store.oldest(1_000).unwrap()), keys(&all));
    // Delivered from the front, a batch at a time, with a lease in the way.
    store.lease(&[all[1].seq]);
    assert_eq!(
        keys(&store.oldest(3).unwrap()),
        keys(&[all[0].clone(), all[2].clone(), all[3].clone()])
    );
    store.release_all();
    // The 120 oldest normal events delivered; the critical one stays.
    let (critical, mut normal): (Vec<_>, Vec<_>) = all.into_iter().partition(|e| e.critical);
    let delivered: Vec<u64> = normal.drain(..120).map(|e| e.seq).collect();
    store.delete(&delivered).unwrap();
    assert_eq!(
        keys(&store.oldest(1_000).unwrap()),
        [keys(&critical), keys(&normal)].concat()
    );
    // The cap's eviction: the oldest normal rows first, the critical row last.
    let tx_evicted = {
        let mut conn = store.conn();
        let tx = conn.transaction().unwrap();
        let floor = lock(&store.frontier).floor();
        let n = evict_oldest(&tx, 85, &[], floor).unwrap();
        tx.commit().unwrap();
        n
    };
    assert_eq!(tx_evicted, 85);
    assert_eq!(
        keys(&store.oldest(1_000).unwrap()),
        [keys(&critical), keys(&normal[85..])].concat()
    );
    // Past the normal rows, the critical one.
    let mut conn = store.conn();
    let tx = conn.transaction().unwrap();
    let left = normal.len() as u64 - 85;
    assert_eq!(evict_oldest(&tx, left + 5, &[], 0).unwrap(), left + 1);
}

/// A queued row holds the event without the head that repeats its id and timestamp, and
/// reads back as the JSON `track()` rendered; a whole body (an older release's row) reads
/// back as it is.
#[test]
fn rows_keep_events_without_their_head_and_read_back_byte_for_byte() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&dir.path().join("s.db"), 8 << 20, 0, Keyring::plain())
        .unwrap()
        .store;
    let tracked: Vec<QueuedEvent> = (1..=3)
        .map(|seq| {
            let e = crate::event::NewEvent::new("tap", serde_json::json!({"n": seq}));
            crate::event::prepare(e.fields(), 1_764_417_600_000 + seq, seq as u64, 1 << 20).unwrap()
        })
        .collect();
    let mut whole = event(4, 10);
    whole.json = format!(
        r#"{{"event_id":"{}","name":"old","properties":{{}}}}"#,
        whole.id
    )
    .into();
    let mut all = tracked.clone();
    all.push(whole);
    store.insert(&all).unwrap();
    let stored: Vec<i64> = {
        let conn = store.conn();
        let mut stmt = conn
            .prepare("SELECT length(body) FROM events ORDER BY seq")
            .unwrap();
        stmt.query_map([], |r| r.get(0))
            .unwrap()
            .map(|r| r.unwrap())
            .collect()
    };
    for (e, len) in all.iter().zip(&stored) {
        let saved = e.json.len() as i64 - len;
        assert!(
            if e.seq == 4 { saved == 0 } else { saved > 80 },
            "seq {}: {saved} bytes saved",
            e.seq
        );
    }
    let read: Vec<String> = store
        .oldest(10)
        .unwrap()
        .iter()
        .map(|e| e.json.to_string())
        .collect();
    let sent: Vec<String> = all.iter().map(|e| e.json.to_string()).collect();
    assert_eq!(read, sent);
}

/// The queued count is left behind by a clean close and taken out by the next open; after
/// a close that left none (a crash), the table is counted. Either way `len()` is exact.
#[test]
fn the_queued_count_survives_a_clean_close_and_is_counted_after_a_crash() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.db");
    let open = || {
        Store::open(&path, 8 << 20, 0, Keyring::plain())
            .unwrap()
            .store
    };
    let saved = |store: &Store| store.meta(meta::QUEUE_ROWS_AT_CLOSE).unwrap();
    {
        let store = open();
        store
            .insert(&(1..=30).map(|s| event(s, 10)).collect::<Vec<_>>())
            .unwrap();
        store.delete(&[3, 4]).unwrap();
        store.release_ownership();
    }
    let store = open();
    assert_eq!(store.len(), 28);
    assert_eq!(
        saved(&store),
        None,
        "taken out at open, before anything can change"
    );
    store
        .insert(&(31..=35).map(|s| event(s, 10)).collect::<Vec<_>>())
        .unwrap();
    drop(store); // no clean close: nothing left behind
    let store = open();
    assert_eq!(store.len(), 33, "counted");
    store.release_ownership();
    assert_eq!(saved(&store).as_deref(), Some("33"));
}

/// The batch read takes the partial index, in its order: no sort of the table per batch.
#[test]
fn the_ordered_reads_walk_the_table_and_the_index_without_sorting() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&dir.path().join("s.db"), 8 << 20, 0, Keyring::plain())
        .unwrap()
        .store;
    let conn = store.conn();
    let plan = |sql: &str| -> String {
        let mut stmt = conn.prepare(&format!("EXPLAIN QUERY PLAN {sql}")).unwrap();
        // The statements' parameters stay unbound (NULL): only the plan is read.
        let mut rows = stmt.raw_query();
        let mut steps = Vec::new();
        while let Some(r) = rows.next().unwrap() {
            steps.push(r.get::<_, String>(3).unwrap());
        }
        steps.join("; ")
    };
    let indexed = plan(&format!(
        "SELECT {QUEUED_COLUMNS} FROM events {INDEXED_ALL}"
    ));
    assert!(indexed.contains("events_out_of_order"), "{indexed}");
    let in_order = plan(&format!(
        "SELECT {QUEUED_COLUMNS} FROM events {IN_ORDER_FROM}"
    ));
    let evict_in_order = plan(&format!("SELECT ts, seq FROM events {IN_ORDER_ROWS}"));
    for plan in [&indexed, &in_order, &evict_in_order] {
        assert!(!plan.contains("TEMP B-TREE"), "{plan}");
    }
}

#[test]
fn a_sealed_rows_associated_data_keeps_its_bytes() {
    // What stores written before hold was sealed over these bytes: they must keep opening.
    for (ts, lane) in [
        (0, 0),
        (-1, 1),
        (i64::MAX, 255),
        (i64::MIN, 1),
        (1_764_417_600_000, 1),
    ] {
        let mut buf = String::new();
        assert_eq!(
            super::reads::body_ad(7, "id", ts, lane, &mut buf),
            format!("id|{ts}|{lane}")
        );
    }
    assert_eq!(
        super::reads::body_ad(0, "id", 5, 1, &mut String::new()),
        "id"
    );
}
