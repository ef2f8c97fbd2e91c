//! A run: many devices on one simulated clock, stepped from one seed. The loop settles every
//! device (its worker and spill run until they wait), then moves time to the next thing that is
//! due anywhere (a timer of some worker, an answer, a step of some app) and does it. At the end
//! the world heals and every device must drain by itself (liveness), then every event is
//! audited. The same seed gives the same trace, hashed.

use std::fmt;
use std::hash::Hasher;
use std::panic::AssertUnwindSafe;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::clock::SimClock;
use crate::device::{Device, Figures, LIVENESS_BASE_MS};
use crate::plan::{self, HOUR_MS, MINUTE_MS, Plan};
use crate::trace::Fnv;

/// What to run.
#[derive(Clone, Debug)]
pub struct Params {
    pub seed: u64,
    pub devices: usize,
    pub hours: u64,
    /// Run only this device (a replay); its behaviour does not depend on the others.
    pub only: Option<usize>,
}

impl Params {
    /// The command line that replays this run.
    pub fn command(&self) -> String {
        let mut c = format!(
            "cargo run --release -p eventspool-sim -- --seed {:#x} --devices {} --hours {}",
            self.seed, self.devices, self.hours
        );
        if let Some(d) = self.only {
            c += &format!(" --device {d}");
        }
        c
    }
}

/// The figures of a run that passed.
#[derive(Clone, Debug, Default)]
pub struct Report {
    pub device_hours: u64,
    pub figures: Figures,
    pub hash: u64,
    pub wall: Duration,
}

/// A broken promise, where and when.
#[derive(Clone, Debug)]
pub struct Failure {
    pub params: Params,
    pub device: usize,
    pub at_ms: u64,
    pub what: String,
    /// The device's last trace lines.
    pub recent: Vec<String>,
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "device {} at {:.1} s of simulated time: {}",
            self.device,
            self.at_ms as f64 / 1000.0,
            self.what
        )?;
        let replay = Params {
            only: Some(self.device),
            ..self.params.clone()
        };
        writeln!(f, "replay: {}", replay.command())?;
        writeln!(f, "the device's last steps:")?;
        for line in &self.recent {
            writeln!(f, "  {line}")?;
        }
        Ok(())
    }
}

