//! The `eventspool` binary as users run it: real subprocesses, a real `eventspool collector`
//! process on 127.0.0.1, real store files. Every wait is bounded; children are killed when a
//! test fails (their guards kill on drop).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use eventspool_testkit::tinyfs;
use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_eventspool");
const RUN_TIMEOUT: Duration = Duration::from_secs(120);

/// A child process killed when dropped, so a failing assertion never leaves it running.
struct Guard(Child);

impl Drop for Guard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A running `eventspool collector`.
struct Collector {
    _child: Guard,
    addr: String,
    url: String,
}

impl Collector {
    fn start(flags: &[&str]) -> Collector {
        let mut child = Guard(
            Command::new(BIN)
                .args(["collector", "--listen", "127.0.0.1:0"])
                .args(flags)
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::null())
                .spawn()
                .expect("start collector"),
        );
        let stdout = child.0.stdout.take().expect("collector stdout");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut line = String::new();
            let _ = BufReader::new(stdout).read_line(&mut line);
            let _ = tx.send(line);
        });
        let line = rx
            .recv_timeout(Duration::from_secs(30))
            .expect("collector printed its address");
        let v: Value = serde_json::from_str(&line)
            .unwrap_or_else(|e| panic!("collector first line {line:?}: {e}"));
        Collector {
            _child: child,
            addr: v["addr"].as_str().unwrap().to_string(),
            url: v["url"].as_str().unwrap().to_string(),
        }
    }

    /// `GET /stats`, or `None` while the collector refuses connections.
    fn try_stats(&self) -> Option<Value> {
        self.get("/stats")
    }

    /// `GET path` as JSON, or `None` while the collector refuses connections.
    fn get(&self, path: &str) -> Option<Value> {
        let mut stream = TcpStream::connect(&self.addr).ok()?;
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .ok()?;
        write!(
            stream,
            "GET {path} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n",
            self.addr
        )
        .ok()?;
        let mut response = String::new();
        stream.read_to_string(&mut response).ok()?;
        let body = response.split_once("\r\n\r\n")?.1;
        serde_json::from_str(body).ok()
    }

    fn stats(&self) -> Value {
        self.try_stats().expect("collector /stats")
    }

    fn wait_until_up(&self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.try_stats().is_none() {
            assert!(Instant::now() < deadline, "collector did not come back");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

struct Output {
    code: i32,
    stdout: String,
    stderr: String,
}

impl Output {
    fn json(&self) -> Value {
        let last = self.stdout.lines().last().unwrap_or_default();
        serde_json::from_str(last).unwrap_or_else(|e| {
            panic!(
                "stdout {:?} is not JSON: {e}; stderr: {}",
                self.stdout, self.stderr
            )
        })
    }
}

fn spawn(args: &[&str], stdin: Option<String>) -> Guard {
    let mut child = Guard(
        Command::new(BIN)
            .args(args)
            .stdin(if stdin.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start eventspool"),
    );
    if let Some(text) = stdin {
        let mut pipe = child.0.stdin.take().unwrap();
        std::thread::spawn(move || {
            let _ = pipe.write_all(text.as_bytes());
        });
    }
    child
}

/// Waits for the child with a bound; kills it and fails the test past that.
fn finish(mut child: Guard) -> Output {
    let read = |r: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut s = String::new();
            if let Some(mut r) = r {
                let _ = r.read_to_string(&mut s);
            }
            s
        })
    };
    let out = read(
        child
            .0
            .stdout
            .take()
            .map(|s| Box::new(s) as Box<dyn Read + Send>),
    );
    let err = read(
        child
            .0
            .stderr
            .take()
            .map(|s| Box::new(s) as Box<dyn Read + Send>),
    );
    let deadline = Instant::now() + RUN_TIMEOUT;
    let status = loop {
        if let Some(status) = child.0.try_wait().expect("wait") {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "eventspool did not finish within {RUN_TIMEOUT:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    Output {
        code: status.code().unwrap_or(-1),
        stdout: out.join().unwrap(),
        stderr: err.join().unwrap(),
    }
}

fn run(args: &[&str]) -> Output {
    finish(spawn(args, None))
}

fn events(n: usize, name: impl Fn(usize) -> String) -> String {
    (1..=n)
        .map(|i| {
            format!(
                "{{\"name\":\"{}\",\"properties\":{{\"n\":{i}}}}}\n",
                name(i)
            )
        })
        .collect()
}

fn write_input(dir: &Path, text: &str) -> PathBuf {
    let path = dir.join("events.jsonl");
    std::fs::write(&path, text).unwrap();
    path
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[test]
fn send_of_5000_events_delivers_each_once() {
    let dir = tempfile::tempdir().unwrap();
    let collector = Collector::start(&[]);
    let input = write_input(dir.path(), &events(5000, |i| format!("ev_{}", i % 7)));
    let db = dir.path().join("s.db");
    let out = run(&[
        "send",
        "--endpoint",
        &collector.url,
        "--db",
        s(&db),
        "--input",
        s(&input),
    ]);
    assert_eq!(out.code, 0, "stderr: {}", out.stderr);
    let summary = out.json();
    assert_eq!(summary["delivered"], 5000, "{summary}");
    assert_eq!(summary["pending"], 0);
    assert_eq!(summary["state"], "idle");
    assert_eq!(collector.stats()["distinct"], 5000);
}

/// The collector process totals the client reports `send` carries and shows them at
/// `GET /fleet`; a `--directives` that is not a JSON object is refused naming the flag.
#[test]
fn the_collector_shows_fleet_totals_from_client_reports() {
    let dir = tempfile::tempdir().unwrap();
    let collector = Collector::start(&["--fleet-every", "0.2"]);
    let input = write_input(dir.path(), &events(30, |i| format!("ev_{i}")));
    let db = dir.path().join("s.db");
    let out = run(&[
        "send",
        "--endpoint",
        &collector.url,
        "--db",
        s(&db),
        "--input",
        s(&input),
    ]);
    assert_eq!(out.code, 0, "stderr: {}", out.stderr);
    let fleet = collector.get("/fleet").expect("GET /fleet");
    assert_eq!(fleet["installs"], 1, "{fleet}");
    assert_eq!(fleet["counts"]["tracked"], 30, "{fleet}");
    assert_eq!(fleet["duplicates"], 0, "{fleet}");
    let bad = run(&[
        "collector",
        "--listen",
        "127.0.0.1:0",
        "--directives",
        "[1]",
    ]);
    assert_eq!(bad.code, 2, "stderr: {}", bad.stderr);
    assert!(bad.stderr.contains("--directives"), "{}", bad.stderr);
}

#[test]
fn send_during_an_outage_keeps_events_for_flush() {
    let dir = tempfile::tempdir().unwrap();
    let collector = Collector::start(&["--outage-secs", "4"]);
    let input = write_input(dir.path(), &events(300, |_| "offline".into()));
    let db = dir.path().join("s.db");
    let small_budget = [
        "--set",
        "max_auto_attempts=2",
        "--set",
        "backoff_base_ms=10",
        "--set",
        "backoff_cap_ms=20",
    ];
    let mut args = vec![
        "send",
        "--endpoint",
        &collector.url,
        "--db",
        s(&db),
        "--input",
        s(&input),
    ];
    args.extend(small_budget);
    let out = run(&args);
    assert_eq!(out.code, 3, "stdout: {} stderr: {}", out.stdout, out.stderr);
    let summary = out.json();
    assert_eq!(summary["state"], "waiting_for_user", "{summary}");
    assert_eq!(summary["pending"], 300, "{summary}");

    let status = run(&["status", "--db", s(&db)]);
    assert_eq!(status.code, 0, "{}", status.stderr);
    assert_eq!(status.json()["pending"], 300);

    collector.wait_until_up();
    let out = run(&["flush", "--endpoint", &collector.url, "--db", s(&db)]);
    assert_eq!(out.code, 0, "stderr: {}", out.stderr);
    assert_eq!(out.json()["delivered"], 300);
    assert_eq!(collector.stats()["distinct"], 300);
}

#[test]
fn a_refused_key_pauses_and_the_summary_says_why() {
    let dir = tempfile::tempdir().unwrap();
    let collector = Collector::start(&["--require-api-key", "right"]);
    let input = write_input(dir.path(), &events(40, |_| "auth".into()));
    let db = dir.path().join("s.db");
    let out = run(&[
        "send",
        "--endpoint",
        &collector.url,
        "--db",
        s(&db),
        "--api-key",
        "k-7f3a9c",
        "--input",
        s(&input),
    ]);
    assert_eq!(out.code, 3, "stdout: {} stderr: {}", out.stdout, out.stderr);
    let summary = out.json();
    // The fields of docs/cli.md §Summary, unchanged.
    assert_eq!(summary["state"], "paused", "{summary}");
    assert_eq!(summary["pending"], 40, "{summary}");
    assert_eq!(summary["delivered"], 0, "{summary}");
    // What a script needs to act: which pause, how many attempts, the one-line error.
    assert_eq!(summary["pause"], "auth", "{summary}");
    assert_eq!(summary["attempts"], 1, "{summary}");
    assert_eq!(summary["last_status"], 401, "{summary}");
    let last_error = summary["last_error"].as_str().unwrap_or_default();
    assert!(
        last_error.starts_with("HTTP 401 Unauthorized") && !last_error.contains('\n'),
        "{summary}"
    );
    assert!(
        !out.stdout.contains("k-7f3a9c"),
        "the key never shows: {summary}"
    );
    assert!(
        !out.stderr.contains("k-7f3a9c"),
        "the key never shows: {}",
        out.stderr
    );
    // stderr says it once, on one line.
    let stopped: Vec<&str> = out
        .stderr
        .lines()
        .filter(|l| l.contains("HTTP 401"))
        .collect();
    assert_eq!(stopped.len(), 1, "stderr: {}", out.stderr);
    assert_eq!(
        stopped[0].matches("HTTP 401").count(),
        1,
        "stderr: {}",
        out.stderr
    );
    assert_eq!(collector.stats()["requests"], 1);
}

#[test]
fn a_bad_line_stops_before_anything_is_sent() {
    let dir = tempfile::tempdir().unwrap();
    let collector = Collector::start(&[]);
    let mut lines: Vec<String> = events(30, |_| "fine".into())
        .lines()
        .map(String::from)
        .collect();
    lines[16] = r#"{"name":"broken","properties":[1,2]}"#.into();
    let input = write_input(dir.path(), &(lines.join("\n") + "\n"));
    let out = run(&["send", "--endpoint", &collector.url, "--input", s(&input)]);
    assert_eq!(out.code, 2, "stdout: {} stderr: {}", out.stdout, out.stderr);
    assert!(
        out.stderr.contains("line 17"),
        "stderr must name line 17: {}",
        out.stderr
    );
    assert!(out.stdout.is_empty());
    assert_eq!(collector.stats()["requests"], 0);

    // Unknown settings are refused by name, too.
    let out = run(&[
        "send",
        "--endpoint",
        &collector.url,
        "--set",
        "max_batch_event=5",
        "--input",
        s(&input),
    ]);
    assert_eq!(out.code, 2);
    assert!(out.stderr.contains("max_batch_event"), "{}", out.stderr);
}

#[test]
fn a_poison_event_is_quarantined_then_redriven_with_its_id() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("s.db");
    let poison_id = "01932f5e-7a1b-7c3d-8e4f-0123456789ab";
    let mut text = events(10, |_| "good".into());
    text.push_str(&format!("{{\"name\":\"poison\",\"event_id\":\"{poison_id}\",\"properties\":{{\"secret\":\"s3\"}}}}\n"));
    let input = write_input(dir.path(), &text);
    {
        let strict = Collector::start(&["--reject-name", "poison"]);
        let out = run(&[
            "send",
            "--endpoint",
            &strict.url,
            "--db",
            s(&db),
            "--input",
            s(&input),
        ]);
        assert_eq!(out.code, 0, "stderr: {}", out.stderr);
        let summary = out.json();
        assert_eq!(summary["delivered"], 10, "{summary}");
        assert_eq!(summary["quarantined"], 1, "{summary}");
        assert_eq!(strict.stats()["distinct"], 10);
    }

    let list = run(&["dlq", "list", "--db", s(&db)]);
    assert_eq!(list.code, 0, "{}", list.stderr);
    let entries: Vec<Value> = list
        .stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(entries.len(), 1, "{}", list.stdout);
    assert_eq!(entries[0]["event_id"], poison_id);
    assert_eq!(entries[0]["name"], "poison");
    assert_eq!(entries[0]["reason"], "bad_request");
    assert!(
        !list.stdout.contains("s3"),
        "payload only with --show-payload"
    );
    let shown = run(&["dlq", "list", "--db", s(&db), "--show-payload"]);
    assert!(shown.stdout.contains("s3"));
    let status = run(&["status", "--db", s(&db)]);
    assert_eq!(status.json()["quarantine"]["bad_request"], 1);

    // The collector is fixed (restarted without the flag); redrive, then flush delivers it.
    let collected = dir.path().join("collected.db");
    let fixed = Collector::start(&["--db", s(&collected)]);
    let redrive = run(&["dlq", "redrive", "--db", s(&db), "--all"]);
    assert_eq!(redrive.code, 0, "{}", redrive.stderr);
    assert_eq!(redrive.json()["redriven"], 1);
    let out = run(&["flush", "--endpoint", &fixed.url, "--db", s(&db)]);
    assert_eq!(out.code, 0, "stderr: {}", out.stderr);
    assert_eq!(out.json()["delivered"], 1);
    assert_eq!(fixed.stats()["distinct"], 1);
    let conn = rusqlite::Connection::open(&collected).unwrap();
    let id: String = conn
        .query_row(
            "SELECT event_id FROM events WHERE name = 'poison'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(id, poison_id, "redrive keeps the event_id");
    let list = run(&["dlq", "list", "--db", s(&db)]);
    assert!(
        list.stdout.is_empty(),
        "quarantine empty after redrive: {}",
        list.stdout
    );
}

#[test]
fn status_works_while_send_holds_the_store() {
    let dir = tempfile::tempdir().unwrap();
    let collector = Collector::start(&["--delay-ms", "300"]);
    let input = write_input(dir.path(), &events(1000, |_| "slow".into()));
    let db = dir.path().join("s.db");
    let sender = spawn(
        &[
            "send",
            "--endpoint",
            &collector.url,
            "--db",
            s(&db),
            "--input",
            s(&input),
            "--set",
            "max_batch_events=50",
        ],
        None,
    );
    // Wait for the first batch: the store is open and owned by the sender by then.
    let deadline = Instant::now() + Duration::from_secs(60);
    while collector.stats()["requests"].as_u64().unwrap_or(0) == 0 {
        assert!(Instant::now() < deadline, "sender made no request");
        std::thread::sleep(Duration::from_millis(20));
    }
    let status = run(&["status", "--db", s(&db)]);
    assert_eq!(status.code, 0, "{}", status.stderr);
    let v = status.json();
    assert!(v["pending"].as_u64().unwrap() > 0, "{v}");
    assert!(
        v["oldest"].is_string() && v["bytes"].as_u64().unwrap() > 0,
        "{v}"
    );
    // Changing the store needs its owner lock, which the sender holds.
    let dlq = run(&["dlq", "purge", "--db", s(&db), "--all"]);
    assert_eq!(dlq.code, 1);
    assert!(dlq.stderr.contains("already open"), "{}", dlq.stderr);

    let out = finish(sender);
    assert_eq!(out.code, 0, "stderr: {}", out.stderr);
    assert_eq!(out.json()["delivered"], 1000);
    assert_eq!(collector.stats()["distinct"], 1000);
}

#[test]
fn demo_script_plays_the_story_and_checks_the_end_state() {
    let out = run(&["demo", "--script"]);
    assert_eq!(
        out.code, 0,
        "stdout: {}\nstderr: {}",
        out.stdout, out.stderr
    );
    // Every automatic attempt is shown, in order, however short its backoff was.
    let mut from = 0;
    for n in 1..=5 {
        let shown = format!("attempt {n} of 5");
        let at = out.stdout[from..].find(&shown);
        assert!(
            at.is_some(),
            "{shown} not shown after byte {from}:\n{}",
            out.stdout
        );
        from += at.unwrap();
    }
    assert!(
        out.stdout.contains("(bad_request): status 400"),
        "{}",
        out.stdout
    );
    assert!(out.stdout.contains("199 delivered"), "{}", out.stdout);
    // The fleet loop: the report leaves with the quarantine in it, the redrive comes back.
    assert!(
        out.stdout.contains("quarantined.bad_request 1"),
        "{}",
        out.stdout
    );
    assert!(out.stdout.contains("1 redriven"), "{}", out.stdout);
}

#[test]
fn every_subcommand_help_says_what_and_shows_an_example() {
    for cmd in [
        vec!["send"],
        vec!["flush"],
        vec!["status"],
        vec!["dlq"],
        vec!["dlq", "list"],
        vec!["dlq", "show"],
        vec!["dlq", "redrive"],
        vec!["dlq", "purge"],
        vec!["collector"],
        vec!["conformance"],
        vec!["demo"],
    ] {
        let mut args = cmd.clone();
        args.push("--help");
        let out = run(&args);
        assert_eq!(out.code, 0, "{cmd:?}: {}", out.stderr);
        assert!(
            out.stdout.contains("Example"),
            "{cmd:?} --help has no example:\n{}",
            out.stdout
        );
        assert!(
            out.stdout.lines().next().is_some_and(|l| l.len() > 10),
            "{cmd:?} --help has no summary"
        );
    }
}

/// An importer's historical timestamp is delivered: age counts from acceptance, not from it.
#[test]
fn send_of_an_old_timestamp_delivers_it() {
    let collector = Collector::start(&[]);
    let out = finish(spawn(
        &["send", "--endpoint", &collector.url, "--input", "-"],
        Some(
            "{\"name\":\"imported\",\"timestamp\":\"2025-01-02T03:04:05.006Z\",\"properties\":{}}\n"
                .into(),
        ),
    ));
    assert_eq!(out.code, 0, "stderr: {}", out.stderr);
    let summary = out.json();
    assert_eq!(summary["delivered"], 1, "{summary}");
    assert_eq!(summary["dropped"], serde_json::json!({}), "{summary}");
    assert_eq!(collector.stats()["distinct"], 1);
}

/// Every event the CLI drops is named on stderr with the reason, not only counted.
#[test]
fn flush_names_each_expired_event_on_stderr() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("x.db");
    // Nothing listens there: every attempt is refused, so the events stay in the store.
    let dead = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("http://{}/v1/batch", listener.local_addr().unwrap())
    };
    let ids = [
        "0193a0b2-7c4e-7000-8000-00000000e001",
        "0193a0b2-7c4e-7000-8000-00000000e002",
        "0193a0b2-7c4e-7000-8000-00000000e003",
    ];
    let input: String = ids
        .iter()
        .map(|id| format!("{{\"name\":\"old\",\"event_id\":\"{id}\"}}\n"))
        .collect();
    let input = write_input(dir.path(), &input);
    let budget = [
        "--set",
        "max_auto_attempts=1",
        "--set",
        "backoff_base_ms=10",
    ];
    let mut args = vec![
        "send",
        "--endpoint",
        &dead,
        "--db",
        s(&db),
        "--input",
        s(&input),
    ];
    args.extend(budget);
    let out = run(&args);
    assert_eq!(out.code, 3, "stdout: {} stderr: {}", out.stdout, out.stderr);
    assert_eq!(out.json()["pending"], 3);
    // Accepted by the run above, so older than 1 ms once this one starts.
    std::thread::sleep(Duration::from_millis(20));
    let mut args = vec!["flush", "--endpoint", &dead, "--db", s(&db)];
    args.extend(["--set", "max_event_age_ms=1"]);
    let out = run(&args);
    assert_eq!(out.code, 0, "stdout: {} stderr: {}", out.stdout, out.stderr);
    assert_eq!(out.json()["dropped"]["expired"], 3, "{}", out.stdout);
    for id in ids {
        assert!(
            out.stderr
                .lines()
                .any(|l| l.contains(id) && l.contains("expired")),
            "{id} not named on stderr: {}",
            out.stderr
        );
    }
}

