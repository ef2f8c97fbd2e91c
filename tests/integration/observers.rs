//! Observers that go away: a screen registers one with `add_observer` and drops or removes the
//! handle when it closes; from then on it is told nothing and the spool holds no reference to it.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use eventspool::{DeliveryObserver, DeliveryState, DeliveryStatus, EventSpool, ObserverHandle};

use crate::common::*;

/// Two observers, one removed with `remove()` and one by dropping its handle, while a third
/// stays: after two settled rounds and a full delivery, the gone ones were told nothing more and
/// the spool let go of them.
#[test]
fn a_removed_observer_hears_nothing_more_and_is_released() {
    let collector = collector();
    let spool = EventSpool::builder(config(&collector))
        .start_offline()
        .open()
        .unwrap();
    let removed = Arc::new(Recorder::default());
    let dropped = Arc::new(Recorder::default());
    // Registered last, so once it is shown a status the two before it were shown it too.
    let kept = Arc::new(Recorder::default());
    let removed_handle = spool.add_observer(removed.clone());
    let dropped_handle = spool.add_observer(dropped.clone());
    let _kept_handle = spool.add_observer(kept.clone());
    settle(&spool, &kept);
    let (removed_seen, dropped_seen) = (removed.seen().len(), dropped.seen().len());
    assert!(
        removed_seen >= 2 && dropped_seen >= 2,
        "all three heard the first round: {removed_seen}, {dropped_seen}"
    );

    removed_handle.remove();
    drop(dropped_handle);
    let kept_seen = kept.seen().len();
    settle(&spool, &kept);
    spool.set_online(true);
    spool.flush();
    assert!(spool.wait_drained(WAIT), "{}", spool.state());
    wait_state(&spool, "idle", |s| matches!(s, DeliveryState::Idle));
    spool.set_online(false);
    settle(&spool, &kept);

    assert!(
        kept.seen().len() >= kept_seen + 5,
        "the kept observer heard the later changes: {} then {}",
        kept_seen,
        kept.seen().len()
    );
    assert_eq!(removed.seen().len(), removed_seen, "removed, yet told");
    assert_eq!(
        dropped.seen().len(),
        dropped_seen,
        "handle dropped, yet told"
    );
    assert_eq!(Arc::strong_count(&removed), 1, "the spool still holds it");
    assert_eq!(Arc::strong_count(&dropped), 1, "the spool still holds it");
    assert!(collector.distinct_count() >= 4, "delivery went on");
}

/// Removes itself the first time it is told something it can act on.
struct RemovesItself {
    handle: Mutex<Option<ObserverHandle>>,
    calls: AtomicUsize,
}

impl DeliveryObserver for RemovesItself {
    fn on_state(&self, _: &DeliveryStatus) {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let handle = self.handle.lock().unwrap().take();
        if let Some(handle) = handle {
            handle.remove();
        }
    }
}

/// Removal from inside the observer's own callback (on the worker's thread) neither deadlocks
/// nor lets another call through.
#[test]
fn an_observer_may_remove_itself_from_its_callback() {
    let collector = collector();
    let spool = EventSpool::builder(config(&collector))
        .start_offline()
        .open()
        .unwrap();
    let observer = Arc::new(RemovesItself {
        handle: Mutex::new(None),
        calls: AtomicUsize::new(0),
    });
    let handle = spool.add_observer(observer.clone());
    *observer.handle.lock().unwrap() = Some(handle);
    let recorder = Arc::new(Recorder::default());
    let _recorder = spool.add_observer(recorder.clone());
    settle(&spool, &recorder);
    assert!(
        observer.handle.lock().unwrap().is_none(),
        "it was told something and removed itself"
    );
    let calls = observer.calls.load(Ordering::SeqCst);
    settle(&spool, &recorder);
    spool.set_online(true);
    assert!(spool.wait_drained(WAIT), "{}", spool.state());
    spool.set_online(false);
    settle(&spool, &recorder);
    assert_eq!(observer.calls.load(Ordering::SeqCst), calls);
    assert_eq!(Arc::strong_count(&observer), 1, "the spool still holds it");
}
