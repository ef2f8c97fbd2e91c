//! What the app and its UI call on an open spool besides tracking: the device's conditions,
//! the flush, retry and dismiss of docs/delivery.md §States, the opt-out and consent (README
//! §Consent), state and stats, persist and shutdown, and the quarantine. Separate from
//! tracking because none of these makes events; each tells the worker or the queue something.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::EventSpool;
use crate::consent::Consent;
use crate::control::DrainRequest;
use crate::error::{Error, Result};
use crate::observers::ObserverHandle;
use crate::quarantine::{ListFilter, QuarantinedEvent, Selector};
use crate::state::{DeliveryConditions, DeliveryObserver, DeliveryStatus, DrainOutcome};
use crate::stats::Stats;
use crate::sync::lock;

impl EventSpool {
    /// Tells the spool whether the device has a network. Offline means no attempts at all; the
    /// offline → online edge starts a fresh failure episode and sends what is pending.
    pub fn set_online(&self, online: bool) {
        self.shared().control(|c| {
            if c.online != online {
                c.online = online;
                c.online_changed = true;
            }
        });
    }

    /// Tells the spool whether the app is in the foreground. Coming back to the foreground starts
    /// a fresh failure episode: from `RetryScheduled` or `WaitingForUser` it sends at once with
    /// the whole automatic budget again, as a reconnect does (the user is looking, and the
    /// outage may be long over). Going to the background changes nothing by itself.
    pub fn set_foreground(&self, foreground: bool) {
        self.shared().control(|c| {
            if c.foreground != foreground {
                c.foreground = foreground;
                c.foreground_changed = true;
            }
        });
    }

    /// Tells the spool what the platform knows about the device: a metered network, power
    /// saving, a low battery. Where the config says not to deliver under one of them
    /// (`deliver_on_metered`, `deliver_on_low_power`, `deliver_on_battery_low`), the state becomes
    /// `Deferred{reason}`: no attempt, no retry budget spent. When they allow it again, delivery
    /// resumes as after a reconnect (a fresh episode, what is pending goes now).
    pub fn set_conditions(&self, conditions: DeliveryConditions) {
        self.shared().control(|c| c.conditions = conditions);
    }

    /// Runs delivery for at most `budget` (on the spool's clock) and says how it ended: for a
    /// platform's background job (Android `JobService`, iOS `BGTaskScheduler`), which gets a
    /// time budget and reschedules itself from the answer. Blocks the calling thread; never call
    /// it on a UI thread. The worker does the sending, as always, so one request at a time is
    /// in flight however the drain and the app's other triggers overlap; this call only starts
    /// a drain (as `flush()` does, whatever `flush_at` says) and waits for its outcome:
    ///
    /// - [`DrainOutcome::Drained`]: the queue was found empty;
    /// - [`DrainOutcome::DeadlineReached`]: the budget passed with events pending. A request in
    ///   flight at that moment is not abandoned: the answer comes after it (within
    ///   `attempt_timeout_ms` of the link falling silent, at most 12 × `attempt_timeout_ms`
    ///   after it started), so leave at least `attempt_timeout_ms` of the budget unclaimed;
    /// - [`DrainOutcome::RetryAfter`]: the next attempt (a retry, or the slow probe behind
    ///   `WaitingForUser`) falls after the budget; reschedule the job `ms` from now. A retry due
    ///   within the budget is waited for;
    /// - [`DrainOutcome::Blocked`]: `Offline`, `Paused`, `Disabled` or `Deferred`; nothing goes
    ///   until that changes.
    ///
    /// Fails with [`Error::ShutDown`] after (or during) `shutdown()`, and with
    /// [`Error::WrongThread`] from inside a delivery observer (it runs on the worker the drain
    /// waits for).
    pub fn deliver_within(&self, budget: Duration) -> Result<DrainOutcome> {
        if self.handle.on_worker_thread() {
            return Err(Error::WrongThread(
                "deliver_within() from a delivery observer would wait for the thread it runs on"
                    .into(),
            ));
        }
        let s = self.shared();
        let (reply, outcome) = std::sync::mpsc::channel();
        {
            // Registered under admission, so a shutdown() either refuses it here or finds it in
            // the registry it empties (which wakes this caller).
            let _admitted = self.handle.admission.read_recursive();
            if self.handle.closed.load(Ordering::Relaxed) {
                return Err(Error::ShutDown);
            }
            let budget_ms = u64::try_from(budget.as_millis()).unwrap_or(u64::MAX);
            let mut drains = lock(&s.drains);
            drains.next_id += 1;
            let request = DrainRequest {
                id: drains.next_id,
                deadline_ms: s.clock.now_ms().saturating_add(budget_ms),
            };
            drains.waiting.push((request, reply));
            drop(drains);
            s.control(|c| c.drains.push(request));
        }
        outcome.recv().map_err(|_| Error::ShutDown)
    }

