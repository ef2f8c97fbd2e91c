//! Encryption at rest. Every payload the store writes (queued bodies, and the
//! quarantine's body, reason and detail) is sealed with the app's key; rows record their key id
//! so keys rotate; a wrong or missing key is refused at open by id and the store is kept; a
//! damaged ciphertext is quarantined as `undecryptable`, counted, never dropped in silence.

use std::path::Path;

use eventspool::admin;
use eventspool::{
    Config, Durability, EncryptionKeys, Error, EventSpool, ListFilter, quarantine_reason,
};
use eventspool_collector::{Behavior, ReferenceCollector};
use serde_json::json;

use crate::common::*;

const K1: [u8; 32] = [0x11; 32];
const K2: [u8; 32] = [0x22; 32];

/// What the tests track: a value that must never reach the disk in the clear.
fn secret(i: usize) -> String {
    format!("tracked-secret-value-{i:04}")
}

fn spool_config(collector: &ReferenceCollector, db: &Path, keys: EncryptionKeys) -> Config {
    let mut c = config(collector);
    c.db_path = Some(db.to_path_buf());
    c.encryption_keys = keys;
    c
}

fn open_offline(c: Config) -> EventSpool {
    EventSpool::builder(c).start_offline().open().unwrap()
}

/// Every file under `dir` (database, WAL, SHM, lock, anything else), with the needles found
/// in its bytes.
fn files_holding(dir: &Path, needles: &[&str]) -> Vec<(String, String)> {
    let mut found = Vec::new();
    let mut files = 0;
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if !path.is_file() {
            continue;
        }
        files += 1;
        let bytes = std::fs::read(&path).unwrap();
        for needle in needles {
            if bytes.windows(needle.len()).any(|w| w == needle.as_bytes()) {
                found.push((path.display().to_string(), needle.to_string()));
            }
        }
    }
    assert!(files >= 2, "the store wrote its files ({files} found)");
    found
}

/// Key ids of the queued rows, read with SQL: what the rows record.
fn key_ids(db: &Path) -> Vec<(i64, i64)> {
    let conn = rusqlite::Connection::open(db).unwrap();
    let mut stmt = conn
        .prepare("SELECT key_id, count(*) FROM events GROUP BY key_id ORDER BY key_id")
        .unwrap();
    stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .collect::<rusqlite::Result<_>>()
        .unwrap()
}

