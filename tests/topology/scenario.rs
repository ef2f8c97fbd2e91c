//! The whole topology under faults: dozens of spools, each with its own store, track through
//! nginx into three stateless collectors publishing to an R3 stream on a 3-node JetStream
//! cluster, while the stream's leader is SIGKILLed mid-load and restarted, one collector is
//! SIGTERMed (it drains) and another SIGKILLed (its devices resend), the whole cluster is
//! stopped for 30 s, and 5% of the batches are accepted then dropped. A consumer reading the
//! whole stream must find every tracked event exactly once, and the client reports' stream
//! must total what the spools tracked.
//!
//! The spools run on the real clock with sub-second backoffs (and the collectors' 1 s
//! `Retry-After`), since the outages they ride out are real processes being down.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use eventspool::{Config, EventSpool};
use serde_json::json;

use crate::collectors::{CollectorProcess, LoadBalancer};
use crate::nats::Cluster;
use crate::stream;

const STREAM: &str = "TOPOLOGY";
/// Spools in the app process (each its own SQLite store) and events each tracks: 24 × 150 =
/// 3,600 events.
const SPOOLS: usize = 24;
const EVENTS_PER_SPOOL: usize = 150;
const COLLECTORS: usize = 3;
const DROP_RATE: f64 = 0.05;
const LEADER_DOWN: Duration = Duration::from_secs(3);
const OUTAGE: Duration = Duration::from_secs(30);
/// Bounds the drain after the last fault; a healthy run needs a few seconds.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(60);

fn spool_config(endpoint: &str, db: std::path::PathBuf) -> Config {
    let mut c = Config::new(endpoint.to_owned());
    c.db_path = Some(db);
    c.min_batch_interval_ms = 0;
    c.max_batch_events = 50;
    c.flush_at = 25;
    c.flush_interval_ms = 200;
    c.backoff_base_ms = 50;
    c.backoff_cap_ms = 500;
    c.retry_after_cap_ms = 1_000;
    c.max_auto_attempts = 1_000;
    c.max_retry_elapsed_ms = 120_000;
    // Kills and accept-then-drop leave requests unanswered; none of these events is poison.
    c.max_event_sends = 50;
    c
}

/// Tracks events `range` on every spool; returns their ids.
fn track(spools: &[EventSpool], range: std::ops::Range<usize>) -> Vec<String> {
    let mut ids = Vec::new();
    for i in range {
        for (s, spool) in spools.iter().enumerate() {
            let props = json!({"spool": s, "n": i, "screen": "settings/notifications"});
            ids.push(spool.track("screen_view", props).unwrap().to_string());
        }
    }
    ids
}

