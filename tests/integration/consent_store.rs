//! What a denial leaves in the store (README §Consent), where it meets a failing disk, a reader
//! holding the file and a restart: the deletion is finished or retried, never claimed when it
//! did not happen; the install id goes with it; an opt-out is kept like consent.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use eventspool::{Consent, DeliveryState, DropReason, Error, EventSpool};
use serde_json::json;

use crate::common::*;
use crate::consent::files_contain;

const MARK: &str = "consent-store-secret-51c0";

/// A spool on a store in `dir`, `n` events tracked with the marked value and written to the
/// store (nothing sent: the collector is far, the spool offline until the test says so).
fn spool_with_kept_events(dir: &Path, url: &str, n: usize) -> (EventSpool, Arc<Recorder>) {
    spool_on_clock(dir, url, n, instant_clock())
}

fn spool_on_clock(
    dir: &Path,
    url: &str,
    n: usize,
    clock: Arc<dyn eventspool::Clock>,
) -> (EventSpool, Arc<Recorder>) {
    let mut c = eventspool::Config::new(url);
    c.db_path = Some(dir.join("events.db"));
    c.memory_capacity = 5;
    c.min_batch_interval_ms = 0;
    let recorder = Arc::new(Recorder::default());
    let spool = EventSpool::builder(c)
        .clock(clock)
        .observer(recorder.clone())
        .start_offline()
        .open()
        .unwrap();
    for i in 0..n {
        spool
            .track("private", json!({ "secret": format!("{MARK}-{i:04}") }))
            .unwrap();
    }
    spool.persist().unwrap();
    assert!(
        !files_contain(dir, MARK.as_bytes()).is_empty(),
        "the values are on disk before the denial (or this test proves nothing)"
    );
    (spool, recorder)
}

/// A failed delete: the denial is still in force (nothing is sent, the error says the
/// deletion did not finish), and the deletion is tried again until it has happened.
#[test]
fn a_failed_delete_leaves_the_spool_not_delivering_and_is_retried() {
    let collector = collector();
    let dir = tempfile::tempdir().unwrap();
    // A stepped clock: the worker's retries come only when the test moves it, so both the
    // verb's delete and the worker's first one meet the fault.
    let (clock, dyn_clock) = manual_clock();
    let (spool, _recorder) = spool_on_clock(dir.path(), &collector.url(), 50, dyn_clock);
    eventspool::testing::fail_consent_deletes(&dir.path().join("events.db"), 2);
    let denied = spool.set_consent(Consent::Denied);
    assert!(
        denied.is_err(),
        "a deletion that failed is not reported as done"
    );
    assert_eq!(spool.consent(), Consent::Denied, "the denial holds");
    // The network is back and the app asks to send: the stored backlog must stay unsent.
    spool.set_online(true);
    spool.flush();
    wait_state(&spool, "disabled", |s| *s == DeliveryState::Disabled);
    assert!(matches!(
        spool.track("after", json!({})),
        Err(Error::ConsentDenied)
    ));
    assert_eq!(spool.stats().pending, 50, "nothing deleted yet");
    // The worker tries again every 5 s of its clock until the delete happens.
    let deadline = Instant::now() + WAIT;
    while spool.stats().pending > 0 && Instant::now() < deadline {
        clock.advance(Duration::from_secs(5));
        std::thread::sleep(Duration::from_millis(20));
    }
    let stats = spool.stats();
    assert_eq!(stats.pending, 0, "the deletion was retried: {stats:?}");
    assert_eq!(stats.dropped(DropReason::ConsentDenied), 50, "{stats:?}");
    assert_eq!(collector.request_count(), 0, "nothing was sent meanwhile");
    let hits = files_contain(dir.path(), MARK.as_bytes());
    assert!(hits.is_empty(), "tracked values left in {hits:?}");
    spool.shutdown(WAIT).unwrap();
}

