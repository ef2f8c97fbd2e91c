//! Tracking consent (README §Consent): `pending` keeps and sends nothing, `granted` sends the
//! backlog, `denied` deletes what was kept (counted `consent_denied`, never sent, nothing left
//! on disk) and refuses new events. The state survives a restart.

use std::collections::HashSet;
use std::path::Path;
use std::sync::{Arc, Barrier};

use eventspool::{Consent, DeferReason, DeliveryState, DropReason, Error, EventSpool};
use serde_json::json;

use crate::common::*;

fn deferred(s: &DeliveryState) -> bool {
    matches!(
        s,
        DeliveryState::Deferred {
            reason: DeferReason::Consent
        }
    )
}

/// Every file eventspool wrote in `dir` (database, WAL, SHM, lock), read whole.
pub fn files_contain(dir: &Path, needle: &[u8]) -> Vec<String> {
    let mut hits = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let bytes = std::fs::read(&path).unwrap();
        if bytes.windows(needle.len()).any(|w| w == needle) {
            hits.push(path.display().to_string());
        }
    }
    hits
}

/// Pending → restart → granted: the events tracked while pending were stored, not sent, are
/// still pending after the restart (the store remembers `pending` though the config says
/// `granted`), and all go out once consent is granted.
#[test]
fn pending_then_restart_then_granted_delivers_what_was_tracked_while_pending() {
    let collector = collector();
    let dir = tempfile::tempdir().unwrap();
    let mut c = config(&collector);
    c.db_path = Some(dir.path().join("events.db"));
    c.flush_at = 5;
    let recorder = Arc::new(Recorder::default());
    let spool = EventSpool::builder(c.clone())
        .clock(instant_clock())
        .observer(recorder.clone())
        .open()
        .unwrap();
    spool.set_consent(Consent::Pending).unwrap();
    assert_eq!(spool.consent(), Consent::Pending);
    let tracked: HashSet<String> = (0..40)
        .map(|i| spool.track("kept", json!({ "i": i })).unwrap().to_string())
        .collect();
    wait_state(&spool, "deferred", deferred);
    // Past flush_at and every timer: still nothing sent.
    let shown = settle(&spool, &recorder);
    assert!(deferred(&shown.state), "{shown:?}");
    assert_eq!(collector.request_count(), 0, "nothing sent while pending");
    let before = spool.stats().pending;
    assert_eq!(before, 42, "40 events and settle's 2");
    spool.shutdown(WAIT).unwrap();
    drop(spool);

    let recorder = Arc::new(Recorder::default());
    let spool = EventSpool::builder(c)
        .clock(instant_clock())
        .observer(recorder.clone())
        .open()
        .unwrap();
    assert_eq!(spool.consent(), Consent::Pending, "the store remembers");
    assert_eq!(spool.stats().restored, 42);
    let shown = settle(&spool, &recorder);
    assert!(deferred(&shown.state), "still deferred: {shown:?}");
    assert_eq!(
        collector.request_count(),
        0,
        "nothing sent after the restart"
    );

    spool.set_consent(Consent::Granted).unwrap();
    assert!(spool.wait_drained(WAIT), "{}", spool.state());
    let stats = spool.stats();
    assert_eq!(
        stats.delivered, 44,
        "the 42 restored and settle's 2: {stats:?}"
    );
    assert_eq!(collector.distinct_count(), 44);
    let kept: Vec<_> = collector
        .events()
        .into_iter()
        .filter(|e| e.name == "kept")
        .collect();
    assert_eq!(kept.len(), 40, "every event tracked while pending arrived");
    assert!(kept.iter().all(|e| tracked.contains(&e.event_id)));
}

