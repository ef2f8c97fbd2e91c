//! One nginx per scenario, each with the config that makes it answer the way under test.

use std::sync::Arc;
use std::time::Duration;

use eventspool::quarantine_reason as reason;
use eventspool::{Compression, DeliveryState, ManualClock, PauseReason};
use eventspool_collector::{Behavior, Scripted};
use serde_json::json;

use crate::episode::drive_to_waiting_for_user;
use crate::harness::*;
use crate::nginx::{self, Nginx, Site};

const ENDPOINT: &str = "/v1/batch";

/// Everything passes through: batches, the API key, the attempt header.
#[test]
fn pass_through_delivers_every_event_once() {
    let collector = collector(Behavior {
        required_api_key: Some("k-pass".into()),
        ..Behavior::default()
    });
    let nginx = Nginx::start(collector.addr(), &Site::default());
    let mut cfg = config(nginx.url(ENDPOINT));
    cfg.api_key = Some("k-pass".into());
    let spool = offline_spool(cfg, Some(instant_clock()));
    let tracked = track_small(&spool, 1000, "pass");
    spool.set_online(true);
    assert!(spool.wait_drained(WAIT), "state {}", spool.state());
    let stats = spool.stats();
    report_stats("pass-through", &nginx, &stats);
    check_ledger(&collector, &spool, &tracked, &[]);
    assert_eq!(stats.delivered, 1000);
    assert_eq!(stats.requests, 10, "100 events per batch");
    assert_eq!(nginx.statuses(10).get(&200), Some(&10));
    assert!(
        collector
            .requests()
            .iter()
            .all(|r| r.attempt == Some(1) && r.gzip),
        "headers pass through nginx unchanged"
    );
}

/// `client_max_body_size 16k`: nginx answers 413 from the Content-Length, before it reads the
/// body, so the collector never sees those requests. A single event over the limit is isolated
/// and quarantined as `too_large`; its neighbours are delivered.
#[test]
fn body_limit_413_isolates_the_one_event_over_it() {
    let collector = collector(Behavior::default());
    let nginx = Nginx::start(
        collector.addr(),
        &Site {
            server: "client_max_body_size 16k;",
            ..Site::default()
        },
    );
    let mut cfg = config(nginx.url(ENDPOINT));
    cfg.compression = Compression::None;
    let spool = offline_spool(cfg, Some(instant_clock()));
    let mut tracked = track_small(&spool, 150, "small");
    let big = spool
        .track("big", json!({"blob": "b".repeat(20 * 1024)}))
        .unwrap()
        .to_string();
    tracked.push(big.clone());
    tracked.extend(track_small(&spool, 150, "small"));
    spool.set_online(true);
    assert!(spool.wait_drained(WAIT), "state {}", spool.state());
    let stats = spool.stats();
    report_stats("413 one event over client_max_body_size", &nginx, &stats);
    check_ledger(
        &collector,
        &spool,
        &tracked,
        &[(big.clone(), reason::TOO_LARGE)],
    );
    assert_eq!(stats.delivered, 300);
    let entry = spool.quarantine_get(&big).unwrap().expect("quarantined");
    assert_eq!(entry.status, Some(413));
    let statuses = nginx.statuses(stats.requests);
    assert_eq!(
        collector.request_count() as u64,
        statuses.get(&200).copied().unwrap_or(0),
        "nginx refused the 413s itself; only accepted requests reached the collector: {statuses:?}"
    );
}

/// The remembered 413 size and its bound: behind `client_max_body_size 16k` with
/// `compression = none`, 3,000 small events cost at most 10% extra requests (413s) over the
/// successful ones. The remembered size limit keeps it there.
#[test]
fn body_limit_413_costs_at_most_a_tenth_extra_requests() {
    let collector = collector(Behavior::default());
    let nginx = Nginx::start(
        collector.addr(),
        &Site {
            server: "client_max_body_size 16k;",
            ..Site::default()
        },
    );
    let mut cfg = config(nginx.url(ENDPOINT));
    cfg.compression = Compression::None;
    let spool = offline_spool(cfg, Some(instant_clock()));
    let tracked = track_small(&spool, 3000, "small");
    spool.set_online(true);
    assert!(spool.wait_drained(WAIT), "state {}", spool.state());
    let stats = spool.stats();
    report_stats("413 remembered size, 3000 small events", &nginx, &stats);
    check_ledger(&collector, &spool, &tracked, &[]);
    assert_eq!(stats.delivered, 3000);
    let statuses = nginx.statuses(stats.requests);
    let ok = statuses.get(&200).copied().unwrap_or(0);
    let too_large = statuses.get(&413).copied().unwrap_or(0);
    assert!(
        too_large * 10 <= ok,
        "413s must be at most 10% of the successful requests: {too_large} extra for {ok} good"
    );
}