    /// Asks for pending events to be sent now (no effect while offline, paused or disabled).
    pub fn flush(&self) {
        self.shared().control(|c| c.flush = true);
    }

    /// Skips the countdown; from `WaitingForUser`, makes one manual attempt.
    pub fn retry_now(&self) {
        self.shared().control(|c| c.retry_now = true);
    }

    /// The user's "Back": stop retrying, keep every event, stay idle until the next trigger
    /// (the periodic flush, `flush()`, `retry_now()` or a reconnect), not `flush_at`.
    pub fn dismiss(&self) {
        self.shared().control(|c| c.dismiss = true);
    }

    /// Leaves `Paused`.
    pub fn resume(&self) {
        self.shared().control(|c| c.resume = true);
    }

    /// New credentials; leaves `Paused{auth}`.
    pub fn set_api_key(&self, api_key: Option<String>) -> Result<()> {
        if let Some(key) = &api_key {
            crate::config::check_api_key(key)?;
        }
        *lock(&self.shared().api_key) = api_key;
        self.shared().control(|c| c.api_key_changed = true);
        Ok(())
    }

    /// Opt-out: `false` stops delivery and makes `track()` return [`Error::Disabled`]; what is
    /// queued stays until [`EventSpool::purge_pending`] or `set_enabled(true)`. Once it has
    /// returned `false`, no request starts (one already on the wire may finish). Recorded in the
    /// store before it returns, so the spool opens disabled after a restart (README §Consent);
    /// an error says the record could not be written, and nothing changed.
    pub fn set_enabled(&self, enabled: bool) -> Result<()> {
        let _admitted = self.admit_verb()?;
        let _one_at_a_time = lock(&self.shared().consent_verb);
        let s = self.shared();
        s.queue.store_enabled(enabled)?;
        // Flag and control together under the gate: a send the worker has not started yet
        // sees `false` and is withheld (README §Consent).
        let _gate = s.send_gate.write();
        s.enabled.store(enabled, Ordering::SeqCst);
        s.control(|c| {
            if c.enabled != enabled {
                c.enabled = enabled;
                c.enabled_changed = true;
            }
        });
        Ok(())
    }