/// "WAL truncated" with a reader holding the file (`eventspool status` is one): the denial
/// reports within a bound that the WAL still holds the deleted bytes, names it, and the
/// truncation is done once the reader lets go.
#[test]
fn a_reader_holding_the_wal_is_reported_and_the_truncation_retried() {
    let collector = collector();
    let dir = tempfile::tempdir().unwrap();
    let (spool, _recorder) = spool_with_kept_events(dir.path(), &collector.url(), 300);
    let db = dir.path().join("events.db");
    let reader = rusqlite::Connection::open(&db).unwrap();
    reader
        .execute_batch("BEGIN; SELECT count(*) FROM meta;")
        .unwrap();
    let started = Instant::now();
    let denied = spool.set_consent(Consent::Denied);
    let took = started.elapsed();
    let in_wal = files_contain(dir.path(), MARK.as_bytes());
    assert!(
        denied.is_err(),
        "set_consent(Denied) returned Ok after {took:?} with tracked values still in {in_wal:?}"
    );
    let text = denied.unwrap_err().to_string();
    assert!(
        text.contains("WAL") && text.contains("events.db-wal"),
        "{text}"
    );
    assert!(took < Duration::from_secs(4), "bounded: took {took:?}");
    reader.execute_batch("COMMIT").unwrap();
    drop(reader);
    let deadline = Instant::now() + WAIT;
    while !files_contain(dir.path(), MARK.as_bytes()).is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let hits = files_contain(dir.path(), MARK.as_bytes());
    assert!(
        hits.is_empty(),
        "after the reader closed, values left in {hits:?}"
    );
    spool.shutdown(WAIT).unwrap();
}

/// The install id names the install while the user agrees; a denial deletes it (the store
/// keeps none), and a new grant makes a new one, so reports before and after cannot be linked.
#[test]
fn a_denial_deletes_the_install_id_and_a_new_grant_makes_a_new_one() {
    let collector = collector();
    let dir = tempfile::tempdir().unwrap();
    let (spool, _recorder) = spool_with_kept_events(dir.path(), &collector.url(), 3);
    let first = spool.install_id().expect("an id while granted");
    assert_eq!(first.len(), 32, "128 bits as hex: {first}");
    assert!(first.bytes().all(|b| b.is_ascii_hexdigit()), "{first}");
    spool.set_consent(Consent::Denied).unwrap();
    assert_eq!(spool.install_id(), None, "no id while denied");
    let hits = files_contain(dir.path(), first.as_bytes());
    assert!(hits.is_empty(), "the old install id is left in {hits:?}");
    spool.set_consent(Consent::Granted).unwrap();
    let second = spool.install_id().expect("a new id after a new grant");
    assert_ne!(first, second);
    assert_eq!(second.len(), 32);
    spool.shutdown(WAIT).unwrap();
    drop(spool);
    let mut c = eventspool::Config::new(collector.url());
    c.db_path = Some(dir.path().join("events.db"));
    let spool = EventSpool::builder(c)
        .clock(instant_clock())
        .start_offline()
        .open()
        .unwrap();
    assert_eq!(spool.install_id(), Some(second), "kept while granted");
}

/// `set_enabled(false)` is kept like consent: the spool opens disabled after a restart, so a
/// restored backlog past `flush_at` is not sent before the app says so.
#[test]
fn an_opt_out_outlives_a_restart() {
    let collector = collector();
    let dir = tempfile::tempdir().unwrap();
    let (spool, _recorder) = spool_with_kept_events(dir.path(), &collector.url(), 40);
    spool.set_enabled(false).unwrap();
    spool.shutdown(WAIT).unwrap();
    drop(spool);
    let mut c = config(&collector);
    c.db_path = Some(dir.path().join("events.db"));
    c.flush_at = 10;
    let recorder = Arc::new(Recorder::default());
    let spool = EventSpool::builder(c)
        .clock(instant_clock())
        .observer(recorder.clone())
        .open()
        .unwrap();
    assert_eq!(spool.stats().restored, 40);
    assert_eq!(
        spool.state().state,
        DeliveryState::Disabled,
        "opens disabled"
    );
    assert!(matches!(spool.track("x", json!({})), Err(Error::Disabled)));
    spool.flush();
    spool.wait_for(Duration::from_millis(300), |_| false);
    assert_eq!(
        collector.request_count(),
        0,
        "the backlog waits for the app"
    );
    spool.set_enabled(true).unwrap();
    assert!(spool.wait_drained(WAIT), "{}", spool.state());
    assert_eq!(collector.distinct_count(), 40);
}

