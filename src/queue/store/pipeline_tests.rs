//! The store's side of a drain at wire speed (decision 0069): the next batch read while the
//! one before it is on the wire, and the send count recorded for the batch on the wire
//! instead of written on each of its rows. Each test names what would go wrong without the
//! guard it checks.

use super::*;

fn event(seq: u64, lane: u8) -> QueuedEvent {
    let id = Uuid::now_v7();
    QueuedEvent {
        ts_ms: 1_764_417_600_000 + seq as i64,
        seq,
        id: EventId(id),
        json: format!(r#"{{"event_id":"{id}","name":"e{seq}"}}"#).into_boxed_str(),
        accepted_ms: 1_764_417_600_000,
        sends: 0,
        unanswered: 0,
        critical: lane == LANE_CRITICAL,
        sealed: Default::default(),
    }
}

fn open(path: &Path) -> Store {
    Store::open(path, 1 << 30, 0, Keyring::plain())
        .unwrap()
        .store
}

fn seqs(events: &[QueuedEvent]) -> Vec<u64> {
    events.iter().map(|e| e.seq).collect()
}

/// A store of `n` rows with the first `batch` of them leased: a batch on the wire.
fn with_batch_on_the_wire(path: &Path, n: u64, batch: usize) -> (Store, Vec<u64>) {
    let store = open(path);
    let rows: Vec<_> = (1..=n).map(|s| event(s, LANE_NORMAL)).collect();
    store.insert(&rows).unwrap();
    let first = seqs(&store.oldest(batch).unwrap());
    store.lease(&first);
    (store, first)
}

/// Nothing changed between the read ahead and the next batch: the batch is the read ahead,
/// not a second read. Shown by a change the store's own connection does not make (another
/// connection renames a row): the batch still has the name it was read ahead with.
#[test]
fn an_unchanged_queue_takes_the_read_ahead() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.db");
    let (store, _) = with_batch_on_the_wire(&path, 30, 10);
    store.read_ahead(10);
    let other = rusqlite::Connection::open(&path).unwrap();
    other
        .execute(
            r#"UPDATE events SET body = replace(body, '"e11"', '"renamed"') WHERE seq = 11"#,
            [],
        )
        .unwrap();
    let next = store.oldest(10).unwrap();
    assert_eq!(seqs(&next), (11..=20).collect::<Vec<_>>());
    assert!(
        next[0].json.contains(r#""e11""#),
        "the batch was read again instead of taken from the read ahead: {}",
        next[0].json
    );
}

/// The batch on the wire given back (its answer failed) after the read ahead: it comes first
/// again, before the rows read ahead of it.
#[test]
fn a_batch_given_back_comes_before_the_read_ahead() {
    let dir = tempfile::tempdir().unwrap();
    let (store, first) = with_batch_on_the_wire(&dir.path().join("s.db"), 30, 10);
    store.read_ahead(10);
    store.release(&first);
    assert_eq!(
        seqs(&store.oldest(10).unwrap()),
        first,
        "the rows read ahead went before the batch given back"
    );
}

/// A critical event written after the read ahead goes first (its lane orders before the
/// normal one), and so does any other row a write adds.
#[test]
fn a_row_written_after_the_read_ahead_takes_its_place() {
    let dir = tempfile::tempdir().unwrap();
    let (store, _) = with_batch_on_the_wire(&dir.path().join("s.db"), 30, 10);
    store.read_ahead(10);
    store.insert(&[event(31, LANE_CRITICAL)]).unwrap();
    let next = seqs(&store.oldest(10).unwrap());
    assert_eq!(
        next[0], 31,
        "the critical event waited behind the read ahead: {next:?}"
    );
}

/// Rows leased or owed a delete since the read ahead are not sent twice.
#[test]
fn rows_taken_since_the_read_ahead_are_not_in_the_next_batch() {
    let dir = tempfile::tempdir().unwrap();
    let (store, first) = with_batch_on_the_wire(&dir.path().join("s.db"), 30, 10);
    store.read_ahead(10);
    store.lease(&[11, 12]);
    let next = seqs(&store.oldest(10).unwrap());
    assert!(
        !next.contains(&11) && next.len() == 10,
        "a leased row was in the batch: {next:?}"
    );
    store.release(&[11, 12]);
    store.read_ahead(10);
    store.delete_later(&first).unwrap();
    assert_eq!(
        seqs(&store.oldest(10).unwrap()),
        (11..=20).collect::<Vec<_>>()
    );
}

/// The fleet's report writes touch no queued row: the read ahead survives them.
#[test]
fn a_report_written_meanwhile_keeps_the_read_ahead() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.db");
    let (store, _) = with_batch_on_the_wire(&path, 30, 10);
    store.read_ahead(10);
    store.report_add(1, r#"{"report_id":1}"#).unwrap();
    store.reports_delete(&[1]).unwrap();
    let other = rusqlite::Connection::open(&path).unwrap();
    other
        .execute(
            r#"UPDATE events SET body = replace(body, '"e11"', '"x"') WHERE seq = 11"#,
            [],
        )
        .unwrap();
    assert!(store.oldest(10).unwrap()[0].json.contains(r#""e11""#));
}

fn counts(path: &Path, seq: u64) -> (u32, u32) {
    rusqlite::Connection::open(path)
        .unwrap()
        .query_row(
            "SELECT sends, unanswered FROM events WHERE seq = ?1",
            [seq as i64],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .unwrap()
}

/// An app killed while its request is on the wire counts that send (decision 0043): the
/// record written before the request is applied to the rows at the next open.
#[test]
fn a_send_cut_short_by_a_crash_is_counted_at_the_next_open() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.db");
    let (store, first) = with_batch_on_the_wire(&path, 30, 10);
    store.note_sends(&first, SendNote::Sending).unwrap();
    assert_eq!(
        counts(&path, first[0]),
        (0, 0),
        "the count is on the record, not yet on the rows"
    );
    // A crash: no clean close, the handle just goes.
    drop(store);
    let store = open(&path);
    for seq in &first {
        assert_eq!(counts(&path, *seq), (1, 1), "row {seq}");
    }
    assert_eq!(counts(&path, 11), (0, 0), "a row that was not on the wire");
    let read = store.oldest(10).unwrap();
    assert!(read.iter().all(|e| (e.sends, e.unanswered) == (1, 1)));
}

/// A timeout (no answer, nothing noted) and a resend of the same rows: both sends count.
/// An answer then takes back the last one's `unanswered`, as before the record.
#[test]
fn a_resend_after_a_timeout_counts_both_sends() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.db");
    let (store, first) = with_batch_on_the_wire(&path, 30, 10);
    store.note_sends(&first, SendNote::Sending).unwrap();
    store.note_sends(&first, SendNote::Sending).unwrap();
    store.note_sends(&first, SendNote::Answered).unwrap();
    assert_eq!(counts(&path, first[0]), (2, 1));
    drop(store);
    let _store = open(&path);
    assert_eq!(
        counts(&path, first[0]),
        (2, 1),
        "nothing left to apply at open"
    );
}

/// A batch given back unanswered (the app went offline) is read again with its send counted.
#[test]
fn a_batch_given_back_is_read_with_its_send() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.db");
    let (store, first) = with_batch_on_the_wire(&path, 30, 10);
    store.note_sends(&first, SendNote::Sending).unwrap();
    store.release(&first);
    let read = store.oldest(10).unwrap();
    assert_eq!(seqs(&read), first);
    assert!(
        read.iter().all(|e| (e.sends, e.unanswered) == (1, 1)),
        "read without the send it was given back after: {:?}",
        read.iter()
            .map(|e| (e.sends, e.unanswered))
            .collect::<Vec<_>>()
    );
}

/// Delivered rows leave with the next batch's first commit, and never get the count of the
/// send that delivered them: a reopen after that commit finds neither them nor a record to
/// apply to rows that took their seqs.
#[test]
fn delivered_rows_leave_without_their_count() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.db");
    let (store, first) = with_batch_on_the_wire(&path, 30, 10);
    store.note_sends(&first, SendNote::Sending).unwrap();
    store.delete_later(&first).unwrap();
    assert_eq!(store.len(), 20, "delivered rows are no longer counted");
    let second = seqs(&store.oldest(10).unwrap());
    assert_eq!(second, (11..=20).collect::<Vec<_>>());
    store.lease(&second);
    store.note_sends(&second, SendNote::Sending).unwrap();
    store.settle();
    let left: i64 = rusqlite::Connection::open(&path)
        .unwrap()
        .query_row("SELECT count(*) FROM events WHERE seq <= 10", [], |r| {
            r.get(0)
        })
        .unwrap();
    assert_eq!(left, 0, "the delivered rows are deleted");
    drop(store);
    let _store = open(&path);
    assert_eq!(
        counts(&path, 11),
        (1, 1),
        "the batch on the wire at the crash"
    );
    assert_eq!(counts(&path, 21), (0, 0));
}

