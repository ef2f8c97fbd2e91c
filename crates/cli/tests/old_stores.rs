//! The read-only commands (`status`, `dlq list`, `dlq show`) on stores earlier releases wrote:
//! every fixture of tests/fixtures/stores (its README says how each was made) is read, the
//! figures are the ones that release printed for the same file, and the file is left exactly as
//! it was. A store of a newer release is named, not read.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime};

use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_eventspool");
const RUN_TIMEOUT: Duration = Duration::from_secs(60);
const KEYS_ENV: &str = "EVENTSPOOL_ENCRYPTION_KEYS";

struct Output {
    code: i32,
    stdout: String,
    stderr: String,
}

/// Runs the binary to its end, within a bound (killed past it, failing the test).
fn run(args: &[&str], keys: Option<&str>) -> Output {
    let dir = tempfile::tempdir().unwrap();
    let (out_path, err_path) = (dir.path().join("out"), dir.path().join("err"));
    let mut cmd = Command::new(BIN);
    cmd.args(args)
        .env_remove(KEYS_ENV)
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out_path).unwrap())
        .stderr(std::fs::File::create(&err_path).unwrap());
    if let Some(keys) = keys {
        cmd.env(KEYS_ENV, keys);
    }
    let mut child = cmd.spawn().expect("start eventspool");
    let deadline = Instant::now() + RUN_TIMEOUT;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("eventspool {args:?} did not finish within {RUN_TIMEOUT:?}");
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    Output {
        code: status.code().unwrap_or(-1),
        stdout: std::fs::read_to_string(out_path).unwrap(),
        stderr: std::fs::read_to_string(err_path).unwrap(),
    }
}

fn fixtures_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/stores")
}

/// One fixture: its directory and its manifest.
struct Fixture {
    dir: PathBuf,
    manifest: Value,
}

impl Fixture {
    fn name(&self) -> &str {
        self.manifest["name"].as_str().unwrap()
    }
    fn keys(&self) -> Option<&str> {
        self.manifest["encryption_keys"].as_str()
    }
    fn read(&self, file: &str) -> String {
        std::fs::read_to_string(self.dir.join(file)).unwrap()
    }
    fn jsonl(&self, file: &str) -> Vec<Value> {
        self.read(file)
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }
    fn held(&self, pick: &str) -> usize {
        self.manifest["pending"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| pick.is_empty() || e[pick] == true)
            .count()
    }
}

/// Every fixture, by name; each directory with a manifest.json is one.
fn fixtures() -> Vec<Fixture> {
    let mut all: Vec<Fixture> = std::fs::read_dir(fixtures_dir())
        .expect("tests/fixtures/stores")
        .map(|e| e.unwrap().path())
        .filter(|p| p.join("manifest.json").is_file())
        .map(|dir| Fixture {
            manifest: serde_json::from_str(
                &std::fs::read_to_string(dir.join("manifest.json")).unwrap(),
            )
            .unwrap(),
            dir,
        })
        .collect();
    all.sort_by(|a, b| a.dir.cmp(&b.dir));
    assert!(!all.is_empty(), "no fixture stores found");
    all
}

fn fixture(name: &str) -> Fixture {
    fixtures()
        .into_iter()
        .find(|f| f.name() == name)
        .unwrap_or_else(|| panic!("no fixture {name}"))
}

/// A fixture's store copied into a temp dir, with an mtime in the past, so a write of any kind
/// (even one that leaves the bytes as they were) shows.
struct Copy {
    dir: tempfile::TempDir,
    db: PathBuf,
    bytes: Vec<u8>,
    mtime: SystemTime,
}

impl Copy {
    fn of(store: &Path) -> Copy {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("store.db");
        std::fs::copy(store, &db).unwrap();
        let mtime = SystemTime::now() - Duration::from_secs(3600);
        std::fs::File::options()
            .write(true)
            .open(&db)
            .unwrap()
            .set_modified(mtime)
            .unwrap();
        Copy {
            bytes: std::fs::read(&db).unwrap(),
            mtime: std::fs::metadata(&db).unwrap().modified().unwrap(),
            dir,
            db,
        }
    }

    fn path(&self) -> &str {
        self.db.to_str().unwrap()
    }

    /// The file is as it was: same bytes, same mtime. Beside it SQLite may leave what any
    /// connection to a WAL store makes when there is none (an empty `-wal`, the `-shm` index of
    /// it): nothing of the store is written there, and nothing else is created.
    fn assert_untouched(&self, what: &str) {
        assert!(
            std::fs::read(&self.db).unwrap() == self.bytes,
            "{what}: the store's bytes changed"
        );
        assert_eq!(
            std::fs::metadata(&self.db).unwrap().modified().unwrap(),
            self.mtime,
            "{what}: the store's mtime changed"
        );
        let mut names: Vec<String> = std::fs::read_dir(self.dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n != "store.db-shm")
            .collect();
        names.sort();
        let wal = self.db.with_file_name("store.db-wal");
        if wal.exists() {
            assert_eq!(
                std::fs::metadata(&wal).unwrap().len(),
                0,
                "{what}: something was written to the WAL"
            );
            names.retain(|n| n != "store.db-wal");
        }
        assert_eq!(names, ["store.db"], "{what}: files left beside the store");
    }
}

fn json(out: &Output, what: &str) -> Value {
    assert_eq!(
        out.code, 0,
        "{what}: exit {}; stdout {} stderr {}",
        out.code, out.stdout, out.stderr
    );
    serde_json::from_str(out.stdout.trim())
        .unwrap_or_else(|e| panic!("{what}: stdout {:?}: {e}", out.stdout))
}