#[test]
fn no_file_in_the_store_dir_holds_a_tracked_value_even_after_a_crash() {
    let collector = collector();
    collector.set_behavior(Behavior {
        partial_reject_name: Some("refused".into()),
        partial_reject_reason: Some("collector-words-about-it".into()),
        ..Default::default()
    });
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("events.db");
    let mut c = spool_config(&collector, &db, EncryptionKeys::new([(1, K1)]));
    // Every event in the store (and its WAL) before track() returns.
    c.durability = Durability::Always;
    let spool = open_offline(c.clone());
    let n = 300;
    for i in 0..n {
        let name = if i % 100 == 7 { "refused" } else { "fine" };
        spool
            .track(name, json!({ "email": secret(i), "i": i }))
            .unwrap();
    }
    assert_eq!(spool.stats().pending_disk, n as u64, "all on disk");
    let needles = [
        "tracked-secret-value-",
        "refused",
        "collector-words-about-it",
        "invalid name",
    ];
    let found = files_holding(dir.path(), &needles);
    assert!(found.is_empty(), "plain text on disk: {found:?}");

    // Deliver: three are refused and quarantined (reason `rejected`, the collector's words as
    // detail), the rest acknowledged.
    spool.set_online(true);
    spool.flush();
    assert!(spool.wait_drained(WAIT), "{}", spool.state());
    let stats = spool.stats();
    assert_eq!((stats.delivered, stats.quarantined), (297, 3), "{stats:?}");
    let q = spool.quarantine_list(&ListFilter::default()).unwrap();
    assert_eq!(q.len(), 3);
    assert!(q[0].detail.contains("collector-words-about-it"), "{q:?}");
    assert!(q[0].body.contains(&secret(7)), "the payload opens: {q:?}");
    // The reason is sealed too; its word is also in the schema's own SQL text (a column
    // comment), so it is checked on the rows rather than by scanning the bytes.
    let quarantine_needles = [
        "tracked-secret-value-",
        "refused",
        "collector-words-about-it",
    ];
    // More events while a batch is being refused, then a crash-like end: the handle is leaked,
    // nothing is checkpointed or closed, the WAL stays as it is.
    spool.set_online(false);
    for i in n..n + 50 {
        spool.track("fine", json!({ "email": secret(i) })).unwrap();
    }
    assert!(
        std::fs::metadata(format!("{}-wal", db.display()))
            .map(|m| m.len() > 0)
            .unwrap_or(false),
        "the WAL holds frames at the crash"
    );
    std::mem::forget(spool);
    let found = files_holding(dir.path(), &quarantine_needles);
    assert!(found.is_empty(), "plain text on disk: {found:?}");
    let stored_as: Vec<(String, String, String)> = {
        let conn =
            rusqlite::Connection::open_with_flags(&db, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
                .unwrap();
        let mut stmt = conn
            .prepare("SELECT typeof(body), typeof(reason), typeof(detail) FROM quarantine")
            .unwrap();
        stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
            .unwrap()
            .collect::<rusqlite::Result<_>>()
            .unwrap()
    };
    assert_eq!(
        stored_as,
        vec![("blob".to_string(), "blob".to_string(), "blob".to_string()); 3],
        "body, reason and detail are sealed"
    );
    // The rows are there and readable with the key (read-only, the owner is still "alive").
    let listed = admin::quarantine_list(&db, &c.encryption_keys, &ListFilter::default()).unwrap();
    assert_eq!(listed.len(), 3);
    assert_eq!(admin::inspect(&db).unwrap().pending, 50);
}

/// A plain store opened with a key keeps its rows readable as key id 0; rotation adds a key in
/// front, old rows stay readable while the old key is supplied, and the old key may go once no
/// row uses it.
#[test]
fn keys_rotate_and_every_row_stays_readable_while_its_key_is_supplied() {
    let collector = collector();
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("events.db");
    let mut i = 0;
    let mut phase = |keys: EncryptionKeys| {
        let spool = open_offline(spool_config(&collector, &db, keys));
        for _ in 0..3 {
            spool.track("e", json!({ "email": secret(i) })).unwrap();
            i += 1;
        }
        spool.shutdown(WAIT).unwrap();
    };
    phase(EncryptionKeys::default());
    phase(EncryptionKeys::new([(1, K1)]));
    phase(EncryptionKeys::new([(2, K2), (1, K1)]));
    assert_eq!(key_ids(&db), [(0, 3), (1, 3), (2, 3)]);

    // Key 1 is still needed: leaving it out is refused, naming it, and changes nothing.
    let e = EventSpool::open(spool_config(
        &collector,
        &db,
        EncryptionKeys::new([(2, K2)]),
    ))
    .err()
    .expect("refused without key 1");
    assert!(matches!(e, Error::EncryptionKey { key_id: 1, .. }), "{e}");
    assert!(e.to_string().contains("key id 1"), "{e}");
    assert_eq!(key_ids(&db), [(0, 3), (1, 3), (2, 3)]);

    let spool = EventSpool::open(spool_config(
        &collector,
        &db,
        EncryptionKeys::new([(2, K2), (1, K1)]),
    ))
    .unwrap();
    spool.flush();
    assert!(spool.wait_drained(WAIT), "{}", spool.state());
    spool.shutdown(WAIT).unwrap();
    let mut got: Vec<String> = collector
        .events()
        .iter()
        .map(|e| e.properties["email"].as_str().unwrap().to_string())
        .collect();
    got.sort();
    assert_eq!(got, (0..9).map(secret).collect::<Vec<_>>());

    // No row needs key 1 any more: the store opens without it.
    let spool = EventSpool::open(spool_config(
        &collector,
        &db,
        EncryptionKeys::new([(2, K2)]),
    ))
    .unwrap();
    spool.shutdown(WAIT).unwrap();
}

#[test]
fn a_wrong_key_is_refused_at_open_naming_its_id_and_the_store_is_kept() {
    let collector = collector();
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("events.db");
    let spool = open_offline(spool_config(
        &collector,
        &db,
        EncryptionKeys::new([(4, K1)]),
    ));
    for i in 0..3 {
        spool.track("e", json!({ "email": secret(i) })).unwrap();
    }
    spool.shutdown(WAIT).unwrap();

    let wrong = EncryptionKeys::new([(4, K2)]);
    let e = EventSpool::open(spool_config(&collector, &db, wrong.clone()))
        .err()
        .expect("a wrong key is refused");
    assert!(matches!(e, Error::EncryptionKey { key_id: 4, .. }), "{e}");
    assert!(e.to_string().contains("key id 4"), "{e}");
    let e = admin::quarantine_list(&db, &wrong, &ListFilter::default()).unwrap_err();
    assert!(matches!(e, Error::EncryptionKey { key_id: 4, .. }), "{e}");
    let e = admin::StoreAdmin::open(&db, &wrong).err().unwrap();
    assert!(matches!(e, Error::EncryptionKey { key_id: 4, .. }), "{e}");
    let names: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        names.iter().all(|n| !n.contains("unusable")),
        "never moved aside: {names:?}"
    );
    assert_eq!(key_ids(&db), [(4, 3)], "the rows are untouched");

    let spool = EventSpool::open(spool_config(
        &collector,
        &db,
        EncryptionKeys::new([(4, K1)]),
    ))
    .unwrap();
    assert_eq!(spool.stats().restored, 3);
    spool.flush();
    assert!(spool.wait_drained(WAIT), "{}", spool.state());
    assert_eq!(collector.distinct_count(), 3);
}