/// A spool can open disabled (config `enabled = false`): nothing is sent, whatever the store
/// holds, until `set_enabled(true)`.
#[test]
fn a_spool_opens_disabled_when_the_config_says_so() {
    let collector = collector();
    let dir = tempfile::tempdir().unwrap();
    let (spool, _recorder) = spool_with_kept_events(dir.path(), &collector.url(), 20);
    spool.shutdown(WAIT).unwrap();
    drop(spool);
    let mut c = config(&collector);
    c.db_path = Some(dir.path().join("events.db"));
    c.flush_at = 5;
    c.enabled = false;
    let spool = EventSpool::builder(c)
        .clock(instant_clock())
        .open()
        .unwrap();
    assert_eq!(spool.state().state, DeliveryState::Disabled);
    spool.flush();
    spool.wait_for(Duration::from_millis(300), |_| false);
    assert_eq!(collector.request_count(), 0);
    spool.set_enabled(true).unwrap();
    assert!(spool.wait_drained(WAIT), "{}", spool.state());
    assert_eq!(collector.distinct_count(), 20);
}

/// A transport that answers 503 at once, as an app's own HTTP stack might.
struct Busy;

impl eventspool::Transport for Busy {
    fn send(
        &self,
        _request: eventspool::HttpRequest,
    ) -> futures_util::future::BoxFuture<
        'static,
        Result<eventspool::HttpResponse, eventspool::TransportError>,
    > {
        Box::pin(std::future::ready(Ok(eventspool::HttpResponse {
            status: 503,
            ..Default::default()
        })))
    }
}

/// A batch the worker holds for its retry is not on the wire: it is among the kept events a
/// denial deletes, before set_consent returns. Before, the denial spared every leased row (a
/// request on the wire may finish), so the held batch's payload stayed in the store until the
/// worker next ran. The worker is stepped by hand here, so nothing runs between the verb and
/// the look at the files. Found by the simulation (RELIABILITY.md §Simulation).
#[test]
fn a_batch_held_for_its_retry_is_deleted_by_the_denial_itself() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = eventspool::Config::new("https://collector.invalid/v1/batch");
    c.db_path = Some(dir.path().join("events.db"));
    c.memory_capacity = 5;
    let (_clock, dyn_clock) = manual_clock();
    let (spool, mut stepper) = EventSpool::builder(c)
        .clock(dyn_clock)
        .transport(Arc::new(Busy))
        .open_stepped()
        .unwrap();
    for i in 0..10 {
        spool
            .track("private", json!({ "secret": format!("{MARK}-{i:04}") }))
            .unwrap();
    }
    spool.persist().unwrap();
    spool.flush();
    for _ in 0..100 {
        if !stepper.poll_worker() {
            break;
        }
    }
    assert!(
        matches!(spool.state().state, DeliveryState::RetryScheduled { .. }),
        "the batch is held for its retry: {:?}",
        spool.state()
    );
    spool.set_consent(Consent::Denied).unwrap();
    let hits = files_contain(dir.path(), MARK.as_bytes());
    let stats = spool.stats();
    assert!(
        hits.is_empty(),
        "after set_consent(Denied) returned Ok, the held batch's values are in {hits:?}; {stats:?}"
    );
    assert_eq!(stats.pending, 0, "{stats:?}");
    assert_eq!(stats.dropped(DropReason::ConsentDenied), 10, "{stats:?}");
    // The worker's own view afterwards: nothing comes back from the released batch.
    for _ in 0..100 {
        if !stepper.poll_worker() {
            break;
        }
    }
    let stats = spool.stats();
    assert_eq!(stats.pending, 0, "{stats:?}");
    assert_eq!(
        stats.dropped(DropReason::ConsentDenied),
        10,
        "counted once: {stats:?}"
    );
    assert!(stats.balances(), "{stats:?}");
    stepper.request_stop();
    while stepper.running() {
        stepper.poll_worker();
    }
    spool.shutdown(WAIT).unwrap();
}