/// Every field the old release printed is printed with the same value (fields added since may
/// come on top); `skip` names the ones that depend on where the copy lives.
fn assert_same_as_old(now: &Value, old: &Value, skip: &[&str], what: &str) {
    for (key, value) in old.as_object().unwrap() {
        if skip.contains(&key.as_str()) {
            continue;
        }
        assert_eq!(
            &now[key], value,
            "{what}: field {key}: now {now}, then {old}"
        );
    }
}

/// The reported defect: `status` on a store the b134e63 command wrote (schema 1) failed with
/// `no such column: key_id` before anything had upgraded it.
#[test]
fn status_reads_a_store_written_by_b134e63() {
    let f = fixture("v1-b134e63");
    let copy = Copy::of(&f.dir.join("store.db"));
    let status = json(&run(&["status", "--db", copy.path()], None), "status");
    assert_eq!(status["pending"], 5, "{status}");
    assert_eq!(
        status["quarantine"],
        serde_json::json!({"bad_request": 1, "rejected": 1}),
        "{status}"
    );
    assert_eq!(status["schema_version"], 1, "{status}");
    copy.assert_untouched("status");
}

#[test]
fn status_and_dlq_read_every_fixture_as_its_release_did_and_change_nothing() {
    for f in fixtures() {
        let name = f.name().to_string();
        let copy = Copy::of(&f.dir.join("store.db"));

        let out = run(&["status", "--db", copy.path()], None);
        let status = json(&out, &format!("{name}: status"));
        let old: Value = serde_json::from_str(f.read("old-status.json").trim()).unwrap();
        assert_same_as_old(&status, &old, &["db"], &format!("{name}: status"));
        assert_eq!(status["pending"], f.held("") as u64, "{name}: {status}");
        assert_eq!(
            status["pending_critical"],
            f.held("critical") as u64,
            "{name}: {status}"
        );
        assert_eq!(status["schema_version"], f.manifest["schema_version"]);
        assert_eq!(status["bytes"], copy.bytes.len() as u64, "{name}: {status}");
        if status["schema_version"] != eventspool::admin::SCHEMA_VERSION {
            assert!(
                out.stderr.contains("upgrade") && out.stderr.contains("not changed"),
                "{name}: status says the store is of an earlier schema: {}",
                out.stderr
            );
        }
        copy.assert_untouched(&format!("{name}: status"));

        let out = run(
            &["dlq", "list", "--db", copy.path(), "--show-payload"],
            f.keys(),
        );
        assert_eq!(out.code, 0, "{name}: dlq list: {}", out.stderr);
        let listed: Vec<Value> = out
            .stdout
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        let old = f.jsonl("old-dlq.jsonl");
        assert_eq!(listed.len(), old.len(), "{name}: {listed:?}");
        for (now, then) in listed.iter().zip(&old) {
            assert_same_as_old(now, then, &[], &format!("{name}: dlq list"));
        }
        let reasons: Vec<(&Value, &Value)> = listed
            .iter()
            .map(|e| (&e["event_id"], &e["reason"]))
            .collect();
        let expected: Vec<(&Value, &Value)> = f.manifest["quarantined"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| (&e["event_id"], &e["reason"]))
            .collect();
        assert_eq!(reasons, expected, "{name}: ids and reasons");
        copy.assert_untouched(&format!("{name}: dlq list"));

        for then in &old {
            let id = then["event_id"].as_str().unwrap();
            let shown = json(
                &run(&["dlq", "show", "--db", copy.path(), id], f.keys()),
                &format!("{name}: dlq show {id}"),
            );
            assert_same_as_old(&shown, then, &[], &format!("{name}: dlq show"));
        }
        copy.assert_untouched(&format!("{name}: dlq show"));
    }
}

/// A store whose `user_version` is past this release's (written by a later one): every
/// read-only command says which version it found and what to do, exits 1, and leaves the file
/// as it was.
#[test]
fn a_store_of_a_newer_release_is_named_and_left_alone() {
    let newest = fixtures()
        .into_iter()
        .max_by_key(|f| f.manifest["schema_version"].as_i64())
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let future = dir.path().join("future.db");
    std::fs::copy(newest.dir.join("store.db"), &future).unwrap();
    let version = eventspool::admin::SCHEMA_VERSION + 1;
    {
        let conn = rusqlite::Connection::open(&future).unwrap();
        conn.pragma_update(None, "user_version", version).unwrap();
    }
    let copy = Copy::of(&future);
    for args in [
        vec!["status", "--db", copy.path()],
        vec!["dlq", "list", "--db", copy.path()],
        vec![
            "dlq",
            "show",
            "--db",
            copy.path(),
            "019ad000-0000-7000-8000-000000000002",
        ],
    ] {
        let out = run(&args, newest.keys());
        assert_eq!(out.code, 1, "{args:?}: {} {}", out.stdout, out.stderr);
        assert!(out.stdout.is_empty(), "{args:?}: {}", out.stdout);
        for needed in [
            format!("schema version {version}"),
            "newer eventspool".to_string(),
            copy.path().to_string(),
            "not changed".to_string(),
        ] {
            assert!(
                out.stderr.contains(&needed),
                "{args:?}: the message says {needed:?}: {}",
                out.stderr
            );
        }
        copy.assert_untouched(&format!("{args:?}"));
    }
}