    /// Tracking consent (README §Consent). `Pending`: events are recorded and stored, nothing
    /// is sent (state `Deferred{Consent}`). `Granted`: the backlog and everything after are
    /// sent. `Denied`: everything kept for the user (queue, quarantine, waiting client reports,
    /// the install id) is deleted, counted `consent_denied`, never sent, and `track()` returns
    /// [`Error::ConsentDenied`]. Once it has returned anything but `Granted`, no request starts
    /// (one already on the wire may finish, and if its events come back unanswered they are
    /// deleted too). The state is recorded in the store before anything else, so it holds after a
    /// restart, and an open whose record says `denied` finishes the deletion first (a memory-only
    /// spool starts from the `consent` setting at each open).
    ///
    /// After `Denied`, `Ok` means no event a `track()` returned `Ok` for is left queued (except
    /// a batch on the wire) and the file keeps none of their bytes. [`Error::WipeIncomplete`]
    /// means the denial is recorded and in force but the deletion did not finish (a store error,
    /// or a reader holding the WAL); it is retried in the background, and a later `Granted` or
    /// `Pending` first finishes it (returning that error, with nothing changed, if it still
    /// cannot).
    pub fn set_consent(&self, consent: Consent) -> Result<()> {
        // Upgradable: held like a verb's shared admission (shutdown() waits for it), and turned
        // into the exclusive one below without letting go.
        let admitted = self.handle.admission.upgradable_read();
        if self.handle.closed.load(Ordering::Relaxed) {
            return Err(Error::ShutDown);
        }
        let _one_at_a_time = lock(&self.shared().consent_verb);
        let s = self.shared();
        if consent != Consent::Denied && s.discard_owed.load(Ordering::SeqCst) {
            // Nothing the last denial covered may go out under a new answer. A request that
            // was on the wire at that denial may still be: spared again, as it was then.
            let on_wire = {
                let _gate = s.send_gate.read();
                s.request_on_wire()
            };
            s.queue
                .discard_for_consent(crate::queue::WAL_TRUNCATE_BOUND, on_wire.as_deref())
                .map_err(|e| Error::WipeIncomplete(e.to_string()))?;
            s.discard_owed.store(false, Ordering::SeqCst);
        }
        s.queue.store_consent(consent)?;
        #[cfg(feature = "test-util")]
        if consent == Consent::Denied {
            crate::testing::denial_recorded();
        }
        // Whether the worker's batch is on the wire, read under the gate: once consent says no,
        // a batch not on the wire by now never goes, so the denial deletes it with the rest.
        let on_wire = {
            // Flag and control together under the gate: a send the worker has not started yet
            // sees the new consent and is withheld, and the worker is told before anything
            // below can fail.
            let _gate = s.send_gate.write();
            s.consent.store(consent.to_u8(), Ordering::SeqCst);
            s.control(|c| {
                if c.consent != consent {
                    c.consent = consent;
                    c.consent_changed = true;
                }
            });
            s.request_on_wire()
        };
        match consent {
            Consent::Denied => {
                // Waits for the track() calls already past their consent check, so their
                // events are queued before the discard below; every later call sees `Denied`.
                // Upgraded, not let go: shutdown() cannot slip in between.
                let all = parking_lot::RwLockUpgradableReadGuard::upgrade(admitted);
                let _admitted = parking_lot::RwLockWriteGuard::downgrade_to_upgradable(all);
                s.fleet.forget_install(&s.full_stats());
                if let Err(e) = s
                    .queue
                    .discard_for_consent(crate::queue::WAL_TRUNCATE_BOUND, on_wire.as_deref())
                {
                    s.discard_owed.store(true, Ordering::SeqCst);
                    s.wake.notify_one();
                    return Err(Error::WipeIncomplete(e.to_string()));
                }
            }
            Consent::Granted => s.fleet.ensure_install(&s.queue, &s.full_stats()),
            Consent::Pending => {}
        }
        Ok(())
    }

    /// The tracking consent in force.
    pub fn consent(&self) -> Consent {
        Consent::from_u8(self.shared().consent.load(Ordering::SeqCst))
    }

    /// Deletes every queued event (memory and store) that is not in flight; returns how many.
    pub fn purge_pending(&self) -> Result<u64> {
        let _admitted = self.admit_verb()?;
        self.shared().queue.purge()
    }