/// The worker carries out a denial's deletion it decided on, and the app grants again before
/// it gets there: the deletion is the denial's, so it must not touch what the grant made (its
/// install id, the events tracked under it). The worker is held right before its deletion while
/// the app grants and tracks.
#[test]
fn a_deletion_the_worker_owes_a_denial_does_not_run_after_a_new_grant() {
    let collector = collector();
    let dir = tempfile::tempdir().unwrap();
    let (spool, _recorder) = spool_with_kept_events(dir.path(), &collector.url(), 3);
    let (reached_tx, reached_rx) = std::sync::mpsc::channel::<()>();
    let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
    let go_rx = std::sync::Mutex::new(go_rx);
    let reached_tx = std::sync::Mutex::new(reached_tx);
    eventspool::testing::before_worker_discard(&dir.path().join("events.db"), move || {
        let _ = reached_tx.lock().unwrap().send(());
        // Bounded: a test that fails elsewhere never leaves the worker stuck.
        let _ = go_rx.lock().unwrap().recv_timeout(Duration::from_secs(20));
    });
    spool.set_consent(Consent::Denied).unwrap();
    reached_rx
        .recv_timeout(WAIT)
        .expect("the worker carries out the denial's deletion");
    spool.set_consent(Consent::Granted).unwrap();
    let granted_id = spool.install_id().expect("an id after the new grant");
    let ids: Vec<String> = (0..10)
        .map(|i| {
            spool
                .track("after_grant", json!({ "i": i }))
                .unwrap()
                .to_string()
        })
        .collect();
    spool.persist().unwrap();
    go_tx.send(()).unwrap();
    // The worker's actions run in order: by the time the grant's events are delivered, the
    // deletion it held has run (or been left out).
    spool.set_online(true);
    spool.flush();
    let delivered = collector.wait_for_distinct(10, Duration::from_secs(20));
    let stats = spool.stats();
    assert!(
        delivered,
        "the events tracked under the grant were deleted by the denial's deletion: {} of 10 delivered, {stats:?}",
        collector.distinct_count()
    );
    assert!(ids.iter().all(|id| collector.contains(id)));
    assert_eq!(
        spool.install_id().as_deref(),
        Some(granted_id.as_str()),
        "the install id of the grant was deleted after it"
    );
    assert_eq!(
        stats.dropped(DropReason::ConsentDenied),
        3,
        "only the denial's 3 events are dropped"
    );
    spool.shutdown(WAIT).unwrap();
}

/// A transport that keeps every request on the wire until the test answers it, and records the
/// event ids each request carried.
#[derive(Default)]
struct Held {
    answers: std::sync::Mutex<Vec<tokio::sync::oneshot::Sender<(u16, String)>>>,
    sent: std::sync::Mutex<Vec<Vec<String>>>,
}

impl eventspool::Transport for Held {
    fn send(
        &self,
        request: eventspool::HttpRequest,
    ) -> futures_util::future::BoxFuture<
        'static,
        Result<eventspool::HttpResponse, eventspool::TransportError>,
    > {
        let body: serde_json::Value = serde_json::from_slice(&request.body).unwrap();
        let ids = body["batch"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["event_id"].as_str().unwrap().to_string())
            .collect();
        self.sent.lock().unwrap().push(ids);
        let (answer, answered) = tokio::sync::oneshot::channel();
        self.answers.lock().unwrap().push(answer);
        Box::pin(async move {
            let (status, body) = answered.await.unwrap_or((503, String::new()));
            Ok(eventspool::HttpResponse {
                status,
                body: body.into_bytes(),
                ..Default::default()
            })
        })
    }
}