/// Waits until collector `c` acknowledged at least `batches` batches, bounded.
fn wait_batches(c: &CollectorProcess, batches: u64, lb: &LoadBalancer) {
    let deadline = Instant::now() + Duration::from_secs(30);
    let acked = || {
        c.stats()
            .and_then(|s| s["sink"]["batches"].as_u64())
            .unwrap_or(0)
    };
    while acked() < batches {
        assert!(
            Instant::now() < deadline,
            "collector acknowledged {} batches, not {batches}: stats {:?}, nginx answered {:?} ({})",
            acked(),
            c.stats(),
            lb.answered(),
            lb.error_log(),
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn topology_cluster_behind_nginx_every_event_once_through_faults() {
    let started = Instant::now();
    let dir = tempfile::tempdir().unwrap();
    let mut cluster = Cluster::start(3);
    let mut collectors: Vec<CollectorProcess> = (0..COLLECTORS)
        .map(|i| {
            let log = dir.path().join(format!("collector{i}.log"));
            CollectorProcess::start_with(
                &cluster.urls(),
                STREAM,
                DROP_RATE,
                14 + i as u64,
                &log,
                &["--replicas", "3", "--lone-reports"],
            )
        })
        .collect();
    let lb = LoadBalancer::start(&collectors.iter().map(|c| c.addr).collect::<Vec<_>>());
    let spools: Vec<EventSpool> = (0..SPOOLS)
        .map(|i| {
            let db = dir.path().join(format!("spool{i}.db"));
            EventSpool::open(spool_config(&lb.url(), db)).expect("spool opens")
        })
        .collect();
    let step = EVENTS_PER_SPOOL / 5;

    // Fault 1: the stream's leader is SIGKILLed while batches flow, and restarted.
    let mut tracked = track(&spools, 0..step);
    wait_batches(&collectors[0], 2, &lb);
    let leader = cluster.leader(STREAM);
    cluster.nodes[leader].kill();
    tracked.extend(track(&spools, step..2 * step));
    std::thread::sleep(LEADER_DOWN);
    cluster.nodes[leader].restart();

    // Fault 2: collector 1 is SIGTERMed mid-load (it drains: its requests finish, exit 0),
    // collector 0 SIGKILLed (its devices resend through collector 2).
    tracked.extend(track(&spools, 2 * step..3 * step));
    wait_batches(&collectors[1], 2, &lb);
    let drained = collectors[1].terminate(Duration::from_secs(20));
    collectors[0].kill();
    let killed_acked = collectors[0].acked("stored") + collectors[0].acked("duplicates");
    tracked.extend(track(&spools, 3 * step..4 * step));

    // Fault 3: the whole cluster stops for 30 s while the app keeps tracking; devices hear
    // 503 with Retry-After; then every node restarts on its store.
    let outage_began = unix_now();
    for node in &mut cluster.nodes {
        node.stop();
    }
    let down = Instant::now();
    tracked.extend(track(&spools, 4 * step..EVENTS_PER_SPOOL));
    std::thread::sleep(OUTAGE.saturating_sub(down.elapsed()));
    let outage_ended = unix_now();
    for node in &mut cluster.nodes {
        node.restart();
    }
    let outage = down.elapsed();

    for spool in &spools {
        spool.flush();
    }
    for (i, spool) in spools.iter().enumerate() {
        assert!(
            spool.wait_drained(DRAIN_TIMEOUT),
            "spool {i} did not drain: {:?}\nnginx: {}",
            spool.stats(),
            lb.error_log()
        );
    }
    let quarantined: u64 = spools.iter().map(|s| s.stats().quarantined).sum();
    assert_eq!(quarantined, 0, "no event deserved the quarantine");

    let contents = stream::read_all(&cluster.urls(), STREAM);
    let tracked_set: HashSet<&String> = tracked.iter().collect();
    assert_eq!(tracked_set.len(), tracked.len(), "tracked ids are unique");
    let missing = tracked
        .iter()
        .filter(|id| !contents.copies.contains_key(*id))
        .count();
    let unknown: Vec<&String> = contents
        .copies
        .keys()
        .filter(|id| !tracked_set.contains(id))
        .collect();
    let twice: Vec<(&String, &u64)> = contents.copies.iter().filter(|(_, n)| **n > 1).collect();
    let acked_stored: u64 = collectors.iter().map(|c| c.acked("stored")).sum();
    let absorbed: u64 = collectors.iter().map(|c| c.acked("duplicates")).sum();
    let lines = lb.log_lines();
    let outage_503s = lines
        .iter()
        .filter(|l| l.at >= outage_began && l.at <= outage_ended + 1.0 && l.status == 503)
        .count();
    let outage_503s_with_retry_after = lines
        .iter()
        .filter(|l| l.at >= outage_began && l.at <= outage_ended + 1.0)
        .filter(|l| l.status == 503 && l.retry_after)
        .count();
    let error_log = lb.error_log();
    let no_live = error_log.matches("no live upstreams").count();
    // The client reports totalled downstream, once per (install, report id).
    let deadline = Instant::now() + Duration::from_secs(30);
    let (report_messages, totals) = loop {
        let (messages, totals) =
            stream::read_reports(&cluster.urls(), &format!("{STREAM}_REPORTS"));
        if totals.count("tracked") >= tracked.len() as u64 || Instant::now() > deadline {
            break (messages, totals);
        }
        for spool in &spools {
            spool.flush();
        }
        std::thread::sleep(Duration::from_millis(500));
    };
    println!(
        "topology: tracked {}, in stream {} distinct, {missing} missing, {absorbed} duplicates \
         absorbed ({} spools, 3-node cluster with an R3 stream, its leader n{leader} SIGKILLed \
         and back after {LEADER_DOWN:?}; {COLLECTORS} collectors, one SIGTERMed (exit {drained:?}), \
         one SIGKILLed after {killed_acked} acked events; the cluster down {:.1} s: {outage_503s} \
         × 503 ({outage_503s_with_retry_after} with Retry-After); {:.0}% accept-then-drop; nginx \
         answered {:?}, {no_live} \"no live upstreams\"; {acked_stored} first copies acked; \
         reports: {report_messages} stored, {} installs, tracked {} delivered {}; {:.1} s)",
        tracked.len(),
        contents.copies.len(),
        SPOOLS,
        outage.as_secs_f64(),
        DROP_RATE * 100.0,
        lb.answered(),
        totals.installs,
        totals.count("tracked"),
        totals.count("delivered"),
        started.elapsed().as_secs_f64()
    );
    assert_eq!(missing, 0, "every tracked event reached the stream");
    assert!(
        unknown.is_empty(),
        "the stream holds ids nobody tracked: {unknown:?}"
    );
    assert!(twice.is_empty(), "events stored twice: {twice:?}");
    assert_eq!(
        contents.messages,
        tracked.len() as u64,
        "one message per event"
    );
    assert_eq!(contents.id_mismatches, 0, "Nats-Msg-Id is project:event_id");
    assert_eq!(
        drained,
        Some(0),
        "the SIGTERMed collector drained and exited 0"
    );
    assert_eq!(
        no_live, 0,
        "nginx benched healthy collectors (no live upstreams):\n{error_log}"
    );
    assert!(
        outage_503s > 0,
        "devices heard 503 while the cluster was down"
    );
    assert_eq!(
        outage_503s, outage_503s_with_retry_after,
        "every 503 of the outage carried Retry-After"
    );
    assert_eq!(totals.installs, SPOOLS as u64, "every spool's reports");
    assert_eq!(
        totals.count("tracked"),
        tracked.len() as u64,
        "the reports' stream totals every tracked event once"
    );
    for spool in &spools {
        let _ = spool.shutdown(Duration::from_secs(5));
    }
}

fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}