/// Pending → denied: nothing is ever sent, every kept event is counted `consent_denied`, new
/// events are refused, and none of the tracked values is left in the database, its WAL or any
/// other file next to it; the denial holds after a restart.
#[test]
fn pending_then_denied_sends_nothing_and_leaves_nothing_on_disk() {
    let collector = collector();
    let dir = tempfile::tempdir().unwrap();
    let mut c = config(&collector);
    c.db_path = Some(dir.path().join("events.db"));
    c.memory_capacity = 10;
    c.consent = Consent::Pending;
    let spool = EventSpool::builder(c.clone())
        .clock(instant_clock())
        .open()
        .unwrap();
    assert_eq!(
        spool.consent(),
        Consent::Pending,
        "the config's initial state"
    );
    const MARK: &str = "consent-secret-7f3a91";
    for i in 0..300 {
        spool
            .track("private", json!({ "secret": format!("{MARK}-{i:04}") }))
            .unwrap();
    }
    spool.persist().unwrap();
    assert!(
        !files_contain(dir.path(), MARK.as_bytes()).is_empty(),
        "the values are on disk before the denial (or this test proves nothing)"
    );
    spool.set_consent(Consent::Denied).unwrap();
    let hits = files_contain(dir.path(), MARK.as_bytes());
    assert!(hits.is_empty(), "tracked values left in {hits:?}");
    assert!(matches!(
        spool.track("after", json!({ "secret": MARK })),
        Err(Error::ConsentDenied)
    ));
    wait_state(&spool, "disabled", |s| *s == DeliveryState::Disabled);
    let stats = spool.stats();
    assert_eq!(stats.dropped(DropReason::ConsentDenied), 300, "{stats:?}");
    assert_eq!((stats.pending, stats.delivered), (0, 0));
    assert_eq!(collector.request_count(), 0, "nothing ever sent");
    spool.shutdown(WAIT).unwrap();
    drop(spool);
    let hits = files_contain(dir.path(), MARK.as_bytes());
    assert!(
        hits.is_empty(),
        "after shutdown, tracked values left in {hits:?}"
    );
    let status = eventspool::admin::inspect(&dir.path().join("events.db")).unwrap();
    assert_eq!(status.consent, Some(Consent::Denied));
    assert_eq!(status.dropped.get("consent_denied"), Some(&300));

    let spool = EventSpool::builder(c)
        .clock(instant_clock())
        .open()
        .unwrap();
    assert_eq!(spool.consent(), Consent::Denied, "the denial holds");
    assert!(matches!(
        spool.track("again", json!({})),
        Err(Error::ConsentDenied)
    ));
    assert_eq!(collector.request_count(), 0);
}

/// Events tracked from other threads while consent changes from pending: under `granted`
/// each event `track()` accepted is delivered; under `denied` each one is deleted and counted,
/// none is sent, and nothing stays queued. Bounded rounds, each with a fresh spool.
#[test]
fn an_event_tracked_while_consent_changes_is_sent_or_deleted() {
    const THREADS: usize = 3;
    const PER_THREAD: usize = 300;
    for round in 0..16 {
        let to = if round % 2 == 0 {
            Consent::Granted
        } else {
            Consent::Denied
        };
        let collector = collector();
        let dir = tempfile::tempdir().unwrap();
        let mut c = config(&collector);
        c.consent = Consent::Pending;
        c.flush_at = 7;
        c.max_batch_events = 50;
        if round % 4 < 2 {
            c.db_path = Some(dir.path().join("events.db"));
            c.memory_capacity = 64;
        }
        let spool = EventSpool::builder(c)
            .clock(instant_clock())
            .open()
            .unwrap();
        let start = Arc::new(Barrier::new(THREADS + 1));
        let workers: Vec<_> = (0..THREADS)
            .map(|t| {
                let spool = spool.clone();
                let start = start.clone();
                std::thread::spawn(move || {
                    start.wait();
                    let mut ok = Vec::new();
                    let mut refused = 0;
                    for i in 0..PER_THREAD {
                        match spool.track("race", json!({ "t": t, "i": i })) {
                            Ok(id) => ok.push(id.to_string()),
                            Err(Error::ConsentDenied) => refused += 1,
                            Err(e) => panic!("unexpected {e}"),
                        }
                    }
                    (ok, refused)
                })
            })
            .collect();
        start.wait();
        // Let part of the events in first, then change consent while the others track.
        while spool.stats().tracked < 100 {
            std::thread::yield_now();
        }
        spool.set_consent(to).unwrap();
        let mut accepted = Vec::new();
        let mut refused = 0;
        for w in workers {
            let (ok, r) = w.join().unwrap();
            accepted.extend(ok);
            refused += r;
        }
        assert_eq!(accepted.len() + refused, THREADS * PER_THREAD);
        let stats = spool.stats();
        match to {
            Consent::Granted => {
                assert_eq!(refused, 0, "round {round}");
                assert!(spool.wait_drained(WAIT), "round {round}: {}", spool.state());
                for id in &accepted {
                    assert!(collector.contains(id), "round {round}: {id} not delivered");
                }
                assert_eq!(spool.stats().delivered, accepted.len() as u64);
            }
            _ => {
                assert_eq!(
                    collector.request_count(),
                    0,
                    "round {round}: something sent"
                );
                assert_eq!(
                    stats.dropped(DropReason::ConsentDenied),
                    accepted.len() as u64,
                    "round {round}: every accepted event deleted and counted: {stats:?}"
                );
                assert_eq!(stats.pending, 0, "round {round}: nothing left queued");
                assert_eq!(spool.stats().pending_disk, 0, "round {round}");
            }
        }
        spool.shutdown(WAIT).unwrap();
    }
}