/// `dlq list` and `dlq show` only read: an unreadable store is reported (exit 1, the file named)
/// and left exactly as it was, never moved aside or replaced by a fresh store.
#[test]
fn dlq_list_and_show_never_change_an_unreadable_store() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("broken.db");
    let garbage: Vec<u8> = (0..16_384u32).map(|i| (i * 7 + 13) as u8).collect();
    std::fs::write(&db, &garbage).unwrap();
    let files = |dir: &Path| {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    };
    for args in [
        vec!["dlq", "list", "--db", s(&db)],
        vec![
            "dlq",
            "show",
            "--db",
            s(&db),
            "01932f5e-7a1b-7c3d-8e4f-0123456789ab",
        ],
    ] {
        let out = run(&args);
        assert_eq!(
            out.code, 1,
            "{args:?}: stdout {} stderr {}",
            out.stdout, out.stderr
        );
        assert!(
            out.stderr.contains(s(&db)),
            "{args:?}: the error names the file: {}",
            out.stderr
        );
        assert!(out.stdout.is_empty(), "{args:?}: {}", out.stdout);
        assert_eq!(
            std::fs::read(&db).unwrap(),
            garbage,
            "{args:?}: the file's bytes are unchanged"
        );
        assert_eq!(
            files(dir.path()),
            ["broken.db"],
            "{args:?}: nothing moved aside or created"
        );
    }
}