/// `limit_req` at 10 r/s answers the excess 429 (with `limit_req_status 429`) or 503 (its
/// default). Both are transient: the batch waits and goes again, nothing is quarantined.
/// nginx's limiter runs on real time, so this scenario uses the real clock with short
/// backoffs (50–200 ms); the wait is for the drained state, bounded.
#[test]
fn limit_req_429_and_503_are_retried_until_delivered() {
    let collector = collector(Behavior::default());
    let nginx = Nginx::start(
        collector.addr(),
        &Site {
            http: "limit_req_zone $binary_remote_addr zone=per_client:1m rate=10r/s;",
            locations: &[
                (
                    "/limited429/",
                    "limit_req zone=per_client; limit_req_status 429;",
                ),
                ("/limited503/", "limit_req zone=per_client;"),
            ],
            ..Site::default()
        },
    );
    let mut all_tracked = Vec::new();
    for (path, refusal) in [
        ("/limited429/v1/batch", 429u16),
        ("/limited503/v1/batch", 503),
    ] {
        let mut cfg = config(nginx.url(path));
        cfg.backoff_base_ms = 50;
        cfg.backoff_cap_ms = 200;
        cfg.max_auto_attempts = 50;
        let spool = offline_spool(cfg, None);
        let tracked = track_small(&spool, 500, "limited");
        let requests_before = nginx.access_log(0).len() as u64;
        spool.set_online(true);
        assert!(spool.wait_drained(WAIT), "state {}", spool.state());
        let stats = spool.stats();
        let log = nginx.access_log(requests_before + stats.requests);
        let mine: Vec<u16> = log[requests_before as usize..]
            .iter()
            .map(|(status, _)| *status)
            .collect();
        let refused = mine.iter().filter(|s| **s == refusal).count();
        println!(
            "proxy scenario limit_req {refusal}: requests sent {} ({refused} answered {refusal}, {} answered 200), delivered {}, quarantined {}",
            stats.requests,
            mine.iter().filter(|s| **s == 200).count(),
            stats.delivered,
            stats.quarantined
        );
        assert_eq!(mine.len() as u64, stats.requests, "{mine:?}");
        assert!(mine.iter().all(|s| *s == 200 || *s == refusal), "{mine:?}");
        // The second batch follows the first within milliseconds: over 10 r/s, refused.
        assert!(refused >= 1, "limit_req never refused: {mine:?}");
        assert_eq!(stats.delivered, 500);
        all_tracked.extend(tracked.iter().cloned());
        check_ledger(&collector, &spool, &all_tracked, &[]);
        spool.shutdown(Duration::from_secs(10)).unwrap();
    }
    let ok = nginx
        .access_log(0)
        .iter()
        .filter(|(s, _)| *s == 200)
        .count();
    assert_eq!(
        collector.request_count(),
        ok,
        "refused requests never reached the collector"
    );
}

