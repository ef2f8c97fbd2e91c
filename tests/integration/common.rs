use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use eventspool::collector::{CollectorConfig, ReferenceCollector};
use eventspool::{
    Clock, Config, DeliveryObserver, DeliveryState, DeliveryStatus, EventSpool, ManualClock,
};

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