/// `--set consent=pending`: the events are kept in the store, nothing is sent, and `send`
/// stops at once with exit 3 and state `deferred` rather than waiting out its timeout; a
/// critical line goes in its lane and `status` counts it.
#[test]
fn send_with_consent_pending_keeps_everything_and_stops() {
    let dir = tempfile::tempdir().unwrap();
    let collector = Collector::start(&[]);
    let mut lines = events(20, |_| "kept".into());
    lines.push_str("{\"name\":\"crash\",\"priority\":\"critical\"}\n");
    let input = write_input(dir.path(), &lines);
    let db = dir.path().join("s.db");
    let out = run(&[
        "send",
        "--endpoint",
        &collector.url,
        "--db",
        s(&db),
        "--input",
        s(&input),
        "--set",
        "consent=pending",
        "--timeout",
        "60",
    ]);
    assert_eq!(out.code, 3, "stdout: {} stderr: {}", out.stdout, out.stderr);
    let summary = out.json();
    assert_eq!(summary["state"], "deferred", "{summary}");
    assert_eq!(summary["deferred"], "consent", "{summary}");
    assert_eq!(summary["pending"], 21, "{summary}");
    assert_eq!(collector.stats()["requests"], 0);
    let status = run(&["status", "--db", s(&db)]).json();
    assert_eq!(status["pending"], 21, "{status}");
    assert_eq!(status["pending_critical"], 1, "{status}");
    assert_eq!(
        status["consent"], "pending",
        "the initial state, recorded: {status}"
    );
}