/// A read ahead reads the in-order rows below the batch on the wire, then those above it,
/// without stepping over the batch: the rows below it are not lost, and it is the read ahead
/// that the next batch takes (a row renamed by another connection meanwhile keeps the name
/// it was read with).
#[test]
fn a_read_ahead_reads_around_the_batch_on_the_wire() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.db");
    let store = open(&path);
    let rows: Vec<_> = (1..=30).map(|s| event(s, LANE_NORMAL)).collect();
    store.insert(&rows).unwrap();
    store.lease(&(5..=14).collect::<Vec<_>>());
    store.read_ahead(20);
    let other = rusqlite::Connection::open(&path).unwrap();
    other
        .execute(
            r#"UPDATE events SET body = replace(body, '"e15"', '"renamed"') WHERE seq = 15"#,
            [],
        )
        .unwrap();
    let next = store.oldest(20).unwrap();
    let expected: Vec<u64> = (1..=4).chain(15..=30).collect();
    assert_eq!(seqs(&next), expected);
    assert!(
        next[4].json.contains(r#""e15""#),
        "the batch was read again, not taken from the read ahead"
    );
}

/// Delivered rows are deleted a run of consecutive seqs per statement: rows between the runs,
/// which were not delivered, stay.
#[test]
fn delivered_rows_with_gaps_between_them_leave_alone() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.db");
    let (store, first) = with_batch_on_the_wire(&path, 12, 12);
    assert_eq!(first, (1..=12).collect::<Vec<_>>());
    store.delete_later(&[10, 2, 3, 4, 7, 9]).unwrap();
    store.settle();
    assert_eq!(other_seqs(&path), vec![1, 5, 6, 8, 11, 12]);
    store.delete_later(&[12, 11, 1]).unwrap();
    store.settle();
    assert_eq!(other_seqs(&path), vec![5, 6, 8]);
}

