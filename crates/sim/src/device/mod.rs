//! One simulated device: a real spool on a real SQLite file, its app (the plan's steps), its
//! link to the collector, and the oracles that check, after everything it does, the promises of
//! README and docs/delivery.md against what really happened.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use eventspool::testing::Stepper;
use eventspool::{
    Config, Consent, DeliveryConditions, DeliveryObserver, DeliveryState, DeliveryStatus,
    Durability, EventSpool, FaultError, FaultSite, ListFilter, NewEvent, Notice, Selector,
    StoreFaults, format_timestamp,
};
use serde_json::{Value, json};

mod exchange;
mod oracle;

use exchange::Flight;

use crate::clock::{DeviceClock, SimClock};
use crate::collector::Collector;
use crate::net::{Link, SimTransport};
use crate::plan::{HOUR_MS, MINUTE_MS, Plan, SECOND_MS, Step, When};

/// `retry_after_cap_ms` of every simulated device: the longest a collector can hold it.
pub const RETRY_AFTER_CAP_MS: u64 = 300 * SECOND_MS;
/// Transient failures a device may see in one simulated hour before it counts as a hot loop,
/// plus [`FRESH_START_REQUESTS`] for each fresh start the app or a restart gave it that hour.
pub const FAILING_HOUR_REQUESTS: u64 = 60;
pub const FRESH_START_REQUESTS: u64 = 24;

/// What a device saw go wrong: an oracle's finding.
pub type Finding = String;

/// One event the app tracked, as the simulation knows it.
struct Ev {
    id: String,
    critical: bool,
    ts_ms: i64,
    /// The world's step counter when `track` returned.
    accepted_step: u64,
    /// Sent before (the events of a request are checked for order on their first send).
    sent: bool,
    /// Taken into a batch before (a batch's order is judged when it is taken: it is resent as
    /// it is, so an event tracked while it waits for its retry goes in a later one).
    taken: bool,
    /// Was in the quarantine or redriven: its order is its own.
    redriven: bool,
    /// Not on disk for sure when the process died or a denial deleted: may be gone uncounted.
    exposed: bool,
}

/// What the observers heard.
#[derive(Default)]
struct Heard {
    dropped: HashMap<String, String>,
    findings: Vec<Finding>,
    last_countdown: Option<(u32, i64)>,
}

struct Observer(Arc<Mutex<Heard>>);

impl DeliveryObserver for Observer {
    fn on_state(&self, status: &DeliveryStatus) {
        let mut h = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if let DeliveryState::RetryScheduled {
            attempt,
            max_attempts,
            ..
        } = status.state
            && attempt > max_attempts
        {
            h.findings.push(format!(
                "the UI is told attempt {attempt} of {max_attempts}"
            ));
        }
        if let DeliveryState::WaitingForUser { attempts: 0, .. } = status.state {
            let line = status.to_string();
            if line.contains(" 0 attempt") {
                h.findings
                    .push(format!("the UI's status line says: {line}"));
            }
        }
        if status.pending > 0 && status.state == DeliveryState::Idle {
            h.last_countdown = None;
        }
    }

    fn on_notice(&self, notice: &Notice) {
        if let Notice::EventsDropped { reason, event_ids } = notice {
            let mut h = self.0.lock().unwrap_or_else(|p| p.into_inner());
            for id in event_ids {
                h.dropped.insert(id.clone(), reason.clone());
            }
        }
    }
}

/// The phases of the index probe after the world healed: a future-dated event, then one
/// written behind it, then rows in delivery order, each phase once the last one's events are
/// delivered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Probe {
    Off,
    Future,
    Behind,
    Done,
}

/// The figures of a run.
#[derive(Clone, Copy, Default, Debug)]
pub struct Figures {
    pub events: u64,
    pub requests: u64,
    pub faults: u64,
    pub crashes: u64,
    pub restarts: u64,
}

