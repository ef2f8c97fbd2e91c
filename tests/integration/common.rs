use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use eventspool::{
    Clock, Config, DeliveryObserver, DeliveryState, DeliveryStatus, EventSpool, ManualClock,
};
use eventspool_collector::{CollectorConfig, ReferenceCollector};

pub const WAIT: Duration = Duration::from_secs(60);

pub fn collector() -> ReferenceCollector {
    ReferenceCollector::start(CollectorConfig::default()).expect("collector starts")
}

/// A config for tests: no throttle between batches, otherwise the defaults.
pub fn config(collector: &ReferenceCollector) -> Config {
    let mut c = Config::new(collector.url());
    c.min_batch_interval_ms = 0;
    c
}

/// A stepped clock (the test moves time) and the same clock as the spool sees it.
pub fn manual_clock() -> (Arc<ManualClock>, Arc<dyn Clock>) {
    let clock = Arc::new(ManualClock::new(1_764_417_600_000));
    (clock.clone(), Arc::new(clock))
}

/// A clock whose sleeps complete at once: backoffs and throttles happen in virtual time.
pub fn instant_clock() -> Arc<dyn Clock> {
    Arc::new(Arc::new(ManualClock::auto_advancing(1_764_417_600_000)))
}

/// Records every status an observer is shown.
#[derive(Default)]
pub struct Recorder(pub Mutex<Vec<DeliveryStatus>>);

impl DeliveryObserver for Recorder {
    fn on_state(&self, status: &DeliveryStatus) {
        self.0.lock().unwrap().push(status.clone());
    }
}

impl Recorder {
    pub fn seen(&self) -> Vec<DeliveryStatus> {
        self.0.lock().unwrap().clone()
    }
}

pub fn wait_state(
    spool: &EventSpool,
    what: &str,
    pred: impl Fn(&DeliveryState) -> bool,
) -> DeliveryStatus {
    spool
        .wait_for(WAIT, |s| pred(&s.state))
        .unwrap_or_else(|| panic!("timed out waiting for {what}; state is {}", spool.state()))
}

/// Every id the collector ever received is one the app tracked: resends kept their `event_id`.
pub fn assert_ids_kept(collector: &ReferenceCollector, tracked: &HashSet<String>) {
    for request in collector.requests() {
        for id in &request.event_ids {
            assert!(tracked.contains(id), "collector received unknown id {id}");
        }
    }
}

/// A known point for "nothing happened" checks, instead of a sleep: returns once the worker has
/// taken in every call made before this one. Each of two rounds tracks a marker event and wakes
/// the worker with `dismiss()` (a no-op outside a retry), then waits until the observer is shown
/// the new pending count. The second count can only be shown by a worker turn that began after
/// the first was shown, so after every earlier call had been made. Call it only in `Idle`,
/// `Offline` or `Paused`; it tracks two events. Returns the last status shown.
pub fn settle(spool: &EventSpool, recorder: &Recorder) -> DeliveryStatus {
    let mut shown = None;
    for _ in 0..2 {
        let from = recorder.seen().len();
        let target = spool.stats().pending + 1;
        spool.track("settle", serde_json::json!({})).unwrap();
        spool.dismiss();
        let found = || {
            recorder.seen()[from..]
                .iter()
                .find(|s| s.pending == target)
                .cloned()
        };
        spool.wait_for(WAIT, |_| found().is_some());
        shown = Some(found().unwrap_or_else(|| {
            panic!(
                "the worker never showed {target} pending; state is {}",
                spool.state()
            )
        }));
    }
    shown.expect("two rounds ran")
}

/// Past every timer the worker may have: periodic flush, the longest backoff, `Retry-After`.
pub const PAST_EVERY_TIMER: Duration = Duration::from_secs(3600);
