//! Fleet reconnect simulation: many clients that were offline together reconnect together and
//! drain their backlog into one collector of limited capacity, on a virtual clock.
//!
//! Each client runs the SDK's own retry decisions (`eventspool::retry`: `next_delay_ms`,
//! `after_failure`, `Episode`), exactly as the delivery worker calls them. Only the jitter
//! policy can be swapped, and the two alternatives (no jitter, equal jitter) exist here and
//! nowhere else: they are what the SDK deliberately does not do, kept for comparison.
//!
//! The collector is a model, not a server: a token bucket refilled at `capacity_per_s` (burst of
//! a tenth of a second) that answers 503 to every request it has no token for. No sockets, no
//! real time: 100,000 clients run in a few seconds.
//!
//! What happens after the automatic budget is spent: the client enters `WaitingForUser`, and the
//! model has the app dismiss it and the app's periodic flush (`flush_interval_ms`, at a phase
//! that differs per device because apps start at different times) start a new episode. The
//! report counts how many clients reached `WaitingForUser` and how often.
//!
//! Shared by `examples/fleet` (the full-size run) and `tests/fleet.rs` (a reduced run that
//! checks invariants) through this crate, a dev-dependency, so no simulation code ships in the
//! library.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use eventspool::retry::{AfterFailure, Episode, after_failure, backoff_ceiling_ms, next_delay_ms};

/// How a client spreads its retries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Jitter {
    /// The SDK's policy: `uniform(0, ceiling)` (docs/delivery.md §Retry), computed by
    /// `eventspool::retry`.
    Full,
    /// Simulation-only alternative: `ceiling / 2 + uniform(0, ceiling / 2)`.
    Equal,
    /// Simulation-only alternative: exactly the ceiling, every client in lock-step.
    None,
}

impl Jitter {
    pub fn label(self) -> &'static str {
        match self {
            Jitter::Full => "full jitter (eventspool)",
            Jitter::Equal => "equal jitter (sim only)",
            Jitter::None => "no jitter (sim only)",
        }
    }
}

#[derive(Clone, Debug)]
pub struct Params {
    pub clients: usize,
    /// Requests per second the collector serves; above that it answers 503.
    pub capacity_per_s: u64,
    /// Batches each client holds when it reconnects (its 10 minutes offline).
    pub batches_per_client: u32,
    pub offline_ms: u64,
    /// Clients notice the network within this window after it returns (uniformly).
    pub reconnect_spread_ms: u64,
    pub backoff_base_ms: u64,
    pub backoff_cap_ms: u64,
    pub max_auto_attempts: u32,
    pub max_retry_elapsed_ms: u64,
    pub min_batch_interval_ms: u64,
    pub flush_interval_ms: u64,
    pub jitter: Jitter,
    pub seed: u64,
    /// The simulation stops here even if clients are still pending (reported, never hidden).
    pub horizon_ms: u64,
}

impl Params {
    /// The client side with the retry values of the original contract (cap 30 s, 5 attempts,
    /// 300 s), not today's defaults (15 s, 10, 60 s: docs/configuration.md and
    /// docs/decisions/0049).
    pub fn new(clients: usize, capacity_per_s: u64, jitter: Jitter) -> Params {
        Params {
            clients,
            capacity_per_s,
            batches_per_client: 3,
            offline_ms: 10 * 60 * 1000,
            reconnect_spread_ms: 1000,
            backoff_base_ms: 1000,
            backoff_cap_ms: 30_000,
            max_auto_attempts: 5,
            max_retry_elapsed_ms: 300_000,
            min_batch_interval_ms: 1000,
            flush_interval_ms: 30_000,
            jitter,
            seed: 7,
            horizon_ms: 6 * 3600 * 1000,
        }
    }

    /// The fleet's request rate in normal operation: one batch per client per flush interval.
    pub fn steady_rate_per_s(&self) -> f64 {
        self.clients as f64 * 1000.0 / self.flush_interval_ms as f64
    }
}

const TICK_MS: u64 = 100;

#[derive(Clone, Debug, Default)]
pub struct Report {
    pub requests: u64,
    pub rejected: u64,
    /// Requests offered in each tenth of a second after the network returned: fine enough to
    /// see lock-step retries land in the same instant, which whole seconds would average away.
    pub per_tick: Vec<u64>,
    /// When the last client delivered its last batch (ms after the network returned).
    pub drain_ms: Option<u64>,
    pub drained_clients: usize,
    /// Clients that reached `WaitingForUser` at least once, and how many times in all.
    pub clients_waiting_for_user: usize,
    pub waiting_for_user_entries: u64,
    /// The most automatic retries any client made within one episode.
    pub max_retries_in_episode: u32,
    /// The latest an automatic retry started, relative to its episode's start.
    pub max_retry_elapsed_ms: u64,
    /// Automatic retries beyond the budget (must be 0).
    pub budget_violations: u64,
}

impl Report {
    /// The highest request rate (per second, over 100 ms windows) from `from_s` seconds on.
    pub fn peak_rate_from(&self, from_s: u64) -> u64 {
        self.per_tick
            .iter()
            .skip((from_s * 10) as usize)
            .copied()
            .max()
            .unwrap_or(0)
            * 10
    }