/// splitmix64: one device's seed from the run's.
pub fn device_seed(seed: u64, idx: usize) -> u64 {
    let mut z = seed ^ (idx as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The plan a device of this run follows.
pub fn plan_of(params: &Params, idx: usize) -> Plan {
    let seed = device_seed(params.seed, idx);
    let mut rng = fastrand::Rng::with_seed(seed ^ 0x706c_616e);
    let mut seams = fastrand::Rng::with_seed(seed ^ 0x7365_616d);
    let mut overloads = fastrand::Rng::with_seed(seed ^ 0x6f76_6572);
    let mut on_wire = fastrand::Rng::with_seed(seed ^ 0x7769_7265);
    let plan = plan::merge(
        plan::merge(
            plan::merge(
                plan::draw(&mut rng, params.hours),
                plan::draw_at_take(&mut seams, params.hours),
            ),
            plan::draw_overloads(&mut overloads, params.hours),
        ),
        plan::draw_on_wire(&mut on_wire, params.hours),
    );
    let mut on_wire_any = fastrand::Rng::with_seed(seed ^ 0x6f6e_7732);
    let plan = plan::merge(plan, plan::draw_on_wire_any(&mut on_wire_any, params.hours));
    let mut keys = fastrand::Rng::with_seed(seed ^ 0x6b65_7973);
    plan::merge(plan, plan::draw_keys(&mut keys, params.hours))
}

/// Where the stores of a run live: `EVENTSPOOL_SIM_DIR`, else /dev/shm when there is one (the
/// files are real SQLite files; memory makes a run's thousands of commits cheap), else the
/// temp dir.
fn root() -> PathBuf {
    static RUNS: AtomicU64 = AtomicU64::new(0);
    let base = std::env::var_os("EVENTSPOOL_SIM_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| match std::path::Path::new("/dev/shm").is_dir() {
            true => PathBuf::from("/dev/shm"),
            false => std::env::temp_dir(),
        });
    base.join(format!(
        "eventspool-sim-{}-{}",
        std::process::id(),
        RUNS.fetch_add(1, Ordering::SeqCst)
    ))
}

/// Runs the world of `params` (with `plan` replacing the drawn plan of the only device, for
/// shrinking).
pub fn run(params: &Params, plan: Option<Plan>) -> Result<Report, Failure> {
    let started = Instant::now();
    let root = root();
    let clock = SimClock::new();
    let ids: Vec<usize> = match params.only {
        Some(d) => vec![d],
        None => (0..params.devices).collect(),
    };
    let mut devices: Vec<Device> = ids
        .iter()
        .map(|&idx| {
            let p = match (&plan, params.only) {
                (Some(p), Some(_)) => p.clone(),
                _ => plan_of(params, idx),
            };
            Device::new(idx, device_seed(params.seed, idx), &root, clock.clone(), p)
        })
        .collect();
    let result = drive(params, &clock, &mut devices);
    for d in &mut devices {
        d.remove_files();
    }
    let _ = std::fs::remove_dir_all(&root);
    result?;
    let mut report = Report {
        device_hours: ids.len() as u64 * params.hours,
        wall: started.elapsed(),
        ..Report::default()
    };
    let mut hasher = Fnv::default();
    for d in &devices {
        hasher.write(&d.trace.hash().to_le_bytes());
        let f = d.figures;
        report.figures.events += f.events;
        report.figures.requests += f.requests;
        report.figures.faults += f.faults;
        report.figures.crashes += f.crashes;
        report.figures.restarts += f.restarts;
        report.figures.damaged += f.damaged;
        report.figures.undecryptable += f.undecryptable;
    }
    report.hash = hasher.finish();
    Ok(report)
}

fn drive(params: &Params, clock: &SimClock, devices: &mut [Device]) -> Result<(), Failure> {
    let fail = |d: &Device, what: String| Failure {
        params: params.clone(),
        device: d.idx,
        at_ms: clock.now_ms(),
        what,
        recent: d.trace_lines(),
    };
    let guarded = |d: &mut Device, f: &mut dyn FnMut(&mut Device) -> Result<(), String>| {
        match std::panic::catch_unwind(AssertUnwindSafe(|| f(d))) {
            Ok(Ok(())) => Ok(()),
            Ok(Err(what)) => Err(fail(d, what)),
            Err(panic) => Err(fail(d, format!("panicked: {}", panic_text(&panic)))),
        }
    };
    for d in devices.iter_mut() {
        guarded(d, &mut |d| {
            d.open();
            Ok(())
        })?;
    }
    let end = params.hours * HOUR_MS;
    let mut step = 0u64;
    let mut healed_at = None;
    loop {
        for d in devices.iter_mut().filter(|d| d.wants_settle()) {
            guarded(d, &mut |d| d.settle(step).map(|_| ()))?;
        }
        let now = clock.now_ms();
        if let Some(at) = healed_at {
            // A device that drained runs the next phase of its index probe.
            for d in devices.iter_mut() {
                if d.pending() == 0 && !d.probe_done() {
                    guarded(d, &mut |d| d.probe_step())?;
                    guarded(d, &mut |d| d.settle(step).map(|_| ()))?;
                }
            }
            let drained = devices.iter().all(|d| d.pending() == 0 && d.probe_done());
            let bound = devices
                .iter()
                .map(|d| d.liveness_bound())
                .max()
                .unwrap_or(0);
            if drained {
                break;
            }
            let late = |d: &Device| {
                d.pending() > 0
                    && match d.probe_since() {
                        Some(since) => now > since + LIVENESS_BASE_MS,
                        None => now > at + bound,
                    }
            };
            if let Some(d) = devices.iter().find(|d| late(d)) {
                let what = format!(
                    "liveness: {} events still pending {} min after the world healed (state {})",
                    d.pending(),
                    (now - at) / MINUTE_MS,
                    d.state()
                );
                return Err(fail(d, what));
            }
        }
        let next = devices
            .iter()
            .filter_map(|d| d.next_due())
            .chain(clock.next_deadline())
            .min();
        let next = match (next, healed_at) {
            (Some(t), _) if t <= end || healed_at.is_some() => t,
            _ if healed_at.is_none() => {
                clock.advance_to(end);
                for d in devices.iter_mut() {
                    guarded(d, &mut |d| d.heal_now())?;
                }
                healed_at = Some(end);
                continue;
            }
            // Healed, nothing due and something pending: nothing will ever move it.
            _ => clock.now_ms() + LIVENESS_BASE_MS * 100,
        };
        clock.advance_to(next);
        for d in devices.iter_mut() {
            if d.next_due().is_some_and(|t| t <= next) {
                guarded(d, &mut |d| d.due(next, &mut step))?;
            }
        }
    }
    for d in devices.iter_mut() {
        guarded(d, &mut |d| d.audit())?;
    }
    Ok(())
}

/// A finding without its figures: two runs broke the same promise.
fn kind(what: &str) -> String {
    what.chars()
        .filter(|c| !c.is_ascii_digit())
        .take(48)
        .collect()
}

fn panic_text(panic: &Box<dyn std::any::Any + Send>) -> String {
    panic
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "a panic without a message".into())
}

/// Leaves out steps of the failing device's plan while it still fails (any finding), up to a
/// bound of replays: what is left is the part of the story that matters.
pub fn shrink(failure: &Failure, budget: Duration) -> (Plan, Failure) {
    let params = Params {
        only: Some(failure.device),
        ..failure.params.clone()
    };
    let mut plan = plan_of(&params, failure.device);
    let mut best = failure.clone();
    let started = Instant::now();
    let mut chunk = plan.len() / 2;
    while chunk >= 1 && started.elapsed() < budget {
        let mut i = 0;
        while i < plan.len() && started.elapsed() < budget {
            let mut candidate = plan.clone();
            candidate.drain(i..(i + chunk).min(candidate.len()));
            match run(&params, Some(candidate.clone())) {
                Err(f) if kind(&f.what) == kind(&failure.what) => {
                    plan = candidate;
                    best = f;
                }
                _ => i += chunk,
            }
        }
        chunk /= 2;
    }
    (plan, best)
}