#[test]
fn a_missing_key_is_refused_at_open_naming_its_id() {
    let collector = collector();
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("events.db");
    let spool = open_offline(spool_config(
        &collector,
        &db,
        EncryptionKeys::new([(9, K1)]),
    ));
    spool.track("e", json!({ "email": secret(0) })).unwrap();
    spool.shutdown(WAIT).unwrap();

    let e = EventSpool::open(spool_config(&collector, &db, EncryptionKeys::default()))
        .err()
        .expect("refused without the key");
    assert!(matches!(e, Error::EncryptionKey { key_id: 9, .. }), "{e}");
    assert!(e.to_string().contains("key id 9"), "{e}");
    let e = admin::quarantine_list(&db, &EncryptionKeys::default(), &ListFilter::default())
        .unwrap_err();
    assert!(matches!(e, Error::EncryptionKey { key_id: 9, .. }), "{e}");
    assert_eq!(key_ids(&db), [(9, 1)], "the row is untouched");
}

#[test]
fn a_damaged_ciphertext_is_quarantined_as_undecryptable_and_counted() {
    let collector = collector();
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("events.db");
    let keys = EncryptionKeys::new([(1, K1)]);
    let spool = open_offline(spool_config(&collector, &db, keys.clone()));
    let ids: Vec<String> = (0..5)
        .map(|i| {
            spool
                .track("e", json!({ "email": secret(i) }))
                .unwrap()
                .to_string()
        })
        .collect();
    spool.shutdown(WAIT).unwrap();
    {
        // One bit flipped in the tag of the third event's body, as a damaged sector would.
        let conn = rusqlite::Connection::open(&db).unwrap();
        let mut body: Vec<u8> = conn
            .query_row(
                "SELECT body FROM events WHERE event_id = ?1",
                [&ids[2]],
                |r| r.get(0),
            )
            .unwrap();
        let last = body.len() - 1;
        body[last] ^= 0x01;
        conn.execute(
            "UPDATE events SET body = ?1 WHERE event_id = ?2",
            rusqlite::params![body, ids[2]],
        )
        .unwrap();
    }

    let spool = EventSpool::open(spool_config(&collector, &db, keys.clone())).unwrap();
    spool.flush();
    assert!(spool.wait_drained(WAIT), "{}", spool.state());
    let stats = spool.stats();
    assert_eq!((stats.delivered, stats.quarantined), (4, 1), "{stats:?}");
    assert!(stats.balances(), "{stats:?}");
    assert_eq!(
        stats.quarantine.get(quarantine_reason::UNDECRYPTABLE),
        Some(&1),
        "{stats:?}"
    );
    assert_eq!(collector.distinct_count(), 4);
    assert!(!collector.contains(&ids[2]));
    let q = spool.quarantine_get(&ids[2]).unwrap().expect("quarantined");
    assert_eq!(q.reason, quarantine_reason::UNDECRYPTABLE);
    assert!(q.detail.contains("key id 1"), "{}", q.detail);
    // It has nothing to send: a redrive leaves it where it is.
    assert_eq!(
        spool
            .quarantine_redrive(&eventspool::Selector::All)
            .unwrap(),
        0
    );
    spool.shutdown(WAIT).unwrap();
    let listed = admin::quarantine_list(
        &db,
        &keys,
        &ListFilter {
            reason: Some(quarantine_reason::UNDECRYPTABLE.into()),
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].event_id, ids[2]);
}