/// README §Consent: a batch on the wire when consent is denied may finish, and if it comes back
/// unanswered its events are deleted too. Before, a grant that followed the denial before the
/// answer came hid the denial from the worker (it saw only the latest consent), so the failed
/// batch was kept for its retry and sent again under the new grant: events the user's "no"
/// covered went out after it.
#[test]
fn a_batch_on_the_wire_at_a_denial_is_not_resent_after_a_quick_grant() {
    not_resent_after_a_quick_grant(503, false);
}

/// The same with the batch's rows in the store (they must leave no byte in the file) and a 413
/// (the batch would come back to be sent again in halves).
#[test]
fn a_stored_batch_on_the_wire_at_a_denial_is_not_split_and_resent_after_a_quick_grant() {
    not_resent_after_a_quick_grant(413, true);
}

/// The same with every event rejected for good in a 2xx: they would be kept as dead letters,
/// which the denial deleted too.
#[test]
fn a_stored_batch_on_the_wire_at_a_denial_is_not_quarantined_after_a_quick_grant() {
    not_resent_after_a_quick_grant(0, true);
}

/// `status` 0: a 200 rejecting every event of the batch.
fn not_resent_after_a_quick_grant(status: u16, stored: bool) {
    let dir = tempfile::tempdir().unwrap();
    let mut c = eventspool::Config::new("https://collector.invalid/v1/batch");
    c.db_path = Some(dir.path().join("events.db"));
    c.compression = eventspool::Compression::None;
    c.min_batch_interval_ms = 0;
    let transport = Arc::new(Held::default());
    let (spool, mut stepper) = EventSpool::builder(c)
        .clock(instant_clock())
        .transport(transport.clone())
        .open_stepped()
        .unwrap();
    for i in 0..10 {
        spool
            .track("private", json!({ "secret": format!("{MARK}-{i:04}") }))
            .unwrap();
    }
    if stored {
        assert_eq!(spool.persist().unwrap(), 10);
    }
    spool.flush();
    for _ in 0..100 {
        if !stepper.poll_worker() {
            break;
        }
    }
    let on_wire = transport.sent.lock().unwrap().clone();
    assert_eq!(on_wire.len(), 1, "one request on the wire: {on_wire:?}");
    assert_eq!(on_wire[0].len(), 10);
    spool.set_consent(Consent::Denied).unwrap();
    spool.set_consent(Consent::Granted).unwrap();
    let answer = transport.answers.lock().unwrap().remove(0);
    let answer_body = match status {
        0 => json!({"rejected": on_wire[0].iter()
            .map(|id| json!({"event_id": id, "reason": "schema"}))
            .collect::<Vec<_>>()})
        .to_string(),
        _ => String::new(),
    };
    answer.send((status.max(200), answer_body)).unwrap();
    for _ in 0..200 {
        if !stepper.poll_worker() {
            break;
        }
        // Any later request is answered at once, so the worker never stops on one.
        for answer in transport.answers.lock().unwrap().drain(..) {
            let _ = answer.send((200, String::new()));
        }
    }
    let sent = transport.sent.lock().unwrap().clone();
    let resent: Vec<&String> = sent[1..]
        .iter()
        .flatten()
        .filter(|id| on_wire[0].contains(id))
        .collect();
    assert!(
        resent.is_empty(),
        "sent again after the denial: {} of 10 in {} later requests",
        resent.len(),
        sent.len() - 1
    );
    let stats = spool.stats();
    assert_eq!(stats.pending, 0, "{stats:?}");
    assert_eq!(stats.dropped(DropReason::ConsentDenied), 10, "{stats:?}");
    assert_eq!(stats.quarantined, 0, "{stats:?}");
    let hits = files_contain(dir.path(), MARK.as_bytes());
    assert!(hits.is_empty(), "the denied values are in {hits:?}");
}