/// The upstream is down: nginx answers its 502 page. The SDK spends its automatic budget,
/// waits for the user with a one-line error (not nginx's HTML), and delivers once the
/// collector is back. The CLI prints that line once.
#[test]
fn upstream_down_502_waits_with_one_readable_line_then_delivers() {
    let collector = collector(Behavior::default());
    collector.set_outage(true).unwrap();
    let nginx = Nginx::start(collector.addr(), &Site::default());
    let mut cfg = config(nginx.url(ENDPOINT));
    cfg.max_auto_attempts = 5;
    // A stepped clock: the episode is driven to the hand-over and then stands still, so the slow
    // probe cannot add a request while the test counts them.
    let stepped = Arc::new(ManualClock::new(1_764_417_600_000));
    let spool = offline_spool(cfg, Some(Arc::new(stepped.clone())));
    let tracked = track_small(&spool, 200, "down");
    spool.set_online(true);
    let waiting = drive_to_waiting_for_user(&spool, &stepped);
    let DeliveryState::WaitingForUser {
        attempts,
        last_error,
        ..
    } = &waiting.state
    else {
        unreachable!()
    };
    assert_eq!(*attempts, 5);
    assert_eq!(last_error.status, Some(502));
    assert_eq!(
        last_error.to_string(),
        format!("HTTP 502 Bad Gateway: {}", nginx::version_tag()),
        "the page's visible text, once"
    );
    let text = spool.state().to_string();
    assert!(
        !text.contains('\n') && !text.contains('<') && text.len() <= 200,
        "the status line is one short line: {text:?}"
    );
    assert_eq!(spool.stats().requests, 6, "the first try and 5 retries");
    assert_eq!(nginx.statuses(6).get(&502), Some(&6));

    // The CLI, same nginx: the stop reason once, on one line, without markup.
    let (input, _) = cli_input(10, "cli_down");
    let url = nginx.url(ENDPOINT);
    let run = cli(
        &[
            "send",
            "--endpoint",
            &url,
            "--set",
            "max_auto_attempts=1",
            "--timeout",
            "30",
        ],
        &input,
    );
    assert_eq!(run.code, 3, "stderr: {}", run.stderr);
    let mentions: Vec<&str> = run.stderr.lines().filter(|l| l.contains("502")).collect();
    assert_eq!(mentions.len(), 1, "stderr: {}", run.stderr);
    assert!(
        !run.stderr.contains('<') && mentions[0].matches("502").count() == 1,
        "stderr: {}",
        run.stderr
    );
    let summary = run.summary();
    let cli_requests = summary["attempts"]
        .as_u64()
        .expect("attempts in the summary");
    assert_eq!(cli_requests, 2, "the first try and 1 retry: {summary}");
    assert!(
        summary["last_error"]
            .as_str()
            .is_some_and(|e| e.starts_with("HTTP 502 Bad Gateway")),
        "{summary}"
    );

    collector.set_outage(false).unwrap();
    spool.retry_now();
    assert!(spool.wait_drained(WAIT), "state {}", spool.state());
    let stats = spool.stats();
    report(
        "502 upstream down (the spool's and the CLI's requests)",
        &nginx,
        stats.requests + cli_requests,
        stats.delivered,
        stats.quarantined,
    );
    assert_eq!(stats.delivered, 200);
    check_ledger(&collector, &spool, &tracked, &[]);
}

/// `proxy_read_timeout` shorter than the collector's answer, which comes after it stored the
/// batch: nginx answers 504 and the SDK cannot know the batch landed (effect unknown). It
/// resends the same ids; the collector dedups; nothing is lost or stored twice.
#[test]
fn read_timeout_504_after_the_collector_stored_resends_the_same_ids() {
    let collector = collector(Behavior::default());
    collector.push_script([Scripted::StoreThenDelay(Duration::from_secs(2))]);
    let nginx = Nginx::start(
        collector.addr(),
        &Site {
            location: "proxy_read_timeout 300ms;",
            ..Site::default()
        },
    );
    let spool = offline_spool(config(nginx.url(ENDPOINT)), Some(instant_clock()));
    let tracked = track_small(&spool, 200, "late");
    spool.set_online(true);
    assert!(spool.wait_drained(WAIT), "state {}", spool.state());
    let stats = spool.stats();
    report_stats("504 read timeout after store", &nginx, &stats);
    check_ledger(&collector, &spool, &tracked, &[]);
    assert_eq!(stats.delivered, 200);
    let statuses = nginx.statuses(stats.requests);
    assert_eq!(statuses.get(&504), Some(&1), "{statuses:?}");
    assert_eq!(
        stats.requests, 3,
        "the 504'd batch once more, then the next"
    );
    // The first batch reached the collector twice, under the same ids.
    assert_eq!(collector.received_count(), 300);
    assert_eq!(collector.distinct_count(), 200);
}

