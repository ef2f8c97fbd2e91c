//! The ritual most integration tests begin with, written once: a fresh reference collector on
//! 127.0.0.1, a spool on it with the test's config, a stepped clock and a recording observer,
//! some events tracked, a flush, then a wait for a state whose fields the test reads.
//!
//! ```ignore
//! let rig = rig().collector(|c| c.push_statuses(&[503])).open();
//! rig.track_n("e", 3);
//! let (attempt, status) =
//!     rig.flush_until(pick!(DeliveryState::RetryScheduled { attempt, .. } => attempt));
//! ```

use std::ops::Deref;
use std::sync::Arc;

use eventspool::{Config, DeliveryState, DeliveryStatus, EventId, EventSpool, ManualClock};
use eventspool_collector::ReferenceCollector;
use serde_json::json;

use crate::common::{Recorder, WAIT, collector, config};

/// A spool under test with everything it was opened with. Derefs to the spool.
pub struct Rig {
    pub collector: ReferenceCollector,
    pub clock: Arc<ManualClock>,
    pub recorder: Arc<Recorder>,
    /// The config the spool was opened with.
    pub config: Config,
    pub spool: EventSpool,
    /// Where the store lives when the rig was opened `stored()`; removed with the rig.
    _dir: tempfile::TempDir,
}

/// How a [`Rig`] is opened; start with [`rig`].
pub struct RigBuilder {
    collector: ReferenceCollector,
    config: Config,
    stored: bool,
    offline: bool,
    auto_advance: bool,
    jitter_seed: Option<u64>,
}

/// A rig on a fresh collector, with [`config`]'s settings (no throttle between batches), a
/// stepped clock that stands still until the test moves it, and a [`Recorder`].
pub fn rig() -> RigBuilder {
    let collector = collector();
    let config = config(&collector);
    RigBuilder {
        collector,
        config,
        stored: false,
        offline: false,
        auto_advance: false,
        jitter_seed: None,
    }
}

impl RigBuilder {
    /// Scripts or configures the collector before the spool can reach it.
    pub fn collector(self, f: impl FnOnce(&ReferenceCollector)) -> RigBuilder {
        f(&self.collector);
        self
    }

    /// Changes the spool's config before it opens.
    pub fn config(mut self, f: impl FnOnce(&mut Config)) -> RigBuilder {
        f(&mut self.config);
        self
    }

    /// Keeps the queue in an SQLite file in the rig's temp dir (`events.db`).
    pub fn stored(mut self) -> RigBuilder {
        self.stored = true;
        self
    }

    /// Opens the spool offline: nothing is sent until `set_online(true)`.
    pub fn offline(mut self) -> RigBuilder {
        self.offline = true;
        self
    }

    /// A clock whose sleeps complete at once: backoffs and throttles pass in virtual time.
    pub fn instant(mut self) -> RigBuilder {
        self.auto_advance = true;
        self
    }

    /// Seeds the retry jitter, so a run replays exactly.
    pub fn seed(mut self, seed: u64) -> RigBuilder {
        self.jitter_seed = Some(seed);
        self
    }

    pub fn open(self) -> Rig {
        let dir = tempfile::tempdir().expect("temp dir for the store");
        let mut config = self.config;
        if self.stored {
            config.db_path = Some(dir.path().join("events.db"));
        }
        let clock = Arc::new(ManualClock::new(1_764_417_600_000));
        clock.set_auto_advance(self.auto_advance);
        let recorder = Arc::new(Recorder::default());
        let mut builder = EventSpool::builder(config.clone())
            .clock(Arc::new(clock.clone()))
            .observer(recorder.clone());
        if let Some(seed) = self.jitter_seed {
            builder = builder.jitter_seed(seed);
        }
        if self.offline {
            builder = builder.start_offline();
        }
        let spool = builder.open().expect("the spool opens");
        Rig {
            collector: self.collector,
            clock,
            recorder,
            config,
            spool,
            _dir: dir,
        }
    }
}

impl Rig {
    /// Tracks `n` events named `name`, each with its index as the property `i`; their ids.
    pub fn track_n(&self, name: &str, n: usize) -> Vec<EventId> {
        (0..n)
            .map(|i| self.spool.track(name, json!({ "i": i })).expect("track"))
            .collect()
    }

    /// Flushes, then waits for the first state `pick` takes a value from: that value and the
    /// whole status it came from. Fails the test, naming the state, if none comes in time.
    pub fn flush_until<T>(
        &self,
        pick: impl Fn(&DeliveryState) -> Option<T>,
    ) -> (T, DeliveryStatus) {
        self.spool.flush();
        self.until(pick)
    }

    /// Waits, without flushing, like [`Rig::flush_until`].
    pub fn until<T>(&self, pick: impl Fn(&DeliveryState) -> Option<T>) -> (T, DeliveryStatus) {
        let status = self
            .spool
            .wait_for(WAIT, |s| pick(&s.state).is_some())
            .unwrap_or_else(|| {
                panic!(
                    "timed out waiting for a state; the state is {}",
                    self.spool.state()
                )
            });
        let value = pick(&status.state).expect("the state just matched");
        (value, status)
    }

    /// Flushes and waits until nothing is pending, failing the test with the state otherwise.
    pub fn flush_drained(&self) {
        self.spool.flush();
        assert!(self.spool.wait_drained(WAIT), "{}", self.spool.state());
    }
}

impl Deref for Rig {
    type Target = EventSpool;

    fn deref(&self) -> &EventSpool {
        &self.spool
    }
}

/// The `pick` of [`Rig::until`] for one pattern of [`DeliveryState`]: the value of `$out` (its
/// bindings are owned copies), or `()` without `=>`.
/// `pick!(DeliveryState::RetryScheduled { retry_in_ms, .. } => retry_in_ms)`.
macro_rules! pick {
    ($pat:pat => $out:expr) => {
        |s: &eventspool::DeliveryState| match s.clone() {
            $pat => Some($out),
            _ => None,
        }
    };
    ($pat:pat) => {
        |s: &eventspool::DeliveryState| match s {
            $pat => Some(()),
            _ => None,
        }
    };
}
pub(crate) use pick;
