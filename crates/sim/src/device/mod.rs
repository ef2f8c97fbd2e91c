//! One simulated device: a real spool on a real SQLite file, its app (the plan's steps), its
//! link to the collector, and the oracles that check, after everything it does, the promises of
//! README and docs/delivery.md against what really happened.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use eventspool::testing::Stepper;
use eventspool::{Config, Consent, DeliveryState, Durability, EventSpool, StoreFaults};

mod app;
mod exchange;
mod files;
mod heal;
mod keys;
mod observer;
mod oracle;

use heal::Probe;
pub use heal::{LIVENESS_BASE_MS, LIVENESS_PER_EVENT_MS};
use observer::{Heard, Observer};

use exchange::Flight;

use crate::clock::{DeviceClock, SimClock};
use crate::collector::Collector;
use crate::net::{Link, SimTransport};
use crate::plan::{HOUR_MS, Plan, SECOND_MS, Step};

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
    /// Tracked before a denial: no request that starts after it may carry it (the one on the
    /// wire then may finish), whatever the app says later (README §Consent).
    denied: bool,
    /// Its sealed row was damaged on disk: its payload no longer opens, so no request may
    /// carry it again (docs/encryption.md: it goes to the quarantine as `undecryptable`).
    damaged: bool,
}

/// The figures of a run.
#[derive(Clone, Copy, Default, Debug)]
pub struct Figures {
    pub events: u64,
    pub requests: u64,
    pub faults: u64,
    pub crashes: u64,
    pub restarts: u64,
    /// Sealed rows damaged on disk, and those of them the audit found quarantined as
    /// `undecryptable`.
    pub damaged: u64,
    pub undecryptable: u64,
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
    /// Steps waiting for the next request on the wire ([`Step::OnWire`]).
    on_wire: Option<Vec<Step>>,
    /// The events of a request a denial spared on the wire that did not come back delivered:
    /// checked gone from the files once the worker has settled.
    spared_back: Option<Vec<usize>>,
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
    /// Encryption at rest: the keys, and which events were tracked while the store sealed.
    sealing: keys::Sealing,
    pub figures: Figures,
    pub trace: crate::trace::Trace,
}

/// Mixed into a seed for the AEAD each open seals with.
const AEAD_STREAM: u64 = 0x6165_6164_0000_0000;

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
        // From its own stream: the other draws of a seed stay as they were.
        let sealing = keys::Sealing::draw(seed);
        config.encryption_keys = sealing.keys();
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
            on_wire: None,
            spared_back: None,
            dirty: true,
            probe: Probe::Off,
            probe_since: 0,
            failing: HashMap::new(),
            store_faulted: false,
            drops_counted: 0,
            checks: 0,
            tick: 0,
            purgeable: HashSet::new(),
            sealing,
            figures: Figures::default(),
            trace: crate::trace::Trace::default(),
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
        // Each open seals with either AEAD, from a stream of its own (the other draws of a seed
        // stay as they were): a store then holds rows of both, as after an upgrade or a restore
        // onto another device, and a ChaCha store's tracking seals ahead (decision 0074) on any
        // machine the simulation runs on.
        let aead = if fastrand::Rng::with_seed(self.seed ^ AEAD_STREAM ^ generation).bool() {
            eventspool::Aead::ChaCha20Poly1305
        } else {
            eventspool::Aead::Aes256Gcm
        };
        let opened = EventSpool::builder(self.config.clone())
            .aead(aead)
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
                    format_args!("open ({aead:?}): {:?}", spool.stats().restored),
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
                if self.flight.is_some()
                    && let Some(steps) = self.on_wire.take()
                {
                    self.trace.line(
                        self.now(),
                        format_args!("while the request is on the wire:"),
                    );
                    for s in &steps {
                        self.apply(s, step)?;
                    }
                }
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
        self.scan_sealed()?;
        self.open();
        Ok(())
    }

    /// The process dies between any two steps, and starts again.
    fn crash(&mut self) -> Result<(), Finding> {
        self.die()?;
        self.open();
        Ok(())
    }

    /// The process dies: no shutdown, memory lost; the files are as it left them.
    fn die(&mut self) -> Result<(), Finding> {
        self.figures.crashes += 1;
        self.add_drops();
        self.stepper = None;
        if let Some(spool) = self.spool.take() {
            spool.crash();
        }
        self.expose_all();
        self.scan_sealed()
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