/// nginx answers "400 Request Header Or Cookie Too Large" to every request when the API key
/// header is over `large_client_header_buffers`. The refusal is about the request, not the
/// events: delivery pauses `Paused{config}`
/// after O(log N) requests, nothing is quarantined, the events stay queued (`send` exits 3),
/// and a `flush` with a key that fits delivers them all.
#[test]
fn oversize_header_400_pauses_without_quarantining() {
    const N: usize = 100;
    let collector = collector(Behavior::default());
    let nginx = Nginx::start(
        collector.addr(),
        &Site {
            server: "large_client_header_buffers 2 1k;",
            ..Site::default()
        },
    );
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("spool.db");
    let db = db.to_str().unwrap();
    let url = nginx.url(ENDPOINT);
    let long_key = "k".repeat(1500);
    let (input, ids) = cli_input(N, "header");
    let run = cli(
        &[
            "send",
            "--endpoint",
            &url,
            "--db",
            db,
            "--api-key",
            &long_key,
        ],
        &input,
    );
    let summary = run.summary();
    let requests = nginx.access_log(1).len() as u64;
    let statuses = nginx.statuses(requests);
    println!(
        "proxy scenario 400 oversize header: requests sent {requests} (nginx answered {statuses:?}), delivered {}, quarantined {}, exit {}",
        summary["delivered"], summary["quarantined"], run.code
    );
    assert!(
        !run.stderr.contains(&long_key) && !run.stdout.contains(&long_key),
        "the key never shows"
    );
    assert_eq!(statuses.get(&400), Some(&requests), "{statuses:?}");
    let bound = (2.0 * (N as f64).log2() + 2.0).floor() as u64;
    assert!(
        requests <= bound,
        "a request-level 400 must pause after O(log N) requests: {requests} sent for {N} events (bound {bound}); summary {summary}"
    );
    assert_eq!(summary["quarantined"], 0, "{summary}");
    assert_eq!(summary["state"], "paused", "{summary}");
    assert_eq!(summary["pause"], "config", "{summary}");
    assert_eq!(summary["pending"], N, "{summary}");
    let said = summary["last_error"].as_str().unwrap_or_default();
    assert!(
        said.contains("the request is refused") && !said.contains('<') && !said.contains('\n'),
        "the pause says why, on one line without nginx's markup: {said:?}"
    );
    assert_eq!(run.code, 3, "stderr: {}", run.stderr);

    let run = cli(
        &[
            "flush",
            "--endpoint",
            &url,
            "--db",
            db,
            "--api-key",
            "k-short",
        ],
        "",
    );
    assert_eq!(run.code, 0, "stderr: {}", run.stderr);
    assert_eq!(run.summary()["delivered"], N);
    assert_eq!(collector.distinct_count(), N as u64);
    for id in &ids {
        assert!(collector.contains(id), "{id} delivered under its own id");
    }
    assert_ids_known(&collector, &ids);
    let status = cli(&["status", "--db", db], "");
    assert_eq!(
        status.summary()["quarantine"],
        json!({}),
        "{}",
        status.stdout
    );
}

/// A gateway that checks the key itself answers 401 for the collector: delivery pauses
/// `Paused{auth}` after one request, nothing is quarantined, and a new key resumes it.
#[test]
fn gateway_401_pauses_until_a_new_key() {
    let collector = collector(Behavior::default());
    let nginx = Nginx::start(
        collector.addr(),
        &Site {
            location: r#"if ($http_authorization != "Bearer k-good") { return 401; }"#,
            ..Site::default()
        },
    );
    let mut cfg = config(nginx.url(ENDPOINT));
    cfg.api_key = Some("k-old".into());
    let spool = offline_spool(cfg, Some(instant_clock()));
    let tracked = track_small(&spool, 200, "auth");
    spool.set_online(true);
    let paused = spool
        .wait_for(WAIT, |s| matches!(s.state, DeliveryState::Paused { .. }))
        .unwrap_or_else(|| panic!("never paused: {}", spool.state()));
    let DeliveryState::Paused { reason, last_error } = &paused.state else {
        unreachable!()
    };
    assert_eq!(*reason, PauseReason::Auth);
    // nginx words it "401 Authorization Required"; the status line keeps that, once.
    assert_eq!(
        last_error.to_string(),
        format!(
            "HTTP 401 Unauthorized: Authorization Required {}",
            nginx::version_tag()
        ),
    );
    assert_eq!(paused.pending, 200);
    assert_eq!(spool.stats().requests, 1);
    check_ledger(&collector, &spool, &tracked, &[]);

    spool.set_api_key(Some("k-good".into())).unwrap();
    assert!(spool.wait_drained(WAIT), "state {}", spool.state());
    let stats = spool.stats();
    report_stats("401 from the gateway", &nginx, &stats);
    assert_eq!(stats.delivered, 200);
    assert_eq!(nginx.statuses(stats.requests).get(&401), Some(&1));
    check_ledger(&collector, &spool, &tracked, &[]);
}
