//! `eventspool conformance` against real collectors on 127.0.0.1: the reference collector as a
//! process (every check passes; its misbehaviour switches fail the check they should), and a
//! small collector with one flaw at a time (`broken.rs`), for which exactly the check that
//! covers the flaw fails, with a fix that names it. The read-back hook is `read_back.py`.

mod broken;
mod harness;

use std::collections::BTreeSet;

use broken::{BODY_LIMIT, Broken, Flaw};
use harness::{Collector, READ_BACK, check, conformance, failed, results, run};
use serde_json::Value;

const KEY: &str = "conformance-test-key";
/// A directive within every bound of docs/protocol.md §Directives.
const GOOD_DIRECTIVE: &str = r#"{"id":"conformance-ok","ttl_ms":60000,"sample_rate":{"debug_":0.5},"drop_names":["legacy_ping"]}"#;
const ALL_CHECKS: [&str; 9] = [
    "answer_body",
    "dedup",
    "malformed_event",
    "encodings",
    "field_order",
    "body_limit",
    "auth",
    "directives",
    "load",
];

fn hook(kind: &str, path: &std::path::Path) -> String {
    format!("python3 {READ_BACK} {kind} {}", path.display())
}

#[test]
fn the_reference_collector_passes_every_check() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("collected.db");
    let collector = Collector::start(&[
        "--db",
        db.to_str().unwrap(),
        "--require-api-key",
        KEY,
        "--max-body-bytes",
        "1000000",
        "--directives",
        GOOD_DIRECTIVE,
    ]);
    let verify = hook("sqlite", &db);
    let (out, report) = conformance(
        &collector.url,
        &[
            "--api-key",
            KEY,
            "--load",
            "--load-requests",
            "60",
            "--verify-cmd",
            &verify,
        ],
    );
    let names: Vec<String> = results(&report).into_iter().map(|(c, _)| c).collect();
    assert_eq!(names, ALL_CHECKS, "{report}");
    for (name, result) in results(&report) {
        assert_eq!(result, "pass", "{name}: {}", check(&report, &name));
    }
    assert_eq!(out.code, 0, "{}", out.stderr);
    for name in [
        "answer_body",
        "dedup",
        "malformed_event",
        "encodings",
        "field_order",
    ] {
        let did = check(&report, name)["did"].as_str().unwrap();
        assert!(did.contains("read back"), "{name} did not read back: {did}");
    }
    // Every request went to the one URL, and each check kept within its bound.
    let stats = collector.stats();
    assert_eq!(stats["requests"], report["requests"], "{stats} vs {report}");
    // The bounds of docs/cli.md: 23 requests for the eight checks, plus --load-requests.
    assert!(report["requests"].as_u64().unwrap() <= 23 + 60, "{report}");
    // Every event stored is tagged with the run, under the documented name prefix.
    let conn = rusqlite::Connection::open(&db).unwrap();
    let mut stmt = conn.prepare("SELECT name, properties FROM events").unwrap();
    let rows: Vec<(String, String)> = stmt
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    assert!(rows.len() > 60 * 20, "{} stored", rows.len());
    for (name, properties) in rows {
        let check = name
            .strip_prefix("eventspool_conformance_")
            .unwrap_or_else(|| panic!("untagged name {name}"));
        assert!(ALL_CHECKS.contains(&check), "{name}");
        let p: Value = serde_json::from_str(&properties).unwrap();
        assert_eq!(p["eventspool_conformance"]["run"], report["run"], "{p}");
        assert_eq!(p["eventspool_conformance"]["check"], check, "{p}");
    }
}

/// What the README shows a collector team: a bare reference collector has nothing failing; its
/// own 4 MiB body limit passes `body_limit`, and the checks it has nothing to show for (no key,
/// no directives) say so.
#[test]
fn the_table_of_a_bare_reference_collector_has_no_failure() {
    let collector = Collector::start(&[]);
    let out = run(&["conformance", "--endpoint", &collector.url]);
    assert_eq!(out.code, 0, "{}\n{}", out.stdout, out.stderr);
    let header = out.stdout.lines().next().unwrap();
    for column in ["CHECK", "PROTOCOL SAYS", "COLLECTOR DID", "RESULT"] {
        assert!(header.contains(column), "{header}");
    }
    let result_of = |name: &str| {
        out.stdout
            .lines()
            .find(|l| l.starts_with(&format!("{name} ")))
            .unwrap_or_else(|| panic!("no row for {name}:\n{}", out.stdout))
            .split_whitespace()
            .last()
            .unwrap()
            .to_string()
    };
    for name in [
        "answer_body",
        "dedup",
        "malformed_event",
        "encodings",
        "field_order",
        "body_limit",
    ] {
        assert_eq!(result_of(name), "pass", "{}", out.stdout);
    }
    for name in ["auth", "directives"] {
        assert_eq!(result_of(name), "n/a", "{}", out.stdout);
    }
    assert!(
        !out.stdout.contains("\nload "),
        "load ran without --load:\n{}",
        out.stdout
    );
    assert!(
        out.stdout.contains("8 checks: 6 pass, 0 fail, 2 n/a"),
        "{}",
        out.stdout
    );
    assert!(
        out.stdout.contains("eventspool_conformance_<check>"),
        "{}",
        out.stdout
    );
}

