//! The store's own failure paths: counts other writers changed, keys checked before anything
//! is written, sealed rows whose clear columns were changed, the frontier after a future-dated
//! event, reads past damaged rows.

use super::reads::BODY;
use super::*;
use crate::crypto::EncryptionKeys;

fn sealed() -> Keyring {
    Keyring::new(&EncryptionKeys::new([(1, [7u8; 32])]))
}

fn row(ts: i64, seq: u64) -> QueuedEvent {
    let id = Uuid::now_v7();
    let json = format!(
        r#"{{"event_id":"{id}","timestamp":"{}","name":"e","properties":{{}}}}"#,
        crate::event::format_timestamp(ts)
    );
    QueuedEvent {
        ts_ms: ts,
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

fn raw(path: &Path) -> Connection {
    Connection::open(path).unwrap()
}

fn timestamp_of(json: &str) -> String {
    let v: serde_json::Value = serde_json::from_str(json).unwrap();
    v["timestamp"].as_str().unwrap().to_string()
}

/// Defect 3: the count saved at a clean close must not outlive a change to the table by a
/// writer that does not know it (an older build, a tool): the next open counts again.
#[test]
fn a_saved_count_is_not_trusted_after_another_writer_changed_the_table() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.db");
    {
        let store = Store::open(&path, 8 << 20, 0, Keyring::plain())
            .unwrap()
            .store;
        let rows: Vec<_> = (1..=100).map(|s| row(1_000 + s as i64, s)).collect();
        store.insert(&rows).unwrap();
        store.release_ownership();
    }
    raw(&path)
        .execute("DELETE FROM events WHERE seq <= 40", [])
        .unwrap();
    for reopen in 1..=2 {
        let store = Store::open(&path, 8 << 20, 0, Keyring::plain())
            .unwrap()
            .store;
        assert_eq!(store.len(), 60, "reopen {reopen}: a stale saved count");
        store.release_ownership();
    }
}

/// Defect 3: a count that drifted (more rows left than the store counted, as after a write
/// reported as nothing written while it committed) is never saved at a clean close, where
/// the next open would trust it for good: that open counts the table.
#[test]
fn a_drifted_count_is_not_saved_at_close() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.db");
    {
        let store = Store::open(&path, 8 << 20, 0, Keyring::plain())
            .unwrap()
            .store;
        let rows: Vec<_> = (1..=10).map(|s| row(1_000 + s as i64, s)).collect();
        store.insert(&rows).unwrap();
        // Rows the store did not count: seqs 11 to 70.
        let conn = raw(&path);
        for s in 11..=70u64 {
            let e = row(1_000 + s as i64, s);
            conn.execute(
                "INSERT INTO events (seq, ts, event_id, body) VALUES (?1, ?2, ?3, ?4)",
                params![s as i64, e.ts_ms, e.id.to_string(), &*e.json],
            )
            .unwrap();
        }
        drop(conn);
        // 30 rows leave, 10 of them counted: the count drifts to 0 with 40 rows on disk.
        store.delete(&(1..=30).collect::<Vec<u64>>()).unwrap();
        assert_eq!(store.len(), 0, "the count drifted");
        store.release_ownership();
    }
    for reopen in 1..=2 {
        let store = Store::open(&path, 8 << 20, 0, Keyring::plain())
            .unwrap()
            .store;
        assert_eq!(
            store.len(),
            40,
            "reopen {reopen}: the drifted count was saved at close and trusted"
        );
        store.release_ownership();
    }
}

/// Defect 10: an `open()` refused for a wrong key has written nothing: no migration, no saved
/// count taken out, the file as it was.
#[test]
fn a_wrong_key_open_changes_nothing_in_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.db");
    {
        let store = Store::open(&path, 8 << 20, 0, sealed()).unwrap().store;
        let rows: Vec<_> = (1..=10).map(|s| row(1_000 + s as i64, s)).collect();
        store.insert(&rows).unwrap();
        store.release_ownership();
    }
    let before = std::fs::read(&path).unwrap();
    let wrong = Keyring::new(&EncryptionKeys::new([(1, [9u8; 32])]));
    let err = Store::open(&path, 8 << 20, 0, wrong)
        .err()
        .expect("refused");
    assert!(matches!(err, Error::EncryptionKey { .. }), "{err}");
    let saved = read_meta(&raw(&path), meta::QUEUE_ROWS_AT_CLOSE).unwrap();
    assert_eq!(
        saved.as_deref(),
        Some("10"),
        "the refused open took the saved count out"
    );
    let after = std::fs::read(&path).unwrap();
    let changed: Vec<usize> = (0..before.len().max(after.len()))
        .filter(|&i| before.get(i) != after.get(i))
        .take(8)
        .collect();
    assert!(
        changed.is_empty(),
        "the refused open changed the database file at {changed:?} ({} bytes before, {} after)",
        before.len(),
        after.len()
    );
}