/// A crash while the spared batch is on the wire, after a quick grant: the next open must not
/// send it either. The spared rows are recorded with the denial's deletion, and the open that
/// finds the record deletes them.
#[test]
fn a_batch_spared_on_the_wire_is_not_sent_after_a_crash() {
    let dir = tempfile::tempdir().unwrap();
    let config = || {
        let mut c = eventspool::Config::new("https://collector.invalid/v1/batch");
        c.db_path = Some(dir.path().join("events.db"));
        c.compression = eventspool::Compression::None;
        c.min_batch_interval_ms = 0;
        c
    };
    let transport = Arc::new(Held::default());
    let (spool, mut stepper) = EventSpool::builder(config())
        .clock(instant_clock())
        .transport(transport.clone())
        .open_stepped()
        .unwrap();
    for i in 0..10 {
        spool
            .track("private", json!({ "secret": format!("{MARK}-{i:04}") }))
            .unwrap();
    }
    assert_eq!(spool.persist().unwrap(), 10);
    spool.flush();
    for _ in 0..100 {
        if !stepper.poll_worker() {
            break;
        }
    }
    let on_wire = transport.sent.lock().unwrap()[0].clone();
    assert_eq!(on_wire.len(), 10);
    spool.set_consent(Consent::Denied).unwrap();
    spool.set_consent(Consent::Granted).unwrap();
    spool.crash();
    drop(stepper);

    let after = Arc::new(Held::default());
    let (spool, mut stepper) = EventSpool::builder(config())
        .clock(instant_clock())
        .transport(after.clone())
        .open_stepped()
        .unwrap();
    spool.flush();
    for _ in 0..200 {
        if !stepper.poll_worker() {
            break;
        }
        for answer in after.answers.lock().unwrap().drain(..) {
            let _ = answer.send((200, String::new()));
        }
    }
    let sent: Vec<String> = after.sent.lock().unwrap().concat();
    let resent = sent.iter().filter(|id| on_wire.contains(id)).count();
    assert_eq!(resent, 0, "sent again after the restart: {resent} of 10");
    let stats = spool.stats();
    assert_eq!(stats.pending, 0, "{stats:?}");
    let hits = files_contain(dir.path(), MARK.as_bytes());
    assert!(hits.is_empty(), "the denied values are in {hits:?}");
}

/// A denial spares the request on the wire, not what the worker holds beside it: after a 413
/// the worker sends half the batch and keeps the other half for after it. That half is among
/// the kept events the denial deletes before it returns, and it is never sent, also after a
/// quick grant. Found by the simulation (`Step::OnWire`).
#[test]
fn the_half_held_beside_the_request_on_the_wire_is_deleted_by_the_denial() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = eventspool::Config::new("https://collector.invalid/v1/batch");
    c.db_path = Some(dir.path().join("events.db"));
    c.compression = eventspool::Compression::None;
    c.min_batch_interval_ms = 0;
    let transport = Arc::new(Held::default());
    let (spool, mut stepper) = EventSpool::builder(c)
        .clock(instant_clock())
        .transport(transport.clone())
        .open_stepped()
        .unwrap();
    let secret = |i: usize| format!("{MARK}-{i:04}");
    for i in 0..10 {
        spool
            .track("private", json!({ "secret": secret(i) }))
            .unwrap();
    }
    assert_eq!(spool.persist().unwrap(), 10);
    spool.flush();
    let poll = |stepper: &mut eventspool::testing::Stepper| {
        for _ in 0..100 {
            if !stepper.poll_worker() {
                break;
            }
        }
    };
    poll(&mut stepper);
    let all = transport.sent.lock().unwrap()[0].clone();
    let first = transport.answers.lock().unwrap().remove(0);
    first.send((413, String::new())).unwrap();
    poll(&mut stepper);
    let sent = transport.sent.lock().unwrap().clone();
    assert_eq!(sent.len(), 2, "the first half is on the wire: {sent:?}");
    let on_wire = sent[1].clone();
    assert!(on_wire.len() < all.len(), "{on_wire:?}");
    let held: Vec<usize> = (0..10).filter(|i| !on_wire.contains(&all[*i])).collect();
    spool.set_consent(Consent::Denied).unwrap();
    for i in &held {
        let hits = files_contain(dir.path(), secret(*i).as_bytes());
        assert!(
            hits.is_empty(),
            "after set_consent(Denied) returned Ok, held event {i} is in {hits:?}"
        );
    }
    spool.set_consent(Consent::Granted).unwrap();
    let answer = transport.answers.lock().unwrap().remove(0);
    answer.send((200, String::new())).unwrap();
    for _ in 0..200 {
        if !stepper.poll_worker() {
            break;
        }
        for answer in transport.answers.lock().unwrap().drain(..) {
            let _ = answer.send((200, String::new()));
        }
    }
    let later: Vec<String> = transport.sent.lock().unwrap()[2..].concat();
    let resent: Vec<&String> = later.iter().filter(|id| all.contains(id)).collect();
    assert!(resent.is_empty(), "sent after the denial: {resent:?}");
    let stats = spool.stats();
    assert_eq!(stats.pending, 0, "{stats:?}");
    assert_eq!(
        stats.dropped(DropReason::ConsentDenied) + stats.delivered,
        10,
        "{stats:?}"
    );
}