/// A store on a file system that fills mid-run (a 1 MiB tmpfs, the cap set far above it): the
/// summary is printed with the store's error, exit 1; what was not tracked or not kept is
/// said; a later `flush` delivers what the store held; tracked = delivered + counted drops +
/// pending, exactly, and nothing arrives twice. Skipped, saying why, where a tmpfs cannot be
/// mounted (it needs root; CI runs as root).
#[test]
fn send_on_a_disk_that_fills_mid_run_prints_its_summary_and_accounts_for_every_event() {
    send_until_the_disk_fills(
        "full disk via the CLI",
        &events(20_000, |i| format!("ev_{}", i % 5)),
        20_000,
        &["max_disk_bytes=67108864"],
    );
}

/// As above, with writes of several transactions each: 300-byte events, a cap of 2 MiB (64 KiB
/// transactions) and a memory capacity of 2,000, so each `persist()` of 1,000 events is about
/// five transactions and the disk fills inside one of them, after some committed. What
/// committed is in the store only: delivered once by the `flush`, never also counted dropped.
#[test]
fn send_on_a_disk_that_fills_within_a_multi_transaction_write_accounts_for_every_event() {
    let pad = "p".repeat(300);
    let input: String = (1..=6_000)
        .map(|i| format!("{{\"name\":\"ev\",\"properties\":{{\"n\":{i},\"pad\":\"{pad}\"}}}}\n"))
        .collect();
    send_until_the_disk_fills(
        "full disk within a write via the CLI",
        &input,
        6_000,
        &["max_disk_bytes=2097152", "memory_capacity=2000"],
    );
}