/// Runs every non-load check (and `load` when `extra` asks) against the broken collector,
/// reading back its file, and asserts that `expect` is the only failure, with a fix that
/// contains `fix`.
fn only_this_fails(flaw: Flaw, extra: &[&str], expect: &str, fix: &str) -> Value {
    let dir = tempfile::tempdir().unwrap();
    let collector = Broken::start(flaw, dir.path());
    let verify = hook("lines", collector.stored_file());
    let mut args = vec!["--verify-cmd", verify.as_str()];
    args.extend_from_slice(extra);
    let (out, report) = conformance(&collector.url, &args);
    assert_eq!(failed(&report), [expect], "{flaw:?}: {report}");
    assert_eq!(out.code, 1, "{flaw:?}: {}", out.stderr);
    let entry = check(&report, expect);
    let said = entry["fix"].as_str().unwrap_or("");
    assert!(said.contains(fix), "{flaw:?}: fix {said:?} lacks {fix:?}");
    let did = entry["did"].as_str().unwrap();
    assert!(!did.is_empty());
    eprintln!("{flaw:?}: {expect} fails: {did}\n  fix: {said}");
    let paths: BTreeSet<String> = collector.paths().into_iter().collect();
    assert_eq!(
        paths,
        BTreeSet::from(["/v1/batch".to_string()]),
        "sent elsewhere"
    );
    report
}

#[test]
fn the_small_collector_without_a_flaw_passes_with_per_event_rejections() {
    let dir = tempfile::tempdir().unwrap();
    let collector = Broken::start(Flaw::None, dir.path());
    let verify = hook("lines", collector.stored_file());
    let limit = BODY_LIMIT.to_string();
    let (out, report) = conformance(
        &collector.url,
        &["--verify-cmd", &verify, "--body-limit", &limit],
    );
    assert_eq!(out.code, 0, "{report}");
    assert_eq!(failed(&report), Vec::<String>::new(), "{report}");
    let malformed = check(&report, "malformed_event")["did"].as_str().unwrap();
    assert!(malformed.contains("listed in rejected"), "{malformed}");
    assert_eq!(check(&report, "body_limit")["result"], "pass", "{report}");
}

#[test]
fn a_collector_that_stores_every_copy_fails_dedup_only() {
    only_this_fails(
        Flaw::NoDedup,
        &[],
        "dedup",
        "store each event once by event_id",
    );
}

#[test]
fn a_collector_that_drops_a_bad_event_silently_fails_malformed_event_only() {
    only_this_fails(
        Flaw::SilentDrop,
        &[],
        "malformed_event",
        "lost without a trace",
    );
}

#[test]
fn a_collector_without_gzip_fails_encodings_only() {
    only_this_fails(Flaw::NoGzip, &[], "encodings", "Content-Encoding: gzip");
}

#[test]
fn a_collector_that_reads_members_by_position_fails_field_order_only() {
    only_this_fails(Flaw::FieldOrder, &[], "field_order", "in any order");
}

#[test]
fn a_collector_that_answers_400_to_a_large_body_fails_body_limit_only() {
    only_this_fails(
        Flaw::TooLargeAs400,
        &[],
        "body_limit",
        "answer 413, not 400",
    );
}

#[test]
fn a_collector_that_writes_counts_as_strings_fails_answer_body_only() {
    only_this_fails(
        Flaw::CountsAsStrings,
        &[],
        "answer_body",
        "a non-negative integer",
    );
}

const LOAD: [&str; 7] = [
    "--load",
    "--load-requests",
    "40",
    "--load-concurrency",
    "10",
    "--deadline",
    "2",
];

#[test]
fn a_collector_that_hangs_under_load_fails_load_only() {
    let report = only_this_fails(Flaw::HangUnderLoad, &LOAD, "load", "answer 503 (or 429)");
    let did = check(&report, "load")["did"].as_str().unwrap();
    assert!(did.contains("without an answer within 2 s"), "{did}");
}