/// Defect 6: under encryption the timestamp an event is sent with is its own: swapping two
/// rows' clear `ts` columns is detected (or leaves the sent timestamps as they were), never
/// sends each with the other's time.
#[test]
fn under_encryption_a_swapped_timestamp_is_never_sent_as_the_events_own() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.db");
    let store = Store::open(&path, 8 << 20, 0, sealed()).unwrap().store;
    let rows = [row(1_000, 1), row(2_000, 2)];
    store.insert(&rows).unwrap();
    raw(&path)
        .execute(
            "UPDATE events SET ts = CASE seq WHEN 1 THEN 2000 ELSE 1000 END",
            [],
        )
        .unwrap();
    for e in store.oldest(10).unwrap() {
        let original = rows.iter().find(|r| r.id == e.id).unwrap();
        assert_eq!(
            timestamp_of(&e.json),
            timestamp_of(&original.json),
            "{} is sent with another row's timestamp",
            e.id
        );
    }
}

/// Defect 7: after a future-dated event (an importer, a wrong clock) is delivered, the rows
/// written after it skip the ordering index again.
#[test]
fn the_frontier_comes_back_once_a_future_dated_event_is_gone() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.db");
    let store = Store::open(&path, 8 << 20, 0, Keyring::plain())
        .unwrap()
        .store;
    let now = 1_764_417_600_000;
    store.insert(&[row(now + 365 * 86_400_000, 1)]).unwrap();
    let behind: Vec<_> = (2..=11).map(|s| row(now + s as i64, s)).collect();
    store.insert(&behind).unwrap();
    let indexed = || -> i64 {
        raw(&path)
            .query_row("SELECT count(*) FROM events WHERE in_order = 0", [], |r| {
                r.get(0)
            })
            .unwrap()
    };
    assert_eq!(indexed(), 10, "older than the frontier: indexed");
    let all: Vec<u64> = store.oldest(100).unwrap().iter().map(|e| e.seq).collect();
    store.delete(&all).unwrap();
    assert!(store.oldest(100).unwrap().is_empty());
    let later: Vec<_> = (12..=21).map(|s| row(now + s as i64, s)).collect();
    store.insert(&later).unwrap();
    assert_eq!(
        indexed(),
        0,
        "the frontier stayed at the future-dated event: every new row is indexed"
    );
    let got: Vec<u64> = store.oldest(100).unwrap().iter().map(|e| e.seq).collect();
    assert_eq!(got, (12..=21).collect::<Vec<u64>>());
}

/// Defect 8: rows that do not decrypt must not use up the in-order rows' share of a read and
/// let a later indexed row jump ahead of readable earlier ones.
#[test]
fn undecryptable_rows_do_not_break_the_order_of_a_batch() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.db");
    let store = Store::open(&path, 8 << 20, 0, sealed()).unwrap().store;
    store
        .insert(&[
            row(100, 1),
            row(110, 2),
            row(120, 3),
            row(130, 4),
            row(1_000, 5),
        ])
        .unwrap();
    // Older than the frontier (ts 1,000): indexed.
    store.insert(&[row(500, 6)]).unwrap();
    raw(&path)
        .execute(
            "UPDATE events SET body = randomblob(length(body)) WHERE seq IN (1, 2)",
            [],
        )
        .unwrap();
    let got: Vec<i64> = store.oldest(2).unwrap().iter().map(|e| e.ts_ms).collect();
    assert_eq!(got, [120, 130], "out of timestamp order");
    assert_eq!(store.take_undecryptable().quarantined, 2);
}