/// A denial whose deletion failed is finished by the next grant. When that grant comes while
/// the request of the denial's time is still on the wire, the request is spared again: before,
/// the grant deleted its rows and counted its events `consent_denied`, then the answer counted
/// them delivered too. Found by the simulation (`Step::OnWire`).
#[test]
fn a_grant_finishing_a_failed_denial_spares_the_request_on_the_wire() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("events.db");
    let mut c = eventspool::Config::new("https://collector.invalid/v1/batch");
    c.db_path = Some(db.clone());
    c.compression = eventspool::Compression::None;
    c.min_batch_interval_ms = 0;
    let transport = Arc::new(Held::default());
    // A clock that moves only when told: a worker with nothing to do waits and the poll
    // returns, so a defect here fails the test instead of spinning the worker.
    let (_clock, clock) = manual_clock();
    let (spool, mut stepper) = EventSpool::builder(c)
        .clock(clock)
        .transport(transport.clone())
        .open_stepped()
        .unwrap();
    for i in 0..10 {
        spool
            .track("private", json!({ "secret": format!("{MARK}-{i:04}") }))
            .unwrap();
    }
    assert_eq!(spool.persist().unwrap(), 10);
    spool.flush();
    for _ in 0..100 {
        if !stepper.poll_worker() {
            break;
        }
    }
    assert_eq!(transport.sent.lock().unwrap().len(), 1, "on the wire");
    eventspool::testing::fail_consent_deletes(&db, 1);
    assert!(matches!(
        spool.set_consent(Consent::Denied),
        Err(Error::WipeIncomplete(_))
    ));
    spool.set_consent(Consent::Granted).unwrap();
    let answer = transport.answers.lock().unwrap().remove(0);
    answer.send((200, String::new())).unwrap();
    for _ in 0..100 {
        if !stepper.poll_worker() {
            break;
        }
    }
    let stats = spool.stats();
    assert_eq!(
        (stats.delivered, stats.dropped(DropReason::ConsentDenied)),
        (10, 0),
        "each event counted once: {stats:?}"
    );
    assert_eq!(stats.pending, 0, "{stats:?}");
}

