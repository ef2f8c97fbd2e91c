//! What every scenario checks and prints: the ledger between the app, nginx and the collector.

use std::collections::{BTreeMap, HashSet};
use std::io::Read;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use eventspool::{Clock, Config, EventSpool, ListFilter, ManualClock, Stats};
use eventspool_collector::{Behavior, CollectorConfig, ReferenceCollector};
use serde_json::{Value, json};

use crate::nginx::Nginx;

pub const WAIT: Duration = Duration::from_secs(60);
const CLI: &str = env!("CARGO_BIN_EXE_eventspool");
const CLI_TIMEOUT: Duration = Duration::from_secs(120);

pub fn collector(behavior: Behavior) -> ReferenceCollector {
    ReferenceCollector::start(CollectorConfig {
        behavior,
        ..CollectorConfig::default()
    })
    .expect("collector starts")
}

/// The spool's config for an endpoint behind nginx: no throttle between batches (so a rate
/// limit is actually met), room in memory for every event of a scenario, otherwise the defaults.
pub fn config(endpoint: String) -> Config {
    let mut c = Config::new(endpoint);
    c.min_batch_interval_ms = 0;
    c.memory_capacity = 10_000;
    c
}

/// A spool that starts offline, so a scenario tracks everything first and the batches are
/// full ones (no early `flush_at` batch); `set_online(true)` starts delivery.
pub fn offline_spool(config: Config, clock: Option<Arc<dyn Clock>>) -> EventSpool {
    let builder = EventSpool::builder(config).start_offline();
    match clock {
        Some(clock) => builder.clock(clock),
        None => builder,
    }
    .open()
    .expect("spool opens")
}

/// Backoffs pass in virtual time, so retries follow each other as fast as nginx answers.
pub fn instant_clock() -> Arc<dyn Clock> {
    Arc::new(Arc::new(ManualClock::auto_advancing(1_764_417_600_000)))
}

/// An app event of about 250 bytes on the wire, the size the benchmarks use.
pub fn small_event(i: usize) -> Value {
    json!({"n": i, "screen": "settings/notifications", "note": "x".repeat(100)})
}

/// Tracks `n` small events; returns their ids.
pub fn track_small(spool: &EventSpool, n: usize, name: &str) -> Vec<String> {
    (0..n)
        .map(|i| spool.track(name, small_event(i)).unwrap().to_string())
        .collect()
}

/// The checks of every scenario, given what the app tracked and which events deserve the
/// quarantine (with the reason they must carry):
/// - the collector holds exactly the tracked events minus the quarantined and the pending,
/// - every id the collector ever received is a tracked one (resends kept their `event_id`; no
///   event was duplicated under a new id),
/// - the quarantine holds exactly the events that deserve it.
pub fn check_ledger(
    collector: &ReferenceCollector,
    spool: &EventSpool,
    tracked: &[String],
    deserve_quarantine: &[(String, &str)],
) {
    let stats = spool.stats();
    let tracked_set: HashSet<&String> = tracked.iter().collect();
    assert_eq!(tracked_set.len(), tracked.len(), "ids are unique");
    assert_eq!(
        collector.distinct_count(),
        tracked.len() as u64 - stats.quarantined - stats.pending,
        "collector distinct = tracked - quarantined - pending; stats {stats:?}"
    );
    assert_ids_known(collector, tracked);
    let quarantined: BTreeMap<String, String> = spool
        .quarantine_list(&ListFilter::default())
        .unwrap()
        .into_iter()
        .map(|q| (q.event_id, q.reason))
        .collect();
    let deserved: BTreeMap<String, String> = deserve_quarantine
        .iter()
        .map(|(id, reason)| (id.clone(), reason.to_string()))
        .collect();
    assert_eq!(quarantined, deserved, "the quarantine holds exactly these");
    for (id, _) in deserve_quarantine {
        assert!(!collector.contains(id), "quarantined {id} was also stored");
    }
}

/// Every id the collector ever received (stored or not) is one the app tracked: resends kept
/// their `event_id`, no event went out under a new one.
pub fn assert_ids_known(collector: &ReferenceCollector, tracked: &[String]) {
    let tracked: HashSet<&String> = tracked.iter().collect();
    for request in collector.requests() {
        for id in &request.event_ids {
            assert!(
                tracked.contains(id),
                "collector received an id the app never tracked: {id}"
            );
        }
    }
}

/// The figures a scenario reports: requests sent (and how nginx answered them), events
/// delivered and quarantined.
pub fn report(scenario: &str, nginx: &Nginx, requests: u64, delivered: u64, quarantined: u64) {
    let statuses = nginx.statuses(requests);
    println!(
        "proxy scenario {scenario}: requests sent {requests} (nginx answered {statuses:?}), \
         delivered {delivered}, quarantined {quarantined}"
    );
    assert_eq!(
        statuses.values().sum::<u64>(),
        requests,
        "every request the app sent reached nginx once: {statuses:?}"
    );
}

/// [`report`] of a spool's own figures.
pub fn report_stats(scenario: &str, nginx: &Nginx, stats: &Stats) {
    report(
        scenario,
        nginx,
        stats.requests,
        stats.delivered,
        stats.quarantined,
    );
}

/// A finished `eventspool` run.
pub struct CliRun {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl CliRun {
    /// The JSON summary (the last stdout line).
    pub fn summary(&self) -> Value {
        let last = self.stdout.lines().last().unwrap_or_default();
        serde_json::from_str(last).unwrap_or_else(|e| {
            panic!(
                "stdout {:?} is not a JSON summary: {e}; stderr: {}",
                self.stdout, self.stderr
            )
        })
    }
}

/// Runs the CLI with `stdin` as its input; killed (and the test failed) past a bound.
pub fn cli(args: &[&str], stdin: &str) -> CliRun {
    let mut child = Command::new(CLI)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run eventspool");
    let mut input = child.stdin.take().expect("stdin");
    let text = stdin.to_string();
    let writer = std::thread::spawn(move || {
        use std::io::Write;
        let _ = input.write_all(text.as_bytes());
    });
    let reader = |mut r: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut s = String::new();
            let _ = r.read_to_string(&mut s);
            s
        })
    };
    let out = reader(Box::new(child.stdout.take().expect("stdout")));
    let err = reader(Box::new(child.stderr.take().expect("stderr")));
    let deadline = Instant::now() + CLI_TIMEOUT;
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("eventspool {args:?} did not finish within {CLI_TIMEOUT:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let _ = writer.join();
    CliRun {
        code: status.code().unwrap_or(-1),
        stdout: out.join().unwrap(),
        stderr: err.join().unwrap(),
    }
}

/// JSON Lines input for `eventspool send`: `n` small events with fixed ids, so the test knows
/// them before the CLI runs.
pub fn cli_input(n: usize, name: &str) -> (String, Vec<String>) {
    let ids: Vec<String> = (0..n)
        .map(|i| format!("01932f5e-7a1b-7c3d-8e4f-{:012x}", i + 1))
        .collect();
    let text = ids
        .iter()
        .enumerate()
        .map(|(i, id)| {
            json!({"name": name, "event_id": id, "properties": small_event(i)}).to_string() + "\n"
        })
        .collect();
    (text, ids)
}