fn other_seqs(path: &Path) -> Vec<u64> {
    let conn = rusqlite::Connection::open(path).unwrap();
    let mut stmt = conn.prepare("SELECT seq FROM events ORDER BY seq").unwrap();
    stmt.query_map([], |r| r.get::<_, i64>(0))
        .unwrap()
        .map(|s| s.unwrap() as u64)
        .collect()
}

/// A report a 2xx covered costs no commit of its own between the answer and the next request:
/// it is no longer read at once, its row stays until the next settle deletes it with the
/// delivered rows (a crash before that sends it again, and the collector counts its id once),
/// and the read ahead made meanwhile still holds.
#[test]
fn a_covered_report_is_deleted_with_the_delivered_rows() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.db");
    let (store, first) = with_batch_on_the_wire(&path, 30, 10);
    store.report_add(1, r#"{"report_id":1}"#).unwrap();
    store.report_add(2, r#"{"report_id":2}"#).unwrap();
    store.read_ahead(10);
    let on_disk = |id: i64| -> i64 {
        rusqlite::Connection::open(&path)
            .unwrap()
            .query_row("SELECT count(*) FROM reports WHERE id = ?1", [id], |r| {
                r.get(0)
            })
            .unwrap()
    };
    store.reports_delete(&[1]).unwrap();
    store.delete_later(&first).unwrap();
    assert_eq!(on_disk(1), 1, "deleted by a commit of its own");
    let ids: Vec<u64> = store.reports().unwrap().iter().map(|(id, _)| *id).collect();
    assert_eq!(ids, vec![2], "a covered report is still read");
    let other = rusqlite::Connection::open(&path).unwrap();
    other
        .execute(
            r#"UPDATE events SET body = replace(body, '"e11"', '"x"') WHERE seq = 11"#,
            [],
        )
        .unwrap();
    assert!(
        store.oldest(10).unwrap()[0].json.contains(r#""e11""#),
        "the read ahead was not taken"
    );
    store.settle();
    assert_eq!(on_disk(1), 0, "the settle did not delete it");
    assert_eq!(on_disk(2), 1);
}

/// Moves with every commit another connection (the store's) makes (`PRAGMA data_version`).
fn commits_seen(other: &rusqlite::Connection) -> i64 {
    other
        .query_row("PRAGMA data_version", [], |r| r.get(0))
        .unwrap()
}

/// `first` sent, and the store's work while it is on the wire done: the next rows read ahead
/// and recorded (decision 0077).
fn with_next_batch_recorded(path: &Path) -> (Store, Vec<u64>) {
    let (store, first) = with_batch_on_the_wire(path, 30, 10);
    store.note_sends(&first, SendNote::Sending).unwrap();
    store.read_ahead(10);
    store.settle_recording_ahead();
    (store, first)
}

/// Draining, the batch read ahead while the one before it was on the wire leaves without a
/// commit: its send was recorded with the read (decision 0077). Without that, every request
/// of a drain waited for a commit after the answer before it. The read ahead holds across
/// the commit that recorded it (a row renamed by another connection keeps the name it was read
/// with), and a crash while the batch is on the wire counts its send.
#[test]
fn the_batch_recorded_ahead_leaves_without_a_commit() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.db");
    let (store, first) = with_next_batch_recorded(&path);
    let other = rusqlite::Connection::open(&path).unwrap();
    other
        .execute(
            r#"UPDATE events SET body = replace(body, '"e11"', '"renamed"') WHERE seq = 11"#,
            [],
        )
        .unwrap();
    // The answer: `first` delivered.
    store.delete_later(&first).unwrap();
    let next = store.oldest(10).unwrap();
    assert!(
        next[0].json.contains(r#""e11""#),
        "the read ahead was not kept"
    );
    let second = seqs(&next);
    assert_eq!(second, (11..=20).collect::<Vec<_>>());
    store.lease(&second);
    let before = commits_seen(&other);
    store.note_sends(&second, SendNote::Sending).unwrap();
    assert_eq!(
        commits_seen(&other),
        before,
        "the send of a batch recorded ahead committed"
    );
    drop(store);
    let _store = open(&path);
    for seq in &second {
        assert_eq!(counts(&path, *seq), (1, 1), "row {seq}");
    }
    assert_eq!(counts(&path, 21), (0, 0), "a row that was never recorded");
}

/// A crash after the next batch was recorded ahead and before it left counts a send its rows
/// had not had yet: early, like a crash between any record and its request, never one too few.
#[test]
fn a_crash_before_the_batch_recorded_ahead_leaves_counts_its_send_early() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.db");
    let (store, first) = with_next_batch_recorded(&path);
    drop(store);
    let _store = open(&path);
    assert_eq!(counts(&path, first[0]), (1, 1), "the batch on the wire");
    assert_eq!(counts(&path, 11), (1, 1), "the batch recorded ahead");
    assert_eq!(counts(&path, 21), (0, 0), "a row past both");
}

/// A batch other than the one recorded ahead (here the batch on the wire again, after a
/// timeout) records itself, and the rows recorded ahead leave the record: a crash then counts
/// no send on them.
#[test]
fn a_resend_instead_of_the_batch_recorded_ahead_takes_it_off_the_record() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.db");
    let (store, first) = with_next_batch_recorded(&path);
    let other = rusqlite::Connection::open(&path).unwrap();
    let before = commits_seen(&other);
    store.note_sends(&first, SendNote::Sending).unwrap();
    assert_ne!(commits_seen(&other), before, "the resend was not recorded");
    drop(store);
    let _store = open(&path);
    assert_eq!(counts(&path, first[0]), (2, 2), "both sends of the batch");
    assert_eq!(
        counts(&path, 11),
        (0, 0),
        "rows recorded ahead and never sent"
    );
}

/// A batch recorded ahead whose answer failed (a 503) gets its send and the answer on its rows,
/// as one recorded by its own send does.
#[test]
fn an_answer_to_the_batch_recorded_ahead_is_counted_on_its_rows() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.db");
    let (store, first) = with_next_batch_recorded(&path);
    store.delete_later(&first).unwrap();
    let second = seqs(&store.oldest(10).unwrap());
    store.lease(&second);
    store.note_sends(&second, SendNote::Sending).unwrap();
    store.note_sends(&second, SendNote::Answered).unwrap();
    assert_eq!(counts(&path, second[0]), (1, 0));
    drop(store);
    let _store = open(&path);
    assert_eq!(
        counts(&path, second[0]),
        (1, 0),
        "nothing left to apply at open"
    );
}
