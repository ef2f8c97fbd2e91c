//! An observer that calls back into the spool from inside its callbacks.
//! Shared by the integration and reliability suites.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock, mpsc};
use std::time::Duration;

use eventspool::{
    DeliveryObserver, DeliveryStatus, EventSpool, ListFilter, NewEvent, Notice, Selector,
};
use serde_json::json;

/// Calls every verb of the API on `spool`, `shutdown` last, writing which one it is in before
/// each call so a test that times out can name the call that never returned.
pub fn call_every_verb(spool: &EventSpool, progress: &Mutex<String>) {
    let step = |name: &str| *progress.lock().unwrap() = name.to_string();
    step("state");
    let _ = spool.state();
    step("stats");
    let _ = spool.stats();
    step("track");
    let _ = spool.track("from_observer", json!({}));
    step("track_batch");
    let _ = spool.track_batch(&[NewEvent::new("from_observer", json!({}))]);
    step("persist");
    let _ = spool.persist();
    step("purge_pending");
    let _ = spool.purge_pending();
    step("quarantine_list");
    let _ = spool.quarantine_list(&ListFilter::default());
    step("quarantine_get");
    let _ = spool.quarantine_get("0193a0a0-0000-7000-8000-000000000000");
    step("quarantine_redrive");
    let _ = spool.quarantine_redrive(&Selector::All);
    step("quarantine_purge");
    let _ = spool.quarantine_purge(&Selector::All);
    step("set_online");
    spool.set_online(true);
    step("flush");
    spool.flush();
    step("retry_now");
    spool.retry_now();
    step("dismiss");
    spool.dismiss();
    step("resume");
    spool.resume();
    step("set_api_key");
    let _ = spool.set_api_key(None);
    step("set_enabled");
    let _ = spool.set_enabled(true);
    step("add_observer");
    let added = spool.add_observer(Arc::new(|_: &DeliveryStatus| {}));
    step("remove observer");
    added.remove();
    step("wait_drained");
    let _ = spool.wait_drained(Duration::ZERO);
    step("shutdown");
    let _ = spool.shutdown(Duration::from_secs(1));
    step("returned");
}

/// An observer that, the first time it is told something of the chosen kind, calls every verb
/// of the spool from inside the callback, then reports that it returned.
pub struct Reentrant {
    pub on_notice: bool,
    pub spool: OnceLock<EventSpool>,
    pub fired: AtomicBool,
    pub progress: Mutex<String>,
    pub done: Mutex<Option<mpsc::Sender<String>>>,
}

impl Reentrant {
    pub fn new(on_notice: bool) -> (Arc<Reentrant>, mpsc::Receiver<String>) {
        let (tx, rx) = mpsc::channel();
        let observer = Arc::new(Reentrant {
            on_notice,
            spool: OnceLock::new(),
            fired: AtomicBool::new(false),
            progress: Mutex::new("not called".into()),
            done: Mutex::new(Some(tx)),
        });
        (observer, rx)
    }

    fn fire(&self, what: String) {
        let Some(spool) = self.spool.get() else {
            return;
        };
        if self.fired.swap(true, Ordering::SeqCst) {
            return;
        }
        call_every_verb(spool, &self.progress);
        if let Some(tx) = self.done.lock().unwrap().take() {
            let _ = tx.send(what);
        }
    }

    /// Fails the test, naming the verb, if the observer's calls did not all return in time.
    pub fn assert_returned(&self, rx: &mpsc::Receiver<String>, timeout: Duration) -> String {
        match rx.recv_timeout(timeout) {
            Ok(what) => what,
            Err(_) => panic!(
                "deadlock: an observer calling back into the spool never returned; stuck in `{}`",
                self.progress.lock().unwrap()
            ),
        }
    }
}

impl DeliveryObserver for Reentrant {
    fn on_state(&self, status: &DeliveryStatus) {
        if !self.on_notice {
            self.fire(format!("on_state({status})"));
        }
    }

    fn on_notice(&self, notice: &Notice) {
        if self.on_notice {
            self.fire(format!("on_notice({notice:?})"));
        }
    }
}