/// Defect 4: version 6 held rows whose meaning changed without a bump; 7 is the bump. A
/// version 6 file with a body sealed under the associated data of then and a saved count (a
/// wrong one, as a build that did not know it could leave) upgrades in place: the body opens
/// and is sent as it was, the count is taken from the table.
#[test]
fn a_version_6_store_upgrades_to_7_and_its_sealed_rows_still_open() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("v6.db");
    let keys = sealed();
    let e = row(1_000, 3);
    let id = e.id.to_string();
    {
        let conn = raw(&path);
        schema::create_at(&conn, 6);
        conn.execute(
            "INSERT INTO keys (key_id, check_record) VALUES (1, ?1)",
            [keys.check_record(1).unwrap()],
        )
        .unwrap();
        let tail = e.wire_tail(&id).expect("a head to leave out");
        conn.execute(
            "INSERT INTO events (seq, ts, event_id, body, accepted, lane, key_id, in_order)
             VALUES (3, 1000, ?1, ?2, 5, 1, 1, 1)",
            params![id, keys.seal(BODY, &id, tail)],
        )
        .unwrap();
        write_meta(&conn, meta::QUEUE_ROWS_AT_CLOSE, "5").unwrap();
    }
    let store = Store::open(&path, 8 << 20, 0, sealed()).unwrap().store;
    assert_eq!(store.len(), 1, "the count saved under 6 is not trusted");
    let out = store.oldest(10).unwrap();
    assert_eq!(out.len(), 1, "the sealed row opens after the upgrade");
    assert_eq!(&*out[0].json, &*e.json, "sent byte for byte as it was");
    let version: i64 = raw(&path)
        .pragma_query_value(None, "user_version", |r| r.get(0))
        .unwrap();
    assert_eq!(version, schema::SCHEMA_VERSION);
    assert_eq!(schema::SCHEMA_VERSION, 8);
}

/// A denial spares the rows of the request on the wire and deletes every other one with
/// `secure_delete`, which zeroes the deleted cells but not the unused space between a page's
/// cell pointers and its cells: SQLite rebuilds and reuses pages without clearing it, so it may
/// hold old copies of events delivered long before. Deleting around the kept rows left those
/// copies in their pages (found by the simulation, `Step::OnWire`: "after set_consent(Denied)
/// returned, events.db still holds the payload of event 9"). A queue that fills, drains in
/// part or whole, and whose rows' send counts grow, 40 times over; the kept rows are then the
/// oldest ten.
#[test]
fn the_pages_kept_for_the_request_on_the_wire_hold_no_other_event() {
    let mut leaks = Vec::new();
    for trial in 0..40u64 {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.db");
        let store = Store::open(&path, 64 << 20, 0, Keyring::plain())
            .unwrap()
            .store;
        let mark = |seq: u64| format!("kept-page-mark-{seq:06}");
        let mut lcg: u64 = 0x5eed ^ trial.wrapping_mul(0x9e37_79b9_7f4a_7c15);
        let mut next = move || {
            lcg = lcg
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            lcg >> 33
        };
        let mut seq = 0;
        let mut present: Vec<u64> = Vec::new();
        for _ in 0..60 {
            let n = 1 + next() % 30;
            let batch: Vec<_> = (0..n)
                .map(|_| {
                    seq += 1;
                    present.push(seq);
                    let mut e = row(1_764_417_600_000 + seq as i64, seq);
                    let pad = "x".repeat((next() % (40 + trial * 10)) as usize);
                    e.json = format!(r#"{{"m":"{}","pad":"{pad}"}}"#, mark(seq)).into_boxed_str();
                    e
                })
                .collect();
            store.insert(&batch).unwrap();
            // A send answered with an error: the rows' counts grow, and so do their cells.
            let sent: Vec<u64> = store.oldest(10).unwrap().iter().map(|e| e.seq).collect();
            store.note_sends(&sent, SendNote::Sending).unwrap();
            store.note_sends(&sent, SendNote::Answered).unwrap();
            // Delivered: mostly the oldest, now and then one from anywhere, now and then all.
            let k = match next() % 4 {
                0 => present.len(),
                _ => (next() % (n + 5)) as usize,
            };
            let mut delivered = Vec::new();
            for _ in 0..k.min(present.len()) {
                let i = match next() % 3 {
                    0 => next() as usize % present.len(),
                    _ => 0,
                };
                delivered.push(present.remove(i));
            }
            store.delete(&delivered).unwrap();
        }
        let on_wire: Vec<u64> = store.oldest(10).unwrap().iter().map(|e| e.seq).collect();
        store
            .discard_for_consent(std::time::Duration::ZERO, Some(&on_wire))
            .unwrap();
        drop(store);
        let mut bytes = std::fs::read(&path).unwrap();
        bytes.extend(std::fs::read(wal_path(&path)).unwrap_or_default());
        let text = String::from_utf8_lossy(&bytes);
        assert!(
            on_wire.iter().all(|s| text.contains(&mark(*s))),
            "the rows on the wire are kept"
        );
        let leaked: Vec<u64> = (1..=seq)
            .filter(|s| !on_wire.contains(s) && text.contains(&mark(*s)))
            .collect();
        if !leaked.is_empty() {
            leaks.push((trial, leaked));
        }
    }
    assert!(
        leaks.is_empty(),
        "after the denial the file holds events it deleted, (trial, events): {leaks:?}"
    );
}