    /// Requests offered in each whole second.
    pub fn per_second(&self) -> Vec<u64> {
        self.per_tick.chunks(10).map(|c| c.iter().sum()).collect()
    }
}

struct Client {
    batches_left: u32,
    episode: Option<Episode>,
    retries_in_episode: u32,
    /// Where this device's periodic flush timer ticks, within the interval.
    phase_ms: u64,
    waited: bool,
}

/// The collector model: a token bucket of `capacity` per second with a tenth of a second of burst.
struct Collector {
    tokens: f64,
    burst: f64,
    per_ms: f64,
    last_ms: u64,
}

impl Collector {
    fn admit(&mut self, now_ms: u64) -> bool {
        let elapsed = now_ms.saturating_sub(self.last_ms) as f64;
        self.tokens = (self.tokens + elapsed * self.per_ms).min(self.burst);
        self.last_ms = self.last_ms.max(now_ms);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

pub fn run(p: &Params) -> Report {
    let mut rng = fastrand::Rng::with_seed(p.seed);
    let burst = (p.capacity_per_s as f64 / 10.0).max(1.0);
    let mut collector = Collector {
        tokens: burst,
        burst,
        per_ms: p.capacity_per_s as f64 / 1000.0,
        last_ms: 0,
    };
    // Time 0 is the moment the network returns; the offline period only built the backlog
    // (the SDK makes no attempt while offline, so it costs nothing here).
    let mut queue: BinaryHeap<Reverse<(u64, u32)>> = BinaryHeap::with_capacity(p.clients);
    let mut clients: Vec<Client> = (0..p.clients)
        .map(|i| {
            queue.push(Reverse((rng.u64(0..=p.reconnect_spread_ms), i as u32)));
            Client {
                batches_left: p.batches_per_client,
                episode: None,
                retries_in_episode: 0,
                phase_ms: rng.u64(0..p.flush_interval_ms),
                waited: false,
            }
        })
        .collect();
    let mut report = Report::default();
    while let Some(Reverse((now, id))) = queue.pop() {
        if now > p.horizon_ms {
            break;
        }
        let c = &mut clients[id as usize];
        let tick = (now / TICK_MS) as usize;
        if report.per_tick.len() <= tick {
            report.per_tick.resize(tick + 1, 0);
        }
        report.per_tick[tick] += 1;
        report.requests += 1;
        if collector.admit(now) {
            // Success ends the episode (docs/delivery.md §Retry); the next batch follows after the
            // throttle.
            c.episode = None;
            c.retries_in_episode = 0;
            c.batches_left -= 1;
            if c.batches_left == 0 {
                report.drained_clients += 1;
                report.drain_ms = Some(report.drain_ms.unwrap_or(0).max(now));
            } else {
                queue.push(Reverse((now + p.min_batch_interval_ms, id)));
            }
            continue;
        }
        report.rejected += 1;
        // The worker's `transient()`, step for step.
        let episode = Episode::record_failure(&mut c.episode, now);
        let attempt = episode.failures;
        let unit = rng.f64();
        let delay = match p.jitter {
            Jitter::Full => {
                next_delay_ms(attempt, p.backoff_base_ms, p.backoff_cap_ms, None, 0, unit)
            }
            Jitter::None => backoff_ceiling_ms(attempt, p.backoff_base_ms, p.backoff_cap_ms),
            Jitter::Equal => {
                let ceiling = backoff_ceiling_ms(attempt, p.backoff_base_ms, p.backoff_cap_ms);
                ceiling / 2 + ((ceiling - ceiling / 2) as f64 * unit) as u64
            }
        };
        match after_failure(
            episode,
            now,
            false,
            p.max_auto_attempts,
            p.max_retry_elapsed_ms,
            delay,
        ) {
            AfterFailure::Retry { attempt, delay_ms } => {
                c.retries_in_episode += 1;
                if c.retries_in_episode > p.max_auto_attempts || attempt > p.max_auto_attempts {
                    report.budget_violations += 1;
                }
                let elapsed = now + delay_ms - episode.started_ms;
                report.max_retry_elapsed_ms = report.max_retry_elapsed_ms.max(elapsed);
                if elapsed > p.max_retry_elapsed_ms {
                    report.budget_violations += 1;
                }
                report.max_retries_in_episode =
                    report.max_retries_in_episode.max(c.retries_in_episode);
                queue.push(Reverse((now + delay_ms, id)));
            }
            AfterFailure::WaitForUser { .. } => {
                // WaitingForUser; the app dismisses and its next periodic flush starts over.
                report.waiting_for_user_entries += 1;
                if !c.waited {
                    c.waited = true;
                    report.clients_waiting_for_user += 1;
                }
                c.episode = None;
                c.retries_in_episode = 0;
                let interval = p.flush_interval_ms;
                let next_tick =
                    (now.saturating_sub(c.phase_ms) / interval + 1) * interval + c.phase_ms;
                queue.push(Reverse((next_tick, id)));
            }
        }
    }
    if report.drained_clients < p.clients {
        report.drain_ms = None;
    }
    report
}