#[test]
fn a_collector_that_sheds_without_retry_after_fails_load_only() {
    only_this_fails(
        Flaw::ShedWithoutRetryAfter,
        &LOAD,
        "load",
        "add Retry-After",
    );
}

#[test]
fn a_collector_that_sheds_with_retry_after_passes_load() {
    let dir = tempfile::tempdir().unwrap();
    let collector = Broken::start(Flaw::ShedWithRetryAfter, dir.path());
    let mut args = vec!["--only", "load"];
    args.extend_from_slice(&LOAD);
    let (out, report) = conformance(&collector.url, &args);
    assert_eq!(out.code, 0, "{report}");
    let did = check(&report, "load")["did"].as_str().unwrap();
    assert!(did.contains("× 503"), "no request was shed: {did}");
}

/// The reference collector's own switches: no key required (while the run has one), and
/// directives past the SDK's bounds.
#[test]
fn a_collector_that_takes_any_key_fails_auth_only() {
    let collector = Collector::start(&["--max-body-bytes", "1000000"]);
    let (out, report) = conformance(&collector.url, &["--api-key", KEY]);
    assert_eq!(failed(&report), ["auth"], "{report}");
    assert_eq!(out.code, 1);
    let auth = check(&report, "auth");
    assert!(auth["fix"].as_str().unwrap().contains("with 401"), "{auth}");
    assert!(
        auth["did"]
            .as_str()
            .unwrap()
            .starts_with("without Authorization: 200"),
        "{auth}"
    );
}

#[test]
fn directives_past_the_sdk_bounds_fail_directives_only() {
    let collector = Collector::start(&[
        "--max-body-bytes",
        "1000000",
        "--directives",
        r#"{"id":"fix-1","sample_rate":{"debug_":2},"pause_for":"ever"}"#,
    ]);
    let (out, report) = conformance(&collector.url, &[]);
    assert_eq!(failed(&report), ["directives"], "{report}");
    assert_eq!(out.code, 1);
    let did = check(&report, "directives")["did"].as_str().unwrap();
    assert!(
        did.contains("sample_rate") && did.contains("pause_for"),
        "{did}"
    );
}

#[test]
fn only_runs_the_named_checks_and_a_failing_hook_fails_the_check_that_asked() {
    let collector = Collector::start(&[]);
    let (out, report) = conformance(&collector.url, &["--only", "field_order,auth"]);
    assert_eq!(out.code, 0, "{report}");
    let names: Vec<String> = results(&report).into_iter().map(|(c, _)| c).collect();
    assert_eq!(names, ["field_order", "auth"]);
    assert_eq!(report["requests"], 2);
    assert_eq!(collector.stats()["requests"], 2);

    let (out, report) = conformance(
        &collector.url,
        &[
            "--only",
            "answer_body",
            "--verify-cmd",
            "echo gone >&2; exit 3",
        ],
    );
    assert_eq!(out.code, 1);
    let entry = check(&report, "answer_body");
    assert_eq!(entry["result"], "fail");
    assert!(entry["did"].as_str().unwrap().contains("gone"), "{entry}");
    assert!(
        entry["fix"].as_str().unwrap().contains("--verify-cmd"),
        "{entry}"
    );
}

#[test]
fn bad_arguments_exit_2_and_name_what_is_wrong() {
    let url = "http://127.0.0.1:9/v1/batch";
    for (args, says) in [
        (vec!["--only", "nope"], "no such check"),
        (vec!["--deadline", "0"], "--deadline"),
        (vec!["--deadline=-1"], "--deadline"),
        (vec!["--deadline", "601"], "--deadline"),
        (vec!["--load-requests", "0"], "--load-requests"),
        (vec!["--load-concurrency", "0"], "--load-concurrency"),
        (vec!["--body-limit", "10"], "--body-limit"),
        (vec!["--verify-cmd", " "], "--verify-cmd"),
    ] {
        let mut all = vec!["conformance", "--endpoint", url];
        all.extend_from_slice(&args);
        let out = run(&all);
        assert_eq!(out.code, 2, "{args:?}: {}", out.stderr);
        assert!(out.stderr.contains(says), "{args:?}: {}", out.stderr);
        assert!(out.stdout.is_empty(), "{args:?} printed a report");
    }
    for endpoint in ["not a url", "http://example.com/v1/batch"] {
        let out = run(&["conformance", "--endpoint", endpoint]);
        assert_eq!(out.code, 2, "{endpoint}: {}", out.stderr);
        assert!(out.stderr.contains("--endpoint"), "{}", out.stderr);
    }
    let out = run(&["conformance"]);
    assert_eq!(out.code, 2, "{}", out.stderr);
}