/// `send` with `lines` lines of `input` to a store on a 1 MiB tmpfs, with `sets` added to the
/// config, against a closed port; then space returns and a `flush` delivers to a collector.
fn send_until_the_disk_fills(what: &str, input: &str, lines: u64, sets: &[&str]) {
    let fs = match tinyfs::TinyFs::try_mount(1024 * 1024) {
        Ok(fs) => fs,
        Err(why) => {
            eprintln!("skipped: {why}");
            return;
        }
    };
    let dir = tempfile::tempdir().unwrap();
    let input = write_input(dir.path(), input);
    let db = fs.path().join("s.db");
    // Nothing listens on port 9: every attempt is refused, so nothing is delivered during the
    // run and the budget of two attempts ends it quickly.
    let mut args = vec![
        "send",
        "--endpoint",
        "http://127.0.0.1:9/v1/batch",
        "--db",
        s(&db),
        "--input",
        s(&input),
        "--set",
        "max_auto_attempts=2",
        "--set",
        "backoff_base_ms=10",
        "--set",
        "backoff_cap_ms=20",
    ];
    for set in sets {
        args.extend(["--set", set]);
    }
    let out = run(&args);
    assert_eq!(out.code, 1, "stdout: {} stderr: {}", out.stdout, out.stderr);
    let summary = out.json();
    let store_error = summary["store_error"].as_str().unwrap_or_default();
    assert!(
        store_error.contains("full"),
        "the summary does not say the store failed: {summary}"
    );
    let untracked = summary["untracked"].as_u64().unwrap_or(0);
    let tracked = lines - untracked;
    let dropped: u64 = summary["dropped"]
        .as_object()
        .unwrap()
        .values()
        .map(|n| n.as_u64().unwrap())
        .sum();
    let refused = summary["dropped"]["store_refused"].as_u64().unwrap_or(0);
    let pending = summary["pending"].as_u64().unwrap();
    assert_eq!(summary["delivered"], 0, "{summary}");
    assert!(pending > 0, "the store kept nothing: {summary}");
    assert!(
        out.stderr.contains("store_refused") || refused == 0,
        "the events not kept are not named on stderr: {}",
        out.stderr
    );
    assert!(
        out.stderr.contains("input lines were not tracked") || untracked == 0,
        "{}",
        out.stderr
    );

    // Space returns; a live collector takes what the store held.
    fs.remount("size=64m");
    let collector = Collector::start(&[]);
    let flushed = run(&["flush", "--endpoint", &collector.url, "--db", s(&db)]);
    assert_eq!(flushed.code, 0, "stderr: {}", flushed.stderr);
    let later = flushed.json();
    let delivered = later["delivered"].as_u64().unwrap();
    assert_eq!(later["pending"], 0, "{later}");
    assert_eq!(
        tracked,
        delivered + dropped,
        "tracked {tracked} = delivered later {delivered} + counted drops {dropped} + pending 0 \
         (send said {summary}, flush said {later})"
    );
    assert_eq!(delivered, pending, "flush delivered what the store held");
    let stats = collector.stats();
    assert_eq!(stats["distinct"], delivered, "{stats}");
    assert_eq!(
        stats["received"], stats["distinct"],
        "an event arrived twice: {stats}"
    );
    eprintln!(
        "{what}: {lines} lines, {untracked} untracked, {pending} kept in the store and delivered by flush, {refused} store_refused, dropped {}",
        summary["dropped"]
    );
}