/// Stops the worker the first time it shows `Sending` (it has taken its batch and is about to
/// send it) until the test has made its call: the app's verb then lands exactly between taking
/// a batch and sending it.
struct HoldAtSending {
    reached: std::sync::Mutex<Option<std::sync::mpsc::Sender<()>>>,
    release: std::sync::Mutex<Option<std::sync::mpsc::Receiver<()>>>,
}

impl eventspool::DeliveryObserver for HoldAtSending {
    fn on_state(&self, status: &eventspool::DeliveryStatus) {
        if status.state != DeliveryState::Sending {
            return;
        }
        let Some(reached) = self.reached.lock().unwrap().take() else {
            return;
        };
        let release = self.release.lock().unwrap().take().expect("one release");
        reached.send(()).unwrap();
        release
            .recv_timeout(WAIT)
            .expect("the test releases the worker");
    }
}

/// README §Consent: once `set_consent(Denied)` or `set_enabled(false)` has returned, no request
/// starts, also when the verb lands between the worker taking a batch and sending it. Both
/// verbs, with and without a store.
#[test]
fn no_request_starts_after_denial_or_opt_out_returned() {
    for (round, opt_out) in [(0, false), (1, true), (2, false), (3, true)] {
        let collector = collector();
        let dir = tempfile::tempdir().unwrap();
        let mut c = config(&collector);
        c.flush_at = 1_000;
        if round >= 2 {
            c.db_path = Some(dir.path().join("events.db"));
            c.memory_capacity = 5;
        }
        let (reached_tx, reached) = std::sync::mpsc::channel();
        let (release, release_rx) = std::sync::mpsc::channel();
        let hold = Arc::new(HoldAtSending {
            reached: std::sync::Mutex::new(Some(reached_tx)),
            release: std::sync::Mutex::new(Some(release_rx)),
        });
        let spool = EventSpool::builder(c)
            .clock(instant_clock())
            .observer(hold)
            .open()
            .unwrap();
        for i in 0..20 {
            spool.track("private", json!({ "i": i })).unwrap();
        }
        spool.persist().unwrap();
        spool.flush();
        reached
            .recv_timeout(WAIT)
            .expect("the worker takes a batch");
        if opt_out {
            spool.set_enabled(false).unwrap();
        } else {
            spool.set_consent(Consent::Denied).unwrap();
        }
        release.send(()).unwrap();
        wait_state(&spool, "disabled", |s| *s == DeliveryState::Disabled);
        // A turn later, whatever the worker was going to do it has done.
        spool.wait_for(std::time::Duration::from_millis(300), |_| false);
        assert_eq!(
            collector.request_count(),
            0,
            "round {round} ({}): a request started after the verb returned",
            if opt_out {
                "set_enabled(false)"
            } else {
                "set_consent(Denied)"
            }
        );
        let stats = spool.stats();
        assert_eq!(stats.delivered, 0, "round {round}: {stats:?}");
        assert_eq!(stats.requests, 0, "round {round}: {stats:?}");
        if !opt_out {
            assert_eq!(
                stats.dropped(DropReason::ConsentDenied),
                20,
                "round {round}: the batch taken is deleted with the rest: {stats:?}"
            );
        } else {
            assert_eq!(
                stats.pending, 20,
                "round {round}: opted out keeps: {stats:?}"
            );
        }
        spool.shutdown(WAIT).unwrap();
    }
}