/// The open that deletes a spared batch (above) must not hand its seqs out again: the store's
/// frontier (which rows skip the ordering index) was read before the deletion and still names
/// the last of them, so every event tracked after the restart with a seq at or below it went
/// into the index until the store drained. Found by the simulation (`Step::OnWire`).
#[test]
fn events_after_an_open_that_deleted_a_spared_batch_skip_the_ordering_index() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("events.db");
    let config = || {
        let mut c = eventspool::Config::new("https://collector.invalid/v1/batch");
        c.db_path = Some(db.clone());
        c.compression = eventspool::Compression::None;
        c.min_batch_interval_ms = 0;
        c
    };
    let transport = Arc::new(Held::default());
    let (spool, mut stepper) = EventSpool::builder(config())
        .clock(instant_clock())
        .transport(transport.clone())
        .open_stepped()
        .unwrap();
    for i in 0..10 {
        spool.track("before", json!({ "i": i })).unwrap();
    }
    assert_eq!(spool.persist().unwrap(), 10);
    spool.flush();
    for _ in 0..100 {
        if !stepper.poll_worker() {
            break;
        }
    }
    assert_eq!(transport.sent.lock().unwrap().len(), 1, "on the wire");
    spool.set_consent(Consent::Denied).unwrap();
    spool.set_consent(Consent::Granted).unwrap();
    spool.crash();
    drop(stepper);

    let (spool, _stepper) = EventSpool::builder(config())
        .clock(instant_clock())
        .transport(Arc::new(Held::default()))
        .open_stepped()
        .unwrap();
    for i in 0..10 {
        spool.track("after", json!({ "i": i })).unwrap();
    }
    assert_eq!(spool.persist().unwrap(), 10);
    let reader = rusqlite::Connection::open(&db).unwrap();
    let (rows, indexed): (i64, i64) = reader
        .query_row(
            "SELECT count(*), count(*) FILTER (WHERE in_order = 0) FROM events",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .unwrap();
    assert_eq!(rows, 10);
    assert_eq!(
        indexed, 0,
        "{indexed} of the 10 events tracked in order after the restart went into the ordering index"
    );
}

/// The answers that stop delivery are recorded so that they hold after a restart (README
/// §Consent). A restart after a power cut is one: SQLite keeps what was written after a file's
/// last sync only if the power stays on, and the store commits with `synchronous = NORMAL`,
/// which syncs the WAL only at checkpoints. So each "no" must be synced before its verb
/// returns, or the spool could open after the cut as if the user had never said it. The worker
/// is stepped by hand (and stays still): its own writes after a denial (it carries out its
/// part of the deletion) are not the verb's, and a thread writing them while the test looks
/// made the look race with them.
#[test]
fn each_no_is_synced_to_disk_before_its_verb_returns() {
    let collector = collector();
    let dir = tempfile::tempdir().unwrap();
    let mut c = eventspool::Config::new(collector.url());
    c.db_path = Some(dir.path().join("events.db"));
    let faults = eventspool::StoreFaults::new();
    let (spool, mut stepper) = EventSpool::builder(c)
        .clock(instant_clock())
        .store_faults(faults.clone())
        .start_offline()
        .open_stepped()
        .unwrap();
    let mut unsynced = Vec::new();
    type Verb = fn(&EventSpool) -> eventspool::Result<()>;
    let verbs: [(&str, Verb); 4] = [
        ("set_enabled(false)", |s| s.set_enabled(false)),
        ("set_enabled(true)", |s| s.set_enabled(true)),
        ("set_consent(Pending)", |s| s.set_consent(Consent::Pending)),
        ("set_consent(Denied)", |s| s.set_consent(Consent::Denied)),
    ];
    for (what, verb) in verbs {
        // Written and committed, not synced: what a power cut may take back.
        spool.track("e", json!({"n": 1})).ok();
        spool.persist().ok();
        verb(&spool).unwrap();
        if what != "set_enabled(true)" {
            unsynced.push((what, faults.unsynced_bytes().1));
        }
    }
    // The WAL is what a commit writes; the database file is written only by checkpoints, which
    // sync the WAL first.
    assert!(
        unsynced.iter().all(|(_, wal)| *wal == 0),
        "bytes of the WAL written and not synced when the verb returned: {unsynced:?}"
    );
    stepper.request_stop();
    while stepper.running() {
        stepper.poll_worker();
    }
    spool.shutdown(Duration::from_secs(2)).unwrap();
}