    /// The admission a verb that writes to the store holds for its whole run, as `track()`
    /// does: `shutdown()` waits for it before it persists and lets go of the store, so nothing
    /// of this handle writes after that (a second handle may own the file by then). Refused
    /// once the spool is shut down.
    fn admit_verb(&self) -> Result<parking_lot::RwLockReadGuard<'_, ()>> {
        let admitted = self.handle.admission.read_recursive();
        if self.handle.closed.load(Ordering::Relaxed) {
            return Err(Error::ShutDown);
        }
        Ok(admitted)
    }

    /// The current state, with `retry_in_ms` computed now.
    pub fn state(&self) -> DeliveryStatus {
        self.shared().status()
    }

    /// Registers another observer; it hears the next change. It stays registered while the
    /// returned handle lives: drop it or call [`ObserverHandle::remove`] when the screen that
    /// shows the state goes away (an observer given to [`SpoolBuilder::observer`] stays for the
    /// spool's lifetime instead).
    ///
    /// [`SpoolBuilder::observer`]: crate::SpoolBuilder::observer
    pub fn add_observer(&self, observer: Arc<dyn DeliveryObserver>) -> ObserverHandle {
        self.shared().observers.add(observer)
    }

    pub fn stats(&self) -> Stats {
        let s = self.shared();
        s.full_stats()
    }

    /// The random id this install reports under (128 bits from the OS's generator, made once
    /// and kept in the store; a memory-only spool makes a new one each time it opens). It names
    /// the install, nothing else. `None` while consent is denied: a denial deletes it, and the
    /// next grant makes a new one, so reports from before and after cannot be linked.
    pub fn install_id(&self) -> Option<String> {
        self.shared().fleet.install_id()
    }

    /// Ends the collector's directive in force ([`Stats::directive`]): its `sample_rate`,
    /// `drop_names` and `pause_until` stop holding now (its one-shot actions already ran and are
    /// not run again; a collector that sends it again starts it again). Returns whether one was
    /// in force. To refuse directives for good, set `directives = false`.
    pub fn clear_directive(&self) -> Result<bool> {
        if self.handle.closed.load(Ordering::Relaxed) {
            return Err(Error::ShutDown);
        }
        let s = self.shared();
        let was = s.fleet.clear(&s.queue, s.clock.now_ms());
        // The worker learns the pause ended at its next turn.
        s.wake.notify_one();
        Ok(was)
    }

    /// Waits (real time) until `done` holds for the current state or for one published while
    /// waiting (so a state that lasted microseconds is not missed), or the timeout passes.
    pub fn wait_for(
        &self,
        timeout: Duration,
        done: impl Fn(&DeliveryStatus) -> bool,
    ) -> Option<DeliveryStatus> {
        let s = self.shared();
        let deadline = Instant::now() + timeout;
        let mut seen = lock(&s.state).published;
        loop {
            let status = s.status();
            if done(&status) {
                return Some(status);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return None;
            }
            let cell = lock(&s.state);
            let (cell, _) = s
                .state_changed
                .wait_timeout(cell, left.min(Duration::from_millis(20)))
                .unwrap_or_else(|p| p.into_inner());
            // States published while this thread slept count too, however briefly they lasted.
            // The predicate runs after the lock is released: it may call back into the spool.
            let meanwhile: Vec<DeliveryStatus> = cell
                .recent
                .iter()
                .filter(|(n, _)| *n > seen)
                .map(|(_, status)| status.clone())
                .collect();
            seen = cell.published;
            drop(cell);
            if let Some(status) = meanwhile.into_iter().find(|status| done(status)) {
                return Some(status);
            }
        }
    }

    /// Waits until nothing is pending and the worker is idle, or the timeout passes.
    pub fn wait_drained(&self, timeout: Duration) -> bool {
        self.wait_for(timeout, |st| st.is_drained()).is_some()
    }

    /// Moves everything in memory to the store now: call it when the app goes to the background.
    /// Returns how many events were written. Without a store it does nothing.
    pub fn persist(&self) -> Result<u64> {
        self.shared().persist()
    }

    /// Stops the worker (waiting at most `timeout` for an attempt in flight), writes what is in
    /// memory to the store when there is one, and releases the store. Safe to call twice, and
    /// from an observer (then it does not wait for the worker it is running on).
    pub fn shutdown(&self, timeout: Duration) -> Result<()> {
        self.handle.shutdown(timeout)
    }

    /// Quarantined events, oldest first.
    pub fn quarantine_list(&self, filter: &ListFilter) -> Result<Vec<QuarantinedEvent>> {
        self.shared().queue.quarantine_list(filter)
    }

    pub fn quarantine_get(&self, event_id: &str) -> Result<Option<QuarantinedEvent>> {
        self.shared().queue.quarantine_get(event_id)
    }

    /// Puts quarantined events back in the queue with their original `event_id`; they go out
    /// through the normal throttled batches. Returns how many.
    pub fn quarantine_redrive(&self, selector: &Selector) -> Result<u64> {
        let n = {
            let _admitted = self.admit_verb()?;
            let s = self.shared();
            s.queue
                .redrive(selector, s.clock.wall_ms(), || s.next_seq())?
        };
        self.flush();
        Ok(n)
    }

    /// Deletes quarantined events for good. Returns how many.
    pub fn quarantine_purge(&self, selector: &Selector) -> Result<u64> {
        let _admitted = self.admit_verb()?;
        let s = self.shared();
        let n = s.queue.quarantine_purge(selector)?;
        s.fleet.count_quarantine_purged(n);
        Ok(n)
    }
}
