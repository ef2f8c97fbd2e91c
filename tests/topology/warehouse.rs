//! The second dedup stage: a copy that reaches JetStream later than its `duplicate_window` is
//! stored again (the broker cannot know it), and the warehouse's `ReplacingMergeTree ORDER BY
//! event_id` removes it. Runs the real loader (`stream_to_warehouse`) into chdb, an in-process
//! ClickHouse (`pip install chdb`; `bash .ci/run` installs it); fails without it.

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use eventspool_collector::{CollectorConfig, JetStreamConfig, ReferenceCollector};

use crate::nats::NatsServer;
use crate::process::example_binary;
use crate::sink::{batch, ids, post, single};

const STREAM: &str = "WAREHOUSE";
/// Short, so the test can outlast it; real streams keep minutes to hours.
const WINDOW: Duration = Duration::from_secs(1);

#[test]
fn warehouse_replacing_merge_tree_removes_copies_later_than_the_duplicate_window() {
    let nats = NatsServer::start();
    let js = JetStreamConfig {
        subject: "warehouse.events".into(),
        duplicate_window: WINDOW,
        ..single(&nats, STREAM)
    };
    let c = ReferenceCollector::start_jetstream(CollectorConfig::default(), &js).unwrap();
    let ids = ids(50);
    let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
    let body = batch(&ids);
    let first = post(c.addr(), &body);
    assert_eq!(first.status, 200, "{}", first.body);
    assert_eq!(first.body["accepted"], 50, "{}", first.body);
    let within = post(c.addr(), &body);
    assert_eq!(
        within.body["duplicates"], 50,
        "inside the window JetStream drops copies"
    );
    // The loader runs once before the late copies arrive, and resumes after its last sequence
    // below: two inserts, two parts, the late copies in the second.
    let db = tempfile::tempdir().unwrap();
    let early = load(&nats, db.path(), 1);
    assert_eq!(early["rows"], 50, "{early}");
    // A phone that comes back after the window (it never heard the first answer): real time,
    // since the window is the broker's own clock. JetStream purges expired ids on a timer.
    std::thread::sleep(WINDOW * 2);
    let late = post(c.addr(), &body);
    assert_eq!(
        late.body["accepted"], 50,
        "past the window JetStream stores the copies again: {}",
        late.body
    );

    let report = load(&nats, db.path(), 51);
    println!(
        "warehouse: 3 sends of 50 events, {} absorbed by JetStream, 50 stored again after the \
         {WINDOW:?} window; stream 100 messages, loaded in two runs; ClickHouse rows {} \
         (before merges), FINAL {}, distinct {}",
        within.body["duplicates"], report["rows"], report["final"], report["distinct"]
    );
    assert_eq!(report["distinct"], 50);
    assert_eq!(report["final"], 50, "FINAL keeps one row per event_id");
}

/// Runs the loader from `from_seq` into `warehouse_chdb.py` on the database in `db`; returns
/// the script's counts.
fn load(nats: &NatsServer, db: &Path, from_seq: u64) -> serde_json::Value {
    let loader = Command::new(example_binary("stream_to_warehouse"))
        .args(["--nats", &nats.url(), "--stream", STREAM])
        .args(["--from-seq", &from_seq.to_string()])
        .output()
        .expect("run stream_to_warehouse");
    assert!(
        loader.status.success(),
        "loader failed: {}",
        String::from_utf8_lossy(&loader.stderr)
    );
    let rows = loader.stdout;
    assert_eq!(
        rows.iter().filter(|&&b| b == b'\n').count(),
        50,
        "the loader wrote every message from sequence {from_seq}"
    );
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/warehouse_chdb.py");
    let mut python = Command::new("python3")
        .arg(script)
        .arg(db)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run python3");
    python.stdin.take().unwrap().write_all(&rows).unwrap();
    let out = python.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "warehouse_chdb.py failed (chdb is needed: `pip install chdb`, bash .ci/run does): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("warehouse_chdb.py prints JSON")
}

/// The same through a real spool: its first request is stored but answered only after the
/// spool's attempt timeout, which is past the duplicate window; the spool resends with the same
/// ids, JetStream stores the copies again, and the warehouse's FINAL keeps one row per event.
#[test]
fn warehouse_a_real_spool_resending_past_the_window_lands_once() {
    let nats = NatsServer::start();
    let js = JetStreamConfig {
        subject: "pastwindow.events".into(),
        duplicate_window: WINDOW,
        ..single(&nats, "PASTWINDOW")
    };
    let c = ReferenceCollector::start_jetstream(CollectorConfig::default(), &js).unwrap();
    c.push_script([eventspool_collector::Scripted::StoreThenDelay(
        Duration::from_secs(6),
    )]);
    let dir = tempfile::tempdir().unwrap();
    let mut config = eventspool::Config::new(c.url());
    config.db_path = Some(dir.path().join("spool.db"));
    // Three windows: the resend comes after JetStream forgot the first copy's ids.
    config.attempt_timeout_ms = 3 * WINDOW.as_millis() as u64;
    config.backoff_base_ms = 100;
    config.backoff_cap_ms = 200;
    config.flush_at = 20;
    let spool = eventspool::EventSpool::open(config).unwrap();
    let tracked: Vec<String> = (0..20)
        .map(|i| {
            spool
                .track("screen_view", serde_json::json!({"i": i}))
                .unwrap()
                .to_string()
        })
        .collect();
    spool.flush();
    assert!(
        spool.wait_drained(Duration::from_secs(30)),
        "{}",
        spool.state()
    );
    let contents = crate::stream::read_all(&nats.url(), "PASTWINDOW");
    assert_eq!(
        contents.messages, 40,
        "the resend past the window is stored again"
    );
    let loader = Command::new(example_binary("stream_to_warehouse"))
        .args(["--nats", &nats.url(), "--stream", "PASTWINDOW"])
        .output()
        .expect("run stream_to_warehouse");
    assert!(loader.status.success());
    let report = chdb(db_dir().path(), &loader.stdout);
    println!(
        "warehouse: a spool's batch stored, answered after its {} ms attempt timeout (window \
         {WINDOW:?}), resent with the same ids: stream {} messages; ClickHouse rows {}, FINAL {}, \
         distinct {}; tracked {}",
        3 * WINDOW.as_millis(),
        contents.messages,
        report["rows"],
        report["final"],
        report["distinct"],
        tracked.len()
    );
    // One insert of both copies: ClickHouse applies the merge to the block already
    // (`optimize_on_insert`), so `rows` may be 20 too; FINAL is what queries rely on.
    assert_eq!(
        report["final"], 20,
        "FINAL keeps one row per project and event_id"
    );
    assert_eq!(report["distinct"], 20);
    let _ = spool.shutdown(Duration::from_secs(5));
}

fn db_dir() -> tempfile::TempDir {
    tempfile::tempdir().unwrap()
}

/// Pipes loader rows into `warehouse_chdb.py`; returns its counts.
fn chdb(db: &Path, rows: &[u8]) -> serde_json::Value {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/warehouse_chdb.py");
    let mut python = Command::new("python3")
        .arg(script)
        .arg(db)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run python3");
    python.stdin.take().unwrap().write_all(rows).unwrap();
    let out = python.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "warehouse_chdb.py failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("warehouse_chdb.py prints JSON")
}