pub struct Device {
    pub idx: usize,
    seed: u64,
    dir: PathBuf,
    db: PathBuf,
    config: Config,
    clock: Arc<DeviceClock>,
    faults: StoreFaults,
    link: Arc<Mutex<Link>>,
    heard: Arc<Mutex<Heard>>,
    spool: Option<EventSpool>,
    stepper: Option<Stepper>,
    net: fastrand::Rng,
    plan: Plan,
    next_step: usize,
    collector: Collector,
    flight: Option<Flight>,
    partition_until: u64,
    refuse_until: u64,
    overloaded_until: u64,
    slow_until: u64,
    disk_full_until: Option<u64>,
    spill_retry_at: Option<u64>,
    healed: bool,
    pending_at_heal: u64,
    events: Vec<Ev>,
    by_id: HashMap<String, usize>,
    /// Events the current handle acknowledged as delivered, by the collector's answers it read.
    acks: u64,
    tracked: u64,
    consent: Consent,
    enabled: bool,
    /// `Retry-After` in force: no automatic request before it (monotonic ms).
    retry_after_hold: Option<u64>,
    /// A directive's `pause_until` in force.
    pause_hold: Option<u64>,
    directive_ids: HashSet<String>,
    /// A directive id the device had already applied came again: its one-shot actions must not
    /// run again. What the quarantine looked like when its answer landed: (id, `redriven`, the
    /// dead letters per reason, `quarantine_cap` drops).
    replayed: Option<(String, u64, std::collections::BTreeMap<String, u64>, u64)>,
    /// `figures.faults` when each directive id was first applied: a store fault since may have
    /// lost the record that it ran, and then running it again is allowed.
    directive_faults: HashMap<String, u64>,
    /// Directive ids whose answer landed since the last settled check: the worker has read
    /// them once the device settles (a crash before that may have lost them unread).
    directive_landed: Vec<String>,
    /// Redrives the app or a directive id made: each lets an event be refused once more.
    redrives: u32,
    /// Times each event was listed as rejected in an answer the device read.
    rejections: HashMap<usize, u32>,
    /// Per lane (normal, critical): the latest timestamp taken first, the tick it was taken at
    /// and its event.
    frontier: [(i64, u64, usize); 2],
    /// A step waiting for the worker's next take ([`Step::AtTake`]).
    at_take: Option<Step>,
    /// Something happened to the device since it last settled (a step, an answer, the heal):
    /// see [`Device::wants_settle`].
    dirty: bool,
    /// The index probe after the world healed ([`Device::probe_step`]), and when its phase
    /// began.
    probe: Probe,
    probe_since: u64,
    /// Transient failures per simulated hour, and fresh starts per hour.
    failing: HashMap<u64, (u64, u64)>,
    store_faulted: bool,
    /// Drops the handles before the current one counted, every reason.
    drops_counted: u64,
    checks: u64,
    /// This device's own count of acceptances and requests: orders them whatever the other
    /// devices did meanwhile, so a device replayed alone judges order as it did in the world.
    tick: u64,
    /// Dead letters a purge (the app's or a directive's) may have deleted.
    purgeable: HashSet<String>,
    pub figures: Figures,
    pub trace: crate::world::Trace,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Device {
    pub fn new(
        idx: usize,
        seed: u64,
        root: &std::path::Path,
        world: Arc<SimClock>,
        plan: Plan,
    ) -> Device {
        let dir = root.join(format!("device-{idx}"));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("the device's directory");
        let db = dir.join("events.db");
        let mut rng = fastrand::Rng::with_seed(seed);
        let mut config = Config::new("https://collector.invalid/v1/batch");
        config.db_path = Some(db.clone());
        config.memory_capacity = [20, 100, 400][rng.usize(0..3)];
        config.max_disk_bytes = [192 * 1024, 512 * 1024, 2 * 1024 * 1024][rng.usize(0..3)];
        config.durability = match rng.u32(0..4) {
            0 => Durability::Always,
            _ => Durability::Spill,
        };
        config.flush_at = [5, 20, 50][rng.usize(0..3)];
        config.retry_after_cap_ms = RETRY_AFTER_CAP_MS;
        // Uncompressed: a gzip body's size depends on the random bytes of its event ids, and
        // the spool learns from body sizes (a timeout of a big body halves the batches), so a
        // compressed run would not replay from its seed.
        config.compression = eventspool::Compression::None;
        config.max_event_age_ms = 3 * 24 * HOUR_MS;
        config.quarantine_max_events = 500;
        let net = fastrand::Rng::with_seed(seed ^ 0x6e65_7477_6f72_6b00);
        Device {
            idx,
            seed,
            dir,
            db,
            config,
            clock: DeviceClock::new(world),
            faults: StoreFaults::new(),
            link: Arc::new(Mutex::new(Link::default())),
            heard: Arc::default(),
            spool: None,
            stepper: None,
            net,
            plan,
            next_step: 0,
            collector: Collector {
                // From its own stream: the plan and the answers of a seed stay as they were.
                directive_per_mille: match fastrand::Rng::with_seed(seed ^ 0x6469_7273).u32(0..4) {
                    0 => 150,
                    _ => 15,
                },
                ..Collector::default()
            },
            flight: None,
            partition_until: 0,
            refuse_until: 0,
            overloaded_until: 0,
            slow_until: 0,
            disk_full_until: None,
            spill_retry_at: None,
            healed: false,
            pending_at_heal: 0,
            events: Vec::new(),
            by_id: HashMap::new(),
            acks: 0,
            tracked: 0,
            consent: Consent::Granted,
            enabled: true,
            retry_after_hold: None,
            pause_hold: None,
            directive_ids: HashSet::new(),
            replayed: None,
            directive_faults: HashMap::new(),
            directive_landed: Vec::new(),
            redrives: 0,
            rejections: HashMap::new(),
            frontier: [(i64::MIN, 0, 0); 2],
            at_take: None,
            dirty: true,
            probe: Probe::Off,
            probe_since: 0,
            failing: HashMap::new(),
            store_faulted: false,
            drops_counted: 0,
            checks: 0,
            tick: 0,
            purgeable: HashSet::new(),
            figures: Figures::default(),
            trace: crate::world::Trace::default(),
        }
    }

    fn now(&self) -> u64 {
        use eventspool::Clock;
        self.clock.now_ms()
    }

    fn wall(&self) -> i64 {
        use eventspool::Clock;
        self.clock.wall_ms()
    }

    /// Opens the spool on the device's files (at the start, after a restart or a crash); a
    /// store that cannot open now (a full disk) is tried again at the next step.
    pub fn open(&mut self) {
        if self.spool.is_some() {
            return;
        }
        let generation = self.figures.restarts + self.figures.crashes;
        let opened = EventSpool::builder(self.config.clone())
            .clock(self.clock.clone())
            .transport(Arc::new(SimTransport {
                link: self.link.clone(),
            }))
            .observer(Arc::new(Observer(self.heard.clone())))
            .jitter_seed(self.seed.wrapping_add(generation))
            .store_faults(self.faults.clone())
            .open_stepped();
        match opened {
            Ok((spool, stepper)) => {
                self.trace.line(
                    self.now(),
                    format_args!("open: {:?}", spool.stats().restored),
                );
                self.acks = 0;
                self.tracked = 0;
                self.directive_landed.clear();
                self.replayed = None;
                self.retry_after_hold = None;
                // A directive that came while the store was failing may never have been
                // written: its pause is not owed across the restart.
                if self.store_faulted || self.faults.armed() {
                    self.pause_hold = None;
                }
                self.store_faulted = self.faults.armed();
                self.consent = spool.consent();
                self.spool = Some(spool);
                self.stepper = Some(stepper);
                self.fresh_start();
            }
            Err(e) => self
                .trace
                .line(self.now(), format_args!("open failed: {e}")),
        }
    }

    /// The next moment something of this device is due.
    pub fn next_due(&self) -> Option<u64> {
        [
            self.plan.get(self.next_step).map(|(t, _)| *t),
            self.flight.as_ref().map(|f| f.at_ms),
            self.disk_full_until,
            self.spill_retry_at,
        ]
        .into_iter()
        .flatten()
        .min()
    }

    pub fn plan_done(&self) -> bool {
        self.next_step >= self.plan.len()
    }

    /// Does what is due at `now`: delivers an answer, lifts a full disk, runs the plan's steps.
    pub fn due(&mut self, now: u64, step: &mut u64) -> Result<(), Finding> {
        self.dirty = true;
        if self.flight.as_ref().is_some_and(|f| f.at_ms <= now) {
            let flight = self.flight.take().expect("checked");
            self.land(flight)?;
        }
        if self.disk_full_until.is_some_and(|t| t <= now) {
            self.disk_full_until = None;
            self.faults.disarm();
        }
        if self.spill_retry_at.is_some_and(|t| t <= now) {
            self.spill_retry_at = None;
        }
        while let Some((t, s)) = self.plan.get(self.next_step).cloned()
            && t <= now
        {
            self.next_step += 1;
            *step += 1;
            self.open();
            self.apply(&s, *step)?;
        }
        Ok(())
    }

    /// Runs the spool's threads until nothing moves: the worker, the spill, and the request it
    /// hands the link. Then checks what must hold.
    pub fn settle(&mut self, step: u64) -> Result<bool, Finding> {
        self.dirty = false;
        let mut moved = false;
        for _ in 0..10_000 {
            let mut progressed = false;
            let mut paused = false;
            let now = self.now();
            if let Some(st) = self.stepper.as_mut() {
                st.pause_after_next_take(self.at_take.is_some());
                progressed |= st.poll_worker();
                paused = st.paused_at_take();
                if self.spill_retry_at.is_none()
                    && let Some(result) = st.spill()
                {
                    progressed = true;
                    if result.is_err() {
                        // The spill thread's back-off; new events wake it sooner (see `due`).
                        self.spill_retry_at = Some(now + st.spill_retry_ms());
                    }
                }
            }
            self.note_takes()?;
            if paused && let Some(verb) = self.at_take.take() {
                self.trace
                    .line(self.now(), format_args!("between take and send:"));
                self.apply(&verb, step)?;
                progressed = true;
            }
            let outgoing = lock(&self.link).outgoing.take();
            if let Some((request, slot)) = outgoing {
                self.dispatch(request, slot, step)?;
                progressed = true;
            }
            if !progressed && self.healed {
                // The app shows a pause; once the world is healed the user presses Resume.
                if let Some(spool) = self.spool.as_ref()
                    && matches!(spool.state().state, DeliveryState::Paused { .. })
                {
                    spool.resume();
                    progressed = true;
                }
            }
            if !progressed {
                if moved {
                    self.check()?;
                }
                return Ok(moved);
            }
            moved = true;
        }
        Err("the worker never settled (10,000 turns without waiting)".into())
    }

    /// Whether settling the device could move anything: something happened to it since it
    /// last settled, or a timer of its worker fired (the shared clock woke it), or a request
    /// waits for the link. A quiet device is skipped (the trace is the same either way).
    pub fn wants_settle(&self) -> bool {
        self.dirty
            || self.stepper.as_ref().is_some_and(Stepper::woken)
            || lock(&self.link).outgoing.is_some()
    }

    fn spool(&self) -> Option<&EventSpool> {
        self.spool.as_ref()
    }

    fn fresh_start(&mut self) {
        let hour = self.now() / HOUR_MS;
        self.failing.entry(hour).or_default().1 += 1;
    }

    fn payload(&self, idx: usize) -> Value {
        json!({"p": format!("SIMPAYLOAD-{idx}-"), "pad": "x".repeat(idx * 37 % 400)})
    }

    fn new_event(&self, name: &str, when: When, idx: usize) -> NewEvent {
        let mut e = NewEvent::new(name, self.payload(idx));
        let at = match when {
            When::Now => None,
            When::Past(min) => Some(self.wall() - i64::from(min) * MINUTE_MS as i64),
            When::Future(min) => Some(self.wall() + i64::from(min) * MINUTE_MS as i64),
        };
        e.timestamp = at.map(format_timestamp);
        e
    }

    fn record(&mut self, id: String, critical: bool, ts_ms: i64, step: u64) {
        self.by_id.insert(id.clone(), self.events.len());
        self.events.push(Ev {
            id,
            critical,
            ts_ms,
            accepted_step: {
                let _ = step;
                self.tick += 1;
                self.tick
            },
            sent: false,
            taken: false,
            redriven: false,
            exposed: false,
        });
        self.tracked += 1;
        self.figures.events += 1;
    }

    fn ts_of(&self, when: When) -> i64 {
        match when {
            When::Now => self.wall(),
            When::Past(min) => self.wall() - i64::from(min) * MINUTE_MS as i64,
            When::Future(min) => self.wall() + i64::from(min) * MINUTE_MS as i64,
        }
    }

    fn track(&mut self, name: &'static str, when: When, critical: bool, step: u64) {
        let Some(spool) = self.spool.clone() else {
            return;
        };
        let idx = self.events.len();
        let mut e = self.new_event(name, when, idx);
        if critical {
            e = e.critical();
        }
        let ts = self.ts_of(when);
        // New events wake a spill thread that waits to retry (`Queue::run_spiller`).
        self.spill_retry_at = None;
        match spool.track_event(e) {
            Ok(id) => self.record(id.to_string(), critical, ts, step),
            // Queued in memory, not durable: accepted all the same.
            Err(eventspool::Error::NotDurable { event_ids, .. }) => {
                for id in event_ids {
                    self.record(id.to_string(), critical, ts, step);
                }
            }
            Err(_) => {}
        }
    }

    /// The dead letters a purge about to run may delete: gone by choice, not lost.
    fn note_purgeable(&mut self) {
        let Some(spool) = self.spool() else { return };
        if let Ok(list) = spool.quarantine_list(&ListFilter::default()) {
            self.purgeable.extend(list.into_iter().map(|q| q.event_id));
        }
    }

    /// Carries out one step of the plan.
    fn apply(&mut self, s: &Step, step: u64) -> Result<(), Finding> {
        self.trace.line(self.now(), format_args!("{s:?}"));
        // Before the handle is borrowed for the step: a crash must drop the last one.
        match s {
            Step::Restart => return self.restart(),
            Step::Crash => {
                self.crash();
                return Ok(());
            }
            Step::AtTake(verb) => {
                if self.at_take.is_none() {
                    self.at_take = Some((**verb).clone());
                }
                return Ok(());
            }
            _ => {}
        }
        let Some(spool) = self.spool.clone() else {
            return Ok(());
        };
        match s {
            Step::Track { n, name, when } => {
                for _ in 0..*n {
                    self.track(name, *when, false, step);
                }
            }
            Step::Critical => self.track("crash", When::Now, true, step),
            Step::Burst { n } => {
                for _ in 0..*n {
                    self.track("ok", When::Now, false, step);
                }
            }
            Step::Batch { n } => {
                let first = self.events.len();
                let batch: Vec<NewEvent> = (0..*n as usize)
                    .map(|i| self.new_event("ok", When::Now, first + i))
                    .collect();
                let ts = self.wall();
                self.spill_retry_at = None;
                match spool.track_batch(&batch) {
                    Ok(ids) => {
                        for id in ids {
                            self.record(id.to_string(), false, ts, step);
                        }
                    }
                    // The whole batch is recorded; the error names the events memory holds
                    // (the others are on disk, learnt from their payload when they reach the
                    // collector). Every event of the batch has the same timestamp and lane, so
                    // which of them a named id is does not matter to any oracle: the named
                    // ones are taken as the batch's last.
                    Err(eventspool::Error::NotDurable { mut event_ids, .. }) => {
                        event_ids.sort();
                        let unnamed = batch.len().saturating_sub(event_ids.len());
                        for i in 0..unnamed {
                            self.record(format!("unnamed-{}", first + i), false, ts, step);
                        }
                        for id in event_ids.into_iter().take(batch.len()) {
                            self.record(id.to_string(), false, ts, step);
                        }
                    }
                    Err(_) => {}
                }
            }
            Step::Persist => {
                let _ = spool.persist();
            }
            Step::Online(on) => {
                spool.set_online(*on);
                self.fresh_start();
            }
            Step::Foreground(on) => {
                spool.set_foreground(*on);
                self.fresh_start();
            }
            Step::Metered(on) => spool.set_conditions(DeliveryConditions {
                metered: *on,
                ..DeliveryConditions::default()
            }),
            Step::Consent(c) => {
                let done = spool.set_consent(*c).is_ok();
                // A denial whose deletion failed is still in force (README §Consent).
                self.consent = spool.consent();
                if self.consent == Consent::Denied {
                    self.expose_all();
                }
                self.said_no();
                // Only a denial that returned Ok claims the wipe.
                if done && *c == Consent::Denied {
                    self.scan_after_denial()?;
                }
                self.fresh_start();
            }
            Step::Enabled(on) => {
                if spool.set_enabled(*on).is_ok() {
                    self.enabled = *on;
                }
                self.said_no();
                self.fresh_start();
            }
            Step::RetryNow => {
                spool.retry_now();
                self.retry_after_hold = None;
                self.fresh_start();
            }
            Step::Dismiss => spool.dismiss(),
            Step::Resume => {
                spool.resume();
                self.fresh_start();
            }
            Step::Flush => {
                spool.flush();
                self.fresh_start();
            }
            Step::Redrive => {
                self.replayed = None;
                if spool
                    .quarantine_redrive(&Selector::All)
                    .is_ok_and(|n| n > 0)
                {
                    self.redrives += 1;
                }
                self.mark_redriven();
            }
            Step::PurgeQuarantine => {
                self.replayed = None;
                self.note_purgeable();
                let _ = spool.quarantine_purge(&Selector::All);
            }
            Step::ClearDirective => {
                if spool.clear_directive().is_ok() {
                    self.pause_hold = None;
                }
            }
            Step::Restart | Step::Crash | Step::AtTake(_) => {}
            Step::SkewWall(ms) => self.clock.skew_wall(*ms),
            Step::Partition { ms } => self.partition_until = self.now() + ms,
            Step::RefuseBodies { ms } => self.refuse_until = self.now() + ms,
            Step::Overloaded { ms } => self.overloaded_until = self.now() + ms,
            Step::SlowLink { ms } => self.slow_until = self.now() + ms,
            Step::FailWrites { k } => {
                self.fault();
                self.faults
                    .fail_next(FaultSite::Write, *k, FaultError::IoErr);
            }
            Step::FailNthWrite { n } => {
                self.fault();
                self.faults.fail_nth(FaultSite::Write, *n, FaultError::Full);
            }
            Step::FailCheckpoint => {
                self.fault();
                self.faults
                    .fail_nth(FaultSite::Checkpoint, 1, FaultError::IoErr);
            }
            Step::DiskFull { ms } => {
                self.fault();
                self.faults.fill_disk(FaultError::Full);
                self.disk_full_until = Some(self.now() + ms);
            }
        }
        Ok(())
    }

    fn fault(&mut self) {
        self.figures.faults += 1;
        self.store_faulted = true;
    }

    fn said_no(&mut self) {
        let no = self.consent == Consent::Denied || !self.enabled;
        lock(&self.link).said_no = no;
    }

    /// Every event not yet accounted for may go without a per-id notice (a crash, a denial).
    fn expose_all(&mut self) {
        for e in &mut self.events {
            e.exposed = true;
        }
    }

    fn mark_redriven(&mut self) {
        let Some(spool) = self.spool() else { return };
        let _ = spool;
        for e in &mut self.events {
            if !e.sent && !e.taken {
                continue;
            }
            e.redriven = true;
        }
    }

    /// The batches the worker took since the last look: per lane, an event taken for the first
    /// time must not leave behind an older one that was queued when a newer one was taken
    /// first (docs/protocol.md: batches leave in timestamp order, as they were taken).
    fn note_takes(&mut self) -> Result<(), Finding> {
        let Some(st) = self.stepper.as_ref() else {
            return Ok(());
        };
        for batch in st.taken() {
            self.tick += 1;
            let at = self.tick;
            let mut first: [Option<(i64, usize)>; 2] = [None; 2];
            for id in batch {
                // An event of a `track_batch` whose error did not name it is learnt at its send.
                let Some(&idx) = self.by_id.get(&id.to_string()) else {
                    continue;
                };
                let ev = &mut self.events[idx];
                let lane = usize::from(ev.critical);
                if !ev.taken && !ev.redriven {
                    let (front, front_at, by) = self.frontier[lane];
                    if ev.ts_ms < front && ev.accepted_step < front_at {
                        return Err(format!(
                            "event {idx} (ts {}, tick {}) was queued when event {by} (ts {front}) was taken first at tick {front_at}",
                            ev.ts_ms, ev.accepted_step
                        ));
                    }
                    if first[lane].is_none_or(|(ts, _)| ev.ts_ms > ts) {
                        first[lane] = Some((ev.ts_ms, idx));
                    }
                }
                ev.taken = true;
            }
            for (lane, newest) in first.iter().enumerate() {
                if let Some((ts, idx)) = newest
                    && *ts >= self.frontier[lane].0
                {
                    self.frontier[lane] = (*ts, at, *idx);
                }
            }
        }
        Ok(())
    }

    /// `shutdown()`, then open again.
    fn restart(&mut self) -> Result<(), Finding> {
        self.figures.restarts += 1;
        if let Some(mut st) = self.stepper.take() {
            st.request_stop();
            for _ in 0..1_000 {
                if !st.running() {
                    break;
                }
                st.poll_worker();
            }
            if st.running() {
                return Err("the worker did not stop after shutdown was asked".into());
            }
            self.note_takes()?;
        }
        if let Some(spool) = self.spool.take() {
            let _ = spool.shutdown(std::time::Duration::ZERO);
            self.spool = Some(spool);
            self.add_drops();
            self.spool = None;
        }
        self.open();
        Ok(())
    }

    /// The process dies between any two steps.
    fn crash(&mut self) {
        self.figures.crashes += 1;
        self.add_drops();
        self.stepper = None;
        if let Some(spool) = self.spool.take() {
            spool.crash();
        }
        self.expose_all();
        self.open();
    }

    /// The end of the run: the network and the disk heal, the user says yes, and nothing else
    /// happens; the app turns back what it turned off (`resume()` once for a pause the
    /// collector's config caused: that is what the UI's button is for).
    pub fn heal(&mut self) {
        self.healed = true;
        self.plan.truncate(self.next_step);
        self.at_take = None;
        self.faults.disarm();
        self.disk_full_until = None;
        self.open();
        let Some(spool) = self.spool.clone() else {
            return;
        };
        let _ = spool.set_consent(Consent::Granted);
        let _ = spool.set_enabled(true);
        self.consent = Consent::Granted;
        self.enabled = true;
        self.said_no();
        spool.set_online(true);
        spool.set_foreground(true);
        spool.set_conditions(DeliveryConditions::default());
        if matches!(spool.state().state, DeliveryState::Paused { .. }) {
            spool.resume();
        }
    }

    /// The world healed: [`Device::heal`], and the time this device may take to drain.
    pub fn heal_now(&mut self) -> Result<(), Finding> {
        self.dirty = true;
        self.heal();
        self.pending_at_heal = self.pending();
        Ok(())
    }

    /// Whether the index probe is over (or never ran: a device without a store).
    pub fn probe_done(&self) -> bool {
        self.probe == Probe::Done
    }

    /// While the probe runs: when its current phase began (its events must be delivered
    /// within [`crate::world::LIVENESS_BASE_MS`] of it).
    pub fn probe_since(&self) -> Option<u64> {
        (self.probe != Probe::Off).then_some(self.probe_since)
    }

    /// The next phase of the probe that src/queue/store/frontier.rs's promise needs, once the
    /// device holds nothing: a future-dated event goes to disk at the frontier and is
    /// delivered; then an event behind it, which is indexed, is delivered (its batch read
    /// finds no row in order left); then rows written in delivery order must skip the ordering
    /// index again. Otherwise one event from a wrong clock would leave every later row indexed
    /// and every batch read walking the table.
    pub fn probe_step(&mut self) -> Result<(), Finding> {
        self.dirty = true;
        self.probe_since = self.now();
        let Some(spool) = self.spool.clone() else {
            self.probe = Probe::Done;
            return Ok(());
        };
        let step = self.tick;
        match self.probe {
            Probe::Off => {
                self.track("ok", When::Future(30), false, step);
                let _ = spool.persist();
                self.probe = Probe::Future;
            }
            Probe::Future => {
                self.track("ok", When::Now, false, step);
                let _ = spool.persist();
                self.probe = Probe::Behind;
            }
            Probe::Behind => {
                for _ in 0..3 {
                    self.track("ok", When::Now, false, step);
                }
                let _ = spool.persist();
                self.probe = Probe::Done;
                let shape = self
                    .stepper
                    .as_ref()
                    .and_then(|st| st.normal_rows_by_order());
                if let Some(Ok((in_order, indexed))) = shape
                    && indexed > 0
                {
                    return Err(format!(
                        "after the store drained, {indexed} of {} rows written in delivery order went into the ordering index: a delivered future-dated event still holds the frontier",
                        in_order + indexed
                    ));
                }
            }
            Probe::Done => {}
        }
        Ok(())
    }

    pub fn liveness_bound(&self) -> u64 {
        crate::world::LIVENESS_BASE_MS + self.pending_at_heal * crate::world::LIVENESS_PER_EVENT_MS
    }

    pub fn trace_lines(&self) -> Vec<String> {
        self.trace.recent()
    }

    pub fn pending(&self) -> u64 {
        self.spool().map_or(0, |s| s.stats().pending)
    }

    pub fn state(&self) -> String {
        self.spool()
            .map_or("closed".into(), |s| format!("{:?}", s.state().state))
    }

    pub fn remove_files(&mut self) {
        self.stepper = None;
        if let Some(spool) = self.spool.take() {
            let _ = spool.shutdown(std::time::Duration::ZERO);
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
